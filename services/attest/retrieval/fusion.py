"""Fusion of ranked lists from several retrievers (BM25, dense, KG).

Three methods, over whatever lists are given, each list weighted by its
retriever's weight:

* reciprocal rank fusion (Cormack et al., 2009): ``sum_i w_i / (k + rank_i)``
  with k = 60 by default, which needs no score calibration;
* min-max score fusion (``weighted``): each list's scores scaled to [0, 1] by
  its own minimum and maximum, then ``sum_i w_i * score_i``;
* distribution-based score fusion (``dbsf``): each list's scores scaled by
  its own mean and standard deviation, ``(s - (mu - 3 sigma)) / (6 sigma)``
  clipped to [0, 1], then summed with weights (as Qdrant's DBSF): a list's
  spread, not its two extremes, sets the scale.

* a learned linear model (``linear``): per retriever, three features of a
  key, its reciprocal rank ``k / (k + rank)``, its DBSF-scaled score and 1 for
  being found at all, each with a weight fitted by logistic regression on
  judged queries (``attest eval tune-fusion``); the weights live in
  ``features`` (retriever -> feature -> weight), and ``weights`` is unused.

A key missing from a list contributes 0. A retriever named in ``rescore``
only adds to keys that another list found: it re-scores the candidates of
the others and never brings its own (the knowledge-graph signal used as a
boost over BM25 + dense, for example).

``FusionSettings`` holds a method with its weights; the services load theirs
from a JSON file (the answer service's ``answer/fusion.json`` unless
configured), written by ``attest eval tune-fusion`` from a development set.

This module sits below every service (it imports nothing of Attest), so the
answer pipeline, generate's re-search and semantic's KG fusion share it
without importing each other.

Keys are opaque hashables: document ids, or (document id, passage) pairs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

K = TypeVar("K", bound=Hashable)

Method = Literal["rrf", "weighted", "dbsf", "linear"]
METHODS: tuple[Method, ...] = ("rrf", "weighted", "dbsf", "linear")
# The per-retriever features of the linear method.
FEATURES = ("rank", "score", "found")
RRF_K = 60
# The shipped settings are the answer service's (its ATTEST_ANSWER_FUSION_SETTINGS
# overrides them); only the file's place is known here, nothing of the service.
DEFAULT_SETTINGS_PATH = Path(__file__).parents[1] / "answer" / "fusion.json"
# The retrievers a settings file may name.
RETRIEVER_NAMES = ("bm25", "dense", "kg", "kg_enhanced", "knowledge")
# The retrievers ``attest eval tune-fusion`` fits: a linear model without
# features for one of them gave it no weight. Any other retriever (the
# knowledge retriever) was never part of a fit: without features of its own
# it takes the mean of the fitted retrievers' features (see ``features_of``).
FITTED_RETRIEVERS = ("bm25", "dense", "kg", "kg_enhanced")
# Larger weights only overflow: scores are sums of weight x score in [0, 1].
MAX_WEIGHT = 1e6


@dataclass(frozen=True)
class Ranked:
    """One retriever's result: keys best first, with their raw scores."""

    name: str
    items: Sequence[tuple[Hashable, float]]
    weight: float = 1.0


class FusionSettingsError(ValueError):
    """A fusion settings file that cannot be used."""


@dataclass(frozen=True)
class FusionSettings:
    """A fusion method with a weight per retriever name.

    A retriever not in ``weights`` gets ``default_weight``; one in ``rescore``
    re-scores the others' candidates instead of adding its own.
    """

    method: Method = "rrf"
    weights: Mapping[str, float] = field(default_factory=dict)
    default_weight: float = 1.0
    rrf_k: int = RRF_K
    rescore: tuple[str, ...] = ()
    features: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    fitted_on: str = ""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise FusionSettingsError(f"unknown fusion method {self.method!r}; one of {METHODS}")
        for name, w in {**self.weights, "default_weight": self.default_weight}.items():
            if not (_number(w) and 0 <= w <= MAX_WEIGHT):
                raise FusionSettingsError(
                    f"weight of {name!r} must be a number in [0, {MAX_WEIGHT:g}]"
                )
        if not (isinstance(self.rrf_k, int) and not isinstance(self.rrf_k, bool)):
            raise FusionSettingsError("rrf_k must be an integer")
        if not 0 <= self.rrf_k <= 1_000_000:
            raise FusionSettingsError("rrf_k must be between 0 and 1000000")
        if not isinstance(self.rescore, tuple) or not all(isinstance(r, str) for r in self.rescore):
            raise FusionSettingsError("rescore must be a list of retriever names")
        if not isinstance(self.features, Mapping):
            raise FusionSettingsError(
                "features must be an object of retriever -> feature -> weight"
            )
        for name, by_feature in self.features.items():
            if not isinstance(by_feature, Mapping) or set(by_feature) - set(FEATURES):
                raise FusionSettingsError(
                    f"features of {name!r} must map some of {FEATURES} to weights"
                )
            for feature, w in by_feature.items():
                if not (_number(w) and abs(w) <= MAX_WEIGHT):
                    raise FusionSettingsError(
                        f"{name}.{feature} must be a number in [-{MAX_WEIGHT:g}, {MAX_WEIGHT:g}]"
                    )
        if self.method == "linear" and not self.features:
            raise FusionSettingsError("the linear method needs fitted features")

    def features_of(self, name: str) -> Mapping[str, float]:
        """A linear model's feature weights of one retriever.

        A retriever the fit considered (``FITTED_RETRIEVERS``) and left out
        has none. One no fit considered and the file does not name (the
        knowledge retriever) takes the mean, per feature, of the retrievers
        with features: it counts like a typical fitted retriever rather than
        not at all, until a fit over judged queries gives it weights.
        """
        if name in self.features or name in FITTED_RETRIEVERS:
            return self.features.get(name, {})
        fitted = [f for f in self.features.values() if any(f.values())]
        if not fitted:
            return {}
        return {
            feature: sum(f.get(feature, 0.0) for f in fitted) / len(fitted) for feature in FEATURES
        }

    def weight(self, name: str) -> float:
        """How much a retriever counts; a linear model counts those it has features for.

        As with a linear model's features (``features_of``), a retriever no fit
        considered (not in ``FITTED_RETRIEVERS``: the knowledge retriever) that the
        settings do not name, under settings that give unnamed retrievers no weight
        (a fitted file's ``default_weight`` 0), counts as the mean of the fitted
        retrievers that fuse with a weight: like a typical one, not at all."""
        if self.method == "linear":
            return 1.0 if any(self.features_of(name).values()) else 0.0
        if name in self.weights or name in FITTED_RETRIEVERS or self.default_weight > 0:
            return float(self.weights.get(name, self.default_weight))
        fitted = [
            float(w)
            for n, w in self.weights.items()
            if n in FITTED_RETRIEVERS and n not in self.rescore and w > 0
        ]
        return sum(fitted) / len(fitted) if fitted else float(self.default_weight)

    def describe(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "weights": dict(self.weights),
            "default_weight": self.default_weight,
            "rrf_k": self.rrf_k,
            "rescore": list(self.rescore),
            **(
                {"features": {k: dict(v) for k, v in self.features.items()}}
                if self.features
                else {}
            ),
            "fitted_on": self.fitted_on,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> FusionSettings:
        unknown = set(raw) - {
            "method",
            "weights",
            "default_weight",
            "rrf_k",
            "rescore",
            "features",
            "fitted_on",
            # What the fitting command measured, kept with the settings (not read).
            "cross_validated",
            "paired",
            "repeated",
            "chosen_family",
            "leave_one_set_out",
            "nested_leave_one_set_out",
            "unseen",
        }
        if unknown:
            raise FusionSettingsError(f"unknown fusion settings keys {sorted(unknown)}")
        weights = raw.get("weights", {})
        if not isinstance(weights, Mapping):
            raise FusionSettingsError("weights must be an object of retriever name -> weight")
        rescore = raw.get("rescore", [])
        if not isinstance(rescore, list):
            raise FusionSettingsError("rescore must be a list of retriever names")
        features = raw.get("features", {})
        if not isinstance(features, Mapping):
            raise FusionSettingsError(
                "features must be an object of retriever -> feature -> weight"
            )
        settings = cls(
            method=cast(Method, raw.get("method", "rrf")),
            weights={str(k): v for k, v in weights.items()},
            default_weight=raw.get("default_weight", 1.0),
            rrf_k=raw.get("rrf_k", RRF_K),
            rescore=tuple(rescore),
            features=features,
            fitted_on=str(raw.get("fitted_on", "")),
        )
        # A file configures the services' retrievers: only their names, and
        # at least one of them must count.
        named = {*settings.weights, *settings.features, *settings.rescore}
        if named - set(RETRIEVER_NAMES):
            raise FusionSettingsError(
                f"unknown retrievers {sorted(named - set(RETRIEVER_NAMES))}; "
                f"one of {RETRIEVER_NAMES}"
            )
        if not any(settings.weight(name) > 0 for name in RETRIEVER_NAMES):
            raise FusionSettingsError("every retriever weighs 0: nothing would be ranked")
        return settings


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def load_fusion_settings(path: Path | None = None) -> FusionSettings:
    """The settings in ``path`` (default: the shipped ``fusion.json``)."""
    path = path or DEFAULT_SETTINGS_PATH
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise FusionSettingsError(f"{path}: {exc}") from exc
    if not isinstance(raw, Mapping):
        raise FusionSettingsError(f"{path}: expected a JSON object")
    try:
        return FusionSettings.from_dict(raw)
    except FusionSettingsError as exc:
        raise FusionSettingsError(f"{path}: {exc}") from exc


def _deduplicated(items: Sequence[tuple[Hashable, float]]) -> dict[Hashable, float]:
    """Each key's best score, in first-seen (rank) order."""
    best: dict[Hashable, float] = {}
    for key, score in items:
        if key not in best or score > best[key]:
            best[key] = score
    return best


def _rrf_scores(ranked: Ranked, k: int) -> dict[Hashable, float]:
    out: dict[Hashable, float] = {}
    for key, _ in ranked.items:
        if key not in out:
            out[key] = 1.0 / (k + len(out) + 1)
    return out


def _minmax_scores(ranked: Ranked) -> dict[Hashable, float]:
    best = _deduplicated(ranked.items)
    if not best:
        return {}
    lo, hi = min(best.values()), max(best.values())
    span = hi - lo
    return {key: (s - lo) / span if span > 0 else 1.0 for key, s in best.items()}


def _distribution_scores(ranked: Ranked) -> dict[Hashable, float]:
    best = _deduplicated(ranked.items)
    if not best:
        return {}
    values = list(best.values())
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    if sd == 0:
        return dict.fromkeys(best, 1.0)
    lo = mean - 3 * sd
    return {key: min(1.0, max(0.0, (s - lo) / (6 * sd))) for key, s in best.items()}


def _linear_scores(ranked: Ranked, settings: FusionSettings) -> dict[Hashable, float]:
    """The linear model's part for one list: its features of each key, weighted."""
    w = settings.features_of(ranked.name)
    rank = _rrf_scores(ranked, settings.rrf_k)
    score = _distribution_scores(ranked)
    k = settings.rrf_k
    return {
        key: w.get("rank", 0.0) * k * rank[key]
        + w.get("score", 0.0) * score[key]
        + w.get("found", 0.0)
        for key in rank
    }


def _combine(
    per_list: Sequence[tuple[Ranked, dict[Hashable, float]]],
    weight_of: dict[str, float],
    rescore: frozenset[str],
    top_k: int | None,
) -> list[tuple[Hashable, float]]:
    scores: dict[Hashable, float] = {}
    for ranked, normalised in per_list:
        if ranked.name in rescore:
            continue
        w = weight_of[ranked.name]
        for key, s in normalised.items():
            scores[key] = scores.get(key, 0.0) + w * s
    for ranked, normalised in per_list:
        if ranked.name not in rescore:
            continue
        w = weight_of[ranked.name]
        for key, s in normalised.items():
            if key in scores:
                scores[key] += w * s
    return _top(scores, top_k)


def reciprocal_rank_fusion(
    lists: Sequence[Ranked], *, k: int = RRF_K, top_k: int | None = None
) -> list[tuple[Hashable, float]]:
    return _combine(
        [(r, _rrf_scores(r, k)) for r in lists],
        {r.name: r.weight for r in lists},
        frozenset(),
        top_k,
    )


def weighted_score_fusion(
    lists: Sequence[Ranked], *, top_k: int | None = None
) -> list[tuple[Hashable, float]]:
    return _combine(
        [(r, _minmax_scores(r)) for r in lists],
        {r.name: r.weight for r in lists},
        frozenset(),
        top_k,
    )


def fuse(
    lists: Sequence[Ranked], *, method: Method = "rrf", top_k: int | None = None
) -> list[tuple[Hashable, float]]:
    """Fuse with each list's own weight (``Ranked.weight``)."""
    weights = {r.name: r.weight for r in lists}
    return fuse_with(
        lists, FusionSettings(method=method, weights=weights, default_weight=1.0), top_k=top_k
    )


def fuse_with(
    lists: Sequence[Ranked], settings: FusionSettings, *, top_k: int | None = None
) -> list[tuple[Hashable, float]]:
    """Fuse with the weights, method and re-scoring of ``settings``.

    A list from a re-scoring retriever alone (nothing else answered) is used
    as it is, so losing BM25 and dense never empties an answer.
    """
    # An empty list (a retriever that found nothing) takes no part, so a
    # re-scoring list whose partners found nothing is used on its own.
    lists = [r for r in lists if r.items]
    if any(settings.weight(r.name) > 0 for r in lists):
        # A retriever weighted 0 takes no part (its keys are not candidates).
        lists = [r for r in lists if settings.weight(r.name) > 0]
    rescore = frozenset(settings.rescore)
    if lists and all(r.name in rescore for r in lists):
        rescore = frozenset()
    if settings.method == "rrf":
        per = [(r, _rrf_scores(r, settings.rrf_k)) for r in lists]
    elif settings.method == "weighted":
        per = [(r, _minmax_scores(r)) for r in lists]
    elif settings.method == "dbsf":
        per = [(r, _distribution_scores(r)) for r in lists]
    else:
        per = [(r, _linear_scores(r, settings)) for r in lists]
    return _combine(per, {r.name: settings.weight(r.name) for r in lists}, rescore, top_k)


def contributions(
    fused: Sequence[tuple[Hashable, float]], lists: Sequence[Ranked]
) -> dict[Hashable, Mapping[str, float]]:
    """The raw score each retriever gave each fused key (for explanations)."""
    raw = {r.name: dict(r.items) for r in lists}
    return {key: {n: s[key] for n, s in raw.items() if key in s} for key, _ in fused}


def _top(scores: dict[Hashable, float], top_k: int | None) -> list[tuple[Hashable, float]]:
    # Ties keep first-seen order, so fusion is deterministic.
    ordered = sorted(scores.items(), key=lambda kv: -kv[1])
    return ordered if top_k is None else ordered[:top_k]
