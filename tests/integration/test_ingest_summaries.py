"""Abstractive article summaries through the generate service's Summarize, with an
extractive fallback when it cannot be reached. The generate service is a
protocol-level fake served over gRPC on a free port."""

from __future__ import annotations

import asyncio
import json
from concurrent import futures

import grpc
import pytest
from pydantic import SecretStr

from attest.core.channels import use_identity
from attest.core.settings import ClientIdentity
from attest.generate.v1 import generate_pb2, generate_pb2_grpc
from attest.ingest.documents import article_from_raw_json, content_hash
from attest.ingest.jobs import StageRunner
from attest.ingest.settings import EnrichSettings
from attest.ingest.state import JobStore, MemoryKeyValue
from attest.ingest.summary import extractive_summary

pytestmark = pytest.mark.integration

BODY = (
    "Acme Corp cut water withdrawal by 12% at its Ridge plant. The weather was mild. "
    "Recycling of process water at Ridge will continue next year. Shares were flat."
)


class FakeGenerate(generate_pb2_grpc.GenerateServiceServicer):
    def __init__(self) -> None:
        self.requests: list[generate_pb2.SummarizeRequest] = []
        self.metadata: list[dict[str, str]] = []

    def Summarize(self, request, context):
        self.requests.append(request)
        self.metadata.append({k: v for k, v in context.invocation_metadata()})
        return generate_pb2.SummarizeResponse(
            summaries=[
                generate_pb2.SourceSummary(source_index=i, summary=f"LLM summary of {s.doc_id}.")
                for i, s in enumerate(request.sources)
            ],
            mode=generate_pb2.GENERATION_MODE_LLM,
        )


def _runner(address: str | None, timeout: float = 30) -> tuple[StageRunner, JobStore]:
    store = JobStore(MemoryKeyValue())
    store.create_job("j", "default")
    article = article_from_raw_json(
        json.dumps({"id": "a1", "title": "Water", "body": BODY}).encode()
    )
    store.record_items(
        "j",
        {
            0: json.dumps(
                {"article": article.to_json(), "hash": content_hash(article), "origin": ""}
            )
        },
        1,
    )
    settings = EnrichSettings(generate_address=address, generate_timeout_seconds=timeout)
    return StageRunner(store, settings), store


def test_summaries_come_from_the_generate_service():
    fake = FakeGenerate()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    generate_pb2_grpc.add_GenerateServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        runner, store = _runner(f"127.0.0.1:{port}")
        (record,) = runner.enrich("j", "default", [[0, "created"]])
    finally:
        server.stop(None)
    assert record["summary"] == "LLM summary of a1."
    (request,) = fake.requests
    assert request.query == ""  # query-independent
    assert [(s.doc_id, s.text) for s in request.sources] == [("a1", BODY)]
    assert store.progress("j").enriched == 1


def test_the_summaries_call_presents_the_process_identity():
    """Ingest calls generate like every other service call: through the
    process's channel factory, so a secured deployment's token goes with it
    (a bare channel would be refused by a generate service that authenticates),
    also when called on a thread that runs an event loop."""
    fake = FakeGenerate()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    generate_pb2_grpc.add_GenerateServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    use_identity(ClientIdentity(token=SecretStr("ingest-service-key")))
    try:
        runner, _ = _runner(f"127.0.0.1:{port}")
        (record,) = runner.enrich("j", "default", [[0, "created"]])

        async def on_a_loop() -> list:
            return runner.enrich("j", "default", [[0, "created"]])

        (again,) = asyncio.run(on_a_loop())
    finally:
        use_identity(ClientIdentity())
        server.stop(None)
    assert record["summary"] == again["summary"] == "LLM summary of a1."
    assert [m.get("authorization") for m in fake.metadata] == [
        "Bearer ingest-service-key",
        "Bearer ingest-service-key",
    ]


def test_an_unreachable_generate_service_leaves_the_extractive_summary():
    runner, _ = _runner("127.0.0.1:1", timeout=2)
    (record,) = runner.enrich("j", "default", [[0, "created"]])
    assert record["summary"] == extractive_summary(BODY, 3)
    assert record["summary"].startswith("Acme Corp cut water withdrawal")
