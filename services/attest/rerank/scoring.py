"""Synchronous PFiD scoring: (query, document) items in, scores in [0, 1] out.

Depends on torch and transformers only, so the benchmark and training code
can use it on a machine with nothing else installed.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from attest.rerank.model import PFiD


@dataclass(frozen=True, slots=True)
class DocInput:
    title: str
    passages: tuple[str, ...]
    # Known embeddings of the passages for the embedding fallback: empty, or one
    # per passage (None where unknown). PFiD reads text only.
    vectors: tuple[npt.NDArray[np.float32] | None, ...] = field(default=(), compare=False)


@dataclass(frozen=True, slots=True)
class DocScores:
    score: float
    passage_scores: tuple[float, ...]
    truncated: tuple[bool, ...]


class PFiDScorer:
    """Synchronous scoring of (query, document) items with a loaded PFiD model."""

    def __init__(
        self,
        model: PFiD,
        tokenizer: PreTrainedTokenizerBase,
        *,
        device: str = "cpu",
        max_length: int | None = None,
        max_passages_per_forward: int = 512,
        compile_model: bool = False,
    ) -> None:
        import torch

        from attest.rerank.features import PassageEncoder

        self.device = device
        self.model = model
        self.dtype = next(model.parameters()).dtype
        self._forward = torch.compile(model, dynamic=True) if compile_model else model
        self.encoder = PassageEncoder(
            tokenizer, model.meta.marker_id, max_length or model.meta.max_length
        )
        self.max_passages_per_forward = max_passages_per_forward

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: Path,
        *,
        device: str = "cpu",
        dtype: str = "auto",
        max_length: int | None = None,
        max_passages_per_forward: int = 512,
        compile_model: bool = False,
    ) -> PFiDScorer:
        import torch
        from transformers import AutoTokenizer

        from attest.rerank.model import PFiD

        use_bf16 = dtype == "bfloat16" or (dtype == "auto" and device.startswith("cuda"))
        tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
        model = PFiD.load(checkpoint)
        model.eval().to(device=device, dtype=torch.bfloat16 if use_bf16 else torch.float32)
        return cls(
            model,
            tokenizer,
            device=device,
            max_length=max_length,
            max_passages_per_forward=max_passages_per_forward,
            compile_model=compile_model,
        )

    def __call__(self, items: list[tuple[str, DocInput]]) -> list[DocScores]:
        import torch

        from attest.rerank.features import EncodedDocument, group_by_bucket

        # Tokenize once per distinct query.
        by_query: dict[str, list[int]] = defaultdict(list)
        for i, (query, _) in enumerate(items):
            by_query[query].append(i)
        encoded: list[EncodedDocument | None] = [None] * len(items)
        for query, idx in by_query.items():
            docs = [(items[i][1].title, items[i][1].passages) for i in idx]
            for i, enc in zip(idx, self.encoder.encode_many(query, docs), strict=True):
                encoded[i] = enc
        ready = [e for e in encoded if e is not None]
        self.model.eval()
        results: list[DocScores | None] = [None] * len(items)
        with torch.inference_mode():
            for group in group_by_bucket([e.size for e in ready], self.max_passages_per_forward):
                batch = self.encoder.collate([ready[i] for i in group]).to(self.device)
                out = self._forward(batch.input_ids, batch.attention_mask, batch.passage_mask)
                doc = torch.softmax(out.doc_logits.float(), dim=-1)[:, 1].cpu().tolist()
                psg = torch.softmax(out.passage_logits.float(), dim=-1)[..., 1].cpu().tolist()
                for row, i in enumerate(group):
                    n = ready[i].size
                    results[i] = DocScores(doc[row], tuple(psg[row][:n]), ready[i].truncated)
        return [r for r in results if r is not None]
