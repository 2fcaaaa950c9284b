"""`attest serve all --embedded`: every service in one process, used through the CLI.

Starts the real command, waits for SERVING, ingests the bundled sample through
a call whose deadline is shorter than the job, then again with `attest ingest
--address`, asks with `attest ask`, and shuts down on SIGTERM.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attest.demo.run import sample_documents
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from tests.integration.ingest_stack import free_port, wait_until

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "attest.cli"]
SAMPLE = Path(__file__).resolve().parents[2] / "services/attest/demo/sample_corpus.jsonl"


def serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            status = (
                health_pb2_grpc.HealthStub(channel)
                .Check(
                    health_pb2.HealthCheckRequest(service="attest.answer.v1.AnswerService"),
                    timeout=2,
                )
                .status
            )
        except grpc.RpcError:
            return False
    return bool(status == health_pb2.HealthCheckResponse.SERVING)


@pytest.mark.timeout(900)
def test_serve_all_embedded_answers_with_citations(tmp_path: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    log = (tmp_path / "serve.log").open("wb")
    server = subprocess.Popen(
        [*CLI, "serve", "all", "--embedded", "--port", str(port), "--data-dir", str(tmp_path)],
        env=env,
        stdout=log,
        stderr=log,
    )
    try:
        wait_until(lambda: serving(address) or server.poll() is not None, 600, "serve all")
        assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]

        # A job outlives the call that queued it: Ingest, with a 2 s deadline,
        # returns the job at once; its batches take longer and still finish.
        began = time.monotonic()
        with grpc.insecure_channel(address) as channel:
            stub = ingest_pb2_grpc.IngestServiceStub(channel)
            items = [ingest_pb2.IngestItem(document=d) for d in sample_documents()]
            job = stub.Ingest(ingest_pb2.IngestRequest(items=items), timeout=2).job
            updates = list(
                stub.WatchJob(ingest_pb2.WatchJobRequest(job_id=job.job_id), timeout=600)
            )
        took = time.monotonic() - began
        final = updates[-1]
        assert final.state == ingest_pb2.JOB_STATE_DONE, final
        assert (final.progress.created, final.progress.failed) == (48, 0)
        assert took > 2, f"the job took {took:.1f} s: too short to show it outlives the call"

        def ingest(path: Path, *where: str, status: int = 0) -> subprocess.CompletedProcess[str]:
            done = subprocess.run(
                [*CLI, "ingest", str(path), *(where or ("--address", address))],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            assert done.returncode == status, done.stdout + done.stderr
            return done

        # Its data directory is its own while it runs: an in-process ingest on
        # it stops at once, naming the server, instead of a tantivy traceback.
        beside = ingest(SAMPLE, "--data-dir", str(tmp_path), status=1)
        assert (
            f"Error: the data directory {tmp_path} is in use by process {server.pid}"
            in beside.stderr
        )
        assert "Traceback" not in beside.stderr

        # The same documents again, through the CLI: nothing changed.
        ingested = ingest(SAMPLE)
        assert "DONE" in ingested.stdout
        assert "unchanged 48" in ingested.stdout
        assert "failed 0" in ingested.stdout
        # Two records with one id: the service counts the earlier as superseded.
        twice = tmp_path / "twice.jsonl"
        twice.write_text(
            '{"id": "twice", "body": "First version."}\n'
            '{"id": "twice", "body": "Second version."}\n'
        )
        ingested = ingest(twice)
        assert "received 2  ingested 1  updated 0  unchanged 1" in ingested.stdout
        assert "of the unchanged, 1 were replaced by a later record" in ingested.stdout

        asked = subprocess.run(
            [
                *CLI,
                "ask",
                "How large a fine did Quaystone Telecom receive over its 2025 data breach?",
                "--address",
                address,
                "--top-k",
                "3",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        out = asked.stdout
        assert asked.returncode == 0, out + asked.stderr
        assert "$14.5 million" in out
        # A numbered citation with its 0-10 confidence, at or above the citation floor.
        marks = [int(c) for c in re.findall(r"\[1: (\d+)/10\]", out)]
        assert marks, out
        assert all(5 <= c <= 10 for c in marks)
        assert "[1] esg-045" in out  # the cited source, numbered
        assert "Knowledge graph path of [1]:" in out
        # The stage times, then any re-searches or withdrawals.
        assert any(line.startswith("Time: ") for line in out.splitlines())
        assert "Degraded" not in out
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=60)
        finally:
            if server.poll() is None:
                server.kill()
            log.close()
    assert code == 0, (tmp_path / "serve.log").read_text()[-3000:]
