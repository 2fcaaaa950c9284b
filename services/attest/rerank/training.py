"""Training and evaluation of PFiD.

An :class:`Example` is one (query, document) pair with a document label and
one label per passage. Training batches documents of the same passage-count
bucket, uses AdamW with linear warm-up and decay, bf16 autocast and gradient
checkpointing on GPU. Evaluation ranks each query's candidate documents by
the document head and all their passages by the passage head and reports
document MRR@10, Recall@5, Recall@10 and passage MRR@10, nDCG@5, nDCG@10.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import PreTrainedTokenizerBase, get_linear_schedule_with_warmup

from attest.rerank.features import PassageEncoder, group_by_bucket
from attest.rerank.model import PFiD
from attest.rerank.scoring import DocInput, DocScores

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Example:
    query_id: str
    query: str
    doc_id: str
    title: str
    passages: tuple[str, ...]
    label: int
    passage_labels: tuple[int, ...]


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 1
    batch_documents: int = 16
    lr: float = 1e-4
    warmup_fraction: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 13
    device: str = "cpu"
    bf16: bool = False
    gradient_checkpointing: bool = False
    log_every: int = 50


@dataclass
class TrainReport:
    steps: int = 0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)

    @property
    def final_loss(self) -> float:
        tail = self.losses[-20:]
        return sum(tail) / len(tail) if tail else math.nan


def _batches(
    examples: Sequence[Example], batch_documents: int, max_passages: int, rng: random.Random
) -> list[list[int]]:
    order = list(range(len(examples)))
    rng.shuffle(order)
    groups = group_by_bucket([len(examples[i].passages) for i in order], max_passages)
    batches: list[list[int]] = []
    for g in groups:
        idx = [order[i] for i in g]
        batches.extend(idx[s : s + batch_documents] for s in range(0, len(idx), batch_documents))
    rng.shuffle(batches)
    return batches


def train(
    model: PFiD,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Example],
    config: TrainConfig,
    *,
    progress: bool = True,
    on_epoch: Callable[[int], None] | None = None,
) -> TrainReport:
    if not examples:
        raise ValueError("no training examples")
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    device = torch.device(config.device)
    model.to(device).train()
    if config.gradient_checkpointing:
        model.t5.gradient_checkpointing_enable()  # type: ignore[no-untyped-call]
    encoder = PassageEncoder(tokenizer, model.meta.marker_id, model.meta.max_length)
    encoded = {
        i: enc
        for i, enc in enumerate(
            encoder.encode(e.query, e.title, e.passages)
            for e in tqdm(examples, desc="tokenize", unit="doc", disable=not progress)
        )
    }
    max_passages = config.batch_documents * 8
    per_epoch = len(_batches(examples, config.batch_documents, max_passages, random.Random(0)))
    total = per_epoch * config.epochs
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    schedule = get_linear_schedule_with_warmup(  # type: ignore[no-untyped-call]
        optimizer, int(total * config.warmup_fraction), total
    )
    report = TrainReport()
    started = time.perf_counter()
    bar = tqdm(total=total, desc="train", unit="step", disable=not progress)
    for epoch in range(config.epochs):
        model.train()
        for idx in _batches(examples, config.batch_documents, max_passages, rng):
            batch = encoder.collate([encoded[i] for i in idx]).to(device)
            k = batch.passage_mask.shape[1]
            doc_labels = torch.tensor([examples[i].label for i in idx], device=device)
            plabels = torch.zeros((len(idx), k), dtype=torch.long)
            for row, i in enumerate(idx):
                labels = examples[i].passage_labels
                plabels[row, : len(labels)] = torch.tensor(labels, dtype=torch.long)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.bf16):
                out = model(
                    batch.input_ids,
                    batch.attention_mask,
                    batch.passage_mask,
                    doc_labels=doc_labels,
                    passage_labels=plabels.to(device),
                )
            assert out.loss is not None
            optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            schedule.step()
            report.steps += 1
            report.losses.append(float(out.loss.detach()))
            bar.update(1)
            if report.steps % config.log_every == 0:
                bar.set_postfix(loss=f"{report.final_loss:.4f}")
        if on_epoch is not None:
            on_epoch(epoch)
    bar.close()
    report.seconds = time.perf_counter() - started
    model.eval()
    return report


def score_examples(
    score: Callable[[list[tuple[str, DocInput]]], list[DocScores]],
    examples: Sequence[Example],
    batch_documents: int = 64,
    progress: bool = False,
) -> list[DocScores]:
    out: list[DocScores] = []
    items = [(e.query, DocInput(e.title, e.passages)) for e in examples]
    for s in tqdm(
        range(0, len(items), batch_documents), desc="score", unit="batch", disable=not progress
    ):
        out.extend(score(items[s : s + batch_documents]))
    return out


def ranking_metrics(
    examples: Sequence[Example],
    scores: Sequence[DocScores],
    doc_qrels: dict[str, dict[str, int]] | None = None,
) -> dict[str, float]:
    """Document MRR@10/Recall@5/Recall@10 and passage MRR@10/nDCG@5/nDCG@10.

    ``doc_qrels`` (the data set's judgments) makes document metrics count the
    relevant documents the candidates missed, and queries with none found, as
    misses; passage metrics are over the candidates' passages."""
    from attest.evaluation.ir import cutoff_metrics

    doc_qrels_seen: dict[str, dict[str, int]] = {}
    doc_run: dict[str, dict[str, float]] = {}
    psg_qrels: dict[str, dict[str, int]] = {}
    psg_run: dict[str, dict[str, float]] = {}
    for e, s in zip(examples, scores, strict=True):
        doc_qrels_seen.setdefault(e.query_id, {})[e.doc_id] = e.label
        doc_run.setdefault(e.query_id, {})[e.doc_id] = s.score
        for j, (label, ps) in enumerate(zip(e.passage_labels, s.passage_scores, strict=True)):
            pid = f"{e.doc_id}#{j}"
            psg_qrels.setdefault(e.query_id, {})[pid] = label
            psg_run.setdefault(e.query_id, {})[pid] = ps
    if doc_qrels is not None:
        judged = {q: dict(doc_qrels.get(q, {})) for q in doc_run}
        for q, rels in doc_qrels_seen.items():
            judged[q].update({d: v for d, v in rels.items() if d not in judged[q]})
        doc_qrels_seen = judged
    doc = cutoff_metrics(doc_qrels_seen, doc_run, recall_at=(5, 10))
    psg = cutoff_metrics(psg_qrels, psg_run, ndcg_at=(5, 10))
    return {
        "doc_mrr@10": doc["mrr@10"],
        "doc_recall@5": doc["recall@5"],
        "doc_recall@10": doc["recall@10"],
        "passage_mrr@10": psg["mrr@10"],
        "passage_ndcg@5": psg["ndcg@5"],
        "passage_ndcg@10": psg["ndcg@10"],
        "queries": doc["queries"],
    }


def save_checkpoint(
    model: PFiD, tokenizer: PreTrainedTokenizerBase, path: Path, extra: dict[str, object]
) -> None:
    import json

    model.save(path, tokenizer)
    (path / "training.json").write_text(json.dumps(extra, indent=2, default=str) + "\n")
