"""gRPC servicer of the answer service: validate the request, run the pipeline, return it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from attest.answer.downstream import GrpcBackends
from attest.answer.jobs import FINAL, QUEUE, SEND_CLAIM_SECONDS, TASK, JobStore
from attest.answer.limits import LimitedBackends
from attest.answer.options import validate
from attest.answer.pipeline import AnswerPipeline, Backends, collect
from attest.answer.settings import AnswerSettings
from attest.answer.v1 import answer_pb2, answer_pb2_grpc
from attest.core.admission import Limiter
from attest.core.context import granted_seconds, remaining_seconds, tenant_var
from attest.core.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from attest.core.interceptors import Shedder

if TYPE_CHECKING:
    from celery import Celery

Context = grpc.aio.ServicerContext[Any, Any]
_T = TypeVar("_T")
_NO_JOBS = (
    "queued jobs are not enabled on this server: set ATTEST_ANSWER_JOBS__STATE_URL and "
    "ATTEST_PIPELINE_BROKER_URL, and run `attest worker --queues answer`"
)


class AnswerServicer(answer_pb2_grpc.AnswerServiceServicer):
    service_name = answer_pb2.DESCRIPTOR.services_by_name["AnswerService"].full_name

    def __init__(
        self,
        settings: AnswerSettings,
        backends: Backends | None = None,
        celery: Celery | None = None,
    ) -> None:
        self.settings = settings
        self._celery = celery
        self._jobs: JobStore | None = None
        self._grpc = GrpcBackends(settings) if backends is None else None
        # Admission covers the pipeline and each of its downstream calls: at most
        # max_in_flight answers, a short queue, and a limit per downstream service.
        limits = settings.limits
        self.backends = LimitedBackends(backends or self._grpc or GrpcBackends(settings), limits)
        self.pipeline = AnswerPipeline(self.backends, settings)
        self.admission = Limiter(
            "answer",
            limits.max_in_flight,
            limits.max_waiting,
            limits.max_queue_seconds,
            noun="answers",
            # Never more than half the budget in the queue: what is left must
            # still be enough to answer, and a refusal leaves time to retry.
            budget_share=0.5,
            wait_grace=limits.queue_grace,
        )

    def register(self, server: grpc.aio.Server) -> None:
        answer_pb2_grpc.add_AnswerServiceServicer_to_server(self, server)

    def shedders(self) -> dict[str, Shedder]:
        """Ask and AskStream are refused before any other work while admission is full."""
        return {
            f"/{self.service_name}/{name}": self.admission.refusal for name in ("Ask", "AskStream")
        }

    async def warm_up(self) -> None:
        # Nothing to load: a dependency that is down is a degradation, not a reason
        # to stay NOT_SERVING.
        return None

    async def close(self) -> None:
        if self._grpc is not None:
            await self._grpc.close()
        if self._jobs is not None:
            self._jobs.close()

    async def _events(
        self, question: str, options: answer_pb2.AskOptions
    ) -> AsyncIterator[answer_pb2.AskStreamResponse]:
        plan = validate(
            question,
            options,
            self.settings,
            deadline_seconds=remaining_seconds(),
            granted_seconds=granted_seconds(),
        )
        async with self.admission.slot(plan.budget_seconds) as waited:
            plan = dataclasses.replace(plan, budget_seconds=plan.budget_seconds - waited)
            async for event in self.pipeline.run(plan):
                yield event

    async def Ask(self, request: answer_pb2.AskRequest, context: Context) -> answer_pb2.AskResponse:
        answer = await collect(self._events(request.question, request.options))
        return answer_pb2.AskResponse(answer=answer)

    async def AskStream(
        self, request: answer_pb2.AskStreamRequest, context: Context
    ) -> AsyncIterator[answer_pb2.AskStreamResponse]:
        async for event in self._events(request.question, request.options):
            yield event

    # -- queued jobs: records in Redis, the pipeline on Celery workers ------------------

    def _store(self) -> JobStore:
        if self._jobs is None:
            self._jobs = JobStore(self.settings)
        return self._jobs

    async def Submit(
        self, request: answer_pb2.SubmitRequest, context: Context
    ) -> answer_pb2.SubmitResponse:
        store = self._store()
        if self._celery is None:
            raise FailedPrecondition(_NO_JOBS)
        if len(request.idempotency_key) > 128:
            raise InvalidArgument("is longer than 128 characters", field="idempotency_key")
        # Bad input fails now, not on a worker; the job's budget is its own.
        validate(request.question, request.options, self.settings, deadline_seconds=None)
        tenant = tenant_var.get()
        job, created = await _stored(
            store.create, tenant, request.question, request.options, request.idempotency_key
        )
        # A job is handed to the queue once: when created, or (a retry with its
        # key) when the Submit that created it failed before it was sent.
        if job.state != answer_pb2.JOB_STATE_QUEUED or (not created and job.attempts > 0):
            return answer_pb2.SubmitResponse(job=job)
        await self._send(store, tenant, job, keyed=bool(request.idempotency_key))
        return answer_pb2.SubmitResponse(job=job)

    async def _send(
        self, store: JobStore, tenant: str, job: answer_pb2.Job, *, keyed: bool
    ) -> None:
        from celery.exceptions import BackendError, OperationalError
        from redis import RedisError

        celery = self._celery
        assert celery is not None

        def send() -> None:
            # The job record carries the answer: no result store is asked to
            # wait for one (a result store that is down would fail the send).
            celery.send_task(TASK, args=[tenant, job.job_id], queue=QUEUE, ignore_result=True)

        pipeline = celery.conf.get("attest_settings")
        publish = float(getattr(pipeline, "publish_retry_seconds", 0.0))
        claim = max(SEND_CLAIM_SECONDS, int(3 * publish))
        try:
            outcome = await asyncio.to_thread(store.send_once, tenant, job.job_id, send, claim)
        except (OperationalError, BackendError, RedisError, OSError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if keyed:
                raise Unavailable(
                    f"job {job.job_id} is recorded but the queue did not take it ({reason}); "
                    "Submit again with the same idempotency_key to queue it"
                ) from exc
            # Nobody can ask for this job again: it says why it never ran.
            job.state = answer_pb2.JOB_STATE_FAILED
            job.error_code = grpc.StatusCode.UNAVAILABLE.value[0]
            job.error = f"the queue did not take the job: {reason}"
            job.finished_at.GetCurrentTime()
            with contextlib.suppress(RedisError):
                await asyncio.to_thread(store.put, tenant, job)
            raise Unavailable(
                f"the queue did not take job {job.job_id} ({reason}); nothing will run it: "
                "submit again (with an idempotency_key, a retry cannot queue it twice)"
            ) from exc
        if outcome == "sending":
            # Another Submit with this key is handing the job to the queue and may
            # yet fail: OK now could leave the caller watching a job nothing runs.
            raise Unavailable(
                f"job {job.job_id} is being handed to the queue by another Submit with this "
                "idempotency_key; Submit again to learn whether it was queued"
            )

    async def _job(self, job_id: str) -> answer_pb2.Job:
        if not job_id or len(job_id) > 64:
            raise InvalidArgument("must be a job id from Submit", field="job_id")
        job = await _stored(self._store().get, tenant_var.get(), job_id)
        if job is None:
            raise NotFound(f"no job {job_id[:64]!r} (unknown, another tenant's, or expired)")
        return job

    async def Get(self, request: answer_pb2.GetRequest, context: Context) -> answer_pb2.GetResponse:
        return answer_pb2.GetResponse(job=await self._job(request.job_id))

    async def Watch(
        self, request: answer_pb2.WatchRequest, context: Context
    ) -> AsyncIterator[answer_pb2.WatchResponse]:
        job = await self._job(request.job_id)
        yield answer_pb2.WatchResponse(job=job)
        seen = (job.state, job.attempts)
        while job.state not in FINAL:
            await asyncio.sleep(self.settings.jobs.watch_interval_seconds)
            job = await self._job(request.job_id)
            if (job.state, job.attempts) != seen:
                seen = (job.state, job.attempts)
                yield answer_pb2.WatchResponse(job=job)


async def _stored(call: Callable[..., _T], *args: Any) -> _T:
    """A job store call off the event loop; the store unreachable is UNAVAILABLE."""
    from redis import RedisError

    try:
        return await asyncio.to_thread(call, *args)
    except RedisError as exc:
        raise Unavailable(f"the job store is unreachable ({type(exc).__name__}: {exc})") from exc
