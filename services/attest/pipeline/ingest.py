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
  anything else fails the batch's documents at once, each reported in the job;
* every task is noted in the job state before it is sent and forgotten when it
  finishes (``JobStore.track``), and the ingest service's ``Watchdog`` sends
  again the items that no task in a queue or on a worker holds any more. The
  Redis transport pops a message (BRPOP) and only then, client-side, records
  it as unacknowledged: a worker killed between the two takes the message
  with it, in no queue and in no index the visibility timeout restores from.
  Without the watchdog such a job stayed RUNNING forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from celery import Celery, Task
from celery.utils.time import get_exponential_backoff_interval
from prometheus_client import Counter

from attest.ingest.documents import FailureCode
from attest.ingest.jobs import TRANSIENT, Batch, StageRunner
from attest.ingest.state import PREFIX, JobStore, RedisKeyValue, TrackedTask
from attest.pipeline.metrics import PRIORITY_SUFFIXES
from attest.pipeline.queues import QUEUE_EMBED, QUEUE_ENRICH, QUEUE_INDEX
from attest.pipeline.settings import PipelineSettings

if TYPE_CHECKING:
    from attest.ingest.jobs import IngestCore

log = logging.getLogger(__name__)

ENRICH = "attest.ingest.enrich"
EMBED = "attest.ingest.embed"
INDEX = "attest.ingest.index"
_STAGES = {ENRICH: "ENRICH", EMBED: "EMBED", INDEX: "INDEX"}

RESENT = Counter(
    "attest_ingest_items_resent_total",
    "Items of a job sent through the pipeline again because no task in a queue or on a "
    "worker held them any more (a message the broker lost with a killed worker).",
)


def send(
    app: Celery,
    store: JobStore,
    name: str,
    job_id: str,
    tenant: str,
    payload: list[Any],
    items: Sequence[int],
) -> str:
    """Send a stage task, noting it in the job state first: a crash between the
    two leaves a note without a message, which the watchdog treats as lost."""
    task_id = str(uuid.uuid4())
    store.track(job_id, task_id, _STAGES[name], items)
    # The job state records every outcome: no result store is asked to wait for one.
    app.send_task(name, args=[job_id, tenant, payload], task_id=task_id, ignore_result=True)
    return task_id


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
                    self._finished(args)
                    return None
            if request.is_eager:
                result = self._attempt(args, kwargs)
            else:
                tag = (getattr(request, "properties", None) or {}).get("delivery_tag")
                with heartbeat.running(tag):
                    result = self._attempt(args, kwargs)
            self._finished(args)
            return result

        def _finished(self, args: Sequence[Any]) -> None:
            """Forget this task in the job state (it ran, or its items are reported
            failed). Best effort: a note left behind only costs the watchdog a look,
            and failing here would report the items of a batch that succeeded."""
            if not self.request.id:
                return
            import redis

            try:
                process.runner.store.untrack(str(args[0]), [self.request.id])
            except redis.RedisError as err:
                log.warning("could not forget finished task %s: %s", self.request.id, err)

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
                self._noted_again(args)
                raise self.retry(exc=exc, countdown=countdown) from exc

        def _noted_again(self, args: Sequence[Any]) -> None:
            """A retry is a new message under the same task id: note when it was
            sent, which the watchdog orders queued messages by."""
            import redis

            if not self.request.id:
                return
            items = [i for i, _ in _items(self.name, args)]
            try:
                process.runner.store.track(str(args[0]), self.request.id, _STAGES[self.name], items)
            except redis.RedisError as err:
                log.warning("could not note retried task %s: %s", self.request.id, err)

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
            self._finished(args)

    options = {"base": IngestTask, "bind": True}

    # Each stage queues its batch for the next one before its progress is
    # recorded (``handoff``): progress then counts only work that outlives
    # this process.
    @app.task(name=ENRICH, **options)  # type: ignore[untyped-decorator]
    def enrich(self: Task, job_id: str, tenant: str, batch: Batch) -> None:
        store = process.runner.store
        # Smallest items first, each slice handed to the embed queue as it is
        # enriched: a large item does not hold the small ones of its batch.
        for part in process.runner.slices(job_id, batch):
            process.runner.enrich(
                job_id,
                tenant,
                part,
                handoff=lambda records: send(
                    app, store, EMBED, job_id, tenant, records, [r["item"] for r in records]
                ),
            )

    @app.task(name=EMBED, **options)  # type: ignore[untyped-decorator]
    def embed(self: Task, job_id: str, tenant: str, records: list[dict[str, Any]]) -> None:
        store = process.runner.store
        process.runner.embed(
            job_id,
            records,
            handoff=lambda embedded: send(
                app, store, INDEX, job_id, tenant, embedded, [r["item"] for r in embedded]
            ),
        )

    @app.task(name=INDEX, **options)  # type: ignore[untyped-decorator]
    def index(self: Task, job_id: str, tenant: str, records: list[dict[str, Any]]) -> None:
        process.run(process.runner.index(job_id, tenant, records))


class CeleryDispatcher:
    """Sends each batch to the enrich queue (the ingest service side)."""

    def __init__(self, app: Celery, store: JobStore) -> None:
        self.app = app
        self.store = store

    def dispatch(self, job_id: str, tenant: str, batches: Sequence[Batch]) -> None:
        for batch in batches:
            send(self.app, self.store, ENRICH, job_id, tenant, batch, [int(i) for i, _ in batch])
        self.store.mark_dispatched(job_id)


# Where a message keeps its task id: its properties, which come last, after a
# body that may be megabytes of vectors, so the id is looked for in the tail.
_LOOK = """
local pattern = '"correlation_id":%s*"([^"]*)"'
local function task_id(message)
  return string.match(message, pattern, -2048) or string.match(message, pattern)
end
"""

# A cheap first look, in one atomic step: which of the task ids (ARGV) kombu's
# unacknowledged hash holds (KEYS[1]: deliveries workers hold, running or
# reserved), and the task id of the oldest message of each queue (the other
# KEYS; false for an empty one), the next a worker pops.
_FIRST_LOOK_SCRIPT = (
    _LOOK
    + """
local want = {}
for i = 1, #ARGV do want[ARGV[i]] = true end
local held = {}
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do
  local id = task_id(v)
  if id and want[id] then held[#held + 1] = id end
end
local oldest = {}
for k = 2, #KEYS do
  local v = redis.call('LINDEX', KEYS[k], -1)
  oldest[k - 1] = v and task_id(v) or false
end
return {held, oldest}
"""
)

# The full look: which of the task ids (ARGV) are in the unacknowledged hash
# (KEYS[1]) or anywhere in the queues (the other KEYS), and how many list reads
# it took. It reads every queued message (about 0.3-0.4 s per 100 MB of queue,
# during which Redis serves no one else), so it runs only for tasks the first
# look could not place, and stops as soon as it has found them all.
#
# A queue is read a page at a time: LRANGE's reply, and its copy in the script,
# are held whole. A page is at most 16 messages, and halves (down to 1) while
# the last one read more than PAGE_BYTES, doubling back while it read under
# half that: index tasks carry megabytes of vectors each. The size of the
# messages to come is unknown until they are read, so a page never grows past
# 16, the most any page can hold being 16 of the largest message.
_FULL_LOOK_PAGE_BYTES = 4 << 20
_FULL_LOOK_MAX_PAGE = 16
_HELD_SCRIPT = (
    _LOOK
    + f"""
local PAGE_BYTES = {_FULL_LOOK_PAGE_BYTES}
local MAX_PAGE = {_FULL_LOOK_MAX_PAGE}
"""
    + """
local want = {}
local left = 0
for i = 1, #ARGV do
  if not want[ARGV[i]] then left = left + 1 end
  want[ARGV[i]] = true
end
local found = {}
local function look(message)
  local id = task_id(message)
  if id and want[id] then
    found[#found + 1] = id
    want[id] = nil
    left = left - 1
  end
end
for _, v in ipairs(redis.call('HVALS', KEYS[1])) do look(v) end
local reads = 0
for k = 2, #KEYS do
  local n = redis.call('LLEN', KEYS[k])
  local start, page = 0, MAX_PAGE
  while start < n and left > 0 do
    local got = redis.call('LRANGE', KEYS[k], start, start + page - 1)
    reads = reads + 1
    if #got == 0 then break end
    local bytes = 0
    for _, v in ipairs(got) do
      look(v)
      bytes = bytes + #v
    end
    start = start + #got
    if bytes > PAGE_BYTES then
      page = math.max(1, math.floor(page / 2))
    elseif bytes * 2 <= PAGE_BYTES then
      page = math.min(MAX_PAGE, page * 2)
    end
  end
end
return {found, reads}
"""
)

# Deletes the lock (KEYS[1]) only while it still holds this check's token (ARGV[1]).
_RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_STAGE_QUEUES = {"ENRICH": QUEUE_ENRICH, "EMBED": QUEUE_EMBED, "INDEX": QUEUE_INDEX}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Watchdog:
    """Sends again the items of a sealed job that no pipeline task holds.

    Each check compares, per open job, the items not yet finished with the
    items of its noted tasks (``JobStore.track``) that the broker still holds:
    in a queue, or unacknowledged on a worker (kombu's ``unacked`` hash, which
    the visibility timeout restores from). An item held by none is orphaned:
    its task's message was lost (popped by a worker killed before it recorded
    it), or the process that sealed the job died before sending it (a job not
    marked dispatched ``undispatched_after_seconds`` after its seal). An item
    orphaned on two checks at least ``confirm_seconds`` apart goes through the
    pipeline again from the enrich stage (``IngestCore.resend``); the two
    looks keep a message that a live worker has popped and is recording, a
    matter of milliseconds, from being sent twice. An item sent again and
    orphaned again waits twice as long each time. Every stage is idempotent,
    so a duplicate costs work and never a wrong count.

    Finding a task costs little: a queue is first in, first out, so a task sent
    after the oldest message still queued has not been popped yet, and is
    held. Only a task sent before it and not on a worker, or any task of a
    stage whose oldest message is not a noted task, is looked for through the
    stage's whole queue (it may have been put back behind younger ones by a
    requeue); one found there counts as held for four intervals.

    Jobs created by a release that did not note its tasks are left alone.
    Replicas of the service take turns (a lock in the broker, released when a
    check ends); a replica whose previous look is older than one and a half
    intervals starts its confirmations afresh.
    """

    def __init__(
        self,
        app: Celery,
        core: IngestCore,
        interval_seconds: float,
        *,
        undispatched_after_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.app = app
        self.core = core
        self.interval = interval_seconds
        self.confirm_seconds = interval_seconds / 2
        self.undispatched_after = (
            max(300.0, 10 * interval_seconds)
            if undispatched_after_seconds is None
            else undispatched_after_seconds
        )
        self._clock = clock
        options = app.conf.broker_transport_options or {}
        prefix = str(options.get("global_keyprefix", ""))
        self._unacked = prefix + str(options.get("unacked_key", "unacked"))
        self._stages = list(_STAGE_QUEUES)
        self._heads = [prefix + _STAGE_QUEUES[stage] for stage in self._stages]
        self._lists = {
            stage: [prefix + queue + suffix for suffix in PRIORITY_SUFFIXES]
            for stage, queue in _STAGE_QUEUES.items()
        }
        self._lock = prefix + f"{PREFIX}watchdog"
        self._client: Any = None
        self._scripts: dict[str, Any] = {}
        self._orphaned: dict[str, dict[int, float]] = {}  # job -> item -> first seen
        self._resends: dict[str, dict[int, int]] = {}  # job -> item -> times sent again
        self._missing: dict[str, float] = {}  # task id -> first seen missing
        self._queued: dict[str, float] = {}  # task id -> last found by a full look
        self._last: float | None = None
        self._stopping = False
        # One check at a time; ``_idle`` is clear while one runs, for ``close``.
        self._checking = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        #: Tasks looked for in whole queues, and the list reads (LRANGE) that
        #: took, over this watchdog's life.
        self.full_looks = 0
        self.full_look_reads = 0

    def _redis(self) -> Any:
        if self._client is None:
            import redis

            if self._stopping:
                # Closed while a check was still running: it makes no new connection.
                raise redis.ConnectionError("the pipeline watchdog is closed")

            self._client = redis.Redis.from_url(
                self.app.conf.broker_url, socket_timeout=30, socket_connect_timeout=5
            )
            self._scripts = {
                "first": self._client.register_script(_FIRST_LOOK_SCRIPT),
                "held": self._client.register_script(_HELD_SCRIPT),
                "release": self._client.register_script(_RELEASE_SCRIPT),
            }
        return self._client

    def held(self, tasks: Mapping[str, TrackedTask]) -> set[str]:
        """The tasks among ``tasks`` that the broker holds, looked for on the
        workers and through their stages' whole queues (the full look)."""
        if not tasks:
            return set()
        self._redis()
        self.full_looks += len(tasks)
        stages = sorted({t.stage for t in tasks.values()})
        keys = [self._unacked, *(k for stage in stages for k in self._lists.get(stage, []))]
        found, reads = self._scripts["held"](keys=keys, args=list(tasks))
        self.full_look_reads += int(reads)
        return {_text(f) for f in found}

    def _held_of(self, tasks: Mapping[str, TrackedTask]) -> set[str]:
        """The tasks among ``tasks`` that the broker holds: the first look, then
        the full look for what it could not place."""
        if not tasks:
            return set()
        self._redis()
        on_workers, oldest = self._scripts["first"](
            keys=[self._unacked, *self._heads], args=list(tasks)
        )
        held = {_text(t) for t in on_workers}
        # When each stage's oldest queued message was sent: anything sent since
        # is still queued. An empty queue holds nothing, and an oldest message
        # that is not a noted task (a task of an older release, or a duplicate
        # of a finished one) places nothing: both leave everything to the full
        # look.
        since: dict[str, float] = {}
        for stage, head in zip(self._stages, oldest, strict=True):
            noted = tasks.get(_text(head)) if head else None
            since[stage] = noted.sent_at if noted is not None else float("inf")
        now = self._clock()
        recent = now - 4 * self.interval
        self._queued = {t: at for t, at in self._queued.items() if at >= recent and t in tasks}
        unplaced: dict[str, TrackedTask] = {}
        for task_id, task in tasks.items():
            if task_id in held:
                continue
            if task.sent_at >= since.get(task.stage, float("inf")) or task_id in self._queued:
                held.add(task_id)
            else:
                unplaced[task_id] = task
        found = self.held(unplaced)
        for task_id in found:
            self._queued[task_id] = now
        return held | found

    def check(self) -> dict[str, list[int]]:
        """One check; the items sent again, by job. Skipped (``{}``) while another
        replica's check holds the lock, or once the watchdog is closing."""
        with self._checking:
            if self._stopping:
                return {}
            self._idle.clear()
            try:
                client = self._redis()
                release = self._scripts["release"]
                token = uuid.uuid4().hex
                ttl_ms = int(max(120.0, 10 * self.interval) * 1000)
                if not client.set(self._lock, token, nx=True, px=ttl_ms):
                    return {}
                try:
                    return self._check()
                finally:
                    release(keys=[self._lock], args=[token], client=client)
            finally:
                if self._stopping:
                    # ``close`` stopped waiting for this check: its connection
                    # is closed here, once the check is done with it.
                    self._disconnect()
                self._idle.set()

    def _disconnect(self) -> None:
        client, self._client = self._client, None
        self._scripts = {}
        if client is not None:
            client.close()

    def _jobs(self, wall: float) -> dict[str, str]:
        """The open jobs to look at, with their tenants."""
        store = self.core.store
        jobs: dict[str, str] = {}
        for job_id in store.open_jobs():
            state = store.watch_state(job_id)
            if not (state.sealed and state.tasks_noted and state.tenant is not None):
                continue
            if not state.dispatched and wall - (state.sealed_at or wall) < self.undispatched_after:
                continue  # its batches may still be being sent
            jobs[job_id] = state.tenant
        return jobs

    def _check(self) -> dict[str, list[int]]:
        store = self.core.store
        now = self._clock()
        if self._last is not None and now - self._last > 1.5 * self.interval:
            # Other replicas checked meanwhile: what this one saw is too old to confirm.
            self._orphaned.clear()
            self._missing.clear()
        self._last = now
        jobs = self._jobs(time.time())
        tracked = {j: store.tracked(j) for j in jobs}
        held = self._held_of({t: task for tasks in tracked.values() for t, task in tasks.items()})
        resent: dict[str, list[int]] = {}
        for job_id, tenant in jobs.items():
            if self._stopping:
                break
            try:
                due = self._job(job_id, tracked[job_id], held, now)
                if due:
                    log.warning(
                        "job %s: %d unfinished items are held by no task in a queue or on a "
                        "worker; sending them again",
                        job_id,
                        len(due),
                    )
                    self.core.resend(job_id, tenant, due)
                    RESENT.inc(len(due))
                    counts = self._resends.setdefault(job_id, {})
                    for item in due:
                        del self._orphaned[job_id][item]
                        counts[item] = counts.get(item, 0) + 1
                    resent[job_id] = due
            except Exception:
                # One job's trouble (its state unreadable) does not stop the others.
                log.exception("the pipeline watchdog could not check job %s", job_id)
        for memo in (self._orphaned, self._resends):
            for job_id in [j for j in memo if j not in jobs]:
                del memo[job_id]
        live = {t for tasks in tracked.values() for t in tasks}
        for task_id in [t for t in self._missing if t not in live]:
            del self._missing[task_id]
        return resent

    def _job(
        self, job_id: str, tasks: Mapping[str, TrackedTask], held: set[str], now: float
    ) -> list[int]:
        """The job's items due to be sent again; forgets its tasks that are gone."""
        store = self.core.store
        covered: set[int] = set()
        gone: list[str] = []
        for task_id, task in tasks.items():
            if task_id in held:
                covered.update(task.items)
                self._missing.pop(task_id, None)
            elif now - self._missing.setdefault(task_id, now) >= self.confirm_seconds:
                gone.append(task_id)
        # Tasks noted since the first read were sent after the broker was looked
        # at (a stage handing its batch on): they hold their items.
        for task_id, task in store.tracked(job_id).items():
            if task_id not in tasks:
                covered.update(task.items)
        unfinished = set(store.unfinished_items(job_id))
        if not unfinished:
            store.snapshot(job_id)  # records that it is DONE
            return []
        seen = self._orphaned.setdefault(job_id, {})
        orphans = unfinished - covered
        for item in [i for i in seen if i not in orphans]:
            del seen[item]
        for item in orphans:
            seen.setdefault(item, now)
        counts = self._resends.get(job_id, {})
        due = sorted(
            item
            for item, first in seen.items()
            if now - first >= self.confirm_seconds * 2 ** min(counts.get(item, 0), 6)
        )
        if gone:
            store.untrack(job_id, gone)
            for task_id in gone:
                del self._missing[task_id]
        return due

    def start(self) -> None:
        if self._task is None:
            self._stopping = False
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="watchdog")

    async def _loop(self) -> None:
        import redis

        while True:
            await asyncio.sleep(self.interval)
            try:
                await asyncio.to_thread(self.check)
            except redis.RedisError as err:
                # The broker or the job state away: the next check looks again.
                log.warning("the pipeline watchdog could not check: %s", err)
            except Exception:
                log.exception("the pipeline watchdog's check failed")

    async def close(self, wait_seconds: float = 10.0) -> bool:
        """Stops the checks. A check running in its thread stops before its next
        job; this waits for it up to ``wait_seconds`` (a job being sent again is
        sent whole) and closes the broker connection. False when the check was
        still running then (logged): it closes the connection itself when it
        ends, and the job store, which the caller closes next, may be read by
        it once more."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        # Waiting on an event: a close that is itself cancelled leaves nothing held.
        idle = await asyncio.to_thread(self._idle.wait, wait_seconds)
        if idle:
            self._disconnect()
        else:
            log.warning(
                "the pipeline watchdog's check was still running %.0f s after shutdown began; "
                "it closes its broker connection when it ends",
                wait_seconds,
            )
        return idle
