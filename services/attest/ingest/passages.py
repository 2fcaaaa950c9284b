"""Passage splitting on sentence boundaries.

A passage is a run of whole sentences of about ``max_tokens`` tokens; a
sentence longer than that is cut at word boundaries. A passage also holds at
most ``CHARS_PER_TOKEN`` characters a token (2,400 for 200 tokens, twice what
news English takes): a run without spaces (an inlined image, a minified
script, a hash list) counts as few tokens, and is cut into pieces of that
size rather than stored as one passage longer than the reranker and the
generator take. Every passage keeps its
character span in the text it came from, so ``text[start:end] == passage``.

A form feed (``PAGE_BREAK``) separates pages, as pdftotext writes them: it
ends a sentence and a passage, so no passage crosses a page or holds a form
feed, and every passage keeps its page (1 + the form feeds before it; 0 in a
text without any).
The ingestion pipeline indexes these passages and the PFiD reranker trains on
them, so both see the same units.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from dataclasses import dataclass

CountTokens = Callable[[str], int]

#: Separates the pages of a text (a body from a PDF): page n follows the
#: (n - 1)th form feed.
PAGE_BREAK = "\f"

DEFAULT_MAX_TOKENS = 200
#: A passage's characters per token of its budget, at most.
CHARS_PER_TOKEN = 12

# A sentence ends at ., ! or ? (optionally followed by closing quotes or
# brackets) before white space, at 。！？, at a blank line or at a page break.
# Same rule as the keyphrase extractor's splitter, but with positions kept.
# Chinese and Japanese write without spaces: each ideograph or kana is a token
# (as a subword tokenizer counts them), a sentence ends after a run of 。！？
# with no space after, unless a closing quote follows (「はい。」と言った。 is one).
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_SENTENCE_END = re.compile(
    r"(?<=[.!?])[\"'”’)\]]*\s+"
    r"|(?<=[。！？])(?![。！？」』”’)\]）])\s*"
    r"|\n\s*\n"
    r"|\f\s*"
)
_TOKEN = re.compile(rf"[{_CJK}]|[^\W{_CJK}]+|[^\w\s]")
_WORD_SPAN = re.compile(rf"[{_CJK}]|[^\s{_CJK}]+")


def count_tokens(text: str) -> int:
    """Words and punctuation marks; close to a subword count for news English
    (MiniLM's and T5's tokenizers give 1.1-1.3 pieces per such token)."""
    return len(_TOKEN.findall(text))


@dataclass(frozen=True, slots=True)
class PassageSpan:
    """One passage: its position in the document and its span in the text."""

    index: int
    text: str
    start_char: int
    end_char: int
    # 1-based page the passage is on; 0 when the text has no page breaks.
    page: int = 0


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of every sentence, white space trimmed, in order."""
    spans: list[tuple[int, int]] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        _add_trimmed(text, start, match.start(), spans)
        start = match.end()
    _add_trimmed(text, start, len(text), spans)
    return spans


def _add_trimmed(text: str, start: int, end: int, out: list[tuple[int, int]]) -> None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if end > start:
        out.append((start, end))


def _words(text: str, start: int, end: int, max_chars: int) -> list[tuple[int, int]]:
    """The word spans of ``text[start:end]``, a word longer than ``max_chars`` in
    pieces of ``max_chars``."""
    out: list[tuple[int, int]] = []
    for word in _WORD_SPAN.finditer(text, start, end):
        s, e = word.span()
        while e - s > max_chars:
            out.append((s, s + max_chars))
            s += max_chars
        out.append((s, e))
    return out


def _cut_long(
    text: str, start: int, end: int, max_tokens: int, max_chars: int, counter: CountTokens
) -> list[tuple[int, int]]:
    """A sentence over a limit, cut into word windows of at most ``max_tokens``
    tokens and ``max_chars`` characters."""
    pieces: list[tuple[int, int]] = []
    piece_start: int | None = None
    piece_end = start
    used = 0
    for s, e in _words(text, start, end, max_chars):
        n = max(1, counter(text[s:e]))
        if piece_start is not None and (used + n > max_tokens or e - piece_start > max_chars):
            pieces.append((piece_start, piece_end))
            piece_start, used = None, 0
        if piece_start is None:
            piece_start = s
        piece_end = e
        used += n
    if piece_start is not None:
        pieces.append((piece_start, piece_end))
    return pieces


def split_passages(
    text: str, max_tokens: int = DEFAULT_MAX_TOKENS, *, counter: CountTokens = count_tokens
) -> list[PassageSpan]:
    """Split ``text`` into passages of whole sentences, each at most ``max_tokens``
    tokens as measured by ``counter`` (pass a model tokenizer's length to count
    subword pieces) and ``CHARS_PER_TOKEN * max_tokens`` characters. Only a
    single sentence over either limit is cut inside. A page break ends the
    passage before it. Empty or blank text gives no passages.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
    max_chars = CHARS_PER_TOKEN * max_tokens
    units: list[tuple[int, int, int]] = []  # start, end, tokens
    for start, end in sentence_spans(text):
        n = counter(text[start:end])
        if n <= max_tokens and end - start <= max_chars:
            units.append((start, end, n))
        else:
            for s, e in _cut_long(text, start, end, max_tokens, max_chars, counter):
                units.append((s, e, counter(text[s:e])))
    # No sentence holds a page break (it ends one), so each unit is on one page.
    breaks = [m.start() for m in re.finditer(PAGE_BREAK, text)]
    spans: list[tuple[int, int, int]] = []  # start, end, page
    current: tuple[int, int, int] | None = None
    used = 0
    for start, end, n in units:
        page = bisect.bisect_right(breaks, start) + 1 if breaks else 0
        if (
            current is not None
            and current[2] == page
            and used + n <= max_tokens
            and end - current[0] <= max_chars
        ):
            current = (current[0], end, page)
            used += n
            continue
        if current is not None:
            spans.append(current)
        current, used = (start, end, page), n
    if current is not None:
        spans.append(current)
    return [PassageSpan(i, text[s:e], s, e, page) for i, (s, e, page) in enumerate(spans)]
