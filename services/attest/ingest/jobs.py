"""Ingestion jobs: intake with change detection, the stage executor, deletion.

``IngestCore`` takes items into a job: invalid ones are recorded as failures
at once, valid ones durably as item records; when the job is sealed, the
last occurrence of each document id is compared with the registry (content
hash), unchanged documents are counted and skipped, and the rest go to the
pipeline in batches (``Dispatcher``: inline, or Celery tasks). ``StageRunner``
runs one stage for one batch, for both dispatchers, and records progress;
every record it writes is keyed by item index or document id, so running a
stage again changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import Counter, Histogram

from attest.core.common import Filters
from attest.core.document import BY_NAME, passages_digest
from attest.core.errors import (
    AttestError,
    DeadlineExceeded,
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unavailable,
)
from attest.core.write_barrier import awriting
from attest.ingest.documents import (
    Article,
    FailureCode,
    ItemError,
    content_hash,
)
from attest.ingest.settings import EnrichSettings
from attest.ingest.stages import (
    Embedding,
    Enricher,
    Record,
    Sinks,
    abstractive_summaries,
    record_keywords,
)
from attest.ingest.state import (
    FailureRecord,
    JobSnapshot,
    JobStore,
    RegistryEntry,
    WarningRecord,
)

log = logging.getLogger(__name__)

Batch = list[list[Any]]  # [[item index, "created" | "updated"], ...]
# Failures of a store that a later attempt can get past.
TRANSIENT = (Unavailable, ResourceExhausted, DeadlineExceeded)


@dataclass(frozen=True, slots=True)
class Item:
    """One received item: a valid article or the reason it is not one."""

    origin: str
    article: Article | None = None
    error: ItemError | None = None


class Dispatcher(Protocol):
    def dispatch(self, job_id: str, tenant: str, batches: Sequence[Batch]) -> None:
        """Start the pipeline for ``batches``; returns once they are durably queued."""


@dataclass
class _Intake:
    tenant: str
    received: int = 0
    # doc id -> (item index, content hash); the last occurrence wins.
    latest: dict[str, tuple[int, str]] = field(default_factory=dict)
    superseded: list[int] = field(default_factory=list)
    sealed: bool = False


# -- the stage executor ---------------------------------------------------------


STAGE_SECONDS = Histogram(
    "attest_ingest_stage_seconds",
    "Time one batch spent in an ingest stage (enrich, embed, index).",
    ["stage"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
STAGE_ITEMS = Counter(
    "attest_ingest_stage_items_total",
    "Items that left an ingest stage, by stage and outcome (ok, failed).",
    ["stage", "outcome"],
)


def _stage_done(stage: str, began: float, ok: int, failed: int) -> None:
    STAGE_SECONDS.labels(stage).observe(time.perf_counter() - began)
    STAGE_ITEMS.labels(stage, "ok").inc(ok)
    if failed:
        STAGE_ITEMS.labels(stage, "failed").inc(failed)


class StageRunner:
    """Runs enrich, embed and index for one batch and records what happened."""

    def __init__(
        self,
        store: JobStore,
        enrich_settings: EnrichSettings,
        *,
        embedding: Callable[[], Embedding] | None = None,
        sinks: Callable[[], Sinks] | None = None,
    ) -> None:
        self.store = store
        self._enrich_settings = enrich_settings
        self._embedding_factory = embedding
        self._sinks_factory = sinks
        self._embedding: Embedding | None = None
        self._sinks: Sinks | None = None
        self._enrichers: dict[str, Enricher] = {}
        self._lock = threading.Lock()

    @property
    def embedding(self) -> Embedding:
        with self._lock:
            if self._embedding is None:
                if self._embedding_factory is None:
                    raise RuntimeError("this runner has no embedding model")
                self._embedding = self._embedding_factory()
                self._embedding.warm_up()
            return self._embedding

    @property
    def sinks(self) -> Sinks:
        if self._sinks is None:
            if self._sinks_factory is None:
                raise RuntimeError("this runner has no index sinks")
            self._sinks = self._sinks_factory()
        return self._sinks

    def _enricher(self, tenant: str) -> Enricher:
        enricher = self._enrichers.get(tenant)
        if enricher is None:
            # Each document is read with a gazetteer of its own (see
            # attest.ingest.organizations): nothing learned carries over.
            enricher = Enricher(self._enrich_settings)
            self._enrichers[tenant] = enricher
        return enricher

    def fail_items(
        self, job_id: str, stage: str, items: Sequence[tuple[int, str]], code: str, reason: str
    ) -> None:
        """Record ``(item index, doc id)`` pairs as failed at ``stage``; an empty doc id
        is read from the item's record."""
        indexes = [i for i, _ in items]
        known: dict[int, tuple[str, str]] = {}
        for i, text in zip(indexes, self.store.items(job_id, indexes), strict=True):
            if text:
                data = json.loads(text)
                known[i] = (data["article"]["id"], data.get("origin", ""))
        self.store.fail(
            job_id,
            [
                FailureRecord(
                    i,
                    doc_id or known.get(i, ("", ""))[0],
                    known.get(i, ("", ""))[1],
                    stage,
                    code,
                    reason[:1000],
                )
                for i, doc_id in items
            ],
        )

    def rebuild(self, tenant: str, sources: Mapping[str, str]) -> list[Record]:
        """Enriched and embedded records of stored sources (doc id -> source JSON),
        outside any job: what ``attest doctor`` indexes again into a store that
        lost a document. A source that fails is left out (and logged)."""
        enricher = self._enricher(tenant)
        records: list[Record] = []
        for n, (doc_id, text) in enumerate(sources.items()):
            try:
                data = json.loads(text)
                article = Article.from_json(data["article"])
                records.append(enricher.enrich(-1 - n, "updated", data["hash"], article))
            except Exception:
                log.exception("the stored source of %r cannot be enriched", doc_id)
        embedding = self.embedding
        good = [r for r in records if not embedding.unknown_entities(r)]
        out: list[Record] = []
        for start in range(0, len(good), 64):
            chunk = good[start : start + 64]
            try:
                out.extend(embedding.embed(chunk))
            except Exception:
                log.warning(
                    "embedding %d stored sources failed; one by one", len(chunk), exc_info=True
                )
                for r in chunk:
                    try:
                        out.extend(embedding.embed([r]))
                    except Exception:
                        log.exception(
                            "the stored source of %r cannot be embedded", r["article"]["id"]
                        )
        return out

    def enrich(
        self,
        job_id: str,
        tenant: str,
        batch: Batch,
        *,
        handoff: Callable[[list[Record]], object] | None = None,
    ) -> list[Record]:
        """Enrich a batch. ``handoff`` gets the records (when there are any) before the
        progress is recorded: see ``embed``."""
        began = time.perf_counter()
        kinds = {int(i): str(k) for i, k in batch}
        todo = self.todo(job_id, tenant, [int(i) for i, _ in batch])
        indexes = list(todo)
        # Work is counted as it starts: a process killed in the middle did it.
        self.store.count_work(job_id, "enrich", len(indexes))
        enricher = self._enricher(tenant)
        out: list[Record] = []
        warnings: list[WarningRecord] = []
        for index, data in todo.items():
            if data is None:
                self.store.fail(
                    job_id,
                    [
                        FailureRecord(
                            index,
                            "",
                            "",
                            "ENRICH",
                            FailureCode.PROCESSING_ERROR.value,
                            "the item's record is missing from the job state",
                        )
                    ],
                )
                continue
            article = Article.from_json(data["article"])
            try:
                record = enricher.enrich(index, kinds[index], data["hash"], article)
                out.append(record)
                warnings.extend(
                    WarningRecord(index, article.id, data.get("origin", ""), code, message)
                    for code, message in record.pop("warnings", [])
                )
            except Exception as exc:
                log.exception("enrichment of %r failed", article.id)
                self.store.fail(
                    job_id,
                    [
                        FailureRecord(
                            index,
                            article.id,
                            data.get("origin", ""),
                            "ENRICH",
                            FailureCode.PROCESSING_ERROR.value,
                            f"enrichment failed: {type(exc).__name__}",
                        )
                    ],
                )
        address = self._enrich_settings.generate_address
        if address and out:
            try:
                abstractive_summaries(out, address, self._enrich_settings.generate_timeout_seconds)
            except AttestError as err:
                # Degrade: the extractive summaries stay.
                log.warning("no abstractive summaries (%s): %s", err.code, err.message)
        self.store.warn(job_id, warnings)
        if out and handoff is not None:
            handoff(out)
        self.store.mark(job_id, "enriched", [r["item"] for r in out])
        _stage_done("enrich", began, len(out), len(indexes) - len(out))
        return out

    def slices(self, job_id: str, batch: Batch) -> list[Batch]:
        """``batch`` in slices to run one after another, smallest items first: a
        slice holds items of about ``slice_chars`` characters in all (at least
        one item), so that one large item neither holds the small items of its
        batch nor loses their work when the process stops during it."""
        budget = self._enrich_settings.slice_chars
        indexes = [int(i) for i, _ in batch]
        sizes = {
            i: len(t or "") for i, t in zip(indexes, self.store.items(job_id, indexes), strict=True)
        }
        out: list[Batch] = []
        current: Batch = []
        used = 0
        for entry in sorted(batch, key=lambda e: (sizes[int(e[0])], int(e[0]))):
            size = sizes[int(entry[0])]
            if current and used + size > budget:
                out.append(current)
                current, used = [], 0
            current.append(entry)
            used += size
        if current:
            out.append(current)
        return out

    def todo(self, job_id: str, tenant: str, indexes: Sequence[int]) -> dict[int, Any]:
        """Of ``indexes``, the items still to run, with their records (None for an
        item whose record is missing). An item is left out when the job has
        finished it (a task delivered again, an item a later job superseded), or
        when the registry holds its document in the same version: another job
        stored it since this one was planned (the item is marked unchanged).
        So a job resumed after a crash, or a batch delivered twice, costs only
        the work still missing."""
        finished = self.store.finished_among(job_id, indexes)
        left = [i for i in indexes if i not in finished]
        records: dict[int, Any] = {}
        for index, text in zip(left, self.store.items(job_id, left), strict=True):
            records[index] = json.loads(text) if text else None
        ids = {i: d["article"]["id"] for i, d in records.items() if d is not None}
        known = self.store.registry_get(tenant, sorted(set(ids.values())))
        same = [
            i
            for i, doc_id in ids.items()
            if doc_id in known and known[doc_id].content_hash == records[i]["hash"]
        ]
        self.store.mark(job_id, "unchanged", same)
        for i in same:
            del records[i]
        return records

    def embed(
        self,
        job_id: str,
        records: Sequence[Record],
        *,
        handoff: Callable[[list[Record]], object] | None = None,
    ) -> list[Record]:
        """Embed a batch. ``handoff`` gets the embedded records (when there are any)
        before the progress is recorded, so that "embedded" never counts vectors that
        exist only in this process: the Celery task queues the index task there, and
        a worker that dies before that leaves the items unmarked and its task is
        delivered again."""
        began = time.perf_counter()
        self.store.count_work(job_id, "embed", len(records))
        embedding = self.embedding
        good: list[Record] = []
        for r in records:
            unknown = embedding.unknown_entities(r)
            if unknown:
                self.fail_items(
                    job_id,
                    "EMBED",
                    [(r["item"], r["article"]["id"])],
                    FailureCode.INVALID_FIELD.value,
                    f"entity_ids: unknown knowledge-graph entity {unknown[0][:64]!r}",
                )
            else:
                good.append(r)
        out = self._embed_isolated(job_id, embedding, good) if good else []
        if out and handoff is not None:
            handoff(out)
        self.store.mark(job_id, "embedded", [r["item"] for r in out])
        _stage_done("embed", began, len(out), len(records) - len(out))
        return out

    def _embed_isolated(
        self, job_id: str, embedding: Embedding, records: Sequence[Record]
    ) -> list[Record]:
        """Embedded ``records``; when the batch raises, its halves are embedded
        apart until the item that raises is alone, and only that item fails.

        A poison item thus costs about 2·log2(batch) extra calls instead of its
        whole batch. An error that fails every item (the model is gone) still
        fails every item, each with its reason.
        """
        try:
            return embedding.embed(records)
        except Exception as exc:
            if len(records) == 1:
                (r,) = records
                log.exception(
                    "embedding of %r (job %s, item %d) failed",
                    r["article"]["id"],
                    job_id,
                    r["item"],
                )
                self.fail_items(
                    job_id,
                    "EMBED",
                    [(r["item"], r["article"]["id"])],
                    FailureCode.PROCESSING_ERROR.value,
                    f"embedding failed: {type(exc).__name__}",
                )
                return []
            log.warning(
                "a batch of %d items of job %s failed to embed (%s); embedding its halves apart",
                len(records),
                job_id,
                type(exc).__name__,
            )
        half = len(records) // 2
        return [
            *self._embed_isolated(job_id, embedding, records[:half]),
            *self._embed_isolated(job_id, embedding, records[half:]),
        ]

    async def index(self, job_id: str, tenant: str, records: Sequence[Record]) -> None:
        """Write a batch to every store and commit it to the registry (see
        ``attest.ingest.state`` for the write order). A store's transient failure
        (unavailable, overloaded) fails the call, to be retried; any other
        failure is narrowed down by halves to the documents that cause it,
        which fail alone."""
        if not records:
            return
        try:
            await self._index_batch(job_id, tenant, records)
        except TRANSIENT:
            raise
        except Exception as exc:
            if len(records) == 1:
                (r,) = records
                log.exception(
                    "indexing %r (job %s, item %d) failed", r["article"]["id"], job_id, r["item"]
                )
                code = FailureCode.PROCESSING_ERROR
                reason = f"indexing failed: {type(exc).__name__}"
                if isinstance(exc, InvalidArgument):
                    code, reason = FailureCode.INVALID_FIELD, exc.details[:500]
                await asyncio.to_thread(
                    self.fail_items,
                    job_id,
                    "INDEX",
                    [(r["item"], r["article"]["id"])],
                    code.value,
                    reason,
                )
                STAGE_ITEMS.labels("index", "failed").inc()
                return
            log.warning(
                "a batch of %d items of job %s failed to index (%s); indexing its halves apart",
                len(records),
                job_id,
                type(exc).__name__,
            )
            half = len(records) // 2
            await self.index(job_id, tenant, records[:half])
            await self.index(job_id, tenant, records[half:])

    async def _index_batch(self, job_id: str, tenant: str, records: Sequence[Record]) -> None:
        began = time.perf_counter()
        ids = [r["article"]["id"] for r in records]
        entries = registry_entries(records)
        sources = {
            r["article"]["id"]: json.dumps(
                {"article": r["article"], "hash": r["hash"]}, ensure_ascii=False
            )
            for r in records
        }
        items = {int(r["item"]): (str(r["kind"]), len(r["passages"])) for r in records}
        doc_ids = {int(r["item"]): str(r["article"]["id"]) for r in records}
        # From the pending note to the commit, as one write: a backup sees the
        # batch in every store and the registry, or in none.
        async with awriting(self.store.barrier):
            await asyncio.to_thread(self.store.registry_begin, job_id, tenant, ids)
            await asyncio.to_thread(self.store.count_work, job_id, "index", len(records))
            await self.sinks.index(tenant, records)
            await asyncio.to_thread(
                self.store.registry_commit,
                job_id,
                tenant,
                entries,
                sources,
                items,
                doc_ids=doc_ids,
            )
        _stage_done("index", began, len(records), 0)


# -- the inline dispatcher --------------------------------------------------------


class InlineDispatcher:
    """Runs the stages in this process, one batch after another, in the background.

    Build it inside the event loop that should run the stages; ``dispatch``
    may be called from any thread.
    """

    def __init__(self, runner: StageRunner, *, index_attempts: int = 8) -> None:
        self.runner = runner
        self.index_attempts = index_attempts
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[str, str, Batch]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._outstanding: dict[str, int] = {}  # job -> batches queued or running

    def dispatch(self, job_id: str, tenant: str, batches: Sequence[Batch]) -> None:
        # A fresh context: the batches outlive the call that queued them, so they
        # must not carry its deadline (or request id) into their own downstream calls.
        self._loop.call_soon_threadsafe(
            self._enqueue, job_id, tenant, list(batches), context=contextvars.Context()
        )

    def _enqueue(self, job_id: str, tenant: str, batches: list[Batch]) -> None:
        if self._worker is None:
            self._worker = self._loop.create_task(self._work(), context=contextvars.Context())
        for batch in batches:
            self._outstanding[job_id] = self._outstanding.get(job_id, 0) + 1
            self._queue.put_nowait((job_id, tenant, batch))

    async def _index(self, job_id: str, tenant: str, records: list[Record]) -> None:
        """Index, waiting out a store that is briefly unavailable: the stores
        may be services of this very process that are still starting when an
        interrupted job resumes."""
        for attempt in range(self.index_attempts):
            try:
                await self.runner.index(job_id, tenant, records)
                return
            except TRANSIENT as exc:
                if attempt == self.index_attempts - 1:
                    raise
                delay = min(30.0, 0.5 * 2**attempt)
                log.warning("indexing for job %s: %s; again in %.1f s", job_id, exc, delay)
                await asyncio.sleep(delay)

    async def run_batch(self, job_id: str, tenant: str, batch: Batch) -> None:
        """Run a batch in slices (``StageRunner.slices``), each committed before the next."""
        runner = self.runner
        for part in await asyncio.to_thread(runner.slices, job_id, batch):
            try:
                enriched = await asyncio.to_thread(runner.enrich, job_id, tenant, part)
                embedded = await asyncio.to_thread(runner.embed, job_id, enriched)
                await self._index(job_id, tenant, embedded)
            except Exception as exc:
                log.exception("a batch of job %s failed", job_id)
                done = await asyncio.to_thread(
                    runner.store.finished_among, job_id, [int(i) for i, _ in part]
                )
                items = [(int(i), "") for i, _ in part if int(i) not in done]
                await asyncio.to_thread(
                    runner.fail_items,
                    job_id,
                    "INDEX",
                    items,
                    FailureCode.PROCESSING_ERROR.value,
                    f"{type(exc).__name__}: {exc}",
                )

    async def _work(self) -> None:
        while True:
            job_id, tenant, batch = await self._queue.get()
            try:
                await self.run_batch(job_id, tenant, batch)
            finally:
                try:
                    self._outstanding[job_id] -= 1
                    if not self._outstanding[job_id]:
                        del self._outstanding[job_id]
                        # Its last batch ran: record DONE now, not when somebody asks
                        # (a job resumed at start-up has nobody watching it).
                        await asyncio.to_thread(
                            self.runner.store.snapshot, job_id, failures_limit=0
                        )
                except Exception:
                    log.exception("the state of job %s cannot be read", job_id)
                finally:
                    self._queue.task_done()

    async def drain(self) -> None:
        """Wait until every dispatched batch has run."""
        await asyncio.sleep(0)  # let pending dispatch callbacks enqueue
        await self._queue.join()

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
            self._worker = None


# -- the core ----------------------------------------------------------------------


def _matches(doc_id: str, entry: RegistryEntry, filters: Filters) -> bool:
    from datetime import datetime

    if filters.doc_ids and doc_id not in filters.doc_ids:
        return False
    for name, values in filters.keywords.items():
        key = BY_NAME[name].key
        wanted = {key(v) for v in values}
        if values and not any(key(v) in wanted for v in entry.keywords.get(name, ())):
            return False
    if filters.published_from or filters.published_to:
        if entry.published_at is None:
            return False
        when = datetime.fromisoformat(entry.published_at)
        if filters.published_from and when < filters.published_from:
            return False
        if filters.published_to and when > filters.published_to:
            return False
    return True


@dataclass(frozen=True, slots=True)
class DeleteResult:
    matched: int
    deleted: int
    doc_ids: tuple[str, ...]


class IngestCore:
    """Jobs and deletion; transport-free (the servicer and the CLI call it)."""

    def __init__(
        self,
        store: JobStore,
        dispatcher: Dispatcher,
        sinks: Callable[[], Sinks],
        *,
        batch_size: int = 16,
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self._sinks_factory = sinks
        self._sinks: Sinks | None = None
        self.batch_size = batch_size
        self._intakes: dict[str, _Intake] = {}
        self._lock = threading.Lock()
        # (tenant, doc id) -> (job, item): items that ``recover`` sent again; a
        # later job over the same document supersedes them (``seal``).
        self._queued: dict[tuple[str, str], tuple[str, int]] = {}

    def start_job(self, tenant: str) -> str:
        job_id = uuid.uuid4().hex
        self.store.create_job(job_id, tenant)
        self._intakes[job_id] = _Intake(tenant=tenant)
        return job_id

    def add(self, job_id: str, items: Sequence[Item]) -> None:
        """Record items durably: failures as failures, valid articles as item records."""
        intake = self._intakes[job_id]
        if intake.sealed:
            raise InvalidArgument("the job is already sealed", field="job_id")
        records: dict[int, str] = {}
        failures: list[FailureRecord] = []
        for item in items:
            index = intake.received
            intake.received += 1
            if item.article is None:
                err = item.error or ItemError(FailureCode.INVALID_FIELD, "no document")
                failures.append(
                    FailureRecord(
                        index, err.doc_id, item.origin, "RECEIVE", err.code.value, err.reason
                    )
                )
                continue
            h = content_hash(item.article)
            previous = intake.latest.get(item.article.id)
            if previous is not None:
                intake.superseded.append(previous[0])
            intake.latest[item.article.id] = (index, h)
            records[index] = json.dumps(
                {"article": item.article.to_json(), "hash": h, "origin": item.origin},
                ensure_ascii=False,
            )
        self.store.fail(job_id, failures)
        self.store.record_items(job_id, records, intake.received)

    def seal(self, job_id: str) -> JobSnapshot:
        """Close intake: detect changes and hand the rest to the pipeline."""
        intake = self._intakes.pop(job_id)
        intake.sealed = True
        tenant = intake.tenant
        unchanged: list[int] = list(intake.superseded)
        batches: list[Batch] = []
        current: Batch = []
        ids = list(intake.latest)
        for start in range(0, len(ids), 1000):
            chunk = ids[start : start + 1000]
            known = self.store.registry_get(tenant, chunk)
            for doc_id in chunk:
                index, h = intake.latest[doc_id]
                entry = known.get(doc_id)
                if entry is not None and entry.content_hash == h:
                    unchanged.append(index)
                    continue
                current.append([index, "updated" if entry is not None else "created"])
                if len(current) == self.batch_size:
                    batches.append(current)
                    current = []
        if current:
            batches.append(current)
        self.store.mark(job_id, "unchanged", unchanged)
        self.store.mark(job_id, "superseded", intake.superseded)
        self._supersede_resumed(tenant, intake.latest)
        self.store.seal(job_id, intake.received)
        if batches:
            self.dispatcher.dispatch(job_id, tenant, batches)
        snapshot = self.store.snapshot(job_id)
        assert snapshot is not None
        return snapshot

    def _supersede_resumed(self, tenant: str, latest: Mapping[str, tuple[int, str]]) -> None:
        """A new job carries documents that resumed jobs still have queued: their
        items are superseded, so that each document is written once, by the new
        job, and the new job's progress shows the work as it is done. An item
        whose batch is already running is written anyway; its commit then marks
        it indexed (no longer superseded) and this job's item unchanged."""
        with self._lock:
            hits: dict[str, list[int]] = {}
            for doc_id in latest:
                queued = self._queued.pop((tenant, doc_id), None)
                if queued is not None:
                    hits.setdefault(queued[0], []).append(queued[1])
        for old_job, indexes in hits.items():
            finished = self.store.finished_among(old_job, indexes)
            self._supersede(old_job, [i for i in indexes if i not in finished])

    def recover(self) -> list[str]:
        """Resume the jobs a crash or a stop interrupted (the recovery rule of
        ``attest.ingest.state``): a sealed job's unfinished items go to the
        pipeline again; a job that was never sealed was never acknowledged and
        fails. Returns the ids of the resumed jobs.

        The open jobs are merged first: of the unfinished items over one
        document, only the newest job's is sent (the others are superseded),
        and the jobs resume oldest first. An item whose document the registry
        already holds in the same version is unchanged and not sent; so a
        restart costs the work that is actually missing, however many restarts
        came before it."""
        found: list[tuple[float, str, str, dict[int, Any]]] = []
        for job_id in self.store.open_jobs():
            if job_id in self._intakes:
                continue
            tenant = self.store.tenant_of(job_id)
            if tenant is None:
                continue
            if not self.store.is_sealed(job_id):
                self.store.set_error(
                    job_id, "the service stopped before the job's intake ended (not acknowledged)"
                )
                continue
            pending = self.store.unfinished_items(job_id)
            if not pending:
                self.store.snapshot(job_id)  # records that it is DONE
                continue
            found.append(
                (self.store.created_at(job_id), job_id, tenant, self._records(job_id, pending))
            )
        found.sort(key=lambda f: (f[0], f[1]))
        newest: dict[tuple[str, str], tuple[str, int]] = {}
        for _, job_id, tenant, records in found:
            for index in sorted(records):
                data = records[index]
                if data is not None:
                    newest[(tenant, data["article"]["id"])] = (job_id, index)
        resumed: list[str] = []
        for _, job_id, tenant, records in found:
            superseded = [
                i
                for i, d in records.items()
                if d is not None and newest[(tenant, d["article"]["id"])] != (job_id, i)
            ]
            self._supersede(job_id, superseded)
            gone = set(superseded)
            live = {i: d for i, d in records.items() if i not in gone}
            sent = self._send(job_id, tenant, live)
            log.warning(
                "resuming job %s: %d of its items were not finished when it stopped; %d "
                "superseded by a later job, %d already stored by another, %d sent again",
                job_id,
                len(records),
                len(superseded),
                len(live) - sent,
                sent,
            )
            if sent:
                resumed.append(job_id)
                for i, d in live.items():
                    if d is not None:
                        self._queued[(tenant, d["article"]["id"])] = (job_id, i)
            else:
                self.store.snapshot(job_id)  # records that it is DONE
        return resumed

    def resend(self, job_id: str, tenant: str, items: Sequence[int]) -> None:
        """Send a sealed job's ``items`` through the pipeline again, from the start
        (every stage is idempotent): those it has not finished and whose document
        the registry does not hold in the same version (those are unchanged)."""
        finished = self.store.finished_among(job_id, sorted(items))
        pending = sorted(i for i in set(items) if i not in finished)
        self._send(job_id, tenant, self._records(job_id, pending))

    def _records(self, job_id: str, indexes: Sequence[int]) -> dict[int, Any]:
        """Item records (parsed) by index; None where the record is missing."""
        texts = self.store.items(job_id, indexes)
        return {i: json.loads(t) if t else None for i, t in zip(indexes, texts, strict=True)}

    def _supersede(self, job_id: str, indexes: Sequence[int]) -> None:
        """Items of ``job_id`` that a later item over the same document replaces."""
        self.store.mark(job_id, "unchanged", indexes)
        self.store.mark(job_id, "superseded", indexes)

    def _send(self, job_id: str, tenant: str, records: Mapping[int, Any]) -> int:
        """Plan and dispatch ``records`` (index -> item record or None); an item the
        registry holds in the same version is marked unchanged instead. Returns
        how many items were sent."""
        ids = {i: d["article"]["id"] for i, d in records.items() if d is not None}
        known = self.store.registry_get(tenant, sorted(set(ids.values())))
        plan: Batch = []
        unchanged: list[int] = []
        for i in sorted(records):
            entry = known.get(ids[i]) if i in ids else None
            if entry is not None and entry.content_hash == records[i]["hash"]:
                unchanged.append(i)
            else:
                plan.append([i, "updated" if entry is not None else "created"])
        self.store.mark(job_id, "unchanged", unchanged)
        batches = [
            plan[start : start + self.batch_size] for start in range(0, len(plan), self.batch_size)
        ]
        if batches:
            self.dispatcher.dispatch(job_id, tenant, batches)
        return len(plan)

    def ingest(self, tenant: str, items: Sequence[Item]) -> JobSnapshot:
        job_id = self.start_job(tenant)
        self.add(job_id, items)
        return self.seal(job_id)

    def abandon(self, job_id: str, reason: str) -> None:
        """A stream that broke off: the job fails as a whole."""
        self._intakes.pop(job_id, None)
        self.store.set_error(job_id, reason)

    def job(
        self, tenant: str, job_id: str, *, failures_offset: int = 0, failures_limit: int = 100
    ) -> JobSnapshot:
        snapshot = self.store.snapshot(
            job_id, failures_offset=failures_offset, failures_limit=failures_limit
        )
        # Another tenant's job is indistinguishable from a missing one.
        if snapshot is None or snapshot.tenant != tenant:
            raise NotFound(f"no job {job_id[:64]!r}")
        return snapshot

    @property
    def sinks(self) -> Sinks:
        if self._sinks is None:
            self._sinks = self._sinks_factory()
        return self._sinks

    async def delete(
        self,
        tenant: str,
        *,
        doc_ids: Sequence[str] = (),
        filters: Filters | None = None,
        dry_run: bool = False,
    ) -> DeleteResult:
        """Remove documents from every store and from the registry."""
        if filters is not None:
            registry = await asyncio.to_thread(self.store.registry_all, tenant)
            matched = sorted(d for d, e in registry.items() if _matches(d, e, filters))
        else:
            known = await asyncio.to_thread(
                self.store.registry_get, tenant, list(dict.fromkeys(doc_ids))
            )
            matched = [d for d in dict.fromkeys(doc_ids) if d in known]
        if dry_run or not matched:
            return DeleteResult(len(matched), 0, tuple(matched[:1000]))
        # Stores first: a crash in between leaves a registry entry whose
        # delete can be repeated, never a stored document nobody knows about.
        # Ids the registry does not know are deleted from the stores too.
        targets = list(dict.fromkeys([*matched, *doc_ids]))
        async with awriting(self.store.barrier):
            await self.sinks.delete(tenant, targets)
            deleted = await asyncio.to_thread(self.store.registry_delete, tenant, matched)
        return DeleteResult(len(matched), deleted, tuple(matched[:1000]))


def registry_entries(records: Sequence[Record]) -> dict[str, RegistryEntry]:
    """What the registry keeps of each indexed record, by document id."""
    return {
        r["article"]["id"]: RegistryEntry(
            content_hash=r["hash"],
            passages=len(r["passages"]),
            keywords=record_keywords(r),
            published_at=r["article"].get("published_at"),
            passages_sha256=passages_digest((int(p[0]), str(p[1])) for p in r["passages"]),
        )
        for r in records
    }
