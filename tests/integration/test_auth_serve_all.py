"""`attest serve all --embedded` with authentication: the real services behind the perimeter.

With a keys file configured the command serves answer, ingest and health on
the public port and the internal services on a second, loopback listener
under a service key of its own. The test ingests the sample with an
`ingest` key, asks with an `ask` key through `attest ask` (the answer
pipeline reaching lexical, semantic, rerank and generate under the service
identity), and checks that the store-level RPCs are out of a caller's reach.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from attest.core.auth import hash_key, new_api_key
from attest.demo.run import sample_documents
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
from tests.integration.ingest_stack import answer_serving, free_port, wait_until

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "attest.cli"]
QUESTION = "How large a fine did Quaystone Telecom receive over its 2025 data breach?"


def _code(call: Callable[[], object]) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as err:
        code: grpc.StatusCode = err.code()  # a grpc.Call as well
        return code
    return grpc.StatusCode.OK


@pytest.mark.timeout(900)
def test_serve_all_with_keys(tmp_path: Path) -> None:
    keys = {name: new_api_key() for name in ("ask", "ingest", "admin")}
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(
        json.dumps(
            {
                "keys": [
                    {
                        "id": "ask",
                        "sha256": hash_key(keys["ask"]),
                        "tenant": "acme",
                        "scopes": ["ask"],
                    },
                    {
                        "id": "ingest",
                        "sha256": hash_key(keys["ingest"]),
                        "tenant": "acme",
                        "scopes": ["ingest"],
                    },
                    {
                        "id": "admin",
                        "sha256": hash_key(keys["admin"]),
                        "tenant": "ops",
                        "scopes": ["admin"],
                    },
                ]
            }
        ),
        encoding="utf-8",
    )
    port, internal_port = free_port(), free_port()
    address, internal = f"127.0.0.1:{port}", f"127.0.0.1:{internal_port}"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "ATTEST_ANSWER_SERVER__AUTH__KEYS_FILE": str(keys_file),
        "ATTEST_ANSWER_SERVER__INTERNAL_PORT": str(internal_port),
    }
    env.pop("ATTEST_CLIENT_TOKEN", None)
    log = (tmp_path / "serve.log").open("wb")
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
            "--data-dir",
            str(tmp_path / "data"),
        ],
        env=env,
        stdout=log,
        stderr=log,
    )
    try:
        wait_until(lambda: answer_serving(address) or server.poll() is not None, 600, "serve all")
        assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]

        def md(name: str) -> tuple[tuple[str, str]]:
            return (("authorization", f"Bearer {keys[name]}"),)

        with grpc.insecure_channel(address) as channel:
            ingest = ingest_pb2_grpc.IngestServiceStub(channel)
            items = [ingest_pb2.IngestItem(document=d) for d in sample_documents()]
            request = ingest_pb2.IngestRequest(items=items)
            assert _code(lambda: ingest.Ingest(request, timeout=10)) == (
                grpc.StatusCode.UNAUTHENTICATED
            )
            assert _code(lambda: ingest.Ingest(request, metadata=md("ask"), timeout=10)) == (
                grpc.StatusCode.PERMISSION_DENIED
            )
            job = ingest.Ingest(request, metadata=md("ingest"), timeout=60).job
            updates = list(
                ingest.WatchJob(
                    ingest_pb2.WatchJobRequest(job_id=job.job_id),
                    metadata=md("ingest"),
                    timeout=600,
                )
            )
            assert updates[-1].state == ingest_pb2.JOB_STATE_DONE, updates[-1]
            assert (updates[-1].progress.created, updates[-1].progress.failed) == (48, 0)
            # The stores' own RPCs are not on the public port, whoever asks.
            lexical = lexical_pb2_grpc.LexicalServiceStub(channel)
            delete = lexical_pb2.DeleteRequest(doc_ids=["esg-047"])
            assert _code(lambda: lexical.Delete(delete, metadata=md("admin"), timeout=10)) == (
                grpc.StatusCode.UNIMPLEMENTED
            )

        with grpc.insecure_channel(internal) as channel:
            lexical = lexical_pb2_grpc.LexicalServiceStub(channel)
            assert _code(lambda: lexical.Delete(delete, timeout=10)) == (
                grpc.StatusCode.UNAUTHENTICATED
            )
            assert _code(lambda: lexical.Delete(delete, metadata=md("ingest"), timeout=10)) == (
                grpc.StatusCode.PERMISSION_DENIED
            )

        asked = subprocess.run(
            [*CLI, "ask", QUESTION, "--address", address, "--top-k", "3"],
            env={**env, "ATTEST_CLIENT_TOKEN": keys["ask"]},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert asked.returncode == 0, asked.stdout + asked.stderr
        assert "$14.5 million" in asked.stdout
        assert "[1] esg-045" in asked.stdout
        denied = subprocess.run(
            [*CLI, "ask", QUESTION, "--address", address],
            env={**env, "ATTEST_CLIENT_TOKEN": keys["ingest"]},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert denied.returncode != 0
        assert "needs the `ask` scope" in denied.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=60)
        finally:
            if server.poll() is None:
                server.kill()
            log.close()
    assert code == 0, (tmp_path / "serve.log").read_text()[-3000:]
