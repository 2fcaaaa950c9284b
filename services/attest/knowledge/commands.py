"""``attest kg``: commands over the ESG knowledge graph.

The main CLI registers the group with ``main.add_command(kg)``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import click

from attest.knowledge.graph import GraphError, KnowledgeGraph, load_graph


def format_stats(graph: KnowledgeGraph) -> str:
    """Counts per level and per relation as two aligned tables, headed by the version."""
    stats = graph.stats()
    lines = [f"ESG knowledge graph {graph.version} ({graph.source})", ""]
    for title, counts, unit in (
        ("level", stats["levels"], "entities"),
        ("relation", stats["relations"], "edges"),
    ):
        rows = [*counts.items(), ("total", sum(counts.values()))]
        name_width = max(len(title), *(len(name) for name, _ in rows))
        count_width = max(len(unit), *(len(str(n)) for _, n in rows))
        lines.append(f"{title:<{name_width}}  {unit:>{count_width}}")
        lines.append(f"{'-' * name_width}  {'-' * count_width}")
        lines.extend(f"{name:<{name_width}}  {n:>{count_width}}" for name, n in rows)
        lines.append("")
    return "\n".join(lines).rstrip("\n")


@click.group()
def kg() -> None:
    """The ESG knowledge graph (Sustainability -> pillars -> GRI topics -> indicators)."""


@kg.command()
@click.option(
    "--graph",
    "graph_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Validate and count this graph file instead of the shipped one.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
def stats(graph_path: Path | None, as_json: bool) -> None:
    """Validate the graph and print its entity counts per level and edge counts per relation."""
    try:
        graph = load_graph(graph_path)
    except GraphError as err:
        raise click.ClickException(f"invalid knowledge graph: {err}") from err
    if as_json:
        click.echo(json.dumps({"version": graph.version, **graph.stats()}, indent=2))
    else:
        click.echo(format_stats(graph))


def format_explain(response: Any) -> list[str]:
    """Lines of an ``ExplainResponse``: the score, its nodes, then each path with
    node scores and the relation of every edge."""
    lines = [
        f"article {response.doc_id}: KG score {response.kg_score:.3f} = best node "
        f"{response.best_node_score:.3f} + mean of the next {len(response.scoring_nodes) - 1} "
        f"{response.next_nodes_mean:.3f}",
        "scoring nodes: "
        + ", ".join(
            f"{n.name} ({n.score:.2f}, {n.best_attribute})" for n in response.scoring_nodes
        ),
    ]
    for i, path in enumerate(response.paths, 1):
        parts = []
        for node in path.nodes:
            gri = f" [{node.gri_id}]" if node.gri_id else ""
            parts.append(f"{node.name}{gri} ({node.score:.2f})")
            if node.relation:
                parts.append(f"-{node.relation}->")
        lines.append(f"path {i}: " + " ".join(parts))
    if response.paths_truncated:
        lines.append("(more paths; raise --max-paths)")
    if not response.paths:
        lines.append("the article has no links to the graph")
    return lines


@kg.command()
@click.argument("question")
@click.option("--doc-id", required=True, help="Id of the article to explain.")
@click.option(
    "--address",
    default="127.0.0.1:50050",
    show_default=True,
    envvar="ATTEST_ADDRESS",
    help="Semantic service HOST:PORT (`attest serve all --embedded` listens on 50050).",
)
@click.option(
    "--variant",
    type=click.Choice(["kg", "kg_enhanced"]),
    default="kg_enhanced",
    show_default=True,
    help="Article attributes: the headline only, or headline, summary and organizations.",
)
@click.option(
    "--max-paths",
    type=click.IntRange(1, 100),
    default=10,
    show_default=True,
    help="Paths from the article to the root shown at most.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(0.1, 600),
    default=60,
    show_default=True,
    help="Deadline of the call in seconds.",
)
def explain(
    question: str, doc_id: str, address: str, variant: str, max_paths: int, timeout: float
) -> None:
    """Show why an article scores as it does for QUESTION: its paths to the root, each
    node scored against the question (SemanticService.Explain on a running stack)."""
    import grpc

    from attest.core.channels import create_channel
    from attest.core.rpc_errors import from_rpc
    from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc

    request = semantic_pb2.ExplainRequest(
        query=question,
        doc_id=doc_id,
        kg_variant=(
            semantic_pb2.KG_VARIANT_PLAIN if variant == "kg" else semantic_pb2.KG_VARIANT_ENHANCED
        ),
        max_paths=max_paths,
    )

    async def run() -> Any:
        channel = create_channel(address)
        try:
            return await semantic_pb2_grpc.SemanticServiceStub(channel).Explain(
                request, timeout=timeout
            )
        finally:
            await channel.close()

    try:
        response = asyncio.run(run())
    except grpc.aio.AioRpcError as err:
        error = from_rpc(err)
        raise click.ClickException(f"{error.code}: {error.details}") from err
    click.echo(f"Q: {question}")
    for line in format_explain(response):
        click.echo(line)
