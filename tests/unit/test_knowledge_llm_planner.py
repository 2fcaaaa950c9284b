"""The LLM planner against a fake OpenAI-compatible server on loopback: its plan runs when
it validates; bad JSON, refused plans (every adversarial shape) and a failing server fall
back to the heuristic planner with the reason; retrieved text never reaches the prompt."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import ValidationError

from attest.generate.llm import LLMSettings, create_client
from attest.knowledge.graph import load_graph
from attest.knowledge.kb import EsgKnowledgeBase
from attest.knowledge.kbqa import QaItem, gold
from attest.knowledge.llm_planner import (
    LLMPlanner,
    operation_catalogue,
    program_schema,
    required_args,
)
from attest.knowledge.planner import HeuristicPlanner
from attest.knowledge.plans import ARGS, OPERATIONS, Interpreter, PlanLimits, validate_program
from attest.knowledge.servicer import KnowledgeServicer
from attest.knowledge.settings import KnowledgeSettings, PersonalSettings
from attest.knowledge.v1 import knowledge_pb2
from attest.semantic.embedding import Embedder
from tests.integration.fake_llm import FakeLLM, Reply
from tests.unit.plan_steps import step
from tests.unit.test_knowledge_kb import INJECTION, injected_graph

LIMITS = PlanLimits()
TWO_HOP = "What are the types of the measures of Emissions?"


@pytest.fixture(scope="module")
def kb() -> EsgKnowledgeBase:
    base = EsgKnowledgeBase(load_graph(), Embedder().encode)
    base.warm_up()
    return base


@pytest.fixture
async def fake() -> AsyncIterator[FakeLLM]:
    server = await FakeLLM("openai").start()
    yield server
    await server.stop()


def planner_for(kb: EsgKnowledgeBase, fake: FakeLLM, *, require_linked: bool = False) -> LLMPlanner:
    settings = LLMSettings(
        kind="openai",
        url=fake.url,
        model="fake",
        response_format="json_object",
        max_attempts=1,
        backoff_seconds=0,
    )
    return LLMPlanner(kb, LIMITS, create_client(settings), require_linked=require_linked)


def program(*steps: dict[str, Any]) -> str:
    return json.dumps({"steps": list(steps)})


def test_the_catalogue_and_schema_come_from_the_operations_table() -> None:
    catalogue = operation_catalogue(LIMITS)
    shapes = program_schema(LIMITS)["properties"]["steps"]["items"]["anyOf"]
    assert [s["properties"]["op"]["enum"] for s in shapes] == [[op] for op in OPERATIONS]
    for op, shape in zip(OPERATIONS, shapes, strict=True):
        required = [k for k, f in ARGS[op].model_fields.items() if f.is_required()]
        assert list(required_args(op)) == required
        assert shape["properties"]["args"]["required"] == required
        assert f"- {op}(" in catalogue
    assert "mentions: list of strings" in catalogue
    assert "entity_id: string, relation: string" in catalogue
    assert program_schema(LIMITS)["properties"]["steps"]["maxItems"] == LIMITS.max_steps


async def test_a_valid_plan_from_the_model_is_run(kb: EsgKnowledgeBase, fake: FakeLLM) -> None:
    fake.responder = lambda prompt: program(
        step("find_entity_or_value", "m", entity_id="gri-305", relation="measures"),
        step("find_entity_or_value", "t", entity_id="$m", relation="types"),
    )
    planner = planner_for(kb, fake)
    planned = await planner.plan(TWO_HOP)
    await planner.client.close()
    assert planned.planner == "llm"
    assert planned.reason == ""
    assert [s.op for s in planned.program.steps] == ["find_entity_or_value"] * 2
    run = Interpreter(kb, LIMITS).run(planned.program)
    path = (("measured_as", "forward"), ("type", "forward"))
    expected = gold(kb.graph, QaItem("q", "two_hop", TWO_HOP, "gri-305", path))
    assert len(expected) > 3
    assert set(run.answer_ids) == expected
    # What the model was sent: the catalogue, the question, the linked entity; the schema
    # as llama.cpp's grammar form.
    request = fake.requests[0]
    assert "find_relationship(first_entity_id: string" in request.payload["messages"][0]["content"]
    assert request.prompt.startswith(f"Question: {TWO_HOP}\nCandidates: ")
    candidates = json.loads(request.prompt.split("Candidates: ", 1)[1])
    assert {"mention": "Emissions", "id": "gri-305", "name": "Emissions"} in candidates
    assert request.payload["response_format"]["type"] == "json_object"
    assert request.payload["response_format"]["schema"] == program_schema(LIMITS)


async def test_find_relationship_gets_the_planners_hop_limit(
    kb: EsgKnowledgeBase, fake: FakeLLM
) -> None:
    fake.responder = lambda prompt: program(
        step(
            "find_relationship",
            "r",
            first_entity_id="scope-2-emissions",
            second_entity_id="gri-305",
        )
    )
    planner = planner_for(kb, fake)
    planned = await planner.plan("How are Scope 2 emissions and Emissions related?")
    await planner.client.close()
    assert planned.planner == "llm"
    assert planned.program.steps[0].args.model_dump()["max_hops"] == 3
    assert Interpreter(kb, LIMITS).run(planned.program).steps[0].results > 0


async def test_a_reply_that_is_not_json_falls_back(kb: EsgKnowledgeBase, fake: FakeLLM) -> None:
    fake.responder = lambda prompt: "Sure! First find the measures, then their types."
    planner = planner_for(kb, fake)
    planned = await planner.plan(TWO_HOP)
    await planner.client.close()
    assert planned.planner == "rules"
    assert planned.reason.startswith("the LLM's plan was refused at program: is not valid JSON")
    assert planned.reason.endswith("the heuristic planner planned from the question")
    assert planned.program == HeuristicPlanner(kb, LIMITS).plan(TWO_HOP)
    assert len(fake.requests) == 2  # the client asked once more, then gave up


ADVERSARIAL = [
    # unknown operation
    (program(step("delete_all", "x", entity_id="gri-305")), "program.steps[0].op"),
    # something that is not an operation at all
    (program(step("__import__('os').system", "x")), "program.steps[0].op"),
    # more than 8 steps
    (
        program(*(step("get_entity_info", f"s{i}", entity_id="gri-305") for i in range(9))),
        "program.steps[8]",
    ),
    # a loop: a step reading its own result
    (
        program(step("find_entity_or_value", "a", entity_id="$a", relation="measures")),
        "program.steps[0].args.entity_id",
    ),
    # fan-out beyond the limit
    (
        program(step("link_entities", "e", mentions=[f"m{i}" for i in range(9)])),
        "program.steps[0].args",
    ),
    # an argument over the length limit
    (
        program(step("find_entity_or_value", "a", entity_id="gri-305", relation="x" * 300)),
        "program.steps[0].args.relation",
    ),
    # keys a step does not have
    (
        program({"op": "get_entity_info", "args": {"entity_id": "gri-305"}, "run": "rm"}),
        "program.steps[0]",
    ),
]


@pytest.mark.parametrize(
    ("reply", "where"),
    ADVERSARIAL,
    ids=["unknown-op", "not-an-op", "9-steps", "loop", "fan-out", "long-arg", "extra-key"],
)
async def test_an_invalid_plan_is_refused_and_never_run(
    kb: EsgKnowledgeBase, fake: FakeLLM, reply: str, where: str
) -> None:
    fake.responder = lambda prompt: reply
    planner = planner_for(kb, fake)
    planned = await planner.plan(TWO_HOP)
    await planner.client.close()
    assert planned.planner == "rules"
    assert f"refused at {where}: " in planned.reason
    assert planned.reply == reply
    assert planned.program == HeuristicPlanner(kb, LIMITS).plan(TWO_HOP)
    assert {s.op for s in planned.program.steps} <= set(OPERATIONS)


async def test_a_failing_server_falls_back(kb: EsgKnowledgeBase, fake: FakeLLM) -> None:
    fake.responder = lambda prompt: Reply("model crashed", status=500)
    planner = planner_for(kb, fake)
    planned = await planner.plan(TWO_HOP)
    await planner.client.close()
    assert planned.planner == "rules"
    assert planned.reason.startswith("the LLM failed: LLM server answered 500")
    assert planned.program == HeuristicPlanner(kb, LIMITS).plan(TWO_HOP)


async def test_hybrid_refuses_entities_the_linker_did_not_offer(
    kb: EsgKnowledgeBase, fake: FakeLLM
) -> None:
    # A valid plan, but about an entity the question does not name.
    fake.responder = lambda prompt: program(step("get_entity_info", "a", entity_id="gri-303"))
    question = "What is biodiversity?"
    planner = planner_for(kb, fake)
    assert (await planner.plan(question)).planner == "llm"
    hybrid = planner_for(kb, fake, require_linked=True)
    planned = await hybrid.plan(question)
    await planner.client.close()
    await hybrid.client.close()
    assert planned.planner == "rules"
    assert "refused at program.steps[0].args.entity_id: 'gri-303' is not an entity" in (
        planned.reason
    )
    assert [c.id for c in planned.candidates] == ["gri-304"]
    # A reference to an earlier step is not an entity name: hybrid keeps such plans.
    fake.responder = lambda prompt: program(
        step("find_entity_or_value", "m", entity_id="gri-305", relation="measures"),
        step("find_entity_or_value", "t", entity_id="$m", relation="types"),
    )
    hybrid = planner_for(kb, fake, require_linked=True)
    assert (await hybrid.plan(TWO_HOP)).planner == "llm"
    await hybrid.client.close()


async def test_retrieved_text_never_reaches_the_planner_prompt(
    kb: EsgKnowledgeBase, fake: FakeLLM
) -> None:
    poisoned = EsgKnowledgeBase(injected_graph(), kb.encode)
    fake.responder = lambda prompt: program(step("get_entity_info", "a", entity_id="gri-305"))
    questions = [
        "What is Scope 2 emissions?",
        "What are the measures of Greenhouse gas emission?",
        "How are Scope 2 emissions and Emissions related?",
    ]
    for question in questions:
        for base in (kb, poisoned):
            planner = planner_for(base, fake)
            await planner.plan(question)
            await planner.client.close()
    sent = [(r.system, r.prompt) for r in fake.requests]
    # Each question's prompt is the same over the clean and the poisoned base.
    assert sent[0::2] == sent[1::2]
    assert not any("Ignore previous" in system + prompt for system, prompt in sent)
    assert INJECTION not in json.dumps(sent)


def test_the_planner_setting() -> None:
    assert KnowledgeSettings().planner == "heuristic"
    with pytest.raises(ValidationError, match=r"needs llm\.url"):
        KnowledgeSettings(planner="llm")
    settings = KnowledgeSettings(planner="hybrid", llm=LLMSettings(url="http://127.0.0.1:1"))
    assert settings.planner == "hybrid"


async def test_search_plans_with_the_llm_when_configured(
    kb: EsgKnowledgeBase, fake: FakeLLM
) -> None:
    settings = KnowledgeSettings(
        planner="llm",
        llm=LLMSettings(kind="openai", url=fake.url, max_attempts=1, backoff_seconds=0),
        personal=PersonalSettings(enabled=False),
    )
    servicer = KnowledgeServicer(settings, kb=kb)
    await servicer.warm_up()
    request = knowledge_pb2.SearchRequest(
        query=TWO_HOP, knowledge_bases=[knowledge_pb2.KNOWLEDGE_BASE_ESG_GRAPH]
    )
    plan = program(
        step("find_entity_or_value", "m", entity_id="gri-305", relation="measures"),
        step("find_entity_or_value", "t", entity_id="$m", relation="types"),
    )
    fake.script = [Reply(plan), Reply(program(step("delete_all", "x", entity_id="gri-305")))]
    try:
        response = await servicer.Search(request, None)  # type: ignore[arg-type]
        assert response.planner == knowledge_pb2.PLANNER_LLM
        assert json.loads(response.program) == json.loads(validate_program(plan, LIMITS).dumps())
        assert response.degraded_reason == ""
        assert [s.results > 0 for s in response.steps] == [True, True]
        # A refused plan: the heuristic planner's program runs, and the response says why.
        response = await servicer.Search(request, None)  # type: ignore[arg-type]
        assert response.planner == knowledge_pb2.PLANNER_RULES
        assert "refused at program.steps[0].op: unknown operation 'delete_all'" in (
            response.degraded_reason
        )
        assert response.program == HeuristicPlanner(kb, LIMITS).plan(TWO_HOP).dumps()
    finally:
        await servicer.close()
