"""What HTTP/JSON adds to Ask over gRPC, on the demo corpus, in one run.

The 48 demo articles are ingested once (``attest ingest``, in process), then
one ``attest serve all --embedded --insecure-dev`` serves them with its HTTP
gateway on. Each demo question (``questions.jsonl``, then
``unanswerable.jsonl``) is asked ``--rounds`` times over each surface, one
call at a time and the two surfaces interleaved (which goes first alternates
from question to question), so both see the same machine, the same warm
caches and the same answers:

* gRPC: ``AnswerService.Ask`` on a grpc.aio channel, the reply parsed;
* HTTP: ``POST /v1/ask`` on a keep-alive aiohttp session, the JSON parsed.

The gateway forwards HTTP through a gRPC channel to the same listener, so the
difference is the gateway's own cost: JSON in and out, one more local hop.
Both carry the same options (bench_ask's time budget, ``--top-k`` reranked
sources, as ``attest demo`` asks). Prints both p50s and the difference; exits
1 when HTTP's p50 is more than ``--max-overhead-ms`` (5) over gRPC's, or when
an answer differs between the two. Writes loadtest/reports/http-overhead.json.

    python loadtest/bench_http.py --rounds 6

It also times a call with no pipeline behind it (GetJob of an unknown job,
NOT_FOUND at once) over both, which isolates the gateway's own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadtest.bench_ask import commit_of, options, percentile, start_server, stop  # noqa: E402
from loadtest.bench_ask_demo import (  # noqa: E402
    READY_S,
    build_data_dir,
    demo_questions,
    log_tail,
    server_env,
)
from loadtest.grpc_load import LoadTestError, free_port, wait_serving  # noqa: E402

REPORT = ROOT / "loadtest" / "reports" / "http-overhead.json"


def summary(seconds: Sequence[float]) -> dict[str, float]:
    ms = [s * 1000 for s in seconds]
    return {
        "p50_ms": percentile(ms, 50),
        "p95_ms": percentile(ms, 95),
        "mean_ms": statistics.fmean(ms),
        "calls": len(ms),
    }


async def measure(
    address: str, http: str, questions: Sequence[str], rounds: int, top_k: int
) -> dict[str, Any]:
    import aiohttp
    import grpc
    from google.protobuf import json_format

    from attest.answer.v1 import answer_pb2, answer_pb2_grpc

    times: dict[str, list[float]] = {"grpc": [], "http": []}
    differing: list[str] = []
    async with (
        grpc.aio.insecure_channel(address) as channel,
        aiohttp.ClientSession() as session,
    ):
        stub = answer_pb2_grpc.AnswerServiceStub(channel)

        async def over_grpc(question: str) -> str:
            request = answer_pb2.AskRequest(question=question, options=options(top_k))
            began = time.perf_counter()
            reply = await stub.Ask(request, timeout=330)
            times["grpc"].append(time.perf_counter() - began)
            return str(reply.answer.text)

        async def over_http(question: str) -> str:
            request = answer_pb2.AskRequest(question=question, options=options(top_k))
            body = json_format.MessageToJson(request)
            began = time.perf_counter()
            async with session.post(
                f"{http}/v1/ask", data=body, headers={"content-type": "application/json"}
            ) as reply:
                data = await reply.json()
            times["http"].append(time.perf_counter() - began)
            if reply.status != 200:
                raise LoadTestError(f"HTTP Ask failed ({reply.status}): {data}")
            return str(data["answer"]["text"])

        # A pass over every question on both, unmeasured: connections open, code
        # paths and the server's caches warm for every question alike.
        for question in questions:
            await over_grpc(question)
            await over_http(question)
        times["grpc"].clear()
        times["http"].clear()
        turn = 0
        for _ in range(rounds):
            for question in questions:
                turn += 1
                if turn % 2:
                    a, b = await over_grpc(question), await over_http(question)
                else:
                    b, a = await over_http(question), await over_grpc(question)
                if a != b:
                    differing.append(question)
        transport = await bare_calls(stub_of_ingest(channel), session, http)
    grpc_summary, http_summary = summary(times["grpc"]), summary(times["http"])
    paired = [h - g for g, h in zip(times["grpc"], times["http"], strict=True)]
    return {
        "grpc": grpc_summary,
        "http": http_summary,
        "p50_overhead_ms": http_summary["p50_ms"] - grpc_summary["p50_ms"],
        "median_paired_overhead_ms": statistics.median(paired) * 1000,
        "differing_answers": sorted(set(differing)),
        "bare_call": transport,
    }


def stub_of_ingest(channel: Any) -> Any:
    from attest.ingest.v1 import ingest_pb2_grpc

    return ingest_pb2_grpc.IngestServiceStub(channel)


async def bare_calls(stub: Any, session: Any, http: str, n: int = 300) -> dict[str, float]:
    """The gateway's own cost without a pipeline behind it: GetJob of a job that
    does not exist (NOT_FOUND at once), over each surface, ``n`` times."""
    import grpc

    from attest.ingest.v1 import ingest_pb2

    times: dict[str, list[float]] = {"grpc": [], "http": []}
    for _ in range(n):
        began = time.perf_counter()
        with contextlib.suppress(grpc.aio.AioRpcError):
            await stub.GetJob(ingest_pb2.GetJobRequest(job_id="no-such-job"), timeout=30)
        times["grpc"].append(time.perf_counter() - began)
        began = time.perf_counter()
        async with session.get(f"{http}/v1/ingest/jobs/no-such-job") as reply:
            await reply.json()
        times["http"].append(time.perf_counter() - began)
    g, h = (statistics.median(times[k]) * 1000 for k in ("grpc", "http"))
    return {"grpc_p50_ms": g, "http_p50_ms": h, "overhead_ms": h - g, "calls": n}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rounds",
        type=int,
        default=6,
        help="Passes over the questions (even: each question goes first on each surface "
        "equally often).",
    )
    parser.add_argument("--top-k", type=int, default=3, help="Reranked sources kept.")
    parser.add_argument("--max-overhead-ms", type=float, default=5.0)
    parser.add_argument("--report", type=Path, default=REPORT)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    env = server_env() | {"ATTEST_ANSWER_HTTP__ENABLED": "true", "OMP_NUM_THREADS": "1"}
    questions = demo_questions()
    with tempfile.TemporaryDirectory(prefix="bench-http-") as tmp:
        data_dir = Path(tmp) / "demo"
        ingested = build_data_dir(data_dir, env, Path(tmp) / "ingest.log")
        log = Path(tmp) / "serve.log"
        http_port = free_port()
        proc = None
        try:
            proc, address = start_server(
                sys.executable,
                ROOT,
                data_dir,
                env,
                log,
                ["--insecure-dev", "--http-port", str(http_port)],
            )
            wait_serving(address, proc, READY_S, log)
            http = f"http://127.0.0.1:{http_port}"
            result = asyncio.run(measure(address, http, questions, args.rounds, args.top_k))
        except (LoadTestError, OSError) as exc:
            print(f"error: {exc}\n{log_tail(log)}", file=sys.stderr)
            return 1
        finally:
            stop(proc)
    report = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit_of(ROOT),
        "questions": len(questions),
        "rounds": args.rounds,
        "top_k": args.top_k,
        "ingested": ingested,
        **result,
    }
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    g, h = result["grpc"], result["http"]
    print(f"{'surface':8} {'calls':>5} {'p50 ms':>8} {'p95 ms':>8} {'mean ms':>8}")
    for name, row in (("gRPC", g), ("HTTP", h)):
        print(
            f"{name:8} {row['calls']:>5} {row['p50_ms']:>8.1f} {row['p95_ms']:>8.1f} "
            f"{row['mean_ms']:>8.1f}"
        )
    print(
        f"HTTP p50 - gRPC p50: {result['p50_overhead_ms']:+.1f} ms "
        f"(median of paired differences {result['median_paired_overhead_ms']:+.1f} ms); "
        f"target <= {args.max_overhead_ms:.1f} ms"
    )
    bare = result["bare_call"]
    print(
        f"bare call (GetJob NOT_FOUND, {bare['calls']} each): gRPC p50 {bare['grpc_p50_ms']:.2f} "
        f"ms, HTTP p50 {bare['http_p50_ms']:.2f} ms ({bare['overhead_ms']:+.2f} ms)"
    )
    failed = False
    if result["differing_answers"]:
        print(f"answers differ between gRPC and HTTP: {result['differing_answers']}")
        failed = True
    if result["p50_overhead_ms"] > args.max_overhead_ms:
        print("over the target")
        failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
