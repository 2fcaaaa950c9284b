"""``attest kb`` in this process, over a slice of the ESG graph and a character-trigram
encoder (what MiniLM links is covered by test_knowledge_kb.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from attest.knowledge import servicer
from attest.knowledge.kb_commands import kb
from attest.knowledge.settings import KnowledgeSettings
from attest.knowledge.store_lock import StoreInUse, StoreLock
from tests.integration.test_knowledge_service import environment_slice, trigrams


class TrigramEmbedder:
    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return trigrams(texts)


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setattr(servicer, "Embedder", TrigramEmbedder)
    monkeypatch.setenv("ATTEST_KNOWLEDGE_GRAPH_PATH", str(environment_slice(tmp_path / "g.yaml")))
    monkeypatch.setenv("ATTEST_DATA_DIR", str(tmp_path / "data"))
    return CliRunner()


def run(cli: CliRunner, *args: str) -> str:
    result = cli.invoke(kb, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_link(cli: CliRunner) -> None:
    out = run(cli, "link", "GHG emissions", "football")
    lines = out.splitlines()
    assert lines[0] == "'GHG emissions' -> greenhouse-gas-emission"
    assert lines[1].startswith(
        "  1.000 exact     Greenhouse gas emission [greenhouse-gas-emission]"
    )
    assert "'football' -> (none chosen)" in lines


def test_info_find_rel(cli: CliRunner) -> None:
    info = run(cli, "info", "GRI 305").splitlines()
    assert info[0] == "Emissions [gri-305] (basic, GRI 305)"
    assert "  (Environment, contains, Emissions)" in info
    find = run(cli, "find", "carbon footprint", "measures").splitlines()
    assert find == [
        "1.000 (Greenhouse gas emission, measured_as, Carbon dioxide equivalent)",
        "1.000 (Greenhouse gas emission, measured_as, Emissions intensity)",
    ]
    rel = run(cli, "rel", "Scope 2 emissions", "Emissions").splitlines()
    assert rel == [
        "path 1: (Greenhouse gas emission, source, Scope 2 emissions) ; "
        "(Emissions, measured_as, Greenhouse gas emission)"
    ]
    assert run(cli, "rel", "scope 2", "emissions", "--max-hops", "1").startswith(
        "scope-2-emissions and gri-305 are not connected within 1 hop(s)"
    )


def test_facts_of_a_document_without_any_say_why_there_may_be_none(cli: CliRunner) -> None:
    result = cli.invoke(kb, ["facts", "no-such-doc"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["no-such-doc: 0 descriptions, 0 triples, 0 aspect facts"]
    assert result.stderr.startswith(
        "no facts from no-such-doc: no such document, one that states none, or one "
        "ingested without fact extraction"
    )


def test_search_prints_program_steps_and_facts(cli: CliRunner) -> None:
    out = run(cli, "search", "Which topics are under Environment?", "--top-k", "3")
    assert out.splitlines()[:2] == [
        "Q: Which topics are under Environment?",
        "planner: rules (no LLM planner is configured; the heuristic planner planned from "
        "the question)",
    ]
    start = out.index("program:\n") + len("program:\n")
    program = json.loads(out[start : out.index("\nstep 0")])
    assert program["steps"][0]["op"] == "find_entity_or_value"
    assert program["steps"][0]["args"]["entity_id"] == "environment"
    assert "step 0 find_entity_or_value" in out
    assert "-> 10 result(s)" in out
    assert "facts (3):" in out


def test_search_refuses_a_bad_program(cli: CliRunner) -> None:
    program = json.dumps({"steps": [{"op": "os.system", "args": {}}]})
    result = cli.invoke(kb, ["search", "q", "--program", program])
    assert result.exit_code == 1
    assert "INVALID_ARGUMENT: program.steps[0].op: 'os.system' is not an operation" in result.output


# ------------------------------------------------- one process on the store


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[int]:
    """Another process holding the personal base under ATTEST_DATA_DIR, as a server does."""
    lock = tmp_path / "data" / "knowledge" / "personal.lock"
    code = (
        "import sys; from pathlib import Path; "
        "from attest.knowledge.store_lock import StoreLock; "
        f"lock = StoreLock(Path({str(lock)!r})); lock.acquire(); "
        "print('held', flush=True); sys.stdin.read()"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "held\n"
    yield process.pid
    assert process.stdin is not None
    process.stdin.close()
    process.wait(timeout=30)


def test_refuses_at_once_while_a_server_holds_the_personal_base(
    cli: CliRunner, holder: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded: list[str] = []
    monkeypatch.setattr(servicer, "Embedder", lambda *a, **k: loaded.append("model"))
    result = cli.invoke(kb, ["link", "GHG emissions"])
    assert result.exit_code == 1
    assert f"is open in process {holder} (a running knowledge server?)" in result.output
    assert "--address HOST:PORT" in result.output
    assert loaded == []


def test_a_server_taking_the_base_between_check_and_open_is_refused_too(
    cli: CliRunner, holder: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(StoreLock, "holder", lambda self: None)
    result = cli.invoke(kb, ["link", "GHG emissions"])
    assert result.exit_code == 1
    assert f"is open in process {holder}" in result.output
    assert "--address HOST:PORT" in result.output


def test_the_graph_alone_needs_no_personal_base(
    cli: CliRunner, holder: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATTEST_KNOWLEDGE_PERSONAL__ENABLED", "false")
    assert run(cli, "link", "GHG emissions").startswith("'GHG emissions' -> greenhouse-gas")


def test_one_server_at_a_time_on_a_personal_base(cli: CliRunner) -> None:
    """A second server on the same data directory is refused before its stores open,
    and gets the base once the first has closed."""

    async def scenario() -> None:
        first = servicer.KnowledgeServicer(KnowledgeSettings())
        second = servicer.KnowledgeServicer(KnowledgeSettings())
        await first.warm_up()
        try:
            with pytest.raises(StoreInUse, match="is open in process"):
                await second.warm_up()
        finally:
            await first.close()
        await second.warm_up()
        await second.close()

    asyncio.run(scenario())
    assert run(cli, "link", "GHG emissions").startswith("'GHG emissions' -> greenhouse-gas")


def test_eval_planner_refuses_an_unwritable_json_path_before_evaluating(
    cli: CliRunner, tmp_path: Path
) -> None:
    """A --json path that cannot be written is an error at once (not a
    traceback after the whole evaluation)."""
    (tmp_path / "a-file").write_text("x")
    result = cli.invoke(
        kb, ["eval-planner", "--limit", "1", "--json", str(tmp_path / "a-file" / "out.json")]
    )
    assert result.exit_code == 2, result.output
    assert "--json" in result.output
    assert "cannot write" in result.output
    assert "right" not in result.output  # nothing was evaluated


def test_eval_planner_fails_when_the_llm_planned_nothing(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an LLM that never answers every question falls back to the
    heuristic planner: the command says so and exits 1 instead of reporting
    the heuristic planner's accuracy as the LLM's."""
    monkeypatch.setattr("attest.knowledge.planner_eval.Embedder", TrigramEmbedder)
    monkeypatch.setenv("ATTEST_KNOWLEDGE_LLM__URL", "http://127.0.0.1:1")
    monkeypatch.setenv("ATTEST_KNOWLEDGE_LLM__KIND", "openai")
    monkeypatch.setenv("ATTEST_KNOWLEDGE_LLM__MAX_ATTEMPTS", "1")
    out = tmp_path / "figures.json"
    result = cli.invoke(
        kb, ["eval-planner", "--planner", "llm", "--limit", "1", "--json", str(out)]
    )
    assert result.exit_code == 1, result.output
    assert "the LLM planned none of the questions" in result.output
    assert "the llm and hybrid figures above are the heuristic planner's" in result.output
    assert json.loads(out.read_text())["llm"]["llm_plans_used"] == 0
