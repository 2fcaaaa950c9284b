"""Health, graceful shutdown, deadlines and error mapping of the shared server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attest.common.v1 import common_pb2
from attest.core.channels import create_channel
from attest.core.server import Server
from attest.lexical.backends.tantivy import TantivyBackend
from attest.lexical.models import Counts, DocumentIn, Hit, IndexResult, SearchQuery
from attest.lexical.servicer import LexicalServicer
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
from tests.conftest import lexical_settings, start_lexical

pytestmark = pytest.mark.integration

SERVICE = "attest.lexical.v1.LexicalService"


class ControlledBackend:
    """A real tantivy backend whose warm-up and searches the test can hold back."""

    name = "tantivy"

    def __init__(self, inner: TantivyBackend) -> None:
        self.inner = inner
        self.warm_gate = asyncio.Event()
        self.search_gate = asyncio.Event()
        self.search_gate.set()
        self.search_started = asyncio.Event()
        self.fail_with: Exception | None = None
        self.fail_times = 0
        self.searches = 0

    async def warm_up(self) -> None:
        await self.warm_gate.wait()
        await self.inner.warm_up()

    async def index(
        self, tenant: str, documents: Sequence[DocumentIn], *, refresh: bool
    ) -> IndexResult:
        return await self.inner.index(tenant, documents, refresh=refresh)

    async def search(self, tenant: str, query: SearchQuery) -> list[Hit]:
        self.search_started.set()
        self.searches += 1
        await self.search_gate.wait()
        if self.fail_with is not None and self.fail_times != 0:
            self.fail_times -= 1
            raise self.fail_with
        return await self.inner.search(tenant, query)

    async def delete(self, tenant: str, doc_ids: Sequence[str]) -> int:
        return await self.inner.delete(tenant, doc_ids)

    async def stats(self, tenant: str) -> Counts:
        return await self.inner.stats(tenant)

    async def close(self) -> None:
        await self.inner.close()


async def health_status(channel: grpc.aio.Channel, service: str = "") -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    response = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return response.status


@pytest.fixture
async def controlled(tmp_path: Path):
    settings = lexical_settings("tantivy", tmp_path, grace_seconds=10)
    backend = ControlledBackend(TantivyBackend(settings))
    server = Server([LexicalServicer(settings, backend)], settings.server)
    yield server, backend
    backend.warm_gate.set()
    backend.search_gate.set()
    await server.stop(grace=1)


async def test_health_is_not_serving_until_the_backend_is_ready(controlled):
    server, backend = controlled
    port = await server.start()
    channel = create_channel(f"127.0.0.1:{port}")
    stub = lexical_pb2_grpc.LexicalServiceStub(channel)
    try:
        assert await health_status(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert await health_status(channel, SERVICE) == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Search(lexical_pb2.SearchRequest(query="water", top_k=1))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        backend.warm_gate.set()
        await asyncio.wait_for(server.ready.wait(), 10)
        assert await health_status(channel) == health_pb2.HealthCheckResponse.SERVING
        assert await health_status(channel, SERVICE) == health_pb2.HealthCheckResponse.SERVING
    finally:
        await channel.close()
        await server.stop(grace=1)


@contextlib.asynccontextmanager
async def warm(server, backend, **channel_options):
    """Start the server with a ready backend; yield a stub on a fresh channel."""
    backend.warm_gate.set()
    port = await server.start()
    await asyncio.wait_for(server.ready.wait(), 10)
    channel = create_channel(f"127.0.0.1:{port}", **channel_options)
    try:
        yield lexical_pb2_grpc.LexicalServiceStub(channel)
    finally:
        await channel.close()


async def test_in_flight_search_finishes_during_graceful_shutdown(controlled):
    server, backend = controlled
    async with warm(server, backend) as stub:
        doc = common_pb2.Document(id="d1", title="Water report", body="Water withdrawal fell.")
        await stub.Index(lexical_pb2.IndexRequest(documents=[doc], refresh=True))
        backend.search_gate.clear()
        in_flight = asyncio.ensure_future(
            stub.Search(lexical_pb2.SearchRequest(query="water", top_k=1), timeout=20)
        )
        await asyncio.wait_for(backend.search_started.wait(), 5)
        stopping = asyncio.create_task(server.stop())
        await asyncio.sleep(0.3)
        # Draining: health already says NOT_SERVING and the search is still open.
        status = await server.health.Check(health_pb2.HealthCheckRequest(service=""), None)
        assert status.status == health_pb2.HealthCheckResponse.NOT_SERVING
        assert not in_flight.done()
        backend.search_gate.set()
        response = await asyncio.wait_for(in_flight, 10)
        assert [h.doc_id for h in response.hits] == ["d1"]
        await asyncio.wait_for(stopping, 15)
        # After shutdown, new calls are refused.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Search(lexical_pb2.SearchRequest(query="water", top_k=1), timeout=2)
        assert info.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


async def test_unexpected_errors_become_internal_without_details(controlled):
    server, backend = controlled
    async with warm(server, backend) as stub:
        backend.fail_with = RuntimeError("secret path /etc/attest exploded")
        backend.fail_times = -1
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Search(lexical_pb2.SearchRequest(query="water", top_k=1))
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert "secret" not in info.value.details()
        request_ids = [v for k, v in info.value.trailing_metadata() if k == "x-request-id"]
        assert len(request_ids) == 1
        assert len(request_ids[0]) == 32


async def test_deadline_is_enforced_downstream(controlled):
    server, backend = controlled
    async with warm(server, backend) as stub:
        backend.search_gate.clear()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Search(lexical_pb2.SearchRequest(query="water", top_k=1), timeout=0.3)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_no_rpc_answers_unknown(tmp_path):
    """A sweep of malformed, hostile and odd requests: every status is a known one."""
    settings = lexical_settings("tantivy", tmp_path, max_message_bytes=256 * 1024)
    weird = [
        ("Search", lexical_pb2.SearchRequest()),
        ("Search", lexical_pb2.SearchRequest(query="\x00\ud7ff\uffff", top_k=3)),
        ("Search", lexical_pb2.SearchRequest(query="a" * 4096, top_k=1000)),
        (
            "Search",
            lexical_pb2.SearchRequest(query='AND OR NOT ( ) [ ] { } : ^ ~ * ? \\ / "', top_k=3),
        ),
        ("Search", lexical_pb2.SearchRequest(query="water", top_k=-1)),
        ("Search", lexical_pb2.SearchRequest(query="water", top_k=2**31 - 1)),
        ("Search", lexical_pb2.SearchRequest(query="water", top_k=3, level=99)),
        (
            "Search",
            lexical_pb2.SearchRequest(
                query="water",
                top_k=3,
                filters=[common_pb2.Filter(field="published_at", gte="2025-02-30")],
            ),
        ),
        (
            "Search",
            lexical_pb2.SearchRequest(
                query="water",
                top_k=3,
                filters=[common_pb2.Filter(field="organization", gte="2025")],
            ),
        ),
        (
            "Index",
            lexical_pb2.IndexRequest(documents=[common_pb2.Document(id="x" * 5000, body="b")]),
        ),
        (
            "Index",
            lexical_pb2.IndexRequest(documents=[common_pb2.Document(id="ok", body="b" * 300_000)]),
        ),
        (
            "Index",
            lexical_pb2.IndexRequest(
                documents=[common_pb2.Document(id="emoji-🌊", body="wave 🌊 water")]
            ),
        ),
        ("Delete", lexical_pb2.DeleteRequest(doc_ids=[""])),
        ("Stats", lexical_pb2.StatsRequest()),
    ]
    outcomes = []
    async for harness in start_lexical(settings):
        for method, request in weird:
            try:
                await getattr(harness.stub, method)(request, timeout=10)
                outcomes.append((method, grpc.StatusCode.OK, ""))
            except grpc.aio.AioRpcError as err:
                outcomes.append((method, err.code(), err.details()))
        # Unicode ids and text round-trip.
        r = await harness.stub.Search(lexical_pb2.SearchRequest(query="wave water", top_k=1))
        assert r.hits[0].doc_id == "emoji-🌊"
    assert [o for o in outcomes if o[1] == grpc.StatusCode.UNKNOWN] == []
    seen = {code for _, code, _ in outcomes}
    assert grpc.StatusCode.INVALID_ARGUMENT in seen
    assert grpc.StatusCode.OK in seen
    assert grpc.StatusCode.UNKNOWN not in seen


async def test_idempotent_calls_are_retried_by_the_channel(controlled):
    from attest.core.errors import Unavailable

    server, backend = controlled
    backend.warm_gate.set()
    port = await server.start()
    await asyncio.wait_for(server.ready.wait(), 10)
    retrying = create_channel(f"127.0.0.1:{port}", idempotent=[(SERVICE, "Search")])
    plain = create_channel(f"127.0.0.1:{port}")
    try:
        doc = common_pb2.Document(id="d1", title="Water report", body="Water withdrawal fell.")
        await lexical_pb2_grpc.LexicalServiceStub(plain).Index(
            lexical_pb2.IndexRequest(documents=[doc], refresh=True)
        )
        backend.fail_with = Unavailable("index restarting")
        backend.fail_times = 2
        backend.searches = 0
        response = await lexical_pb2_grpc.LexicalServiceStub(retrying).Search(
            lexical_pb2.SearchRequest(query="water", top_k=1), timeout=10
        )
        assert [h.doc_id for h in response.hits] == ["d1"]
        assert backend.searches == 3

        backend.fail_times = 1
        backend.searches = 0
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await lexical_pb2_grpc.LexicalServiceStub(plain).Search(
                lexical_pb2.SearchRequest(query="water", top_k=1), timeout=10
            )
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert backend.searches == 1
    finally:
        await retrying.close()
        await plain.close()


async def test_reflection_and_metrics(tmp_path):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
    from prometheus_client import REGISTRY

    settings = lexical_settings("tantivy", tmp_path, reflection=True)
    method = f"/{SERVICE}/Search"

    def handled(code: str) -> float:
        return (
            REGISTRY.get_sample_value("attest_rpc_handled_total", {"method": method, "code": code})
            or 0.0
        )

    ok_before, bad_before = handled("OK"), handled("INVALID_ARGUMENT")
    async for harness in start_lexical(settings):
        stub = reflection_pb2_grpc.ServerReflectionStub(harness.channel)
        call = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = set()
        async for response in call:
            names = {s.name for s in response.list_services_response.service}
            break
        assert {SERVICE, "grpc.health.v1.Health"} <= names

        await harness.stub.Search(lexical_pb2.SearchRequest(query="water", top_k=1))
        with pytest.raises(grpc.aio.AioRpcError):
            await harness.stub.Search(lexical_pb2.SearchRequest(query="", top_k=1))
    assert handled("OK") == ok_before + 1
    assert handled("INVALID_ARGUMENT") == bad_before + 1
