"""Blocking calls on the event loop or on a thread, by their measured cost."""

from __future__ import annotations

import asyncio
import threading

import pytest

from attest.core.offload import Offloader, Offloaders


class FakeClock:
    """A clock that a call moves forward by the cost it is given."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def call(self, cost: float):
        def fn() -> str:
            self.now += cost
            return threading.current_thread().name

        return fn


async def test_the_first_call_runs_on_a_thread_and_cheap_calls_then_run_on_the_loop():
    clock = FakeClock()
    off = Offloader(0.002, clock=clock)
    loop_thread = threading.current_thread().name
    assert not off.inline
    assert await off.run(clock.call(0.0005)) != loop_thread
    assert off.mean_seconds == pytest.approx(0.0005)
    assert off.inline
    for _ in range(5):
        assert await off.run(clock.call(0.0005)) == loop_thread
    assert (off.thread_calls, off.inline_calls) == (1, 5)


async def test_a_kind_that_grows_past_the_budget_moves_to_threads_and_back():
    clock = FakeClock()
    off = Offloader(0.002, clock=clock, weight=0.5)
    loop_thread = threading.current_thread().name
    await off.run(clock.call(0.001))
    assert off.inline
    # One slow call runs on the loop (its cost is not known before it runs) ...
    assert await off.run(clock.call(0.010)) == loop_thread
    # ... and moves the estimate past the budget: the next ones go to a thread.
    assert off.mean_seconds == pytest.approx(0.0055)
    assert off.estimate_seconds == pytest.approx(0.0055 + 2 * 0.0045)
    assert not off.inline
    assert await off.run(clock.call(0.001)) != loop_thread
    # Cheap again: measured on the thread, the mean falls back under the budget.
    while not off.inline:
        await off.run(clock.call(0.001))
    assert await off.run(clock.call(0.001)) == loop_thread


async def test_a_budget_of_zero_always_uses_a_thread():
    clock = FakeClock()
    off = Offloader(0.0, clock=clock)
    loop_thread = threading.current_thread().name
    for _ in range(3):
        assert await off.run(clock.call(0.0)) != loop_thread
    assert off.inline_calls == 0


async def test_a_failing_call_raises_where_it_runs_and_is_still_measured():
    clock = FakeClock()
    off = Offloader(0.002, clock=clock)

    def boom() -> None:
        clock.now += 0.001
        raise ValueError("bad query")

    with pytest.raises(ValueError, match="bad query"):
        await off.run(boom)  # on a thread
    assert off.mean_seconds == pytest.approx(0.001)
    with pytest.raises(ValueError, match="bad query"):
        await off.run(boom)  # on the loop
    assert off.inline_calls == 1


async def test_inline_calls_keep_the_callers_context():
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    off = Offloader(1.0)
    var.set("request-7")
    seen = [await off.run(var.get) for _ in range(3)]  # a thread, then the loop
    assert seen == ["request-7"] * 3
    assert off.inline_calls == 2


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="budget"):
        Offloader(-1)
    with pytest.raises(ValueError, match="weight"):
        Offloader(weight=0)


async def test_concurrent_callers_on_threads_all_get_their_results():
    off = Offloader(0.0)
    results = await asyncio.gather(*(off.run(lambda i=i: i * i) for i in range(32)))
    assert results == [i * i for i in range(32)]


async def test_a_kind_with_rare_slow_calls_stays_on_threads_though_its_mean_is_short():
    """Nine calls of 0.3 ms and one of 15 ms average 1.77 ms, under a 2 ms budget;
    the slow one would hold the loop 15 ms, so the spread keeps them on threads."""
    clock = FakeClock()
    off = Offloader(0.002, clock=clock)
    for _ in range(30):
        for cost in [0.0003] * 9 + [0.015]:
            await off.run(clock.call(cost))
    assert off.mean_seconds is not None
    assert off.mean_seconds < 0.004
    assert not off.inline
    assert off.inline_calls < off.thread_calls / 5


async def test_offloaders_keep_one_measurement_per_kind():
    clock = FakeClock()
    family: Offloaders[str] = Offloaders(0.002, clock=clock)
    loop_thread = threading.current_thread().name
    await family.run("cheap", clock.call(0.0005))
    await family.run("dear", clock.call(0.05))
    assert await family.run("cheap", clock.call(0.0005)) == loop_thread
    assert await family.run("dear", clock.call(0.0005)) != loop_thread
    assert family["cheap"] is family["cheap"]
    with pytest.raises(ValueError, match="budget"):
        Offloaders(-1)
