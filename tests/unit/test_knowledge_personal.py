"""The personal knowledge base: the store on the embedded engines (tantivy and the Qdrant
engine, in a temporary directory) and the ``KnowledgeBase`` over it, with a
character-trigram encoder instead of MiniLM (what MiniLM matches is measured in
tests/integration/test_knowledge_service.py)."""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from attest.knowledge.bases import CombinedKnowledgeBase
from attest.knowledge.kb import (
    PERSONAL,
    AspectFact,
    Description,
    EntityRef,
    Provenance,
    Triple,
    UnknownEntity,
)
from attest.knowledge.personal import (
    PersonalKnowledgeBase,
    PersonalStore,
    TenantFacts,
    personal_entity_id,
)
from attest.lexical.backends.tantivy import TantivyBackend
from attest.lexical.settings import LexicalSettings
from attest.semantic.store import EdgeVectorStore

pytestmark = pytest.mark.asyncio


def trigrams(texts: Sequence[str]) -> np.ndarray:
    """Unit vectors of hashed character trigrams (256 buckets)."""
    out = np.zeros((len(texts), 256), dtype=np.float32)
    for row, text in enumerate(texts):
        padded = f"  {text.casefold()} "
        for i in range(len(padded) - 2):
            out[row, zlib.crc32(padded[i : i + 3].encode()) % 256] += 1.0
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def ref(name: str) -> EntityRef:
    return EntityRef(personal_entity_id(name), name)


def triple(subject: str, relation: str, obj: str, start: int = 0) -> Triple:
    return Triple(
        ref(subject),
        relation,
        ref(obj),
        None,
        PERSONAL,
        provenance=Provenance(0, start, start + 20),
    )


def aspect(entity: str, name: str, value: str, passage: int = 1) -> AspectFact:
    return AspectFact(ref(entity), name, value, PERSONAL, provenance=Provenance(passage, 5, 50))


def description(entity: str, text: str) -> Description:
    return Description(ref(entity), text, PERSONAL, provenance=Provenance(0, 0, 10))


def new_store(root: Path) -> PersonalStore:
    lexical = TantivyBackend(LexicalSettings(data_dir=root, index_name="attest-knowledge"))
    vectors = EdgeVectorStore(
        root / "knowledge", collection_prefix="attest-knowledge", dimension=256
    )
    return PersonalStore(lexical, vectors, trigrams)


@pytest_asyncio.fixture
async def store(tmp_path: Path) -> AsyncIterator[PersonalStore]:
    s = new_store(tmp_path)
    await s.warm_up()
    yield s
    await s.close()


BANK_DOC = [
    description("Marrowgate Bank", "the country's fourth-largest lender by assets"),
    triple("Rosalind Achebe-Fry", "chair of", "Marrowgate Bank", 100),
    triple("Jonas Whitlock", "chief executive of", "Marrowgate Bank", 200),
    aspect("Marrowgate Bank", "coal lending", "Marrowgate Bank will end coal lending by 2030."),
]


async def bm25(store: PersonalStore, tenant: str, text: str) -> list[str]:
    return [f.text() for f in await store.retrieve(tenant, text, 10)]


async def test_store_counts_replaces_and_deletes_in_both_engines(
    store: PersonalStore, tmp_path: Path
) -> None:
    first = await store.put("acme", "d1", BANK_DOC)
    assert first.counts == {"description": 1, "triple": 2, "aspect": 1}
    assert (first.removed, first.entities_created) == (0, 3)
    assert (await store.lexical.stats("acme")).passages == 4
    assert await store.vectors.count("passages", "acme") == 4
    assert await store.vectors.count("articles", "acme") == 1

    # A changed document replaces everything it had: fewer facts, new texts.
    second = await store.put(
        "acme", "d1", [triple("Edwin Sorrell", "chair of", "Marrowgate Bank", 40)]
    )
    assert (second.removed, second.counts["triple"], second.entities_created) == (4, 1, 1)
    assert (await store.lexical.stats("acme")).passages == 1
    assert await store.vectors.count("passages", "acme") == 1
    view = await store.view("acme")
    assert [f.text() for f in view.document_facts("d1")] == [
        "(Edwin Sorrell, chair of, Marrowgate Bank)"
    ]
    assert personal_entity_id("Jonas Whitlock") not in view.names
    assert all("Whitlock" not in t for t in await bm25(store, "acme", "Whitlock chief executive"))

    # Deleting the document removes its facts from every store and the view.
    assert await store.delete("acme", ["d1"]) == 1
    assert (await store.lexical.stats("acme")).passages == 0
    assert await store.vectors.count("passages", "acme") == 0
    assert await store.vectors.count("articles", "acme") == 0
    assert view.document_facts("d1") == []
    assert view.names == {}


async def test_facts_and_provenance_survive_a_restart(tmp_path: Path) -> None:
    s = new_store(tmp_path)
    await s.warm_up()
    await s.put("acme", "d1", BANK_DOC)
    await s.put("acme", "d2", [aspect("Norvale Copper", "water", "Norvale withdrew 38 Mm3.", 3)])
    await s.close()

    again = new_store(tmp_path)
    await again.warm_up()
    try:
        view = await again.view("acme")
        assert view.counts() == {"description": 1, "triple": 2, "aspect": 2}
        restored = view.document_facts("d1")
        assert restored[1] == Triple(
            ref("Rosalind Achebe-Fry"),
            "chair of",
            ref("Marrowgate Bank"),
            None,
            PERSONAL,
            "d1",
            Provenance(0, 100, 120),
        )
        d2 = view.document_facts("d2")[0]
        assert (d2.source_doc_id, d2.provenance) == ("d2", Provenance(3, 5, 50))
    finally:
        await again.close()


async def test_load_views_restores_every_tenant_in_one_pass(tmp_path: Path) -> None:
    s = new_store(tmp_path)
    await s.warm_up()
    await s.put("acme", "d1", BANK_DOC)
    await s.put("globex", "d9", [aspect("Norvale Copper", "water", "Norvale withdrew 38 Mm3.")])
    await s.close()

    # What a tenant's first use restores on its own.
    lazy = new_store(tmp_path)
    await lazy.warm_up()
    try:
        restored = {t: (await lazy.view(t)).documents for t in ("acme", "globex")}
        assert lazy.loaded_tenants == {"acme", "globex"}
    finally:
        await lazy.close()

    again = new_store(tmp_path)
    await again.warm_up()
    try:
        assert again.loaded_tenants == frozenset()
        assert sorted(await again.load_views()) == ["acme", "globex"]
        assert again.loaded_tenants == {"acme", "globex"}
        for tenant, documents in restored.items():
            view = await again.view(tenant)
            assert {d: v.facts for d, v in view.documents.items()} == {
                d: v.facts for d, v in documents.items()
            }
        acme = await again.view("acme")
        assert acme.counts() == {"description": 1, "triple": 2, "aspect": 1}
        # Its indexes, built before any search (what a warm-up does).
        assert not acme.indexed
        acme.warm_up(trigrams)
        assert acme.indexed
        same_indexes(acme)
        # Loading again keeps the views in use.
        await again.load_views()
        assert await again.view("acme") is acme
    finally:
        await again.close()


async def test_tenants_never_see_each_others_facts(store: PersonalStore) -> None:
    await store.put("acme", "d1", BANK_DOC)
    await store.put("globex", "d1", [aspect("Vellichor Mining", "tailings", "Vellichor tailings.")])
    assert await bm25(store, "globex", "Marrowgate Bank chair") == [
        "Vellichor Mining (tailings): Vellichor tailings."
    ]
    assert all("Vellichor" not in t for t in await bm25(store, "acme", "Vellichor tailings"))
    globex = PersonalKnowledgeBase(await store.view("globex"), trigrams)
    with pytest.raises(UnknownEntity):
        globex.get_entity_info(["Marrowgate Bank"])
    # Deleting one tenant's document leaves the other's document of the same id.
    await store.delete("globex", ["d1"])
    assert (await store.view("acme")).counts()["triple"] == 2
    assert await store.vectors.count("passages", "acme") == 4


async def test_retrieval_fuses_bm25_and_vectors_with_provenance(store: PersonalStore) -> None:
    await store.put("acme", "d1", BANK_DOC)
    facts = await store.retrieve("acme", "Who is the chair of Marrowgate Bank?", 3)
    top = facts[0].triple
    assert top is not None
    assert top.subject.name == "Rosalind Achebe-Fry"
    assert (top.source_doc_id, top.provenance) == ("d1", Provenance(0, 100, 120))
    assert await store.retrieve("nobody", "chair", 3) == []


async def test_linking_chooses_exact_then_every_name_the_mention_begins(
    store: PersonalStore,
) -> None:
    await store.put("acme", "d1", BANK_DOC)
    await store.put("acme", "d2", [aspect("Marrowgate Holdings", "shares", "Holdings shares.")])
    kb = PersonalKnowledgeBase(await store.view("acme"), trigrams)
    exact = kb.entity_linking(["marrowgate  bank"])
    assert exact.chosen == personal_entity_id("Marrowgate Bank")
    assert [c.match for c in exact.candidates] == ["exact"]
    several = kb.entity_linking(["Marrowgate"])
    assert set(several.chosen_ids) == {
        personal_entity_id("Marrowgate Bank"),
        personal_entity_id("Marrowgate Holdings"),
    }
    assert kb.entity_linking(["Quillmere Foods"]).chosen is None


async def test_relations_match_triples_both_ways_then_fall_back_to_aspects(
    store: PersonalStore,
) -> None:
    await store.put("acme", "d1", BANK_DOC)
    kb = PersonalKnowledgeBase(await store.view("acme"), trigrams, relation_threshold=0.6)
    match = kb.find_entity_or_value(["Marrowgate Bank"], ["chair of"])
    assert [f.text() for f in match.facts] == ["(Rosalind Achebe-Fry, chair of, Marrowgate Bank)"]
    assert match.entity_id == personal_entity_id("Marrowgate Bank")
    # The same triple from its subject's side.
    rosalind = kb.find_entity_or_value(["Rosalind Achebe-Fry"], ["chair of"])
    assert [f.text() for f in rosalind.facts] == [
        "(Rosalind Achebe-Fry, chair of, Marrowgate Bank)"
    ]
    # No triple's relation is near "coal lending": the aspect fact answers.
    coal = kb.find_entity_or_value(["Marrowgate Bank"], ["coal lending"])
    assert [f.aspect_fact.aspect for f in coal.facts if f.aspect_fact] == ["coal lending"]
    info = kb.get_entity_info(["Marrowgate Bank"])
    assert (len(info.descriptions), len(info.triples), len(info.aspect_facts)) == (1, 2, 1)
    path = kb.find_relationship(["Rosalind Achebe-Fry"], ["Jonas Whitlock"], max_hops=2)
    assert [len(p.triples) for p in path.paths] == [2]


async def test_combined_base_answers_from_both_bases(store: PersonalStore) -> None:
    await store.put("acme", "d1", BANK_DOC)
    personal = PersonalKnowledgeBase(await store.view("acme"), trigrams)
    other = PersonalKnowledgeBase(await new_view(store), trigrams)
    both = CombinedKnowledgeBase([other, personal])
    assert both.entity(personal_entity_id("Marrowgate Bank")) is not None
    info = both.get_entity_info([personal_entity_id("Marrowgate Bank")])
    assert len(info.triples) == 2
    assert both.entity_linking(["Marrowgate Bank"]).chosen == personal_entity_id("Marrowgate Bank")


async def new_view(store: PersonalStore):  # type: ignore[no-untyped-def]
    await store.put("other", "x", [aspect("Quaystone Telecom", "whistleblowing", "Quaystone.")])
    return await store.view("other")


async def test_a_lookup_by_id_asks_other_bases_only_about_exact_namesakes(
    store: PersonalStore,
) -> None:
    await store.put("acme", "d1", BANK_DOC)
    await store.put("near", "n1", [aspect("Marrowgate Banks", "branches", "Near-namesake.")])
    await store.put("same", "s1", [aspect("Marrowgate Bank", "branches", "Exact namesake.")])
    acme = PersonalKnowledgeBase(await store.view("acme"), trigrams)
    near = PersonalKnowledgeBase(await store.view("near"), trigrams, link_threshold=0.5)
    same = PersonalKnowledgeBase(await store.view("same"), trigrams)
    bank = personal_entity_id("Marrowgate Bank")
    assert near.entity_linking(["Marrowgate Bank"]).chosen is not None  # it would link
    info = CombinedKnowledgeBase([acme, near, same]).get_entity_info([bank])
    assert [a.value for a in info.aspect_facts] == [
        "Marrowgate Bank will end coal lending by 2030.",
        "Exact namesake.",
    ]


def fresh_view(view: TenantFacts) -> TenantFacts:
    """The same documents in a new view, its indexes built from scratch."""
    out = TenantFacts(view.tenant)
    out.documents = dict(view.documents)
    return out


def counted(calls: list[list[str]]) -> Callable[[Sequence[str]], np.ndarray]:
    def encode(texts: Sequence[str]) -> np.ndarray:
        calls.append(list(texts))
        return trigrams(texts)

    return encode


def same_indexes(view: TenantFacts) -> None:
    fresh = fresh_view(view)
    assert list(view.names.items()) == list(fresh.names.items())
    for entity_id in fresh.names:
        assert view.facts_of_entity(entity_id) == fresh.facts_of_entity(entity_id)
    assert view.by_first_word() == fresh.by_first_word()
    ids, rows, vectors = view.name_matrix(trigrams)
    fresh_ids, fresh_rows, fresh_vectors = fresh.name_matrix(trigrams)
    assert (ids, rows) == (fresh_ids, fresh_rows)
    np.testing.assert_allclose(vectors, fresh_vectors, atol=1e-6)


async def test_indexes_grow_with_new_documents_and_rebuild_after_replacement() -> None:
    view = TenantFacts("acme")
    view.replace("d1", list(BANK_DOC), trigrams(["x"] * len(BANK_DOC)))
    calls: list[list[str]] = []
    encode = counted(calls)
    first_names = view.names
    assert len(view.name_matrix(encode)[0]) == len(first_names)
    embedded = len(calls[0])
    # A new document extends every index: a reader's old dict stays as it was,
    # and the name matrix embeds only the names that are new.
    added = [
        aspect("Marrowgate Holdings", "shares", "Holdings shares."),
        triple("Marrowgate Holdings", "owns", "Marrowgate Bank"),
    ]
    view.replace("d2", added, trigrams(["y"] * len(added)))
    assert personal_entity_id("Marrowgate Holdings") not in first_names
    assert personal_entity_id("Marrowgate Holdings") in view.names
    view.name_matrix(encode)
    assert calls[1:] == [["Marrowgate Holdings"]]
    assert embedded == len(first_names)
    same_indexes(view)
    # Replacing or deleting a document rebuilds them, in the documents' order.
    view.replace("d1", [description("Quillmere Foods", "A grocer.")], trigrams(["z"]))
    same_indexes(view)
    assert personal_entity_id("Rosalind Achebe-Fry") not in view.names
    view.replace("d2", [], trigrams([]))
    same_indexes(view)
    assert list(view.names.values()) == ["Quillmere Foods"]


async def test_link_mentions_embeds_once_and_links_as_one_by_one(store: PersonalStore) -> None:
    await store.put("acme", "d1", BANK_DOC)
    await store.put("acme", "d2", [aspect("Marrowgate Holdings", "shares", "Holdings shares.")])
    calls: list[list[str]] = []
    kb = PersonalKnowledgeBase(await store.view("acme"), counted(calls), name_vectors=trigrams)
    mentions = [["Marrowgate"], ["marrowgate  bank"], ["Quillmere Foods"], ["Rosalind Fry"]]
    together = kb.link_mentions(mentions)
    assert calls == [["Marrowgate", "Quillmere Foods", "Rosalind Fry"]]
    assert together == [kb.entity_linking(m) for m in mentions]
    assert set(together[0].chosen_ids) == {
        personal_entity_id("Marrowgate Bank"),
        personal_entity_id("Marrowgate Holdings"),
    }
    assert together[1].chosen == personal_entity_id("Marrowgate Bank")
    assert together[2].chosen is None


async def test_store_deletes_first_only_what_the_engines_may_hold(store: PersonalStore) -> None:
    deleted: list[str] = []
    delete = store.lexical.delete

    async def spy(tenant: str, doc_ids: Sequence[str]) -> int:
        deleted.extend(doc_ids)
        return await delete(tenant, doc_ids)

    store.lexical.delete = spy  # type: ignore[method-assign]
    # A new document: nothing to delete; a new one without facts: nothing at all.
    assert (await store.put("acme", "d1", BANK_DOC)).counts["aspect"] == 1
    empty = await store.put("acme", "d2", [])
    assert (sum(empty.counts.values()), empty.removed, deleted) == (0, 0, [])
    # A document it holds is replaced: its facts are deleted first.
    replaced = await store.put("acme", "d1", [description("Marrowgate Bank", "A lender.")])
    assert (replaced.removed, deleted) == (4, ["d1"])
    assert await bm25(store, "acme", "coal lending") == ["Marrowgate Bank: A lender."]
    # A write that failed half-way leaves the document unsettled: the next one deletes.
    index = store.lexical.index

    async def fail(*args: object, **kwargs: object) -> None:
        raise RuntimeError("disk full")

    store.lexical.index = fail  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        await store.put("acme", "d3", [aspect("Norvale Copper", "output", "Output rose.")])
    store.lexical.index = index  # type: ignore[method-assign]
    await store.put("acme", "d3", [aspect("Norvale Copper", "output", "Output rose.")])
    assert deleted == ["d1", "d3"]
    assert [f.text() for f in await store.retrieve("acme", "output rose", 3)]
