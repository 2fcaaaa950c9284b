"""loadtest/bench_ask.py's server launch: every server on ports of its own,
whatever the checkout's ``serve`` accepts."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from loadtest.bench_ask import start_server

# A checkout's `attest serve`, with or without --http-port (older checkouts
# have no HTTP gateway): it writes the gateway port it would bind and exits.
_CLI = """
import json, os, sys
import click

HTTP_OPTION = {http_option}


@click.group()
def main():
    pass


def _serve(service, embedded, host, port, data_dir, insecure_dev, http_port=None):
    if http_port is None:
        http_port = int(os.environ.get("ATTEST_ANSWER_HTTP__PORT", "8080"))
    with open(os.path.join(data_dir, "bound.json"), "w") as f:
        json.dump({{"grpc": port, "http": http_port}}, f)


options = [
    click.argument("service"),
    click.option("--embedded", is_flag=True),
    click.option("--host"),
    click.option("--port", type=int),
    click.option("--data-dir"),
    click.option("--insecure-dev", is_flag=True),
]
if HTTP_OPTION:
    options.append(click.option("--http-port", type=int, default=None))
serve = _serve
for option in reversed(options):
    serve = option(serve)
main.command("serve")(serve)

if __name__ == "__main__":
    main()
"""


def _checkout(root: Path, *, http_option: bool) -> Path:
    package = root / "attest"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "cli.py").write_text(_CLI.format(http_option=http_option), encoding="utf-8")
    return root


def _bound(tmp_path: Path, *, http_option: bool, extra: tuple[str, ...] = ()) -> dict[str, int]:
    checkout = _checkout(tmp_path / "checkout", http_option=http_option)
    data = tmp_path / "data"
    data.mkdir()
    log = tmp_path / "serve.log"
    proc, address = start_server(sys.executable, checkout, data, dict(os.environ), log, extra)
    assert proc.wait(timeout=60) == 0, log.read_text(encoding="utf-8")
    bound = json.loads((data / "bound.json").read_text(encoding="utf-8"))
    assert address == f"127.0.0.1:{bound['grpc']}"
    return dict(bound)


def test_a_server_takes_a_free_http_port(tmp_path: Path) -> None:
    assert _bound(tmp_path, http_option=True)["http"] == 0


def test_a_callers_http_port_is_the_one_bound(tmp_path: Path) -> None:
    bound = _bound(tmp_path, http_option=True, extra=("--insecure-dev", "--http-port", "5555"))
    assert bound["http"] == 5555


@pytest.mark.parametrize("extra", [(), ("--insecure-dev",)])
def test_a_checkout_without_an_http_gateway_still_starts(
    tmp_path: Path, extra: tuple[str, ...]
) -> None:
    assert _bound(tmp_path, http_option=False, extra=extra)["http"] == 0
