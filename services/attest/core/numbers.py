"""Numbers as tables write them: "(1,577)", "—", "1,035(a)", "12.5%", "$ 5,794".

Shared by ingest (reading a PDF's table rows) and generate (computing a
metric from the rows it cites), so both read a cell the same way.
"""

from __future__ import annotations

import re

# A footnote mark after a value: "(a)", "*", "1)".
_FOOTNOTE = re.compile(r"\(?[a-z*†‡]\)|\*+|\d\)")


def parse_number(text: str) -> float | None:
    """The number a table cell states, or None for a cell that is not one.

    "(1,577)" is -1577, "—" and "-" are 0, "1,035(a)" is 1035, "12.5%" is
    12.5, "$ 5,794" is 5794; "n/a" and words are None."""
    cell = text.strip().replace("$", "").replace("€", "").replace("£", "").strip()
    cell = _FOOTNOTE.sub("", cell).strip() if not re.fullmatch(r"\(\d[\d,.]*\)", cell) else cell
    if cell in ("—", "–", "-", "−"):
        return 0.0
    negative = cell.startswith("(") and cell.endswith(")")
    cell = cell.strip("()").rstrip("%").replace(",", "").replace("−", "-").replace("–", "-")
    try:
        value = float(cell)
    except ValueError:
        return None
    return -value if negative else value
