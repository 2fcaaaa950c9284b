"""Typed settings shared by every service.

Each service defines one ``BaseSettings`` subclass with its own environment
prefix (``ATTEST_<SERVICE>_``) and nests the models below. Unknown keys are
errors, so a misspelt variable fails at start-up instead of being ignored.
Settings objects are built once in ``__main__``/the CLI and passed in; nothing
reads the environment at import time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MiB = 1024 * 1024


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClientTLSSettings(StrictModel):
    enabled: bool = Field(
        default=False, description="TLS with the system's CAs (implied by ca_file or cert_file)."
    )
    ca_file: Path | None = Field(default=None, description="CA bundle for server certificates.")
    cert_file: Path | None = Field(default=None, description="Client certificate (mTLS).")
    key_file: Path | None = Field(default=None, description="Client private key (mTLS).")
    server_name: str | None = Field(
        default=None, description="Name to verify instead of the target's host."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls.cert_file and tls.key_file go together")
        return self

    @property
    def secure(self) -> bool:
        return self.enabled or self.ca_file is not None or self.cert_file is not None


class ClientIdentity(StrictModel):
    """How a process presents itself to the services it calls: TLS (the servers' CA,
    a client certificate for mTLS) and a token (API key or JWT) sent as
    ``authorization: Bearer``."""

    tls: ClientTLSSettings = ClientTLSSettings()
    token: SecretStr | None = Field(default=None, description="API key or JWT.")
    token_file: Path | None = Field(
        default=None, description="File holding the token; re-read when it changes."
    )

    @property
    def configured(self) -> bool:
        return self.tls.secure or self.token is not None or self.token_file is not None


class ServerTLSSettings(StrictModel):
    """TLS of a listener, from mounted PEM files; mTLS with a client CA."""

    cert_file: Path | None = Field(default=None, description="PEM certificate chain.")
    key_file: Path | None = Field(default=None, description="PEM private key.")
    client_ca_file: Path | None = Field(
        default=None, description="CA bundle that client certificates must chain to (mTLS)."
    )
    require_client_cert: bool = Field(
        default=False,
        description="Refuse connections without a client certificate signed by client_ca_file. "
        "On an internal listener a verified client certificate is a service identity.",
    )

    @property
    def enabled(self) -> bool:
        return self.cert_file is not None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls.cert_file and tls.key_file go together")
        if self.client_ca_file is not None and self.cert_file is None:
            raise ValueError("tls.client_ca_file needs tls.cert_file and tls.key_file")
        if self.require_client_cert and self.client_ca_file is None:
            raise ValueError("tls.require_client_cert needs tls.client_ca_file")
        return self


class AuthSettings(StrictModel):
    """Who may call: API keys from a mounted file and/or JWTs checked against a JWKS."""

    keys_file: Path | None = Field(
        default=None,
        description="YAML or JSON list of keys, each stored as its SHA-256 with a tenant and "
        "scopes; re-read when the file changes (rotation without a restart).",
    )
    jwks_file: Path | None = Field(default=None, description="JWKS of the token issuer.")
    jwks_url: str | None = Field(default=None, description="JWKS URL of the token issuer.")
    issuer: str | None = Field(default=None, description="Required `iss` of every JWT.")
    audience: str | None = Field(default=None, description="Required `aud` of every JWT.")
    leeway_seconds: float = Field(
        default=30.0, ge=0, le=600, description="Clock skew allowed on exp, nbf and iat."
    )
    algorithms: tuple[str, ...] = Field(
        default=("RS256", "RS384", "RS512", "PS256", "ES256", "ES384", "EdDSA"),
        description="JWT signature algorithms accepted (asymmetric only).",
    )
    tenant_claim: str = Field(
        default="tenant",
        description="JWT claim that names the caller's tenant.",
    )
    scope_claim: str = Field(
        default="scope", description="Space-separated string or list of scopes."
    )
    reload_check_seconds: float = Field(
        default=1.0, ge=0, description="How often the keys and JWKS files are checked for changes."
    )
    jwks_cache_seconds: float = Field(
        default=300.0,
        gt=0,
        description="How long keys fetched from jwks_url are kept before fetching again.",
    )
    service_key_sha256: tuple[str, ...] = Field(
        default=(),
        description="SHA-256 of keys that identify Attest services (scope `internal`); "
        "`serve all` adds one for its own in-process calls.",
    )

    @property
    def enabled(self) -> bool:
        return (
            self.keys_file is not None
            or self.jwks_file is not None
            or self.jwks_url is not None
            or bool(self.service_key_sha256)
        )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.jwks_file is not None and self.jwks_url is not None:
            raise ValueError("auth.jwks_file and auth.jwks_url are alternatives")
        if (self.jwks_file is not None or self.jwks_url is not None) and (
            not self.issuer or not self.audience
        ):
            raise ValueError("JWT verification needs auth.issuer and auth.audience")
        if any(a.lower() == "none" or a.startswith("HS") for a in self.algorithms):
            # A JWKS holds public keys: symmetric or unsigned tokens never verify against it.
            raise ValueError("auth.algorithms takes asymmetric algorithms only")
        return self


class QuotaSettings(StrictModel):
    """Per-tenant limits on the public listener; None turns a limit off."""

    requests_per_second: float | None = Field(
        default=None,
        gt=0,
        description="Sustained requests per second a tenant may send; None: no rate limit.",
    )
    burst: int | None = Field(
        default=None, ge=1, description="Requests a tenant may send at once (default: 1 s worth)."
    )
    max_in_flight_answers: int | None = Field(
        default=None, ge=1, description="Ask and AskStream calls a tenant may have running."
    )
    max_watches: int | None = Field(
        default=16,
        ge=1,
        description="Watch and WatchJob streams a tenant may hold open at once. Each holds "
        "one of the listener's max_concurrent_rpcs until its job ends.",
    )
    watch_share: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="The share of the listener's max_concurrent_rpcs that all tenants' "
        "Watch and WatchJob streams together may hold, so that Ask keeps its calls.",
    )


class AuditSettings(StrictModel):
    """The audit log of writes and deletes (attest.core.audit)."""

    path: Path | None = Field(
        default=None,
        description="SQLite file the records are kept in, read by `attest audit`; unset: "
        "records go to the attest.audit logger only. `serve all` (and `serve ingest` "
        "with ATTEST_DATA_DIR set) default to <data dir>/audit.sqlite3.",
    )
    retention_days: float = Field(
        default=90.0, gt=0, description="Records older than this are deleted."
    )


class ServerSettings(StrictModel):
    """How a gRPC server listens and protects itself."""

    host: str = Field(
        default="0.0.0.0",
        description="Listen address; a non-loopback one needs authentication (or is refused).",
    )
    port: int = Field(
        default=50051,
        ge=0,
        le=65535,
        description="Listen port; 0 picks a free one.",
    )
    max_message_bytes: int = Field(
        default=16 * MiB,
        ge=1024,
        description="Largest request a handler accepts; larger ones get INVALID_ARGUMENT "
        "naming the biggest field. The transport itself stops at twice this size.",
    )
    max_concurrent_rpcs: int = Field(
        default=256,
        ge=1,
        description="Calls the server runs at once, streams included; more are refused with "
        "RESOURCE_EXHAUSTED.",
    )
    grace_seconds: float = Field(
        default=10.0,
        ge=0,
        description="On SIGTERM, how long calls in flight may run on before the server stops.",
    )
    reflection: bool = Field(default=False, description="Serve gRPC reflection (development).")
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="Prometheus /metrics port; None disables it."
    )
    warm_up_retry_seconds: float = Field(
        default=2.0,
        gt=0,
        description="Wait between warm-up attempts while a backend is not ready (the server "
        "reports NOT_SERVING meanwhile).",
    )
    insecure_dev: bool = Field(
        default=False,
        description="Serve without authentication (every caller is tenant `default` with every "
        "scope); loopback addresses only.",
    )
    tls: ServerTLSSettings = ServerTLSSettings()
    auth: AuthSettings = AuthSettings()
    quota: QuotaSettings = QuotaSettings()
    audit: AuditSettings = AuditSettings()
    internal_host: str = Field(
        default="127.0.0.1",
        description="Where a server hosting public and internal services at once (`serve all` "
        "with authentication) serves the internal ones.",
    )
    internal_port: int = Field(default=0, ge=0, le=65535, description="0 picks a free port.")
    identity: ClientIdentity = Field(
        default=ClientIdentity(),
        description="How this service presents itself to the services it calls (a service "
        "key, a client certificate); the default of every channel the process opens.",
    )


class LoggingSettings(StrictModel):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO",
        description="Least severity logged.",
    )
    json_format: bool = Field(
        default=True,
        alias="json",
        description="One JSON object per log line (with the request id); false: plain text. "
        "Variable name suffix `JSON`.",
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ClientSettings(StrictModel):
    """How a service calls another one."""

    timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        description="Deadline of one call, capped by what is left of the request being served.",
    )
    keepalive_seconds: float = Field(
        default=30.0,
        ge=10,
        description="Ping the server after this long without traffic; Attest's servers "
        "accept pings every 10 s at most (more often is answered with GOAWAY).",
    )
    keepalive_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="How long a keepalive ping may go unanswered before the connection is dropped.",
    )
    max_attempts: int = Field(
        default=4,
        ge=1,
        le=5,
        description="Attempts of an idempotent call on UNAVAILABLE or RESOURCE_EXHAUSTED "
        "(1: no retries; gRPC allows at most 5).",
    )
    max_message_bytes: int = Field(
        default=64 * MiB,
        ge=1024,
        description="Largest message sent or received on these calls.",
    )
    identity: ClientIdentity = Field(
        default=ClientIdentity(),
        description="TLS and token of these calls; when unset, the process's own "
        "(the server's identity, else ATTEST_CLIENT_*).",
    )


class ClientSecurity(BaseSettings):
    """``ClientIdentity`` from ATTEST_CLIENT_* variables: command-line clients and
    any process whose settings name no identity."""

    model_config = SettingsConfigDict(
        env_prefix="ATTEST_CLIENT_", extra="forbid", env_nested_delimiter="__", frozen=True
    )

    tls: ClientTLSSettings = ClientTLSSettings()
    token: SecretStr | None = Field(
        default=None,
        description="API key or JWT sent as `authorization: Bearer`.",
    )
    token_file: Path | None = Field(
        default=None,
        description="File holding the token; re-read when it changes.",
    )

    def identity(self) -> ClientIdentity:
        return ClientIdentity(tls=self.tls, token=self.token, token_file=self.token_file)


class RequestLimits(StrictModel):
    """Bounds on what one request may carry; every index service enforces them."""

    max_query_chars: int = Field(
        default=4096,
        ge=1,
        description="Characters in one query.",
    )
    max_top_k: int = Field(
        default=1000,
        ge=1,
        description="Largest top_k a search may ask for.",
    )
    max_batch: int = Field(
        default=1000,
        ge=1,
        description="Documents, records or ids in one request.",
    )
    max_id_chars: int = Field(
        default=256,
        ge=1,
        description="Characters in one document id.",
    )
    max_text_chars: int = Field(
        default=2_000_000,
        ge=1,
        description="Characters in one document's or passage's text.",
    )
    max_filters: int = Field(
        default=16,
        ge=1,
        description="Filters in one request.",
    )
    max_filter_values: int = Field(
        default=256,
        ge=1,
        description="Values in one filter.",
    )


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
