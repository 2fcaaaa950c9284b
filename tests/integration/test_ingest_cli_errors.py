"""`attest ingest --address` against a service that refuses the call: the
progress bar does not claim the documents were sent, and the error says what
to do."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from attest.core.auth import new_api_key
from attest.core.server import running
from attest.core.settings import AuthSettings, ServerSettings
from attest.ingest.servicer import IngestServicer
from attest.ingest.settings import IngestSettings
from tests.integration.perimeter import write_keys

pytestmark = pytest.mark.integration


async def _cli(*args: str, env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "attest.cli",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 300)
    assert process.returncode is not None
    return process.returncode, out.decode()


@pytest.mark.timeout(600)
async def test_a_refused_credential_stops_the_bar_and_says_what_to_do(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(30):
        (folder / f"d{i}.txt").write_text(f"Story number {i} about water.", encoding="utf-8")
    keys = tmp_path / "keys.json"
    ask_key, ingest_key = new_api_key(), new_api_key()
    write_keys(
        keys,
        [
            {"id": "ask", "key": ask_key, "tenant": "acme", "scopes": ["ask"]},
            {"id": "ingest", "key": ingest_key, "tenant": "acme", "scopes": ["ingest"]},
        ],
    )
    settings = ServerSettings(
        host="127.0.0.1", port=0, auth=AuthSettings(keys_file=keys, reload_check_seconds=0)
    )
    servicer = IngestServicer(IngestSettings(data_dir=tmp_path / "state"))
    base = {k: v for k, v in os.environ.items() if not k.startswith("ATTEST_")}
    async with running([servicer], settings) as server:
        address = f"127.0.0.1:{server.port}"
        command = ("ingest", str(folder), "--address", address, "--batch-size", "1")
        code, out = await _cli(*command, env=base)
        assert code == 1, out
        assert "UNAUTHENTICATED: no credential" in out
        assert "Nothing was ingested" in out
        assert "ATTEST_CLIENT_TOKEN" in out
        # Refused before any file is read: no progress is shown at all.
        assert "sending" not in out
        assert "%|" not in out
        code, out = await _cli(*command, env={**base, "ATTEST_CLIENT_TOKEN": ask_key})
        assert code == 1, out
        assert "PERMISSION_DENIED" in out
        assert "scope" in out
        assert "sending" not in out
        # The same command with a key that may ingest goes through.
        code, out = await _cli(*command, env={**base, "ATTEST_CLIENT_TOKEN": ingest_key})
        assert code == 0, out
        assert "received 30  ingested 30" in out
