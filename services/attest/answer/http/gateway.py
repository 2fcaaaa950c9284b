"""The HTTP/JSON gateway: the public RPCs over HTTP, forwarded to this process's
own gRPC listener through a real channel.

Forwarding through gRPC (rather than calling the servicers' code) is what
makes HTTP and gRPC behave the same: the server interceptor authenticates the
caller from the forwarded ``authorization`` / ``x-api-key`` header, takes the
tenant from that identity, applies the quotas and the request limits, and maps
the typed errors to status codes; the gateway only turns JSON into protobuf
and a gRPC status into an HTTP one, with the same message. The bindings come
from the protos' ``google.api.http`` annotations (``attest.answer.http.routes``).

A server-streaming RPC answers with server-sent events: one ``event:`` per
message, named after the message's oneof case (``retrieval``, ``sentence``,
``revision``, ``draft``, ``final`` for AskStream), its JSON as ``data:``.
An error before the first message is an ordinary HTTP error; one after it is
an ``error`` event, and the stream ends.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import grpc
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from attest.answer.http.routes import Binding, bindings
from attest.core.metadata import API_KEY_KEY, AUTHORIZATION_KEY, REQUEST_ID_KEY, RETRY_AFTER_KEY

log = logging.getLogger(__name__)

#: gRPC status -> HTTP status (as google.rpc.Code documents the mapping).
HTTP_STATUS: Mapping[grpc.StatusCode, int] = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}
_BY_HTTP_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    415: grpc.StatusCode.INVALID_ARGUMENT,
}
#: Request headers passed on to the gRPC call as metadata.
FORWARDED_HEADERS = (AUTHORIZATION_KEY, API_KEY_KEY, REQUEST_ID_KEY)


class _MalformedHttpIsNoServerError(logging.Filter):
    """aiohttp logs a request it cannot parse (a bad header byte, a broken chunk)
    as an ERROR with a traceback, though the client gets its 400; such a request
    is the client's mistake, so it becomes one INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and exc.code < 500:
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg = "malformed HTTP request refused (%s): %s"
            record.args = (exc.code, str(exc.message).strip().splitlines()[0][:200])
            record.exc_info = record.exc_text = None
        return True


_MALFORMED = _MalformedHttpIsNoServerError()


class BadRequest(Exception):
    """A request the gateway cannot turn into a protobuf message (INVALID_ARGUMENT)."""


def error_body(code: grpc.StatusCode, message: str) -> dict[str, Any]:
    """The JSON of an error: the HTTP status, the gRPC status name and its message."""
    return {"error": {"code": HTTP_STATUS[code], "status": code.name, "message": message}}


def error_response(
    code: grpc.StatusCode, message: str, headers: Mapping[str, str] | None = None
) -> web.Response:
    return web.json_response(error_body(code, message), status=HTTP_STATUS[code], headers=headers)


def rpc_error_response(err: grpc.aio.AioRpcError) -> web.Response:
    """The HTTP response of a failed call: its status mapped, its message unchanged,
    ``Retry-After`` (whole seconds, rounded up) from the ``retry-after`` trailer."""
    headers: dict[str, str] = {}
    for key, value in err.trailing_metadata() or ():
        if key == RETRY_AFTER_KEY:
            try:
                headers["Retry-After"] = str(max(1, math.ceil(float(value))))
            except ValueError:
                log.warning("ignoring a retry-after trailer that is not a number: %r", value)
        elif key == REQUEST_ID_KEY:
            headers["X-Request-Id"] = str(value)
    code = err.code()
    if code not in HTTP_STATUS:
        code = grpc.StatusCode.UNKNOWN
    return error_response(code, err.details() or code.name, headers)


def to_json(message: Message) -> dict[str, Any]:
    """Proto3's JSON mapping (lowerCamelCase names), fields at their defaults included
    so that a client reads 0 and false instead of a missing key."""
    return json_format.MessageToDict(message, always_print_fields_with_no_presence=True)


def metadata_of(request: web.Request) -> tuple[tuple[str, str], ...]:
    """The caller's credential and request id, as gRPC metadata."""
    return tuple(
        (name, value) for name in FORWARDED_HEADERS if (value := request.headers.get(name))
    )


def _query_value(field: FieldDescriptor, value: str) -> Any:
    """A query-string value as ParseDict reads it for ``field``: JSON parses numbers
    and booleans; anything else stays a string for ParseDict to judge."""
    if field.type == FieldDescriptor.TYPE_BOOL:
        return {"true": True, "false": False}.get(value, value)
    return value


class Gateway:
    """The aiohttp application forwarding the annotated RPCs of ``services`` to
    ``target``, the process's own gRPC listener."""

    def __init__(
        self,
        target: str,
        services: set[str],
        *,
        timeout_seconds: float,
        max_body_bytes: int,
    ) -> None:
        self._target = target
        self._timeout = timeout_seconds
        self._max_body = max_body_bytes
        self._bindings = [b for b in bindings() if b.service in services]
        self._channel: grpc.aio.Channel | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0
        #: Extra routes (chat completions, the page), added before start().
        self.extra_routes: list[web.RouteDef] = []

    @property
    def bindings(self) -> list[Binding]:
        return list(self._bindings)

    @property
    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            raise RuntimeError("the gateway is not started")
        return self._channel

    def unary(self, full_method: str, response: type[Message]) -> Any:
        """A unary callable of ``full_method`` on the gateway's channel."""
        return self.channel.unary_unary(
            full_method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response.FromString,
        )

    def stream(self, full_method: str, response: type[Message]) -> Any:
        """A server-streaming callable of ``full_method`` on the gateway's channel."""
        return self.channel.unary_stream(
            full_method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response.FromString,
        )

    @property
    def timeout(self) -> float:
        return self._timeout

    def application(self) -> web.Application:
        app = web.Application(client_max_size=self._max_body, middlewares=[_json_errors])
        for binding in self._bindings:
            handler = self._handler(binding)
            app.router.add_route(binding.verb.upper(), binding.path, handler)
        app.router.add_routes(self.extra_routes)
        return app

    async def start(self, host: str, port: int) -> int:
        limit = self._max_body * 2
        self._channel = grpc.aio.insecure_channel(
            self._target,
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
            ],
        )
        server_log = logging.getLogger("aiohttp.server")
        if _MALFORMED not in server_log.filters:
            server_log.addFilter(_MALFORMED)
        # A caller that disconnects cancels its handler, and with it the gRPC call
        # and the pipeline behind it; aiohttp would otherwise let the handler run
        # on until it next writes (never, for a unary call).
        self._runner = web.AppRunner(self.application(), access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_port=False)
        await site.start()
        # aiohttp exposes the bound port (port 0 asked) only on the site's server.
        server = site._server
        sockets = getattr(server, "sockets", None) or ()
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        log.info("HTTP gateway on %s:%d, forwarding to %s", host, self.port, self._target)
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    def _handler(self, binding: Binding) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        request_class = message_factory.GetMessageClass(binding.method.input_type)
        response_class = message_factory.GetMessageClass(binding.method.output_type)

        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                message = await self._request_message(request, binding, request_class)
            except BadRequest as exc:
                return error_response(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            metadata = metadata_of(request)
            if binding.streaming:
                call = self.stream(binding.full_method, response_class)(
                    message, metadata=metadata, timeout=self._timeout
                )
                return await stream_events(request, call, proto_events)
            try:
                reply = await self.unary(binding.full_method, response_class)(
                    message, metadata=metadata, timeout=self._timeout
                )
            except grpc.aio.AioRpcError as err:
                return rpc_error_response(err)
            return web.json_response(to_json(reply))

        return handle

    async def _request_message(
        self, request: web.Request, binding: Binding, request_class: type[Message]
    ) -> Message:
        fields = binding.method.input_type.fields_by_name
        data: dict[str, Any] = {}
        if binding.body == "*":
            raw = await request.read()
            if raw.strip():
                try:
                    parsed = json.loads(raw)
                except (ValueError, UnicodeDecodeError) as exc:
                    raise BadRequest(f"the request body is not JSON: {exc}") from exc
                if not isinstance(parsed, dict):
                    raise BadRequest(
                        f"the request body must be a JSON object ({binding.method.input_type.name})"
                    )
                data = parsed
        else:
            for name in set(request.query):
                field = _field_named(binding, name)
                if field is None:
                    raise BadRequest(
                        f"unknown query parameter {name!r} for {binding.verb.upper()} "
                        f"{binding.path}; known: {', '.join(sorted(fields))}"
                    )
                values = [_query_value(field, v) for v in request.query.getall(name)]
                if field.is_repeated:
                    data[name] = values
                else:
                    data[name] = values[-1]
        for variable in binding.path_variables:
            data[variable] = request.match_info[variable]
        message = request_class()
        try:
            json_format.ParseDict(data, message)
        except json_format.ParseError as exc:
            raise BadRequest(f"invalid {binding.method.input_type.name}: {exc}") from exc
        return message


def _field_named(binding: Binding, name: str) -> FieldDescriptor | None:
    for field in binding.method.input_type.fields:
        if name in (field.name, field.json_name):
            return field
    return None


def proto_events(message: Message) -> list[tuple[str | None, Any]]:
    """The event of a streamed message: named after its oneof case (``message``
    for a message without one), its JSON as the data."""
    name = "message"
    oneofs = message.DESCRIPTOR.oneofs
    if len(oneofs) == 1:
        name = message.WhichOneof(oneofs[0].name) or name
    return [(name, to_json(message))]


def sse(event: str | None, data: Any, sent_at: float | None = None) -> bytes:
    """One server-sent event; the JSON is on one line, so one ``data:`` line carries
    it. Without a name it is a plain ``message`` event (what OpenAI's streams send).
    ``sent_at`` (Unix seconds) goes first as a comment line, ``: sent-at 1765…``,
    which SSE clients skip: when the server wrote the event, for measuring what a
    client adds after it."""
    line = f"data: {json.dumps(data, separators=(',', ':'))}\n\n"
    text = line if event is None else f"event: {event}\n{line}"
    return (text if sent_at is None else f": sent-at {sent_at:.3f}\n{text}").encode()


async def stream_events(
    request: web.Request,
    call: Any,
    events: Callable[[Message], list[tuple[str | None, Any]]],
    done: bytes = b"",
) -> web.StreamResponse:
    """Relay a server stream as server-sent events (see the module's docstring).

    ``events`` makes the events (name, data) of each message; ``done``, if
    given, is written after the last message (the OpenAI-compatible stream
    ends with ``data: [DONE]``).
    """
    try:
        first = await call.read()
    except grpc.aio.AioRpcError as err:
        return rpc_error_response(err)
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            # Proxies that buffer (nginx) would hold the events back.
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    try:
        item = first
        while item is not grpc.aio.EOF:
            for event, data in events(item):
                await response.write(sse(event, data, time.time()))
            item = await call.read()
        if done:
            await response.write(done)
    except grpc.aio.AioRpcError as err:
        code = err.code() if err.code() in HTTP_STATUS else grpc.StatusCode.UNKNOWN
        await response.write(sse("error", error_body(code, err.details() or code.name)))
    except (ConnectionResetError, asyncio.CancelledError):
        # The client went away: stop the pipeline behind the stream.
        call.cancel()
        raise
    finally:
        if not call.done():
            call.cancel()
    await response.write_eof()
    return response


@web.middleware
async def _json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """aiohttp's own refusals (no such path, wrong verb, body too large) as JSON
    errors shaped like the forwarded ones."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _BY_HTTP_STATUS.get(exc.status, grpc.StatusCode.UNKNOWN)
        message = exc.text or exc.reason
        if exc.status == 404:
            message = f"no HTTP route {request.method} {request.path}; see /openapi.json"
        body = {"error": {"code": exc.status, "status": code.name, "message": message}}
        return web.json_response(body, status=exc.status, headers=_allow(exc))


def _allow(exc: web.HTTPException) -> dict[str, str]:
    allow = exc.headers.get("Allow")
    return {"Allow": allow} if allow else {}
