"""Settings of the Celery pipeline (environment prefix ``ATTEST_PIPELINE_``)."""

from __future__ import annotations

from pydantic import Field, SecretStr

from attest.core.settings import ClientSettings, ServiceSettings, service_config
from attest.ingest.settings import EmbedSettings, EnrichSettings


class PipelineSettings(ServiceSettings):
    model_config = service_config("ATTEST_PIPELINE_")

    broker_url: SecretStr = Field(
        default=SecretStr("redis://localhost:6379/0"),
        description="Redis URL of the broker; may hold a password, so it is a secret.",
    )
    result_backend_url: SecretStr = Field(
        default=SecretStr("redis://localhost:6379/1"),
        description="Redis URL of Celery's task results.",
    )
    result_expires_seconds: int = Field(
        default=24 * 3600,
        ge=60,
        description="How long task results are kept.",
    )
    visibility_timeout_seconds: int = Field(
        default=3600,
        ge=5,
        description="Redis redelivers an unacknowledged task after this long; keep it above "
        "the longest task.",
    )
    max_retries: int = Field(
        default=5,
        ge=0,
        description="Retries of a task after a transient failure, at least.",
    )
    retry_backoff_max_seconds: int = Field(
        default=60, ge=1, description="Longest wait between retries of a transient failure."
    )
    retry_window_seconds: float = Field(
        default=600.0,
        ge=0,
        description="An ingest batch whose store stays unavailable or overloaded is retried "
        "for at least this long (and at least max_retries times) from its first such "
        "failure before its documents are reported as failed: long enough for a store's "
        "node to restart.",
    )
    max_deliveries: int = Field(
        default=5,
        ge=1,
        description="A task delivered this many times without finishing (its worker died "
        "each time) is given up: its documents are reported as failed.",
    )
    reconcile_interval_seconds: float = Field(
        default=30.0,
        ge=1,
        description="How often the ingest service checks that every unfinished item of a job "
        "is held by a task in a queue or on a worker, and sends again the items of a task "
        "that the broker lost (seen missing on two checks this far apart).",
    )
    publish_retry_seconds: float = Field(
        default=60.0,
        gt=0,
        description="How long sending a task waits for the broker (e.g. through a Redis restart).",
    )
    lexical_address: str = Field(
        default="localhost:50052",
        description="host:port of the lexical service the index stage writes to.",
    )
    semantic_address: str = Field(
        default="localhost:50053",
        description="host:port of the semantic service the index stage writes to.",
    )
    state_url: SecretStr = Field(
        default=SecretStr("redis://localhost:6379/2"),
        description="Redis URL of ingestion job state; the ingest service uses the same one.",
    )
    client: ClientSettings = ClientSettings(timeout_seconds=120)
    enrich: EnrichSettings = EnrichSettings()
    embed: EmbedSettings = EmbedSettings()
