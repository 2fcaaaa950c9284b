"""The answer pipeline, written once for both modes.

summarize every source (concurrently) → answer from the summaries → split
into sentences → cite each sentence with a 0-10 confidence (batched) →
re-search sentences below the threshold, summarize what the search found,
re-cite and emit a revision → final event with timings and LLM call counts.

The LLM mode and the extractive mode differ only in the ``_Engine`` behind
each step. Guarantees live here, not in the engines: every proposal is
validated against the sources actually given (unknown source, confidence
outside 0-10 or not an integer, unreadable output → discarded and counted),
and every sentence leaves with citations or marked unsupported.

LLM calls per answer are bounded: N summaries + 1 answer + ⌈S / batch⌉
citation calls + R × (K + 1) for R re-searches of K sources each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import Field

from attest.core.errors import AttestError, InvalidArgument, Unavailable
from attest.core.settings import StrictModel
from attest.generate import numeric, prompts
from attest.generate.extractive import ExtractiveEngine
from attest.generate.judge import combine, grounded, to_confidence
from attest.generate.llm import JsonSchema, LLMClient
from attest.generate.measures import asked_measure
from attest.generate.models import (
    INSUFFICIENT,
    Citation,
    DraftEvent,
    Event,
    FinalEvent,
    Judgement,
    Mode,
    Proposal,
    RevisionEvent,
    Sentence,
    SentenceEvent,
    Source,
    Step,
    StepTiming,
    SummaryEvent,
)
from attest.generate.text import answer_type, asked_phrase, split_sentences
from attest.generate.vectors import TextVectors

log = logging.getLogger(__name__)

# Re-search: (query, top_k) → sources found, best first. A search made for one
# answer may read the query's vector from that answer's ``AnswerOptions.vectors``
# (the support judge embedded the sentence) instead of having it embedded again.
SearchFn = Callable[[str, int], Awaitable["Sequence[Source] | Found"]]


@dataclass(frozen=True, slots=True)
class Found:
    """What a re-search found, and why each retriever it ran without did not
    answer, which the answer reports; a plain sequence of sources is a search
    that lost none."""

    sources: Sequence[Source]
    skipped: tuple[str, ...] = ()


class PipelineSettings(StrictModel):
    confidence_threshold: int = Field(
        default=5,
        description="Sentences whose best citation is rated below this (0-10) are searched again.",
    )
    max_researches: int = Field(
        default=3,
        description="Re-searches per answer.",
    )
    research_top_k: int = Field(
        default=3,
        description="Hits each re-search brings.",
    )
    max_sentences: int = Field(
        default=10,
        description="Sentences in one answer, at most.",
    )
    max_citations: int = Field(
        default=3,
        description="Citations kept per sentence.",
    )
    summary_sentences: int = Field(
        default=3,
        description="Sentences in a source's summary.",
    )
    # LLM mode: a source no longer than ``summary_sentences`` is its own summary
    # (a model call could only paraphrase it); True asks the model anyway.
    summarize_short_sources: bool = Field(
        default=False,
        description="LLM mode: summarize a source no longer than summary_sentences too (otherwise "
        "it is its own summary).",
    )
    cite_batch_size: int = Field(
        default=8,
        description="LLM mode: sentences rated in one citation call.",
    )
    fallback_to_extractive: bool = Field(
        default=True,
        description="When the LLM is unavailable, answer extractively and say so (a degradation) "
        "instead of failing.",
    )
    # LLM mode: "combine" rates each citation by the model and the support
    # judge together (``judge.combine``); "model" keeps the model's rating.
    llm_citation_rating: Literal["combine", "model"] = Field(
        default="combine",
        description="LLM mode: combine rates each citation by the model and the support judge "
        "together; model keeps the model's rating.",
    )
    # Citations below this confidence are not kept (in both modes).
    min_citation_confidence: int = Field(
        default=5,
        ge=1,
        le=10,
        description="Citations below this confidence are not kept (both modes).",
    )
    # A citation that a re-search adds must reach this confidence (never below
    # ``min_citation_confidence``). The search looked for the sentence's own
    # words, so what it finds resembles the sentence more than an arbitrary
    # source does and the judge's rating of it leans high: a found source that
    # only just clears the floor is as likely a near miss as a support.
    research_min_confidence: int = Field(
        default=6,
        ge=1,
        le=10,
        description="Least confidence of a citation a re-search adds (never below "
        "min_citation_confidence).",
    )
    # Two ratings further apart than this disagree; the lower one is kept.
    disagreement_margin: int = Field(
        default=3,
        ge=0,
        le=10,
        description="Two ratings further apart than this disagree, and the lower one is kept.",
    )
    # A sentence no source supports, even after its search, is withdrawn from
    # the answer (a removed revision) instead of being kept marked unsupported.
    withdraw_unsupported: bool = Field(
        default=True,
        description="Withdraw a sentence no source supports, even after its search, instead of "
        "keeping it marked unsupported.",
    )
    # LLM mode: a summary or answer sentence that repeats the prompt (its
    # instructions or source delimiters) is dropped (``prompts.echoes_prompt``).
    drop_prompt_echoes: bool = Field(
        default=True,
        description="LLM mode: drop a summary or answer sentence that repeats the prompt's "
        "instructions or delimiters.",
    )
    # A question that asks for a financial metric or line item of a company
    # for a fiscal year is answered from the table rows of that company's
    # sources, its arithmetic written out and each operand's row cited
    # (``attest.generate.numeric``), in both modes.
    numeric_answers: bool = Field(
        default=True,
        description="Answer a question for a company's financial metric of a fiscal year from its "
        "table rows, with the arithmetic written out and each operand cited.",
    )
    # The confidence of each operand's citation: the row states the operand
    # word for word; the arithmetic is the engine's, not the source's.
    numeric_confidence: int = Field(
        default=8,
        ge=0,
        le=10,
        description="Confidence of each operand's citation in a calculated answer.",
    )
    # ... and when an operand came from a table that is not the statement that
    # states it, or the operands' scales could not all be read: below 5, a
    # figure the reader should check before relying on it.
    numeric_unsure_confidence: int = Field(
        default=4,
        ge=0,
        le=10,
        description="The same when an operand came from another table than the statement, or a "
        "scale could not be read.",
    )


@dataclass(slots=True)
class AnswerOptions:
    confidence_threshold: int = 5
    max_researches: int = 3
    research_top_k: int = 3
    max_sentences: int = 10
    mode: Mode | None = None
    # The question's embedding when the caller has one with the generator's
    # model (the answer service's, for retrieval): the answer does not embed it.
    question_vector: Sequence[float] | None = None
    # The answer's embeddings (``TextVectors``), when the caller wants to read
    # them too (its re-search does); by default the answer keeps its own.
    vectors: TextVectors | None = None


@dataclass(slots=True)
class _Run:
    """Mutable state of one call: the engine in use, counters and timings."""

    mode: Mode
    degraded_reason: str = ""
    llm_calls: int = 0
    discarded: int = 0
    disagreements: int = 0
    # Why each failed re-search failed, in order; the retrievers the others ran
    # without, and why.
    research_failures: list[str] = field(default_factory=list)
    research_skipped: list[str] = field(default_factory=list)
    seconds: dict[Step, float] = field(default_factory=dict)
    calls: dict[Step, int] = field(default_factory=dict)

    def timings(self) -> tuple[StepTiming, ...]:
        return tuple(
            StepTiming(step, self.seconds[step], self.calls.get(step, 0))
            for step in Step
            if step in self.seconds
        )


class _Timer:
    def __init__(self, run: _Run, step: Step) -> None:
        self.run, self.step = run, step

    def __enter__(self) -> None:
        self.start = time.perf_counter()
        self.calls_before = self.run.llm_calls

    def __exit__(self, *exc: object) -> None:
        r = self.run
        r.seconds[self.step] = r.seconds.get(self.step, 0.0) + time.perf_counter() - self.start
        r.calls[self.step] = r.calls.get(self.step, 0) + r.llm_calls - self.calls_before


@dataclass(frozen=True, slots=True)
class CiteResult:
    sentences: tuple[Sentence, ...]
    discarded: int
    mode: Mode
    degraded_reason: str
    llm_calls: int


class Generator:
    """Summarize, answer, cite and judge, with an LLM or extractively."""

    def __init__(
        self,
        extractive: ExtractiveEngine,
        llm: LLMClient | None = None,
        settings: PipelineSettings | None = None,
    ) -> None:
        self.extractive = extractive
        self.llm = llm
        self.settings = settings or PipelineSettings()

    @property
    def default_mode(self) -> Mode:
        return Mode.LLM if self.llm is not None else Mode.EXTRACTIVE

    def _start(self, mode: Mode | None) -> _Run:
        mode = mode or self.default_mode
        if mode is Mode.LLM and self.llm is None:
            return _Run(Mode.EXTRACTIVE, degraded_reason="no LLM is configured")
        return _Run(mode)

    async def close(self) -> None:
        if self.llm is not None:
            await self.llm.close()

    # -- one LLM call, with the switch to extractive mode when the LLM is down --------

    async def _llm(
        self,
        run: _Run,
        system: str,
        user: str,
        *,
        schema: JsonSchema | None = None,
        max_tokens: int | None = None,
    ) -> str:
        assert self.llm is not None
        run.llm_calls += 1
        return await self.llm.generate(system, user, schema=schema, max_tokens=max_tokens)

    def _degrade(self, run: _Run, exc: Unavailable) -> None:
        if not self.settings.fallback_to_extractive:
            raise exc
        log.warning("LLM unavailable, answering extractively: %s", exc.message)
        run.mode = Mode.EXTRACTIVE
        run.degraded_reason = f"LLM unavailable: {exc.message}"

    # -- summarize ------------------------------------------------------------------

    async def _summarize_one(
        self, run: _Run, source: Source, query: str, n: int, vectors: TextVectors
    ) -> str:
        if source.summary:
            return source.summary
        if (
            run.mode is Mode.LLM
            and not self.settings.summarize_short_sources
            and len(split_sentences(source.text)) <= n
        ):
            return source.text.strip()
        if run.mode is Mode.LLM:
            try:
                text = await self._llm(
                    run,
                    prompts.SYSTEM,
                    prompts.summarize_prompt(source.text, source.title, query, n),
                )
                if text.strip() and not self._echo(text):
                    return text.strip()
                return await self.extractive.summarize(source, query, n, vectors)
            except Unavailable as exc:
                self._degrade(run, exc)
        return await self.extractive.summarize(source, query, n, vectors)

    async def _summarize_many(
        self, run: _Run, sources: Sequence[Source], query: str, n: int, vectors: TextVectors
    ) -> list[str]:
        return list(
            await asyncio.gather(*(self._summarize_one(run, s, query, n, vectors) for s in sources))
        )

    async def summarize(
        self,
        sources: Sequence[Source],
        query: str = "",
        max_sentences: int = 3,
        mode: Mode | None = None,
    ) -> tuple[list[str], Mode, str, int]:
        run = self._start(mode)
        summaries = await self._summarize_many(
            run, sources, query, max_sentences, self.extractive.vectors()
        )
        return summaries, run.mode, run.degraded_reason, run.llm_calls

    # -- cite -------------------------------------------------------------------------

    async def _cite_llm(
        self, run: _Run, sentences: Sequence[str], evidence: Sequence[str], max_citations: int
    ) -> list[list[Proposal]]:
        """Proposals per sentence, 1-based raw source numbers as the model wrote them."""
        out: list[list[Proposal]] = [[] for _ in sentences]
        batch = self.settings.cite_batch_size

        async def one(start: int) -> None:
            part = sentences[start : start + batch]
            text = await self._llm(
                run,
                prompts.SYSTEM,
                prompts.cite_prompt(part, evidence, max_citations),
                schema=prompts.CITE_SCHEMA,
            )
            proposals = prompts.parse_cite(text)
            if proposals is None:
                run.discarded += 1
                log.warning("unreadable citation output discarded: %.200s", text)
                return
            for p in proposals:
                index = prompts.valid_number(p.sentence, len(part))
                if index is None:
                    run.discarded += 1
                    continue
                out[start + index].append(p)

        await asyncio.gather(*(one(s) for s in range(0, len(sentences), batch)))
        return out

    def _validate(
        self,
        run: _Run,
        proposals: Sequence[Proposal],
        allowed: Sequence[int],
        sources: Sequence[Source],
        *,
        one_based: bool,
        max_citations: int,
        min_confidence: int = 1,
    ) -> tuple[Citation, ...]:
        """Valid citations, best first; everything else is counted as discarded."""
        best: dict[int, Citation] = {}
        for p in proposals:
            local = (
                prompts.valid_number(p.source, len(allowed))
                if one_based
                else (
                    p.source if isinstance(p.source, int) and 0 <= p.source < len(allowed) else None
                )
            )
            confidence = prompts.valid_confidence(p.confidence)
            if local is None or confidence is None:
                run.discarded += 1
                continue
            index = allowed[local]
            source = sources[index]
            quote = p.quote if isinstance(p.quote, str) else ""
            citation = Citation(index, source.doc_id, source.passage_index, confidence, quote[:500])
            if index not in best or best[index].confidence < confidence:
                best[index] = citation
        ranked = sorted(best.values(), key=lambda c: (-c.confidence, c.source_index))
        # A 0 rating says the source does not support the sentence: not a citation.
        return tuple(c for c in ranked if c.confidence >= max(1, min_confidence))[:max_citations]

    async def _cite(
        self,
        run: _Run,
        question: str,
        sentences: Sequence[str],
        sources: Sequence[Source],
        allowed: Sequence[int],
        max_citations: int,
        vectors: TextVectors,
    ) -> list[tuple[Citation, ...]]:
        """Validated citations per sentence, among the sources ``allowed`` (global
        indices). Every source is judged alike, the one a sentence was taken from too."""
        subset = [sources[i] for i in allowed]
        if run.mode is Mode.LLM:
            try:
                raw = await self._cite_llm(
                    run, sentences, [s.evidence for s in subset], max_citations
                )
                cited = [
                    self._validate(
                        run, ps, allowed, sources, one_based=True, max_citations=max_citations
                    )
                    for ps in raw
                ]
                if self.settings.llm_citation_rating == "combine":
                    cited = await self._rate_with_judge(
                        run, question, sentences, sources, cited, allowed, max_citations, vectors
                    )
                return cited
            except Unavailable as exc:
                self._degrade(run, exc)
        position = {g: k for k, g in enumerate(allowed)}
        raw = await self.extractive.cite(
            question, sentences, sources, max_citations, allowed, vectors
        )
        return [
            self._validate(
                run,
                [replace(p, source=position[p.source]) for p in ps if p.source in position],
                allowed,
                sources,
                one_based=False,
                max_citations=max_citations,
                min_confidence=self.settings.min_citation_confidence,
            )
            for ps in raw
        ]

    async def _rate_with_judge(
        self,
        run: _Run,
        question: str,
        sentences: Sequence[str],
        sources: Sequence[Source],
        cited: list[tuple[Citation, ...]],
        allowed: Sequence[int],
        max_citations: int,
        vectors: TextVectors,
    ) -> list[tuple[Citation, ...]]:
        """The model's citations re-rated with the support judge (``combine``),
        and the judge's own among the ``allowed`` sources.

        A source the model cites is rated by both: a citation the judge cannot
        confirm falls below the floor and is dropped, and each disagreement is
        counted. A source the model leaves out is not one it denied (it is
        asked for the few that explain a sentence best), so the judge's rating
        alone decides whether it is cited too: the judge measures support, the
        model may lower a rating but is never the only gate."""
        # Judged against every source: how many of them agree is part of the rating.
        support = await self.extractive.judged(
            question, sentences, [s.text for s in sources], vectors
        )
        margin = self.settings.disagreement_margin
        floor = self.settings.min_citation_confidence
        out: list[tuple[Citation, ...]] = []
        for i, citations in enumerate(cited):
            rated: dict[int, Citation] = {}
            for c in citations:
                judged = to_confidence(float(support[i, c.source_index]))
                if abs(judged - c.confidence) > margin:
                    run.disagreements += 1
                confidence = combine(c.confidence, judged, margin)
                if confidence >= floor:
                    rated[c.source_index] = replace(c, confidence=confidence)
            named = {c.source_index for c in citations}
            for j in allowed:
                judged = to_confidence(float(support[i, j]))
                if j not in named and judged >= floor:
                    source = sources[j]
                    rated[j] = Citation(j, source.doc_id, source.passage_index, judged)
            best = sorted(rated.values(), key=lambda c: (-c.confidence, c.source_index))
            out.append(tuple(best[:max_citations]))
        return out

    async def cite(
        self,
        sentences: Sequence[str],
        sources: Sequence[Source],
        question: str = "",
        max_citations: int = 3,
        mode: Mode | None = None,
    ) -> CiteResult:
        run = self._start(mode)
        cited = await self._cite(
            run,
            question,
            sentences,
            sources,
            list(range(len(sources))),
            max_citations,
            self.extractive.vectors(),
        )
        out = tuple(
            Sentence(i, s, c) for i, (s, c) in enumerate(zip(sentences, cited, strict=True))
        )
        return CiteResult(out, run.discarded, run.mode, run.degraded_reason, run.llm_calls)

    # -- judge --------------------------------------------------------------------------

    async def judge(
        self,
        sentences: Sequence[str],
        sources: Sequence[Source],
        pairs: Sequence[tuple[int, int]],
        mode: Mode | None = None,
    ) -> tuple[list[Judgement], Mode, str, int]:
        run = self._start(mode)
        if run.mode is Mode.LLM:
            try:
                return await self._judge_llm(run, sentences, sources, pairs)
            except Unavailable as exc:
                self._degrade(run, exc)
        support = await self.extractive.judged("", sentences, [s.evidence for s in sources])
        out = [Judgement(i, j, to_confidence(float(support[i, j]))) for i, j in pairs]
        return out, run.mode, run.degraded_reason, run.llm_calls

    async def _judge_llm(
        self,
        run: _Run,
        sentences: Sequence[str],
        sources: Sequence[Source],
        pairs: Sequence[tuple[int, int]],
    ) -> tuple[list[Judgement], Mode, str, int]:
        batch = self.settings.cite_batch_size
        results: list[Judgement] = []

        async def one(start: int) -> list[Judgement]:
            part = pairs[start : start + batch]
            text = await self._llm(
                run,
                prompts.SYSTEM,
                prompts.judge_prompt([(sentences[i], sources[j].evidence) for i, j in part]),
                schema=prompts.JUDGE_SCHEMA,
            )
            ratings = prompts.parse_judge(text)
            got: dict[int, Judgement] = {}
            for r in ratings or []:
                k = prompts.valid_number(r.sentence, len(part))
                c = prompts.valid_confidence(r.confidence)
                if k is None or c is None:
                    continue
                i, j = part[k]
                got[k] = Judgement(i, j, c, r.quote if isinstance(r.quote, str) else "")
            reason = "unreadable output" if ratings is None else "no valid rating"
            return [
                got.get(k) or Judgement(i, j, 0, rejected_reason=reason)
                for k, (i, j) in enumerate(part)
            ]

        for chunk in await asyncio.gather(*(one(s) for s in range(0, len(pairs), batch))):
            results.extend(chunk)
        return results, run.mode, run.degraded_reason, run.llm_calls

    # -- answer -------------------------------------------------------------------------

    async def answer(
        self,
        question: str,
        sources: Sequence[Source],
        options: AnswerOptions | None = None,
        search: SearchFn | None = None,
    ) -> AsyncIterator[Event]:
        """The events of one answer; the last one is always a FinalEvent."""
        opts = options or AnswerOptions()
        if not question.strip():
            raise InvalidArgument("must not be empty", field="question")
        if not sources:
            raise InvalidArgument("must contain at least one source", field="sources")
        began = time.perf_counter()
        run = self._start(opts.mode)
        sources = list(sources)
        # Every step of this answer reads its embeddings from here, so each
        # text (the question, a source's sentence, an answer sentence) is
        # embedded once, and the question not at all when the caller has it.
        vectors = self.extractive.vectors(opts.vectors)
        if opts.question_vector is not None:
            vectors.put(question, opts.question_vector)

        # 1. Summaries, emitted in source order once all are done (they run concurrently).
        with _Timer(run, Step.SUMMARIZE):
            if run.mode is Mode.EXTRACTIVE:
                await self.extractive.prepare(question, sources, vectors)
            summaries = await self._summarize_many(
                run, sources, question, self.settings.summary_sentences, vectors
            )
        for i, summary in enumerate(summaries):
            sources[i] = replace(sources[i], summary=summary)
            yield SummaryEvent(i, summary)

        # 2. The answer, as sentences. A model's sentences are shown as drafts
        # while it writes; each is replaced by its cited sentence below. A
        # figure computed from the sources' table rows is the whole answer.
        texts: list[str] = []
        insufficient = False
        computed = numeric.compute(question, sources) if self.settings.numeric_answers else None
        with _Timer(run, Step.ANSWER):
            if isinstance(computed, numeric.Computed):
                texts = [computed.text]
            elif run.mode is Mode.LLM:
                try:
                    async with aclosing(
                        self._written_sentences(run, question, sources, opts.max_sentences)
                    ) as written:
                        async for text in written:
                            if not prompts.is_insufficient(text):
                                yield DraftEvent(len(texts), text)
                            texts.append(text)
                    insufficient = not texts or prompts.is_insufficient(" ".join(texts))
                except Unavailable as exc:
                    self._degrade(run, exc)
                    texts = []
            if run.mode is Mode.EXTRACTIVE and not isinstance(computed, numeric.Computed):
                picked = await self.extractive.answer(
                    question, sources, opts.max_sentences, vectors
                )
                texts = [c.text for c in picked]
                insufficient = not picked
        missing = computed.text if isinstance(computed, numeric.Missing) else ""

        sentences: list[Sentence] = []
        if isinstance(computed, numeric.Computed):
            sentence = Sentence(0, computed.text, self._numeric_citations(computed, sources))
            sentences.append(sentence)
            yield SentenceEvent(sentence)
        elif insufficient:
            sentence = Sentence(0, insufficient_text(question, missing=missing))
            sentences.append(sentence)
            yield SentenceEvent(sentence)
        else:
            # 3. Citations, in batches; each sentence is emitted once verified.
            with _Timer(run, Step.CITE):
                cited = await self._cite(
                    run,
                    question,
                    texts,
                    sources,
                    list(range(len(sources))),
                    self.settings.max_citations,
                    vectors,
                )
            for i, (text, citations) in enumerate(zip(texts, cited, strict=True)):
                sentence = Sentence(i, text, citations)
                sentences.append(sentence)
                yield SentenceEvent(sentence)

        # 4. Re-search the weakest sentences below the threshold.
        researches = 0
        if (
            search is not None
            and not insufficient
            and opts.confidence_threshold > 0
            and not isinstance(computed, numeric.Computed)
        ):
            weak = sorted(
                (s for s in sentences if s.confidence < opts.confidence_threshold),
                key=lambda s: (s.confidence, s.index),
            )[: opts.max_researches]
            for sentence in sorted(weak, key=lambda s: s.index):
                with _Timer(run, Step.RESEARCH):
                    revision = await self._research(
                        run, question, sentence, sources, opts.research_top_k, search, vectors
                    )
                if revision is None:
                    continue
                researches += 1
                sentences[sentence.index] = revision.sentence
                yield revision

        # 5. A sentence no source supports, even after its search, is withdrawn:
        # nothing stays in the answer only because it resembles the question.
        removed = 0
        # A computed figure cites the rows of the company the question names:
        # it is about what the question names by construction.
        if (
            not insufficient
            and self.settings.withdraw_unsupported
            and not isinstance(computed, numeric.Computed)
        ):
            # An answer none of whose sentences or cited sources mentions what
            # the question names is about something else, however well cited.
            pairs = [(s.text, sources[c.source_index].text) for s in sentences for c in s.citations]
            about = not pairs or grounded(question, pairs)
            kept: list[Sentence] = []
            for sentence in sentences:
                if about and not sentence.unsupported:
                    kept.append(sentence)
                    continue
                removed += 1
                yield RevisionEvent(
                    sentence=Sentence(sentence.index, sentence.text),
                    previous_confidence=sentence.confidence,
                    query="",
                    added_sources=(),
                    first_added_source_index=len(sources),
                    removed=True,
                )
            if not kept:
                # 6. Nothing left: say so, and what is missing (a fresh index:
                # the withdrawn sentences keep theirs).
                insufficient = True
                fresh = max((s.index for s in sentences), default=-1) + 1
                sentence = Sentence(fresh, insufficient_text(question, about, missing=missing))
                kept.append(sentence)
                yield SentenceEvent(sentence)
            sentences = kept

        unsupported = sum(1 for s in sentences if s.unsupported)
        yield FinalEvent(
            answer=" ".join(s.text for s in sentences),
            sentences=tuple(sentences),
            insufficient_information=insufficient,
            researches=researches,
            unsupported_sentences=unsupported,
            discarded_citations=run.discarded,
            timings=run.timings(),
            total_seconds=time.perf_counter() - began,
            llm_calls=run.llm_calls,
            mode=run.mode,
            degraded_reason=run.degraded_reason,
            sources=tuple(sources),
            judge_disagreements=run.disagreements,
            removed_sentences=removed,
            research_degraded_reason=_research_failed(run.research_failures, run.research_skipped),
        )

    def _numeric_citations(
        self, computed: numeric.Computed, sources: Sequence[Source]
    ) -> tuple[Citation, ...]:
        """One citation per source whose rows gave an operand, quoting them."""
        quotes: dict[int, list[str]] = {}
        for row in computed.rows:
            quotes.setdefault(row.source, []).append(row.text)
        return tuple(
            Citation(
                source_index=i,
                doc_id=sources[i].doc_id,
                passage_index=sources[i].passage_index,
                confidence=(
                    self.settings.numeric_confidence
                    if computed.sure
                    else min(
                        self.settings.numeric_confidence, self.settings.numeric_unsure_confidence
                    )
                ),
                quote=" ".join(texts),
            )
            for i, texts in sorted(quotes.items())
        )

    async def _written_sentences(
        self, run: _Run, question: str, sources: Sequence[Source], max_sentences: int
    ) -> AsyncGenerator[str, None]:
        """The model's answer, one sentence as soon as the next one starts (the
        last when the reply ends), without citation markers; at most
        ``max_sentences``, the stream closed once they are written."""
        assert self.llm is not None
        run.llm_calls += 1
        prompt = prompts.answer_prompt(question, [s.evidence for s in sources], max_sentences)
        written = ""
        done = 0
        kept = 0
        async with aclosing(self.llm.stream(prompts.SYSTEM, prompt)) as pieces:
            async for piece in pieces:
                written += piece
                complete = split_sentences(prompts.clean_answer(written))[:-1]
                for text in complete[done:]:
                    if kept < max_sentences and not self._echo(text):
                        kept += 1
                        yield text
                # Never back: removing a citation marker can merge the last two pieces.
                done = max(done, len(complete))
                if kept >= max_sentences:
                    return
        for text in split_sentences(prompts.clean_answer(written))[done:]:
            if kept < max_sentences and not self._echo(text):
                kept += 1
                yield text

    def _echo(self, text: str) -> bool:
        """Model text that repeats the prompt is neither a summary nor part of
        the answer (a base model continues its prompt): it is dropped."""
        if self.settings.drop_prompt_echoes and prompts.echoes_prompt(text):
            log.warning("dropped a sentence that repeats the prompt: %.120s", text)
            return True
        return False

    async def _research(
        self,
        run: _Run,
        question: str,
        sentence: Sentence,
        sources: list[Source],
        top_k: int,
        search: SearchFn,
        vectors: TextVectors,
    ) -> RevisionEvent | None:
        try:
            result = await search(sentence.text, top_k)
            if isinstance(result, Found):
                if result.skipped:
                    # One entry per re-search, however many of its retrievers
                    # one service took down.
                    run.research_skipped.append("; ".join(dict.fromkeys(result.skipped)))
                result = result.sources
            found = list(result)[:top_k]
        except AttestError as exc:
            # The answer stands without the revision; the failure is logged and
            # reported with the answer.
            log.warning("re-search failed for sentence %d: %s", sentence.index, exc.message)
            run.research_failures.append(exc.message)
            return None
        known = {s.key: i for i, s in enumerate(sources)}
        first_added = len(sources)
        fresh = [s for s in dict((s.key, s) for s in found).values() if s.key not in known]
        if run.mode is Mode.EXTRACTIVE and fresh:
            await self.extractive.prepare(question, fresh, vectors)
        summaries = await self._summarize_many(
            run, fresh, question, self.settings.summary_sentences, vectors
        )
        added = [replace(s, summary=m) for s, m in zip(fresh, summaries, strict=True)]
        sources.extend(added)
        allowed = sorted(
            {known[s.key] for s in found if s.key in known} | set(range(first_added, len(sources)))
        )
        citations: tuple[Citation, ...] = ()
        if allowed:
            (citations,) = await self._cite(
                run,
                question,
                [sentence.text],
                sources,
                allowed,
                self.settings.max_citations,
                vectors,
            )
        # Where ratings have a floor (the judge rates them): a higher one for what
        # the search found. The model's own ratings ("model") stand as given.
        judged = run.mode is Mode.EXTRACTIVE or self.settings.llm_citation_rating == "combine"
        floor = (
            max(self.settings.research_min_confidence, self.settings.min_citation_confidence)
            if judged
            else 0
        )
        merged: dict[int, Citation] = {c.source_index: c for c in sentence.citations}
        for c in citations:
            if c.confidence < floor and c.source_index not in merged:
                continue
            if c.source_index not in merged or merged[c.source_index].confidence < c.confidence:
                merged[c.source_index] = c
        best = sorted(merged.values(), key=lambda c: (-c.confidence, c.source_index))
        revised = Sentence(
            sentence.index, sentence.text, tuple(best[: self.settings.max_citations])
        )
        return RevisionEvent(
            sentence=revised,
            previous_confidence=sentence.confidence,
            query=sentence.text,
            added_sources=tuple(added),
            first_added_source_index=first_added,
        )


_MISSING = {
    "date": "no source states the date asked for",
    "name": "no source names what the question asks for",
    "number": "no source states the amount asked for",
}


def insufficient_text(question: str, about: bool = True, *, missing: str = "") -> str:
    """The answer when no source supports one, saying what is missing: for a
    metric the sources cannot compute, which operand they lack; for "what
    was X?", X ("no source states Apple's revenue in fiscal year 2023");
    for a question about an amount, its measure ("no source gives the number
    of turbines asked for"); else the kind of fact asked for."""
    if missing:
        return f"{INSUFFICIENT}: {missing[0].lower()}{missing[1:]}"
    if not about:
        return f"{INSUFFICIENT}: no source is about what the question names."
    verb, phrase = asked_phrase(question)
    if phrase:
        return f"{INSUFFICIENT}: no source {verb} {phrase}."
    measure = asked_measure(question)
    if measure is not None and (measure.by_form or answer_type(question) == "number"):
        what = "the number of" if measure.counted else "the amount of" if measure.by_form else "the"
        return f"{INSUFFICIENT}: no source gives {what} {measure.phrase} asked for."
    what = _MISSING.get(answer_type(question), "no source states an answer to the question")
    return f"{INSUFFICIENT}: {what}."


def _index(value: object, count: int) -> int | None:
    """A 0-based index below ``count`` (extractive proposals), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < count:
        return value
    return None


def _research_failed(failures: Sequence[str], skipped: Sequence[str]) -> str:
    """How the answer's re-searches were degraded: those that failed (their
    sentences kept as written) and the retrievers the others ran without."""
    parts = []
    if failures:
        n = len(failures)
        what = "re-searches" if n > 1 else "re-search"
        kept = "the sentences kept" if n > 1 else "the sentence kept"
        parts.append(f"{n} {what} failed, {kept} as written: {failures[0]}")
    if skipped:
        parts.append(f"re-searched without a retriever ({len(skipped)}×): {skipped[0]}")
    return "; ".join(parts)
