"""Both vector stores behind the same tests: qdrant-edge on disk, qdrant-client in local mode.

Local mode is qdrant-client's in-process engine, so these stay unit tests (no
sockets); the server path shares all of QdrantVectorStore's code but the client
constructor.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attest.core.errors import FailedPrecondition, InvalidArgument
from attest.semantic.store import (
    EdgeVectorStore,
    Point,
    QdrantVectorStore,
    VectorFilter,
    VectorStore,
    create_store,
    point_id,
)

DIM = 8
StoreFactory = Callable[[], VectorStore]


def unit(*components: float) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[: len(components)] = components
    return v / np.linalg.norm(v)


def axis(i: int, tilt: float = 0.0) -> np.ndarray:
    """Unit vector near axis ``i``, tilted towards the last axis by ``tilt``."""
    v = np.zeros(DIM, dtype=np.float32)
    v[i] = 1.0
    v[DIM - 1] += tilt
    return v / np.linalg.norm(v)


def article(doc_id: str, vector: np.ndarray, **payload: object) -> Point:
    return Point(doc_id=doc_id, passage_index=-1, vector=vector, payload=dict(payload))


def passage(doc_id: str, index: int, vector: np.ndarray, **payload: object) -> Point:
    return Point(doc_id=doc_id, passage_index=index, vector=vector, payload=dict(payload))


def make_factory(kind: str, tmp_path: Path) -> StoreFactory:
    if kind == "edge":
        return lambda: EdgeVectorStore(tmp_path / "vectors", collection_prefix="t", dimension=DIM)
    return lambda: QdrantVectorStore(
        collection_prefix="t", dimension=DIM, path=tmp_path / "qdrant-local"
    )


@pytest.fixture(params=["edge", "qdrant-local"])
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    return make_factory(request.param, tmp_path)


@pytest.fixture
async def store(factory: StoreFactory) -> AsyncIterator[VectorStore]:
    s = factory()
    await s.warm_up()
    yield s
    await s.close()


async def test_search_ranks_the_nearest_first(store: VectorStore):
    await store.upsert(
        "passages",
        "acme",
        [passage("d1", i, axis(i, tilt=0.1 * i), text=f"p{i}") for i in range(5)],
    )
    hits = await store.search("passages", axis(2), 3, VectorFilter(tenant="acme"))
    assert hits[0].passage_index == 2
    assert hits[0].score == pytest.approx(float(axis(2) @ axis(2, tilt=0.2)), abs=1e-5)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert len(hits) == 3
    top = hits[0]
    assert top.doc_id == "d1"
    assert top.payload["text"] == "p2"
    assert top.payload["tenant"] == "acme"
    assert top.payload["doc_id"] == "d1"
    assert top.payload["passage_index"] == 2


async def test_an_ids_only_search_ranks_the_same_and_reads_only_the_ids(store: VectorStore):
    await store.upsert(
        "passages",
        "acme",
        [passage("d1", i, axis(i, tilt=0.1 * i), text=f"p{i}", title="t") for i in range(5)],
    )
    flt = VectorFilter(tenant="acme")
    full = await store.search("passages", axis(0), 4, flt)
    ids = await store.search("passages", axis(0), 4, flt, ids_only=True)
    assert [(h.doc_id, h.passage_index, h.score) for h in ids] == [
        (h.doc_id, h.passage_index, h.score) for h in full
    ]
    assert ids[0].passage_index == 0
    assert all(set(h.payload) == {"doc_id", "passage_index"} for h in ids)
    assert full[0].payload["text"] == "p0"


async def test_an_ids_only_search_after_a_reopen_reads_the_ids_it_has_not_seen(
    factory: StoreFactory,
):
    first = factory()
    await first.warm_up()
    # Distinct scores against axis(0), so the ranking has no ties.
    vectors = [axis(0) + 0.1 * i * axis(1) for i in range(20)]
    await first.upsert(
        "passages",
        "acme",
        [passage(f"d{i}", i % 3, v / np.linalg.norm(v)) for i, v in enumerate(vectors)],
    )
    await first.upsert("passages", "globex", [passage("g1", 0, axis(0))])
    flt = VectorFilter(tenant="acme")
    expected = [
        (h.doc_id, h.passage_index, h.score)
        for h in await first.search("passages", axis(0), 10, flt)
    ]
    await first.close()
    # A new process: nothing upserted or searched yet in this store object.
    second = factory()
    await second.warm_up()
    try:
        for _ in range(2):  # cold (ids read once), then from the ids already seen
            hits = await second.search("passages", axis(0), 10, flt, ids_only=True)
            assert [(h.doc_id, h.passage_index) for h in hits] == [e[:2] for e in expected]
            assert [h.score for h in hits] == pytest.approx([e[2] for e in expected], abs=1e-6)
        assert "g1" not in {h.doc_id for h in hits}
        # Deleted points are not returned, though their ids were seen.
        await second.delete_documents("acme", [expected[0][0]])
        after = await second.search("passages", axis(0), 10, flt, ids_only=True)
        assert expected[0][0] not in {h.doc_id for h in after}
    finally:
        await second.close()


async def test_the_edge_stores_id_table_is_bounded_and_rereads_what_it_dropped(tmp_path: Path):
    store = EdgeVectorStore(tmp_path / "v", collection_prefix="t", dimension=DIM, key_cache=5)
    await store.warm_up()
    try:
        vectors = [axis(0) + 0.1 * i * axis(1) for i in range(8)]
        await store.upsert(
            "articles",
            "acme",
            [article(f"d{i}", v / np.linalg.norm(v)) for i, v in enumerate(vectors)],
        )
        assert len(store._keys) == 5
        hits = await store.search(
            "articles", axis(0), 8, VectorFilter(tenant="acme"), ids_only=True
        )
        assert [h.doc_id for h in hits] == [f"d{i}" for i in range(8)]
        assert len(store._keys) == 5
    finally:
        await store.close()


async def test_the_edge_store_reads_no_payload_for_ids_it_wrote_or_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    store = EdgeVectorStore(tmp_path / "v", collection_prefix="t", dimension=DIM)
    await store.warm_up()
    reads: list[int] = []
    run = store._run

    async def counting(op: str, call: Any) -> Any:
        result = await run(op, call)
        if op == "retrieve":
            reads.append(len(result))
        return result

    monkeypatch.setattr(store, "_run", counting)
    flt = VectorFilter(tenant="acme")
    try:
        # The ids written (strings) are the ids a search finds (the engine's UUIDs).
        await store.upsert("articles", "acme", [article(f"d{i}", axis(i)) for i in range(4)])
        hits = await store.search("articles", axis(0), 4, flt, ids_only=True)
        assert hits[0].doc_id == "d0"
        assert len(hits) == 4
        assert reads == []
        store._keys.clear()  # as a new process would start
        for _ in range(2):
            hits = await store.search("articles", axis(0), 4, flt, ids_only=True)
            assert hits[0].doc_id == "d0"
        assert reads == [4]  # read once, then from the table
    finally:
        await store.close()


async def test_hits_leave_out_the_headline_vector_that_scans_keep(store: VectorStore):
    headline = axis(3).tolist()
    await store.upsert(
        "articles", "acme", [article("d1", axis(0), title="t", headline_vector=headline)]
    )
    (hit,) = await store.search("articles", axis(0), 5, VectorFilter(tenant="acme"))
    assert hit.payload["title"] == "t"
    assert "headline_vector" not in hit.payload
    (point,) = [p async for p in store.scroll("articles", "acme")]
    np.testing.assert_allclose(point.payload["headline_vector"], headline, atol=1e-6)


async def test_tenants_are_isolated(store: VectorStore):
    await store.upsert("articles", "acme", [article("d1", axis(0)), article("d2", axis(1))])
    await store.upsert("articles", "globex", [article("d1", axis(0))])
    hits = await store.search("articles", axis(0), 10, VectorFilter(tenant="globex"))
    assert [(h.doc_id, h.payload["tenant"]) for h in hits] == [("d1", "globex")]
    assert await store.count("articles", "acme") == 2
    assert await store.count("articles", "globex") == 1
    assert await store.count("articles", "initech") == 0
    assert await store.count("passages", "acme") == 0
    # Same doc id, different tenant: distinct points.
    assert point_id("acme", "d1", -1) != point_id("globex", "d1", -1)


async def test_a_search_keeps_to_the_documents_named(store: VectorStore):
    await store.upsert(
        "passages",
        "acme",
        [passage(d, i, axis(i, tilt=0.1 * k)) for k, d in enumerate("abc") for i in range(3)],
    )

    async def hits(*doc_ids: str, **more: object) -> set[str]:
        flt = VectorFilter(tenant="acme", doc_ids=doc_ids, **more)  # type: ignore[arg-type]
        return {h.doc_id for h in await store.search("passages", axis(1), 20, flt)}

    assert await hits() == {"a", "b", "c"}
    assert await hits("b") == {"b"}
    assert await hits("a", "c", "zzz") == {"a", "c"}
    assert await hits("zzz") == set()
    # With another condition, both hold.
    assert await hits("a", keywords={"entity_ids": ("gri-303",)}) == set()
    # Per passage: every passage of the named document, none of another.
    flt = VectorFilter(tenant="acme", doc_ids=("c",))
    found = await store.search("passages", axis(1), 20, flt)
    assert sorted(h.passage_index for h in found) == [0, 1, 2]


async def test_filters_by_organization_entity_and_date(store: VectorStore):
    await store.upsert(
        "articles",
        "acme",
        [
            article(
                "water",
                axis(0),
                organizations=["Brightwater Utilities"],
                entity_ids=["gri-303"],
                published_at=datetime(2025, 3, 1, tzinfo=UTC),
            ),
            article(
                "emissions",
                axis(0, tilt=0.3),
                organizations=["Norvale Copper", "Brightwater Utilities"],
                entity_ids=["gri-305"],
                published_at=int(datetime(2026, 1, 22, tzinfo=UTC).timestamp()),
            ),
            article(
                "labour",
                axis(0, tilt=0.6),
                organizations=["Halvorsen Textiles"],
                entity_ids=["gri-408", "gri-303"],
                published_at=datetime(2025, 4, 8, 12, 30),  # naive: UTC
            ),
            article("undated", axis(0, tilt=0.9)),
        ],
    )

    async def ids(**conditions: object) -> list[str]:
        flt = VectorFilter(tenant="acme", **conditions)  # type: ignore[arg-type]
        return [h.doc_id for h in await store.search("articles", axis(0), 10, flt)]

    assert await ids() == ["water", "emissions", "labour", "undated"]
    # Organizations match case-insensitively, any of the given values.
    assert await ids(keywords={"organizations": ("BRIGHTWATER utilities",)}) == [
        "water",
        "emissions",
    ]
    assert await ids(keywords={"organizations": ("halvorsen textiles", "norvale copper")}) == [
        "emissions",
        "labour",
    ]
    assert await ids(keywords={"entity_ids": ("gri-303",)}) == ["water", "labour"]
    assert await ids(keywords={"entity_ids": ("gri-999",)}) == []
    # Date bounds are inclusive; points without a date never match a date filter.
    assert await ids(
        published_from=datetime(2025, 3, 1, tzinfo=UTC),
        published_to=datetime(2025, 4, 8, 12, 30, tzinfo=UTC),
    ) == ["water", "labour"]
    assert await ids(published_from=datetime(2025, 3, 2, tzinfo=UTC)) == ["emissions", "labour"]
    assert await ids(published_to=datetime(2025, 12, 31, tzinfo=UTC)) == ["water", "labour"]
    # Conditions combine with AND.
    assert await ids(
        keywords={"organizations": ("brightwater utilities",)},
        published_from=datetime(2026, 1, 1, tzinfo=UTC),
    ) == ["emissions"]
    stored = (await store.search("articles", axis(0), 1, VectorFilter(tenant="acme")))[0]
    assert stored.payload["organizations"] == ["brightwater utilities"]
    assert stored.payload["published_at"] == int(datetime(2025, 3, 1, tzinfo=UTC).timestamp())


async def test_upsert_of_the_same_point_overwrites_it(store: VectorStore):
    await store.upsert("passages", "acme", [passage("d1", 0, axis(0), text="old")])
    await store.upsert("passages", "acme", [passage("d1", 1, axis(1), text="other")])
    await store.upsert("passages", "acme", [passage("d1", 0, axis(3), text="new")])
    assert await store.count("passages", "acme") == 2
    hits = await store.search("passages", axis(3), 1, VectorFilter(tenant="acme"))
    assert (hits[0].doc_id, hits[0].passage_index, hits[0].payload["text"]) == ("d1", 0, "new")
    assert hits[0].score == pytest.approx(1.0, abs=1e-5)


async def test_delete_documents_removes_articles_and_passages(store: VectorStore):
    for tenant in ("acme", "globex"):
        await store.upsert("articles", tenant, [article("d1", axis(0)), article("d2", axis(1))])
        await store.upsert(
            "passages",
            tenant,
            [passage("d1", 0, axis(0)), passage("d1", 1, axis(2)), passage("d2", 0, axis(1))],
        )
    assert await store.delete_documents("acme", ["d1", "missing"]) == 1
    assert await store.count("articles", "acme") == 1
    assert await store.count("passages", "acme") == 1
    hits = await store.search("passages", axis(0), 10, VectorFilter(tenant="acme"))
    assert {h.doc_id for h in hits} == {"d2"}
    # The other tenant's copy of d1 is untouched.
    assert await store.count("articles", "globex") == 2
    assert await store.count("passages", "globex") == 3
    assert await store.delete_documents("acme", ["d1"]) == 0
    assert await store.delete_documents("acme", []) == 0


async def test_scroll_returns_every_point_with_its_vector(store: VectorStore):
    written = {
        ("acme", f"d{i}", j): unit(1.0, i + 1.0, j + 0.5) for i in range(30) for j in range(3)
    }
    written[("globex", "g1", 0)] = axis(4)
    for (tenant, doc_id, j), vector in written.items():
        await store.upsert("passages", tenant, [passage(doc_id, j, vector)])
    seen = {}
    async for p in store.scroll("passages", None):
        seen[(p.payload["tenant"], p.doc_id, p.passage_index)] = p.vector
    assert seen.keys() == written.keys()
    for key, vector in written.items():
        np.testing.assert_allclose(seen[key], vector, atol=1e-6)
    acme = [p async for p in store.scroll("passages", "acme")]
    assert len(acme) == 90
    assert {p.payload["tenant"] for p in acme} == {"acme"}
    assert [p async for p in store.scroll("articles", None)] == []


async def test_data_survives_a_reopen(factory: StoreFactory):
    first = factory()
    await first.warm_up()
    await first.upsert("articles", "acme", [article("d1", axis(0), title="kept")])
    await first.upsert("passages", "acme", [passage("d1", 0, axis(1))])
    await first.close()

    second = factory()
    await second.warm_up()
    try:
        assert await second.count("articles", "acme") == 1
        assert await second.count("passages", "acme") == 1
        hits = await second.search("articles", axis(0), 1, VectorFilter(tenant="acme"))
        assert hits[0].payload["title"] == "kept"
    finally:
        await second.close()


async def test_bad_input_is_an_invalid_argument(store: VectorStore):
    flt = VectorFilter(tenant="acme")
    with pytest.raises(InvalidArgument, match="dimension"):
        await store.search("articles", np.ones(DIM + 1, dtype=np.float32), 3, flt)
    with pytest.raises(InvalidArgument, match="dimension"):
        await store.upsert("articles", "acme", [article("d1", np.ones(3, dtype=np.float32))])
    with pytest.raises(InvalidArgument, match="non-zero"):
        await store.search("articles", np.zeros(DIM, dtype=np.float32), 3, flt)
    with pytest.raises(InvalidArgument, match="tenant"):
        await store.count("articles", "")
    with pytest.raises(InvalidArgument, match="passage_index"):
        await store.upsert("articles", "acme", [passage("d1", 0, axis(0))])
    with pytest.raises(InvalidArgument, match="passage_index"):
        await store.upsert("passages", "acme", [article("d1", axis(0))])
    with pytest.raises(InvalidArgument, match="limit"):
        await store.search("articles", axis(0), 0, flt)
    backwards = VectorFilter(
        tenant="acme",
        published_from=datetime(2026, 1, 1, tzinfo=UTC),
        published_to=datetime(2025, 1, 1, tzinfo=UTC),
    )
    with pytest.raises(InvalidArgument, match="published_from"):
        await store.search("articles", axis(0), 3, backwards)
    with pytest.raises(InvalidArgument, match="tenant"):
        await store.upsert("articles", "acme", [article("d1", axis(0), tenant="globex")])
    assert await store.count("articles", "acme") == 0


async def test_edge_builds_the_hnsw_graph_once_enough_points_wait(tmp_path: Path):
    store = EdgeVectorStore(tmp_path, collection_prefix="t", dimension=DIM, index_after=200)
    await store.warm_up()
    try:
        rng = np.random.default_rng(7)
        vectors = rng.standard_normal((500, DIM)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        points = [passage(f"d{i}", 0, v) for i, v in enumerate(vectors)]
        await store.upsert("passages", "acme", points[:100])
        assert (await store.index_status("passages")).indexed_vectors == 0
        await store.upsert("passages", "acme", points[100:])
        status = await store.index_status("passages")
        assert status.points == 500
        assert status.indexed_vectors >= 400
        # The graph answers like exact search on this easy case.
        hits = await store.search("passages", vectors[123], 5, VectorFilter(tenant="acme"))
        assert hits[0].doc_id == "d123"
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)
    finally:
        await store.close()


async def test_edge_refuses_a_second_opener_and_another_dimension(tmp_path: Path):
    first = EdgeVectorStore(tmp_path, collection_prefix="t", dimension=DIM)
    await first.warm_up()
    try:
        with pytest.raises(FailedPrecondition, match="another process"):
            await EdgeVectorStore(tmp_path, collection_prefix="t", dimension=DIM).warm_up()
    finally:
        await first.close()
    with pytest.raises(FailedPrecondition, match="dimension 16"):
        await EdgeVectorStore(tmp_path, collection_prefix="t", dimension=16).warm_up()


async def test_qdrant_local_refuses_another_dimension(tmp_path: Path):
    first = QdrantVectorStore(collection_prefix="t", dimension=DIM, path=tmp_path)
    await first.warm_up()
    await first.close()
    with pytest.raises(FailedPrecondition, match="size 8"):
        await QdrantVectorStore(collection_prefix="t", dimension=16, path=tmp_path).warm_up()


async def test_operations_before_warm_up_fail_clearly(tmp_path: Path):
    for s in make_factory("edge", tmp_path)(), make_factory("qdrant", tmp_path)():
        with pytest.raises(FailedPrecondition, match="warm_up"):
            await s.count("articles", "acme")


def test_create_store_picks_the_configured_kind(tmp_path: Path):
    common = {"collection_prefix": "t", "dimension": DIM, "timeout_seconds": 1.0}
    edge = create_store("edge", path=tmp_path, url=None, api_key=None, **common)
    assert isinstance(edge, EdgeVectorStore)
    remote = create_store("qdrant", path=None, url="http://qdrant:6333", api_key="secret", **common)
    assert isinstance(remote, QdrantVectorStore)
    assert "secret" not in repr(vars(remote))
    with pytest.raises(FailedPrecondition):
        create_store("edge", path=None, url=None, api_key=None, **common)
    with pytest.raises(FailedPrecondition):
        create_store("qdrant", path=tmp_path, url=None, api_key=None, **common)


async def test_edge_searches_go_to_the_loop_once_measured_short_and_fail_alike_on_both(
    tmp_path: Path,
):
    import threading

    from attest.core.errors import Internal

    store = EdgeVectorStore(
        tmp_path / "vectors", collection_prefix="t", dimension=DIM, inline_search_seconds=0.5
    )
    await store.warm_up()
    try:
        await store.upsert("passages", "acme", [passage("d1", i, axis(i)) for i in range(3)])
        shard = store._shard("passages")
        seen: list[int] = []

        class Spy:
            def __init__(self, fail: bool) -> None:
                self.fail = fail

            def query(self, request):
                seen.append(threading.get_ident())
                if self.fail:
                    raise RuntimeError("engine failure")
                return shard.query(request)

            def __getattr__(self, name):
                return getattr(shard, name)

        store._shards["passages"] = Spy(fail=False)  # type: ignore[assignment]
        flt = VectorFilter(tenant="acme")
        for _ in range(3):
            hits = await store.search("passages", axis(1), 2, flt, ids_only=True)
            assert hits[0].passage_index == 1
        loop_thread = threading.get_ident()
        assert seen[0] != loop_thread
        assert seen[1:] == [loop_thread, loop_thread]
        # Searches with payloads are a kind of their own: measured afresh, on a thread.
        await store.search("passages", axis(1), 2, flt)
        assert seen[-1] != loop_thread
        # A failure is the same error on the loop as on a thread.
        store._shards["passages"] = Spy(fail=True)  # type: ignore[assignment]
        with pytest.raises(Internal, match="search failed"):
            await store.search("passages", axis(1), 2, flt, ids_only=True)
        assert seen[-1] == loop_thread
        off = EdgeVectorStore(
            tmp_path / "other", collection_prefix="t", dimension=DIM, inline_search_seconds=0.0
        )
        off._shards["passages"] = Spy(fail=True)  # type: ignore[assignment]
        with pytest.raises(Internal, match="search failed"):
            await off.search("passages", axis(1), 2, flt, ids_only=True)
        assert seen[-1] != loop_thread
    finally:
        store._shards["passages"] = shard
        await store.close()


def test_the_inline_budgets_come_from_the_settings(monkeypatch: pytest.MonkeyPatch):
    from attest.lexical.settings import LexicalSettings
    from attest.semantic.settings import SemanticSettings

    monkeypatch.setenv("ATTEST_LEXICAL_INLINE_SEARCH_MS", "0")
    monkeypatch.setenv("ATTEST_SEMANTIC_INLINE_SEARCH_MS", "5.5")
    assert LexicalSettings().inline_search_ms == 0
    assert SemanticSettings().inline_search_ms == 5.5
    monkeypatch.setenv("ATTEST_SEMANTIC_INLINE_SEARCH_MS", "-1")
    with pytest.raises(ValueError, match="inline_search_ms"):
        SemanticSettings()
