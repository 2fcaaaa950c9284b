"""The tenant travels with every downstream call: ingest's writers, the answer
pipeline's readers, and any call a service makes while serving a request."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from attest.answer import downstream
from attest.answer.downstream import GrpcBackends
from attest.answer.settings import AnswerSettings
from attest.core.auth import TENANT_KEY, Identity, tenant_for
from attest.core.channels import _merge_metadata
from attest.core.context import identity_var, tenant_var
from attest.core.settings import ClientSettings
from attest.ingest.sinks import GrpcSinks
from attest.ingest.stages import encode_vector
from attest.lexical.v1 import lexical_pb2
from attest.semantic.v1 import semantic_pb2

SERVICE = Identity("service", "default", frozenset({"internal"}), "service")


@pytest.fixture
def serving_acme() -> Iterator[None]:
    """The context of a request the server interceptor identified as tenant ``acme``."""
    identity = identity_var.set(SERVICE)
    tenant = tenant_var.set("acme")
    try:
        yield
    finally:
        tenant_var.reset(tenant)
        identity_var.reset(identity)


def test_a_call_outside_any_request_names_no_tenant():
    assert _merge_metadata((), token="k").get_all(TENANT_KEY) == []


def test_a_call_made_while_serving_names_the_request_tenant(serving_acme):
    assert _merge_metadata((), token=None).get_all(TENANT_KEY) == ["acme"]
    # A tenant the caller names (a job's, a message's) is kept as it is.
    named = _merge_metadata(((TENANT_KEY, "globex"),), token=None)
    assert named.get_all(TENANT_KEY) == ["globex"]


def test_the_tenant_header_counts_from_a_service_identity_only():
    metadata = {TENANT_KEY: "globex"}
    assert tenant_for(SERVICE, metadata) == "globex"
    client = Identity("key:a", "acme", frozenset({"ask", "ingest"}), "api-key")
    assert tenant_for(client, metadata) == "acme"
    dev = Identity("dev", "default", frozenset({"internal", "admin"}), "dev")
    assert tenant_for(dev, metadata) == "default"


class _Recorder:
    """A stub whose every method records the metadata it was called with."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, str]]] = []

    def __getattr__(self, method: str) -> Any:
        async def call(request: Any, **kwargs: Any) -> Any:
            self.calls.append((method, dict(kwargs.get("metadata") or ())))
            if method == "Search":
                return lexical_pb2.SearchResponse()
            return None

        return call


def _record() -> dict[str, Any]:
    vector = encode_vector(np.zeros(4, dtype=np.float32))
    return {
        "article": {
            "id": "d1",
            "title": "t",
            "body": "b",
            "source_url": "",
            "metadata": {},
            "published_at": None,
        },
        "hash": "h",
        "organizations": [],
        "entity_ids": [],
        "passages": [[0, "b", 0, 1]],
        "summary": "",
        "article_vector": vector,
        "passage_vectors": [vector],
        "embedding_model": "m",
    }


async def test_ingest_writers_name_the_job_tenant(serving_acme):
    sinks = GrpcSinks("127.0.0.1:1", "127.0.0.1:1", ClientSettings())
    lexical, semantic = _Recorder(), _Recorder()
    sinks.lexical, sinks.semantic = lexical, semantic  # type: ignore[assignment]
    try:
        # Inside a request of tenant acme, a write for a job of globex names globex.
        await sinks.index("globex", [_record()])
        await sinks.delete("globex", ["d1"])
    finally:
        await sinks.close()
    assert [(m, md.get(TENANT_KEY)) for m, md in lexical.calls + semantic.calls] == [
        ("Index", "globex"),
        ("Delete", "globex"),
        ("Index", "globex"),
        ("Delete", "globex"),
    ]


async def test_answer_readers_name_the_job_or_request_tenant(serving_acme, monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(downstream.lexical_pb2_grpc, "LexicalServiceStub", lambda _: recorder)
    monkeypatch.setattr(downstream.semantic_pb2_grpc, "SemanticServiceStub", lambda _: recorder)
    settings = AnswerSettings()
    # Ask's pipeline reads the request's tenant; a queued job's, the one it was submitted for.
    for backends, tenant in (
        (GrpcBackends(settings), "acme"),
        (GrpcBackends(settings, "t2"), "t2"),
    ):
        try:
            await backends.lexical_search(lexical_pb2.SearchRequest(query="q"), 1)
            await backends.semantic_search(semantic_pb2.SearchRequest(query="q"), 1)
            await backends.explain(semantic_pb2.ExplainRequest(doc_id="d1"), 1)
        finally:
            await backends.close()
        assert {md.get(TENANT_KEY) for _, md in recorder.calls} == {tenant}
        recorder.calls.clear()
