"""`attest doctor` over the services: the Celery path on Redis and OpenSearch.

Documents are ingested through the ingest service, Celery workers, the
lexical service on a real OpenSearch node and the semantic service (embedded
Qdrant engine). Then the stores are made to drift on purpose, behind the
registry's back: one document is deleted from the lexical service, and one
document the registry never saw is indexed straight into the semantic
service. The doctor reads the stores through their ListDocuments RPCs, must
report exactly that, and `attest doctor --repair` (the command, over the
services' addresses) must delete the orphan and index the missing document
again from the source the registry keeps in Redis; the check after it finds
0 missing, 0 orphans and the same documents, passages and id checksum in
every store. The periodic check exports the same findings as gauges, and
counts a store that cannot be reached instead of failing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from attest.common.v1 import common_pb2
from attest.core.settings import ClientSettings
from attest.ingest import doctor
from attest.ingest.commands import doctor_command
from attest.ingest.listing import ServiceListing
from attest.ingest.state import JobStore, RedisKeyValue
from attest.ingest.v1 import ingest_pb2
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc
from tests.conftest import require_server
from tests.integration.ingest_stack import (
    REUTERS,
    Stack,
    free_port,
    reuters_lines,
    stream_items,
    wait_until,
)

pytestmark = pytest.mark.integration

DOCS = 8  # one pipeline batch
TENANT = "default"  # the stack runs without credentials


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    redis_url = require_server("ATTEST_TEST_REDIS_URL")
    opensearch = require_server("ATTEST_TEST_OPENSEARCH_URL")
    if not REUTERS.is_file():
        pytest.fail(f"{REUTERS} is missing (set ATTEST_SHARED_DIR)")
    s = Stack(tmp_path, redis_url, opensearch)
    s.configure()
    # The ingest service checks in the background too; it must keep serving.
    s.env["ATTEST_INGEST_DOCTOR_INTERVAL_SECONDS"] = "2"
    try:
        s.start()
        yield s
    finally:
        s.stop()


def _address(stack: Stack, name: str) -> str:
    return f"127.0.0.1:{stack.ports[name]}"


async def _check(store: JobStore, listing: ServiceListing) -> doctor.TenantFindings:
    (findings,) = await doctor.check(store, listing)
    return findings


async def _doctor(*args: str) -> tuple[int, str]:
    # The command runs its own event loop: off this one. Its JSON is on stdout;
    # stderr has the model's loading bar when a repair loads it.
    result = await asyncio.to_thread(CliRunner().invoke, doctor_command, list(args))
    return result.exit_code, result.stdout


def _drift(findings: doctor.TenantFindings) -> dict[str, tuple[list[str], list[str]]]:
    return {s.store: (s.missing, s.orphans) for s in findings.stores}


def _shape(findings: doctor.TenantFindings) -> dict[str, tuple[int, int, str]]:
    return {s.store: (s.documents, s.units, s.checksum) for s in findings.stores}


@pytest.mark.timeout(900)
async def test_doctor_finds_and_repairs_drift_between_the_services(stack: Stack):
    lines = reuters_lines(DOCS)
    job_id = stack.ingest.IngestStream(stream_items(lines, "reuters.jsonl"), timeout=120).job.job_id
    job = wait_until(
        lambda: (
            (
                j := stack.ingest.GetJob(ingest_pb2.GetJobRequest(job_id=job_id), timeout=30).job
            ).state
            == ingest_pb2.JOB_STATE_DONE
            and j
        ),
        600,
        "the job did not finish",
    )
    assert (job.progress.indexed, job.progress.failed) == (DOCS, 0)

    kv = RedisKeyValue(stack.state)
    store = JobStore(kv)
    listing = ServiceListing(
        _address(stack, "lexical"), _address(stack, "semantic"), ClientSettings(timeout_seconds=30)
    )
    try:
        registry = store.registry_all(TENANT)
        passages = sum(e.passages for e in registry.values())
        links = sum(len(e.entity_ids) for e in registry.values())
        assert len(registry) == DOCS
        # The registry keeps every source, so that a repair can index it again.
        assert len(store.sources(TENANT, sorted(registry))) == DOCS

        clean = await _check(store, listing)
        assert clean.consistent, clean.lines()
        assert (clean.documents, clean.passages, clean.kg_links) == (DOCS, passages, links)
        assert _shape(clean)["lexical"] == (DOCS, passages, clean.checksum)
        assert _shape(clean)["vectors"] == (DOCS, passages, clean.checksum)
        assert _shape(clean)["kg_links"][:2] == (DOCS, links)

        # Drift behind the registry's back.
        victim = sorted(registry)[0]
        lexical = lexical_pb2_grpc.LexicalServiceStub(stack._channel("lexical"))
        semantic = semantic_pb2_grpc.SemanticServiceStub(stack._channel("semantic"))
        gone = lexical.Delete(lexical_pb2.DeleteRequest(doc_ids=[victim]), timeout=30)
        assert gone.deleted == 1
        orphan = common_pb2.Document(
            id="stray-1",
            title="A document the registry never saw",
            body="Written straight into the vector store.",
            passages=[common_pb2.Passage(doc_id="stray-1", index=0, text="One passage.")],
        )
        semantic.Index(
            semantic_pb2.IndexRequest(documents=[semantic_pb2.IndexDocument(document=orphan)]),
            timeout=120,
        )

        drift = await _check(store, listing)
        print("\n".join(["before repair:", *drift.lines()]))  # `pytest -s` shows the findings
        assert _drift(drift) == {
            "lexical": ([victim], []),
            "vectors": ([], ["stray-1"]),
            "kg_links": ([], ["stray-1"]),
        }
        shape = _shape(drift)
        assert shape["lexical"][:2] == (DOCS - 1, passages - registry[victim].passages)
        assert shape["vectors"][:2] == (DOCS + 1, passages + 1)
        assert shape["lexical"][2] != drift.checksum != shape["vectors"][2]

        # The periodic check exports what it finds.
        periodic = doctor.PeriodicCheck(store, listing, 3600, owns_listing=False)
        assert await periodic.run_once() is not None
        gauges = {
            (name, s): metric.labels(TENANT, s)._value.get()
            for name, metric in (("missing", doctor.MISSING), ("orphans", doctor.ORPHANS))
            for s in ("lexical", "vectors", "kg_links")
        }
        assert gauges == {
            ("missing", "lexical"): 1,
            ("missing", "vectors"): 0,
            ("missing", "kg_links"): 0,
            ("orphans", "lexical"): 0,
            ("orphans", "vectors"): 1,
            ("orphans", "kg_links"): 1,
        }

        # `attest doctor --repair` over the services' addresses.
        args = [
            "--lexical-address", _address(stack, "lexical"),
            "--semantic-address", _address(stack, "semantic"),
            "--state-url", stack.state,
            "--json",
        ]  # fmt: skip
        code, output = await _doctor(*args)
        assert code == 1, output
        before = json.loads(output)["before"][0]["stores"]
        assert [(s["missing"], s["orphans"]) for s in before.values()] == [(1, 0), (0, 1), (0, 1)]
        code, output = await _doctor(*args, "--repair")
        assert code == 0, output
        report = json.loads(output)
        assert report["repairs"] == [
            {"tenant": TENANT, "reindexed": 1, "deleted": 1, "unrepairable": []}
        ]
        assert report["consistent"]

        after = await _check(store, listing)
        print("\n".join(["after repair:", *after.lines()]))
        assert after.consistent, after.lines()
        assert all(not s.missing and not s.orphans for s in after.stores)
        assert _shape(after) == _shape(clean)
        assert stack.settled_counts((DOCS, passages, DOCS, passages, links)) == (
            DOCS,
            passages,
            DOCS,
            passages,
            links,
        )
        assert await periodic.run_once() is not None
        assert doctor.ORPHANS.labels(TENANT, "vectors")._value.get() == 0
        assert doctor.MISSING.labels(TENANT, "lexical")._value.get() == 0
        assert doctor.DOCUMENTS.labels(TENANT, "lexical")._value.get() == DOCS

        # A store that cannot be reached is counted, not fatal.
        closed = f"127.0.0.1:{free_port()}"
        down = ServiceListing(
            closed, _address(stack, "semantic"), ClientSettings(timeout_seconds=2)
        )
        failures = doctor.CHECKS.labels("lexical")._value.get()
        try:
            assert await doctor.PeriodicCheck(store, down, 3600).run_once() is None
        finally:
            await down.close()
        assert doctor.CHECKS.labels("lexical")._value.get() == failures + 1
        assert doctor.DOCUMENTS.labels(TENANT, "lexical")._value.get() == DOCS  # kept

        # The ingest service ran its own checks all along and still serves.
        stack.wait_serving("ingest", 10)
        log = (stack.tmp / "ingest.log").read_text(errors="replace")
        assert "ingest registry and stores" in log
    finally:
        await listing.close()
        kv.close()
