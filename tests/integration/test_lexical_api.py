"""The lexical service through gRPC, on tantivy and on a real OpenSearch node."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from attest.common.v1 import common_pb2
from attest.lexical.v1 import lexical_pb2

pytestmark = pytest.mark.integration


def ts(iso: str) -> Timestamp:
    t = Timestamp()
    t.FromJsonString(iso)
    return t


DOCS = [
    common_pb2.Document(
        id="w1",
        title="Brightwater cuts water withdrawal",
        body="Brightwater Utilities reduced its water withdrawal by 12% in 2025 across Port Ellery.",
        organizations=["Brightwater Utilities"],
        entity_ids=["gri-303"],
        published_at=ts("2025-03-01T00:00:00Z"),
        source_url="https://news.example.com/w1",
        passages=[
            common_pb2.Passage(
                index=0, text="Brightwater Utilities reduced its water withdrawal by 12%."
            ),
            common_pb2.Passage(index=1, text="The utility also replaced old cast-iron mains."),
        ],
    ),
    common_pb2.Document(
        id="e1",
        title="Norvale raises emissions target",
        body="Norvale Copper raised its 2030 emissions target to 55% from 40%.",
        organizations=["Norvale Copper"],
        entity_ids=["gri-305"],
        published_at=ts("2026-01-22T00:00:00Z"),
    ),
    common_pb2.Document(
        id="l1",
        title="Audit finds child workers at supplier",
        body="Auditors found 14 workers under 16 at a garment supplier; water was scarce on site.",
        organizations=["Halvorsen Textiles"],
        entity_ids=["gri-408"],
        published_at=ts("2025-04-08T00:00:00Z"),
    ),
]


async def index_all(stub) -> lexical_pb2.IndexResponse:
    return await stub.Index(lexical_pb2.IndexRequest(documents=DOCS, refresh=True))


async def test_index_search_stats(lexical):
    stub = lexical.stub
    response = await index_all(stub)
    assert (response.documents, response.passages) == (3, 2)
    stats = await stub.Stats(lexical_pb2.StatsRequest())
    assert (stats.documents, stats.passages) == (3, 2)
    assert stats.backend == lexical.servicer.backend.name

    found = await stub.Search(lexical_pb2.SearchRequest(query="water withdrawal", top_k=10))
    assert found.backend == stats.backend
    assert [h.doc_id for h in found.hits] == ["w1", "l1"]
    top = found.hits[0]
    assert top.passage_index == -1
    assert top.score > found.hits[1].score > 0
    assert top.source_url == "https://news.example.com/w1"
    assert top.published_at.ToJsonString() == "2025-03-01T00:00:00Z"
    assert list(top.organizations) == ["Brightwater Utilities"]

    passages = await stub.Search(
        lexical_pb2.SearchRequest(
            query="cast-iron mains", top_k=5, level=lexical_pb2.SEARCH_LEVEL_PASSAGE
        )
    )
    assert [(h.doc_id, h.passage_index) for h in passages.hits] == [("w1", 1)]


async def test_filters_and_highlights(lexical):
    stub = lexical.stub
    await index_all(stub)

    async def ids(*filters: common_pb2.Filter) -> list[str]:
        r = await stub.Search(
            lexical_pb2.SearchRequest(query="water emissions workers", top_k=10, filters=filters)
        )
        return sorted(h.doc_id for h in r.hits)

    assert await ids(common_pb2.Filter(field="organization", any_of=["norvale copper"])) == ["e1"]
    assert await ids(common_pb2.Filter(field="entity", any_of=["gri-303", "gri-408"])) == [
        "l1",
        "w1",
    ]
    assert await ids(common_pb2.Filter(field="published_at", gte="2026-01-01")) == ["e1"]
    assert await ids(
        common_pb2.Filter(field="published_at", gte="2025-01-01", lte="2025-03-31T23:59:59Z"),
        common_pb2.Filter(field="entity", any_of=["gri-303", "gri-305"]),
    ) == ["w1"]
    # Named documents: exact ids, two filters keep the ids both name.
    assert await ids(common_pb2.Filter(field="doc_id", any_of=["e1", "l1", "nowhere"])) == [
        "e1",
        "l1",
    ]
    assert await ids(
        common_pb2.Filter(field="doc_id", any_of=["e1", "l1"]),
        common_pb2.Filter(field="doc_id", any_of=["l1", "w1"]),
    ) == ["l1"]
    assert (
        await ids(
            common_pb2.Filter(field="doc_id", any_of=["e1"]),
            common_pb2.Filter(field="doc_id", any_of=["w1"]),
        )
        == []
    )
    assert await ids(common_pb2.Filter(field="doc_id", any_of=["E1"])) == []
    passages = await stub.Search(
        lexical_pb2.SearchRequest(
            query="water emissions mains",
            top_k=10,
            level=lexical_pb2.SEARCH_LEVEL_PASSAGE,
            filters=[common_pb2.Filter(field="doc_id", any_of=["w1"])],
        )
    )
    assert {h.doc_id for h in passages.hits} == {"w1"}

    r = await stub.Search(
        lexical_pb2.SearchRequest(query="emissions target", top_k=1, highlight=True)
    )
    assert r.hits[0].doc_id == "e1"
    joined = " ".join(r.hits[0].highlights)
    assert "<em>emissions</em>" in joined
    assert "<em>target</em>" in joined


async def test_reindex_is_idempotent_and_delete_reaches_passages(lexical):
    stub = lexical.stub
    await index_all(stub)
    await index_all(stub)
    stats = await stub.Stats(lexical_pb2.StatsRequest())
    assert (stats.documents, stats.passages) == (3, 2)

    changed = common_pb2.Document(
        id="w1",
        title="Brightwater reports leakage",
        body="Brightwater now reports leakage of 18%.",
        passages=[common_pb2.Passage(index=0, text="Brightwater now reports leakage of 18%.")],
    )
    await stub.Index(lexical_pb2.IndexRequest(documents=[changed], refresh=True))
    stats = await stub.Stats(lexical_pb2.StatsRequest())
    assert (stats.documents, stats.passages) == (3, 1)
    gone = await stub.Search(
        lexical_pb2.SearchRequest(
            query="cast-iron mains", top_k=5, level=lexical_pb2.SEARCH_LEVEL_PASSAGE
        )
    )
    assert list(gone.hits) == []

    deleted = await stub.Delete(lexical_pb2.DeleteRequest(doc_ids=["w1", "e1", "never-indexed"]))
    assert deleted.deleted == 2
    stats = await stub.Stats(lexical_pb2.StatsRequest())
    assert (stats.documents, stats.passages) == (1, 0)
    again = await stub.Delete(lexical_pb2.DeleteRequest(doc_ids=["w1"]))
    assert again.deleted == 0


BAD_REQUESTS = [
    ("Search", lexical_pb2.SearchRequest(query="", top_k=5), "query"),
    ("Search", lexical_pb2.SearchRequest(query="q" * 10_000, top_k=5), "query"),
    ("Search", lexical_pb2.SearchRequest(query="water", top_k=0), "top_k"),
    ("Search", lexical_pb2.SearchRequest(query="water", top_k=5000), "top_k"),
    (
        "Search",
        lexical_pb2.SearchRequest(
            query="water", top_k=5, filters=[common_pb2.Filter(field="country", any_of=["NL"])]
        ),
        "filters[0].field",
    ),
    (
        "Search",
        lexical_pb2.SearchRequest(
            query="water",
            top_k=5,
            filters=[common_pb2.Filter(field="published_at", gte="yesterday")],
        ),
        "filters[0].gte",
    ),
    ("Search", lexical_pb2.SearchRequest(query="water", top_k=5, view=7), "view"),
    (
        "Search",
        lexical_pb2.SearchRequest(
            query="water", top_k=5, highlight=True, view=common_pb2.HIT_VIEW_IDS
        ),
        "highlight",
    ),
    ("Index", lexical_pb2.IndexRequest(), "documents"),
    (
        "Index",
        lexical_pb2.IndexRequest(documents=[common_pb2.Document(id="", body="x")]),
        "documents[0].id",
    ),
    (
        "Index",
        lexical_pb2.IndexRequest(
            documents=[
                common_pb2.Document(
                    id="p", body="x", passages=[common_pb2.Passage(index=0, text="x", page=-1)]
                )
            ]
        ),
        "documents[0].passages[0].page",
    ),
    ("Delete", lexical_pb2.DeleteRequest(), "doc_ids"),
]


# A report from a PDF (passages on pages 1 and 3; page 2 had no text) and a
# news story without pages.
PAGED = [
    common_pb2.Document(
        id="r1",
        title="Kestrel Mining annual report",
        body="Kestrel water use fell.\n\n\f\f\n\nKestrel cut emissions by 12%.",
        passages=[
            common_pb2.Passage(index=0, text="Kestrel water use fell.", start_char=0, page=1),
            common_pb2.Passage(
                index=1, text="Kestrel cut emissions by 12%.", start_char=29, page=3
            ),
        ],
    ),
    common_pb2.Document(
        id="n1",
        title="Kestrel shares",
        body="Kestrel shares rose.",
        passages=[common_pb2.Passage(index=0, text="Kestrel shares rose.")],
    ),
]


async def test_passage_hits_return_their_page(lexical):
    await lexical.stub.Index(lexical_pb2.IndexRequest(documents=PAGED, refresh=True))
    request = lexical_pb2.SearchRequest(
        query="kestrel", top_k=10, level=lexical_pb2.SEARCH_LEVEL_PASSAGE
    )
    found = await lexical.stub.Search(request)
    assert sorted((h.doc_id, h.passage_index, h.page) for h in found.hits) == [
        ("n1", 0, 0),
        ("r1", 0, 1),
        ("r1", 1, 3),
    ]
    # Document hits have no page, and the ids view carries none.
    documents = await lexical.stub.Search(lexical_pb2.SearchRequest(query="kestrel", top_k=10))
    assert {h.page for h in documents.hits} == {0}
    request.view = common_pb2.HIT_VIEW_IDS
    ids = await lexical.stub.Search(request)
    assert len(ids.hits) == 3
    assert {h.page for h in ids.hits} == {0}


async def test_an_opensearch_index_made_before_pages_gains_them(tmp_path):
    """Indexes created with the mapping before ``page`` (strict: a record with an
    unmapped field is refused) gain the field when the service starts; their
    passage records, written without a page, answer page 0."""
    from opensearchpy import AsyncOpenSearch

    from attest.lexical import query as q
    from attest.lexical.models import Level
    from tests.conftest import lexical_settings, start_lexical

    settings = lexical_settings("opensearch", tmp_path)
    client = AsyncOpenSearch(hosts=list(settings.opensearch.hosts))
    try:
        earlier = q.index_definition(1)
        del earlier["mappings"]["properties"]["page"]
        names = q.index_names(settings.index_name)
        for name in names.values():
            await client.indices.create(index=name, body=earlier)
        # A passage record as an earlier release wrote it: no page.
        await client.index(
            index=names[Level.PASSAGE],
            id=q.record_id("default", "old", 0),
            body={
                "tenant": "default",
                "doc_id": "old",
                "passage_index": 0,
                "title": "Old",
                "text": "Kestrel water use fell.",
            },
            refresh=True,
        )
    finally:
        await client.close()
    async for harness in start_lexical(settings):
        await harness.stub.Index(lexical_pb2.IndexRequest(documents=PAGED, refresh=True))
        found = await harness.stub.Search(
            lexical_pb2.SearchRequest(
                query="kestrel water", top_k=10, level=lexical_pb2.SEARCH_LEVEL_PASSAGE
            )
        )
        pages = {(h.doc_id, h.passage_index): h.page for h in found.hits}
        assert pages == {("old", 0): 0, ("r1", 0): 1, ("r1", 1): 3, ("n1", 0): 0}


@pytest.mark.parametrize(
    "level", [lexical_pb2.SEARCH_LEVEL_DOCUMENT, lexical_pb2.SEARCH_LEVEL_PASSAGE]
)
async def test_the_ids_view_ranks_the_same_and_carries_no_record(lexical, level):
    await index_all(lexical.stub)
    request = lexical_pb2.SearchRequest(query="water withdrawal mains", top_k=10, level=level)
    full = await lexical.stub.Search(request)
    request.view = common_pb2.HIT_VIEW_IDS
    ids = await lexical.stub.Search(request)
    assert len(full.hits) >= 2
    assert [(h.doc_id, h.passage_index, h.score) for h in ids.hits] == [
        (h.doc_id, h.passage_index, h.score) for h in full.hits
    ]
    # Passage hits name their passage: index 0 is kept, not taken for "absent".
    if level == lexical_pb2.SEARCH_LEVEL_PASSAGE:
        assert {h.passage_index for h in ids.hits} == {0, 1}
    assert any(h.text for h in full.hits)
    for hit in ids.hits:
        assert (hit.title, hit.text, hit.source_url) == ("", "", "")
        assert not hit.organizations
        assert not hit.entity_ids
        assert not hit.HasField("published_at")
    assert ids.ByteSize() < full.ByteSize() / 2


@pytest.mark.parametrize(("method", "request_", "field"), BAD_REQUESTS)
async def test_bad_input_is_invalid_argument_naming_the_field(lexical, method, request_, field):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await getattr(lexical.stub, method)(request_)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(f"{field}: ")


async def test_oversized_message_is_invalid_argument(tmp_path):
    from tests.conftest import lexical_settings, start_lexical

    settings = lexical_settings("tantivy", tmp_path, max_message_bytes=64 * 1024)
    async for harness in start_lexical(settings):
        big = common_pb2.Document(id="big", title="t", body="water " * 20_000)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await harness.stub.Index(lexical_pb2.IndexRequest(documents=[big]))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details().startswith("documents: request is ")
        assert "above the limit of 65,536 bytes" in info.value.details()
        # Past twice the limit gRPC itself refuses the message before any handler.
        huge = common_pb2.Document(id="huge", title="t", body="water " * 40_000)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await harness.stub.Index(lexical_pb2.IndexRequest(documents=[huge]))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
