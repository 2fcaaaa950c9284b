"""The answer service through its public gRPC API, over real in-process services.

Lexical (on a real OpenSearch node), semantic (embedded vector engine, ESG graph), rerank (the
embedding fallback) and generate (extractive) run on one server on a free
port; answer services, each wired differently, run on servers of their own.
A dependency that is "down" is an address where nothing listens.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf.duration_pb2 import Duration

from attest.answer.servicer import AnswerServicer
from attest.answer.settings import AnswerLimits, AnswerSettings
from attest.answer.v1 import answer_pb2, answer_pb2_grpc
from attest.common.v1 import common_pb2
from attest.core.channels import create_channel
from attest.core.server import running
from attest.core.settings import ServerSettings
from attest.demo.run import sample_documents
from attest.generate.llm import LLMSettings
from attest.generate.pipeline import PipelineSettings
from attest.generate.servicer import GenerateServicer
from attest.generate.settings import GenerateSettings, ResearchSettings, build_generator
from attest.ingest.passages import split_passages
from attest.knowledge.graph import load_graph
from attest.knowledge.linking import EntityLinker
from attest.lexical.servicer import LexicalServicer
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
from attest.rerank.servicer import RerankServicer
from attest.rerank.settings import RerankSettings
from attest.semantic.embedding import Embedder
from attest.semantic.index import SemanticIndex
from attest.semantic.servicer import SemanticServicer
from attest.semantic.settings import SemanticSettings
from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc
from tests.conftest import drop_indexes, lexical_settings
from tests.integration.fake_llm import FakeLLM, cite_json
from tests.integration.ingest_stack import free_port

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

EMBEDDER = Embedder()
LOCAL = ServerSettings(host="127.0.0.1", port=0)
CHILD_LABOUR = (
    "How many workers under the age of 16 did Loomlight Labour Watch find at Corliss Garment Works?"
)


def corpus() -> list[common_pb2.Document]:
    """The bundled sample news, split into passages and linked to the ESG graph."""
    docs = sample_documents()
    linker = EntityLinker(load_graph(), EMBEDDER.encode)
    for doc, links in zip(docs, linker.link_many([(d.title, d.body) for d in docs]), strict=True):
        doc.entity_ids.extend(link.entity_id for link in links)
        for span in split_passages(doc.body, 60):
            doc.passages.append(
                common_pb2.Passage(
                    doc_id=doc.id,
                    index=span.index,
                    text=span.text,
                    start_char=span.start_char,
                    end_char=span.end_char,
                )
            )
    return docs


def scripted_llm(prompt: str) -> str:
    """An LLM whose second sentence is weakly supported, so it gets re-searched."""
    if "Summarize the source" in prompt:
        body = re.search(r"<source[^>]*>\n(.*)\n</source>", prompt, re.S)
        return body.group(1) if body else ""
    if "Question:" in prompt:
        return "Loomlight found 14 workers under 16 at Corliss. Halvorsen buys from Corliss."
    if "Halvorsen buys from Corliss." in prompt and "Loomlight found" not in prompt:
        return cite_json((1, 1, 8))  # the re-search of sentence 2
    return cite_json((1, 1, 9), (2, 1, 3))


class Stack:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.exit = AsyncExitStack()
        self.deps = ""
        self.dead = f"127.0.0.1:{free_port()}"
        self.channels: list[grpc.aio.Channel] = []

    async def start(self) -> None:
        lexical = lexical_settings("opensearch", self.tmp)
        self.exit.push_async_callback(drop_indexes, lexical)
        semantic = SemanticSettings(data_dir=self.tmp, server=LOCAL)
        server = await self.exit.enter_async_context(
            running(
                [
                    LexicalServicer(lexical),
                    SemanticServicer(semantic, SemanticIndex(semantic, embedder=EMBEDDER)),
                    RerankServicer(RerankSettings(server=LOCAL, device="cpu")),
                ],
                LOCAL,
                ready_timeout=300,
            )
        )
        self.deps = f"127.0.0.1:{server.port}"
        channel = self.channel(self.deps)
        docs = await asyncio.to_thread(corpus)
        await lexical_pb2_grpc.LexicalServiceStub(channel).Index(
            lexical_pb2.IndexRequest(documents=docs, refresh=True), timeout=120
        )
        await semantic_pb2_grpc.SemanticServiceStub(channel).Index(
            semantic_pb2.IndexRequest(
                documents=[semantic_pb2.IndexDocument(document=d) for d in docs]
            ),
            timeout=300,
        )
        self.generate = await self.start_generate(LLMSettings())
        self.generate_no_llm = await self.start_generate(
            LLMSettings(url=f"http://{self.dead}", max_attempts=1, connect_timeout_seconds=1)
        )
        self.fake = await FakeLLM("tgi", scripted_llm).start()
        self.exit.push_async_callback(self.fake.stop)
        self.generate_llm = await self.start_generate(LLMSettings(url=self.fake.url))

    last_answer: AnswerServicer

    def channel(self, address: str) -> grpc.aio.Channel:
        channel = create_channel(address)
        self.channels.append(channel)
        return channel

    async def start_generate(self, llm: LLMSettings) -> str:
        settings = GenerateSettings(
            server=LOCAL,
            llm=llm,
            research=ResearchSettings(lexical_address=self.deps, semantic_address=self.deps),
            # The fake model's ratings as given, and weak sentences kept marked:
            # these tests follow the events through the answer service; the
            # support judge is tested with the generator.
            pipeline=PipelineSettings(llm_citation_rating="model", withdraw_unsupported=False),
        )
        servicer = GenerateServicer(settings, build_generator(settings, embedder=EMBEDDER))
        server = await self.exit.enter_async_context(running([servicer], LOCAL, ready_timeout=300))
        return f"127.0.0.1:{server.port}"

    async def answer(self, **overrides: Any) -> Any:
        """An answer service wired to the stack, with some addresses overridden."""
        addresses = {
            "lexical_address": self.deps,
            "semantic_address": self.deps,
            "rerank_address": self.deps,
            "generate_address": self.generate,
        }
        settings = AnswerSettings(server=LOCAL, **{**addresses, **overrides})
        self.last_answer = AnswerServicer(settings)
        server = await self.exit.enter_async_context(running([self.last_answer], LOCAL))
        return answer_pb2_grpc.AnswerServiceStub(self.channel(f"127.0.0.1:{server.port}"))

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()
        await self.exit.aclose()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("answer"))
    try:
        await s.start()
        yield s
    finally:
        await s.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def answer(stack: Stack) -> Any:
    return await stack.answer()


def check_citations(answer: answer_pb2.Answer) -> None:
    """Every citation points at a source of the answer, with a 0-10 confidence."""
    for s in answer.sentences:
        assert bool(s.citations) != s.unsupported
        assert 0 <= s.confidence <= 10
        if s.citations:
            assert s.confidence == max(c.confidence for c in s.citations)
        for c in s.citations:
            assert 0 <= c.source_index < len(answer.sources)
            assert answer.sources[c.source_index].source.doc_id == c.doc_id
            assert answer.sources[c.source_index].source.passage_index == c.passage_index
            assert 1 <= c.confidence <= 10


def stages(answer: answer_pb2.Answer) -> list[str]:
    return [answer_pb2.Stage.Name(t.stage) for t in answer.timings]


def degraded(answer: answer_pb2.Answer) -> dict[str, str]:
    return {answer_pb2.Stage.Name(d.stage): d.reason for d in answer.degradations}


async def test_ask_answers_with_citations_and_the_kg_path(answer: Any) -> None:
    response = await answer.Ask(
        answer_pb2.AskRequest(question=CHILD_LABOUR, options=answer_pb2.AskOptions(explain=True)),
        timeout=120,
    )
    a = response.answer
    assert not a.degradations, degraded(a)
    assert not a.insufficient_information
    assert "14" in a.text
    check_citations(a)
    cited = {c.doc_id for s in a.sentences for c in s.citations}
    assert "esg-005" in cited
    top = a.sources[0]
    assert top.source.doc_id == "esg-005"
    assert top.HasField("bm25_score")
    assert top.HasField("dense_score")
    assert top.HasField("kg_score")
    assert top.HasField("fused_score")
    assert 0 <= top.rerank_score <= 1
    assert 0 <= top.passage_score <= 1
    assert top.added_for_sentence == -1
    assert top.source.summary
    nodes = top.kg_path.nodes
    assert nodes[0].level == common_pb2.KG_NODE_LEVEL_ARTICLE
    assert nodes[0].name == top.source.title
    assert nodes[-1].level == common_pb2.KG_NODE_LEVEL_ROOT
    assert stages(a)[:6] == [
        "STAGE_RETRIEVE_BM25",
        "STAGE_RETRIEVE_DENSE",
        "STAGE_RETRIEVE_KG",
        "STAGE_FUSE",
        "STAGE_RERANK",
        "STAGE_SUMMARIZE",
    ]
    assert {"STAGE_GENERATE", "STAGE_CITE"} <= set(stages(a))
    assert a.total.ToNanoseconds() > 0
    assert a.llm_calls == 0


async def test_ask_stream_orders_events_and_revises_weak_sentences(stack: Stack) -> None:
    stub = await stack.answer(generate_address=stack.generate_llm)
    options = answer_pb2.AskOptions(confidence_threshold=5, max_researches=2, rerank_top_k=3)
    events = [
        e
        async for e in stub.AskStream(
            answer_pb2.AskStreamRequest(question=CHILD_LABOUR, options=options), timeout=120
        )
    ]
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "retrieval"
    assert kinds[-1] == "final"
    assert kinds.count("final") == 1
    assert kinds.count("retrieval") == 1
    first_revision = kinds.index("revision")
    # The model's sentences as drafts while it writes, then each one cited.
    assert all(k in ("draft", "sentence") for k in kinds[1:first_revision])
    drafts = [e.draft for e in events if e.WhichOneof("event") == "draft"]
    cited = [e.sentence for e in events if e.WhichOneof("event") == "sentence"]
    assert [(d.index, d.text) for d in drafts] == [(c.index, c.text) for c in cited]
    assert kinds.index("draft") < kinds.index("sentence")
    assert all(k == "revision" for k in kinds[first_revision:-1])
    retrieval, final = events[0].retrieval, events[-1].final
    assert 0 < len(retrieval.sources) <= 3
    assert retrieval.candidates >= len(retrieval.sources)
    assert [e.sentence.confidence for e in events if e.WhichOneof("event") == "sentence"] == [9, 3]
    revisions = [e.revision for e in events if e.WhichOneof("event") == "revision"]
    assert len(revisions) == final.researches == 1
    assert revisions[0].sentence_index == 1
    assert revisions[0].previous_confidence == 3
    assert revisions[0].sentence.confidence == 8
    assert final.sentences[1].confidence == 8
    assert final.llm_calls > 0
    for r in revisions:
        assert final.sentences[r.sentence_index] == r.sentence
        for k, added in enumerate(r.added_sources):
            source = final.sources[r.first_added_source_index + k]
            assert source.source.doc_id == added.doc_id
            assert source.added_for_sentence == r.sentence_index
    assert "STAGE_RESEARCH" in stages(final)
    check_citations(final)


async def test_ask_and_ask_stream_give_the_same_answer(answer: Any) -> None:
    options = answer_pb2.AskOptions(max_researches=0)
    ask = answer_pb2.AskRequest(question=CHILD_LABOUR, options=options)
    asked = (await answer.Ask(ask, timeout=120)).answer
    stream = answer_pb2.AskStreamRequest(question=CHILD_LABOUR, options=options)
    streamed = [e async for e in answer.AskStream(stream, timeout=120)][-1].final
    assert asked.text == streamed.text
    assert list(asked.sentences) == list(streamed.sentences)
    assert [s.source for s in asked.sources] == [s.source for s in streamed.sources]


async def test_vectors_down_answers_from_bm25(stack: Stack) -> None:
    stub = await stack.answer(semantic_address=stack.dead)
    a = (await stub.Ask(answer_pb2.AskRequest(question=CHILD_LABOUR), timeout=120)).answer
    assert set(degraded(a)) == {"STAGE_RETRIEVE_DENSE", "STAGE_RETRIEVE_KG"}
    assert "semantic service unavailable" in degraded(a)["STAGE_RETRIEVE_DENSE"]
    assert "14" in a.text
    check_citations(a)
    assert not any(s.HasField("dense_score") for s in a.sources)
    assert "STAGE_RETRIEVE_DENSE" not in stages(a)


async def test_reranker_down_keeps_the_fused_order(stack: Stack) -> None:
    stub = await stack.answer(rerank_address=stack.dead)
    a = (await stub.Ask(answer_pb2.AskRequest(question=CHILD_LABOUR), timeout=120)).answer
    assert set(degraded(a)) == {"STAGE_RERANK"}
    assert "fused order" in degraded(a)["STAGE_RERANK"]
    fused = [s.fused_score for s in a.sources]
    assert fused == sorted(fused, reverse=True)
    assert not any(s.HasField("rerank_score") for s in a.sources)
    assert "14" in a.text
    check_citations(a)


async def test_llm_down_answers_extractively(stack: Stack) -> None:
    stub = await stack.answer(generate_address=stack.generate_no_llm)
    a = (await stub.Ask(answer_pb2.AskRequest(question=CHILD_LABOUR), timeout=120)).answer
    assert set(degraded(a)) == {"STAGE_GENERATE"}
    assert "LLM unavailable" in degraded(a)["STAGE_GENERATE"]
    assert "extractive" in degraded(a)["STAGE_GENERATE"]
    assert a.sentences
    assert "14" in a.text
    check_citations(a)


async def test_bm25_and_vectors_down_is_unavailable(stack: Stack) -> None:
    stub = await stack.answer(lexical_address=stack.dead, semantic_address=stack.dead)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Ask(answer_pb2.AskRequest(question=CHILD_LABOUR), timeout=60)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no retriever could run" in (err.value.details() or "")
    assert "STAGE_RETRIEVE_BM25" in (err.value.details() or "")


@pytest.mark.parametrize(
    ("question", "options", "field"),
    [
        ("   ", {}, "question"),
        ("x" * 4097, {}, "question"),
        (CHILD_LABOUR, {"rerank_top_k": 101}, "options.rerank_top_k"),
        (CHILD_LABOUR, {"fused_top_k": 5, "rerank_top_k": 10}, "options.rerank_top_k"),
        (CHILD_LABOUR, {"confidence_threshold": 11}, "options.confidence_threshold"),
        (CHILD_LABOUR, {"rerank_top_k": 50, "passages_per_document": 3}, "passages_per_document"),
        (
            CHILD_LABOUR,
            {"retrieval": common_pb2.RetrievalOptions(top_k_per_retriever=1001)},
            "options.retrieval.top_k_per_retriever",
        ),
        (
            CHILD_LABOUR,
            {
                "retrieval": common_pb2.RetrievalOptions(
                    retrievers=[common_pb2.RETRIEVER_BM25, common_pb2.RETRIEVER_BM25]
                )
            },
            "listed twice",
        ),
        (
            CHILD_LABOUR,
            {"retrieval": common_pb2.RetrievalOptions(filters=[common_pb2.Filter(field="x")])},
            "options.retrieval.filters[0].field",
        ),
        (CHILD_LABOUR, {"time_budget": Duration(nanos=50_000_000)}, "options.time_budget"),
    ],
)
async def test_bad_input_is_invalid_argument(
    answer: Any, question: str, options: dict[str, Any], field: str
) -> None:
    opts = answer_pb2.AskOptions(**options)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await answer.Ask(answer_pb2.AskRequest(question=question, options=opts), timeout=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (err.value.details() or ""), err.value.details()
    stream = answer.AskStream(answer_pb2.AskStreamRequest(question=question, options=opts))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stream.read()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in (err.value.details() or ""), err.value.details()


async def test_a_deadline_too_short_is_deadline_exceeded(stack: Stack) -> None:
    # A generous minimum makes the check independent of the machine's speed.
    slow = AnswerSettings(server=LOCAL, limits=AnswerLimits(min_budget_seconds=5.0))
    server_ctx = running([AnswerServicer(slow)], LOCAL)
    async with server_ctx as server:
        stub: Any = answer_pb2_grpc.AnswerServiceStub(stack.channel(f"127.0.0.1:{server.port}"))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Ask(answer_pb2.AskRequest(question=CHILD_LABOUR), timeout=2)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "too short to answer" in (err.value.details() or "")


async def test_past_its_slots_and_queue_the_service_sheds_load(stack: Stack) -> None:
    limits = AnswerLimits(max_in_flight=1, max_waiting=1, max_queue_seconds=120)
    stub = await stack.answer(limits=limits)
    admission = stack.last_answer.admission
    request = answer_pb2.AskRequest(question=CHILD_LABOUR)
    alone = (await stub.Ask(request, timeout=120)).answer
    # The test holds the one slot, as a running answer would, however fast
    # answers are: the next call waits for it and the one after is shed.
    async with admission.slot(120):
        queued = asyncio.ensure_future(stub.Ask(request, timeout=120))
        for _ in range(600):
            if admission.waiting == 1:
                break
            await asyncio.sleep(0.05)
        assert admission.waiting == 1
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.AskStream(answer_pb2.AskStreamRequest(question=CHILD_LABOUR)).read()
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Shed at the door: nothing of the service's state but the retry hint.
        assert err.value.details() == "the answer service is at capacity; retry later"
        assert float(dict(err.value.trailing_metadata() or ())["retry-after"]) > 0
        await asyncio.sleep(0.5)
        assert not queued.done()
    answer = (await queued).answer
    assert answer.text == alone.text
    assert "14" in answer.text
    # The queued request's time budget paid for its wait: its pipeline ran on what was left.
    assert answer.total.ToNanoseconds() > 0
