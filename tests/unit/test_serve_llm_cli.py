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


def test_a_local_server_queues_requests_and_the_generator_waits_for_a_cpu() -> None:
    from attest.generate.local import LocalModel, command

    gemma = LocalModel(python="/venv/bin/python", path="/models/g.gguf", name="gemma")
    args = command(gemma, "127.0.0.1", 8080)
    # A new request must not cut a streamed reply short.
    assert args[args.index("--interrupt_requests") + 1] == "false"
    assert args[args.index("--chat_format") + 1] == "gemma"
    env = gemma.env("http://127.0.0.1:8080")
    assert env["ATTEST_GENERATE_LLM__SYSTEM_ROLE"] == "false"
    assert float(env["ATTEST_GENERATE_LLM__TIMEOUT_SECONDS"]) >= 600
    qwen = LocalModel(python="/venv/bin/python", path="/models/q.gguf", name="qwen")
    assert "--chat_format" not in command(qwen, "127.0.0.1", 8080)
    assert "ATTEST_GENERATE_LLM__SYSTEM_ROLE" not in qwen.env("http://127.0.0.1:8080")
