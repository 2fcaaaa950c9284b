"""One extractive answer embeds each text once: the question (not at all when
the caller passes its vector), every sentence of the sources and of the
answer; a re-search hands the semantic service the judge's vector of the
sentence instead of its text to embed again.

Run time: about 2 s once MiniLM is loaded (the first test pays the load and
torch's set-up, 10-20 s on two shared cores)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from attest.common.v1 import common_pb2
from attest.core.errors import InvalidArgument
from attest.generate.extractive import ExtractiveEngine
from attest.generate.models import FinalEvent, RevisionEvent, SentenceEvent, Source
from attest.generate.pipeline import AnswerOptions, Generator
from attest.generate.servicer import GenerateServicer, Researcher
from attest.generate.settings import GenerateSettings
from attest.generate.v1 import generate_pb2
from attest.generate.vectors import TextVectors
from attest.semantic.embedding import Embedder
from attest.semantic.v1 import semantic_pb2
from tests.unit import test_answer_vectors as answer_fakes

QUESTION = "How much did Norvale Copper cut its carbon emissions?"

# Each source has more sentences than a summary keeps (3), so every source is
# summarized against the question, as Reuters passages are.
SOURCES = [
    Source(
        "a",
        "Norvale Copper cut its carbon dioxide emissions by 30 percent in 2024. "
        "The company credits new electric haul trucks at its open-pit mine. "
        "Diesel use at the mine fell for the third year in a row. "
        "The smelter now buys most of its power from a wind farm nearby.",
        0,
    ),
    Source(
        "b",
        "Analysts said Norvale Copper reduced its emissions by 30 percent last year. "
        "They expect further cuts once the smelter's furnace is replaced. "
        "The company's shares rose four percent after the annual report. "
        "Investors had asked for a firm target for the coming decade.",
        0,
    ),
    Source(
        "c",
        "The football season starts in August with twenty teams in the league. "
        "Ticket prices rose by ten percent compared with last season. "
        "Two new stadiums open in the north of the country this year. "
        "The league expects record attendance at its opening weekend.",
        0,
    ),
]
FOUND = [
    Source(
        "d",
        "Norvale Copper's sustainability report gives its emissions for 2024. "
        "Scope 1 and 2 emissions fell by 30 percent from the year before. "
        "The report credits electric trucks and a power purchase agreement. "
        "Water use at the mine fell by a tenth over the same period.",
        0,
    ),
    SOURCES[1],
]


class CountingEmbedder(Embedder):
    """The packaged MiniLM (weights shared with every Embedder of the process),
    counting each encode call and how often each text reaches the model."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.texts: Counter[str] = Counter()
        self.vectors: dict[str, npt.NDArray[np.float32]] = {}

    def encode(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        out = super().encode(texts)
        if texts:
            self.calls += 1
            self.texts.update(texts)
            self.vectors.update(zip(texts, out, strict=True))
        return out


class Searches:
    """A re-search that, like the service's, reads the query's vector from the
    answer's ``vectors``; it records the query and that vector."""

    def __init__(self, vectors: TextVectors | None = None) -> None:
        self.vectors = vectors
        self.asked: list[tuple[str, npt.NDArray[np.float32] | None]] = []

    async def __call__(self, query: str, top_k: int) -> list[Source]:
        self.asked.append((query, self.vectors.get(query) if self.vectors else None))
        return FOUND[:top_k]


def _researching(**kw: Any) -> AnswerOptions:
    # Every sentence below a 10 is searched again (at most 3 of them).
    return AnswerOptions(confidence_threshold=10, max_researches=3, **kw)


async def _answer(
    embedder: Embedder, options: AnswerOptions, search: Searches
) -> tuple[list[object], FinalEvent]:
    generator = Generator(ExtractiveEngine(embedder))
    events = [e async for e in generator.answer(QUESTION, SOURCES, options, search)]
    final = events[-1]
    assert isinstance(final, FinalEvent)
    return events, final


def _shown(final: FinalEvent) -> list[tuple[str, list[tuple[str, int]]]]:
    return [(s.text, [(c.doc_id, c.confidence) for c in s.citations]) for s in final.sentences]


async def test_one_answer_embeds_each_text_once_and_the_search_reuses_the_judges_vector() -> None:
    embedder = CountingEmbedder()
    vectors = TextVectors(embedder)
    search = Searches(vectors)
    events, final = await _answer(embedder, _researching(vectors=vectors), search)

    assert final.researches >= 1, "the test needs a re-search"
    assert embedder.texts[QUESTION] == 1
    repeated = {t: n for t, n in embedder.texts.items() if n > 1}
    assert repeated == {}, "no text reaches the model twice in one answer"
    answer_sentences = {e.sentence.text for e in events if isinstance(e, SentenceEvent)}
    assert answer_sentences
    assert all(embedder.texts[s] == 1 for s in answer_sentences)
    # Every sentence of every source, the found one's too, was embedded (once).
    assert "Norvale Copper's sustainability report gives its emissions for 2024." in (
        embedder.texts
    )
    # The re-search has the vector the judge computed for the sentence, so the
    # semantic service has nothing to embed.
    assert len(search.asked) == final.researches
    for query, vector in search.asked:
        assert vector is not None
        assert np.array_equal(vector, embedder.vectors[query])
    revised = {e.query for e in events if isinstance(e, RevisionEvent) and not e.removed}
    assert revised == {q for q, _ in search.asked}


async def test_a_given_question_vector_is_not_embedded_again_and_changes_nothing() -> None:
    question_vector = Embedder().encode([QUESTION])[0]
    plain, given = CountingEmbedder(), CountingEmbedder()
    _, without = await _answer(plain, _researching(), Searches())
    _, with_vector = await _answer(
        given, _researching(question_vector=question_vector.tolist()), Searches()
    )
    assert plain.texts[QUESTION] == 1
    assert given.texts[QUESTION] == 0
    assert given.calls == plain.calls, "the question shared its batch: no call saved or added"
    assert _shown(with_vector) == _shown(without)
    assert with_vector.researches == without.researches


def _request(model: str, vector: Sequence[float]) -> generate_pb2.AnswerRequest:
    return generate_pb2.AnswerRequest(
        question=QUESTION,
        sources=[common_pb2.Source(doc_id=s.doc_id, text=s.text) for s in SOURCES],
        max_researches=0,
        embedding_model=model,
        question_vector=generate_pb2.QuestionVector(values=list(vector)),
    )


async def _serve(embedder: CountingEmbedder, request: generate_pb2.AnswerRequest) -> str:
    servicer = GenerateServicer(GenerateSettings(), generator=Generator(ExtractiveEngine(embedder)))
    final = ""
    async for event in servicer.Answer(request, None):  # type: ignore[arg-type]
        if event.WhichOneof("event") == "final":
            final = event.final.answer
    return final


async def test_the_service_uses_the_callers_vector_only_from_its_own_model() -> None:
    vector = Embedder().encode([QUESTION])[0].tolist()
    own, other = CountingEmbedder(), CountingEmbedder()
    answer = await _serve(own, _request(own.name, vector))
    assert own.texts[QUESTION] == 0
    assert answer == await _serve(other, _request("another-model", vector))
    assert other.texts[QUESTION] == 1, "a vector from another model is ignored"
    with pytest.raises(InvalidArgument, match="dimensions"):
        await _serve(CountingEmbedder(), _request(own.name, vector[:100]))


class _Semantic:
    def __init__(self) -> None:
        self.requests: list[semantic_pb2.SearchRequest] = []

    async def Search(self, request: semantic_pb2.SearchRequest, **_: object) -> Any:
        self.requests.append(request)
        return semantic_pb2.SearchResponse()


@pytest.mark.parametrize("known", [True, False])
async def test_the_research_sends_the_answers_vector_to_the_semantic_service(known: bool) -> None:
    researcher = Researcher(GenerateSettings())
    semantic = _Semantic()
    researcher._semantic = semantic
    vectors = TextVectors(Embedder())
    sentence = "Norvale Copper cut emissions by 30 percent."
    vector = np.linspace(-1, 1, 384, dtype=np.float32)
    if known:
        vectors.put(sentence, vector)
    # BM25 (no lexical service here) and dense: one semantic search per re-search.
    options = common_pb2.RetrievalOptions(
        retrievers=[common_pb2.RETRIEVER_BM25, common_pb2.RETRIEVER_DENSE]
    )
    search = researcher.search_fn(options, vectors)
    found = await search(sentence, 3)
    assert found.sources == []
    assert found.skipped == (
        "lexical service unavailable: no lexical service is configured for re-search",
    )
    # Without the answer's vectors (another model) nothing is sent either.
    assert (await researcher.search_fn(options)(sentence, 3)).sources == []
    first, second = semantic.requests
    assert first.query == second.query == sentence
    assert not second.HasField("query_vector")
    if known:
        sent = np.asarray(first.query_vector.values, dtype=np.float32)
        assert np.allclose(sent, vector / np.linalg.norm(vector))
    else:
        assert not first.HasField("query_vector")


class _AnswerBackends(answer_fakes.Backends):
    """The answer service's fake backends, keeping the request sent to generate."""

    def __init__(self, **kw: bool) -> None:
        super().__init__(**kw)
        self.generated: list[generate_pb2.AnswerRequest] = []

    async def generate(
        self, request: generate_pb2.AnswerRequest, seconds: float
    ) -> AsyncIterator[generate_pb2.AnswerResponse]:
        self.generated.append(request)
        async for event in super().generate(request, seconds):
            yield event


@pytest.mark.parametrize("embedded", [True, False])
def test_the_answer_service_passes_its_question_vector_to_generate(embedded: bool) -> None:
    backends = _AnswerBackends(embed_fails=not embedded)
    answer_fakes.ask(backends)
    (request,) = backends.generated
    if embedded:
        assert request.embedding_model == answer_fakes.MODEL
        assert list(request.question_vector.values) == pytest.approx(answer_fakes.Q_VECTOR)
    else:
        # No vector from the semantic service: generate embeds the question itself.
        assert request.embedding_model == ""
        assert not request.HasField("question_vector")
