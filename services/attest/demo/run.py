"""``attest demo``: ingest the bundled sample news and answer its questions with citations.

Every service runs in this process on embedded backends (tantivy and the
Qdrant engine under the data directory), wired to each other through one
local gRPC server exactly as ``attest serve all --embedded`` wires them: the
sample goes in through the ingest service, every question through the answer
service's full pipeline (BM25 ∥ dense ∥ KG → fusion → rerank → generation
with a 0-10 confidence per citation: extractive, or with ``--llm local`` by a
local llama.cpp server, each sentence printed as the model writes it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from attest.common.v1 import common_pb2
from attest.core.channels import create_channel
from attest.generate.v1 import generate_pb2
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc


def read_jsonl(name: str) -> list[dict[str, Any]]:
    text = resources.files("attest.demo").joinpath(name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def sample_documents() -> list[common_pb2.Document]:
    docs = []
    for raw in read_jsonl("sample_corpus.jsonl"):
        published = Timestamp()
        published.FromDatetime(datetime.fromisoformat(raw["published_at"]).replace(tzinfo=UTC))
        docs.append(
            common_pb2.Document(
                id=raw["id"],
                title=raw["title"],
                body=raw["body"],
                published_at=published,
                source_url=raw["source_url"],
                organizations=raw["organizations"],
            )
        )
    return docs


def sample_questions() -> list[dict[str, Any]]:
    return read_jsonl("questions.jsonl")


async def run_demo(
    data_dir: Path, *, top_k: int, echo: Callable[[str], None], llm: bool = False
) -> None:
    """Ingest the sample through the ingest service, then ask every sample question;
    with ``llm``, in LLM mode, printing each sentence as the model writes it."""
    from attest.answer.commands import ask_with_revisions, render_answer, render_revisions
    from attest.answer.embedded import embedded_stack
    from attest.client import AnswerClient, options

    echo("Starting every service in this process (models and the ESG knowledge graph load) …")
    began = time.perf_counter()
    async with embedded_stack(data_dir) as address:
        channel = create_channel(address)
        try:
            ingest = ingest_pb2_grpc.IngestServiceStub(channel)
            docs = sample_documents()
            started = await ingest.Ingest(
                ingest_pb2.IngestRequest(items=[ingest_pb2.IngestItem(document=d) for d in docs]),
                timeout=60,
            )
            job_id = started.job.job_id
            final: ingest_pb2.WatchJobResponse | None = None
            async for update in ingest.WatchJob(
                ingest_pb2.WatchJobRequest(job_id=job_id), timeout=1800
            ):
                final = update
            if final is None or final.state != ingest_pb2.JOB_STATE_DONE:
                raise RuntimeError(f"ingesting the sample failed: {final}")
            p = final.progress
            echo(
                f"Ingested {p.received} sample ESG news articles under {data_dir} "
                f"({p.created} new, {p.updated} updated, {p.unchanged} unchanged, "
                f"{p.failed} failed; {p.passages_indexed} passages): BM25 (tantivy), vectors "
                "(Qdrant engine), knowledge-graph links."
            )
        finally:
            await channel.close()
        async with AnswerClient(address) as client:
            ask_options = options(rerank_top_k=top_k, explain=True)
            if llm:
                ask_options.generation_mode = generate_pb2.GENERATION_MODE_LLM
            for q in sample_questions():
                echo("")
                echo(f"Q: {q['question']}")
                answer, revisions = await ask_with_revisions(
                    client,
                    q["question"],
                    ask_options,
                    1800 if llm else 300,
                    on_draft=lambda d: echo(f"… writing [{d.index + 1}] {d.text}"),
                )
                for line in render_answer(answer):
                    echo(line)
                for line in render_revisions(revisions):
                    echo(line)
    echo("")
    echo(f"Done in {time.perf_counter() - began:.0f} s.")
