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
  the queued path per question and whether both gave the same answer;
* SERVING means warm (issue 45): the first Ask after SERVING, of the first
  question, against the median of the same question asked three times once
  warm; target at most ``--first-target`` (2) times. No call is made before
  it: whatever the first Ask loads counts against it.

Questions are article titles drawn with a fixed seed, as in the lexical
benchmark. Each call carries a 300 s time budget so both paths run with the
same options.

    python loadtest/bench_ask.py --docs 5000 --redis-url redis://127.0.0.1:6379

Side by side with another commit (``--baseline DIR``: a checkout with its own
``.venv``, e.g. ``git worktree add /tmp/base HEAD~1 && (cd /tmp/base && uv
sync)``): the corpus is ingested once, through this checkout's server, and
its data directory copied for a second ``serve all --embedded`` started from
DIR; each level then runs against both servers one after the other (the
order alternating from level to level, so a machine that slows down or
speeds up mid-run weighs on both), and the report adds the baseline's levels,
the ratios and how many questions got the same answer text and citations
from both. ``--data-dir DIR`` reuses a data directory ingested before (it is
copied, never written) instead of ingesting.

Writes a table to stdout, JSON to loadtest/reports/ask.json and a PNG next
to it. Exits 1 when the inline path adds more than the target, or the first
Ask takes more than ``--first-target`` times a warm one. A benchmark command,
not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
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
# The first Ask after SERVING, at most this many times a warm one (issue 45).
FIRST_ASK_TARGET = 2.0
WARM_REPEATS = 3


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
    # (doc_id, passage_index) of each sentence's citations, best first.
    cited: tuple[tuple[tuple[str, int], ...], ...] = ()

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


def options(rerank_top_k: int = 0) -> Any:
    """The benchmark's options: a ``BUDGET_S`` time budget; ``rerank_top_k`` 0 keeps
    the server's default."""
    from google.protobuf.duration_pb2 import Duration

    from attest.answer.v1 import answer_pb2

    return answer_pb2.AskOptions(time_budget=Duration(seconds=BUDGET_S), rerank_top_k=rerank_top_k)


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
        cited=tuple(
            tuple((c.doc_id, c.passage_index) for c in s.citations) for s in answer.sentences
        ),
    )


async def ask(stub: Any, question: str, rerank_top_k: int = 0) -> Call:
    import grpc

    from attest.answer.v1 import answer_pb2

    started = time.perf_counter()
    try:
        response = await stub.Ask(
            answer_pb2.AskRequest(question=question, options=options(rerank_top_k)),
            timeout=BUDGET_S + 30,
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


async def first_ask(stub: Any, questions: Sequence[str], rerank_top_k: int = 0) -> dict[str, Any]:
    """The first Ask of a server that has answered nothing yet, against the same
    question once warm (after another question, the median of ``WARM_REPEATS``)."""
    question = questions[0]
    first = await ask(stub, question, rerank_top_k)
    await ask(stub, questions[1], rerank_top_k)
    warm = [await ask(stub, question, rerank_top_k) for _ in range(WARM_REPEATS)]
    calls = [first, *warm]
    out: dict[str, Any] = {
        "question": question,
        "statuses": [c.status for c in calls],
        "errors": sorted({f"{c.status}: {c.detail}"[:300] for c in calls if c.status != "OK"}),
    }
    if all(c.status == "OK" for c in calls):
        warm_s = statistics.median(c.client_s for c in warm)
        out |= {
            "first_ms": first.client_s * 1000,
            "warm_ms": warm_s * 1000,
            "ratio": first.client_s / warm_s,
            "first_stages_ms": {k: v * 1000 for k, v in first.stages.items()},
            "warm_stages_ms": {
                k: statistics.median(c.stages.get(k, 0.0) for c in warm) * 1000
                for k in first.stages
            },
        }
    return out


def first_ask_ok(result: dict[str, Any], target: float) -> bool:
    return "ratio" in result and result["ratio"] <= target


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


def compare_levels(
    this: Sequence[tuple[int, Sequence[Call]]], base: Sequence[tuple[int, Sequence[Call]]]
) -> list[dict[str, Any]]:
    """Per level: the same questions' answers from both commits, side by side."""
    out = []
    for (clients, calls), (_, base_calls) in zip(this, base, strict=True):
        before = {c.question: c for c in base_calls if c.status == "OK"}
        both = [(before[c.question], c) for c in calls if c.status == "OK" and c.question in before]
        differ = [a.question for a, b in both if (a.text, a.cited) != (b.text, b.cited)]
        out.append(
            {
                "clients": clients,
                "both_ok": len(both),
                "same_text": sum(a.text == b.text for a, b in both),
                "same_text_and_citations": len(both) - len(differ),
                "different": differ[:20],
            }
        )
    return out


def ratios(
    levels: Sequence[dict[str, Any]], base: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    out = []
    for this, before in zip(levels, base, strict=True):
        row: dict[str, Any] = {"clients": this["clients"]}
        if before["answers_per_s"] > 0:
            row["answers_per_s"] = this["answers_per_s"] / before["answers_per_s"]
        if "p50_ms" in this and "p50_ms" in before:
            row["p50"] = this["p50_ms"] / before["p50_ms"]
            row["p95"] = this["p95_ms"] / before["p95_ms"]
        out.append(row)
    return out


def write_plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [("", report["levels"])]
    if "baseline" in report:
        runs = [("after", report["levels"]), ("before", report["baseline"]["levels"])]
    runs = [(label, [lv for lv in levels if "p50_ms" in lv]) for label, levels in runs]
    if not runs[0][1]:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    twin = left.twinx()
    for (label, levels), style in zip(runs, ("-", ":"), strict=False):
        x = [lv["clients"] for lv in levels]
        for key, color in (("p50_ms", "C0"), ("p95_ms", "C1"), ("p99_ms", "C2")):
            left.plot(
                x,
                [lv[key] / 1000 for lv in levels],
                style,
                color=color,
                marker="o",
                label=f"{key.split('_')[0]} {label}".strip(),
            )
        twin.plot(
            x,
            [lv["answers_per_s"] for lv in levels],
            style,
            color="k",
            marker="s",
            label=f"answers/s {label}".strip(),
        )
    x = [lv["clients"] for lv in runs[0][1]]
    left.set_xscale("log", base=2)
    left.set_xticks(x, [str(c) for c in x])
    left.set_xlabel("concurrent clients")
    left.set_ylabel("latency (s)")
    twin.set_ylabel("answers/s")
    twin.set_ylim(bottom=0)
    left.legend(loc="upper left", fontsize="small")
    twin.legend(loc="lower right", fontsize="small")
    left.set_title("Ask: latency and throughput")
    names = sorted(
        {s for _, levels in runs for lv in levels for s in lv["stages_ms"]}, key=_stage_order
    )
    names = [n for n in names if n not in RETRIEVAL]
    bars = [(f"{lv['clients']} {label}".strip(), lv) for label, levels in runs for lv in levels]
    bars.sort(key=lambda b: (b[1]["clients"], b[0]))
    labels = [name for name, _ in bars]
    segments = [("retrieval (longest retriever)", [lv["retrieval_ms"] / 1000 for _, lv in bars])]
    segments += [
        (name.lower(), [lv["stages_ms"].get(name, 0.0) / 1000 for _, lv in bars]) for name in names
    ]
    bottom = [0.0] * len(bars)
    for label, values in segments:
        right.bar(labels, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    right.set_xlabel("concurrent clients")
    right.set_ylabel("mean seconds per answer")
    right.set_title("Time per stage")
    right.tick_params(axis="x", labelrotation=30)
    right.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _stage_order(name: str) -> int:
    from attest.answer.v1 import answer_pb2

    return int(answer_pb2.Stage.Value(f"STAGE_{name}"))


def start_server(
    python: str,
    cwd: Path,
    data_dir: Path,
    env: dict[str, str],
    log: Path,
    extra: Sequence[str] = (),
) -> tuple[subprocess.Popen[bytes], str]:
    """``attest serve all --embedded`` of the checkout at ``cwd`` on a free port,
    its HTTP gateway on another (``extra``: more options of ``serve``)."""
    port = free_port()
    cmd = [python, "-m", "attest.cli", "serve", "all", "--embedded", *extra]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir)]
    # Its HTTP gateway on a free port too: two servers side by side must not
    # both take the default 8080. Set in the environment, not as --http-port:
    # a caller's --http-port (bench_http) wins over it, and a baseline checkout
    # from before the gateway, whose serve has no such option, ignores it.
    env = {**env, "ATTEST_ANSWER_HTTP__PORT": "0"}
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    return proc, f"127.0.0.1:{port}"


def stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def counted(address: str, data_dir: Path) -> dict[str, Any]:
    """What a reused data directory holds, as the semantic service counts it."""
    import grpc

    from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stats = semantic_pb2_grpc.SemanticServiceStub(channel).Stats(
            semantic_pb2.StatsRequest(), timeout=60
        )
    return {
        "reused_data_dir": str(data_dir),
        "seconds": None,
        "indexed": stats.documents,
        "failed": 0,
        "passages": stats.passages,
    }


def commit_of(root: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


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
    parser.add_argument(
        "--first-target",
        type=float,
        default=FIRST_ASK_TARGET,
        help="the first Ask after SERVING, at most this many times a warm one",
    )
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--output", type=Path, default=REPORT)
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a checkout of another commit with its own .venv, measured side by side",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="a data directory that already holds the --docs articles (copied, not ingested)",
    )
    parser.add_argument(
        "--keep-data-dir",
        type=Path,
        help="where to keep a copy of the data directory this run ingests (for --data-dir)",
    )
    args = parser.parse_args()
    # A stopped benchmark stops the servers and the worker it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not args.redis_url:
        parser.error("--redis-url (or ATTEST_TEST_REDIS_URL) is needed for the queued path")
    baseline_python = None
    if args.baseline is not None:
        baseline_python = args.baseline / ".venv" / "bin" / "python"
        if not baseline_python.is_file():
            parser.error(f"--baseline {args.baseline} has no .venv (run `uv sync` there)")
    if args.data_dir is not None and not args.data_dir.is_dir():
        parser.error(f"--data-dir {args.data_dir} is not a directory")
    if args.keep_data_dir is not None and args.keep_data_dir.exists():
        parser.error(f"--keep-data-dir {args.keep_data_dir} exists already")
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

    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "ATTEST_PIPELINE_BROKER_URL": broker,
        "ATTEST_PIPELINE_RESULT_BACKEND_URL": results,
        "ATTEST_ANSWER_JOBS__STATE_URL": state,
    }
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="attest-bench-ask-") as tmp:
        log = Path(tmp) / "server.log"
        base_log = Path(tmp) / "baseline-server.log"
        data, base_data = Path(tmp) / "data", Path(tmp) / "baseline-data"
        server = worker = baseline = None
        baseline_address = None
        try:
            if args.data_dir is not None:
                shutil.copytree(args.data_dir, data)
            server, address = start_server(sys.executable, ROOT, data, env, log)
            wait_serving(address, server, 900, log)
            if args.data_dir is None:
                loaded = ingest(address, lines)
                print(
                    f"ingested {loaded['indexed']} articles ({loaded['passages']} passages) "
                    f"in {loaded['seconds']:.0f} s",
                    file=sys.stderr,
                )
                if args.keep_data_dir is not None:
                    # Copied while nothing has it open.
                    stop(server)
                    shutil.copytree(data, args.keep_data_dir)
                    server, address = start_server(sys.executable, ROOT, data, env, log)
                    if args.baseline is None:
                        wait_serving(address, server, 900, log)
            else:
                loaded = counted(address, args.data_dir)
            if args.baseline is not None and baseline_python is not None:
                if args.data_dir is None:
                    # The same corpus for both: this server's data directory,
                    # copied while nothing has it open.
                    stop(server)
                    shutil.copytree(data, base_data)
                    server, address = start_server(sys.executable, ROOT, data, env, log)
                else:
                    shutil.copytree(args.data_dir, base_data)
                baseline, baseline_address = start_server(
                    str(baseline_python), args.baseline, base_data, env, base_log
                )
                wait_serving(address, server, 900, log)
                wait_serving(baseline_address, baseline, 900, base_log)
            worker_env = {
                **env,
                **{
                    f"ATTEST_ANSWER_{name}_ADDRESS": address
                    for name in ("LEXICAL", "SEMANTIC", "RERANK", "GENERATE")
                },
            }
            worker = subprocess.Popen(
                [sys.executable, "-m", "attest.cli", "worker", "--queues", "answer"],
                env=worker_env,
                stdout=(Path(tmp) / "worker.log").open("wb"),
                stderr=subprocess.STDOUT,
            )
            report = asyncio.run(measure(address, questions, clients, args, baseline_address))
            report["ingest"] = loaded
        finally:
            for proc in (worker, baseline, server):
                stop(proc)
    report |= {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit_of(ROOT),
        "docs": len(lines),
        "cpus": os.cpu_count(),
        "generation": "extractive",
        "budget_s": BUDGET_S,
    }
    if args.baseline is not None:
        report["baseline"]["commit"] = commit_of(args.baseline)
        report["baseline"]["checkout"] = str(args.baseline)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    plot = args.output.with_suffix(".png")
    write_plot(report, plot)
    print_report(report)
    print(f"wrote {args.output} and {plot}")
    inline_ok = report["inline_overhead"]["median_over_stages"] <= args.target
    return 0 if inline_ok and first_ask_ok(report["first_ask"], args.first_target) else 1


async def measure(
    address: str,
    questions: Sequence[str],
    clients: Sequence[int],
    args: argparse.Namespace,
    baseline_address: str | None = None,
) -> dict[str, Any]:
    from attest.answer.v1 import answer_pb2_grpc
    from attest.core.channels import create_channel

    channel = create_channel(address)
    base_channel = create_channel(baseline_address) if baseline_address else None
    servers = [("this", answer_pb2_grpc.AnswerServiceStub(channel))]
    if base_channel is not None:
        servers.append(("baseline", answer_pb2_grpc.AnswerServiceStub(base_channel)))
    try:
        # Timed, the first calls included: SERVING means every model is loaded.
        first = {name: await first_ask(stub, questions) for name, stub in servers}
        for name in first:
            print(f"{name}: first Ask {_first_line(first[name])}", file=sys.stderr)
        levels: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in servers}
        calls_of: dict[str, list[tuple[int, list[Call]]]] = {name: [] for name, _ in servers}
        for i, c in enumerate(clients):
            n = max(args.requests, 2 * c)
            # Alternate who goes first, so drift in the machine's load weighs on both.
            for name, stub in servers if i % 2 else servers[::-1]:
                calls, wall = await level(stub, questions[:n], c)
                levels[name].append(summarize_level(c, calls, wall))
                calls_of[name].append((c, calls))
                print(
                    f"{name}: clients {c}: {levels[name][-1]['statuses']} in {wall:.0f} s",
                    file=sys.stderr,
                )
        single = {
            name: next((k for c, k in runs if c == 1), None) for name, runs in calls_of.items()
        }
        for name, stub in servers:
            if single[name] is None:
                single[name], _ = await level(stub, questions[: args.requests], 1)
        queued = await paired(servers[0][1], questions[-args.paired :])
    finally:
        await channel.close()
        if base_channel is not None:
            await base_channel.close()
    this_single = single["this"]
    assert this_single is not None
    report: dict[str, Any] = {
        "levels": levels["this"],
        "inline_overhead": overhead(this_single),
        "first_ask": first["this"] | {"target": args.first_target},
        "celery_vs_inline": queued,
    }
    if base_channel is not None:
        base_single = single["baseline"]
        assert base_single is not None
        report["baseline"] = {
            "levels": levels["baseline"],
            "inline_overhead": overhead(base_single),
            "first_ask": first["baseline"],
        }
        report["ratios"] = ratios(levels["this"], levels["baseline"])
        report["same_answers"] = compare_levels(calls_of["this"], calls_of["baseline"])
    return report


def _level_line(lv: dict[str, Any]) -> str:
    if "p50_ms" not in lv:
        return f"{lv['clients']:>7} {'-':>10}  {lv['statuses']}"
    return (
        f"{lv['clients']:>7} {lv['answers_per_s']:>10.2f} {lv['p50_ms'] / 1000:>7.2f} "
        f"{lv['p95_ms'] / 1000:>7.2f} {lv['p99_ms'] / 1000:>7.2f}  {lv['statuses']}"
        + (f", degraded {lv['degraded_answers']}" if lv["degraded_answers"] else "")
    )


def _first_line(result: dict[str, Any]) -> str:
    if "ratio" not in result:
        return f"failed: {result['statuses']} {result['errors'][:2]}"
    return (
        f"{result['first_ms'] / 1000:.2f} s, warm {result['warm_ms'] / 1000:.2f} s "
        f"(median of {WARM_REPEATS}): {result['ratio']:.2f}x"
    )


def print_report(report: dict[str, Any]) -> None:
    ingest = report["ingest"]
    how = (
        f"{ingest['seconds']:.0f} s"
        if ingest.get("seconds") is not None
        else f"reused {ingest.get('reused_data_dir')}"
    )
    print(
        f"{report['docs']} Reuters articles ingested ({ingest['passages']} passages, "
        f"{how}), {report['cpus']} CPUs, extractive generation, commit {report.get('commit')}"
    )
    runs = [("", report)]
    if "baseline" in report:
        runs = [
            (f"before ({report['baseline'].get('commit')})", report["baseline"]),
            (f"after ({report.get('commit')})", report),
        ]
    for label, run in runs:
        if label:
            print(label)
        print(f"{'clients':>7} {'answers/s':>10} {'p50 s':>7} {'p95 s':>7} {'p99 s':>7}  statuses")
        for lv in run["levels"]:
            print(_level_line(lv))
            for error in lv["errors"][:3] + lv["degradation_reasons"][:3]:
                print(f"{'':>9}{error}")
        print("mean ms per stage (retrieval stages overlap):")
        for lv in run["levels"]:
            if "stages_ms" in lv:
                stages = ", ".join(f"{k.lower()} {v:.0f}" for k, v in lv["stages_ms"].items())
                print(f"  {lv['clients']:>3} clients: {stages}")
    nan = float("nan")
    for row, same in zip(report.get("ratios", []), report.get("same_answers", []), strict=True):
        print(
            f"after / before at {row['clients']} clients: answers/s "
            f"{row.get('answers_per_s', nan):.2f}x, p50 {row.get('p50', nan):.2f}x, "
            f"p95 {row.get('p95', nan):.2f}x; same answer text {same['same_text']}/"
            f"{same['both_ok']}, same text and citations {same['same_text_and_citations']}/"
            f"{same['both_ok']}"
        )
    o = report["inline_overhead"]
    print(
        f"inline path at 1 client over the sum of its stages: median "
        f"{o['median_over_stages']:+.1%} ({o['median_ms']:+.0f} ms), mean "
        f"{o['mean_over_stages']:+.1%}; server total over stages "
        f"{o['median_server_over_stages']:+.1%}"
    )
    for label, run in runs:
        first = run["first_ask"]
        print(
            f"first Ask after SERVING{f' {label}' if label else ''}: {_first_line(first)}"
            + (f" (target {first['target']:.1f}x)" if "target" in first else "")
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
