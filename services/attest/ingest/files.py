"""Documents people have as files: PDF (its text layer) and DOCX.

A PDF is read with PDFium (``pypdfium2``, Apache-2.0/BSD-3-Clause): on the 85
evidence pages of the filings development set it keeps 99.5 % of the
reference text's words, as pypdf and pdfplumber do, at about 400 pages/s on
one core against 15-30 for those two (docs/ingest-files.md has the
measurement). Pages are kept: the body is the pages' text joined by form
feeds, the separator every passage's page is counted by. Within a page, table
rows become sentences of their own that keep their headers and unit
(``attest.ingest.tables``) and short lines (headings, a paragraph's last
line) end their paragraph, so a heading is not read as part of the next
sentence.

A DOCX is read with ``python-docx`` (MIT): paragraphs in order, headings as
paragraphs of their own, tables row by row with their header row; it has no
pages.

A file that cannot be read (encrypted, truncated, no text layer, not what its
suffix says) raises ``UnreadableFile`` with the reason, for the caller to
report against that file alone.
"""

from __future__ import annotations

import re
import statistics
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from attest.ingest.tables import Row, read_page_lines

PAGE_BREAK = "\f"
#: A file whose pages hold fewer characters than this, all together, has no
#: text layer to speak of (a scan, or only page numbers).
MIN_PAGE_CHARS = 20
# Where the end-of-file marker is looked for: writers append padding or junk
# after it, seldom this much.
_TAIL_BYTES = 1024 * 1024

# PDFium marks a hyphen it joined at a line end with U+FFFE.
_SOFT_HYPHEN = re.compile("\ufffe\\s*")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")

OnPage = Callable[[int, int], None]
_BOILERPLATE_TITLE = re.compile(r"microsoft (?:word|powerpoint) -|form \d|untitled", re.I)


class UnreadableFile(Exception):
    """A file that is not what its suffix says, or that holds no text to read."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class FileText:
    """What a file says: its title, its pages' text (one entry for a file
    without pages) and its table rows."""

    title: str
    pages: tuple[str, ...]
    rows: tuple[Row, ...]
    paged: bool

    @property
    def body(self) -> str:
        return PAGE_BREAK.join(self.pages) if self.paged else "\n\n".join(self.pages)


def _paragraphs(lines: list[str]) -> list[str]:
    """Prose lines grouped so that a line much shorter than the page's usual
    one (a heading, a paragraph's last line, a caption) ends its paragraph, and
    one that does not end a sentence (a heading) also starts one."""
    lengths = [len(line) for line in lines if len(line) > 20]
    usual = statistics.median(lengths) if lengths else 0.0
    out: list[str] = []
    current: list[str] = []
    for line in lines:
        short = usual and len(line) < 0.6 * usual
        if short and current and not line.endswith((".", "!", "?", ",", ";")):
            # A heading starts a paragraph as well as ending one.
            out.append("\n".join(current))
            current = []
        current.append(line)
        if short:
            out.append("\n".join(current))
            current = []
    if current:
        out.append("\n".join(current))
    return out


#: Lines at the top or bottom of a page that are looked at for running heads.
_EDGE_LINES = 3


def _furniture_key(line: str) -> str:
    # Page numbers and dates vary from page to page; the words do not.
    return re.sub(r"\d+", "#", " ".join(line.split()).lower())


def _lines(raw: str) -> list[str]:
    text = _SOFT_HYPHEN.sub("", raw.replace("\x00", ""))
    return [line.strip() for line in _LINE_BREAK.split(text) if line.strip()]


def running_lines(raws: Sequence[str]) -> frozenset[str]:
    """Running heads and feet: lines (digits aside) among the first or last
    three of at least 30 % of a document's pages, and of three pages at least
    ("47 SMA Solar Technology AG // Annual Report 2023", "Table of Contents").
    They say nothing a reader asks about and would be read as sentences."""
    if len(raws) < 4:
        return frozenset()
    seen: dict[str, int] = {}
    for raw in raws:
        lines = _lines(raw)
        if len(lines) <= 2 * _EDGE_LINES:
            # A page of a few lines is all edges: it tells heads from text apart.
            continue
        edges = {_furniture_key(line) for line in lines[:_EDGE_LINES] + lines[-_EDGE_LINES:]}
        for key in edges:
            seen[key] = seen.get(key, 0) + 1
    least = max(3, int(0.3 * len(raws)))
    return frozenset(key for key, n in seen.items() if n >= least)


def page_text(raw: str, furniture: frozenset[str] = frozenset()) -> tuple[str, list[Row]]:
    """A page of a PDF's text layer as paragraphs separated by blank lines,
    with its table rows rendered as sentences and its running heads and feet
    (``furniture``) left out."""
    lines = _lines(raw)
    if furniture and len(lines) > 2 * _EDGE_LINES:
        edge = set(range(_EDGE_LINES)) | set(range(len(lines) - _EDGE_LINES, len(lines)))
        lines = [
            line
            for i, line in enumerate(lines)
            if i not in edge or _furniture_key(line) not in furniture
        ]
    tables = read_page_lines(lines)
    out: list[str] = []
    rows = {row.text() for row in tables.rows}
    for paragraph in tables.paragraphs:
        if paragraph in rows:
            out.append(paragraph)
        else:
            out += _paragraphs(paragraph.split("\n"))
    return "\n\n".join(out), tables.rows


def _pdfium_error(err: Exception) -> str:
    message = str(err)
    if "password" in message.lower() or "security" in message.lower():
        return (
            "encrypted: the PDF needs a password to open; decrypt it "
            "(e.g. qpdf --decrypt) and ingest the copy"
        )
    if "format" in message.lower():
        return "damaged or truncated PDF: its structure cannot be read"
    return f"the PDF cannot be opened: {message}"


def _looks_like(head: bytes) -> str:
    """What a file that should be a PDF starts like instead, in words."""
    sample = head.lstrip()[:64].lower()
    if sample.startswith((b"<!doctype html", b"<html")) or b"<html" in head[:1024].lower():
        return "HTML"
    if sample.startswith(b"pk\x03\x04"):
        return "a ZIP archive (a DOCX or XLSX?)"
    if sample.startswith((b"{", b"[")):
        return "JSON"
    if not sample:
        return "an empty file"
    return f"something else (it starts with {head[:16]!r})"


def read_pdf(path: Path, on_page: OnPage | None = None) -> FileText:
    """The text of every page of a PDF, with its tables as rows.

    Raises ``UnreadableFile`` for a file that is not a PDF, an encrypted or
    damaged one, or one with no text layer (a scan)."""
    import pypdfium2 as pdfium  # type: ignore[import-untyped]

    with path.open("rb") as f:
        head = f.read(1024)
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - _TAIL_BYTES))
        tail = f.read()
    if b"%PDF-" not in head:
        raise UnreadableFile(f"not a PDF: the file is {_looks_like(head)}")
    if b"%%EOF" not in tail:
        # PDFium rebuilds a damaged file as far as it can, and would give the
        # pages before the cut as if they were the whole document.
        raise UnreadableFile(
            f"truncated: the file ({size:,} bytes) ends without the PDF end-of-file "
            "marker (%%EOF); was the download or copy cut short?"
        )
    try:
        document = pdfium.PdfDocument(path)
    except pdfium.PdfiumError as err:
        raise UnreadableFile(_pdfium_error(err)) from None
    try:
        count = len(document)
        if count == 0:
            raise UnreadableFile("the PDF has no pages")
        pages: list[str] = []
        raws: list[str] = []
        rows: list[Row] = []
        images = 0
        for n in range(count):
            try:
                page = document[n]
            except pdfium.PdfiumError as err:
                reason = f"damaged PDF: page {n + 1} of {count} cannot be read ({err})"
                raise UnreadableFile(reason) from None
            try:
                textpage = page.get_textpage()
                try:
                    raw = textpage.get_text_range()
                finally:
                    textpage.close()
                if len(raw.strip()) < MIN_PAGE_CHARS:
                    images += sum(
                        1 for _ in page.get_objects(filter=(pdfium.raw.FPDF_PAGEOBJ_IMAGE,))
                    )
            except pdfium.PdfiumError as err:
                raise UnreadableFile(
                    f"damaged PDF: the text of page {n + 1} of {count} cannot be read ({err})"
                ) from None
            finally:
                page.close()
            raws.append(raw)
            if on_page is not None:
                on_page(n + 1, count)
        title = _pdf_title(document) or path.stem
    finally:
        document.close()
    furniture = running_lines(raws)
    for raw in raws:
        text, found = page_text(raw, furniture)
        pages.append(text)
        rows += found
    characters = sum(len(p.strip()) for p in pages)
    if characters < MIN_PAGE_CHARS:
        what = f"{images} image{'s' if images != 1 else ''}" if images else "no images"
        raise UnreadableFile(
            f"no text layer: {count} page{'s' if count != 1 else ''}, {what}, "
            f"{characters} characters of text (a scan?); run OCR on it first "
            "(e.g. ocrmypdf) and ingest the result"
        )
    return FileText(title=title, pages=tuple(pages), rows=tuple(rows), paged=True)


def _pdf_title(document: object) -> str:
    try:
        metadata = document.get_metadata_dict(skip_empty=True)  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - a title is optional; a broken info dict is not fatal
        return ""
    title = " ".join(str(metadata.get("Title", "")).split())
    words = re.findall(r"[^\W\d_]{2,}", title)
    # Producers write file names and filing boilerplate here ("Microsoft Word -
    # F20_10K.docx", "Form 10-K for Pepsico INC filed 2022-02-10").
    if (
        len(words) < 2
        or title.lower().endswith((".doc", ".docx", ".pdf"))
        or _BOILERPLATE_TITLE.match(title)
    ):
        return ""
    return title


def read_docx(path: Path) -> FileText:
    """The paragraphs and tables of a DOCX, in document order.

    Raises ``UnreadableFile`` for a file that is not a DOCX (not a ZIP, no
    Word document inside, encrypted) or holds no text."""
    import docx
    from docx.opc.exceptions import PackageNotFoundError
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    with path.open("rb") as f:
        head = f.read(1024)
    if not head.startswith(b"PK\x03\x04"):
        if head.startswith(b"\xd0\xcf\x11\xe0"):
            raise UnreadableFile(
                "not a DOCX: an OLE file (an encrypted DOCX or an old .doc); "
                "save it as an unencrypted .docx"
            )
        raise UnreadableFile(f"not a DOCX: the file is {_looks_like(head)}")
    try:
        document = docx.Document(str(path))
    # lxml's XMLSyntaxError (a damaged document.xml) is a SyntaxError.
    except (PackageNotFoundError, zipfile.BadZipFile, KeyError, ValueError, SyntaxError) as err:
        raise UnreadableFile(f"damaged or not a Word document: {err}") from None
    paragraphs: list[str] = []
    rows: list[Row] = []
    headings: list[str] = []
    for block in document.iter_inner_content():
        if isinstance(block, Paragraph):
            text = " ".join(block.text.split())
            if not text:
                continue
            style = (block.style.name if block.style is not None else "") or ""
            level = re.fullmatch(r"Heading (\d)", style)
            if level:
                del headings[int(level.group(1)) - 1 :]
                headings.append(text)
            elif style == "Title" and not headings:
                headings.append(text)
            paragraphs.append(text)
        elif isinstance(block, Table):
            found = _docx_table(block, " / ".join(headings))
            rows += found
            paragraphs += [row.text() for row in found]
    if not any(p.strip() for p in paragraphs):
        raise UnreadableFile("the document holds no text")
    title = " ".join((document.core_properties.title or "").split()) or (
        headings[0] if headings else path.stem
    )
    return FileText(title=title, pages=("\n\n".join(paragraphs),), rows=tuple(rows), paged=False)


def _docx_table(table: object, heading: str) -> list[Row]:
    """A DOCX table's rows; its first row is the header (its first cell says
    what the rows measure), its first column the label."""
    cells: list[list[str]] = []
    for row in table.rows:  # type: ignore[attr-defined]
        seen: list[object] = []
        texts: list[str] = []
        for cell in row.cells:
            # A merged cell is listed once per column it spans: read it once.
            if any(cell._tc is other for other in seen):
                continue
            seen.append(cell._tc)
            texts.append(" ".join(cell.text.split()))
        if any(texts):
            cells.append(texts)
    # A first row of one merged cell is the table's title, not its header.
    while len(cells) > 2 and len(cells[0]) == 1 and len(cells[1]) > 1:
        heading = f"{heading} / {cells[0][0]}" if heading else cells[0][0]
        cells = cells[1:]
    if len(cells) < 2:
        return []
    header = cells[0]
    out: list[Row] = []
    for row in cells[1:]:
        label, values = row[0], row[1:]
        columns = tuple(header[1:])
        named = [c or f"column {i + 2}" for i, c in enumerate(columns)]
        kept = [(c, v) for c, v in zip(named, values, strict=False) if v]
        if not label or not kept:
            continue
        out.append(
            Row(
                title=heading,
                # The corner cell names what the rows measure ("Metric (tCO2e)").
                unit=header[0],
                section="",
                label=label,
                columns=tuple(c for c, _ in kept),
                values=tuple(v for _, v in kept),
            )
        )
    return out
