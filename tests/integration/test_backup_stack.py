"""The OpenSearch + Redis stack's backup procedure of docs/backups.md, while it ingests.

The stack: `serve all` on OpenSearch (BM25), its semantic service's vectors in
the embedded engine under its data directory (no Qdrant server runs here),
ingestion on Celery with the registry and job state in Redis, and two
workers: one for the enrich and embed queues, one for the index queue (the
only stage that writes to the stores and the registry).

The demo corpus goes in as one job of twelve batches. After the first, the
procedure: the index worker is stopped (a warm shutdown: it finishes the batch
in hand, the queued ones wait in Redis) while enrich and embed go on; then the
OpenSearch indexes are snapshotted, Redis is saved (BGSAVE, its dump.rdb
copied) and the vectors' directory backed up with `attest backup`; the demo
questions are asked at that moment, and the index worker starts again. The
job finishes on the source.

Then a fresh stack: the indexes deleted and restored from the snapshot, a new
Redis started from the copied dump.rdb, the vectors restored into a new
directory. `attest doctor` over its services finds it consistent, and it gives
the answers of the moment of the backup (text, sentences, citations with their
confidences and quotes, sources). With a worker started on it, the job that
was running at the backup resumes from the restored queues and finishes, and
`attest doctor` finds every document of the corpus in every store: nothing
acknowledged was lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import grpc
import pytest
import redis

from attest.demo.run import sample_documents
from attest.ingest.backup import verify
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from attest.pipeline.metrics import PRIORITY_SUFFIXES
from attest.pipeline.queues import QUEUES
from tests.conftest import require_server
from tests.integration.ingest_stack import CI, answer_serving, free_port, wait_until
from tests.integration.test_backup import ask_all

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "attest.cli"]
BROKER, RESULTS, STATE = 0, 1, 2  # Redis databases no other test uses


@dataclass
class StackProcesses:
    """`serve all` and its workers on one Redis and one OpenSearch index pair."""

    tmp: Path
    name: str
    redis_url: str
    opensearch: str
    index_name: str
    data_dir: Path
    settings: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def db(self, n: int) -> str:
        return f"{self.redis_url.rstrip('/')}/{n}"

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            "ATTEST_DATA_DIR": str(self.data_dir),
            "ATTEST_LEXICAL_BACKEND": "opensearch",
            "ATTEST_LEXICAL_OPENSEARCH__HOSTS": json.dumps([self.opensearch]),
            "ATTEST_LEXICAL_INDEX_NAME": self.index_name,
            "ATTEST_SEMANTIC_STORE": "edge",
            "ATTEST_INGEST_MODE": "celery",
            # Twelve batches: the backup lands between two of them.
            "ATTEST_INGEST_BATCH_SIZE": "4",
            "ATTEST_INGEST_STATE_URL": self.db(STATE),
            "ATTEST_PIPELINE_BROKER_URL": self.db(BROKER),
            "ATTEST_PIPELINE_RESULT_BACKEND_URL": self.db(RESULTS),
            "ATTEST_PIPELINE_STATE_URL": self.db(STATE),
            "ATTEST_PIPELINE_LEXICAL_ADDRESS": self.address,
            "ATTEST_PIPELINE_SEMANTIC_ADDRESS": self.address,
            "ATTEST_PIPELINE_RETRY_BACKOFF_MAX_SECONDS": "2",
            "ATTEST_PIPELINE_RECONCILE_INTERVAL_SECONDS": "5",
            # Answers compared across stacks must not be degraded by a stage
            # that a busy machine made slow.
            "ATTEST_ANSWER_TIMEOUTS__RETRIEVE": "60",
            "ATTEST_ANSWER_TIMEOUTS__RERANK": "120",
            "ATTEST_ANSWER_TIMEOUTS__EXPLAIN": "60",
            **self.settings,
        }

    def spawn(self, name: str, *args: str) -> None:
        log = (self.tmp / f"{self.name}-{name}.log").open("ab")
        self.procs[name] = subprocess.Popen([*CLI, *args], env=self.env, stdout=log, stderr=log)

    def log(self, name: str) -> str:
        return (self.tmp / f"{self.name}-{name}.log").read_text(errors="replace")[-3000:]

    def serve(self) -> None:
        self.spawn("serve", "serve", "all", "--port", str(self.port))
        server = self.procs["serve"]
        wait_until(
            lambda: answer_serving(self.address) or server.poll() is not None, 600, "serve all"
        )
        assert server.poll() is None, self.log("serve")

    def worker(self, name: str, queues: str) -> None:
        self.spawn(name, "worker", "--queues", queues)

    def stop(self, name: str, timeout: float = 120) -> None:
        """SIGTERM: a Celery worker's warm shutdown finishes the task in hand."""
        proc = self.procs.pop(name)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(f"{name} did not stop in {timeout} s:\n{self.log(name)}") from None

    def stop_all(self) -> None:
        for name in list(self.procs):
            with contextlib.suppress(AssertionError):
                self.stop(name)


def progress(address: str, job_id: str) -> ingest_pb2.Job:
    with grpc.insecure_channel(address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        return stub.GetJob(ingest_pb2.GetJobRequest(job_id=job_id), timeout=30).job


def finished(address: str, job_id: str, timeout: float = 300) -> ingest_pb2.WatchJobResponse:
    with grpc.insecure_channel(address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        updates = stub.WatchJob(ingest_pb2.WatchJobRequest(job_id=job_id), timeout=timeout)
        return list(updates)[-1]


def cli(*args: str, env: dict[str, str], status: int = 0) -> str:
    done = subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == status, done.stdout + done.stderr
    return done.stdout


def doctor(stack: StackProcesses) -> dict[str, Any]:
    """`attest doctor --json` over the stack's services."""
    checked = cli(
        "doctor", "--lexical-address", stack.address, "--semantic-address", stack.address,
        "--state-url", stack.db(STATE), "--json",
        env=stack.env,
    )  # fmt: skip
    return cast(dict[str, Any], json.loads(checked.strip().splitlines()[-1]))


def bgsave(url: str, into: Path) -> None:
    """BGSAVE, wait for it, and copy the dump.rdb (docs/backups.md, Redis)."""
    client = redis.Redis.from_url(url)
    try:

        def idle() -> bool:
            return not client.info("persistence")["rdb_bgsave_in_progress"]

        wait_until(idle, 60, "an earlier BGSAVE", 0.1)
        before = client.lastsave()
        # BGSAVE forks before it replies: from here its save is in progress.
        client.bgsave()
        wait_until(idle, 60, "BGSAVE", 0.1)
        assert client.lastsave() >= before
        assert client.info("persistence")["rdb_last_bgsave_status"] == "ok"
        config = client.config_get("dir")
        dump = Path(config["dir"]) / client.config_get("dbfilename")["dbfilename"]
    finally:
        client.close()
    into.mkdir(parents=True)
    shutil.copy2(dump, into / "dump.rdb")


def pipeline_tasks(url: str) -> int:
    """Messages of the pipeline's queues (each priority's list) and those
    unacknowledged on workers (kombu's ``unacked`` hash) in the broker at ``url``."""
    client = redis.Redis.from_url(url)
    try:
        queued = sum(client.llen(q + s) for q in QUEUES for s in PRIORITY_SUFFIXES)
        return int(queued) + int(client.hlen("unacked"))
    finally:
        client.close()


@contextlib.contextmanager
def redis_from(data: Path) -> Iterator[str]:
    """A new redis-server that loads ``data/dump.rdb`` (.ci/start-redis.sh: no AOF)."""
    port = free_port()
    try:
        # (in the try: a start that fails or times out after the daemon forked
        # still leaves its pid file for the stop below)
        started = subprocess.run(
            ["bash", str(CI / "start-redis.sh"), str(port), str(data)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert started.returncode == 0, started.stdout + started.stderr
        yield f"redis://127.0.0.1:{port}"
    finally:
        subprocess.run(["bash", str(CI / "stop-redis.sh"), str(data)], check=False, timeout=60)


@pytest.mark.timeout(1200)
def test_a_stack_backed_up_while_ingesting_restores_the_answers_of_its_moment(
    tmp_path: Path,
) -> None:
    from opensearchpy import OpenSearch

    redis_url = require_server("ATTEST_TEST_REDIS_URL")
    opensearch = require_server("ATTEST_TEST_OPENSEARCH_URL")
    for n in (BROKER, RESULTS, STATE):
        redis.Redis.from_url(f"{redis_url.rstrip('/')}/{n}").flushdb()
    index_name = f"test-backup-{uuid.uuid4().hex[:10]}"
    indexes = f"{index_name}-*"
    repository, snapshot = f"attest-test-{uuid.uuid4().hex[:8]}", "s1"
    client = OpenSearch(hosts=[opensearch])
    source = StackProcesses(
        tmp_path, "source", redis_url, opensearch, index_name, tmp_path / "source"
    )
    docs = sample_documents()
    try:
        source.serve()
        source.worker("worker-text", "enrich,embed")
        source.worker("worker-index", "index")
        with grpc.insecure_channel(source.address) as channel:
            stub = ingest_pb2_grpc.IngestServiceStub(channel)
            items = [ingest_pb2.IngestItem(document=d) for d in docs]
            job_id = stub.Ingest(ingest_pb2.IngestRequest(items=items), timeout=60).job.job_id
        # One batch in: the other eleven are still to be indexed, whatever the
        # machine's speed, when the index worker stops (it finishes one at most).
        wait_until(
            lambda: progress(source.address, job_id).progress.indexed >= 4, 600, "a batch", 0.1
        )

        # The procedure: stop the index stage, back each store up, start it again.
        source.stop("worker-index")
        before = progress(source.address, job_id)
        assert before.state == ingest_pb2.JOB_STATE_RUNNING, before
        client.indices.refresh(index=indexes)
        client.snapshot.create_repository(
            repository=repository, body={"type": "fs", "settings": {"location": repository}}
        )
        taken = client.snapshot.create(
            repository=repository,
            snapshot=snapshot,
            body={"indices": indexes, "include_global_state": False},
            params={"wait_for_completion": "true"},
        )
        assert taken["snapshot"]["state"] == "SUCCESS", taken
        bgsave(redis_url, tmp_path / "redis-backup")
        made = cli(
            "backup", str(tmp_path / "vectors-backup"), "--data-dir", str(source.data_dir),
            env=source.env,
        )  # fmt: skip
        assert f"to {tmp_path / 'vectors-backup'}" in made, made
        at_backup = ask_all(source.address)
        after = progress(source.address, job_id)
        source.worker("worker-index", "index")

        # Nothing was indexed while the index stage was stopped, and the
        # snapshot, the dump and the copy hold what the registry listed then.
        assert after.progress.indexed == before.progress.indexed
        held = before.progress.indexed
        assert 4 <= held < len(docs)
        assert sorted(taken["snapshot"]["indices"]) == [
            f"{index_name}-documents",
            f"{index_name}-passages",
        ]
        copied = verify(tmp_path / "vectors-backup")["stores"]
        assert copied["vectors/attest-articles"]["points"] == held
        final = finished(source.address, job_id)
        assert final.state == ingest_pb2.JOB_STATE_DONE, final
        assert (final.progress.created, final.progress.failed) == (len(docs), 0)
        at_end = ask_all(source.address)
        # A partial corpus answers differently from the whole one: the
        # comparisons below tell the backup's moment from the end of the job.
        assert at_backup != at_end
        source.stop_all()

        # A fresh stack: the indexes deleted, a new Redis, a new data directory.
        client.indices.delete(index=indexes)
        restored_os = client.snapshot.restore(
            repository=repository,
            snapshot=snapshot,
            body={"indices": indexes, "include_global_state": False},
            params={"wait_for_completion": "true"},
        )
        assert restored_os["snapshot"]["shards"]["failed"] == 0, restored_os
        with redis_from(tmp_path / "redis-backup") as restored_redis:
            # The batches not yet indexed come back as the dump's tasks, not
            # only as the job's record: from that the ingest service's watchdog
            # would send them again, and the job would finish on a dump
            # without them. Counted before any service runs on this Redis.
            assert pipeline_tasks(f"{restored_redis}/{BROKER}") > 0
            # The dump holds the tasks the enrich/embed worker had in hand as
            # unacknowledged: Redis hands them out again after the visibility
            # timeout (an hour by default), shortened here.
            restored = StackProcesses(
                tmp_path,
                "restored",
                restored_redis,
                opensearch,
                index_name,
                tmp_path / "restored",
                settings={"ATTEST_PIPELINE_VISIBILITY_TIMEOUT_SECONDS": "10"},
            )
            put = cli(
                "restore", str(tmp_path / "vectors-backup"), "--data-dir", str(restored.data_dir),
                env=restored.env,
            )  # fmt: skip
            assert f"into {restored.data_dir}" in put, put
            try:
                restored.serve()
                assert progress(restored.address, job_id).progress.indexed == held
                report = doctor(restored)
                assert report["consistent"] is True, report
                (tenant,) = report["before"]
                assert tenant["documents"] == held, tenant
                for store in ("lexical", "vectors", "kg_links"):
                    assert tenant["stores"][store]["missing"] == 0, tenant
                    assert tenant["stores"][store]["orphans"] == 0, tenant
                assert ask_all(restored.address) == at_backup

                # The job acknowledged before the backup resumes from the
                # restored queues and finishes: every document in every store.
                # (Not the source's final answers word for word: a batch a
                # worker held at the save runs again, and a document written
                # twice leaves OpenSearch a deleted copy until a merge, which
                # counts in BM25's statistics.)
                restored.worker("worker", "enrich,embed,index")
                final = finished(restored.address, job_id)
                assert final.state == ingest_pb2.JOB_STATE_DONE, final
                assert (final.progress.created, final.progress.failed) == (len(docs), 0)
                report = doctor(restored)
                assert report["consistent"] is True, report
                (tenant,) = report["before"]
                assert tenant["documents"] == len(docs), tenant
            finally:
                restored.stop_all()
    finally:
        source.stop_all()
        try:
            client.indices.delete(index=indexes, ignore_unavailable=True)
            client.snapshot.delete(repository=repository, snapshot=snapshot, ignore=[404])
            client.snapshot.delete_repository(repository=repository, ignore=[404])
        finally:
            client.close()
