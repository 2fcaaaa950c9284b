"""Job state and the document registry.

Production keeps them in Redis, next to the Celery queues; embedded mode
keeps them in SQLite (``SqliteKeyValue``: WAL journal, every write committed
and synced before the call returns); tests may keep them in memory. All sit
behind the same small key-value interface (``KeyValue``: the Redis commands
used here), so ``JobStore`` has one implementation.

Every progress count is the size of a set of item indexes, so a stage that
runs twice for the same item (a redelivered task) counts it once.

Write order of a batch's index stage (``StageRunner.index``), and what a
crash at each point leaves:

1. ``registry_begin``: the batch's documents are noted as *pending* (in
   flight) for their job. A crash before this leaves nothing in the stores.
2. The stores are written: lexical (BM25), then semantic (vectors and KG
   links). Both upsert by (tenant, document id), so writing again repairs a
   partial write. A crash here leaves pending documents that some stores
   hold in a version the registry does not know.
3. ``registry_commit``, one transaction: the registry entries and the stored
   source text of the documents, the job's progress (indexed, created or
   updated, passages), and the pending notes removed. Only now does a
   document count as ingested; a crash after this loses nothing.

Recovery rule (embedded mode, at start-up): every job that was acknowledged
(sealed) but not finished resumes with its items that are neither indexed,
unchanged nor failed; their pending documents are written again by step 2
and committed by step 3. Open jobs are merged first: of their unfinished
items over one document only the newest job's resumes (the older ones are
superseded), and an item whose document the registry holds with the same
content hash is unchanged (``IngestCore.recover``). Step 3 decides whether an
item created, updated or left its document unchanged against the registry
inside its transaction, so jobs that overlap count each document once. A job
that was never sealed was never acknowledged and is marked failed.
``attest doctor`` then compares the registry with every store: a document in
a store but neither in the registry nor pending in an open job is an orphan
(deleted on repair); a registry document missing from a store is indexed
again from its stored source; a pending note of a job that is no longer open
is settled the same way (its document goes back to the registry's version,
or away).

On Celery (production) every task is noted (``track``) before it is sent and
forgotten when it finishes; the ingest service's watchdog
(``attest.pipeline.ingest.Watchdog``) sends again, from the first stage, the
unfinished items of a sealed job that no task in the broker holds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from attest.core.document import HasKeywords, Keywords, keywords_from_stored
from attest.core.errors import FailedPrecondition
from attest.core.write_barrier import WriteBarrier

log = logging.getLogger(__name__)

PREFIX = "attest:ingest:"
JOB_TTL_SECONDS = 7 * 24 * 3600


class KeyValue(Protocol):
    """The subset of Redis the job store uses."""

    def hset(self, key: str, mapping: Mapping[str, str]) -> None: ...
    def hsetnx(self, key: str, name: str, value: str) -> bool: ...
    def hget(self, key: str, name: str) -> str | None: ...
    def hmget(self, key: str, names: Sequence[str]) -> list[str | None]: ...
    def hgetall(self, key: str) -> dict[str, str]: ...
    def hkeys(self, key: str) -> list[str]: ...
    def hdel(self, key: str, names: Sequence[str]) -> int: ...
    def hvals(self, key: str) -> list[str]: ...
    def sadd(self, key: str, members: Sequence[str]) -> int: ...
    def srem(self, key: str, members: Sequence[str]) -> int: ...
    def smembers(self, key: str) -> set[str]: ...
    def smismember(self, key: str, members: Sequence[str]) -> list[bool]: ...
    def scard(self, key: str) -> int: ...
    def zadd_nx(self, key: str, mapping: Mapping[str, float]) -> None: ...
    def zrem(self, key: str, members: Sequence[str]) -> None: ...
    def zrange(self, key: str, start: int, stop: int) -> list[str]: ...
    def incr(self, key: str, ttl_seconds: int, amount: int = 1) -> int: ...
    def expire(self, keys: Sequence[str], ttl_seconds: int) -> None: ...
    def delete(self, keys: Sequence[str]) -> None: ...
    def transaction(self) -> contextlib.AbstractContextManager[None]:
        """Writes inside happen together or not at all where the store can do
        that (SQLite); Redis relies on every write being idempotent instead."""
        ...


class RedisKeyValue:
    """``KeyValue`` on a Redis server, riding out short outages (a restart)."""

    def __init__(self, url: str, *, outage_seconds: float = 60.0) -> None:
        import redis
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry

        attempts = max(1, int(outage_seconds / 2))
        self._r = redis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=10,
            socket_connect_timeout=5,
            retry=Retry(ExponentialBackoff(cap=2.0, base=0.1), attempts),
            retry_on_error=[redis.ConnectionError, redis.TimeoutError],
            health_check_interval=10,
        )

    def ping(self) -> bool:
        return bool(self._r.ping())

    def close(self) -> None:
        self._r.close()

    def hset(self, key: str, mapping: Mapping[str, str]) -> None:
        if mapping:
            self._r.hset(key, mapping=dict(mapping))  # type: ignore[arg-type]

    def hsetnx(self, key: str, name: str, value: str) -> bool:
        return bool(self._r.hsetnx(key, name, value))

    def hget(self, key: str, name: str) -> str | None:
        return self._r.hget(key, name)

    def hmget(self, key: str, names: Sequence[str]) -> list[str | None]:
        if not names:
            return []
        return list(self._r.hmget(key, list(names)))

    def hgetall(self, key: str) -> dict[str, str]:
        return dict(self._r.hgetall(key))

    def hkeys(self, key: str) -> list[str]:
        return list(self._r.hkeys(key))

    def hdel(self, key: str, names: Sequence[str]) -> int:
        return int(self._r.hdel(key, *names)) if names else 0

    def hvals(self, key: str) -> list[str]:
        return list(self._r.hvals(key))

    def sadd(self, key: str, members: Sequence[str]) -> int:
        return int(self._r.sadd(key, *members)) if members else 0

    def srem(self, key: str, members: Sequence[str]) -> int:
        return int(self._r.srem(key, *members)) if members else 0

    def smembers(self, key: str) -> set[str]:
        return set(self._r.smembers(key))

    def smismember(self, key: str, members: Sequence[str]) -> list[bool]:
        if not members:
            return []
        flags = self._r.smismember(key, list(members))  # type: ignore[no-untyped-call]
        return [bool(x) for x in flags]

    def scard(self, key: str) -> int:
        return int(self._r.scard(key))

    def zadd_nx(self, key: str, mapping: Mapping[str, float]) -> None:
        if mapping:
            self._r.zadd(key, dict(mapping), nx=True)  # type: ignore[arg-type]

    def zrem(self, key: str, members: Sequence[str]) -> None:
        if members:
            self._r.zrem(key, *members)

    def zrange(self, key: str, start: int, stop: int) -> list[str]:
        return list(self._r.zrange(key, start, stop))

    def incr(self, key: str, ttl_seconds: int, amount: int = 1) -> int:
        pipe = self._r.pipeline()
        pipe.incrby(key, amount)
        pipe.expire(key, ttl_seconds)
        return int(pipe.execute()[0])

    def expire(self, keys: Sequence[str], ttl_seconds: int) -> None:
        pipe = self._r.pipeline(transaction=False)
        for key in keys:
            pipe.expire(key, ttl_seconds)
        pipe.execute()

    def delete(self, keys: Sequence[str]) -> None:
        if keys:
            self._r.delete(*keys)

    def transaction(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class MemoryKeyValue:
    """``KeyValue`` in this process; ``save``/``load`` keep it in a JSON file."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._lock = threading.RLock()
        self._h: dict[str, dict[str, str]] = {}
        self._s: dict[str, set[str]] = {}
        self._z: dict[str, dict[str, float]] = {}
        self._c: dict[str, int] = {}
        if path is not None and path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            self._h = data["h"]
            self._s = {k: set(v) for k, v in data["s"].items()}
            self._z = data["z"]

    def save(self) -> None:
        if self._path is None:
            return
        with self._lock:
            data = {"h": self._h, "s": {k: sorted(v) for k, v in self._s.items()}, "z": self._z}
            text = json.dumps(data, ensure_ascii=False)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(self._path)

    def close(self) -> None:
        self.save()

    def hset(self, key: str, mapping: Mapping[str, str]) -> None:
        with self._lock:
            self._h.setdefault(key, {}).update(mapping)

    def hsetnx(self, key: str, name: str, value: str) -> bool:
        with self._lock:
            h = self._h.setdefault(key, {})
            if name in h:
                return False
            h[name] = value
            return True

    def hget(self, key: str, name: str) -> str | None:
        with self._lock:
            return self._h.get(key, {}).get(name)

    def hmget(self, key: str, names: Sequence[str]) -> list[str | None]:
        with self._lock:
            h = self._h.get(key, {})
            return [h.get(n) for n in names]

    def hgetall(self, key: str) -> dict[str, str]:
        with self._lock:
            return dict(self._h.get(key, {}))

    def hkeys(self, key: str) -> list[str]:
        with self._lock:
            return list(self._h.get(key, {}))

    def hdel(self, key: str, names: Sequence[str]) -> int:
        with self._lock:
            h = self._h.get(key, {})
            return sum(h.pop(n, None) is not None for n in names)

    def hvals(self, key: str) -> list[str]:
        with self._lock:
            return list(self._h.get(key, {}).values())

    def sadd(self, key: str, members: Sequence[str]) -> int:
        with self._lock:
            s = self._s.setdefault(key, set())
            before = len(s)
            s.update(members)
            return len(s) - before

    def srem(self, key: str, members: Sequence[str]) -> int:
        with self._lock:
            s = self._s.get(key, set())
            before = len(s)
            s.difference_update(members)
            return before - len(s)

    def smembers(self, key: str) -> set[str]:
        with self._lock:
            return set(self._s.get(key, set()))

    def smismember(self, key: str, members: Sequence[str]) -> list[bool]:
        with self._lock:
            s = self._s.get(key, set())
            return [m in s for m in members]

    def scard(self, key: str) -> int:
        with self._lock:
            return len(self._s.get(key, ()))

    def zadd_nx(self, key: str, mapping: Mapping[str, float]) -> None:
        with self._lock:
            z = self._z.setdefault(key, {})
            for member, score in mapping.items():
                z.setdefault(member, score)

    def zrem(self, key: str, members: Sequence[str]) -> None:
        with self._lock:
            z = self._z.get(key, {})
            for m in members:
                z.pop(m, None)

    def zrange(self, key: str, start: int, stop: int) -> list[str]:
        with self._lock:
            ordered = sorted(self._z.get(key, {}).items(), key=lambda kv: (kv[1], kv[0]))
            end = None if stop == -1 else stop + 1
            return [m for m, _ in ordered[start:end]]

    def incr(self, key: str, ttl_seconds: int, amount: int = 1) -> int:
        with self._lock:
            self._c[key] = self._c.get(key, 0) + amount
            return self._c[key]

    def expire(self, keys: Sequence[str], ttl_seconds: int) -> None:
        """Embedded state is small and kept; jobs expire with the process."""

    def delete(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                self._h.pop(key, None)
                self._s.pop(key, None)
                self._z.pop(key, None)
                self._c.pop(key, None)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        # Atomic against other threads only: nothing here survives the process.
        with self._lock:
            yield


class SqliteKeyValue:
    """``KeyValue`` in an SQLite database (embedded mode): durable when a call returns.

    WAL journal with ``synchronous=FULL``: each write is one committed, synced
    transaction (or part of the enclosing ``transaction()``), so a ``kill -9``
    or a power cut after a call returned loses nothing, and a crash inside a
    transaction leaves none of it. Values are stored as UTF-8 with surrogates
    passed through, so no value (not even text a validator missed) can make a
    write fail or corrupt the file. One connection, serialized by a lock: the
    callers are worker threads of one process.
    """

    SCHEMA = (
        "CREATE TABLE IF NOT EXISTS h (key TEXT NOT NULL, field TEXT NOT NULL, "
        "value BLOB NOT NULL, PRIMARY KEY (key, field)) WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS s (key TEXT NOT NULL, member TEXT NOT NULL, "
        "PRIMARY KEY (key, member)) WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS z (key TEXT NOT NULL, member TEXT NOT NULL, "
        "score REAL NOT NULL, PRIMARY KEY (key, member)) WITHOUT ROWID",
        "CREATE INDEX IF NOT EXISTS z_by_score ON z (key, score, member)",
        "CREATE TABLE IF NOT EXISTS c (key TEXT NOT NULL PRIMARY KEY, value INTEGER NOT NULL)",
    )

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._depth = 0
        try:
            db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            db.execute("PRAGMA synchronous=FULL")
            for statement in self.SCHEMA:
                db.execute(statement)
        except sqlite3.DatabaseError as exc:
            raise FailedPrecondition(f"the ingest state {path} cannot be opened: {exc}") from exc
        if str(mode).lower() != "wal":
            raise FailedPrecondition(f"the ingest state {path} cannot use a WAL journal ({mode})")
        self._db = db

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                self._db.execute("BEGIN IMMEDIATE")
            self._depth += 1
            try:
                yield
            except BaseException:
                self._depth -= 1
                if self._depth == 0:
                    self._db.execute("ROLLBACK")
                raise
            self._depth -= 1
            if self._depth == 0:
                self._db.execute("COMMIT")

    @staticmethod
    def _in(value: str) -> bytes:
        return value.encode("utf-8", "surrogatepass")

    @staticmethod
    def _out(value: bytes) -> str:
        return bytes(value).decode("utf-8", "surrogatepass")

    def _all(self, sql: str, params: Sequence[object] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def hset(self, key: str, mapping: Mapping[str, str]) -> None:
        if mapping:
            with self.transaction():
                self._db.executemany(
                    "INSERT OR REPLACE INTO h (key, field, value) VALUES (?, ?, ?)",
                    [(key, f, self._in(v)) for f, v in mapping.items()],
                )

    def hsetnx(self, key: str, name: str, value: str) -> bool:
        with self.transaction():
            cursor = self._db.execute(
                "INSERT OR IGNORE INTO h (key, field, value) VALUES (?, ?, ?)",
                (key, name, self._in(value)),
            )
            return cursor.rowcount == 1

    def hget(self, key: str, name: str) -> str | None:
        rows = self._all("SELECT value FROM h WHERE key = ? AND field = ?", (key, name))
        return self._out(rows[0][0]) if rows else None

    def hmget(self, key: str, names: Sequence[str]) -> list[str | None]:
        found: dict[str, str] = {}
        for start in range(0, len(names), 500):
            chunk = list(names[start : start + 500])
            marks = ",".join("?" * len(chunk))
            for name, value in self._all(
                f"SELECT field, value FROM h WHERE key = ? AND field IN ({marks})",  # noqa: S608
                [key, *chunk],
            ):
                found[str(name)] = self._out(value)
        return [found.get(n) for n in names]

    def hgetall(self, key: str) -> dict[str, str]:
        rows = self._all("SELECT field, value FROM h WHERE key = ?", (key,))
        return {str(f): self._out(v) for f, v in rows}

    def hkeys(self, key: str) -> list[str]:
        return [str(f) for (f,) in self._all("SELECT field FROM h WHERE key = ?", (key,))]

    def hdel(self, key: str, names: Sequence[str]) -> int:
        if not names:
            return 0
        with self.transaction():
            removed = 0
            for name in names:
                removed += self._db.execute(
                    "DELETE FROM h WHERE key = ? AND field = ?", (key, name)
                ).rowcount
            return removed

    def hvals(self, key: str) -> list[str]:
        return [self._out(v) for (v,) in self._all("SELECT value FROM h WHERE key = ?", (key,))]

    def sadd(self, key: str, members: Sequence[str]) -> int:
        if not members:
            return 0
        with self.transaction():
            added = 0
            for m in members:
                added += self._db.execute(
                    "INSERT OR IGNORE INTO s (key, member) VALUES (?, ?)", (key, m)
                ).rowcount
            return added

    def srem(self, key: str, members: Sequence[str]) -> int:
        if not members:
            return 0
        with self.transaction():
            removed = 0
            for m in members:
                removed += self._db.execute(
                    "DELETE FROM s WHERE key = ? AND member = ?", (key, m)
                ).rowcount
            return removed

    def smembers(self, key: str) -> set[str]:
        return {str(m) for (m,) in self._all("SELECT member FROM s WHERE key = ?", (key,))}

    def smismember(self, key: str, members: Sequence[str]) -> list[bool]:
        found: set[str] = set()
        for start in range(0, len(members), 500):
            chunk = list(members[start : start + 500])
            marks = ",".join("?" * len(chunk))
            found.update(
                str(m)
                for (m,) in self._all(
                    f"SELECT member FROM s WHERE key = ? AND member IN ({marks})",  # noqa: S608
                    [key, *chunk],
                )
            )
        return [m in found for m in members]

    def scard(self, key: str) -> int:
        return int(self._all("SELECT COUNT(*) FROM s WHERE key = ?", (key,))[0][0])

    def zadd_nx(self, key: str, mapping: Mapping[str, float]) -> None:
        if mapping:
            with self.transaction():
                self._db.executemany(
                    "INSERT OR IGNORE INTO z (key, member, score) VALUES (?, ?, ?)",
                    [(key, m, float(v)) for m, v in mapping.items()],
                )

    def zrem(self, key: str, members: Sequence[str]) -> None:
        if members:
            with self.transaction():
                self._db.executemany(
                    "DELETE FROM z WHERE key = ? AND member = ?", [(key, m) for m in members]
                )

    def zrange(self, key: str, start: int, stop: int) -> list[str]:
        limit = -1 if stop == -1 else max(0, stop - start + 1)
        rows = self._all(
            "SELECT member FROM z WHERE key = ? ORDER BY score, member LIMIT ? OFFSET ?",
            (key, limit, start),
        )
        return [str(m) for (m,) in rows]

    def incr(self, key: str, ttl_seconds: int, amount: int = 1) -> int:
        with self.transaction():
            self._db.execute(
                "INSERT INTO c (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = value + excluded.value",
                (key, amount),
            )
            return int(self._db.execute("SELECT value FROM c WHERE key = ?", (key,)).fetchone()[0])

    def expire(self, keys: Sequence[str], ttl_seconds: int) -> None:
        """Embedded state is kept: finished jobs stay readable until deleted."""

    def delete(self, keys: Sequence[str]) -> None:
        if keys:
            with self.transaction():
                for table in ("h", "s", "z", "c"):
                    self._db.executemany(
                        f"DELETE FROM {table} WHERE key = ?",  # noqa: S608
                        [(k,) for k in keys],
                    )

    def import_memory(self, memory: MemoryKeyValue) -> None:
        """Copy the hashes, sets and sorted sets of a JSON-saved state (earlier
        releases) into this store, in one transaction."""
        with self.transaction():
            for key, h in memory._h.items():
                self.hset(key, h)
            for key, members in memory._s.items():
                self.sadd(key, sorted(members))
            for key, z in memory._z.items():
                self.zadd_nx(key, z)


def open_embedded_state(directory: Path) -> SqliteKeyValue:
    """The embedded state under ``directory`` (``state.sqlite3``); a ``state.json``
    left by an earlier release is imported once and renamed ``state.json.imported``."""
    kv = SqliteKeyValue(directory / "state.sqlite3")
    legacy = directory / "state.json"
    if legacy.is_file():
        try:
            memory = MemoryKeyValue(legacy)
        except ValueError:
            # A save cut short by a crash: nothing in it can be trusted.
            log.warning("ignoring the unreadable ingest state %s", legacy)
            legacy.replace(legacy.with_name("state.json.unreadable"))
        else:
            kv.import_memory(memory)
            legacy.replace(legacy.with_name("state.json.imported"))
    return kv


# -- the job store ----------------------------------------------------------------

# "superseded": of "unchanged", the items a later item of the job with the same
# document id replaced.
STAGE_SETS = (
    "enriched",
    "embedded",
    "indexed",
    "unchanged",
    "superseded",
    "created",
    "updated",
    "failed",
    "warned",
)


# The stages whose work is counted per job, every attempt included (``count_work``).
WORK_STAGES = ("enrich", "embed", "index")


@dataclass(frozen=True, slots=True)
class FailureRecord:
    item_index: int
    doc_id: str
    origin: str
    stage: str  # RECEIVE, ENRICH, EMBED, INDEX
    code: str  # a FailureCode value
    reason: str

    def to_json(self) -> str:
        return json.dumps(
            [self.item_index, self.doc_id, self.origin, self.stage, self.code, self.reason],
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str) -> FailureRecord:
        i, d, o, s, c, r = json.loads(text)
        return cls(int(i), d, o, s, c, r)


@dataclass(frozen=True, slots=True)
class WarningRecord:
    """Something an item lost on its way in, though it was ingested (or may still be)."""

    item_index: int
    doc_id: str
    origin: str
    code: str  # NON_TEXT_DROPPED, PASSAGES_TRUNCATED
    message: str

    def to_json(self) -> str:
        return json.dumps(
            [self.item_index, self.doc_id, self.origin, self.code, self.message],
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str) -> WarningRecord:
        i, d, o, c, m = json.loads(text)
        return cls(int(i), d, o, c, m)


@dataclass(frozen=True, slots=True)
class TrackedTask:
    """A pipeline task sent for some of a job's items and not yet finished."""

    stage: str
    items: tuple[int, ...]
    sent_at: float


@dataclass(frozen=True, slots=True)
class WatchState:
    """What the pipeline's watchdog reads of a job before looking at its items."""

    sealed: bool
    tasks_noted: bool
    sealed_at: float | None
    dispatched: bool
    tenant: str | None


@dataclass(frozen=True, slots=True)
class ProgressCounts:
    received: int = 0
    enriched: int = 0
    embedded: int = 0
    indexed: int = 0
    failed: int = 0
    unchanged: int = 0
    created: int = 0
    updated: int = 0
    passages_indexed: int = 0
    # Of ``unchanged``: replaced by a later item with the same id, of this job or
    # of a later one (the later one is the version stored).
    superseded: int = 0
    # Items that carry warnings (text dropped or passages cut): see ``JobStore.warnings``.
    warned: int = 0

    @property
    def finished(self) -> int:
        return self.indexed + self.unchanged + self.failed


@dataclass(frozen=True, slots=True)
class JobSnapshot:
    job_id: str
    tenant: str
    state: str  # QUEUED, RUNNING, DONE, FAILED
    progress: ProgressCounts
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str = ""
    failures: tuple[FailureRecord, ...] = field(default=())
    warnings: tuple[WarningRecord, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class RegistryEntry(HasKeywords):
    """What the stores hold for one document: its version and what it produced."""

    content_hash: str
    passages: int
    # The keyword fields (attest.core.document) by name, for deletes by filter.
    keywords: Keywords = field(default_factory=dict)
    published_at: str | None = None
    # passages_digest of the passages indexed; "" for entries written before
    # the registry kept it (their content is not compared by attest doctor).
    passages_sha256: str = ""

    def to_json(self) -> str:
        # [hash, passages, organizations, entity_ids, published_at] as first
        # written, then the other keyword fields that have values and the
        # passages' digest (in that object, so earlier readers ignore it).
        others: dict[str, Any] = {
            name: list(values)
            for name, values in self.keywords.items()
            if name not in _REGISTRY_POSITIONS and values
        }
        if self.passages_sha256:
            others[_DIGEST_KEY] = self.passages_sha256
        return json.dumps(
            [
                self.content_hash,
                self.passages,
                *(list(self.keywords.get(name, ())) for name in _REGISTRY_POSITIONS),
                self.published_at,
                *([others] if others else []),
            ],
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str) -> RegistryEntry:
        h, p, o, e, d, *rest = json.loads(text)
        stored = {
            **(rest[0] if rest else {}),
            **dict(zip(_REGISTRY_POSITIONS, (o, e), strict=True)),
        }
        digest = str(stored.get(_DIGEST_KEY) or "")
        return cls(h, int(p), keywords_from_stored(stored), d, digest)


# Keyword fields a registry entry holds by position (its first format).
_REGISTRY_POSITIONS = ("organizations", "entity_ids")
_DIGEST_KEY = "passages_sha256"


def _ts(value: str | None) -> datetime | None:
    return datetime.fromtimestamp(float(value), tz=UTC) if value else None


class JobStore:
    """Jobs and the registry over a ``KeyValue``.

    ``keep_sources``: the registry also keeps each document's normalized
    source, so that ``attest doctor --repair`` can index a document again into
    a store that lost it. On by default, so the Celery workers keep them in
    Redis too (about the size of the corpus's normalized text).

    ``barrier``: in embedded mode, the write barrier of the data directory
    that ``attest backup`` pauses writes with; None elsewhere.
    """

    def __init__(
        self, kv: KeyValue, *, keep_sources: bool = True, barrier: WriteBarrier | None = None
    ) -> None:
        self.kv = kv
        self.keep_sources = keep_sources
        # Embedded mode: the data directory's write barrier, held by every write
        # that spans the registry and the stores (attest.core.write_barrier).
        self.barrier = barrier

    # keys
    @staticmethod
    def _job(job_id: str) -> str:
        return f"{PREFIX}job:{job_id}"

    def _set(self, job_id: str, name: str) -> str:
        return f"{self._job(job_id)}:s:{name}"

    def _keys(self, job_id: str) -> list[str]:
        base = self._job(job_id)
        return [
            base,
            f"{base}:items",
            f"{base}:passages",
            f"{base}:fail",
            f"{base}:failz",
            f"{base}:tasks",
            f"{base}:warn",
            *(f"{base}:work:{stage}" for stage in WORK_STAGES),
            *(self._set(job_id, s) for s in STAGE_SETS),
        ]

    @staticmethod
    def _registry(tenant: str) -> str:
        return f"{PREFIX}registry:{tenant}"

    @staticmethod
    def _sources(tenant: str) -> str:
        return f"{PREFIX}source:{tenant}"

    @staticmethod
    def _pending(tenant: str) -> str:
        return f"{PREFIX}pending:{tenant}"

    OPEN_JOBS = f"{PREFIX}jobs:open"
    TENANTS = f"{PREFIX}tenants"

    # job lifecycle
    def create_job(self, job_id: str, tenant: str) -> None:
        with self.kv.transaction():
            self.kv.hset(
                self._job(job_id),
                {
                    "tenant": tenant,
                    "created_at": repr(time.time()),
                    "received": "0",
                    "sealed": "",
                    # This job's pipeline tasks are noted (``track``): the
                    # watchdog leaves alone the jobs of releases that did not.
                    "tasks_noted": "1",
                },
            )
            self.kv.sadd(self.OPEN_JOBS, [job_id])
            self.kv.sadd(self.TENANTS, [tenant])

    def open_jobs(self) -> list[str]:
        """Jobs created and not yet seen DONE or FAILED."""
        return sorted(self.kv.smembers(self.OPEN_JOBS))

    def tenants(self) -> list[str]:
        """Every tenant that ever started a job."""
        return sorted(self.kv.smembers(self.TENANTS))

    def is_sealed(self, job_id: str) -> bool:
        return bool(self.kv.hget(self._job(job_id), "sealed"))

    def unfinished_items(self, job_id: str) -> list[int]:
        """Items with a record that are neither indexed, unchanged nor failed."""
        done: set[str] = set()
        for stage in ("indexed", "unchanged", "failed"):
            done |= self.kv.smembers(self._set(job_id, stage))
        return sorted(int(i) for i in self.kv.hkeys(f"{self._job(job_id)}:items") if i not in done)

    def finished_among(self, job_id: str, indexes: Sequence[int]) -> set[int]:
        """Of ``indexes``, the items that are indexed, unchanged (superseded
        included) or failed."""
        members = [str(i) for i in indexes]
        done: set[int] = set()
        for stage in ("indexed", "unchanged", "failed"):
            flags = self.kv.smismember(self._set(job_id, stage), members)
            done.update(i for i, flag in zip(indexes, flags, strict=True) if flag)
        return done

    def created_at(self, job_id: str) -> float:
        value = self.kv.hget(self._job(job_id), "created_at")
        return float(value) if value else 0.0

    def tenant_of(self, job_id: str) -> str | None:
        return self.kv.hget(self._job(job_id), "tenant")

    def record_items(self, job_id: str, records: Mapping[int, str], received: int) -> None:
        """Durably record items (JSON) and the count received so far."""
        if records:
            self.kv.hset(f"{self._job(job_id)}:items", {str(i): r for i, r in records.items()})
        self.kv.hset(self._job(job_id), {"received": str(received)})

    def items(self, job_id: str, indexes: Sequence[int]) -> list[str | None]:
        return self.kv.hmget(f"{self._job(job_id)}:items", [str(i) for i in indexes])

    def seal(self, job_id: str, received: int) -> None:
        self.kv.hset(
            self._job(job_id),
            {"received": str(received), "sealed": "1", "sealed_at": repr(time.time())},
        )

    def mark_dispatched(self, job_id: str) -> None:
        """Every batch of the job was handed to the pipeline."""
        self.kv.hset(self._job(job_id), {"dispatched": repr(time.time())})

    def watch_state(self, job_id: str) -> WatchState:
        sealed, noted, sealed_at, dispatched, tenant = self.kv.hmget(
            self._job(job_id), ["sealed", "tasks_noted", "sealed_at", "dispatched", "tenant"]
        )
        return WatchState(
            sealed=bool(sealed),
            tasks_noted=bool(noted),
            sealed_at=float(sealed_at) if sealed_at else None,
            dispatched=bool(dispatched),
            tenant=tenant,
        )

    def mark_started(self) -> None:
        """(kept for symmetry; started_at is set by ``mark``)."""

    def mark(self, job_id: str, stage: str, indexes: Iterable[int]) -> None:
        members = [str(i) for i in indexes]
        if not members:
            return
        self.kv.hsetnx(self._job(job_id), "started_at", repr(time.time()))
        if stage == "unchanged":
            # Finished counts indexed, unchanged and failed apart: an item is in
            # one of them only (an indexed item stays indexed).
            flags = self.kv.smismember(self._set(job_id, "indexed"), members)
            members = [m for m, indexed in zip(members, flags, strict=True) if not indexed]
            if not members:
                return
            self.kv.srem(self._set(job_id, "failed"), members)
            self.kv.hdel(f"{self._job(job_id)}:fail", members)
            self.kv.zrem(f"{self._job(job_id)}:failz", members)
        if stage == "indexed":
            # An item that failed on an earlier delivery and then succeeded is indexed;
            # so is one superseded by a later job while its batch was being written.
            self.kv.srem(self._set(job_id, "failed"), members)
            self.kv.hdel(f"{self._job(job_id)}:fail", members)
            self.kv.zrem(f"{self._job(job_id)}:failz", members)
            self.kv.srem(self._set(job_id, "unchanged"), members)
            self.kv.srem(self._set(job_id, "superseded"), members)
        self.kv.sadd(self._set(job_id, stage), members)

    def add_passages(self, job_id: str, counts: Mapping[int, int]) -> None:
        self.kv.hset(f"{self._job(job_id)}:passages", {str(i): str(n) for i, n in counts.items()})

    def fail(self, job_id: str, failures: Sequence[FailureRecord]) -> None:
        if not failures:
            return
        indexed = self.kv.smembers(self._set(job_id, "indexed")) if failures else set()
        fresh = [f for f in failures if str(f.item_index) not in indexed]
        if not fresh:
            return
        now = time.time()
        base = self._job(job_id)
        members = [str(f.item_index) for f in fresh]
        for f in fresh:
            self.kv.hsetnx(f"{base}:fail", str(f.item_index), f.to_json())
        self.kv.zadd_nx(f"{base}:failz", {m: now + k * 1e-6 for k, m in enumerate(members)})
        self.kv.sadd(self._set(job_id, "failed"), members)
        self.kv.hsetnx(base, "started_at", repr(now))

    def warn(self, job_id: str, warnings: Sequence[WarningRecord]) -> None:
        """Record warnings, one per (item, code): a stage that runs again for the
        item replaces its warning instead of adding one."""
        if not warnings:
            return
        self.kv.hset(
            f"{self._job(job_id)}:warn", {f"{w.item_index}:{w.code}": w.to_json() for w in warnings}
        )
        self.kv.sadd(self._set(job_id, "warned"), [str(w.item_index) for w in warnings])

    def warnings(self, job_id: str, limit: int = 100) -> list[WarningRecord]:
        """The job's warnings in item order, at most ``limit``."""
        if limit <= 0:
            return []
        found = [WarningRecord.from_json(t) for t in self.kv.hvals(f"{self._job(job_id)}:warn")]
        return sorted(found, key=lambda w: (w.item_index, w.code))[:limit]

    def count_work(self, job_id: str, stage: str, items: int) -> None:
        """Add ``items`` to the work the job's ``stage`` did, repeats included
        (what a restart costs: compare with the items the job holds)."""
        if items:
            self.kv.incr(f"{self._job(job_id)}:work:{stage}", JOB_TTL_SECONDS, items)

    def work(self, job_id: str) -> dict[str, int]:
        """Items each stage processed for the job, every attempt counted."""
        return {
            stage: self.kv.incr(f"{self._job(job_id)}:work:{stage}", JOB_TTL_SECONDS, 0)
            for stage in WORK_STAGES
        }

    def set_error(self, job_id: str, error: str) -> None:
        with self.kv.transaction():
            self.kv.hset(self._job(job_id), {"error": error, "finished_at": repr(time.time())})
            self.kv.srem(self.OPEN_JOBS, [job_id])

    def indexed_items(self, job_id: str) -> set[int]:
        return {int(i) for i in self.kv.smembers(self._set(job_id, "indexed"))}

    def progress(self, job_id: str) -> ProgressCounts:
        head = self.kv.hgetall(self._job(job_id))
        sizes = {s: self.kv.scard(self._set(job_id, s)) for s in STAGE_SETS}
        passages = sum(int(v) for v in self.kv.hvals(f"{self._job(job_id)}:passages"))
        return ProgressCounts(
            received=int(head.get("received") or 0),
            passages_indexed=passages,
            **sizes,
        )

    def failures(self, job_id: str, offset: int = 0, limit: int = 100) -> list[FailureRecord]:
        if limit <= 0:
            return []
        members = self.kv.zrange(f"{self._job(job_id)}:failz", offset, offset + limit - 1)
        texts = self.kv.hmget(f"{self._job(job_id)}:fail", members)
        return [FailureRecord.from_json(t) for t in texts if t]

    def snapshot(
        self, job_id: str, *, failures_offset: int = 0, failures_limit: int = 100
    ) -> JobSnapshot | None:
        head = self.kv.hgetall(self._job(job_id))
        if not head:
            return None
        progress = self.progress(job_id)
        error = head.get("error", "")
        finished_at = head.get("finished_at")
        if error:
            state = "FAILED"
        elif head.get("sealed") and progress.finished >= progress.received:
            state = "DONE"
            if not finished_at:
                now = repr(time.time())
                if self.kv.hsetnx(self._job(job_id), "finished_at", now):
                    self.kv.expire(self._keys(job_id), JOB_TTL_SECONDS)
                self.kv.srem(self.OPEN_JOBS, [job_id])
                finished_at = self.kv.hget(self._job(job_id), "finished_at")
        elif head.get("started_at"):
            state = "RUNNING"
        else:
            state = "QUEUED"
        return JobSnapshot(
            job_id=job_id,
            tenant=head.get("tenant", ""),
            state=state,
            progress=progress,
            created_at=_ts(head.get("created_at")) or datetime.now(UTC),
            started_at=_ts(head.get("started_at")),
            finished_at=_ts(finished_at) if state in ("DONE", "FAILED") else None,
            error=error,
            failures=tuple(self.failures(job_id, failures_offset, failures_limit)),
            warnings=tuple(self.warnings(job_id, failures_limit)),
        )

    # registry of stored documents
    def registry_get(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, RegistryEntry]:
        texts = self.kv.hmget(self._registry(tenant), list(doc_ids))
        return {d: RegistryEntry.from_json(t) for d, t in zip(doc_ids, texts, strict=True) if t}

    def registry_put(self, tenant: str, entries: Mapping[str, RegistryEntry]) -> None:
        self.kv.hset(self._registry(tenant), {d: e.to_json() for d, e in entries.items()})

    def registry_delete(self, tenant: str, doc_ids: Sequence[str]) -> int:
        with self.kv.transaction():
            self.kv.hdel(self._sources(tenant), list(doc_ids))
            self.kv.hdel(self._pending(tenant), list(doc_ids))
            return self.kv.hdel(self._registry(tenant), list(doc_ids))

    def registry_ids(self, tenant: str) -> list[str]:
        return self.kv.hkeys(self._registry(tenant))

    # the index stage's write order (see the module docstring)
    def registry_begin(self, job_id: str, tenant: str, doc_ids: Sequence[str]) -> None:
        """Step 1: note ``doc_ids`` as being written to the stores for ``job_id``."""
        self.kv.hset(self._pending(tenant), {d: job_id for d in doc_ids})

    def registry_commit(
        self,
        job_id: str,
        tenant: str,
        entries: Mapping[str, RegistryEntry],
        sources: Mapping[str, str],
        items: Mapping[int, tuple[str, int]],
        *,
        doc_ids: Mapping[int, str] | None = None,
    ) -> None:
        """Step 3, in one transaction: the registry entries (and sources), the
        progress of the job's ``items`` (index -> (created|updated, passages)),
        and the pending notes gone.

        With ``doc_ids`` (item index -> document id), what each item did is
        decided here, against the registry as it is inside the transaction,
        rather than taken from ``items``: a document that another job committed
        in the same version since this one planned it is *unchanged* for this
        job, so that the jobs over one document count its creation once."""
        with self.kv.transaction():
            # An item this job has stored already (its batch delivered again
            # after a worker died) keeps the outcome it had. Read again now, its
            # document is the registry's version and would count as unchanged
            # besides indexed: finished twice, the job would end before its
            # last batches were stored.
            stored_before = self.kv.smismember(
                self._set(job_id, "indexed"), [str(i) for i in items]
            )
            items = {
                i: v
                for (i, v), again in zip(items.items(), stored_before, strict=True)
                if not again
            }
            kinds = {i: k for i, (k, _) in items.items()}
            if doc_ids is not None:
                ids = [doc_ids[i] for i in items]
                known = self.registry_get(tenant, ids)
                for i in items:
                    before = known.get(doc_ids[i])
                    if before is None:
                        kinds[i] = "created"
                    elif before.content_hash == entries[doc_ids[i]].content_hash:
                        kinds[i] = "unchanged"
                    else:
                        kinds[i] = "updated"
            self.registry_put(tenant, entries)
            if self.keep_sources and sources:
                self.kv.hset(self._sources(tenant), sources)
            stored = [i for i in items if kinds[i] != "unchanged"]
            self.add_passages(job_id, {i: items[i][1] for i in stored})
            for kind in ("created", "updated"):
                self.mark(job_id, kind, [i for i in stored if kinds[i] == kind])
            self.mark(job_id, "indexed", stored)
            self.mark(job_id, "unchanged", [i for i in items if kinds[i] == "unchanged"])
            self.kv.hdel(self._pending(tenant), list(entries))

    def pending(self, tenant: str) -> dict[str, str]:
        """Documents being written to the stores: doc id -> job id."""
        return self.kv.hgetall(self._pending(tenant))

    def settle_pending(self, tenant: str, doc_ids: Sequence[str]) -> None:
        self.kv.hdel(self._pending(tenant), list(doc_ids))

    def sources(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, str]:
        """Stored sources (``{"article": ..., "hash": ...}`` JSON) by doc id."""
        texts = self.kv.hmget(self._sources(tenant), list(doc_ids))
        return {d: t for d, t in zip(doc_ids, texts, strict=True) if t}

    def source_ids(self, tenant: str) -> list[str]:
        """Ids of the documents whose source is stored (their ids only, not the text)."""
        return self.kv.hkeys(self._sources(tenant))

    def registry_all(self, tenant: str) -> dict[str, RegistryEntry]:
        return {
            d: RegistryEntry.from_json(t)
            for d, t in self.kv.hgetall(self._registry(tenant)).items()
        }

    # pipeline tasks in flight (for the Celery pipeline's watchdog)
    def track(self, job_id: str, task_id: str, stage: str, items: Sequence[int]) -> None:
        """Note that ``task_id`` (a ``stage`` task for ``items``) is about to be sent."""
        record = {"stage": stage, "items": [int(i) for i in items], "sent_at": time.time()}
        self.kv.hset(f"{self._job(job_id)}:tasks", {task_id: json.dumps(record)})

    def untrack(self, job_id: str, task_ids: Sequence[str]) -> int:
        """Forget tasks that finished (or were given up); returns how many were noted."""
        return self.kv.hdel(f"{self._job(job_id)}:tasks", list(task_ids))

    def tracked(self, job_id: str) -> dict[str, TrackedTask]:
        """The job's tasks sent and not yet finished, by task id."""
        out: dict[str, TrackedTask] = {}
        for task_id, text in self.kv.hgetall(f"{self._job(job_id)}:tasks").items():
            data = json.loads(text)
            out[task_id] = TrackedTask(
                str(data["stage"]), tuple(int(i) for i in data["items"]), float(data["sent_at"])
            )
        return out

    # deliveries of a task (for the redelivery cap)
    def delivery(self, task_id: str, ttl_seconds: int) -> int:
        return self.kv.incr(f"{PREFIX}delivery:{task_id}", ttl_seconds)
