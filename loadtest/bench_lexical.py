"""How much the lexical service's gRPC layer adds to a backend's search latency.

For each backend this starts ``attest serve lexical`` as a separate process (a
fresh index, a temporary data directory, a free port), waits for gRPC health
SERVING, indexes the first ``--docs`` Reuters-21578 articles that have a body
through ``LexicalService.Index``, and times ``LexicalService.Search`` (top 10,
document level) at each ``--concurrency``. In the same run it times the bare
backend (``attest.lexical.backends.create_backend`` with the same settings,
called in this process) on the same index with the same queries and
concurrency levels. The overhead is service minus bare, at p50 and at p99.

tantivy allows one writer per index and ``TantivyBackend.warm_up`` opens one,
so the bare measurement of every backend runs after its service process has
exited, against the same index. To spread drifts of a busy machine over both
paths, measurements alternate ``--cycles`` times: service (the first process
indexes, later ones are fresh processes on the same index), bare, service,
bare. Each level is timed over the whole query set ``--rounds`` times after an
untimed warm-up; the CPU each process spent per request and the load average
are reported beside the latencies, because on a machine with other load the
latency includes waiting for a CPU.

    python loadtest/bench_lexical.py --docs 20000 --backend tantivy --backend opensearch \\
        --opensearch-url http://127.0.0.1:9200

``--client ghz`` makes the timed service calls with ghz, a Go gRPC client, in
a process of its own: with the default Python client (grpc.aio) the client's
own per-call cost, about 1 ms here, is part of the "service" latency.

Exits 1 when the concurrency-1 p50 overhead of a backend exceeds
``--max-overhead-ms``. This is a benchmark command, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

import grpc
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tqdm import tqdm

from attest.common.v1 import common_pb2
from attest.core.channels import create_channel
from attest.lexical.backends import create_backend
from attest.lexical.models import Level, SearchQuery
from attest.lexical.settings import LexicalSettings, OpenSearchSettings
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc

if TYPE_CHECKING:
    from attest.lexical.v1.lexical_pb2_grpc import LexicalServiceAsyncStub

BackendName = Literal["tantivy", "opensearch"]
LEXICAL = "attest.lexical.v1.LexicalService"
TENANT = "default"  # the tenant the service's interceptor assigns to every caller
TOP_K = 10
HERE = Path(__file__).resolve().parent
# The public data folder lies beside the repository.
DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "shared/data/news/reuters21578.jsonl"
DEFAULT_OUTPUT = HERE / "reports" / "lexical-overhead.json"

# One query: index into the query set; the coroutine returns the hit doc ids.
Call = Callable[[int], Awaitable[list[str]]]


class BenchError(Exception):
    """A failure that ends the run with a message instead of a traceback."""


# -- corpus and queries ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Article:
    id: str
    title: str
    body: str
    published_at: datetime | None
    organizations: tuple[str, ...]


def _reuters_date(value: str) -> datetime | None:
    # "26-FEB-1987 15:01:01.79"; a few records carry garbage, which is left unset.
    try:
        return datetime.strptime(value.strip(), "%d-%b-%Y %H:%M:%S.%f").replace(tzinfo=UTC)
    except ValueError:
        return None


def load_articles(path: Path, limit: int) -> list[Article]:
    """The first ``limit`` articles of the JSONL corpus whose body is not blank."""
    articles: list[Article] = []
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if len(articles) >= limit:
                break
            if not line.strip():
                continue
            raw = json.loads(line)
            body = str(raw.get("body") or "")
            if not body.strip():
                continue
            articles.append(
                Article(
                    id=str(raw["id"]),
                    title=str(raw.get("title") or ""),
                    body=body,
                    published_at=_reuters_date(str(raw.get("date") or "")),
                    organizations=tuple(str(o) for o in raw.get("orgs") or ()),
                )
            )
    return articles


def draw_queries(articles: Sequence[Article], count: int, seed: int) -> list[str]:
    """``count`` queries drawn deterministically from the indexed articles.

    A query is the lower-cased title of an article picked with
    ``random.Random(seed)``: without replacement while there are enough titled
    articles, with replacement beyond. Headlines are short keyword strings
    (median seven words, e.g. "bp oil raises operating profit") whose terms
    are known to occur in the index, so every query does real BM25 work and
    returns hits. Lower-casing keeps the all-caps Reuters headlines from
    reading as shouted acronyms; the analyzers lower-case anyway, so scores do
    not change.
    """
    titles = [" ".join(a.title.lower().split()) for a in articles if a.title.strip()]
    if not titles:
        raise BenchError("no article in the corpus slice has a title to draw queries from")
    rng = random.Random(seed)
    if count <= len(titles):
        return rng.sample(titles, count)
    return [rng.choice(titles) for _ in range(count)]


def to_proto(article: Article) -> common_pb2.Document:
    doc = common_pb2.Document(
        id=article.id,
        title=article.title,
        body=article.body,
        organizations=list(article.organizations),
    )
    if article.published_at is not None:
        ts = Timestamp()
        ts.FromDatetime(article.published_at)
        doc.published_at.CopyFrom(ts)
    return doc


# -- latency measurement ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Latency:
    requests: int
    wall_s: float
    throughput_qps: float
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float


def percentile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(latencies_s: Sequence[float], wall_s: float) -> Latency:
    ordered = sorted(x * 1000.0 for x in latencies_s)
    return Latency(
        requests=len(ordered),
        wall_s=round(wall_s, 4),
        throughput_qps=round(len(ordered) / wall_s, 1) if wall_s > 0 else math.nan,
        mean_ms=round(sum(ordered) / len(ordered), 4),
        p50_ms=round(percentile(ordered, 50), 4),
        p90_ms=round(percentile(ordered, 90), 4),
        p99_ms=round(percentile(ordered, 99), 4),
        max_ms=round(ordered[-1], 4),
    )


async def drive(
    call: Call, order: Sequence[int], concurrency: int, latencies: list[float] | None = None
) -> dict[int, list[str]]:
    """Run ``call`` over ``order`` with ``concurrency`` workers issuing requests back to back.

    Workers share one iterator (safe: one event loop, no await between taking an
    item and starting the call), so the level keeps exactly ``concurrency``
    requests in flight until the order runs out.
    """
    items = iter(order)
    answers: dict[int, list[str]] = {}

    async def worker() -> None:
        for i in items:
            started = time.perf_counter()
            ids = await call(i)
            elapsed = time.perf_counter() - started
            if latencies is not None:
                latencies.append(elapsed)
            answers[i] = ids
            # Yield once before the next request. Without it a worker that just
            # released a pooled connection (aiohttp, for the bare OpenSearch
            # client) takes it straight back before the waiters woken for it
            # run, and a few requests starve for the whole level.
            await asyncio.sleep(0)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return answers


@dataclass(slots=True)
class Sample:
    """The timed requests of one level in one measurement."""

    latencies_s: list[float]
    wall_s: float
    # CPU seconds the timed requests cost this process (all threads) and the
    # service process (None for the bare path, or where /proc is missing).
    bench_cpu_s: float
    service_cpu_s: float | None
    load_1m: float


def process_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of every thread of ``pid`` so far (Linux /proc)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def load_1m() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return math.nan


@dataclass(slots=True)
class PathResult:
    """One measurement of one way of querying (service or bare), every level."""

    levels: dict[int, Sample] = field(default_factory=dict)
    answers: dict[int, list[str]] = field(default_factory=dict)


async def measure(
    label: str,
    call: Call,
    queries: Sequence[str],
    concurrency_levels: Sequence[int],
    *,
    rounds: int,
    warmup: int,
    service_pid: int | None = None,
) -> PathResult:
    result = PathResult()
    n = len(queries)
    # Warm-up: one untimed pass over the whole query set (engine caches, the
    # connection, lazily built Python paths), which also records the answers
    # compared between the two paths.
    result.answers = await drive(call, range(n), max(concurrency_levels))
    for concurrency in concurrency_levels:
        # A short warm-up at the level itself, so thread pools and HTTP/2
        # streams are at their steady size before timing starts.
        await drive(call, [i % n for i in range(max(warmup, concurrency))], concurrency)
        latencies: list[float] = []
        order = list(range(n)) * rounds
        service_cpu = process_cpu_seconds(service_pid)
        bench_cpu = time.process_time()
        started = time.perf_counter()
        await drive(call, order, concurrency, latencies)
        wall = time.perf_counter() - started
        bench_cpu = time.process_time() - bench_cpu
        service_after = process_cpu_seconds(service_pid)
        result.levels[concurrency] = record(
            label, "bench", concurrency, latencies, wall, bench_cpu, service_cpu, service_after
        )
    return result


def record(
    label: str,
    client: str,
    concurrency: int,
    latencies: list[float],
    wall: float,
    client_cpu: float,
    service_before: float | None,
    service_after: float | None,
) -> Sample:
    """One timed level as a ``Sample``, printed as a line of progress."""
    sample = Sample(
        latencies_s=latencies,
        wall_s=wall,
        bench_cpu_s=client_cpu,
        service_cpu_s=(
            None
            if service_before is None or service_after is None
            else service_after - service_before
        ),
        load_1m=load_1m(),
    )
    stats = summarize(sample.latencies_s, sample.wall_s)
    cpu = f"CPU/req {client} {client_cpu / len(latencies) * 1e3:.2f} ms"
    if sample.service_cpu_s is not None:
        cpu += f", service {sample.service_cpu_s / len(latencies) * 1e3:.2f} ms"
    print(
        f"  {label:<10} c={concurrency:<3} p50 {stats.p50_ms:8.3f} ms  "
        f"p99 {stats.p99_ms:8.3f} ms  {stats.throughput_qps:8.1f} q/s  "
        f"({cpu}; load {sample.load_1m:.1f})",
        flush=True,
    )
    return sample


# -- ghz as the client ----------------------------------------------------------------


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_ghz(
    ghz: str, address: str, protoset: Path, data: Path, concurrency: int, total: int
) -> tuple[list[float], float]:
    """(latency of every call in seconds, wall seconds) of one ghz run; every call must be OK."""
    with tempfile.TemporaryDirectory(prefix="attest-ghz-") as tmp:
        output = Path(tmp) / "report.json"
        cmd = [
            ghz,
            "--insecure",
            f"--protoset={protoset}",
            f"--call={LEXICAL}/Search",
            f"--data-file={data}",
            f"--concurrency={concurrency}",
            "--connections=1",
            f"--total={total}",
            "--timeout=30s",
            "--format=json",
            f"--output={output}",
            address,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
        if not output.is_file():
            raise BenchError(f"ghz failed ({proc.returncode}): {proc.stderr.strip()}")
        report = json.loads(output.read_text(encoding="utf-8"))
    details = report.get("details") or []
    bad = [d for d in details if d.get("status") != "OK"]
    if bad or len(details) != total:
        raise BenchError(f"ghz: {len(details)} of {total} calls reported, {len(bad)} not OK")
    return [float(d["latency"]) / 1e9 for d in details], float(report["total"]) / 1e9


async def measure_ghz(
    label: str,
    ghz: str,
    address: str,
    call: Call,
    queries: Sequence[str],
    concurrency_levels: Sequence[int],
    *,
    rounds: int,
    warmup: int,
    service_pid: int | None,
) -> PathResult:
    """Like ``measure``, with the timed calls made by ghz (a Go client) rather than
    by this Python process, so the client's own cost stays out of the service's
    latency. The untimed pass that records the answers still uses ``call``."""
    result = PathResult()
    n = len(queries)
    result.answers = await drive(call, range(n), max(concurrency_levels))
    with tempfile.TemporaryDirectory(prefix="attest-bench-ghz-") as tmp:
        from grpc_load import LoadTestError, protoset_of

        try:
            protoset = protoset_of(["attest/lexical/v1/lexical.proto"], Path(tmp) / "lexical.pb")
        except LoadTestError as exc:
            raise BenchError(str(exc)) from exc
        data = Path(tmp) / "requests.json"
        data.write_text(
            json.dumps(
                [{"query": q, "top_k": TOP_K, "level": "SEARCH_LEVEL_DOCUMENT"} for q in queries]
            ),
            encoding="utf-8",
        )
        for concurrency in concurrency_levels:
            await asyncio.to_thread(
                run_ghz, ghz, address, protoset, data, concurrency, max(warmup, concurrency)
            )
            service_cpu = process_cpu_seconds(service_pid)
            client_cpu = children_cpu_seconds()
            latencies, wall = await asyncio.to_thread(
                run_ghz, ghz, address, protoset, data, concurrency, n * rounds
            )
            client_cpu = children_cpu_seconds() - client_cpu
            service_after = process_cpu_seconds(service_pid)
            result.levels[concurrency] = record(
                label, "ghz", concurrency, latencies, wall, client_cpu, service_cpu, service_after
            )
    return result


def pooled(runs: Sequence[PathResult], concurrency: int) -> Latency:
    """Every cycle's timed requests of one level as one distribution."""
    latencies = [x for run in runs for x in run.levels[concurrency].latencies_s]
    return summarize(latencies, sum(run.levels[concurrency].wall_s for run in runs))


def cpu_per_request(runs: Sequence[PathResult], concurrency: int) -> dict[str, float | None]:
    """Mean CPU milliseconds per timed request, by process."""
    samples = [run.levels[concurrency] for run in runs]
    requests = sum(len(s.latencies_s) for s in samples)
    service = [s.service_cpu_s for s in samples]
    return {
        "bench": round(sum(s.bench_cpu_s for s in samples) / requests * 1e3, 4),
        "service": (
            None
            if any(v is None for v in service)
            else round(sum(v or 0.0 for v in service) / requests * 1e3, 4)
        ),
    }


def p50_by_cycle(runs: Sequence[PathResult], concurrency: int) -> list[float]:
    return [
        summarize(run.levels[concurrency].latencies_s, run.levels[concurrency].wall_s).p50_ms
        for run in runs
    ]


# -- the service process ------------------------------------------------------------


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, slots=True)
class Target:
    """Where one backend's index lives and how the service reaches it."""

    backend: BackendName
    index_name: str
    data_dir: Path
    opensearch_url: str

    def settings(self) -> LexicalSettings:
        return LexicalSettings(
            backend=self.backend,
            index_name=self.index_name,
            data_dir=self.data_dir,
            opensearch=OpenSearchSettings(hosts=(self.opensearch_url,)),
        )

    def environment(self, host: str, port: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            {
                "ATTEST_LEXICAL_BACKEND": self.backend,
                "ATTEST_LEXICAL_INDEX_NAME": self.index_name,
                "ATTEST_DATA_DIR": str(self.data_dir),
                "ATTEST_LEXICAL_OPENSEARCH__HOSTS": json.dumps([self.opensearch_url]),
                "ATTEST_LEXICAL_SERVER__HOST": host,
                "ATTEST_LEXICAL_SERVER__PORT": str(port),
            }
        )
        return env


@dataclass(slots=True)
class ServiceProcess:
    process: asyncio.subprocess.Process
    address: str
    log_path: Path
    exit_code: int | None = None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


async def stop_service(service: ServiceProcess, grace_s: float = 30.0) -> int:
    """SIGTERM, wait for the graceful shutdown, SIGKILL only if it hangs."""
    proc = service.process
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace_s)
        except TimeoutError:
            print(f"  service pid {proc.pid} ignored SIGTERM for {grace_s:.0f}s; killing it")
            proc.kill()
            await proc.wait()
    code = proc.returncode
    assert code is not None
    service.exit_code = code
    return code


@contextlib.asynccontextmanager
async def service_process(
    target: Target, host: str, ready_s: float
) -> AsyncIterator[ServiceProcess]:
    """``python -m attest.cli serve lexical`` for ``target``, stopped with SIGTERM on exit."""
    port = free_port(host)
    log_path = target.data_dir / f"service-{target.backend}.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "attest.cli",
            "serve",
            "lexical",
            env=target.environment(host, port),
            cwd=target.data_dir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # Its own session: a Ctrl-C at the terminal reaches only this
            # process, which then stops the service itself with SIGTERM.
            start_new_session=True,
        )
    service = ServiceProcess(proc, f"{host}:{port}", log_path)
    try:
        await wait_serving(service, ready_s)
        yield service
    finally:
        code = await stop_service(service)
        print(f"  service pid {proc.pid} stopped with SIGTERM, exit code {code}")


async def wait_serving(service: ServiceProcess, ready_s: float) -> None:
    deadline = time.monotonic() + ready_s
    async with grpc.aio.insecure_channel(service.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            code = service.process.returncode
            if code is not None:
                raise BenchError(
                    f"the service exited with code {code} before serving:\n{service.log_tail()}"
                )
            try:
                reply = await health.Check(
                    health_pb2.HealthCheckRequest(service=LEXICAL), timeout=1.0
                )
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                # grpc turns the cancellation of the awaiting task (Ctrl-C,
                # SIGTERM) into a CANCELLED error; that one must not be retried.
                _reraise_cancellation()
            if time.monotonic() > deadline:
                raise BenchError(
                    f"the service was not SERVING after {ready_s:.0f}s:\n{service.log_tail()}"
                )
            await asyncio.sleep(0.2)


# -- one backend ----------------------------------------------------------------------


@dataclass(slots=True)
class LevelReport:
    service: Latency
    bare: Latency
    overhead_p50_ms: float
    overhead_p99_ms: float
    overhead_mean_ms: float
    service_p50_ms_by_cycle: list[float]
    bare_p50_ms_by_cycle: list[float]
    # Mean CPU ms per timed request: {"bench": this process, "service": the service process}.
    service_cpu_ms_per_request: dict[str, float | None]
    bare_cpu_ms_per_request: dict[str, float | None]
    load_1m: list[float]


@dataclass(slots=True)
class BackendReport:
    backend: str
    index_name: str
    documents: int
    index_seconds: float
    index_docs_per_s: float
    cycles: int
    service_exit_codes: list[int | None]
    levels: dict[int, LevelReport]
    empty_answers: dict[str, int]
    top1_agreement: float
    top10_agreement: float


async def index_corpus(
    stub: LexicalServiceAsyncStub, articles: Sequence[Article], batch_size: int
) -> float:
    started = time.perf_counter()
    with tqdm(total=len(articles), desc="  index", unit="doc", leave=False) as bar:
        for start in range(0, len(articles), batch_size):
            batch = articles[start : start + batch_size]
            last = start + batch_size >= len(articles)
            reply = await stub.Index(
                lexical_pb2.IndexRequest(documents=[to_proto(a) for a in batch], refresh=last),
                timeout=300,
            )
            if reply.documents != len(batch):
                raise BenchError(f"Index wrote {reply.documents} of {len(batch)} documents")
            bar.update(len(batch))
    return time.perf_counter() - started


async def measure_service(
    target: Target,
    articles: Sequence[Article],
    queries: Sequence[str],
    args: argparse.Namespace,
    cycle: int,
) -> tuple[PathResult, float | None, int | None]:
    """One service process: index first (cycle 1 only), then time Search."""
    index_seconds: float | None = None
    async with service_process(target, args.host, args.ready_timeout) as service:
        print(f"  service pid {service.process.pid} SERVING on {service.address}", flush=True)
        channel = create_channel(service.address, idempotent=[(LEXICAL, "Search")])
        try:
            stub = lexical_pb2_grpc.LexicalServiceStub(channel)
            if cycle == 1:
                index_seconds = await index_corpus(stub, articles, args.batch_size)
                print(
                    f"  indexed {len(articles):,} documents in {index_seconds:.1f}s "
                    f"({len(articles) / index_seconds:,.0f} doc/s)",
                    flush=True,
                )
            stats = await stub.Stats(lexical_pb2.StatsRequest(), timeout=30)
            if stats.documents != len(articles):
                raise BenchError(f"Stats counts {stats.documents} documents, not {len(articles)}")
            requests = [
                lexical_pb2.SearchRequest(
                    query=q, top_k=TOP_K, level=lexical_pb2.SEARCH_LEVEL_DOCUMENT
                )
                for q in queries
            ]

            async def via_service(i: int) -> list[str]:
                reply = await stub.Search(requests[i], timeout=30)
                return [h.doc_id for h in reply.hits]

            if args.ghz:
                result = await measure_ghz(
                    f"service#{cycle}",
                    args.ghz,
                    service.address,
                    via_service,
                    queries,
                    args.concurrency,
                    rounds=args.rounds,
                    warmup=args.warmup,
                    service_pid=service.process.pid,
                )
            else:
                result = await measure(
                    f"service#{cycle}",
                    via_service,
                    queries,
                    args.concurrency,
                    rounds=args.rounds,
                    warmup=args.warmup,
                    service_pid=service.process.pid,
                )
        finally:
            await channel.close()
    return result, index_seconds, service.exit_code


async def measure_bare(
    target: Target, queries: Sequence[str], args: argparse.Namespace, cycle: int
) -> PathResult:
    """The backend class itself, in this process, on the index the service built."""
    backend = create_backend(target.settings())
    await backend.warm_up()
    try:
        search_queries = [SearchQuery(text=q, top_k=TOP_K, level=Level.DOCUMENT) for q in queries]

        async def bare(i: int) -> list[str]:
            hits = await backend.search(TENANT, search_queries[i])
            return [h.doc_id for h in hits]

        return await measure(
            f"bare#{cycle}", bare, queries, args.concurrency, rounds=args.rounds, warmup=args.warmup
        )
    finally:
        await backend.close()


async def bench_backend(
    target: Target,
    articles: Sequence[Article],
    queries: Sequence[str],
    args: argparse.Namespace,
) -> BackendReport:
    """Index once, then alternate service and bare measurements ``--cycles`` times.

    The first service process indexes and then measures; later cycles start a
    fresh process on the same index. Each bare measurement runs after its
    service process has exited, because tantivy allows one writer per index and
    ``TantivyBackend.warm_up`` opens one. Alternating (service, bare, service,
    bare) spreads slow drifts of the machine (other load, engine merges after
    indexing) over both paths instead of charging them to one.
    """
    print(f"\n== {target.backend}: index {target.index_name!r} in {target.data_dir}", flush=True)
    service_runs: list[PathResult] = []
    bare_runs: list[PathResult] = []
    exit_codes: list[int | None] = []
    index_seconds = math.nan
    for cycle in range(1, args.cycles + 1):
        run, seconds, code = await measure_service(target, articles, queries, args, cycle)
        service_runs.append(run)
        exit_codes.append(code)
        if seconds is not None:
            index_seconds = seconds
        bare_runs.append(await measure_bare(target, queries, args, cycle))

    levels: dict[int, LevelReport] = {}
    for c in args.concurrency:
        svc, bare = pooled(service_runs, c), pooled(bare_runs, c)
        levels[c] = LevelReport(
            service=svc,
            bare=bare,
            overhead_p50_ms=round(svc.p50_ms - bare.p50_ms, 4),
            overhead_p99_ms=round(svc.p99_ms - bare.p99_ms, 4),
            overhead_mean_ms=round(svc.mean_ms - bare.mean_ms, 4),
            service_p50_ms_by_cycle=p50_by_cycle(service_runs, c),
            bare_p50_ms_by_cycle=p50_by_cycle(bare_runs, c),
            service_cpu_ms_per_request=cpu_per_request(service_runs, c),
            bare_cpu_ms_per_request=cpu_per_request(bare_runs, c),
            load_1m=[
                round(run.levels[c].load_1m, 2)
                for pair in zip(service_runs, bare_runs, strict=True)
                for run in pair
            ],
        )
    # Same index, same queries: both paths must rank identically.
    first_service, first_bare = service_runs[0].answers, bare_runs[0].answers
    top1 = sum(ids[:1] == first_bare.get(i, [])[:1] for i, ids in first_service.items())
    top10 = sum(ids == first_bare.get(i) for i, ids in first_service.items())
    n = max(len(first_service), 1)
    return BackendReport(
        backend=target.backend,
        index_name=target.index_name,
        documents=len(articles),
        index_seconds=round(index_seconds, 3),
        index_docs_per_s=round(len(articles) / index_seconds, 1),
        cycles=args.cycles,
        service_exit_codes=exit_codes,
        levels=levels,
        empty_answers={
            "service": sum(1 for ids in first_service.values() if not ids),
            "bare": sum(1 for ids in first_bare.values() if not ids),
        },
        top1_agreement=round(top1 / n, 4),
        top10_agreement=round(top10 / n, 4),
    )


def delete_opensearch_indexes(url: str, index_name: str) -> None:
    names = f"{index_name}-documents,{index_name}-passages"
    request = urllib.request.Request(
        f"{url.rstrip('/')}/{names}?ignore_unavailable=true", method="DELETE"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            reply.read()
        print(f"  deleted OpenSearch indices {names}")
    except (urllib.error.URLError, OSError) as exc:
        print(f"  could not delete OpenSearch indices {names}: {exc}", file=sys.stderr)


@contextlib.contextmanager
def target_for(backend: BackendName, args: argparse.Namespace) -> Iterator[Target]:
    """A fresh index name and data directory, removed afterwards (unless --keep)."""
    data_dir = Path(tempfile.mkdtemp(prefix=f"attest-bench-{backend}-"))
    target = Target(
        backend=backend,
        index_name=f"bench-lexical-{uuid.uuid4().hex[:10]}",
        data_dir=data_dir,
        opensearch_url=args.opensearch_url,
    )
    try:
        yield target
    finally:
        if backend == "opensearch" and not args.keep:
            delete_opensearch_indexes(args.opensearch_url, target.index_name)
        if args.keep:
            print(f"  kept {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


# -- report ---------------------------------------------------------------------------


def table(reports: Sequence[BackendReport]) -> str:
    head = (
        f"{'backend':<11}{'conc':>5} │ {'service p50':>11}{'p99':>10}{'q/s':>8} │ "
        f"{'bare p50':>9}{'p99':>10}{'q/s':>8} │ {'overhead p50':>12}{'p99':>11}"
    )
    rule = "─" * len(head)
    rows = [rule, head, rule]
    for r in reports:
        for c, level in r.levels.items():
            svc, bare = level.service, level.bare
            rows.append(
                f"{r.backend:<11}{c:>5} │ {svc.p50_ms:>11.3f}{svc.p99_ms:>10.3f}"
                f"{svc.throughput_qps:>8.0f} │ {bare.p50_ms:>9.3f}{bare.p99_ms:>10.3f}"
                f"{bare.throughput_qps:>8.0f} │ {level.overhead_p50_ms:>+12.3f}"
                f"{level.overhead_p99_ms:>+11.3f}"
            )
    rows.append(rule)
    rows.append(
        "latencies in ms over every cycle's timed requests; q/s = completed searches "
        "per second at that concurrency; overhead = service − bare"
    )
    rows.append("")
    rows.append(
        f"{'CPU ms/request':<16}{'conc':>5} │ {'service path: client':>21}{'service':>9}"
        f"{'sum':>8} │ {'bare':>6} │ {'1-min load during runs':>23}"
    )
    for r in reports:
        for c, level in r.levels.items():
            client = level.service_cpu_ms_per_request["bench"] or math.nan
            server = level.service_cpu_ms_per_request["service"]
            bare_cpu = level.bare_cpu_ms_per_request["bench"] or math.nan
            total = client + server if server is not None else math.nan
            loads = " ".join(f"{x:.1f}" for x in level.load_1m)
            rows.append(
                f"{r.backend:<16}{c:>5} │ {client:>21.2f}{server or math.nan:>9.2f}{total:>8.2f}"
                f" │ {bare_cpu:>6.2f} │ {loads:>23}"
            )
    return "\n".join(rows)


def environment_info() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "grpcio": grpc.__version__,
        "protobuf": version("protobuf"),
        "tantivy": version("tantivy"),
        "opensearch-py": version("opensearch-py"),
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--docs", type=int, default=20_000, help="articles to index")
    parser.add_argument(
        "--backend",
        action="append",
        choices=["tantivy", "opensearch"],
        default=argparse.SUPPRESS,
        help="backend to measure; repeat for several (default: tantivy)",
    )
    parser.add_argument(
        "--opensearch-url", default="http://127.0.0.1:9200", help="OpenSearch node (opensearch)"
    )
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="Reuters JSONL")
    parser.add_argument("--queries", type=int, default=400, help="size of the query set")
    parser.add_argument("--seed", type=int, default=21578, help="seed of the query draw")
    parser.add_argument(
        "--concurrency",
        action="append",
        type=int,
        default=argparse.SUPPRESS,
        help="requests in flight; repeat for several levels (default: 1 and 32)",
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="passes over the query set per level (min 2)"
    )
    parser.add_argument("--warmup", type=int, default=100, help="untimed requests per level")
    parser.add_argument(
        "--cycles",
        type=int,
        default=2,
        help="alternations of service and bare measurements (each a fresh service process)",
    )
    parser.add_argument("--batch-size", type=int, default=500, help="documents per Index call")
    parser.add_argument("--host", default="127.0.0.1", help="address the service listens on")
    parser.add_argument("--ready-timeout", type=float, default=120.0, help="seconds to SERVING")
    parser.add_argument(
        "--max-overhead-ms",
        type=float,
        default=2.0,
        help="exit 1 when a backend's p50 overhead at concurrency 1 exceeds this",
    )
    parser.add_argument(
        "--client",
        choices=["python", "ghz"],
        default="python",
        help="who makes the timed service calls: this process (grpc.aio, whose own cost of "
        "~1 ms per call lands in the service's latency) or ghz, a Go client (built with go "
        "once if not found; see loadtest/grpc_load.py)",
    )
    parser.add_argument("--ghz", default=None, help="path of the ghz binary (--client ghz)")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="JSON report")
    parser.add_argument(
        "--keep", action="store_true", help="keep the data directories and OpenSearch indices"
    )
    args = parser.parse_args(argv)
    args.backend = list(dict.fromkeys(getattr(args, "backend", None) or ["tantivy"]))
    args.concurrency = sorted(set(getattr(args, "concurrency", None) or [1, 32]))
    if min(args.concurrency) < 1:
        parser.error("--concurrency must be at least 1")
    if args.docs < 1 or args.queries < 1:
        parser.error("--docs and --queries must be at least 1")
    if not 1 <= args.batch_size <= 1000:
        parser.error("--batch-size must be between 1 and 1000 (the service's limit)")
    args.rounds = max(args.rounds, 2)
    if args.client == "ghz":
        from grpc_load import LoadTestError, find_ghz

        try:
            args.ghz = find_ghz(args.ghz)
        except LoadTestError as exc:
            parser.error(str(exc))
    else:
        args.ghz = None
    if args.cycles < 1:
        parser.error("--cycles must be at least 1")
    return args


async def run(args: argparse.Namespace) -> int:
    if not args.corpus.is_file():
        raise BenchError(f"corpus {args.corpus} does not exist")
    articles = load_articles(args.corpus, args.docs)
    if len(articles) < args.docs:
        print(
            f"note: {args.corpus.name} has only {len(articles):,} articles with a body; "
            f"indexing all of them instead of {args.docs:,}"
        )
    queries = draw_queries(articles, args.queries, args.seed)
    print(
        f"{len(articles):,} articles, {len(queries)} queries (seed {args.seed}), "
        f"backends {', '.join(args.backend)}, concurrency {args.concurrency}, "
        f"{args.rounds} rounds per level, {args.cycles} cycles"
    )
    reports: list[BackendReport] = []
    for name in args.backend:
        with target_for(cast(BackendName, name), args) as target:
            reports.append(await bench_backend(target, articles, queries, args))

    print()
    print(table(reports))
    failures: list[str] = []
    if 1 not in args.concurrency:
        print("concurrency 1 was not measured: the overhead limit is not checked")
    else:
        for r in reports:
            overhead = r.levels[1].overhead_p50_ms
            if overhead > args.max_overhead_ms:
                failures.append(
                    f"{r.backend}: p50 overhead at concurrency 1 is {overhead:.3f} ms "
                    f"> {args.max_overhead_ms:.3f} ms"
                )
    cpus = os.cpu_count() or 1
    busiest = max((x for r in reports for lv in r.levels.values() for x in lv.load_1m), default=0)
    if busiest > cpus:
        print(
            f"warning: the 1-minute load reached {busiest:.1f} on {cpus} CPUs while measuring; "
            "latencies include time spent waiting for a CPU (compare CPU ms/request)"
        )
    for r in reports:
        if r.top1_agreement < 1.0:
            print(
                f"warning: {r.backend} service and bare top hits differ on "
                f"{1 - r.top1_agreement:.1%} of queries"
            )

    report = {
        "benchmark": "lexical-grpc-overhead",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
        "environment": environment_info(),
        "config": {
            "corpus": str(args.corpus),
            "docs_requested": args.docs,
            "docs_indexed": len(articles),
            "queries": len(queries),
            "query_source": "lower-cased titles of articles drawn with random.Random(seed)",
            "seed": args.seed,
            "top_k": TOP_K,
            "level": "document",
            "concurrency": args.concurrency,
            "rounds": args.rounds,
            "cycles": args.cycles,
            "warmup_requests": args.warmup,
            "batch_size": args.batch_size,
            "max_overhead_ms": args.max_overhead_ms,
            "client": args.client,
        },
        "backends": {r.backend: asdict(r) for r in reports},
        "passed": not failures,
        "failures": failures,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.output}")
    for failure in failures:
        print(f"FAIL {failure}")
    if not failures and 1 in args.concurrency:
        print(f"OK: every p50 overhead at concurrency 1 is within {args.max_overhead_ms} ms")
    return 1 if failures else 0


def _reraise_cancellation() -> None:
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def main_async(args: argparse.Namespace) -> int:
    # SIGTERM cancels the run like Ctrl-C does, so the finally blocks stop the
    # service processes (SIGTERM) and drop the indices.
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await run(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(main_async(args))
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.CANCELLED:
            raise
        print("interrupted", file=sys.stderr)
        return 130
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
