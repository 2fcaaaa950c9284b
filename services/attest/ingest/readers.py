"""Readers of what ``attest ingest`` accepts: JSONL, BEIR ``corpus.jsonl``, a folder.

Every reader yields ``RawItem``s: the record as JSON bytes (parsed and
validated by the ingest core, so a malformed line is reported like any other
bad document) and where it came from (``file:line`` or the file's path). A
PDF or DOCX (``attest.ingest.files``) that cannot be read yields an item with
its ``error`` instead, to be reported against that file alone.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from attest.core.document import KEYWORD_FIELDS
from attest.ingest.files import OnPage, UnreadableFile, read_docx, read_pdf

log = logging.getLogger(__name__)

TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".html", ".htm")
#: Files read for their text layer rather than as text.
FILE_SUFFIXES = (".pdf", ".docx")
READ_SUFFIXES = TEXT_SUFFIXES + FILE_SUFFIXES


@dataclass(frozen=True, slots=True)
class RawItem:
    origin: str
    raw_json: bytes
    #: Why the file could not be read; then ``raw_json`` is empty.
    error: str = ""
    #: Pages and table rows read from a PDF or DOCX (0 for other items).
    pages: int = 0
    table_rows: int = 0
    #: A PDF or DOCX file (read or not).
    document_file: bool = False


class _HtmlText(HTMLParser):
    """Visible text of an HTML page, its <title>, block elements as paragraphs."""

    BLOCKS = frozenset(
        (
            *("p", "div", "br", "li", "ul", "ol", "h1", "h2", "h3", "h4", "h5", "h6", "tr"),
            *("table", "section", "article", "header", "footer", "blockquote", "pre"),
        )
    )
    HIDDEN = frozenset(("script", "style", "noscript", "template", "head"))

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title = ""
        self._hidden = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        elif tag in self.HIDDEN:
            self._hidden += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag in self.HIDDEN:
            self._hidden = max(0, self._hidden - 1)
        elif tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        elif not self._hidden:
            self.parts.append(data)


def html_to_text(html: str) -> tuple[str, str]:
    """(title, text) of an HTML document."""
    parser = _HtmlText()
    parser.feed(html)
    parser.close()
    text = re.sub(r"[ \t]*\n[ \t\n]*\n[ \t\n]*", "\n\n", "".join(parser.parts))
    return " ".join(parser.title.split()), text.strip()


# One heading line, nothing around it.
_MD_HEADING_LINE = re.compile(r"[ \t]{0,3}#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*")


_BOM = b"\xef\xbb\xbf"


def read_jsonl(path: Path) -> Iterator[RawItem]:
    with path.open("rb") as f:
        for number, line in enumerate(f, start=1):
            if number == 1:
                # Editors on Windows start UTF-8 files with a byte order mark.
                line = line.removeprefix(_BOM)
            if line.strip():
                yield RawItem(f"{path.name}:{number}", line.rstrip(b"\r\n"))


_MD_FENCE = re.compile(r"[ \t]{0,3}(`{3,}|~{3,})")
# A closing fence has no info string.
_MD_FENCE_CLOSE = re.compile(r"[ \t]{0,3}(`{3,}|~{3,})[ \t]*\r?\n?")


def _markdown(text: str) -> tuple[str | None, str]:
    """(the first heading, the text with heading lines as paragraphs of their own
    words): a heading is neither part of the next sentence nor quoted with its
    ``#`` marks. Lines in fenced code blocks (a shell comment) are left as they are."""
    title: str | None = None
    out: list[str] = []
    fence = ""
    for line in text.splitlines(keepends=True):
        if fence:
            closed = _MD_FENCE_CLOSE.fullmatch(line)
            if closed and closed.group(1)[0] == fence[0] and len(closed.group(1)) >= len(fence):
                fence = ""
            out.append(line)
            continue
        opened = _MD_FENCE.match(line)
        if opened:
            fence = opened.group(1)
            out.append(line)
            continue
        heading = _MD_HEADING_LINE.fullmatch(line.rstrip("\r\n"))
        if heading is None:
            out.append(line)
            continue
        title = title or heading.group(1)
        out.append(f"\n{heading.group(1)}\n\n")
    return title, "".join(out)


def read_text_file(path: Path, root: Path) -> RawItem:
    rel = path.relative_to(root).as_posix()
    data = path.read_bytes().removeprefix(_BOM)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        # The core reports it per document, with the byte position.
        return RawItem(rel, data)
    suffix = path.suffix.lower()
    if suffix in (".html", ".htm"):
        title, body = html_to_text(text)
    elif suffix == ".txt":
        title, body = path.stem, text
    else:
        heading, body = _markdown(text)
        title = heading or path.stem
    record = {"id": rel, "title": title or path.stem, "body": body}
    return RawItem(rel, json.dumps(record, ensure_ascii=False).encode("utf-8"))


def read_document_file(path: Path, root: Path, on_page: OnPage | None = None) -> RawItem:
    """A PDF or DOCX as one document: id its path under ``root``, the body its
    pages' text (joined by form feeds, so every passage keeps its page), its
    table rows as sentences; metadata names the file, its format and pages."""
    rel = path.relative_to(root).as_posix()
    suffix = path.suffix.lower()
    try:
        read = read_pdf(path, on_page) if suffix == ".pdf" else read_docx(path)
    except UnreadableFile as err:
        return RawItem(rel, b"", error=err.reason, document_file=True)
    except OSError as err:
        reason = f"cannot read the file: {err.strerror or err}"
        return RawItem(rel, b"", error=reason, document_file=True)
    except Exception as err:
        # One damaged file must not stop the folder: it fails alone, with why.
        log.warning("reading %s failed", path, exc_info=True)
        kind = suffix.lstrip(".").upper()
        reason = f"damaged file: the {kind} reader failed ({type(err).__name__}: {err})"
        return RawItem(rel, b"", error=reason[:500], document_file=True)
    metadata = {"file": rel, "format": suffix.lstrip("."), "table_rows": str(len(read.rows))}
    if read.paged:
        metadata["pages"] = str(len(read.pages))
    record = {"id": rel, "title": read.title, "body": read.body, "metadata": metadata}
    return RawItem(
        rel,
        json.dumps(record, ensure_ascii=False).encode("utf-8"),
        pages=len(read.pages) if read.paged else 0,
        table_rows=len(read.rows),
        document_file=True,
    )


def _read_file(path: Path, root: Path, on_page: OnPage | None) -> RawItem:
    if path.suffix.lower() in FILE_SUFFIXES:
        return read_document_file(path, root, on_page)
    return read_text_file(path, root)


def _hidden(path: Path, root: Path) -> bool:
    """Under a dot-folder or a dot-file (``.git/``, ``.venv/``, ``.env``) of ``root``."""
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def _folder_files(root: Path) -> Iterator[Path]:
    """The files of a folder that ``attest ingest`` reads, in name order."""
    for path in sorted(root.rglob("*")):
        if path.is_file() and _is_text(path) and not _hidden(path, root):
            yield path


def read_folder(root: Path, on_page: OnPage | None = None) -> Iterator[RawItem]:
    for path in _folder_files(root):
        yield _read_file(path, root, on_page)


def _is_text(path: Path) -> bool:
    """A file ``attest ingest`` reads as one document (text, PDF or DOCX)."""
    return path.suffix.lower() in READ_SUFFIXES


def read_path(path: Path, on_page: OnPage | None = None) -> Iterator[RawItem]:
    """Items of a JSONL file, a BEIR folder (its corpus.jsonl), a folder of
    documents, or one document (.txt, .md, .markdown, .html, .htm, .pdf,
    .docx). ``on_page(page, pages)`` is called after each page of a PDF."""
    if path.is_dir():
        corpus = path / "corpus.jsonl"
        if corpus.is_file():
            return read_jsonl(corpus)
        return read_folder(path, on_page)
    if _is_text(path):
        return _one_file(path, on_page)
    return read_jsonl(path)


def _one_file(path: Path, on_page: OnPage | None) -> Iterator[RawItem]:
    # A generator: the file is read when its item is asked for (and timed then).
    yield _read_file(path, path.parent, on_page)


def skipped_files(path: Path) -> list[Path]:
    """The files of a folder of documents that ``read_path`` leaves out (their
    suffix is none of READ_SUFFIXES), to be reported."""
    if not path.is_dir() or (path / "corpus.jsonl").is_file():
        return []
    return sorted(
        p for p in path.rglob("*") if p.is_file() and not _is_text(p) and not _hidden(p, path)
    )


#: The keys a JSON record is read by (``article_from_raw_json``); others are ignored.
RECORD_KEYS = frozenset(
    {"id", "_id", "title", "body", "text", "published_at", "source_url", "metadata"}
    | {f.name for f in KEYWORD_FIELDS}
)


def unread_keys(path: Path, sample: int = 1000) -> dict[str, int]:
    """Keys that the first ``sample`` JSON records of ``path`` carry and ingest
    does not read (a ``date`` for ``published_at``, say), with how many of
    those records carry each. Lines that are not JSON objects are left to the
    ingest's own report."""
    if path.is_dir() and not (path / "corpus.jsonl").is_file():
        return {}
    if not path.is_dir() and _is_text(path):
        return {}
    found: dict[str, int] = {}
    for n, item in enumerate(read_path(path)):
        if n >= sample:
            break
        try:
            record = json.loads(item.raw_json)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(record, dict):
            for key in record.keys() - RECORD_KEYS:
                found[key] = found.get(key, 0) + 1
    return dict(sorted(found.items(), key=lambda kv: (-kv[1], kv[0])))


def count_items(path: Path) -> int:
    """How many items ``read_path`` will yield, for the progress bar."""
    if path.is_dir() and not (path / "corpus.jsonl").is_file():
        return sum(1 for _ in _folder_files(path))
    if not path.is_dir() and _is_text(path):
        return 1
    target = path / "corpus.jsonl" if path.is_dir() else path
    with target.open("rb") as f:
        return sum(1 for line in f if line.strip())
