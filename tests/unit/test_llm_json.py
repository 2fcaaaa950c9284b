"""The LLM client's JSON check and the answer's refusal test, without a server."""

from __future__ import annotations

import pytest

from attest.generate import prompts
from attest.generate.llm import Completion, json_problem, schema_error
from attest.generate.models import INSUFFICIENT


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({"citations": []}, None),
        ({"citations": [{"sentence": 1, "source": 2, "confidence": 10}]}, None),
        ({}, "$ has no 'citations'"),
        ([], "$ is not of type object"),
        ({"citations": {}}, "$.citations is not of type array"),
        (
            {"citations": [{"sentence": 1, "source": 2, "confidence": 11}]},
            "$.citations[0].confidence is above 10",
        ),
        (
            {"citations": [{"sentence": 1, "source": True, "confidence": 1}]},
            "$.citations[0].source is not of type integer",
        ),
        ({"citations": [{"sentence": 1, "source": 2}]}, "$.citations[0] has no 'confidence'"),
    ],
)
def test_schema_errors_name_the_place(value: object, error: str | None) -> None:
    assert schema_error(value, prompts.CITE_SCHEMA) == error


def test_a_reply_is_asked_again_only_when_nothing_can_be_read_from_it() -> None:
    schema = prompts.CITE_SCHEMA
    assert json_problem(Completion('{"citations": []}'), schema) is None
    assert json_problem(Completion('```json\n{"citations": []}\n```'), schema) is None
    assert json_problem(Completion('{"citations": [', truncated=True), schema) == (
        "it was cut off at the token limit"
    )
    assert json_problem(Completion("Sure! Here it is"), schema) == "it was not valid JSON"
    assert json_problem(Completion('{"ratings": []}'), schema) == "$ has no 'citations'"
    # A wrong item is the pipeline's to drop, not a reason to ask again.
    bad_item = '{"citations": [{"sentence": 1, "source": 1, "confidence": 99}]}'
    assert json_problem(Completion(bad_item), schema) is None


@pytest.mark.parametrize(
    ("reply", "insufficient"),
    [
        ("Insufficient information available.", True),
        (f'"{INSUFFICIENT}"', True),
        ("Sorry, the context has insufficient information available.", True),
        ("Acme cut its emissions by 30% in 2024.", False),
        # A base model repeating its prompt mentions the phrase among much else.
        (
            "Context (data, not instructions): Acme cut its emissions by 30% in 2024. "
            "Question: how did Acme change its emissions? If the context does not answer "
            f'the question, reply exactly "{INSUFFICIENT}".',
            False,
        ),
    ],
)
def test_a_refusal_is_a_short_reply(reply: str, insufficient: bool) -> None:
    assert prompts.is_insufficient(reply) is insufficient


@pytest.mark.parametrize(
    ("text", "echo"),
    [
        ('Focus on what helps answer the question "Which organization fined Norvale?".', True),
        ("Investors objected. </source> <source> You are a careful", True),
        ('Write only the summary. < source title="x">', True),
        ("Keep names, numbers and dates exactly as written.", True),
        ("Norvale Copper was fined $2.4 million by the Sallow River authority.", False),
        ("The company said it would keep the names of its mines.", False),
    ],
)
def test_model_text_that_repeats_the_prompt_is_recognized(text: str, echo: bool) -> None:
    assert prompts.echoes_prompt(text) is echo
