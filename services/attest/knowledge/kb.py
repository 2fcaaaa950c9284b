"""Knowledge-base operations (KnowledGPT) over a ``KnowledgeBase`` interface (no grpc).

A question is answered by a short program over four operations. Every
operation names an entity by a list of aliases (the entity id counts as an
alias), so a program never has to know how a base stores its entities:

* ``entity_linking(aliases, context)``: candidate entities for a mention, best
  first, and the one chosen when a candidate is good enough;
* ``get_entity_info(entity)``: the entity, its descriptions and every triple it
  takes part in;
* ``find_entity_or_value(entity, relation)``: the triples of the entity whose
  relation best matches free text (the answer is each triple's other side),
  or, when no relation matches, the sentence of a description that states it;
* ``find_relationship(entity1, entity2)``: the chains of triples that connect
  two entities, and how similar their names are when they share words.

Adding a base (a Wikidata-style adapter, the personal base) means writing a
class with these methods returning the value types below; callers (the plan
interpreter, the servicer, the CLI) only see the protocol. An adapter maps its
own ids and relation names into ``KbEntity`` and ``Triple``; ``knowledge_base``
on every result says where a fact came from.

``EsgKnowledgeBase`` is the base over the shipped ESG graph: entities are the
graph's nodes (root, pillars, GRI topics, indicators), triples are its edges
``(parent, relation, child)``, and the one description of an entity is its
definition.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from attest.knowledge.graph import KnowledgeGraph, Level
from attest.knowledge.linking import (
    DEFAULT_SINGLE_WORD_THRESHOLD,
    DEFAULT_THRESHOLD,
    EntityLinker,
    split_sentences,
)

Vectors = npt.NDArray[np.float32]
Encode = Callable[[Sequence[str]], Vectors]

ESG_GRAPH: Final = "esg_graph"
PERSONAL: Final = "personal"

# A mention links by embedding when its similarity to an entity's name, an
# alias or its "name: definition" text reaches the article linker's threshold
# (attest.knowledge.linking.DEFAULT_THRESHOLD, 0.65, chosen on the demo and
# Reuters articles); a one-word mention needs DEFAULT_SINGLE_WORD_THRESHOLD
# (0.9), because MiniLM puts a lone word close to any phrase containing it.
# Below the threshold a candidate is still listed, but none is chosen.
LINK_THRESHOLD: Final = DEFAULT_THRESHOLD
SINGLE_WORD_LINK_THRESHOLD: Final = DEFAULT_SINGLE_WORD_THRESHOLD
# Candidates under this similarity are not worth listing at all.
CANDIDATE_FLOOR: Final = 0.35

# A relation in free text matches the entity's best relation only with at
# least this similarity to one of that relation's phrases (RELATION_PHRASES);
# below it the answer comes from the definition sentence that mentions the
# relation. Measured with MiniLM: a phrase of the list scores 1.0, and
# paraphrases on Greenhouse gas emission "metrics used" 0.93, "origin" 0.93,
# "where it comes from" 0.76, on Environment "issues" 0.80, "subjects" 0.68;
# aspects the graph does not hold stay lower: "members" 0.48 (Environment),
# "founded in" 0.45, "part of" 0.36 (GHG has no such edge), "revenue" 0.31,
# "headquarters" 0.29, "CEO" 0.25. 0.5 sits between the two groups; it misses
# "categories" (0.43 to "types") and "subcategories" (0.32).
RELATION_THRESHOLD: Final = 0.5

MAX_HOPS: Final = 3

MatchKind = Literal["exact", "embedding"]
Direction = Literal["forward", "inverse"]


# ------------------------------------------------------------------ values


@dataclass(frozen=True, slots=True)
class KbEntity:
    """An entity of any base. ``level`` and ``gri_id`` are ESG graph notions (else None)."""

    id: str
    name: str
    aliases: tuple[str, ...]
    definition: str
    knowledge_base: str
    level: str | None = None
    gri_id: str | None = None


@dataclass(frozen=True, slots=True)
class EntityRef:
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class Candidate:
    """A candidate entity for a mention; ``score`` is 1.0 for exact matches."""

    entity: KbEntity
    match: MatchKind
    score: float
    matched_name: str


@dataclass(frozen=True, slots=True)
class Linking:
    """Candidates for one mention, best first, and the chosen id (None when none is good enough).

    ``also_chosen`` are further candidates good enough to choose: the ESG graph
    chooses one entity, the personal base may choose several ("Marrowgate"
    names both "Marrowgate Bank" and "Marrowgate Holdings").
    """

    mention: str
    candidates: tuple[Candidate, ...]
    chosen: str | None
    also_chosen: tuple[str, ...] = ()

    @property
    def chosen_ids(self) -> tuple[str, ...]:
        """Every chosen id, best first."""
        return (self.chosen, *self.also_chosen) if self.chosen is not None else ()

    @property
    def chosen_entity(self) -> KbEntity | None:
        return next((c.entity for c in self.candidates if c.entity.id == self.chosen), None)


@dataclass(frozen=True, slots=True)
class Provenance:
    """Where a personal fact was stated: passage index and character offsets in the body."""

    passage_index: int = -1
    start_char: int = 0
    end_char: int = 0


NO_PROVENANCE: Final = Provenance()


@dataclass(frozen=True, slots=True)
class Triple:
    """``(subject, relation, object)``; the object is an entity or a literal value."""

    subject: EntityRef
    relation: str
    object_entity: EntityRef | None
    object_value: str | None
    knowledge_base: str
    source_doc_id: str = ""
    provenance: Provenance = NO_PROVENANCE

    def other(self, entity_id: str) -> EntityRef | None:
        """The side of the triple that is not ``entity_id`` (None for a literal object)."""
        if self.subject.id == entity_id:
            return self.object_entity
        return self.subject

    def text(self) -> str:
        obj = self.object_entity.name if self.object_entity else self.object_value
        return f"({self.subject.name}, {self.relation}, {obj})"


@dataclass(frozen=True, slots=True)
class Description:
    entity: EntityRef
    text: str
    knowledge_base: str
    source_doc_id: str = ""
    provenance: Provenance = NO_PROVENANCE

    def text_form(self) -> str:
        return f"{self.entity.name}: {self.text}"


@dataclass(frozen=True, slots=True)
class AspectFact:
    """What a document says about one aspect of an entity (personal base only)."""

    entity: EntityRef
    aspect: str
    value: str
    knowledge_base: str
    source_doc_id: str = ""
    provenance: Provenance = NO_PROVENANCE

    def text(self) -> str:
        return f"{self.entity.name} ({self.aspect}): {self.value}"


@dataclass(frozen=True, slots=True)
class Fact:
    """One fact (a triple, a description or an aspect fact) with its relevance in [-1, 1]."""

    score: float
    triple: Triple | None = None
    description: Description | None = None
    aspect_fact: AspectFact | None = None

    def text(self) -> str:
        if self.triple is not None:
            return self.triple.text()
        if self.aspect_fact is not None:
            return self.aspect_fact.text()
        assert self.description is not None
        return self.description.text_form()

    def key(self) -> str:
        """Identity of the fact: its text and, for personal facts, where it was stated."""
        for part in (self.triple, self.aspect_fact, self.description):
            if part is not None and part.source_doc_id:
                p = part.provenance
                return f"{self.text()}\x1f{part.source_doc_id}\x1f{p.start_char}:{p.end_char}"
        return self.text()

    def rescored(self, score: float) -> Fact:
        return Fact(score, self.triple, self.description, self.aspect_fact)


@dataclass(frozen=True, slots=True)
class EntityInfo:
    entity: KbEntity
    descriptions: tuple[Description, ...]
    triples: tuple[Triple, ...]
    truncated: bool = False
    aspect_facts: tuple[AspectFact, ...] = ()


@dataclass(frozen=True, slots=True)
class RelationPath:
    """Triples from the first entity to the second; a triple may be walked object -> subject."""

    triples: tuple[Triple, ...]


@dataclass(frozen=True, slots=True)
class Relationship:
    """How two entities relate: graph paths (shortest first) and, when their names share
    words, the similarity of the names (None when they share none)."""

    first: KbEntity
    second: KbEntity
    paths: tuple[RelationPath, ...]
    shared_words: tuple[str, ...] = ()
    name_similarity: float | None = None


@dataclass(frozen=True, slots=True)
class RelationMatch:
    """The relation a free-text relation matched, its direction and the facts it yields."""

    relation: str | None
    direction: Direction | None
    score: float
    facts: tuple[Fact, ...] = field(default=())
    # The entity asked about, when the facts may hold it on either side (the
    # personal base matches triples in both directions at once).
    entity_id: str | None = None


class UnknownEntity(LookupError):
    """No entity of the base answers to any of the aliases."""

    def __init__(self, aliases: Sequence[str]) -> None:
        super().__init__(f"no entity matches {list(aliases)!r}")
        self.aliases = tuple(aliases)


# ---------------------------------------------------------------- protocol


@runtime_checkable
class KnowledgeBase(Protocol):
    """What every knowledge base offers the plan interpreter, the servicer and the CLI.

    Entities are named by aliases (any of an entity's names, or its id). An
    operation that needs one entity resolves its aliases by exact match first
    and then by linking; when nothing matches it raises ``UnknownEntity``.
    Implementations must be safe to call from several threads once warmed up.
    """

    #: The base's name as results report it (``"esg_graph"``, ``"personal"``, ``"wikidata"``).
    name: str

    def warm_up(self) -> None:
        """Load models and embed the base's texts; cheap to call again."""

    def entity(self, entity_id: str) -> KbEntity | None:
        """The entity with this id, or None."""

    def exact(self, text: str) -> list[KbEntity]:
        """Entities whose id, name or an alias equals ``text`` (case and spacing ignored);
        no embeddings, so cheap enough to try on every span of a question."""

    def entity_linking(
        self, aliases: Sequence[str], context: str = "", *, top_k: int = 5
    ) -> Linking:
        """Candidates for the entity the aliases name, best first, with the chosen one.

        ``context`` is the text the mention comes from; a base may use it to
        choose among candidates (the ESG base breaks near-ties with it).
        """

    def get_entity_info(self, entity: Sequence[str], *, max_facts: int = 100) -> EntityInfo:
        """The entity, its descriptions and the triples it takes part in (either side)."""

    def find_entity_or_value(
        self, entity: Sequence[str], relation: Sequence[str], *, top_k: int = 10
    ) -> RelationMatch:
        """Facts answering "what is the <relation> of <entity>", best first."""

    def find_relationship(
        self,
        first: Sequence[str],
        second: Sequence[str],
        *,
        max_hops: int = MAX_HOPS,
        max_paths: int = 10,
    ) -> Relationship:
        """How two entities are related."""


def link_exactly(
    exact: Callable[[str], list[KbEntity]],
    aliases: Sequence[str],
    top_k: int,
    order: Callable[[Candidate], Any],
) -> tuple[list[str], Linking | None]:
    """The start of every base's ``entity_linking``: the non-blank aliases and, when
    they settle the linking without embeddings, that linking.

    They settle it when none is left (nothing chosen) or when one matches an
    entity by ``exact``: the entity the caller named, so embeddings would add
    nothing. The exact candidates come in ``order``, the first one chosen.
    """
    aliases = [a for a in aliases if a.strip()]
    if not aliases:
        return aliases, Linking("", (), None)
    best: dict[str, Candidate] = {}
    for alias in aliases:
        for entity in exact(alias):
            best.setdefault(entity.id, Candidate(entity, "exact", 1.0, alias))
    if not best:
        return aliases, None
    ranked = sorted(best.values(), key=order)[:top_k]
    return aliases, Linking(aliases[0], tuple(ranked), ranked[0].entity.id)


# ------------------------------------------------------- the ESG graph base

# Phrases for each (relation, direction) of the ESG graph's edges, which all
# go parent -> child. "forward" asks for the children of an entity, "inverse"
# for its parents. Relation text is matched against these by embedding.
RELATION_PHRASES: Final[dict[tuple[str, Direction], tuple[str, ...]]] = {
    ("contains", "forward"): (
        "contains",
        "includes",
        "topics",
        "subtopics",
        "topics under",
        "issues covered",
        "consists of",
    ),
    ("contains", "inverse"): (
        "part of",
        "belongs to",
        "contained in",
        "pillar",
        "falls under",
        "category of",
    ),
    ("measured_as", "forward"): (
        "measures",
        "measured as",
        "metrics",
        "indicators",
        "how is it measured",
        "measured by",
    ),
    ("measured_as", "inverse"): (
        "measure of",
        "metric of",
        "indicator of",
        "what does it measure",
    ),
    ("process", "forward"): (
        "processes",
        "actions",
        "practices",
        "activities",
        "management approaches",
    ),
    ("process", "inverse"): ("process of", "practice of", "action on"),
    ("type", "forward"): ("types", "kinds", "varieties", "examples", "forms"),
    ("type", "inverse"): ("type of", "kind of", "example of", "form of"),
    ("source", "forward"): ("sources", "causes", "comes from", "scopes", "origins"),
    ("source", "inverse"): ("source of", "cause of", "contributes to"),
}

_WORD: Final = re.compile(r"[^\W_]+(?:[-'][^\W_]+)*")
# "GRI 305", "gri-305", "GRI305": the topic standard's number names its basic entity.
_GRI_REFERENCE: Final = re.compile(r"gri[\s-]?([1-9][0-9]{2})")
# Words that say nothing about which entity is meant.
_FUNCTION_WORDS: Final = frozenset(
    [
        "a",
        "an",
        "and",
        "as",
        "at",
        "by",
        "for",
        "from",
        "in",
        "into",
        "of",
        "on",
        "or",
        "the",
        "to",
        "with",
    ]
)


def _normalise(text: str) -> str:
    return " ".join(text.split()).casefold()


def content_words(text: str) -> set[str]:
    """Lower-case words of ``text`` without function words, a final plural 's' dropped."""
    out: set[str] = set()
    for word in _WORD.findall(text.casefold()):
        if word in _FUNCTION_WORDS:
            continue
        out.add(word[:-1] if len(word) > 3 and word.endswith("s") else word)
    return out


class EsgKnowledgeBase:
    """The shipped ESG graph as a knowledge base.

    Construction is cheap; ``warm_up`` (or the first operation that needs
    embeddings) embeds every name, alias and definition and every relation
    phrase once, with the encoder the article linker uses.
    """

    name = ESG_GRAPH

    def __init__(
        self,
        graph: KnowledgeGraph,
        encode: Encode,
        *,
        link_threshold: float = LINK_THRESHOLD,
        single_word_threshold: float = SINGLE_WORD_LINK_THRESHOLD,
        relation_threshold: float = RELATION_THRESHOLD,
    ) -> None:
        self.graph = graph
        # The article linker holds the encoder and validates the thresholds;
        # its keyphrase extractor serves the planner too.
        self.linker = EntityLinker(
            graph,
            encode,
            threshold=link_threshold,
            single_word_threshold=single_word_threshold,
            levels=tuple(Level),
        )
        self.relation_threshold = relation_threshold
        self._encode = encode
        self._lock = threading.Lock()
        self._rows: Vectors | None = None
        self._row_owner: list[str] = []
        self._row_text: list[str] = []
        self._relation_vectors: Vectors | None = None
        self._relation_keys: list[tuple[str, Direction]] = []
        self._entities = {e.id: self._to_entity(e.id) for e in graph.entities.values()}

    # -- set-up

    def warm_up(self) -> None:
        with self._lock:
            if self._rows is not None:
                return
            texts: list[str] = []
            owner: list[str] = []
            for entity in self.graph.entities.values():
                names = self.graph.attributes(entity.id)
                for text in (*names, f"{entity.name}: {entity.definition}"):
                    texts.append(text)
                    owner.append(entity.id)
            keys: list[tuple[str, Direction]] = []
            phrases: list[str] = []
            for key, values in RELATION_PHRASES.items():
                for phrase in values:
                    keys.append(key)
                    phrases.append(phrase)
            vectors = self.encode([*texts, *phrases])
            self._row_owner = owner
            self._row_text = texts
            self._relation_keys = keys
            self._relation_vectors = vectors[len(texts) :]
            self._rows = vectors[: len(texts)]

    def encode(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.asarray(self._encode(list(texts)), dtype=np.float32)

    def _to_entity(self, entity_id: str) -> KbEntity:
        e = self.graph.entity(entity_id)
        return KbEntity(
            id=e.id,
            name=e.name,
            aliases=e.aliases,
            definition=e.definition,
            knowledge_base=ESG_GRAPH,
            level=e.level.value,
            gri_id=e.gri_id,
        )

    def _ref(self, entity_id: str) -> EntityRef:
        return EntityRef(id=entity_id, name=self.graph.entity(entity_id).name)

    # -- the protocol

    def entity(self, entity_id: str) -> KbEntity | None:
        return self._entities.get(entity_id)

    @property
    def entities(self) -> list[KbEntity]:
        return list(self._entities.values())

    def exact(self, text: str) -> list[KbEntity]:
        """Entities whose id, name, an alias or GRI number ("GRI 305") equals ``text``
        (case and spacing ignored)."""
        found = [self._entities[i] for i in self.graph.lookup(text)]
        key = _normalise(text)
        if key in self._entities and all(e.id != key for e in found):
            found.insert(0, self._entities[key])
        gri = _GRI_REFERENCE.fullmatch(key)
        if gri is not None:
            topic = self.graph.gri_topic(gri.group(1))
            if topic is not None and all(e.id != topic.id for e in found):
                found.append(self._entities[topic.id])
        return found

    def entity_linking(
        self, aliases: Sequence[str], context: str = "", *, top_k: int = 5
    ) -> Linking:
        aliases, settled = link_exactly(self.exact, aliases, top_k, lambda c: c.entity.id)
        if settled is not None:
            return settled
        mention = aliases[0]
        best: dict[str, Candidate] = {}
        self.warm_up()
        assert self._rows is not None
        sims = self.encode(aliases) @ self._rows.T  # aliases x rows
        for a in range(len(aliases)):
            order = np.argsort(-sims[a])
            for row in order[: top_k * 8]:
                score = min(float(sims[a, row]), 1.0)
                if score < CANDIDATE_FLOOR:
                    break
                owner = self._row_owner[row]
                if owner not in best or score > best[owner].score:
                    best[owner] = Candidate(
                        self._entities[owner], "embedding", score, self._row_text[row]
                    )
        ranked = sorted(best.values(), key=lambda c: (-c.score, c.entity.id))
        if context.strip() and len(ranked) > 1:
            ranked = self._break_ties(ranked, context)
        ranked = ranked[:top_k]
        chosen = None
        if ranked:
            top = ranked[0]
            needed = (
                self.linker.single_word_threshold
                if all(len(a.split()) == 1 for a in aliases)
                else self.linker.threshold
            )
            if top.score >= needed:
                chosen = top.entity.id
        return Linking(mention, tuple(ranked), chosen)

    def _break_ties(self, ranked: list[Candidate], context: str) -> list[Candidate]:
        """Candidates within 0.02 of the best are ordered by their definition's similarity
        to the context; the rest keep their order."""
        near = [c for c in ranked if ranked[0].score - c.score <= 0.02]
        if len(near) < 2:
            return ranked
        vectors = self.encode([context, *(c.entity.definition for c in near)])
        sims = vectors[1:] @ vectors[0]
        order = sorted(range(len(near)), key=lambda i: -float(sims[i]))
        return [near[i] for i in order] + ranked[len(near) :]

    def resolve(self, aliases: Sequence[str]) -> KbEntity:
        """The entity the aliases name: an id or exact match, else the linked entity."""
        linking = self.entity_linking(aliases, top_k=1)
        entity = linking.chosen_entity
        if entity is None:
            raise UnknownEntity(aliases)
        return entity

    def triples_of(self, entity_id: str) -> list[Triple]:
        """Every edge touching the entity, as triples: to its parents first, then its children."""
        out = [
            Triple(self._ref(e.parent), e.relation, self._ref(e.child), None, ESG_GRAPH)
            for e in self.graph.parent_edges(entity_id)
        ]
        out.extend(
            Triple(self._ref(e.parent), e.relation, self._ref(e.child), None, ESG_GRAPH)
            for e in self.graph.child_edges(entity_id)
        )
        return out

    def get_entity_info(self, entity: Sequence[str], *, max_facts: int = 100) -> EntityInfo:
        found = self.resolve(entity)
        triples = self.triples_of(found.id)
        description = Description(self._ref(found.id), found.definition, ESG_GRAPH)
        return EntityInfo(
            entity=found,
            descriptions=(description,),
            triples=tuple(triples[:max_facts]),
            truncated=len(triples) > max_facts,
        )

    def match_relation(
        self, entity_id: str, relation: Sequence[str]
    ) -> tuple[tuple[str, Direction] | None, float]:
        """The entity's (relation, direction) best matching the text, and its similarity."""
        have: set[tuple[str, Direction]] = {
            (e.relation, "inverse") for e in self.graph.parent_edges(entity_id)
        } | {(e.relation, "forward") for e in self.graph.child_edges(entity_id)}
        texts = [r for r in relation if r.strip()]
        if not have or not texts:
            return None, -1.0
        self.warm_up()
        assert self._relation_vectors is not None
        sims = (self.encode(texts) @ self._relation_vectors.T).max(axis=0)
        best: tuple[str, Direction] | None = None
        best_score = -1.0
        for row, key in enumerate(self._relation_keys):
            score = min(float(sims[row]), 1.0)
            if key in have and score > best_score:
                best, best_score = key, score
        return best, best_score

    def find_entity_or_value(
        self, entity: Sequence[str], relation: Sequence[str], *, top_k: int = 10
    ) -> RelationMatch:
        found = self.resolve(entity)
        key, score = self.match_relation(found.id, relation)
        if key is not None and score >= self.relation_threshold:
            name, direction = key
            edges = (
                self.graph.child_edges(found.id)
                if direction == "forward"
                else self.graph.parent_edges(found.id)
            )
            facts = tuple(
                Fact(
                    score,
                    triple=Triple(
                        self._ref(e.parent), e.relation, self._ref(e.child), None, ESG_GRAPH
                    ),
                )
                for e in edges
                if e.relation == name
            )
            return RelationMatch(name, direction, score, facts[:top_k], found.id)
        sentence = self._definition_sentence(found, relation)
        if sentence is None:
            return RelationMatch(None, None, score, entity_id=found.id)
        fact = Fact(
            sentence[1], description=Description(self._ref(found.id), sentence[0], ESG_GRAPH)
        )
        return RelationMatch(None, None, score, (fact,), found.id)

    def _definition_sentence(
        self, entity: KbEntity, relation: Sequence[str]
    ) -> tuple[str, float] | None:
        """The definition sentence that mentions the relation (a shared content word), the
        most similar one when several do; None when none does."""
        words = set().union(*(content_words(r) for r in relation)) if relation else set()
        sentences = [s for s in split_sentences(entity.definition) if content_words(s) & words]
        if not sentences:
            return None
        vectors = self.encode([" ".join(relation), *sentences])
        sims = vectors[1:] @ vectors[0]
        best = int(np.argmax(sims))
        return sentences[best], min(float(sims[best]), 1.0)

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
        paths = self._paths(a.id, b.id, max_hops, max_paths)
        shared = tuple(sorted(content_words(a.name) & content_words(b.name)))
        similarity = None
        if shared and a.id != b.id:
            vectors = self.encode([a.name, b.name])
            similarity = min(float(vectors[0] @ vectors[1]), 1.0)
        return Relationship(a, b, tuple(paths), shared, similarity)

    def _paths(self, start: str, goal: str, max_hops: int, max_paths: int) -> list[RelationPath]:
        """Simple paths of at most ``max_hops`` edges (walked either way), shortest first."""
        if start == goal:
            return []
        found: list[list[Triple]] = []
        frontier: list[tuple[str, list[Triple], set[str]]] = [(start, [], {start})]
        for _ in range(max_hops):
            nxt: list[tuple[str, list[Triple], set[str]]] = []
            for node, path, seen in frontier:
                for triple in self.triples_of(node):
                    other = triple.other(node)
                    if other is None or other.id in seen:
                        continue
                    extended = [*path, triple]
                    if other.id == goal:
                        found.append(extended)
                    else:
                        nxt.append((other.id, extended, seen | {other.id}))
            if len(found) >= max_paths:
                break
            frontier = nxt
        return [RelationPath(tuple(p)) for p in found[:max_paths]]
