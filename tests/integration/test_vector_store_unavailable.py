"""QdrantVectorStore against a port nothing listens on: UNAVAILABLE, quickly."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from attest.core.errors import Unavailable
from attest.semantic.store import QdrantVectorStore, VectorFilter

pytestmark = pytest.mark.integration


def closed_port() -> int:
    """A local port that refuses connections: bound once, then released."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_unreachable_qdrant_is_unavailable_without_waiting_for_the_timeout():
    store = QdrantVectorStore(
        collection_prefix="t",
        dimension=4,
        url=f"http://127.0.0.1:{closed_port()}",
        timeout_seconds=30.0,
    )
    started = time.monotonic()
    with pytest.raises(Unavailable, match="unreachable"):
        await store.warm_up()
    # A refused connection is reported at once, not after the 30 s timeout;
    # the margin covers building the client on a loaded machine.
    assert time.monotonic() - started < 10.0
    await store.close()


async def test_a_search_after_qdrant_goes_away_is_unavailable():
    # warm_up never succeeded, so open the client by hand the way warm_up does.
    store = QdrantVectorStore(
        collection_prefix="t", dimension=4, url=f"http://127.0.0.1:{closed_port()}"
    )
    store._client = store._make_client()
    try:
        with pytest.raises(Unavailable):
            await store.search(
                "passages", np.ones(4, dtype=np.float32), 3, VectorFilter(tenant="acme")
            )
        with pytest.raises(Unavailable):
            await store.count("articles", "acme")
    finally:
        await store.close()
