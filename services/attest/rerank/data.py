"""PFiD examples from a BEIR folder or a MIRACL-style passage collection.

* BEIR (``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``): each
  document is split into passages the way ingestion splits them
  (:func:`attest.ingest.passages.split_passages`); qrels name documents, so
  every passage of a relevant document is labelled relevant, unless the qrels
  name passages (``<doc id>#<n>``), which then label passages one by one.
* MIRACL-style collections: every corpus id is ``<doc id>#<n>``; passages are
  grouped back into their documents in order, and qrels are passage-level (a
  document is relevant when any of its passages is).

Candidates come from BM25 (the embedded tantivy index of the lexical service)
over documents. Training examples are the judged relevant documents plus the
BM25 candidates that are not relevant (hard negatives); evaluation examples
are exactly the BM25 top-k, so a relevant document BM25 missed counts as a
miss, as in the paper. Queries are split into train and held-out sets by a
hash of their id, so the split is the same on every machine.
"""

from __future__ import annotations

import asyncio
import hashlib
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tqdm import tqdm

from attest.evaluation.ir import Dataset
from attest.ingest.passages import split_passages
from attest.rerank.training import Example

Split = Literal["train", "heldout", "all"]


@dataclass(frozen=True, slots=True)
class SourceDoc:
    id: str
    title: str
    passages: tuple[str, ...]


def query_split(query_id: str, heldout_percent: int = 20) -> Literal["train", "heldout"]:
    digest = hashlib.sha256(query_id.encode()).digest()
    return "heldout" if int.from_bytes(digest[:4], "big") % 100 < heldout_percent else "train"


def load_documents(
    data: Dataset, *, max_tokens: int = 200, max_passages: int = 8
) -> tuple[dict[str, SourceDoc], bool]:
    """Documents with at most ``max_passages`` passages; and whether the corpus is a
    passage collection (MIRACL style)."""
    raw = list(data.corpus())
    passage_collection = bool(raw) and all("#" in d.id for d in raw)
    docs: dict[str, SourceDoc] = {}
    if passage_collection:
        grouped: dict[str, list[tuple[int, str, str]]] = {}
        for d in raw:
            doc_id, _, n = d.id.rpartition("#")
            grouped.setdefault(doc_id, []).append((int(n) if n.isdigit() else 0, d.title, d.text))
        for doc_id, parts in grouped.items():
            parts.sort()
            texts = tuple(t for _, _, t in parts if t.strip())[:max_passages]
            if texts:
                docs[doc_id] = SourceDoc(doc_id, parts[0][1], texts)
        return docs, True
    for d in raw:
        spans = split_passages(d.text, max_tokens=max_tokens)
        texts = tuple(s.text for s in spans[:max_passages])
        if texts:
            docs[d.id] = SourceDoc(d.id, d.title, texts)
    return docs, False


async def bm25_candidates(
    docs: dict[str, SourceDoc], queries: dict[str, str], k: int, progress: bool
) -> dict[str, list[str]]:
    """Top-k document ids per query from an embedded tantivy index."""
    from attest.lexical.backends import create_backend
    from attest.lexical.models import DocumentIn, Level, SearchQuery
    from attest.lexical.settings import LexicalSettings

    with tempfile.TemporaryDirectory(prefix="attest-pfid-bm25-") as tmp:
        settings = LexicalSettings(backend="tantivy", data_dir=Path(tmp), index_name="pfid")
        backend = create_backend(settings)
        await backend.warm_up()
        try:
            items = [
                DocumentIn(id=d.id, title=d.title, body=" ".join(d.passages)) for d in docs.values()
            ]
            for s in range(0, len(items), 1000):
                await backend.index("default", items[s : s + 1000], refresh=False)
            await backend.index("default", [], refresh=True)
            out: dict[str, list[str]] = {}
            for qid, text in tqdm(queries.items(), desc="bm25", unit="query", disable=not progress):
                hits = await backend.search(
                    "default", SearchQuery(text=text, top_k=k, level=Level.DOCUMENT)
                )
                out[qid] = [h.doc_id for h in hits]
            return out
        finally:
            await backend.close()


def _labels(
    doc: SourceDoc, rels: dict[str, int], passage_collection: bool
) -> tuple[int, tuple[int, ...]]:
    passage_level = passage_collection or any(f"{doc.id}#" in r for r in rels)
    if passage_level:
        plabels = tuple(int(rels.get(f"{doc.id}#{j}", 0) > 0) for j in range(len(doc.passages)))
        return int(any(plabels)), plabels
    label = int(rels.get(doc.id, 0) > 0)
    return label, (label,) * len(doc.passages)


def build_examples(
    data: Dataset,
    *,
    split: Split,
    candidates: int,
    negatives: int | None = None,
    max_queries: int | None = None,
    max_tokens: int = 200,
    max_passages: int = 8,
    heldout_percent: int = 20,
    progress: bool = True,
) -> list[Example]:
    """Examples of the queries in ``split``: for training (``negatives`` set)
    the relevant documents plus up to ``negatives`` BM25 hard negatives; for
    evaluation (``negatives`` None) the BM25 top ``candidates``."""
    docs, passage_collection = load_documents(
        data, max_tokens=max_tokens, max_passages=max_passages
    )
    queries = {
        qid: text
        for qid, text in sorted(data.judged_queries().items())
        if split == "all" or query_split(qid, heldout_percent) == split
    }
    if max_queries is not None:
        queries = dict(list(queries.items())[:max_queries])
    ranked = asyncio.run(bm25_candidates(docs, queries, candidates, progress))
    examples: list[Example] = []
    for qid, text in queries.items():
        rels = data.qrels.get(qid, {})
        if negatives is None:
            chosen: Sequence[str] = ranked.get(qid, [])
        else:
            relevant_docs = {
                r.rpartition("#")[0] if "#" in r and r not in docs else r
                for r, v in rels.items()
                if v > 0
            }
            positives = [d for d in sorted(relevant_docs) if d in docs]
            negs = [d for d in ranked.get(qid, []) if d not in relevant_docs][:negatives]
            chosen = positives + negs
        for doc_id in chosen:
            doc = docs[doc_id]
            label, plabels = _labels(doc, rels, passage_collection)
            examples.append(Example(qid, text, doc.id, doc.title, doc.passages, label, plabels))
    return examples
