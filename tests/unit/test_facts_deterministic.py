"""The facts of a document depend on the document, not on what was enriched before
it: the same input ingested twice, in whatever order a concurrent pipeline takes
its documents, gives the same organizations and the same facts."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attest.core.settings import ClientSettings
from attest.ingest.assembly import assemble
from attest.ingest.documents import article_from_raw_json
from attest.ingest.jobs import Item
from attest.ingest.knowledge import FactsHook
from attest.ingest.settings import IngestSettings

DOCS = [
    {
        "id": "d1",
        "title": "Texaco Inc cuts crude prices",
        "body": "Texaco Inc cut its posted crude prices on Monday. John Smith, the chief "
        "executive of Texaco Inc, said demand was weak.",
    },
    {
        "id": "d2",
        "title": "Refinery output",
        "body": "Texaco said refinery output rose in May. Its chair, Mary Jones, said the "
        "Texaco plants ran at full capacity and water use fell.",
    },
    {
        "id": "d3",
        "title": "Water",
        "body": "Marrowgate Bank lent to Texaco for a water recycling plant. Texaco expects "
        "the plant to cut emissions.",
    },
]


class Captured(FactsHook):
    """The facts hook with its Store calls kept instead of sent."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1:9", ClientSettings())
        self.stored: dict[str, Any] = {}

    async def _store(self, tenant: str, request: Any) -> None:
        self.stored[request.source_doc_id] = request


async def _facts(data_dir: Path, docs: Sequence[dict[str, str]]) -> tuple[dict, dict]:
    assembly = await assemble(IngestSettings(data_dir=data_dir))
    try:
        hook = Captured()
        assembly.core.sinks.knowledge = hook  # type: ignore[attr-defined]
        items = [Item(f"in:{d['id']}", article_from_raw_json(json.dumps(d).encode())) for d in docs]
        snapshot = assembly.core.ingest("default", items)
        assert assembly.inline is not None
        await assembly.inline.drain()
        job = assembly.core.job("default", snapshot.job_id, failures_limit=10)
        assert job.state == "DONE"
        registry = assembly.core.store.registry_all("default")
        organizations = {
            d: sorted(e.keywords.get("organizations", ())) for d, e in registry.items()
        }
        facts = {d: r.SerializeToString(deterministic=True) for d, r in hook.stored.items()}
        await hook.close()
        return organizations, facts
    finally:
        await assembly.close()


async def test_the_same_input_in_another_order_gives_the_same_facts(tmp_path: Path) -> None:
    first = await _facts(tmp_path / "a", DOCS)
    again = await _facts(tmp_path / "b", DOCS)
    reversed_order = await _facts(tmp_path / "c", DOCS[::-1])
    assert set(first[1]) == {"d1", "d2", "d3"}
    assert again == first
    assert reversed_order[0] == first[0]
    assert reversed_order[1] == first[1]


async def test_the_same_input_ingested_again_after_a_delete_gives_the_same_facts(
    tmp_path: Path,
) -> None:
    """What one ingest enriched does not change the next: the facts of the same
    input, deleted and ingested again into the same store, are the same."""
    assembly = await assemble(IngestSettings(data_dir=tmp_path))
    try:
        hook = Captured()
        assembly.core.sinks.knowledge = hook  # type: ignore[attr-defined]
        assert assembly.inline is not None
        rounds = []
        for _ in range(2):
            hook.stored.clear()
            # One job each, as a feed sends them; d1, which names Texaco Inc,
            # last: a gazetteer kept from the first round would give d2 and d3
            # Texaco Inc in the second.
            for doc in DOCS[::-1]:
                item = Item(f"in:{doc['id']}", article_from_raw_json(json.dumps(doc).encode()))
                assembly.core.ingest("default", [item])
                await assembly.inline.drain()
            registry = assembly.core.store.registry_all("default")
            rounds.append(
                (
                    {d: e.keywords.get("organizations", ()) for d, e in registry.items()},
                    {d: r.SerializeToString(deterministic=True) for d, r in hook.stored.items()},
                )
            )
            await assembly.core.delete("default", doc_ids=[d["id"] for d in DOCS])
        assert rounds[0] == rounds[1]
        # "Texaco" alone is not an organization where no document says which.
        assert rounds[0][0]["d2"] == ()
        assert rounds[0][0]["d1"] == ("Texaco Inc",)
        await hook.close()
    finally:
        await assembly.close()
