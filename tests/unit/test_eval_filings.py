"""attest eval filings: loading the set, judging answers, the per-kind summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attest.answer.v1 import answer_pb2
from attest.common.v1 import common_pb2
from attest.evaluation.filings import (
    FilingQuestion,
    answer_right,
    filing_documents,
    judge,
    load_filings,
    summarize,
)
from attest.evaluation.qa import QADatasetError
from tests.pdf_samples import PROSE, STATEMENT, text_pdf


def _question(reference: str, **kw: object) -> FilingQuestion:
    base: dict[str, object] = {
        "id": "q1",
        "question": "What were ACME's capital expenditures in FY2018?",
        "answers": (reference,),
        "doc_name": "ACME_2018_10K",
        "evidence_pages": (1,),
        "kind": "information extraction",
        "answerable": True,
    }
    base.update(kw)
    return FilingQuestion(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("reference", "text", "right"),
    [
        ("$1577.00", "Capital expenditure, FY2018: $1,577 million.", True),
        # A bare integer is not taken for an amount of money (a year, a count).
        ("$1577.00", "Purchases of property, plant and equipment | 2018: 1577.", False),
        ("$1577.00", "Capital expenditures were $1.6 billion.", False),
        ("24.26", "The fixed asset turnover ratio is 24.3.", True),
        ("24.26", "The ratio is 26.1.", False),
        ("1.9%", "Operating margin was 1.9% in FY2019.", True),
        ("1.9%", "Operating margin was 1.9 in FY2019.", False),
        ("Yes, sales grew 3.0% in FY2022.", "Yes. Sales grew by 3.0%.", True),
        ("Yes, sales grew 3.0% in FY2022.", "Yes. Sales grew.", False),
        ("No, it is not.", "Yes, it is.", False),
        ("Customer deposits", "The largest liability is customer deposits.", True),
        (
            "The effective tax rate fell from 24.6% in FY2021 to 21.6% in FY2022.",
            "Effective tax rate | 2022: 21.6%; 2021: 24.6%.",
            True,
        ),
        # The years a reference names say when; its amounts are what must be stated.
        (
            "The rate dropped from 24.6% in FY 2021 to 21.6% in FY 2022.",
            "Effective tax rate, FY2021: 2,629 / 10,689 = 24.60%; FY2022: 2,071 / 9,585 = 21.61%.",
            True,
        ),
        (
            "The rate dropped from 24.6% in FY 2021 to 21.6% in FY 2022.",
            "Effective tax rate, FY2021: 24.60%; FY2022: 22.10%.",
            False,
        ),
        # A number a word follows, or after a currency sign, is a figure, not a year.
        (
            "Acme operated 1,850 stores in FY2021 and 2019 stores in FY2022.",
            "1,850 and 1,700.",
            False,
        ),
        ("From 2021 to 2022, revenue fell by 5%.", "Revenue rose 5% in FY2022.", False),
        (
            "Revenue grew from $1,950 million to $2021 million.",
            "Revenue was $1,950 million.",
            False,
        ),
        (
            "No, revenue fell by 5% from 2021 to 2022.",
            "No. Revenue, FY2021: $100 million; FY2022: $95 million; a decrease of $5 million "
            "(-5.0%).",
            True,
        ),
    ],
)
def test_answer_right(reference: str, text: str, right: bool) -> None:
    assert answer_right(_question(reference), text) is right


CHOICE = "Among operations, investing, and financing activities, which brought in the most cash for ACME in FY2023?"


@pytest.mark.parametrize(
    ("reference", "text", "right"),
    [
        (
            "ACME generated the most cash flow from operating activities in FY 2023 ($1.8 bn)",
            "Operating activities brought in the most cash in FY2023. Net cash by activity: "
            "operating activities 1,824; investing activities (962); financing activities (1,806).",
            True,
        ),
        (
            "Among the three, cash flow from operations was the highest.",
            "Financing activities brought in the most cash in FY2023. Operating activities lost.",
            False,
        ),
        # The option named first is the one picked; a denial picks none.
        (
            "Cash flow from operations was the highest.",
            "Operating activities brought in the most cash, while investing and financing "
            "activities used cash.",
            True,
        ),
        (
            "Cash flow from operations was the highest.",
            "Operating activities did not bring in the most cash in FY2023.",
            False,
        ),
        (
            "Financing activities brought in the most cash.",
            "Financing brought in the most cash in FY2023.",
            True,
        ),
    ],
)
def test_a_choice_is_judged_by_the_option_the_first_sentence_picks(
    reference: str, text: str, right: bool
) -> None:
    assert answer_right(_question(reference, question=CHOICE), text) is right


def _answer(text: str, cites: list[tuple[str, int, int]], insufficient: bool = False):
    answer = answer_pb2.Answer(text=text, insufficient_information=insufficient)
    sentence = answer.sentences.add(text=text)
    for i, (doc, page, confidence) in enumerate(cites):
        answer.sources.add(source=common_pb2.Source(doc_id=doc, page=page, text="x"))
        sentence.citations.add(source_index=i, doc_id=doc, confidence=confidence)
    return answer


def test_judge_records_verdict_pages_and_other_filings() -> None:
    q = _question("$1577.00")
    right = judge(q, _answer("Capital expenditure: $1,577 million.", [("ACME_2018_10K", 2, 8)]))
    assert right["verdict"] == "right"
    assert right["evidence_page_cited"]  # page 2 is evidence page 1 counted from 0
    assert not right["other_filing_cited"]
    wrong = judge(q, _answer("Capital expenditure: $1,373 million.", [("ACME_2017_10K", 2, 7)]))
    assert wrong["verdict"] == "wrong"
    assert wrong["confidence"] == 7
    assert wrong["other_filing_cited"]
    assert not wrong["evidence_page_cited"]
    abstained = judge(q, _answer("No source states it.", [], insufficient=True))
    assert abstained["verdict"] == "abstained"
    summary = summarize([right, wrong, abstained])
    assert summary["all"]["right"] == 1
    assert summary["all"]["abstained"] == 1
    assert summary["all"]["wrong_confident"] == 1
    assert summary["all"]["wrong_number_confident"] == 1
    assert summary["all"]["right_with_evidence_page"] == 1
    assert summary["information extraction"]["questions"] == 3


def _dataset(folder: Path) -> None:
    (folder / "pdfs").mkdir(parents=True)
    (folder / "pdfs" / "ACME_2018_10K.pdf").write_bytes(text_pdf([PROSE, STATEMENT]))
    rows = [
        {
            "id": "a",
            "question": "What were ACME's capital expenditures in FY2018?",
            "answers": ["$1577.00"],
            "doc_name": "ACME_2018_10K",
            "question_reasoning": "Numerical reasoning OR Information extraction",
            "evidence": [{"doc_name": "ACME_2018_10K", "page": 1, "text": "..."}],
        },
        {
            "id": "b",
            "question": "How many people does Globex employ?",
            "answers": ["2,400"],
            "doc_name": "GLOBEX_2018_10K",
            "question_reasoning": None,
            "evidence": [],
        },
    ]
    (folder / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_load_filings_reads_kinds_pages_and_which_pdfs_are_there(tmp_path: Path) -> None:
    _dataset(tmp_path)
    a, b = load_filings(tmp_path)
    assert a.kind == "numerical reasoning"
    assert a.evidence_pages == (1,)
    assert a.answerable
    assert b.kind == "unlabelled"
    assert not b.answerable
    docs, pages = filing_documents(tmp_path)
    assert [d.id for d in docs] == ["ACME_2018_10K"]
    assert pages == {"ACME_2018_10K": 2}
    assert docs[0].body.count("\f") == 1
    assert "2018: (1,577)" in docs[0].body


def test_a_bad_line_is_named(tmp_path: Path) -> None:
    _dataset(tmp_path)
    with (tmp_path / "qa.jsonl").open("a") as f:
        f.write('{"id": "c", "question": "?"}\n')
    with pytest.raises(QADatasetError, match=r"qa.jsonl:3"):
        load_filings(tmp_path)


def test_a_sign_must_agree() -> None:
    assert answer_right(_question("-3.7"), "Cash conversion cycle, FY2019: 10 - 13.7 = -3.7.")
    assert not answer_right(_question("-3.7"), "Cash conversion cycle, FY2019: 13.7 - 10 = 3.7.")
    assert not answer_right(_question("24.26"), "Ratio, FY2019: 1 - 25.26 = -24.26.")


def test_answers_must_be_a_list_of_strings(tmp_path: Path) -> None:
    _dataset(tmp_path)
    with (tmp_path / "qa.jsonl").open("a") as f:
        f.write('{"id": "c", "question": "?", "answers": "24.26", "doc_name": "X"}\n')
    with pytest.raises(QADatasetError, match=r"qa.jsonl:3.*answers must be a list"):
        load_filings(tmp_path)


def test_an_unreadable_filing_is_left_out(tmp_path: Path) -> None:
    _dataset(tmp_path)
    (tmp_path / "pdfs" / "BROKEN_2019_10K.pdf").write_bytes(b"<html>moved</html>")
    unreadable: dict[str, str] = {}
    docs, _ = filing_documents(tmp_path, None, unreadable)
    assert [d.id for d in docs] == ["ACME_2018_10K"]
    assert unreadable == {"BROKEN_2019_10K": "not a PDF: the file is HTML"}
