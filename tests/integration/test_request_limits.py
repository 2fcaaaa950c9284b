"""Request-size limits in a shared process (`serve all`): the ingest service keeps
its own 64 MiB limit beside the answer service's 16 MiB, so a body over the
per-item limit (8 MiB) is reported per item, not refused for the request."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest

from attest.core.channels import create_channel
from attest.core.server import running
from attest.core.settings import ClientSettings, MiB, ServerSettings
from attest.ingest.servicer import IngestServicer
from attest.ingest.settings import IngestSettings
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc

pytestmark = pytest.mark.integration


def _item(doc_id: str, body_bytes: int) -> ingest_pb2.IngestItem:
    body = ("word " * (body_bytes // 5 + 1))[:body_bytes]
    return ingest_pb2.IngestItem(raw_json=json.dumps({"id": doc_id, "body": body}).encode())


@pytest.mark.timeout(300)
async def test_serve_all_reports_a_50_mb_body_per_item(tmp_path: Path) -> None:
    # serve all listens with the answer service's settings (16 MiB by default).
    settings = ServerSettings(host="127.0.0.1", port=0)
    assert settings.max_message_bytes == 16 * MiB
    ingest = IngestServicer(IngestSettings(data_dir=tmp_path))
    async with running([ingest], settings) as server:
        channel = create_channel(
            f"127.0.0.1:{server.port}", ClientSettings(max_message_bytes=200 * MiB)
        )
        try:
            stub = ingest_pb2_grpc.IngestServiceStub(channel)
            for size in (20_000_000, 50_000_000):
                reply = await stub.Ingest(
                    ingest_pb2.IngestRequest(items=[_item("big", size), _item("small", 40)]),
                    timeout=120,
                )
                job = reply.job
                for _ in range(600):
                    if job.state in (ingest_pb2.JOB_STATE_DONE, ingest_pb2.JOB_STATE_FAILED):
                        break
                    await asyncio.sleep(0.2)
                    job = (
                        await stub.GetJob(ingest_pb2.GetJobRequest(job_id=job.job_id), timeout=10)
                    ).job
                assert job.state == ingest_pb2.JOB_STATE_DONE, size
                [failure] = job.failures
                assert (failure.doc_id, failure.code) == (
                    "big",
                    ingest_pb2.FAILURE_CODE_BODY_TOO_LARGE,
                )
                assert f"{size:,} bytes" in failure.reason
            # Past the ingest limit (64 MiB) the request is refused naming its field;
            # the transport admits twice the limit so the refusal can say so.
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Ingest(
                    ingest_pb2.IngestRequest(items=[_item("huge", 70 * MiB)]), timeout=120
                )
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "items" in (refused.value.details() or "")
        finally:
            await channel.close()
