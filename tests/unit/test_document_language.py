"""A document's language (Document.language, an ISO 639-1 code) end to end: checked
where it arrives, stored by ingest, the BM25 index and the vector store, a filter
of every retriever, and returned with hits and sources.

The field is one entry of attest.core.document.KEYWORD_FIELDS: nothing else
names it (the OpenSearch backend is covered by tests/integration/test_document_language.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from attest.common.v1 import common_pb2
from attest.core import cache
from attest.core.channels import create_channel
from attest.core.common import Filters, filters_from_proto
from attest.core.document import keywords_from_message, keywords_to_message, merge_keywords
from attest.core.errors import InvalidArgument
from attest.core.server import running
from attest.core.settings import ServerSettings
from attest.ingest.assembly import assemble
from attest.ingest.convert import item_from_proto
from attest.ingest.documents import (
    Article,
    FailureCode,
    ItemError,
    article_from_raw_json,
    content_hash,
)
from attest.ingest.jobs import _matches
from attest.ingest.settings import IngestLimits, IngestSettings
from attest.ingest.sinks import LocalSinks, _document_proto
from attest.ingest.state import RegistryEntry
from attest.ingest.v1 import ingest_pb2
from attest.knowledge.graph import load_graph
from attest.lexical.models import SearchQuery
from attest.lexical.v1 import lexical_pb2
from attest.semantic.index import SemanticIndex
from attest.semantic.models import SemanticQuery
from attest.semantic.servicer import SemanticServicer
from attest.semantic.settings import SemanticSettings
from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc
from tests.conftest import LexicalHarness, lexical_settings, start_lexical
from tests.unit.test_semantic_restart import HashEmbedder

DOCS = [
    ("w-en", "Water use falls at the plant", "The plant cut its water use by a tenth.", "en"),
    ("w-de", "Wasserverbrauch sinkt", "Water use at the plant fell; das Werk spart Wasser.", "de"),
    ("w-de2", "Emissionen steigen", "Emissions and water use rose at the smelter.", "DE"),
    ("w-none", "Water report", "A report on water use and emissions.", ""),
]


def document(doc_id: str, title: str, body: str, language: str) -> common_pb2.Document:
    return common_pb2.Document(
        id=doc_id,
        title=title,
        body=body,
        language=language,
        organizations=["Acme"],
        passages=[common_pb2.Passage(doc_id=doc_id, index=0, text=body)],
    )


def language_filter(*codes: str) -> common_pb2.Filter:
    return common_pb2.Filter(field="language", any_of=codes)


# -- checked where it arrives ---------------------------------------------------------


def test_a_language_filter_is_checked_and_lower_cased():
    filters = filters_from_proto(
        [language_filter("DE", "en"), language_filter("de")], max_filters=8, max_values=8
    )
    assert filters.keywords == {"language": ("de",)}
    with pytest.raises(InvalidArgument) as err:
        filters_from_proto([language_filter("de", "german")], max_filters=8, max_values=8)
    assert err.value.field == "filters[0].any_of"
    assert "ISO 639-1" in err.value.details


def test_ingest_stores_the_language_and_refuses_a_bad_code_per_item():
    article = article_from_raw_json(b'{"id": "a1", "body": "Text.", "language": " DE "}')
    assert article.keywords["language"] == ("de",)
    assert Article.from_json(json.loads(json.dumps(article.to_json()))) == article
    with pytest.raises(ItemError) as err:
        article_from_raw_json(b'{"id": "a2", "body": "Text.", "language": "deu"}')
    assert (err.value.code, err.value.doc_id) == (FailureCode.INVALID_FIELD, "a2")
    assert err.value.reason.startswith("language: 'deu' is not an ISO 639-1 language code")
    with pytest.raises(ItemError):
        article_from_raw_json(b'{"id": "a3", "body": "Text.", "language": ["de"]}')
    item = item_from_proto(
        ingest_pb2.IngestItem(document=common_pb2.Document(id="a4", body="x", language="xx")),
        "items[0]",
        IngestLimits(),
    )
    assert item.error is not None
    assert item.error.code is FailureCode.INVALID_FIELD
    good = item_from_proto(
        ingest_pb2.IngestItem(document=common_pb2.Document(id="a5", body="x", language="fr")),
        "items[1]",
        IngestLimits(),
    )
    assert good.article is not None
    assert good.article.keywords["language"] == ("fr",)
    # The record sent to the stores carries it next to the enriched organizations.
    record = {"article": good.article.to_json(), "hash": "h", "passages": [], "organizations": []}
    sent = _document_proto(record)
    assert (sent.language, list(sent.organizations)) == ("fr", [])


def test_content_hashes_of_documents_without_a_language_are_unchanged():
    # The canonical form hashed before the keyword fields were declared in one place.
    article = Article(
        id="d",
        title="T",
        body="B",
        keywords={"organizations": ("Acme",), "entity_ids": ("gri-303",)},
        metadata={"k": "v"},
    )
    canonical = json.dumps(
        ["T", "B", None, "", ["Acme"], ["gri-303"], [["k", "v"]]],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    old = hashlib.sha256(canonical.encode() + b"\x1f").hexdigest()[:32]
    assert content_hash(article) == old
    german = dataclasses.replace(article, keywords={**article.keywords, "language": ("de",)})
    assert content_hash(german) != old


def test_the_registry_keeps_the_language_for_deletes_by_filter():
    entry = RegistryEntry("h", 1, {"organizations": ("Acme",), "language": ("de",)}, None)
    again = RegistryEntry.from_json(entry.to_json())
    assert again == entry
    # An entry written before the language existed still reads.
    assert RegistryEntry.from_json('["h", 1, ["Acme"], [], null]').keywords == {
        "organizations": ("Acme",)
    }
    german = filters_from_proto([language_filter("de")], max_filters=8, max_values=8)
    french = filters_from_proto([language_filter("fr")], max_filters=8, max_values=8)
    assert _matches("a1", again, german)
    assert not _matches("a1", again, french)
    named = filters_from_proto(
        [common_pb2.Filter(field="doc_id", any_of=["a1", "a2"]), language_filter("de")],
        max_filters=8,
        max_values=8,
    )
    assert _matches("a2", again, named)
    assert not _matches("a3", again, named)


# -- BM25 (tantivy; OpenSearch in the integration tier) --------------------------------------


@pytest_asyncio.fixture
async def tantivy(tmp_path: Path) -> AsyncIterator[LexicalHarness]:
    async for harness in start_lexical(lexical_settings("tantivy", tmp_path)):
        yield harness


async def check_lexical(lexical: LexicalHarness) -> None:
    stub = lexical.stub
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Index(
            lexical_pb2.IndexRequest(documents=[document("bad", "T", "Body", "english")])
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "documents[0].language" in (err.value.details() or "")
    await stub.Index(lexical_pb2.IndexRequest(documents=[document(*d) for d in DOCS], refresh=True))
    for level in (lexical_pb2.SEARCH_LEVEL_DOCUMENT, lexical_pb2.SEARCH_LEVEL_PASSAGE):

        async def search(
            *filters: common_pb2.Filter, level: lexical_pb2.SearchLevel.ValueType = level
        ) -> list[tuple[str, str]]:
            response = await stub.Search(
                lexical_pb2.SearchRequest(query="water use", top_k=10, level=level, filters=filters)
            )
            return sorted((h.doc_id, h.language) for h in response.hits)

        assert await search() == [("w-de", "de"), ("w-de2", "de"), ("w-en", "en"), ("w-none", "")]
        assert await search(language_filter("de")) == [("w-de", "de"), ("w-de2", "de")]
        assert await search(language_filter("EN", "fr")) == [("w-en", "en")]
        assert await search(language_filter("fr")) == []
        # ANDed with the other filters.
        acme = common_pb2.Filter(field="organization", any_of=["acme"])
        assert await search(acme, language_filter("en")) == [("w-en", "en")]


async def test_bm25_stores_filters_and_returns_the_language(tantivy: LexicalHarness):
    await check_lexical(tantivy)


# -- vectors (embedded Qdrant edge) and KG scoring -----------------------------------------


@pytest_asyncio.fixture
async def semantic(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[semantic_pb2_grpc.SemanticServiceStub]:
    monkeypatch.setenv("ATTEST_CACHE_DIR", str(tmp_path / "cache"))
    cache.forget_shared()
    settings = SemanticSettings(
        data_dir=tmp_path / "data", store="edge", server=ServerSettings(host="127.0.0.1", port=0)
    )
    index = SemanticIndex(settings, embedder=HashEmbedder(), graph=load_graph())  # type: ignore[arg-type]
    async with running([SemanticServicer(settings, index)], settings.server) as server:
        channel = create_channel(f"127.0.0.1:{server.port}")
        try:
            yield semantic_pb2_grpc.SemanticServiceStub(channel)
        finally:
            await channel.close()


async def test_vectors_store_filter_and_return_the_language(
    semantic: semantic_pb2_grpc.SemanticServiceStub,
):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await semantic.Index(
            semantic_pb2.IndexRequest(
                documents=[semantic_pb2.IndexDocument(document=document("bad", "T", "B", "zz"))]
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "documents[0].document.language" in (err.value.details() or "")
    await semantic.Index(
        semantic_pb2.IndexRequest(
            documents=[semantic_pb2.IndexDocument(document=document(*d)) for d in DOCS]
        )
    )
    searches = [
        (semantic_pb2.SEARCH_MODE_DENSE, semantic_pb2.SEARCH_LEVEL_DOCUMENT),
        (semantic_pb2.SEARCH_MODE_DENSE, semantic_pb2.SEARCH_LEVEL_PASSAGE),
        (semantic_pb2.SEARCH_MODE_KG, semantic_pb2.SEARCH_LEVEL_DOCUMENT),
        (semantic_pb2.SEARCH_MODE_FUSED, semantic_pb2.SEARCH_LEVEL_DOCUMENT),
    ]
    for mode, level in searches:

        async def search(
            *filters: common_pb2.Filter,
            mode: semantic_pb2.SearchMode.ValueType = mode,
            level: semantic_pb2.SearchLevel.ValueType = level,
        ) -> list[tuple[str, str]]:
            response = await semantic.Search(
                semantic_pb2.SearchRequest(
                    query="water use", top_k=10, mode=mode, level=level, filters=filters
                ),
                timeout=120,  # the first KG search waits for torch
            )
            return sorted((h.doc_id, h.language) for h in response.hits)

        where = semantic_pb2.SearchMode.Name(mode), semantic_pb2.SearchLevel.Name(level)
        everything = await search()
        assert everything == [
            ("w-de", "de"),
            ("w-de2", "de"),
            ("w-en", "en"),
            ("w-none", ""),
        ], where
        assert await search(language_filter("de")) == [("w-de", "de"), ("w-de2", "de")], where
        assert await search(language_filter("en")) == [("w-en", "en")], where
        assert await search(language_filter("fr")) == [], where


# -- sources ------------------------------------------------------------------------------


def test_a_source_gets_the_language_of_the_hits_that_found_it():
    """What a retriever's hit says of a document reaches the answer's source through
    the generic helpers, field by field, the first hit that knows a field winning."""
    kg_hit = semantic_pb2.Hit(doc_id="w-de", organizations=["Acme"])
    bm25_hit = lexical_pb2.Hit(doc_id="w-de", language="de", organizations=["ACME"])
    known: dict[str, tuple[str, ...]] = {}
    for hit in (kg_hit, bm25_hit):
        merge_keywords(known, keywords_from_message(hit))
    assert known == {"organizations": ("Acme",), "language": ("de",)}
    source = common_pb2.Source(doc_id="w-de", passage_index=-1, text="x")
    keywords_to_message(known, source)
    assert source.language == "de"  # Source has no organizations field: left out


# -- the whole ingestion, embedded ----------------------------------------------------------


@pytest.mark.timeout(900)
async def test_ingestion_stores_the_language_in_both_stores(tmp_path: Path):
    lines = [
        {"id": "n-de", "title": "Wasser", "body": "Water use at the plant fell.", "language": "de"},
        {"id": "n-en", "title": "Water", "body": "Water use at the mill fell.", "language": "en"},
        {"id": "n-bad", "title": "Water", "body": "Water use rose.", "language": "Deutsch"},
    ]
    # As the Ingest RPC receives them: a bad item fails alone.
    items = [
        item_from_proto(
            ingest_pb2.IngestItem(raw_json=json.dumps(line).encode(), origin=f"news.jsonl:{i}"),
            f"items[{i}]",
            IngestLimits(),
        )
        for i, line in enumerate(lines)
    ]
    assembly = await assemble(IngestSettings(data_dir=tmp_path))
    try:
        snapshot = assembly.core.ingest("default", items)
        assert assembly.inline is not None
        await assembly.inline.drain()
        job = assembly.core.job("default", snapshot.job_id, failures_limit=10)
        assert [(f.doc_id, f.code, f.reason[:9]) for f in job.failures] == [
            ("n-bad", "INVALID_FIELD", "language:")
        ]
        sinks = assembly.core.sinks
        assert isinstance(sinks, LocalSinks)
        german = Filters(keywords={"language": ("de",)})
        bm25 = await sinks.lexical.search(
            "default", SearchQuery(text="water use", top_k=10, filters=german)
        )
        assert [(h.doc_id, h.keywords.get("language")) for h in bm25] == [("n-de", ("de",))]
        dense = await sinks.semantic.search(
            "default", SemanticQuery(text="water use", top_k=10, filters=german)
        )
        assert [(h.doc_id, h.keywords.get("language")) for h in dense] == [("n-de", ("de",))]
        # The registry knows it too: a delete by language takes the German one only.
        result = await assembly.core.delete("default", filters=german)
        assert (result.matched, result.deleted, list(result.doc_ids)) == (1, 1, ["n-de"])
    finally:
        await assembly.close()
