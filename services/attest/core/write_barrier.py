"""A barrier between the writes to an embedded data directory and a backup of it.

``attest serve all --embedded`` holds its data directory for its whole life
(``attest.core.process_lock``), so a backup taken beside it cannot open the
stores; it copies their files instead, and the copy is only a consistent
state if no write is half-way through while it is made. Every write that
spans the registry and the stores (an ingest batch from ``registry_begin`` to
``registry_commit``, a delete, a repair, a personal-base write) therefore
holds ``<data_dir>/writes.lock`` *shared* (``WriteBarrier.writing``); any
number of them, in any number of threads and processes, run side by side. A
backup takes it *exclusive* (``WriteBarrier.paused``): it waits for the
writes in flight to finish, new ones wait for it, and searches go on.

The lock is ``flock``: it goes away with a process that is killed, and each
holder opens the file itself, so the holders of one process do not share a
lock (``flock`` locks belong to an open file, not to a process). The file is
never deleted, for the same reason as the data directory's lock file.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from attest.core.errors import Unavailable

WRITES_LOCK = "writes.lock"


class WritesNotPaused(Unavailable):
    """The writes in flight did not finish within the backup's wait."""


class WriteBarrier:
    """The write barrier of the data directory ``data_dir`` (see the module doc)."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / WRITES_LOCK

    def _open(self) -> int:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Hold the barrier shared for one write (blocks while a backup copies)."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing the file lets go of its lock

    @contextlib.asynccontextmanager
    async def awriting(self) -> AsyncIterator[None]:
        """``writing`` for a coroutine: the wait for a backup runs in a thread."""
        fd = await asyncio.to_thread(self._open)
        try:
            await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def paused(self, wait_seconds: float = 300.0) -> Iterator[float]:
        """Hold the barrier exclusive: no write runs inside the block. Yields the
        seconds spent waiting for the writes in flight; ``WritesNotPaused`` when
        they did not finish within ``wait_seconds``."""
        fd = self._open()
        began = time.monotonic()
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() - began > wait_seconds:
                        raise WritesNotPaused(
                            f"writes to {self.data_dir} did not pause within {wait_seconds:g} s "
                            "(an ingest batch or delete still running): try again, or give "
                            "more time with --wait"
                        ) from None
                    time.sleep(0.02)
            yield time.monotonic() - began
        finally:
            os.close(fd)


@contextlib.asynccontextmanager
async def awriting(barrier: WriteBarrier | None) -> AsyncIterator[None]:
    """``barrier.awriting()``, or nothing when there is no barrier (stores that live
    in servers: Redis, OpenSearch, a Qdrant server)."""
    if barrier is None:
        yield
        return
    async with barrier.awriting():
        yield
