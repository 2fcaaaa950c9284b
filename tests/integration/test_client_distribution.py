"""The `attest-client` distribution (services/client/pyproject.toml) on its own.

Builds the wheel with `uv build`, installs it into a clean venv (`uv venv`,
dependencies from the package index or uv's cache), checks that neither torch
nor the model libraries came with it and that no service code did, then asks
a running `attest serve all --embedded` a question with that venv's Python
through `attest.client.AnswerClient` and checks the cited answer.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import grpc
import pytest

from attest.demo.run import sample_documents
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from tests.integration.ingest_stack import free_port, wait_until
from tests.integration.test_serve_all import serving

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "How large a fine did Quaystone Telecom receive over its 2025 data breach?"
HEAVY = {"torch", "transformers", "sentence-transformers", "tokenizers", "onnxruntime", "numpy"}

# Run by the client venv's Python, outside the repository: what it prints is
# the answer as the client returns it and the error type of an empty question.
ASK = """
import asyncio, json, sys

import attest.client
from attest.client import AnswerClient, options
from attest.core import errors


async def main(address: str, question: str) -> None:
    async with AnswerClient(address) as client:
        answer = await client.ask(question, options(rerank_top_k=3), timeout=120)
        try:
            await client.ask(" ", timeout=30)
            refused = None
        except errors.AttestError as err:
            refused = type(err).__name__
    print(json.dumps({
        "client": attest.client.__file__,
        "text": answer.text,
        "insufficient": answer.insufficient_information,
        "cited": sorted({c.doc_id for s in answer.sentences for c in s.citations}),
        "confidences": [c.confidence for s in answer.sentences for c in s.citations],
        "refused": refused,
    }))


asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def _run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> str:
    done = subprocess.run(
        args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{args}: {done.stdout}{done.stderr}"
    return done.stdout


def _ingest(address: str) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        items = [ingest_pb2.IngestItem(document=d) for d in sample_documents()]
        job = stub.Ingest(ingest_pb2.IngestRequest(items=items), timeout=60).job
        final = list(stub.WatchJob(ingest_pb2.WatchJobRequest(job_id=job.job_id), timeout=600))[-1]
    assert final.state == ingest_pb2.JOB_STATE_DONE, final
    assert final.progress.failed == 0, final


@pytest.mark.timeout(900)
def test_client_wheel_in_a_clean_venv_asks_without_torch(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    assert uv is not None, "uv must be on PATH (.ci/test.sh installs it)"
    port = free_port()
    address = f"127.0.0.1:{port}"
    server_env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    log_path = tmp_path / "serve.log"
    log = log_path.open("wb")
    # The server starts while the wheel is built and installed.
    data = tmp_path / "data"
    serve = ["serve", "all", "--embedded", "--port", str(port), "--data-dir", str(data)]
    server = subprocess.Popen(
        [sys.executable, "-m", "attest.cli", *serve],
        env=server_env,
        stdout=log,
        stderr=log,
    )
    try:
        # uv outside any project or venv: only the paths given here count.
        uv_env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
        began = time.monotonic()
        dist = tmp_path / "dist"
        _run([uv, "build", "--wheel", "--out-dir", str(dist), "services/client"], uv_env, ROOT)
        (wheel,) = dist.glob("attest_client-*.whl")
        names = zipfile.ZipFile(wheel).namelist()
        assert "attest/py.typed" in names
        assert "attest/client.py" in names
        assert "attest/answer/v1/answer_pb2_grpc.py" in names
        # Stubs and client-side core only: no servicer, server or model code.
        shipped = {n.split("/")[1] for n in names if n.startswith("attest/") and n.count("/") > 1}
        assert shipped == {"answer", "common", "core", "generate"}, names
        assert not [n for n in names if "servicer" in n or n.endswith("core/server.py")], names

        venv = tmp_path / "venv"
        python = venv / "bin" / "python"
        _run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], uv_env, tmp_path)
        _run(
            [uv, "pip", "install", "--quiet", "--python", str(python), str(wheel)], uv_env, tmp_path
        )
        listed = _run(
            [uv, "pip", "list", "--python", str(python), "--format", "json"], uv_env, tmp_path
        )
        installed = {p["name"].lower().replace("_", "-") for p in json.loads(listed)}
        assert "attest-client" in installed
        assert "attest" not in installed
        assert not installed & HEAVY, installed & HEAVY
        installing = time.monotonic() - began

        # The venv's Python, run outside the repository, with nothing of the
        # project's venv on its path.
        client_env = {
            k: v
            for k, v in uv_env.items()
            if not k.startswith(("ATTEST_", "OTEL_")) and k != "PYTHONHOME"
        }
        missing = subprocess.run(
            [str(python), "-c", "import attest.answer.pipeline"],
            env=client_env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert missing.returncode != 0
        assert "ModuleNotFoundError" in missing.stderr

        wait_until(lambda: serving(address) or server.poll() is not None, 600, "serve all")
        assert server.poll() is None, log_path.read_text()[-3000:]
        _ingest(address)

        script = tmp_path / "ask.py"
        script.write_text(ASK)
        out = _run([str(python), str(script), address, QUESTION], client_env, tmp_path)
        result = json.loads(out)
        assert Path(result["client"]).is_relative_to(venv), result["client"]
        assert not result["insufficient"], result
        assert "$14.5 million" in result["text"], result
        assert "esg-045" in result["cited"], result
        assert result["confidences"], result
        assert all(5 <= c <= 10 for c in result["confidences"]), result
        # The typed errors travel with the client: an empty question is refused.
        assert result["refused"] == "InvalidArgument", result
        print(f"client wheel built and installed in {installing:.1f} s")
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=60)
        finally:
            if server.poll() is None:
                server.kill()
            log.close()
    assert code == 0, log_path.read_text()[-3000:]
