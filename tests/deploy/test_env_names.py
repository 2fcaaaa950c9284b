"""The environment the chart and the compose file set is what the services read.

Each service reads ATTEST_<SERVICE>_* variables through its pydantic settings
class, and silently ignores a variable it does not know. So a misspelt or
outdated name in the chart or the compose file would configure nothing. These
tests derive every name a settings class accepts and check both deployment
descriptions against it, and that they set the same names for each process.
A process whose settings module does not exist fails: the chart or the compose
file would deploy a service the code does not have.
"""

from __future__ import annotations

import importlib
import os
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import AliasChoices, BaseModel
from pydantic_settings import BaseSettings

from attest.core.settings import ServiceSettings
from tests.deploy.chart import ROOT, Rendered, full, render

COMPOSE = ROOT / "deploy" / "docker-compose.yml"
SERVICES = ["answer", "ingest", "lexical", "semantic", "rerank", "generate", "knowledge"]
# Off by default in both: the chart is checked with it enabled, the compose file
# runs it under this profile.
OPTIONAL = {"knowledge": "knowledge"}
PIPELINE = ("attest.pipeline.settings", "ATTEST_PIPELINE_")
# where the index sinks (in the ingest service and in the index task) send facts
FACTS = ("attest.ingest.knowledge", "ATTEST_INGEST_KNOWLEDGE_")
# process name in the chart and compose -> the settings it reads: (module, env prefix)
PROCESSES: dict[str, list[tuple[str, str]]] = {
    **{s: [(f"attest.{s}.settings", f"ATTEST_{s.upper()}_")] for s in SERVICES},
    # the ingest service publishes pipeline tasks with the workers' Celery settings
    "ingest": [("attest.ingest.settings", "ATTEST_INGEST_"), PIPELINE, FACTS],
    "worker-index": [PIPELINE, FACTS],
}


def settings_class(module_name: str, prefix: str) -> type[BaseSettings]:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            pytest.fail(
                f"{module_name} does not exist, but the chart or the compose file deploys a "
                "process that reads it: drop the process or add the settings module"
            )
        raise
    for value in vars(module).values():
        if (
            isinstance(value, type)
            and issubclass(value, BaseSettings)
            and value not in (BaseSettings, ServiceSettings)
            and value.model_config.get("env_prefix") == prefix
        ):
            return value
    pytest.fail(f"{module_name} has no settings class with env_prefix {prefix}")


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _nested_model(arg)
        if found is not None:
            return found
    return None


def accepted_names(model: type[BaseModel], prefix: str, top: bool = True) -> set[str]:
    """Every environment name that sets a field of ``model`` (nested with "__")."""
    names: set[str] = set()
    for name, info in model.model_fields.items():
        keys = {name}
        if info.alias:
            keys.add(info.alias)
        alias = info.validation_alias
        if top and alias is not None:
            # pydantic-settings reads an aliased field by its alias alone,
            # without the prefix (e.g. ATTEST_DATA_DIR)
            choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
            names.update(str(c).upper() for c in choices if isinstance(c, str))
            continue
        nested = _nested_model(info.annotation)
        for key in keys:
            if nested is not None:
                names.update(accepted_names(nested, f"{prefix}{key.upper()}__", top=False))
            names.add(f"{prefix}{key.upper()}")
    return names


@cache
def _chart_defaults() -> Rendered:
    return render(
        "default",
        "endpoints.llm.url=http://tgi:80",
        *[f"services.{service}.enabled=true" for service in OPTIONAL],
    )


def chart_env(process: str) -> dict[str, str]:
    """ATTEST_* variables of one process in the chart's defaults (LLM configured,
    the optional services enabled)."""
    env = _chart_defaults().env(full(process))
    return {
        name: var.get("value", "<secret>")
        for name, var in env.items()
        if name.startswith("ATTEST_")
    }


def compose_env(service: str) -> dict[str, str]:
    document = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    env = document["services"][service]["environment"]
    resolved = {}
    for name, value in env.items():
        if name.startswith("ATTEST_"):
            # ${VAR:-default} -> default, as docker compose does without a .env
            resolved[name] = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value))
    return resolved


def test_every_attest_process_deployed_is_checked() -> None:
    # a process left out of PROCESSES would escape the checks below
    document = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    compose = {
        name
        for name, service in document["services"].items()
        if service.get("command", [None])[0] in ("serve", "worker")
    }
    assert compose == set(PROCESSES)
    chart = _chart_defaults().names("Deployment") - {full("tgi")}
    assert chart == {full(process) for process in PROCESSES}


def test_optional_services_are_off_by_default_in_both() -> None:
    document = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    deployed = render("default").names("Deployment")
    for service, profile in OPTIONAL.items():
        assert document["services"][service]["profiles"] == [profile]
        assert full(service) not in deployed
    # and the others run without a profile
    for name in set(PROCESSES) - set(OPTIONAL):
        assert "profiles" not in document["services"][name], name


@pytest.mark.parametrize("process", sorted(PROCESSES))
def test_chart_and_compose_set_the_same_variables(process: str) -> None:
    assert sorted(chart_env(process)) == sorted(compose_env(process))


@pytest.mark.parametrize("process", sorted(PROCESSES))
@pytest.mark.parametrize("source", ["chart", "compose"])
def test_every_variable_set_is_one_the_service_reads(
    process: str, source: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = chart_env(process) if source == "chart" else compose_env(process)
    classes = [(settings_class(module, prefix), prefix) for module, prefix in PROCESSES[process]]
    accepted = set().union(*(accepted_names(cls, prefix) for cls, prefix in classes))
    unknown = sorted(set(env) - accepted)
    assert not unknown, f"{[c.__name__ for c, _ in classes]} read none of {unknown}"
    # and the values parse: the settings build from exactly this environment
    for name in [n for n in os.environ if n.startswith("ATTEST_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        if value == "<secret>":
            value = "redis://redis:6379/0" if name.endswith("_URL") else "s3cret"
        if name.endswith("_CHECKPOINT"):
            (tmp_path / "pfid.json").write_text("{}")
            value = str(tmp_path)
        monkeypatch.setenv(name, value)
    for cls, prefix in classes:
        settings = cls()
        server = getattr(settings, "server", None)
        port = env.get(f"{prefix}SERVER__PORT")
        if server is not None and port is not None:
            assert server.port == int(port)


def test_settings_names_are_derived_from_the_models() -> None:
    from attest.lexical.settings import LexicalSettings

    names = accepted_names(LexicalSettings, "ATTEST_LEXICAL_")
    assert {
        "ATTEST_LEXICAL_BACKEND",
        "ATTEST_LEXICAL_SERVER__PORT",
        "ATTEST_LEXICAL_ELASTICSEARCH__HOSTS",
        "ATTEST_LEXICAL_LOGGING__JSON",
        "ATTEST_DATA_DIR",
    } <= names
    assert "ATTEST_LEXICAL_DATA_DIR" not in names
    assert "ATTEST_LEXICAL_ELASTICSEARCH__HOST" not in names


def test_compose_wires_the_knowledge_service_through_one_variable() -> None:
    document = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    services = document["services"]
    callers = {
        "answer": "ATTEST_ANSWER_KNOWLEDGE_ADDRESS",
        "ingest": "ATTEST_INGEST_KNOWLEDGE_ADDRESS",
        # the index task's facts hook reads the ingest service's name
        "worker-index": "ATTEST_INGEST_KNOWLEDGE_ADDRESS",
    }
    for service, name in callers.items():
        # empty unless deploy/.env names the service (it runs under its profile only)
        assert services[service]["environment"][name] == "${ATTEST_KNOWLEDGE_ADDRESS:-}"
    example = (ROOT / "deploy" / ".env.example").read_text(encoding="utf-8")
    assert "ATTEST_KNOWLEDGE_ADDRESS=\n" in example
    assert "dns:///knowledge:50055" in example
    knowledge = services["knowledge"]
    # the embedded personal text index lives on a volume at the data directory
    data_dir = knowledge["environment"]["ATTEST_DATA_DIR"]
    assert f"knowledge:{data_dir}" in knowledge["volumes"]
    assert "knowledge" in document["volumes"]
    assert (
        knowledge["environment"]["ATTEST_KNOWLEDGE_PERSONAL__QDRANT_URL"]
        == (services["semantic"]["environment"]["ATTEST_SEMANTIC_QDRANT__URL"])
    )
