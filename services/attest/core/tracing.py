"""OpenTelemetry traces across every gRPC hop and Celery task of a request.

Tracing is off unless an OTLP endpoint is configured, with OpenTelemetry's
own variables: ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_ENDPOINT`` (``http://collector:4317``; an ``http://``
endpoint is plaintext, ``https://`` uses TLS), and optionally
``OTEL_SERVICE_NAME`` (default ``attest-<service>``), ``OTEL_TRACES_SAMPLER``
/ ``OTEL_TRACES_SAMPLER_ARG`` (default: every trace, or the caller's
decision when a parent is sampled) and ``OTEL_SDK_DISABLED=true``. Spans go
to the collector over OTLP/gRPC in batches from a background thread; a
collector that is down loses spans, never requests. Without an endpoint
nothing is traced: the interceptors ask ``enabled()`` first and then neither
build a span nor read or write trace context, so tracing off costs one check
per call (a call's incoming ``traceparent`` is not passed on either; a process
that should carry traces configures an endpoint).

What is traced:

* every RPC a server handles (``attest.core.interceptors``): a SERVER span
  named after the method, child of the caller's span when the call carries
  W3C ``traceparent``/``tracestate`` metadata, with the request id, tenant and
  status code as attributes;
* every unary call a service makes to another (``attest.core.channels``): a
  CLIENT span around the call, whose context travels in the call's metadata,
  so a callee's spans are its children; streaming calls carry the context
  without a span of their own;
* Celery tasks (``instrument_celery``): OpenTelemetry's Celery
  instrumentation puts the context in each task message's headers, and the
  worker's run of the task is a child of the span that sent it; the request
  id travels in the same headers (``attest_request_id``) so the worker's log
  lines carry it.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from attest.core.context import request_id_var

log = logging.getLogger(__name__)

TRACER_NAME = "attest"
#: Celery message header carrying the request id from the sender to the worker.
REQUEST_ID_HEADER = "attest_request_id"

_lock = threading.Lock()
_configured: str | None = None
_celery_instrumented = False

# gRPC codes that mean the server failed (OpenTelemetry's RPC conventions);
# a caller's mistake (INVALID_ARGUMENT, NOT_FOUND, ...) leaves a server span unset.
_SERVER_ERRORS = frozenset(
    {"UNKNOWN", "DEADLINE_EXCEEDED", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS"}
)


def endpoint() -> str | None:
    """The OTLP endpoint traces go to, or None when tracing is off."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    value = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    return value.strip() or None if value else None


def configure(service: str) -> bool:
    """Install the exporting tracer provider once per process; False when tracing is off.

    ``service`` names this process in the traces (``attest-<service>``) unless
    ``OTEL_SERVICE_NAME`` is set. Call it in each process that serves or runs
    tasks (a forked Celery pool process included: the exporter's thread does
    not survive a fork).
    """
    global _configured
    target = endpoint()
    if target is None:
        return False
    with _lock:
        if _configured is not None:
            return True
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        name = os.environ.get("OTEL_SERVICE_NAME") or f"attest-{service}"
        provider = TracerProvider(resource=Resource.create({"service.name": name}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        atexit.register(provider.shutdown)
        _configured = name
        log.info("tracing: spans of %s go to %s", name, target)
        return True


def enabled() -> bool:
    """Whether ``configure`` installed the exporting provider in this process.

    The per-call check of the interceptors: without it every RPC would build
    a no-op span and extract and inject an empty context.
    """
    return _configured is not None


def flush(timeout_seconds: float = 5.0) -> None:
    """Export the spans still buffered (at shutdown, or before a test reads them)."""
    provider = trace.get_tracer_provider()
    force_flush = getattr(provider, "force_flush", None)
    if force_flush is not None:
        force_flush(int(timeout_seconds * 1000))


def tracer() -> trace.Tracer:
    return trace.get_tracer(TRACER_NAME)


@contextlib.contextmanager
def server_span(method: str, metadata: Mapping[str, Any]) -> Iterator[Span]:
    """The SERVER span of one RPC, child of the caller's context in ``metadata``."""
    parent = propagate.extract(metadata)
    with tracer().start_as_current_span(
        method,
        context=parent,
        kind=SpanKind.SERVER,
        attributes=_rpc_attributes(method),
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def end_server_span(span: Span, code: str, request_id: str, tenant: str) -> None:
    """Record an RPC's outcome on its span."""
    if not span.is_recording():
        return
    span.set_attribute("rpc.grpc.status_code", code)
    span.set_attribute("attest.request_id", request_id)
    span.set_attribute("attest.tenant", tenant)
    if code in _SERVER_ERRORS:
        span.set_status(Status(StatusCode.ERROR, code))


@contextlib.contextmanager
def client_span(method: str) -> Iterator[Span]:
    """The CLIENT span of one outgoing unary call (its context goes in the metadata)."""
    with tracer().start_as_current_span(
        method,
        kind=SpanKind.CLIENT,
        attributes=_rpc_attributes(method),
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        yield span


def end_client_span(span: Span, code: str) -> None:
    if not span.is_recording():
        return
    span.set_attribute("rpc.grpc.status_code", code)
    if code != "OK":
        span.set_status(Status(StatusCode.ERROR, code))


def inject(carrier: MutableMapping[str, str]) -> None:
    """Put the current trace context (``traceparent``, ``tracestate``) into ``carrier``."""
    propagate.inject(carrier)


def _rpc_attributes(method: str) -> dict[str, str]:
    service, _, name = method.lstrip("/").rpartition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}


def instrument_celery() -> None:
    """Trace Celery tasks sent and run by this process, and carry the request id with them.

    Idempotent. The OpenTelemetry instrumentation is installed only when
    tracing is configured; the request id travels either way.
    """
    global _celery_instrumented
    with _lock:
        if _celery_instrumented:
            return
        _celery_instrumented = True
    from celery import signals

    signals.before_task_publish.connect(_publish_request_id, weak=False)
    signals.task_prerun.connect(_adopt_request_id, weak=False)
    if _configured is not None:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument()  # type: ignore[no-untyped-call]


def _publish_request_id(headers: MutableMapping[str, Any] | None = None, **_: Any) -> None:
    request_id = request_id_var.get()
    if headers is not None and request_id and REQUEST_ID_HEADER not in headers:
        headers[REQUEST_ID_HEADER] = request_id


def _adopt_request_id(task: Any = None, **_: Any) -> None:
    request_id = getattr(getattr(task, "request", None), REQUEST_ID_HEADER, None)
    # Set for every task (None when the sender had none): a worker runs its
    # tasks one after another in one context.
    request_id_var.set(request_id if isinstance(request_id, str) and request_id else None)
