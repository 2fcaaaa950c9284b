"""`attest worker --metrics-port`: what its pool processes record, and the queues' depth."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest
import redis

from tests.conftest import require_server
from tests.integration.ingest_stack import free_port, wait_until

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "attest.cli"]


def _scrape(port: int) -> dict[str, float]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
    except OSError:
        return {}
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


@pytest.mark.timeout(600)
def test_worker_metrics_sum_the_pool_processes_and_show_queue_depth(tmp_path: Path) -> None:
    base = require_server("ATTEST_TEST_REDIS_URL").rstrip("/")
    broker, results, state = f"{base}/13", f"{base}/14", f"{base}/15"
    for url in (broker, results, state):
        redis.Redis.from_url(url).flushdb()
    port = free_port()
    env = {
        **os.environ,
        "ATTEST_PIPELINE_BROKER_URL": broker,
        "ATTEST_PIPELINE_RESULT_BACKEND_URL": results,
        "ATTEST_PIPELINE_STATE_URL": state,
        "ATTEST_DATA_DIR": str(tmp_path / "data"),
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = (tmp_path / "worker.log").open("wb")
    cmd = [*CLI, "worker", "--queues", "enrich", "--metrics-port", str(port)]
    worker = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
    client = redis.Redis.from_url(broker)
    try:
        # Two messages wait in a queue nobody here consumes.
        client.lpush("embed", "first", "second")
        depth = wait_until(
            lambda: (
                worker.poll() is None
                and _scrape(port).get('attest_pipeline_queue_depth{queue="embed"}')
            ),
            180,
            "no queue depth on the worker's metrics port",
        )
        assert depth == 2.0
        samples = _scrape(port)
        assert samples['attest_pipeline_queue_depth{queue="enrich"}'] == 0.0
        assert samples['attest_pipeline_queue_depth{queue="answer"}'] == 0.0
        # A task that runs in the pool process: enrich of a job whose item is
        # gone fails that item, and the count reaches the main process's port.
        from attest.pipeline.app import create_app
        from attest.pipeline.settings import PipelineSettings

        app = create_app(
            PipelineSettings(broker_url=broker, result_backend_url=results, state_url=state)
        )
        app.send_task("attest.ingest.enrich", args=[uuid.uuid4().hex, "default", [[0, "created"]]])
        failed = 'attest_ingest_stage_items_total{outcome="failed",stage="enrich"}'
        assert wait_until(lambda: _scrape(port).get(failed), 300, "the pool's count") == 1.0
        assert _scrape(port)['attest_ingest_stage_seconds_count{stage="enrich"}'] == 1.0
    finally:
        client.delete("embed")
        client.close()
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
