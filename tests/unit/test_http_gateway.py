"""The HTTP gateway's pieces that need no server: bindings read from the protos'
annotations, the OpenAPI document (and that docs/openapi.json is current), the
status mapping, and the OpenAI-compatible rendering of answers."""

from __future__ import annotations

import json
from pathlib import Path

import grpc

from attest.answer.http import chat, openapi
from attest.answer.http.gateway import HTTP_STATUS, error_body, sse
from attest.answer.http.routes import bindings
from attest.answer.v1 import answer_pb2
from attest.common.v1 import common_pb2

ROOT = Path(__file__).resolve().parents[2]


def test_bindings_come_from_the_annotations() -> None:
    found = {(b.verb, b.path): b.full_method for b in bindings()}
    assert found == {
        ("post", "/v1/ask"): "/attest.answer.v1.AnswerService/Ask",
        ("post", "/v1/ask:stream"): "/attest.answer.v1.AnswerService/AskStream",
        ("post", "/v1/documents:ingest"): "/attest.ingest.v1.IngestService/Ingest",
        ("get", "/v1/ingest/jobs/{job_id}"): "/attest.ingest.v1.IngestService/GetJob",
        ("post", "/v1/documents:delete"): "/attest.ingest.v1.IngestService/Delete",
    }
    streaming = {b.method.name for b in bindings() if b.streaming}
    assert streaming == {"AskStream"}


def test_checked_in_openapi_document_is_current() -> None:
    checked_in = (ROOT / "docs/openapi.json").read_text()
    assert checked_in == openapi.render(), (
        "docs/openapi.json is stale: python -m attest.answer.http.openapi > docs/openapi.json"
    )


def test_openapi_schemas_follow_the_json_mapping() -> None:
    document = openapi.document()
    schemas = document["components"]["schemas"]
    options = schemas["attest.answer.v1.AskOptions"]["properties"]
    assert options["fusedTopK"] == {
        "type": "integer",
        "format": "int32",
        "minimum": -(2**31),
        "maximum": 2**31 - 1,
    }
    assert options["timeBudget"]["pattern"].endswith("s$")
    progress = schemas["attest.ingest.v1.Progress"]["properties"]
    assert progress["received"]["type"] == "string"  # int64 travels as a string
    assert schemas["attest.common.v1.Retriever"]["enum"][1] == "RETRIEVER_BM25"
    job = document["paths"]["/v1/ingest/jobs/{job_id}"]["get"]
    names = [(p["name"], p["in"]) for p in job["parameters"]]
    assert names == [("job_id", "path"), ("failuresOffset", "query"), ("failuresLimit", "query")]
    stream = document["paths"]["/v1/ask:stream"]["post"]["responses"]["200"]
    assert list(stream["content"]) == ["text/event-stream"]


def test_every_error_code_maps_to_an_http_status() -> None:
    assert set(HTTP_STATUS) == set(grpc.StatusCode)
    assert HTTP_STATUS[grpc.StatusCode.UNAUTHENTICATED] == 401
    assert HTTP_STATUS[grpc.StatusCode.PERMISSION_DENIED] == 403
    assert HTTP_STATUS[grpc.StatusCode.NOT_FOUND] == 404
    assert HTTP_STATUS[grpc.StatusCode.INVALID_ARGUMENT] == 400
    assert HTTP_STATUS[grpc.StatusCode.RESOURCE_EXHAUSTED] == 429
    assert HTTP_STATUS[grpc.StatusCode.UNAVAILABLE] == 503
    assert HTTP_STATUS[grpc.StatusCode.DEADLINE_EXCEEDED] == 504
    assert error_body(grpc.StatusCode.NOT_FOUND, "no job 'x'") == {
        "error": {"code": 404, "status": "NOT_FOUND", "message": "no job 'x'"}
    }


def test_server_sent_events_carry_one_json_line() -> None:
    assert sse("sentence", {"text": "a\nb"}) == b'event: sentence\ndata: {"text":"a\\nb"}\n\n'
    assert sse(None, {"x": 1}) == b'data: {"x":1}\n\n'
    # When the server wrote it, as a comment line SSE clients skip.
    assert (
        sse("final", {}, 1765031234.5678) == b": sent-at 1765031234.568\nevent: final\ndata: {}\n\n"
    )


def _answer() -> answer_pb2.Answer:
    sources = [
        answer_pb2.AnswerSource(
            source=common_pb2.Source(doc_id=f"d{n}", passage_index=0, title=f"T{n}", page=n)
        )
        for n in range(3)
    ]
    sentence = common_pb2.AnswerSentence(
        index=0,
        text="The fine was $14.5 million.",
        confidence=8,
        citations=[
            common_pb2.Citation(source_index=2, doc_id="d2", confidence=8, quote="$14.5 million"),
            common_pb2.Citation(source_index=0, doc_id="d0", confidence=6),
            common_pb2.Citation(source_index=2, doc_id="d2", passage_index=1, confidence=4),
        ],
    )
    return answer_pb2.Answer(text=sentence.text, sentences=[sentence], sources=sources)


def test_chat_content_numbers_each_cited_source_once() -> None:
    answer = _answer()
    assert chat.answer_content(answer) == "The fine was $14.5 million. [3][1]"
    extension = chat.answer_extension(answer)
    first = extension["citations"][0]
    assert first == {
        "marker": 3,
        "sentenceIndex": 0,
        "sourceIndex": 2,
        "sourceId": "d2",
        "passageIndex": 0,
        "title": "T2",
        "page": 2,
        "quote": "$14.5 million",
        "confidence": 8,
    }
    assert extension["insufficientInformation"] is False
    json.dumps(extension)  # JSON-ready as it is


def _refusal(body: object) -> tuple[grpc.StatusCode, str]:
    try:
        chat._question(body)
    except chat._Refused as exc:
        return exc.code, str(exc)
    raise AssertionError(f"{body!r} was not refused")


def test_chat_refuses_more_than_one_choice_rather_than_sending_one() -> None:
    question = [{"role": "user", "content": "How large was the fine?"}]
    for n in (2, 0, "1", 1.5, True):
        code, message = _refusal({"messages": question, "n": n})
        assert code == grpc.StatusCode.INVALID_ARGUMENT, n
        assert message.startswith("n: "), message
        assert message.endswith("send n: 1 or leave it out"), message
    for n in (1, None):
        assert chat._question({"messages": question, "n": n})[0] == "How large was the fine?"


def test_chat_says_a_model_name_that_is_no_string_is_malformed() -> None:
    question = [{"role": "user", "content": "How large was the fine?"}]
    for model in (None, ["attest"], 7):
        code, message = _refusal({"model": model, "messages": question})
        assert code == grpc.StatusCode.INVALID_ARGUMENT, model
        assert message.startswith('model: a string, "attest"'), message
    assert _refusal({"model": "gpt-4o", "messages": question})[0] == grpc.StatusCode.NOT_FOUND
