"""Backups of an embedded data directory, taken while `attest serve all` runs on it.

What a data directory holds and how each part is copied:

* ``ingest/state.sqlite3``, the registry, the stored sources and the jobs:
  SQLite's online backup API (a consistent copy beside the serving
  process's connection; its ``-wal`` file is folded in);
* ``lexical/<index>``, tantivy indexes (BM25, and the personal knowledge
  base's): ``meta.json`` first, then the files of the segments it lists.
  Committed segments never change; a merge that finishes during the copy
  deletes segments the copied ``meta.json`` names, and the index is then
  copied again (the documents are the same, the writes being paused);
* ``vectors/<collection>`` and ``knowledge/vectors/<collection>``, shards of
  Qdrant's embedded engine: every file, then the copy is opened, which
  replays its write-ahead log into its segments, and flushed;
* anything else (``cache/``) as it is; lock files are left out.

Consistency: the stores are copied under the data directory's write barrier
(``attest.core.write_barrier``), which every write spanning the registry and
the stores holds: the copy is the state between two ingest batches, in which
the registry and every store hold the same documents. When no process has
the directory, the backup also takes its process lock, so that none opens it
half-way. Afterwards each store in the copy is opened and counted, per
tenant, and the counts are compared with the registry.

The copy is made in a hidden folder beside ``DEST`` and renamed to ``DEST``
when complete, with ``manifest.json``: versions, counts, open jobs and the
size and SHA-256 of every file. ``restore`` checks every file against the
manifest before it writes anything, copies into a hidden folder beside the
target and renames it into place.

Jobs that were open at the backup (acknowledged, not finished) resume when
the restored directory is next opened (``--open-jobs resume``, the default:
nothing acknowledged is lost), or are closed as failed
(``--open-jobs cancel``: the restored directory is exactly the state at the
backup).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from attest.core.errors import FailedPrecondition, InvalidArgument
from attest.core.process_lock import DATA_DIR_LOCK, DataDirLock, LockHeld, ProcessLock
from attest.core.write_barrier import WRITES_LOCK, WriteBarrier

log = logging.getLogger(__name__)

FORMAT = 1
MANIFEST = "manifest.json"
DATA = "data"  # the data directory's copy, inside a backup
# Lock files: each process makes its own; a copied one means nothing.
_LOCKS = {DATA_DIR_LOCK, WRITES_LOCK, "personal.lock", ".tantivy-meta.lock", ".tantivy-writer.lock"}
_SQLITE_SIDE = ("-wal", "-shm", "-journal")
_CHUNK = 1 << 20
_TANTIVY_ATTEMPTS = 20

OpenJobs = Literal["resume", "cancel"]
Progress = Callable[[int], None]


class BackupError(FailedPrecondition):
    """A backup or restore that cannot go on; the message says what to do."""


@dataclasses.dataclass
class BackupReport:
    dest: Path
    manifest: dict[str, Any]
    waited_seconds: float
    paused_seconds: float


@dataclasses.dataclass
class RestoreReport:
    target: Path
    manifest: dict[str, Any]
    files: int
    bytes: int
    cancelled_jobs: list[str]


# -- helpers --------------------------------------------------------------------------


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0], "sqlite": sqlite3.sqlite_version}
    packages = (("attest", "attest"), ("tantivy", "tantivy"), ("qdrant-edge", "qdrant-edge-py"))
    for name, dist in packages:
        try:
            out[name] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[name] = "unknown"
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _copy_file(src: Path, dst: Path, progress: Progress) -> None:
    """Copies ``src``, keeping runs of zeros as holes: the vector engine's write-ahead
    log and storage files are preallocated (hundreds of MB for a small corpus) and
    mostly unwritten."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    zeros = bytes(_CHUNK)
    with src.open("rb") as fin, dst.open("wb") as fout:
        while chunk := fin.read(_CHUNK):
            if chunk == zeros[: len(chunk)]:
                fout.seek(len(chunk), os.SEEK_CUR)
            else:
                fout.write(chunk)
            progress(len(chunk))
        fout.truncate()  # the length of a file that ends in a hole
    shutil.copystat(src, dst)


def _is_tantivy(names: set[str]) -> bool:
    return "meta.json" in names and (".managed.json" in names or ".tantivy-meta.lock" in names)


def _is_edge_shard(names: set[str]) -> bool:
    return "edge_config.json" in names


def _skipped(name: str) -> bool:
    return name in _LOCKS or any(
        name.endswith(".sqlite3" + side) or name.endswith(".db" + side) for side in _SQLITE_SIDE
    )


def _size(root: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            with contextlib.suppress(OSError):
                total += (Path(dirpath) / name).stat().st_size
    return total


def _fsync_tree(root: Path) -> None:
    """Makes every file and directory entry under ``root`` durable before the rename
    that publishes it."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(Path(dirpath) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _check_data_dir(data_dir: Path) -> None:
    if not data_dir.is_dir():
        raise BackupError(f"{data_dir} is not a directory: name the data directory to back up")
    parts = ("ingest", "lexical", "vectors", "knowledge")
    if not any((data_dir / part).exists() for part in parts):
        raise BackupError(
            f"{data_dir} holds no Attest data (no ingest/, lexical/, vectors/ or knowledge/): "
            "name the directory `serve all --embedded --data-dir` or `ingest --data-dir` used"
        )


def _inside(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


# -- copying the stores ---------------------------------------------------------------


def _copy_sqlite(src: Path, dst: Path, progress: Progress) -> None:
    """SQLite's online backup: a consistent copy beside writers, with their WAL folded in."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    # A read-write connection: a read-only one cannot open a WAL database whose
    # shared-memory file it may not create.
    source = sqlite3.connect(src, timeout=60)
    target = sqlite3.connect(dst)
    try:
        source.backup(target)
        target.execute("PRAGMA journal_mode=DELETE")  # one self-contained file
    finally:
        target.close()
        source.close()
    progress(src.stat().st_size)


def _tantivy_files(directory: Path, meta: dict[str, Any]) -> list[str]:
    """The files of the segments ``meta`` lists (a segment's deletes: the one file of
    the opstamp it names)."""
    wanted: list[str] = []
    names = sorted(p.name for p in directory.iterdir())
    for segment in meta.get("segments", []):
        prefix = str(segment["segment_id"]).replace("-", "") + "."
        deletes = segment.get("deletes") or {}
        delete_file = f"{prefix}{deletes['opstamp']}.del" if deletes else None
        for name in names:
            if not name.startswith(prefix):
                continue
            if name.endswith(".del") and name != delete_file:
                continue
            wanted.append(name)
    return wanted


def _copy_tantivy(src: Path, dst: Path, progress: Progress) -> None:
    for _ in range(_TANTIVY_ATTEMPTS):
        raw = (src / "meta.json").read_bytes()
        meta = json.loads(raw)
        if dst.exists():
            shutil.rmtree(dst)
        dst.mkdir(parents=True)
        try:
            for name in _tantivy_files(src, meta):
                _copy_file(src / name, dst / name, progress)
        except FileNotFoundError:
            # A background merge replaced segments the meta names: read it again.
            time.sleep(0.05)
            continue
        (dst / "meta.json").write_bytes(raw)
        return
    raise BackupError(f"the tantivy index {src} kept changing while it was copied: try again")


def _copy_tree(src: Path, dst: Path, progress: Progress) -> None:
    """The data directory ``src`` into ``dst``, each store in its own way (module doc)."""
    for dirpath, dirnames, filenames in os.walk(src):
        here = Path(dirpath)
        out = dst / here.relative_to(src)
        names = set(filenames)
        if _is_tantivy(names):
            _copy_tantivy(here, out, progress)
            dirnames[:] = []
            continue
        out.mkdir(parents=True, exist_ok=True)
        dirnames.sort()
        for name in sorted(filenames):
            if _skipped(name):
                continue
            if name.endswith((".sqlite3", ".db")):
                _copy_sqlite(here / name, out / name, progress)
            else:
                _copy_file(here / name, out / name, progress)


# -- counting what a copy holds ---------------------------------------------------------


def _edge_counts(shard_dir: Path, tenants: list[str]) -> dict[str, Any]:
    import qdrant_edge as qe

    shard = qe.EdgeShard.load(str(shard_dir))
    try:
        out: dict[str, Any] = {"points": shard.info().points_count, "by_tenant": {}}
        for t in tenants:
            flt = qe.Filter(must=[qe.FieldCondition("tenant", match=qe.MatchValue(t))])
            n = shard.count(qe.CountRequest(exact=True, filter=flt))
            if n:
                out["by_tenant"][t] = n
        # The write-ahead log replayed into the segments: the copy opens as it is.
        shard.flush()
    finally:
        shard.close()
    return out


def _tantivy_counts(index_dir: Path, tenants: list[str]) -> dict[str, Any]:
    import tantivy

    index = tantivy.Index.open(str(index_dir))
    searcher = index.searcher()
    out: dict[str, Any] = {"documents": searcher.num_docs, "by_tenant": {}}
    for t in tenants:
        found = searcher.search(tantivy.Query.term_query(index.schema, "tenant", t), 1, count=True)
        n = int(found.count)  # type: ignore[attr-defined]  # the stubs leave out count
        if n:
            out["by_tenant"][t] = n
    return out


def _registry(state: Path) -> tuple[dict[str, dict[str, int]], list[dict[str, Any]]]:
    """Per tenant, the registry's documents and passages; and the open jobs."""
    from attest.ingest.state import JobStore, SqliteKeyValue

    kv = SqliteKeyValue(state)
    try:
        store = JobStore(kv)
        tenants: dict[str, dict[str, int]] = {}
        for t in store.tenants():
            entries = store.registry_all(t)
            tenants[t] = {
                "documents": len(entries),
                "passages": sum(e.passages for e in entries.values()),
                "pending": len(store.pending(t)),
            }
        jobs = []
        for job_id in store.open_jobs():
            tenant = store.tenant_of(job_id) or ""
            jobs.append(
                {
                    "job_id": job_id,
                    "tenant": tenant,
                    "sealed": store.is_sealed(job_id),
                    "unfinished": len(store.unfinished_items(job_id)),
                }
            )
        return tenants, jobs
    finally:
        kv.close()


def inventory(root: Path) -> dict[str, Any]:
    """What the data directory copy at ``root`` holds: registry counts and open jobs,
    each store's counts per tenant, and whether the registry and the stores agree."""
    state = root / "ingest" / "state.sqlite3"
    registry, jobs = _registry(state) if state.is_file() else ({}, [])
    tenants = sorted(registry)
    stores: dict[str, Any] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        names = set(filenames)
        rel = here.relative_to(root).as_posix()
        if _is_edge_shard(names):
            stores[rel] = {"kind": "qdrant-edge", **_edge_counts(here, tenants)}
            dirnames[:] = []
        elif "meta.json" in names and here.parent.name == "lexical":
            stores[rel] = {"kind": "tantivy", **_tantivy_counts(here, tenants)}
            dirnames[:] = []
        dirnames.sort()
    problems: list[str] = []
    for tenant, counts in registry.items():
        if counts["pending"]:
            problems.append(f"tenant {tenant}: {counts['pending']} writes pending in the registry")
        for rel, s in sorted(stores.items()):
            name = Path(rel).name
            if rel.startswith("knowledge/") or "knowledge" in name:
                continue  # the personal base's facts are not registry documents
            if not name.endswith(("-documents", "-articles", "-passages")):
                continue  # the KG change log (replicas over one server)
            want = counts["passages"] if name.endswith("-passages") else counts["documents"]
            got = s["by_tenant"].get(tenant, 0)
            if got != want:
                problems.append(f"tenant {tenant}: {rel} holds {got}, the registry {want}")
    return {"tenants": registry, "open_jobs": jobs, "stores": stores, "problems": problems}


def _manifest_files(root: Path, progress: Progress) -> dict[str, dict[str, Any]]:
    files: dict[str, dict[str, Any]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            size = path.stat().st_size
            files[path.relative_to(root).as_posix()] = {"size": size, "sha256": _sha256(path)}
            progress(size)
    return files


def _drop_locks(root: Path) -> None:
    """Lock files that opening the copy made."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            if name in _LOCKS:
                (Path(dirpath) / name).unlink()


# -- backup ---------------------------------------------------------------------------


@contextlib.contextmanager
def _held_if_free(lock: ProcessLock) -> Iterator[int | None]:
    """Take ``lock`` when no process has it (yields None), else yield the holder's id."""
    try:
        lock.acquire()
    except LockHeld as err:
        yield err.pid or 0
        return
    try:
        yield None
    finally:
        lock.release()


def backup(
    data_dir: Path,
    dest: Path,
    *,
    wait_seconds: float = 300.0,
    progress: Callable[[str, int], Progress] | None = None,
    paused: contextlib.AbstractContextManager[float] | None = None,
) -> BackupReport:
    """Copy ``data_dir`` to ``dest`` (which must not exist) as described in the module doc.

    ``progress(label, total_bytes)`` returns a callback that receives bytes done.
    ``paused``: the write barrier already held exclusive by the caller, who then
    decides how long writes stay paused (a test that asks the source at the
    moment of the backup); by default the backup pauses them itself, for the copy.
    """
    data_dir, dest = Path(data_dir).absolute(), Path(dest).absolute()
    _check_data_dir(data_dir)
    if dest.exists():
        raise BackupError(f"{dest} exists: name a new directory for the backup")
    if _inside(dest, data_dir):
        raise BackupError(f"{dest} is inside the data directory {data_dir}: put it elsewhere")
    bar = progress or (lambda _label, _total: lambda _n: None)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    try:
        copy = staging / DATA
        with contextlib.ExitStack() as held:
            holder = held.enter_context(_held_if_free(DataDirLock(data_dir)))
            if holder is None and (data_dir / "knowledge").is_dir():
                # `attest kb` on the personal base, without a server on the directory.
                held.enter_context(
                    _held_if_free(ProcessLock(data_dir / "knowledge" / "personal.lock"))
                )
            waited = held.enter_context(paused or WriteBarrier(data_dir).paused(wait_seconds))
            pause_began = time.monotonic()
            _copy_tree(data_dir, copy, bar("copying", _size(data_dir)))
            paused_seconds = time.monotonic() - pause_began
            if paused is not None:
                waited = 0.0
        found = inventory(copy)
        _drop_locks(copy)
        files = _manifest_files(copy, bar("checksums", _size(copy)))
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "created_at": datetime.now(UTC).isoformat(),
            "source": str(data_dir),
            "source_in_use_by": holder,
            "versions": _versions(),
            "paused_writes_seconds": round(paused_seconds, 3),
            "consistent": not found["problems"],
            **found,
            "files": {f"{DATA}/{k}": v for k, v in files.items()},
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        _fsync_tree(staging)
        staging.rename(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return BackupReport(dest, manifest, waited, paused_seconds)


# -- restore --------------------------------------------------------------------------


def read_manifest(src: Path) -> dict[str, Any]:
    path = src / MANIFEST
    if not path.is_file():
        raise BackupError(
            f"{src} is not a backup (no {MANIFEST}): name a folder `attest backup` made"
        )
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise BackupError(f"{path} is damaged ({exc}): restore from another backup") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BackupError(
            f"{path} has format {manifest.get('format') if isinstance(manifest, dict) else '?'}; "
            f"this release reads format {FORMAT}: restore it with the release that made it"
        )
    return manifest


def verify(src: Path, progress: Progress | None = None) -> dict[str, Any]:
    """Check every file of the backup at ``src`` against its manifest; raises
    ``BackupError`` listing what differs. Returns the manifest."""
    src = Path(src)
    manifest = read_manifest(src)
    files: dict[str, dict[str, Any]] = manifest.get("files", {})
    problems: list[str] = []
    tick = progress or (lambda _n: None)
    for rel, want in sorted(files.items()):
        path = src / rel
        if not path.is_file():
            problems.append(f"{rel}: missing")
            continue
        size = path.stat().st_size
        if size != want["size"]:
            problems.append(f"{rel}: {size} bytes, the manifest says {want['size']}")
            tick(size)
            continue
        if _sha256(path) != want["sha256"]:
            problems.append(f"{rel}: its SHA-256 differs from the manifest's")
        tick(size)
    listed = set(files)
    for dirpath, _, filenames in os.walk(src / DATA):
        for name in filenames:
            rel = (Path(dirpath) / name).relative_to(src).as_posix()
            if rel not in listed:
                problems.append(f"{rel}: not in the manifest")
    if problems:
        more = len(problems) - 10
        shown = "; ".join(problems[:10]) + (f"; and {more} more" if more > 0 else "")
        raise BackupError(f"the backup {src} does not match its manifest: {shown}")
    return manifest


def _cancel_open_jobs(state: Path, jobs: list[dict[str, Any]]) -> list[str]:
    from attest.ingest.state import JobStore, SqliteKeyValue

    kv = SqliteKeyValue(state)
    try:
        store = JobStore(kv)
        cancelled = []
        for job in jobs:
            if job["job_id"] in store.open_jobs():
                store.set_error(
                    job["job_id"],
                    f"cancelled by `attest restore --open-jobs cancel`: the backup was taken "
                    f"while the job ran; {job['unfinished']} of its items were not indexed",
                )
                cancelled.append(job["job_id"])
        return cancelled
    finally:
        kv.close()


def restore(
    src: Path,
    target: Path,
    *,
    overwrite: bool = False,
    open_jobs: OpenJobs = "resume",
    progress: Callable[[str, int], Progress] | None = None,
) -> RestoreReport:
    """Restore the backup at ``src`` into the data directory ``target``."""
    src, target = Path(src).absolute(), Path(target).absolute()
    if open_jobs not in ("resume", "cancel"):
        raise InvalidArgument(f"open_jobs is {open_jobs!r}: resume or cancel", field="open_jobs")
    if not src.is_dir():
        raise BackupError(f"{src} is not a directory: name a folder `attest backup` made")
    manifest = read_manifest(src)
    files: dict[str, dict[str, Any]] = manifest.get("files", {})
    total = sum(int(f["size"]) for f in files.values())
    bar = progress or (lambda _label, _total: lambda _n: None)
    if target.exists() and not target.is_dir():
        raise BackupError(f"{target} is a file: name a directory to restore into")
    nonempty = target.is_dir() and any(target.iterdir())
    if nonempty and not overwrite:
        raise BackupError(
            f"{target} is not empty: restore into a new or empty directory, or pass "
            "--overwrite to replace what it holds"
        )
    if _inside(target, src) or _inside(src, target):
        raise BackupError(f"{target} and the backup {src} overlap: restore elsewhere")
    # Everything checked before anything is written.
    verify(src, bar("verifying", total))
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.restoring-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    lock = DataDirLock(target) if target.is_dir() else None
    try:
        if lock is not None:
            lock.acquire()  # LockHeld names the process serving the target
        copied = bar("restoring", total)
        for rel in sorted(files):
            path = Path(rel)
            _copy_file(src / path, staging / path.relative_to(DATA), copied)
        staging.mkdir(exist_ok=True)
        cancelled: list[str] = []
        jobs = manifest.get("open_jobs", [])
        state = staging / "ingest" / "state.sqlite3"
        if open_jobs == "cancel" and jobs and state.is_file():
            cancelled = _cancel_open_jobs(state, jobs)
        _fsync_tree(staging)
        if target.exists():
            aside = target.parent / f".{target.name}.replaced-{os.getpid()}"
            target.rename(aside)
            staging.rename(target)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:
        if lock is not None:
            lock.release()
    return RestoreReport(target, manifest, len(files), total, cancelled)
