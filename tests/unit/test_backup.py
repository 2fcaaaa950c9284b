"""`attest backup` / `attest restore` on a small data directory built with the real
embedded engines (tantivy, Qdrant's edge engine, the SQLite registry), and the
write barrier that makes a copy beside a writer consistent."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from attest.cli import main
from attest.core.process_lock import DataDirLock, LockHeld
from attest.core.write_barrier import WriteBarrier, WritesNotPaused
from attest.ingest.backup import BackupError, backup, restore, verify
from attest.ingest.state import JobStore, RegistryEntry, SqliteKeyValue
from attest.lexical.backends.tantivy import TantivyBackend
from attest.lexical.models import DocumentIn, PassageIn
from attest.lexical.settings import LexicalSettings
from attest.semantic.store import ARTICLE_INDEX, EdgeVectorStore, Point

DIM = 4


def _vector(i: int) -> np.ndarray:
    v = np.zeros(DIM, dtype=np.float32)
    v[i % DIM] = 1.0
    v[(i + 1) % DIM] = 0.5
    return v


async def make_data_dir(root: Path, docs: dict[str, int], *, registry_extra: int = 0) -> None:
    """Documents ``id -> passages`` of tenant ``default`` in BM25, the vectors and the
    registry (plus ``registry_extra`` documents the stores lack)."""
    lexical = TantivyBackend(LexicalSettings(data_dir=root, backend="tantivy"))
    await lexical.warm_up()
    await lexical.index(
        "default",
        [
            DocumentIn(
                id=d,
                title=f"title {d}",
                body=f"body of {d}",
                passages=tuple(PassageIn(i, f"passage {i} of {d}") for i in range(n)),
            )
            for d, n in docs.items()
        ],
        refresh=True,
    )
    await lexical.close()
    vectors = EdgeVectorStore(root / "vectors", collection_prefix="attest", dimension=DIM)
    await vectors.warm_up()
    for k, (d, n) in enumerate(docs.items()):
        await vectors.upsert("articles", "default", [Point(d, ARTICLE_INDEX, _vector(k))])
        await vectors.upsert("passages", "default", [Point(d, i, _vector(k + i)) for i in range(n)])
    await vectors.close()
    kv = SqliteKeyValue(root / "ingest" / "state.sqlite3")
    store = JobStore(kv)
    store.create_job("job-1", "default")
    entries = {d: RegistryEntry(content_hash=f"h-{d}", passages=n) for d, n in docs.items()}
    entries.update(
        {f"x{i}": RegistryEntry(content_hash="h", passages=1) for i in range(registry_extra)}
    )
    store.registry_put("default", entries)
    kv.close()


DOCS = {"a": 2, "b": 1, "c": 3}


@pytest.fixture
async def data_dir(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    await make_data_dir(root, DOCS)
    return root


def test_backup_counts_every_store_and_restores_file_for_file(
    data_dir: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "backup"
    report = backup(data_dir, dest)
    m = report.manifest
    assert m["consistent"], m["problems"]
    assert m["tenants"] == {"default": {"documents": 3, "passages": 6, "pending": 0}}
    stores = m["stores"]
    assert stores["lexical/attest-lexical-documents"]["by_tenant"] == {"default": 3}
    assert stores["lexical/attest-lexical-passages"]["by_tenant"] == {"default": 6}
    assert stores["vectors/attest-articles"]["by_tenant"] == {"default": 3}
    assert stores["vectors/attest-passages"]["by_tenant"] == {"default": 6}
    assert [j["job_id"] for j in m["open_jobs"]] == ["job-1"]
    assert set(m["versions"]) >= {"attest", "tantivy", "qdrant-edge", "sqlite"}
    # Lock files and SQLite's side files stay behind; the registry is one file.
    names = {Path(p).name for p in m["files"]}
    assert not names & {"attest.lock", "writes.lock", ".tantivy-writer.lock", ".tantivy-meta.lock"}
    assert "state.sqlite3" in names
    assert not any(n.endswith(("-wal", "-shm")) for n in names)
    for rel, f in m["files"].items():
        assert len(f["sha256"]) == 64
        assert (dest / rel).stat().st_size == f["size"]
    assert not list(tmp_path.glob(".backup.partial-*"))

    target = tmp_path / "restored"
    done = restore(dest, target)
    assert done.files == len(m["files"])
    again = backup(target, tmp_path / "again").manifest
    assert again["tenants"] == m["tenants"]
    assert again["stores"] == m["stores"]


def test_a_store_that_disagrees_with_the_registry_is_reported(tmp_path: Path) -> None:
    import asyncio

    root = tmp_path / "data"
    asyncio.run(make_data_dir(root, DOCS, registry_extra=1))
    m = backup(root, tmp_path / "backup").manifest
    assert not m["consistent"]
    assert (
        "tenant default: lexical/attest-lexical-documents holds 3, the registry 4" in m["problems"]
    )


def test_restore_checks_every_file_before_writing(data_dir: Path, tmp_path: Path) -> None:
    dest = tmp_path / "backup"
    m = backup(data_dir, dest).manifest
    rel = next(r for r in sorted(m["files"]) if r.endswith("meta.json"))
    path = dest / rel
    path.write_bytes(path.read_bytes().replace(b"segments", b"SEGMENTS"))
    (dest / "data" / "stray.txt").write_text("not from the backup")
    with pytest.raises(BackupError) as err:
        restore(dest, tmp_path / "restored")
    assert f"{rel}: its SHA-256 differs from the manifest's" in err.value.details
    assert "data/stray.txt: not in the manifest" in err.value.details
    assert not (tmp_path / "restored").exists()
    (dest / "manifest.json").write_text("{")
    with pytest.raises(BackupError, match="is damaged"):
        verify(dest)


def test_restore_refuses_a_used_target_unless_told_to_overwrite(
    data_dir: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "backup"
    backup(data_dir, dest)
    target = tmp_path / "target"
    target.mkdir()
    (target / "old.txt").write_text("old")
    with pytest.raises(BackupError, match=r"not empty.*--overwrite"):
        restore(dest, target)
    # Served by another process: refused, naming it, even with --overwrite.
    lock = DataDirLock(target)
    lock.acquire()
    try:
        with pytest.raises(LockHeld):
            restore(dest, target, overwrite=True)
    finally:
        lock.release()
    restore(dest, target, overwrite=True)
    assert not (target / "old.txt").exists()
    assert (target / "ingest" / "state.sqlite3").is_file()
    assert not list(tmp_path.glob(".target.*"))


def test_open_jobs_resume_or_are_closed_as_failed(data_dir: Path, tmp_path: Path) -> None:
    dest = tmp_path / "backup"
    backup(data_dir, dest)
    for choice, still_open in (("resume", ["job-1"]), ("cancel", [])):
        target = tmp_path / choice
        report = restore(dest, target, open_jobs=choice)  # type: ignore[arg-type]
        kv = SqliteKeyValue(target / "ingest" / "state.sqlite3")
        store = JobStore(kv)
        assert store.open_jobs() == still_open
        if choice == "cancel":
            assert report.cancelled_jobs == ["job-1"]
            snapshot = store.snapshot("job-1")
            assert snapshot is not None
            assert snapshot.state == "FAILED"
            assert "attest restore --open-jobs cancel" in snapshot.error
        kv.close()


def test_backup_refuses_what_it_cannot_do(data_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(BackupError, match="exists: name a new directory"):
        backup(data_dir, tmp_path)
    with pytest.raises(BackupError, match="inside the data directory"):
        backup(data_dir, data_dir / "backups" / "one")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BackupError, match="holds no Attest data"):
        backup(empty, tmp_path / "b")


def test_the_barrier_waits_for_writes_in_flight_and_holds_new_ones(tmp_path: Path) -> None:
    barrier = WriteBarrier(tmp_path)
    events: list[str] = []
    writing, release = threading.Event(), threading.Event()

    def writer() -> None:
        with barrier.writing():
            events.append("write began")
            writing.set()
            release.wait(10)
            events.append("write ended")

    first = threading.Thread(target=writer)
    first.start()
    writing.wait(10)
    # Two writers at once: shared.
    with barrier.writing():
        events.append("second write")
    with (
        pytest.raises(WritesNotPaused, match=r"did not pause within 0\.2 s"),
        barrier.paused(wait_seconds=0.2),
    ):
        pass
    threading.Timer(0.3, release.set).start()
    with barrier.paused(wait_seconds=10) as waited:
        assert waited >= 0.2
        events.append("paused")
        blocked = threading.Thread(target=lambda: _write(barrier, events))
        blocked.start()
        time.sleep(0.3)
        assert blocked.is_alive()  # waits for the pause to end
        events.append("resumed")
    blocked.join(10)
    first.join(10)
    assert events == [
        "write began",
        "second write",
        "write ended",
        "paused",
        "resumed",
        "late write",
    ]


def _write(barrier: WriteBarrier, events: list[str]) -> None:
    with barrier.writing():
        events.append("late write")


def test_the_commands_print_what_they_did(data_dir: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    dest = tmp_path / "backup"
    made = runner.invoke(main, ["backup", str(dest), "--data-dir", str(data_dir)])
    assert made.exit_code == 0, made.output
    assert f"backed up {data_dir.absolute()} to {dest.absolute()}" in made.output
    assert "tenant default: 3 documents, 6 passages" in made.output
    assert "1 jobs were running" in made.output
    assert json.loads((dest / "manifest.json").read_text())["consistent"] is True
    again = runner.invoke(main, ["backup", str(dest), "--data-dir", str(data_dir)])
    assert again.exit_code == 1
    assert "exists: name a new directory for the backup" in again.output
    target = tmp_path / "target"
    put = runner.invoke(main, ["restore", str(dest), "--data-dir", str(target)])
    assert put.exit_code == 0, put.output
    assert "jobs running at the backup resume when it is opened" in put.output
    assert f"attest doctor --data-dir {target.absolute()}" in put.output
    refused = runner.invoke(main, ["restore", str(dest), "--data-dir", str(target)])
    assert refused.exit_code == 1
    assert "is not empty" in refused.output
