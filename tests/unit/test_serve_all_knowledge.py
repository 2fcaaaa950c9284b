"""One process with the knowledge service: `attest serve all --knowledge` and the embedded stack.

Nothing is served or loaded: the wiring is read from the environment the
command sets and from the servicers the embedded stack would serve.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from attest import cli
from attest.answer.embedded import embedded_servicers
from attest.answer.servicer import AnswerServicer
from attest.knowledge.servicer import KnowledgeServicer

ADDRESSES = ("ATTEST_ANSWER_KNOWLEDGE_ADDRESS", "ATTEST_INGEST_KNOWLEDGE_ADDRESS")
WIRED = (
    *ADDRESSES,
    "ATTEST_ANSWER_LEXICAL_ADDRESS",
    "ATTEST_ANSWER_SEMANTIC_ADDRESS",
    "ATTEST_ANSWER_RERANK_ADDRESS",
    "ATTEST_ANSWER_GENERATE_ADDRESS",
    "ATTEST_GENERATE_RESEARCH__LEXICAL_ADDRESS",
    "ATTEST_GENERATE_RESEARCH__SEMANTIC_ADDRESS",
    "ATTEST_INGEST_LEXICAL_ADDRESS",
    "ATTEST_INGEST_SEMANTIC_ADDRESS",
    "ATTEST_LEXICAL_BACKEND",
    "ATTEST_SEMANTIC_STORE",
    "ATTEST_INGEST_MODE",
)


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    # Set first so that monkeypatch restores (or removes) what _one_process writes.
    for name in WIRED:
        monkeypatch.setenv(name, "unset")
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize("knowledge", [True, False])
def test_serve_all_points_answers_and_ingestion_at_its_knowledge_service(
    environment: pytest.MonkeyPatch, knowledge: bool
) -> None:
    import os

    port, _ = cli._one_process(50999, True, False, knowledge)
    here = f"127.0.0.1:{port}"
    assert os.environ["ATTEST_ANSWER_LEXICAL_ADDRESS"] == here
    for name in ADDRESSES:
        assert os.environ.get(name) == (here if knowledge else None)


def test_knowledge_is_a_flag_of_serve_all_only() -> None:
    result = CliRunner().invoke(cli.main, ["serve", "lexical", "--knowledge"])
    assert result.exit_code == 2
    assert "--knowledge applies to `serve all`" in result.output


def test_the_embedded_stack_serves_knowledge_only_when_asked(tmp_path: Path) -> None:
    address = "127.0.0.1:1"
    with_knowledge = embedded_servicers(tmp_path, address, knowledge=True)
    (answer,) = [s for s in with_knowledge if isinstance(s, AnswerServicer)]
    assert answer.settings.knowledge_address == address
    assert sum(isinstance(s, KnowledgeServicer) for s in with_knowledge) == 1

    without = embedded_servicers(tmp_path, address)
    (answer,) = [s for s in without if isinstance(s, AnswerServicer)]
    assert answer.settings.knowledge_address is None
    assert not any(isinstance(s, KnowledgeServicer) for s in without)
