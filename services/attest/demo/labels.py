"""The demo's labelled question set, for ``attest eval demo``.

``questions.jsonl`` (the questions ``attest demo`` asks) and
``unanswerable.jsonl`` (questions the sample could plausibly answer but does
not) carry, per question, the gold answer as a reader would write it
(``answer``), what a right answer must state (``answer_parts``: every part,
each a list of accepted spellings), the ids of the articles that state it
(``supporting_doc_ids``), whether the sample answers it (``answerable``) and,
for those it does not, what is missing (``missing``). The labels were made
by reading the 48 articles of ``sample_corpus.jsonl``.

Every question's passages are all 48 articles, gold where the article
supports the answer, so the evaluation's citation metrics read "cites an
article that states the answer".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attest.demo.run import read_jsonl
from attest.evaluation.qa import QAItem, QAPassage

LABEL_FILES = ("questions.jsonl", "unanswerable.jsonl")


def labelled_questions() -> list[dict[str, Any]]:
    return [row for name in LABEL_FILES for row in read_jsonl(name)]


def demo_items() -> list[QAItem]:
    """The labelled questions as QA items over the whole sample."""
    corpus = read_jsonl("sample_corpus.jsonl")
    known = {doc["id"] for doc in corpus}
    items = []
    for row in labelled_questions():
        supporting = set(row["supporting_doc_ids"])
        if not supporting <= known:
            raise ValueError(f"{row['id']}: unknown articles {sorted(supporting - known)}")
        if bool(row["answerable"]) != bool(supporting):
            raise ValueError(f"{row['id']}: answerable exactly when an article supports it")
        items.append(
            QAItem(
                id=row["id"],
                question=row["question"],
                answers=(row["answer"],),
                passages=tuple(
                    QAPassage(doc["id"], doc["title"], doc["body"], doc["id"] in supporting)
                    for doc in corpus
                ),
                answer_parts=tuple(tuple(part) for part in row["answer_parts"]),
                answerable=bool(row["answerable"]),
            )
        )
    return items


def write_beir(root: Path) -> tuple[int, int]:
    """The sample and its labelled questions as a BEIR folder (for ``attest eval ir``):
    every article a document, every question with a supporting article a query,
    those articles its relevant documents. Returns (documents, queries)."""
    corpus = read_jsonl("sample_corpus.jsonl")
    (root / "qrels").mkdir(parents=True, exist_ok=True)
    with (root / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for doc in corpus:
            row = {"_id": doc["id"], "title": doc["title"], "text": doc["body"]}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    judged = [row for row in labelled_questions() if row["supporting_doc_ids"]]
    with (root / "queries.jsonl").open("w", encoding="utf-8") as f:
        for row in judged:
            f.write(json.dumps({"_id": row["id"], "text": row["question"]}) + "\n")
    with (root / "qrels" / "test.tsv").open("w", encoding="utf-8") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for row in judged:
            for doc_id in row["supporting_doc_ids"]:
                f.write(f"{row['id']}\t{doc_id}\t1\n")
    return len(corpus), len(judged)
