"""Crash consistency of embedded mode: kill -9 at a random moment of an ingest of
Reuters articles, restart with `attest doctor --repair`, ingest again.

Iterations run in chains, each chain in a data directory of its own (chains
run side by side, ``ATTEST_TEST_CRASH_CHAINS``, 2 by default). Iteration *n*
of a chain ingests the file of its previous iteration plus 30 new articles
(batches of 10) and is killed after a random number of its indexed batches,
at a random moment of the next one; `attest doctor --repair` then restarts
the embedded stores (which resumes the interrupted job) and reconciles them.
So every kill lands in a job whose file repeats every document the chain
holds, on stores that already hold them; the next iteration's ingest is the
re-ingest of this one, and each chain ends with a last `attest ingest` of its
whole file that is not killed.

Every iteration asserts: no acknowledged document is lost (every document of
a sealed job is in the registry after the restart), no orphans and no missing
documents after repair, equal document and passage counts in the registry,
BM25 and the vectors, equal KG link counts, and the killed job, once resumed,
reports exactly the documents the registry held before it as unchanged, the
new ones as created, none updated and none failed (a job killed before it was
sealed was never acknowledged: it fails, and the registry is as before). The
last ingest of each chain reports every registered document unchanged.

``ATTEST_TEST_CRASH_ITERATIONS`` sets the number of iterations (20 by
default); ``ATTEST_TEST_CRASH_REPORT`` names a JSON file that receives the
figures of every iteration, with the wall and CPU seconds of each phase.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.integration.ingest_stack import REUTERS, reuters_lines

pytestmark = pytest.mark.integration

NEW_DOCS = 30  # new articles per iteration
BATCH = 10  # documents per pipeline batch: three batches of new articles
CLI = [sys.executable, "-m", "attest.cli"]
PREFIX = "attest:ingest:"


def _env(data_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ATTEST_DATA_DIR": str(data_dir),
        "ATTEST_INGEST_BATCH_SIZE": str(BATCH),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
    }


def _rows(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Read the state as another process would, while the writer may be running."""
    if not db.is_file():
        return []
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute(sql, params).fetchall()
    except sqlite3.OperationalError:
        return []


def _text(value: Any) -> str:
    return bytes(value).decode("utf-8", "surrogatepass")


def _acknowledged(db: Path) -> set[str]:
    """Document ids of every sealed job: what an Ingest call has acknowledged."""
    out: set[str] = set()
    sealed = _rows(db, "SELECT key FROM h WHERE field = 'sealed' AND value = CAST('1' AS BLOB)")
    for (key,) in sealed:
        for (value,) in _rows(db, "SELECT value FROM h WHERE key = ?", (f"{key}:items",)):
            out.add(json.loads(bytes(value))["article"]["id"])
    return out


def _registry(db: Path) -> set[str]:
    return {
        str(f)
        for (f,) in _rows(db, "SELECT field FROM h WHERE key = ?", (f"{PREFIX}registry:default",))
    }


def _jobs(db: Path) -> set[str]:
    rows = _rows(
        db, "SELECT key FROM h WHERE field = 'created_at' AND key LIKE ?", (f"{PREFIX}job:%",)
    )
    return {str(k).removeprefix(f"{PREFIX}job:") for (k,) in rows}


def _job(db: Path, job_id: str) -> dict[str, Any]:
    """The job's head fields and the size of each of its progress sets."""
    key = f"{PREFIX}job:{job_id}"
    out: dict[str, Any] = {
        str(f): _text(v) for f, v in _rows(db, "SELECT field, value FROM h WHERE key = ?", (key,))
    }
    for stage in ("indexed", "unchanged", "created", "updated", "failed"):
        rows = _rows(db, "SELECT COUNT(*) FROM s WHERE key = ?", (f"{key}:s:{stage}",))
        out[stage] = int(rows[0][0]) if rows else 0
    return out


def _pending(db: Path) -> int:
    return len(_rows(db, "SELECT field FROM h WHERE key = ?", (f"{PREFIX}pending:default",)))


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether ``proc`` has exited, leaving it to ``_wait`` to collect (poll() would)."""
    return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> float:
    """Wait for ``proc`` (killed after ``timeout`` seconds); its CPU seconds, which
    unlike wall time do not depend on what else the machine is doing."""
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime


def _run(args: list[str], data: Path, log: Path, timeout: float = 900) -> tuple[str, float]:
    """Run the CLI to its end: (its standard output, CPU seconds); it must succeed."""
    errors = log.with_suffix(".err")
    with log.open("wb") as out, errors.open("wb") as err:
        proc = subprocess.Popen(args, env=_env(data), stdout=out, stderr=err)
        cpu = _wait(proc, timeout)
    output = log.read_text(encoding="utf-8", errors="replace")
    assert proc.returncode == 0, output[-3000:] + errors.read_text(errors="replace")[-3000:]
    return output, cpu


def _ingest_summary(output: str) -> dict[str, int]:
    found = re.search(
        r"received ([\d,]+)\s+ingested ([\d,]+)\s+updated ([\d,]+)\s+unchanged ([\d,]+)\s+"
        r"failed ([\d,]+)",
        output,
    )
    assert found, output
    names = ("received", "created", "updated", "unchanged", "failed")
    return {n: int(v.replace(",", "")) for n, v in zip(names, found.groups(), strict=True)}


@dataclass
class Chain:
    """One data directory and the file its iterations grow."""

    number: int
    directory: Path
    lines: list[bytes] = field(default_factory=list)

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def db(self) -> Path:
        return self.data / "ingest" / "state.sqlite3"


def _iteration(
    chain: Chain, n: int, new: list[bytes], rng: random.Random, span: float
) -> dict[str, Any]:
    db, data = chain.db, chain.data
    registered_before = _registry(db)
    known_jobs = _jobs(db)
    chain.lines = [*chain.lines, *new]
    corpus = chain.directory / f"corpus-{n}.jsonl"
    corpus.write_bytes(b"\n".join(chain.lines) + b"\n")
    file_ids = [json.loads(line)["id"] for line in chain.lines]
    assert registered_before <= set(file_ids)
    log = (chain.directory / f"ingest-{n}.log").open("ab")
    started = time.monotonic()
    proc = subprocess.Popen(
        [*CLI, "ingest", str(corpus), "--data-dir", str(data), "--batch-size", "100"],
        env=_env(data),
        stdout=log,
        stderr=log,
    )
    # Wait until the job exists and a random number of its batches (0 to 2 of
    # 3) is indexed, then kill at a random moment of the next batch (reading,
    # enriching, embedding or writing).
    batches = rng.randrange(0, 3)
    delay = rng.uniform(0, span)
    deadline = time.monotonic() + 600
    job_id = ""
    while True:
        if not job_id:
            fresh = _jobs(db) - known_jobs
            job_id = next(iter(fresh), "")
        if job_id and _job(db, job_id)["indexed"] >= BATCH * batches:
            break
        if _exited(proc):
            break
        assert time.monotonic() < deadline, "the ingest job made no progress"
        time.sleep(0.05)
    time.sleep(delay)
    finished_first = _exited(proc)
    if not finished_first:
        proc.send_signal(signal.SIGKILL)
    ingest_cpu = _wait(proc, 60)
    killed_at = time.monotonic()
    if not job_id:
        (job_id,) = _jobs(db) - known_jobs
    acknowledged = _acknowledged(db)
    registered_at_kill = _registry(db)
    pending_at_kill = _pending(db)

    output, doctor_cpu = _run(
        [*CLI, "doctor", "--data-dir", str(data), "--repair", "--json"],
        data,
        chain.directory / f"doctor-{n}.log",
    )
    doctored_at = time.monotonic()
    report = json.loads(output.strip().splitlines()[-1])
    registered = _registry(db)
    job = _job(db, job_id)
    before, after = report["before"][0], report["after"][0]
    return {
        "iteration": n,
        "chain": chain.number,
        "documents_in_file": len(file_ids),
        "registered_before": len(registered_before),
        "kill_after_batches": batches,
        "kill_after_s": round(delay, 2),
        "finished_before_kill": finished_first,
        "acknowledged": len(acknowledged),
        "registered_at_kill": len(registered_at_kill),
        "pending_at_kill": pending_at_kill,
        "resumed_jobs": len(report["resumed"]),
        "lost": len(acknowledged - registered),
        "before_repair": before,
        "repairs": report["repairs"],
        "after_repair": after,
        "job": {
            k: job.get(k)
            for k in ("received", "sealed", "error", "unchanged", "created", "updated", "failed")
        },
        "ingest_s": round(killed_at - started, 1),
        "doctor_s": round(doctored_at - killed_at, 1),
        "seconds": round(doctored_at - started, 1),
        "ingest_cpu_s": round(ingest_cpu, 1),
        "doctor_cpu_s": round(doctor_cpu, 1),
        "_acknowledged_ids": acknowledged,
        "_registered_before": registered_before,
        "_registered_ids": registered,
        "_file_ids": file_ids,
        "_job": job,
    }


def _check(r: dict[str, Any]) -> None:
    acked, registered = r["_acknowledged_ids"], r["_registered_ids"]
    assert acked <= registered, f"lost: {sorted(acked - registered)[:10]}"
    after = r["after_repair"]
    assert after["consistent"], after
    stores = after["stores"]
    assert all(s["orphans"] == 0 and s["missing"] == 0 for s in stores.values()), after
    assert stores["lexical"]["documents"] == stores["vectors"]["documents"] == after["documents"]
    assert stores["lexical"]["units"] == stores["vectors"]["units"] == after["passages"]
    assert stores["kg_links"]["units"] == after["kg_links"]
    assert stores["lexical"]["checksum"] == stores["vectors"]["checksum"] == after["checksum"]
    assert after["documents"] == len(registered)
    job, before, ids = r["_job"], r["_registered_before"], r["_file_ids"]
    if job.get("sealed"):
        # Acknowledged: resumed to the end, it is the re-ingest of the previous
        # iteration (every document registered then is unchanged) and ingests
        # the rest.
        assert not job.get("error"), job
        assert int(job["received"]) == len(ids)
        assert job["failed"] == 0
        assert job["updated"] == 0
        assert job["unchanged"] == len(before)
        assert job["created"] == job["indexed"] == len(ids) - len(before)
        assert registered == set(ids)
    else:
        # Never acknowledged: the restart fails it, and nothing of it is kept.
        assert job.get("error"), job
        assert registered == before


def _run_chain(
    chain: Chain,
    iterations: list[int],
    corpus: list[bytes],
    seed: int,
    span: float,
    lock: threading.Lock,
    results: list[dict[str, Any]],
) -> dict[str, Any]:
    for n in iterations:
        rng = random.Random(f"{seed}:{n}")
        r = _iteration(chain, n, corpus[n * NEW_DOCS : (n + 1) * NEW_DOCS], rng, span)
        public = {k: v for k, v in r.items() if not k.startswith("_")}
        with lock:
            results.append(public)
            print(json.dumps(public), flush=True)
        _check(r)
    # The last re-ingest of the chain, not killed: every acknowledged document
    # unchanged. Only the last iteration's new documents can be unacknowledged
    # (a kill before its intake ended; an earlier iteration's are in every
    # later file): those, and nothing else, are created now.
    corpus_file = chain.directory / "corpus-final.jsonl"
    corpus_file.write_bytes(b"\n".join(chain.lines) + b"\n")
    registered = _registry(chain.db)
    unacknowledged = len(chain.lines) - len(registered)
    assert 0 <= unacknowledged <= NEW_DOCS, unacknowledged
    started = time.monotonic()
    output, cpu = _run(
        [*CLI, "ingest", str(corpus_file), "--data-dir", str(chain.data)],
        chain.data,
        chain.directory / "ingest-final.log",
    )
    counts = _ingest_summary(output)
    assert counts == {
        "received": len(chain.lines),
        "created": unacknowledged,
        "updated": 0,
        "unchanged": len(registered),
        "failed": 0,
    }, counts
    assert len(_registry(chain.db)) == len(chain.lines)
    return {
        "chain": chain.number,
        **counts,
        "seconds": round(time.monotonic() - started, 1),
        "cpu_s": round(cpu, 1),
    }


@pytest.mark.timeout(0)
def test_kill_9_during_embedded_ingest_loses_nothing_and_leaves_no_drift(tmp_path: Path) -> None:
    if not REUTERS.is_file():
        pytest.fail(f"{REUTERS} is missing (set ATTEST_SHARED_DIR)")
    iterations = int(os.environ.get("ATTEST_TEST_CRASH_ITERATIONS", "20"))
    chains = max(1, min(iterations, int(os.environ.get("ATTEST_TEST_CRASH_CHAINS", "2"))))
    span = float(os.environ.get("ATTEST_TEST_CRASH_SPAN_SECONDS", "4"))
    seed = int(os.environ.get("ATTEST_TEST_CRASH_SEED", "17"))
    corpus = reuters_lines(NEW_DOCS * iterations)
    assert len(corpus) == NEW_DOCS * iterations
    lock = threading.Lock()
    results: list[dict[str, Any]] = []
    started = time.monotonic()
    with ThreadPoolExecutor(chains) as pool:
        futures = []
        for c in range(chains):
            directory = tmp_path / f"chain-{c}"
            directory.mkdir()
            futures.append(
                pool.submit(
                    _run_chain,
                    Chain(c, directory),
                    list(range(c, iterations, chains)),
                    corpus,
                    seed,
                    span,
                    lock,
                    results,
                )
            )
        finals = [f.result() for f in futures]
    results.sort(key=lambda r: r["iteration"])
    summary = {
        "iterations": iterations,
        "chains": chains,
        "seconds": round(time.monotonic() - started, 1),
        "cpu_s": round(
            sum(r["ingest_cpu_s"] + r["doctor_cpu_s"] for r in results)
            + sum(f["cpu_s"] for f in finals),
            1,
        ),
    }
    print(json.dumps(summary))
    report = os.environ.get("ATTEST_TEST_CRASH_REPORT")
    if report:
        Path(report).write_text(
            json.dumps({**summary, "runs": results, "final_reingest": finals}, indent=2) + "\n",
            encoding="utf-8",
        )
    assert len(results) == iterations
