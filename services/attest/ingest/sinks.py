"""Writers to the lexical and semantic stores: over gRPC, or to cores in this process.

gRPC failures are translated at this edge by ``attest.core.rpc_errors``:
UNAVAILABLE, DEADLINE_EXCEEDED and RESOURCE_EXHAUSTED become
``Unavailable``/``DeadlineExceeded``/``ResourceExhausted`` (the pipeline
retries those), INVALID_ARGUMENT becomes ``InvalidArgument`` (it does not).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from attest.common.v1 import common_pb2
from attest.core.auth import tenant_metadata
from attest.core.channels import create_channel
from attest.core.common import to_timestamp
from attest.core.document import keywords_to_message
from attest.core.rpc_errors import from_rpc
from attest.core.settings import ClientSettings
from attest.ingest.stages import Record, decode_vector, record_keywords, record_passages
from attest.lexical.backends import LexicalBackend
from attest.lexical.models import DocumentIn
from attest.lexical.models import PassageIn as LexicalPassage
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
from attest.semantic.index import SemanticIndex
from attest.semantic.models import PassageIn as SemanticPassage
from attest.semantic.models import SemanticDoc
from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc

if TYPE_CHECKING:
    from attest.ingest.knowledge import FactsHook

LEXICAL = "attest.lexical.v1.LexicalService"
SEMANTIC = "attest.semantic.v1.SemanticService"
T = TypeVar("T")


def _published(record: Record) -> datetime | None:
    value = record["article"].get("published_at")
    return datetime.fromisoformat(value) if value else None


def _document_proto(record: Record) -> common_pb2.Document:
    a = record["article"]
    doc = common_pb2.Document(
        id=a["id"],
        title=a["title"],
        body=a["body"],
        source_url=a["source_url"],
        metadata={**a["metadata"], "attest.content_hash": record["hash"]},
        passages=[
            common_pb2.Passage(
                doc_id=a["id"],
                index=p.index,
                text=p.text,
                start_char=p.start_char,
                end_char=p.end_char,
                page=p.page,
            )
            for p in record_passages(record)
        ],
    )
    keywords_to_message(record_keywords(record), doc)
    ts = to_timestamp(_published(record))
    if ts is not None:
        doc.published_at.CopyFrom(ts)
    return doc


async def _call(service: str, call: Callable[[], Awaitable[T]]) -> T:
    import grpc

    try:
        return await call()
    except grpc.aio.AioRpcError as err:
        raise from_rpc(err, service=service) from err


class GrpcSinks:
    """The lexical and semantic services over gRPC (Index and Delete are idempotent).

    Every call names the job's tenant (this process calls under its service
    identity, the only one whose tenant the stores honour), so the same document
    id of two tenants is two records in every store.
    """

    def __init__(self, lexical_address: str, semantic_address: str, client: ClientSettings) -> None:
        self._lexical_channel = create_channel(
            lexical_address, client, idempotent=[(LEXICAL, "Index"), (LEXICAL, "Delete")]
        )
        self._semantic_channel = create_channel(
            semantic_address, client, idempotent=[(SEMANTIC, "Index"), (SEMANTIC, "Delete")]
        )
        self.lexical = lexical_pb2_grpc.LexicalServiceStub(self._lexical_channel)
        self.semantic = semantic_pb2_grpc.SemanticServiceStub(self._semantic_channel)
        # Personal-knowledge facts of what is indexed (attest.ingest.knowledge),
        # when ATTEST_INGEST_KNOWLEDGE_ADDRESS is set: here, so that the Celery
        # workers' index tasks send them too.
        from attest.ingest.knowledge import facts_hook

        self.knowledge: FactsHook | None = facts_hook(client)

    async def index(self, tenant: str, records: Sequence[Record]) -> None:
        if not records:
            return
        docs = [_document_proto(r) for r in records]
        metadata = tenant_metadata(tenant)
        lexical_request = lexical_pb2.IndexRequest(documents=docs)
        await _call("lexical", lambda: self.lexical.Index(lexical_request, metadata=metadata))
        semantic_request = semantic_pb2.IndexRequest(
            documents=[
                semantic_pb2.IndexDocument(
                    document=doc,
                    summary=r["summary"],
                    article_vector=semantic_pb2.Vector(
                        values=decode_vector(r["article_vector"]).tolist()
                    ),
                    passage_vectors=[
                        semantic_pb2.Vector(values=decode_vector(v).tolist())
                        for v in r["passage_vectors"]
                    ],
                )
                for doc, r in zip(docs, records, strict=True)
            ],
            embedding_model=records[0]["embedding_model"],
        )
        await _call("semantic", lambda: self.semantic.Index(semantic_request, metadata=metadata))
        if self.knowledge is not None:
            await self.knowledge.index(tenant, records)

    async def delete(self, tenant: str, doc_ids: Sequence[str]) -> None:
        metadata = tenant_metadata(tenant)
        for start in range(0, len(doc_ids), 1000):
            ids = list(doc_ids[start : start + 1000])
            await _call(
                "lexical",
                lambda ids=ids: self.lexical.Delete(  # type: ignore[misc]
                    lexical_pb2.DeleteRequest(doc_ids=ids), metadata=metadata
                ),
            )
            await _call(
                "semantic",
                lambda ids=ids: self.semantic.Delete(  # type: ignore[misc]
                    semantic_pb2.DeleteRequest(doc_ids=ids), metadata=metadata
                ),
            )
        if self.knowledge is not None:
            await self.knowledge.delete(tenant, doc_ids)

    async def close(self) -> None:
        await self._lexical_channel.close()
        await self._semantic_channel.close()
        if self.knowledge is not None:
            await self.knowledge.close()


class LocalSinks:
    """The lexical backend and semantic index of this process (embedded mode)."""

    def __init__(self, lexical: LexicalBackend, semantic: SemanticIndex) -> None:
        self.lexical = lexical
        self.semantic = semantic
        # Personal-knowledge facts of what is indexed (attest.ingest.knowledge).
        self.knowledge: FactsHook | None = None

    async def index(self, tenant: str, records: Sequence[Record]) -> None:
        if not records:
            return
        lexical_docs: list[DocumentIn] = []
        semantic_docs: list[SemanticDoc] = []
        for r in records:
            a = r["article"]
            passages = record_passages(r)
            published = _published(r)
            common: dict[str, Any] = {
                "id": a["id"],
                "title": a["title"],
                "body": a["body"],
                "published_at": published,
                "source_url": a["source_url"],
                "keywords": record_keywords(r),
            }
            lexical_docs.append(
                DocumentIn(
                    **common,
                    metadata={**a["metadata"], "attest.content_hash": r["hash"]},
                    passages=tuple(
                        LexicalPassage(index=p.index, text=p.text, page=p.page) for p in passages
                    ),
                )
            )
            semantic_docs.append(
                SemanticDoc(
                    **common,
                    summary=r["summary"],
                    passages=tuple(
                        SemanticPassage(
                            index=p.index, text=p.text, vector=decode_vector(v), page=p.page
                        )
                        for p, v in zip(passages, r["passage_vectors"], strict=True)
                    ),
                    article_vector=decode_vector(r["article_vector"]),
                )
            )
        await self.lexical.index(tenant, lexical_docs, refresh=False)
        await self.semantic.index(tenant, semantic_docs)
        if self.knowledge is not None:
            await self.knowledge.index(tenant, records)

    async def delete(self, tenant: str, doc_ids: Sequence[str]) -> None:
        if doc_ids:
            await self.lexical.delete(tenant, list(doc_ids))
            await self.semantic.delete(tenant, list(doc_ids))
            if self.knowledge is not None:
                await self.knowledge.delete(tenant, doc_ids)

    async def close(self) -> None:
        await self.lexical.close()
        await self.semantic.close()
        if self.knowledge is not None:
            await self.knowledge.close()
