"""The support judge: how fully a source states an answer sentence's claims.

Every (sentence, source) pair that could become a citation is judged, the
sentence's own source like any other, in both modes. The judge reads the
sentence's claims and looks for each of them in the source:

* its names, numbers and dates (``key_terms``), IDF-weighted over the
  sources, and whether a number or date of the sentence is missing from the
  source altogether;
* its content words, stemmed ("fell" and "falls" are one claim word only
  when they stem alike, which keeps the test strict);
* its negation: "did not approve" is not stated by "approved";
* the answer fact when the question asks for a kind of fact (a date for
  "when", a name for "who", an amount for "how much", read into values by
  ``facts``): whether the source states that fact in full, how completely
  the sentence gives it, and how much of the other sources' relevance
  agrees with it;
* whether the sentence answers the question at all, and whether the source
  is about what the question asks (its words, its meaning, and not another
  year or another numbered thing than the one named).

Two logistic models combine them. The *support* model turns a pair's
features into the probability ``s`` that the source states the sentence's
claims (fitted on pairs whose source is a gold passage or not). The
*answer* model turns what all the sources say of a sentence (how much of
their relevance agrees with its answer fact, how many state it, how
completely it gives a fact of the asked kind, how close it is to the
question, its best and second-best support) into the probability ``a``
that the sentence answers the question (fitted on sentences that contain
a gold answer or not). A quoted sentence is fully stated by its own
source, so ``s`` alone cannot flag a sentence that answers the wrong
question; ``a`` can. The 0-10 confidence of a citation is
``round(10 × s × a)``: both must hold, so a citation at 5 or more needs a
sentence that more likely than not answers the question, stated by a
source that more likely than not states it. The answer as a whole is
rated by ``A``, the best ``a`` of its sentences: how surely the sources
answer the question at all. When ``A`` is below ``answer_floor`` (off by
default; ``RGB_ANSWER_FLOOR`` is RGB's calibration) no source is rated
above 0 and the answer abstains: the sources are about the question's
subject but state no answer to it (another year's winner, the nominees but
not the winner). The rubric this follows: 10,
the source states every claim and the sentence answers the question;
about 5, related but a claim missing or only implied; 0, unrelated or
contradicting. A source that lacks a number or date the sentence gives
rates at most 4 (``PARTIAL_SUPPORT``), below a citation. The weights ship
in ``judge_weights.json`` and are refitted with ``attest eval fit-judge``
on labelled question sets; the fit is reported on the half of the
questions it did not see.

In LLM mode the model's own rating and the judge's are combined by
``combine``: the lower of the two when they disagree by more than
``disagreement`` points (a citation needs both to hold), their mean
otherwise.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from attest.generate.facts import (
    amounts,
    completeness,
    facts_of,
    primary_fact,
    same_amount,
    same_word,
    stem,
    text_facts,
)
from attest.generate.forms import mentions, named_things
from attest.generate.measures import gives_asked_amount
from attest.generate.text import (
    WORD,
    answer_type,
    conflicts_with_question,
    content_tokens,
    dateline_year,
    key_terms,
    names_holder,
    ordinary_words,
    split_sentences,
    strip_dateline,
)
from attest.generate.vectors import TextVectors
from attest.semantic.embedding import Embedder

Matrix = npt.NDArray[np.float64]

WEIGHTS_FILE = Path(__file__).with_name("judge_weights.json")

# The least answer probability of an answer's best sentence for the answer
# to stand (``SupportJudge.judge``), as calibrated on RGB: the highest value
# that costs at most 0.02 answer recall there (``attest eval qa``;
# docs/results/answer-quality.md, "Negative rejection"). Not the default: the
# answer model leans on how many sources agree, so a fact that one source of
# ten states can fall below it (docs/explanation/confidence.md). 0 turns the
# floor off.
RGB_ANSWER_FLOOR = 0.57

# The most support a source gets that lacks a number or date of the
# sentence (not its dateline): the rubric's "a claim missing", so a rating of
# at most 4 of 10, below the citation floor of 5. "The Authority fined
# Norvale $2.4 million for 11 discharges" is not stated by an article that
# names Norvale and the mine but neither figure, however close it reads.
# (0.44, not 0.45: ten times it must round to 4, and halves round up.)
PARTIAL_SUPPORT = 0.44

FEATURES: tuple[str, ...] = (
    "semantic",  # best cosine between the sentence and a sentence of the source
    "claims",  # IDF-weighted share of the sentence's names, numbers and dates in the source
    "words",  # share of the sentence's content-word stems in the source
    "missing_number",  # 1 when a number or date of the sentence is not in the source
    "negation",  # 1 when the sentence and its closest source sentence differ in negation
    "question_words",  # share of the question's content-word stems in the source
    "question_semantic",  # best cosine between the question and a sentence of the source
    "states_answer",  # the source states the sentence's answer fact in full (all its
    # names, numbers and dates when the question asks for no kind of fact)
    "answer_complete",  # how completely the sentence gives a fact of the asked kind
    "consensus",  # share of the other sources' relevance agreeing with that fact (stating it)
    "off_topic",  # the source is about another year or numbered thing than the question
    "answers_question",  # cosine between the sentence and the question
    "typed",  # 1 when the question asks for a kind of fact
    "question_names",  # share of the names the question mentions that the source mentions
    "names_in_sentence",  # share of the names the question mentions that the sentence mentions
    "question_in_sentence",  # share of the question's content-word stems in the sentence
    "relation_in_sentence",  # share of what the question asks of its names (``relation_stems``)
    # that the sentence says, word families matched (``same_word``)
)

# The support model reads only what compares the sentence with the source:
# whether the source states it does not depend on the question.
SUPPORT_FEATURES: tuple[str, ...] = (
    "semantic",
    "claims",
    "words",
    "missing_number",
    "negation",
    "states_answer",
    "off_topic",
)
_SUPPORT_COLUMNS = [FEATURES.index(name) for name in SUPPORT_FEATURES]

# What the sources say of one sentence, from its pairs' features and support.
SENTENCE_FEATURES: tuple[str, ...] = (
    "consensus",  # the most relevance-weighted agreement with its answer fact
    "stated_by",  # share of the sources that state its answer fact in full
    "answer_complete",
    "answers_question",
    "typed",
    "names_in_sentence",  # a sentence about another company does not answer for this one
    "question_in_sentence",  # it says what the question asks about, not just something near it
    "best_support",  # its best support probability over the sources
    "second_support",  # the second best (corroboration)
    # It says the relation asked about: "Wimbledon 2019 - women's singles: Serena
    # Williams and Johanna Konta" names the event but not who won it.
    "relation_in_sentence",
)

_NEGATION = re.compile(
    r"\b(?:not|no|never|none|neither|nor|without|n't|cannot|denied|denies|refused|failed)\b"
    r"|n't\b",
    re.IGNORECASE,
)
_DIGITS = re.compile(r"\d")


@dataclass(frozen=True, slots=True)
class JudgeModel:
    """A logistic model over ``FEATURES``; ``score`` maps features to [0, 1]."""

    weights: tuple[float, ...]
    bias: float
    features: tuple[str, ...]

    def score(self, x: Matrix) -> Matrix:
        if x.shape[-1] != len(self.features):
            raise ValueError(f"expected {len(self.features)} features, got {x.shape[-1]}")
        z = x @ np.asarray(self.weights, dtype=np.float64) + self.bias
        return np.asarray(1.0 / (1.0 + np.exp(-z)), dtype=np.float64)

    def to_json(self) -> dict[str, object]:
        return {
            "features": list(self.features),
            "weights": dict(zip(self.features, self.weights, strict=True)),
            "bias": self.bias,
        }

    @classmethod
    def from_json(cls, data: object, expected: tuple[str, ...]) -> JudgeModel:
        if not isinstance(data, dict):
            raise ValueError("judge weights: expected an object")
        names = tuple(str(n) for n in data.get("features", ()))
        if names != expected:
            raise ValueError(
                f"judge weights are for features {names}, the judge computes {expected}"
            )
        weights, bias = data.get("weights"), data.get("bias")
        if not isinstance(weights, dict) or not isinstance(bias, int | float):
            raise ValueError("judge weights: need 'weights' per feature and a 'bias'")
        return cls(tuple(float(weights[n]) for n in names), float(bias), names)


@dataclass(frozen=True, slots=True)
class JudgeModels:
    """The support model (pairs) and the answer model (sentences)."""

    support: JudgeModel
    answer: JudgeModel

    def to_json(self) -> dict[str, object]:
        return {"support": self.support.to_json(), "answer": self.answer.to_json()}

    @classmethod
    def from_json(cls, data: object) -> JudgeModels:
        if not isinstance(data, dict):
            raise ValueError("judge weights: expected an object with 'support' and 'answer'")
        return cls(
            JudgeModel.from_json(data.get("support"), SUPPORT_FEATURES),
            JudgeModel.from_json(data.get("answer"), SENTENCE_FEATURES),
        )

    @classmethod
    def load(cls, path: Path = WEIGHTS_FILE) -> JudgeModels:
        return cls.from_json(json.loads(path.read_text(encoding="utf-8")))


def _half_up(value: float) -> int:
    """``value`` rounded to the nearest whole number, halves up (Python's
    ``round`` takes halves to the even neighbour: 4.5 to 4 but 5.5 to 6)."""
    return math.floor(value + 0.5)


def to_confidence(probability: float) -> int:
    """A probability as a 0-10 confidence, halves rounded up (0.45 is 5)."""
    return _half_up(10 * min(1.0, max(0.0, probability)))


def combine(model_confidence: int, judge_confidence: int, disagreement: int = 3) -> int:
    """The confidence of a citation rated by both an LLM and the judge: their
    mean when they roughly agree, the lower one when they disagree by more
    than ``disagreement`` points (a citation needs both to hold, so a mean
    half-way between two ratings is rounded down, to the lower one's side:
    a model's 5 beside the judge's 4 is no citation)."""
    if abs(model_confidence - judge_confidence) > disagreement:
        return min(model_confidence, judge_confidence)
    return (model_confidence + judge_confidence) // 2


def _negated(text: str) -> bool:
    return bool(_NEGATION.search(text))


def _stems(text: str) -> set[str]:
    return {stem(t) for t in content_tokens(text)}


def _name_words(text: str) -> set[str]:
    """Lower-cased words of ``text``, possessives folded ("Fennick's" → "fennick")."""
    return {re.sub(r"['’]s$", "", t) for t in content_tokens(text)}


def question_names(question: str) -> set[str]:
    """The names a question mentions: its capitalized words with letters in
    them (``key_terms``: a capitalized first word counts unless it is a
    function word such as "What" or "How"), possessives folded."""
    return {re.sub(r"['’]s$", "", t) for t in key_terms(question) if any(ch.isalpha() for ch in t)}


def relation_stems(question: str) -> set[str]:
    """What a question asks of the things it names: the stems of its content
    words that are neither its names (``question_names``) nor numbers, e.g.
    "won", "women", "singl" for "Who won the women's singles Wimbledon in
    2019?"."""
    names = {stem(n) for n in question_names(question)}
    return {stem(t) for t in content_tokens(question) if not _DIGITS.search(t)} - names


def relation_cover(relation: set[str], words: set[str]) -> float:
    """Share of the ``relation`` stems that ``words`` has a word of the same
    family for; 1 when the question asks nothing beyond its names."""
    if not relation:
        return 1.0
    return sum(any(same_word(r, w) for w in words) for r in relation) / len(relation)


def lacks_figures(sentences: Sequence[str], sources: Sequence[str]) -> npt.NDArray[np.bool_]:
    """Per (sentence, source): whether the source lacks a number or date the
    sentence gives (its dateline aside): it states the sentence only in part
    (``PARTIAL_SUPPORT``). An amount the source writes another way is not
    lacking ("1,820,000" and "1.82 million", "11" and "eleven")."""
    have = [key_terms(strip_dateline(s)) | content_tokens(s) for s in sources]
    stated = [[value for value, _ in amounts(unicodedata.normalize("NFKC", s))] for s in sources]
    out = np.zeros((len(sentences), len(sources)), dtype=bool)
    for i, sentence in enumerate(sentences):
        numbers = {k for k in key_terms(strip_dateline(sentence)) if _DIGITS.search(k)}
        if not numbers:
            continue
        # The amounts each number of the sentence is part of ("1", "820" and
        # "000" of "1,820,000"; "2.4m"; not the 19 of "COVID-19", a name).
        body = unicodedata.normalize("NFKC", strip_dateline(sentence))
        found = amounts(body)
        parts: dict[str, list[tuple[float, str]]] = {}
        for match in WORD.finditer(body):
            token = match.group().strip(".-'’").lower()
            if token in numbers and token[0].isdigit():
                parts.setdefault(token, []).extend(
                    value for value, (a, b) in found if a < match.end() and match.start() < b
                )
        for j, h in enumerate(have):
            out[i, j] = any(
                k not in h
                and not (
                    parts.get(k)
                    and all(any(same_amount(v, w) for w in stated[j]) for v in parts[k])
                )
                for k in numbers
            )
    return out


def grounded(question: str, pairs: Sequence[tuple[str, str]]) -> bool:
    """Whether an answer is about what the question names: some (sentence,
    cited source) pair mentions at least half of the question's names
    (``question_names``). A question that names nothing is grounded by any
    answer. This is what keeps one company's figure from answering for
    another ("Norvale cut emissions by 30 %" for a question about Fennick)
    when every other feature of the sentence looks like an answer."""
    names = question_names(question)
    if not names:
        return True
    # A choice or yes/no question names each thing it asks about ("Who was
    # born first, Erika Jayne or Marco Da Silva?"): an answer about one of
    # them is about what the question names.
    named = named_things(question)
    return any(
        2 * len(names & (_name_words(sentence) | _name_words(source))) >= len(names)
        or any(mentions(n, sentence) >= 0.5 for n in named)
        for sentence, source in pairs
    )


class SupportJudge:
    """Judges (sentence, source) pairs for one question."""

    def __init__(
        self,
        embedder: Embedder,
        models: JudgeModels | None = None,
        cosine_floor: float = 0.2,
        answer_floor: float = 0.0,
        segment: Callable[[str], list[str]] | None = None,
    ) -> None:
        self.embedder = embedder
        self.models = models or JudgeModels.load()
        self.cosine_floor = cosine_floor
        self.answer_floor = answer_floor
        # How a source is cut into the sentences a claim is matched against;
        # the generator passes its own cut, so their vectors are shared.
        self.segment = segment or (lambda s: split_sentences(strip_dateline(s)))

    def features(
        self,
        question: str,
        sentences: Sequence[str],
        sources: Sequence[str],
        vectors: TextVectors | None = None,
    ) -> npt.NDArray[np.float64]:
        """Features of every pair: shape (sentences, sources, len(FEATURES));
        texts ``vectors`` already holds are not embedded again."""
        n, m = len(sentences), len(sources)
        out = np.zeros((n, m, len(FEATURES)), dtype=np.float64)
        if not n or not m:
            return out
        parts = [self.segment(s) or [s] for s in sources]
        flat = [p for ps in parts for p in ps]
        owner = np.repeat(np.arange(m), [len(p) for p in parts])
        memo = vectors if vectors is not None else TextVectors(self.embedder)
        encoded = memo.encode([question or " ", *sentences, *flat])
        q_vec, s_vecs, p_vecs = encoded[0], encoded[1 : n + 1], encoded[n + 1 :]
        sims = s_vecs @ p_vecs.T  # sentence × source sentence
        q_sims = p_vecs @ q_vec
        floor = self.cosine_floor

        def lift(x: npt.ArrayLike) -> npt.NDArray[np.float64]:
            return np.clip((np.asarray(x, dtype=np.float64) - floor) / (1 - floor), 0.0, 1.0)

        best_part = np.zeros((n, m), dtype=np.int64)
        semantic = np.zeros((n, m))
        q_semantic = np.zeros(m)
        offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])])
        for j in range(m):
            block = sims[:, owner == j]
            best_part[:, j] = offsets[j] + block.argmax(axis=1)
            semantic[:, j] = block.max(axis=1)
            q_semantic[j] = float(q_sims[owner == j].max())

        # IDF over the sources, so a word every source has says little.
        source_tokens = [content_tokens(s) for s in sources]
        source_stems = [{stem(t) for t in toks} for toks in source_tokens]
        source_keys = [
            key_terms(strip_dateline(s)) | toks
            for s, toks in zip(sources, source_tokens, strict=True)
        ]
        df: dict[str, int] = {}
        for toks in source_tokens:
            for t in toks:
                df[t] = df.get(t, 0) + 1

        def idf(t: str) -> float:
            return math.log(1 + (m + 1) / (df.get(t, 0) + 1))

        q_names = question_names(question)
        name_cover = [
            len(q_names & _name_words(s)) / len(q_names) if q_names else 0.0 for s in sources
        ]
        q_stems = _stems(question)
        relation = relation_stems(question)
        q_cover = np.array(
            [len(q_stems & st) / len(q_stems) if q_stems else 0.0 for st in source_stems]
        )
        off = np.array(
            [
                bool(question) and conflicts_with_question(s, question, dateline_year(s))
                for s in sources
            ],
            dtype=np.float64,
        )

        kind = answer_type(question) if question else ""
        common = ordinary_words(sources)
        stated = [text_facts(s, kind, question, common) for s in sources] if kind else []
        weight = [0.0 if off[j] else max(0.0, q_semantic[j]) for j in range(m)]
        answers = s_vecs @ q_vec

        for i, sentence in enumerate(sentences):
            in_sentence = len(q_names & _name_words(sentence)) / len(q_names) if q_names else 0.0
            keys = key_terms(strip_dateline(sentence))
            words = _stems(sentence)
            asked_in_sentence = len(q_stems & words) / len(q_stems) if q_stems else 0.0
            relation_said = relation_cover(relation, words)
            numbers = {k for k in keys if _DIGITS.search(k)}
            negated = _negated(sentence)
            fact = None
            complete = 1.0
            agree = np.zeros(m)
            if kind:
                facts = facts_of(sentence, kind, question, common)
                fact, _ = primary_fact(facts, stated, weight)
                complete = completeness(facts, kind, fact, stated)
                if fact is not None:
                    agree = np.array([float(s.agrees(fact)) for s in stated])
            states_all = [
                keys <= source_keys[j]
                if keys
                else bool(words) and len(words & source_stems[j]) >= 0.8 * len(words)
                for j in range(m)
            ]
            if not kind:
                agree = np.array(states_all, dtype=np.float64)
            total_weight = sum(weight)
            for j in range(m):
                f = out[i, j]
                f[0] = semantic[i, j]
                key_total = sum(idf(k) for k in keys)
                f[1] = (
                    sum(idf(k) for k in keys if k in source_keys[j]) / key_total
                    if key_total
                    else 1.0
                )
                f[2] = len(words & source_stems[j]) / len(words) if words else 0.0
                f[3] = float(any(k not in source_keys[j] for k in numbers))
                f[4] = float(negated != _negated(flat[best_part[i, j]]))
                f[5] = q_cover[j]
                f[6] = q_semantic[j]
                if kind:
                    f[7] = float(fact is not None and stated[j].states(fact))
                else:
                    # No kind of fact asked for: the sentence's facts are all
                    # its names, numbers and dates (its words when it has none).
                    f[7] = float(states_all[j])
                f[8] = complete
                rest = total_weight - weight[j]
                f[9] = (
                    float(sum(w for k, w in enumerate(weight) if k != j and agree[k]) / rest)
                    if rest > 0
                    else 0.0
                )
                f[10] = off[j]
                f[11] = float(answers[i])
                f[12] = float(bool(kind))
                f[13] = name_cover[j]
                f[14] = in_sentence
                f[15] = asked_in_sentence
                f[16] = relation_said
        out[:, :, 0] = lift(out[:, :, 0])
        out[:, :, 6] = lift(out[:, :, 6])
        out[:, :, 11] = lift(out[:, :, 11])
        return out

    def judge(
        self,
        question: str,
        sentences: Sequence[str],
        sources: Sequence[str],
        vectors: TextVectors | None = None,
    ) -> npt.NDArray[np.float64]:
        """Confidence in [0, 1] of each source (columns) for each sentence (rows):
        support × answer, 0 throughout when no sentence reaches
        ``answer_floor`` (see the module docstring); the support alone when
        there is no question."""
        x = self.features(question, sentences, sources, vectors)
        if not x.size:
            return np.zeros((len(sentences), len(sources)))
        support = self.models.support.score(support_features(x))
        if not question.strip():
            # Nothing to answer: the rating is the support alone.
            return support
        answer = self.models.answer.score(sentence_features(x, support))
        named = named_things(question)
        if named:
            # A choice or yes/no question is answered by what the sources say of
            # each thing it names (``forms``): a sentence about one of them is
            # part of the answer, and its rating is how well it is supported.
            about = [any(mentions(n, s) >= 0.5 for n in named) for s in sentences]
            answer = np.where(about, 1.0, answer)
        # A sentence naming the holder of the role asked for answers the question
        # (``names_holder``): its rating is how well it is supported, by a
        # source that states every name and number it gives.
        holder = np.array([names_holder(s, question) for s in sentences], dtype=bool)
        if holder.any():
            answer = np.where(holder, 1.0, answer)
            keys = [key_terms(strip_dateline(s)) - key_terms(question) for s in sentences]
            stated = [key_terms(strip_dateline(s)) | content_tokens(s) for s in sources]
            states = np.array([[float(k <= have) for have in stated] for k in keys])
            support = np.where(holder[:, None], support * states, support)
        # A question about an amount is answered only by a sentence that gives
        # an amount of what it measures (``measures``), however well the rest
        # of the sentence matches.
        answer = np.where(gives_asked_amount(question, sentences, sources), answer, 0.0)
        if float(answer.max()) < self.answer_floor:
            # No sentence answers the question: nothing here is a citation for it.
            return np.zeros_like(support)
        # A source without a number or date the sentence gives states it only
        # in part: its rating stays below a citation's (``PARTIAL_SUPPORT``).
        # Applied after the answer model, whose corroboration features were
        # fitted on the support as the support model gives it.
        missing = lacks_figures(sentences, sources)
        support = np.where(missing, np.minimum(support, PARTIAL_SUPPORT), support)
        return np.asarray(support * answer[:, None], dtype=np.float64)


def support_features(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The ``SUPPORT_FEATURES`` columns of pair features ``x``."""
    return x[..., _SUPPORT_COLUMNS]


def sentence_features(
    x: npt.NDArray[np.float64], support: npt.NDArray[np.float64]
) -> npt.NDArray[np.float64]:
    """``SENTENCE_FEATURES`` of each sentence from its pairs' features ``x``
    (sentences, sources, features) and support probabilities (sentences, sources)."""
    col = {name: k for k, name in enumerate(FEATURES)}
    ranked = np.sort(support, axis=1)
    if support.shape[1] > 1:
        second = ranked[:, -2]
        consensus = x[:, :, col["consensus"]].max(axis=1)
    else:
        # One source is all the evidence there is: nothing can agree with it
        # or contradict it, so it stands for the sources' agreement itself.
        second = ranked[:, -1]
        consensus = x[:, 0, col["states_answer"]]
    return np.stack(
        [
            consensus,
            x[:, :, col["states_answer"]].mean(axis=1),
            x[:, :, col["answer_complete"]].max(axis=1),
            x[:, :, col["answers_question"]].max(axis=1),
            x[:, :, col["typed"]].max(axis=1),
            x[:, :, col["names_in_sentence"]].max(axis=1),
            x[:, :, col["question_in_sentence"]].max(axis=1),
            ranked[:, -1],
            second,
            x[:, :, col["relation_in_sentence"]].max(axis=1),
        ],
        axis=1,
    )
