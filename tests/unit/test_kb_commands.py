"""``attest kb`` in this process, over a slice of the ESG graph and a character-trigram
encoder (what MiniLM links is covered by test_knowledge_kb.py)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from attest.knowledge import servicer
from attest.knowledge.kb_commands import kb
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
