"""What the support judge and abstention cost inside extractive ``Ask``.

RGB's 100 questions are pooled into one corpus and asked through the answer
service (``attest eval qa --pooled``'s path: an embedded stack in this
process, ``AskStream``, extractive generation, 10 sources). In the same run
the time spent inside the support judge (``SupportJudge.judge``: the features
of every sentence against every source, both logistic models, the answer
floor) and inside the withdrawal check (``judge.grounded``) is summed beside
each answer's own total, so the share needs no second build to compare with:
it is the time these steps add to an answer that would otherwise be the same.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 uv run python loadtest/bench_judge.py

writes ``loadtest/reports/judge.json``. ``--limit N`` asks the first N
questions only (every passage is still ingested).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
RGB = ROOT.parent / "shared" / "data" / "qa" / "rgb_en_fact" / "en_fact.json"
REPORT = ROOT / "loadtest" / "reports" / "judge.json"
TARGET_SHARE = 0.20

F = TypeVar("F", bound=Callable[..., Any])


class Stopwatch:
    """Seconds spent inside the wrapped functions, from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def wrap(self, name: str, fn: F) -> F:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - began
                with self._lock:
                    self.seconds[name] = self.seconds.get(name, 0.0) + spent
                    self.calls[name] = self.calls.get(name, 0) + 1

        return timed  # type: ignore[return-value]

    def total(self) -> float:
        with self._lock:
            return sum(self.seconds.values())


def summarize(answer_seconds: list[float], watch: Stopwatch) -> dict[str, Any]:
    """The judge's share of the answers' time, overall and per step."""
    total = sum(answer_seconds)
    spent = watch.total()
    share = spent / total if total else 0.0
    return {
        "answers": len(answer_seconds),
        "ask_seconds_total": total,
        "ask_seconds_p50": statistics.median(answer_seconds) if answer_seconds else None,
        "judge_seconds_total": spent,
        "judge_share_of_ask": share,
        "by_step": {
            name: {"seconds": s, "calls": watch.calls[name], "share_of_ask": s / total}
            for name, s in sorted(watch.seconds.items())
        }
        if total
        else {},
        "target": f"<= {TARGET_SHARE:.0%} of extractive Ask time",
        "met": share <= TARGET_SHARE,
    }


def main() -> int:
    from attest.evaluation.pooled import run_pooled
    from attest.evaluation.qa import QAItem, convert_rgb, load_qa
    from attest.generate import judge, pipeline

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, default=RGB, help="RGB's en_fact.json")
    parser.add_argument("--limit", type=int, help="ask the first N questions only")
    parser.add_argument("--output", type=Path, default=REPORT)
    args = parser.parse_args()

    watch = Stopwatch()
    # Ingesting never calls the judge: what is summed is the answers' alone.
    judge.SupportJudge.judge = watch.wrap("support_judge", judge.SupportJudge.judge)  # type: ignore[method-assign]
    # The pipeline imported ``grounded`` by name: wrap the name it calls.
    pipeline.grounded = watch.wrap("withdrawal_check", judge.grounded)  # type: ignore[attr-defined]

    with tempfile.TemporaryDirectory(prefix="attest-bench-judge-") as tmp:
        qa = Path(tmp) / "rgb.jsonl"
        qa.write_text("".join(json.dumps(line) + "\n" for line in convert_rgb(args.dataset)))
        items: list[QAItem] = load_qa(qa)
        asked = items[: args.limit] if args.limit else items
        answers = asyncio.run(
            run_pooled(
                items,
                Path(tmp) / "data",
                top_k=10,
                echo=lambda line: print(line, file=sys.stderr),
                asked=asked,
            )
        )
    report = {
        "dataset": str(args.dataset),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        **summarize([a.seconds for a in answers], watch),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"{report['answers']} answers, Ask p50 {report['ask_seconds_p50']:.2f} s; "
        f"support judge and withdrawal check {report['judge_seconds_total']:.1f} s of "
        f"{report['ask_seconds_total']:.1f} s = {report['judge_share_of_ask']:.1%} "
        f"({'met' if report['met'] else 'MISS'} {report['target']})"
    )
    for name, step in report["by_step"].items():
        seconds, calls, share = step["seconds"], step["calls"], step["share_of_ask"]
        print(f"  {name}: {seconds:.1f} s in {calls} calls, {share:.1%}")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
