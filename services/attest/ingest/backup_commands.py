"""`attest backup` and `attest restore`: the embedded data directory, copied while it
serves (``attest.ingest.backup``)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import click

from attest.core.errors import AttestError


@contextlib.contextmanager
def _bars() -> Iterator[Callable[[str, int], Callable[[int], None]]]:
    """A tqdm bar in bytes per phase (copying, checksums, verifying, restoring)."""
    from tqdm import tqdm

    opened: list[tqdm] = []  # type: ignore[type-arg]

    def bar(label: str, total: int) -> Callable[[int], None]:
        for b in opened:
            b.close()
        b = tqdm(total=total, desc=label, unit="B", unit_scale=True, file=sys.stderr)
        opened.append(b)

        def advance(n: int) -> None:
            b.update(n)

        return advance

    try:
        yield bar
    finally:
        for b in opened:
            b.close()


def _data_dir(data_dir: Path | None) -> Path:
    return data_dir or Path(os.environ.get("ATTEST_DATA_DIR", ".attest"))


@click.command(name="backup")
@click.argument("dest", type=click.Path(path_type=Path))
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The embedded data directory to back up (the one `serve all --embedded --data-dir` "
    "and `ingest --data-dir` use; default $ATTEST_DATA_DIR, else .attest); it may be in use "
    "by them.",
)
@click.option(
    "--wait",
    "wait_seconds",
    type=click.FloatRange(min=0),
    default=300.0,
    show_default=True,
    help="Seconds to wait for the writes in flight (an ingest batch, a delete) to finish.",
)
def backup_command(dest: Path, data_dir: Path | None, wait_seconds: float) -> None:
    """Copy the embedded data directory to DEST (a new folder) while it serves.

    Writes pause for the copy (ingest batches wait; searches and answers go on);
    the copy is checked (each store opened and counted against the registry) and
    written with a manifest (versions, counts, SHA-256 of every file) in a hidden
    folder beside DEST that is renamed to DEST when complete.
    """
    from attest.ingest.backup import backup

    data_dir = _data_dir(data_dir)
    try:
        with _bars() as bar:
            report = backup(data_dir, dest, wait_seconds=wait_seconds, progress=bar)
    except AttestError as err:
        raise click.ClickException(err.details) from err
    m = report.manifest
    click.echo(
        f"backed up {data_dir} to {report.dest}: {len(m['files']):,} files, "
        f"{sum(f['size'] for f in m['files'].values()):,} bytes; writes paused "
        f"{report.paused_seconds:.2f} s (after waiting {report.waited_seconds:.2f} s for "
        "writes in flight)"
    )
    for tenant, counts in sorted(m["tenants"].items()):
        click.echo(
            f"  tenant {tenant}: {counts['documents']:,} documents, {counts['passages']:,} passages"
        )
    if m["open_jobs"]:
        unfinished = sum(j["unfinished"] for j in m["open_jobs"])
        click.echo(
            f"  {len(m['open_jobs'])} jobs were running ({unfinished:,} items not yet indexed): "
            "they resume when the restored directory is served, unless restored with "
            "--open-jobs cancel"
        )
    if not m["consistent"]:
        for problem in m["problems"]:
            click.echo(f"  warning: {problem}", err=True)
        click.echo(
            "  the source's registry and stores disagree: run `attest doctor --repair` on it "
            "(or on the restored copy)",
            err=True,
        )


@click.command(name="restore")
@click.argument("src", type=click.Path(path_type=Path))
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The data directory to restore into (default $ATTEST_DATA_DIR, else .attest): new "
    "or empty, or any with --overwrite.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace what the data directory holds (refused while a process serves it).",
)
@click.option(
    "--open-jobs",
    type=click.Choice(["resume", "cancel"]),
    default="resume",
    show_default=True,
    help="Jobs running when the backup was taken: resume them when the directory is next "
    "opened (nothing acknowledged is lost), or close them as failed (the state exactly "
    "as it was at the backup).",
)
def restore_command(src: Path, data_dir: Path | None, overwrite: bool, open_jobs: str) -> None:
    """Restore the backup SRC into the data directory, after checking every file of it
    against its manifest."""
    from attest.core.process_lock import LockHeld
    from attest.ingest.backup import restore

    data_dir = _data_dir(data_dir)
    try:
        with _bars() as bar:
            report = restore(
                src,
                data_dir,
                overwrite=overwrite,
                open_jobs="cancel" if open_jobs == "cancel" else "resume",
                progress=bar,
            )
    except LockHeld as err:
        raise click.ClickException(f"{err.details}; --overwrite needs it stopped") from err
    except AttestError as err:
        raise click.ClickException(err.details) from err
    m = report.manifest
    click.echo(
        f"restored {report.files:,} files ({report.bytes:,} bytes) from {src} "
        f"(taken {m['created_at']}) into {report.target}"
    )
    for tenant, counts in sorted(m["tenants"].items()):
        click.echo(
            f"  tenant {tenant}: {counts['documents']:,} documents, {counts['passages']:,} passages"
        )
    if report.cancelled_jobs:
        click.echo(f"  {len(report.cancelled_jobs)} jobs running at the backup closed as failed")
    elif m["open_jobs"]:
        click.echo(f"  {len(m['open_jobs'])} jobs running at the backup resume when it is opened")
    click.echo(f"check it with: attest doctor --data-dir {report.target}")
