"""Property-based fuzzing of the HTTP API from its OpenAPI document (docs/openapi.json).

Schemathesis generates valid and invalid requests for every operation (its
coverage and fuzzing phases) against a real `attest serve all --embedded` over
the demo corpus, authenticated as a tenant with the ask and ingest scopes. No
response may be a 5xx and none may hang (each request has a time limit; a
request that reaches it fails the run). The requests are counted from the run's
HAR record.

By default each operation gets ATTEST_HTTP_FUZZ_EXAMPLES=20 generated cases
(with the coverage phase's cases, about 900 requests, under a minute); the
full run (docs/http-api.md) sets it higher:

    ATTEST_HTTP_FUZZ_EXAMPLES=150 uv run pytest tests/integration/test_http_fuzz.py -s
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.integration.front_door import front_door

pytestmark = [pytest.mark.integration, pytest.mark.timeout(3600)]

OPENAPI = Path(__file__).resolve().parents[2] / "docs/openapi.json"
REQUEST_TIMEOUT = 120


def test_fuzzed_requests_get_no_server_error_and_no_hang(tmp_path: Path) -> None:
    examples = int(os.environ.get("ATTEST_HTTP_FUZZ_EXAMPLES", "20"))
    seed = os.environ.get("ATTEST_HTTP_FUZZ_SEED", "47")
    schemathesis = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert schemathesis, "schemathesis is in the dev group: uv sync"
    har = tmp_path / "fuzz.har"
    with front_door(tmp_path) as door:
        done = subprocess.run(
            [
                schemathesis,
                "run",
                str(OPENAPI),
                "--url",
                door.http,
                "--header",
                f"authorization: Bearer {door.keys['acme']}",
                "--checks",
                "not_a_server_error",
                "--phases",
                "coverage,fuzzing",
                "--max-examples",
                str(examples),
                "--seed",
                seed,
                "--workers",
                "1",
                "--request-timeout",
                str(REQUEST_TIMEOUT),
                "--generation-with-security-parameters",
                "false",
                "--generation-database",
                "none",
                "--suppress-health-check",
                "all",
                "--continue-on-failure",
                "--no-color",
                "--report",
                "har",
                "--report-har-path",
                str(har),
            ],
            capture_output=True,
            text=True,
            timeout=3000,
            check=False,
            cwd=tmp_path,
        )
        log = door.log.read_text(errors="replace")
    entries = json.loads(har.read_text())["log"]["entries"]
    statuses = Counter(int(e["response"]["status"]) for e in entries)
    server_errors = sum(n for status, n in statuses.items() if status >= 500)
    unanswered = statuses.get(0, 0)
    summary = f"{len(entries)} requests, statuses {dict(sorted(statuses.items()))}"
    print(summary)
    assert server_errors == 0, summary + "\n" + done.stdout[-6000:]
    assert unanswered == 0, summary + "\n" + done.stdout[-6000:]
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:] + log[-2000:]
    assert len(entries) >= 5 * examples * 0.5, summary
    assert "Traceback" not in log, log[-4000:]
