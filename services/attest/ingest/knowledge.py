"""Facts for the personal knowledge base, sent to the knowledge service as documents are
indexed and deleted.

When ``ATTEST_INGEST_KNOWLEDGE_ADDRESS`` names a knowledge service, the index
sinks call ``FactsHook.index`` after writing a batch to the lexical and
semantic stores: every document's facts are extracted offline
(attest.knowledge.extract) from the passages just indexed and stored with
``KnowledgeService.Store`` under the job's tenant, replacing what the
document had; ``FactsHook.delete`` stores an empty list for each deleted
document, which removes its facts. Store is idempotent, so a retried index
stage stores the same facts again.

Extraction runs in the index stage, inline or in the Celery index task
(whose sinks read the same variable); it has no queue of its own.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from attest.core.auth import tenant_metadata
from attest.core.channels import create_channel
from attest.core.settings import ClientSettings
from attest.ingest.stages import Record
from attest.knowledge.convert import store_request
from attest.knowledge.extract import Extractor, document_text, graph_names

log = logging.getLogger(__name__)

KNOWLEDGE = "attest.knowledge.v1.KnowledgeService"


class KnowledgeFactsSettings(BaseSettings):
    """Where ingestion sends extracted facts (environment prefix ``ATTEST_INGEST_KNOWLEDGE_``)."""

    model_config = SettingsConfigDict(
        env_prefix="ATTEST_INGEST_KNOWLEDGE_", extra="ignore", frozen=True
    )

    address: str | None = Field(
        default=None, description="Knowledge service HOST:PORT; unset: no facts are extracted."
    )
    timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Deadline of each call that stores a document's facts.",
    )


class FactsHook:
    """Extracts each indexed document's facts and stores them through the knowledge service."""

    def __init__(self, address: str, client: ClientSettings, *, timeout: float = 30.0) -> None:
        from attest.knowledge.v1 import knowledge_pb2_grpc

        self._channel = create_channel(
            address, client, idempotent=[(KNOWLEDGE, "Store"), (KNOWLEDGE, "ListFactDocuments")]
        )
        self._stub = knowledge_pb2_grpc.KnowledgeServiceStub(self._channel)
        self._timeout = timeout
        self.extractor = Extractor()
        self._graph: Any = None

    def _entity_names(self, entity_ids: Sequence[str]) -> list[str]:
        if self._graph is None:
            from attest.knowledge.graph import load_graph

            self._graph = load_graph(None)
        return graph_names(self._graph, entity_ids)

    def facts(self, record: Record) -> Any:
        a = record["article"]
        return self.extractor.extract(
            document_text(
                a["id"],
                a["body"],
                record["passages"],
                record.get("organizations") or (),
                self._entity_names(record.get("entity_ids") or ()),
            )
        )

    async def _store(self, tenant: str, request: Any) -> None:
        from attest.ingest.sinks import _call

        metadata = tenant_metadata(tenant)

        async def call() -> Any:
            return await self._stub.Store(request, metadata=metadata, timeout=self._timeout)

        await _call("knowledge", call)

    async def index(self, tenant: str, records: Sequence[Record]) -> None:
        for record in records:
            await self._store(tenant, store_request(record["article"]["id"], self.facts(record)))

    async def delete(self, tenant: str, doc_ids: Sequence[str]) -> None:
        for doc_id in doc_ids:
            await self._store(tenant, store_request(doc_id, []))

    async def documents(self, tenant: str) -> dict[str, int]:
        """The documents ``tenant``'s personal base holds facts from, with how many
        facts each (``ListFactDocuments``, every page)."""
        from attest.ingest.sinks import _call
        from attest.knowledge.v1 import knowledge_pb2

        metadata = tenant_metadata(tenant)
        out: dict[str, int] = {}
        token = ""
        while True:
            request = knowledge_pb2.ListFactDocumentsRequest(page_size=1000, page_token=token)

            async def call(r: Any = request) -> Any:
                return await self._stub.ListFactDocuments(
                    r, metadata=metadata, timeout=self._timeout
                )

            page = await _call("knowledge", call)
            out.update((d.doc_id, d.facts) for d in page.documents)
            token = page.next_page_token
            if not token:
                return out

    async def close(self) -> None:
        await self._channel.close()


def facts_hook(client: ClientSettings) -> FactsHook | None:
    """The hook ``ATTEST_INGEST_KNOWLEDGE_*`` configures, or None when no address is set."""
    settings = KnowledgeFactsSettings()
    if not settings.address:
        return None
    return FactsHook(settings.address, client, timeout=settings.timeout_seconds)
