"""`attest doctor` compares content, not only counts: a store holding a document
with the right number of passages but other texts is found (changed) and
repaired. Embedded mode (tantivy and the embedded vector engine), no sockets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attest.core.document import passages_digest
from attest.ingest import doctor
from attest.ingest.assembly import assemble
from attest.ingest.documents import article_from_raw_json
from attest.ingest.jobs import Item
from attest.ingest.settings import IngestSettings
from attest.ingest.sinks import LocalSinks
from attest.lexical.models import DocumentIn, Level, PassageIn, SearchQuery

TENANT = "default"
DOCS = [
    {"id": "a", "body": "The plant opened in May. It uses river water for cooling."},
    {"id": "b", "body": "The mine closed in June after a dispute over emissions."},
    {"id": "c", "body": "Wind farms supplied a third of the grid in winter."},
]


def test_the_digest_depends_on_order_index_and_text_only() -> None:
    one = passages_digest([(0, "ab"), (1, "c")])
    assert one == passages_digest([(1, "c"), (0, "ab")])
    assert one != passages_digest([(0, "a"), (1, "bc")])
    assert one != passages_digest([(0, "ab"), (2, "c")])


@pytest.mark.timeout(600)
async def test_doctor_finds_and_repairs_a_document_with_other_texts(tmp_path: Path) -> None:
    assembly = await assemble(IngestSettings(data_dir=tmp_path), startup_check=False)
    try:
        core, inline = assembly.core, assembly.inline
        assert inline is not None
        items = [Item(d["id"], article_from_raw_json(json.dumps(d).encode())) for d in DOCS]
        core.ingest(TENANT, items)
        await inline.drain()
        (clean,) = await doctor.check(core.store, core.sinks)
        assert clean.consistent
        by_store = {s.store: s for s in clean.stores}
        assert (by_store["lexical"].compared, by_store["vectors"].compared) == (3, 3)

        # BM25 gets another text for b: same id, same single passage.
        sinks = core.sinks
        assert isinstance(sinks, LocalSinks)
        forged = "The mine reopened in June."
        await sinks.lexical.index(
            TENANT,
            [DocumentIn(id="b", title="", body=forged, passages=(PassageIn(0, forged),))],
            refresh=True,
        )
        (found,) = await doctor.check(core.store, core.sinks)
        by_store = {s.store: s for s in found.stores}
        assert not found.consistent
        assert (by_store["lexical"].changed, by_store["lexical"].missing) == (["b"], ["b"])
        assert by_store["vectors"].changed == []
        assert found.documents == 3
        assert "    changed b" in found.lines()

        repaired = await doctor.repair(core.store, sinks, inline.runner, found)
        assert repaired.reindexed == 1
        (after,) = await doctor.check(core.store, core.sinks)
        assert after.consistent
        hits = await sinks.lexical.search(
            TENANT, SearchQuery(text="reopened", top_k=5, level=Level.PASSAGE)
        )
        assert hits == []
    finally:
        await assembly.close()
