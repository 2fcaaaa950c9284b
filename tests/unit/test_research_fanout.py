"""Re-search runs the answer's own retrievers and fusion (``attest.retrieval.fanout``).

A two-article corpus where only the KG retriever finds the article that
supports a weak sentence. The lexical and semantic services are fakes served
over real gRPC (the generate service's re-search reaches them through its own
stubs, as deployed); BM25 and dense find the water report for every query,
KG finds the supply audit for a query that names Halvorsen (the entity the
audit is linked to), and KG scores rank articles only (a passage-level KG
search is refused, as the semantic service refuses it). The answer pipeline
runs in process against the same fakes and calls the real generate servicer,
whose LLM is a fake HTTP server that writes a two-sentence answer, rates the
second sentence 3 (re-searched), and in the re-search rates whichever source
holds the audit's text 8.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from attest.answer.options import validate
from attest.answer.pipeline import AnswerPipeline
from attest.answer.settings import AnswerSettings
from attest.answer.v1 import answer_pb2
from attest.common.v1 import common_pb2
from attest.core.errors import InvalidArgument, Unavailable
from attest.generate.llm import LLMSettings
from attest.generate.pipeline import PipelineSettings
from attest.generate.servicer import GenerateServicer
from attest.generate.settings import GenerateSettings, ResearchSettings, build_generator
from attest.generate.v1 import generate_pb2
from attest.knowledge.v1 import knowledge_pb2
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
from attest.rerank.v1 import rerank_pb2
from attest.retrieval.fanout import Level, Limits, Query, retrieve
from attest.retrieval.fusion import FusionSettings
from attest.semantic.embedding import Embedder
from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc
from tests.integration.fake_llm import FakeLLM, cite_json

QUESTION = "How much water did Norvale Copper save in 2023?"
REPORT = "Norvale Copper saved 2 million litres of water in 2023."
AUDIT = "The Oslo smelter has taken ore from the Norvale pit since 2019."
FIRST = "Norvale Copper saved 2 million litres of water."
WEAK = "Halvorsen buys from Norvale."
ANSWER = f"{FIRST} {WEAK}"

EMBEDDER = Embedder()


class Lexical(lexical_pb2_grpc.LexicalServiceServicer):
    """BM25 finds the water report (article and passage 0) for any query."""

    def __init__(self) -> None:
        self.requests: list[lexical_pb2.SearchRequest] = []

    async def Search(self, request: lexical_pb2.SearchRequest, context: Any) -> Any:
        self.requests.append(request)
        if request.level == lexical_pb2.SEARCH_LEVEL_PASSAGE:
            hit = lexical_pb2.Hit(doc_id="report", passage_index=0, score=4.0, text=REPORT)
        else:
            hit = lexical_pb2.Hit(doc_id="report", passage_index=-1, score=4.0, text=REPORT)
        hit.title = "Norvale water report"
        return lexical_pb2.SearchResponse(hits=[hit])


class Semantic(semantic_pb2_grpc.SemanticServiceServicer):
    """Dense finds the water report; KG finds the audit for a query naming Halvorsen."""

    def __init__(self) -> None:
        self.requests: list[semantic_pb2.SearchRequest] = []

    async def Search(self, request: semantic_pb2.SearchRequest, context: Any) -> Any:
        self.requests.append(request)
        passage = request.level == semantic_pb2.SEARCH_LEVEL_PASSAGE
        if request.mode == semantic_pb2.SEARCH_MODE_KG:
            if passage:
                message = "KG scores rank articles; use level DOCUMENT"
                if context is None:
                    raise InvalidArgument(message, field="level")
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
            if "Halvorsen" not in request.query:
                return semantic_pb2.SearchResponse()
            hit = semantic_pb2.Hit(
                doc_id="audit", passage_index=-1, score=1.3, kg_score=1.3, text=AUDIT
            )
            hit.title = "Smelter supply audit"
            return semantic_pb2.SearchResponse(hits=[hit])
        hit = semantic_pb2.Hit(
            doc_id="report",
            passage_index=0 if passage else -1,
            score=0.8,
            dense_score=0.8,
            title="Norvale water report",
            text=REPORT,
        )
        return semantic_pb2.SearchResponse(hits=[hit])


def scripted_llm(prompt: str) -> str:
    if "Summarize the source" in prompt:
        body = re.search(r"<source[^>]*>\n(.*)\n</source>", prompt, re.S)
        return body.group(1) if body else ""
    if "Question:" in prompt:
        return ANSWER
    if WEAK in prompt and FIRST not in prompt:
        # The re-search of the weak sentence: the audit supports it, if given.
        found = re.search(r'<source id="(\d+)">\n' + re.escape(AUDIT), prompt)
        return cite_json((1, int(found.group(1)), 8)) if found else cite_json()
    return cite_json((1, 1, 9), (2, 1, 3))


class Backends:
    """The answer pipeline's backends in process: searches go to the fakes,
    generation to the real generate servicer; no reranker, no embedding."""

    def __init__(self, lexical: Lexical, semantic: Semantic, generate: GenerateServicer) -> None:
        self.lexical = lexical
        self.semantic = semantic
        self.generator = generate

    async def lexical_search(
        self, request: lexical_pb2.SearchRequest, seconds: float
    ) -> lexical_pb2.SearchResponse:
        response: lexical_pb2.SearchResponse = await self.lexical.Search(request, None)
        return response

    async def semantic_search(
        self, request: semantic_pb2.SearchRequest, seconds: float
    ) -> semantic_pb2.SearchResponse:
        response: semantic_pb2.SearchResponse = await self.semantic.Search(request, None)
        return response

    async def explain(self, request: Any, seconds: float) -> Any:
        raise Unavailable("no explanations here")

    async def embed(self, request: Any, seconds: float) -> Any:
        raise Unavailable("each search embeds the question")

    async def get_vectors(self, request: Any, seconds: float) -> Any:
        raise Unavailable("no stored vectors here")

    async def rerank(
        self, request: rerank_pb2.RerankRequest, seconds: float
    ) -> rerank_pb2.RerankResponse:
        raise Unavailable("no reranker here")

    async def generate(
        self, request: generate_pb2.AnswerRequest, seconds: float
    ) -> AsyncIterator[generate_pb2.AnswerResponse]:
        async for event in self.generator.Answer(request, None):  # type: ignore[arg-type]
            yield event

    async def knowledge_search(
        self, request: knowledge_pb2.SearchRequest, seconds: float
    ) -> knowledge_pb2.SearchResponse:
        raise Unavailable("no knowledge service here")


# The fusion these tests configure, not the shipped one (which is refitted
# now and then): BM25, dense and KG enhanced weighed, plain KG at 0.
FUSION_FILE = Path(__file__).with_name("research_fusion.json")


@pytest.fixture
async def services() -> AsyncIterator[tuple[Lexical, Semantic, GenerateServicer]]:
    lexical, semantic = Lexical(), Semantic()
    server = grpc.aio.server()
    lexical_pb2_grpc.add_LexicalServiceServicer_to_server(lexical, server)
    semantic_pb2_grpc.add_SemanticServiceServicer_to_server(semantic, server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    try:
        fake = await FakeLLM("tgi", scripted_llm).start()
        try:
            settings = GenerateSettings(
                llm=LLMSettings(url=fake.url),
                research=ResearchSettings(
                    lexical_address=address, semantic_address=address, fusion_settings=FUSION_FILE
                ),
                # The fake model's ratings as given, weak sentences kept marked.
                pipeline=PipelineSettings(llm_citation_rating="model", withdraw_unsupported=False),
            )
            generate = GenerateServicer(settings, build_generator(settings, embedder=EMBEDDER))
            try:
                yield lexical, semantic, generate
            finally:
                await generate.close()
        finally:
            await fake.stop()
    finally:
        await server.stop(None)


async def ask(
    services: tuple[Lexical, Semantic, GenerateServicer],
    retrievers: list[common_pb2.Retriever.ValueType],
    fusion: common_pb2.FusionMethod.ValueType,
) -> answer_pb2.Answer:
    settings = AnswerSettings(fusion_settings=FUSION_FILE)
    options = answer_pb2.AskOptions(
        retrieval=common_pb2.RetrievalOptions(retrievers=retrievers, fusion=fusion),
        fused_top_k=2,
        rerank_top_k=2,
        max_researches=1,
        confidence_threshold=5,
    )
    plan = validate(QUESTION, options, settings, deadline_seconds=None)
    pipeline = AnswerPipeline(Backends(*services), settings)  # type: ignore[arg-type]
    revisions = []
    final = None
    async for event in pipeline.run(plan):
        if event.WhichOneof("event") == "revision":
            revisions.append(event.revision)
        elif event.WhichOneof("event") == "final":
            final = event.final
    assert final is not None
    assert [r.sentence_index for r in revisions] == [1], "the weak sentence is re-searched"
    assert final.researches == 1
    return final


def cited(answer: answer_pb2.Answer, index: int) -> set[str]:
    return {c.doc_id for c in answer.sentences[index].citations}


BM25, DENSE, KG = common_pb2.RETRIEVER_BM25, common_pb2.RETRIEVER_DENSE, common_pb2.RETRIEVER_KG


async def test_the_revision_cites_the_article_only_kg_found(services: Any) -> None:
    lexical, semantic, _ = services
    answer = await ask(services, [BM25, DENSE, KG], common_pb2.FUSION_METHOD_RRF)
    # The question names no Halvorsen: the answer starts from the report alone.
    assert [s.source.doc_id for s in answer.sources if s.added_for_sentence < 0] == ["report"]
    assert cited(answer, 0) == {"report"}
    # The weak sentence's re-search asked KG for articles (never passages) and
    # added the audit, the article's own record, which the revision cites
    # first (the report's weak citation stays after it).
    assert [(c.doc_id, c.confidence) for c in answer.sentences[1].citations] == [
        ("audit", 8),
        ("report", 3),
    ]
    assert answer.sentences[1].confidence == 8
    [added] = [s for s in answer.sources if s.added_for_sentence == 1]
    assert (added.source.doc_id, added.source.passage_index) == ("audit", -1)
    assert added.source.text == AUDIT
    kg = [r for r in semantic.requests if r.mode == semantic_pb2.SEARCH_MODE_KG]
    assert [(r.query, r.level) for r in kg] == [
        (QUESTION, semantic_pb2.SEARCH_LEVEL_DOCUMENT),
        (WEAK, semantic_pb2.SEARCH_LEVEL_DOCUMENT),
    ]
    assert [r.query for r in lexical.requests if r.query == WEAK]


async def test_without_kg_the_revision_does_not_find_it(services: Any) -> None:
    _, semantic, _ = services
    answer = await ask(services, [BM25, DENSE], common_pb2.FUSION_METHOD_RRF)
    assert "audit" not in {s.source.doc_id for s in answer.sources}
    assert cited(answer, 1) == {"report"}
    assert answer.sentences[1].confidence == 3
    assert not [r for r in semantic.requests if r.mode == semantic_pb2.SEARCH_MODE_KG]


async def test_the_revision_fuses_with_the_requests_fusion(services: Any) -> None:
    # The configured fusion (``FUSION_FILE``) gives plain KG no weight: the answer's own search asks KG (its scores explain the
    # sources), the re-search does not, and the audit is not found.
    lexical, semantic, _ = services
    answer = await ask(services, [BM25, DENSE, KG], common_pb2.FUSION_METHOD_UNSPECIFIED)
    kg = [(r.query, r.level) for r in semantic.requests if r.mode == semantic_pb2.SEARCH_MODE_KG]
    assert kg == [(QUESTION, semantic_pb2.SEARCH_LEVEL_DOCUMENT)]
    # The re-search itself ran, with BM25 and dense.
    assert WEAK in [r.query for r in lexical.requests]
    assert WEAK in [r.query for r in semantic.requests if r.mode == semantic_pb2.SEARCH_MODE_DENSE]
    assert "audit" not in {s.source.doc_id for s in answer.sources}
    assert cited(answer, 1) == {"report"}


class Down:
    """A searcher whose semantic service is down."""

    def __init__(self) -> None:
        self.lexical = Lexical()

    async def lexical_search(
        self, request: lexical_pb2.SearchRequest, seconds: float
    ) -> lexical_pb2.SearchResponse:
        response: lexical_pb2.SearchResponse = await self.lexical.Search(request, None)
        return response

    async def semantic_search(self, request: Any, seconds: float) -> Any:
        raise Unavailable("down")

    async def knowledge_search(self, request: Any, seconds: float) -> Any:
        raise Unavailable("down")


async def test_passage_level_keys_passages_and_reports_failures() -> None:
    retrieval = await retrieve(
        Down(),
        Query(text=WEAK, retrievers=(BM25, DENSE, KG), top_k=5, level=Level.PASSAGE),
        Limits(timeout=1.0),
    )
    assert [(f.retriever, f.service, f.message) for f in retrieval.failures] == [
        (DENSE, "semantic", "down"),
        (KG, "semantic", "down"),
    ]
    assert [r.name for r in retrieval.lists] == ["bm25"]
    fused = retrieval.fuse(FusionSettings(method="rrf"), top_k=3)
    assert [key for key, _ in fused] == [("report", 0)]
    hit = retrieval.hits[("report", 0)]
    assert hit.text_of(0) == REPORT
    assert hit.bm25 == 4.0
    assert hit.fused == pytest.approx(1 / 61)


async def test_a_spent_deadline_skips_every_retriever() -> None:
    retrieval = await retrieve(
        Down(),
        Query(text=WEAK, retrievers=(BM25,), level=Level.PASSAGE),
        Limits(timeout=1.0, deadline=0.0),
    )
    assert not retrieval.lists
    [failure] = retrieval.failures
    assert "time budget was spent before BM25 retrieval" in failure.reason


async def test_an_unknown_research_retriever_is_invalid(services: Any) -> None:
    _, _, generate = services
    request = generate_pb2.AnswerRequest(
        question=QUESTION,
        sources=[common_pb2.Source(doc_id="report", text=REPORT)],
        research=common_pb2.RetrievalOptions(retrievers=[common_pb2.Retriever.ValueType(99)]),
    )
    with pytest.raises(InvalidArgument, match="unknown or unspecified retriever"):
        async for _ in generate.Answer(request, None):  # type: ignore[arg-type]
            pass


class Degraded:
    """A searcher whose lexical service is down and whose dense search finds
    nothing; KG finds the audit. Records what was asked."""

    def __init__(self, *args: object) -> None:
        self.asked: list[str] = []
        Degraded.last = self

    last: Degraded

    async def lexical_search(self, request: Any, seconds: float) -> Any:
        self.asked.append("bm25")
        raise Unavailable("lexical down")

    async def semantic_search(self, request: Any, seconds: float) -> Any:
        self.asked.append(semantic_pb2.SearchMode.Name(request.mode))
        if request.mode == semantic_pb2.SEARCH_MODE_KG:
            hit = semantic_pb2.Hit(doc_id="audit", passage_index=-1, score=1.3, text=AUDIT)
            return semantic_pb2.SearchResponse(hits=[hit])
        return semantic_pb2.SearchResponse()

    async def knowledge_search(self, request: Any, seconds: float) -> Any:
        self.asked.append("knowledge")
        raise Unavailable("no knowledge service")


def degraded_research(
    monkeypatch: pytest.MonkeyPatch, *retrievers: common_pb2.Retriever.ValueType
) -> Any:
    from attest.generate import servicer

    monkeypatch.setattr(servicer, "_StubSearcher", Degraded)
    settings = GenerateSettings(
        research=ResearchSettings(
            lexical_address="127.0.0.1:1",
            semantic_address="127.0.0.1:1",
            fusion_settings=FUSION_FILE,
        )
    )
    # ``FUSION_FILE`` weighs plain KG 0 (it weighs BM25, dense and KG enhanced).
    return servicer.Researcher(settings).search_fn(
        common_pb2.RetrievalOptions(retrievers=list(retrievers))
    )


async def test_an_unweighted_retriever_stands_in_when_no_weighted_one_finds_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    search = degraded_research(monkeypatch, BM25, DENSE, KG)
    found = await search(WEAK, 5)
    # BM25 failed and dense found nothing: KG, weighted 0, is asked after them
    # and its article is the re-search's find, as fusion would have let it be.
    assert [(s.doc_id, s.passage_index) for s in found.sources] == [("audit", -1)]
    # The answer will say it searched without BM25.
    assert found.skipped == ("lexical service unavailable: lexical down",)
    asked = Degraded.last.asked
    assert sorted(asked[:2]) == ["SEARCH_MODE_DENSE", "bm25"]
    assert asked[2:] == ["SEARCH_MODE_KG"]


async def test_the_knowledge_retriever_does_not_crowd_out_kg(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # KNOWLEDGE is weighted, KG is not, but the re-search cannot run KNOWLEDGE:
    # KG is what it runs.
    search = degraded_research(monkeypatch, KG, common_pb2.RETRIEVER_KNOWLEDGE)
    found = await search(WEAK, 5)
    assert [s.doc_id for s in found.sources] == ["audit"]
    assert found.skipped == ()
    assert "knowledge" not in Degraded.last.asked


async def test_a_bad_research_filter_fails_the_call(services: Any) -> None:
    # Checked up front, as the index services check it, instead of failing
    # every re-search downstream (logged and skipped).
    _, _, generate = services
    request = generate_pb2.AnswerRequest(
        question=QUESTION,
        sources=[common_pb2.Source(doc_id="report", text=REPORT)],
        research=common_pb2.RetrievalOptions(
            filters=[common_pb2.Filter(field="organization", any_of=["Norvale", ""])]
        ),
    )
    with pytest.raises(InvalidArgument, match="must not be empty") as raised:
        async for _ in generate.Answer(request, None):  # type: ignore[arg-type]
            pass
    assert raised.value.field == "research.filters[0].any_of[1]"


async def test_a_request_with_only_the_knowledge_retriever_is_not_re_searched(
    services: Any,
) -> None:
    # The generate service has no knowledge address: a re-search could only fail
    # (and report a degradation on every such answer), so none is attempted.
    lexical, semantic, generate = services
    asked_before = len(lexical.requests) + len(semantic.requests)
    request = generate_pb2.AnswerRequest(
        question=QUESTION,
        sources=[common_pb2.Source(doc_id="report", text=REPORT)],
        confidence_threshold=10,
        max_researches=3,
        research=common_pb2.RetrievalOptions(retrievers=[common_pb2.RETRIEVER_KNOWLEDGE]),
    )
    final = None
    async for event in generate.Answer(request, None):  # type: ignore[arg-type]
        if event.WhichOneof("event") == "final":
            final = event.final
    assert final is not None
    assert final.sentences, "an answer was written"
    assert any(s.confidence < 10 for s in final.sentences), "a sentence a re-search would take"
    assert final.researches == 0
    assert final.research_degraded_reason == ""
    assert len(lexical.requests) + len(semantic.requests) == asked_before


class Paged:
    """A searcher over a paged report: BM25 and dense find its passage 0, on
    page 12 (the dense record written before pages were kept says 0); KG finds
    the audit article, which has no page."""

    def __init__(self, *args: object) -> None:
        pass

    async def lexical_search(self, request: Any, seconds: float) -> Any:
        passage = request.level == lexical_pb2.SEARCH_LEVEL_PASSAGE
        hit = lexical_pb2.Hit(
            doc_id="report",
            passage_index=0 if passage else -1,
            score=4.0,
            text=REPORT,
            page=12 if passage else 0,
        )
        return lexical_pb2.SearchResponse(hits=[hit])

    async def semantic_search(self, request: Any, seconds: float) -> Any:
        if request.mode == semantic_pb2.SEARCH_MODE_KG:
            hit = semantic_pb2.Hit(doc_id="audit", passage_index=-1, score=1.3, text=AUDIT)
        else:
            hit = semantic_pb2.Hit(doc_id="report", passage_index=0, score=0.8, text=REPORT)
        return semantic_pb2.SearchResponse(hits=[hit])

    async def knowledge_search(self, request: Any, seconds: float) -> Any:
        raise Unavailable("no knowledge service")


async def test_re_searched_sources_keep_their_passages_pages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from attest.generate import servicer

    monkeypatch.setattr(servicer, "_StubSearcher", Paged)
    settings = GenerateSettings(
        research=ResearchSettings(lexical_address="127.0.0.1:1", semantic_address="127.0.0.1:1")
    )
    search = servicer.Researcher(settings).search_fn(
        common_pb2.RetrievalOptions(
            retrievers=[BM25, DENSE, KG], fusion=common_pb2.FUSION_METHOD_RRF
        )
    )
    found = await search(WEAK, 5)
    pages = {(s.doc_id, s.passage_index): s.page for s in found.sources}
    # The page BM25 knew stands though dense's older record had none.
    assert pages == {("report", 0): 12, ("audit", -1): 0}
    # And it reaches the revision's sources as the generate service sends them.
    sent = [servicer.source_to_proto(s) for s in found.sources]
    assert {(s.doc_id, s.page) for s in sent} == {("report", 12), ("audit", 0)}


def test_the_generate_service_passes_a_sources_page_through() -> None:
    from attest.generate.servicer import source_to_proto, sources_from_proto
    from attest.generate.settings import GenerateLimits

    given = [
        common_pb2.Source(doc_id="report", passage_index=3, text=REPORT, page=60),
        common_pb2.Source(doc_id="news", passage_index=0, text=FIRST),
    ]
    back = [source_to_proto(s) for s in sources_from_proto(given, GenerateLimits())]
    assert [(s.doc_id, s.passage_index, s.page) for s in back] == [
        ("report", 3, 60),
        ("news", 0, 0),
    ]
