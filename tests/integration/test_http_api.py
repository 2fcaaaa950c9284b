"""The HTTP/JSON front door of a real `attest serve all --embedded` over the demo corpus.

The curl examples of docs/http-api.md are taken from the file and run with the
real `curl`; errors (no or bad credential, another tenant's job, a caller
without the scope, malformed requests) get the HTTP status of their gRPC code
and the very message the same call gets over gRPC; the OpenAI Python SDK gets a
streamed, cited answer from /v1/chat/completions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from attest.answer.v1 import answer_pb2, answer_pb2_grpc
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from tests.integration.front_door import QUESTION, FrontDoor, front_door
from tests.integration.ingest_stack import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

DOCS = Path(__file__).resolve().parents[2] / "docs/http-api.md"
_EXAMPLE = re.compile(r"<!-- example: ([a-z-]+) -->\n```sh\n(.*?)```", re.S)


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoor]:
    with front_door(tmp_path_factory.mktemp("http")) as running:
        yield running


def examples() -> dict[str, str]:
    found = dict(_EXAMPLE.findall(DOCS.read_text(encoding="utf-8")))
    assert set(found) == {"ingest", "ask", "ask-stream", "delete", "chat"}, sorted(found)
    return found


def run_example(door: FrontDoor, script: str) -> str:
    assert shutil.which("curl"), "the curl examples need the curl binary"
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env={**os.environ, "ATTEST_HTTP": door.http, "ATTEST_KEY": door.keys["acme"]},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def events(text: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        found.append((lines["event"], json.loads(lines["data"])))
    return found


def grpc_error(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def test_curl_examples_of_the_docs(door: FrontDoor) -> None:
    scripts = examples()
    job = json.loads(run_example(door, scripts["ingest"]))["job"]
    assert job["progress"]["received"] == "1"

    def job_state() -> str | None:
        reply = httpx.get(
            f"{door.http}/v1/ingest/jobs/{job['jobId']}", headers=door.headers("acme")
        )
        reply.raise_for_status()
        state = reply.json()["job"]["state"]
        return state if state in ("JOB_STATE_DONE", "JOB_STATE_FAILED") else None

    assert wait_until(job_state, 120, "the ingest job") == "JOB_STATE_DONE"

    answer = json.loads(run_example(door, scripts["ask"]))["answer"]
    assert "$14.5 million" in answer["text"]
    assert answer["insufficientInformation"] is False
    cited = [c for s in answer["sentences"] for c in s["citations"]]
    assert cited, answer
    assert all(0 <= c["confidence"] <= 10 for c in cited)
    assert {c["docId"] for c in cited} <= {s["source"]["docId"] for s in answer["sources"]}
    assert "esg-045" in {c["docId"] for c in cited}

    streamed = events(run_example(door, scripts["ask-stream"]))
    names = [name for name, _ in streamed]
    assert (names[0], names[-1]) == ("retrieval", "final"), names
    assert "sentence" in names
    final = streamed[-1][1]["final"]
    assert final["text"] == answer["text"]
    assert any(s.get("kgPath", {}).get("nodes") for s in final["sources"]), "explain: KG paths"

    chat = json.loads(run_example(door, scripts["chat"]))
    content = chat["choices"][0]["message"]["content"]
    assert "$14.5 million" in content
    assert re.search(r"\[\d+\]", content), content
    assert chat["attest"]["citations"][0]["sourceId"]

    deleted = json.loads(run_example(door, scripts["delete"]))
    assert deleted == {"matched": "1", "deleted": "1", "docIds": ["note-1"], "failures": []}


def test_errors_are_the_grpc_ones(door: FrontDoor) -> None:
    with grpc.insecure_channel(door.grpc_address) as channel:
        answer = answer_pb2_grpc.AnswerServiceStub(channel)
        ingest = ingest_pb2_grpc.IngestServiceStub(channel)
        ask = f"{door.http}/v1/ask"

        # No credential, and a key nobody issued: 401, gRPC's message.
        expected = grpc_error(lambda: answer.Ask(answer_pb2.AskRequest(question=QUESTION)))
        assert expected.code() == grpc.StatusCode.UNAUTHENTICATED
        reply = httpx.post(ask, json={"question": QUESTION})
        assert reply.status_code == 401
        assert reply.json()["error"] == {
            "code": 401,
            "status": "UNAUTHENTICATED",
            "message": expected.details(),
        }
        bad = (("authorization", "Bearer atk_not-a-key"),)
        expected = grpc_error(
            lambda: answer.Ask(answer_pb2.AskRequest(question=QUESTION), metadata=bad)
        )
        reply = httpx.post(ask, json={"question": QUESTION}, headers=dict(bad))
        assert (reply.status_code, reply.json()["error"]["message"]) == (401, expected.details())

        # Another tenant's job: 404 as over gRPC, which does not say it exists.
        made = httpx.post(
            f"{door.http}/v1/documents:ingest",
            json={"items": [{"document": {"id": "tenant-probe", "body": "Acme's own note."}}]},
            headers=door.headers("acme"),
        )
        assert made.status_code == 200, made.text
        job_id = made.json()["job"]["jobId"]
        expected = grpc_error(
            lambda: ingest.GetJob(
                ingest_pb2.GetJobRequest(job_id=job_id), metadata=door.metadata("other")
            )
        )
        assert expected.code() == grpc.StatusCode.NOT_FOUND
        reply = httpx.get(f"{door.http}/v1/ingest/jobs/{job_id}", headers=door.headers("other"))
        assert reply.status_code == 404
        assert reply.json()["error"]["message"] == expected.details()
        own = httpx.get(f"{door.http}/v1/ingest/jobs/{job_id}", headers=door.headers("acme"))
        assert own.status_code == 200

        # A key without the ingest scope: 403.
        expected = grpc_error(
            lambda: ingest.Delete(
                ingest_pb2.DeleteRequest(doc_ids=["x"]), metadata=door.metadata("asker")
            )
        )
        assert expected.code() == grpc.StatusCode.PERMISSION_DENIED
        reply = httpx.post(
            f"{door.http}/v1/documents:delete",
            json={"docIds": ["x"]},
            headers=door.headers("asker"),
        )
        assert (reply.status_code, reply.json()["error"]["message"]) == (403, expected.details())

        # Invalid requests: 400 with the validation message of gRPC ...
        for body, request in (
            ({"question": ""}, answer_pb2.AskRequest()),
            (
                {"question": QUESTION, "options": {"fusedTopK": 5, "rerankTopK": 9}},
                answer_pb2.AskRequest(
                    question=QUESTION, options=answer_pb2.AskOptions(fused_top_k=5, rerank_top_k=9)
                ),
            ),
        ):
            expected = grpc_error(
                lambda r=request: answer.Ask(r, metadata=door.metadata("acme"))  # type: ignore[misc]
            )
            assert expected.code() == grpc.StatusCode.INVALID_ARGUMENT
            reply = httpx.post(ask, json=body, headers=door.headers("acme"))
            assert reply.status_code == 400
            assert reply.json()["error"]["message"] == expected.details()
        reply = httpx.post(
            f"{door.http}/v1/ask:stream", json={"question": ""}, headers=door.headers("acme")
        )
        assert reply.status_code == 400
        assert reply.json()["error"]["message"] == "question: must not be empty"

    # ... and what only HTTP can get wrong: a body that is no JSON, or not the message.
    for content, says in (
        (b'{"question": ', "the request body is not JSON"),
        (b'["question"]', "the request body must be a JSON object"),
        (b'{"question": "x", "colour": 1}', 'no field named "colour"'),
        (b'{"question": 7}', "invalid AskRequest"),
    ):
        reply = httpx.post(ask, content=content, headers=door.headers("acme"))
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["status"] == "INVALID_ARGUMENT"
        assert says in reply.json()["error"]["message"], reply.text
    reply = httpx.get(f"{door.http}/v1/nowhere", headers=door.headers("acme"))
    assert reply.status_code == 404
    assert "see /openapi.json" in reply.json()["error"]["message"]
    openapi = httpx.get(f"{door.http}/openapi.json").json()
    assert openapi == json.loads((DOCS.parent / "openapi.json").read_text())


def test_openai_sdk_streams_a_cited_answer(door: FrontDoor) -> None:
    from openai import NotFoundError, OpenAI

    client = OpenAI(base_url=f"{door.http}/v1", api_key=door.keys["acme"], max_retries=0)
    assert [m.id for m in client.models.list()] == ["attest"]
    began = time.monotonic()
    stream = client.chat.completions.create(
        model="attest", messages=[{"role": "user", "content": QUESTION}], stream=True
    )
    content, citations, finish, final = "", [], None, None
    for chunk in stream:
        extension = (chunk.model_extra or {})["attest"]
        content += chunk.choices[0].delta.content or ""
        citations += extension.get("citations", [])
        finish = chunk.choices[0].finish_reason or finish
        final = extension.get("final", final)
    assert time.monotonic() - began < 300
    assert finish == "stop"
    assert "$14.5 million" in content
    markers = {int(n) for n in re.findall(r"\[(\d+)\]", content)}
    assert markers, content
    assert markers <= {c["marker"] for c in citations}, (content, citations)
    assert final is not None
    assert final["insufficientInformation"] is False
    for citation in final["citations"]:
        assert citation["sourceId"]
        assert 0 <= citation["confidence"] <= 10
        source = final["sources"][citation["sourceIndex"]]["source"]
        assert (citation["sourceId"], citation["title"]) == (source["docId"], source["title"])
    assert "esg-045" in {c["sourceId"] for c in final["citations"]}

    whole = client.chat.completions.create(
        model="attest", messages=[{"role": "user", "content": QUESTION}]
    )
    assert whole.choices[0].message.content == content
    with pytest.raises(NotFoundError, match="the one model is 'attest'"):
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": QUESTION}]
        )
    # The OpenAI surface authenticates as the rest does.
    stranger = OpenAI(base_url=f"{door.http}/v1", api_key="atk_unknown", max_retries=0)
    from openai import AuthenticationError

    with pytest.raises(AuthenticationError):
        stranger.chat.completions.create(
            model="attest", messages=[{"role": "user", "content": QUESTION}], stream=True
        )
