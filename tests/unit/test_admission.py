"""The limiter behind admission control: slots, a short bounded queue, early shedding."""

from __future__ import annotations

import asyncio

import pytest

from attest.core.admission import SHED, Limiter
from attest.core.errors import DeadlineExceeded, ResourceExhausted


class Clock:
    """A clock the test moves by hand (the estimates read it; asyncio's timeouts do not)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def hold(limiter: Limiter, release: asyncio.Event, order: list[str], name: str) -> float:
    async with limiter.slot(10.0) as waited:
        order.append(name)
        await release.wait()
    return waited


async def started(limiter: Limiter, release: asyncio.Event, name: str = "a") -> asyncio.Task[float]:
    task = asyncio.create_task(hold(limiter, release, [], name))
    await asyncio.sleep(0)
    return task


async def teach(limiter: Limiter, clock: Clock, seconds: float) -> None:
    """One slot held for ``seconds`` (by ``clock``): the limiter's typical hold time."""
    release = asyncio.Event()
    first = await started(limiter, release)
    clock.now += seconds
    release.set()
    await first


async def test_a_full_queue_is_resource_exhausted_at_once_with_a_retry_hint() -> None:
    limiter = Limiter("answer", 1, 0, 5.0, noun="answers")
    release = asyncio.Event()
    first = await started(limiter, release)
    with pytest.raises(
        ResourceExhausted, match=r"at capacity \(1 answers running, 0 waiting\)"
    ) as err:
        async with limiter.slot(10.0):
            pass
    # Nothing measured yet: the default hint.
    assert err.value.retry_after == 1.0
    release.set()
    assert await first == pytest.approx(0.0, abs=0.01)
    assert (limiter.running, limiter.waiting) == (0, 0)


async def test_waiters_get_slots_in_arrival_order_and_nobody_overtakes() -> None:
    limiter = Limiter("answer", 1, 5, 5.0)
    gates = [asyncio.Event() for _ in range(3)]
    order: list[str] = []
    tasks = []
    for name, gate in zip("abc", gates, strict=True):
        tasks.append(asyncio.create_task(hold(limiter, gate, order, name)))
        await asyncio.sleep(0)
    assert (order, limiter.running, limiter.waiting) == (["a"], 1, 2)
    gates[0].set()
    await asyncio.sleep(0)
    # The slot went straight to b: a newcomer arriving now queues behind c.
    assert (limiter.running, limiter.waiting) == (1, 1)
    late = asyncio.create_task(hold(limiter, gates[2], order, "d"))
    gates[1].set()
    gates[2].set()
    await asyncio.gather(*tasks, late)
    assert order == ["a", "b", "c", "d"]
    assert (limiter.running, limiter.waiting) == (0, 0)


async def test_a_released_slot_is_never_taken_twice() -> None:
    limiter = Limiter("answer", 2, 10, 5.0)
    peak = 0

    async def work() -> None:
        nonlocal peak
        async with limiter.slot(10.0):
            peak = max(peak, limiter.running)
            await asyncio.sleep(0)

    await asyncio.gather(*(work() for _ in range(12)))
    assert peak == 2
    assert (limiter.running, limiter.waiting) == (0, 0)


async def test_a_wait_past_the_whole_budget_is_deadline_exceeded() -> None:
    limiter = Limiter("answer", 1, 1, 5.0)
    release = asyncio.Event()
    first = await started(limiter, release)
    with pytest.raises(DeadlineExceeded, match="waiting for one of the 1 answer slots"):
        async with limiter.slot(0.02):
            pass
    assert limiter.waiting == 0
    release.set()
    await first


async def test_a_wait_past_the_queue_limit_is_resource_exhausted_not_a_timeout() -> None:
    # The limiter's own cap (or a share of the budget) ran out: the caller
    # still has time, so it is told to retry rather than that time is up.
    for limiter, budget in (
        (Limiter("answer", 1, 1, 0.02), 10.0),
        (Limiter("answer", 1, 1, 5.0, budget_share=0.5), 0.04),
    ):
        release = asyncio.Event()
        first = await started(limiter, release)
        with pytest.raises(ResourceExhausted, match="no slot freed up within") as err:
            async with limiter.slot(budget):
                pass
        assert err.value.retry_after is not None
        assert err.value.retry_after > 0
        assert limiter.waiting == 0
        release.set()
        await first


async def test_an_admitted_waiter_is_served_within_its_grace() -> None:
    # Admitted to the queue (nothing measured yet, so no estimate refuses it),
    # the waiter outlasts max_wait_seconds (0.05 s) but not three times that:
    # it gets the slot instead of a late refusal; past the grace it is refused.
    for release_after, served in ((0.09, True), (0.4, False)):
        limiter = Limiter("answer", 1, 1, 0.05, wait_grace=3.0)
        release = asyncio.Event()
        first = await started(limiter, release)
        asyncio.get_running_loop().call_later(release_after, release.set)
        if served:
            async with limiter.slot(10.0) as waited:
                assert 0.05 < waited < 0.15
        else:
            with pytest.raises(ResourceExhausted, match="no slot freed up within"):
                async with limiter.slot(10.0):
                    pass
        await first
        assert limiter.waiting == 0


async def test_a_wait_estimated_past_the_cap_is_refused_at_once() -> None:
    clock = Clock()
    limiter = Limiter("answer", 2, 4, 6.0, clock=clock)
    # One answer held for 10 s teaches the limiter the typical hold time.
    await teach(limiter, clock, 10.0)
    assert limiter.typical_hold_seconds == 10.0

    release = asyncio.Event()
    running = [await started(limiter, release, name) for name in "ab"]
    clock.now += 2.0  # about 8 s left of either answer: over the 6 s cap
    with pytest.raises(ResourceExhausted, match=r"about 8\.0 s, longer than the 6\.0 s") as err:
        async with limiter.slot(60.0):
            pass
    assert err.value.retry_after == pytest.approx(8.0)
    assert limiter.waiting == 0

    clock.now += 5.0  # about 3 s left, but one slot frees per 5 s on average
    assert limiter.estimated_wait(0) == pytest.approx(5.0)
    gate = asyncio.Event()
    queued = asyncio.create_task(hold(limiter, gate, [], "c"))
    await asyncio.sleep(0)
    assert limiter.waiting == 1
    # Behind it, a second waiter needs the second slot to free up: 10 s at that pace.
    with pytest.raises(ResourceExhausted, match=r"about 10\.0 s"):
        async with limiter.slot(60.0):
            pass

    clock.now += 13.0  # both answers overdue: still not "any moment now"
    assert limiter.estimated_wait(0) == pytest.approx(5.0)
    # A refused caller is told to come back once the queued one has its slot too.
    assert limiter.retry_after() == pytest.approx(10.0)
    release.set()
    gate.set()
    await asyncio.gather(*running, queued)


async def test_refusal_says_at_arrival_what_slot_would_refuse_whatever_the_budget() -> None:
    limiter = Limiter("answer", 1, 1, 8.0)
    assert limiter.refusal() is None  # a free slot
    release = asyncio.Event()
    first = await started(limiter, release)
    # Every slot held, room in the queue and no estimate yet: a caller may wait.
    assert limiter.refusal() is None
    queued = await started(limiter, release, "b")
    door = SHED.labels("answer", "door")
    before = door._value.get()
    refused = limiter.refusal()  # the queue is full
    assert refused is not None
    # The door says no more than that: the caller may not be identified yet.
    assert refused.details == "the answer service is at capacity; retry later"
    # Nothing measured: a default second per round, the holder's and the waiter's.
    assert refused.retry_after == 2.0
    assert door._value.get() == before + 1
    release.set()
    await asyncio.gather(first, queued)

    clock = Clock()
    limiter = Limiter("answer", 1, 2, 8.0, clock=clock)
    await teach(limiter, clock, 7.0)  # slots are held 7 s
    release = asyncio.Event()
    first = await started(limiter, release)
    # A wait of about 7 s is within the 8 s any caller may wait: left to
    # slot, which refuses it to a caller whose budget is shorter ...
    assert limiter.refusal() is None
    with pytest.raises(ResourceExhausted, match=r"about 7\.0 s, longer than the 5\.0 s"):
        async with limiter.slot(5.0):
            pass
    # ... and the wait behind a queued caller, about 14 s, is over it for every caller.
    queued = await started(limiter, release, "b")
    assert limiter.estimated_wait(1) == pytest.approx(14.0)
    refused = limiter.refusal()
    assert refused is not None
    assert refused.retry_after == pytest.approx(14.0)
    release.set()
    await asyncio.gather(first, queued)


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    limiter = Limiter("answer", 1, 1, 5.0)
    release = asyncio.Event()
    first = await started(limiter, release)
    waiter = await started(limiter, release, "b")
    assert limiter.waiting == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert limiter.waiting == 0
    release.set()
    await first
    assert limiter.running == 0


async def test_a_slot_handed_to_a_waiter_cancelled_before_it_ran_is_passed_on() -> None:
    limiter = Limiter("answer", 1, 2, 5.0)
    order: list[str] = []
    held = limiter.slot(10.0)
    await held.__aenter__()
    b = asyncio.create_task(hold(limiter, asyncio.Event(), order, "b"))
    c = asyncio.create_task(hold(limiter, asyncio.Event(), order, "c"))
    await asyncio.sleep(0)
    assert limiter.waiting == 2
    await held.__aexit__(None, None, None)  # hands the slot to b, which has not run yet ...
    b.cancel()  # ... and never will
    with pytest.raises(asyncio.CancelledError):
        await b
    await asyncio.sleep(0)
    assert order == ["c"]
    assert (limiter.running, limiter.waiting) == (1, 0)
    c.cancel()
    with pytest.raises(asyncio.CancelledError):
        await c
    assert (limiter.running, limiter.waiting) == (0, 0)


async def test_a_cancelled_holder_gives_its_slot_back() -> None:
    limiter = Limiter("answer", 1, 0, 5.0)
    holder = await started(limiter, asyncio.Event())
    assert limiter.running == 1
    holder.cancel()
    with pytest.raises(asyncio.CancelledError):
        await holder
    assert limiter.running == 0
    async with limiter.slot(1.0) as waited:
        assert waited == pytest.approx(0.0, abs=0.01)


def test_settings_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="limit >= 1"):
        Limiter("x", 0, 1, 1.0)
    with pytest.raises(ValueError, match="budget_share"):
        Limiter("x", 1, 1, 1.0, budget_share=0)
    with pytest.raises(ValueError, match="wait_grace"):
        Limiter("x", 1, 1, 1.0, wait_grace=0.5)


async def test_retry_after_grows_with_the_queue() -> None:
    clock = Clock()
    limiter = Limiter("answer", 2, 8, 60.0, clock=clock)
    await teach(limiter, clock, 4.0)  # slots are held 4 s: one frees every 2 s
    release = asyncio.Event()

    async def patient() -> None:
        async with limiter.slot(100.0):
            await release.wait()

    async def arrive() -> asyncio.Task[None]:
        task = asyncio.create_task(patient())
        await asyncio.sleep(0)
        return task

    tasks = [await arrive(), await arrive()]
    hints = [limiter.retry_after()]
    for _ in range(6):
        tasks.append(await arrive())
        hints.append(limiter.retry_after())
    assert limiter.waiting == 6
    # Both holders free their slots in 4 s, then each pair of waiters holds the
    # two slots 4 s more: the hint steps up by 4 s per 2 waiters ahead.
    assert hints == pytest.approx([4.0, 4.0, 8.0, 8.0, 12.0, 12.0, 16.0])
    limiter.max_waiting = 6
    refused = limiter.refusal()
    assert refused is not None
    assert refused.retry_after == pytest.approx(16.0)
    release.set()
    await asyncio.gather(*tasks)
