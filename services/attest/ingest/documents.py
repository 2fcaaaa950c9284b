"""Intake of documents: parsing, validation, normalization and deterministic ids.

Every rejection is an ``ItemError`` with a machine-readable code and a reason
naming the field; the caller records it against the item (its id when it
could be read, its origin such as ``file.jsonl:12``) and goes on with the
other items of the batch. Nothing here touches the network.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from attest.core import validation
from attest.core.document import (
    KEYWORD_FIELDS,
    HasKeywords,
    Keywords,
    keywords_from_stored,
    keywords_to_stored,
)
from attest.core.errors import InvalidArgument
from attest.ingest.passages import PAGE_BREAK

MAX_ID_CHARS = validation.MAX_ID_CHARS
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_TITLE_CHARS = 4096
MAX_URL_CHARS = 4096
MAX_ORGANIZATIONS = 256
MAX_METADATA_ENTRIES = 64


class FailureCode(enum.Enum):
    """Why an item failed (mirrors ``attest.ingest.v1.FailureCode``)."""

    INVALID_JSON = "INVALID_JSON"
    INVALID_UTF8 = "INVALID_UTF8"
    MISSING_ID = "MISSING_ID"
    INVALID_ID = "INVALID_ID"
    EMPTY_BODY = "EMPTY_BODY"
    BODY_TOO_LARGE = "BODY_TOO_LARGE"
    INVALID_DATE = "INVALID_DATE"
    INVALID_FIELD = "INVALID_FIELD"
    PROCESSING_ERROR = "PROCESSING_ERROR"
    UNREADABLE_FILE = "UNREADABLE_FILE"


class ItemError(Exception):
    """An item that cannot be ingested; ``doc_id`` is empty when it could not be read."""

    def __init__(self, code: FailureCode, reason: str, doc_id: str = "") -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.doc_id = doc_id


@dataclass(frozen=True, slots=True)
class Article(HasKeywords):
    """A validated, normalized document."""

    id: str
    title: str
    body: str
    published_at: datetime | None = None
    source_url: str = ""
    # The keyword fields (attest.core.document) by name.
    keywords: Keywords = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """JSON for Celery and the job store: each keyword field a list under its name."""
        return {
            "id": self.id,
            "title": self.title,
            "body": self.body,
            "published_at": self.published_at.isoformat() if self.published_at else None,
            "source_url": self.source_url,
            **keywords_to_stored(self.keywords),
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Article:
        published = data.get("published_at")
        return cls(
            id=data["id"],
            title=data.get("title", ""),
            body=data["body"],
            published_at=datetime.fromisoformat(published) if published else None,
            source_url=data.get("source_url", ""),
            keywords=keywords_from_stored(data),
            metadata=dict(data.get("metadata") or {}),
        )


# -- normalization ------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u200b\ufeff]")
_SPACES = re.compile(r"[ \t\xa0\u2000-\u200a\u3000]+")
# A line break followed by indentation starts a paragraph (news wire style);
# two or more line breaks are a paragraph break.
_PARAGRAPH = re.compile(r"\n[ \t]+(?=\S)|\n{2,}")
# A single line break inside a paragraph is a hard wrap, unless the next line
# starts a list item, a heading or a quote.
_WRAP = re.compile(r"(?<=\S)\n(?![-*+#>|]|\d+[.)]\s|\n)")


def normalize_text(text: str) -> str:
    """NFC, no control characters, single spaces, hard wraps joined, paragraphs
    separated by one blank line, no outer white space.

    A form feed (``PAGE_BREAK``) is a page break and survives: each page is
    normalized on its own, and a page with text is kept from a break by a
    blank line, so that the break is also a paragraph (and sentence) break. A
    page without text keeps its break (two form feeds in a row, or one that
    starts the body), so the pages after it keep their numbers; only empty
    pages at the end go. A body without a form feed normalizes as it always
    has: content hashes depend on it.
    """
    if PAGE_BREAK not in text:
        return _normalize_page(text)
    pages = [_normalize_page(page) for page in text.split(PAGE_BREAK)]
    while pages and not pages[-1]:
        pages.pop()
    last = len(pages) - 1
    padded = []
    for i, page in enumerate(pages):
        if page:
            page = ("\n\n" if i > 0 else "") + page + ("\n\n" if i < last else "")
        padded.append(page)
    return PAGE_BREAK.join(padded)


def _normalize_page(text: str) -> str:
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _CONTROL.sub("", text)
    text = _PARAGRAPH.sub("\n\n", text)
    text = _WRAP.sub(" ", text)
    lines = [_SPACES.sub(" ", line).strip() for line in text.split("\n")]
    out: list[str] = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip()


def normalize_line(text: str) -> str:
    """One-line fields (title, names): NFC, white space collapsed."""
    text = unicodedata.normalize("NFC", _CONTROL.sub("", text))
    return " ".join(text.split())


# -- validation ---------------------------------------------------------------


# The rules themselves are the shared ones (attest.core.validation), so a field
# is accepted here exactly when the lexical and semantic services accept it;
# only the failure is recorded against the item instead of failing the call.


def parse_date(value: str) -> datetime:
    """An ISO-8601 date or date-time (``Z`` allowed); naive values are UTC.

    The value keeps the caller's UTC offset (it is part of the content hash).
    """
    try:
        validation.check_published(validation.parse_date(value, "published_at"), "published_at")
    except InvalidArgument as err:
        raise ItemError(FailureCode.INVALID_DATE, err.details) from None
    parsed = datetime.fromisoformat(value.strip())
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _published(value: datetime | None, doc_id: str) -> datetime | None:
    if value is None:
        return None
    try:
        validation.check_published(value, "published_at")
    except InvalidArgument as err:
        raise ItemError(FailureCode.INVALID_DATE, err.details, doc_id) from None
    return value


def _check_id(value: object) -> str:
    if value is None or (isinstance(value, str) and not value.strip()):
        raise ItemError(FailureCode.MISSING_ID, "id: missing or empty")
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ItemError(FailureCode.INVALID_ID, f"id: must be a string, got {type(value).__name__}")
    # Never trimmed: " sp1 " is not "sp1" (validation.check_id refuses it).
    doc_id = str(value)
    if len(doc_id) > MAX_ID_CHARS:
        raise ItemError(
            FailureCode.INVALID_ID, f"id: is {len(doc_id):,} characters; at most {MAX_ID_CHARS}"
        )
    try:
        return validation.check_id(doc_id, "id", MAX_ID_CHARS)
    except InvalidArgument as err:
        # An id with white space at an end is named as sent, so the caller can
        # find it; one with control characters only in the reason, escaped.
        named = doc_id if not validation.has_forbidden_id_chars(doc_id) else ""
        raise ItemError(FailureCode.INVALID_ID, err.details, named) from None


def _check_texts(doc_id: str, **fields: str | Sequence[str] | dict[str, str]) -> None:
    """Every string of the item must be valid UTF-8 (JSON can spell lone surrogates)."""
    for name, value in fields.items():
        if isinstance(value, str):
            texts: Sequence[str] = [value]
        elif isinstance(value, dict):
            texts = [*value.keys(), *value.values()]
        else:
            texts = value
        for text in texts:
            try:
                validation.check_text(text, name)
            except InvalidArgument as err:
                raise ItemError(FailureCode.INVALID_UTF8, err.details, doc_id) from None


def _string(data: dict[str, Any], key: str, doc_id: str, limit: int) -> str:
    value = data.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ItemError(
            FailureCode.INVALID_FIELD,
            f"{key}: must be a string, got {type(value).__name__}",
            doc_id,
        )
    if len(value) > limit:
        raise ItemError(
            FailureCode.INVALID_FIELD, f"{key}: is longer than {limit:,} characters", doc_id
        )
    return value


def _strings(data: dict[str, Any], key: str, doc_id: str) -> list[str]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ItemError(FailureCode.INVALID_FIELD, f"{key}: must be a list of strings", doc_id)
    if len(value) > MAX_ORGANIZATIONS:
        raise ItemError(
            FailureCode.INVALID_FIELD, f"{key}: at most {MAX_ORGANIZATIONS} entries", doc_id
        )
    return value


def article_from_fields(
    *,
    doc_id: object,
    title: object,
    body: object,
    published_at: datetime | str | None,
    source_url: object,
    keywords: Mapping[str, Sequence[str]],
    metadata: dict[str, str],
) -> Article:
    """Validate and normalize one document given field by field."""
    checked_id = _check_id(doc_id)
    fields = {"title": title, "body": body, "source_url": source_url}
    title_s = _string(fields, "title", checked_id, MAX_TITLE_CHARS)
    url = _string(fields, "source_url", checked_id, MAX_URL_CHARS)
    if body is not None and not isinstance(body, str):
        raise ItemError(
            FailureCode.INVALID_FIELD,
            f"body: must be a string, got {type(body).__name__}",
            checked_id,
        )
    raw_body = body or ""
    size = len(raw_body.encode("utf-8", "surrogatepass"))
    if size > MAX_BODY_BYTES:
        raise ItemError(
            FailureCode.BODY_TOO_LARGE,
            f"body: is {size:,} bytes; the limit is {MAX_BODY_BYTES:,}",
            checked_id,
        )
    norm_body = normalize_text(raw_body)
    if not norm_body:
        raise ItemError(FailureCode.EMPTY_BODY, "body: is empty or white space only", checked_id)
    _check_texts(
        checked_id,
        title=title_s,
        body=raw_body,
        source_url=url,
        metadata=metadata,
        **{f.name: keywords.get(f.name, ()) for f in KEYWORD_FIELDS},
    )
    when: datetime | None
    try:
        when = parse_date(published_at) if isinstance(published_at, str) else published_at
    except ItemError as err:
        err.doc_id = checked_id
        raise
    when = _published(when, checked_id)
    if len(metadata) > MAX_METADATA_ENTRIES:
        raise ItemError(
            FailureCode.INVALID_FIELD,
            f"metadata: at most {MAX_METADATA_ENTRIES} entries",
            checked_id,
        )
    return Article(
        id=checked_id,
        title=normalize_line(title_s),
        body=norm_body,
        published_at=when,
        source_url=url.strip(),
        keywords=_keywords(keywords, checked_id),
        metadata=dict(metadata),
    )


def _keywords(given: Mapping[str, Sequence[str]], doc_id: str) -> dict[str, tuple[str, ...]]:
    """The keyword fields on one line each, each value once (compared as the field
    compares them: a folded field without regard to case) and checked."""
    out: dict[str, tuple[str, ...]] = {}
    for f in KEYWORD_FIELDS:
        seen: dict[str, str] = {}
        for value in given.get(f.name, ()):
            line = normalize_line(value)
            if line:
                seen.setdefault(f.key(line), line)
        try:
            values = f.clean(seen.values())
        except ValueError as err:
            raise ItemError(FailureCode.INVALID_FIELD, f"{f.name}: {err}", doc_id) from None
        if values:
            out[f.name] = values
    return out


def _keyword_values(data: dict[str, Any], doc_id: str) -> dict[str, list[str]]:
    """The keyword fields of a JSON object: a list of strings, or one string for
    a field the messages carry as a single string."""
    out: dict[str, list[str]] = {}
    for f in KEYWORD_FIELDS:
        if f.repeated:
            out[f.name] = _strings(data, f.name, doc_id)
        else:
            value = _string(data, f.name, doc_id, MAX_TITLE_CHARS)
            out[f.name] = [value] if value else []
    return out


def article_from_raw_json(raw: bytes) -> Article:
    """One JSON object (keys as in ``IngestItem.raw_json``), validated and normalized."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ItemError(
            FailureCode.INVALID_UTF8,
            f"not valid UTF-8 (byte {exc.start}: {exc.reason}); documents must be UTF-8: "
            "convert the file first (e.g. `iconv -f LATIN1 -t UTF-8`, or the encoding it has)",
        ) from None
    try:
        data = validation.loads_json(text, "raw_json")
    except InvalidArgument as err:
        raise ItemError(FailureCode.INVALID_JSON, err.details) from None
    if not isinstance(data, dict):
        raise ItemError(
            FailureCode.INVALID_JSON, f"expected a JSON object, got {type(data).__name__}"
        )
    doc_id = data.get("id", data.get("_id"))
    checked = _check_id(doc_id)
    body = data.get("body", data.get("text"))
    date = data.get("published_at")
    if date is not None and not isinstance(date, str):
        raise ItemError(FailureCode.INVALID_DATE, "published_at: must be a string", checked)
    metadata = data.get("metadata") or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise ItemError(
            FailureCode.INVALID_FIELD, "metadata: must be an object of strings", checked
        )
    return article_from_fields(
        doc_id=checked,
        title=data.get("title"),
        body=body,
        published_at=date or None,
        source_url=data.get("source_url"),
        keywords=_keyword_values(data, checked),
        metadata=metadata,
    )


# -- deterministic ids ----------------------------------------------------------


def _digest(*parts: str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x1f")
    return h.hexdigest()


# Keyword fields the hash held by position before the fields were declared in
# one place; any other field counts (after them) only when it has values, so a
# field added later leaves the hashes of documents without it as they were.
_HASHED_BY_POSITION = ("organizations", "entity_ids")


def content_hash(article: Article) -> str:
    """Hash of everything stored for the document; equal hashes mean nothing to do."""
    keywords = article.keywords
    canonical = json.dumps(
        [
            article.title,
            article.body,
            article.published_at.isoformat() if article.published_at else None,
            article.source_url,
            *(list(keywords.get(name, ())) for name in _HASHED_BY_POSITION),
            sorted(article.metadata.items()),
            *(
                [f.name, list(keywords[f.name])]
                for f in KEYWORD_FIELDS
                if f.name not in _HASHED_BY_POSITION and keywords.get(f.name)
            ),
        ],
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return _digest(canonical)[:32]


def document_key(tenant: str, doc_id: str) -> str:
    """Stable key of (tenant, document id)."""
    return _digest(tenant, doc_id)[:32]


def passage_id(tenant: str, doc_id: str, content: str, index: int) -> str:
    """Id of passage ``index`` of one version (content hash) of a document."""
    return _digest(tenant, doc_id, content, str(index))[:32]
