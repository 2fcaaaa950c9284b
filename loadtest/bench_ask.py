"""AnswerService.Ask over ingested Reuters articles: clients, stages, and the queued path.

Issue 7's benchmark. One ``attest serve all --embedded`` process (tantivy, the
embedded vector engine, inline ingestion, extractive generation, the
embedding-fallback reranker) gets the first ``--docs`` Reuters-21578
articles through ``IngestService.IngestStream``; an ``attest worker --queues
answer`` process beside it runs queued jobs over Redis. Then:

* Ask at each ``--clients`` level (default 1, 8, 32 concurrent clients),
  ``--requests`` calls per level (at least two per client): p50/p95/p99 of
  the latency the client sees, answers/s, and the mean time of each stage
  as the answer reports it;
* the inline path's own cost: at one client, the client's latency against
  the sum of the stages' own times (the retrieval stages run in parallel, so
  they count once, as the longest of them); target at most ``--target``
  (10 %) more;
* the Celery path: the first ``--paired`` questions asked with Ask and with
  Submit + Watch one after the other, the same options; the extra latency of
  the queued path per question and whether both gave the same answer.

Questions are article titles drawn with a fixed seed, as in the lexical
benchmark. Each call carries a 300 s time budget so both paths run with the
same options.

    python loadtest/bench_ask.py --docs 5000 --redis-url redis://127.0.0.1:6379

Writes a table to stdout, JSON to loadtest/reports/ask.json and a PNG next
to it. Exits 1 when the inline path adds more than the target. A benchmark
command, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadtest.grpc_load import free_port, wait_serving  # noqa: E402

REPORT = ROOT / "loadtest" / "reports" / "ask.json"
RETRIEVAL = ("RETRIEVE_BM25", "RETRIEVE_DENSE", "RETRIEVE_KG")
BUDGET_S = 300


@dataclass
class Call:
    question: str
    client_s: float
    status: str
    total_s: float = 0.0
    stages: dict[str, float] = field(default_factory=dict)
    text: str = ""
    sentences: int = 0
    detail: str = ""
    degraded: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()

    @property
    def stage_sum_s(self) -> float:
        """The stages' own times, the parallel retrieval stages counted once."""
        retrieval = max((self.stages.get(s, 0.0) for s in RETRIEVAL), default=0.0)
        rest = sum(v for k, v in self.stages.items() if k not in RETRIEVAL and k != "QUEUED")
        return retrieval + rest


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def options() -> Any:
    from google.protobuf.duration_pb2 import Duration

    from attest.answer.v1 import answer_pb2

    return answer_pb2.AskOptions(time_budget=Duration(seconds=BUDGET_S))


def from_answer(question: str, client_s: float, answer: Any) -> Call:
    from attest.answer.v1 import answer_pb2

    stages: dict[str, float] = {}
    for timing in answer.timings:
        name = answer_pb2.Stage.Name(timing.stage).removeprefix("STAGE_")
        stages[name] = stages.get(name, 0.0) + timing.duration.ToNanoseconds() / 1e9
    return Call(
        question=question,
        client_s=client_s,
        status="OK",
        total_s=answer.total.ToNanoseconds() / 1e9,
        stages=stages,
        text=answer.text,
        sentences=len(answer.sentences),
        degraded=tuple(
            answer_pb2.Stage.Name(d.stage).removeprefix("STAGE_") for d in answer.degradations
        ),
        reasons=tuple(
            f"{answer_pb2.Stage.Name(d.stage).removeprefix('STAGE_')}: {d.reason}"
            for d in answer.degradations
        ),
    )


async def ask(stub: Any, question: str) -> Call:
    import grpc

    from attest.answer.v1 import answer_pb2

    started = time.perf_counter()
    try:
        response = await stub.Ask(
            answer_pb2.AskRequest(question=question, options=options()), timeout=BUDGET_S + 30
        )
    except grpc.aio.AioRpcError as err:
        return Call(
            question, time.perf_counter() - started, err.code().name, detail=err.details() or ""
        )
    return from_answer(question, time.perf_counter() - started, response.answer)


async def submit(stub: Any, question: str) -> Call:
    import grpc

    from attest.answer.v1 import answer_pb2

    started = time.perf_counter()
    try:
        job = (
            await stub.Submit(answer_pb2.SubmitRequest(question=question, options=options()))
        ).job
        last = job
        async for update in stub.Watch(
            answer_pb2.WatchRequest(job_id=job.job_id), timeout=BUDGET_S + 60
        ):
            last = update.job
    except grpc.aio.AioRpcError as err:
        return Call(
            question, time.perf_counter() - started, err.code().name, detail=err.details() or ""
        )
    elapsed = time.perf_counter() - started
    if last.state != answer_pb2.JOB_STATE_DONE:
        return Call(question, elapsed, answer_pb2.JobState.Name(last.state))
    return from_answer(question, elapsed, last.answer)


async def level(stub: Any, questions: Sequence[str], clients: int) -> tuple[list[Call], float]:
    """``questions`` asked by ``clients`` concurrent clients; (calls, wall seconds)."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for q in questions:
        queue.put_nowait(q)
    calls: list[Call] = []

    async def client() -> None:
        while True:
            try:
                q = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            calls.append(await ask(stub, q))

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return calls, time.perf_counter() - started


def summarize_level(clients: int, calls: Sequence[Call], wall_s: float) -> dict[str, Any]:
    ok = [c for c in calls if c.status == "OK"]
    statuses: dict[str, int] = {}
    for c in calls:
        statuses[c.status] = statuses.get(c.status, 0) + 1
    latencies = [c.client_s * 1000 for c in ok]
    stage_names = sorted({s for c in ok for s in c.stages}, key=_stage_order)
    degraded: dict[str, int] = {}
    for c in ok:
        for stage in c.degraded:
            degraded[stage] = degraded.get(stage, 0) + 1
    out: dict[str, Any] = {
        "clients": clients,
        "requests": len(calls),
        "statuses": statuses,
        "errors": sorted({f"{c.status}: {c.detail}"[:300] for c in calls if c.status != "OK"}),
        "degraded_answers": degraded,
        "degradation_reasons": sorted({r[:300] for c in ok for r in c.reasons}),
        "wall_s": wall_s,
        "answers_per_s": len(ok) / wall_s if wall_s > 0 else 0.0,
    }
    if ok:
        out |= {
            "p50_ms": percentile(latencies, 50),
            "p95_ms": percentile(latencies, 95),
            "p99_ms": percentile(latencies, 99),
            "mean_total_ms": statistics.fmean(c.total_s * 1000 for c in ok),
            "mean_stage_sum_ms": statistics.fmean(c.stage_sum_s * 1000 for c in ok),
            # The parallel retrieval stages as the pipeline waits for them: the longest.
            "retrieval_ms": statistics.fmean(
                max((c.stages.get(s, 0.0) for s in RETRIEVAL), default=0.0) * 1000 for c in ok
            ),
            "stages_ms": {
                s: statistics.fmean(c.stages.get(s, 0.0) * 1000 for c in ok) for s in stage_names
            },
        }
    return out


def overhead(calls: Sequence[Call]) -> dict[str, float]:
    """The inline path over its stages at one client: median and mean ratios minus one."""
    ok = [c for c in calls if c.status == "OK" and c.stage_sum_s > 0]
    ratios = [c.client_s / c.stage_sum_s - 1 for c in ok]
    server = [c.total_s / c.stage_sum_s - 1 for c in ok]
    return {
        "calls": len(ok),
        "median_over_stages": statistics.median(ratios),
        "mean_over_stages": statistics.fmean(ratios),
        "median_server_over_stages": statistics.median(server),
        "median_ms": statistics.median((c.client_s - c.stage_sum_s) * 1000 for c in ok),
    }


async def paired(stub: Any, questions: Sequence[str]) -> dict[str, Any]:
    """Each question through Ask, then through Submit + Watch; one at a time."""
    pairs = []
    for q in questions:
        inline = await ask(stub, q)
        queued = await submit(stub, q)
        pairs.append((inline, queued))
    good = [(a, b) for a, b in pairs if a.status == "OK" and b.status == "OK"]
    extra = [(b.client_s - a.client_s) * 1000 for a, b in good]
    return {
        "questions": len(pairs),
        "both_ok": len(good),
        "same_answer": sum(a.text == b.text for a, b in good),
        "inline_p50_ms": statistics.median(a.client_s * 1000 for a, _ in good) if good else None,
        "celery_p50_ms": statistics.median(b.client_s * 1000 for _, b in good) if good else None,
        "extra_p50_ms": statistics.median(extra) if extra else None,
        "extra_mean_ms": statistics.fmean(extra) if extra else None,
        "queued_p50_ms": statistics.median(b.stages.get("QUEUED", 0.0) * 1000 for _, b in good)
        if good
        else None,
        "statuses": [(a.status, b.status) for a, b in pairs],
    }


def ingest(address: str, lines: list[bytes]) -> dict[str, Any]:
    import grpc
    from tests.integration.ingest_stack import stream_items

    from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc

    started = time.perf_counter()
    with grpc.insecure_channel(address) as channel:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        job = stub.IngestStream(stream_items(lines, "reuters.jsonl"), timeout=600).job
        from tqdm import tqdm

        last = None
        with tqdm(total=len(lines), desc="ingest", unit="doc") as bar:
            for update in stub.WatchJob(
                ingest_pb2.WatchJobRequest(job_id=job.job_id), timeout=7200
            ):
                last = update
                bar.update(update.progress.indexed + update.progress.failed - bar.n)
    assert last is not None
    state = ingest_pb2.JobState.Name(last.state)
    if state != "JOB_STATE_DONE":
        raise SystemExit(f"ingestion ended {state}")
    return {
        "seconds": time.perf_counter() - started,
        "indexed": last.progress.indexed,
        "failed": last.progress.failed,
        "passages": last.progress.passages_indexed,
    }


def write_plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [lv for lv in report["levels"] if "p50_ms" in lv]
    if not levels:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    x = [lv["clients"] for lv in levels]
    for key in ("p50_ms", "p95_ms", "p99_ms"):
        left.plot(x, [lv[key] / 1000 for lv in levels], marker="o", label=key.split("_")[0])
    left.set_xscale("log", base=2)
    left.set_xticks(x, [str(c) for c in x])
    left.set_xlabel("concurrent clients")
    left.set_ylabel("latency (s)")
    twin = left.twinx()
    twin.plot(x, [lv["answers_per_s"] for lv in levels], "k--", marker="s", label="answers/s")
    twin.set_ylabel("answers/s")
    twin.set_ylim(bottom=0)
    left.legend(loc="upper left")
    twin.legend(loc="lower right")
    left.set_title("Ask: latency and throughput")
    names = sorted({s for lv in levels for s in lv["stages_ms"]}, key=_stage_order)
    segments = [("retrieval (longest retriever)", [lv["retrieval_ms"] / 1000 for lv in levels])]
    segments += [
        (name.lower(), [lv["stages_ms"].get(name, 0.0) / 1000 for lv in levels])
        for name in names
        if name not in RETRIEVAL
    ]
    bottom = [0.0] * len(levels)
    for label, values in segments:
        right.bar([str(c) for c in x], values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    right.set_xlabel("concurrent clients")
    right.set_ylabel("mean seconds per answer")
    right.set_title("Time per stage")
    right.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _stage_order(name: str) -> int:
    from attest.answer.v1 import answer_pb2

    return int(answer_pb2.Stage.Value(f"STAGE_{name}"))


def main() -> int:
    from tests.integration.ingest_stack import REUTERS, reuters_lines

    from loadtest.bench_lexical import draw_queries, load_articles

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--clients", type=int, action="append", help="repeatable; 1 8 32")
    parser.add_argument("--requests", type=int, default=16, help="calls per level (min 2/client)")
    parser.add_argument("--paired", type=int, default=8, help="questions for Ask vs Submit")
    parser.add_argument("--redis-url", default=os.environ.get("ATTEST_TEST_REDIS_URL"))
    parser.add_argument("--target", type=float, default=0.10)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--output", type=Path, default=REPORT)
    args = parser.parse_args()
    # A stopped benchmark stops the server and the worker it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not args.redis_url:
        parser.error("--redis-url (or ATTEST_TEST_REDIS_URL) is needed for the queued path")
    clients = args.clients or [1, 8, 32]
    lines = reuters_lines(args.docs)
    articles = load_articles(REUTERS, args.docs)
    need = max(max(args.requests, 2 * c) for c in clients)
    questions = draw_queries(articles, need + args.paired, args.seed)
    base = args.redis_url.rstrip("/")
    broker, results, state = f"{base}/4", f"{base}/5", f"{base}/6"
    import redis

    for url in (broker, results, state):
        redis.Redis.from_url(url).flushdb()

    port = free_port()
    address = f"127.0.0.1:{port}"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "ATTEST_PIPELINE_BROKER_URL": broker,
        "ATTEST_PIPELINE_RESULT_BACKEND_URL": results,
        "ATTEST_ANSWER_JOBS__STATE_URL": state,
    }
    worker_env = {
        **env,
        **{
            f"ATTEST_ANSWER_{name}_ADDRESS": address
            for name in ("LEXICAL", "SEMANTIC", "RERANK", "GENERATE")
        },
    }
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="attest-bench-ask-") as tmp:
        log = Path(tmp) / "server.log"
        cmd = [sys.executable, "-m", "attest.cli", "serve", "all", "--embedded"]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--data-dir", str(Path(tmp) / "data")]
        server = subprocess.Popen(cmd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
        worker = None
        try:
            wait_serving(address, server, 900, log)
            loaded = ingest(address, lines)
            print(
                f"ingested {loaded['indexed']} articles ({loaded['passages']} passages) "
                f"in {loaded['seconds']:.0f} s",
                file=sys.stderr,
            )
            worker = subprocess.Popen(
                [sys.executable, "-m", "attest.cli", "worker", "--queues", "answer"],
                env=worker_env,
                stdout=(Path(tmp) / "worker.log").open("wb"),
                stderr=subprocess.STDOUT,
            )
            report = asyncio.run(measure(address, questions, clients, args))
            report["ingest"] = loaded
        finally:
            for proc in (worker, server):
                if proc is not None:
                    proc.terminate()
                    try:
                        proc.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        proc.kill()
    report |= {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "docs": len(lines),
        "cpus": os.cpu_count(),
        "generation": "extractive",
        "budget_s": BUDGET_S,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    plot = args.output.with_suffix(".png")
    write_plot(report, plot)
    print_report(report)
    print(f"wrote {args.output} and {plot}")
    return 0 if report["inline_overhead"]["median_over_stages"] <= args.target else 1


async def measure(
    address: str, questions: Sequence[str], clients: Sequence[int], args: argparse.Namespace
) -> dict[str, Any]:
    from attest.answer.v1 import answer_pb2_grpc
    from attest.core.channels import create_channel

    channel = create_channel(address)
    try:
        stub = answer_pb2_grpc.AnswerServiceStub(channel)
        for q in questions[:2]:  # untimed: the first calls load models
            await ask(stub, q)
        levels = []
        single: list[Call] = []
        for c in clients:
            n = max(args.requests, 2 * c)
            calls, wall = await level(stub, questions[:n], c)
            levels.append(summarize_level(c, calls, wall))
            if c == 1:
                single = calls
            print(f"clients {c}: {levels[-1]['statuses']} in {wall:.0f} s", file=sys.stderr)
        if not single:
            single, _ = await level(stub, questions[: args.requests], 1)
        queued = await paired(stub, questions[-args.paired :])
    finally:
        await channel.close()
    return {"levels": levels, "inline_overhead": overhead(single), "celery_vs_inline": queued}


def print_report(report: dict[str, Any]) -> None:
    ingest = report["ingest"]
    print(
        f"{report['docs']} Reuters articles ingested ({ingest['passages']} passages, "
        f"{ingest['seconds']:.0f} s), {report['cpus']} CPUs, extractive generation"
    )
    print(f"{'clients':>7} {'answers/s':>10} {'p50 s':>7} {'p95 s':>7} {'p99 s':>7}  statuses")
    for lv in report["levels"]:
        if "p50_ms" not in lv:
            print(f"{lv['clients']:>7} {'-':>10}  {lv['statuses']}")
            continue
        print(
            f"{lv['clients']:>7} {lv['answers_per_s']:>10.2f} {lv['p50_ms'] / 1000:>7.2f} "
            f"{lv['p95_ms'] / 1000:>7.2f} {lv['p99_ms'] / 1000:>7.2f}  {lv['statuses']}"
            + (f", degraded {lv['degraded_answers']}" if lv["degraded_answers"] else "")
        )
        for error in lv["errors"][:3] + lv["degradation_reasons"][:3]:
            print(f"{'':>9}{error}")
    print("mean ms per stage (retrieval stages overlap):")
    for lv in report["levels"]:
        if "stages_ms" in lv:
            stages = ", ".join(f"{k.lower()} {v:.0f}" for k, v in lv["stages_ms"].items())
            print(f"  {lv['clients']:>3} clients: {stages}")
    o = report["inline_overhead"]
    print(
        f"inline path at 1 client over the sum of its stages: median "
        f"{o['median_over_stages']:+.1%} ({o['median_ms']:+.0f} ms), mean "
        f"{o['mean_over_stages']:+.1%}; server total over stages "
        f"{o['median_server_over_stages']:+.1%}"
    )
    p = report["celery_vs_inline"]
    if p["extra_p50_ms"] is not None:
        print(
            f"Celery path vs inline, {p['both_ok']} of {p['questions']} questions: p50 "
            f"{p['celery_p50_ms'] / 1000:.2f} s vs {p['inline_p50_ms'] / 1000:.2f} s, "
            f"extra {p['extra_p50_ms']:+.0f} ms (mean {p['extra_mean_ms']:+.0f}), queued "
            f"{p['queued_p50_ms']:.0f} ms; same answer {p['same_answer']}/{p['both_ok']}"
        )
    else:
        print(f"Celery path: no pair completed ({p['statuses']})")


if __name__ == "__main__":
    sys.exit(main())
