"""Retrieval evaluation on BEIR-format data sets.

A data set folder holds ``corpus.jsonl`` (``_id``, ``title``, ``text``),
``queries.jsonl`` (``_id``, ``text``) and ``qrels/test.tsv`` (header
``query-id corpus-id score``). Metrics come from trec_eval (pytrec_eval),
averaged over the queries that have judgments.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytrec_eval


class DatasetError(ValueError):
    """The folder is not a readable BEIR data set."""


@dataclass(frozen=True)
class CorpusDoc:
    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Dataset:
    root: Path
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]

    @property
    def name(self) -> str:
        return self.root.name

    @property
    def corpus_path(self) -> Path:
        return self.root / "corpus.jsonl"

    def corpus_size(self) -> int:
        with self.corpus_path.open("rb") as f:
            return sum(1 for line in f if line.strip())

    def corpus(self) -> Iterator[CorpusDoc]:
        with self.corpus_path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    raw = json.loads(line)
                    yield CorpusDoc(str(raw["_id"]), raw.get("title") or "", raw.get("text") or "")
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise DatasetError(f"{self.corpus_path}:{n}: {exc}") from exc

    def judged_queries(self) -> dict[str, str]:
        return {qid: text for qid, text in self.queries.items() if qid in self.qrels}


def load_dataset(root: Path, split: str = "test") -> Dataset:
    corpus = root / "corpus.jsonl"
    queries_path = root / "queries.jsonl"
    qrels_path = root / "qrels" / f"{split}.tsv"
    for path in (corpus, queries_path, qrels_path):
        if not path.is_file():
            raise DatasetError(f"{path} is missing; expected a BEIR folder")
    queries: dict[str, str] = {}
    with queries_path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    raw = json.loads(line)
                    queries[str(raw["_id"])] = str(raw["text"])
                except (json.JSONDecodeError, KeyError, TypeError) as exc:
                    raise DatasetError(f"{queries_path}:{n}: {exc}") from exc
    qrels: dict[str, dict[str, int]] = {}
    with qrels_path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            parts = line.rstrip("\n").split("\t")
            if n == 1 and parts[0] == "query-id":
                continue
            if len(parts) != 3:
                raise DatasetError(f"{qrels_path}:{n}: expected 3 tab-separated columns")
            try:
                qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
            except ValueError as exc:
                raise DatasetError(f"{qrels_path}:{n}: {exc}") from exc
    return Dataset(root=root, queries=queries, qrels=qrels)


Run = dict[str, dict[str, float]]


def evaluate(qrels: dict[str, dict[str, int]], run: Run) -> dict[str, float]:
    """nDCG@10, MRR@10 and Recall@100, averaged over judged queries.

    A judged query missing from the run counts as zero for every metric.
    """
    judged = [q for q, rels in qrels.items() if any(v > 0 for v in rels.values())]
    if not judged:
        raise DatasetError("no query has a positive judgment")
    full = {q: run.get(q, {}) for q in judged}
    top10 = {q: dict(sorted(d.items(), key=lambda kv: -kv[1])[:10]) for q, d in full.items()}
    main = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"})
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"})
    per_query = main.evaluate({q: d or {"\x00none": 0.0} for q, d in full.items()})
    per_query_rr = rr.evaluate({q: d or {"\x00none": 0.0} for q, d in top10.items()})
    n = len(judged)
    return {
        "ndcg@10": sum(per_query[q]["ndcg_cut_10"] for q in judged) / n,
        "mrr@10": sum(per_query_rr[q]["recip_rank"] for q in judged) / n,
        "recall@100": sum(per_query[q]["recall_100"] for q in judged) / n,
        "queries": float(n),
    }


def ndcg10_per_query(qrels: dict[str, dict[str, int]], run: Run) -> dict[str, float]:
    """nDCG@10 of each judged query (as ``evaluate`` averages it): what a paired
    comparison of two runs resamples."""
    judged = [q for q, rels in qrels.items() if any(v > 0 for v in rels.values())]
    full = {q: run.get(q) or {"\x00none": 0.0} for q in judged}
    per_query = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10"}).evaluate(full)
    return {q: float(per_query[q]["ndcg_cut_10"]) for q in judged}


def cutoff_metrics(
    qrels: dict[str, dict[str, int]],
    run: Run,
    *,
    mrr_at: int = 10,
    recall_at: tuple[int, ...] = (),
    ndcg_at: tuple[int, ...] = (),
) -> dict[str, float]:
    """MRR@k, Recall@k and nDCG@k averaged over queries with a positive judgment.

    Ties in a run are broken by id, the same way pytrec_eval does, and a judged
    query missing from the run counts as zero.
    """
    judged = [q for q, rels in qrels.items() if any(v > 0 for v in rels.values())]
    if not judged:
        raise DatasetError("no query has a positive judgment")
    full = {q: run.get(q) or {"\x00none": 0.0} for q in judged}
    top = {q: dict(sorted(d.items(), key=lambda kv: -kv[1])[:mrr_at]) for q, d in full.items()}
    out: dict[str, float] = {}
    rr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top)
    out[f"mrr@{mrr_at}"] = sum(rr[q]["recip_rank"] for q in judged) / len(judged)
    measures = {f"recall.{','.join(map(str, recall_at))}"} if recall_at else set()
    if ndcg_at:
        measures.add(f"ndcg_cut.{','.join(map(str, ndcg_at))}")
    if measures:
        per_query = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(full)
        for k in recall_at:
            out[f"recall@{k}"] = sum(per_query[q][f"recall_{k}"] for q in judged) / len(judged)
        for k in ndcg_at:
            out[f"ndcg@{k}"] = sum(per_query[q][f"ndcg_cut_{k}"] for q in judged) / len(judged)
    out["queries"] = float(len(judged))
    return out
