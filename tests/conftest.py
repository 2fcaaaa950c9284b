"""Shared fixtures: in-process servers on port 0 and real backends.

Integration tests need an OpenSearch node and a Redis server; `.ci/test.sh`
starts both and exports ATTEST_TEST_OPENSEARCH_URL and ATTEST_TEST_REDIS_URL.
Under CI=true a missing server fails the test instead of skipping it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

# `serve all` and `serve answer` open the HTTP gateway on port 8080 by default;
# tests start many of them on free ports at once, so the gateway is off unless
# a test asks for it (with --http-port and ATTEST_ANSWER_HTTP__ENABLED=true).
os.environ.setdefault("ATTEST_ANSWER_HTTP__ENABLED", "false")

from attest.core.channels import create_channel
from attest.core.server import Server, running
from attest.core.settings import ServerSettings
from attest.lexical.backends import LexicalBackend
from attest.lexical.servicer import LexicalServicer
from attest.lexical.settings import LexicalSettings, OpenSearchSettings
from attest.lexical.v1 import lexical_pb2_grpc


def require_server(variable: str) -> str:
    """The URL of a test server, or skip (fail under CI) when it is not set."""
    value = os.environ.get(variable)
    if value:
        return value
    message = f"{variable} is not set: start the server (see .ci/test.sh)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def lexical_settings(backend: str, tmp_path: Path, **server: object) -> LexicalSettings:
    extra: dict[str, object] = {}
    if backend == "opensearch":
        extra["opensearch"] = OpenSearchSettings(
            hosts=(require_server("ATTEST_TEST_OPENSEARCH_URL"),), timeout_seconds=10
        )
    return LexicalSettings(
        backend=backend,  # type: ignore[arg-type]
        data_dir=tmp_path,
        index_name=f"test-{uuid.uuid4().hex[:12]}",
        server=ServerSettings(host="127.0.0.1", port=0, **server),  # type: ignore[arg-type]
        **extra,  # type: ignore[arg-type]
    )


class LexicalHarness:
    def __init__(self, server: Server, servicer: LexicalServicer) -> None:
        self.server = server
        self.servicer = servicer
        self.channel = create_channel(f"127.0.0.1:{server.port}")
        self.stub = lexical_pb2_grpc.LexicalServiceStub(self.channel)


async def start_lexical(
    settings: LexicalSettings, backend: LexicalBackend | None = None
) -> AsyncIterator[LexicalHarness]:
    servicer = LexicalServicer(settings, backend)
    async with running([servicer], settings.server) as server:
        harness = LexicalHarness(server, servicer)
        try:
            yield harness
        finally:
            await harness.channel.close()
            await drop_indexes(settings)


async def drop_indexes(settings: LexicalSettings) -> None:
    if settings.backend != "opensearch":
        return
    from opensearchpy import AsyncOpenSearch

    client = AsyncOpenSearch(hosts=[require_server("ATTEST_TEST_OPENSEARCH_URL")])
    try:
        await client.indices.delete(index=f"{settings.index_name}-*", ignore_unavailable=True)
    finally:
        await client.close()


@pytest.fixture(params=["tantivy", pytest.param("opensearch", marks=pytest.mark.integration)])
async def lexical(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LexicalHarness]:
    """A lexical service on each backend, served over gRPC on a free port."""
    settings = lexical_settings(request.param, tmp_path)
    async for harness in start_lexical(settings):
        yield harness


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A cache directory of the module's own (``ATTEST_CACHE_DIR``): model exports
    made by its tests land there, not in the user's cache."""
    root = tmp_path_factory.mktemp("attest-cache")
    old = os.environ.get("ATTEST_CACHE_DIR")
    os.environ["ATTEST_CACHE_DIR"] = str(root)
    yield root
    if old is None:
        os.environ.pop("ATTEST_CACHE_DIR", None)
    else:
        os.environ["ATTEST_CACHE_DIR"] = old
