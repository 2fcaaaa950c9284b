"""A response stream that grpc lets go of (its caller cancelled, or its deadline
passed while the stream waited to send) is closed later by the event loop, in a
context of its own. The interceptor must close it cleanly there: the handler's
stream ended, the call counted as cancelled, no error left unretrieved."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator
from typing import Any

from attest.answer.v1 import answer_pb2
from attest.core import metrics
from attest.core.context import request_id_var, tenant_var
from attest.core.interceptors import ServerInterceptor

METHOD = "/attest.answer.v1.AnswerService/AskStream"


class _Context:
    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-request-id", "stream-closed-elsewhere"),)

    def time_remaining(self) -> float | None:
        return None

    def set_trailing_metadata(self, _: Any) -> None:
        pass

    def code(self) -> None:
        return None


def _handled(code: str) -> float:
    return metrics.RPC_HANDLED.labels(METHOD, code)._value.get()


def test_a_stream_closed_from_another_context_ends_the_handler_and_counts_as_cancelled():
    async def run() -> tuple[list[int], bool, BaseException | None, str | None]:
        handler_ended = asyncio.Event()
        seen: list[int] = []

        async def handler(request: Any, context: Any) -> AsyncIterator[int]:
            try:
                for n in range(10):
                    yield n
            finally:
                handler_ended.set()

        behavior = ServerInterceptor(max_message_bytes=1 << 20)._wrap_stream(
            METHOD, handler, unary_request=True
        )
        stream = behavior(answer_pb2.AskStreamRequest(question="q"), _Context())
        seen.append(await stream.__anext__())
        seen.append(await stream.__anext__())
        inside = request_id_var.get()
        # What the loop does with an async generator nobody iterates any more.
        closing = asyncio.get_running_loop().create_task(
            stream.aclose(), context=contextvars.Context()
        )
        await asyncio.wait([closing])
        return seen, handler_ended.is_set(), closing.exception(), inside

    before_cancelled, before_ok = _handled("CANCELLED"), _handled("OK")
    tenant_before = tenant_var.get()
    seen, ended, error, inside = asyncio.run(run())
    assert seen == [0, 1]
    assert inside == "stream-closed-elsewhere"
    assert error is None
    assert ended, "the handler's stream was left for the garbage collector"
    assert _handled("CANCELLED") == before_cancelled + 1
    assert _handled("OK") == before_ok
    assert tenant_var.get() == tenant_before
