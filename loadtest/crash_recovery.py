"""Crash recovery of the embedded ingest: ``kill -9`` during ``attest ingest``, then a clean finish.

The scenario of issue 49: the first ``--docs`` Reuters-21578 articles are
ingested with ``attest ingest`` (embedded, one process) into a fresh data
directory without interruption, which gives the clean time on this machine in
this session. Then a second fresh data directory gets the same command
``--kills`` times, each killed with SIGKILL at a random moment (seeded), and
then once more to the end. The moment is chosen by progress, not by the clock
(the machine may be shared, and a resumed run is shorter): a run is killed
once the registry holds a random share, between ``--kill-from`` and
``--kill-to``, of the documents it still lacked when the run started, plus a
random 0-2 s, so that the kill falls inside a slice of work rather than just
after a commit. The figures, read from the ingest state afterwards:

* operations: items each stage (enrich, embed, index) processed over every job
  and every attempt (the state's per-job work counters, which count work as it
  starts, so a killed attempt is counted), over the documents stored;
* the last run's time against the clean run's;
* the job reports: documents created (and updated) summed over every job,
  against the documents in the registry;
* ``attest doctor`` on the data directory (exit 0: registry and stores agree);
* a re-ingest of the same file: every document unchanged.

    uv run python loadtest/crash_recovery.py --docs 1500 --kills 5

Prints the figures and writes them to loadtest/reports/crash-recovery.json;
exits 1 when an acceptance bound is missed (operations <= 1.2x the documents
for every stage, last run <= 1.5x the clean run, reports summing to the
documents once, doctor consistent, re-ingest all unchanged).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "loadtest/reports/crash-recovery.json"
DEFAULT_DATA = ROOT.parent / "shared/data/news/reuters21578.jsonl"
ATTEST = [sys.executable, "-c", "from attest.cli import main; main()"]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    # Nothing of the caller's configuration may point the runs elsewhere.
    for key in list(env):
        if key.startswith("ATTEST_"):
            del env[key]
    return env


def ingest(
    path: Path, data_dir: Path, *, kill_at: int | None = None, jitter: float = 0.0
) -> dict[str, Any]:
    """One ``attest ingest`` run; killed with SIGKILL ``jitter`` seconds after the
    registry holds ``kill_at`` documents."""
    began = time.monotonic()
    proc = subprocess.Popen(
        [*ATTEST, "ingest", str(path), "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        start_new_session=True,
    )
    killed = False
    if kill_at is not None:
        # The pipes are drained by threads while this one watches the registry.
        out_lines: list[str] = []
        err_lines: list[str] = []
        readers = [
            threading.Thread(target=lambda s=s, b=b: b.extend(s), daemon=True)
            for s, b in ((proc.stdout, out_lines), (proc.stderr, err_lines))
        ]
        for r in readers:
            r.start()
        while proc.poll() is None:
            if stored(data_dir) >= kill_at:
                time.sleep(jitter)
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    killed = True
                break
            time.sleep(0.2)
        proc.wait()
        for r in readers:
            r.join()
        out, err = "".join(out_lines), "".join(err_lines)
    else:
        out, err = proc.communicate()
    return {
        "seconds": round(time.monotonic() - began, 2),
        "killed": killed,
        "exit": proc.returncode,
        "stdout": out,
        "stderr_tail": err[-2000:],
    }


def stored(data_dir: Path) -> int:
    """Documents in the registry of ``data_dir`` (0 before the first run)."""
    path = data_dir / "ingest" / "state.sqlite3"
    if not path.is_file():
        return 0
    from attest.ingest.state import PREFIX

    with sqlite3.connect(path) as db:
        key = f"{PREFIX}registry:default"
        return int(db.execute("SELECT COUNT(*) FROM h WHERE key = ?", (key,)).fetchone()[0])


def doctor(data_dir: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [*ATTEST, "doctor", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        env=_env(),
        check=False,
    )
    return {"exit": proc.returncode, "stdout": proc.stdout[-4000:]}


def report_counts(stdout: str) -> dict[str, int]:
    """The counts line of ``attest ingest``'s report."""
    m = re.search(
        r"received ([\d,]+)\s+ingested ([\d,]+)\s+updated ([\d,]+)\s+unchanged ([\d,]+)\s+"
        r"failed ([\d,]+)",
        stdout,
    )
    if m is None:
        return {}
    names = ("received", "created", "updated", "unchanged", "failed")
    return {n: int(v.replace(",", "")) for n, v in zip(names, m.groups(), strict=True)}


def state_figures(data_dir: Path) -> dict[str, Any]:
    """Work, job reports and registry size, read from the ingest state."""
    from attest.ingest.state import PREFIX, WORK_STAGES, JobStore, SqliteKeyValue

    path = data_dir / "ingest" / "state.sqlite3"
    with sqlite3.connect(path) as db:
        keys = [
            str(k)
            for (k,) in db.execute(
                "SELECT key FROM h WHERE field = 'tenant' AND key LIKE ?", (f"{PREFIX}job:%",)
            )
        ]
    kv = SqliteKeyValue(path)
    try:
        store = JobStore(kv)
        work = dict.fromkeys(WORK_STAGES, 0)
        jobs = []
        for key in keys:
            job_id = key.removeprefix(f"{PREFIX}job:")
            snap = store.snapshot(job_id, failures_limit=0)
            assert snap is not None
            done = store.work(job_id)
            for stage, n in done.items():
                work[stage] += n
            p = snap.progress
            jobs.append(
                {
                    "job": job_id,
                    "created_at": store.created_at(job_id),
                    "state": snap.state,
                    "error": snap.error,
                    "received": p.received,
                    "created": p.created,
                    "updated": p.updated,
                    "unchanged": p.unchanged,
                    "superseded": p.superseded,
                    "failed": p.failed,
                    "work": done,
                }
            )
        jobs.sort(key=lambda j: j["created_at"])
        documents = len(store.registry_ids("default"))
        open_jobs = store.open_jobs()
    finally:
        kv.close()
    return {"documents": documents, "work": work, "jobs": jobs, "open_jobs": open_jobs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Reuters JSONL")
    parser.add_argument("--docs", type=int, default=1500)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--seed", type=int, default=49)
    parser.add_argument(
        "--kill-from", type=float, default=0.1, help="of the documents a run still lacks"
    )
    parser.add_argument(
        "--kill-to", type=float, default=0.7, help="of the documents a run still lacks"
    )
    parser.add_argument("--work-dir", type=Path, default=None, help="kept when given")
    parser.add_argument("--report", type=Path, default=REPORT)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="attest-crash-") as tmp:
        work_dir = args.work_dir or Path(tmp)
        work_dir.mkdir(parents=True, exist_ok=True)
        source = work_dir / "input.jsonl"
        with args.data.open(encoding="utf-8") as src:
            lines = [line for _, line in zip(range(args.docs), src, strict=False)]
        source.write_text("".join(lines), encoding="utf-8")

        print(f"clean run: {len(lines):,} articles", flush=True)
        clean = ingest(source, work_dir / "clean")
        if clean["exit"] not in (0, 2):
            print(clean["stderr_tail"], file=sys.stderr)
            return 1
        print(f"  {clean['seconds']:.1f} s  {report_counts(clean['stdout'])}", flush=True)

        rng = random.Random(args.seed)
        crashed = work_dir / "crashed"
        runs = []
        clean_docs = report_counts(clean["stdout"]).get("created", 0)
        for k in range(args.kills):
            before = stored(crashed)
            share = rng.uniform(args.kill_from, args.kill_to)
            target = before + max(1, round(share * (clean_docs - before)))
            jitter = rng.uniform(0.0, 2.0)
            run = ingest(source, crashed, kill_at=target, jitter=jitter)
            run["kill_at_stored"] = target
            run["stored_after"] = stored(crashed)
            runs.append(run)
            state = "killed" if run["killed"] else f"finished first (exit {run['exit']})"
            print(
                f"run {k + 1}: kill -9 {jitter:.1f} s after {target:,} documents stored "
                f"({before:,} before): {state} after {run['seconds']:.1f} s, "
                f"{run['stored_after']:,} stored",
                flush=True,
            )
        last = ingest(source, crashed)
        print(
            f"last run: {last['seconds']:.1f} s (exit {last['exit']})  "
            f"{report_counts(last['stdout'])}",
            flush=True,
        )
        figures = state_figures(crashed)
        checked = doctor(crashed)
        again = ingest(source, crashed)
        again_counts = report_counts(again["stdout"])

    docs = figures["documents"]
    ratios = {stage: n / docs if docs else 0.0 for stage, n in figures["work"].items()}
    created = sum(j["created"] for j in figures["jobs"])
    updated = sum(j["updated"] for j in figures["jobs"])
    time_ratio = last["seconds"] / clean["seconds"]
    checks = {
        "operations <= 1.2x documents (each stage)": all(r <= 1.2 for r in ratios.values()),
        "last run <= 1.5x clean run": time_ratio <= 1.5,
        "every kill landed during the ingest": all(r["killed"] for r in runs),
        "reports sum to the documents once": created == docs and updated == 0,
        "no job left open": not figures["open_jobs"],
        "doctor consistent": checked["exit"] == 0,
        "re-ingest all unchanged": bool(again_counts)
        and again_counts["created"] == 0
        and again_counts["updated"] == 0
        and again_counts["unchanged"] + again_counts["failed"] == again_counts["received"],
    }
    print()
    print(f"documents stored: {docs:,} of {len(lines):,} articles")
    for stage, n in figures["work"].items():
        print(f"  {stage:<6} operations: {n:,} ({ratios[stage]:.3f}x the documents)")
    seconds = f"clean run {clean['seconds']:.1f} s, last run {last['seconds']:.1f} s"
    print(f"  {seconds} ({time_ratio:.2f}x)")
    print(f"  jobs: {len(figures['jobs'])}; created summed {created:,}, updated summed {updated:,}")
    for j in figures["jobs"]:
        print(
            f"    {j['job'][:8]} {j['state']:<6} received {j['received']:,} created "
            f"{j['created']:,} updated {j['updated']:,} unchanged {j['unchanged']:,} "
            f"(superseded {j['superseded']:,}) failed {j['failed']:,}  work {j['work']}"
        )
    print(f"  doctor exit {checked['exit']}: {checked['stdout'].strip().splitlines()[-1:]}")
    print(f"  re-ingest: {again_counts}")
    for name, ok in checks.items():
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")

    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(
        json.dumps(
            {
                "articles": len(lines),
                "kills": args.kills,
                "seed": args.seed,
                "documents": docs,
                "work": figures["work"],
                "work_ratio": ratios,
                "clean_seconds": clean["seconds"],
                "last_seconds": last["seconds"],
                "time_ratio": round(time_ratio, 3),
                "killed_runs": [
                    {
                        k: r[k]
                        for k in ("kill_at_stored", "stored_after", "killed", "seconds", "exit")
                    }
                    for r in runs
                ],
                "created_summed": created,
                "updated_summed": updated,
                "jobs": figures["jobs"],
                "doctor_exit": checked["exit"],
                "reingest": again_counts,
                "checks": checks,
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
