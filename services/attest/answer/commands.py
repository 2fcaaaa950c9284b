"""``attest ask``: one question to a running answer service, printed with its citations."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import click
from google.protobuf.duration_pb2 import Duration

from attest.answer.v1 import answer_pb2
from attest.common.v1 import common_pb2
from attest.core.errors import AttestError
from attest.generate.v1 import generate_pb2

if TYPE_CHECKING:
    from attest.client import AnswerClient


def _ms(duration: Duration) -> str:
    return f"{duration.ToNanoseconds() / 1e6:.0f} ms"


def _stage(stage: answer_pb2.Stage.ValueType) -> str:
    return answer_pb2.Stage.Name(stage).removeprefix("STAGE_").lower()


def kg_path_line(path: common_pb2.KgPath) -> str:
    """``name (score) → … → Sustainability``."""
    return " → ".join(f"{n.name} ({n.score:.2f})" for n in path.nodes)


async def ask_with_revisions(
    client: AnswerClient,
    question: str,
    ask_options: answer_pb2.AskOptions,
    timeout: float,  # noqa: ASYNC109 - a gRPC deadline, passed through
    on_draft: Callable[[common_pb2.SentenceDraft], None] | None = None,
) -> tuple[answer_pb2.Answer, list[common_pb2.SentenceRevision]]:
    """The final answer of an AskStream call and the revisions it went through;
    ``on_draft`` sees each sentence as the model writes it (LLM mode)."""
    revisions: list[common_pb2.SentenceRevision] = []
    final: answer_pb2.Answer | None = None
    async for event in client.ask_stream(question, ask_options, timeout=timeout):
        kind = event.WhichOneof("event")
        if kind == "draft" and on_draft is not None:
            on_draft(event.draft)
        elif kind == "revision":
            revisions.append(event.revision)
        elif kind == "final":
            final = event.final
    if final is None:
        raise RuntimeError("the answer stream ended without a final answer")
    return final, revisions


def render_revisions(revisions: Sequence[common_pb2.SentenceRevision]) -> Iterator[str]:
    """One line per revision: re-searched (confidence before and after) or withdrawn."""
    for r in revisions:
        text = r.sentence.text if len(r.sentence.text) <= 90 else r.sentence.text[:87] + "..."
        if r.removed:
            yield f"  withdrawn (no source supports it): {text}"
        else:
            yield (
                f"  re-searched: {text} — confidence {r.previous_confidence}/10 → "
                f"{r.sentence.confidence}/10, {len(r.added_sources)} new source(s)"
            )


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_answer(answer: answer_pb2.Answer, *, sources: int = 5) -> Iterator[str]:
    """Lines of a cited answer: sentences with numbered citations and 0-10 confidences,
    the cited sources (with their page, where known, and the personal facts that
    led to them), the KG path of the first listed source with one, degradations
    and stage times."""
    if answer.insufficient_information:
        # The answer says what is missing ("... no source states the amount asked for.").
        reason = answer.sentences[0].text if answer.sentences else answer.text
        yield f"  {reason[:1].upper()}{reason[1:]}"
    for s in answer.sentences:
        if answer.insufficient_information:
            break
        marks = " ".join(_mark(c, len(answer.sources)) for c in s.citations)
        yield f"  {s.text} {marks or '[unsupported]'}"
    # A citation of a source the answer does not list (a server of another
    # version, a hand-built answer) is marked on its sentence, not listed.
    cited = sorted(
        {
            c.source_index
            for s in answer.sentences
            for c in s.citations
            if 0 <= c.source_index < len(answer.sources)
        }
    )
    shown = cited or list(range(min(sources, len(answer.sources))))
    if shown:
        yield "Sources:"
    for i in shown:
        src = answer.sources[i].source
        where = f"{src.doc_id}" + (
            f" passage {src.passage_index}" if src.passage_index >= 0 else ""
        )
        # A passage of a paged document (a PDF) names its page: "Annual Report p. 60".
        title = f"{src.title or src.doc_id} p. {src.page}" if src.page > 0 else src.title
        yield f"  [{i + 1}] {where}  {title}"
        quote = next(
            (
                c.quote
                for s in answer.sentences
                for c in s.citations
                if c.source_index == i and c.quote
            ),
            "",
        )
        if quote:
            # What of the source the citation rests on (a table row, a sentence).
            yield f"      cites: {_clip(quote, 300)}"
        for fact in src.facts[:3]:
            # The personal fact that led the knowledge retriever to this passage.
            span = f" (characters {fact.start_char}-{fact.end_char})" if fact.end_char else ""
            yield f"      fact: {fact.statement}{span}"
    # The knowledge-graph path of the first listed source that has one, under
    # its own number: the best-ranked source need not be cited.
    with_path = next((i for i in shown if answer.sources[i].kg_path.nodes), None)
    if with_path is not None:
        path = kg_path_line(answer.sources[with_path].kg_path)
        yield f"Knowledge graph path of [{with_path + 1}]: {path}"
    for d in answer.degradations:
        yield f"Degraded: {_stage(d.stage)}: {d.reason}"
    stages = ", ".join(f"{_stage(t.stage)} {_ms(t.duration)}" for t in answer.timings)
    yield f"Time: {_ms(answer.total)} ({stages}); re-searched sentences: {answer.researches}"


def _mark(citation: common_pb2.Citation, sources: int) -> str:
    """A citation as the answer's text shows it: "[2: 7/10]"."""
    if 0 <= citation.source_index < sources:
        return f"[{citation.source_index + 1}: {citation.confidence}/10]"
    where = citation.doc_id or f"source index {citation.source_index}"
    return f"[{where}, not among the answer's sources: {citation.confidence}/10]"


GENERATION_MODES = {
    "llm": generate_pb2.GENERATION_MODE_LLM,
    "extractive": generate_pb2.GENERATION_MODE_EXTRACTIVE,
}


@click.command()
@click.argument("question")
@click.option(
    "--address",
    default="127.0.0.1:50050",
    show_default=True,
    envvar="ATTEST_ADDRESS",
    help="Answer service HOST:PORT (`attest serve all --embedded` listens on 50050).",
)
@click.option(
    "--top-k",
    type=click.IntRange(1, 100),
    default=5,
    show_default=True,
    help="Sources given to the generator (the reranker's top k).",
)
@click.option("--no-rerank", is_flag=True, help="Keep the fused order.")
@click.option("--threshold", type=click.IntRange(0, 10), default=None, help="Re-search below.")
@click.option(
    "--timeout",
    type=click.FloatRange(0.1, 600),
    default=120,
    show_default=True,
    help="Deadline of the call in seconds.",
)
@click.option(
    "--mode",
    type=click.Choice(["llm", "extractive"]),
    default=None,
    help="How the answer is written; default: as the server is configured. With llm, "
    "each sentence is printed as the model writes it, then the cited answer.",
)
@click.option(
    "--document",
    "documents",
    multiple=True,
    metavar="ID",
    help="Answer from this document only (its id as ingested; repeat for several).",
)
def ask(
    question: str,
    address: str,
    top_k: int,
    no_rerank: bool,
    threshold: int | None,
    timeout: float,
    mode: str | None,
    documents: tuple[str, ...],
) -> None:
    """Ask a running answer service QUESTION; print the cited answer."""
    from attest.client import AnswerClient, options

    if any(not d.strip() for d in documents):
        raise click.BadParameter("a document id must not be empty", param_hint="--document")
    ask_options = options(
        rerank_top_k=top_k,
        skip_rerank=no_rerank,
        confidence_threshold=threshold,
        explain=True,
        documents=documents,
    )
    if mode is not None:
        ask_options.generation_mode = GENERATION_MODES[mode]

    def draft(sentence: common_pb2.SentenceDraft) -> None:
        click.echo(f"… writing [{sentence.index + 1}] {sentence.text}")

    async def run() -> tuple[answer_pb2.Answer, list[common_pb2.SentenceRevision]]:
        async with AnswerClient(address) as client:
            return await ask_with_revisions(
                client, question, ask_options, timeout=timeout, on_draft=draft
            )

    try:
        answer, revisions = asyncio.run(run())
    except AttestError as exc:
        raise click.ClickException(f"{exc.code}: {exc.details}") from exc
    click.echo(f"Q: {question}")
    for line in render_answer(answer):
        click.echo(line)
    for line in render_revisions(revisions):
        click.echo(line)
