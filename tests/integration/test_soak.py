"""loadtest/soak.py for half a minute against a real `attest serve all --embedded` with API keys.

The mix deals ask, stream, ingest and delete as the first four calls, so at
concurrency 4 every kind runs at once; the soak finds the server's pid from the
listening port and reads its memory and open files. The verdict's memory and
latency-drift figures are left to long runs: half a minute on a shared
machine says nothing about them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.front_door import front_door

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KINDS = ["ask", "stream", "ingest", "delete"]


@pytest.mark.timeout(900)
def test_soak_half_a_minute(tmp_path: Path) -> None:
    out = tmp_path / "report"
    with front_door(tmp_path) as door:
        run = subprocess.run(
            [
                sys.executable,
                str(ROOT / "loadtest" / "soak.py"),
                "--address",
                door.grpc_address,
                "--api-key",
                door.keys["acme"],
                "--minutes",
                "0.5",
                "--mix",
                "ask=2,stream=1,ingest=1,delete=1",
                "--concurrency",
                "4",
                "--sample-seconds",
                "1",
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        server_log = door.log.read_text(errors="replace")[-3000:]
    assert run.returncode in (0, 1), run.stdout + run.stderr
    report = json.loads((out / "soak.json").read_text(encoding="utf-8"))
    assert (out / "soak.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the server was found from its port and read from /proc
    assert report["pid"] is not None
    cmdline = Path(f"/proc/{report['pid']}/cmdline")
    assert not cmdline.exists() or b"serve" in cmdline.read_bytes()  # stopped by now
    samples = report["samples"]
    assert len(samples) >= 20, samples  # one a second for 30 s
    assert all(s["rss_bytes"] > 50 * 2**20 and s["open_files"] > 3 for s in samples)

    totals = report["totals"]
    assert report["kinds"] == KINDS
    assert totals["unknown_internal"] == 0, (report["messages"], server_log)
    assert totals["errors"] == {}, (report["messages"], server_log)
    for kind in KINDS:
        assert totals["kinds"][kind]["ok"] >= 1, (kind, report["messages"])
        assert totals["kinds"][kind]["p50_ms"] <= totals["kinds"][kind]["p99_ms"]
    assert totals["failed_items"] == 0

    # half a minute is one per-minute row, holding every call
    (minute,) = report["minutes"]
    assert minute["minute"] == 1
    assert (
        minute["requests"]
        == totals["requests"]
        == sum(minute["kinds"][k]["requests"] for k in KINDS)
    )
    assert minute["rss_bytes"] == max(s["rss_bytes"] for s in samples)

    checks = report["verdict"]["checks"]
    assert report["verdict"]["window_seconds"] == 6.0
    assert checks["no_unknown_internal"]["met"] is True
    assert checks["every_kind_succeeded"]["met"] is True
    assert checks["rss_growth"]["met"] is not None  # judged: the RSS was read
    assert set(checks["p99_drift"]["kinds"]) == set(KINDS)
    assert run.returncode == (0 if report["verdict"]["passed"] else 1)
    assert ("PASSED" if run.returncode == 0 else "FAILED") in run.stdout
