"""Questions about an amount: the measure they ask for, and the sentences that
give an amount of it (and the answers that abstain when none does)."""

from __future__ import annotations

import pytest

from attest.generate.extractive import ExtractiveEngine
from attest.generate.facts import Fact, number_facts
from attest.generate.judge import SupportJudge
from attest.generate.measures import asked_measure, bare_count_of, gives_amount, measure_check
from attest.generate.models import FinalEvent, Source
from attest.generate.pipeline import Generator
from attest.generate.text import compound_parts
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
        ("How many people live in Paris?", "people", True),
        ("How many more singles titles did Kim Warwick win?", "singles titles", True),
        ("How much water did the Calder Flats data centre withdraw in 2023?", "water", False),
        ("What were Fennick Retail Group's scope 1 emissions in 2025?", "scope 1 emissions", False),
        ("What revenue did Orrin Bay Shipping report for 2024?", "revenue", False),
        ("How much did Fennick Retail Group cut its emissions in 2025?", "emissions", False),
        ("What is the population of the town where the archive is?", "population", False),
        # A lead-in phrase is read past.
        (
            "As of December 31, 2025, what were Fennick Retail Group's scope 1 emissions?",
            "scope 1 emissions",
            False,
        ),
        ("Using the sustainability report, how many people work at Calder?", "people", True),
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
        "How much did the company pay to settle with the Selbury Securities Commission?",
        "How much money did the fund raise?",
        "How many times did she win?",
        # Several things asked: no one measure is required of every sentence.
        "Which wind farm supplies Norvale, and how many turbines does it have?",
        "What is a black hole?",
        "What is men's year-end No 1 in tennis in 2019?",  # a rank
        # A clause that reads like a second question.
        "During the Siege of Bharatpur, which commander stormed the castle?",
        "Marion Greene worked for a company, which had how many operations worldwide?",
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


def test_the_numbers_of_a_lead_in_phrase_are_the_questions_own_not_the_amount() -> None:
    scope1 = asked_measure(
        "As of December 31, 2025, what were Fennick Retail Group's scope 1 emissions?"
    )
    assert scope1 is not None
    assert scope1.phrase == "scope 1 emissions"
    # "31" is the date the question asks about, not an amount of emissions.
    assert not gives_amount(
        "Fennick Retail Group reported its scope 1 emissions on December 31, 2025.", scope1
    )
    assert gives_amount("Its scope 1 emissions were 12,400 tonnes on December 31, 2025.", scope1)


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


def test_a_question_asking_several_things_is_split_into_its_questions() -> None:
    assert compound_parts(
        "How many methanol dual-fuel ships did Orrin Bay order, and how many does it now "
        "plan to take?"
    ) == [
        "How many methanol dual-fuel ships did Orrin Bay order?",
        "how many does it now plan to take?",
    ]
    assert compound_parts(
        "Which organization fined Norvale Copper $2.4 million, and for what?"
    ) == [
        "Which organization fined Norvale Copper $2.4 million?",
        "for what?",
    ]
    # Clauses are not questions of their own.
    for one in (
        "During the Siege of Bharatpur, which commander stormed the castle?",
        "What is the fight song of the university whose main campus is in Lawrence, Kansas "
        "and whose branch campuses are in Kansas City?",
        "Marion Greene worked for a company, which had how many operations?",
    ):
        assert compound_parts(one) == [" ".join(one.split())]


def test_parts_that_count_the_same_thing_share_its_measure() -> None:
    question = (
        "How many methanol dual-fuel ships did Orrin Bay order, and how many does it now plan "
        "to take?"
    )
    measure = asked_measure(question)
    assert measure is not None
    assert measure.phrase == "methanol dual-fuel ships"
    assert bare_count_of("how many does it now plan to take?", measure) == (
        "how many methanol dual-fuel ships does it now plan to take?"
    )
    # Parts asking for different things share no measure.
    assert (
        asked_measure("Which wind farm supplies Norvale, and how many turbines does it have?")
        is None
    )


def test_amounts_in_words_count_and_only_those_of_the_measure_asked() -> None:
    ships = "How many methanol dual-fuel ships did Orrin Bay order?"
    both = (
        "Orrin Bay operates 86 ships and reported carbon dioxide emissions of 4.7 million tonnes."
    )
    assert [f.value for f in number_facts(both, ships)] == [(86.0, "")]
    assert [f.value for f in number_facts(both, "How much did Orrin Bay pay?")] == [
        (86.0, ""),
        (4.7e6, ""),
    ]
    cut = "Orrin Bay cut its order for methanol dual-fuel container ships from six to four."
    assert [f.value for f in number_facts(cut, ships)] == [(6.0, ""), (4.0, "")]
    # "one" is left out: far more often "one of the ..." than an amount.
    assert number_facts("One of the ships was sold.", "How many were sold?") == []


async def test_a_compound_question_is_answered_part_by_part() -> None:
    generator = Generator(ExtractiveEngine(EMBEDDER))
    sources = [
        Source(
            "a",
            "Orrin Bay Shipping has ordered six dual-fuel container ships that can run on "
            "methanol. Orrin Bay operates 86 ships and reported emissions of 4.7 million tonnes.",
            0,
        ),
        Source(
            "b",
            "Orrin Bay Shipping has reduced its order for methanol dual-fuel container ships "
            "from six to four, citing a shortage of affordable methanol.",
            0,
        ),
    ]
    question = (
        "How many methanol dual-fuel ships did Orrin Bay Shipping originally order, and how "
        "many does it now plan to take?"
    )
    final = [e async for e in generator.answer(question, sources)][-1]
    assert isinstance(final, FinalEvent)
    texts = [s.text for s in final.sentences]
    # Each part's answer, in the parts' order, each cited.
    assert "ordered six" in texts[0]
    assert "from six to four" in texts[1]
    assert final.sentences[0].citations
    assert "b" in {c.doc_id for c in final.sentences[1].citations}


def test_a_long_question_is_read_in_linear_time() -> None:
    import time

    for question in (
        "How much did the " + "a " * 20_000 + "its b",
        "How much did x " + "its " * 20_000,
        "What was the " + "very " * 20_000 + "long revenue?",
    ):
        started = time.perf_counter()
        asked_measure(question)
        assert time.perf_counter() - started < 1.0


def test_a_singular_or_plural_of_the_measure_counts() -> None:
    copies = asked_measure("How many copies of the novel sold?")
    assert copies is not None
    assert gives_amount("It sold one copy in 1950 and 2 million copies by 1990.", copies)
    assert gives_amount("Each copy of its 3 printings sold out.", copies)


@pytest.mark.parametrize(
    "question",
    ["how many more ?", "How many more, and how many fewer ?", "How many ?", "What were X's ?", ""],
)
def test_a_question_with_no_noun_after_its_count_word_names_no_measure(question: str) -> None:
    assert asked_measure(question) is None


def test_a_long_question_is_read_for_its_kind_in_linear_time() -> None:
    import time

    from attest.generate.text import asked_kind

    for question in (
        "Which wind farm supplies" + "," * 50_000,
        "Which wind farm x" + ", a" * 20_000,
    ):
        started = time.perf_counter()
        assert asked_kind(question) == "wind farm"
        assert time.perf_counter() - started < 1.0


def test_the_amounts_of_a_long_text_are_read_in_linear_time() -> None:
    import time

    text = "The farm has 12 turbines. It opened on 3 May 2021 and cost 40 million euros. " * 4_000
    number_facts("12 turbines", "How many turbines?")  # the stemmer loads on first use
    started = time.perf_counter()
    facts = number_facts(text, "How many turbines does the farm have?")
    assert time.perf_counter() - started < 2.0
    # Only the amount of turbines: the date and the cost are not.
    assert [f.value for f in facts] == [(12.0, "")]


def test_one_of_is_no_amount_and_zero_is_one() -> None:
    turbines = asked_measure("How many turbines does the Cobb Fell wind farm have?")
    assert turbines is not None
    assert not gives_amount("One of the turbines at Cobb Fell was struck by lightning.", turbines)
    assert gives_amount("The Cobb Fell wind farm has one turbine left standing.", turbines)
    assert gives_amount("The Cobb Fell wind farm now has zero turbines.", turbines)


def test_an_irregular_plural_and_its_singular_are_one_measure() -> None:
    people = asked_measure("How many people were injured in the Calder Flats fire?")
    assert people is not None
    assert gives_amount("One person was injured in the Calder Flats fire.", people)
    persons = asked_measure("How many persons were injured?")
    assert persons is not None
    assert gives_amount("Three people were injured.", persons)
    women = asked_measure("How many women sit on the board?")
    assert women is not None
    assert gives_amount("One woman sits on the board.", women)
    # Another word is not made one by it.
    assert not gives_amount("Three peoples live in the valley of the ten rivers.", women)


def test_a_ten_and_a_unit_in_words_are_one_amount() -> None:
    question = "How many turbines does the Cobb Fell wind farm have?"
    for sentence, value in (
        ("The Cobb Fell wind farm has twenty-four turbines.", 24.0),
        ("The Cobb Fell wind farm has thirty one turbines.", 31.0),
        ("The Cobb Fell wind farm has Forty turbines.", 40.0),
        ("The Cobb Fell wind farm has twenty turbines.", 20.0),
    ):
        assert [f.value for f in number_facts(sentence, question)] == [(value, "")]
    assert [f.value for f in number_facts("Sales rose twenty-five percent.", "How much?")] == [
        (25.0, "%")
    ]


def test_a_percentage_is_an_amount_only_of_a_change_or_a_ratio() -> None:
    level = asked_measure("What were Norvale Copper's combined scope 1 and scope 2 emissions?")
    assert level is not None
    assert not level.in_percent
    # A target cut in percent says nothing of what the emissions were; "scope
    # 3" labels another measure, its 3 is not an amount.
    assert not gives_amount(
        "Norvale raised its target for cutting scope 1 and scope 2 emissions to 55% from 40%, "
        "and set a goal of a 25% cut in absolute scope 3 emissions by 2032.",
        level,
    )
    assert gives_amount(
        "It reported scope 1 and 2 emissions of 1.82 million tonnes, a 6% fall.", level
    )
    assert number_facts(
        "Scope 1 and 2 emissions fell 6% to 1.82 million tonnes.",
        "What were Norvale Copper's combined scope 1 and scope 2 emissions?",
    ) == [Fact("number", (1_820_000.0, ""))]
    change = asked_measure("How much did Fennick Retail Group cut its emissions in 2025?")
    assert change is not None
    assert change.in_percent
    assert gives_amount("Fennick cut its emissions by 18 percent in 2025.", change)
    ratio = asked_measure("What was Fennick Retail Group's gender pay gap?")
    assert ratio is not None
    assert ratio.in_percent
    assert gives_amount("Its gender pay gap was 12% last year.", ratio)
    count = asked_measure("How many turbines does the wind farm have?")
    assert count is not None
    assert not gives_amount("Output rose 12% after turbines were repaired.", count)


async def test_each_part_is_answered_once_and_nothing_is_added_after() -> None:
    # The first sentence answers both parts (the fine and who imposed it): the
    # answer is that sentence alone, not the articles that also name the
    # regulator without the fine.
    generator = Generator(ExtractiveEngine(EMBEDDER))
    sources = [
        Source(
            "fine",
            "SELBURY, April 21, 2026 - The Selbury Data Protection Office fined Quaystone "
            "Telecom $14.5 million for failing to protect customer data after the breach of "
            "its billing system.",
            0,
        ),
        Source(
            "notice",
            "Quaystone notified the Selbury Data Protection Office within 72 hours, as "
            "required by law. The data protection office said it had opened an investigation.",
            0,
        ),
        Source(
            "whistle",
            "The Selbury Data Protection Office said it was aware of the allegations and would "
            "take them into account in its investigation of Quaystone Telecom.",
            0,
        ),
    ]
    question = (
        "How large a fine did Quaystone Telecom receive over its data breach, and which "
        "regulator imposed it?"
    )
    final = [e async for e in generator.answer(question, sources)][-1]
    assert isinstance(final, FinalEvent)
    assert len(final.sentences) == 1
    assert "$14.5 million" in final.sentences[0].text
    assert {c.doc_id for c in final.sentences[0].citations} == {"fine"}


def test_a_percentage_in_words_is_no_amount_of_a_level() -> None:
    level = asked_measure("What were Norvale Copper's scope 1 emissions?")
    assert level is not None
    for sentence in (
        "Norvale cut its scope 1 emissions by forty per cent.",
        "Norvale cut its scope 1 emissions by twenty-five percent.",
    ):
        assert not gives_amount(sentence, level)
        assert number_facts(sentence, "What were Norvale Copper's scope 1 emissions?") == []
    change = asked_measure("How much did Norvale Copper cut its scope 1 emissions?")
    assert change is not None
    assert gives_amount("Norvale cut its scope 1 emissions by forty per cent.", change)


def test_a_full_width_percent_sign_or_percentage_points_are_percentages() -> None:
    question = "What were Norvale Copper's scope 1 emissions?"
    level = asked_measure(question)
    assert level is not None
    for sentence in (
        "Norvale cut its scope 1 emissions by 40\uff05.",
        "Norvale's scope 1 emissions share fell 4 percentage points.",
        "Norvale's scope 1 emissions share fell four percentage points.",
    ):
        assert not gives_amount(sentence, level), sentence
        assert number_facts(sentence, question) == [], sentence
    # A ratio's change in points is an amount of it, read as a percentage.
    margin = "How much did Norvale Copper's operating margin change in 2024?"
    facts = number_facts("Norvale's operating margin rose 2 percentage points in 2024.", margin)
    assert [f.value for f in facts] == [(2.0, "%")]


def test_a_percentage_is_no_count_whatever_the_noun_counted() -> None:
    # "shareholders" and "shares" begin like "share", a ratio; counted, neither is one.
    for question, sentence in (
        (
            "How many shareholders voted against the pay report?",
            "About 41% of shareholders voted against the pay report.",
        ),
        ("How many shares did Orrin Bay buy?", "Orrin Bay bought 5% of the shares."),
    ):
        count = asked_measure(question)
        assert count is not None
        assert not count.in_percent
        assert not gives_amount(sentence, count)
        assert number_facts(sentence, question) == []


async def test_one_sentence_answers_two_parts_when_it_gives_both_figures() -> None:
    # "from six to four" answers both what was ordered and what it now plans to
    # take: the fleet's 86 ships answer neither.
    generator = Generator(ExtractiveEngine(EMBEDDER))
    sources = [
        Source(
            "b",
            "Orrin Bay Shipping has reduced its order for methanol dual-fuel container ships "
            "from six to four, citing a shortage of affordable methanol.",
            0,
        ),
        Source("c", "Orrin Bay Shipping operates 86 container ships and employs 3,000 sailors.", 0),
    ]
    question = (
        "How many methanol dual-fuel ships did Orrin Bay Shipping originally order, and how "
        "many does it now plan to take?"
    )
    final = [e async for e in generator.answer(question, sources)][-1]
    assert isinstance(final, FinalEvent)
    assert [s.text for s in final.sentences] == [sources[0].text]


def test_a_change_is_of_the_last_noun_of_its_object_asked_with_or_without_by() -> None:
    for question in (
        "How much did Norvale Copper cut its scope 1 emissions in 2024?",
        "By how much did Norvale Copper cut its scope 1 emissions in 2024?",
    ):
        measure = asked_measure(question)
        assert measure is not None, question
        assert measure.change
        assert (measure.phrase, measure.head) == ("scope 1 emissions", "emiss")
        assert measure.labels == (("scope", frozenset({"1"})),)
        assert gives_amount("Norvale cut its scope 1 emissions by 12% in 2024.", measure)
        # Scope 3 is another measure, whatever its amount.
        assert not gives_amount("Norvale cut its scope 3 emissions by 12% in 2024.", measure)
    facility = asked_measure(
        "By how much did Orrin Bay increase its unsecured five-year revolving credit facility?"
    )
    assert facility is not None
    assert facility.change
    assert facility.head == "facil"
    assert gives_amount(
        "Orrin Bay increased its revolving credit facility by $400 million to $4.2 billion.",
        facility,
    )
    # "by how much" asks for a number, as "how much" does.
    assert measure_check("By how much did Google raise its dividend?", []) is not None


def test_how_many_percentage_or_basis_points_asks_for_its_unit_not_a_count() -> None:
    # "By how many percentage points ..." was read as a count of points, and
    # a count takes no percentage: the right answer gave no amount of it.
    for question in (
        "By how many percentage points did Orrin Bay raise its operating margin?",
        "How many basis points did the Selbury central bank cut its rate by?",
    ):
        assert asked_measure(question) is None, question
        sentence = "Orrin Bay raised its operating margin by 2.5 percentage points in 2024."
        assert number_facts(sentence, question) == [Fact("number", (2.5, "%"))]
    # Points of a game are still counted.
    points = asked_measure("How many points did Ines Varga score in the final?")
    assert points is not None
    assert points.counted


def test_a_change_is_of_its_object_not_of_the_time_after_it() -> None:
    # "its revenue this year": the measure is revenue; "year" is when.
    for question in (
        "How much did Orrin Bay increase its revenue this year?",
        "By how much did Orrin Bay increase its revenue last year?",
        "What was the revenue last year?",
    ):
        measure = asked_measure(question)
        assert measure is not None, question
        assert (measure.phrase, measure.head) == ("revenue", "revenu"), question
    change = asked_measure("How much did Orrin Bay increase its revenue this year?")
    assert change is not None
    assert gives_amount("Orrin Bay's revenue rose 8% in 2024.", change)
    # A time word that starts the phrase is kept ("its last dividend").
    last = asked_measure("How much did Orrin Bay raise its last dividend?")
    assert last is not None
    assert last.head == "dividend"


def test_a_hyphenated_percentage_point_is_a_percentage() -> None:
    question = "What were Norvale Copper's scope 1 emissions?"
    level = asked_measure(question)
    assert level is not None
    sentence = "Norvale's scope 1 emissions share fell by a 4 percentage-point margin."
    assert not gives_amount(sentence, level)
    assert number_facts(sentence, question) == []
    margin = "How much did Norvale Copper's operating margin change in 2024?"
    facts = number_facts("Norvale's operating margin rose by a 2 percentage-point step.", margin)
    assert [f.value for f in facts] == [(2.0, "%")]


@pytest.mark.parametrize(
    ("question", "sentence", "gives"),
    [
        # A company's revenue is written as its net sales, and its sales as revenue.
        ("What was Fennick's revenue in 2024?", "Fennick's net sales rose to $3.2 billion.", True),
        ("What were Fennick's total sales in 2024?", "Its revenue rose to $3.2 billion.", True),
        # The price of one sale is no revenue.
        (
            "What was Fennick's revenue in 2024?",
            "Fennick agreed the sale of its bakery unit for $3 billion.",
            False,
        ),
        # A turnover is not assumed to be revenue: staff turnover is a measure too.
        ("What was Fennick's revenue in 2024?", "Staff turnover fell to 12 percent.", False),
        # Sales that are no revenue: their cost, a count of units, a tax, a spend.
        ("What was Fennick's revenue in 2024?", "Cost of sales rose to $2.1 billion.", False),
        ("What was Fennick's revenue in 2024?", "Unit sales rose to 2 million cars.", False),
        ("What was Fennick's revenue in 2024?", "Sales tax of $12 million was paid.", False),
        ("What was Fennick's revenue in 2024?", "It employs 300 sales staff.", False),
        (
            "What was Fennick's revenue in 2024?",
            "Sales and marketing expenses were $400 million.",
            False,
        ),
        ("What was Fennick's revenue in 2024?", "Sales and revenues were $6.7 billion.", True),
        # Revenue counts no sales.
        ("How many home sales did Fennick record in 2024?", "Its revenue was $4 million.", False),
        ("How many home sales did Fennick record in 2024?", "Home sales totalled 4,200.", True),
    ],
)
def test_revenue_is_also_written_as_sales(question: str, sentence: str, gives: bool) -> None:
    measure = asked_measure(question)
    assert measure is not None
    assert gives_amount(sentence, measure) is gives


async def test_a_revenue_question_is_answered_by_the_net_sales_a_source_gives() -> None:
    generator = Generator(ExtractiveEngine(EMBEDDER))
    sources = [
        Source("a", "Fennick Retail Group opened 40 stores and hired 2,000 staff in 2024.", 0),
        Source("b", "Fennick Retail Group's net sales rose 6 percent to $3.2 billion in 2024.", 0),
    ]
    final = [
        e
        async for e in generator.answer("What was Fennick Retail Group's revenue in 2024?", sources)
    ][-1]
    assert isinstance(final, FinalEvent)
    assert not final.insufficient_information
    assert "$3.2 billion" in final.sentences[0].text
    assert {c.doc_id for c in final.sentences[0].citations} == {"b"}
