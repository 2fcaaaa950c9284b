"""Queued answer jobs on a real Redis with a real Celery worker process.

The search, rerank and generate services run in this process (see
test_answer_api.Stack); the worker, a separate `attest worker --queues answer`
process, reaches them over gRPC. Ask and Submit must give the same answer.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio
import redis

from attest.answer.servicer import AnswerServicer
from attest.answer.settings import AnswerSettings, JobSettings
from attest.answer.v1 import answer_pb2, answer_pb2_grpc
from attest.core.server import running
from attest.pipeline.app import create_app
from attest.pipeline.settings import PipelineSettings
from tests.conftest import require_server
from tests.integration.test_answer_api import CHILD_LABOUR, LOCAL, Stack, check_citations

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def jobs(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Any, Stack]]:
    base = require_server("ATTEST_TEST_REDIS_URL").rstrip("/")
    broker, results, state = f"{base}/7", f"{base}/8", f"{base}/9"
    for url in (broker, results, state):
        redis.Redis.from_url(url).flushdb()
    tmp = tmp_path_factory.mktemp("jobs")
    stack = Stack(tmp)
    worker: subprocess.Popen[bytes] | None = None
    try:
        await stack.start()
        addresses = {
            "lexical_address": stack.deps,
            "semantic_address": stack.deps,
            "rerank_address": stack.deps,
            "generate_address": stack.generate,
        }
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "ATTEST_PIPELINE_BROKER_URL": broker,
            "ATTEST_PIPELINE_RESULT_BACKEND_URL": results,
            "ATTEST_ANSWER_JOBS__STATE_URL": state,
            **{f"ATTEST_ANSWER_{k.upper()}": v for k, v in addresses.items()},
        }
        worker = subprocess.Popen(  # noqa: ASYNC220 - returns at once; the worker runs beside
            [sys.executable, "-m", "attest.cli", "worker", "--queues", "answer"],
            env=env,
            stderr=(tmp / "worker.log").open("wb"),
        )
        settings = AnswerSettings(
            server=LOCAL,
            jobs=JobSettings(state_url=state, watch_interval_seconds=0.1),
            **addresses,
        )
        celery = create_app(PipelineSettings(broker_url=broker, result_backend_url=results))
        async with running([AnswerServicer(settings, celery=celery)], LOCAL) as server:
            stub = answer_pb2_grpc.AnswerServiceStub(stack.channel(f"127.0.0.1:{server.port}"))
            yield stub, stack
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=60)
        await stack.close()


async def watch(stub: Any, job_id: str) -> list[answer_pb2.Job]:
    return [r.job async for r in stub.Watch(answer_pb2.WatchRequest(job_id=job_id), timeout=300)]


async def test_ask_and_submit_give_the_same_answer(jobs: tuple[Any, Stack]) -> None:
    stub, _ = jobs
    options = answer_pb2.AskOptions(rerank_top_k=3)
    asked = (
        await stub.Ask(answer_pb2.AskRequest(question=CHILD_LABOUR, options=options), timeout=120)
    ).answer
    submitted = (
        await stub.Submit(answer_pb2.SubmitRequest(question=CHILD_LABOUR, options=options))
    ).job
    assert submitted.state == answer_pb2.JOB_STATE_QUEUED
    assert submitted.question == CHILD_LABOUR
    states = await watch(stub, submitted.job_id)
    assert states[-1].state == answer_pb2.JOB_STATE_DONE, states[-1].error
    assert [s.state for s in states] == sorted(s.state for s in states)
    job = (await stub.Get(answer_pb2.GetRequest(job_id=submitted.job_id))).job
    assert job.state == answer_pb2.JOB_STATE_DONE
    assert job.attempts == 1
    assert job.HasField("started_at")
    assert job.HasField("finished_at")
    assert job.expires_at.ToSeconds() > job.finished_at.ToSeconds()
    answer = job.answer
    assert answer.text == asked.text
    assert list(answer.sentences) == list(asked.sentences)
    assert [s.source for s in answer.sources] == [s.source for s in asked.sources]
    assert "14" in answer.text
    check_citations(answer)
    assert answer.timings[0].stage == answer_pb2.STAGE_QUEUED


async def test_an_idempotency_key_returns_the_same_job(jobs: tuple[Any, Stack]) -> None:
    stub, _ = jobs
    request = answer_pb2.SubmitRequest(question=CHILD_LABOUR, idempotency_key="batch-7/q3")
    first = (await stub.Submit(request)).job
    second = (await stub.Submit(request)).job
    assert first.job_id == second.job_id
    states = await watch(stub, first.job_id)
    assert states[-1].state == answer_pb2.JOB_STATE_DONE


async def test_unknown_jobs_and_bad_submissions(jobs: tuple[Any, Stack]) -> None:
    stub, _ = jobs
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Get(answer_pb2.GetRequest(job_id="0" * 32))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Submit(answer_pb2.SubmitRequest(question=""))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "question" in (err.value.details() or "")


async def test_a_submit_the_queue_refuses_fails_retryably_and_its_retry_queues_it(
    jobs: tuple[Any, Stack],
) -> None:
    """The job record is written before the task is sent: a broker that is down
    must not leave a QUEUED job that nothing runs and a retry keeps returning."""
    import socket

    stub, stack = jobs
    base = require_server("ATTEST_TEST_REDIS_URL").rstrip("/")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"redis://127.0.0.1:{s.getsockname()[1]}"
    down = create_app(
        PipelineSettings(
            broker_url=f"{dead}/0", result_backend_url=f"{dead}/1", publish_retry_seconds=0.5
        )
    )
    settings = AnswerSettings(
        server=LOCAL,
        jobs=JobSettings(state_url=f"{base}/9", watch_interval_seconds=0.1),
        lexical_address=stack.deps,
        semantic_address=stack.deps,
        rerank_address=stack.deps,
        generate_address=stack.generate,
    )
    async with running([AnswerServicer(settings, celery=down)], LOCAL) as server:
        refusing = answer_pb2_grpc.AnswerServiceStub(stack.channel(f"127.0.0.1:{server.port}"))
        keyed = answer_pb2.SubmitRequest(question=CHILD_LABOUR, idempotency_key="retry-me")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await refusing.Submit(keyed, timeout=60)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        details = err.value.details() or ""
        assert "Submit again with the same idempotency_key" in details
        job_id = re.search(r"job ([0-9a-f]{32}) is recorded", details).group(1)  # type: ignore[union-attr]
        # While another Submit with the key is still handing the job over (and
        # may yet fail), a retry is not told it is queued.
        marker = f"attest:answer:sent:default:{job_id}"
        state = redis.Redis.from_url(f"{base}/9")
        state.set(marker, b"sending")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Submit(keyed)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "being handed to the queue by another Submit" in (err.value.details() or "")
        state.delete(marker)  # that Submit failed
        # The same key on a server whose queue works: the same job, now queued.
        retried = (await stub.Submit(keyed)).job
        assert retried.job_id == job_id
        states = await watch(stub, job_id)
        assert states[-1].state == answer_pb2.JOB_STATE_DONE, states[-1].error
        assert states[-1].attempts == 1
        # And once more: it is neither sent nor run again.
        again = (await stub.Submit(keyed)).job
        assert again.job_id == job_id
        assert again.state == answer_pb2.JOB_STATE_DONE

        # Without a key nobody can retry that job: it is FAILED, saying why.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await refusing.Submit(answer_pb2.SubmitRequest(question=CHILD_LABOUR), timeout=60)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        found = re.search(r"take job ([0-9a-f]{32})", err.value.details() or "")
        assert found, err.value.details()
        lost = found.group(1)
        job = (await stub.Get(answer_pb2.GetRequest(job_id=lost))).job
        assert job.state == answer_pb2.JOB_STATE_FAILED
        assert job.error_code == grpc.StatusCode.UNAVAILABLE.value[0]
        assert job.error.startswith("the queue did not take the job: ")
