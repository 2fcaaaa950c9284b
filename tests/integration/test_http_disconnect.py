"""A caller that goes away stops the work behind its HTTP request: the gateway
cancels the gRPC call, so the answer pipeline is not left running for no one.

The gateway forwards to a stand-in AnswerService whose calls wait until they
are cancelled, so the test sees exactly when (and whether) the cancellation
reaches the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest

from attest.answer.http.gateway import Gateway
from attest.answer.v1 import answer_pb2, answer_pb2_grpc

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SERVICE = "attest.answer.v1.AnswerService"


class Stalling(answer_pb2_grpc.AnswerServiceServicer):
    """Ask waits; AskStream sends its retrieval event, then waits; each records
    its cancellation."""

    def __init__(self) -> None:
        self.started = {"Ask": asyncio.Event(), "AskStream": asyncio.Event()}
        self.cancelled = {"Ask": asyncio.Event(), "AskStream": asyncio.Event()}

    async def _stall(self, name: str) -> None:
        self.started[name].set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled[name].set()
            raise

    async def Ask(self, request: Any, context: Any) -> answer_pb2.AskResponse:
        await self._stall("Ask")
        return answer_pb2.AskResponse()

    async def AskStream(
        self, request: Any, context: Any
    ) -> AsyncIterator[answer_pb2.AskStreamResponse]:
        yield answer_pb2.AskStreamResponse(retrieval=answer_pb2.RetrievalDone())
        await self._stall("AskStream")


async def _serving(servicer: Stalling) -> tuple[grpc.aio.Server, Gateway]:
    server = grpc.aio.server()
    answer_pb2_grpc.add_AnswerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    gateway = Gateway(f"127.0.0.1:{port}", {SERVICE}, timeout_seconds=60, max_body_bytes=1 << 20)
    await gateway.start("127.0.0.1", 0)
    return server, gateway


async def test_a_client_leaving_a_stream_cancels_the_pipeline() -> None:
    servicer = Stalling()
    server, gateway = await _serving(servicer)
    try:
        async with aiohttp.ClientSession() as session:
            reply = await session.post(
                f"http://127.0.0.1:{gateway.port}/v1/ask:stream", json={"question": "q?"}
            )
            assert reply.status == 200
            first = await reply.content.readuntil(b"\n\n")
            assert b"event: retrieval" in first
            await asyncio.wait_for(servicer.started["AskStream"].wait(), 10)
            reply.close()  # the caller goes away between two events
        await asyncio.wait_for(servicer.cancelled["AskStream"].wait(), 10)
    finally:
        await gateway.stop()
        await server.stop(None)


async def test_a_client_leaving_an_unanswered_ask_cancels_the_pipeline() -> None:
    servicer = Stalling()
    server, gateway = await _serving(servicer)
    try:
        async with aiohttp.ClientSession() as session:
            request = asyncio.ensure_future(
                session.post(f"http://127.0.0.1:{gateway.port}/v1/ask", json={"question": "q?"})
            )
            await asyncio.wait_for(servicer.started["Ask"].wait(), 10)
            request.cancel()  # the caller gives up before the answer
            with pytest.raises(asyncio.CancelledError):
                await request
        await asyncio.wait_for(servicer.cancelled["Ask"].wait(), 10)
    finally:
        await gateway.stop()
        await server.stop(None)
