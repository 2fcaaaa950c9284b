"""Tables as data: rows of a page's text lines that keep their headers and unit.

A financial statement or an ESG key-figure table, as a PDF's text layer gives
it, is a run of lines "label value value ..." under a header line of periods
("2019 2018 2017", "At December 31, 2019 At December 31, 2018") and a unit
("(in millions, except per share data)", "t CO2e"). Read line by line, each
such row becomes one self-contained sentence that names its table, unit,
section, label and, for every value, its column::

    CONSOLIDATED STATEMENTS OF CASH FLOWS (in millions): Investing activities:
    Purchases of property and equipment | 2018: (1,577); 2017: (1,373).

so a reader can judge it and an answer can cite it without the rest of the
page. ``parse_number`` reads the values as a reader of such tables does:
parenthesised negatives, dashes for zero, thousands separators, footnote
marks. Everything else on the page stays prose.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from attest.core.numbers import parse_number as parse_number

# One value cell as the text layer spells it: "$", "(1,577)", "1,035", "12.5%",
# "-3.2", "—" (zero or none), "n/a". A footnote mark may follow: "1,035(a)",
# "48.8 1)" is read as the value then the mark (see _FOOTNOTE).
_NUMBER = r"[-–−]?\d{1,3}(?:,\d{3})+(?:\.\d+)?|[-–−]?\d+(?:\.\d+)?"
_VALUE = re.compile(rf"(?:\((?:{_NUMBER})\)|{_NUMBER})%?|[—–-]|n/?a|n\.a\.", re.IGNORECASE)
_FOOTNOTE = re.compile(r"\(?[a-z*†‡]\)|\*+|\d\)")
_YEAR = re.compile(r"(?:19|20)\d\d")
_LETTERS = re.compile(r"[^\W\d_]{2,}")
_SCALE = re.compile(
    r"\(([^()]*\b(?:millions?|thousands?|billions?|mn|bn|in %|percent)\b[^()]*)\)"
    r"|\b((?:\$|€|£|dollars|amounts|euros?)?\s*in\s+(?:millions?|thousands?|billions?)"
    r"(?:\s+of\s+\w+)?)",
    re.IGNORECASE,
)
_SKIP_TITLES = re.compile(r"table of contents|index to (?:consolidated )?financial", re.I)
# A financial statement's own name, in whatever case: the title of its table.
_STATEMENT_NAME = re.compile(
    r"^(?:consolidated |combined |condensed )*(?:statements? of |balance sheets?\b)", re.I
)


@dataclass(frozen=True, slots=True)
class Row:
    """One table row: where it sits and what it says."""

    title: str
    unit: str
    section: str
    label: str
    columns: tuple[str, ...]  # as many as values when the header matched, else ()
    values: tuple[str, ...]  # as written ("(1,577)", "—")

    def text(self) -> str:
        """The row as one sentence: table, unit, section, label, then each
        value with its column."""
        head = self.title
        if self.unit:
            head = f"{head} ({self.unit})" if head else f"({self.unit})"
        label = f"{self.section}: {self.label}" if self.section else self.label
        if self.columns:
            cells = "; ".join(f"{c}: {v}" for c, v in zip(self.columns, self.values, strict=True))
        else:
            cells = "; ".join(self.values)
        return f"{head + ': ' if head else ''}{label} | {cells}."


def _split_values(line: str) -> tuple[str, list[str]]:
    """(label, values) of a line read from the right: trailing value cells (a
    "$" before one and a footnote mark after one are dropped) and what precedes
    them."""
    tokens = line.split()
    values: list[str] = []
    i = len(tokens)
    while i > 0:
        token = tokens[i - 1]
        if token in ("$", "€", "£"):
            i -= 1
            continue
        bare = token.lstrip("$€£")
        if _VALUE.fullmatch(bare):
            values.append(bare)
            i -= 1
            continue
        if values and _FOOTNOTE.fullmatch(token) and i > 1:
            # "1,021,244 3)": a mark between values belongs to the value before it.
            i -= 1
            continue
        break
    values.reverse()
    return " ".join(tokens[:i]), values


def _is_year(value: str) -> bool:
    return bool(_YEAR.fullmatch(value))


def _label_numbers(label: str, values: list[str], columns: int) -> tuple[str, list[str]]:
    """Numbers read as values that belong to the label: a footnote mark "(1)"
    before as many values as the header has columns, a year after "due",
    "in" or another lower-case word ("Senior notes due 2025 500 450")."""
    values = list(values)
    while len(values) > columns and re.fullmatch(r"\(\d\)", values[0]):
        label = f"{label} {values.pop(0)}"
    last = label.split()[-1] if label.split() else ""
    while (
        len(values) > 1
        and _YEAR.fullmatch(values[0])
        and last.isalpha()
        and last.islower()
        and len(values) > columns - 1
    ):
        label = f"{label} {values.pop(0)}"
        last = ""
    return label, values


def header_columns(line: str) -> tuple[str, ...]:
    """The column labels of a header line, or () when ``line`` is no header.

    A header names at least two periods (years) and no other figures:
    "2015 2016 2017", "At December 31, 2019 At December 31, 2018",
    "Key Figures Unit 2018 2019 1) 2020 2) Germany Austria Sweden" (then every
    word after the first year is a column too)."""
    tokens = [t for t in line.split() if not _FOOTNOTE.fullmatch(t)]
    years = [i for i, t in enumerate(tokens) if _YEAR.fullmatch(t.strip(",.:"))]
    if len(years) < 2:
        return ()
    for t in tokens:
        bare = t.strip(",.:")
        # A day of a date ("December 31, 2019") is the only other number a header has.
        if (
            _VALUE.fullmatch(bare)
            and not _YEAR.fullmatch(bare)
            and re.search(r"\d", bare)
            and not re.fullmatch(r"\d{1,2}", bare)
        ):
            return ()
    # Each period closes the words since the one before; a column is the date
    # they end with ("December 31, 2019") or the year alone.
    columns: list[str] = []
    start = 0
    for i in years:
        phrase = " ".join(tokens[start : i + 1]).strip(",.:")
        date = re.search(r"[A-Z][a-z]+\.? \d{1,2}, (?:19|20)\d\d$", phrase)
        columns.append(date.group(0) if date else tokens[i].strip(",.:"))
        start = i + 1
    # Words after the last year are columns of their own ("Germany Austria Sweden").
    tail = tokens[years[-1] + 1 :]
    if tail and all(_LETTERS.fullmatch(t) and t[0].isupper() for t in tail):
        columns += tail
    elif tail:
        return ()
    return tuple(columns)


def _scale(line: str) -> str:
    m = _SCALE.search(line)
    if not m:
        return ""
    return " ".join((m.group(1) or m.group(2)).split())


def _is_title(line: str) -> bool:
    letters = [c for c in line if c.isalpha()]
    return (
        len(letters) >= 6
        and sum(c.isupper() for c in letters) >= 0.8 * len(letters)
        and not _SKIP_TITLES.search(line)
    )


@dataclass
class PageTables:
    """A page's lines with its table rows rendered: ``paragraphs`` (prose lines
    and rows in page order, a row a paragraph of its own) and ``rows``."""

    paragraphs: list[str]
    rows: list[Row]


# A piece of a header that a PDF gives on lines of their own: "August 29,",
# "2021", "December 31,", "2016 2017", "May 31, 2020".
_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?"
)
_DATE_PART = re.compile(
    rf"(?=.*\d)(?:(?:{_MONTH} \d{{1,2}}, ?)?(?:19|20)\d\d ?)*(?:{_MONTH} \d{{1,2}},?)?"
)
# A header's caption that says its columns are interim periods, not years.
_INTERIM = re.compile(
    r"\b(?:three|six|nine|3|6|9|thirteen|twelve|13|12|26|39)[ -](?:months?|weeks?)\b|\bquarters?\b"
    r"|\bQ[1-4]\b",
    re.IGNORECASE,
)
_ANNUAL = re.compile(r"\b(?:twelve|12)[ -]months?\b|\b(?:52|53)[ -]weeks?\b", re.I)


def _is_value(token: str) -> bool:
    return bool(_VALUE.fullmatch(token.lstrip("$€£"))) and any(c.isdigit() for c in token)


def _split_merged(raw: str) -> list[str]:
    """A text line cut where a run of values ends and a capitalised label
    starts: some PDFs' text layers give several rows as one line ("2022 2021
    Net sales $ 18,992.8 $ 18,127.0 Cost of sales 12,590.6 11,678.7")."""
    tokens = raw.split()
    pieces: list[list[str]] = [[]]
    for i, token in enumerate(tokens):
        if (
            pieces[-1]
            # A run of values (or a header's year), not one number inside a
            # label ("Level 3 Assets").
            and (_values_before(tokens, i) >= 2 or bool(_YEAR.fullmatch(tokens[i - 1])))
            and token[:1].isupper()
            and not _is_value(token)
            and not _dates_only(tokens[i - 1], tokens[i:])
        ):
            pieces.append([])
        pieces[-1].append(token)
    return [" ".join(p) for p in pieces if p]


def _values_before(tokens: list[str], i: int) -> int:
    """How many value cells end right before ``tokens[i]`` ("$" signs skipped)."""
    n = 0
    for token in reversed(tokens[:i]):
        if token in ("$", "€", "£"):
            continue
        if not _is_value(token):
            break
        n += 1
    return n


def _dates_only(before: str, rest: list[str]) -> bool:
    """A year followed by more of a header ("At December 31, 2019 At December
    31, 2018"): the line goes on with dates only."""
    if not _YEAR.fullmatch(before.strip(",.:")):
        return False
    values = [t.strip(",.:") for t in rest if _is_value(t.strip(",.:"))]
    return bool(values) and all(_YEAR.fullmatch(v) or re.fullmatch(r"\d{1,2}", v) for v in values)


def _joined(lines: Sequence[str]) -> list[str]:
    """The page's lines with wrapped ones joined: a line that starts in lower
    case continues the one before, unless that one ends a sentence or a label
    (".", ":", ";") or already ends in values ("Emissions in the portfolio t
    CO2" + "e 1,049,766 ..." is one row); pieces of a header on lines of their
    own ("August 29," "2021" "August 30," "2020") are one header line."""
    out: list[str] = []
    for line in (piece for raw in lines for piece in _split_merged(raw)):
        if out and _DATE_PART.fullmatch(line) and _DATE_PART.fullmatch(out[-1]):
            out[-1] = f"{out[-1]} {line}"
            continue
        if (
            out
            and line[0].islower()
            and not out[-1].endswith((".", ":", ";"))
            and not _split_values(out[-1])[1]
            and not header_columns(out[-1])
        ):
            out[-1] = f"{out[-1]} {line}"
        else:
            out.append(line)
    return out


def read_page_lines(lines: Sequence[str]) -> PageTables:
    """Find the table rows among a page's text lines (in reading order).

    A line is a row when it ends in value cells after a label with letters,
    under a header whose column count it matches, or with at least two values
    and no header; a line of periods is a header. The table's title is the
    last upper-case line above its header (else the first short line since
    the last table), its unit the last scale phrase since the title, its
    section the last short line without values under the header (a statement's
    section ends with its "Total" row)."""
    paragraphs: list[str] = []
    rows: list[Row] = []
    title = ""
    fallback_title = False  # the title is a short line, not an upper-case one
    unit = ""
    section = ""
    columns: tuple[str, ...] = ()
    next_title = ""  # an upper-case line seen under a header
    named = False  # the title is a statement's name, until the header
    prose: list[str] = []

    def flush_prose() -> None:
        if prose:
            paragraphs.append("\n".join(prose))
            prose.clear()

    since_row: list[str] = []  # lines that are no row since the last row or header
    interim = False
    for line in _joined(lines):
        found = _scale(line)
        header = header_columns(line)
        if header:
            flush_prose()
            if columns:
                # A second table on the page: its title and unit are what came
                # since the first one's rows, not the first one's.
                captions = [c for c in since_row if not _scale(c) and not _SKIP_TITLES.search(c)]
                title = next_title or (captions[0] if captions else title)
                unit = next((_scale(c) for c in reversed(since_row) if _scale(c)), "")
            caption = " ".join([*since_row[-2:], line])
            interim = bool(_INTERIM.search(caption)) and not _ANNUAL.search(caption)
            if interim:
                # "Three Months Ended September 30, 2019" is no fiscal year.
                header = tuple(f"{c} (interim)" for c in header)
            columns, section, next_title, named = header, "", "", False
            since_row = []
            if found:
                unit = found
            # The header itself is no paragraph: every row names its columns.
            continue
        label, values = _split_values(line)
        if columns and values:
            label, values = _label_numbers(label, values, len(columns))
        is_row = (
            bool(values)
            and _LETTERS.search(label) is not None
            and not (len(values) == 1 and _is_year(values[0]))
            # A sentence that ends in a figure is prose ("... rose to 1,442.").
            and not (label.endswith((".", ";")) and len(label.split()) > 8)
            and (
                (bool(columns) and len(values) <= len(columns))
                or (not columns and len(values) >= 2)
            )
        )
        if not is_row:
            short = len(line) <= 80 and not line.endswith((".", ","))
            if _STATEMENT_NAME.match(line) and len(line) <= 100:
                # A statement's name is its table's title, whatever follows
                # (the company's name in capitals, the periods).
                title, fallback_title, section, unit = line, False, "", ""
                next_title, named = "", True
            elif _is_title(line) and not columns and not named:
                # A new table (or the page's heading): its header and unit follow.
                title, fallback_title, section, unit = line, False, "", ""
                next_title = ""
            elif columns and short and _LETTERS.search(line):
                # Under a header an upper-case line is a section ("ASSETS",
                # "CURRENT ASSETS"), or the title of the next table, which
                # takes it when its own header comes.
                section = line
                if _is_title(line):
                    next_title = line
            elif (
                not columns
                and short
                and (not title or fallback_title is None)
                and not _SKIP_TITLES.search(line)
            ):
                title, fallback_title = line, True
            if found:
                unit = found
            since_row.append(line)
            prose.append(line)
            continue
        since_row = []
        flush_prose()
        row = Row(
            title=title,
            unit=unit,
            section=section.rstrip(":"),
            label=label,
            columns=columns if len(values) == len(columns) else (),
            values=tuple(values),
        )
        rows.append(row)
        paragraphs.append(row.text())
        if fallback_title:
            # The next short line above a later table may be its title.
            fallback_title = None  # type: ignore[assignment]
        if label.lower().startswith("total"):
            # A statement's section ends with its total.
            section = ""
    flush_prose()
    return PageTables(paragraphs, rows)
