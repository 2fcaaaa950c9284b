"""Dynamic micro-batching: concurrent requests share one model call.

Requests put their items on a queue; one collector takes the first waiting
item, then keeps taking items until ``max_items`` are gathered or
``max_wait_seconds`` have passed since the first one, and runs the batch
function on a worker thread (never on the event loop). Each request gets its
own slice of the results back. Items of one request are never split across
batches unless the request alone is larger than ``max_items``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from prometheus_client import Histogram

from attest.core.errors import ResourceExhausted, Unavailable

T = TypeVar("T")
R = TypeVar("R")

BATCH_ITEMS = Histogram(
    "attest_rerank_batch_documents",
    "Documents scored per model call, across concurrent requests.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)
BATCH_REQUESTS = Histogram(
    "attest_rerank_batch_requests",
    "Requests served by one model call.",
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64),
)
QUEUE_WAIT = Histogram(
    "attest_rerank_queue_wait_seconds",
    "Time a request waited before its batch started.",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0),
)


@dataclass
class _Pending(Generic[T, R]):
    items: Sequence[T]
    future: asyncio.Future[list[R]]
    queued_at: float = field(default_factory=time.perf_counter)


@dataclass
class BatchStats:
    """Counters a caller (and tests) can read without scraping metrics."""

    batches: int = 0
    items: int = 0
    requests: int = 0
    largest_batch: int = 0
    sizes: list[int] = field(default_factory=list)

    def record(self, items: int, requests: int) -> None:
        self.batches += 1
        self.items += items
        self.requests += requests
        self.largest_batch = max(self.largest_batch, items)
        if len(self.sizes) < 10_000:
            self.sizes.append(items)


class MicroBatcher(Generic[T, R]):
    def __init__(
        self,
        fn: Callable[[list[T]], list[R]],
        *,
        max_items: int = 64,
        max_wait_seconds: float = 0.005,
        max_queued_requests: int = 1024,
    ) -> None:
        if max_items < 1:
            raise ValueError("max_items must be >= 1")
        self._fn = fn
        self._max_items = max_items
        self._max_wait = max_wait_seconds
        self._queue: asyncio.Queue[_Pending[T, R]] = asyncio.Queue(max_queued_requests)
        # One thread: model calls run one at a time, in order.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rerank-batch")
        self._task: asyncio.Task[None] | None = None
        self._carry: _Pending[T, R] | None = None
        self.stats = BatchStats()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._collect(), name="rerank-batcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        while not self._queue.empty():
            pending = self._queue.get_nowait()
            if not pending.future.done():
                pending.future.set_exception(Unavailable("the reranker is shutting down"))
        self._executor.shutdown(wait=True)

    async def submit(self, items: Sequence[T]) -> list[R]:
        if self._task is None:
            raise Unavailable("the reranker is not started")
        if not items:
            return []
        future: asyncio.Future[list[R]] = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait(_Pending(items, future))
        except asyncio.QueueFull:
            raise ResourceExhausted("the reranker queue is full; retry later") from None
        return await future

    async def _next(self) -> _Pending[T, R]:
        if self._carry is not None:
            pending, self._carry = self._carry, None
            return pending
        return await self._queue.get()

    async def _collect(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = await self._next()
            batch = [first]
            count = len(first.items)
            deadline = loop.time() + self._max_wait
            while count < self._max_items:
                remaining = deadline - loop.time()
                try:
                    nxt = (
                        self._queue.get_nowait()
                        if remaining <= 0
                        else await asyncio.wait_for(self._queue.get(), remaining)
                    )
                except (asyncio.QueueEmpty, TimeoutError):
                    break
                if count + len(nxt.items) > self._max_items:
                    self._carry = nxt
                    break
                batch.append(nxt)
                count += len(nxt.items)
            batch = [p for p in batch if not p.future.cancelled()]
            if not batch:
                continue
            started = time.perf_counter()
            for p in batch:
                QUEUE_WAIT.observe(started - p.queued_at)
            items = [item for p in batch for item in p.items]
            try:
                results = await loop.run_in_executor(self._executor, self._fn, items)
            except Exception as exc:  # noqa: BLE001 - the batch fails as a whole; each caller sees why
                for p in batch:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            BATCH_ITEMS.observe(len(items))
            BATCH_REQUESTS.observe(len(batch))
            self.stats.record(len(items), len(batch))
            offset = 0
            for p in batch:
                n = len(p.items)
                if not p.future.done():
                    p.future.set_result(results[offset : offset + n])
                offset += n
