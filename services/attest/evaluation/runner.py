"""Drive a retrieval evaluation through the gRPC APIs of the services.

Retrievers: ``bm25`` (lexical service), ``dense``, ``kg`` and ``kg_enhanced``
(semantic service), and the fusions ``hybrid`` (BM25 + dense) and
``hybrid_kg`` (BM25 + dense + KG enhanced), both reciprocal rank fusion with
k = 60 and equal weights: nothing is tuned to the evaluation sets. Services
run in this process on port 0 unless addresses are given.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tqdm import tqdm

from attest.answer.fusion import Ranked, reciprocal_rank_fusion
from attest.common.v1 import common_pb2
from attest.core.channels import create_channel
from attest.core.server import Servicer, running
from attest.core.settings import ServerSettings
from attest.evaluation.ir import CorpusDoc, Dataset, Run, evaluate
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc

LEXICAL = "attest.lexical.v1.LexicalService"
SEMANTIC = "attest.semantic.v1.SemanticService"
BackendName = Literal["tantivy", "opensearch", "elasticsearch"]
RETRIEVERS = ("bm25", "dense", "kg", "kg_enhanced", "hybrid", "hybrid_kg")
# Which signals each retriever fuses.
SIGNALS: dict[str, tuple[str, ...]] = {
    "bm25": ("bm25",),
    "dense": ("dense",),
    "kg": ("kg",),
    "kg_enhanced": ("kg_enhanced",),
    "hybrid": ("bm25", "dense"),
    "hybrid_kg": ("bm25", "dense", "kg_enhanced"),
}


@dataclass(frozen=True)
class Targets:
    lexical: str | None
    semantic: str | None


@contextlib.asynccontextmanager
async def service_targets(
    *,
    need_lexical: bool,
    need_semantic: bool,
    backend: BackendName,
    lexical_address: str | None,
    semantic_address: str | None,
    data_dir: Path,
    index_name: str,
) -> AsyncIterator[Targets]:
    """Addresses of the needed services: the given ones, or ones started here."""
    servicers: list[Servicer] = []
    if need_lexical and not lexical_address:
        from attest.lexical.servicer import LexicalServicer
        from attest.lexical.settings import LexicalSettings

        servicers.append(
            LexicalServicer(
                LexicalSettings(backend=backend, data_dir=data_dir, index_name=index_name)
            )
        )
    if need_semantic and not semantic_address:
        from attest.semantic.servicer import SemanticServicer
        from attest.semantic.settings import SemanticSettings

        servicers.append(
            SemanticServicer(SemanticSettings(data_dir=data_dir, collection_prefix=index_name))
        )
    if not servicers:
        yield Targets(lexical_address, semantic_address)
        return
    settings = ServerSettings(host="127.0.0.1", port=0)
    async with running(servicers, settings, ready_timeout=600) as server:
        local = f"127.0.0.1:{server.port}"
        yield Targets(
            lexical_address or (local if need_lexical else None),
            semantic_address or (local if need_semantic else None),
        )


def _batches(docs: Sequence[CorpusDoc], size: int) -> list[Sequence[CorpusDoc]]:
    return [docs[i : i + size] for i in range(0, len(docs), size)]


async def run_ir_eval(
    data: Dataset,
    *,
    retriever: str = "bm25",
    backend: BackendName = "tantivy",
    address: str | None = None,
    semantic_address: str | None = None,
    data_dir: Path,
    batch_size: int = 200,
    concurrency: int = 8,
    top_k: int = 100,
) -> dict[str, Any]:
    signals = SIGNALS[retriever]
    need_lexical = "bm25" in signals
    need_semantic = any(s != "bm25" for s in signals)
    need_links = any(s.startswith("kg") for s in signals)
    docs = [d for d in data.corpus() if d.title.strip() or d.text.strip()]
    skipped = data.corpus_size() - len(docs)
    index_name = f"attest-eval-{data.name.lower()}"
    timings: dict[str, float] = {}

    async with service_targets(
        need_lexical=need_lexical,
        need_semantic=need_semantic,
        backend=backend,
        lexical_address=address,
        semantic_address=semantic_address,
        data_dir=data_dir,
        index_name=index_name,
    ) as targets:
        channels = []
        lexical = semantic = None
        if targets.lexical:
            ch = create_channel(
                targets.lexical, idempotent=[(LEXICAL, "Search"), (LEXICAL, "Index")]
            )
            channels.append(ch)
            lexical = lexical_pb2_grpc.LexicalServiceStub(ch)
        if targets.semantic:
            ch = create_channel(
                targets.semantic, idempotent=[(SEMANTIC, "Search"), (SEMANTIC, "Index")]
            )
            channels.append(ch)
            semantic = semantic_pb2_grpc.SemanticServiceStub(ch)
        try:
            links: dict[str, list[str]] = {}
            if need_links:
                started = time.perf_counter()
                links = await asyncio.to_thread(_link, docs, batch_size)
                timings["link_seconds"] = time.perf_counter() - started
            started = time.perf_counter()
            with tqdm(total=len(docs), desc="index", unit="doc") as bar:
                for batch in _batches(docs, batch_size):
                    protos = [
                        common_pb2.Document(
                            id=d.id, title=d.title, body=d.text, entity_ids=links.get(d.id, [])
                        )
                        for d in batch
                    ]
                    if lexical is not None:
                        await lexical.Index(
                            lexical_pb2.IndexRequest(documents=protos, refresh=True), timeout=300
                        )
                    if semantic is not None:
                        await semantic.Index(
                            semantic_pb2.IndexRequest(
                                documents=[semantic_pb2.IndexDocument(document=p) for p in protos]
                            ),
                            timeout=600,
                        )
                    bar.update(len(batch))
            timings["index_seconds"] = time.perf_counter() - started

            queries = data.judged_queries()
            run: Run = {}
            gate = asyncio.Semaphore(concurrency)

            async def one(qid: str, text: str) -> None:
                text = text[:4096]
                lists: list[Ranked] = []
                async with gate:
                    if "bm25" in signals and lexical is not None:
                        r = await lexical.Search(
                            lexical_pb2.SearchRequest(query=text, top_k=top_k), timeout=60
                        )
                        lists.append(Ranked("bm25", [(h.doc_id, h.score) for h in r.hits]))
                    for signal, mode, variant in (
                        (
                            "dense",
                            semantic_pb2.SEARCH_MODE_DENSE,
                            semantic_pb2.KG_VARIANT_UNSPECIFIED,
                        ),
                        ("kg", semantic_pb2.SEARCH_MODE_KG, semantic_pb2.KG_VARIANT_PLAIN),
                        (
                            "kg_enhanced",
                            semantic_pb2.SEARCH_MODE_KG,
                            semantic_pb2.KG_VARIANT_ENHANCED,
                        ),
                    ):
                        if signal in signals and semantic is not None:
                            s = await semantic.Search(
                                semantic_pb2.SearchRequest(
                                    query=text, top_k=top_k, mode=mode, kg_variant=variant
                                ),
                                timeout=60,
                            )
                            lists.append(Ranked(signal, [(h.doc_id, h.score) for h in s.hits]))
                if len(lists) == 1:
                    fused = list(lists[0].items)
                else:
                    fused = reciprocal_rank_fusion(lists, top_k=top_k)
                # trec_eval ranks by score: keep the fused order with strictly
                # decreasing pseudo-scores.
                run[qid] = {str(k): float(len(fused) - i) for i, (k, _) in enumerate(fused)}

            started = time.perf_counter()
            tasks = [asyncio.create_task(one(q, t)) for q, t in queries.items()]
            for task in tqdm(asyncio.as_completed(tasks), total=len(tasks), desc="search"):
                await task
            timings["search_seconds"] = time.perf_counter() - started
        finally:
            for ch in channels:
                await ch.close()
    metrics: dict[str, Any] = dict(evaluate(data.qrels, run))
    metrics["empty_documents_skipped"] = skipped
    metrics.update({k: round(v, 3) for k, v in timings.items()})
    return metrics


def _link(docs: Sequence[CorpusDoc], batch_size: int) -> dict[str, list[str]]:
    """Knowledge-graph links of every document, as ingestion would make them."""
    from attest.knowledge.graph import load_graph
    from attest.knowledge.linking import EntityLinker
    from attest.semantic.embedding import Embedder

    linker = EntityLinker(load_graph(), Embedder().encode)
    linker.warm_up()
    out: dict[str, list[str]] = {}
    for batch in tqdm(_batches(docs, batch_size), desc="link", unit="batch"):
        for doc, found in zip(
            batch, linker.link_many([(d.title, d.text) for d in batch]), strict=True
        ):
            out[doc.id] = [link.entity_id for link in found]
    return out
