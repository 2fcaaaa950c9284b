"""gRPC servicer of the knowledge service: validate, convert, call the KB core.

Two bases: the ESG graph (shared) and the caller's personal base (facts
from the tenant's documents, attest.knowledge.personal). The tenant comes
from the request's context like every other RPC; lookups and programs run
over both bases unless a request's ``knowledge_bases`` narrows them. Every KB
call embeds text on the CPU, so it runs off the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Final

import grpc

from attest.core.context import tenant_var
from attest.core.errors import FailedPrecondition, InvalidArgument, NotFound, Unavailable
from attest.core.settings import LoggingSettings, ServerSettings
from attest.core.validation import check_enum, check_id, check_range, check_text
from attest.generate.llm import LLMClient, create_client
from attest.knowledge import convert
from attest.knowledge.bases import CombinedKnowledgeBase
from attest.knowledge.graph import load_graph
from attest.knowledge.kb import (
    PERSONAL,
    AspectFact,
    Description,
    EntityRef,
    EsgKnowledgeBase,
    Fact,
    KnowledgeBase,
    Triple,
)
from attest.knowledge.llm_planner import LLMPlanner, Planned
from attest.knowledge.personal import (
    NameVectors,
    PersonalFact,
    PersonalKnowledgeBase,
    PersonalStore,
    TenantFacts,
    is_personal_id,
    personal_entity_id,
)
from attest.knowledge.planner import HeuristicPlanner
from attest.knowledge.plans import (
    Interpreter,
    PlanLimits,
    Program,
    ProgramRun,
    rank_facts,
    validate_program,
)
from attest.knowledge.settings import KnowledgeSettings
from attest.knowledge.v1 import knowledge_pb2, knowledge_pb2_grpc
from attest.semantic.embedding import Embedder

Context = grpc.aio.ServicerContext[Any, Any]

NO_LLM_PLANNER: Final = (
    "no LLM planner is configured; the heuristic planner planned from the question"
)
NO_PERSONAL_BASE: Final = "the personal knowledge base is disabled on this server"
# What the service searches for while it warms up (``KnowledgeServicer._warm_search``):
# a relation, an entity the graph names and words the rules planner links by embedding.
WARM_UP_QUERY: Final = "Which GRI topic covers greenhouse gas emissions of mining companies?"
MAX_NAME_CHARS: Final = 256
MAX_VALUE_CHARS: Final = 4096


class KnowledgeServicer(knowledge_pb2_grpc.KnowledgeServiceServicer):
    service_name = knowledge_pb2.DESCRIPTOR.services_by_name["KnowledgeService"].full_name

    def __init__(
        self,
        settings: KnowledgeSettings,
        kb: EsgKnowledgeBase | None = None,
        personal: PersonalStore | None = None,
    ) -> None:
        self._settings = settings
        self._limits = settings.limits
        self._embedder = Embedder(
            settings.embedding_model,
            device=settings.embedding_device,
            batch_size=settings.embedding_batch_size,
        )
        self._kb = kb
        self._personal = personal
        self._names: NameVectors | None = None
        self._warm = False
        self._llm: LLMClient | None = None

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
        tenants: list[str] = []
        if self._settings.personal.enabled:
            if self._personal is None:
                self._personal = await asyncio.to_thread(
                    build_personal_store, self._settings, self._kb.encode
                )
            await self._personal.warm_up()
            if self._names is None:
                self._names = NameVectors(self._kb.encode)
            # Every tenant's facts and name index, not at its first search.
            tenants = await self._personal.load_views()
            for tenant in tenants:
                view = await self._personal.view(tenant)
                await asyncio.to_thread(view.warm_up, self._names)
        try:
            await self._warm_search(self._kb, tenants[0] if tenants else None)
        except Exception as exc:
            raise RuntimeError(f"the warm-up search failed ({type(exc).__name__}: {exc})") from exc
        self._warm = True

    async def _warm_search(self, esg: EsgKnowledgeBase, tenant: str | None) -> None:
        """One search with the rules planner before SERVING (over the ESG graph,
        and ``tenant``'s personal base when there is one), so that the first
        search loads nothing: the keyphrase extractor's imports (RAKE, nltk),
        the personal engines' first reads."""
        query = WARM_UP_QUERY
        bases: list[KnowledgeBase] = [esg]
        retrieved: list[Fact] = []
        if tenant is not None and self._personal is not None:
            bases.append(self._personal_kb(await self._personal.view(tenant)))
            retrieved = await self._personal.retrieve(tenant, query, 3)
        kb = bases[0] if len(bases) == 1 else CombinedKnowledgeBase(bases)
        plans = self._settings.plans

        def search() -> None:
            planned = HeuristicPlanner(kb, plans, extractor=esg.linker.extractor).plan(query)
            _run(kb, esg, plans, planned, query, 3, retrieved)

        await asyncio.to_thread(search)

    async def close(self) -> None:
        self._warm = False
        if self._llm is not None:
            await self._llm.close()
        if self._personal is not None:
            await self._personal.close()

    def kb(self) -> EsgKnowledgeBase:
        if not self._warm or self._kb is None:
            raise Unavailable("the ESG knowledge base is not ready yet")
        return self._kb

    def personal_store(self) -> PersonalStore:
        self.kb()
        if self._personal is None:
            raise FailedPrecondition(NO_PERSONAL_BASE)
        return self._personal

    async def personal_kb(self, tenant: str) -> PersonalKnowledgeBase:
        return self._personal_kb(await self.personal_store().view(tenant))

    def _personal_kb(self, view: TenantFacts) -> PersonalKnowledgeBase:
        settings = self._settings.personal
        assert self._personal is not None
        return PersonalKnowledgeBase(
            view,
            self._personal.encode,
            link_threshold=settings.link_threshold,
            relation_threshold=settings.relation_threshold,
            name_vectors=self._names,
        )

    async def base(self, graph: bool = True, personal: bool = True) -> KnowledgeBase:
        """The bases a request asked for, as one (the personal one of the caller's tenant)."""
        bases: list[KnowledgeBase] = []
        if graph:
            bases.append(self.kb())
        if personal and self._personal is not None:
            bases.append(await self.personal_kb(tenant_var.get()))
        if not bases:
            return CombinedKnowledgeBase([self.kb()])
        return bases[0] if len(bases) == 1 else CombinedKnowledgeBase(bases)

    # -- checks

    def _bases(self, values: Sequence[int], field: str) -> tuple[bool, bool]:
        """Whether the request's bases include the ESG graph and the personal base
        (an empty list means both)."""
        for i, value in enumerate(values):
            check_enum(value, knowledge_pb2.KnowledgeBase.values(), f"{field}[{i}]")
            if value == knowledge_pb2.KNOWLEDGE_BASE_UNSPECIFIED:
                raise InvalidArgument(
                    "must not be KNOWLEDGE_BASE_UNSPECIFIED", field=f"{field}[{i}]"
                )
        if not values:
            return True, True
        return (
            knowledge_pb2.KNOWLEDGE_BASE_ESG_GRAPH in values,
            knowledge_pb2.KNOWLEDGE_BASE_PERSONAL in values,
        )

    def _text(self, value: str, field: str, high: int, *, empty: bool = False) -> str:
        if not value.strip() and not empty:
            raise InvalidArgument("must not be empty", field=field)
        if len(value) > high:
            raise InvalidArgument(f"is longer than {high} characters", field=field)
        return check_text(value, field)

    def _count(self, value: int, default: int, high: int, field: str) -> int:
        check_range(value, 0, high, field)
        return value or default

    async def _entity(self, entity_id: str, field: str) -> tuple[str, KnowledgeBase]:
        check_id(entity_id, field)
        base = await self.base()
        if base.entity(entity_id) is None:
            raise NotFound(f"no entity with id {entity_id!r}", field=field)
        return entity_id, base

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
        graph, personal = self._bases(request.knowledge_bases, "knowledge_bases")
        if not graph and (not personal or self._personal is None):
            return knowledge_pb2.LinkEntitiesResponse(
                links=[knowledge_pb2.MentionLinks(mention=m) for m in mentions]
            )
        kb = await self.base(graph, personal)

        def link() -> list[knowledge_pb2.MentionLinks]:
            if isinstance(kb, PersonalKnowledgeBase):
                # The mentions that need embeddings embedded in one batch.
                linkings = kb.link_mentions([[m] for m in mentions], text, top_k=top_k)
            else:
                linkings = [kb.entity_linking([m], text, top_k=top_k) for m in mentions]
            return [convert.linking_to_proto(linking) for linking in linkings]

        return knowledge_pb2.LinkEntitiesResponse(links=await asyncio.to_thread(link))

    async def GetEntityInfo(
        self, request: knowledge_pb2.GetEntityInfoRequest, context: Context
    ) -> knowledge_pb2.GetEntityInfoResponse:
        entity_id, kb = await self._entity(request.entity_id, "entity_id")
        max_facts = self._count(request.max_facts, 100, self._limits.max_facts, "max_facts")
        info = await asyncio.to_thread(kb.get_entity_info, [entity_id], max_facts=max_facts)
        return convert.info_to_proto(info)

    async def FindEntityOrValue(
        self, request: knowledge_pb2.FindEntityOrValueRequest, context: Context
    ) -> knowledge_pb2.FindEntityOrValueResponse:
        entity_id, kb = await self._entity(request.entity_id, "entity_id")
        relation = self._text(request.relation, "relation", self._limits.max_mention_chars)
        top_k = self._count(request.top_k, 10, self._limits.max_results, "top_k")
        match = await asyncio.to_thread(
            kb.find_entity_or_value, [entity_id], [relation], top_k=top_k
        )
        return knowledge_pb2.FindEntityOrValueResponse(
            facts=[convert.fact_to_proto(f) for f in match.facts]
        )

    async def FindRelationship(
        self, request: knowledge_pb2.FindRelationshipRequest, context: Context
    ) -> knowledge_pb2.FindRelationshipResponse:
        first, kb = await self._entity(request.first_entity_id, "first_entity_id")
        second, _ = await self._entity(request.second_entity_id, "second_entity_id")
        max_hops = self._count(request.max_hops, 1, 3, "max_hops")
        max_paths = self._count(request.max_paths, 10, self._limits.max_results, "max_paths")
        relationship = await asyncio.to_thread(
            kb.find_relationship, [first], [second], max_hops=max_hops, max_paths=max_paths
        )
        return knowledge_pb2.FindRelationshipResponse(
            paths=[convert.path_to_proto(p) for p in relationship.paths]
        )

    async def Store(
        self, request: knowledge_pb2.StoreRequest, context: Context
    ) -> knowledge_pb2.StoreResponse:
        store = self.personal_store()
        doc_id = check_id(request.source_doc_id, "source_doc_id")
        total = len(request.descriptions) + len(request.triples) + len(request.aspect_facts)
        limit = self._settings.personal.max_facts_per_document
        if total > limit:
            raise InvalidArgument(
                f"holds {total} facts; at most {limit} per request", field="aspect_facts"
            )
        tenant = tenant_var.get()
        view = await store.view(tenant)
        known = set(view.names)
        facts = _StoreRequest(self.kb(), known).facts(request)
        result = await store.put(tenant, doc_id, facts)
        return knowledge_pb2.StoreResponse(
            descriptions=result.counts["description"],
            triples=result.counts["triple"],
            aspect_facts=result.counts["aspect"],
            removed=result.removed,
            entities_created=result.entities_created,
            entities=[convert.ref_to_proto(r) for r in result.entities],
        )

    async def GetDocumentFacts(
        self, request: knowledge_pb2.GetDocumentFactsRequest, context: Context
    ) -> knowledge_pb2.GetDocumentFactsResponse:
        doc_id = check_id(request.source_doc_id, "source_doc_id")
        view = await self.personal_store().view(tenant_var.get())
        facts = view.document_facts(doc_id)
        return knowledge_pb2.GetDocumentFactsResponse(
            descriptions=[
                convert.description_to_proto(f) for f in facts if isinstance(f, Description)
            ],
            triples=[convert.triple_to_proto(f) for f in facts if isinstance(f, Triple)],
            aspect_facts=[convert.aspect_to_proto(f) for f in facts if isinstance(f, AspectFact)],
        )

    async def ListFactDocuments(
        self, request: knowledge_pb2.ListFactDocumentsRequest, context: Context
    ) -> knowledge_pb2.ListFactDocumentsResponse:
        if self._personal is None:
            raise FailedPrecondition(NO_PERSONAL_BASE)
        size = self._count(request.page_size, 1000, 10_000, "page_size")
        view = await self._personal.view(tenant_var.get())
        ids = sorted(d for d in view.documents if d > request.page_token)
        page = ids[:size]
        return knowledge_pb2.ListFactDocumentsResponse(
            documents=[
                knowledge_pb2.FactDocument(doc_id=d, facts=len(view.document_facts(d)))
                for d in page
            ],
            next_page_token=page[-1] if len(ids) > size else "",
        )

    async def Search(
        self, request: knowledge_pb2.SearchRequest, context: Context
    ) -> knowledge_pb2.SearchResponse:
        query = self._text(request.query, "query", self._limits.max_query_chars)
        plan_limits = self._settings.plans
        top_k = self._count(request.top_k, 10, self._limits.max_results, "top_k")
        graph, personal = self._bases(request.knowledge_bases, "knowledge_bases")
        program: Program | None = None
        if request.program:
            # Checked before anything runs: an invalid program names its step.
            program = validate_program(request.program, plan_limits)
        esg = self.kb()
        personal = personal and self._personal is not None
        if not graph and not personal:
            planned = program or HeuristicPlanner(
                esg, plan_limits, extractor=esg.linker.extractor
            ).plan(query)
            return knowledge_pb2.SearchResponse(
                program=planned.dumps(),
                planner=knowledge_pb2.PLANNER_CALLER if program else knowledge_pb2.PLANNER_RULES,
                degraded_reason=NO_PERSONAL_BASE,
            )
        kb = await self.base(graph, personal)
        retrieved: list[Fact] = []
        if personal:
            # BM25 and vectors over the personal facts' texts, besides the program.
            retrieved = await self.personal_store().retrieve(tenant_var.get(), query, top_k)

        by_llm: Planned | None = None
        if program is None and self._settings.planner != "heuristic":
            # The LLM plans (the heuristic planner when its plan is refused; the reason says).
            if self._llm is None:
                self._llm = create_client(self._settings.llm)
            by_llm = await LLMPlanner(
                kb,
                plan_limits,
                self._llm,
                heuristic=HeuristicPlanner(kb, plan_limits, extractor=esg.linker.extractor),
                require_linked=self._settings.planner == "hybrid",
            ).plan(query)

        def search() -> knowledge_pb2.SearchResponse:
            if program is not None:
                planned, planner, reason = program, knowledge_pb2.PLANNER_CALLER, ""
            elif by_llm is not None:
                planned, reason = by_llm.program, by_llm.reason
                planner = (
                    knowledge_pb2.PLANNER_LLM
                    if by_llm.planner == "llm"
                    else knowledge_pb2.PLANNER_RULES
                )
            else:
                planned = HeuristicPlanner(kb, plan_limits, extractor=esg.linker.extractor).plan(
                    query
                )
                planner, reason = knowledge_pb2.PLANNER_RULES, NO_LLM_PLANNER
            run, ranked = _run(kb, esg, plan_limits, planned, query, top_k, retrieved)
            return convert.run_to_proto(run, ranked, planner, reason)

        return await asyncio.to_thread(search)


def _run(
    kb: KnowledgeBase,
    esg: EsgKnowledgeBase,
    limits: PlanLimits,
    planned: Program,
    query: str,
    top_k: int,
    retrieved: Sequence[Fact],
) -> tuple[ProgramRun, list[Fact]]:
    """The program run over ``kb`` and the facts ranked: the program's facts
    answer the question; what retrieval adds comes after them."""
    run = Interpreter(kb, limits).run(planned)
    programmed = rank_facts(run.facts, query, esg.encode, top_k)
    seen = {f.key() for f in programmed}
    extra = [f for f in retrieved if f.key() not in seen]
    return run, programmed + rank_facts(extra, query, esg.encode, top_k - len(programmed))


class _StoreRequest:
    """A StoreRequest's facts, checked, with every entity given its id."""

    def __init__(self, graph: EsgKnowledgeBase, personal_ids: set[str]) -> None:
        self.graph = graph
        self.personal_ids = personal_ids

    def _text(self, value: str, field: str, high: int) -> str:
        if not value.strip():
            raise InvalidArgument("must not be empty", field=field)
        if len(value) > high:
            raise InvalidArgument(f"is longer than {high} characters", field=field)
        return check_text(value, field)

    def ref(self, ref: knowledge_pb2.EntityRef, field: str) -> EntityRef:
        name = self._text(ref.name, f"{field}.name", MAX_NAME_CHARS)
        if not ref.id:
            return EntityRef(personal_entity_id(name), name)
        check_id(ref.id, f"{field}.id")
        graph_entity = self.graph.entity(ref.id)
        if graph_entity is not None:
            return EntityRef(ref.id, graph_entity.name)
        if is_personal_id(ref.id) and ref.id in self.personal_ids:
            return EntityRef(ref.id, name)
        raise InvalidArgument(
            f"no entity of either base has the id {ref.id!r}", field=f"{field}.id"
        )

    def provenance(self, message: Any, field: str) -> Any:
        present = message.HasField("provenance")
        p = message.provenance
        if present:
            if p.passage_index < -1:
                raise InvalidArgument(
                    "must be -1 or more", field=f"{field}.provenance.passage_index"
                )
            if p.start_char < 0 or p.end_char < p.start_char:
                raise InvalidArgument(
                    "must satisfy 0 <= start_char <= end_char", field=f"{field}.provenance"
                )
        return convert.provenance_from_proto(p, present)

    def facts(self, request: knowledge_pb2.StoreRequest) -> list[PersonalFact]:
        out: list[PersonalFact] = []
        for i, d in enumerate(request.descriptions):
            field = f"descriptions[{i}]"
            out.append(
                Description(
                    self.ref(d.entity, f"{field}.entity"),
                    self._text(d.text, f"{field}.text", MAX_VALUE_CHARS),
                    PERSONAL,
                    provenance=self.provenance(d, field),
                )
            )
        for i, t in enumerate(request.triples):
            field = f"triples[{i}]"
            subject = self.ref(t.subject, f"{field}.subject")
            relation = self._text(t.relation, f"{field}.relation", MAX_NAME_CHARS)
            which = t.WhichOneof("object")
            if which is None:
                raise InvalidArgument(
                    "needs object_entity or object_value", field=f"{field}.object"
                )
            obj = (
                self.ref(t.object_entity, f"{field}.object_entity")
                if which == "object_entity"
                else None
            )
            value = (
                self._text(t.object_value, f"{field}.object_value", MAX_VALUE_CHARS)
                if which == "object_value"
                else None
            )
            out.append(
                Triple(
                    subject, relation, obj, value, PERSONAL, provenance=self.provenance(t, field)
                )
            )
        for i, a in enumerate(request.aspect_facts):
            field = f"aspect_facts[{i}]"
            out.append(
                AspectFact(
                    self.ref(a.entity, f"{field}.entity"),
                    self._text(a.aspect, f"{field}.aspect", MAX_NAME_CHARS),
                    self._text(a.value, f"{field}.value", MAX_VALUE_CHARS),
                    PERSONAL,
                    provenance=self.provenance(a, field),
                )
            )
        return out


def build_personal_store(settings: KnowledgeSettings, encode: Any) -> PersonalStore:
    """The personal store the settings describe (cheap: nothing opens before warm_up)."""
    from attest.core.write_barrier import WriteBarrier
    from attest.knowledge.store_lock import personal_store_lock
    from attest.lexical.backends import create_backend
    from attest.lexical.settings import LexicalSettings
    from attest.semantic.store import create_store

    p = settings.personal
    lexical = create_backend(
        LexicalSettings(
            backend=p.lexical_backend,
            index_name=p.index_name,
            data_dir=settings.data_dir,
            opensearch=p.opensearch,
        )
    )
    dimension = int(encode(["dimension"]).shape[1])
    vectors = create_store(
        p.vector_store,
        path=settings.data_dir / "knowledge" / "vectors",
        url=p.qdrant_url,
        api_key=p.qdrant_api_key,
        collection_prefix=p.collection_prefix,
        dimension=dimension,
        timeout_seconds=p.timeout_seconds,
    )
    lock = personal_store_lock(settings)
    # Embedded (a lock of its own): its writes honour the data directory's backup barrier.
    barrier = WriteBarrier(settings.data_dir) if lock is not None else None
    return PersonalStore(lexical, vectors, encode, lock=lock, barrier=barrier)


def service() -> tuple[KnowledgeServicer, ServerSettings, LoggingSettings]:
    """The knowledge service built from ATTEST_KNOWLEDGE_* (for ``attest serve knowledge``)."""
    settings = KnowledgeSettings()
    return KnowledgeServicer(settings), settings.server, settings.logging
