"""Settings of the lexical service (environment prefix ``ATTEST_LEXICAL_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import SettingsConfigDict

from attest.core.settings import ServerSettings, ServiceSettings, StrictModel


class OpenSearchSettings(StrictModel):
    hosts: tuple[str, ...] = ("http://localhost:9200",)
    pool_size: int = Field(
        default=64, ge=1, description="HTTP connections per host; size it to peak concurrency."
    )
    username: str | None = None
    password: SecretStr | None = None
    verify_certs: bool = True
    timeout_seconds: float = Field(default=10.0, gt=0)


class ElasticsearchSettings(StrictModel):
    hosts: tuple[str, ...] = ("http://localhost:9200",)
    api_key: SecretStr | None = None
    username: str | None = None
    password: SecretStr | None = None
    verify_certs: bool = True
    timeout_seconds: float = Field(default=10.0, gt=0)


class Limits(StrictModel):
    max_query_chars: int = Field(default=4096, ge=1)
    max_top_k: int = Field(default=1000, ge=1)
    max_batch: int = Field(default=1000, ge=1)
    max_id_chars: int = Field(default=256, ge=1)
    max_text_chars: int = Field(default=2_000_000, ge=1)
    max_filters: int = Field(default=16, ge=1)
    max_filter_values: int = Field(default=256, ge=1)


class LexicalSettings(ServiceSettings):
    model_config = SettingsConfigDict(
        env_prefix="ATTEST_LEXICAL_",
        extra="forbid",
        env_nested_delimiter="__",
        frozen=True,
        populate_by_name=True,
    )

    server: ServerSettings = ServerSettings(port=50052)
    backend: Literal["tantivy", "opensearch", "elasticsearch"] = "tantivy"
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
    limits: Limits = Limits()
    writer_heap_bytes: int = Field(default=128 * 1024 * 1024, ge=16 * 1024 * 1024)
