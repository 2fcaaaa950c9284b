"""The ESG knowledge graph: loading, validation and traversal (no grpc).

The graph is product data (``esg_graph.yaml`` next to this module): a root,
three pillars, basic entities (GRI topics and ``GRI_none`` topics),
intermediate and lower-level entities. Each entity names its parents and the
relation from each parent to it; an entity may have several parents, so the
graph is a DAG whose every node reaches the root.

``load_graph`` refuses a file that breaks any of those rules with a
``GraphError`` naming the entity and the fault, so a bad edit fails at start-up
(and in the test that loads the shipped file), never halfway through scoring.
"""

from __future__ import annotations

import enum
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import yaml  # type: ignore[import-untyped]

GRAPH_PACKAGE: Final = "attest.knowledge"
GRAPH_RESOURCE: Final = "esg_graph.yaml"
GRI_NONE: Final = "GRI_none"

Vectors = npt.NDArray[np.float32]
Encode = Callable[[Sequence[str]], Vectors]

_ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_GRI_NUMBER = re.compile(r"[1-9][0-9]{2}")
_ENTITY_KEYS: Final = frozenset({"id", "level", "name", "aliases", "definition", "gri", "parents"})


class GraphError(ValueError):
    """The graph file is invalid; ``entity_id`` names the offending entity when there is one."""

    def __init__(self, message: str, *, entity_id: str | None = None) -> None:
        super().__init__(message)
        self.entity_id = entity_id


class Level(enum.Enum):
    """Levels from the top down; an edge always goes one level down."""

    ROOT = "root"
    PILLAR = "pillar"
    BASIC = "basic"
    INTERMEDIATE = "intermediate"
    LOWER = "lower"

    @property
    def depth(self) -> int:
        """0 for the root, 4 for lower-level entities."""
        return _DEPTH[self]


_DEPTH: Final = {level: depth for depth, level in enumerate(Level)}

CONTAINS: Final = "contains"
PROCESS: Final = "process"
MEASURED_AS: Final = "measured_as"
TYPE: Final = "type"
SOURCE: Final = "source"
RELATIONS: Final = (CONTAINS, PROCESS, MEASURED_AS, TYPE, SOURCE)

# The relations a parent may have to a child, by (parent level, child level).
# A pair that is missing is not allowed at all (levels are never skipped).
ALLOWED_RELATIONS: Final[Mapping[tuple[Level, Level], frozenset[str]]] = {
    (Level.ROOT, Level.PILLAR): frozenset({CONTAINS}),
    (Level.PILLAR, Level.BASIC): frozenset({CONTAINS}),
    (Level.BASIC, Level.INTERMEDIATE): frozenset({CONTAINS, PROCESS, MEASURED_AS}),
    (Level.INTERMEDIATE, Level.LOWER): frozenset({TYPE, SOURCE, MEASURED_AS}),
}


@dataclass(frozen=True, slots=True)
class Entity:
    """One node of the graph.

    ``gri_id`` is set on basic entities only: ``"GRI 305"`` for a GRI topic
    standard (the form the GRI uses and the API returns), ``"GRI_none"`` for a
    basic topic without a number.
    """

    id: str
    name: str
    level: Level
    aliases: tuple[str, ...]
    definition: str
    gri_id: str | None = None


@dataclass(frozen=True, slots=True)
class Edge:
    parent: str
    child: str
    relation: str


class KnowledgeGraph:
    """A validated graph. Build it with ``load_graph`` or ``KnowledgeGraph.from_mapping``."""

    def __init__(
        self,
        *,
        version: str,
        entities: Mapping[str, Entity],
        edges: Iterable[Edge],
        credits: tuple[Mapping[str, str], ...] = (),
        source: str = "",
    ) -> None:
        self.version = version
        self.entities: dict[str, Entity] = dict(entities)
        self.edges: tuple[Edge, ...] = tuple(edges)
        self.credits = credits
        self.source = source
        self._parents: dict[str, list[Edge]] = {entity_id: [] for entity_id in self.entities}
        self._children: dict[str, list[Edge]] = {entity_id: [] for entity_id in self.entities}
        for edge in self.edges:
            self._parents[edge.child].append(edge)
            self._children[edge.parent].append(edge)
        roots = [e.id for e in self.entities.values() if e.level is Level.ROOT]
        self.root_id = roots[0] if roots else ""
        self._by_text: dict[str, list[str]] = {}
        for entity in self.entities.values():
            for text in self.attributes(entity.id):
                self._by_text.setdefault(_normalise(text), []).append(entity.id)

    @classmethod
    def from_mapping(cls, data: Any, *, source: str = "<mapping>") -> KnowledgeGraph:
        """Validate parsed graph data (the YAML document) and build the graph."""
        return _build(data, source)

    def __contains__(self, entity_id: object) -> bool:
        return entity_id in self.entities

    def __len__(self) -> int:
        return len(self.entities)

    def entity(self, entity_id: str) -> Entity:
        """The entity with this id; ``KeyError`` naming the id when there is none."""
        try:
            return self.entities[entity_id]
        except KeyError:
            raise KeyError(f"unknown entity id {entity_id!r}") from None

    def at_level(self, level: Level) -> list[Entity]:
        """Entities of one level, in file order."""
        return [e for e in self.entities.values() if e.level is level]

    def parents(self, entity_id: str) -> list[str]:
        """Direct parents, in the order the file lists them."""
        self.entity(entity_id)
        return [edge.parent for edge in self._parents[entity_id]]

    def children(self, entity_id: str) -> list[str]:
        """Direct children, in file order."""
        self.entity(entity_id)
        return [edge.child for edge in self._children[entity_id]]

    def parent_edges(self, entity_id: str) -> list[Edge]:
        self.entity(entity_id)
        return list(self._parents[entity_id])

    def child_edges(self, entity_id: str) -> list[Edge]:
        self.entity(entity_id)
        return list(self._children[entity_id])

    def ancestors(self, entity_id: str) -> list[str]:
        """Every node on every path from ``entity_id`` up to the root, itself included.

        Ordered from the entity upwards (by level, then by discovery), so the
        root comes last.
        """
        self.entity(entity_id)
        seen = {entity_id: 0}
        frontier = [entity_id]
        while frontier:
            nxt: list[str] = []
            for node in frontier:
                for edge in self._parents[node]:
                    if edge.parent not in seen:
                        seen[edge.parent] = len(seen)
                        nxt.append(edge.parent)
            frontier = nxt
        return sorted(seen, key=lambda n: (-self.entities[n].level.depth, seen[n]))

    def paths_to_root(self, entity_id: str) -> list[list[str]]:
        """Every path from ``entity_id`` to the root, each starting at the entity."""
        self.entity(entity_id)
        paths: list[list[str]] = []

        def walk(node: str, path: list[str]) -> None:
            edges = self._parents[node]
            if not edges:
                paths.append(path)
                return
            for edge in edges:
                walk(edge.parent, [*path, edge.parent])

        walk(entity_id, [entity_id])
        return paths

    def attributes(self, entity_id: str, *, with_definition: bool = False) -> list[str]:
        """The name and the aliases (case-insensitive duplicates dropped).

        With ``with_definition`` the definition is appended: KG path scoring
        may compare a question with definitions as well as names.
        """
        entity = self.entity(entity_id)
        out: list[str] = []
        seen: set[str] = set()
        for text in (entity.name, *entity.aliases):
            key = _normalise(text)
            if key not in seen:
                seen.add(key)
                out.append(text)
        if with_definition:
            out.append(entity.definition)
        return out

    def attribute_texts(self) -> list[str]:
        """Every entity's names and aliases, each distinct text once, sorted."""
        return sorted({t for entity_id in self.entities for t in self.attributes(entity_id)})

    def attribute_vectors(self, texts: Sequence[str], encode: Encode) -> Vectors:
        """``encode(texts)`` for names and aliases of this graph.

        With a model that has a fingerprint (see ``attest.core.cache``) the
        vectors of every attribute of the graph are computed once per process
        and kept on disk, whoever asks (the KG scorer, the entity linker), and
        ``texts`` are rows of them; with any other ``encode`` it is called on
        ``texts``.
        """
        from attest.core.cache import fingerprint_of, text_vectors

        model = fingerprint_of(encode)
        every = self.attribute_texts()
        row = {text: i for i, text in enumerate(every)}
        if model is None or any(t not in row for t in texts):
            return text_vectors(texts, encode, None)
        vectors = text_vectors(every, encode, model)
        out: Vectors = vectors[[row[t] for t in texts]]
        return out

    def lookup(self, text: str) -> list[str]:
        """Ids of entities whose name or an alias equals ``text`` (case and spacing ignored)."""
        return list(self._by_text.get(_normalise(text), ()))

    def gri_topic(self, number: str | int) -> Entity | None:
        """The basic entity of a GRI topic standard, e.g. ``gri_topic(305)``."""
        wanted = f"GRI {number}"
        return next((e for e in self.entities.values() if e.gri_id == wanted), None)

    def stats(self) -> dict[str, dict[str, int]]:
        """Counts: ``{"levels": {level: n}, "relations": {relation: n}}``, every key present."""
        levels = Counter(e.level.value for e in self.entities.values())
        relations = Counter(edge.relation for edge in self.edges)
        return {
            "levels": {level.value: levels.get(level.value, 0) for level in Level},
            "relations": {relation: relations.get(relation, 0) for relation in RELATIONS},
        }


def load_graph(path: Path | None = None) -> KnowledgeGraph:
    """Load and validate a graph file; the shipped ``esg_graph.yaml`` by default."""
    if path is None:
        resource = resources.files(GRAPH_PACKAGE).joinpath(GRAPH_RESOURCE)
        text = resource.read_text(encoding="utf-8")
        source = GRAPH_RESOURCE
    else:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as err:
            raise GraphError(f"cannot read graph file {path}: {err.strerror}") from err
        source = str(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise GraphError(f"{source}: not valid YAML: {err}") from err
    return _build(data, source)


# ---------------------------------------------------------------- validation


def _normalise(text: str) -> str:
    return " ".join(text.split()).casefold()


def _fail(message: str, entity_id: str | None = None) -> GraphError:
    return GraphError(message, entity_id=entity_id)


def _text(raw: Mapping[str, Any], key: str, entity_id: str) -> str:
    value = raw.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise _fail(f"entity {entity_id!r}: missing {key}", entity_id)
    if not isinstance(value, str):
        raise _fail(f"entity {entity_id!r}: {key} must be a string, got {value!r}", entity_id)
    return " ".join(value.split())


def _gri(raw: Mapping[str, Any], entity_id: str, level: Level) -> str | None:
    value = raw.get("gri")
    if level is not Level.BASIC:
        if value is not None:
            raise _fail(
                f"entity {entity_id!r}: gri is only for basic entities, not {level.value}",
                entity_id,
            )
        return None
    if value is None or value == "":
        raise _fail(
            f"entity {entity_id!r}: basic entity has no gri (a GRI topic number such as "
            f"'305', or {GRI_NONE!r})",
            entity_id,
        )
    text = str(value).strip()
    if text.upper().startswith("GRI ") and _GRI_NUMBER.fullmatch(text[4:].strip()):
        text = text[4:].strip()
    if text == GRI_NONE:
        gri_id = GRI_NONE
    elif _GRI_NUMBER.fullmatch(text):
        gri_id = f"GRI {text}"
    else:
        raise _fail(
            f"entity {entity_id!r}: gri {value!r} is neither a GRI topic number nor {GRI_NONE!r}",
            entity_id,
        )
    # An id of the form gri-NNN promises that topic; hold the file to it.
    if entity_id.startswith("gri-") and gri_id != f"GRI {entity_id[4:]}":
        raise _fail(
            f"entity {entity_id!r}: id names GRI {entity_id[4:]} but gri is {value!r}",
            entity_id,
        )
    return gri_id


def _parse_entity(raw: Any, position: int) -> tuple[Entity, list[tuple[str, str]]]:
    if not isinstance(raw, Mapping):
        raise _fail(f"entities[{position}]: expected a mapping, got {type(raw).__name__}")
    entity_id = raw.get("id")
    if not isinstance(entity_id, str) or not entity_id:
        raise _fail(f"entities[{position}]: missing id")
    if not _ID.fullmatch(entity_id):
        raise _fail(f"entity {entity_id!r}: id must be kebab-case (a-z, 0-9, '-')", entity_id)
    unknown = sorted(set(raw) - _ENTITY_KEYS)
    if unknown:
        raise _fail(
            f"entity {entity_id!r}: unknown field(s) {', '.join(map(str, unknown))}", entity_id
        )
    level_raw = raw.get("level")
    try:
        level = Level(level_raw)
    except ValueError:
        choices = ", ".join(level.value for level in Level)
        raise _fail(
            f"entity {entity_id!r}: unknown level {level_raw!r} (expected one of {choices})",
            entity_id,
        ) from None
    name = _text(raw, "name", entity_id)
    definition = _text(raw, "definition", entity_id)
    aliases_raw = raw.get("aliases") or []
    if not isinstance(aliases_raw, list) or not all(
        isinstance(a, str) and a.strip() for a in aliases_raw
    ):
        raise _fail(f"entity {entity_id!r}: aliases must be a list of non-empty strings", entity_id)
    aliases = tuple(" ".join(a.split()) for a in aliases_raw)
    gri_id = _gri(raw, entity_id, level)
    parents_raw = raw.get("parents") or {}
    if not isinstance(parents_raw, Mapping):
        raise _fail(
            f"entity {entity_id!r}: parents must map each parent id to a relation", entity_id
        )
    parents: list[tuple[str, str]] = []
    for parent, relation in parents_raw.items():
        if relation not in RELATIONS:
            raise _fail(
                f"entity {entity_id!r}: unknown relation {relation!r} from {parent!r} "
                f"(expected one of {', '.join(RELATIONS)})",
                entity_id,
            )
        parents.append((str(parent), relation))
    entity = Entity(
        id=entity_id,
        name=name,
        level=level,
        aliases=aliases,
        definition=definition,
        gri_id=gri_id,
    )
    return entity, parents


def _find_cycle(entities: Mapping[str, Entity], edges: list[Edge]) -> list[str] | None:
    """A cycle as a list of ids (first == last), or None; iterative DFS over parent links."""
    parents: dict[str, list[str]] = {entity_id: [] for entity_id in entities}
    for edge in edges:
        parents[edge.child].append(edge.parent)
    done: set[str] = set()
    for start in entities:
        if start in done:
            continue
        stack: list[tuple[str, int]] = [(start, 0)]
        on_path = {start: 0}
        while stack:
            node, index = stack[-1]
            if index < len(parents[node]):
                stack[-1] = (node, index + 1)
                nxt = parents[node][index]
                if nxt in on_path:
                    path = [n for n, _ in stack]
                    return [*path[on_path[nxt] :], nxt]
                if nxt not in done:
                    on_path[nxt] = len(stack)
                    stack.append((nxt, 0))
            else:
                stack.pop()
                del on_path[node]
                done.add(node)
    return None


def _build(data: Any, source: str) -> KnowledgeGraph:
    if not isinstance(data, Mapping):
        raise _fail(f"{source}: expected a mapping with 'version' and 'entities'")
    version = data.get("version")
    if not isinstance(version, str) or not version.strip():
        raise _fail(f"{source}: 'version' must be a non-empty string (quote it in YAML)")
    raw_entities = data.get("entities")
    if not isinstance(raw_entities, list) or not raw_entities:
        raise _fail(f"{source}: 'entities' must be a non-empty list")
    credits_raw = data.get("credits") or []
    if not isinstance(credits_raw, list) or not all(isinstance(c, Mapping) for c in credits_raw):
        raise _fail(f"{source}: 'credits' must be a list of mappings")
    credits = tuple({str(k): str(v) for k, v in c.items()} for c in credits_raw)

    entities: dict[str, Entity] = {}
    declared: list[tuple[str, list[tuple[str, str]]]] = []
    for position, raw in enumerate(raw_entities):
        entity, parents = _parse_entity(raw, position)
        if entity.id in entities:
            raise _fail(f"entity {entity.id!r}: duplicate id", entity.id)
        entities[entity.id] = entity
        declared.append((entity.id, parents))

    # A name or alias shared by two entities would make exact matches and
    # keyphrase links ambiguous.
    owner: dict[str, str] = {}
    gri_owner: dict[str, str] = {}
    for entity in entities.values():
        texts = {_normalise(t): t for t in (entity.name, *entity.aliases)}
        for key, text in texts.items():
            other = owner.setdefault(key, entity.id)
            if other != entity.id:
                raise _fail(
                    f"entity {entity.id!r}: name or alias {text!r} is already used by {other!r}",
                    entity.id,
                )
        if entity.gri_id is not None and entity.gri_id != GRI_NONE:
            other = gri_owner.setdefault(entity.gri_id, entity.id)
            if other != entity.id:
                raise _fail(
                    f"entity {entity.id!r}: {entity.gri_id} is already the topic of {other!r}",
                    entity.id,
                )

    edges: list[Edge] = []
    for child, parents in declared:
        for parent, relation in parents:
            if parent not in entities:
                raise _fail(
                    f"entity {child!r}: dangling relation {relation!r} from unknown parent "
                    f"{parent!r}",
                    child,
                )
            if parent == child:
                raise _fail(f"entity {child!r}: cycle: {child} -> {child}", child)
            edges.append(Edge(parent=parent, child=child, relation=relation))

    cycle = _find_cycle(entities, edges)
    if cycle is not None:
        raise _fail(f"entity {cycle[0]!r}: cycle through parents: {' -> '.join(cycle)}", cycle[0])

    for edge in edges:
        pair = (entities[edge.parent].level, entities[edge.child].level)
        allowed = ALLOWED_RELATIONS.get(pair)
        if allowed is None or edge.relation not in allowed:
            expected = (
                f"allowed: {', '.join(sorted(allowed))}"
                if allowed
                else "a parent must be exactly one level up"
            )
            raise _fail(
                f"entity {edge.child!r}: relation {edge.relation!r} from {edge.parent!r} is not "
                f"allowed from {pair[0].value} to {pair[1].value} ({expected})",
                edge.child,
            )

    roots = [e.id for e in entities.values() if e.level is Level.ROOT]
    if not roots:
        raise _fail(f"{source}: no entity has level 'root'")
    if len(roots) > 1:
        raise _fail(
            f"entity {roots[1]!r}: a second root (the root is {roots[0]!r}); it does not reach "
            "the root",
            roots[1],
        )
    root = roots[0]
    if any(edge.child == root for edge in edges):
        raise _fail(f"entity {root!r}: the root cannot have parents", root)

    graph = KnowledgeGraph(
        version=version.strip(), entities=entities, edges=edges, credits=credits, source=source
    )
    reached = set(_descendants(graph, root))
    # Name an entity without parents first: it is the break the others hang from.
    unreached = sorted(
        (entity_id for entity_id in entities if entity_id not in reached),
        key=lambda entity_id: bool(graph.parents(entity_id)),
    )
    for entity_id in unreached:
        why = "it has no parents" if not graph.parents(entity_id) else "no parent reaches it"
        raise _fail(f"entity {entity_id!r}: does not reach the root {root!r} ({why})", entity_id)
    return graph


def _descendants(graph: KnowledgeGraph, start: str) -> list[str]:
    seen = [start]
    index = 0
    members = {start}
    while index < len(seen):
        for child in graph.children(seen[index]):
            if child not in members:
                members.add(child)
                seen.append(child)
        index += 1
    return seen
