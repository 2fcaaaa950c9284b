"""LexicalService.ListDocuments on a real OpenSearch node.

Pages in id order through the composite aggregation, writes made without a
refresh listed on the first page, tenants apart, and passages whose document
record is gone listed as such (what `attest doctor` calls missing).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from attest.lexical.backends.opensearch import OpenSearchBackend
from attest.lexical.models import DocumentIn, PassageIn
from attest.lexical.query import record_id
from tests.conftest import lexical_settings

pytestmark = pytest.mark.integration


def _doc(doc_id: str, passages: int) -> DocumentIn:
    return DocumentIn(
        id=doc_id,
        title=f"title {doc_id}",
        body=f"body of {doc_id}",
        passages=tuple(PassageIn(i, f"passage {i} of {doc_id}") for i in range(passages)),
    )


async def test_opensearch_lists_documents_page_by_page(tmp_path: Path):
    settings = lexical_settings("opensearch", tmp_path)
    backend = OpenSearchBackend(settings)
    await backend.warm_up()
    try:
        # Not refreshed: the first page makes them visible.
        await backend.index("acme", [_doc(f"d{i}", i % 3) for i in range(7)], refresh=False)
        await backend.index("globex", [_doc("d0", 5)], refresh=False)
        # d5's document record disappears behind the index's back; its passages stay.
        await backend._client.delete(
            index=f"{settings.index_name}-documents", id=record_id("acme", "d5"), refresh=True
        )
        pages, token = [], ""
        while True:
            page = await backend.list_documents("acme", token, 3)
            pages.append([(d.doc_id, d.passages, d.has_document) for d in page.documents])
            token = page.next_page_token
            if not token:
                break
        assert pages == [
            [("d0", 0, True), ("d1", 1, True), ("d2", 2, True)],
            [("d3", 0, True), ("d4", 1, True), ("d5", 2, False)],
            [("d6", 0, True)],
        ]
        (theirs,) = (await backend.list_documents("globex", "", 10)).documents
        assert (theirs.doc_id, theirs.passages, theirs.has_document) == ("d0", 5, True)
    finally:
        await backend._client.indices.delete(index=f"{settings.index_name}-*")
        await backend.close()
