"""Crash consistency of embedded mode: kill -9 at a random moment while 300 Reuters
articles are ingested, restart, `attest doctor --repair`, re-ingest.

Every iteration asserts: no acknowledged document is lost (every document of
a sealed job is in the registry after the restart), no orphans and no missing
documents after repair, equal document and passage counts in the registry,
BM25 and the vectors, equal KG link counts, and a re-ingest of the same file
that reports every acknowledged document unchanged. The kill lands after a
random number of indexed batches, at a random moment of the next one.

``ATTEST_TEST_CRASH_ITERATIONS`` sets the number of iterations (3 by default,
for CI; the acceptance run uses 20); ``ATTEST_TEST_CRASH_REPORT`` names a JSON
file that receives the figures of every iteration.
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
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.ingest_stack import REUTERS, reuters_lines

pytestmark = pytest.mark.integration

DOCS = 300
CLI = [sys.executable, "-m", "attest.cli"]
PREFIX = "attest:ingest:"


def _env(data_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ATTEST_DATA_DIR": str(data_dir),
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


def _indexed(db: Path) -> int:
    rows = _rows(db, "SELECT COUNT(*) FROM s WHERE key LIKE ?", (f"{PREFIX}job:%:s:indexed",))
    return int(rows[0][0]) if rows else 0


def _pending(db: Path) -> int:
    return len(_rows(db, "SELECT field FROM h WHERE key = ?", (f"{PREFIX}pending:default",)))


def _ingest_summary(output: str) -> dict[str, int]:
    found = re.search(
        r"received ([\d,]+)\s+ingested ([\d,]+)\s+updated ([\d,]+)\s+unchanged ([\d,]+)\s+"
        r"failed ([\d,]+)",
        output,
    )
    assert found, output
    names = ("received", "created", "updated", "unchanged", "failed")
    return {n: int(v.replace(",", "")) for n, v in zip(names, found.groups(), strict=True)}


def _iteration(tmp: Path, corpus: Path, n: int, rng: random.Random, span: float) -> dict[str, Any]:
    data = tmp / f"run-{n}"
    db = data / "ingest" / "state.sqlite3"
    log = (tmp / f"ingest-{n}.log").open("ab")
    started = time.monotonic()
    proc = subprocess.Popen(
        [*CLI, "ingest", str(corpus), "--data-dir", str(data), "--batch-size", "100"],
        env=_env(data),
        stdout=log,
        stderr=log,
    )
    # Wait until a random number of whole batches (0 to 4 of 64) is indexed, then
    # kill at a random moment of the next batch (enriching, embedding or writing).
    batches = rng.randrange(0, 5)
    deadline = time.monotonic() + 600
    while _indexed(db) < 64 * batches or not _rows(db, "SELECT 1 FROM h WHERE field = 'tenant'"):
        if proc.poll() is not None:
            break
        assert time.monotonic() < deadline, "the ingest job made no progress"
        time.sleep(0.05)
    delay = rng.uniform(0, span)
    time.sleep(delay)
    finished_first = proc.poll() is not None
    if not finished_first:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    acknowledged = _acknowledged(db)
    registered_at_kill = _registry(db)
    pending_at_kill = _pending(db)

    doctor = subprocess.run(
        [*CLI, "doctor", "--data-dir", str(data), "--repair", "--json"],
        env=_env(data),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert doctor.returncode == 0, doctor.stdout[-3000:] + doctor.stderr[-3000:]
    report = json.loads(doctor.stdout.strip().splitlines()[-1])
    registered = _registry(db)
    before, after = report["before"][0], report["after"][0]

    again = subprocess.run(
        [*CLI, "ingest", str(corpus), "--data-dir", str(data)],
        env=_env(data),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    reingest = _ingest_summary(again.stdout)
    return {
        "iteration": n,
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
        "reingest": reingest,
        "seconds": round(time.monotonic() - started, 1),
        "_acknowledged_ids": acknowledged,
        "_registered_ids": registered,
    }


@pytest.mark.timeout(0)
def test_kill_9_during_embedded_ingest_loses_nothing_and_leaves_no_drift(tmp_path: Path):
    if not REUTERS.is_file():
        pytest.fail(f"{REUTERS} is missing (set ATTEST_SHARED_DIR)")
    iterations = int(os.environ.get("ATTEST_TEST_CRASH_ITERATIONS", "3"))
    span = float(os.environ.get("ATTEST_TEST_CRASH_SPAN_SECONDS", "15"))
    rng = random.Random(int(os.environ.get("ATTEST_TEST_CRASH_SEED", "17")))
    corpus = tmp_path / "reuters-300.jsonl"
    corpus.write_bytes(b"\n".join(reuters_lines(DOCS)) + b"\n")
    results = []
    for n in range(iterations):
        r = _iteration(tmp_path, corpus, n, rng, span)
        public = {k: v for k, v in r.items() if not k.startswith("_")}
        results.append(public)
        print(json.dumps(public))
        acked, registered = r["_acknowledged_ids"], r["_registered_ids"]
        assert acked <= registered, f"lost: {sorted(acked - registered)[:10]}"
        after = r["after_repair"]
        assert after["consistent"], after
        stores = after["stores"]
        assert all(s["orphans"] == 0 and s["missing"] == 0 for s in stores.values()), after
        assert (
            stores["lexical"]["documents"] == stores["vectors"]["documents"] == after["documents"]
        )
        assert stores["lexical"]["units"] == stores["vectors"]["units"] == after["passages"]
        assert stores["kg_links"]["units"] == after["kg_links"]
        assert stores["lexical"]["checksum"] == stores["vectors"]["checksum"] == after["checksum"]
        counts = r["reingest"]
        assert counts["received"] == DOCS
        assert counts["failed"] == 0
        assert counts["unchanged"] >= len(acked)
        assert counts["updated"] == 0
        assert counts["unchanged"] == len(registered)
    report = os.environ.get("ATTEST_TEST_CRASH_REPORT")
    if report:
        Path(report).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    assert len(results) == iterations
