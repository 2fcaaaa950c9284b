"""``attest eval qa``, ``demo``, ``convert-rgb``, ``convert-demo``, ``fit-judge`` and
``tune-fusion``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from attest.core.logging import configure_logging
from attest.core.settings import LoggingSettings

if TYPE_CHECKING:
    from attest.evaluation.ir import Dataset
    from attest.evaluation.qa import Answered, QAItem

T = TypeVar("T")

_MODE = click.option(
    "--mode",
    type=click.Choice(["extractive", "llm"]),
    default="extractive",
    show_default=True,
    help="llm uses the LLM configured by ATTEST_GENERATE_LLM__* (URL, kind, model).",
)
_DATA_DIR = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Pooled: where the embedded stack keeps the corpus (default: a fresh temporary "
    "directory, removed afterwards).",
)


def _output(output: Path | None, name: str) -> Path:
    return output or Path(".attest") / "eval" / f"{name}.json"


def check_output(path: Path) -> None:
    """Refuses, before any work, an output path that cannot be a file: a folder,
    under something that is a file, or in a folder this user may not write."""
    if path.is_dir():
        raise click.ClickException(f"cannot write {path}: it is a folder")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise click.ClickException(f"cannot write {path}: {parent} is not a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise click.ClickException(f"cannot write {path}: {parent} is not writable")
            break


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` whole or not at all: a file already there (the services'
    settings, say) is replaced only once the new one is complete."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise click.ClickException(f"cannot write {path}: {exc}") from exc


def _write(path: Path, record: dict[str, Any]) -> None:
    write_whole(path, json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def _check_pooled_mode(mode: str) -> None:
    from attest.generate.settings import GenerateSettings

    if (mode == "llm") != bool(GenerateSettings().llm.url):
        raise click.UsageError(
            "pooled runs answer with the stack as configured: --mode llm needs "
            "ATTEST_GENERATE_LLM__URL, and --mode extractive needs it unset"
        )


def _in_data_dir(data_dir: Path | None, go: Callable[[Path], Coroutine[Any, Any, T]]) -> T:
    """Run ``go`` on ``data_dir``, or on a temporary directory removed afterwards."""
    from attest.core.process_lock import LockHeld

    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
        try:
            return asyncio.run(go(data_dir))
        except LockHeld as exc:
            raise click.ClickException(exc.message) from exc
    with tempfile.TemporaryDirectory(prefix="attest-eval-pooled-") as tmp:
        return asyncio.run(go(Path(tmp)))


@click.command(name="qa")
@click.option(
    "--dataset",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help='JSONL: {"id","question","answers":[...],"passages":[{"id","title","text","gold"}]}, '
    'optionally "answer_parts" and "answerable".',
)
@_MODE
@click.option("--limit", type=click.IntRange(1), default=None, help="First N questions only.")
@click.option(
    "--split",
    type=click.Choice(["even", "odd"]),
    default=None,
    help="Only this half of the questions: by the parity of an integer id, else of a hash "
    "of the id. Pooled: every question's passages are still ingested.",
)
@click.option("--halves", is_flag=True, help="Print a column for each half beside the total.")
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Metrics JSON (default .attest/eval/<name>[-<half>]-qa-<mode>.json, where <name> is "
    "the file name, preceded by its folder's for a generic one such as qa.jsonl).",
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
    help="Pooled: sources given to the generator after reranking; retrieval recall is "
    "reported up to this k.",
)
@click.option(
    "--sources-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Pooled: also write each question as a QA set row whose passages are the sources "
    "its Ask was given (gold where they are its gold passages), for attest eval fit-judge.",
)
@_DATA_DIR
def eval_qa(
    dataset: Path,
    mode: str,
    limit: int | None,
    split: str | None,
    halves: bool,
    output: Path | None,
    pooled: bool,
    top_k: int,
    sources_out: Path | None,
    data_dir: Path | None,
) -> None:
    """Answer each question from its passages; print answer, abstention,
    citation, confidence and re-search metrics.

    With --pooled, the passages of all questions form one corpus and each
    question goes through the full pipeline (retrieval, fusion, reranking,
    generation) of the answer service; supporting-passage recall of the
    retrieved sources is reported as well.
    """
    from attest.evaluation.qa import (
        QADatasetError,
        dataset_name,
        half_of,
        load_qa,
        per_question,
        score,
        score_halves,
        table,
    )

    configure_logging(LoggingSettings(level="WARNING", json=False))
    try:
        items = load_qa(dataset)[:limit]
    except QADatasetError as exc:
        raise click.ClickException(str(exc)) from exc
    asked = [i for i in items if split is None or half_of(i.id) == split]
    if not asked:
        raise click.ClickException(f"no questions in the {split} half")
    kind = f"{mode}-pooled" if pooled else mode
    name = dataset_name(dataset) + (f"-{split}" if split else "")
    output = _output(output, f"{name}-qa-{kind}")
    if sources_out is not None:
        if not pooled:
            raise click.UsageError(
                "--sources-out writes the sources of pooled Asks: add --pooled", None
            )
        check_output(sources_out)
        # Not over the set it reads, nor the metrics it writes.
        if sources_out.resolve() in (dataset.resolve(), output.resolve()):
            raise click.UsageError(
                f"--sources-out {sources_out} is the file of --dataset or --output", None
            )
    kept: int | None = None
    if pooled:
        _check_pooled_mode(mode)
        answers = _answer_pooled(items, asked, top_k, data_dir)
        kept = top_k
    else:
        answers = _answer_each(asked, mode)
    result = score(asked, answers, sources_kept=kept)
    by_half = score_halves(asked, answers, sources_kept=kept)
    _write(
        output,
        {
            "dataset": name,
            "path": str(dataset),
            "mode": kind,
            "split": split or "all",
            **result,
            "halves": by_half,
            "per_question": per_question(asked, answers),
        },
    )
    click.echo(f"{name}  ({dataset})  mode={kind}" + (f"  split={split}" if split else ""))
    click.echo(table(result, by_half if halves else None))
    click.echo(f"wrote {output}")
    if sources_out is not None:
        from attest.evaluation.pooled import retrieved_sets

        rows = retrieved_sets(asked, answers, corpus=items)
        if not rows:
            # load_qa (fit-judge) reads no set without a question.
            raise click.ClickException(f"no Ask was given a source: {sources_out} is not written")
        write_whole(
            sources_out, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        )
        click.echo(f"wrote the sources of {len(rows)} Asks to {sources_out}")


def _answer_each(items: list[QAItem], mode: str) -> list[Answered]:
    from attest.evaluation.qa import run_qa_eval
    from attest.generate.models import Mode
    from attest.generate.settings import GenerateSettings, build_generator

    generator = build_generator(GenerateSettings(), with_llm=mode == "llm")
    generator.extractive.warm_up()

    async def go() -> list[Answered]:
        try:
            _, answers = await run_qa_eval(generator, items, Mode(mode))
        finally:
            await generator.close()
        return answers

    return asyncio.run(go())


def _answer_pooled(
    items: list[QAItem], asked: list[QAItem], top_k: int, data_dir: Path | None
) -> list[Answered]:
    from attest.evaluation.pooled import run_pooled

    async def go(where: Path) -> list[Answered]:
        return await run_pooled(items, where, top_k=top_k, echo=click.echo, asked=asked)

    return _in_data_dir(data_dir, go)


@click.command(name="demo")
@_MODE
@click.option(
    "--top-k",
    type=click.IntRange(1, 20),
    default=3,
    show_default=True,
    help="Sources given to the generator after reranking (as `attest demo`).",
)
@_DATA_DIR
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Metrics JSON (default .attest/eval/demo-qa-<mode>-pooled.json).",
)
def eval_demo(mode: str, top_k: int, data_dir: Path | None, output: Path | None) -> None:
    """Ingest the bundled sample as `attest demo` does, ask its labelled questions
    (services/attest/demo/questions.jsonl and unanswerable.jsonl) through the
    answer service and score them against the labels."""
    from attest.demo.labels import demo_items
    from attest.demo.run import sample_documents
    from attest.evaluation.pooled import run_pooled
    from attest.evaluation.qa import per_question, score, table

    configure_logging(LoggingSettings(level="WARNING", json=False))
    _check_pooled_mode(mode)
    items = demo_items()

    async def go(where: Path) -> list[Answered]:
        return await run_pooled(
            items, where, top_k=top_k, echo=click.echo, documents=sample_documents()
        )

    answers = _in_data_dir(data_dir, go)
    result = score(items, answers, sources_kept=top_k)
    records = per_question(items, answers)
    kind = f"{mode}-pooled"
    output = _output(output, f"demo-qa-{kind}")
    _write(output, {"dataset": "demo", "mode": kind, **result, "per_question": records})
    click.echo(f"demo  mode={kind}")
    click.echo(table(result))
    click.echo("")
    for line in demo_summary(records):
        click.echo(line)
    click.echo(f"wrote {output}")


def demo_summary(records: list[dict[str, Any]]) -> list[str]:
    """One line per question (a citation of an article that does not state the
    answer is starred), then the demo's checks."""
    lines = []
    for r in records:
        if r["answerable"]:
            verdict = "right" if r["right"] else "WRONG"
        else:
            verdict = "abstained" if r["abstained"] else "ANSWERED"
        cited = " ".join(d + ("*" if d in r["cited_not_gold"] else "") for d in r["cited"])
        lines.append(f"{r['id']}  {verdict:<9}  cited: {cited or '-'}")
    answerable = [r for r in records if r["answerable"]]
    unanswerable = [r for r in records if not r["answerable"]]
    wrong_citations = [f"{r['id']}:{d}" for r in records for d in r["cited_not_gold"]]
    filler = [f"{r['id']}#{i + 1}" for r in records for i in r["sentences_without_answer"]]
    lines += [
        "",
        f"answers right by the labels: {sum(bool(r['right']) for r in answerable)} of "
        f"{len(answerable)}",
        f"citations of an article that does not state the answer: {len(wrong_citations)}"
        + (f" ({', '.join(wrong_citations)})" if wrong_citations else ""),
        f"answer sentences that state no part of the answer: {len(filler)}"
        + (f" ({', '.join(filler)})" if filler else ""),
        f"unanswerable questions answered with insufficient information: "
        f"{sum(bool(r['abstained']) for r in unanswerable)} of {len(unanswerable)}",
    ]
    return lines


@click.command(name="convert-rgb")
@click.argument("source", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("target", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--negatives-only",
    is_flag=True,
    help="RGB's negative rejection: each question with only its negative passages, marked "
    "unanswerable (the right answer is insufficient information).",
)
def convert_rgb_command(source: Path, target: Path, negatives_only: bool) -> None:
    """Convert RGB's en_fact.json into the QA JSONL of ``attest eval qa``.

    TARGET is written whole, and only once all of SOURCE has been read."""
    from attest.evaluation.qa import QADatasetError, convert_rgb

    check_output(target)
    try:
        rows = list(convert_rgb(source, negatives_only=negatives_only))
    except QADatasetError as exc:
        raise click.ClickException(str(exc)) from exc
    write_whole(target, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    click.echo(f"wrote {len(rows)} questions to {target}")


@click.command(name="fit-judge")
@click.option(
    "--dataset",
    "datasets",
    multiple=True,
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="QA JSONL with gold passages (attest eval qa's format); repeat for several sets.",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    show_default=True,
    help="Where the fitted weights go (default .attest/eval/judge_weights.json); the "
    "generator reads services/attest/generate/judge_weights.json, so copy them there to use them.",
)
@click.option(
    "--c",
    "c",
    type=click.FloatRange(min=1e-6),
    default=1.0,
    show_default=True,
    help="Inverse L2 regularization strength.",
)
@click.option(
    "--single-source/--no-single-source",
    default=False,
    show_default=True,
    help="Also fit each question that several gold passages answer on their own as it "
    "reads with one of them (a set of its own, '<set> (one stating source)'). Measured, "
    "not used for the shipped weights (docs/results/answer-quality.md).",
)
@click.option(
    "--split",
    type=click.Choice(["even", "odd"]),
    default=None,
    help="Fit on this half of every set's questions only (attest eval qa's halves), so that "
    "the other half can be answered with weights that never saw it.",
)
def fit_judge_command(
    datasets: tuple[Path, ...],
    output: Path | None,
    c: float,
    single_source: bool,
    split: str | None,
) -> None:
    """Fit the support judge's weights on labelled question sets.

    Prints, per data set and half, the AUROC of the shipped weights and of
    weights fitted on the other half, then writes weights fitted on all
    (with --split, on that half).
    """
    from attest.evaluation.judge_fit import fit_judge

    configure_logging(LoggingSettings(level="WARNING", json=False))
    output = output or Path(".attest") / "eval" / "judge_weights.json"
    check_output(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        report = fit_judge(list(datasets), output, c, single_source=single_source, split=split)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(json.dumps(report, indent=2))
    click.echo(f"wrote {output}")


def _refuse_beir_files(target: Path, overwrite: bool) -> None:
    """A BEIR folder's files are replaced only when asked to (``--overwrite``)."""
    present = [
        str(target / name)
        for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv")
        if (target / name).exists()
    ]
    if present and not overwrite:
        raise click.ClickException(
            f"{', '.join(present)} already there: give --overwrite to replace them, "
            "or another folder"
        )


@click.command(name="convert-demo")
@click.argument("target", type=click.Path(file_okay=False, path_type=Path))
@click.option("--overwrite", is_flag=True, help="Replace the BEIR files TARGET already holds.")
def convert_demo_command(target: Path, overwrite: bool) -> None:
    """Write the demo sample and its labelled questions as a BEIR folder TARGET.

    Each answerable question is a query and its supporting articles are its
    relevant documents, so `attest eval ir --dataset TARGET` measures retrieval
    on the demo's ESG news.
    """
    from attest.demo.labels import write_beir

    _refuse_beir_files(target, overwrite)
    try:
        docs, queries = write_beir(target)
    except OSError as exc:
        raise click.ClickException(f"cannot write {target}: {exc}") from exc
    click.echo(f"wrote {docs} documents and {queries} judged queries to {target}")


@click.command(name="convert-qa")
@click.argument("source", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("target", type=click.Path(file_okay=False, path_type=Path))
@click.option("--overwrite", is_flag=True, help="Replace the BEIR files TARGET already holds.")
def convert_qa_command(source: Path, target: Path, overwrite: bool) -> None:
    """Pool a QA JSONL's passages into a BEIR folder TARGET.

    Every distinct passage becomes a document, every question with a gold passage a
    query and its gold passages the relevant documents, so `attest eval ir` and
    `attest eval tune-fusion` measure retrieval in that set's domain (HotpotQA's
    Wikipedia paragraphs, RGB's news).
    """
    from attest.evaluation.qa import QADatasetError, load_qa, write_beir

    _refuse_beir_files(target, overwrite)
    try:
        items = load_qa(source)
        docs, queries = write_beir(items, target)
    except QADatasetError as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(f"cannot write {target}: {exc}") from exc
    click.echo(f"wrote {docs} documents and {queries} judged queries to {target}")


@click.command(name="tune-fusion")
@click.option(
    "--dataset",
    "datasets",
    multiple=True,
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="BEIR folder (attest eval ir's format); repeat to fit one setting on several sets.",
)
@click.option(
    "--unseen",
    "unseen_sets",
    multiple=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="BEIR folder scored with every family fitted on the --dataset sets, and never "
    "fitted on or chosen by: how the fusions carry to a corpus nobody tuned on. Repeatable.",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where the fitted settings go (default .attest/eval/fusion.json). The services "
    "read services/attest/answer/fusion.json, or the file named by "
    "ATTEST_ANSWER_FUSION_SETTINGS.",
)
@click.option(
    "--backend",
    type=click.Choice(["tantivy", "opensearch", "elasticsearch"]),
    default="tantivy",
    show_default=True,
    help="Lexical backend of the in-process BM25.",
)
@click.option(
    "--reuse-lists/--no-reuse-lists",
    default=False,
    show_default=True,
    help="Fit on the result lists the last run over the same corpus saved in the cache "
    "instead of asking the retrievers again (only valid if no scoring code or setting "
    "changed since).",
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Run the cross-validation again on REPEATS - 1 random halvings of the queries "
    "and print how much each difference moves with the split (each repeat costs "
    "about as much as the first fit).",
)
def tune_fusion_command(
    datasets: tuple[Path, ...],
    unseen_sets: tuple[Path, ...],
    output: Path | None,
    backend: str,
    reuse_lists: bool,
    repeats: int,
) -> None:
    """Fit the fusion method and weights on development sets, cross-validated by halves.

    Each set is indexed once (or read back from attest eval ir's cache), every
    retriever's list is taken per query, and a grid of fusions is fitted on one
    half of the queries and scored on the other, both ways round. Prints the
    figures and writes the settings fitted on all queries.
    """
    from typing import cast

    from attest.evaluation.fusion_tune import FEW_QUERIES, tune
    from attest.evaluation.ir import DatasetError, load_dataset
    from attest.evaluation.runner import (
        SIGNAL_NAMES,
        BackendName,
        default_cache_dir,
        linked_documents,
        signal_lists,
    )

    configure_logging(LoggingSettings(level="WARNING", json=False))
    inputs = []
    linked: dict[str, tuple[int, int] | None] = {}
    try:
        # What would fail the fit is checked before anything is indexed.
        check_output(_output(output, "fusion"))
        loaded = [load_dataset(root) for root in datasets]
        unseen_loaded = [load_dataset(root) for root in unseen_sets]
        _check_tuning_sets([*loaded, *unseen_loaded])
        unseen = []
        for data in [*loaded, *unseen_loaded]:
            with tempfile.TemporaryDirectory(prefix="attest-eval-") as tmp:
                lists, _ = asyncio.run(
                    signal_lists(
                        data,
                        SIGNAL_NAMES,
                        backend=cast(BackendName, backend),
                        data_dir=Path(tmp),
                        cache_dir=default_cache_dir(data),
                        reuse_lists=reuse_lists,
                    )
                )
            if any(data is u for u in unseen_loaded):
                unseen.append((data.name, lists, data.qrels))
                continue
            inputs.append((data.name, lists, data.qrels))
            linked[data.name] = linked_documents(default_cache_dir(data))
    except DatasetError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        settings, report = tune(inputs, repeats=repeats, progress=repeats > 1, unseen=unseen)
    except (ValueError, DatasetError) as exc:
        raise click.ClickException(str(exc)) from exc
    for name, by_half in report["cross_validated"].items():  # type: ignore[attr-defined]
        for half, f in sorted(by_half.items()):
            click.echo(
                f"{name} half {half} ({f['queries']} queries, fitted on the other half): "
                f"hybrid {f['hybrid']:.4f}  hybrid_kg {f['hybrid_kg']:.4f}  "
                f"tuned {f['tuned']:.4f}  tuned without KG {f['tuned_without_kg']:.4f}  "
                + (
                    f"best with KG {f['tuned_with_kg']:.4f}  "
                    if f["tuned_with_kg"] is not None
                    else "best with KG n/a (no KG lists)  "
                )
                + f"[{_short(f['fitted_on_other_half'])}]"
                + (
                    f"  [with KG: {_short(f['fitted_with_kg_on_other_half'])}]"
                    if f["fitted_with_kg_on_other_half"] is not None
                    else ""
                )
            )
    for name, counts in linked.items():
        if counts is not None:
            # The KG lists are never empty (an article's own text scores), so say
            # how much of the corpus the graph actually reaches.
            click.echo(f"{name}: {counts[0]:,} of {counts[1]:,} documents link to a KG entity")
    for name, pooled in report["paired"].items():  # type: ignore[attr-defined]
        if "differences" not in pooled:
            continue
        with_kg = pooled.get("tuned_with_kg")
        click.echo(
            f"{name} both halves ({pooled['queries']} queries): hybrid {pooled['hybrid']:.4f}  "
            f"tuned {pooled['tuned']:.4f}  "
            + (f"best with KG {with_kg:.4f}  " if with_kg is not None else "")
            + f"without KG {pooled['tuned_without_kg']:.4f}"
        )
        # On standard output, so that a report kept in a file keeps the warning.
        if pooled["queries"] < FEW_QUERIES:
            click.echo(
                f"warning: {name}: {pooled['queries']} queries: read the intervals below as "
                f"rough (a percentile bootstrap on fewer than {FEW_QUERIES} queries runs "
                "narrower than 95 %)"
            )
        for pair, d in pooled["differences"].items():
            low, high = d["ci95"]
            differing = d.get("differing")
            few = differing is not None and 0 < differing < FEW_QUERIES
            click.echo(
                f"  {pair}: {d['mean']:+.4f} (95% bootstrap interval {low:+.4f} to {high:+.4f}"
                + (
                    f"; nDCG@10 differs on {differing} of {pooled['queries']} queries"
                    if differing is not None
                    else ""
                )
                + ")"
                + ("  [rough: the interval rests on those few]" if few else "")
            )
    for name, by_pair in report.get("repeated", {}).items():  # type: ignore[attr-defined]
        for pair, r in by_pair.items():
            click.echo(
                f"{name} over {r['splits']} splits: {pair}: mean {r['mean']:+.4f}, "
                f"from {r['low']:+.4f} to {r['high']:+.4f}, positive on {r['positive']} of them"
            )
    _echo_leave_one_set_out(report)
    for name, row in report["unseen"].items():  # type: ignore[attr-defined]
        rrf = row.get("rrf", 0.0)
        click.echo(
            f"{name} unseen (every family fitted on all the tuning sets): "
            + "  ".join(f"{family} {v:.4f} ({v - rrf:+.4f})" for family, v in row.items())
        )
    click.echo(f"fitted on all ({report['chosen_family']}): {_short(settings.describe())}")
    output = _output(output, "fusion")
    record = {
        **settings.describe(),
        "chosen_family": report["chosen_family"],
        "leave_one_set_out": report["leave_one_set_out"],
        "nested_leave_one_set_out": report["nested_leave_one_set_out"],
        **({"unseen": report["unseen"]} if report["unseen"] else {}),
        "cross_validated": report["cross_validated"],
        "paired": report["paired"],
        **({"repeated": report["repeated"]} if "repeated" in report else {}),
    }
    _write(output, record)
    click.echo(f"wrote {output}")


def _echo_leave_one_set_out(report: Mapping[str, Any]) -> None:
    """Each family fitted on the other sets and scored on the one left out, the
    family chosen from them, and the nested check of that choice."""
    from attest.evaluation.fusion_tune import LOSO_TOLERANCE

    loso = report["leave_one_set_out"]
    if loso is None:
        click.echo(
            "leave-one-set-out: n/a with one data set (give two or more --dataset to choose "
            "the family on sets it was not fitted on); chosen within the set, by halves"
        )
        return
    for name, row in loso.items():
        rrf = row.get("rrf", 0.0)
        click.echo(
            f"{name} left out (fitted on the other sets): "
            + "  ".join(f"{family} {v:.4f} ({v - rrf:+.4f})" for family, v in row.items())
        )
    click.echo(
        f"chosen by leave-one-set-out: {report['chosen_family']} (the best mean over the "
        f"left-out sets of the families that lose at most {LOSO_TOLERANCE} to rrf on every one)"
    )
    for name, n in report["nested_leave_one_set_out"].items():
        click.echo(
            f"{name} left out, the family chosen on the other sets alone ({n['chosen']}): "
            f"{n['ndcg@10']:.4f} against rrf {n['rrf']:.4f} ({n['ndcg@10'] - n['rrf']:+.4f})"
        )


def _check_tuning_sets(sets: Sequence[Dataset]) -> None:
    """The sets can be fitted by halves: distinct names, a corpus, enough queries
    with a positive judgment; judgments of documents the corpus lacks are reported."""
    from attest.evaluation.fusion_tune import MIN_QUERIES
    from attest.evaluation.ir import DatasetError

    seen: dict[str, Path] = {}
    for data in sets:
        first = seen.setdefault(data.name, data.root)
        if first is not data.root:
            if first.resolve() == data.root.resolve():
                raise DatasetError(f"{data.root} is given twice")
            raise DatasetError(
                f"{first} and {data.root} are both named {data.name!r}: figures and fitted "
                "settings are reported by folder name; rename one or link it under another name"
            )
    for data in sets:
        ids = {doc.id for doc in data.corpus()}
        if not ids:
            raise DatasetError(f"{data.corpus_path} holds no documents")
        positive = {
            q
            for q, rels in data.qrels.items()
            if q in data.queries and any(v > 0 for v in rels.values())
        }
        if len(positive) < MIN_QUERIES:
            raise DatasetError(
                f"{data.name}: {len(positive)} queries in queries.jsonl have a positive judgment; "
                f"fitting by halves and choosing a family by halves of those needs at least "
                f"{MIN_QUERIES}"
            )
        warn_unasked(data, "the fit")


def warn_unasked(data: Dataset, left_out_of: str) -> None:
    """Says which judged queries queries.jsonl lacks (``Dataset.unasked``) and
    which judged documents corpus.jsonl lacks (``Dataset.missing_documents``)."""
    if data.missing_documents:
        click.echo(
            f"warning: {data.name}: {data.judgments_of_missing} positive judgments name "
            f"{len(data.missing_documents)} documents that are not in corpus.jsonl (e.g. "
            f"{data.missing_documents[0]!r}); no retriever can find them, so they count "
            "against recall",
            err=True,
        )
    if data.unasked:
        click.echo(
            f"warning: {data.name}: {len(data.unasked)} queries with a positive judgment are "
            f"not in queries.jsonl (e.g. {data.unasked[0]!r}) and are left out of {left_out_of}",
            err=True,
        )


def _short(settings: dict[str, Any]) -> str:
    if settings["method"] == "linear":
        features = settings.get("features", {})
        weights = "; ".join(
            f"{name} " + " ".join(f"{f}={w:+.2f}" for f, w in by.items())
            for name, by in features.items()
        )
    else:
        weights = ", ".join(f"{k}={v:g}" for k, v in settings["weights"].items() if v)
    rescore = f", re-scoring {'/'.join(settings['rescore'])}" if settings["rescore"] else ""
    return f"{settings['method']}: {weights}{rescore}"
