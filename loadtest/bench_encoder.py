"""The MiniLM encoder in torch against ONNX Runtime (float32 and int8), side by side.

For each embedding backend of ``attest.semantic.embedding`` (``torch``,
``onnx``, ``onnx-int8``) and each thread count (``--threads``), in one
process and interleaved round by round (each round runs the backends in a
rotated order, so drift in the machine's load falls on all of them alike):

- passage throughput: ``--passages`` passages of the first Cranfield
  documents cut to ``--words`` words, encoded in one call (texts/s; median of
  the rounds);
- query latency: ``--queries`` judged Cranfield and CISI queries encoded one
  at a time (p50 and p90 over every round);
- vector agreement with torch on those passages and queries (largest absolute
  difference, smallest and mean cosine);
- nDCG@10 of dense retrieval on each ``--dataset``, by the path of ``attest
  eval ir --retriever dense --no-cache`` (an in-process semantic service
  indexing the corpus through gRPC) with ``ATTEST_SEMANTIC_EMBEDDING_BACKEND``
  set to the backend.

The ONNX files are exported from the packaged weights on first use and kept
in the cache directory (``$ATTEST_CACHE_DIR``); nothing is downloaded.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 uv run python loadtest/bench_encoder.py

writes ``loadtest/reports/encoder.json`` and ``encoder.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SHARED_IR = ROOT.parent / "shared" / "data" / "ir"
BACKENDS = ("torch", "onnx", "onnx-int8")


def passages(dataset: Path, count: int, words: int) -> list[str]:
    from attest.evaluation.ir import load_dataset

    out: list[str] = []
    for doc in load_dataset(dataset).corpus():
        text = f"{doc.title} {doc.text}".split()
        if len(text) >= words:
            out.append(" ".join(text[:words]))
        if len(out) >= count:
            break
    return out


def queries(datasets: Sequence[Path], count: int) -> list[str]:
    from attest.evaluation.ir import load_dataset

    pools = [
        [text for _, text in sorted(load_dataset(d).judged_queries().items())] for d in datasets
    ]
    # Alternate between the sets (until the smaller runs out) so that a short
    # --queries still has both.
    mixed = [q for group in itertools.zip_longest(*pools) for q in group if q is not None]
    return mixed[:count]


class Encoders:
    """One encode function per backend at a given thread count."""

    def __init__(self, threads: int, keep: list[Any]) -> None:
        import torch

        from attest.semantic.embedding import (
            DEFAULT_BATCH_SIZE,
            Embedder,
            OnnxEncoder,
            onnx_model_file,
        )

        self.threads = threads
        self.batch_size = DEFAULT_BATCH_SIZE
        self.torch_embedder = Embedder(backend="torch")
        self.torch_embedder.warm_up()
        model = self.torch_embedder._model().model
        torch.set_num_threads(threads)
        self.onnx: dict[str, OnnxEncoder] = {}
        for backend in BACKENDS[1:]:
            path, scratch = onnx_model_file(model, backend)  # type: ignore[arg-type]
            keep.append(scratch)
            self.onnx[backend] = OnnxEncoder(model, path, threads=threads)
        self._torch = torch

    def encode(self, backend: str, texts: Sequence[str]) -> np.ndarray:
        if backend == "torch":
            # Torch's pool is process-wide: set it before each call.
            self._torch.set_num_threads(self.threads)
            return self.torch_embedder.encode(texts)
        return self.onnx[backend].encode(list(texts), self.batch_size)


def rotations(rounds: int) -> Iterator[list[str]]:
    for r in range(rounds):
        k = r % len(BACKENDS)
        yield list(BACKENDS[k:] + BACKENDS[:k])


def speed(enc: Encoders, texts: list[str], qs: list[str], rounds: int) -> dict[str, Any]:
    throughput: dict[str, list[float]] = {b: [] for b in BACKENDS}
    latency: dict[str, list[float]] = {b: [] for b in BACKENDS}
    for b in BACKENDS:  # one untimed pass each: first-call allocations
        enc.encode(b, texts[:16])
        enc.encode(b, qs[:8])
    for order in rotations(rounds):
        for b in order:
            started = time.perf_counter()
            enc.encode(b, texts)
            throughput[b].append(len(texts) / (time.perf_counter() - started))
        for b in order:
            for q in qs:
                started = time.perf_counter()
                enc.encode(b, [q])
                latency[b].append((time.perf_counter() - started) * 1000.0)
    return {
        b: {
            "passages_per_second": statistics.median(throughput[b]),
            "passages_per_second_rounds": [round(x, 2) for x in throughput[b]],
            "query_p50_ms": float(np.percentile(latency[b], 50)),
            "query_p90_ms": float(np.percentile(latency[b], 90)),
        }
        for b in BACKENDS
    }


def agreement(enc: Encoders, texts: list[str]) -> dict[str, Any]:
    ref = enc.encode("torch", texts)
    out: dict[str, Any] = {}
    for b in BACKENDS[1:]:
        vec = enc.encode(b, texts)
        cos = (vec * ref).sum(axis=1)
        out[b] = {
            "max_abs_difference": float(np.abs(vec - ref).max()),
            "min_cosine": float(cos.min()),
            "mean_cosine": float(cos.mean()),
        }
    return out


@contextlib.contextmanager
def backend_env(backend: str) -> Iterator[None]:
    old = os.environ.get("ATTEST_SEMANTIC_EMBEDDING_BACKEND")
    os.environ["ATTEST_SEMANTIC_EMBEDDING_BACKEND"] = backend
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("ATTEST_SEMANTIC_EMBEDDING_BACKEND", None)
        else:
            os.environ["ATTEST_SEMANTIC_EMBEDDING_BACKEND"] = old


def ndcg(dataset: Path, backend: str) -> dict[str, float]:
    from attest.evaluation.ir import load_dataset
    from attest.evaluation.runner import run_ir_eval

    data = load_dataset(dataset)
    with backend_env(backend), tempfile.TemporaryDirectory(prefix="bench-encoder-") as tmp:
        result = asyncio.run(
            run_ir_eval(data, retriever="dense", data_dir=Path(tmp), cache_dir=None)
        )
    return {
        "ndcg@10": float(result["ndcg@10"]),
        "recall@100": float(result["recall@100"]),
        "wall_seconds": float(result["wall_seconds"]),
    }


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    threads = [str(t) for t in report["speed"]]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    width = 0.8 / len(BACKENDS)
    for i, b in enumerate(BACKENDS):
        xs = [j + (i - 1) * width for j in range(len(threads))]
        axes[0].bar(
            xs, [report["speed"][t][b]["passages_per_second"] for t in threads], width, label=b
        )
        axes[1].bar(xs, [report["speed"][t][b]["query_p50_ms"] for t in threads], width, label=b)
    for ax, title in (
        (axes[0], "passages/s (higher is better)"),
        (axes[1], "single-query p50 ms (lower is better)"),
    ):
        ax.set_xticks(range(len(threads)), [f"{t} thread(s)" for t in threads])
        ax.set_title(title)
        ax.legend()
    sets = list(report["ndcg"])
    for i, b in enumerate(BACKENDS):
        xs = [j + (i - 1) * width for j in range(len(sets))]
        vals = [report["ndcg"][s].get(b, {}).get("ndcg@10", 0.0) for s in sets]
        axes[2].bar(xs, vals, width, label=b)
        for x, v in zip(xs, vals, strict=True):
            axes[2].text(x, v, f"{v:.4f}", ha="center", va="bottom", fontsize=7, rotation=90)
    top = max(
        (v.get("ndcg@10", 0.0) for by in report["ndcg"].values() for v in by.values()), default=1.0
    )
    axes[2].set_ylim(0, top * 1.25)
    axes[2].set_xticks(range(len(sets)), sets)
    axes[2].set_title("dense nDCG@10")
    axes[2].legend(loc="lower right")
    fig.suptitle(f"all-MiniLM-L6-v2 on {report['machine']['cpus']} CPUs: torch vs ONNX Runtime")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--dataset",
        type=Path,
        action="append",
        default=None,
        help="BEIR folder for nDCG@10 (repeatable; default Cranfield and CISI)",
    )
    p.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--passages", type=int, default=64)
    p.add_argument("--words", type=int, default=100)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--no-ndcg", action="store_true", help="speed and agreement only")
    p.add_argument("--json-out", type=Path, default=ROOT / "loadtest/reports/encoder.json")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    datasets = args.dataset or [SHARED_IR / "cranfield", SHARED_IR / "cisi"]
    texts = passages(datasets[0], args.passages, args.words)
    qs = queries(datasets, args.queries)
    keep: list[Any] = []
    report: dict[str, Any] = {
        "command": "python loadtest/bench_encoder.py " + " ".join(argv or sys.argv[1:]),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_start": list(os.getloadavg()),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        },
        "workload": {
            "passages": len(texts),
            "words_per_passage": args.words,
            "queries": len(qs),
            "query_words_median": statistics.median(len(q.split()) for q in qs),
            "batch_size": None,
            "rounds": args.rounds,
        },
        "speed": {},
        "agreement": {},
        "ndcg": {},
    }
    started = time.perf_counter()
    for threads in [int(t) for t in args.threads.split(",")]:
        enc = Encoders(threads, keep)
        report["workload"]["batch_size"] = enc.batch_size
        report["speed"][str(threads)] = speed(enc, texts, qs, args.rounds)
        if not report["agreement"]:
            report["agreement"] = agreement(enc, texts + qs)
        for b in BACKENDS:
            s = report["speed"][str(threads)][b]
            print(
                f"threads={threads} {b:10s} {s['passages_per_second']:7.2f} passages/s  "
                f"query p50 {s['query_p50_ms']:6.2f} ms",
                flush=True,
            )
    for b, a in report["agreement"].items():
        print(
            f"{b:10s} vs torch: max |diff| {a['max_abs_difference']:.2e}  "
            f"min cos {a['min_cosine']:.4f}  mean cos {a['mean_cosine']:.4f}",
            flush=True,
        )
    if not args.no_ndcg:
        import torch

        # The services size their pools from OMP_NUM_THREADS, as in production.
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1))
        for d in datasets:
            report["ndcg"][d.name] = {}
            for b in BACKENDS:
                report["ndcg"][d.name][b] = ndcg(d, b)
                r = report["ndcg"][d.name][b]
                print(
                    f"{d.name} dense/{b}: nDCG@10 {r['ndcg@10']:.4f}  "
                    f"Recall@100 {r['recall@100']:.4f}  ({r['wall_seconds']:.0f} s)",
                    flush=True,
                )
            base = report["ndcg"][d.name]["torch"]["ndcg@10"]
            for b in BACKENDS[1:]:
                report["ndcg"][d.name][b]["delta_vs_torch"] = (
                    report["ndcg"][d.name][b]["ndcg@10"] - base
                )
    report["machine"]["load_average_end"] = list(os.getloadavg())
    report["wall_seconds"] = time.perf_counter() - started
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, args.json_out.with_suffix(".png"))
    print(f"wrote {args.json_out} and {args.json_out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
