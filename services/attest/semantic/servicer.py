"""gRPC servicer of the semantic service: validate, convert, call the index."""

from __future__ import annotations

from typing import Any

import grpc

from attest.common.v1 import common_pb2
from attest.core.context import tenant_var
from attest.core.errors import InvalidArgument
from attest.core.validation import (
    check_enum,
    check_id,
    check_kg_top_n,
    datetime_from_timestamp,
)
from attest.semantic import convert
from attest.semantic.index import SemanticIndex
from attest.semantic.models import Vector
from attest.semantic.settings import SemanticSettings
from attest.semantic.store import DocumentPage
from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]

# Listing pages: records scanned per page (ListDocumentsRequest.page_size).
DEFAULT_PAGE_SIZE = 1000
MAX_PAGE_SIZE = 10_000
# A token is a phase and a point id (a UUID), or an integer id: never long.
MAX_PAGE_TOKEN_CHARS = 64

# Texts per Embed call: a question and a few of its parts, not a corpus (the
# Index RPC embeds documents).
MAX_EMBED_TEXTS = 64


def vector_to_proto(vector: Vector | None) -> semantic_pb2.Vector:
    """A vector as a message; None (nothing stored) as an empty one."""
    if vector is None:
        return semantic_pb2.Vector()
    return semantic_pb2.Vector(values=vector.tolist())


class SemanticServicer(semantic_pb2_grpc.SemanticServiceServicer):
    service_name = semantic_pb2.DESCRIPTOR.services_by_name["SemanticService"].full_name

    def __init__(self, settings: SemanticSettings, index: SemanticIndex | None = None) -> None:
        self._limits = settings.limits
        self.index = index if index is not None else SemanticIndex(settings)

    def register(self, server: grpc.aio.Server) -> None:
        semantic_pb2_grpc.add_SemanticServiceServicer_to_server(self, server)

    async def warm_up(self) -> None:
        await self.index.warm_up()

    async def close(self) -> None:
        await self.index.close()

    async def Index(
        self, request: semantic_pb2.IndexRequest, context: Context
    ) -> semantic_pb2.IndexResponse:
        for i, item in enumerate(request.documents):
            where = f"documents[{i}].document"
            check_id(item.document.id, f"{where}.id", self._limits.max_id_chars)
            if item.document.HasField("published_at"):
                datetime_from_timestamp(item.document.published_at, f"{where}.published_at")
        docs = convert.index_from_proto(request, self._limits)
        if request.embedding_model and request.embedding_model != self.index.embedder.name:
            raise InvalidArgument(
                f"vectors from {request.embedding_model!r} cannot be mixed with "
                f"{self.index.embedder.name!r}",
                field="embedding_model",
            )
        result = await self.index.index(tenant_var.get(), docs)
        return semantic_pb2.IndexResponse(
            documents=result.documents, passages=result.passages, kg_links=result.kg_links
        )

    async def Search(
        self, request: semantic_pb2.SearchRequest, context: Context
    ) -> semantic_pb2.SearchResponse:
        check_enum(request.fusion, common_pb2.FusionMethod.values(), "fusion")
        if request.HasField("kg_top_n"):
            check_kg_top_n(request.kg_top_n)
        query = convert.search_from_proto(request, self._limits)
        hits = await self.index.search(tenant_var.get(), query)
        return semantic_pb2.SearchResponse(
            hits=[convert.hit_to_proto(h, query.ids_only) for h in hits],
            backend=self.index.store.name,
            embedding_model=self.index.embedder.name,
        )

    async def Explain(
        self, request: semantic_pb2.ExplainRequest, context: Context
    ) -> semantic_pb2.ExplainResponse:
        check_id(request.doc_id, "doc_id", self._limits.max_id_chars)
        if request.HasField("kg_top_n"):
            check_kg_top_n(request.kg_top_n)
        query = convert.explain_from_proto(request, self._limits)
        score, nodes, paths = await self.index.explain(tenant_var.get(), request.doc_id, query)
        graph = self.index.graph
        limit = min(request.max_paths or convert.DEFAULT_EXPLAIN_PATHS, self._limits.max_paths)
        article = (request.doc_id, self.index.title(tenant_var.get(), request.doc_id))
        return semantic_pb2.ExplainResponse(
            doc_id=request.doc_id,
            kg_score=score.score,
            best_node_score=score.best_score,
            next_nodes_mean=score.next_mean,
            scoring_nodes=[convert.node_to_proto(n, graph, article=article) for n in nodes],
            paths=[convert.path_to_proto(p, graph, article) for p in paths[:limit]],
            paths_truncated=len(paths) > limit,
        )

    async def Delete(
        self, request: semantic_pb2.DeleteRequest, context: Context
    ) -> semantic_pb2.DeleteResponse:
        if not request.doc_ids:
            raise InvalidArgument("must contain at least one id", field="doc_ids")
        if len(request.doc_ids) > self._limits.max_batch:
            raise InvalidArgument(
                f"at most {self._limits.max_batch:,} ids are allowed", field="doc_ids"
            )
        for i, doc_id in enumerate(request.doc_ids):
            check_id(doc_id, f"doc_ids[{i}]", self._limits.max_id_chars)
        deleted = await self.index.delete(tenant_var.get(), list(request.doc_ids))
        return semantic_pb2.DeleteResponse(deleted=deleted)

    async def Stats(
        self, request: semantic_pb2.StatsRequest, context: Context
    ) -> semantic_pb2.StatsResponse:
        counts = await self.index.stats(tenant_var.get())
        return semantic_pb2.StatsResponse(
            documents=counts.documents,
            passages=counts.passages,
            linked_documents=counts.linked_documents,
            kg_links=counts.kg_links,
            backend=self.index.store.name,
            embedding_model=self.index.embedder.name,
            dimension=self.index.scorer.dim,
        )

    async def Embed(
        self, request: semantic_pb2.EmbedRequest, context: Context
    ) -> semantic_pb2.EmbedResponse:
        if not request.texts:
            raise InvalidArgument("must contain at least one text", field="texts")
        if len(request.texts) > MAX_EMBED_TEXTS:
            raise InvalidArgument(f"at most {MAX_EMBED_TEXTS} texts are allowed", field="texts")
        limit = self._limits.max_query_chars
        for i, text in enumerate(request.texts):
            if not text.strip():
                raise InvalidArgument("must not be blank", field=f"texts[{i}]")
            if len(text) > limit:
                raise InvalidArgument(
                    f"is {len(text):,} characters; the limit is {limit:,}", field=f"texts[{i}]"
                )
        vectors = await self.index.embed([t.strip() for t in request.texts])
        return semantic_pb2.EmbedResponse(
            vectors=[vector_to_proto(v) for v in vectors],
            embedding_model=self.index.embedder.name,
        )

    async def GetVectors(
        self, request: semantic_pb2.GetVectorsRequest, context: Context
    ) -> semantic_pb2.GetVectorsResponse:
        if not request.records:
            raise InvalidArgument("must contain at least one record", field="records")
        if len(request.records) > self._limits.max_batch:
            raise InvalidArgument(
                f"at most {self._limits.max_batch:,} records are allowed", field="records"
            )
        keys: list[tuple[str, int]] = []
        for i, record in enumerate(request.records):
            check_id(record.doc_id, f"records[{i}].doc_id", self._limits.max_id_chars)
            if record.passage_index < -1:
                raise InvalidArgument(
                    "must be -1 (the article) or a passage index",
                    field=f"records[{i}].passage_index",
                )
            keys.append((record.doc_id, record.passage_index))
        vectors = await self.index.vectors(tenant_var.get(), keys)
        return semantic_pb2.GetVectorsResponse(
            vectors=[vector_to_proto(v) for v in vectors],
            embedding_model=self.index.embedder.name,
        )

    async def ListDocuments(
        self, request: semantic_pb2.ListDocumentsRequest, context: Context
    ) -> semantic_pb2.ListDocumentsResponse:
        size = request.page_size or DEFAULT_PAGE_SIZE
        if not 1 <= size <= MAX_PAGE_SIZE:
            raise InvalidArgument(
                f"must be between 1 and {MAX_PAGE_SIZE:,}, or 0 for {DEFAULT_PAGE_SIZE:,}",
                field="page_size",
            )
        if len(request.page_token) > MAX_PAGE_TOKEN_CHARS:
            raise InvalidArgument("is not a token of this listing", field="page_token")
        page = await self.index.list_documents(tenant_var.get(), request.page_token, size)
        return page_to_proto(page)


def page_to_proto(page: DocumentPage) -> semantic_pb2.ListDocumentsResponse:
    return semantic_pb2.ListDocumentsResponse(
        documents=[
            semantic_pb2.StoredDocument(
                doc_id=d.doc_id,
                passages=d.passages,
                has_article=d.has_article,
                entity_ids=list(d.entity_ids),
                passages_sha256=d.passages_sha256,
            )
            for d in page.documents
        ],
        next_page_token=page.next_page_token,
    )
