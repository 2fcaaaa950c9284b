"""`attest kb ... --address` pointed at a server without the knowledge service:
one clear message saying so and how to start it, exit status 1."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from click.testing import CliRunner
from grpc_health.v1 import health, health_pb2_grpc

from attest.cli import main

pytestmark = pytest.mark.integration


@pytest.fixture
def other_server() -> Iterator[str]:
    """A gRPC server with health only, as a `serve all` without --knowledge has no
    knowledge service."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)


@pytest.mark.parametrize(
    "args",
    [["search", "water use"], ["info", "water"], ["facts", "doc-1"]],
    ids=["search", "info", "facts"],
)
def test_a_server_without_the_knowledge_service_is_named_as_such(
    other_server: str, args: list[str]
) -> None:
    out = CliRunner().invoke(main, ["kb", *args, "--address", other_server])
    assert out.exit_code == 1, out.output
    assert f"the knowledge service is not running at {other_server}" in out.output
    assert "attest serve all --knowledge" in out.output
    assert "INTERNAL" not in out.output
    assert "Method not found" not in out.output


def test_nothing_listening_is_named_too() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = CliRunner().invoke(main, ["kb", "search", "water", "--address", f"127.0.0.1:{port}"])
    assert out.exit_code == 1, out.output
    assert f"No knowledge service answers at 127.0.0.1:{port}" in out.output
    assert "attest serve all --knowledge" in out.output
