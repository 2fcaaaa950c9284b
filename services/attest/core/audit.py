"""The audit log: every write and delete, per tenant, with who, when, which ids and
how it ended.

The server interceptor records each call of an audited method (``AUDITED``:
ingest, delete, knowledge store) once it has ended, whatever its outcome:
refused at the door (unauthenticated, without the scope), failed, or done.
A record names the tenant the call acted for, the caller's identity, the
ids the request named (the first ``MAX_IDS`` of them, and how many), the
gRPC status and, when the caller named a tenant the call did not act for
(a user's ``x-attest-tenant`` is never honoured), that tenant: to it the
attempt was refused.

Records go to the ``attest.audit`` logger (one structured line each, for a
deployment that ships its logs) and, when ``AuditSettings.path`` is set, to
an SQLite file there, kept ``retention_days`` and read by ``attest audit``.
Nothing here imports grpc or a service package: requests are read by their
field names.
"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("attest.audit")

#: Ids kept per record; ``id_count`` says how many the request named.
MAX_IDS = 100
#: Writes between two sweeps of expired records.
_SWEEP_EVERY = 500


#: A raw JSON record is parsed for its id up to this size; a larger one's id is
#: looked for near its start (a record is not parsed twice on the event loop).
_PARSE_BYTES = 64 * 1024
_JSON_ID = re.compile(rb'"_?id"\s*:\s*"((?:[^"\\]|\\.){0,256})"')


def _raw_id(raw: bytes) -> str:
    if len(raw) <= _PARSE_BYTES:
        try:
            data = json.loads(raw)
        except ValueError:
            return ""
        value = data.get("id", data.get("_id", "")) if isinstance(data, dict) else ""
        return str(value)
    match = _JSON_ID.search(raw[:4096])
    if match is None:
        return ""
    try:
        return str(json.loads(b'"' + match.group(1) + b'"'))
    except ValueError:
        return ""


def _ingest_ids(request: Any) -> list[str]:
    return [
        str(item.document.id) if item.HasField("document") else _raw_id(item.raw_json)
        for item in getattr(request, "items", ())
    ]


#: Audited methods: full method name -> (action, the ids a request names).
AUDITED: dict[str, tuple[str, Callable[[Any], list[str]]]] = {
    "/attest.ingest.v1.IngestService/Ingest": ("ingest", _ingest_ids),
    "/attest.ingest.v1.IngestService/IngestStream": ("ingest", lambda _: []),
    "/attest.ingest.v1.IngestService/Delete": (
        "delete",
        lambda r: [str(d) for d in getattr(r, "doc_ids", ())],
    ),
    "/attest.knowledge.v1.KnowledgeService/Store": (
        "knowledge_store",
        lambda r: [str(getattr(r, "source_doc_id", ""))],
    ),
}


@dataclass(frozen=True)
class AuditRecord:
    at: float  # Unix time the call ended
    tenant: str  # the tenant the call acted for ("" when refused before it was known)
    identity: str  # e.g. key:ingest-acme, jwt:alice, service, "" when unauthenticated
    action: str  # ingest, delete, knowledge_store
    outcome: str  # the gRPC status name, OK when it succeeded
    ids: tuple[str, ...] = ()
    id_count: int = 0
    detail: str = ""  # the job of an ingest, or the reason of a refusal (short)
    named_tenant: str = ""  # a tenant the caller named and the call did not act for
    request_id: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def refused(self) -> bool:
        return self.outcome in ("UNAUTHENTICATED", "PERMISSION_DENIED") or bool(self.named_tenant)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["ids"] = list(self.ids)
        out["refused"] = self.refused
        return out


class AuditLog:
    """Records to the ``attest.audit`` logger and, with a path, to SQLite."""

    def __init__(self, path: Path | None, retention_days: float) -> None:
        self.path = path
        self.retention_seconds = retention_days * 86_400
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._writes = 0

    def _connect(self) -> sqlite3.Connection:
        if self._db is None:
            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(
                "CREATE TABLE IF NOT EXISTS audit (at REAL NOT NULL, tenant TEXT NOT NULL, "
                "named_tenant TEXT NOT NULL, record TEXT NOT NULL)"
            )
            db.execute("CREATE INDEX IF NOT EXISTS audit_at ON audit (at)")
            self._db = db
            self._sweep(time.time())
        return self._db

    def _sweep(self, now: float) -> None:
        assert self._db is not None
        self._db.execute("DELETE FROM audit WHERE at < ?", (now - self.retention_seconds,))

    def record(self, record: AuditRecord) -> None:
        log.info("audit", extra={"audit": record.to_json()})
        if self.path is None:
            return
        with self._lock:
            try:
                db = self._connect()
            except (OSError, sqlite3.Error) as err:
                # Said once; the records still reach the attest.audit logger.
                log.warning(
                    "the audit file %s cannot be opened (%s): audit records go to the log only",
                    self.path,
                    err,
                )
                self.path = None
                return
            db.execute(
                "INSERT INTO audit VALUES (?, ?, ?, ?)",
                (record.at, record.tenant, record.named_tenant, json.dumps(record.to_json())),
            )
            self._writes += 1
            if self._writes % _SWEEP_EVERY == 0:
                self._sweep(record.at)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


def read(
    path: Path,
    *,
    tenants: Iterable[str] = (),
    since: float | None = None,
    limit: int = 1000,
    retention_days: float | None = None,
    now: float | None = None,
) -> list[dict[str, Any]]:
    """Records of ``path``, newest first: of ``tenants`` (those the calls acted for,
    or named without acting for them) when given, since ``since``, and within
    ``retention_days`` when given."""
    if not path.is_file():
        return []
    floor = since or 0.0
    if retention_days is not None:
        floor = max(floor, (now or time.time()) - retention_days * 86_400)
    wanted = list(tenants)
    query = "SELECT record FROM audit WHERE at >= ?"
    args: list[Any] = [floor]
    if wanted:
        marks = ",".join("?" * len(wanted))
        query += f" AND (tenant IN ({marks}) OR named_tenant IN ({marks}))"
        args += wanted + wanted
    query += " ORDER BY at DESC, rowid DESC LIMIT ?"
    args.append(limit)
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return [json.loads(row[0]) for row in db.execute(query, args)]
    finally:
        db.close()
