"""The one server interceptor: context, errors, size limit, metrics.

For every RPC it sets the request id, tenant and deadline contextvars, checks
the request size, counts and times the call, and maps exceptions to status
codes: an ``AttestError`` becomes its own code and message; anything else
becomes INTERNAL with a generic message (details go to the log, never to the
caller), so no RPC ever ends with UNKNOWN.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
from google.protobuf.message import Message

from attest.core import metrics
from attest.core.context import (
    DEFAULT_TENANT,
    deadline_var,
    new_request_id,
    request_id_var,
    tenant_var,
)
from attest.core.errors import AttestError, InvalidArgument

log = logging.getLogger(__name__)

REQUEST_ID_KEY = "x-request-id"
_INTERNAL_MESSAGE = "internal error; see the server log for the request id"

Handler = Callable[..., Any]


def status_code(error: AttestError) -> grpc.StatusCode:
    return grpc.StatusCode[error.code]


def check_size(request: Any, limit: int) -> None:
    """Reject a request message above ``limit`` bytes, naming its biggest field."""
    if not isinstance(request, Message):
        return
    size = request.ByteSize()
    if size <= limit:
        return
    biggest = "request"
    biggest_size = -1
    for descriptor, value in request.ListFields():
        if descriptor.is_repeated and descriptor.message_type is not None:
            field_size = sum(item.ByteSize() for item in value)
        elif isinstance(value, Message):
            field_size = value.ByteSize()
        else:
            field_size = len(value) if isinstance(value, str | bytes) else 8
        if field_size > biggest_size:
            biggest, biggest_size = descriptor.name, field_size
    raise InvalidArgument(
        f"request is {size:,} bytes, above the limit of {limit:,} bytes", field=biggest
    )


class ServerInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, *, max_message_bytes: int) -> None:
        self._max_message_bytes = max_message_bytes

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method: str = handler_call_details.method
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, handler.unary_unary, check=True),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(method, handler.unary_stream, check=True),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                self._wrap_unary(method, handler.stream_unary, check=False),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        assert handler.stream_stream is not None
        return grpc.stream_stream_rpc_method_handler(
            self._wrap_stream(method, handler.stream_stream, check=False),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _wrap_unary(self, method: str, inner: Handler, *, check: bool) -> Handler:
        async def behavior(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            with self._scope(method, context) as outcome:
                try:
                    if check:
                        check_size(request, self._max_message_bytes)
                    result = await inner(request, context)
                except Exception as exc:  # noqa: BLE001 - mapped, never swallowed
                    await self._abort(method, context, exc, outcome)
                outcome[0] = _final_code(context)
                return result

        return behavior

    def _wrap_stream(self, method: str, inner: Handler, *, check: bool) -> Handler:
        async def behavior(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            with self._scope(method, context) as outcome:
                try:
                    if check:
                        check_size(request, self._max_message_bytes)
                    async for item in inner(request, context):
                        yield item
                except Exception as exc:  # noqa: BLE001 - mapped, never swallowed
                    await self._abort(method, context, exc, outcome)
                outcome[0] = _final_code(context)

        return behavior

    @contextlib.contextmanager
    def _scope(
        self, method: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Iterator[list[str]]:
        metadata = dict(context.invocation_metadata() or ())
        request_id = str(metadata.get(REQUEST_ID_KEY) or new_request_id())
        remaining = context.time_remaining()
        tokens = (
            request_id_var.set(request_id),
            # Until authentication exists every caller is the default tenant.
            tenant_var.set(DEFAULT_TENANT),
            deadline_var.set(None if remaining is None else time.monotonic() + remaining),
        )
        context.set_trailing_metadata(((REQUEST_ID_KEY, request_id),))
        outcome = ["OK"]
        started = time.perf_counter()
        per_method = metrics.for_method(method)
        per_method.started.inc()
        per_method.in_flight.inc()
        try:
            yield outcome
        except asyncio.CancelledError:
            outcome[0] = "CANCELLED"
            raise
        finally:
            per_method.in_flight.dec()
            metrics.RPC_HANDLED.labels(method, outcome[0]).inc()
            per_method.latency.observe(time.perf_counter() - started)
            request_id_var.reset(tokens[0])
            tenant_var.reset(tokens[1])
            deadline_var.reset(tokens[2])

    async def _abort(
        self,
        method: str,
        context: grpc.aio.ServicerContext[Any, Any],
        exc: Exception,
        outcome: list[str],
    ) -> None:
        if isinstance(exc, grpc.aio.AbortError):
            # The handler aborted with an explicit status; keep it.
            outcome[0] = _final_code(context)
            raise exc
        if isinstance(exc, AttestError):
            code = status_code(exc)
            level = logging.WARNING if code == grpc.StatusCode.INTERNAL else logging.INFO
            log.log(level, "%s failed: %s %s", method, exc.code, exc.details)
            outcome[0] = exc.code
            await context.abort(code, exc.details)
        log.exception("%s failed with an unexpected error", method)
        outcome[0] = "INTERNAL"
        await context.abort(grpc.StatusCode.INTERNAL, _INTERNAL_MESSAGE)


def _final_code(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    code = context.code()
    if code is None:
        return "OK"
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    return str(code)
