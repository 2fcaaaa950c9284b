"""The personal knowledge base's store with BM25 on a real OpenSearch node: the
scenarios tests/unit/test_knowledge_personal.py runs on tantivy (replace and delete
in both engines, tenants kept apart, fused retrieval with provenance)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from attest.knowledge.personal import PersonalStore
from attest.lexical.backends.opensearch import OpenSearchBackend
from attest.semantic.store import EdgeVectorStore
from tests.conftest import drop_indexes, lexical_settings
from tests.unit import test_knowledge_personal as scenarios

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[PersonalStore]:
    settings = lexical_settings("opensearch", tmp_path)
    vectors = EdgeVectorStore(tmp_path / "vectors", collection_prefix="pkb", dimension=256)
    s = PersonalStore(OpenSearchBackend(settings), vectors, scenarios.trigrams)
    await s.warm_up()
    try:
        yield s
    finally:
        await s.close()
        await drop_indexes(settings)


async def test_replace_and_delete_on_opensearch(store: PersonalStore, tmp_path: Path) -> None:
    await scenarios.test_store_counts_replaces_and_deletes_in_both_engines(store, tmp_path)


async def test_tenants_apart_on_opensearch(store: PersonalStore) -> None:
    await scenarios.test_tenants_never_see_each_others_facts(store)


async def test_retrieval_on_opensearch(store: PersonalStore) -> None:
    await scenarios.test_retrieval_fuses_bm25_and_vectors_with_provenance(store)
