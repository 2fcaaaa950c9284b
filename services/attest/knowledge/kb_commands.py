"""``attest kb``: the knowledge-base operations and knowledge search from the command line.

Every command works on the ESG knowledge base in this process (the graph and
the embedding model are loaded on each call, settings from
ATTEST_KNOWLEDGE_*), or with ``--address`` against a running knowledge
service. Both go through the same requests, so they print the same thing;
``search`` in this process also prints what each step found.

In this process the personal base is opened too; a knowledge server running
on the same data directory holds it (``attest.knowledge.store_lock``), so
then the command refuses at once, pointing to ``--address``, instead of
opening the stores a second time.

The main CLI registers the group with ``main.add_command(kb)``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from attest.knowledge.v1 import knowledge_pb2 as pb

Response = TypeVar("Response")

_LEVELS = {1: "article", 2: "lower", 3: "intermediate", 4: "basic", 5: "pillar", 6: "root"}


class _Client:
    """The knowledge RPCs, served in this process or by a server at an address."""

    def __init__(self, address: str | None, timeout: float) -> None:
        self.address = address
        self.timeout = timeout
        self._servicer: Any = None
        self._stub: Any = None
        self._channel: Any = None

    async def __aenter__(self) -> _Client:
        if self.address is None:
            from attest.knowledge.servicer import KnowledgeServicer
            from attest.knowledge.settings import KnowledgeSettings
            from attest.knowledge.store_lock import StoreInUse, personal_store_lock

            settings = KnowledgeSettings()
            # A running knowledge server on the same data directory holds the
            # embedded personal base: say so before loading any model.
            lock = personal_store_lock(settings)
            pid = lock.holder() if lock is not None else None
            if pid is not None:
                raise click.ClickException(_in_use(settings.data_dir, pid))
            self._servicer = KnowledgeServicer(settings)
            try:
                await self._servicer.warm_up()
            except StoreInUse as err:
                await self._servicer.close()
                self._servicer = None
                raise click.ClickException(_in_use(settings.data_dir, err.pid)) from err
        else:
            from attest.core.channels import create_channel
            from attest.knowledge.v1 import knowledge_pb2_grpc

            self._channel = create_channel(self.address)
            self._stub = knowledge_pb2_grpc.KnowledgeServiceStub(self._channel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._channel is not None:
            await self._channel.close()
        if self._servicer is not None:
            await self._servicer.close()

    async def call(self, method: str, request: Any) -> Any:
        import grpc

        from attest.core.errors import AttestError
        from attest.core.rpc_errors import from_rpc

        try:
            try:
                if self._servicer is not None:
                    return await getattr(self._servicer, method)(request, None)
                return await getattr(self._stub, method)(request, timeout=self.timeout)
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    raise click.ClickException(_not_served(self.address)) from err
                if err.code() == grpc.StatusCode.UNAVAILABLE:
                    raise click.ClickException(
                        f"UNAVAILABLE: {err.details()}\nNo knowledge service answers at "
                        f"{self.address}. {_START}"
                    ) from err
                raise from_rpc(err) from err
        except AttestError as err:
            # In process or over gRPC, the same words.
            raise click.ClickException(f"{err.code}: {err.details}") from err

    async def entity_id(self, text: str) -> str:
        """The id of the entity ``text`` names (an id, a name, an alias or a near phrase)."""
        response = await self.call("LinkEntities", pb.LinkEntitiesRequest(mentions=[text]))
        links = response.links[0]
        if links.chosen_entity_id:
            return str(links.chosen_entity_id)
        near = ", ".join(f"{c.entity.name} ({c.score:.2f})" for c in links.candidates[:3])
        raise click.ClickException(
            f"no entity matches {text!r}" + (f"; nearest: {near}" if near else "")
        )


_START = (
    "Start one with `attest serve all --knowledge` (every service in one process) or "
    "`attest serve knowledge`, and pass its address with --address HOST:PORT (or "
    "ATTEST_KNOWLEDGE_ADDRESS); without --address the command loads the knowledge base "
    "in this process."
)


def _not_served(address: str | None) -> str:
    return (
        f"the knowledge service is not running at {address}: a gRPC server answers there "
        "but does not serve attest.knowledge.v1.KnowledgeService (a `serve all` started "
        f"without --knowledge?). {_START}"
    )


def _in_use(data_dir: Path, pid: int | None) -> str:
    who = f"process {pid}" if pid else "another process"
    return (
        f"the personal knowledge base under {data_dir} is open in {who} (a running "
        "knowledge server?); ask that server with --address HOST:PORT (or "
        "ATTEST_KNOWLEDGE_ADDRESS), or set ATTEST_KNOWLEDGE_PERSONAL__ENABLED=false to "
        "use the ESG graph alone here"
    )


def _run(address: str | None, timeout: float, body: Callable[[_Client], Awaitable[None]]) -> None:
    async def main() -> None:
        async with _Client(address, timeout) as client:
            await body(client)

    asyncio.run(main())


def _address_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option(
        "--timeout",
        type=click.FloatRange(0.1, 600),
        default=30,
        show_default=True,
        help="Deadline of each call in seconds.",
    )(fn)
    return click.option(
        "--address",
        default=None,
        envvar="ATTEST_KNOWLEDGE_ADDRESS",
        help="Knowledge service HOST:PORT; without it the ESG knowledge base is loaded here.",
    )(fn)


# ------------------------------------------------------------------ format


def format_triple(triple: Any) -> str:
    obj = triple.object_entity.name if triple.HasField("object_entity") else triple.object_value
    return f"({triple.subject.name}, {triple.relation}, {obj})"


def format_provenance(part: Any) -> str:
    """Where a personal fact was stated ("" for the ESG graph's facts)."""
    if not part.source_doc_id:
        return ""
    p = part.provenance
    return f"  [{part.source_doc_id} passage {p.passage_index} chars {p.start_char}-{p.end_char}]"


def format_fact(fact: Any) -> str:
    if fact.HasField("triple"):
        return format_triple(fact.triple) + format_provenance(fact.triple)
    if fact.HasField("aspect_fact"):
        a = fact.aspect_fact
        return f"{a.entity.name} ({a.aspect}): {a.value}" + format_provenance(a)
    d = fact.description
    return f"{d.entity.name}: {d.text}" + format_provenance(d)


def format_entity(entity: Any) -> str:
    gri = f", {entity.gri_id}" if entity.gri_id else ""
    level = _LEVELS.get(entity.level, "")
    return f"{entity.name} [{entity.id}] ({level}{gri})"


def format_links(response: Any) -> list[str]:
    lines: list[str] = []
    for links in response.links:
        chosen = links.chosen_entity_id or "(none chosen)"
        lines.append(f"{links.mention!r} -> {chosen}")
        for c in links.candidates:
            kind = pb.MatchKind.Name(c.match).removeprefix("MATCH_KIND_").lower()
            lines.append(
                f"  {c.score:.3f} {kind:<9} {format_entity(c.entity)} via {c.matched_name!r}"
            )
    return lines


def format_search(response: Any) -> list[str]:
    planner = pb.Planner.Name(response.planner).removeprefix("PLANNER_").lower()
    lines = [
        f"planner: {planner}"
        + (f" ({response.degraded_reason})" if response.degraded_reason else "")
    ]
    lines.append("program:")
    lines.extend(
        f"  {line}"
        for line in json.dumps(json.loads(response.program or "{}"), indent=2).splitlines()
    )
    for step in response.steps:
        took = step.duration.ToTimedelta().total_seconds() * 1000
        status = f"error: {step.error}" if step.error else f"{step.results} result(s)"
        lines.append(f"step {step.index} {step.op} {step.args_json} -> {status} ({took:.0f} ms)")
    lines.append(f"facts ({len(response.facts)}):")
    lines.extend(f"  {f.score:.3f} {format_fact(f)}" for f in response.facts)
    return lines


# ----------------------------------------------------------------- commands


@click.group()
def kb() -> None:
    """Knowledge-base operations over the ESG graph and your documents' facts: link, info,
    find, rel, facts, search."""


@kb.command()
@click.argument("mentions", nargs=-1, required=True)
@click.option("--context", default="", help="Text the mentions come from.")
@click.option(
    "--top-k",
    type=click.IntRange(1, 50),
    default=5,
    show_default=True,
    help="Candidate entities per mention.",
)
@_address_options
def link(
    mentions: tuple[str, ...], context: str, top_k: int, address: str | None, timeout: float
) -> None:
    """Link each MENTION to ESG entities: candidates with scores and the chosen one."""

    async def body(client: _Client) -> None:
        request = pb.LinkEntitiesRequest(mentions=list(mentions), context=context, top_k=top_k)
        for line in format_links(await client.call("LinkEntities", request)):
            click.echo(line)

    _run(address, timeout, body)


@kb.command()
@click.argument("entity")
@click.option(
    "--max-facts",
    type=click.IntRange(1, 1000),
    default=100,
    show_default=True,
    help="Facts listed at most.",
)
@_address_options
def info(entity: str, max_facts: int, address: str | None, timeout: float) -> None:
    """Everything known about ENTITY (an id, name or alias): definition and triples."""

    async def body(client: _Client) -> None:
        entity_id = await client.entity_id(entity)
        response = await client.call(
            "GetEntityInfo", pb.GetEntityInfoRequest(entity_id=entity_id, max_facts=max_facts)
        )
        click.echo(format_entity(response.entity))
        if response.entity.aliases:
            click.echo(f"aliases: {', '.join(response.entity.aliases)}")
        for d in response.descriptions:
            click.echo(f"description: {d.text}")
        for t in response.triples:
            click.echo(f"  {format_triple(t)}")
        if response.truncated:
            click.echo("(more triples; raise --max-facts)")

    _run(address, timeout, body)


@kb.command()
@click.argument("entity")
@click.argument("relation")
@click.option(
    "--top-k",
    type=click.IntRange(1, 100),
    default=10,
    show_default=True,
    help="Entities or values returned at most.",
)
@_address_options
def find(entity: str, relation: str, top_k: int, address: str | None, timeout: float) -> None:
    """The entities or values related to ENTITY by RELATION (free text, e.g. "measures")."""

    async def body(client: _Client) -> None:
        entity_id = await client.entity_id(entity)
        response = await client.call(
            "FindEntityOrValue",
            pb.FindEntityOrValueRequest(entity_id=entity_id, relation=relation, top_k=top_k),
        )
        if not response.facts:
            click.echo(f"nothing matches {relation!r} for {entity_id}")
        for fact in response.facts:
            click.echo(f"{fact.score:.3f} {format_fact(fact)}")

    _run(address, timeout, body)


@kb.command()
@click.argument("first")
@click.argument("second")
@click.option(
    "--max-hops",
    type=click.IntRange(1, 3),
    default=3,
    show_default=True,
    help="Longest path between the two entities, in edges.",
)
@click.option(
    "--max-paths",
    type=click.IntRange(1, 100),
    default=10,
    show_default=True,
    help="Paths returned at most.",
)
@_address_options
def rel(
    first: str, second: str, max_hops: int, max_paths: int, address: str | None, timeout: float
) -> None:
    """How FIRST and SECOND are related: the chains of graph edges between them."""

    async def body(client: _Client) -> None:
        a = await client.entity_id(first)
        b = await client.entity_id(second)
        response = await client.call(
            "FindRelationship",
            pb.FindRelationshipRequest(
                first_entity_id=a, second_entity_id=b, max_hops=max_hops, max_paths=max_paths
            ),
        )
        if not response.paths:
            click.echo(f"{a} and {b} are not connected within {max_hops} hop(s)")
        for i, path in enumerate(response.paths, 1):
            click.echo(f"path {i}: " + " ; ".join(format_triple(t) for t in path.triples))

    _run(address, timeout, body)


@kb.command()
@click.argument("doc_id")
@_address_options
def facts(doc_id: str, address: str | None, timeout: float) -> None:
    """The personal facts stored from DOC_ID, by form, with their provenance."""

    async def body(client: _Client) -> None:
        response = await client.call(
            "GetDocumentFacts", pb.GetDocumentFactsRequest(source_doc_id=doc_id)
        )
        forms = (
            ("descriptions", response.descriptions),
            ("triples", response.triples),
            ("aspect facts", response.aspect_facts),
        )
        click.echo(f"{doc_id}: " + ", ".join(f"{len(items)} {name}" for name, items in forms))
        if not any(items for _, items in forms):
            # The personal base cannot tell an unknown id from a document that
            # states no fact: say both, and where facts come from.
            click.echo(
                f"no facts from {doc_id}: no such document, one that states none, or one "
                "ingested without fact extraction (facts are extracted when ingestion "
                "reaches a knowledge service: `attest serve all --knowledge`, or "
                "ATTEST_INGEST_KNOWLEDGE_ADDRESS)",
                err=True,
            )
        for d in response.descriptions:
            click.echo(f"description: {d.entity.name}: {d.text}{format_provenance(d)}")
        for t in response.triples:
            click.echo(f"triple: {format_triple(t)}{format_provenance(t)}")
        for a in response.aspect_facts:
            click.echo(f"aspect: {a.entity.name} ({a.aspect}): {a.value}{format_provenance(a)}")

    _run(address, timeout, body)


@kb.command()
@click.argument("question")
@click.option(
    "--program",
    default="",
    help='A program to run instead of planning one: JSON ({"steps": [...]}) or @FILE.',
)
@click.option(
    "--top-k",
    type=click.IntRange(1, 100),
    default=10,
    show_default=True,
    help="Results returned at most.",
)
@_address_options
def search(question: str, program: str, top_k: int, address: str | None, timeout: float) -> None:
    """Answer QUESTION from the knowledge base: print the program, each step and the facts."""
    if program.startswith("@"):
        with open(program[1:], encoding="utf-8") as fh:
            program = fh.read()

    async def body(client: _Client) -> None:
        request = pb.SearchRequest(query=question, program=program, top_k=top_k)
        response = await client.call("Search", request)
        click.echo(f"Q: {question}")
        for line in format_search(response):
            click.echo(line)

    _run(address, timeout, body)


@kb.command("eval-planner")
@click.option(
    "--planner",
    type=click.Choice(["heuristic", "llm"]),
    default="heuristic",
    show_default=True,
    help="heuristic: no model. llm: the LLM at ATTEST_KNOWLEDGE_LLM__URL (settings as the "
    "generator's); its replies are scored twice, as the llm planner and as the hybrid one.",
)
@click.option(
    "--qa-set",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=Path("tests/unit/test_kb_qa_esg.jsonl"),
    show_default=True,
    help="A KB-QA set over the ESG graph (attest.knowledge.kbqa).",
)
@click.option("--limit", type=click.IntRange(1), default=None, help="The first N questions only.")
@click.option("--verbose", is_flag=True, help="A line per question: right or wrong, the program.")
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the figures to this file as JSON.",
)
def eval_planner(
    planner: str, qa_set: Path, limit: int | None, verbose: bool, json_path: Path | None
) -> None:
    """Accuracy of a planner on a KB-QA set: overall, by kind, by half, seconds a question."""
    from attest.core.errors import AttestError
    from attest.knowledge.planner_eval import evaluate_planner, format_report

    created = False
    if json_path is not None:
        # Before the evaluation (which can take minutes with an LLM): a path
        # that cannot be written is an error now, not a traceback at the end.
        created = not json_path.exists()
        try:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            with json_path.open("a", encoding="utf-8"):
                pass
        except OSError as err:
            raise click.BadParameter(
                f"cannot write {str(json_path)!r}: {err.strerror or err}", param_hint="--json"
            ) from err
    try:
        figures = asyncio.run(
            evaluate_planner(planner, qa_set, limit, echo=click.echo, verbose=verbose)
        )
    except BaseException as err:
        if created and json_path is not None:
            json_path.unlink(missing_ok=True)  # no empty file left behind
        if isinstance(err, AttestError):
            raise click.ClickException(err.details) from err
        raise
    for line in format_report(figures):
        click.echo(line)
    if json_path is not None:
        json_path.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    llm = figures.get("llm")
    if llm is not None and llm.get("llm_plans_used") == 0:
        # Every question fell back: the "llm" figures are the heuristic planner's.
        raise click.ClickException(
            "the LLM planned none of the questions (fallbacks: "
            + ", ".join(f"{why} x{n}" for why, n in llm.get("fallbacks", {}).items())
            + "); the llm and hybrid figures above are the heuristic planner's"
        )
