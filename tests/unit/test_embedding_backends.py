"""The ONNX Runtime embedding backends against torch, on the packaged MiniLM.

Exports the model once into a temporary model_cache directory (a few seconds for
the float32 file and for the int8 one); the module took 23-30 s on 2 shared
CPUs, the model's load included.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from attest.core.errors import FailedPrecondition
from attest.ingest.settings import IngestSettings
from attest.semantic.embedding import (
    PACKAGED_MINILM,
    Backend,
    Embedder,
    OnnxEncoder,
    _concrete,
    _file_layout,
    _load_exported,
    _Loaded,
    _onnx_dir_of,
    onnx_model_file,
    resolve_model_path,
)
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
def torch_vectors() -> np.ndarray:
    return Embedder(backend="torch").encode(TEXTS)


def test_onnx_float32_gives_torchs_vectors(model_cache: Path, torch_vectors: np.ndarray) -> None:
    vectors = Embedder(backend="onnx").encode(TEXTS)
    assert vectors.shape == torch_vectors.shape == (len(TEXTS), 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    cosines = (vectors * torch_vectors).sum(axis=1)
    assert cosines.min() >= 0.99
    # The same arithmetic, so much closer than the bound: last-bit differences only.
    assert np.abs(vectors - torch_vectors).max() < 1e-5


def test_the_float32_graph_is_fused_and_int8_is_not(model_cache: Path) -> None:
    import onnx

    model = Embedder(backend="torch")._model().model

    def ops(backend: Backend) -> set[str]:
        file, _ = onnx_model_file(model, backend)
        graph = onnx.load(str(file), load_external_data=False).graph
        return {node.op_type for node in graph.node}

    # One Attention node per layer and fused normalisations: ONNX Runtime's
    # transformer fusions, checked against the plain graph when exported.
    assert {"Attention", "SkipLayerNormalization", "EmbedLayerNormalization"} <= ops("onnx")
    # int8 weights are quantized from the model's own (unfused) graph, as measured.
    assert "Attention" not in ops("onnx-int8")


def test_a_graph_that_does_not_fuse_is_exported_plain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torch_vectors: np.ndarray
) -> None:
    import onnx
    import onnxruntime.transformers.optimizer as optimizer

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("no fusion today")

    monkeypatch.setattr(optimizer, "optimize_model", broken)
    monkeypatch.setenv("ATTEST_CACHE_DIR", str(tmp_path))
    model = Embedder(backend="torch")._model().model
    file, _ = onnx_model_file(model, "onnx")
    assert file.is_relative_to(tmp_path)
    ops = {node.op_type for node in onnx.load(str(file), load_external_data=False).graph.node}
    assert "Attention" not in ops
    # Nothing half-written is left beside it, and its vectors are still torch's.
    assert [p.name for p in file.parent.iterdir()] == ["model.onnx"]
    vectors = OnnxEncoder(model, file).encode(TEXTS, 4)
    assert np.abs(vectors - torch_vectors).max() < 1e-5


def test_onnx_vectors_do_not_depend_on_the_batch(model_cache: Path) -> None:
    embedder = Embedder(backend="onnx", batch_size=4)
    together = embedder.encode(TEXTS)
    alone = np.stack([embedder.encode([t])[0] for t in TEXTS])
    # Padding to the batch's longest text must not change a text's vector.
    assert np.abs(together - alone).max() < 1e-5


def test_onnx_batches_are_cut_by_token_count_and_pad_to_their_own_longest(
    model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attest.semantic import embedding

    # Character length and token count disagree: one long word is many
    # characters and few tokens, a run of short words the other way round.
    texts = [
        "Internationalization",
        "a b c d e f g h i j k l m n o p",
        "antidisestablishmentarianism",
        "x y z x y z x y z x y z",
        "ok",
        *TEXTS,
    ]
    embedder = Embedder(backend="onnx", batch_size=2)
    onnx = embedder._model().onnx
    assert onnx is not None
    batches: list[tuple[int, list[int]]] = []  # (width, tokens of each row)
    run = onnx._session.run

    def recording(outputs: object, feeds: dict[str, np.ndarray]) -> object:
        mask = feeds["attention_mask"]
        batches.append((mask.shape[1], mask.sum(axis=1).tolist()))
        return run(outputs, feeds)

    monkeypatch.setattr(onnx._session, "run", recording, raising=False)
    alone = np.stack([embedder.encode([t])[0] for t in texts])
    tokens = [rows[0] for _, rows in batches]
    batches.clear()
    # A window smaller than the call: each window is sorted and batched alone.
    monkeypatch.setattr(embedding, "_TOKENIZE_WINDOW", 5)
    together = embedder.encode(texts)
    assert np.abs(together - alone).max() < 1e-5
    # Windows of 5, 5 and 1 texts, each sorted by token count and cut into
    # batches of at most 2 neighbours, each as wide as its longest text; a text
    # shares a batch only with one of at most 1.25 times its tokens.
    assert all(width == max(rows) for width, rows in batches)
    assert all(min(rows) * 1.25 >= width for width, rows in batches)
    expected: list[list[int]] = []
    for window in (tokens[0:5], tokens[5:10], tokens[10:]):
        runs: list[list[int]] = []
        for n in sorted(window, reverse=True):
            if runs and len(runs[-1]) < 2 and n * 1.25 >= runs[-1][0]:
                runs[-1].append(n)
            else:
                runs.append([n])
        expected += runs
    assert [rows for _, rows in batches] == expected


def test_a_batch_holds_texts_of_similar_token_counts() -> None:
    from attest.semantic.embedding import _length_batches

    lengths = np.array([1, 40, 8, 36, 33, 10, 31, 9, 8, 8])
    order = np.argsort(-lengths, kind="stable")
    runs = [lengths[b].tolist() for b in _length_batches(order, lengths, 4)]
    # 31 would pad to 40 by more than a quarter of its tokens; 10, 9, 8, 8 stop
    # at the batch size; 1 is padded by no one.
    assert runs == [[40, 36, 33], [31], [10, 9, 8, 8], [8], [1]]
    assert [b.tolist() for b in _length_batches(order[:0], lengths, 4)] == []


def test_onnx_batches_of_a_tokenizer_padding_on_the_left_keep_every_token(
    model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    embedder = Embedder(backend="onnx", batch_size=3)
    onnx = embedder._model().onnx
    assert onnx is not None
    right = onnx._tokenize
    real = int(right(TEXTS)["attention_mask"].sum())

    def left(texts: list[str]) -> dict[str, np.ndarray]:
        # The same tokens, with the padding moved in front of each text.
        features = right(texts)
        shifts = features["attention_mask"].shape[1] - features["attention_mask"].sum(axis=1)
        return {
            name: np.stack([np.roll(row, int(n)) for row, n in zip(values, shifts, strict=True)])
            for name, values in features.items()
        }

    padded_left = OnnxEncoder(None, onnx.path, tokenize=left, dimension=384)
    fed: list[int] = []
    run = padded_left._session.run

    def recording(outputs: object, feeds: dict[str, np.ndarray]) -> object:
        fed.append(int(feeds["attention_mask"].sum()))
        return run(outputs, feeds)

    monkeypatch.setattr(padded_left._session, "run", recording, raising=False)
    vectors = padded_left.encode(TEXTS, 3)
    # Trimming to the longest text would have cut the short texts' tokens.
    assert sum(fed) == real
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_onnx_int8_stays_close_to_torch(model_cache: Path, torch_vectors: np.ndarray) -> None:
    vectors = Embedder(backend="onnx-int8").encode(TEXTS)
    cosines = (vectors * torch_vectors).sum(axis=1)
    # Quantized weights move the vectors, a little: 0.97-0.99 measured, and
    # by how much depends on the CPU's int8 kernels. The empty text (its two
    # special tokens alone) moves most: 0.96 on a CPU with AVX2 but no VNNI,
    # where every other text stayed at 0.98-0.99.
    empty = TEXTS.index("")
    assert cosines[empty] >= 0.95
    assert np.delete(cosines, empty).min() >= 0.97
    assert np.abs(vectors - torch_vectors).max() > 1e-4
    # Each text is still nearest to its own torch vector.
    assert list((vectors @ torch_vectors.T).argmax(axis=1)) == list(range(len(TEXTS)))


def test_only_int8_vectors_carry_another_model_name() -> None:
    # Services refuse vectors whose model name differs from theirs; float32 ONNX
    # vectors are torch's, int8 ones must not be mixed into a torch index.
    assert Embedder(backend="onnx").name == Embedder().name == "all-MiniLM-L6-v2"
    assert Embedder(backend="onnx-int8").name == "all-MiniLM-L6-v2+int8"


def test_export_is_kept_in_the_cache_and_reused(model_cache: Path) -> None:
    model = Embedder(backend="torch")._model().model
    first, scratch = onnx_model_file(model, "onnx")
    assert scratch is None
    assert first.is_file()
    assert first.is_relative_to(model_cache / "onnx")
    stamp = first.stat().st_mtime_ns
    again, _ = onnx_model_file(model, "onnx")
    assert again == first
    assert again.stat().st_mtime_ns == stamp
    int8, _ = onnx_model_file(model, "onnx-int8")
    assert int8.parent == first.parent
    assert int8 != first
    # int8 weights: about a quarter of the float32 file.
    assert int8.stat().st_size < first.stat().st_size / 3


def test_auto_is_onnx_on_a_cpu_with_torchs_vectors(
    model_cache: Path, torch_vectors: np.ndarray
) -> None:
    embedder = Embedder()
    assert embedder.backend == "auto"
    assert embedder.backend_used == "onnx"
    assert embedder.name == "all-MiniLM-L6-v2"
    assert np.abs(embedder.encode(TEXTS) - torch_vectors).max() < 1e-5


def test_auto_is_torch_where_onnx_does_not_apply(tmp_path: Path) -> None:
    source = resolve_model_path(PACKAGED_MINILM)
    assert _concrete(source, "cpu", "auto") == "onnx"
    assert _concrete(source, "cuda", "auto") == "torch"
    # A model whose files declare another pooling: the ONNX path does not implement it.
    for name in ("modules.json", "sentence_bert_config.json"):
        (tmp_path / name).write_bytes((source / name).read_bytes())
    (tmp_path / "1_Pooling").mkdir()
    pooling = json.loads((source / "1_Pooling" / "config.json").read_text())
    pooling["pooling_mode_cls_token"] = True
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    assert _concrete(tmp_path, "cpu", "auto") == "torch"
    # An explicit backend is never changed.
    assert _concrete(tmp_path, "cpu", "onnx") == "onnx"


def test_auto_falls_back_to_torch_when_the_export_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, torch_vectors: np.ndarray
) -> None:
    from attest.semantic import embedding

    # A copy of the model in a directory of its own, so nothing loaded or
    # exported for the packaged one is reused.
    source = resolve_model_path(PACKAGED_MINILM)
    model_dir = tmp_path / "minilm"
    shutil.copytree(source, model_dir)
    monkeypatch.setenv("ATTEST_CACHE_DIR", str(tmp_path / "cache"))

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("no exporter here")

    monkeypatch.setattr(embedding, "onnx_model_file", broken)
    auto = Embedder(str(model_dir))
    assert np.abs(auto.encode(TEXTS) - torch_vectors).max() < 1e-5
    assert auto.backend_used == "torch"
    assert str(model_dir) in embedding._AUTO_TORCH
    # An explicit onnx backend says what went wrong instead.
    with pytest.raises(RuntimeError, match="no exporter"):
        Embedder(str(model_dir), backend="onnx").warm_up()
    embedding._AUTO_TORCH.discard(str(model_dir))


def test_auto_survives_a_damaged_cached_export(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, torch_vectors: np.ndarray
) -> None:
    from attest.semantic import embedding

    model_dir = tmp_path / "minilm"
    shutil.copytree(resolve_model_path(PACKAGED_MINILM), model_dir)
    monkeypatch.setenv("ATTEST_CACHE_DIR", str(tmp_path / "cache"))
    assert Embedder(str(model_dir)).backend_used == "onnx"
    (_onnx_dir_of(tmp_path / "cache", model_dir) / "model.onnx").write_bytes(b"garbage")
    # What a later process finds: nothing loaded yet, the damaged file cached.
    for key in [k for k in embedding._LOADED if k[0] == str(model_dir.resolve())]:
        del embedding._LOADED[key]
    embedder = Embedder(str(model_dir))
    assert np.abs(embedder.encode(TEXTS) - torch_vectors).max() < 1e-5
    assert embedder.backend_used == "torch"
    embedding._AUTO_TORCH.discard(str(model_dir.resolve()))
    for key in [k for k in embedding._LOADED if k[0] == str(model_dir.resolve())]:
        del embedding._LOADED[key]
    # An explicit onnx backend says what is wrong instead.
    with pytest.raises(Exception, match=r"(?i)protobuf"):
        Embedder(str(model_dir), backend="onnx").warm_up()


def test_an_unwritable_cache_entry_exports_to_a_scratch_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from attest.semantic import embedding

    monkeypatch.setenv("ATTEST_CACHE_DIR", str(tmp_path / "cache"))
    source = resolve_model_path(PACKAGED_MINILM)
    cached = _onnx_dir_of(tmp_path / "cache", source)
    cached.mkdir(parents=True)
    (cached / "model.onnx").write_bytes(b"exported")

    def read_only(*_: object, **__: object) -> None:
        raise PermissionError("read-only file system")

    monkeypatch.setattr(tempfile, "TemporaryFile", read_only)
    # What is there is used without writing...
    assert embedding._onnx_files_dir(None, source, ["model.onnx"]) == (cached, None)
    # ...what is missing goes to a directory of this process.
    directory, scratch = embedding._onnx_files_dir(None, source, ["model-int8.onnx"])
    assert scratch is not None
    assert directory == Path(scratch.name)
    scratch.cleanup()


def test_a_cpu_device_index_is_still_the_cpu() -> None:
    source = resolve_model_path(PACKAGED_MINILM)
    assert _concrete(source, "cpu:0", "auto") == "onnx"
    assert _concrete(source, "CPU", "auto") == "onnx"


def test_unknown_backend_and_non_cpu_device_are_refused() -> None:
    with pytest.raises(FailedPrecondition, match="not one of"):
        Embedder(backend="tensorrt").warm_up()  # type: ignore[arg-type]
    with pytest.raises(FailedPrecondition, match="CPU only"):
        Embedder(backend="onnx", device="cuda").warm_up()


def test_semantic_settings_choose_the_backend(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert SemanticSettings(data_dir=tmp_path).embedding_backend == "auto"
    monkeypatch.setenv("ATTEST_SEMANTIC_EMBEDDING_BACKEND", "onnx-int8")
    settings = SemanticSettings(data_dir=tmp_path)
    assert settings.embedding_backend == "onnx-int8"
    assert SemanticIndex(settings).embedder.backend == "onnx-int8"
    monkeypatch.setenv("ATTEST_SEMANTIC_EMBEDDING_BACKEND", "openvino")
    with pytest.raises(ValueError, match="embedding_backend"):
        SemanticSettings(data_dir=tmp_path)


def test_ingest_embeds_with_the_configured_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    assert IngestSettings().embed.backend == "auto"
    monkeypatch.setenv("ATTEST_INGEST_EMBED__BACKEND", "onnx-int8")
    assert IngestSettings().embed.backend == "onnx-int8"


def _export_into(model_cache: Path, backend: str) -> None:
    # The export written into this module's cache: an Embedder of the same
    # backend loaded by an earlier test module (another model_cache) would not.
    model = Embedder(backend="torch")._model().model
    source = resolve_model_path(PACKAGED_MINILM)
    file, scratch = onnx_model_file(model, backend, source)  # type: ignore[arg-type]
    assert scratch is None
    assert file.is_relative_to(model_cache)


def _fresh_exported(backend: str) -> _Loaded:
    # What a later process finds: the export cached, the model not loaded.
    source = resolve_model_path(PACKAGED_MINILM)
    loaded = _load_exported(source, backend)  # type: ignore[arg-type]
    assert loaded is not None
    assert loaded.model is None
    return loaded


@pytest.mark.parametrize("backend", ["onnx", "onnx-int8"])
def test_a_cached_export_loads_without_sentence_transformers_and_gives_the_same_vectors(
    model_cache: Path, backend: str
) -> None:
    _export_into(model_cache, backend)
    expected = Embedder(backend=backend).encode(TEXTS)  # type: ignore[arg-type]
    source = resolve_model_path(PACKAGED_MINILM)
    directory = _onnx_dir_of(model_cache, source)
    assert (directory / "tokenizer-check").read_text() == "same"
    loaded = _fresh_exported(backend)
    assert loaded.onnx is not None
    assert loaded.onnx.path.parent == directory
    assert loaded.onnx.dimension == 384
    # tokenizer.json gave sentence-transformers' token ids, so the same feeds
    # reach the same ONNX file.
    vectors = loaded.onnx.encode(TEXTS, 16)
    assert np.array_equal(vectors, expected)


def test_the_tokenizer_check_is_what_lets_a_process_skip_the_model(model_cache: Path) -> None:
    _export_into(model_cache, "onnx")
    check = _onnx_dir_of(model_cache, resolve_model_path(PACKAGED_MINILM)) / "tokenizer-check"
    check.write_text("differs")
    try:
        assert _load_exported(resolve_model_path(PACKAGED_MINILM), "onnx") is None
    finally:
        check.write_text("same")


def test_a_process_with_a_cached_export_imports_neither_torch_nor_transformers(
    model_cache: Path,
) -> None:
    _export_into(model_cache, "onnx")
    probe = (
        "import sys\n"
        "from attest.semantic.embedding import Embedder\n"
        "e = Embedder(backend='onnx')\n"
        "assert e.encode(['quarterly dividend']).shape == (1, 384)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'sentence_transformers')"
        " if m in sys.modules))\n"
    )
    env = {**os.environ, "ATTEST_CACHE_DIR": str(model_cache)}
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_a_model_directory_the_onnx_path_does_not_implement_is_not_loaded_from_files(
    tmp_path: Path,
) -> None:
    source = resolve_model_path(PACKAGED_MINILM)
    assert _file_layout(source) == 384
    for name in ("modules.json", "sentence_bert_config.json", "tokenizer.json"):
        (tmp_path / name).write_bytes((source / name).read_bytes())
    (tmp_path / "1_Pooling").mkdir()
    pooling = json.loads((source / "1_Pooling" / "config.json").read_text())
    pooling["pooling_mode_cls_token"] = True
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    assert _file_layout(tmp_path) is None


def test_rerank_and_generate_settings_choose_their_embedders_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from attest.generate.settings import GenerateSettings, build_generator
    from attest.rerank.rerankers import EmbeddingReranker
    from attest.rerank.settings import RerankSettings

    assert RerankSettings().embedding_backend == GenerateSettings().embedding_backend == "auto"
    monkeypatch.setenv("ATTEST_RERANK_EMBEDDING_BACKEND", "onnx-int8")
    monkeypatch.setenv("ATTEST_GENERATE_EMBEDDING_BACKEND", "onnx")
    reranker = EmbeddingReranker(RerankSettings())
    assert reranker.embedder.backend == "onnx-int8"
    # int8 vectors are a model of their own: stored torch vectors are not scored as its.
    assert reranker.model_name == "all-MiniLM-L6-v2+int8"
    generator = build_generator(GenerateSettings(), with_llm=False)
    assert generator.extractive.embedder.backend == "onnx"
    monkeypatch.setenv("ATTEST_RERANK_EMBEDDING_BACKEND", "openvino")
    with pytest.raises(ValueError, match="embedding_backend"):
        RerankSettings()
