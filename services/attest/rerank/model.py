"""PFiD (Passage Fusion-in-Decoder) on top of a stock T5 encoder-decoder.

Shapes: B documents, K passage slots per document (padded to the batch's
bucket), L tokens per passage, D the model width.

* The T5 encoder reads every real passage ("query + passage", a fixed marker
  token at position 0) on its own: [N, L] -> [N, L, D], N = real passages.
* The decoder reads the concatenated states of a document's passages,
  [B, K * L, D] with the matching mask, in one step from the start token and
  scores the words ``false`` and ``true``: the document logits [B, 2].
* The first-token (marker) states [B, K, D] go through one transformer encoder
  layer with a padding mask and no position information (inter-passage
  attention), then a linear layer: the passage logits [B, K, 2].

Loss = CE(document) + lambda * CE(real passages), lambda = 0.5 by default.
Class 1 is "relevant" in both heads.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers import PreTrainedTokenizerBase, T5Config, T5ForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutput

HEAD_FILE = "pfid_head.safetensors"
META_FILE = "pfid.json"
FORMAT_VERSION = 1
MARKER_TOKEN = "<extra_id_0>"  # noqa: S105 - a vocabulary token, not a secret


class CheckpointError(ValueError):
    """The path is not a loadable PFiD checkpoint or base model."""


@dataclass(frozen=True)
class PFiDMeta:
    """What a checkpoint needs besides the T5 weights and the tokenizer."""

    true_id: int
    false_id: int
    marker_id: int
    max_length: int = 200
    passage_loss_weight: float = 0.5
    format_version: int = FORMAT_VERSION


def special_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, int, int]:
    """(true_id, false_id, marker_id): first sub-token of each word, the marker token."""
    true_ids = tokenizer("true", add_special_tokens=False)["input_ids"]
    false_ids = tokenizer("false", add_special_tokens=False)["input_ids"]
    if not true_ids or not false_ids or true_ids[0] == false_ids[0]:
        raise CheckpointError("the tokenizer cannot tell 'true' from 'false' by their first token")
    marker = tokenizer.convert_tokens_to_ids(MARKER_TOKEN)
    if not isinstance(marker, int) or marker == tokenizer.unk_token_id:
        raise CheckpointError(f"the tokenizer has no {MARKER_TOKEN} token (not a T5 tokenizer?)")
    return int(true_ids[0]), int(false_ids[0]), marker


@dataclass
class PFiDOutput:
    doc_logits: Tensor  # [B, 2]
    passage_logits: Tensor  # [B, K, 2]
    loss: Tensor | None = None
    doc_loss: Tensor | None = None
    passage_loss: Tensor | None = None


class PassageHead(nn.Module):
    """Inter-passage attention over the first-token states, then 2 logits each."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            d_model, n_heads, d_ff, dropout, batch_first=True, norm_first=True
        )
        self.out = nn.Linear(d_model, 2)

    def forward(self, first: Tensor, passage_mask: Tensor) -> Tensor:
        # The mask's dtype must match the inputs' for the fused kernels.
        hidden = self.layer(first, src_key_padding_mask=~passage_mask)
        out: Tensor = self.out(hidden)
        return out


class PFiD(nn.Module):
    def __init__(self, t5: T5ForConditionalGeneration, meta: PFiDMeta) -> None:
        super().__init__()
        self.t5 = t5
        self.meta = meta
        cfg = t5.config
        self.head = PassageHead(cfg.d_model, cfg.num_heads, cfg.d_ff, cfg.dropout_rate)

    # -- construction -------------------------------------------------------

    @classmethod
    def from_config(
        cls, config: T5Config, tokenizer: PreTrainedTokenizerBase, max_length: int = 200
    ) -> PFiD:
        """A randomly initialised model (tests, benchmarks)."""
        true_id, false_id, marker_id = special_ids(tokenizer)
        t5 = T5ForConditionalGeneration(config)
        return cls(t5, PFiDMeta(true_id, false_id, marker_id, max_length=max_length))

    @classmethod
    def from_base(
        cls, path: Path, tokenizer: PreTrainedTokenizerBase, max_length: int = 200
    ) -> PFiD:
        """A pretrained T5 from a local directory, with a fresh passage head."""
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path}: no config.json; expected a T5 model directory")
        true_id, false_id, marker_id = special_ids(tokenizer)
        t5 = T5ForConditionalGeneration.from_pretrained(path, local_files_only=True)
        return cls(t5, PFiDMeta(true_id, false_id, marker_id, max_length=max_length))

    @classmethod
    def load(cls, path: Path, map_location: str | torch.device = "cpu") -> PFiD:
        """A checkpoint written by :meth:`save`."""
        meta_path = path / META_FILE
        if not meta_path.is_file():
            raise CheckpointError(f"{path}: not a PFiD checkpoint ({META_FILE} is missing)")
        raw: dict[str, Any] = json.loads(meta_path.read_text())
        if raw.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(f"{path}: checkpoint format {raw.get('format_version')!r}")
        meta = PFiDMeta(**raw)
        t5 = T5ForConditionalGeneration.from_pretrained(path, local_files_only=True)
        model = cls(t5, meta)
        model.head.load_state_dict(load_file(path / HEAD_FILE, device=str(map_location)))
        return model

    def save(self, path: Path, tokenizer: PreTrainedTokenizerBase) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self.t5.save_pretrained(path)
        tokenizer.save_pretrained(path)
        state = {k: v.detach().contiguous().cpu() for k, v in self.head.state_dict().items()}
        save_file(state, path / HEAD_FILE)
        (path / META_FILE).write_text(json.dumps(asdict(self.meta), indent=2) + "\n")

    # -- forward ------------------------------------------------------------

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        passage_mask: Tensor,
        doc_labels: Tensor | None = None,
        passage_labels: Tensor | None = None,
    ) -> PFiDOutput:
        """input_ids, attention_mask: [B, K, L]; passage_mask: [B, K] (bool).

        Padded passage slots are never encoded: only the N real passages go
        through the encoder, and their states are scattered back.
        """
        b, k, length = input_ids.shape
        encoded = self.t5.encoder(
            input_ids=input_ids[passage_mask], attention_mask=attention_mask[passage_mask]
        ).last_hidden_state  # [N, L, D]
        states = encoded.new_zeros(b, k, length, encoded.shape[-1])
        states[passage_mask] = encoded
        token_mask = attention_mask * passage_mask.unsqueeze(-1).to(attention_mask.dtype)

        start = self.t5.config.decoder_start_token_id
        decoder_input_ids = torch.full((b, 1), start, dtype=torch.long, device=input_ids.device)
        logits = self.t5(
            encoder_outputs=BaseModelOutput(last_hidden_state=states.reshape(b, k * length, -1)),
            attention_mask=token_mask.reshape(b, k * length),
            decoder_input_ids=decoder_input_ids,
        ).logits[:, 0, :]
        doc_logits = logits[:, [self.meta.false_id, self.meta.true_id]]

        passage_logits = self.head(states[:, :, 0, :], passage_mask)

        out = PFiDOutput(doc_logits=doc_logits, passage_logits=passage_logits)
        if doc_labels is not None:
            ce = nn.functional.cross_entropy
            out.doc_loss = ce(doc_logits.float(), doc_labels)
            loss = out.doc_loss
            if passage_labels is not None:
                out.passage_loss = ce(
                    passage_logits[passage_mask].float(), passage_labels[passage_mask]
                )
                loss = loss + self.meta.passage_loss_weight * out.passage_loss
            out.loss = loss
        return out


def tiny_config(vocab_size: int, d_model: int = 64, layers: int = 2, heads: int = 4) -> T5Config:
    """A small T5 configuration for tests and smoke runs."""
    config = T5Config(
        vocab_size=vocab_size,
        d_model=d_model,
        d_kv=d_model // heads,
        d_ff=d_model * 4,
        num_layers=layers,
        num_decoder_layers=layers,
        num_heads=heads,
        dropout_rate=0.1,
        pad_token_id=0,
        eos_token_id=1,
    )
    config.decoder_start_token_id = 0
    return config


def base_config(vocab_size: int = 32128) -> T5Config:
    """The T5-base shape (about 220M parameters) used by the benchmark."""
    config = T5Config(
        vocab_size=vocab_size,
        d_model=768,
        d_kv=64,
        d_ff=3072,
        num_layers=12,
        num_decoder_layers=12,
        num_heads=12,
        dropout_rate=0.1,
        pad_token_id=0,
        eos_token_id=1,
    )
    config.decoder_start_token_id = 0
    return config
