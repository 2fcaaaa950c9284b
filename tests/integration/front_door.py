"""A real `attest serve all --embedded` with API keys and its HTTP gateway on,
over the bundled demo corpus: what the HTTP tests (API, OpenAI SDK, fuzz, page)
run against.

Keys: ``acme`` (tenant acme, ask + ingest: the sample is ingested under it),
``other`` (tenant other, ask + ingest) and ``asker`` (tenant acme, ask only).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from attest.core.auth import hash_key, new_api_key
from attest.demo.run import sample_documents
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from tests.integration.ingest_stack import answer_serving, free_port, wait_until

CLI = [sys.executable, "-m", "attest.cli"]
QUESTION = "How large a fine did Quaystone Telecom receive over its 2025 data breach?"
KEYS = {"acme": ("acme", ["ask", "ingest"]), "other": ("other", ["ask", "ingest"])}
KEYS["asker"] = ("acme", ["ask"])


@dataclass(frozen=True)
class FrontDoor:
    grpc_address: str
    http: str
    keys: dict[str, str]
    data_dir: Path
    log: Path

    def metadata(self, key: str) -> tuple[tuple[str, str]]:
        return (("authorization", f"Bearer {self.keys[key]}"),)

    def headers(self, key: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.keys[key]}"}


def _http_up(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def front_door(tmp_path: Path, *, ingest: bool = True) -> Iterator[FrontDoor]:
    keys = {name: new_api_key() for name in KEYS}
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(
        json.dumps(
            {
                "keys": [
                    {"id": name, "sha256": hash_key(keys[name]), "tenant": t, "scopes": s}
                    for name, (t, s) in KEYS.items()
                ]
            }
        ),
        encoding="utf-8",
    )
    port, http_port, internal_port = free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "ATTEST_ANSWER_SERVER__AUTH__KEYS_FILE": str(keys_file),
        "ATTEST_ANSWER_SERVER__INTERNAL_PORT": str(internal_port),
        "ATTEST_ANSWER_HTTP__ENABLED": "true",
    }
    env.pop("ATTEST_CLIENT_TOKEN", None)
    log_path = tmp_path / "serve.log"
    log = log_path.open("wb")
    data_dir = tmp_path / "data"
    server = subprocess.Popen(
        [
            *CLI,
            "serve",
            "all",
            "--embedded",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--http-port",
            str(http_port),
            "--data-dir",
            str(data_dir),
        ],
        env=env,
        stdout=log,
        stderr=log,
    )
    door = FrontDoor(
        grpc_address=f"127.0.0.1:{port}",
        http=f"http://127.0.0.1:{http_port}",
        keys=keys,
        data_dir=data_dir,
        log=log_path,
    )
    try:
        wait_until(
            lambda: answer_serving(door.grpc_address) or server.poll() is not None,
            600,
            "serve all",
        )
        assert server.poll() is None, log_path.read_text()[-3000:]
        wait_until(lambda: _http_up(door.http), 60, "the HTTP gateway")
        if ingest:
            with grpc.insecure_channel(door.grpc_address) as channel:
                stub = ingest_pb2_grpc.IngestServiceStub(channel)
                items = [ingest_pb2.IngestItem(document=d) for d in sample_documents()]
                job = stub.Ingest(
                    ingest_pb2.IngestRequest(items=items),
                    metadata=door.metadata("acme"),
                    timeout=60,
                ).job
                updates = list(
                    stub.WatchJob(
                        ingest_pb2.WatchJobRequest(job_id=job.job_id),
                        metadata=door.metadata("acme"),
                        timeout=600,
                    )
                )
            assert updates[-1].state == ingest_pb2.JOB_STATE_DONE, updates[-1]
        yield door
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
