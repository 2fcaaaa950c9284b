"""The one server interceptor: identity, quotas, context, errors, size limit, metrics.

A method with a load-shedding check (``shedders``: the answer service's Ask
while its admission is full) is refused with RESOURCE_EXHAUSTED before
anything below is done for the call. For every other RPC it sets the request
id, tenant and deadline contextvars,
authenticates the caller and checks the method's scope (``Guard``; the
tenant comes from the credential, never from the request), applies the
tenant's quotas, checks the request size, counts and times the call, and
maps exceptions to status codes: an ``AttestError`` becomes its own code and
message; anything else becomes INTERNAL with a generic message (details go
to the log, never to the caller), so no RPC ever ends with UNKNOWN.

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
import contextvars
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any

import grpc
from google.protobuf.message import Message

from attest.core import metrics, tracing
from attest.core.audit import AUDITED, MAX_IDS, AuditLog, AuditRecord
from attest.core.auth import (
    DEV_IDENTITY,
    Authenticator,
    Identity,
    Surface,
    authorize,
    check_one_credential,
    required_scope,
    tenant_for,
)
from attest.core.context import (
    DEFAULT_TENANT,
    deadline_var,
    granted_var,
    identity_var,
    new_request_id,
    request_id_var,
    tenant_var,
)
from attest.core.errors import AttestError, InvalidArgument, ResourceExhausted
from attest.core.metadata import REQUEST_ID_KEY, TENANT_KEY, retry_after_trailer
from attest.core.quota import UNAUTHENTICATED, WATCH_METHODS, TenantQuotas
from attest.core.validation import is_valid_request_id

log = logging.getLogger(__name__)

_INTERNAL_MESSAGE = "internal error; see the server log for the request id"

Handler = Callable[..., Any]
Deserializer = Callable[[bytes], Any]

# Stands in for the SERVER span while tracing is off (reusable: it holds no state).
_NO_SPAN: contextlib.nullcontext[None] = contextlib.nullcontext()


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


def _nothing() -> None:
    return None


_ANONYMOUS = Identity("anonymous", DEFAULT_TENANT, frozenset(), "dev")


class Guard:
    """Who may call what on one listener, as which tenant, within which quotas.

    Without an authenticator (``--insecure-dev``, loopback only) every caller
    is tenant ``default`` with every scope. Quotas count public calls only:
    internal ones are already counted where they entered.
    """

    def __init__(
        self,
        *,
        surface: Surface,
        authenticator: Authenticator | None,
        quotas: TenantQuotas | None = None,
        verified_peers: bool = False,
    ) -> None:
        self.surface = surface
        self._authenticator = authenticator
        self._quotas = quotas if quotas is not None and quotas.enabled else None
        self._verified_peers = verified_peers

    async def admit(
        self, method: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Callable[[], None]:
        """Set the caller and tenant of this call; returns the quota release."""
        pairs = tuple(context.invocation_metadata() or ())
        metadata = dict(pairs)
        scope = required_scope(method)
        if scope is None:
            identity = _ANONYMOUS
        elif self._authenticator is None:
            identity = DEV_IDENTITY
        else:
            peers = _peer_names(context) if self._verified_peers else None
            check_one_credential(pairs)
            identity = await self._authenticator.identify(metadata, peers)
            # Known before it is authorized: a refusal is recorded against the
            # caller (attest.core.audit).
            identity_var.set(identity)
            tenant_var.set(identity.tenant)
            authorize(identity, method)
        tenant = tenant_for(identity, metadata)
        identity_var.set(identity)
        tenant_var.set(tenant)
        if self._quotas is None or self.surface != "public":
            return _nothing
        if scope is None:
            # Health needs no credential; its Watch still holds a call.
            return self._quotas.watch(UNAUTHENTICATED) if method in WATCH_METHODS else _nothing
        return self._quotas.admit(tenant, method)


def _peer_names(context: grpc.aio.ServicerContext[Any, Any]) -> list[str]:
    """Names of the client certificate the TLS handshake verified (mTLS)."""
    auth = context.auth_context() or {}
    names = list(auth.get("x509_common_name", ())) + list(
        auth.get("x509_subject_alternative_name", ())
    )
    return [n.decode("utf-8", "replace") if isinstance(n, bytes) else str(n) for n in names]


class ThrottledFailureLog:
    """Logs a caller's error (INFO) at most once per ``interval`` for each method and code.

    A burst that is shed, or a client that keeps sending the same bad
    request, would otherwise write a line per call: at 128 calls arriving at
    once a JSON line each was a third of the server's work per refused call,
    and the log shipper's load grows with the overload it reports. The lines
    left out are counted in the next one of the same method and code; every
    call is still counted in the RPC metrics and carries its request id to
    the caller.
    """

    def __init__(self, interval: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._interval = interval
        self._clock = clock
        self._next: dict[tuple[str, str], float] = {}
        self._skipped: dict[tuple[str, str], int] = {}

    def log(self, method: str, code: str, details: str) -> bool:
        """Log this failure unless one like it was logged within the interval; True if logged."""
        key = (method, code)
        now = self._clock()
        if now < self._next.get(key, float("-inf")):
            self._skipped[key] = self._skipped.get(key, 0) + 1
            return False
        self._next[key] = now + self._interval
        skipped = self._skipped.pop(key, 0)
        if skipped:
            log.info(
                "%s failed: %s %s (%d more %s since the last line)",
                method, code, details, skipped, code,
            )  # fmt: skip
        else:
            log.info("%s failed: %s %s", method, code, details)
        return True


def _restore(*pairs: tuple[contextvars.ContextVar[Any], contextvars.Token[Any]]) -> None:
    """Reset each variable to its value before the call. A stream that grpc let
    go of is closed later by the event loop, in a context of its own where these
    tokens were never set: there is nothing of the call's to undo there."""
    for var, token in pairs:
        with contextlib.suppress(ValueError):
            var.reset(token)


#: A method's load-shedding check: the refusal a call arriving now gets, or None.
Shedder = Callable[[], ResourceExhausted | None]


class ServerInterceptor(grpc.aio.ServerInterceptor):
    """See the module docstring. ``shedders`` maps a full method name
    (``/pkg.Service/Method``) to its load-shedding check: while it returns a
    refusal, a call of that method is refused with it before anything else is
    done for the call (no decoding, no authentication, no handler), the
    cheapest answer a server at capacity can give a burst."""

    def __init__(
        self,
        *,
        max_message_bytes: int,
        guard: Guard | None = None,
        shedders: Mapping[str, Shedder] | None = None,
        service_message_bytes: Mapping[str, int] | None = None,
        audit: AuditLog | None = None,
    ) -> None:
        self._max_message_bytes = max_message_bytes
        # Writes and deletes are recorded when they end (attest.core.audit).
        self._audit = audit
        # Full service name -> its own request-size limit (the others: the default).
        self._service_message_bytes = dict(service_message_bytes or {})
        self._guard = guard or Guard(surface="public", authenticator=None)
        self._failures = ThrottledFailureLog()
        self._shedders = dict(shedders or {})
        # method -> (the handler it wrapped, the wrapped handler)
        self._wrapped: dict[
            str, tuple[grpc.RpcMethodHandler[Any, Any], grpc.RpcMethodHandler[Any, Any]]
        ] = {}

    def _limit(self, method: str) -> int:
        """The request-size limit of ``/package.Service/Method``."""
        service = method.split("/")[1] if method.count("/") >= 2 else ""
        return self._service_message_bytes.get(service, self._max_message_bytes)

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
        shedder = self._shedders.get(method)
        if shedder is not None:
            refusal = shedder()
            if refusal is not None:
                return self._refusing(method, handler, refusal)
        # The wrapping depends on the method's handler only: made once per method.
        wrapped = self._wrapped.get(method)
        if wrapped is None or wrapped[0] is not handler:
            wrapped = (handler, self._wrap(method, handler))
            self._wrapped[method] = wrapped
        return wrapped[1]

    def _refusing(
        self,
        method: str,
        handler: grpc.RpcMethodHandler[Any, Any],
        refusal: ResourceExhausted,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        """A handler that refuses the call with ``refusal`` and does nothing else.

        The request is left undecoded and the caller unidentified (so a call
        that would fail authentication or validation is refused too, as
        retryable). The refusal carries the request id and the ``retry-after``
        trailer as any other, is counted in the RPC metrics (not in the
        latency histogram) and logged as the caller's errors are (at most once
        a second per method and code), and gets no trace span. It returns
        instead of aborting: an exception is more work than a status set on
        the context.
        """

        async def refuse(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
            request_id = _request_id(dict(context.invocation_metadata() or ()))
            trailers: tuple[tuple[str, str], ...] = ((REQUEST_ID_KEY, request_id),)
            if refusal.retry_after is not None:
                trailers += (retry_after_trailer(refusal.retry_after),)
            context.set_trailing_metadata(trailers)
            context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
            context.set_details(refusal.details)
            token = request_id_var.set(request_id)
            try:
                self._failures.log(method, refusal.code, refusal.details)
            finally:
                request_id_var.reset(token)
            # Counted, not timed: its microseconds would pull the method's
            # latency histogram towards zero just when the service is full.
            metrics.for_method(method).started.inc()
            metrics.RPC_HANDLED.labels(method, refusal.code).inc()

        if handler.unary_unary or handler.stream_unary:
            make = (
                grpc.unary_unary_rpc_method_handler
                if handler.unary_unary
                else grpc.stream_unary_rpc_method_handler
            )
        else:
            # A stream of responses: the coroutine form (as grpc's reader/writer
            # API) sends none and ends the call with the context's status.
            make = (
                grpc.unary_stream_rpc_method_handler
                if handler.unary_stream
                else grpc.stream_stream_rpc_method_handler
            )
        return make(
            refuse, request_deserializer=None, response_serializer=handler.response_serializer
        )

    def _wrap(
        self, method: str, handler: grpc.RpcMethodHandler[Any, Any]
    ) -> grpc.RpcMethodHandler[Any, Any]:
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
        audited = AUDITED.get(method) if self._audit is not None else None

        async def behavior(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            with self._scope(method, context) as outcome:
                release = _nothing
                result: Any = None
                failure = ""
                try:
                    try:
                        release = await self._guard.admit(method, context)
                        if unary_request:
                            request = _checked(request, self._limit(method))
                        else:
                            request = _decoded(request)
                        result = await inner(request, context)
                    except Exception as exc:  # noqa: BLE001 - mapped, never swallowed
                        failure = str(getattr(exc, "details", "") or "")
                        await self._abort(method, context, exc, outcome)
                    finally:
                        release()
                    outcome[0] = _final_code(context)
                    return result
                finally:
                    if audited is not None:
                        record = self._record(
                            audited, request, result, outcome[0], failure, context
                        )
                        if record is not None:
                            await self._write(record)

        return behavior

    def _record(
        self,
        audited: tuple[str, Callable[[Any], list[str]]],
        request: Any,
        result: Any,
        outcome: str,
        failure: str,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AuditRecord | None:
        """The audit record of a call that ended (None, logged, if it cannot be made)."""
        action, ids_of = audited
        try:
            identity = identity_var.get()
            tenant = tenant_var.get() if identity is not None else ""
            named = dict(context.invocation_metadata() or ()).get(TENANT_KEY)
            try:
                ids = ids_of(request) if isinstance(request, Message) else []
            except Exception:  # noqa: BLE001 - a request the method refused
                ids = []
            job = getattr(getattr(result, "job", None), "job_id", "")
            if job:
                failure = f"job {job}"
            elif getattr(request, "dry_run", False):
                failure = f"dry run {failure}".strip()
            return AuditRecord(
                at=time.time(),
                tenant=tenant,
                identity=identity.subject if identity is not None else "",
                action=action,
                outcome=outcome,
                ids=tuple(ids[:MAX_IDS]),
                id_count=len(ids),
                detail=failure[:200],
                named_tenant=str(named) if named and str(named) != tenant else "",
                request_id=request_id_var.get() or "",
            )
        except Exception:
            log.exception("the audit record of a %s could not be made", action)
            return None

    async def _write(self, record: AuditRecord) -> None:
        """Write off the event loop; a failure is logged, never the call's."""
        assert self._audit is not None
        try:
            await asyncio.to_thread(self._audit.record, record)
        except Exception:
            log.exception("the audit record of a %s could not be written", record.action)

    def _wrap_stream(self, method: str, inner: Handler, *, unary_request: bool) -> Handler:
        async def behavior(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            with self._scope(method, context) as outcome:
                release = _nothing
                try:
                    release = await self._guard.admit(method, context)
                    if unary_request:
                        request = _checked(request, self._limit(method))
                    else:
                        request = _decoded(request)
                    responses = inner(request, context)
                    if inspect.isawaitable(responses):
                        # A handler on the reader/writer API (grpc's health Watch)
                        # sends with context.write and returns nothing.
                        await responses
                    else:
                        # Closed with this call however it ends: an abandoned
                        # call ends the handler's stream (and what it holds) now,
                        # not when the collector finds it.
                        async with contextlib.aclosing(responses) as stream:
                            async for item in stream:
                                yield item
                except Exception as exc:  # noqa: BLE001 - mapped, never swallowed
                    await self._abort(method, context, exc, outcome)
                finally:
                    release()
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
            # Until the guard has identified the caller, no tenant but the default.
            tenant_var.set(DEFAULT_TENANT),
            identity_var.set(None),
            deadline_var.set(None if remaining is None else time.monotonic() + remaining),
            granted_var.set(remaining),
        )
        context.set_trailing_metadata(((REQUEST_ID_KEY, request_id),))
        outcome = ["OK"]
        started = time.perf_counter()
        per_method = metrics.for_method(method)
        per_method.started.inc()
        per_method.in_flight.inc()
        traced = tracing.enabled()
        try:
            with tracing.server_span(method, metadata) if traced else _NO_SPAN as span:
                try:
                    yield outcome
                except (asyncio.CancelledError, GeneratorExit):
                    # GeneratorExit: grpc let go of a stream whose caller went away
                    # (cancelled, or past its deadline) while it waited to send.
                    outcome[0] = "CANCELLED"
                    raise
                finally:
                    if span is not None:
                        tracing.end_server_span(span, outcome[0], request_id, tenant_var.get())
        finally:
            per_method.in_flight.dec()
            metrics.RPC_HANDLED.labels(method, outcome[0]).inc()
            per_method.latency.observe(time.perf_counter() - started)
            _restore(
                (request_id_var, tokens[0]),
                (tenant_var, tokens[1]),
                (identity_var, tokens[2]),
                (deadline_var, tokens[3]),
                (granted_var, tokens[4]),
            )

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
        if isinstance(exc, ResourceExhausted) and exc.retry_after is not None:
            context.set_trailing_metadata(
                (
                    (REQUEST_ID_KEY, request_id_var.get() or ""),
                    retry_after_trailer(exc.retry_after),
                )
            )
        if isinstance(exc, AttestError):
            code = status_code(exc)
            if code == grpc.StatusCode.INTERNAL:
                log.warning("%s failed: %s %s", method, exc.code, exc.details)
            else:
                self._failures.log(method, exc.code, exc.details)
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
