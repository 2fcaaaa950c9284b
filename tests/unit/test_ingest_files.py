"""PDF and DOCX reading: pages kept, tables as rows, bad files refused one by one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attest.ingest.files import PAGE_BREAK, UnreadableFile, read_docx, read_pdf
from attest.ingest.readers import count_items, read_path, skipped_files
from attest.ingest.tables import header_columns, parse_number, read_page_lines
from tests.pdf_samples import PROSE, STATEMENT, bad_files, scanned_pdf, text_pdf


@pytest.mark.parametrize(
    ("cell", "value"),
    [
        ("(1,577)", -1577.0),
        ("1,035", 1035.0),
        ("$ 5,794", 5794.0),
        ("—", 0.0),
        ("-", 0.0),
        ("12.5%", 12.5),
        ("1,035(a)", 1035.0),
        ("48.8*", 48.8),
        ("-3.2", -3.2),
        ("n/a", None),
        ("Goodwill", None),
    ],
)
def test_parse_number_reads_cells_as_a_reader_of_statements_does(
    cell: str, value: float | None
) -> None:
    assert parse_number(cell) == value


def test_header_columns_are_periods_or_dates() -> None:
    assert header_columns("2015 2016 2017") == ("2015", "2016", "2017")
    assert header_columns("At December 31, 2019 At December 31, 2018") == (
        "December 31, 2019",
        "December 31, 2018",
    )
    assert header_columns("Key Figures Unit 2018 2019 1) 2020 2) Germany Austria Sweden") == (
        "2018",
        "2019",
        "2020",
        "Germany",
        "Austria",
        "Sweden",
    )
    # A line with figures, or one year, is no header.
    assert header_columns("Net sales 2019 2018 107,006") == ()
    assert header_columns("Outlook for 2019") == ()


def test_statement_rows_keep_title_unit_section_and_columns() -> None:
    tables = read_page_lines(STATEMENT)
    assert [r.label for r in tables.rows] == [
        "Purchases of property, plant and equipment",
        "Proceeds from sale of businesses",
        "Net cash used in investing activities",
    ]
    first = tables.rows[0]
    assert first.title == "CONSOLIDATED STATEMENTS OF CASH FLOWS"
    assert first.unit == "in millions"
    assert first.section == "Investing activities:".rstrip(":")
    assert first.columns == ("2018", "2017", "2016")
    assert first.values == ("(1,577)", "(1,373)", "(1,420)")
    assert first.text() == (
        "CONSOLIDATED STATEMENTS OF CASH FLOWS (in millions): Investing activities: "
        "Purchases of property, plant and equipment | 2018: (1,577); 2017: (1,373); "
        "2016: (1,420)."
    )
    assert [parse_number(v) for v in tables.rows[1].values] == [25.0, 0.0, 1214.0]


def test_prose_that_ends_in_a_number_is_not_a_row() -> None:
    lines = [
        "The company recorded a one-time benefit in the quarter ended December 31, 2019",
        "Across the Group we were able to transfer 1,442",
        "new residential units to our own portfolio.",
    ]
    assert read_page_lines(lines).rows == []


def test_wrapped_labels_are_joined() -> None:
    lines = [
        "Key Figures Unit 2018 2019 2020",
        "Emissions in the portfolio t CO2",
        "e 1,049,766 1,176,496 1,021,319",
    ]
    (row,) = read_page_lines(lines).rows
    assert row.label == "Emissions in the portfolio t CO2 e"
    assert row.columns == ("2018", "2019", "2020")


def test_a_pdf_keeps_its_pages_and_rows(tmp_path: Path) -> None:
    path = tmp_path / "acme.pdf"
    path.write_bytes(text_pdf([PROSE, STATEMENT, []], title="Acme Widgets Annual Report"))
    read = read_pdf(path)
    assert read.title == "Acme Widgets Annual Report"
    assert len(read.pages) == 3
    assert read.body.count(PAGE_BREAK) == 2
    assert "Outlook" in read.pages[0].split("\n\n")  # a heading is a paragraph of its own
    assert read.pages[2] == ""  # an empty page still counts
    assert len(read.rows) == 3
    assert "Purchases of property, plant and equipment | 2018: (1,577)" in read.pages[1]


def test_a_pdf_without_a_usable_title_is_named_by_its_file(tmp_path: Path) -> None:
    path = tmp_path / "ACME_2018_10K.pdf"
    path.write_bytes(text_pdf([PROSE], title="0001018724-18-000005"))
    assert read_pdf(path).title == "ACME_2018_10K"


def test_bad_files_fail_each_with_its_reason(tmp_path: Path) -> None:
    expected = bad_files(tmp_path)
    for name, why in expected.items():
        with pytest.raises(UnreadableFile, match=why):
            read_pdf(tmp_path / name)
    items = {item.origin: item for item in read_path(tmp_path)}
    assert set(items) == {*expected, "good.pdf"}
    for name, why in expected.items():
        assert why in items[name].error
        assert items[name].raw_json == b""
    good = items["good.pdf"]
    assert not good.error
    assert good.pages == 2
    assert good.table_rows == 3
    record = json.loads(good.raw_json)
    assert record["id"] == "good.pdf"
    assert record["metadata"] == {
        "file": "good.pdf",
        "format": "pdf",
        "pages": "2",
        "table_rows": "3",
    }
    assert count_items(tmp_path) == 5
    assert skipped_files(tmp_path) == []


def test_a_scan_names_its_images(tmp_path: Path) -> None:
    path = tmp_path / "scan.pdf"
    path.write_bytes(scanned_pdf(pages=3))
    with pytest.raises(UnreadableFile, match="3 pages, 3 images"):
        read_pdf(path)


def test_page_progress_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "long.pdf"
    path.write_bytes(text_pdf([PROSE] * 5))
    seen: list[tuple[int, int]] = []
    read_pdf(path, lambda page, pages: seen.append((page, pages)))
    assert seen == [(n, 5) for n in range(1, 6)]


def _docx(path: Path) -> None:
    import docx

    document = docx.Document()
    document.core_properties.title = "Acme Sustainability Report"
    document.add_heading("Climate", level=1)
    document.add_heading("Emissions", level=2)
    document.add_paragraph("Our scope 1 emissions fell as the fleet moved to electric vans.")
    table = document.add_table(rows=3, cols=3)
    for r, cells in enumerate(
        [["Metric (tCO2e)", "2023", "2022"], ["Scope 1", "1,200", "1,450"], ["Scope 2", "800", ""]]
    ):
        for c, text in enumerate(cells):
            table.cell(r, c).text = text
    document.save(str(path))


def test_a_docx_reads_headings_paragraphs_and_table_rows(tmp_path: Path) -> None:
    path = tmp_path / "report.docx"
    _docx(path)
    read = read_docx(path)
    assert read.title == "Acme Sustainability Report"
    assert not read.paged
    assert PAGE_BREAK not in read.body
    assert [r.text() for r in read.rows] == [
        "Climate / Emissions (Metric (tCO2e)): Scope 1 | 2023: 1,200; 2022: 1,450.",
        "Climate / Emissions (Metric (tCO2e)): Scope 2 | 2023: 800.",
    ]
    assert read.body.startswith("Climate\n\nEmissions\n\nOur scope 1 emissions fell")
    record = json.loads(next(iter(read_path(path))).raw_json)
    assert record["metadata"]["format"] == "docx"
    assert "pages" not in record["metadata"]


def test_a_docx_that_is_not_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "report.docx"
    path.write_bytes(text_pdf([PROSE]))
    with pytest.raises(UnreadableFile, match="not a DOCX"):
        read_docx(path)
    path.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(UnreadableFile, match="damaged or not a Word document"):
        read_docx(path)


def test_upper_case_sections_keep_the_header_and_split_headers_are_joined() -> None:
    lines = [
        "COSTCO WHOLESALE CORPORATION",
        "CONSOLIDATED BALANCE SHEETS",
        "(amounts in millions, except par value and share data)",
        "August 29,",
        "2021",
        "August 30,",
        "2020",
        "ASSETS",
        "CURRENT ASSETS",
        "Cash and cash equivalents $ 11,258 $ 12,277",
        "TOTAL ASSETS $ 59,268 $ 55,556",
    ]
    rows = read_page_lines(lines).rows
    assert [r.columns for r in rows] == [("August 29, 2021", "August 30, 2020")] * 2
    assert rows[1].title == "CONSOLIDATED BALANCE SHEETS"
    assert rows[1].unit == "amounts in millions, except par value and share data"
    assert rows[0].section == "CURRENT ASSETS"


def test_rows_a_text_layer_gives_on_one_line_are_split() -> None:
    lines = [
        "Consolidated Statements of Earnings",
        "(In Millions, Except per Share Data)",
        "2022 2021 Net sales $ 18,992.8 $ 18,127.0 Cost of sales 12,590.6 11,678.7",
    ]
    rows = read_page_lines(lines).rows
    assert [(r.label, r.values) for r in rows] == [
        ("Net sales", ("18,992.8", "18,127.0")),
        ("Cost of sales", ("12,590.6", "11,678.7")),
    ]
    assert rows[0].columns == ("2022", "2021")


def test_numbers_that_belong_to_the_label() -> None:
    lines = [
        "CONSOLIDATED STATEMENTS OF CASH FLOWS",
        "(in millions)",
        "2019 2018 2017",
        "Share-based compensation expense (2) 166 209 176",
        "Senior notes due 2025 500 450 400",
        "Level 3 Assets 100 90 80",
    ]
    rows = read_page_lines(lines).rows
    assert [(r.label, r.values) for r in rows] == [
        ("Share-based compensation expense (2)", ("166", "209", "176")),
        ("Senior notes due 2025", ("500", "450", "400")),
        ("Level 3 Assets", ("100", "90", "80")),
    ]
    assert all(r.columns == ("2019", "2018", "2017") for r in rows)


def test_a_short_row_after_the_header_is_no_date() -> None:
    lines = ["BALANCE SHEETS", "2019 2018", "Goodwill 45 40", "Inventories 32 43"]
    rows = read_page_lines(lines).rows
    assert [(r.label, r.columns) for r in rows] == [
        ("Goodwill", ("2019", "2018")),
        ("Inventories", ("2019", "2018")),
    ]


def test_a_second_table_takes_its_own_title_and_unit() -> None:
    lines = [
        "CONSOLIDATED STATEMENTS OF OPERATIONS",
        "(in millions)",
        "2019 2018",
        "Net sales 6,489 7,500",
        "Employees",
        "2019 2018",
        "Headcount 1,200 1,100",
    ]
    sales, heads = read_page_lines(lines).rows
    assert (sales.title, sales.unit) == ("CONSOLIDATED STATEMENTS OF OPERATIONS", "in millions")
    assert (heads.title, heads.unit) == ("Employees", "")


def test_interim_columns_are_marked() -> None:
    lines = [
        "CONDENSED STATEMENTS OF OPERATIONS",
        "Three Months Ended",
        "September 30, 2019 September 30, 2018",
        "Net sales 1,600 1,500",
    ]
    (row,) = read_page_lines(lines).rows
    assert row.columns == ("September 30, 2019 (interim)", "September 30, 2018 (interim)")


def test_a_damaged_page_or_docx_fails_alone(tmp_path: Path) -> None:
    good = text_pdf([PROSE])
    # A page tree that names a page object that is not there.
    broken = good.replace(b"/Kids [4 0 R]", b"/Kids [4 0 R 99 0 R]").replace(
        b"/Count 1", b"/Count 2"
    )
    (tmp_path / "broken.pdf").write_bytes(broken)
    (tmp_path / "good.pdf").write_bytes(good)
    (tmp_path / "half.docx").write_bytes(b"PK\x03\x04" + b"\x00" * 64)
    items = {item.origin: item for item in read_path(tmp_path)}
    assert not items["good.pdf"].error
    assert items["half.docx"].error
    assert items["broken.pdf"].error == (
        "damaged PDF: page 2 of 2 cannot be read (Failed to load page.)"
    )
    assert all(item.document_file for item in items.values())


def test_junk_after_the_end_marker_and_a_few_text_pages_are_read(tmp_path: Path) -> None:
    path = tmp_path / "padded.pdf"
    path.write_bytes(text_pdf([PROSE]) + b"\x00" * 5000)
    assert read_pdf(path).pages[0].startswith("Acme Widgets")
    sparse = tmp_path / "sparse.pdf"
    sparse.write_bytes(text_pdf([PROSE] + [[]] * 60))
    assert len(read_pdf(sparse).pages) == 61


def test_docx_merged_cells_are_read_once(tmp_path: Path) -> None:
    import docx

    document = docx.Document()
    table = document.add_table(rows=3, cols=3)
    table.cell(0, 0).merge(table.cell(0, 2)).text = "Key figures"
    for c, text in enumerate(["(in millions)", "2019", "2018"]):
        table.cell(1, c).text = text
    table.cell(2, 0).text = "Scope 2"
    table.cell(2, 1).merge(table.cell(2, 2)).text = "50"
    path = tmp_path / "merged.docx"
    document.save(str(path))
    (row,) = read_docx(path).rows
    assert row.text() == "Key figures ((in millions)): Scope 2 | 2019: 50."


WORDS = [
    "gears",
    "springs",
    "bolts",
    "levers",
    "cams",
    "pulleys",
    "axles",
    "rivets",
    "valves",
    "pumps",
    "seals",
    "nozzles",
]


def test_running_heads_and_feet_are_left_out(tmp_path: Path) -> None:
    pages = [
        [
            "Acme Widgets // Annual Report 2023",
            *(
                f"Paragraph {k} of page {p} is about {WORDS[(p * 7 + k) % len(WORDS)]}."
                for k in range(7)
            ),
            f"{40 + p} Acme Widgets",
        ]
        for p in range(5)
    ]
    path = tmp_path / "report.pdf"
    path.write_bytes(text_pdf(pages))
    read = read_pdf(path)
    assert all("Annual Report 2023" not in page for page in read.pages)
    assert all(not page.endswith("Acme Widgets") for page in read.pages)
    assert all(f"Paragraph 0 of page {p} is" in page for p, page in enumerate(read.pages))
    assert all(f"Paragraph 6 of page {p} is" in page for p, page in enumerate(read.pages))
