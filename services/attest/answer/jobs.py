"""Queued answer jobs: records in Redis, and the run of one job on a Celery worker.

A job record is the serialized ``answer.v1.Job`` under
``attest:answer:job:<tenant>:<id>``, expiring ``retention_seconds`` after it
was created and again after it finished. An idempotency key maps to the job
it created for as long as that job is retained. The worker runs the very same
``AnswerPipeline`` as Ask, so both paths give the same answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import redis
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from attest.answer.downstream import GrpcBackends
from attest.answer.options import validate
from attest.answer.pipeline import AnswerPipeline, collect
from attest.answer.settings import AnswerSettings
from attest.answer.v1 import answer_pb2
from attest.core.errors import AttestError, FailedPrecondition, Unavailable

log = logging.getLogger(__name__)

TASK = "attest.answer.run"
QUEUE = "answer"
FINAL = (answer_pb2.JOB_STATE_DONE, answer_pb2.JOB_STATE_FAILED)
#: How long a Submit may take to hand a job to the queue before another may try,
#: at least: well past a publish that waits out a broker restart (the servicer
#: takes three times the pipeline's publish_retry_seconds when that is longer).
SEND_CLAIM_SECONDS = 600
#: Pauses before taking an idempotency key whose job is not recorded (yet).
KEYED_RECORD_WAITS = (0.05, 0.1, 0.25, 0.5)


def _now() -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(datetime.now(UTC))
    return ts


class JobStore:
    """Job records in Redis (blocking calls: run them off the event loop)."""

    def __init__(self, settings: AnswerSettings) -> None:
        if settings.jobs.state_url is None:
            raise FailedPrecondition(
                "queued jobs are not enabled on this server: set ATTEST_ANSWER_JOBS__STATE_URL"
            )
        self._retention = settings.jobs.retention_seconds
        self._r = redis.Redis.from_url(
            settings.jobs.state_url.get_secret_value(), socket_timeout=10
        )

    @staticmethod
    def _key(tenant: str, job_id: str) -> str:
        return f"attest:answer:job:{tenant}:{job_id}"

    def create(
        self, tenant: str, question: str, options: answer_pb2.AskOptions, idempotency_key: str
    ) -> tuple[answer_pb2.Job, bool]:
        """A new QUEUED job, or (with a known key) the retained job of that key."""
        job_id = uuid.uuid4().hex
        if idempotency_key:
            key = f"attest:answer:idem:{tenant}:{idempotency_key}"
            if not self._r.set(key, job_id, nx=True, ex=self._retention):
                job = self._keyed(tenant, key)
                if job is not None:
                    return job, False
                # The key's job is gone (expired, or its Submit died before
                # recording it): the key is this job's now.
                self._r.set(key, job_id, ex=self._retention)
            # So that a job finishing late keeps its key as long as itself.
            self._r.set(self._key_of(tenant, job_id), key, ex=self._retention)
        job = answer_pb2.Job(
            job_id=job_id,
            state=answer_pb2.JOB_STATE_QUEUED,
            question=question,
            options=options,
            created_at=_now(),
        )
        self.put(tenant, job)
        return job, True

    def send_once(
        self,
        tenant: str,
        job_id: str,
        send: Callable[[], object],
        claim_seconds: int = SEND_CLAIM_SECONDS,
    ) -> str:
        """Call ``send`` (hand the job to the queue) unless it was sent already or
        another Submit is sending it. Returns "sent" (by this call), "sent before"
        or "sending" (by another call, which may still fail).

        A send that fails is forgotten (and raises), so the next Submit with the
        job's idempotency key sends it; so is one whose sender died before it
        ended, after ``claim_seconds``. Once ``send`` returned, the job is
        queued, whatever happens to the marker: a marker that cannot be written
        leaves the claim, which expires; a job sent twice then is run by one
        worker at a time (``run_job``'s lease) and left as it is once finished."""
        key = f"attest:answer:sent:{tenant}:{job_id}"
        if not self._r.set(key, b"sending", nx=True, ex=claim_seconds):
            return "sent before" if self._r.get(key) == b"sent" else "sending"
        try:
            send()
        except BaseException:
            with contextlib.suppress(redis.RedisError):
                self._r.delete(key)
            raise
        try:
            self._r.set(key, b"sent", ex=self._retention)
        except redis.RedisError as exc:
            log.warning("job %s was queued; its sent marker was not written: %s", job_id, exc)
        return "sent"

    def lease(self, key: str, seconds: int) -> bool:
        """Take ``key`` for ``seconds`` unless another holder has it."""
        return bool(self._r.set(key, b"1", nx=True, ex=seconds))

    def release(self, key: str) -> None:
        self._r.delete(key)

    @staticmethod
    def _key_of(tenant: str, job_id: str) -> str:
        return f"attest:answer:idemof:{tenant}:{job_id}"

    def _keyed(self, tenant: str, key: str) -> answer_pb2.Job | None:
        """The job an idempotency key maps to. A Submit that has just set the key
        writes the job a moment later: it is waited for, briefly, rather than
        taken for gone (which would make a second job for the key)."""
        for wait in (0.0, *KEYED_RECORD_WAITS):
            time.sleep(wait)
            existing = self._r.get(key)
            if existing is None:
                return None
            job = self.get(tenant, existing.decode())
            if job is not None:
                return job
        return None

    def get(self, tenant: str, job_id: str) -> answer_pb2.Job | None:
        raw = self._r.get(self._key(tenant, job_id))
        if raw is None:
            return None
        job = answer_pb2.Job()
        job.ParseFromString(raw)
        return job

    def put(self, tenant: str, job: answer_pb2.Job) -> None:
        finished = job.state in FINAL and not job.HasField("expires_at")
        if finished:
            job.expires_at.FromDatetime(datetime.now(UTC) + timedelta(seconds=self._retention))
        self._r.set(self._key(tenant, job.job_id), job.SerializeToString(), ex=self._retention)
        if finished:
            # Its idempotency key maps to it for as long as it is kept.
            key = self._r.get(self._key_of(tenant, job.job_id))
            if key is not None:
                self._r.expire(key, self._retention)
                self._r.expire(self._key_of(tenant, job.job_id), self._retention)

    def close(self) -> None:
        self._r.close()


async def answer_job(
    settings: AnswerSettings, tenant: str, job: answer_pb2.Job
) -> answer_pb2.Answer:
    """Run the pipeline for a job exactly as Ask would, within its own budget, reading
    the stores of the tenant that submitted it."""
    plan = validate(job.question, job.options, settings, deadline_seconds=None)
    backends = GrpcBackends(settings, tenant=tenant)
    try:
        return await collect(AnswerPipeline(backends, settings).run(plan))
    finally:
        await backends.close()


def run_job(settings: AnswerSettings, tenant: str, job_id: str, *, last_attempt: bool) -> bool:
    """One attempt at a job on a worker; False when it should be retried later.

    Idempotent: a job already DONE or FAILED (or expired) is left as it is, and
    one that another worker is running is left to it (False: tried again later).
    """
    store = JobStore(settings)
    lease = f"attest:answer:run:{tenant}:{job_id}"
    try:
        job = store.get(tenant, job_id)
        if job is None or job.state in FINAL:
            return True
        # One worker at a time on a job: a task delivered twice (a Submit retried
        # after its marker was lost, a redelivery) waits for the first to end,
        # or for its lease to lapse when that worker died mid-run.
        held_for = int(settings.limits.max_budget_seconds) + 60
        if not store.lease(lease, held_for):
            return False
        job = store.get(tenant, job_id)
        if job is None or job.state in FINAL:
            store.release(lease)
            return True
        job.state = answer_pb2.JOB_STATE_RUNNING
        job.attempts += 1
        if not job.HasField("started_at"):
            job.started_at.CopyFrom(_now())
        store.put(tenant, job)
        try:
            answer = asyncio.run(answer_job(settings, tenant, job))
        except Unavailable as exc:
            if not last_attempt:
                job.state = answer_pb2.JOB_STATE_QUEUED
                store.put(tenant, job)
                return False
            _fail(job, exc)
        except AttestError as exc:
            _fail(job, exc)
        else:
            queued = Duration()
            queued.FromNanoseconds(
                max(0, job.started_at.ToNanoseconds() - job.created_at.ToNanoseconds())
            )
            answer.timings.insert(0, answer_pb2.StageTiming(stage=answer_pb2.STAGE_QUEUED))
            answer.timings[0].duration.CopyFrom(queued)
            job.state = answer_pb2.JOB_STATE_DONE
            job.answer.CopyFrom(answer)
        job.finished_at.CopyFrom(_now())
        store.put(tenant, job)
        return True
    finally:
        with contextlib.suppress(redis.RedisError):
            store.release(lease)
        store.close()


def _fail(job: answer_pb2.Job, exc: AttestError) -> None:
    import grpc

    job.state = answer_pb2.JOB_STATE_FAILED
    job.error_code = grpc.StatusCode[exc.code].value[0]
    job.error = exc.details


def backoff(settings: AnswerSettings, retries: int) -> float:
    return float(settings.jobs.retry_backoff_seconds * 2.0**retries)
