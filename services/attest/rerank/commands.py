"""``attest pfid train`` and ``attest pfid eval``."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click

from attest.evaluation.ir import Dataset, DatasetError, load_dataset

METRICS = (
    "doc_mrr@10",
    "doc_recall@5",
    "doc_recall@10",
    "passage_mrr@10",
    "passage_ndcg@5",
    "passage_ndcg@10",
)


def _device(name: str) -> str:
    from attest.rerank.rerankers import resolve_device

    try:
        return resolve_device(name)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--device") from exc


def _dataset(path: Path, split: str) -> Dataset:
    try:
        return load_dataset(path, split)
    except DatasetError as exc:
        raise click.BadParameter(str(exc), param_hint="--data") from exc


def _print_metrics(title: str, metrics: dict[str, float]) -> None:
    click.echo(f"\n{title} ({int(metrics['queries'])} queries)")
    for name in METRICS:
        click.echo(f"  {name:<16} {metrics[name]:.4f}")


@click.group()
def pfid() -> None:
    """Train and evaluate the PFiD reranker."""


@pfid.command()
@click.option(
    "--data",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    required=True,
    help="A BEIR folder (corpus.jsonl, queries.jsonl, qrels/) or a MIRACL-style one.",
)
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Checkpoint dir.")
@click.option(
    "--base",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    default=None,
    help="A T5 model directory (weights, config and tokenizer) to start from.",
)
@click.option("--tiny", is_flag=True, help="Random-init d_model 64 T5 with a byte tokenizer.")
@click.option("--qrels-split", default="test", show_default=True, help="qrels/<split>.tsv")
@click.option(
    "--epochs",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Passes over the training examples.",
)
@click.option(
    "--batch-documents",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="Documents per training step.",
)
@click.option(
    "--lr",
    type=click.FloatRange(0, min_open=True),
    default=1e-4,
    show_default=True,
    help="Peak learning rate (AdamW).",
)
@click.option(
    "--warmup",
    type=click.FloatRange(0, 1),
    default=0.1,
    show_default=True,
    help="Share of the steps spent warming the learning rate up.",
)
@click.option(
    "--negatives",
    type=click.IntRange(0),
    default=7,
    show_default=True,
    help="BM25 hard negatives per query (non-relevant candidates).",
)
@click.option(
    "--candidates",
    type=click.IntRange(1),
    default=100,
    show_default=True,
    help="BM25 candidates per query that negatives are drawn from.",
)
@click.option(
    "--max-queries",
    type=click.IntRange(1),
    default=None,
    help="Use at most this many queries (default: all).",
)
@click.option(
    "--max-length",
    type=click.IntRange(8),
    default=200,
    show_default=True,
    help="Tokens per query-and-passage input.",
)
@click.option(
    "--max-passages",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="Passages per document.",
)
@click.option(
    "--device",
    default="auto",
    show_default=True,
    help="auto (cuda when present), cpu, cuda or cuda:N.",
)
@click.option(
    "--seed",
    type=int,
    default=13,
    show_default=True,
    help="Random seed of initialisation and shuffling.",
)
def train(
    data: Path,
    out: Path,
    base: Path | None,
    tiny: bool,
    qrels_split: str,
    epochs: int,
    batch_documents: int,
    lr: float,
    warmup: float,
    negatives: int,
    candidates: int,
    max_queries: int | None,
    max_length: int,
    max_passages: int,
    device: str,
    seed: int,
) -> None:
    """Train PFiD on the train split of the queries (80 %, by a hash of the id).

    Relevant documents are positives, BM25 candidates that are not relevant are
    negatives. AdamW with linear warm-up; on GPU, bf16 autocast and gradient
    checkpointing. The checkpoint holds the T5 weights, the tokenizer, the
    passage head and pfid.json.
    """
    if (base is None) == (not tiny):
        raise click.UsageError("give exactly one of --base PATH or --tiny")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoTokenizer, ByT5Tokenizer, PreTrainedTokenizerBase

    from attest.rerank.data import build_examples
    from attest.rerank.model import PFiD, tiny_config
    from attest.rerank.training import TrainConfig, save_checkpoint
    from attest.rerank.training import train as run_training

    dev = _device(device)
    dataset = _dataset(data, qrels_split)
    examples = build_examples(
        dataset,
        split="train",
        candidates=candidates,
        negatives=negatives,
        max_queries=max_queries,
        max_passages=max_passages,
    )
    if not examples:
        raise click.UsageError(f"{data}: no training examples (no judged queries in the split)")
    positives = sum(e.label for e in examples)
    click.echo(f"{len(examples)} training documents ({positives} relevant) from {data}")
    torch.manual_seed(seed)
    tokenizer: PreTrainedTokenizerBase
    if tiny:
        tokenizer = ByT5Tokenizer()
        model = PFiD.from_config(tiny_config(len(tokenizer)), tokenizer, max_length=max_length)
    else:
        assert base is not None
        tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
        model = PFiD.from_base(base, tokenizer, max_length=max_length)
    on_gpu = dev.startswith("cuda")
    config = TrainConfig(
        epochs=epochs,
        batch_documents=batch_documents,
        lr=lr,
        warmup_fraction=warmup,
        seed=seed,
        device=dev,
        bf16=on_gpu,
        gradient_checkpointing=on_gpu,
    )
    report = run_training(model, tokenizer, examples, config, progress=sys.stderr.isatty())
    save_checkpoint(
        model,
        tokenizer,
        out,
        {
            "data": str(data),
            "examples": len(examples),
            "steps": report.steps,
            "seconds": round(report.seconds, 1),
            "final_loss": report.final_loss,
            "config": config.__dict__,
            "trained_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
    )
    click.echo(
        f"trained {report.steps} steps in {report.seconds:.1f} s on {dev}; "
        f"loss {report.losses[0]:.4f} -> {report.final_loss:.4f}; checkpoint {out}"
    )


@pfid.command(name="eval")
@click.option(
    "--data",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    required=True,
    help="The BEIR or MIRACL-style folder the checkpoint was trained on.",
)
@click.option(
    "--checkpoint",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    required=True,
    help="A checkpoint directory written by `attest pfid train`.",
)
@click.option("--qrels-split", default="test", show_default=True, help="qrels/<split>.tsv")
@click.option(
    "--split",
    type=click.Choice(["heldout", "train", "all"]),
    default="heldout",
    show_default=True,
    help="Which queries: the 20 % held out of training (default), the rest, or all.",
)
@click.option(
    "--candidates",
    type=click.IntRange(1),
    default=100,
    show_default=True,
    help="BM25 candidates reranked per query.",
)
@click.option(
    "--max-queries",
    type=click.IntRange(1),
    default=None,
    help="Evaluate at most this many queries (default: all).",
)
@click.option(
    "--max-passages",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="Passages per document.",
)
@click.option(
    "--device",
    default="auto",
    show_default=True,
    help="auto (cuda when present), cpu, cuda or cuda:N.",
)
@click.option(
    "--batch-documents",
    type=click.IntRange(1),
    default=32,
    show_default=True,
    help="Documents scored per forward pass.",
)
@click.option(
    "--json-out",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write the metrics to this JSON file.",
)
def evaluate(
    data: Path,
    checkpoint: Path,
    qrels_split: str,
    split: str,
    candidates: int,
    max_queries: int | None,
    max_passages: int,
    device: str,
    batch_documents: int,
    json_out: Path | None,
) -> None:
    """Rerank the BM25 top candidates of the held-out queries and report
    document MRR@10, Recall@5, Recall@10 and passage MRR@10, nDCG@5, nDCG@10,
    next to BM25's own document order."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from attest.rerank.data import build_examples
    from attest.rerank.model import CheckpointError
    from attest.rerank.scoring import DocScores, PFiDScorer
    from attest.rerank.training import ranking_metrics, score_examples

    dev = _device(device)
    try:
        scorer = PFiDScorer.from_checkpoint(checkpoint, device=dev)
    except CheckpointError as exc:
        raise click.BadParameter(str(exc), param_hint="--checkpoint") from exc
    dataset = _dataset(data, qrels_split)
    examples = build_examples(
        dataset,
        split=split,  # type: ignore[arg-type]
        candidates=candidates,
        max_queries=max_queries,
        max_passages=max_passages,
    )
    if not examples:
        raise click.UsageError("no evaluation examples (no judged queries in the split)")
    started = time.perf_counter()
    scores = score_examples(scorer, examples, batch_documents, progress=sys.stderr.isatty())
    seconds = time.perf_counter() - started
    # Document-level judgments (passage ids "<doc>#<n>" count for their document).
    doc_qrels: dict[str, dict[str, int]] = {}
    for qid, rels in dataset.qrels.items():
        per_doc = doc_qrels.setdefault(qid, {})
        for key, value in rels.items():
            doc = key.rpartition("#")[0] if "#" in key else key
            per_doc[doc] = max(value, per_doc.get(doc, 0))
    metrics = ranking_metrics(examples, scores, doc_qrels)
    # BM25's order as the baseline: score by reciprocal BM25 rank, passages in order.
    rank: dict[str, int] = {}
    baseline: list[DocScores] = []
    for e in examples:
        rank[e.query_id] = rank.get(e.query_id, 0) + 1
        n = len(e.passages)
        baseline.append(
            DocScores(
                1.0 / rank[e.query_id],
                tuple(1.0 / (rank[e.query_id] * 100 + j + 1) for j in range(n)),
                (False,) * n,
            )
        )
    bm25 = ranking_metrics(examples, baseline, doc_qrels)
    _print_metrics(f"PFiD {checkpoint} on {data} ({split} queries)", metrics)
    _print_metrics("BM25 order (baseline)", bm25)
    queries = int(metrics["queries"])
    click.echo(
        f"\n{len(examples)} documents scored in {seconds:.1f} s on {dev} "
        f"({seconds / max(queries, 1) * 1000:.0f} ms per query)"
    )
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(
            json.dumps({"pfid": metrics, "bm25": bm25, "seconds": seconds, "device": dev}, indent=2)
            + "\n"
        )
