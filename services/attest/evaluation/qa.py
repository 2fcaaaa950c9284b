"""Question answering with citations, measured on JSONL question sets.

One line per question::

    {"id": "0", "question": "...", "answers": ["Tampa, Florida", ...],
     "passages": [{"id": "0-p0", "title": "", "text": "...", "gold": true}, ...]}

Optional fields: ``"answer_parts": [["55%"], ["40%", "forty per cent"]]``,
where a right answer states every part (each a list of accepted spellings)
instead of any one of ``answers``; ``"answerable": false``, where the
passages do not answer the question and the right answer is to abstain
(``insufficient_information``). A question without a gold passage is
unanswerable too.

Each question is answered from its own passages only (no retrieval), through
the same ``Generator`` the generate service runs.

Metrics (micro-averaged unless said otherwise):

* answer recall, strict: of the answerable questions, the share whose answer
  text contains a gold answer (or every part), both normalized (lower case,
  no punctuation or articles) and matched on word boundaries;
* answer recall, numeric-tolerant: the same, where a numeric gold answer
  ("$1616.00", "3.2%", "16 million") also matches when every amount it
  states agrees with an amount in the answer within a relative tolerance
  (0.5 %) after scale normalization: "1,615.9 million" reads as 1.6159e9, a
  gold amount without a scale word takes the answer's ("$1616.00" agrees
  with "$1,615.9 million"), percentages only agree with percentages, a
  rounded gold amount (currency, decimals, scale or percent) only with a
  rounded amount of the answer (not the "6" of "6:00"), and a bare integer
  (a year, a count) must be equal;
* abstention rate: of the unanswerable questions, the share answered with
  ``insufficient_information``; beside it the same share of the answerable
  questions (abstentions that lose an answer);
* citation precision: of the distinct (question, passage) pairs the answer
  cites, the share whose passage is gold (over every question: a citation in
  an answer to an unanswerable question is never gold);
* citation recall: of the gold (question, passage) pairs, the share cited;
* sentences cited / unsupported: share of answer sentences with at least one
  citation / explicitly marked unsupported (their sum must be 100 %);
* confidence AUROC: over every sentence–citation pair, the probability that a
  citation of a gold passage has a higher confidence than a citation of a
  non-gold one, ties counted one half (Mann–Whitney); undefined when either
  kind is absent. Beside it the mean confidence of each kind;
* re-search rate: the share of answers with at least one revision by a
  search; the share of those revisions that raised (lowered) the precision of
  the revised sentence's citations (gold share of its distinct cited passages,
  0 when it cites none), the share that left the sentence citing nothing, and
  the precision of the revised sentences' citations before and after (pooled
  over them);
* withdrawals, counted apart from re-searches (a withdrawn sentence leaves
  the answer, it is not revised): the share of answers with a sentence
  withdrawn, how many sentences were, the share of them that had citations,
  and the precision of those citations (a withdrawal of gold citations loses
  a right answer; of non-gold ones, a wrong one);
* re-searches per answer (sentences re-searched, as the answer reports them)
  and LLM calls per answer: mean and maximum;
* retrieval recall@k (pooled only): gold passages among the first k sources
  the answer was generated from, for every k up to the number of sources
  kept.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import statistics
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from tqdm import tqdm

from attest.generate.models import (
    Citation,
    FinalEvent,
    Mode,
    RevisionEvent,
    SentenceEvent,
    Source,
)
from attest.generate.pipeline import AnswerOptions, Generator
from attest.generate.text import contains_answer, normalize_answer

# Relative tolerance of numeric-tolerant answer matching.
NUMERIC_TOLERANCE = 0.005
# Retrieval recall is reported at these k, up to the number of sources kept.
RECALL_KS = (1, 5, 10, 20)

Half = Literal["even", "odd"]
Metrics = dict[str, Any]


class QADatasetError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class QAPassage:
    id: str
    title: str
    text: str
    gold: bool


@dataclass(frozen=True, slots=True)
class QAItem:
    id: str
    question: str
    answers: tuple[str, ...]
    passages: tuple[QAPassage, ...]
    # When given, a right answer states every part (each: accepted spellings).
    answer_parts: tuple[tuple[str, ...], ...] = ()
    answerable: bool = True

    @property
    def has_answer(self) -> bool:
        """Marked answerable and with at least one gold passage."""
        return self.answerable and any(p.gold for p in self.passages)


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    from attest.evaluation.ir import text_lines

    return text_lines(path, QADatasetError)


def load_qa(path: Path) -> list[QAItem]:
    items = []
    for number, line in _lines(path):
        try:
            row = json.loads(line)
            passages = tuple(
                QAPassage(str(p["id"]), str(p.get("title", "")), str(p["text"]), bool(p["gold"]))
                for p in row["passages"]
            )
            item = QAItem(
                str(row["id"]),
                str(row["question"]),
                tuple(str(a) for a in row["answers"]),
                passages,
                tuple(tuple(str(a) for a in part) for part in row.get("answer_parts") or ()),
                bool(row.get("answerable", True)),
            )
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise QADatasetError(f"{path}:{number}: not a QA line ({exc})") from exc
        if not item.question.strip() or not item.passages:
            raise QADatasetError(f"{path}:{number}: needs a question and passages")
        if any(not part for part in item.answer_parts):
            raise QADatasetError(f"{path}:{number}: an empty answer part")
        items.append(item)
    if not items:
        raise QADatasetError(f"{path}: no questions")
    return items


# File names too common to tell two question sets apart ("hotpotqa_dev/qa.jsonl").
GENERIC_STEMS = frozenset(
    {"qa", "data", "dataset", "dev", "test", "train", "validation", "questions", "eval"}
)


def write_beir(items: Sequence[QAItem], root: Path) -> tuple[int, int]:
    """A question set's passages pooled into one retrieval set (a BEIR folder, for
    ``attest eval ir`` and ``tune-fusion``): every distinct passage a document,
    every question with a gold passage a query, its gold passages the relevant
    documents. Returns (documents, queries).

    Each question's passages were chosen for it (gold and distractors alike), so
    pooled they make a corpus in which most documents are about some other
    question: a retrieval set in the question set's domain and style."""
    documents: dict[str, QAPassage] = {}
    for item in items:
        for p in item.passages:
            seen = documents.setdefault(p.id, p)
            if seen.text != p.text:
                raise QADatasetError(f"passage id {p.id!r} names two different texts")
    judged = [item for item in items if item.answerable and any(p.gold for p in item.passages)]
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    with (root / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for p in documents.values():
            f.write(json.dumps({"_id": p.id, "title": p.title, "text": p.text}) + "\n")
    with (root / "queries.jsonl").open("w", encoding="utf-8") as f:
        for item in judged:
            f.write(json.dumps({"_id": item.id, "text": item.question}) + "\n")
    with (root / "qrels" / "test.tsv").open("w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for item in judged:
            for p in item.passages:
                if p.gold:
                    f.write(f"{item.id}\t{p.id}\t1\n")
    return len(documents), len(judged)


def dataset_name(path: Path) -> str:
    """What a question set is called in output: the file name without its
    extension, preceded by its folder's name when the file name is generic."""
    stem = path.stem
    folder = path.resolve().parent.name
    if stem.lower() in GENERIC_STEMS and folder:
        return f"{folder}-{stem}"
    return stem


def half_of(question_id: str) -> Half:
    """The half a question belongs to: the parity of an integer id (RGB's ids
    are 0-99), else of the first byte of the id's SHA-256 (stable everywhere)."""
    text = question_id.strip()
    if re.fullmatch(r"\d+", text, re.ASCII):
        number = int(text)
    else:
        number = hashlib.sha256(question_id.encode("utf-8")).digest()[0]
    return "even" if number % 2 == 0 else "odd"


def _answers(value: Any) -> list[str]:
    """RGB answers: a string, or lists of alternative spellings."""
    if isinstance(value, str):
        return [value]
    out: list[str] = []
    for part in value:
        out.extend(_answers(part))
    return out


def convert_rgb(path: Path, *, negatives_only: bool = False) -> Iterator[dict[str, Any]]:
    """RGB's en_fact.json → QA lines: positive passages are gold, negatives are
    distractors; the counterfactual ``positive_wrong`` passages are left out.

    ``negatives_only``: RGB's negative-rejection protocol, each question with
    only its negative passages, marked unanswerable (a question without
    negatives is left out)."""
    for number, line in _lines(path):
        try:
            row = json.loads(line)
            qid = str(row["id"])
            query, answer = row["query"], row["answer"]
            positives = [] if negatives_only else list(row.get("positive") or [])
            negatives = list(row.get("negative") or [])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise QADatasetError(f"{path}:{number}: not an RGB line ({exc!r})") from exc
        passages = [
            {"id": f"{qid}-p{i}", "title": "", "text": t, "gold": True}
            for i, t in enumerate(positives)
        ] + [
            {"id": f"{qid}-n{i}", "title": "", "text": t, "gold": False}
            for i, t in enumerate(negatives)
        ]
        if not passages:
            continue
        out: dict[str, Any] = {
            "id": qid,
            "question": query,
            "answers": _answers(answer),
            "passages": passages,
        }
        if negatives_only:
            out["answerable"] = False
        yield out


# --- answer matching ---------------------------------------------------------

_SCALE = {
    "thousand": 1e3,
    "k": 1e3,
    "million": 1e6,
    "mn": 1e6,
    "mln": 1e6,
    "m": 1e6,
    "billion": 1e9,
    "bn": 1e9,
    "b": 1e9,
    "trillion": 1e12,
    "tn": 1e12,
}
_AMOUNT = re.compile(
    r"(?P<currency>[$€£¥])?\s?(?<![\w.,:])"
    r"(?P<num>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(?![:\d])"
    r"(?:\s?(?P<unit>%|percent\b|per\s+cent\b|thousand\b|million\b|billion\b|trillion\b"
    r"|mn\b|mln\b|bn\b|tn\b|[kmb]\b))?",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Amount:
    """A number as written: its value, its scale word (None when none is
    written), whether it is a percentage, and whether it is a rounded
    quantity (currency, decimals, scale or percent) rather than a bare
    integer such as a year or a count."""

    value: float
    scale: float | None
    percent: bool
    approximate: bool


def read_amounts(text: str) -> list[Amount]:
    out = []
    for m in _AMOUNT.finditer(unicodedata.normalize("NFKC", text)):
        number = m.group("num").replace(",", "")
        unit = " ".join((m.group("unit") or "").lower().split())
        percent = unit in ("%", "percent", "per cent")
        scale = _SCALE[unit] if unit and not percent else None
        approximate = bool(m.group("currency")) or percent or scale is not None or "." in number
        out.append(Amount(float(number), scale, percent, approximate))
    return out


def amounts_agree(gold: Amount, got: Amount, tolerance: float = NUMERIC_TOLERANCE) -> bool:
    if gold.percent != got.percent:
        return False
    if not gold.approximate:
        return got.scale is None and got.value == gold.value
    if not got.approximate:
        return False
    scaled = gold.value * (gold.scale or 1.0), got.value * (got.scale or 1.0)
    if math.isclose(*scaled, rel_tol=tolerance):
        return True
    # A gold amount without a scale word takes the answer's ("$1616.00" for a
    # question asked in millions).
    return gold.scale is None and math.isclose(gold.value, got.value, rel_tol=tolerance)


def numeric_answer(answer: str) -> list[Amount]:
    """The amounts of a numeric gold answer ("$1616.00", "45 per share"): one
    that states an amount and at most two other words; else none."""
    amounts = read_amounts(answer)
    rest = _AMOUNT.sub(" ", unicodedata.normalize("NFKC", answer))
    if len(re.findall(r"[^\W\d_]+", rest)) > 2:
        return []
    return amounts


def numeric_match(text: str, answer: str, tolerance: float = NUMERIC_TOLERANCE) -> bool:
    """``contains_answer``, or a numeric ``answer`` whose every amount agrees
    with an amount stated in ``text``."""
    if contains_answer(text, answer):
        return True
    wanted = numeric_answer(answer)
    if not wanted:
        return False
    stated = read_amounts(text)
    return all(any(amounts_agree(w, s, tolerance) for s in stated) for w in wanted)


def _parts(item: QAItem) -> tuple[tuple[str, ...], ...]:
    return item.answer_parts or (item.answers,)


_POLAR = frozenset({"yes", "no"})


def answer_right(item: QAItem, text: str, *, tolerant: bool = False) -> bool:
    """Whether ``text`` states the item's answer: every part, else any answer.
    A yes/no answer must be the answer's first word ("No. 1" inside a "Yes"
    answer is not "no")."""
    gold = {normalize_answer(a) for a in item.answers}
    if gold and gold <= _POLAR:
        first = normalize_answer(text).split()[:1]
        return bool(first) and first[0] in gold
    match: Callable[[str], bool] = (
        (lambda a: numeric_match(text, a)) if tolerant else (lambda a: contains_answer(text, a))
    )
    return all(any(match(a) for a in part) for part in _parts(item))


def states_a_part(item: QAItem, text: str) -> bool:
    """Whether ``text`` states at least one part of the item's answer."""
    return any(numeric_match(text, a) for part in _parts(item) for a in part)


def auroc(positives: Sequence[float], negatives: Sequence[float]) -> float | None:
    """Probability that a positive scores above a negative, ties counted one
    half (the Mann–Whitney U statistic over positives × negatives, from
    average ranks); None when either class is empty."""
    if not positives or not negatives:
        return None
    scored = sorted([(float(s), True) for s in positives] + [(float(s), False) for s in negatives])
    rank_sum = 0.0
    start = 0
    while start < len(scored):
        end = start
        while end < len(scored) and scored[end][0] == scored[start][0]:
            end += 1
        # Ranks start + 1 … end share their mean.
        rank_sum += (start + 1 + end) / 2 * sum(1 for _, pos in scored[start:end] if pos)
        start = end
    n_pos, n_neg = len(positives), len(negatives)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


# --- answers -----------------------------------------------------------------


def _cited(citations: Sequence[Citation]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(c.doc_id for c in citations))


@dataclass(frozen=True, slots=True)
class Answered:
    """What scoring needs of one answer, from the generator or the public API."""

    text: str
    # Per sentence: its citations as (doc id, confidence), and whether it is
    # marked unsupported.
    sentences: tuple[tuple[tuple[tuple[str, int], ...], bool], ...]
    llm_calls: int
    insufficient: bool
    # Document ids retrieved for the question, best first (pooled mode only).
    retrieved: tuple[str, ...] | None = None
    # Per re-search revision: the document ids the sentence cited before and after it.
    revisions: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = ()
    # Per withdrawn sentence: the document ids it cited before it was withdrawn
    # (a withdrawal is not a re-search: the sentence leaves the answer).
    withdrawals: tuple[tuple[str, ...], ...] = ()
    # Sentences re-searched, as the answer reports them.
    researches: int = 0
    # The text of each sentence, in the order of ``sentences``.
    sentence_texts: tuple[str, ...] = ()
    # Wall-clock seconds of the answer, as the caller measured it.
    seconds: float = 0.0
    # Citations whose model and support-judge ratings disagreed (LLM mode).
    judge_disagreements: int = 0
    # Model cost, when the caller can see the model's counters (per-question
    # mode); None through the public API, which does not report tokens.
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    invalid_outputs: int | None = None

    @classmethod
    def from_final(cls, final: FinalEvent) -> Answered:
        return cls(
            text=final.answer,
            sentences=tuple(
                (tuple((c.doc_id, c.confidence) for c in s.citations), s.unsupported)
                for s in final.sentences
            ),
            llm_calls=final.llm_calls,
            insufficient=final.insufficient_information,
            researches=final.researches,
            sentence_texts=tuple(s.text for s in final.sentences),
            seconds=final.total_seconds,
            judge_disagreements=final.judge_disagreements,
        )


class RevisionLog:
    """The citations of each sentence as streamed, every re-search revision's
    citations before and after, and what each withdrawn sentence cited."""

    def __init__(self) -> None:
        self._current: dict[int, tuple[str, ...]] = {}
        self.revisions: list[tuple[tuple[str, ...], tuple[str, ...]]] = []
        self.withdrawals: list[tuple[str, ...]] = []

    def sentence(self, index: int, cited: tuple[str, ...]) -> None:
        self._current[index] = cited

    def revision(self, index: int, cited: tuple[str, ...], removed: bool = False) -> None:
        if removed:
            self.withdrawals.append(self._current.pop(index, ()))
            return
        self.revisions.append((self._current.get(index, ()), cited))
        self._current[index] = cited


async def answer_item(generator: Generator, item: QAItem, mode: Mode | None) -> Answered:
    sources = [Source(doc_id=p.id, text=p.text, title=p.title) for p in item.passages]
    final: FinalEvent | None = None
    log = RevisionLog()
    llm = getattr(generator, "llm", None)
    before = (llm.prompt_tokens, llm.completion_tokens, llm.invalid_outputs) if llm else None
    async for event in generator.answer(item.question, sources, AnswerOptions(mode=mode)):
        if isinstance(event, SentenceEvent):
            log.sentence(event.sentence.index, _cited(event.sentence.citations))
        elif isinstance(event, RevisionEvent):
            log.revision(event.sentence_index, _cited(event.sentence.citations), event.removed)
        elif isinstance(event, FinalEvent):
            final = event
    assert final is not None
    answered = replace(
        Answered.from_final(final),
        revisions=tuple(log.revisions),
        withdrawals=tuple(log.withdrawals),
    )
    if llm is not None and before is not None:
        # Answers run one at a time, so the client's counters move for this one only.
        answered = replace(
            answered,
            prompt_tokens=llm.prompt_tokens - before[0],
            completion_tokens=llm.completion_tokens - before[1],
            invalid_outputs=llm.invalid_outputs - before[2],
        )
    return answered


# --- scoring -----------------------------------------------------------------


def _precision(cited: Sequence[str], gold: set[str]) -> float:
    return sum(d in gold for d in cited) / len(cited) if cited else 0.0


def _quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile by the nearest rank; None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def score(
    items: Sequence[QAItem], answers: Sequence[Answered], *, sources_kept: int | None = None
) -> Metrics:
    """The metrics of the module docstring. ``sources_kept``: how many sources
    each pooled answer was generated from; retrieval recall is reported up to
    that k (every k of RECALL_KS when not given)."""
    answerable = unanswerable = 0
    strict_hits = tolerant_hits = 0
    abstained_answerable = abstained_unanswerable = 0
    cited_pairs = gold_cited = gold_total = 0
    multi_gold = all_gold_cited = 0
    sentences = with_citation = unsupported = 0
    right: list[int] = []
    wrong: list[int] = []
    calls: list[int] = []
    seconds: list[float] = []
    tokens_in: list[int] = []
    tokens_out: list[int] = []
    invalid = disagreements = 0
    researches: list[int] = []
    revised_answers = revisions = raised = lowered = uncited = 0
    before_gold = before_cited = after_gold = after_cited = 0
    withdrawn_answers = withdrawn = withdrawn_cited = withdrawn_gold = withdrawn_pairs = 0
    insufficient = 0
    retrieved_gold: dict[int, int] = {}
    ks = RECALL_KS if sources_kept is None else _recall_ks(sources_kept)
    for item, answer in zip(items, answers, strict=True):
        gold = {p.id for p in item.passages if p.gold}
        if item.has_answer:
            answerable += 1
            # An abstention is never right, whatever it says ("... no source states
            # ..." must not count as the answer "no").
            strict_hits += not answer.insufficient and answer_right(item, answer.text)
            tolerant_hits += not answer.insufficient and answer_right(
                item, answer.text, tolerant=True
            )
            abstained_answerable += answer.insufficient
        else:
            unanswerable += 1
            abstained_unanswerable += answer.insufficient
        cited: set[str] = set()
        for citations, is_unsupported in answer.sentences:
            sentences += 1
            with_citation += bool(citations)
            unsupported += is_unsupported
            for doc_id, confidence in citations:
                cited.add(doc_id)
                (right if doc_id in gold else wrong).append(confidence)
        cited_pairs += len(cited)
        gold_cited += len(cited & gold)
        if len(gold) >= 2:
            multi_gold += 1
            all_gold_cited += gold <= cited
        gold_total += len(gold)
        calls.append(answer.llm_calls)
        seconds.append(answer.seconds)
        disagreements += answer.judge_disagreements
        if answer.prompt_tokens is not None:
            tokens_in.append(answer.prompt_tokens)
            tokens_out.append(answer.completion_tokens or 0)
            invalid += answer.invalid_outputs or 0
        researches.append(answer.researches)
        insufficient += answer.insufficient
        revised_answers += bool(answer.revisions)
        for before, after in answer.revisions:
            revisions += 1
            raised += _precision(after, gold) > _precision(before, gold)
            lowered += _precision(after, gold) < _precision(before, gold)
            uncited += not after
            before_gold += sum(d in gold for d in before)
            before_cited += len(before)
            after_gold += sum(d in gold for d in after)
            after_cited += len(after)
        withdrawn_answers += bool(answer.withdrawals)
        for dropped in answer.withdrawals:
            withdrawn += 1
            withdrawn_cited += bool(dropped)
            withdrawn_gold += sum(d in gold for d in dropped)
            withdrawn_pairs += len(dropped)
        if answer.retrieved is not None:
            for k in ks:
                retrieved_gold[k] = retrieved_gold.get(k, 0) + len(set(answer.retrieved[:k]) & gold)
    n = len(items)
    out: Metrics = {
        "questions": n,
        "answerable": answerable,
        "unanswerable": unanswerable,
        "answer_recall": strict_hits / answerable if answerable else None,
        "answer_recall_numeric": tolerant_hits / answerable if answerable else None,
        "abstention_rate": _share(abstained_unanswerable, unanswerable),
        "abstention_rate_answerable": _share(abstained_answerable, answerable),
        "citation_precision": gold_cited / cited_pairs if cited_pairs else 0.0,
        "citation_recall": gold_cited / gold_total if gold_total else 0.0,
        # Multi-hop: of the questions with two or more gold passages, the share
        # whose answer cites every one of them.
        "all_gold_cited": _share(all_gold_cited, multi_gold),
        "sentences": sentences,
        "sentences_cited": with_citation / sentences if sentences else 0.0,
        "sentences_unsupported": unsupported / sentences if sentences else 0.0,
        "sentences_cited_or_unsupported": (with_citation + unsupported) / sentences
        if sentences
        else 1.0,
        "confidence_auroc": auroc(right, wrong),
        "mean_confidence_correct": statistics.fmean(right) if right else None,
        "mean_confidence_incorrect": statistics.fmean(wrong) if wrong else None,
        "citations_correct": len(right),
        "citations_incorrect": len(wrong),
        "research_rate": revised_answers / n if n else 0.0,
        "revisions": revisions,
        "revisions_raising_precision": _share(raised, revisions),
        "revisions_lowering_precision": _share(lowered, revisions),
        "revisions_leaving_uncited": _share(uncited, revisions),
        "revised_precision_before": _share(before_gold, before_cited),
        "revised_precision_after": _share(after_gold, after_cited),
        "withdrawal_rate": withdrawn_answers / n if n else 0.0,
        "withdrawn_sentences": withdrawn,
        "withdrawn_sentences_cited": _share(withdrawn_cited, withdrawn),
        "withdrawn_precision": _share(withdrawn_gold, withdrawn_pairs),
        "researches_per_answer": statistics.fmean(researches) if researches else 0.0,
        "researches_max": max(researches, default=0),
        "llm_calls_per_answer": statistics.fmean(calls) if calls else 0.0,
        "llm_calls_max": max(calls, default=0),
        # Replies that failed the JSON check (first replies and retries alike), per model call.
        "invalid_output_rate": invalid / sum(calls) if tokens_in and sum(calls) else None,
        "prompt_tokens_per_answer": statistics.fmean(tokens_in) if tokens_in else None,
        "completion_tokens_per_answer": statistics.fmean(tokens_out) if tokens_in else None,
        "judge_disagreements": disagreements,
        "seconds_per_answer": statistics.fmean(seconds) if seconds else None,
        "seconds_per_answer_p95": _quantile(seconds, 0.95),
        "insufficient_answers": insufficient,
    }
    if retrieved_gold:
        # Supporting-passage recall of retrieval: gold passages among the
        # first k sources the answer was generated from.
        if sources_kept is not None:
            out["sources_kept"] = sources_kept
        for k in ks:
            out[f"retrieval_recall_at_{k}"] = retrieved_gold[k] / gold_total if gold_total else 0.0
    return out


def _recall_ks(kept: int) -> tuple[int, ...]:
    """The k of RECALL_KS that ``kept`` sources can measure, and ``kept`` itself."""
    return tuple(sorted({k for k in RECALL_KS if k <= kept} | {kept}))


def score_halves(
    items: Sequence[QAItem], answers: Sequence[Answered], *, sources_kept: int | None = None
) -> dict[str, Metrics]:
    """``score`` of each half (``half_of``) that has questions."""
    out: dict[str, Metrics] = {}
    for half in ("even", "odd"):
        pairs = [(i, a) for i, a in zip(items, answers, strict=True) if half_of(i.id) == half]
        if pairs:
            out[half] = score(
                [i for i, _ in pairs], [a for _, a in pairs], sources_kept=sources_kept
            )
    return out


def per_question(items: Sequence[QAItem], answers: Sequence[Answered]) -> list[dict[str, Any]]:
    """One record per question, for reading the answers by hand."""
    out = []
    for item, answer in zip(items, answers, strict=True):
        gold = {p.id for p in item.passages if p.gold}
        cited = list(dict.fromkeys(d for cs, _ in answer.sentences for d, _ in cs))
        out.append(
            {
                "id": item.id,
                "half": half_of(item.id),
                "answerable": item.has_answer,
                "right": not answer.insufficient and answer_right(item, answer.text)
                if item.has_answer
                else None,
                "right_numeric": not answer.insufficient
                and answer_right(item, answer.text, tolerant=True)
                if item.has_answer
                else None,
                "abstained": answer.insufficient,
                "cited": cited,
                "cited_not_gold": [d for d in cited if d not in gold],
                # Sentences of an answer to an answerable question that state
                # no part of its answer (filler).
                "sentences_without_answer": [
                    i
                    for i, text in enumerate(answer.sentence_texts)
                    if not states_a_part(item, text)
                ]
                if item.has_answer
                else [],
                "confidences": [[c for _, c in cs] for cs, _ in answer.sentences],
                # Each sentence and its citations as [passage id, confidence].
                "sentences": [
                    {
                        "text": answer.sentence_texts[k] if k < len(answer.sentence_texts) else "",
                        "citations": [[d, c] for d, c in cs],
                    }
                    for k, (cs, _) in enumerate(answer.sentences)
                ],
                "revisions": len(answer.revisions),
                "withdrawn": len(answer.withdrawals),
                "researches": answer.researches,
                "answer": answer.text,
            }
        )
    return out


async def run_qa_eval(
    generator: Generator, items: list[QAItem], mode: Mode | None, progress: bool = True
) -> tuple[Metrics, list[Answered]]:
    answers = []
    for item in tqdm(items, desc="answering", unit="q", disable=not progress):
        answers.append(await answer_item(generator, item, mode))
    return score(items, answers), answers


# --- table -------------------------------------------------------------------


def _num(key: str, digits: int = 3) -> Callable[[Metrics], str]:
    def fmt(m: Metrics) -> str:
        value = m.get(key)
        return "undefined" if value is None else f"{value:.{digits}f}"

    return fmt


def _pct(key: str) -> Callable[[Metrics], str]:
    def fmt(m: Metrics) -> str:
        value = m.get(key)
        return "undefined" if value is None else f"{value:.1%}"

    return fmt


def _pair(first: str, second: str, digits: int = 3) -> Callable[[Metrics], str]:
    return lambda m: f"{_num(first, digits)(m)} / {_num(second, digits)(m)}"


def _count(key: str) -> Callable[[Metrics], str]:
    return lambda m: f"{int(m[key])}"


ROWS: list[tuple[str, Callable[[Metrics], str]]] = [
    (
        "questions (answerable / unanswerable)",
        lambda m: f"{int(m['questions'])} ({int(m['answerable'])} / {int(m['unanswerable'])})",
    ),
    ("answer recall, strict", _num("answer_recall")),
    ("answer recall, numeric-tolerant", _num("answer_recall_numeric")),
    ("abstention rate, unanswerable", _num("abstention_rate")),
    ("abstention rate, answerable", _num("abstention_rate_answerable")),
    ("citation precision", _num("citation_precision")),
    ("citation recall", _num("citation_recall")),
    ("every gold passage cited (2+ gold)", _num("all_gold_cited")),
    ("sentences cited", _pct("sentences_cited")),
    ("sentences unsupported", _pct("sentences_unsupported")),
    ("cited or unsupported", _pct("sentences_cited_or_unsupported")),
    ("confidence AUROC, correct vs incorrect", _num("confidence_auroc")),
    (
        "citations correct / incorrect",
        lambda m: f"{int(m['citations_correct'])} / {int(m['citations_incorrect'])}",
    ),
    (
        "mean confidence, correct / incorrect",
        _pair("mean_confidence_correct", "mean_confidence_incorrect", 2),
    ),
    ("re-search rate (answers revised by a search)", _num("research_rate")),
    ("revisions", _count("revisions")),
    (
        "revisions raising / lowering precision",
        _pair("revisions_raising_precision", "revisions_lowering_precision"),
    ),
    ("revisions leaving the sentence uncited", _num("revisions_leaving_uncited")),
    (
        "precision of revised sentences, before / after",
        _pair("revised_precision_before", "revised_precision_after"),
    ),
    ("withdrawal rate (answers with a sentence withdrawn)", _num("withdrawal_rate")),
    ("withdrawn sentences", _count("withdrawn_sentences")),
    ("withdrawn sentences that had citations", _num("withdrawn_sentences_cited")),
    ("precision of withdrawn sentences' citations", _num("withdrawn_precision")),
    (
        "re-searches per answer (mean / max)",
        lambda m: f"{m['researches_per_answer']:.2f} / {int(m['researches_max'])}",
    ),
    (
        "LLM calls per answer (mean / max)",
        lambda m: f"{m['llm_calls_per_answer']:.2f} / {int(m['llm_calls_max'])}",
    ),
    ("invalid model outputs per call", _num("invalid_output_rate")),
    (
        "tokens in / out per answer",
        _pair("prompt_tokens_per_answer", "completion_tokens_per_answer", 0),
    ),
    (
        "model and judge disagreeing (citations)",
        lambda m: f"{int(m.get('judge_disagreements', 0))}",
    ),
    ("seconds per answer (mean / p95)", _pair("seconds_per_answer", "seconds_per_answer_p95", 2)),
]


def table(result: Metrics, halves: dict[str, Metrics] | None = None) -> str:
    """The metrics as aligned rows; with ``halves``, a column per half."""
    columns = [("all", result), *((name, m) for name, m in (halves or {}).items())]
    rows = list(ROWS)
    ks = sorted(
        int(key.rsplit("_", 1)[1]) for key in result if key.startswith("retrieval_recall_at_")
    )
    rows += [(f"retrieval recall@{k}", _num(f"retrieval_recall_at_{k}")) for k in ks]
    cells = [[name, *(fmt(m) for _, m in columns)] for name, fmt in rows]
    if len(columns) > 1:
        cells.insert(0, ["", *(name for name, _ in columns)])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join(
        "  ".join(
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ).rstrip()
        for row in cells
    )
