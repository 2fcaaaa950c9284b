"""A whole ingestion stack as separate processes, for the pipeline's integration tests.

Lexical service (OpenSearch), semantic service (embedded Qdrant engine),
ingest service in celery mode, and Celery workers (enrich+index, embed), all
on one Redis (broker, results and job state in databases of their own).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attest.ingest.state import JobStore, RedisKeyValue
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc

SHARED = Path(os.environ.get("ATTEST_SHARED_DIR", Path(__file__).resolve().parents[3] / "shared"))
REUTERS = SHARED / "data/news/reuters21578.jsonl"
CLI = [sys.executable, "-m", "attest.cli"]
CI = Path(__file__).resolve().parents[2] / ".ci"
OPTIONS = [
    ("grpc.max_send_message_length", 80 << 20),
    ("grpc.max_receive_message_length", 80 << 20),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def reuters_lines(n: int) -> list[bytes]:
    """The first ``n`` Reuters-21578 records that have a body."""
    out = []
    with REUTERS.open("rb") as f:
        for line in f:
            if json.loads(line).get("body", "").strip():
                out.append(line.rstrip(b"\n"))
                if len(out) == n:
                    break
    return out


def answer_serving(address: str) -> bool:
    """True when the answer service at ``address`` reports SERVING."""
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="attest.answer.v1.AnswerService"),
                timeout=2,
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def wait_until(check: Callable[[], Any], timeout: float, what: str, step: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(step)
    raise TimeoutError(f"{what} (last: {last!r})")


@dataclass
class Stack:
    tmp: Path
    redis_base: str
    opensearch: str
    env: dict[str, str] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    channels: list[grpc.Channel] = field(default_factory=list)
    index_name: str = ""
    stopped: bool = False

    # -- lifecycle -----------------------------------------------------------
    def configure(
        self, *, visibility_timeout: int = 60, max_deliveries: int = 5, threads: int | None = 1
    ) -> None:
        """Settings of every process; ``threads`` caps torch's threads per process
        (one by default: the tests share two cores with OpenSearch)."""
        self.index_name = f"test-ingest-{uuid.uuid4().hex[:10]}"
        for name in ("lexical", "semantic", "ingest"):
            self.ports[name] = free_port()
        base = self.redis_base.rstrip("/")
        self.broker, results, self.state = f"{base}/10", f"{base}/11", f"{base}/12"
        for url in (self.broker, results, self.state):
            redis.Redis.from_url(url).flushdb()
        lexical = f"127.0.0.1:{self.ports['lexical']}"
        semantic = f"127.0.0.1:{self.ports['semantic']}"
        self.env = {
            **os.environ,
            "ATTEST_DATA_DIR": str(self.tmp / "data"),
            "ATTEST_LEXICAL_BACKEND": "opensearch",
            "ATTEST_LEXICAL_OPENSEARCH__HOSTS": json.dumps([self.opensearch]),
            "ATTEST_LEXICAL_INDEX_NAME": self.index_name,
            "ATTEST_LEXICAL_SERVER__HOST": "127.0.0.1",
            "ATTEST_LEXICAL_SERVER__PORT": str(self.ports["lexical"]),
            "ATTEST_SEMANTIC_SERVER__HOST": "127.0.0.1",
            "ATTEST_SEMANTIC_SERVER__PORT": str(self.ports["semantic"]),
            "ATTEST_INGEST_SERVER__HOST": "127.0.0.1",
            "ATTEST_INGEST_SERVER__PORT": str(self.ports["ingest"]),
            "ATTEST_INGEST_MODE": "celery",
            "ATTEST_INGEST_STATE_URL": self.state,
            "ATTEST_INGEST_LEXICAL_ADDRESS": lexical,
            "ATTEST_INGEST_SEMANTIC_ADDRESS": semantic,
            "ATTEST_PIPELINE_BROKER_URL": self.broker,
            "ATTEST_PIPELINE_RESULT_BACKEND_URL": results,
            "ATTEST_PIPELINE_STATE_URL": self.state,
            "ATTEST_PIPELINE_LEXICAL_ADDRESS": lexical,
            "ATTEST_PIPELINE_SEMANTIC_ADDRESS": semantic,
            "ATTEST_PIPELINE_VISIBILITY_TIMEOUT_SECONDS": str(visibility_timeout),
            "ATTEST_PIPELINE_RETRY_BACKOFF_MAX_SECONDS": "5",
            "ATTEST_PIPELINE_MAX_DELIVERIES": str(max_deliveries),
            "ATTEST_PIPELINE_RECONCILE_INTERVAL_SECONDS": "4",
            "HF_HUB_OFFLINE": "1",
        }
        if threads is not None:
            self.env["OMP_NUM_THREADS"] = str(threads)

    def spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.tmp / f"{name}.log").open("ab")
        proc = subprocess.Popen([*CLI, *args], env=self.env, stdout=log, stderr=log)
        self.procs[name] = proc
        return proc

    def start_worker(self, name: str, queues: str, processes: int = 1) -> subprocess.Popen[bytes]:
        return self.spawn(name, "worker", "--queues", queues, "--concurrency", str(processes))

    def start(self, *, embed_processes: int = 1, split_text: bool = False) -> None:
        """``embed_processes``: pool processes of the embed worker, each embedding
        a batch on its own (one thread each; 0: no embed worker yet). ``split_text``:
        enrich and index on workers of their own ("worker-enrich", "worker-index")
        instead of one "worker-text" for both."""
        self.spawn("lexical", "serve", "lexical")
        self.spawn("semantic", "serve", "semantic")
        self.spawn("ingest", "serve", "ingest")
        if split_text:
            self.start_worker("worker-enrich", "enrich")
            self.start_worker("worker-index", "index")
        else:
            self.start_worker("worker-text", "enrich,index")
        if embed_processes:
            self.start_worker("worker-embed", "embed", embed_processes)
        for name in ("lexical", "semantic", "ingest"):
            self.wait_serving(name, 240)

    def wait_serving(self, name: str, timeout: float) -> None:
        channel = grpc.insecure_channel(f"127.0.0.1:{self.ports[name]}")
        stub = health_pb2_grpc.HealthStub(channel)

        def serving() -> bool:
            proc = self.procs[name]
            if proc.poll() is not None:
                log = (self.tmp / f"{name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log}")
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status
            except grpc.RpcError:
                return False
            return status == health_pb2.HealthCheckResponse.SERVING

        try:
            wait_until(serving, timeout, f"{name} is not serving")
        finally:
            channel.close()

    def stop(self) -> None:
        """Stop every process and drop the test's indexes (once; later calls do nothing)."""
        if self.stopped:
            return
        self.stopped = True
        for channel in self.channels:
            channel.close()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        from opensearchpy import ConnectionError as Unreachable
        from opensearchpy import OpenSearch

        client = OpenSearch(hosts=[self.opensearch])
        # A node the test stopped (and failed to bring back) takes its indexes along.
        try:
            with contextlib.suppress(Unreachable):
                client.indices.delete(index=f"{self.index_name}-*", ignore_unavailable=True)
        finally:
            client.close()

    # -- clients ---------------------------------------------------------------
    def _channel(self, name: str) -> grpc.Channel:
        channel = grpc.insecure_channel(f"127.0.0.1:{self.ports[name]}", options=OPTIONS)
        self.channels.append(channel)
        return channel

    @property
    def ingest(self) -> ingest_pb2_grpc.IngestServiceStub:
        return ingest_pb2_grpc.IngestServiceStub(self._channel("ingest"))

    def counts(self) -> tuple[int, int, int, int, int]:
        """(lexical documents, lexical passages, vector documents, vector passages, KG links)."""
        lexical = lexical_pb2_grpc.LexicalServiceStub(self._channel("lexical")).Stats(
            lexical_pb2.StatsRequest(), timeout=30
        )
        semantic = semantic_pb2_grpc.SemanticServiceStub(self._channel("semantic")).Stats(
            semantic_pb2.StatsRequest(), timeout=30
        )
        return (
            lexical.documents,
            lexical.passages,
            semantic.documents,
            semantic.passages,
            semantic.kg_links,
        )

    def settled_counts(self, expected: tuple[int, ...], timeout: float = 60) -> tuple[int, ...]:
        """The counts once they equal ``expected`` (OpenSearch shows writes after its
        next refresh, about a second); the last counts seen if they never do."""
        last: tuple[int, ...] = ()

        def check() -> bool:
            nonlocal last
            last = self.counts()
            return last == expected

        with contextlib.suppress(TimeoutError):
            wait_until(check, timeout, "counts")
        return last

    def registry(self) -> dict[str, Any]:
        store = JobStore(RedisKeyValue(self.state))
        try:
            return store.registry_all("default")
        finally:
            store.kv.close()  # type: ignore[attr-defined]

    def stored_ids_checksum(self) -> tuple[int, str]:
        """Number and SHA-256 of every record id in OpenSearch (documents and passages)."""
        from opensearchpy import OpenSearch, helpers

        client = OpenSearch(hosts=[self.opensearch])
        try:
            client.indices.refresh(index=f"{self.index_name}-*")
            ids = sorted(
                f"{hit['_index']}/{hit['_id']}"
                for hit in helpers.scan(
                    client,
                    index=f"{self.index_name}-*",
                    query={"query": {"match_all": {}}},
                    _source=False,
                )
            )
        finally:
            client.close()
        return len(ids), hashlib.sha256("\n".join(ids).encode()).hexdigest()

    def children(self, name: str) -> list[int]:
        pid = self.procs[name].pid
        path = Path(f"/proc/{pid}/task/{pid}/children")
        return [int(p) for p in path.read_text().split()] if path.exists() else []


@dataclass
class OpenSearchNode:
    """A single OpenSearch node of a test's own, through the CI scripts, whose data
    directory outlives a stop or a kill: it can go away and come back mid-test."""

    data: Path
    port: int = field(default_factory=free_port)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 300) -> float:
        """Start the node and wait until its indexes answer; the seconds it took."""
        began = time.monotonic()
        subprocess.run(
            ["bash", str(CI / "start-opensearch.sh"), str(self.port), str(self.data)],
            check=True,
            capture_output=True,
            timeout=timeout,
            env={**os.environ, "OPENSEARCH_START_TIMEOUT": str(int(timeout) - 10)},
        )
        return time.monotonic() - began

    def pid(self) -> int | None:
        path = self.data / "opensearch.pid"
        return int(path.read_text()) if path.exists() else None

    def stop(self) -> None:
        """SIGTERM, and wait until the process is gone (SIGKILL after 60 s)."""
        subprocess.run(
            ["bash", str(CI / "stop-opensearch.sh"), str(self.data)],
            check=True,
            capture_output=True,
            timeout=120,
            env={**os.environ, "OPENSEARCH_STOP_TIMEOUT": "60"},
        )

    def kill(self) -> None:
        """SIGKILL: no flush, no clean shutdown; only what the translog holds survives."""
        pid = self.pid()
        assert pid is not None, "the node is not running"
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 30, "still alive")
        # A JVM's main thread shows as a zombie while its other threads are still
        # exiting, and they hold the listening socket until the last one is gone:
        # the node is down when its port refuses connections.
        wait_until(lambda: not self.reachable(), 30, "the killed node's port still accepts")
        (self.data / "opensearch.pid").unlink()

    def reachable(self) -> bool:
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex(("127.0.0.1", self.port)) == 0


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except (FileNotFoundError, IndexError):
        return True


def stream_items(
    lines: list[bytes], name: str, per_message: int = 500
) -> Iterator[ingest_pb2.IngestStreamRequest]:
    for start in range(0, len(lines), per_message):
        yield ingest_pb2.IngestStreamRequest(
            items=[
                ingest_pb2.IngestItem(raw_json=line, origin=f"{name}:{start + k + 1}")
                for k, line in enumerate(lines[start : start + per_message])
            ]
        )


def watch(stub: ingest_pb2_grpc.IngestServiceStub, job_id: str, timeout: float) -> list[Any]:
    """Every WatchJob update until the job is final."""
    return list(stub.WatchJob(ingest_pb2.WatchJobRequest(job_id=job_id), timeout=timeout))


def ingest_lines(stack: Stack, lines: list[bytes], name: str, timeout: float = 900) -> Any:
    stub = stack.ingest
    response = stub.IngestStream(stream_items(lines, name), timeout=300)
    updates = watch(stub, response.job.job_id, timeout)
    job = stub.GetJob(
        ingest_pb2.GetJobRequest(job_id=response.job.job_id, failures_limit=10_000), timeout=30
    ).job
    return job, updates
