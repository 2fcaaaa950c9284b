"""gRPC servicer of the generate service: validate, convert, call the Generator."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

import grpc
from google.protobuf.duration_pb2 import Duration

from attest.common.v1 import common_pb2
from attest.core.channels import create_channel
from attest.core.common import filters_from_proto, from_timestamp, to_timestamp
from attest.core.context import budget
from attest.core.document import keywords_from_message, keywords_to_message
from attest.core.errors import InvalidArgument, Unavailable
from attest.core.rpc_errors import from_rpc
from attest.core.settings import RequestLimits
from attest.generate.models import (
    Citation,
    DraftEvent,
    Event,
    FinalEvent,
    Mode,
    RevisionEvent,
    Sentence,
    SentenceEvent,
    Source,
    Step,
    SummaryEvent,
)
from attest.generate.pipeline import AnswerOptions, Found, Generator, SearchFn
from attest.generate.settings import GenerateLimits, GenerateSettings, build_generator
from attest.generate.v1 import generate_pb2, generate_pb2_grpc
from attest.generate.vectors import TextVectors
from attest.knowledge.v1 import knowledge_pb2
from attest.lexical.v1 import lexical_pb2
from attest.retrieval.fanout import (
    RETRIEVER_NAMES,
    Level,
    Limits,
    Query,
    Retrieval,
    Retriever,
    fusion_of,
    retrieve,
)
from attest.semantic.v1 import semantic_pb2

Context = grpc.aio.ServicerContext[Any, Any]
log = logging.getLogger(__name__)

_MODES = {
    generate_pb2.GENERATION_MODE_UNSPECIFIED: None,
    generate_pb2.GENERATION_MODE_LLM: Mode.LLM,
    generate_pb2.GENERATION_MODE_EXTRACTIVE: Mode.EXTRACTIVE,
}
_MODE_OUT = {
    Mode.LLM: generate_pb2.GENERATION_MODE_LLM,
    Mode.EXTRACTIVE: generate_pb2.GENERATION_MODE_EXTRACTIVE,
}
_STEPS = {
    Step.SUMMARIZE: generate_pb2.STEP_SUMMARIZE,
    Step.ANSWER: generate_pb2.STEP_ANSWER,
    Step.CITE: generate_pb2.STEP_CITE,
    Step.RESEARCH: generate_pb2.STEP_RESEARCH,
}


# -- conversion with validation ------------------------------------------------------------


def _mode(value: int) -> Mode | None:
    if value not in generate_pb2.GenerationMode.values():
        raise InvalidArgument(f"unknown value {value}", field="mode")
    return _MODES[generate_pb2.GenerationMode.ValueType(value)]


def _range(value: int, low: int, high: int, field: str) -> None:
    if not low <= value <= high:
        raise InvalidArgument(f"must be between {low} and {high}, got {value}", field=field)


def _text(value: str, field: str, limit: int, *, required: bool = True) -> str:
    if required and not value.strip():
        raise InvalidArgument("must not be empty", field=field)
    if len(value) > limit:
        raise InvalidArgument(f"is longer than {limit:,} characters", field=field)
    return value


def sources_from_proto(
    sources: Sequence[common_pb2.Source], limits: GenerateLimits, *, require_text: bool = True
) -> list[Source]:
    if not sources:
        raise InvalidArgument("must contain at least one source", field="sources")
    if len(sources) > limits.max_sources:
        raise InvalidArgument(
            f"has {len(sources)} sources; the limit is {limits.max_sources}", field="sources"
        )
    out = []
    for i, s in enumerate(sources):
        where = f"sources[{i}]"
        if not s.text.strip() and (require_text or not s.summary.strip()):
            raise InvalidArgument("must not be empty", field=f"{where}.text")
        _text(s.text, f"{where}.text", limits.max_source_chars, required=False)
        _text(s.summary, f"{where}.summary", limits.max_source_chars, required=False)
        out.append(
            Source(
                doc_id=s.doc_id,
                text=s.text or s.summary,
                passage_index=s.passage_index,
                title=s.title,
                source_url=s.source_url,
                published_at=from_timestamp(
                    s.published_at, s.HasField("published_at"), f"{where}.published_at"
                ),
                summary=s.summary,
                keywords=keywords_from_message(s, where),
                page=s.page,
            )
        )
    return out


def _sentences(values: Sequence[str], limits: GenerateLimits) -> list[str]:
    if not values:
        raise InvalidArgument("must contain at least one sentence", field="sentences")
    if len(values) > limits.max_sentences:
        raise InvalidArgument(f"at most {limits.max_sentences} sentences", field="sentences")
    return [_text(v, f"sentences[{i}]", limits.max_sentence_chars) for i, v in enumerate(values)]


def source_to_proto(s: Source) -> common_pb2.Source:
    out = common_pb2.Source(
        doc_id=s.doc_id,
        passage_index=s.passage_index,
        title=s.title,
        text=s.text,
        source_url=s.source_url,
        summary=s.summary,
        page=s.page,
    )
    stamp = to_timestamp(s.published_at) if s.published_at is not None else None  # type: ignore[arg-type]
    if stamp is not None:
        out.published_at.CopyFrom(stamp)
    keywords_to_message(s.keywords, out)
    return out


def citation_to_proto(c: Citation) -> common_pb2.Citation:
    return common_pb2.Citation(
        source_index=c.source_index,
        doc_id=c.doc_id,
        passage_index=c.passage_index,
        confidence=c.confidence,
        quote=c.quote,
    )


def sentence_to_proto(s: Sentence) -> common_pb2.AnswerSentence:
    return common_pb2.AnswerSentence(
        index=s.index,
        text=s.text,
        citations=[citation_to_proto(c) for c in s.citations],
        unsupported=s.unsupported,
        confidence=s.confidence,
    )


def _duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def event_to_proto(event: Event) -> generate_pb2.AnswerResponse:
    if isinstance(event, SummaryEvent):
        return generate_pb2.AnswerResponse(
            summary=generate_pb2.SourceSummary(
                source_index=event.source_index, summary=event.summary
            )
        )
    if isinstance(event, DraftEvent):
        return generate_pb2.AnswerResponse(
            draft=common_pb2.SentenceDraft(index=event.index, text=event.text)
        )
    if isinstance(event, SentenceEvent):
        return generate_pb2.AnswerResponse(sentence=sentence_to_proto(event.sentence))
    if isinstance(event, RevisionEvent):
        return generate_pb2.AnswerResponse(
            revision=common_pb2.SentenceRevision(
                sentence_index=event.sentence_index,
                sentence=sentence_to_proto(event.sentence),
                previous_confidence=event.previous_confidence,
                query=event.query,
                added_sources=[source_to_proto(s) for s in event.added_sources],
                first_added_source_index=event.first_added_source_index,
                removed=event.removed,
            )
        )
    assert isinstance(event, FinalEvent)
    return generate_pb2.AnswerResponse(
        final=generate_pb2.AnswerFinal(
            answer=event.answer,
            sentences=[sentence_to_proto(s) for s in event.sentences],
            insufficient_information=event.insufficient_information,
            researches=event.researches,
            unsupported_sentences=event.unsupported_sentences,
            discarded_citations=event.discarded_citations,
            timings=[
                generate_pb2.StepTiming(
                    step=_STEPS[t.step], duration=_duration(t.seconds), llm_calls=t.llm_calls
                )
                for t in event.timings
            ],
            total=_duration(event.total_seconds),
            llm_calls=event.llm_calls,
            mode=_MODE_OUT[event.mode],
            degraded_reason=event.degraded_reason,
            judge_disagreements=event.judge_disagreements,
            removed_sentences=event.removed_sentences,
            research_degraded_reason=event.research_degraded_reason,
        )
    )


# -- re-search through the lexical and semantic services -------------------------------------

# The retrievers of a re-search whose options name none (RetrievalOptions'
# server default; the answer service always names its plan's).
DEFAULT_RESEARCH_RETRIEVERS = (
    common_pb2.RETRIEVER_BM25,
    common_pb2.RETRIEVER_DENSE,
    common_pb2.RETRIEVER_KG_ENHANCED,
)


def research_retrievers(
    options: common_pb2.RetrievalOptions,
) -> tuple[common_pb2.Retriever.ValueType, ...]:
    """The re-search's retrievers, each once, in the order given; unknown ones,
    an unknown fusion method and a bad filter are INVALID_ARGUMENT (the filters
    are checked as the index services check them, so a bad one fails the call
    instead of every re-search)."""
    for i, r in enumerate(options.retrievers):
        if r not in common_pb2.Retriever.values() or r == common_pb2.RETRIEVER_UNSPECIFIED:
            raise InvalidArgument(
                f"unknown or unspecified retriever {r}", field=f"research.retrievers[{i}]"
            )
    if options.fusion not in common_pb2.FusionMethod.values():
        raise InvalidArgument(f"unknown fusion method {options.fusion}", field="research.fusion")
    limits = RequestLimits()
    try:
        filters_from_proto(
            options.filters, max_filters=limits.max_filters, max_values=limits.max_filter_values
        )
    except InvalidArgument as exc:
        raise InvalidArgument(exc.message, field=f"research.{exc.field}") from None
    return tuple(dict.fromkeys(options.retrievers)) or DEFAULT_RESEARCH_RETRIEVERS


class _StubSearcher:
    """The fan-out's searches over this service's stubs: each call capped by the
    request's deadline, failures translated (a dependency's: the retriever is
    skipped). A service without an address, and the knowledge service (the
    re-search has none), are unavailable."""

    def __init__(self, lexical: Any, semantic: Any) -> None:
        self._lexical = lexical
        self._semantic = semantic

    @staticmethod
    async def _call(service: str, stub: Any, request: Any, seconds: float) -> Any:
        if stub is None:
            raise Unavailable(f"no {service} service is configured for re-search")
        try:
            return await stub.Search(request, timeout=budget(seconds))
        except grpc.aio.AioRpcError as exc:
            raise from_rpc(exc, service=service, dependency=True) from None

    async def lexical_search(
        self, request: lexical_pb2.SearchRequest, seconds: float
    ) -> lexical_pb2.SearchResponse:
        response: lexical_pb2.SearchResponse = await self._call(
            "lexical", self._lexical, request, seconds
        )
        return response

    async def semantic_search(
        self, request: semantic_pb2.SearchRequest, seconds: float
    ) -> semantic_pb2.SearchResponse:
        response: semantic_pb2.SearchResponse = await self._call(
            "semantic", self._semantic, request, seconds
        )
        return response

    async def knowledge_search(
        self, request: knowledge_pb2.SearchRequest, seconds: float
    ) -> knowledge_pb2.SearchResponse:
        raise Unavailable("re-search has no knowledge service")


class Researcher:
    """Searches a sentence again through the lexical and semantic services, with
    the answer's retrievers and fusion (``attest.retrieval.fanout`` at passage level)."""

    def __init__(self, settings: GenerateSettings) -> None:
        self._settings = settings
        self._channels: list[grpc.aio.Channel] = []
        self._lexical: Any = None
        self._semantic: Any = None

    @property
    def enabled(self) -> bool:
        return bool(
            self._settings.research.lexical_address or self._settings.research.semantic_address
        )

    def _open(self) -> None:
        from attest.lexical.v1 import lexical_pb2_grpc
        from attest.semantic.v1 import semantic_pb2_grpc

        r = self._settings.research
        if r.lexical_address and self._lexical is None:
            channel = create_channel(r.lexical_address)
            self._channels.append(channel)
            self._lexical = lexical_pb2_grpc.LexicalServiceStub(channel)
        if r.semantic_address and self._semantic is None:
            channel = create_channel(r.semantic_address)
            self._channels.append(channel)
            self._semantic = semantic_pb2_grpc.SemanticServiceStub(channel)

    def search_fn(
        self, options: common_pb2.RetrievalOptions, vectors: TextVectors | None = None
    ) -> SearchFn:
        """The re-search of one answer: the options' retrievers (at passage
        level) fused with the options' fusion method. A query whose vector the
        answer's ``vectors`` hold (the support judge embedded the sentence) goes
        to the semantic service with that vector, which then does not embed it
        again; pass ``vectors`` only when that service embeds with the same model."""
        self._open()
        fusion = fusion_of(options.fusion, self._settings.research.fusion())
        # The knowledge retriever cannot run here (no address for it). One the
        # fusion gives no weight changes what the search finds only when no
        # weighted one finds anything (``fuse_with``), so it runs only then
        # (the answer's own search still runs it: its KG scores explain the
        # sources).
        asked = research_retrievers(options)
        runnable = tuple(r for r in asked if r != common_pb2.RETRIEVER_KNOWLEDGE) or asked
        weighted = tuple(r for r in runnable if fusion.weight(RETRIEVER_NAMES[r]) > 0) or runnable
        spare = tuple(r for r in runnable if r not in weighted)
        filters = tuple(options.filters)
        per = options.top_k_per_retriever or 20
        limits = Limits(self._settings.research.timeout_seconds)
        searcher = _StubSearcher(self._lexical, self._semantic)

        async def search(query: str, top_k: int) -> Found:
            found = vectors.get(query) if vectors is not None else None

            async def vector() -> semantic_pb2.Vector | None:
                return None if found is None else semantic_pb2.Vector(values=found.tolist())

            async def run(retrievers: tuple[Retriever, ...]) -> Retrieval:
                retrieval = await retrieve(
                    searcher,
                    Query(
                        text=query,
                        retrievers=retrievers,
                        filters=filters,
                        top_k=per,
                        level=Level.PASSAGE,
                    ),
                    limits,
                    vector,
                )
                for failure in retrieval.failures:
                    log.warning("re-search without %s: %s", failure.service, failure.reason)
                return retrieval

            retrieval = await run(weighted)
            skipped = [f.reason for f in retrieval.failures]
            if spare and not any(r.items for r in retrieval.lists):
                # Nothing weighted found anything: the others stand in, as
                # fusion would let them had they run alongside.
                fallback = await run(spare)
                if fallback.lists:
                    retrieval = fallback
                    skipped += [f.reason for f in fallback.failures]
            if not retrieval.lists:
                # The revision is skipped (the generator keeps the answer without it).
                raise Unavailable(
                    "no retriever could run: " + "; ".join(f.reason for f in retrieval.failures)
                )
            out = []
            for key, _ in retrieval.fuse(fusion, top_k):
                doc_id, index = cast(tuple[str, int], key)
                hit = retrieval.hits[key]
                text = hit.text_of(index)
                if text.strip():
                    out.append(
                        Source(
                            doc_id=doc_id,
                            passage_index=index,
                            title=hit.title,
                            text=text,
                            source_url=hit.source_url,
                            keywords=hit.keywords,
                            page=hit.page_of(index),
                        )
                    )
            return Found(out, tuple(skipped))

        return search

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()


# -- warm-up -----------------------------------------------------------------------------------

# An answer the extractive engine finds and cites: warming up with it runs every
# step an answer runs (summaries, the answer's ranking and its facts, citations
# and the judge) once before SERVING.
WARM_UP_QUESTION = "Who is the new chair of the Harbour Trust?"
WARM_UP_SOURCES = (
    Source(
        doc_id="warm-up-1",
        passage_index=0,
        title="Harbour Trust names a new chair",
        text=(
            "LONDON, March 3, 2025 — The Harbour Trust named Ada Byron as its new chair on "
            "Monday. She replaces Charles Babbage, who led the board for ten years. The trust "
            "manages the port's land and its wharves. Its annual report is due in June."
        ),
    ),
    Source(
        doc_id="warm-up-2",
        passage_index=0,
        title="Harbour Trust cuts emissions",
        text=(
            "The Harbour Trust said its scope 1 emissions fell 12% in 2024. Most of the cut "
            "came from electric cranes at the container terminal. The trust aims for net zero "
            "by 2035."
        ),
    ),
)


async def warm_answer(generator: Generator) -> FinalEvent:
    """One extractive answer, without re-search, through ``generator``: what the
    first answer loads on first use (a stemmer's imports, the judge's first
    pass, ...) is loaded now. A failure says it happened while warming up."""
    final: FinalEvent | None = None
    try:
        async for event in generator.answer(
            WARM_UP_QUESTION,
            WARM_UP_SOURCES,
            AnswerOptions(mode=Mode.EXTRACTIVE, max_researches=0, max_sentences=2),
        ):
            if isinstance(event, FinalEvent):
                final = event
    except Exception as exc:
        raise RuntimeError(f"the warm-up answer failed ({type(exc).__name__}: {exc})") from exc
    if final is None:
        raise RuntimeError("the warm-up answer ended without its final event")
    return final


# -- the servicer ------------------------------------------------------------------------------


class GenerateServicer(generate_pb2_grpc.GenerateServiceServicer):
    service_name = generate_pb2.DESCRIPTOR.services_by_name["GenerateService"].full_name

    def __init__(
        self,
        settings: GenerateSettings,
        generator: Generator | None = None,
        search: SearchFn | None = None,
    ) -> None:
        self.settings = settings
        self._limits = settings.limits
        self.generator = generator if generator is not None else build_generator(settings)
        self._search = search
        self._researcher = Researcher(settings)

    def register(self, server: grpc.aio.Server) -> None:
        generate_pb2_grpc.add_GenerateServiceServicer_to_server(self, server)

    async def warm_up(self) -> None:
        await asyncio.to_thread(self.generator.extractive.warm_up)
        await warm_answer(self.generator)

    async def close(self) -> None:
        await self.generator.close()
        await self._researcher.close()

    async def Summarize(
        self, request: generate_pb2.SummarizeRequest, context: Context
    ) -> generate_pb2.SummarizeResponse:
        sources = sources_from_proto(request.sources, self._limits)
        _text(request.query, "query", self._limits.max_question_chars, required=False)
        _range(request.max_sentences, 0, 20, "max_sentences")
        summaries, mode, reason, calls = await self.generator.summarize(
            sources, request.query, request.max_sentences or 3, _mode(request.mode)
        )
        return generate_pb2.SummarizeResponse(
            summaries=[
                generate_pb2.SourceSummary(source_index=i, summary=s)
                for i, s in enumerate(summaries)
            ],
            mode=_MODE_OUT[mode],
            degraded_reason=reason,
            llm_calls=calls,
        )

    async def Cite(
        self, request: generate_pb2.CiteRequest, context: Context
    ) -> generate_pb2.CiteResponse:
        sentences = _sentences(request.sentences, self._limits)
        sources = sources_from_proto(request.sources, self._limits, require_text=False)
        _text(request.question, "question", self._limits.max_question_chars, required=False)
        _range(request.max_citations, 0, 10, "max_citations")
        result = await self.generator.cite(
            sentences, sources, request.question, request.max_citations or 3, _mode(request.mode)
        )
        return generate_pb2.CiteResponse(
            sentences=[sentence_to_proto(s) for s in result.sentences],
            discarded_citations=result.discarded,
            mode=_MODE_OUT[result.mode],
            degraded_reason=result.degraded_reason,
            llm_calls=result.llm_calls,
        )

    async def Judge(
        self, request: generate_pb2.JudgeRequest, context: Context
    ) -> generate_pb2.JudgeResponse:
        sentences = _sentences(request.sentences, self._limits)
        sources = sources_from_proto(request.sources, self._limits, require_text=False)
        if request.pairs:
            if len(request.pairs) > self._limits.max_pairs:
                raise InvalidArgument(f"at most {self._limits.max_pairs} pairs", field="pairs")
            pairs = []
            for k, p in enumerate(request.pairs):
                _range(p.sentence_index, 0, len(sentences) - 1, f"pairs[{k}].sentence_index")
                _range(p.source_index, 0, len(sources) - 1, f"pairs[{k}].source_index")
                pairs.append((p.sentence_index, p.source_index))
        else:
            if len(sentences) * len(sources) > self._limits.max_pairs:
                raise InvalidArgument(
                    f"{len(sentences)} sentences × {len(sources)} sources exceed "
                    f"{self._limits.max_pairs} pairs; list the pairs",
                    field="pairs",
                )
            pairs = [(i, j) for i in range(len(sentences)) for j in range(len(sources))]
        judgements, mode, reason, calls = await self.generator.judge(
            sentences, sources, pairs, _mode(request.mode)
        )
        return generate_pb2.JudgeResponse(
            judgements=[
                generate_pb2.Judgement(
                    sentence_index=j.sentence_index,
                    source_index=j.source_index,
                    confidence=j.confidence,
                    quote=j.quote,
                    rejected_reason=j.rejected_reason,
                )
                for j in judgements
            ],
            mode=_MODE_OUT[mode],
            degraded_reason=reason,
            llm_calls=calls,
        )

    async def Answer(
        self, request: generate_pb2.AnswerRequest, context: Context
    ) -> AsyncIterator[generate_pb2.AnswerResponse]:
        question = _text(request.question, "question", self._limits.max_question_chars)
        sources = sources_from_proto(request.sources, self._limits)
        threshold = request.confidence_threshold if request.HasField("confidence_threshold") else 5
        _range(threshold, 0, 10, "confidence_threshold")
        researches = request.max_researches if request.HasField("max_researches") else 3
        _range(researches, 0, 20, "max_researches")
        _range(request.research_top_k, 0, 20, "research_top_k")
        _range(request.max_sentences, 0, 50, "max_sentences")
        research_retrievers(request.research)
        # Vectors from the caller's model are this service's own only when the
        # names agree (SemanticService.Embed and this embedder name models alike).
        same_model = bool(request.embedding_model) and (
            request.embedding_model == self.generator.extractive.embedder.name
        )
        question_vector = (
            list(request.question_vector.values)
            if same_model and request.question_vector.values
            else None
        )
        vectors = self.generator.extractive.vectors()
        options = AnswerOptions(
            confidence_threshold=threshold,
            max_researches=researches,
            research_top_k=request.research_top_k or 3,
            max_sentences=request.max_sentences or 10,
            mode=_mode(request.mode),
            question_vector=question_vector,
            vectors=vectors,
        )
        search = self._search
        # A request whose only retriever is knowledge has nothing to re-search
        # with here (no knowledge address): its weak sentences keep their low
        # confidence, which says so, without a re-search that would only fail.
        searchable = any(
            r != common_pb2.RETRIEVER_KNOWLEDGE for r in research_retrievers(request.research)
        )
        if search is None and self._researcher.enabled and searchable:
            # The semantic service embeds like this one (same model): a searched
            # sentence goes with the vector the answer already has.
            search = self._researcher.search_fn(request.research, vectors if same_model else None)
        async for event in self.generator.answer(question, sources, options, search):
            yield event_to_proto(event)
