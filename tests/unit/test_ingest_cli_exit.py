"""`attest ingest`'s exit status tells a script whether every document went in."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from attest.cli import main

DOC = {"id": "ok-1", "title": "Port fees", "body": "Orrin Bay raised its port fees by 4 % in 2024."}


def _ingest(tmp_path: Path, lines: list[str]) -> tuple[int, str]:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    result = CliRunner().invoke(
        main, ["ingest", str(corpus), "--data-dir", str(tmp_path / "data")], catch_exceptions=False
    )
    return result.exit_code, result.output


def test_partial_failure_exits_2_and_names_the_item(tmp_path: Path) -> None:
    code, output = _ingest(tmp_path, [json.dumps(DOC), '{"id": "broken", "title": '])
    assert code == 2, output
    assert "ingested 1" in output
    assert "failed 1" in output
    assert "corpus.jsonl:2" in output
    # Run again: the good document is unchanged, the broken line still fails.
    code, output = _ingest(tmp_path, [json.dumps(DOC), '{"id": "broken", "title": '])
    assert code == 2, output
    assert "unchanged 1" in output


def test_every_document_in_exits_0(tmp_path: Path) -> None:
    code, output = _ingest(tmp_path, [json.dumps(DOC)])
    assert code == 0, output
    assert "ingested 1" in output
    assert "failed 0" in output
