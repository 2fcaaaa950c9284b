"""The judge benchmark's arithmetic: time inside wrapped functions, summed from
any thread, and its share of the answers' time."""

from __future__ import annotations

import threading
import time

import pytest

from loadtest.bench_judge import Stopwatch, summarize


def test_the_stopwatch_sums_calls_from_every_thread_and_passes_results_on() -> None:
    watch = Stopwatch()

    def work(x: int) -> int:
        time.sleep(0.01)
        return 2 * x

    timed = watch.wrap("judge", work)
    threads = [threading.Thread(target=timed, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert timed(21) == 42
    assert watch.calls == {"judge": 5}
    assert watch.seconds["judge"] >= 0.05


def test_an_exception_is_timed_and_raised() -> None:
    watch = Stopwatch()

    def broken() -> None:
        raise ValueError("bad input")

    with pytest.raises(ValueError, match="bad input"):
        watch.wrap("judge", broken)()
    assert watch.calls == {"judge": 1}


def test_the_share_is_the_judges_seconds_over_the_answers() -> None:
    watch = Stopwatch()
    watch.seconds = {"support_judge": 1.5, "withdrawal_check": 0.5}
    watch.calls = {"support_judge": 10, "withdrawal_check": 10}
    report = summarize([2.0, 4.0, 4.0], watch)
    assert report["judge_share_of_ask"] == pytest.approx(0.2)
    assert report["met"]
    assert report["ask_seconds_p50"] == 4.0
    assert report["by_step"]["support_judge"]["share_of_ask"] == pytest.approx(0.15)
    watch.seconds["support_judge"] = 3.0
    assert not summarize([2.0, 4.0, 4.0], watch)["met"]
