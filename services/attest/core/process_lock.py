"""One process at a time on something on disk: an exclusive ``flock``.

The lock file holds the id of the process that has it and is never deleted
(a deleted lock file could be locked twice); the lock goes away with that
process, killed or not. A second process is refused at once with
``LockHeld``, which names the holder, and ``holder`` lets a command check
before it loads anything.

``data_dir_lock`` is the lock of an embedded data directory: the commands that
open its stores in their own process (`attest serve all` on embedded stores, `demo`,
`ingest` and `doctor` without an address, `eval qa --pooled`) take it, so that
a second one says which process has the directory instead of failing halfway
through opening the stores (tantivy's lock error, or a server that waits for
stores it will never get).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from attest.core.errors import FailedPrecondition

DATA_DIR_LOCK = "attest.lock"


class LockHeld(FailedPrecondition):
    """Another process holds the lock."""

    def __init__(self, path: Path, pid: int | None, message: str | None = None) -> None:
        """``message`` names the holder where it says ``{who}`` (replaced, not
        formatted: a path in it may hold braces)."""
        who = f"process {pid}" if pid else "another process"
        super().__init__(message.replace("{who}", who) if message else f"{path} is held by {who}")
        self.path = path
        self.pid = pid


class ProcessLock:
    """An exclusive lock on ``path`` for this process (see the module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def refusal(self, pid: int | None) -> LockHeld:
        """The error a second process gets."""
        return LockHeld(self.path, pid)

    def acquire(self) -> None:
        """Take the lock (again: a no-op); ``refusal`` when another process has it."""
        if self._file is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = self.path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _pid_in(f)
            f.close()
            raise self.refusal(pid) from None
        except BaseException:
            f.close()
            raise
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._file = f

    def release(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(f, fcntl.LOCK_UN)
            f.close()

    def holder(self) -> int | None:
        """The id of the process holding the lock (0 when it cannot tell), None when free.

        A probe: it takes the lock and lets go at once, so it is only a hint;
        ``acquire`` decides.
        """
        if self._file is not None:
            return os.getpid()
        try:
            self.acquire()
        except LockHeld as err:
            return err.pid or 0
        self.release()
        return None


def _pid_in(f: IO[str]) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        f.seek(0)
        return int(f.read().strip())
    return None


class DataDirLock(ProcessLock):
    """The lock of an embedded data directory (``<data_dir>/attest.lock``)."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir / DATA_DIR_LOCK)
        self.data_dir = data_dir

    def refusal(self, pid: int | None) -> LockHeld:
        return LockHeld(
            self.path,
            pid,
            f"the data directory {self.data_dir} is in use by {{who}} (an `attest serve all "
            "--embedded`, `demo`, `ingest` or `doctor` on it): stop it, or go through its "
            "services with --address",
        )


@contextlib.contextmanager
def data_dir_lock(data_dir: Path) -> Iterator[DataDirLock]:
    """Hold the data directory's lock for the block; ``LockHeld`` at once when
    another process has it."""
    lock = DataDirLock(data_dir)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()
