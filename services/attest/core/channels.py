"""Client channels between services.

Channels get keepalive, message limits, round-robin balancing over every
address a name resolves to (headless Kubernetes services), and a retry policy
for the methods the caller declares idempotent, through gRPC's service config.
Interceptors propagate the request id and the token on every call, and cap
every unary call's timeout by the deadline of the request being served. A
call made while serving a request names that request's tenant unless the
caller named one, so a service's own calls downstream (generate's re-search)
read the asking tenant's stores.

Security is a ``ClientIdentity``: TLS (the servers' CA, a client certificate
for mTLS) and the token presented, an API key or a JWT sent as
``authorization: Bearer``. It is the first one configured of: the one passed
in, the one in the ``ClientSettings`` passed in, the identity of the server
this process runs (``ServerSettings.identity``, set by the server), and
``ATTEST_CLIENT_*`` (command-line clients). A service calls the others under
its service identity; it names the tenant it acts for with
``attest.core.auth.tenant_metadata`` (only a service identity may), where the
callee's stores are kept per tenant.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from attest.core import tracing
from attest.core.context import budget, identity_var, request_id_var, tenant_var
from attest.core.metadata import API_KEY_KEY, AUTHORIZATION_KEY, REQUEST_ID_KEY, TENANT_KEY
from attest.core.settings import ClientIdentity, ClientSecurity, ClientSettings

_process_identity: ClientIdentity | None = None


def use_identity(identity: ClientIdentity) -> None:
    """Make ``identity`` the default of every channel this process opens from now on
    (a server does this with its ``ServerSettings.identity``)."""
    global _process_identity
    _process_identity = identity if identity.configured else None


def resolve_identity(
    settings: ClientSettings | None, identity: ClientIdentity | None = None
) -> ClientIdentity:
    if identity is not None:
        return identity
    if settings is not None and settings.identity.configured:
        return settings.identity
    if _process_identity is not None:
        return _process_identity
    return ClientSecurity().identity()


RETRYABLE_CODES = ("UNAVAILABLE", "RESOURCE_EXHAUSTED")


def service_config(
    idempotent: Sequence[tuple[str, str]], settings: ClientSettings
) -> dict[str, Any]:
    """gRPC service config retrying ``(service, method)`` pairs on transient codes."""
    method_config: list[dict[str, Any]] = []
    # One attempt means no retries: gRPC refuses a retry policy of fewer than
    # two attempts (the whole service config with it), so none is sent.
    if idempotent and settings.max_attempts > 1:
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


class _Token:
    """The bearer token of this process, re-read when its file changes (rotation)."""

    def __init__(self, identity: ClientIdentity) -> None:
        self._fixed = identity.token.get_secret_value() if identity.token is not None else None
        self._path: Path | None = identity.token_file
        self._stamp: tuple[int, int] | None = None
        self._checked = float("-inf")
        self._value: str | None = None

    def get(self) -> str | None:
        if self._fixed is not None or self._path is None:
            return self._fixed
        now = time.monotonic()
        if now - self._checked >= 1.0:
            self._checked = now
            st = self._path.stat()
            if (st.st_mtime_ns, st.st_size) != self._stamp:
                self._value = self._path.read_text(encoding="utf-8").strip() or None
                self._stamp = (st.st_mtime_ns, st.st_size)
        return self._value


def _merge_metadata(metadata: Any, token: str | None) -> grpc.aio.Metadata:
    merged = grpc.aio.Metadata(*(metadata or ()))
    request_id = request_id_var.get()
    if request_id and not merged.get_all(REQUEST_ID_KEY):
        merged.add(REQUEST_ID_KEY, request_id)
    # A call that carries its own credential keeps it alone: a server refuses
    # a call with two credential headers.
    if token is not None and not any(merged.get_all(k) for k in (AUTHORIZATION_KEY, API_KEY_KEY)):
        merged.add(AUTHORIZATION_KEY, f"Bearer {token}")
    # Only while serving a request (the interceptor set its caller): a command-line
    # client has no tenant to name, and a callee honours the name from a service only.
    if identity_var.get() is not None and not merged.get_all(TENANT_KEY):
        merged.add(TENANT_KEY, tenant_var.get())
    if tracing.enabled():
        trace_context: dict[str, str] = {}
        tracing.inject(trace_context)
        for key, value in trace_context.items():
            if not merged.get_all(key):
                merged.add(key, value)
    return merged


class _Propagation:
    """Request id, service token and deadline onto every outgoing call."""

    def __init__(self, default_timeout: float, token: _Token) -> None:
        self._default_timeout = default_timeout
        self._token = token

    def _details(
        self, details: grpc.aio.ClientCallDetails, *, cap_timeout: bool = True
    ) -> grpc.aio.ClientCallDetails:
        timeout = details.timeout
        if cap_timeout:
            timeout = budget(timeout if timeout is not None else self._default_timeout)
        return grpc.aio.ClientCallDetails(
            method=details.method,
            timeout=timeout,
            metadata=_merge_metadata(details.metadata, self._token.get()),
            credentials=details.credentials,
            wait_for_ready=details.wait_for_ready,
        )


# grpc.aio files an interceptor under the first of the four kinds it is an
# instance of, so one class per kind: a single object implementing several
# would intercept unary-unary calls only.
class _UnaryUnary(_Propagation, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        if not tracing.enabled():
            return await continuation(self._details(client_call_details), request)
        method = client_call_details.method
        if isinstance(method, bytes):
            method = method.decode("utf-8", "replace")
        with tracing.client_span(method) as span:
            call = await continuation(self._details(client_call_details), request)
            if not span.is_recording():
                return call
            # The span lasts until the response (or error) arrives; the caller
            # awaits the same finished call afterwards.
            code = "OK"
            try:
                await call
            except grpc.aio.AioRpcError as err:
                code = err.code().name
            except asyncio.CancelledError:
                tracing.end_client_span(span, "CANCELLED")
                raise
            tracing.end_client_span(span, code)
            return call


class _UnaryStream(_Propagation, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request: Any
    ) -> Any:
        # Streams keep the timeout their caller chose (often none: a watch, a
        # generation that takes as long as the model does).
        return await continuation(self._details(client_call_details, cap_timeout=False), request)


class _StreamUnary(_Propagation, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(
        self, continuation: Callable[..., Any], client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(
            self._details(client_call_details, cap_timeout=False), request_iterator
        )


class _StreamStream(_Propagation, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request_iterator: Any
    ) -> Any:
        return await continuation(
            self._details(client_call_details, cap_timeout=False), request_iterator
        )


def create_channel(
    target: str,
    settings: ClientSettings | None = None,
    *,
    idempotent: Sequence[tuple[str, str]] = (),
    identity: ClientIdentity | None = None,
) -> grpc.aio.Channel:
    """An aio channel to ``target`` (``host:port`` or ``dns:///name:port``), with the
    TLS and token of ``identity`` or, by default, of this process (module doc)."""
    identity = resolve_identity(settings, identity)
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
    token = _Token(identity)
    interceptors: list[grpc.aio.ClientInterceptor] = [
        kind(settings.timeout_seconds, token)
        for kind in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)
    ]
    tls = identity.tls
    if not tls.secure:
        return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.ca_file.read_bytes() if tls.ca_file else None,
        private_key=tls.key_file.read_bytes() if tls.key_file else None,
        certificate_chain=tls.cert_file.read_bytes() if tls.cert_file else None,
    )
    return grpc.aio.secure_channel(target, credentials, options=options, interceptors=interceptors)
