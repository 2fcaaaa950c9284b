"""Settings of the rerank service (environment prefix ``ATTEST_RERANK_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from attest.core.settings import ServerSettings, ServiceSettings, StrictModel, service_config
from attest.semantic.embedding import DEFAULT_BACKEND, PACKAGED_MINILM, Backend


class RerankLimits(StrictModel):
    """Bounds on one Rerank request; larger requests fail with INVALID_ARGUMENT."""

    max_query_chars: int = Field(
        default=4096,
        ge=1,
        description="Characters in the query.",
    )
    max_documents: int = Field(
        default=100,
        ge=1,
        description="Documents in one request.",
    )
    max_passages: int = Field(default=8, ge=1, description="Passages per document.")
    max_passage_chars: int = Field(
        default=20_000,
        ge=1,
        description="Characters per passage; longer text is refused, shorter text "
        "that is over max_length tokens is truncated and flagged.",
    )
    max_id_chars: int = Field(
        default=256,
        ge=1,
        description="Characters in one id.",
    )
    max_top_k: int = Field(
        default=1000,
        ge=1,
        description="Largest top_k a request may ask for.",
    )


class BatchingSettings(StrictModel):
    max_documents: int = Field(
        default=128, ge=1, description="Documents gathered into one model call."
    )
    max_wait_ms: float = Field(
        default=5.0, ge=0, description="How long the first request waits for company."
    )
    max_passages_per_forward: int = Field(
        default=512, ge=1, description="Passage slots in one forward pass (bounds memory)."
    )
    max_queued_requests: int = Field(
        default=1024,
        ge=1,
        description="Requests waiting for a batch; more are refused with RESOURCE_EXHAUSTED.",
    )


class RerankSettings(ServiceSettings):
    model_config = service_config("ATTEST_RERANK_")

    server: ServerSettings = ServerSettings(port=50056)
    checkpoint: Path | None = Field(
        default=None,
        description="A PFiD checkpoint written by `attest pfid train`; without one the "
        "embedding-similarity fallback answers.",
    )
    device: str = Field(default="auto", description="auto (cuda when present), cpu, cuda, cuda:N")
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        default="auto", description="auto: bfloat16 on GPU, float32 on CPU."
    )
    compile: bool = Field(default=False, description="torch.compile the model at start-up.")
    max_length: int = Field(default=200, ge=8, le=2048, description="Tokens per passage.")
    embedding_model: str = Field(default=PACKAGED_MINILM, description="Fallback model.")
    embedding_backend: Backend = Field(
        default=DEFAULT_BACKEND,
        description="The fallback model's forward pass: auto, torch, onnx or onnx-int8, as the "
        "semantic service's embedding_backend (int8 vectors are not scored against "
        "stored vectors of another backend).",
    )
    limits: RerankLimits = RerankLimits()
    batching: BatchingSettings = BatchingSettings()

    @model_validator(mode="after")
    def _checkpoint_exists(self) -> RerankSettings:
        if self.checkpoint is not None and not (self.checkpoint / "pfid.json").is_file():
            what = "does not exist" if not self.checkpoint.exists() else "has no pfid.json"
            raise ValueError(
                f"ATTEST_RERANK_CHECKPOINT={self.checkpoint}: {what}; expected a directory "
                "written by `attest pfid train`"
            )
        return self
