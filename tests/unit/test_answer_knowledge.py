"""The knowledge retriever: personal facts as citable passages of their documents.

Fake backends in this process: BM25 finds an unrelated document; the
knowledge service's Search returns personal facts with their provenance
(and an ESG graph fact, which has no document); the lexical service holds
the passages the facts were extracted from. The passage a fact points at
goes through fusion, reranking and generation like any other and is cited
with its document id and passage index, the fact it came from attached as
its provenance (and printed by `attest ask`); a knowledge service that is down,
slow or shed costs the answer that retriever only. A loopback gRPC server
checks that the knowledge search carries the caller's tenant.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from attest.answer.commands import render_answer
from attest.answer.downstream import GrpcBackends
from attest.answer.limits import LimitedBackends
from attest.answer.options import DEFAULT_RETRIEVERS, validate
from attest.answer.pipeline import AnswerPipeline, collect, fact_passages
from attest.answer.settings import (
    AnswerLimits,
    AnswerSettings,
    DownstreamLimit,
    DownstreamLimits,
    StageTimeouts,
)
from attest.answer.v1 import answer_pb2
from attest.common.v1 import common_pb2
from attest.core.auth import TENANT_KEY
from attest.core.context import tenant_var
from attest.core.errors import DeadlineExceeded, InvalidArgument, Unavailable
from attest.generate.v1 import generate_pb2
from attest.knowledge.v1 import knowledge_pb2, knowledge_pb2_grpc
from attest.lexical.v1 import lexical_pb2
from attest.rerank.v1 import rerank_pb2
from attest.retrieval.fusion import FITTED_RETRIEVERS, load_fusion_settings
from attest.semantic.v1 import semantic_pb2

QUESTION = "Who chairs Marrowgate Bank?"
# The passage the fact was extracted from, as the lexical service stores it.
PASSAGE = "The board named Rosalind Achebe-Fry chair of Marrowgate Bank in March."
PERSONAL = knowledge_pb2.KNOWLEDGE_BASE_PERSONAL


def chair_fact(doc_id: str = "esg-014", passage: int = 2, score: float = 0.8) -> knowledge_pb2.Fact:
    return knowledge_pb2.Fact(
        triple=knowledge_pb2.Triple(
            subject=knowledge_pb2.EntityRef(id="p1", name="Rosalind Achebe-Fry"),
            relation="chair of",
            object_entity=knowledge_pb2.EntityRef(id="p2", name="Marrowgate Bank"),
            knowledge_base=PERSONAL,
            source_doc_id=doc_id,
            provenance=knowledge_pb2.Provenance(passage_index=passage, start_char=40, end_char=96),
        ),
        score=score,
    )


def graph_fact() -> knowledge_pb2.Fact:
    """An ESG graph fact: no document, so never a source."""
    return knowledge_pb2.Fact(
        description=knowledge_pb2.Description(
            entity=knowledge_pb2.EntityRef(id="governance", name="Governance"),
            text="How an organization is directed and controlled.",
            knowledge_base=knowledge_pb2.KNOWLEDGE_BASE_ESG_GRAPH,
        ),
        score=0.9,
    )


class Backends:
    """BM25 finds only "news-1" (about something else); the knowledge service finds
    the chair fact of esg-014 passage 2, whose passage the lexical service holds."""

    def __init__(self, *, knowledge: str = "ok") -> None:
        self.knowledge = knowledge  # "ok", "down", "slow"
        self.knowledge_requests: list[knowledge_pb2.SearchRequest] = []
        self.lookups: list[lexical_pb2.SearchRequest] = []
        self.generated: list[generate_pb2.AnswerRequest] = []
        self.hold = asyncio.Event()  # never set: a slow knowledge service

    async def lexical_search(
        self, request: lexical_pb2.SearchRequest, seconds: float
    ) -> lexical_pb2.SearchResponse:
        if request.level == lexical_pb2.SEARCH_LEVEL_DOCUMENT:
            hit = lexical_pb2.Hit(
                doc_id="news-1", passage_index=-1, score=2.0, title="Rates", text="Rates rose."
            )
            return lexical_pb2.SearchResponse(hits=[hit])
        if request.query != QUESTION:
            self.lookups.append(request)
        hits = [
            lexical_pb2.Hit(doc_id="news-1", passage_index=0, score=3.0, text="Rates rose."),
            # esg-014 is a paged document (a PDF): its passage 2 is on page 60.
            lexical_pb2.Hit(
                doc_id="esg-014",
                passage_index=2,
                score=1.0,
                title="Marrowgate",
                text=PASSAGE,
                page=60,
            ),
        ]
        # Only the lookup by the fact's words reaches esg-014 (BM25 by the
        # question finds news-1 alone, so the knowledge retriever is the only
        # way to the supporting passage).
        return lexical_pb2.SearchResponse(hits=hits if request.query != QUESTION else hits[:1])

    async def knowledge_search(
        self, request: knowledge_pb2.SearchRequest, seconds: float
    ) -> knowledge_pb2.SearchResponse:
        self.knowledge_requests.append(request)
        if self.knowledge == "down":
            raise Unavailable("UNAVAILABLE: connection refused")
        if self.knowledge == "slow":
            # As a gRPC call does: the deadline it was given ends it.
            try:
                await asyncio.wait_for(self.hold.wait(), seconds)
            except TimeoutError:
                raise DeadlineExceeded("knowledge: Deadline Exceeded") from None
        return knowledge_pb2.SearchResponse(facts=[graph_fact(), chair_fact()])

    async def semantic_search(
        self, request: semantic_pb2.SearchRequest, seconds: float
    ) -> semantic_pb2.SearchResponse:
        return semantic_pb2.SearchResponse()

    async def embed(
        self, request: semantic_pb2.EmbedRequest, seconds: float
    ) -> semantic_pb2.EmbedResponse:
        return semantic_pb2.EmbedResponse()

    async def get_vectors(
        self, request: semantic_pb2.GetVectorsRequest, seconds: float
    ) -> semantic_pb2.GetVectorsResponse:
        return semantic_pb2.GetVectorsResponse()

    async def explain(
        self, request: semantic_pb2.ExplainRequest, seconds: float
    ) -> semantic_pb2.ExplainResponse:
        return semantic_pb2.ExplainResponse()

    async def rerank(
        self, request: rerank_pb2.RerankRequest, seconds: float
    ) -> rerank_pb2.RerankResponse:
        # Documents whose passages name the bank first, their passages as given.
        order = sorted(
            range(len(request.documents)),
            key=lambda i: not any("Marrowgate" in p.text for p in request.documents[i].passages),
        )
        return rerank_pb2.RerankResponse(
            documents=[
                rerank_pb2.RankedDocument(
                    input_index=i,
                    score=1.0 / (n + 1),
                    passages=[
                        rerank_pb2.RankedPassage(passage_index=p.index, score=0.5)
                        for p in request.documents[i].passages
                    ],
                )
                for n, i in enumerate(order)
            ]
        )

    async def generate(
        self, request: generate_pb2.AnswerRequest, seconds: float
    ) -> AsyncIterator[generate_pb2.AnswerResponse]:
        # Cites the source that states the answer, as the generator would.
        self.generated.append(request)
        citations = [
            common_pb2.Citation(
                source_index=i, doc_id=s.doc_id, passage_index=s.passage_index, confidence=9
            )
            for i, s in enumerate(request.sources)
            if "Achebe-Fry" in s.text
        ]
        sentence = common_pb2.AnswerSentence(
            index=0,
            text="Rosalind Achebe-Fry chairs Marrowgate Bank.",
            citations=citations,
            unsupported=not citations,
            confidence=9 if citations else 0,
        )
        yield generate_pb2.AnswerResponse(
            final=generate_pb2.AnswerFinal(answer=sentence.text, sentences=[sentence])
        )


def settings(**overrides: Any) -> AnswerSettings:
    return AnswerSettings(knowledge_address="127.0.0.1:1", **overrides)


def options(*retrievers: common_pb2.Retriever.ValueType) -> answer_pb2.AskOptions:
    return answer_pb2.AskOptions(retrieval=common_pb2.RetrievalOptions(retrievers=retrievers))


async def ask(
    backends: Any, config: AnswerSettings, opts: answer_pb2.AskOptions
) -> answer_pb2.Answer:
    plan = validate(QUESTION, opts, config, deadline_seconds=None)
    return await collect(AnswerPipeline(backends, config).run(plan))


async def test_a_passage_only_the_knowledge_retriever_finds_is_cited() -> None:
    fake = Backends()
    answer = await ask(
        fake,
        settings(),
        options(common_pb2.RETRIEVER_BM25, common_pb2.RETRIEVER_KNOWLEDGE),
    )
    assert not answer.degradations
    # The personal base only was asked, with the question.
    (request,) = fake.knowledge_requests
    assert request.query == QUESTION
    assert list(request.knowledge_bases) == [PERSONAL]
    # The fact's passage was looked up by the fact's words, under the request's filters.
    (lookup,) = fake.lookups
    assert lookup.query == "Rosalind Achebe-Fry chair of Marrowgate Bank"
    assert lookup.level == lexical_pb2.SEARCH_LEVEL_PASSAGE
    # The generator got the passage itself (not the fact's wording) and cited it.
    given = [(s.doc_id, s.passage_index, s.text, s.page) for s in fake.generated[0].sources]
    assert ("esg-014", 2, PASSAGE, 60) in given
    assert all(doc != "governance" for doc, _, _, _ in given)
    (citation,) = answer.sentences[0].citations
    assert (citation.doc_id, citation.passage_index) == ("esg-014", 2)
    cited = answer.sources[citation.source_index].source
    assert (cited.doc_id, cited.passage_index, cited.text) == ("esg-014", 2, PASSAGE)
    assert (cited.title, cited.page) == ("Marrowgate", 60)
    # The fact that led there is the source's provenance, with its offsets.
    (fact,) = cited.facts
    assert (fact.statement, fact.start_char, fact.end_char) == (
        "Rosalind Achebe-Fry chair of Marrowgate Bank",
        40,
        96,
    )
    assert fact.score == pytest.approx(0.8)
    # `attest ask` prints it under the cited source, which names its page.
    lines = list(render_answer(answer))
    at = lines.index(f"  [{citation.source_index + 1}] esg-014 passage 2  Marrowgate p. 60")
    assert lines[at + 1] == (
        "      fact: Rosalind Achebe-Fry chair of Marrowgate Bank (characters 40-96)"
    )
    # Sources no fact led to carry none; news-1 has no pages.
    assert all(not s.source.facts for s in answer.sources if s.source.doc_id != "esg-014")
    assert all(s.source.page == 0 for s in answer.sources if s.source.doc_id == "news-1")
    # Fused by the shipped fusion, which has no fitted weight for it.
    assert answer.sources[citation.source_index].fused_score > 0


async def test_without_the_knowledge_retriever_the_passage_is_not_found() -> None:
    fake = Backends()
    answer = await ask(fake, settings(), options(common_pb2.RETRIEVER_BM25))
    assert fake.knowledge_requests == []
    assert [s.source.doc_id for s in answer.sources] == ["news-1"]
    assert answer.sentences[0].unsupported


@pytest.mark.parametrize("failure", ["down", "slow"])
async def test_a_knowledge_service_down_or_slow_is_a_named_degradation(failure: str) -> None:
    fake = Backends(knowledge=failure)
    config = settings(timeouts=StageTimeouts(retrieve=0.2))
    answer = await ask(
        fake, config, options(common_pb2.RETRIEVER_BM25, common_pb2.RETRIEVER_KNOWLEDGE)
    )
    (degradation,) = answer.degradations
    assert degradation.stage == answer_pb2.STAGE_RETRIEVE_KG
    assert degradation.reason.startswith("knowledge service unavailable: ")
    # The answer is BM25's.
    assert [s.source.doc_id for s in answer.sources] == ["news-1"]
    assert answer.text


async def test_a_shed_knowledge_search_is_a_degradation_and_holds_up_nothing_else() -> None:
    # The only knowledge slot is held by another answer, with no queue: this
    # one's search is shed at once while its BM25 search runs.
    fake = Backends()
    limits = AnswerLimits(
        downstream=DownstreamLimits(knowledge=DownstreamLimit(max_in_flight=1, max_waiting=0))
    )
    limited = LimitedBackends(fake, limits)
    config = settings(limits=limits)
    async with limited.knowledge_limiter.slot(5.0):
        answer = await ask(
            limited, config, options(common_pb2.RETRIEVER_BM25, common_pb2.RETRIEVER_KNOWLEDGE)
        )
    (degradation,) = answer.degradations
    assert "knowledge: shed by the answer service" in degradation.reason
    assert fake.knowledge_requests == []
    assert [s.source.doc_id for s in answer.sources] == ["news-1"]


async def test_knowledge_takes_part_by_default_only_where_configured() -> None:
    fake = Backends()
    answer = await ask(fake, settings(), answer_pb2.AskOptions())
    assert len(fake.knowledge_requests) == 1
    assert ("esg-014", 2) in {(s.source.doc_id, s.source.passage_index) for s in answer.sources}

    unconfigured = AnswerSettings()
    plan = validate(QUESTION, answer_pb2.AskOptions(), unconfigured, deadline_seconds=None)
    assert plan.retrievers == DEFAULT_RETRIEVERS
    assert validate(
        QUESTION, answer_pb2.AskOptions(), settings(), deadline_seconds=None
    ).retrievers == (*DEFAULT_RETRIEVERS, common_pb2.RETRIEVER_KNOWLEDGE)
    with pytest.raises(InvalidArgument) as raised:
        validate(
            QUESTION,
            options(common_pb2.RETRIEVER_BM25, common_pb2.RETRIEVER_KNOWLEDGE),
            unconfigured,
            deadline_seconds=None,
        )
    assert raised.value.field == "options.retrieval.retrievers[1]"
    assert "no knowledge service" in raised.value.message
    assert AnswerSettings(knowledge_address="  ").knowledge_address is None


def test_only_personal_facts_with_a_passage_become_candidates() -> None:
    no_passage = chair_fact(doc_id="esg-025", passage=-1)
    again = chair_fact(score=0.95)  # the same passage: kept once, best score
    other = chair_fact(doc_id="esg-025", passage=0, score=0.3)
    found = fact_passages([graph_fact(), chair_fact(), no_passage, again, other])
    assert list(found) == [("esg-014", 2), ("esg-025", 0)]
    assert found[("esg-014", 2)][1] == pytest.approx(0.95)
    aspect = knowledge_pb2.Fact(
        aspect_fact=knowledge_pb2.AspectFact(
            entity=knowledge_pb2.EntityRef(name="Marrowgate Bank"),
            aspect="board",
            value="Shareholders voted to split the roles.",
            knowledge_base=PERSONAL,
            source_doc_id="esg-014",
            provenance=knowledge_pb2.Provenance(passage_index=0, start_char=0, end_char=38),
        )
    )
    assert fact_passages([aspect])[("esg-014", 0)][0] == (
        "Marrowgate Bank, board: Shareholders voted to split the roles."
    )


def test_the_shipped_fusion_weighs_knowledge_like_a_typical_fitted_retriever() -> None:
    shipped = load_fusion_settings()
    fused = [s for s in FITTED_RETRIEVERS if shipped.weight(s) > 0 and s not in shipped.rescore]
    assert fused
    if shipped.method == "linear":
        knowledge = shipped.features_of("knowledge")
        for feature in ("rank", "score", "found"):
            mean = sum(shipped.features[s][feature] for s in fused) / len(fused)
            assert knowledge[feature] == pytest.approx(mean)
        assert shipped.weight("knowledge") == 1.0
    else:
        mean = sum(shipped.weight(s) for s in fused) / len(fused)
        assert shipped.weight("knowledge") == pytest.approx(mean)
        assert shipped.weight("knowledge") > 0


async def test_the_knowledge_search_carries_the_callers_tenant() -> None:
    seen: list[str] = []

    class Knowledge(knowledge_pb2_grpc.KnowledgeServiceServicer):
        async def Search(
            self, request: knowledge_pb2.SearchRequest, context: Any
        ) -> knowledge_pb2.SearchResponse:
            seen.append(dict(context.invocation_metadata()).get(TENANT_KEY, ""))
            return knowledge_pb2.SearchResponse(facts=[chair_fact()])

    server = grpc.aio.server()
    knowledge_pb2_grpc.add_KnowledgeServiceServicer_to_server(Knowledge(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    config = AnswerSettings(knowledge_address=f"127.0.0.1:{port}")
    request = knowledge_pb2.SearchRequest(query=QUESTION)
    try:
        job = GrpcBackends(config, tenant="tenant-a")  # a queued job's tenant
        served = GrpcBackends(config)  # the tenant of the request being served
        try:
            response = await job.knowledge_search(request, 5.0)
            token = tenant_var.set("tenant-b")
            try:
                await served.knowledge_search(request, 5.0)
            finally:
                tenant_var.reset(token)
        finally:
            await job.close()
            await served.close()
    finally:
        await server.stop(None)
    assert seen == ["tenant-a", "tenant-b"]
    assert response.facts[0].triple.source_doc_id == "esg-014"


async def test_a_re_search_the_generator_could_not_run_is_a_named_degradation() -> None:
    """What the generator reports of its failed re-searches (its own tests show
    when it does) reaches the caller under STAGE_RESEARCH."""

    class Researching(Backends):
        async def generate(
            self, request: generate_pb2.AnswerRequest, seconds: float
        ) -> AsyncIterator[generate_pb2.AnswerResponse]:
            async for event in super().generate(request, seconds):
                if event.WhichOneof("event") == "final":
                    event.final.research_degraded_reason = (
                        "1 re-search failed, the sentence kept as written: no retriever "
                        "could run: lexical service unavailable: connection refused"
                    )
                yield event

    answer = await ask(Researching(), settings(), options(common_pb2.RETRIEVER_BM25))
    (degradation,) = answer.degradations
    assert degradation.stage == answer_pb2.STAGE_RESEARCH
    assert degradation.reason.endswith("lexical service unavailable: connection refused")


def test_attest_ask_names_the_page_of_a_paged_source_only() -> None:
    def source(doc_id: str, title: str, page: int) -> answer_pb2.AnswerSource:
        return answer_pb2.AnswerSource(
            source=common_pb2.Source(doc_id=doc_id, passage_index=4, title=title, page=page)
        )

    answer = answer_pb2.Answer(
        sources=[
            source("10k", "Annual Report 2024", 60),
            source("10k-draft", "", 7),
            source("wire", "Rates rose", 0),
        ]
    )
    lines = list(render_answer(answer))
    assert lines[lines.index("Sources:") + 1 :][:3] == [
        "  [1] 10k passage 4  Annual Report 2024 p. 60",
        "  [2] 10k-draft passage 4  10k-draft p. 7",
        "  [3] wire passage 4  Rates rose",
    ]


def test_attest_ask_shows_the_knowledge_graph_path_of_a_listed_source() -> None:
    def source(doc_id: str, path: list[str]) -> answer_pb2.AnswerSource:
        return answer_pb2.AnswerSource(
            source=common_pb2.Source(doc_id=doc_id, passage_index=0, title=doc_id),
            kg_path=common_pb2.KgPath(
                nodes=[common_pb2.KgPathNode(name=name, score=0.5) for name in path]
            ),
        )

    answer = answer_pb2.Answer(
        sentences=[
            common_pb2.AnswerSentence(
                text="Fennick cut food waste.",
                citations=[common_pb2.Citation(source_index=1, doc_id="b", confidence=7)],
            )
        ],
        sources=[
            source("a", ["Marrowgate chair", "Governance", "Sustainability"]),
            source("b", ["Fennick food waste", "Waste", "Sustainability"]),
        ],
    )
    lines = list(render_answer(answer))
    # Source [1] ranked first but is not cited, so not listed: the path shown
    # is that of [2], under its own number.
    assert "  [1] a passage 0  a" not in lines
    (path,) = [line for line in lines if line.startswith("Knowledge graph path")]
    assert path == (
        "Knowledge graph path of [2]: Fennick food waste (0.50) → Waste (0.50) → "
        "Sustainability (0.50)"
    )
    # No listed source with a path: no path line.
    answer.sources[1].ClearField("kg_path")
    assert not any(line.startswith("Knowledge graph") for line in render_answer(answer))


def test_attest_ask_marks_a_citation_of_a_source_the_answer_does_not_list() -> None:
    # An answer from a server of another version, or built by hand, may cite
    # a source index past its source list: the sentence says so, the list
    # keeps the sources it has, and nothing fails.
    answer = answer_pb2.Answer(
        sentences=[
            common_pb2.AnswerSentence(
                text="Fennick cut food waste.",
                citations=[
                    common_pb2.Citation(source_index=0, doc_id="a", confidence=8),
                    common_pb2.Citation(source_index=4, doc_id="ghost", confidence=6),
                    common_pb2.Citation(source_index=-1, confidence=5),
                ],
            )
        ],
        sources=[
            answer_pb2.AnswerSource(
                source=common_pb2.Source(doc_id="a", passage_index=0, title="Fennick")
            )
        ],
    )
    lines = list(render_answer(answer))
    assert lines[0] == (
        "  Fennick cut food waste. [1: 8/10] [ghost, not among the answer's sources: 6/10] "
        "[source index -1, not among the answer's sources: 5/10]"
    )
    assert lines[1:3] == ["Sources:", "  [1] a passage 0  Fennick"]
