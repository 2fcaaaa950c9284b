"""Blocking calls on the event loop or on a thread, by what they cost.

``asyncio.to_thread`` is not free: the loop submits the call to an executor,
the worker takes the GIL, and the result comes back through the loop's
self-pipe, which takes the GIL back. With concurrent callers on few cores the
hand-overs queue behind each other: a BM25 search over Cranfield's 1,400
documents cost its server 0.84 ms of CPU a query on the loop against 1.12 ms
on threads at 4 clients, 0.84 against 1.07 ms at 16 (medians of three
rounds, ``loadtest/bench_offload.py``).

:class:`Offloader` keeps an exponentially weighted mean and variance of
how long one kind of call takes, and runs the call on the loop while the
mean plus two standard deviations is under its budget (nearly every call
short, not just the average one), on a thread otherwise. "How long" is read
from a clock the owner chooses: wall time by default, since that is how
long the loop waits for an inline call into an engine that computes on
threads of its own (the embedded vector store); the calling thread's CPU
time for one that computes on the calling thread with the GIL released
(tantivy), so that waiting for a core on a busy machine does not count as
cost. It is measured either way, so a kind that grows past the budget (the
index grew, the queries got longer) moves to threads, and back when it
shrinks. Owners keep one offloader per kind of call whose costs differ
(ids only or whole hits, documents or passages). A budget of 0 always uses
threads.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

#: Seconds under which a call runs on the loop. A call this short holds the
#: loop for about as long as a few trips to a thread and back under load.
DEFAULT_BUDGET_SECONDS = 0.002


class Offloader:
    """Runs one kind of blocking call inline or on a thread (see the module)."""

    def __init__(
        self,
        budget_seconds: float = DEFAULT_BUDGET_SECONDS,
        *,
        clock: Callable[[], float] = time.perf_counter,
        weight: float = 0.1,
    ) -> None:
        if budget_seconds < 0:
            raise ValueError("budget_seconds must be at least 0")
        if not 0 < weight <= 1:
            raise ValueError("weight must be in (0, 1]")
        self.budget_seconds = budget_seconds
        self._clock = clock
        self._weight = weight
        # (mean, variance); unknown until the first call is measured: start on
        # a thread, which is always safe, and let the measurement decide.
        self._stats: tuple[float, float] | None = None
        self.inline_calls = 0
        self.thread_calls = 0

    @property
    def mean_seconds(self) -> float | None:
        """The weighted mean time of a call so far (None before the first)."""
        return None if self._stats is None else self._stats[0]

    @property
    def estimate_seconds(self) -> float | None:
        """The weighted mean plus two standard deviations (None before the first
        call): what decides where the next call runs."""
        if self._stats is None:
            return None
        mean, variance = self._stats
        return mean + 2.0 * math.sqrt(variance)

    @property
    def inline(self) -> bool:
        """Whether the next call runs on the loop."""
        estimate = self.estimate_seconds
        return estimate is not None and estimate < self.budget_seconds

    def _observe(self, seconds: float) -> None:
        # From a worker thread too: the pair is replaced in one assignment under
        # the GIL; a lost update between two threads delays it by one sample.
        stats = self._stats
        if stats is None:
            self._stats = (seconds, 0.0)
            return
        mean, variance = stats
        diff = seconds - mean
        step = self._weight * diff
        self._stats = (mean + step, (1.0 - self._weight) * (variance + diff * step))

    def _timed(self, fn: Callable[[], T]) -> T:
        started = self._clock()
        try:
            return fn()
        finally:
            self._observe(self._clock() - started)

    async def run(self, fn: Callable[[], T]) -> T:
        if self.inline:
            self.inline_calls += 1
            return self._timed(fn)
        self.thread_calls += 1
        return await asyncio.to_thread(self._timed, fn)


class Offloaders(Generic[K]):
    """One :class:`Offloader` per kind of call, made on the kind's first call."""

    def __init__(
        self,
        budget_seconds: float = DEFAULT_BUDGET_SECONDS,
        *,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if budget_seconds < 0:
            raise ValueError("budget_seconds must be at least 0")
        self._budget = budget_seconds
        self._clock = clock
        self._by_kind: dict[K, Offloader] = {}

    def __getitem__(self, kind: K) -> Offloader:
        offloader = self._by_kind.get(kind)
        if offloader is None:
            offloader = self._by_kind[kind] = Offloader(self._budget, clock=self._clock)
        return offloader

    async def run(self, kind: K, fn: Callable[[], T]) -> T:
        return await self[kind].run(fn)
