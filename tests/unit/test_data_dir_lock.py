"""A data directory whose embedded stores another process has open is refused at
once, naming that process, by every command that would open them in its own."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from attest.cli import main
from attest.core.process_lock import DataDirLock, LockHeld, data_dir_lock

HOLD = """
import sys, time
from pathlib import Path
from attest.core.process_lock import DataDirLock
lock = DataDirLock(Path(sys.argv[1]))
lock.acquire()
print("held", flush=True)
time.sleep(120)
"""


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    data = tmp_path / "data"
    (data / "ingest").mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(data)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        yield data, holder.pid
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_second_process_is_refused_with_the_holders_id(held: tuple[Path, int]) -> None:
    data, pid = held
    lock = DataDirLock(data)
    assert lock.holder() == pid
    with pytest.raises(LockHeld) as err:
        lock.acquire()
    assert err.value.pid == pid
    assert err.value.message.startswith(f"the data directory {data} is in use by process {pid}")


@pytest.mark.parametrize(
    "args",
    [
        ["ingest", "{doc}", "--data-dir", "{data}"],
        ["doctor", "--data-dir", "{data}"],
        ["demo", "--data-dir", "{data}"],
    ],
)
def test_commands_on_a_held_data_directory_say_so_in_one_line(
    held: tuple[Path, int], tmp_path: Path, args: list[str]
) -> None:
    data, pid = held
    doc = tmp_path / "note.txt"
    doc.write_text("The plant opened in May.", encoding="utf-8")
    out = CliRunner().invoke(main, [a.format(doc=doc, data=data) for a in args], prog_name="attest")
    assert out.exit_code == 1, out.output
    assert f"Error: the data directory {data} is in use by process {pid}" in out.output
    assert "Traceback" not in out.output


def test_the_lock_is_free_again_once_released(tmp_path: Path) -> None:
    with data_dir_lock(tmp_path) as lock:
        assert lock.held
        assert DataDirLock(tmp_path).holder() is not None
    assert DataDirLock(tmp_path).holder() is None


def test_a_path_with_braces_is_named_as_it_is(tmp_path: Path) -> None:
    data = tmp_path / "run{1}" / "{x}"
    with data_dir_lock(data), pytest.raises(LockHeld) as err:
        DataDirLock(data).acquire()
    assert err.value.message.startswith(f"the data directory {data} is in use by process ")
