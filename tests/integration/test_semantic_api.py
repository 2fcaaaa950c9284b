"""The semantic service through gRPC: dense search, KG scoring, Explain, bad input.

Real model (the packaged MiniLM), real embedded vector engine, the shipped ESG
graph and the bundled sample news, linked to the graph as ingestion does.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
import pytest_asyncio
from click.testing import CliRunner

from attest.cli import main
from attest.common.v1 import common_pb2
from attest.core.channels import create_channel
from attest.core.errors import Unavailable
from attest.core.server import running
from attest.core.settings import ServerSettings
from attest.demo.run import sample_documents
from attest.knowledge.graph import load_graph
from attest.knowledge.linking import EntityLinker
from attest.semantic.embedding import Embedder
from attest.semantic.index import SemanticIndex
from attest.semantic.servicer import SemanticServicer
from attest.semantic.settings import QdrantSettings, SemanticSettings
from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

EMBEDDER = Embedder()


@pytest.fixture(scope="module")
def linked_docs():
    linker = EntityLinker(load_graph(), EMBEDDER.encode)
    docs = sample_documents()
    links = linker.link_many([(d.title, d.body) for d in docs])
    for doc, found in zip(docs, links, strict=True):
        doc.entity_ids.extend(link.entity_id for link in found)
    return docs


# Where the module's semantic server listens, for tests that go through the CLI.
SERVED: dict[str, str] = {}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def semantic(tmp_path_factory, linked_docs):
    settings = SemanticSettings(
        data_dir=tmp_path_factory.mktemp("semantic"),
        server=ServerSettings(host="127.0.0.1", port=0),
    )
    servicer = SemanticServicer(settings, SemanticIndex(settings, embedder=EMBEDDER))
    async with running([servicer], settings.server, ready_timeout=300) as server:
        SERVED["address"] = f"127.0.0.1:{server.port}"
        channel = create_channel(SERVED["address"])
        stub = semantic_pb2_grpc.SemanticServiceStub(channel)
        response = await stub.Index(
            semantic_pb2.IndexRequest(
                documents=[semantic_pb2.IndexDocument(document=d) for d in linked_docs]
            ),
            timeout=300,
        )
        assert response.documents == len(linked_docs)
        yield stub, servicer, linked_docs
        await channel.close()


async def search(stub, query, **kw):
    return await stub.Search(
        semantic_pb2.SearchRequest(query=query, top_k=kw.pop("top_k", 5), **kw)
    )


async def test_dense_search_finds_the_article(semantic):
    stub, _, docs = semantic
    r = await search(stub, "How many child workers under 16 were found at the garment factory?")
    assert r.embedding_model == "all-MiniLM-L6-v2"
    assert r.hits[0].doc_id == "esg-005"
    assert r.hits[0].dense_score == pytest.approx(r.hits[0].score)
    assert r.hits[0].published_at.ToJsonString().startswith("2025-04-08")
    stats = await stub.Stats(semantic_pb2.StatsRequest())
    assert stats.documents == len(docs)
    assert stats.dimension == 384
    assert stats.linked_documents >= len(docs) // 2
    assert stats.kg_links == sum(len(d.entity_ids) for d in docs)


@pytest.mark.parametrize(
    ("mode", "level"),
    [
        (semantic_pb2.SEARCH_MODE_DENSE, semantic_pb2.SEARCH_LEVEL_DOCUMENT),
        (semantic_pb2.SEARCH_MODE_KG, semantic_pb2.SEARCH_LEVEL_DOCUMENT),
        (semantic_pb2.SEARCH_MODE_FUSED, semantic_pb2.SEARCH_LEVEL_DOCUMENT),
    ],
)
async def test_the_ids_view_ranks_the_same_and_carries_no_record(semantic, mode, level):
    stub, _, _ = semantic
    query = "How many child workers under 16 were found at the garment factory?"
    full = await search(stub, query, top_k=20, mode=mode, level=level)
    ids = await search(stub, query, top_k=20, mode=mode, level=level, view=common_pb2.HIT_VIEW_IDS)
    assert len(full.hits) >= 5

    def ranking(r):
        return [
            (h.doc_id, h.passage_index, h.score, h.dense_score, h.kg_score, h.best_node_id)
            for h in r.hits
        ]

    assert ranking(ids) == ranking(full)
    assert any(h.text for h in full.hits)
    for hit in ids.hits:
        assert (hit.title, hit.text, hit.source_url) == ("", "", "")
        assert not hit.organizations
        assert not hit.HasField("published_at")
    assert ids.ByteSize() < full.ByteSize() / 2


async def test_filters_restrict_dense_and_kg(semantic):
    stub, _, docs = semantic
    org = common_pb2.Filter(field="organization", any_of=["norvale copper"])
    for mode in (
        semantic_pb2.SEARCH_MODE_DENSE,
        semantic_pb2.SEARCH_MODE_KG,
        semantic_pb2.SEARCH_MODE_FUSED,
    ):
        r = await search(stub, "emissions target", top_k=20, filters=[org], mode=mode)
        expected = {d.id for d in docs if "Norvale Copper" in d.organizations}
        assert {h.doc_id for h in r.hits} == expected, mode
    named = [docs[0].id, docs[3].id]
    by_id = common_pb2.Filter(field="doc_id", any_of=[*named, "never-ingested"])
    for mode in (
        semantic_pb2.SEARCH_MODE_DENSE,
        semantic_pb2.SEARCH_MODE_KG,
        semantic_pb2.SEARCH_MODE_FUSED,
    ):
        r = await search(stub, "emissions water workers", top_k=20, filters=[by_id], mode=mode)
        assert {h.doc_id for h in r.hits} <= set(named), mode
        if mode == semantic_pb2.SEARCH_MODE_DENSE:
            assert {h.doc_id for h in r.hits} == set(named)
    dated = common_pb2.Filter(field="published_at", gte="2026-01-01")
    r = await search(stub, "water", top_k=50, filters=[dated])
    assert r.hits
    assert all(h.published_at.ToJsonString() >= "2026-01-01" for h in r.hits)


async def test_kg_search_and_explain_show_the_emissions_path(semantic):
    stub, _, docs = semantic
    emissions = [
        d
        for d in docs
        if "carbon-dioxide-emission" in d.entity_ids or "greenhouse-gas-emission" in d.entity_ids
    ]
    assert emissions, "the sample has emissions articles linked to the graph"
    r = await search(
        stub,
        "carbon dioxide emissions of mining companies",
        top_k=5,
        mode=semantic_pb2.SEARCH_MODE_KG,
    )
    assert r.hits
    assert all(h.HasField("kg_score") for h in r.hits)
    target = emissions[0].id
    explained = await stub.Explain(
        semantic_pb2.ExplainRequest(query="carbon dioxide emissions", doc_id=target, max_paths=20)
    )
    assert explained.kg_score == pytest.approx(
        explained.best_node_score + explained.next_nodes_mean, abs=1e-5
    )
    paths = [[n.id for n in p.nodes] for p in explained.paths]
    assert any(
        p[0] == target and p[-3:] == ["gri-305", "environment", "sustainability"] for p in paths
    )
    path = next(
        p
        for p in explained.paths
        if [n.id for n in p.nodes][-3:] == ["gri-305", "environment", "sustainability"]
    )
    assert path.nodes[0].relation == "Contained_in"
    assert (path.nodes[0].id, path.nodes[0].name) == (target, emissions[0].title)
    assert path.nodes[0].level == common_pb2.KG_NODE_LEVEL_ARTICLE
    assert path.nodes[-2].level == common_pb2.KG_NODE_LEVEL_PILLAR
    assert path.nodes[-3].gri_id == "GRI 305"
    assert all(-1.0 <= n.score <= 1.0 for n in path.nodes)


async def test_kg_explain_command_prints_each_path_with_node_scores(semantic):
    _, _, docs = semantic
    emissions = {"carbon-dioxide-emission", "greenhouse-gas-emission"}
    target = next(d for d in docs if emissions & set(d.entity_ids))
    args = ["kg", "explain", "carbon dioxide emissions", "--doc-id", target.id]
    args += ["--address", SERVED["address"], "--max-paths", "20"]
    # The command runs its own event loop, so it runs on a thread of its own.
    result = await asyncio.to_thread(CliRunner().invoke, main, args)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "Q: carbon dioxide emissions"
    assert lines[1].startswith(f"article {target.id}: KG score ")
    path = next(line for line in lines if "[GRI 305]" in line)
    # The article first, by its headline, then the entity it is linked to.
    assert re.match(rf"path \d+: {re.escape(target.title)} \(-?\d\.\d\d\) -Contained_in-> ", path)
    assert " [GRI 305] (" in path
    assert re.search(r"-> Environment \(-?\d\.\d\d\) -\w+-> Sustainability \(-?\d\.\d\d\)$", path)
    missing = await asyncio.to_thread(
        CliRunner().invoke, main, [*args[:3], "--doc-id", "no-such-article", *args[5:]]
    )
    assert missing.exit_code == 1
    assert "NOT_FOUND" in missing.output


async def test_reindex_and_delete(semantic):
    stub, _, docs = semantic
    doc = common_pb2.Document()
    doc.CopyFrom(docs[0])
    doc.passages.extend(
        [
            common_pb2.Passage(index=0, text=doc.body[:300]),
            common_pb2.Passage(index=1, text=doc.body[300:]),
        ]
    )
    await stub.Index(
        semantic_pb2.IndexRequest(documents=[semantic_pb2.IndexDocument(document=doc)])
    )
    before = await stub.Stats(semantic_pb2.StatsRequest())
    doc.ClearField("passages")
    doc.passages.append(common_pb2.Passage(index=0, text=docs[0].body))
    await stub.Index(
        semantic_pb2.IndexRequest(documents=[semantic_pb2.IndexDocument(document=doc)])
    )
    after = await stub.Stats(semantic_pb2.StatsRequest())
    assert (before.documents, after.documents) == (len(docs), len(docs))
    assert before.passages - after.passages == 1
    r = await search(stub, docs[0].body[:200], level=semantic_pb2.SEARCH_LEVEL_PASSAGE)
    assert (r.hits[0].doc_id, r.hits[0].passage_index) == (docs[0].id, 0)
    deleted = await stub.Delete(semantic_pb2.DeleteRequest(doc_ids=[docs[0].id, "nope"]))
    assert deleted.deleted == 1
    gone = await stub.Stats(semantic_pb2.StatsRequest())
    assert (gone.documents, gone.passages) == (len(docs) - 1, 0)
    await stub.Index(
        semantic_pb2.IndexRequest(documents=[semantic_pb2.IndexDocument(document=docs[0])])
    )


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (semantic_pb2.SearchRequest(query="", top_k=5), "query"),
        (semantic_pb2.SearchRequest(query="   ", top_k=5), "query"),
        (
            semantic_pb2.SearchRequest(
                query_vector=semantic_pb2.Vector(values=[0.1] * 10), top_k=5
            ),
            "query_vector",
        ),
        (semantic_pb2.SearchRequest(query="water", top_k=0), "top_k"),
        (
            semantic_pb2.SearchRequest(
                query="water",
                top_k=5,
                filters=[common_pb2.Filter(field="entity", any_of=["no-such-entity"])],
            ),
            "filters.entity[0]",
        ),
        (
            semantic_pb2.SearchRequest(
                query="water",
                top_k=5,
                mode=semantic_pb2.SEARCH_MODE_KG,
                level=semantic_pb2.SEARCH_LEVEL_PASSAGE,
            ),
            "level",
        ),
        (
            semantic_pb2.SearchRequest(
                query="water", top_k=5, filters=[common_pb2.Filter(field="colour", any_of=["x"])]
            ),
            "filters[0].field",
        ),
        (semantic_pb2.SearchRequest(query="water", top_k=5, view=9), "view"),
    ],
)
async def test_bad_input_is_invalid_argument(semantic, request_, field):
    stub, _, _ = semantic
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Search(request_)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(f"{field}: ")


async def test_bad_index_input_is_invalid_argument(semantic):
    stub, _, _ = semantic
    bad_vector = semantic_pb2.IndexDocument(
        document=common_pb2.Document(id="v", title="t", body="b"),
        article_vector=semantic_pb2.Vector(values=[0.5] * 3),
    )
    unknown_entity = semantic_pb2.IndexDocument(
        document=common_pb2.Document(id="e", title="t", body="b", entity_ids=["made-up"])
    )
    for item, field in (
        (bad_vector, "documents[0].article_vector"),
        (unknown_entity, "documents[0].document.entity_ids[0]"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Index(semantic_pb2.IndexRequest(documents=[item]))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details().startswith(f"{field}: ")


async def test_a_given_query_vector_is_used(semantic):
    stub, _, _ = semantic
    vec = EMBEDDER.encode(["child workers at a garment factory"])[0]
    r = await stub.Search(
        semantic_pb2.SearchRequest(query_vector=semantic_pb2.Vector(values=vec.tolist()), top_k=1)
    )
    assert r.hits[0].doc_id == "esg-005"
    assert np.isfinite(r.hits[0].score)


async def test_qdrant_down_is_unavailable(tmp_path: Path):
    settings = SemanticSettings(
        data_dir=tmp_path,
        store="qdrant",
        qdrant=QdrantSettings(url="http://127.0.0.1:1", timeout_seconds=2),
        server=ServerSettings(host="127.0.0.1", port=0),
    )
    index = SemanticIndex(settings, embedder=EMBEDDER)
    started = time.monotonic()
    with pytest.raises(Unavailable, match="qdrant"):
        await asyncio.wait_for(index.warm_up(), 30)
    assert time.monotonic() - started < 15
