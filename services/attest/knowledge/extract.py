"""Offline fact extraction for the personal knowledge base (no model, no LLM).

From one document's passages (the units ingestion indexed, with their spans
in the body), sentence by sentence (``attest.ingest.passages.sentence_spans``):

* **triples** from appositive, copular and title patterns around a role
  word (chair, chief executive, president, founder, director, governor,
  ...): "X, the chair of Y,", "X, Y's chief executive,", "X is/was named the
  chief executive of Y", "Y's chair X", "Y chief executive X", "Its chair,
  X,". The relation is the role with "of" ("chair of"), without modifiers
  that do not change the role (independent, interim, acting, new); the object
  is the organization named, and when the pattern names none ("Chief
  executive X said", "the company's chair X", "its chair"), the organization
  mentioned last before the sentence (else the document's most mentioned). Persons are two or three
  capitalized words.
* **entity descriptions** from the first sentence that defines an
  organization: an appositive "Y, the country's fourth-largest lender, said"
  or a copula "Y is a maker of ...".
* **entity-aspect facts**: every sentence that mentions an organization of
  the document or the name of a linked knowledge-graph entity becomes a fact
  about that entity; the aspect is the sentence's best keyphrase (RAKE, the
  keyphrase extractor ingestion uses) that does not repeat the entity's
  name, the content the sentence.

Organizations are the document's (given with it or recognized by
``attest.ingest.organizations``); their short names ("Marrowgate" for
"Marrowgate Bank": the name without a trailing organization suffix) count as
mentions. Every fact keeps its passage index and the character offsets of
the sentence or phrase it came from, in the document's body.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from attest.ingest.organizations import SUFFIXES
from attest.ingest.passages import sentence_spans
from attest.knowledge.kb import PERSONAL, AspectFact, Description, EntityRef, Provenance, Triple
from attest.knowledge.linking import ENGLISH_STOPWORDS, KeyphraseExtractor
from attest.knowledge.personal import PersonalFact, normalise_name, personal_entity_id

# Longest first, so "chief executive officer" wins over "chief executive".
_ROLES: Final = {
    "chief executive officer": "chief executive",
    "chief executive": "chief executive",
    "chief financial officer": "chief financial officer",
    "chief operating officer": "chief operating officer",
    "chief sustainability officer": "chief sustainability officer",
    "managing director": "managing director",
    "executive director": "executive director",
    "chairman": "chair",
    "chairwoman": "chair",
    "chairperson": "chair",
    "chair": "chair",
    "president": "president",
    "co-founder": "co-founder",
    "founder": "founder",
    "director general": "director general",
    "director": "director",
    "governor": "governor",
    "CEO": "chief executive",
    "CFO": "chief financial officer",
    "COO": "chief operating officer",
}
# Modifiers that change the role are kept in the relation ("deputy governor
# of"); the others are dropped ("independent chair" is a chair).
_KEPT_MODIFIERS: Final = ("former", "deputy", "vice")
_DROPPED_MODIFIERS: Final = ("independent", "interim", "acting", "new", "non-executive")
# Phrases that stand for the document's main organization.
_SELF_REFERENCES: Final = (
    "the company",
    "the bank",
    "the group",
    "the firm",
    "the lender",
    "the insurer",
    "the miner",
    "the retailer",
    "the utility",
    "the authority",
    "the agency",
    "the regulator",
    "the commission",
    "the fund",
    "the board",
    "its",
)
_VERBS: Final = (
    r"(?:is|was|has been|had been|will be|became|becomes|remains|remained)"
    r"(?:\s+(?:named|appointed|elected|confirmed))?(?:\s+as)?"
)
_NAME_WORD: Final = r"[A-Z][a-z]+(?:[-'’][A-Z][a-z]+)?"
_PERSON: Final = rf"(?P<person>{_NAME_WORD}(?:\s+{_NAME_WORD}){{1,2}})"


def _role_regex() -> str:
    roles = "|".join(re.escape(r) for r in sorted(_ROLES, key=len, reverse=True))
    mods = "|".join(_KEPT_MODIFIERS + _DROPPED_MODIFIERS)
    # A role word may start a sentence ("Chief executive X said").
    return rf"(?P<role>(?:(?i:{mods})\s+)*(?i:{roles}))(?![\w-])"


_ROLE: Final = _role_regex()
MAX_DESCRIPTION_WORDS: Final = 16


@dataclass(frozen=True, slots=True)
class DocumentText:
    """What the extractor reads of one indexed document."""

    doc_id: str
    body: str
    # (passage index, start, end) in ``body``.
    passages: tuple[tuple[int, int, int], ...]
    organizations: tuple[str, ...] = ()
    # Names (and aliases) of the knowledge-graph entities linked to the document.
    entity_names: tuple[str, ...] = ()


def short_names(organization: str) -> list[str]:
    """The organization's name without trailing suffix words ("Marrowgate Bank" -> "Marrowgate")."""
    suffixes = {s.casefold() for s in SUFFIXES}
    words = organization.split()
    out: list[str] = []
    while len(words) > 1 and words[-1].casefold().rstrip(".") in suffixes:
        words = words[:-1]
        name = " ".join(words)
        if name.casefold() not in ENGLISH_STOPWORDS and name[:1].isupper():
            out.append(name)
    return out


def normalise_role(role: str) -> str:
    words = role.split()
    kept = [w.casefold() for w in words[:-1] if w.casefold() in _KEPT_MODIFIERS]
    head = " ".join(w for w in words if w.casefold() not in _KEPT_MODIFIERS + _DROPPED_MODIFIERS)
    canonical = _ROLES.get(head) or _ROLES.get(head.casefold()) or head.casefold()
    return " ".join([*kept, canonical, "of"])


class Extractor:
    """Facts of one document at a time; stateless apart from the keyphrase extractor."""

    def __init__(self, *, max_aspect_facts: int = 200) -> None:
        self.keyphrases = KeyphraseExtractor()
        self.max_aspect_facts = max_aspect_facts

    def extract(self, doc: DocumentText) -> list[PersonalFact]:
        names = _Names(doc.organizations, doc.entity_names)
        sentences = [
            (index, start + s, start + e)
            for index, start, end in doc.passages
            for s, e in sentence_spans(doc.body[start:end])
        ]
        main = names.main(doc.body)
        triples: list[PersonalFact] = []
        descriptions: list[PersonalFact] = []
        aspects: list[PersonalFact] = []
        seen: set[tuple[str, str, str]] = set()
        described: set[str] = set()
        for index, start, end in sentences:
            text = doc.body[start:end]
            before = names.last_before(doc.body, start) or main
            for person, relation, org, s, e in self._roles(text, names, before):
                key = (normalise_name(person), relation, normalise_name(org))
                if key in seen or normalise_name(person) == normalise_name(org):
                    continue
                seen.add(key)
                triples.append(
                    Triple(
                        _ref(person),
                        relation,
                        _ref(org),
                        None,
                        PERSONAL,
                        doc.doc_id,
                        Provenance(index, start + s, start + e),
                    )
                )
            for org, definition, s, e in self._definitions(text, names):
                if org in described:
                    continue
                described.add(org)
                descriptions.append(
                    Description(
                        _ref(org),
                        definition,
                        PERSONAL,
                        doc.doc_id,
                        Provenance(index, start + s, start + e),
                    )
                )
            for entity in names.mentioned(text):
                if len(aspects) >= self.max_aspect_facts:
                    break
                aspects.append(
                    AspectFact(
                        _ref(entity),
                        self._aspect(text, entity),
                        text,
                        PERSONAL,
                        doc.doc_id,
                        Provenance(index, start, end),
                    )
                )
        return [*descriptions, *triples, *aspects]

    def _aspect(self, sentence: str, entity: str) -> str:
        """The sentence's best keyphrase that does not repeat the entity's name."""
        own = {w.casefold() for w in re.findall(r"\w+", entity)}
        for phrase in self.keyphrases.extract(sentence, max_phrases=8):
            words = [w for w in re.findall(r"[\w'’-]+", phrase) if w.casefold() not in own]
            if words:
                return " ".join(words)[:256]
        return "mention"

    def _roles(
        self, text: str, names: _Names, main: str | None
    ) -> Iterable[tuple[str, str, str, int, int]]:
        org = names.regex
        self_ref = "|".join(re.escape(r) for r in _SELF_REFERENCES)
        owner = (
            rf"(?:(?P<owner>{org})|(?P<self>(?i:{self_ref})))"
            if org
            else rf"(?P<self>(?i:{self_ref}))"
        )
        of_org = (
            rf"(?:\s+(?:of|at)\s+(?:(?P<of>{org})|(?P<ofself>(?i:{self_ref}))))?"
            if org
            else rf"(?:\s+(?:of|at)\s+(?P<ofself>(?i:{self_ref})))?"
        )
        article = r"(?:(?:the|a|an)\s+)?"
        possessive = rf"(?:{owner}['’]s?\s+)?"
        patterns = [
            # X, the chair of Y, / X, Y's chief executive,
            rf"{_PERSON},\s+{article}{possessive}{_ROLE}{of_org}(?=[,.;])",
            # X is the chief executive of Y / X, a ..., was named chair
            rf"{_PERSON}(?:,[^,]{{1,80}},)?\s+{_VERBS}\s+{article}{possessive}{_ROLE}{of_org}(?=[\s,.;])",
            # Y's chair X / Its chair, X, / Chief executive X said
            rf"{possessive}{_ROLE},?\s+{_PERSON}",
        ]
        for pattern in patterns:
            for m in re.finditer(pattern, text):
                groups = m.groupdict()
                person = groups["person"]
                if any(
                    w.casefold() in _ROLES or w.casefold() in ENGLISH_STOPWORDS
                    for w in person.split()[:1]
                ):
                    continue
                named = groups.get("of") or groups.get("owner")
                itself = groups.get("ofself") or groups.get("self") or ""
                if named:
                    target = names.canonical(named)
                elif len(itself.split()) == 2:
                    # "the authority": the document's organization of that kind, if any.
                    target = names.containing(itself.split()[1].capitalize()) or main
                else:
                    target = self._prefix_org(text, m.start(), names) or main
                if target is None:
                    continue
                yield person, normalise_role(groups["role"]), target, m.start(), m.end()

    def _prefix_org(self, text: str, at: int, names: _Names) -> str | None:
        """The organization named by the capitalized word right before a title ("Fennick
        chief executive X"): a name, a short name, or a word of one of the names."""
        before = re.search(r"([A-Z][\w&'’.-]*)\s*$", text[:at])
        if before is None:
            return None
        word = before.group(1)
        found = names.canonical(word)
        if found is not None:
            return found
        return names.containing(word)

    def _definitions(self, text: str, names: _Names) -> Iterable[tuple[str, str, int, int]]:
        if not names.regex:
            return
        org = rf"(?P<org>{names.regex})"
        phrase = r"(?P<def>(?:the|a|an)\s+[a-z][^,.;()]{2,200})"
        for pattern in (rf"\b{org},\s+{phrase},", rf"\b{org}\s+is\s+{phrase}[,.]"):
            for m in re.finditer(pattern, text):
                definition = m.group("def").strip()
                if len(definition.split()) > MAX_DESCRIPTION_WORDS:
                    continue
                first = definition.split()[1].casefold() if len(definition.split()) > 1 else ""
                if first in {r.casefold() for r in _ROLES}:
                    continue
                yield (
                    names.canonical(m.group("org")) or m.group("org"),
                    definition,
                    m.start(),
                    m.end(),
                )


class _Names:
    """The document's entity names: organizations (with short names) and graph entities."""

    def __init__(self, organizations: Sequence[str], entity_names: Sequence[str]) -> None:
        self.forms: dict[str, str] = {}  # surface form -> canonical name
        self.organizations = [o for o in dict.fromkeys(organizations) if o.strip()]
        for org in self.organizations:
            self.forms.setdefault(org, org)
        for org in self.organizations:
            for short in short_names(org):
                self.forms.setdefault(short, org)
        self.entities = [n for n in dict.fromkeys(entity_names) if len(n) > 2]
        ordered = sorted(self.forms, key=len, reverse=True)
        self.regex = "|".join(rf"{re.escape(f)}(?![\w-])" for f in ordered)
        self._org = re.compile(rf"(?<![\w-])(?:{self.regex})") if self.regex else None
        self._entity = [
            (name, re.compile(rf"(?<![\w-]){re.escape(name)}(?![\w-])", re.IGNORECASE))
            for name in self.entities
        ]

    def canonical(self, form: str) -> str | None:
        return self.forms.get(form)

    def containing(self, word: str) -> str | None:
        for org in self.organizations:
            if word.casefold() in org.casefold().split():
                return org
        return None

    def main(self, body: str) -> str | None:
        """The most mentioned organization (the first given on ties)."""
        if self._org is None:
            return None
        # A name holding another one ("Shareholders of Marrowgate Bank") counts
        # as a mention of the inner organization.
        counts = Counter(self.inner(self.forms[m.group()]) for m in self._org.finditer(body))
        if not counts:
            return self.organizations[0] if self.organizations else None
        top = max(counts.values())
        return next(o for o in self.organizations if counts.get(o) == top)

    def last_before(self, body: str, at: int) -> str | None:
        """The organization mentioned last before ``at`` (a name holding another counts
        as the inner one)."""
        if self._org is None:
            return None
        last = None
        for m in self._org.finditer(body, 0, at):
            last = self.forms[m.group()]
        return None if last is None else self.inner(last)

    def inner(self, organization: str) -> str:
        """The organization a longer name holds ("Shareholders of Marrowgate Bank" holds
        "Marrowgate Bank"), or the name itself."""
        return next(
            (p for p in self.organizations if p != organization and p in organization), organization
        )

    def mentioned(self, sentence: str) -> list[str]:
        found: dict[str, None] = {}
        if self._org is not None:
            for m in self._org.finditer(sentence):
                found.setdefault(self.inner(self.forms[m.group()]), None)
        for name, pattern in self._entity:
            if pattern.search(sentence):
                found.setdefault(name, None)
        return list(found)


def _ref(name: str) -> EntityRef:
    return EntityRef(personal_entity_id(name), name)


def document_text(
    doc_id: str,
    body: str,
    passages: Sequence[Sequence[object]],
    organizations: Sequence[str],
    entity_names: Iterable[str] = (),
) -> DocumentText:
    """A ``DocumentText`` from an ingest record's fields (passages as [index, text,
    start, end, page], or without the page as records made before pages were kept)."""
    spans = tuple((int(str(p[0])), int(str(p[2])), int(str(p[3]))) for p in passages)
    return DocumentText(doc_id, body, spans, tuple(organizations), tuple(entity_names))


def graph_names(graph: object, entity_ids: Iterable[str]) -> list[str]:
    """Names and aliases of the graph entities linked to a document (for aspect facts)."""
    out: list[str] = []
    attributes = getattr(graph, "attributes", None)
    if attributes is None:
        return out
    for entity_id in entity_ids:
        try:
            out.extend(attributes(entity_id))
        except KeyError:
            continue
    return out


def counts_by_form(facts: Sequence[PersonalFact]) -> Mapping[str, int]:
    out = Counter(type(f).__name__ for f in facts)
    return {
        "descriptions": out["Description"],
        "triples": out["Triple"],
        "aspect_facts": out["AspectFact"],
    }
