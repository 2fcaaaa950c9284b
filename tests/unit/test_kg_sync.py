"""Replicas over one vector store keep their KG scores in step (``kg_sync_seconds``).

Each test runs two SemanticIndex objects (in the first, two gRPC servers with
a SemanticServicer each) over ONE store object, for both backends: qdrant-edge on disk, and qdrant-client's local mode (the same
QdrantVectorStore code a Qdrant server is used through, but the client
constructor). Two processes cannot be used here: qdrant-edge and local mode
both lock their directory against a second opener, and no Qdrant server runs
in the unit tests. The replicas share nothing else: each has its own data
directory and its own KG table.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# The first KG scoring of a process imports torch (13 s on a busy 2-core
# machine): paid at collection here, not inside a gRPC search's deadline.
import torch  # noqa: F401
from qdrant_client import models as qm

from attest.common.v1 import common_pb2
from attest.core import cache
from attest.core.channels import create_channel
from attest.core.server import running
from attest.core.settings import ServerSettings
from attest.knowledge.graph import KnowledgeGraph, Level, load_graph
from attest.semantic import index as index_module
from attest.semantic.index import SemanticIndex
from attest.semantic.models import Mode, SemanticQuery, Variant
from attest.semantic.servicer import SemanticServicer
from attest.semantic.settings import SemanticSettings
from attest.semantic.store import EdgeVectorStore, QdrantVectorStore, VectorStore
from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc
from tests.unit.test_semantic_restart import DIM, HashEmbedder, doc

pytestmark = pytest.mark.asyncio

BOUND = 1.0  # kg_sync_seconds of the replicas under test
ONE_SYNC = 0.25  # allowance for the sync itself (milliseconds here, on an idle machine)
MANUAL = 3600.0  # kg_sync_seconds where a test calls sync() itself
QUESTIONS = ("greenhouse gas emissions", "strike at the plant", "Acme Corp")


@pytest.fixture(scope="module")
def graph() -> KnowledgeGraph:
    return load_graph()


@pytest.fixture
def linkable(graph: KnowledgeGraph) -> list[str]:
    return sorted(e.id for e in graph.entities.values() if e.level is Level.LOWER)[:4]


@pytest.fixture(params=["edge", "qdrant-local"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[VectorStore]:
    monkeypatch.setenv("ATTEST_CACHE_DIR", str(tmp_path / "cache"))
    cache.forget_shared()
    s: VectorStore
    if request.param == "edge":
        s = EdgeVectorStore(tmp_path / "vectors", collection_prefix="t", dimension=DIM)
    else:
        s = QdrantVectorStore(collection_prefix="t", dimension=DIM, path=tmp_path / "local")
    await s.warm_up()
    yield s
    await s.close()


@dataclass
class Replicas:
    a: SemanticIndex
    b: SemanticIndex


async def replicas(
    store: VectorStore, graph: KnowledgeGraph, tmp_path: Path, sync: float
) -> Replicas:
    out = []
    for name in ("a", "b"):
        settings = SemanticSettings(data_dir=tmp_path / name, kg_sync_seconds=sync)
        index = SemanticIndex(settings, embedder=HashEmbedder(), store=store, graph=graph)  # type: ignore[arg-type]
        await index.warm_up()
        out.append(index)
    return Replicas(*out)


async def kg_hits(index: SemanticIndex, text: str) -> list[tuple[str, float]]:
    hits = await index.search(
        "default", SemanticQuery(text=text, top_k=20, mode=Mode.KG, variant=Variant.ENHANCED)
    )
    return [(h.doc_id, round(h.score, 5)) for h in hits]


async def all_hits(index: SemanticIndex) -> dict[str, list[tuple[str, float]]]:
    return {q: await kg_hits(index, q) for q in QUESTIONS}


async def after_bound(written: float) -> None:
    """Wait until the bound has passed since a write returned."""
    await asyncio.sleep(max(0.0, written + BOUND + ONE_SYNC - time.monotonic()))


async def test_two_servicers_over_one_store_agree_within_the_bound(
    store: VectorStore, graph: KnowledgeGraph, linkable: list[str], tmp_path: Path
) -> None:
    r = await replicas(store, graph, tmp_path, BOUND)
    local = ServerSettings(host="127.0.0.1", port=0)
    a_settings, b_settings = r.a.settings, r.b.settings
    async with (
        running([SemanticServicer(a_settings, r.a)], local) as a_server,
        running([SemanticServicer(b_settings, r.b)], local) as b_server,
    ):
        a_channel = create_channel(f"127.0.0.1:{a_server.port}")
        b_channel = create_channel(f"127.0.0.1:{b_server.port}")
        a = semantic_pb2_grpc.SemanticServiceStub(a_channel)
        b = semantic_pb2_grpc.SemanticServiceStub(b_channel)

        async def kg(stub: semantic_pb2_grpc.SemanticServiceStub) -> list[tuple[str, float]]:
            response = await stub.Search(
                semantic_pb2.SearchRequest(
                    query=QUESTIONS[0], top_k=20, mode=semantic_pb2.SEARCH_MODE_KG
                )
            )
            return [(h.doc_id, round(h.kg_score, 5)) for h in response.hits]

        documents = [
            common_pb2.Document(
                id=f"g{i}",
                title=f"Report {i} on emissions",
                body=f"Body {i}: emissions at the smelter.",
                organizations=["Acme Corp"],
                entity_ids=[linkable[i]],
            )
            for i in range(3)
        ]
        await a.Index(
            semantic_pb2.IndexRequest(
                documents=[semantic_pb2.IndexDocument(document=d) for d in documents]
            )
        )
        await after_bound(time.monotonic())
        on_a = await kg(a)
        assert {d for d, _ in on_a} == {"g0", "g1", "g2"}
        assert await kg(b) == on_a
        deleted = await a.Delete(semantic_pb2.DeleteRequest(doc_ids=["g1"]))
        assert deleted.deleted == 1
        await after_bound(time.monotonic())
        on_a = await kg(a)
        assert {d for d, _ in on_a} == {"g0", "g2"}
        assert await kg(b) == on_a
        await a_channel.close()
        await b_channel.close()


async def test_writes_and_deletes_through_one_replica_reach_the_others_scores(
    store: VectorStore, graph: KnowledgeGraph, linkable: list[str], tmp_path: Path
) -> None:
    r = await replicas(store, graph, tmp_path, BOUND)
    await r.a.index(
        "default",
        [
            doc(1, ("Acme Corp", "Globex"), (linkable[0],)),
            doc(2, ("Globex",), (linkable[1], linkable[2])),
            doc(3, ("Initech",), ()),
        ],
    )
    await after_bound(time.monotonic())
    expected = await all_hits(r.a)
    assert {d for d, _ in expected[QUESTIONS[0]]} == {"d1", "d2", "d3"}
    assert await all_hits(r.b) == expected
    assert await r.b.stats("default") == await r.a.stats("default")

    # A delete, an update in place (other links and organizations) and a new
    # article through A; then a write through B reaches A the same way.
    await r.a.delete("default", ["d3"])
    await r.a.index("default", [doc(2, ("Umbrella",), (linkable[3],)), doc(4, (), (linkable[0],))])
    await r.b.index("default", [doc(5, ("Acme Corp",), (linkable[1],))])
    written = time.monotonic()
    await after_bound(written)
    expected = await all_hits(r.a)
    assert {d for d, _ in expected[QUESTIONS[0]]} == {"d1", "d2", "d4", "d5"}
    assert await all_hits(r.b) == expected
    assert await r.b.stats("default") == await r.a.stats("default")
    explained = await r.b.explain("default", "d2", SemanticQuery(text=QUESTIONS[1]))
    assert explained[0].doc_id == "d2"


async def test_an_entry_stamped_by_a_lagging_clock_is_still_applied(
    store: VectorStore, graph: KnowledgeGraph, linkable: list[str], tmp_path: Path
) -> None:
    r = await replicas(store, graph, tmp_path, MANUAL)
    await r.a.index("default", [doc(1, ("Acme Corp",), (linkable[0],))])
    assert await kg_hits(r.b, QUESTIONS[0]) == []  # each replica has a table of its own
    await r.b.sync()
    assert {d for d, _ in await kg_hits(r.b, QUESTIONS[0])} == {"d1"}
    # A write logged by a writer whose clock is 10 s behind, after B's cursor moved on.
    lagging = SemanticSettings(data_dir=tmp_path / "c")
    writer = SemanticIndex(lagging, embedder=HashEmbedder(), store=store, graph=graph)  # type: ignore[arg-type]
    await writer.warm_up()
    await writer.index("default", [doc(7, ("Globex",), (linkable[1],))])  # sync off: no entry
    behind = time.time_ns() // 1000 - 10_000_000
    await store.record_changes("default", ["d7"], writer="lagging", at_us=behind)
    await r.b.sync()
    assert {d for d, _ in await kg_hits(r.b, QUESTIONS[0])} == {"d1", "d7"}


async def test_a_replica_that_missed_the_retention_rescans(
    store: VectorStore,
    graph: KnowledgeGraph,
    linkable: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r = await replicas(store, graph, tmp_path, MANUAL)
    await r.a.index("default", [doc(1, (), (linkable[0],)), doc(2, (), (linkable[1],))])
    await r.b.sync()
    await r.a.delete("default", ["d1"])
    await r.a.index("default", [doc(3, (), (linkable[2],))])
    # Every entry pruned, as after an hour: only a rescan can tell B.
    await store.prune_changes(time.time_ns() // 1000 + 1)
    assert await store.changes_since(0) == []
    await r.b.sync()
    assert {d for d, _ in await kg_hits(r.b, QUESTIONS[0])} == {"d1", "d2"}  # no entry read
    monkeypatch.setattr(
        r.b, "_synced_wall_us", r.b._synced_wall_us - index_module.KG_CHANGE_RETENTION_US
    )
    await r.b.sync()
    assert await all_hits(r.b) == await all_hits(r.a)
    assert {d for d, _ in await kg_hits(r.b, QUESTIONS[0])} == {"d2", "d3"}


async def test_the_change_log_reads_from_a_time_and_prunes_before_one(
    store: VectorStore,
) -> None:
    await store.record_changes("t1", ["x", "y"], writer="w1", at_us=1_000)
    await store.record_changes("t2", ["x"], writer="w2", at_us=2_000)
    await store.record_changes("t1", ["z"] * 3, writer="w1", at_us=3_000)  # one entry
    every = await store.changes_since(0)
    assert sorted((c.tenant, c.doc_id, c.at_us, c.writer) for c in every) == [
        ("t1", "x", 1_000, "w1"),
        ("t1", "y", 1_000, "w1"),
        ("t1", "z", 3_000, "w1"),
        ("t2", "x", 2_000, "w2"),
    ]
    assert len({c.id for c in every}) == 4
    assert sorted(c.doc_id for c in await store.changes_since(2_000)) == ["x", "z"]
    await store.prune_changes(3_000)
    assert [(c.tenant, c.doc_id) for c in await store.changes_since(0)] == [("t1", "z")]


async def test_sync_off_keeps_replicas_apart_and_logs_nothing(
    store: VectorStore, graph: KnowledgeGraph, linkable: list[str], tmp_path: Path
) -> None:
    r = await replicas(store, graph, tmp_path, 0)
    await r.a.index("default", [doc(1, ("Acme Corp",), (linkable[0],))])
    await r.a.delete("default", ["d1"])
    await r.a.index("default", [doc(2, ("Acme Corp",), (linkable[0],))])
    await r.b.sync()
    assert await kg_hits(r.b, QUESTIONS[0]) == []
    assert {d for d, _ in await kg_hits(r.a, QUESTIONS[0])} == {"d2"}
    if isinstance(store, EdgeVectorStore):  # the log's collection is made on first use only
        assert not (tmp_path / "vectors" / "t-changes").exists()
    assert await store.changes_since(0) == []


class RecordingClient:
    """What a Qdrant server is asked when the change log is first used (the one
    step local mode skips: payload indexes)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[object, ...], dict[str, object]]] = []
        self.exists = False

    async def collection_exists(self, name: str) -> bool:
        self.calls.append(("collection_exists", (name,), {}))
        return self.exists

    def __getattr__(self, method: str) -> object:
        async def call(*args: object, **kwargs: object) -> None:
            self.calls.append((method, args, kwargs))
            if method == "create_collection":
                self.exists = True

        return call


async def test_the_server_path_creates_the_log_once_with_a_range_index_on_its_time() -> None:
    store = QdrantVectorStore(collection_prefix="p", dimension=DIM, url="http://127.0.0.1:1")
    client = RecordingClient()
    store._client = client  # type: ignore[assignment]
    await store.record_changes("t", ["a", "b"], writer="w", at_us=5)
    await store.record_changes("t", ["c"], writer="w", at_us=6)
    names = [c[0] for c in client.calls]
    assert names == [
        "collection_exists",
        "create_collection",
        "create_payload_index",
        "upsert",
        "upsert",
    ]
    _, args, kwargs = client.calls[1]
    assert args == ("p-changes",)
    assert kwargs["vectors_config"] == qm.VectorParams(size=1, distance=qm.Distance.DOT)
    _, args, kwargs = client.calls[2]
    assert kwargs["field_name"] == "at"
    schema = kwargs["field_schema"]
    assert isinstance(schema, qm.IntegerIndexParams)
    assert schema.range
    assert not schema.lookup
    points = client.calls[3][2]["points"]
    assert isinstance(points, list)
    assert [p.payload for p in points] == [
        {"tenant": "t", "doc_id": d, "at": 5, "writer": "w"} for d in ("a", "b")
    ]
