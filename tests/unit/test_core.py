"""Settings, errors and the request-size check of the shared core."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest
from pydantic import ValidationError

from attest.core import context, tracing
from attest.core.channels import _Token, _UnaryUnary
from attest.core.errors import DeadlineExceeded, InvalidArgument, Unavailable
from attest.core.interceptors import (
    ServerInterceptor,
    ThrottledFailureLog,
    check_size,
    status_code,
)
from attest.core.settings import ClientIdentity
from attest.lexical.settings import LexicalSettings
from attest.lexical.v1 import lexical_pb2


def test_unknown_settings_are_rejected(monkeypatch):
    monkeypatch.setenv("ATTEST_LEXICAL_BACKEND", "opensearch")
    assert LexicalSettings().backend == "opensearch"
    with pytest.raises(ValidationError, match="extra"):
        LexicalSettings(backnd="tantivy")  # type: ignore[call-arg]
    monkeypatch.setenv("ATTEST_LEXICAL_BACKEND", "solr")
    with pytest.raises(ValidationError, match="backend"):
        LexicalSettings()


def test_nested_settings_and_secrets_from_environment(monkeypatch):
    monkeypatch.setenv("ATTEST_LEXICAL_OPENSEARCH__PASSWORD", "hunter2")
    monkeypatch.setenv("ATTEST_LEXICAL_SERVER__PORT", "6000")
    monkeypatch.setenv("ATTEST_DATA_DIR", "/var/lib/attest")
    settings = LexicalSettings()
    assert settings.server.port == 6000
    assert str(settings.data_dir) == "/var/lib/attest"
    assert settings.opensearch.password is not None
    assert settings.opensearch.password.get_secret_value() == "hunter2"
    assert "hunter2" not in repr(settings)


def test_errors_carry_their_status_code():
    import grpc

    assert status_code(InvalidArgument("bad", field="q")) is grpc.StatusCode.INVALID_ARGUMENT
    assert status_code(Unavailable("down")) is grpc.StatusCode.UNAVAILABLE
    assert InvalidArgument("bad", field="q").details == "q: bad"


def test_oversized_requests_name_their_biggest_field():
    small = lexical_pb2.SearchRequest(query="x" * 10, top_k=1)
    check_size(small, limit=1024)
    big = lexical_pb2.SearchRequest(query="x" * 5000, top_k=1)
    with pytest.raises(InvalidArgument) as info:
        check_size(big, limit=1024)
    assert info.value.field == "query"
    assert "above the limit of 1,024 bytes" in info.value.message


def test_budget_is_capped_by_the_request_deadline():
    import time

    assert context.budget(5.0) == 5.0
    token = context.deadline_var.set(time.monotonic() + 0.5)
    try:
        assert 0.3 < context.budget(5.0) <= 0.5
        assert context.budget(0.1) == 0.1
    finally:
        context.deadline_var.reset(token)
    token = context.deadline_var.set(time.monotonic() - 1)
    try:
        with pytest.raises(DeadlineExceeded):
            context.budget(5.0)
    finally:
        context.deadline_var.reset(token)


def test_a_burst_of_the_same_failure_is_logged_once_a_second_with_the_count(caplog):
    now = [100.0]
    failures = ThrottledFailureLog(interval=1.0, clock=lambda: now[0])
    ask, search = "/attest.answer.v1.AnswerService/Ask", "/attest.lexical.v1.LexicalService/Search"
    caplog.set_level(logging.INFO, logger="attest.core.interceptors")
    logged = [failures.log(ask, "RESOURCE_EXHAUSTED", "at capacity") for _ in range(128)]
    # Another method, or another code of the same method, has its own line.
    assert failures.log(search, "RESOURCE_EXHAUSTED", "at capacity")
    assert failures.log(ask, "INVALID_ARGUMENT", "question: empty")
    assert logged[0]
    assert logged.count(True) == 1
    now[0] += 0.999
    assert not failures.log(ask, "RESOURCE_EXHAUSTED", "at capacity")
    now[0] += 0.002
    assert failures.log(ask, "RESOURCE_EXHAUSTED", "at capacity")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"{ask} failed: RESOURCE_EXHAUSTED at capacity",
        f"{search} failed: RESOURCE_EXHAUSTED at capacity",
        f"{ask} failed: INVALID_ARGUMENT question: empty",
        f"{ask} failed: RESOURCE_EXHAUSTED at capacity (128 more RESOURCE_EXHAUSTED since the last line)",
    ]


def test_tracing_is_off_without_an_endpoint_and_the_request_id_rides_in_task_headers(
    monkeypatch,
):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert tracing.endpoint() is None
    assert tracing.configure("test") is False
    carrier: dict[str, str] = {}
    with tracing.client_span("/x.v1.X/Y") as span:
        tracing.inject(carrier)
        assert not span.is_recording()
    assert carrier == {}
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4317")
    assert tracing.endpoint() == "http://collector:4317"
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.endpoint() is None

    class Task:
        class request:
            pass

    headers: dict[str, str] = {}
    token = context.request_id_var.set("req-1")
    try:
        tracing._publish_request_id(headers=headers)
    finally:
        context.request_id_var.reset(token)
    assert headers == {tracing.REQUEST_ID_HEADER: "req-1"}
    Task.request.attest_request_id = "req-1"  # type: ignore[attr-defined]
    tracing._adopt_request_id(task=Task)
    assert context.request_id_var.get() == "req-1"
    del Task.request.attest_request_id  # type: ignore[attr-defined]
    tracing._adopt_request_id(task=Task)
    assert context.request_id_var.get() is None


def test_with_tracing_off_a_call_makes_no_span_and_carries_no_trace_context(monkeypatch):
    """Off, the server scope and the client interceptor skip tracing entirely;
    configured, they open the spans and pass the caller's trace on as before."""
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    method = "/attest.x.v1.X/Y"
    calls: list[str] = []

    def recorded(name: str) -> Any:
        real = getattr(tracing, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return real(*args, **kwargs)

        return wrapper

    for name in ("server_span", "client_span", "inject"):
        monkeypatch.setattr(tracing, name, recorded(name))

    class Context:
        def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
            return (("traceparent", traceparent),)

        def time_remaining(self) -> float | None:
            return None

        def set_trailing_metadata(self, _: Any) -> None:
            pass

    async def continuation(details: Any, _request: Any) -> Any:
        return details

    def served_call_sends() -> dict[str, str]:
        """The metadata of a call made while serving a call that carries ``traceparent``."""
        server = ServerInterceptor(max_message_bytes=1024)
        client = _UnaryUnary(5.0, _Token(ClientIdentity()))
        details = grpc.aio.ClientCallDetails(method, None, None, None, None)
        with server._scope(method, Context()):  # type: ignore[arg-type]
            sent = asyncio.run(client.intercept_unary_unary(continuation, details, None))
        return dict(sent.metadata)

    monkeypatch.setattr(tracing, "_configured", None)
    assert not tracing.enabled()
    assert "traceparent" not in served_call_sends()
    assert calls == []

    monkeypatch.setattr(tracing, "_configured", "attest-test")
    assert tracing.enabled()
    assert served_call_sends()["traceparent"] == traceparent
    assert calls == ["server_span", "client_span", "inject"]


@pytest.mark.parametrize("attempts", [1, 2, 5])
def test_every_allowed_number_of_attempts_gives_a_service_config_grpc_accepts(attempts):
    import json
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    from attest.core.channels import service_config
    from attest.core.settings import ClientSettings

    config = service_config(
        [("grpc.health.v1.Health", "Check")], ClientSettings(max_attempts=attempts)
    )
    policies = [m["retryPolicy"]["maxAttempts"] for m in config["methodConfig"]]
    assert policies == ([] if attempts == 1 else [attempts])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        options = [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(config))]
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        server.stop(None)
