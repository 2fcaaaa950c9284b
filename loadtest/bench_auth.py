"""What authentication and TLS add to a call, next to the plain path in the same run.

Starts four servers, each a separate process hosting the same public servicer
(``AnswerService.Get`` answering from memory, so the call is all transport and
perimeter): ``plain`` (no authentication, plain text: the ``--insecure-dev``
path), ``api-key`` (an API key checked against a keys file, plain text),
``tls+api-key`` and ``tls+jwt`` (an RS256 JWT checked against a JWKS file, over
TLS). Certificates, keys and tokens are made for the run (``cryptography``,
PyJWT). One client per server, with its connection open, calls ``Get`` one
call at a time; the servers are measured in turns, ``--cycles`` times
``--calls`` calls each after a warm-up, so a drift of a busy machine spreads
over all of them. Reports p50/p90/p99 per path and the overhead of each path
over ``plain`` at p50, as JSON in ``loadtest/reports/auth-overhead.json``.

    python loadtest/bench_auth.py [--calls 2000] [--cycles 5]

Exits 1 when the p50 overhead of ``tls+api-key`` or ``tls+jwt`` over ``plain``
is above ``--max-overhead-ms`` (0.5). This is a benchmark command, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
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

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.perimeter import (  # noqa: E402
    AUDIENCE,
    ISSUER,
    Issuer,
    make_pki,
    write_keys,
)

from attest.answer.v1 import answer_pb2, answer_pb2_grpc  # noqa: E402
from attest.core.auth import new_api_key  # noqa: E402

REPORT = ROOT / "loadtest" / "reports" / "auth-overhead.json"
PATHS = ("plain", "api-key", "tls+api-key", "tls+jwt")


def _settings(path: str, folder: Path) -> dict[str, Any]:
    settings: dict[str, Any] = {"host": "127.0.0.1", "port": 0}
    if path == "plain":
        settings["insecure_dev"] = True
        return settings
    settings["auth"] = {
        "keys_file": str(folder / "keys.json"),
        "jwks_file": str(folder / "jwks.json"),
        "issuer": ISSUER,
        "audience": AUDIENCE,
    }
    if path.startswith("tls"):
        settings["tls"] = {
            "cert_file": str(folder / "pki" / "server.pem"),
            "key_file": str(folder / "pki" / "server.key"),
        }
    return settings


def serve(spec: str) -> None:
    """Child process: serve TenantAnswer with these ServerSettings; print the port."""
    from tests.integration.perimeter import TenantAnswer

    from attest.core.server import Server
    from attest.core.settings import ServerSettings

    settings = ServerSettings.model_validate(json.loads(spec))

    async def run() -> None:
        server = Server([TenantAnswer()], settings)
        port = await server.start()
        await server.ready.wait()
        print(port, flush=True)
        # Until the parent closes our stdin.
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await server.stop(0)

    asyncio.run(run())


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {
        "p50_ms": round(at(0.50), 4),
        "p90_ms": round(at(0.90), 4),
        "p99_ms": round(at(0.99), 4),
        "mean_ms": round(statistics.fmean(ordered) * 1000, 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per turn")
    parser.add_argument("--cycles", type=int, default=5, help="turns per path")
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--max-overhead-ms", type=float, default=0.5)
    parser.add_argument("--output", type=Path, default=REPORT)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return 0

    with tempfile.TemporaryDirectory(prefix="attest-bench-auth-") as tmp:
        folder = Path(tmp)
        pki = make_pki(folder / "pki")
        issuer = Issuer(folder)
        key = new_api_key()
        # A realistic keys file: the caller's key among a thousand others.
        entries: list[dict[str, Any]] = [
            {"id": f"k{i}", "key": new_api_key(), "tenant": f"t{i}", "scopes": ["ask"]}
            for i in range(999)
        ]
        entries.append({"id": "bench", "key": key, "tenant": "acme", "scopes": ["ask"]})
        write_keys(folder / "keys.json", entries)
        token = issuer.token(tenant="acme", scope="ask", expires_in=3600)

        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        children: dict[str, subprocess.Popen[str]] = {}
        channels: dict[str, grpc.Channel] = {}
        metadata: dict[str, tuple[tuple[str, str], ...]] = {
            "plain": (),
            "api-key": (("authorization", f"Bearer {key}"),),
            "tls+api-key": (("authorization", f"Bearer {key}"),),
            "tls+jwt": (("authorization", f"Bearer {token}"),),
        }
        try:
            for path in PATHS:
                spec = json.dumps(_settings(path, folder))
                child = subprocess.Popen(
                    [sys.executable, __file__, "--serve", spec],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env=env,
                    cwd=ROOT,
                )
                children[path] = child
                assert child.stdout is not None
                port = int(child.stdout.readline())
                address = f"localhost:{port}"
                if path.startswith("tls"):
                    credentials = grpc.ssl_channel_credentials(
                        root_certificates=pki.ca.read_bytes()
                    )
                    channels[path] = grpc.secure_channel(address, credentials)
                else:
                    channels[path] = grpc.insecure_channel(address)
            stubs = {p: answer_pb2_grpc.AnswerServiceStub(c) for p, c in channels.items()}
            request = answer_pb2.GetRequest(job_id="bench")
            for path, stub in stubs.items():
                reply = stub.Get(request, metadata=metadata[path], timeout=5)
                expected = "default|" if path == "plain" else "acme|"
                assert reply.job.job_id == expected, (path, reply.job.job_id)
                for _ in range(args.warmup):
                    stub.Get(request, metadata=metadata[path], timeout=5)
            samples: dict[str, list[float]] = {p: [] for p in PATHS}
            per_cycle: dict[str, list[float]] = {p: [] for p in PATHS}
            began = time.perf_counter()
            for _cycle in range(args.cycles):
                for path in PATHS:
                    stub, md = stubs[path], metadata[path]
                    turn: list[float] = []
                    for _ in range(args.calls):
                        t0 = time.perf_counter()
                        stub.Get(request, metadata=md, timeout=5)
                        turn.append(time.perf_counter() - t0)
                    samples[path].extend(turn)
                    per_cycle[path].append(round(statistics.median(turn) * 1000, 4))
            took = time.perf_counter() - began
        finally:
            for channel in channels.values():
                channel.close()
            for child in children.values():
                if child.stdin is not None:
                    child.stdin.close()
            for child in children.values():
                try:
                    child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()

    results = {p: {**_percentiles(s), "calls": len(s)} for p, s in samples.items()}
    plain = results["plain"]["p50_ms"]
    overhead = {
        p: {
            "p50_ms": round(results[p]["p50_ms"] - plain, 4),
            "p99_ms": round(results[p]["p99_ms"] - results["plain"]["p99_ms"], 4),
            # the same difference within each turn, to show it holds cycle by cycle
            "p50_ms_by_cycle": [
                round(a - b, 4) for a, b in zip(per_cycle[p], per_cycle["plain"], strict=True)
            ],
        }
        for p in PATHS
        if p != "plain"
    }
    worst = max(overhead["tls+api-key"]["p50_ms"], overhead["tls+jwt"]["p50_ms"])
    report = {
        "benchmark": "auth-overhead",
        "method": "AnswerService.Get answered from memory, one call at a time, sync grpc "
        "client, one server process per path, paths measured in turns",
        "calls_per_turn": args.calls,
        "cycles": args.cycles,
        "keys_in_file": len(entries),
        "jwt": "RS256, 2048-bit key, JWKS file",
        "tls": "TLS 1.3 (grpc default), ECDSA P-256 server certificate, connection kept open",
        "results": results,
        "overhead_vs_plain": overhead,
        "max_overhead_ms": args.max_overhead_ms,
        "worst_tls_p50_overhead_ms": round(worst, 4),
        "pass": worst <= args.max_overhead_ms,
        "seconds": round(took, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
            "grpc": grpc.__version__,
        },
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    for path in PATHS:
        r = results[path]
        extra = "" if path == "plain" else f"  overhead p50 {overhead[path]['p50_ms']:+.3f} ms"
        print(
            f"{path:12s} p50 {r['p50_ms']:.3f} ms  p90 {r['p90_ms']:.3f}  "
            f"p99 {r['p99_ms']:.3f}{extra}"
        )
    print(f"wrote {args.output}")
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
