"""The GPU benchmark's CPU smoke mode runs the same code path and writes its report."""

from __future__ import annotations

import json
from pathlib import Path

from loadtest.bench_pfid import main


def test_tiny_cpu_smoke_run_reports_every_batch_size(tmp_path: Path) -> None:
    out = tmp_path / "pfid.json"
    argv = ["--device", "cpu", "--tiny", "--docs", "6", "--tokens", "32", "--queries", "2"]
    assert main([*argv, "--warmup", "0", "--batch-sizes", "1,2", "--json-out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["model"] == "tiny (d_model 64)"
    assert [r["batch_size"] for r in report["results"]] == [1, 2]
    for row in report["results"]:
        assert row["ms_per_query_p50"] > 0
        assert row["ms_per_query_p99"] >= row["ms_per_query_p50"]
        assert row["queries_per_second"] > 0
    assert 6 <= report["mean_passages_per_query"] <= 48
