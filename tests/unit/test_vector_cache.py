"""The graph attribute vectors' cache: shared in-process, kept on disk, keyed by texts and model."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from attest.core import cache
from attest.knowledge.graph import KnowledgeGraph
from attest.knowledge.linking import EntityLinker
from attest.semantic.kg_scoring import KgScorer

DIM = 8

GRAPH = {
    "version": "1",
    "entities": [
        {"id": "esg", "level": "root", "name": "ESG", "definition": "Root."},
        {
            "id": "environmental",
            "level": "pillar",
            "name": "Environmental",
            "definition": "Pillar.",
            "parents": {"esg": "contains"},
        },
        {
            "id": "gri-305",
            "level": "basic",
            "gri": "305",
            "name": "Emissions",
            "definition": "Topic.",
            "parents": {"environmental": "contains"},
        },
        {
            "id": "ghg",
            "level": "intermediate",
            "name": "greenhouse gas emissions",
            "aliases": ["GHG emissions"],
            "definition": "Indicator.",
            "parents": {"gri-305": "measured_as"},
        },
    ],
}


class Model:
    """A deterministic toy model with a fingerprint, counting the texts it embeds."""

    def __init__(self, salt: int = 0) -> None:
        self.salt = salt
        self.embedded: list[str] = []
        self._fingerprint: str | None = None

    def encode(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.embedded.extend(texts)
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for i, text in enumerate(texts):
            rng = np.random.default_rng([self.salt, *text.encode()])
            v = rng.normal(size=DIM)
            out[i] = v / np.linalg.norm(v)
        return out

    def vector_fingerprint(self) -> str:
        # Once per model, as the Embedder does.
        if self._fingerprint is None:
            self._fingerprint = cache.fingerprint(self.encode)
        return self._fingerprint


@pytest.fixture(autouse=True)
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("ATTEST_CACHE_DIR", str(tmp_path / "cache"))
    cache.forget_shared()
    yield tmp_path / "cache"
    cache.forget_shared()


def files(root: Path) -> list[Path]:
    return sorted((root / "vectors").glob("*.npy")) if (root / "vectors").exists() else []


def graph(**changes: str) -> KnowledgeGraph:
    data = {"version": "1", "entities": [dict(e) for e in GRAPH["entities"]]}
    for entity in data["entities"]:
        if entity["id"] in changes:
            entity["name"] = changes[entity["id"]]
    return KnowledgeGraph.from_mapping(data)


def test_scorer_and_linker_embed_the_graph_once_per_process(cache_dir: Path) -> None:
    model = Model()
    g = graph()
    scorer = KgScorer(g, model.encode)
    texts = g.attribute_texts()
    assert len(texts) == 5
    # The probes, then every attribute once.
    assert model.embedded == [*cache.PROBES, *texts]
    EntityLinker(g, model.encode).warm_up()
    assert len(model.embedded) == len(cache.PROBES) + 5  # the linker embedded nothing
    assert len(files(cache_dir)) == 1
    # Each got the model's vectors of its own texts, in its own order.
    expected = model.encode(["greenhouse gas emissions", "GHG emissions"])
    ghg = [i for i, n in enumerate(scorer._attr_owner) if scorer.node_ids[n] == "ghg"]
    np.testing.assert_allclose(scorer._attr_vectors[ghg], expected, atol=1e-7)


def test_a_new_process_reads_the_disk_and_embeds_only_the_probes(cache_dir: Path) -> None:
    first = KgScorer(graph(), Model().encode)
    cache.forget_shared()  # as if another process started
    model = Model()
    second = KgScorer(graph(), model.encode)
    assert model.embedded == list(cache.PROBES)
    np.testing.assert_array_equal(first._attr_vectors, second._attr_vectors)


def test_a_changed_graph_or_model_misses(cache_dir: Path) -> None:
    KgScorer(graph(), Model().encode)
    cache.forget_shared()
    renamed = Model()
    KgScorer(graph(ghg="GHG"), renamed.encode)
    assert "GHG" in renamed.embedded  # new texts: embedded again
    cache.forget_shared()
    other = Model(salt=1)
    scorer = KgScorer(graph(), other.encode)
    # Another model: another fingerprint, so every text again, with its vectors.
    assert set(graph().attribute_texts()) <= set(other.embedded)
    np.testing.assert_allclose(scorer._attr_vectors, other.encode(scorer._attr_texts), atol=1e-7)
    assert len(files(cache_dir)) == 3


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p.write_bytes(b"not a numpy file"),
        lambda p: p.write_bytes(p.read_bytes()[:100]),  # truncated
        lambda p: np.save(p, np.zeros((2, DIM), np.float32)),  # wrong rows
        lambda p: np.save(p, np.full((5, DIM), np.nan, np.float32)),
    ],
    ids=["garbage", "truncated", "wrong-shape", "nan"],
)
def test_a_corrupt_file_is_ignored_and_replaced(cache_dir: Path, damage) -> None:
    KgScorer(graph(), Model().encode)
    [path] = files(cache_dir)
    good = np.load(path)
    damage(path)
    cache.forget_shared()
    model = Model()
    scorer = KgScorer(graph(), model.encode)
    assert len(model.embedded) == len(cache.PROBES) + 5  # embedded again
    assert np.all(np.isfinite(scorer._attr_vectors))
    np.testing.assert_array_equal(np.load(path), good)  # and the file is whole again


def test_no_fingerprint_no_cache_and_cache_off(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []

    def toy(texts: Sequence[str]) -> npt.NDArray[np.float32]:
        calls.append(len(texts))
        return Model().encode(texts)

    KgScorer(graph(), toy)
    KgScorer(graph(), toy)
    assert calls == [5, 5]  # no fingerprint: called as before, nothing kept
    assert files(cache_dir) == []
    monkeypatch.setenv("ATTEST_CACHE_DIR", "off")
    model = Model()
    KgScorer(graph(), model.encode)
    cache.forget_shared()
    KgScorer(graph(), model.encode)
    assert len(model.embedded) == len(cache.PROBES) + 2 * 5
    assert files(cache_dir) == []


def test_fingerprint_is_found_through_wrappers() -> None:
    model = Model()

    class Wrapper:
        def __init__(self) -> None:
            self._encoder = model

        def __call__(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
            return model.encode(texts)

    assert cache.fingerprint_of(model.encode) == model.vector_fingerprint()
    assert cache.fingerprint_of(Wrapper()) == model.vector_fingerprint()
    assert cache.fingerprint_of(Model(salt=2).encode) != model.vector_fingerprint()
    assert cache.fingerprint_of(lambda texts: model.encode(texts)) is None


# ------------------------------------------------ the organization-name memo


def test_memo_embeds_each_text_once_and_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "data" / "orgs.npz"
    model = Model()
    memo = cache.VectorMemo(path)
    first = memo.vectors(["Acme", "Globex", "Acme"], model.encode)
    np.testing.assert_allclose(first, model.encode(["Acme", "Globex", "Acme"]), atol=1e-7)
    model.embedded.clear()
    memo.vectors(["Globex", "Initech"], model.encode)
    assert model.embedded == ["Initech"]  # only the new name, in one call
    restarted = Model()
    again = cache.VectorMemo(path).vectors(["Initech", "Acme"], restarted.encode)
    assert restarted.embedded == list(cache.PROBES)  # the fingerprint only
    np.testing.assert_allclose(again, restarted.encode(["Initech", "Acme"]), atol=1e-7)


def test_memo_ignores_another_model_and_a_corrupt_file(tmp_path: Path) -> None:
    path = tmp_path / "orgs.npz"
    cache.VectorMemo(path).vectors(["Acme"], Model().encode)
    other = Model(salt=3)
    vectors = cache.VectorMemo(path).vectors(["Acme"], other.encode)
    assert other.embedded[-1] == "Acme"  # embedded again by the other model
    np.testing.assert_allclose(vectors, other.encode(["Acme"]), atol=1e-7)
    path.write_bytes(b"PK\x03\x04 broken")
    model = Model()
    memo = cache.VectorMemo(path)
    memo.vectors(["Acme", "Globex"], model.encode)
    assert model.embedded[len(cache.PROBES) :] == ["Acme", "Globex"]
    assert len(cache.VectorMemo(path).vectors(["Globex"], Model().encode)) == 1


def test_memo_capacity_bounds_the_file(tmp_path: Path) -> None:
    memo = cache.VectorMemo(tmp_path / "orgs.npz", capacity=2)
    model = Model()
    out = memo.vectors(["a", "b", "c"], model.encode)
    assert out.shape == (3, DIM)
    assert len(memo) == 2
    np.testing.assert_allclose(out[2], model.encode(["c"])[0], atol=1e-7)


def test_memo_retain_forgets_names_of_deleted_articles(tmp_path: Path) -> None:
    path = tmp_path / "orgs.npz"
    memo = cache.VectorMemo(path)
    model = Model()
    memo.vectors(["Acme", "Globex", "Initech"], model.encode)
    # A restart after "Globex"'s only article was deleted: the restore saw two names.
    assert memo.retain(["Acme", "Initech"]) == 1
    restarted = Model()
    again = cache.VectorMemo(path)
    again.vectors(["Acme", "Initech"], restarted.encode)
    assert restarted.embedded == list(cache.PROBES)  # both still there
    assert len(again) == 2  # and Globex gone from the file
    again.vectors(["Globex"], restarted.encode)
    assert restarted.embedded[-1] == "Globex"  # indexed again: embedded again
    assert again.retain([]) == 3
    assert not path.exists()
    memo.vectors(["Acme"], model.encode)
    assert cache.VectorMemo(path).retain([]) == 0  # every article with a name deleted
    assert not path.exists()
