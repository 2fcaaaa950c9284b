"""The ingestion pipeline in embedded mode: inline stages, tantivy and the embedded
vector store in a temporary folder, job state in memory. No sockets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from attest.core.common import Filters
from attest.ingest.assembly import Assembly, assemble
from attest.ingest.commands import ingest as ingest_command
from attest.ingest.documents import ItemError, article_from_raw_json
from attest.ingest.jobs import Item
from attest.ingest.settings import IngestSettings
from attest.ingest.sinks import LocalSinks
from attest.lexical.models import Level, SearchQuery

SAMPLE = Path(__file__).resolve().parents[2] / "services/attest/demo/sample_corpus.jsonl"
TENANT = "default"


def _items(lines: list[bytes], name: str = "sample.jsonl") -> list[Item]:
    out = []
    for number, line in enumerate(lines, start=1):
        try:
            out.append(Item(f"{name}:{number}", article_from_raw_json(line)))
        except ItemError as err:
            out.append(Item(f"{name}:{number}", error=err))
    return out


async def _run(assembly: Assembly, items: list[Item]):
    snapshot = assembly.core.ingest(TENANT, items)
    assert assembly.inline is not None
    await assembly.inline.drain()
    return assembly.core.job(TENANT, snapshot.job_id, failures_limit=1000)


async def _counts(assembly: Assembly) -> tuple[int, int, int, int, int]:
    sinks = assembly.core.sinks
    assert isinstance(sinks, LocalSinks)
    lexical = await sinks.lexical.stats(TENANT)
    semantic = await sinks.semantic.stats(TENANT)
    return (
        lexical.documents,
        lexical.passages,
        semantic.documents,
        semantic.passages,
        semantic.kg_links,
    )


@pytest.fixture
async def embedded(tmp_path: Path):
    assembly = await assemble(IngestSettings(data_dir=tmp_path))
    try:
        yield assembly
    finally:
        await assembly.close()


@pytest.mark.timeout(900)
async def test_embedded_ingest_update_delete_and_bad_input(embedded: Assembly):
    lines = SAMPLE.read_bytes().splitlines()
    bad = [
        b'{"id": "broken", "body": ',
        b'{"title": "no id", "body": "text"}',
        b'{"id": "empty", "body": "   "}',
        b'{"id": "dated", "body": "Text.", "published_at": "yesterday"}',
        b'{"id": "latin1", "body": "caf\xe9"}',
        json.dumps({"id": "huge", "body": "a" * (9 * 1024 * 1024)}).encode(),
    ]
    job = await _run(embedded, _items(lines + bad))
    p = job.progress
    assert job.state == "DONE"
    assert (p.received, p.created, p.updated, p.unchanged, p.failed) == (54, 48, 0, 0, 6)
    assert (p.enriched, p.embedded, p.indexed) == (48, 48, 48)
    failures = {(f.origin, f.doc_id, f.stage, f.code) for f in job.failures}
    assert failures == {
        ("sample.jsonl:49", "", "RECEIVE", "INVALID_JSON"),
        ("sample.jsonl:50", "", "RECEIVE", "MISSING_ID"),
        ("sample.jsonl:51", "empty", "RECEIVE", "EMPTY_BODY"),
        ("sample.jsonl:52", "dated", "RECEIVE", "INVALID_DATE"),
        ("sample.jsonl:53", "", "RECEIVE", "INVALID_UTF8"),
        ("sample.jsonl:54", "huge", "RECEIVE", "BODY_TOO_LARGE"),
    }
    assert all(f.reason for f in job.failures)

    registry = embedded.core.store.registry_all(TENANT)
    assert len(registry) == 48
    passages = sum(e.passages for e in registry.values())
    links = sum(len(e.entity_ids) for e in registry.values())
    assert passages == p.passages_indexed
    assert sum(1 for e in registry.values() if e.entity_ids) >= 40  # ESG articles link
    assert sum(1 for e in registry.values() if e.organizations) >= 40
    first = await _counts(embedded)
    assert first == (48, passages, 48, passages, links)

    # The same content again changes nothing.
    again = await _run(embedded, _items(lines))
    assert (again.state, again.progress.unchanged, again.progress.indexed) == ("DONE", 48, 0)
    assert await _counts(embedded) == first
    assert embedded.core.store.registry_all(TENANT) == registry

    # Three articles shrink to one sentence: their old passages disappear.
    changed = []
    for line in lines[:3]:
        record = json.loads(line)
        record["body"] = "Zanzibarite quarterly volumes were flat."
        changed.append(json.dumps(record).encode())
    update = await _run(embedded, _items(changed + lines[3:]))
    assert (update.progress.updated, update.progress.unchanged, update.progress.created) == (
        3,
        45,
        0,
    )
    old = sum(registry[json.loads(line)["id"]].passages for line in lines[:3])
    after = await _counts(embedded)
    assert after[1] == after[3] == passages - old + 3
    sinks = embedded.core.sinks
    assert isinstance(sinks, LocalSinks)
    hits = await sinks.lexical.search(
        TENANT, SearchQuery(text="Zanzibarite", top_k=10, level=Level.PASSAGE)
    )
    assert sorted((h.doc_id, h.passage_index) for h in hits) == sorted(
        (json.loads(line)["id"], 0) for line in lines[:3]
    )

    # Delete two by id and every article of one organization by filter.
    ids = [json.loads(line)["id"] for line in lines[3:5]]
    result = await embedded.core.delete(TENANT, doc_ids=[*ids, "never-seen"])
    assert (result.matched, result.deleted) == (2, 2)
    org = registry[json.loads(lines[10])["id"]].organizations[0]
    targets = sorted(
        d
        for d, e in embedded.core.store.registry_all(TENANT).items()
        if org.casefold() in {o.casefold() for o in e.organizations}
    )
    dry = await embedded.core.delete(
        TENANT, filters=Filters(keywords={"organizations": (org,)}), dry_run=True
    )
    assert (dry.matched, dry.deleted, list(dry.doc_ids)) == (len(targets), 0, targets)
    gone = await embedded.core.delete(TENANT, filters=Filters(keywords={"organizations": (org,)}))
    assert gone.deleted == len(targets) >= 1
    left = embedded.core.store.registry_all(TENANT)
    assert len(left) == 48 - 2 - len(targets)
    counts = await _counts(embedded)
    assert counts[0] == counts[2] == len(left)
    assert counts[1] == counts[3] == sum(e.passages for e in left.values())
    assert counts[4] == sum(len(e.entity_ids) for e in left.values())


@pytest.mark.timeout(600)
def test_cli_ingests_a_folder_and_reports(tmp_path: Path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "water.md").write_text(
        "# Water use\n\nAcme Holdings cut water withdrawal by 12% at its Ridge plant.",
        encoding="utf-8",
    )
    (docs / "page.html").write_text(
        "<title>Strike</title><p>Workers at Vanta Mining Corp went on strike.</p>",
        encoding="utf-8",
    )
    (docs / "empty.txt").write_text("  ", encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(ingest_command, [str(docs), "--data-dir", str(tmp_path / "state")])
    # A finished job with a failed item exits 2: a script must not take it for success.
    assert result.exit_code == 2, result.output
    assert "received 3  ingested 2  updated 0  unchanged 0  failed 1" in result.output
    assert "failed empty.txt (empty.txt): EMPTY_BODY body: is empty" in result.output
    # State is kept on disk: the same folder again is unchanged.
    second = runner.invoke(ingest_command, [str(docs), "--data-dir", str(tmp_path / "state")])
    assert second.exit_code == 2, second.output
    assert "ingested 0  updated 0  unchanged 2  failed 1" in second.output
    # Without the bad file every document is in: exit 0.
    (docs / "empty.txt").unlink()
    third = runner.invoke(ingest_command, [str(docs), "--data-dir", str(tmp_path / "state")])
    assert third.exit_code == 0, third.output
    assert "ingested 0  updated 0  unchanged 2  failed 0" in third.output


async def test_a_later_item_with_the_same_id_supersedes_an_earlier_one(embedded: Assembly):
    lines = [
        b'{"id": "x", "body": "First version of the story about water use."}',
        b'{"id": "y", "body": "Another story about emissions."}',
        b'{"id": "x", "body": "Second, different version about emissions."}',
    ]
    job = await _run(embedded, _items(lines))
    p = job.progress
    assert job.state == "DONE"
    assert (p.received, p.created, p.unchanged, p.superseded, p.failed) == (3, 2, 1, 1, 0)
    assert p.finished == p.received
    sinks = embedded.core.sinks
    assert isinstance(sinks, LocalSinks)
    hits = await sinks.lexical.search(
        TENANT, SearchQuery(text="water", top_k=10, level=Level.PASSAGE)
    )
    assert hits == [], "the earlier version of x is not what is stored"
    hits = await sinks.lexical.search(
        TENANT, SearchQuery(text="Second different version", top_k=10, level=Level.PASSAGE)
    )
    assert [h.doc_id for h in hits] == ["x"]
    # Sent again without the duplicate: nothing is superseded, x is unchanged.
    again = await _run(embedded, _items(lines[1:]))
    assert (again.progress.unchanged, again.progress.superseded) == (2, 0)


def test_cli_says_which_unchanged_records_were_superseded(tmp_path: Path):
    source = tmp_path / "dup.jsonl"
    source.write_text(
        '{"id": "x", "body": "First version."}\n{"id": "x", "body": "Second version."}\n'
    )
    out = CliRunner().invoke(ingest_command, [str(source), "--data-dir", str(tmp_path / "state")])
    assert out.exit_code == 0, out.output
    assert "received 2  ingested 1  updated 0  unchanged 1  failed 0" in out.output
    assert "of the unchanged, 1 were replaced by a later record of the input with the same id" in (
        out.output
    )


def test_cli_reads_one_text_file_and_reports_what_a_folder_leaves_out(tmp_path: Path):
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "notes.md").write_text("# Water use\n\nThe plant cut its water use by 12%.\n")
    (folder / "chart.png").write_bytes(b"\x89PNG\r\n")
    (folder / "data.jsonl").write_text('{"id": "a", "body": "x"}\n')
    state = str(tmp_path / "state")
    out = CliRunner().invoke(ingest_command, [str(folder / "notes.md"), "--data-dir", state])
    assert out.exit_code == 0, out.output
    assert "received 1  ingested 1" in out.output
    out = CliRunner().invoke(ingest_command, [str(folder), "--data-dir", state])
    assert out.exit_code == 0, out.output
    assert "warning: 2 files under" in out.output
    assert "are left out (e.g. chart.png, data.jsonl)" in out.output
    assert "received 1  ingested 0  updated 0  unchanged 1" in out.output
    empty = tmp_path / "empty"
    empty.mkdir()
    out = CliRunner().invoke(ingest_command, [str(empty), "--data-dir", state])
    assert out.exit_code == 0, out.output
    assert f"nothing to ingest: {empty} holds no documents" in out.output
    assert "job " not in out.output


def test_cli_usage_errors_name_the_command_the_user_typed(tmp_path: Path):
    from attest.cli import main

    missing = tmp_path / "missing"
    out = CliRunner().invoke(main, ["ingest", str(missing)], prog_name="attest")
    assert out.exit_code == 2
    assert "Usage: attest ingest [OPTIONS] PATH" in out.output
    assert "Try 'attest ingest --help' for help." in out.output
    assert "load" not in out.output
    out = CliRunner().invoke(
        main, ["ingest", "--batch-size", "0", str(tmp_path)], prog_name="attest"
    )
    assert out.exit_code == 2
    assert "Try 'attest ingest --help' for help." in out.output
    assert "Invalid value for '--batch-size'" in out.output


def test_cli_names_the_keys_it_does_not_read(tmp_path: Path):
    lines = tmp_path / "news.jsonl"
    lines.write_text(
        '{"id": "d1", "body": "The plant opened.", "date": "2024-06-14", "url": "https://x.org"}\n'
        '{"id": "d2", "body": "Another one.", "date": "2024-06-15"}\n'
        '{"id": "d3", "body": "A third.", "published_at": "2024-06-16"}\n',
        encoding="utf-8",
    )
    out = CliRunner().invoke(ingest_command, [str(lines), "--data-dir", str(tmp_path / "s")])
    assert out.exit_code == 0, out.output
    assert (
        "warning: keys that ingest does not read, in the first 3 records (how many carry "
        "each): date (2), url (1). A document is read from _id, body, entity_ids, id, "
        "language, metadata, organizations, published_at, source_url, text, title"
    ) in out.output
    assert "received 3  ingested 3" in out.output
    clean = tmp_path / "clean.jsonl"
    clean.write_text('{"id": "d4", "body": "Fine."}\n', encoding="utf-8")
    out = CliRunner().invoke(ingest_command, [str(clean), "--data-dir", str(tmp_path / "s")])
    assert "warning" not in out.output


def test_cli_deletes_documents_by_id(tmp_path: Path):
    from attest.cli import main

    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("The plant opened in May.", encoding="utf-8")
    (folder / "b.txt").write_text("The mine closed in June.", encoding="utf-8")
    state = str(tmp_path / "state")
    out = CliRunner().invoke(ingest_command, [str(folder), "--data-dir", state])
    assert "ingested 2" in out.output
    runner = CliRunner()
    out = runner.invoke(
        main, ["ingest", "delete", "a.txt", "gone.txt", "--dry-run", "--data-dir", state]
    )
    assert out.exit_code == 0, out.output
    assert out.stdout.splitlines() == ["would remove 1 of 2 documents", "  a.txt"]
    assert "not found (1): gone.txt" in out.stderr
    out = runner.invoke(main, ["ingest", "delete", "a.txt", "--data-dir", state])
    assert out.stdout.splitlines() == ["removed 1 of 1 documents", "  a.txt"]
    # Gone from the registry: ingesting the folder again creates it anew.
    out = CliRunner().invoke(ingest_command, [str(folder), "--data-dir", state])
    assert "received 2  ingested 1  updated 0  unchanged 1" in out.output
    out = runner.invoke(main, ["ingest", "delete", "bad id\n", "--data-dir", state])
    assert out.exit_code == 1
    assert "refused (1):" in out.stderr
    assert "doc_ids[0]: contains control characters" in out.stderr
