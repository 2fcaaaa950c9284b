"""Extractive generation with no LLM: the embedded default.

Every step is a selection of sentences that exist in the sources, so nothing
is invented and every answer sentence has a passage it came from.

* Summaries: maximal marginal relevance (MMR) over a source's sentences,
  relevance being MiniLM cosine similarity to the question (to the source's
  centroid when there is no question), kept in document order.
* Answer: candidates are the sentences of all sources, except questions and
  sentences that add nothing to the question's own words. A candidate's
  score averages its relevance to the question with its corroboration, the
  mean of (a) how much of what it adds beyond the question (its names,
  numbers and dates, IDF-weighted over the sources) the three most agreeing
  other sources also state, and (b) answer redundancy: the share of the
  other sources' relevance that agrees with its best fact of the kind the
  question asks for (a date for "when", a name for "who", an amount for
  "how much"), facts being read into values (``facts``) so that "21 July
  2017" and "July 21, 2017" are one fact and "November 12" agrees with
  "November 12, 2020" but does not state it. A claim several independent
  sources repeat is more likely the answer than one a single source makes.
  A sentence is ranked by how completely it states such a fact: a full date
  before a month, a month before a bare year, a full name before a surname
  the sources give in full elsewhere, and a sentence without a fact of the
  asked-for kind (datelines do not count: when a text was published is not
  what it states) or about another year than the one the question names
  (with no year of its own: published in another year) or another one of
  what it names ("season 3" for "season 4") behind those. MMR then picks
  the sentences, so the answer does not repeat itself; when a single-part
  question asks for a kind of fact, a further sentence stays only if it
  states the first one's fact in full, so the answer gives one answer with
  its context and never rival answers it ranks lower.
* Citation and confidence: every source is rated for every answer sentence
  by the support judge (``judge``): the probability that the source states
  the sentence's claims, times the probability that the sentence answers
  the question, as a 0-10 confidence. The source a sentence was quoted
  from is rated like any other, so a quoted sentence that answers another
  question (another company, another year, a fact no other source backs)
  is not a confident citation. Sources at or above ``min_confidence`` are
  cited, best first.

The numeric choices are fixed by what the scores mean, not fitted to an
evaluation set; they are settings so that a deployment can calibrate them.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from attest.core.settings import StrictModel
from attest.generate.facts import Fact, completeness, facts_of, primary_fact, text_facts
from attest.generate.forms import (
    Place,
    choice_of,
    choose,
    in_common,
    polar_of,
    shared_of,
    yes_or_no,
)
from attest.generate.judge import SupportJudge, to_confidence
from attest.generate.measures import asked_measure, bare_count_of, gives_asked_amount
from attest.generate.models import Proposal, Source
from attest.generate.reader import READER_ANSWER_FLOOR, ReaderJudge, shared_reader
from attest.generate.text import (
    answer_type,
    asked_kind,
    asked_role,
    compound_parts,
    conflicts_with_question,
    contains_answer,
    content_tokens,
    dateline_year,
    is_compound,
    key_terms,
    names_holder,
    names_kind,
    ordinary_words,
    refers_elsewhere,
    says_role,
    split_sentences,
    stated_text,
    strip_dateline,
    tokens,
)
from attest.generate.vectors import TextVectors
from attest.semantic.embedding import Embedder

Matrix = npt.NDArray[np.float32]


class ExtractiveSettings(StrictModel):
    answer_sentences: int = Field(
        default=3,
        description="Sentences in an extractive answer, at most.",
    )
    mmr_lambda: float = Field(
        default=0.7,
        description="Maximal marginal relevance: weight of relevance against redundancy with "
        "sentences already chosen (1: relevance only).",
    )
    corroboration_weight: float = Field(
        default=0.5,
        description="Weight of corroboration by the other sources against the sentence's own "
        "relevance to the question.",
    )
    corroborating_sources: int = Field(
        default=3,
        description="Other sources whose word overlap counts as corroboration of a candidate "
        "sentence.",
    )
    min_relevance: float = Field(
        default=0.15,
        description="Cosine similarity to the question a candidate sentence needs; when none has "
        "it, the answer is insufficient information.",
    )
    min_confidence: int = Field(
        default=5,
        description="Least confidence (0-10) of a citation the extractive engine proposes.",
    )
    cosine_floor: float = Field(
        default=0.2,
        description="The support judge's floor: a cosine similarity at or below it counts as no "
        "support.",
    )
    # An answer whose best sentence answers the question with a lower
    # probability abstains; 0, the default, turns that off
    # (``judge.RGB_ANSWER_FLOOR`` is the value calibrated on RGB).
    answer_floor: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="An answer whose best sentence answers the question with a lower probability "
        "abstains; 0 turns this off.",
    )
    unlinked_penalty: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Factor on the score of a sentence from a source linked to nothing the "
        "question names (``linked_sources``); 1 turns it off.",
    )
    min_fragment_words: int = Field(
        default=5,
        description="Shorter pieces of text (datelines and the like) are joined to the next "
        "sentence.",
    )
    untyped_penalty: float = Field(
        default=0.5,
        description="Score taken from a sentence that does not state the kind of fact asked for (a "
        "date for 'when', a name for 'who').",
    )
    # Who rates answers and citations: the hand-built features and logistic
    # models of ``judge`` (``features``, the default), the trained reader
    # (``reader``: a cross-encoder read with the question and with each
    # source), or both (``both``: the geometric mean of the two ratings). The
    # default is the one that loses no citation precision on any development
    # set (docs/reader.md, "Which judge").
    judge: Literal["both", "reader", "features"] = Field(
        default="features",
        description="Who rates answers and citations: features (the hand-built judge), reader (the "
        "trained cross-encoder) or both (their geometric mean).",
    )
    # With the reader: an answer whose best sentence answers the question with
    # a lower probability abstains (calibrated on the development split).
    reader_answer_floor: float = Field(
        default=READER_ANSWER_FLOOR,
        ge=0.0,
        le=1.0,
        description="With the reader: an answer whose best sentence answers the question with a "
        "lower probability abstains.",
    )
    # Candidate sentences the reader reads per answer (the best by the features).
    reader_candidates: int = Field(
        default=24,
        ge=1,
        le=512,
        description="Candidate sentences the reader reads per answer (the best by the features).",
    )
    # Multi-hop (``_bridge``): the least rating of a sentence read with the
    # question and the best sentence to join the answer; 1 turns it off.
    bridge_min: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Multi-hop: least rating of a second sentence, read with the question and the "
        "best one, to join the answer; 1 turns it off.",
    )


@dataclass(frozen=True, slots=True)
class Candidate:
    text: str
    source_index: int


def fragments(text: str, min_words: int) -> list[str]:
    """Sentences, with short pieces (datelines, "Feb 7, 2021 ...") joined to the next."""
    out: list[str] = []
    carry = ""
    for sentence in split_sentences(text):
        piece = f"{carry} {sentence}".strip() if carry else sentence
        if len(tokens(piece)) < min_words:
            carry = piece
            continue
        out.append(piece)
        carry = ""
    if carry:
        if out:
            out[-1] = f"{out[-1]} {carry}"
        else:
            out.append(carry)
    return out


def _distinct(cands: Iterable[Candidate]) -> list[Candidate]:
    """The candidates whose text no earlier one has (case and spacing aside)."""
    seen: set[str] = set()
    out: list[Candidate] = []
    for cand in cands:
        key = " ".join(cand.text.split()).casefold()
        if key not in seen:
            seen.add(key)
            out.append(cand)
    return out


def mmr(scores: Sequence[float], similarity: Matrix, k: int, lam: float) -> list[int]:
    """Indices chosen by maximal marginal relevance, best first."""
    chosen: list[int] = []
    remaining = set(range(len(scores)))
    while remaining and len(chosen) < k:

        def value(i: int) -> float:
            redundancy = max((float(similarity[i, j]) for j in chosen), default=0.0)
            return lam * scores[i] - (1 - lam) * redundancy

        best = max(sorted(remaining), key=value)
        chosen.append(best)
        remaining.discard(best)
    return chosen


class ExtractiveEngine:
    """Selection, citation and confidence from embeddings and word overlap."""

    def __init__(
        self,
        embedder: Embedder,
        settings: ExtractiveSettings | None = None,
        judge: SupportJudge | ReaderJudge | None = None,
    ) -> None:
        self.embedder = embedder
        self.settings = settings or ExtractiveSettings()
        self.judge: SupportJudge | ReaderJudge
        if judge is not None:
            self.judge = judge
        else:
            features = SupportJudge(
                embedder,
                cosine_floor=self.settings.cosine_floor,
                answer_floor=self.settings.answer_floor,
                segment=lambda text: fragments(text, self.settings.min_fragment_words),
            )
            if self.settings.judge == "features":
                self.judge = features
            else:
                # Loaded now: a missing or broken file stops the service at start
                # with its reason, instead of failing every answer.
                self.judge = ReaderJudge(
                    shared_reader(),
                    answer_floor=self.settings.reader_answer_floor,
                    features=features if self.settings.judge == "both" else None,
                )

    def warm_up(self) -> None:
        # One encode as well: the first one pays torch's lazy set-up (seconds).
        self.embedder.encode(["warm up"])
        if isinstance(self.judge, ReaderJudge):
            self.judge.warm_up()

    def vectors(self, given: TextVectors | None = None) -> TextVectors:
        """``given``, or a memo of this call's own (a step called on its own)."""
        return given if given is not None else TextVectors(self.embedder)

    async def prepare(self, question: str, sources: Sequence[Source], vectors: TextVectors) -> None:
        """Embeds the question and every source's sentences in one call, in
        source order, before the summaries (which run concurrently) and the
        answer read them: one batch instead of one per source and step, and a
        vector that does not depend on which summary thread came first."""
        texts = [question] + [
            part for s in sources for part in fragments(s.text, self.settings.min_fragment_words)
        ]
        await asyncio.to_thread(vectors.encode, texts)

    # -- summaries -----------------------------------------------------------------

    async def summarize(
        self,
        source: Source,
        query: str,
        max_sentences: int,
        vectors: TextVectors | None = None,
    ) -> str:
        return await asyncio.to_thread(
            self._summarize, source.text, query, max_sentences, self.vectors(vectors)
        )

    def _summarize(self, text: str, query: str, max_sentences: int, memo: TextVectors) -> str:
        parts = fragments(text, self.settings.min_fragment_words)
        if len(parts) <= max_sentences:
            return " ".join(parts)
        vectors = memo.encode([*parts, query] if query else parts)
        if query:
            relevance = vectors[:-1] @ vectors[-1]
            vectors = vectors[:-1]
        else:
            centroid = vectors.mean(axis=0)
            relevance = vectors @ (centroid / max(float(np.linalg.norm(centroid)), 1e-9))
        chosen = mmr(
            relevance.tolist(), vectors @ vectors.T, max_sentences, self.settings.mmr_lambda
        )
        return " ".join(parts[i] for i in sorted(chosen))

    # -- answer ----------------------------------------------------------------------

    async def answer(
        self,
        question: str,
        sources: Sequence[Source],
        max_sentences: int,
        vectors: TextVectors | None = None,
    ) -> list[Candidate]:
        """Answer sentences taken from the sources; empty when none is relevant."""
        return await asyncio.to_thread(
            self._answer, question, sources, max_sentences, self.vectors(vectors)
        )

    def candidates(
        self, question: str, sources: Sequence[Source], count: int
    ) -> list[tuple[Candidate, float]]:
        """The ``count`` best answer candidates and their scores before the
        judge and the selection (for batch work such as fitting the judge)."""
        ranked = self._rank(question, sources, self.vectors())
        if ranked is None:
            return []
        cands, score = ranked[0], ranked[1]
        top = np.argsort(-score, kind="stable")[:count]
        return [(cands[i], float(score[i])) for i in top]

    def _rank(
        self,
        question: str,
        sources: Sequence[Source],
        memo: TextVectors,
        context: str = "",
        corroborate: bool = True,
    ) -> (
        tuple[list[Candidate], Matrix, Matrix, Matrix, list[Fact | None], str, frozenset[str]]
        | None
    ):
        """Every candidate sentence with its score, relevance, vectors, answer
        fact, the question's answer kind and the sources' ordinary words.

        ``context`` (the names an earlier part of the question and its answer
        gave) is read with the question for relevance only: what the question
        asks for, and the names it gives itself, are the question's own.
        Without ``corroborate`` a sentence's score is its relevance alone, not
        weighed with how much the other sources back it."""
        # A question states no fact, and a sentence that only repeats the
        # question's words adds none, nor does one that only refers the reader
        # elsewhere ("refer to Note 1"), so none can be an answer sentence.
        asked = content_tokens(question)
        # A sentence several sources print word for word (syndicated copies, a
        # repeated boilerplate line) is one candidate, taken from the first of
        # them: the others back it as corroboration and are cited with it.
        cands = _distinct(
            Candidate(text, i)
            for i, s in enumerate(sources)
            for text in fragments(s.text, self.settings.min_fragment_words)
            if not text.rstrip(" .…").endswith("?")
            and not refers_elsewhere(text)
            and content_tokens(strip_dateline(text)) - asked
        )
        if not cands:
            return None
        asking = f"{question} {context}" if context else question
        vectors = memo.encode([asking, *(c.text for c in cands)])
        relevance = vectors[1:] @ vectors[0]
        if float(relevance.max()) < self.settings.min_relevance:
            return None
        scorer = _Overlap([s.text for s in sources], question)
        corroboration = np.zeros(len(cands), dtype=np.float32)
        n_top = self.settings.corroborating_sources
        # A source about another year, or another one of what the question
        # names, neither corroborates nor votes. Without ``corroborate`` the
        # overlap is not read at all.
        off = off_topic([s.text for s in sources], question)
        for i, cand in enumerate(cands if corroborate else ()):
            others = sorted(
                (
                    scorer.share(cand.text, j)
                    for j in range(len(sources))
                    if j != cand.source_index and not off[j]
                ),
                reverse=True,
            )[:n_top]
            corroboration[i] = float(np.mean(others)) if others else 0.0
        # Answer redundancy: how much of the other sources' relevance backs the
        # sentence's best fact of the asked-for kind, the same fact stated as
        # completely (see ``facts``).
        kind = answer_type(question)
        common = ordinary_words(s.text for s in sources)
        owner = np.array([c.source_index for c in cands])
        weight = [
            max(0.0, float(relevance[owner == j].max()))
            if (owner == j).any() and not off[j]
            else 0.0
            for j in range(len(sources))
        ]
        stated = [text_facts(s.text, kind, question, common) for s in sources]
        cand_facts = [facts_of(c.text, kind, question, common) for c in cands]
        votes = np.zeros(len(cands), dtype=np.float32)
        primary: list[Fact | None] = []
        for i, cand in enumerate(cands):
            fact, backed = primary_fact(cand_facts[i], stated, weight, exclude=cand.source_index)
            primary.append(fact)
            rest = sum(weight) - weight[cand.source_index]
            votes[i] = backed / rest if rest > 0 else 0.0
        corroboration = 0.5 * corroboration + 0.5 * votes
        w = self.settings.corroboration_weight if corroborate else 0.0
        score = (1 - w) * relevance + w * corroboration
        # Sentences that state the kind of fact asked for (a date for "when", a
        # name for "who", ...) come before those that do not, a full date
        # before a bare year; a sentence about another year than the one asked
        # about comes last.
        penalty = self.settings.untyped_penalty
        typed = np.array(
            [completeness(f, kind, p, stated) for f, p in zip(cand_facts, primary, strict=True)]
        )
        published = [dateline_year(s.text) for s in sources]
        conflict = np.array(
            [conflicts_with_question(c.text, question, published[c.source_index]) for c in cands]
        )
        # ... and so does one that gives no amount of what a question about an
        # amount measures (``measures``).
        texts = [s.text for s in sources]
        conflict |= ~gives_asked_amount(question, [c.text for c in cands], texts)
        # "Which wind farm ...", "Who became the independent chair ...": when
        # some sentences name a wind farm, or say the role and name someone,
        # the others come after all of them, however close to the question.
        behind = np.zeros(len(cands), dtype=bool)
        named_kind = asked_kind(question)
        if named_kind:
            named = np.array([names_kind(c.text, named_kind) for c in cands], dtype=bool)
            behind |= ~named if named.any() else behind
        role = asked_role(question)
        if role and kind == "name":
            held = np.array(
                [
                    says_role(c.text, role) and bool(f)
                    for c, f in zip(cands, cand_facts, strict=True)
                ],
                dtype=bool,
            )
            behind |= ~held if held.any() else behind
        if isinstance(self.judge, ReaderJudge):
            # The reader decides which sentence answers: P(answers), behind the
            # sentences about another year or numbered thing than the one asked.
            # It reads the ``reader_candidates`` best by the features' score
            # (a cross-encoder per sentence costs milliseconds; the features
            # rank the rest below them, in their order).
            before = (penalty + (1 - penalty) * typed) * score * np.where(conflict, penalty, 1.0)
            read = np.argsort(-before, kind="stable")[: self.settings.reader_candidates]
            answers = np.zeros(len(cands))
            answers[read] = self.judge.answers(question, [cands[i].text for i in read])
            # ... from a source about what the question asks: the cosine of the
            # question with the source (its title and text) as a whole.
            whole = memo.encode([f"{s.title}. {s.text}" if s.title else s.text for s in sources])
            about = np.clip(whole @ vectors[0], 0.0, 1.0)[owner]
            rating = answers * about
            if self.judge.features is not None:
                rating = rating * np.clip(before, 0.0, None)
            score = rating + 1e-6 * before
        else:
            score = score * (penalty + (1 - penalty) * typed) * np.where(conflict, penalty, 1.0)
        # A source linked to nothing the question names comes after the others.
        linked = linked_sources(question, sources, common)
        score = score * np.where(linked[owner], 1.0, self.settings.unlinked_penalty)
        # Scores are at most 1: 2 below puts a sentence behind every other.
        score = score - 2.0 * behind
        return cands, np.asarray(score, dtype=np.float32), relevance, vectors, primary, kind, common

    def _answer(
        self, question: str, sources: Sequence[Source], max_sentences: int, memo: TextVectors
    ) -> list[Candidate]:
        decided = self._decide(question, sources)
        if decided is not None:
            return decided[:max_sentences]
        # A question asking several things: the best sentence for each part
        # first, then the question's own picks (``_answer_parts``).
        parts = compound_parts(question)
        by_part, answered = (
            self._answer_parts(parts, sources, memo) if len(parts) > 1 else ([], False)
        )
        k = min(max_sentences, self.settings.answer_sentences)
        if answered:
            # Every part has its sentence: the whole question's picks would add
            # sentences that answer none of them.
            return by_part[:k]
        ranked = self._rank(question, sources, memo)
        if ranked is None:
            return by_part[:max_sentences]
        cands, score, relevance, vectors, primary, kind, common = ranked
        sims = vectors[1:] @ vectors[1:].T
        chosen = mmr(score.tolist(), sims, k, self.settings.mmr_lambda)
        chosen = [i for i in chosen if relevance[i] >= self.settings.min_relevance]
        out = self._one_answer(question, cands, chosen, primary, kind, common)
        if by_part:
            return [*by_part, *(c for c in out if c not in by_part)][:k]
        if out and isinstance(self.judge, ReaderJudge) and k > 1:
            hop = self._bridge(question, sources, out[0], float(score[chosen[0]]))
            if hop is not None and hop not in out:
                out = [out[0], hop, *out[1:]][:k]
        return out

    def _answer_parts(
        self, parts: list[str], sources: Sequence[Source], memo: TextVectors
    ) -> tuple[list[Candidate], bool]:
        """A question that asks several things, answered part by part: the best
        sentence for each part, in the parts' order (one sentence when it
        answers several: "cut its order from six to four"), and whether every
        part found one.

        A later part leans on the earlier ones ("... and how many does it now
        plan to take?", "how many turbines does that wind farm have?"), so it
        is read with the names the earlier parts and their answers state (the
        bridge: "that wind farm" is the Brannock Moor wind farm the first
        answer names), and a "how many/much" with no noun of its own counts
        what the first part counted ("how many [ships] does it ...")."""
        out: list[Candidate] = []
        # The facts of its part's kind each chosen sentence gave, part by part.
        given: dict[Candidate, list[set[Fact]]] = {}
        found = 0
        context: dict[str, None] = {}
        first = asked_measure(parts[0])
        for k, part in enumerate(parts):
            if k and first is not None:
                part = bare_count_of(part, first)
            # A part is ranked by its relevance alone, a later one read with
            # the names the earlier parts and their answers gave: the other
            # sources' votes for a fact of its kind back every sentence about
            # the same event alike ("which regulator imposed it?").
            ranked = self._rank(part, sources, memo, " ".join(context), corroborate=False)
            context.update(dict.fromkeys(_names(part)))
            if ranked is None:
                continue
            cands, score, relevance, common = ranked[0], ranked[1], ranked[2], ranked[6]
            kind = answer_type(part)
            for i in np.argsort(-score, kind="stable"):
                if relevance[i] < self.settings.min_relevance:
                    break
                cand = cands[i]
                facts = set(facts_of(cand.text, kind, part, common))
                if cand in out:
                    # Already in the answer: it answers this part too when it
                    # gives a fact of the kind this part asks for that it did
                    # not give for an earlier one ("fined Quaystone $14.5
                    # million" names the regulator; "ordered six ships" does
                    # not say how many it now plans to take). Each earlier
                    # part took one of the facts it gave: "from six to four"
                    # answers two parts.
                    earlier = given[cand]
                    if (
                        not kind
                        or facts - set().union(*earlier)
                        or len(facts) > sum(1 for f in earlier if f & facts)
                    ):
                        earlier.append(facts)
                        found += 1
                        break
                    continue
                out.append(cand)
                given[cand] = [facts]
                found += 1
                context.update(dict.fromkeys(_names(strip_dateline(cand.text))))
                break
        return out, found == len(parts)

    def _one_answer(
        self,
        question: str,
        cands: list[Candidate],
        chosen: list[int],
        primary: list[Fact | None],
        kind: str,
        common: frozenset[str],
    ) -> list[Candidate]:
        if not chosen or not kind:
            return [cands[i] for i in chosen]
        # One answer, not several: when the question asks for a kind of fact,
        # a further sentence must state the best one's fact in full (it adds
        # context to that answer), unless the question asks for several things.
        first = chosen[0]
        fact = primary[first]
        if names_holder(cands[first].text, question):
            # The holder of the role asked ("Rosalind Achebe-Fry was named
            # independent chair"): a further sentence must name the holder of
            # that role too, the same one (not the chief executive of the same
            # sources, nor another candidate for the post).
            return [cands[first]] + [
                cands[i]
                for i in chosen[1:]
                if names_holder(cands[i].text, question)
                and (fact is None or text_facts(cands[i].text, kind, question, common).states(fact))
            ]
        if fact is None or is_compound(question):
            return [cands[i] for i in chosen]
        return [cands[first]] + [
            cands[i]
            for i in chosen[1:]
            if text_facts(cands[i].text, kind, question, common).states(fact)
        ]

    def _bridge(
        self, question: str, sources: Sequence[Source], best: Candidate, best_score: float
    ) -> Candidate | None:
        """Multi-hop: the sentence of another source that answers the question
        once the best sentence is known, when the best sentence names a thing
        the question does not (a bridge: "the woman who portrayed Corliss
        Archer" is "Shirley Temple", and the question's answer is in what the
        sources say of Shirley Temple).

        The bridge names are the best sentence's names (and its source's
        title) that the question does not mention; the sources about them are
        those whose title, or else whose text, names one; their sentences are
        read by the reader with the question followed by the best sentence.
        The best of them joins the answer when that reading rates it at
        least ``bridge_min`` and above the best sentence's own rating."""
        assert isinstance(self.judge, ReaderJudge)
        asked = {t.lower() for t in content_tokens(question)} | key_terms(question)
        own = sources[best.source_index]
        names = {t for t in key_terms(best.text) | key_terms(own.title) if not t.isdigit()}
        names = {t for t in names - asked if len(t) > 2}
        if not names:
            return None
        found: list[Candidate] = []
        for j, source in enumerate(sources):
            if j == best.source_index or source.text == own.text:
                continue
            title = key_terms(source.title)
            about = bool(names & title) if title else bool(names & key_terms(source.text))
            if not about:
                continue
            found.extend(
                Candidate(text, j)
                for text in fragments(source.text, self.settings.min_fragment_words)
                if not text.rstrip(" .…").endswith("?") and not refers_elsewhere(text)
            )
        if not found:
            return None
        found = found[: self.settings.reader_candidates]
        read = self.judge.answers(f"{question} {best.text}", [c.text for c in found])
        top = int(np.argmax(read))
        if float(read[top]) < max(self.settings.bridge_min, best_score):
            return None
        return found[top]

    def _decide(self, question: str, sources: Sequence[Source]) -> list[Candidate] | None:
        """A choice, yes/no or what-they-share question answered by deciding
        between what it names (``forms``): the deciding sentence first, led by
        the option's name when it does not say it (or by "Yes"/"No", or by the
        words both things' definitions share), then, for yes/no and shared,
        the other thing's. None when the question has none of these forms or
        the sources do not name both."""
        choice = choice_of(question)
        polar = None if choice is not None else polar_of(question)
        shared = None if choice is not None or polar is not None else shared_of(question)
        if choice is None and polar is None and shared is None:
            return None
        found: list[Candidate] = []
        places: list[Place] = []
        for i, source in enumerate(sources):
            for k, text in enumerate(fragments(source.text, self.settings.min_fragment_words)):
                found.append(Candidate(text, i))
                places.append(Place(source.title, k))
        texts = [c.text for c in found]
        decision = choose(choice, texts, places) if choice is not None else None
        if polar is not None:
            decision = yes_or_no(polar, texts, places)
        if shared is not None:
            decision = in_common(shared, texts, places)
        if decision is None:
            return None
        first, *rest = _distinct(found[i] for i in decision.sentences)
        if decision.lead:
            lead = f"{decision.lead}: {first.text}"
        elif contains_answer(first.text, decision.picked):
            lead = first.text
        else:
            lead = f"{decision.picked}: {first.text}"
        return [Candidate(lead, first.source_index), *rest]

    # -- citations ---------------------------------------------------------------------

    async def judged(
        self,
        question: str,
        sentences: Sequence[str],
        sources: Sequence[str],
        vectors: TextVectors | None = None,
    ) -> npt.NDArray[np.float64]:
        """The support judge's probability that each source (columns) supports
        each sentence (rows) as an answer to ``question`` (``judge``).

        A source's cross-references ("refer to Note 1") are not read: they
        state nothing, yet repeat the words of what they point to."""
        return await asyncio.to_thread(
            self.judge.judge,
            question,
            sentences,
            [stated_text(s) for s in sources],
            self.vectors(vectors),
        )

    async def cite(
        self,
        question: str,
        sentences: Sequence[str],
        sources: Sequence[Source],
        max_citations: int,
        allowed: Sequence[int] | None = None,
        vectors: TextVectors | None = None,
    ) -> list[list[Proposal]]:
        """Proposals per sentence (0-based source indices into ``sources``),
        among the ``allowed`` sources (all by default).

        Every source is judged alike, the one a sentence was taken from too:
        being quoted from a source is not evidence that the source answers
        the question. The judge always sees every source, since how many of
        them agree with a sentence is part of the rating; ``allowed`` only
        limits which of them may be cited (a re-search cites what it found)."""
        support = await self.judged(question, sentences, [s.text for s in sources], vectors)
        candidates = list(range(len(sources))) if allowed is None else list(allowed)
        out: list[list[Proposal]] = []
        for i in range(len(sentences)):
            confidence = {j: to_confidence(float(support[i, j])) for j in candidates}
            ranked = sorted(candidates, key=lambda j: (-confidence[j], j))
            picked = [j for j in ranked if confidence[j] >= self.settings.min_confidence][
                :max_citations
            ]
            out.append([Proposal(sentence=i, source=j, confidence=confidence[j]) for j in picked])
        return out


def _names(text: str) -> list[str]:
    """The names ``text`` states (``key_terms`` without numbers), in text order."""
    found = {t for t in key_terms(text) if not any(ch.isdigit() for ch in t)}
    return [t for t in dict.fromkeys(tokens(text)) if t in found]


@lru_cache(maxsize=256)
def _stated_names(text: str) -> frozenset[str]:
    """``key_terms`` of a source's text, kept for the answers in flight (every
    ranking of an answer reads them; a few hundred texts at most are held)."""
    return frozenset(key_terms(text))


def linked_sources(
    question: str, sources: Sequence[Source], common: frozenset[str]
) -> npt.NDArray[np.bool_]:
    """Per source: whether it is linked to what the question names.

    A name is a capitalized word the sources never write in lower case, not
    a number, read in a source's title and text. A source is linked when it
    states the question's rarest name (the one the fewest sources state),
    or half of the question's names or more, or a name (other than the
    question's own, of three letters or more) that a source stating the
    rarest name states. "Three Men on a Horse is a play by a playwright born
    in which year?" over ten biographies of playwrights links the play's
    source and, through the George Abbott it names, his biography; "a
    Japanese playwright born in Tokyo" is linked to neither. For "Who is
    the CEO of Norvale Copper?" a source about Norvale Copper that does not
    say "CEO" is linked by the half. Every source is linked when the
    question names nothing any source states."""
    everything = np.ones(len(sources), dtype=bool)
    stated = [
        _stated_names(f"{s.title}\n{s.text}" if s.title else s.text) - common for s in sources
    ]
    asked = {t for t in key_terms(question) - common if not any(ch.isdigit() for ch in t)}
    counts = {t: sum(t in terms for terms in stated) for t in asked}
    present = [t for t, n in counts.items() if n]
    if not present:
        return everything
    rarest = min(present, key=lambda t: (counts[t], t))
    about_it = [rarest in terms for terms in stated]
    bridge = set().union(*(terms for terms, a in zip(stated, about_it, strict=True) if a))
    bridge = {t for t in bridge - asked if not any(ch.isdigit() for ch in t) and len(t) > 2}
    return np.array(
        [
            a or bool(terms & bridge) or 2 * len(terms & asked) >= len(asked)
            for terms, a in zip(stated, about_it, strict=True)
        ],
        dtype=bool,
    )


def off_topic(sources: Sequence[str], question: str) -> list[bool]:
    """Per source: whether it is about another year or another one of what the
    question names (``conflicts_with_question``, its dateline as its year)."""
    if not question:
        return [False] * len(sources)
    return [conflicts_with_question(s, question, dateline_year(s)) for s in sources]


class _Overlap:
    """IDF-weighted share of a sentence's novel content words found in each source."""

    def __init__(self, sources: Sequence[str], question: str) -> None:
        self.tokens = [content_tokens(s) for s in sources]
        self.question = content_tokens(question)
        df: dict[str, int] = {}
        for toks in self.tokens:
            for t in toks:
                df[t] = df.get(t, 0) + 1
        self.df = df
        self.n = len(sources)

    def idf(self, token: str) -> float:
        return math.log(1 + (self.n + 1) / (self.df.get(token, 0) + 1))

    def share(self, sentence: str, source: int) -> float:
        # The facts the sentence adds to the question; its other content words
        # only when it states no such fact.
        words = content_tokens(sentence)
        novel = (key_terms(sentence) & words) - self.question or words - self.question or words
        return self.share_of(novel, source)

    def share_of(self, novel: set[str], source: int) -> float:
        if not novel:
            return 0.0
        total = sum(self.idf(w) for w in novel)
        found = sum(self.idf(w) for w in novel if w in self.tokens[source])
        return found / total if total else 0.0
