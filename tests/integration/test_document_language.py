"""Document.language on OpenSearch: checked, stored, filtered and returned, also in
indexes made before the field was declared (the service adds its mapping at start-up)."""

from __future__ import annotations

from pathlib import Path

import pytest
from opensearchpy import AsyncOpenSearch

from attest.lexical import query as q
from attest.lexical.query import index_names
from tests.conftest import lexical_settings, require_server, start_lexical
from tests.unit.test_document_language import check_lexical

pytestmark = pytest.mark.integration


async def test_opensearch_stores_filters_and_returns_the_language(tmp_path: Path):
    async for harness in start_lexical(lexical_settings("opensearch", tmp_path)):
        await check_lexical(harness)


async def test_an_index_made_before_the_field_gains_its_mapping(tmp_path: Path):
    settings = lexical_settings("opensearch", tmp_path)
    old = q.index_definition(1)
    del old["mappings"]["properties"]["language"]  # as created before the field existed
    client = AsyncOpenSearch(hosts=[require_server("ATTEST_TEST_OPENSEARCH_URL")])
    try:
        for name in index_names(settings.index_name).values():
            await client.indices.create(index=name, body=old)
        async for harness in start_lexical(settings):
            for name in index_names(settings.index_name).values():
                mapping = await client.indices.get_mapping(index=name)
                assert mapping[name]["mappings"]["properties"]["language"] == {"type": "keyword"}
            await check_lexical(harness)
    finally:
        await client.close()
