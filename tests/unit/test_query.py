"""The mapping and queries shared by the OpenSearch and Elasticsearch backends."""

from __future__ import annotations

from datetime import UTC, datetime

from attest.lexical import query as q
from attest.lexical.models import DocumentIn, Filters, Level, PassageIn, SearchQuery


def test_index_definition_pins_bm25_and_english_analysis():
    definition = q.index_definition(number_of_shards=1)
    assert definition["settings"]["index"]["similarity"]["default"] == {
        "type": "BM25",
        "k1": 1.2,
        "b": 0.75,
    }
    props = definition["mappings"]["properties"]
    assert props["title"]["analyzer"] == "english"
    assert props["text"]["analyzer"] == "english"
    assert props["tenant"]["type"] == "keyword"
    assert definition["mappings"]["dynamic"] == "strict"


def test_every_search_is_restricted_to_the_tenant():
    body = q.search_body("acme", SearchQuery(text="water", top_k=5))
    filters = body["query"]["bool"]["filter"]
    assert {"term": {"tenant": "acme"}} in filters
    assert body["size"] == 5
    match = body["query"]["bool"]["must"][0]["multi_match"]
    assert match["fields"] == ["title", "text"]
    assert match["type"] == "best_fields"
    assert match["tie_breaker"] == q.TIE_BREAKER
    assert "highlight" not in body


def test_filters_and_highlight_are_translated():
    query = SearchQuery(
        text="emissions",
        top_k=3,
        highlight=True,
        filters=Filters(
            keywords={"organizations": ("Norvale",), "entity_ids": ("gri-305",)},
            published_from=datetime(2025, 1, 1, tzinfo=UTC),
        ),
    )
    body = q.search_body("default", query)
    filters = body["query"]["bool"]["filter"]
    assert {"terms": {"organizations": ["Norvale"]}} in filters
    assert {"terms": {"entity_ids": ["gri-305"]}} in filters
    assert {"range": {"published_at": {"gte": "2025-01-01T00:00:00+00:00"}}} in filters
    assert body["highlight"]["pre_tags"] == ["<em>"]
    assert q.count_body("t") == {"query": {"bool": {"filter": [{"term": {"tenant": "t"}}]}}}


def test_records_are_keyed_by_tenant_and_document():
    doc = DocumentIn(
        id="n1",
        title="Title",
        body="Body.",
        passages=(PassageIn(0, "one"), PassageIn(1, "two")),
        metadata={"lang": "en"},
    )
    records = q.records("acme", doc)
    assert [(level, rid) for level, rid, _ in records] == [
        (Level.DOCUMENT, "acme/n1"),
        (Level.PASSAGE, "acme/n1#0"),
        (Level.PASSAGE, "acme/n1#1"),
    ]
    assert all(src["tenant"] == "acme" for _, _, src in records)
    assert records[0][2]["passage_count"] == 2
    assert records[0][2]["metadata"] == {"lang": "en"}


def test_bulk_deletes_passages_a_document_lost():
    doc = DocumentIn(id="n1", title="T", body="B", passages=(PassageIn(0, "only"),))
    actions = list(q.bulk_actions("idx", "t", [doc], old_counts={"n1": 3}))
    ops = [(a["_op_type"], a["_index"], a["_id"]) for a in actions]
    assert ops == [
        ("index", "idx-documents", "t/n1"),
        ("index", "idx-passages", "t/n1#0"),
        ("delete", "idx-passages", "t/n1#1"),
        ("delete", "idx-passages", "t/n1#2"),
    ]


def test_hits_are_parsed_with_highlights():
    response = {
        "hits": {
            "hits": [
                {
                    "_score": 3.5,
                    "_source": {
                        "doc_id": "n1",
                        "passage_index": 2,
                        "title": "T",
                        "text": "water",
                        "organizations": ["A"],
                        "published_at": "2025-03-01T00:00:00+00:00",
                    },
                    "highlight": {"text": ["<em>water</em>"]},
                }
            ]
        }
    }
    (hit,) = q.hits_from_response(response)
    assert hit.doc_id == "n1"
    assert hit.passage_index == 2
    assert hit.score == 3.5
    assert hit.highlights == ("<em>water</em>",)
    assert hit.published_at == datetime(2025, 3, 1, tzinfo=UTC)
