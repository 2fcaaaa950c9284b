"""`attest serve llm` checks its arguments before building anything."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from attest.cli import main


def test_a_model_that_is_neither_gemma_nor_a_file_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["serve", "llm", "--model", str(tmp_path / "no.gguf")])
    assert result.exit_code == 2
    assert "is neither gemma nor qwen nor a GGUF file" in result.output


def test_demo_refuses_an_unknown_model_before_building_anything(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["demo", "--llm", "local", "--llm-model", str(tmp_path / "no.gguf")],
        env={"ATTEST_GENERATE_LLM__URL": "", "ATTEST_DATA_DIR": str(tmp_path)},
    )
    assert result.exit_code == 1
    assert "is neither gemma nor qwen nor a GGUF file" in result.output
