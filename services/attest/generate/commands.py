"""``attest eval qa`` and ``attest eval convert-rgb``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

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
@click.option(
    "--pooled",
    is_flag=True,
    help="Pool every question's passages into one corpus, ingest it into an embedded stack "
    "and ask each question through the answer service (retrieval is part of the test).",
)
@click.option(
    "--top-k",
    type=click.IntRange(1, 100),
    default=10,
    show_default=True,
    help="Pooled: sources given to the generator after reranking.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Pooled: where the embedded stack keeps the corpus (default: a fresh temporary "
    "directory, removed afterwards).",
)
def eval_qa(
    dataset: Path,
    mode: str,
    limit: int | None,
    output: Path | None,
    pooled: bool,
    top_k: int,
    data_dir: Path | None,
) -> None:
    """Answer each question from its passages; print answer and citation metrics.

    With --pooled, the passages of all questions form one corpus and each
    question goes through the full pipeline (retrieval, fusion, reranking,
    generation) of the answer service; supporting-passage recall of the
    retrieved sources is reported as well.
    """
    from attest.evaluation.qa import QADatasetError, load_qa, run_qa_eval, table
    from attest.generate.models import Mode
    from attest.generate.settings import GenerateSettings, build_generator

    configure_logging(LoggingSettings(level="WARNING", json=False))
    try:
        items = load_qa(dataset)[:limit]
    except QADatasetError as exc:
        raise click.ClickException(str(exc)) from exc
    settings = GenerateSettings()
    if pooled:
        if (mode == "llm") != bool(settings.llm.url):
            raise click.UsageError(
                "--pooled answers with the stack as configured: --mode llm needs "
                "ATTEST_GENERATE_LLM__URL, and --mode extractive needs it unset"
            )
        result = _eval_pooled(items, top_k, data_dir)
        kind = f"{mode}-pooled"
    else:
        generator = build_generator(settings, with_llm=mode == "llm")
        generator.extractive.warm_up()

        async def go() -> dict[str, float]:
            try:
                result, _ = await run_qa_eval(generator, items, Mode(mode))
            finally:
                await generator.close()
            return result

        result = asyncio.run(go())
        kind = mode
    result_out = {"dataset": dataset.stem, "mode": kind, **result}
    output = output or Path(".attest") / "eval" / f"{dataset.stem}-qa-{kind}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result_out, indent=2) + "\n", encoding="utf-8")
    click.echo(f"{dataset.stem}  mode={kind}")
    click.echo(table(result))
    click.echo(f"wrote {output}")


def _eval_pooled(items: list[Any], top_k: int, data_dir: Path | None) -> dict[str, float]:
    import tempfile

    from attest.evaluation.pooled import run_pooled
    from attest.evaluation.qa import score

    async def go(where: Path) -> dict[str, float]:
        answers = await run_pooled(items, where, top_k=top_k, echo=click.echo)
        return score(items, answers)

    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        return asyncio.run(go(data_dir))
    with tempfile.TemporaryDirectory(prefix="attest-eval-pooled-") as tmp:
        return asyncio.run(go(Path(tmp)))


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
