"""Fit the fusion's method and per-retriever weights on development sets.

The search is a grid, small enough to read: for each method (RRF, min-max,
distribution-based), a weight for dense relative to BM25 and a weight for a
knowledge-graph signal (``kg`` or ``kg_enhanced``), fused as a retriever of
its own or as a re-scoring of BM25 + dense candidates. The plain
equal-weight RRF is one of the candidates, so a fit can always fall back to
it. The objective is the mean over data sets of nDCG@10.

Beside the grid, two linear models are fitted by logistic regression on the
candidates' per-retriever features (reciprocal rank, DBSF score, found): one
over BM25 and dense, one with the knowledge-graph signals as re-scoring
features. Which of these families is used is chosen as described below.

Beside the fit, the best fit that must weigh a KG signal is reported, with
bootstrap intervals of its held-out difference from plain RRF and from the
same search without the KG: the question a knowledge graph has to answer is
whether it adds to BM25 + dense on queries the fit did not see.

Cross-validation: each data set's judged queries are split into two halves
(alternating in sorted id order); the grid is fitted on one half and scored
on the other, both ways round, so the reported figure is one the fit did not
see. Which family (the grid, a linear model, a linear model with the KG
signals) is fitted is itself chosen by a 2-fold split of the fitting
queries, so a family with more parameters wins only if it generalizes. The
settings written are then fitted on all the queries.

Per-list normalised scores do not depend on the weights, so each method's
scores are computed once per query as a (candidates x signals) matrix and a
candidate fusion is one matrix-vector product.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from attest.evaluation.runner import SignalLists
from attest.retrieval.fusion import (
    FEATURES,
    METHODS,
    RRF_K,
    FusionSettings,
    Ranked,
    _distribution_scores,
    _minmax_scores,
    _rrf_scores,
)

DENSE_WEIGHTS = (0.25, 0.5, 0.7, 1.0, 1.4, 2.0, 4.0)
KG_WEIGHTS = (0.0, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)
KG_SIGNALS = ("kg", "kg_enhanced")
# Each half is halved again to choose a family, and each quarter needs a
# relevant and a non-relevant candidate.
MIN_QUERIES = 8
# Inverse L2 strength of the linear method's logistic regression.
LINEAR_C = 1.0
Qrels = Mapping[str, Mapping[str, int]]
# Whether a fit may, must not or must weigh a knowledge-graph signal.
KgUse = Literal["may", "never", "always"]


@dataclass(frozen=True)
class _Query:
    keys: list[str]
    gains: npt.NDArray[np.float64]  # relevance of each candidate
    ideal_dcg: float
    # method -> (candidates x signals) normalised scores, and which signal found each key.
    scores: dict[str, npt.NDArray[np.float64]]
    found: npt.NDArray[np.bool_]


@dataclass(frozen=True)
class Prepared:
    signals: tuple[str, ...]
    queries: dict[str, _Query]


_DISCOUNT = 1.0 / np.log2(np.arange(2, 12))


def prepare(lists: SignalLists, qrels: Qrels) -> Prepared:
    """Normalised scores of every judged query under every method."""
    signals = tuple(sorted({s for by in lists.values() for s in by}))
    queries: dict[str, _Query] = {}
    for qid, by_signal in lists.items():
        rels = qrels.get(qid, {})
        if not any(v > 0 for v in rels.values()):
            continue
        keys = list(dict.fromkeys(k for s in signals for k, _ in by_signal.get(s, [])))
        index = {k: i for i, k in enumerate(keys)}
        gains = np.array([max(0, rels.get(k, 0)) for k in keys], dtype=np.float64)
        ideal = sorted((v for v in rels.values() if v > 0), reverse=True)[:10]
        ideal_dcg = float(np.sum(np.array(ideal, dtype=np.float64) * _DISCOUNT[: len(ideal)]))
        found = np.zeros((len(keys), len(signals)), dtype=bool)
        per_method: dict[str, npt.NDArray[np.float64]] = {}
        for method in ("rrf", "weighted", "dbsf"):
            m = np.zeros((len(keys), len(signals)), dtype=np.float64)
            for j, s in enumerate(signals):
                ranked = Ranked(s, by_signal.get(s, []))
                norm = (
                    _rrf_scores(ranked, 60)
                    if method == "rrf"
                    else _minmax_scores(ranked)
                    if method == "weighted"
                    else _distribution_scores(ranked)
                )
                for k, v in norm.items():
                    m[index[str(k)], j] = v
                    found[index[str(k)], j] = True
            per_method[method] = m
        queries[qid] = _Query(keys, gains, ideal_dcg, per_method, found)
    return Prepared(signals, queries)


def ndcg10(prepared: Prepared, settings: FusionSettings, qids: Iterable[str]) -> float:
    """Mean nDCG@10 of ``settings`` over ``qids`` (trec_eval's definition)."""
    w = np.array([settings.weight(s) for s in prepared.signals])
    active = w > 0 if (w > 0).any() else np.ones(len(w), dtype=bool)
    rescore = np.array([s in settings.rescore for s in prepared.signals]) & active
    if not (active & ~rescore).any():
        rescore[:] = False
    fusing = active & ~rescore
    total = n = 0.0
    for qid in qids:
        q = prepared.queries.get(qid)
        if q is None:
            continue
        n += 1
        if not q.keys:
            continue
        # Mirrors ``fuse_with``: the fusing lists' keys are the candidates, and
        # the re-scoring lists add to those only.
        candidate = q.found[:, fusing].any(axis=1)
        if not candidate.any():
            candidate = q.found[:, active].any(axis=1)  # re-scoring lists alone
        if settings.method == "linear":
            fused = _linear(q, settings, prepared.signals, active)
        else:
            fused = q.scores[settings.method][:, active] @ w[active]
        score = np.where(candidate, fused, -np.inf)
        # Higher score first, ties in first-seen order as ``fuse_with`` keeps them.
        order = [i for i in np.argsort(-score, kind="stable")[:10] if math.isfinite(score[i])]
        dcg = float(np.sum(q.gains[order] * _DISCOUNT[: len(order)]))
        total += dcg / q.ideal_dcg if q.ideal_dcg > 0 else 0.0
    return total / n if n else 0.0


def _features(q: _Query, columns: Sequence[int]) -> npt.NDArray[np.float64]:
    """The linear method's features of each candidate: per signal in ``columns``,
    ``k / (k + rank)``, the DBSF-scaled score and found (0/1), side by side."""
    cols = list(columns)
    return np.hstack(
        [RRF_K * q.scores["rrf"][:, cols], q.scores["dbsf"][:, cols], q.found[:, cols]]
    )


def _linear(
    q: _Query, settings: FusionSettings, signals: Sequence[str], active: npt.NDArray[np.bool_]
) -> npt.NDArray[np.float64]:
    cols = [j for j in range(len(signals)) if active[j]]
    coef = np.array(
        [settings.features.get(signals[j], {}).get(f, 0.0) for f in FEATURES for j in cols]
    )
    out: npt.NDArray[np.float64] = _features(q, cols) @ coef
    return out


def fit_linear(
    prepared: Sequence[Prepared],
    qids: Sequence[Sequence[str]],
    signals: Sequence[str],
    rescore: Sequence[str],
    c: float = LINEAR_C,
    features: Sequence[str] = FEATURES,
) -> FusionSettings:
    """Logistic regression of relevance on the candidates' features (balanced classes,
    L2): its coefficients rank the candidates of a query.

    ``features`` leaves the others out of the fit (their weights are 0): with
    ``("rank", "found")`` the model reads no score at all, only where each
    retriever placed a candidate."""
    from sklearn.linear_model import LogisticRegression

    xs, ys = [], []
    n = len(signals)
    # Columns of ``_features``: feature-major, one column per signal.
    used = [i * n + j for i, f in enumerate(FEATURES) if f in features for j in range(n)]
    fusing = [s for s in signals if s not in rescore]
    for p, ids in zip(prepared, qids, strict=True):
        cols = [p.signals.index(s) if s in p.signals else -1 for s in signals]
        base = [p.signals.index(s) for s in fusing if s in p.signals]
        for qid in ids:
            q = p.queries.get(qid)
            if q is None or not q.keys:
                continue
            keep = q.found[:, base].any(axis=1)
            x = _features(q, [c for c in cols if c >= 0])[:, used]
            xs.append(x[keep])
            ys.append(q.gains[keep] > 0)
    x_all, y_all = np.vstack(xs), np.concatenate(ys)
    if y_all.all() or not y_all.any():
        raise ValueError("the candidates need both relevant and non-relevant documents")
    model = LogisticRegression(C=c, class_weight="balanced", max_iter=5000)
    model.fit(x_all, y_all)
    coef = np.zeros(len(FEATURES) * n)
    coef[used] = model.coef_[0]
    weights = {
        s: {f: round(float(coef[i * n + j]), 6) for i, f in enumerate(FEATURES)}
        for j, s in enumerate(signals)
    }
    return FusionSettings(method="linear", features=weights, rescore=tuple(rescore))


def shrunk(settings: FusionSettings, keep: float) -> FusionSettings:
    """A linear model's retrievers pulled toward equal weights: each fusing
    retriever's weight of a feature becomes ``keep`` x its own plus ``1 - keep`` x
    the mean over the fusing retrievers (re-scoring ones are left as they are).

    ``keep`` = 0 treats every retriever alike (a symmetric fusion of rank, score
    and found, as RRF treats them alike); 1 is the fit itself. What a fit learns
    about one retriever against another on some corpora (that BM25's scores
    deserve more trust than dense ones, say) is the part least likely to hold
    on another corpus, so it is the part shrunk."""
    if settings.method != "linear" or not 0.0 <= keep <= 1.0:
        raise ValueError("shrinking needs a linear model and keep in [0, 1]")
    fusing = [s for s in settings.features if s not in settings.rescore]
    if not fusing:
        return settings
    mean = {
        f: sum(settings.features[s].get(f, 0.0) for s in fusing) / len(fusing) for f in FEATURES
    }
    features = {
        s: (
            {
                f: round(keep * settings.features[s].get(f, 0.0) + (1 - keep) * mean[f], 6)
                for f in FEATURES
            }
            if s in fusing
            else dict(w)
        )
        for s, w in settings.features.items()
    }
    return dataclasses.replace(settings, features=features)


def candidates(signals: Sequence[str]) -> list[FusionSettings]:
    """Every fusion the grid tries over ``signals`` (BM25 weight fixed at 1)."""
    kg_signals = [s for s in KG_SIGNALS if s in signals]
    out: list[FusionSettings] = []
    for method in METHODS:
        if method == "linear":
            continue  # fitted, not searched: see ``fit_linear``
        for dense in DENSE_WEIGHTS if "dense" in signals else (0.0,):
            base = {"bm25": 1.0, "dense": dense}
            out.append(FusionSettings(method=method, weights=base, default_weight=0.0))
            for kg, weight, rescore in itertools.product(kg_signals, KG_WEIGHTS[1:], (False, True)):
                out.append(
                    FusionSettings(
                        method=method,
                        weights={**base, kg: weight},
                        default_weight=0.0,
                        rescore=(kg,) if rescore else (),
                    )
                )
    return out


def fit(
    prepared: Sequence[Prepared], qids: Sequence[Sequence[str]], grid: Sequence[FusionSettings]
) -> tuple[FusionSettings, float]:
    """The candidate with the best mean nDCG@10 over the data sets (first wins ties)."""
    best, best_score = grid[0], -1.0
    for settings in grid:
        score = sum(ndcg10(p, settings, q) for p, q in zip(prepared, qids, strict=True)) / len(
            prepared
        )
        if score > best_score + 1e-12:
            best, best_score = settings, score
    return best, best_score


def fit_robust(
    prepared: Sequence[Prepared],
    qids: Sequence[Sequence[str]],
    grid: Sequence[FusionSettings],
    baseline: FusionSettings,
) -> tuple[FusionSettings, float]:
    """The candidate whose gain over ``baseline`` is large on every data set, not
    on average: the best mean minus standard deviation, over the sets that have
    queries, of each set's nDCG@10 gain over ``baseline`` (first wins ties).

    The plain mean lets one corpus whose queries reward a weighting outvote the
    others (a fit that gains 0.03 on one set and loses 0.01 on another beats one
    that gains 0.01 on both); penalising the spread of the gains prefers the
    weighting every corpus agrees on, which is the one likeliest to carry to a
    corpus none of them is. With two sets this is the larger of the two
    smaller gains (the mean minus half the difference); with one, the mean.
    """
    used = [(p, q) for p, q in zip(prepared, qids, strict=True) if q]
    if not used:
        return fit(prepared, qids, grid)
    base = np.array([ndcg10(p, baseline, q) for p, q in used])
    best, best_score = grid[0], -math.inf
    for settings in grid:
        gains = np.array([ndcg10(p, settings, q) for p, q in used]) - base
        score = float(gains.mean() - gains.std())
        if score > best_score + 1e-12:
            best, best_score = settings, score
    return best, best_score


def objective(
    prepared: Sequence[Prepared], qids: Sequence[Sequence[str]], settings: FusionSettings
) -> float:
    """Mean over data sets of mean nDCG@10 over their ``qids``."""
    scores = [ndcg10(p, settings, q) for p, q in zip(prepared, qids, strict=True)]
    return sum(scores) / len(scores)


def select(
    prepared: Sequence[Prepared],
    qids: Sequence[Sequence[str]],
    families: Mapping[str, Callable[[Sequence[Sequence[str]]], FusionSettings]],
) -> tuple[FusionSettings, float]:
    """The family (grid search, a linear model, ...) that generalizes best, refitted on
    all of ``qids``, with its inner cross-validated score.

    Families differ in how many parameters they fit, so they are compared on
    queries their fit did not see: ``qids`` are halved again, each family is
    fitted on one inner half and scored on the other, both ways round.

    A family that cannot be fitted on some queries (a linear model needs a
    relevant and a non-relevant candidate among them) is left out there; the
    grid always fits.
    """
    inner = [halves(q) for q in qids]
    scores: list[tuple[float, int, str]] = []
    for order, (name, fit_family) in enumerate(families.items()):
        try:
            score = 0.0
            for a, b in ((0, 1), (1, 0)):
                settings = fit_family([h[a] for h in inner])
                score += objective(prepared, [h[b] for h in inner], settings) / 2
        except ValueError:
            continue
        scores.append((round(score, 12), -order, name))
    # Best score first, the earlier family on ties.
    for score, _, name in sorted(scores, reverse=True):
        try:
            return families[name](qids), score
        except ValueError:
            continue
    raise ValueError("no fusion family can be fitted on these queries")


# The most the shipped fusion may lose to plain RRF on a data set it was not
# fitted on (leave-one-set-out): a family that loses more on any left-out set
# is not shipped, and plain RRF, which loses nothing by definition, is the
# fallback.
LOSO_TOLERANCE = 0.005
# How much of a linear model's per-retriever differences the shrunk families keep.
SHRINK_KEEP = (0.5, 0.25)
Family = Callable[[Sequence[Sequence[str]]], FusionSettings]


def leave_one_set_out(
    prepared: Sequence[Prepared], names: Sequence[str], families: Mapping[str, Family]
) -> dict[str, dict[str, float]]:
    """Per data set, each family fitted on all the queries of the other sets and
    scored (nDCG@10) on all of this set's: what a fit does on a corpus it never
    saw, the shift the within-set halves cannot show (a score's spread, document
    length and vocabulary differ between corpora, not between halves of one).

    A family that cannot be fitted on the other sets is left out of that row."""
    out: dict[str, dict[str, float]] = {}
    for i, name in enumerate(names):
        others = [[] if j == i else list(p.queries) for j, p in enumerate(prepared)]
        held = list(prepared[i].queries)
        row: dict[str, float] = {}
        for family, fit_family in families.items():
            try:
                settings = fit_family(others)
            except ValueError:
                continue
            row[family] = round(ndcg10(prepared[i], settings, held), 4)
        out[name] = row
    return out


def choose_family(
    loso: Mapping[str, Mapping[str, float]],
    families: Sequence[str],
    baseline: str,
    tolerance: float = LOSO_TOLERANCE,
) -> str:
    """The family with the best mean left-out nDCG@10 among those that lose at most
    ``tolerance`` to ``baseline`` on every left-out set (the earlier family on
    ties); ``baseline`` itself when none does."""
    best, best_mean = baseline, -1.0
    for family in families:
        rows = list(loso.values())
        if not rows or not all(family in r and baseline in r for r in rows):
            continue
        if any(r[family] < r[baseline] - tolerance - 1e-12 for r in rows):
            continue
        mean = sum(r[family] for r in rows) / len(rows)
        if mean > best_mean + 1e-12:
            best, best_mean = family, mean
    return best


def nested_leave_one_set_out(
    prepared: Sequence[Prepared],
    names: Sequence[str],
    families: Mapping[str, Family],
    baseline: str,
) -> dict[str, dict[str, object]]:
    """The whole shipping procedure validated on each left-out set: the family is
    chosen by leave-one-set-out among the other sets alone, fitted on them, and
    scored on the left-out one. Needs three sets or more (two to choose on)."""
    out: dict[str, dict[str, object]] = {}
    if len(prepared) < 3:
        return out
    for i, name in enumerate(names):
        keep = [j for j in range(len(prepared)) if j != i]
        sub_prepared = [prepared[j] for j in keep]

        def restricted(fit_family: Family, keep: list[int] = keep) -> Family:
            # A family's fit over the other sets: their query lists in place, i's empty.
            def run(ids: Sequence[Sequence[str]]) -> FusionSettings:
                full: list[Sequence[str]] = [[] for _ in prepared]
                for j, q in zip(keep, ids, strict=True):
                    full[j] = q
                return fit_family(full)

            return run

        sub = {f: restricted(fn) for f, fn in families.items()}
        inner = leave_one_set_out(sub_prepared, [names[j] for j in keep], sub)
        chosen = choose_family(inner, list(families), baseline)
        others = [[] if j == i else list(p.queries) for j, p in enumerate(prepared)]
        held = list(prepared[i].queries)
        out[name] = {
            "chosen": chosen,
            "ndcg@10": round(ndcg10(prepared[i], families[chosen](others), held), 4),
            baseline: round(ndcg10(prepared[i], families[baseline](others), held), 4),
        }
    return out


# Paired comparisons reported by ``tune``: (better, baseline) fusion labels.
COMPARISONS = (
    ("tuned", "hybrid"),
    ("tuned_with_kg", "hybrid"),
    ("tuned_with_kg", "tuned_without_kg"),
)
BOOTSTRAP_SAMPLES = 2000
# Below this many queries a percentile bootstrap interval runs narrower than its
# nominal 95 % (it cannot see the tails of the per-query differences), and
# report readers are warned.
FEW_QUERIES = 30


def mean_differences(per_query: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The mean per-query difference of each pair in ``COMPARISONS`` present in
    ``per_query`` (label -> query id -> nDCG@10)."""
    out: dict[str, float] = {}
    for better, baseline in COMPARISONS:
        if better in per_query and baseline in per_query:
            b, a = per_query[better], per_query[baseline]
            out[f"{better} - {baseline}"] = sum(b[q] - a[q] for q in a) / max(len(a), 1)
    return out


def paired(
    per_query: Mapping[str, Mapping[str, float]], samples: int = BOOTSTRAP_SAMPLES, seed: int = 0
) -> dict[str, object]:
    """Means over a data set's held-out queries (both halves), and for each pair in
    ``COMPARISONS`` the mean per-query difference with a 95 % percentile bootstrap
    interval (queries resampled with replacement; seeded, so a rerun prints the same).

    A difference whose interval holds 0 is one this many queries cannot tell from
    chance. ``differing`` counts the queries whose nDCG@10 the two give differently: an
    interval drawn from a handful of them is no better than that handful."""
    qids = sorted(next(iter(per_query.values()), {}))
    out: dict[str, object] = {"queries": len(qids)}
    if not qids:
        return out
    table = {label: np.array([by[q] for q in qids]) for label, by in per_query.items()}
    out.update({label: round(float(v.mean()), 4) for label, v in table.items()})
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(qids), size=(samples, len(qids)))
    differences: dict[str, dict[str, object]] = {}
    for better, baseline in COMPARISONS:
        if better not in table or baseline not in table:
            continue
        diff = table[better] - table[baseline]
        means = diff[draws].mean(axis=1)
        low, high = np.percentile(means, [2.5, 97.5])
        differences[f"{better} - {baseline}"] = {
            "mean": round(float(diff.mean()), 4),
            "ci95": [round(float(low), 4), round(float(high), 4)],
            "differing": int(np.count_nonzero(np.abs(diff) > 1e-12)),
        }
    out["differences"] = differences
    return out


def _found_any(p: Prepared, signal: str) -> bool:
    if signal not in p.signals:
        return False
    j = p.signals.index(signal)
    return any(bool(q.found[:, j].any()) for q in p.queries.values())


def weighs(settings: FusionSettings, signals: Iterable[str]) -> bool:
    """Whether ``settings`` gives any of ``signals`` a say in the ranking: a
    non-zero feature of a linear model, a positive weight otherwise."""
    if settings.method == "linear":
        return any(v != 0 for s in signals for v in settings.features.get(s, {}).values())
    return any(settings.weight(s) > 0 for s in signals)


def random_halves(qids: Iterable[str], rng: random.Random) -> tuple[list[str], list[str]]:
    """A random halving (sizes as ``halves``)."""
    ordered = sorted(qids)
    rng.shuffle(ordered)
    return sorted(ordered[0::2]), sorted(ordered[1::2])


def halves(qids: Iterable[str]) -> tuple[list[str], list[str]]:
    ordered = sorted(qids)
    return ordered[0::2], ordered[1::2]


def tune(
    datasets: Sequence[tuple[str, SignalLists, Qrels]],
    *,
    repeats: int = 1,
    progress: bool = False,
    unseen: Sequence[tuple[str, SignalLists, Qrels]] = (),
) -> tuple[FusionSettings, dict[str, object]]:
    """Cross-validated figures per data set and half, and the settings fitted on all.

    Each figure is nDCG@10 by trec_eval on queries the fit did not see:
    ``hybrid`` (RRF of BM25 and dense), ``hybrid_kg`` (RRF with KG enhanced
    added at equal weight) and ``tuned`` (fitted on the other half).
    ``tuned_without_kg`` is the same search without the KG signals and
    ``tuned_with_kg`` the best fit that must weigh one (the grid's points
    with a KG weight, and the linear model with the KG as re-scoring or as a
    retriever of its own), so a reader sees what the graph adds.

    The shipped family is chosen by leave-one-set-out (``leave_one_set_out``,
    ``choose_family``); ``unseen`` sets are only scored, each family fitted on
    all the tuning queries (``report["unseen"]``): figures on corpora that no
    fit and no choice saw.

    Without a KG signal that found anything, ``tuned_with_kg`` is None and
    its comparisons are left out.

    ``paired`` has, per data set, each fusion's mean over all its held-out
    queries (both halves) and bootstrap intervals of the ``COMPARISONS``, so
    a gain can be told from the noise of that many queries. The intervals
    resample queries only: they take the one split and the models fitted on
    it as given. With ``repeats`` > 1 the whole cross-validation runs again on
    ``repeats - 1`` random halvings (seeded), and ``repeated`` has, per set
    and comparison, the mean difference over all the splits, its lowest and
    highest, and on how many splits it was positive.
    """
    if repeats < 1:
        raise ValueError("repeats must be at least 1")
    from attest.evaluation.ir import ndcg10_per_query
    from attest.evaluation.runner import plain_fusions, run_of

    names = [name for name, _, _ in datasets]
    if len(set(names)) != len(names):
        raise ValueError(f"data sets need distinct names (folder names); got {names}")
    prepared = [prepare(lists, qrels) for _, lists, qrels in datasets]
    for (name, _, _), p in zip(datasets, prepared, strict=True):
        if len(p.queries) < MIN_QUERIES:
            raise ValueError(
                f"{name}: {len(p.queries)} queries with a positive judgment and results; "
                f"fitting by halves and choosing a family by halves of those needs at least "
                f"{MIN_QUERIES}"
            )
    signals = sorted({s for p in prepared for s in p.signals})
    grid = candidates(signals)
    report: dict[str, object] = {"grid_size": len(grid)}

    # KG signals that found something: a fusion weighing only empty lists does not weigh the KG.
    kg = [s for s in KG_SIGNALS if any(_found_any(p, s) for p in prepared)]
    base = [s for s in signals if s not in KG_SIGNALS]

    def fitted(ids: Sequence[Sequence[str]], kg_use: KgUse) -> tuple[FusionSettings, float]:
        if kg_use == "never" or not kg:
            pool = [g for g in grid if not any(g.weight(s) for s in KG_SIGNALS)]
        elif kg_use == "always":
            pool = [g for g in grid if any(g.weight(s) for s in KG_SIGNALS)]
        else:
            pool = list(grid)
        families: dict[str, Callable[[Sequence[Sequence[str]]], FusionSettings]] = {
            "grid": lambda part: fit(prepared, part, pool)[0],
        }
        if kg_use != "always" or not kg:
            families["linear"] = lambda part: fit_linear(prepared, part, base, ())
        if kg and kg_use != "never":
            families["linear_kg"] = lambda part: fit_linear(prepared, part, base + kg, kg)
        if kg and kg_use == "always":
            # The KG's lists also bring candidates of their own here.
            families["linear_kg_fused"] = lambda part: fit_linear(prepared, part, base + kg, ())
        return select(prepared, ids, families)

    # The families the shipped fusion is chosen from, plain RRF first (the
    # baseline, and the choice on ties).
    hybrid = plain_fusions()["hybrid"]
    rrf_grid = [g for g in grid if g.method == "rrf"]
    families: dict[str, Family] = {
        "rrf": lambda part: hybrid,
        "grid_rrf": lambda part: fit(prepared, part, rrf_grid)[0],
        "grid": lambda part: fit(prepared, part, grid)[0],
        "grid_robust": lambda part: fit_robust(prepared, part, grid, hybrid)[0],
        "linear": lambda part: fit_linear(prepared, part, base, ()),
        "linear_rank": lambda part: fit_linear(
            prepared, part, base, (), features=("rank", "found")
        ),
    }

    def shrunk_family(keep: float) -> Family:
        return lambda part: shrunk(fit_linear(prepared, part, base, ()), keep)

    for keep in SHRINK_KEEP:
        families[f"linear_shrunk_{keep:g}"] = shrunk_family(keep)
    if kg:
        families["linear_kg"] = lambda part: fit_linear(prepared, part, base + kg, kg)
    if len(prepared) > 1:
        loso = leave_one_set_out(prepared, names, families)
        chosen_family = choose_family(loso, list(families), "rrf")
        report["leave_one_set_out"] = loso
        report["nested_leave_one_set_out"] = nested_leave_one_set_out(
            prepared, names, families, "rrf"
        )
    else:
        # One set: no corpus to leave out; the within-set choice (a family chosen on
        # halves of its queries) is all there is.
        families["within_sets"] = lambda part: fitted(part, "may")[0]
        chosen_family = "within_sets"
        report["leave_one_set_out"] = None
        report["nested_leave_one_set_out"] = {}
    report["chosen_family"] = chosen_family
    ship = families[chosen_family]

    def cross_validate(
        split: Sequence[tuple[list[str], list[str]]],
    ) -> tuple[dict[str, dict[str, dict[str, object]]], dict[str, dict[str, dict[str, float]]]]:
        """Per set and half, the figures; per set, each held-out query's nDCG@10
        under each fusion (both halves together)."""
        per_set: dict[str, dict[str, dict[str, object]]] = {}
        held_out: dict[str, dict[str, dict[str, float]]] = {}
        for fit_on, score_on in ((0, 1), (1, 0)):
            ids = [h[fit_on] for h in split]
            chosen, fitted_score = ship(ids), objective(prepared, ids, ship(ids))
            without_kg, _ = fitted(ids, "never")
            with_kg = fitted(ids, "always")[0] if kg else None
            if with_kg is not None and not weighs(with_kg, kg):
                raise RuntimeError(f"the fit that must weigh the KG does not: {with_kg.describe()}")
            for (name, lists, qrels), h in zip(datasets, split, strict=True):
                held = set(h[score_on])
                sub_lists = {q: v for q, v in lists.items() if q in held}
                sub_qrels = {q: dict(v) for q, v in qrels.items() if q in held}
                figures: dict[str, object] = {"queries": len(held)}
                fusions = {**plain_fusions(), "tuned": chosen, "tuned_without_kg": without_kg}
                if with_kg is not None:
                    fusions["tuned_with_kg"] = with_kg
                for label, settings in fusions.items():
                    per_query = ndcg10_per_query(sub_qrels, run_of(sub_lists, settings))
                    held_out.setdefault(name, {}).setdefault(label, {}).update(per_query)
                    figures[label] = round(sum(per_query.values()) / max(len(per_query), 1), 4)
                figures["fitted_on_other_half"] = chosen.describe()
                if with_kg is None:
                    figures["tuned_with_kg"] = None
                figures["fitted_with_kg_on_other_half"] = with_kg.describe() if with_kg else None
                figures["objective_on_fitting_half"] = round(fitted_score, 4)
                per_set.setdefault(name, {})["AB"[score_on]] = figures
        return per_set, held_out

    per_set, held_out = cross_validate([halves(p.queries) for p in prepared])
    report["cross_validated"] = per_set
    report["paired"] = {name: paired(by) for name, by in held_out.items()}
    if repeats > 1:
        # The same cross-validation over other random halvings: how much the
        # differences move with the split and the models fitted on it.
        means: dict[str, dict[str, list[float]]] = {}
        for r in tqdm(range(repeats), desc="splits", unit="split", disable=not progress):
            if r:
                rng = random.Random(r)
                _, held_out = cross_validate([random_halves(p.queries, rng) for p in prepared])
            for name, by in held_out.items():
                for pair, mean in mean_differences(by).items():
                    means.setdefault(name, {}).setdefault(pair, []).append(mean)
        report["repeated"] = {
            name: {
                pair: {
                    "splits": len(v),
                    "mean": round(float(np.mean(v)), 4),
                    "low": round(min(v), 4),
                    "high": round(max(v), 4),
                    "positive": sum(1 for x in v if x > 0),
                }
                for pair, v in by.items()
            }
            for name, by in means.items()
        }
    everything = [list(p.queries) for p in prepared]
    final = ship(everything)
    final_score = objective(prepared, everything, final)
    # Sets no choice or fit saw: every family fitted on all the tuning queries.
    report["unseen"] = {}
    if unseen:
        fitted_all = {}
        for family, fit_family in families.items():
            with contextlib.suppress(ValueError):
                fitted_all[family] = fit_family(everything)
        for name, lists, qrels in unseen:
            p = prepare(lists, qrels)
            report["unseen"][name] = {  # type: ignore[index]
                family: round(ndcg10(p, settings, list(p.queries)), 4)
                for family, settings in fitted_all.items()
            }
    report["fitted_on_all"] = {
        "settings": final.describe(),
        "family": chosen_family,
        "ndcg@10_on_its_own_queries": round(final_score, 4),
    }
    final = dataclasses.replace(
        final, fitted_on=f"attest eval tune-fusion on {', '.join(names)} (all judged queries)"
    )
    return final, report
