"""An id is stored exactly as given: one that trimming would change is refused
per item (INVALID_ID), never rewritten, in Ingest, Delete and the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from attest.core.context import tenant_var
from attest.ingest.servicer import IngestServicer
from attest.ingest.settings import IngestSettings
from attest.ingest.v1 import ingest_pb2

SPACED = [" sp1 ", "sp1\u00a0", "\u2003sp1", "sp1\t"]


def _item(doc_id: str, body: str) -> ingest_pb2.IngestItem:
    raw = json.dumps({"id": doc_id, "body": body}).encode()
    return ingest_pb2.IngestItem(raw_json=raw, origin=f"req:{doc_id!r}")


@pytest.fixture
async def servicer(tmp_path: Path):
    servicer = IngestServicer(IngestSettings(data_dir=tmp_path))
    await servicer.warm_up()
    token = tenant_var.set("default")
    try:
        yield servicer
    finally:
        tenant_var.reset(token)
        await servicer.close()


async def _ingest(servicer: IngestServicer, items: list[ingest_pb2.IngestItem]) -> Any:
    reply = await servicer.Ingest(ingest_pb2.IngestRequest(items=items), None)  # type: ignore[arg-type]
    assembly = servicer._assembly
    assert assembly is not None
    assert assembly.inline is not None
    await assembly.inline.drain()
    return assembly.core.job("default", reply.job.job_id, failures_limit=100)


async def test_a_spaced_id_fails_alone_and_does_not_replace_its_trimmed_twin(servicer):
    items = [_item("sp1", "The plant opened in May.")]
    items += [_item(s, f"A different story number {i}.") for i, s in enumerate(SPACED)]
    job = await _ingest(servicer, items)
    p = job.progress
    assert (p.received, p.created, p.superseded, p.failed) == (5, 1, 0, 4)
    # Named as sent, except the tab, a control character, which only the
    # reason shows (escaped).
    by_origin = {f.origin: f for f in job.failures}
    assert {by_origin[f"req:{s!r}"].doc_id for s in SPACED} == {*SPACED[:3], ""}
    assert {f.code for f in job.failures} == {"INVALID_ID"}
    assert all("white space" in by_origin[f"req:{s!r}"].reason for s in SPACED[:3])
    assert "control characters" in by_origin[f"req:{SPACED[3]!r}"].reason
    # What is stored under sp1 is the document sent as sp1.
    reply = await servicer.Delete(
        ingest_pb2.DeleteRequest(doc_ids=["sp1"], dry_run=True),
        None,  # type: ignore[arg-type]
    )
    assert list(reply.doc_ids) == ["sp1"]


async def test_delete_refuses_a_spaced_id_per_item_and_deletes_the_others(servicer):
    await _ingest(servicer, [_item("sp1", "The plant opened in May."), _item("sp2", "Closed.")])
    reply = await servicer.Delete(
        ingest_pb2.DeleteRequest(doc_ids=[" sp1 ", "sp2"]),
        None,  # type: ignore[arg-type]
    )
    assert (reply.matched, reply.deleted, list(reply.doc_ids)) == (1, 1, ["sp2"])
    [failure] = reply.failures
    assert (failure.item_index, failure.doc_id) == (0, " sp1 ")
    assert failure.code == ingest_pb2.FAILURE_CODE_INVALID_ID
    assert failure.stage == ingest_pb2.STAGE_RECEIVE
    assert "doc_ids[0]" in failure.reason
    assert "white space" in failure.reason
    # sp1 itself is still there: the spaced id matched nothing and removed nothing.
    only_bad = await servicer.Delete(
        ingest_pb2.DeleteRequest(doc_ids=["sp1\u00a0"]),
        None,  # type: ignore[arg-type]
    )
    assert (only_bad.matched, only_bad.deleted, len(only_bad.failures)) == (0, 0, 1)
    kept = await servicer.Delete(
        ingest_pb2.DeleteRequest(doc_ids=["sp1"], dry_run=True),
        None,  # type: ignore[arg-type]
    )
    assert list(kept.doc_ids) == ["sp1"]


def test_cli_reports_a_file_whose_name_makes_a_refused_id(tmp_path: Path):
    from attest.cli import main

    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("The plant opened in May.", encoding="utf-8")
    (folder / " b.txt").write_text("The mine closed in June.", encoding="utf-8")
    state = str(tmp_path / "state")
    out = CliRunner().invoke(main, ["ingest", str(folder), "--data-dir", state])
    assert "ingested 1" in out.output, out.output
    assert "failed 1" in out.output
    assert "INVALID_ID" in out.output
    assert "' b.txt'" in out.output
    out = CliRunner().invoke(main, ["ingest", "delete", "a.txt", " a.txt", "--data-dir", state])
    assert out.exit_code == 1, out.output
    assert out.stdout.splitlines() == ["removed 1 of 2 documents", "  a.txt"]
    assert "refused (1):" in out.stderr
    assert "' a.txt'" in out.stderr
    assert "not found" not in out.stderr
