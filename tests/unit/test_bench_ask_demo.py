"""loadtest/bench_ask_demo.py's statistics, order of servers, targets and arguments."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from loadtest.bench_ask_demo import (
    demo_questions,
    first_over_warm,
    ingest_counts,
    latency_summary,
    parse_args,
    ratios,
    round_order,
    verdict,
)


def test_latency_summary_is_nearest_rank_in_ms() -> None:
    out = latency_summary([0.4, 0.1, 0.3, 0.2, 1.0])
    assert out["p50_ms"] == pytest.approx(300)
    assert out["p95_ms"] == pytest.approx(1000)
    assert out["mean_ms"] == pytest.approx(400)
    assert latency_summary([]) == {}


def test_servers_take_turns_going_first() -> None:
    names = ["this", "baseline"]
    assert [round_order(names, r) for r in range(3)] == [
        ["this", "baseline"],
        ["baseline", "this"],
        ["this", "baseline"],
    ]
    assert round_order(["this"], 1) == ["this"]


def test_first_over_warm_and_ratios() -> None:
    assert first_over_warm({"first_ms": 1500.0}, {"p50_ms": 1000.0}) == pytest.approx(1.5)
    assert first_over_warm({"statuses": ["UNAVAILABLE"]}, {"p50_ms": 1000.0}) is None
    assert first_over_warm({"first_ms": 1500.0}, {}) is None
    this = {"p50_ms": 900.0, "p95_ms": 1200.0, "mean_ms": 1000.0}
    assert ratios(this, {"p50_ms": 1000.0, "p95_ms": 1000.0}) == pytest.approx(
        {"p50": 0.9, "p95": 1.2}
    )


def server(
    p50_ms: float, first_ms: float, statuses: dict[str, int] | None = None
) -> dict[str, Any]:
    warm = {"p50_ms": p50_ms, "statuses": statuses or {"OK": 19}}
    first = {"first_ms": first_ms, "statuses": ["OK"] * 4}
    return {"warm": warm, "first_ask": first, "first_over_warm_p50": first_ms / p50_ms}


def test_verdict_names_each_missed_target() -> None:
    assert verdict(server(800, 1500), 1.0, 2.0) == []
    assert verdict(server(1100, 1500), 1.0, 2.0) == ["warm p50 1.10 s > 1.00 s"]
    assert verdict(server(800, 1700), 1.0, 2.0) == ["first Ask / warm p50 2.12x > 2.0x"]
    failed = verdict(server(800, 900, {"OK": 18, "DEADLINE_EXCEEDED": 1}), 1.0, 2.0)
    assert len(failed) == 1
    assert "DEADLINE_EXCEEDED" in failed[0]
    nothing: dict[str, Any] = {
        "warm": {"statuses": {"UNAVAILABLE": 19}},
        "first_ask": {"statuses": ["UNAVAILABLE"]},
        "first_over_warm_p50": None,
    }
    assert len(verdict(nothing, 1.0, 2.0)) == 3


def test_ingest_counts_reads_the_last_summary_line() -> None:
    text = (
        "ingesting: 100%|██| 48/48\njob 548a: DONE\n"
        "  received 48  ingested 48  updated 0  unchanged 0  failed 0  passages 54\n"
    )
    assert ingest_counts(text) == {
        "received": 48,
        "ingested": 48,
        "updated": 0,
        "unchanged": 0,
        "failed": 0,
        "passages": 54,
    }
    assert ingest_counts("nothing to ingest") == {}


def test_demo_questions_answerable_first() -> None:
    questions = demo_questions()
    assert len(questions) == len(set(questions)) >= 2
    assert questions[0].startswith("What were Norvale Copper's")


def test_arguments_are_checked(tmp_path: Path) -> None:
    args = parse_args([])
    assert (args.rounds, args.p50_target, args.first_target, args.baseline) == (3, 1.0, 2.0, None)
    with pytest.raises(SystemExit):
        parse_args(["--rounds", "0"])
    with pytest.raises(SystemExit):
        parse_args(["--baseline", str(tmp_path)])  # no .venv there
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").touch()
    assert parse_args(["--baseline", str(tmp_path)]).baseline == tmp_path
