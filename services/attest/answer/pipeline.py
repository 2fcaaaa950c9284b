"""The answer pipeline, defined once for Ask, AskStream and queued jobs.

retrieve (BM25 ∥ dense ∥ KG path scores ∥ personal knowledge facts, each with
its own timeout: ``attest.retrieval.fanout`` at document level) → fuse
(the request's method) → rerank documents and their passages → generate
(summaries, answer, a 0-10 confidence per citation, re-search of weak
sentences through the same fan-out, retrievers and fusion method, at passage
level) → final answer with per-stage timings.

A retriever, the reranker or the LLM that fails is skipped and named in the
answer's degradations; when every requested retriever fails the request is
UNAVAILABLE. The events are the public stream messages, in order: retrieval
done, sentences, revisions, final. The pipeline talks to its dependencies
only through ``Backends`` and never imports grpc.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from google.protobuf.duration_pb2 import Duration
from prometheus_client import Counter, Histogram

from attest.answer.options import Plan
from attest.answer.settings import AnswerSettings
from attest.answer.v1 import answer_pb2
from attest.common.v1 import common_pb2
from attest.core.common import DOC_FILTER
from attest.core.document import keywords_to_message
from attest.core.errors import DeadlineExceeded, InvalidArgument, Unavailable
from attest.generate import numeric
from attest.generate.models import Source as GenSource
from attest.generate.v1 import generate_pb2
from attest.rerank.v1 import rerank_pb2

# The knowledge helpers moved to the fan-out; these two are re-exported for
# the benchmarks that import them from here.
from attest.retrieval.fanout import FACT_PASSAGE_LOOKUP_TOP_K as FACT_PASSAGE_LOOKUP_TOP_K
from attest.retrieval.fanout import Hit, Level, Limits, Query, Retrieval, Searcher, retrieve
from attest.retrieval.fanout import fact_passages as fact_passages
from attest.retrieval.fusion import Ranked, fuse_with
from attest.semantic.v1 import semantic_pb2

log = logging.getLogger(__name__)

T = TypeVar("T")
INSUFFICIENT = "insufficient information available"
# The lists a semantic service answered (its stored vectors can then be fetched).
_SEMANTIC_NAMES = frozenset({"dense", "kg", "kg_enhanced"})
# The answer's stage of each retriever. The stages have no knowledge stage of
# their own: its time and its degradation are reported under STAGE_RETRIEVE_KG,
# the reason naming the knowledge service.
_RETRIEVER_STAGES = {
    common_pb2.RETRIEVER_BM25: answer_pb2.STAGE_RETRIEVE_BM25,
    common_pb2.RETRIEVER_DENSE: answer_pb2.STAGE_RETRIEVE_DENSE,
    common_pb2.RETRIEVER_KG: answer_pb2.STAGE_RETRIEVE_KG,
    common_pb2.RETRIEVER_KG_ENHANCED: answer_pb2.STAGE_RETRIEVE_KG,
    common_pb2.RETRIEVER_KNOWLEDGE: answer_pb2.STAGE_RETRIEVE_KG,
}

_GENERATE_STAGES = {
    generate_pb2.STEP_SUMMARIZE: answer_pb2.STAGE_SUMMARIZE,
    generate_pb2.STEP_ANSWER: answer_pb2.STAGE_GENERATE,
    generate_pb2.STEP_CITE: answer_pb2.STAGE_CITE,
    generate_pb2.STEP_RESEARCH: answer_pb2.STAGE_RESEARCH,
}


class Backends(Searcher, Protocol):
    """The services the pipeline calls: the fan-out's searches (``Searcher``)
    and the rest; failures arrive as typed Attest errors."""

    async def explain(
        self, request: semantic_pb2.ExplainRequest, seconds: float
    ) -> semantic_pb2.ExplainResponse: ...

    async def embed(
        self, request: semantic_pb2.EmbedRequest, seconds: float
    ) -> semantic_pb2.EmbedResponse: ...

    async def get_vectors(
        self, request: semantic_pb2.GetVectorsRequest, seconds: float
    ) -> semantic_pb2.GetVectorsResponse: ...

    async def rerank(
        self, request: rerank_pb2.RerankRequest, seconds: float
    ) -> rerank_pb2.RerankResponse: ...

    def generate(
        self, request: generate_pb2.AnswerRequest, seconds: float
    ) -> AsyncIterator[generate_pb2.AnswerResponse]: ...


@dataclass(frozen=True)
class _QuestionVector:
    """The question embedded once by the semantic service, for every call that scores it."""

    vector: semantic_pb2.Vector
    model: str


class _Clock:
    """The request's time budget and the time spent per stage."""

    def __init__(self, budget_seconds: float) -> None:
        self.started = time.perf_counter()
        self.deadline = time.monotonic() + budget_seconds
        self.timings: list[tuple[answer_pb2.Stage.ValueType, float]] = []

    def timeout(self, limit: float, stage: str) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(f"the time budget was spent before {stage}")
        return min(limit, left)

    def record(self, stage: answer_pb2.Stage.ValueType, seconds: float) -> None:
        self.timings.append((stage, seconds))


_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
STAGE_SECONDS = Histogram(
    "attest_answer_stage_seconds",
    "Time an answer spent in each stage (retrieve_bm25, retrieve_dense, retrieve_kg, fuse, "
    "rerank, generate, ...), answers that completed.",
    ["stage"],
    buckets=_SECONDS,
)
ANSWER_SECONDS = Histogram(
    "attest_answer_seconds",
    "Time from admission to the final answer, answers that completed.",
    buckets=_SECONDS,
)
ANSWERS = Counter(
    "attest_answers_total",
    "Answers completed, by outcome: answered, or insufficient (the corpus does not say).",
    ["outcome"],
)
DEGRADATIONS = Counter(
    "attest_answer_degradations_total",
    "Stages that an answer skipped or ran degraded (timeout, service down, shed), by stage.",
    ["stage"],
)


def _stage_label(stage: answer_pb2.Stage.ValueType) -> str:
    return answer_pb2.Stage.Name(stage).removeprefix("STAGE_").lower()


def _record_metrics(
    timings: Sequence[tuple[answer_pb2.Stage.ValueType, float]],
    total_seconds: float,
    degradations: Sequence[answer_pb2.Degradation],
    insufficient: bool,
) -> None:
    for stage, seconds in timings:
        STAGE_SECONDS.labels(_stage_label(stage)).observe(seconds)
    for degradation in degradations:
        DEGRADATIONS.labels(_stage_label(degradation.stage)).inc()
    ANSWER_SECONDS.observe(total_seconds)
    ANSWERS.labels("insufficient" if insufficient else "answered").inc()


def _duration(seconds: float) -> Duration:
    d = Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


class AnswerPipeline:
    """Runs one plan against the backends and yields the public stream events."""

    def __init__(self, backends: Backends, settings: AnswerSettings) -> None:
        settings.fusion()  # a broken fusion settings file fails at start-up, not per request
        self.backends = backends
        self.settings = settings

    async def run(self, plan: Plan) -> AsyncIterator[answer_pb2.AskStreamResponse]:
        clock = _Clock(plan.budget_seconds)
        degradations: list[answer_pb2.Degradation] = []

        candidates, lists, question = await self._retrieve(plan, clock, degradations)
        fuse_start = time.perf_counter()
        fused = fuse_with(lists, plan.fusion, top_k=plan.fused_top_k)
        clock.record(answer_pb2.STAGE_FUSE, time.perf_counter() - fuse_start)
        kept = [candidates[str(key)] for key, _ in fused]
        for (_, score), cand in zip(fused, kept, strict=True):
            cand.fused = score
        kept = [c for c in kept if c.passage_list()]

        # Stored vectors are fetched only from a semantic service that just answered.
        semantic_answered = any(r.name in _SEMANTIC_NAMES for r in lists)
        sources = await self._rerank(
            plan, clock, kept, degradations, question, stored_vectors=semantic_answered
        )
        if self.settings.numeric_search:
            sources += await self._operand_sources(plan, clock, sources, degradations)
        if plan.explain:
            await self._explain(plan, clock, sources, question)
        yield answer_pb2.AskStreamResponse(
            retrieval=answer_pb2.RetrievalDone(
                sources=sources, candidates=len(fused), degradations=degradations
            )
        )

        if not sources:
            sentence = common_pb2.AnswerSentence(index=0, text=INSUFFICIENT, unsupported=True)
            yield answer_pb2.AskStreamResponse(sentence=sentence)
            yield answer_pb2.AskStreamResponse(
                final=self._final(
                    clock,
                    degradations,
                    sources,
                    text=INSUFFICIENT,
                    sentences=[sentence],
                    insufficient=True,
                )
            )
            return

        async for event in self._generate(plan, clock, sources, degradations, question):
            yield event

    # -- retrieval -------------------------------------------------------------------------

    async def _embed_question(self, plan: Plan, clock: _Clock) -> _QuestionVector | None:
        """The question's embedding from the semantic service, or None when it
        cannot give one (each search then embeds the question itself)."""
        try:
            response = await self.backends.embed(
                semantic_pb2.EmbedRequest(texts=[plan.question]),
                clock.timeout(self.settings.timeouts.retrieve, "embedding the question"),
            )
        except (Unavailable, DeadlineExceeded, InvalidArgument) as exc:
            log.warning("question not embedded once; each search embeds it: %s", exc.message)
            return None
        if len(response.vectors) != 1 or not response.vectors[0].values:
            log.warning("the semantic service returned no embedding of the question")
            return None
        return _QuestionVector(response.vectors[0], response.embedding_model)

    async def _retrieve(
        self, plan: Plan, clock: _Clock, degradations: list[answer_pb2.Degradation]
    ) -> tuple[dict[str, Hit], list[Ranked], _QuestionVector | None]:
        # Embedded once, before the searches that score it (BM25 does not wait);
        # dense, KG, Explain and the reranker's fallback all reuse the vector.
        embedding: asyncio.Task[_QuestionVector | None] | None = None
        vector = None
        if plan.semantic_retrievers:
            embedding = asyncio.ensure_future(self._embed_question(plan, clock))
            task = embedding

            async def vector() -> semantic_pb2.Vector | None:
                # Shielded: several searches wait for the one embedding.
                question = await asyncio.shield(task)
                return question.vector if question is not None else None

        retrieval = await retrieve(
            self.backends,
            Query(
                text=plan.question,
                retrievers=plan.retrievers,
                filters=plan.filters,
                top_k=plan.top_k_per_retriever,
                level=Level.DOCUMENT,
                knowledge_top_k=self.settings.knowledge_top_k,
            ),
            # Embedding and searching share the vector retrievers' timeout, so a
            # semantic service that hangs costs no more time than before.
            Limits(self.settings.timeouts.retrieve, clock.deadline),
            vector,
        )
        question = await embedding if embedding is not None else None
        failures: list[str] = []
        for failure in retrieval.failures:
            stage = _RETRIEVER_STAGES[failure.retriever]
            degradations.append(answer_pb2.Degradation(stage=stage, reason=failure.reason))
            failures.append(f"{answer_pb2.Stage.Name(stage)}: {failure.reason}")
            log.warning("retriever skipped: %s", failure.reason)
        for retriever, seconds in retrieval.seconds:
            clock.record(_RETRIEVER_STAGES[retriever], seconds)
        if not retrieval.lists:
            raise Unavailable("no retriever could run: " + "; ".join(failures))
        hits = {str(key): hit for key, hit in retrieval.hits.items()}
        return hits, retrieval.lists, question

    async def _operand_sources(
        self,
        plan: Plan,
        clock: _Clock,
        sources: list[answer_pb2.AnswerSource],
        degradations: list[answer_pb2.Degradation],
    ) -> list[answer_pb2.AnswerSource]:
        """For a question that asks for a financial metric or line item, the
        table rows of what it is computed from (``numeric.operand_queries``):
        each line item searched again with BM25, at passage level, within each
        of the documents already found whose title names the company the
        question names (a ``doc_id`` filter, so how deep a row ranks does not
        depend on how many other documents the store holds; their title is
        part of the query), at most ``numeric_search_documents`` of them, the
        filing of the year asked first. Of each search's passages, those
        that hold a row of its line item (``numeric.holds_line_item``) come
        first: a note or a cash flow row that repeats the label's words
        ("Property, plant and equipment additions") can outrank the balance
        sheet's own row. Added after the reranked sources."""
        searches = numeric.line_item_searches(plan.question)
        if not searches:
            return []
        found = [GenSource(doc_id=s.source.doc_id, text="", title=s.source.title) for s in sources]
        owned = numeric.company_sources(plan.question, found)
        titles = dict.fromkeys(
            (found[i].doc_id, found[i].title or found[i].doc_id) for i in sorted(owned)
        )
        latest = str(max(numeric.asked_years(plan.question), default=""))
        # The filing of the latest year asked first (by its file name or title).
        docs = sorted(titles, key=lambda t: latest not in f"{t[0]} {t[1]}")
        docs = docs[: self.settings.numeric_search_documents]
        if not docs:
            return []
        wanted = {doc_id for doc_id, _ in docs}
        have = {(s.source.doc_id, s.source.passage_index) for s in sources}
        limits = Limits(clock.timeout(self.settings.timeouts.retrieve, "searching line items"))

        async def one(doc_id: str, text: str) -> Retrieval:
            # Within the one document: how deep its row ranks cannot depend on
            # how many other filings the store holds. The document was found
            # under the plan's filters, and each filter restricts a property a
            # passage shares with its document, so this filter alone says all:
            # adding it to the plan's would make one more than the index
            # services allow when the question came with as many as allowed.
            within = common_pb2.Filter(field=DOC_FILTER, any_of=[doc_id])
            return await retrieve(
                self.backends,
                Query(
                    text=text,
                    retrievers=(common_pb2.RETRIEVER_BM25,),
                    filters=(within,),
                    top_k=self.settings.numeric_search_top_k,
                    level=Level.PASSAGE,
                ),
                limits,
            )

        start = time.perf_counter()
        asked = [
            (doc_id, concept, f"{title} {query}")
            for doc_id, title in docs
            for concept, query in searches
        ]
        results = await asyncio.gather(*(one(d, q) for d, _, q in asked))
        clock.record(answer_pb2.STAGE_RETRIEVE_BM25, time.perf_counter() - start)
        out: list[answer_pb2.AnswerSource] = []
        keep = self.settings.numeric_search_keep
        for (_, concept, _), retrieval in zip(asked, results, strict=True):
            for failure in retrieval.failures:
                reason = f"line-item search skipped: {failure.reason}"
                degradations.append(
                    answer_pb2.Degradation(stage=answer_pb2.STAGE_RETRIEVE_BM25, reason=reason)
                )
            passages = [
                (hit, index, text)
                for ranked in retrieval.lists
                for hit in (retrieval.hits[key] for key, _ in ranked.items)
                if hit.doc_id in wanted
                for index, (text, _rank) in hit.passages.items()
            ]
            # Stable: search order within each of the two groups.
            passages.sort(key=lambda f: not numeric.holds_line_item(f[2], concept))
            kept = 0
            for hit, index, text in passages:
                if kept == keep:
                    break
                if (hit.doc_id, index) not in have:
                    have.add((hit.doc_id, index))
                    out.append(self._source(hit, index, text))
                    kept += 1
        return out

    # -- rerank --------------------------------------------------------------------------

    def _source(self, c: Hit, passage_index: int, text: str) -> answer_pb2.AnswerSource:
        source = common_pb2.Source(
            doc_id=c.doc_id,
            passage_index=passage_index,
            title=c.title,
            text=text,
            source_url=c.source_url,
            facts=c.facts.get(passage_index, []),
            page=c.page_of(passage_index),
        )
        if c.published_at is not None:
            source.published_at.CopyFrom(c.published_at)  # type: ignore[arg-type]
        keywords_to_message(c.keywords, source)
        out = answer_pb2.AnswerSource(source=source, added_for_sentence=-1)
        for name in ("bm25", "dense", "kg", "fused"):
            value = getattr(c, name)
            if value is not None:
                setattr(out, f"{name}_score", value)
        return out

    async def _stored_vectors(
        self, kept: list[Hit], seconds: float
    ) -> tuple[list[rerank_pb2.DocumentVectors], str]:
        """Stored vectors of the passages the reranker gets, per document (an empty
        vector where none is stored), and their model; ([], "") when none are known."""
        slots: list[tuple[int, int]] = []  # (document, passage) of each record asked for
        records: list[semantic_pb2.RecordRef] = []
        for d, c in enumerate(kept):
            for j, (index, _) in enumerate(c.passage_list()):
                stored = c.stored_vector_index(index)
                if stored is not None:
                    slots.append((d, j))
                    records.append(semantic_pb2.RecordRef(doc_id=c.doc_id, passage_index=stored))
        if not records:
            return [], ""
        try:
            response = await self.backends.get_vectors(
                semantic_pb2.GetVectorsRequest(records=records), seconds
            )
        except (Unavailable, DeadlineExceeded, InvalidArgument) as exc:
            log.warning("stored passage vectors not fetched; the reranker embeds: %s", exc.message)
            return [], ""
        if len(response.vectors) != len(records):
            log.warning(
                "the semantic service returned %d vectors for %d records",
                len(response.vectors),
                len(records),
            )
            return [], ""
        empty = rerank_pb2.Vector()
        per_doc = [[empty] * len(c.passage_list()) for c in kept]
        for (d, j), vector in zip(slots, response.vectors, strict=True):
            if vector.values:
                per_doc[d][j] = rerank_pb2.Vector(values=vector.values)
        return [rerank_pb2.DocumentVectors(passages=v) for v in per_doc], response.embedding_model

    async def _rerank(
        self,
        plan: Plan,
        clock: _Clock,
        kept: list[Hit],
        degradations: list[answer_pb2.Degradation],
        question: _QuestionVector | None = None,
        *,
        stored_vectors: bool = False,
    ) -> list[answer_pb2.AnswerSource]:
        """Reranked sources; the reranker gets the question's vector and, with
        ``stored_vectors``, the semantic service's vectors of the passages."""
        per_doc = plan.passages_per_document
        if not kept:
            return []
        if not plan.skip_rerank:
            documents = [
                common_pb2.Document(
                    id=c.doc_id,
                    title=c.title,
                    passages=[
                        common_pb2.Passage(doc_id=c.doc_id, index=i, text=t)
                        for i, t in c.passage_list()
                    ],
                )
                for c in kept
            ]
            start = time.perf_counter()
            try:
                # One timeout for the stage: fetching the vectors takes at most
                # half of it (a lookup by id, normally milliseconds).
                until = time.monotonic() + clock.timeout(self.settings.timeouts.rerank, "reranking")
                vectors: list[rerank_pb2.DocumentVectors] = []
                model = ""
                if stored_vectors:
                    # The embedding fallback scores these vectors instead of
                    # embedding the passages again (PFiD ignores them).
                    fetch = min(self.settings.timeouts.retrieve, (until - time.monotonic()) / 2)
                    vectors, model = await self._stored_vectors(kept, fetch)
                request = rerank_pb2.RerankRequest(
                    query=plan.question,
                    documents=documents,
                    top_k=plan.rerank_top_k,
                    passages_top_k=per_doc,
                    document_vectors=vectors,
                    embedding_model=model,
                )
                if question is not None and (not model or model == question.model):
                    request.embedding_model = question.model
                    request.query_vector.values.extend(question.vector.values)
                response = await self.backends.rerank(request, until - time.monotonic())
            except (Unavailable, DeadlineExceeded) as exc:
                reason = f"rerank service unavailable: {exc.message}; fused order used"
                degradations.append(
                    answer_pb2.Degradation(stage=answer_pb2.STAGE_RERANK, reason=reason)
                )
                log.warning("reranker skipped: %s", reason)
            else:
                clock.record(answer_pb2.STAGE_RERANK, time.perf_counter() - start)
                out = []
                for ranked in response.documents:
                    c = kept[ranked.input_index]
                    texts = dict(c.passage_list())
                    for p in ranked.passages[:per_doc]:
                        source = self._source(c, p.passage_index, texts[p.passage_index])
                        source.rerank_score = ranked.score
                        if p.passage_index >= 0:
                            source.passage_score = p.score
                        out.append(source)
                return out
        return [
            self._source(c, i, text)
            for c in kept[: plan.rerank_top_k]
            for i, text in c.passage_list()[:per_doc]
        ]

    async def _explain(
        self,
        plan: Plan,
        clock: _Clock,
        sources: Sequence[answer_pb2.AnswerSource],
        question: _QuestionVector | None = None,
    ) -> None:
        """Attach the best KG path of each source with a KG score (best effort)."""
        variant = (
            semantic_pb2.KG_VARIANT_PLAIN
            if common_pb2.RETRIEVER_KG in plan.retrievers
            and common_pb2.RETRIEVER_KG_ENHANCED not in plan.retrievers
            else semantic_pb2.KG_VARIANT_ENHANCED
        )
        doc_ids = list(dict.fromkeys(s.source.doc_id for s in sources if s.HasField("kg_score")))
        if not doc_ids:
            return
        try:
            timeout = clock.timeout(self.settings.timeouts.explain, "explaining KG paths")
            responses = await asyncio.gather(
                *(
                    self.backends.explain(
                        semantic_pb2.ExplainRequest(
                            query=plan.question,
                            doc_id=d,
                            kg_variant=variant,
                            query_vector=question.vector if question is not None else None,
                        ),
                        timeout,
                    )
                    for d in doc_ids
                )
            )
        except (Unavailable, DeadlineExceeded) as exc:
            log.warning("KG paths not attached: %s", exc.message)
            return
        paths = {d: best_path(r) for d, r in zip(doc_ids, responses, strict=True)}
        for s in sources:
            path = paths.get(s.source.doc_id)
            if path is not None:
                s.kg_path.CopyFrom(path)

    # -- generate ------------------------------------------------------------------------

    async def _generate(
        self,
        plan: Plan,
        clock: _Clock,
        sources: list[answer_pb2.AnswerSource],
        degradations: list[answer_pb2.Degradation],
        question: _QuestionVector | None = None,
    ) -> AsyncIterator[answer_pb2.AskStreamResponse]:
        request = generate_pb2.AnswerRequest(
            question=plan.question,
            sources=[s.source for s in sources],
            confidence_threshold=plan.confidence_threshold,
            max_researches=plan.max_researches,
            research=common_pb2.RetrievalOptions(
                retrievers=plan.retrievers,
                fusion=plan.fusion_method,
                filters=plan.filters,
                top_k_per_retriever=plan.top_k_per_retriever,
            ),
            research_top_k=plan.research_top_k,
            mode=plan.generation_mode,
        )
        if question is not None:  # generate does not embed the question again
            request.embedding_model = question.model
            request.question_vector.values.extend(question.vector.values)
        timeout = clock.timeout(self.settings.timeouts.generate, "generating the answer")
        final: generate_pb2.AnswerFinal | None = None
        async for event in self.backends.generate(request, timeout):
            kind = event.WhichOneof("event")
            if kind == "summary":
                i = event.summary.source_index
                if 0 <= i < len(sources):
                    sources[i].source.summary = event.summary.summary
            elif kind == "draft":
                yield answer_pb2.AskStreamResponse(draft=event.draft)
            elif kind == "sentence":
                yield answer_pb2.AskStreamResponse(sentence=event.sentence)
            elif kind == "revision":
                revision = event.revision
                for k, added in enumerate(revision.added_sources):
                    if revision.first_added_source_index + k != len(sources):
                        log.error("revision source index out of order; re-appended at the end")
                    sources.append(
                        answer_pb2.AnswerSource(
                            source=added, added_for_sentence=revision.sentence_index
                        )
                    )
                yield answer_pb2.AskStreamResponse(revision=revision)
            elif kind == "final":
                final = event.final
        if final is None:
            raise Unavailable("the generate service ended its stream without a final answer")
        if final.degraded_reason:
            degradations.append(
                answer_pb2.Degradation(
                    stage=answer_pb2.STAGE_GENERATE,
                    reason=f"{final.degraded_reason}; extractive mode used",
                )
            )
        if final.research_degraded_reason:
            degradations.append(
                answer_pb2.Degradation(
                    stage=answer_pb2.STAGE_RESEARCH, reason=final.research_degraded_reason
                )
            )
        for t in final.timings:
            clock.record(_GENERATE_STAGES[t.step], t.duration.ToNanoseconds() / 1e9)
        answer = self._final(
            clock,
            degradations,
            sources,
            text=final.answer,
            sentences=list(final.sentences),
            insufficient=final.insufficient_information,
        )
        answer.researches = final.researches
        answer.llm_calls = final.llm_calls
        answer.discarded_citations = final.discarded_citations
        answer.judge_disagreements = final.judge_disagreements
        answer.removed_sentences = final.removed_sentences
        yield answer_pb2.AskStreamResponse(final=answer)

    def _final(
        self,
        clock: _Clock,
        degradations: Sequence[answer_pb2.Degradation],
        sources: Sequence[answer_pb2.AnswerSource],
        *,
        text: str,
        sentences: Sequence[common_pb2.AnswerSentence],
        insufficient: bool,
    ) -> answer_pb2.Answer:
        order = {stage: n for n, stage in enumerate(answer_pb2.Stage.values())}
        timings = sorted(clock.timings, key=lambda t: order[t[0]])
        total = time.perf_counter() - clock.started
        _record_metrics(timings, total, degradations, insufficient)
        return answer_pb2.Answer(
            text=text,
            sentences=sentences,
            sources=sources,
            insufficient_information=insufficient,
            timings=[
                answer_pb2.StageTiming(stage=stage, duration=_duration(seconds))
                for stage, seconds in timings
            ],
            total=_duration(total),
            degradations=degradations,
        )


def best_path(explained: semantic_pb2.ExplainResponse) -> common_pb2.KgPath | None:
    """The path of an explanation with the highest mean node score, if any."""
    if not explained.paths:
        return None
    return max(explained.paths, key=lambda p: sum(n.score for n in p.nodes) / max(len(p.nodes), 1))


async def collect(events: AsyncIterator[answer_pb2.AskStreamResponse]) -> answer_pb2.Answer:
    """The final answer of an event stream (what Ask returns)."""
    final: answer_pb2.Answer | None = None
    async for event in events:
        if event.WhichOneof("event") == "final":
            final = event.final
    if final is None:
        raise Unavailable("the pipeline ended without a final answer")
    return final
