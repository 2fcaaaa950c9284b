"""Nothing is lost when a worker is killed, or Redis or the OpenSearch node restarts,
in the middle of a job."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis

from attest.ingest.state import PREFIX
from attest.ingest.v1 import ingest_pb2
from attest.pipeline.ingest import EMBED, ENRICH, INDEX
from tests.conftest import require_server
from tests.integration.ingest_stack import (
    REUTERS,
    OpenSearchNode,
    Stack,
    free_port,
    reuters_lines,
    stream_items,
    wait_until,
)

pytestmark = pytest.mark.integration

# Three pipeline batches of 64: the kills land with a batch in hand and another
# still queued, and every batch embeds for longer than the visibility timeout.
DOCS = 192


def _progress(stack: Stack, job_id: str) -> ingest_pb2.Job:
    return stack.ingest.GetJob(ingest_pb2.GetJobRequest(job_id=job_id), timeout=60).job


def _assert_complete(stack: Stack, job_id: str, docs: int = DOCS) -> None:
    """The job is DONE and every document is stored exactly once."""
    job = wait_until(
        lambda: (j := _progress(stack, job_id)).state == ingest_pb2.JOB_STATE_DONE and j,
        600,
        "the job did not finish",
        step=0.5,
    )
    p = job.progress
    assert (p.received, p.indexed, p.created, p.failed) == (docs, docs, docs, 0), job
    registry = stack.registry()
    assert len(registry) == docs
    passages = sum(e.passages for e in registry.values())
    links = sum(len(e.entity_ids) for e in registry.values())
    expected = (docs, passages, docs, passages, links)
    assert stack.settled_counts(expected) == expected
    # Exactly once: as many record ids as documents and passages, no more.
    assert stack.stored_ids_checksum()[0] == docs + passages


def _start_job(stack: Stack, docs: int = DOCS) -> str:
    lines = reuters_lines(docs)
    response = stack.ingest.IngestStream(stream_items(lines, "reuters.jsonl", 100), timeout=300)
    return response.job.job_id


def _kill_worker(stack: Stack, name: str) -> None:
    """SIGKILL a whole Celery worker: its pool processes and its main process."""
    worker = stack.procs[name]
    for pid in [*stack.children(name), worker.pid]:
        os.kill(pid, signal.SIGKILL)
    worker.wait()


@pytest.fixture
def stack(tmp_path: Path):
    redis_url = require_server("ATTEST_TEST_REDIS_URL")
    opensearch = require_server("ATTEST_TEST_OPENSEARCH_URL")
    if not REUTERS.is_file():
        pytest.fail(f"{REUTERS} is missing (set ATTEST_SHARED_DIR)")
    s = Stack(tmp_path, redis_url, opensearch)
    yield s
    s.stop()


def _redeliveries(stack: Stack) -> int:
    """Deliveries beyond the first, over every task attempt of the job."""
    state = redis.Redis.from_url(stack.state)
    try:
        counts = [int(state.get(k) or 0) for k in state.scan_iter(f"{PREFIX}delivery:*")]
    finally:
        state.close()
    return sum(max(0, c - 1) for c in counts)


@pytest.mark.timeout(1200)
def test_kill_9_of_workers_mid_job(stack: Stack):
    """Killed workers lose nothing, and only the tasks they held run again.

    Embedding a batch here takes 10-30 s on one thread (more in a fresh pool
    process, which loads the model first), longer than the 15 s visibility
    timeout. Redis used to deliver such a task again while it was still
    running: the copies ran back to back on the one embed process, each
    counted towards the delivery cap, and on a busy machine the job stalled
    ("no progress within 300 s"). Running tasks now keep their delivery
    alive, so the only tasks delivered twice are the ones the kills took.
    """
    stack.configure(visibility_timeout=15)
    stack.start()
    job_id = _start_job(stack)
    wait_until(lambda: _progress(stack, job_id).progress.embedded > 0, 300, "no progress", 0.2)
    # The pool process running an embedding batch dies: its task goes back to the queue.
    (child,) = stack.children("worker-embed")
    os.kill(child, signal.SIGKILL)
    wait_until(lambda: _progress(stack, job_id).progress.indexed > 0, 300, "no progress", 0.2)
    # The whole enrich/index worker dies, tasks in hand: they come back after the
    # visibility timeout, to its replacement.
    before = _progress(stack, job_id).progress
    assert before.indexed < DOCS, "the job finished before the kill; use more documents"
    _kill_worker(stack, "worker-text")
    stack.start_worker("worker-text", "enrich,index")
    _assert_complete(stack, job_id)
    # The pool process's task, and what the text worker held (one running task
    # and at most one prefetched), came back; nothing else was delivered twice.
    assert _redeliveries(stack) <= 3


def _held(stack: Stack, task: str) -> int:
    """Deliveries of ``task`` that a worker holds unacknowledged (running or
    reserved): kombu keeps them in the broker's "unacked" hash until the ack."""
    broker = redis.Redis.from_url(stack.broker)
    try:
        entries = broker.hvals("unacked")
    finally:
        broker.close()
    return sum(1 for e in entries if json.loads(e)[0]["headers"]["task"] == task)


def _kill_holding(stack: Stack, name: str, task: str, timeout: float = 300) -> None:
    """SIGKILL worker ``name`` while it holds a ``task`` delivery.

    The worker is frozen (SIGSTOP) first and the delivery checked again, so
    the kill cannot land just after the task finished; a worker that finished
    in between is thawed and waited for again.
    """
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"{name} never held a {task} task"
        if _held(stack, task):
            pids = [stack.procs[name].pid, *stack.children(name)]
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            if _held(stack, task):
                _kill_worker(stack, name)
                return
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        time.sleep(0.001)


@pytest.mark.timeout(1200)
def test_kill_9_of_each_worker_kind_mid_job(stack: Stack):
    """Enrich, embed and index on workers of their own; each kind is killed
    (SIGKILL, main process and pool) while it holds a task of the job, and a
    replacement started: every document is stored exactly once."""
    stack.configure(visibility_timeout=15)
    stack.start(split_text=True)
    job_id = _start_job(stack)
    for name, task in (
        ("worker-enrich", ENRICH),
        ("worker-embed", EMBED),
        ("worker-index", INDEX),
    ):
        before = _progress(stack, job_id).progress
        _kill_holding(stack, name, task)
        assert before.indexed < DOCS, f"the job finished before {name} was killed"
        stack.start_worker(name, task.rsplit(".", 1)[1])
    _assert_complete(stack, job_id)
    # Only what the killed workers held came back (one delivery each at most).
    assert _redeliveries(stack) <= 3


@pytest.mark.timeout(1200)
def test_kill_9_of_the_embed_worker_the_moment_a_batch_shows_as_embedded(stack: Stack):
    """The worst moment for a kill: the job has just counted a batch as embedded.

    A stage records its progress only once the batch is queued for the next
    stage, so the batch is in the index queue already: with no embed worker
    left at all it is still indexed. (When progress came first, a kill in the
    few milliseconds before the index task was sent lost the only embedded
    batch, and nothing was indexed until a new embed worker had loaded its
    model and embedded a batch again.) The embed worker's unfinished task
    comes back to its replacement after the visibility timeout.

    The kill lands as the worker, its task just acknowledged, pops the next
    one: a task popped and not yet recorded as unacknowledged is in no queue
    and no visibility-timeout index, and the job used to stay RUNNING with
    that batch missing (one run in a few). The ingest service's watchdog
    sends such a batch again (the next test makes that loss on purpose).
    """
    docs = 130  # three batches
    stack.configure(visibility_timeout=15)
    stack.start()
    job_id = _start_job(stack, docs)
    state = redis.Redis.from_url(stack.state)
    embedded = f"{PREFIX}job:{job_id}:s:embedded"
    try:
        # Poll the job state directly: the kill lands within about a millisecond.
        deadline = time.monotonic() + 300
        while not state.scard(embedded):
            assert time.monotonic() < deadline, "nothing was embedded"
            time.sleep(0.001)
        _kill_worker(stack, "worker-embed")
        shown = int(state.scard(embedded))
    finally:
        state.close()
    assert shown < docs
    wait_until(
        lambda: _progress(stack, job_id).progress.indexed >= shown,
        300,
        "documents counted as embedded were lost with the embed worker",
        0.5,
    )
    stack.start_worker("worker-embed", "embed")
    _assert_complete(stack, job_id, docs)


@pytest.mark.timeout(1200)
def test_a_task_popped_by_a_worker_that_died_before_recording_it_is_sent_again(stack: Stack):
    """kombu's Redis transport pops a task (BRPOP) and records it as unacknowledged
    only afterwards, in the worker: a worker killed in between takes the task
    with it, and no visibility timeout brings it back. Here an embed task is
    popped by hand, as such a worker would, before any embed worker runs: the
    ingest service's watchdog finds its documents held by no task and sends
    them again, and every document is stored exactly once."""
    docs = 130  # three batches
    stack.configure(visibility_timeout=15)
    stack.start(embed_processes=0)
    job_id = _start_job(stack, docs)
    broker = redis.Redis.from_url(stack.broker)
    try:
        wait_until(lambda: broker.llen("embed") > 0, 300, "nothing was enriched", 0.05)
        message = json.loads(broker.rpop("embed"))
    finally:
        broker.close()
    assert message["headers"]["task"] == EMBED
    dropped = json.loads(base64.b64decode(message["body"]))[0][2]
    stack.start_worker("worker-embed", "embed")
    _assert_complete(stack, job_id, docs)
    # Exactly the dropped batch went through again, once.
    log = (stack.tmp / "ingest.log").read_text()
    resent = re.findall(rf"job {job_id}: (\d+) unfinished items are held by no task", log)
    assert [int(n) for n in resent] == [len(dropped)], log[-3000:]
    # Every task of the job was forgotten when it finished.
    state = redis.Redis.from_url(stack.state)
    try:
        assert state.hlen(f"{PREFIX}job:{job_id}:tasks") == 0
    finally:
        state.close()


@pytest.mark.timeout(1200)
def test_redis_restart_mid_job(tmp_path: Path, stack: Stack):
    port = free_port()
    data = tmp_path / "redis"
    data.mkdir()
    command = [
        "redis-server",
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--dir", str(data),
        "--save", "",
        "--appendonly", "yes",
        "--appendfsync", "always",
    ]  # fmt: skip
    log = (tmp_path / "redis.log").open("ab")
    server = subprocess.Popen(command, stdout=log, stderr=log)
    try:
        wait_until(lambda: _ping(port), 30, "redis did not start", 0.1)
        stack.redis_base = f"redis://127.0.0.1:{port}"
        stack.configure(visibility_timeout=15)
        stack.start()
        # Three batches (64, 64, 2): Redis goes away once the first is indexed,
        # with the second in hand and the third queued.
        docs = 130
        job_id = _start_job(stack, docs)
        wait_until(lambda: _progress(stack, job_id).progress.indexed > 0, 300, "no progress", 0.2)
        assert _progress(stack, job_id).progress.indexed < docs
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        time.sleep(3)
        server = subprocess.Popen(command, stdout=log, stderr=log)
        wait_until(lambda: _ping(port), 30, "redis did not restart", 0.1)
        _assert_complete(stack, job_id, docs)
    finally:
        stack.stop()
        server.terminate()
        server.wait(timeout=30)


def _ping(port: int) -> bool:
    import redis

    try:
        return bool(redis.Redis(port=port, socket_timeout=1).ping())
    except redis.ConnectionError:
        return False


def _retried(stack: Stack) -> dict[str, int]:
    """Task id -> retries after a transient failure, for each task that retried."""
    state = redis.Redis.from_url(stack.state)
    try:
        keys = [k.decode() for k in state.scan_iter(f"{PREFIX}delivery:*")]
    finally:
        state.close()
    out: dict[str, int] = {}
    for key in keys:
        task_id, retry = key.removeprefix(f"{PREFIX}delivery:").rsplit(":", 1)
        out[task_id] = max(out.get(task_id, 0), int(retry))
    return {k: v for k, v in out.items() if v > 0}


def _retries(stack: Stack) -> int:
    """Retries (after a transient failure) over every task of the job."""
    return sum(_retried(stack).values())


@pytest.mark.timeout(1200)
# "sigterm" (a clean stop) passes the same way (120 s, node down 21 s); CI runs
# the harder case only, a kill with no flush, to keep the suite's time in bounds.
@pytest.mark.parametrize("how", ["sigkill"])
def test_opensearch_restart_mid_job(tmp_path: Path, stack: Stack, how: str):
    """The OpenSearch node goes away once the first batch is indexed (stopped, or
    killed with no flush) and comes back on the same data directory and port.

    The node stays down until an index task has failed against it and is waiting
    for its retry, so the outage is met, not hoped for; writes acknowledged
    before the outage are in the node's translog and survive it. Index tasks
    retry for ``retry_window_seconds`` (10 minutes) from their first failure:
    when they counted five retries with full jitter they gave up within about
    8 s, sooner than the node restarts (12-15 s here), and the job ended with
    every document of the batches in flight failed.
    """
    node = OpenSearchNode(tmp_path / "opensearch")
    node.start()
    try:
        stack.opensearch = node.url
        stack.configure(visibility_timeout=15)
        stack.start()
        docs = 130  # three batches (64, 64, 2)
        job_id = _start_job(stack, docs)
        wait_until(lambda: _progress(stack, job_id).progress.indexed > 0, 300, "no progress", 0.2)
        assert _progress(stack, job_id).progress.indexed < docs
        down = time.monotonic()
        node.stop() if how == "sigterm" else node.kill()
        assert not node.reachable()
        # An index task meets the outage and backs off; the failed attempt did
        # not fail a document.
        wait_until(lambda: _retries(stack) > 0, 300, "no index task met the outage", 0.2)
        assert _progress(stack, job_id).progress.failed == 0
        restart = node.start()
        outage = time.monotonic() - down
        _assert_complete(stack, job_id, docs)
        retried = _retried(stack)
        print(
            f"{how}: {docs} documents, node down {outage:.1f} s (restart {restart:.1f} s), "
            f"{len(retried)} tasks retried {sum(retried.values())} times"
        )
    finally:
        stack.stop()
        node.stop()


@pytest.mark.timeout(900)
def test_a_store_down_past_the_retry_window_fails_its_documents(tmp_path: Path, stack: Stack):
    """Retrying is bounded: with the node gone for good, the index task gives up
    once it has retried ``max_retries`` times over ``retry_window_seconds``, and
    every document of the job is reported failed with the reason."""
    node = OpenSearchNode(tmp_path / "opensearch")
    node.start()
    try:
        stack.opensearch = node.url
        stack.configure()
        stack.env["ATTEST_PIPELINE_MAX_RETRIES"] = "2"
        stack.env["ATTEST_PIPELINE_RETRY_WINDOW_SECONDS"] = "8"
        stack.start()
        node.stop()
        docs = 10
        began = time.monotonic()
        job_id = _start_job(stack, docs)
        job = wait_until(
            lambda: (j := _progress(stack, job_id)).state == ingest_pb2.JOB_STATE_DONE and j,
            600,
            "the job did not finish",
        )
        took = time.monotonic() - began
        p = job.progress
        assert (p.received, p.indexed, p.failed) == (docs, 0, docs), job
        failures = stack.ingest.GetJob(
            ingest_pb2.GetJobRequest(job_id=job_id, failures_limit=100), timeout=30
        ).job.failures
        assert len(failures) == docs
        for f in failures:
            assert f.stage == ingest_pb2.STAGE_INDEX, f
            assert "opensearch" in f.reason, f.reason
            found = re.search(r"still failing after (\d+) retries over (\d+) s", f.reason)
            assert found is not None, f.reason
            assert int(found[1]) >= 2, f.reason
            assert int(found[2]) >= 8, f.reason
        assert _retries(stack) >= 2
        print(f"gave up after {took:.1f} s: {failures[0].reason}")
    finally:
        stack.stop()
        node.stop()
