"""The embedded tantivy backend, used directly (no sockets)."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
import tantivy

from attest.core.errors import Unavailable
from attest.lexical.backends.tantivy import TantivyBackend, english_analyzer
from attest.lexical.models import DocumentIn, Filters, Level, PassageIn, SearchQuery
from attest.lexical.settings import LexicalSettings

DOCS = [
    DocumentIn(
        id="w1",
        title="Brightwater cuts water withdrawal",
        body="Brightwater Utilities reduced its water withdrawal by 12% in 2025.",
        keywords={"organizations": ("Brightwater Utilities",), "entity_ids": ("gri-303",)},
        published_at=datetime(2025, 3, 1, tzinfo=UTC),
        passages=(
            PassageIn(0, "Brightwater Utilities reduced its water withdrawal by 12%."),
            PassageIn(1, "The utility also replaced old mains."),
        ),
    ),
    DocumentIn(
        id="e1",
        title="Norvale raises emissions target",
        body="Norvale Copper raised its 2030 emissions target to 55%.",
        keywords={"organizations": ("Norvale Copper",), "entity_ids": ("gri-305",)},
        published_at=datetime(2026, 1, 22, tzinfo=UTC),
    ),
    DocumentIn(
        id="l1",
        title="Audit finds child workers",
        body="Auditors found workers under 16 at a garment supplier; water was scarce on site.",
        keywords={"organizations": ("Halvorsen Textiles",), "entity_ids": ("gri-408",)},
        published_at=datetime(2025, 4, 8, tzinfo=UTC),
    ),
]


@pytest.fixture
async def backend(tmp_path: Path):
    b = TantivyBackend(LexicalSettings(data_dir=tmp_path, index_name="unit"))
    await b.warm_up()
    await b.index("default", DOCS, refresh=True)
    yield b
    await b.close()


def test_analyzer_stems_and_drops_english_stop_words():
    assert english_analyzer().analyze("The Companies' running of the Mines") == [
        "compani",
        "run",
        "mine",
    ]


async def test_search_ranks_the_matching_document_first(backend):
    hits = await backend.search("default", SearchQuery(text="water withdrawal", top_k=3))
    assert [h.doc_id for h in hits][:2] == ["w1", "l1"]
    assert hits[0].score > hits[1].score > 0
    assert hits[0].passage_index == -1
    assert hits[0].keywords["organizations"] == ("Brightwater Utilities",)
    assert hits[0].published_at == datetime(2025, 3, 1, tzinfo=UTC)


async def test_query_syntax_is_not_interpreted(backend):
    hits = await backend.search(
        "default", SearchQuery(text='title:(water AND "x" OR) ^2 ~', top_k=3)
    )
    assert hits[0].doc_id == "w1"
    assert await backend.search("default", SearchQuery(text="the of and", top_k=3)) == []


async def test_passage_level_search(backend):
    hits = await backend.search("default", SearchQuery(text="mains", top_k=5, level=Level.PASSAGE))
    assert [(h.doc_id, h.passage_index) for h in hits] == [("w1", 1)]


async def test_filters(backend):
    def q(**filters):
        return SearchQuery(text="water emissions workers", top_k=10, filters=Filters(**filters))

    ids = lambda hits: sorted(h.doc_id for h in hits)  # noqa: E731
    assert ids(
        await backend.search("default", q(keywords={"organizations": ("norvale copper",)}))
    ) == ["e1"]
    assert ids(
        await backend.search("default", q(keywords={"entity_ids": ("gri-303", "gri-408")}))
    ) == [
        "l1",
        "w1",
    ]
    since_2026 = q(published_from=datetime(2026, 1, 1, tzinfo=UTC))
    assert ids(await backend.search("default", since_2026)) == ["e1"]
    first_half_2025 = q(
        published_from=datetime(2025, 1, 1, tzinfo=UTC),
        published_to=datetime(2025, 3, 31, tzinfo=UTC),
    )
    assert ids(await backend.search("default", first_half_2025)) == ["w1"]


async def test_highlights_mark_query_terms(backend):
    (hit, *_) = await backend.search(
        "default", SearchQuery(text="emissions target", top_k=1, highlight=True)
    )
    assert hit.doc_id == "e1"
    assert any("<em>emissions</em>" in h for h in hit.highlights)
    assert any("<em>target</em>" in h for h in hit.highlights)


async def test_tenants_are_isolated(backend):
    assert await backend.search("other", SearchQuery(text="water", top_k=5)) == []
    await backend.index("other", [DOCS[1]], refresh=True)
    other = await backend.stats("other")
    assert (other.documents, other.passages) == (1, 0)
    mine = await backend.stats("default")
    assert (mine.documents, mine.passages) == (3, 2)
    assert await backend.delete("other", ["w1"]) == 0
    assert (await backend.stats("default")).documents == 3


async def test_reindexing_is_idempotent_and_replaces_passages(backend):
    await backend.index("default", DOCS, refresh=True)
    counts = await backend.stats("default")
    assert (counts.documents, counts.passages) == (3, 2)
    shorter = DocumentIn(
        id="w1",
        title="Brightwater update",
        body="Brightwater now reports leakage.",
        passages=(PassageIn(0, "Brightwater now reports leakage."),),
    )
    await backend.index("default", [shorter], refresh=True)
    counts = await backend.stats("default")
    assert (counts.documents, counts.passages) == (3, 1)
    assert (
        await backend.search("default", SearchQuery(text="mains", top_k=5, level=Level.PASSAGE))
        == []
    )
    hits = await backend.search("default", SearchQuery(text="leakage", top_k=5))
    assert [h.title for h in hits] == ["Brightwater update"]


async def test_delete_removes_document_and_passages(backend):
    assert await backend.delete("default", ["w1", "missing"]) == 1
    counts = await backend.stats("default")
    assert (counts.documents, counts.passages) == (2, 0)
    assert await backend.delete("default", ["w1"]) == 0


async def test_state_survives_reopening(backend, tmp_path):
    await backend.close()
    reopened = TantivyBackend(LexicalSettings(data_dir=tmp_path, index_name="unit"))
    await reopened.warm_up()
    try:
        counts = await reopened.stats("default")
        assert (counts.documents, counts.passages) == (3, 2)
    finally:
        await reopened.close()


async def test_an_earlier_index_whose_records_have_no_tenant_is_unavailable(tmp_path: Path):
    # An index of the earlier layout is rebuilt in the current one when opened
    # (tests/unit/test_tantivy_earlier_layout.py), from the tenant each record was
    # indexed under; one whose records have none cannot be, and is left as it is.
    earlier = tantivy.SchemaBuilder()
    earlier.add_text_field("doc_id", stored=True, tokenizer_name="raw")
    earlier.add_text_field("organizations", stored=True, tokenizer_name="raw")
    path = tmp_path / "lexical" / "unit-documents"
    path.mkdir(parents=True)
    index = tantivy.Index(earlier.build(), path=str(path), reuse=True)
    writer = index.writer(15_000_000, 1)
    writer.add_document(tantivy.Document(doc_id="d1", organizations=["Acme"]))
    writer.commit()
    writer.wait_merging_threads()
    backend = TantivyBackend(LexicalSettings(data_dir=tmp_path, index_name="unit"))
    with pytest.raises(Unavailable, match="1 of its 1 records have no tenant to rebuild them"):
        await backend.warm_up()
    assert sorted(p.name for p in path.parent.iterdir()) == ["unit-documents"]


def _many(prefix: str, n: int) -> list[DocumentIn]:
    return [
        DocumentIn(
            id=f"{prefix}{i}",
            title=f"Water report {prefix}{i}",
            body=f"Water withdrawal fell at site {i}; the {prefix} series.",
            passages=(PassageIn(0, f"Water at site {i}."), PassageIn(1, f"Series {prefix}.")),
        )
        for i in range(n)
    ]


async def _both_views(backend, level: Level) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    full = await backend.search("default", SearchQuery(text="water", top_k=100, level=level))
    ids = await backend.search(
        "default", SearchQuery(text="water", top_k=100, level=level, ids_only=True)
    )
    return [(h.doc_id, h.passage_index) for h in full], [(h.doc_id, h.passage_index) for h in ids]


@pytest.mark.parametrize("level", [Level.DOCUMENT, Level.PASSAGE])
async def test_ids_only_hits_stay_right_across_commits_deletes_and_merges(backend, level):
    """An id table read through one searcher must never name another's documents:
    each commit replaces the searcher, and with it the table."""
    for round_ in range(6):
        # Each index call commits; deletes and replacements move documents
        # between segments, and tantivy merges segments in the background.
        await backend.index("default", _many(f"r{round_}-", 12), refresh=True)
        await backend.delete("default", [f"r{round_ - 1}-{i}" for i in range(0, 12, 2)])
        await backend.index("default", _many(f"r{round_ - 1}-", 3), refresh=True)
        full, ids = await _both_views(backend, level)
        assert ids == full
        assert len(full) > 12
    # Searched twice through one searcher: the second answer comes from the table.
    docs, passages = backend._ready()
    snap = (passages if level is Level.PASSAGE else docs).snapshot()
    assert snap.ids
    full, ids = await _both_views(backend, level)
    assert ids == full


async def test_a_stale_snapshot_is_replaced_and_the_table_bounded(backend, monkeypatch):
    import attest.lexical.backends.tantivy as module

    docs, _ = backend._ready()
    first = docs.snapshot()
    assert docs.snapshot() is first
    monkeypatch.setattr(module, "_SNAPSHOT_SECONDS", 0.0)
    assert docs.snapshot() is not first
    monkeypatch.setattr(module, "_SNAPSHOT_SECONDS", 3600.0)
    monkeypatch.setattr(module, "_SNAPSHOT_IDS", 1)
    full, ids = await _both_views(backend, Level.DOCUMENT)
    assert ids == full
    assert len(full) == 2
    assert len(docs.snapshot().ids) == 1


async def test_searches_of_a_small_index_run_on_the_event_loop(backend):
    loop_thread = threading.get_ident()
    seen: list[int] = []
    search = backend._search_sync

    def spy(tenant, query):
        seen.append(threading.get_ident())
        return search(tenant, query)

    backend._search_sync = spy
    for _ in range(4):
        await backend.search("default", SearchQuery(text="water", top_k=3))
    # The first is measured on a thread; a search this small then runs inline.
    assert seen[0] != loop_thread
    assert seen[1:] == [loop_thread] * 3


async def test_a_refresh_that_took_its_searcher_before_a_commit_does_not_hide_the_commit(
    backend, monkeypatch
):
    """A search refreshing a stale snapshot and a commit race: the refresh's
    searcher predates the commit, and must not replace the commit's."""
    import attest.lexical.backends.tantivy as module

    docs, _ = backend._ready()
    real = docs.index
    taken, release = threading.Event(), threading.Event()
    refresher = threading.get_ident

    class SlowFirstSearcher:
        """The index, whose next searcher() in the refreshing thread is taken at
        once and handed back only after the commit has run."""

        def __init__(self) -> None:
            self.armed = True

        def searcher(self):
            searcher = real.searcher()
            if self.armed and threading.get_ident() == owner[0]:
                self.armed = False
                taken.set()
                release.wait(10)
            return searcher

        def __getattr__(self, name):
            return getattr(real, name)

    owner = [refresher()]
    docs.index = SlowFirstSearcher()
    monkeypatch.setattr(module, "_SNAPSHOT_SECONDS", 0.0)

    def refresh() -> None:
        owner[0] = threading.get_ident()
        docs.snapshot()

    thread = threading.Thread(target=refresh)
    thread.start()
    assert taken.wait(10)
    monkeypatch.setattr(module, "_SNAPSHOT_SECONDS", 3600.0)
    commit = asyncio.get_running_loop().run_in_executor(
        None, backend._index_sync, "default", _many("late-", 1)
    )
    await asyncio.sleep(0.2)  # the commit waits for the refresh to finish
    release.set()
    await commit
    thread.join(10)
    hits = await backend.search("default", SearchQuery(text="late", top_k=5))
    assert [h.doc_id for h in hits] == ["late-0"]
