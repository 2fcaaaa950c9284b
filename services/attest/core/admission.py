"""Admission control: a concurrency limit with a short, bounded, first-come-first-served queue.

A ``Limiter`` lets ``limit`` holders run at once. A caller finding every slot
taken waits in a queue of at most ``max_waiting``, first come first served,
when its wait is expected to take at most ``max_wait_seconds`` (and never
longer than its own budget). Load past that is shed early instead of being
left to time out inside:

* the queue is full: RESOURCE_EXHAUSTED at once;
* the wait the caller would face, estimated from how long slots have been
  held lately, is longer than it may wait: RESOURCE_EXHAUSTED at once;
* the wait ran out anyway (after ``wait_grace`` times ``max_wait_seconds``:
  an admitted caller is not turned away because the estimate it was admitted
  on was a little short, which would waste the wait it already spent):
  RESOURCE_EXHAUSTED when the cap was the limiter's own (or a share of the
  caller's budget), DEADLINE_EXCEEDED when it was the caller's whole budget.

Every RESOURCE_EXHAUSTED carries ``retry_after``, the estimated seconds until
every caller queued now has a slot, which grows with the queue (see
``Limiter.retry_after``; the interceptor sends it as the ``retry-after``
trailer, as per-tenant quotas do). A released slot goes straight to the oldest waiter,
so nobody overtakes a request that waits; a cancelled waiter leaves the
queue, and a cancelled holder gives its slot back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable

from prometheus_client import Counter, Gauge

from attest.core.errors import DeadlineExceeded, ResourceExhausted

RUNNING = Gauge("attest_admission_running", "Slots held, by limiter.", ["limiter"])
WAITING = Gauge("attest_admission_waiting", "Callers queued for a slot, by limiter.", ["limiter"])
SHED = Counter(
    "attest_admission_shed_total",
    "Callers refused by a limiter, by reason (door, full, estimate, queue_timeout, budget).",
    ["limiter", "reason"],
)

#: Weight of the newest hold time in the moving average.
_ALPHA = 0.3
#: Retry hint when nothing has been measured yet, in seconds.
_DEFAULT_RETRY_AFTER = 1.0
_MIN_RETRY_AFTER = 0.05


class Limiter:
    """At most ``limit`` holders at once; up to ``max_waiting`` more queue for a slot.

    ``name`` labels metrics and messages (``the NAME service is at capacity``),
    ``noun`` names what holds a slot (``4 answers running``). A caller waits at
    most ``max_wait_seconds`` by estimate, at most ``wait_grace`` times that in
    fact, and at most ``budget_share`` of its budget.
    """

    def __init__(
        self,
        name: str,
        limit: int,
        max_waiting: int,
        max_wait_seconds: float,
        *,
        noun: str = "calls",
        budget_share: float = 1.0,
        wait_grace: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (
            limit < 1
            or max_waiting < 0
            or max_wait_seconds <= 0
            or not 0 < budget_share <= 1
            or wait_grace < 1
        ):
            raise ValueError(
                "a limiter needs limit >= 1, max_waiting >= 0, max_wait_seconds > 0, "
                "0 < budget_share <= 1 and wait_grace >= 1"
            )
        self.name = name
        self.noun = noun
        self.limit = limit
        self.max_waiting = max_waiting
        self.max_wait_seconds = max_wait_seconds
        self.budget_share = budget_share
        self.wait_grace = wait_grace
        self._clock = clock
        self._queue: collections.deque[asyncio.Future[int]] = collections.deque()
        # slot id -> when its holder got it
        self._held: dict[int, float] = {}
        self._ids = itertools.count()
        self._hold: float | None = None  # moving average of hold times
        self._running_gauge = RUNNING.labels(name)
        self._waiting_gauge = WAITING.labels(name)

    @property
    def running(self) -> int:
        return len(self._held)

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def typical_hold_seconds(self) -> float | None:
        """Moving average of how long a slot is held; None until one was released."""
        return self._hold

    def estimated_wait(self, position: int) -> float | None:
        """Seconds until the waiter at ``position`` (0: the next) gets a slot, if known.

        Each running holder is expected to keep its slot for the typical hold
        time; the waiter gets the ``position + 1``-th slot to free up, later
        rounds taking one typical hold time each. Holders already past the
        typical time are not about to finish for that: on average one slot
        frees up per typical hold time over ``limit``, and the estimate is
        never below that pace.
        """
        if self._hold is None:
            return None
        now = self._clock()
        left = sorted(max(0.0, self._hold - (now - since)) for since in self._held.values())
        left += [0.0] * (self.limit - len(left))
        rounds, index = divmod(position, self.limit)
        return max(left[index] + rounds * self._hold, (position + 1) * self._hold / self.limit)

    def retry_after(self) -> float:
        """When a refused caller may find room: the wait of a caller at the back
        of the queue now, ``estimated_wait(waiting)``.

        By then every caller queued now has a slot, so the hint grows with the
        queue (about one typical hold time per ``limit`` waiters): the first
        slot to free up would only go to a waiter already queued, and refused
        callers told to come back then would all be refused again together.
        Before any hold time was measured, each round of ``limit`` waiters
        counts ``_DEFAULT_RETRY_AFTER``.
        """
        estimate = self.estimated_wait(self.waiting)
        if estimate is None:
            return _DEFAULT_RETRY_AFTER * (self.waiting // self.limit + 1)
        return max(estimate, _MIN_RETRY_AFTER)

    def _refuse(self, reason: str, message: str) -> ResourceExhausted:
        SHED.labels(self.name, reason).inc()
        return ResourceExhausted(message, retry_after=self.retry_after())

    def _take(self) -> int:
        slot = next(self._ids)
        self._held[slot] = self._clock()
        self._running_gauge.set(len(self._held))
        return slot

    def _release(self, slot: int, *, measure: bool = True) -> None:
        since = self._held.pop(slot)
        if measure:
            held = self._clock() - since
            self._hold = held if self._hold is None else (1 - _ALPHA) * self._hold + _ALPHA * held
        # The slot goes straight to the oldest waiter still waiting: a newcomer
        # never finds it free in between.
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.done():
                waiter.set_result(self._take())
                break
        self._waiting_gauge.set(len(self._queue))
        self._running_gauge.set(len(self._held))

    def _why_refused(self, cap: float) -> tuple[str, str] | None:
        """Why a caller arriving now that may wait ``cap`` seconds is refused
        (the reason and the message), if it is."""
        if self.running < self.limit and not self._queue:
            return None
        position = len(self._queue)
        if position >= self.max_waiting:
            return "full", (
                f"the {self.name} service is at capacity ({self.running} {self.noun} running, "
                f"{position} waiting); retry later"
            )
        estimate = self.estimated_wait(position)
        if estimate is not None and estimate > cap:
            return "estimate", (
                f"the {self.name} service is at capacity ({self.running} {self.noun} running, "
                f"{position} waiting): a slot would take about {estimate:.1f} s, longer than "
                f"the {cap:.1f} s a request may wait; retry later"
            )
        return None

    def refusal(self) -> ResourceExhausted | None:
        """The refusal a caller arriving now would get whatever its budget, if any.

        A cheap check for a server to shed a call before doing any other work
        for it (decoding, authentication): every slot is held and the queue is
        full, or the wait would be longer than ``max_wait_seconds``. A call it
        lets through may still be refused by ``slot`` for its own budget.

        Not a probe: a refusal it returns is counted as shed (reason ``door``).
        Its message says no more than that the service is at capacity, since
        the caller may not have been identified yet; the counts and the
        estimate that ``slot``'s refusals give stay out of it.
        """
        if self._why_refused(self.max_wait_seconds) is None:
            return None
        return self._refuse("door", f"the {self.name} service is at capacity; retry later")

    async def _wait(self, budget_seconds: float) -> int:
        """Queue for a slot; returns the slot handed over."""
        share = budget_seconds * self.budget_share
        refused = self._why_refused(min(self.max_wait_seconds, share))
        if refused is not None:
            raise self._refuse(*refused)
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append(waiter)
        self._waiting_gauge.set(len(self._queue))
        # Admitted on an estimate within ``cap``; waits a little longer in fact.
        cap = min(self.max_wait_seconds * self.wait_grace, share)
        try:
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that
            # arrives with the slot, and a cancelled call would run on.
            async with asyncio.timeout(cap):
                return await waiter
        except (TimeoutError, asyncio.CancelledError) as exc:
            handed = waiter.done() and not waiter.cancelled()
            if handed and isinstance(exc, TimeoutError):
                return waiter.result()  # the slot arrived as the wait ran out: use it
            with contextlib.suppress(ValueError):
                self._queue.remove(waiter)
            self._waiting_gauge.set(len(self._queue))
            if handed:
                # Handed over as the waiter was cancelled: pass it on unused.
                self._release(waiter.result(), measure=False)
            if isinstance(exc, asyncio.CancelledError):
                raise
            if cap >= budget_seconds:
                SHED.labels(self.name, "budget").inc()
                raise DeadlineExceeded(
                    f"the time budget ({budget_seconds:.1f} s) was spent waiting for one of "
                    f"the {self.limit} {self.name} slots"
                ) from None
            raise self._refuse(
                "queue_timeout",
                f"the {self.name} service is at capacity: no slot freed up within "
                f"{cap:.1f} s; retry later",
            ) from None

    @contextlib.asynccontextmanager
    async def slot(self, budget_seconds: float) -> AsyncIterator[float]:
        """Hold a slot for the block; yields the seconds spent waiting for it.

        Raises ResourceExhausted (with ``retry_after``) when the load is shed,
        DeadlineExceeded when ``budget_seconds`` ran out in the queue.
        """
        started = self._clock()
        if self.running < self.limit and not self._queue:
            slot = self._take()
        else:
            slot = await self._wait(budget_seconds)
        try:
            yield self._clock() - started
        finally:
            self._release(slot)
