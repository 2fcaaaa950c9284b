"""The audit log: every ingest and delete recorded per tenant with the caller, the
ids and the outcome, refused attempts included, and read back by `attest audit`."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from attest.cli import main
from attest.common.v1 import common_pb2
from attest.core import audit
from attest.core.auth import TENANT_KEY, new_api_key
from attest.core.server import running
from attest.core.settings import AuditSettings, AuthSettings, ServerSettings
from attest.ingest.servicer import IngestServicer
from attest.ingest.settings import IngestSettings
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from tests.integration.perimeter import write_keys

pytestmark = pytest.mark.integration


def _bearer(key: str) -> tuple[str, str]:
    return ("authorization", f"Bearer {key}")


def _doc(doc_id: str) -> ingest_pb2.IngestItem:
    return ingest_pb2.IngestItem(
        document=common_pb2.Document(id=doc_id, title="T", body=f"Body of {doc_id} about water.")
    )


@pytest.mark.timeout(300)
async def test_writes_and_refused_attempts_are_recorded_per_tenant(tmp_path: Path) -> None:
    keys = {name: new_api_key() for name in ("acme", "acme-ask", "ops")}
    write_keys(
        tmp_path / "keys.json",
        [
            {"id": "acme", "key": keys["acme"], "tenant": "acme", "scopes": ["ingest"]},
            {"id": "acme-ask", "key": keys["acme-ask"], "tenant": "acme", "scopes": ["ask"]},
            {"id": "ops", "key": keys["ops"], "tenant": "ops", "scopes": ["ingest"]},
        ],
    )
    log_file = tmp_path / "audit.sqlite3"
    settings = ServerSettings(
        host="127.0.0.1",
        port=0,
        auth=AuthSettings(keys_file=tmp_path / "keys.json", reload_check_seconds=0),
        audit=AuditSettings(path=log_file),
    )
    servicer = IngestServicer(IngestSettings(data_dir=tmp_path / "state"))
    async with (
        running([servicer], settings) as server,
        grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel,
    ):
        stub = ingest_pb2_grpc.IngestServiceStub(channel)

        async def delete(*metadata: tuple[str, str], ids: list[str]) -> object:
            try:
                return await stub.Delete(
                    ingest_pb2.DeleteRequest(doc_ids=ids), metadata=metadata, timeout=30
                )
            except grpc.aio.AioRpcError as err:
                return err.code()

        for tenant, doc in (("acme", "a1"), ("ops", "o1")):
            await stub.Ingest(
                ingest_pb2.IngestRequest(items=[_doc(doc)]),
                metadata=(_bearer(keys[tenant]),),
                timeout=30,
            )
        assembly = servicer._assembly
        assert assembly is not None
        assert assembly.inline is not None
        await assembly.inline.drain()
        # acme's key names ops: the call acts for acme and finds nothing of ops's.
        crossed = await delete(_bearer(keys["acme"]), (TENANT_KEY, "ops"), ids=["o1"])
        assert isinstance(crossed, ingest_pb2.DeleteResponse)
        assert crossed.matched == 0
        assert await delete(_bearer(keys["acme-ask"]), ids=["a1"]) == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        assert await delete(ids=["a1"]) == grpc.StatusCode.UNAUTHENTICATED
        permitted = await delete(_bearer(keys["acme"]), ids=["a1"])
        assert isinstance(permitted, ingest_pb2.DeleteResponse)
        assert permitted.deleted == 1
        # ops's document is still there.
        kept = await stub.Delete(
            ingest_pb2.DeleteRequest(doc_ids=["o1"], dry_run=True),
            metadata=(_bearer(keys["ops"]),),
            timeout=30,
        )
        assert list(kept.doc_ids) == ["o1"]

    def shape(r: dict) -> tuple:
        return (r["tenant"], r["identity"], r["action"], r["outcome"], r["ids"], r["refused"])

    ops = audit.read(log_file, tenants=["ops"])
    assert [shape(r) for r in ops] == [
        ("ops", "key:ops", "delete", "OK", ["o1"], False),
        ("acme", "key:acme", "delete", "OK", ["o1"], True),
        ("ops", "key:ops", "ingest", "OK", ["o1"], False),
    ]
    assert ops[0]["detail"] == "dry run"
    assert ops[1]["named_tenant"] == "ops"
    assert ops[2]["detail"].startswith("job ")
    everything = audit.read(log_file)
    assert [shape(r) for r in everything[1:5]] == [
        ("acme", "key:acme", "delete", "OK", ["a1"], False),
        ("", "", "delete", "UNAUTHENTICATED", ["a1"], True),
        ("acme", "key:acme-ask", "delete", "PERMISSION_DENIED", ["a1"], True),
        ("acme", "key:acme", "delete", "OK", ["o1"], True),
    ]
    assert all(r["at"] > 0 for r in everything)
    out = CliRunner().invoke(main, ["audit", "--path", str(log_file), "--tenant", "ops"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert len(lines) == 3
    assert "key:acme" in lines[1]
    assert "REFUSED for tenant ops (acted for acme)" in lines[1]


def test_records_past_the_retention_are_deleted(tmp_path: Path) -> None:
    path = tmp_path / "audit.sqlite3"
    log = audit.AuditLog(path, retention_days=1)
    now = time.time()
    for at, doc in ((now - 3 * 86_400, "old"), (now - 60, "new")):
        log.record(audit.AuditRecord(at, "acme", "key:acme", "delete", "OK", (doc,), 1))
    log.close()
    # Opening the log sweeps what is past the retention.
    reopened = audit.AuditLog(path, retention_days=1)
    reopened.record(audit.AuditRecord(now, "acme", "key:acme", "ingest", "OK", ("x",), 1))
    reopened.close()
    assert [r["ids"] for r in audit.read(path)] == [["x"], ["new"]]
    assert [r["ids"] for r in audit.read(path, retention_days=30 / 86_400, now=now + 1)] == [["x"]]


def test_an_audit_file_that_cannot_be_opened_leaves_the_log_only(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x", encoding="utf-8")
    log = audit.AuditLog(blocker / "audit.sqlite3", retention_days=1)
    record = audit.AuditRecord(time.time(), "acme", "key:acme", "delete", "OK", ("a",), 1)
    log.record(record)  # said once, not raised
    log.record(record)
    assert log.path is None
