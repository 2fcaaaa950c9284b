"""A generated reranking task whose relevance is learnable from the text alone.

Each query names two key words. A passage is relevant when it contains both;
hard negatives contain one of them. A document is relevant when any of its
passages is. Documents have 1-8 passages, so size buckets and padding masks
are exercised, and relevant passages sit at random positions.
"""

from __future__ import annotations

import random
import string

from transformers import PreTrainedTokenizerFast

from attest.rerank.training import Example


def _words(rng: random.Random, n: int, length: tuple[int, int]) -> list[str]:
    out: set[str] = set()
    while len(out) < n:
        out.add("".join(rng.choices(string.ascii_lowercase, k=rng.randint(*length))))
    return sorted(out)


def make_task(
    queries: int,
    *,
    docs_per_query: int = 10,
    relevant_per_query: int = 3,
    max_passages: int = 8,
    words_per_passage: int = 8,
    hard_negatives: float = 0.5,
    key_words: int = 48,
    seed: int = 0,
    vocab_seed: int = 1234,
) -> list[Example]:
    """``queries`` × ``docs_per_query`` examples. ``hard_negatives`` is the share
    of irrelevant passages that hold one of the query's key words. Items differ with ``seed``;
    the vocabulary depends only on ``vocab_seed``, so train and held-out sets
    share words but not items."""
    vrng = random.Random(vocab_seed)
    keys = _words(vrng, key_words, (4, 5))
    filler = [w for w in _words(vrng, 400, (3, 6)) if w not in set(keys)]
    rng = random.Random(seed)

    def passage(present: list[str]) -> str:
        words = rng.choices(filler, k=words_per_passage)
        for w in present:
            words.insert(rng.randint(0, len(words)), w)
        return " ".join(words)

    out: list[Example] = []
    for q in range(queries):
        k1, k2 = rng.sample(keys, 2)
        others = [k for k in keys if k not in (k1, k2)]
        qid = f"s{seed}-q{q}"
        relevant_docs = set(rng.sample(range(docs_per_query), relevant_per_query))
        for d in range(docs_per_query):
            n = rng.randint(1, max_passages)
            relevant = d in relevant_docs
            positives = set(rng.sample(range(n), rng.randint(1, min(2, n)))) if relevant else set()
            texts: list[str] = []
            labels: list[int] = []
            for j in range(n):
                if j in positives:
                    texts.append(passage([k1, k2]))
                    labels.append(1)
                else:
                    if rng.random() < hard_negatives:
                        present = [rng.choice([k1, k2]), rng.choice(others)]
                    else:
                        present = rng.sample(others, 2)
                    texts.append(passage(present))
                    labels.append(0)
            out.append(
                Example(
                    query_id=qid,
                    query=f"{k1} {k2}",
                    doc_id=f"{qid}-d{d}",
                    title="",
                    passages=tuple(texts),
                    label=int(relevant),
                    passage_labels=tuple(labels),
                )
            )
    return out


def word_tokenizer(examples: list[Example]) -> PreTrainedTokenizerFast:
    """A whole-word tokenizer over the task's vocabulary, laid out like T5's
    (pad 0, end 1, unknown 2, the marker token) so a tiny model trains fast."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    specials = ["<pad>", "</s>", "<unk>", "<extra_id_0>"]
    words = {"true", "false", "query:", "document:", "passage:"}
    for e in examples:
        words.update(e.query.split())
        for p in e.passages:
            words.update(p.split())
    vocab = {w: i for i, w in enumerate([*specials, *sorted(words)])}
    core = Tokenizer(WordLevel(vocab, unk_token="<unk>"))  # noqa: S106
    core.pre_tokenizer = WhitespaceSplit()
    names = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=core, additional_special_tokens=["<extra_id_0>"], **names
    )
