"""Concurrency ramp of Attest's public RPCs with ghz, against a running stack.

Scenarios (``--scenario``, repeatable):

- ``bm25``: ``LexicalService.Search`` (top 10 documents);
- ``dense``: ``SemanticService.Search`` (dense mode, top 10 documents);
- ``ask``: ``AnswerService.Ask`` with default options (extractive generation
  when no LLM is configured). A scenario whose service ``attest serve all``
  does not run stops with a message instead of measuring nothing.

Without ``--address`` the command starts the embedded stack itself
(``attest serve all`` on a free port with a fresh data directory), waits for
gRPC health SERVING, and indexes the first ``--docs`` Reuters-21578 articles
through ``LexicalService.Index`` and ``SemanticService.Index``. With
``--address HOST:PORT`` it measures whatever answers there (add ``--index`` to
load the same articles into it first).

Queries are article titles drawn with a fixed seed (``bench_lexical.draw_queries``)
and sent round robin by ghz. Each scenario runs at concurrency 1, 2, 4, ...
up to ``--max-concurrency``, each level a fixed number of calls sized to take
about ``--duration`` seconds at the throughput of the level before (after an
untimed warm-up), and stops early once two levels in a row raise throughput by less
than ``--gain`` over the best level before them (the stack is saturated). The
saturation point is the lowest concurrency whose throughput is within
``--gain`` of the peak.

Report: JSON (throughput, p50/p95/p99 of successful calls, calls by gRPC status
per level, the saturation point, SLO verdicts) and a PNG of throughput and
latency against concurrency. Service-level objectives per scenario come from
``loadtest/slo.json`` (or ``--slo``): at every level up to the saturation
point, p99 under ``max_p99_ms`` and errors under ``max_error_rate``; at the
saturation point, throughput of at least ``min_rps``. A broken objective exits
with status 2.

    python -m loadtest.grpc_load --scenario bm25 --scenario dense --docs 2000

ghz comes from ``--ghz``, ``$ATTEST_GHZ``, the CI tool cache
(``~/.cache/attest-ci/bin``) or PATH; when none is found it is built once with
``go install`` into that cache.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GHZ_MODULE = "github.com/bojand/ghz/cmd/ghz"
GHZ_VERSION = "v0.93.0"
TOOL_CACHE = Path.home() / ".cache" / "attest-ci" / "bin"
DEFAULT_SLO = ROOT / "loadtest" / "slo.json"


class LoadTestError(Exception):
    """A failure that ends the run with a message instead of a traceback."""


# -- scenarios ---------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    service: str  # the `attest serve` name that must be running
    proto: str  # relative to protos/
    call: str
    request: Callable[[str, int], dict[str, Any]]


SCENARIOS: dict[str, Scenario] = {
    "bm25": Scenario(
        name="bm25",
        service="lexical",
        proto="attest/lexical/v1/lexical.proto",
        call="attest.lexical.v1.LexicalService.Search",
        request=lambda q, k: {"query": q, "top_k": k, "level": "SEARCH_LEVEL_DOCUMENT"},
    ),
    "dense": Scenario(
        name="dense",
        service="semantic",
        proto="attest/semantic/v1/semantic.proto",
        call="attest.semantic.v1.SemanticService.Search",
        request=lambda q, k: {
            "query": q,
            "top_k": k,
            "level": "SEARCH_LEVEL_DOCUMENT",
            "mode": "SEARCH_MODE_DENSE",
        },
    ),
    "ask": Scenario(
        name="ask",
        service="answer",
        proto="attest/answer/v1/answer.proto",
        call="attest.answer.v1.AnswerService.Ask",
        request=lambda q, k: {"question": q, "options": {"rerank_top_k": k}},
    ),
}


# -- ghz results ---------------------------------------------------------------------


def status_name(ghz_status: str) -> str:
    """ghz's Go status names ("DeadlineExceeded") as gRPC names ("DEADLINE_EXCEEDED")."""
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", ghz_status).upper()


@dataclass
class Level:
    concurrency: int
    requests: int
    duration_s: float
    rps: float  # successful calls per second
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    statuses: dict[str, int]
    errors: dict[str, int]

    @property
    def error_rate(self) -> float:
        failed = sum(n for code, n in self.statuses.items() if code != "OK")
        return failed / self.requests if self.requests else 0.0


def parse_ghz(report: dict[str, Any], concurrency: int) -> Level:
    """One level from ghz's JSON report (latencies in nanoseconds)."""
    statuses = {
        status_name(k): int(v) for k, v in (report.get("statusCodeDistribution") or {}).items()
    }
    requests = int(report.get("count", 0))
    duration_s = float(report.get("total", 0)) / 1e9
    ok = statuses.get("OK", 0)
    percentiles: dict[int, float] = {}
    for entry in report.get("latencyDistribution") or []:
        percentiles[int(entry["percentage"])] = float(entry["latency"]) / 1e6
    return Level(
        concurrency=concurrency,
        requests=requests,
        duration_s=duration_s,
        rps=ok / duration_s if duration_s > 0 else 0.0,
        p50_ms=percentiles.get(50),
        p95_ms=percentiles.get(95),
        p99_ms=percentiles.get(99),
        statuses=statuses,
        errors={str(k): int(v) for k, v in (report.get("errorDistribution") or {}).items()},
    )


def saturation_index(levels: Sequence[Level], gain: float) -> int:
    """Index of the saturation point: the lowest concurrency within ``gain`` of peak throughput.

    More concurrency past that point adds at most ``gain`` (0.1 = 10 %) of
    throughput and only queues calls. Comparing with the peak rather than with
    the next level keeps one noisy level from calling saturation early.
    """
    peak = max(level.rps for level in levels)
    return next(i for i, level in enumerate(levels) if level.rps >= peak * (1 - gain))


def ramp_is_over(levels: Sequence[Level], gain: float, patience: int = 2) -> bool:
    """True once ``patience`` consecutive levels each failed to add ``gain`` throughput."""
    if len(levels) <= patience:
        return False
    best_before = max(level.rps for level in levels[:-patience])
    return all(level.rps < best_before * (1 + gain) for level in levels[-patience:])


@dataclass
class Slo:
    max_p99_ms: float
    max_error_rate: float
    min_rps: float


def check_slo(levels: Sequence[Level], saturation: int, slo: Slo) -> list[str]:
    """Broken objectives, as sentences; empty when all hold."""
    broken: list[str] = []
    for level in levels[: saturation + 1]:
        if level.p99_ms is None:
            broken.append(f"concurrency {level.concurrency}: no successful call")
        elif level.p99_ms > slo.max_p99_ms:
            broken.append(
                f"concurrency {level.concurrency}: p99 {level.p99_ms:.1f} ms > "
                f"{slo.max_p99_ms:g} ms"
            )
        if level.error_rate > slo.max_error_rate:
            broken.append(
                f"concurrency {level.concurrency}: error rate {level.error_rate:.4f} > "
                f"{slo.max_error_rate:g} ({level.statuses})"
            )
    if not levels or levels[saturation].rps < slo.min_rps:
        rps = levels[saturation].rps if levels else 0.0
        broken.append(f"throughput at saturation {rps:.1f}/s < {slo.min_rps:g}/s")
    return broken


def load_slo(path: Path, scenario: str) -> Slo:
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise LoadTestError(f"cannot read SLO file {path}: {exc}") from exc
    if scenario not in table:
        raise LoadTestError(f"{path} has no objectives for scenario {scenario!r}")
    entry = table[scenario]
    try:
        return Slo(
            max_p99_ms=float(entry["max_p99_ms"]),
            max_error_rate=float(entry["max_error_rate"]),
            min_rps=float(entry["min_rps"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise LoadTestError(f"{path}: scenario {scenario!r}: {exc!r}") from exc


# -- ghz -------------------------------------------------------------------------------


def find_ghz(explicit: str | None) -> str:
    for candidate in (explicit, os.environ.get("ATTEST_GHZ"), str(TOOL_CACHE / "ghz")):
        if candidate and Path(candidate).is_file():
            return candidate
    on_path = shutil.which("ghz")
    if on_path:
        return on_path
    if not shutil.which("go"):
        raise LoadTestError("ghz not found (--ghz, $ATTEST_GHZ or PATH) and no go to build it")
    print(f"building ghz {GHZ_VERSION} into {TOOL_CACHE} (once)", file=sys.stderr)
    TOOL_CACHE.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOBIN": str(TOOL_CACHE), "GOFLAGS": "-buildvcs=false"}
    subprocess.run(["go", "install", f"{GHZ_MODULE}@{GHZ_VERSION}"], check=True, env=env)
    return str(TOOL_CACHE / "ghz")


@dataclass
class GhzRun:
    ghz: str
    address: str
    scenario: Scenario
    protoset: Path
    data_file: Path
    timeout_s: float
    connections: int
    cpus: int

    def command(self, concurrency: int, total: int, output: Path) -> list[str]:
        # A fixed number of calls rather than --duration: when a duration runs
        # out ghz cuts the calls in flight and counts them as UNAVAILABLE.
        return [
            self.ghz,
            "--insecure",
            f"--protoset={self.protoset}",
            f"--call={self.scenario.call}",
            f"--data-file={self.data_file}",
            f"--concurrency={concurrency}",
            f"--connections={max(1, min(self.connections, concurrency))}",
            f"--total={total}",
            f"--timeout={self.timeout_s}s",
            f"--cpus={self.cpus}",
            "--format=json",
            f"--output={output}",
            self.address,
        ]

    def level(self, concurrency: int, total: int, expected_s: float) -> Level:
        with tempfile.TemporaryDirectory(prefix="attest-ghz-") as tmp:
            output = Path(tmp) / "report.json"
            proc = subprocess.run(
                self.command(concurrency, total, output),
                capture_output=True,
                text=True,
                check=False,
                timeout=10 * expected_s + self.timeout_s + 120,
            )
            if not output.is_file():
                raise LoadTestError(f"ghz failed ({proc.returncode}): {proc.stderr.strip()}")
            return parse_ghz(json.loads(output.read_text(encoding="utf-8")), concurrency)


# -- the embedded stack --------------------------------------------------------------


def build_protoset(scenarios: Sequence[Scenario], out: Path) -> Path:
    """A descriptor set of the scenarios' protos and their imports.

    ghz reads descriptors rather than parsing .proto files itself, because the
    parser in ghz predates proto3 ``optional`` fields, which the protos use.
    """
    return protoset_of(sorted({s.proto for s in scenarios}), out)


def protoset_of(protos: Sequence[str], out: Path) -> Path:
    """A descriptor set of ``protos`` (paths under protos/) and their imports."""
    cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{ROOT / 'protos'}"]
    cmd += ["--include_imports", f"--descriptor_set_out={out}", *protos]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT / "protos")
    if proc.returncode != 0:
        raise LoadTestError(f"protoc failed: {proc.stderr.strip()}")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def embedded_stack(ready_s: float, log: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """``attest serve all`` on a free port with a fresh data directory."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="attest-load-") as data_dir, log.open("wb") as out:
        address = f"127.0.0.1:{port}"
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            # In one process the ingest service must reach the indexes through
            # the lexical and semantic services next to it: opening them itself
            # would take a second tantivy writer lock on the same index.
            "ATTEST_INGEST_LEXICAL_ADDRESS": address,
            "ATTEST_INGEST_SEMANTIC_ADDRESS": address,
        }
        cmd = [sys.executable, "-m", "attest.cli", "serve", "all"]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--data-dir", data_dir]
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            wait_serving(address, proc, ready_s, log)
            yield address, proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def wait_serving(address: str, proc: subprocess.Popen[bytes], ready_s: float, log: Path) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + ready_s
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise LoadTestError(f"attest serve all exited with {proc.returncode}; see {log}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(1)
    raise LoadTestError(f"{address} did not report SERVING within {ready_s:.0f} s; see {log}")


def served_services() -> set[str]:
    from attest.cli import SERVICES

    return set(SERVICES)


async def index_articles(address: str, articles: Sequence[Any], services: set[str]) -> None:
    """Load the articles into the lexical and semantic indexes through their RPCs."""
    from tqdm import tqdm

    from attest.core.channels import create_channel
    from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
    from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc
    from loadtest.bench_lexical import to_proto

    batch = 64
    channel = create_channel(address)
    try:
        lexical = lexical_pb2_grpc.LexicalServiceStub(channel)
        semantic = semantic_pb2_grpc.SemanticServiceStub(channel)
        with tqdm(total=len(articles), desc="index", unit="doc") as bar:
            for start in range(0, len(articles), batch):
                docs = [to_proto(a) for a in articles[start : start + batch]]
                last = start + batch >= len(articles)
                if "lexical" in services:
                    await lexical.Index(
                        lexical_pb2.IndexRequest(documents=docs, refresh=last), timeout=600
                    )
                if "semantic" in services:
                    await semantic.Index(
                        semantic_pb2.IndexRequest(
                            documents=[semantic_pb2.IndexDocument(document=d) for d in docs]
                        ),
                        timeout=600,
                    )
                bar.update(len(docs))
    finally:
        await channel.close()


# -- report ------------------------------------------------------------------------------


@dataclass
class ScenarioReport:
    scenario: str
    call: str
    levels: list[Level]
    saturation_concurrency: int
    saturation_rps: float
    peak_rps: float
    slo: dict[str, float]
    slo_broken: list[str] = field(default_factory=list)


def level_dict(level: Level) -> dict[str, Any]:
    out = asdict(level)
    out["error_rate"] = round(level.error_rate, 6)
    for key in ("rps", "p50_ms", "p95_ms", "p99_ms", "duration_s"):
        if out[key] is not None:
            out[key] = round(out[key], 3)
    return out


def write_plot(reports: Sequence[ScenarioReport], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_rps, ax_lat) = plt.subplots(1, 2, figsize=(12, 4.5))
    for report in reports:
        xs = [level.concurrency for level in report.levels]
        (line,) = ax_rps.plot(xs, [level.rps for level in report.levels], marker="o")
        ax_rps.axvline(report.saturation_concurrency, color=line.get_color(), ls=":", lw=1)
        line.set_label(f"{report.scenario} (saturates at {report.saturation_concurrency})")
        color = line.get_color()
        for key, style in (("p50_ms", "-"), ("p95_ms", "--"), ("p99_ms", ":")):
            ys = [getattr(level, key) for level in report.levels]
            ax_lat.plot(
                xs, ys, ls=style, marker=".", color=color, label=f"{report.scenario} {key[:3]}"
            )
    ticks = sorted({level.concurrency for report in reports for level in report.levels})
    for ax in (ax_rps, ax_lat):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("concurrent requests")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    ax_rps.set_ylabel("successful calls / s")
    ax_rps.set_yscale("log")
    ax_rps.set_title("Throughput")
    ax_lat.set_ylabel("latency (ms)")
    ax_lat.set_yscale("log")
    ax_lat.set_title("Latency of successful calls")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- command -------------------------------------------------------------------------------


def concurrency_levels(maximum: int) -> list[int]:
    levels = [1]
    while levels[-1] * 2 <= maximum:
        levels.append(levels[-1] * 2)
    if levels[-1] != maximum:
        levels.append(maximum)
    return levels


def calls_per_level(rps: float, duration_s: float) -> int:
    """Calls that take about ``duration_s`` at ``rps``."""
    return max(1, round(rps * duration_s))


def run_scenario(run: GhzRun, args: argparse.Namespace, slo: Slo) -> ScenarioReport:
    from tqdm import tqdm

    # Untimed warm-up (caches, connections); it also sizes the first level.
    rps = run.level(1, args.warmup_calls, args.duration).rps
    levels: list[Level] = []
    plan = concurrency_levels(args.max_concurrency)
    with tqdm(plan, desc=run.scenario.name, unit="level") as bar:
        for concurrency in bar:
            # about --duration seconds at the throughput of the level before
            total = max(calls_per_level(rps, args.duration), 20 * concurrency)
            level = run.level(concurrency, total, args.duration)
            rps = max(level.rps, 1.0)
            levels.append(level)
            bar.set_postfix(c=concurrency, rps=f"{level.rps:.0f}", p99=f"{level.p99_ms}")
            if ramp_is_over(levels, args.gain):
                break
    sat = saturation_index(levels, args.gain)
    return ScenarioReport(
        scenario=run.scenario.name,
        call=run.scenario.call,
        levels=levels,
        saturation_concurrency=levels[sat].concurrency,
        saturation_rps=round(levels[sat].rps, 3),
        peak_rps=round(max(level.rps for level in levels), 3),
        slo=asdict(slo),
        slo_broken=check_slo(levels, sat, slo),
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    shared = Path(os.environ.get("ATTEST_SHARED_DIR", ROOT.parent / "shared"))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), default=None)
    p.add_argument("--address", help="HOST:PORT of a running stack (default: start one)")
    p.add_argument("--index", action="store_true", help="with --address: index the articles first")
    p.add_argument("--corpus", type=Path, default=shared / "data" / "news" / "reuters21578.jsonl")
    p.add_argument("--docs", type=int, default=2000, help="articles indexed (embedded stack)")
    p.add_argument("--queries", type=int, default=500)
    p.add_argument("--seed", type=int, default=13)
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--max-concurrency", type=int, default=64)
    p.add_argument("--duration", type=float, default=10.0, help="seconds per level")
    p.add_argument("--warmup-calls", type=int, default=100, help="untimed calls before the ramp")
    p.add_argument("--gain", type=float, default=0.10, help="growth below this ends the ramp")
    p.add_argument("--timeout", type=float, default=10.0, help="deadline of each call (s)")
    p.add_argument("--connections", type=int, default=4, help="HTTP/2 connections ghz opens")
    p.add_argument("--ghz-cpus", type=int, default=1, help="cores ghz may use")
    p.add_argument("--ghz", help="path of the ghz binary")
    p.add_argument("--slo", type=Path, default=DEFAULT_SLO)
    p.add_argument("--ready-timeout", type=float, default=900.0)
    p.add_argument("--replot", type=Path, help="only redraw the PNG of this JSON report")
    p.add_argument("--output", type=Path, default=ROOT / "loadtest" / "reports" / "grpc-load.json")
    args = p.parse_args(argv)
    args.scenario = args.scenario or ["bm25", "dense"]
    if args.max_concurrency < 1 or args.duration <= 0 or args.docs < 1 or args.queries < 1:
        p.error("--max-concurrency, --duration, --docs and --queries must be positive")
    return args


def run(args: argparse.Namespace) -> int:
    from loadtest.bench_lexical import draw_queries, load_articles

    if not args.corpus.is_file():
        raise LoadTestError(f"corpus not found: {args.corpus} (set ATTEST_SHARED_DIR)")
    scenarios = [SCENARIOS[name] for name in args.scenario]
    slos = {s.name: load_slo(args.slo, s.name) for s in scenarios}
    ghz = find_ghz(args.ghz)
    articles = load_articles(args.corpus, args.docs)
    queries = draw_queries(articles, args.queries, args.seed)

    with contextlib.ExitStack() as stack:
        if args.address:
            address, embedded = args.address, False
        else:
            missing = [s.name for s in scenarios if s.service not in served_services()]
            if missing:
                raise LoadTestError(
                    f"scenario {', '.join(missing)} needs a service `attest serve all` does not "
                    "run; point --address at a stack that has it"
                )
            log = ROOT / ".attest" / "loadtest" / "server.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            print(f"starting attest serve all (log: {log})", file=sys.stderr)
            address, _ = stack.enter_context(embedded_stack(args.ready_timeout, log))
            embedded = True
        if embedded or args.index:
            asyncio.run(index_articles(address, articles, {"lexical", "semantic"}))

        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="attest-load-")))
        protoset = build_protoset(scenarios, tmp / "attest.protoset")
        reports: list[ScenarioReport] = []
        for scenario in scenarios:
            data_file = tmp / f"{scenario.name}.json"
            data_file.write_text(
                json.dumps([scenario.request(q, args.top_k) for q in queries]), encoding="utf-8"
            )
            ghz_run = GhzRun(
                ghz=ghz,
                address=address,
                scenario=scenario,
                protoset=protoset,
                data_file=data_file,
                timeout_s=args.timeout,
                connections=args.connections,
                cpus=args.ghz_cpus,
            )
            reports.append(run_scenario(ghz_run, args, slos[scenario.name]))

    result = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "target": "embedded (attest serve all)" if embedded else address,
        "tool": f"ghz {GHZ_VERSION}",
        "corpus": {"path": args.corpus.name, "documents": len(articles)},
        "queries": {"count": len(queries), "seed": args.seed, "top_k": args.top_k},
        "levels": {
            "target_duration_s": args.duration,
            "warmup_calls": args.warmup_calls,
            "gain": args.gain,
        },
        "machine": {"cpus": os.cpu_count(), "load_1m": round(os.getloadavg()[0], 2)},
        "scenarios": [
            {
                **{k: v for k, v in asdict(r).items() if k != "levels"},
                "levels": [level_dict(level) for level in r.levels],
            }
            for r in reports
        ],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    plot = args.output.with_suffix(".png")
    write_plot(reports, plot)

    for r in reports:
        print(f"\n{r.scenario}  ({r.call})")
        print(f"{'conc':>5} {'rps':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}  statuses")
        for level in r.levels:
            print(
                f"{level.concurrency:>5} {level.rps:>8.1f} {level.p50_ms or 0:>8.1f} "
                f"{level.p95_ms or 0:>8.1f} {level.p99_ms or 0:>8.1f}  {level.statuses}"
            )
        print(
            f"saturation at concurrency {r.saturation_concurrency}: {r.saturation_rps:.1f}/s "
            f"(peak {r.peak_rps:.1f}/s)"
        )
        for broken in r.slo_broken:
            print(f"SLO broken: {broken}")
    print(f"\nwrote {args.output} and {plot}")
    return 2 if any(r.slo_broken for r in reports) else 0


def replot(report_path: Path) -> Path:
    """Draw the PNG of an existing JSON report again (next to it)."""
    data = json.loads(report_path.read_text(encoding="utf-8"))
    reports = []
    for entry in data["scenarios"]:
        levels = [
            Level(**{k: v for k, v in raw.items() if k != "error_rate"}) for raw in entry["levels"]
        ]
        reports.append(
            ScenarioReport(
                scenario=entry["scenario"],
                call=entry["call"],
                levels=levels,
                saturation_concurrency=entry["saturation_concurrency"],
                saturation_rps=entry["saturation_rps"],
                peak_rps=entry["peak_rps"],
                slo=entry["slo"],
                slo_broken=entry["slo_broken"],
            )
        )
    plot = report_path.with_suffix(".png")
    write_plot(reports, plot)
    return plot


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.replot is not None:
        print(f"wrote {replot(args.replot)}")
        return 0
    try:
        return run(args)
    except LoadTestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
