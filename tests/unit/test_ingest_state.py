"""Job state: counts are sets (a replayed stage counts once), DONE detection,
failure order and paging, the registry, and the embedded store on disk."""

from __future__ import annotations

from pathlib import Path

from attest.ingest.state import FailureRecord, JobStore, MemoryKeyValue, RegistryEntry


def _failure(i: int, code: str = "PROCESSING_ERROR") -> FailureRecord:
    return FailureRecord(i, f"d{i}", f"f:{i + 1}", "INDEX", code, "boom")


def test_replayed_stages_count_once_and_the_job_finishes():
    store = JobStore(MemoryKeyValue())
    store.create_job("j", "t")
    assert store.snapshot("j").state == "QUEUED"
    store.record_items("j", {0: "{}", 1: "{}", 2: "{}", 3: "{}"}, 4)
    store.mark("j", "unchanged", [3])
    store.seal("j", 4)
    assert store.snapshot("j").state == "RUNNING"
    for _ in range(2):  # a redelivered batch
        store.mark("j", "enriched", [0, 1, 2])
        store.mark("j", "embedded", [0, 1])
        store.add_passages("j", {0: 2, 1: 3})
        store.mark("j", "created", [0])
        store.mark("j", "updated", [1])
        store.mark("j", "indexed", [0, 1])
    store.fail("j", [_failure(2)])
    store.fail("j", [_failure(2)])
    snap = store.snapshot("j")
    assert snap.state == "DONE"
    p = snap.progress
    assert (p.received, p.enriched, p.embedded, p.indexed, p.failed, p.unchanged) == (
        4,
        3,
        2,
        2,
        1,
        1,
    )
    assert (p.created, p.updated, p.passages_indexed) == (1, 1, 5)
    assert snap.finished_at is not None
    assert [f.item_index for f in snap.failures] == [2]


def test_a_failure_after_success_is_ignored_and_success_clears_a_failure():
    store = JobStore(MemoryKeyValue())
    store.create_job("j", "t")
    store.mark("j", "indexed", [0])
    store.fail("j", [_failure(0)])
    assert store.progress("j").failed == 0
    store.fail("j", [_failure(1)])
    store.mark("j", "indexed", [1])
    assert store.progress("j").failed == 0
    assert store.failures("j") == []


def test_failures_keep_their_order_and_page():
    store = JobStore(MemoryKeyValue())
    store.create_job("j", "t")
    for i in (5, 1, 9, 3):
        store.fail("j", [_failure(i, "INVALID_JSON")])
    assert [f.item_index for f in store.failures("j")] == [5, 1, 9, 3]
    assert [f.item_index for f in store.failures("j", 1, 2)] == [1, 9]
    assert store.failures("j")[0] == _failure(5, "INVALID_JSON")


def test_registry_and_state_survive_on_disk(tmp_path: Path):
    path = tmp_path / "state.json"
    kv = MemoryKeyValue(path)
    store = JobStore(kv)
    entry = RegistryEntry("h1", 3, ("Acme Corp",), ("ghg_emissions",), "2024-01-01T00:00:00+00:00")
    store.registry_put("t", {"a": entry})
    store.gazetteer_add("t", ["Acme Corp"])
    kv.save()
    again = JobStore(MemoryKeyValue(path))
    assert again.registry_get("t", ["a", "b"]) == {"a": entry}
    assert again.registry_all("u") == {}
    assert again.gazetteer("t") == {"Acme Corp"}
    assert again.registry_delete("t", ["a", "b"]) == 1
