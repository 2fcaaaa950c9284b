"""``attest ingest PATH``: load documents, in this process or through an ingest service."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from tqdm import tqdm

from attest.core.logging import configure_logging
from attest.core.settings import LoggingSettings, MiB
from attest.ingest.readers import (
    READ_SUFFIXES,
    RECORD_KEYS,
    RawItem,
    count_items,
    read_path,
    skipped_files,
    unread_keys,
)
from attest.ingest.state import FailureRecord

T = TypeVar("T")

if TYPE_CHECKING:
    from attest.ingest.assembly import Assembly
    from attest.ingest.settings import IngestSettings
    from attest.ingest.state import JobStore

# Requests stay under the ingest service's default 64 MiB limit; one item
# bigger than this is reported here and never sent.
MAX_MESSAGE_BYTES = 48 * MiB


@dataclass
class Report:
    job_id: str = ""
    state: str = ""
    received: int = 0
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    failed: int = 0
    passages: int = 0
    # Of unchanged: replaced by a later record of the input with the same id.
    superseded: int = 0
    failures: list[tuple[str, str, str, str]] = field(default_factory=list)  # origin, id, code, why
    # Items ingested with a warning (text dropped, passages cut off), and the first of them.
    warned: int = 0
    warnings: list[tuple[str, str, str, str]] = field(
        default_factory=list
    )  # origin, id, code, what
    # Read from PDF and DOCX files by this command (0 for JSONL and text).
    files: int = 0
    pages: int = 0
    table_rows: int = 0
    read_seconds: float = 0.0  # of which reading those files (PDF parsing, tables)
    seconds: float = 0.0

    def lines(self, show: int) -> list[str]:
        out = [
            f"job {self.job_id}: {self.state}",
            f"  received {self.received:,}  ingested {self.created:,}  updated {self.updated:,}  "
            f"unchanged {self.unchanged:,}  failed {self.failed:,}  passages {self.passages:,}",
        ]
        if self.superseded:
            out.append(
                f"  of the unchanged, {self.superseded:,} were replaced by a later record of "
                "the input with the same id"
            )
        if self.files:
            rate = f", {self.pages / self.read_seconds:,.0f} pages/s" if self.read_seconds else ""
            out.append(
                f"  read {self.files:,} PDF/DOCX files: {self.pages:,} pages, "
                f"{self.table_rows:,} table rows in {self.read_seconds:,.1f} s{rate}"
            )
        if self.seconds > 0:
            share = (
                f" ({100 * self.read_seconds / self.seconds:.0f} % reading files, the rest "
                "enriching, embedding and indexing)"
                if self.files
                else ""
            )
            out.append(f"  took {self.seconds:,.1f} s{share}")
        for origin, doc_id, code, reason in self.failures[:show]:
            where = f"{origin} ({doc_id})" if doc_id else origin
            out.append(f"  failed {where}: {code} {reason}")
        if len(self.failures) > show:
            out.append(f"  ... and {len(self.failures) - show:,} more failures")
        if self.warned:
            out.append(f"  {self.warned:,} documents ingested with warnings")
        for origin, doc_id, code, message in self.warnings[:show]:
            where = f"{origin} ({doc_id})" if origin else doc_id
            out.append(f"  warning {where}: {code} {message}")
        if self.warned > min(show, len(self.warnings)):
            out.append(f"  ... and {self.warned - min(show, len(self.warnings)):,} more")
        return out


@dataclass
class _Reading:
    """What the files read so far held, and the reading bar's page postfix."""

    bar: tqdm | None = None  # type: ignore[type-arg]
    files: int = 0
    pages: int = 0
    table_rows: int = 0
    seconds: float = 0.0

    def on_page(self, page: int, pages: int) -> None:
        if self.bar is not None and (page % 10 == 0 or page == pages) and pages >= 20:
            self.bar.set_postfix_str(f"page {page:,}/{pages:,}", refresh=True)

    def items(self, path: Path) -> Iterator[RawItem]:
        items = read_path(path, self.on_page)
        while True:
            started = time.monotonic()
            item = next(items, None)
            if item is None:
                return
            if item.document_file:
                self.files += 1
                self.pages += item.pages
                self.table_rows += item.table_rows
                self.seconds += time.monotonic() - started
            if self.bar is not None:
                self.bar.update(1)
            yield item

    def fill(self, report: Report, seconds: float) -> Report:
        report.files, report.pages, report.table_rows = self.files, self.pages, self.table_rows
        report.read_seconds, report.seconds = self.seconds, seconds
        return report


def _chunks(items: Iterator[RawItem], size: int) -> Iterator[list[RawItem]]:
    chunk: list[RawItem] = []
    used = 0
    for item in items:
        n = len(item.raw_json) + len(item.origin) + 16
        if chunk and (len(chunk) == size or used + n > MAX_MESSAGE_BYTES):
            yield chunk
            chunk, used = [], 0
        chunk.append(item)
        used += n
    if chunk:
        yield chunk


async def run_embedded(path: Path, data_dir: Path, batch: int, total: int) -> Report:
    from attest.core.process_lock import data_dir_lock
    from attest.ingest.assembly import assemble
    from attest.ingest.settings import IngestSettings

    with data_dir_lock(data_dir):
        assembly = await assemble(IngestSettings(data_dir=data_dir))
        return await _ingest_embedded(assembly, path, batch, total)


async def _ingest_embedded(assembly: Assembly, path: Path, batch: int, total: int) -> Report:
    from attest.ingest.documents import FailureCode, ItemError, article_from_raw_json
    from attest.ingest.jobs import Item

    started = time.monotonic()
    reading = _Reading()
    try:
        core = assembly.core
        job_id = core.start_job("default")
        with tqdm(total=total, desc="reading", unit="doc") as bar:
            reading.bar = bar
            for chunk in _chunks(reading.items(path), batch):
                items = []
                for raw in chunk:
                    if raw.error:
                        error = ItemError(FailureCode.UNREADABLE_FILE, raw.error, raw.origin)
                        items.append(Item(raw.origin, error=error))
                        continue
                    try:
                        items.append(Item(raw.origin, article_from_raw_json(raw.raw_json)))
                    except ItemError as err:
                        items.append(Item(raw.origin, error=err))
                core.add(job_id, items)
        core.seal(job_id)
        with tqdm(total=total, desc="ingesting", unit="doc") as bar:
            while True:
                job = core.job("default", job_id, failures_limit=0)
                bar.n = job.progress.finished
                bar.refresh()
                if job.state in ("DONE", "FAILED"):
                    break
                await asyncio.sleep(0.5)
        job = core.job(
            "default", job_id, failures_limit=max(job.progress.failed, job.progress.warned)
        )
        p = job.progress
        report = Report(
            job_id=job_id,
            state=job.state,
            received=p.received,
            created=p.created,
            updated=p.updated,
            unchanged=p.unchanged,
            superseded=p.superseded,
            failed=p.failed,
            passages=p.passages_indexed,
            failures=[(f.origin, f.doc_id, f.code, f.reason) for f in job.failures],
            warned=p.warned,
            warnings=[(w.origin, w.doc_id, w.code, w.message) for w in job.warnings],
        )
        return reading.fill(report, time.monotonic() - started)
    finally:
        await assembly.close()


async def run_remote(path: Path, address: str, batch: int, total: int) -> Report:
    from attest.core.channels import create_channel
    from attest.core.settings import ClientSettings
    from attest.ingest.documents import MAX_BODY_BYTES
    from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc

    channel = create_channel(
        address, ClientSettings(timeout_seconds=3600, max_message_bytes=64 * MiB)
    )
    local_failures: list[tuple[str, str, str, str]] = []
    started = time.monotonic()
    reading = _Reading()
    try:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        await _check_access(stub)
        bar = tqdm(total=total, desc="sending", unit="doc")
        reading.bar = bar

        async def messages() -> AsyncIterator[ingest_pb2.IngestStreamRequest]:
            for chunk in _chunks(reading.items(path), batch):
                items = []
                for raw in chunk:
                    if raw.error:
                        local_failures.append(
                            (raw.origin, raw.origin, "UNREADABLE_FILE", f"{raw.error} (never sent)")
                        )
                        continue
                    if len(raw.raw_json) > MAX_MESSAGE_BYTES:
                        local_failures.append(
                            (
                                raw.origin,
                                "",
                                "BODY_TOO_LARGE",
                                f"record is {len(raw.raw_json):,} bytes; bodies may have "
                                f"{MAX_BODY_BYTES:,} (refused here, never sent: the job "
                                "does not list it among its failures)",
                            )
                        )
                        continue
                    items.append(ingest_pb2.IngestItem(raw_json=raw.raw_json, origin=raw.origin))
                if items:
                    yield ingest_pb2.IngestStreamRequest(items=items)

        pending = messages()
        first = await anext(pending, None)
        if first is None:
            # Nothing readable to send: the reasons are this command's to report.
            bar.close()
            return reading.fill(
                Report(
                    state="DONE",
                    received=len(local_failures),
                    failed=len(local_failures),
                    failures=list(local_failures),
                ),
                time.monotonic() - started,
            )

        call: Any = None

        async def stream() -> AsyncIterator[ingest_pb2.IngestStreamRequest]:
            yield first
            async for message in pending:
                # A call the service ended (refused the credential, failed)
                # takes nothing more: stop reading, the bar stops where it is.
                if call is not None and call.done():
                    return
                yield message

        call = stub.IngestStream(stream())
        try:
            response = await call
        except BaseException:
            # What was read is not what was ingested: the bar goes, the error
            # is the last word.
            bar.leave = False
            bar.close()
            raise
        bar.close()
        job_id = response.job.job_id
        failures: list[tuple[str, str, str, str]] = list(local_failures)
        final = response.job
        with tqdm(total=response.job.progress.received, desc="ingesting", unit="doc") as bar2:
            async for update in stub.WatchJob(ingest_pb2.WatchJobRequest(job_id=job_id)):
                p = update.progress
                bar2.n = p.indexed + p.unchanged + p.failed
                bar2.refresh()
                for f in update.new_failures:
                    code = ingest_pb2.FailureCode.Name(f.code).removeprefix("FAILURE_CODE_")
                    failures.append((f.origin, f.doc_id, code, f.reason))
                final = ingest_pb2.Job(job_id=job_id, state=update.state, progress=p)
        p = final.progress
        warnings: list[tuple[str, str, str, str]] = []
        if p.warned:
            job = await stub.GetJob(ingest_pb2.GetJobRequest(job_id=job_id, failures_limit=1000))
            warnings = [(w.origin, w.doc_id, w.code, w.message) for w in job.job.warnings]
        report = Report(
            job_id=job_id,
            state=ingest_pb2.JobState.Name(final.state).removeprefix("JOB_STATE_"),
            received=p.received + len(local_failures),
            created=p.created,
            updated=p.updated,
            unchanged=p.unchanged,
            superseded=p.superseded,
            failed=p.failed + len(local_failures),
            passages=p.passages_indexed,
            failures=failures,
            warned=p.warned,
            warnings=warnings,
        )
        return reading.fill(report, time.monotonic() - started)
    finally:
        await channel.close()


async def _check_access(stub: Any) -> None:
    """Raise the refusal an ingest would get (no credential, no ingest scope,
    nothing serving ingest there) before any file is read or any progress shown:
    a job that does not exist is asked for, NOT_FOUND says the call got through."""
    import grpc

    from attest.ingest.v1 import ingest_pb2

    try:
        await stub.GetJob(ingest_pb2.GetJobRequest(job_id="0" * 32), timeout=30)
    except grpc.aio.AioRpcError as err:
        if err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
            return
        raise


def _run_remote(call: Coroutine[Any, Any, T]) -> T:
    """Runs a client of the services; a failed call is one line, not a traceback."""
    import grpc

    from attest.core.rpc_errors import from_rpc

    try:
        return asyncio.run(call)
    except grpc.aio.AioRpcError as err:
        error = from_rpc(err)
        hint = _REMEDIES.get(error.code, "")
        raise click.ClickException(
            f"{error.code}: {error.details}" + (f"\n{hint}" if hint else "")
        ) from err


#: What to do about a call a service refused, by status.
_REMEDIES = {
    "UNAUTHENTICATED": "Nothing was ingested. Give this client a credential the service "
    "accepts: ATTEST_CLIENT_TOKEN=<API key or JWT> (or ATTEST_CLIENT_TOKEN_FILE=<file>), "
    "a key with the ingest scope.",
    "PERMISSION_DENIED": "Nothing was changed. Use a credential with the scope the message "
    "names (ingest for ingest and delete; admin holds every scope).",
    "UNAVAILABLE": "Nothing was changed. Is the service running at that address? Start one "
    "with `attest serve all` (or `attest serve ingest`), or pass the right --address.",
}


def _held(call: Coroutine[Any, Any, T]) -> T:
    """Run ``call`` on the embedded stores; another process holding them is one
    line naming it (attest.core.process_lock), not a traceback."""
    from attest.core.process_lock import LockHeld

    try:
        return asyncio.run(call)
    except LockHeld as err:
        raise click.ClickException(err.message) from err


class _IngestGroup(click.Group):
    """``attest ingest PATH`` ingests; ``attest ingest failures JOB`` is a subcommand.

    Anything that is not a subcommand's name goes to the hidden ``load``
    command, so ``attest ingest docs/ --data-dir x`` works as it always did.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["load", *args]
        return super().parse_args(ctx, args)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # `attest ingest --help` lists what `attest ingest PATH` takes, which
        # would otherwise sit under the hidden ``load`` command.
        load = self.commands["load"]
        records = [
            r
            for p in load.get_params(ctx)
            if isinstance(p, click.Option)
            and "--help" not in p.opts
            and (r := p.get_help_record(ctx))
        ]
        with formatter.section("Options of `attest ingest PATH`"):
            formatter.write_dl(records)
        super().format_options(ctx, formatter)


class _LoadContext(click.Context):
    """The hidden ``load`` speaks as ``attest ingest``: a usage error names the
    command the user typed and the help that lists its options."""

    @property
    def command_path(self) -> str:
        return self.parent.command_path if self.parent is not None else super().command_path


class _LoadCommand(click.Command):
    context_class = _LoadContext


@click.group(name="ingest", cls=_IngestGroup)
def ingest() -> None:
    """Ingest documents: `attest ingest PATH [OPTIONS]` loads PATH (a JSONL file, a BEIR
    folder or corpus.jsonl, or a folder of .txt/.md/.html/.pdf/.docx files) and prints ingested,
    updated, unchanged and failed documents, with the reason of each failure;
    `attest ingest failures JOB` lists the failed (quarantined) items of a job."""


@ingest.command(name="load", hidden=True, cls=_LoadCommand)
@click.argument("path", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--address",
    default=None,
    help="An ingest service at HOST:PORT; without it the pipeline runs in this process "
    "on the embedded stores under --data-dir.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Embedded state.",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 1000),
    default=500,
    show_default=True,
    help="Documents sent per Ingest request.",
)
@click.option(
    "--show-failures",
    type=click.IntRange(0),
    default=20,
    show_default=True,
    help="Failed documents listed with their reasons; the rest are counted.",
)
def load(
    path: Path, address: str | None, data_dir: Path | None, batch_size: int, show_failures: int
) -> None:
    """Ingest PATH: a JSONL file (one document a line), a BEIR folder or corpus.jsonl, a
    folder of .txt/.md/.html/.pdf/.docx files, or one such file (a PDF keeps its pages,
    its tables become rows that keep their headers and unit). Prints ingested, updated,
    unchanged and failed documents, with the reason of each failure. Exits 0 when every document was
    ingested or unchanged, 2 when the job finished with failed items, 1 when the job
    itself failed."""
    configure_logging(LoggingSettings(level="WARNING", json=False))
    skipped = skipped_files(path)
    if skipped:
        names = ", ".join(p.relative_to(path).as_posix() for p in skipped[:3])
        click.echo(
            f"warning: {len(skipped):,} files under {path} are not "
            f"{'/'.join(READ_SUFFIXES)} and are left out (e.g. {names})",
            err=True,
        )
    total = count_items(path)
    unread = unread_keys(path)
    if unread:
        keys = ", ".join(f"{k} ({n:,})" for k, n in list(unread.items())[:8])
        click.echo(
            f"warning: keys that ingest does not read, in the first {min(total, 1000):,} "
            f"records (how many carry each): {keys}. A document is read from "
            f"{', '.join(sorted(RECORD_KEYS))}",
            err=True,
        )
    if total == 0:
        # No job for nothing: a feed with an empty day is not an error.
        click.echo(f"nothing to ingest: {path} holds no documents", err=True)
        return
    if address:
        report = _run_remote(run_remote(path, address, batch_size, total))
    else:
        report = _held(run_embedded(path, _data_dir(data_dir), batch_size, total))
    for line in report.lines(show_failures):
        click.echo(line)
    if report.state != "DONE":
        raise SystemExit(1)
    if report.failed:
        # The job finished; some items did not (listed above, and kept as the
        # job's dead letters): a script must not take that for success.
        raise SystemExit(2)


def _data_dir(data_dir: Path | None) -> Path:
    root = data_dir or Path(os.environ.get("ATTEST_DATA_DIR", ".attest"))
    if root.exists() and not root.is_dir():
        raise click.ClickException(f"the data directory {root} is a file")
    return root


def _local_failures(data_dir: Path, job_id: str) -> tuple[str, list[FailureRecord]]:
    from attest.ingest.state import JobStore, SqliteKeyValue

    path = data_dir / "ingest" / "state.sqlite3"
    if not path.is_file():
        raise click.ClickException(f"no ingest state under {data_dir}")
    kv = SqliteKeyValue(path)
    try:
        store = JobStore(kv)
        snapshot = store.snapshot(job_id, failures_limit=0)
        if snapshot is None:
            raise click.ClickException(f"no job {job_id[:64]!r} under {data_dir}")
        total = snapshot.progress.failed
        return snapshot.state, store.failures(job_id, 0, total)
    finally:
        kv.close()


async def _remote_failures(address: str, job_id: str) -> tuple[str, list[FailureRecord]]:
    from attest.core.channels import create_channel
    from attest.core.settings import ClientSettings
    from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc

    channel = create_channel(address, ClientSettings(timeout_seconds=60))
    out: list[FailureRecord] = []
    try:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        state = ""
        while True:
            response = await stub.GetJob(
                ingest_pb2.GetJobRequest(
                    job_id=job_id, failures_offset=len(out), failures_limit=1000
                )
            )
            job = response.job
            state = ingest_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_")
            for f in job.failures:
                out.append(
                    FailureRecord(
                        f.item_index,
                        f.doc_id,
                        f.origin,
                        ingest_pb2.Stage.Name(f.stage).removeprefix("STAGE_"),
                        ingest_pb2.FailureCode.Name(f.code).removeprefix("FAILURE_CODE_"),
                        f.reason,
                    )
                )
            if len(job.failures) < 1000:
                return state, out
    finally:
        await channel.close()


def _service_or_data_dir(command: Callable[..., None]) -> Callable[..., None]:
    """--address (an ingest service) and --data-dir (the embedded state)."""
    command = click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Embedded state.",
    )(command)
    return click.option("--address", default=None, help="An ingest service at HOST:PORT.")(command)


@ingest.command(name="failures")
@click.argument("job_id")
@_service_or_data_dir
@click.option("--json", "as_json", is_flag=True, help="One JSON object per failed item.")
def failures(job_id: str, address: str | None, data_dir: Path | None, as_json: bool) -> None:
    """The dead letters of job JOB_ID: every item that failed, with its stage, code and
    reason (what the pipeline set aside while the rest of the job went on)."""
    configure_logging(LoggingSettings(level="WARNING", json=False))
    if address:
        state, found = _run_remote(_remote_failures(address, job_id))
    else:
        state, found = _local_failures(_data_dir(data_dir), job_id)
    if as_json:
        for f in found:
            click.echo(
                json.dumps(
                    {
                        "item": f.item_index,
                        "doc_id": f.doc_id,
                        "origin": f.origin,
                        "stage": f.stage,
                        "code": f.code,
                        "reason": f.reason,
                    },
                    ensure_ascii=True,
                )
            )
        return
    click.echo(f"job {job_id}: {state}, {len(found):,} failed items")
    for f in found:
        where = f"{f.origin} ({f.doc_id})" if f.doc_id else (f.origin or f"item {f.item_index}")
        click.echo(f"  {where}: {f.stage} {f.code} {f.reason}")


@ingest.command(name="delete")
@click.argument("doc_ids", nargs=-1, required=True)
@_service_or_data_dir
@click.option("--dry-run", is_flag=True, help="Say what would be removed; remove nothing.")
def delete(
    doc_ids: tuple[str, ...], address: str | None, data_dir: Path | None, dry_run: bool
) -> None:
    """Remove documents DOC_IDS from every store (BM25, vectors, KG links, facts
    derived from them) and from the registry. Ingesting a folder again does not
    remove the documents of files taken out of it: this does. Ids that are not
    there are named (a second run removes nothing and says so)."""
    configure_logging(LoggingSettings(level="WARNING", json=False))
    ids = list(dict.fromkeys(doc_ids))
    if address:
        matched, deleted, refused = _run_remote(_remote_delete(address, ids, dry_run))
    else:
        matched, deleted, refused = _held(_embedded_delete(_data_dir(data_dir), ids, dry_run))
    found = set(matched) | {doc_id for doc_id, _ in refused}
    missing = [d for d in ids if d not in found]
    verb = "would remove" if dry_run else "removed"
    click.echo(f"{verb} {len(matched) if dry_run else deleted:,} of {len(ids):,} documents")
    for doc_id in matched:
        click.echo(f"  {doc_id}")
    if missing:
        click.echo(f"not found ({len(missing):,}): {', '.join(missing[:20])}", err=True)
    if refused:
        click.echo(f"refused ({len(refused):,}):", err=True)
        for doc_id, reason in refused[:20]:
            click.echo(f"  {doc_id!r}: {reason}", err=True)
        raise SystemExit(1)


#: Ids per Delete call (the service's limit).
_DELETE_BATCH = 1000


Refused = list[tuple[str, str]]  # id, why


async def _remote_delete(
    address: str, ids: list[str], dry_run: bool
) -> tuple[list[str], int, Refused]:
    from attest.core.channels import create_channel
    from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc

    channel = create_channel(address)
    try:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        matched: list[str] = []
        deleted = 0
        refused: Refused = []
        for start in range(0, len(ids), _DELETE_BATCH):
            reply = await stub.Delete(
                ingest_pb2.DeleteRequest(
                    doc_ids=ids[start : start + _DELETE_BATCH], dry_run=dry_run
                ),
                timeout=600,
            )
            matched.extend(reply.doc_ids)
            deleted += reply.deleted
            refused.extend((f.doc_id, f.reason) for f in reply.failures)
        return matched, deleted, refused
    finally:
        await channel.close()


async def _embedded_delete(
    data_dir: Path, ids: list[str], dry_run: bool
) -> tuple[list[str], int, Refused]:
    from attest.core.errors import InvalidArgument
    from attest.core.process_lock import data_dir_lock
    from attest.core.validation import check_id
    from attest.ingest.assembly import assemble
    from attest.ingest.settings import IngestSettings

    refused: Refused = []
    valid: list[str] = []
    for i, doc_id in enumerate(ids):
        try:
            valid.append(check_id(doc_id, f"doc_ids[{i}]"))
        except InvalidArgument as err:
            refused.append((doc_id, err.details))
    ids = valid
    if not (data_dir / "ingest").is_dir():
        raise click.ClickException(f"no ingest state under {data_dir}")
    with data_dir_lock(data_dir):
        assembly = await assemble(IngestSettings(data_dir=data_dir), startup_check=False)
        try:
            matched: list[str] = []
            deleted = 0
            for start in range(0, len(ids), _DELETE_BATCH):
                result = await assembly.core.delete(
                    "default", doc_ids=ids[start : start + _DELETE_BATCH], dry_run=dry_run
                )
                matched.extend(result.doc_ids)
                deleted += result.deleted
            return matched, deleted, refused
        finally:
            await assembly.close()


async def _reconcile(
    store: JobStore,
    stores: Any,
    sinks: Any,
    runner: Callable[[], Any],
    *,
    repair: bool,
    tenants: tuple[str, ...],
    echo: Callable[[str], None],
    facts: Any = None,
) -> dict[str, Any]:
    """Check, print, and repair when asked (``runner()`` gives the StageRunner that
    indexes missing documents again); what was found and done. ``facts``: the
    knowledge service (a FactsHook), whose facts are checked against the registry."""
    from attest.ingest import doctor

    report = await _reconcile_stores(
        store, stores, sinks, runner, repair=repair, tenants=tenants, echo=echo
    )
    if facts is None:
        return report
    found = await doctor.check_facts(store, facts, tenants or None)
    for f in found:
        for line in f.lines():
            echo(line)
    report["facts"] = [f.to_json() for f in found]
    if repair and any(not f.consistent for f in found):
        for f in found:
            deleted = await doctor.repair_facts(facts, f)
            if deleted:
                echo(f"repaired tenant {f.tenant}: facts of {deleted:,} deleted documents removed")
        found = await doctor.check_facts(store, facts, tenants or None)
        report["facts_after"] = [f.to_json() for f in found]
    report["consistent"] = report["consistent"] and all(f.consistent for f in found)
    return report


async def _reconcile_stores(
    store: JobStore,
    stores: Any,
    sinks: Any,
    runner: Callable[[], Any],
    *,
    repair: bool,
    tenants: tuple[str, ...],
    echo: Callable[[str], None],
) -> dict[str, Any]:
    from attest.ingest import doctor

    before = await doctor.check(store, stores, tenants or None)
    report: dict[str, Any] = {"before": [f.to_json() for f in before]}
    for f in before:
        for line in f.lines():
            echo(line)
    if not repair:
        report["consistent"] = all(f.consistent for f in before)
        return report
    done = []
    for f in before:
        if not f.consistent:
            r = await doctor.repair(store, sinks, runner(), f)
            done.append(r)
            echo(
                f"repaired tenant {r.tenant}: {r.reindexed:,} indexed again from "
                f"their sources, {r.deleted:,} deleted"
                + (f", {len(r.unrepairable):,} unrepairable" if r.unrepairable else "")
            )
    after = await doctor.check(store, stores, tenants or None) if done else before
    if done:
        for f in after:
            for line in f.lines():
                echo(line)
    report["repairs"] = [
        {
            "tenant": r.tenant,
            "reindexed": r.reindexed,
            "deleted": r.deleted,
            "unrepairable": list(r.unrepairable),
        }
        for r in done
    ]
    report["after"] = [f.to_json() for f in after]
    report["consistent"] = all(f.consistent for f in after)
    return report


async def run_doctor(
    data_dir: Path,
    *,
    repair: bool,
    tenants: tuple[str, ...],
    echo: Callable[[str], None],
    knowledge_address: str | None = None,
) -> dict[str, Any]:
    """Open the embedded stores (which resumes interrupted jobs), wait for those
    jobs, reconcile, and repair when asked. Returns what was found and done."""
    from attest.core.process_lock import data_dir_lock
    from attest.ingest.assembly import assemble
    from attest.ingest.settings import IngestSettings

    with data_dir_lock(data_dir):
        assembly = await assemble(IngestSettings(data_dir=data_dir), startup_check=False)
        return await _doctor_embedded(
            assembly,
            repair=repair,
            tenants=tenants,
            echo=echo,
            knowledge_address=knowledge_address,
        )


def _facts_of(sinks: Any, address: str | None) -> Any:
    """The knowledge service whose facts are checked: at ``address`` when given,
    else the one ingestion sends facts to (ATTEST_INGEST_KNOWLEDGE_ADDRESS), if any."""
    if address:
        from attest.core.settings import ClientSettings
        from attest.ingest.knowledge import FactsHook

        return FactsHook(address, ClientSettings())
    return getattr(sinks, "knowledge", None)


async def _doctor_embedded(
    assembly: Assembly,
    *,
    repair: bool,
    tenants: tuple[str, ...],
    echo: Callable[[str], None],
    knowledge_address: str | None = None,
) -> dict[str, Any]:
    try:
        core, inline = assembly.core, assembly.inline
        assert inline is not None
        if assembly.resumed:
            echo(f"resumed {len(assembly.resumed):,} interrupted jobs: waiting for them")
            await inline.drain()
        facts = _facts_of(core.sinks, knowledge_address)
        try:
            report = await _reconcile(
                core.store,
                core.sinks,
                core.sinks,
                lambda: inline.runner,
                repair=repair,
                tenants=tenants,
                echo=echo,
                facts=facts,
            )
        finally:
            if knowledge_address and facts is not None:
                await facts.close()
        return {"resumed": assembly.resumed, **report}
    finally:
        await assembly.close()


async def run_doctor_services(
    settings: IngestSettings,
    *,
    repair: bool,
    tenants: tuple[str, ...],
    echo: Callable[[str], None],
    knowledge_address: str | None = None,
) -> dict[str, Any]:
    """Reconcile the registry in Redis (``settings.state_url``) with the lexical and
    semantic services (``settings.lexical_address``, ``semantic_address``) through
    their ListDocuments RPCs; repair through their Delete and Index RPCs, indexing
    missing documents again from the sources the registry keeps (enriched and
    embedded here, with the pipeline's settings)."""
    from attest.core.errors import FailedPrecondition
    from attest.ingest.jobs import StageRunner
    from attest.ingest.listing import ServiceListing
    from attest.ingest.sinks import GrpcSinks
    from attest.ingest.stages import Embedding
    from attest.ingest.state import JobStore, RedisKeyValue

    if not (settings.state_url and settings.lexical_address and settings.semantic_address):
        raise FailedPrecondition("checking services needs their addresses and the registry URL")
    kv = RedisKeyValue(settings.state_url.get_secret_value())
    await asyncio.to_thread(kv.ping)
    store = JobStore(kv, keep_sources=True)
    listing = ServiceListing(settings.lexical_address, settings.semantic_address, settings.client)
    sinks = GrpcSinks(settings.lexical_address, settings.semantic_address, settings.client)
    runners: list[StageRunner] = []

    def embedding() -> Embedding:
        from attest.knowledge.graph import load_graph
        from attest.semantic.embedding import Embedder

        e = settings.embed
        encoder = Embedder(e.model, device=e.device, batch_size=e.batch_size, backend=e.backend)
        return Embedding.build(encoder, load_graph(e.graph_path))

    def runner() -> StageRunner:
        # The model loads only when a document has to be indexed again.
        if not runners:
            runners.append(
                StageRunner(store, settings.enrich, embedding=embedding, sinks=lambda: sinks)
            )
        return runners[0]

    facts = _facts_of(sinks, knowledge_address)
    try:
        return await _reconcile(
            store, listing, sinks, runner, repair=repair, tenants=tenants, echo=echo, facts=facts
        )
    finally:
        if knowledge_address and facts is not None:
            await facts.close()
        await listing.close()
        await sinks.close()
        kv.close()


@click.command(name="doctor")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Embedded state.",
)
@click.option(
    "--lexical-address",
    default=None,
    help="A lexical service at HOST:PORT (default ATTEST_INGEST_LEXICAL_ADDRESS); with "
    "--semantic-address, check the services instead of embedded stores.",
)
@click.option(
    "--semantic-address",
    default=None,
    help="A semantic service at HOST:PORT (default ATTEST_INGEST_SEMANTIC_ADDRESS).",
)
@click.option(
    "--state-url",
    default=None,
    help="Redis URL of the registry when checking services (default ATTEST_INGEST_STATE_URL).",
)
@click.option(
    "--knowledge-address",
    default=None,
    help="A knowledge service at HOST:PORT whose personal-base facts are checked against "
    "the registry (default ATTEST_INGEST_KNOWLEDGE_ADDRESS; neither: facts are not checked).",
)
@click.option("--repair", is_flag=True, help="Delete orphans and index missing documents again.")
@click.option("--tenant", "tenants", multiple=True, help="Only these tenants (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as one JSON object.")
def doctor_command(
    data_dir: Path | None,
    lexical_address: str | None,
    semantic_address: str | None,
    state_url: str | None,
    knowledge_address: str | None,
    repair: bool,
    tenants: tuple[str, ...],
    as_json: bool,
) -> None:
    """Compare the ingest registry with the BM25 index, the vectors and the KG links,
    per tenant (counts, an id checksum, and each document's passages digest where the
    store reads its texts); report orphans and missing or changed documents, and facts
    of the personal knowledge base whose document is gone; with --repair fix them.
    Exits 1 while they disagree.

    The stores are the embedded ones under --data-dir, or the lexical and semantic
    services (--lexical-address and --semantic-address, or the ingest service's
    settings ATTEST_INGEST_LEXICAL_ADDRESS, _SEMANTIC_ADDRESS and _STATE_URL when
    --data-dir is not given)."""
    configure_logging(LoggingSettings(level="WARNING", json=False))
    lines: list[str] = []
    echo = lines.append if as_json else click.echo
    settings = _service_settings(data_dir, lexical_address, semantic_address, state_url)
    if settings is not None:
        report = _run_remote(
            run_doctor_services(
                settings,
                repair=repair,
                tenants=tenants,
                echo=echo,
                knowledge_address=knowledge_address,
            )
        )
    else:
        root = _data_dir(data_dir)
        if not (root / "ingest").is_dir():
            raise click.ClickException(f"no ingest state under {root}")
        report = _held(
            run_doctor(
                root,
                repair=repair,
                tenants=tenants,
                echo=echo,
                knowledge_address=knowledge_address,
            )
        )
    if as_json:
        click.echo(json.dumps(report))
    if not report["consistent"]:
        raise SystemExit(1)


def _service_settings(
    data_dir: Path | None,
    lexical_address: str | None,
    semantic_address: str | None,
    state_url: str | None,
) -> IngestSettings | None:
    """The ingest settings naming the services to check, or None for embedded stores."""
    from pydantic import SecretStr

    from attest.ingest.settings import IngestSettings

    if data_dir is not None and (lexical_address or semantic_address):
        raise click.UsageError("give --data-dir or the service addresses, not both")
    settings = IngestSettings()
    if data_dir is not None:
        return None
    lexical = lexical_address or settings.lexical_address
    semantic = semantic_address or settings.semantic_address
    if not (lexical or semantic):
        return None
    if not (lexical and semantic):
        raise click.UsageError("give both --lexical-address and --semantic-address")
    url = SecretStr(state_url) if state_url else settings.state_url
    if url is None:
        raise click.UsageError("checking services needs the registry: --state-url (a Redis URL)")
    return settings.model_copy(
        update={"lexical_address": lexical, "semantic_address": semantic, "state_url": url}
    )
