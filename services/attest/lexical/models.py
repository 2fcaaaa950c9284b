"""Domain objects of the lexical index; no protobuf, no grpc."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime

from attest.core.common import Filters
from attest.core.document import Keywords


class Level(enum.Enum):
    DOCUMENT = "document"
    PASSAGE = "passage"


@dataclass(frozen=True, slots=True)
class PassageIn:
    index: int
    text: str
    # 1-based page of the document the passage is on; 0 when it has no pages.
    page: int = 0


@dataclass(frozen=True, slots=True)
class DocumentIn:
    """A document to index, with its passages (possibly none)."""

    id: str
    title: str
    body: str
    published_at: datetime | None = None
    source_url: str = ""
    # The keyword fields (attest.core.document) by name.
    keywords: Keywords = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)
    passages: tuple[PassageIn, ...] = ()


@dataclass(frozen=True, slots=True)
class SearchQuery:
    text: str
    top_k: int = 10
    filters: Filters = field(default_factory=Filters)
    level: Level = Level.DOCUMENT
    highlight: bool = False
    # Hits carry only their id, passage index and score (HIT_VIEW_IDS).
    ids_only: bool = False


# Not frozen, as SemanticHit: a search builds one per hit (its top_k, 100 for
# a fusion), and a frozen dataclass's __init__ sets each field through
# object.__setattr__.
@dataclass(slots=True)
class Hit:
    doc_id: str
    passage_index: int  # -1 for a document hit
    score: float
    title: str
    text: str
    highlights: tuple[str, ...] = ()
    keywords: Keywords = field(default_factory=dict)
    published_at: datetime | None = None
    source_url: str = ""
    # 1-based page of a passage hit; 0 for a document hit, a document without
    # pages or a passage record written before pages were kept.
    page: int = 0


@dataclass(frozen=True, slots=True)
class IndexResult:
    documents: int
    passages: int


@dataclass(frozen=True, slots=True)
class Counts:
    documents: int
    passages: int


@dataclass(frozen=True, slots=True)
class StoredDocument:
    """A document id as the index holds it, for reconciliation (``attest doctor``)."""

    doc_id: str
    passages: int  # passage records with this id
    has_document: bool  # False: passages left without their document record
    # attest.core.document.passages_digest of the passage records' texts; ""
    # where the backend does not read texts while listing (the engines).
    passages_sha256: str = ""


@dataclass(frozen=True, slots=True)
class DocumentPage:
    documents: tuple[StoredDocument, ...]
    next_page_token: str  # "" on the last page
