"""The generator on a real model: llama.cpp's OpenAI-compatible server with Gemma 3 270M.

`.ci/start-llm.sh` starts the server and `.ci/test.sh` exports ATTEST_TEST_LLM_URL;
under CI=true a missing server fails these tests instead of skipping them.

Gemma 3 270M is a base model: it repeats its prompt instead of answering and
rates every citation 0. What these tests check is what must hold whatever the
model writes, on its real output: every sentence leaves cited or marked
unsupported, the answer streams as drafts while the model writes it,
citations point only at sources the pipeline was given, every
confidence is an integer in 0-10, a weak sentence is searched again and
revised in the event stream, the calls per answer stay within the documented
bound, and output cut short at the token limit is asked for once more and
then discarded, never a crash. Calls are greedy (temperature 0) with a fixed
seed, so the output is the same on every run. The model writes about 7
tokens a second on two busy cores and far fewer under a JSON grammar, so
sources are few and short and every reply is capped at a few dozen tokens.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from attest.cli import main
from attest.generate import prompts
from attest.generate.extractive import ExtractiveEngine
from attest.generate.llm import LLMClient, LLMSettings, create_client
from attest.generate.models import (
    DraftEvent,
    Event,
    FinalEvent,
    Mode,
    RevisionEvent,
    Sentence,
    SentenceEvent,
    Source,
    SummaryEvent,
)
from attest.generate.pipeline import AnswerOptions, Generator, PipelineSettings
from attest.semantic.embedding import Embedder
from tests.conftest import require_server

pytestmark = [
    pytest.mark.integration,
    pytest.mark.llm,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

EMBEDDER = Embedder()  # used only where the pipeline consults the support judge

SOURCES = [
    Source("norvale-1", "Norvale Copper cut its carbon emissions by 30% in 2025.", 0),
    Source("norvale-2", "Norvale Copper runs two copper mines in northern Chile.", 0),
]
FOUND = Source("norvale-9", "Norvale Copper reported lower emissions at both of its mines.", 0)
QUESTION = "How did Norvale Copper's emissions change in 2025?"
THRESHOLD = 5
BATCH = 8


def local_settings(url: str, max_new_tokens: int) -> LLMSettings:
    """How the pipeline talks to the local server (as `attest serve llm` documents)."""
    return LLMSettings(
        kind="openai",
        url=url,
        model="gemma-3-270m",
        response_format="json_object",  # llama.cpp's form of a JSON-schema constraint
        system_role=False,  # Gemma's template has no system role
        max_new_tokens=max_new_tokens,
        max_concurrency=1,  # the server decodes one request at a time
        max_attempts=2,
        timeout_seconds=300,
        first_token_seconds=60,
        seconds_per_token=2.0,  # grammar-constrained tokens are slow on two cores
    )


def generator_for(client: LLMClient) -> Generator:
    return Generator(
        ExtractiveEngine(EMBEDDER),
        client,
        PipelineSettings(
            summary_sentences=1,
            cite_batch_size=BATCH,
            max_citations=2,
            fallback_to_extractive=False,  # a dead server must fail here, not pass extractively
            summarize_short_sources=True,  # the model summarizes even one-sentence sources
            # The base model repeats its prompt: kept here so that the rest of the
            # pipeline runs on its output (the drop is tested on its own below).
            drop_prompt_echoes=False,
        ),
    )


@pytest.fixture(scope="module")
def llm_url() -> str:
    return require_server("ATTEST_TEST_LLM_URL")


async def answer_events(
    generator: Generator, searched: list[str] | None = None
) -> AsyncIterator[Event]:
    async def search(query: str, top_k: int) -> list[Source]:
        if searched is not None:
            searched.append(query)
        return [SOURCES[1], FOUND][: top_k + 1]

    options = AnswerOptions(
        confidence_threshold=THRESHOLD, max_researches=1, research_top_k=2, max_sentences=2
    )
    async for event in generator.answer(QUESTION, SOURCES, options, search):
        yield event


def assert_citations_are_sound(events: list[Event]) -> FinalEvent:
    """Every sentence, as emitted, revised and final, is cited soundly or unsupported."""
    final = events[-1]
    assert isinstance(final, FinalEvent)
    assert (final.mode, final.degraded_reason) == (Mode.LLM, "")
    sentences = [e.sentence for e in events if isinstance(e, SentenceEvent | RevisionEvent)]
    for sentence in [*sentences, *final.sentences]:
        # Cited, or unsupported: nothing in between.
        assert sentence.unsupported == (not sentence.citations)
        for c in sentence.citations:
            assert 0 <= c.source_index < len(final.sources)
            source = final.sources[c.source_index]
            assert (c.doc_id, c.passage_index) == (source.doc_id, source.passage_index)
            assert isinstance(c.confidence, int)
            assert 0 < c.confidence <= 10  # a 0 rating is not a citation
    assert final.unsupported_sentences == sum(s.unsupported for s in final.sentences)
    return final


def answered(events: list[Event]) -> list[Sentence]:
    """The sentences of the model's answer, as first emitted (before any revision)."""
    first = next((i for i, e in enumerate(events) if isinstance(e, RevisionEvent)), len(events))
    return [e.sentence for e in events[:first] if isinstance(e, SentenceEvent)]


async def test_an_answer_from_the_real_model_keeps_every_guarantee(llm_url: str) -> None:
    client = create_client(local_settings(llm_url, max_new_tokens=32))
    generator = generator_for(client)
    searched: list[str] = []
    events = [e async for e in answer_events(generator, searched)]
    await generator.close()
    final = assert_citations_are_sound(events)

    # The model summarized each source and its answer became sentences.
    summaries = [e for e in events if isinstance(e, SummaryEvent)]
    assert [s.source_index for s in summaries] == [0, 1]
    assert all(s.summary.strip() for s in summaries)
    assert client.completion_tokens > 0
    emitted = answered(events)
    assert 1 <= len(emitted) <= 2
    assert [s.index for s in emitted] == list(range(len(emitted)))

    # The answer was streamed as the model wrote it: a draft per sentence, in
    # order, each followed later by its cited sentence with the same text.
    drafts = [e for e in events if isinstance(e, DraftEvent)]
    assert [(d.index, d.text) for d in drafts] == [(s.index, s.text) for s in emitted]
    first_sentence = next(i for i, e in enumerate(events) if isinstance(e, SentenceEvent))
    assert events.index(drafts[0]) < first_sentence

    # The weakest sentence below the threshold was searched again, with its own text,
    # and revised after it was first emitted, citing only sources the answer now has.
    weak = min(emitted, key=lambda s: (s.confidence, s.index))
    assert weak.confidence < THRESHOLD, "the base model rated a citation above the threshold"
    assert searched == [weak.text]
    revision = next(e for e in events if isinstance(e, RevisionEvent))
    assert (revision.sentence_index, revision.query) == (weak.index, weak.text)
    assert revision.previous_confidence == weak.confidence
    assert [s.doc_id for s in revision.added_sources] == [FOUND.doc_id]
    assert final.sources[revision.first_added_source_index].doc_id == FOUND.doc_id
    assert final.researches == 1

    # Calls per answer within the documented bound: N summaries + 1 answer
    # + ceil(S / batch) citation calls + R re-searches x (K new sources + 1 citation
    # call); HTTP requests within the same bound with the JSON calls doubled.
    n, s, r, k = len(SOURCES), len(emitted), final.researches, len(revision.added_sources)
    json_calls = math.ceil(s / BATCH) + r
    assert final.llm_calls <= n + 1 + json_calls + r * k
    assert final.llm_calls <= client.requests <= n + 1 + 2 * json_calls + r * k
    assert client.requests - final.llm_calls <= client.invalid_outputs


async def test_json_cut_off_by_a_tiny_token_limit_is_retried_once_then_discarded(
    llm_url: str,
) -> None:
    # Six tokens cannot hold a citation object: the server stops mid-JSON.
    client = create_client(local_settings(llm_url, max_new_tokens=6))
    generator = generator_for(client)
    events = [e async for e in answer_events(generator)]
    final = assert_citations_are_sound(events)
    emitted = answered(events)
    assert emitted
    # Every citation call was asked twice (with twice the tokens the second time),
    # failed twice, and left its sentences unsupported.
    json_calls = math.ceil(len(emitted) / BATCH) + final.researches
    assert client.invalid_outputs == 2 * json_calls
    assert client.requests == final.llm_calls + json_calls
    assert all(s.unsupported for s in [*emitted, *final.sentences])
    assert final.discarded_citations >= json_calls

    # The judge's JSON, cut off the same way, gives a rejected judgement, not an error.
    judgements, mode, _, calls = await generator.judge(
        [emitted[0].text], SOURCES[:1], [(0, 0)], mode=Mode.LLM
    )
    await generator.close()
    assert (mode, calls) == (Mode.LLM, 1)
    (judgement,) = judgements
    assert (judgement.confidence, judgement.rejected_reason) == (0, "unreadable output")


async def test_the_server_keeps_to_the_json_schema_it_is_given(llm_url: str) -> None:
    client = create_client(local_settings(llm_url, max_new_tokens=40))
    text = await client.generate(
        prompts.SYSTEM,
        prompts.judge_prompt([(QUESTION, SOURCES[0].text)]),
        schema=prompts.JUDGE_SCHEMA,
    )
    await client.close()
    ratings = prompts.parse_judge(text)
    # Grammar-constrained output parses; whatever the model rated, the pipeline keeps
    # only integers in 0-10 for pairs that exist.
    assert ratings is not None, text
    for rating in ratings:
        if prompts.valid_number(rating.sentence, 1) is not None:
            value = prompts.valid_confidence(rating.confidence)
            assert value is None or 0 <= value <= 10


async def test_a_model_repeating_its_prompt_gives_no_answer_sentence(llm_url: str) -> None:
    """By default what the base model writes back of its prompt (instructions,
    source delimiters) is dropped before it is drafted: no sentence of the
    answer or summary repeats an instruction, and an answer with nothing else
    says there is insufficient information."""
    client = create_client(local_settings(llm_url, max_new_tokens=32))
    generator = Generator(
        ExtractiveEngine(EMBEDDER),
        client,
        PipelineSettings(summary_sentences=1, max_citations=2, fallback_to_extractive=False),
    )
    events = [e async for e in generator.answer(QUESTION, SOURCES, AnswerOptions(max_sentences=2))]
    await generator.close()
    final = assert_citations_are_sound(events)
    written = [e.text for e in events if isinstance(e, DraftEvent)]
    summaries = [e.summary for e in events if isinstance(e, SummaryEvent)]
    assert not any(prompts.echoes_prompt(t) for t in [*written, *summaries])
    assert all(not prompts.echoes_prompt(s.text) for s in final.sentences)
    assert client.completion_tokens > 0  # the model did write
    if not written:
        assert final.insufficient_information


def test_eval_qa_in_llm_mode_reports_the_model_cost(llm_url: str, tmp_path: Path) -> None:
    """`attest eval qa --mode llm` on the real model (two RGB-style questions):
    the table carries LLM calls, tokens and invalid outputs, and the JSON
    record of every answer holds only citations to the question's passages."""
    dataset = tmp_path / "two.jsonl"
    rows = [
        {
            "id": "0",
            "question": QUESTION,
            "answers": ["30%"],
            "passages": [
                {"id": s.doc_id, "title": "", "text": s.text, "gold": s is SOURCES[0]}
                for s in SOURCES
            ],
        },
        {
            "id": "1",
            "question": "Where does Norvale Copper run its mines?",
            "answers": ["Chile"],
            "passages": [
                {"id": f"c-{s.doc_id}", "title": "", "text": s.text, "gold": s is SOURCES[1]}
                for s in SOURCES
            ],
        },
    ]
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    output = tmp_path / "out.json"
    env = {
        **local_env(llm_url),
        "ATTEST_GENERATE_LLM__MAX_NEW_TOKENS": "32",
        "ATTEST_GENERATE_PIPELINE__SUMMARY_SENTENCES": "1",
    }
    result = CliRunner().invoke(
        main,
        ["eval", "qa", "--dataset", str(dataset), "--mode", "llm", "--output", str(output)],
        env=env,
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "mode=llm" in result.output
    assert "invalid model outputs per call" in result.output
    report = json.loads(output.read_text(encoding="utf-8"))
    assert report["llm_calls_per_answer"] >= 1
    assert report["completion_tokens_per_answer"] > 0
    assert 0.0 <= report["invalid_output_rate"] <= 2.0
    passages = {p["id"] for r in rows for p in r["passages"]}  # type: ignore[attr-defined]
    for record in report["per_question"]:
        assert set(record["cited"]) <= passages
        assert all(0 <= c <= 10 for cs in record["confidences"] for c in cs)


def local_env(url: str) -> dict[str, str]:
    """The settings `attest serve llm` prints for Gemma, with this test's deadlines."""
    return {
        "ATTEST_GENERATE_LLM__URL": url,
        "ATTEST_GENERATE_LLM__KIND": "openai",
        "ATTEST_GENERATE_LLM__RESPONSE_FORMAT": "json_object",
        "ATTEST_GENERATE_LLM__SYSTEM_ROLE": "false",
        "ATTEST_GENERATE_LLM__MAX_CONCURRENCY": "1",
        "ATTEST_GENERATE_LLM__TIMEOUT_SECONDS": "300",
        "ATTEST_GENERATE_LLM__FIRST_TOKEN_SECONDS": "60",
        "ATTEST_GENERATE_LLM__SECONDS_PER_TOKEN": "2",
    }
