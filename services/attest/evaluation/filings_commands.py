"""``attest eval filings``: questions over company filings, asked of the PDFs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from attest.core.logging import configure_logging
from attest.core.settings import LoggingSettings
from attest.evaluation.commands import _in_data_dir, _output, _write, check_output, write_whole


@click.command(name="filings")
@click.option(
    "--dataset",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    required=True,
    help="A folder with qa.jsonl (FinanceBench's format: question, answers, doc_name, "
    "evidence pages, question_reasoning) and pdfs/ (one PDF per doc_name).",
)
@click.option(
    "--pooled/--per-document",
    default=True,
    show_default=True,
    help="All filings in one store (a figure from another filing competes with the right "
    "one), or each filing in a store of its own.",
)
@click.option("--limit", type=click.IntRange(1), default=None, help="First N questions only.")
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Metrics JSON (default .attest/eval/<dataset>-filings-<pooled|per-document>.json); "
    "the answers, with their citations and verdicts, go beside it as .answers.jsonl.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the embedded stacks keep the filings (default: a temporary directory, "
    "removed afterwards).",
)
def eval_filings(
    dataset: Path, pooled: bool, limit: int | None, output: Path | None, data_dir: Path | None
) -> None:
    """Ingest the filings' PDFs, ask every question whose PDF is there, and print per
    reasoning kind: right, abstained, wrong, wrong answers cited at confidence 5 or more,
    right answers citing the evidence page, and answers citing another filing."""
    from attest.evaluation.filings import load_filings, run_filings, summarize, table
    from attest.evaluation.qa import QADatasetError

    configure_logging(LoggingSettings(level="WARNING", json=False))
    try:
        questions = load_filings(dataset)
    except QADatasetError as err:
        raise click.ClickException(str(err)) from err
    missing = [q for q in questions if not q.answerable]
    asked = [q for q in questions if q.answerable][:limit]
    if missing:
        click.echo(f"{len(missing)} questions name a filing that is not under pdfs/: not asked")
    if not asked:
        raise click.ClickException(f"no question of {dataset} has its PDF under pdfs/")
    setting = "pooled" if pooled else "per-document"
    output = _output(output, f"{dataset.resolve().name}-filings-{setting}")
    check_output(output)

    async def go(where: Path) -> list[dict[str, Any]]:
        try:
            return await run_filings(
                dataset, where, asked, per_document=not pooled, echo=click.echo
            )
        except QADatasetError as err:
            raise click.ClickException(str(err)) from err

    records = _in_data_dir(data_dir, go)
    summary = summarize(records)
    _write(output, {"dataset": str(dataset), "setting": setting, "summary": summary})
    answers = output.with_suffix(".answers.jsonl")
    write_whole(answers, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    click.echo(f"{dataset}  {setting}  {len(asked)} questions")
    click.echo(table(summary))
    click.echo(f"wrote {output} and {answers}")
