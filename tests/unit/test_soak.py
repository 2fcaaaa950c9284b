"""The soak's mix, dealing, documents, percentiles and verdict, on made-up calls."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter

import pytest

from loadtest.soak import (
    Call,
    Dealer,
    Documents,
    Sample,
    SoakError,
    descendants,
    format_minute,
    parse_mix,
    parse_watch,
    percentile,
    read_process,
    read_tree_rss,
    start_time,
    summarize,
    verdict,
)

KINDS = ["ask", "stream", "ingest", "delete"]


def test_parse_mix_reads_weights_and_explains_mistakes() -> None:
    assert parse_mix("ask=6, stream=2,ingest=1,delete=1") == {
        "ask": 6,
        "stream": 2,
        "ingest": 1,
        "delete": 1,
    }
    assert parse_mix("ask=1") == {"ask": 1, "stream": 0, "ingest": 0, "delete": 0}
    with pytest.raises(SoakError, match="KIND=WEIGHT with KIND one of ask, stream"):
        parse_mix("search=1")
    with pytest.raises(SoakError, match="whole number"):
        parse_mix("ask=x")
    with pytest.raises(SoakError, match="0 or more"):
        parse_mix("ask=-1")
    with pytest.raises(SoakError, match="at least one kind"):
        parse_mix("ask=0")


def test_dealer_keeps_every_window_in_proportion() -> None:
    dealer = Dealer(parse_mix("ask=6,stream=2,ingest=1,delete=1"))
    dealt = [dealer.next() for _ in range(100)]
    for start in range(0, 100, 10):
        assert Counter(dealt[start : start + 10]) == {
            "ask": 6,
            "stream": 2,
            "ingest": 1,
            "delete": 1,
        }
    small = Dealer(parse_mix("ask=2,stream=1,ingest=1,delete=1"))
    assert sorted(small.next() for _ in range(4)) == sorted(KINDS)


def test_documents_add_new_ids_revise_live_ones_and_stay_bounded() -> None:
    docs = Documents("r", max_live=4, rng=random.Random(1))
    first = docs.batch(2)
    assert [i.document.id for i in first] == ["soak-r-0", "soak-r-1"]
    assert all(i.document.title.endswith("(revision 1)") for i in first)
    docs.live.update(i.document.id for i in first)
    seen_revision_2 = False
    for _ in range(20):
        batch = docs.batch(2)
        ids = [i.document.id for i in batch]
        assert len(set(ids)) == 2
        docs.live.update(ids)
        seen_revision_2 |= any("Revision 2 of this report" in i.document.body for i in batch)
    assert seen_revision_2
    assert len(docs.live) == 4  # new ids stop at --max-live; later batches re-ingest
    taken = docs.take()
    assert taken not in docs.live
    for _ in range(3):
        docs.take()
    assert docs.take() == "soak-r-absent"


def test_percentile_is_nearest_rank() -> None:
    values = list(range(1, 101))
    assert percentile(values, 50) == 50
    assert percentile(values, 99) == 99
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def _steady(kind: str, seconds: float, until: float, every: float = 1.0) -> list[Call]:
    return [Call(kind, t, seconds, "OK") for t in _times(every, until)]


def _times(every: float, until: float) -> list[float]:
    n = int(until / every)
    return [every * (i + 1) for i in range(n)]


def _samples(rss: list[int], every: float = 10.0) -> list[Sample]:
    return [Sample(i * every, r, 30) for i, r in enumerate(rss)]


def test_verdict_passes_a_steady_run() -> None:
    calls = [c for k in KINDS for c in _steady(k, 0.5, 1200)]
    samples = _samples([1000] * 121)
    result = verdict(calls, samples, KINDS, 1200, 60, 5)
    assert result["window_seconds"] == 300
    assert result["warmup_seconds"] == 60
    assert result["passed"] is True
    assert result["checks"]["rss_growth"]["growth"] == 0
    assert result["checks"]["p99_drift"]["kinds"]["ask"]["ratio"] == 1.0


def test_verdict_misses_each_target() -> None:
    duration = 1200.0
    # p99 of ask grows from 0.5 s to 1 s in the last 5 minutes: 2x, over 1.5x
    asks = [Call("ask", t, 1.0 if t >= 900 else 0.5, "OK") for t in _times(1, duration)]
    others = [c for k in ("stream", "ingest") for c in _steady(k, 0.5, duration)]
    failed = [Call("ask", 100, 0.1, "INTERNAL"), Call("ask", 200, 0.1, "UNAVAILABLE")]
    # RSS: 1000 at minute 5, up to 1150 in the last 5 minutes (+15 %)
    rss = [1000] * 31 + [1100] * 60 + [1150] * 30
    result = verdict(asks + others + failed, _samples(rss), KINDS, duration, 60, 5)
    checks = result["checks"]
    assert result["passed"] is False
    assert checks["no_unknown_internal"] == {
        "met": False,
        "counts": {"UNKNOWN": 0, "INTERNAL": 1},
    }
    assert checks["rss_growth"]["met"] is False
    assert checks["rss_growth"]["growth"] == pytest.approx(0.15)
    assert checks["p99_drift"]["kinds"]["ask"]["ratio"] == 2.0
    assert checks["p99_drift"]["met"] is False
    assert checks["every_kind_succeeded"] == {
        "met": False,
        "ok": {"ask": 1200, "stream": 1200, "ingest": 1200, "delete": 0},
    }


def test_short_run_uses_fifths_and_leaves_thin_or_unmeasured_figures_unjudged() -> None:
    calls = _steady("ask", 0.2, 50, every=5) + _steady("stream", 0.2, 50)
    result = verdict(calls, [Sample(1, None, None)], ["ask", "stream"], 50, 60, 5)
    assert result["window_seconds"] == 10  # a fifth of 50 s
    assert result["warmup_seconds"] == 5  # at most half the window
    assert result["checks"]["rss_growth"]["met"] is None
    assert result["checks"]["p99_drift"]["kinds"]["ask"]["met"] is None  # 1 call per window
    assert result["checks"]["p99_drift"]["kinds"]["stream"]["met"] is True
    assert result["passed"] is True


def test_summary_and_minute_line_mark_unknown_and_internal() -> None:
    calls = [
        Call("ask", 1, 0.1, "OK"),
        Call("ask", 2, 0.3, "OK"),
        Call("ask", 3, 5.0, "DEADLINE_EXCEEDED"),
        Call("ingest", 4, 1.0, "UNKNOWN"),
        Call("ingest", 5, 1.0, "OK", failed_items=1),
    ]
    row = {"minute": 1, **summarize(calls, ["ask", "ingest"])}
    assert row["requests"] == 5
    assert row["errors"] == {"DEADLINE_EXCEEDED": 1, "UNKNOWN": 1}
    assert row["unknown_internal"] == 1
    assert row["failed_items"] == 1
    assert row["kinds"]["ask"] == {
        "requests": 3,
        "ok": 2,
        "errors": {"DEADLINE_EXCEEDED": 1},
        "p50_ms": 100.0,
        "p99_ms": 300.0,
    }
    line = format_minute(row | {"rss_bytes": None, "open_files": None}, ["ask", "ingest"])
    assert line.startswith("!! ")
    assert "UNKNOWN 1" in line
    assert "rss n/a" in line


def test_parse_watch_reads_names_and_pids_and_explains_mistakes() -> None:
    assert parse_watch(["worker-text=12", " worker-index = 34"]) == {
        "worker-text": 12,
        "worker-index": 34,
    }
    assert parse_watch([]) == {}
    for bad in ("12", "worker=", "=12", "worker=x"):
        with pytest.raises(SoakError, match="give NAME=PID"):
            parse_watch([bad])
    with pytest.raises(SoakError, match="twice"):
        parse_watch(["w=1", "w=2"])


def test_a_watched_tree_sums_the_process_and_its_descendants() -> None:
    # A child that starts a grandchild and both sleep: the tree of the child is both.
    code = (
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(30)']); print('up', flush=True); time.sleep(30)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "up"
        (grandchild,) = descendants(child.pid)
        assert child.pid in descendants(os.getpid())
        assert grandchild in descendants(os.getpid())
        own, below = read_process(child.pid)[0], read_process(grandchild)[0]
        assert own is not None
        assert below is not None
        total = read_tree_rss(child.pid)
        assert total is not None
        # pages come and go between the reads: within a few MiB of the sum
        assert abs(total - (own + below)) < 4 << 20
        assert total > own
    finally:
        for pid in descendants(child.pid):
            os.kill(pid, 9)
        child.kill()
        child.wait()
    assert read_tree_rss(child.pid) is None


def test_a_watched_pid_is_read_only_while_it_is_the_process_it_was() -> None:
    started = start_time(os.getpid())
    assert started is not None
    assert read_tree_rss(os.getpid(), started) is not None
    # the same pid with another start time: a later process that took the pid
    assert read_tree_rss(os.getpid(), started + 1) is None
    assert start_time(2**22 + 1) is None


def test_a_watched_process_that_exits_during_the_run_misses_its_target() -> None:
    calls = [c for k in KINDS for c in _steady(k, 0.5, 1200)]
    samples = [Sample(i * 10.0, 1000, 30, {"worker": 500 if i <= 30 else None}) for i in range(121)]
    worker = verdict(calls, samples, KINDS, 1200, 60, 5)["checks"]["watched_rss_growth"]
    assert worker["met"] is False
    assert worker["processes"]["worker"]["met"] is False
    assert "from 310 s on: it exited" in worker["processes"]["worker"]["reason"]
    # a read that failed once in the middle is not an exit
    samples[50].watched["worker"] = None
    for s in samples[31:]:
        s.watched["worker"] = 500
    assert verdict(calls, samples, KINDS, 1200, 60, 5)["checks"]["watched_rss_growth"]["met"]


def test_verdict_judges_each_watched_process() -> None:
    calls = [c for k in KINDS for c in _steady(k, 0.5, 1200)]
    samples = [
        Sample(i * 10.0, 1000, 30, {"worker": 500 if i <= 60 else 600, "idle": 200, "gone": None})
        for i in range(121)
    ]
    result = verdict(calls, samples, KINDS, 1200, 60, 5)
    watched = result["checks"]["watched_rss_growth"]
    assert watched["met"] is False
    assert watched["processes"]["worker"]["growth"] == pytest.approx(0.2)
    assert watched["processes"]["worker"]["met"] is False
    assert watched["processes"]["idle"]["met"] is True
    assert watched["processes"]["gone"]["met"] is None
    assert result["checks"]["rss_growth"]["met"] is True
    assert result["passed"] is False
    # without --watch the check is not there at all
    assert (
        "watched_rss_growth"
        not in verdict(calls, _samples([1000] * 121), KINDS, 1200, 60, 5)["checks"]
    )
