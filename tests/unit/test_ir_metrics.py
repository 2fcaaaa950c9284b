"""IR metrics against values computed by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from attest.evaluation.ir import DatasetError, evaluate, load_dataset


def test_metrics_match_hand_computed_values():
    qrels = {"q1": {"a": 2, "b": 1}, "q2": {"c": 1}, "q3": {"z": 0}}
    run = {
        "q1": {"x": 3.0, "a": 2.0, "b": 1.0},  # relevant at ranks 2 and 3
        "q2": {"y": 1.0},  # nothing relevant retrieved
    }
    m = evaluate(qrels, run)
    assert m["queries"] == 2  # q3 has no positive judgment
    # trec_eval (and so BEIR) uses the judgment itself as the gain.
    dcg = 2 / math.log2(3) + 1 / math.log2(4)
    idcg = 2 / math.log2(2) + 1 / math.log2(3)
    assert m["ndcg@10"] == pytest.approx((dcg / idcg + 0.0) / 2)
    assert m["mrr@10"] == pytest.approx((1 / 2 + 0) / 2)
    assert m["recall@100"] == pytest.approx((1.0 + 0.0) / 2)


def test_mrr_is_cut_at_ten():
    run = {"q": {f"d{i}": 100.0 - i for i in range(10)} | {"rel": 1.0}}
    m = evaluate({"q": {"rel": 1}}, run)
    assert m["mrr@10"] == 0.0
    assert m["recall@100"] == 1.0


def test_dataset_loading_reports_bad_files(tmp_path: Path):
    with pytest.raises(DatasetError, match=r"corpus\.jsonl is missing"):
        load_dataset(tmp_path)
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text('{"_id": "1", "title": "t", "text": "x"}\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "x"}\nnot json\n')
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\t1\t1\n")
    with pytest.raises(DatasetError, match=r"queries\.jsonl:2"):
        load_dataset(tmp_path)
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "x"}\n')
    data = load_dataset(tmp_path)
    assert data.judged_queries() == {"q1": "x"}
    assert [d.id for d in data.corpus()] == ["1"]
