"""`attest doctor`: the registry against BM25, vectors and KG links, per tenant.

Drift is made by hand the ways a crash makes it (a document one store lost, a
document written to the stores and never committed, a write cut short), then
found, repaired, and found no more. Embedded mode, no sockets."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from attest.ingest import doctor
from attest.ingest.assembly import Assembly, assemble
from attest.ingest.commands import doctor_command
from attest.ingest.documents import ItemError, article_from_raw_json, content_hash
from attest.ingest.jobs import Item
from attest.ingest.settings import IngestSettings
from attest.ingest.sinks import LocalSinks

SAMPLE = Path(__file__).resolve().parents[2] / "services/attest/demo/sample_corpus.jsonl"
TENANT = "default"


def _items(lines: list[bytes]) -> list[Item]:
    out = []
    for number, line in enumerate(lines, start=1):
        try:
            out.append(Item(f"s:{number}", article_from_raw_json(line)))
        except ItemError as err:
            out.append(Item(f"s:{number}", error=err))
    return out


async def _counts(assembly: Assembly) -> tuple[int, ...]:
    sinks = assembly.core.sinks
    assert isinstance(sinks, LocalSinks)
    lexical = await sinks.lexical.stats(TENANT)
    semantic = await sinks.semantic.stats(TENANT)
    return (lexical.documents, lexical.passages, semantic.documents, semantic.passages)


def _by_store(findings: doctor.TenantFindings) -> dict[str, tuple[list[str], list[str]]]:
    return {s.store: (s.missing, s.orphans) for s in findings.stores}


@pytest.mark.timeout(900)
async def test_doctor_finds_and_repairs_drift(tmp_path: Path):
    lines = SAMPLE.read_bytes().splitlines()[:12]
    assembly = await assemble(IngestSettings(data_dir=tmp_path), startup_check=False)
    try:
        core, inline = assembly.core, assembly.inline
        assert inline is not None
        core.ingest(TENANT, _items(lines))
        await inline.drain()
        (clean,) = await doctor.check(core.store, core.sinks)
        assert clean.consistent
        assert clean.documents == 12
        assert {s.store: s.checksum for s in clean.stores} == {
            "lexical": clean.checksum,
            "vectors": clean.checksum,
            "kg_links": clean.stores[2].checksum,
        }
        good = await _counts(assembly)
        sinks = core.sinks
        assert isinstance(sinks, LocalSinks)
        ids = sorted(core.store.registry_all(TENANT))

        # 1. BM25 lost a document; 2. the vectors lost another.
        await sinks.lexical.delete(TENANT, [ids[0]])
        await sinks.semantic.delete(TENANT, [ids[1]])
        # 3. A document reached the stores but its job never committed it, and the
        #    job is gone (an orphan nobody can delete through the ingest service).
        raw = b'{"id": "orphan-1", "title": "Stray", "body": "Acme cut water use by 9%."}'
        article = article_from_raw_json(raw)
        source = json.dumps({"article": article.to_json(), "hash": content_hash(article)})
        records = inline.runner.rebuild(TENANT, {"orphan-1": source})
        await sinks.index(TENANT, records)
        # 4. A write cut short: the pending note of a finished job, for a
        #    document the registry holds (its stores may hold a half-written version).
        core.store.registry_begin("gone-job", TENANT, [ids[2]])

        (drift,) = await doctor.check(core.store, core.sinks)
        assert not drift.consistent
        by_store = _by_store(drift)
        assert by_store["lexical"] == ([ids[0]], ["orphan-1"])
        assert by_store["vectors"] == ([ids[1]], ["orphan-1"])
        assert by_store["kg_links"][1] == ["orphan-1"]
        assert drift.stale_pending == [ids[2]]
        assert drift.stores[0].documents == 12  # 11 + the orphan: counts alone would agree
        assert drift.stores[0].checksum != drift.checksum

        repairs = await doctor.repair(core.store, core.sinks, inline.runner, drift)
        assert (repairs.reindexed, repairs.deleted, repairs.unrepairable) == (3, 1, ())
        (after,) = await doctor.check(core.store, core.sinks)
        assert after.consistent, after.lines()
        assert after.checksum == clean.checksum
        assert core.store.pending(TENANT) == {}
        assert await _counts(assembly) == good
    finally:
        await assembly.close()

    # The same check from the command line, on the state left on disk.
    result = await asyncio.to_thread(
        CliRunner().invoke, doctor_command, ["--data-dir", str(tmp_path), "--json"]
    )
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("{")]
    report = json.loads(line)
    assert report["consistent"] is True
    assert report["before"][0]["stores"]["lexical"]["documents"] == 12
