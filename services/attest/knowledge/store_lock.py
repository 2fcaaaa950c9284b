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
it goes away with the process that held it (killed or not)
(``attest.core.process_lock``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from attest.core.process_lock import LockHeld, ProcessLock

if TYPE_CHECKING:
    from attest.knowledge.settings import KnowledgeSettings

LOCK_NAME = "personal.lock"


class StoreInUse(LockHeld):
    """The embedded personal base is open in another process."""

    def __init__(self, path: Path, pid: int | None) -> None:
        super().__init__(
            path, pid, f"the personal knowledge base under {path.parent.parent} is open in {{who}}"
        )


class StoreLock(ProcessLock):
    """The exclusive lock of one embedded personal base (see the module doc)."""

    def refusal(self, pid: int | None) -> LockHeld:
        return StoreInUse(self.path, pid)


def personal_store_lock(settings: KnowledgeSettings) -> StoreLock | None:
    """The lock of the personal base the settings describe; None when it is off or
    lives in servers only (OpenSearch and a Qdrant server take any number of clients)."""
    p = settings.personal
    if not p.enabled or (p.lexical_backend != "tantivy" and p.vector_store != "edge"):
        return None
    return StoreLock(settings.data_dir / "knowledge" / LOCK_NAME)
