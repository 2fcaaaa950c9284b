"""Ingestion through the public gRPC API with real Redis, Celery workers and OpenSearch.

One stack (see ingest_stack.py) serves the module: the bad-input batch, then
2,000 Reuters articles, the same again, 50 of them changed, 10 deleted.
``ATTEST_TEST_REUTERS_DOCS`` lowers the 2,000 for a quick local run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from attest.ingest.v1 import ingest_pb2
from tests.conftest import require_server
from tests.integration.ingest_stack import REUTERS, Stack, ingest_lines, reuters_lines, watch

pytestmark = pytest.mark.integration

DOCS = int(os.environ.get("ATTEST_TEST_REUTERS_DOCS", "2000"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    redis_url = require_server("ATTEST_TEST_REDIS_URL")
    opensearch = require_server("ATTEST_TEST_OPENSEARCH_URL")
    if not REUTERS.is_file():
        pytest.fail(f"{REUTERS} is missing (set ATTEST_SHARED_DIR)")
    s = Stack(tmp_path_factory.mktemp("ingest"), redis_url, opensearch)
    s.configure()
    try:
        # Embedding is nearly all of this module's time, and one process embeds
        # on one core: two embed the batches of a job side by side.
        s.start(embed_processes=2)
        yield s
    finally:
        s.stop()


@pytest.mark.timeout(900)
def test_bad_input_is_reported_per_document_and_the_rest_is_ingested(stack: Stack):
    items = [
        ingest_pb2.IngestItem(raw_json=b'{"id": "ok-1", "body": "Acme Corp cut water use."}'),
        ingest_pb2.IngestItem(raw_json=b'{"id": "x", "body": "unterminated', origin="f:2"),
        ingest_pb2.IngestItem(raw_json=b'{"title": "no id", "body": "text"}', origin="f:3"),
        ingest_pb2.IngestItem(raw_json=b'{"id": "blank", "body": " \\n "}', origin="f:4"),
        ingest_pb2.IngestItem(
            raw_json=json.dumps({"id": "huge", "body": "a" * (50 * 1024 * 1024)}).encode(),
            origin="f:5",
        ),
        ingest_pb2.IngestItem(
            raw_json=b'{"id": "when", "body": "Text.", "published_at": "2024-13-45"}',
            origin="f:6",
        ),
        ingest_pb2.IngestItem(raw_json=b'{"id": "latin", "body": "Z\xfcrich"}', origin="f:7"),
        ingest_pb2.IngestItem(
            raw_json=b'{"id": "ok-2", "body": "Workers at Vanta Mining Corp struck."}',
            origin="f:8",
        ),
    ]
    stub = stack.ingest
    job = stub.Ingest(ingest_pb2.IngestRequest(items=items), timeout=120).job
    updates = watch(stub, job.job_id, timeout=300)
    final = stub.GetJob(ingest_pb2.GetJobRequest(job_id=job.job_id), timeout=30).job
    assert final.state == ingest_pb2.JOB_STATE_DONE
    assert (final.progress.received, final.progress.indexed, final.progress.failed) == (8, 2, 6)
    failures = {
        (f.item_index, f.origin, f.doc_id, ingest_pb2.FailureCode.Name(f.code))
        for f in final.failures
    }
    assert failures == {
        (1, "f:2", "", "FAILURE_CODE_INVALID_JSON"),
        (2, "f:3", "", "FAILURE_CODE_MISSING_ID"),
        (3, "f:4", "blank", "FAILURE_CODE_EMPTY_BODY"),
        (4, "f:5", "huge", "FAILURE_CODE_BODY_TOO_LARGE"),
        (5, "f:6", "when", "FAILURE_CODE_INVALID_DATE"),
        (6, "f:7", "", "FAILURE_CODE_INVALID_UTF8"),
    }
    assert all(f.reason and f.stage == ingest_pb2.STAGE_RECEIVE for f in final.failures)
    assert sum(len(u.new_failures) for u in updates) == 6
    assert updates[-1].state == ingest_pb2.JOB_STATE_DONE
    # Leave the stores empty for the next test.
    deleted = stub.Delete(ingest_pb2.DeleteRequest(doc_ids=["ok-1", "ok-2"]), timeout=60)
    assert (deleted.matched, deleted.deleted) == (2, 2)
    assert stack.settled_counts((0, 0, 0, 0, 0)) == (0, 0, 0, 0, 0)


@pytest.mark.timeout(3600)
def test_reuters_ingest_reingest_update_and_delete(stack: Stack, tmp_path: Path):
    lines = reuters_lines(DOCS)
    job, updates = ingest_lines(stack, lines, "reuters.jsonl")
    p = job.progress
    assert job.state == ingest_pb2.JOB_STATE_DONE, job
    assert (p.received, p.indexed, p.created, p.failed, p.unchanged) == (DOCS, DOCS, DOCS, 0, 0)
    # WatchJob streamed progress: several reports, counts never going back.
    finished = [u.progress.indexed for u in updates]
    assert len(updates) >= 3
    assert finished == sorted(finished)
    assert finished[-1] == DOCS
    assert updates[-1].state == ingest_pb2.JOB_STATE_DONE

    registry = stack.registry()
    assert len(registry) == DOCS
    passages = sum(e.passages for e in registry.values())
    links = sum(len(e.entity_ids) for e in registry.values())
    assert passages == p.passages_indexed >= DOCS
    counts = stack.settled_counts((DOCS, passages, DOCS, passages, links))
    assert counts == (DOCS, passages, DOCS, passages, links)
    ids = stack.stored_ids_checksum()
    assert ids[0] == DOCS + passages

    # The same articles again: nothing changes.
    again, _ = ingest_lines(stack, lines, "reuters.jsonl")
    assert (again.progress.unchanged, again.progress.indexed, again.progress.failed) == (DOCS, 0, 0)
    assert stack.settled_counts(counts) == counts
    assert stack.stored_ids_checksum() == ids
    assert stack.registry() == registry

    # 50 articles shrink to one sentence: exactly those are updated, old passages gone.
    changed_ids = []
    changed = []
    for line in lines[:50]:
        record = json.loads(line)
        record["body"] = "Zanzibarite shipments were unchanged this week."
        changed_ids.append(record["id"])
        changed.append(json.dumps(record).encode())
    update, _ = ingest_lines(stack, changed + lines[50:], "reuters-v2.jsonl")
    up = update.progress
    assert (up.updated, up.unchanged, up.created, up.failed) == (50, DOCS - 50, 0, 0)
    removed = sum(registry[d].passages for d in changed_ids)
    new_registry = stack.registry()
    new_passages = passages - removed + 50
    new_links = sum(len(e.entity_ids) for e in new_registry.values())
    expected = (DOCS, new_passages, DOCS, new_passages, new_links)
    assert stack.settled_counts(expected) == expected
    assert stack.stored_ids_checksum()[0] == DOCS + new_passages
    assert {d for d in new_registry if new_registry[d] != registry[d]} == set(changed_ids)

    # 10 deleted: gone from BM25, vectors and KG links.
    doomed = [json.loads(line)["id"] for line in lines[60:70]]
    response = stack.ingest.Delete(ingest_pb2.DeleteRequest(doc_ids=doomed), timeout=60)
    assert (response.matched, response.deleted) == (10, 10)
    final = stack.registry()
    assert len(final) == DOCS - 10
    assert not set(doomed) & set(final)
    kept_passages = sum(e.passages for e in final.values())
    expected = (
        DOCS - 10,
        kept_passages,
        DOCS - 10,
        kept_passages,
        sum(len(e.entity_ids) for e in final.values()),
    )
    assert stack.settled_counts(expected) == expected
