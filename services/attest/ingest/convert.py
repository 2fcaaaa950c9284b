"""Protobuf ↔ domain conversion of the ingest service."""

from __future__ import annotations

from attest.core.common import from_timestamp, to_timestamp
from attest.core.document import KEYWORD_FIELDS, message_values
from attest.core.errors import InvalidArgument
from attest.ingest.documents import (
    FailureCode,
    ItemError,
    article_from_fields,
    article_from_raw_json,
)
from attest.ingest.jobs import Item
from attest.ingest.settings import IngestLimits
from attest.ingest.state import FailureRecord, JobSnapshot, ProgressCounts, WarningRecord
from attest.ingest.v1 import ingest_pb2

_STATES = {
    "QUEUED": ingest_pb2.JOB_STATE_QUEUED,
    "RUNNING": ingest_pb2.JOB_STATE_RUNNING,
    "DONE": ingest_pb2.JOB_STATE_DONE,
    "FAILED": ingest_pb2.JOB_STATE_FAILED,
}
_STAGES = {
    "RECEIVE": ingest_pb2.STAGE_RECEIVE,
    "ENRICH": ingest_pb2.STAGE_ENRICH,
    "EMBED": ingest_pb2.STAGE_EMBED,
    "INDEX": ingest_pb2.STAGE_INDEX,
}


def item_from_proto(item: ingest_pb2.IngestItem, field: str, limits: IngestLimits) -> Item:
    if len(item.origin) > limits.max_origin_chars:
        raise InvalidArgument(
            f"is longer than {limits.max_origin_chars:,} characters", field=f"{field}.origin"
        )
    kind = item.WhichOneof("record")
    try:
        if kind == "raw_json":
            return Item(origin=item.origin, article=article_from_raw_json(item.raw_json))
        if kind == "document":
            d = item.document
            try:
                published = from_timestamp(d.published_at, d.HasField("published_at"))
            except InvalidArgument as err:
                # A bad item fails alone, like any other field of the item.
                raise ItemError(FailureCode.INVALID_DATE, err.details, d.id) from None
            article = article_from_fields(
                doc_id=d.id,
                title=d.title,
                body=d.body,
                published_at=published,
                source_url=d.source_url,
                keywords={f.name: message_values(d, f) or () for f in KEYWORD_FIELDS},
                metadata=dict(d.metadata),
            )
            return Item(origin=item.origin, article=article)
    except ItemError as err:
        return Item(origin=item.origin, error=err)
    raise InvalidArgument("needs a document or raw_json", field=field)


def items_from_proto(
    items: list[ingest_pb2.IngestItem], limits: IngestLimits, *, field: str = "items"
) -> list[Item]:
    if not items:
        raise InvalidArgument("must contain at least one item", field=field)
    if len(items) > limits.max_items_per_message:
        raise InvalidArgument(
            f"has {len(items):,} items; the limit is {limits.max_items_per_message:,}",
            field=field,
        )
    return [item_from_proto(it, f"{field}[{i}]", limits) for i, it in enumerate(items)]


def progress_to_proto(p: ProgressCounts) -> ingest_pb2.Progress:
    return ingest_pb2.Progress(
        received=p.received,
        enriched=p.enriched,
        embedded=p.embedded,
        indexed=p.indexed,
        failed=p.failed,
        unchanged=p.unchanged,
        created=p.created,
        updated=p.updated,
        passages_indexed=p.passages_indexed,
        superseded=p.superseded,
        warned=p.warned,
    )


def warning_to_proto(w: WarningRecord) -> ingest_pb2.ItemWarning:
    return ingest_pb2.ItemWarning(
        item_index=w.item_index, doc_id=w.doc_id, origin=w.origin, code=w.code, message=w.message
    )


def failure_to_proto(f: FailureRecord) -> ingest_pb2.Failure:
    return ingest_pb2.Failure(
        item_index=f.item_index,
        doc_id=f.doc_id,
        origin=f.origin,
        stage=_STAGES.get(f.stage, ingest_pb2.STAGE_UNSPECIFIED),
        code=ingest_pb2.FailureCode.Value(f"FAILURE_CODE_{f.code}"),
        reason=f.reason,
    )


def job_to_proto(job: JobSnapshot) -> ingest_pb2.Job:
    return ingest_pb2.Job(
        job_id=job.job_id,
        state=_STATES[job.state],
        progress=progress_to_proto(job.progress),
        failures=[failure_to_proto(f) for f in job.failures],
        created_at=to_timestamp(job.created_at),
        started_at=to_timestamp(job.started_at),
        finished_at=to_timestamp(job.finished_at),
        error=job.error,
        warnings=[warning_to_proto(w) for w in job.warnings],
    )
