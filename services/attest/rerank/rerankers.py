"""The two rerankers behind RerankService: PFiD, and the embedding fallback.

Both take a query and documents (title + passages) and return, per document,
a score in [0, 1] and one score in [0, 1] per passage. No grpc here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Literal, Protocol

import numpy as np

from attest.rerank.batching import MicroBatcher
from attest.rerank.scoring import DocInput, DocScores, PFiDScorer
from attest.rerank.settings import RerankSettings

log = logging.getLogger(__name__)

Kind = Literal["pfid", "embedding"]


class Reranker(Protocol):
    kind: Kind
    model_name: str
    device: str

    async def warm_up(self) -> None: ...

    async def rerank(self, query: str, docs: Sequence[DocInput]) -> list[DocScores]: ...

    async def close(self) -> None: ...


def resolve_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} requested but CUDA is not available")
    return name


class PFiDReranker:
    kind: Kind = "pfid"

    def __init__(self, settings: RerankSettings) -> None:
        assert settings.checkpoint is not None
        self._settings = settings
        self.model_name = str(settings.checkpoint)
        self.device = resolve_device(settings.device)
        self.scorer: PFiDScorer | None = None
        self.batcher: MicroBatcher[tuple[str, DocInput], DocScores] | None = None

    async def warm_up(self) -> None:
        if self.batcher is not None:
            return
        s = self._settings
        assert s.checkpoint is not None
        started = time.perf_counter()
        scorer = await asyncio.to_thread(
            PFiDScorer.from_checkpoint,
            s.checkpoint,
            device=self.device,
            dtype=s.dtype,
            max_length=s.max_length,
            max_passages_per_forward=s.batching.max_passages_per_forward,
            compile_model=s.compile,
        )
        # One call through the model before SERVING (kernels, compile, allocator).
        await asyncio.to_thread(scorer, [("warm up", DocInput("", ("warm up",)))])
        self.scorer = scorer
        self.batcher = MicroBatcher(
            scorer,
            max_items=s.batching.max_documents,
            max_wait_seconds=s.batching.max_wait_ms / 1000,
            max_queued_requests=s.batching.max_queued_requests,
        )
        self.batcher.start()
        log.info(
            "PFiD loaded",
            extra={
                "checkpoint": self.model_name,
                "device": self.device,
                "dtype": str(scorer.dtype),
                "seconds": round(time.perf_counter() - started, 2),
            },
        )

    async def rerank(self, query: str, docs: Sequence[DocInput]) -> list[DocScores]:
        assert self.batcher is not None, "warm_up first"
        return await self.batcher.submit([(query, d) for d in docs])

    async def close(self) -> None:
        if self.batcher is not None:
            await self.batcher.close()
            self.batcher = None


class EmbeddingReranker:
    """CPU fallback: cosine similarity of sentence embeddings, (1 + cos) / 2.

    A passage is embedded with its document's title in front; a document
    scores as its best passage.
    """

    kind: Kind = "embedding"

    def __init__(self, settings: RerankSettings) -> None:
        from attest.semantic.embedding import Embedder

        self.embedder = Embedder(settings.embedding_model, device="cpu")
        self.model_name = self.embedder.name
        self.device = "cpu"
        self._max_chars = settings.max_length * 8

    async def warm_up(self) -> None:
        await asyncio.to_thread(self.embedder.warm_up)

    async def rerank(self, query: str, docs: Sequence[DocInput]) -> list[DocScores]:
        texts: list[str] = []
        truncated: list[bool] = []
        for d in docs:
            for p in d.passages:
                text = f"{d.title.strip()}. {p.strip()}" if d.title.strip() else p.strip()
                truncated.append(len(text) > self._max_chars)
                texts.append(text[: self._max_chars])
        vectors = await self.embedder.aencode([query, *texts])
        sims = (1.0 + vectors[1:] @ vectors[0]) / 2.0
        sims = np.clip(sims, 0.0, 1.0)
        out: list[DocScores] = []
        offset = 0
        for d in docs:
            n = len(d.passages)
            scores = tuple(float(s) for s in sims[offset : offset + n])
            out.append(DocScores(max(scores), scores, tuple(truncated[offset : offset + n])))
            offset += n
        return out

    async def close(self) -> None:
        return None


def create_reranker(settings: RerankSettings) -> Reranker:
    if settings.checkpoint is not None:
        return PFiDReranker(settings)
    return EmbeddingReranker(settings)
