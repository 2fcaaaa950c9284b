"""Settings of the Celery pipeline (environment prefix ``ATTEST_PIPELINE_``)."""

from __future__ import annotations

from pydantic import Field, SecretStr

from attest.core.settings import ClientSettings, ServiceSettings, service_config


class PipelineSettings(ServiceSettings):
    model_config = service_config("ATTEST_PIPELINE_")

    broker_url: SecretStr = Field(
        default=SecretStr("redis://localhost:6379/0"),
        description="Redis URL of the broker; may hold a password, so it is a secret.",
    )
    result_backend_url: SecretStr = SecretStr("redis://localhost:6379/1")
    result_expires_seconds: int = Field(default=24 * 3600, ge=60)
    visibility_timeout_seconds: int = Field(
        default=3600,
        ge=60,
        description="Redis redelivers an unacknowledged task after this long; keep it above "
        "the longest task.",
    )
    max_retries: int = Field(default=5, ge=0)
    lexical_address: str = "localhost:50052"
    client: ClientSettings = ClientSettings(timeout_seconds=120)
