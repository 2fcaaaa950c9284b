"""The semantic index after a restart scores exactly as before it, after index and delete."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from attest.core import cache
from attest.knowledge.graph import Level, load_graph
from attest.semantic.index import SemanticIndex
from attest.semantic.models import Mode, PassageIn, SemanticDoc, SemanticQuery, Variant
from attest.semantic.settings import SemanticSettings

pytestmark = pytest.mark.asyncio

DIM = 16


class HashEmbedder:
    """A deterministic stand-in for the model (a vector per text from its hash)."""

    name = "hash-embedder"
    dimension = DIM

    def __init__(self) -> None:
        self.embedded: list[str] = []

    def warm_up(self) -> None:
        return None

    def encode(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.embedded.extend(texts)
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for i, text in enumerate(texts):
            seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
            v = np.random.default_rng(seed).normal(size=DIM)
            out[i] = v / np.linalg.norm(v)
        return out

    async def aencode(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return self.encode(texts)

    async def aencode_one(self, text: str) -> npt.NDArray[np.float32]:
        return self.encode([text])[0]

    def vector_fingerprint(self) -> str:
        return cache.fingerprint(self.encode)


def doc(i: int, orgs: tuple[str, ...], entities: tuple[str, ...]) -> SemanticDoc:
    return SemanticDoc(
        id=f"d{i}",
        title=f"Article {i} on emissions and labour",
        body=f"Body {i}. Emissions rose at the plant; workers struck.",
        keywords={"organizations": orgs, "entity_ids": entities},
        passages=(PassageIn(index=0, text=f"Passage of article {i}."),),
    )


async def kg_hits(index: SemanticIndex, text: str) -> list[tuple[str, float]]:
    hits = await index.search(
        "default", SemanticQuery(text=text, top_k=20, mode=Mode.KG, variant=Variant.ENHANCED)
    )
    return [(h.doc_id, round(h.score, 5)) for h in hits]


async def test_restart_after_index_and_delete_scores_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ATTEST_CACHE_DIR", str(tmp_path / "cache"))
    cache.forget_shared()
    graph = load_graph()
    linkable = sorted(e.id for e in graph.entities.values() if e.level is Level.LOWER)[:4]
    settings = SemanticSettings(data_dir=tmp_path / "data", store="edge")
    questions = ["greenhouse gas emissions", "strike at the plant", "Acme Corp"]

    index = SemanticIndex(settings, embedder=HashEmbedder(), graph=graph)  # type: ignore[arg-type]
    await index.warm_up()
    await index.index(
        "default",
        [
            doc(1, ("Acme Corp", "Globex"), (linkable[0],)),
            doc(2, ("Globex",), (linkable[1], linkable[2])),
            doc(3, ("Initech",), ()),
            doc(4, (), (linkable[3],)),
        ],
    )
    await index.delete("default", ["d3"])
    # Updated in place: other organizations and links.
    await index.index("default", [doc(2, ("Umbrella",), (linkable[0],))])
    before = {q: await kg_hits(index, q) for q in questions}
    counts = await index.stats("default")
    assert {d for d, _ in before[questions[0]]} == {"d1", "d2", "d4"}
    await index.close()

    for _ in range(2):  # the first restart fills whatever it keeps, the second reads it
        cache.forget_shared()
        embedder = HashEmbedder()
        restarted = SemanticIndex(settings, embedder=embedder, graph=graph)  # type: ignore[arg-type]
        await restarted.warm_up()
        assert {q: await kg_hits(restarted, q) for q in questions} == before
        assert await restarted.stats("default") == counts
        await restarted.close()
    # Nothing of the deleted article or of the replaced organizations came back.
    assert "Initech" not in embedder.embedded
