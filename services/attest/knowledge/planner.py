"""The planner used without an LLM: a question's spans linked to KB entities and relations.

It covers three shapes of question, told apart by how many entities the
question names and whether words remain that name a relation:

* two entities -> ``find_relationship`` between them ("How is Scope 2 related
  to Emissions?");
* one entity and relation words -> ``find_entity_or_value``, one step per
  relation when they chain ("What are the types of the measures of
  Emissions?" is measures, then types of each), which also covers "entities
  with a relation/value" ("Which topic is measured as greenhouse gas
  emission?", the relation walked from its object side);
* one entity and nothing else -> ``get_entity_info``.

Mechanism, in order: every span of up to six words is tried as an exact
name, alias or id of the KB (longest first, without overlaps); when none is
found, the question's RAKE keyphrases are linked by embedding. The words left
over, without question words and articles, are the relation. A relation verb
right before its entity makes the entity its object ("Which pillar contains
Emissions?"), so the verb is put the entity's way round ("contained in") and the
relation walked the way the verb says.

Only the question is read. The KB is asked which spans name entities
(``exact`` and ``entity_linking``, on names and aliases); nothing it returns
(definitions, facts, retrieved passages) is ever read by the planner, so
retrieved text cannot become instructions: it can only be data a step returns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from attest.knowledge.kb import KnowledgeBase
from attest.knowledge.linking import KeyphraseExtractor
from attest.knowledge.plans import (
    FIND_ENTITY_OR_VALUE,
    FIND_RELATIONSHIP,
    GET_ENTITY_INFO,
    LINK_ENTITIES,
    PlanLimits,
    Program,
    validate_program,
)

MAX_SPAN_WORDS: Final = 6

_TOKEN: Final = re.compile(r"[^\W_]+(?:[-'’./][^\W_]+)*")
# Words that ask rather than say: never part of a relation.
_QUESTION_WORDS: Final = frozenset(
    [
        "what",
        "which",
        "who",
        "whom",
        "whose",
        "how",
        "where",
        "when",
        "why",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "does",
        "do",
        "did",
        "the",
        "a",
        "an",
        "there",
        "it",
        "its",
        "this",
        "that",
        "these",
        "those",
        "please",
        "list",
        "name",
        "give",
        "tell",
        "me",
        "show",
        "us",
        "all",
        "any",
        "each",
        "every",
        "one",
        "ones",
        "can",
        "could",
        "would",
        "will",
        "should",
        "kind",
        "about",
        "describe",
        "define",
        "explain",
        "mean",
        "means",
        "meaning",
        "definition",
        "information",
        "info",
        "know",
        "known",
    ]
)
_PREPOSITIONS: Final = frozenset(
    ["of", "in", "under", "for", "to", "by", "from", "on", "at", "with", "as", "into", "within"]
)
# Words saying that two entities are connected, without naming how.
_RELATEDNESS: Final = frozenset(
    [
        "related",
        "relate",
        "relation",
        "relationship",
        "relationships",
        "connected",
        "connection",
        "link",
        "linked",
        "links",
        "between",
        "and",
    ]
)
# A relation verb right before the entity, the question's subject its other side:
# "Which pillar contains Emissions?" asks for Emissions' parents (contained in),
# "Which indicators measure Energy?" and "What causes water pollution?" for its
# children (the graph's edges run from a topic to its measures and sources).
_VERB_BEFORE_ENTITY: Final = {
    "contain": "contained in",
    "contains": "contained in",
    "include": "part of",
    "includes": "part of",
    "cover": "part of",
    "covers": "part of",
    "have": "part of",
    "has": "part of",
    "measure": "measured as",
    "measures": "measured as",
    "cause": "sources",
    "causes": "sources",
}
# "measured as X", "a type of X" before the entity: the entity is the object, the
# asked-for entities are its parents ("Which topic is measured as GHG emission?").
_OBJECT_MARKERS: Final = {
    ("measured", "as"): "measure of",
    ("measured", "by"): "measure of",
    ("made", "of"): "part of",
}


@dataclass(frozen=True, slots=True)
class Span:
    start: int
    end: int  # exclusive, in tokens
    text: str
    entity_id: str


class HeuristicPlanner:
    """Plans a program from a question alone, over any ``KnowledgeBase``."""

    def __init__(
        self,
        kb: KnowledgeBase,
        limits: PlanLimits,
        *,
        extractor: KeyphraseExtractor | None = None,
        max_hops: int = 3,
    ) -> None:
        self.kb = kb
        self.limits = limits
        self.extractor = extractor or KeyphraseExtractor()
        self.max_hops = max_hops

    # -- spans

    def link_spans(self, tokens: list[str]) -> list[Span]:
        """Non-overlapping spans that name entities, in question order."""
        taken = [False] * len(tokens)
        spans: list[Span] = []
        for size in range(min(MAX_SPAN_WORDS, len(tokens)), 0, -1):
            for start in range(len(tokens) - size + 1):
                end = start + size
                if any(taken[start:end]):
                    continue
                words = tokens[start:end]
                # A span never starts or ends with a function word ("the Emissions").
                if {words[0].casefold(), words[-1].casefold()} & (
                    _QUESTION_WORDS | _PREPOSITIONS | _RELATEDNESS
                ):
                    continue
                text = " ".join(words)
                found = self.kb.exact(text)
                if found:
                    spans.append(Span(start, end, text, found[0].id))
                    taken[start:end] = [True] * size
        if len(spans) < 2:
            # The words no exact span took may still name an entity ("strikes",
            # "data breaches"): their keyphrases are linked by embedding.
            for span in self._embedding_spans(tokens, taken):
                if all(span.entity_id != s.entity_id for s in spans):
                    spans.append(span)
        return sorted(spans, key=lambda s: s.start)

    def _embedding_spans(self, tokens: list[str], taken: list[bool]) -> list[Span]:
        """Keyphrases of the question linked by embedding, placed back on the tokens.

        Every sub-phrase of a keyphrase is tried ("causes worker injuries" holds
        "worker injuries") and the best-scoring one that links is kept, so the
        words around it stay free to name the relation.
        """
        lowered = [t.casefold() for t in tokens]
        # Taken words break the text, so no keyphrase runs across an exact span.
        free = " ".join("," if used else t for t, used in zip(tokens, taken, strict=True))
        spans: list[Span] = []
        for phrase in self.extractor.extract(free, max_phrases=5):
            words = phrase.split()
            start = _find(lowered, words, taken)
            if start is None:
                continue
            best: tuple[float, int, int, str] | None = None
            for i in range(len(words)):
                for j in range(i + 1, len(words) + 1):
                    if {words[i], words[j - 1]} & (_QUESTION_WORDS | _PREPOSITIONS):
                        continue
                    linking = self.kb.entity_linking([" ".join(words[i:j])], top_k=1)
                    if linking.chosen is None:
                        continue
                    score = linking.candidates[0].score
                    if best is None or (score, j - i) > (best[0], best[2] - best[1]):
                        best = (score, start + i, start + j, linking.chosen)
            if best is None:
                continue
            _, s, e, entity_id = best
            if any(span.start < e and s < span.end for span in spans):
                continue
            spans.append(Span(s, e, " ".join(tokens[s:e]), entity_id))
        return spans

    # -- relations

    def relation_chain(self, tokens: list[str], span: Span) -> list[str]:
        """Relations asked about the entity, nearest it first; empty when none is named."""
        before = [t.casefold() for t in tokens[: span.start]]
        after = [t.casefold() for t in tokens[span.end :]]
        # The entity as object: an active verb, or a marker like "measured as", before it.
        if len(before) >= 2 and tuple(before[-2:]) in _OBJECT_MARKERS:
            return [_OBJECT_MARKERS[(before[-2], before[-1])]]
        if before and before[-1] in _VERB_BEFORE_ENTITY and _content(before[:-1]):
            return [_VERB_BEFORE_ENTITY[before[-1]]]
        # "<relation> of <relation> of <entity>": prepositions right before the entity
        # join a relation to it, and "of" splits a chain of relations.
        while before and before[-1] in _PREPOSITIONS:
            before.pop()
        chain: list[str] = []
        segment: list[str] = []
        for word in [*before, "of"]:
            if word == "of":
                text = " ".join(w for w in segment if w not in _QUESTION_WORDS)
                if text:
                    chain.append(text)
                segment = []
            else:
                segment.append(word)
        chain.reverse()
        # Words after the entity ("... is Emissions part of?", "... does Environment contain?").
        tail = " ".join(w for w in after if w not in _QUESTION_WORDS)
        if tail:
            if chain:
                chain[0] = f"{chain[0]} {tail}"
            else:
                chain = [tail]
        return chain

    # -- plans

    def plan(self, question: str) -> Program:
        tokens = _TOKEN.findall(question)
        spans = self.link_spans(tokens)
        steps: list[dict[str, Any]] = []
        if not spans:
            # Nothing names an entity: link the keyphrases and describe what they link to.
            mentions = self.extractor.extract(question, max_phrases=self.limits.max_fan_out)
            mentions = [m[: self.limits.max_arg_chars] for m in mentions] or [
                question[: self.limits.max_arg_chars] or "?"
            ]
            steps = [
                {"op": LINK_ENTITIES, "args": {"mentions": mentions}, "as": "e"},
                {"op": GET_ENTITY_INFO, "args": {"entity_id": "$e"}},
            ]
            return validate_program({"steps": steps}, self.limits)
        if len(spans) >= 2:
            first, second = spans[0], spans[1]
            steps = [
                {
                    "op": FIND_RELATIONSHIP,
                    "args": {
                        "first_entity_id": first.entity_id,
                        "second_entity_id": second.entity_id,
                        "max_hops": self.max_hops,
                    },
                }
            ]
            return validate_program({"steps": steps}, self.limits)
        span = spans[0]
        chain = self.relation_chain(tokens, span)
        if not chain:
            steps = [{"op": GET_ENTITY_INFO, "args": {"entity_id": span.entity_id}}]
            return validate_program({"steps": steps}, self.limits)
        entity: str = span.entity_id
        for index, relation in enumerate(chain[: self.limits.max_steps]):
            steps.append(
                {
                    "op": FIND_ENTITY_OR_VALUE,
                    "args": {
                        "entity_id": entity,
                        "relation": relation[: self.limits.max_arg_chars],
                    },
                    "as": f"r{index}",
                }
            )
            entity = f"$r{index}"
        return validate_program({"steps": steps}, self.limits)


def _content(words: list[str]) -> bool:
    return any(w not in _QUESTION_WORDS for w in words)


def _find(tokens: list[str], words: list[str], taken: list[bool]) -> int | None:
    for start in range(len(tokens) - len(words) + 1):
        end = start + len(words)
        if tokens[start:end] == words and not any(taken[start:end]):
            return start
    return None
