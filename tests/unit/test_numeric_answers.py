"""Numeric answers: metrics computed from cited table rows, arithmetic written out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from attest.generate.extractive import ExtractiveEngine
from attest.generate.models import FinalEvent, Mode, Source
from attest.generate.numeric import (
    Computed,
    Missing,
    company_sources,
    compute,
    operand_queries,
    table_rows,
)
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
        _row_source("ACME_2019_10K", INCOME),
        Source(doc_id="ACME_2019_10K", passage_index=1, title="ACME_2019_10K", text=BALANCE),
        Source(doc_id="ACME_2019_10K", passage_index=2, title="ACME_2019_10K", text=CASH),
        _row_source("GLOBEX_2019_10K", OTHER),
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


async def _final(question: str) -> FinalEvent:
    """The extractive generator's final event for ``question`` over ``_sources``."""
    generator = Generator(ExtractiveEngine(Embedder()))
    options = AnswerOptions(mode=Mode.EXTRACTIVE)
    events = [e async for e in generator.answer(question, _sources(), options)]
    final = events[-1]
    assert isinstance(final, FinalEvent)
    return final


async def test_the_generator_answers_with_the_arithmetic_and_cites_each_row() -> None:
    final = await _final("What is the FY2019 fixed asset turnover ratio for Acme?")
    assert not final.insufficient_information
    (sentence,) = final.sentences
    assert sentence.text == "Fixed asset turnover ratio, FY2019: 6,489 / ((282 + 253) / 2) = 24.26."
    assert [(c.source_index, c.confidence) for c in sentence.citations] == [(0, 8), (1, 8)]
    assert "Net sales | 2019: 6,489" in sentence.citations[0].quote
    assert "Property and equipment, net" in sentence.citations[1].quote


async def test_the_generator_answers_a_yes_no_change_with_both_years_cited() -> None:
    final = await _final("Has Acme increased its total assets between FY2018 and FY2019?")
    (sentence,) = final.sentences
    assert sentence.text == (
        "Yes. Total assets, FY2018: 17,890 million; FY2019: 19,845 million; an increase of "
        "1,955 million (+10.9%)."
    )
    assert [c.source_index for c in sentence.citations] == [1]
    assert sentence.citations[0].confidence >= 5


def _row_source(doc: str, text: str) -> Source:
    return Source(doc_id=doc, passage_index=0, title=doc, text=text)


def test_a_company_is_named_by_whole_words_not_a_part_of_one() -> None:
    amex = _row_source(
        "AMERICANEXPRESS_2019_10K",
        "CONSOLIDATED STATEMENTS OF INCOME (in millions): Total revenues | 2019: 47,020; "
        "2018: 43,556.",
    )
    assert compute("What were American Airlines' FY2019 total revenues?", [amex]) is None
    result = compute("What were American Express's FY2019 total revenues?", [amex])
    assert isinstance(result, Computed)
    assert result.value == 47020
    # A file named by a common word names no company.
    report = _row_source("Annual_Report_2019", amex.text)
    assert (
        company_sources("What is the FY2019 total revenue in the annual report?", [report]) == set()
    )


def test_an_interim_column_is_no_fiscal_year() -> None:
    quarter = _page(
        [
            "CONDENSED CONSOLIDATED STATEMENTS OF OPERATIONS",
            "(in millions)",
            "Three Months Ended",
            "September 30, 2019 September 30, 2018",
            "Net sales 1,600 1,500",
        ]
    )
    sources = [_row_source("ACME_2019_10Q", quarter), *_sources()]
    result = compute("What is Acme's FY2019 net sales? Answer in USD millions.", sources)
    assert isinstance(result, Computed)
    assert result.value == 6489


def test_questions_about_something_else_get_no_figure() -> None:
    for question in (
        "Using the income statement, what drove Acme's FY2019 revenue growth?",
        "What were Acme's FY2019 net sales in Europe?",
        "What were Acme's FY2019 net sales in Europe compared to FY2018?",
        "How did Acme's Q2 FY2019 net sales compare to Q2 FY2018?",
        "What is Acme's gross margin guidance for FY2020?",
        "Did Acme's board change between FY2018 and FY2019?",
        # A change asked about with more than its size is left to the reader:
        # a cause, a policy, a judgement, a negation, a comparative, a
        # threshold, an alternative, two items, a ratio of an item.
        "Did Acme change its revenue recognition policy between FY2018 and FY2019?",
        "What caused the decline in Acme's net sales from FY2018 to FY2019?",
        "Is Acme's net income growth between FY2018 and FY2019 sustainable?",
        "Did Acme's net sales not increase between FY2018 and FY2019?",
        "Was Acme's net sales higher in FY2019 compared to FY2018?",
        "Did Acme's net sales fall by more than 20% between FY2018 and FY2019?",
        "Has Acme's net sales decreased or increased between FY2018 and FY2019?",
        "Did Acme's net sales increase between FY2018 and FY2019 despite a decline in inventories?",
        "What was Acme's cost of sales as a percentage of net sales in FY2019 vs FY2018?",
        "Compare Acme's net sales in FY2017, FY2018 and FY2019.",
        "Did Acme's gross margin improve in FY2019 compared to FY2018?",
        "Did Acme's net sales fail to increase between FY2018 and FY2019?",
        "Did Acme's net sales decrease by 500 million between FY2018 and FY2019?",
        "Did Acme's deferred revenue increase between FY2018 and FY2019?",
        "Did Acme's net sales in China decrease between FY2018 and FY2019?",
        "Did Acme's Q2 net sales decrease between FY2018 and FY2019?",
        "Did Acme's net income fall between FY2018 and FY2019 due to impairments?",
        "Is the decrease in Acme's net income from FY2018 to FY2019 a concern?",
    ):
        assert compute(question, _sources()) is None, question
    # A definition after the question may speak of a change.
    defined = compute(
        "What is Acme's FY2019 inventory turnover ratio? It is defined as: COGS / average "
        "inventory (the change in inventory is not used).",
        _sources(),
    )
    assert isinstance(defined, Computed)


def test_a_change_between_two_years_shows_both_and_the_change() -> None:
    margin = compute(
        "What is the change in Acme's net profit margin from FY2018 to FY2019?", _sources()
    )
    assert isinstance(margin, Computed)
    assert margin.text == (
        "Net profit margin, FY2018: 1,813 / 7,500 = 24.17%; FY2019: 1,503 / 6,489 = 23.16%; "
        "a decrease of 1.0 percentage points."
    )
    assert margin.value == pytest.approx(100 * (1503 / 6489 - 1813 / 7500))
    sales = compute(
        "What is the difference between Acme's FY2019 and FY2018 net sales?", _sources()
    )
    assert isinstance(sales, Computed)
    assert sales.text == (
        "Net sales, FY2018: 7,500 million; FY2019: 6,489 million; a decrease of 1,011 million "
        "(-13.5%)."
    )
    assert {r.source for r in sales.rows} == {0}
    # An operand missing in one of the years is named.
    assert compute(
        "By how much did Acme's operating margin change between FY2017 and FY2019?", _sources()
    ) == Missing(
        "No source states operating income for FY2017, so Operating margin cannot be compared."
    )
    # The line-item search asks for both years.
    assert operand_queries("Did Acme's inventories decrease between FY2018 and FY2019?") == [
        "balance sheets financial position inventories merchandise inventories inventories, net "
        "2019 2018"
    ]


def test_a_yes_no_question_about_a_change_is_answered_yes_or_no_by_the_figures() -> None:
    for question, first in (
        ("Has Acme increased its total assets between FY2018 and FY2019?", "Yes. Total assets"),
        ("Did Acme's inventories decrease between FY2018 and FY2019?", "Yes. Inventories"),
        ("Did Acme's net sales increase between FY2018 and FY2019?", "No. Net sales"),
        ("Was there any change in Acme's capital expenditure between FY2018 and FY2019?", "Yes."),
        (
            "By how much did Acme's total assets increase between fiscal 2018 and fiscal 2019?",
            "Total assets, FY2018: 17,890 million; FY2019: 19,845 million; an increase",
        ),
        ("How much did Acme's net sales change between FY2018 and FY2019?", "Net sales, FY2018"),
        ("How does Acme's gross margin in FY2019 compare to FY2018?", "Gross margin, FY2018"),
    ):
        result = compute(question, _sources())
        assert isinstance(result, Computed), question
        assert result.text.startswith(first), result.text
    # Globex's rows are never Acme's.
    assert (
        compute("Did Initech's net sales increase between FY2018 and FY2019?", _sources()) is None
    )


def test_the_effective_tax_rate_is_income_taxes_over_income_before_them() -> None:
    income = _page(
        [
            "CONSOLIDATED STATEMENTS OF INCOME",
            "(in millions)",
            "2022 2021",
            "Income before income taxes 9,000 10,000",
            "Provision for income taxes 1,950 2,460",
        ]
    )
    sources = [_row_source("ACME_2022_10K", income)]
    rate = compute("What is Acme's effective tax rate in FY2022?", sources)
    assert isinstance(rate, Computed)
    assert rate.text == "Effective tax rate, FY2022: 1,950 / 9,000 = 21.7%."
    change = compute(
        "How much has the effective tax rate of Acme changed between FY2021 and FY2022?", sources
    )
    assert isinstance(change, Computed)
    assert change.text.endswith("a decrease of 2.9 percentage points.")


def test_an_average_that_speaks_of_a_change_is_still_an_average() -> None:
    result = compute(
        "What is the FY2017 - FY2019 3 year average net profit margin for Acme, given falling "
        "sales?",
        _sources(),
    )
    assert isinstance(result, Computed)
    assert result.text.endswith("average = 17.1%.")


def test_the_effective_tax_rate_reads_the_income_statement_only() -> None:
    pages = [
        _page(
            [
                "CONSOLIDATED STATEMENTS OF COMPREHENSIVE INCOME",
                "(in millions)",
                "2022 2021",
                "Income taxes (70) (50)",
            ]
        ),
        _page(
            [
                "CONSOLIDATED BALANCE SHEETS",
                "(in millions)",
                "2022 2021",
                "Current liabilities:",
                "Income taxes 120 100",
            ]
        ),
        _page(
            [
                "CONSOLIDATED STATEMENTS OF INCOME",
                "(in millions)",
                "2022 2021",
                "Income before income taxes 9,000 10,000",
                "Provision for income taxes (1,950) (2,460)",
            ]
        ),
    ]
    sources = [
        Source(doc_id="ACME_2022_10K", passage_index=i, title="ACME_2022_10K", text=t)
        for i, t in enumerate(pages)
    ]
    # The expense in parentheses is an expense; other tables' "Income taxes" are not it.
    rate = compute("What is Acme's effective tax rate in FY2022?", sources)
    assert isinstance(rate, Computed)
    assert rate.text == "Effective tax rate, FY2022: 1,950 / 9,000 = 21.7%."
    assert {r.source for r in rate.rows} == {2}
    loss = _page(
        [
            "CONSOLIDATED STATEMENTS OF OPERATIONS",
            "(in millions)",
            "2022 2021",
            "Income before income taxes (500) 10,000",
            "Provision for income taxes 30 2,460",
        ]
    )
    # A benefit in one year and an expense in another keep their signs; so does
    # a label that says "benefit"; a combined statement's other comprehensive
    # income section is not the tax expense.
    for lines, text in (
        (
            ["Income before income taxes 1,000 1,000", "Provision for income taxes (50) 210"],
            "FY2021: 210 / 1,000 = 21.00%; FY2022: (50) / 1,000 = -5.00%; a decrease of 26.0",
        ),
        (
            ["Income before income taxes 1,000 1,000", "Income tax expense (benefit) 150 (20)"],
            "FY2021: (20) / 1,000 = -2.00%; FY2022: 150 / 1,000 = 15.00%; an increase of 17.0",
        ),
        (
            [
                "Income before income taxes 9,000 10,000",
                "Provision for income taxes 1,950 2,460",
                "Other comprehensive income:",
                "Income taxes (70) (50)",
            ],
            "FY2021: 2,460 / 10,000 = 24.60%; FY2022: 1,950 / 9,000 = 21.67%; a decrease of 2.9",
        ),
    ):
        page = _page(
            [
                "CONSOLIDATED STATEMENTS OF OPERATIONS AND COMPREHENSIVE INCOME",
                "(in millions)",
                "2022 2021",
                *lines,
            ]
        )
        one = [_row_source("ACME_2022_10K", page)]
        result = compute(
            "How much has the effective tax rate of Acme changed between FY2021 and FY2022?", one
        )
        assert isinstance(result, Computed)
        assert text in result.text, result.text
    sources = [_row_source("ACME_2022_10K", loss)]
    assert compute("What is Acme's effective tax rate in FY2022?", sources) == Missing(
        "Effective tax rate cannot be computed: income before income taxes is not positive in "
        "FY2022."
    )


def test_a_yes_no_change_is_decided_on_the_figures_not_their_rounding() -> None:
    income = _page(
        [
            "CONSOLIDATED STATEMENTS OF OPERATIONS",
            "(in millions)",
            "2019 2018",
            "Net sales 10,000 10,000",
            "Net income 1,004 1,000",
        ]
    )
    sources = [_row_source("ACME_2019_10K", income)]
    result = compute("Did Acme's net profit margin increase between FY2018 and FY2019?", sources)
    assert isinstance(result, Computed)
    assert result.text == (
        "Yes. Net profit margin, FY2018: 1,000 / 10,000 = 10.00%; FY2019: 1,004 / 10,000 = "
        "10.04%; an increase of 0.04 percentage points."
    )


def test_an_average_of_n_years_up_to_the_one_named() -> None:
    result = compute("What is Acme's FY2019 3 year average of capex as a % of revenue?", _sources())
    assert isinstance(result, Computed)
    assert "FY2017–FY2019 average" in result.text


def test_a_change_is_never_a_balance_and_a_note_is_cited_lower() -> None:
    no_balance = [s for s in _sources() if s.passage_index != 1]
    # Only the cash flow statement's "Inventories" (a change): not used.
    assert isinstance(
        compute("What is Acme's FY2019 inventory turnover ratio?", no_balance), Missing
    )
    note = _row_source(
        "ACME_2019_10K",
        "NOTE 7. INVENTORIES (in millions): Inventories | 2019: 32; 2018: 43.",
    )
    result = compute("What is Acme's FY2019 inventory turnover ratio?", [*no_balance, note])
    assert isinstance(result, Computed)
    assert not result.sure
    sure = compute("What is Acme's FY2019 inventory turnover ratio?", _sources())
    assert isinstance(sure, Computed)
    assert sure.sure


def test_a_dash_is_no_operand() -> None:
    dashes = _row_source(
        "ACME_2019_10K",
        "CONSOLIDATED BALANCE SHEETS (in millions): Inventories | 2019: —; 2018: —.",
    )
    sources = [_sources()[0], dashes]
    assert isinstance(compute("What is Acme's FY2019 inventory turnover ratio?", sources), Missing)


def test_a_sustainability_key_figure_with_its_unit() -> None:
    report = _row_source(
        "SMA_Solar_Technology_AG.pdf",
        "ENVIRONMENT & ENERGY: (greenhouse gas emissions in CO2e): Scope 1 t | 2023: 2,733.41; "
        "2022: 2,444.75.\n\nENVIRONMENT & ENERGY: (greenhouse gas emissions in CO2e): Scope 1 + "
        "Scope 2 t | 2023: 2,925.12; 2022: 2,812.86.",
    )
    result = compute("What were SMA Solar's scope 1 emissions in 2023?", [report])
    assert isinstance(result, Computed)
    assert result.text == "Scope 1 t, FY2023: 2,733.41."
    assert result.sure
    # A combined figure is another question.
    assert (
        compute("What were SMA Solar's combined scope 1 and scope 2 emissions in 2023?", [report])
        is None
    )


def test_labels_are_read_whatever_their_commas_dashes_and_ampersands() -> None:
    # Statements write one line item many ways: an Oxford comma, a dash
    # before "net", "&" for "and"; a company's own capital expenditure label.
    balance = _page(
        [
            "CONSOLIDATED STATEMENTS OF FINANCIAL POSITION",
            "(Dollars in millions)",
            "December 31, 2020 December 31, 2019",
            "Property, plant, and equipment – net 12,645 12,672",
        ]
    )
    cash = _page(
        [
            "CONSOLIDATED STATEMENTS OF CASH FLOWS",
            "(In Millions)",
            "2020 2019 2018",
            "Net cash provided by operating activities 3,676.2 2,807.0 2,841.0",
            "Purchases of land, buildings, and equipment (460.8) (537.6) (622.7)",
        ]
    )
    sources = [
        _row_source("HALVER_2020_10K", balance),
        Source(doc_id="HALVER_2020_10K", passage_index=1, title="HALVER_2020_10K", text=cash),
    ]
    ppe = compute(
        "What is Halver's year end FY2020 net property, plant, and equipment (in USD millions)?",
        sources,
    )
    assert isinstance(ppe, Computed)
    assert ppe.value == pytest.approx(12645)
    # A hyphen attached to "net", as some filings print it.
    hyphened = [replace(sources[0], text=balance.replace("equipment – net", "equipment-net"))]
    again = compute(
        "What is Halver's year end FY2020 net property, plant, and equipment (in USD millions)?",
        hyphened,
    )
    assert isinstance(again, Computed)
    assert again.value == pytest.approx(12645)
    fcf = compute(
        "What is the FY2020 free cash flow (FCF) for Halver? FCF here is defined as: "
        "(cash from operations - capex). Answer in USD millions.",
        sources,
    )
    assert isinstance(fcf, Computed)
    assert fcf.value == pytest.approx(3676.2 - 460.8)
    assert "3,676.2" in fcf.text
    assert "460.8" in fcf.text


def test_a_line_item_search_names_every_name_of_its_statement() -> None:
    # A balance sheet is also a "statement of financial position", an income
    # statement a "statement of earnings": the search names them all.
    (query,) = operand_queries("What is Halver's FY2020 net property, plant and equipment?")
    assert "balance sheets" in query
    assert "financial position" in query
    (query,) = operand_queries("What is Halver's FY2020 cost of sales?")
    assert "earnings" in query
    assert "operations" in query


FLOWS = _page(
    [
        "CONSOLIDATED STATEMENTS OF CASH FLOWS",
        "(in millions)",
        "2023 2022 2021",
        "Operating activities",
        "Net earnings 1,419 2,454 1,798",
        "Total cash provided by operating activities 1,824 3,252 4,927",
        "Investing activities",
        "Other investing activities 7 (1) 3",
        "Net cash provided/(used) by investing activities (962) (1,372) 5,788",
        "Financing activities",
        "Net Cash (Used for)/Provided by Financing Activities (1,806) (4,297) (876)",
    ]
)


def test_which_activity_brought_in_the_most_cash_reads_the_three_totals() -> None:
    sources = [_row_source("ACME_2023_10K", FLOWS)]
    asked = (
        "Among operations, investing, and financing activities, which brought in the most "
        "(or lost the least) cash flow for Acme in FY2023?"
    )
    got = compute(asked, sources)
    assert isinstance(got, Computed)
    assert got.text == (
        "Operating activities brought in the most cash in FY2023. Net cash by activity, FY2023 "
        "(in millions): operating activities 1,824; investing activities (962); financing "
        "activities (1,806)."
    )
    # The totals, however their verbs are written; never a line inside a section.
    assert [r.name for r in got.rows] == [
        "Total cash provided by operating activities",
        "Net cash provided/(used) by investing activities",
        "Net Cash (Used for)/Provided by Financing Activities",
    ]
    assert [query.split(" 20")[0] for query in operand_queries(asked)] == [
        "statements of cash flows net cash provided by operating activities net cash provided by "
        "(used in) operating activities net cash from operating activities",
        "statements of cash flows net cash used in investing activities net cash provided by "
        "(used in) investing activities net cash from investing activities",
        "statements of cash flows net cash used in financing activities net cash provided by "
        "(used in) financing activities net cash from financing activities",
    ]
    # A verb of losing ranks from the bottom; any activity may come first; a
    # year the statement does not give is named, not guessed.
    three = "operating, investing and financing activities"
    for question, said in (
        (f"Which of {three} used the most cash at Acme in FY2022?", "Financing activities lost"),
        (f"Among {three}, which brought in the most cash for Acme in FY2021?", "Investing"),
        (f"Among {three}, which brought in the most cash for Acme in FY2020?", "No source"),
    ):
        got = compute(question, sources)
        assert isinstance(got, Computed | Missing), question
        assert got.text.startswith(said), question
    assert isinstance(got, Missing)
    assert "operating activities for FY2020" in got.text
    # All three must be named, with one year and a superlative.
    for other in (
        "Which brought in the most cash for Acme in FY2023?",
        "Among operating and investing activities, which brought in the most cash for Acme "
        "in FY2023?",
        "Among operating, investing and financing activities, which brought in cash for Acme "
        "in FY2023?",
    ):
        assert compute(other, sources) is None, other


def test_which_activity_reads_losses_discontinued_lines_and_printed_signs() -> None:
    flows = _page(
        [
            "CONSOLIDATED STATEMENTS OF CASH FLOWS",
            "(in millions)",
            "2023 2022",
            "Total net cash provided by operating activities 1,824 3,252",
            "Net cash used in investing activities 962 1,372",
            "Cash flows used in financing activities (1,806) (1,372)",
            "Discontinued operations",
            "Net cash provided by operating activities 5 6",
            "Net cash used in investing activities (20) (30)",
            "Net cash used in financing activities 0 0",
        ]
    )
    sources = [_row_source("ACME_2023_10K", flows)]
    # A loss said after the superlative ranks from the bottom; a discontinued
    # operation's line is never a total; "used" printed without parentheses is an outflow.
    outflow = compute(
        "Which of operating, investing and financing activities had the largest cash outflow "
        "for Acme in FY2023?",
        sources,
    )
    assert isinstance(outflow, Computed)
    assert outflow.text == (
        "Financing activities lost the most cash in FY2023. Net cash by activity, FY2023 "
        "(in millions): operating activities 1,824; investing activities (962); financing "
        "activities (1,806)."
    )
    # Ties are named together; "lost the least" inside parentheses is an alternative, not the ask.
    tie = compute(
        "Among operating, investing, and financing activities, which lost the most cash "
        "(or brought in the least) for Acme in FY2022?",
        sources,
    )
    assert isinstance(tie, Computed)
    assert tie.text.startswith("Investing and financing activities lost the most cash, equally")
    # Not the three activities as a list, two superlatives, or "at least": not this question.
    for other in (
        "Which operating expense line was the largest for Acme in FY2023, and did cash from "
        "investing and financing activities cover it?",
        "Among operating, investing and financing activities, which lost at least $1 of cash "
        "for Acme in FY2023?",
        "Among operating, investing and financing activities, which brought in the most cash "
        "for Acme in FY2023, and which the least?",
    ):
        assert compute(other, sources) is None, other


def test_rows_on_different_or_unread_scales() -> None:
    def sources(unit: str) -> list[Source]:
        assets = _page(
            [
                "CONSOLIDATED BALANCE SHEETS",
                "(in millions)",
                "2019 2018",
                "Total current assets 900 800",
            ]
        )
        debts = _page(
            ["CONSOLIDATED BALANCE SHEETS", unit, "2019 2018", "Total current liabilities 450 500"]
        )
        return [_row_source("ACME_2019_10K", assets), _row_source("ACME_2019_10K", debts)]

    ratio = "What is Acme's FY2019 working capital ratio?"
    change = "How much has Acme's current ratio changed between FY2018 and FY2019?"
    # Millions beside thousands: nothing is computed or compared.
    thousands = sources("(in thousands)")
    computed, compared = compute(ratio, thousands), compute(change, thousands)
    assert isinstance(computed, Missing)
    assert "different units" in computed.text
    assert isinstance(compared, Missing)
    assert "not all on one scale" in compared.text
    # Millions beside a unit whose scale is not read: computed, cited as unsure; not compared.
    unread = compute(ratio, sources("($000)"))
    assert isinstance(unread, Computed)
    assert not unread.sure
    assert isinstance(compute(change, sources("($000)")), Missing)
    same = compute(ratio, sources("(in millions)"))
    assert isinstance(same, Computed)
    assert same.sure
    assert same.text == "Working capital ratio, FY2019: 900 / 450 = 2.00."
