"""`attest eval qa` and `attest eval demo`: metrics of trust (AUROC, abstention,
numeric-tolerant recall, re-search), RGB negatives, the demo's labels and output naming."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from click.testing import CliRunner

from attest.answer.v1 import answer_pb2
from attest.cli import main
from attest.client import AnswerClient
from attest.common.v1 import common_pb2
from attest.demo.labels import demo_items, labelled_questions
from attest.demo.run import read_jsonl, sample_questions
from attest.evaluation.commands import demo_summary
from attest.evaluation.pooled import ask_streamed
from attest.evaluation.qa import (
    Answered,
    QADatasetError,
    QAItem,
    QAPassage,
    RevisionLog,
    answer_item,
    answer_right,
    auroc,
    convert_rgb,
    dataset_name,
    half_of,
    load_qa,
    numeric_match,
    per_question,
    read_amounts,
    score,
    score_halves,
    table,
)
from attest.generate.models import (
    Citation,
    FinalEvent,
    Mode,
    RevisionEvent,
    Sentence,
    SentenceEvent,
)
from attest.generate.pipeline import Generator
from attest.generate.text import contains_answer


def _item(qid: str, gold: bool = True, answerable: bool = True, **kw: Any) -> QAItem:
    passages = (QAPassage(f"{qid}-p0", "", "text", True),) if gold else ()
    passages += (QAPassage(f"{qid}-n0", "", "other", False),)
    return QAItem(qid, "q?", kw.get("answers", ("Ann Lee",)), passages, answerable=answerable)


def _answer(
    text: str,
    cites: tuple[tuple[str, int], ...] = (),
    insufficient: bool = False,
    **kw: Any,
) -> Answered:
    return Answered(
        text=text,
        sentences=((cites, not cites),),
        llm_calls=0,
        insufficient=insufficient,
        **kw,
    )


def _row(printed: str, label: str) -> list[str]:
    """The cells of a table row after its label."""
    for line in printed.splitlines():
        if line.startswith(label + "  "):
            return [c.strip() for c in line[len(label) :].split("  ") if c.strip()]
    raise AssertionError(f"no row {label!r} in\n{printed}")


# --- AUROC -------------------------------------------------------------------


def test_auroc_counts_pairs_with_ties_as_one_half() -> None:
    assert auroc([9, 10], [1, 2]) == 1.0
    assert auroc([1, 2], [9, 10]) == 0.0
    assert auroc([10, 10], [10, 10]) == 0.5
    # Pairs: (10>5)(10>5)(8>5) + ties (10=10)(10=10) count 0.5, (8<10) 0 → 4/6.
    assert auroc([10, 10, 8], [10, 5]) == pytest.approx(4 / 6)


def test_auroc_agrees_with_scikit_learn() -> None:
    metrics = pytest.importorskip("sklearn.metrics")
    pos = [10, 10, 9, 7, 7, 5, 10, 3]
    neg = [10, 8, 7, 7, 2, 10, 0]
    expected = metrics.roc_auc_score([1] * len(pos) + [0] * len(neg), pos + neg)
    assert auroc(pos, neg) == pytest.approx(expected)


def test_auroc_of_one_class_is_undefined_not_an_error() -> None:
    assert auroc([], [1, 2]) is None
    assert auroc([3], []) is None
    item = _item("1")
    result = score([item], [_answer("Ann Lee won.", (("1-p0", 10),))])
    assert result["confidence_auroc"] is None
    assert result["citations_incorrect"] == 0
    assert result["mean_confidence_incorrect"] is None
    assert _row(table(result), "mean confidence, correct / incorrect") == ["10.00 / undefined"]
    assert _row(table(result), "confidence AUROC, correct vs incorrect") == ["undefined"]
    assert json.loads(json.dumps(result))["confidence_auroc"] is None


def test_auroc_over_every_sentence_citation_pair() -> None:
    item = _item("1")
    answered = Answered(
        text="Ann Lee won. Bob lost.",
        sentences=(((("1-p0", 9), ("1-n0", 9)), False), ((("1-n0", 4),), False)),
        llm_calls=0,
        insufficient=False,
    )
    result = score([item], [answered])
    # Correct: [9]; incorrect: [9, 4] → (0.5 + 1) / 2.
    assert result["confidence_auroc"] == 0.75


# --- answer matching ---------------------------------------------------------


def test_numeric_answers_match_within_tolerance_after_scale_normalization() -> None:
    assert numeric_match("Revenue was $1,615.9 million in 2022.", "$1616.00")
    assert not contains_answer("Revenue was $1,615.9 million in 2022.", "$1616.00")
    assert numeric_match("It spent $1.6 billion.", "$1,600 million")
    assert numeric_match("a rate of 3.21%", "3.2%")
    assert not numeric_match("Revenue was $1,700 million.", "$1616.00")
    assert not numeric_match("a rate of 3.5%", "3.2%")
    assert not numeric_match("revenue of $6 billion", "$6.04 billion")
    # Only a gold amount borrows the answer's scale; a time is not an amount.
    assert not numeric_match("a dividend of $6 per share", "$6.04 billion")
    assert not numeric_match("the call at 6:00 p.m.", "$6.04 billion")
    assert not numeric_match("It earned 1616.", "$1616.00")
    # A percentage only agrees with a percentage.
    assert not numeric_match("3.2 billion dollars", "3.2 percent")
    # Bare integers (years, counts) must be equal: 2028 is not 2030 ± 1 %.
    assert not numeric_match("by 2028", "2030")
    assert numeric_match("by 2030", "2030")


def test_a_gold_answer_with_words_beside_its_number_is_matched_strictly() -> None:
    gold = "1.82 million tonnes of carbon dioxide equivalent"
    assert not numeric_match("emissions of 1.82 million tonnes of CO2e", gold)
    assert numeric_match("emissions of 1.82 million tonnes of carbon dioxide equivalent", gold)


def test_amounts_are_read_with_scale_and_percent() -> None:
    a, b, c, d = read_amounts("$1,615.9 million, 55 per cent, 2.6m and 12,000 hectares")
    assert (a.value, a.scale, a.percent, a.approximate) == (1615.9, 1e6, False, True)
    assert (b.value, b.percent) == (55.0, True)
    assert (c.value, c.scale) == (2.6, 1e6)
    assert (d.value, d.scale, d.approximate) == (12000.0, None, False)


def test_answer_parts_must_all_be_stated() -> None:
    item = QAItem("q", "?", ("x",), (), answer_parts=(("55%",), ("40%", "forty per cent")))
    assert answer_right(item, "raised to 55% from 40%")
    assert answer_right(item, "raised to 55% from forty per cent")
    assert not answer_right(item, "raised to 55%")


# --- abstention, recall, re-search -------------------------------------------


def test_abstention_is_counted_on_unanswerable_questions_and_recall_on_answerable() -> None:
    items = [
        _item("1"),  # answerable, answered right
        _item("2"),  # answerable, abstained
        _item("3", gold=False),  # no gold passage: unanswerable, abstained
        _item("4", answerable=False),  # marked unanswerable, answered anyway
        _item("5", gold=False),  # unanswerable, abstained
    ]
    answers = [
        _answer("Ann Lee won.", (("1-p0", 9),)),
        _answer("insufficient information available", insufficient=True),
        _answer("insufficient information available", insufficient=True),
        _answer("Ann Lee won.", (("4-n0", 8),)),
        _answer("insufficient information available", insufficient=True),
    ]
    result = score(items, answers)
    assert (result["answerable"], result["unanswerable"]) == (2, 3)
    assert result["answer_recall"] == 0.5
    assert result["answer_recall_numeric"] == 0.5
    assert result["abstention_rate"] == pytest.approx(2 / 3)
    assert result["abstention_rate_answerable"] == 0.5
    # A citation in an answer to an unanswerable question is never gold.
    assert result["citation_precision"] == 0.5
    assert result["insufficient_answers"] == 3


def test_without_unanswerable_questions_abstention_rate_is_undefined() -> None:
    result = score([_item("1")], [_answer("Ann Lee won.", (("1-p0", 9),))])
    assert result["abstention_rate"] is None
    assert _row(table(result), "abstention rate, unanswerable") == ["undefined"]


def test_numeric_tolerant_recall_counts_rounded_figures() -> None:
    item = QAItem("f", "?", ("$1616.00",), (QAPassage("f-p0", "", "t", True),))
    result = score([item], [_answer("It was $1,615.9 million.", (("f-p0", 9),))])
    assert result["answer_recall"] == 0.0
    assert result["answer_recall_numeric"] == 1.0


def test_research_rate_and_revisions_that_raise_precision() -> None:
    items = [_item("1"), _item("2"), _item("3")]
    answers = [
        # Re-searched twice: one revision swaps a distractor for the gold passage,
        # one removes the gold citation.
        _answer(
            "Ann Lee won.",
            (("1-p0", 9),),
            revisions=((("1-n0",), ("1-p0",)), (("1-p0",), ())),
            researches=2,
        ),
        _answer("Ann Lee won.", (("2-p0", 9),), revisions=((("2-n0",), ("2-n0", "2-p0")),)),
        _answer("Ann Lee won.", (("3-p0", 9),)),
    ]
    result = score(items, answers)
    assert result["research_rate"] == pytest.approx(2 / 3)
    assert result["revisions"] == 3
    assert result["revisions_raising_precision"] == pytest.approx(2 / 3)
    assert result["revisions_lowering_precision"] == pytest.approx(1 / 3)
    assert result["revisions_leaving_uncited"] == pytest.approx(1 / 3)
    # Before: 1-n0, 1-p0, 2-n0 → 1 of 3 gold; after: 1-p0, 2-n0, 2-p0 → 2 of 3.
    assert result["revised_precision_before"] == pytest.approx(1 / 3)
    assert result["revised_precision_after"] == pytest.approx(2 / 3)
    assert (result["researches_per_answer"], result["researches_max"]) == (2 / 3, 2)


def test_withdrawals_are_counted_apart_from_re_searches() -> None:
    items = [_item("1"), _item("2"), _item("3")]
    answers = [
        # A right sentence withdrawn (its gold citation lost) and an uncited one.
        _answer("Ann Lee won.", (("1-p0", 9),), withdrawals=(("1-p0", "1-n0"), ())),
        # A wrong sentence withdrawn after a re-search that found nothing.
        _answer(
            "Ann Lee won.",
            (("2-p0", 9),),
            revisions=((("2-n0",), ("2-n0",)),),
            withdrawals=(("2-n0",),),
            researches=1,
        ),
        _answer("Ann Lee won.", (("3-p0", 9),)),
    ]
    result = score(items, answers)
    assert result["research_rate"] == pytest.approx(1 / 3)
    assert result["revisions"] == 1
    assert result["revisions_leaving_uncited"] == 0.0
    assert result["withdrawal_rate"] == pytest.approx(2 / 3)
    assert result["withdrawn_sentences"] == 3
    assert result["withdrawn_sentences_cited"] == pytest.approx(2 / 3)
    # Withdrawn citations: 1-p0 (gold), 1-n0, 2-n0 → 1 of 3.
    assert result["withdrawn_precision"] == pytest.approx(1 / 3)
    assert _row(table(result), "withdrawn sentences") == ["3"]


def test_revision_log_keeps_withdrawals_out_of_revisions() -> None:
    log = RevisionLog()
    log.sentence(0, ("a",))
    log.sentence(1, ("b",))
    log.revision(0, ("a", "c"))
    log.revision(0, (), removed=True)
    log.revision(1, (), removed=True)
    assert log.revisions == [(("a",), ("a", "c"))]
    assert log.withdrawals == [("a", "c"), ("b",)]


def test_without_revisions_their_shares_are_undefined() -> None:
    result = score([_item("1")], [_answer("Ann Lee won.", (("1-p0", 9),))])
    assert result["research_rate"] == 0.0
    assert result["revisions_raising_precision"] is None
    assert _row(table(result), "revisions raising / lowering precision") == [
        "undefined / undefined"
    ]


class _Scripted:
    """Stands in for a Generator: streams prepared events."""

    def __init__(self, events: list[Any]) -> None:
        self.events = events

    async def answer(self, *args: object) -> AsyncIterator[Any]:
        for event in self.events:
            yield event


async def test_answer_item_records_each_revision_with_the_citations_it_replaced() -> None:
    weak = Sentence(0, "Ann Lee won.", (Citation(1, "1-n0", -1, 3),))
    other = Sentence(1, "It was close.", (Citation(0, "1-p0", -1, 9),))
    revised = Sentence(0, "Ann Lee won.", (Citation(0, "1-p0", -1, 9),))
    final = FinalEvent(
        answer="Ann Lee won. It was close.",
        sentences=(revised, other),
        insufficient_information=False,
        researches=1,
        unsupported_sentences=0,
        discarded_citations=0,
        timings=(),
        total_seconds=0.1,
        llm_calls=0,
        mode=Mode.EXTRACTIVE,
    )
    events = [
        SentenceEvent(weak),
        SentenceEvent(other),
        RevisionEvent(revised, 3, "Ann Lee won.", (), 2),
        final,
    ]
    answered = await answer_item(cast(Generator, _Scripted(events)), _item("1"), None)
    assert answered.revisions == ((("1-n0",), ("1-p0",)),)
    assert answered.researches == 1
    assert answered.sentence_texts == ("Ann Lee won.", "It was close.")
    assert score([_item("1")], [answered])["revisions_raising_precision"] == 1.0


async def test_pooled_answers_stream_their_revisions() -> None:
    def sentence(index: int, doc: str, confidence: int) -> common_pb2.AnswerSentence:
        return common_pb2.AnswerSentence(
            index=index,
            text="Ann Lee won.",
            citations=[common_pb2.Citation(doc_id=doc, confidence=confidence)],
            confidence=confidence,
        )

    final = answer_pb2.Answer(
        text="Ann Lee won.",
        sentences=[sentence(0, "1-p0", 9)],
        sources=[
            answer_pb2.AnswerSource(source=common_pb2.Source(doc_id="1-n0"), added_for_sentence=-1),
            answer_pb2.AnswerSource(source=common_pb2.Source(doc_id="1-p0"), added_for_sentence=0),
        ],
        researches=1,
    )
    stream = [
        answer_pb2.AskStreamResponse(sentence=sentence(0, "1-n0", 3)),
        answer_pb2.AskStreamResponse(
            revision=common_pb2.SentenceRevision(
                sentence_index=0, sentence=sentence(0, "1-p0", 9), previous_confidence=3
            )
        ),
        answer_pb2.AskStreamResponse(final=final),
    ]

    class Client:
        async def ask_stream(self, *args: object, **kw: object) -> AsyncIterator[Any]:
            for event in stream:
                yield event

    answered = await ask_streamed(cast(AnswerClient, Client()), "Who won?", answer_pb2.AskOptions())
    assert answered.revisions == ((("1-n0",), ("1-p0",)),)
    # Sources added by re-search are not part of what retrieval returned.
    assert answered.retrieved == ("1-n0",)
    assert answered.researches == 1
    assert answered.sentence_texts == ("Ann Lee won.",)


# --- retrieval recall --------------------------------------------------------


def test_retrieval_recall_is_reported_only_up_to_the_sources_kept() -> None:
    item = _item("1")
    answered = _answer(
        "Ann Lee won.", (("1-p0", 9),), retrieved=(*(f"x{i}" for i in range(9)), "1-p0")
    )
    result = score([item], [answered], sources_kept=10)
    assert result["sources_kept"] == 10
    assert result["retrieval_recall_at_10"] == 1.0
    assert result["retrieval_recall_at_5"] == 0.0
    assert "retrieval_recall_at_20" not in result
    three = score([item], [answered], sources_kept=3)
    assert sorted(k for k in three if k.startswith("retrieval_recall_at_")) == [
        "retrieval_recall_at_1",
        "retrieval_recall_at_3",
    ]
    assert "retrieval recall@3" in table(three)


# --- halves and naming -------------------------------------------------------


def test_halves_by_integer_parity_else_a_stable_hash() -> None:
    assert [half_of(str(i)) for i in range(4)] == ["even", "odd", "even", "odd"]
    assert half_of(" 17 ") == "odd"
    # SHA-256 of the id: the same on every machine and run.
    assert half_of("5a85ea095542994775f606a8") == "even"
    assert half_of("q02") == "odd"
    halves = score_halves(
        [_item("1"), _item("2")],
        [_answer("Ann Lee won.", (("1-p0", 9),)), _answer("nobody")],
    )
    assert halves["odd"]["answer_recall"] == 1.0
    assert halves["even"]["answer_recall"] == 0.0
    printed = table(score([_item("1")], [_answer("x")]), halves)
    assert printed.splitlines()[0].split() == ["all", "even", "odd"]


def test_outputs_are_named_after_the_input_file(tmp_path: Path) -> None:
    assert dataset_name(tmp_path / "rgb.jsonl") == "rgb"
    assert dataset_name(tmp_path / "rgb-negatives.jsonl") == "rgb-negatives"
    # Two sets that are both called qa.jsonl keep apart by their folders.
    assert dataset_name(tmp_path / "hotpotqa_dev" / "qa.jsonl") == "hotpotqa_dev-qa"
    assert dataset_name(tmp_path / "filings" / "qa.jsonl") == "filings-qa"


# --- RGB negatives only ------------------------------------------------------


def _rgb(tmp_path: Path) -> Path:
    raw = tmp_path / "en_fact.json"
    rows = [
        {
            "id": 7,
            "query": "Who won?",
            "answer": [["Ann Lee", "A. Lee"]],
            "positive": ["Ann Lee won."],
            "negative": ["Bob lost.", "The final was in May."],
            "positive_wrong": ["Cy Doe won."],
        },
        {"id": 8, "query": "When?", "answer": "May", "positive": ["In May."], "negative": []},
    ]
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return raw


def test_negatives_only_keeps_each_questions_negatives_marked_unanswerable(
    tmp_path: Path,
) -> None:
    rows = list(convert_rgb(_rgb(tmp_path), negatives_only=True))
    # A question without negatives has nothing to be asked over.
    assert rows == [
        {
            "id": "7",
            "question": "Who won?",
            "answers": ["Ann Lee", "A. Lee"],
            "passages": [
                {"id": "7-n0", "title": "", "text": "Bob lost.", "gold": False},
                {"id": "7-n1", "title": "", "text": "The final was in May.", "gold": False},
            ],
            "answerable": False,
        }
    ]
    path = tmp_path / "neg.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n", encoding="utf-8")
    (item,) = load_qa(path)
    assert not item.answerable
    assert not item.has_answer
    # Passage ids are those of the full conversion: the same texts, the same ids.
    full = list(convert_rgb(_rgb(tmp_path)))
    assert {p["id"] for p in rows[0]["passages"]} < {p["id"] for p in full[0]["passages"]}
    assert "answerable" not in full[0]


def test_convert_rgb_command_writes_the_negatives_only_set(tmp_path: Path) -> None:
    target = tmp_path / "rgb-negatives.jsonl"
    result = CliRunner().invoke(
        main, ["eval", "convert-rgb", str(_rgb(tmp_path)), str(target), "--negatives-only"]
    )
    assert result.exit_code == 0, result.output
    assert "wrote 1 questions" in result.output
    (item,) = load_qa(target)
    assert [p.gold for p in item.passages] == [False, False]


@pytest.mark.parametrize(
    ("second_line", "error"),
    [
        (b'{"id": 9, "query": "caf\xe9?", "answer": "x"}', r"rgb\.json:2: not UTF-8"),
        (b'{"id": 9, "query": "cut off', r"rgb\.json:2: not an RGB line"),
        (b'{"id": 9, "answer": "x"}', r"rgb\.json:2: not an RGB line \(KeyError\('query'\)\)"),
    ],
)
def test_convert_rgb_leaves_the_target_alone_when_the_source_is_bad(
    tmp_path: Path, second_line: bytes, error: str
) -> None:
    source = tmp_path / "rgb.json"
    first = json.dumps({"id": 1, "query": "Q?", "answer": "A", "positive": ["A."]})
    source.write_bytes(first.encode() + b"\n" + second_line + b"\n")
    target = tmp_path / "keep.jsonl"
    target.write_text('{"precious": true}\n')
    result = CliRunner().invoke(main, ["eval", "convert-rgb", str(source), str(target)])
    assert result.exit_code == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert re.search(error, result.output), result.output
    assert target.read_text() == '{"precious": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.jsonl", "rgb.json"]


def test_load_qa_names_a_line_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin.jsonl"
    path.write_bytes(b'{"id": "a", "question": "caf\xe9?"}\n')
    with pytest.raises(QADatasetError, match=r"latin\.jsonl:1: not UTF-8 \(byte 29"):
        load_qa(path)


def test_convert_demo_does_not_overwrite_a_folder_without_being_told(tmp_path: Path) -> None:
    target = tmp_path / "beir"
    target.mkdir()
    (target / "corpus.jsonl").write_text("mine\n")
    out = CliRunner().invoke(main, ["eval", "convert-demo", str(target)])
    assert out.exit_code == 1
    assert "already there: give --overwrite" in out.output
    assert (target / "corpus.jsonl").read_text() == "mine\n"
    out = CliRunner().invoke(main, ["eval", "convert-demo", str(target), "--overwrite"])
    assert out.exit_code == 0, out.output
    assert (target / "corpus.jsonl").read_text() != "mine\n"


@pytest.mark.parametrize("command", ["ir", "tune-fusion", "convert-rgb"])
def test_an_output_under_a_file_is_refused_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    target = str(tmp_path / "afile" / "out.json")
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    (beir / "corpus.jsonl").write_text('{"_id": "d1", "text": "x"}\n')
    (beir / "queries.jsonl").write_text('{"_id": "q1", "text": "x"}\n')
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")

    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("the output was not checked first")

    monkeypatch.setattr("attest.evaluation.runner.run_ir_eval", no_work)
    monkeypatch.setattr("attest.evaluation.runner.signal_lists", no_work)
    monkeypatch.setattr("attest.evaluation.qa.convert_rgb", no_work)
    args = {
        "ir": ["eval", "ir", "--dataset", str(beir), "--output", target],
        "tune-fusion": ["eval", "tune-fusion", "--dataset", str(beir), "--output", target],
        "convert-rgb": ["eval", "convert-rgb", str(beir / "queries.jsonl"), target],
    }[command]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 1, out.output
    assert f"cannot write {target}: {tmp_path / 'afile'} is not a folder" in out.output


def test_an_output_in_a_folder_the_user_may_not_write_is_refused_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access

    # Root may write anywhere, so the folder's mode alone cannot show this here:
    # the check asks the OS, and the OS is told this folder is read-only.
    def access(path: object, mode: int) -> bool:
        return False if Path(str(path)) == locked else real_access(path, mode)  # type: ignore[arg-type]

    monkeypatch.setattr("attest.evaluation.commands.os.access", access)
    questions = tmp_path / "questions.jsonl"
    questions.write_text("")
    target = locked / "sub" / "out.jsonl"
    out = CliRunner().invoke(main, ["eval", "convert-rgb", str(questions), str(target)])
    assert out.exit_code == 1, out.output
    assert f"cannot write {target}: {locked} is not writable" in out.output
    assert not (locked / "sub").exists()


def test_load_qa_reads_answer_parts_and_answerability(tmp_path: Path) -> None:
    path = tmp_path / "qa.jsonl"
    row = {
        "id": "a",
        "question": "?",
        "answers": [],
        "answer_parts": [["55%"], ["40%", "forty"]],
        "passages": [{"id": "p", "text": "t", "gold": True}],
    }
    path.write_text(json.dumps(row) + "\n", encoding="utf-8")
    (item,) = load_qa(path)
    assert item.answer_parts == (("55%",), ("40%", "forty"))
    assert item.has_answer


# --- the demo's labels -------------------------------------------------------


def test_demo_labels_cover_every_question_and_six_unanswerable_ones() -> None:
    items = demo_items()
    asked = [q["id"] for q in sample_questions()]
    assert len(asked) == 12
    assert set(asked) <= {i.id for i in items}
    assert len({i.id for i in items}) == len(items)
    unanswerable = [i for i in items if not i.has_answer]
    assert len(unanswerable) >= 6
    assert any("Apple" in i.question for i in unanswerable)
    for row in labelled_questions():
        assert row["answer"]
        assert row["answerable"] or row["missing"]
    for item in items:
        assert len(item.passages) == 48
        assert bool(item.answer_parts) == item.has_answer


def test_every_part_of_every_demo_answer_is_stated_by_a_supporting_article() -> None:
    corpus = {d["id"]: f"{d['title']}. {d['body']}" for d in read_jsonl("sample_corpus.jsonl")}
    for item in demo_items():
        gold = [p.id for p in item.passages if p.gold]
        for part in item.answer_parts:
            assert any(contains_answer(corpus[d], a) for d in gold for a in part), (item.id, part)
        # The gold answer as written is right by its own parts.
        assert not item.has_answer or answer_right(item, item.answers[0]), item.id


def test_demo_summary_reports_the_three_checks() -> None:
    items = [i for i in demo_items() if i.id in ("q03", "q09", "u01")]
    by_id = {i.id: i for i in items}
    answers = {
        "q03": Answered(
            text="It found 14 workers under 16. Fennick ranked 8th.",
            sentences=(((("esg-005", 10),), False), ((("esg-026", 7),), False)),
            llm_calls=0,
            insufficient=False,
            sentence_texts=("It found 14 workers under 16.", "Fennick ranked 8th."),
        ),
        "q09": _answer("The rate was 3.2%.", (("esg-024", 10),)),
        "u01": _answer("insufficient information available", insufficient=True),
    }
    records = per_question(list(by_id.values()), [answers[i] for i in by_id])
    lines = demo_summary(records)
    assert "q03  right      cited: esg-005 esg-026*" in lines
    assert "u01  abstained  cited: -" in lines
    assert "answers right by the labels: 2 of 2" in lines
    assert "citations of an article that does not state the answer: 1 (q03:esg-026)" in lines
    assert "answer sentences that state no part of the answer: 1 (q03#2)" in lines
    assert "unanswerable questions answered with insufficient information: 1 of 1" in lines
    # Each sentence is kept with its own citations, for reading by hand.
    q03 = next(r for r in records if r["id"] == "q03")
    assert q03["sentences"] == [
        {"text": "It found 14 workers under 16.", "citations": [["esg-005", 10]]},
        {"text": "Fennick ranked 8th.", "citations": [["esg-026", 7]]},
    ]


def test_an_abstention_is_never_a_right_answer() -> None:
    """ "insufficient information available: no source states ..." contains the
    word "no": it must not count as the answer "no"."""
    item = QAItem(
        id="yn",
        question="Are A and B both plants?",
        answers=("no",),
        passages=(QAPassage(id="p", title="", text="A is a plant.", gold=True),),
    )
    abstained = Answered(
        text="insufficient information available: no source states an answer to the question.",
        sentences=(((), True),),
        llm_calls=0,
        insufficient=True,
    )
    metrics = score([item], [abstained])
    assert metrics["answer_recall"] == 0.0
    assert per_question([item], [abstained])[0]["right"] is False


def test_a_yes_or_no_answer_is_its_first_word() -> None:
    item = QAItem(
        id="yn2",
        question="Are A and B both plants?",
        answers=("no",),
        passages=(QAPassage(id="p", title="", text="A is a plant.", gold=True),),
    )
    assert answer_right(item, "No: B is a fungus.")
    assert not answer_right(item, "Yes: Engine No. 1 won a seat.")
    assert not answer_right(item, "")


def test_convert_qa_pools_passages_into_a_retrieval_set(tmp_path: Path) -> None:
    from attest.evaluation.ir import load_dataset

    rows = [
        {
            "id": "q1",
            "question": "Who built the bridge?",
            "answers": ["Ada"],
            "passages": [
                {"id": "p1", "title": "Bridge", "text": "Ada built the bridge.", "gold": True},
                {"id": "p2", "title": "River", "text": "The river is wide.", "gold": False},
            ],
        },
        {
            "id": "q2",
            "question": "How wide is the river?",
            "answers": ["wide"],
            "passages": [
                {"id": "p2", "title": "River", "text": "The river is wide.", "gold": True},
                {"id": "p3", "title": "Town", "text": "The town is small.", "gold": False},
            ],
        },
        # No gold passage: its passages join the corpus, the question is no query.
        {
            "id": "q3",
            "question": "Who is mayor?",
            "answers": ["Bo"],
            "passages": [{"id": "p4", "title": "", "text": "A mayor.", "gold": False}],
        },
    ]
    source = tmp_path / "qa.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    target = tmp_path / "beir"
    out = CliRunner().invoke(main, ["eval", "convert-qa", str(source), str(target)])
    assert out.exit_code == 0, out.output
    assert "wrote 4 documents and 2 judged queries" in out.output
    data = load_dataset(target)
    assert sorted(doc.id for doc in data.corpus()) == ["p1", "p2", "p3", "p4"]
    assert {q: dict(r) for q, r in data.qrels.items()} == {"q1": {"p1": 1}, "q2": {"p2": 1}}
    again = CliRunner().invoke(main, ["eval", "convert-qa", str(source), str(target)])
    assert again.exit_code == 1
    assert "already there: give --overwrite" in again.output
    # One id naming two texts is refused, not silently merged.
    rows[1]["passages"][0]["text"] = "Another text."  # type: ignore[index]
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    clash = CliRunner().invoke(main, ["eval", "convert-qa", str(source), str(tmp_path / "b2")])
    assert clash.exit_code == 1
    assert "passage id 'p2' names two different texts" in clash.output


def test_sources_out_needs_a_pooled_run_and_a_writable_path(tmp_path: Path) -> None:
    dataset = tmp_path / "one.jsonl"
    dataset.write_text(
        json.dumps(
            {
                "id": "1",
                "question": "Who won?",
                "answers": ["Ann Lee"],
                "passages": [{"id": "1-p0", "title": "", "text": "Ann Lee won.", "gold": True}],
            }
        )
        + "\n",
        encoding="utf-8",
    )
    # Refused before any question is answered, each saying what to do.
    alone = CliRunner().invoke(
        main, ["eval", "qa", "--dataset", str(dataset), "--sources-out", str(tmp_path / "s.jsonl")]
    )
    assert alone.exit_code == 2
    assert "add --pooled" in alone.output
    folder = CliRunner().invoke(
        main,
        ["eval", "qa", "--dataset", str(dataset), "--pooled", "--sources-out", str(tmp_path)],
    )
    assert folder.exit_code == 2
    assert "is a directory" in folder.output
    assert not (tmp_path / "s.jsonl").exists()


def _two_questions(tmp_path: Path) -> Path:
    rows = [
        {
            "id": str(q),
            "question": f"Who won in {2020 + q}?",
            "answers": [who],
            "passages": [
                {"id": f"{q}-p0", "title": "", "text": f"{who} won in {2020 + q}.", "gold": True}
            ],
        }
        for q, who in ((1, "Ann Lee"), (2, "Bo Ray"))
    ]
    dataset = tmp_path / "two.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return dataset


def test_sources_out_of_one_half_keeps_the_other_halfs_passages_it_was_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attest.evaluation import commands

    dataset = _two_questions(tmp_path)

    def answer_pooled(
        items: list[QAItem], asked: list[QAItem], top_k: int, data_dir: Path | None
    ) -> list[Answered]:
        # Every passage is in the corpus; question 1 was given question 2's first.
        assert [i.id for i in items] == ["1", "2"]
        assert [i.id for i in asked] == ["1"]
        return [Answered("Ann Lee won.", (), 0, False, retrieved=("2-p0", "1-p0"))]

    monkeypatch.setattr(commands, "_answer_pooled", answer_pooled)
    out = tmp_path / "sources.jsonl"
    args = ["eval", "qa", "--dataset", str(dataset), "--pooled", "--split", "odd"]
    result = CliRunner().invoke(
        main, [*args, "--output", str(tmp_path / "m.json"), "--sources-out", str(out)]
    )
    assert result.exit_code == 0, result.output
    (row,) = load_qa(out)
    assert [(p.id, p.gold) for p in row.passages] == [("2-p0", False), ("1-p0", True)]


def test_sources_out_is_refused_where_it_would_overwrite_the_set_or_the_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attest.evaluation import commands

    dataset = _two_questions(tmp_path)
    before = dataset.read_text(encoding="utf-8")

    def answer_pooled(*_: object) -> list[Answered]:
        raise AssertionError("refused before any question is asked")

    monkeypatch.setattr(commands, "_answer_pooled", answer_pooled)
    metrics = tmp_path / "m.json"
    args = ["eval", "qa", "--dataset", str(dataset), "--pooled", "--output", str(metrics)]
    for same in (dataset, metrics, tmp_path / "." / "two.jsonl"):
        result = CliRunner().invoke(main, [*args, "--sources-out", str(same)])
        assert result.exit_code == 2, result.output
        assert "--sources-out" in result.output
    assert dataset.read_text(encoding="utf-8") == before
    # The metrics' default path too.
    monkeypatch.chdir(tmp_path)
    default = Path(".attest") / "eval" / "two-qa-extractive-pooled.json"
    result = CliRunner().invoke(
        main, ["eval", "qa", "--dataset", str(dataset), "--pooled", "--sources-out", str(default)]
    )
    assert result.exit_code == 2, result.output


def test_sources_out_with_no_ask_given_a_source_writes_no_unreadable_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attest.evaluation import commands

    dataset = _two_questions(tmp_path)

    def answer_pooled(
        items: list[QAItem], asked: list[QAItem], top_k: int, data_dir: Path | None
    ) -> list[Answered]:
        return [Answered("", (), 0, True, retrieved=()) for _ in asked]

    monkeypatch.setattr(commands, "_answer_pooled", answer_pooled)
    out = tmp_path / "sources.jsonl"
    result = CliRunner().invoke(
        main,
        [
            *("eval", "qa", "--dataset", str(dataset), "--pooled"),
            *("--output", str(tmp_path / "m.json"), "--sources-out", str(out)),
        ],
    )
    # The metrics are written; a set load_qa refuses ("no questions") is not.
    assert result.exit_code == 1
    assert "no Ask was given a source" in result.output
    assert (tmp_path / "m.json").exists()
    assert not out.exists()
