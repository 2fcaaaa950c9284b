"""Client channels between services.

Channels get keepalive, message limits, round-robin balancing over every
address a name resolves to (headless Kubernetes services), and a retry policy
for the methods the caller declares idempotent, through gRPC's service config.
An interceptor propagates the request id and caps every call's timeout by the
deadline of the request being served.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from attest.core.context import budget, request_id_var
from attest.core.interceptors import REQUEST_ID_KEY
from attest.core.settings import ClientSettings

RETRYABLE_CODES = ("UNAVAILABLE", "RESOURCE_EXHAUSTED")


def service_config(
    idempotent: Sequence[tuple[str, str]], settings: ClientSettings
) -> dict[str, Any]:
    """gRPC service config retrying ``(service, method)`` pairs on transient codes."""
    method_config: list[dict[str, Any]] = []
    if idempotent:
        method_config.append(
            {
                "name": [{"service": service, "method": method} for service, method in idempotent],
                "retryPolicy": {
                    "maxAttempts": settings.max_attempts,
                    "initialBackoff": "0.05s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": list(RETRYABLE_CODES),
                },
            }
        )
    return {"loadBalancingConfig": [{"round_robin": {}}], "methodConfig": method_config}


def _merge_metadata(metadata: Any) -> grpc.aio.Metadata:
    merged = grpc.aio.Metadata(*(metadata or ()))
    request_id = request_id_var.get()
    if request_id and not merged.get_all(REQUEST_ID_KEY):
        merged.add(REQUEST_ID_KEY, request_id)
    return merged


class _ContextPropagation(
    grpc.aio.UnaryUnaryClientInterceptor,
    grpc.aio.UnaryStreamClientInterceptor,
):
    def __init__(self, default_timeout: float) -> None:
        self._default_timeout = default_timeout

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        timeout = budget(details.timeout if details.timeout is not None else self._default_timeout)
        return grpc.aio.ClientCallDetails(
            method=details.method,
            timeout=timeout,
            metadata=_merge_metadata(details.metadata),
            credentials=details.credentials,
            wait_for_ready=details.wait_for_ready,
        )

    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request)

    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        return await continuation(self._details(client_call_details), request)


def create_channel(
    target: str,
    settings: ClientSettings | None = None,
    *,
    idempotent: Sequence[tuple[str, str]] = (),
) -> grpc.aio.Channel:
    """An insecure aio channel to ``target`` (``host:port`` or ``dns:///name:port``)."""
    settings = settings or ClientSettings()
    options = [
        ("grpc.keepalive_time_ms", int(settings.keepalive_seconds * 1000)),
        ("grpc.keepalive_timeout_ms", int(settings.keepalive_timeout_seconds * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", json.dumps(service_config(idempotent, settings))),
    ]
    return grpc.aio.insecure_channel(
        target,
        options=options,
        interceptors=[_ContextPropagation(settings.timeout_seconds)],
    )
