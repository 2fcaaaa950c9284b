"""RerankService under concurrent load: latency, throughput and batch sizes.

Starts the rerank service in this process on a free port with a PFiD
checkpoint (``--checkpoint``; by default a tiny random-init one, d_model 64,
written to a temporary folder) and calls ``Rerank`` from ``--concurrency``
clients at once. Each request carries ``--docs`` documents of 1-``--passages``
passages of Reuters text (``--corpus``). Reports, per concurrency level,
requests/s, p50/p95/p99 latency and the documents and requests per model call
read from the service's own batching metrics.

    python loadtest/bench_rerank.py --concurrency 1,4,16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "shared/data/news/reuters21578.jsonl"


def load_texts(path: Path, limit: int) -> list[str]:
    texts: list[str] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            body = json.loads(line).get("body") or ""
            if len(body) > 200:
                texts.append(body)
            if len(texts) >= limit:
                break
    if not texts:
        raise SystemExit(f"{path}: no article with a body")
    return texts


def tiny_checkpoint(path: Path) -> Path:
    import torch
    from transformers import ByT5Tokenizer

    from attest.rerank.model import PFiD, tiny_config

    tokenizer = ByT5Tokenizer()
    torch.manual_seed(0)
    PFiD.from_config(tiny_config(len(tokenizer)), tokenizer).save(path, tokenizer)
    return path


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(args: argparse.Namespace, checkpoint: Path) -> dict[str, Any]:
    from attest.common.v1 import common_pb2
    from attest.core.channels import create_channel
    from attest.core.server import running
    from attest.core.settings import ServerSettings
    from attest.rerank.servicer import RerankServicer
    from attest.rerank.settings import BatchingSettings, RerankSettings
    from attest.rerank.v1 import rerank_pb2, rerank_pb2_grpc

    texts = load_texts(args.corpus, 2000)
    rng = random.Random(1)

    def request() -> rerank_pb2.RerankRequest:
        docs = []
        for d in range(args.docs):
            body = rng.choice(texts)
            n = rng.randint(1, args.passages)
            size = max(1, len(body) // n)
            docs.append(
                common_pb2.Document(
                    id=f"d{d}",
                    passages=[
                        common_pb2.Passage(index=j, text=body[j * size : (j + 1) * size] or body)
                        for j in range(n)
                    ],
                )
            )
        return rerank_pb2.RerankRequest(query=rng.choice(texts)[:80], documents=docs)

    settings = RerankSettings(
        checkpoint=checkpoint,
        device=args.device,
        server=ServerSettings(host="127.0.0.1", port=0),
        batching=BatchingSettings(max_documents=args.max_batch, max_wait_ms=args.max_wait_ms),
    )
    servicer = RerankServicer(settings)
    levels: list[dict[str, Any]] = []
    async with running([servicer], settings.server, ready_timeout=600) as server:
        channel = create_channel(f"127.0.0.1:{server.port}")
        stub = rerank_pb2_grpc.RerankServiceStub(channel)
        batcher = servicer.reranker.batcher  # type: ignore[attr-defined]
        await stub.Rerank(request(), timeout=120)  # warm
        for c in args.concurrency:
            batches0, items0, reqs0 = (
                batcher.stats.batches,
                batcher.stats.items,
                batcher.stats.requests,
            )
            latencies: list[float] = []
            todo = [args.requests]

            async def client(out: list[float], todo: list[int]) -> None:
                while todo[0] > 0:
                    todo[0] -= 1
                    req = request()
                    began = time.perf_counter()
                    await stub.Rerank(req, timeout=600)
                    out.append(time.perf_counter() - began)

            started = time.perf_counter()
            await asyncio.gather(*(client(latencies, todo) for _ in range(c)))
            wall = time.perf_counter() - started
            batches = batcher.stats.batches - batches0
            row = {
                "concurrency": c,
                "requests": len(latencies),
                "requests_per_second": len(latencies) / wall,
                "p50_ms": pct(latencies, 0.5) * 1000,
                "p95_ms": pct(latencies, 0.95) * 1000,
                "p99_ms": pct(latencies, 0.99) * 1000,
                "model_calls": batches,
                "documents_per_call": (batcher.stats.items - items0) / max(batches, 1),
                "requests_per_call": (batcher.stats.requests - reqs0) / max(batches, 1),
            }
            levels.append(row)
            print(
                f"c={c:>3}: {row['requests_per_second']:7.2f} req/s  p50 {row['p50_ms']:8.1f} ms"
                f"  p95 {row['p95_ms']:8.1f}  p99 {row['p99_ms']:8.1f}  "
                f"{row['documents_per_call']:6.1f} docs/call  "
                f"{row['requests_per_call']:5.2f} requests/call",
                flush=True,
            )
        await channel.close()
    return {
        "checkpoint": str(checkpoint),
        "device": args.device,
        "documents_per_request": args.docs,
        "max_passages": args.passages,
        "levels": levels,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--checkpoint", type=Path, default=None, help="default: tiny random-init")
    p.add_argument("--device", default="cpu")
    p.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    p.add_argument("--docs", type=int, default=10)
    p.add_argument("--passages", type=int, default=4)
    p.add_argument("--requests", type=int, default=64, help="per concurrency level")
    p.add_argument(
        "--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16]
    )
    p.add_argument("--max-batch", type=int, default=128)
    p.add_argument("--max-wait-ms", type=float, default=5.0)
    p.add_argument("--json-out", type=Path, default=Path("loadtest/reports/rerank-load.json"))
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="attest-rerank-bench-") as tmp:
        checkpoint = args.checkpoint or tiny_checkpoint(Path(tmp) / "tiny")
        report = asyncio.run(run(args, checkpoint))
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
