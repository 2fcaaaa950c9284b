"""A passage keeps its page from the enrich record to every store and back.

The enrich record's passages gain their page (``[index, text, start, end,
page]``); a record queued by an earlier release (four fields) still loads, on
page 0. The stores keep the page and their hits return it: tantivy, the
OpenSearch/Elasticsearch code path (over the in-memory engine of
test_tenant_stores; tests/integration/test_lexical_api.py runs it on a real
OpenSearch node) and the vector store; a record written before pages were
kept answers page 0. No sockets.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attest.core import cache
from attest.ingest.documents import article_from_raw_json
from attest.ingest.passages import PassageSpan
from attest.ingest.settings import EnrichSettings
from attest.ingest.sinks import LocalSinks, _document_proto
from attest.ingest.stages import Enricher, encode_vector, record_passages
from attest.knowledge.graph import load_graph
from attest.lexical import query as q
from attest.lexical.backends.tantivy import TantivyBackend
from attest.lexical.models import DocumentIn, Level, PassageIn, SearchQuery
from attest.lexical.settings import LexicalSettings
from attest.semantic import models as sm
from attest.semantic.index import SemanticIndex
from attest.semantic.settings import SemanticSettings
from attest.semantic.store import Point
from tests.unit.test_semantic_restart import HashEmbedder
from tests.unit.test_tenant_stores import MemoryEngine

# A three-page report as the PDF reader writes it: page 2 is empty (a chart).
REPORT = (
    "Kestrel Mining Annual Report. Water use fell by a fifth.\f"
    "\f"
    "Kestrel cut scope 1 emissions by 12% at Ridge. The board approved the plan."
)


def enriched() -> dict[str, Any]:
    article = article_from_raw_json(
        json.dumps({"id": "report", "title": "Annual report", "body": REPORT}).encode()
    )
    record = Enricher(EnrichSettings()).enrich(0, "created", "h", article)
    # Records travel as Celery task arguments: JSON.
    loaded: dict[str, Any] = json.loads(json.dumps(record))
    return loaded


def test_enrich_records_keep_pages_and_records_of_earlier_releases_still_load() -> None:
    record = enriched()
    body = record["article"]["body"]
    assert all(len(row) == 5 for row in record["passages"])
    passages = record_passages(record)
    # One passage a page (each is under the 200 tokens); the empty page has none.
    assert [(p.index, p.page) for p in passages] == [(0, 1), (1, 3)]
    assert all(body[p.start_char : p.end_char] == p.text for p in passages)
    assert passages[1].text.startswith("Kestrel cut scope 1 emissions")
    # A record enriched before pages were kept (a task still queued in Redis).
    earlier = {**record, "passages": [row[:4] for row in record["passages"]]}
    assert record_passages(earlier) == [
        PassageSpan(p.index, p.text, p.start_char, p.end_char, 0) for p in passages
    ]
    # What the gRPC sinks send to the lexical and semantic services.
    sent = _document_proto(record)
    assert [(p.index, p.page, p.start_char) for p in sent.passages] == [
        (p.index, p.page, p.start_char) for p in passages
    ]
    assert {p.page for p in _document_proto(earlier).passages} == {0}


class _Capture:
    def __init__(self) -> None:
        self.documents: list[Any] = []

    async def index(self, tenant: str, documents: Sequence[Any], **_: Any) -> None:
        self.documents.extend(documents)


async def test_local_sinks_hand_each_store_the_pages() -> None:
    record = enriched()
    vector = encode_vector(np.ones(4, dtype=np.float32))
    n = len(record["passages"])
    embedded = {**record, "article_vector": vector, "passage_vectors": [vector] * n}
    earlier = {
        **embedded,
        "article": {**record["article"], "id": "old"},
        "passages": [row[:4] for row in record["passages"]],
    }
    lexical, semantic = _Capture(), _Capture()
    sinks = LocalSinks(lexical, semantic)  # type: ignore[arg-type]
    await sinks.index("t", [embedded, earlier])
    for store in (lexical, semantic):
        new, old = store.documents
        assert [p.page for p in new.passages] == [1, 3]
        assert [p.page for p in old.passages] == [0] * n


PAGED = DocumentIn(
    id="report",
    title="Annual report",
    body=REPORT,
    passages=(
        PassageIn(0, "Kestrel water use fell by a fifth.", page=1),
        PassageIn(1, "Kestrel cut scope 1 emissions by 12% at Ridge.", page=3),
    ),
)
UNPAGED = DocumentIn(
    id="wire",
    title="Kestrel wire",
    body="Kestrel shares rose.",
    passages=(PassageIn(0, "Kestrel shares rose."),),
)
KESTREL = SearchQuery(text="kestrel", top_k=10, level=Level.PASSAGE)


async def test_tantivy_stores_and_returns_pages(tmp_path: Path) -> None:
    backend = TantivyBackend(LexicalSettings(data_dir=tmp_path, index_name="unit"))
    await backend.warm_up()
    try:
        await backend.index("t", [PAGED, UNPAGED], refresh=True)
        hits = await backend.search("t", KESTREL)
        assert sorted((h.doc_id, h.passage_index, h.page) for h in hits) == [
            ("report", 0, 1),
            ("report", 1, 3),
            ("wire", 0, 0),
        ]
        documents = await backend.search("t", SearchQuery(text="kestrel", top_k=10))
        assert {h.page for h in documents} == {0}
    finally:
        await backend.close()


class _MappedEngine(MemoryEngine):
    """The in-memory engine, recording the mappings put on existing indexes."""

    def __init__(self, settings: LexicalSettings) -> None:
        super().__init__(settings)
        self.mapped: dict[str, dict[str, Any]] = {}

    async def _put_mapping(self, index: str, properties: dict[str, Any]) -> None:
        self.mapped[index] = properties


async def test_the_engine_backends_store_and_return_pages(tmp_path: Path) -> None:
    settings = LexicalSettings(data_dir=tmp_path, index_name="unit")
    backend = _MappedEngine(settings)
    # Indexes made before pages were kept: at start they gain the field
    # (their mapping is strict, so a record with a page would be refused).
    backend.indexes = {"unit-documents": {}, "unit-passages": {}}
    await backend.warm_up()
    for name in ("unit-documents", "unit-passages"):
        assert backend.mapped[name]["page"] == {"type": "integer", "index": False}
    assert q.index_definition(1)["mappings"]["properties"]["page"] == {
        "type": "integer",
        "index": False,
    }
    await backend.index("t", [PAGED, UNPAGED], refresh=True)
    passages = backend.indexes["unit-passages"]
    assert passages["t/report#1"]["page"] == 3
    assert "page" not in backend.indexes["unit-documents"]["t/report"]
    # A passage record written before pages were kept has no page: 0.
    del passages["t/report#0"]["page"]
    hits = await backend.search("t", KESTREL)
    assert sorted((h.doc_id, h.passage_index, h.page) for h in hits) == [
        ("report", 0, 0),
        ("report", 1, 3),
        ("wire", 0, 0),
    ]
    assert "page" in q.search_body("t", KESTREL)["_source"]


async def test_the_vector_store_keeps_pages_and_older_points_answer_page_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATTEST_CACHE_DIR", str(tmp_path / "cache"))
    cache.forget_shared()
    settings = SemanticSettings(data_dir=tmp_path / "data", store="edge")
    index = SemanticIndex(settings, embedder=HashEmbedder(), graph=load_graph())  # type: ignore[arg-type]
    await index.warm_up()
    try:
        await index.index(
            "t",
            [
                sm.SemanticDoc(
                    id=d.id,
                    title=d.title,
                    body=d.body,
                    passages=tuple(sm.PassageIn(p.index, p.text, page=p.page) for p in d.passages),
                )
                for d in (PAGED, UNPAGED)
            ],
        )
        # A passage point as an earlier release wrote it: no page in its payload.
        vector = HashEmbedder().encode(["Kestrel water use fell by a fifth."])[0]
        payload = {"title": "Old", "text": "Kestrel water use fell by a fifth.", "source_url": ""}
        await index.store.upsert("passages", "t", [Point("old", 0, vector, payload)])

        hits = await index.search(
            "t", sm.SemanticQuery(text="kestrel", top_k=10, level=sm.Level.PASSAGE)
        )
        assert sorted((h.doc_id, h.passage_index, h.page) for h in hits) == [
            ("old", 0, 0),
            ("report", 0, 1),
            ("report", 1, 3),
            ("wire", 0, 0),
        ]
        articles = await index.search("t", sm.SemanticQuery(text="kestrel", top_k=10))
        assert sorted((h.doc_id, h.page) for h in articles) == [("report", 0), ("wire", 0)]
    finally:
        await index.close()
