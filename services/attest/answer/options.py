"""Validation of an answer request into a plan: every option resolved, every limit checked.

Defaults come from the settings; a value out of range or contradicting another
one is INVALID_ARGUMENT naming the field; a time budget too short to run
anything is DEADLINE_EXCEEDED. The same plan drives Ask, AskStream and jobs.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

from attest.answer.settings import AnswerSettings
from attest.answer.v1 import answer_pb2
from attest.common.v1 import common_pb2
from attest.core.common import filters_from_proto
from attest.core.errors import DeadlineExceeded, InvalidArgument
from attest.core.validation import check_enum
from attest.generate.v1 import generate_pb2
from attest.retrieval.fanout import SEMANTIC_RETRIEVERS, fusion_of
from attest.retrieval.fusion import FusionSettings

DEFAULT_RETRIEVERS = (
    common_pb2.RETRIEVER_BM25,
    common_pb2.RETRIEVER_DENSE,
    common_pb2.RETRIEVER_KG_ENHANCED,
)


def default_retrievers(settings: AnswerSettings) -> tuple[common_pb2.Retriever.ValueType, ...]:
    """What an empty list of retrievers means: BM25, dense and KG_ENHANCED, and the
    knowledge retriever where a knowledge service is configured."""
    if settings.knowledge_address is None:
        return DEFAULT_RETRIEVERS
    return (*DEFAULT_RETRIEVERS, common_pb2.RETRIEVER_KNOWLEDGE)


@dataclass(frozen=True, slots=True)
class Plan:
    """A validated request: what the pipeline runs."""

    question: str
    retrievers: tuple[common_pb2.Retriever.ValueType, ...]
    fusion: FusionSettings
    # The request's method, which the re-search resolves against its own settings.
    fusion_method: common_pb2.FusionMethod.ValueType
    filters: tuple[common_pb2.Filter, ...]
    top_k_per_retriever: int
    fused_top_k: int
    skip_rerank: bool
    rerank_top_k: int
    passages_per_document: int
    confidence_threshold: int
    max_researches: int
    research_top_k: int
    budget_seconds: float
    explain: bool
    generation_mode: generate_pb2.GenerationMode.ValueType = (
        generate_pb2.GENERATION_MODE_UNSPECIFIED
    )

    @property
    def semantic_retrievers(self) -> tuple[common_pb2.Retriever.ValueType, ...]:
        return tuple(r for r in self.retrievers if r in SEMANTIC_RETRIEVERS)


def _range(value: int, low: int, high: int, field: str) -> None:
    if not low <= value <= high:
        raise InvalidArgument(f"must be between {low} and {high}, got {value}", field=field)


# Control (Cc), format (Cf: zero-width space and joiners, BOM, soft hyphen),
# separators (Z*) and lone surrogates (Cs) show nothing: a question made of
# them alone is as empty as white space.
_INVISIBLE = frozenset({"Cc", "Cf", "Cs", "Zs", "Zl", "Zp"})


def has_visible_text(text: str) -> bool:
    """Whether ``text`` has a character that shows (not only invisible ones)."""
    return any(unicodedata.category(c) not in _INVISIBLE for c in text)


def _or_default(value: int, default: int) -> int:
    return value if value else default


def validate(
    question: str,
    options: answer_pb2.AskOptions,
    settings: AnswerSettings,
    *,
    deadline_seconds: float | None,
    granted_seconds: float | None = None,
) -> Plan:
    """The plan of one request; ``deadline_seconds`` is what the caller's gRPC deadline
    leaves now, ``granted_seconds`` what it left when the call arrived (the deadline is
    admitted on that one)."""
    limits, defaults = settings.limits, settings.defaults
    if not question.strip():
        raise InvalidArgument("must not be empty", field="question")
    if not has_visible_text(question):
        raise InvalidArgument(
            "has no visible characters (only control, zero-width or other invisible "
            "characters such as NUL or U+200B): ask with words",
            field="question",
        )
    if len(question) > limits.max_question_chars:
        raise InvalidArgument(
            f"is {len(question):,} characters long; the limit is {limits.max_question_chars:,}",
            field="question",
        )

    retrieval = options.retrieval
    retrievers = tuple(retrieval.retrievers) or default_retrievers(settings)
    seen: set[int] = set()
    for i, r in enumerate(retrievers):
        field = f"options.retrieval.retrievers[{i}]"
        if r not in common_pb2.Retriever.values() or r == common_pb2.RETRIEVER_UNSPECIFIED:
            raise InvalidArgument(f"unknown or unspecified retriever {r}", field=field)
        if r == common_pb2.RETRIEVER_KNOWLEDGE and settings.knowledge_address is None:
            raise InvalidArgument(
                "RETRIEVER_KNOWLEDGE is not available: this server has no knowledge service "
                "(ATTEST_ANSWER_KNOWLEDGE_ADDRESS is unset)",
                field=field,
            )
        if r in seen:
            raise InvalidArgument(
                f"{common_pb2.Retriever.Name(r)} is listed twice", field="options.retrieval"
            )
        seen.add(r)
    if retrieval.fusion not in common_pb2.FusionMethod.values():
        raise InvalidArgument(
            f"unknown fusion method {retrieval.fusion}", field="options.retrieval.fusion"
        )
    fusion = fusion_of(retrieval.fusion, settings.fusion())
    try:
        filters_from_proto(
            retrieval.filters, max_filters=limits.max_filters, max_values=limits.max_filter_values
        )
    except InvalidArgument as exc:
        raise InvalidArgument(exc.message, field=f"options.retrieval.{exc.field}") from None

    _range(retrieval.top_k_per_retriever, 0, 1000, "options.retrieval.top_k_per_retriever")
    _range(options.fused_top_k, 0, 1000, "options.fused_top_k")
    _range(options.rerank_top_k, 0, 100, "options.rerank_top_k")
    _range(options.passages_per_document, 0, 8, "options.passages_per_document")
    _range(options.research_top_k, 0, 20, "options.research_top_k")
    per_retriever = _or_default(retrieval.top_k_per_retriever, defaults.top_k_per_retriever)
    fused_top_k = _or_default(options.fused_top_k, defaults.fused_top_k)
    rerank_top_k = _or_default(options.rerank_top_k, defaults.rerank_top_k)
    passages = _or_default(options.passages_per_document, defaults.passages_per_document)
    if rerank_top_k > fused_top_k:
        raise InvalidArgument(
            f"rerank_top_k {rerank_top_k} exceeds fused_top_k {fused_top_k}: the reranker "
            "cannot keep more documents than fusion passes on",
            field="options.rerank_top_k",
        )
    if fused_top_k > per_retriever * len(retrievers):
        raise InvalidArgument(
            f"fused_top_k {fused_top_k} exceeds the {per_retriever * len(retrievers)} candidates "
            f"that {len(retrievers)} retriever(s) of top_k_per_retriever {per_retriever} "
            "can return",
            field="options.fused_top_k",
        )
    if rerank_top_k * passages > limits.max_sources:
        raise InvalidArgument(
            f"rerank_top_k {rerank_top_k} x passages_per_document {passages} is "
            f"{rerank_top_k * passages} sources; at most {limits.max_sources} are allowed",
            field="options.passages_per_document",
        )

    threshold = (
        options.confidence_threshold
        if options.HasField("confidence_threshold")
        else defaults.confidence_threshold
    )
    _range(threshold, 0, 10, "options.confidence_threshold")
    researches = (
        options.max_researches if options.HasField("max_researches") else defaults.max_researches
    )
    _range(researches, 0, 20, "options.max_researches")

    check_enum(
        options.generation_mode, generate_pb2.GenerationMode.values(), "options.generation_mode"
    )

    budget = _budget(options, settings, deadline_seconds, granted_seconds)
    return Plan(
        question=question,
        retrievers=retrievers,
        fusion=fusion,
        fusion_method=retrieval.fusion,
        filters=tuple(retrieval.filters),
        top_k_per_retriever=per_retriever,
        fused_top_k=fused_top_k,
        skip_rerank=options.skip_rerank,
        rerank_top_k=rerank_top_k,
        passages_per_document=passages,
        confidence_threshold=threshold,
        max_researches=researches,
        research_top_k=_or_default(options.research_top_k, defaults.research_top_k),
        budget_seconds=budget,
        explain=options.explain,
        generation_mode=options.generation_mode,
    )


#: What a deadline may have lost on its way to the server and still count as
#: the minimum: a caller who sets exactly ``min_budget_seconds`` is admitted.
DEADLINE_TRIP_SECONDS = 0.01


def _budget(
    options: answer_pb2.AskOptions,
    settings: AnswerSettings,
    deadline_seconds: float | None,
    granted_seconds: float | None = None,
) -> float:
    limits = settings.limits
    budget: float | None = None
    if options.HasField("time_budget"):
        given = options.time_budget
        if abs(given.nanos) >= 1_000_000_000 or given.seconds * given.nanos < 0:
            # google.protobuf.Duration: nanos within a second, of the seconds' sign.
            raise InvalidArgument(
                f"is not a valid Duration (seconds {given.seconds}, nanos {given.nanos}: "
                "nanos must be under 1e9 in size and of the seconds' sign)",
                field="options.time_budget",
            )
        budget = given.ToNanoseconds() / 1e9
        if not limits.min_budget_seconds <= budget <= limits.max_budget_seconds:
            raise InvalidArgument(
                f"must be between {limits.min_budget_seconds * 1000:.0f} ms and "
                f"{limits.max_budget_seconds:.0f} s, got {budget * 1000:.0f} ms",
                field="options.time_budget",
            )
    if deadline_seconds is not None:
        # Admitted on what the deadline left when the call arrived (less a
        # trip's allowance), not on what is left after the work done here
        # since: otherwise a deadline at the minimum is admitted or refused by
        # the microseconds a method spends before this check.
        left = deadline_seconds if granted_seconds is None else granted_seconds
        if deadline_seconds <= 0 or left + DEADLINE_TRIP_SECONDS < limits.min_budget_seconds:
            raise DeadlineExceeded(
                f"the call's deadline leaves {max(left, 0) * 1000:.0f} ms, too short "
                f"to answer: the pipeline needs at least {limits.min_budget_seconds * 1000:.0f} ms"
            )
        budget = deadline_seconds if budget is None else min(budget, deadline_seconds)
    return budget if budget is not None else settings.defaults.job_budget_seconds
