"""Questions about an amount: the measure they ask for, and the sentences that
give an amount of it (and the answers that abstain when none does)."""

from __future__ import annotations

import pytest

from attest.generate.extractive import ExtractiveEngine
from attest.generate.judge import SupportJudge
from attest.generate.measures import asked_measure, gives_amount, measure_check
from attest.generate.models import FinalEvent, Source
from attest.generate.pipeline import Generator
from attest.semantic.embedding import Embedder

EMBEDDER = Embedder()


@pytest.mark.parametrize(
    ("question", "phrase", "counted"),
    [
        ("How many turbines does Stillwind Energy's Cobb Fell wind farm have?", "turbines", True),
        (
            "How many methanol dual-fuel ships did Orrin Bay order?",
            "methanol dual-fuel ships",
            True,
        ),
        ("How many copies of the novel sold?", "copies", True),
        ("How much water did the Calder Flats data centre withdraw in 2023?", "water", False),
        ("What were Fennick Retail Group's scope 1 emissions in 2025?", "scope 1 emissions", False),
        ("What revenue did Orrin Bay Shipping report for 2024?", "revenue", False),
        ("What is the population of the town where the archive is?", "population", False),
    ],
)
def test_the_measure_is_read_from_the_question_form(
    question: str, phrase: str, counted: bool
) -> None:
    measure = asked_measure(question)
    assert measure is not None
    assert measure.phrase == phrase
    assert measure.counted is counted


@pytest.mark.parametrize(
    "question",
    [
        "Who became the independent chair of Marrowgate Bank in 2025?",  # a name
        "When did Norvale Copper sign the agreement?",  # a date
        "What is the release date of the game?",  # a date
        "How much did Google pay for YouTube?",  # the unit is the answer
        "How much money did the fund raise?",
        "How many times did she win?",
        # Several things asked: no one measure is required of every sentence.
        "Which wind farm supplies Norvale, and how many turbines does it have?",
        "What is a black hole?",
        "What is men's year-end No 1 in tennis in 2019?",  # a rank
        # A kind or a name asked by "what <noun> did/does".
        "What type of structure does 277 Park Avenue have?",
        "What film did Joby Harold direct?",
    ],
)
def test_questions_that_ask_for_no_measure_name_none(question: str) -> None:
    assert asked_measure(question) is None


def test_a_sentence_gives_an_amount_of_the_measure_not_just_a_number() -> None:
    turbines = asked_measure("How many turbines does the Cobb Fell wind farm have?")
    assert turbines is not None
    assert gives_amount("Construction began on its 48-turbine Brannock Moor wind farm.", turbines)
    assert gives_amount("The site has six onshore wind turbines.", turbines)
    # Turbines and a number, but not a number of turbines.
    assert not gives_amount(
        "COBB FELL, Oct. 9, 2025 - Stillwind will switch off turbines at its Cobb Fell "
        "wind farm for up to two hours around dusk.",
        turbines,
    )
    revenue = asked_measure("What revenue did Orrin Bay Shipping report for 2024?")
    assert revenue is not None
    assert gives_amount("Orrin Bay's revenue rose 4% to $2.1 billion in 2024.", revenue)
    assert not gives_amount("The report broke down revenue by country for 2024.", revenue)
    assert not gives_amount("Scope 1 emissions were 4.7 million tonnes in 2024.", revenue)


def test_the_measures_numbered_labels_and_the_questions_numbers_are_not_the_amount() -> None:
    scope1 = asked_measure("What were Marrowgate Bank's scope 1 emissions in 2024?")
    assert scope1 is not None
    assert gives_amount("Scope 1 emissions were 12,400 tonnes in 2024.", scope1)
    # Another measure of emissions: no "scope 1" in it.
    assert not gives_amount("Financed emissions fell to 24.5 million tonnes in 2024.", scope1)
    # "scope 1" and "2024" are the question's own numbers, not an amount.
    assert not gives_amount("Its scope 1 emissions rose in 2024.", scope1)


def test_a_measure_the_question_does_not_type_is_one_when_the_sources_count_it() -> None:
    question = "What were Marrowgate Bank's scope 1 emissions in 2024?"
    counted = ["Marrowgate's scope 1 emissions were 3,100 tonnes in 2024."]
    assert measure_check(question, counted) is not None
    # "nationality" is never written with an amount: not a measure, not checked.
    assert measure_check("What was Ines Varga's nationality?", ["Ines Varga is Hungarian."]) is None


def test_the_judge_rates_a_sentence_without_the_amount_as_no_answer() -> None:
    question = "How many turbines does the Cobb Fell wind farm have?"
    sentences = [
        "Stillwind will switch off turbines at its Cobb Fell wind farm for up to two hours.",
        "The Cobb Fell wind farm has 31 turbines on the ridge.",
    ]
    rated = SupportJudge(EMBEDDER).judge(question, sentences, sentences)
    assert rated[0].max() == 0.0
    assert rated[1, 1] > 0.3


async def test_a_question_about_an_amount_no_source_gives_abstains_and_names_the_measure() -> None:
    generator = Generator(ExtractiveEngine(EMBEDDER))
    sources = [
        Source(
            "a",
            "Stillwind Energy will switch off turbines at its Cobb Fell wind farm for up to "
            "two hours around dusk after a study recorded 23 bird deaths over 12 months.",
            0,
        ),
        Source("b", "The Cobb Fell wind farm opened in 2019 on a ridge above the valley.", 0),
    ]
    question = "How many turbines does Stillwind Energy's Cobb Fell wind farm have?"
    final = [e async for e in generator.answer(question, sources)][-1]
    assert isinstance(final, FinalEvent)
    assert final.insufficient_information
    assert final.answer.endswith("no source gives the number of turbines asked for.")


async def test_a_question_about_an_amount_a_source_gives_is_answered_with_it() -> None:
    generator = Generator(ExtractiveEngine(EMBEDDER))
    sources = [
        Source(
            "a",
            "Stillwind Energy will switch off turbines at its Cobb Fell wind farm for up to "
            "two hours around dusk.",
            0,
        ),
        Source("b", "Stillwind's Cobb Fell wind farm has 31 turbines on the ridge.", 0),
    ]
    question = "How many turbines does Stillwind Energy's Cobb Fell wind farm have?"
    final = [e async for e in generator.answer(question, sources)][-1]
    assert isinstance(final, FinalEvent)
    assert not final.insufficient_information
    assert "31 turbines" in final.sentences[0].text
    assert final.sentences[0].citations[0].doc_id == "b"
