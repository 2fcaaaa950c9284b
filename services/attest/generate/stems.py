"""Word stems and word families, shared by the answer facts, the judge and
the measures of questions about an amount."""

from __future__ import annotations

import functools
from typing import Any

# Imported on the first stem, not with this module: importing nltk costs 2-8 s
# (it imports most of its subpackages), which `attest serve all` paid before
# reporting SERVING.
_STEM: Any = None


@functools.lru_cache(maxsize=65536)
def stem(word: str) -> str:
    global _STEM
    if _STEM is None:
        from nltk.stem.snowball import EnglishStemmer

        _STEM = EnglishStemmer()
    return str(_STEM.stem(word.lower()))


def same_word(a: str, b: str) -> bool:
    """Whether two stems are of one word family: equal, or sharing a prefix of
    at least four letters that is at least 60 % of the shorter one
    ("acquir" and "acquisit", "direct" and "director"; not "won" and "win")."""
    if a == b:
        return True
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n >= 4 and n >= 0.6 * min(len(a), len(b))
