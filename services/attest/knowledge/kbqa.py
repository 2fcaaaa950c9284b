"""Scoring a planner on a labelled KB-QA set over the ESG graph (no grpc).

The set (tests/unit/test_kb_qa_esg.jsonl, 48 questions) was written by hand
from the shipped graph, after the planner: 14 attribute questions ("What is
X?" in several wordings: define, explain, tell me about, what does X mean),
16 single-hop relation questions over all five relations in both directions
(measures of X, what is X a type of, which pillar does X belong to, which
indicators measure X), 9 questions about how two entities are related, and 9
two-hop questions (the types of the measures of X, the pillar of the topic
measured as X). Entities are named by their name, an alias, a GRI number or
a plural or paraphrase the graph does not list; questions were not reworded
to suit the planner. Items alternate between the kinds, so the halves (odd
and even item numbers) mix them alike.

Each item names what the question asks in graph terms, and the gold answer is
computed from the graph, never written by hand:

* ``attribute``: ``entity``; right when the program's answer is that entity
  alone, from ``get_entity_info``;
* ``relation`` and ``two_hop``: ``entity`` and ``path``, a list of
  ``[relation, direction]`` walked from it (forward: to children, inverse: to
  parents); right when the program's answer entities are exactly the entities
  at the end of the path;
* ``relationship``: ``pair``; right when the program's last step is
  ``find_relationship`` between the two (either order) and finds a path.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attest.knowledge.graph import KnowledgeGraph
from attest.knowledge.plans import FIND_RELATIONSHIP, GET_ENTITY_INFO, Program, ProgramRun

KINDS = ("attribute", "relation", "relationship", "two_hop")


@dataclass(frozen=True, slots=True)
class QaItem:
    id: str
    kind: str
    question: str
    entity: str = ""
    path: tuple[tuple[str, str], ...] = ()
    pair: tuple[str, str] | None = None


def load_items(path: Path) -> list[QaItem]:
    items: list[QaItem] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        raw = json.loads(line)
        items.append(
            QaItem(
                id=raw["id"],
                kind=raw["kind"],
                question=raw["question"],
                entity=raw.get("entity", ""),
                path=tuple((r, d) for r, d in raw.get("path", [])),
                pair=tuple(raw["pair"]) if "pair" in raw else None,
            )
        )
    return items


def gold(graph: KnowledgeGraph, item: QaItem) -> set[str]:
    """The answer entities (attribute, relation, two_hop) or the pair (relationship)."""
    if item.kind == "relationship":
        assert item.pair is not None
        return set(item.pair)
    frontier = {item.entity}
    for relation, direction in item.path:
        nxt: set[str] = set()
        for node in frontier:
            if direction == "forward":
                nxt |= {e.child for e in graph.child_edges(node) if e.relation == relation}
            else:
                nxt |= {e.parent for e in graph.parent_edges(node) if e.relation == relation}
        frontier = nxt
    return frontier


def is_correct(item: QaItem, expected: set[str], run: ProgramRun) -> bool:
    if not run.steps or run.steps[-1].error:
        return False
    last = run.steps[-1]
    if item.kind == "relationship":
        pair = {*last.args.get("first_entity_id", []), *last.args.get("second_entity_id", [])}
        return last.op == FIND_RELATIONSHIP and pair == expected and last.results > 0
    if item.kind == "attribute":
        return last.op == GET_ENTITY_INFO and last.entity_ids == [item.entity]
    return set(run.answer_ids) == expected


@dataclass(frozen=True, slots=True)
class Outcome:
    item: QaItem
    program: Program
    answer: list[str]
    correct: bool


def evaluate(
    items: Iterable[QaItem],
    graph: KnowledgeGraph,
    plan: Callable[[str], Program],
    run: Callable[[Program], ProgramRun],
) -> list[Outcome]:
    out: list[Outcome] = []
    for item in items:
        program = plan(item.question)
        result = run(program)
        last = result.steps[-1] if result.steps else None
        answer = list(result.answer_ids) if last is not None else []
        out.append(Outcome(item, program, answer, is_correct(item, gold(graph, item), result)))
    return out


def accuracy(outcomes: Sequence[Outcome]) -> float:
    return sum(o.correct for o in outcomes) / len(outcomes) if outcomes else 0.0


def report(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """Accuracy overall, by kind and by half (odd and even item numbers)."""
    halves = {
        "first (odd ids)": [o for i, o in enumerate(outcomes) if i % 2 == 0],
        "second (even ids)": [o for i, o in enumerate(outcomes) if i % 2 == 1],
    }
    return {
        "questions": len(outcomes),
        "accuracy": accuracy(outcomes),
        "by_kind": {
            k: (
                accuracy([o for o in outcomes if o.item.kind == k]),
                sum(o.item.kind == k for o in outcomes),
            )
            for k in KINDS
        },
        "by_half": {name: (accuracy(part), len(part)) for name, part in halves.items()},
    }
