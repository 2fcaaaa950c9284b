"""Settings of the lexical service (environment prefix ``ATTEST_LEXICAL_``)."""

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


class OpenSearchSettings(StrictModel):
    hosts: tuple[str, ...] = Field(
        default=("http://localhost:9200",),
        description="Node URLs.",
    )
    pool_size: int = Field(
        default=64, ge=1, description="HTTP connections per host; size it to peak concurrency."
    )
    username: str | None = Field(
        default=None,
        description="Basic-auth user.",
    )
    password: SecretStr | None = Field(
        default=None,
        description="Basic-auth password.",
    )
    verify_certs: bool = Field(
        default=True,
        description="Verify the nodes' TLS certificates.",
    )
    timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Deadline of one request to the cluster.",
    )


class ElasticsearchSettings(StrictModel):
    hosts: tuple[str, ...] = Field(
        default=("http://localhost:9200",),
        description="Node URLs.",
    )
    api_key: SecretStr | None = Field(
        default=None,
        description="Elasticsearch API key.",
    )
    username: str | None = Field(
        default=None,
        description="Basic-auth user.",
    )
    password: SecretStr | None = Field(
        default=None,
        description="Basic-auth password.",
    )
    verify_certs: bool = Field(
        default=True,
        description="Verify the nodes' TLS certificates.",
    )
    timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Deadline of one request to the cluster.",
    )


class LexicalSettings(ServiceSettings):
    model_config = service_config("ATTEST_LEXICAL_")

    server: ServerSettings = ServerSettings(port=50052)
    backend: Literal["tantivy", "opensearch", "elasticsearch"] = Field(
        default="tantivy",
        description="tantivy: embedded, under data_dir; opensearch or elasticsearch: a cluster.",
    )
    index_name: str = Field(
        default="attest-lexical",
        pattern=r"^[a-z0-9][a-z0-9_.-]{0,200}$",
        description="Index (OpenSearch/Elasticsearch) or directory name (tantivy).",
    )
    number_of_shards: int = Field(
        default=1,
        ge=1,
        description="Shards of a new OpenSearch/Elasticsearch index. One shard keeps BM25 "
        "statistics exact; more spread a large corpus.",
    )
    data_dir: Path = Field(
        default=Path(".attest"),
        validation_alias=AliasChoices("ATTEST_DATA_DIR", "data_dir"),
        description="Root of embedded state; tantivy lives in <data_dir>/lexical/<index_name>.",
    )
    opensearch: OpenSearchSettings = OpenSearchSettings()
    elasticsearch: ElasticsearchSettings = ElasticsearchSettings()
    limits: RequestLimits = RequestLimits()
    writer_heap_bytes: int = Field(
        default=128 * 1024 * 1024,
        ge=16 * 1024 * 1024,
        description="tantivy: memory of the index writer.",
    )
    inline_search_ms: float = Field(
        default=DEFAULT_BUDGET_SECONDS * 1e3,
        ge=0,
        description="tantivy: searches of a kind whose measured time (mean plus two standard "
        "deviations) is under this many ms run on the event loop instead of a thread, whose "
        "round trip costs about as much under concurrent callers (attest.core.offload); 0: "
        "always a thread.",
    )
