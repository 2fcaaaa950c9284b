"""Drive an evaluation through the gRPC API of a running or in-process service."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

from tqdm import tqdm

from attest.common.v1 import common_pb2
from attest.core.channels import create_channel
from attest.core.server import running
from attest.core.settings import ServerSettings
from attest.evaluation.ir import Dataset, Run, evaluate
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc

LEXICAL = "attest.lexical.v1.LexicalService"
BackendName = Literal["tantivy", "opensearch", "elasticsearch"]


@contextlib.asynccontextmanager
async def lexical_target(
    backend: BackendName, address: str | None, data_dir: Path, index_name: str
) -> AsyncIterator[str]:
    """The address of a lexical service: the given one, or one started here."""
    if address:
        yield address
        return
    from attest.lexical.servicer import LexicalServicer
    from attest.lexical.settings import LexicalSettings

    settings = LexicalSettings(
        backend=backend,
        data_dir=data_dir,
        index_name=index_name,
        server=ServerSettings(host="127.0.0.1", port=0),
    )
    async with running([LexicalServicer(settings)], settings.server) as server:
        yield f"127.0.0.1:{server.port}"


async def run_ir_eval(
    data: Dataset,
    *,
    backend: BackendName,
    address: str | None,
    data_dir: Path,
    batch_size: int = 200,
    concurrency: int = 8,
    top_k: int = 100,
) -> dict[str, Any]:
    index_name = f"attest-eval-{data.name.lower()}"
    async with lexical_target(backend, address, data_dir, index_name) as target:
        channel = create_channel(target, idempotent=[(LEXICAL, "Search"), (LEXICAL, "Index")])
        stub = lexical_pb2_grpc.LexicalServiceStub(channel)
        try:
            started = time.perf_counter()
            batch: list[common_pb2.Document] = []
            skipped = 0
            with tqdm(total=data.corpus_size(), desc="index", unit="doc") as bar:
                for doc in data.corpus():
                    if not doc.title.strip() and not doc.text.strip():
                        # Nothing to match; BM25 engines leave such documents
                        # out of their field statistics too.
                        skipped += 1
                        bar.update(1)
                        continue
                    batch.append(common_pb2.Document(id=doc.id, title=doc.title, body=doc.text))
                    if len(batch) == batch_size:
                        await stub.Index(lexical_pb2.IndexRequest(documents=batch), timeout=120)
                        bar.update(len(batch))
                        batch = []
                if batch:
                    await stub.Index(
                        lexical_pb2.IndexRequest(documents=batch, refresh=True), timeout=120
                    )
                    bar.update(len(batch))
            index_seconds = time.perf_counter() - started

            queries = data.judged_queries()
            run: Run = {}
            gate = asyncio.Semaphore(concurrency)

            async def search(qid: str, text: str) -> None:
                async with gate:
                    response = await stub.Search(
                        lexical_pb2.SearchRequest(query=text[:4096], top_k=top_k), timeout=30
                    )
                run[qid] = {}
                for hit in response.hits:
                    run[qid].setdefault(hit.doc_id, hit.score)

            started = time.perf_counter()
            tasks = [asyncio.create_task(search(q, t)) for q, t in queries.items()]
            for task in tqdm(asyncio.as_completed(tasks), total=len(tasks), desc="search"):
                await task
            search_seconds = time.perf_counter() - started
        finally:
            await channel.close()
    metrics: dict[str, Any] = dict(evaluate(data.qrels, run))
    metrics["empty_documents_skipped"] = skipped
    metrics["index_seconds"] = round(index_seconds, 3)
    metrics["search_seconds"] = round(search_seconds, 3)
    return metrics
