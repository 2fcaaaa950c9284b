"""Prometheus metrics per RPC."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RPC_STARTED = Counter("attest_rpc_started_total", "RPCs received, by method.", ["method"])
RPC_HANDLED = Counter(
    "attest_rpc_handled_total",
    "RPCs completed, by method and gRPC status code.",
    ["method", "code"],
)
RPC_LATENCY = Histogram(
    "attest_rpc_duration_seconds",
    "Time from receiving an RPC to its final status, by method.",
    ["method"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
RPC_IN_FLIGHT = Gauge("attest_rpc_in_flight", "RPCs being handled, by method.", ["method"])


class MethodMetrics:
    """The labelled children of one method, looked up once instead of per call."""

    def __init__(self, method: str) -> None:
        self.started = RPC_STARTED.labels(method)
        self.in_flight = RPC_IN_FLIGHT.labels(method)
        self.latency = RPC_LATENCY.labels(method)


_BY_METHOD: dict[str, MethodMetrics] = {}


def for_method(method: str) -> MethodMetrics:
    found = _BY_METHOD.get(method)
    if found is None:
        found = _BY_METHOD[method] = MethodMetrics(method)
    return found


def serve_metrics(port: int) -> None:
    """Expose /metrics over HTTP on ``port`` from a background thread."""
    start_http_server(port)
