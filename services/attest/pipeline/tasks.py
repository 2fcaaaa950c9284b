"""Pipeline tasks. Each is idempotent: running it twice leaves the same state."""

from __future__ import annotations

import asyncio
from typing import Any

from celery import Celery, Task
from google.protobuf import json_format

from attest.common.v1 import common_pb2
from attest.core.auth import tenant_metadata
from attest.core.channels import create_channel
from attest.core.context import DEFAULT_TENANT
from attest.core.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted, Unavailable
from attest.core.rpc_errors import from_rpc
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
from attest.pipeline.settings import PipelineSettings

LEXICAL = "attest.lexical.v1.LexicalService"
# Only failures that a later attempt can fix are retried (Index is an upsert).
TRANSIENT = (Unavailable, ResourceExhausted, DeadlineExceeded)


def retries_for_window(window_seconds: float, backoff_max_seconds: int, at_least: int) -> int:
    """Retries whose backoff (1, 2, 4, … s, capped at ``backoff_max_seconds``,
    with full jitter: half of each on average) adds up to ``window_seconds``;
    never fewer than ``at_least``."""
    retries, waited = 0, 0.0
    while waited < window_seconds:
        waited += min(2**retries, backoff_max_seconds) / 2
        retries += 1
    return max(retries, at_least)


def documents_from_json(items: list[dict[str, Any]]) -> list[common_pb2.Document]:
    """Documents in protobuf JSON form (camelCase or snake_case keys)."""
    out = []
    for i, item in enumerate(items):
        try:
            out.append(json_format.ParseDict(item, common_pb2.Document()))
        except json_format.ParseError as exc:
            raise InvalidArgument(str(exc), field=f"documents[{i}]") from exc
    return out


async def index_documents_async(
    settings: PipelineSettings, documents: list[common_pb2.Document], tenant: str = DEFAULT_TENANT
) -> dict[str, int]:
    import grpc

    channel = create_channel(
        settings.lexical_address, settings.client, idempotent=[(LEXICAL, "Index")]
    )
    try:
        stub = lexical_pb2_grpc.LexicalServiceStub(channel)
        response = await stub.Index(
            lexical_pb2.IndexRequest(documents=documents), metadata=tenant_metadata(tenant)
        )
    except grpc.aio.AioRpcError as err:
        raise from_rpc(err, service="lexical") from err
    finally:
        await channel.close()
    return {"documents": response.documents, "passages": response.passages}


def register(app: Celery) -> None:
    settings: PipelineSettings = app.conf["attest_settings"]

    @app.task(  # type: ignore[untyped-decorator]
        name="attest.index_documents",
        bind=True,
        autoretry_for=TRANSIENT,
        retry_backoff=True,
        retry_backoff_max=settings.retry_backoff_max_seconds,
        retry_jitter=True,
        # As long as an ingest batch keeps trying: a store's node may restart.
        max_retries=retries_for_window(
            settings.retry_window_seconds, settings.retry_backoff_max_seconds, settings.max_retries
        ),
    )
    def index_documents(
        self: Task, items: list[dict[str, Any]], tenant: str = DEFAULT_TENANT
    ) -> dict[str, int]:
        """Upsert documents (and their passages) into ``tenant``'s lexical index.

        Idempotent because the index upserts by (tenant, document id).
        """
        return asyncio.run(index_documents_async(settings, documents_from_json(items), tenant))
