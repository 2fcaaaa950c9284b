"""The peer benchmark's own parts: fusion, the limit's retrieval, figures and the report.

Haystack is not needed here (it comes with the ``peer`` dependency group).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from loadtest.bench_peer import (
    ARTICLE_CHARS,
    Corpus,
    Limit,
    article_text,
    figures,
    level_stats,
    percentile,
    plot,
    rrf,
    run_of,
)


def test_rrf_sums_reciprocal_ranks_with_k_60() -> None:
    fused = dict(rrf([["a", "b", "c"], ["c", "a"]]))
    assert fused["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert fused["b"] == pytest.approx(1 / 62)
    assert fused["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert [d for d, _ in rrf([["a", "b", "c"], ["c", "a"]])] == ["a", "c", "b"]


def test_rrf_breaks_ties_by_first_appearance_and_takes_k() -> None:
    # x and y have the same ranks in opposite lists: x was seen first.
    assert [d for d, _ in rrf([["x", "y"], ["y", "x"]])] == ["x", "y"]
    assert [d for d, _ in rrf([["y", "x"], ["x", "y"]])] == ["y", "x"]
    assert dict(rrf([["a"]], k=0))["a"] == pytest.approx(1.0)
    assert rrf([]) == []
    assert rrf([[], []]) == []


def test_article_text_is_title_and_the_start_of_the_text() -> None:
    assert article_text("Title", "body") == "Title\nbody"
    assert article_text("", "body") == "body"
    long = "x" * (ARTICLE_CHARS + 50)
    assert article_text("T", long) == "T\n" + "x" * ARTICLE_CHARS


def test_run_keeps_the_order_of_each_list() -> None:
    run = run_of({"q1": ["d3", "d1", "d2"], "q2": []})
    assert run["q2"] == {}
    assert sorted(run["q1"], key=lambda d: -run["q1"][d]) == ["d3", "d1", "d2"]


def test_level_stats_gives_queries_per_second_and_percentiles() -> None:
    stats = level_stats([0.010, 0.020, 0.030, 0.040, 0.100], wall_s=0.5)
    assert stats["queries"] == 5
    assert stats["qps"] == pytest.approx(10.0)
    assert stats["p50_ms"] == pytest.approx(30.0)
    assert stats["p99_ms"] == pytest.approx(97.6)
    assert math.isnan(percentile([], 50))


def _result(limit: list[float], attest: list[float], peer: list[float]) -> dict:
    def levels(qps: list[float], p50: float) -> dict:
        return {str(c): {"qps": q, "p50_ms": p50} for c, q in zip((1, 4, 16), qps, strict=True)}

    return {
        "levels": {
            "limit": levels(limit, 10.0),
            "attest": levels(attest, 20.0),
            "haystack": levels(peer, 100.0),
        },
        "ndcg": {"limit": 0.419, "attest": 0.4165, "haystack": 0.405},
        "indexing": {"limit": {"docs_per_s": 9000.0}, "attest": {"docs_per_s": 90.0}},
    }


def test_figures_give_the_acceptance_ratios() -> None:
    out = figures(_result([50.0, 90.0, 60.0], [40.0, 60.0, 45.0], [8.0, 6.0, 5.0]))
    assert out["attest_share_of_limit"] == {"1": 0.8, "4": 0.667, "16": 0.75}
    assert out["attest_over_haystack"] == {"1": 5.0, "4": 10.0, "16": 9.0}
    assert out["ndcg_gap_attest_vs_limit"] == pytest.approx(-0.0025)
    assert out["meets"] == {"share_of_limit": True, "over_haystack": True, "ndcg": True}
    assert out["wins"]["qps@4"] == "limit"
    assert out["wins"]["p50@1"] == "limit"
    assert out["wins"]["ndcg@10"] == "limit"
    assert out["wins"]["indexing"] == "limit"


def test_figures_fail_a_level_below_the_share_or_the_ratio() -> None:
    out = figures(_result([50.0, 90.0, 60.0], [40.0, 40.0, 45.0], [8.0, 9.0, 5.0]))
    assert out["attest_share_of_limit"]["4"] == pytest.approx(0.444)
    assert out["meets"]["share_of_limit"] is False
    assert out["meets"]["over_haystack"] is False  # 40 / 9 < 5
    result = _result([50.0, 90.0, 60.0], [40.0, 60.0, 45.0], [1.0, 1.0, 1.0])
    result["ndcg"]["attest"] = 0.41
    out = figures(result)
    assert out["meets"]["ndcg"] is False
    assert out["wins"]["qps@4"] == "limit"


def test_figures_of_fewer_systems_meet_nothing_they_cannot_show() -> None:
    result = _result([50.0, 90.0, 60.0], [40.0, 60.0, 45.0], [1.0, 1.0, 1.0])
    del result["levels"]["haystack"]
    out = figures(result)
    assert out["attest_over_haystack"] == {}
    assert out["meets"]["over_haystack"] is False
    assert out["meets"]["share_of_limit"] is True


class _FakeModel:
    """Two-dimensional 'embeddings': how much a text is about wings and about heat."""

    def encode(self, texts: list[str], **_: object) -> np.ndarray:
        rows = []
        for t in texts:
            v = np.array([t.count("wing") + 0.1, t.count("heat") + 0.1], dtype=np.float32)
            rows.append(v / np.linalg.norm(v))
        return np.stack(rows)


def _corpus() -> Corpus:
    ids = ["d1", "d2", "d3", "d4"]
    titles = ["Wing flutter", "Heat transfer", "Boundary layers", "Swept wing heat"]
    texts = [
        "flutter of a wing in flow",
        "heat transfer in hypersonic flow",
        "laminar boundary layers",
        "heating of a swept wing",
    ]
    vectors = _FakeModel().encode([article_text(t, x) for t, x in zip(titles, texts, strict=True)])
    return Corpus(
        name="tiny",
        ids=ids,
        titles=titles,
        texts=texts,
        queries={"q1": "wing flutter"},
        qrels={"q1": {"d1": 1}},
        vectors=vectors,
        encode_s=None,
    )


def test_the_limit_ranks_by_bm25_dense_and_their_fusion() -> None:
    limit = Limit(_corpus(), _FakeModel(), depth=3)
    assert limit.bm25("flutter") == ["d1"]
    # Stemmed and stop-worded like the lexical service: "layer" finds "layers", "the" nothing.
    assert limit.bm25("the layer") == ["d3"]
    assert limit.bm25("the") == []
    dense = limit.dense(_FakeModel().encode(["heat"])[0])
    assert len(dense) == 3
    assert dense[0] == "d2"
    fused = limit.search("wing flutter")
    assert fused[0] == "d1"
    assert set(fused) <= {"d1", "d2", "d3", "d4"}
    assert limit.index_s > 0


def test_plot_writes_the_figure(tmp_path: Path) -> None:
    report = {"datasets": {"cranfield": _result([50.0, 90.0, 60.0], [40.0, 60.0, 45.0], [8.0] * 3)}}
    path = tmp_path / "peer.png"
    plot(report, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_locked_limit_ranks_the_same() -> None:
    import threading

    free = Limit(_corpus(), _FakeModel(), depth=3)
    locked = Limit(_corpus(), _FakeModel(), depth=3, encode_lock=threading.Lock())
    for text in ("wing flutter", "heat", "boundary layers of a swept wing"):
        assert locked.search(text) == free.search(text)


def test_a_level_reports_its_median_cycle() -> None:
    from loadtest.bench_peer import median_cycle

    runs = [
        {"qps": 30.0, "p50_ms": 1.0},
        {"qps": 10.0, "p50_ms": 3.0},
        {"qps": 20.0, "p50_ms": 2.0},
    ]
    assert median_cycle(runs) == {"qps": 20.0, "p50_ms": 2.0, "qps_cycles": [30.0, 10.0, 20.0]}
    assert median_cycle(runs[:2])["qps"] == 10.0
    assert median_cycle(runs[:1])["qps_cycles"] == [30.0]


def test_the_locked_limit_is_a_diagnosis_not_a_contender() -> None:
    result = _result([50.0, 90.0, 60.0], [40.0, 60.0, 45.0], [8.0, 6.0, 5.0])
    result["levels"]["limit-locked"] = {
        str(c): {"qps": q, "p50_ms": 1.0}
        for c, q in zip((1, 4, 16), (80.0, 75.0, 90.0), strict=True)
    }
    out = figures(result)
    assert out["attest_share_of_locked_limit"] == {"1": 0.5, "4": 0.8, "16": 0.5}
    assert "limit-locked" not in out["wins"].values()
    assert out["attest_share_of_limit"]["4"] == pytest.approx(0.667)
