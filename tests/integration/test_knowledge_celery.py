"""Personal-knowledge facts from Celery ingestion: the whole stack as processes (lexical
on OpenSearch, semantic, ingest in celery mode, the enrich+index and embed
workers) plus ``attest serve knowledge``; with ATTEST_INGEST_KNOWLEDGE_ADDRESS set,
the index task stores each document's facts and an ingest Delete removes them."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from attest.ingest.v1 import ingest_pb2
from attest.knowledge.v1 import knowledge_pb2 as pb
from attest.knowledge.v1 import knowledge_pb2_grpc
from tests.conftest import require_server
from tests.integration.ingest_stack import Stack, free_port, ingest_lines

pytestmark = pytest.mark.integration

CORPUS = Path(__file__).resolve().parents[2] / "services/attest/demo/sample_corpus.jsonl"
DOCS = ("esg-003", "esg-014", "esg-025")
QUESTION = "Who chairs Marrowgate Bank?"


@pytest.mark.timeout(1200)
def test_celery_index_task_stores_and_delete_removes_facts(tmp_path: Path) -> None:
    stack = Stack(
        tmp_path,
        require_server("ATTEST_TEST_REDIS_URL"),
        require_server("ATTEST_TEST_OPENSEARCH_URL"),
    )
    stack.configure()
    port = free_port()
    stack.ports["knowledge"] = port
    stack.env.update(
        {
            "ATTEST_INGEST_KNOWLEDGE_ADDRESS": f"127.0.0.1:{port}",
            "ATTEST_KNOWLEDGE_SERVER__HOST": "127.0.0.1",
            "ATTEST_KNOWLEDGE_SERVER__PORT": str(port),
        }
    )
    try:
        stack.spawn("knowledge", "serve", "knowledge")
        stack.start()
        stack.wait_serving("knowledge", 300)
        lines = [
            line for line in CORPUS.read_bytes().splitlines() if json.loads(line)["id"] in DOCS
        ]
        job, _ = ingest_lines(stack, lines, "demo.jsonl", timeout=600)
        assert job.state == ingest_pb2.JOB_STATE_DONE, job
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = knowledge_pb2_grpc.KnowledgeServiceStub(channel)
            facts = stub.GetDocumentFacts(
                pb.GetDocumentFactsRequest(source_doc_id="esg-003"), timeout=30
            )
            assert [d.entity.name for d in facts.descriptions] == ["Marrowgate Bank"]
            assert len(facts.aspect_facts) >= 5
            found = stub.Search(pb.SearchRequest(query=QUESTION, top_k=3), timeout=60)
            top = found.facts[0].triple
            assert (top.subject.name, top.source_doc_id in DOCS) == ("Rosalind Achebe-Fry", True)

            deleted = stack.ingest.Delete(ingest_pb2.DeleteRequest(doc_ids=list(DOCS)), timeout=60)
            assert deleted.deleted == len(DOCS)
            gone = stub.Search(pb.SearchRequest(query=QUESTION, top_k=3), timeout=60)
            assert list(gone.facts) == []
            for doc_id in DOCS:
                left = stub.GetDocumentFacts(
                    pb.GetDocumentFactsRequest(source_doc_id=doc_id), timeout=30
                )
                assert (len(left.descriptions), len(left.triples), len(left.aspect_facts)) == (
                    0,
                    0,
                    0,
                )
    finally:
        stack.stop()
