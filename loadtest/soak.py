"""Soak test: mixed traffic against a running Attest for a set time, then a verdict.

Workers (``--concurrency``) send, in the proportions of ``--mix``:

- ``ask``: ``AnswerService.Ask`` with a question of the bundled demo set;
- ``stream``: ``AnswerService.AskStream``, timed to its ``final`` event (a
  stream that ends without one counts as ``INCOMPLETE``);
- ``ingest``: ``IngestService.Ingest`` of ``--batch`` documents made from the
  demo corpus, timed until ``WatchJob`` reports the job final. Ids start with
  ``soak-``: a batch adds new ids and re-ingests live ones with new text
  (a new revision line), up to ``--max-live`` documents;
- ``delete``: ``IngestService.Delete`` of one live ``soak-`` id (or of an id
  that never existed when none is live).

Kinds are dealt in a smooth weighted round robin, so every window of
``sum(mix)`` consecutive calls holds each kind in its share. Calls are made
without retries, so every failure is seen with its gRPC status.

Every ``--sample-seconds`` the server's resident memory (VmRSS) and open file
descriptors are read from ``/proc/<pid>``: ``--pid``, or the process holding
the listening socket of ``--address`` when it is on this machine (found through
``/proc/net/tcp`` and ``/proc/*/fd``). For a remote server without ``--pid``
they are reported as unavailable. ``--watch NAME=PID`` (repeatable) samples
other processes too, each with its descendants summed: on the Celery stack the
workers' pool processes do the enrich, embed and index work.

Each minute a line is printed: calls, errors by status code (UNKNOWN and
INTERNAL apart and marked ``!!``), p50/p99 of successful calls per kind, RSS
and open files. At the end ``--out`` gets ``soak.json`` (the minutes, the
samples, totals, the first error messages, the verdict) and ``soak.png``.

Verdict, with W = 5 minutes (a fifth of the run when it is shorter than 10
minutes) and a warm-up of ``min(--warmup, W/2)``:

- no UNKNOWN or INTERNAL status;
- RSS growth: the largest RSS of the last W at most 10 % above the RSS at
  time W (unavailable without a pid: not judged);
- p99 drift: per kind, the p99 of the last W at most 1.5x the p99 of the
  first W after the warm-up, each call placed by when it ended (a kind with
  fewer than ``--min-samples`` successful calls in either window is not
  judged);
- RSS growth of each ``--watch`` process, judged the same way;
- every kind of the mix succeeded at least once.

The exit status is 1 when any of them is missed.

    uv run python loadtest/soak.py --address 127.0.0.1:50051 --minutes 30 --out /tmp/soak
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import socket
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
from pydantic import SecretStr

from attest.answer.v1 import answer_pb2, answer_pb2_grpc
from attest.core.channels import create_channel
from attest.core.settings import ClientSecurity, ClientSettings
from attest.demo.run import read_jsonl, sample_documents
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc

KINDS = ("ask", "stream", "ingest", "delete")
DEFAULT_MIX = "ask=6,stream=2,ingest=1,delete=1"
HIGHLIGHTED = ("UNKNOWN", "INTERNAL")
FINAL_JOB_STATES = (ingest_pb2.JOB_STATE_DONE, ingest_pb2.JOB_STATE_FAILED)
RSS_GROWTH_LIMIT = 0.10
P99_DRIFT_LIMIT = 1.5
KEPT_MESSAGES = 20


class SoakError(Exception):
    """A bad argument or setting: ends the run with a message instead of a traceback."""


# -- what to send ------------------------------------------------------------------


def parse_mix(text: str) -> dict[str, int]:
    """``ask=6,stream=2,ingest=1,delete=1`` as weights; a kind left out gets 0."""
    mix = dict.fromkeys(KINDS, 0)
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in mix:
            raise SoakError(
                f"--mix: {part!r} is not KIND=WEIGHT with KIND one of {', '.join(KINDS)} "
                f"(for example {DEFAULT_MIX})"
            )
        try:
            mix[name] = int(value)
        except ValueError:
            raise SoakError(
                f"--mix: the weight of {name} must be a whole number, not {value!r}"
            ) from None
        if mix[name] < 0:
            raise SoakError(f"--mix: the weight of {name} must be 0 or more, not {mix[name]}")
    if not any(mix.values()):
        raise SoakError(
            f"--mix: give at least one kind a weight above 0 (for example {DEFAULT_MIX})"
        )
    return mix


class Dealer:
    """Smooth weighted round robin: each kind in its share, evenly interleaved."""

    def __init__(self, mix: dict[str, int]) -> None:
        self._weights = {k: w for k, w in mix.items() if w > 0}
        self._current = dict.fromkeys(self._weights, 0)
        self._total = sum(self._weights.values())

    def next(self) -> str:
        for kind, weight in self._weights.items():
            self._current[kind] += weight
        kind = max(self._current, key=lambda k: self._current[k])
        self._current[kind] -= self._total
        return kind


class Documents:
    """The ``soak-`` documents: new ids and new revisions of live ones, from the demo corpus."""

    def __init__(self, run_id: str, max_live: int, rng: random.Random) -> None:
        self._base = sample_documents()
        self._run_id = run_id
        self._max_live = max_live
        self._rng = rng
        self._next_id = 0
        self._revision: Counter[str] = Counter()
        self.live: set[str] = set()  # ids whose last ingest finished and no delete has taken

    def batch(self, size: int) -> list[ingest_pb2.IngestItem]:
        items: list[ingest_pb2.IngestItem] = []
        chosen: set[str] = set()
        added = 0
        for _ in range(size):
            candidates = sorted(self.live - chosen)
            full = len(self.live) + added >= self._max_live
            if candidates and (full or self._rng.random() < 0.5):
                doc_id = self._rng.choice(candidates)
            else:
                doc_id = f"soak-{self._run_id}-{self._next_id}"
                self._next_id += 1
                added += 1
            chosen.add(doc_id)
            items.append(ingest_pb2.IngestItem(document=self._document(doc_id)))
        return items

    def _document(self, doc_id: str) -> Any:
        self._revision[doc_id] += 1
        revision = self._revision[doc_id]
        base = self._base[int(doc_id.rsplit("-", 1)[1]) % len(self._base)]
        doc = type(base)()
        doc.CopyFrom(base)
        doc.id = doc_id
        doc.title = f"{base.title} (revision {revision})"
        doc.body = (
            f"Revision {revision} of this report, filed {datetime.now(UTC):%H:%M:%S}. {base.body}"
        )
        return doc

    def take(self) -> str:
        """An id to delete: a live one, taken out of the live set, or one never ingested."""
        if self.live:
            doc_id = self._rng.choice(sorted(self.live))
            self.live.discard(doc_id)
            return doc_id
        return f"soak-{self._run_id}-absent"


# -- what happened -----------------------------------------------------------------


@dataclass
class Call:
    kind: str
    end: float  # seconds since the start of the run
    seconds: float
    code: str  # "OK", a gRPC status name, INCOMPLETE, JOB_FAILED or CLIENT_<exception>
    failed_items: int = 0


@dataclass
class Sample:
    at: float
    rss_bytes: int | None
    open_files: int | None
    # RSS of each --watch process tree (the process and its descendants), by name
    watched: dict[str, int | None] = field(default_factory=dict)


@dataclass
class Record:
    calls: list[Call] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)

    def note(self, kind: str, code: str, message: str) -> None:
        if len(self.messages) < KEPT_MESSAGES:
            self.messages.append({"kind": kind, "code": code, "message": message[:500]})


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarize(calls: list[Call], kinds: Iterable[str]) -> dict[str, Any]:
    """Calls, errors by code and latency of successful calls, per kind and in all."""
    errors = Counter(c.code for c in calls if c.code != "OK")
    per_kind: dict[str, Any] = {}
    for kind in kinds:
        mine = [c for c in calls if c.kind == kind]
        ok = [c.seconds * 1000 for c in mine if c.code == "OK"]
        per_kind[kind] = {
            "requests": len(mine),
            "ok": len(ok),
            "errors": dict(Counter(c.code for c in mine if c.code != "OK")),
            "p50_ms": _round(percentile(ok, 50)),
            "p99_ms": _round(percentile(ok, 99)),
        }
    return {
        "requests": len(calls),
        "errors": dict(errors),
        "unknown_internal": sum(errors[c] for c in HIGHLIGHTED),
        "failed_items": sum(c.failed_items for c in calls),
        "kinds": per_kind,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


# -- the server process ------------------------------------------------------------


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local address is HEXIP:HEXPORT; state 0A is LISTEN
            if (
                len(fields) > 9
                and fields[3] == "0A"
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                inodes.add(fields[9])
    return inodes


def find_server_pid(address: str) -> int | None:
    """The pid of the local process listening on ``address``'s port, or None."""
    host, _, port_text = address.rpartition(":")
    host = host.strip("[]")
    if "///" in host or not port_text.isdigit():
        return None
    try:
        local = {"localhost", "0.0.0.0", "::", socket.gethostname()} | {
            info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)
        }
    except OSError:
        local = {"localhost", "0.0.0.0", "::"}
    if not (host in local or host.startswith("127.") or host == "::1"):
        return None
    wanted = {f"socket:[{inode}]" for inode in _listening_inodes(int(port_text))}
    if not wanted:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    return int(proc.name)
        except OSError:  # gone, or another user's process
            continue
    return None


def read_process(pid: int) -> tuple[int | None, int | None]:
    """(VmRSS in bytes, open file descriptors) of ``pid``; None where unreadable."""
    rss: int | None = None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        files: int | None = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        files = None
    return rss, files


def descendants(pid: int) -> list[int]:
    """``pid``'s children, grandchildren and so on (from ``/proc/<pid>/task/*/children``)."""
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                text = Path(f"/proc/{parent}/task/{task}/children").read_text()
            except OSError:
                continue
            for child in map(int, text.split()):
                if child not in found:
                    found.append(child)
                    todo.append(child)
    return found


def start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot (``/proc/<pid>/stat``, field 22):
    tells the process from a later one given the same pid; None when it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        # the fields after the command name, which is in parentheses and may hold spaces
        return int(stat[stat.rindex(")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def read_tree_rss(pid: int, started: int | None = None) -> int | None:
    """Summed VmRSS of ``pid`` and its descendants (a Celery worker: its main process
    and its pool processes, which load the models and do the work); None when ``pid``
    cannot be read, or (with ``started``, its :func:`start_time`) is another process."""
    if started is not None and start_time(pid) != started:
        return None
    rss = read_process(pid)[0]
    if rss is None:
        return None
    for child in descendants(pid):
        rss += read_process(child)[0] or 0
    return rss


def parse_watch(values: list[str]) -> dict[str, int]:
    """``NAME=PID`` pairs of ``--watch``."""
    out: dict[str, int] = {}
    for value in values:
        name, sep, pid = value.partition("=")
        if not sep or not name.strip() or not pid.strip().isdigit():
            raise SoakError(f"--watch {value!r}: give NAME=PID, for example worker=12345")
        if name.strip() in out:
            raise SoakError(f"--watch names {name.strip()!r} twice: give each process its own name")
        out[name.strip()] = int(pid)
    return out


# -- the run -----------------------------------------------------------------------


@dataclass
class Soak:
    args: argparse.Namespace
    mix: dict[str, int]
    pid: int | None
    record: Record = field(default_factory=Record)
    watch: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rng = random.Random(self.args.seed)
        self.rng = rng
        self.dealer = Dealer(self.mix)
        self.questions = [q["question"] for q in read_jsonl("questions.jsonl")]
        run_id = f"{int(time.time()):x}"
        self.documents = Documents(run_id, self.args.max_live, rng)
        self.start = 0.0
        # each watched process's start time: a pid taken by a later process is not it
        self.watch_started = {name: start_time(pid) for name, pid in self.watch.items()}

    def _channel(self, address: str) -> grpc.aio.Channel:
        settings = ClientSettings(timeout_seconds=self.args.timeout, max_attempts=1)
        identity = None
        if self.args.api_key:
            # the key replaces ATTEST_CLIENT_TOKEN; TLS still comes from ATTEST_CLIENT_TLS__*
            identity = (
                ClientSecurity()
                .identity()
                .model_copy(update={"token": SecretStr(self.args.api_key), "token_file": None})
            )
        return create_channel(address, settings, identity=identity)

    async def run(self) -> None:
        answer_channel = self._channel(self.args.address)
        ingest_address = self.args.ingest_address or self.args.address
        ingest_channel = (
            answer_channel if ingest_address == self.args.address else self._channel(ingest_address)
        )
        self.answer = answer_pb2_grpc.AnswerServiceStub(answer_channel)
        self.ingest = ingest_pb2_grpc.IngestServiceStub(ingest_channel)
        try:
            if self.args.ingest_sample:
                await self._ingest_sample()
            self.start = time.monotonic()
            deadline = self.start + self.args.minutes * 60
            sampler = asyncio.create_task(self._sample(deadline))
            await asyncio.gather(*(self._worker(deadline) for _ in range(self.args.concurrency)))
            sampler.cancel()
            self._take_sample()
            self._print_minute(self._minute_count() - 1)
        finally:
            await answer_channel.close()
            if ingest_channel is not answer_channel:
                await ingest_channel.close()

    async def _ingest_sample(self) -> None:
        items = [ingest_pb2.IngestItem(document=d) for d in sample_documents()]
        job = (await self.ingest.Ingest(ingest_pb2.IngestRequest(items=items))).job
        state = await self._watch(job.job_id, lambda _: None)
        print(f"sample corpus ingested: {ingest_pb2.JobState.Name(state)}", flush=True)

    async def _worker(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            kind = self.dealer.next()
            began = time.monotonic()
            code, failed_items = "OK", 0
            try:
                if kind == "ask":
                    await self._ask()
                elif kind == "stream":
                    code = await self._stream()
                elif kind == "ingest":
                    code, failed_items = await self._ingest()
                else:
                    await self._delete()
            except grpc.aio.AioRpcError as err:
                code = err.code().name
                self.record.note(kind, code, err.details() or "")
            except Exception as err:  # noqa: BLE001 - a client-side failure is a result here
                code = f"CLIENT_{type(err).__name__}"
                self.record.note(kind, code, str(err))
            end = time.monotonic()
            self.record.calls.append(Call(kind, end - self.start, end - began, code, failed_items))

    async def _ask(self) -> None:
        question = self.rng.choice(self.questions)
        await self.answer.Ask(answer_pb2.AskRequest(question=question))

    async def _stream(self) -> str:
        question = self.rng.choice(self.questions)
        last = None
        async for event in self.answer.AskStream(answer_pb2.AskStreamRequest(question=question)):
            last = event.WhichOneof("event")
        if last != "final":
            self.record.note("stream", "INCOMPLETE", f"the stream ended after {last!r}")
            return "INCOMPLETE"
        return "OK"

    async def _ingest(self) -> tuple[str, int]:
        items = self.documents.batch(self.args.batch)
        job = (await self.ingest.Ingest(ingest_pb2.IngestRequest(items=items))).job
        failed: list[str] = []

        def seen(update: Any) -> None:
            failed.extend(f.doc_id for f in update.new_failures)
            for f in update.new_failures:
                self.record.note("ingest", "ITEM_FAILED", f"{f.doc_id}: {f.message}")

        state = await self._watch(job.job_id, seen)
        if state != ingest_pb2.JOB_STATE_DONE:
            return "JOB_FAILED", len(failed)
        self.documents.live.update(i.document.id for i in items if i.document.id not in failed)
        return "OK", len(failed)

    async def _watch(self, job_id: str, seen: Any) -> int:
        state = ingest_pb2.JOB_STATE_UNSPECIFIED
        async for update in self.ingest.WatchJob(ingest_pb2.WatchJobRequest(job_id=job_id)):
            seen(update)
            state = update.state
            if update.error:
                self.record.note("ingest", "JOB_FAILED", update.error)
        return state

    async def _delete(self) -> None:
        doc_id = self.documents.take()
        await self.ingest.Delete(ingest_pb2.DeleteRequest(doc_ids=[doc_id]))

    # sampling and the per-minute lines

    def _take_sample(self) -> None:
        rss, files = read_process(self.pid) if self.pid is not None else (None, None)
        watched = {
            name: read_tree_rss(pid, self.watch_started.get(name))
            for name, pid in self.watch.items()
        }
        self.record.samples.append(Sample(time.monotonic() - self.start, rss, files, watched))

    def _minute_count(self) -> int:
        return max(1, math.ceil(self.args.minutes - 1e-9))

    async def _sample(self, deadline: float) -> None:
        printed = 0
        while True:
            self._take_sample()
            elapsed_minutes = int((time.monotonic() - self.start) // 60)
            # a minute is printed once it is over and before the last one
            while printed < min(elapsed_minutes, self._minute_count() - 1):
                self._print_minute(printed)
                printed += 1
            await asyncio.sleep(
                min(self.args.sample_seconds, max(0.05, deadline - time.monotonic()))
            )

    def minutes(self) -> list[dict[str, Any]]:
        count = self._minute_count()
        out = []
        for minute in range(count):
            lo, hi = minute * 60, (minute + 1) * 60
            last = minute == count - 1
            calls = [c for c in self.record.calls if lo <= c.end < hi or (last and c.end >= hi)]
            samples = [s for s in self.record.samples if lo <= s.at < hi or (last and s.at >= hi)]
            row = {"minute": minute + 1, **summarize(calls, self.kinds)}
            row["rss_bytes"] = _max(s.rss_bytes for s in samples)
            row["open_files"] = _max(s.open_files for s in samples)
            row["watched_rss_bytes"] = {
                name: _max(s.watched.get(name) for s in samples) for name in self.watch
            }
            out.append(row)
        return out

    @property
    def kinds(self) -> list[str]:
        return [k for k in KINDS if self.mix[k] > 0]

    def _print_minute(self, index: int) -> None:
        print(format_minute(self.minutes()[index], self.kinds), flush=True)


def _max(values: Iterable[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def format_minute(row: dict[str, Any], kinds: list[str]) -> str:
    bad = row["unknown_internal"]
    errors = ", ".join(f"{code} {n}" for code, n in sorted(row["errors"].items())) or "none"
    latency = "  ".join(
        f"{k} {row['kinds'][k]['requests']} p50 {_ms(row['kinds'][k]['p50_ms'])} "
        f"p99 {_ms(row['kinds'][k]['p99_ms'])}"
        for k in kinds
    )
    rss = row["rss_bytes"]
    memory = "rss n/a" if rss is None else f"rss {rss / 2**20:.0f} MiB"
    files = "files n/a" if row["open_files"] is None else f"files {row['open_files']}"
    watched = "".join(
        f"  {name} {'n/a' if v is None else f'{v / 2**20:.0f} MiB'}"
        for name, v in row.get("watched_rss_bytes", {}).items()
    )
    mark = "!! " if bad else "   "
    return (
        f"{mark}min {row['minute']:>3}  {row['requests']} calls  errors: {errors}  "
        f"{latency}  {memory}  {files}{watched}"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}ms"


# -- the verdict -------------------------------------------------------------------


def verdict(
    calls: list[Call],
    samples: list[Sample],
    kinds: list[str],
    duration: float,
    warmup: float,
    min_samples: int,
) -> dict[str, Any]:
    """The targets, each with its figures and whether it was met (module doc)."""
    window = 300.0 if duration >= 600 else duration / 5
    warm = min(warmup, window / 2)
    checks: dict[str, Any] = {}

    codes = Counter(c.code for c in calls)
    bad = {code: codes[code] for code in HIGHLIGHTED}
    checks["no_unknown_internal"] = {"met": not any(bad.values()), "counts": bad}

    checks["rss_growth"] = rss_growth(
        [(s.at, s.rss_bytes) for s in samples],
        duration,
        window,
        "RSS unavailable (remote server: pass --pid)",
    )
    names = sorted({name for s in samples for name in s.watched})
    if names:
        each = {
            name: rss_growth(
                [(s.at, s.watched.get(name)) for s in samples],
                duration,
                window,
                "RSS unavailable (the process could not be read)",
            )
            for name in names
        }
        judged_rss = [e["met"] for e in each.values() if e["met"] is not None]
        checks["watched_rss_growth"] = {
            "met": all(judged_rss) if judged_rss else None,
            "processes": each,
        }

    drift: dict[str, Any] = {}
    for kind in kinds:
        ok = [c for c in calls if c.kind == kind and c.code == "OK"]
        first = [c.seconds * 1000 for c in ok if warm < c.end <= window]
        last = [c.seconds * 1000 for c in ok if c.end >= duration - window]
        entry: dict[str, Any] = {"first_n": len(first), "last_n": len(last)}
        if len(first) < min_samples or len(last) < min_samples:
            entry.update(met=None, reason=f"fewer than {min_samples} successful calls in a window")
        else:
            p_first, p_last = percentile(first, 99), percentile(last, 99)
            assert p_first is not None
            assert p_last is not None
            ratio = p_last / p_first
            entry.update(
                met=ratio <= P99_DRIFT_LIMIT,
                first_p99_ms=round(p_first, 1),
                last_p99_ms=round(p_last, 1),
                ratio=round(ratio, 3),
            )
        drift[kind] = entry
    judged = [e["met"] for e in drift.values() if e["met"] is not None]
    checks["p99_drift"] = {
        "met": all(judged) if judged else None,
        "limit": P99_DRIFT_LIMIT,
        "kinds": drift,
    }

    succeeded = {k: sum(1 for c in calls if c.kind == k and c.code == "OK") for k in kinds}
    checks["every_kind_succeeded"] = {"met": all(succeeded.values()), "ok": succeeded}

    return {
        "window_seconds": round(window, 1),
        "warmup_seconds": round(warm, 1),
        "checks": checks,
        "passed": all(c["met"] is not False for c in checks.values()),
    }


def rss_growth(
    points: list[tuple[float, int | None]], duration: float, window: float, unavailable: str
) -> dict[str, Any]:
    """The largest RSS of the last ``window`` against the RSS at its end of the first.
    A process read at first and unreadable at the end exited during the run: missed."""
    with_rss = [(at, rss) for at, rss in points if rss is not None]
    if not with_rss:
        return {"met": None, "reason": unavailable}
    last_read = with_rss[-1][0]
    lost = [at for at, rss in points if rss is None and at > last_read]
    if lost:
        return {
            "met": False,
            "reason": f"the process could not be read from {lost[0]:.0f} s on: it exited",
            "last_read_at": round(last_read, 2),
        }
    before = [rss for at, rss in with_rss if at <= window]
    reference = before[-1] if before else with_rss[0][1]
    tail = [rss for at, rss in with_rss if at >= duration - window]
    peak = max(tail) if tail else with_rss[-1][1]
    growth = peak / reference - 1
    return {
        "met": growth <= RSS_GROWTH_LIMIT,
        "reference_bytes": reference,
        "last_window_max_bytes": peak,
        "growth": round(growth, 4),
        "limit": RSS_GROWTH_LIMIT,
    }


def format_verdict(result: dict[str, Any]) -> str:
    window, warm = result["window_seconds"], result["warmup_seconds"]
    lines = [f"verdict (window {window:.0f} s, warm-up {warm:.0f} s):"]
    for name, check in result["checks"].items():
        mark = {True: "met   ", False: "MISSED", None: "n/a   "}[check["met"]]
        detail = {k: v for k, v in check.items() if k != "met"}
        lines.append(f"  {mark} {name}: {json.dumps(detail)}")
    lines.append("PASSED" if result["passed"] else "FAILED")
    return "\n".join(lines)


# -- the plot ----------------------------------------------------------------------


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    minutes = report["minutes"]
    kinds = report["kinds"]
    fig, axes = plt.subplots(4, 1, figsize=(10, 13), sharex=True)
    t = [s["at"] / 60 for s in samples]

    ax = axes[0]
    series = {"server": [s["rss_bytes"] for s in samples]}
    for name in report.get("watch", {}):
        series[name] = [s.get("watched", {}).get(name) for s in samples]
    drawn = False
    for name, values in series.items():
        if any(v is not None for v in values):
            ax.plot(t, [math.nan if v is None else v / 2**20 for v in values], label=name)
            drawn = True
    if not drawn:
        ax.text(0.5, 0.5, "RSS unavailable", transform=ax.transAxes, ha="center")
    elif len(series) > 1:
        ax.legend(fontsize="small")
    ax.set_ylabel("RSS (MiB)")

    ax = axes[1]
    files = [s["open_files"] for s in samples]
    if any(v is not None for v in files):
        ax.plot(t, [math.nan if v is None else v for v in files], color="tab:green")
    else:
        ax.text(0.5, 0.5, "open files unavailable", transform=ax.transAxes, ha="center")
    ax.set_ylabel("open files")

    ax = axes[2]
    mid = [m["minute"] - 0.5 for m in minutes]
    for i, kind in enumerate(kinds):
        color = f"C{i}"
        for q, style in (("p50_ms", "-"), ("p99_ms", "--")):
            values = [m["kinds"][kind][q] for m in minutes]
            ax.plot(
                mid,
                [math.nan if v is None else v for v in values],
                style,
                marker="o",
                color=color,
                label=f"{kind} {q[:3]}",
            )
    ax.set_ylabel("latency (ms)")
    ax.set_yscale("log")
    ax.legend(fontsize="small", ncol=len(kinds))

    ax = axes[3]
    codes = sorted({code for m in minutes for code in m["errors"]})
    for code in codes:
        highlighted = code in HIGHLIGHTED
        ax.plot(
            mid,
            [m["errors"].get(code, 0) for m in minutes],
            marker="o",
            color="red" if highlighted else None,
            linewidth=2.5 if highlighted else 1,
            label=code,
        )
    if not codes:
        ax.text(0.5, 0.5, "no errors", transform=ax.transAxes, ha="center")
    else:
        ax.legend(fontsize="small")
    ax.set_ylabel("errors per minute")
    ax.set_xlabel("minutes")

    status = "PASSED" if report["verdict"]["passed"] else "FAILED"
    fig.suptitle(f"Attest soak, {report['address']}: {status}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- the command -------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--address", default="127.0.0.1:50051", help="answer service, host:port")
    parser.add_argument(
        "--ingest-address",
        help="ingest service when apart from the answer service (compose: :50054)",
    )
    parser.add_argument("--minutes", type=float, default=30.0, help="length of the run")
    parser.add_argument("--mix", default=DEFAULT_MIX, help="weights of ask, stream, ingest, delete")
    parser.add_argument("--concurrency", type=int, default=4, help="calls in flight")
    parser.add_argument(
        "--api-key",
        default=os.environ.get("ATTEST_SOAK_API_KEY"),
        help="API key sent as a bearer token",
    )
    parser.add_argument(
        "--pid", type=int, help="server process to watch (default: the port's listener)"
    )
    parser.add_argument(
        "--watch",
        action="append",
        default=[],
        metavar="NAME=PID",
        help="also sample the RSS of this process and its descendants (a Celery worker and "
        "its pool) and judge its growth as the server's; repeatable",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("loadtest/reports/soak"), help="report folder"
    )
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="deadline of one call, seconds"
    )
    parser.add_argument("--batch", type=int, default=2, help="documents in one Ingest call")
    parser.add_argument("--max-live", type=int, default=200, help="most soak- documents kept")
    parser.add_argument(
        "--sample-seconds", type=float, default=5.0, help="RSS/files sampling period"
    )
    parser.add_argument(
        "--warmup", type=float, default=60.0, help="seconds left out of the first p99 window"
    )
    parser.add_argument("--min-samples", type=int, default=5, help="calls a p99 window needs")
    parser.add_argument("--ingest-sample", action="store_true", help="ingest the demo corpus first")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error("--minutes must be above 0 (for example --minutes 30)")
    if args.concurrency < 1:
        parser.error("--concurrency must be 1 or more")
    if not 1 <= args.batch <= 1000:
        parser.error("--batch must be 1-1000 documents")
    if args.max_live < args.batch:
        parser.error("--max-live must be at least --batch")
    if args.sample_seconds <= 0 or args.timeout <= 0:
        parser.error("--sample-seconds and --timeout must be above 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        mix = parse_mix(args.mix)
        watch = parse_watch(args.watch)
    except SoakError as err:
        print(f"soak: {err}", file=sys.stderr)
        return 2
    pid = args.pid if args.pid is not None else find_server_pid(args.address)
    if pid is not None and read_process(pid)[0] is None:
        print(
            f"soak: /proc/{pid} cannot be read: give the server's pid with --pid", file=sys.stderr
        )
        return 2
    for name, watched in watch.items():
        if read_process(watched)[0] is None:
            print(
                f"soak: --watch {name}={watched}: /proc/{watched} cannot be read", file=sys.stderr
            )
            return 2
    print(
        f"soak: {args.minutes:g} min against {args.address}, mix {mix}, concurrency "
        f"{args.concurrency}, server pid {pid if pid is not None else 'unknown (RSS n/a)'}",
        flush=True,
    )
    if watch:
        print("soak: watching " + ", ".join(f"{n} (pid {p})" for n, p in watch.items()), flush=True)
    soak = Soak(args, mix, pid, watch=watch)
    started = datetime.now(UTC)
    try:
        asyncio.run(soak.run())
    except KeyboardInterrupt:
        print("soak: interrupted, no report written", file=sys.stderr)
        return 130
    duration = args.minutes * 60
    result = verdict(
        soak.record.calls, soak.record.samples, soak.kinds, duration, args.warmup, args.min_samples
    )
    report = {
        "address": args.address,
        "ingest_address": args.ingest_address or args.address,
        "started_at": started.isoformat(timespec="seconds"),
        "minutes_requested": args.minutes,
        "mix": mix,
        "kinds": soak.kinds,
        "concurrency": args.concurrency,
        "pid": pid,
        "watch": watch,
        "totals": summarize(soak.record.calls, soak.kinds),
        "minutes": soak.minutes(),
        "samples": [vars(s) | {"at": round(s.at, 2)} for s in soak.record.samples],
        "messages": soak.record.messages,
        "verdict": result,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    plot(report, args.out / "soak.png")
    print(format_verdict(result))
    print(f"report: {args.out / 'soak.json'}, plot: {args.out / 'soak.png'}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
