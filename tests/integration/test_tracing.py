"""One trace per request, across gRPC hops and Celery tasks, exported over OTLP.

An OTLP trace collector runs in the test process (OpenTelemetry's own
collector protocol, served by grpc); the services export to it because
``OTEL_EXPORTER_OTLP_ENDPOINT`` points there. The tests read the spans back
and check the tree: names, kinds, services, one trace id, and each parent.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import (
    trace_service_pb2,
    trace_service_pb2_grpc,
)

from attest.answer.v1 import answer_pb2, answer_pb2_grpc
from attest.demo.run import sample_documents
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from tests.conftest import require_server
from tests.integration.ingest_stack import Stack, free_port, reuters_lines, stream_items, wait_until
from tests.integration.test_serve_all import serving

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "attest.cli"]
SERVER, CLIENT, PRODUCER, CONSUMER = 2, 3, 4, 5  # OTLP span kinds


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, str]


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every span exported to it."""

    def __init__(self) -> None:
        self._spans: list[Span] = []
        self._lock = threading.Lock()

    def Export(self, request, context):
        spans = []
        for resource_spans in request.resource_spans:
            service = next(
                (
                    a.value.string_value
                    for a in resource_spans.resource.attributes
                    if a.key == "service.name"
                ),
                "",
            )
            for scope in resource_spans.scope_spans:
                for s in scope.spans:
                    spans.append(
                        Span(
                            service=service,
                            name=s.name,
                            kind=s.kind,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex(),
                            attributes={
                                a.key: a.value.string_value or str(a.value.int_value)
                                for a in s.attributes
                            },
                        )
                    )
        with self._lock:
            self._spans.extend(spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)


@pytest.fixture
def collector() -> Iterator[tuple[Collector, str]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    sink = Collector()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield sink, f"http://127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


def _tracing_env(endpoint: str) -> dict[str, str]:
    # Export within a fraction of a second instead of every 5 s.
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200"}


def _describe(spans: list[Span]) -> str:
    return "\n".join(
        f"{s.service} {s.kind} {s.name} {s.span_id} <- {s.parent_id or '-'} [{s.trace_id[:8]}]"
        for s in spans
    )


def _children(spans: list[Span], parent: Span) -> list[Span]:
    return [s for s in spans if s.parent_id == parent.span_id]


def _one(spans: list[Span], name: str, kind: int) -> Span:
    found = [s for s in spans if s.name == name and s.kind == kind]
    assert len(found) == 1, f"{len(found)} spans {name} (kind {kind}):\n{_describe(spans)}"
    return found[0]


@pytest.mark.timeout(900)
def test_one_ask_is_one_trace_across_every_service(tmp_path: Path, collector) -> None:
    sink, endpoint = collector
    port = free_port()
    address = f"127.0.0.1:{port}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", **_tracing_env(endpoint)}
    log = (tmp_path / "serve.log").open("wb")
    cmd = [*CLI, "serve", "all", "--embedded", "--port", str(port), "--data-dir", str(tmp_path)]
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
    try:
        wait_until(lambda: serving(address) or server.poll() is not None, 600, "serve all")
        assert server.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
        with grpc.insecure_channel(address) as channel:
            docs = sample_documents()[:12]
            ingest = ingest_pb2_grpc.IngestServiceStub(channel)
            job = ingest.Ingest(
                ingest_pb2.IngestRequest(items=[ingest_pb2.IngestItem(document=d) for d in docs]),
                timeout=60,
            ).job
            final = list(
                ingest.WatchJob(ingest_pb2.WatchJobRequest(job_id=job.job_id), timeout=600)
            )[-1]
            assert final.state == ingest_pb2.JOB_STATE_DONE, final
            response, call = answer_pb2_grpc.AnswerServiceStub(channel).Ask.with_call(
                answer_pb2.AskRequest(question=docs[0].title), timeout=120
            )
        request_id = dict(call.trailing_metadata())["x-request-id"]
        assert response.answer.sentences

        def ask_spans() -> list[Span]:
            spans = sink.spans()
            roots = [s for s in spans if s.name.endswith("AnswerService/Ask") and s.kind == SERVER]
            if not roots:
                return []
            trace_id = roots[0].trace_id
            tree = [s for s in spans if s.trace_id == trace_id]
            names = {s.name for s in tree}
            wanted = ("LexicalService/Search", "SemanticService/Search", "GenerateService/Answer")
            if not all(any(n.endswith(w) for n in names) for w in wanted):
                return []
            return tree

        tree = wait_until(ask_spans, 60, "the Ask's spans were not exported", 0.2)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
    print(_describe(tree))  # the tree, for a reader running with -s
    root = _one(tree, "/attest.answer.v1.AnswerService/Ask", SERVER)
    assert root.parent_id == ""
    assert root.service == "attest-all"
    assert root.attributes["attest.request_id"] == request_id
    assert root.attributes["rpc.grpc.status_code"] == "OK"
    # Each unary call the answer pipeline makes is a CLIENT span under the Ask,
    # and the callee's SERVER span is the only child of that CLIENT span.
    for method in (
        "/attest.lexical.v1.LexicalService/Search",
        "/attest.semantic.v1.SemanticService/Embed",
        "/attest.semantic.v1.SemanticService/Search",
        "/attest.rerank.v1.RerankService/Rerank",
    ):
        calls = [s for s in _children(tree, root) if s.name == method and s.kind == CLIENT]
        assert calls, f"no {method} call under the Ask:\n{_describe(tree)}"
        for client in calls:
            (served,) = _children(tree, client)
            assert (served.name, served.kind) == (method, SERVER)
            assert served.attributes["attest.request_id"] == request_id
    # Generation streams: no CLIENT span, the generator's SERVER span is the
    # Ask's child, and a re-search it runs is traced below it.
    generate = _one(tree, "/attest.generate.v1.GenerateService/Answer", SERVER)
    assert generate.parent_id == root.span_id, _describe(tree)
    every_id = {s.span_id for s in tree}
    assert all(s.parent_id in every_id for s in tree if s is not root), _describe(tree)
    assert {s.service for s in tree} == {"attest-all"}


@pytest.mark.timeout(1200)
def test_one_ingest_job_is_one_trace_through_the_celery_workers(tmp_path: Path, collector) -> None:
    sink, endpoint = collector
    stack = Stack(
        tmp_path,
        require_server("ATTEST_TEST_REDIS_URL"),
        require_server("ATTEST_TEST_OPENSEARCH_URL"),
    )
    try:
        stack.configure()
        stack.env.update(_tracing_env(endpoint))
        stack.start()
        lines = reuters_lines(20)
        response, call = stack.ingest.IngestStream.with_call(
            stream_items(lines, "reuters.jsonl", 100), timeout=300
        )
        request_id = dict(call.trailing_metadata())["x-request-id"]
        assert response.job.job_id

        def done_and_exported() -> list[Span] | None:
            spans = sink.spans()
            if not any(s.name == "run/attest.ingest.index" for s in spans):
                return None
            roots = [s for s in spans if s.name.endswith("IngestService/IngestStream")]
            return [s for s in spans if roots and s.trace_id == roots[0].trace_id] or None

        tree = wait_until(done_and_exported, 600, "no index task span was exported", 0.5)
        worker_log = "\n".join(
            (tmp_path / f"{name}.log").read_text(errors="replace")
            for name in ("worker-text", "worker-embed")
        )
    finally:
        stack.stop()
    print(_describe(tree))  # the tree, for a reader running with -s
    root = _one(tree, "/attest.ingest.v1.IngestService/IngestStream", SERVER)
    assert root.service == "attest-ingest"
    assert root.attributes["attest.request_id"] == request_id
    by_id = {s.span_id: s for s in tree}
    # Every stage ran in a worker, in the job's trace: enrich, embed, index, each
    # the child of the span that sent its task, back to the ingest call.
    for stage in ("enrich", "embed", "index"):
        runs = [s for s in tree if s.name == f"run/attest.ingest.{stage}"]
        assert runs, f"no {stage} run in the trace:\n{_describe(tree)}"
        for run in runs:
            assert run.kind == CONSUMER
            assert run.service == "attest-worker"
            sent = by_id[run.parent_id]
            assert (sent.name, sent.kind) == (f"apply_async/attest.ingest.{stage}", PRODUCER)
            chain = [run]
            while chain[-1].parent_id:
                chain.append(by_id[chain[-1].parent_id])
            assert chain[-1] is root, _describe(chain)
    # The index stage's writes reach the stores as traced calls of the workers.
    index_run = next(s for s in tree if s.name == "run/attest.ingest.index")
    below = {s.name for s in tree if s.parent_id == index_run.span_id}
    assert "/attest.lexical.v1.LexicalService/Index" in below, _describe(tree)
    assert "/attest.semantic.v1.SemanticService/Index" in below, _describe(tree)
    # The request id crossed into the workers' log lines.
    logged = set()
    for line in worker_log.splitlines():
        with contextlib.suppress(ValueError):
            logged.add(json.loads(line).get("request_id"))
    assert request_id in logged, worker_log[-3000:]
