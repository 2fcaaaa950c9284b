"""What the stores hold, per tenant, for reconciliation with the registry (``attest doctor``).

Two readers build the same ``StoreShapes`` from pages of the same listing:

* ``EmbeddedListing``: the lexical backend and the semantic index of this
  process (tantivy and the embedded vector engine, or any backend opened here);
* ``ServiceListing``: the lexical and semantic services' ``ListDocuments`` RPCs
  (OpenSearch, Elasticsearch, Qdrant behind them), on channels that retry the
  idempotent listing on UNAVAILABLE, with a deadline on every page.

Either raises ``StoreUnreachable`` naming the store that could not be read,
so that a periodic check can count the failure by store and go on.
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from attest.core.errors import AttestError, Unavailable

if TYPE_CHECKING:
    from attest.core.settings import ClientSettings
    from attest.ingest.sinks import LocalSinks

LEXICAL = "attest.lexical.v1.LexicalService"
SEMANTIC = "attest.semantic.v1.SemanticService"
PAGE_SIZE = 1000
T = TypeVar("T")


class StoreUnreachable(Unavailable):
    """A store could not be listed (down, overloaded, timed out, or failing)."""

    def __init__(self, store: str, detail: str) -> None:
        super().__init__(f"{store}: {detail}")
        self.store = store


@dataclass
class StoreShapes:
    """One tenant's documents as each store holds them.

    ``lexical`` and ``vectors``: doc id -> passage records; ``kg_links``: doc id
    -> its sorted entity ids joined by commas (articles only); ``partial``:
    per store, the ids whose passages are there without their document or
    article record (held in another shape than the registry's).
    """

    lexical: dict[str, int] = field(default_factory=dict)
    vectors: dict[str, int] = field(default_factory=dict)
    kg_links: dict[str, str] = field(default_factory=dict)
    partial: dict[str, set[str]] = field(
        default_factory=lambda: {"lexical": set(), "vectors": set(), "kg_links": set()}
    )
    # Per store (lexical, vectors): doc id -> passages_digest of the texts it
    # holds, for the ids whose store read them (none from the engines' listing).
    digests: dict[str, dict[str, str]] = field(
        default_factory=lambda: {"lexical": {}, "vectors": {}}
    )

    def by_store(self) -> dict[str, dict[str, Any]]:
        return {"lexical": self.lexical, "vectors": self.vectors, "kg_links": self.kg_links}

    def empty(self) -> bool:
        return not (self.lexical or self.vectors)

    def add_lexical(self, doc_id: str, passages: int, has_document: bool, digest: str = "") -> None:
        self.lexical[doc_id] = passages
        if digest:
            self.digests["lexical"][doc_id] = digest
        if not has_document:
            self.partial["lexical"].add(doc_id)

    def add_vectors(
        self,
        doc_id: str,
        passages: int,
        has_article: bool,
        entity_ids: list[str] | tuple[str, ...],
        digest: str = "",
    ) -> None:
        # A passage-only id may be listed again on a later page with the same figures.
        self.vectors[doc_id] = passages
        if digest:
            self.digests["vectors"][doc_id] = digest
        if has_article:
            self.kg_links[doc_id] = ",".join(sorted(entity_ids))
        else:
            self.partial["vectors"].add(doc_id)


class StoreListing(abc.ABC):
    """Reads every store of one deployment for one tenant at a time."""

    @abc.abstractmethod
    async def shapes(self, tenant: str) -> StoreShapes: ...

    @abc.abstractmethod
    async def close(self) -> None:
        """Release what the listing opened."""


async def _guarded(store: str, call: Callable[[], Awaitable[T]]) -> T:
    try:
        return await call()
    except StoreUnreachable:
        raise
    except AttestError as err:
        raise StoreUnreachable(store, err.message) from err
    except Exception as err:  # a backend failure of any kind: the check reports it
        raise StoreUnreachable(store, f"{type(err).__name__}: {err}") from err


class EmbeddedListing(StoreListing):
    """The stores opened in this process (``LocalSinks``)."""

    def __init__(self, sinks: LocalSinks) -> None:
        self.sinks = sinks

    async def shapes(self, tenant: str) -> StoreShapes:
        out = StoreShapes()
        lexical, semantic = self.sinks.lexical, self.sinks.semantic
        token = ""
        while True:
            page = await _guarded(
                "lexical",
                lambda t=token: lexical.list_documents(tenant, t, PAGE_SIZE),  # type: ignore[misc]
            )
            for d in page.documents:
                out.add_lexical(d.doc_id, d.passages, d.has_document, d.passages_sha256)
            token = page.next_page_token
            if not token:
                break
        while True:
            vpage = await _guarded(
                "vectors",
                lambda t=token: semantic.list_documents(tenant, t, PAGE_SIZE),  # type: ignore[misc]
            )
            for v in vpage.documents:
                out.add_vectors(
                    v.doc_id, v.passages, v.has_article, v.entity_ids, v.passages_sha256
                )
            token = vpage.next_page_token
            if not token:
                break
        return out

    async def close(self) -> None:
        """Nothing: the stores belong to whoever opened the sinks."""


class ServiceListing(StoreListing):
    """The lexical and semantic services, called for each tenant in turn (under this
    process's service identity, naming the tenant, like the pipeline's writes)."""

    def __init__(self, lexical_address: str, semantic_address: str, client: ClientSettings) -> None:
        from attest.core.channels import create_channel
        from attest.lexical.v1 import lexical_pb2_grpc
        from attest.semantic.v1 import semantic_pb2_grpc

        self._timeout = client.timeout_seconds
        self._lexical_channel = create_channel(
            lexical_address, client, idempotent=[(LEXICAL, "ListDocuments")]
        )
        self._semantic_channel = create_channel(
            semantic_address, client, idempotent=[(SEMANTIC, "ListDocuments")]
        )
        self.lexical = lexical_pb2_grpc.LexicalServiceStub(self._lexical_channel)
        self.semantic = semantic_pb2_grpc.SemanticServiceStub(self._semantic_channel)

    async def _rpc(self, store: str, call: Callable[[], Awaitable[T]]) -> T:
        import grpc

        from attest.core.rpc_errors import from_rpc

        try:
            return await call()
        except grpc.aio.AioRpcError as err:
            # Whatever failed, the store was not read: the reason is the
            # translator's for a dependency (a status other than UNAVAILABLE
            # stays named in it).
            raise StoreUnreachable(store, from_rpc(err, dependency=True).message) from err

    async def shapes(self, tenant: str) -> StoreShapes:
        from attest.core.auth import tenant_metadata
        from attest.lexical.v1 import lexical_pb2
        from attest.semantic.v1 import semantic_pb2

        metadata = tenant_metadata(tenant)
        out = StoreShapes()
        token = ""
        while True:
            lreq = lexical_pb2.ListDocumentsRequest(page_size=PAGE_SIZE, page_token=token)
            lpage = await self._rpc(
                "lexical",
                lambda r=lreq: self.lexical.ListDocuments(  # type: ignore[misc]
                    r, metadata=metadata, timeout=self._timeout
                ),
            )
            for d in lpage.documents:
                out.add_lexical(d.doc_id, d.passages, d.has_document, d.passages_sha256)
            token = lpage.next_page_token
            if not token:
                break
        while True:
            sreq = semantic_pb2.ListDocumentsRequest(page_size=PAGE_SIZE, page_token=token)
            spage = await self._rpc(
                "vectors",
                lambda r=sreq: self.semantic.ListDocuments(  # type: ignore[misc]
                    r, metadata=metadata, timeout=self._timeout
                ),
            )
            for v in spage.documents:
                out.add_vectors(
                    v.doc_id, v.passages, v.has_article, list(v.entity_ids), v.passages_sha256
                )
            token = spage.next_page_token
            if not token:
                break
        return out

    async def close(self) -> None:
        await self._lexical_channel.close()
        await self._semantic_channel.close()
