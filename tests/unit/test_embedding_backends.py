"""The ONNX Runtime embedding backends against torch, on the packaged MiniLM.

Exports the model once into a temporary cache directory (a few seconds for
the float32 file and for the int8 one); the module took 23-30 s on 2 shared
CPUs, the model's load included.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from attest.core.errors import FailedPrecondition
from attest.ingest.settings import IngestSettings
from attest.semantic.embedding import Embedder, onnx_model_file
from attest.semantic.index import SemanticIndex
from attest.semantic.settings import SemanticSettings

TEXTS = [
    "Greenhouse gas emissions of the supply chain.",
    "quarterly dividend",
    "x",
    "",
    "experimental investigation of the aerodynamics of a wing in a slipstream . " * 40,
    "What similarity laws must be obeyed when constructing aeroelastic models?",
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("attest-cache")
    old = os.environ.get("ATTEST_CACHE_DIR")
    os.environ["ATTEST_CACHE_DIR"] = str(root)
    yield root
    if old is None:
        os.environ.pop("ATTEST_CACHE_DIR", None)
    else:
        os.environ["ATTEST_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def torch_vectors() -> np.ndarray:
    return Embedder().encode(TEXTS)


def test_onnx_float32_gives_torchs_vectors(cache: Path, torch_vectors: np.ndarray) -> None:
    vectors = Embedder(backend="onnx").encode(TEXTS)
    assert vectors.shape == torch_vectors.shape == (len(TEXTS), 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    cosines = (vectors * torch_vectors).sum(axis=1)
    assert cosines.min() >= 0.99
    # The same arithmetic, so much closer than the bound: last-bit differences only.
    assert np.abs(vectors - torch_vectors).max() < 1e-5


def test_onnx_vectors_do_not_depend_on_the_batch(cache: Path) -> None:
    embedder = Embedder(backend="onnx", batch_size=4)
    together = embedder.encode(TEXTS)
    alone = np.stack([embedder.encode([t])[0] for t in TEXTS])
    # Padding to the batch's longest text must not change a text's vector.
    assert np.abs(together - alone).max() < 1e-5


def test_onnx_int8_stays_close_to_torch(cache: Path, torch_vectors: np.ndarray) -> None:
    vectors = Embedder(backend="onnx-int8").encode(TEXTS)
    cosines = (vectors * torch_vectors).sum(axis=1)
    # Quantized weights move the vectors, a little (0.98-0.99 measured).
    assert cosines.min() >= 0.97
    assert np.abs(vectors - torch_vectors).max() > 1e-4
    # Each text is still nearest to its own torch vector.
    assert list((vectors @ torch_vectors.T).argmax(axis=1)) == list(range(len(TEXTS)))


def test_only_int8_vectors_carry_another_model_name() -> None:
    # Services refuse vectors whose model name differs from theirs; float32 ONNX
    # vectors are torch's, int8 ones must not be mixed into a torch index.
    assert Embedder(backend="onnx").name == Embedder().name == "all-MiniLM-L6-v2"
    assert Embedder(backend="onnx-int8").name == "all-MiniLM-L6-v2+int8"


def test_export_is_kept_in_the_cache_and_reused(cache: Path) -> None:
    model = Embedder()._model().model
    first, scratch = onnx_model_file(model, "onnx")
    assert scratch is None
    assert first.is_file()
    assert first.is_relative_to(cache / "onnx")
    stamp = first.stat().st_mtime_ns
    again, _ = onnx_model_file(model, "onnx")
    assert again == first
    assert again.stat().st_mtime_ns == stamp
    int8, _ = onnx_model_file(model, "onnx-int8")
    assert int8.parent == first.parent
    assert int8 != first
    # int8 weights: about a quarter of the float32 file.
    assert int8.stat().st_size < first.stat().st_size / 3


def test_unknown_backend_and_non_cpu_device_are_refused() -> None:
    with pytest.raises(FailedPrecondition, match="not one of"):
        Embedder(backend="tensorrt").warm_up()  # type: ignore[arg-type]
    with pytest.raises(FailedPrecondition, match="CPU only"):
        Embedder(backend="onnx", device="cuda").warm_up()


def test_semantic_settings_choose_the_backend(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert SemanticSettings(data_dir=tmp_path).embedding_backend == "torch"
    monkeypatch.setenv("ATTEST_SEMANTIC_EMBEDDING_BACKEND", "onnx-int8")
    settings = SemanticSettings(data_dir=tmp_path)
    assert settings.embedding_backend == "onnx-int8"
    assert SemanticIndex(settings).embedder.backend == "onnx-int8"
    monkeypatch.setenv("ATTEST_SEMANTIC_EMBEDDING_BACKEND", "openvino")
    with pytest.raises(ValueError, match="embedding_backend"):
        SemanticSettings(data_dir=tmp_path)


def test_ingest_embeds_with_the_configured_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    assert IngestSettings().embed.backend == "torch"
    monkeypatch.setenv("ATTEST_INGEST_EMBED__BACKEND", "onnx-int8")
    assert IngestSettings().embed.backend == "onnx-int8"
