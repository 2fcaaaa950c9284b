"""Organization recognition without downloading a model.

``PatternRecognizer`` finds names by their shape (capitalized words ending in
a company suffix such as Inc, Corp or Plc; "Bank of ...", "Ministry of ...";
all-capital acronyms followed by a suffix) and then every mention of a name
from a ``Gazetteer``, a dictionary of organization names and their stems
(given with the document or recognized by shape), so "Texaco" is found as
Texaco Inc where "Texaco Inc" was named.

In the pipeline (``attest.ingest.stages.Enricher``) a document is read with
a gazetteer of its own (its given organizations and the names its text shows
by their shape): "Texaco" is Texaco Inc in a document that names Texaco Inc,
and nothing learned from one document reaches another. A gazetteer that grew
with the documents enriched before made a document's organizations, and the
facts extracted with them, depend on the order a concurrent pipeline took
the documents in and on what the store had seen before; the same input gave
other facts each time.

``ModelRecognizer`` runs a token-classification model (a transformers
directory whose labels include ORG) from a local path.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from attest.core.errors import FailedPrecondition
from attest.knowledge.linking import ENGLISH_STOPWORDS


class Recognizer(Protocol):
    def recognize(self, title: str, body: str, gazetteer: Gazetteer | None = None) -> list[str]:
        """Organization names found in one article, in order of first mention;
        ``gazetteer`` (where the recognizer uses one) instead of its own."""


SUFFIXES = (
    "Inc",
    "Incorporated",
    "Corp",
    "Corporation",
    "Co",
    "Company",
    "Cos",
    "Ltd",
    "Limited",
    "Plc",
    "PLC",
    "LLC",
    "LLP",
    "LP",
    "AG",
    "SA",
    "S.A.",
    "NV",
    "N.V.",
    "BV",
    "GmbH",
    "SpA",
    "AB",
    "ASA",
    "Oyj",
    "KK",
    "Bhd",
    "Pty",
    "Group",
    "Holdings",
    "Holding",
    "Bancorp",
    "Bank",
    "Airlines",
    "Airways",
    "Motors",
    "Petroleum",
    "Industries",
    "International",
    "Partners",
    "Trust",
    "Association",
    "Federation",
    "Institute",
    "Authority",
    "Agency",
    "Commission",
    "Council",
    "Exchange",
    "Union",
    "Fund",
)
# Suffixes that are legal forms: the name without them is also a name ("Texaco").
LEGAL_FORMS = frozenset(
    s.casefold()
    for s in (
        "Inc",
        "Incorporated",
        "Corp",
        "Corporation",
        "Co",
        "Company",
        "Cos",
        "Ltd",
        "Limited",
        "Plc",
        "LLC",
        "LLP",
        "LP",
        "AG",
        "SA",
        "S.A.",
        "NV",
        "N.V.",
        "BV",
        "GmbH",
        "SpA",
        "AB",
        "ASA",
        "Oyj",
        "KK",
        "Bhd",
        "Pty",
    )
)
_CAP = r"(?:[A-Z][A-Za-z0-9&'’.-]*|&)"
_SUFFIX = "|".join(re.escape(s) for s in sorted(SUFFIXES, key=len, reverse=True))
# One to five capitalized words (joined by "and", "of", "&"), then a suffix.
_WITH_SUFFIX = re.compile(
    rf"\b({_CAP}(?:\s+(?:{_CAP}|of|and|de|du|der))*?\s+(?:{_SUFFIX}))(?![A-Za-z])"
)
_OF_NAME = re.compile(
    r"\b((?:Bank|Ministry|Department|Bureau|Federal Reserve Bank|Commission|Council|"
    r"University|Organization|Organisation) of(?: the)?(?:\s+[A-Z][A-Za-z-]+){1,3})"
)
_LEADING_NOISE = frozenset(
    w.casefold()
    for w in ("The", "A", "An", "And", "Of", "In", "At", "By", "For", "From", "To", "With")
)
_WORD = re.compile(r"[A-Za-z0-9&'’.-]+")
MAX_GAZETTEER_WORDS = 6


def _clean(name: str) -> str:
    words = name.split()
    while words and (words[0].casefold() in _LEADING_NOISE or not words[0][0].isupper()):
        words = words[1:]
    return " ".join(words).strip(" .,'’")


def _stem(name: str) -> str | None:
    """The name without its legal form, when what is left is still a name."""
    words = name.split()
    if len(words) < 2 or words[-1].casefold().rstrip(".") not in {
        f.rstrip(".") for f in LEGAL_FORMS
    }:
        return None
    stem = " ".join(words[:-1]).rstrip(",")
    # "The Co" or "First Co": too short or too common to stand alone.
    if len(stem) < 3 or stem.casefold() in ENGLISH_STOPWORDS or not stem[0].isupper():
        return None
    return stem


class Gazetteer:
    """Known organization names, matched as whole words (case-sensitive on the
    first letter, so "apple" in a recipe is not Apple)."""

    def __init__(self, names: Iterable[str] = (), *, base: Gazetteer | None = None) -> None:
        self._lock = threading.Lock()
        # key: lower-cased word tuple -> display name
        self._names: dict[tuple[str, ...], str] = {}
        # Read, never written: names looked up after this gazetteer's own.
        self._base = base
        self.add(names)

    def __len__(self) -> int:
        return len(self._names)

    def names(self) -> list[str]:
        return sorted(set(self._names.values()))

    def add(self, names: Iterable[str]) -> list[str]:
        """Add names (and the stems of names with a legal form); returns those that were new."""
        added: list[str] = []
        with self._lock:
            for raw in names:
                name = " ".join(raw.split())
                for candidate in (name, _stem(name)):
                    if not candidate:
                        continue
                    words = tuple(w.casefold() for w in _WORD.findall(candidate))
                    if not words or len(words) > MAX_GAZETTEER_WORDS:
                        continue
                    if len(words) == 1 and words[0] in ENGLISH_STOPWORDS:
                        continue
                    if words not in self._names:
                        # A stem maps to the full name it came from.
                        self._names[words] = name
                        added.append(candidate)
        return added

    def _get(self, key: tuple[str, ...]) -> str | None:
        name = self._names.get(key)
        if name is None and self._base is not None:
            return self._base._get(key)
        return name

    def find(self, text: str) -> list[str]:
        """Names mentioned in ``text`` (this gazetteer's or its base's), in order of
        first mention."""
        if not self._names and (self._base is None or not len(self._base)):
            return []
        tokens = [(m.group(), m.group().casefold()) for m in _WORD.finditer(text)]
        found: dict[str, None] = {}
        i = 0
        while i < len(tokens):
            matched = 0
            if tokens[i][0][:1].isupper():
                for n in range(min(MAX_GAZETTEER_WORDS, len(tokens) - i), 0, -1):
                    key = tuple(t[1] for t in tokens[i : i + n])
                    name = self._get(key)
                    if name is not None:
                        found.setdefault(name, None)
                        matched = n
                        break
            i += matched or 1
        return list(found)


class PatternRecognizer:
    """Names by shape, then every gazetteer name mentioned; grows the gazetteer."""

    def __init__(self, gazetteer: Gazetteer | None = None) -> None:
        self.gazetteer = gazetteer or Gazetteer()

    def by_shape(self, text: str) -> list[str]:
        found: dict[str, None] = {}
        for pattern in (_WITH_SUFFIX, _OF_NAME):
            for match in pattern.finditer(text):
                name = _clean(match.group(1))
                if len(name.split()) >= 2 or (name and name.isupper() and len(name) > 1):
                    found.setdefault(name, None)
        return list(found)

    def recognize(self, title: str, body: str, gazetteer: Gazetteer | None = None) -> list[str]:
        known = self.gazetteer if gazetteer is None else gazetteer
        text = f"{title}\n{body}"
        shaped = self.by_shape(text)
        known.add(shaped)
        out: dict[str, None] = dict.fromkeys(shaped)
        for name in known.find(text):
            # A gazetteer hit on a stem names the full organization; skip it
            # when the full name was already found by shape.
            out.setdefault(name, None)
        return list(out)


class ModelRecognizer:
    """ORG entities from a token-classification model in a local directory."""

    def __init__(self, path: Path, *, device: str = "cpu", min_score: float = 0.5) -> None:
        if not (path / "config.json").is_file():
            raise FailedPrecondition(
                f"organization model {str(path)!r} is not a transformers directory (no "
                "config.json); models are loaded from paths, never downloaded"
            )
        self._path = path
        self._device = device
        self._min_score = min_score
        self._pipe: Any = None
        self._lock = threading.Lock()

    def warm_up(self) -> None:
        with self._lock:
            if self._pipe is None:
                from transformers import pipeline

                self._pipe = pipeline(
                    "token-classification",
                    model=str(self._path),
                    aggregation_strategy="simple",
                    device=self._device,
                )

    def recognize(self, title: str, body: str, gazetteer: Gazetteer | None = None) -> list[str]:
        self.warm_up()
        found: dict[str, None] = {}
        for entity in self._pipe(f"{title}\n{body}"[:20_000]):
            group = str(entity.get("entity_group", "")).upper()
            if group.endswith("ORG") and float(entity.get("score", 0)) >= self._min_score:
                name = " ".join(str(entity["word"]).split())
                if name:
                    found.setdefault(name, None)
        return list(found)


class CombinedRecognizer:
    """The model's names first, then the pattern recognizer's (which learns them)."""

    def __init__(self, model: Recognizer, patterns: PatternRecognizer) -> None:
        self._model = model
        self._patterns = patterns

    def recognize(self, title: str, body: str, gazetteer: Gazetteer | None = None) -> list[str]:
        names = self._model.recognize(title, body)
        known = self._patterns.gazetteer if gazetteer is None else gazetteer
        known.add(names)
        out = dict.fromkeys(names)
        for name in self._patterns.recognize(title, body, known):
            out.setdefault(name, None)
        return list(out)


def merge_organizations(*lists: Sequence[str]) -> list[str]:
    """Case-insensitive union, the first spelling and order kept."""
    out: list[str] = []
    seen: set[str] = set()
    for names in lists:
        for name in names:
            key = name.casefold()
            if key not in seen:
                seen.add(key)
                out.append(name)
    return out
