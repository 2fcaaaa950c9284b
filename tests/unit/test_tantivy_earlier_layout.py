"""A tantivy index of an earlier layout (one schema field per keyword field;
or ``keyword_terms`` but passages without ``page``) is rebuilt in the current
one when it is opened: same hits, filters and counts for every tenant at both
levels, passages on page 0, once, and whichever step a stop interrupted."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import tantivy

from attest.common.v1 import common_pb2
from attest.core.common import Filters
from attest.core.context import tenant_var
from attest.core.document import BY_NAME, keywords_to_stored
from attest.lexical.backends.tantivy import TantivyBackend, english_analyzer
from attest.lexical.models import DocumentIn, Hit, Level, PassageIn, SearchQuery
from attest.lexical.servicer import LexicalServicer
from attest.lexical.settings import LexicalSettings
from attest.lexical.v1 import lexical_pb2

WATER = DocumentIn(
    id="w1",
    title="Brightwater cuts water withdrawal",
    body="Brightwater Utilities reduced its water withdrawal by 12% in 2025.",
    keywords={"organizations": ("Brightwater Utilities",), "entity_ids": ("gri-303",)},
    published_at=datetime(2025, 3, 1, tzinfo=UTC),
    source_url="https://example.org/w1",
    metadata={"desk": "utilities"},
    passages=(
        PassageIn(0, "Brightwater Utilities reduced its water withdrawal by 12%."),
        PassageIn(1, "The utility also replaced old water mains."),
    ),
)
EMISSIONS = DocumentIn(
    id="e1",
    title="Norvale raises emissions target",
    body="Norvale Copper raised its 2030 emissions target; water use fell.",
    keywords={"organizations": ("Norvale Copper", "Norvale Group"), "entity_ids": ("gri-305",)},
    published_at=datetime(2026, 1, 22, tzinfo=UTC),
    passages=(PassageIn(0, "Norvale Copper raised its 2030 emissions target."),),
)
LABOUR = DocumentIn(
    id="l1",
    title="Audit finds child workers",
    body="Auditors found workers under 16 at a garment supplier; water was scarce on site.",
    keywords={"organizations": ("Halvorsen Textiles",)},
)
# The same id in another tenant, with other text: tenants must not mix.
OTHER_WATER = DocumentIn(
    id="w1",
    title="Riverside water permit",
    body="Riverside Mills applied for a water permit.",
    keywords={"organizations": ("Riverside Mills",), "entity_ids": ("gri-303",)},
    passages=(PassageIn(0, "Riverside Mills applied for a water permit."),),
)
TENANTS = {"acme": [WATER, EMISSIONS, LABOUR], "beta": [OTHER_WATER, EMISSIONS]}
QUERIES = ["water withdrawal", "emissions target", "water", "workers supplier", "permit mains"]


# The earlier layouts: one schema field per keyword field, then keyword_terms
# and keywords (the keyword fields as JSON) before passages kept their page.
KEYWORD_FIELDS_LAYOUT = "keyword-fields"
NO_PAGE_LAYOUT = "no-page"


def write_earlier_layout(
    data_dir: Path,
    name: str,
    tenants: dict[str, list[DocumentIn]],
    layout: str = KEYWORD_FIELDS_LAYOUT,
) -> None:
    """Writes the records the backend wrote in ``layout`` (its schema,
    analyzers and writes as they were), each tenant's documents twice so the
    index also holds deleted records."""
    if layout == NO_PAGE_LAYOUT:
        write_no_page_layout(data_dir, name, tenants)
        return
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("key", stored=False, tokenizer_name="raw", index_option="basic")
    sb.add_text_field("tenant", stored=False, tokenizer_name="raw", index_option="basic")
    sb.add_text_field("doc_id", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_integer_field("passage_index", stored=True, indexed=True)
    sb.add_integer_field("passage_count", stored=True)
    sb.add_text_field("title", stored=True, tokenizer_name="attest_en", index_option="position")
    sb.add_text_field("text", stored=True, tokenizer_name="attest_en", index_option="position")
    sb.add_text_field(
        "organizations", stored=True, tokenizer_name="attest_folded", index_option="basic"
    )
    sb.add_text_field("entity_ids", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_date_field("published_at", stored=True, indexed=True, fast=True)
    sb.add_text_field("source_url", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_text_field("metadata", stored=True, tokenizer_name="raw", index_option="basic")
    schema = sb.build()

    def folded() -> tantivy.TextAnalyzer:
        builder = tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.raw())
        return builder.filter(tantivy.Filter.lowercase()).build()

    writers = {}
    for level in ("documents", "passages"):
        path = data_dir / "lexical" / f"{name}-{level}"
        path.mkdir(parents=True)
        index = tantivy.Index(schema, path=str(path))
        index.register_tokenizer("attest_en", english_analyzer())
        index.register_tokenizer("attest_folded", folded())
        writers[level] = index.writer(15_000_000, 1)
    docs, passages = writers["documents"], writers["passages"]
    for _ in range(2):
        for tenant, documents in tenants.items():
            for doc in documents:
                key = f"{tenant}\x1f{doc.id}"
                shared: dict[str, Any] = {
                    "key": key,
                    "tenant": tenant,
                    "doc_id": doc.id,
                    "title": doc.title,
                    "organizations": list(doc.keywords.get("organizations", ())),
                    "entity_ids": list(doc.keywords.get("entity_ids", ())),
                    "source_url": doc.source_url,
                }
                _write_records(docs, passages, key, shared, doc)
            passages.commit()
            docs.commit()
    for writer in writers.values():
        writer.wait_merging_threads()


def write_no_page_layout(data_dir: Path, name: str, tenants: dict[str, list[DocumentIn]]) -> None:
    """The layout with keyword_terms, before passages kept their page."""
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("key", stored=False, tokenizer_name="raw", index_option="basic")
    sb.add_text_field("tenant", stored=False, tokenizer_name="raw", index_option="basic")
    sb.add_text_field("doc_id", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_integer_field("passage_index", stored=True, indexed=True)
    sb.add_integer_field("passage_count", stored=True)
    sb.add_text_field("title", stored=True, tokenizer_name="attest_en", index_option="position")
    sb.add_text_field("text", stored=True, tokenizer_name="attest_en", index_option="position")
    sb.add_text_field("keyword_terms", stored=False, tokenizer_name="raw", index_option="basic")
    sb.add_bytes_field("keywords", stored=True)
    sb.add_date_field("published_at", stored=True, indexed=True, fast=True)
    sb.add_text_field("source_url", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_text_field("metadata", stored=True, tokenizer_name="raw", index_option="basic")
    schema = sb.build()
    writers = {}
    for level in ("documents", "passages"):
        path = data_dir / "lexical" / f"{name}-{level}"
        path.mkdir(parents=True)
        index = tantivy.Index(schema, path=str(path))
        index.register_tokenizer("attest_en", english_analyzer())
        writers[level] = index.writer(15_000_000, 1)
    docs, passages = writers["documents"], writers["passages"]
    for _ in range(2):
        for tenant, documents in tenants.items():
            for doc in documents:
                key = f"{tenant}\x1f{doc.id}"
                shared: dict[str, Any] = {
                    "key": key,
                    "tenant": tenant,
                    "doc_id": doc.id,
                    "title": doc.title,
                    "keyword_terms": [
                        f"{n}\x1f{BY_NAME[n].key(v)}" for n, vs in doc.keywords.items() for v in vs
                    ],
                    "keywords": json.dumps(
                        keywords_to_stored(doc.keywords), sort_keys=True
                    ).encode(),
                    "source_url": doc.source_url,
                }
                _write_records(docs, passages, key, shared, doc)
            passages.commit()
            docs.commit()
    for writer in writers.values():
        writer.wait_merging_threads()


def settings(data_dir: Path) -> LexicalSettings:
    return LexicalSettings(data_dir=data_dir, index_name="unit")


@pytest.fixture
async def reference(tmp_path: Path):
    """The same documents indexed by the current code."""
    backend = TantivyBackend(settings(tmp_path / "reference"))
    await backend.warm_up()
    for tenant, documents in TENANTS.items():
        await backend.index(tenant, documents, refresh=True)
    yield backend
    await backend.close()


@pytest.fixture(params=[KEYWORD_FIELDS_LAYOUT, NO_PAGE_LAYOUT])
def earlier(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    data_dir = tmp_path / "data"
    write_earlier_layout(data_dir, "unit", TENANTS, request.param)
    return data_dir


def queries() -> Iterator[SearchQuery]:
    for text in QUERIES:
        for level in Level:
            yield SearchQuery(text=text, top_k=10, level=level, highlight=True)
    organizations = Filters(keywords={"organizations": ("norvale copper", "RIVERSIDE MILLS")})
    entities = Filters(keywords={"entity_ids": ("gri-303",)})
    dates = Filters(published_from=datetime(2026, 1, 1, tzinfo=UTC))
    for f in (organizations, entities, dates):
        for level in Level:
            yield SearchQuery(text="water emissions permit", top_k=10, level=level, filters=f)


def answers(hits: Sequence[Hit]) -> list[tuple[Any, ...]]:
    return [
        (
            h.doc_id,
            h.passage_index,
            round(h.score, 4),
            h.title,
            h.text,
            h.highlights,
            dict(h.keywords),
            h.published_at,
            h.source_url,
        )
        for h in hits
    ]


async def assert_same_as(backend: TantivyBackend, reference: TantivyBackend) -> None:
    for tenant in TENANTS:
        for query in queries():
            got = answers(await backend.search(tenant, query))
            assert got == answers(await reference.search(tenant, query)), (tenant, query)
        assert await backend.stats(tenant) == await reference.stats(tenant)
        assert await backend.document_ids(tenant) == await reference.document_ids(tenant)


def leftovers(data_dir: Path) -> list[str]:
    return sorted(p.name for p in (data_dir / "lexical").iterdir())


async def test_an_earlier_layout_is_rebuilt_with_the_same_answers_for_every_tenant(
    earlier, reference, caplog
):
    backend = TantivyBackend(settings(earlier))
    with caplog.at_level(logging.INFO, "attest.lexical.backends.tantivy"):
        await backend.warm_up()
    try:
        await assert_same_as(backend, reference)
        # Organizations match without regard to case, per tenant.
        by_org = SearchQuery(
            text="water emissions",
            top_k=10,
            filters=Filters(keywords={"organizations": ("norvale GROUP",)}),
        )
        assert [h.doc_id for h in await backend.search("acme", by_org)] == ["e1"]
        assert [h.doc_id for h in await backend.search("beta", by_org)] == ["e1"]
        # 5 documents (3 + 2) and 5 passages (3 + 2) each time, deleted records left out.
        assert caplog.text.count("rebuilding its 5 records (2 tenants)") == 2
        # Passages written before pages were kept are on page 0, unknown.
        water = SearchQuery(text="water", top_k=10, level=Level.PASSAGE)
        assert {h.page for h in await backend.search("acme", water)} == {0}
        # Writes go to the rebuilt index, and keep their pages.
        paged = DocumentIn(
            id="p1",
            title="Annual report",
            body="Kestrel water use fell.",
            passages=(PassageIn(0, "Kestrel water use fell.", page=60),),
        )
        await backend.index("beta", [LABOUR, paged], refresh=True)
        assert (await backend.stats("beta")).documents == 4
        kestrel = SearchQuery(text="kestrel", top_k=10, level=Level.PASSAGE)
        assert [(h.doc_id, h.page) for h in await backend.search("beta", kestrel)] == [("p1", 60)]
    finally:
        await backend.close()
    names = leftovers(earlier)
    assert names[0::2] == ["unit-documents", "unit-passages"]
    assert names[1].startswith("unit-documents.earlier-layout-")
    assert names[3].startswith("unit-passages.earlier-layout-")
    # Opened again, nothing is rebuilt and nothing is lost.
    again = TantivyBackend(settings(earlier))
    await again.warm_up()
    try:
        assert leftovers(earlier) == names
        assert (await again.stats("beta")).documents == 4
        assert (await again.stats("acme")).passages == 3
    finally:
        await again.close()


@pytest.mark.parametrize("failing_rename", [1, 2, 3])
async def test_a_rebuild_stopped_at_any_step_is_completed_by_the_next_start(
    earlier, reference, monkeypatch, failing_rename
):
    # Renames 1 and 2 swap the documents index (earlier one aside, rebuilt one
    # in), 3 moves the passages index aside: a stop before each.
    renames = 0
    real_rename = Path.rename

    def rename(self: Path, target):
        nonlocal renames
        renames += 1
        if renames == failing_rename:
            raise OSError("stopped")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    stopped = TantivyBackend(settings(earlier))
    with pytest.raises(OSError, match="stopped"):
        await stopped.warm_up()
    monkeypatch.setattr(Path, "rename", real_rename)
    assert any(n.endswith(".rebuilt") for n in leftovers(earlier))

    backend = TantivyBackend(settings(earlier))
    await backend.warm_up()
    try:
        await assert_same_as(backend, reference)
    finally:
        await backend.close()
    names = leftovers(earlier)
    assert [n for n in names if "." not in n] == ["unit-documents", "unit-passages"]
    assert len([n for n in names if ".earlier-layout-" in n]) == 2
    assert len(names) == 4


async def test_a_partial_rebuild_is_thrown_away_and_done_again(earlier, reference):
    partial = earlier / "lexical" / "unit-passages.rebuilding"
    partial.mkdir()
    (partial / "meta.json").write_text("{")
    backend = TantivyBackend(settings(earlier))
    await backend.warm_up()
    try:
        await assert_same_as(backend, reference)
    finally:
        await backend.close()
    assert not partial.exists()


async def test_the_lexical_service_opens_an_earlier_layout_and_answers_per_tenant(earlier):
    # The path `attest serve all --embedded` and `attest demo` take: the
    # servicer's warm-up opens the backend, which rebuilds the index.
    servicer = LexicalServicer(LexicalSettings(data_dir=earlier, index_name="unit"))
    await servicer.warm_up()
    try:

        async def search(
            tenant: str, organization: str, level: lexical_pb2.SearchLevel.ValueType
        ) -> list[tuple[str, int]]:
            token = tenant_var.set(tenant)
            try:
                request = lexical_pb2.SearchRequest(
                    query="water emissions",
                    top_k=10,
                    level=level,
                    filters=[common_pb2.Filter(field="organization", any_of=[organization])],
                )
                response = await servicer.Search(request, None)  # type: ignore[arg-type]
            finally:
                tenant_var.reset(token)
            return [(h.doc_id, h.passage_index) for h in response.hits]

        document, passage = lexical_pb2.SEARCH_LEVEL_DOCUMENT, lexical_pb2.SEARCH_LEVEL_PASSAGE
        assert await search("acme", "brightwater utilities", document) == [("w1", -1)]
        assert sorted(await search("acme", "BRIGHTWATER UTILITIES", passage)) == [
            ("w1", 0),
            ("w1", 1),
        ]
        assert await search("beta", "brightwater utilities", document) == []
        assert await search("beta", "riverside mills", passage) == [("w1", 0)]
        assert await search("gamma", "riverside mills", document) == []
    finally:
        await servicer.close()


def _write_records(docs: Any, passages: Any, key: str, shared: dict[str, Any], doc: Any) -> None:
    """A document's record and its passages' records, as both earlier layouts wrote them."""
    if doc.published_at is not None:
        shared["published_at"] = doc.published_at
    docs.delete_documents_by_term("key", key)
    passages.delete_documents_by_term("key", key)
    docs.add_document(
        tantivy.Document(
            **shared,
            passage_index=-1,
            passage_count=len(doc.passages),
            text=doc.body,
            metadata=json.dumps(doc.metadata, sort_keys=True),
        )
    )
    for p in doc.passages:
        passages.add_document(tantivy.Document(**shared, passage_index=p.index, text=p.text))
