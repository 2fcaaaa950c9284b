"""Per-downstream admission of the answer pipelines' calls.

``LimitedBackends`` wraps the pipeline's backends: every call to a
downstream service first takes a slot of that service's own ``Limiter``
(``AnswerLimits.downstream``), so a stage that is slow under load (the CPU
reranker, generation) queues only its own calls and BM25 searches never wait
behind it. A call's wait for its slot counts against its stage timeout; a
call that finds its downstream's queue full, or whose wait would outlast the
timeout, fails its stage at once as ``Unavailable`` (the pipeline skips the
stage and names it in the answer's degradations) instead of timing out
inside the downstream service.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from attest.answer.pipeline import Backends
from attest.answer.settings import AnswerLimits, DownstreamLimit
from attest.core.admission import Limiter
from attest.core.errors import DeadlineExceeded, ResourceExhausted, Unavailable
from attest.generate.v1 import generate_pb2
from attest.knowledge.v1 import knowledge_pb2
from attest.lexical.v1 import lexical_pb2
from attest.rerank.v1 import rerank_pb2
from attest.semantic.v1 import semantic_pb2


def _limiter(name: str, limit: DownstreamLimit, max_wait_seconds: float) -> Limiter:
    return Limiter(name, limit.max_in_flight, limit.max_waiting, max_wait_seconds)


@contextlib.asynccontextmanager
async def _admitted(limiter: Limiter, seconds: float) -> AsyncIterator[float]:
    """Hold a slot of ``limiter``; yields what is left of ``seconds`` after the wait."""
    stack = contextlib.AsyncExitStack()
    try:
        waited = await stack.enter_async_context(limiter.slot(seconds))
    except ResourceExhausted as exc:
        raise Unavailable(f"{limiter.name}: shed by the answer service: {exc.message}") from None
    except DeadlineExceeded as exc:
        raise DeadlineExceeded(f"{limiter.name}: {exc.message}") from None
    async with stack:
        yield seconds - waited


class LimitedBackends:
    """``backends`` with a concurrency limit and a bounded queue per downstream service."""

    def __init__(self, backends: Backends, limits: AnswerLimits) -> None:
        self.inner = backends
        d = limits.downstream
        # A wait is capped by the call's own timeout (``seconds``), not by a
        # setting of its own: the budget of a stage is the stage timeout.
        cap = limits.max_budget_seconds
        self.lexical_limiter = _limiter("lexical", d.lexical, cap)
        self.semantic_limiter = _limiter("semantic", d.semantic, cap)
        self.explain_limiter = _limiter("explain", d.explain, cap)
        self.rerank_limiter = _limiter("rerank", d.rerank, cap)
        self.generate_limiter = _limiter("generate", d.generate, cap)
        self.knowledge_limiter = _limiter("knowledge", d.knowledge, cap)

    def limiters(self) -> list[Limiter]:
        return [
            self.lexical_limiter,
            self.semantic_limiter,
            self.explain_limiter,
            self.rerank_limiter,
            self.generate_limiter,
            self.knowledge_limiter,
        ]

    async def lexical_search(
        self, request: lexical_pb2.SearchRequest, seconds: float
    ) -> lexical_pb2.SearchResponse:
        async with _admitted(self.lexical_limiter, seconds) as left:
            return await self.inner.lexical_search(request, left)

    async def semantic_search(
        self, request: semantic_pb2.SearchRequest, seconds: float
    ) -> semantic_pb2.SearchResponse:
        async with _admitted(self.semantic_limiter, seconds) as left:
            return await self.inner.semantic_search(request, left)

    async def explain(
        self, request: semantic_pb2.ExplainRequest, seconds: float
    ) -> semantic_pb2.ExplainResponse:
        async with _admitted(self.explain_limiter, seconds) as left:
            return await self.inner.explain(request, left)

    async def embed(
        self, request: semantic_pb2.EmbedRequest, seconds: float
    ) -> semantic_pb2.EmbedResponse:
        async with _admitted(self.semantic_limiter, seconds) as left:
            return await self.inner.embed(request, left)

    async def get_vectors(
        self, request: semantic_pb2.GetVectorsRequest, seconds: float
    ) -> semantic_pb2.GetVectorsResponse:
        async with _admitted(self.semantic_limiter, seconds) as left:
            return await self.inner.get_vectors(request, left)

    async def rerank(
        self, request: rerank_pb2.RerankRequest, seconds: float
    ) -> rerank_pb2.RerankResponse:
        async with _admitted(self.rerank_limiter, seconds) as left:
            return await self.inner.rerank(request, left)

    async def knowledge_search(
        self, request: knowledge_pb2.SearchRequest, seconds: float
    ) -> knowledge_pb2.SearchResponse:
        async with _admitted(self.knowledge_limiter, seconds) as left:
            return await self.inner.knowledge_search(request, left)

    async def generate(
        self, request: generate_pb2.AnswerRequest, seconds: float
    ) -> AsyncIterator[generate_pb2.AnswerResponse]:
        async with _admitted(self.generate_limiter, seconds) as left:
            async for event in self.inner.generate(request, left):
                yield event
