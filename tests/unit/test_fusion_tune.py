"""The fusion grid's objective equals trec_eval's nDCG@10 of the fused run."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from attest.evaluation.fusion_tune import (
    LOSO_TOLERANCE,
    candidates,
    choose_family,
    fit,
    fit_linear,
    fit_robust,
    halves,
    ndcg10,
    paired,
    prepare,
    random_halves,
    select,
    shrunk,
    tune,
    weighs,
)
from attest.evaluation.ir import evaluate, ndcg10_per_query
from attest.evaluation.runner import SignalLists, plain_fusions, run_of
from attest.retrieval.fusion import FusionSettings


def _synthetic(
    seed: int,
    n_queries: int = 40,
    kg_noise: float = 3.0,
    views: float = 1.0,
    noises: dict[str, float] | None = None,
) -> tuple[SignalLists, dict[str, dict[str, int]]]:
    """BM25 is a noisy view of relevance, dense a less noisy one, kg mostly noise
    (``views`` scales the noise of the first two); ``noises`` gives each signal's
    noise instead."""
    rng = random.Random(seed)
    lists: SignalLists = {}
    qrels: dict[str, dict[str, int]] = {}
    docs = [f"d{i}" for i in range(60)]
    for q in range(n_queries):
        qid = f"q{q:03d}"
        relevant = set(rng.sample(docs, 3))
        qrels[qid] = {d: 1 for d in relevant}
        by: dict[str, list[tuple[str, float]]] = {}
        by_name = noises or {"bm25": 1.2 * views, "dense": 0.7 * views, "kg": kg_noise}
        for name, noise in by_name.items():
            scored = [(d, (1.0 if d in relevant else 0.0) + rng.gauss(0, noise)) for d in docs]
            scored.sort(key=lambda kv: -kv[1])
            by[name] = scored[:30]
        lists[qid] = by
    return lists, qrels


def test_objective_is_trec_eval_ndcg():
    lists, qrels = _synthetic(7)
    prepared = prepare(lists, qrels)
    grid = candidates(prepared.signals)
    linear = [
        fit_linear([prepared], [list(prepared.queries)], ["bm25", "dense"], ()),
        fit_linear([prepared], [list(prepared.queries)], ["bm25", "dense", "kg"], ["kg"]),
    ]
    for settings in [*plain_fusions().values(), *random.Random(3).sample(grid, 12), *linear]:
        ours = ndcg10(prepared, settings, list(prepared.queries))
        theirs = evaluate(qrels, run_of(lists, settings))["ndcg@10"]
        assert ours == pytest.approx(theirs, abs=1e-9), settings


def test_fit_prefers_the_better_signal_and_generalizes():
    lists, qrels = _synthetic(11, n_queries=80)
    prepared = prepare(lists, qrels)
    a, b = halves(prepared.queries)
    assert len(a) == len(b) == 40
    assert not set(a) & set(b)
    chosen, score = fit([prepared], [a], candidates(prepared.signals))
    assert chosen.weight("dense") > chosen.weight("bm25")  # dense is the less noisy view
    plain = FusionSettings(method="rrf", weights={"bm25": 1, "dense": 1}, default_weight=0)
    assert score >= ndcg10(prepared, plain, a)
    assert ndcg10(prepared, chosen, b) > ndcg10(prepared, plain, b) - 0.02


def test_tune_reports_both_halves_and_names_the_data():
    lists, qrels = _synthetic(5, n_queries=30)
    settings, report = tune([("toy", lists, qrels)])
    halves_ = report["cross_validated"]["toy"]  # type: ignore[index]
    assert set(halves_) == {"A", "B"}
    for figures in halves_.values():
        assert 0 <= figures["tuned"] <= 1
        assert figures["queries"] == 15
    assert "toy" in settings.fitted_on


def test_linear_fusion_learns_which_signal_to_trust():
    lists, qrels = _synthetic(13, n_queries=80)
    prepared = prepare(lists, qrels)
    a, b = halves(prepared.queries)
    model = fit_linear([prepared], [a], ["bm25", "dense", "kg"], ["kg"])
    assert model.method == "linear"
    assert model.rescore == ("kg",)
    dense, bm25 = model.features["dense"], model.features["bm25"]
    assert dense["rank"] + dense["score"] > bm25["rank"] + bm25["score"] > 0
    # It ranks the held-out half at least as well as plain RRF.
    plain = FusionSettings(method="rrf", weights={"bm25": 1, "dense": 1}, default_weight=0)
    assert ndcg10(prepared, model, b) >= ndcg10(prepared, plain, b) - 0.01


def test_per_query_ndcg_averages_to_the_reported_figure():
    lists, qrels = _synthetic(3)
    run = run_of(lists, plain_fusions()["hybrid"])
    per_query = ndcg10_per_query(qrels, run)
    assert set(per_query) == set(qrels)
    assert sum(per_query.values()) / len(per_query) == pytest.approx(
        evaluate(qrels, run)["ndcg@10"], abs=1e-12
    )


def test_paired_intervals_tell_a_steady_gain_from_noise():
    qids = [f"q{i}" for i in range(200)]
    rng = random.Random(1)
    hybrid = {q: rng.random() for q in qids}
    steady = {q: v + 0.05 for q, v in hybrid.items()}  # better on every query
    noisy = {q: v + rng.gauss(0, 0.3) for q, v in hybrid.items()}  # no better on average
    out = paired(
        {
            "hybrid": hybrid,
            "tuned": steady,
            "tuned_with_kg": noisy,
            "tuned_without_kg": steady,
        }
    )
    assert out["queries"] == 200
    diffs = out["differences"]
    gain = diffs["tuned - hybrid"]
    assert gain["mean"] == pytest.approx(0.05, abs=1e-4)
    assert gain["ci95"][0] == pytest.approx(0.05, abs=1e-4)  # the same gain on every query
    chance = diffs["tuned_with_kg - hybrid"]
    low, high = chance["ci95"]
    assert low < 0 < high
    assert low <= chance["mean"] <= high
    assert diffs["tuned_with_kg - tuned_without_kg"]["ci95"][1] < 0.05
    # Seeded: the same figures again.
    assert paired({"hybrid": hybrid, "tuned": noisy}) == paired({"hybrid": hybrid, "tuned": noisy})
    # How many queries the interval rests on: all of them, or none where the two agree.
    assert gain["differing"] == 200
    partly = {q: v + (0.1 if i < 7 else 0.0) for i, (q, v) in enumerate(hybrid.items())}
    same = paired({"hybrid": hybrid, "tuned": hybrid, "tuned_with_kg": partly})["differences"]
    assert same["tuned - hybrid"] == {"mean": 0.0, "ci95": [0.0, 0.0], "differing": 0}
    assert same["tuned_with_kg - hybrid"]["differing"] == 7


def test_tune_reports_the_best_fit_that_weighs_the_graph():
    lists, qrels = _synthetic(17, n_queries=60)
    _, report = tune([("toy", lists, qrels)])
    for figures in report["cross_validated"]["toy"].values():  # type: ignore[index]
        with_kg = figures["fitted_with_kg_on_other_half"]
        if with_kg["method"] == "linear":
            assert any(with_kg["features"]["kg"].values())
        else:
            assert with_kg["weights"]["kg"] > 0
        assert 0 <= figures["tuned_with_kg"] <= 1
    pooled = report["paired"]["toy"]  # type: ignore[index]
    assert pooled["queries"] == 60
    halves_ = report["cross_validated"]["toy"]  # type: ignore[index]
    for label in ("hybrid", "tuned", "tuned_with_kg", "tuned_without_kg"):
        expected = (halves_["A"][label] * 30 + halves_["B"][label] * 30) / 60
        assert pooled[label] == pytest.approx(expected, abs=2e-4)
    assert set(pooled["differences"]) == {
        "tuned - hybrid",
        "tuned_with_kg - hybrid",
        "tuned_with_kg - tuned_without_kg",
    }


def test_per_query_ndcg_scores_a_judged_query_missing_from_the_run_as_zero():
    lists, qrels = _synthetic(3)
    run = run_of(lists, plain_fusions()["hybrid"])
    missing = sorted(run)[0]
    del run[missing]
    per_query = ndcg10_per_query(qrels, run)
    assert per_query[missing] == 0.0
    assert len(per_query) == len(qrels)


def test_the_fit_with_kg_weighs_a_graph_the_free_fit_leaves_out():
    # Clean BM25 and dense views, a KG of pure noise: the free fit gains
    # nothing from the graph, the restricted one must still weigh it.
    lists, qrels = _synthetic(21, n_queries=60, kg_noise=50.0, views=0.3)
    _, report = tune([("noise", lists, qrels)])
    for figures in report["cross_validated"]["noise"].values():  # type: ignore[index]
        free = FusionSettings.from_dict(figures["fitted_on_other_half"])
        with_kg = FusionSettings.from_dict(figures["fitted_with_kg_on_other_half"])
        assert not weighs(free, ["kg"])
        assert weighs(with_kg, ["kg"])


def test_without_a_kg_that_finds_anything_there_is_no_fit_with_kg():
    lists, qrels = _synthetic(5, n_queries=30)
    for by in lists.values():
        by["kg"] = []
    _, report = tune([("empty", lists, qrels)])
    for figures in report["cross_validated"]["empty"].values():  # type: ignore[index]
        assert figures["tuned_with_kg"] is None
        assert figures["fitted_with_kg_on_other_half"] is None
        assert not weighs(FusionSettings.from_dict(figures["fitted_on_other_half"]), ["kg"])
    assert set(report["paired"]["empty"]["differences"]) == {"tuned - hybrid"}  # type: ignore[index]


def test_a_half_is_scored_by_fits_that_never_saw_its_judgments():
    lists, qrels = _synthetic(9, n_queries=40)
    _, before = tune([("toy", lists, qrels)])
    _, b = halves(qrels)
    # Other judgments for half B: the fits scored on B (fitted on A) must not move.
    rng = random.Random(4)
    docs = sorted({d for by in lists.values() for d, _ in by["bm25"]})
    changed = {
        q: ({d: 1 for d in rng.sample(docs, 3)} if q in set(b) else r) for q, r in qrels.items()
    }
    _, after = tune([("toy", lists, changed)])
    for key in ("fitted_on_other_half", "fitted_with_kg_on_other_half"):
        assert (
            before["cross_validated"]["toy"]["B"][key]  # type: ignore[index]
            == after["cross_validated"]["toy"]["B"][key]  # type: ignore[index]
        )
    assert (
        before["cross_validated"]["toy"]["B"]["tuned"]
        != after["cross_validated"]["toy"]["B"]["tuned"]
    )  # type: ignore[index]


def test_data_sets_need_distinct_names():
    lists, qrels = _synthetic(5, n_queries=30)
    with pytest.raises(ValueError, match="distinct names"):
        tune([("same", lists, qrels), ("same", lists, qrels)])


def test_repeats_cross_validate_again_on_random_halvings():
    lists, qrels = _synthetic(17, n_queries=40)
    _, once = tune([("toy", lists, qrels)])
    assert "repeated" not in once
    _, report = tune([("toy", lists, qrels)], repeats=3)
    # The first split is the alternating one: its figures are unchanged.
    assert report["cross_validated"] == once["cross_validated"]
    repeated = report["repeated"]["toy"]  # type: ignore[index]
    assert set(repeated) == set(report["paired"]["toy"]["differences"])  # type: ignore[index]
    for r in repeated.values():
        assert r["splits"] == 3
        assert r["low"] <= r["mean"] <= r["high"]
        assert 0 <= r["positive"] <= 3
    first = report["paired"]["toy"]["differences"]["tuned - hybrid"]["mean"]  # type: ignore[index]
    low, high = repeated["tuned - hybrid"]["low"], repeated["tuned - hybrid"]["high"]
    assert low <= first <= high
    assert low < high  # other halvings fit other models
    # Seeded: the same figures again.
    assert tune([("toy", lists, qrels)], repeats=3)[1]["repeated"] == report["repeated"]
    with pytest.raises(ValueError, match="repeats"):
        tune([("toy", lists, qrels)], repeats=0)


def test_random_halves_split_every_query_once():
    qids = [f"q{i}" for i in range(11)]
    a, b = random_halves(qids, random.Random(2))
    assert sorted(a + b) == sorted(qids)
    assert (len(a), len(b)) == (6, 5)
    assert (a, b) != halves(qids)


def test_a_family_that_cannot_be_fitted_is_left_out():
    lists, qrels = _synthetic(5, n_queries=30)
    prepared = prepare(lists, qrels)
    grid = candidates(prepared.signals)

    def unfit(_part: object) -> FusionSettings:
        raise ValueError("the candidates need both relevant and non-relevant documents")

    chosen, score = select(
        [prepared],
        [list(prepared.queries)],
        {"unfit": unfit, "grid": lambda part: fit([prepared], part, grid)[0]},
    )
    assert chosen.method in ("rrf", "weighted", "dbsf")
    assert 0 < score <= 1
    with pytest.raises(ValueError, match="no fusion family"):
        select([prepared], [list(prepared.queries)], {"unfit": unfit})


def _beir(
    root: Path, n_queries: int, *, docs: int = 12, unknown: int = 0, unasked: int = 0
) -> Path:
    root.mkdir(parents=True)
    with (root / "corpus.jsonl").open("w") as f:
        for i in range(docs):
            f.write(json.dumps({"_id": f"d{i}", "title": f"doc {i}", "text": f"text {i}"}) + "\n")
    with (root / "queries.jsonl").open("w") as f:
        for q in range(n_queries):
            f.write(json.dumps({"_id": f"q{q}", "text": f"query {q}"}) + "\n")
    (root / "qrels").mkdir()
    lines = ["query-id\tcorpus-id\tscore"]
    lines += [f"q{q}\td{q % max(docs, 1)}\t1" for q in range(n_queries)]
    lines += [f"q{q}\tmissing{q}\t1" for q in range(unknown)]
    lines += [f"unasked{q}\td0\t1" for q in range(unasked)]
    (root / "qrels" / "test.tsv").write_text("\n".join(lines) + "\n")
    return root


def test_tune_fusion_refuses_bad_sets_before_indexing_anything(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from attest.cli import main

    monkeypatch.chdir(tmp_path)

    async def no_indexing(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("indexed a set that cannot be fitted")

    monkeypatch.setattr("attest.evaluation.runner.signal_lists", no_indexing)
    runner = CliRunner()
    good = _beir(tmp_path / "a" / "set", 10)
    same_name = _beir(tmp_path / "b" / "set", 10)
    cases = {
        (str(good), str(good)): "is given twice",
        (str(good), str(same_name)): "are both named 'set'",
        (str(_beir(tmp_path / "few", 5)),): "5 queries in queries.jsonl have a positive judgment",
        (str(_beir(tmp_path / "empty", 10, docs=0)),): "holds no documents",
    }
    for dirs, message in cases.items():
        args = ["eval", "tune-fusion", *(x for d in dirs for x in ("--dataset", d))]
        out = runner.invoke(main, args)
        assert out.exit_code == 1, out.output
        assert message in out.output
        assert "Traceback" not in out.output
    assert not (tmp_path / ".attest").exists()


def test_tune_fusion_warns_of_judgments_the_corpus_lacks(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from attest.cli import main

    monkeypatch.chdir(tmp_path)
    seen = []

    async def stop(data: object, *_args: object, **_kwargs: object) -> None:
        seen.append(data)
        raise SystemExit(3)

    monkeypatch.setattr("attest.evaluation.runner.signal_lists", stop)
    path = _beir(tmp_path / "partly", 10, unknown=2, unasked=3)
    out = CliRunner().invoke(main, ["eval", "tune-fusion", "--dataset", str(path)])
    assert len(seen) == 1  # the warning does not stop it
    assert (
        "2 positive judgments name 2 documents that are not in corpus.jsonl (e.g. 'missing0'); "
        "no retriever can find them, so they count against recall"
    ) in out.output
    assert "3 queries with a positive judgment are not in queries.jsonl (e.g. 'unasked0')" in (
        out.output
    )


def test_settings_are_written_whole_or_not_at_all(tmp_path, monkeypatch):
    import click

    from attest.evaluation.commands import _write

    target = tmp_path / "fusion.json"
    target.write_text('{"method": "rrf"}\n')
    real = Path.write_text

    def half_then_fail(self: Path, text: str, *args: object, **kwargs: object) -> int:
        real(self, text[:10], *args, **kwargs)
        raise OSError(27, "File too large")

    monkeypatch.setattr(Path, "write_text", half_then_fail)
    with pytest.raises(
        click.ClickException, match=r"cannot write .*fusion\.json: .*File too large"
    ):
        _write(target, {"method": "weighted", "weights": {"bm25": 1}})
    monkeypatch.undo()
    assert target.read_text() == '{"method": "rrf"}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["fusion.json"]
    (tmp_path / "afile").write_text("")
    with pytest.raises(click.ClickException, match="cannot write"):
        _write(tmp_path / "afile" / "x.json", {})


def test_linked_documents_are_counted_from_the_links_a_run_cached(tmp_path):
    from attest.evaluation.runner import _Cache, linked_documents

    cache = tmp_path / "cache"
    assert linked_documents(cache) is None
    assert not cache.exists()  # looking made no folder
    _Cache(cache).save_json("links.json.gz", {"d0": ["climate-change"], "d1": [], "d2": ["coal"]})
    assert linked_documents(cache) == (2, 3)


def _two_views(
    seed: int, bm25_noise: float, dense_noise: float, n_queries: int = 40
) -> tuple[SignalLists, dict[str, dict[str, int]]]:
    """BM25 and dense as views of relevance with noise of their own, no KG."""
    lists, qrels = _synthetic(
        seed, n_queries=n_queries, noises={"bm25": bm25_noise, "dense": dense_noise}
    )
    return lists, qrels


def test_shrunk_pulls_retrievers_to_equal_weights():
    fitted = FusionSettings(
        method="linear",
        features={
            "bm25": {"rank": 2.0, "score": 0.0, "found": 1.0},
            "dense": {"rank": 0.0, "score": 4.0, "found": -1.0},
            "kg": {"rank": 0.5, "score": 0.5, "found": 0.0},
        },
        rescore=("kg",),
    )
    same = shrunk(fitted, 0.0)
    assert (
        same.features["bm25"]
        == same.features["dense"]
        == {
            "rank": 1.0,
            "score": 2.0,
            "found": 0.0,
        }
    )
    assert same.features["kg"] == fitted.features["kg"]  # re-scoring is left alone
    assert shrunk(fitted, 1.0).features == fitted.features
    half = shrunk(fitted, 0.5).features
    assert half["bm25"]["rank"] == 1.5
    assert half["dense"]["score"] == 3.0
    with pytest.raises(ValueError, match="linear model"):
        shrunk(plain_fusions()["hybrid"], 0.5)


def test_fit_linear_can_leave_the_score_out():
    lists, qrels = _synthetic(3, n_queries=30)
    prepared = prepare(lists, qrels)
    model = fit_linear(
        [prepared], [list(prepared.queries)], ["bm25", "dense"], (), features=("rank", "found")
    )
    assert all(model.features[s]["score"] == 0.0 for s in ("bm25", "dense"))
    assert any(model.features[s]["rank"] != 0.0 for s in ("bm25", "dense"))


def test_choose_family_keeps_to_rrf_when_every_other_loses_somewhere():
    loso = {
        "a": {"rrf": 0.40, "grid": 0.46, "linear": 0.41},
        "b": {"rrf": 0.70, "grid": 0.69, "linear": 0.698},
    }
    # grid loses 0.01 on b: out; linear loses 0.002 (within 0.005) and gains on a.
    assert choose_family(loso, ["rrf", "grid", "linear"], "rrf") == "linear"
    assert choose_family(loso, ["rrf", "grid"], "rrf") == "rrf"
    assert choose_family(loso, ["rrf", "grid", "linear"], "rrf", tolerance=0.02) == "grid"
    # A family missing from a row (it could not be fitted there) is not chosen.
    assert choose_family({"a": {"rrf": 0.4}, "b": {"rrf": 0.5, "grid": 0.9}}, ["grid"], "rrf") == (
        "rrf"
    )


def test_leave_one_set_out_never_ships_a_fusion_that_loses_to_rrf_on_a_left_out_set():
    # Which retriever is the better view flips between corpora: a fit on two of
    # them learns a preference the third does not share.
    sets = [
        ("bm25_good", *_two_views(21, bm25_noise=0.5, dense_noise=2.0)),
        ("bm25_good_too", *_two_views(22, bm25_noise=0.6, dense_noise=2.0)),
        ("dense_good", *_two_views(23, bm25_noise=2.0, dense_noise=0.5)),
    ]
    settings, report = tune(sets)
    loso = report["leave_one_set_out"]
    assert set(loso) == {name for name, _, _ in sets}
    chosen = report["chosen_family"]
    for row in loso.values():
        assert row[chosen] >= row["rrf"] - LOSO_TOLERANCE
    # Fitted on the two BM25 corpora, the unshrunk fit loses on the dense one.
    assert loso["dense_good"]["grid"] < loso["dense_good"]["rrf"] - LOSO_TOLERANCE
    nested = report["nested_leave_one_set_out"]
    assert set(nested) == set(loso)
    for n in nested.values():
        assert n["chosen"] in loso["dense_good"]
    assert settings.fitted_on.startswith("attest eval tune-fusion on bm25_good")


def test_one_set_has_no_leave_one_set_out():
    lists, qrels = _synthetic(5, n_queries=30)
    _, report = tune([("toy", lists, qrels)])
    assert report["leave_one_set_out"] is None
    assert report["chosen_family"] == "within_sets"


def test_unseen_sets_are_scored_and_never_fitted_on():
    sets = [
        ("one", *_two_views(31, bm25_noise=0.8, dense_noise=1.2)),
        ("two", *_two_views(32, bm25_noise=0.9, dense_noise=1.1)),
    ]
    unseen = ("other", *_two_views(33, bm25_noise=2.0, dense_noise=0.5))
    settings, report = tune(sets, unseen=[unseen])
    row = report["unseen"]["other"]
    assert {"rrf", "linear", "linear_rank", "grid"} <= set(row)
    prepared = prepare(unseen[1], unseen[2])
    assert row["rrf"] == round(
        ndcg10(prepared, plain_fusions()["hybrid"], list(prepared.queries)), 4
    )
    # The unseen set changes nothing that was fitted or chosen.
    same, without = tune(sets)
    assert same == settings
    assert without["chosen_family"] == report["chosen_family"]
    assert without["unseen"] == {}


@pytest.mark.parametrize("seed", [40, 43, 45])
def test_the_robust_grid_fit_gains_on_every_set_where_the_mean_fit_trades_one_for_another(seed):
    # Dense is far the better view on one corpus and a little the worse on the
    # other: the best mean weighs dense up and loses on the second corpus; the
    # robust fit takes a weighting that gains on both.
    hybrid = plain_fusions()["hybrid"]
    dense_good = prepare(*_two_views(seed, bm25_noise=3.0, dense_noise=0.6))
    bm25_good = prepare(*_two_views(seed + 100, bm25_noise=0.9, dense_noise=1.3))
    sets = [dense_good, bm25_good]
    ids = [list(p.queries) for p in sets]
    grid = candidates(dense_good.signals)

    def gains(settings: FusionSettings) -> list[float]:
        return [
            ndcg10(p, settings, q) - ndcg10(p, hybrid, q) for p, q in zip(sets, ids, strict=True)
        ]

    by_mean, _ = fit(sets, ids, grid)
    robust, score = fit_robust(sets, ids, grid, hybrid)
    assert min(gains(by_mean)) < -0.005
    assert min(gains(robust)) >= 0.0
    # Two sets: mean minus standard deviation is the smaller gain.
    assert score == pytest.approx(min(gains(robust)))
    # A set without queries does not count, and one set alone is the plain mean.
    alone, _ = fit_robust(sets, [ids[0], []], grid, hybrid)
    assert alone == fit([dense_good], [ids[0]], grid)[0]


def test_tune_scores_the_robust_grid_family_left_one_set_out():
    sets = [
        ("one", *_two_views(31, bm25_noise=0.8, dense_noise=1.2)),
        ("two", *_two_views(32, bm25_noise=0.9, dense_noise=1.1)),
        ("three", *_two_views(33, bm25_noise=2.0, dense_noise=0.5)),
    ]
    _, report = tune(sets)
    for row in report["leave_one_set_out"].values():
        assert "grid_robust" in row
