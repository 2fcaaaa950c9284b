"""loadtest/bench_startup.py's reading of ``python -X importtime`` output."""

from __future__ import annotations

from loadtest.bench_startup import top_imports

STDERR = """\
import time: self [us] | cumulative | imported package
import time:       120 |        120 |     _io
import time:      3000 |    2480000 |       torch
import time:       500 |    2490000 |     attest.semantic.kg_scoring
import time:      7000 |    3790000 | attest.semantic.servicer
{"level": "INFO", "message": "listening"}
import time:      9000 |    5200000 | sentence_transformers
import time:       100 |      20000 | click
"""


def test_top_imports_are_the_outermost_ones_by_cumulative_seconds() -> None:
    assert top_imports(STDERR, n=2) == [
        ("sentence_transformers", 5.2),
        ("attest.semantic.servicer", 3.79),
    ]
    assert [name for name, _ in top_imports(STDERR)] == [
        "sentence_transformers",
        "attest.semantic.servicer",
        "click",
    ]
