"""Texts handed on as passages stay within what the reranker accepts: an article
found without a passage is its body, which a long report exceeds."""

from __future__ import annotations

from attest.rerank.settings import RerankLimits
from attest.retrieval.fanout import MAX_PASSAGE_CHARS, Hit


def test_the_cap_is_the_rerankers_own_limit() -> None:
    assert RerankLimits().max_passage_chars == MAX_PASSAGE_CHARS


def test_a_long_body_or_passage_is_cut_at_a_word_and_a_short_one_kept() -> None:
    words = " ".join(f"w{i:05d}" for i in range(10_000))  # 70,000 characters
    article = Hit(doc_id="report", body=words)
    ((index, text),) = article.passage_list()
    assert index == -1
    assert MAX_PASSAGE_CHARS - 200 <= len(text) <= MAX_PASSAGE_CHARS
    assert words.startswith(text)
    assert words[len(text)] == " "
    assert article.text_of(-1) == text
    blob = "x" * 50_000  # no space to cut at
    stored = Hit(doc_id="old", passages={0: (blob, 1), 1: ("Short passage.", 2)})
    assert stored.passage_list() == [(0, "x" * MAX_PASSAGE_CHARS), (1, "Short passage.")]
    assert stored.text_of(1) == "Short passage."
