"""Citation marks from the evidence page: what is accepted, kept per tenant, and
exported as the support pairs `attest eval judge` reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from attest.answer.http.labels import LabelError, LabelStore, export_labels, parse_mark
from attest.evaluation.judge_eval import read_pairs

MARK = {
    "question": "How large was the fine?",
    "sentence": "The office fined Quaystone Telecom $14.5 million.",
    "source": "SELBURY — The office fined Quaystone Telecom $14.5 million for failing ...",
    "sourceId": "esg-045",
    "passageIndex": 0,
    "confidence": 5,
    "label": "supports",
}


def test_a_mark_becomes_a_support_pair() -> None:
    record = parse_mark(MARK)
    assert (record["task"], record["label"]) == ("support", 1)
    assert record["sentence"] == MARK["sentence"]
    assert parse_mark({**MARK, "label": "does_not_support"})["label"] == 0
    assert parse_mark({**MARK, "label": "does_not_support"})["id"] == record["id"]


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"sentence": " "}, "sentence:"),
        ({"source": None}, "source:"),
        ({"label": "yes"}, 'label: must be "supports" or "does_not_support"'),
        ({"confidence": 11}, "confidence:"),
        ({"passageIndex": "0"}, "passageIndex:"),
        ({"passageIndex": 10**30}, "passageIndex:"),
        ({"passageIndex": -2}, "passageIndex:"),
        # The tenant is the credential's: a field naming another is refused, not ignored.
        ({"tenant": "other"}, "unknown field 'tenant'; known: confidence, label, "),
    ],
)
def test_bad_marks_say_what_is_wrong(change: dict[str, object], says: str) -> None:
    with pytest.raises(LabelError, match=says):
        parse_mark({**MARK, **change})


def test_marks_are_per_tenant_and_the_latest_wins(tmp_path: Path) -> None:
    store = LabelStore(tmp_path)
    store.add("acme", parse_mark(MARK))
    store.add("acme", parse_mark({**MARK, "sentence": "Another sentence.", "label": "supports"}))
    store.add("acme", parse_mark({**MARK, "label": "does_not_support"}))
    assert [p["label"] for p in store.pairs("acme")] == [0, 1]
    assert store.pairs("other") == []
    with pytest.raises(LabelError):
        store.pairs("../etc")

    out = tmp_path / "pairs.jsonl"
    result = CliRunner().invoke(
        export_labels, ["--tenant", "acme", "--labels-dir", str(tmp_path), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [set(line) for line in lines] == [{"id", "task", "source", "sentence", "label"}] * 2
    pairs = read_pairs(out)  # what `attest eval judge --dataset` reads
    assert [(p.task, p.label) for p in pairs] == [("support", 0), ("support", 1)]
