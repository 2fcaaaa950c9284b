"""The listings `attest doctor` reads the stores with, and the comparison it makes.

ListDocuments on every backend (tantivy; the OpenSearch/Elasticsearch engine
code's request and parsing; both vector stores, qdrant-edge on disk and
qdrant-client in local mode), the shapes and checksums the doctor builds from
those pages, the second look that keeps a document committed during the
listing from being reported as an orphan, and the periodic check with a store
down. No sockets.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attest.core.errors import InvalidArgument
from attest.ingest import doctor
from attest.ingest.listing import StoreListing, StoreShapes, StoreUnreachable
from attest.ingest.state import JobStore, MemoryKeyValue, RegistryEntry
from attest.lexical import query as q
from attest.lexical.backends.tantivy import TantivyBackend
from attest.lexical.convert import page_size_from_proto
from attest.lexical.models import DocumentIn, PassageIn
from attest.lexical.settings import LexicalSettings
from attest.semantic.store import (
    EdgeVectorStore,
    Point,
    QdrantVectorStore,
    VectorStore,
    list_documents,
)

DIM = 8


def _doc(doc_id: str, passages: int) -> DocumentIn:
    return DocumentIn(
        id=doc_id,
        title=f"title {doc_id}",
        body=f"body of {doc_id}",
        passages=tuple(PassageIn(i, f"passage {i} of {doc_id}") for i in range(passages)),
    )


async def test_tantivy_lists_documents_in_id_order_page_by_page(tmp_path: Path):
    backend = TantivyBackend(LexicalSettings(data_dir=tmp_path, index_name="unit"))
    await backend.warm_up()
    try:
        await backend.index("acme", [_doc(f"d{i}", i % 3) for i in range(5)], refresh=True)
        await backend.index("globex", [_doc("d9", 4)], refresh=True)
        pages, token = [], ""
        while True:
            page = await backend.list_documents("acme", token, 2)
            pages.append([(d.doc_id, d.passages, d.has_document) for d in page.documents])
            token = page.next_page_token
            if not token:
                break
        assert pages == [
            [("d0", 0, True), ("d1", 1, True)],
            [("d2", 2, True), ("d3", 0, True)],
            [("d4", 1, True)],
        ]
        (only,) = (await backend.list_documents("globex", "", 10)).documents
        assert (only.doc_id, only.passages) == ("d9", 4)
        assert (await backend.list_documents("initech", "", 10)).documents == ()
    finally:
        await backend.close()


def test_engine_listing_pages_by_composite_aggregation():
    body = q.list_body("acme", "d2", 3)
    composite = body["aggs"]["docs"]["composite"]
    assert (composite["size"], composite["after"]) == (3, {"doc": "d2"})
    assert body["query"]["bool"]["filter"] == [{"term": {"tenant": "acme"}}]
    assert "after" not in q.list_body("acme", "", 3)["aggs"]["docs"]["composite"]
    # A bucket counts the document record and its passage records together.
    response = {
        "aggregations": {
            "docs": {
                "after_key": {"doc": "d5"},
                "buckets": [
                    {"key": {"doc": "d3"}, "doc_count": 3, "passages": {"doc_count": 2}},
                    {"key": {"doc": "d4"}, "doc_count": 1, "passages": {"doc_count": 0}},
                    {"key": {"doc": "d5"}, "doc_count": 2, "passages": {"doc_count": 2}},
                ],
            }
        }
    }
    page = q.documents_from_composite(response, 3)
    assert [(d.doc_id, d.passages, d.has_document) for d in page.documents] == [
        ("d3", 2, True),
        ("d4", 0, True),
        ("d5", 2, False),
    ]
    assert page.next_page_token == "d5"
    assert q.documents_from_composite(response, 4).next_page_token == ""


def test_page_size_bounds():
    assert (page_size_from_proto(0), page_size_from_proto(10_000)) == (1000, 10_000)
    for bad in (-1, 10_001):
        with pytest.raises(InvalidArgument):
            page_size_from_proto(bad)


def _vector(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


@pytest.fixture(params=["edge", "qdrant-local"])
async def vectors(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[VectorStore]:
    store: VectorStore
    if request.param == "edge":
        store = EdgeVectorStore(tmp_path / "vectors", collection_prefix="t", dimension=DIM)
    else:
        store = QdrantVectorStore(collection_prefix="t", dimension=DIM, path=tmp_path / "q")
    await store.warm_up()
    yield store
    await store.close()


async def _all_pages(store: VectorStore, tenant: str, size: int) -> list[Any]:
    out, token, pages = [], "", 0
    while True:
        page = await list_documents(store, tenant, token, size)
        pages += 1
        out.extend(page.documents)
        token = page.next_page_token
        if not token:
            return out
        assert pages < 50


async def test_vector_stores_list_articles_links_and_lone_passages(vectors: VectorStore):
    articles = [
        Point(f"a{i}", -1, _vector(i), {"entity_ids": [f"E{i}", "E0"][: 1 + i % 2]})
        for i in range(5)
    ]
    passages = [Point(f"a{i}", j, _vector(10 * i + j)) for i in range(5) for j in range(i % 3)]
    # Passages whose article never arrived (a write cut short between the two).
    passages += [Point("lone", j, _vector(100 + j)) for j in range(3)]
    await vectors.upsert("articles", "acme", articles)
    await vectors.upsert("passages", "acme", passages)
    await vectors.upsert("articles", "globex", [Point("g1", -1, _vector(200))])
    listed = await _all_pages(vectors, "acme", 2)
    seen = {d.doc_id: (d.passages, d.has_article, d.entity_ids) for d in listed}
    assert seen == {
        "a0": (0, True, ("E0",)),
        "a1": (1, True, ("E0", "E1")),
        "a2": (2, True, ("E2",)),
        "a3": (0, True, ("E0", "E3")),
        "a4": (1, True, ("E4",)),
        "lone": (3, False, ()),
    }
    # Every article once; the lone passages' id possibly on two pages, same figures.
    assert sorted(d.doc_id for d in listed if d.has_article) == [f"a{i}" for i in range(5)]
    assert [(d.doc_id, d.passages) for d in await _all_pages(vectors, "globex", 1000)] == [
        ("g1", 0)
    ]
    for bad in ("x:nonsense", "a:not-a-point-id", "p:12"):
        with pytest.raises(InvalidArgument):
            await list_documents(vectors, "acme", bad, 10)


class FakeListing(StoreListing):
    """Fixed shapes of tenant acme (nothing for the others); ``during`` runs while
    the stores are being "listed"."""

    def __init__(self, shapes: StoreShapes, during: Any = None) -> None:
        self._shapes = shapes
        self.during = during
        self.down: str | None = None

    async def shapes(self, tenant: str) -> StoreShapes:
        if self.down:
            raise StoreUnreachable(self.down, "UNAVAILABLE: connection refused")
        if self.during is not None:
            self.during()
        return self._shapes if tenant == "acme" else StoreShapes()

    async def close(self) -> None:
        pass


def _entry(passages: int, *links: str) -> RegistryEntry:
    return RegistryEntry("h", passages, {"entity_ids": tuple(links)})


def _store(registry: dict[str, RegistryEntry]) -> JobStore:
    store = JobStore(MemoryKeyValue())
    store.create_job("job-1", "acme")
    store.registry_put("acme", registry)
    return store


async def test_findings_from_listed_shapes():
    store = _store({"d1": _entry(2, "E1"), "d2": _entry(1), "d3": _entry(3, "E2", "E1")})
    shapes = StoreShapes()
    for doc_id, n in (("d1", 2), ("d3", 3), ("orphan", 1)):
        shapes.add_lexical(doc_id, n, True)
    shapes.add_lexical("d2", 1, False)  # passages without their document record
    shapes.add_vectors("d1", 2, True, ["E1"])
    shapes.add_vectors("d2", 1, True, [])
    shapes.add_vectors("d3", 2, True, ["E2", "E1"])  # a passage short
    (f,) = await doctor.check(store, FakeListing(shapes), ["acme"])
    by = {s.store: s for s in f.stores}
    assert (by["lexical"].missing, by["lexical"].orphans) == (["d2"], ["orphan"])
    assert (by["vectors"].missing, by["vectors"].orphans) == (["d3"], [])
    assert (by["kg_links"].missing, by["kg_links"].orphans) == ([], [])
    assert (by["lexical"].documents, by["lexical"].units) == (4, 7)
    assert (by["kg_links"].documents, by["kg_links"].units) == (3, 3)
    # The checksum is over the sorted `id:value` lines: equal for equal shapes.
    assert by["kg_links"].checksum == doctor.checksum({"d1": "E1", "d2": "", "d3": "E1,E2"})
    assert by["lexical"].checksum != f.checksum
    assert f.checksum == doctor.checksum({"d1": 2, "d2": 1, "d3": 3})
    assert not f.consistent


async def test_documents_being_written_are_never_orphans():
    store = _store({"d1": _entry(1)})
    shapes = StoreShapes()
    for doc_id in ("d1", "new-1", "new-2"):
        shapes.add_lexical(doc_id, 1, True)
        shapes.add_vectors(doc_id, 1, True, [])
    # new-1 is pending in an open job; new-2 is committed while the stores are
    # listed (after the registry was read): neither is an orphan.
    store.registry_begin("job-1", "acme", ["new-1"])

    def commit() -> None:
        store.registry_begin("job-1", "acme", ["new-2"])
        store.registry_commit("job-1", "acme", {"new-2": _entry(1)}, {}, {0: ("created", 1)})

    (f,) = await doctor.check(store, FakeListing(shapes, during=commit), ["acme"])
    assert [(s.missing, s.orphans) for s in f.stores] == [([], [])] * 3
    assert (f.in_flight, f.stale_pending) == (["new-1"], [])


async def test_periodic_check_survives_a_store_that_is_down():
    store = _store({"d1": _entry(1)})
    shapes = StoreShapes()
    shapes.add_lexical("d1", 1, True)
    shapes.add_vectors("d1", 1, True, [])
    shapes.add_vectors("stray", 0, True, [])
    listing = FakeListing(shapes)
    check = doctor.PeriodicCheck(store, listing, 3600)
    before = doctor.CHECKS.labels("vectors")._value.get()
    listing.down = "vectors"
    assert await check.run_once() is None
    assert doctor.CHECKS.labels("vectors")._value.get() == before + 1
    listing.down = None
    (f,) = await check.run_once() or []
    assert [len(s.orphans) for s in f.stores] == [0, 1, 1]
    assert doctor.ORPHANS.labels("acme", "vectors")._value.get() == 1
    assert doctor.DOCUMENTS.labels("acme", "registry")._value.get() == 1
    assert doctor.LAST_CHECK._value.get() > 0
    await check.close()
