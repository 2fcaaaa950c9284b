"""Numeric answers: metrics computed from cited table rows, arithmetic written out."""

from __future__ import annotations

import pytest

from attest.generate.extractive import ExtractiveEngine
from attest.generate.models import FinalEvent, Mode, Source
from attest.generate.numeric import Computed, Missing, company_sources, compute, table_rows
from attest.generate.pipeline import AnswerOptions, Generator
from attest.ingest.tables import read_page_lines
from attest.semantic.embedding import Embedder


def _page(lines: list[str]) -> str:
    return "\n\n".join(read_page_lines(lines).paragraphs)


INCOME = _page(
    [
        "ACME WIDGETS, INC.",
        "CONSOLIDATED STATEMENTS OF OPERATIONS",
        "(in millions, except per share data)",
        "2019 2018 2017",
        "Net sales $ 6,489 $ 7,500 $ 7,017",
        "Cost of sales 2,000 2,300 2,200",
        "Net income $ 1,503 $ 1,813 $ 273",
        "Net income attributable to noncontrolling interests 35 30 20",
    ]
)
BALANCE = _page(
    [
        "CONSOLIDATED BALANCE SHEETS",
        "(Amounts in millions)",
        "At December 31, 2019 At December 31, 2018",
        "ASSETS",
        "Inventories 32 43",
        "Property and equipment, net 253 282",
        "Total current assets 7,292 6,106",
        "Total assets $ 19,845 $ 17,890",
        "Total current liabilities 2,915 2,642",
    ]
)
CASH = _page(
    [
        "CONSOLIDATED STATEMENTS OF CASH FLOWS",
        "(in millions)",
        "2019 2018 2017",
        "Inventories (11) 10 (5)",
        "Capital expenditures (116) (131) (155)",
    ]
)
OTHER = _page(
    [
        "CONSOLIDATED BALANCE SHEETS",
        "(in millions)",
        "2019 2018",
        "Property and equipment, net 9,999 8,888",
    ]
)


def _sources() -> list[Source]:
    return [
        Source(doc_id="ACME_2019_10K", passage_index=0, title="ACME_2019_10K", text=INCOME),
        Source(doc_id="ACME_2019_10K", passage_index=1, title="ACME_2019_10K", text=BALANCE),
        Source(doc_id="ACME_2019_10K", passage_index=2, title="ACME_2019_10K", text=CASH),
        Source(doc_id="GLOBEX_2019_10K", passage_index=0, title="GLOBEX_2019_10K", text=OTHER),
    ]


def test_rows_are_read_back_with_their_columns() -> None:
    rows = table_rows(_sources())
    ppe = next(r for r in rows if r.label.endswith("property and equipment, net"))
    assert ppe.source == 1
    assert ppe.unit == "Amounts in millions"
    assert ppe.value(2019) == (253.0, "253")
    assert ppe.value(2018) == (282.0, "282")
    assert ppe.value(2017) is None


def test_the_company_is_the_one_a_title_names() -> None:
    assert company_sources("What is Acme's FY2019 revenue?", _sources()) == {0, 1, 2}
    assert company_sources("What is Initech's FY2019 revenue?", _sources()) == set()


def test_a_metric_is_computed_from_the_right_company_statement_and_year() -> None:
    result = compute(
        "What is the FY2019 fixed asset turnover ratio for Acme? Round to two decimal places.",
        _sources(),
    )
    assert isinstance(result, Computed)
    assert result.text == "Fixed asset turnover ratio, FY2019: 6,489 / ((282 + 253) / 2) = 24.26."
    assert result.value == pytest.approx(6489 / 267.5)
    # Globex's 9,999 is never read; the rows cited are Acme's.
    assert {r.source for r in result.rows} == {0, 1}


def test_an_average_over_years_shows_each_year() -> None:
    result = compute(
        "What is the FY2017 - FY2019 3 year average of capex as a % of revenue for Acme? "
        "Answer in units of percents and round to one decimal place.",
        _sources(),
    )
    assert isinstance(result, Computed)
    assert result.text.startswith(
        "Capital expenditure as a share of revenue, FY2017–FY2019 average: "
        "FY2017: 155 / 7,017 = 2.21%; FY2018: 131 / 7,500 = 1.75%; FY2019: 116 / 6,489 = 1.79%"
    )
    assert result.text.endswith("average = 1.9%.")


def test_the_balance_sheet_states_a_stock_and_the_company_its_own_income() -> None:
    # The cash flow statement's "Inventories" is a change; the balance sheet's is the stock.
    result = compute("What is Acme's FY2019 inventory turnover ratio?", _sources())
    assert isinstance(result, Computed)
    assert "2,000 / ((43 + 32) / 2)" in result.text
    # "attributable to noncontrolling interests" is not the company's net income.
    roa = compute("What is the FY2019 return on assets (ROA) for Acme?", _sources())
    assert isinstance(roa, Computed)
    assert roa.text.startswith("Return on assets, FY2019: 1,503 / ((17,890 + 19,845) / 2)")


def test_a_line_item_in_the_scale_asked() -> None:
    result = compute(
        "What is the FY2019 capital expenditure amount (in USD billions) for Acme?", _sources()
    )
    assert isinstance(result, Computed)
    assert result.text == "Capital expenditures, FY2019: $116 million = $0.12 billion."


def test_a_missing_operand_is_named_and_other_questions_are_left_alone() -> None:
    missing = compute("What is Acme's FY2019 days payable outstanding (DPO)?", _sources())
    assert isinstance(missing, Missing)
    assert "accounts payable for FY2019" in missing.text
    assert compute("What is Acme's FY2016 working capital ratio?", _sources()) == Missing(
        "No source states total current assets for FY2016, so Working capital ratio cannot "
        "be computed."
    )
    # No fiscal year, a yes/no question, a question about no metric, no company named.
    assert compute("What is Acme's fixed asset turnover ratio?", _sources()) is None
    assert compute("Is Acme's FY2019 revenue growing?", _sources()) is None
    assert compute("Who chairs Acme's board in FY2019?", _sources()) is None
    assert compute("What is Initech's FY2019 fixed asset turnover ratio?", _sources()) is None


async def test_the_generator_answers_with_the_arithmetic_and_cites_each_row() -> None:
    generator = Generator(ExtractiveEngine(Embedder()))
    events = [
        e
        async for e in generator.answer(
            "What is the FY2019 fixed asset turnover ratio for Acme?",
            _sources(),
            AnswerOptions(mode=Mode.EXTRACTIVE),
        )
    ]
    final = events[-1]
    assert isinstance(final, FinalEvent)
    assert not final.insufficient_information
    (sentence,) = final.sentences
    assert sentence.text == "Fixed asset turnover ratio, FY2019: 6,489 / ((282 + 253) / 2) = 24.26."
    assert [(c.source_index, c.confidence) for c in sentence.citations] == [(0, 8), (1, 8)]
    assert "Net sales | 2019: 6,489" in sentence.citations[0].quote
    assert "Property and equipment, net" in sentence.citations[1].quote
