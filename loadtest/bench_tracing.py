"""Per-call cost of the tracing code on the RPC path, with tracing off (no endpoint).

Times, in one process and without sockets, the three places every call goes
through: the server interceptor's per-RPC scope (request id, contextvars,
metrics and the SERVER span), the client interceptor's unary call around a
continuation that answers at once (the CLIENT span), and the metadata merge
of every outgoing call (the trace context). Prints the median of ``--repeat``
runs of ``--number`` calls each, in microseconds per call.

    OTEL_SDK_DISABLED=true python loadtest/bench_tracing.py [--number 20000] [--repeat 7]

This is a benchmark command, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import grpc

from attest.core import tracing
from attest.core.channels import _merge_metadata, _Token, _UnaryUnary
from attest.core.interceptors import ServerInterceptor
from attest.core.settings import ClientIdentity

METHOD = "/attest.answer.v1.AnswerService/Get"


class _Context:
    """The parts of a ServicerContext the interceptor's scope reads."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-request-id", "bench-1"),)

    def time_remaining(self) -> float | None:
        return None

    def set_trailing_metadata(self, _: Any) -> None:
        pass


def _server(number: int) -> float:
    interceptor = ServerInterceptor(max_message_bytes=1 << 20)
    context: Any = _Context()
    started = time.perf_counter()
    for _ in range(number):
        with interceptor._scope(METHOD, context):
            pass
    return time.perf_counter() - started


def _client(number: int) -> float:
    interceptor = _UnaryUnary(5.0, _Token(ClientIdentity()))
    details = grpc.aio.ClientCallDetails(METHOD, None, None, None, None)

    async def continuation(_details: Any, _request: Any) -> str:
        return "call"

    async def run() -> float:
        started = time.perf_counter()
        for _ in range(number):
            await interceptor.intercept_unary_unary(continuation, details, None)
        return time.perf_counter() - started

    return asyncio.run(run())


def _merge(number: int) -> float:
    started = time.perf_counter()
    for _ in range(number):
        _merge_metadata(None, None)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    result: dict[str, Any] = {"tracing_configured": tracing.configure("bench")}
    for name, timed in (("server_scope", _server), ("client_unary", _client), ("merge", _merge)):
        timed(1000)  # warm-up
        runs = [timed(args.number) / args.number * 1e6 for _ in range(args.repeat)]
        result[f"{name}_us"] = round(statistics.median(runs), 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
