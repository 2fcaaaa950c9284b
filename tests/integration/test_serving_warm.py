"""SERVING means warm (issue 45): what the first Ask would load is loaded before
the health service reports SERVING.

Every service of `attest serve all --embedded --knowledge` runs in this process
(so their state can be read), over a data directory that already holds a few
documents and their facts: the services start, report SERVING, and before any
call is made the KG scorer's tensors, the personal base's facts and indexes and
the generator's stemmer are there. The first Ask then answers without building
any of them again. Timings are left to ``loadtest/bench_ask.py`` (its
``first_ask`` ratio); this test reads state only.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attest.answer.embedded import FACTS_ADDRESS_VARIABLE, embedded_servicers, free_port
from attest.client import AnswerClient
from attest.common.v1 import common_pb2
from attest.core.channels import create_channel
from attest.core.server import Server, Servicer
from attest.core.settings import ServerSettings
from attest.demo.run import sample_documents
from attest.generate import stems
from attest.generate.servicer import GenerateServicer
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from attest.knowledge.servicer import KnowledgeServicer
from attest.semantic.servicer import SemanticServicer

pytestmark = pytest.mark.integration

TENANT = "default"  # every caller's tenant without authentication
DOCS = 3
QUESTION = "Who is the new chair of Marrowgate Bank?"
_S = TypeVar("_S")


def _documents() -> list[common_pb2.Document]:
    return [d for d in sample_documents() if "Marrowgate" in d.title][:DOCS]


async def _serving(address: str, seconds: float) -> None:
    """Returns once the whole server's health is SERVING."""
    deadline = time.monotonic() + seconds
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"not SERVING after {seconds:.0f} s")
            await asyncio.sleep(0.1)


async def _ingest(address: str) -> None:
    channel = create_channel(address)
    try:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        items = [ingest_pb2.IngestItem(document=d) for d in _documents()]
        job = (await stub.Ingest(ingest_pb2.IngestRequest(items=items), timeout=60)).job
        final = None
        async for update in stub.WatchJob(
            ingest_pb2.WatchJobRequest(job_id=job.job_id), timeout=600
        ):
            final = update
        assert final is not None
        assert final.state == ingest_pb2.JOB_STATE_DONE, final
        assert final.progress.created == DOCS
    finally:
        await channel.close()


def _one(servicers: list[Servicer], kind: type[_S]) -> _S:
    (found,) = [s for s in servicers if isinstance(s, kind)]
    return found


@pytest.mark.timeout(900)
async def test_serve_all_reports_serving_only_once_the_first_ask_would_load_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    settings = ServerSettings(host="127.0.0.1", port=port)
    # Ingestion sends the facts it extracts to this server's knowledge service.
    monkeypatch.setenv(FACTS_ADDRESS_VARIABLE, address)

    server = Server(embedded_servicers(tmp_path, address, knowledge=True), settings)
    await server.start()
    try:
        await _serving(address, 600)
        await _ingest(address)
    finally:
        await server.stop(grace=5)

    # A fresh process would start without a stemmer: so does this one.
    monkeypatch.setattr(stems, "_STEM", None)
    stems.stem.cache_clear()
    servicers = embedded_servicers(tmp_path, address, knowledge=True)
    semantic = _one(servicers, SemanticServicer)
    knowledge = _one(servicers, KnowledgeServicer)
    _one(servicers, GenerateServicer)
    server = Server(servicers, settings)
    await server.start()
    try:
        await _serving(address, 600)

        # Semantic: the articles restored, KG scoring's tensors (torch) built.
        scorer = semantic.index.scorer
        assert scorer.count(TENANT)[0] == DOCS
        assert scorer.warm
        # Generate: the warm-up answer ran the fact matching (its stemmer).
        assert stems._STEM is not None
        # Knowledge: every tenant's facts in memory, their indexes built.
        store = knowledge.personal_store()
        assert store.loaded_tenants == {TENANT}
        view = await store.view(TENANT)
        assert view.documents
        assert view.names
        assert view.indexed

        async with AnswerClient(address) as client:
            answer = await client.ask(QUESTION)
        assert answer.sentences
        # The first Ask built nothing the warm-up had not.
        assert scorer.warm
        assert view.indexed
        assert store.loaded_tenants == {TENANT}
    finally:
        await server.stop(grace=5)
