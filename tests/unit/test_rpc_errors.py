"""The one translator of failed calls (attest.core.rpc_errors): its table, its
message and retry-after rules, and the sites that use it."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from attest.answer import downstream
from attest.core import errors
from attest.core.rpc_errors import from_rpc, retry_after, status_of
from attest.core.settings import ClientSettings
from attest.ingest import sinks
from attest.ingest.jobs import TRANSIENT as INGEST_TRANSIENT
from attest.ingest.listing import ServiceListing, StoreUnreachable
from attest.pipeline.tasks import TRANSIENT as TASK_TRANSIENT

S = grpc.StatusCode


def failed(
    code: grpc.StatusCode, details: str = "why", trailers: tuple[tuple[str, str], ...] = ()
) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailers), details=details
    )


# The table as the module's docstring states it, written out here on purpose.
TABLE = [
    (S.INVALID_ARGUMENT, errors.InvalidArgument, errors.InvalidArgument),
    (S.DEADLINE_EXCEEDED, errors.DeadlineExceeded, errors.DeadlineExceeded),
    (S.NOT_FOUND, errors.NotFound, errors.Unavailable),
    (S.FAILED_PRECONDITION, errors.FailedPrecondition, errors.Unavailable),
    (S.RESOURCE_EXHAUSTED, errors.ResourceExhausted, errors.Unavailable),
    (S.UNAVAILABLE, errors.Unavailable, errors.Unavailable),
    (S.CANCELLED, errors.Unavailable, errors.Unavailable),
    (S.UNAUTHENTICATED, errors.Unauthenticated, errors.Unavailable),
    (S.PERMISSION_DENIED, errors.PermissionDenied, errors.Unavailable),
    (S.UNKNOWN, errors.Internal, errors.Unavailable),
    (S.INTERNAL, errors.Internal, errors.Unavailable),
    (S.UNIMPLEMENTED, errors.Internal, errors.Unavailable),
    (S.DATA_LOSS, errors.Internal, errors.Unavailable),
    (S.ABORTED, errors.Internal, errors.Unavailable),
    (S.OUT_OF_RANGE, errors.Internal, errors.Unavailable),
    (S.ALREADY_EXISTS, errors.Internal, errors.Unavailable),
]


def test_the_table_covers_every_failure_status() -> None:
    assert {code for code, _, _ in TABLE} == set(S) - {S.OK}


@pytest.mark.parametrize(("code", "kind", "as_dependency"), TABLE)
def test_each_status_becomes_its_error(
    code: grpc.StatusCode, kind: type[errors.AttestError], as_dependency: type
) -> None:
    got = from_rpc(failed(code))
    assert type(got) is kind
    dep = from_rpc(failed(code), dependency=True)
    assert type(dep) is as_dependency
    # Nothing a dependency says makes its caller answer INTERNAL.
    assert not isinstance(dep, errors.Internal)


def test_message_keeps_details_and_names_a_status_the_error_does_not_say() -> None:
    assert from_rpc(failed(S.UNAVAILABLE, "connection refused")).message == "connection refused"
    # No details: the status name stands in.
    assert from_rpc(failed(S.UNAVAILABLE, "")).message == "UNAVAILABLE"
    # Internal from UNKNOWN, Unavailable from RESOURCE_EXHAUSTED: the status stays readable.
    assert from_rpc(failed(S.UNKNOWN, "boom")).message == "UNKNOWN: boom"
    dep = from_rpc(failed(S.RESOURCE_EXHAUSTED, "at capacity"), service="rerank", dependency=True)
    assert dep.message == "rerank: RESOURCE_EXHAUSTED: at capacity"
    assert dep.details == dep.message
    # A named callee goes in front; the field is not set (it was the callee's request's).
    bad = from_rpc(failed(S.INVALID_ARGUMENT, "filters[0]: unknown"), service="knowledge")
    assert bad.message == "knowledge: filters[0]: unknown"
    assert bad.field is None
    assert bad.code == "INVALID_ARGUMENT"


@pytest.mark.parametrize(
    ("trailer", "seconds"),
    [("1.500", 1.5), ("0.001", 0.001), ("0", 0.0), ("soon", None), ("-1", None), ("inf", None)],
)
def test_resource_exhausted_keeps_the_retry_after_trailer(trailer: str, seconds: float | None):
    # The server interceptor writes retry-after as seconds with three decimals.
    err = failed(S.RESOURCE_EXHAUSTED, "over quota", (("retry-after", trailer),))
    got = from_rpc(err)
    assert isinstance(got, errors.ResourceExhausted)
    assert got.retry_after == seconds
    assert retry_after(err) == seconds


def test_no_trailer_no_retry_after() -> None:
    got = from_rpc(failed(S.RESOURCE_EXHAUSTED, "busy", (("other", "1"),)))
    assert isinstance(got, errors.ResourceExhausted)
    assert got.retry_after is None


class BlockingCallError(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """Shaped like the errors of the blocking stubs (an RpcError that is a Call)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Any:
        return (("retry-after", "2.000"),)

    def initial_metadata(self) -> Any:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Any) -> bool:
        return False


def test_errors_of_blocking_stubs_and_bare_rpc_errors() -> None:
    got = from_rpc(BlockingCallError(S.RESOURCE_EXHAUSTED, "later"), service="generate")
    assert isinstance(got, errors.ResourceExhausted)
    assert (got.message, got.retry_after) == ("generate: later", 2.0)
    bare = grpc.RpcError()
    assert status_of(bare) is S.UNKNOWN
    assert type(from_rpc(bare)) is errors.Internal
    assert from_rpc(bare).message == "UNKNOWN: UNKNOWN"


async def _raise(err: BaseException) -> None:
    raise err


# -- the sites ---------------------------------------------------------------------------


async def test_answer_backends_degrade_on_anything_but_bad_input_or_time() -> None:
    with pytest.raises(errors.Unavailable) as shed:
        await downstream._call("rerank", _raise(failed(S.RESOURCE_EXHAUSTED, "at capacity")))
    assert shed.value.message == "rerank: RESOURCE_EXHAUSTED: at capacity"
    with pytest.raises(errors.Unavailable):
        await downstream._call("lexical", _raise(failed(S.INTERNAL, "internal error")))
    with pytest.raises(errors.DeadlineExceeded) as late:
        await downstream._call("semantic", _raise(failed(S.DEADLINE_EXCEEDED, "Deadline Exceeded")))
    assert late.value.message == "semantic: Deadline Exceeded"
    with pytest.raises(errors.InvalidArgument) as bad:
        await downstream._call("knowledge", _raise(failed(S.INVALID_ARGUMENT, "entity: unknown")))
    assert bad.value.message == "knowledge: entity: unknown"


@pytest.mark.parametrize(
    ("code", "kind", "transient"),
    [
        (S.UNAVAILABLE, errors.Unavailable, True),
        # Was Unavailable before the one translator; still retried.
        (S.DEADLINE_EXCEEDED, errors.DeadlineExceeded, True),
        (S.RESOURCE_EXHAUSTED, errors.ResourceExhausted, True),
        (S.INVALID_ARGUMENT, errors.InvalidArgument, False),
        (S.INTERNAL, errors.Internal, False),
    ],
)
async def test_ingest_writers_and_tasks_retry_what_a_later_attempt_can_fix(
    code: grpc.StatusCode, kind: type, transient: bool
) -> None:
    with pytest.raises(errors.AttestError) as info:
        await sinks._call("lexical", lambda: _raise(failed(code, "x")))
    assert type(info.value) is kind
    assert info.value.message.startswith("lexical: ")
    assert isinstance(info.value, INGEST_TRANSIENT) is transient
    assert isinstance(info.value, TASK_TRANSIENT) is transient


async def test_store_listing_reports_the_store_unreachable() -> None:
    # Channels connect on first use: nothing here opens a socket.
    listing = ServiceListing("127.0.0.1:1", "127.0.0.1:1", ClientSettings())
    with pytest.raises(StoreUnreachable) as info:
        await listing._rpc("vectors", lambda: _raise(failed(S.UNAVAILABLE, "connection refused")))
    assert info.value.store == "vectors"
    assert info.value.message == "vectors: connection refused"
    with pytest.raises(StoreUnreachable) as busy:
        await listing._rpc("lexical", lambda: _raise(failed(S.RESOURCE_EXHAUSTED, "shed")))
    assert busy.value.message == "lexical: RESOURCE_EXHAUSTED: shed"
    await listing.close()


@pytest.mark.parametrize("seconds", [0.0, -2.0, 0.0004, 1.5, 12.3456])
def test_a_written_retry_after_reads_back_as_a_positive_wait(seconds: float) -> None:
    from attest.core.metadata import retry_after_trailer

    key, value = retry_after_trailer(seconds)
    assert key == "retry-after"
    # Never 0 ("at once") and never negative: at least a millisecond, else rounded.
    expected = max(round(seconds, 3), 0.001)
    assert retry_after(failed(S.RESOURCE_EXHAUSTED, "busy", ((key, value),))) == expected
