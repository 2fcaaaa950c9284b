"""Labelled pairs for the reader: what ``attest train judge`` learns from.

The reader has two outputs over one encoder (``attest.generate.reader``):

* ``answer``: P(the sentence answers the question), read from (question,
  sentence);
* ``support``: P(the source states the sentence's claims), read from
  (source, sentence). Contradiction and "neutral" are both "no".

Each public set under ``data/train/`` becomes pairs of one task, and the
HotpotQA development set gives in-domain pairs of both:

========================  =======  ================================================
set                       task     positive / negative
========================  =======  ================================================
``selqa``                 answer   label 1 / 0 (answer-sentence selection)
``qnli``                  answer   ``entailment`` / ``not_entailment``
``snli``                  support  ``entailment`` / ``neutral`` and ``contradiction``
``fever_symmetric``       support  ``SUPPORTS`` / ``REFUTES`` (v0.1 and v0.2 deduped)
``hotpotqa``              answer   a gold passage's sentence that contains the
                                   answer / any other sentence of the ten passages
                                   (the bridge sentence, answer-like distractors)
``hotpotqa``              support  (its passage, a sentence) / (the passage without
                                   that sentence, it) and (the other gold passage, it)
========================  =======  ================================================

BoolQ is not used: its label is the yes/no answer, neither task's label.

Every set is split by *group* (the question, the premise or the claim;
never by pair), one in ``HELD_OUT_SHARE`` groups held out by a hash of the
group key, so a held-out figure is on questions the model never saw. The
HotpotQA pairs come from the ``even`` half of its questions only
(``attest.evaluation.qa.half_of``): the ``odd`` half stays unseen by
training, for ``attest eval qa --split odd``.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from attest.evaluation.ir import json_objects
from attest.evaluation.qa import half_of
from attest.generate.text import (
    STOPWORDS,
    contains_answer,
    content_tokens,
    key_terms,
    split_sentences,
)

Task = Literal["answer", "support"]
TASKS: tuple[Task, ...] = ("answer", "support")

# One group in ten is held out of training.
HELD_OUT_SHARE = 10

# Each set's file(s) under the training folder; hotpotqa is read from the QA folder.
TRAIN_SETS: dict[str, tuple[str, ...]] = {
    "selqa": ("selqa/dev.jsonl", "selqa/test.jsonl"),
    "qnli": ("qnli/dev.jsonl",),
    "snli": ("snli/dev.jsonl", "snli/test.jsonl"),
    "fever_symmetric": (
        "fever_symmetric/v0.1_full.jsonl",
        "fever_symmetric/v0.2_dev.jsonl",
        "fever_symmetric/v0.2_test.jsonl",
    ),
}


class PairDataError(ValueError):
    """A training file is missing or not what its set's reader expects."""


@dataclass(frozen=True, slots=True)
class Pair:
    """One labelled pair: ``first`` is the question (answer) or the source (support)."""

    id: str
    task: Task
    first: str
    sentence: str
    label: int
    group: str
    dataset: str

    def to_json(self) -> dict[str, object]:
        """The pair as ``attest eval judge`` reads it."""
        out: dict[str, object] = {"id": self.id, "task": self.task, "sentence": self.sentence}
        out["question" if self.task == "answer" else "source"] = self.first
        out["label"] = self.label
        out["group"] = f"{self.dataset}:{self.group}"
        return out


def held_out(dataset: str, group: str) -> bool:
    """Whether a group is in the held-out split (stable across machines and runs)."""
    digest = hashlib.sha256(f"{dataset}\x00{group}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % HELD_OUT_SHARE == 0


def _rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    return json_objects(path, PairDataError, "not found (is the training data under this folder?)")


def _field(row: dict[str, object], name: str, where: str) -> str:
    value = row.get(name)
    if not isinstance(value, str) or not value.strip():
        raise PairDataError(f"{where}: no text in {name!r}")
    return " ".join(value.split())


_LABELS: dict[str, dict[object, int]] = {
    "selqa": {0: 0, 1: 1, "0": 0, "1": 1},
    "qnli": {"entailment": 1, "not_entailment": 0},
    "snli": {"entailment": 1, "neutral": 0, "contradiction": 0},
    "fever_symmetric": {"SUPPORTS": 1, "REFUTES": 0},
}


def _public(root: Path, dataset: str) -> Iterator[Pair]:
    task: Task = "answer" if dataset in ("selqa", "qnli") else "support"
    first_key, second_key = (
        ("question", "sentence") if task == "answer" else ("premise", "hypothesis")
    )
    seen: set[tuple[str, str]] = set()
    for rel in TRAIN_SETS[dataset]:
        path = root / rel
        for number, row in _rows(path):
            where = f"{path}:{number}"
            first, sentence = _field(row, first_key, where), _field(row, second_key, where)
            raw = row.get("label")
            if raw not in _LABELS[dataset]:
                raise PairDataError(
                    f"{where}: label {raw!r} is not one of {list(_LABELS[dataset])}"
                )
            if (first, sentence) in seen:  # FEVER-Symmetric's versions overlap
                continue
            seen.add((first, sentence))
            # Groups: the question for answer sets, the claim for FEVER (its
            # synthetic counterparts share a claim), the premise for SNLI.
            group = sentence if dataset == "fever_symmetric" else first
            yield Pair(
                id=str(row.get("id") or f"{dataset}-{number}"),
                task=task,
                first=first,
                sentence=sentence,
                label=_LABELS[dataset][raw],
                group=group,
                dataset=dataset,
            )


def hotpot_pairs(path: Path, half: str = "even") -> Iterator[Pair]:
    """In-domain pairs from HotpotQA questions of one half (see the module doc)."""
    for number, row in _rows(path):
        where = f"{path}:{number}"
        qid = str(row.get("id") or number)
        if half_of(qid) != half:
            continue
        question = _field(row, "question", where)
        raw_answers = row.get("answers")
        raw_passages = row.get("passages")
        answers = [
            a for a in (raw_answers if isinstance(raw_answers, list) else []) if isinstance(a, str)
        ]
        answers = [a for a in answers if a.strip()]
        passages: list[dict[str, Any]] = [
            p
            for p in (raw_passages if isinstance(raw_passages, list) else [])
            if isinstance(p, dict)
        ]
        gold = [p for p in passages if p.get("gold")]
        polar = any(a.strip().lower() in ("yes", "no") for a in answers)
        for p_index, passage in enumerate(passages):
            text = passage.get("text")
            if not isinstance(text, str):
                continue
            for s_index, sentence in enumerate(split_sentences(text)):
                if len(sentence.split()) < 4 or polar:
                    continue
                has = any(contains_answer(sentence, a) for a in answers)
                if has and not passage.get("gold"):
                    continue  # the answer said of something else: not a clean label
                yield Pair(
                    id=f"hotpot-{qid}-a{p_index}-{s_index}",
                    task="answer",
                    first=question,
                    sentence=sentence,
                    label=int(has),
                    group=qid,
                    dataset="hotpotqa",
                )
        for g_index, passage in enumerate(gold):
            sentences = split_sentences(str(passage.get("text") or ""))
            if len(sentences) < 2:
                continue
            others = [p for p in gold if p is not passage]
            for s_index, sentence in enumerate(sentences[:3]):
                if len(sentence.split()) < 5:
                    continue
                rest = " ".join(s for i, s in enumerate(sentences) if i != s_index)
                base = f"hotpot-{qid}-s{g_index}-{s_index}"
                yield Pair(
                    base + "-own", "support", " ".join(sentences), sentence, 1, qid, "hotpotqa"
                )
                yield Pair(base + "-rest", "support", rest, sentence, 0, qid, "hotpotqa")
                for o in others[:1]:
                    yield Pair(
                        base + "-other",
                        "support",
                        " ".join(split_sentences(str(o.get("text") or ""))),
                        sentence,
                        0,
                        qid,
                        "hotpotqa",
                    )


def load_pairs(train_root: Path, hotpot: Path | None) -> list[Pair]:
    """Every pair of the public sets (and HotpotQA's even half when given), in file order."""
    out: list[Pair] = []
    for dataset in TRAIN_SETS:
        out.extend(_public(train_root, dataset))
    if hotpot is not None:
        out.extend(hotpot_pairs(hotpot))
    return out


def split(pairs: list[Pair]) -> tuple[list[Pair], list[Pair]]:
    """(training pairs, held-out pairs), by group."""
    train: list[Pair] = []
    test: list[Pair] = []
    for p in pairs:
        (test if held_out(p.dataset, p.group) else train).append(p)
    return train, test


# --- made negatives ------------------------------------------------------------------
#
# Two kinds of pair the public sets hardly hold, made from their own positives:
#
# * ``question_swap`` (answer): a sentence that answers one question, read with
#   another question of the same set that names the same thing ("Fennick cut food
#   waste by 18 % in 2024" is no answer to Fennick's 2024 scope 1 emissions). A
#   sentence that looks like an answer is not one unless it says what is asked.
# * ``fact_swap`` (support): a sentence whose one name or number is replaced by
#   another of the same kind taken from another pair, read with the source of the
#   original ("named Tomas Wren as its chair" is not stated by a source naming
#   Rosalind Achebe-Fry). "States" needs the sentence's facts, not its topic.
#
# Each made pair keeps the group of the pair it was made from, so it falls in the
# same split (a held-out question's made pairs are held out too).

_NUMBER = re.compile(r"\d[\d,.]*")


def _names(text: str) -> list[str]:
    """Capitalized words past the first word, and numbers, as they are written."""
    words = text.split()
    out = []
    for k, w in enumerate(words):
        core = w.strip(".,;:!?()\"'")
        if not core:
            continue
        if _NUMBER.fullmatch(core) or (
            k > 0 and core[0].isupper() and core.lower() not in STOPWORDS
        ):
            out.append(core)
    return out


def question_swaps(pairs: Sequence[Pair], seed: int, limit: int) -> list[Pair]:
    """``question_swap`` negatives from the answer positives of ``pairs``."""
    rng = random.Random(seed)
    by_set: dict[str, list[Pair]] = {}
    for p in pairs:
        if p.task == "answer" and p.label == 1:
            by_set.setdefault(p.dataset, []).append(p)
    out: list[Pair] = []
    for _dataset, positives in sorted(by_set.items()):
        index: dict[str, set[int]] = {}
        keys = [{t for t in key_terms(p.first) if not t.isdigit()} for p in positives]
        words = [content_tokens(p.first) for p in positives]
        for i, ks in enumerate(keys):
            for k in ks:
                index.setdefault(k, set()).add(i)
        made: list[Pair] = []
        for i, p in enumerate(positives):
            others = set().union(*(index[k] for k in keys[i])) if keys[i] else set()
            best, score = None, 0.0
            for j in sorted(others):
                q = positives[j]
                if (
                    q.first == p.first
                    or q.sentence == p.sentence
                    or contains_answer(p.sentence, q.first)
                ):
                    continue
                overlap = len(words[i] & words[j]) / max(1, len(words[i] | words[j]))
                if overlap > score:
                    best, score = q, overlap
            if (
                best is not None and score < 0.6
            ):  # a near-identical question may have the same answer
                made.append(
                    Pair(f"{p.id}-qswap", "answer", best.first, p.sentence, 0, p.group, p.dataset)
                )
        rng.shuffle(made)
        out.extend(made[:limit])
    return out


def fact_swaps(pairs: Sequence[Pair], seed: int, limit: int) -> list[Pair]:
    """``fact_swap`` negatives: from support positives (with their source) and
    answer positives (the sentence its own source)."""
    rng = random.Random(seed)
    bases = [
        (p, p.first if p.task == "support" else p.sentence)
        for p in pairs
        if p.label == 1
        and (p.task == "answer" or p.dataset in ("hotpotqa", "fever_symmetric", "snli"))
    ]
    pool_numbers = sorted({n for p, _ in bases for n in _names(p.sentence) if n[0].isdigit()})
    pool_names = sorted({n for p, _ in bases for n in _names(p.sentence) if not n[0].isdigit()})
    made: list[Pair] = []
    for p, source in bases:
        found = _names(p.sentence)
        if not found:
            continue
        old = rng.choice(found)
        pool = pool_numbers if old[0].isdigit() else pool_names
        new = rng.choice(pool) if pool else old
        if new == old or new.lower() in source.lower():
            continue
        sentence = re.sub(rf"(?<!\w){re.escape(old)}(?!\w)", new, p.sentence, count=1)
        if sentence == p.sentence:
            continue
        made.append(Pair(f"{p.id}-fswap", "support", source, sentence, 0, p.group, p.dataset))
    rng.shuffle(made)
    return made[:limit]


# --- keyword queries ------------------------------------------------------------------
#
# People type search queries as often as questions ("Super Bowl 2021 location",
# "Fennick scope 1 emissions 2024"). Every answer set here asks in full
# sentences, and a reader trained on them alone ranks worse than cosine when the
# same questions are typed as keywords (held-out SelQA MAP 0.904 as questions,
# 0.814 as keywords, cosine 0.843). ``keyword_query`` rewrites a question the way
# such a query reads: its words in order, without the question and function
# words; ``keyword_questions`` adds that copy of a share of the answer groups.

_QUERY_WORD = re.compile(r"[^\W_][\w'%$.,:/-]*", re.UNICODE)


def keyword_query(question: str) -> str:
    """``question`` as a keyword query: its words in order, without stop words
    (question words, auxiliaries, articles, pronouns) or trailing punctuation."""
    words = [w.rstrip(".,:") for w in _QUERY_WORD.findall(question)]
    kept = [w for w in words if w and w.lower() not in STOPWORDS]
    return " ".join(kept) or question.strip()


def keyword_groups(pairs: Sequence[Pair], share: float, seed: int) -> list[Pair]:
    """Copies (``<id>-kw``) of the answer pairs of one group in ``1/share`` (by
    a hash of the group and ``seed``), their question read as a keyword query.
    A copy keeps its group, so it falls in the same split as the original."""
    out: list[Pair] = []
    for p in pairs:
        if p.task != "answer" or share <= 0:
            continue
        digest = hashlib.sha256(f"{seed}:{p.dataset}:{p.group}:kw".encode()).digest()
        if int.from_bytes(digest[:8], "big") / 2**64 >= share:
            continue
        query = keyword_query(p.first)
        if query != p.first:
            out.append(Pair(f"{p.id}-kw", "answer", query, p.sentence, p.label, p.group, p.dataset))
    return out
