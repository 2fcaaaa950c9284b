"""gRPC servicer of the knowledge service: validate, convert, call the KB core.

The ESG graph is served; the personal knowledge base is a later step, so
``Store`` is UNIMPLEMENTED and requests limited to the personal base find
nothing. Every KB call embeds text on the CPU, so it runs off the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Final

import grpc

from attest.core.errors import InvalidArgument, NotFound, Unavailable
from attest.core.settings import LoggingSettings, ServerSettings
from attest.core.validation import check_enum, check_id, check_range, check_text
from attest.knowledge import convert
from attest.knowledge.graph import load_graph
from attest.knowledge.kb import EsgKnowledgeBase
from attest.knowledge.planner import HeuristicPlanner
from attest.knowledge.plans import Interpreter, Program, rank_facts, validate_program
from attest.knowledge.settings import KnowledgeSettings
from attest.knowledge.v1 import knowledge_pb2, knowledge_pb2_grpc
from attest.semantic.embedding import Embedder

Context = grpc.aio.ServicerContext[Any, Any]

NO_LLM_PLANNER: Final = (
    "no LLM planner is configured; the heuristic planner planned from the question"
)
NO_PERSONAL_BASE: Final = "the personal knowledge base is not implemented yet; nothing was run"
STORE_UNIMPLEMENTED: Final = (
    "Store: the personal knowledge base is not implemented yet; only the ESG graph is served"
)


class KnowledgeServicer(knowledge_pb2_grpc.KnowledgeServiceServicer):
    service_name = knowledge_pb2.DESCRIPTOR.services_by_name["KnowledgeService"].full_name

    def __init__(self, settings: KnowledgeSettings, kb: EsgKnowledgeBase | None = None) -> None:
        self._settings = settings
        self._limits = settings.limits
        self._embedder = Embedder(
            settings.embedding_model,
            device=settings.embedding_device,
            batch_size=settings.embedding_batch_size,
        )
        self._kb = kb
        self._warm = False

    def register(self, server: grpc.aio.Server) -> None:
        knowledge_pb2_grpc.add_KnowledgeServiceServicer_to_server(self, server)

    async def warm_up(self) -> None:
        if self._kb is None:
            settings = self._settings
            self._kb = EsgKnowledgeBase(
                load_graph(settings.graph_path),
                self._embedder.encode,
                link_threshold=settings.link_threshold,
                single_word_threshold=settings.single_word_link_threshold,
                relation_threshold=settings.relation_threshold,
            )
        await asyncio.to_thread(self._kb.warm_up)
        self._warm = True

    async def close(self) -> None:
        self._warm = False

    def kb(self) -> EsgKnowledgeBase:
        if not self._warm or self._kb is None:
            raise Unavailable("the ESG knowledge base is not ready yet")
        return self._kb

    # -- checks

    def _bases(self, values: Sequence[int], field: str) -> bool:
        """Whether the request's bases include the ESG graph (an empty list means all)."""
        for i, value in enumerate(values):
            check_enum(value, knowledge_pb2.KnowledgeBase.values(), f"{field}[{i}]")
            if value == knowledge_pb2.KNOWLEDGE_BASE_UNSPECIFIED:
                raise InvalidArgument(
                    "must not be KNOWLEDGE_BASE_UNSPECIFIED", field=f"{field}[{i}]"
                )
        return not values or knowledge_pb2.KNOWLEDGE_BASE_ESG_GRAPH in values

    def _text(self, value: str, field: str, high: int, *, empty: bool = False) -> str:
        if not value.strip() and not empty:
            raise InvalidArgument("must not be empty", field=field)
        if len(value) > high:
            raise InvalidArgument(f"is longer than {high} characters", field=field)
        return check_text(value, field)

    def _count(self, value: int, default: int, high: int, field: str) -> int:
        check_range(value, 0, high, field)
        return value or default

    def _entity(self, entity_id: str, field: str) -> str:
        check_id(entity_id, field)
        if self.kb().entity(entity_id) is None:
            raise NotFound(f"no entity with id {entity_id!r}", field=field)
        return entity_id

    # -- RPCs

    async def LinkEntities(
        self, request: knowledge_pb2.LinkEntitiesRequest, context: Context
    ) -> knowledge_pb2.LinkEntitiesResponse:
        limits = self._limits
        if not 1 <= len(request.mentions) <= limits.max_mentions:
            raise InvalidArgument(
                f"must hold 1 to {limits.max_mentions} mentions", field="mentions"
            )
        mentions = [
            self._text(m, f"mentions[{i}]", limits.max_mention_chars)
            for i, m in enumerate(request.mentions)
        ]
        text = self._text(request.context, "context", limits.max_context_chars, empty=True)
        top_k = self._count(request.top_k, 5, limits.max_top_k, "top_k")
        if not self._bases(request.knowledge_bases, "knowledge_bases"):
            return knowledge_pb2.LinkEntitiesResponse(
                links=[knowledge_pb2.MentionLinks(mention=m) for m in mentions]
            )
        kb = self.kb()

        def link() -> list[knowledge_pb2.MentionLinks]:
            return [
                convert.linking_to_proto(kb.entity_linking([m], text, top_k=top_k))
                for m in mentions
            ]

        return knowledge_pb2.LinkEntitiesResponse(links=await asyncio.to_thread(link))

    async def GetEntityInfo(
        self, request: knowledge_pb2.GetEntityInfoRequest, context: Context
    ) -> knowledge_pb2.GetEntityInfoResponse:
        entity_id = self._entity(request.entity_id, "entity_id")
        max_facts = self._count(request.max_facts, 100, self._limits.max_facts, "max_facts")
        info = self.kb().get_entity_info([entity_id], max_facts=max_facts)
        return convert.info_to_proto(info)

    async def FindEntityOrValue(
        self, request: knowledge_pb2.FindEntityOrValueRequest, context: Context
    ) -> knowledge_pb2.FindEntityOrValueResponse:
        entity_id = self._entity(request.entity_id, "entity_id")
        relation = self._text(request.relation, "relation", self._limits.max_mention_chars)
        top_k = self._count(request.top_k, 10, self._limits.max_results, "top_k")
        match = await asyncio.to_thread(
            self.kb().find_entity_or_value, [entity_id], [relation], top_k=top_k
        )
        return knowledge_pb2.FindEntityOrValueResponse(
            facts=[convert.fact_to_proto(f) for f in match.facts]
        )

    async def FindRelationship(
        self, request: knowledge_pb2.FindRelationshipRequest, context: Context
    ) -> knowledge_pb2.FindRelationshipResponse:
        first = self._entity(request.first_entity_id, "first_entity_id")
        second = self._entity(request.second_entity_id, "second_entity_id")
        max_hops = self._count(request.max_hops, 1, 3, "max_hops")
        max_paths = self._count(request.max_paths, 10, self._limits.max_results, "max_paths")
        relationship = await asyncio.to_thread(
            self.kb().find_relationship, [first], [second], max_hops=max_hops, max_paths=max_paths
        )
        return knowledge_pb2.FindRelationshipResponse(
            paths=[convert.path_to_proto(p) for p in relationship.paths]
        )

    async def Store(
        self, request: knowledge_pb2.StoreRequest, context: Context
    ) -> knowledge_pb2.StoreResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, STORE_UNIMPLEMENTED)
        raise AssertionError("abort returns only by raising")

    async def Search(
        self, request: knowledge_pb2.SearchRequest, context: Context
    ) -> knowledge_pb2.SearchResponse:
        query = self._text(request.query, "query", self._limits.max_query_chars)
        plan_limits = self._settings.plans
        top_k = self._count(request.top_k, 10, self._limits.max_results, "top_k")
        use_graph = self._bases(request.knowledge_bases, "knowledge_bases")
        program: Program | None = None
        if request.program:
            # Checked before anything runs: an invalid program names its step.
            program = validate_program(request.program, plan_limits)
        kb = self.kb()

        def search() -> knowledge_pb2.SearchResponse:
            if program is not None:
                planned, planner, reason = program, knowledge_pb2.PLANNER_CALLER, ""
            else:
                planned = HeuristicPlanner(kb, plan_limits, extractor=kb.linker.extractor).plan(
                    query
                )
                planner, reason = knowledge_pb2.PLANNER_RULES, NO_LLM_PLANNER
            if not use_graph:
                # Only the personal base was asked for: the program is shown, nothing runs.
                return knowledge_pb2.SearchResponse(
                    program=planned.dumps(),
                    planner=planner,
                    degraded_reason=NO_PERSONAL_BASE,
                )
            run = Interpreter(kb, plan_limits).run(planned)
            ranked = rank_facts(run.facts, query, kb.encode, top_k)
            return convert.run_to_proto(run, ranked, planner, reason)

        return await asyncio.to_thread(search)


def service() -> tuple[KnowledgeServicer, ServerSettings, LoggingSettings]:
    """The knowledge service built from ATTEST_KNOWLEDGE_* (for ``attest serve knowledge``)."""
    settings = KnowledgeSettings()
    return KnowledgeServicer(settings), settings.server, settings.logging
