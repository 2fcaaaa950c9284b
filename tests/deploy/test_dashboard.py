"""The Grafana dashboard the chart ships: rendered only when asked for, and
every series it queries is one that Attest's processes export."""

from __future__ import annotations

import json
import re

from tests.deploy.chart import ROOT, render

DASHBOARD = "rel-attest-dashboard"
# Histogram and counter series carry suffixes the code does not spell out.
_SUFFIXES = ("_bucket", "_count", "_sum")


def exported_metrics() -> set[str]:
    """Every metric name written in the services' code ("attest_…" literals)."""
    names: set[str] = set()
    for path in (ROOT / "services" / "attest").rglob("*.py"):
        names |= set(re.findall(r'"(attest_[a-z0-9_]+)"', path.read_text(encoding="utf-8")))
    return names


def queried_metrics(dashboard: dict) -> set[str]:
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    found = set()
    for expr in exprs:
        for name in re.findall(r"\b(attest_[a-z0-9_]+)", expr):
            for suffix in _SUFFIXES:
                if name.endswith(suffix):
                    name = name.removesuffix(suffix)
                    break
            found.add(name)
    return found


def test_the_dashboard_is_off_by_default() -> None:
    assert DASHBOARD not in render("default").names("ConfigMap")


def test_the_dashboard_configmap_is_labelled_for_grafanas_sidecar() -> None:
    out = render(
        "default",
        "metrics.grafanaDashboard.enabled=true",
        "metrics.grafanaDashboard.folder=Search",
    )
    config_map = out.get("ConfigMap", DASHBOARD)
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "Search"}
    shipped = json.loads((ROOT / "helm" / "attest" / "dashboards" / "attest.json").read_text())
    assert json.loads(config_map["data"]["attest.json"]) == shipped


def test_every_series_the_dashboard_queries_is_exported() -> None:
    dashboard = json.loads(
        (ROOT / "helm" / "attest" / "dashboards" / "attest.json").read_text(encoding="utf-8")
    )
    queried = queried_metrics(dashboard)
    unknown = queried - exported_metrics()
    assert not unknown, f"the dashboard queries series nothing exports: {sorted(unknown)}"
    # What an operator watches is all there: answers, stages, LLM calls, ingest, queues.
    assert {
        "attest_answers_total",
        "attest_answer_stage_seconds",
        "attest_answer_degradations_total",
        "attest_llm_requests_total",
        "attest_llm_tokens_total",
        "attest_ingest_stage_items_total",
        "attest_pipeline_queue_depth",
        "attest_rpc_handled_total",
    } <= queried
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]


def test_a_misspelt_series_would_be_caught() -> None:
    assert queried_metrics(
        {"panels": [{"targets": [{"expr": "rate(attest_answerz_total[5m])"}]}]}
    ) - exported_metrics() == {"attest_answerz_total"}
