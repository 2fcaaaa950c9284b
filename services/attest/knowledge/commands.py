"""``attest kg``: commands over the ESG knowledge graph.

The main CLI registers the group with ``main.add_command(kg)``.
"""

from __future__ import annotations

import json
from pathlib import Path

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
