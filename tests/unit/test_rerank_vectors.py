"""The embedding fallback scores given vectors instead of embedding the texts again.

The packaged MiniLM, no sockets: the reranker is called directly, and the
request side (``read_vectors``) with messages built here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import pytest

from attest.core.errors import InvalidArgument
from attest.rerank.rerankers import EmbeddingReranker
from attest.rerank.scoring import DocInput, DocScores
from attest.rerank.servicer import read_vectors
from attest.rerank.settings import RerankSettings
from attest.rerank.v1 import rerank_pb2
from attest.semantic.embedding import Embedder
from attest.semantic.models import passage_text

QUERY = "How much did the copper miner cut its water use?"
DOCS = (
    DocInput(
        "Norvale Copper cuts water use",
        (
            "Norvale Copper said on Tuesday it cut fresh water withdrawals by 18 percent.",
            "The company also named a new chief financial officer.",
        ),
    ),
    DocInput("", ("Shares of the bank rose 2 percent in early trading.",)),
    DocInput(
        "  Drought hits farms  ",
        (
            "  Farmers in the valley drew 40 percent less water from the river this summer.  ",
            "Rainfall was the lowest in thirty years.",
            "The regional government promised support payments.",
        ),
    ),
)


class CountingEmbedder(Embedder):
    """The packaged model, recording every text it is asked to embed."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[str]] = []

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        return super().encode(texts)


@pytest.fixture(scope="module")
def reranker() -> EmbeddingReranker:
    r = EmbeddingReranker(RerankSettings(device="cpu"))
    r.embedder = CountingEmbedder()
    asyncio.run(r.warm_up())
    return r


def embedder(r: EmbeddingReranker) -> CountingEmbedder:
    assert isinstance(r.embedder, CountingEmbedder)
    return r.embedder


def stored(r: EmbeddingReranker, doc: DocInput) -> list[np.ndarray]:
    """Vectors as the semantic index stores them: title, newline, passage."""
    return list(r.embedder.encode([passage_text(doc.title, p) for p in doc.passages]))


def rerank(r: EmbeddingReranker, docs: Sequence[DocInput], query_vector=None) -> list[DocScores]:
    return asyncio.run(r.rerank(QUERY, docs, query_vector))


def assert_same(a: list[DocScores], b: list[DocScores]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.score == pytest.approx(y.score, abs=1e-5)
        assert x.passage_scores == pytest.approx(y.passage_scores, abs=1e-5)
        assert x.truncated == y.truncated


def test_given_vectors_score_as_the_embedding_path_without_embedding(reranker) -> None:
    embedded = rerank(reranker, DOCS)
    query = reranker.embedder.encode([QUERY])[0]
    with_vectors = [DocInput(d.title, d.passages, tuple(stored(reranker, d))) for d in DOCS]
    calls = len(embedder(reranker).calls)
    given = rerank(reranker, with_vectors, query)
    assert embedder(reranker).calls[calls:] == []  # nothing embedded at query time
    assert_same(given, embedded)
    # The scores mean what they did: the water passage of the copper miner first.
    best = max(range(len(DOCS)), key=lambda i: given[i].score)
    assert best == 0
    assert given[0].passage_scores[0] > given[0].passage_scores[1]
    assert all(0.0 <= s <= 1.0 for d in given for s in d.passage_scores)


def test_missing_vectors_are_embedded_and_only_they(reranker) -> None:
    embedded = rerank(reranker, DOCS)
    first = stored(reranker, DOCS[0])
    third = stored(reranker, DOCS[2])
    mixed = [
        DocInput(DOCS[0].title, DOCS[0].passages, (first[0], None)),
        DOCS[1],  # no vectors at all
        DocInput(DOCS[2].title, DOCS[2].passages, (None, third[1], third[2])),
    ]
    calls = len(embedder(reranker).calls)
    got = rerank(reranker, mixed)  # and no query vector
    [texts] = embedder(reranker).calls[calls:]  # one model call for what is missing
    assert texts == [
        QUERY,
        passage_text(DOCS[0].title, DOCS[0].passages[1]),
        DOCS[1].passages[0],
        passage_text(DOCS[2].title.strip(), DOCS[2].passages[0].strip()),
    ]
    assert_same(got, embedded)


def test_vectors_need_not_be_unit_length(reranker) -> None:
    embedded = rerank(reranker, DOCS[:1])
    scaled = DocInput(
        DOCS[0].title, DOCS[0].passages, tuple(3.5 * v for v in stored(reranker, DOCS[0]))
    )
    query = 0.25 * reranker.embedder.encode([QUERY])[0]
    assert_same(rerank(reranker, [scaled], query), embedded)


# -- the request side --------------------------------------------------------------------


def request(*docs: int, **fields) -> rerank_pb2.RerankRequest:
    from attest.common.v1 import common_pb2

    return rerank_pb2.RerankRequest(
        query=QUERY,
        documents=[
            common_pb2.Document(
                id=f"d{i}", passages=[common_pb2.Passage(index=j, text="x") for j in range(n)]
            )
            for i, n in enumerate(docs)
        ],
        **fields,
    )


def vec(n: int = 4, value: float = 0.5) -> rerank_pb2.Vector:
    return rerank_pb2.Vector(values=[value] * n)


SPACE = ("all-MiniLM-L6-v2", 4)


def test_read_vectors_takes_vectors_of_its_own_model() -> None:
    r = request(
        2,
        1,
        embedding_model="all-MiniLM-L6-v2",
        query_vector=vec(),
        document_vectors=[
            rerank_pb2.DocumentVectors(passages=[vec(), rerank_pb2.Vector()]),
            rerank_pb2.DocumentVectors(),
        ],
    )
    query, passages = read_vectors(r, SPACE)
    assert query is not None
    assert query.tolist() == [0.5] * 4
    assert [len(p) for p in passages] == [2, 0]
    assert passages[0][0] is not None
    assert passages[0][1] is None


def test_read_vectors_ignores_another_model_and_pfid() -> None:
    r = request(1, embedding_model="other-model", query_vector=vec(7))
    assert read_vectors(r, SPACE) == (None, [])
    # PFiD reads text only: its vector space is None, whatever the vectors are.
    r = request(1, embedding_model="all-MiniLM-L6-v2", query_vector=vec(7))
    assert read_vectors(r, None) == (None, [])
    assert read_vectors(request(1), SPACE) == (None, [])


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"query_vector": vec(3)}, "query_vector"),
        ({"query_vector": vec(value=float("nan"))}, "query_vector"),
        ({"query_vector": vec(value=0.0)}, "query_vector"),
        (
            {"document_vectors": [rerank_pb2.DocumentVectors(passages=[vec(), vec(5)])]},
            "document_vectors[0].passages[1]",
        ),
    ],
)
def test_read_vectors_refuses_wrong_vectors_of_its_model(fields, field) -> None:
    r = request(2, embedding_model="all-MiniLM-L6-v2", **fields)
    with pytest.raises(InvalidArgument) as info:
        read_vectors(r, SPACE)
    assert info.value.field == field


@pytest.mark.parametrize("space", [SPACE, None])
def test_read_vectors_refuses_miscounted_vectors_for_any_reranker(space) -> None:
    too_few_docs = request(1, 1, document_vectors=[rerank_pb2.DocumentVectors()])
    with pytest.raises(InvalidArgument) as info:
        read_vectors(too_few_docs, space)
    assert info.value.field == "document_vectors"
    too_few_passages = request(2, document_vectors=[rerank_pb2.DocumentVectors(passages=[vec()])])
    with pytest.raises(InvalidArgument) as info:
        read_vectors(too_few_passages, space)
    assert info.value.field == "document_vectors[0].passages"
