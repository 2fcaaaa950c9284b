"""What batching the query encoder buys, in one process on the packaged MiniLM.

1. CPU per query of the ONNX encoder on the Cranfield and CISI queries
   (their lengths differ: CISI's run from a few words to a paragraph) encoded
   alone and in batches of 2, 4 and 8 of consecutive queries (one call per
   batch, the process's threads; median of ``--rounds``), two ways each,
   measured in turns: either each batch padded to its longest query in one
   pass ("pad to longest", as before) or cut into passes of similar token
   counts (the default). A batch of one is the same work either way: its two
   figures show the machine's noise.
2. ``Embedder.aencode_one`` (what a semantic search calls) from 1, 4 and 16
   concurrent coroutines for ``--seconds`` each, with ``query_batch_size`` 1
   (every query its own pass) against the default (queries that wait leave
   together): queries/s, CPU per query and the mean batch.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 uv run python loadtest/bench_query_batching.py

writes ``loadtest/reports/query-batching.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from attest.semantic import embedding
from attest.semantic.embedding import DEFAULT_BATCH_SIZE, Embedder
from bench_ask import commit_of

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "ir"
QUERIES = f"{DATA / 'cranfield' / 'queries.jsonl'},{DATA / 'cisi' / 'queries.jsonl'}"


def load_queries(path: Path) -> list[str]:
    with path.open(encoding="utf-8") as f:
        return [str(json.loads(line)["text"]) for line in f if line.strip()]


def per_batch(
    embedder: Embedder, queries: list[str], sizes: list[int], rounds: int
) -> dict[str, Any]:
    """Median ms of CPU a query, by batch size, for each way of cutting a batch."""
    cuts = {"pad_to_longest": math.inf, "by_length": embedding._MAX_PADDING_RATIO}
    out: dict[str, dict[str, float]] = {cut: {} for cut in cuts}
    try:
        for size in sizes:
            times: dict[str, list[float]] = {cut: [] for cut in cuts}
            for turn in range(rounds):
                # In turns, first one then the other, so that the machine's
                # load falls on both alike.
                order = list(cuts.items())
                for cut, ratio in order if turn % 2 == 0 else order[::-1]:
                    embedding._MAX_PADDING_RATIO = ratio
                    started = time.process_time()
                    for i in range(0, len(queries) - size + 1, size):
                        embedder.encode(queries[i : i + size])
                    done = len(queries) // size * size
                    times[cut].append((time.process_time() - started) / done * 1e3)
            line = []
            for cut in cuts:
                out[cut][str(size)] = round(statistics.median(times[cut]), 3)
                line.append(f"{cut} {out[cut][str(size)]:.2f}")
            print(f"  batch of {size:2d}, ms of CPU a query: {', '.join(line)}", flush=True)
    finally:
        embedding._MAX_PADDING_RATIO = cuts["by_length"]
    return out


async def concurrent(
    queries: list[str], clients: int, batch: int, seconds: float
) -> dict[str, Any]:
    embedder = Embedder(query_batch_size=batch)
    await embedder.aencode_one("warm up")
    texts = itertools.cycle(queries)
    done = 0
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await embedder.aencode_one(next(texts))
            done += 1

    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    batcher = embedder._batcher
    return {
        "queries_per_s": round(done / wall, 1),
        "cpu_ms_per_query": round(cpu / done * 1e3, 3),
        "mean_batch": round(batcher.texts / batcher.batches, 2) if batcher else 1.0,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--queries", default=QUERIES, help="comma-separated queries.jsonl files, each measured"
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--output", type=Path, default=ROOT / "loadtest/reports/query-batching.json")
    args = p.parse_args()
    sets = {Path(q).parent.name: load_queries(Path(q)) for q in args.queries.split(",")}
    embedder = Embedder()
    embedder.warm_up()
    loaded = embedder._model()
    report: dict[str, Any] = {
        "command": "OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 uv run python "
        "loadtest/bench_query_batching.py",
        "commit": commit_of(ROOT),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        },
        "backend": embedder.backend_used,
        "slots": loaded.onnx.slots if loaded.onnx is not None else 1,
        "max_padding_ratio": embedding._MAX_PADDING_RATIO,
        "sets": {},
    }
    for name, queries in sets.items():
        print(f"{name} ({len(queries)} queries), CPU per query by batch size:", flush=True)
        by_batch = per_batch(embedder, queries, [1, 2, 4, 8], args.rounds)
        levels: dict[str, dict[str, Any]] = {}
        for clients in [int(c) for c in args.clients.split(",")]:
            for label, batch in (("alone", 1), ("batched", DEFAULT_BATCH_SIZE)):
                r = asyncio.run(concurrent(queries, clients, batch, args.seconds))
                levels.setdefault(str(clients), {})[label] = r
                print(f"  {clients:2d} clients, {label:7s}: {r}", flush=True)
        report["sets"][name] = {
            "queries": len(queries),
            "cpu_ms_per_query_by_batch": by_batch,
            "aencode_one": levels,
        }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
