"""What `attest serve all` imports before it reports SERVING.

Each check runs in a fresh interpreter: the test process has imported most of
these libraries already.
"""

from __future__ import annotations

import subprocess
import sys


def _imported_after(code: str, modules: list[str]) -> dict[str, bool]:
    probe = f"{code}\nimport sys\nprint(','.join(str(m in sys.modules) for m in {modules!r}))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300
    )
    return dict(zip(modules, (v == "True" for v in out.stdout.strip().split(",")), strict=True))


def test_generate_service_imports_nltk_only_when_it_stems() -> None:
    before = _imported_after("import attest.generate.servicer", ["nltk"])
    assert before == {"nltk": False}
    after = _imported_after(
        "from attest.generate.facts import stem\nassert stem('Running') == 'run'", ["nltk"]
    )
    assert after == {"nltk": True}
