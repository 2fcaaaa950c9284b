"""AnswerService.Ask over the bundled demo corpus, extractive, beside another commit.

The 48 ESG news articles of ``services/attest/demo/sample_corpus.jsonl`` are
ingested once, with this checkout (``attest ingest PATH --data-dir DIR``, the
pipeline in one process, no server); each server then gets its own copy of
that data directory (a data directory is locked by the process that uses it)
and runs as ``attest serve all --embedded --insecure-dev`` on a free port:
this checkout's and, with ``--baseline DIR``, the one of DIR (a checkout of
another commit with its own ``.venv``, e.g. ``git worktree add /tmp/base
HEAD~1 && (cd /tmp/base && uv sync)``). One server at a time is launched,
waited for (gRPC health SERVING; the seconds since launch are reported, to
about a second) and asked its first question, so no launch competes with
another server's load or first Ask. Then:

* the first Ask after SERVING, of the first demo question (``first_ask`` of
  ``bench_ask.py``: no call is made before it, so whatever it loads counts
  against it; the same question asked again once warm is reported too);
* ``--rounds`` (3) passes, one call at a time, over every labelled demo
  question (``questions.jsonl``, then ``unanswerable.jsonl``), each server in
  turn, which server goes first alternating from round to round so a machine
  that slows down or speeds up mid-run weighs on both;
* per server: p50, p95 and mean of the warm Asks (the passes), the first Ask
  and its ratio to the warm p50, SERVING time and the mean time of each
  stage; with a baseline, this checkout over the baseline (p50, p95, mean)
  and how many questions got the same answer text and citations from both in
  the last round.

Every call carries ``bench_ask``'s 300 s time budget (a 330 s deadline) and
``--top-k`` (3, as ``attest demo`` and ``attest eval demo`` ask; 0 keeps the
server's default) reranked sources; generation is extractive (no LLM is
configured for the servers: ``ATTEST_GENERATE_LLM__*`` is left out of their
environment).

    python loadtest/bench_ask_demo.py --baseline /tmp/base --rounds 3

Writes a table to stdout and JSON to loadtest/reports/ask-demo.json (with the
git revision of each side). Exits 1 when this checkout's warm p50 is over
``--p50-target`` seconds (1.0) or its first Ask over ``--first-target`` (2)
times that p50. Every server it started is stopped, on Ctrl-C and SIGTERM
too. A benchmark command, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadtest.bench_ask import (  # noqa: E402
    BUDGET_S,
    FIRST_ASK_TARGET,
    Call,
    ask,
    commit_of,
    compare_levels,
    first_ask,
    percentile,
    start_server,
    stop,
    summarize_level,
)
from loadtest.grpc_load import LoadTestError, wait_serving  # noqa: E402

REPORT = ROOT / "loadtest" / "reports" / "ask-demo.json"
DEMO = ROOT / "services" / "attest" / "demo"
CORPUS = DEMO / "sample_corpus.jsonl"
QUESTION_FILES = ("questions.jsonl", "unanswerable.jsonl")
P50_TARGET_S = 1.0
READY_S = 900


def demo_questions(demo: Path = DEMO) -> list[str]:
    """Every labelled demo question, ``questions.jsonl`` first."""
    out = []
    for name in QUESTION_FILES:
        for line in (demo / name).read_text(encoding="utf-8").splitlines():
            if line.strip():
                out.append(str(json.loads(line)["question"]))
    return out


def round_order(names: Sequence[str], round_index: int) -> list[str]:
    """The servers in the order they are asked in round ``round_index``: the
    first one first in even rounds, last in odd ones."""
    return list(names) if round_index % 2 == 0 else list(names)[::-1]


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50 and p95 (nearest rank) and mean of latencies in seconds, in ms."""
    if not seconds:
        return {}
    ms = [s * 1000 for s in seconds]
    return {
        "p50_ms": percentile(ms, 50),
        "p95_ms": percentile(ms, 95),
        "mean_ms": statistics.fmean(ms),
    }


def first_over_warm(first: dict[str, Any], warm: dict[str, Any]) -> float | None:
    """The first Ask over the warm p50; None when either is missing."""
    if "first_ms" not in first or not warm.get("p50_ms"):
        return None
    return float(first["first_ms"] / warm["p50_ms"])


def ratios(this: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """This checkout's warm latencies over the baseline's, where both have them."""
    return {
        key.removesuffix("_ms"): this[key] / base[key]
        for key in ("p50_ms", "p95_ms", "mean_ms")
        if this.get(key) and base.get(key)
    }


def verdict(server: dict[str, Any], p50_target_s: float, first_target: float) -> list[str]:
    """What this checkout's run misses of the targets (empty when it meets them)."""
    missed = []
    warm = server["warm"]
    if "p50_ms" not in warm:
        missed.append(f"no warm Ask succeeded: {warm['statuses']}")
    elif warm["p50_ms"] / 1000 > p50_target_s:
        missed.append(f"warm p50 {warm['p50_ms'] / 1000:.2f} s > {p50_target_s:.2f} s")
    ratio = server.get("first_over_warm_p50")
    if ratio is None:
        missed.append(f"first Ask failed: {server['first_ask']['statuses']}")
    elif ratio > first_target:
        missed.append(f"first Ask / warm p50 {ratio:.2f}x > {first_target:.1f}x")
    if warm.get("statuses", {}).keys() - {"OK"}:
        missed.append(f"failed warm Asks: {warm['statuses']}")
    return missed


def server_env() -> dict[str, str]:
    """The environment of every process started: offline models, no LLM."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTEST_GENERATE_LLM__")}
    return env | {"HF_HUB_OFFLINE": "1"}


def build_data_dir(target: Path, env: dict[str, str], log: Path) -> dict[str, Any]:
    """The demo corpus ingested with this checkout into ``target``."""
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "attest.cli", "ingest", str(CORPUS), "--data-dir", str(target)]
    with log.open("wb") as out:
        done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    text = log.read_text(encoding="utf-8", errors="replace")
    if done.returncode != 0:
        raise LoadTestError(
            f"ingesting the demo corpus failed ({done.returncode}):\n{text[-2000:]}"
        )
    return {"seconds": time.perf_counter() - started, **ingest_counts(text)}


def ingest_counts(text: str) -> dict[str, int]:
    """The counts ``attest ingest`` prints last: "received 48  ingested 48  updated 0
    unchanged 0  failed 0  passages 54"."""
    counts: dict[str, int] = {}
    for line in text.splitlines():
        words = line.split()
        if words[:1] == ["received"] and len(words) % 2 == 0:
            counts = {k: int(v) for k, v in zip(words[::2], words[1::2], strict=True)}
    return counts


def log_tail(log: Path, n: int = 30) -> str:
    try:
        return "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-n:])
    except OSError:
        return ""


async def first_of(address: str, questions: Sequence[str], top_k: int) -> dict[str, Any]:
    from attest.answer.v1 import answer_pb2_grpc
    from attest.core.channels import create_channel

    channel = create_channel(address)
    try:
        return await first_ask(answer_pb2_grpc.AnswerServiceStub(channel), questions, top_k)
    finally:
        await channel.close()


async def passes(
    addresses: dict[str, str], questions: Sequence[str], rounds: int, top_k: int
) -> tuple[dict[str, list[list[Call]]], dict[str, float]]:
    """``rounds`` passes over ``questions``, one call at a time, each server in
    turn; per server, each round's calls, and the seconds of all its passes."""
    from attest.answer.v1 import answer_pb2_grpc
    from attest.core.channels import create_channel

    channels = {name: create_channel(address) for name, address in addresses.items()}
    calls: dict[str, list[list[Call]]] = {name: [] for name in addresses}
    wall = dict.fromkeys(addresses, 0.0)
    try:
        stubs = {name: answer_pb2_grpc.AnswerServiceStub(ch) for name, ch in channels.items()}
        for r in range(rounds):
            for name in round_order(list(addresses), r):
                started = time.perf_counter()
                done = [await ask(stubs[name], q, top_k) for q in questions]
                wall[name] += time.perf_counter() - started
                calls[name].append(done)
                ok = [c.client_s for c in done if c.status == "OK"]
                p50 = f"p50 {percentile(ok, 50):.2f} s" if ok else "none OK"
                print(f"round {r + 1}: {name}: {len(ok)}/{len(done)} OK, {p50}", file=sys.stderr)
    finally:
        for ch in channels.values():
            await ch.close()
    return calls, wall


def summarize_server(
    first: dict[str, Any], rounds: Sequence[Sequence[Call]], wall_s: float
) -> dict[str, Any]:
    flat = [c for calls in rounds for c in calls]
    level = summarize_level(1, flat, wall_s)
    warm = {
        "requests": level["requests"],
        "statuses": level["statuses"],
        "errors": level["errors"],
        "degraded_answers": level["degraded_answers"],
        **latency_summary([c.client_s for c in flat if c.status == "OK"]),
        "stages_ms": level.get("stages_ms", {}),
        "round_p50_ms": [
            latency_summary([c.client_s for c in calls if c.status == "OK"]).get("p50_ms")
            for calls in rounds
        ],
    }
    return {"first_ask": first, "warm": warm, "first_over_warm_p50": first_over_warm(first, warm)}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="passes over every question")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a checkout of another commit with its own .venv, measured side by side",
    )
    parser.add_argument("--p50-target", type=float, default=P50_TARGET_S, help="seconds")
    parser.add_argument(
        "--first-target",
        type=float,
        default=FIRST_ASK_TARGET,
        help="the first Ask after SERVING, at most this many times the warm p50",
    )
    parser.add_argument(
        "--top-k", type=int, default=3, help="reranked sources per answer (0: server default)"
    )
    parser.add_argument("--output", type=Path, default=REPORT)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not 0 <= args.top_k <= 100:
        parser.error("--top-k must be 0-100")
    if args.p50_target <= 0 or args.first_target <= 0:
        parser.error("--p50-target and --first-target must be positive")
    if args.baseline is not None:
        if not (args.baseline / ".venv" / "bin" / "python").is_file():
            parser.error(f"--baseline {args.baseline} has no .venv (run `uv sync` there)")
        if args.baseline.resolve() == ROOT:
            parser.error("--baseline is this checkout")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # A stopped benchmark stops the servers it started (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    questions = demo_questions()
    env = server_env()
    sides = [("this", sys.executable, ROOT)]
    if args.baseline is not None:
        sides.append(("baseline", str(args.baseline / ".venv" / "bin" / "python"), args.baseline))
    servers: dict[str, dict[str, Any]] = {}
    addresses: dict[str, str] = {}
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="attest-bench-ask-demo-") as tmp:
        try:
            corpus = build_data_dir(Path(tmp) / "demo", env, Path(tmp) / "ingest.log")
            print(
                f"ingested {corpus.get('ingested')} demo articles "
                f"({corpus.get('passages')} passages) in {corpus['seconds']:.0f} s",
                file=sys.stderr,
            )
            for name, python, checkout in sides:
                data, log = Path(tmp) / f"data-{name}", Path(tmp) / f"{name}.log"
                shutil.copytree(Path(tmp) / "demo", data)
                launched = time.perf_counter()
                proc, address = start_server(
                    python, checkout, data, env, log, extra=("--insecure-dev",)
                )
                procs.append(proc)
                try:
                    wait_serving(address, proc, READY_S, log)
                except LoadTestError as err:
                    raise LoadTestError(f"{name}: {err}\n{log_tail(log)}") from None
                serving_s = time.perf_counter() - launched
                first = asyncio.run(first_of(address, questions, args.top_k))
                print(
                    f"{name}: SERVING after {serving_s:.1f} s, first Ask "
                    f"{first.get('first_ms', float('nan')) / 1000:.2f} s {first['statuses']}",
                    file=sys.stderr,
                )
                addresses[name] = address
                servers[name] = {
                    "commit": commit_of(checkout),
                    "checkout": str(checkout),
                    "serving_s": serving_s,
                    "first": first,
                }
            calls, wall = asyncio.run(passes(addresses, questions, args.rounds, args.top_k))
        except LoadTestError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        finally:
            for proc in procs:
                stop(proc)
    for name, server in servers.items():
        server |= summarize_server(server.pop("first"), calls[name], wall[name])
    report: dict[str, Any] = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "generation": "extractive",
        "budget_s": BUDGET_S,
        "top_k": args.top_k,
        "rounds": args.rounds,
        "questions": len(questions),
        "corpus": corpus,
        "commit": servers["this"]["commit"],
        "servers": servers,
        "targets": {"p50_s": args.p50_target, "first_over_warm_p50": args.first_target},
    }
    if "baseline" in servers:
        report["ratios"] = ratios(servers["this"]["warm"], servers["baseline"]["warm"])
        same = compare_levels([(1, calls["this"][-1])], [(1, calls["baseline"][-1])])[0]
        report["same_answers_last_round"] = {k: v for k, v in same.items() if k != "clients"}
    missed = verdict(servers["this"], args.p50_target, args.first_target)
    report["missed"] = missed
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    for line in table(report):
        print(line)
    print(f"wrote {args.output}")
    return 1 if missed else 0


def table(report: dict[str, Any]) -> list[str]:
    corpus = report["corpus"]
    lines = [
        f"{corpus.get('ingested')} demo articles ({corpus.get('passages')} passages), "
        f"{report['questions']} questions x {report['rounds']} rounds, top {report['top_k']} "
        f"sources, extractive, {report['cpus']} CPUs",
        f"{'server':<9} {'commit':<16} {'SERVING s':>9} {'first s':>8} {'p50 s':>7} "
        f"{'p95 s':>7} {'mean s':>7} {'first/p50':>9}  statuses",
    ]
    nan = float("nan")
    for name, s in report["servers"].items():
        warm, ratio = s["warm"], s["first_over_warm_p50"]
        lines.append(
            f"{name:<9} {s['commit']:<16} {s['serving_s']:>9.1f} "
            f"{s['first_ask'].get('first_ms', nan) / 1000:>8.2f} "
            f"{warm.get('p50_ms', nan) / 1000:>7.2f} {warm.get('p95_ms', nan) / 1000:>7.2f} "
            f"{warm.get('mean_ms', nan) / 1000:>7.2f} {ratio if ratio is not None else nan:>9.2f}"
            f"  {warm['statuses']}"
        )
    for name, s in report["servers"].items():
        first = s["first_ask"]
        if "ratio" in first:
            lines.append(
                f"{name}: first question warm {first['warm_ms'] / 1000:.2f} s "
                f"(first / that {first['ratio']:.2f}x); stages ms: "
                + ", ".join(f"{k.lower()} {v:.0f}" for k, v in s["warm"]["stages_ms"].items())
            )
        for error in (first["errors"] + s["warm"]["errors"])[:3]:
            lines.append(f"  {error}")
    if "ratios" in report:
        r, same = report["ratios"], report["same_answers_last_round"]
        lines.append(
            f"this / baseline: p50 {r.get('p50', nan):.2f}x, p95 {r.get('p95', nan):.2f}x, "
            f"mean {r.get('mean', nan):.2f}x; last round same answer text "
            f"{same['same_text']}/{same['both_ok']}, same text and citations "
            f"{same['same_text_and_citations']}/{same['both_ok']}"
        )
    t = report["targets"]
    lines.append(
        f"targets (this): warm p50 <= {t['p50_s']:.2f} s, first/p50 <= "
        f"{t['first_over_warm_p50']:.1f}x: "
        + ("met" if not report["missed"] else "MISSED: " + "; ".join(report["missed"]))
    )
    return lines


if __name__ == "__main__":
    sys.exit(main())
