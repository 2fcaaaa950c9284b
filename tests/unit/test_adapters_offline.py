"""Client-edge error translation of the OpenSearch and Elasticsearch adapters.

No server is contacted: the adapters are built (cheap constructors) and their
translation of client exceptions to typed errors is checked.
"""

from __future__ import annotations

import time
from pathlib import Path

import elastic_transport
import elasticsearch
import opensearchpy
import pytest

from attest.core import context
from attest.core.errors import DeadlineExceeded, Internal, ResourceExhausted, Unavailable
from attest.lexical.backends import create_backend
from attest.lexical.settings import LexicalSettings


def backend(kind: str, tmp_path: Path):
    return create_backend(LexicalSettings(backend=kind, data_dir=tmp_path))  # type: ignore[arg-type]


def es_api_error(cls: type, status: int) -> Exception:
    meta = elastic_transport.ApiResponseMeta(
        status=status,
        http_version="1.1",
        headers=elastic_transport.HttpHeaders(),
        duration=0.0,
        node=None,
    )
    return cls(message="boom", meta=meta, body={})


@pytest.mark.parametrize(
    ("kind", "exc", "expected"),
    [
        ("opensearch", opensearchpy.ConnectionError("N/A", "refused", None), Unavailable),
        ("opensearch", opensearchpy.ConnectionTimeout("TIMEOUT", "slow", None), Unavailable),
        (
            "opensearch",
            opensearchpy.TransportError(429, "es_rejected_execution_exception"),
            ResourceExhausted,
        ),
        ("opensearch", opensearchpy.TransportError(503, "unavailable"), Unavailable),
        ("opensearch", opensearchpy.TransportError(400, "parsing_exception"), Internal),
        ("elasticsearch", elastic_transport.ConnectionError("refused"), Unavailable),
        ("elasticsearch", elastic_transport.ConnectionTimeout("slow"), Unavailable),
        ("elasticsearch", "429", ResourceExhausted),
        ("elasticsearch", "400", Internal),
    ],
)
async def test_client_errors_become_typed_errors(tmp_path, kind, exc, expected):
    b = backend(kind, tmp_path)
    try:
        if isinstance(exc, str):
            cls = elasticsearch.ApiError if exc == "429" else elasticsearch.BadRequestError
            exc = es_api_error(cls, int(exc))
        err = b.translate(exc, "search")
        assert isinstance(err, expected)
        assert err.message.startswith(f"{kind} search")
    finally:
        await b.close()


async def test_timeouts_at_the_deadline_are_deadline_exceeded(tmp_path):
    b = backend("opensearch", tmp_path)
    token = context.deadline_var.set(time.monotonic() - 0.01)
    try:
        err = b.translate(opensearchpy.ConnectionTimeout("TIMEOUT", "slow", None), "search")
        assert isinstance(err, DeadlineExceeded)
    finally:
        context.deadline_var.reset(token)
        await b.close()
