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
import numpy.typing as npt

from attest.rerank.batching import MicroBatcher
from attest.rerank.scoring import DocInput, DocScores, PFiDScorer
from attest.rerank.settings import RerankSettings
from attest.semantic.models import passage_text

log = logging.getLogger(__name__)

Kind = Literal["pfid", "embedding"]


Vector = npt.NDArray[np.float32]


class Reranker(Protocol):
    kind: Kind
    model_name: str
    device: str

    async def warm_up(self) -> None: ...

    def vector_space(self) -> tuple[str, int] | None:
        """(model name, dimension) of the embeddings this reranker can score
        instead of texts; None when it reads text only (PFiD)."""

    async def rerank(
        self, query: str, docs: Sequence[DocInput], query_vector: Vector | None = None
    ) -> list[DocScores]:
        """Scores of ``docs``; ``query_vector`` and ``DocInput.vectors`` are
        embeddings of the query and passages in ``vector_space()``, or ignored."""

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

    def vector_space(self) -> tuple[str, int] | None:
        return None

    async def rerank(
        self, query: str, docs: Sequence[DocInput], query_vector: Vector | None = None
    ) -> list[DocScores]:
        assert self.batcher is not None, "warm_up first"
        return await self.batcher.submit([(query, d) for d in docs])

    async def close(self) -> None:
        if self.batcher is not None:
            await self.batcher.close()
            self.batcher = None


class EmbeddingReranker:
    """CPU fallback: cosine similarity of sentence embeddings, (1 + cos) / 2.

    A passage is embedded as its document's title, a newline and the passage
    text (``passage_text``, the text the semantic index embeds), so a stored
    passage vector given with the request is the vector this reranker would
    compute: given vectors are scored as they are and only the passages
    without one (and the query, without its vector) are embedded. A document
    scores as its best passage.
    """

    kind: Kind = "embedding"

    def __init__(self, settings: RerankSettings) -> None:
        from attest.semantic.embedding import Embedder

        self.embedder = Embedder(
            settings.embedding_model, device="cpu", backend=settings.embedding_backend
        )
        self.model_name = self.embedder.name
        self.device = "cpu"
        self._max_chars = settings.max_length * 8
        self._dimension: int | None = None

    async def warm_up(self) -> None:
        await asyncio.to_thread(self.embedder.warm_up)
        self._dimension = self.embedder.dimension

    def vector_space(self) -> tuple[str, int] | None:
        if self._dimension is None:
            self._dimension = self.embedder.dimension
        return self.model_name, self._dimension

    async def rerank(
        self, query: str, docs: Sequence[DocInput], query_vector: Vector | None = None
    ) -> list[DocScores]:
        truncated: list[bool] = []
        rows: list[Vector | None] = []
        missing: list[int] = []  # rows to embed
        texts: list[str] = []
        for d in docs:
            title = d.title.strip()
            for j, p in enumerate(d.passages):
                text = passage_text(title, p.strip())
                truncated.append(len(text) > self._max_chars)
                given = d.vectors[j] if d.vectors else None
                if given is None:
                    missing.append(len(rows))
                    texts.append(text[: self._max_chars])
                rows.append(given)
        if query_vector is None or texts:
            encoded = await self.embedder.aencode(
                texts if query_vector is not None else [query, *texts]
            )
            if query_vector is None:
                query_vector, encoded = encoded[0], encoded[1:]
            for row, vec in zip(missing, encoded, strict=True):
                rows[row] = vec
        sims = _cosines(query_vector, rows)
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


def _cosines(query: Vector, rows: Sequence[Vector | None]) -> npt.NDArray[np.float64]:
    """(1 + cos) / 2 of each row with the query, in [0, 1]."""
    matrix = np.vstack([r for r in rows if r is not None]).astype(np.float32, copy=False)
    matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
    q = query / max(float(np.linalg.norm(query)), 1e-12)
    sims = (1.0 + matrix @ q) / 2.0
    return np.clip(sims.astype(np.float64), 0.0, 1.0)


def create_reranker(settings: RerankSettings) -> Reranker:
    if settings.checkpoint is not None:
        return PFiDReranker(settings)
    return EmbeddingReranker(settings)
