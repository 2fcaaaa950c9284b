"""Render the Helm chart with the real helm binary and index what it made."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "attest"
VALUES = {
    "default": [],
    "gpu-production": [CHART / "ci" / "gpu-production-values.yaml"],
    "minimal": [CHART / "ci" / "minimal-values.yaml"],
}
KUBE_VERSION = "1.30.0"
RELEASE = "rel"


def helm_binary() -> str:
    """ATTEST_HELM, the CI tool cache, or PATH; skip (fail under CI) without one."""
    candidates = [
        os.environ.get("ATTEST_HELM"),
        str(Path.home() / ".cache" / "attest-ci" / "bin" / "helm"),
        shutil.which("helm"),
    ]
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            return candidate
    message = "helm is not installed: bash .ci/deploy-checks.sh builds it"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


class RenderError(Exception):
    pass


@dataclass
class Rendered:
    docs: list[dict[str, Any]]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        for doc in self.docs:
            if doc["kind"] == kind and doc["metadata"]["name"] == name:
                return doc
        raise KeyError(f"no {kind} {name}; have {sorted(self.names(kind))}")

    def names(self, kind: str) -> set[str]:
        return {d["metadata"]["name"] for d in self.docs if d["kind"] == kind}

    def kinds(self) -> set[str]:
        return {d["kind"] for d in self.docs}

    def container(self, deployment: str) -> dict[str, Any]:
        pod = self.get("Deployment", deployment)["spec"]["template"]["spec"]
        containers: list[dict[str, Any]] = pod["containers"]
        assert len(containers) == 1
        return containers[0]

    def env(self, deployment: str) -> dict[str, dict[str, Any]]:
        """Each variable of the deployment's container by name: {"value": ...} or {"valueFrom": ...}."""
        return {e["name"]: e for e in self.container(deployment).get("env", [])}


def render(values: str = "default", *sets: str) -> Rendered:
    args = [
        helm_binary(),
        "template",
        RELEASE,
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        *[f"--values={path}" for path in VALUES[values]],
        *[f"--set={item}" for item in sets],
    ]
    proc = subprocess.run(args, capture_output=True, text=True, check=False, timeout=60)
    if proc.returncode != 0:
        raise RenderError(proc.stderr.strip())
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    return Rendered(docs)


def full(component: str) -> str:
    return f"{RELEASE}-attest-{component}"
