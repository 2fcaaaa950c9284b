"""`attest doctor` checks the personal knowledge base's facts against the ingest
registry: facts whose document is gone are found and, with repair, deleted; the
knowledge service lists its documents with ListFactDocuments."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from attest.core.context import tenant_var
from attest.ingest import doctor
from attest.ingest.state import JobStore, MemoryKeyValue, RegistryEntry
from attest.knowledge.servicer import KnowledgeServicer
from attest.knowledge.settings import KnowledgeSettings
from attest.knowledge.v1 import knowledge_pb2
from tests.unit.test_knowledge_personal import BANK_DOC, aspect, new_store


class Facts:
    """The knowledge service as the doctor reaches it, over a dict."""

    def __init__(self, held: dict[str, dict[str, int]]) -> None:
        self.held = held
        self.deleted: list[tuple[str, list[str]]] = []

    async def documents(self, tenant: str) -> dict[str, int]:
        return dict(self.held.get(tenant, {}))

    async def delete(self, tenant: str, doc_ids: Sequence[str]) -> None:
        self.deleted.append((tenant, list(doc_ids)))
        for d in doc_ids:
            self.held[tenant].pop(d, None)


async def test_facts_whose_document_is_gone_are_found_and_deleted() -> None:
    store = JobStore(MemoryKeyValue())
    entry = RegistryEntry("h", 1)
    store.registry_put("acme", {"a": entry, "b": entry})
    store.registry_put("ops", {"a": entry})
    facts = Facts({"acme": {"a": 4, "gone": 2}, "ops": {"a": 1, "b": 3}})
    found = await doctor.check_facts(store, facts, ["acme", "ops"])
    assert [(f.tenant, f.documents, f.facts, f.orphans) for f in found] == [
        ("acme", 2, 6, ["gone"]),
        ("ops", 2, 4, ["b"]),  # b is acme's document, not ops's
    ]
    assert not any(f.consistent for f in found)
    assert found[0].lines()[0] == (
        "tenant acme: knowledge 2 documents with 6 facts  orphans 1 (facts whose document is gone)"
    )
    for f in found:
        await doctor.repair_facts(facts, f)
    assert facts.deleted == [("acme", ["gone"]), ("ops", ["b"])]
    assert all(f.consistent for f in await doctor.check_facts(store, facts, ["acme", "ops"]))


async def test_the_knowledge_service_lists_its_fact_documents_by_page(tmp_path: Path) -> None:
    personal = new_store(tmp_path)
    await personal.warm_up()
    try:
        await personal.put("acme", "bank", BANK_DOC)
        await personal.put("acme", "mine", [aspect("Norvale", "water use", "Norvale used water.")])
        await personal.put("ops", "other", [aspect("Norvale", "coal", "Norvale burned coal.")])
        servicer = KnowledgeServicer(KnowledgeSettings(), personal=personal)
        token = tenant_var.set("acme")
        try:
            first = await servicer.ListFactDocuments(
                knowledge_pb2.ListFactDocumentsRequest(page_size=1),
                None,  # type: ignore[arg-type]
            )
            second = await servicer.ListFactDocuments(
                knowledge_pb2.ListFactDocumentsRequest(
                    page_size=1, page_token=first.next_page_token
                ),
                None,  # type: ignore[arg-type]
            )
        finally:
            tenant_var.reset(token)
        assert [(d.doc_id, d.facts) for d in first.documents] == [("bank", 4)]
        assert first.next_page_token == "bank"
        assert [(d.doc_id, d.facts) for d in second.documents] == [("mine", 1)]
        assert second.next_page_token == ""
    finally:
        await personal.close()
