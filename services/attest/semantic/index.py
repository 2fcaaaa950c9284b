"""The semantic index: dense vectors in Qdrant plus knowledge-graph path scores.

Transport-free: the gRPC servicer and the pipeline both call this class.
Articles and passages live in two vector collections (``<prefix>-articles``,
``<prefix>-passages``). An article's vector embeds its headline with its
summary (or, without one, the start of its body); the headline alone is kept
as a separate vector in the article's payload for KG scoring. A passage's
payload keeps its ``page`` (a point written before pages were kept has none:
page 0). The KG scorer
keeps its article table in memory and rebuilds it from the article collection
at start-up, so the graph needs no database of its own.

Replicas over one Qdrant server (``kg_sync_seconds`` above 0): each write or
delete of articles also appends (tenant, doc_id, time, writer) entries to the
store's change log, after the articles themselves are written. Every
``kg_sync_seconds``, in the background, a replica reads the entries stamped
since its cursor, less ``KG_SYNC_OVERLAP_US`` (writers' clocks may lag one
another, an append may land late; entries already applied are skipped by
id), and for every article named by another writer reads what the store
holds now: present, it is restored as at start-up; absent, it leaves the
table. Applying the store's current state, not the logged operation, makes
the order of entries irrelevant. So a write is in every replica's KG scores
at most ``kg_sync_seconds`` plus the time of one sync (milliseconds) after
it returned, and queries never wait for the store. Entries older than
``KG_CHANGE_RETENTION_US`` are pruned; a replica that has not synced for that
long (the store was unreachable) rescans the whole article collection
instead. A full rescan on every change would not do: at 20,000 articles it
takes 6.7 s on two cores, against 8 ms for a sync applying 100 entries.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np

from attest.core.cache import VectorMemo
from attest.core.document import (
    KEYWORD_FIELDS,
    Keywords,
    keywords_from_stored,
    keywords_to_stored,
)
from attest.core.errors import AttestError, InvalidArgument, Unavailable
from attest.knowledge.graph import KnowledgeGraph, load_graph
from attest.retrieval.fusion import Ranked, reciprocal_rank_fusion
from attest.semantic.embedding import Embedder
from attest.semantic.kg_scoring import Article, ArticleScore, KgFilter, KgScorer, NodeScore
from attest.semantic.models import (
    IndexResult,
    Level,
    Mode,
    SemanticCounts,
    SemanticDoc,
    SemanticHit,
    SemanticQuery,
    Vector,
    passage_text,
)
from attest.semantic.settings import SemanticSettings
from attest.semantic.store import (
    DocumentPage,
    Point,
    ScoredPoint,
    VectorFilter,
    VectorStore,
    create_store,
    list_documents,
)

log = logging.getLogger(__name__)

ARTICLES: Literal["articles"] = "articles"
PASSAGES: Literal["passages"] = "passages"
# How much of a body stands in for a missing summary in the article vector;
# MiniLM reads 256 word pieces, about this many characters.
SUMMARY_FALLBACK_CHARS = 1200
# Candidates each signal contributes before fusion in the fused mode.
FUSION_DEPTH = 100
# How far before its cursor a sync rereads the change log: the clock skew
# between replicas plus the time an append may take (the store's timeout is
# 10 s) must stay below it.
KG_SYNC_OVERLAP_US = 30_000_000
# How long change-log entries are kept, and how often a replica prunes them.
KG_CHANGE_RETENTION_US = 3_600_000_000
KG_PRUNE_EVERY_SECONDS = 60.0
# Articles read back per store call while applying the change log.
KG_SYNC_BATCH = 512


@dataclass(frozen=True)
class _Meta:
    title: str
    text: str
    source_url: str
    published_at: datetime | None
    keywords: Keywords
    passage_count: int

    @property
    def entity_ids(self) -> tuple[str, ...]:
        return self.keywords.get("entity_ids", ())


# A folded keyword field's values as written, next to the folded ones the filters match.
DISPLAY = "_display"


def keyword_payload(keywords: Keywords) -> dict[str, list[str]]:
    """A document's keyword fields as a point's payload: each a list, a folded
    field's values case-folded with the values as written under ``<name>_display``."""
    payload: dict[str, list[str]] = keywords_to_stored(keywords, fold=True)
    for f in KEYWORD_FIELDS:
        if f.folded:
            payload[f.name + DISPLAY] = list(keywords.get(f.name, ()))
    return payload


def payload_keywords(payload: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """The keyword fields of a point's payload, as written (see ``keyword_payload``)."""
    plain, shown = keywords_from_stored(payload), keywords_from_stored(payload, DISPLAY)
    out = {}
    for f in KEYWORD_FIELDS:
        values = shown.get(f.name) if f.folded else plain.get(f.name)
        if values:
            out[f.name] = values
    return out


def article_text(doc: SemanticDoc) -> str:
    return f"{doc.title}\n{doc.summary or doc.body[:SUMMARY_FALLBACK_CHARS]}".strip()


def _epoch(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


def _from_epoch(value: Any) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(int(value), tz=UTC)


def _now_us() -> int:
    return time.time_ns() // 1000


class SemanticIndex:
    def __init__(
        self,
        settings: SemanticSettings,
        *,
        embedder: Embedder | None = None,
        store: VectorStore | None = None,
        graph: KnowledgeGraph | None = None,
    ) -> None:
        self.settings = settings
        self.embedder = embedder or Embedder(
            settings.embedding_model,
            device=settings.embedding_device,
            batch_size=settings.embedding_batch_size,
            backend=settings.embedding_backend,
            query_batch_size=settings.query_batch_size,
        )
        self._store = store
        self._graph = graph
        self._scorer: KgScorer | None = None
        self._meta: dict[tuple[str, str], _Meta] = {}
        self._org_vectors: dict[str, Vector] = {}
        self._write_lock = asyncio.Lock()
        self._org_memo = VectorMemo(settings.data_dir / "cache" / "organization-vectors.npz")
        # Change-log sync (kg_sync_seconds > 0): this process's id as a writer,
        # the wall time its last successful sync started, the change-log
        # cursor, and the ids of entries applied within the overlap.
        self._writer = uuid.uuid4().hex
        self._sync_lock = asyncio.Lock()
        self._sync_task: asyncio.Task[None] | None = None
        self._synced_wall_us = 0
        self._cursor_us = 0
        self._applied: dict[str, int] = {}
        self._pruned_at = -math.inf

    # -- lifecycle -------------------------------------------------------------

    @property
    def store(self) -> VectorStore:
        if self._store is None:
            raise Unavailable("the vector store is not open")
        return self._store

    @property
    def scorer(self) -> KgScorer:
        if self._scorer is None:
            raise Unavailable("the semantic index is still starting")
        return self._scorer

    @property
    def graph(self) -> KnowledgeGraph:
        return self.scorer.graph

    async def warm_up(self) -> None:
        if self._scorer is not None:
            return
        await asyncio.to_thread(self.embedder.warm_up)
        dim = self.embedder.dimension
        if self._store is None:
            s = self.settings
            self._store = create_store(
                s.store,
                path=s.data_dir / "vectors",
                url=s.qdrant.url,
                api_key=s.qdrant.api_key.get_secret_value() if s.qdrant.api_key else None,
                collection_prefix=s.collection_prefix,
                dimension=dim,
                timeout_seconds=s.qdrant.timeout_seconds,
                inline_search_seconds=s.inline_search_ms / 1e3,
            )
        await self._store.warm_up()
        graph = self._graph
        if graph is None:
            graph = await asyncio.to_thread(load_graph, self.settings.graph_path)
        scorer = await asyncio.to_thread(
            KgScorer,
            graph,
            self.embedder.encode,
            top_n=self.settings.kg_top_n,
            node_weighting=self.settings.kg_node_weighting,
        )
        started, started_us = time.monotonic(), _now_us()
        restored = len(await self._scan(scorer))
        # Names of deleted articles leave the memo (and the disk).
        self._org_memo.retain(self._org_vectors)
        await self._warm_reads(scorer)
        self._scorer = scorer
        # Entries logged while the scan ran are read again by the first sync.
        self._cursor_us = self._synced_wall_us = started_us
        if self.settings.kg_sync_seconds > 0:
            self._sync_task = asyncio.create_task(self._sync_loop(started), name="kg-sync")
        log.info("semantic index ready: %d articles restored", restored)

    async def _warm_reads(self, scorer: KgScorer) -> None:
        """One query through the read path before SERVING, so that the first
        search pays nothing a later one does not: KG scoring's torch import and
        tensors (``KgScorer.warm_up``), the query batcher's threads and the
        model's first pass on one text, and the store's first filtered search."""
        try:
            await asyncio.to_thread(scorer.warm_up)
        except Exception as exc:
            raise Unavailable(f"knowledge-graph scoring failed to warm up: {exc}") from exc
        vector = np.asarray(await self.embedder.aencode_one("warm up"), dtype=np.float32)
        tenant = next((t for t, _ in self._meta), "default")
        await self.store.search(ARTICLES, vector, 1, VectorFilter(tenant=tenant))

    async def _scan(self, scorer: KgScorer) -> set[tuple[str, str]]:
        """Restore every stored article into ``scorer``; the (tenant, doc_id) restored."""
        seen: set[tuple[str, str]] = set()
        points: list[Point] = []
        async for point in self.store.scroll(ARTICLES, None):
            points.append(point)
            seen.add((str(point.payload["tenant"]), point.doc_id))
            if len(points) == 2048:
                self._restore_batch(points, scorer)
                points = []
        self._restore_batch(points, scorer)
        return seen

    async def close(self) -> None:
        task, self._sync_task = self._sync_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._store is not None:
            await self._store.close()

    # -- writes ----------------------------------------------------------------

    def _restore_batch(self, points: Sequence[Point], scorer: KgScorer) -> None:
        # The batch's organization names in one encode call (of names never seen
        # before: the memo keeps the others), not one call per article.
        names = [o for p in points for o in p.payload.get("organizations_display") or ()]
        missing = [o for o in dict.fromkeys(names) if o not in self._org_vectors]
        if missing:
            vectors = self._org_memo.vectors(missing, self.embedder.encode)
            self._org_vectors.update(zip(missing, vectors, strict=True))
        batch: dict[str, list[Article]] = {}
        for point in points:
            tenant, article = self._restore(point, scorer)
            batch.setdefault(tenant, []).append(article)
        for t, articles in batch.items():
            scorer.upsert(t, articles)

    def _restore(self, point: Point, scorer: KgScorer) -> tuple[str, Article]:
        p = point.payload
        tenant = str(p["tenant"])
        keywords = payload_keywords(p)
        entity_ids = tuple(e for e in keywords.get("entity_ids", ()) if scorer.known(e))
        organizations = keywords.get("organizations", ())
        meta = _Meta(
            title=p.get("title", ""),
            text=p.get("text", ""),
            source_url=p.get("source_url", ""),
            published_at=_from_epoch(p.get("published_at")),
            keywords=keywords,
            passage_count=int(p.get("passage_count", 0)),
        )
        self._meta[(tenant, point.doc_id)] = meta
        headline = np.asarray(p["headline_vector"], dtype=np.float32)
        return tenant, Article(
            doc_id=point.doc_id,
            entity_ids=entity_ids,
            headline=headline,
            summary=np.asarray(point.vector, dtype=np.float32),
            organizations=organizations,
            organization_vectors=self._organization_vectors(organizations),
            published_at=meta.published_at,
            keywords=keywords,
        )

    def _organization_vectors_of(self, docs: Sequence[SemanticDoc]) -> list[Vector | None]:
        # Names not seen before are embedded in one call for the whole batch.
        self._embed_organizations([o for d in docs for o in d.organizations])
        return [self._organization_vectors(d.organizations) for d in docs]

    def _embed_organizations(self, organizations: Sequence[str]) -> None:
        missing = [o for o in dict.fromkeys(organizations) if o not in self._org_vectors]
        if missing:
            for name, vec in zip(missing, self.embedder.encode(missing), strict=True):
                self._org_vectors[name] = vec

    def _organization_vectors(self, organizations: Sequence[str]) -> Vector | None:
        if not organizations:
            return None
        self._embed_organizations(organizations)
        return np.vstack([self._org_vectors[o] for o in organizations])

    def validate_entities(self, entity_ids: Sequence[str], field: str) -> None:
        for j, entity in enumerate(entity_ids):
            if not self.scorer.known(entity):
                raise InvalidArgument(
                    f"unknown knowledge-graph entity {entity[:64]!r}", field=f"{field}[{j}]"
                )

    def _check_vector(self, vector: Vector, field: str) -> None:
        dim = self.scorer.dim
        if vector.shape != (dim,):
            raise InvalidArgument(
                f"has {vector.shape[0] if vector.ndim else 0} dimensions; "
                f"the model {self.embedder.name} has {dim}",
                field=field,
            )
        if not np.all(np.isfinite(vector)):
            raise InvalidArgument("contains NaN or infinite values", field=field)

    def _embed_batch(
        self, docs: Sequence[SemanticDoc]
    ) -> tuple[list[Vector], list[Vector], list[list[Vector]]]:
        """(article vectors, headline vectors, passage vectors) with one encode call."""
        texts: list[str] = []
        slots: list[tuple[str, int, int]] = []
        for i, doc in enumerate(docs):
            if doc.article_vector is None:
                slots.append(("article", i, -1))
                texts.append(article_text(doc))
            slots.append(("headline", i, -1))
            texts.append(doc.title or article_text(doc))
            for j, p in enumerate(doc.passages):
                if p.vector is None:
                    slots.append(("passage", i, j))
                    texts.append(passage_text(doc.title, p.text))
        encoded = self.embedder.encode(texts)
        articles: list[Vector | None] = [d.article_vector for d in docs]
        headlines: list[Vector | None] = [None] * len(docs)
        passages: list[list[Vector | None]] = [[p.vector for p in d.passages] for d in docs]
        for (kind, i, j), vec in zip(slots, encoded, strict=True):
            if kind == "article":
                articles[i] = vec
            elif kind == "headline":
                headlines[i] = vec
            else:
                passages[i][j] = vec
        return (
            [v for v in articles if v is not None],
            [v for v in headlines if v is not None],
            [[v for v in ps if v is not None] for ps in passages],
        )

    async def index(self, tenant: str, docs: Sequence[SemanticDoc]) -> IndexResult:
        for i, doc in enumerate(docs):
            self.validate_entities(doc.entity_ids, f"documents[{i}].document.entity_ids")
            if doc.article_vector is not None:
                self._check_vector(doc.article_vector, f"documents[{i}].article_vector")
            for j, p in enumerate(doc.passages):
                if p.vector is not None:
                    self._check_vector(p.vector, f"documents[{i}].passage_vectors[{j}]")
        article_vecs, headline_vecs, passage_vecs = await asyncio.to_thread(self._embed_batch, docs)
        org_vecs = await asyncio.to_thread(self._organization_vectors_of, docs)
        article_points: list[Point] = []
        passage_points: list[Point] = []
        articles: list[Article] = []
        shrunk: list[str] = []
        for doc, a_vec, h_vec, p_vecs, o_vecs in zip(
            docs, article_vecs, headline_vecs, passage_vecs, org_vecs, strict=True
        ):
            shared = {
                **keyword_payload(doc.keywords),
                "published_at": _epoch(doc.published_at),
                "title": doc.title,
                "source_url": doc.source_url,
            }
            text = doc.summary or doc.body[:SUMMARY_FALLBACK_CHARS]
            article_points.append(
                Point(
                    doc_id=doc.id,
                    passage_index=-1,
                    vector=a_vec,
                    payload={
                        **shared,
                        "text": text,
                        "passage_count": len(doc.passages),
                        "headline_vector": h_vec.tolist(),
                    },
                )
            )
            for p, vec in zip(doc.passages, p_vecs, strict=True):
                passage_points.append(
                    Point(
                        doc_id=doc.id,
                        passage_index=p.index,
                        vector=vec,
                        payload={**shared, "text": p.text, "page": p.page},
                    )
                )
            old = self._meta.get((tenant, doc.id))
            if old is not None and old.passage_count > len(doc.passages):
                shrunk.append(doc.id)
            articles.append(
                Article(
                    doc_id=doc.id,
                    entity_ids=doc.entity_ids,
                    headline=h_vec,
                    summary=a_vec,
                    organizations=doc.organizations,
                    organization_vectors=o_vecs,
                    published_at=doc.published_at,
                    keywords=doc.keywords,
                )
            )
        async with self._write_lock:
            if shrunk:
                # Fewer passages than before: drop the old ones first, then write.
                await self.store.delete_documents(tenant, shrunk)
            await self.store.upsert(PASSAGES, tenant, passage_points)
            await self.store.upsert(ARTICLES, tenant, article_points)
            self.scorer.upsert(tenant, articles)
            for doc in docs:
                self._meta[(tenant, doc.id)] = _Meta(
                    title=doc.title,
                    text=doc.summary or doc.body[:SUMMARY_FALLBACK_CHARS],
                    source_url=doc.source_url,
                    published_at=doc.published_at,
                    keywords=doc.keywords,
                    passage_count=len(doc.passages),
                )
            await self._record(tenant, [d.id for d in docs])
        return IndexResult(
            documents=len(docs),
            passages=len(passage_points),
            kg_links=sum(len(d.entity_ids) + len(d.organizations) for d in docs),
        )

    async def delete(self, tenant: str, doc_ids: Sequence[str]) -> int:
        async with self._write_lock:
            deleted = await self.store.delete_documents(tenant, doc_ids)
            self.scorer.delete(tenant, doc_ids)
            for doc_id in doc_ids:
                self._meta.pop((tenant, doc_id), None)
            await self._record(tenant, doc_ids)
        return deleted

    async def _record(self, tenant: str, doc_ids: Sequence[str]) -> None:
        # After the store and this replica's table: an entry another replica
        # reads names a write it can already see. A failure fails the request,
        # whose retry writes (and logs) again.
        if self.settings.kg_sync_seconds > 0 and doc_ids:
            await self.store.record_changes(tenant, doc_ids, writer=self._writer, at_us=_now_us())

    # -- replicas ------------------------------------------------------------------

    async def _sync_loop(self, started: float) -> None:
        # At a fixed rate: a write is read by the first sync that starts after
        # it, at most kg_sync_seconds later.
        every = self.settings.kg_sync_seconds
        while True:
            await asyncio.sleep(max(0.0, started + every - time.monotonic()))
            started = time.monotonic()
            try:
                await self.sync()
            except Exception:  # the loop must outlive any one failure
                log.exception("KG sync failed")

    async def sync(self) -> None:
        """Apply the articles other replicas wrote or deleted since the last sync
        (see the module docstring); a no-op with ``kg_sync_seconds`` 0. A store
        failure is logged and leaves the table as it was; the next sync tries
        again."""
        if self.settings.kg_sync_seconds <= 0 or self._scorer is None:
            return
        async with self._sync_lock:
            started, started_us = time.monotonic(), _now_us()
            try:
                if started_us - self._synced_wall_us > KG_CHANGE_RETENTION_US - KG_SYNC_OVERLAP_US:
                    # Entries this replica has not read may be pruned already.
                    await self._rescan(started_us)
                else:
                    await self._apply_changes()
            except AttestError as exc:
                log.warning("KG sync with the vector store failed; scores may lag: %s", exc)
                return
            # The cursor moved with the entries read (writers' clocks); this
            # replica's clock only tells when entries may have been pruned.
            self._synced_wall_us = started_us
            if started - self._pruned_at >= KG_PRUNE_EVERY_SECONDS:
                self._pruned_at = started
                try:
                    await self.store.prune_changes(started_us - KG_CHANGE_RETENTION_US)
                except AttestError as exc:
                    log.warning("pruning the KG change log failed: %s", exc)

    async def _apply_changes(self) -> None:
        changes = await self.store.changes_since(self._cursor_us - KG_SYNC_OVERLAP_US)
        fresh = [c for c in changes if c.id not in self._applied]
        wanted: dict[str, set[str]] = {}
        for c in fresh:
            if c.writer != self._writer:  # this replica applied its own writes as it made them
                wanted.setdefault(c.tenant, set()).add(c.doc_id)
        for tenant, doc_ids in wanted.items():
            ids = sorted(doc_ids)
            for lo in range(0, len(ids), KG_SYNC_BATCH):
                batch = ids[lo : lo + KG_SYNC_BATCH]
                async with self._write_lock:
                    points = await self.store.articles(tenant, batch)
                    self._restore_batch(points, self.scorer)
                    found = {p.doc_id for p in points}
                    gone = [d for d in batch if d not in found]
                    self.scorer.delete(tenant, gone)
                    for doc_id in gone:
                        self._meta.pop((tenant, doc_id), None)
        for c in fresh:
            self._applied[c.id] = c.at_us
            self._cursor_us = max(self._cursor_us, c.at_us)
        horizon = self._cursor_us - KG_SYNC_OVERLAP_US
        self._applied = {i: at for i, at in self._applied.items() if at >= horizon}
        if wanted:
            log.info(
                "KG sync: %d articles of other replicas applied",
                sum(len(d) for d in wanted.values()),
            )

    async def _rescan(self, started_us: int) -> None:
        async with self._write_lock:
            seen = await self._scan(self.scorer)
            gone: dict[str, list[str]] = {}
            for tenant, doc_id in list(self._meta):
                if (tenant, doc_id) not in seen:
                    gone.setdefault(tenant, []).append(doc_id)
                    del self._meta[(tenant, doc_id)]
            for tenant, doc_ids in gone.items():
                self.scorer.delete(tenant, doc_ids)
            self._applied.clear()
            self._cursor_us = started_us
        log.info("KG sync: article table rescanned (%d articles)", len(seen))

    # -- reads -----------------------------------------------------------------

    async def query_vector(self, query: SemanticQuery) -> Vector:
        if query.vector is not None:
            self._check_vector(query.vector, "query_vector")
            norm = float(np.linalg.norm(query.vector))
            if norm == 0:
                raise InvalidArgument("must not be the zero vector", field="query_vector")
            return (query.vector / norm).astype(np.float32)
        vector = await self.embedder.aencode_one(query.text)
        return np.asarray(vector, dtype=np.float32)

    async def search(self, tenant: str, query: SemanticQuery) -> list[SemanticHit]:
        self.validate_entities(query.filters.entity_ids, "filters.entity")
        if query.mode is not Mode.DENSE and query.level is Level.PASSAGE:
            raise InvalidArgument("KG scores rank articles; use level DOCUMENT", field="level")
        vector = await self.query_vector(query)
        if query.mode is Mode.DENSE:
            return await self._dense(tenant, vector, query, query.top_k)
        if query.mode is Mode.KG:
            return await self._kg(tenant, vector, query, query.top_k)
        depth = max(FUSION_DEPTH, query.top_k)
        dense, kg = await asyncio.gather(
            self._dense(tenant, vector, query, depth), self._kg(tenant, vector, query, depth)
        )
        by_id = {h.doc_id: h for h in kg} | {h.doc_id: h for h in dense}
        dense_scores = {h.doc_id: h.dense_score for h in dense}
        kg_hits = {h.doc_id: h for h in kg}
        fused = reciprocal_rank_fusion(
            [
                Ranked("dense", [(h.doc_id, h.score) for h in dense]),
                Ranked("kg", [(h.doc_id, h.score) for h in kg]),
            ],
            top_k=query.top_k,
        )
        out = []
        for key, score in fused:
            base = by_id[str(key)]
            kg_hit = kg_hits.get(str(key))
            out.append(
                SemanticHit(
                    doc_id=base.doc_id,
                    passage_index=-1,
                    score=score,
                    title=base.title,
                    text=base.text,
                    dense_score=dense_scores.get(str(key)),
                    kg_score=kg_hit.kg_score if kg_hit else None,
                    best_node_id=kg_hit.best_node_id if kg_hit else "",
                    keywords=base.keywords,
                    published_at=base.published_at,
                    source_url=base.source_url,
                )
            )
        return out

    async def _dense(
        self, tenant: str, vector: Vector, query: SemanticQuery, limit: int
    ) -> list[SemanticHit]:
        f = query.filters
        flt = VectorFilter(
            tenant=tenant,
            keywords=f.keywords,
            published_from=f.published_from,
            published_to=f.published_to,
            doc_ids=f.doc_ids,
        )
        kind: Literal["articles", "passages"] = (
            PASSAGES if query.level is Level.PASSAGE else ARTICLES
        )
        points = await self.store.search(kind, vector, limit, flt, ids_only=query.ids_only)
        if query.ids_only:
            return [
                SemanticHit(
                    doc_id=p.doc_id,
                    passage_index=p.passage_index,
                    score=p.score,
                    title="",
                    text="",
                    dense_score=p.score,
                )
                for p in points
            ]
        return [self._dense_hit(p) for p in points]

    @staticmethod
    def _dense_hit(p: ScoredPoint) -> SemanticHit:
        pl = p.payload
        return SemanticHit(
            doc_id=p.doc_id,
            passage_index=p.passage_index,
            score=p.score,
            title=pl.get("title", ""),
            text=pl.get("text", ""),
            dense_score=p.score,
            keywords=payload_keywords(pl),
            published_at=_from_epoch(pl.get("published_at")),
            source_url=pl.get("source_url", ""),
            # A passage point written before pages were kept has none.
            page=int(pl.get("page") or 0),
        )

    async def _kg(
        self, tenant: str, vector: Vector, query: SemanticQuery, limit: int
    ) -> list[SemanticHit]:
        f = query.filters
        flt = None
        if f.restricts:
            flt = KgFilter(f.keywords, f.published_from, f.published_to, f.doc_ids)
        scores: list[ArticleScore] = await asyncio.to_thread(
            self.scorer.score,
            tenant,
            vector,
            variant=query.variant.value,
            top_k=limit,
            top_n=query.kg_top_n,
            flt=flt,
        )
        out = []
        for s in scores:
            meta = self._meta.get((tenant, s.doc_id))
            if meta is None:
                continue
            out.append(
                SemanticHit(
                    doc_id=s.doc_id,
                    passage_index=-1,
                    score=s.score,
                    title=meta.title,
                    text=meta.text,
                    kg_score=s.score,
                    best_node_id=s.best_node,
                    keywords=meta.keywords,
                    published_at=meta.published_at,
                    source_url=meta.source_url,
                )
            )
        return out

    async def explain(
        self, tenant: str, doc_id: str, query: SemanticQuery
    ) -> tuple[ArticleScore, list[NodeScore], list[list[NodeScore]]]:
        vector = await self.query_vector(query)
        result = await asyncio.to_thread(
            self.scorer.explain,
            tenant,
            doc_id,
            vector,
            variant=query.variant.value,
            top_n=query.kg_top_n,
        )
        if result is None:
            from attest.core.errors import NotFound

            raise NotFound(f"no article {doc_id!r} in the semantic index", field="doc_id")
        return result

    async def embed(self, texts: Sequence[str]) -> Vector:
        """Unit-length embeddings of ``texts`` with the index's model, one row per text."""
        return await self.embedder.aencode(texts)

    async def vectors(self, tenant: str, keys: Sequence[tuple[str, int]]) -> list[Vector | None]:
        """Stored vectors of (doc_id, passage_index) records, -1 naming the article
        record; None where ``tenant`` has no such record."""
        out: list[Vector | None] = [None] * len(keys)
        for kind, wanted in ((ARTICLES, True), (PASSAGES, False)):
            slots = [i for i, (_, index) in enumerate(keys) if (index == -1) == wanted]
            if not slots:
                continue
            found = await self.store.vectors(kind, tenant, [keys[i] for i in slots])
            for i, vector in zip(slots, found, strict=True):
                out[i] = vector
        return out

    def title(self, tenant: str, doc_id: str) -> str:
        """The headline of an indexed article ("" when unknown)."""
        meta = self._meta.get((tenant, doc_id))
        return meta.title if meta else ""

    async def list_documents(self, tenant: str, page_token: str, page_size: int) -> DocumentPage:
        """One page of the tenant's articles as the store holds them (see
        ``attest.semantic.store.list_documents``): the store, not this process's
        memo of it, because reconciliation is about what is stored."""
        return await list_documents(self.store, tenant, page_token, page_size)

    async def stats(self, tenant: str) -> SemanticCounts:
        articles = await self.store.count(ARTICLES, tenant)
        passages = await self.store.count(PASSAGES, tenant)
        linked = sum(1 for (t, _), m in self._meta.items() if t == tenant and m.entity_ids)
        links = sum(len(m.entity_ids) for (t, _), m in self._meta.items() if t == tenant)
        return SemanticCounts(
            documents=articles, passages=passages, linked_documents=linked, kg_links=links
        )
