"""Failed calls to another service, as Attest errors: the one translator.

Every client of another Attest service (the public ``AnswerClient``, the
answer pipeline's backends, ingest's store writers and its store listing and
abstractive summaries, generate's re-search, the Celery tasks, the CLI
commands) turns a ``grpc.RpcError`` into an ``AttestError`` here, by one
table. A site only chooses whether it passes the callee's failure on as it is
(``from_rpc``) or serves a request of its own that degrades when a dependency
fails (``from_rpc(..., dependency=True)``), and may name the callee.

=================== ===================== =====================
status              ``from_rpc``          ``dependency=True``
=================== ===================== =====================
INVALID_ARGUMENT    InvalidArgument       InvalidArgument
DEADLINE_EXCEEDED   DeadlineExceeded      DeadlineExceeded
NOT_FOUND           NotFound              Unavailable
FAILED_PRECONDITION FailedPrecondition    Unavailable
RESOURCE_EXHAUSTED  ResourceExhausted     Unavailable
UNAVAILABLE         Unavailable           Unavailable
CANCELLED           Unavailable           Unavailable
UNAUTHENTICATED     Unauthenticated       Unavailable
PERMISSION_DENIED   PermissionDenied      Unavailable
any other           Internal              Unavailable
=================== ===================== =====================

* The message is the callee's details (its status name when it sent none).
  When the error's own code is not the status received, the status name
  stays in front ("RESOURCE_EXHAUSTED: ..."), so nothing the callee said is
  lost. A ``service`` goes in front of everything ("lexical: ...").
* RESOURCE_EXHAUSTED keeps the callee's ``retry-after`` trailer (seconds, as
  the server interceptor sends it) as ``ResourceExhausted.retry_after``.
* DEADLINE_EXCEEDED is always ``DeadlineExceeded``, never ``Unavailable``:
  the time budget (the caller's or the channel's cap) is spent, and the
  callee may be well. Callers that retry list both as transient.
* CANCELLED reaches a client when the server dropped the call (a shutdown
  past its grace): the service is going away, so ``Unavailable``.
* A dependency's failure is the caller's own fault only when it rejected the
  request's data (INVALID_ARGUMENT) or the request's time ran out
  (DEADLINE_EXCEEDED). Anything else, overload and rejected service
  credentials included, means the dependency cannot serve now: the caller
  skips that stage, says so, and never reports INTERNAL for it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from types import MappingProxyType
from typing import Any, Final

import grpc

from attest.core import errors
from attest.core.metadata import RETRY_AFTER_KEY

ERRORS: Final = MappingProxyType(
    {
        grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
        grpc.StatusCode.DEADLINE_EXCEEDED: errors.DeadlineExceeded,
        grpc.StatusCode.NOT_FOUND: errors.NotFound,
        grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
        grpc.StatusCode.RESOURCE_EXHAUSTED: errors.ResourceExhausted,
        grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
        grpc.StatusCode.CANCELLED: errors.Unavailable,
        grpc.StatusCode.UNAUTHENTICATED: errors.Unauthenticated,
        grpc.StatusCode.PERMISSION_DENIED: errors.PermissionDenied,
    }
)
# The statuses a dependency's caller passes on; every other one is Unavailable.
DEPENDENCY_PASSES_ON: Final = frozenset(
    {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.DEADLINE_EXCEEDED}
)


def from_rpc(
    err: grpc.RpcError, *, service: str | None = None, dependency: bool = False
) -> errors.AttestError:
    """The Attest error of a failed call (see the module's table).

    ``service`` names the callee in the message; ``dependency`` applies the
    right-hand column, for a caller that degrades when a dependency fails.
    Works for the errors of both the asyncio and the blocking stubs.
    """
    code = status_of(err)
    kind: type[errors.AttestError]
    if dependency and code not in DEPENDENCY_PASSES_ON:
        kind = errors.Unavailable
    else:
        kind = ERRORS.get(code, errors.Internal)
    message = _details(err) or code.name
    if kind.code != code.name:
        message = f"{code.name}: {message}"
    if service:
        message = f"{service}: {message}"
    if kind is errors.ResourceExhausted:
        return errors.ResourceExhausted(message, retry_after=retry_after(err))
    return kind(message)


def status_of(err: grpc.RpcError) -> grpc.StatusCode:
    """The status of a failed call; UNKNOWN when the error carries none."""
    code = _call(err, "code")
    return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.UNKNOWN


def retry_after(err: grpc.RpcError) -> float | None:
    """The ``retry-after`` trailer in seconds, when the callee sent a usable one."""
    trailers = _call(err, "trailing_metadata")
    if not isinstance(trailers, Iterable):
        return None
    for item in trailers:
        key, value = item[0], item[1]
        if key != RETRY_AFTER_KEY:
            continue
        try:
            seconds = float(value.decode() if isinstance(value, bytes) else value)
        except ValueError:
            return None
        return seconds if math.isfinite(seconds) and seconds >= 0 else None
    return None


def _details(err: grpc.RpcError) -> str:
    details = _call(err, "details")
    return details if isinstance(details, str) else ""


def _call(err: grpc.RpcError, method: str) -> Any:
    # grpc.RpcError declares no methods; the errors of real calls (AioRpcError,
    # the blocking stubs' errors, which are grpc.Call) have code, details and
    # trailing_metadata. A bare RpcError (raised by a test double) has none.
    fn = getattr(err, method, None)
    return fn() if callable(fn) else None
