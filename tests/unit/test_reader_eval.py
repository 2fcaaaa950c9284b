"""attest eval judge's metrics and the reader's training split (no model needed)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from attest.evaluation.judge_eval import JudgePairsError, auroc, ranking_metrics, read_pairs
from attest.evaluation.reader_data import (
    Pair,
    held_out,
    hotpot_pairs,
    keyword_groups,
    keyword_query,
    split,
)
from attest.generate.reader import candidate_sources, source_window


def test_auroc_counts_ties_as_half_and_is_undefined_without_both_kinds():
    assert auroc([1, 0], [0.9, 0.1]) == 1.0
    assert auroc([1, 0], [0.1, 0.9]) == 0.0
    assert auroc([1, 0, 1, 0], [0.5, 0.5, 0.5, 0.5]) == 0.5
    # 2 positives x 2 negatives: (1 + 1 + 1 + 0.5) / 4
    assert auroc([1, 1, 0, 0], [0.9, 0.4, 0.4, 0.1]) == pytest.approx(0.875)
    assert math.isnan(auroc([1, 1], [0.2, 0.3]))


def test_ranking_metrics_skip_groups_without_both_kinds_and_give_ties_no_credit():
    labels = [1, 0, 0, 0, 1, 1, 0]
    scores = [0.2, 0.9, 0.1, 0.3, 0.5, 0.7, 0.7]
    groups = ["a", "a", "a", "b", "b", "c", "c"]
    m = ranking_metrics(labels, scores, groups)
    assert m["groups"] == 3
    # a: positive ranked 2nd of 3 -> AP 0.5, RR 0.5, P@1 0
    # b: positive ranked 1st -> 1, 1, 1
    # c: a tie with the negative ranks the negative first -> 0.5, 0.5, 0
    assert m["map"] == pytest.approx((0.5 + 1 + 0.5) / 3)
    assert m["mrr"] == pytest.approx((0.5 + 1 + 0.5) / 3)
    assert m["p_at_1"] == pytest.approx(1 / 3)
    only_negatives = ranking_metrics([0, 0], [0.1, 0.2], ["x", "x"])
    assert only_negatives["groups"] == 0
    assert "map" not in only_negatives


def _write(tmp_path: Path, rows: list[object]) -> Path:
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def test_read_pairs_names_the_line_of_each_fault(tmp_path):
    good = {"id": "1", "task": "answer", "question": "q?", "sentence": "s.", "label": 1}
    assert read_pairs(_write(tmp_path, [good]))[0].first == "q?"
    cases = [
        ({**good, "task": "rank"}, "'task' must be"),
        ({**good, "label": 2}, "'label' must be 0 or 1"),
        ({**good, "label": True}, "'label' must be 0 or 1"),
        ({"id": "1", "task": "support", "sentence": "s.", "label": 0}, "needs text in 'source'"),
        ({**good, "sentence": " "}, "needs text in 'sentence'"),
    ]
    for row, message in cases:
        with pytest.raises(JudgePairsError, match=message) as err:
            read_pairs(_write(tmp_path, [good | {"id": "0"}, row]))
        assert ":2:" in str(err.value)
    with pytest.raises(JudgePairsError, match="given twice"):
        read_pairs(_write(tmp_path, [good, good]))
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    with pytest.raises(JudgePairsError, match="no pairs"):
        read_pairs(tmp_path / "empty.jsonl")


def test_split_is_by_group_and_stable():
    pairs = [
        Pair(f"{g}-{k}", "answer", f"question {g}?", f"sentence {k}.", k % 2, str(g), "selqa")
        for g in range(400)
        for k in range(3)
    ]
    train, test = split(pairs)
    assert {p.group for p in train}.isdisjoint({p.group for p in test})
    # About one group in ten, by a hash that does not change between runs.
    assert 20 <= len({p.group for p in test}) <= 60
    assert held_out("selqa", "7") == held_out("selqa", "7")
    assert split(pairs) == (train, test)


def test_hotpot_pairs_take_one_half_and_label_answer_sentences(tmp_path):
    row = {
        "id": "q1",
        "question": "Which city is the capital of Freedonia?",
        "answers": ["Ruritown"],
        "passages": [
            {
                "id": "p0",
                "title": "Freedonia",
                "gold": True,
                "text": "Freedonia is a small country. Its capital city is Ruritown, on the coast.",
            },
            {
                "id": "p1",
                "title": "Other",
                "gold": False,
                "text": "Sylvania is another country nearby. It has many rivers and lakes.",
            },
        ],
    }
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    from attest.evaluation.qa import half_of

    mine = list(hotpot_pairs(path, half=half_of("q1")))
    other = list(hotpot_pairs(path, half="odd" if half_of("q1") == "even" else "even"))
    assert not other
    answer = {p.sentence: p.label for p in mine if p.task == "answer"}
    assert answer["Its capital city is Ruritown, on the coast."] == 1
    assert answer["Freedonia is a small country."] == 0
    assert answer["Sylvania is another country nearby."] == 0
    support = [p for p in mine if p.task == "support"]
    own = [p for p in support if p.id.endswith("-own")]
    rest = [p for p in support if p.id.endswith("-rest")]
    assert own
    assert all(p.label == 1 and p.sentence in p.first for p in own)
    assert rest
    assert all(p.label == 0 and p.sentence not in p.first for p in rest)


def test_source_window_keeps_the_sentences_that_share_the_claims_words():
    filler = " ".join(f"Sentence number {i} talks about weather." for i in range(60))
    source = filler + " The chair of Marrowgate Bank is Rosalind Achebe-Fry. " + filler
    window = source_window(source, "Rosalind Achebe-Fry chairs Marrowgate Bank.", words=40)
    assert "Rosalind Achebe-Fry" in window
    assert len(window.split()) <= 45
    assert source_window("short source.", "x") == "short source."


def test_candidate_sources_skip_sources_that_share_few_words():
    sources = [
        "Marrowgate Bank named Rosalind Achebe-Fry as chair.",
        "Fennick Retail cut food waste.",
        "Rosalind Achebe-Fry was a deputy governor; Marrowgate Bank's board approved.",
    ]
    assert candidate_sources("Marrowgate Bank named Rosalind Achebe-Fry chair.", sources) == [0, 2]
    assert candidate_sources("the of and", sources) == []


def test_keyword_query_keeps_the_content_words_in_order():
    assert keyword_query("Who is the new chair of Marrowgate Bank?") == "chair Marrowgate Bank"
    assert (
        keyword_query("What were Fennick Retail Group's scope 1 emissions in 2024?")
        == "Fennick Retail Group's scope 1 emissions 2024"
    )
    assert (
        keyword_query("How much did it cost, in $, per 1,000 units?") == "much cost per 1,000 units"
    )
    # A question of stop words alone stays as it was rather than becoming empty.
    assert keyword_query("Who was it?") == "Who was it?"


def test_keyword_groups_copy_whole_groups_of_answer_pairs_with_their_labels():
    pairs = [
        Pair(
            f"q{g}-{k}",
            "answer",
            f"Where is the head office of firm {g}?",
            f"s{k}",
            k % 2,
            f"q{g}",
            "selqa",
        )
        for g in range(40)
        for k in range(3)
    ] + [Pair("p0", "support", "A source.", "A claim.", 1, "p0", "snli")]
    made = keyword_groups(pairs, 0.5, seed=13)
    groups = {p.group for p in made}
    # About half the groups, each copied whole; support pairs never.
    assert 10 <= len(groups) <= 30
    assert len(made) == 3 * len(groups)
    assert all(p.task == "answer" and p.id.endswith("-kw") for p in made)
    by_id = {p.id: p for p in pairs}
    for p in made:
        original = by_id[p.id.removesuffix("-kw")]
        assert (p.label, p.group, p.sentence) == (original.label, original.group, original.sentence)
        assert p.first == keyword_query(original.first)
    # Same seed, same copies; all groups at share 1; none at 0.
    assert keyword_groups(pairs, 0.5, seed=13) == made
    assert len(keyword_groups(pairs, 1.0, seed=13)) == 120
    assert keyword_groups(pairs, 0.0, seed=13) == []
