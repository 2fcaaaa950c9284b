"""Every store keeps tenants apart when they use the same document ids.

BM25 on tantivy and on the engine code OpenSearch and Elasticsearch share
(here over an in-memory engine that evaluates the tenant filter the way the
real ones do; tests/integration/test_tenant_stores.py runs the same scenario
on a real OpenSearch node), the KG article table, ingest's job records and
deletes, and `attest doctor` moving the documents an older release wrote under tenant ``default`` back
to their own tenant. No sockets.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attest.core.common import Filters
from attest.core.errors import NotFound
from attest.ingest import doctor
from attest.ingest.assembly import assemble
from attest.ingest.documents import article_from_raw_json
from attest.ingest.jobs import Batch, IngestCore, Item
from attest.ingest.settings import IngestSettings
from attest.ingest.sinks import LocalSinks
from attest.ingest.state import JobStore, MemoryKeyValue, RegistryEntry
from attest.lexical.backends import LexicalBackend
from attest.lexical.backends.engine import EngineBackend
from attest.lexical.backends.tantivy import TantivyBackend
from attest.lexical.models import DocumentIn, Level, PassageIn, SearchQuery
from attest.lexical.settings import LexicalSettings

TENANTS = ("acme", "globex")
OTHER = {"acme": "globex", "globex": "acme"}
SECRET = {"acme": "kestrelwood", "globex": "marrowfen"}
TOPICS = {"d1": "water withdrawal", "d2": "emissions target", "d3": "child workers"}


def document(tenant: str, doc_id: str, passages: int = 2) -> DocumentIn:
    topic, secret = TOPICS[doc_id], SECRET[tenant]
    return DocumentIn(
        id=doc_id,
        title=f"{topic} report",
        body=f"The {topic} report of {secret}.",
        passages=tuple(
            PassageIn(i, f"Part {i} on {topic}, filed by {secret}.") for i in range(passages)
        ),
    )


def _texts(hits: Any) -> str:
    return " ".join(f"{h.title} {h.text} {' '.join(h.highlights)}" for h in hits)


async def same_ids_in_two_tenants(backend: LexicalBackend) -> None:
    """The scenario every lexical backend passes."""
    for tenant in TENANTS:
        await backend.index(tenant, [document(tenant, d) for d in TOPICS], refresh=True)
    for tenant in TENANTS:
        for level in Level:
            hits = await backend.search(
                tenant,
                SearchQuery(text="water emissions workers", top_k=20, level=level, highlight=True),
            )
            assert sorted({h.doc_id for h in hits}) == sorted(TOPICS)
            assert len(hits) == (3 if level is Level.DOCUMENT else 6)
            assert SECRET[OTHER[tenant]] not in _texts(hits)
            assert all(SECRET[tenant] in h.text for h in hits)
        # The other tenant's secret word matches nothing, though both use the same ids.
        assert await backend.search(tenant, SearchQuery(text=SECRET[OTHER[tenant]])) == []
        counts = await backend.stats(tenant)
        assert (counts.documents, counts.passages) == (3, 6)

    # acme's d1 loses a passage: globex's d1 keeps both.
    await backend.index("acme", [document("acme", "d1", passages=1)], refresh=True)
    passages = SearchQuery(text="water withdrawal", top_k=20, level=Level.PASSAGE)
    assert [h.passage_index for h in await backend.search("acme", passages)] == [0]
    assert sorted(h.passage_index for h in await backend.search("globex", passages)) == [0, 1]

    # acme deletes d2; globex's d2 stays, and a second delete finds nothing.
    assert await backend.delete("acme", ["d2"]) == 1
    assert await backend.search("acme", SearchQuery(text="emissions target")) == []
    (theirs,) = await backend.search("globex", SearchQuery(text="emissions target"))
    assert (theirs.doc_id, SECRET["globex"] in theirs.text) == ("d2", True)
    assert await backend.delete("acme", ["d2"]) == 0
    counts = await backend.stats("globex")
    assert (counts.documents, counts.passages) == (3, 6)
    counts = await backend.stats("acme")
    assert (counts.documents, counts.passages) == (2, 3)


async def test_tantivy_keeps_tenants_apart(tmp_path: Path):
    backend = TantivyBackend(LexicalSettings(data_dir=tmp_path, index_name="unit"))
    await backend.warm_up()
    try:
        await same_ids_in_two_tenants(backend)
        assert await backend.document_ids("globex") == {"d1": 2, "d2": 2, "d3": 2}
    finally:
        await backend.close()


class MemoryEngine(EngineBackend):
    """The engine backend over dicts: records by index and id; a search filters by
    the request's term filters and matches any query word in title or text."""

    name = "memory"

    def __init__(self, settings: LexicalSettings) -> None:
        super().__init__(settings, 10)
        self.indexes: dict[str, dict[str, dict[str, Any]]] = {}

    def _classify(self, exc: Exception) -> tuple[str, int | None]:
        return "status", None

    def _is_already_exists(self, exc: Exception) -> bool:
        return False

    async def _index_exists(self, index: str) -> bool:
        return index in self.indexes

    async def _create_index(self, index: str, definition: dict[str, Any]) -> None:
        self.indexes[index] = {}

    async def _put_mapping(self, index: str, properties: dict[str, Any]) -> None:
        pass  # records are dicts: any field fits

    async def _mget(self, index: str, ids: list[str], fields: list[str]) -> dict[str, Any]:
        records = self.indexes[index]
        return {
            "docs": [
                {"_id": i, "found": True, "_source": {f: records[i].get(f) for f in fields}}
                if i in records
                else {"_id": i, "found": False}
                for i in ids
            ]
        }

    @staticmethod
    def _matches(source: dict[str, Any], body: dict[str, Any]) -> bool:
        for clause in body["query"]["bool"]["filter"]:
            ((field, value),) = clause["term"].items()
            if source.get(field) != value:
                return False
        return True

    async def _search(self, index: str, body: dict[str, Any]) -> dict[str, Any]:
        words = set(
            re.findall(r"\w+", body["query"]["bool"]["must"][0]["multi_match"]["query"].lower())
        )
        hits = [
            {"_id": i, "_score": 1.0, "_source": s}
            for i, s in sorted(self.indexes[index].items())
            if self._matches(s, body)
            and words & set(re.findall(r"\w+", f"{s['title']} {s['text']}".lower()))
        ]
        return {"hits": {"hits": hits[: body["size"]]}}

    async def _count(self, index: str, body: dict[str, Any]) -> int:
        return sum(self._matches(s, body) for s in self.indexes[index].values())

    async def _bulk(self, actions: list[dict[str, Any]], refresh: bool) -> list[dict[str, Any]]:
        errors = []
        for a in actions:
            records = self.indexes[a["_index"]]
            if a["_op_type"] == "index":
                records[a["_id"]] = a["_source"]
            elif records.pop(a["_id"], None) is None:
                errors.append({"delete": {"_id": a["_id"], "status": 404}})
        return errors

    async def close(self) -> None:
        return None


async def test_the_engine_backends_keep_tenants_apart(tmp_path: Path):
    backend = MemoryEngine(LexicalSettings(data_dir=tmp_path, index_name="unit"))
    await backend.warm_up()
    await same_ids_in_two_tenants(backend)
    # Record ids are (tenant, document): the same id of two tenants is two records.
    ids = set(backend.indexes["unit-documents"])
    assert {"acme/d1", "globex/d1", "globex/d2"} <= ids
    assert "acme/d2" not in ids


class _Dispatcher:
    def dispatch(self, job_id: str, tenant: str, batches: Sequence[Batch]) -> None:
        return None


class _Sinks:
    def __init__(self) -> None:
        self.deleted: list[tuple[str, list[str]]] = []

    async def index(self, tenant: str, records: Sequence[Any]) -> None:
        return None

    async def delete(self, tenant: str, doc_ids: Sequence[str]) -> None:
        self.deleted.append((tenant, list(doc_ids)))

    async def close(self) -> None:
        return None


async def test_ingest_jobs_and_deletes_stay_in_their_tenant():
    store, sinks = JobStore(MemoryKeyValue()), _Sinks()
    core = IngestCore(store, _Dispatcher(), lambda: sinks)
    entry = RegistryEntry(content_hash="h", passages=1, keywords={"organizations": ("Acme",)})
    store.registry_put("acme", {"d1": entry, "a-only": entry})
    store.registry_put("globex", {"d1": entry})
    job = core.start_job("acme")
    assert core.job("acme", job).tenant == "acme"
    # Another tenant's job id reads exactly like an unknown one.
    for tenant, job_id in (("globex", job), ("acme", "0" * 32)):
        with pytest.raises(NotFound, match=r"^no job '[0-9a-f]{32}'$"):
            core.job(tenant, job_id)
    # globex deletes acme's ids, by id and by acme's organization: nothing matches,
    # nothing reaches the stores.
    assert (await core.delete("globex", doc_ids=["a-only"])).matched == 0
    assert (
        await core.delete("globex", filters=Filters(keywords={"organizations": ("Nope",)}))
    ).matched == 0
    assert sinks.deleted == []
    # Its own d1 goes from its own stores and registry only.
    result = await core.delete("globex", doc_ids=["d1", "a-only"])
    assert (result.matched, result.deleted) == (1, 1)
    assert sinks.deleted == [("globex", ["d1", "a-only"])]
    assert sorted(store.registry_ids("acme")) == ["a-only", "d1"]


SAMPLE = Path(__file__).resolve().parents[2] / "services/attest/demo/sample_corpus.jsonl"


@pytest.mark.timeout(900)
async def test_doctor_moves_documents_an_older_release_left_under_default(tmp_path: Path):
    """Before tenants reached the stores, an authenticated `serve all --embedded`
    wrote every tenant's documents under ``default``; `attest doctor --repair`
    puts them back under their own tenant from the stored sources."""
    lines = SAMPLE.read_bytes().splitlines()[:4]
    assembly = await assemble(IngestSettings(data_dir=tmp_path), startup_check=False)
    try:
        core, inline = assembly.core, assembly.inline
        assert inline is not None
        core.ingest(
            "acme", [Item(f"s:{n}", article_from_raw_json(line)) for n, line in enumerate(lines)]
        )
        await inline.drain()
        sinks = core.sinks
        assert isinstance(sinks, LocalSinks)
        ids = sorted(core.store.registry_ids("acme"))
        # What the older release left: the records under default, none under acme.
        records = inline.runner.rebuild("acme", core.store.sources("acme", ids))
        await sinks.index("default", records)
        await sinks.delete("acme", ids)

        found = {f.tenant: f for f in await doctor.check(core.store, core.sinks)}
        assert set(found) == {"acme", "default"}
        assert found["acme"].stores[0].missing == ids
        assert found["default"].stores[0].orphans == ids
        for findings in found.values():
            await doctor.repair(core.store, core.sinks, inline.runner, findings)
        after = {f.tenant: f for f in await doctor.check(core.store, core.sinks)}
        assert set(after) == {"acme"}  # nothing left under default
        assert after["acme"].consistent, after["acme"].lines()
        assert (await sinks.lexical.stats("acme")).documents == len(ids)
        assert (await sinks.semantic.stats("default")).documents == 0
    finally:
        await assembly.close()


def test_the_kg_article_table_is_per_tenant():
    from attest.knowledge.graph import load_graph
    from attest.semantic.kg_scoring import Article, KgScorer
    from tests.unit.test_kg_scoring import ToyEncoder, unit

    graph = load_graph()
    scorer = KgScorer(graph, ToyEncoder(), top_n=3)
    rng = np.random.default_rng(16)
    entities = [e for e in graph.entities if graph.entity(e).level.name == "LOWER"][:2]
    headline = unit(rng)
    # The same id in both tenants, linked to different entities.
    scorer.upsert("acme", [Article("d1", (entities[0],), headline)])
    scorer.upsert("globex", [Article("d1", (entities[1],), headline), Article("d2", (), unit(rng))])
    assert (scorer.count("acme"), scorer.count("globex")) == ((1, 1), (2, 1))
    for tenant, (mine, theirs) in (("acme", entities), ("globex", entities[::-1])):
        explained = scorer.explain(tenant, "d1", headline)
        assert explained is not None
        nodes = {n.node_id for path in explained[2] for n in path}
        assert (mine in nodes, theirs in nodes) == (True, False), tenant
    assert scorer.explain("acme", "d2", headline) is None
    assert [s.doc_id for s in scorer.score("acme", headline, top_k=5)] == ["d1"]
    scorer.delete("acme", ["d1"])
    assert scorer.score("acme", headline) == []
    assert scorer.explain("globex", "d1", headline) is not None
    assert scorer.count("globex") == (2, 1)
