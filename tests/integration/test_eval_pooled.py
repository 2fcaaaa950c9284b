"""`attest eval qa --pooled`: every question's passages in one corpus, each
question asked through the answer service of an embedded stack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from attest.cli import main
from attest.evaluation.pooled import pooled_documents
from attest.evaluation.qa import QAItem, QAPassage

pytestmark = pytest.mark.integration

QUESTIONS = [
    {
        "id": "w",
        "question": "Which utility cut water leakage to 15%?",
        "answers": ["Brightwater"],
        "passages": [
            {
                "id": "w-p0",
                "title": "",
                "gold": True,
                "text": "Brightwater Utilities cut water leakage to 15% after replacing 400 km of mains.",
            },
            {
                "id": "w-n0",
                "title": "",
                "gold": False,
                "text": "Leakage from old water mains is a common problem for utilities in dry regions.",
            },
        ],
    },
    {
        "id": "f",
        "question": "Which regulator fined Quaystone Telecom over its data breach?",
        "answers": ["Selbury Data Protection Office"],
        "passages": [
            {
                "id": "f-p0",
                "title": "",
                "gold": True,
                "text": "The Selbury Data Protection Office fined Quaystone Telecom $14.5 million over the data breach.",
            },
            {
                "id": "f-n0",
                "title": "",
                "gold": False,
                "text": "Telecom companies face growing scrutiny of how they store customer records.",
            },
        ],
    },
    {
        "id": "c",
        "question": "How many child workers did the labour group find at Corliss Garment Works?",
        "answers": ["14"],
        "passages": [
            {
                "id": "c-p0",
                "title": "",
                "gold": True,
                "text": "The labour group found 14 child workers at Corliss Garment Works in Dunmarch.",
            },
            {
                "id": "c-n0",
                "title": "",
                "gold": False,
                "text": "Garment factories in the region employ about 30,000 people.",
            },
        ],
    },
]


def test_pooled_passages_keep_their_ids_and_refuse_conflicting_texts() -> None:
    a = QAItem("1", "q", ("x",), (QAPassage("p", "", "one", True),))
    b = QAItem("2", "q", ("x",), (QAPassage("p", "", "one", False),))
    assert [d.id for d in pooled_documents([a, b])] == ["p"]
    c = QAItem("3", "q", ("x",), (QAPassage("p", "", "two", True),))
    with pytest.raises(ValueError, match="two different texts"):
        pooled_documents([a, c])


def test_pooled_eval_retrieves_and_cites_each_questions_own_passages(tmp_path: Path) -> None:
    dataset = tmp_path / "mini.jsonl"
    dataset.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS), encoding="utf-8")
    out = tmp_path / "result.json"
    result = CliRunner().invoke(
        main,
        [
            "eval",
            "qa",
            "--dataset",
            str(dataset),
            "--pooled",
            "--top-k",
            "3",
            "--data-dir",
            str(tmp_path / "stack"),
            "--output",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "ingested 6 passages of 3 questions into one corpus" in result.output
    figures = json.loads(out.read_text())
    assert figures["mode"] == "extractive-pooled"
    assert figures["questions"] == 3
    # Each question's own gold passage is retrieved among 6 pooled passages
    # and cited; every sentence is cited. Recall is reported up to the 3
    # sources kept, no further.
    assert figures["sources_kept"] == 3
    assert figures["retrieval_recall_at_3"] == 1.0
    assert "retrieval_recall_at_5" not in figures
    assert figures["unanswerable"] == 0
    assert figures["answer_recall_numeric"] == 1.0
    assert len(figures["per_question"]) == 3
    assert figures["answer_recall"] == 1.0
    assert figures["citation_recall"] == 1.0
    assert figures["sentences_cited_or_unsupported"] == 1.0
    assert figures["citation_precision"] >= 0.5
