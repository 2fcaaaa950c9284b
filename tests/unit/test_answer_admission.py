"""Admission control of the answer service: slots, a bounded wait, first come first served."""

from __future__ import annotations

import asyncio

import pytest

from attest.answer.servicer import Admission
from attest.core.errors import DeadlineExceeded, ResourceExhausted


async def hold(admission: Admission, release: asyncio.Event, order: list[str], name: str) -> float:
    async with admission.slot(10.0) as waited:
        order.append(name)
        await release.wait()
    return waited


async def test_a_full_service_with_no_room_to_wait_is_resource_exhausted() -> None:
    admission = Admission(limit=1, waiting=0)
    release = asyncio.Event()
    first = asyncio.create_task(hold(admission, release, [], "a"))
    await asyncio.sleep(0.01)
    with pytest.raises(ResourceExhausted, match="at capacity \\(1 answers running, 0 waiting\\)"):
        async with admission.slot(10.0):
            pass
    release.set()
    assert await first == pytest.approx(0.0, abs=0.01)
    assert (admission.running, admission.waiting) == (0, 0)


async def test_waiters_get_slots_in_arrival_order_and_report_the_wait() -> None:
    admission = Admission(limit=1, waiting=5)
    gates = [asyncio.Event() for _ in range(3)]
    order: list[str] = []
    tasks = []
    for name, gate in zip("abc", gates, strict=True):
        tasks.append(asyncio.create_task(hold(admission, gate, order, name)))
        await asyncio.sleep(0.01)
    assert (order, admission.running, admission.waiting) == (["a"], 1, 2)
    await asyncio.sleep(0.05)
    gates[0].set()
    await asyncio.sleep(0.01)
    # A newcomer queues behind b and c even though it arrives as a slot frees.
    late = asyncio.create_task(hold(admission, gates[2], order, "d"))
    gates[1].set()
    gates[2].set()
    waited = await asyncio.gather(*tasks, late)
    assert order == ["a", "b", "c", "d"]
    assert waited[0] < 0.01
    assert waited[1] >= 0.05
    assert (admission.running, admission.waiting) == (0, 0)


async def test_a_wait_longer_than_the_budget_is_deadline_exceeded() -> None:
    admission = Admission(limit=1, waiting=1)
    release = asyncio.Event()
    first = asyncio.create_task(hold(admission, release, [], "a"))
    await asyncio.sleep(0.01)
    with pytest.raises(DeadlineExceeded, match="waiting for one of the 1 answer slots"):
        async with admission.slot(0.05):
            pass
    assert admission.waiting == 0
    release.set()
    await first


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    admission = Admission(limit=1, waiting=1)
    release = asyncio.Event()
    first = asyncio.create_task(hold(admission, release, [], "a"))
    await asyncio.sleep(0.01)
    waiter = asyncio.create_task(hold(admission, release, [], "b"))
    await asyncio.sleep(0.01)
    assert admission.waiting == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert admission.waiting == 0
    release.set()
    await first
    assert admission.running == 0
