"""Runs of a document body that are not text, found and dropped before chunking.

An inlined image (a ``data:`` URI or a bare base64 block), a hex dump or a
minified script is valid UTF-8 and passes every check on the way in, but it is
not language: split into passages it fills the BM25 index with tokens nobody
searches for, the vector index with embeddings of noise, and the pipeline's CPU
with work (a 2 MB image is about 1,000 passages). Each rule below is narrow
enough that prose, numbers and tables in any script survive it:

* ``data:`` URIs with their payload;
* base64 or hex runs: 64 or more characters of the base64 alphabet without a
  space, holding both digits and letters (a word that long has no digits; MIME
  wraps base64 at 76 characters a line, so each line is such a run);
* hex dumps: 16 or more hex groups in a row (``4f 3a 00 ff``, ``0x4f, 0x3a``)
  of which at least four hold a letter, so rows of plain numbers stay;
* any run of 512 or more ASCII characters without white space (minified code,
  URL-encoded blobs); scripts written without spaces (Chinese, Japanese,
  Thai) are not ASCII and are not touched.

Each dropped run becomes one space, so the words around it stay apart.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

DATA_URI = re.compile(r"data:[\w.+-]+/[\w.+-]+(?:;[\w.+-]+=?[\w.+-]*)*,[^\s\"'()<>]*")
BASE64_RUN = re.compile(r"(?<![^\s\"'(<>=:,;])[A-Za-z0-9+/_=-]{64,}(?![^\s\"')<>,;])")
HEX_GROUPS = re.compile(r"(?:(?<!\w)(?:0[xX])?[0-9A-Fa-f]{2,8}(?:[ \t,;:]+|$)){16,}", re.MULTILINE)
LONG_ASCII = re.compile(r"[!-~]{512,}")

_DIGIT = re.compile(r"\d")
_LETTER = re.compile(r"[A-Za-z]")
_HEX_LETTER_GROUP = re.compile(r"(?:0[xX])?[0-9A-Fa-f]*[A-Fa-f][0-9A-Fa-f]*")


@dataclass
class Dropped:
    """What ``drop_non_text`` removed: characters by kind of run."""

    chars: dict[str, int] = field(default_factory=dict)
    runs: int = 0

    @property
    def total(self) -> int:
        return sum(self.chars.values())

    def add(self, kind: str, n: int) -> None:
        self.chars[kind] = self.chars.get(kind, 0) + n
        self.runs += 1

    def describe(self) -> str:
        """E.g. "12,345 characters in 3 runs (data: URIs 12,000, hex dumps 345)"."""
        kinds = ", ".join(f"{k} {n:,}" for k, n in sorted(self.chars.items()))
        runs = "run" if self.runs == 1 else "runs"
        return f"{self.total:,} characters in {self.runs:,} {runs} ({kinds})"


def _is_base64(run: str) -> bool:
    return bool(_DIGIT.search(run)) and bool(_LETTER.search(run))


def _is_hex_dump(run: str) -> bool:
    groups = re.split(r"[ \t,;:]+", run.strip())
    return sum(1 for g in groups if _HEX_LETTER_GROUP.fullmatch(g)) >= 4


def drop_non_text(text: str) -> tuple[str, Dropped]:
    """``text`` without its non-text runs (see the module doc), and what went."""
    dropped = Dropped()
    if len(text) < 64:
        return text, dropped

    def sub(
        kind: str, pattern: re.Pattern[str], keep: str, test: Callable[[str], bool] | None = None
    ) -> str:
        def replace(match: re.Match[str]) -> str:
            run = match.group(0)
            if test is not None and not test(run):
                return run
            dropped.add(kind, len(run))
            return keep

        return pattern.sub(replace, current)

    current = text
    current = sub("data: URIs", DATA_URI, " ")
    current = sub("hex dumps", HEX_GROUPS, " ", _is_hex_dump)
    current = sub("base64/hex runs", BASE64_RUN, " ", _is_base64)
    current = sub("long runs without spaces", LONG_ASCII, " ")
    return current, dropped
