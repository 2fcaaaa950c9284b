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
from typing import Any

import pytrec_eval


class DatasetError(ValueError):
    """The folder is not a readable BEIR data set."""


@dataclass(frozen=True)
class CorpusDoc:
    id: str
    title: str
    text: str


def text_lines(path: Path, error: type[ValueError] = ValueError) -> Iterator[tuple[int, str]]:
    """The non-blank lines of a UTF-8 text file with their numbers (a leading byte
    order mark dropped); a line that is not UTF-8 raises ``error`` naming it."""
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise error(f"{path}:{n}: not UTF-8 (byte {exc.start + 1} of the line)") from exc
            if n == 1:
                line = line.removeprefix("\ufeff")
            if line.strip():
                yield n, line


def json_objects(
    path: Path, error: type[ValueError] = ValueError, missing: str | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """The JSON objects of a JSONL file with their line numbers (``text_lines``);
    anything unreadable is ``error`` naming the line. ``missing``: the message
    for a path that is not a file, checked before reading."""
    if missing is not None and not path.is_file():
        raise error(f"{path}: {missing}")
    for n, line in text_lines(path, error):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{path}:{n}: not JSON ({exc.msg}, column {exc.colno})") from exc
        if not isinstance(obj, dict):
            raise error(f"{path}:{n}: expected a JSON object")
        yield n, obj


def _objects(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """The JSON objects of a BEIR file, each with an ``_id``."""
    for n, obj in json_objects(path, DatasetError):
        if obj.get("_id") in (None, ""):
            raise DatasetError(f"{path}:{n}: no '_id'")
        yield n, obj


def _text(value: object) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


@dataclass(frozen=True)
class Dataset:
    root: Path
    queries: dict[str, str]
    # Judgments of the queries in ``queries``; see ``unasked`` for the others.
    qrels: dict[str, dict[str, int]]
    # Queries with a positive judgment that queries.jsonl does not hold: they
    # cannot be asked, so they are kept out of ``qrels`` and every figure.
    unasked: tuple[str, ...] = ()
    # Documents that a positive judgment names and corpus.jsonl does not hold
    # (no retriever can find them: they count against recall, as in trec_eval),
    # and how many judgments name them.
    missing_documents: tuple[str, ...] = ()
    judgments_of_missing: int = 0

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
        for _, raw in _objects(self.corpus_path):
            yield CorpusDoc(str(raw["_id"]), _text(raw.get("title")), _text(raw.get("text")))

    def judged_queries(self) -> dict[str, str]:
        return {qid: text for qid, text in self.queries.items() if qid in self.qrels}


def load_dataset(root: Path, split: str = "test") -> Dataset:
    """Reads and checks a BEIR folder: every line of its files readable, no id
    given twice, at least one document."""
    corpus = root / "corpus.jsonl"
    queries_path = root / "queries.jsonl"
    qrels_path = root / "qrels" / f"{split}.tsv"
    for path in (corpus, queries_path, qrels_path):
        if not path.is_file():
            raise DatasetError(f"{path} is missing; expected a BEIR folder")
    documents: dict[str, int] = {}
    for n, raw in _objects(corpus):
        first = documents.setdefault(str(raw["_id"]), n)
        if first != n:
            raise DatasetError(f"{corpus}:{n}: document id {raw['_id']!r} is also on line {first}")
    if not documents:
        raise DatasetError(f"{corpus} holds no documents")
    queries: dict[str, str] = {}
    lines: dict[str, int] = {}
    for n, raw in _objects(queries_path):
        qid = str(raw["_id"])
        if qid in lines:
            raise DatasetError(f"{queries_path}:{n}: query id {qid!r} is also on line {lines[qid]}")
        text = raw.get("text")
        if not isinstance(text, str | int | float) or isinstance(text, bool):
            raise DatasetError(f"{queries_path}:{n}: no 'text'")
        lines[qid] = n
        queries[qid] = str(text)
    qrels: dict[str, dict[str, int]] = {}
    for n, line in text_lines(qrels_path, DatasetError):
        parts = line.rstrip("\r\n").split("\t")
        if n == 1 and parts[0] == "query-id":
            continue
        if len(parts) != 3:
            raise DatasetError(f"{qrels_path}:{n}: expected 3 tab-separated columns")
        try:
            qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
        except ValueError as exc:
            raise DatasetError(f"{qrels_path}:{n}: {exc}") from exc
    unasked = tuple(
        sorted(
            q for q, rels in qrels.items() if q not in queries and any(v > 0 for v in rels.values())
        )
    )
    asked = {q: rels for q, rels in qrels.items() if q in queries}
    missing = [
        d for rels in asked.values() for d, v in rels.items() if v > 0 and d not in documents
    ]
    return Dataset(
        root=root,
        queries=queries,
        qrels=asked,
        unasked=unasked,
        missing_documents=tuple(sorted(set(missing))),
        judgments_of_missing=len(missing),
    )


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
