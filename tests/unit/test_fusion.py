"""Rank fusion against values computed by hand."""

from __future__ import annotations

import pytest

from attest.answer.fusion import Ranked, fuse, reciprocal_rank_fusion, weighted_score_fusion


def test_rrf_matches_the_formula():
    bm25 = Ranked("bm25", [("a", 12.0), ("b", 9.0), ("c", 1.0)])
    dense = Ranked("dense", [("b", 0.9), ("d", 0.8), ("a", 0.1)])
    fused = dict(reciprocal_rank_fusion([bm25, dense]))
    assert fused["a"] == pytest.approx(1 / 61 + 1 / 63)
    assert fused["b"] == pytest.approx(1 / 62 + 1 / 61)
    assert fused["c"] == pytest.approx(1 / 63)
    assert fused["d"] == pytest.approx(1 / 62)
    assert [k for k, _ in reciprocal_rank_fusion([bm25, dense])] == ["b", "a", "d", "c"]


def test_rrf_weights_and_duplicates():
    one = Ranked("one", [("a", 1.0), ("a", 0.5), ("b", 0.4)], weight=2.0)
    fused = dict(reciprocal_rank_fusion([one], k=0))
    assert fused == {"a": 2.0, "b": 1.0}  # the duplicate "a" does not take a rank


def test_weighted_fusion_normalises_each_list():
    bm25 = Ranked("bm25", [("a", 20.0), ("b", 10.0), ("c", 0.0)])
    dense = Ranked("dense", [("c", 0.9), ("a", 0.5), ("b", 0.1)], weight=0.5)
    fused = dict(weighted_score_fusion([bm25, dense]))
    assert fused["a"] == pytest.approx(1.0 + 0.5 * 0.5)
    assert fused["b"] == pytest.approx(0.5 + 0.0)
    assert fused["c"] == pytest.approx(0.0 + 0.5 * 1.0)
    assert [k for k, _ in fuse([bm25, dense], method="weighted", top_k=2)] == ["a", "b"]


def test_empty_lists_are_harmless():
    assert fuse([Ranked("x", [])]) == []
    assert weighted_score_fusion([Ranked("x", [("a", 3.0)])]) == [("a", 1.0)]
