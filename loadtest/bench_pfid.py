"""PFiD reranking latency and throughput (the model's own cost, no RPC).

Workload per query, as in the PFiD paper's timing: 100 candidate documents,
each with 1 to 8 passages (uniform, seeded; ``--fixed-passages`` makes every
document 8), every passage 200 tokens. The model is a randomly initialised
T5-base-sized PFiD (or ``--tiny``, d_model 64, for a CPU smoke run); token
ids are random, which costs the same as text. Documents are grouped by
passage-count bucket exactly as the service does (features.group_by_bucket),
and queries are batched together ``--batch-sizes`` at a time, as the service's
micro-batcher does under concurrent load.

Needs only torch, transformers and safetensors; run from the repository root:

    PYTHONPATH=services python loadtest/bench_pfid.py --device cuda
    PYTHONPATH=services python loadtest/bench_pfid.py --device cpu --tiny --queries 2

Reports, per batch size: ms per query (p50, p99 over batches, divided by the
batch size), queries/s, and peak GPU memory; ``--json-out`` writes them.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

from attest.rerank.features import EncodedDocument, PassageEncoder, group_by_bucket
from attest.rerank.model import PFiD, PFiDMeta, base_config, tiny_config

PAPER_SECONDS_PER_QUERY = 1.23  # A100, from the PFiD paper
TARGET_SECONDS_PER_QUERY = 0.15


class _RandomIds:
    """Stands in for a tokenizer when collating random ids (pad 0, end 1)."""

    eos_token_id = 1
    pad_token_id = 0


def make_queries(
    n: int, docs: int, max_passages: int, tokens: int, vocab: int, fixed: bool, seed: int
) -> list[list[EncodedDocument]]:
    rng = random.Random(seed)
    out: list[list[EncodedDocument]] = []
    for _ in range(n):
        query: list[EncodedDocument] = []
        for _ in range(docs):
            k = max_passages if fixed else rng.randint(1, max_passages)
            passages = tuple(
                (2, *(rng.randrange(100, vocab) for _ in range(tokens - 2)), 1) for _ in range(k)
            )
            query.append(EncodedDocument(passages, (False,) * k))
        out.append(query)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    config = tiny_config(384) if args.tiny else base_config()
    meta = PFiDMeta(true_id=10, false_id=11, marker_id=2, max_length=args.tokens)
    from transformers import T5ForConditionalGeneration

    model = PFiD(T5ForConditionalGeneration(config), meta).eval().to(device=device, dtype=dtype)
    params = sum(p.numel() for p in model.parameters())
    forward = torch.compile(model, dynamic=True) if args.compile else model
    encoder = PassageEncoder(_RandomIds(), meta.marker_id, args.tokens)  # type: ignore[arg-type]

    largest = max(args.batch_sizes)
    pool = make_queries(
        max(args.queries, largest) + args.warmup * largest,
        args.docs,
        args.max_passages,
        args.tokens,
        config.vocab_size,
        args.fixed_passages,
        seed=7,
    )

    def score(queries: list[list[EncodedDocument]]) -> None:
        docs = [d for q in queries for d in q]
        groups = group_by_bucket([d.size for d in docs], args.max_passages_per_forward)
        with torch.inference_mode():
            for group in groups:
                batch = encoder.collate([docs[i] for i in group]).to(device)
                out = forward(batch.input_ids, batch.attention_mask, batch.passage_mask)
                torch.softmax(out.doc_logits.float(), -1)[:, 1].cpu()
                torch.softmax(out.passage_logits.float(), -1)[..., 1].cpu()
        if on_gpu:
            torch.cuda.synchronize(device)

    results: list[dict[str, Any]] = []
    for bs in args.batch_sizes:
        for w in range(args.warmup):
            score(pool[w * bs : (w + 1) * bs])
        if on_gpu:
            torch.cuda.reset_peak_memory_stats(device)
        batches = max(1, args.queries // bs)
        times: list[float] = []
        for b in range(batches):
            chunk = pool[(b * bs) % len(pool) : (b * bs) % len(pool) + bs]
            if len(chunk) < bs:
                chunk = pool[:bs]
            started = time.perf_counter()
            score(chunk)
            times.append(time.perf_counter() - started)
        per_query_ms = [t / bs * 1000 for t in times]
        row = {
            "batch_size": bs,
            "batches": batches,
            "ms_per_query_p50": percentile(per_query_ms, 0.5),
            "ms_per_query_p99": percentile(per_query_ms, 0.99),
            "batch_ms_p50": percentile([t * 1000 for t in times], 0.5),
            "queries_per_second": bs * len(times) / sum(times),
            "peak_memory_gib": (
                torch.cuda.max_memory_allocated(device) / 2**30 if on_gpu else None
            ),
        }
        results.append(row)
        peak = f"{row['peak_memory_gib']:.1f} GiB" if on_gpu else "n/a"
        print(
            f"batch {bs:>3}: {row['ms_per_query_p50']:8.1f} ms/query p50 "
            f"{row['ms_per_query_p99']:8.1f} p99  {row['queries_per_second']:7.2f} q/s  "
            f"peak {peak}",
            flush=True,
        )
    docs_passages = sum(d.size for q in pool[: args.queries] for d in q) / max(
        1, len(pool[: args.queries])
    )
    report: dict[str, Any] = {
        "model": "tiny (d_model 64)" if args.tiny else "T5-base-sized PFiD",
        "parameters": params,
        "device": torch.cuda.get_device_name(device) if on_gpu else platform.processor() or "cpu",
        "dtype": args.dtype,
        "compile": args.compile,
        "torch": torch.__version__,
        "documents_per_query": args.docs,
        "mean_passages_per_query": docs_passages,
        "tokens_per_passage": args.tokens,
        "results": results,
        "paper_seconds_per_query_a100": PAPER_SECONDS_PER_QUERY,
        "target_seconds_per_query": TARGET_SECONDS_PER_QUERY,
    }
    single = results[0]["ms_per_query_p50"] / 1000
    report["speedup_vs_paper_at_first_batch_size"] = PAPER_SECONDS_PER_QUERY / single
    print(
        f"{report['model']}, {params / 1e6:.1f}M parameters, {args.dtype} on {report['device']}; "
        f"{docs_passages:.0f} passages/query; batch {results[0]['batch_size']}: "
        f"{single * 1000:.1f} ms/query = {report['speedup_vs_paper_at_first_batch_size']:.1f}x "
        f"faster than the paper's {PAPER_SECONDS_PER_QUERY} s"
    )
    return report


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="d_model 64 model (CPU smoke run)")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default=None)
    p.add_argument("--docs", type=int, default=100)
    p.add_argument("--max-passages", type=int, default=8)
    p.add_argument("--fixed-passages", action="store_true", help="every document has 8")
    p.add_argument("--tokens", type=int, default=200)
    p.add_argument("--queries", type=int, default=32, help="timed queries per batch size")
    p.add_argument("--warmup", type=int, default=2, help="untimed batches per batch size")
    p.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=None)
    p.add_argument("--max-passages-per-forward", type=int, default=4096)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--json-out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.dtype is None:
        args.dtype = "bf16" if args.device.startswith("cuda") else "fp32"
    if args.batch_sizes is None:
        args.batch_sizes = [1, 4, 16]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    report = run(args)
    if args.json_out is not None:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
