"""The OpenSearch snapshot procedure of docs/backups.md, on a real node.

Documents go in through the lexical service's backend, the index pair is
snapshotted into an ``fs`` repository (CI's node sets ``path.repo``; a
relative location resolves under it), deleted, restored from the snapshot,
and then holds the same records and answers the same search.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from attest.lexical import query as q
from attest.lexical.backends import create_backend
from attest.lexical.models import DocumentIn, PassageIn, SearchQuery
from tests.conftest import drop_indexes, lexical_settings

pytestmark = pytest.mark.integration

DOCS = [
    DocumentIn(
        id=f"d{i}",
        title=f"Plant {i} water report",
        body=f"Plant {i} withdrew {100 + i} megalitres of water in 2024.",
        passages=(PassageIn(0, f"Plant {i} withdrew {100 + i} megalitres of water in 2024."),),
    )
    for i in range(12)
]


async def _records(client: Any, index: str) -> dict[str, dict[str, Any]]:
    found = await client.search(index=index, body={"query": {"match_all": {}}, "size": 1000})
    return {h["_id"]: h["_source"] for h in found["hits"]["hits"]}


async def test_an_index_snapshotted_deleted_and_restored_holds_the_same_documents(
    tmp_path: Path,
) -> None:
    from opensearchpy import AsyncOpenSearch

    settings = lexical_settings("opensearch", tmp_path)
    backend = create_backend(settings)
    await backend.warm_up()
    client = AsyncOpenSearch(hosts=list(settings.opensearch.hosts))
    repository = f"attest-test-{uuid.uuid4().hex[:8]}"
    names = sorted(q.index_names(settings.index_name).values())
    try:
        await backend.index("default", DOCS, refresh=True)
        query = SearchQuery(text="water megalitres plant 7", top_k=5)
        hits = [(h.doc_id, h.score) for h in await backend.search("default", query)]
        before = {n: await _records(client, n) for n in names}
        assert all(len(records) == len(DOCS) for records in before.values())

        await client.snapshot.create_repository(
            repository=repository, body={"type": "fs", "settings": {"location": repository}}
        )
        taken = await client.snapshot.create(
            repository=repository,
            snapshot="s1",
            body={"indices": ",".join(names), "include_global_state": False},
            params={"wait_for_completion": "true"},
        )
        assert taken["snapshot"]["state"] == "SUCCESS", taken
        assert sorted(taken["snapshot"]["indices"]) == names

        await client.indices.delete(index=",".join(names))
        assert not await client.indices.exists(index=names[0])

        restored = await client.snapshot.restore(
            repository=repository,
            snapshot="s1",
            body={"indices": ",".join(names), "include_global_state": False},
            params={"wait_for_completion": "true"},
        )
        assert restored["snapshot"]["shards"]["failed"] == 0, restored
        await client.indices.refresh(index=",".join(names))
        assert {n: await _records(client, n) for n in names} == before
        again = [(h.doc_id, h.score) for h in await backend.search("default", query)]
        assert again == hits
        assert hits[0][0] == "d7"
    finally:
        await backend.close()
        try:
            await client.snapshot.delete(repository=repository, snapshot="s1", ignore=[404])
            await client.snapshot.delete_repository(repository=repository, ignore=[404])
        finally:
            await client.close()
        await drop_indexes(settings)
