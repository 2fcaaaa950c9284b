"""Job state: counts are sets (a replayed stage counts once), a stage counts a batch
only once it is handed on, DONE detection, failure order and paging, the registry,
and the embedded store on disk."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from attest.ingest.documents import article_from_raw_json, content_hash
from attest.ingest.jobs import StageRunner
from attest.ingest.settings import EnrichSettings
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
    entry = RegistryEntry(
        "h1",
        3,
        {"organizations": ("Acme Corp",), "entity_ids": ("ghg_emissions",)},
        "2024-01-01T00:00:00+00:00",
    )
    store.registry_put("t", {"a": entry})
    kv.save()
    again = JobStore(MemoryKeyValue(path))
    assert again.registry_get("t", ["a", "b"]) == {"a": entry}
    assert again.registry_all("u") == {}
    assert again.registry_delete("t", ["a", "b"]) == 1


class _Embedding:
    """The model side of the pipeline, without a model."""

    def warm_up(self) -> None:
        pass

    def unknown_entities(self, record: dict) -> list[str]:
        return []

    def embed(self, records: list[dict]) -> list[dict]:
        return [{**r, "article_vector": "v"} for r in records]


def test_a_stage_counts_a_batch_only_once_it_is_handed_to_the_next_stage():
    """Progress never counts work that lives only in a worker's memory: a worker
    killed before the hand-off leaves the batch uncounted (its task runs again)."""
    store = JobStore(MemoryKeyValue())
    store.create_job("j", "default")
    article = article_from_raw_json(b'{"id": "a1", "title": "Water", "body": "Acme cut water."}')
    record = {"article": article.to_json(), "hash": content_hash(article), "origin": "f:1"}
    store.record_items("j", {0: json.dumps(record)}, 1)
    runner = StageRunner(store, EnrichSettings(), embedding=_Embedding)
    counted: list[tuple[str, int, int]] = []

    def handoff(stage: str) -> Callable[[list[dict]], None]:
        def send(batch: list[dict]) -> None:
            p = store.progress("j")
            counted.append((stage, len(batch), p.enriched if stage == "enrich" else p.embedded))

        return send

    enriched = runner.enrich("j", "default", [[0, "created"]], handoff=handoff("enrich"))
    runner.embed("j", enriched, handoff=handoff("embed"))
    assert counted == [("enrich", 1, 0), ("embed", 1, 0)]
    assert (store.progress("j").enriched, store.progress("j").embedded) == (1, 1)

    def dies(batch: list[dict]) -> None:
        raise ConnectionError("the worker died while sending the batch on")

    store.create_job("k", "default")
    store.record_items("k", {0: json.dumps(record)}, 1)
    with pytest.raises(ConnectionError):
        runner.enrich("k", "default", [[0, "created"]], handoff=dies)
    with pytest.raises(ConnectionError):
        runner.embed("k", enriched, handoff=dies)
    assert (store.progress("k").enriched, store.progress("k").embedded) == (0, 0)
