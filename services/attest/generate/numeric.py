"""Figures that need arithmetic: a metric asked of a company's filings,
computed from the table rows the sources cite, with the arithmetic written out.

A PDF's table rows reach the generator as sentences ingest wrote
(``attest.ingest.tables.Row.text``)::

    CONSOLIDATED BALANCE SHEETS (Amounts in millions): Current assets:
    Inventories, net | December 31, 2019: 32; December 31, 2018: 43.

``table_rows`` reads them back: title, unit, label, and each value with its
column. ``compute`` answers a question that asks for one of the metrics of
``METRICS`` (a small catalogue, each with its formula over line items such as
revenue, cost of sales or total assets) or for one line item, for a fiscal
year or an average over years:

1. the company is the one a source's title names first and the question
   names too (``ACTIVISIONBLIZZARD_2019_10K`` and "Activision Blizzard");
   rows of any other document are never used;
2. every line item is looked up by its accepted labels (``CONCEPTS``) in
   rows of that company's documents whose columns name the fiscal year
   ("2019", "December 31, 2019", "May 26, 2019"); a filing whose title names
   the year is preferred to an older or newer one;
3. all operands must be in the same unit; the result is written with its
   arithmetic ("Fixed asset turnover ratio FY2019 = 6,489 / ((282 + 253) /
   2) = 24.26") and every operand's row is cited.

When the metric is recognised but an operand is missing, ``compute`` says
which one (``Missing``), so the answer can say why it cannot compute instead
of quoting a figure of another year or company.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from attest.core.numbers import parse_number
from attest.generate.facts import WORD_VALUES
from attest.generate.models import Source

_ROW = re.compile(r"^(?P<left>[^\n|]+?) \| (?P<cells>[^\n|]+?)\.$", re.MULTILINE)
_CELL = re.compile(r"^(?P<column>.*\S): (?P<value>\S+)$")
_YEAR = re.compile(r"(?:19|20)\d\d")


def _number(written: str) -> float | None:
    return parse_number(written)


@dataclass(frozen=True, slots=True)
class TableRow:
    """One table row read back from a source: where it is and what it says."""

    source: int  # index in the answer's sources
    title: str
    unit: str
    label: str  # section and label, lower case, as written
    cells: tuple[tuple[str, str], ...]  # (column, value as written)
    text: str
    name: str = ""  # the row's own label as written ("Net sales")

    def value(self, year: int) -> tuple[float, str] | None:
        """The row's value in the column that names ``year`` (exactly one)."""
        found = [
            (column, written)
            for column, written in self.cells
            if str(year) in _YEAR.findall(column) and "(interim)" not in column
        ]
        if len(found) != 1 or found[0][1] in ("—", "–", "-", "−"):
            # A dash says "none" or "not applicable": no operand to compute with.
            return None
        number = _number(found[0][1])
        return None if number is None else (number, found[0][1])


def table_rows(sources: Sequence[Source]) -> list[TableRow]:
    """Every table row that the sources' texts hold, in source order."""
    out: list[TableRow] = []
    for i, source in enumerate(sources):
        for m in _ROW.finditer(source.text):
            cells = []
            for part in m.group("cells").split("; "):
                cell = _CELL.match(part)
                if cell:
                    cells.append((cell.group("column"), cell.group("value")))
            if not cells:
                continue
            parts = m.group("left").split(": ")
            head = parts[0] if len(parts) > 1 else ""
            unit = ""
            unit_match = re.search(r"\((\(?[^()]*\)?)\)\s*$", head)
            if unit_match:
                unit = unit_match.group(1).strip("()")
                head = head[: unit_match.start()].strip()
            label = ": ".join(parts[1:]) if len(parts) > 1 else parts[0]
            row = TableRow(i, head, unit, label.lower(), tuple(cells), m.group(0).strip())
            out.append(replace(row, name=_label_of(parts[-1])))
    return out


# Line items by their accepted labels (lower case, a label's own words; a row
# whose label ends with one of these, after its section, is that item),
# preferred first.
CONCEPTS: dict[str, tuple[str, ...]] = {
    "revenue": (
        "total net revenues",
        "total net sales",
        "total revenues",
        "net revenues",
        "net sales",
        "revenues",
        "revenue",
        "total revenue",
        "net revenue",
        "total net revenue",
    ),
    "cost of sales": (
        "cost of sales",
        "cost of goods sold",
        "cost of revenues",
        "cost of revenue",
        "cost of products sold",
        "total cost of revenues",
        "total cost of revenue",
        "cost of sales (exclusive of depreciation and amortization)",
    ),
    "net income": (
        "net income attributable to",
        "net earnings attributable to",
        "net income",
        "net earnings",
    ),
    "operating income": ("operating income", "income from operations", "operating profit"),
    "income before income taxes": (
        "income before income taxes",
        "earnings before income taxes",
        "income before provision for income taxes",
        "earnings before provision for taxes on income",
        "income before taxes",
        "income (loss) before income taxes",
        "pretax income",
        "pre-tax income",
        "income before income tax expense",
    ),
    "income tax expense": (
        "provision for income taxes",
        "income tax expense",
        "income tax provision",
        "provision for taxes on income",
        "income taxes",
        "income tax expense (benefit)",
        "provision for (benefit from) income taxes",
        "provision (benefit) for income taxes",
        "income tax provision (benefit)",
    ),
    "total assets": ("total assets",),
    "total current assets": ("total current assets",),
    "total current liabilities": ("total current liabilities",),
    "inventory": ("inventories", "merchandise inventories", "inventories, net", "inventory"),
    "accounts payable": ("accounts payable", "accounts payable, trade", "trade accounts payable"),
    "accounts receivable": (
        "accounts receivable, net",
        "receivables, net",
        "accounts receivable",
        "receivables",
        "trade receivables",
    ),
    "property and equipment": (
        "property and equipment, net",
        "property, plant and equipment, net",
        "net property, plant and equipment",
        "land, buildings and equipment, net",
        "property, plant and equipment – net",
        "property, plant, and equipment, net",
    ),
    "capital expenditure": (
        "capital expenditures",
        "capital spending",
        "purchases of property and equipment",
        "purchases of property, plant and equipment",
        "payments for property and equipment",
        "payments for acquisition of property, plant and equipment",
        "additions to property and equipment",
        "capital expenditures, including internal-use software",
        "purchases of land, buildings and equipment",
        "property, plant and equipment additions",
        "additions to property, plant and equipment",
        "payments for property, plant and equipment",
        "expenditures for property, plant and equipment",
    ),
    "operating cash flow": (
        "net cash provided by operating activities",
        "net cash provided by (used in) operating activities",
        "net cash from operating activities",
        "cash provided by operating activities",
    ),
    "investing cash flow": (
        "net cash used in investing activities",
        "net cash provided by (used in) investing activities",
        "net cash from investing activities",
    ),
    "financing cash flow": (
        "net cash used in financing activities",
        "net cash provided by (used in) financing activities",
        "net cash from financing activities",
    ),
    "depreciation and amortization": (
        "depreciation and amortization",
        "depreciation, amortization and other",
        "depreciation and amortization expense",
    ),
    "dividends paid": ("dividends paid", "cash dividends paid", "dividends"),
    # Sustainability reports' key figures (GRI 302, 303, 305).
    "scope 1 emissions": (
        "scope 1",
        "scope 1 emissions",
        "scope 1 ghg emissions",
        "direct ghg emissions (scope 1)",
        "direct emissions (scope 1)",
        "direct greenhouse gas emissions (scope 1)",
    ),
    "scope 2 emissions": (
        "scope 2",
        "scope 2 emissions",
        "scope 2 ghg emissions",
        "scope 2 (market-based)",
        "scope 2 (location-based)",
        "indirect ghg emissions (scope 2)",
        "indirect emissions (scope 2)",
    ),
    "scope 3 emissions": ("scope 3", "scope 3 emissions", "scope 3 ghg emissions"),
    "energy consumption": (
        "total energy consumption",
        "energy consumption",
        "total energy consumed",
        "energy consumption within the organization",
    ),
    "water withdrawal": ("total water withdrawal", "water withdrawal", "water withdrawn"),
}

#: Items that a cash flow statement reports as outflows in parentheses.
_OUTFLOWS = frozenset({"capital expenditure", "dividends paid"})
#: Items read only from the statement of income or a note about it: "Income
#: taxes" is also a liability on the balance sheet, a payment in the cash flow
#: statement and the tax on other comprehensive income.
_INCOME_ONLY = frozenset({"income tax expense", "income before income taxes"})


def _label_of(label: str) -> str:
    """A row's own label: the part after its section, without footnote marks."""
    own = label.rsplit(": ", 1)[-1]
    return re.sub(r"\s*(?:\(\w\)|\d\)|\*+)$", "", own).strip()


# A share of a figure that is not the company's own ("net income attributable
# to noncontrolling interests") or a figure per share is never the item.
_NOT_OWN = re.compile(r"non-?controlling|minority|per (?:common )?share|per diluted", re.I)

# Where each item is stated first: the statement a row's table title names.
_BALANCE = re.compile(r"balance sheet|financial position|financial condition", re.I)
_INCOME = re.compile(r"operations|income|earnings|profit and loss", re.I)
_CASH = re.compile(r"cash flows?", re.I)
_SUSTAINABILITY = re.compile(
    r"emission|greenhouse|ghg|co2|climate|environment|energy|water|key figures", re.I
)
_STATEMENT: dict[str, re.Pattern[str]] = {
    "revenue": _INCOME,
    "cost of sales": _INCOME,
    "net income": _INCOME,
    "operating income": _INCOME,
    "income before income taxes": _INCOME,
    "income tax expense": _INCOME,
    "total assets": _BALANCE,
    "total current assets": _BALANCE,
    "total current liabilities": _BALANCE,
    "inventory": _BALANCE,
    "accounts payable": _BALANCE,
    "accounts receivable": _BALANCE,
    "property and equipment": _BALANCE,
    "capital expenditure": _CASH,
    "operating cash flow": _CASH,
    "investing cash flow": _CASH,
    "financing cash flow": _CASH,
    "depreciation and amortization": _CASH,
    "dividends paid": _CASH,
    "scope 1 emissions": _SUSTAINABILITY,
    "scope 2 emissions": _SUSTAINABILITY,
    "scope 3 emissions": _SUSTAINABILITY,
    "energy consumption": _SUSTAINABILITY,
    "water withdrawal": _SUSTAINABILITY,
}


_PRIMARY = re.compile(
    r"^(?:consolidated |combined |condensed )*(?:statements? of |balance sheets?\b)", re.I
)


_STATEMENT_WORDS = {
    concept: (
        "balance sheets financial position"
        if pattern is _BALANCE
        else "statements of cash flows"
        if pattern is _CASH
        else "statements of operations income earnings"
        if pattern is _INCOME
        else "emissions"
    )
    for concept, pattern in _STATEMENT.items()
}


def _statement_rank(concept: str, row: TableRow) -> int:
    """0 when the row's table is the financial statement that states
    ``concept`` (by its name), 1 when its title names that statement's subject
    otherwise, 2 for any other table (a cash flow statement's "Inventories"
    is a change, not the balance; a note's "Total net sales" is a segment's)."""
    title = row.title
    pattern = _STATEMENT[concept]
    fits = pattern is _CASH if _CASH.search(title) else bool(pattern.search(title))
    if not fits:
        return 2
    return 0 if _PRIMARY.match(title) else 1


def _label_key(label: str) -> str:
    """A label as compared with the catalogue's: lower case, "&" read as "and",
    without commas and with dashes and hyphens as spaces ("Property, plant,
    and equipment – net", "Property, plant and equipment-net" and "property,
    plant and equipment, net" are one label; both sides are read alike, so
    "non-current" is "non current" in the catalogue too)."""
    text = label.lower().replace("&", " and ")
    text = re.sub(r"[,\-\u2010\u2011\u2013\u2014\u2212]", " ", text)
    text = re.sub(r"\band and\b", "and", " ".join(text.split()))
    return text


_CONCEPT_KEYS: dict[str, tuple[str, ...]] = {
    concept: tuple(_label_key(name) for name in names) for concept, names in CONCEPTS.items()
}


# The total of one activity in a cash flow statement, however its verbs are
# written: "Total cash provided by operating activities", "Net cash
# provided/(used) by investing activities", "Net Cash (Used for)/Provided by
# Financing Activities", "Cash provided by operations" (after ``_label_key``).
_ACTIVITY_TOTAL = re.compile(
    r"(?:(?:net|total) )*cash (?:flows? )?(?:(?:provided|used|generated|received|from|by|in|for"
    r"|inflows?|outflows?) ?)*(?:(?P<activity>operating|investing|financing) activities"
    r"|(?P<operations>operations))"
)
# An activity's total in a table that puts the verbs in its section ("Net
# cash provided by (used in): Operating activities").
_ACTIVITY_ONLY = re.compile(r"(?P<activity>operating|investing|financing) activities")
_SCALE = re.compile(r"million|thousand|billion", re.IGNORECASE)


def _scales(units: set[str]) -> tuple[set[str], bool]:
    """The scales the rows' ``units`` name ("million", …), and whether a
    unit names none beside one that does ("($000)" beside "(in millions)":
    they may disagree)."""
    found = [m.group(0).lower() if (m := _SCALE.search(u)) else "" for u in units]
    named = {f for f in found if f}
    return named, bool(named) and "" in found


_INFLOW_WORDS = frozenset({"provided", "generated", "received", "from", "inflow", "inflows"})
_ACTIVITIES = {
    "operating cash flow": "operating",
    "investing cash flow": "investing",
    "financing cash flow": "financing",
}


def _activity_total(own: str, section: str = "") -> str | None:
    """The activity whose total cash flow a label (``_label_key``) names,
    its section read when the label is the activity alone."""

    def bare(text: str) -> str:
        return re.sub(r"\s+", " ", re.sub(r"[()/:]", " ", text)).strip()

    match = _ACTIVITY_TOTAL.fullmatch(bare(own))
    if match is not None:
        return match.group("activity") or "operating"
    alone = _ACTIVITY_ONLY.fullmatch(bare(own))
    if (
        alone is not None
        and re.search(r"\bcash\b", section)
        and not re.search(r"\bflows? from\b|\bactivities\b", section)
    ):
        return alone.group("activity")
    return None


def _concept_rank(concept: str, row: TableRow) -> int | None:
    own = _label_of(row.label)
    if _NOT_OWN.search(own) or "discontinued" in row.label:
        # A share that is not the company's own, or a discontinued operation's.
        return None
    own = _label_key(own)
    for rank, name in enumerate(_CONCEPT_KEYS[concept]):
        if own == name or (name.endswith(" to") and own.startswith(name)):
            return rank
        # A unit written after the label ("Scope 1 t", "Energy consumption MWh").
        rest = own[len(name) :].strip() if own.startswith(name + " ") else None
        if rest is not None and _UNIT_ONLY.fullmatch(rest):
            return rank
    if concept in _ACTIVITIES:
        section = _label_key(row.label.rpartition(": ")[0].rsplit(": ", 1)[-1])
        if _activity_total(own, section) == _ACTIVITIES[concept]:
            return len(_CONCEPT_KEYS[concept])
    return None


_UNIT_ONLY = re.compile(
    r"(?:in\s+)?\(?(?:t|kt|mt|tco2e?q?|t co2e?|kg|mwh|gwh|kwh|gj|tj|m3|m³|ml|%|thousand m3)\)?",
    re.IGNORECASE,
)


Get = Callable[[str, int], float]


@dataclass(frozen=True)
class Metric:
    name: str
    pattern: re.Pattern[str]
    # The years a value of the metric for fiscal year Y reads (Y itself; Y-1
    # for an average or a change).
    needs: Callable[[int], dict[str, tuple[int, ...]]]
    formula: Callable[[Get, int], float]
    # How the arithmetic is written, from the operands' written values.
    spell: Callable[[Callable[[str, int], str], int], str]
    percent: bool = False


def _avg(get: Get, concept: str, y: int) -> float:
    return (get(concept, y) + get(concept, y - 1)) / 2


def _avg_spell(w: Callable[[str, int], str], concept: str, y: int) -> str:
    return f"(({w(concept, y - 1)} + {w(concept, y)}) / 2)"


def _both(*concepts: str) -> Callable[[int], dict[str, tuple[int, ...]]]:
    return lambda y: {c: (y, y - 1) for c in concepts}


def _metric(
    name: str,
    pattern: str,
    needs: Callable[[int], dict[str, tuple[int, ...]]],
    formula: Callable[[Get, int], float],
    spell: Callable[[Callable[[str, int], str], int], str],
    *,
    percent: bool = False,
) -> Metric:
    return Metric(name, re.compile(pattern, re.IGNORECASE), needs, formula, spell, percent)


def _dpo(get: Get, y: int) -> float:
    purchases = get("cost of sales", y) + get("inventory", y) - get("inventory", y - 1)
    return 365 * _avg(get, "accounts payable", y) / purchases


def _dio(get: Get, y: int) -> float:
    return 365 * _avg(get, "inventory", y) / get("cost of sales", y)


def _dso(get: Get, y: int) -> float:
    return 365 * _avg(get, "accounts receivable", y) / get("revenue", y)


class _Undefined(ArithmeticError):
    """A metric with no meaning for the figures given; the message says why."""


def _tax_rate(get: Get, y: int) -> float:
    pretax = get("income before income taxes", y)
    if pretax <= 0:
        raise _Undefined(f"income before income taxes is not positive in FY{y}")
    return 100 * get("income tax expense", y) / pretax


def _ebitda(get: Get, y: int) -> float:
    return get("operating income", y) + get("depreciation and amortization", y)


METRICS: tuple[Metric, ...] = (
    _metric(
        "Cash conversion cycle",
        r"cash conversion cycle|\bCCC\b",
        lambda y: {
            "inventory": (y, y - 1),
            "accounts receivable": (y, y - 1),
            "accounts payable": (y, y - 1),
            "cost of sales": (y,),
            "revenue": (y,),
        },
        lambda g, y: _dio(g, y) + _dso(g, y) - _dpo(g, y),
        lambda w, y: (
            f"DIO + DSO - DPO = 365 × {_avg_spell(w, 'inventory', y)} / {w('cost of sales', y)}"
            f" + 365 × {_avg_spell(w, 'accounts receivable', y)} / {w('revenue', y)}"
            f" - 365 × {_avg_spell(w, 'accounts payable', y)} / ({w('cost of sales', y)}"
            f" + {w('inventory', y)} - {w('inventory', y - 1)})"
        ),
    ),
    _metric(
        "Days payable outstanding",
        r"days payables? outstanding|\bDPO\b",
        lambda y: {"accounts payable": (y, y - 1), "inventory": (y, y - 1), "cost of sales": (y,)},
        _dpo,
        lambda w, y: (
            f"365 × {_avg_spell(w, 'accounts payable', y)} / ({w('cost of sales', y)} + "
            f"{w('inventory', y)} - {w('inventory', y - 1)})"
        ),
    ),
    _metric(
        "Days inventory outstanding",
        r"days inventory outstanding|\bDIO\b",
        lambda y: {"inventory": (y, y - 1), "cost of sales": (y,)},
        _dio,
        lambda w, y: f"365 × {_avg_spell(w, 'inventory', y)} / {w('cost of sales', y)}",
    ),
    _metric(
        "Days sales outstanding",
        r"days sales outstanding|\bDSO\b",
        lambda y: {"accounts receivable": (y, y - 1), "revenue": (y,)},
        _dso,
        lambda w, y: f"365 × {_avg_spell(w, 'accounts receivable', y)} / {w('revenue', y)}",
    ),
    _metric(
        "Fixed asset turnover ratio",
        r"fixed asset turnover",
        lambda y: {"revenue": (y,), "property and equipment": (y, y - 1)},
        lambda g, y: g("revenue", y) / _avg(g, "property and equipment", y),
        lambda w, y: f"{w('revenue', y)} / {_avg_spell(w, 'property and equipment', y)}",
    ),
    _metric(
        "Inventory turnover ratio",
        r"inventory turnover",
        lambda y: {"cost of sales": (y,), "inventory": (y, y - 1)},
        lambda g, y: g("cost of sales", y) / _avg(g, "inventory", y),
        lambda w, y: f"{w('cost of sales', y)} / {_avg_spell(w, 'inventory', y)}",
    ),
    _metric(
        "Asset turnover ratio",
        r"asset turnover",
        lambda y: {"revenue": (y,), "total assets": (y, y - 1)},
        lambda g, y: g("revenue", y) / _avg(g, "total assets", y),
        lambda w, y: f"{w('revenue', y)} / {_avg_spell(w, 'total assets', y)}",
    ),
    _metric(
        "Return on assets",
        r"return on assets|\bROA\b",
        lambda y: {"net income": (y,), "total assets": (y, y - 1)},
        lambda g, y: g("net income", y) / _avg(g, "total assets", y),
        lambda w, y: f"{w('net income', y)} / {_avg_spell(w, 'total assets', y)}",
    ),
    _metric(
        "Quick ratio",
        r"quick ratio",
        lambda y: {
            "total current assets": (y,),
            "inventory": (y,),
            "total current liabilities": (y,),
        },
        lambda g, y: (
            (g("total current assets", y) - g("inventory", y)) / g("total current liabilities", y)
        ),
        lambda w, y: (
            f"({w('total current assets', y)} - {w('inventory', y)}) / "
            f"{w('total current liabilities', y)}"
        ),
    ),
    _metric(
        "Working capital ratio",
        r"working capital ratio|current ratio",
        lambda y: {"total current assets": (y,), "total current liabilities": (y,)},
        lambda g, y: g("total current assets", y) / g("total current liabilities", y),
        lambda w, y: f"{w('total current assets', y)} / {w('total current liabilities', y)}",
    ),
    _metric(
        "Net working capital",
        r"working capital",
        lambda y: {"total current assets": (y,), "total current liabilities": (y,)},
        lambda g, y: g("total current assets", y) - g("total current liabilities", y),
        lambda w, y: f"{w('total current assets', y)} - {w('total current liabilities', y)}",
    ),
    _metric(
        "Free cash flow",
        r"free cash flow|\bFCF\b",
        lambda y: {"operating cash flow": (y,), "capital expenditure": (y,)},
        lambda g, y: g("operating cash flow", y) - g("capital expenditure", y),
        lambda w, y: f"{w('operating cash flow', y)} - {w('capital expenditure', y)}",
    ),
    _metric(
        "Unadjusted EBITDA less capex",
        r"EBITDA less capex|EBITDA minus capex",
        lambda y: {
            "operating income": (y,),
            "depreciation and amortization": (y,),
            "capital expenditure": (y,),
        },
        lambda g, y: _ebitda(g, y) - g("capital expenditure", y),
        lambda w, y: (
            f"{w('operating income', y)} + {w('depreciation and amortization', y)} - "
            f"{w('capital expenditure', y)}"
        ),
    ),
    _metric(
        "Unadjusted EBITDA margin",
        r"EBITDA\s*%?\s*margin",
        lambda y: {
            "operating income": (y,),
            "depreciation and amortization": (y,),
            "revenue": (y,),
        },
        lambda g, y: 100 * _ebitda(g, y) / g("revenue", y),
        lambda w, y: (
            f"({w('operating income', y)} + {w('depreciation and amortization', y)}) / "
            f"{w('revenue', y)}"
        ),
        percent=True,
    ),
    _metric(
        "Retention ratio",
        r"retention ratio",
        lambda y: {"net income": (y,), "dividends paid": (y,)},
        lambda g, y: (g("net income", y) - g("dividends paid", y)) / g("net income", y),
        lambda w, y: f"({w('net income', y)} - {w('dividends paid', y)}) / {w('net income', y)}",
    ),
    _metric(
        "Capital expenditure as a share of revenue",
        r"(?:capex|capital expenditures?)\s+as\s+a\s+%\s+of\s+revenue",
        lambda y: {"capital expenditure": (y,), "revenue": (y,)},
        lambda g, y: 100 * g("capital expenditure", y) / g("revenue", y),
        lambda w, y: f"{w('capital expenditure', y)} / {w('revenue', y)}",
        percent=True,
    ),
    _metric(
        "Cost of sales as a share of revenue",
        r"(?:cost of goods sold|COGS|cost of sales)\s+as\s+a\s+%\s+of\s+revenue",
        lambda y: {"cost of sales": (y,), "revenue": (y,)},
        lambda g, y: 100 * g("cost of sales", y) / g("revenue", y),
        lambda w, y: f"{w('cost of sales', y)} / {w('revenue', y)}",
        percent=True,
    ),
    _metric(
        "Net profit margin",
        r"net (?:profit|income) margin",
        lambda y: {"net income": (y,), "revenue": (y,)},
        lambda g, y: 100 * g("net income", y) / g("revenue", y),
        lambda w, y: f"{w('net income', y)} / {w('revenue', y)}",
        percent=True,
    ),
    _metric(
        "Gross margin",
        r"gross (?:profit )?margin",
        lambda y: {"revenue": (y,), "cost of sales": (y,)},
        lambda g, y: 100 * (g("revenue", y) - g("cost of sales", y)) / g("revenue", y),
        lambda w, y: f"({w('revenue', y)} - {w('cost of sales', y)}) / {w('revenue', y)}",
        percent=True,
    ),
    _metric(
        "Operating margin",
        r"operating (?:profit )?margin",
        lambda y: {"operating income": (y,), "revenue": (y,)},
        lambda g, y: 100 * g("operating income", y) / g("revenue", y),
        lambda w, y: f"{w('operating income', y)} / {w('revenue', y)}",
        percent=True,
    ),
    _metric(
        "Effective tax rate",
        r"effective (?:income )?tax rate",
        lambda y: {"income tax expense": (y,), "income before income taxes": (y,)},
        _tax_rate,
        lambda w, y: f"{w('income tax expense', y)} / {w('income before income taxes', y)}",
        percent=True,
    ),
    _metric(
        "Revenue growth",
        r"(?:year[- ]over[- ]year|yoy)\s+change\s+in\s+(?:total\s+)?revenue|revenue growth",
        _both("revenue"),
        lambda g, y: 100 * (g("revenue", y) - g("revenue", y - 1)) / g("revenue", y - 1),
        lambda w, y: f"({w('revenue', y)} - {w('revenue', y - 1)}) / {w('revenue', y - 1)}",
        percent=True,
    ),
)

# One line item asked for as it stands ("what is Best Buy's total amount of
# inventories at the end of FY2019"), by the words a question uses for it.
ITEMS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p, re.IGNORECASE), concept)
    for p, concept in (
        (r"net income attributable to shareholders|net income", "net income"),
        (r"\bCOGS\b|cost of goods sold|cost of sales", "cost of sales"),
        (r"total current assets", "total current assets"),
        (r"total current liabilities", "total current liabilities"),
        (r"total assets", "total assets"),
        (r"inventor(?:y|ies)", "inventory"),
        (
            r"net property,? plant,? and equipment|net PP&E|property and equipment",
            "property and equipment",
        ),
        (r"capital expenditure|capex", "capital expenditure"),
        (r"cash (?:flow )?from operations|operating cash flow", "operating cash flow"),
        (r"accounts payable", "accounts payable"),
        (r"scope 1\b(?! and| \+|,)", "scope 1 emissions"),
        (r"scope 2\b(?! and| \+|,)", "scope 2 emissions"),
        (r"scope 3\b", "scope 3 emissions"),
        (
            r"energy (?:consumption|consumed|use)|consume[ds]? .{0,20}energy|energy did",
            "energy consumption",
        ),
        (r"water withdrawal|withdr[ae]w .{0,20}water|water withdrawn", "water withdrawal"),
        (r"total revenue|net revenue|revenue|net sales", "revenue"),
    )
)

_FY = re.compile(
    r"\b(?:FY\s?|fiscal(?: year)?\s+|(?<=in )|(?<=for )|(?<=during ))((?:19|20)\d\d)\b",
    re.IGNORECASE,
)
_AVERAGE = re.compile(r"\b(\d|two|three|four|five)[- ]year average\b", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Computed:
    """A figure computed from cited rows: the sentence and the rows it read.
    ``sure`` is False when an operand came from a table that is not the
    statement stating it (a note, a table whose title was not read) or when
    the operands' scales could not all be read: the answer then cites at a
    lower confidence."""

    text: str
    value: float
    rows: tuple[TableRow, ...]
    sure: bool = True


@dataclass(frozen=True, slots=True)
class Missing:
    """A metric recognised but not computable from the sources, and why."""

    text: str


# A yes/no question is not answered by a figure alone.
_POLAR = re.compile(r"\s*(?:is|are|was|were|does|do|did|has|have|had|can|will|should)\b", re.I)
# A question about causes or reasons is answered in words, not by a figure.
_WHY = re.compile(
    r"\b(?:what drove|drove|drive|driven|why|how did|how has|explain|describe)\b", re.I
)
# A question about a change, a comparison, a part of the company or a forecast
# asks for something other than the level of a line item or metric.
_OTHER = re.compile(
    r"\b(?:change[sd]?|difference|differ|increase[sd]?|decrease[sd]?|decline[sd]?|drop(?:ped)?"
    r"|rise|rose|grow|grew|compare[sd]?|comparison|versus|vs\.?|guidance|outlook|forecast"
    r"|expect(?:ed|s)?|segments?|regions?|geograph\w*|europe\w*|asia\w*|americas?"
    r"|international|domestic|services|products|excluding|adjusted|organic|constant currency"
    r"|per share|by how much|combined|together|sum of)\b",
    re.IGNORECASE,
)
_WHAT = re.compile(r"\b(?:what (?:is|was|were|are)|how much|how many)\b", re.IGNORECASE)
_NOT_AN_ITEM = re.compile(r"ratio|margin|%|percent|growth|change|cagr|average|turnover", re.I)


def _asked(question: str) -> tuple[Metric | None, str | None]:
    """The metric, or else the line item, the question asks the level of for a
    fiscal year it names; (None, None) for any other question (yes/no, why,
    a change or comparison, a segment, a forecast, no fiscal year)."""
    # The ask is the question's first sentence; what follows may define the
    # metric ("... + change in inventory between FY2016 and FY2017").
    ask = question.split("?", 1)[0]
    if not _FY.search(question) or _POLAR.match(question) or _WHY.search(ask):
        return None, None
    metric = next((m for m in METRICS if m.pattern.search(ask)), None)
    if metric is not None and metric.name == "Revenue growth":
        return metric, None
    if _OTHER.search(ask) or _CAGR.search(ask):
        return None, None
    if metric is not None:
        return metric, None
    return None, _asked_item(question)


def _asked_item(question: str) -> str | None:
    """The line item a "what is / how much" question asks for as it stands,
    named within a few words of the question word; None for anything else."""
    what = _WHAT.search(question)
    if what is None or _NOT_AN_ITEM.search(question):
        return None
    after = question[what.end() : what.end() + 90]
    for pattern, concept in ITEMS:
        if pattern.search(after):
            return concept
    return None


def _years(question: str) -> list[int]:
    """The fiscal years a question asks about: the last one it names, or, for
    an "N year average", the N years up to it ("FY2017 - FY2019 3 year
    average", "FY2019 3 year average")."""
    named = sorted({int(y) for y in _FY.findall(question)})
    if not named:
        return []
    average = _AVERAGE.search(question)
    if average is None:
        return named[-1:]
    word = average.group(1).lower()
    span = WORD_VALUES.get(word) or int(word)
    first = min(named[0], named[-1] - span + 1)
    return list(range(first, named[-1] + 1))


def _decimals(question: str, percent: bool) -> int:
    m = re.search(r"(one|two|three|\d) decimal", question, re.IGNORECASE)
    if m:
        return WORD_VALUES.get(m.group(1).lower()) or int(m.group(1))
    return 1 if percent else 2


def _letters(text: str) -> str:
    return re.sub(r"[^a-z]", "", text.lower())


def _company_key(source: Source) -> str:
    """The name a document is known by: the first word of its file name (its
    id's last path part, "ACTIVISIONBLIZZARD_2019_10K" -> "activisionblizzard"),
    else of its title; letters only, lower case."""
    stem = source.doc_id.rsplit("/", 1)[-1]
    words = re.findall(r"[A-Za-z]+", stem) or re.findall(r"[A-Za-z]+", source.title)
    return _letters(words[0]) if words else ""


def company_sources(question: str, sources: Sequence[Source]) -> set[int]:
    """The sources whose document the question names: the document's name
    (``_company_key``) equals one to three consecutive words of the question
    run together ("Activision Blizzard" names ACTIVISIONBLIZZARD_2019_10K,
    "American Airlines" does not name AMERICANEXPRESS_2022_10K)."""
    plain = re.sub(r"['’]s\b", "", question)
    words = [_letters(w) for w in re.findall(r"[A-Za-z][A-Za-z.]*", plain)]
    words = [w for w in words if w]
    runs = {"".join(words[i : i + n]) for n in (1, 2, 3) for i in range(len(words) - n + 1)}
    out: set[int] = set()
    for i, s in enumerate(sources):
        key = _company_key(s)
        if len(key) >= 3 and key in runs and key not in _COMMON_WORDS:
            out.add(i)
    return out


# Words a file name may start with that name no company.
_COMMON_WORDS = frozenset(
    {"annual", "report", "the", "total", "form", "financial", "statements", "sustainability"}
)


def _filing_year(source: Source) -> int | None:
    years = _YEAR.findall(source.title or source.doc_id)
    return int(years[0]) if years else None


class _Lookup:
    """Operand values from one company's rows, each kept with its row."""

    def __init__(
        self,
        rows: list[TableRow],
        sources: Sequence[Source],
        latest: int,
        years: dict[str, set[int]] | None = None,
    ) -> None:
        self.rows = rows
        self.sources = sources
        self.latest = latest
        # Every year each item is read for: one row that states them all is
        # preferred to rows of different tables for different years.
        self.years = years or {}
        self.used: dict[tuple[str, int], tuple[float, str, TableRow]] = {}
        self.missing: list[tuple[str, int]] = []
        # An operand read from a table that is not its statement (a note, a
        # table whose title was not read).
        self.unsure = False

    def _find(self, concept: str, year: int) -> tuple[float, str, TableRow] | None:
        best: tuple[tuple[int, int, int, int, int], float, str, TableRow] | None = None
        for row in self.rows:
            rank = _concept_rank(concept, row)
            if rank is None:
                continue
            found = row.value(year)
            if found is None:
                continue
            statement = _statement_rank(concept, row)
            if statement == 2 and _CASH.search(row.title) and _STATEMENT[concept] is _BALANCE:
                # A cash flow statement's "Inventories" is the year's change.
                continue
            if concept in _INCOME_ONLY and (
                _BALANCE.search(row.title)
                or _CASH.search(row.title)
                or "comprehensive" in row.label.rpartition(": ")[0]
            ):
                # A liability, a payment, or the tax on other comprehensive income.
                continue
            filed = _filing_year(self.sources[row.source])
            # The statement that states the item first; then the filing of the
            # latest year asked; then the label most preferred.
            distance = abs((filed or self.latest) - self.latest)
            lacking = sum(row.value(y) is None for y in self.years.get(concept, ()))
            key = (statement, lacking, distance, rank, row.source)
            if best is None or key < best[0]:
                best = (key, found[0], found[1], row)
        if best is None:
            return None
        self.unsure = self.unsure or best[0][0] == 2
        value = best[1]
        if concept in _OUTFLOWS or (concept == "income tax expense" and _printed_as_cost(best[3])):
            value = abs(value)
        return value, best[2], best[3]

    def get(self, concept: str, year: int) -> float:
        key = (concept, year)
        if key not in self.used:
            found = self._find(concept, year)
            if found is None:
                self.missing.append(key)
                raise LookupError(key)
            self.used[key] = found
        return self.used[key][0]

    def written(self, concept: str, year: int) -> str:
        value, written, _ = self.used[(concept, year)]
        if concept in _OUTFLOWS or (concept == "income tax expense" and value >= 0):
            return written.strip("()")
        return written


def _printed_as_cost(row: TableRow) -> bool:
    """Whether a tax row prints its expense as a deduction: every year of it in
    parentheses, under a label that does not say "benefit" (a row with a
    benefit in one year and an expense in another prints them with opposite
    signs, and "Income tax expense (benefit)" prints a benefit negative)."""
    if "benefit" in row.label:
        return False
    values = [_number(written) for _, written in row.cells]
    read = [v for v in values if v is not None]
    return bool(read) and all(v < 0 for v in read)


def _format(value: float, decimals: int) -> str:
    return f"{value:,.{decimals}f}"


def operand_queries(question: str) -> list[str]:
    """What to search for a question that asks for a metric or line item: one
    query per line item it reads, its most common label and the years asked
    ("property and equipment, net 2019 2018"); [] for any other question."""
    return [query for _, query in line_item_searches(question)]


def holds_line_item(text: str, concept: str) -> bool:
    """Whether a passage holds a table row of ``concept`` (by one of its labels)."""
    rows = table_rows([Source(doc_id="", text=text, passage_index=0)])
    return any(_concept_rank(concept, row) is not None for row in rows)


def line_item_searches(question: str) -> list[tuple[str, str]]:
    """``operand_queries`` with the line item each query is for."""
    years = _years(question)
    metric, item = _asked(question)
    needed: dict[str, set[int]] = {}
    compared = _compared(question)
    ranked = _ranked_activities(question) if compared is None else None
    if ranked is not None:
        needed = {concept: {ranked[0]} for concept in _ACTIVITIES}
    elif compared is not None:
        for y in (compared.first, compared.last):
            needs = (
                compared.metric.needs(y)
                if compared.metric is not None
                else {compared.item or "": (y,)}
            )
            for concept, ys in needs.items():
                needed.setdefault(concept, set()).update(ys)
    elif metric is not None:
        for y in years:
            for concept, ys in metric.needs(y).items():
                needed.setdefault(concept, set()).update(ys)
    elif item is not None:
        needed[item] = set(years)
    elif _CAGR.search(question) and len(_FY.findall(question)) > 1 and not _WHY.search(question):
        named = sorted({int(y) for y in _FY.findall(question)})
        needed["revenue"] = {named[0], named[-1]}
    else:
        return []
    # A line item's three most common labels (a BM25 query matches any) and
    # the name of the statement that states it (every row repeats its table's
    # title, so the statement's rows match it).
    return [
        (
            concept,
            f"{_STATEMENT_WORDS[concept]} {' '.join(CONCEPTS[concept][:3])} "
            f"{' '.join(str(y) for y in sorted(ys, reverse=True))}",
        )
        for concept, ys in needed.items()
    ]


# A change of one metric or line item between two fiscal years, asked in one
# of a few plain forms (``_FORMS``) and nothing more: "How much has the
# effective tax rate of American Express changed between FY2021 and FY2022?",
# "What is the change in Acme's net sales from FY2018 to FY2019?", "How does
# Acme's gross margin in FY2019 compare to FY2018?", "What is the difference
# between Acme's FY2019 and FY2018 net sales?", "Has Acme increased its total
# assets between FY2018 and FY2019?". A question that says anything else
# (a cause, a threshold, a part of the company, a judgement) matches none.
_Y = r"(?:FY\s?|fiscal(?:\s+year)?\s+)?((?:19|20)\d\d)"
_UPWARD = r"increas(?:e|ed|es)|r(?:ise|isen|ises|ose)|gr(?:ow|own|ows|ew)"
_DOWNWARD = r"decreas(?:e|ed|es)|declin(?:e|ed|es)|f(?:all|allen|alls|ell)|drop(?:ped|s)?"
_MOVED = rf"chang(?:e|ed|es)|{_UPWARD}|{_DOWNWARD}"
_SPAN = (
    rf"(?:between\s+{_Y}\s+and\s+(?:the\s+)?{_Y}|from\s+{_Y}\s+to\s+(?:the\s+)?{_Y})"
    r"(?:\s+(?:period|fiscal\s+year))?"
)
_FORMS = tuple(
    re.compile(form, re.IGNORECASE)
    for form in (
        rf"^(?:by\s+)?how\s+much\s+(?:has|have|did|had)\s+(?P<subject>.+?)\s+(?P<moved>{_MOVED})"
        rf"\s+{_SPAN}$",
        rf"^what\s+(?:is|was)\s+the\s+(?:(?:percent|percentage)\s+)?(?:change|difference)\s+in\s+"
        rf"(?P<subject>.+?)\s+{_SPAN}$",
        rf"^how\s+(?:does|did)\s+(?P<subject>.+?)\s+in\s+{_Y}\s+compare\s+(?:to|with)\s+"
        rf"(?:that\s+(?:of|in)\s+)?{_Y}$",
        rf"^what\s+(?:is|was)\s+the\s+difference\s+between\s+(?P<owner>.+?)\s+{_Y}\s+and\s+"
        rf"{_Y}\s+(?P<subject>.+)$",
        rf"^(?P<polar>did|has|have|had)\s+(?P<subject>.+?)\s+(?P<moved>{_MOVED})\s+{_SPAN}$",
        # "Has Acme increased its total assets between ...": the company, the verb, the item.
        rf"^(?P<polar>did|has|have|had)\s+(?P<owner>[A-Z][^\s]*(?:\s+[A-Z][^\s]*){{0,3}})\s+"
        rf"(?P<moved>{_MOVED})\s+(?P<subject>.+?)\s+{_SPAN}$",
        rf"^(?P<polar>was|were)\s+there\s+(?:any\s+|an?\s+)?"
        rf"(?P<moved>change|increase|decrease|decline|drop|rise|fall)\s+in\s+(?P<subject>.+?)\s+"
        rf"{_SPAN}$",
    )
)
_UP = re.compile(rf"^(?:{_UPWARD})$", re.IGNORECASE)
_DOWN = re.compile(rf"^(?:{_DOWNWARD})$", re.IGNORECASE)
# Words a subject may hold besides the item and the company's name.
_SUBJECT_WORDS = frozenset(
    {"the", "its", "their", "of", "for", "company", "total", "consolidated", "reported"}
)


@dataclass(frozen=True, slots=True)
class _Comparison:
    metric: Metric | None
    item: str | None
    first: int
    last: int
    polar: bool  # a yes/no question
    direction: int  # +1 asks about a rise, -1 about a fall, 0 about any change


def _compared(question: str) -> _Comparison | None:
    """The comparison a question asks for in one of ``_FORMS``: one metric or
    line item, two fiscal years, and for a yes/no question whether it asks
    about a rise, a fall or any change; None for any other question, which
    is left to the reader."""
    ask = " ".join(question.split("?", 1)[0].split())
    for form in _FORMS:
        match = form.match(ask)
        if match is not None:
            break
    else:
        return None
    groups = match.groupdict()
    years = {int(y) for y in match.groups() if y is not None and y.isdigit()}
    if len(years) != 2:
        return None
    subject = " ".join(filter(None, (groups.get("owner"), groups["subject"])))
    metrics = [m for m in METRICS if m.pattern.search(subject)]
    item = None
    if metrics:
        if len(metrics) > 1 or metrics[0].name == "Revenue growth":
            return None
        metric: Metric | None = metrics[0]
        rest = metrics[0].pattern.sub(" ", subject)
    else:
        metric = None
        found = [(p, c) for p, c in ITEMS if p.search(subject)]
        if len({c for _, c in found}) != 1:
            return None
        pattern, item = found[0]
        rest = pattern.sub(" ", subject)
    # What is left names the company and nothing else ("Acme's", "of American
    # Express"): "deferred revenue", "net sales in China" or "Q2 net sales"
    # is another figure than the line item.
    for word in re.findall(r"[^\s]+", rest):
        bare = re.sub(r"['’]s?$", "", word.strip(",.()"))
        if not bare or bare.lower() in _SUBJECT_WORDS:
            continue
        if not bare[0].isupper() or any(ch.isdigit() for ch in bare):
            return None
    moved = groups.get("moved") or ""
    direction = 1 if _UP.match(moved) else -1 if _DOWN.match(moved) else 0
    first, last = sorted(years)
    return _Comparison(metric, item, first, last, bool(groups.get("polar")), direction)


def _compare(
    question: str, asked: _Comparison, sources: Sequence[Source]
) -> Computed | Missing | None:
    """The metric or line item in each of the two years, and the change: for a
    yes/no question, "Yes." or "No." first, by whether it rose, fell or
    changed as asked."""
    years = (asked.first, asked.last)
    metric, item = asked.metric, asked.item
    read = _read(question, sources, metric, item, years, "compared")
    if not isinstance(read, tuple):
        return read
    lookup, values, spelled, name = read
    spelled = [f"{w} = " if metric is not None else "" for w in spelled]
    units = {r.unit.lower() for _, _, r in lookup.used.values()}
    scales, unread = _scales(units)
    if len(scales) > 1 or unread:
        # Rows on different scales, or one whose scale could not be read beside
        # one whose scale was ("($000)" and "(in millions)").
        return Missing(
            f"{name} cannot be compared: the rows it needs are not all on one scale "
            f"({', '.join(sorted(units))})."
        )
    rows_used = tuple(dict.fromkeys(r for _, _, r in lookup.used.values()))
    if metric is None and rows_used and rows_used[0].name:
        name = rows_used[0].name
    percent = metric.percent if metric is not None else False
    if metric is not None:
        decimals = _decimals(question, percent)
    else:
        decimals = max((_places(lookup.written(item or "", y)) for y in years), default=0)
    asked_scale = re.search(
        r"\bin (?:USD |US\$ |\$ ?)?(millions|billions|thousands)\b", question, re.I
    )
    if metric is None and asked_scale and len(scales) == 1:
        have, want = next(iter(scales)), asked_scale.group(1).lower().rstrip("s")
        factors = {"thousand": 1e3, "million": 1e6, "billion": 1e9}
        if have != want:
            values = [v * factors[have] / factors[want] for v in values]
            scales, decimals = {want}, 2
    first, last = values
    change = last - first
    suffix = "%" if percent else ""
    unit = f" {next(iter(scales))}" if metric is None and scales else ""
    dollars = metric is None and (
        bool(re.search(r"\bUSD\b|\$|dollars", question)) or any("$" in u for u in units)
    )
    money = "$" if dollars else ""
    # A percentage's values with one more place than its change, as an
    # average's are; a change too small for the places asked gets more.
    places = decimals + 1 if percent else decimals
    shown = decimals
    while change and round(change, shown) == 0 and shown < decimals + 4:
        shown += 1

    def amount(v: float) -> str:
        return f"{money}{_format(v, places)}{unit}{suffix}"

    each = "; ".join(
        f"FY{y}: {sp}{amount(v)}" for y, sp, v in zip(years, spelled, values, strict=True)
    )
    if not change:
        moved = "no change"
    else:
        size = (
            f"{_format(abs(change), shown)} percentage points"
            if percent
            else f"{money}{_format(abs(change), shown)}{unit}"
        )
        ratio = 100 * change / first if not percent and first > 0 else 0.0
        share = f" ({ratio:+.1f}%)" if abs(ratio) >= 0.05 else ""
        moved = f"{'an increase' if change > 0 else 'a decrease'} of {size}{share}"
    text = f"{name}, {each}; {moved}."
    if asked.polar:
        # Decided on the figures as computed, not as rounded for display.
        sign = (change > 0) - (change < 0)
        yes = sign != 0 if asked.direction == 0 else sign == asked.direction
        text = f"{'Yes' if yes else 'No'}. {text}"
    return Computed(text, change, rows_used, not lookup.unsure)


def _places(written: str) -> int:
    """Decimal places a value is written with ("1,234.5" has 1)."""
    digits = written.strip("()$ ")
    return len(digits.rsplit(".", 1)[1]) if "." in digits else 0


def asked_years(question: str) -> list[int]:
    """The fiscal years ``compute`` reads for the question (the last one last)."""
    compared = _compared(question)
    if compared is not None:
        return [compared.first, compared.last]
    return _years(question)


def _read(
    question: str,
    sources: Sequence[Source],
    metric: Metric | None,
    item: str | None,
    years: Sequence[int],
    verb: str,
) -> tuple[_Lookup, list[float], list[str], str] | Missing | None:
    """The metric or line item in each of ``years`` from the rows of the
    company's sources, each with its arithmetic written out, and its name;
    ``Missing`` naming what is lacking ("… cannot be <verb>"); None when the
    question names no company among the sources."""
    owned = company_sources(question, sources)
    if not owned:
        return None
    rows = [r for r in table_rows(sources) if r.source in owned]
    needed: dict[str, set[int]] = {}
    for y in years:
        for concept, ys in (metric.needs(y) if metric is not None else {item or "": (y,)}).items():
            needed.setdefault(concept, set()).update(ys)
    lookup = _Lookup(rows, sources, years[-1], needed)
    name = metric.name if metric is not None else (item or "").capitalize()
    values: list[float] = []
    spelled: list[str] = []
    try:
        for y in years:
            if metric is not None:
                values.append(metric.formula(lookup.get, y))
                spelled.append(metric.spell(lookup.written, y))
            else:
                assert item is not None
                values.append(lookup.get(item, y))
                spelled.append(lookup.written(item, y))
    except LookupError:
        concept, year = lookup.missing[-1]
        return Missing(f"No source states {concept} for FY{year}, so {name} cannot be {verb}.")
    except ZeroDivisionError:
        return Missing(f"{name} cannot be {verb}: a divisor is zero in the sources.")
    except _Undefined as undefined:
        return Missing(f"{name} cannot be {verb}: {undefined}.")
    return lookup, values, spelled, name


def compute(question: str, sources: Sequence[Source]) -> Computed | Missing | None:
    """The metric or line item the question asks for, computed from the rows of
    the company's sources; ``Missing`` when it is recognised and the company's
    rows lack an operand; None when the question asks for neither, names no
    fiscal year, or names no company among the sources."""
    compared = _compared(question)
    if compared is not None:
        return _compare(question, compared, sources)
    ranked = _ranked_activities(question)
    if ranked is not None:
        return _activities(question, sources, *ranked)
    years = _years(question)
    if not years:
        return None
    metric, item = _asked(question)
    if metric is None and item is None:
        if _CAGR.search(question) and len(_FY.findall(question)) > 1 and not _WHY.search(question):
            named = sorted({int(y) for y in _FY.findall(question)})
            return _cagr(question, sources, named[0], named[-1])
        return None
    read = _read(question, sources, metric, item, years, "computed")
    if not isinstance(read, tuple):
        return read
    lookup, values, spelled, name = read
    units = {r.unit.lower() for _, _, r in lookup.used.values()}
    # An operand whose scale was not read beside one whose scale was: they may
    # disagree ("(in thousands)" and "($000)"), so the answer is cited lower.
    scales, unread_scale = _scales(units)
    if len(scales) > 1:
        return Missing(
            f"{name} cannot be computed: the rows it needs are in different units "
            f"({', '.join(sorted(scales))})."
        )
    percent = metric.percent if metric is not None else False
    decimals = _decimals(question, percent)
    result = sum(values) / len(values)
    asked_scale = re.search(
        r"\bin (?:USD |US\$ |\$ ?)?(millions|billions|thousands)\b", question, re.I
    )
    factor = 1.0
    if metric is None and asked_scale and len(scales) == 1:
        have = next(iter(scales))
        want = asked_scale.group(1).lower().rstrip("s")
        factors = {"thousand": 1e3, "million": 1e6, "billion": 1e9}
        factor = factors[have] / factors[want]
        if factor != 1.0:
            decimals = 2
            result *= factor
            scales = {want}
    suffix = "%" if percent else ""
    label = f"FY{years[0]}–FY{years[-1]} average" if len(years) > 1 else f"FY{years[0]}"
    dollars = bool(re.search(r"\bUSD\b|\$|dollars", question)) or any("$" in u for u in units)
    unit = f" {next(iter(scales))}" if metric is None and scales else ""
    if metric is None and dollars:
        spelled = [f"${w.lstrip('$')}" for w in spelled]
    if len(years) > 1:
        each = "; ".join(
            f"FY{y}: {s} = {_format(v, decimals + 1)}{suffix}"
            for y, s, v in zip(years, spelled, values, strict=True)
        )
        arithmetic = f"{each}; average = {_format(result, decimals)}{suffix}"
    elif metric is not None:
        arithmetic = f"{spelled[0]} = {_format(result, decimals)}{suffix}"
    elif factor != 1.0:
        arithmetic = (
            f"{spelled[0]} {have} = {'$' if dollars else ''}{_format(result, decimals)}{unit}"
        )
    else:
        arithmetic = f"{spelled[0]}{unit}"
    rows_used = tuple(dict.fromkeys(r for _, _, r in lookup.used.values()))
    if metric is None and rows_used and rows_used[0].name:
        # A line item is named as its row names it ("Net sales", "Inventories").
        name = rows_used[0].name
    # A scale asked for ("in USD billions") that the rows do not state.
    unknown_scale = bool(asked_scale) and not scales
    sure = not lookup.unsure and not unread_scale and not unknown_scale
    return Computed(f"{name}, {label}: {arithmetic}.", result, rows_used, sure)


_CAGR = re.compile(r"\bCAGR\b|compound annual growth", re.IGNORECASE)


def _cagr(
    question: str, sources: Sequence[Source], first: int, last: int
) -> Computed | Missing | None:
    """Revenue's compound annual growth from ``first`` to ``last``."""
    owned = company_sources(question, sources)
    if not owned:
        return None
    rows = [r for r in table_rows(sources) if r.source in owned]
    lookup = _Lookup(rows, sources, last)
    name = "Revenue CAGR"
    try:
        start, end = lookup.get("revenue", first), lookup.get("revenue", last)
    except LookupError:
        concept, year = lookup.missing[-1]
        return Missing(f"No source states {concept} for FY{year}, so {name} cannot be computed.")
    if start <= 0 or end <= 0:
        return Missing(f"{name} cannot be computed from a revenue that is not positive.")
    n = last - first
    value = 100 * ((end / start) ** (1 / n) - 1)
    decimals = _decimals(question, True)
    text = (
        f"{name}, FY{first}–FY{last}: ({lookup.written('revenue', last)} / "
        f"{lookup.written('revenue', first)})^(1/{n}) - 1 = {_format(value, decimals)}%."
    )
    used = tuple(dict.fromkeys(r for _, _, r in lookup.used.values()))
    return Computed(text, value, used, not lookup.unsure)


# "Among operations, investing, and financing activities, which brought in the
# most (or lost the least) cash flow for Acme in FY2023?": the three totals of
# the cash flow statement, ranked. A superlative said of a loss ("lost the
# most", "the largest cash outflow", "used the most cash") ranks from the bottom.
_SUPERLATIVE = re.compile(
    r"\b(?<!at )(?:(?P<top>most|largest|highest|greatest|biggest)"
    r"|(?P<bottom>least|lowest|smallest))\b",
    re.IGNORECASE,
)
_LOSS = re.compile(
    r"\b(?:lost|lose|loses|losing|used|uses|use|using|spent|spend|spends|consumed|consumes"
    r"|burn\w*|outflows?|negative|drain\w*|required|requires|require|needed)\b",
    re.IGNORECASE,
)
_ACTIVITY = r"(operat(?:ing|ions)|investing|financing)(?:\s+activities)?"
_THREE = re.compile(rf"{_ACTIVITY},\s*{_ACTIVITY},?\s+(?:and|or)\s+{_ACTIVITY}", re.IGNORECASE)


def _ranked_activities(question: str) -> tuple[int, int] | None:
    """(fiscal year, +1 for the most cash brought in or -1 for the least) when
    a "which" question about cash lists the three activities of a cash flow
    statement ("operations, investing, and financing activities") and asks
    which ranks first; None otherwise (or when the direction is unclear)."""
    ask = re.sub(r"\([^()]*\)", " ", question.split("?", 1)[0])
    which = re.search(r"\bwhich\b", ask, re.I)
    listed = _THREE.search(ask)
    if which is None or listed is None or not re.search(r"\bcash\b", ask, re.I):
        return None
    if len({m.lower()[:5] for m in listed.groups()}) != 3:
        return None
    years = sorted({int(y) for y in _FY.findall(ask)})
    superlatives = [m for m in _SUPERLATIVE.finditer(ask) if m.start() > which.start()]
    if len(years) != 1 or len(superlatives) != 1:
        return None
    superlative = superlatives[0]
    # What is said between "which" and the superlative, and a few words after it.
    near = ask[which.end() : superlative.start()] + " ".join(ask[superlative.end() :].split()[:4])
    direction = 1 if superlative.group("top") else -1
    return years[0], -direction if _LOSS.search(near) else direction


def _activities(
    question: str, sources: Sequence[Source], year: int, direction: int
) -> Computed | Missing | None:
    """The net cash of operating, investing and financing activities in
    ``year``, as the cash flow statement states them, and which ranks first."""
    owned = company_sources(question, sources)
    if not owned:
        return None
    rows = [r for r in table_rows(sources) if r.source in owned]
    lookup = _Lookup(rows, sources, year, {concept: {year} for concept in _ACTIVITIES})
    values: dict[str, float] = {}
    try:
        for concept in _ACTIVITIES:
            values[concept] = lookup.get(concept, year)
    except LookupError:
        concept, _ = lookup.missing[-1]
        activity = _ACTIVITIES[concept]
        return Missing(
            f"No source states the net cash of {activity} activities for FY{year}, so the "
            "three activities cannot be compared."
        )
    used = tuple(dict.fromkeys(r for _, _, r in lookup.used.values()))
    units = {r.unit.lower() for r in used}
    scales, unread = _scales(units)
    if len(scales) > 1 or unread:
        return Missing(
            "The three activities cannot be compared: their rows are not all on one scale "
            f"({', '.join(sorted(units))})."
        )
    written = {c: lookup.written(c, year) for c in _ACTIVITIES}
    for concept, (_, _, row) in ((c, lookup.used[(c, year)]) for c in _ACTIVITIES):
        words = set(re.findall(r"[a-z]+", _label_of(row.label).lower()))
        if values[concept] > 0 and "used" in words and not words & _INFLOW_WORDS:
            # "Net cash used in investing activities 962": an outflow printed
            # without its parentheses.
            values[concept] = -values[concept]
            written[concept] = f"({written[concept]})"
    best = max(direction * v for v in values.values())
    first = [c for c in _ACTIVITIES if direction * values[c] == best]
    value = values[first[0]]
    if not value:
        verdict = "neither brought in nor lost cash, " + (
            "the most of the three" if direction > 0 else "the least of the three"
        )
    elif direction > 0:
        verdict = "brought in the most cash" if value > 0 else "lost the least cash"
    else:
        verdict = "lost the most cash" if value < 0 else "brought in the least cash"
    tie = ", equally" if len(first) > 1 else ""
    named = " and ".join(_ACTIVITIES[c] for c in first).capitalize()
    shown = next((r.unit for r in used if r.unit), "")
    unit = f" ({shown})" if shown else ""
    listing = "; ".join(f"{_ACTIVITIES[c]} activities {written[c]}" for c in _ACTIVITIES)
    text = (
        f"{named} activities {verdict}{tie} in FY{year}. "
        f"Net cash by activity, FY{year}{unit}: {listing}."
    )
    return Computed(text, value, used, not lookup.unsure)
