"""Typed settings shared by every service.

Each service defines one ``BaseSettings`` subclass with its own environment
prefix (``ATTEST_<SERVICE>_``) and nests the models below. Unknown keys are
errors, so a misspelt variable fails at start-up instead of being ignored.
Settings objects are built once in ``__main__``/the CLI and passed in; nothing
reads the environment at import time.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1024 * 1024


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(StrictModel):
    """How a gRPC server listens and protects itself."""

    host: str = "0.0.0.0"
    port: int = Field(default=50051, ge=0, le=65535)
    max_message_bytes: int = Field(
        default=16 * MiB,
        ge=1024,
        description="Largest request a handler accepts; larger ones get INVALID_ARGUMENT "
        "naming the biggest field. The transport itself stops at twice this size.",
    )
    max_concurrent_rpcs: int = Field(default=256, ge=1)
    grace_seconds: float = Field(default=10.0, ge=0)
    reflection: bool = Field(default=False, description="Serve gRPC reflection (development).")
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="Prometheus /metrics port; None disables it."
    )
    warm_up_retry_seconds: float = Field(default=2.0, gt=0)


class LoggingSettings(StrictModel):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    json_format: bool = Field(default=True, alias="json")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ClientSettings(StrictModel):
    """How a service calls another one."""

    timeout_seconds: float = Field(default=5.0, gt=0)
    keepalive_seconds: float = Field(default=30.0, gt=0)
    keepalive_timeout_seconds: float = Field(default=10.0, gt=0)
    max_attempts: int = Field(default=4, ge=1, le=5)
    max_message_bytes: int = Field(default=64 * MiB, ge=1024)


class RequestLimits(StrictModel):
    """Bounds on what one request may carry; every index service enforces them."""

    max_query_chars: int = Field(default=4096, ge=1)
    max_top_k: int = Field(default=1000, ge=1)
    max_batch: int = Field(default=1000, ge=1)
    max_id_chars: int = Field(default=256, ge=1)
    max_text_chars: int = Field(default=2_000_000, ge=1)
    max_filters: int = Field(default=16, ge=1)
    max_filter_values: int = Field(default=256, ge=1)


def service_config(env_prefix: str) -> SettingsConfigDict:
    """The settings configuration every service shares, under its own prefix."""
    return SettingsConfigDict(
        env_prefix=env_prefix,
        extra="forbid",
        env_nested_delimiter="__",
        frozen=True,
        populate_by_name=True,
    )


class ServiceSettings(BaseSettings):
    """Base of every service's settings."""

    model_config = SettingsConfigDict(
        extra="forbid", env_nested_delimiter="__", frozen=True, populate_by_name=True
    )

    server: ServerSettings = ServerSettings()
    logging: LoggingSettings = LoggingSettings()
