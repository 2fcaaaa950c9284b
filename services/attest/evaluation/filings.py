"""Questions over company filings, asked of the PDFs themselves.

The dataset is a folder with ``qa.jsonl`` and ``pdfs/``: each question names
its filing (``doc_name``, a PDF under ``pdfs/``), reference answers, the
evidence pages (numbered from 0, as the set gives them) and the kind of
reasoning it needs (``question_reasoning``: information extraction, numerical
reasoning, logical reasoning, or none given). This is the format of the
FinanceBench open sample.

The filings are read by ingest's own PDF reader and ingested into an embedded
stack: all of them into one store (``pooled``: the realistic setting, where a
figure from another company's or another year's filing competes with the
right one), or each into a store of its own (``per_document``). Every
question is then asked through ``AnswerService.Ask``.

An answer is judged as follows (``judge``):

- **abstained** when the answer says the sources do not hold it;
- **right** when it states the reference: a numeric reference ("24.26",
  "$11588.00", "1.9%") when one of its amounts agrees within 1 % (the
  matcher of ``eval qa``, scale words and percentages respected); a
  reference that starts with yes or no when the answer starts with the same
  word and states every figure the reference states; any other reference
  when the answer contains it, or states every figure it states when it
  states two or more. A year a reference names ("in FY 2021", "from 2021
  to 2022") is not among the figures an answer must state, nor counted
  among them; a number followed by a word ("2019 stores") is a figure;
  a question that offers its options ("Among operations, investing, and
  financing activities, which ...") is judged by the option alone: right
  when the first option the answer's first sentence names is the first one
  the reference names, and that sentence denies nothing ("not", "never");
  an option is its first word no other option has, compared by stem
  ("operating" is "operations");
- **wrong** otherwise, with the highest confidence among its citations.

For each answer the cited filings and pages are kept: whether the evidence
page was cited, and whether another filing was.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attest.answer.v1 import answer_pb2
from attest.common.v1 import common_pb2
from attest.evaluation.qa import (
    QADatasetError,
    amounts_agree,
    numeric_answer,
    read_amounts,
)
from attest.generate.stems import stem
from attest.generate.text import STOPWORDS, contains_answer, normalize_answer, tokens

KINDS = ("information extraction", "numerical reasoning", "logical reasoning", "unlabelled")
#: A wrong answer cited at this confidence or above is the failure the set counts.
CONFIDENT = 5


@dataclass(frozen=True, slots=True)
class FilingQuestion:
    id: str
    question: str
    answers: tuple[str, ...]
    doc_name: str
    evidence_pages: tuple[int, ...]  # numbered from 0
    kind: str  # one of KINDS
    answerable: bool  # its filing is under pdfs/


def _kind(label: object) -> str:
    """The first kind a ``question_reasoning`` label names ("Numerical reasoning
    OR information extraction" is numerical reasoning)."""
    if not isinstance(label, str) or not label.strip():
        return "unlabelled"
    text = label.lower()
    found = [(text.find(k), k) for k in KINDS[:3] if k in text]
    return min(found)[1] if found else "unlabelled"


def load_filings(folder: Path) -> list[FilingQuestion]:
    """The questions of ``folder/qa.jsonl``; a line that is not a question
    raises ``QADatasetError`` naming it."""
    path = folder / "qa.jsonl"
    if not path.is_file():
        raise QADatasetError(f"{folder} has no qa.jsonl")
    if not (folder / "pdfs").is_dir():
        raise QADatasetError(f"{folder} has no pdfs/ folder")
    out: list[FilingQuestion] = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                answers = record["answers"]
                evidence = record.get("evidence") or []
                if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
                    raise TypeError("answers must be a list of strings")
                if not isinstance(evidence, list) or not all(isinstance(e, dict) for e in evidence):
                    raise TypeError("evidence must be a list of objects")
                question = FilingQuestion(
                    id=str(record["id"]),
                    question=str(record["question"]),
                    answers=tuple(str(a) for a in answers),
                    doc_name=str(record["doc_name"]),
                    evidence_pages=tuple(
                        int(e["page"]) for e in evidence if e.get("doc_name") == record["doc_name"]
                    ),
                    kind=_kind(record.get("question_reasoning")),
                    answerable=(folder / "pdfs" / f"{record['doc_name']}.pdf").is_file(),
                )
            except (ValueError, KeyError, TypeError) as err:
                raise QADatasetError(f"{path}:{number}: not a filings question ({err})") from None
            if not question.answers:
                raise QADatasetError(f"{path}:{number}: no reference answer")
            out.append(question)
    return out


def filing_documents(
    folder: Path, names: set[str] | None = None, unreadable: dict[str, str] | None = None
) -> tuple[list[common_pb2.Document], dict[str, int]]:
    """The filings under ``folder/pdfs`` (those named, when given) as documents
    read by ingest's PDF reader, and each one's page count. A filing that
    cannot be read is left out, its reason kept in ``unreadable``."""
    from attest.ingest.readers import read_document_file

    root = folder / "pdfs"
    docs: list[common_pb2.Document] = []
    pages: dict[str, int] = {}
    for path in sorted(root.glob("*.pdf")):
        if names is not None and path.stem not in names:
            continue
        item = read_document_file(path, root)
        if item.error:
            if unreadable is not None:
                unreadable[path.stem] = item.error
            continue
        record = json.loads(item.raw_json)
        docs.append(
            common_pb2.Document(
                id=path.stem,
                title=record["title"],
                body=record["body"],
                metadata=record["metadata"],
            )
        )
        pages[path.stem] = item.pages
    return docs, pages


def _figures(text: str) -> list[Any]:
    return read_amounts(text)


# A year a reference names says when, not what: an answer need not repeat it
# ("FY2021" is read as no amount). A fiscal year ("FY 2021", "fiscal 2021") is
# always one; a bare year is one unless a word other than a connective follows
# it ("2019 stores" is a count) or a currency sign comes before it.
_YEAR_NAMED = re.compile(
    r"\b(?:FY|CY|fiscal(?:\s+year)?)\s*(?:19|20)\d\d\b"
    r"|(?<![$\d.,])\b(?:19|20)\d\d\b(?!\.\d|,\d)"
    r"(?!\s*(?:million|billion|thousand|%)"
    r"|\s+(?!(?:to|and|vs|versus|through|respectively|compared|with|from|than|in|while|was"
    r"|were|is|when|as|of|for)\b)(?-i:[a-z]))",
    re.IGNORECASE,
)


def _wanted(reference: str) -> list[Any]:
    """The figures an answer must state to state ``reference``: its amounts,
    not the years it names."""
    return _figures(_YEAR_NAMED.sub(" ", reference))


def _states_every_figure(reference: str, text: str) -> bool:
    wanted = _wanted(reference)
    stated = _figures(text)
    return bool(wanted) and all(any(amounts_agree(w, s) for s in stated) for w in wanted)


_SIGNED = re.compile(r"(?<![\w.])(?:[-−–]\s?\$?|\(\$?)(?=\d)")


def _same_sign(reference: str, text: str) -> bool:
    """A negative reference ("-3.7") needs a negative amount in the answer
    ("-3.7", "(3.7)"), and a positive one ends the answer with a positive
    result: the matcher of ``eval qa`` reads amounts without their sign."""
    negative = bool(_SIGNED.search(reference.strip()[:2]))
    stated: list[str] = re.findall(r"=\s*([-−(]?)\s*\$?\d", text)
    if stated:
        # A computed answer: the sign of its result (the last "= x").
        return bool(stated[-1] != "") == negative
    return not negative or bool(_SIGNED.search(text))


# "Among A, B(,) and C, which ...": the options a question offers.
_AMONG = re.compile(r"^\s*among\s+(?P<options>[^?]+?),\s*(?:which|what|who)\b", re.IGNORECASE)


def _options(question: str) -> list[str]:
    """The options a choice question lists, each as the stem of its first
    word that no other option has ("operations", "investing" and "financing
    activities" are "oper", "invest" and "financ"; "the Americas" is
    "america"); [] for any other question, or when two options cannot be
    told apart."""
    match = _AMONG.match(question)
    if match is None:
        return []
    parts = re.split(r",\s*(?:and\s+|or\s+)?|\s+(?:and|or)\s+", match.group("options"))
    words = [[stem(w) for w in tokens(part) if w not in STOPWORDS] for part in parts]
    words = [w for w in words if w]
    if len(words) < 2:
        return []
    heads = []
    for k, option in enumerate(words):
        others = {w for j, o in enumerate(words) if j != k for w in o}
        own = [w for w in option if w not in others]
        if not own:
            return []
        heads.append(own[0])
    return heads


def _named_first(options: Sequence[str], text: str) -> int | None:
    """The option ``text`` names first (by stem), or None."""
    for word in tokens(text):
        if stem(word) in options:
            return options.index(stem(word))
    return None


_DENIED = re.compile(r"\b(?:not|never|no)\b|n't\b", re.IGNORECASE)


def _first_sentence(text: str) -> str:
    return re.split(r"(?<=[a-z0-9)][.!?])\s+(?=[A-Z])", text.strip(), maxsplit=1)[0]


def answer_right(question: FilingQuestion, text: str) -> bool:
    """Whether ``text`` states one of the question's reference answers (rules
    in the module docstring)."""
    options = _options(question.question)
    if options:
        for reference in question.answers:
            wanted = _named_first(options, reference)
            if wanted is not None:
                opening = _first_sentence(text)
                return _named_first(options, opening) == wanted and not _DENIED.search(opening)
    for reference in question.answers:
        numeric = numeric_answer(reference)
        if numeric:
            stated = read_amounts(text)
            if all(any(amounts_agree(w, s) for s in stated) for w in numeric) and _same_sign(
                reference, text
            ):
                return True
            continue
        words = normalize_answer(reference).split()
        if words and words[0] in ("yes", "no"):
            first = normalize_answer(text).split()[:1]
            if first == words[:1] and (
                not _wanted(reference) or _states_every_figure(reference, text)
            ):
                return True
            continue
        if contains_answer(text, reference):
            return True
        if len(_wanted(reference)) >= 2 and _states_every_figure(reference, text):
            return True
    return False


@dataclass(frozen=True, slots=True)
class Cited:
    doc: str
    page: int  # 1-based; 0 when unknown
    confidence: int


def cited(answer: answer_pb2.Answer) -> list[Cited]:
    """Every citation of the answer's final sentences, with its filing and page."""
    out: list[Cited] = []
    for sentence in answer.sentences:
        for c in sentence.citations:
            if 0 <= c.source_index < len(answer.sources):
                source = answer.sources[c.source_index].source
                out.append(Cited(source.doc_id, source.page, c.confidence))
    return out


def judge(question: FilingQuestion, answer: answer_pb2.Answer) -> dict[str, Any]:
    """One question's record: the answer, its citations and the verdict."""
    citations = cited(answer)
    abstained = answer.insufficient_information or not citations
    right = not abstained and answer_right(question, answer.text)
    evidence = {p + 1 for p in question.evidence_pages}
    return {
        "id": question.id,
        "kind": question.kind,
        "question": question.question,
        "reference": question.answers[0],
        "filing": question.doc_name,
        "evidence_pages": sorted(evidence),
        "answer": answer.text,
        "verdict": "abstained" if abstained else "right" if right else "wrong",
        "numeric": bool(numeric_answer(question.answers[0])),
        "confidence": max((c.confidence for c in citations), default=0),
        "cited": [{"doc": c.doc, "page": c.page, "confidence": c.confidence} for c in citations],
        "evidence_page_cited": any(
            c.doc == question.doc_name and c.page in evidence for c in citations
        ),
        "other_filing_cited": any(c.doc != question.doc_name for c in citations),
    }


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per kind and in all: questions, right, abstained, wrong, wrong at
    confidence >= CONFIDENT (numeric references among them), the mean
    confidence of wrong answers, the evidence page cited among right answers,
    and answers citing another filing."""
    out: dict[str, dict[str, Any]] = {}
    groups: dict[str, list[dict[str, Any]]] = {"all": list(records)}
    for r in records:
        groups.setdefault(r["kind"], []).append(r)
    for name in ("all", *KINDS):
        rs = groups.get(name, [])
        if not rs:
            continue
        verdicts = Counter(r["verdict"] for r in rs)
        wrong = [r for r in rs if r["verdict"] == "wrong"]
        right = [r for r in rs if r["verdict"] == "right"]
        out[name] = {
            "questions": len(rs),
            "right": verdicts["right"],
            "right_share": verdicts["right"] / len(rs),
            "abstained": verdicts["abstained"],
            "wrong": verdicts["wrong"],
            "wrong_confident": sum(r["confidence"] >= CONFIDENT for r in wrong),
            "wrong_number_confident": sum(
                r["confidence"] >= CONFIDENT and r["numeric"] for r in wrong
            ),
            "wrong_mean_confidence": (
                sum(r["confidence"] for r in wrong) / len(wrong) if wrong else None
            ),
            "right_with_evidence_page": sum(r["evidence_page_cited"] for r in right),
            "other_filing_cited": sum(r["other_filing_cited"] for r in rs),
        }
    return out


def table(summary: dict[str, dict[str, Any]]) -> str:
    header = (
        f"{'kind':<24}{'asked':>6}{'right':>7}{'share':>7}{'abst.':>7}{'wrong':>7}"
        f"{'wrong>=5':>9}{'#>=5':>6}{'ev.page':>8}{'other':>7}"
    )
    lines = [header]
    for name, m in summary.items():
        lines.append(
            f"{name:<24}{m['questions']:>6}{m['right']:>7}{m['right_share']:>7.1%}"
            f"{m['abstained']:>7}{m['wrong']:>7}{m['wrong_confident']:>9}"
            f"{m['wrong_number_confident']:>6}{m['right_with_evidence_page']:>8}"
            f"{m['other_filing_cited']:>7}"
        )
    lines.append(
        "right: states the reference; wrong>=5: wrong answers cited at confidence 5 or more "
        "(#: of them with a numeric reference); ev.page: right answers citing the evidence "
        "page; other: answers citing another filing"
    )
    return "\n".join(lines)


async def ask_all(
    address: str,
    questions: Sequence[FilingQuestion],
    *,
    progress: bool = True,
    on_answer: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Ask every question of the answer service at ``address``; one judged
    record each."""
    from tqdm import tqdm

    from attest.client import AnswerClient

    records: list[dict[str, Any]] = []
    async with AnswerClient(address) as client:
        for question in tqdm(questions, desc="answering", unit="q", disable=not progress):
            answer = await client.ask(question.question, timeout=300)
            record = judge(question, answer)
            records.append(record)
            if on_answer is not None:
                on_answer(record)
    return records


async def run_filings(
    folder: Path,
    data_dir: Path,
    questions: Sequence[FilingQuestion],
    *,
    per_document: bool,
    echo: Callable[[str], None],
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Ingest the filings the questions name (into one store, or one store per
    filing under ``data_dir``) and ask every question of the store holding its
    filing."""
    from attest.answer.embedded import embedded_stack
    from attest.evaluation.pooled import ingest_documents

    names = sorted({q.doc_name for q in questions})
    groups = [[n] for n in names] if per_document else [names]
    records: list[dict[str, Any]] = []
    unreadable: dict[str, str] = {}
    for group in groups:
        docs, pages = filing_documents(folder, set(group), unreadable)
        if not docs:
            continue
        where = data_dir / (re.sub(r"[^\w.-]", "_", group[0]) if per_document else "pooled")
        async with embedded_stack(where) as address:
            await ingest_documents(address, docs, progress=progress, batch_size=4)
            echo(
                f"ingested {len(docs)} filings ({sum(pages.values()):,} pages) into "
                f"{'its own store' if per_document else 'one store'}"
            )
            asked = [q for q in questions if q.doc_name in group and q.doc_name not in unreadable]
            records += await ask_all(address, asked, progress=progress)
    for name, reason in unreadable.items():
        echo(f"warning: {name}.pdf cannot be read ({reason}); its questions are not asked")
    by_id = {r["id"]: r for r in records}
    return [by_id[q.id] for q in questions if q.id in by_id]
