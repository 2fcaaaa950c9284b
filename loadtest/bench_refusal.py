"""The floor of a refusal: how fast a full answer service says RESOURCE_EXHAUSTED.

Issue 17 asks that every refused ``Ask`` be refused within 100 ms. This
benchmark isolates the cost of refusing from everything else a loaded
``serve all`` does: one ``attest serve answer`` process with one answer slot
and no queue (``ATTEST_ANSWER_LIMITS__MAX_IN_FLIGHT=1``, ``MAX_WAITING=0``),
whose downstream addresses point at a socket that accepts and never answers,
so the first question holds the slot for as long as the benchmark runs.
Then, ``--rounds`` times, ``--burst`` clients ask at once from one asyncio
client process, and every call's latency is recorded as its client saw it
(so it includes the client's own per-call work for the calls sent before it).

    uv run python loadtest/bench_refusal.py --burst 64 --burst 128

``--client ghz`` sends each burst with ghz, a Go gRPC client in a process of
its own (``--concurrency N --total N``: N calls at once), instead of N
coroutines of this Python process. Callers on other machines do not share a
client's interpreter; with the Python client each call's latency also holds
the client's own work on the calls sent before it (about 0.3 ms each here),
which is the client's cost, not the service's.

Prints, per burst size, the median and slowest refusal of each round, how
many took longer than 100 ms and the service's CPU time per refusal (from
/proc: user plus system time over the bursts of that size); writes loadtest/reports/refusal.json.
A benchmark command, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loadtest.grpc_load import (  # noqa: E402
    SCENARIOS,
    GhzRun,
    LoadTestError,
    find_ghz,
    free_port,
    protoset_of,
    status_name,
)

REPORT = ROOT / "loadtest" / "reports" / "refusal.json"
TARGET_S = 0.1


async def _burst(stub: Any, size: int) -> list[tuple[float, str]]:
    import grpc

    from attest.answer.v1 import answer_pb2

    async def one() -> tuple[float, str]:
        began = time.perf_counter()
        try:
            await stub.Ask(answer_pb2.AskRequest(question="what did the port charge?"), timeout=30)
            code = "OK"
        except grpc.aio.AioRpcError as err:
            code = err.code().name
        return time.perf_counter() - began, code

    return list(await asyncio.gather(*(one() for _ in range(size))))


class _Ghz:
    """One burst of N calls at once from ghz (a Go client in its own process),
    with the ``ask`` scenario's call and ghz command of ``grpc_load``."""

    def __init__(self, ghz: str, address: str, workdir: Path) -> None:
        scenario = SCENARIOS["ask"]
        data = workdir / "request.json"
        data.write_text(json.dumps({"question": "what did the port charge?"}), "utf-8")
        self.run = GhzRun(
            ghz=ghz,
            address=address,
            scenario=scenario,
            protoset=protoset_of([scenario.proto], workdir / "answer.pb"),
            data_file=data,
            timeout_s=30.0,
            connections=1,
            cpus=os.cpu_count() or 1,
        )
        self.output = workdir / "report.json"

    def burst(self, size: int) -> list[tuple[float, str]]:
        self.output.unlink(missing_ok=True)
        proc = subprocess.run(
            self.run.command(size, size, self.output),
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if not self.output.is_file():
            raise LoadTestError(f"ghz failed ({proc.returncode}): {proc.stderr.strip()}")
        details = json.loads(self.output.read_text("utf-8")).get("details") or []
        if len(details) != size:
            raise LoadTestError(f"ghz reported {len(details)} of {size} calls")
        return [(float(d["latency"]) / 1e9, status_name(str(d.get("status")))) for d in details]


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time a process has used so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text("ascii").rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(
    address: str, bursts: list[int], rounds: int, ghz: _Ghz | None = None, server_pid: int = 0
) -> tuple[dict[str, Any], dict[str, float]]:
    import grpc

    from attest.answer.v1 import answer_pb2, answer_pb2_grpc

    results: dict[str, Any] = {}
    cpu_per_refusal: dict[str, float] = {}
    async with grpc.aio.insecure_channel(address) as channel:
        await asyncio.wait_for(channel.channel_ready(), 300)
        stub = answer_pb2_grpc.AnswerServiceStub(channel)
        holder = asyncio.ensure_future(
            stub.Ask(answer_pb2.AskRequest(question="hold the only slot"), timeout=3600)
        )
        await asyncio.sleep(2.0)
        try:
            for size in bursts:
                per_round = []
                cpu_before = _cpu_seconds(server_pid) if server_pid else 0.0
                for _ in range(rounds):
                    calls = (
                        await asyncio.to_thread(ghz.burst, size)
                        if ghz is not None
                        else await _burst(stub, size)
                    )
                    latencies = sorted(s for s, _ in calls)
                    per_round.append(
                        {
                            "codes": sorted({c for _, c in calls}),
                            "p50_ms": round(statistics.median(latencies) * 1000, 1),
                            "max_ms": round(latencies[-1] * 1000, 1),
                            "over_target": sum(s > TARGET_S for s in latencies),
                        }
                    )
                    await asyncio.sleep(0.5)
                results[str(size)] = per_round
                if server_pid:
                    spent = _cpu_seconds(server_pid) - cpu_before
                    cpu_per_refusal[str(size)] = round(spent * 1000 / (size * rounds), 3)
        finally:
            holder.cancel()
    return results, cpu_per_refusal


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--burst", type=int, action="append", help="repeatable; 64 128")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--output", type=Path, default=REPORT)
    parser.add_argument(
        "--client",
        choices=("python", "ghz"),
        default="python",
        help="who sends the bursts: coroutines of this process, or ghz in its own process",
    )
    parser.add_argument("--ghz", help="path of ghz (default: $ATTEST_GHZ, PATH, or built once)")
    args = parser.parse_args()
    bursts = args.burst or [64, 128]
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(1024)
    dead_end = f"127.0.0.1:{hole.getsockname()[1]}"
    port = free_port()
    env = {
        **os.environ,
        "ATTEST_ANSWER_LEXICAL_ADDRESS": dead_end,
        "ATTEST_ANSWER_SEMANTIC_ADDRESS": dead_end,
        "ATTEST_ANSWER_RERANK_ADDRESS": dead_end,
        "ATTEST_ANSWER_GENERATE_ADDRESS": dead_end,
        "ATTEST_ANSWER_LIMITS__MAX_IN_FLIGHT": "1",
        "ATTEST_ANSWER_LIMITS__MAX_WAITING": "0",
        "ATTEST_ANSWER_TIMEOUTS__RETRIEVE": "600",
    }
    cmd = [sys.executable, "-m", "attest.cli", "serve", "answer", "--insecure-dev"]
    server = subprocess.Popen(
        [*cmd, "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    workdir = tempfile.TemporaryDirectory(prefix="attest-refusal-")
    try:
        address = f"127.0.0.1:{port}"
        ghz = (
            _Ghz(find_ghz(args.ghz), address, Path(workdir.name)) if args.client == "ghz" else None
        )
        results, cpu = asyncio.run(measure(address, bursts, args.rounds, ghz, server.pid))
    finally:
        workdir.cleanup()
        server.terminate()
        server.wait(timeout=60)
        hole.close()
    for size, rounds in results.items():
        print(
            f"{size} at once: median refusal per round "
            f"{[r['p50_ms'] for r in rounds]} ms; slowest {[r['max_ms'] for r in rounds]} ms; "
            f"over {TARGET_S * 1000:.0f} ms {sum(r['over_target'] for r in rounds)} "
            f"of {int(size) * len(rounds)}; "
            f"codes {sorted({c for r in rounds for c in r['codes']})}; "
            f"server CPU {cpu[size]:.3f} ms per refusal"
        )
    report = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "load_1m": os.getloadavg()[0],
        "rounds": args.rounds,
        "client": args.client,
        "bursts": results,
        "server_cpu_ms_per_refusal": cpu,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
