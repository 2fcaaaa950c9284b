"""gRPC servicer of the ingest service: validate, convert, call the core."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc

from attest.core import common
from attest.core.context import tenant_var
from attest.core.errors import InvalidArgument, Unavailable
from attest.core.validation import check_id
from attest.ingest import convert
from attest.ingest.assembly import Assembly, assemble
from attest.ingest.jobs import IngestCore
from attest.ingest.settings import IngestSettings
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from attest.pipeline.settings import PipelineSettings

if TYPE_CHECKING:
    from attest.ingest.doctor import PeriodicCheck

Context = grpc.aio.ServicerContext[Any, Any]
FINAL = ("DONE", "FAILED")


class IngestServicer(ingest_pb2_grpc.IngestServiceServicer):
    service_name = ingest_pb2.DESCRIPTOR.services_by_name["IngestService"].full_name

    def __init__(self, settings: IngestSettings, pipeline: PipelineSettings | None = None) -> None:
        self._settings = settings
        self._pipeline = pipeline
        self._limits = settings.limits
        # Its own request-size limit, kept where it shares a server (serve all).
        self.max_message_bytes = settings.server.max_message_bytes
        self._assembly: Assembly | None = None
        self._doctor: PeriodicCheck | None = None

    def register(self, server: grpc.aio.Server) -> None:
        ingest_pb2_grpc.add_IngestServiceServicer_to_server(self, server)

    async def warm_up(self) -> None:
        if self._assembly is None:
            self._assembly = await assemble(self._settings, self._pipeline)
            if self._assembly.watchdog is not None:
                self._assembly.watchdog.start()
        if self._doctor is None and self._settings.doctor_interval_seconds > 0:
            self._doctor = periodic_check(self._settings, self._assembly)
            if self._doctor is not None:
                self._doctor.start()

    async def close(self) -> None:
        if self._doctor is not None:
            await self._doctor.close()
            self._doctor = None
        if self._assembly is not None:
            await self._assembly.close()
            self._assembly = None

    @property
    def core(self) -> IngestCore:
        if self._assembly is None:
            raise Unavailable("the ingest service is still starting")
        return self._assembly.core

    async def Ingest(
        self, request: ingest_pb2.IngestRequest, context: Context
    ) -> ingest_pb2.IngestResponse:
        items = convert.items_from_proto(list(request.items), self._limits)
        core, tenant = self.core, tenant_var.get()
        job = await asyncio.to_thread(core.ingest, tenant, items)
        return ingest_pb2.IngestResponse(job=convert.job_to_proto(job))

    async def IngestStream(
        self, request_iterator: AsyncIterator[ingest_pb2.IngestStreamRequest], context: Context
    ) -> ingest_pb2.IngestStreamResponse:
        core, tenant = self.core, tenant_var.get()
        job_id = await asyncio.to_thread(core.start_job, tenant)
        received = 0
        try:
            async for message in request_iterator:
                received += len(message.items)
                if received > self._limits.max_items_per_stream:
                    raise InvalidArgument(
                        f"a stream may carry at most {self._limits.max_items_per_stream:,} items",
                        field="items",
                    )
                items = convert.items_from_proto(list(message.items), self._limits)
                await asyncio.to_thread(core.add, job_id, items)
            if received == 0:
                raise InvalidArgument("the stream carried no items", field="items")
        except BaseException as exc:
            await asyncio.to_thread(
                core.abandon, job_id, f"the stream ended early: {type(exc).__name__}"
            )
            raise
        job = await asyncio.to_thread(core.seal, job_id)
        return ingest_pb2.IngestStreamResponse(job=convert.job_to_proto(job))

    def _job_id(self, value: str) -> str:
        if not value.strip() or len(value) > 128:
            raise InvalidArgument("must be a job id returned by Ingest", field="job_id")
        return value

    async def GetJob(
        self, request: ingest_pb2.GetJobRequest, context: Context
    ) -> ingest_pb2.GetJobResponse:
        job_id = self._job_id(request.job_id)
        if request.failures_offset < 0:
            raise InvalidArgument("must be >= 0", field="failures_offset")
        if not 0 <= request.failures_limit <= self._limits.max_failures_page:
            raise InvalidArgument(
                f"must be between 0 and {self._limits.max_failures_page:,}",
                field="failures_limit",
            )
        job = await asyncio.to_thread(
            self.core.job,
            tenant_var.get(),
            job_id,
            failures_offset=request.failures_offset,
            failures_limit=request.failures_limit or 100,
        )
        return ingest_pb2.GetJobResponse(job=convert.job_to_proto(job))

    async def WatchJob(
        self, request: ingest_pb2.WatchJobRequest, context: Context
    ) -> AsyncIterator[ingest_pb2.WatchJobResponse]:
        job_id = self._job_id(request.job_id)
        core, tenant = self.core, tenant_var.get()
        sent_failures = 0
        last: tuple[Any, ...] | None = None
        while True:
            job = await asyncio.to_thread(
                core.job, tenant, job_id, failures_offset=sent_failures, failures_limit=1000
            )
            key = (job.state, job.progress, len(job.failures))
            if key != last:
                last = key
                sent_failures += len(job.failures)
                yield ingest_pb2.WatchJobResponse(
                    job_id=job_id,
                    state=convert.job_to_proto(job).state,
                    progress=convert.progress_to_proto(job.progress),
                    new_failures=[convert.failure_to_proto(f) for f in job.failures],
                    error=job.error,
                )
            if job.state in FINAL and len(job.failures) < 1000:
                return
            await asyncio.sleep(self._settings.watch_interval_seconds)

    async def Delete(
        self, request: ingest_pb2.DeleteRequest, context: Context
    ) -> ingest_pb2.DeleteResponse:
        if bool(request.doc_ids) == bool(request.filters):
            raise InvalidArgument("set exactly one of doc_ids and filters", field="doc_ids")
        limits = self._limits
        if len(request.doc_ids) > limits.max_delete_ids:
            raise InvalidArgument(
                f"at most {limits.max_delete_ids:,} ids are allowed", field="doc_ids"
            )
        # An id refused as given fails alone; the others are deleted.
        valid: list[str] = []
        failures: list[ingest_pb2.Failure] = []
        for i, doc_id in enumerate(request.doc_ids):
            try:
                valid.append(check_id(doc_id, f"doc_ids[{i}]"))
            except InvalidArgument as err:
                failures.append(
                    ingest_pb2.Failure(
                        item_index=i,
                        doc_id=doc_id,
                        stage=ingest_pb2.STAGE_RECEIVE,
                        code=ingest_pb2.FAILURE_CODE_INVALID_ID,
                        reason=err.details,
                    )
                )
        filters = (
            common.filters_from_proto(list(request.filters), max_filters=16, max_values=256)
            if request.filters
            else None
        )
        if request.doc_ids and not valid:
            return ingest_pb2.DeleteResponse(failures=failures)
        result = await self.core.delete(
            tenant_var.get(),
            doc_ids=valid if request.doc_ids else [],
            filters=filters,
            dry_run=request.dry_run,
        )
        return ingest_pb2.DeleteResponse(
            matched=result.matched,
            deleted=result.deleted,
            doc_ids=list(result.doc_ids),
            failures=failures,
        )


def periodic_check(settings: IngestSettings, assembly: Assembly) -> PeriodicCheck | None:
    """The background reconciliation of a serving ingest service: over the lexical and
    semantic services when their addresses are set (production: Celery, OpenSearch,
    Qdrant), else over the stores opened in this process."""
    from attest.ingest.doctor import PeriodicCheck
    from attest.ingest.listing import EmbeddedListing, ServiceListing
    from attest.ingest.sinks import LocalSinks

    interval = settings.doctor_interval_seconds
    sinks = assembly.core.sinks
    if settings.lexical_address and settings.semantic_address:
        listing: ServiceListing | EmbeddedListing = ServiceListing(
            settings.lexical_address, settings.semantic_address, settings.client
        )
    elif isinstance(sinks, LocalSinks):
        listing = EmbeddedListing(sinks)
    else:
        return None
    # Where start-up checks already (embedded), the first periodic one waits an interval.
    first = interval if assembly.startup_check is not None else min(interval, 60.0)
    return PeriodicCheck(assembly.core.store, listing, interval, first_delay_seconds=first)
