"""Embedded BM25 on tantivy (the default; no server).

Scoring matches the OpenSearch/Elasticsearch backends: BM25 with k1 = 1.2 and
b = 0.75 (tantivy's constants), English analysis (lowercase, the stop words
of Lucene's English analyzer, Snowball English stemming), and the better of
the title and text scores plus half the other, like ``multi_match`` with
``best_fields`` and a tie breaker of 0.5. Query text is analysed here and
turned into term queries, so no query syntax is ever interpreted. Documents and passages live in two
indexes, as in the other backends, so each level has its own BM25 statistics.

The document's keyword fields (``attest.core.document``) share two fields of
the schema: ``keyword_terms``, one indexed term ``<field>\x1f<value>`` per
value (case-folded for a folded field), which the filters match, and
``keywords``, the fields as stored JSON. tantivy cannot add a field to an
existing index, so declaring a keyword field changes no schema.

A passage record stores its ``page`` (1-based; 0 for a document without
pages).

An index written with an earlier layout (one schema field per keyword field,
before ``keyword_terms``; or passages without ``page``) is rebuilt in this
layout when it is opened, since tantivy cannot add a field to an existing
index, from its own stored records: the tenant of each record, which was
indexed but not stored, comes back from the term dictionary of ``tenant``,
and a passage written before pages were kept is on page 0. The new index
is built beside the old one (``<name>.rebuilding``) and swapped in by renames,
and the earlier index is kept as ``<name>.earlier-layout-<time>``; a start
interrupted at any step completes or restarts the rebuild, and an index
already in this layout is never rebuilt again.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import tantivy

from attest.core.common import Filters
from attest.core.document import (
    BY_NAME,
    Keywords,
    keywords_from_stored,
    keywords_to_stored,
    passages_digest,
)
from attest.core.errors import Unavailable
from attest.core.offload import Offloaders
from attest.core.validation import EARLIEST_PUBLISHED, LATEST_PUBLISHED
from attest.lexical.models import (
    Counts,
    DocumentIn,
    DocumentPage,
    Hit,
    IndexResult,
    Level,
    SearchQuery,
    StoredDocument,
)
from attest.lexical.query import (
    HIGHLIGHT_POST,
    HIGHLIGHT_PRE,
    TIE_BREAKER,
    escape_html,
    index_names,
)
from attest.lexical.settings import LexicalSettings

log = logging.getLogger(__name__)

ANALYZER = "attest_en"
KEYWORD_TERMS = "keyword_terms"
KEYWORDS = "keywords"
# Lucene's English stop set (EnglishAnalyzer.ENGLISH_STOP_WORDS_SET), plus "s":
# Lucene strips possessive 's before stemming, while tantivy's simple
# tokenizer splits "company's" into "company" and "s".
STOP_WORDS = [
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into",
    "is", "it", "no", "not", "of", "on", "or", "such", "that", "the", "their", "then",
    "there", "these", "they", "this", "to", "was", "will", "with", "s",
]  # fmt: skip
SEARCH_FIELDS = ("title", "text")
Must = tantivy.Occur.Must
Should = tantivy.Occur.Should
_KEY_SEPARATOR = "\x1f"


def english_analyzer() -> tantivy.TextAnalyzer:
    return (
        tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple())
        .filter(tantivy.Filter.remove_long(40))
        .filter(tantivy.Filter.lowercase())
        .filter(tantivy.Filter.custom_stopword(STOP_WORDS))
        .filter(tantivy.Filter.stemmer("english"))
        .build()
    )


def _schema() -> tantivy.Schema:
    sb = tantivy.SchemaBuilder()
    sb.add_text_field("key", stored=False, tokenizer_name="raw", index_option="basic")
    sb.add_text_field("tenant", stored=False, tokenizer_name="raw", index_option="basic")
    sb.add_text_field("doc_id", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_integer_field("passage_index", stored=True, indexed=True)
    sb.add_integer_field("passage_count", stored=True)
    sb.add_text_field("title", stored=True, tokenizer_name=ANALYZER, index_option="position")
    sb.add_text_field("text", stored=True, tokenizer_name=ANALYZER, index_option="position")
    sb.add_text_field(KEYWORD_TERMS, stored=False, tokenizer_name="raw", index_option="basic")
    sb.add_bytes_field(KEYWORDS, stored=True)
    sb.add_date_field("published_at", stored=True, indexed=True, fast=True)
    sb.add_text_field("source_url", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_text_field("metadata", stored=True, tokenizer_name="raw", index_option="basic")
    sb.add_integer_field("page", stored=True)
    return sb.build()


def _key(tenant: str, doc_id: str) -> str:
    return f"{tenant}{_KEY_SEPARATOR}{doc_id}"


def _keyword_term(name: str, value: str) -> str:
    return f"{name}{_KEY_SEPARATOR}{BY_NAME[name].key(value)}"


def _keyword_fields(keywords: Keywords) -> dict[str, Any]:
    return {
        KEYWORD_TERMS: [_keyword_term(n, v) for n, vs in keywords.items() for v in vs],
        KEYWORDS: json.dumps(keywords_to_stored(keywords), sort_keys=True).encode(),
    }


def _first(doc: dict[str, list[Any]], name: str, default: Any = None) -> Any:
    values = doc.get(name) or []
    return values[0] if values else default


def _mark(fragment: str, ranges: list[Any]) -> str:
    """The fragment as HTML: its text escaped, then the highlighted ranges marked.

    Escaping each piece after the fragment was cut means no entity is ever
    cut, and no markup from the document reaches the caller as markup.
    """
    # tantivy reports highlight ranges as UTF-8 byte offsets.
    raw = fragment.encode("utf-8")

    def text(start: int, end: int) -> str:
        return escape_html(raw[start:end].decode("utf-8", errors="replace"))

    out, last = [], 0
    for r in sorted(ranges, key=lambda r: r.start):
        if r.start < last:
            continue
        out += [text(last, r.start), HIGHLIGHT_PRE, text(r.start, r.end), HIGHLIGHT_POST]
        last = r.end
    out.append(text(last, len(raw)))
    return "".join(out)


class _Snapshot:
    """One searcher, and the ids of the documents its searches have returned.

    A hit's address (segment ordinal, document number) names a document only
    within the searcher that returned it: segments merge and ordinals move.
    So the table of address -> (doc id, passage index) lives and dies with its
    searcher, and a search for ids only reads a document's stored fields the
    first time that searcher returns it (reading them is most of the work of
    a search over a small index).
    """

    __slots__ = ("ids", "searcher", "taken")

    def __init__(self, searcher: tantivy.Searcher) -> None:
        self.searcher = searcher
        self.taken = time.monotonic()
        self.ids: dict[tuple[int, int], tuple[str, int]] = {}


#: Entries of a snapshot's id table (about 290 bytes each with 12-character
#: ids, so some 60 MB per level at the bound); past it, ids are
#: read from the stored document every time.
_SNAPSHOT_IDS = 200_000
#: A snapshot older than this is replaced at the next search, so that the
#: files of merged-away segments, which it keeps open, are let go.
_SNAPSHOT_SECONDS = 30.0


class _LevelIndex:
    """One tantivy index (documents or passages) with its single writer."""

    def __init__(self, path: Path, heap: int) -> None:
        _complete_rebuild(path)
        path.mkdir(parents=True, exist_ok=True)
        try:
            self.index = _open_current(path)
        except ValueError as err:
            if "schema does not match" not in str(err):
                raise
            # tantivy cannot change an existing index's fields: one written
            # with an earlier layout is rebuilt in this one.
            _rebuild_earlier_layout(path, heap)
            self.index = _open_current(path)
        self.index.register_tokenizer(ANALYZER, english_analyzer())
        self.writer = self.index.writer(heap, 1)
        self.schema = self.index.schema
        # Orders a refresh of the snapshot with a commit's: a refresh that took
        # its searcher before a commit's reload must not replace the commit's.
        self._snapshot_lock = threading.Lock()
        self._snapshot = _Snapshot(self.index.searcher())

    def snapshot(self) -> _Snapshot:
        """The searcher for a search: the one taken at the last commit, or a
        fresh one when that is older than ``_SNAPSHOT_SECONDS``."""
        snap = self._snapshot
        if time.monotonic() - snap.taken > _SNAPSHOT_SECONDS:
            with self._snapshot_lock:
                if self._snapshot is snap:  # no commit has replaced it meanwhile
                    self._snapshot = _Snapshot(self.index.searcher())
                snap = self._snapshot
        return snap

    def term(self, field: str, value: str) -> tantivy.Query:
        return tantivy.Query.term_query(self.schema, field, value)

    def count(self, query: tantivy.Query) -> int:
        # SearchResult.count exists at run time but not in tantivy's type stubs.
        result = self.index.searcher().search(query, 1, count=True)
        return int(getattr(result, "count", 0) or 0)

    def commit(self) -> None:
        self.writer.commit()
        with self._snapshot_lock:
            self.index.reload()
            self._snapshot = _Snapshot(self.index.searcher())


def _ids_of(snap: _Snapshot, address: tantivy.DocAddress) -> tuple[str, int]:
    key = (address.segment_ord, address.doc)
    ids = snap.ids.get(key)
    if ids is None:
        doc = snap.searcher.doc(address)
        index = doc.get_first("passage_index")
        ids = (doc.get_first("doc_id") or "", -1 if index is None else int(index))
        if len(snap.ids) < _SNAPSHOT_IDS:
            snap.ids[key] = ids
    return ids


class TantivyBackend:
    name = "tantivy"

    def __init__(self, settings: LexicalSettings) -> None:
        root = Path(settings.data_dir) / "lexical"
        self._paths = {
            level: root / name for level, name in index_names(settings.index_name).items()
        }
        self._heap = settings.writer_heap_bytes
        self._levels: dict[Level, _LevelIndex] = {}
        self._analyzer = english_analyzer()
        # tantivy allows one writer per index; writes go through it one at a time.
        self._write_lock = asyncio.Lock()
        # tantivy lets go of the GIL while it searches, on the calling thread,
        # so a long search gains from a thread and its cost is that thread's CPU
        # time; a short one runs on the loop (attest.core.offload).
        self._searches: Offloaders[tuple[Level, bool, bool]] = Offloaders(
            settings.inline_search_ms / 1e3, clock=time.thread_time
        )

    # -- lifecycle -------------------------------------------------------------

    def _open(self) -> None:
        self._levels = {level: _LevelIndex(path, self._heap) for level, path in self._paths.items()}

    async def warm_up(self) -> None:
        if not self._levels:
            await asyncio.to_thread(self._open)

    async def close(self) -> None:
        async with self._write_lock:
            levels, self._levels = self._levels, {}
            for level in levels.values():
                await asyncio.to_thread(level.writer.wait_merging_threads)

    def _ready(self) -> tuple[_LevelIndex, _LevelIndex]:
        if not self._levels:
            raise Unavailable("the tantivy index is not open")
        return self._levels[Level.DOCUMENT], self._levels[Level.PASSAGE]

    # -- writes ----------------------------------------------------------------

    @staticmethod
    def _shared(tenant: str, doc: DocumentIn) -> dict[str, Any]:
        shared: dict[str, Any] = {
            "key": _key(tenant, doc.id),
            "tenant": tenant,
            "doc_id": doc.id,
            "title": doc.title,
            **_keyword_fields(doc.keywords),
            "source_url": doc.source_url,
        }
        if doc.published_at is not None:
            shared["published_at"] = doc.published_at.astimezone(UTC)
        return shared

    def _index_sync(self, tenant: str, documents: Sequence[DocumentIn]) -> IndexResult:
        docs, passages = self._ready()
        count = 0
        try:
            for doc in documents:
                key = _key(tenant, doc.id)
                shared = self._shared(tenant, doc)
                # Replace every record of the document: old passages go even
                # when the new version has fewer.
                docs.writer.delete_documents_by_term("key", key)
                passages.writer.delete_documents_by_term("key", key)
                docs.writer.add_document(
                    tantivy.Document(
                        **shared,
                        passage_index=-1,
                        passage_count=len(doc.passages),
                        text=doc.body,
                        metadata=json.dumps(doc.metadata, sort_keys=True),
                    )
                )
                for p in doc.passages:
                    passages.writer.add_document(
                        tantivy.Document(**shared, passage_index=p.index, text=p.text, page=p.page)
                    )
                count += len(doc.passages)
            # Passages first: a crash between the commits leaves a document
            # whose re-indexing repairs it, never a passage without its document.
            passages.commit()
            docs.commit()
        except Exception:
            docs.writer.rollback()
            passages.writer.rollback()
            raise
        return IndexResult(documents=len(documents), passages=count)

    async def index(
        self, tenant: str, documents: Sequence[DocumentIn], *, refresh: bool
    ) -> IndexResult:
        # Every write commits, so documents are durable and searchable on return
        # whether or not ``refresh`` was asked for.
        async with self._write_lock:
            return await asyncio.to_thread(self._index_sync, tenant, documents)

    def _delete_sync(self, tenant: str, doc_ids: Sequence[str]) -> int:
        docs, passages = self._ready()
        existing = 0
        for doc_id in doc_ids:
            key = _key(tenant, doc_id)
            existing += docs.count(docs.term("key", key))
            docs.writer.delete_documents_by_term("key", key)
            passages.writer.delete_documents_by_term("key", key)
        docs.commit()
        passages.commit()
        return existing

    async def delete(self, tenant: str, doc_ids: Sequence[str]) -> int:
        async with self._write_lock:
            return await asyncio.to_thread(self._delete_sync, tenant, doc_ids)

    # -- reads -----------------------------------------------------------------

    def _text_query(self, level: _LevelIndex, text: str) -> tantivy.Query | None:
        tokens = self._analyzer.analyze(text)
        if not tokens:
            return None
        # Repeated query terms count again, as in Lucene's match query.
        per_field = [
            tantivy.Query.boolean_query([(Should, level.term(field, t)) for t in tokens])
            for field in SEARCH_FIELDS
        ]
        return tantivy.Query.disjunction_max_query(per_field, TIE_BREAKER)

    def _filter_query(self, level: _LevelIndex, tenant: str, query: SearchQuery) -> tantivy.Query:
        must = [level.term("tenant", tenant)]
        f = query.filters
        for name, values in f.keywords.items():
            if values:
                must.append(_any(level, KEYWORD_TERMS, [_keyword_term(name, v) for v in values]))
        if f.doc_ids:
            must.append(_any(level, "doc_id", list(f.doc_ids)))
        if f.published_from or f.published_to:
            # tantivy holds dates from 1677 to 2262 only, and every stored date
            # is inside EARLIEST..LATEST_PUBLISHED, so wider bounds are clamped
            # (a range wholly outside is answered before, by _search_sync).
            must.append(
                tantivy.Query.range_query(
                    level.schema,
                    "published_at",
                    tantivy.FieldType.Date,
                    _clamp(f.published_from),
                    _clamp(f.published_to),
                )
            )
        return tantivy.Query.boolean_query([(Must, q) for q in must])

    def _search_sync(self, tenant: str, query: SearchQuery) -> list[Hit]:
        docs, passages = self._ready()
        level = passages if query.level is Level.PASSAGE else docs
        text_query = self._text_query(level, query.text)
        if text_query is None or _outside_stored_dates(query.filters):
            return []
        # Filters must not add to the score: wrap them in a zero constant score.
        full = tantivy.Query.boolean_query(
            [
                (Must, text_query),
                (
                    Must,
                    tantivy.Query.const_score_query(self._filter_query(level, tenant, query), 0.0),
                ),
            ]
        )
        snap = level.snapshot()
        searcher = snap.searcher
        result = searcher.search(full, query.top_k, count=False)
        generators = []
        if query.highlight and result.hits:
            for field in SEARCH_FIELDS:
                gen = tantivy.SnippetGenerator.create(searcher, text_query, level.schema, field)
                gen.set_max_num_chars(160)
                generators.append(gen)
        hits = []
        for score, address in result.hits:
            if query.ids_only:
                doc_id, passage_index = _ids_of(snap, address)
                hits.append(
                    Hit(
                        doc_id=doc_id,
                        passage_index=passage_index,
                        score=float(score),
                        title="",
                        text="",
                    )
                )
                continue
            doc = searcher.doc(address)
            stored = doc.to_dict()
            highlights = []
            for gen in generators:
                snippet = gen.snippet_from_doc(doc)
                if snippet.highlighted():
                    highlights.append(_mark(snippet.fragment(), snippet.highlighted()))
            published = _first(stored, "published_at")
            if isinstance(published, datetime) and published.tzinfo is None:
                published = published.replace(tzinfo=UTC)
            hits.append(
                Hit(
                    doc_id=_first(stored, "doc_id", ""),
                    passage_index=int(_first(stored, "passage_index", -1)),
                    score=float(score),
                    title=_first(stored, "title", ""),
                    text=_first(stored, "text", ""),
                    highlights=tuple(highlights),
                    keywords=keywords_from_stored(json.loads(_first(stored, KEYWORDS, b"{}"))),
                    published_at=published,
                    source_url=_first(stored, "source_url", ""),
                    page=int(_first(stored, "page", 0)),
                )
            )
        return hits

    async def search(self, tenant: str, query: SearchQuery) -> list[Hit]:
        # One offloader per kind of search, since their costs differ: ids only
        # or whole hits (highlighted or not), documents or passages.
        kind = (query.level, query.ids_only, query.highlight)
        return await self._searches.run(kind, functools.partial(self._search_sync, tenant, query))

    def _stats_sync(self, tenant: str) -> Counts:
        docs, passages = self._ready()
        return Counts(
            documents=docs.count(docs.term("tenant", tenant)),
            passages=passages.count(passages.term("tenant", tenant)),
        )

    async def stats(self, tenant: str) -> Counts:
        return await asyncio.to_thread(self._stats_sync, tenant)

    def _stored_sync(self, tenant: str, *, texts: bool = False) -> dict[str, tuple[int, bool, str]]:
        """doc id -> (passage records, whether the document record exists, the
        passages' digest when ``texts``, else "")."""
        docs, passages = self._ready()
        out: dict[str, tuple[int, bool, str]] = {}
        held: dict[str, list[tuple[int, str]]] = {}
        for level, is_passage in ((docs, False), (passages, True)):
            query = level.term("tenant", tenant)
            total = level.count(query)
            if not total:
                continue
            searcher = level.index.searcher()
            for _, address in searcher.search(query, total, count=False).hits:
                stored = searcher.doc(address).to_dict()
                doc_id = str(_first(stored, "doc_id", ""))
                count, has_document, _ = out.get(doc_id, (0, False, ""))
                out[doc_id] = (count + int(is_passage), has_document or not is_passage, "")
                if texts and is_passage:
                    held.setdefault(doc_id, []).append(
                        (int(_first(stored, "passage_index", 0)), str(_first(stored, "text", "")))
                    )
        if texts:
            out = {d: (n, has, passages_digest(held.get(d, ()))) for d, (n, has, _) in out.items()}
        return out

    async def document_ids(self, tenant: str) -> dict[str, int]:
        """Every document id of ``tenant`` with its number of passage records
        (for reconciliation with the ingest registry; a passage whose document
        record is gone still shows up under its id)."""
        stored = await asyncio.to_thread(self._stored_sync, tenant)
        return {d: n for d, (n, _, _) in stored.items()}

    async def list_documents(self, tenant: str, page_token: str, page_size: int) -> DocumentPage:
        # Every write commits, so nothing needs refreshing. tantivy has no
        # range over a text field that keeps up with the ids, so each page reads
        # the tenant's ids afresh: fine for an embedded index, whose doctor reads
        # all pages at once (``document_ids``) anyway.
        stored = await asyncio.to_thread(functools.partial(self._stored_sync, tenant, texts=True))
        ids = sorted(d for d in stored if d > page_token)
        page = ids[:page_size]
        return DocumentPage(
            documents=tuple(StoredDocument(d, *stored[d]) for d in page),
            next_page_token=page[-1] if len(ids) > page_size else "",
        )


def _outside_stored_dates(f: Filters) -> bool:
    """Whether the date range excludes every publication time a document can have."""
    return bool(
        (f.published_from and f.published_from > LATEST_PUBLISHED)
        or (f.published_to and f.published_to < EARLIEST_PUBLISHED)
    )


def _clamp(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return min(max(value.astimezone(UTC), EARLIEST_PUBLISHED), LATEST_PUBLISHED)


def _any(level: _LevelIndex, field: str, values: list[str]) -> tantivy.Query:
    return tantivy.Query.boolean_query([(Should, level.term(field, v)) for v in values])


# -- earlier layouts ---------------------------------------------------------------

# The stored fields a record of an earlier layout keeps as they are (``page``
# only where it has one); its keyword fields are written again into
# KEYWORD_TERMS and KEYWORDS, and ``key`` and ``tenant`` (indexed, not stored)
# from the tenant its record was found under.
_CARRIED = (
    "doc_id",
    "passage_index",
    "passage_count",
    "title",
    "text",
    "published_at",
    "source_url",
    "metadata",
    "page",
)


def _open_current(path: Path) -> tantivy.Index:
    return tantivy.Index(_schema(), path=str(path), reuse=True)


def _beside(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _sync_dir(path: Path) -> None:
    """Makes the renames, creations and removals in directory ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _complete_rebuild(path: Path) -> Path | None:
    """Completes or undoes a rebuild of the index at ``path``; the earlier index's new path.

    ``<name>.rebuilt`` is written only once ``<name>.rebuilding`` holds every
    record: with it the two are swapped (the earlier index moved aside first),
    whichever step a stop interrupted. Without it the earlier index is still
    untouched, and the rebuild starts over (removing a partial one) when it is
    opened, holding its writer.
    """
    building, done = _beside(path, ".rebuilding"), _beside(path, ".rebuilt")
    aside = None
    if done.exists():
        if building.exists():
            if path.exists():
                stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
                aside = _beside(path, f".earlier-layout-{stamp}")
                n = 1
                while aside.exists():
                    n += 1
                    aside = _beside(path, f".earlier-layout-{stamp}-{n}")
                path.rename(aside)
            building.rename(path)
        done.unlink()
        _sync_dir(path.parent)
    return aside


def _earlier_records(path: Path, index: tantivy.Index) -> dict[str, list[Any]]:
    """The address of every record of an index of an earlier layout, by tenant."""
    searcher = index.searcher()
    total = searcher.num_docs
    out: dict[str, list[Any]] = {}
    if not total:
        return out
    try:
        # The term dictionary still counts deleted records; the searches do not.
        tenants = searcher.terms_with_prefix("tenant", "")
    except ValueError:
        tenants = []
    for tenant, frequency in tenants:
        query = tantivy.Query.term_query(index.schema, "tenant", tenant)
        hits = searcher.search(query, max(int(frequency), 1), count=False).hits
        if hits:
            out[str(tenant)] = [address for _, address in hits]
    placed = sum(len(a) for a in out.values())
    if placed != total:
        raise Unavailable(
            f"the tantivy index at {path} was written with an earlier layout, and "
            f"{total - placed} of its {total} records have no tenant to rebuild them under; "
            "move it away and index the documents again (attest ingest)"
        )
    return out


def _stored_keywords(stored: dict[str, list[Any]]) -> Keywords:
    """The keyword fields of a record of an earlier layout: as KEYWORDS (the
    layout before ``page``), or a stored field each (before KEYWORD_TERMS)."""
    raw = _first(stored, KEYWORDS)
    if raw is not None:
        return keywords_from_stored(json.loads(raw))
    return keywords_from_stored(stored)


def _current_record(tenant: str, stored: dict[str, list[Any]]) -> tantivy.Document:
    fields: dict[str, Any] = {name: stored[name] for name in _CARRIED if stored.get(name)}
    fields.update(
        key=_key(tenant, str(_first(stored, "doc_id", ""))),
        tenant=tenant,
        **_keyword_fields(_stored_keywords(stored)),
    )
    return tantivy.Document(**fields)


def _write_current(
    path: Path, earlier: tantivy.Index, records: dict[str, list[Any]], heap: int
) -> None:
    """Writes ``records`` of ``earlier`` to ``<name>.rebuilding`` in the current layout."""
    building = _beside(path, ".rebuilding")
    if building.exists():
        shutil.rmtree(building)
    building.mkdir()
    index = tantivy.Index(_schema(), path=str(building))
    index.register_tokenizer(ANALYZER, english_analyzer())
    writer = index.writer(heap, 1)
    searcher = earlier.searcher()
    for tenant, addresses in records.items():
        for address in addresses:
            writer.add_document(_current_record(tenant, searcher.doc(address).to_dict()))
    writer.commit()
    writer.wait_merging_threads()
    index.reload()
    rebuilt = index.searcher()
    for tenant, addresses in records.items():
        query = tantivy.Query.term_query(index.schema, "tenant", tenant)
        found = int(getattr(rebuilt.search(query, 1, count=True), "count", 0) or 0)
        if found != len(addresses):
            raise Unavailable(
                f"rebuilding the tantivy index at {path} wrote {found} of tenant "
                f"{tenant!r}'s {len(addresses)} records; the earlier index is unchanged"
            )


def _rebuild_earlier_layout(path: Path, heap: int) -> None:
    """Rebuilds the index at ``path``, of an earlier layout, in the current one.

    Every live record is written again with its tenant, stored fields and
    keyword values, so searches, filters and counts answer as before. The
    earlier index is kept beside it (``<name>.earlier-layout-<time>``).
    """
    started = time.monotonic()
    earlier = tantivy.Index.open(str(path))
    # Its writer, held until the rebuild is complete, keeps a second process
    # from rebuilding the same index at the same time.
    lock = earlier.writer(heap, 1)
    try:
        records = _earlier_records(path, earlier)
        total = sum(len(a) for a in records.values())
        log.info(
            "the tantivy index at %s has an earlier layout: rebuilding its %d records "
            "(%d tenants) in the current one",
            path,
            total,
            len(records),
        )
        _write_current(path, earlier, records, heap)
        _beside(path, ".rebuilt").touch()
        _sync_dir(path.parent)
    finally:
        lock.rollback()
        lock.wait_merging_threads()
        del lock, earlier
    aside = _complete_rebuild(path)
    log.info(
        "rebuilt the tantivy index at %s in the current layout: %d records of %d tenants "
        "in %.1f s; the earlier index is kept at %s and can be removed",
        path,
        total,
        len(records),
        time.monotonic() - started,
        aside,
    )
