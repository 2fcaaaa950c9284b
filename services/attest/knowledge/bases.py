"""Several knowledge bases behind the one ``KnowledgeBase`` protocol (no grpc).

``CombinedKnowledgeBase`` asks every base it holds and merges the answers,
so a program runs over the ESG graph and the caller's personal base without
knowing there are two. Each base answers for its own entities; when an
entity of one base has a namesake in another (the ESG topic "Water and
effluents" and a personal entity of that name), lookups by id also ask the
other bases by the entity's name, so personal facts about a graph topic are
found from the topic's id.
"""

from __future__ import annotations

from collections.abc import Sequence

from attest.knowledge.kb import (
    MAX_HOPS,
    Candidate,
    EntityInfo,
    Fact,
    KbEntity,
    KnowledgeBase,
    Linking,
    RelationMatch,
    Relationship,
    UnknownEntity,
)


class CombinedKnowledgeBase:
    """The bases in order of preference (the first answers ties and names entities)."""

    def __init__(self, bases: Sequence[KnowledgeBase]) -> None:
        if not bases:
            raise ValueError("a combined knowledge base needs at least one base")
        self.bases = tuple(bases)
        self.name = "+".join(b.name for b in self.bases)

    def warm_up(self) -> None:
        for base in self.bases:
            base.warm_up()

    def entity(self, entity_id: str) -> KbEntity | None:
        for base in self.bases:
            found = base.entity(entity_id)
            if found is not None:
                return found
        return None

    def exact(self, text: str) -> list[KbEntity]:
        return [e for base in self.bases for e in base.exact(text)]

    def _aliases(self, aliases: Sequence[str]) -> list[str]:
        """The aliases plus the names of the entities they are ids of (for namesakes)."""
        out = list(aliases)
        for alias in aliases:
            found = self.entity(alias)
            if found is not None:
                out.extend(n for n in (found.name, *found.aliases) if n not in out)
        return out

    def entity_linking(
        self, aliases: Sequence[str], context: str = "", *, top_k: int = 5
    ) -> Linking:
        linkings = [b.entity_linking(aliases, context, top_k=top_k) for b in self.bases]
        candidates: list[Candidate] = [c for link in linkings for c in link.candidates]
        # Exact matches first, then by score; a stable sort keeps base order on ties.
        candidates.sort(key=lambda c: (c.match != "exact", -c.score))
        chosen: list[str] = []
        for link in linkings:
            chosen.extend(i for i in link.chosen_ids if i not in chosen)
        rank = {c.entity.id: n for n, c in enumerate(candidates)}
        chosen.sort(key=lambda i: rank.get(i, len(rank)))
        mention = linkings[0].mention
        if not chosen:
            return Linking(mention, tuple(candidates[:top_k]), None)
        kept = [c for c in candidates if c.entity.id in chosen]
        kept += [c for c in candidates if c.entity.id not in chosen]
        return Linking(
            mention, tuple(kept[: max(top_k, len(chosen))]), chosen[0], tuple(chosen[1:])
        )

    def get_entity_info(self, entity: Sequence[str], *, max_facts: int = 100) -> EntityInfo:
        infos: list[EntityInfo] = []
        for base in self._owners(entity):
            try:
                infos.append(base.get_entity_info(self._aliases(entity), max_facts=max_facts))
            except UnknownEntity:
                continue
        if not infos:
            raise UnknownEntity(entity)
        first = infos[0]
        return EntityInfo(
            entity=first.entity,
            descriptions=tuple(d for i in infos for d in i.descriptions),
            triples=tuple(t for i in infos for t in i.triples),
            truncated=any(i.truncated for i in infos),
            aspect_facts=tuple(a for i in infos for a in i.aspect_facts),
        )

    def _owners(self, entity: Sequence[str]) -> list[KnowledgeBase]:
        """The bases to ask about an entity, the one holding an id among the aliases first.

        When an alias is an id, the other bases are asked only if one of the
        entity's names is exactly one of theirs (a namesake): linking a personal
        name by embedding to some graph topic would add an unrelated entity's facts.
        """
        owners = [b for b in self.bases if any(b.entity(a) is not None for a in entity)]
        if not owners:
            return list(self.bases)
        names = self._aliases(entity)
        return owners + [
            b for b in self.bases if b not in owners and any(b.exact(n) for n in names)
        ]

    def find_entity_or_value(
        self, entity: Sequence[str], relation: Sequence[str], *, top_k: int = 10
    ) -> RelationMatch:
        matches: list[RelationMatch] = []
        for base in self._owners(entity):
            try:
                matches.append(
                    base.find_entity_or_value(self._aliases(entity), relation, top_k=top_k)
                )
            except UnknownEntity:
                continue
        if not matches:
            raise UnknownEntity(entity)
        if len(matches) == 1:
            return matches[0]
        best = max(matches, key=lambda m: m.score)
        facts: list[Fact] = sorted((f for m in matches for f in m.facts), key=lambda f: -f.score)
        # Each fact's answer is its side that is not the entity asked about.
        return RelationMatch(
            best.relation,
            best.direction if all(m.direction == best.direction for m in matches) else None,
            best.score,
            tuple(facts[:top_k]),
            matches[0].entity_id,
        )

    def find_relationship(
        self,
        first: Sequence[str],
        second: Sequence[str],
        *,
        max_hops: int = MAX_HOPS,
        max_paths: int = 10,
    ) -> Relationship:
        found: list[Relationship] = []
        both = [b for b in self._owners(first) if b in self._owners(second)]
        for base in both:
            try:
                found.append(
                    base.find_relationship(
                        self._aliases(first),
                        self._aliases(second),
                        max_hops=max_hops,
                        max_paths=max_paths,
                    )
                )
            except UnknownEntity:
                continue
        if not found:
            raise UnknownEntity([*first, *second])
        paths = sorted((p for r in found for p in r.paths), key=lambda p: len(p.triples))
        head = found[0]
        return Relationship(
            head.first,
            head.second,
            tuple(paths[:max_paths]),
            head.shared_words,
            head.name_similarity,
        )
