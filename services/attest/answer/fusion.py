"""Fusion of ranked lists from several retrievers (BM25, dense, KG).

Two methods, both over whatever lists are given, each optionally weighted:

* reciprocal rank fusion (Cormack et al., 2009): ``sum_i w_i / (k + rank_i)``
  with k = 60, which needs no score calibration;
* weighted score fusion: each list's scores min-max normalised to [0, 1],
  then ``sum_i w_i * score_i``; a key missing from a list contributes 0.

Keys are opaque hashables: document ids, or (document id, passage) pairs.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

K = TypeVar("K", bound=Hashable)

Method = Literal["rrf", "weighted"]
RRF_K = 60


@dataclass(frozen=True)
class Ranked:
    """One retriever's result: keys best first, with their raw scores."""

    name: str
    items: Sequence[tuple[Hashable, float]]
    weight: float = 1.0


def reciprocal_rank_fusion(
    lists: Sequence[Ranked], *, k: int = RRF_K, top_k: int | None = None
) -> list[tuple[Hashable, float]]:
    scores: dict[Hashable, float] = {}
    for ranked in lists:
        seen: set[Hashable] = set()
        rank = 0
        for key, _ in ranked.items:
            if key in seen:
                continue
            seen.add(key)
            rank += 1
            scores[key] = scores.get(key, 0.0) + ranked.weight / (k + rank)
    return _top(scores, top_k)


def weighted_score_fusion(
    lists: Sequence[Ranked], *, top_k: int | None = None
) -> list[tuple[Hashable, float]]:
    scores: dict[Hashable, float] = {}
    for ranked in lists:
        if not ranked.items:
            continue
        best: dict[Hashable, float] = {}
        for key, score in ranked.items:
            best[key] = max(score, best.get(key, float("-inf")))
        lo, hi = min(best.values()), max(best.values())
        span = hi - lo
        for key, score in best.items():
            norm = (score - lo) / span if span > 0 else 1.0
            scores[key] = scores.get(key, 0.0) + ranked.weight * norm
    return _top(scores, top_k)


def fuse(
    lists: Sequence[Ranked], *, method: Method = "rrf", top_k: int | None = None
) -> list[tuple[Hashable, float]]:
    if method == "rrf":
        return reciprocal_rank_fusion(lists, top_k=top_k)
    return weighted_score_fusion(lists, top_k=top_k)


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
