"""Stored vectors through gRPC: the semantic service embeds a question once and
returns the vectors it stored, and the reranker's fallback scores them.

One server on a free port with the semantic service (embedded vector engine)
and the rerank service (the embedding fallback), the packaged MiniLM, the
bundled sample news split into passages as ingestion splits them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import pytest
import pytest_asyncio

from attest.common.v1 import common_pb2
from attest.core.channels import create_channel
from attest.core.server import running
from attest.core.settings import ServerSettings
from attest.demo.run import sample_documents
from attest.ingest.passages import split_passages
from attest.rerank.servicer import RerankServicer
from attest.rerank.settings import RerankSettings
from attest.rerank.v1 import rerank_pb2, rerank_pb2_grpc
from attest.semantic.embedding import Embedder
from attest.semantic.index import SemanticIndex, article_text
from attest.semantic.models import SemanticDoc, passage_text
from attest.semantic.servicer import SemanticServicer
from attest.semantic.settings import SemanticSettings
from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

EMBEDDER = Embedder()
LOCAL = ServerSettings(host="127.0.0.1", port=0)
QUESTION = "How many workers under the age of 16 were found at the garment factory?"


def corpus() -> list[common_pb2.Document]:
    docs = sample_documents()
    for doc in docs:
        for span in split_passages(doc.body, 60):
            doc.passages.append(common_pb2.Passage(doc_id=doc.id, index=span.index, text=span.text))
    return docs


class Stack:
    semantic: Any
    rerank: Any
    index: SemanticIndex
    docs: list[common_pb2.Document]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    settings = SemanticSettings(data_dir=tmp_path_factory.mktemp("vectors"), server=LOCAL)
    index = SemanticIndex(settings, embedder=EMBEDDER)
    servicers = [SemanticServicer(settings, index), RerankServicer(RerankSettings(device="cpu"))]
    async with running(servicers, LOCAL, ready_timeout=300) as server:
        channel = create_channel(f"127.0.0.1:{server.port}")
        s = Stack()
        s.semantic = semantic_pb2_grpc.SemanticServiceStub(channel)
        s.rerank = rerank_pb2_grpc.RerankServiceStub(channel)
        s.index = index
        s.docs = corpus()
        # One article with a summary, so its record embeds "title, newline, summary".
        items = [semantic_pb2.IndexDocument(document=d) for d in s.docs]
        items[0].summary = "A short summary of the first article."
        await s.semantic.Index(semantic_pb2.IndexRequest(documents=items), timeout=300)
        yield s
        await channel.close()


async def test_embed_gives_the_vector_a_search_would_compute(stack: Stack) -> None:
    embedded = await stack.semantic.Embed(semantic_pb2.EmbedRequest(texts=[QUESTION, "water"]))
    assert embedded.embedding_model == "all-MiniLM-L6-v2"
    assert len(embedded.vectors) == 2
    vector = np.array(embedded.vectors[0].values, dtype=np.float32)
    assert vector.shape == (384,)
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)
    assert vector == pytest.approx(EMBEDDER.encode([QUESTION])[0], abs=1e-5)
    for level in (semantic_pb2.SEARCH_LEVEL_DOCUMENT, semantic_pb2.SEARCH_LEVEL_PASSAGE):
        by_text = await stack.semantic.Search(
            semantic_pb2.SearchRequest(query=QUESTION, top_k=10, level=level)
        )
        by_vector = await stack.semantic.Search(
            semantic_pb2.SearchRequest(
                query=QUESTION, query_vector=embedded.vectors[0], top_k=10, level=level
            )
        )
        assert [(h.doc_id, h.passage_index) for h in by_vector.hits] == [
            (h.doc_id, h.passage_index) for h in by_text.hits
        ]
        assert [h.score for h in by_vector.hits] == pytest.approx(
            [h.score for h in by_text.hits], abs=1e-5
        )
    explained = [
        await stack.semantic.Explain(
            semantic_pb2.ExplainRequest(query=QUESTION, doc_id="esg-005", **extra)
        )
        for extra in ({}, {"query_vector": embedded.vectors[0]})
    ]
    assert explained[1].kg_score == pytest.approx(explained[0].kg_score, abs=1e-5)


async def test_get_vectors_returns_what_was_stored_in_order(stack: Stack) -> None:
    first, second = stack.docs[0], stack.docs[1]
    records = [
        semantic_pb2.RecordRef(doc_id=second.id, passage_index=1),
        semantic_pb2.RecordRef(doc_id=first.id, passage_index=-1),
        semantic_pb2.RecordRef(doc_id=first.id, passage_index=0),
        semantic_pb2.RecordRef(doc_id="no-such-article", passage_index=0),
        semantic_pb2.RecordRef(doc_id=first.id, passage_index=len(first.passages)),
    ]
    got = await stack.semantic.GetVectors(semantic_pb2.GetVectorsRequest(records=records))
    assert got.embedding_model == "all-MiniLM-L6-v2"
    assert [len(v.values) for v in got.vectors] == [384, 384, 384, 0, 0]
    expected = EMBEDDER.encode(
        [
            passage_text(second.title, second.passages[1].text),
            article_text(
                SemanticDoc(
                    first.id,
                    first.title,
                    first.body,
                    summary="A short summary of the first article.",
                )
            ),
            passage_text(first.title, first.passages[0].text),
        ]
    )
    for vector, want in zip(got.vectors[:3], expected, strict=True):
        assert np.array(vector.values, dtype=np.float32) == pytest.approx(want, abs=1e-5)
    # Point ids carry the tenant: another tenant's lookup finds nothing.
    keys = [(first.id, 0), (first.id, -1)]
    assert all(v is not None for v in await stack.index.vectors("default", keys))
    assert await stack.index.vectors("another-tenant", keys) == [None, None]


@pytest.mark.parametrize(
    ("records", "field"),
    [
        ([], "records"),
        ([semantic_pb2.RecordRef(doc_id="", passage_index=0)], "records[0].doc_id"),
        ([semantic_pb2.RecordRef(doc_id="a", passage_index=-2)], "records[0].passage_index"),
        ([semantic_pb2.RecordRef(doc_id="a")] * 1001, "records"),
    ],
)
async def test_get_vectors_refuses_bad_records(stack: Stack, records, field) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stack.semantic.GetVectors(semantic_pb2.GetVectorsRequest(records=records))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(f"{field}: ")


@pytest.mark.parametrize(
    ("texts", "field"),
    [([], "texts"), (["  "], "texts[0]"), (["ok", "x" * 4097], "texts[1]"), (["q"] * 65, "texts")],
)
async def test_embed_refuses_bad_texts(stack: Stack, texts, field) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stack.semantic.Embed(semantic_pb2.EmbedRequest(texts=texts))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(f"{field}: ")


def rerank_request(docs: list[common_pb2.Document], **fields: Any) -> rerank_pb2.RerankRequest:
    return rerank_pb2.RerankRequest(
        query=QUESTION,
        documents=[
            common_pb2.Document(id=d.id, title=d.title, passages=list(d.passages)[:8]) for d in docs
        ],
        **fields,
    )


def scores(response: rerank_pb2.RerankResponse) -> dict[tuple[str, int], float]:
    out = {}
    for d in response.documents:
        out[(d.doc_id, -1)] = d.score
        for p in d.passages:
            out[(d.doc_id, p.passage_index)] = p.score
    return out


async def test_the_fallback_scores_stored_vectors_as_it_would_embed_them(stack: Stack) -> None:
    docs = [d for d in stack.docs if d.passages][:12]
    plain = await stack.rerank.Rerank(rerank_request(docs))
    question = (await stack.semantic.Embed(semantic_pb2.EmbedRequest(texts=[QUESTION]))).vectors
    request = rerank_request(docs, embedding_model="all-MiniLM-L6-v2")
    request.query_vector.values.extend(question[0].values)
    for doc in request.documents:
        got = await stack.semantic.GetVectors(
            semantic_pb2.GetVectorsRequest(
                records=[
                    semantic_pb2.RecordRef(doc_id=doc.id, passage_index=p.index)
                    for p in doc.passages
                ]
            )
        )
        request.document_vectors.append(
            rerank_pb2.DocumentVectors(
                passages=[rerank_pb2.Vector(values=v.values) for v in got.vectors]
            )
        )
    given = await stack.rerank.Rerank(request)
    assert given.reranker == rerank_pb2.RERANKER_EMBEDDING_FALLBACK
    assert [d.doc_id for d in given.documents] == [d.doc_id for d in plain.documents]
    expected = scores(plain)
    assert scores(given) == pytest.approx(expected, abs=1e-5)
    assert given.documents[0].doc_id == "esg-005"  # the child-labour article
    # Vectors of another model are ignored (everything is embedded again): same scores.
    request.embedding_model = "some-other-model"
    assert scores(await stack.rerank.Rerank(request)) == pytest.approx(expected, abs=1e-5)
    # Of its own model but the wrong size: the field is named.
    request.embedding_model = "all-MiniLM-L6-v2"
    del request.document_vectors[0].passages[0].values[10:]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stack.rerank.Rerank(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith("document_vectors[0].passages[0]: ")


async def test_explain_takes_a_vector_alone_and_checks_its_path_count(stack: Stack) -> None:
    embedded = await stack.semantic.Embed(semantic_pb2.EmbedRequest(texts=[QUESTION]))
    by_text = await stack.semantic.Explain(
        semantic_pb2.ExplainRequest(query=QUESTION, doc_id="esg-005")
    )
    # The proto's "used instead of embedding `query`": no query text needed.
    by_vector = await stack.semantic.Explain(
        semantic_pb2.ExplainRequest(doc_id="esg-005", query_vector=embedded.vectors[0])
    )
    assert by_vector.kg_score == pytest.approx(by_text.kg_score, abs=1e-5)
    for bad, field in (
        (semantic_pb2.ExplainRequest(doc_id="esg-005"), "query"),
        (semantic_pb2.ExplainRequest(query=QUESTION, doc_id="esg-005", max_paths=101), "max_paths"),
        (semantic_pb2.ExplainRequest(query=QUESTION, doc_id="esg-005", max_paths=-1), "max_paths"),
        (
            semantic_pb2.ExplainRequest(
                doc_id="esg-005", query_vector=semantic_pb2.Vector(values=[float("nan")] * 384)
            ),
            "query_vector",
        ),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stack.semantic.Explain(bad)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
        assert field in (err.value.details() or ""), err.value.details()
