"""Ask the demo's labelled questions with and without the knowledge retriever.

Every service runs in this process on embedded backends with the knowledge
service (``embedded_stack(knowledge=True)``): the 48 demo articles are
ingested through the ingest service, which extracts their facts into the
personal knowledge base; then each of the 12 demo questions is asked twice,
with the server's default retrievers (BM25, dense, KG_ENHANCED and
KNOWLEDGE) and with BM25, dense and KG_ENHANCED only. Extractive generation
(no LLM). Per condition it reports:

* cited support: answerable questions with a citation of a supporting document;
* answer parts: answerable questions whose answer text holds every labelled part;
* abstained: unanswerable questions answered "insufficient information";
* sources: supporting documents among the sources given to the generator;
* seconds per answer (mean), the two conditions taking turns to go first;
* how many of the labelled supporting documents the knowledge retriever
  reaches on its own (a fact's passage found by its lexical lookup).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 uv run python loadtest/bench_knowledge_ask.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from attest.answer.embedded import embedded_stack
from attest.answer.pipeline import FACT_PASSAGE_LOOKUP_TOP_K, fact_passages
from attest.answer.settings import AnswerSettings
from attest.answer.v1 import answer_pb2
from attest.client import AnswerClient, options
from attest.common.v1 import common_pb2
from attest.core.channels import create_channel
from attest.demo.run import sample_documents, sample_questions
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from attest.knowledge.v1 import knowledge_pb2, knowledge_pb2_grpc
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc

WITHOUT = (
    common_pb2.RETRIEVER_BM25,
    common_pb2.RETRIEVER_DENSE,
    common_pb2.RETRIEVER_KG_ENHANCED,
)


async def ingest(address: str) -> None:
    channel = create_channel(address)
    try:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        items = [ingest_pb2.IngestItem(document=d) for d in sample_documents()]
        started = await stub.Ingest(ingest_pb2.IngestRequest(items=items), timeout=60)
        final = None
        async for update in stub.WatchJob(
            ingest_pb2.WatchJobRequest(job_id=started.job.job_id), timeout=1800
        ):
            final = update
        if final is None or final.state != ingest_pb2.JOB_STATE_DONE:
            raise RuntimeError(f"ingesting the demo failed: {final}")
    finally:
        await channel.close()


async def knowledge_recall(address: str) -> str:
    """Supporting documents (all questions) with a passage the knowledge retriever
    uses: a personal fact's passage that its lexical lookup finds, as in the pipeline."""
    channel = create_channel(address)
    found = total = 0
    try:
        knowledge = knowledge_pb2_grpc.KnowledgeServiceStub(channel)
        lexical = lexical_pb2_grpc.LexicalServiceStub(channel)
        for q in sample_questions():
            response = await knowledge.Search(
                knowledge_pb2.SearchRequest(
                    query=q["question"],
                    top_k=AnswerSettings().knowledge_top_k,
                    knowledge_bases=[knowledge_pb2.KNOWLEDGE_BASE_PERSONAL],
                ),
                timeout=60,
            )
            docs = set()
            for (doc_id, index), (statement, _) in fact_passages(response.facts).items():
                hits = await lexical.Search(
                    lexical_pb2.SearchRequest(
                        query=statement,
                        top_k=FACT_PASSAGE_LOOKUP_TOP_K,
                        level=lexical_pb2.SEARCH_LEVEL_PASSAGE,
                    ),
                    timeout=60,
                )
                if any(h.doc_id == doc_id and h.passage_index == index for h in hits.hits):
                    docs.add(doc_id)
            supporting = set(q["supporting_doc_ids"])
            found += len(docs & supporting)
            total += len(supporting)
    finally:
        await channel.close()
    return f"{found}/{total}"


def score(question: dict[str, Any], answer: answer_pb2.Answer, seconds: float) -> dict[str, Any]:
    supporting = set(question["supporting_doc_ids"])
    cited = {c.doc_id for s in answer.sentences for c in s.citations}
    text = answer.text.lower()
    return {
        "id": question["id"],
        "answerable": question["answerable"],
        "cited_support": bool(cited & supporting),
        "answer_parts": bool(question["answer_parts"])
        and all(any(alt.lower() in text for alt in part) for part in question["answer_parts"]),
        "abstained": answer.insufficient_information,
        "supporting_sources": len({s.source.doc_id for s in answer.sources} & supporting),
        "degradations": [d.reason for d in answer.degradations],
        "seconds": round(seconds, 2),
        "answer": answer.text[:200],
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    answerable = [r for r in rows if r["answerable"]]
    unanswerable = [r for r in rows if not r["answerable"]]
    return {
        "cited_support": f"{sum(r['cited_support'] for r in answerable)}/{len(answerable)}",
        "answer_parts": f"{sum(r['answer_parts'] for r in answerable)}/{len(answerable)}",
        "abstained": f"{sum(r['abstained'] for r in unanswerable)}/{len(unanswerable)}",
        "supporting_sources": sum(r["supporting_sources"] for r in answerable),
        "mean_seconds": round(sum(r["seconds"] for r in rows) / max(len(rows), 1), 2),
        "degraded_answers": sum(bool(r["degradations"]) for r in rows),
    }


async def main(data_dir: Path) -> dict[str, Any]:
    began = time.perf_counter()
    async with embedded_stack(data_dir, knowledge=True) as address:
        await ingest(address)
        ingested = time.perf_counter() - began
        results: dict[str, list[dict[str, Any]]] = {"with_knowledge": [], "without_knowledge": []}
        async with AnswerClient(address) as client:
            for n, q in enumerate(sample_questions()):
                conditions = [("with_knowledge", ()), ("without_knowledge", WITHOUT)]
                if n % 2:  # alternate which goes first: warm caches favour the second
                    conditions.reverse()
                for name, retrievers in conditions:
                    opts = options()
                    opts.retrieval.retrievers.extend(retrievers)
                    start = time.perf_counter()
                    answer = await client.ask(q["question"], opts, timeout=600)
                    results[name].append(score(q, answer, time.perf_counter() - start))
        recall = await knowledge_recall(address)
    report = {
        "questions": len(sample_questions()),
        "start_and_ingest_seconds": round(ingested, 1),
        "knowledge_retriever_supporting_documents": recall,
        **{name: summary(rows) for name, rows in results.items()},
        "per_question": results,
    }
    return report


def show(report: dict[str, Any], output: Path | None) -> None:
    print(json.dumps({k: v for k, v in report.items() if k != "per_question"}, indent=2))
    results = report["per_question"]
    for a, b in zip(results["with_knowledge"], results["without_knowledge"], strict=True):
        print(
            f"{a['id']}: with cited={a['cited_support']} parts={a['answer_parts']} "
            f"| without cited={b['cited_support']} parts={b['answer_parts']}"
        )
    if output is not None:
        output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, default=None, help="Default: a temporary one.")
    parser.add_argument("--output", type=Path, default=None, help="Write the full report here.")
    args = parser.parse_args()
    if args.data_dir is not None:
        show(asyncio.run(main(args.data_dir)), args.output)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            show(asyncio.run(main(Path(tmp))), args.output)
