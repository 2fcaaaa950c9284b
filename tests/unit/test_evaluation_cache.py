"""attest eval ir's cache: vectors and semantic result lists belong to the embedder."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from attest.evaluation import runner
from attest.evaluation.ir import Dataset
from attest.evaluation.runner import _Cache, embedder_key, lists_cache_name, signal_lists
from attest.semantic.settings import SemanticSettings


@pytest.fixture(scope="module", autouse=True)
def onnx_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The ONNX export of the onnx backend goes to a folder of this module's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTEST_CACHE_DIR", str(tmp_path_factory.mktemp("attest-cache")))
        yield


@pytest.fixture
def data(tmp_path: Path) -> Dataset:
    root = tmp_path / "tiny"
    root.mkdir()
    docs = [{"_id": "d1", "title": "Scope 2", "text": "Indirect emissions of bought power."}]
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    return Dataset(root, {"q1": "indirect emissions"}, {"q1": {"d1": 1}})


def test_two_backends_get_two_keys_and_the_same_embedder_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("BACKEND", "MODEL", "DEVICE", "BATCH_SIZE"):
        monkeypatch.delenv(f"ATTEST_SEMANTIC_EMBEDDING_{name}", raising=False)
    torch = embedder_key(SemanticSettings(embedding_backend="torch"))
    onnx = embedder_key(SemanticSettings(embedding_backend="onnx"))
    int8 = embedder_key(SemanticSettings(embedding_backend="onnx-int8"))
    assert len({torch, onnx, int8}) == 3
    assert embedder_key(SemanticSettings(embedding_backend="torch")) == torch
    # The default, auto, is keyed by what it runs on: ONNX on a CPU for MiniLM.
    assert embedder_key(SemanticSettings()) == onnx
    # Device and batch size do not change the vectors' meaning.
    assert embedder_key(SemanticSettings(embedding_batch_size=7)) == onnx


def test_cached_lists_are_reused_by_the_same_embedder_only(
    data: Dataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache_dir = tmp_path / "cache"
    saved = {"q1": {"dense": [["d1", 0.61]]}}
    monkeypatch.setenv("ATTEST_SEMANTIC_EMBEDDING_BACKEND", "torch")
    _Cache(cache_dir).save_json(lists_cache_name(data, 10, embedder_key()), saved)
    started: list[str] = []

    @contextlib.asynccontextmanager
    async def no_services(**_: Any) -> AsyncIterator[runner.Targets]:
        started.append("services")
        raise RuntimeError("no services in a unit test")
        yield  # pragma: no cover

    monkeypatch.setattr(runner, "service_targets", no_services)

    def lists() -> runner.SignalLists:
        found, _ = asyncio.run(
            signal_lists(
                data,
                ["dense"],
                data_dir=tmp_path / "data",
                cache_dir=cache_dir,
                top_k=10,
                reuse_lists=True,
            )
        )
        return found

    assert lists() == {"q1": {"dense": [("d1", 0.61)]}}
    assert started == []
    monkeypatch.setenv("ATTEST_SEMANTIC_EMBEDDING_BACKEND", "onnx-int8")
    with pytest.raises(RuntimeError, match="no services"):
        lists()
    assert started == ["services"]


def test_index_batches_are_cut_by_count_and_by_bytes():
    from attest.evaluation.ir import CorpusDoc
    from attest.evaluation.runner import _batches

    small = [CorpusDoc(f"d{i}", "", "x" * 10) for i in range(7)]
    assert [len(b) for b in _batches(small, 3)] == [3, 3, 1]
    assert _batches([], 3) == []
    big = [CorpusDoc(f"b{i}", "t", "y" * 400) for i in range(5)]
    # About two documents of ~470 bytes fit in 1,000: a batch is cut before it would pass.
    batches = _batches(big, 200, max_bytes=1000)
    assert [len(b) for b in batches] == [2, 2, 1]
    assert [d for b in batches for d in b] == big
    huge = [CorpusDoc("h", "", "z" * 5000), *small[:2]]
    assert [len(b) for b in _batches(huge, 200, max_bytes=1000)] == [1, 2]
