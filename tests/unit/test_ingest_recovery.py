"""Recovery that converges: a job stopped mid-way (as by kill -9) resumes with
only the work that is missing, open jobs over the same documents are merged,
and the job reports count each document once. No sockets, no models."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

from attest.ingest.documents import article_from_raw_json, content_hash
from attest.ingest.jobs import Batch, IngestCore, InlineDispatcher, Item, StageRunner
from attest.ingest.settings import EnrichSettings
from attest.ingest.state import (
    FailureRecord,
    JobStore,
    MemoryKeyValue,
    RegistryEntry,
    SqliteKeyValue,
)


def _item(doc_id: str, body: str) -> Item:
    raw = json.dumps({"id": doc_id, "body": body}).encode()
    return Item(f"f:{doc_id}", article_from_raw_json(raw))


ITEMS = [_item(f"d{i}", f"Text of document {i}.") for i in range(10)]


class _Embedding:
    def warm_up(self) -> None:
        pass

    def unknown_entities(self, record: dict) -> list[str]:
        return []

    def embed(self, records: list[dict]) -> list[dict]:
        return [{**r, "entity_ids": []} for r in records]


class _Sinks:
    """Stores that write every batch, except that the ``hang_at``-th call never
    returns: the process is stopped there, as a kill -9 would stop it."""

    def __init__(self, written: list[str], hang_at: int | None = None) -> None:
        self.written = written  # every document id sent to the stores, in order
        self.hang_at = hang_at
        self.calls = 0
        self.hanging = asyncio.Event()

    async def index(self, tenant: str, records: Sequence[dict]) -> None:
        self.calls += 1
        self.written.extend(r["article"]["id"] for r in records)
        if self.calls == self.hang_at:
            self.hanging.set()
            await asyncio.Event().wait()

    async def delete(self, tenant: str, doc_ids: Sequence[str]) -> None:
        pass

    async def close(self) -> None:
        pass


async def _process(path: Path, written: list[str], hang_at: int | None) -> tuple[list[str], str]:
    """One life of an embedded ingest over ``ITEMS``: resume what is open, start
    a job over the same items, and run until the stores hang (then stop dead)
    or every batch is through. Returns the resumed jobs and the new job."""
    kv = SqliteKeyValue(path)
    store = JobStore(kv, keep_sources=True)
    sinks = _Sinks(written, hang_at)
    settings = EnrichSettings(keyphrases=0, summary_sentences=0)
    runner = StageRunner(store, settings, embedding=_Embedding, sinks=lambda: sinks)
    inline = InlineDispatcher(runner)
    core = IngestCore(store, inline, lambda: sinks, batch_size=2)  # type: ignore[arg-type]
    resumed = core.recover()
    job_id = core.ingest("t", ITEMS).job_id
    if hang_at is None:
        await inline.drain()
    else:
        await sinks.hanging.wait()
    await inline.close()
    kv.close()
    return resumed, job_id


async def test_a_job_stopped_twice_resumes_only_the_missing_work(tmp_path: Path):
    path = tmp_path / "state.sqlite3"
    written: list[str] = []
    # Batches of 2: d0-d3 are committed, the stores hang on d4 and d5.
    _, first = await _process(path, written, hang_at=3)
    # The next life resumes the first job, whose items the new job supersedes;
    # the new job commits d4-d5 and hangs on d6-d7.
    resumed, second = await _process(path, written, hang_at=2)
    assert resumed == [first]
    resumed, third = await _process(path, written, hang_at=None)
    assert resumed == [second]

    # Every document was written once, and once more only where a stop cut
    # its write short (d4-d5, then d6-d7).
    assert written == [
        "d0",
        "d1",
        "d2",
        "d3",
        "d4",
        "d5",
        "d4",
        "d5",
        "d6",
        "d7",
        "d6",
        "d7",
        "d8",
        "d9",
    ]

    kv = SqliteKeyValue(path)
    store = JobStore(kv)
    snaps = {j: store.snapshot(j) for j in (first, second, third)}
    progress = {j: s.progress for j, s in snaps.items() if s is not None}
    assert {j: s.state for j, s in snaps.items() if s is not None} == dict.fromkeys(
        (first, second, third), "DONE"
    )
    assert store.open_jobs() == []
    # Each document counted as created by exactly one job; the rest unchanged.
    assert [(p.created, p.updated, p.unchanged, p.superseded) for p in progress.values()] == [
        (4, 0, 6, 6),
        (2, 0, 8, 4),
        (4, 0, 6, 0),
    ]
    assert sum(p.created for p in progress.values()) == len(store.registry_ids("t")) == 10
    # The work each stage did, restarts included: 10 documents + 2 cut short twice.
    work = [store.work(j) for j in (first, second, third)]
    assert work == [
        {"enrich": 6, "embed": 6, "index": 6},
        {"enrich": 4, "embed": 4, "index": 4},
        {"enrich": 4, "embed": 4, "index": 4},
    ]
    assert store.pending("t") == {}
    kv.close()


class _Recorder:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, list[Batch]]] = []

    def dispatch(self, job_id: str, tenant: str, batches: Sequence[Batch]) -> None:
        self.sent.append((job_id, tenant, list(batches)))


def _never() -> object:
    raise AssertionError("no sinks needed")


def test_recovery_merges_open_jobs_the_newest_version_wins():
    store = JobStore(MemoryKeyValue())
    core = IngestCore(store, _Recorder(), _never, batch_size=10)  # type: ignore[arg-type]
    old = core.ingest("t", [_item("x", "Old text."), _item("y", "Same text."), _item("z", "Z.")])
    new = core.ingest("t", [_item("x", "New text."), _item("y", "Same text.")])
    # The first job's z was stored meanwhile, in the same version.
    z = _item("z", "Z.").article
    assert z is not None
    store.registry_put("t", {"z": RegistryEntry(content_hash(z), 1)})
    store.kv.hset(store._job(old.job_id), {"created_at": "1.0"})
    store.kv.hset(store._job(new.job_id), {"created_at": "2.0"})

    again = _Recorder()
    core = IngestCore(store, again, _never, batch_size=10)  # type: ignore[arg-type]
    assert core.recover() == [new.job_id]
    # Only the newer job's items are sent: x in its new version, and y once.
    assert again.sent == [(new.job_id, "t", [[[0, "created"], [1, "created"]]])]
    snap = store.snapshot(old.job_id)
    assert snap is not None
    p = snap.progress
    assert (snap.state, p.unchanged, p.superseded) == ("DONE", 3, 2)


def test_a_document_committed_by_two_jobs_is_created_once():
    store = JobStore(MemoryKeyValue())
    entry = {"d": RegistryEntry("h1", 1)}
    for job in ("a", "b"):
        store.create_job(job, "t")
        store.record_items(job, {0: "{}"}, 1)
        store.seal(job, 1)
        # Both planned d as a creation before either committed it.
        store.registry_begin(job, "t", ["d"])
        store.registry_commit(job, "t", entry, {}, {0: ("created", 1)}, doc_ids={0: "d"})
    a, b = store.progress("a"), store.progress("b")
    assert (a.created, a.indexed, a.unchanged) == (1, 1, 0)
    assert (b.created, b.indexed, b.unchanged) == (0, 0, 1)
    store.create_job("c", "t")
    store.registry_commit(
        "c", "t", {"d": RegistryEntry("h2", 1)}, {}, {0: ("created", 1)}, doc_ids={0: "d"}
    )
    assert store.progress("c").updated == 1


def test_a_batch_committed_again_by_its_own_job_counts_each_item_once():
    """A worker killed after its batch was stored: the batch comes back and is
    committed again. Its items stay indexed (not indexed and unchanged), so the
    job is not finished before its other batches are stored."""
    store = JobStore(MemoryKeyValue())
    store.create_job("j", "t")
    store.record_items("j", {0: "{}", 1: "{}", 2: "{}"}, 3)
    store.seal("j", 3)
    entries = {"d0": RegistryEntry("h0", 1), "d1": RegistryEntry("h1", 1)}
    batch = {0: ("created", 1), 1: ("created", 1)}
    for _delivery in range(2):
        store.registry_begin("j", "t", list(entries))
        store.registry_commit("j", "t", entries, {}, batch, doc_ids={0: "d0", 1: "d1"})
    p = store.progress("j")
    assert (p.indexed, p.created, p.unchanged, p.finished) == (2, 2, 0, 2)
    assert store.snapshot("j").state == "RUNNING"
    # An item failed on one delivery and found unchanged on another counts once too.
    store.fail("j", [FailureRecord(2, "d2", "a.jsonl", "INDEX", "STORE_UNAVAILABLE", "down")])
    store.mark("j", "unchanged", [2])
    p = store.progress("j")
    assert (p.failed, p.unchanged, p.finished) == (0, 1, 3)
    assert store.failures("j") == []
    assert store.snapshot("j").state == "DONE"
