"""One answer's embeddings: every text embedded at most once per answer.

The steps of an extractive answer read the same texts again and again: the
question scores every source's sentences for its summary, the answer
candidates and every citation the support judge rates, in the first pass and
in each re-search; a source's sentences are summary sentences, answer
candidates and the judge's evidence. Embedding them at each step cost a
Reuters answer about ten encodings of the question and five of every other
text. ``TextVectors`` remembers what one answer has embedded, keyed by the
exact text, so a step encodes only what no earlier step has; a caller that
already holds the question's vector (the answer service embeds it for
retrieval) seeds it, and a re-search hands the semantic service the vector
of the sentence it searches for instead of its text to embed again.

The memo lives for one call and is never shared between answers: a text's
vector does not depend on the answer, but what an answer keeps must not grow
with the traffic.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from attest.core.errors import InvalidArgument
from attest.semantic.embedding import Embedder

Vector = npt.NDArray[np.float32]
Matrix = npt.NDArray[np.float32]


class TextVectors:
    """Unit-length embeddings of the texts of one answer, each computed once."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder
        self._vectors: dict[str, Vector] = {}
        # Summaries run in threads, one per source: a text two of them need is
        # encoded by the first, the other waits for it instead of encoding it too.
        self._lock = threading.Lock()

    def __contains__(self, text: str) -> bool:
        return text in self._vectors

    def get(self, text: str) -> Vector | None:
        """The vector of ``text`` if this answer has embedded it, else None."""
        return self._vectors.get(text)

    def put(self, text: str, vector: Sequence[float] | npt.ArrayLike) -> None:
        """Seeds the vector of ``text`` computed elsewhere with the same model
        (the question, embedded by the semantic service for retrieval). A
        vector of another dimension, non-finite or zero is InvalidArgument; it
        is scaled to unit length like the ones encoded here."""
        v = np.asarray(vector, dtype=np.float32).reshape(-1)
        dimension = self.embedder.dimension
        if v.shape != (dimension,):
            raise InvalidArgument(
                f"has {v.shape[0]} dimensions; the embedding model has {dimension}",
                field="question_vector",
            )
        norm = float(np.linalg.norm(v))
        if not np.all(np.isfinite(v)) or norm == 0.0:
            raise InvalidArgument("must be finite and non-zero", field="question_vector")
        with self._lock:
            self._vectors[text] = v / norm

    def encode(self, texts: Sequence[str]) -> Matrix:
        """One row per text, in order; only the texts not seen yet reach the
        model, in one call (each once, however often it is listed)."""
        if not texts:
            return self.embedder.encode([])
        with self._lock:
            missing = [t for t in dict.fromkeys(texts) if t not in self._vectors]
            if missing:
                for text, vector in zip(missing, self.embedder.encode(missing), strict=True):
                    self._vectors[text] = vector
            return np.stack([self._vectors[t] for t in texts])
