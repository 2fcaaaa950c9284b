"""services/client/pyproject.toml (the `attest-client` wheel) stays complete and in step.

The integration test installs the wheel and calls Ask; these checks need no
network: every module `import attest.client` loads is shipped, no server-side
module is, and the versions and dependency ranges match the full package's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "services/client"


def _client_project() -> dict:
    return tomllib.loads((CLIENT / "pyproject.toml").read_text())


def _shipped() -> set[Path]:
    """Source files the wheel ships (directories expanded)."""
    mapping = _client_project()["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    out: set[Path] = set()
    for source in mapping:
        path = (CLIENT / source).resolve()
        out |= {p for p in path.rglob("*") if p.is_file()} if path.is_dir() else {path}
    return out


def _ranges(requirements: list[str]) -> dict[str, str]:
    return {(r := Requirement(line)).name: str(r.specifier) for line in requirements}


def test_every_module_the_client_imports_is_shipped() -> None:
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys, attest.client; print(json.dumps(sorted("
            "m.__file__ for n, m in sys.modules.items()"
            " if n.startswith('attest') and getattr(m, '__file__', None))))",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    files = {Path(f).resolve() for f in json.loads(loaded.stdout)}
    assert Path(ROOT / "services/attest/client.py").resolve() in files
    assert files <= _shipped(), sorted(map(str, files - _shipped()))


def test_no_server_side_module_is_shipped() -> None:
    names = {p.relative_to(ROOT / "services").as_posix() for p in _shipped()}
    assert "attest/py.typed" in names
    for server_side in ("auth", "interceptors", "server", "metrics", "quota", "admission"):
        assert f"attest/core/{server_side}.py" not in names
    assert not [n for n in names if n.startswith("attest/") and "servicer" in n]


def test_version_and_dependency_ranges_match_the_full_package() -> None:
    full = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    client = _client_project()["project"]
    assert client["version"] == full["version"]
    assert client["requires-python"] == full["requires-python"]
    full_ranges = _ranges(full["dependencies"])
    client_ranges = _ranges(client["dependencies"])
    # Every dependency of the client is one of the full package's, in the same range.
    assert client_ranges == {name: full_ranges.get(name) for name in client_ranges}
