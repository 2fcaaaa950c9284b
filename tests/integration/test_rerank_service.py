"""RerankService through gRPC: PFiD checkpoint and embedding fallback, batching
under concurrent load, bad input, and start-up errors."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
import torch
from prometheus_client import REGISTRY
from pydantic import ValidationError
from transformers import ByT5Tokenizer

from attest.common.v1 import common_pb2
from attest.core.channels import create_channel
from attest.core.server import running
from attest.core.settings import ServerSettings
from attest.rerank.model import PFiD, tiny_config
from attest.rerank.servicer import RerankServicer
from attest.rerank.settings import BatchingSettings, RerankLimits, RerankSettings
from attest.rerank.v1 import rerank_pb2, rerank_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


def doc(doc_id: str, *texts: str, title: str = "") -> common_pb2.Document:
    return common_pb2.Document(
        id=doc_id,
        title=title,
        passages=[common_pb2.Passage(index=i, text=t) for i, t in enumerate(texts)],
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = ByT5Tokenizer()
    torch.manual_seed(5)
    path = tmp_path_factory.mktemp("pfid") / "tiny"
    PFiD.from_config(tiny_config(len(tokenizer)), tokenizer, max_length=64).save(path, tokenizer)
    return path


async def _start(settings: RerankSettings):  # type: ignore[no-untyped-def]
    servicer = RerankServicer(settings)
    ctx = running([servicer], settings.server, ready_timeout=300)
    server = await ctx.__aenter__()
    channel = create_channel(f"127.0.0.1:{server.port}")
    return ctx, servicer, channel, rerank_pb2_grpc.RerankServiceStub(channel)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pfid(checkpoint: Path):
    settings = RerankSettings(
        checkpoint=checkpoint,
        device="cpu",
        max_length=64,
        server=ServerSettings(host="127.0.0.1", port=0),
        limits=RerankLimits(max_documents=20, max_passages=4, max_passage_chars=5000),
        batching=BatchingSettings(max_documents=256, max_wait_ms=30),
    )
    ctx, servicer, channel, stub = await _start(settings)
    yield stub, servicer
    await channel.close()
    await ctx.__aexit__(None, None, None)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fallback():
    settings = RerankSettings(server=ServerSettings(host="127.0.0.1", port=0))
    ctx, servicer, channel, stub = await _start(settings)
    yield stub, servicer
    await channel.close()
    await ctx.__aexit__(None, None, None)


async def test_pfid_ranks_documents_and_passages(pfid) -> None:
    stub, _ = pfid
    request = rerank_pb2.RerankRequest(
        query="water withdrawal",
        documents=[
            doc("a", "river water use rose", "board pay", title="Mill"),
            doc("b", "scope 1 emissions"),
            doc("c", "water", "waste", "wages"),
        ],
        passages_top_k=2,
    )
    response = await stub.Rerank(request, timeout=60)
    assert response.reranker == rerank_pb2.RERANKER_PFID
    assert response.device == "cpu"
    assert response.model.endswith("tiny")
    assert sorted(d.doc_id for d in response.documents) == ["a", "b", "c"]
    scores = [d.score for d in response.documents]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 <= s <= 1.0 for s in scores)
    by_id = {d.doc_id: d for d in response.documents}
    assert by_id["c"].input_index == 2
    assert len(by_id["c"].passages) == 2  # passages_top_k
    assert len(by_id["b"].passages) == 1
    pscores = [p.score for p in by_id["c"].passages]
    assert pscores == sorted(pscores, reverse=True)
    assert {p.passage_index for p in by_id["a"].passages} == {0, 1}

    top = await stub.Rerank(
        rerank_pb2.RerankRequest(query=request.query, documents=request.documents, top_k=1),
        timeout=60,
    )
    assert [d.doc_id for d in top.documents] == [response.documents[0].doc_id]
    assert top.documents[0].score == pytest.approx(response.documents[0].score, abs=1e-5)


async def test_concurrent_requests_share_model_calls(pfid) -> None:
    stub, servicer = pfid
    batcher = servicer.reranker.batcher
    before_batches = batcher.stats.batches
    before_requests = batcher.stats.requests
    before_metric = REGISTRY.get_sample_value("attest_rerank_batch_requests_count") or 0.0

    async def one(i: int) -> rerank_pb2.RerankResponse:
        return await stub.Rerank(
            rerank_pb2.RerankRequest(
                query=f"query {i}",
                documents=[doc(f"d{j}", f"text {i} {j}", "more text") for j in range(5)],
            ),
            timeout=60,
        )

    responses = await asyncio.gather(*(one(i) for i in range(24)))
    assert all(len(r.documents) == 5 for r in responses)
    batches = batcher.stats.batches - before_batches
    requests = batcher.stats.requests - before_requests
    assert requests == 24
    assert batches < 24  # requests shared model calls
    assert batcher.stats.largest_batch > 5  # more than one request's documents in a call
    metric = REGISTRY.get_sample_value("attest_rerank_batch_requests_count") or 0.0
    assert metric - before_metric == batches


async def test_same_request_alone_or_batched_scores_the_same(pfid) -> None:
    stub, _ = pfid
    request = rerank_pb2.RerankRequest(
        query="labour rights", documents=[doc("x", "union talks", "strike"), doc("y", "audit")]
    )
    alone = await stub.Rerank(request, timeout=60)
    other = rerank_pb2.RerankRequest(
        query="other", documents=[doc(f"o{j}", "a b c d e f g h", "i") for j in range(6)]
    )
    batched, _ = await asyncio.gather(
        stub.Rerank(request, timeout=60), stub.Rerank(other, timeout=60)
    )
    assert [d.doc_id for d in batched.documents] == [d.doc_id for d in alone.documents]
    for a, b in zip(alone.documents, batched.documents, strict=True):
        assert a.score == pytest.approx(b.score, abs=1e-5)


async def test_long_passages_are_truncated_and_flagged(pfid) -> None:
    stub, _ = pfid
    response = await stub.Rerank(
        rerank_pb2.RerankRequest(query="q", documents=[doc("long", "word " * 400, "short")]),
        timeout=60,
    )
    flags = {p.passage_index: p.truncated for p in response.documents[0].passages}
    assert flags == {0: True, 1: False}
    assert response.truncated_passages == 1


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (rerank_pb2.RerankRequest(query="  ", documents=[doc("a", "x")]), "query"),
        (rerank_pb2.RerankRequest(query="x" * 5000, documents=[doc("a", "x")]), "query"),
        (rerank_pb2.RerankRequest(query="q"), "documents"),
        (
            rerank_pb2.RerankRequest(query="q", documents=[doc(f"d{i}", "x") for i in range(21)]),
            "documents",
        ),
        (rerank_pb2.RerankRequest(query="q", documents=[doc("a")]), "documents[0].passages"),
        (
            rerank_pb2.RerankRequest(query="q", documents=[doc("a", *["p"] * 5)]),
            "documents[0].passages",
        ),
        (
            rerank_pb2.RerankRequest(query="q", documents=[doc("a", "x"), doc("a", "y")]),
            "documents[1].id",
        ),
        (
            rerank_pb2.RerankRequest(query="q", documents=[doc("a", "ok", "  ")]),
            "documents[0].passages[1].text",
        ),
        (
            rerank_pb2.RerankRequest(query="q", documents=[doc("a", "x" * 5001)]),
            "documents[0].passages[0].text",
        ),
        (rerank_pb2.RerankRequest(query="q", documents=[doc("a", "x")], top_k=-1), "top_k"),
    ],
)
async def test_bad_input_is_invalid_argument_naming_the_field(pfid, request_, field) -> None:
    stub, _ = pfid
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Rerank(request_, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in info.value.details()


async def test_fallback_reranker_is_reported_and_ranks_by_meaning(fallback) -> None:
    stub, _ = fallback
    response = await stub.Rerank(
        rerank_pb2.RerankRequest(
            query="How much water did the mill withdraw from the river?",
            documents=[
                doc("board", "The board appointed two independent directors."),
                doc(
                    "water",
                    "Quarterly revenue grew four percent.",
                    "The mill withdrew 3.2 million cubic metres of river water last year.",
                ),
            ],
        ),
        timeout=120,
    )
    assert response.reranker == rerank_pb2.RERANKER_EMBEDDING_FALLBACK
    assert response.model == "all-MiniLM-L6-v2"
    assert [d.doc_id for d in response.documents] == ["water", "board"]
    assert response.documents[0].passages[0].passage_index == 1
    assert response.documents[0].score == pytest.approx(response.documents[0].passages[0].score)


async def test_missing_checkpoint_is_a_start_up_error_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-checkpoint"
    with pytest.raises(ValidationError, match=re.escape(str(missing))):
        RerankSettings(checkpoint=missing)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValidationError, match=r"has no pfid\.json"):
        RerankSettings(checkpoint=tmp_path / "empty")
