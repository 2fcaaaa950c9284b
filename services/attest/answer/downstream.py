"""The answer pipeline's backends over gRPC, with failures translated at this edge.

A backend's failure is a dependency's (``attest.core.rpc_errors``,
``dependency=True``): INVALID_ARGUMENT stays ``InvalidArgument`` (the
caller's request was wrong, e.g. an unknown entity in a filter),
DEADLINE_EXCEEDED stays ``DeadlineExceeded``, and anything else (down,
overloaded, failing) is ``Unavailable``: the pipeline skips that stage.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

import grpc

from attest.answer.settings import AnswerSettings
from attest.core.auth import tenant_metadata
from attest.core.channels import create_channel
from attest.core.context import tenant_var
from attest.core.errors import AttestError, Unavailable
from attest.core.rpc_errors import from_rpc
from attest.generate.v1 import generate_pb2, generate_pb2_grpc
from attest.knowledge.v1 import knowledge_pb2, knowledge_pb2_grpc
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
from attest.rerank.v1 import rerank_pb2, rerank_pb2_grpc
from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc

T = TypeVar("T")

LEXICAL = "attest.lexical.v1.LexicalService"
SEMANTIC = "attest.semantic.v1.SemanticService"
RERANK = "attest.rerank.v1.RerankService"
KNOWLEDGE = "attest.knowledge.v1.KnowledgeService"


def translate(service: str, err: grpc.aio.AioRpcError) -> AttestError:
    return from_rpc(err, service=service, dependency=True)


async def _call(service: str, call: Awaitable[T]) -> T:
    try:
        return await call
    except grpc.aio.AioRpcError as err:
        raise translate(service, err) from None


class GrpcBackends:
    """Stubs of the services the answer pipeline calls; channels open on first use.

    Every call names the tenant it acts for: ``tenant`` (a queued job's), else
    the tenant of the request being served, so that lexical and semantic search,
    Explain and generate's re-search read that tenant's records only.
    """

    def __init__(self, settings: AnswerSettings, tenant: str | None = None) -> None:
        self._settings = settings
        self._tenant = tenant
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _metadata(self) -> tuple[tuple[str, str]]:
        return tenant_metadata(self._tenant if self._tenant is not None else tenant_var.get())

    def _channel(self, address: str, idempotent: list[tuple[str, str]]) -> grpc.aio.Channel:
        if address not in self._channels:
            # One channel per address: in embedded mode every service shares one.
            self._channels[address] = create_channel(
                address, self._settings.client, idempotent=idempotent
            )
        return self._channels[address]

    def _read_only(self) -> list[tuple[str, str]]:
        return [
            (LEXICAL, "Search"),
            (SEMANTIC, "Search"),
            (SEMANTIC, "Explain"),
            (SEMANTIC, "Embed"),
            (SEMANTIC, "GetVectors"),
            (RERANK, "Rerank"),
            (KNOWLEDGE, "Search"),
        ]

    async def lexical_search(
        self, request: lexical_pb2.SearchRequest, seconds: float
    ) -> lexical_pb2.SearchResponse:
        stub = lexical_pb2_grpc.LexicalServiceStub(
            self._channel(self._settings.lexical_address, self._read_only())
        )
        return await _call(
            "lexical", stub.Search(request, timeout=seconds, metadata=self._metadata())
        )

    async def semantic_search(
        self, request: semantic_pb2.SearchRequest, seconds: float
    ) -> semantic_pb2.SearchResponse:
        stub = semantic_pb2_grpc.SemanticServiceStub(
            self._channel(self._settings.semantic_address, self._read_only())
        )
        return await _call(
            "semantic", stub.Search(request, timeout=seconds, metadata=self._metadata())
        )

    async def explain(
        self, request: semantic_pb2.ExplainRequest, seconds: float
    ) -> semantic_pb2.ExplainResponse:
        stub = semantic_pb2_grpc.SemanticServiceStub(
            self._channel(self._settings.semantic_address, self._read_only())
        )
        return await _call(
            "semantic", stub.Explain(request, timeout=seconds, metadata=self._metadata())
        )

    async def embed(
        self, request: semantic_pb2.EmbedRequest, seconds: float
    ) -> semantic_pb2.EmbedResponse:
        stub = semantic_pb2_grpc.SemanticServiceStub(
            self._channel(self._settings.semantic_address, self._read_only())
        )
        return await _call(
            "semantic", stub.Embed(request, timeout=seconds, metadata=self._metadata())
        )

    async def get_vectors(
        self, request: semantic_pb2.GetVectorsRequest, seconds: float
    ) -> semantic_pb2.GetVectorsResponse:
        stub = semantic_pb2_grpc.SemanticServiceStub(
            self._channel(self._settings.semantic_address, self._read_only())
        )
        return await _call(
            "semantic", stub.GetVectors(request, timeout=seconds, metadata=self._metadata())
        )

    async def rerank(
        self, request: rerank_pb2.RerankRequest, seconds: float
    ) -> rerank_pb2.RerankResponse:
        stub = rerank_pb2_grpc.RerankServiceStub(
            self._channel(self._settings.rerank_address, self._read_only())
        )
        return await _call(
            "rerank", stub.Rerank(request, timeout=seconds, metadata=self._metadata())
        )

    async def knowledge_search(
        self, request: knowledge_pb2.SearchRequest, seconds: float
    ) -> knowledge_pb2.SearchResponse:
        address = self._settings.knowledge_address
        if address is None:
            raise Unavailable("no knowledge service is configured (knowledge_address)")
        stub = knowledge_pb2_grpc.KnowledgeServiceStub(self._channel(address, self._read_only()))
        return await _call(
            "knowledge", stub.Search(request, timeout=seconds, metadata=self._metadata())
        )

    async def generate(
        self, request: generate_pb2.AnswerRequest, seconds: float
    ) -> AsyncIterator[generate_pb2.AnswerResponse]:
        stub = generate_pb2_grpc.GenerateServiceStub(
            self._channel(self._settings.generate_address, self._read_only())
        )
        call = stub.Answer(request, timeout=seconds, metadata=self._metadata())
        try:
            async for event in call:
                yield event
        except grpc.aio.AioRpcError as err:
            raise translate("generate", err) from None

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
