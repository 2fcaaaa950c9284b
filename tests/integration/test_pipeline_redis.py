"""The Celery pipeline on a real Redis, with a real worker process and lexical service."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from attest.pipeline.app import create_app
from attest.pipeline.settings import PipelineSettings
from tests.conftest import require_server

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listens on {port}")


@pytest.fixture
def stack(tmp_path: Path):
    """Redis DBs of our own, a lexical service and one worker, as separate processes."""
    base = require_server("ATTEST_TEST_REDIS_URL").rstrip("/")
    broker, results = f"{base}/5", f"{base}/6"
    redis.Redis.from_url(broker).flushdb()
    redis.Redis.from_url(results).flushdb()
    port = free_port()
    env = {
        **os.environ,
        "ATTEST_DATA_DIR": str(tmp_path),
        "ATTEST_LEXICAL_SERVER__PORT": str(port),
        "ATTEST_LEXICAL_SERVER__HOST": "127.0.0.1",
        "ATTEST_PIPELINE_BROKER_URL": broker,
        "ATTEST_PIPELINE_RESULT_BACKEND_URL": results,
        "ATTEST_PIPELINE_LEXICAL_ADDRESS": f"127.0.0.1:{port}",
    }
    cli = [sys.executable, "-m", "attest.cli"]
    procs = [
        subprocess.Popen(
            [*cli, "serve", "lexical"], env=env, stderr=(tmp_path / "lexical.log").open("w")
        ),
        subprocess.Popen(
            [*cli, "worker", "--queues", "index"],
            env=env,
            stderr=(tmp_path / "worker.log").open("w"),
        ),
    ]
    try:
        wait_for_port(port, 30)
        settings = PipelineSettings(
            broker_url=broker, result_backend_url=results, lexical_address=f"127.0.0.1:{port}"
        )
        yield create_app(settings), port, broker
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


def test_index_task_runs_on_a_worker_and_is_idempotent(stack):
    import asyncio

    from attest.core.channels import create_channel
    from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc

    app, port, broker = stack
    items = [
        {
            "id": f"r{i}",
            "title": f"Report {i}",
            "body": f"Water withdrawal fell by {i}% at site {i}.",
            "publishedAt": f"2025-01-0{1 + i % 9}T00:00:00Z",
            "passages": [{"index": 0, "text": f"Water withdrawal fell by {i}%."}],
        }
        for i in range(20)
    ]
    first = app.send_task("attest.index_documents", args=[items]).get(timeout=60)
    second = app.send_task("attest.index_documents", args=[items]).get(timeout=60)
    assert first == second == {"documents": 20, "passages": 20}
    # The broker queue is drained: late acknowledgement completed.
    assert redis.Redis.from_url(broker).llen("index") == 0

    async def stats() -> tuple[int, int]:
        channel = create_channel(f"127.0.0.1:{port}")
        try:
            s = await lexical_pb2_grpc.LexicalServiceStub(channel).Stats(lexical_pb2.StatsRequest())
            return s.documents, s.passages
        finally:
            await channel.close()

    assert asyncio.run(stats()) == (20, 20)


def test_invalid_documents_fail_without_retries(stack):
    app, _, _ = stack
    result = app.send_task("attest.index_documents", args=[[{"id": "x", "title": 5, "bogus": 1}]])
    with pytest.raises(Exception, match="documents\\[0\\]") as info:
        result.get(timeout=60)
    assert type(info.value).__name__ == "InvalidArgument"
    assert result.state == "FAILURE"
