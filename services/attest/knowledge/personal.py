"""The personal knowledge base (PKB): what the caller's documents say, per tenant (no grpc).

Three forms of fact, each tied to the place in a document that stated it
(tenant, document id, passage index, character offsets in the body):

* entity descriptions ``(entity, text)``;
* triples ``(subject, relation, object entity or value)``;
* entity-aspect facts ``(entity, aspect, content)``.

Storage reuses the project's engines under names of their own, so tenants are
enforced the way they are for articles:

* the lexical backend (tantivy embedded, or OpenSearch/Elasticsearch) holds
  one record per source document whose passages are its facts' texts, in the
  index ``attest-knowledge`` (``PersonalSettings.index_name``): BM25 over the
  facts, and "replace a document" is the backend's own replace;
* the vector store (the embedded Qdrant engine, or a Qdrant server) holds one
  point per fact in ``<prefix>-passages`` (the point's ``passage_index`` is
  the fact's position in its document, the payload the whole fact) and one
  per document in ``<prefix>-articles``; the payloads are the record the
  in-memory view is restored from.

Storing a document's facts deletes what the document had in both engines and
writes the new facts (an empty list only deletes); the call is idempotent, so a
failure half-way is repaired by repeating it. ``TenantFacts`` is this
process's view of one tenant's facts, loaded from the vector store on first
use and updated by every write made through this process: a second process
writing the same tenant is seen after a restart (one knowledge replica
serves the personal base, see docs/explanation/knowledge.md).

``PersonalKnowledgeBase`` is the ``KnowledgeBase`` over one tenant's view.
Entities are the names the facts mention; an entity's id is derived from its
case-folded name (``p-`` and 16 hex digits), so the same name in two
documents is one entity and ids survive restarts.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np

from attest.core.write_barrier import WriteBarrier, awriting
from attest.knowledge.kb import (
    LINK_THRESHOLD,
    MAX_HOPS,
    PERSONAL,
    AspectFact,
    Candidate,
    Description,
    Encode,
    EntityInfo,
    EntityRef,
    Fact,
    KbEntity,
    Linking,
    Provenance,
    RelationMatch,
    RelationPath,
    Relationship,
    Triple,
    UnknownEntity,
    Vectors,
    content_words,
    link_exactly,
)
from attest.knowledge.store_lock import StoreLock
from attest.lexical.backends import LexicalBackend
from attest.lexical.models import DocumentIn, Level, PassageIn, SearchQuery
from attest.semantic.store import ARTICLE_INDEX, Point, VectorFilter, VectorStore

Form = Literal["description", "triple", "aspect"]
FORMS: Final[tuple[Form, ...]] = ("description", "triple", "aspect")
PersonalFact = Description | Triple | AspectFact

ENTITY_PREFIX: Final = "p-"

# A free-text relation matches a stored triple's relation with at least this
# cosine similarity (MiniLM): "chairs"/"chair of" 0.69, "chaired by"/"chair
# of" 0.58, "CEO"/"chief executive of" 0.78, "chief executive"/"chief
# executive of" 0.96, while other roles and other subjects stay below:
# "chairs"/"chief executive of" 0.17, "who leads"/"chief executive of" 0.39,
# "headquarters"/"chair of" 0.32. Below it, the entity's aspect facts whose
# aspect or content shares a word with the relation answer instead, most
# similar first.
PERSONAL_RELATION_THRESHOLD: Final = 0.5
# A mention links by embedding to a personal entity's name at the ESG base's
# threshold (0.65): "Marrowgate"/"Marrowgate Bank" 0.82, "Norvale"/"Norvale
# Copper" 0.68, "the bank"/"Marrowgate Bank" 0.63 (not linked). A mention
# whose words begin an entity's name ("Marrowgate" -> "Marrowgate Bank") is
# chosen whatever the score, so one mention may choose several entities.
PERSONAL_LINK_THRESHOLD: Final = LINK_THRESHOLD
# Fusion of the BM25 and vector rankings of the facts (reciprocal rank).
RRF_K: Final = 60

_SPACE = re.compile(r"\s+")


def normalise_name(name: str) -> str:
    return _SPACE.sub(" ", name).strip().casefold()


def personal_entity_id(name: str) -> str:
    """The id of the personal entity called ``name`` (case and spacing ignored)."""
    digest = hashlib.sha1(normalise_name(name).encode("utf-8"), usedforsecurity=False)
    return ENTITY_PREFIX + digest.hexdigest()[:16]


def _first_word(name: str) -> str:
    words = normalise_name(name).split(" ", 1)
    return words[0]


def is_personal_id(entity_id: str) -> bool:
    return entity_id.startswith(ENTITY_PREFIX) and len(entity_id) == len(ENTITY_PREFIX) + 16


def form_of(fact: PersonalFact) -> Form:
    if isinstance(fact, Description):
        return "description"
    if isinstance(fact, Triple):
        return "triple"
    return "aspect"


def fact_text(fact: PersonalFact) -> str:
    """The text that BM25 and the vectors index for a fact."""
    if isinstance(fact, Description):
        return fact.text_form()
    return fact.text()


def as_fact(fact: PersonalFact, score: float = 1.0) -> Fact:
    if isinstance(fact, Description):
        return Fact(score, description=fact)
    if isinstance(fact, Triple):
        return Fact(score, triple=fact)
    return Fact(score, aspect_fact=fact)


def entities_of(fact: PersonalFact) -> list[EntityRef]:
    if isinstance(fact, Triple):
        return [fact.subject] + ([fact.object_entity] if fact.object_entity else [])
    return [fact.entity]


# ------------------------------------------------------------------ payloads


def _ref_payload(ref: EntityRef | None) -> dict[str, str] | None:
    return None if ref is None else {"id": ref.id, "name": ref.name}


def _ref_from(raw: Any) -> EntityRef | None:
    return None if not raw else EntityRef(id=str(raw["id"]), name=str(raw["name"]))


def fact_payload(fact: PersonalFact) -> dict[str, Any]:
    """What the vector store keeps of a fact besides tenant, doc id and position."""
    p = fact.provenance
    out: dict[str, Any] = {
        "form": form_of(fact),
        "source_passage": p.passage_index,
        "start_char": p.start_char,
        "end_char": p.end_char,
        "text": fact_text(fact),
    }
    if isinstance(fact, Description):
        out.update(entity=_ref_payload(fact.entity), value=fact.text)
    elif isinstance(fact, Triple):
        out.update(
            entity=_ref_payload(fact.subject),
            relation=fact.relation,
            object=_ref_payload(fact.object_entity),
            value=fact.object_value,
        )
    else:
        out.update(entity=_ref_payload(fact.entity), relation=fact.aspect, value=fact.value)
    return out


def fact_from_payload(payload: dict[str, Any]) -> PersonalFact:
    doc_id = str(payload["doc_id"])
    provenance = Provenance(
        int(payload.get("source_passage", -1)),
        int(payload.get("start_char", 0)),
        int(payload.get("end_char", 0)),
    )
    entity = _ref_from(payload["entity"])
    assert entity is not None
    form = payload["form"]
    if form == "description":
        return Description(entity, str(payload["value"]), PERSONAL, doc_id, provenance)
    if form == "triple":
        value = payload.get("value")
        return Triple(
            entity,
            str(payload["relation"]),
            _ref_from(payload.get("object")),
            None if value is None else str(value),
            PERSONAL,
            doc_id,
            provenance,
        )
    return AspectFact(
        entity, str(payload["relation"]), str(payload["value"]), PERSONAL, doc_id, provenance
    )


# --------------------------------------------------------------- the view


@dataclass
class _Document:
    facts: list[PersonalFact]
    vectors: Vectors


@dataclass
class TenantFacts:
    """One tenant's facts in memory: by document, by entity, and the entities' names.

    The indexes (facts by entity, names, names by first word, the name
    matrix) are built on first use. A write that adds a new document extends
    them (copies of the dicts with the new entries, so a reader holding the
    old ones is undisturbed), which keeps ingestion linear in the base's size;
    replacing or deleting a document rebuilds them on next use, so every
    index keeps the documents' order.
    """

    tenant: str
    documents: dict[str, _Document] = field(default_factory=dict)
    _by_entity: dict[str, list[PersonalFact]] | None = None
    _names: dict[str, str] | None = None
    _by_first_word: dict[str, list[str]] | None = None
    _name_matrix: tuple[list[str], dict[str, int], Vectors] | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def replace(self, doc_id: str, facts: list[PersonalFact], vectors: Vectors) -> None:
        with self.lock:
            added = bool(facts) and doc_id not in self.documents
            if facts:
                self.documents[doc_id] = _Document(facts, vectors)
            else:
                self.documents.pop(doc_id, None)
            if added and self._by_entity is not None and self._names is not None:
                self._extend(facts)
            else:
                self._by_entity = None
                self._names = None
                self._by_first_word = None
                self._name_matrix = None

    def _extend(self, facts: list[PersonalFact]) -> None:
        """Add a new (last) document's facts to the indexes (caller holds the lock)."""
        assert self._by_entity is not None
        assert self._names is not None
        by_entity = dict(self._by_entity)
        names = dict(self._names)
        touched: dict[str, list[PersonalFact]] = {}
        for fact in facts:
            for ref in entities_of(fact):
                if ref.id not in touched:
                    touched[ref.id] = list(by_entity.get(ref.id, ()))
                touched[ref.id].append(fact)
                names.setdefault(ref.id, ref.name)
        by_entity.update(touched)
        fresh = [i for i in touched if i not in self._names]
        if self._by_first_word is not None:
            by_word = dict(self._by_first_word)
            for entity_id in fresh:
                word = _first_word(names[entity_id])
                by_word[word] = [*by_word.get(word, ()), entity_id]
            self._by_first_word = by_word
        self._by_entity, self._names = by_entity, names
        # The name matrix stays: its rows are a prefix of the names, and
        # ``name_matrix`` embeds the names added since.

    def _index(self) -> tuple[dict[str, list[PersonalFact]], dict[str, str]]:
        with self.lock:
            if self._by_entity is None or self._names is None:
                by_entity: dict[str, list[PersonalFact]] = defaultdict(list)
                names: dict[str, str] = {}
                for doc in self.documents.values():
                    for fact in doc.facts:
                        for ref in entities_of(fact):
                            by_entity[ref.id].append(fact)
                            names.setdefault(ref.id, ref.name)
                self._by_entity, self._names = dict(by_entity), names
                self._by_first_word = None
                self._name_matrix = None
            return self._by_entity, self._names

    def facts_of_entity(self, entity_id: str) -> list[PersonalFact]:
        return list(self._index()[0].get(entity_id, ()))

    @property
    def names(self) -> dict[str, str]:
        """Entity id -> name, for every entity a fact mentions."""
        return self._index()[1]

    def by_first_word(self) -> dict[str, list[str]]:
        """First word of a name (normalised) -> ids of the entities whose name begins with it."""
        names = self.names
        with self.lock:
            index = self._by_first_word
            if index is None or self._names is not names:
                built: dict[str, list[str]] = defaultdict(list)
                for entity_id, name in names.items():
                    built[_first_word(name)].append(entity_id)
                index = dict(built)
                if self._names is names:
                    self._by_first_word = index
            return index

    def warm_up(self, embed: Callable[[Sequence[str]], Vectors]) -> None:
        """Builds the indexes the first search would build (names by first word,
        the name matrix, embedding every name with ``embed``)."""
        self.by_first_word()
        if self.names:
            self.name_matrix(embed)

    @property
    def indexed(self) -> bool:
        """Whether the indexes a search reads are built (``warm_up``)."""
        return (
            self._by_entity is not None
            and self._names is not None
            and self._by_first_word is not None
            and (self._name_matrix is not None or not self._names)
        )

    def name_matrix(
        self, embed: Callable[[Sequence[str]], Vectors]
    ) -> tuple[list[str], dict[str, int], Vectors]:
        """Entity ids, their rows and the embeddings of their names (extended as
        documents are added, rebuilt after a replacement or deletion)."""
        names = self.names
        matrix = self._name_matrix
        if matrix is None or len(matrix[0]) != len(names):
            if matrix is None or len(matrix[0]) > len(names):
                ids, rows, vectors = [], {}, _empty()
            else:
                ids, rows, vectors = list(matrix[0]), dict(matrix[1]), matrix[2]
            new = list(itertools.islice(names, len(ids), None))
            for entity_id in new:
                rows[entity_id] = len(ids)
                ids.append(entity_id)
            added = embed([names[i] for i in new]) if new else _empty()
            if len(vectors) and len(added):
                vectors = np.concatenate([vectors, added])
            elif len(added):
                vectors = added
            matrix = (ids, rows, vectors)
            with self.lock:
                if self._names is names:
                    self._name_matrix = matrix
        return matrix

    def document_facts(self, doc_id: str) -> list[PersonalFact]:
        doc = self.documents.get(doc_id)
        return list(doc.facts) if doc else []

    def counts(self) -> dict[Form, int]:
        out: dict[Form, int] = dict.fromkeys(FORMS, 0)
        for doc in self.documents.values():
            for fact in doc.facts:
                out[form_of(fact)] += 1
        return out


# --------------------------------------------------------------- the store


@dataclass(frozen=True, slots=True)
class StoreResult:
    counts: dict[Form, int]
    removed: int
    entities: tuple[EntityRef, ...]
    entities_created: int


class PersonalStore:
    """Per-tenant personal facts in a lexical backend and a vector store."""

    def __init__(
        self,
        lexical: LexicalBackend,
        vectors: VectorStore,
        encode: Encode,
        *,
        lock: StoreLock | None = None,
        barrier: WriteBarrier | None = None,
    ) -> None:
        self.lexical = lexical
        self.vectors = vectors
        self._encode = encode
        # Held from before the stores open until they close (embedded stores only).
        self._lock = lock
        # Embedded stores: every write holds the data directory's write barrier,
        # so that `attest backup` copies no half-written document.
        self._barrier = barrier
        self._views: dict[str, TenantFacts] = {}
        self._loading: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        # One writer per tenant: two Store calls for one tenant's document must
        # not interleave their delete and write.
        self._writing: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        # (tenant, doc_id) of writes begun and not finished (a failure half-way).
        self._unsettled: set[tuple[str, str]] = set()

    async def warm_up(self) -> None:
        if self._lock is not None:
            await asyncio.to_thread(self._lock.acquire)
        try:
            await self.lexical.warm_up()
            await self.vectors.warm_up()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        try:
            await self.lexical.close()
            await self.vectors.close()
        finally:
            if self._lock is not None:
                self._lock.release()

    def encode(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.asarray(self._encode(list(texts)), dtype=np.float32)

    async def view(self, tenant: str) -> TenantFacts:
        """The tenant's facts, restored from the vector store on first use."""
        view = self._views.get(tenant)
        if view is not None:
            return view
        async with self._loading[tenant]:
            view = self._views.get(tenant)
            if view is not None:
                return view
            rows: dict[str, list[tuple[int, PersonalFact, Any]]] = defaultdict(list)
            async for point in self.vectors.scroll("passages", tenant):
                rows[point.doc_id].append(
                    (point.passage_index, fact_from_payload(point.payload), point.vector)
                )
            view = self._views[tenant] = _view(tenant, rows)
            return view

    async def load_views(self) -> list[str]:
        """Every stored tenant's facts, in one pass over the store (a service
        calls this before it reports SERVING, so that no tenant's first search
        waits for its facts); the tenants loaded, in store order."""
        rows: dict[str, dict[str, list[tuple[int, PersonalFact, Any]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        async for point in self.vectors.scroll("passages", None):
            tenant = str(point.payload["tenant"])
            rows[tenant][point.doc_id].append(
                (point.passage_index, fact_from_payload(point.payload), point.vector)
            )
        for tenant, documents in rows.items():
            # A tenant loaded (or written) since the pass began keeps its view.
            self._views.setdefault(tenant, _view(tenant, documents))
        return list(rows)

    @property
    def loaded_tenants(self) -> frozenset[str]:
        """The tenants whose facts are in memory."""
        return frozenset(self._views)

    async def put(self, tenant: str, doc_id: str, facts: Sequence[PersonalFact]) -> StoreResult:
        """Replace the document's facts with ``facts`` (entity refs must carry ids)."""
        view = await self.view(tenant)
        known = set(view.names)
        stored = [_with_source(f, doc_id) for f in facts]
        texts = [fact_text(f) for f in stored]
        vectors = await asyncio.to_thread(self.encode, texts) if texts else None
        key = (tenant, doc_id)
        async with self._writing[tenant], awriting(self._barrier):
            removed = len(view.document_facts(doc_id))
            # A document this process has not seen holds nothing in either engine
            # (the view is loaded from the vector store, and a write that failed
            # half-way leaves its key unsettled): nothing to delete first, and
            # without facts nothing to do. Each engine write costs commits.
            if doc_id in view.documents or key in self._unsettled:
                await self.lexical.delete(tenant, [doc_id])
                await self.vectors.delete_documents(tenant, [doc_id])
            elif not stored:
                return StoreResult(dict.fromkeys(FORMS, 0), 0, (), 0)
            self._unsettled.add(key)
            if stored:
                assert vectors is not None
                await self.lexical.index(
                    tenant,
                    [
                        DocumentIn(
                            id=doc_id,
                            title="",
                            body="\n".join(texts),
                            passages=tuple(PassageIn(i, t) for i, t in enumerate(texts)),
                        )
                    ],
                    refresh=True,
                )
                points = [
                    Point(doc_id, i, vectors[i], fact_payload(f)) for i, f in enumerate(stored)
                ]
                mean = vectors.mean(axis=0)
                await self.vectors.upsert("passages", tenant, points)
                await self.vectors.upsert(
                    "articles",
                    tenant,
                    [Point(doc_id, ARTICLE_INDEX, mean / max(float(np.linalg.norm(mean)), 1e-9))],
                )
            view.replace(doc_id, stored, vectors if vectors is not None else _empty())
            self._unsettled.discard(key)
        counts: dict[Form, int] = dict.fromkeys(FORMS, 0)
        refs: dict[str, EntityRef] = {}
        for fact in stored:
            counts[form_of(fact)] += 1
            for ref in entities_of(fact):
                refs.setdefault(ref.id, ref)
        created = sum(1 for i in refs if i not in known)
        return StoreResult(counts, removed, tuple(refs.values()), created)

    async def delete(self, tenant: str, doc_ids: Sequence[str]) -> int:
        """Remove every fact of the documents from both engines; returns how many facts went."""
        view = await self.view(tenant)
        removed = 0
        async with self._writing[tenant], awriting(self._barrier):
            await self.lexical.delete(tenant, list(doc_ids))
            await self.vectors.delete_documents(tenant, list(doc_ids))
            for doc_id in doc_ids:
                removed += len(view.document_facts(doc_id))
                view.replace(doc_id, [], _empty())
                self._unsettled.discard((tenant, doc_id))
        return removed

    async def retrieve(self, tenant: str, query: str, top_k: int) -> list[Fact]:
        """The tenant's facts best matching ``query``: BM25 and vector rankings fused by
        reciprocal rank; each fact's score is its cosine similarity to the query."""
        view = await self.view(tenant)
        if not view.documents:
            return []
        vector = (await asyncio.to_thread(self.encode, [query]))[0]
        hits = await self.lexical.search(
            tenant, SearchQuery(text=query, top_k=top_k, level=Level.PASSAGE)
        )
        nearest = await self.vectors.search("passages", vector, top_k, VectorFilter(tenant=tenant))
        fused: dict[tuple[str, int], float] = defaultdict(float)
        for rank, hit in enumerate(hits):
            fused[(hit.doc_id, hit.passage_index)] += 1.0 / (RRF_K + rank + 1)
        for rank, point in enumerate(nearest):
            fused[(point.doc_id, point.passage_index)] += 1.0 / (RRF_K + rank + 1)
        out: list[Fact] = []
        for doc_id, index in sorted(fused, key=lambda k: -fused[k])[:top_k]:
            doc = view.documents.get(doc_id)
            if doc is None or index >= len(doc.facts):
                continue
            out.append(as_fact(doc.facts[index], min(float(doc.vectors[index] @ vector), 1.0)))
        return out


def _top_rows(scores: Vectors, n: int) -> Any:
    """Indices of the ``n`` highest scores, highest first (as a stable descending sort
    of all of them would give: ties in index order)."""
    if n >= len(scores):
        return np.argsort(-scores, kind="stable")
    part = np.argpartition(-scores, n - 1)[:n]
    return part[np.lexsort((part, -scores[part]))]


def _empty() -> Vectors:
    return np.zeros((0, 0), dtype=np.float32)


def _with_source(fact: PersonalFact, doc_id: str) -> PersonalFact:
    if isinstance(fact, Description):
        return Description(fact.entity, fact.text, PERSONAL, doc_id, fact.provenance)
    if isinstance(fact, Triple):
        return Triple(
            fact.subject,
            fact.relation,
            fact.object_entity,
            fact.object_value,
            PERSONAL,
            doc_id,
            fact.provenance,
        )
    return AspectFact(fact.entity, fact.aspect, fact.value, PERSONAL, doc_id, fact.provenance)


# -------------------------------------------------------------- the base


class PersonalKnowledgeBase:
    """One tenant's personal facts as a ``KnowledgeBase`` (cheap: a view and an encoder).

    Linking: an entity whose name equals the mention (case and spacing
    ignored) is an exact match; otherwise every entity whose name begins with
    the mention's words is chosen, and entity names are ranked by embedding,
    choosing those at ``link_threshold`` or above. Relations: a triple of the
    entity (on either side) answers when its relation is at least
    ``relation_threshold`` similar to the text; otherwise the entity's aspect
    facts that share a word with the text, most similar first.
    """

    name = PERSONAL

    def __init__(
        self,
        facts: TenantFacts,
        encode: Encode,
        *,
        link_threshold: float = PERSONAL_LINK_THRESHOLD,
        relation_threshold: float = PERSONAL_RELATION_THRESHOLD,
        name_vectors: Callable[[Sequence[str]], Vectors] | None = None,
    ) -> None:
        self.facts = facts
        self._encode = encode
        self.link_threshold = link_threshold
        self.relation_threshold = relation_threshold
        self._name_vectors = name_vectors or self.encode

    def warm_up(self) -> None:
        return None

    def encode(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.asarray(self._encode(list(texts)), dtype=np.float32)

    def _entity(self, entity_id: str, name: str) -> KbEntity:
        return KbEntity(id=entity_id, name=name, aliases=(), definition="", knowledge_base=PERSONAL)

    def entity(self, entity_id: str) -> KbEntity | None:
        name = self.facts.names.get(entity_id)
        return None if name is None else self._entity(entity_id, name)

    def exact(self, text: str) -> list[KbEntity]:
        if text in self.facts.names:
            return [self._entity(text, self.facts.names[text])]
        entity_id = personal_entity_id(text)
        name = self.facts.names.get(entity_id)
        return [] if name is None else [self._entity(entity_id, name)]

    def _prefixed(self, mention: str) -> list[KbEntity]:
        """Entities whose name begins with the mention's words ("Marrowgate": "Marrowgate Bank")."""
        words = normalise_name(mention).split()
        if not words:
            return []
        names = self.facts.names
        out = []
        for entity_id in self.facts.by_first_word().get(words[0], ()):
            name = names[entity_id]
            have = normalise_name(name).split()
            if len(have) > len(words) and have[: len(words)] == words:
                out.append(self._entity(entity_id, name))
        return sorted(out, key=lambda e: e.name)

    def entity_linking(
        self, aliases: Sequence[str], context: str = "", *, top_k: int = 5
    ) -> Linking:
        return self.link_mentions([aliases], context, top_k=top_k)[0]

    def link_mentions(
        self, mentions: Sequence[Sequence[str]], context: str = "", *, top_k: int = 5
    ) -> list[Linking]:
        """``entity_linking`` of each mention (its aliases), the aliases that need
        embeddings embedded in one batch."""
        settled = [link_exactly(self.exact, a, top_k, lambda c: c.entity.name) for a in mentions]
        pending = [aliases for aliases, linking in settled if linking is None]
        names = self.facts.names
        if not pending or not names:
            return [linking or Linking(aliases[0], (), None) for aliases, linking in settled]
        ids, row_of, vectors = self.facts.name_matrix(self._name_vectors)
        texts = list(dict.fromkeys(a for aliases in pending for a in aliases))
        encoded = dict(zip(texts, self.encode(texts), strict=True))
        out = []
        for aliases, linking in settled:
            if linking is None:
                query = np.stack([encoded[a] for a in aliases])
                linking = self._by_embedding(aliases, query @ vectors.T, ids, row_of, top_k)
            out.append(linking)
        return out

    def _by_embedding(
        self,
        aliases: Sequence[str],
        similarities: Vectors,
        ids: list[str],
        row_of: dict[str, int],
        top_k: int,
    ) -> Linking:
        names = self.facts.names
        best: dict[str, Candidate] = {}
        chosen: list[str] = []
        sims = similarities.max(axis=0)
        for alias in aliases:
            for entity in self._prefixed(alias):
                if entity.id not in row_of:  # named by a write after the matrix was taken
                    continue
                score = min(float(sims[row_of[entity.id]]), 1.0)
                best.setdefault(entity.id, Candidate(entity, "embedding", score, entity.name))
                chosen.append(entity.id)
        for row in _top_rows(sims, top_k * 4):
            score = min(float(sims[row]), 1.0)
            entity_id = ids[row]
            if score >= self.link_threshold and entity_id not in chosen:
                chosen.append(entity_id)
            best.setdefault(
                entity_id,
                Candidate(
                    self._entity(entity_id, names[entity_id]), "embedding", score, names[entity_id]
                ),
            )
        ranked = sorted(best.values(), key=lambda c: (-c.score, c.entity.name))[:top_k]
        kept = {c.entity.id for c in ranked}
        picked = sorted(
            (i for i in dict.fromkeys(chosen) if i in kept),
            key=lambda i: -best[i].score,
        )
        if not picked:
            return Linking(aliases[0], tuple(ranked), None)
        return Linking(aliases[0], tuple(ranked), picked[0], tuple(picked[1:]))

    def resolve(self, aliases: Sequence[str]) -> KbEntity:
        for alias in aliases:
            found = self.exact(alias)
            if found:
                return found[0]
        linking = self.entity_linking(aliases, top_k=1)
        entity = linking.chosen_entity
        if entity is None:
            raise UnknownEntity(aliases)
        return entity

    def get_entity_info(self, entity: Sequence[str], *, max_facts: int = 100) -> EntityInfo:
        found = self.resolve(entity)
        facts = self.facts.facts_of_entity(found.id)
        descriptions = [f for f in facts if isinstance(f, Description)]
        triples = [f for f in facts if isinstance(f, Triple)]
        aspects = [f for f in facts if isinstance(f, AspectFact)]
        return EntityInfo(
            entity=found,
            descriptions=tuple(descriptions[:max_facts]),
            triples=tuple(triples[:max_facts]),
            truncated=max(len(descriptions), len(triples), len(aspects)) > max_facts,
            aspect_facts=tuple(aspects[:max_facts]),
        )

    def find_entity_or_value(
        self, entity: Sequence[str], relation: Sequence[str], *, top_k: int = 10
    ) -> RelationMatch:
        found = self.resolve(entity)
        texts = [r for r in relation if r.strip()]
        facts = self.facts.facts_of_entity(found.id)
        if not texts or not facts:
            return RelationMatch(None, None, -1.0, entity_id=found.id)
        asked = self.encode(texts)
        triples = [f for f in facts if isinstance(f, Triple)]
        scored: list[Fact] = []
        best_relation: str | None = None
        best = -1.0
        if triples:
            relations = sorted({t.relation for t in triples})
            sims = (asked @ self.encode(relations).T).max(axis=0)
            by_relation = {r: min(float(s), 1.0) for r, s in zip(relations, sims, strict=True)}
            for t in triples:
                score = by_relation[t.relation]
                if score > best:
                    best, best_relation = score, t.relation
                if score >= self.relation_threshold:
                    scored.append(Fact(score, triple=t))
        if scored:
            scored.sort(key=lambda f: -f.score)
            return RelationMatch(best_relation, None, best, tuple(scored[:top_k]), found.id)
        # No relation is close enough: the aspect facts that mention the relation.
        words = set().union(*(content_words(t) for t in texts))
        aspects = [
            f
            for f in facts
            if isinstance(f, AspectFact | Description)
            and content_words(f.text() if isinstance(f, AspectFact) else f.text) & words
        ]
        if not aspects:
            return RelationMatch(None, None, best, (), found.id)
        vectors = self.encode([fact_text(f) for f in aspects])
        sims = (asked @ vectors.T).max(axis=0)
        ranked = sorted(
            (as_fact(f, min(float(s), 1.0)) for f, s in zip(aspects, sims, strict=True)),
            key=lambda f: -f.score,
        )
        return RelationMatch(None, None, best, tuple(ranked[:top_k]), found.id)

    def find_relationship(
        self,
        first: Sequence[str],
        second: Sequence[str],
        *,
        max_hops: int = MAX_HOPS,
        max_paths: int = 10,
    ) -> Relationship:
        a = self.resolve(first)
        b = self.resolve(second)
        paths: list[RelationPath] = []
        if a.id != b.id:
            frontier: list[tuple[str, list[Triple], set[str]]] = [(a.id, [], {a.id})]
            for _ in range(max_hops):
                nxt: list[tuple[str, list[Triple], set[str]]] = []
                for node, path, seen in frontier:
                    for fact in self.facts.facts_of_entity(node):
                        if not isinstance(fact, Triple):
                            continue
                        other = fact.other(node)
                        if other is None or other.id in seen:
                            continue
                        if other.id == b.id:
                            paths.append(RelationPath((*path, fact)))
                        else:
                            nxt.append((other.id, [*path, fact], seen | {other.id}))
                if len(paths) >= max_paths:
                    break
                frontier = nxt
        shared = tuple(sorted(content_words(a.name) & content_words(b.name)))
        similarity = None
        if shared and a.id != b.id:
            vectors = self.encode([a.name, b.name])
            similarity = min(float(vectors[0] @ vectors[1]), 1.0)
        return Relationship(a, b, tuple(paths[:max_paths]), shared, similarity)


def _view(tenant: str, rows: Mapping[str, list[tuple[int, PersonalFact, Any]]]) -> TenantFacts:
    """A tenant's facts from its stored points, (passage index, fact, vector) by document."""
    view = TenantFacts(tenant)
    for doc_id, items in rows.items():
        items.sort(key=lambda r: r[0])
        view.documents[doc_id] = _Document(
            [f for _, f, _ in items],
            np.stack([np.asarray(v, dtype=np.float32) for _, _, v in items]),
        )
    return view


class NameVectors:
    """Embeddings of entity names, each name embedded once per process."""

    def __init__(self, encode: Encode, capacity: int = 200_000) -> None:
        self._encode = encode
        self._memo: dict[str, Any] = {}
        self._capacity = capacity
        self._lock = threading.Lock()

    def __call__(self, names: Sequence[str]) -> Vectors:
        if not names:
            return _empty()
        with self._lock:
            known = {n: self._memo[n] for n in names if n in self._memo}
        missing = [n for n in dict.fromkeys(names) if n not in known]
        if missing:
            vectors = np.asarray(self._encode(missing), dtype=np.float32)
            fresh = dict(zip(missing, vectors, strict=True))
            known.update(fresh)
            with self._lock:
                if len(self._memo) + len(fresh) > self._capacity:
                    self._memo.clear()
                self._memo.update(fresh)
        return np.stack([known[n] for n in names])


def describe_counts(counts: dict[Form, int]) -> str:
    return ", ".join(f"{counts[f]} {f}s" for f in FORMS)


def iter_facts(view: TenantFacts) -> Iterable[PersonalFact]:
    for doc in view.documents.values():
        yield from doc.facts
