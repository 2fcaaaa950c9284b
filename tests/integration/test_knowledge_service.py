"""KnowledgeService through gRPC, in-process on a free port.

The KB is a slice of the ESG graph (the Environment pillar with its topics, and
Emissions with everything below it) with a character-trigram encoder: loading
MiniLM alone costs more than this test may take, and what the model links is
covered by tests/unit/test_knowledge_kb.py; here the service's wiring, checks
and conversions are under test."""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import grpc
import numpy as np
import pytest
import pytest_asyncio
import yaml  # type: ignore[import-untyped]

from attest.common.v1 import common_pb2
from attest.core.channels import create_channel
from attest.core.server import running
from attest.core.settings import ServerSettings
from attest.knowledge.graph import load_graph
from attest.knowledge.kb import EsgKnowledgeBase
from attest.knowledge.servicer import (
    NO_LLM_PLANNER,
    KnowledgeServicer,
)
from attest.knowledge.settings import KnowledgeSettings
from attest.knowledge.v1 import knowledge_pb2 as pb
from attest.knowledge.v1 import knowledge_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


def environment_slice(path: Path) -> Path:
    """The shipped graph cut to the root, Environment, its topics and all below Emissions."""
    text = resources.files("attest.knowledge").joinpath("esg_graph.yaml").read_text("utf-8")
    data = yaml.safe_load(text)
    by_id = {e["id"]: e for e in data["entities"]}
    keep = {"sustainability", "environment"}
    keep |= {i for i, e in by_id.items() if "environment" in (e.get("parents") or {})}
    frontier = {"gri-305"}
    while frontier:
        frontier = {i for i, e in by_id.items() if set(e.get("parents") or {}) & frontier} - keep
        keep |= frontier
    entities = []
    for e in data["entities"]:
        if e["id"] in keep:
            parents = {p: r for p, r in (e.get("parents") or {}).items() if p in keep}
            entities.append({**e, "parents": parents} if parents else e)
    path.write_text(yaml.safe_dump({**data, "entities": entities}), encoding="utf-8")
    return path


def trigrams(texts: Sequence[str]) -> np.ndarray:
    """Unit vectors of hashed character trigrams (512 buckets)."""
    out = np.zeros((len(texts), 512), dtype=np.float32)
    for row, text in enumerate(texts):
        padded = f"  {text.casefold()} "
        for i in range(len(padded) - 2):
            out[row, zlib.crc32(padded[i : i + 3].encode()) % 512] += 1.0
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    graph = environment_slice(tmp_path_factory.mktemp("kg") / "graph.yaml")
    settings = KnowledgeSettings(
        graph_path=graph,
        data_dir=tmp_path_factory.mktemp("data"),
        server=ServerSettings(host="127.0.0.1", port=0, insecure_dev=True),
    )
    servicer = KnowledgeServicer(settings, EsgKnowledgeBase(load_graph(graph), trigrams))
    ctx = running([servicer], settings.server, ready_timeout=120)
    server = await ctx.__aenter__()
    address = f"127.0.0.1:{server.port}"
    channel = create_channel(address)
    yield knowledge_pb2_grpc.KnowledgeServiceStub(channel), address
    await channel.close()
    await ctx.__aexit__(None, None, None)


@pytest.fixture
def stub(served):  # type: ignore[no-untyped-def]
    return served[0]


@pytest.fixture
def server_address(served):  # type: ignore[no-untyped-def]
    return served[1]


async def test_link_entities(stub) -> None:  # type: ignore[no-untyped-def]
    response = await stub.LinkEntities(
        pb.LinkEntitiesRequest(mentions=["GHG emissions", "carbon dioxide output", "football"])
    )
    exact, near, none = response.links
    assert exact.chosen_entity_id == "greenhouse-gas-emission"
    assert exact.candidates[0].match == pb.MATCH_KIND_EXACT
    assert exact.candidates[0].entity.level == common_pb2.KG_NODE_LEVEL_INTERMEDIATE
    assert near.chosen_entity_id == "carbon-dioxide-emission"
    assert near.candidates[0].match == pb.MATCH_KIND_EMBEDDING
    assert 0.65 <= near.candidates[0].score < 1.0
    assert none.chosen_entity_id == ""
    personal_only = await stub.LinkEntities(
        pb.LinkEntitiesRequest(mentions=["water"], knowledge_bases=[pb.KNOWLEDGE_BASE_PERSONAL])
    )
    assert list(personal_only.links[0].candidates) == []


async def test_get_entity_info(stub) -> None:  # type: ignore[no-untyped-def]
    info = await stub.GetEntityInfo(pb.GetEntityInfoRequest(entity_id="gri-305"))
    assert info.entity.name == "Emissions"
    assert info.entity.gri_id == "GRI 305"
    assert info.triples[0].subject.name == "Environment"
    assert info.triples[0].object_entity.name == "Emissions"
    assert info.descriptions[0].text == info.entity.definition
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetEntityInfo(pb.GetEntityInfoRequest(entity_id="gri-999"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_find_entity_or_value(stub) -> None:  # type: ignore[no-untyped-def]
    response = await stub.FindEntityOrValue(
        pb.FindEntityOrValueRequest(entity_id="greenhouse-gas-emission", relation="measures")
    )
    assert [f.triple.object_entity.name for f in response.facts] == [
        "Carbon dioxide equivalent",
        "Emissions intensity",
    ]
    assert response.facts[0].triple.relation == "measured_as"
    topics = await stub.FindEntityOrValue(
        pb.FindEntityOrValueRequest(entity_id="environment", relation="topics", top_k=3)
    )
    assert [f.triple.object_entity.name for f in topics.facts] == [
        "Materials",
        "Energy",
        "Water and effluents",
    ]


async def test_find_relationship(stub) -> None:  # type: ignore[no-untyped-def]
    direct = await stub.FindRelationship(
        pb.FindRelationshipRequest(first_entity_id="scope-2-emissions", second_entity_id="gri-305")
    )
    assert list(direct.paths) == []
    response = await stub.FindRelationship(
        pb.FindRelationshipRequest(
            first_entity_id="scope-2-emissions", second_entity_id="gri-305", max_hops=2
        )
    )
    [path] = response.paths
    assert [(t.subject.name, t.relation, t.object_entity.name) for t in path.triples] == [
        ("Greenhouse gas emission", "source", "Scope 2 emissions"),
        ("Emissions", "measured_as", "Greenhouse gas emission"),
    ]


async def test_search_plans_and_runs(stub) -> None:  # type: ignore[no-untyped-def]
    response = await stub.Search(
        pb.SearchRequest(query="What are the measures of Greenhouse gas emission?", top_k=2)
    )
    assert response.planner == pb.PLANNER_RULES
    assert response.degraded_reason == NO_LLM_PLANNER
    assert [s["op"] for s in json.loads(response.program)["steps"]] == ["find_entity_or_value"]
    [step] = response.steps
    assert step.results == 2
    assert step.error == ""
    assert {f.triple.object_entity.name for f in response.facts} == {
        "Carbon dioxide equivalent",
        "Emissions intensity",
    }
    program = json.dumps(
        {
            "steps": [
                {"op": "link_entities", "args": {"mentions": ["scope 2"]}, "as": "s"},
                {
                    "op": "find_relationship",
                    "args": {"first_entity_id": "$s", "second_entity_id": "gri-305", "max_hops": 3},
                },
            ]
        }
    )
    caller = await stub.Search(pb.SearchRequest(query="scope 2 and emissions", program=program))
    assert caller.planner == pb.PLANNER_CALLER
    assert json.loads(caller.steps[1].args_json)["first_entity_id"] == ["scope-2-emissions"]
    assert caller.steps[1].results == 1
    personal = await stub.Search(
        pb.SearchRequest(query="What is Emissions?", knowledge_bases=[pb.KNOWLEDGE_BASE_PERSONAL])
    )
    assert personal.planner == pb.PLANNER_RULES
    # The personal base holds nothing yet, so "Emissions" is no entity there:
    # the program links the words, and finds nothing.
    assert json.loads(personal.program)["steps"][0]["op"] == "link_entities"
    assert personal.steps[0].results == 0
    assert list(personal.facts) == []


@pytest.mark.parametrize(
    ("steps", "field"),
    [
        ([{"op": "shell", "args": {}}], "program.steps[0].op"),
        ([{"op": "get_entity_info", "args": {"entity_id": "$a"}, "as": "a"}], "program.steps[0]"),
        ([{"op": "get_entity_info", "args": {"entity_id": "gri-305"}}] * 9, "program.steps[8]"),
    ],
)
async def test_search_refuses_adversarial_programs(stub, steps, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Search(pb.SearchRequest(query="q", program=json.dumps({"steps": steps})))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field)


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.StoreRequest(), "source_doc_id"),
        (
            pb.StoreRequest(source_doc_id="d", descriptions=[pb.Description(text="x")]),
            "descriptions[0].entity.name",
        ),
        (
            pb.StoreRequest(
                source_doc_id="d",
                triples=[pb.Triple(subject=pb.EntityRef(name="A"), relation="chair of")],
            ),
            "triples[0].object",
        ),
        (
            pb.StoreRequest(
                source_doc_id="d",
                aspect_facts=[
                    pb.AspectFact(entity=pb.EntityRef(id="nope", name="A"), aspect="a", value="v")
                ],
            ),
            "aspect_facts[0].entity.id",
        ),
        (
            pb.StoreRequest(
                source_doc_id="d",
                aspect_facts=[
                    pb.AspectFact(
                        entity=pb.EntityRef(name="A"),
                        aspect="a",
                        value="v",
                        provenance=pb.Provenance(start_char=9, end_char=3),
                    )
                ],
            ),
            "aspect_facts[0].provenance",
        ),
    ],
)
async def test_store_refuses_invalid_facts_naming_the_field(stub, request_, field) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Store(request_)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()


async def test_store_then_search_replace_and_delete(stub) -> None:  # type: ignore[no-untyped-def]
    chair = pb.Triple(
        subject=pb.EntityRef(name="Rosalind Achebe-Fry"),
        relation="chair of",
        object_entity=pb.EntityRef(name="Marrowgate Bank"),
        provenance=pb.Provenance(passage_index=1, start_char=120, end_char=171),
    )
    topic = pb.AspectFact(
        # A graph entity by its id: the fact is about the ESG topic itself.
        entity=pb.EntityRef(id="gri-305", name="ignored"),
        aspect="financed emissions",
        value="Marrowgate Bank will cut financed emissions by 30%.",
        provenance=pb.Provenance(passage_index=0, start_char=0, end_char=52),
    )
    stored = await stub.Store(
        pb.StoreRequest(source_doc_id="esg-014", triples=[chair], aspect_facts=[topic])
    )
    assert (stored.triples, stored.aspect_facts, stored.removed, stored.entities_created) == (
        1,
        1,
        0,
        3,
    )
    facts = await stub.GetDocumentFacts(pb.GetDocumentFactsRequest(source_doc_id="esg-014"))
    assert [t.subject.name for t in facts.triples] == ["Rosalind Achebe-Fry"]
    assert facts.aspect_facts[0].entity.name == "Emissions"
    assert (facts.triples[0].provenance.passage_index, facts.triples[0].provenance.start_char) == (
        1,
        120,
    )

    found = await stub.Search(pb.SearchRequest(query="chair of Marrowgate Bank", top_k=3))
    top = found.facts[0].triple
    assert (top.subject.name, top.source_doc_id, top.knowledge_base) == (
        "Rosalind Achebe-Fry",
        "esg-014",
        pb.KNOWLEDGE_BASE_PERSONAL,
    )
    assert (top.provenance.passage_index, top.provenance.end_char) == (1, 171)
    # The topic's info holds the graph's edges and the personal fact stored about it.
    info = await stub.GetEntityInfo(pb.GetEntityInfoRequest(entity_id="gri-305"))
    assert [a.source_doc_id for a in info.aspect_facts] == ["esg-014"]
    assert info.triples[0].knowledge_base == pb.KNOWLEDGE_BASE_ESG_GRAPH

    replaced = await stub.Store(pb.StoreRequest(source_doc_id="esg-014", triples=[chair]))
    assert (replaced.removed, replaced.triples, replaced.aspect_facts) == (2, 1, 0)
    deleted = await stub.Store(pb.StoreRequest(source_doc_id="esg-014"))
    assert (deleted.removed, deleted.triples) == (1, 0)
    gone = await stub.Search(pb.SearchRequest(query="chair of Marrowgate Bank", top_k=3))
    assert all(f.triple.source_doc_id != "esg-014" for f in gone.facts)
    assert (
        list(
            (
                await stub.GetDocumentFacts(pb.GetDocumentFactsRequest(source_doc_id="esg-014"))
            ).triples
        )
        == []
    )


async def test_cli_against_the_server(stub, server_address) -> None:  # type: ignore[no-untyped-def]
    from click.testing import CliRunner

    from attest.knowledge.kb_commands import kb

    args = ["find", "GHG emissions", "measures", "--address", server_address]
    # The command runs its own event loop, so it runs in a thread.
    result = await asyncio.to_thread(CliRunner().invoke, kb, args)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "1.000 (Greenhouse gas emission, measured_as, Carbon dioxide equivalent)",
        "1.000 (Greenhouse gas emission, measured_as, Emissions intensity)",
    ]


async def test_cli_prints_a_documents_facts_with_provenance(stub, server_address) -> None:  # type: ignore[no-untyped-def]
    from click.testing import CliRunner

    from attest.knowledge.kb_commands import kb

    await stub.Store(
        pb.StoreRequest(
            source_doc_id="memo-7",
            descriptions=[
                pb.Description(
                    entity=pb.EntityRef(name="Dovecote Mills"),
                    text="a flour miller",
                    provenance=pb.Provenance(passage_index=0, start_char=0, end_char=31),
                )
            ],
            triples=[
                pb.Triple(
                    subject=pb.EntityRef(name="Tom Ferris"),
                    relation="president of",
                    object_entity=pb.EntityRef(name="Dovecote Mills"),
                    provenance=pb.Provenance(passage_index=1, start_char=40, end_char=84),
                )
            ],
        )
    )
    result = await asyncio.to_thread(
        CliRunner().invoke, kb, ["facts", "memo-7", "--address", server_address]
    )
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "memo-7: 1 descriptions, 1 triples, 0 aspect facts",
        "description: Dovecote Mills: a flour miller  [memo-7 passage 0 chars 0-31]",
        "triple: (Tom Ferris, president of, Dovecote Mills)  [memo-7 passage 1 chars 40-84]",
    ]
    await stub.Store(pb.StoreRequest(source_doc_id="memo-7"))
