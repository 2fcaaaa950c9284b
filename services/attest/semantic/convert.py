"""Protobuf ↔ domain conversion of the semantic service, with validation."""

from __future__ import annotations

import numpy as np

from attest.common.v1 import common_pb2
from attest.core import common
from attest.core.common import from_timestamp, to_timestamp
from attest.core.document import keywords_from_message, keywords_to_message
from attest.core.errors import InvalidArgument
from attest.knowledge.graph import KnowledgeGraph
from attest.knowledge.graph import Level as GraphLevel
from attest.semantic.kg_scoring import NodeScore
from attest.semantic.models import (
    Level,
    Mode,
    PassageIn,
    SemanticDoc,
    SemanticHit,
    SemanticQuery,
    Variant,
    Vector,
)
from attest.semantic.settings import SemanticLimits
from attest.semantic.v1 import semantic_pb2

_LEVELS = {
    GraphLevel.ROOT: common_pb2.KG_NODE_LEVEL_ROOT,
    GraphLevel.PILLAR: common_pb2.KG_NODE_LEVEL_PILLAR,
    GraphLevel.BASIC: common_pb2.KG_NODE_LEVEL_BASIC,
    GraphLevel.INTERMEDIATE: common_pb2.KG_NODE_LEVEL_INTERMEDIATE,
    GraphLevel.LOWER: common_pb2.KG_NODE_LEVEL_LOWER,
}


#: Explain's paths: at most this many, this many when the request leaves it 0.
MAX_EXPLAIN_PATHS = 100
DEFAULT_EXPLAIN_PATHS = 10


def _vector(v: semantic_pb2.Vector, present: bool) -> Vector | None:
    return np.asarray(v.values, dtype=np.float32) if present and len(v.values) else None


def _check_text(value: str, field: str, limit: int) -> None:
    if len(value) > limit:
        raise InvalidArgument(f"is longer than {limit:,} characters", field=field)


def index_from_proto(
    request: semantic_pb2.IndexRequest, limits: SemanticLimits
) -> list[SemanticDoc]:
    if not request.documents:
        raise InvalidArgument("must contain at least one document", field="documents")
    if len(request.documents) > limits.max_batch:
        raise InvalidArgument(
            f"has {len(request.documents):,} documents; the limit is {limits.max_batch:,}",
            field="documents",
        )
    docs = []
    seen: set[str] = set()
    for i, item in enumerate(request.documents):
        where = f"documents[{i}]"
        d = item.document
        if not d.id.strip():
            raise InvalidArgument("must not be empty", field=f"{where}.document.id")
        if len(d.id) > limits.max_id_chars:
            raise InvalidArgument(
                f"is longer than {limits.max_id_chars} characters", field=f"{where}.document.id"
            )
        if d.id in seen:
            raise InvalidArgument(f"document id {d.id!r} appears twice", field="documents")
        seen.add(d.id)
        for name in ("title", "body"):
            _check_text(getattr(d, name), f"{where}.document.{name}", limits.max_text_chars)
        _check_text(item.summary, f"{where}.summary", limits.max_text_chars)
        if not (d.title.strip() or d.body.strip() or item.summary.strip()):
            raise InvalidArgument("a document needs a title, a body or a summary", field=where)
        if item.passage_vectors and len(item.passage_vectors) != len(d.passages):
            raise InvalidArgument(
                f"has {len(item.passage_vectors)} vectors for {len(d.passages)} passages",
                field=f"{where}.passage_vectors",
            )
        indexes = [p.index for p in d.passages]
        if sorted(indexes) != list(range(len(indexes))):
            raise InvalidArgument(
                "passage indexes must be 0..n-1 without gaps", field=f"{where}.document.passages"
            )
        for j, p in enumerate(d.passages):
            if p.page < 0:
                raise InvalidArgument(
                    "must be 0 (no pages) or a 1-based page number",
                    field=f"{where}.document.passages[{j}].page",
                )
        passages = tuple(
            PassageIn(
                index=p.index,
                text=p.text,
                vector=_vector(item.passage_vectors[j], True) if item.passage_vectors else None,
                page=p.page,
            )
            for j, p in enumerate(d.passages)
        )
        docs.append(
            SemanticDoc(
                id=d.id,
                title=d.title,
                body=d.body,
                summary=item.summary,
                published_at=from_timestamp(d.published_at, d.HasField("published_at")),
                source_url=d.source_url,
                keywords=keywords_from_message(d, f"{where}.document"),
                passages=passages,
                article_vector=_vector(item.article_vector, item.HasField("article_vector")),
            )
        )
    return docs


def _query_common(
    query: str, vector: Vector | None, limits: SemanticLimits
) -> tuple[str, Vector | None]:
    text = query.strip()
    if vector is None and not text:
        raise InvalidArgument("must not be empty (or give query_vector)", field="query")
    if len(query) > limits.max_query_chars:
        raise InvalidArgument(
            f"is {len(query):,} characters; the limit is {limits.max_query_chars:,}",
            field="query",
        )
    return text, vector


def search_from_proto(request: semantic_pb2.SearchRequest, limits: SemanticLimits) -> SemanticQuery:
    text, vector = _query_common(
        request.query, _vector(request.query_vector, request.HasField("query_vector")), limits
    )
    if not 1 <= request.top_k <= limits.max_top_k:
        raise InvalidArgument(
            f"must be between 1 and {limits.max_top_k}, got {request.top_k}", field="top_k"
        )
    for name, enum_type in (
        ("level", semantic_pb2.SearchLevel),
        ("mode", semantic_pb2.SearchMode),
        ("kg_variant", semantic_pb2.KgVariant),
    ):
        if getattr(request, name) not in enum_type.values():
            raise InvalidArgument(f"unknown value {getattr(request, name)}", field=name)
    if request.HasField("kg_top_n") and not 0 <= request.kg_top_n <= 50:
        raise InvalidArgument("must be between 0 and 50", field="kg_top_n")
    return SemanticQuery(
        text=text,
        vector=vector,
        top_k=request.top_k,
        filters=common.filters_from_proto(
            request.filters, max_filters=limits.max_filters, max_values=limits.max_filter_values
        ),
        level=Level.PASSAGE
        if request.level == semantic_pb2.SEARCH_LEVEL_PASSAGE
        else Level.DOCUMENT,
        mode={
            semantic_pb2.SEARCH_MODE_KG: Mode.KG,
            semantic_pb2.SEARCH_MODE_FUSED: Mode.FUSED,
        }.get(request.mode, Mode.DENSE),
        variant=Variant.PLAIN
        if request.kg_variant == semantic_pb2.KG_VARIANT_PLAIN
        else Variant.ENHANCED,
        kg_top_n=request.kg_top_n if request.HasField("kg_top_n") else None,
        ids_only=common.ids_only_view(request.view),
    )


def explain_from_proto(
    request: semantic_pb2.ExplainRequest, limits: SemanticLimits
) -> SemanticQuery:
    text, vector = _query_common(
        request.query, _vector(request.query_vector, request.HasField("query_vector")), limits
    )
    if not request.doc_id.strip():
        raise InvalidArgument("must not be empty", field="doc_id")
    if request.kg_variant not in semantic_pb2.KgVariant.values():
        raise InvalidArgument(f"unknown value {request.kg_variant}", field="kg_variant")
    if not 0 <= request.max_paths <= MAX_EXPLAIN_PATHS:
        raise InvalidArgument(
            f"must be between 1 and {MAX_EXPLAIN_PATHS} (0: {DEFAULT_EXPLAIN_PATHS}), "
            f"got {request.max_paths}",
            field="max_paths",
        )
    return SemanticQuery(
        text=text,
        vector=vector,
        variant=Variant.PLAIN
        if request.kg_variant == semantic_pb2.KG_VARIANT_PLAIN
        else Variant.ENHANCED,
        kg_top_n=request.kg_top_n if request.HasField("kg_top_n") else None,
    )


def hit_to_proto(hit: SemanticHit, ids_only: bool = False) -> semantic_pb2.Hit:
    """A hit; with ``ids_only`` its id, passage index, scores and best node only."""
    if ids_only:
        out = semantic_pb2.Hit(
            doc_id=hit.doc_id,
            passage_index=hit.passage_index,
            score=hit.score,
            best_node_id=hit.best_node_id,
        )
    else:
        out = semantic_pb2.Hit(
            doc_id=hit.doc_id,
            passage_index=hit.passage_index,
            score=hit.score,
            best_node_id=hit.best_node_id,
            title=hit.title,
            text=hit.text,
            published_at=to_timestamp(hit.published_at),
            source_url=hit.source_url,
            page=hit.page,
        )
        keywords_to_message(hit.keywords, out)
    if hit.dense_score is not None:
        out.dense_score = hit.dense_score
    if hit.kg_score is not None:
        out.kg_score = hit.kg_score
    return out


def node_to_proto(
    node: NodeScore,
    graph: KnowledgeGraph,
    relation: str = "",
    article: tuple[str, str] = ("article", "article"),
) -> common_pb2.KgPathNode:
    """A scored node; the article node takes ``article``'s (document id, headline)."""
    if node.node_id == "article":
        return common_pb2.KgPathNode(
            id=article[0],
            name=article[1],
            level=common_pb2.KG_NODE_LEVEL_ARTICLE,
            score=node.score,
            best_attribute=node.best_attribute,
            relation=relation,
        )
    entity = graph.entity(node.node_id)
    return common_pb2.KgPathNode(
        id=entity.id,
        name=entity.name,
        level=_LEVELS[entity.level],
        gri_id=entity.gri_id or "",
        score=node.score,
        best_attribute=node.best_attribute,
        relation=relation,
    )


def path_to_proto(
    path: list[NodeScore], graph: KnowledgeGraph, article: tuple[str, str] = ("article", "article")
) -> common_pb2.KgPath:
    nodes = []
    for i, node in enumerate(path):
        relation = ""
        if i + 1 < len(path):
            upper = path[i + 1].node_id
            if node.node_id == "article":
                relation = "Contained_in"
            else:
                edges = [e for e in graph.parent_edges(node.node_id) if e.parent == upper]
                relation = edges[0].relation if edges else ""
        nodes.append(node_to_proto(node, graph, relation, article))
    return common_pb2.KgPath(nodes=nodes)
