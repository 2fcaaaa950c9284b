"""Protocol-level fake LLM servers: real aiohttp HTTP servers on loopback.

Both speak ``POST /v1/chat/completions`` (``choices``): ``FakeLLM("tgi")`` as
TGI's Messages API does, errors as ``{"error", "error_type"}`` with 422
validation / 429 overloaded; ``FakeLLM("openai")`` with errors as
``{"error": {"message", "type"}}``. Replies come from a script
(one per request, in order) and then from a responder that sees the prompt,
so a test drives every step of the pipeline: text, malformed output, errors,
delays and overload. A request with ``stream: true`` gets server-sent events,
one per word of the reply (``piece_delay`` apart), then ``[DONE]``, as
llama.cpp, vLLM and TGI send them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

Flavor = Literal["tgi", "openai"]


@dataclass
class Reply:
    text: str = ""
    status: int = 200
    error_type: str = ""  # "overloaded", "validation", ...
    delay: float = 0.0
    retry_after: float | None = None
    raw: Any = None  # a body sent as is (wrong shapes)
    finish_reason: str = "stop"  # "length": cut off at the token limit
    piece_delay: float = 0.0  # streamed replies: seconds between pieces
    fail_after: int | None = None  # streamed replies: an error event after this many pieces
    # Streamed replies: end the stream cleanly with no text and no finish reason,
    # as llama-cpp-python's server does with a reply another request interrupted.
    dropped: bool = False


@dataclass
class Request:
    payload: dict[str, Any]
    system: str
    prompt: str


Responder = Callable[[str], "Reply | str"]


class FakeLLM:
    def __init__(self, flavor: Flavor, responder: Responder | None = None) -> None:
        self.flavor = flavor
        self.script: list[Reply] = []
        self.responder = responder or (lambda prompt: "ok")
        self.requests: list[Request] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._runner: web.AppRunner | None = None
        self.url = ""
        # Streamed replies: the loop time at which each piece was sent.
        self.pieces_sent: list[float] = []

    async def start(self) -> FakeLLM:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def prompts(self, containing: str = "") -> list[str]:
        return [r.prompt for r in self.requests if containing in r.prompt]

    async def _reply(self, system: str, prompt: str, payload: dict[str, Any]) -> Reply:
        self.requests.append(Request(payload, system, prompt))
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            reply = self.script.pop(0) if self.script else self.responder(prompt)
            if isinstance(reply, str):
                reply = Reply(text=reply)
            if reply.delay:
                await asyncio.sleep(reply.delay)
            return reply
        finally:
            self.in_flight -= 1

    @staticmethod
    def _headers(reply: Reply) -> dict[str, str]:
        return {"Retry-After": str(reply.retry_after)} if reply.retry_after is not None else {}

    def _error(self, reply: Reply) -> web.Response:
        body: dict[str, Any]
        if self.flavor == "tgi":
            body = {"error": reply.text or "failed", "error_type": reply.error_type}
        else:
            body = {"error": {"message": reply.text or "failed", "type": reply.error_type}}
        return web.json_response(body, status=reply.status, headers=self._headers(reply))

    async def _stream(self, request: web.Request, reply: Reply) -> web.StreamResponse:
        return await _send_events(request, reply, self.pieces_sent)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        messages = payload["messages"]
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        prompt = next(m["content"] for m in messages if m["role"] == "user")
        reply = await self._reply(system, prompt, payload)
        if reply.raw is not None:
            return web.json_response(reply.raw, status=reply.status)
        if reply.status >= 400:
            return self._error(reply)
        if payload.get("stream"):
            return await self._stream(request, reply)
        return web.json_response(
            {
                "id": "fake",
                "object": "chat.completion",
                "model": payload.get("model", ""),
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": reply.text},
                        "finish_reason": reply.finish_reason,
                    }
                ],
                "usage": {
                    "prompt_tokens": len(prompt.split()),
                    "completion_tokens": len(reply.text.split()),
                },
            }
        )


async def _send_events(request: web.Request, reply: Reply, sent: list[float]) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    loop = asyncio.get_running_loop()
    if reply.dropped:
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response
    words = reply.text.split(" ")
    for i, word in enumerate(words):
        if i == reply.fail_after:
            error = {"error": {"message": "the model crashed", "type": "server_error"}}
            await response.write(f"data: {json.dumps(error)}\n\n".encode())
            await response.write_eof()
            return response
        piece = word if i == len(words) - 1 else word + " "
        chunk = {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]}
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        sent.append(loop.time())
        if reply.piece_delay:
            await asyncio.sleep(reply.piece_delay)
    end = {"choices": [{"index": 0, "delta": {}, "finish_reason": reply.finish_reason}]}
    await response.write(f"data: {json.dumps(end)}\n\ndata: [DONE]\n\n".encode())
    await response.write_eof()
    return response


def cite_json(*items: tuple[int, Any, Any]) -> str:
    """A citation reply: (sentence number, source number, confidence) triples."""
    return json.dumps(
        {
            "citations": [
                {"sentence": s, "source": src, "confidence": c, "quote": "q"} for s, src, c in items
            ]
        }
    )
