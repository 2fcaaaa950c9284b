"""``attest eval qa`` and ``attest eval convert-rgb``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click

from attest.core.logging import configure_logging
from attest.core.settings import LoggingSettings


@click.command(name="qa")
@click.option(
    "--dataset",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help='JSONL: {"id","question","answers":[...],"passages":[{"id","title","text","gold"}]}.',
)
@click.option(
    "--mode",
    type=click.Choice(["extractive", "llm"]),
    default="extractive",
    show_default=True,
    help="llm uses the LLM configured by ATTEST_GENERATE_LLM__* (URL, kind, model).",
)
@click.option("--limit", type=click.IntRange(1), default=None, help="First N questions only.")
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Metrics JSON (default .attest/eval/<dataset>-qa-<mode>.json).",
)
def eval_qa(dataset: Path, mode: str, limit: int | None, output: Path | None) -> None:
    """Answer each question from its passages; print answer and citation metrics."""
    from attest.evaluation.qa import QADatasetError, load_qa, run_qa_eval, table
    from attest.generate.models import Mode
    from attest.generate.settings import GenerateSettings, build_generator

    configure_logging(LoggingSettings(level="WARNING", json=False))
    try:
        items = load_qa(dataset)[:limit]
    except QADatasetError as exc:
        raise click.ClickException(str(exc)) from exc
    settings = GenerateSettings()
    generator = build_generator(settings, with_llm=mode == "llm")
    generator.extractive.warm_up()

    async def go() -> dict[str, float]:
        try:
            result, _ = await run_qa_eval(generator, items, Mode(mode))
        finally:
            await generator.close()
        return result

    result = asyncio.run(go())
    result_out = {"dataset": dataset.stem, "mode": mode, **result}
    output = output or Path(".attest") / "eval" / f"{dataset.stem}-qa-{mode}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result_out, indent=2) + "\n", encoding="utf-8")
    click.echo(f"{dataset.stem}  mode={mode}")
    click.echo(table(result))
    click.echo(f"wrote {output}")


@click.command(name="convert-rgb")
@click.argument("source", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("target", type=click.Path(dir_okay=False, path_type=Path))
def convert_rgb_command(source: Path, target: Path) -> None:
    """Convert RGB's en_fact.json into the QA JSONL of ``attest eval qa``."""
    from attest.evaluation.qa import convert_rgb

    target.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with target.open("w", encoding="utf-8") as handle:
        for row in convert_rgb(source):
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    click.echo(f"wrote {count} questions to {target}")
