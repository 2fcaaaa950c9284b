"""Knowledge search programs: schema, validation and the interpreter (no grpc).

A program is JSON data, never code::

    {"steps": [
        {"op": "link_entities", "args": {"mentions": ["Greenhouse gas emission"]}, "as": "e"},
        {"op": "find_entity_or_value", "args": {"entity_id": "$e", "relation": "measures"}}
    ]}

``op`` is one of ``OPERATIONS``, the KB operations of ``attest.knowledge.kb``;
``args`` are the arguments of the matching request of the knowledge proto, in
snake_case. An argument string ``"$NAME"`` stands for the entity ids produced
by the earlier step named ``NAME`` (``as``): the chosen ids of
``link_entities``, the entity of ``get_entity_info``, the answers of
``find_entity_or_value`` and the entities on the paths of
``find_relationship``. A step whose entity argument stands for several ids
runs once per id (its fan-out).

``validate_program`` checks a program before anything runs and refuses it
with an ``InvalidArgument`` whose field names the offending step
(``program.steps[3].op``): unknown operations and anything that is not an
operation, more than ``max_steps`` steps, references to the step itself or to
later steps (the only way to write a loop), a fan-out over ``max_fan_out``,
arguments over their length limits, unknown keys. ``Interpreter`` runs a valid
program over a ``KnowledgeBase``: operations are looked up in a fixed table,
so nothing a program says is ever executed or called by name, and what a
step retrieves is only ever data for later steps' entity arguments.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from attest.core.errors import InvalidArgument
from attest.knowledge.kb import (
    EntityInfo,
    Fact,
    KnowledgeBase,
    Linking,
    RelationMatch,
    Relationship,
    UnknownEntity,
)

LINK_ENTITIES: Final = "link_entities"
GET_ENTITY_INFO: Final = "get_entity_info"
FIND_ENTITY_OR_VALUE: Final = "find_entity_or_value"
FIND_RELATIONSHIP: Final = "find_relationship"
OPERATIONS: Final = (LINK_ENTITIES, GET_ENTITY_INFO, FIND_ENTITY_OR_VALUE, FIND_RELATIONSHIP)

_STEP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")
_OPERATION_NAME = re.compile(r"[a-z][a-z_]{0,63}")
REFERENCE_PREFIX: Final = "$"


class PlanLimits(BaseModel):
    """Bounds on what a program may ask for; the service's settings carry them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_steps: int = Field(
        default=8,
        ge=1,
        le=16,
        description="Steps in one program.",
    )
    max_fan_out: int = Field(
        default=8, ge=1, le=64, description="Calls one step may make (mentions, entity ids)."
    )
    max_arg_chars: int = Field(
        default=256, ge=1, description="Longest mention, entity id or relation."
    )
    max_context_chars: int = Field(
        default=4096,
        ge=1,
        description="Characters of context a program may carry.",
    )
    max_program_chars: int = Field(
        default=16_384,
        ge=2,
        description="Characters in one program.",
    )
    max_seconds: float = Field(
        default=5.0, gt=0, description="Time for the whole program; steps after it are skipped."
    )


# ------------------------------------------------------------------ schema


class _Args(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


EntityArg = str | list[str]


class LinkEntitiesArgs(_Args):
    mentions: list[str] = Field(min_length=1)
    context: str = ""
    top_k: int = Field(default=5, ge=1, le=50)


class GetEntityInfoArgs(_Args):
    entity_id: EntityArg
    max_facts: int = Field(default=100, ge=1, le=1000)


class FindEntityOrValueArgs(_Args):
    entity_id: EntityArg
    # Aliases of one relation: a string or a list of strings.
    relation: str | list[str]
    top_k: int = Field(default=10, ge=1, le=100)


class FindRelationshipArgs(_Args):
    first_entity_id: EntityArg
    second_entity_id: EntityArg
    max_hops: int = Field(default=1, ge=1, le=3)
    max_paths: int = Field(default=10, ge=1, le=100)


ARGS: Final[Mapping[str, type[_Args]]] = {
    LINK_ENTITIES: LinkEntitiesArgs,
    GET_ENTITY_INFO: GetEntityInfoArgs,
    FIND_ENTITY_OR_VALUE: FindEntityOrValueArgs,
    FIND_RELATIONSHIP: FindRelationshipArgs,
}
# Arguments that name entities (and so may hold references and fan out).
ENTITY_ARGS: Final[Mapping[str, tuple[str, ...]]] = {
    LINK_ENTITIES: (),
    GET_ENTITY_INFO: ("entity_id",),
    FIND_ENTITY_OR_VALUE: ("entity_id",),
    FIND_RELATIONSHIP: ("first_entity_id", "second_entity_id"),
}


@dataclass(frozen=True, slots=True)
class Step:
    op: str
    args: _Args
    name: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op, "args": self.args.model_dump()}
        if self.name is not None:
            out["as"] = self.name
        return out


@dataclass(frozen=True, slots=True)
class Program:
    steps: tuple[Step, ...]

    def to_json(self) -> dict[str, Any]:
        return {"steps": [s.to_json() for s in self.steps]}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), ensure_ascii=False, sort_keys=False)


# -------------------------------------------------------------- validation


def _refused(message: str, where: str) -> InvalidArgument:
    return InvalidArgument(message, field=f"program.{where}")


def is_reference(value: str) -> bool:
    return value.startswith(REFERENCE_PREFIX)


def validate_program(program: str | Mapping[str, Any], limits: PlanLimits) -> Program:
    """A checked ``Program`` from JSON text or parsed JSON; ``InvalidArgument`` naming the
    offending step otherwise."""
    if isinstance(program, str):
        if len(program) > limits.max_program_chars:
            raise InvalidArgument(
                f"is {len(program)} characters; at most {limits.max_program_chars}",
                field="program",
            )
        try:
            data = json.loads(program)
        except json.JSONDecodeError as err:
            raise InvalidArgument(f"is not valid JSON: {err.msg}", field="program") from None
    else:
        data = program
    if not isinstance(data, Mapping) or set(data) != {"steps"}:
        raise InvalidArgument('must be a JSON object {"steps": [...]}', field="program")
    raw_steps = data["steps"]
    if not isinstance(raw_steps, list) or not raw_steps:
        raise InvalidArgument("must be a non-empty list", field="program.steps")
    if len(raw_steps) > limits.max_steps:
        raise _refused(
            f"a program has at most {limits.max_steps} steps; this one has {len(raw_steps)}",
            f"steps[{limits.max_steps}]",
        )
    names: dict[str, int] = {}
    for index, raw in enumerate(raw_steps):
        if isinstance(raw, Mapping):
            name = raw.get("as")
            if isinstance(name, str) and name not in names:
                names[name] = index
    steps = [_validate_step(index, raw, names, limits) for index, raw in enumerate(raw_steps)]
    return Program(tuple(steps))


def _validate_step(index: int, raw: Any, names: Mapping[str, int], limits: PlanLimits) -> Step:
    where = f"steps[{index}]"
    if not isinstance(raw, Mapping):
        raise _refused('a step is an object {"op": ..., "args": {...}, "as": NAME}', where)
    unknown = sorted(str(k) for k in set(raw) - {"op", "args", "as"})
    if unknown:
        raise _refused(
            f"unknown key(s) {', '.join(map(repr, unknown))}; a step has op, args and as", where
        )
    op = raw.get("op")
    if not isinstance(op, str) or op not in ARGS:
        allowed = ", ".join(OPERATIONS)
        if isinstance(op, str) and _OPERATION_NAME.fullmatch(op):
            raise _refused(f"unknown operation {op!r} (operations: {allowed})", f"{where}.op")
        # Dotted names, calls, code: programs name operations, nothing else is ever called.
        shown = repr(op)[:80]
        raise _refused(
            f"{shown} is not an operation; a program can only name one of: {allowed}",
            f"{where}.op",
        )
    name = raw.get("as")
    if name is not None:
        if not isinstance(name, str) or not _STEP_NAME.fullmatch(name):
            raise _refused("must be a name of 1-32 letters, digits or '_'", f"{where}.as")
        if names.get(name) != index:
            raise _refused(f"the name {name!r} is already used by an earlier step", f"{where}.as")
    raw_args = raw.get("args", {})
    if not isinstance(raw_args, Mapping):
        raise _refused("must be an object", f"{where}.args")
    try:
        args = ARGS[op].model_validate(dict(raw_args))
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise _refused(first["msg"], f"{where}.args.{loc}" if loc else f"{where}.args") from None
    _check_lengths(op, args, where, limits)
    _check_references(op, args, index, name, names, where)
    _check_fan_out(op, args, where, limits)
    return Step(op=op, args=args, name=name)


def _as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def _check_lengths(op: str, args: _Args, where: str, limits: PlanLimits) -> None:
    for key, value in args.model_dump().items():
        if key == "context":
            if len(value) > limits.max_context_chars:
                raise _refused(
                    f"is {len(value)} characters; at most {limits.max_context_chars}",
                    f"{where}.args.{key}",
                )
            continue
        if isinstance(value, (str, list)):
            values = _as_list(value)
            if not values:
                raise _refused("must not be empty", f"{where}.args.{key}")
            for i, text in enumerate(values):
                field_name = f"{where}.args.{key}" + ("" if isinstance(value, str) else f"[{i}]")
                if not text.strip():
                    raise _refused("must not be empty", field_name)
                if len(text) > limits.max_arg_chars:
                    raise _refused(
                        f"is {len(text)} characters; at most {limits.max_arg_chars}", field_name
                    )


def _check_references(
    op: str, args: _Args, index: int, name: str | None, names: Mapping[str, int], where: str
) -> None:
    dumped = args.model_dump()
    for key in ENTITY_ARGS[op]:
        for value in _as_list(dumped[key]):
            if not is_reference(value):
                continue
            target = value[len(REFERENCE_PREFIX) :]
            at = names.get(target)
            field_name = f"{where}.args.{key}"
            if at is None:
                raise _refused(f"{value!r} refers to no step", field_name)
            if at == index:
                raise _refused(f"{value!r} refers to the step itself (a loop)", field_name)
            if at > index:
                raise _refused(
                    f"{value!r} refers to steps[{at}], which runs later (a loop); a step may "
                    "only use the results of earlier steps",
                    field_name,
                )
    for key in ("mentions", "relation"):
        for value in _as_list(dumped.get(key) or []):
            if is_reference(value):
                raise _refused(
                    f"{value!r}: only entity arguments may refer to other steps",
                    f"{where}.args.{key}",
                )


def _check_fan_out(op: str, args: _Args, where: str, limits: PlanLimits) -> None:
    dumped = args.model_dump()
    sizes = [len(_as_list(dumped[key])) for key in ENTITY_ARGS[op]]
    if op == LINK_ENTITIES:
        sizes = [len(dumped["mentions"])]
    calls = int(np.prod(sizes)) if sizes else 1
    if calls > limits.max_fan_out:
        raise _refused(
            f"fans out to {calls} calls; a step may make at most {limits.max_fan_out}",
            f"{where}.args",
        )


# -------------------------------------------------------------- interpreter

StepOutput = Linking | EntityInfo | RelationMatch | Relationship


@dataclass(slots=True)
class StepResult:
    """What one step did: its arguments after references were resolved, one output per
    call, the entity ids later steps may refer to, its facts, and any error."""

    index: int
    op: str
    args: dict[str, Any]
    outputs: list[StepOutput] = field(default_factory=list)
    entity_ids: list[str] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)
    error: str = ""
    truncated: bool = False
    seconds: float = 0.0

    @property
    def results(self) -> int:
        """The number of results: entities linked, or facts found."""
        if self.op == LINK_ENTITIES:
            return len(self.entity_ids)
        if self.op == FIND_RELATIONSHIP:
            return sum(len(o.paths) for o in self.outputs if isinstance(o, Relationship))
        return len(self.facts)


@dataclass(slots=True)
class ProgramRun:
    program: Program
    steps: list[StepResult]

    @property
    def facts(self) -> list[Fact]:
        """Every step's facts, each once (the first time it was found)."""
        out: list[Fact] = []
        seen: set[str] = set()
        for step in self.steps:
            for fact in step.facts:
                key = fact.key()
                if key not in seen:
                    seen.add(key)
                    out.append(fact)
        return out

    @property
    def answer_ids(self) -> list[str]:
        """The entity ids of the last step that produced any (the program's answer)."""
        for step in reversed(self.steps):
            if step.entity_ids and not step.error:
                return step.entity_ids
        return []


class Interpreter:
    """Runs validated programs over one ``KnowledgeBase``."""

    def __init__(
        self,
        kb: KnowledgeBase,
        limits: PlanLimits,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kb = kb
        self.limits = limits
        self._clock = clock

    def run(self, program: Program) -> ProgramRun:
        started = self._clock()
        results: list[StepResult] = []
        by_name: dict[str, StepResult] = {}
        for index, step in enumerate(program.steps):
            result = StepResult(index=index, op=step.op, args=step.args.model_dump())
            step_start = self._clock()
            if step_start - started > self.limits.max_seconds:
                result.error = (
                    f"skipped: the program's time budget of {self.limits.max_seconds:g} s is spent"
                )
            else:
                try:
                    self._run_step(step, result, by_name, started)
                except _StepFailed as err:
                    result.error = str(err)
            result.seconds = self._clock() - step_start
            results.append(result)
            if step.name is not None:
                by_name[step.name] = result
        return ProgramRun(program, results)

    def _resolve(
        self, value: str | list[str], by_name: Mapping[str, StepResult], result: StepResult
    ) -> list[str]:
        out: list[str] = []
        for item in _as_list(value):
            if not is_reference(item):
                out.append(item)
                continue
            source = by_name[item[len(REFERENCE_PREFIX) :]]
            if source.error:
                raise _StepFailed(f"{item} (steps[{source.index}]) failed: {source.error}")
            if not source.entity_ids:
                raise _StepFailed(f"{item} (steps[{source.index}]) found no entities")
            out.extend(source.entity_ids)
        if len(out) > self.limits.max_fan_out:
            result.truncated = True
            out = out[: self.limits.max_fan_out]
        return out

    def _run_step(
        self, step: Step, result: StepResult, by_name: Mapping[str, StepResult], started: float
    ) -> None:
        args = step.args
        kb = self.kb
        calls: list[Callable[[], StepOutput]] = []
        if isinstance(args, LinkEntitiesArgs):
            calls = [
                partial(kb.entity_linking, [m], args.context, top_k=args.top_k)
                for m in args.mentions
            ]
        elif isinstance(args, GetEntityInfoArgs):
            ids = self._resolve(args.entity_id, by_name, result)
            result.args["entity_id"] = ids
            calls = [partial(kb.get_entity_info, [e], max_facts=args.max_facts) for e in ids]
        elif isinstance(args, FindEntityOrValueArgs):
            ids = self._resolve(args.entity_id, by_name, result)
            result.args["entity_id"] = ids
            relation = _as_list(args.relation)
            calls = [partial(kb.find_entity_or_value, [e], relation, top_k=args.top_k) for e in ids]
        elif isinstance(args, FindRelationshipArgs):
            firsts = self._resolve(args.first_entity_id, by_name, result)
            seconds = self._resolve(args.second_entity_id, by_name, result)
            result.args["first_entity_id"] = firsts
            result.args["second_entity_id"] = seconds
            pairs = [(a, b) for a in firsts for b in seconds][: self.limits.max_fan_out]
            calls = [
                partial(
                    kb.find_relationship,
                    [a],
                    [b],
                    max_hops=args.max_hops,
                    max_paths=args.max_paths,
                )
                for a, b in pairs
            ]
        errors: list[str] = []
        for call in calls:
            if self._clock() - started > self.limits.max_seconds:
                errors.append(f"the program's time budget of {self.limits.max_seconds:g} s ran out")
                break
            try:
                output = call()
            except UnknownEntity as err:
                errors.append(str(err))
                continue
            result.outputs.append(output)
            _collect(output, result)
        if errors and not result.outputs:
            raise _StepFailed("; ".join(errors))


class _StepFailed(Exception):
    pass


def _collect(output: StepOutput, result: StepResult) -> None:
    """The entity ids a step offers later steps, and its facts."""

    def add(entity_id: str) -> None:
        if entity_id not in result.entity_ids:
            result.entity_ids.append(entity_id)

    if isinstance(output, Linking):
        # The personal base may choose several entities for one mention; later
        # steps fan out over them (bounded by the plan's fan-out limit).
        for chosen in output.chosen_ids:
            add(chosen)
    elif isinstance(output, EntityInfo):
        add(output.entity.id)
        result.facts.extend(Fact(1.0, description=d) for d in output.descriptions)
        result.facts.extend(Fact(1.0, triple=t) for t in output.triples)
        result.facts.extend(Fact(1.0, aspect_fact=a) for a in output.aspect_facts)
    elif isinstance(output, RelationMatch):
        for fact in output.facts:
            result.facts.append(fact)
            if fact.triple is None:
                continue
            # The answer is the triple's side other than the entity asked about.
            subject, obj = fact.triple.subject, fact.triple.object_entity
            if output.entity_id is not None:
                asked = output.entity_id
            else:
                asked = subject.id if output.direction == "forward" else (obj.id if obj else "")
            other = fact.triple.other(asked)
            if other is not None:
                add(other.id)
    elif isinstance(output, Relationship):
        for path in output.paths:
            for triple in path.triples:
                result.facts.append(Fact(1.0, triple=triple))
                add(triple.subject.id)
                if triple.object_entity is not None:
                    add(triple.object_entity.id)


def rank_facts(
    facts: Sequence[Fact], query: str, encode: Callable[[Sequence[str]], Any], top_k: int
) -> list[Fact]:
    """The facts re-scored by the cosine similarity of their text to the query, best first."""
    if not facts or top_k < 1:
        return []
    vectors = np.asarray(encode([query, *(f.text() for f in facts)]), dtype=np.float32)
    sims = vectors[1:] @ vectors[0]
    scored = [f.rescored(min(float(s), 1.0)) for f, s in zip(facts, sims, strict=True)]
    scored.sort(key=lambda f: -f.score)
    return scored[:top_k]
