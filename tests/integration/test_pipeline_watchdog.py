"""The ingest service's watchdog on a real Redis: items that no task in a queue or
on a worker holds any more are sent again, and nothing else is."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Iterator, Sequence

import pytest
import redis

from attest.ingest.documents import article_from_raw_json
from attest.ingest.jobs import Batch, IngestCore, Item
from attest.ingest.state import PREFIX, JobStore, RedisKeyValue, TrackedTask
from attest.pipeline.app import QUEUE_ENRICH, create_app
from attest.pipeline.ingest import CeleryDispatcher, Watchdog
from attest.pipeline.settings import PipelineSettings
from tests.conftest import require_server

pytestmark = pytest.mark.integration

INTERVAL = 0.4


class _Dropped:
    """A dispatcher whose process died before it sent anything."""

    def dispatch(self, job_id: str, tenant: str, batches: Sequence[Batch]) -> None:
        pass


def _never() -> object:
    raise AssertionError("no sinks needed")


def _items(n: int) -> list[Item]:
    raws = [json.dumps({"id": f"d{i}", "body": f"Story {i}."}).encode() for i in range(n)]
    return [Item(f"f:{i}", article_from_raw_json(raw)) for i, raw in enumerate(raws)]


class _Pipeline:
    def __init__(self, base: str) -> None:
        self.broker_url, state_url = f"{base}/3", f"{base}/4"
        for url in (self.broker_url, state_url):
            redis.Redis.from_url(url).flushdb()
        self.app = create_app(
            PipelineSettings(broker_url=self.broker_url, result_backend_url=f"{base}/3")
        )
        self.kv = RedisKeyValue(state_url)
        self.store = JobStore(self.kv)
        self.core = IngestCore(
            self.store, CeleryDispatcher(self.app, self.store), _never, batch_size=2
        )
        self.broker = redis.Redis.from_url(self.broker_url)

    def watchdog(self) -> Watchdog:
        return Watchdog(self.app, self.core, INTERVAL)

    def queued(self) -> list[dict]:
        return [json.loads(m) for m in self.broker.lrange(QUEUE_ENRICH, 0, -1)]

    def take(self) -> dict:
        """Pop the oldest enrich message, as a worker's BRPOP does."""
        return json.loads(self.broker.rpop(QUEUE_ENRICH))

    def close(self) -> None:
        self.broker.close()
        self.kv.close()


@pytest.fixture
def pipeline() -> Iterator[_Pipeline]:
    p = _Pipeline(require_server("ATTEST_TEST_REDIS_URL").rstrip("/"))
    yield p
    p.close()


def _check(watchdog: Watchdog) -> dict[str, list[int]]:
    time.sleep(INTERVAL)  # the previous check's lock lapses, and the look is confirmed
    return watchdog.check()


def _items_of(message: dict) -> list[int]:
    args = json.loads(base64.b64decode(message["body"]))[0]
    return [int(i) for i, _ in args[2]]


def test_a_message_lost_between_pop_and_record_is_sent_again_and_held_ones_are_not(
    pipeline: _Pipeline,
):
    store = pipeline.store
    job = pipeline.core.ingest("t", _items(6)).job_id
    tracked = store.tracked(job)
    assert sorted(sorted(t.items) for t in tracked.values()) == [[0, 1], [2, 3], [4, 5]]
    assert {t.stage for t in tracked.values()} == {"ENRICH"}
    watchdog = pipeline.watchdog()
    assert watchdog.check() == {}
    assert _check(watchdog) == {}, "every batch is queued"
    # Placed by the first look: all were sent since the oldest queued message.
    assert watchdog.full_looks == 0

    # One batch is on a worker: kombu keeps it in its unacknowledged hash.
    held = pipeline.take()
    tag = held["properties"]["delivery_tag"]
    pipeline.broker.hset("unacked", tag, json.dumps([held, "", QUEUE_ENRICH]))
    # Another was popped by a worker that died before recording it: it is nowhere.
    lost = pipeline.take()
    lost_items = _items_of(lost)
    assert lost["properties"]["correlation_id"] in tracked

    first = _check(watchdog)
    assert first == {}, "a message missing on one look only is not sent again"
    assert _check(watchdog) == {job: lost_items}
    after = store.tracked(job)
    assert lost["properties"]["correlation_id"] not in after
    assert held["properties"]["correlation_id"] in after
    (again,) = [m for m in pipeline.queued() if m["headers"]["id"] not in tracked]
    assert _items_of(again) == lost_items
    assert again["headers"]["id"] in after
    # Sent once: later checks find it queued.
    assert _check(watchdog) == {}
    assert _check(watchdog) == {}
    assert len(pipeline.queued()) == 2


def test_a_task_put_back_where_the_youngest_go_is_found_by_a_full_look(pipeline: _Pipeline):
    """A requeued task (its worker's pool process died) goes to the end where
    new tasks go, behind younger ones: the first look cannot place it, the full
    look finds it, and it is not sent again."""
    job = pipeline.core.ingest("t", _items(6)).job_id
    oldest = pipeline.take()
    pipeline.broker.lpush(QUEUE_ENRICH, json.dumps(oldest))
    watchdog = pipeline.watchdog()
    assert watchdog.check() == {}
    assert watchdog.full_looks == 1
    assert _check(watchdog) == {}
    assert watchdog.full_looks == 1, "found queued a moment ago: no second full look"
    assert len(pipeline.store.tracked(job)) == 3
    assert len(pipeline.queued()) == 3


def test_items_finished_meanwhile_are_not_sent_again(pipeline: _Pipeline):
    store = pipeline.store
    job = pipeline.core.ingest("t", _items(4)).job_id
    watchdog = pipeline.watchdog()
    lost = _items_of(pipeline.take())
    store.mark(job, "indexed", [lost[0]])
    watchdog.check()
    assert _check(watchdog) == {job: lost[1:]}


def test_a_job_sealed_by_a_process_that_died_before_sending_is_sent(pipeline: _Pipeline):
    store = pipeline.store
    dead = IngestCore(store, _Dropped(), _never, batch_size=2)
    job = dead.ingest("t", _items(3)).job_id
    assert store.tracked(job) == {}
    watchdog = pipeline.watchdog()
    watchdog.check()
    assert _check(watchdog) == {}, "its batches may still be being sent"
    # Long after the seal, nothing marks it dispatched: its sender died.
    store.kv.hset(f"{PREFIX}job:{job}", {"sealed_at": repr(time.time() - 3600)})
    watchdog.check()
    assert _check(watchdog) == {job: [0, 1, 2]}
    assert sorted(i for m in pipeline.queued() for i in _items_of(m)) == [0, 1, 2]


def test_a_job_of_a_release_that_did_not_note_its_tasks_is_left_alone(pipeline: _Pipeline):
    store = pipeline.store
    job = pipeline.core.ingest("t", _items(2)).job_id
    store.kv.hdel(f"{PREFIX}job:{job}", ["tasks_noted"])
    store.untrack(job, list(store.tracked(job)))
    watchdog = pipeline.watchdog()
    watchdog.check()
    assert _check(watchdog) == {}
    assert len(pipeline.queued()) == 1


def test_a_lost_task_is_found_behind_a_message_that_is_no_noted_task(pipeline: _Pipeline):
    """The oldest queued message places nothing when it is no task of a job (a
    task of an older release, a duplicate of a finished one): the tasks of
    its stage are looked for through the whole queue."""
    job = pipeline.core.ingest("t", _items(6)).job_id
    lost = _items_of(pipeline.take())
    foreign = pipeline.queued()[0]
    foreign["properties"]["correlation_id"] = foreign["headers"]["id"] = "not-a-noted-task"
    pipeline.broker.rpush(QUEUE_ENRICH, json.dumps(foreign))
    watchdog = pipeline.watchdog()
    watchdog.check()
    assert _check(watchdog) == {job: lost}


def test_replicas_take_turns_and_a_finished_job_is_settled(pipeline: _Pipeline):
    store = pipeline.store
    job = pipeline.core.ingest("t", _items(2)).job_id
    pipeline.take()
    first, second = pipeline.watchdog(), pipeline.watchdog()
    # While another replica's check holds the lock, a check does nothing.
    pipeline.broker.set(f"{PREFIX}watchdog", "another", px=60_000)
    assert first.check() == {}
    assert first.full_looks == 0
    pipeline.broker.delete(f"{PREFIX}watchdog")
    first.check()
    assert not pipeline.broker.exists(f"{PREFIX}watchdog"), "released when the check ends"
    assert _check(first) == {job: [0, 1]}
    # The other replica saw nothing before: one look is not enough to send again.
    assert second.check() == {}
    # The job finishes; the next check records it DONE and forgets it.
    store.mark(job, "indexed", [0, 1])
    assert job in store.open_jobs()
    _check(second)
    assert job not in store.open_jobs()
    snapshot = store.snapshot(job)
    assert snapshot is not None
    assert snapshot.state == "DONE"


def test_an_item_orphaned_again_waits_twice_as_long(pipeline: _Pipeline):
    now = [0.0]
    job = pipeline.core.ingest("t", _items(2)).job_id
    watchdog = Watchdog(pipeline.app, pipeline.core, INTERVAL, clock=lambda: now[0])
    confirm = watchdog.confirm_seconds

    def at(t: float) -> dict[str, list[int]]:
        now[0] = t
        return watchdog.check()

    pipeline.take()
    assert at(0) == {}
    assert at(confirm) == {job: [0, 1]}
    pipeline.take()  # lost again
    assert at(2 * confirm) == {}
    assert at(3 * confirm) == {}, "a second loss waits two confirmations"
    assert at(4 * confirm) == {job: [0, 1]}


def _task_message(task_id: str, padding: int = 0) -> str:
    """A queued message as kombu writes it: the task id in its properties, last."""
    return json.dumps(
        {
            "body": "x" * padding,
            "headers": {"id": task_id},
            "properties": {"correlation_id": task_id},
        }
    )


@pytest.mark.parametrize(
    ("queued", "padding", "reads"),
    # 16 small messages a read; large ones read fewer at a time (16, 8, 4, then
    # 2 of 1.5 MB, under the 4 MB a page may hold), where a fixed page took 3.
    [(3000, 200, 188), (40, 1_500_000, 9)],
    ids=["many small messages", "a few of megabytes"],
)
def test_the_full_look_finds_tasks_wherever_they_are_in_a_long_queue(
    pipeline: _Pipeline, queued: int, padding: int, reads: int
):
    """The full look reads a queue a page at a time, fewer messages a page while
    they are large: no message is skipped or read twice as the page changes
    size, and a page never holds more than 16."""
    at = sorted({0, 1, 15, 16, 17, 47, 48, queued // 3, queued // 2 + 1, queued - 2, queued - 1})
    ids = [f"task-{i}" for i in range(queued)]
    pipe = pipeline.broker.pipeline()
    for task_id in ids:
        pipe.lpush(QUEUE_ENRICH, _task_message(task_id, padding))  # oldest at the right
    pipe.execute()
    # LRANGE's index 0 is the youngest: the positions below are the script's reading order.
    youngest_first = [
        json.loads(m)["headers"]["id"] for m in pipeline.broker.lrange(QUEUE_ENRICH, 0, 0)
    ]
    assert youngest_first == [ids[-1]]
    wanted = {ids[queued - 1 - i]: TrackedTask("ENRICH", (i,), 0.0) for i in at}
    wanted["never-sent"] = TrackedTask("ENRICH", (99,), 0.0)
    watchdog = pipeline.watchdog()
    assert watchdog.held(wanted) == set(wanted) - {"never-sent"}
    assert watchdog.full_looks == len(wanted)
    # A task never sent keeps it reading to the end of the queue.
    assert watchdog.full_look_reads == reads
    # Tasks found near the front end the look there; one given twice is one task.
    first = {ids[queued - 1]: TrackedTask("ENRICH", (0,), 0.0)}
    twice = watchdog._scripts["held"](
        keys=["unacked", QUEUE_ENRICH], args=[ids[queued - 1], ids[queued - 1]]
    )
    assert twice == [[ids[queued - 1].encode()], 1]
    watchdog.full_look_reads = 0
    assert watchdog.held(first) == set(first)
    assert watchdog.full_look_reads == 1


class _HeldCheck:
    """A watchdog whose check runs in a thread and holds on (inside its lock,
    connected) until ``release`` is set; errors it raises are kept."""

    def __init__(self, pipeline: _Pipeline) -> None:
        pipeline.core.ingest("t", _items(2))
        self.watchdog = watchdog = pipeline.watchdog()
        self.release = threading.Event()
        self.errors: list[BaseException] = []
        started = threading.Event()
        real = watchdog._check

        def held() -> dict[str, list[int]]:
            started.set()
            self.release.wait(10)
            return real()

        def run() -> None:
            try:
                watchdog.check()
            except BaseException as err:  # recorded for the tests' assertions
                self.errors.append(err)

        watchdog._check = held  # type: ignore[method-assign]
        self.runner = threading.Thread(target=run)
        self.runner.start()
        assert started.wait(5)

    def finish(self) -> None:
        self.release.set()
        self.runner.join(5)
        assert self.errors == []


def test_close_waits_for_a_running_check_and_no_check_runs_after_it(pipeline: _Pipeline):
    held = _HeldCheck(pipeline)
    watchdog = held.watchdog
    threading.Timer(0.5, held.release.set).start()
    began = time.monotonic()
    assert asyncio.run(watchdog.close()) is True
    assert time.monotonic() - began >= 0.4, "close returned before the check it found ended"
    held.finish()
    assert not pipeline.broker.exists(f"{PREFIX}watchdog"), "the check released its lock"
    assert watchdog._client is None
    assert watchdog.check() == {}, "a closed watchdog does not check"
    assert watchdog._client is None, "nor does it connect again"


def test_a_check_that_outlives_close_closes_its_own_connection(pipeline: _Pipeline):
    held = _HeldCheck(pipeline)
    watchdog = held.watchdog
    began = time.monotonic()
    assert asyncio.run(watchdog.close(wait_seconds=0.3)) is False
    assert 0.25 < time.monotonic() - began < 5
    client = watchdog._client
    assert client is not None, "the running check keeps its connection"
    held.finish()
    assert not pipeline.broker.exists(f"{PREFIX}watchdog"), "it released its lock"
    assert watchdog._client is None, "and closed its connection when it ended"
    assert all(c._sock is None for c in client.connection_pool._available_connections)
    assert client.connection_pool._in_use_connections == set()


def test_a_cancelled_close_leaves_nothing_held(pipeline: _Pipeline):
    held = _HeldCheck(pipeline)
    watchdog = held.watchdog

    async def impatient() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(watchdog.close(), 0.2)

    asyncio.run(impatient())
    held.finish()
    assert not watchdog._checking.locked()
    assert watchdog._idle.is_set()
    later = threading.Thread(target=watchdog.check)
    later.start()
    later.join(2)
    assert not later.is_alive(), "a later check is not blocked by the cancelled close"
    assert asyncio.run(watchdog.close(wait_seconds=1)) is True
