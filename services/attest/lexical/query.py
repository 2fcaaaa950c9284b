"""Index mapping, record layout and queries shared by OpenSearch and Elasticsearch.

Both engines speak the same query DSL for everything used here, so their
adapters only differ in client calls and error types. The tantivy backend
mirrors the same layout and scoring (see backends/tantivy.py).

Layout: two indexes, ``<name>-documents`` with one record per document
(title + body) and ``<name>-passages`` with one record per passage (title +
passage text, and the passage's ``page``: a record written before pages were
kept has none, and reads as page 0). Separate indexes keep BM25's statistics (document frequency,
average length) exact at each level; mixed in one index, short passages would
shift the scores of whole documents. Every record carries the tenant and the
document's metadata, so filters apply at both levels without joins.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from attest.core.common import Filters
from attest.core.document import (
    KEYWORD_FIELDS,
    keywords_from_stored,
    keywords_to_stored,
)
from attest.lexical.models import (
    DocumentIn,
    DocumentPage,
    Hit,
    Level,
    SearchQuery,
    StoredDocument,
)

HIGHLIGHT_PRE = "<em>"
HIGHLIGHT_POST = "</em>"


def escape_html(text: str) -> str:
    """Text as HTML the way Lucene's highlight encoder writes it (``encoder: html``),
    so that tantivy's fragments match OpenSearch's and Elasticsearch's."""
    return html.escape(text, quote=True).replace("/", "&#x2F;")


# Lucene's BM25 with the parameters of the paper baselines, set explicitly so
# an engine default change cannot move our numbers.
BM25 = {"type": "BM25", "k1": 1.2, "b": 0.75}
# A document scores its best field plus this share of the other: on Cranfield
# and CISI this beats summing title and text (most_fields) by 0.00-0.01 nDCG@10.
TIE_BREAKER = 0.5

# What a hit in the ids-only view reads of each record.
ID_FIELDS = ["doc_id", "passage_index"]
SOURCE_FIELDS = [
    "doc_id",
    "passage_index",
    "title",
    "text",
    *(f.name for f in KEYWORD_FIELDS),
    "published_at",
    "source_url",
    "page",
]

# A passage's page is stored for its hits only: nothing searches or filters by it.
PAGE_MAPPING = {"page": {"type": "integer", "index": False}}


def keyword_mappings() -> dict[str, Any]:
    """The mapping of every keyword field (a folded one is matched without regard to case)."""
    return {
        f.name: {"type": "keyword", "normalizer": "folded"} if f.folded else {"type": "keyword"}
        for f in KEYWORD_FIELDS
    }


def added_mappings() -> dict[str, Any]:
    """The fields added to the layout since its first indexes, which an existing
    index gains at start (adding a field is allowed on a live index): the
    keyword fields and a passage's page."""
    return {**keyword_mappings(), **PAGE_MAPPING}


def index_definition(number_of_shards: int) -> dict[str, Any]:
    """Settings and mappings of a new index."""
    keyword = {"type": "keyword"}
    text = {"type": "text", "analyzer": "english"}
    return {
        "settings": {
            "index": {
                "number_of_shards": number_of_shards,
                "number_of_replicas": 0,
                "similarity": {"default": BM25},
            },
            "analysis": {"normalizer": {"folded": {"type": "custom", "filter": ["lowercase"]}}},
        },
        "mappings": {
            "dynamic": "strict",
            "properties": {
                "tenant": keyword,
                "doc_id": keyword,
                "passage_index": {"type": "integer"},
                "passage_count": {"type": "integer"},
                "title": text,
                "text": text,
                **keyword_mappings(),
                **PAGE_MAPPING,
                "published_at": {"type": "date"},
                "source_url": {"type": "keyword", "index": False},
                "metadata": {"type": "object", "enabled": False},
            },
        },
    }


def index_names(base: str) -> dict[Level, str]:
    return {Level.DOCUMENT: f"{base}-documents", Level.PASSAGE: f"{base}-passages"}


def record_id(tenant: str, doc_id: str, passage_index: int | None = None) -> str:
    """Deterministic record id, so that writing a record twice overwrites it."""
    base = f"{tenant}/{doc_id}"
    return base if passage_index is None else f"{base}#{passage_index}"


def _date(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def records(tenant: str, doc: DocumentIn) -> list[tuple[Level, str, dict[str, Any]]]:
    """(level, id, source) of the document record and of each passage record."""
    shared = {
        "tenant": tenant,
        "doc_id": doc.id,
        "title": doc.title,
        **keywords_to_stored(doc.keywords),
        "published_at": _date(doc.published_at),
        "source_url": doc.source_url,
    }
    out: list[tuple[Level, str, dict[str, Any]]] = [
        (
            Level.DOCUMENT,
            record_id(tenant, doc.id),
            {
                **shared,
                "passage_index": -1,
                "passage_count": len(doc.passages),
                "text": doc.body,
                "metadata": dict(doc.metadata),
            },
        )
    ]
    for p in doc.passages:
        out.append(
            (
                Level.PASSAGE,
                record_id(tenant, doc.id, p.index),
                {**shared, "passage_index": p.index, "text": p.text, "page": p.page},
            )
        )
    return out


def stale_passage_ids(tenant: str, doc_id: str, old_count: int, new_count: int) -> list[str]:
    """Ids of passages a document had before and no longer has."""
    return [record_id(tenant, doc_id, i) for i in range(new_count, old_count)]


def filter_clauses(tenant: str, filters: Filters) -> list[dict[str, Any]]:
    clauses: list[dict[str, Any]] = [{"term": {"tenant": tenant}}]
    for name, values in filters.keywords.items():
        if values:
            clauses.append({"terms": {name: list(values)}})
    if filters.doc_ids:
        clauses.append({"terms": {"doc_id": list(filters.doc_ids)}})
    if filters.published_from or filters.published_to:
        bounds = {}
        if filters.published_from:
            bounds["gte"] = _date(filters.published_from)
        if filters.published_to:
            bounds["lte"] = _date(filters.published_to)
        clauses.append({"range": {"published_at": bounds}})
    return clauses


def search_body(tenant: str, query: SearchQuery) -> dict[str, Any]:
    """The search request: BM25 over title and text (best field + tie breaker), filtered."""
    body: dict[str, Any] = {
        "size": query.top_k,
        "track_total_hits": False,
        "_source": ID_FIELDS if query.ids_only else SOURCE_FIELDS,
        "query": {
            "bool": {
                "must": [
                    {
                        "multi_match": {
                            "query": query.text,
                            "fields": ["title", "text"],
                            "type": "best_fields",
                            "tie_breaker": TIE_BREAKER,
                        }
                    }
                ],
                "filter": filter_clauses(tenant, query.filters),
            }
        },
    }
    if query.highlight:
        body["highlight"] = {
            # The engine escapes the fragment's text as HTML, then adds the tags:
            # markup in a document comes back as text, never cut inside an entity.
            "encoder": "html",
            "pre_tags": [HIGHLIGHT_PRE],
            "post_tags": [HIGHLIGHT_POST],
            "fields": {
                "title": {"number_of_fragments": 0},
                "text": {"fragment_size": 160, "number_of_fragments": 3},
            },
        }
    return body


def count_body(tenant: str) -> dict[str, Any]:
    return {"query": {"bool": {"filter": filter_clauses(tenant, Filters())}}}


def list_body(tenant: str, after: str, size: int) -> dict[str, Any]:
    """One page of a tenant's document ids over both indexes at once: a composite
    aggregation on ``doc_id`` pages in id order with no result window to run
    out of, and counts each id's passage records (``passage_index`` >= 0) in the
    same request, including passages whose document record is gone."""
    composite: dict[str, Any] = {
        "size": size,
        "sources": [{"doc": {"terms": {"field": "doc_id"}}}],
    }
    if after:
        composite["after"] = {"doc": after}
    return {
        "size": 0,
        "track_total_hits": False,
        "query": {"bool": {"filter": filter_clauses(tenant, Filters())}},
        "aggs": {
            "docs": {
                "composite": composite,
                "aggs": {"passages": {"filter": {"range": {"passage_index": {"gte": 0}}}}},
            }
        },
    }


def documents_from_composite(response: dict[str, Any], size: int) -> DocumentPage:
    buckets = response.get("aggregations", {}).get("docs", {}).get("buckets", [])
    documents = []
    for bucket in buckets:
        passages = int(bucket["passages"]["doc_count"])
        documents.append(
            StoredDocument(
                doc_id=str(bucket["key"]["doc"]),
                passages=passages,
                has_document=int(bucket["doc_count"]) > passages,
            )
        )
    # A full page may be followed by more; a short one is the last.
    token = documents[-1].doc_id if len(documents) == size else ""
    return DocumentPage(documents=tuple(documents), next_page_token=token)


def _parse_date(value: Any) -> datetime | None:
    if not value:
        return None
    parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def hits_from_response(response: dict[str, Any]) -> list[Hit]:
    out = []
    for raw in response["hits"]["hits"]:
        src = raw["_source"]
        highlight = raw.get("highlight", {})
        fragments = list(highlight.get("title", ())) + list(highlight.get("text", ()))
        out.append(
            Hit(
                doc_id=src["doc_id"],
                passage_index=int(src.get("passage_index", -1)),
                score=float(raw["_score"]),
                title=src.get("title", ""),
                text=src.get("text", ""),
                highlights=tuple(fragments),
                keywords=keywords_from_stored(src),
                published_at=_parse_date(src.get("published_at")),
                source_url=src.get("source_url") or "",
                page=int(src.get("page") or 0),
            )
        )
    return out


def bulk_actions(
    base: str,
    tenant: str,
    documents: Sequence[DocumentIn],
    old_counts: dict[str, int],
) -> Iterable[dict[str, Any]]:
    """Index actions for every record plus deletes for passages that disappeared."""
    names = index_names(base)
    for doc in documents:
        for level, rid, source in records(tenant, doc):
            yield {"_op_type": "index", "_index": names[level], "_id": rid, "_source": source}
        for rid in stale_passage_ids(tenant, doc.id, old_counts.get(doc.id, 0), len(doc.passages)):
            yield {"_op_type": "delete", "_index": names[Level.PASSAGE], "_id": rid}
