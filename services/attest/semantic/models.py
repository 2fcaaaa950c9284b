"""Domain objects of the semantic service; no protobuf, no grpc."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import numpy.typing as npt

from attest.core.common import Filters
from attest.core.document import HasKeywords, Keywords

Vector = npt.NDArray[np.float32]


def passage_text(title: str, text: str) -> str:
    """The text a passage is embedded as: its article's title, a newline, the passage.

    One definition for the index (the stored passage vectors) and the
    reranker's embedding fallback (which scores those stored vectors and
    embeds only passages without one), so both embed the same text.
    """
    return f"{title}\n{text}" if title else text


class Level(enum.Enum):
    DOCUMENT = "document"
    PASSAGE = "passage"


class Mode(enum.Enum):
    DENSE = "dense"
    KG = "kg"
    FUSED = "fused"


class Variant(enum.Enum):
    PLAIN = "kg"
    ENHANCED = "kg_enhanced"


@dataclass(frozen=True)
class PassageIn:
    index: int
    text: str
    vector: Vector | None = None
    # 1-based page of the article the passage is on; 0 when it has no pages.
    page: int = 0


@dataclass(frozen=True)
class SemanticDoc(HasKeywords):
    id: str
    title: str
    body: str
    summary: str = ""
    published_at: datetime | None = None
    source_url: str = ""
    # The keyword fields (attest.core.document) by name.
    keywords: Keywords = field(default_factory=dict)
    passages: tuple[PassageIn, ...] = ()
    article_vector: Vector | None = None


@dataclass(frozen=True)
class SemanticQuery:
    text: str
    vector: Vector | None = None
    top_k: int = 10
    filters: Filters = field(default_factory=Filters)
    level: Level = Level.DOCUMENT
    mode: Mode = Mode.DENSE
    variant: Variant = Variant.ENHANCED
    kg_top_n: int | None = None
    # Hits carry only their id, passage index and scores (HIT_VIEW_IDS).
    ids_only: bool = False


# Not frozen: a search builds up to a hundred of these, and a frozen
# dataclass's __init__ (object.__setattr__ per field) took 4.3 us against
# 0.8 us with slots. Treat them as values all the same.
@dataclass(slots=True)
class SemanticHit:
    doc_id: str
    passage_index: int
    score: float
    title: str
    text: str
    dense_score: float | None = None
    kg_score: float | None = None
    best_node_id: str = ""
    keywords: Keywords = field(default_factory=dict)
    published_at: datetime | None = None
    source_url: str = ""
    # 1-based page of a passage hit; 0 for an article hit, an article without
    # pages or a passage point written before pages were kept.
    page: int = 0


@dataclass(frozen=True)
class IndexResult:
    documents: int
    passages: int
    kg_links: int


@dataclass(frozen=True)
class SemanticCounts:
    documents: int
    passages: int
    linked_documents: int
    kg_links: int
