"""`attest serve llm` checks its arguments before building anything."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from attest.cli import main


def test_a_model_that_is_neither_gemma_nor_a_file_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["serve", "llm", "--model", str(tmp_path / "no.gguf")])
    assert result.exit_code == 2
    assert "neither gemma nor a GGUF file" in result.output
