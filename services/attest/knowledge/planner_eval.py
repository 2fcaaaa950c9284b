"""Scoring the planners on a KB-QA set (``attest kb eval-planner``).

Each question is planned, the program run over the ESG graph by the
interpreter, and the run scored by ``attest.knowledge.kbqa`` (gold computed
from the graph). The figures: accuracy overall, by kind, by half (the first
and second halves of the file, and its odd and even items), the mean
seconds a question (planning and running; with the LLM, its reply), and for
the LLM how many of its plans were used and why the others were not.

With ``--planner llm`` each question costs one LLM call, scored twice: as the
``llm`` planner (its plan whenever it validates) and as the ``hybrid`` one
(its plan only when every entity it names is one the linker offered; else
the heuristic plan).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attest.core.errors import FailedPrecondition, InvalidArgument
from attest.generate.llm import LLMClient, create_client
from attest.knowledge.graph import load_graph
from attest.knowledge.kb import EsgKnowledgeBase
from attest.knowledge.kbqa import KINDS, QaItem, gold, is_correct, load_items
from attest.knowledge.llm_planner import LLMPlanner, check_linked, refusal
from attest.knowledge.planner import HeuristicPlanner
from attest.knowledge.plans import Interpreter, Program
from attest.knowledge.settings import KnowledgeSettings
from attest.semantic.embedding import Embedder


@dataclass(frozen=True, slots=True)
class Scored:
    item: QaItem
    correct: bool
    seconds: float
    by_llm: bool = False
    reason: str = ""
    program: str = ""


def esg_base(settings: KnowledgeSettings) -> EsgKnowledgeBase:
    embedder = Embedder(
        settings.embedding_model,
        device=settings.embedding_device,
        batch_size=settings.embedding_batch_size,
    )
    kb = EsgKnowledgeBase(
        load_graph(settings.graph_path),
        embedder.encode,
        link_threshold=settings.link_threshold,
        single_word_threshold=settings.single_word_link_threshold,
        relation_threshold=settings.relation_threshold,
    )
    kb.warm_up()
    return kb


def summarize(scored: Sequence[Scored], *, llm: bool) -> dict[str, Any]:
    def part(rows: Sequence[Scored]) -> list[int]:
        return [sum(r.correct for r in rows), len(rows)]

    half = (len(scored) + 1) // 2
    out: dict[str, Any] = {
        "questions": len(scored),
        "right": sum(r.correct for r in scored),
        "accuracy": sum(r.correct for r in scored) / len(scored) if scored else 0.0,
        "by_kind": {k: part([r for r in scored if r.item.kind == k]) for k in KINDS},
        "by_half": {"first": part(scored[:half]), "second": part(scored[half:])},
        "by_parity": {"odd items": part(scored[0::2]), "even items": part(scored[1::2])},
        "mean_seconds": sum(r.seconds for r in scored) / len(scored) if scored else 0.0,
    }
    if llm:
        out["llm_plans_used"] = sum(r.by_llm for r in scored)
        out["right_with_llm_plans"] = sum(r.correct and r.by_llm for r in scored)
        out["fallbacks"] = dict(
            Counter(r.reason.split(": ")[0] for r in scored if not r.by_llm).most_common()
        )
    return out


async def evaluate_planner(
    planner: str,
    qa_set: Path,
    limit: int | None = None,
    *,
    echo: Callable[[str], None] = print,
    verbose: bool = False,
    settings: KnowledgeSettings | None = None,
    kb: EsgKnowledgeBase | None = None,
    client: LLMClient | None = None,
) -> dict[str, Any]:
    """``{"heuristic": figures}``, or ``{"llm": figures, "hybrid": figures}``."""
    settings = settings or KnowledgeSettings()
    items = load_items(qa_set)[:limit]
    kb = kb or esg_base(settings)
    limits = settings.plans
    heuristic = HeuristicPlanner(kb, limits, extractor=kb.linker.extractor)
    interpreter = Interpreter(kb, limits)

    def score(item: QaItem, program: Program, started: float, **extra: Any) -> Scored:
        run = interpreter.run(program)
        right = is_correct(item, gold(kb.graph, item), run)
        return Scored(item, right, time.perf_counter() - started, program=program.dumps(), **extra)

    def show(name: str, row: Scored) -> None:
        if verbose:
            mark = "right" if row.correct else "WRONG"
            by = "llm" if row.by_llm else "rules"
            echo(f"{name} {row.item.id} {mark} [{by}] {row.item.question} -> {row.program}")
            if row.reason:
                echo(f"    {row.reason}")

    if planner == "heuristic":
        rows = []
        for item in items:
            started = time.perf_counter()
            rows.append(score(item, heuristic.plan(item.question), started))
            show("heuristic", rows[-1])
        return {"heuristic": summarize(rows, llm=False)}
    if client is None:
        if not settings.llm.url:
            raise FailedPrecondition(
                "no LLM configured: set ATTEST_KNOWLEDGE_LLM__URL (and __KIND, "
                "__RESPONSE_FORMAT as for the generator)",
                field="llm.url",
            )
        client = create_client(settings.llm)
    llm_planner = LLMPlanner(kb, limits, client, heuristic=heuristic)
    llm_rows: list[Scored] = []
    hybrid_rows: list[Scored] = []
    try:
        for item in items:
            started = time.perf_counter()
            planned = await llm_planner.plan(item.question)
            planned_at = time.perf_counter()
            by_llm = planned.planner == "llm"
            llm_rows.append(
                score(item, planned.program, started, by_llm=by_llm, reason=planned.reason)
            )
            show("llm", llm_rows[-1])
            # The hybrid's time: the same LLM call, then its own check, plan and run.
            hybrid_start = time.perf_counter() - (planned_at - started)
            program, reason = planned.program, planned.reason
            if by_llm:
                try:
                    check_linked(planned.program, planned.candidates)
                except InvalidArgument as err:
                    program, by_llm = heuristic.plan(item.question), False
                    reason = f"{refusal(err)}; the heuristic planner planned from the question"
            row = score(item, program, hybrid_start, by_llm=by_llm, reason=reason)
            hybrid_rows.append(row)
            show("hybrid", row)
    finally:
        await client.close()
    return {"llm": summarize(llm_rows, llm=True), "hybrid": summarize(hybrid_rows, llm=True)}


def format_report(figures: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for name, f in figures.items():
        lines.append(
            f"{name}: {f['right']}/{f['questions']} right ({f['accuracy']:.3f}), "
            f"{f['mean_seconds']:.2f} s a question"
        )
        kinds = ", ".join(f"{k} {r}/{n}" for k, (r, n) in f["by_kind"].items() if n)
        lines.append(f"  by kind: {kinds}")
        halves = ", ".join(f"{h} {r}/{n}" for h, (r, n) in f["by_half"].items())
        parity = ", ".join(f"{h} {r}/{n}" for h, (r, n) in f["by_parity"].items())
        lines.append(f"  by half: {halves}; {parity}")
        if "llm_plans_used" in f:
            lines.append(
                f"  LLM plans used: {f['llm_plans_used']}/{f['questions']} "
                f"({f['right_with_llm_plans']} right); heuristic fallbacks: "
                + (", ".join(f"{why} x{n}" for why, n in f["fallbacks"].items()) or "none")
            )
    return lines
