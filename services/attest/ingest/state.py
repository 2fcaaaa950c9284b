"""Job state, the document registry and the organization gazetteer.

Production keeps them in Redis, next to the Celery queues; embedded mode
keeps them in memory, optionally saved to a JSON file between runs. Both sit
behind the same small key-value interface (``KeyValue``: the Redis commands
used here), so ``JobStore`` has one implementation.

Every progress count is the size of a set of item indexes, so a stage that
runs twice for the same item (a redelivered task) counts it once.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

PREFIX = "attest:ingest:"
JOB_TTL_SECONDS = 7 * 24 * 3600


class KeyValue(Protocol):
    """The subset of Redis the job store uses."""

    def hset(self, key: str, mapping: Mapping[str, str]) -> None: ...
    def hsetnx(self, key: str, name: str, value: str) -> bool: ...
    def hget(self, key: str, name: str) -> str | None: ...
    def hmget(self, key: str, names: Sequence[str]) -> list[str | None]: ...
    def hgetall(self, key: str) -> dict[str, str]: ...
    def hdel(self, key: str, names: Sequence[str]) -> int: ...
    def hvals(self, key: str) -> list[str]: ...
    def sadd(self, key: str, members: Sequence[str]) -> int: ...
    def srem(self, key: str, members: Sequence[str]) -> int: ...
    def smembers(self, key: str) -> set[str]: ...
    def scard(self, key: str) -> int: ...
    def zadd_nx(self, key: str, mapping: Mapping[str, float]) -> None: ...
    def zrem(self, key: str, members: Sequence[str]) -> None: ...
    def zrange(self, key: str, start: int, stop: int) -> list[str]: ...
    def incr(self, key: str, ttl_seconds: int) -> int: ...
    def expire(self, keys: Sequence[str], ttl_seconds: int) -> None: ...
    def delete(self, keys: Sequence[str]) -> None: ...


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

    def incr(self, key: str, ttl_seconds: int) -> int:
        pipe = self._r.pipeline()
        pipe.incr(key)
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

    def incr(self, key: str, ttl_seconds: int) -> int:
        with self._lock:
            self._c[key] = self._c.get(key, 0) + 1
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


# -- the job store ----------------------------------------------------------------

STAGE_SETS = ("enriched", "embedded", "indexed", "unchanged", "created", "updated", "failed")


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


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    """What the stores hold for one document: its version and what it produced."""

    content_hash: str
    passages: int
    organizations: tuple[str, ...] = ()
    entity_ids: tuple[str, ...] = ()
    published_at: str | None = None

    def to_json(self) -> str:
        return json.dumps(
            [
                self.content_hash,
                self.passages,
                list(self.organizations),
                list(self.entity_ids),
                self.published_at,
            ],
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str) -> RegistryEntry:
        h, p, o, e, d = json.loads(text)
        return cls(h, int(p), tuple(o), tuple(e), d)


def _ts(value: str | None) -> datetime | None:
    return datetime.fromtimestamp(float(value), tz=UTC) if value else None


class JobStore:
    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

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
            *(self._set(job_id, s) for s in STAGE_SETS),
        ]

    @staticmethod
    def _registry(tenant: str) -> str:
        return f"{PREFIX}registry:{tenant}"

    # job lifecycle
    def create_job(self, job_id: str, tenant: str) -> None:
        self.kv.hset(
            self._job(job_id),
            {"tenant": tenant, "created_at": repr(time.time()), "received": "0", "sealed": ""},
        )

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
        self.kv.hset(self._job(job_id), {"received": str(received), "sealed": "1"})

    def mark_started(self) -> None:
        """(kept for symmetry; started_at is set by ``mark``)."""

    def mark(self, job_id: str, stage: str, indexes: Iterable[int]) -> None:
        members = [str(i) for i in indexes]
        if not members:
            return
        self.kv.hsetnx(self._job(job_id), "started_at", repr(time.time()))
        if stage == "indexed":
            # An item that failed on an earlier delivery and then succeeded is indexed.
            self.kv.srem(self._set(job_id, "failed"), members)
            self.kv.hdel(f"{self._job(job_id)}:fail", members)
            self.kv.zrem(f"{self._job(job_id)}:failz", members)
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

    def set_error(self, job_id: str, error: str) -> None:
        self.kv.hset(self._job(job_id), {"error": error, "finished_at": repr(time.time())})

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
        )

    # registry of stored documents
    def registry_get(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, RegistryEntry]:
        texts = self.kv.hmget(self._registry(tenant), list(doc_ids))
        return {d: RegistryEntry.from_json(t) for d, t in zip(doc_ids, texts, strict=True) if t}

    def registry_put(self, tenant: str, entries: Mapping[str, RegistryEntry]) -> None:
        self.kv.hset(self._registry(tenant), {d: e.to_json() for d, e in entries.items()})

    def registry_delete(self, tenant: str, doc_ids: Sequence[str]) -> int:
        return self.kv.hdel(self._registry(tenant), list(doc_ids))

    def registry_all(self, tenant: str) -> dict[str, RegistryEntry]:
        return {
            d: RegistryEntry.from_json(t)
            for d, t in self.kv.hgetall(self._registry(tenant)).items()
        }

    # organization gazetteer
    def gazetteer(self, tenant: str) -> set[str]:
        return self.kv.smembers(f"{PREFIX}gazetteer:{tenant}")

    def gazetteer_add(self, tenant: str, names: Sequence[str]) -> None:
        self.kv.sadd(f"{PREFIX}gazetteer:{tenant}", list(names))

    # deliveries of a task (for the redelivery cap)
    def delivery(self, task_id: str, ttl_seconds: int) -> int:
        return self.kv.incr(f"{PREFIX}delivery:{task_id}", ttl_seconds)
