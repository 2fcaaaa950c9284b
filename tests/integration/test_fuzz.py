"""Hostile input against every RPC of every service of `attest serve all`.

Two stacks, one for the module each, on their own ports and data
directories: `serve all --embedded`, and the same services with BM25 on a
real OpenSearch node (ATTEST_TEST_OPENSEARCH_URL; skipped without it outside
CI). The services and their methods come from the generated modules'
descriptors (a service counts when the server's health service knows it), so
a new RPC is fuzzed without editing this file. Requests are sent as bytes
through generic callables, so one path carries both well-formed messages and
bytes no client library would produce.

The fuzz test sends, to every method: raw payloads that do not decode,
requests generated from the request descriptor by Hypothesis (derandomized,
so every run sends the same requests), some of them one valid request per
method with one field varied, and a byte-level mutation of each generated
request. It asserts no UNKNOWN, no INTERNAL, no internals in the details, no
call outliving its deadline, and a server still SERVING, and prints the
status codes per service (`pytest -s` shows the table). The tests before it
pin the findings of issue 16 item 4.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError, Message
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from attest.answer.v1 import answer_pb2
from attest.common.v1 import common_pb2
from attest.generate.v1 import generate_pb2
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from attest.knowledge.v1 import knowledge_pb2
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
from attest.rerank.v1 import rerank_pb2
from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc
from tests.conftest import require_server
from tests.integration.ingest_stack import free_port, wait_until

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "attest.cli"]
MODULES = [
    lexical_pb2,
    semantic_pb2,
    rerank_pb2,
    generate_pb2,
    ingest_pb2,
    answer_pb2,
    knowledge_pb2,
    health_pb2,
]
LEAKS = ("Unexpected", "Traceback", "DecodeError", "Exception", "<class")

# The raw payloads of the issue: none is a valid encoding of a message with
# fields 1-2 as strings or messages.
RAW_PAYLOADS = {
    "invalid UTF-8 in field 1": b"\x0a\x02\xff\xfe",
    "truncated varint": b"\x08\xff",
    "bad wire type": b"\x0f",
    "length overrun": b"\x0a\x7f",
    "out-of-range timestamp": lexical_pb2.IndexRequest(
        documents=[common_pb2.Document(id="t", body="b", published_at=Timestamp(seconds=2**62))]
    ).SerializeToString(),
    "random bytes": random.Random(16).randbytes(64),
}


# -- the stack --------------------------------------------------------------------------


@dataclass
class Stack:
    backend: str
    address: str
    process: subprocess.Popen[bytes]
    log: Path
    channel: grpc.Channel = field(init=False)

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(self.address)

    def status(self, service: str, patience: float = 60.0) -> int | None:
        """``service``'s health status; None when the server does not know it.

        A server still busy with what the fuzzing started (ingest jobs, work
        past its caller's deadline) on a loaded machine can answer late: a
        check that times out or finds no connection is tried again for
        ``patience`` seconds instead of being read as an unknown service (which
        dropped its methods from the fuzzing) or as one not serving.
        """
        stub = health_pb2_grpc.HealthStub(self.channel)
        give_up = time.monotonic() + patience
        while True:
            try:
                response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            except grpc.RpcError as err:
                if err.code() == grpc.StatusCode.NOT_FOUND or time.monotonic() >= give_up:
                    return None
                time.sleep(0.5)
                continue
            return int(response.status)


def stack_command(backend: str, port: int, data_dir: Path) -> tuple[list[str], dict[str, str]]:
    """`serve all --embedded`, or the same stack with BM25 on a real OpenSearch node."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    args = [*CLI, "serve", "all", "--port", str(port), "--data-dir", str(data_dir)]
    if backend == "embedded":
        return [*args, "--embedded"], env
    env.update(
        ATTEST_LEXICAL_BACKEND="opensearch",
        ATTEST_LEXICAL_OPENSEARCH__HOSTS=json.dumps([require_server("ATTEST_TEST_OPENSEARCH_URL")]),
        ATTEST_LEXICAL_INDEX_NAME=f"fuzz-{uuid.uuid4().hex[:12]}",
        ATTEST_SEMANTIC_STORE="edge",
        ATTEST_INGEST_MODE="inline",
    )
    return args, env


@pytest.fixture(scope="module", params=["embedded", pytest.param("opensearch", id="opensearch")])
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    port = free_port()
    command, env = stack_command(request.param, port, tmp)
    log = tmp / "serve.log"
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=out)
    s = Stack(request.param, f"127.0.0.1:{port}", process, log)
    try:
        wait_until(
            lambda: (
                s.status("attest.answer.v1.AnswerService", patience=0) == 1
                or process.poll() is not None
            ),
            600,
            "serve all",
        )
        assert process.poll() is None, log.read_text()[-3000:]
        yield s
    finally:
        s.channel.close()
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
            if request.param == "opensearch":
                drop_indexes(env["ATTEST_LEXICAL_INDEX_NAME"])


def drop_indexes(name: str) -> None:
    url = require_server("ATTEST_TEST_OPENSEARCH_URL")
    with contextlib.suppress(OSError):
        delete = urllib.request.Request(f"{url}/{name}-*", method="DELETE")
        urllib.request.urlopen(delete, timeout=30).close()


def served_methods(stack: Stack) -> list[MethodDescriptor]:
    methods = []
    for module in MODULES:
        for service in module.DESCRIPTOR.services_by_name.values():
            # The health service answers for the services it knows, not itself.
            if module is health_pb2 or stack.status(service.full_name) is not None:
                methods.extend(service.methods)
    return methods


# -- calls as bytes ---------------------------------------------------------------------


def identity(data: bytes) -> bytes:
    return data


@dataclass(frozen=True)
class Outcome:
    method: str
    code: str
    details: str
    seconds: float
    deadline: float


def call(
    channel: grpc.Channel,
    method: MethodDescriptor,
    payloads: Sequence[bytes],
    deadline: float,
    metadata: Sequence[tuple[str, str]] = (),
) -> Outcome:
    path = f"/{method.containing_service.full_name}/{method.name}"
    kinds = {
        (False, False): channel.unary_unary,
        (False, True): channel.unary_stream,
        (True, False): channel.stream_unary,
        (True, True): channel.stream_stream,
    }
    callable_ = kinds[(method.client_streaming, method.server_streaming)](
        path, request_serializer=identity, response_deserializer=identity
    )
    request: Any = iter(payloads) if method.client_streaming else payloads[0]
    started = time.monotonic()
    code, details = "OK", ""
    try:
        response = callable_(request, timeout=deadline, metadata=metadata)
        if method.server_streaming:
            for _ in response:
                pass
    except grpc.RpcError as err:
        code, details = err.code().name, err.details() or ""
    return Outcome(path, code, details, time.monotonic() - started, deadline)


def message_class(descriptor: Descriptor) -> type[Message]:
    return message_factory.GetMessageClass(descriptor)


def decodes(method: MethodDescriptor, data: bytes) -> bool:
    try:
        message_class(method.input_type).FromString(data)
    except DecodeError:
        return False
    return True


# -- regression tests of the findings ------------------------------------------------------


def test_undecodable_requests_are_invalid_argument_on_every_rpc(stack: Stack):
    methods = served_methods(stack)
    assert {m.containing_service.name for m in methods} >= {
        "LexicalService",
        "SemanticService",
        "RerankService",
        "GenerateService",
        "IngestService",
        "AnswerService",
        "Health",
    }
    wrong = []
    for method in methods:
        for name, payload in RAW_PAYLOADS.items():
            outcome = call(stack.channel, method, [payload], deadline=5)
            if decodes(method, payload):
                # Valid bytes for this type: any answer but a crash.
                ok = outcome.code not in ("UNKNOWN", "INTERNAL")
            else:
                ok = outcome.code == "INVALID_ARGUMENT" and outcome.details.startswith(
                    f"request: is not a valid {method.input_type.full_name} message"
                )
            if not ok or any(leak in outcome.details for leak in LEAKS):
                wrong.append((outcome.method, name, outcome.code, outcome.details[:120]))
    assert wrong == []


def expect_invalid(rpc: Callable[..., Any], request: Message, field: str) -> None:
    with pytest.raises(grpc.RpcError) as info:
        rpc(request, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
    assert info.value.details().startswith(f"{field}: "), info.value.details()


def test_out_of_range_values_are_invalid_argument_naming_the_field(stack: Stack):
    lexical = lexical_pb2_grpc.LexicalServiceStub(stack.channel)
    semantic = semantic_pb2_grpc.SemanticServiceStub(stack.channel)
    ingest = ingest_pb2_grpc.IngestServiceStub(stack.channel)
    for seconds in (2**62, -(2**62)):
        doc = common_pb2.Document(id="t", body="b", published_at=Timestamp(seconds=seconds))
        expect_invalid(
            lexical.Index, lexical_pb2.IndexRequest(documents=[doc]), "documents[0].published_at"
        )
    for gte, lte, where in (
        ("0001-01-01T00:00:00+14:00", "", "filters[0].gte"),
        ("", "9999-12-31T23:59:59-14:00", "filters[0].lte"),
    ):
        filters = [common_pb2.Filter(field="published_at", gte=gte, lte=lte)]
        expect_invalid(
            lexical.Search,
            lexical_pb2.SearchRequest(query="water", top_k=3, filters=filters),
            where,
        )
        expect_invalid(
            semantic.Search,
            semantic_pb2.SearchRequest(query="water", top_k=3, filters=filters),
            where,
        )
    # The widest bounds a caller can write are fine.
    widest = [common_pb2.Filter(field="published_at", gte="0001-01-01", lte="9999-12-31")]
    lexical.Search(lexical_pb2.SearchRequest(query="water", top_k=3, filters=widest), timeout=30)

    # One rule per field in every service.
    nul = common_pb2.Document(id="a\x00b", body="b")
    expect_invalid(lexical.Index, lexical_pb2.IndexRequest(documents=[nul]), "documents[0].id")
    expect_invalid(
        semantic.Index,
        semantic_pb2.IndexRequest(documents=[semantic_pb2.IndexDocument(document=nul)]),
        "documents[0].document.id",
    )
    # Ingest's Delete refuses a bad id alone, as Ingest refuses a bad item.
    reply = ingest.Delete(ingest_pb2.DeleteRequest(doc_ids=["a\x00b"]), timeout=30)
    [failure] = reply.failures
    assert failure.code == ingest_pb2.FAILURE_CODE_INVALID_ID
    assert failure.reason.startswith("doc_ids[0]: ")
    expect_invalid(
        semantic.Search, semantic_pb2.SearchRequest(query="water", top_k=3, fusion=99), "fusion"
    )
    expect_invalid(
        semantic.Explain,
        semantic_pb2.ExplainRequest(query="water", doc_id="d", kg_top_n=-5),
        "kg_top_n",
    )


def test_a_bad_item_fails_alone(stack: Stack):
    ingest = ingest_pb2_grpc.IngestServiceStub(stack.channel)

    def raw(data: bytes) -> ingest_pb2.IngestItem:
        return ingest_pb2.IngestItem(raw_json=data)

    good = raw(json.dumps({"id": "fuzz-good", "body": "Rivermouth Paper cut water use."}).encode())
    items = [
        good,
        raw(b'{"id":"deep","body":"x","n":' + b"[" * 5000 + b"]" * 5000 + b"}"),
        raw(b'{"id":"digits","body":"x","published_at":' + b"1" * 5000 + b"}"),
        raw(b'{"id":"digit-string","body":"x","published_at":"' + b"1" * 5000 + b'"}'),
        ingest_pb2.IngestItem(
            document=common_pb2.Document(id="ts", body="x", published_at=Timestamp(seconds=2**62))
        ),
    ]
    job = ingest.Ingest(ingest_pb2.IngestRequest(items=items), timeout=60).job

    def finished() -> ingest_pb2.Job | None:
        current = ingest.GetJob(ingest_pb2.GetJobRequest(job_id=job.job_id), timeout=10).job
        final = (ingest_pb2.JOB_STATE_DONE, ingest_pb2.JOB_STATE_FAILED)
        return current if current.state in final else None

    done = wait_until(finished, 120, "the ingest job")
    assert done.state == ingest_pb2.JOB_STATE_DONE, done.error
    assert done.progress.indexed == 1
    failures = {
        f.item_index: (ingest_pb2.FailureCode.Name(f.code), f.reason) for f in done.failures
    }
    assert failures == {
        1: ("FAILURE_CODE_INVALID_JSON", "raw_json: is nested deeper than 32 levels"),
        2: ("FAILURE_CODE_INVALID_JSON", "raw_json: has a number of more than 64 digits"),
        3: (
            "FAILURE_CODE_INVALID_DATE",
            "published_at: is 5,000 characters; a date has at most 64",
        ),
        4: (
            "FAILURE_CODE_INVALID_DATE",
            "published_at: must be between 1678-01-01 and 2261-12-31 (UTC)",
        ),
    }


def test_highlights_are_escaped_html(stack: Stack):
    lexical = lexical_pb2_grpc.LexicalServiceStub(stack.channel)
    body = 'Marsh Alloys <script>alert("x")</script> reported <a href="y">water</a> use. ' * 6
    doc = common_pb2.Document(id="fuzz-xss", title="<b>Marsh</b> & water", body=body)
    lexical.Index(lexical_pb2.IndexRequest(documents=[doc], refresh=True), timeout=30)
    response = lexical.Search(
        lexical_pb2.SearchRequest(query="marsh script water", top_k=1, highlight=True), timeout=30
    )
    (hit,) = response.hits
    assert hit.highlights
    for fragment in hit.highlights:
        bare = fragment.replace("<em>", "").replace("</em>", "")
        assert "<" not in bare, fragment
        assert ">" not in bare, fragment
    joined = " ".join(hit.highlights)
    assert "&lt;<em>script</em>&gt;alert(&quot;x&quot;)" in joined


def test_request_ids_are_validated_or_replaced(stack: Stack):
    stats = stack.channel.unary_unary(
        "/attest.lexical.v1.LexicalService/Stats",
        request_serializer=identity,
        response_deserializer=identity,
    )

    def echoed(request_id: str) -> str:
        _, rpc = stats.with_call(b"", timeout=10, metadata=(("x-request-id", request_id),))
        return dict(rpc.trailing_metadata())["x-request-id"]

    assert echoed("client-42.a:b_c") == "client-42.a:b_c"
    for bad in ("x" * 3007, "x" * 129, "has space", "semi;colon", "<script>"):
        fresh = echoed(bad)
        assert fresh != bad
        assert 1 <= len(fresh) <= 128
        assert fresh.replace("-", "").isalnum()


def test_health_watch_and_list_through_the_interceptor(stack: Stack):
    # grpc's health Watch writes with context.write instead of yielding, and
    # its List is not implemented in this grpcio: both were INTERNAL.
    health = health_pb2_grpc.HealthStub(stack.channel)
    updates = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
    first = next(updates)
    updates.cancel()
    assert first.status == health_pb2.HealthCheckResponse.SERVING
    listed = call(
        stack.channel,
        health_pb2.DESCRIPTOR.services_by_name["Health"].methods_by_name["List"],
        [b""],
        10,
    )
    # UNIMPLEMENTED in this grpcio; a later one may implement it.
    assert listed.code in ("UNIMPLEMENTED", "OK"), listed


# -- the fuzz suite ---------------------------------------------------------------------------

# Strings and bytes that mean something to some service, beside Hypothesis's own.
STRINGS = [
    "",
    " ",
    "water",
    "emissions target",
    "fuzz-good",
    "esg-001",
    "gri-305",
    "organization",
    "entity",
    "published_at",
    "2025-01-01",
    "0001-01-01T00:00:00+14:00",
    "9999-12-31T23:59:59-14:00",
    "1" * 80,
    "a\x00b",
    "\u202e\ufeff\u200b",
    '<script>alert("x")</script>',
    "AND OR NOT ( ) [ ] { } : ^ ~ * ? \\ /",
    "../../etc/passwd",
    "🌊" * 10,
    "x" * 300,
]
BYTES = [
    b"",
    b'{"id": "fuzz-json", "body": "Water use fell."}',
    b'{"id": "n", "body": "x", "published_at": ' + b"9" * 400 + b"}",
    b"[" * 2000 + b"]" * 2000,
    b'{"id": "s", "body": "\\ud800"}',
    b"\xff\xfe\x00",
]
INT_EDGES = [0, 1, -1, 2, 3, 10, 50, 51, 100, 101, 1000, 1001, 2**31 - 1, -(2**31)]
MAX_DEPTH = 3


def _ts(iso: str) -> Timestamp:
    ts = Timestamp()
    ts.FromJsonString(iso)
    return ts


_DOC = common_pb2.Document(
    id="fuzz-doc",
    title="Rivermouth Paper water use",
    body="Rivermouth Paper cut its water use by 12% in 2025.",
    published_at=_ts("2025-03-01T00:00:00Z"),
    organizations=["Rivermouth Paper"],
    passages=[common_pb2.Passage(index=0, text="Rivermouth Paper cut its water use by 12%.")],
)
_SOURCE = common_pb2.Source(
    doc_id="fuzz-doc",
    title="Rivermouth Paper water use",
    text="Rivermouth Paper cut its water use by 12% in 2025.",
)
_SENTENCE = "Rivermouth Paper cut its water use by 12%."
_ITEM = ingest_pb2.IngestItem(
    raw_json=b'{"id": "fuzz-item", "body": "Harbor Steel cut emissions by 5%."}'
)
# One valid request per method, which the fuzzer varies one field at a time so
# that requests get past the first check and into the services' real work.
# Methods without one are fuzzed from the descriptor alone.
TEMPLATES: dict[str, Message] = {
    "attest.lexical.v1.LexicalService.Index": lexical_pb2.IndexRequest(documents=[_DOC]),
    "attest.lexical.v1.LexicalService.Search": lexical_pb2.SearchRequest(
        query="water use", top_k=5, highlight=True
    ),
    "attest.lexical.v1.LexicalService.Delete": lexical_pb2.DeleteRequest(doc_ids=["fuzz-x"]),
    "attest.semantic.v1.SemanticService.Index": semantic_pb2.IndexRequest(
        documents=[semantic_pb2.IndexDocument(document=_DOC)]
    ),
    "attest.semantic.v1.SemanticService.Search": semantic_pb2.SearchRequest(
        query="water use", top_k=5
    ),
    "attest.semantic.v1.SemanticService.Explain": semantic_pb2.ExplainRequest(
        query="water use", doc_id="fuzz-doc"
    ),
    "attest.semantic.v1.SemanticService.Delete": semantic_pb2.DeleteRequest(doc_ids=["fuzz-x"]),
    "attest.rerank.v1.RerankService.Rerank": rerank_pb2.RerankRequest(
        query="water use", documents=[_DOC], top_k=1
    ),
    "attest.generate.v1.GenerateService.Summarize": generate_pb2.SummarizeRequest(
        sources=[_SOURCE], query="water use"
    ),
    "attest.generate.v1.GenerateService.Cite": generate_pb2.CiteRequest(
        sentences=[_SENTENCE], sources=[_SOURCE], question="How much water?"
    ),
    "attest.generate.v1.GenerateService.Judge": generate_pb2.JudgeRequest(
        sentences=[_SENTENCE],
        sources=[_SOURCE],
        pairs=[generate_pb2.JudgePair(sentence_index=0, source_index=0)],
    ),
    "attest.generate.v1.GenerateService.Answer": generate_pb2.AnswerRequest(
        question="How much did Rivermouth Paper cut its water use?",
        sources=[_SOURCE],
        max_researches=0,
    ),
    "attest.ingest.v1.IngestService.Ingest": ingest_pb2.IngestRequest(items=[_ITEM]),
    "attest.ingest.v1.IngestService.IngestStream": ingest_pb2.IngestStreamRequest(items=[_ITEM]),
    "attest.ingest.v1.IngestService.GetJob": ingest_pb2.GetJobRequest(job_id="fuzz-job"),
    "attest.ingest.v1.IngestService.WatchJob": ingest_pb2.WatchJobRequest(job_id="fuzz-job"),
    "attest.ingest.v1.IngestService.Delete": ingest_pb2.DeleteRequest(
        doc_ids=["fuzz-x"], dry_run=True
    ),
    # A short time budget: the pipeline degrades instead of running for seconds.
    "attest.answer.v1.AnswerService.Ask": answer_pb2.AskRequest(
        question="How much did Rivermouth Paper cut its water use?",
        options=answer_pb2.AskOptions(time_budget=Duration(nanos=800_000_000)),
    ),
    "attest.answer.v1.AnswerService.AskStream": answer_pb2.AskStreamRequest(
        question="How much did Rivermouth Paper cut its water use?",
        options=answer_pb2.AskOptions(time_budget=Duration(nanos=800_000_000)),
    ),
    "grpc.health.v1.Health.Check": health_pb2.HealthCheckRequest(
        service="attest.lexical.v1.LexicalService"
    ),
}


def _ints(low: int, high: int) -> st.SearchStrategy[int]:
    edges = [v for v in INT_EDGES if low <= v <= high] + [low, high]
    return st.one_of(st.sampled_from(edges), st.integers(max(low, -3), min(high, 64)))


def _scalar(f: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = f.type
    if t == FieldDescriptor.TYPE_STRING:
        return st.one_of(st.text(max_size=24), st.sampled_from(STRINGS))
    if t == FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=32), st.sampled_from(BYTES))
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_FLOAT:
        return st.floats(width=32)
    if t == FieldDescriptor.TYPE_DOUBLE:
        return st.floats()
    if t == FieldDescriptor.TYPE_ENUM:
        known = [v.number for v in f.enum_type.values]
        return st.one_of(st.sampled_from(known), st.integers(-3, 100))
    if t in (FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32):
        return _ints(0, 2**32 - 1)
    if t in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64):
        return _ints(0, 2**64 - 1)
    if t in (
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_SFIXED64,
    ):
        return st.one_of(_ints(-(2**63), 2**63 - 1), st.sampled_from([2**62, -(2**62)]))
    return _ints(-(2**31), 2**31 - 1)


def _is_map(f: FieldDescriptor) -> bool:
    return f.message_type is not None and f.message_type.GetOptions().map_entry


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of ``descriptor`` with any subset of its fields set, nested up to MAX_DEPTH."""
    cls = message_class(descriptor)
    if depth >= MAX_DEPTH:
        return st.just(cls())
    values: dict[str, st.SearchStrategy[Any]] = {}
    for f in descriptor.fields:
        if _is_map(f):
            key, value = (
                f.message_type.fields_by_name["key"],
                f.message_type.fields_by_name["value"],
            )
            value_strategy = (
                messages(value.message_type, depth + 1) if value.message_type else _scalar(value)
            )
            values[f.name] = st.dictionaries(_scalar(key), value_strategy, max_size=3)
        elif f.message_type is not None:
            one = messages(f.message_type, depth + 1)
            values[f.name] = st.lists(one, max_size=3) if _repeated(f) else one
        else:
            values[f.name] = st.lists(_scalar(f), max_size=4) if _repeated(f) else _scalar(f)

    def build(chosen: dict[str, Any]) -> Message:
        message = cls()
        for name, value in chosen.items():
            f = descriptor.fields_by_name[name]
            target = getattr(message, name) if (_repeated(f) or f.message_type) else None
            if _is_map(f):
                for k, v in value.items():
                    if isinstance(v, Message):
                        target[k].CopyFrom(v)
                    else:
                        target[k] = v
            elif _repeated(f) and f.message_type is not None:
                for item in value:
                    target.add().CopyFrom(item)
            elif _repeated(f):
                target.extend(value)
            elif f.message_type is not None:
                target.CopyFrom(value)
            else:
                setattr(message, name, value)
        return message

    return st.fixed_dictionaries({}, optional=values).map(build)


def varied(template: Message) -> st.SearchStrategy[Message]:
    """``template`` as it is, with one field replaced, or merged with a random message."""
    descriptor = template.DESCRIPTOR

    def replace(chosen: tuple[str, Message]) -> Message:
        name, values = chosen
        out = type(template)()
        out.CopyFrom(template)
        out.ClearField(name)
        out.MergeFrom(_only(values, name))
        return out

    def merge(extra: Message) -> Message:
        out = type(template)()
        out.CopyFrom(template)
        out.MergeFrom(extra)
        return out

    one_field = st.tuples(
        st.sampled_from([f.name for f in descriptor.fields]), messages(descriptor)
    ).map(replace)
    return st.one_of(st.just(template), one_field, messages(descriptor).map(merge))


def _only(message: Message, name: str) -> Message:
    out = type(message)()
    if _repeated(message.DESCRIPTOR.fields_by_name[name]):
        getattr(out, name).MergeFrom(getattr(message, name))
    elif message.DESCRIPTOR.fields_by_name[name].message_type is not None:
        if message.HasField(name):
            getattr(out, name).CopyFrom(getattr(message, name))
    else:
        setattr(out, name, getattr(message, name))
    return out


def _repeated(f: FieldDescriptor) -> bool:
    return bool(f.is_repeated)


def mutate(data: bytes, rnd: random.Random) -> bytes:
    """One to three byte-level edits: bit flip, byte set, cut, insertion, duplication."""
    buf = bytearray(data or b"\x00")
    for _ in range(rnd.randint(1, 3)):
        at = rnd.randrange(len(buf)) if buf else 0
        edit = rnd.randrange(5)
        if edit == 0 and buf:
            buf[at] ^= 1 << rnd.randrange(8)
        elif edit == 1 and buf:
            buf[at] = rnd.randrange(256)
        elif edit == 2:
            del buf[at:]
        elif edit == 3:
            buf[at:at] = rnd.randbytes(rnd.randint(1, 8))
        else:
            buf[at:at] = buf[at : at + rnd.randint(1, 16)]
    return bytes(buf)


# Examples per method (each gives a generated call and a mutated one) and the
# deadline of each call. Methods that start real work (embedding, reranking,
# generation, a whole answer) get fewer examples so that the run stays short
# on two cores; a deadline there also bounds the work the server starts.
DEFAULT_BUDGET = (150, 3.0)
BUDGETS = {
    "AnswerService/Ask": (40, 3.0),
    "AnswerService/AskStream": (40, 3.0),
    "GenerateService/Answer": (60, 3.0),
    "GenerateService/Summarize": (60, 3.0),
    "GenerateService/Cite": (60, 3.0),
    "GenerateService/Judge": (60, 3.0),
    "RerankService/Rerank": (60, 3.0),
    "IngestService/Ingest": (100, 3.0),
    "IngestService/IngestStream": (100, 3.0),
    "IngestService/WatchJob": (60, 1.0),
    "SemanticService/Search": (100, 3.0),
    "SemanticService/Index": (100, 3.0),
    "SemanticService/Explain": (100, 3.0),
    "Health/Watch": (4, 0.3),
}
# A call may overrun its deadline by this much (client scheduling on a busy
# machine); past it, the call hung.
SLACK_SECONDS = 2.0


@pytest.mark.timeout(600)
def test_fuzz_every_rpc(stack: Stack):
    started = time.monotonic()
    outcomes: list[Outcome] = []
    methods = served_methods(stack)
    # The OpenSearch stack differs only in BM25's backend: half the examples.
    scale, least = (1.0, 5000) if stack.backend == "embedded" else (0.5, 2500)

    def send(method: MethodDescriptor, payloads: Sequence[bytes], deadline: float) -> None:
        outcomes.append(call(stack.channel, method, payloads, deadline))

    for method in methods:
        for payload in RAW_PAYLOADS.values():
            send(method, [payload], DEFAULT_BUDGET[1])

    for method in methods:
        key = f"{method.containing_service.name}/{method.name}"
        examples, deadline = BUDGETS.get(key, DEFAULT_BUDGET)
        examples = max(2, round(examples * scale))
        fuzzer(method, examples, lambda payloads, m=method, d=deadline: send(m, payloads, d))()

    elapsed = time.monotonic() - started
    print_table(stack.backend, outcomes, elapsed)
    crashes = [o for o in outcomes if o.code in ("UNKNOWN", "INTERNAL")]
    leaks = [o for o in outcomes if any(leak in o.details for leak in LEAKS)]
    hangs = [o for o in outcomes if o.seconds > o.deadline + SLACK_SECONDS]
    assert crashes == []
    assert leaks == []
    assert hangs == []
    assert len(outcomes) >= least
    assert stack.process.poll() is None
    for method in methods:
        if method.containing_service.name != "Health":
            assert stack.status(method.containing_service.full_name) == 1, method.full_name
    assert stack.status("") == 1


def fuzzer(
    method: MethodDescriptor, examples: int, send: Callable[[Sequence[bytes]], None]
) -> Callable[[], None]:
    """A Hypothesis test sending each generated request, then a mutation of its bytes."""
    one = messages(method.input_type)
    template = TEMPLATES.get(method.full_name)
    if template is not None:
        one = st.one_of(varied(template), one)
    requests = st.lists(one, max_size=3) if method.client_streaming else st.tuples(one)

    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(batch=requests, rnd=st.randoms(use_true_random=False))
    def fuzz(batch: Sequence[Message], rnd: random.Random) -> None:
        payloads = [m.SerializeToString() for m in batch]
        send(payloads or [b""])
        send([mutate(p, rnd) for p in payloads] or [mutate(b"", rnd)])

    return fuzz


def print_table(backend: str, outcomes: Sequence[Outcome], elapsed: float) -> None:
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    seconds: collections.Counter[str] = collections.Counter()
    for o in outcomes:
        service = o.method.split("/")[1].rsplit(".", 1)[-1]
        counts[service][o.code] += 1
        seconds[service] += o.seconds
    codes = sorted({c for per in counts.values() for c in per})
    width = max(len(backend), *(len(s) for s in counts)) + 2
    cell = max(len(c) for c in codes) + 2
    header = "".join(c.rjust(cell) for c in codes) + "total".rjust(8) + "seconds".rjust(10)
    lines = [backend.ljust(width) + header]
    for service in sorted(counts):
        per = counts[service]
        cells = "".join(str(per.get(c, 0)).rjust(cell) for c in codes)
        total = str(sum(per.values())).rjust(8) + f"{seconds[service]:10.1f}"
        lines.append(service.ljust(width) + cells + total)
    slowest = max(outcomes, key=lambda o: o.seconds)
    lines.append(
        f"{len(outcomes)} calls in {elapsed:.1f} s; slowest {slowest.method} "
        f"{slowest.seconds:.2f} s ({slowest.code}, deadline {slowest.deadline:.1f} s)"
    )
    print("\n" + "\n".join(lines))
