"""Vector storage for the semantic service: one collection of articles, one of passages.

Both implementations keep the same layout, so data and filters mean the same
thing in the embedded default and in production:

* collections ``<prefix>-articles`` and ``<prefix>-passages``, cosine distance;
* point ids are UUID5 of (tenant, doc_id, passage_index), so writing a point
  again overwrites it;
* every payload holds ``tenant``, ``doc_id`` and ``passage_index`` besides the
  caller's fields; the document's keyword fields (``attest.core.document``)
  are lists of strings, a folded one (``organizations``) stored case-folded,
  and ``published_at`` is epoch seconds (an integer, so it reads back as written);
* payload indexes on tenant, doc_id, every keyword field and published_at;
  every search, count and delete is filtered by tenant;
* a third collection, ``<prefix>-changes``, created on first use, is a log of
  article writes and deletes (tenant, doc_id, the writer's clock in
  microseconds, the writer's id), so that replicas sharing a Qdrant server
  keep their in-memory KG tables in step (``attest.semantic.index``); its
  points carry a one-dimensional placeholder vector, as every collection
  needs one.

``EdgeVectorStore`` runs Qdrant's Rust engine in-process (``qdrant-edge``,
HNSW, on disk, reopened on restart). ``QdrantVectorStore`` talks to a Qdrant
server through ``qdrant-client`` (or its pure-Python local mode, for tests).
loadtest/bench_vectors.py measured why the embedded default is not
qdrant-client's local mode: that mode searches by brute force in Python.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, ParamSpec, Protocol, TypeVar

import httpx
import numpy as np
import numpy.typing as npt
import qdrant_edge as qe
from pydantic import SecretStr
from qdrant_client import AsyncQdrantClient
from qdrant_client import models as qm
from qdrant_client.common.client_exceptions import ResourceExhaustedResponse
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from attest.core.context import budget, remaining_seconds
from attest.core.document import BY_NAME, KEYWORD_FIELDS, Keywords, passages_digest
from attest.core.errors import (
    AttestError,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from attest.core.offload import DEFAULT_BUDGET_SECONDS, Offloaders

log = logging.getLogger(__name__)

Kind = Literal["articles", "passages"]
KINDS: tuple[Kind, ...] = ("articles", "passages")
ARTICLE_INDEX = -1  # the passage_index of an article point

DATE_FIELD = "published_at"

# Fixed namespace: point ids must stay the same across releases and hosts.
_ID_NAMESPACE = uuid.UUID("6f0b6c1e-6d0a-5b7e-9a5e-3c1f4a2b7d10")
_SCROLL_PAGE = 512
_UPSERT_BATCH = 256

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")


# Payload keys a search hit never carries: an article's KG headline vector is
# read by the KG table's scans only, and converting its 384 floats per hit was
# a third of a 100-hit search (4.3 -> 2.7 ms over 1,400 articles, one core).
NOT_IN_HITS = ("headline_vector",)
# What a search for ids and scores only reads of each payload.
ID_FIELDS = ("doc_id", "passage_index")


@dataclass(frozen=True)
class Point:
    """One vector to store: an article (``passage_index`` -1) or one of its passages."""

    doc_id: str
    passage_index: int
    vector: npt.NDArray[np.float32]
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class VectorFilter:
    """Restricts a search to one tenant and, optionally, keyword fields and dates.

    A keyword field (by name, ``attest.core.document``) matches when a point
    has any of the given values; the date bounds are inclusive.
    """

    tenant: str
    keywords: Keywords = field(default_factory=dict)
    published_from: datetime | None = None
    published_to: datetime | None = None
    # When not empty, the documents a point must belong to.
    doc_ids: tuple[str, ...] = ()


@dataclass(slots=True)  # built per hit: see SemanticHit on why not frozen
class ScoredPoint:
    doc_id: str
    passage_index: int
    score: float  # cosine similarity
    payload: dict[str, Any]


@dataclass(frozen=True)
class Change:
    """One entry of the change log: ``tenant``'s article ``doc_id`` was written or
    deleted by ``writer`` at ``at_us`` (its clock, microseconds since 1970). The
    entry names the article only; what it holds now is read from the store."""

    id: str
    tenant: str
    doc_id: str
    at_us: int
    writer: str


@dataclass(frozen=True)
class HnswParams:
    """HNSW graph and search settings; loadtest/bench_vectors.py chose the defaults."""

    m: int = 16
    ef_construct: int = 100
    # recall@10 at 100,000 passages (loadtest/reports/vectors.json): 0.94 at
    # ef 64, 0.97 at 128, 0.99 at 256, with p50 under 10 ms at each.
    ef: int = 256


@dataclass(frozen=True)
class IndexStatus:
    """How much of an embedded collection the HNSW graphs cover."""

    points: int
    indexed_vectors: int
    segments: int


class VectorStore(Protocol):
    name: str

    async def warm_up(self) -> None:
        """Open or create both collections and their payload indexes."""

    async def upsert(self, kind: Kind, tenant: str, points: Sequence[Point]) -> None: ...

    async def delete_documents(self, tenant: str, doc_ids: Sequence[str]) -> int:
        """Remove the articles and passages of ``doc_ids``; return how many articles existed."""

    async def search(
        self,
        kind: Kind,
        vector: npt.NDArray[np.float32],
        limit: int,
        flt: VectorFilter,
        ids_only: bool = False,
    ) -> list[ScoredPoint]: ...

    async def count(self, kind: Kind, tenant: str) -> int: ...

    async def vectors(
        self, kind: Kind, tenant: str, keys: Sequence[tuple[str, int]]
    ) -> list[npt.NDArray[np.float32] | None]:
        """The stored vectors of ``tenant``'s points (doc_id, passage_index), in order;
        None where there is no such point. A lookup by point id, no search."""

    def scroll(self, kind: Kind, tenant: str | None) -> AsyncIterator[Point]:
        """Every point of ``tenant`` (all tenants when None), with its vector."""

    async def payload_page(
        self,
        kind: Kind,
        tenant: str,
        *,
        offset: str | None,
        limit: int,
        fields: Sequence[str],
        doc_ids: Sequence[str] = (),
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of a scroll over ``tenant``'s points (of ``doc_ids`` when given):
        the ``fields`` of each payload, no vectors, and the offset of the next page
        (None after the last)."""

    async def articles(self, tenant: str, doc_ids: Sequence[str]) -> list[Point]:
        """The article points of ``tenant``'s ``doc_ids`` that exist, with payloads
        and vectors (a lookup by point id)."""

    async def record_changes(
        self, tenant: str, doc_ids: Sequence[str], *, writer: str, at_us: int
    ) -> None:
        """Append one change-log entry per doc id."""

    async def changes_since(self, at_us: int) -> list[Change]:
        """Every change-log entry stamped ``at_us`` or later, in no set order."""

    async def prune_changes(self, before_us: int) -> None:
        """Drop the change-log entries stamped before ``before_us``."""

    async def close(self) -> None: ...


# -- layout shared by both stores ---------------------------------------------


def collection_names(prefix: str) -> dict[Kind, str]:
    return {kind: f"{prefix}-{kind}" for kind in KINDS}


def changes_collection(prefix: str) -> str:
    return f"{prefix}-changes"


CHANGE_AT = "at"  # the change log's time field, microseconds (exact in a float64)


def _change_payload(tenant: str, doc_id: str, writer: str, at_us: int) -> dict[str, Any]:
    return {"tenant": tenant, "doc_id": doc_id, CHANGE_AT: int(at_us), "writer": writer}


def _change_from(point: Any, raw: Mapping[str, Any] | None) -> Change:
    p = _read_payload(raw)
    return Change(
        id=str(point),
        tenant=str(p["tenant"]),
        doc_id=str(p["doc_id"]),
        at_us=int(p[CHANGE_AT]),
        writer=str(p.get("writer", "")),
    )


def _check_changes(tenant: str, doc_ids: Sequence[str]) -> list[str]:
    _check_tenant(tenant)
    return _check_doc_ids(doc_ids)


def point_id(tenant: str, doc_id: str, passage_index: int) -> str:
    # The unit separator cannot occur in ids that came through the API's
    # validation, so distinct triples never share a name.
    return str(uuid.uuid5(_ID_NAMESPACE, f"{tenant}\x1f{doc_id}\x1f{passage_index}"))


def _check_tenant(tenant: str) -> None:
    if not tenant:
        raise InvalidArgument("must not be empty", field="tenant")


def _check_vector(vector: Any, dimension: int, field_name: str = "vector") -> list[float]:
    array = np.asarray(vector, dtype=np.float32)
    if array.ndim != 1 or array.shape[0] != dimension:
        raise InvalidArgument(
            f"expected a vector of dimension {dimension}, got shape {array.shape}",
            field=field_name,
        )
    if not np.all(np.isfinite(array)) or not np.any(array):
        raise InvalidArgument("must be finite and non-zero", field=field_name)
    values: list[float] = array.tolist()
    return values


def epoch_seconds(value: datetime | float) -> int:
    """Whole seconds since 1970 UTC (dates match to the second); naive means UTC."""
    if isinstance(value, datetime):
        moment = value if value.tzinfo else value.replace(tzinfo=UTC)
        return math.floor(moment.timestamp())
    return math.floor(value)


def _stored_payload(kind: Kind, tenant: str, point: Point) -> dict[str, Any]:
    if not point.doc_id:
        raise InvalidArgument("must not be empty", field="doc_id")
    if kind == "articles" and point.passage_index != ARTICLE_INDEX:
        raise InvalidArgument(
            f"an article has passage_index {ARTICLE_INDEX}", field="passage_index"
        )
    if kind == "passages" and point.passage_index < 0:
        raise InvalidArgument("a passage index is >= 0", field="passage_index")
    payload = dict(point.payload)
    own = {"tenant": tenant, "doc_id": point.doc_id, "passage_index": point.passage_index}
    for key, value in own.items():
        if key in payload and payload[key] != value:
            raise InvalidArgument(f"payload {key} {payload[key]!r} contradicts the point's")
    payload.update(own)
    for f in KEYWORD_FIELDS:
        if f.name in payload:
            raw = payload[f.name]
            values = [raw] if isinstance(raw, str) else (raw or [])
            payload[f.name] = [f.key(str(v)) for v in values]
    published = payload.get(DATE_FIELD)
    if published is None:
        payload.pop(DATE_FIELD, None)
    elif isinstance(published, datetime | int | float) and not isinstance(published, bool):
        payload[DATE_FIELD] = epoch_seconds(published)
    else:
        raise InvalidArgument("must be a datetime or epoch seconds", field=DATE_FIELD)
    return payload


def _read_payload(raw: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(raw or {})


def _point_from(raw_payload: Mapping[str, Any] | None, vector: Any) -> Point:
    payload = _read_payload(raw_payload)
    return Point(
        doc_id=str(payload["doc_id"]),
        passage_index=int(payload["passage_index"]),
        vector=np.asarray(vector, dtype=np.float32),
        payload=payload,
    )


def _in_order(
    ids: Sequence[str], records: Iterable[tuple[Any, Any]]
) -> list[npt.NDArray[np.float32] | None]:
    """Vectors of (point id, vector) records, in the order of ``ids``; None where missing."""
    found = {str(point): vector for point, vector in records if vector is not None}
    out: list[npt.NDArray[np.float32] | None] = []
    for i in ids:
        vector = found.get(i)
        out.append(None if vector is None else np.asarray(vector, dtype=np.float32))
    return out


def _point_ids(kind: Kind, tenant: str, keys: Sequence[tuple[str, int]]) -> list[str]:
    _check_tenant(tenant)
    article = kind == "articles"
    for doc_id, index in keys:
        if not doc_id:
            raise InvalidArgument("must not be empty", field="doc_id")
        if (index == ARTICLE_INDEX) != article:
            raise InvalidArgument(
                f"passage_index {index} is not a point of the {kind} collection",
                field="passage_index",
            )
    return [point_id(tenant, doc_id, index) for doc_id, index in keys]


def _scored(raw_payload: Mapping[str, Any] | None, score: float) -> ScoredPoint:
    payload = _read_payload(raw_payload)
    return ScoredPoint(
        doc_id=str(payload["doc_id"]),
        passage_index=int(payload["passage_index"]),
        score=float(score),
        payload=payload,
    )


@dataclass(frozen=True)
class _Conditions:
    """A VectorFilter checked and normalised, before it becomes an engine filter."""

    tenant: str
    keywords: dict[str, list[str]]  # field name -> stored (folded) values, any of which matches
    published_from: int | None
    published_to: int | None
    doc_ids: list[str]


def _conditions(flt: VectorFilter) -> _Conditions:
    _check_tenant(flt.tenant)
    lo = epoch_seconds(flt.published_from) if flt.published_from is not None else None
    hi = epoch_seconds(flt.published_to) if flt.published_to is not None else None
    if lo is not None and hi is not None and lo > hi:
        raise InvalidArgument("published_from is after published_to", field="published_from")
    return _Conditions(
        tenant=flt.tenant,
        keywords={
            name: [BY_NAME[name].key(v) for v in values]
            for name, values in flt.keywords.items()
            if values
        },
        published_from=lo,
        published_to=hi,
        doc_ids=list(dict.fromkeys(flt.doc_ids)),
    )


def _check_doc_ids(doc_ids: Sequence[str]) -> list[str]:
    ids = list(dict.fromkeys(doc_ids))
    if any(not d for d in ids):
        raise InvalidArgument("must not contain empty ids", field="doc_ids")
    return ids


def _batches(items: Sequence[T], size: int) -> Iterable[Sequence[T]]:
    for lo in range(0, len(items), size):
        yield items[lo : lo + size]


@dataclass(frozen=True)
class StoredDocument:
    """An article id as the store holds it, for reconciliation (``attest doctor``)."""

    doc_id: str
    passages: int  # passage points with this id
    has_article: bool  # False: passages left without their article point
    entity_ids: tuple[str, ...] = ()  # the article's KG links, sorted
    # attest.core.document.passages_digest of the passage points' texts
    passages_sha256: str = ""


@dataclass(frozen=True)
class DocumentPage:
    documents: tuple[StoredDocument, ...]
    next_page_token: str  # "" after the last page


_ARTICLE_PHASE = "a:"
_ORPHAN_PHASE = "p:"


async def _passage_counts(
    store: VectorStore, tenant: str, doc_ids: Sequence[str]
) -> dict[str, tuple[int, str]]:
    """doc id -> (passage points, passages_digest of their texts)."""
    texts: dict[str, list[tuple[int, str]]] = {d: [] for d in doc_ids}
    offset: str | None = None
    while doc_ids:
        payloads, offset = await store.payload_page(
            "passages",
            tenant,
            offset=offset,
            limit=_SCROLL_PAGE,
            fields=["doc_id", "passage_index", "text"],
            doc_ids=doc_ids,
        )
        for p in payloads:
            texts.setdefault(str(p["doc_id"]), []).append(
                (int(p.get("passage_index", 0)), str(p.get("text") or ""))
            )
        if offset is None:
            break
    return {d: (len(t), passages_digest(t)) for d, t in texts.items()}


def _offset(page_token: str, phase: str) -> str | None:
    """The scroll offset a token names: a point id (every id here is a UUID)."""
    rest = page_token[len(phase) :]
    if not rest:
        return None
    try:
        return str(uuid.UUID(rest))
    except ValueError:
        raise InvalidArgument("is not a token of this listing", field="page_token") from None


async def list_documents(
    store: VectorStore, tenant: str, page_token: str, page_size: int
) -> DocumentPage:
    """One page of ``tenant``'s articles with their passage counts and KG links,
    over a store's ``payload_page`` (the same code for both stores).

    Qdrant scrolls in point id order and has no range over a keyword, so the
    token is a scroll offset, in two phases: the articles (each with the count
    of its passages, read by a filter on the page's ids), then the passages,
    to find those whose article point is missing. Such a passage-only id can
    appear on two pages, with the same figures each time.
    """
    _check_tenant(tenant)
    if not page_token or page_token.startswith(_ARTICLE_PHASE):
        offset = _offset(page_token, _ARTICLE_PHASE)
        payloads, after = await store.payload_page(
            "articles", tenant, offset=offset, limit=page_size, fields=["doc_id", "entity_ids"]
        )
        links = {str(p["doc_id"]): tuple(sorted(p.get("entity_ids") or ())) for p in payloads}
        counts = await _passage_counts(store, tenant, list(links))
        docs = tuple(
            StoredDocument(d, counts.get(d, (0, ""))[0], True, e, counts.get(d, (0, ""))[1])
            for d, e in links.items()
        )
        token = _ARTICLE_PHASE + after if after is not None else _ORPHAN_PHASE
        return DocumentPage(docs, token)
    if not page_token.startswith(_ORPHAN_PHASE):
        raise InvalidArgument("is not a token of this listing", field="page_token")
    offset = _offset(page_token, _ORPHAN_PHASE)
    payloads, after = await store.payload_page(
        "passages", tenant, offset=offset, limit=page_size, fields=["doc_id"]
    )
    seen = list(dict.fromkeys(str(p["doc_id"]) for p in payloads))
    with_article: set[str] = set()
    if seen:
        articles, _ = await store.payload_page(
            "articles", tenant, offset=None, limit=len(seen), fields=["doc_id"], doc_ids=seen
        )
        with_article = {str(p["doc_id"]) for p in articles}
    lone = [d for d in seen if d not in with_article]
    counts = await _passage_counts(store, tenant, lone)
    docs = tuple(StoredDocument(d, counts[d][0], False, (), counts[d][1]) for d in lone)
    return DocumentPage(docs, _ORPHAN_PHASE + after if after is not None else "")


# -- qdrant-edge: the embedded default ------------------------------------------


def _uuid(point_id: object) -> uuid.UUID:
    """A point id as the engine returns it (a UUID) or as it was written (its
    string). Every point id here is a UUID5 (``point_id``); an integer id would
    be refused."""
    return point_id if isinstance(point_id, uuid.UUID) else uuid.UUID(str(point_id))


def _id_number(point_id: object) -> int:
    """A point id's 128-bit number: the key of the id table (an int hashes in C,
    a UUID in Python, and a search looks up a hundred of them). An integer
    point id is refused as ``_uuid`` refuses it."""
    return _uuid(point_id).int


def _edge_filter(c: _Conditions) -> qe.Filter:
    must: list[qe.FieldCondition | qe.Filter] = [
        qe.FieldCondition("tenant", match=qe.MatchValue(c.tenant))
    ]
    for name, values in c.keywords.items():
        must.append(qe.FieldCondition(name, match=qe.MatchAny(values)))
    if c.doc_ids:
        must.append(qe.FieldCondition("doc_id", match=qe.MatchAny(c.doc_ids)))
    if c.published_from is not None or c.published_to is not None:
        window = qe.RangeFloat(gte=c.published_from, lte=c.published_to)
        must.append(qe.FieldCondition(DATE_FIELD, range=window))
    return qe.Filter(must=list(must))


def _edge_tenant_filter(tenant: str, doc_ids: Sequence[str] = ()) -> qe.Filter:
    must = [qe.FieldCondition("tenant", match=qe.MatchValue(tenant))]
    if doc_ids:
        must.append(qe.FieldCondition("doc_id", match=qe.MatchAny(list(doc_ids))))
    return qe.Filter(must=list(must))


class EdgeVectorStore:
    """Qdrant's embedded engine: one on-disk shard per collection under ``path``.

    Qdrant Edge has no background optimizer: points land in an appendable
    segment that is searched by brute force (about 50 ms at 100,000 points)
    until ``optimize`` builds HNSW graphs. The store optimizes when a shard
    holds ``index_after`` or more unindexed points, after an upsert and at
    warm-up.

    qdrant-edge 0.9 holds the GIL while it optimizes, so the event loop stalls
    for the whole call. Segments are therefore capped at ``segment_points``
    and merged down to ``segments``: each optimize then builds a bounded graph
    (loadtest/bench_vectors.py: the longest stall at 100,000 passages fell
    from 24 s with Qdrant's defaults to about 9 s on 2 cores) while a search
    visits only a few graphs. Searches never see a half-built graph.
    """

    name = "edge"

    def __init__(
        self,
        path: Path,
        *,
        collection_prefix: str,
        dimension: int,
        hnsw: HnswParams | None = None,
        index_after: int = 10_000,
        segment_points: int = 50_000,
        segments: int = 4,
        key_cache: int = 250_000,
        inline_search_seconds: float = DEFAULT_BUDGET_SECONDS,
    ) -> None:
        self._path = Path(path)
        self._names = collection_names(collection_prefix)
        self._dimension = dimension
        self.hnsw = hnsw or HnswParams()
        self._index_after = index_after
        self._segment_points = segment_points
        self._segments = segments
        self._shards: dict[Kind, qe.EdgeShard] = {}
        self._optimizing = asyncio.Lock()
        self._changes_dir = self._path / changes_collection(collection_prefix)
        self._changes: qe.EdgeShard | None = None
        self._changes_opening = asyncio.Lock()
        # Point id -> (doc id, passage index), for searches that want ids only:
        # the engine reads a point's whole stored payload (text, headline
        # vector) even to return two of its fields, about 25 us a hit, while
        # the id alone costs nothing. A point id is a UUID5 of (tenant, doc id,
        # passage index), so an entry never goes stale; ids not seen yet (by
        # an upsert or an earlier search of this process) are read once. At
        # most ``key_cache`` entries (about 240 bytes each) are kept.
        # Keyed by the number of the engine's own id objects (UUIDs), so a
        # search looks its hits up without turning each id into a string.
        self._keys: dict[int, tuple[str, int]] = {}
        self._key_cache = key_cache
        # The engine holds the GIL through a search, so a thread gives it no
        # parallelism; a short one runs on the loop (attest.core.offload).
        # One offloader per kind of search: reading payloads costs several times more.
        self._searches: Offloaders[tuple[Kind, bool]] = Offloaders(inline_search_seconds)

    def _remember(self, entries: Iterable[tuple[uuid.UUID | str | int, str, int]]) -> None:
        """Adds (point id, doc id, passage index) entries; an int is an id's number."""
        for pid, doc_id, index in entries:
            self._keys[pid if isinstance(pid, int) else _id_number(pid)] = (doc_id, index)
        if len(self._keys) > self._key_cache:
            # Oldest first (insertion order); a dropped id is read again.
            for pid in list(itertools.islice(self._keys, len(self._keys) - self._key_cache)):
                del self._keys[pid]

    # -- lifecycle ---------------------------------------------------------------

    def _config(self) -> qe.EdgeConfig:
        vector_kb = self._dimension * 4 / 1024
        return qe.EdgeConfig(
            vectors=qe.EdgeVectorParams(size=self._dimension, distance=qe.Distance.Cosine),
            hnsw_config=qe.HnswIndexConfig(
                m=self.hnsw.m,
                ef_construct=self.hnsw.ef_construct,
                # Below this many KB of matching vectors a filtered search
                # scores the matches exactly instead of walking the graph.
                full_scan_threshold=10_000,
            ),
            optimizers=qe.EdgeOptimizersConfig(
                indexing_threshold=max(1, math.ceil(self._index_after * vector_kb)),
                max_segment_size=max(1, math.ceil(self._segment_points * vector_kb)),
                default_segment_number=self._segments,
            ),
        )

    def _open(self, kind: Kind) -> qe.EdgeShard:
        directory = self._path / self._names[kind]
        config = self._config()
        try:
            if (directory / "edge_config.json").is_file():
                shard = qe.EdgeShard.load(str(directory), config)
            else:
                directory.mkdir(parents=True, exist_ok=True)
                shard = qe.EdgeShard.create(str(directory), config)
        except Exception as exc:
            text = str(exc)
            if "WouldBlock" in text:
                raise FailedPrecondition(
                    f"vector store {directory} is open in another process"
                ) from exc
            if "incompatible" in text.lower():
                raise FailedPrecondition(
                    f"vector store {directory} was created with other vector settings "
                    f"(this service uses dimension {self._dimension}): {text}"
                ) from exc
            raise
        present = set(shard.info().payload_schema)
        for name, schema in self._index_schema().items():
            if name not in present:
                shard.update(qe.UpdateOperation.create_field_index(name, schema))
        return shard

    @staticmethod
    def _index_schema() -> dict[str, qe.PayloadSchemaType | qe.PayloadSchemaParams]:
        schema: dict[str, qe.PayloadSchemaType | qe.PayloadSchemaParams] = {
            "tenant": qe.KeywordIndexParams(is_tenant=True),
            "doc_id": qe.PayloadSchemaType.Keyword,
            **{f.name: qe.PayloadSchemaType.Keyword for f in KEYWORD_FIELDS},
            DATE_FIELD: qe.IntegerIndexParams(lookup=False, range=True),
        }
        return schema

    async def warm_up(self) -> None:
        if self._shards:
            return
        try:
            for kind in KINDS:
                self._shards[kind] = await asyncio.to_thread(self._open, kind)
        except Exception as exc:
            await self.close()
            raise self._translate(exc, "open") from exc
        for kind in KINDS:
            await self._maybe_optimize(kind)
        log.info("opened edge vector store %s", self._path)

    async def close(self) -> None:
        async with self._optimizing:  # a graph being built finishes first
            shards, self._shards = self._shards, {}
        named = [(self._names[kind], shard) for kind, shard in shards.items()]
        changes, self._changes = self._changes, None
        if changes is not None:
            named.append((self._changes_dir.name, changes))
        for name, shard in named:
            try:
                await asyncio.to_thread(_flush_and_close, shard)
            except Exception as exc:  # noqa: BLE001 - closing goes on; the failure is logged
                log.error("closing edge shard %s failed: %r", name, exc)

    # -- helpers -----------------------------------------------------------------

    def _shard(self, kind: Kind) -> qe.EdgeShard:
        if kind not in KINDS:
            raise InvalidArgument(f"unknown collection kind {kind!r}", field="kind")
        shard = self._shards.get(kind)
        if shard is None:
            raise FailedPrecondition("the vector store is not open; call warm_up() first")
        return shard

    def _translate(self, exc: Exception, action: str) -> AttestError:
        if isinstance(exc, AttestError):
            return exc
        log.error("edge vector store %s failed: %r", action, exc)
        return Internal(f"edge vector store {action} failed")

    async def _run(self, action: str, fn: Callable[[], T]) -> T:
        try:
            return await asyncio.to_thread(fn)
        except Exception as exc:
            raise self._translate(exc, action) from exc

    async def _maybe_optimize(self, kind: Kind) -> None:
        status = await self.index_status(kind)
        if status.points - status.indexed_vectors >= self._index_after:
            await self.optimize(kind)

    async def index_status(self, kind: Kind) -> IndexStatus:
        info = await self._run("info", self._shard(kind).info)
        return IndexStatus(info.points_count, info.indexed_vectors_count, info.segments_count)

    async def optimize(self, kind: Kind | None = None) -> None:
        """Build the HNSW graphs of unindexed segments (all collections when None)."""
        async with self._optimizing:
            for k in (kind,) if kind else KINDS:
                await self._run("optimize", self._shard(k).optimize)

    # -- operations ----------------------------------------------------------------

    async def upsert(self, kind: Kind, tenant: str, points: Sequence[Point]) -> None:
        _check_tenant(tenant)
        shard = self._shard(kind)
        ids = [point_id(tenant, p.doc_id, p.passage_index) for p in points]
        edge_points = [
            qe.Point(
                pid, _check_vector(p.vector, self._dimension), _stored_payload(kind, tenant, p)
            )
            for pid, p in zip(ids, points, strict=True)
        ]
        # Small batches let the event loop run between them: the binding
        # holds the GIL for a whole update.
        for batch in _batches(edge_points, _UPSERT_BATCH):
            op = qe.UpdateOperation.upsert_points(list(batch))
            await self._run("upsert", functools.partial(shard.update, op))
        self._remember((pid, p.doc_id, p.passage_index) for pid, p in zip(ids, points, strict=True))
        if edge_points:
            await self._maybe_optimize(kind)

    async def delete_documents(self, tenant: str, doc_ids: Sequence[str]) -> int:
        _check_tenant(tenant)
        ids = _check_doc_ids(doc_ids)
        if not ids:
            return 0
        flt = _edge_tenant_filter(tenant, ids)
        articles = self._shard("articles")
        existed = await self._run(
            "count", functools.partial(articles.count, qe.CountRequest(exact=True, filter=flt))
        )
        op = qe.UpdateOperation.delete_points_by_filter(flt)
        for kind in KINDS:
            await self._run("delete", functools.partial(self._shard(kind).update, op))
        return existed

    async def search(
        self,
        kind: Kind,
        vector: npt.NDArray[np.float32],
        limit: int,
        flt: VectorFilter,
        ids_only: bool = False,
    ) -> list[ScoredPoint]:
        if limit < 1:
            raise InvalidArgument("must be at least 1", field="limit")
        request = qe.QueryRequest(
            query=qe.Query.Nearest(_check_vector(vector, self._dimension)),
            limit=limit,
            filter=_edge_filter(_conditions(flt)),
            params=qe.SearchParams(hnsw_ef=max(self.hnsw.ef, limit)),
            with_payload=False if ids_only else qe.PayloadSelector.Exclude(list(NOT_IN_HITS)),
        )
        shard = self._shard(kind)
        try:
            hits = await self._searches.run(
                (kind, ids_only), functools.partial(shard.query, request)
            )
        except Exception as exc:
            raise self._translate(exc, "search") from exc
        if not ids_only:
            return [_scored(h.payload, h.score) for h in hits]
        ids = [_id_number(h.id) for h in hits]
        # This search's keys, read from the table once each before it may drop any.
        known = self._keys
        keys: dict[int, tuple[str, int]] = {}
        unknown: list[qe.PointId] = []
        for pid in ids:
            key = known.get(pid)
            if key is None:
                unknown.append(str(uuid.UUID(int=pid)))
            else:
                keys[pid] = key
        if unknown:
            records = await self._run(
                "retrieve",
                functools.partial(
                    shard.retrieve, unknown, qe.PayloadSelector.Include(list(ID_FIELDS)), False
                ),
            )
            read = {
                _id_number(r.id): (str(r.payload["doc_id"]), int(r.payload["passage_index"]))
                for r in records
                if r.payload
            }
            keys |= read
            self._remember((pid, doc_id, index) for pid, (doc_id, index) in read.items())
        out = []
        for pid, hit in zip(ids, hits, strict=True):
            key = keys.get(pid)
            if key is None:  # deleted between the search and the read
                continue
            payload = {"doc_id": key[0], "passage_index": key[1]}
            out.append(ScoredPoint(key[0], key[1], float(hit.score), payload))
        return out

    async def count(self, kind: Kind, tenant: str) -> int:
        _check_tenant(tenant)
        shard = self._shard(kind)
        request = qe.CountRequest(exact=True, filter=_edge_tenant_filter(tenant))
        return await self._run("count", functools.partial(shard.count, request))

    async def vectors(
        self, kind: Kind, tenant: str, keys: Sequence[tuple[str, int]]
    ) -> list[npt.NDArray[np.float32] | None]:
        ids = _point_ids(kind, tenant, keys)
        if not ids:
            return []
        shard = self._shard(kind)
        # Point ids are UUID5 of (tenant, doc_id, passage_index): another
        # tenant's points cannot be named.
        records = await self._run(
            "retrieve", functools.partial(shard.retrieve, list(dict.fromkeys(ids)), False, True)
        )
        return _in_order(ids, ((r.id, r.vector) for r in records))

    async def scroll(self, kind: Kind, tenant: str | None) -> AsyncIterator[Point]:
        if tenant is not None:
            _check_tenant(tenant)
        shard = self._shard(kind)
        flt = _edge_tenant_filter(tenant) if tenant is not None else None
        offset: Any = None
        while True:
            request = qe.ScrollRequest(
                offset=offset,
                limit=_SCROLL_PAGE,
                filter=flt,
                with_payload=True,
                with_vector=True,
            )
            records, offset = await self._run("scroll", functools.partial(shard.scroll, request))
            for record in records:
                yield _point_from(record.payload, record.vector)
            if offset is None:
                return

    async def payload_page(
        self,
        kind: Kind,
        tenant: str,
        *,
        offset: str | None,
        limit: int,
        fields: Sequence[str],
        doc_ids: Sequence[str] = (),
    ) -> tuple[list[dict[str, Any]], str | None]:
        _check_tenant(tenant)
        shard = self._shard(kind)
        request = qe.ScrollRequest(
            offset=offset,
            limit=limit,
            filter=_edge_tenant_filter(tenant, doc_ids),
            with_payload=list(fields),
            with_vector=False,
        )
        records, after = await self._run("scroll", functools.partial(shard.scroll, request))
        return [_read_payload(r.payload) for r in records], None if after is None else str(after)

    async def articles(self, tenant: str, doc_ids: Sequence[str]) -> list[Point]:
        ids = _point_ids("articles", tenant, [(d, ARTICLE_INDEX) for d in doc_ids])
        if not ids:
            return []
        shard = self._shard("articles")
        records = await self._run(
            "retrieve", functools.partial(shard.retrieve, list(dict.fromkeys(ids)), True, True)
        )
        return [_point_from(r.payload, r.vector) for r in records]

    # -- the change log ------------------------------------------------------------

    def _open_changes(self) -> qe.EdgeShard:
        config = qe.EdgeConfig(vectors=qe.EdgeVectorParams(size=1, distance=qe.Distance.Dot))
        if (self._changes_dir / "edge_config.json").is_file():
            shard = qe.EdgeShard.load(str(self._changes_dir), config)
        else:
            self._changes_dir.mkdir(parents=True, exist_ok=True)
            shard = qe.EdgeShard.create(str(self._changes_dir), config)
        if CHANGE_AT not in set(shard.info().payload_schema):
            schema = qe.IntegerIndexParams(lookup=False, range=True)
            shard.update(qe.UpdateOperation.create_field_index(CHANGE_AT, schema))
        return shard

    async def _changes_shard(self) -> qe.EdgeShard:
        self._shard("articles")  # open, or a clear error
        async with self._changes_opening:
            if self._changes is None:
                self._changes = await self._run("open", self._open_changes)
            return self._changes

    async def record_changes(
        self, tenant: str, doc_ids: Sequence[str], *, writer: str, at_us: int
    ) -> None:
        ids = _check_changes(tenant, doc_ids)
        if not ids:
            return
        shard = await self._changes_shard()
        points = [
            qe.Point(str(uuid.uuid4()), [1.0], _change_payload(tenant, d, writer, at_us))
            for d in ids
        ]
        for batch in _batches(points, _UPSERT_BATCH):
            op = qe.UpdateOperation.upsert_points(list(batch))
            await self._run("change log append", functools.partial(shard.update, op))

    async def changes_since(self, at_us: int) -> list[Change]:
        shard = await self._changes_shard()
        flt = qe.Filter(must=[qe.FieldCondition(CHANGE_AT, range=qe.RangeFloat(gte=at_us))])
        out: list[Change] = []
        offset: Any = None
        while True:
            request = qe.ScrollRequest(
                offset=offset, limit=_SCROLL_PAGE, filter=flt, with_payload=True, with_vector=False
            )
            records, offset = await self._run(
                "change log read", functools.partial(shard.scroll, request)
            )
            out.extend(_change_from(r.id, r.payload) for r in records)
            if offset is None:
                return out

    async def prune_changes(self, before_us: int) -> None:
        shard = await self._changes_shard()
        flt = qe.Filter(must=[qe.FieldCondition(CHANGE_AT, range=qe.RangeFloat(lt=before_us))])
        op = qe.UpdateOperation.delete_points_by_filter(flt)
        await self._run("change log prune", functools.partial(shard.update, op))


def _flush_and_close(shard: qe.EdgeShard) -> None:
    shard.flush()
    shard.close()


# -- Qdrant server through qdrant-client ----------------------------------------------


def _client_filter(c: _Conditions) -> qm.Filter:
    must: list[qm.Condition] = [
        qm.FieldCondition(key="tenant", match=qm.MatchValue(value=c.tenant))
    ]
    for name, values in c.keywords.items():
        must.append(qm.FieldCondition(key=name, match=qm.MatchAny(any=values)))
    if c.doc_ids:
        must.append(qm.FieldCondition(key="doc_id", match=qm.MatchAny(any=c.doc_ids)))
    if c.published_from is not None or c.published_to is not None:
        window = qm.Range(gte=c.published_from, lte=c.published_to)
        must.append(qm.FieldCondition(key=DATE_FIELD, range=window))
    return qm.Filter(must=must)


def _client_tenant_filter(tenant: str, doc_ids: Sequence[str] = ()) -> qm.Filter:
    must: list[qm.Condition] = [qm.FieldCondition(key="tenant", match=qm.MatchValue(value=tenant))]
    if doc_ids:
        must.append(qm.FieldCondition(key="doc_id", match=qm.MatchAny(any=list(doc_ids))))
    return qm.Filter(must=must)


class QdrantVectorStore:
    """A Qdrant server by URL, or qdrant-client's local mode (``location``/``path``).

    Local mode searches by brute force in Python and ignores payload indexes;
    it is for tests, never for the embedded default.
    """

    name = "qdrant"

    def __init__(
        self,
        *,
        collection_prefix: str,
        dimension: int,
        url: str | None = None,
        api_key: SecretStr | str | None = None,
        location: str | None = None,
        path: Path | None = None,
        timeout_seconds: float = 5.0,
        hnsw: HnswParams | None = None,
    ) -> None:
        if sum(x is not None for x in (url, location, path)) != 1:
            raise ValueError("give exactly one of url, location or path")
        self._url = url
        self._api_key = SecretStr(api_key) if isinstance(api_key, str) else api_key
        self._location = location
        self._path = path
        self._local = url is None
        self._timeout = timeout_seconds
        self._names = collection_names(collection_prefix)
        self._dimension = dimension
        self.hnsw = hnsw or HnswParams()
        self._client: AsyncQdrantClient | None = None
        self._changes_name = changes_collection(collection_prefix)
        self._changes_ready = False
        self._changes_lock = asyncio.Lock()

    # -- the client edge -----------------------------------------------------------

    def translate(self, exc: BaseException, action: str) -> AttestError:
        """Map a qdrant-client exception to a typed error."""
        if isinstance(exc, AttestError):
            return exc
        where = f"qdrant {action}"
        source = exc.source if isinstance(exc, ResponseHandlingException) else exc
        if isinstance(exc, ResourceExhaustedResponse):
            return ResourceExhausted(f"{where}: qdrant is overloaded; retry later")
        if isinstance(source, httpx.TimeoutException | TimeoutError):
            left = remaining_seconds()
            if left is not None and left <= 0.05:
                return DeadlineExceeded(f"{where} did not finish before the deadline")
            return Unavailable(f"{where} timed out")
        if isinstance(source, httpx.TransportError | ConnectionError):
            return Unavailable(f"{where}: qdrant is unreachable")
        if isinstance(exc, UnexpectedResponse):
            status = exc.status_code
            if status == 429:
                return ResourceExhausted(f"{where}: qdrant is overloaded; retry later")
            if status in (502, 503, 504):
                return Unavailable(f"{where}: qdrant answered {status}")
            log.error("%s failed: %s", where, exc)
            return Internal(f"{where} failed with status {status}")
        log.error("%s failed: %r", where, exc)
        return Internal(f"{where} failed")

    def _c(self) -> AsyncQdrantClient:
        if self._client is None:
            raise FailedPrecondition("the vector store is not open; call warm_up() first")
        return self._client

    def _collection(self, kind: Kind) -> str:
        if kind not in KINDS:
            raise InvalidArgument(f"unknown collection kind {kind!r}", field="kind")
        return self._names[kind]

    async def _call(
        self, action: str, fn: Callable[P, Awaitable[R]], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """One client call, bounded by the timeout and the request's deadline."""
        try:
            async with asyncio.timeout(budget(self._timeout)):
                return await fn(*args, **kwargs)
        except AttestError:
            raise
        except Exception as exc:
            raise self.translate(exc, action) from exc

    # -- lifecycle ---------------------------------------------------------------

    def _make_client(self) -> AsyncQdrantClient:
        if self._url is not None:
            return AsyncQdrantClient(
                url=self._url,
                api_key=self._api_key.get_secret_value() if self._api_key else None,
                timeout=max(1, math.ceil(self._timeout)),
                # The version probe is a blocking request on a thread of its own.
                check_compatibility=False,
            )
        if self._path is not None:
            return AsyncQdrantClient(path=str(self._path))
        return AsyncQdrantClient(location=self._location)

    async def warm_up(self) -> None:
        if self._client is not None:
            return
        # Local mode with a path reads every stored point here.
        self._client = await asyncio.to_thread(self._make_client)
        try:
            for kind in KINDS:
                await self._ensure_collection(self._names[kind])
        except BaseException:
            await self.close()
            raise
        log.info("qdrant vector store ready (%s)", self._url or self._path or self._location)

    async def _ensure_collection(self, name: str) -> None:
        client = self._c()
        if await self._call("collection check", client.collection_exists, name):
            info = await self._call("collection info", client.get_collection, name)
            vectors = info.config.params.vectors
            size = vectors.size if isinstance(vectors, qm.VectorParams) else None
            if size != self._dimension:
                raise FailedPrecondition(
                    f"qdrant collection {name} holds vectors of size {size}, "
                    f"this service uses {self._dimension}"
                )
        else:
            try:
                await self._call(
                    "collection creation",
                    client.create_collection,
                    name,
                    vectors_config=qm.VectorParams(
                        size=self._dimension, distance=qm.Distance.COSINE
                    ),
                    hnsw_config=qm.HnswConfigDiff(
                        m=self.hnsw.m, ef_construct=self.hnsw.ef_construct
                    ),
                )
                log.info("created qdrant collection %s", name)
            except Internal:
                # Another replica may have created it between the check and here.
                if not await self._call("collection check", client.collection_exists, name):
                    raise
        if self._local:
            return  # local mode has no payload indexes (and warns about each)
        schemas: dict[str, qm.PayloadSchemaType | qm.PayloadSchemaParams] = {
            "tenant": qm.KeywordIndexParams(type=qm.KeywordIndexType.KEYWORD, is_tenant=True),
            "doc_id": qm.PayloadSchemaType.KEYWORD,
            **{f.name: qm.PayloadSchemaType.KEYWORD for f in KEYWORD_FIELDS},
            DATE_FIELD: qm.IntegerIndexParams(
                type=qm.IntegerIndexType.INTEGER, lookup=False, range=True
            ),
        }
        for key, schema in schemas.items():
            await self._call(
                "payload index creation",
                client.create_payload_index,
                name,
                field_name=key,
                field_schema=schema,
                wait=True,
            )

    async def close(self) -> None:
        client, self._client = self._client, None
        self._changes_ready = False
        if client is not None:
            try:
                await client.close()
            except Exception as exc:  # noqa: BLE001 - closing goes on; the failure is logged
                log.warning("closing the qdrant client failed: %r", exc)

    # -- operations ----------------------------------------------------------------

    async def upsert(self, kind: Kind, tenant: str, points: Sequence[Point]) -> None:
        _check_tenant(tenant)
        name = self._collection(kind)
        structs = [
            qm.PointStruct(
                id=point_id(tenant, p.doc_id, p.passage_index),
                vector=_check_vector(p.vector, self._dimension),
                payload=_stored_payload(kind, tenant, p),
            )
            for p in points
        ]
        client = self._c()
        for batch in _batches(structs, _UPSERT_BATCH):
            await self._call("upsert", client.upsert, name, points=list(batch), wait=True)

    async def delete_documents(self, tenant: str, doc_ids: Sequence[str]) -> int:
        _check_tenant(tenant)
        ids = _check_doc_ids(doc_ids)
        if not ids:
            return 0
        client = self._c()
        flt = _client_tenant_filter(tenant, ids)
        result = await self._call(
            "count", client.count, self._names["articles"], count_filter=flt, exact=True
        )
        for kind in KINDS:
            await self._call(
                "delete",
                client.delete,
                self._names[kind],
                points_selector=qm.FilterSelector(filter=flt),
                wait=True,
            )
        return int(result.count)

    async def search(
        self,
        kind: Kind,
        vector: npt.NDArray[np.float32],
        limit: int,
        flt: VectorFilter,
        ids_only: bool = False,
    ) -> list[ScoredPoint]:
        if limit < 1:
            raise InvalidArgument("must be at least 1", field="limit")
        name = self._collection(kind)
        query = _check_vector(vector, self._dimension)
        query_filter = _client_filter(_conditions(flt))
        client = self._c()
        response = await self._call(
            "search",
            client.query_points,
            name,
            query=query,
            query_filter=query_filter,
            limit=limit,
            with_payload=list(ID_FIELDS)
            if ids_only
            else qm.PayloadSelectorExclude(exclude=list(NOT_IN_HITS)),
            # Local mode searches exactly and warns about search params.
            search_params=None
            if self._local
            else qm.SearchParams(hnsw_ef=max(self.hnsw.ef, limit)),
        )
        return [_scored(p.payload, p.score) for p in response.points]

    async def count(self, kind: Kind, tenant: str) -> int:
        _check_tenant(tenant)
        name = self._collection(kind)
        client = self._c()
        result = await self._call(
            "count", client.count, name, count_filter=_client_tenant_filter(tenant), exact=True
        )
        return int(result.count)

    async def vectors(
        self, kind: Kind, tenant: str, keys: Sequence[tuple[str, int]]
    ) -> list[npt.NDArray[np.float32] | None]:
        ids = _point_ids(kind, tenant, keys)
        if not ids:
            return []
        name = self._collection(kind)
        client = self._c()
        records = await self._call(
            "retrieve",
            client.retrieve,
            name,
            ids=list(dict.fromkeys(ids)),
            with_payload=False,
            with_vectors=True,
        )
        return _in_order(ids, ((r.id, r.vector) for r in records))

    async def scroll(self, kind: Kind, tenant: str | None) -> AsyncIterator[Point]:
        if tenant is not None:
            _check_tenant(tenant)
        name = self._collection(kind)
        client = self._c()
        flt = _client_tenant_filter(tenant) if tenant is not None else None
        offset: Any = None
        while True:
            records, offset = await self._call(
                "scroll",
                client.scroll,
                name,
                scroll_filter=flt,
                limit=_SCROLL_PAGE,
                offset=offset,
                with_payload=True,
                with_vectors=True,
            )
            for record in records:
                yield _point_from(record.payload, record.vector)
            if offset is None:
                return

    async def payload_page(
        self,
        kind: Kind,
        tenant: str,
        *,
        offset: str | None,
        limit: int,
        fields: Sequence[str],
        doc_ids: Sequence[str] = (),
    ) -> tuple[list[dict[str, Any]], str | None]:
        _check_tenant(tenant)
        name = self._collection(kind)
        client = self._c()
        records, after = await self._call(
            "scroll",
            client.scroll,
            name,
            scroll_filter=_client_tenant_filter(tenant, doc_ids),
            limit=limit,
            offset=offset,
            with_payload=list(fields),
            with_vectors=False,
        )
        return [_read_payload(r.payload) for r in records], None if after is None else str(after)

    async def articles(self, tenant: str, doc_ids: Sequence[str]) -> list[Point]:
        ids = _point_ids("articles", tenant, [(d, ARTICLE_INDEX) for d in doc_ids])
        if not ids:
            return []
        client = self._c()
        records = await self._call(
            "retrieve",
            client.retrieve,
            self._names["articles"],
            ids=list(dict.fromkeys(ids)),
            with_payload=True,
            with_vectors=True,
        )
        return [_point_from(r.payload, r.vector) for r in records]

    # -- the change log ------------------------------------------------------------

    async def _changes_collection(self) -> str:
        client = self._c()
        async with self._changes_lock:
            if self._changes_ready:
                return self._changes_name
            name = self._changes_name
            if not await self._call("collection check", client.collection_exists, name):
                try:
                    await self._call(
                        "collection creation",
                        client.create_collection,
                        name,
                        vectors_config=qm.VectorParams(size=1, distance=qm.Distance.DOT),
                    )
                except Internal:
                    # Another replica may have created it between the check and here.
                    if not await self._call("collection check", client.collection_exists, name):
                        raise
            if not self._local:
                await self._call(
                    "payload index creation",
                    client.create_payload_index,
                    name,
                    field_name=CHANGE_AT,
                    field_schema=qm.IntegerIndexParams(
                        type=qm.IntegerIndexType.INTEGER, lookup=False, range=True
                    ),
                    wait=True,
                )
            self._changes_ready = True
            return name

    async def record_changes(
        self, tenant: str, doc_ids: Sequence[str], *, writer: str, at_us: int
    ) -> None:
        ids = _check_changes(tenant, doc_ids)
        if not ids:
            return
        name = await self._changes_collection()
        structs = [
            qm.PointStruct(
                id=str(uuid.uuid4()),
                vector=[1.0],
                payload=_change_payload(tenant, d, writer, at_us),
            )
            for d in ids
        ]
        client = self._c()
        for batch in _batches(structs, _UPSERT_BATCH):
            await self._call(
                "change log append", client.upsert, name, points=list(batch), wait=True
            )

    async def changes_since(self, at_us: int) -> list[Change]:
        name = await self._changes_collection()
        client = self._c()
        flt = qm.Filter(must=[qm.FieldCondition(key=CHANGE_AT, range=qm.Range(gte=at_us))])
        out: list[Change] = []
        offset: Any = None
        while True:
            records, offset = await self._call(
                "change log read",
                client.scroll,
                name,
                scroll_filter=flt,
                limit=_SCROLL_PAGE,
                offset=offset,
                with_payload=True,
                with_vectors=False,
            )
            out.extend(_change_from(r.id, r.payload) for r in records)
            if offset is None:
                return out

    async def prune_changes(self, before_us: int) -> None:
        name = await self._changes_collection()
        client = self._c()
        flt = qm.Filter(must=[qm.FieldCondition(key=CHANGE_AT, range=qm.Range(lt=before_us))])
        await self._call(
            "change log prune",
            client.delete,
            name,
            points_selector=qm.FilterSelector(filter=flt),
            wait=True,
        )


def create_store(
    kind: Literal["edge", "qdrant"],
    *,
    path: Path | None,
    url: str | None,
    api_key: SecretStr | str | None,
    collection_prefix: str,
    dimension: int,
    timeout_seconds: float,
    hnsw: HnswParams | None = None,
    inline_search_seconds: float = DEFAULT_BUDGET_SECONDS,
) -> VectorStore:
    """The configured store; cheap (nothing is opened before ``warm_up``)."""
    if kind == "edge":
        if path is None:
            raise FailedPrecondition("the edge vector store needs a data directory (path)")
        return EdgeVectorStore(
            path,
            collection_prefix=collection_prefix,
            dimension=dimension,
            hnsw=hnsw,
            inline_search_seconds=inline_search_seconds,
        )
    if kind == "qdrant":
        if url is None:
            raise FailedPrecondition("the qdrant vector store needs a server url")
        return QdrantVectorStore(
            collection_prefix=collection_prefix,
            dimension=dimension,
            url=url,
            api_key=api_key,
            timeout_seconds=timeout_seconds,
            hnsw=hnsw,
        )
    raise FailedPrecondition(f"unknown vector store {kind!r}")
