"""Question answering with citations, measured on JSONL question sets.

One line per question::

    {"id": "0", "question": "...", "answers": ["Tampa, Florida", ...],
     "passages": [{"id": "0-p0", "title": "", "text": "...", "gold": true}, ...]}

Each question is answered from its own passages only (no retrieval, no
re-search), through the same ``Generator`` the generate service runs.

Metrics (micro-averaged unless said otherwise):

* answer recall: share of questions whose answer text contains at least one
  gold answer, both normalized (lower case, no punctuation or articles) and
  matched on word boundaries;
* citation precision: of the distinct (question, passage) pairs the answer
  cites, the share whose passage is gold;
* citation recall: of the gold (question, passage) pairs, the share cited;
* sentences cited / unsupported: share of answer sentences with at least one
  citation / explicitly marked unsupported (their sum must be 100 %);
* mean confidence of correct (gold passage) and incorrect citations, over
  every sentence-citation pair;
* LLM calls per answer: mean and maximum.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from attest.generate.models import FinalEvent, Mode, Source
from attest.generate.pipeline import AnswerOptions, Generator
from attest.generate.text import contains_answer


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


def load_qa(path: Path) -> list[QAItem]:
    items = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                passages = tuple(
                    QAPassage(
                        str(p["id"]), str(p.get("title", "")), str(p["text"]), bool(p["gold"])
                    )
                    for p in row["passages"]
                )
                item = QAItem(
                    str(row["id"]),
                    str(row["question"]),
                    tuple(str(a) for a in row["answers"]),
                    passages,
                )
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise QADatasetError(f"{path}:{number}: not a QA line ({exc})") from exc
            if not item.question.strip() or not item.passages:
                raise QADatasetError(f"{path}:{number}: needs a question and passages")
            items.append(item)
    if not items:
        raise QADatasetError(f"{path}: no questions")
    return items


def _answers(value: Any) -> list[str]:
    """RGB answers: a string, or lists of alternative spellings."""
    if isinstance(value, str):
        return [value]
    out: list[str] = []
    for part in value:
        out.extend(_answers(part))
    return out


def convert_rgb(path: Path) -> Iterator[dict[str, Any]]:
    """RGB's en_fact.json → QA lines: positive passages are gold, negatives are
    distractors; the counterfactual ``positive_wrong`` passages are left out."""
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            row = json.loads(line)
            qid = str(row["id"])
            passages = [
                {"id": f"{qid}-p{i}", "title": "", "text": t, "gold": True}
                for i, t in enumerate(row.get("positive", []))
            ] + [
                {"id": f"{qid}-n{i}", "title": "", "text": t, "gold": False}
                for i, t in enumerate(row.get("negative", []))
            ]
            yield {
                "id": qid,
                "question": row["query"],
                "answers": _answers(row["answer"]),
                "passages": passages,
            }


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
        )


async def answer_item(generator: Generator, item: QAItem, mode: Mode | None) -> FinalEvent:
    sources = [Source(doc_id=p.id, text=p.text, title=p.title) for p in item.passages]
    final: FinalEvent | None = None
    async for event in generator.answer(item.question, sources, AnswerOptions(mode=mode)):
        if isinstance(event, FinalEvent):
            final = event
    assert final is not None
    return final


def score(items: list[QAItem], answers: list[Answered]) -> dict[str, float]:
    recall_hits = 0
    cited_pairs = gold_cited = gold_total = 0
    sentences = with_citation = unsupported = 0
    right: list[int] = []
    wrong: list[int] = []
    calls: list[int] = []
    insufficient = 0
    retrieved_gold: dict[int, int] = {}
    ks = (1, 5, 10, 20)
    for item, answer in zip(items, answers, strict=True):
        gold = {p.id for p in item.passages if p.gold}
        recall_hits += any(contains_answer(answer.text, a) for a in item.answers)
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
        gold_total += len(gold)
        calls.append(answer.llm_calls)
        insufficient += answer.insufficient
        if answer.retrieved is not None:
            for k in ks:
                retrieved_gold[k] = retrieved_gold.get(k, 0) + len(set(answer.retrieved[:k]) & gold)
    n = len(items)
    out = {
        "questions": n,
        "answer_recall": recall_hits / n,
        "citation_precision": gold_cited / cited_pairs if cited_pairs else 0.0,
        "citation_recall": gold_cited / gold_total if gold_total else 0.0,
        "sentences": sentences,
        "sentences_cited": with_citation / sentences if sentences else 0.0,
        "sentences_unsupported": unsupported / sentences if sentences else 0.0,
        "sentences_cited_or_unsupported": (with_citation + unsupported) / sentences
        if sentences
        else 1.0,
        "mean_confidence_correct": statistics.fmean(right) if right else 0.0,
        "mean_confidence_incorrect": statistics.fmean(wrong) if wrong else 0.0,
        "citations_correct": len(right),
        "citations_incorrect": len(wrong),
        "llm_calls_per_answer": statistics.fmean(calls),
        "llm_calls_max": max(calls),
        "insufficient_answers": insufficient,
    }
    if retrieved_gold:
        # Supporting-passage recall of retrieval: gold passages among the
        # first k sources the answer was generated from.
        for k in ks:
            out[f"retrieval_recall_at_{k}"] = retrieved_gold[k] / gold_total if gold_total else 0.0
    return out


async def run_qa_eval(
    generator: Generator, items: list[QAItem], mode: Mode | None, progress: bool = True
) -> tuple[dict[str, float], list[FinalEvent]]:
    finals = []
    for item in tqdm(items, desc="answering", unit="q", disable=not progress):
        finals.append(await answer_item(generator, item, mode))
    return score(items, [Answered.from_final(f) for f in finals]), finals


def table(result: dict[str, float]) -> str:
    rows = [
        ("questions", f"{int(result['questions'])}"),
        ("answer recall", f"{result['answer_recall']:.3f}"),
        ("citation precision", f"{result['citation_precision']:.3f}"),
        ("citation recall", f"{result['citation_recall']:.3f}"),
        ("sentences cited", f"{result['sentences_cited']:.1%}"),
        ("sentences unsupported", f"{result['sentences_unsupported']:.1%}"),
        ("cited or unsupported", f"{result['sentences_cited_or_unsupported']:.1%}"),
        ("mean confidence, correct citations", f"{result['mean_confidence_correct']:.2f}"),
        ("mean confidence, incorrect citations", f"{result['mean_confidence_incorrect']:.2f}"),
        (
            "LLM calls per answer (mean / max)",
            f"{result['llm_calls_per_answer']:.2f} / {int(result['llm_calls_max'])}",
        ),
    ]
    rows += [
        (f"retrieval recall@{k}", f"{result[f'retrieval_recall_at_{k}']:.3f}")
        for k in (1, 5, 10, 20)
        if f"retrieval_recall_at_{k}" in result
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
