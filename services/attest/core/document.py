"""The keyword fields of a document: one declaration every message and store follows.

A keyword field is a short string value (or list of them) of
``attest.common.v1.Document`` that is stored with each record of the
document, can restrict a search (``Filter.field`` names it) and comes back
with hits and sources. Adding one takes its proto field(s) and an entry in
``KEYWORD_FIELDS``: the conversion from and to messages, the BM25 index
layouts (tantivy's schema, the OpenSearch/Elasticsearch mapping), the
vector payloads and their indexes, the filters and the ingest records all
iterate over the declaration instead of naming the fields.

In the stores and the domain objects every keyword field is a tuple of
strings (empty when the document has none), whether the messages carry a
repeated or a single string; ``Keywords`` maps a field's name to it.
Nothing here imports grpc.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import Message

from attest.core.errors import InvalidArgument

Keywords = Mapping[str, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class KeywordField:
    """One keyword field of a document."""

    # The field of attest.common.v1.Document, of every hit or source message
    # that returns it, and of every store's records.
    name: str
    # The ``Filter.field`` value that restricts it.
    filter: str
    # A repeated string in the messages; otherwise a single string, "" for none.
    repeated: bool = True
    # Matched without regard to case (stored as written).
    folded: bool = False
    # The stored form of one value, or ValueError with the reason it is refused.
    check: Callable[[str], str] | None = None

    def clean(self, values: Iterable[str]) -> tuple[str, ...]:
        """The values to store: checked, empty strings dropped, duplicates once."""
        out: list[str] = []
        for value in values:
            if not value:
                continue
            out.append(self.check(value) if self.check is not None else value)
        return tuple(dict.fromkeys(out))

    def key(self, value: str) -> str:
        """The form a value is compared in (case-folded for a folded field)."""
        return value.casefold() if self.folded else value


# The 183 two-letter codes of ISO 639-1.
_ISO_639_1_CODES = """
    aa ab ae af ak am an ar as av ay az ba be bg bi bm bn bo br bs ca ce ch co cr cs cu cv
    cy da de dv dz ee el en eo es et eu fa ff fi fj fo fr fy ga gd gl gn gu gv ha he hi ho
    hr ht hu hy hz ia id ie ig ii ik io is it iu ja jv ka kg ki kj kk kl km kn ko kr ks ku
    kv kw ky la lb lg li ln lo lt lu lv mg mh mi mk ml mn mr ms mt my na nb nd ne ng nl nn
    no nr nv ny oc oj om or os pa pi pl ps pt qu rm rn ro ru rw sa sc sd se sg si sk sl sm
    sn so sq sr ss st su sv sw ta te tg th ti tk tl tn to tr ts tt tw ty ug uk ur uz ve vi
    vo wa wo xh yi yo za zh zu
"""
ISO_639_1 = frozenset(_ISO_639_1_CODES.split())


class HasKeywords:
    """Read access by name to the first keyword fields, for models that keep
    their keyword fields in ``keywords`` (a mixin: it adds no field)."""

    __slots__ = ()
    keywords: Keywords

    @property
    def organizations(self) -> tuple[str, ...]:
        return self.keywords.get("organizations", ())

    @property
    def entity_ids(self) -> tuple[str, ...]:
        return self.keywords.get("entity_ids", ())


def language_code(value: str) -> str:
    """An ISO 639-1 code, in lower case."""
    code = value.strip().lower()
    if code not in ISO_639_1:
        raise ValueError(
            f"{value[:32]!r} is not an ISO 639-1 language code (two letters, such as 'en' or 'de')"
        )
    return code


KEYWORD_FIELDS: tuple[KeywordField, ...] = (
    KeywordField("organizations", "organization", folded=True),
    KeywordField("entity_ids", "entity"),
    KeywordField("language", "language", repeated=False, check=language_code),
)
BY_NAME = {f.name: f for f in KEYWORD_FIELDS}
BY_FILTER = {f.filter: f for f in KEYWORD_FIELDS}


def message_values(message: Message, f: KeywordField) -> tuple[str, ...] | None:
    """The field's values as a message holds them; None when the message has no such field."""
    if f.name not in message.DESCRIPTOR.fields_by_name:
        return None
    value = getattr(message, f.name)
    return tuple(value) if f.repeated else ((value,) if value else ())


def keywords_from_message(message: Message, where: str | None = None) -> dict[str, tuple[str, ...]]:
    """The keyword fields a message carries, by name (empty ones left out).

    With ``where`` (the message's path in the request, ``documents[3]``) the
    values are checked, and a refused one is INVALID_ARGUMENT naming the field
    (``documents[3].language``); without it they are taken as they are (hits
    and sources a service returned).
    """
    out: dict[str, tuple[str, ...]] = {}
    for f in KEYWORD_FIELDS:
        values = message_values(message, f)
        if not values:
            continue
        if where is not None:
            try:
                values = f.clean(values)
            except ValueError as err:
                raise InvalidArgument(str(err), field=f"{where}.{f.name}") from None
        if values:
            out[f.name] = values
    return out


def keywords_to_message(keywords: Keywords, message: Message) -> None:
    """Sets every keyword field the message declares from ``keywords``."""
    fields = message.DESCRIPTOR.fields_by_name
    for f in KEYWORD_FIELDS:
        values = keywords.get(f.name, ())
        if f.name not in fields or not values:
            continue
        if f.repeated:
            getattr(message, f.name).extend(values)
        else:
            setattr(message, f.name, values[0])


def merge_keywords(into: dict[str, tuple[str, ...]], keywords: Keywords) -> None:
    """Adds the fields ``into`` does not have yet (the first retriever to know one wins)."""
    for name, values in keywords.items():
        if values and not into.get(name):
            into[name] = values


def keywords_from_stored(stored: Mapping[str, Any], suffix: str = "") -> dict[str, tuple[str, ...]]:
    """The keyword fields of a stored record (a JSON source or payload: lists of
    strings, a single string or nothing); ``suffix`` picks ``<name><suffix>``."""
    out: dict[str, tuple[str, ...]] = {}
    for f in KEYWORD_FIELDS:
        raw = stored.get(f.name + suffix)
        if not raw:
            continue
        values = (str(raw),) if isinstance(raw, str) else tuple(str(v) for v in raw)
        if values:
            out[f.name] = values
    return out


def keywords_to_stored(keywords: Keywords, *, fold: bool = False) -> dict[str, list[str]]:
    """Every keyword field as a list (empty when the document has none), for a
    store's record; ``fold`` case-folds the values of folded fields."""
    return {
        f.name: [f.key(v) if fold else v for v in keywords.get(f.name, ())] for f in KEYWORD_FIELDS
    }


def passages_digest(passages: Iterable[tuple[int, str]]) -> str:
    """SHA-256 (hex) of a document's passages, given as (index, text) in any order.

    The same on every side of ``attest doctor``'s content check: the registry
    computes it from what ingest indexed, each store from what it holds. Each
    text is preceded by its index and length, so no two passage lists share
    a digest by how their texts split.
    """
    h = hashlib.sha256()
    for index, text in sorted(passages):
        data = text.encode("utf-8", "surrogatepass")
        h.update(f"{index}:{len(data)}:".encode())
        h.update(data)
    return h.hexdigest()
