"""``attest eval judge``: score labelled pairs with the reader (or MiniLM cosine).

Input, one JSON object per line::

    {"id": "p1", "task": "answer", "question": "...", "sentence": "...", "label": 1, "group": "q1"}
    {"id": "p2", "task": "support", "source": "...", "sentence": "...", "label": 0}

``answer`` pairs read the question with the sentence, ``support`` pairs the
source with the sentence; ``group`` (optional) gathers the candidates of one
question or claim. Metrics, per task:

* AUROC over pairs (Mann–Whitney, ties counted one half);
* MAP, MRR and P@1 over the groups that hold both a positive and a negative
  (a group with only one kind ranks nothing), ties broken against the
  positive so that a constant scorer earns no credit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attest.evaluation.ir import json_objects


class JudgePairsError(ValueError):
    """A pairs file line that cannot be scored, named by file and line."""


@dataclass(frozen=True, slots=True)
class JudgePair:
    id: str
    task: str
    first: str
    sentence: str
    label: int
    group: str | None


def read_pairs(path: Path) -> list[JudgePair]:
    """Every pair of ``path``; the first fault stops the read, named by line."""
    out: list[JudgePair] = []
    ids: set[str] = set()
    for number, row in json_objects(path, JudgePairsError, missing="no such file"):
        where = f"{path}:{number}"
        pid, task = row.get("id"), row.get("task")
        if isinstance(pid, bool) or not isinstance(pid, str | int) or str(pid) == "":
            raise JudgePairsError(f"{where}: needs an 'id'")
        if str(pid) in ids:
            raise JudgePairsError(f"{where}: id {pid!r} given twice")
        ids.add(str(pid))
        if task not in ("answer", "support"):
            raise JudgePairsError(f'{where}: \'task\' must be "answer" or "support", got {task!r}')
        key = "question" if task == "answer" else "source"
        first, sentence = row.get(key), row.get("sentence")
        if not isinstance(first, str) or not first.strip():
            raise JudgePairsError(f"{where}: a {task} pair needs text in {key!r}")
        if not isinstance(sentence, str) or not sentence.strip():
            raise JudgePairsError(f"{where}: needs text in 'sentence'")
        label = row.get("label")
        if type(label) is not int or label not in (0, 1):
            raise JudgePairsError(f"{where}: 'label' must be 0 or 1, got {label!r}")
        group = row.get("group")
        out.append(
            JudgePair(
                str(pid),
                task,
                first,
                sentence,
                int(label),
                None if group is None else str(group),
            )
        )
    if not out:
        raise JudgePairsError(f"{path}: no pairs")
    return out


def auroc(labels: Sequence[int], scores: Sequence[float]) -> float:
    """P(a positive scores above a negative), ties one half; NaN without both kinds."""
    y = np.asarray(labels)
    s = np.asarray(scores, dtype=np.float64)
    pos, neg = s[y == 1], s[y == 0]
    if not len(pos) or not len(neg):
        return math.nan
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    values = np.concatenate([pos, neg])[order]
    ranks = np.empty(len(values))
    i = 0
    while i < len(values):  # average ranks over ties
        j = i
        while j + 1 < len(values) and values[j + 1] == values[i]:
            j += 1
        ranks[i : j + 1] = (i + j) / 2 + 1
        i = j + 1
    full = np.empty(len(values))
    full[order] = ranks
    u = full[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2
    return float(u / (len(pos) * len(neg)))


def ranking_metrics(
    labels: Sequence[int], scores: Sequence[float], groups: Sequence[str | None]
) -> dict[str, float]:
    """AUROC over pairs; MAP, MRR, P@1 over groups with a positive and a negative."""
    out: dict[str, float] = {"pairs": float(len(labels)), "auroc": auroc(labels, scores)}
    by: dict[str, list[tuple[float, int]]] = {}
    for y, s, g in zip(labels, scores, groups, strict=True):
        if g is not None:
            by.setdefault(g, []).append((float(s), int(y)))
    aps, rrs, p1s = [], [], []
    for items in by.values():
        if not any(y for _, y in items) or all(y for _, y in items):
            continue
        # Highest score first; among ties the negatives first (no credit for a tie).
        ranked = sorted(items, key=lambda t: (-t[0], t[1]))
        hits, precisions, first = 0, [], 0
        for rank, (_, y) in enumerate(ranked, 1):
            if y:
                hits += 1
                precisions.append(hits / rank)
                first = first or rank
        aps.append(sum(precisions) / hits)
        rrs.append(1.0 / first)
        p1s.append(float(ranked[0][1]))
    out["groups"] = float(len(aps))
    if aps:
        out["map"], out["mrr"], out["p_at_1"] = (float(np.mean(v)) for v in (aps, rrs, p1s))
    return out
