"""Tenants with the same document ids on a real OpenSearch node: the scenario
every lexical backend passes (tests/unit/test_tenant_stores.py), plus the
record ids OpenSearch holds for them."""

from __future__ import annotations

from pathlib import Path

import pytest

from attest.lexical.backends.opensearch import OpenSearchBackend
from tests.conftest import drop_indexes, lexical_settings
from tests.unit.test_tenant_stores import same_ids_in_two_tenants

pytestmark = pytest.mark.integration


async def test_opensearch_keeps_tenants_apart(tmp_path: Path) -> None:
    settings = lexical_settings("opensearch", tmp_path)
    backend = OpenSearchBackend(settings)
    try:
        await backend.warm_up()
        await same_ids_in_two_tenants(backend)
        found = await backend._mget(
            f"{settings.index_name}-documents", ["acme/d1", "globex/d1", "acme/d2"], ["tenant"]
        )
        assert [(d["_id"], d["found"]) for d in found["docs"]] == [
            ("acme/d1", True),
            ("globex/d1", True),
            ("acme/d2", False),
        ]
    finally:
        await backend.close()
        await drop_indexes(settings)
