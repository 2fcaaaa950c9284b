"""Time from launching ``attest serve all --embedded`` to gRPC health SERVING.

Each start launches ``python -m attest.cli serve all --embedded --port P
--data-dir DIR`` (a copy of ``--data-dir`` per start unless ``--in-place``),
polls ``grpc.health.v1.Health/Check`` for the whole server (service ``""``)
every 0.1 s and records the seconds from launch to SERVING; then it stops
the process with SIGTERM. With ``--repo`` the command runs from another
checkout (a ``git worktree`` of an older commit): this environment's
interpreter and packages with that checkout's ``services`` first on the path,
so two commits with the same dependencies are measured side by side in one
run, alternating start by start:

    uv run python loadtest/bench_startup.py --data-dir /tmp/d --starts 5 \\
        --repo before=/tmp/attest-before --repo after=. --out loadtest/reports/startup.json

An empty ``--data-dir`` that does not exist yet measures the floor (imports,
model loads). ``--importtime`` adds ``-X importtime`` to the first start of
each checkout and keeps its stderr, the top cumulative imports in the report.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=1
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def top_imports(stderr: str, n: int = 15) -> list[tuple[str, float]]:
    """The ``n`` top-level imports with the largest cumulative time (seconds)."""
    rows: list[tuple[str, float]] = []
    for line in stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)$", line)
        if m and not m.group(2).strip(" ") and len(m.group(2)) <= 1:
            rows.append((m.group(3), int(m.group(1)) / 1e6))
    return sorted(rows, key=lambda r: -r[1])[:n]


def start_once(
    repo: Path, data_dir: Path, timeout: float, importtime: bool, env: dict[str, str]
) -> tuple[float, str]:
    port = free_port()
    # This environment's interpreter and packages, the checkout's own sources first.
    sources = [str(repo / "services"), str(repo / "services" / "attestpb")]
    env = {**env, "PYTHONPATH": os.pathsep.join(sources)}
    command = [sys.executable]
    if importtime:
        command += ["-X", "importtime"]
    command += [
        "-m",
        "attest.cli",
        "serve",
        "all",
        "--embedded",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
    ]
    with tempfile.TemporaryFile("w+") as err:
        began = time.monotonic()
        proc = subprocess.Popen(
            command,
            cwd=repo,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
        try:
            while not serving(f"127.0.0.1:{port}"):
                if proc.poll() is not None:
                    err.seek(0)
                    tail = err.read()[-3000:]
                    raise SystemExit(f"serve all exited with {proc.returncode}:\n{tail}")
                if time.monotonic() - began > timeout:
                    raise SystemExit(f"not SERVING after {timeout:.0f} s")
                time.sleep(0.1)
            elapsed = time.monotonic() - began
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        err.seek(0)
        return elapsed, err.read()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument(
        "--repo",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="A checkout to start (repeatable); default this one.",
    )
    parser.add_argument("--in-place", action="store_true", help="Start on --data-dir itself.")
    parser.add_argument("--importtime", action="store_true")
    parser.add_argument(
        "--stderr-dir", type=Path, default=None, help="Keep each start's stderr here."
    )
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    repos = {
        name: Path(path).resolve()
        for name, path in (r.split("=", 1) for r in args.repo or [f"this={Path.cwd()}"])
    }
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    times: dict[str, list[float]] = {name: [] for name in repos}
    imports: dict[str, list[tuple[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="attest-startup-") as scratch:
        for i in range(args.starts):
            for name, repo in repos.items():
                if args.in_place:
                    data_dir = args.data_dir
                else:
                    data_dir = Path(scratch) / f"{name}-{i}"
                    if args.data_dir.exists():
                        shutil.copytree(args.data_dir, data_dir)
                want_imports = args.importtime and i == 0
                seconds, stderr = start_once(repo, data_dir, args.timeout, want_imports, env)
                if want_imports:
                    imports[name] = top_imports(stderr)
                if args.stderr_dir:
                    args.stderr_dir.mkdir(parents=True, exist_ok=True)
                    (args.stderr_dir / f"{name}-{i}.stderr").write_text(stderr)
                times[name].append(round(seconds, 2))
                print(f"{name} start {i + 1}: {seconds:.2f} s to SERVING", flush=True)
                if not args.in_place:
                    shutil.rmtree(data_dir, ignore_errors=True)
    report: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "data_dir": str(args.data_dir),
        "starts": args.starts,
        "load_average": os.getloadavg(),
        "seconds_to_serving": times,
        "median_s": {name: statistics.median(t) for name, t in times.items()},
    }
    if imports:
        report["top_imports_first_start_s"] = imports
    for name, t in times.items():
        print(f"{name}: median {statistics.median(t):.2f} s over {len(t)} starts {t}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
