"""The support judge: features, the shipped models, the combination rule,
withdrawal and abstention in the pipeline."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from attest.generate.extractive import ExtractiveEngine, ExtractiveSettings
from attest.generate.judge import (
    FEATURES,
    PARTIAL_SUPPORT,
    RGB_ANSWER_FLOOR,
    SENTENCE_FEATURES,
    SUPPORT_FEATURES,
    WEIGHTS_FILE,
    JudgeModel,
    JudgeModels,
    SupportJudge,
    combine,
    grounded,
    lacks_figures,
    relation_cover,
    relation_stems,
    same_word,
    sentence_features,
    support_features,
    to_confidence,
)
from attest.generate.models import FinalEvent, RevisionEvent, Source
from attest.generate.pipeline import Generator
from attest.semantic.embedding import Embedder

EMBEDDER = Embedder()
JUDGE = SupportJudge(EMBEDDER)
F = {name: k for k, name in enumerate(FEATURES)}

QUESTION = "Who won the 2019 Aldermoor Prize?"
SOURCES = [
    "The 2019 Aldermoor Prize went to the poet Ines Varga for her fourth book.",
    "Ines Varga won the Aldermoor Prize in 2019 for her collected poems.",
    "Judges praised Ines Varga, the 2019 Aldermoor Prize winner, for her restraint.",
    "Tomas Brandt won the Aldermoor Prize for his first novel.",
    "Rainfall in the valley was average this quarter.",
]


def test_the_models_ship_and_name_their_features() -> None:
    models = JudgeModels.load()
    assert models.support.features == SUPPORT_FEATURES
    assert models.answer.features == SENTENCE_FEATURES
    data = json.loads(WEIGHTS_FILE.read_text(encoding="utf-8"))
    data["support"]["features"] = data["support"]["features"][::-1]
    with pytest.raises(ValueError, match="features"):
        JudgeModels.from_json(data)


def test_the_claim_weights_count_for_support() -> None:
    # Stating more of the sentence is never evidence against support.
    weights = dict(zip(SUPPORT_FEATURES, JudgeModels.load().support.weights, strict=True))
    for name in ("semantic", "claims", "states_answer"):
        assert weights[name] > 0, name


def test_features_read_claims_numbers_and_negation() -> None:
    x = JUDGE.features(
        "How much did Norvale Copper cut its emissions in 2025?",
        ["Norvale Copper cut its emissions by 30 percent in 2025."],
        [
            "Norvale Copper said it cut emissions by 30 percent in 2025.",
            "Norvale Copper said it cut emissions by 12 percent in 2025.",
            "Norvale Copper did not cut its emissions in 2025.",
        ],
    )[0]
    assert x[0, F["states_answer"]] == 1.0
    assert x[1, F["states_answer"]] == 0.0
    assert x[0, F["missing_number"]] == 0.0
    assert x[1, F["missing_number"]] == 1.0, "30 is not in the second source"
    assert x[2, F["negation"]] == 1.0
    assert x[0, F["negation"]] == 0.0
    assert x[0, F["claims"]] > x[1, F["claims"]]


def test_the_relation_asked_is_what_the_question_says_beyond_its_names() -> None:
    assert relation_stems("Who won the women's singles Wimbledon in 2019?") == {
        "won",
        "women",
        "singl",
    }
    assert relation_stems("Who is the director of the Avatar movie?") == {"director", "movi"}
    assert relation_stems("Norvale Copper?") == set()
    # Word families, not spellings: a shared prefix of four letters or more.
    assert same_word("acquir", "acquisit")
    assert same_word("direct", "director")
    assert not same_word("won", "win")
    assert not same_word("cart", "carbon")


def test_a_sentence_naming_the_event_but_not_the_relation_answers_less() -> None:
    question = "Who won the women's singles Wimbledon in 2019?"
    heading = "Wimbledon 2019: women's singles draw with Serena Williams and Johanna Konta."
    answer = "Simona Halep won the women's singles at Wimbledon in 2019."
    relation = relation_stems(question)
    assert relation_cover(relation, {"wimbledon", "2019", "women", "singl"}) == pytest.approx(2 / 3)
    x = JUDGE.features(question, [heading, answer], [heading, answer])
    assert x[0, 0, F["relation_in_sentence"]] == pytest.approx(2 / 3)
    assert x[1, 0, F["relation_in_sentence"]] == 1.0
    # The shipped answer model counts it: the heading, as well supported by
    # its own source, is the less likely answer.
    weights = dict(zip(SENTENCE_FEATURES, JUDGE.models.answer.weights, strict=True))
    assert weights["relation_in_sentence"] > 0
    conf = JUDGE.judge(question, [heading, answer], [heading, answer])
    assert conf[1, 1] > conf[0, 0]


def test_a_quoted_sentence_answering_another_question_is_not_confident() -> None:
    sentences = [SOURCES[0], SOURCES[3]]
    conf = np.rint(10 * JUDGE.judge(QUESTION, sentences, SOURCES)).astype(int)
    # The answer the sources agree on, stated by its own and other sources.
    assert conf[0, 0] >= 7
    assert conf[0, 1] >= 7
    # A sentence taken word for word from a source, naming a winner no other
    # source backs and no year: its own source is not a confident citation.
    assert conf[1, 3] <= 5
    assert conf[0, 0] - conf[1, 3] >= 3
    # Unrelated sources support nothing.
    assert conf[0, 4] < 3
    assert conf[1, 4] < 3


def test_sources_that_state_no_answer_rate_nothing_and_the_answer_abstains() -> None:
    # About the prize, but none says who won it in 2019: the best sentence's
    # answer probability is below the floor, so no source is a citation.
    about = [
        "The 2019 Aldermoor Prize ceremony was delayed by a week.",
        "The Aldermoor Prize is awarded every year for a book of poems.",
        "Tickets for the Aldermoor Prize ceremony sold out within a day.",
    ]
    sentences = about[:2]
    answer = JUDGE.models.answer.score(
        sentence_features(
            JUDGE.features(QUESTION, sentences, about),
            JUDGE.models.support.score(
                support_features(JUDGE.features(QUESTION, sentences, about))
            ),
        )
    )
    floored = SupportJudge(EMBEDDER, JUDGE.models, answer_floor=RGB_ANSWER_FLOOR)
    assert answer.max() < floored.answer_floor
    assert not floored.judge(QUESTION, sentences, about).any()
    # With the floor off (the default), the same pairs are rated by support × answer.
    assert JUDGE.answer_floor == 0.0
    assert JUDGE.judge(QUESTION, sentences, about).max() > 0
    # Sources that state the answer clear the floor.
    assert floored.judge(QUESTION, [SOURCES[0]], SOURCES).max() >= 0.5


async def test_an_answer_whose_sources_state_no_answer_abstains() -> None:
    engine = ExtractiveEngine(EMBEDDER, ExtractiveSettings(answer_floor=RGB_ANSWER_FLOOR))
    generator = Generator(engine)
    sources = [
        Source("a", "The 2019 Aldermoor Prize ceremony was delayed by a week.", 0),
        Source("b", "The Aldermoor Prize is awarded every year for a book of poems.", 0),
    ]
    final = [e async for e in generator.answer(QUESTION, sources)][-1]
    assert isinstance(final, FinalEvent)
    assert final.insufficient_information
    assert all(not s.citations for s in final.sentences)


def test_without_a_question_the_rating_is_support_alone() -> None:
    p = JUDGE.judge("", [SOURCES[3]], SOURCES)
    assert p[0, 3] > 0.5
    assert p[0, 4] < 0.3


@pytest.mark.parametrize(
    ("model", "judge", "expected"),
    # A mean half-way between two ratings is rounded down, whatever the
    # parity: 8.5 is 8 as 7.5 is 7 and 4.5 is 4 (a citation needs both).
    [(8, 9, 8), (7, 8, 7), (5, 4, 4), (9, 9, 9), (10, 2, 2), (2, 10, 2), (7, 4, 5), (0, 0, 0)],
)
def test_model_and_judge_combine_by_the_documented_rule(
    model: int, judge: int, expected: int
) -> None:
    assert combine(model, judge, disagreement=3) == expected


def test_logistic_model_checks_its_input() -> None:
    model = JudgeModel((1.0, -1.0), 0.0, ("a", "b"))
    assert model.score(np.array([[0.0, 0.0]]))[0] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="expected 2 features"):
        model.score(np.zeros((1, 3)))


async def test_an_answer_no_source_supports_is_withdrawn_and_abstained() -> None:
    generator = Generator(ExtractiveEngine(EMBEDDER))
    sources = [
        Source("a", "Fennick Retail Group opened forty stores in 2025.", 0),
        Source("b", "Norvale Copper cut its emissions by 30 percent in 2025.", 0),
    ]
    events = [
        e
        async for e in generator.answer(
            "How much did Fennick Retail Group cut its emissions in 2025?", sources
        )
    ]
    final = events[-1]
    assert isinstance(final, FinalEvent)
    # Norvale's figure must not be offered as Fennick's.
    assert "30 percent" not in final.answer
    assert final.insufficient_information
    assert "no source is about what the question names" in final.answer
    removed = [e for e in events if isinstance(e, RevisionEvent) and e.removed]
    assert removed, "the Norvale sentence is withdrawn, visibly"
    assert final.removed_sentences == len(removed)
    # The withdrawn sentence keeps its index; the abstention takes a fresh one.
    assert final.sentences[0].index not in {r.sentence.index for r in removed}


async def test_a_single_source_that_states_the_answer_is_cited() -> None:
    # One source is all there is: the rating must not collapse for want of
    # other sources to agree with it.
    generator = Generator(ExtractiveEngine(EMBEDDER))
    sources = [Source("a", "Norvale Copper cut its emissions by 30 percent in 2025.", 0)]
    events = [
        e
        async for e in generator.answer(
            "How much did Norvale Copper cut its emissions in 2025?", sources
        )
    ]
    final = events[-1]
    assert isinstance(final, FinalEvent)
    assert not final.insufficient_information
    assert "30 percent" in final.answer
    assert final.sentences[0].citations[0].doc_id == "a"


def test_fitting_learns_the_labels_and_scores_the_held_out_half() -> None:
    from attest.evaluation.judge_fit import Judged, cross_fit, fit, score

    rng = np.random.default_rng(0)
    judged = []
    for q in range(40):
        x = rng.uniform(0, 0.3, size=(3, 4, len(FEATURES)))
        gold = np.array([True, True, False, False])
        right = np.array([True, False, False])
        # Gold passages state the right sentence's claims; the right sentence
        # has the sources' agreement behind it.
        x[0, :2, F["states_answer"]] = 1.0
        x[0, :2, F["claims"]] = 0.9
        x[0, :, F["consensus"]] = 0.8
        judged.append(Judged(str(q), "even" if q % 2 == 0 else "odd", x, gold, right))
    models = fit(judged)
    figures = score(models, judged)
    assert figures["pairs_auroc"] == pytest.approx(1.0)
    assert figures["sentences_auroc"] == pytest.approx(1.0)
    held = cross_fit({"synthetic": judged})["synthetic"]
    assert set(held) == {"even", "odd"}
    assert held["odd"]["confidence_auroc"] is not None
    assert held["odd"]["confidence_auroc"] > 0.9


def test_a_source_without_the_sentences_figures_rates_below_a_citation() -> None:
    question = "Which organization fined Norvale Copper $2.4 million, and for what?"
    sentence = (
        "The Estuary Basin Water Authority fined Norvale Copper $2.4 million after it "
        "discharged water from the Kestrel Ridge tailings facility on 11 occasions."
    )
    sources = [
        sentence,
        # Names the company and the mine, not the fine: it states the sentence in part.
        "Shareholders opposed Norvale Copper's pay report after two fatal accidents at the "
        "Kestrel Ridge mine.",
    ]
    rated = JUDGE.judge(question, [sentence], sources)
    assert to_confidence(float(rated[0, 0])) >= 5
    assert rated[0, 1] <= PARTIAL_SUPPORT
    assert to_confidence(float(rated[0, 1])) < 5


def test_an_answer_about_one_thing_a_choice_question_names_is_grounded() -> None:
    question = "Who was born first, Erika Jayne or Marco Da Silva?"
    sentence = (
        "Erika Girardi (born 10 July 1971), known professionally as Erika Jayne, is a singer."
    )
    assert grounded(question, [(sentence, sentence)])
    # Neither of the two named: about something else.
    assert not grounded(question, [("Jan Koum was born in 1976.", "Jan Koum was born in 1976.")])


def test_a_figure_written_another_way_is_not_lacking() -> None:
    pairs = [
        ("Its emissions were 1,820,000 tonnes.", "Emissions were 1.82 million tonnes."),
        ("It was fined $2.4m.", "It was fined $2.4 million."),
        ("The mine discharged water on 11 occasions.", "It discharged water on eleven occasions."),
        ("The 48-turbine wind farm opened.", "The wind farm has 48 turbines."),
        ("Emissions fell 6 per cent.", "Emissions fell 6%."),
    ]
    sentences, sources = [s for s, _ in pairs], [s for _, s in pairs]
    assert not lacks_figures(sentences, sources).diagonal().any()
    # Another figure, or none, is still lacking.
    assert lacks_figures(
        ["Its emissions were 1,820,000 tonnes."],
        ["Emissions were 1.9 million tonnes.", "Emissions were 820 tonnes.", "Emissions fell."],
    ).all()
    assert lacks_figures(["COVID-19 closed 19 mines."], ["19 mines closed."]).all()
    # The features judge holds the pairs ``lacks_figures`` finds.
    question = "What were Norvale Copper's emissions in 2025?"
    sentence = "Norvale Copper reported emissions of 1,820,000 tonnes in 2025."
    held = JUDGE.judge(
        question, [sentence], [sentence, "Norvale Copper's 2025 emissions: 1.9 million tonnes."]
    )
    assert held[0, 1] <= PARTIAL_SUPPORT


def test_a_held_judge_rating_beside_the_model_s_as_documented() -> None:
    # confidence.md: a model rating of 6 or 7 beside a held 4 averages to a
    # citation; 5 does not (4.5 is rounded down); 8 or more disagrees by more
    # than 3 points and the 4 stands.
    assert [combine(m, 4) for m in range(4, 11)] == [4, 4, 5, 5, 4, 4, 4]


@pytest.mark.parametrize(
    ("probability", "confidence"),
    [(0.45, 5), (0.55, 6), (0.65, 7), (0.449, 4), (0.0, 0), (1.0, 10), (1.3, 10), (-0.2, 0)],
)
def test_a_probability_becomes_a_confidence_with_halves_rounded_up(
    probability: float, confidence: int
) -> None:
    assert to_confidence(probability) == confidence


def test_single_source_variants_keep_one_stating_gold_passage() -> None:
    from attest.evaluation.judge_fit import single_source_variants
    from attest.evaluation.qa import QAItem, QAPassage

    def item(qid: str, golds: list[str], others: int = 2) -> QAItem:
        passages = [QAPassage(f"{qid}-p{k}", "", text, True) for k, text in enumerate(golds)]
        passages += [QAPassage(f"{qid}-n{k}", "", "Nothing here.", False) for k in range(others)]
        return QAItem(qid, "Who won?", ("Ann Lee",), tuple(passages))

    items = [
        # Three passages state the answer: one is kept, the others go.
        item("0", ["Ann Lee won.", "Ann Lee took the title.", "The winner: Ann Lee."]),
        # Only one states it on its own: nothing to vary.
        item("1", ["Ann Lee won.", "The final was in May."]),
        # Multi-hop: neither gold passage states it alone.
        item("2", ["She won.", "Her name is Lee."]),
        item("3", ["Ann Lee won.", "It went to Ann Lee."], others=0),
    ]
    variants = single_source_variants(items)
    assert [v.id for v in variants] == ["0", "3"]
    for v, original in zip(variants, (items[0], items[3]), strict=True):
        gold = [p for p in v.passages if p.gold]
        assert len(gold) == 1
        assert "Ann Lee" in gold[0].text
        # The other passages as they were, in their order.
        assert [p for p in v.passages if not p.gold] == [p for p in original.passages if not p.gold]
        assert (v.question, v.answers) == (original.question, original.answers)
    # Seeded: the same draw every time.
    assert single_source_variants(items) == variants


def test_the_sources_of_pooled_asks_become_a_question_set() -> None:
    from attest.evaluation.pooled import retrieved_sets
    from attest.evaluation.qa import Answered, QAItem, QAPassage, load_qa

    items = [
        QAItem(
            "1",
            "Who won?",
            ("Ann Lee",),
            (QAPassage("1-p0", "T", "Ann Lee won.", True), QAPassage("1-n0", "", "No.", False)),
        ),
        QAItem("2", "Who lost?", ("Bo Ray",), (QAPassage("2-p0", "", "Bo Ray lost.", True),)),
    ]
    answers = [
        # Another question's gold passage is no gold of this one.
        Answered("Ann Lee won.", (), 0, False, retrieved=("2-p0", "1-p0", "unknown")),
        Answered("", (), 0, True, retrieved=()),
    ]
    rows = retrieved_sets(items, answers)
    assert [(p["id"], p["gold"]) for p in rows[0]["passages"]] == [  # type: ignore[union-attr]
        ("2-p0", False),
        ("1-p0", True),
    ]
    assert rows[0]["passages"][1]["title"] == "T"  # type: ignore[index]
    # An Ask given no source has nothing to judge: no row.
    assert len(rows) == 1
    # load_qa reads them back.
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sources.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        loaded = load_qa(path)
    assert [p.id for p in loaded[0].passages] == ["2-p0", "1-p0"]
    assert loaded[0].has_answer


def test_fit_judge_fits_one_half_with_single_source_variants(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from attest.cli import main
    from attest.generate.judge import JudgeModels

    people = ["Ann Lee", "Bo Ray", "Cy Dunn", "Di Park"]
    rows = []
    for q, who in enumerate(people):
        rows.append(
            {
                "id": str(q),
                "question": f"Who won the {2020 + q} Harrow Open?",
                "answers": [who],
                "passages": [
                    {
                        "id": f"{q}-p0",
                        "title": "",
                        "text": f"{who} won the {2020 + q} Harrow Open.",
                        "gold": True,
                    },
                    {
                        "id": f"{q}-p1",
                        "title": "",
                        "text": f"The {2020 + q} Harrow Open went to {who} in three sets.",
                        "gold": True,
                    },
                    {
                        "id": f"{q}-n0",
                        "title": "",
                        "text": "The Harrow Open is played on grass courts in June.",
                        "gold": False,
                    },
                    {
                        "id": f"{q}-n1",
                        "title": "",
                        "text": "Tickets for the Harrow Open sold out within a day.",
                        "gold": False,
                    },
                ],
            }
        )
    dataset = tmp_path / "harrow.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "weights.json"
    result = CliRunner().invoke(
        main,
        [
            "eval",
            "fit-judge",
            "--dataset",
            str(dataset),
            "--split",
            "even",
            "--single-source",
            "--output",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
    # Questions 0 and 2 only, each also read with one of its two stating passages.
    assert report["questions"] == {"harrow": 2, "harrow (one stating source)": 2}
    assert report["held_out_half"] is None
    assert report["single_source_variants"] is True
    models = JudgeModels.load(out)
    assert len(models.answer.weights) == len(models.answer.features)

    odd = CliRunner().invoke(
        main,
        [
            "eval",
            "fit-judge",
            "--dataset",
            str(dataset),
            "--split",
            "odd",
            "--output",
            str(tmp_path / "odd.json"),
        ],
    )
    assert odd.exit_code == 0, odd.output
    odd_report = json.loads(odd.stdout[: odd.stdout.rindex("}") + 1])
    # Without --single-source (the default), the sets as they are.
    assert odd_report["questions"] == {"harrow": 2}
    assert odd_report["single_source_variants"] is False


def test_fit_judge_refuses_two_sets_of_one_name_and_an_output_under_a_file(
    tmp_path: Path,
) -> None:
    from click.testing import CliRunner

    from attest.cli import main

    row = {
        "id": "1",
        "question": "Who won?",
        "answers": ["Ann Lee"],
        "passages": [{"id": "p", "title": "", "text": "Ann Lee won.", "gold": True}],
    }
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "harrow.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
    out = tmp_path / "weights.json"
    # Both would be reported (and one silently dropped) as "harrow".
    for second in (tmp_path / "b" / "harrow.jsonl", tmp_path / "a" / "harrow.jsonl"):
        result = CliRunner().invoke(
            main,
            [
                *("eval", "fit-judge", "--dataset", str(tmp_path / "a" / "harrow.jsonl")),
                *("--dataset", str(second), "--output", str(out)),
            ],
        )
        assert result.exit_code == 1, result.output
        assert "two data sets are called 'harrow'" in result.output
    assert not out.exists()
    # An output under a file is refused with a message, not a traceback.
    blocked = tmp_path / "file"
    blocked.write_text("", encoding="utf-8")
    result = CliRunner().invoke(
        main,
        [
            *("eval", "fit-judge", "--dataset", str(tmp_path / "a" / "harrow.jsonl")),
            *("--output", str(blocked / "weights.json")),
        ],
    )
    assert result.exit_code == 1
    assert "is not a folder" in result.output


def test_fit_judge_fits_a_set_of_one_half_and_leaves_the_other_halfs_figures_out(
    tmp_path: Path,
) -> None:
    """A set of one half only (``attest eval qa --split odd --sources-out``)
    has no other half to fit on for scoring its own: those figures are null,
    and the weights are still fitted on it."""
    from click.testing import CliRunner

    from attest.cli import main

    rows = [
        {
            "id": str(q),
            "question": f"Who won the {2020 + q} Harrow Open?",
            "answers": [who],
            "passages": [
                {"id": f"{q}-p0", "title": "", "text": f"{who} won the {2020 + q} Harrow Open."}
                | {"gold": True},
                {"id": f"{q}-n0", "title": "", "text": f"The {2010 + q} final was rained off."}
                | {"gold": False},
            ],
        }
        for q, who in ((1, "Ann Lee"), (3, "Bo Ray"))
    ]
    dataset = tmp_path / "odd-sources.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "weights.json"
    result = CliRunner().invoke(
        main, ["eval", "fit-judge", "--dataset", str(dataset), "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
    held = report["held_out_half"]["odd-sources"]
    assert held["odd"] == {"pairs_auroc": None, "sentences_auroc": None, "confidence_auroc": None}
    assert out.exists()
