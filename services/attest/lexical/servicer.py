"""gRPC servicer of the lexical service: validate, convert, call the backend."""

from __future__ import annotations

from typing import Any

import grpc

from attest.core.context import tenant_var
from attest.core.errors import Unavailable
from attest.lexical import convert
from attest.lexical.backends import LexicalBackend, create_backend
from attest.lexical.settings import LexicalSettings
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]


class LexicalServicer(lexical_pb2_grpc.LexicalServiceServicer):
    service_name = lexical_pb2.DESCRIPTOR.services_by_name["LexicalService"].full_name

    def __init__(self, settings: LexicalSettings, backend: LexicalBackend | None = None) -> None:
        self._settings = settings
        self._limits = settings.limits
        self.backend = backend if backend is not None else create_backend(settings)
        self._warm = False

    def register(self, server: grpc.aio.Server) -> None:
        lexical_pb2_grpc.add_LexicalServiceServicer_to_server(self, server)

    async def warm_up(self) -> None:
        await self.backend.warm_up()
        self._warm = True

    async def close(self) -> None:
        self._warm = False
        await self.backend.close()

    def _backend(self) -> LexicalBackend:
        if not self._warm:
            raise Unavailable(f"the {self.backend.name} backend is not ready yet")
        return self.backend

    async def Index(
        self, request: lexical_pb2.IndexRequest, context: Context
    ) -> lexical_pb2.IndexResponse:
        documents = convert.index_from_proto(request, self._limits)
        result = await self._backend().index(tenant_var.get(), documents, refresh=request.refresh)
        return convert.index_result_to_proto(result)

    async def Search(
        self, request: lexical_pb2.SearchRequest, context: Context
    ) -> lexical_pb2.SearchResponse:
        query = convert.search_from_proto(request, self._limits)
        backend = self._backend()
        hits = await backend.search(tenant_var.get(), query)
        return lexical_pb2.SearchResponse(
            hits=[convert.hit_to_proto(h, query.ids_only) for h in hits], backend=backend.name
        )

    async def Delete(
        self, request: lexical_pb2.DeleteRequest, context: Context
    ) -> lexical_pb2.DeleteResponse:
        doc_ids = convert.delete_from_proto(request, self._limits)
        deleted = await self._backend().delete(tenant_var.get(), doc_ids)
        return lexical_pb2.DeleteResponse(deleted=deleted)

    async def Stats(
        self, request: lexical_pb2.StatsRequest, context: Context
    ) -> lexical_pb2.StatsResponse:
        backend = self._backend()
        counts = await backend.stats(tenant_var.get())
        return convert.counts_to_proto(counts, backend.name)

    async def ListDocuments(
        self, request: lexical_pb2.ListDocumentsRequest, context: Context
    ) -> lexical_pb2.ListDocumentsResponse:
        token, size = convert.list_from_proto(request, self._limits)
        page = await self._backend().list_documents(tenant_var.get(), token, size)
        return convert.page_to_proto(page)
