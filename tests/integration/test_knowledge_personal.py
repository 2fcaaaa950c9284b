"""The personal knowledge base end to end: the 48 demo articles enriched as ingestion does
(passages, organizations), their facts extracted and stored through the ingest
hook's gRPC Store calls, then read back through the knowledge service's public
RPCs, with API keys of two tenants (acme and globex) on the internal listener.

MiniLM embeds (the relation and linking thresholds are MiniLM's); the ESG graph
is the Environment slice of tests/integration/test_knowledge_service.py, so the
graph's warm-up stays short. The personal base is tantivy and the embedded
Qdrant engine under a temporary directory."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from attest.core.auth import new_api_key, tenant_metadata
from attest.core.server import running
from attest.core.settings import AuthSettings, ClientIdentity, ClientSettings, ServerSettings
from attest.ingest.documents import Article
from attest.ingest.knowledge import FactsHook
from attest.ingest.settings import EnrichSettings
from attest.ingest.stages import Enricher
from attest.knowledge.graph import load_graph
from attest.knowledge.kb import EsgKnowledgeBase
from attest.knowledge.servicer import KnowledgeServicer
from attest.knowledge.settings import KnowledgeSettings
from attest.knowledge.v1 import knowledge_pb2 as pb
from attest.knowledge.v1 import knowledge_pb2_grpc
from attest.semantic.embedding import PACKAGED_MINILM, Embedder
from tests.integration.perimeter import write_keys
from tests.integration.test_knowledge_service import environment_slice

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

CORPUS = Path(__file__).resolve().parents[2] / "services/attest/demo/sample_corpus.jsonl"


@dataclass
class Stack:
    address: str
    keys: dict[str, str]
    records: list[dict[str, object]]

    def client(self, tenant: str) -> ClientSettings:
        return ClientSettings(identity=ClientIdentity(token=self.keys[tenant]))

    def metadata(self, tenant: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.keys[tenant]}"),)


def demo_records() -> list[dict[str, object]]:
    enricher = Enricher(EnrichSettings())
    out = []
    for n, line in enumerate(CORPUS.read_text(encoding="utf-8").splitlines()):
        article = Article.from_json(json.loads(line))
        out.append(enricher.enrich(n, "upsert", "hash", article))
    return out


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    root = tmp_path_factory.mktemp("pkb")
    keys = {"acme": new_api_key(), "globex": new_api_key()}
    keys_file = root / "keys.json"
    write_keys(
        keys_file,
        [{"id": t, "key": k, "tenant": t, "scopes": ["internal"]} for t, k in keys.items()],
    )
    graph = environment_slice(root / "graph.yaml")
    settings = KnowledgeSettings(
        graph_path=graph,
        data_dir=root / "data",
        server=ServerSettings(
            host="127.0.0.1", port=0, auth=AuthSettings(keys_file=keys_file, reload_check_seconds=0)
        ),
    )
    embedder = Embedder(PACKAGED_MINILM)
    servicer = KnowledgeServicer(settings, EsgKnowledgeBase(load_graph(graph), embedder.encode))
    async with running([servicer], settings.server, ready_timeout=300) as server:
        port = server.internal_port or server.port
        yield Stack(f"127.0.0.1:{port}", keys, demo_records())


async def call(
    stack: Stack, key: str, method: str, request: object, *, tenant: str | None = None
) -> object:
    """An RPC with ``key``'s API key, acting for ``tenant`` (a service key may name one)."""
    metadata = stack.metadata(key) + (tenant_metadata(tenant) if tenant else ())
    async with grpc.aio.insecure_channel(stack.address) as channel:
        stub = knowledge_pb2_grpc.KnowledgeServiceStub(channel)
        return await getattr(stub, method)(request, metadata=metadata, timeout=60)


async def test_demo_corpus_round_trip(stack: Stack) -> None:
    hook = FactsHook(stack.address, stack.client("acme"))
    try:
        await hook.index("acme", stack.records)
    finally:
        await hook.close()
    counts = {"descriptions": 0, "triples": 0, "aspect_facts": 0}
    for record in stack.records:
        doc_id = record["article"]["id"]  # type: ignore[index]
        facts = await call(
            stack, "acme", "GetDocumentFacts", pb.GetDocumentFactsRequest(source_doc_id=doc_id)
        )
        for form in counts:
            counts[form] += len(getattr(facts, form))
    print("facts per form over the 48 demo articles:", counts)
    assert counts["triples"] >= 40
    assert counts["descriptions"] >= 3
    assert counts["aspect_facts"] >= 80

    question = "Who chairs Marrowgate Bank?"
    found = await call(stack, "acme", "Search", pb.SearchRequest(query=question, top_k=5))
    top = found.facts[0].triple  # type: ignore[attr-defined]
    assert (top.subject.name, top.relation, top.object_entity.name) == (
        "Rosalind Achebe-Fry",
        "chair of",
        "Marrowgate Bank",
    )
    assert top.source_doc_id in {"esg-014", "esg-025"}
    body = next(r for r in stack.records if r["article"]["id"] == top.source_doc_id)["article"][
        "body"
    ]  # type: ignore[index]
    stated = body[top.provenance.start_char : top.provenance.end_char]
    assert "Rosalind Achebe-Fry" in stated
    assert json.loads(found.program)["steps"][-1]["op"] == "find_entity_or_value"  # type: ignore[attr-defined]

    # Tenant B sees none of it.
    other = await call(stack, "globex", "Search", pb.SearchRequest(query=question, top_k=5))
    assert list(other.facts) == []  # type: ignore[attr-defined]
    none = await call(
        stack,
        "globex",
        "GetDocumentFacts",
        pb.GetDocumentFactsRequest(source_doc_id=top.source_doc_id),
    )
    assert list(none.triples) == []  # type: ignore[attr-defined]

    # Deleting one document removes its facts; the other still answers.
    first = top.source_doc_id
    hook = FactsHook(stack.address, stack.client("acme"))
    try:
        await hook.delete("acme", [first])
        after = await call(stack, "acme", "Search", pb.SearchRequest(query=question, top_k=5))
        assert all(
            getattr(f, f.WhichOneof("fact")).source_doc_id != first
            for f in after.facts  # type: ignore[attr-defined]
        )
        gone = await call(
            stack, "acme", "GetDocumentFacts", pb.GetDocumentFactsRequest(source_doc_id=first)
        )
        assert (len(gone.triples), len(gone.aspect_facts)) == (0, 0)  # type: ignore[attr-defined]

        # A changed document replaces its facts: the chair is someone else now.
        record = next(r for r in stack.records if r["article"]["id"] == first)
        article = dict(record["article"])  # type: ignore[call-overload]
        article["body"] = str(article["body"]).replace("Rosalind Achebe-Fry", "Talia Quorn")
        changed = Enricher(EnrichSettings()).enrich(0, "upsert", "h2", Article.from_json(article))
        await hook.index("acme", [changed])
    finally:
        await hook.close()
    facts = await call(
        stack, "acme", "GetDocumentFacts", pb.GetDocumentFactsRequest(source_doc_id=first)
    )
    names = {t.subject.name for t in facts.triples}  # type: ignore[attr-defined]
    assert "Talia Quorn" in names
    assert "Rosalind Achebe-Fry" not in names


async def test_inline_ingestion_stores_and_deletes_facts(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ingest assembly with ATTEST_INGEST_KNOWLEDGE_ADDRESS: the index stage sends each
    document's facts, a delete removes them (tenant initech, named by acme's service key)."""
    from attest.ingest.assembly import assemble
    from attest.ingest.documents import article_from_raw_json
    from attest.ingest.jobs import Item
    from attest.ingest.settings import IngestSettings

    monkeypatch.setenv("ATTEST_INGEST_KNOWLEDGE_ADDRESS", stack.address)
    lines = CORPUS.read_bytes().splitlines()
    wanted = {"esg-003", "esg-014", "esg-025"}
    items = [
        Item(f"demo:{n}", article_from_raw_json(line))
        for n, line in enumerate(lines)
        if json.loads(line)["id"] in wanted
    ]
    assembly = await assemble(
        IngestSettings(data_dir=tmp_path, client=stack.client("acme")), startup_check=False
    )
    try:
        assert assembly.inline is not None
        snapshot = assembly.core.ingest("initech", items)
        await assembly.inline.drain()
        assert assembly.core.job("initech", snapshot.job_id).state == "DONE"
        stored = await call(
            stack,
            "acme",
            "GetDocumentFacts",
            pb.GetDocumentFactsRequest(source_doc_id="esg-003"),
            tenant="initech",
        )
        assert stored.descriptions[0].text == "the country's fourth-largest lender by assets"  # type: ignore[attr-defined]
        elsewhere = await call(
            stack, "globex", "GetDocumentFacts", pb.GetDocumentFactsRequest(source_doc_id="esg-003")
        )
        assert list(elsewhere.descriptions) == []  # type: ignore[attr-defined]
        found = await call(
            stack,
            "acme",
            "Search",
            pb.SearchRequest(query="Who chairs Marrowgate Bank?", top_k=3),
            tenant="initech",
        )
        top = found.facts[0].triple  # type: ignore[attr-defined]
        assert (top.subject.name, top.source_doc_id in wanted) == ("Rosalind Achebe-Fry", True)
        await assembly.core.delete("initech", doc_ids=sorted(wanted))
        gone = await call(
            stack,
            "acme",
            "Search",
            pb.SearchRequest(query="Who chairs Marrowgate Bank?", top_k=3),
            tenant="initech",
        )
        assert list(gone.facts) == []  # type: ignore[attr-defined]
    finally:
        await assembly.close()
