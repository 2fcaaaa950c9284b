"""Pooled QA evaluation through the public API: retrieval is part of the test.

Every passage of every question is ingested as a document of its own (id =
the passage id) into one corpus, through the ingest service of an embedded
stack (every service in this process, as ``attest serve all --embedded``
runs them). Each question is then asked through ``AnswerService.Ask`` with no
hint of which passages are its own, so the answer's citations and the
sources it was generated from are scored against that question's gold
passages, which now compete with the passages of every other question.
Questions are asked through ``AskStream``, so each revision is seen with the
citations the sentence had before it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from tqdm import tqdm

from attest.answer.v1 import answer_pb2
from attest.client import AnswerClient
from attest.common.v1 import common_pb2
from attest.core.channels import create_channel
from attest.evaluation.qa import Answered, QAItem, RevisionLog
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc

INGEST_BATCH = 500


def pooled_documents(items: list[QAItem]) -> list[common_pb2.Document]:
    """One document per distinct passage id; a repeated id must repeat its text."""
    docs: dict[str, common_pb2.Document] = {}
    for item in items:
        for p in item.passages:
            known = docs.get(p.id)
            if known is not None and known.body != p.text:
                raise ValueError(f"passage id {p.id!r} has two different texts")
            docs[p.id] = common_pb2.Document(id=p.id, title=p.title, body=p.text)
    return list(docs.values())


def retrieved_sets(
    items: list[QAItem], answers: list[Answered], corpus: list[QAItem] | None = None
) -> list[dict[str, object]]:
    """Each question as a QA set row (``load_qa``'s format) whose passages are
    the sources its pooled Ask was given, in their order, gold where they are
    the question's own gold passages: what the judge reads in a real Ask, for
    ``attest eval fit-judge``. ``corpus`` is every question whose passages
    were pooled (``items`` when None): with one half asked, the other half's
    passages are still among the sources. A source that is no passage of the
    corpus (none, in a pooled run) is left out, and so is a question whose
    Ask was given no source: there is nothing for a judge to read."""
    passages = {p.id: p for item in corpus or items for p in item.passages}
    rows: list[dict[str, object]] = []
    for item, answer in zip(items, answers, strict=True):
        gold = {p.id for p in item.passages if p.gold}
        row: dict[str, object] = {
            "id": item.id,
            "question": item.question,
            "answers": list(item.answers),
            "passages": [
                {
                    "id": doc_id,
                    "title": passages[doc_id].title,
                    "text": passages[doc_id].text,
                    "gold": doc_id in gold,
                }
                for doc_id in answer.retrieved or ()
                if doc_id in passages
            ],
        }
        if not row["passages"]:
            continue
        if item.answer_parts:
            row["answer_parts"] = [list(part) for part in item.answer_parts]
        if not item.answerable:
            row["answerable"] = False
        rows.append(row)
    return rows


def answered_from_proto(
    answer: answer_pb2.Answer,
    revisions: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (),
) -> Answered:
    retrieved = tuple(
        dict.fromkeys(s.source.doc_id for s in answer.sources if s.added_for_sentence < 0)
    )
    return Answered(
        text=answer.text,
        sentences=tuple(
            (tuple((c.doc_id, c.confidence) for c in s.citations), s.unsupported)
            for s in answer.sentences
        ),
        llm_calls=answer.llm_calls,
        insufficient=answer.insufficient_information,
        retrieved=retrieved,
        revisions=revisions,
        researches=answer.researches,
        sentence_texts=tuple(s.text for s in answer.sentences),
        seconds=answer.total.ToNanoseconds() / 1e9,
        judge_disagreements=answer.judge_disagreements,
    )


async def ask_streamed(
    client: AnswerClient, question: str, ask_options: answer_pb2.AskOptions
) -> Answered:
    """Ask through ``AskStream``, so that every revision is seen with the
    citations of the sentence before it."""
    log = RevisionLog()
    final: answer_pb2.Answer | None = None
    async for event in client.ask_stream(question, ask_options, timeout=300):
        kind = event.WhichOneof("event")
        if kind == "sentence":
            log.sentence(event.sentence.index, _cited(event.sentence))
        elif kind == "revision":
            revision = event.revision
            log.revision(revision.sentence_index, _cited(revision.sentence), revision.removed)
        elif kind == "final":
            final = event.final
    if final is None:
        raise RuntimeError(f"no final answer to {question!r}")
    return replace(
        answered_from_proto(final, tuple(log.revisions)), withdrawals=tuple(log.withdrawals)
    )


def _cited(sentence: common_pb2.AnswerSentence) -> tuple[str, ...]:
    return tuple(dict.fromkeys(c.doc_id for c in sentence.citations))


async def ingest_documents(
    address: str,
    docs: list[common_pb2.Document],
    *,
    progress: bool = True,
    batch_size: int = INGEST_BATCH,
) -> None:
    """Ingest ``docs`` through the ingest service at ``address``, ``batch_size``
    a job, each job watched to its end; any failed document raises."""
    channel = create_channel(address)
    try:
        ingest = ingest_pb2_grpc.IngestServiceStub(channel)
        bar = tqdm(total=len(docs), desc="ingesting", unit="doc", disable=not progress)
        failed: list[str] = []
        for start in range(0, len(docs), batch_size):
            batch = docs[start : start + batch_size]
            job = await ingest.Ingest(
                ingest_pb2.IngestRequest(items=[ingest_pb2.IngestItem(document=d) for d in batch]),
                timeout=120,
            )
            final: ingest_pb2.WatchJobResponse | None = None
            async for update in ingest.WatchJob(
                ingest_pb2.WatchJobRequest(job_id=job.job.job_id), timeout=3600
            ):
                final = update
                failed += [f"{f.doc_id or f.item_index}: {f.reason}" for f in update.new_failures]
            if final is None or final.state != ingest_pb2.JOB_STATE_DONE:
                raise RuntimeError(f"ingesting the pooled documents failed: {final}")
            bar.update(len(batch))
        bar.close()
        if failed:
            raise RuntimeError(f"{len(failed)} documents were not ingested: {failed[:5]}")
    finally:
        await channel.close()


async def run_pooled(
    items: list[QAItem],
    data_dir: Path,
    *,
    top_k: int,
    echo: Callable[[str], None],
    progress: bool = True,
    documents: list[common_pb2.Document] | None = None,
    asked: list[QAItem] | None = None,
) -> list[Answered]:
    """Ingest every question's passages into one corpus (or ``documents``,
    when given), then ask every question (or those of ``asked``) with
    ``top_k`` sources after reranking."""
    from attest.answer.embedded import embedded_stack
    from attest.client import options

    docs = documents if documents is not None else pooled_documents(items)
    async with embedded_stack(data_dir) as address:
        await ingest_documents(address, docs, progress=progress)
        what = "documents" if documents is not None else "passages"
        echo(f"ingested {len(docs)} {what} of {len(items)} questions into one corpus")
        answers = []
        questions = items if asked is None else asked
        async with AnswerClient(address) as client:
            for item in tqdm(questions, desc="answering", unit="q", disable=not progress):
                answers.append(
                    await ask_streamed(client, item.question, options(rerank_top_k=top_k))
                )
    return answers
