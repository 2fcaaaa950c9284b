"""A poison item fails alone: 30 good news articles and one bad item ingest 30 and fail
1 with its reason, the failure is listed as a dead letter, and closing the service
afterwards leaves the state whole. Embedded mode, no sockets."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from attest.ingest.assembly import assemble
from attest.ingest.commands import ingest as ingest_command
from attest.ingest.documents import ItemError, article_from_raw_json
from attest.ingest.jobs import Item
from attest.ingest.settings import IngestSettings
from attest.ingest.sinks import LocalSinks
from attest.ingest.state import JobStore, SqliteKeyValue

SAMPLE = Path(__file__).resolve().parents[2] / "services/attest/demo/sample_corpus.jsonl"
TENANT = "default"
MARKER = "Quarantinable"


def _good(n: int = 30) -> list[bytes]:
    return SAMPLE.read_bytes().splitlines()[:n]


def _items(lines: Sequence[bytes]) -> list[Item]:
    out = []
    for number, line in enumerate(lines, start=1):
        origin = f"news.jsonl:{number}"
        try:
            out.append(Item(origin, article_from_raw_json(line)))
        except ItemError as err:
            out.append(Item(origin, error=err))
    return out


class _PoisonEncoder:
    """The real encoder, except that a text naming ``MARKER`` makes it raise, as a
    tokenizer does on input it cannot take."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    @property
    def name(self) -> str:
        return str(self.inner.name)

    def encode(self, texts: Sequence[str]) -> Any:
        self.calls += 1
        if any(MARKER in t for t in texts):
            raise TypeError("TextEncodeInput must be Union[TextInputSequence, ...]")
        return self.inner.encode(texts)


POISON = {
    "lone surrogate": (
        b'{"id": "poison", "title": "Bad", "body": "Lone surrogate \\ud800 here."}',
        ("poison", "RECEIVE", "INVALID_UTF8", "body: contains a lone surrogate"),
    ),
    "5,000-deep raw_json": (
        b'{"id": "poison", "body": "x", "extra": ' + b"[" * 5000 + b"]" * 5000 + b"}",
        ("", "RECEIVE", "INVALID_JSON", "raw_json: is nested deeper than 32 levels"),
    ),
    "5,000-digit date": (
        b'{"id": "poison", "body": "Text.", "published_at": "' + b"9" * 5000 + b'"}',
        ("poison", "RECEIVE", "INVALID_DATE", "published_at: is 5,000 characters"),
    ),
    "embedder exception": (
        json.dumps(
            {"id": "poison", "title": f"{MARKER} report", "body": "Volumes were flat."}
        ).encode(),
        ("poison", "EMBED", "PROCESSING_ERROR", "embedding failed: TypeError"),
    ),
}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("case", list(POISON))
async def test_one_poison_item_fails_alone_and_the_state_survives_shutdown(
    tmp_path: Path, case: str
):
    poison, (doc_id, stage, code, reason) = POISON[case]
    lines = _good()
    # The poison item sits in the middle of a batch of the pipeline.
    lines.insert(17, poison)
    assembly = await assemble(IngestSettings(data_dir=tmp_path, batch_size=31))
    before = _stage_items()
    try:
        assert assembly.inline is not None
        runner = assembly.inline.runner
        encoder = _PoisonEncoder(runner.embedding.encoder)
        runner.embedding.encoder = encoder
        snapshot = assembly.core.ingest(TENANT, _items(lines))
        await assembly.inline.drain()
        job = assembly.core.job(TENANT, snapshot.job_id)
        p = job.progress
        assert job.state == "DONE"
        assert (p.received, p.indexed, p.created, p.failed) == (31, 30, 30, 1)
        (failure,) = job.failures
        assert (failure.item_index, failure.origin, failure.doc_id) == (17, "news.jsonl:18", doc_id)
        assert (failure.stage, failure.code) == (stage, code)
        assert failure.reason.startswith(reason), failure.reason
        if stage == "EMBED":
            # Halved down to the poison item: about 2·log2(31) calls, not one per item.
            assert 2 <= encoder.calls <= 14
        # The stage metrics count what left each stage.
        after = _stage_items()
        entered = 31 if stage == "EMBED" else 30
        assert {k: after[k] - before[k] for k in after} == {
            ("enrich", "ok"): entered,
            ("embed", "ok"): 30,
            ("embed", "failed"): entered - 30,
            ("index", "ok"): 30,
            ("index", "failed"): 0,
        }
        sinks = assembly.core.sinks
        assert isinstance(sinks, LocalSinks)
        assert (await sinks.lexical.stats(TENANT)).documents == 30
        assert (await sinks.semantic.stats(TENANT)).documents == 30
    finally:
        await assembly.close()

    # Shut down: the state on disk is whole and readable by a new process.
    kv = SqliteKeyValue(tmp_path / "ingest" / "state.sqlite3")
    try:
        store = JobStore(kv)
        assert len(store.registry_all(TENANT)) == 30
        assert "poison" not in store.registry_all(TENANT)
        again = store.snapshot(job.job_id)
        assert again is not None
        assert (again.state, again.progress.indexed, again.progress.failed) == ("DONE", 30, 1)
        assert again.failures == job.failures
    finally:
        kv.close()

    # The dead letter is listed by the CLI, with its reason.
    result = CliRunner().invoke(
        ingest_command, ["failures", job.job_id, "--data-dir", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert f"job {job.job_id}: DONE, 1 failed items" in result.output
    assert f"news.jsonl:18{f' ({doc_id})' if doc_id else ''}: {stage} {code} {reason}" in (
        result.output
    )
    listed = CliRunner().invoke(
        ingest_command, ["failures", job.job_id, "--data-dir", str(tmp_path), "--json"]
    )
    assert [json.loads(line)["code"] for line in listed.output.splitlines()] == [code]


def _stage_items() -> dict[tuple[str, str], float]:
    from prometheus_client import REGISTRY

    return {
        (stage, outcome): REGISTRY.get_sample_value(
            "attest_ingest_stage_items_total", {"stage": stage, "outcome": outcome}
        )
        or 0.0
        for stage, outcome in (
            ("enrich", "ok"),
            ("embed", "ok"),
            ("embed", "failed"),
            ("index", "ok"),
            ("index", "failed"),
        )
    }


def test_a_failed_call_to_the_ingest_service_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import grpc

    async def refused(*args: object, **kwargs: object) -> None:
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.NOT_FOUND,
            grpc.aio.Metadata(),
            grpc.aio.Metadata(),
            details="no job 'nosuchjob'",
        )

    monkeypatch.setattr("attest.ingest.commands._remote_failures", refused)
    out = CliRunner().invoke(ingest_command, ["failures", "nosuchjob", "--address", "127.0.0.1:1"])
    assert out.exit_code == 1
    assert out.output.strip() == "Error: NOT_FOUND: no job 'nosuchjob'"


def test_ingest_help_lists_what_ingesting_a_path_takes() -> None:
    out = CliRunner().invoke(ingest_command, ["--help"])
    assert out.exit_code == 0
    for option in ("--address", "--data-dir", "--batch-size", "--show-failures"):
        assert option in out.output
    assert "--help" in out.output
    assert out.output.count("--help") == 1


def test_a_data_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    (tmp_path / "one.jsonl").write_text('{"id": "a", "body": "x"}\n')
    out = CliRunner().invoke(
        ingest_command, [str(tmp_path / "one.jsonl"), "--data-dir", str(tmp_path / "afile")]
    )
    assert out.exit_code == 2
    assert "is a file" in out.output


def test_progress_reaches_the_wire_whole() -> None:
    from dataclasses import fields

    from attest.ingest.convert import progress_to_proto
    from attest.ingest.state import ProgressCounts

    counts = ProgressCounts(**{f.name: i + 1 for i, f in enumerate(fields(ProgressCounts))})
    wire = progress_to_proto(counts)
    assert {f.name: getattr(wire, f.name) for f in fields(ProgressCounts)} == {
        f.name: getattr(counts, f.name) for f in fields(ProgressCounts)
    }


def test_a_data_dir_from_the_environment_that_is_a_file_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "afile").write_text("")
    (tmp_path / "one.jsonl").write_text('{"id": "a", "body": "x"}\n')
    monkeypatch.setenv("ATTEST_DATA_DIR", str(tmp_path / "afile"))
    out = CliRunner().invoke(ingest_command, [str(tmp_path / "one.jsonl")])
    assert out.exit_code == 1
    assert f"the data directory {tmp_path / 'afile'} is a file" in out.output
