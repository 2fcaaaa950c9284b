"""One process at a time on an embedded personal knowledge base.

The personal base's embedded stores (a tantivy index under
``<data_dir>/lexical`` and Qdrant's edge engine under
``<data_dir>/knowledge/vectors``) each take one writer process. A second
process on the same data directory (``attest kb`` next to a running knowledge
server) used to find that out halfway through opening them, after loading the
embedding model, with tantivy's lock error. ``StoreLock`` is one lock for the
whole base, taken before either store opens and held until the store closes:
the second process is refused at once with ``StoreInUse``, which names the
process holding it, and ``holder`` lets a command check before it loads
anything. The lock is ``flock`` on ``<data_dir>/knowledge/personal.lock``, so
it goes away with the process that held it (killed or not); the file holds
that process's id and is never deleted (a deleted lock file could be locked
twice).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import IO, TYPE_CHECKING

from attest.core.errors import FailedPrecondition

if TYPE_CHECKING:
    from attest.knowledge.settings import KnowledgeSettings

LOCK_NAME = "personal.lock"


class StoreInUse(FailedPrecondition):
    """The embedded personal base is open in another process."""

    def __init__(self, path: Path, pid: int | None) -> None:
        who = f"process {pid}" if pid else "another process"
        super().__init__(f"the personal knowledge base under {path.parent.parent} is open in {who}")
        self.path = path
        self.pid = pid


class StoreLock:
    """The exclusive lock of one embedded personal base (see the module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] | None = None

    @property
    def held(self) -> bool:
        return self._file is not None

    def acquire(self) -> None:
        """Take the lock (again: a no-op); ``StoreInUse`` when another process has it."""
        if self._file is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = self.path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _pid_in(f)
            f.close()
            raise StoreInUse(self.path, pid) from None
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
        except StoreInUse as err:
            return err.pid or 0
        self.release()
        return None


def _pid_in(f: IO[str]) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        f.seek(0)
        return int(f.read().strip())
    return None


def personal_store_lock(settings: KnowledgeSettings) -> StoreLock | None:
    """The lock of the personal base the settings describe; None when it is off or
    lives in servers only (OpenSearch and a Qdrant server take any number of clients)."""
    p = settings.personal
    if not p.enabled or (p.lexical_backend != "tantivy" and p.vector_store != "edge"):
        return None
    return StoreLock(settings.data_dir / "knowledge" / LOCK_NAME)
