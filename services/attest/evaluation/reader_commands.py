"""CLI: ``attest train judge`` and ``attest eval judge``."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

DEFAULT_TRAIN = Path("../shared/data/train")
DEFAULT_HOTPOT = Path("../shared/data/qa/hotpotqa_dev/qa.jsonl")


def _pair_data(command: Callable[..., None]) -> Callable[..., None]:
    """--data and --hotpot: where the training pairs come from."""
    command = click.option(
        "--hotpot",
        type=click.Path(path_type=Path),
        default=DEFAULT_HOTPOT,
        show_default=True,
        help="HotpotQA development questions: in-domain pairs from their even half. "
        "'none' leaves them out.",
    )(command)
    return click.option(
        "--data",
        "train_root",
        type=click.Path(path_type=Path),
        default=DEFAULT_TRAIN,
        show_default=True,
        help="Folder of the public training sets (selqa, qnli, snli, fever_symmetric).",
    )(command)


@click.group(name="train")
def train_group() -> None:
    """Train the models Attest ships (on this machine, from public labelled data)."""


@train_group.command(name="judge")
@_pair_data
@click.option(
    "--work-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path(".attest/train/judge"),
    show_default=True,
    help="Checkpoints and metrics; a run with the same folder resumes where it stopped.",
)
@click.option(
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Where the int8 ONNX model is written (default <work-dir>/reader-int8.onnx; "
    "the shipped file is services/attest/generate/reader-int8.onnx).",
)
@click.option(
    "--seed",
    type=int,
    default=13,
    show_default=True,
    help="Random seed of initialisation, shuffling and sampling.",
)
@click.option(
    "--epochs",
    type=click.IntRange(1, 20),
    default=1,
    show_default=True,
    help="Passes over the training pairs.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 512),
    default=32,
    show_default=True,
    help="Pairs per training step.",
)
@click.option(
    "--learning-rate",
    type=click.FloatRange(1e-7, 1e-2),
    default=5e-5,
    show_default=True,
    help="Peak learning rate (AdamW).",
)
@click.option(
    "--max-steps",
    type=click.IntRange(1),
    default=None,
    help="Stop after this many steps in all (checkpointed; run again to go on).",
)
@click.option(
    "--made-negatives",
    is_flag=True,
    help="Add the made negatives (questions swapped, 1,500 a set; facts swapped, 3,000).",
)
@click.option(
    "--init-from",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=None,
    help="Start from this checkpoint (an earlier --work-dir's checkpoint.pt): a second "
    "stage on --replay pairs of the first stage's data, with the made negatives and their "
    "positives (--made-negatives) and the keyword copies (--keyword-questions).",
)
@click.option(
    "--keyword-questions",
    type=click.FloatRange(0.0, 1.0),
    default=0.0,
    show_default=True,
    help="Share of the answer groups that also train with their question typed as a keyword "
    "query ('chair Marrowgate Bank' for 'Who is the new chair of Marrowgate Bank?').",
)
@click.option(
    "--replay",
    type=click.IntRange(0),
    default=4000,
    show_default=True,
    help="With --init-from: pairs of the first stage's data kept in the second.",
)
@click.option(
    "--threads",
    type=click.IntRange(1, 256),
    default=None,
    help="Torch threads (default: torch's own choice).",
)
def train_judge(
    train_root: Path,
    hotpot: Path,
    work_dir: Path,
    output: Path | None,
    seed: int,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    max_steps: int | None,
    made_negatives: bool,
    init_from: Path | None,
    keyword_questions: float,
    replay: int,
    threads: int | None,
) -> None:
    """Fine-tune the reader (answer and support outputs) from the packaged MiniLM encoder.

    Held-out pairs (one question, premise or claim in ten, by a hash) are
    scored with the exported int8 file at the end and written with the run's
    settings to <work-dir>/metrics.json, which the model card quotes.
    """
    import torch
    from tqdm import tqdm

    from attest.evaluation.reader_data import PairDataError
    from attest.evaluation.train_reader import TrainConfig, train

    if threads:
        torch.set_num_threads(threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    config = TrainConfig(
        seed=seed,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        question_swaps_per_set=1500 if made_negatives else 0,
        fact_swaps=3000 if made_negatives else 0,
        replay=replay if init_from is not None else None,
        keyword_share=keyword_questions,
    )
    output = output or work_dir / "reader-int8.onnx"
    for where in (output.parent, work_dir):
        blocked = next((a for a in (where, *where.parents) if a.exists() and not a.is_dir()), None)
        if blocked is not None:
            raise click.ClickException(f"{where}: {blocked} is a file, not a folder")
    bar: Any = None

    def progress(step: int, total: int, loss: float, rate: float) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, initial=step - 1, unit="step", file=sys.stderr)
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", pairs_s=f"{rate:.1f}")

    try:
        metrics = train(
            train_root,
            None if str(hotpot) == "none" else hotpot,
            work_dir,
            output,
            config,
            progress=progress,
            max_steps=max_steps,
            init_from=init_from,
        )
    except (PairDataError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        if bar is not None:
            bar.close()
    if "stopped_at_step" in metrics:
        click.echo(
            f"stopped at step {metrics['stopped_at_step']} of {metrics['steps']}; "
            f"checkpoint in {work_dir} (run the same command to go on)"
        )
        return
    digest = hashlib.sha256(output.read_bytes()).hexdigest()
    click.echo(
        f"{output}: {output.stat().st_size / 1e6:.1f} MB, sha256 {digest}; "
        f"{metrics['train_pairs']} pairs, {metrics['pairs_per_second']} pairs/s, "
        f"{metrics['train_seconds']:.0f} s"
    )
    for name, m in metrics["held_out"].items():
        click.echo(f"held-out {name}: " + _fmt(m))


def _fmt(m: dict[str, float]) -> str:
    parts = [f"pairs={int(m['pairs'])}", f"AUROC={m['auroc']:.3f}"]
    if m.get("groups"):
        parts += [
            f"groups={int(m['groups'])}",
            f"MAP={m['map']:.3f}",
            f"MRR={m['mrr']:.3f}",
            f"P@1={m['p_at_1']:.3f}",
        ]
    return " ".join(parts)


@click.command(name="judge")
@click.option(
    "--dataset",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="JSONL of pairs: id, task (answer|support), question or source, sentence, "
    "label (0|1), group (optional).",
)
@click.option(
    "--scorer",
    type=click.Choice(["reader", "cosine", "both"]),
    default="both",
    show_default=True,
    help="The shipped reader, MiniLM cosine between the two texts, or both side by side.",
)
@click.option(
    "--model",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="A reader file other than the shipped one.",
)
@click.option(
    "--scores-out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help='Write one {"id", "score"} line per pair (the reader\'s, else cosine\'s).',
)
def eval_judge(dataset: Path, scorer: str, model: Path | None, scores_out: Path | None) -> None:
    """Score labelled pairs: AUROC over pairs, MAP/MRR/P@1 over groups, per task."""
    from attest.evaluation.judge_eval import JudgePairsError, ranking_metrics, read_pairs
    from attest.generate.reader import MODEL_FILE, Reader, ReaderUnavailable, source_window

    try:
        pairs = read_pairs(dataset)
    except JudgePairsError as exc:
        raise click.ClickException(str(exc)) from exc
    if scores_out is not None:
        blocked = next((a for a in scores_out.parents if a.exists() and not a.is_dir()), None)
        if scores_out.is_dir() or blocked is not None:
            raise click.ClickException(f"--scores-out {scores_out}: not a file path")
        if scores_out.resolve() == dataset.resolve():
            raise click.ClickException("--scores-out is the --dataset file; name another")
    results: dict[str, dict[str, dict[str, float]]] = {}
    written: list[float] | None = None
    if scorer in ("reader", "both"):
        try:
            reader = Reader(model or MODEL_FILE, threads=os.cpu_count() or 1)
        except ReaderUnavailable as exc:
            raise click.ClickException(str(exc)) from exc
        scores = list(
            reader.score_pairs(
                [
                    (
                        "answer" if p.task == "answer" else "support",
                        p.first if p.task == "answer" else source_window(p.first, p.sentence),
                        p.sentence,
                    )
                    for p in pairs
                ]
            )
        )
        results["reader"] = _per_task(pairs, scores, ranking_metrics)
        written = scores
    if scorer in ("cosine", "both"):
        scores = _cosine(pairs)
        results["cosine"] = _per_task(pairs, scores, ranking_metrics)
        written = written if written is not None else scores
    for name, by_task in results.items():
        for task, m in by_task.items():
            click.echo(f"{name:<7} {task:<8} " + _fmt(m))
    if scores_out is not None and written is not None:
        try:
            scores_out.parent.mkdir(parents=True, exist_ok=True)
            with scores_out.open("w", encoding="utf-8") as f:
                for p, s in zip(pairs, written, strict=True):
                    f.write(json.dumps({"id": p.id, "score": round(float(s), 6)}) + "\n")
        except OSError as exc:
            raise click.ClickException(f"--scores-out {scores_out}: {exc.strerror}") from exc
        click.echo(f"scores: {scores_out}")


def _per_task(pairs: list[Any], scores: list[float], metric: Any) -> dict[str, dict[str, float]]:
    out = {}
    for task in ("answer", "support"):
        idx = [i for i, p in enumerate(pairs) if p.task == task]
        if idx:
            out[task] = metric(
                [pairs[i].label for i in idx],
                [scores[i] for i in idx],
                [pairs[i].group for i in idx],
            )
    return out


def _cosine(pairs: list[Any]) -> list[float]:
    """MiniLM cosine between the question (or source) and the sentence."""
    import numpy as np

    from attest.semantic.embedding import Embedder

    texts = sorted({p.first for p in pairs} | {p.sentence for p in pairs})
    vectors = np.asarray(Embedder().encode(texts), dtype=np.float64)
    index = {t: i for i, t in enumerate(texts)}
    return [float(vectors[index[p.first]] @ vectors[index[p.sentence]]) for p in pairs]


@train_group.command(name="judge-splits")
@_pair_data
@click.option(
    "--output-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path(".attest/train/held-out"),
    show_default=True,
    help="Where the held-out JSONL files are written.",
)
def judge_splits(train_root: Path, hotpot: Path, output_dir: Path) -> None:
    """Write each set's held-out pairs (never trained on) as JSONL for `attest eval judge`.

    Beside the held-out split of each set, the pairs of HotpotQA's odd half
    (``hotpotqa_odd-*``), whose questions training never reads at all."""
    from attest.evaluation.reader_data import (
        PairDataError,
        hotpot_pairs,
        keyword_groups,
        load_pairs,
        split,
    )
    from attest.evaluation.train_reader import keyword_held_out, made_held_out

    try:
        pairs = load_pairs(train_root, None if str(hotpot) == "none" else hotpot)
    except PairDataError as exc:
        raise click.ClickException(str(exc)) from exc
    _, held = split(pairs)
    by: dict[str, list[Any]] = {}
    for p in held:
        by.setdefault(f"{p.dataset}-{p.task}", []).append(p)
    for p in made_held_out(held, seed=13):
        base, kind = p.dataset.split("+")
        by.setdefault(f"{base}-{p.task if kind == 'qswap' else 'support'}+{kind}", []).append(p)
    for p in keyword_held_out(held, seed=13):
        by.setdefault(f"{p.dataset.removesuffix('+kw')}-answer+kw", []).append(p)
    if str(hotpot) != "none":
        odd = list(hotpot_pairs(hotpot, half="odd"))
        for p in odd:
            by.setdefault(f"hotpotqa_odd-{p.task}", []).append(p)
        for p in keyword_groups(odd, 1.0, seed=13):
            by.setdefault("hotpotqa_odd-answer+kw", []).append(p)
    output_dir.mkdir(parents=True, exist_ok=True)
    for name, rows in sorted(by.items()):
        path = output_dir / f"{name}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for p in rows:
                f.write(json.dumps(p.to_json(), ensure_ascii=False) + "\n")
        positives = sum(p.label for p in rows)
        click.echo(f"{path}: {len(rows)} pairs ({positives} positive)")
