"""One retrieval fan-out for the answer pipeline and the generator's re-search.

BM25 ∥ dense ∥ KG (plain or enhanced) ∥ personal knowledge facts, each
retriever with its own timeout, their hits merged into one record per key
and their ranked lists fused with the request's fusion. A retriever that fails
(unavailable, out of time) is left out and reported as a ``Failure``; the
caller decides what that means (a degradation, or no revision).

Two levels:

* ``Level.DOCUMENT`` (the answer pipeline): documents are ranked, keyed by
  document id; BM25 and dense also search passages, which are attached to the
  documents found (the reranker's input).
* ``Level.PASSAGE`` (re-search of one sentence): passages are ranked, keyed by
  (document id, passage index). KG scores rank articles only, so a KG hit is
  the article's record, keyed (document id, -1), with the article's text (the
  summary the semantic service holds) as its text.

The fan-out talks to the services only through a ``Searcher`` (typed
requests in, responses or Attest errors out), so the answer service passes
its gRPC backends and the generate service its own stubs; this module never
imports grpc.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias, TypeVar

from attest.common.v1 import common_pb2
from attest.core.document import keywords_from_message, merge_keywords
from attest.core.errors import DeadlineExceeded, Unavailable
from attest.knowledge.v1 import knowledge_pb2
from attest.lexical.v1 import lexical_pb2
from attest.retrieval.fusion import RETRIEVER_NAMES as FUSION_NAMES
from attest.retrieval.fusion import FusionSettings, Method, Ranked, fuse_with
from attest.semantic.v1 import semantic_pb2

log = logging.getLogger(__name__)

T = TypeVar("T")
Retriever: TypeAlias = common_pb2.Retriever.ValueType

# The names fusion settings weigh retrievers by (as `attest eval ir` names them).
RETRIEVER_NAMES: dict[Retriever, str] = {
    common_pb2.RETRIEVER_BM25: "bm25",
    common_pb2.RETRIEVER_DENSE: "dense",
    common_pb2.RETRIEVER_KG: "kg",
    common_pb2.RETRIEVER_KG_ENHANCED: "kg_enhanced",
    common_pb2.RETRIEVER_KNOWLEDGE: "knowledge",
}
# The retrievers served by the semantic service.
SEMANTIC_RETRIEVERS = frozenset(
    {common_pb2.RETRIEVER_DENSE, common_pb2.RETRIEVER_KG, common_pb2.RETRIEVER_KG_ENHANCED}
)
# The service each retriever calls (named in failures).
SERVICES: dict[Retriever, str] = {
    common_pb2.RETRIEVER_BM25: "lexical",
    common_pb2.RETRIEVER_DENSE: "semantic",
    common_pb2.RETRIEVER_KG: "semantic",
    common_pb2.RETRIEVER_KG_ENHANCED: "semantic",
    common_pb2.RETRIEVER_KNOWLEDGE: "knowledge",
}
# Passage hits searched when looking up the passage a knowledge fact came from.
FACT_PASSAGE_LOOKUP_TOP_K = 50
# Passages per document handed to the reranker (its default per-document limit).
RERANK_PASSAGES = 8
# Characters of one text handed on as a passage (the reranker's default
# per-passage limit): an article found without a passage (KG ranks articles)
# is its body, which a long report exceeds, and a passage stored before ingest
# capped passages may too. Longer text is cut here rather than failing the answer.
MAX_PASSAGE_CHARS = 20_000


def _clip(text: str) -> str:
    """``text`` cut to ``MAX_PASSAGE_CHARS``, at a space where one is near the end."""
    if len(text) <= MAX_PASSAGE_CHARS:
        return text
    cut = text.rfind(" ", MAX_PASSAGE_CHARS - 200, MAX_PASSAGE_CHARS)
    return text[: cut if cut > 0 else MAX_PASSAGE_CHARS]


class Searcher(Protocol):
    """The search calls the fan-out makes; failures arrive as typed Attest errors
    (``Unavailable`` and ``DeadlineExceeded`` skip the retriever)."""

    async def lexical_search(
        self, request: lexical_pb2.SearchRequest, seconds: float
    ) -> lexical_pb2.SearchResponse: ...

    async def semantic_search(
        self, request: semantic_pb2.SearchRequest, seconds: float
    ) -> semantic_pb2.SearchResponse: ...

    async def knowledge_search(
        self, request: knowledge_pb2.SearchRequest, seconds: float
    ) -> knowledge_pb2.SearchResponse: ...


class Level(enum.Enum):
    DOCUMENT = "document"
    PASSAGE = "passage"


@dataclass
class Hit:
    """A document (or, at passage level, one passage of it) found by at least
    one retriever, with what each retriever said about it."""

    doc_id: str
    title: str = ""
    body: str = ""
    summary: str = ""
    source_url: str = ""
    published_at: object | None = None  # a protobuf Timestamp when known
    # The document's keyword fields (attest.core.document), from the first
    # retriever that returned each.
    keywords: dict[str, tuple[str, ...]] = field(default_factory=dict)
    bm25: float | None = None
    dense: float | None = None
    kg: float | None = None
    fused: float | None = None
    # passage index -> (text, best retrieval rank)
    passages: dict[int, tuple[str, int]] = field(default_factory=dict)
    # passage index -> its 1-based page, where a store knew it (0 is unknown)
    pages: dict[int, int] = field(default_factory=dict)
    # passage index -> the personal facts that led the knowledge retriever to it
    facts: dict[int, list[common_pb2.SourceFact]] = field(default_factory=dict)

    def add_passage(self, index: int, text: str, rank: int, page: int = 0) -> None:
        if not text.strip():
            return
        if index not in self.passages or self.passages[index][1] > rank:
            self.passages[index] = (text, rank)
        # Every store holds the same page for a passage, unless its record was
        # written before pages were kept (0): the first page known stands.
        if page > 0:
            self.pages.setdefault(index, page)

    def page_of(self, passage_index: int) -> int:
        """The page of a passage; 0 when unknown or for the article itself (-1)."""
        return self.pages.get(passage_index, 0)

    def passage_list(self) -> list[tuple[int, str]]:
        """Passages for the reranker, best retrieval rank first; the body when none was found."""
        if self.passages:
            ranked = sorted(self.passages.items(), key=lambda kv: kv[1][1])
            return [(i, _clip(text)) for i, (text, _) in ranked[:RERANK_PASSAGES]]
        text = self.body or self.summary
        return [(-1, _clip(text))] if text.strip() else []

    def text_of(self, passage_index: int) -> str:
        """A passage's text; for index -1 (the article's record) the body or summary
        (each at most ``MAX_PASSAGE_CHARS``)."""
        if passage_index in self.passages:
            return _clip(self.passages[passage_index][0])
        return _clip(self.body or self.summary) if passage_index < 0 else ""

    def stored_vector_index(self, passage_index: int) -> int | None:
        """The stored semantic record whose vector embeds the same text as the
        reranker would for this entry of ``passage_list``, or None.

        A passage's record embeds "title, newline, passage", as the reranker's
        fallback does. Without passages the entry is the article text: when
        that is the summary the semantic service returned (no BM25 body), the
        article record embeds "title, newline, summary", the same text again;
        a BM25 body has no record of its own and is embedded by the reranker.
        """
        if passage_index >= 0:
            return passage_index
        return -1 if not self.body and self.summary else None


@dataclass(frozen=True)
class Query:
    """What to search: the text, which retrievers, under which filters."""

    text: str
    retrievers: tuple[Retriever, ...]
    filters: tuple[common_pb2.Filter, ...] = ()
    top_k: int = 20  # per retriever
    level: Level = Level.DOCUMENT
    # Facts asked of the knowledge service (at most ``top_k``).
    knowledge_top_k: int = 20


@dataclass(frozen=True)
class Limits:
    """Each retriever's timeout, capped by an overall deadline (``time.monotonic``)."""

    timeout: float
    deadline: float | None = None

    def seconds(self, limit: float, what: str) -> float:
        if self.deadline is None:
            return limit
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(f"the time budget was spent before {what}")
        return min(limit, left)


@dataclass(frozen=True)
class Failure:
    """A retriever that did not answer, and why."""

    retriever: Retriever
    service: str
    message: str

    @property
    def reason(self) -> str:
        return f"{self.service} service unavailable: {self.message}"


@dataclass
class Retrieval:
    """What the fan-out found: one hit per key, each retriever's ranked list
    (in the order asked), its time, and the retrievers that failed."""

    hits: dict[Hashable, Hit]
    lists: list[Ranked]
    seconds: list[tuple[Retriever, float]]
    failures: list[Failure]

    def fuse(self, settings: FusionSettings, top_k: int | None) -> list[tuple[Hashable, float]]:
        """The fused keys, best first; each hit kept gets its fused score."""
        fused = fuse_with(self.lists, settings, top_k=top_k)
        for key, score in fused:
            self.hits[key].fused = score
        return fused


# A coroutine giving the query's vector (or None: each search embeds the text).
VectorFn = Callable[[], Awaitable[semantic_pb2.Vector | None]]


async def _timed(call: Awaitable[T]) -> tuple[T, float]:
    start = time.perf_counter()
    result = await call
    return result, time.perf_counter() - start


async def retrieve(
    searcher: Searcher,
    query: Query,
    limits: Limits,
    vector: VectorFn | None = None,
) -> Retrieval:
    """Run every retriever of ``query`` concurrently and merge what they found.

    ``vector`` is awaited by the semantic retrievers only, within their own
    timeout (embedding and searching share it). Errors other than
    ``Unavailable`` and ``DeadlineExceeded`` propagate.
    """
    passage_level = query.level is Level.PASSAGE
    hits: dict[Hashable, Hit] = {}
    timeout = limits.timeout
    vectors_until = time.monotonic() + timeout

    def hit(key: Hashable, doc_id: str) -> Hit:
        if key not in hits:
            hits[key] = Hit(doc_id)
        return hits[key]

    def lexical_request(
        text: str, level: lexical_pb2.SearchLevel.ValueType, top_k: int
    ) -> lexical_pb2.SearchRequest:
        return lexical_pb2.SearchRequest(
            query=text, top_k=top_k, filters=query.filters, level=level
        )

    async def bm25() -> Ranked:
        limit = limits.seconds(timeout, "BM25 retrieval")
        if passage_level:
            response = await searcher.lexical_search(
                lexical_request(query.text, lexical_pb2.SEARCH_LEVEL_PASSAGE, query.top_k), limit
            )
            items: list[tuple[Hashable, float]] = []
            for rank, h in enumerate(response.hits):
                key = (h.doc_id, h.passage_index)
                c = hit(key, h.doc_id)
                c.bm25 = h.score
                c.title = c.title or h.title
                c.source_url = c.source_url or h.source_url
                merge_keywords(c.keywords, keywords_from_message(h))
                c.add_passage(h.passage_index, h.text, rank, h.page)
                items.append((key, float(h.score)))
            return Ranked("bm25", items)
        docs, passages = await asyncio.gather(
            searcher.lexical_search(
                lexical_request(query.text, lexical_pb2.SEARCH_LEVEL_DOCUMENT, query.top_k), limit
            ),
            searcher.lexical_search(
                lexical_request(query.text, lexical_pb2.SEARCH_LEVEL_PASSAGE, query.top_k), limit
            ),
        )
        for h in docs.hits:
            c = hit(h.doc_id, h.doc_id)
            c.bm25 = h.score
            c.title, c.body, c.source_url = h.title, h.text, h.source_url
            merge_keywords(c.keywords, keywords_from_message(h))
            if h.HasField("published_at"):
                c.published_at = h.published_at
        for rank, h in enumerate(passages.hits):
            if h.doc_id in hits:
                hits[h.doc_id].add_passage(h.passage_index, h.text, rank, h.page)
        return Ranked("bm25", [(h.doc_id, h.score) for h in docs.hits])

    async def semantic(retriever: Retriever) -> Ranked:
        # Shielded: several searches wait for the one embedding.
        found = await vector() if vector is not None else None
        left = vectors_until - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded("the vector retrieval's time went to embedding the question")
        limit = limits.seconds(min(timeout, left), "vector retrieval")
        dense = retriever == common_pb2.RETRIEVER_DENSE
        if dense:
            mode, variant = semantic_pb2.SEARCH_MODE_DENSE, semantic_pb2.KG_VARIANT_UNSPECIFIED
        else:
            mode = semantic_pb2.SEARCH_MODE_KG
            variant = (
                semantic_pb2.KG_VARIANT_ENHANCED
                if retriever == common_pb2.RETRIEVER_KG_ENHANCED
                else semantic_pb2.KG_VARIANT_PLAIN
            )

        def request(level: semantic_pb2.SearchLevel.ValueType) -> semantic_pb2.SearchRequest:
            return semantic_pb2.SearchRequest(
                query=query.text,
                query_vector=found,
                top_k=query.top_k,
                filters=query.filters,
                level=level,
                mode=mode,
                kg_variant=variant,
            )

        name = RETRIEVER_NAMES[retriever]
        if passage_level and dense:
            response = await searcher.semantic_search(
                request(semantic_pb2.SEARCH_LEVEL_PASSAGE), limit
            )
            items: list[tuple[Hashable, float]] = []
            for rank, h in enumerate(response.hits):
                key: Hashable = (h.doc_id, h.passage_index)
                c = hit(key, h.doc_id)
                if h.HasField("dense_score"):
                    c.dense = h.dense_score
                c.title = c.title or h.title
                c.source_url = c.source_url or h.source_url
                merge_keywords(c.keywords, keywords_from_message(h))
                c.add_passage(h.passage_index, h.text, rank, h.page)
                items.append((key, float(h.score)))
            return Ranked(name, items)
        calls = [searcher.semantic_search(request(semantic_pb2.SEARCH_LEVEL_DOCUMENT), limit)]
        if dense:
            calls.append(
                searcher.semantic_search(request(semantic_pb2.SEARCH_LEVEL_PASSAGE), limit)
            )
        responses = await asyncio.gather(*calls)
        items = []
        for h in responses[0].hits:
            # KG scores rank articles: at passage level a KG hit is the
            # article's own record (-1), its text the article's summary.
            key = (h.doc_id, -1) if passage_level else h.doc_id
            c = hit(key, h.doc_id)
            if h.HasField("dense_score"):
                c.dense = h.dense_score
            if h.HasField("kg_score"):
                c.kg = h.kg_score
            c.title = c.title or h.title
            c.summary = c.summary or h.text
            c.source_url = c.source_url or h.source_url
            merge_keywords(c.keywords, keywords_from_message(h))
            if c.published_at is None and h.HasField("published_at"):
                c.published_at = h.published_at
            items.append((key, float(h.score)))
        if len(responses) > 1:
            for rank, h in enumerate(responses[1].hits):
                hit(h.doc_id, h.doc_id).add_passage(h.passage_index, h.text, rank, h.page)
        return Ranked(name, items)

    async def knowledge() -> Ranked:
        # The personal base only: a fact of the ESG graph has no document
        # to cite. Each fact stands for the passage it was extracted from.
        limit = limits.seconds(timeout, "knowledge retrieval")
        until = time.monotonic() + limit
        response = await searcher.knowledge_search(
            knowledge_pb2.SearchRequest(
                query=query.text,
                top_k=min(query.knowledge_top_k, query.top_k),
                knowledge_bases=[knowledge_pb2.KNOWLEDGE_BASE_PERSONAL],
            ),
            limit,
        )
        found = fact_passages(response.facts)
        provenance = facts_by_passage(response.facts)
        if not found:
            return Ranked("knowledge", [])
        # The passage's own text, looked up through the lexical service
        # under the same tenant and filters as BM25: the generator cites
        # the passage, never the fact's wording, and a passage outside the
        # filters (or no longer indexed) is not found and not used.
        left = until - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded("the knowledge retrieval's time went to the search")
        lookups = await asyncio.gather(
            *(
                searcher.lexical_search(
                    lexical_request(
                        statement, lexical_pb2.SEARCH_LEVEL_PASSAGE, FACT_PASSAGE_LOOKUP_TOP_K
                    ),
                    limits.seconds(left, "looking up the passages of knowledge facts"),
                )
                for (_, _), (statement, _) in found.items()
            )
        )
        items: list[tuple[Hashable, float]] = []
        scored: set[Hashable] = set()
        for rank, (((doc_id, index), (_, score)), looked_up) in enumerate(
            zip(found.items(), lookups, strict=True)
        ):
            h = next(
                (h for h in looked_up.hits if h.doc_id == doc_id and h.passage_index == index),
                None,
            )
            if h is None or not h.text.strip():
                log.info("passage %s#%d of a knowledge fact not found; skipped", doc_id, index)
                continue
            key: Hashable = (doc_id, index) if passage_level else doc_id
            c = hit(key, doc_id)
            c.add_passage(index, h.text, rank, h.page)
            c.facts[index] = provenance[(doc_id, index)]
            c.title = c.title or h.title
            c.source_url = c.source_url or h.source_url
            merge_keywords(c.keywords, keywords_from_message(h))
            if c.published_at is None and h.HasField("published_at"):
                c.published_at = h.published_at
            if key not in scored:
                scored.add(key)
                items.append((key, score))
        return Ranked("knowledge", items)

    jobs: list[Awaitable[Ranked]] = []
    for r in query.retrievers:
        if r == common_pb2.RETRIEVER_BM25:
            jobs.append(bm25())
        elif r == common_pb2.RETRIEVER_KNOWLEDGE:
            jobs.append(knowledge())
        else:
            jobs.append(semantic(r))
    results = await asyncio.gather(*(_timed(job) for job in jobs), return_exceptions=True)
    lists: list[Ranked] = []
    seconds: list[tuple[Retriever, float]] = []
    failures: list[Failure] = []
    for r, result in zip(query.retrievers, results, strict=True):
        if isinstance(result, Unavailable | DeadlineExceeded):
            failures.append(Failure(r, SERVICES[r], result.message))
            continue
        if isinstance(result, BaseException):
            raise result
        ranked, took = result
        seconds.append((r, took))
        lists.append(ranked)
    # Passages can arrive before their document's hit exists; drop documents
    # no ranking retriever returned.
    ranked_keys = {key for r in lists for key, _ in r.items}
    return Retrieval({k: v for k, v in hits.items() if k in ranked_keys}, lists, seconds, failures)


def fusion_of(
    method: common_pb2.FusionMethod.ValueType, configured: FusionSettings
) -> FusionSettings:
    """A request's fusion method resolved against the configured fusion.

    UNSPECIFIED: the configured fusion; RRF: plain, equal weights; WEIGHTED and
    DBSF: that method with the configured weights (for a configured linear model,
    equal weights over the retrievers it uses)."""
    if method == common_pb2.FUSION_METHOD_RRF:
        return FusionSettings(method="rrf", rrf_k=configured.rrf_k, fitted_on="plain RRF")
    if method in (common_pb2.FUSION_METHOD_WEIGHTED, common_pb2.FUSION_METHOD_DBSF):
        name: Method = "weighted" if method == common_pb2.FUSION_METHOD_WEIGHTED else "dbsf"
        if configured.method == "linear":
            # A linear model has no per-retriever weight: the retrievers it
            # uses count equally.
            used = {r: 1.0 for r in FUSION_NAMES if configured.weight(r) > 0}
            return dataclasses.replace(
                configured, method=name, weights=used, default_weight=0.0, features={}
            )
        return dataclasses.replace(configured, method=name)
    return configured


# -- personal knowledge facts ------------------------------------------------------------------


def fact_provenance(fact: knowledge_pb2.Fact) -> tuple[str, int] | None:
    """(document id, passage index) a personal fact was extracted from, or None
    for a fact without a passage (an ESG graph fact, a fact stored without one)."""
    kind = fact.WhichOneof("fact")
    if kind is None:
        return None
    inner = getattr(fact, kind)
    if inner.knowledge_base != knowledge_pb2.KNOWLEDGE_BASE_PERSONAL or not inner.source_doc_id:
        return None
    if not inner.HasField("provenance") or inner.provenance.passage_index < 0:
        return None
    return inner.source_doc_id, inner.provenance.passage_index


def fact_statement(fact: knowledge_pb2.Fact) -> str:
    """A fact in words, as shown under its source and as its passage is looked up
    by: "subject relation object", "entity, aspect: value", "entity: description"."""
    kind = fact.WhichOneof("fact")
    if kind == "description":
        return f"{fact.description.entity.name}: {fact.description.text}"
    if kind == "triple":
        t = fact.triple
        other = t.object_entity.name if t.HasField("object_entity") else t.object_value
        return f"{t.subject.name} {t.relation} {other}"
    if kind == "aspect_fact":
        a = fact.aspect_fact
        return f"{a.entity.name}, {a.aspect}: {a.value}"
    return ""


def fact_passages(
    facts: Sequence[knowledge_pb2.Fact],
) -> dict[tuple[str, int], tuple[str, float]]:
    """The passages personal facts came from, in the facts' order, each once:
    (document id, passage index) -> (the first fact's statement, the best fact score)."""
    return {
        key: (found[0].statement, max(f.score for f in found))
        for key, found in facts_by_passage(facts).items()
    }


def facts_by_passage(
    facts: Sequence[knowledge_pb2.Fact],
) -> dict[tuple[str, int], list[common_pb2.SourceFact]]:
    """Personal facts with a passage, grouped by (document id, passage index) in the
    facts' order, each as a source's provenance."""
    out: dict[tuple[str, int], list[common_pb2.SourceFact]] = {}
    for fact in facts:
        key = fact_provenance(fact)
        statement = fact_statement(fact)[:4096]
        if key is None or not statement.strip():
            continue
        provenance = getattr(fact, str(fact.WhichOneof("fact"))).provenance
        out.setdefault(key, []).append(
            common_pb2.SourceFact(
                statement=statement,
                start_char=provenance.start_char,
                end_char=provenance.end_char,
                score=fact.score,
            )
        )
    return out
