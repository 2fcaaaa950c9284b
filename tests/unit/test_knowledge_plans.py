"""Knowledge search programs: the schema and the validation of adversarial plans
(no model; running plans is tested in test_knowledge_kb.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from attest.core.errors import InvalidArgument
from attest.knowledge.plans import (
    OPERATIONS,
    FindEntityOrValueArgs,
    PlanLimits,
    validate_program,
)
from tests.unit.plan_steps import step

LIMITS = PlanLimits()


def refused(program: Any) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as info:
        validate_program(program if isinstance(program, str) else json.dumps(program), LIMITS)
    return info.value


# ------------------------------------------------------------ validation


def test_a_valid_program() -> None:
    program = validate_program(
        {
            "steps": [
                step("link_entities", "e", mentions=["GHG emissions"]),
                step("find_entity_or_value", "m", entity_id="$e", relation="measures"),
                step("get_entity_info", entity_id=["$m", "gri-305"]),
            ]
        },
        LIMITS,
    )
    assert [s.op for s in program.steps] == [
        "link_entities",
        "find_entity_or_value",
        "get_entity_info",
    ]
    assert isinstance(program.steps[1].args, FindEntityOrValueArgs)
    assert program.steps[1].args.top_k == 10
    # The program's JSON reads back as the same program.
    assert validate_program(program.dumps(), LIMITS) == program


def test_unknown_operation() -> None:
    err = refused({"steps": [step("get_entity_info", entity_id="x"), step("delete_all")]})
    assert err.field == "program.steps[1].op"
    assert "unknown operation 'delete_all'" in err.message
    assert err.code == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    "op",
    [
        "__import__('os').system('rm -rf /')",
        "os.system",
        "eval",
        "KnowledgeBase.warm_up",
        ["get_entity_info"],
        None,
    ],
)
def test_something_that_is_not_an_operation(op: Any) -> None:
    err = refused({"steps": [step("link_entities", "e", mentions=["water"]), {"op": op}]})
    assert err.field == "program.steps[1].op"
    if op == "eval":
        assert "unknown operation 'eval'" in err.message
    else:
        assert "is not an operation" in err.message
    for name in OPERATIONS:
        assert name in err.message


def test_code_smuggled_in_a_step_key() -> None:
    err = refused({"steps": [{"op": "get_entity_info", "args": {"entity_id": "x"}, "exec": "1"}]})
    assert err.field == "program.steps[0]"
    assert "unknown key(s) 'exec'" in err.message
    err = refused({"steps": [step("get_entity_info", entity_id="x", callback="os.system")]})
    assert err.field == "program.steps[0].args.callback"


def test_more_than_eight_steps() -> None:
    steps = [step("get_entity_info", entity_id="gri-305") for _ in range(9)]
    err = refused({"steps": steps})
    assert err.field == "program.steps[8]"
    assert "at most 8 steps; this one has 9" in err.message
    validate_program({"steps": steps[:8]}, LIMITS)


def test_loops_and_forward_references() -> None:
    err = refused({"steps": [step("get_entity_info", "a", entity_id="$a")]})
    assert err.field == "program.steps[0].args.entity_id"
    assert "refers to the step itself (a loop)" in err.message

    err = refused(
        {
            "steps": [
                step("get_entity_info", "a", entity_id="$b"),
                step("get_entity_info", "b", entity_id="$a"),
            ]
        }
    )
    assert err.field == "program.steps[0].args.entity_id"
    assert "refers to steps[1], which runs later" in err.message

    err = refused({"steps": [step("get_entity_info", entity_id="$nowhere")]})
    assert "refers to no step" in err.message
    err = refused(
        {
            "steps": [
                step("get_entity_info", "a", entity_id="x"),
                step("link_entities", "a", mentions=["y"]),
            ]
        }
    )
    assert err.field == "program.steps[1].as"


def test_fan_out_beyond_the_limit() -> None:
    err = refused({"steps": [step("link_entities", mentions=[f"m{i}" for i in range(9)])]})
    assert err.field == "program.steps[0].args"
    assert "fans out to 9 calls; a step may make at most 8" in err.message
    # Two lists of three entities make nine relationship calls.
    three = ["gri-301", "gri-302", "gri-303"]
    err = refused(
        {
            "steps": [
                step("get_entity_info", entity_id="gri-305"),
                step("find_relationship", first_entity_id=three, second_entity_id=three),
            ]
        }
    )
    assert err.field == "program.steps[1].args"
    assert "9 calls" in err.message


def test_argument_over_the_length_limit() -> None:
    err = refused(
        {
            "steps": [
                step("link_entities", "e", mentions=["water"]),
                step("find_entity_or_value", entity_id="$e", relation="x" * 257),
            ]
        }
    )
    assert err.field == "program.steps[1].args.relation"
    assert "is 257 characters; at most 256" in err.message
    err = refused({"steps": [step("link_entities", mentions=["ok", "y" * 300])]})
    assert err.field == "program.steps[0].args.mentions[1]"
    err = refused({"steps": [step("link_entities", mentions=["ok"], context="c" * 5000)]})
    assert err.field == "program.steps[0].args.context"
    err = refused(json.dumps({"steps": [step("get_entity_info", entity_id="x" * 20_000)]}))
    assert err.field == "program"


@pytest.mark.parametrize(
    ("program", "field"),
    [
        ("not json", "program"),
        ({"steps": []}, "program.steps"),
        ({"steps": [{"op": "get_entity_info"}], "run": "now"}, "program"),
        ({"steps": [step("get_entity_info", entity_id=3)]}, "program.steps[0].args.entity_id"),
        ({"steps": [step("find_relationship", first_entity_id="a")]}, "program.steps[0].args"),
        (
            {
                "steps": [
                    step("find_relationship", first_entity_id="a", second_entity_id="b", max_hops=9)
                ]
            },
            "program.steps[0].args.max_hops",
        ),
        (
            {"steps": [step("find_entity_or_value", entity_id="a", relation="$x")]},
            "program.steps[0].args.relation",
        ),
    ],
)
def test_malformed_programs(program: Any, field: str) -> None:
    assert refused(program).field.startswith(field)
