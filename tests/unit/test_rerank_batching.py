"""The micro-batcher: concurrent requests share model calls, results stay in order."""

from __future__ import annotations

import asyncio
import threading

import pytest

from attest.core.errors import ResourceExhausted
from attest.rerank.batching import MicroBatcher


class Recorder:
    def __init__(self, fail_on: int | None = None) -> None:
        self.calls: list[list[int]] = []
        self.threads: set[str] = set()
        self.fail_on = fail_on

    def __call__(self, items: list[int]) -> list[int]:
        self.calls.append(list(items))
        self.threads.add(threading.current_thread().name)
        if self.fail_on is not None and self.fail_on in items:
            raise ValueError("model failed")
        return [i * 10 for i in items]


async def test_concurrent_requests_are_batched_and_answered_in_order() -> None:
    fn = Recorder()
    batcher = MicroBatcher(fn, max_items=64, max_wait_seconds=0.05)
    batcher.start()
    try:
        requests = [list(range(r * 3, r * 3 + 3)) for r in range(8)]
        results = await asyncio.gather(*(batcher.submit(r) for r in requests))
    finally:
        await batcher.close()
    assert results == [[i * 10 for i in r] for r in requests]
    assert len(fn.calls) < 8  # shared calls
    assert batcher.stats.largest_batch > 3
    assert batcher.stats.items == 24
    assert all(name.startswith("rerank-batch") for name in fn.threads)  # off the event loop


async def test_a_batch_never_exceeds_max_items_and_requests_are_not_split() -> None:
    fn = Recorder()
    batcher = MicroBatcher(fn, max_items=5, max_wait_seconds=0.05)
    batcher.start()
    try:
        requests = [[1, 2], [3, 4], [5, 6], [7]]
        await asyncio.gather(*(batcher.submit(r) for r in requests))
    finally:
        await batcher.close()
    assert all(len(call) <= 5 for call in fn.calls)
    flat = [tuple(c) for c in fn.calls]
    for r in requests:  # each request's items sit together in one call
        assert any(tuple(r) == c[i : i + len(r)] for c in flat for i in range(len(c)))


async def test_a_failing_batch_fails_its_callers_and_the_batcher_goes_on() -> None:
    fn = Recorder(fail_on=99)
    batcher = MicroBatcher(fn, max_items=8, max_wait_seconds=0.0)
    batcher.start()
    try:
        with pytest.raises(ValueError, match="model failed"):
            await batcher.submit([99])
        assert await batcher.submit([1]) == [10]
    finally:
        await batcher.close()


async def test_a_full_queue_is_resource_exhausted() -> None:
    gate = threading.Event()

    def slow(items: list[int]) -> list[int]:
        gate.wait(5)
        return items

    batcher = MicroBatcher(slow, max_items=1, max_wait_seconds=0.0, max_queued_requests=1)
    batcher.start()
    try:
        first = asyncio.create_task(batcher.submit([1]))
        await asyncio.sleep(0.05)  # the first call is now inside the model
        second = asyncio.create_task(batcher.submit([2]))  # waits in the queue
        await asyncio.sleep(0.01)
        with pytest.raises(ResourceExhausted):
            await batcher.submit([3])
        gate.set()
        assert await first == [1]
        assert await second == [2]
    finally:
        gate.set()
        await batcher.close()
