"""The answer pipeline embeds the question once and hands stored vectors to the reranker.

Fake backends record every call: the semantic service embeds the question
once (Embed), dense and KG searches and Explain carry that vector, and the
rerank request carries it with the stored vectors of the passages it ranks
(GetVectors). When the semantic service cannot help, each step falls back
to text, as before.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from attest.answer.options import validate
from attest.answer.pipeline import AnswerPipeline, collect
from attest.answer.settings import AnswerSettings
from attest.answer.v1 import answer_pb2
from attest.common.v1 import common_pb2
from attest.core.errors import Unavailable
from attest.generate.v1 import generate_pb2
from attest.lexical.v1 import lexical_pb2
from attest.rerank.v1 import rerank_pb2
from attest.semantic.v1 import semantic_pb2

MODEL = "all-MiniLM-L6-v2"
QUESTION = "How much water did Norvale save?"
Q_VECTOR = [0.6, 0.8, 0.0]


def stored(doc_id: str, index: int) -> list[float]:
    """The fake store's vector of a record."""
    return [float(len(doc_id)), float(index), 1.0]


@pytest.fixture(autouse=True)
def fusion_over_bm25_and_dense(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fusion that weighs BM25 and dense only, whatever the shipped file weighs."""
    path = tmp_path / "fusion.json"
    path.write_text(
        json.dumps(
            {"method": "weighted", "weights": {"bm25": 1.0, "dense": 1.0}, "default_weight": 0}
        )
    )
    monkeypatch.setenv("ATTEST_ANSWER_FUSION_SETTINGS", str(path))


class Backends:
    """BM25 finds d1 (passage 0) and d2 (its body only); dense finds d1 (passage 1)
    and d3 (no passage); KG finds d3 and d4 (the fusion of ``fusion_over_bm25_and_dense``
    keeps only what they found, so d4 drops out and d3 gets its KG score)."""

    def __init__(
        self, *, embed_fails: bool = False, vectors_fail: bool = False, search_fails: bool = False
    ) -> None:
        self.embed_fails = embed_fails
        self.vectors_fail = vectors_fail
        self.search_fails = search_fails
        self.embeds: list[semantic_pb2.EmbedRequest] = []
        self.searches: list[semantic_pb2.SearchRequest] = []
        self.explains: list[semantic_pb2.ExplainRequest] = []
        self.vector_requests: list[semantic_pb2.GetVectorsRequest] = []
        self.reranks: list[rerank_pb2.RerankRequest] = []

    async def lexical_search(
        self, request: lexical_pb2.SearchRequest, seconds: float
    ) -> lexical_pb2.SearchResponse:
        if request.level == lexical_pb2.SEARCH_LEVEL_PASSAGE:
            hits = [lexical_pb2.Hit(doc_id="d1", passage_index=0, score=3.0, text="Saved water.")]
        else:
            hits = [
                lexical_pb2.Hit(doc_id="d1", passage_index=-1, score=3.0, title="T1", text="B1"),
                lexical_pb2.Hit(doc_id="d2", passage_index=-1, score=2.0, title="T2", text="B2"),
            ]
        return lexical_pb2.SearchResponse(hits=hits)

    async def semantic_search(
        self, request: semantic_pb2.SearchRequest, seconds: float
    ) -> semantic_pb2.SearchResponse:
        self.searches.append(request)
        if self.search_fails:
            raise Unavailable("semantic: down")
        if request.level == semantic_pb2.SEARCH_LEVEL_PASSAGE:
            hits = [semantic_pb2.Hit(doc_id="d1", passage_index=1, score=0.9, text="Cut use.")]
        elif request.mode == semantic_pb2.SEARCH_MODE_KG:
            hits = [
                semantic_pb2.Hit(
                    doc_id=d, passage_index=-1, score=1.2, kg_score=1.2, title=f"T{d}", text=t
                )
                for d, t in (("d3", "S3"), ("d4", "S4"))
            ]
        else:
            hits = [
                semantic_pb2.Hit(
                    doc_id=d, passage_index=-1, score=0.8, dense_score=0.8, title=f"T{d}", text=t
                )
                for d, t in (("d1", "S1"), ("d3", "S3"))
            ]
        return semantic_pb2.SearchResponse(hits=hits, embedding_model=MODEL)

    async def explain(
        self, request: semantic_pb2.ExplainRequest, seconds: float
    ) -> semantic_pb2.ExplainResponse:
        self.explains.append(request)
        return semantic_pb2.ExplainResponse(doc_id=request.doc_id)

    async def embed(
        self, request: semantic_pb2.EmbedRequest, seconds: float
    ) -> semantic_pb2.EmbedResponse:
        self.embeds.append(request)
        if self.embed_fails:
            raise Unavailable("semantic: down")
        return semantic_pb2.EmbedResponse(
            vectors=[semantic_pb2.Vector(values=Q_VECTOR)], embedding_model=MODEL
        )

    async def get_vectors(
        self, request: semantic_pb2.GetVectorsRequest, seconds: float
    ) -> semantic_pb2.GetVectorsResponse:
        self.vector_requests.append(request)
        if self.vectors_fail:
            raise Unavailable("semantic: down")
        # d1's passage 1 is not stored (as if indexed since without it).
        return semantic_pb2.GetVectorsResponse(
            vectors=[
                semantic_pb2.Vector()
                if (r.doc_id, r.passage_index) == ("d1", 1)
                else semantic_pb2.Vector(values=stored(r.doc_id, r.passage_index))
                for r in request.records
            ],
            embedding_model=MODEL,
        )

    async def rerank(
        self, request: rerank_pb2.RerankRequest, seconds: float
    ) -> rerank_pb2.RerankResponse:
        self.reranks.append(request)
        return rerank_pb2.RerankResponse(
            documents=[
                rerank_pb2.RankedDocument(
                    doc_id=d.id,
                    input_index=i,
                    score=1.0 - i / 10,
                    passages=[rerank_pb2.RankedPassage(passage_index=d.passages[0].index)],
                )
                for i, d in enumerate(request.documents)
            ]
        )

    async def generate(
        self, request: generate_pb2.AnswerRequest, seconds: float
    ) -> AsyncIterator[generate_pb2.AnswerResponse]:
        yield generate_pb2.AnswerResponse(final=generate_pb2.AnswerFinal(answer="Saved water."))


def ask(backends: Backends, **options: Any) -> answer_pb2.Answer:
    settings = AnswerSettings()
    plan = validate(QUESTION, answer_pb2.AskOptions(**options), settings, deadline_seconds=None)
    return asyncio.run(collect(AnswerPipeline(backends, settings).run(plan)))


def vectors_by_passage(request: rerank_pb2.RerankRequest) -> dict[tuple[str, int], list[float]]:
    assert len(request.document_vectors) == len(request.documents)
    out = {}
    for doc, given in zip(request.documents, request.document_vectors, strict=True):
        assert len(given.passages) == len(doc.passages)
        for p, v in zip(doc.passages, given.passages, strict=True):
            out[(doc.id, p.index)] = list(v.values)
    return out


def test_the_question_is_embedded_once_and_reused_everywhere() -> None:
    backends = Backends()
    answer = ask(backends, explain=True)
    assert answer.text == "Saved water."
    assert [list(e.texts) for e in backends.embeds] == [[QUESTION]]
    # Dense (articles and passages) and KG search with the vector, not the text alone.
    assert len(backends.searches) == 3
    for search in backends.searches:
        assert list(search.query_vector.values) == pytest.approx(Q_VECTOR)
    assert [e.doc_id for e in backends.explains] == ["d3"]
    for explain in backends.explains:
        assert list(explain.query_vector.values) == pytest.approx(Q_VECTOR)
    [rerank] = backends.reranks
    assert rerank.embedding_model == MODEL
    assert list(rerank.query_vector.values) == pytest.approx(Q_VECTOR)


def test_the_reranker_gets_stored_vectors_of_the_texts_it_ranks() -> None:
    backends = Backends()
    ask(backends)
    [fetched] = backends.vector_requests
    [rerank] = backends.reranks
    texts = {(d.id, p.index): p.text for d in rerank.documents for p in d.passages}
    assert texts == {
        ("d1", 0): "Saved water.",
        ("d1", 1): "Cut use.",
        ("d2", -1): "B2",  # a BM25 body: no stored record embeds it
        ("d3", -1): "S3",  # the summary the semantic service returned
    }
    # Passages by their index; the summaries by their article record (-1); no body.
    asked = {(r.doc_id, r.passage_index) for r in fetched.records}
    assert asked == {("d1", 0), ("d1", 1), ("d3", -1)}
    given = vectors_by_passage(rerank)
    assert given == {
        ("d1", 0): pytest.approx(stored("d1", 0)),
        ("d1", 1): [],  # not stored: the reranker embeds it
        ("d2", -1): [],  # the body: the reranker embeds it
        ("d3", -1): pytest.approx(stored("d3", -1)),
    }
    stages = [answer_pb2.Stage.Name(t.stage) for t in ask(Backends()).timings]
    assert "STAGE_RERANK" in stages


def test_without_the_semantic_service_every_step_falls_back_to_text() -> None:
    backends = Backends(embed_fails=True, vectors_fail=True)
    answer = ask(backends)
    assert answer.text == "Saved water."
    assert not answer.degradations  # the searches themselves answered
    assert all(not s.HasField("query_vector") for s in backends.searches)
    [rerank] = backends.reranks
    assert not rerank.HasField("query_vector")
    assert not rerank.document_vectors
    assert rerank.embedding_model == ""


def test_a_query_vector_without_stored_vectors_still_reaches_the_reranker() -> None:
    backends = Backends(vectors_fail=True)
    ask(backends)
    [rerank] = backends.reranks
    assert not rerank.document_vectors
    assert rerank.embedding_model == MODEL
    assert list(rerank.query_vector.values) == pytest.approx(Q_VECTOR)


def test_a_bm25_only_answer_does_not_call_the_semantic_service() -> None:
    backends = Backends()
    retrieval = common_pb2.RetrievalOptions(retrievers=[common_pb2.RETRIEVER_BM25])
    ask(backends, retrieval=retrieval)
    assert backends.embeds == []
    assert backends.vector_requests == []
    assert backends.searches == []
    [rerank] = backends.reranks
    assert not rerank.document_vectors
    assert not rerank.HasField("query_vector")


def test_with_the_semantic_service_down_no_vectors_are_asked_for() -> None:
    backends = Backends(embed_fails=True, search_fails=True)
    answer = ask(backends)
    assert answer.text == "Saved water."
    assert {answer_pb2.Stage.Name(d.stage) for d in answer.degradations} == {
        "STAGE_RETRIEVE_DENSE",
        "STAGE_RETRIEVE_KG",
    }
    assert backends.vector_requests == []
    [rerank] = backends.reranks
    assert not rerank.document_vectors
    assert not rerank.HasField("query_vector")
