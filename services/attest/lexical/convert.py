"""Protobuf ↔ domain conversion with input validation.

Every rejection is an ``InvalidArgument`` naming the field as the caller
wrote it (``filters[1].gte``, ``documents[3].id``).
"""

from __future__ import annotations

from attest.common.v1 import common_pb2
from attest.core import common
from attest.core.common import Filters, from_timestamp, ids_only_view, to_timestamp
from attest.core.document import keywords_from_message, keywords_to_message
from attest.core.errors import InvalidArgument
from attest.core.settings import RequestLimits
from attest.core.validation import check_id
from attest.lexical.models import (
    Counts,
    DocumentIn,
    DocumentPage,
    Hit,
    IndexResult,
    Level,
    PassageIn,
    SearchQuery,
)
from attest.lexical.v1 import lexical_pb2


def filters_from_proto(filters: list[common_pb2.Filter], limits: RequestLimits) -> Filters:
    return common.filters_from_proto(
        filters, max_filters=limits.max_filters, max_values=limits.max_filter_values
    )


def search_from_proto(request: lexical_pb2.SearchRequest, limits: RequestLimits) -> SearchQuery:
    text = request.query.strip()
    if not text:
        raise InvalidArgument("must not be empty", field="query")
    if len(request.query) > limits.max_query_chars:
        raise InvalidArgument(
            f"is {len(request.query):,} characters; the limit is {limits.max_query_chars:,}",
            field="query",
        )
    if not 1 <= request.top_k <= limits.max_top_k:
        raise InvalidArgument(
            f"must be between 1 and {limits.max_top_k}, got {request.top_k}", field="top_k"
        )
    if request.level not in lexical_pb2.SearchLevel.values():
        raise InvalidArgument(f"unknown level {request.level}", field="level")
    level = Level.PASSAGE if request.level == lexical_pb2.SEARCH_LEVEL_PASSAGE else Level.DOCUMENT
    ids_only = ids_only_view(request.view)
    if ids_only and request.highlight:
        raise InvalidArgument("highlights need the full view, not HIT_VIEW_IDS", field="highlight")
    return SearchQuery(
        text=text,
        top_k=request.top_k,
        filters=filters_from_proto(list(request.filters), limits),
        level=level,
        highlight=request.highlight,
        ids_only=ids_only,
    )


def document_from_proto(doc: common_pb2.Document, where: str, limits: RequestLimits) -> DocumentIn:
    check_id(doc.id, f"{where}.id", limits.max_id_chars)
    for name in ("title", "body"):
        if len(getattr(doc, name)) > limits.max_text_chars:
            raise InvalidArgument(
                f"is longer than {limits.max_text_chars:,} characters", field=f"{where}.{name}"
            )
    if not doc.title.strip() and not doc.body.strip() and not doc.passages:
        raise InvalidArgument("a document needs a title, a body or passages", field=where)
    passages = []
    seen: set[int] = set()
    for j, p in enumerate(doc.passages):
        if p.doc_id and p.doc_id != doc.id:
            raise InvalidArgument(
                f"belongs to document {p.doc_id!r}, not {doc.id!r}",
                field=f"{where}.passages[{j}].doc_id",
            )
        if p.index < 0 or p.index in seen:
            raise InvalidArgument(
                "passage indexes must be distinct and non-negative",
                field=f"{where}.passages[{j}].index",
            )
        if p.page < 0:
            raise InvalidArgument(
                "must be 0 (no pages) or a 1-based page number",
                field=f"{where}.passages[{j}].page",
            )
        seen.add(p.index)
        passages.append(PassageIn(index=p.index, text=p.text, page=p.page))
    if seen and seen != set(range(len(passages))):
        raise InvalidArgument(
            "passage indexes must be 0..n-1 without gaps", field=f"{where}.passages"
        )
    return DocumentIn(
        id=doc.id,
        title=doc.title,
        body=doc.body,
        published_at=from_timestamp(
            doc.published_at, doc.HasField("published_at"), f"{where}.published_at"
        ),
        source_url=doc.source_url,
        keywords=keywords_from_message(doc, where),
        metadata=dict(doc.metadata),
        passages=tuple(sorted(passages, key=lambda p: p.index)),
    )


def index_from_proto(request: lexical_pb2.IndexRequest, limits: RequestLimits) -> list[DocumentIn]:
    if not request.documents:
        raise InvalidArgument("must contain at least one document", field="documents")
    if len(request.documents) > limits.max_batch:
        raise InvalidArgument(
            f"has {len(request.documents):,} documents; the limit is {limits.max_batch:,}",
            field="documents",
        )
    docs = [
        document_from_proto(d, f"documents[{i}]", limits) for i, d in enumerate(request.documents)
    ]
    ids = [d.id for d in docs]
    if len(set(ids)) != len(ids):
        duplicate = next(i for i in ids if ids.count(i) > 1)
        raise InvalidArgument(f"document id {duplicate!r} appears twice", field="documents")
    return docs


def delete_from_proto(request: lexical_pb2.DeleteRequest, limits: RequestLimits) -> list[str]:
    if not request.doc_ids:
        raise InvalidArgument("must contain at least one id", field="doc_ids")
    if len(request.doc_ids) > limits.max_batch:
        raise InvalidArgument(f"at most {limits.max_batch:,} ids are allowed", field="doc_ids")
    return [
        check_id(v, f"doc_ids[{i}]", limits.max_id_chars) for i, v in enumerate(request.doc_ids)
    ]


def hit_to_proto(hit: Hit, ids_only: bool = False) -> lexical_pb2.Hit:
    if ids_only:
        return lexical_pb2.Hit(doc_id=hit.doc_id, passage_index=hit.passage_index, score=hit.score)
    out = lexical_pb2.Hit(
        doc_id=hit.doc_id,
        passage_index=hit.passage_index,
        score=hit.score,
        title=hit.title,
        text=hit.text,
        highlights=hit.highlights,
        published_at=to_timestamp(hit.published_at),
        source_url=hit.source_url,
        page=hit.page,
    )
    keywords_to_message(hit.keywords, out)
    return out


def index_result_to_proto(result: IndexResult) -> lexical_pb2.IndexResponse:
    return lexical_pb2.IndexResponse(documents=result.documents, passages=result.passages)


def counts_to_proto(counts: Counts, backend: str) -> lexical_pb2.StatsResponse:
    return lexical_pb2.StatsResponse(
        documents=counts.documents, passages=counts.passages, backend=backend
    )


DEFAULT_PAGE_SIZE = 1000
MAX_PAGE_SIZE = 10_000


def page_size_from_proto(page_size: int) -> int:
    """A listing's page size: 0 means the default; 1-10,000 otherwise."""
    if page_size == 0:
        return DEFAULT_PAGE_SIZE
    if not 1 <= page_size <= MAX_PAGE_SIZE:
        raise InvalidArgument(
            f"must be between 1 and {MAX_PAGE_SIZE:,}, or 0 for {DEFAULT_PAGE_SIZE:,}",
            field="page_size",
        )
    return page_size


def list_from_proto(
    request: lexical_pb2.ListDocumentsRequest, limits: RequestLimits
) -> tuple[str, int]:
    """(page token, page size); the token is the last id of the previous page."""
    if len(request.page_token) > limits.max_id_chars:
        raise InvalidArgument("is not a token of this listing", field="page_token")
    return request.page_token, page_size_from_proto(request.page_size)


def page_to_proto(page: DocumentPage) -> lexical_pb2.ListDocumentsResponse:
    return lexical_pb2.ListDocumentsResponse(
        documents=[
            lexical_pb2.StoredDocument(
                doc_id=d.doc_id,
                passages=d.passages,
                has_document=d.has_document,
                passages_sha256=d.passages_sha256,
            )
            for d in page.documents
        ],
        next_page_token=page.next_page_token,
    )
