"""The one server interceptor: context, errors, size limit, metrics.

For every RPC it sets the request id, tenant and deadline contextvars, checks
the request size, counts and times the call, and maps exceptions to status
codes: an ``AttestError`` becomes its own code and message; anything else
becomes INTERNAL with a generic message (details go to the log, never to the
caller), so no RPC ever ends with UNKNOWN.

Request messages that cannot be decoded (a corrupt wire format, invalid UTF-8
in a string field) are INVALID_ARGUMENT too. grpc.aio runs a method's request
deserializer before the handler, outside any code of ours, and answers UNKNOWN
with the exception's text when it raises; so every handler's deserializer is
wrapped to hand an ``Undecodable`` marker to the handler instead, which the
wrapped handler turns into the error, for unary and streaming requests alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
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
from attest.core.validation import is_valid_request_id

log = logging.getLogger(__name__)

REQUEST_ID_KEY = "x-request-id"
_INTERNAL_MESSAGE = "internal error; see the server log for the request id"

Handler = Callable[..., Any]
Deserializer = Callable[[bytes], Any]


class Undecodable:
    """Stands in for a request message whose bytes could not be decoded."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name

    def error(self) -> InvalidArgument:
        # The decoder's own text is not passed on: it names internals and says
        # no more than this does.
        return InvalidArgument(
            f"is not a valid {self.type_name} message "
            "(malformed protobuf encoding or invalid UTF-8 in a string field)",
            field="request",
        )


def lenient(deserializer: Deserializer | None) -> Deserializer | None:
    """``deserializer`` returning an ``Undecodable`` instead of raising."""
    if deserializer is None:
        return None
    type_name = _message_name(deserializer)

    def deserialize(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception:  # noqa: BLE001 - whatever the decoder raises, the bytes are bad
            return Undecodable(type_name)

    return deserialize


def _message_name(deserializer: Deserializer) -> str:
    # Generated handlers pass ``SomeMessage.FromString``, a bound class method.
    owner = getattr(deserializer, "__self__", None)
    descriptor = getattr(owner, "DESCRIPTOR", None)
    return str(getattr(descriptor, "full_name", "") or "request")


async def _decoded(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    async for request in requests:
        if isinstance(request, Undecodable):
            raise request.error()
        yield request


def _request_id(metadata: dict[str, Any]) -> str:
    """The caller's request id when it is short and plain, else a fresh one."""
    given = metadata.get(REQUEST_ID_KEY)
    return given if is_valid_request_id(given) else new_request_id()


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
        deserializer = lenient(handler.request_deserializer)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, handler.unary_unary, unary_request=True),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(method, handler.unary_stream, unary_request=True),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                self._wrap_unary(method, handler.stream_unary, unary_request=False),
                request_deserializer=deserializer,
                response_serializer=handler.response_serializer,
            )
        assert handler.stream_stream is not None
        return grpc.stream_stream_rpc_method_handler(
            self._wrap_stream(method, handler.stream_stream, unary_request=False),
            request_deserializer=deserializer,
            response_serializer=handler.response_serializer,
        )

    def _wrap_unary(self, method: str, inner: Handler, *, unary_request: bool) -> Handler:
        async def behavior(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            with self._scope(method, context) as outcome:
                try:
                    if unary_request:
                        request = _checked(request, self._max_message_bytes)
                    else:
                        request = _decoded(request)
                    result = await inner(request, context)
                except Exception as exc:  # noqa: BLE001 - mapped, never swallowed
                    await self._abort(method, context, exc, outcome)
                outcome[0] = _final_code(context)
                return result

        return behavior

    def _wrap_stream(self, method: str, inner: Handler, *, unary_request: bool) -> Handler:
        async def behavior(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            with self._scope(method, context) as outcome:
                try:
                    if unary_request:
                        request = _checked(request, self._max_message_bytes)
                    else:
                        request = _decoded(request)
                    responses = inner(request, context)
                    if inspect.isawaitable(responses):
                        # A handler on the reader/writer API (grpc's health Watch)
                        # sends with context.write and returns nothing.
                        await responses
                    else:
                        async for item in responses:
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
        request_id = _request_id(metadata)
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
        if isinstance(exc, NotImplementedError):
            # What a generated servicer base raises for a method the service
            # does not implement (grpc's own health service has no List here).
            outcome[0] = "UNIMPLEMENTED"
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "method not implemented")
        log.exception("%s failed with an unexpected error", method)
        outcome[0] = "INTERNAL"
        await context.abort(grpc.StatusCode.INTERNAL, _INTERNAL_MESSAGE)


def _checked(request: Any, limit: int) -> Any:
    """A unary request, decoded and within the size limit."""
    if isinstance(request, Undecodable):
        raise request.error()
    check_size(request, limit)
    return request


def _final_code(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    code = context.code()
    if code is None:
        return "OK"
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    return str(code)
