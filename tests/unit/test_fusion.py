"""Rank fusion against values computed by hand."""

from __future__ import annotations

import pytest

from attest.retrieval.fusion import (
    FusionSettings,
    Ranked,
    fuse,
    reciprocal_rank_fusion,
    weighted_score_fusion,
)


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


def test_distribution_fusion_scales_by_mean_and_deviation():
    from attest.retrieval.fusion import FusionSettings, fuse_with

    # mean 2, sd sqrt(2/3): scaled (s - (2 - 3 sd)) / (6 sd), clipped to [0, 1]
    one = Ranked("bm25", [("a", 3.0), ("b", 2.0), ("c", 1.0)])
    sd = (2 / 3) ** 0.5
    fused = dict(fuse_with([one], FusionSettings(method="dbsf")))
    assert fused["b"] == pytest.approx(0.5)
    assert fused["a"] == pytest.approx((3 - (2 - 3 * sd)) / (6 * sd))
    assert fused["c"] == pytest.approx((1 - (2 - 3 * sd)) / (6 * sd))
    # Beyond three deviations a score is clipped.
    far = Ranked("x", [("top", 1000.0)] + [(f"d{i}", 1.0) for i in range(20)])
    assert dict(fuse_with([far], FusionSettings(method="dbsf")))["top"] == 1.0


def test_weights_by_name_zero_weight_and_rescoring():
    from attest.retrieval.fusion import FusionSettings, fuse_with

    bm25 = Ranked("bm25", [("a", 3.0), ("b", 2.0)])
    dense = Ranked("dense", [("b", 0.9), ("c", 0.8)])
    kg = Ranked("kg", [("d", 0.9), ("a", 0.5), ("c", 0.1)])
    both = FusionSettings(method="rrf", weights={"bm25": 1.0, "dense": 2.0}, default_weight=0.0)
    fused = dict(fuse_with([bm25, dense, kg], both))
    assert set(fused) == {"a", "b", "c"}  # kg weighs 0: its "d" is not a candidate
    assert fused["c"] == pytest.approx(2 / 62)
    boost = FusionSettings(
        method="rrf", weights={"bm25": 1.0, "dense": 1.0, "kg": 0.5}, rescore=("kg",)
    )
    fused = dict(fuse_with([bm25, dense, kg], boost))
    assert "d" not in fused  # a re-scoring list never adds candidates
    assert fused["a"] == pytest.approx(1 / 61 + 0.5 / 62)
    assert fused["c"] == pytest.approx(1 / 62 + 0.5 / 63)
    # Alone, a re-scoring list is used as it is.
    assert [k for k, _ in fuse_with([kg], boost)] == ["d", "a", "c"]


def test_settings_files_are_checked(tmp_path):
    from attest.retrieval.fusion import FusionSettingsError, load_fusion_settings

    shipped = load_fusion_settings()
    assert shipped.method in ("rrf", "weighted", "dbsf", "linear")
    assert shipped.fitted_on
    bad = tmp_path / "f.json"
    for text, message in (
        ('{"method": "borda"}', "unknown fusion method"),
        ('{"weights": {"bm25": -1}}', "must be a number in"),
        ('{"weights": {"bm25": 1}, "colour": 1}', "unknown fusion settings keys"),
        ("[1]", "expected a JSON object"),
        ("{", "f.json"),
        ('{"method": "linear", "features": null}', "features must be an object"),
        ('{"method": "linear", "features": []}', "features must be an object"),
        ('{"rescore": 5}', "rescore must be a list"),
        ('{"rescore": "kg_enhanced"}', "rescore must be a list"),
        ('{"weights": {"bm_25": 3}}', "unknown retrievers"),
        ('{"method": "linear", "features": {"bm_25": {"rank": 1}}}', "unknown retrievers"),
        ('{"weights": {"bm25": true}}', "must be a number"),
        ('{"rrf_k": true}', "rrf_k must be an integer"),
        ('{"weights": {"bm25": 1e308, "dense": 1e308}}', "must be a number in"),
        ('{"method": "linear", "features": {"bm25": {"rank": 1e308}}}', "must be a number in"),
        ('{"method": "weighted", "weights": {}, "default_weight": 0}', "every retriever weighs 0"),
        ('{"method": "linear", "features": {"bm25": {}}}', "every retriever weighs 0"),
    ):
        bad.write_text(text)
        with pytest.raises(FusionSettingsError, match=message):
            load_fusion_settings(bad)


def test_a_rescoring_list_is_used_alone_when_the_others_found_nothing():
    from attest.retrieval.fusion import FusionSettings, fuse_with

    kg = Ranked("kg_enhanced", [("x", 0.9), ("a", 0.5)])
    boost = FusionSettings(method="rrf", rescore=("kg_enhanced",))
    empty = [Ranked("bm25", []), Ranked("dense", [])]
    assert [k for k, _ in fuse_with([*empty, kg], boost)] == ["x", "a"]


def test_a_broken_settings_file_is_a_settings_error_at_start_up(tmp_path, monkeypatch):
    from pydantic import ValidationError

    from attest.answer.settings import AnswerSettings

    for name, text in (("missing.json", None), ("bad.json", '{"rescore": null}')):
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        monkeypatch.setenv("ATTEST_ANSWER_FUSION_SETTINGS", str(path))
        with pytest.raises(ValidationError, match=name):
            AnswerSettings()


def test_a_retriever_no_fit_considered_counts_as_a_typical_fitted_one() -> None:
    fitted = FusionSettings(
        method="weighted",
        weights={"bm25": 1.0, "dense": 1.0, "kg_enhanced": 0.2, "kg": 4.0},
        default_weight=0.0,
        rescore=("kg",),
    )
    # The knowledge retriever: the mean over the fusing fitted retrievers (kg re-scores).
    assert fitted.weight("knowledge") == pytest.approx((1.0 + 1.0 + 0.2) / 3)
    # A fitted retriever the file leaves out stays out; a named one keeps its weight.
    assert (
        FusionSettings(method="rrf", weights={"bm25": 1.0}, default_weight=0.0).weight("dense")
        == 0.0
    )
    named = FusionSettings(method="rrf", weights={"bm25": 1.0, "knowledge": 0.5}, default_weight=0)
    assert named.weight("knowledge") == 0.5
    # Settings that weigh unnamed retrievers keep doing so.
    assert FusionSettings(method="rrf", weights={"bm25": 2.0}).weight("knowledge") == 1.0
