"""Ingestion on Celery: enrich, embed and index tasks on their own queues.

Each task runs one stage for one batch through ``attest.ingest.jobs.StageRunner``
and sends the batch on to the next queue. Tasks are idempotent (progress is
kept as sets of item indexes, the stores upsert by document id), so a
redelivered or replayed task overwrites instead of duplicating. Delivery:

* a stage queues its batch for the next stage before it records the batch's
  progress, so progress counts only work that a killed worker cannot take
  with it (the vectors of an embedded batch are in the index task's message);
* late acknowledgement, and a task whose worker process dies is requeued;
  after ``max_deliveries`` deliveries of the same attempt its documents are
  reported as failed instead of being tried forever;
* a running task keeps its delivery alive (``_Heartbeat``): Redis gives a
  task back to the queue when it has been unacknowledged for the visibility
  timeout, and without a heartbeat that includes tasks that are simply
  slower than the timeout (a fresh worker loading its model, a batch on a
  busy machine) — they ran twice or more, each copy counted as a delivery,
  and the copies kept the one-process workers busy. With it, only the task
  of a worker that stopped beating (died) comes back after the timeout;
* transient failures (a store unavailable or overloaded) are retried with
  exponential backoff and jitter for at least ``retry_window_seconds`` from
  the task's first such failure (and at least ``max_retries`` times): a count
  alone, with full jitter, gave up after as little as 8 s, less than an
  OpenSearch node takes to restart, and failed every document it held;
  anything else fails the batch's documents at once, each reported in the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from celery import Celery, Task
from celery.utils.time import get_exponential_backoff_interval

from attest.ingest.documents import FailureCode
from attest.ingest.jobs import TRANSIENT, Batch, StageRunner
from attest.ingest.state import PREFIX, JobStore, RedisKeyValue
from attest.pipeline.settings import PipelineSettings

log = logging.getLogger(__name__)

ENRICH = "attest.ingest.enrich"
EMBED = "attest.ingest.embed"
INDEX = "attest.ingest.index"
_STAGES = {ENRICH: "ENRICH", EMBED: "EMBED", INDEX: "INDEX"}


class _Process:
    """Per-process resources: built on first use inside the pool child, so that
    no model, socket or event loop crosses a fork."""

    def __init__(self, settings: PipelineSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._runner: StageRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def runner(self) -> StageRunner:
        with self._lock:
            if self._runner is None:
                s = self.settings
                store = JobStore(RedisKeyValue(s.state_url.get_secret_value()))
                self._runner = StageRunner(
                    store, s.enrich, embedding=self._embedding, sinks=self._sinks
                )
            return self._runner

    def _embedding(self) -> Any:
        from attest.ingest.stages import Embedding
        from attest.knowledge.graph import load_graph
        from attest.semantic.embedding import Embedder

        e = self.settings.embed
        encoder = Embedder(e.model, device=e.device, batch_size=e.batch_size, backend=e.backend)
        encoder.warm_up()
        return Embedding.build(encoder, load_graph(e.graph_path))

    def _sinks(self) -> Any:
        from attest.ingest.sinks import GrpcSinks

        s = self.settings
        return GrpcSinks(s.lexical_address, s.semantic_address, s.client)

    def run(self, coro: Any) -> Any:
        # One loop per process: the gRPC channels of the sinks belong to it.
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)


class _Heartbeat:
    """While a task runs, refresh its entry in kombu's index of unacknowledged
    Redis messages, so that the visibility timeout counts from the last beat of
    a live worker instead of from the delivery.

    kombu restores a message whose index score (the delivery time) is older
    than the visibility timeout; ``ZADD XX`` moves the score to now and never
    adds an entry that the acknowledgement (or a restore) already removed.
    """

    def __init__(self, app: Celery, interval: float) -> None:
        self.app = app
        self.interval = interval
        options = app.conf.broker_transport_options or {}
        self.key = str(options.get("global_keyprefix", "")) + str(
            options.get("unacked_index_key", "unacked_index")
        )
        self._client: Any = None

    def _beat(self, tag: str) -> None:
        import redis

        if self._client is None:
            self._client = redis.Redis.from_url(
                self.app.conf.broker_url, socket_timeout=5, socket_connect_timeout=5
            )
        try:
            self._client.zadd(self.key, {tag: time.time()}, xx=True)
        except redis.RedisError as err:
            # A missed beat only risks a redelivery, which the stages tolerate.
            log.warning("heartbeat of delivery %s failed: %s", tag, err)

    @contextlib.contextmanager
    def running(self, tag: str | None) -> Iterator[None]:
        if not tag:
            yield
            return
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(self.interval):
                self._beat(tag)

        thread = threading.Thread(target=loop, name=f"heartbeat-{tag[:8]}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=self.interval + 6)


def _items(name: str, args: Sequence[Any]) -> list[tuple[int, str]]:
    """(item index, doc id) pairs a task's arguments cover."""
    payload = args[2] if len(args) > 2 else []
    if name == ENRICH:
        return [(int(i), "") for i, _ in payload]
    return [(int(r["item"]), str(r["article"]["id"])) for r in payload]


def register(app: Celery) -> None:
    settings: PipelineSettings = app.conf["attest_settings"]
    process = _Process(settings)
    heartbeat = _Heartbeat(app, max(1.0, settings.visibility_timeout_seconds / 5))

    class IngestTask(Task):  # type: ignore[misc]
        """Counts deliveries, retries transient failures, and reports the documents
        of a batch that finally failed."""

        acks_late = True
        reject_on_worker_lost = True
        ignore_result = True
        # Celery's own limit stays off: ``_attempt`` decides when to give up.
        max_retries = None

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            request = self.request
            if request.id and not request.is_eager:
                key = f"{request.id}:{request.retries}"
                deliveries = process.runner.store.delivery(
                    key, settings.visibility_timeout_seconds * (settings.max_deliveries + 2)
                )
                if deliveries > settings.max_deliveries:
                    log.error(
                        "%s[%s] delivered %d times; giving up its batch",
                        self.name,
                        request.id,
                        deliveries,
                    )
                    self._fail(
                        args,
                        f"given up after {deliveries - 1} deliveries without "
                        "finishing (its worker died each time)",
                    )
                    return None
            if request.is_eager:
                return self._attempt(args, kwargs)
            tag = (getattr(request, "properties", None) or {}).get("delivery_tag")
            with heartbeat.running(tag):
                return self._attempt(args, kwargs)

        def _attempt(self, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
            """Run the task; after a transient failure, send it again with backoff
            until it has failed for ``retry_window_seconds`` and ``max_retries``
            retries, then let it fail (``on_failure``)."""
            try:
                return super().__call__(*args, **kwargs)
            except TRANSIENT as exc:
                retries = int(self.request.retries)
                failing = self._failing_for()
                if retries >= settings.max_retries and failing >= settings.retry_window_seconds:
                    raise
                countdown = get_exponential_backoff_interval(
                    factor=1,
                    retries=retries,
                    maximum=settings.retry_backoff_max_seconds,
                    full_jitter=True,
                )
                raise self.retry(exc=exc, countdown=countdown) from exc

        def _failing_for(self) -> float:
            """Seconds since this task's first transient failure (shared by its
            retries, which keep the task id, on whichever worker they run)."""
            task_id = self.request.id
            if not task_id:
                return float("inf")
            kv = process.runner.store.kv
            key = f"{PREFIX}transient:{task_id}"
            now = time.time()
            kv.hsetnx(key, "since", repr(now))
            kv.expire([key], int(settings.retry_window_seconds) + 24 * 3600)
            since = kv.hget(key, "since")
            return now - float(since) if since else 0.0

        def _fail(self, args: Sequence[Any], reason: str) -> None:
            runner = process.runner
            job_id = str(args[0])
            done = runner.store.indexed_items(job_id)
            items = [(i, d) for i, d in _items(self.name, args) if i not in done]
            runner.fail_items(
                job_id, _STAGES[self.name], items, FailureCode.PROCESSING_ERROR.value, reason
            )

        def on_failure(
            self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
        ) -> None:
            reason = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, TRANSIENT):
                reason = (
                    f"still failing after {self.request.retries} retries over "
                    f"{self._failing_for():.0f} s: {reason}"
                )
            self._fail(args, reason)

    options = {"base": IngestTask, "bind": True}

    # Each stage queues its batch for the next one before its progress is
    # recorded (``handoff``): progress then counts only work that outlives
    # this process.
    @app.task(name=ENRICH, **options)  # type: ignore[untyped-decorator]
    def enrich(self: Task, job_id: str, tenant: str, batch: Batch) -> None:
        process.runner.enrich(
            job_id,
            tenant,
            batch,
            handoff=lambda records: app.send_task(EMBED, args=[job_id, tenant, records]),
        )

    @app.task(name=EMBED, **options)  # type: ignore[untyped-decorator]
    def embed(self: Task, job_id: str, tenant: str, records: list[dict[str, Any]]) -> None:
        process.runner.embed(
            job_id,
            records,
            handoff=lambda embedded: app.send_task(INDEX, args=[job_id, tenant, embedded]),
        )

    @app.task(name=INDEX, **options)  # type: ignore[untyped-decorator]
    def index(self: Task, job_id: str, tenant: str, records: list[dict[str, Any]]) -> None:
        process.run(process.runner.index(job_id, tenant, records))


class CeleryDispatcher:
    """Sends each batch to the enrich queue (the ingest service side)."""

    def __init__(self, app: Celery) -> None:
        self.app = app

    def dispatch(self, job_id: str, tenant: str, batches: Sequence[Batch]) -> None:
        for batch in batches:
            self.app.send_task(ENRICH, args=[job_id, tenant, batch])
