"""Extractive, query-independent article summaries.

The summary is the few most central sentences of the article, in article
order: a sentence's centrality is the sum of its cosine similarities (bag of
content words) to every other sentence, with a small bonus for the lead
sentence, which in news usually states the story.
"""

from __future__ import annotations

import math
import re
from collections import Counter

from attest.ingest.passages import sentence_spans
from attest.knowledge.linking import ENGLISH_STOPWORDS

_WORD = re.compile(r"[^\W\d_]{2,}")
LEAD_BONUS = 0.15
MAX_SUMMARY_CHARS = 1200
MAX_SENTENCES_SCORED = 200


def _vector(sentence: str) -> Counter[str]:
    return Counter(
        w
        for w in (m.group().casefold() for m in _WORD.finditer(sentence))
        if w not in ENGLISH_STOPWORDS
    )


def _cosine(a: Counter[str], b: Counter[str]) -> float:
    if not a or not b:
        return 0.0
    dot = sum(v * b[k] for k, v in a.items() if k in b)
    if not dot:
        return 0.0
    na = math.sqrt(sum(v * v for v in a.values()))
    nb = math.sqrt(sum(v * v for v in b.values()))
    return dot / (na * nb)


def extractive_summary(body: str, max_sentences: int = 3) -> str:
    """The ``max_sentences`` most central sentences of ``body`` in their order,
    at most about 1,200 characters; the whole body when it is that short."""
    if max_sentences <= 0:
        return ""
    sentences = [body[s:e] for s, e in sentence_spans(body)][:MAX_SENTENCES_SCORED]
    if len(sentences) <= max_sentences:
        # The body itself, as written: the article's embedding text is then the
        # same as its only passage's, and is computed once.
        text = body.strip()
        return text if len(text) <= MAX_SUMMARY_CHARS else " ".join(sentences)[:MAX_SUMMARY_CHARS]
    vectors = [_vector(s) for s in sentences]
    scores: list[float] = []
    for i, v in enumerate(vectors):
        score = sum(_cosine(v, w) for j, w in enumerate(vectors) if j != i)
        scores.append(score / (len(vectors) - 1) + (LEAD_BONUS if i == 0 else 0.0))
    ranked = sorted(range(len(sentences)), key=lambda i: (-scores[i], i))
    chosen: list[int] = []
    length = 0
    for i in ranked:
        if len(chosen) == max_sentences:
            break
        if chosen and length + len(sentences[i]) > MAX_SUMMARY_CHARS:
            continue
        chosen.append(i)
        length += len(sentences[i]) + 1
    return " ".join(sentences[i] for i in sorted(chosen))[:MAX_SUMMARY_CHARS]
