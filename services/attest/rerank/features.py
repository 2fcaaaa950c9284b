"""From (query, document passages) to padded PFiD input tensors.

Every passage becomes ``[marker] query: <q> document: <title> passage: <p> </s>``,
cut to ``max_length`` tokens (the passage text is cut, never the marker or the
end token). Documents are grouped by passage count into size buckets (1, 2, 4,
8, ...) so a batch pads to its bucket, not to the largest document seen, and
token length is padded to a multiple of 16.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

# Characters kept before tokenizing: no tokenizer packs more than this many
# characters into one token, so the cut never changes a result that fits.
CHARS_PER_TOKEN_BOUND = 16
LENGTH_MULTIPLE = 16


@dataclass(frozen=True, slots=True)
class EncodedDocument:
    """Token ids of one document's passages, ready for collation."""

    passages: tuple[tuple[int, ...], ...]
    truncated: tuple[bool, ...]

    @property
    def size(self) -> int:
        return len(self.passages)


@dataclass(frozen=True, slots=True)
class Batch:
    input_ids: torch.Tensor  # [B, K, L] long
    attention_mask: torch.Tensor  # [B, K, L] long
    passage_mask: torch.Tensor  # [B, K] bool

    def to(self, device: torch.device | str) -> Batch:
        return Batch(
            self.input_ids.to(device, non_blocking=True),
            self.attention_mask.to(device, non_blocking=True),
            self.passage_mask.to(device, non_blocking=True),
        )


def bucket(size: int) -> int:
    """The passage-count bucket of a document: the next power of two."""
    b = 1
    while b < size:
        b *= 2
    return b


class PassageEncoder:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, marker_id: int, max_length: int) -> None:
        if max_length < 8:
            raise ValueError("max_length must be at least 8 tokens")
        self.tokenizer = tokenizer
        self.marker_id = marker_id
        self.max_length = max_length
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the tokenizer has no end-of-sequence token")
        self.eos_id = int(eos)
        self.pad_id = int(tokenizer.pad_token_id or 0)

    def _ids(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        out: list[list[int]] = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        return out

    def encode(self, query: str, title: str, passages: Sequence[str]) -> EncodedDocument:
        return self.encode_many(query, [(title, passages)])[0]

    def encode_many(
        self, query: str, documents: Sequence[tuple[str, Sequence[str]]]
    ) -> list[EncodedDocument]:
        """Encode the passages of several documents for one query, tokenizing once."""
        budget = self.max_length - 2  # marker + end token
        prefix = self._ids([f"query: {query.strip()}"])[0]
        head_texts: list[str] = []
        body_texts: list[str] = []
        cut_chars: list[bool] = []
        limit = budget * CHARS_PER_TOKEN_BOUND
        for title, passages in documents:
            for text in passages:
                head = f" document: {title.strip()} passage:" if title.strip() else " passage:"
                head_texts.append(head)
                body = " " + text.strip()
                cut_chars.append(len(body) > limit)
                body_texts.append(body[:limit])
        heads = self._ids(head_texts)
        bodies = self._ids(body_texts)
        out: list[EncodedDocument] = []
        i = 0
        for _, passages in documents:
            ids: list[tuple[int, ...]] = []
            flags: list[bool] = []
            for _ in passages:
                seq = prefix + heads[i] + bodies[i]
                truncated = cut_chars[i] or len(seq) > budget
                ids.append((self.marker_id, *seq[:budget], self.eos_id))
                flags.append(truncated)
                i += 1
            out.append(EncodedDocument(tuple(ids), tuple(flags)))
        return out

    def collate(self, documents: Sequence[EncodedDocument], slots: int | None = None) -> Batch:
        """Pad to ``slots`` passages (default: the batch's bucket) and a multiple of 16 tokens."""
        k = slots or bucket(max(d.size for d in documents))
        longest = max(len(p) for d in documents for p in d.passages)
        length = -(-longest // LENGTH_MULTIPLE) * LENGTH_MULTIPLE
        ids = np.full((len(documents), k, length), self.pad_id, dtype=np.int64)
        lengths = np.zeros((len(documents), k), dtype=np.int64)
        for b, doc in enumerate(documents):
            if doc.size > k:
                raise ValueError(f"document {b} has {doc.size} passages, more than {k} slots")
            for j, p in enumerate(doc.passages):
                ids[b, j, : len(p)] = p
                lengths[b, j] = len(p)
        mask = (np.arange(length) < lengths[..., None]).astype(np.int64)
        return Batch(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(lengths > 0))


def group_by_bucket(sizes: Sequence[int], max_passages: int) -> list[list[int]]:
    """Indices grouped by passage-count bucket, each group cut so that
    (documents x bucket) stays within ``max_passages`` passage slots."""
    groups: dict[int, list[int]] = defaultdict(list)
    for i, size in enumerate(sizes):
        groups[bucket(size)].append(i)
    out: list[list[int]] = []
    for b in sorted(groups):
        per = max(1, max_passages // b)
        idx = groups[b]
        out.extend(idx[s : s + per] for s in range(0, len(idx), per))
    return out
