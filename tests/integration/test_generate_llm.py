"""The generator against protocol-level fake TGI and OpenAI-compatible servers.

Each test runs twice, once per protocol: citations and confidences per
sentence, one re-search and revision for a weak sentence, malformed model
output, retries, bounded concurrency, and upstream failures mapped to typed
errors (and through gRPC to their status codes).
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from attest.common.v1 import common_pb2
from attest.core.channels import create_channel
from attest.core.errors import (
    DeadlineExceeded,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from attest.core.server import running
from attest.core.settings import ServerSettings
from attest.generate import prompts
from attest.generate.extractive import ExtractiveEngine
from attest.generate.llm import LLMSettings, create_client
from attest.generate.models import (
    INSUFFICIENT,
    DraftEvent,
    Event,
    FinalEvent,
    Mode,
    RevisionEvent,
    SentenceEvent,
    Source,
    Step,
    SummaryEvent,
)
from attest.generate.pipeline import AnswerOptions, Generator, PipelineSettings
from attest.generate.servicer import GenerateServicer
from attest.generate.settings import GenerateSettings
from attest.generate.v1 import generate_pb2, generate_pb2_grpc
from attest.semantic.embedding import Embedder
from tests.integration.fake_llm import FakeLLM, Reply, cite_json

pytestmark = pytest.mark.integration

EMBEDDER = Embedder()  # loaded only by the tests that fall back to extractive mode
# These tests check the protocol: the model's citations and ratings as the
# fake gives them, and unsupported sentences kept and marked. The support
# judge's re-rating and the withdrawal of unsupported sentences are the
# default and are tested on their own (test_llm_ratings_are_combined_with_the_judge).
PROTOCOL: dict[str, Any] = {
    "llm_citation_rating": "model",
    "withdraw_unsupported": False,
    "summarize_short_sources": True,
}

SOURCES = [
    Source("d1", "Acme Copper cut its carbon emissions by 30% in 2024.", 0),
    Source("d2", "Acme Copper is based in Chile and mines copper.", 0),
    Source("d3", "The board of Acme Copper met in May.", 1),
]
QUESTION = "How did Acme Copper change its emissions?"
ANSWER = "Acme Copper cut its emissions by 30% in 2024. The company mines copper in Chile."


class Script:
    """Responds by step: summaries echo the source, answer and citations are set per test."""

    def __init__(self, answer: str = ANSWER, cites: Sequence[str] = ()) -> None:
        self.answer = answer
        self.cites = list(cites)

    def __call__(self, prompt: str) -> str:
        if "Summarize the source" in prompt:
            body = re.search(r"<source[^>]*>\n(.*)\n</source>", prompt, re.S)
            return "Summary: " + (body.group(1) if body else "")
        if "Question:" in prompt:
            return self.answer
        if self.cites:
            return self.cites.pop(0)
        return cite_json()


@pytest.fixture(params=["tgi", "openai"])
async def fake(request: pytest.FixtureRequest) -> AsyncIterator[FakeLLM]:
    server = await FakeLLM(request.param).start()
    yield server
    await server.stop()


def make_generator(url: str, kind: str, *, fallback: bool = False, **llm: object) -> Generator:
    settings = LLMSettings(
        kind=kind,  # type: ignore[arg-type]
        url=url,
        model="fake-model",
        timeout_seconds=llm.pop("timeout_seconds", 5.0),  # type: ignore[arg-type]
        backoff_seconds=0.01,
        max_backoff_seconds=0.05,
        **llm,  # type: ignore[arg-type]
    )
    return Generator(
        ExtractiveEngine(EMBEDDER),
        create_client(settings),
        PipelineSettings(fallback_to_extractive=fallback, **PROTOCOL),
    )


async def collect(
    generator: Generator,
    options: AnswerOptions | None = None,
    search: Callable[[str, int], object] | None = None,
) -> list[Event]:
    events = [e async for e in generator.answer(QUESTION, SOURCES, options, search)]  # type: ignore[arg-type]
    await generator.close()
    return events


def final_of(events: list[Event]) -> FinalEvent:
    assert isinstance(events[-1], FinalEvent)
    return events[-1]


async def test_each_sentence_gets_citations_and_confidences(fake: FakeLLM) -> None:
    fake.responder = Script(cites=[cite_json((1, 1, 9), (1, 2, 4), (2, 2, 8))])
    events = await collect(make_generator(fake.url, fake.flavor))

    summaries = [e for e in events if isinstance(e, SummaryEvent)]
    assert [s.source_index for s in summaries] == [0, 1, 2]
    assert summaries[0].summary.startswith("Summary: Acme Copper cut")
    sentences = [e.sentence for e in events if isinstance(e, SentenceEvent)]
    assert [s.text for s in sentences] == [
        "Acme Copper cut its emissions by 30% in 2024.",
        "The company mines copper in Chile.",
    ]
    first, second = sentences
    assert [(c.source_index, c.doc_id, c.passage_index, c.confidence) for c in first.citations] == [
        (0, "d1", 0, 9),
        (1, "d2", 0, 4),
    ]
    assert first.confidence == 9
    assert not first.unsupported
    assert [(c.source_index, c.confidence) for c in second.citations] == [(1, 8)]

    final = final_of(events)
    assert final.mode is Mode.LLM
    assert final.degraded_reason == ""
    # 3 summaries + 1 answer + 1 batched citation call for both sentences.
    assert final.llm_calls == 5 == len(fake.requests)
    assert [(t.step, t.llm_calls) for t in final.timings] == [
        (Step.SUMMARIZE, 3),
        (Step.ANSWER, 1),
        (Step.CITE, 1),
    ]
    assert final.discarded_citations == 0
    assert final.researches == 0
    # Sources are delimited as data in the answer prompt.
    answer_prompt = fake.prompts("Question:")[0]
    assert '<source id="1">\nSummary: Acme Copper cut' in answer_prompt
    assert INSUFFICIENT in answer_prompt
    # Chat messages, deterministic, and the citation call is grammar-constrained JSON.
    cite_payload = fake.requests[-1].payload
    assert [m["role"] for m in cite_payload["messages"]] == ["system", "user"]
    assert (cite_payload["temperature"], cite_payload["seed"]) == (0, 0)
    assert cite_payload["model"] == "fake-model"
    if fake.flavor == "tgi":
        assert cite_payload["response_format"] == {"type": "json", "value": prompts.CITE_SCHEMA}
    else:
        assert cite_payload["response_format"]["type"] == "json_schema"
        assert cite_payload["response_format"]["json_schema"]["schema"] == prompts.CITE_SCHEMA


async def test_weak_sentence_is_researched_once_and_revised(fake: FakeLLM) -> None:
    # Sentence 2 gets confidence 3 (< 5); the re-search finds one known and one new source.
    fake.responder = Script(
        cites=[cite_json((1, 1, 9), (2, 3, 3)), cite_json((1, 2, 8), (1, 1, 2))]
    )
    searched: list[tuple[str, int]] = []
    found = Source("d9", "Acme Copper operates copper mines in northern Chile.", 2)

    async def search(query: str, top_k: int) -> list[Source]:
        searched.append((query, top_k))
        return [SOURCES[1], found]

    events = await collect(
        make_generator(fake.url, fake.flavor), AnswerOptions(research_top_k=2), search
    )
    assert searched == [("The company mines copper in Chile.", 2)]
    revisions = [e for e in events if isinstance(e, RevisionEvent)]
    assert len(revisions) == 1
    rev = revisions[0]
    assert rev.sentence_index == 1
    assert rev.previous_confidence == 3
    assert rev.query == "The company mines copper in Chile."
    assert [s.doc_id for s in rev.added_sources] == ["d9"]
    assert rev.added_sources[0].summary.startswith("Summary: Acme Copper operates")
    assert rev.first_added_source_index == 3
    # Re-cite numbering was local (1 = known d2, 2 = new d9); indices are global.
    assert [(c.source_index, c.doc_id, c.confidence) for c in rev.sentence.citations] == [
        (3, "d9", 8),
        (2, "d3", 3),
        (1, "d2", 2),
    ]
    # The revision comes after the sentence it revises.
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("RevisionEvent") > max(
        i for i, k in enumerate(kinds) if k == "SentenceEvent"
    )
    final = final_of(events)
    assert final.researches == 1
    assert final.sentences[1].confidence == 8
    # 3 + 1 + 1, then 1 summary of the new source + 1 re-cite.
    assert final.llm_calls == 7 == len(fake.requests)
    assert dict((t.step, t.llm_calls) for t in final.timings)[Step.RESEARCH] == 2


@pytest.mark.parametrize(
    ("reply", "discarded", "asked"),
    [
        ("this is not JSON {", 1, 2),
        (cite_json((1, 7, 9)), 1, 1),  # no source 7
        (cite_json((1, 0, 9)), 1, 1),  # sources are numbered from 1
        (cite_json((1, 1, 11)), 1, 1),  # confidence above 10
        (cite_json((1, 1, "high")), 1, 1),  # confidence not a number
        (cite_json((1, 1, 7.5)), 1, 1),
        (cite_json((9, 1, 7)), 1, 1),  # no sentence 9
        ('{"citations": "all of them"}', 1, 2),
        ('{"citations": [{"sentence": 1, "source": "1; DROP", "confidence": 9}]}', 1, 1),
    ],
    ids=[
        "invalid-json",
        "source-7",
        "source-0",
        "confidence-11",
        "confidence-high",
        "confidence-7.5",
        "sentence-9",
        "wrong-shape",
        "source-string",
    ],
)
async def test_malformed_citation_output_never_becomes_a_citation(
    fake: FakeLLM, reply: str, discarded: int, asked: int
) -> None:
    # The model says the same thing when asked again.
    fake.responder = Script(
        answer="Acme Copper cut its emissions by 30% in 2024.", cites=[reply, reply]
    )
    generator = make_generator(fake.url, fake.flavor)
    assert generator.llm is not None
    events = await collect(generator)
    final = final_of(events)
    # Output nothing can be read from is asked for once more (with a note), then discarded;
    # a readable reply with a wrong item is not asked again: the item is dropped.
    cite_prompts = fake.prompts("Sentences:")
    assert len(cite_prompts) == asked
    assert generator.llm.invalid_outputs == 2 * (asked - 1)
    if asked == 2:
        assert "could not be used" in cite_prompts[1]
    assert final.llm_calls == 3 + 1 + 1  # the pipeline's count: one citation step
    (sentence,) = final.sentences
    assert sentence.unsupported
    assert sentence.citations == ()
    assert sentence.confidence == 0
    assert final.unsupported_sentences == 1
    assert final.discarded_citations == discarded


async def test_valid_citations_survive_next_to_malformed_ones(fake: FakeLLM) -> None:
    fake.responder = Script(
        cites=[cite_json((1, 1, 8), (1, 5, 9), (1, 2, 11), (2, 2, "high"), (2, 3, 0))]
    )
    final = final_of(await collect(make_generator(fake.url, fake.flavor)))
    first, second = final.sentences
    assert [(c.source_index, c.confidence) for c in first.citations] == [(0, 8)]
    # A rating of 0 is "does not support": no citation, the sentence is unsupported.
    assert second.unsupported
    assert final.discarded_citations == 3
    assert all(0 <= c.source_index < len(SOURCES) for s in final.sentences for c in s.citations)


async def test_insufficient_information_is_said_exactly(fake: FakeLLM) -> None:
    fake.responder = Script(answer="Insufficient information available.")
    final = final_of(await collect(make_generator(fake.url, fake.flavor)))
    assert final.insufficient_information
    assert final.answer.startswith(INSUFFICIENT)
    assert final.sentences[0].unsupported
    assert final.llm_calls == 4  # no citation call


async def test_citation_calls_are_batched_and_bounded(fake: FakeLLM) -> None:
    answer = " ".join(f"Fact number {i} about Acme Copper." for i in range(1, 13))
    fake.responder = Script(answer=answer)
    generator = make_generator(fake.url, fake.flavor)
    generator.settings = PipelineSettings(
        cite_batch_size=5, fallback_to_extractive=False, **PROTOCOL
    )
    final = final_of(await collect(generator, AnswerOptions(max_sentences=12)))
    assert len(final.sentences) == 12
    # 3 summaries + 1 answer + ceil(12 / 5) citation calls, never 2 per sentence.
    assert final.llm_calls == 3 + 1 + 3


# -- the client edge: retries, timeouts, concurrency, error mapping ---------------------


async def test_overload_is_retried_with_backoff(fake: FakeLLM) -> None:
    fake.script = [
        Reply(status=429, error_type="overloaded", text="Model is overloaded"),
        Reply(status=503, text="loading"),
        Reply(text="fine"),
    ]
    client = create_client(
        LLMSettings(kind=fake.flavor, url=fake.url, max_attempts=3, backoff_seconds=0.01)
    )
    assert await client.generate("s", "hello") == "fine"
    assert client.requests == 3
    await client.close()


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_model_calls_are_counted_in_metrics(fake: FakeLLM) -> None:
    """Every HTTP request to the model is counted by outcome and timed, tokens
    by direction, replies that fail the JSON check apart, and a stream's first
    piece is timed (the Prometheus series an operator watches the LLM by)."""
    kind = fake.flavor

    def counts() -> dict[str, float]:
        return {
            "ok": _sample("attest_llm_requests_total", kind=kind, call="complete", outcome="ok"),
            "overloaded": _sample(
                "attest_llm_requests_total",
                kind=kind,
                call="complete",
                outcome="resource_exhausted",
            ),
            "down": _sample(
                "attest_llm_requests_total", kind=kind, call="complete", outcome="unavailable"
            ),
            "timed": _sample("attest_llm_request_seconds_count", kind=kind, call="complete"),
            "prompt": _sample("attest_llm_tokens_total", kind=kind, direction="prompt"),
            "completion": _sample("attest_llm_tokens_total", kind=kind, direction="completion"),
            "invalid": _sample("attest_llm_invalid_outputs_total", kind=kind),
            "streamed": _sample(
                "attest_llm_requests_total", kind=kind, call="stream", outcome="ok"
            ),
            "first_token": _sample("attest_llm_first_token_seconds_count", kind=kind),
        }

    before = counts()
    fake.script = [
        Reply(status=429, error_type="overloaded", text="Model is overloaded"),
        Reply(status=503, text="loading"),
        Reply(text="fine"),
        Reply(text='{"citations": [', finish_reason="length"),
        Reply(text='{"citations": [', finish_reason="length"),
    ]
    client = create_client(
        LLMSettings(kind=kind, url=fake.url, max_attempts=3, backoff_seconds=0.01)
    )
    assert await client.generate("s", "hello") == "fine"
    await client.generate("s", "cite", max_tokens=4, schema=prompts.CITE_SCHEMA)
    fake.script = [Reply(text="one two three", piece_delay=0.01)]
    assert "".join([p async for p in client.stream("s", "write")]) == "one two three"
    await client.close()
    after = counts()
    delta = {k: after[k] - before[k] for k in after}
    assert delta["ok"] == 3  # "fine" and the two JSON replies
    assert (delta["overloaded"], delta["down"]) == (1, 1)
    assert delta["timed"] == 5
    assert delta["invalid"] == 2
    assert (delta["streamed"], delta["first_token"]) == (1, 1)
    assert delta["prompt"] == client.prompt_tokens
    assert delta["completion"] == client.completion_tokens > 0


@pytest.mark.parametrize(
    ("reply", "error", "requests"),
    [
        (
            Reply(status=429, error_type="overloaded", text="Model is overloaded"),
            ResourceExhausted,
            2,
        ),
        (Reply(status=422, error_type="validation", text="inputs too long"), InvalidArgument, 1),
        (Reply(status=400, text="bad request"), InvalidArgument, 1),
        (Reply(status=503, text="down"), Unavailable, 2),
        (Reply(delay=2.0, text="late"), DeadlineExceeded, 1),
    ],
    ids=["overloaded", "validation", "bad-request", "unavailable", "timeout"],
)
async def test_upstream_failures_become_typed_errors(
    fake: FakeLLM, reply: Reply, error: type[Exception], requests: int
) -> None:
    fake.responder = lambda prompt: reply
    client = create_client(
        LLMSettings(
            kind=fake.flavor,
            url=fake.url,
            max_attempts=2,
            backoff_seconds=0.01,
            timeout_seconds=0.3 if reply.delay else 10.0,
        )
    )
    with pytest.raises(error) as info:
        await client.generate("s", "hello")
    assert client.requests == requests == len(fake.requests)
    assert "LLM" in str(info.value)
    await client.close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("kind", ["tgi", "openai"])
async def test_unreachable_server_is_unavailable(kind: str) -> None:
    client = create_client(
        LLMSettings(
            kind=kind,
            url=f"http://127.0.0.1:{_closed_port()}",
            max_attempts=2,
            backoff_seconds=0.01,
        )
    )
    with pytest.raises(Unavailable, match="unreachable"):
        await client.generate("s", "hello")
    assert client.requests == 2
    await client.close()


async def test_concurrency_is_bounded(fake: FakeLLM) -> None:
    fake.responder = lambda prompt: Reply(text="x", delay=0.05)
    client = create_client(LLMSettings(kind=fake.flavor, url=fake.url, max_concurrency=2))
    await asyncio.gather(*(client.generate("s", f"p{i}") for i in range(8)))
    assert len(fake.requests) == 8
    assert fake.max_in_flight == 2
    await client.close()


async def test_json_cut_off_at_the_token_limit_is_asked_again_with_more_tokens(
    fake: FakeLLM,
) -> None:
    fake.script = [
        Reply(text='{"citations": [{"sentence": 1, "sou', finish_reason="length"),
        Reply(text=cite_json((1, 1, 7))),
    ]
    client = create_client(LLMSettings(kind=fake.flavor, url=fake.url))
    text = await client.generate("s", "cite", max_tokens=10, schema=prompts.CITE_SCHEMA)
    assert text == cite_json((1, 1, 7))
    assert [r.payload["max_tokens"] for r in fake.requests] == [10, 20]
    assert "cut off at the token limit" in fake.requests[1].prompt
    assert (client.requests, client.invalid_outputs) == (2, 1)
    assert client.completion_tokens > 0
    await client.close()


async def test_json_that_fails_twice_is_returned_for_the_parser_to_discard(
    fake: FakeLLM,
) -> None:
    fake.responder = lambda prompt: Reply(text='{"citations": [', finish_reason="length")
    client = create_client(LLMSettings(kind=fake.flavor, url=fake.url))
    text = await client.generate("s", "cite", max_tokens=4, schema=prompts.CITE_SCHEMA)
    assert prompts.parse_cite(text) is None
    assert (client.requests, client.invalid_outputs) == (2, 2)
    await client.close()


async def test_without_a_system_role_the_system_prompt_opens_the_user_message(
    fake: FakeLLM,
) -> None:
    client = create_client(LLMSettings(kind=fake.flavor, url=fake.url, system_role=False))
    await client.generate("be careful", "hello")
    (request,) = fake.requests
    assert request.payload["messages"] == [{"role": "user", "content": "be careful\n\nhello"}]
    await client.close()


def test_request_deadline_grows_with_the_tokens_asked_for() -> None:
    client = create_client(
        LLMSettings(
            url="http://127.0.0.1:1",
            first_token_seconds=2,
            seconds_per_token=0.5,
            timeout_seconds=100,
        )
    )
    assert client.deadline_for(10) == 7
    assert client.deadline_for(100) == 52
    assert client.deadline_for(1000) == 100  # capped


def test_llama_cpp_gets_its_json_object_form() -> None:
    client = create_client(
        LLMSettings(kind="openai", url="http://127.0.0.1:1", response_format="json_object")
    )
    url, payload = client._request("s", "u", 8, prompts.JUDGE_SCHEMA)
    assert url == "http://127.0.0.1:1/v1/chat/completions"
    assert payload["response_format"] == {"type": "json_object", "schema": prompts.JUDGE_SCHEMA}


async def test_wrong_response_shape_is_internal_not_a_crash(fake: FakeLLM) -> None:
    from attest.core.errors import Internal

    fake.responder = lambda prompt: Reply(raw={"unexpected": True})
    client = create_client(LLMSettings(kind=fake.flavor, url=fake.url))
    with pytest.raises(Internal, match="unexpected LLM response"):
        await client.generate("s", "hello")
    await client.close()


async def test_unreachable_llm_degrades_to_extractive_and_says_so() -> None:
    generator = make_generator(
        f"http://127.0.0.1:{_closed_port()}", "tgi", fallback=True, max_attempts=1
    )
    final = final_of(await collect(generator))
    assert final.mode is Mode.EXTRACTIVE
    assert final.degraded_reason.startswith("LLM unavailable")
    assert final.sentences
    assert all(s.citations or s.unsupported for s in final.sentences)


# -- through gRPC ----------------------------------------------------------------------


def _request() -> generate_pb2.AnswerRequest:
    return generate_pb2.AnswerRequest(
        question=QUESTION,
        sources=[
            common_pb2.Source(doc_id=s.doc_id, passage_index=s.passage_index, text=s.text)
            for s in SOURCES
        ],
        mode=generate_pb2.GENERATION_MODE_LLM,
    )


async def _serve(
    url: str, kind: str, **llm: object
) -> AsyncIterator[generate_pb2_grpc.GenerateServiceStub]:
    settings = GenerateSettings(
        server=ServerSettings(host="127.0.0.1", port=0),
        llm=LLMSettings(kind=kind, url=url, backoff_seconds=0.01, **llm),  # type: ignore[arg-type]
        pipeline=PipelineSettings(fallback_to_extractive=False, **PROTOCOL),
    )
    servicer = GenerateServicer(
        settings,
        Generator(ExtractiveEngine(EMBEDDER), create_client(settings.llm), settings.pipeline),
    )
    async with running([servicer], settings.server, ready_timeout=300) as server:
        channel = create_channel(f"127.0.0.1:{server.port}")
        yield generate_pb2_grpc.GenerateServiceStub(channel)
        await channel.close()


async def test_answer_streams_events_over_grpc(fake: FakeLLM) -> None:
    fake.responder = Script(cites=[cite_json((1, 1, 9), (2, 2, 8))])
    async for stub in _serve(fake.url, fake.flavor):
        events = [e async for e in stub.Answer(_request(), timeout=30)]
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds == ["summary"] * 3 + ["draft"] * 2 + ["sentence"] * 2 + ["final"]
    assert [(e.draft.index, e.draft.text) for e in events[3:5]] == [
        (0, "Acme Copper cut its emissions by 30% in 2024."),
        (1, "The company mines copper in Chile."),
    ]
    final = events[-1].final
    assert final.mode == generate_pb2.GENERATION_MODE_LLM
    assert final.llm_calls == 5
    assert [(t.step, t.llm_calls) for t in final.timings] == [
        (generate_pb2.STEP_SUMMARIZE, 3),
        (generate_pb2.STEP_ANSWER, 1),
        (generate_pb2.STEP_CITE, 1),
    ]
    assert events[5].sentence.citations[0].doc_id == "d1"
    assert events[5].sentence.citations[0].confidence == 9


@pytest.mark.parametrize(
    ("reply", "code"),
    [
        (
            Reply(status=429, error_type="overloaded", text="busy"),
            grpc.StatusCode.RESOURCE_EXHAUSTED,
        ),
        (
            Reply(status=422, error_type="validation", text="too long"),
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        (Reply(delay=2.0, text="late"), grpc.StatusCode.DEADLINE_EXCEEDED),
        (Reply(status=503, text="down"), grpc.StatusCode.UNAVAILABLE),
    ],
    ids=["overloaded", "validation", "timeout", "unavailable"],
)
async def test_upstream_failures_reach_the_caller_as_grpc_codes(
    fake: FakeLLM, reply: Reply, code: grpc.StatusCode
) -> None:
    fake.responder = lambda prompt: reply
    # Only the late reply needs a short timeout; a busy machine must not turn the others
    # into timeouts.
    timeout = 0.3 if reply.delay else 10.0
    async for stub in _serve(fake.url, fake.flavor, max_attempts=1, timeout_seconds=timeout):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.Answer(_request(), timeout=30):
                pass
    assert info.value.code() == code
    assert "LLM" in (info.value.details() or "")


async def test_unreachable_llm_is_unavailable_over_grpc() -> None:
    async for stub in _serve(f"http://127.0.0.1:{_closed_port()}", "tgi", max_attempts=1):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.Answer(_request(), timeout=30):
                pass
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_bad_requests_name_the_field(fake: FakeLLM) -> None:
    async for stub in _serve(fake.url, fake.flavor):
        bad = _request()
        bad.confidence_threshold = 11
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stub.Answer(bad, timeout=30):
                pass
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "confidence_threshold" in (info.value.details() or "")
        empty = generate_pb2.CiteRequest(sentences=["x"])
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Cite(empty, timeout=30)
        assert "sources" in (info.value.details() or "")


async def test_summarize_cite_and_judge_over_grpc(fake: FakeLLM) -> None:
    def respond(prompt: str) -> str:
        if "Summarize the source" in prompt:
            return "Short summary."
        if "Pair 1:" in prompt:
            # Pair 1 is rated, pair 2 gets an impossible rating.
            return '{"ratings": [{"pair": 1, "confidence": 7, "quote": "cut"}, {"pair": 2, "confidence": 12}]}'
        return cite_json((1, 1, 9), (1, 4, 9))

    fake.responder = respond
    sources = _request().sources
    llm = generate_pb2.GENERATION_MODE_LLM
    async for stub in _serve(fake.url, fake.flavor):
        summarized = await stub.Summarize(
            generate_pb2.SummarizeRequest(sources=sources, query=QUESTION, mode=llm), timeout=30
        )
        cited = await stub.Cite(
            generate_pb2.CiteRequest(sentences=["Acme cut emissions."], sources=sources, mode=llm),
            timeout=30,
        )
        judged = await stub.Judge(
            generate_pb2.JudgeRequest(
                sentences=["Acme cut emissions."],
                sources=sources,
                pairs=[
                    generate_pb2.JudgePair(sentence_index=0, source_index=0),
                    generate_pb2.JudgePair(sentence_index=0, source_index=2),
                ],
                mode=llm,
            ),
            timeout=30,
        )
    assert [s.summary for s in summarized.summaries] == ["Short summary."] * 3
    assert summarized.llm_calls == 3
    (sentence,) = cited.sentences
    assert [(c.source_index, c.doc_id, c.confidence) for c in sentence.citations] == [(0, "d1", 9)]
    assert cited.discarded_citations == 1  # source 4 does not exist
    assert cited.llm_calls == 1
    first, second = judged.judgements
    assert (first.source_index, first.confidence, first.quote) == (0, 7, "cut")
    assert first.rejected_reason == ""
    assert second.source_index == 2
    assert second.confidence == 0
    assert second.rejected_reason == "no valid rating"
    assert judged.llm_calls == 1


async def test_llm_ratings_are_combined_with_the_judge(fake: FakeLLM) -> None:
    # The model rates the emissions sentence 10 against a source about a board
    # meeting, which states none of it: the judge disagrees, the lower rating
    # wins, and a citation below the floor is not kept.
    fake.responder = Script(cites=[cite_json((1, 1, 9), (1, 3, 10), (2, 2, 8))])
    generator = make_generator(fake.url, fake.flavor)
    generator.settings = PipelineSettings(fallback_to_extractive=False)
    final = final_of(await collect(generator))
    assert final.judge_disagreements >= 1
    cited = {c.doc_id for s in final.sentences for c in s.citations}
    assert "d3" not in cited
    for s in final.sentences:
        assert s.citations, "unsupported sentences are withdrawn by default"
        assert all(5 <= c.confidence <= 10 for c in s.citations)


async def test_the_judge_cites_a_supporting_source_the_model_left_out(fake: FakeLLM) -> None:
    # The model names no source for the emissions sentence; the source that
    # states it is still cited, rated by the judge alone, and the board-meeting
    # source, which states none of it, is not.
    fake.responder = Script(answer=SOURCES[0].text, cites=[cite_json()])
    generator = make_generator(fake.url, fake.flavor)
    generator.settings = PipelineSettings(fallback_to_extractive=False)
    final = final_of(await collect(generator))
    (sentence,) = final.sentences
    assert sentence.text == SOURCES[0].text
    assert sentence.citations[0].doc_id == "d1"
    assert "d3" not in {c.doc_id for c in sentence.citations}
    assert all(5 <= c.confidence <= 10 for c in sentence.citations)
    assert final.judge_disagreements == 0


async def test_sentences_are_drafted_while_the_model_writes(fake: FakeLLM) -> None:
    """The answer is streamed: the first sentence is out as a draft before the
    model has sent the last word of its reply, and each draft is followed by
    its cited sentence with the same index and text."""
    script = Script(cites=[cite_json((1, 1, 9), (2, 2, 8))])

    def slow_answer(prompt: str) -> Reply | str:
        reply = script(prompt)
        return Reply(text=reply, piece_delay=0.05) if "Question:" in prompt else reply

    fake.responder = slow_answer
    loop = asyncio.get_running_loop()
    seen: list[tuple[float, Event]] = []
    generator = make_generator(fake.url, fake.flavor)
    async for event in generator.answer(QUESTION, SOURCES):
        seen.append((loop.time(), event))
    await generator.close()
    drafts = [(t, e) for t, e in seen if isinstance(e, DraftEvent)]
    sentences = [e.sentence for _, e in seen if isinstance(e, SentenceEvent)]
    assert [(e.index, e.text) for _, e in drafts] == [(s.index, s.text) for s in sentences]
    assert drafts[0][0] < fake.pieces_sent[-1]  # written, not yet finished
    answer_request = next(r for r in fake.requests if "Question:" in r.prompt)
    assert answer_request.payload["stream"] is True


async def test_a_stream_cut_midway_falls_back_to_an_extractive_answer(fake: FakeLLM) -> None:
    """A model reply that ends in an error event after its first sentence does
    not fail the answer: the extractive engine answers from the sources and
    the degradation is named."""
    script = Script()

    def broken(prompt: str) -> Reply | str:
        if "Question:" in prompt:
            return Reply(text=ANSWER, fail_after=12)  # after the first sentence
        return script(prompt)

    fake.responder = broken
    events = await collect(make_generator(fake.url, fake.flavor, fallback=True))
    assert [e.text for e in events if isinstance(e, DraftEvent)] == [
        "Acme Copper cut its emissions by 30% in 2024."
    ]
    final = final_of(events)
    assert final.mode is Mode.EXTRACTIVE
    assert "the model crashed" in final.degraded_reason
    assert final.sentences[0].citations[0].doc_id == "d1"


async def test_a_dropped_stream_is_asked_for_again(fake: FakeLLM) -> None:
    """A stream that ends without text or a finish reason (a server that dropped
    the reply) is retried like a failed request, not read as an empty answer."""
    script = Script(cites=[cite_json((1, 1, 9), (2, 2, 8))])
    answers: list[str] = []

    def drop_first(prompt: str) -> Reply | str:
        if "Question:" in prompt:
            answers.append(prompt)
            return Reply(text=ANSWER, dropped=len(answers) == 1)
        return script(prompt)

    fake.responder = drop_first
    events = await collect(make_generator(fake.url, fake.flavor))
    final = final_of(events)
    assert len(answers) == 2
    assert (final.mode, final.insufficient_information) == (Mode.LLM, False)
    assert [e.text for e in events if isinstance(e, DraftEvent)] == [
        "Acme Copper cut its emissions by 30% in 2024.",
        "The company mines copper in Chile.",
    ]


async def test_a_short_source_is_its_own_summary(fake: FakeLLM) -> None:
    """Without summarize_short_sources, a source no longer than the summary
    asked for costs no model call."""
    fake.responder = Script(cites=[cite_json((1, 1, 9), (2, 2, 8))])
    generator = Generator(
        ExtractiveEngine(EMBEDDER),
        create_client(LLMSettings(kind=fake.flavor, url=fake.url, model="fake-model")),
        PipelineSettings(**{**PROTOCOL, "summarize_short_sources": False}),
    )
    events = await collect(generator)
    summaries = [e.summary for e in events if isinstance(e, SummaryEvent)]
    assert summaries == [s.text for s in SOURCES]
    assert not fake.prompts("Summarize the source")


async def test_text_that_repeats_the_prompt_is_dropped(fake: FakeLLM) -> None:
    """A model that continues its prompt: the instruction it writes back is not
    drafted or cited, the sentence after it is; a summary that repeats its
    instructions is replaced by an extractive one."""
    echo = "Summarize the source below in at most 3 sentences. Keep names exactly."
    script = Script(
        answer=f"{prompts.SYSTEM} Acme Copper cut its emissions by 30% in 2024.",
        cites=[cite_json((1, 1, 9))],
    )

    def echoing(prompt: str) -> str:
        return echo if "Summarize the source" in prompt else script(prompt)

    fake.responder = echoing
    events = await collect(make_generator(fake.url, fake.flavor))
    drafts = [e.text for e in events if isinstance(e, DraftEvent)]
    assert drafts == ["Acme Copper cut its emissions by 30% in 2024."]
    summaries = [e.summary for e in events if isinstance(e, SummaryEvent)]
    assert summaries
    assert not any("Summarize the source" in s for s in summaries)
    final = final_of(events)
    assert [s.text for s in final.sentences] == drafts


class _Pieces:
    """A model that streams a fixed reply in pieces of ``size`` characters."""

    def __init__(self, text: str, size: int) -> None:
        self.text, self.size = text, size

    async def stream(self, system: str, user: str, **_: object) -> AsyncIterator[str]:
        for i in range(0, len(self.text), self.size):
            yield self.text[i : i + self.size]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8])
async def test_a_citation_marker_after_a_sentence_never_drafts_it_twice(size: int) -> None:
    reply = "Emissions fell 5%. [1][2] Next sentence here. [3]"
    generator = Generator(ExtractiveEngine(EMBEDDER), _Pieces(reply, size))  # type: ignore[arg-type]
    run = generator._start(Mode.LLM)
    written = [
        s async for s in generator._written_sentences(run, QUESTION, SOURCES, max_sentences=5)
    ]
    assert written == ["Emissions fell 5%.", "Next sentence here."]
