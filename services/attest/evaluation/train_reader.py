"""``attest train judge``: fine-tune the reader, export it as int8 ONNX, write its card.

The reader is the packaged all-MiniLM-L6-v2 encoder with one linear layer of
two outputs over its mean-pooled tokens: output 0 is *answer* (read from
question + sentence), output 1 is *support* (source + sentence). A pair
trains only its own task's output (binary cross-entropy); both share the
encoder.

Training is seeded and deterministic in its order: the pairs are shuffled
per epoch with ``seed + epoch``, cut into batches of similar length (little
padding: most pairs are short) and the batches shuffled again. A checkpoint
(weights, optimizer, schedule, step) is written every ``checkpoint_every``
steps and at each epoch's end; a run with the same work folder resumes from
it at the next batch. The end of training exports the model as ONNX, with
int8 weights (``quantize_dynamic``, embeddings included, so the file is
about a quarter of the float one), scores the held-out pairs with the
exported file, and writes ``metrics.json`` for the model card.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attest.evaluation.reader_data import (
    Pair,
    fact_swaps,
    keyword_groups,
    load_pairs,
    question_swaps,
    split,
)
from attest.generate.reader import MAX_TOKENS, Reader, encoder_path

log = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Everything a training run depends on besides the data (recorded in the card)."""

    seed: int = 13
    epochs: int = 1
    batch_size: int = 32
    learning_rate: float = 5e-5
    warmup_share: float = 0.06
    weight_decay: float = 0.01
    checkpoint_every: int = 200
    # Negatives of answer-sentence selection kept per question (SelQA has nine
    # to ten, QNLI one to a few): the rest adds time more than signal. HotpotQA's
    # ten passages give the hard negatives (answer-like sentences of the wrong
    # passage, the bridge sentence), so more of them are kept.
    max_negatives_per_group: int = 3
    max_hotpot_negatives_per_group: int = 24
    # SNLI pairs kept (one in two): 10,000 entailment pairs teach what they can
    # about "states"; the in-domain pairs are few and need the steps.
    snli_share: float = 0.5
    # Made negatives (``reader_data``): questions swapped per set, facts swapped.
    # Off in the shipped model (see its card); ``--made-negatives`` turns them on.
    question_swaps_per_set: int = 0
    fact_swaps: int = 0
    # A second stage (``--init-from``): pairs of the first stage's data kept.
    replay: int | None = None
    # Answer groups that also train with their question typed as a keyword
    # query (``reader_data.keyword_groups``); 0 in the first stage.
    keyword_share: float = 0.0


def reader_head(encoder: Path) -> Any:
    """The encoder with the reader's two-output layer over its mean-pooled tokens."""
    import torch
    from transformers import AutoModel

    class ReaderHead(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = AutoModel.from_pretrained(str(encoder))
            self.head = torch.nn.Linear(self.encoder.config.hidden_size, 2)

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            hidden = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
            return self.head(pooled)

    return ReaderHead()


def _sample(pairs: Sequence[Pair], config: TrainConfig) -> list[Pair]:
    """Training pairs with the negatives per answer-task group and the share
    of SNLI that ``config`` keeps, chosen by the seed."""
    rng = random.Random(config.seed)
    by_group: dict[tuple[str, str], list[Pair]] = {}
    out: list[Pair] = []
    for p in pairs:
        if p.task == "answer" and p.label == 0:
            by_group.setdefault((p.dataset, p.group), []).append(p)
        elif p.dataset != "snli" or rng.random() < config.snli_share:
            out.append(p)
    for key in sorted(by_group):
        negatives = by_group[key]
        rng.shuffle(negatives)
        cap = (
            config.max_hotpot_negatives_per_group
            if key[0] == "hotpotqa"
            else config.max_negatives_per_group
        )
        out.extend(negatives[:cap])
    return out


def _batches(lengths: Sequence[int], batch_size: int, seed: int) -> list[list[int]]:
    """Indices in batches of similar length, order fixed by ``seed``."""
    rng = random.Random(seed)
    order = list(range(len(lengths)))
    rng.shuffle(order)
    chunk = batch_size * 50
    batches: list[list[int]] = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start : start + chunk], key=lambda i: lengths[i])
        batches.extend(part[i : i + batch_size] for i in range(0, len(part), batch_size))
    rng.shuffle(batches)
    return batches


def train(
    train_root: Path,
    hotpot: Path | None,
    work_dir: Path,
    output: Path,
    config: TrainConfig,
    *,
    progress: Callable[[int, int, float, float], None] | None = None,
    max_steps: int | None = None,
    init_from: Path | None = None,
) -> dict[str, Any]:
    """Train (resuming from ``work_dir``), export to ``output``, return the metrics."""
    import torch
    from tokenizers import Tokenizer

    random.seed(config.seed)
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    work_dir.mkdir(parents=True, exist_ok=True)

    pairs = load_pairs(train_root, hotpot)
    train_pairs, held = split(pairs)
    made: list[Pair] = []
    if config.question_swaps_per_set:
        made += question_swaps(train_pairs, config.seed, config.question_swaps_per_set)
    if config.fact_swaps:
        made += fact_swaps(train_pairs, config.seed, config.fact_swaps)
    held = held + made_held_out(held, config.seed) + keyword_held_out(held, config.seed)
    base = _sample(train_pairs, config)
    if config.replay is not None:
        # A second stage from an earlier model: the made negatives, the
        # positives they were made from, and ``replay`` pairs of the first
        # stage's data, so it learns the new pairs without forgetting.
        by_id = {p.id: p for p in train_pairs}
        positives = []
        for p in made:
            kind = "qswap" if p.id.endswith("-qswap") else "fswap"
            original = by_id[p.id.removesuffix(f"-{kind}")]
            if kind == "fswap" and original.task == "answer":
                original = Pair(
                    original.id,
                    "support",
                    original.sentence,
                    original.sentence,
                    1,
                    original.group,
                    original.dataset,
                )
            positives.append(original)
        rng = random.Random(config.seed)
        base = rng.sample(base, min(config.replay, len(base))) + positives
    train_pairs = base + made + keyword_groups(base, config.keyword_share, config.seed)
    tokenizer = Tokenizer.from_file(str(encoder_path() / "tokenizer.json"))
    encodings = _encode(tokenizer, train_pairs)
    lengths = [len(e[0]) for e in encodings]

    model = reader_head(encoder_path())
    if init_from is not None:
        try:
            start = torch.load(init_from, map_location="cpu", weights_only=True)
            model.load_state_dict(start.get("model", start))
        except Exception as exc:
            raise ValueError(f"--init-from {init_from}: not a reader checkpoint ({exc})") from exc
    model.train()
    no_decay = ("bias", "LayerNorm.weight", "norm.weight")
    groups = [
        {
            "params": [p for n, p in model.named_parameters() if not n.endswith(no_decay)],
            "weight_decay": config.weight_decay,
        },
        {
            "params": [p for n, p in model.named_parameters() if n.endswith(no_decay)],
            "weight_decay": 0.0,
        },
    ]
    optimizer = torch.optim.AdamW(groups, lr=config.learning_rate)
    per_epoch = math.ceil(len(train_pairs) / config.batch_size)
    total = per_epoch * config.epochs
    warmup = max(1, int(total * config.warmup_share))

    def rate(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    step, seconds, seen = 0, 0.0, 0
    checkpoint = work_dir / CHECKPOINT
    if checkpoint.is_file():
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        if state["config"] != asdict(config) or state["pairs"] != len(train_pairs):
            raise ValueError(
                f"{checkpoint} is from another configuration or data; "
                "use another --work-dir or delete it"
            )
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        step, seconds, seen = state["step"], state["seconds"], state["seen"]
        log.info("resuming at step %d of %d", step, total)

    def save() -> None:
        tmp = checkpoint.with_suffix(".tmp")
        torch.save(
            {
                "config": asdict(config),
                "pairs": len(train_pairs),
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "schedule": schedule.state_dict(),
                "step": step,
                "seconds": seconds,
                "seen": seen,
            },
            tmp,
        )
        tmp.replace(checkpoint)

    labels = torch.tensor([p.label for p in train_pairs], dtype=torch.float32)
    tasks = torch.tensor([0 if p.task == "answer" else 1 for p in train_pairs])
    loss_fn = torch.nn.BCEWithLogitsLoss()
    stop = total if max_steps is None else min(total, max_steps)
    while step < stop:
        epoch, offset = divmod(step, per_epoch)
        batches = _batches(lengths, config.batch_size, config.seed + epoch)
        for batch in batches[offset:]:
            if step >= stop:
                break
            started = time.perf_counter()
            ids, types, mask = _pad([encodings[i] for i in batch])
            logits = model(ids, mask, types)
            index = torch.tensor(batch)
            chosen = logits.gather(1, tasks[index].unsqueeze(1)).squeeze(1)
            loss = loss_fn(chosen, labels[index])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
            step += 1
            seen += len(batch)
            seconds += time.perf_counter() - started
            if progress is not None:
                progress(step, total, float(loss.detach()), seen / max(seconds, 1e-9))
            if step % config.checkpoint_every == 0:
                save()
        else:
            save()
    if step < total:
        save()
        return {"stopped_at_step": step, "steps": total}

    model.eval()
    export(model, output)
    reader = Reader(output, threads=os.cpu_count() or 1)
    metrics = {
        "config": asdict(config),
        "train_pairs": len(train_pairs),
        "held_out_pairs": len(held),
        "steps": total,
        "train_seconds": round(seconds, 1),
        "pairs_per_second": round(seen / max(seconds, 1e-9), 2),
        "held_out": score_held_out(reader, held),
    }
    (work_dir / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    return metrics


def _encode(tokenizer: Any, pairs: Sequence[Pair]) -> list[tuple[list[int], list[int]]]:
    out = []
    for p in pairs:
        limit = MAX_TOKENS[p.task]
        tokenizer.enable_truncation(limit, strategy="longest_first")
        e = tokenizer.encode(p.first, p.sentence)
        out.append((list(e.ids), list(e.type_ids)))
    return out


def _pad(rows: Sequence[tuple[list[int], list[int]]]) -> tuple[Any, Any, Any]:
    import torch

    width = max(len(r[0]) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    types = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for i, (a, t) in enumerate(rows):
        ids[i, : len(a)] = torch.tensor(a)
        types[i, : len(t)] = torch.tensor(t)
        mask[i, : len(a)] = 1
    return ids, types, mask


def export(model: Any, output: Path) -> None:
    """``model`` as ONNX with int8 weights at ``output`` (whole file or none)."""
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    output.parent.mkdir(parents=True, exist_ok=True)
    plain = output.with_name(f"{output.name}.{os.getpid()}.fp32")
    tmp = output.with_name(f"{output.name}.{os.getpid()}.tmp")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    sample = (
        torch.tensor([[101, 2054, 102, 2023, 102], [101, 2054, 102, 0, 0]]),
        torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
        torch.tensor([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]),
    )
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                model,
                sample,
                str(plain),
                input_names=names,
                output_names=["logits"],
                dynamic_axes={
                    **{n: {0: "batch", 1: "tokens"} for n in names},
                    "logits": {0: "batch"},
                },
                opset_version=17,
                dynamo=False,
            )
        quantize_dynamic(
            plain,
            tmp,
            weight_type=QuantType.QInt8,
            per_channel=True,
            op_types_to_quantize=["MatMul", "Gather"],
        )
        tmp.replace(output)
    finally:
        plain.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)


def made_held_out(held: Sequence[Pair], seed: int) -> list[Pair]:
    """The made negatives of the held-out pairs beside the positives they were
    made from, as sets of their own (``<set>+qswap``, ``<set>+fswap``): how
    well the reader tells an answer from a look-alike, a stated fact from a
    swapped one."""
    from dataclasses import replace

    by_id = {p.id: p for p in held}
    out: list[Pair] = []
    for kind, made in (
        ("qswap", question_swaps(held, seed, 10_000)),
        ("fswap", fact_swaps(held, seed, 10_000)),
    ):
        for p in made:
            name = f"{p.dataset}+{kind}"
            original = by_id[p.id.removesuffix(f"-{kind}")]
            if kind == "qswap":
                positive = replace(original, dataset=name)
            else:  # the sentence as its source states (an answer pair's own sentence)
                positive = replace(
                    original,
                    task="support",
                    first=p.first,
                    dataset=name,
                )
            out += [positive, replace(p, dataset=name)]
    return out


def keyword_held_out(held: Sequence[Pair], seed: int) -> list[Pair]:
    """Every held-out answer pair with its question typed as a keyword query, as
    a set of its own (``<set>+kw``): how well the reader reads search queries."""
    from dataclasses import replace

    return [
        replace(p, dataset=f"{p.dataset}+kw")
        for p in keyword_groups([p for p in held if "+" not in p.dataset], 1.0, seed)
    ]


def score_held_out(reader: Reader, pairs: Sequence[Pair]) -> dict[str, dict[str, float]]:
    """Per held-out set and task: AUROC over pairs, MAP / MRR / P@1 over groups."""
    from attest.evaluation.judge_eval import ranking_metrics

    by: dict[str, list[Pair]] = {}
    for p in pairs:
        by.setdefault(f"{p.dataset}/{p.task}", []).append(p)
    out: dict[str, dict[str, float]] = {}
    for name, group in sorted(by.items()):
        scores = reader.score_pairs([(p.task, p.first, p.sentence) for p in group])
        out[name] = ranking_metrics(
            [p.label for p in group], list(scores), [p.group for p in group]
        )
    return out
