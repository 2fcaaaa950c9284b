"""The embedded job state on SQLite: what a call wrote survives a kill -9, a
transaction is all or nothing, any text round-trips, and the recovery rule resumes
acknowledged jobs and fails unacknowledged ones. No sockets, no models."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from attest.core.errors import InvalidArgument, Unavailable
from attest.ingest.documents import article_from_raw_json, content_hash
from attest.ingest.jobs import Batch, IngestCore, InlineDispatcher, Item, StageRunner
from attest.ingest.settings import EnrichSettings
from attest.ingest.state import (
    FailureRecord,
    JobStore,
    KeyValue,
    MemoryKeyValue,
    RegistryEntry,
    SqliteKeyValue,
    open_embedded_state,
)


@pytest.fixture(params=["sqlite", "memory"])
def kv(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "memory":
        yield MemoryKeyValue()
        return
    store = SqliteKeyValue(tmp_path / "state.sqlite3")
    yield store
    store.close()


def test_both_stores_answer_the_job_store_alike(kv: KeyValue):
    store = JobStore(kv)
    store.create_job("j", "t")
    store.record_items("j", {0: "{}", 1: "{}", 2: "{}"}, 3)
    store.seal("j", 3)
    for _ in range(2):  # a replayed stage counts once
        store.mark("j", "indexed", [0, 1])
    store.fail("j", [FailureRecord(2, "d2", "f:3", "EMBED", "PROCESSING_ERROR", "boom")])
    for i in (7, 5, 9):
        store.fail("j", [FailureRecord(i, f"d{i}", "", "RECEIVE", "INVALID_JSON", "x")])
    assert [f.item_index for f in store.failures("j", 1, 2)] == [7, 5]
    snap = store.snapshot("j")
    assert snap is not None
    assert snap.state == "DONE"
    assert (snap.progress.indexed, snap.progress.failed) == (2, 4)
    assert store.open_jobs() == []
    assert sorted(kv.hkeys(f"{store._job('j')}:items")) == ["0", "1", "2"]
    assert kv.incr("n", 60) == 1
    assert kv.incr("n", 60) == 2
    assert kv.zrange("missing", 0, -1) == []
    assert kv.hmget("missing", ["a"]) == [None]


def test_a_transaction_is_all_or_nothing(tmp_path: Path):
    kv = SqliteKeyValue(tmp_path / "s.sqlite3")

    def interrupted() -> None:
        with kv.transaction():
            kv.hset("h", {"a": "1"})
            kv.sadd("s", ["x"])
            raise RuntimeError("crash in the middle")

    with pytest.raises(RuntimeError):
        interrupted()
    assert kv.hgetall("h") == {}
    assert kv.smembers("s") == set()
    with kv.transaction():
        kv.hset("h", {"a": "1"})
        with kv.transaction():  # nested: one commit at the end
            kv.sadd("s", ["x"])
    assert kv.hgetall("h") == {"a": "1"}
    assert kv.smembers("s") == {"x"}
    kv.close()


def test_any_text_round_trips_even_a_lone_surrogate(tmp_path: Path):
    kv = SqliteKeyValue(tmp_path / "s.sqlite3")
    odd = "caf\u00e9 \ud800 \x00 \U0001f600"
    kv.hset("h", {"f": odd})
    kv.close()
    again = SqliteKeyValue(tmp_path / "s.sqlite3")
    assert again.hget("h", "f") == odd
    assert again.hmget("h", ["f", "g"]) == [odd, None]
    again.close()


WRITER = """
import os, signal, sys
from pathlib import Path
from attest.ingest.state import JobStore, RegistryEntry, SqliteKeyValue
store = JobStore(SqliteKeyValue(Path(sys.argv[1])))
for i in range(200):
    store.registry_put("t", {f"d{i}": RegistryEntry(f"h{i}", 1)})
    print(i, flush=True)
    if i == 150:
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_every_write_that_returned_survives_a_kill_9(tmp_path: Path):
    path = tmp_path / "state.sqlite3"
    run = subprocess.run(
        [sys.executable, "-c", WRITER, str(path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == -9
    acknowledged = len(run.stdout.split())
    assert acknowledged == 151
    kv = SqliteKeyValue(path)
    registry = JobStore(kv).registry_all("t")
    assert len(registry) == acknowledged
    assert registry["d150"] == RegistryEntry("h150", 1)
    assert kv._all("PRAGMA integrity_check") == [("ok",)]
    assert kv._all("PRAGMA journal_mode") == [("wal",)]
    kv.close()


def test_the_json_state_of_earlier_releases_is_imported_once(tmp_path: Path):
    legacy = tmp_path / "state.json"
    old = MemoryKeyValue(legacy)
    JobStore(old).registry_put("t", {"a": RegistryEntry("h", 2)})
    old.save()
    kv = open_embedded_state(tmp_path)
    assert JobStore(kv).registry_all("t") == {"a": RegistryEntry("h", 2)}
    assert not legacy.exists()
    assert (tmp_path / "state.json.imported").is_file()
    kv.close()
    # A save cut short by a crash (0 bytes) is set aside, not fatal.
    legacy.write_text("", encoding="utf-8")
    kv = open_embedded_state(tmp_path)
    assert (tmp_path / "state.json.unreadable").is_file()
    assert JobStore(kv).registry_all("t") == {"a": RegistryEntry("h", 2)}
    kv.close()


class _Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, list[Batch]]] = []

    def dispatch(self, job_id: str, tenant: str, batches: Sequence[Batch]) -> None:
        self.sent.append((job_id, tenant, list(batches)))


def _item(doc_id: str, body: str) -> Item:
    raw = json.dumps({"id": doc_id, "body": body}).encode()
    return Item(f"f:{doc_id}", article_from_raw_json(raw))


def _never() -> object:
    raise AssertionError("no sinks needed")


def test_recovery_resumes_acknowledged_jobs_and_fails_the_others(tmp_path: Path):
    kv = SqliteKeyValue(tmp_path / "state.sqlite3")
    store = JobStore(kv, keep_sources=True)
    first = _Recorder()
    core = IngestCore(store, first, _never, batch_size=2)  # type: ignore[arg-type]
    items = [_item(f"d{i}", f"Body number {i}.") for i in range(5)]
    store.registry_put("t", {"d4": RegistryEntry("old", 1)})
    sealed = core.ingest("t", items).job_id
    ((_, _, batches),) = first.sent
    assert [[i for i, _ in b] for b in batches] == [[0, 1], [2, 3], [4]]
    # Items 0 and 1 were committed before the crash; item 2 was being written.
    a0 = items[0].article
    assert a0 is not None
    store.registry_begin(sealed, "t", ["d0", "d1", "d2"])
    store.registry_commit(
        sealed,
        "t",
        {"d0": RegistryEntry(content_hash(a0), 1), "d1": RegistryEntry("h1", 1)},
        {"d0": json.dumps({"article": a0.to_json(), "hash": content_hash(a0)})},
        {0: ("created", 1), 1: ("created", 1)},
    )
    unsealed = core.start_job("t")
    core.add(unsealed, [_item("d9", "Never acknowledged.")])
    kv.close()

    # A new process on the same state.
    kv = SqliteKeyValue(tmp_path / "state.sqlite3")
    store = JobStore(kv, keep_sources=True)
    assert store.pending("t") == {"d2": sealed}
    assert json.loads(store.sources("t", ["d0", "d1"])["d0"])["article"]["id"] == "d0"
    again = _Recorder()
    core = IngestCore(store, again, _never, batch_size=2)  # type: ignore[arg-type]
    assert core.recover() == [sealed]
    ((job_id, tenant, batches),) = again.sent
    assert (job_id, tenant) == (sealed, "t")
    assert batches == [[[2, "created"], [3, "created"]], [[4, "updated"]]]
    failed = store.snapshot(unsealed)
    assert failed is not None
    assert failed.state == "FAILED"
    assert "not acknowledged" in failed.error
    assert store.open_jobs() == [sealed]
    running = store.snapshot(sealed)
    assert running is not None
    assert (running.state, running.progress.indexed, running.progress.created) == ("RUNNING", 2, 2)
    kv.close()


class _Embedding:
    """The model side of the pipeline, without a model."""

    def warm_up(self) -> None:
        pass

    def unknown_entities(self, record: dict) -> list[str]:
        return []

    def embed(self, records: list[dict]) -> list[dict]:
        return [{**r, "entity_ids": []} for r in records]


class _Sinks:
    """Stores that are unavailable for the first ``outages`` calls and refuse
    any document whose id starts with ``bad``."""

    def __init__(self, outages: int = 0) -> None:
        self.outages = outages
        self.calls = 0
        self.stored: dict[str, str] = {}

    async def index(self, tenant: str, records: Sequence[dict]) -> None:
        self.calls += 1
        if self.outages:
            self.outages -= 1
            raise Unavailable("lexical: connection refused")
        if any(r["article"]["id"].startswith("bad") for r in records):
            raise InvalidArgument("rejected by the store", field="documents[0].entity_ids")
        self.stored.update({r["article"]["id"]: r["hash"] for r in records})

    async def delete(self, tenant: str, doc_ids: Sequence[str]) -> None:
        for d in doc_ids:
            self.stored.pop(d, None)

    async def close(self) -> None:
        pass


async def _run_inline(sinks: _Sinks, ids: list[str]) -> tuple[JobStore, str]:
    store = JobStore(MemoryKeyValue(), keep_sources=True)
    runner = StageRunner(store, EnrichSettings(), embedding=_Embedding, sinks=lambda: sinks)
    inline = InlineDispatcher(runner)
    core = IngestCore(store, inline, lambda: sinks, batch_size=len(ids))
    job_id = core.ingest("t", [_item(d, f"Text of {d}.") for d in ids]).job_id
    await inline.drain()
    await inline.close()
    return store, job_id


async def test_a_store_refusing_one_document_fails_that_document_alone():
    sinks = _Sinks()
    ids = [f"d{i}" for i in range(7)]
    ids.insert(5, "bad-1")
    store, job_id = await _run_inline(sinks, ids)
    snap = store.snapshot(job_id)
    assert snap is not None
    assert (snap.state, snap.progress.indexed, snap.progress.failed) == ("DONE", 7, 1)
    (failure,) = snap.failures
    assert (failure.doc_id, failure.stage, failure.code) == ("bad-1", "INDEX", "INVALID_FIELD")
    assert failure.reason == "documents[0].entity_ids: rejected by the store"
    assert sorted(sinks.stored) == sorted(d for d in ids if d != "bad-1")
    assert sorted(store.registry_all("t")) == sorted(sinks.stored)
    assert store.pending("t") == {"bad-1": job_id}  # settled by `attest doctor --repair`
    # 1 whole batch, then halves: [4 | 4], [2 | 2] of the half with bad-1, [1 | 1].
    assert sinks.calls == 7


async def test_inline_indexing_waits_out_a_store_that_is_still_starting():
    sinks = _Sinks(outages=2)
    store, job_id = await _run_inline(sinks, ["d0", "d1"])
    snap = store.snapshot(job_id)
    assert snap is not None
    assert (snap.state, snap.progress.indexed, snap.progress.failed) == ("DONE", 2, 0)
    assert sinks.calls == 3
    assert store.pending("t") == {}
