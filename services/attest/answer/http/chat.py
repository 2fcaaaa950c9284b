"""OpenAI-compatible chat completions over Ask and AskStream.

``POST /v1/chat/completions``: the last ``user`` message is the question (the
earlier ones are not used: every answer is grounded afresh in the corpus).
The reply's content is the answer text, each sentence followed by markers
``[n]`` where n is the cited source's position in the answer's source list
plus one. What OpenAI's format has no place for travels in an ``attest``
object: on the response, the citations (source id, title, page, quote, 0-10
confidence), the sources, the revisions and whether the answer abstained; on
each streamed chunk, the event it came from. Options of Ask may be sent in an
``attest`` object of the request (AskOptions' JSON).

``GET /v1/models`` lists the one model, ``attest``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import grpc
from aiohttp import web
from google.protobuf import json_format

from attest.answer.http.gateway import (
    Gateway,
    error_response,
    metadata_of,
    rpc_error_response,
    stream_events,
    to_json,
)
from attest.answer.v1 import answer_pb2
from attest.common.v1 import common_pb2

MODEL = "attest"
_ASK = "/attest.answer.v1.AnswerService/Ask"
_ASK_STREAM = "/attest.answer.v1.AnswerService/AskStream"
_DONE = b"data: [DONE]\n\n"


class _Refused(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def markers(sentence: common_pb2.AnswerSentence) -> str:
    """The sentence's citation markers, e.g. ``[1][3]`` (source index + 1, each once)."""
    seen: list[int] = []
    for citation in sentence.citations:
        if citation.source_index + 1 not in seen:
            seen.append(citation.source_index + 1)
    return "".join(f"[{n}]" for n in seen)


def sentence_text(sentence: common_pb2.AnswerSentence) -> str:
    marks = markers(sentence)
    return f"{sentence.text} {marks}" if marks else sentence.text


def citations(
    sentence: common_pb2.AnswerSentence, sources: list[common_pb2.Source]
) -> list[dict[str, Any]]:
    """The sentence's citations as the ``attest`` extension carries them."""
    found = []
    for citation in sentence.citations:
        source = (
            sources[citation.source_index] if 0 <= citation.source_index < len(sources) else None
        )
        found.append(
            {
                "marker": citation.source_index + 1,
                "sentenceIndex": sentence.index,
                "sourceIndex": citation.source_index,
                "sourceId": citation.doc_id,
                "passageIndex": citation.passage_index,
                "title": source.title if source is not None else "",
                "page": source.page if source is not None else 0,
                "quote": citation.quote,
                "confidence": citation.confidence,
            }
        )
    return found


def answer_extension(answer: answer_pb2.Answer) -> dict[str, Any]:
    sources = [s.source for s in answer.sources]
    return {
        "text": answer.text,
        "insufficientInformation": answer.insufficient_information,
        "citations": [c for s in answer.sentences for c in citations(s, sources)],
        "sentences": [to_json(s) for s in answer.sentences],
        "sources": [to_json(s) for s in answer.sources],
        "researches": answer.researches,
        "removedSentences": answer.removed_sentences,
        "degradations": [to_json(d) for d in answer.degradations],
    }


def answer_content(answer: answer_pb2.Answer) -> str:
    return " ".join(sentence_text(s) for s in answer.sentences) or answer.text


def _question(body: Any) -> tuple[str, answer_pb2.AskOptions, bool]:
    if not isinstance(body, dict):
        raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "the request body must be a JSON object")
    model = body.get("model", MODEL)
    if not isinstance(model, str):
        raise _Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f'model: a string, "{MODEL}" (the one model; GET /v1/models), or leave it out',
        )
    if model != MODEL:
        raise _Refused(
            grpc.StatusCode.NOT_FOUND,
            f"model {str(model)[:80]!r} not found: the one model is {MODEL!r} (GET /v1/models)",
        )
    n = body.get("n")
    if n is not None and (type(n) is not int or n != 1):
        raise _Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"n: {str(n)[:20]} choices asked, but an answer has one grounded text: send n: 1 "
            "or leave it out",
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            "messages must be a non-empty list of {role, content}; the last user message is "
            "the question",
        )
    question: str | None = None
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            question = _text_of(message.get("content"))
            break
    if question is None:
        raise _Refused(
            grpc.StatusCode.INVALID_ARGUMENT,
            "messages has no user message with text content: send the question as "
            '{"role": "user", "content": "..."}',
        )
    options = answer_pb2.AskOptions()
    extension = body.get("attest")
    if extension is not None:
        if not isinstance(extension, dict):
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "attest must be an AskOptions object")
        try:
            json_format.ParseDict(extension, options)
        except json_format.ParseError as exc:
            raise _Refused(
                grpc.StatusCode.INVALID_ARGUMENT, f"invalid attest options: {exc}"
            ) from exc
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, "stream must be true or false")
    return question, options, stream


def _text_of(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        ]
        return "\n".join(parts) if parts else None
    return None


class _Chunks:
    """Turns AskStream's events into chat.completion.chunk objects."""

    def __init__(self, completion_id: str, created: int) -> None:
        self._id = completion_id
        self._created = created
        self._sources: list[common_pb2.Source] = []
        self._sent = 0

    def _chunk(
        self, delta: dict[str, Any], extension: dict[str, Any], finish: str | None = None
    ) -> tuple[str | None, dict[str, Any]]:
        return (
            None,
            {
                "id": self._id,
                "object": "chat.completion.chunk",
                "created": self._created,
                "model": MODEL,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                "attest": extension,
            },
        )

    def __call__(self, event: Any) -> list[tuple[str | None, Any]]:
        kind = event.WhichOneof("event")
        if kind == "retrieval":
            self._sources = [s.source for s in event.retrieval.sources]
            return [
                self._chunk(
                    {"role": "assistant", "content": ""}, {"retrieval": to_json(event.retrieval)}
                )
            ]
        if kind == "sentence":
            text = sentence_text(event.sentence)
            content = f" {text}" if self._sent else text
            self._sent += 1
            extension = {
                "sentence": to_json(event.sentence),
                "citations": citations(event.sentence, self._sources),
            }
            return [self._chunk({"content": content}, extension)]
        if kind == "revision":
            revision = event.revision
            at = revision.first_added_source_index
            for n, source in enumerate(revision.added_sources):
                if at + n == len(self._sources):
                    self._sources.append(source)
            extension = {
                "revision": to_json(revision),
                "citations": citations(revision.sentence, self._sources),
            }
            return [self._chunk({}, extension)]
        if kind == "draft":
            return [self._chunk({}, {"draft": to_json(event.draft)})]
        if kind == "final":
            return [self._chunk({}, {"final": answer_extension(event.final)}, finish="stop")]
        return []


def routes(gateway: Gateway) -> list[web.RouteDef]:
    async def completions(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError as exc:
            return error_response(
                grpc.StatusCode.INVALID_ARGUMENT, f"the request body is not JSON: {exc}"
            )
        try:
            question, options, stream = _question(body)
        except _Refused as exc:
            return error_response(exc.code, str(exc))
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        metadata = metadata_of(request)
        if stream:
            call = gateway.stream(_ASK_STREAM, answer_pb2.AskStreamResponse)(
                answer_pb2.AskStreamRequest(question=question, options=options),
                metadata=metadata,
                timeout=gateway.timeout,
            )
            return await stream_events(request, call, _Chunks(completion_id, created), _DONE)
        try:
            reply = await gateway.unary(_ASK, answer_pb2.AskResponse)(
                answer_pb2.AskRequest(question=question, options=options),
                metadata=metadata,
                timeout=gateway.timeout,
            )
        except grpc.aio.AioRpcError as err:
            return rpc_error_response(err)
        answer = reply.answer
        return web.json_response(
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": answer_content(answer)},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
                "attest": answer_extension(answer),
            }
        )

    async def models(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "attest"}],
            }
        )

    return [web.post("/v1/chat/completions", completions), web.get("/v1/models", models)]
