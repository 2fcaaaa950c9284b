"""What running short searches on the event loop saves (attest.core.offload).

``attest serve lexical`` (tantivy) over Cranfield's 1,400 documents, twice:
with ``ATTEST_LEXICAL_INLINE_SEARCH_MS=0`` (every search on a thread) and
with the default (a kind of search whose measured cost is short runs on the
loop); both read ids through the per-searcher id table, so the difference is
the offloading alone. For each, ``--seconds`` of ``LexicalService.Search``
(ids view, top 100) from 1, 4 and 16 concurrent grpc.aio clients in this
process: queries/s, p50, and the server's and the client's CPU per query
(from ``/proc``). The two settings alternate for ``--rounds`` rounds, each
in a fresh server over the same index; each figure is the median of its
rounds. Every judged query's ranking is checked in every round: the ids
view against whole hits (which read each stored document), and the two
settings against each other; they must all be the same.

    OMP_NUM_THREADS=1 uv run python loadtest/bench_offload.py

writes ``loadtest/reports/offload.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_peer import free_port, level_stats, process_cpu_seconds

ROOT = Path(__file__).resolve().parents[1]
DATASET = ROOT.parent / "shared" / "data" / "ir" / "cranfield"
DEFAULT_OUTPUT = ROOT / "loadtest" / "reports" / "offload.json"
SETTINGS = {"thread": "0", "inline": None}  # None: the default budget


class Server:
    def __init__(self, data_dir: Path, inline_ms: str | None, log: Path) -> None:
        env = {**os.environ, "ATTEST_LEXICAL_BACKEND": "tantivy"}
        env.pop("ATTEST_LEXICAL_INLINE_SEARCH_MS", None)
        if inline_ms is not None:
            env["ATTEST_LEXICAL_INLINE_SEARCH_MS"] = inline_ms
        self.port = free_port(56210, 56299)
        cmd = [sys.executable, "-m", "attest.cli", "serve", "lexical", "--insecure-dev"]
        cmd += ["--port", str(self.port), "--data-dir", str(data_dir)]
        self.proc = subprocess.Popen(cmd, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)
        self.address = f"127.0.0.1:{self.port}"

    async def wait(self, limit_s: float = 300) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        deadline = time.monotonic() + limit_s
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError("attest serve lexical exited")
                try:
                    reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                await asyncio.sleep(0.3)
        raise RuntimeError("attest serve lexical not SERVING")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def index(address: str, dataset: Path) -> tuple[dict[str, str], int]:
    from attest.common.v1 import common_pb2
    from attest.core.channels import create_channel
    from attest.evaluation.ir import load_dataset
    from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc

    data = load_dataset(dataset)
    docs = [d for d in data.corpus() if d.title.strip() or d.text.strip()]
    async with create_channel(address) as channel:
        stub = lexical_pb2_grpc.LexicalServiceStub(channel)
        for i in range(0, len(docs), 200):
            batch = [
                common_pb2.Document(id=d.id, title=d.title, body=d.text) for d in docs[i : i + 200]
            ]
            await stub.Index(lexical_pb2.IndexRequest(documents=batch, refresh=True), timeout=600)
    return dict(data.judged_queries()), len(docs)


async def measure(
    address: str, queries: dict[str, str], levels: list[int], seconds: float, pid: int
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    from attest.common.v1 import common_pb2
    from attest.core.channels import create_channel
    from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc

    async with create_channel(address) as channel:
        stub = lexical_pb2_grpc.LexicalServiceStub(channel)

        async def search(text: str, view: int = common_pb2.HIT_VIEW_IDS) -> list[str]:
            reply = await stub.Search(
                lexical_pb2.SearchRequest(query=text, top_k=100, view=view), timeout=60
            )
            return [h.doc_id for h in reply.hits]

        ranked = {q: await search(t) for q, t in queries.items()}
        whole = {q: await search(t, common_pb2.HIT_VIEW_FULL) for q, t in queries.items()}
        ranked_again = {q: await search(t) for q, t in queries.items()}
        if not ranked == whole == ranked_again:
            raise RuntimeError("the ids view ranked differently from whole hits")
        out: dict[str, Any] = {}
        texts = itertools.cycle(list(queries.values()))
        for clients in levels:
            latencies: list[float] = []

            async def worker(until: float, keep: list[float] | None) -> None:
                while time.perf_counter() < until:
                    started = time.perf_counter()
                    await search(next(texts))
                    if keep is not None:
                        keep.append(time.perf_counter() - started)

            warm = time.perf_counter() + min(2.0, seconds)
            await asyncio.gather(*(worker(warm, None) for _ in range(clients)))
            server_cpu, client_cpu = process_cpu_seconds(pid), time.process_time()
            started = time.perf_counter()
            until = started + seconds
            await asyncio.gather(*(worker(until, latencies) for _ in range(clients)))
            stats = level_stats(latencies, time.perf_counter() - started)
            n = max(stats["queries"], 1)
            stats["server_cpu_ms_per_query"] = round(
                (process_cpu_seconds(pid) - server_cpu) / n * 1e3, 3
            )
            stats["client_cpu_ms_per_query"] = round(
                (time.process_time() - client_cpu) / n * 1e3, 3
            )
            out[str(clients)] = stats
    return out, ranked


async def run(args: argparse.Namespace) -> dict[str, Any]:
    report: dict[str, Any] = {
        "command": "uv run python loadtest/bench_offload.py " + " ".join(sys.argv[1:]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "dataset": args.dataset.name,
        "rounds": {name: [] for name in SETTINGS},
    }
    with tempfile.TemporaryDirectory(prefix="attest-offload-") as tmp:
        data_dir, log = Path(tmp) / "data", Path(tmp) / "server.log"
        rankings: dict[str, dict[str, list[str]]] = {}
        for round_ in range(args.rounds):
            order = list(SETTINGS) if round_ % 2 == 0 else list(reversed(SETTINGS))
            for name in order:
                server = Server(data_dir, SETTINGS[name], log)
                try:
                    await server.wait()
                    if "documents" not in report:
                        queries, report["documents"] = await index(server.address, args.dataset)
                        report["queries"] = len(queries)
                    levels, ranked = await measure(
                        server.address, queries, args.levels, args.seconds, server.proc.pid
                    )
                finally:
                    server.stop()
                if rankings.setdefault(name, ranked) != ranked:
                    raise RuntimeError(f"{name}: rankings changed between rounds")
                report["rounds"][name].append(levels)
                for level, stats in levels.items():
                    print(
                        f"round {round_ + 1} {name:<6} c={level:<3} {stats['qps']:8.1f} q/s  "
                        f"server {stats['server_cpu_ms_per_query']:.3f} ms/q  "
                        f"client {stats['client_cpu_ms_per_query']:.3f} ms/q",
                        flush=True,
                    )
    report["same_rankings"] = rankings["thread"] == rankings["inline"]
    summary: dict[str, Any] = {}
    for level in map(str, args.levels):
        row: dict[str, Any] = {}
        for name in SETTINGS:
            runs = [r[level] for r in report["rounds"][name]]
            row[name] = {
                key: statistics.median(r[key] for r in runs)
                for key in ("qps", "p50_ms", "server_cpu_ms_per_query", "client_cpu_ms_per_query")
            }
        row["server_cpu_inline_over_thread"] = round(
            row["inline"]["server_cpu_ms_per_query"] / row["thread"]["server_cpu_ms_per_query"], 3
        )
        row["qps_inline_over_thread"] = round(row["inline"]["qps"] / row["thread"]["qps"], 3)
        summary[level] = row
    report["median"] = summary
    return report


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", type=Path, default=DATASET)
    p.add_argument("--levels", default="1,4,16")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = p.parse_args()
    args.levels = [int(x) for x in args.levels.split(",")]
    report = asyncio.run(run(args))
    for level, row in report["median"].items():
        print(
            f"c={level:<3} server CPU per query, inline / thread: "
            f"{row['server_cpu_inline_over_thread']:.2f}; queries/s: "
            f"{row['qps_inline_over_thread']:.2f}"
        )
    print(f"same rankings: {report['same_rankings']}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output}")
    return 0 if report["same_rankings"] else 1


if __name__ == "__main__":
    sys.exit(main())
