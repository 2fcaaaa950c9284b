"""Per-tenant quotas on a real server: requests/s and answers in flight."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from attest.answer.v1 import answer_pb2, answer_pb2_grpc
from attest.core.auth import new_api_key
from attest.core.server import running
from attest.core.settings import AuthSettings, QuotaSettings, ServerSettings
from tests.integration.perimeter import TenantAnswer, write_keys

pytestmark = pytest.mark.integration

KEYS = {"acme": new_api_key(), "globex": new_api_key()}


def _settings(tmp_path: Path, quota: QuotaSettings, **server: Any) -> ServerSettings:
    """A keyed server on loopback for the tenants of KEYS, with ``quota``."""
    keys = tmp_path / "keys.json"
    write_keys(
        keys,
        [{"id": t, "key": k, "tenant": t, "scopes": ["ask"]} for t, k in KEYS.items()],
    )
    return ServerSettings(
        host="127.0.0.1", port=0, auth=AuthSettings(keys_file=keys), quota=quota, **server
    )


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[str, TenantAnswer]]:
    settings = _settings(
        tmp_path, QuotaSettings(requests_per_second=5, burst=3, max_in_flight_answers=1)
    )
    answer = TenantAnswer()
    async with running([answer], settings) as server:
        yield f"127.0.0.1:{server.port}", answer


def _md(tenant: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {KEYS[tenant]}"),)


async def test_requests_per_second_per_tenant(served: tuple[str, TenantAnswer]) -> None:
    address, _ = served
    async with grpc.aio.insecure_channel(address) as channel:
        stub = answer_pb2_grpc.AnswerServiceStub(channel)
        codes = []
        retry_after: list[float] = []
        for _ in range(6):
            call = stub.Get(answer_pb2.GetRequest(job_id="j"), metadata=_md("acme"), timeout=5)
            try:
                await call
                codes.append("OK")
            except grpc.aio.AioRpcError as err:
                codes.append(err.code().name)
                trailers = dict(err.trailing_metadata() or ())
                retry_after.append(float(trailers["retry-after"]))
                assert "x-request-id" in trailers
        # A burst of 3, then refusals (the bucket refills 5/s, far slower than this loop).
        assert codes[:3] == ["OK", "OK", "OK"]
        assert codes.count("RESOURCE_EXHAUSTED") >= 2, codes
        assert all(0 < r <= 0.2 for r in retry_after), retry_after
        # Another tenant has its own bucket.
        reply = await stub.Get(answer_pb2.GetRequest(job_id="j"), metadata=_md("globex"))
        assert reply.job.job_id == "globex|"
        # Waiting as told lets the next call in.
        await asyncio.sleep(max(retry_after) + 0.05)
        reply = await stub.Get(answer_pb2.GetRequest(job_id="j"), metadata=_md("acme"))
        assert reply.job.job_id == "acme|"


async def test_answers_in_flight_per_tenant(served: tuple[str, TenantAnswer]) -> None:
    address, answer = served
    answer.hold = 1.0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = answer_pb2_grpc.AnswerServiceStub(channel)
        first = asyncio.ensure_future(
            stub.Ask(answer_pb2.AskRequest(question="q"), metadata=_md("acme"), timeout=10)
        )
        await asyncio.sleep(0.3)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Ask(answer_pb2.AskRequest(question="q"), metadata=_md("acme"), timeout=10)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "answers in flight" in (caught.value.details() or "")
        assert float(dict(caught.value.trailing_metadata() or ())["retry-after"]) > 0
        # The other tenant is not held up by acme's answer.
        await stub.Ask(answer_pb2.AskRequest(question="q"), metadata=_md("globex"), timeout=10)
        await first
        # Once the first answer ended, acme may ask again.
        await stub.Ask(answer_pb2.AskRequest(question="q"), metadata=_md("acme"), timeout=10)


async def test_watches_are_capped_per_tenant_and_leave_the_server_its_other_calls(
    tmp_path: Path,
) -> None:
    """A Watch on a job no worker takes stays open for as long as the job is kept;
    without a cap one tenant's watches would take every concurrent call of the
    listener, Ask and the health check included."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    # All tenants' watches: at most a quarter of 12 calls, 3.
    settings = _settings(tmp_path, QuotaSettings(max_watches=2), max_concurrent_rpcs=12)

    async def opened(stub: answer_pb2_grpc.AnswerServiceStub, tenant: str) -> Any:
        call = stub.Watch(answer_pb2.WatchRequest(job_id="j"), metadata=_md(tenant))
        first = await call.read()
        assert first.job.state == answer_pb2.JOB_STATE_QUEUED
        return call

    async def refused(stub: answer_pb2_grpc.AnswerServiceStub, tenant: str) -> grpc.aio.AioRpcError:
        call = stub.Watch(answer_pb2.WatchRequest(job_id="j"), metadata=_md(tenant), timeout=5)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call.read()
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert float(dict(caught.value.trailing_metadata() or ())["retry-after"]) > 0
        return caught.value

    async with running([TenantAnswer()], settings) as server:
        address = f"127.0.0.1:{server.port}"
        async with grpc.aio.insecure_channel(address) as channel:
            stub = answer_pb2_grpc.AnswerServiceStub(channel)
            acme = [await opened(stub, "acme"), await opened(stub, "acme")]
            err = await refused(stub, "acme")
            assert "acme' already has 2 Watch/WatchJob streams open (quota 2)" in (
                err.details() or ""
            )
            globex = await opened(stub, "globex")
            err = await refused(stub, "globex")
            assert (
                "already has 3 Watch/WatchJob streams open, its limit (0.25 of its 12 "
                "concurrent calls)"
            ) in (err.details() or "")
            # Every other call still has room.
            await stub.Ask(answer_pb2.AskRequest(question="q"), metadata=_md("globex"), timeout=5)
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            # A watch that ends gives its place back.
            acme[0].cancel()
            for _ in range(50):
                try:
                    acme[0] = await opened(stub, "acme")
                    break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.1)
            else:
                raise AssertionError("a cancelled watch kept its place")
            for call in [*acme, globex]:
                call.cancel()
            # The health service's Watch needs no credential and holds a call too.
            health_stub = health_pb2_grpc.HealthStub(channel)
            watching = []
            turned_away = ""
            for _ in range(50):
                call = health_stub.Watch(health_pb2.HealthCheckRequest(), timeout=10)
                try:
                    assert (await call.read()).status == health_pb2.HealthCheckResponse.SERVING
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        raise
                    turned_away = exc.details() or ""
                    if turned_away.startswith("this server"):
                        # The cancelled watches above are still letting go.
                        await asyncio.sleep(0.1)
                        continue
                    break
                watching.append(call)
            # Callers without a credential share a quarter of the server's 3 (at least 1).
            assert len(watching) == 1
            assert "'(unauthenticated)' already has 1 Watch/WatchJob streams open" in turned_away
            for call in watching:
                call.cancel()
