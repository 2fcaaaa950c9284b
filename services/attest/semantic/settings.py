"""Settings of the semantic service (environment prefix ``ATTEST_SEMANTIC_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr

from attest.core.offload import DEFAULT_BUDGET_SECONDS
from attest.core.settings import (
    RequestLimits,
    ServerSettings,
    ServiceSettings,
    StrictModel,
    service_config,
)
from attest.semantic.embedding import (
    DEFAULT_BACKEND,
    DEFAULT_BATCH_SIZE,
    PACKAGED_MINILM,
    Backend,
)


class QdrantSettings(StrictModel):
    url: str = Field(
        default="http://localhost:6333",
        description="Qdrant server URL (store qdrant).",
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="API key of the Qdrant server.",
    )
    timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Deadline of one request to Qdrant.",
    )


class SemanticLimits(RequestLimits):
    max_paths: int = Field(
        default=100,
        ge=1,
        description="Explain returns at most this many paths, whatever the request asks "
        "(which may ask for 1-100).",
    )


class SemanticSettings(ServiceSettings):
    model_config = service_config("ATTEST_SEMANTIC_")

    server: ServerSettings = ServerSettings(port=50053)
    store: Literal["edge", "qdrant"] = Field(
        default="edge",
        description="edge: Qdrant's embedded engine under data_dir; qdrant: a Qdrant server.",
    )
    qdrant: QdrantSettings = QdrantSettings()
    collection_prefix: str = Field(
        default="attest",
        pattern=r"^[a-z0-9][a-z0-9_-]{0,100}$",
        description="Prefix of the vector collections' names.",
    )
    data_dir: Path = Field(
        default=Path(".attest"),
        validation_alias=AliasChoices("ATTEST_DATA_DIR", "data_dir"),
        description="Root of embedded state (ATTEST_DATA_DIR); the embedded engine lives in "
        "<data_dir>/vectors.",
    )
    embedding_model: str = Field(
        default=PACKAGED_MINILM,
        description="A sentence-transformers directory, or the packaged all-MiniLM-L6-v2.",
    )
    embedding_device: str = Field(
        default="cpu",
        description="Torch device of the embedding model (cpu, cuda, cuda:N).",
    )
    embedding_batch_size: int = Field(
        default=DEFAULT_BATCH_SIZE,
        ge=1,
        description="Texts per embedding forward pass.",
    )
    query_batch_size: int = Field(
        default=DEFAULT_BATCH_SIZE,
        ge=1,
        description="Queries that arrive while the encoder is busy are embedded together, up "
        "to this many in one forward pass (dynamic batching); 1 embeds each query alone.",
    )
    embedding_backend: Backend = Field(
        default=DEFAULT_BACKEND,
        description="auto (onnx on the CPU where the model allows it, else torch); torch; "
        "onnx (ONNX Runtime, same vectors, CPU only); onnx-int8 (int8 weights, CPU only; "
        "vectors move, so index and query with the same backend). See "
        "loadtest/bench_encoder.py.",
    )
    inline_search_ms: float = Field(
        default=DEFAULT_BUDGET_SECONDS * 1e3,
        ge=0,
        description="edge store: vector searches of a kind whose measured time (mean plus "
        "two standard deviations) is under this many ms run on the event loop instead of a "
        "thread, whose round trip costs about as much under concurrent callers "
        "(attest.core.offload); 0: always a thread.",
    )
    kg_top_n: int = Field(default=3, ge=0, le=50, description="Next-best nodes averaged.")
    kg_node_weighting: Literal["idf", "none"] = Field(
        default="idf",
        description="idf: a graph node's score weighed by how few of the tenant's articles "
        "reach it (see attest.semantic.kg_scoring); none: unweighted, as published.",
    )
    kg_sync_seconds: float = Field(
        default=0,
        ge=0,
        description="0: off (one replica). Above 0: every write and delete of an article is "
        "also logged in the vector store, and every this many seconds each replica applies "
        "the entries logged by the others, so replicas over one Qdrant server score the same "
        "articles: a write is in every replica's KG scores this long (plus one sync, "
        "milliseconds) after it returned. Set it on every replica.",
    )
    graph_path: Path | None = Field(
        default=None, description="ESG graph YAML; None uses the one shipped with Attest."
    )
    limits: SemanticLimits = SemanticLimits()
