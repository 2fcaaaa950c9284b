"""Domain objects of the generator: sources, citations, sentences and events.

Plain frozen dataclasses, so the pipeline can be driven from gRPC, Celery or
a script alike. Source indices are positions in the answer's source list,
which only ever grows (re-search appends).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from attest.core.document import Keywords


class Mode(StrEnum):
    LLM = "llm"
    EXTRACTIVE = "extractive"


class Step(StrEnum):
    SUMMARIZE = "summarize"
    ANSWER = "answer"
    CITE = "cite"
    RESEARCH = "research"


INSUFFICIENT = "insufficient information available"


@dataclass(frozen=True, slots=True)
class Source:
    """A piece of text handed to the generator as evidence."""

    doc_id: str
    text: str
    passage_index: int = -1
    title: str = ""
    source_url: str = ""
    published_at: object | None = None  # datetime; kept opaque here
    summary: str = ""
    # The document's keyword fields (attest.core.document), passed through.
    keywords: Keywords = field(default_factory=dict)
    # 1-based page of the passage (common.v1.Source.page), passed through; 0 unknown.
    page: int = 0

    @property
    def key(self) -> tuple[str, int]:
        return (self.doc_id, self.passage_index)

    @property
    def evidence(self) -> str:
        """What citations are matched against: the summary, else the text."""
        return self.summary or self.text


@dataclass(frozen=True, slots=True)
class Citation:
    source_index: int
    doc_id: str
    passage_index: int
    confidence: int
    quote: str = ""


@dataclass(frozen=True, slots=True)
class Sentence:
    index: int
    text: str
    citations: tuple[Citation, ...] = ()

    @property
    def unsupported(self) -> bool:
        return not self.citations

    @property
    def confidence(self) -> int:
        return max((c.confidence for c in self.citations), default=0)


@dataclass(frozen=True, slots=True)
class Proposal:
    """A citation as a model proposed it, before validation."""

    sentence: int
    source: object
    confidence: object
    quote: object = ""


@dataclass(frozen=True, slots=True)
class Judgement:
    sentence_index: int
    source_index: int
    confidence: int
    quote: str = ""
    rejected_reason: str = ""


@dataclass(frozen=True, slots=True)
class SummaryEvent:
    source_index: int
    summary: str


@dataclass(frozen=True, slots=True)
class DraftEvent:
    """A sentence as the model finished writing it, before it is cited; the
    SentenceEvent with the same index replaces it (LLM mode only)."""

    index: int
    text: str


@dataclass(frozen=True, slots=True)
class SentenceEvent:
    sentence: Sentence


@dataclass(frozen=True, slots=True)
class RevisionEvent:
    sentence: Sentence
    previous_confidence: int
    query: str
    added_sources: tuple[Source, ...]
    first_added_source_index: int
    # No source supports the sentence even after its search: it is withdrawn.
    removed: bool = False

    @property
    def sentence_index(self) -> int:
        return self.sentence.index


@dataclass(frozen=True, slots=True)
class StepTiming:
    step: Step
    seconds: float
    llm_calls: int


@dataclass(frozen=True, slots=True)
class FinalEvent:
    answer: str
    sentences: tuple[Sentence, ...]
    insufficient_information: bool
    researches: int
    unsupported_sentences: int
    discarded_citations: int
    timings: tuple[StepTiming, ...]
    total_seconds: float
    llm_calls: int
    mode: Mode
    degraded_reason: str = ""
    sources: tuple[Source, ...] = field(default=())
    # LLM mode: citations the model and the support judge rated far apart.
    judge_disagreements: int = 0
    # Sentences withdrawn because no source supports them.
    removed_sentences: int = 0
    # Why re-searches failed (how many, the first reason); empty when none did.
    research_degraded_reason: str = ""


Event = SummaryEvent | DraftEvent | SentenceEvent | RevisionEvent | FinalEvent
