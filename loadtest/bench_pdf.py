"""PDF text extraction: how much of each evidence page's reference text a
library keeps, and how fast it reads, on the filings development set.

    uv run python loadtest/bench_pdf.py ../shared/data/filings
    uv run --with pypdf==7.1.0 --with pdfplumber==0.11.10 \\
        python loadtest/bench_pdf.py ../shared/data/filings   # beside the others

For every evidence page of ``qa.jsonl`` whose PDF is under ``pdfs/``: the
share of the reference text's words (counted with repeats) that the page's
extracted text holds, and the seconds each library spent opening the file and
reading that page. Libraries that are not installed are left out. Then, for
PDFium (the one ingest uses), pages/s over every page of every PDF.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

Words = collections.Counter[str]


def _words(text: str) -> Words:
    return collections.Counter(re.findall(r"\w+", text.lower()))


def _pdfium(path: Path, page: int) -> str:
    import pypdfium2 as pdfium  # type: ignore[import-untyped]

    document = pdfium.PdfDocument(path)
    try:
        return str(document[page].get_textpage().get_text_range())
    finally:
        document.close()


def _pypdf(path: Path, page: int) -> str:
    from pypdf import PdfReader  # type: ignore[import-not-found]

    return str(PdfReader(path).pages[page].extract_text())


def _pdfplumber(path: Path, page: int) -> str:
    import pdfplumber  # type: ignore[import-not-found]

    with pdfplumber.open(path) as pdf:
        return str(pdf.pages[page].extract_text() or "")


LIBRARIES: dict[str, tuple[str, Callable[[Path, int], str]]] = {
    "pypdfium2": ("pypdfium2", _pdfium),
    "pypdf": ("pypdf", _pypdf),
    "pdfplumber": ("pdfplumber", _pdfplumber),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", type=Path, help="a folder with qa.jsonl and pdfs/")
    args = parser.parse_args()
    import importlib.util

    available = {
        name: read for name, (module, read) in LIBRARIES.items() if importlib.util.find_spec(module)
    }
    kept: dict[str, list[float]] = {name: [] for name in available}
    seconds: dict[str, float] = dict.fromkeys(available, 0.0)
    pages = 0
    with (args.dataset / "qa.jsonl").open(encoding="utf-8") as f:
        questions = [json.loads(line) for line in f if line.strip()]
    for question in questions:
        for evidence in question.get("evidence", []):
            path = args.dataset / "pdfs" / f"{evidence['doc_name']}.pdf"
            reference = _words(evidence.get("text", ""))
            if not path.is_file() or not reference:
                continue
            pages += 1
            for name, read in available.items():
                started = time.perf_counter()
                text = read(path, int(evidence["page"]))
                seconds[name] += time.perf_counter() - started
                found = _words(text)
                kept[name].append(sum((reference & found).values()) / sum(reference.values()))
    print(f"{pages} evidence pages")
    print(f"{'library':<12} {'words kept':>10} {'worst page':>10} {'s/page':>8}")
    for name in available:
        shares = kept[name]
        print(
            f"{name:<12} {sum(shares) / len(shares):>10.4f} {min(shares):>10.3f} "
            f"{seconds[name] / pages:>8.3f}"
        )
    from attest.ingest.files import read_pdf

    started = time.perf_counter()
    total = 0
    rows = 0
    for path in sorted((args.dataset / "pdfs").glob("*.pdf")):
        read = read_pdf(path)
        total += len(read.pages)
        rows += len(read.rows)
    spent = time.perf_counter() - started
    print(
        f"attest.ingest.files.read_pdf: {total:,} pages, {rows:,} table rows in {spent:.1f} s "
        f"({total / spent:,.0f} pages/s, tables included)"
    )


if __name__ == "__main__":
    main()
