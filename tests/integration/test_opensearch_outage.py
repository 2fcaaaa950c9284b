"""A stopped or hung OpenSearch: callers get a clear status within their deadline.

The service reaches the real node through a TCP proxy owned by the test, so
the node can "stop" (the proxy closes and refuses connections) or "hang" (the
proxy accepts and never answers) without disturbing other tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from urllib.parse import urlsplit

import grpc
import pytest

from attest.common.v1 import common_pb2
from attest.lexical.settings import OpenSearchSettings
from attest.lexical.v1 import lexical_pb2
from tests.conftest import lexical_settings, require_server, start_lexical

pytestmark = pytest.mark.integration


class Proxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.mode = "forward"  # or "hang"
        self.server: asyncio.Server | None = None
        self.port = 0
        self.writers: set[asyncio.StreamWriter] = set()

    async def start(self, port: int = 0) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Like a stopped node: close every connection and refuse new ones."""
        assert self.server is not None
        self.server.close()
        for w in list(self.writers):
            w.close()
        await self.server.wait_closed()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while data := await reader.read(65536):
                if self.mode == "hang":
                    continue  # a hung node reads requests and never answers
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        if self.mode == "hang":
            with contextlib.suppress(ConnectionError):
                await reader.read()  # swallow the request, never answer
            return
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self.writers.add(up_writer)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))


@pytest.fixture
async def proxied(tmp_path):
    url = urlsplit(require_server("ATTEST_TEST_OPENSEARCH_URL"))
    proxy = Proxy(url.hostname or "127.0.0.1", url.port or 9200)
    await proxy.start()
    settings = lexical_settings("opensearch", tmp_path).model_copy(
        update={
            "opensearch": OpenSearchSettings(
                hosts=(f"http://127.0.0.1:{proxy.port}",), timeout_seconds=5
            )
        }
    )
    async for harness in start_lexical(settings):
        yield harness, proxy


async def test_stopped_opensearch_gives_unavailable_within_the_deadline(proxied):
    harness, proxy = proxied
    doc = common_pb2.Document(id="d1", title="Water", body="Water withdrawal fell.")
    await harness.stub.Index(lexical_pb2.IndexRequest(documents=[doc], refresh=True))
    ok = await harness.stub.Search(lexical_pb2.SearchRequest(query="water", top_k=1))
    assert [h.doc_id for h in ok.hits] == ["d1"]

    await proxy.stop()
    for method, request in [
        ("Search", lexical_pb2.SearchRequest(query="water", top_k=1)),
        ("Index", lexical_pb2.IndexRequest(documents=[doc])),
        ("Delete", lexical_pb2.DeleteRequest(doc_ids=["d1"])),
        ("Stats", lexical_pb2.StatsRequest()),
    ]:
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await getattr(harness.stub, method)(request, timeout=3)
        elapsed = time.monotonic() - started
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, (method, info.value.details())
        assert "opensearch" in info.value.details()
        assert elapsed < 3

    # The node comes back on the same address: the service recovers by itself.
    await proxy.start(port=proxy.port)
    again = await harness.stub.Search(lexical_pb2.SearchRequest(query="water", top_k=1))
    assert [h.doc_id for h in again.hits] == ["d1"]
    await proxy.stop()


async def test_hung_opensearch_answers_within_the_callers_deadline(proxied):
    harness, proxy = proxied
    proxy.mode = "hang"
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await harness.stub.Search(lexical_pb2.SearchRequest(query="water", top_k=1), timeout=1.5)
    elapsed = time.monotonic() - started
    assert info.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
    assert elapsed < 2.0
    await proxy.stop()
