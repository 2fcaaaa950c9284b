"""Settings of the ingest service (environment prefix ``ATTEST_INGEST_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr

from attest.core.settings import (
    ClientSettings,
    MiB,
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


class EnrichSettings(StrictModel):
    """How articles are enriched; shared by the inline pipeline and the Celery workers."""

    passage_tokens: int = Field(
        default=200, ge=16, le=4096, description="Passage length limit in tokens."
    )
    max_passages: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Passages indexed per document at most (1,000 passages of 200 tokens is "
        "about a 400-page book). The rest of a longer document is not indexed: it is "
        "ingested with its first passages and a PASSAGES_TRUNCATED warning in the job's "
        "report, rather than failed, since its head is still worth finding.",
    )
    drop_non_text: bool = Field(
        default=True,
        description="Drop data: URIs, base64 and hex runs, hex dumps and 512+ character "
        "runs without spaces from a body before it is split into passages (a "
        "NON_TEXT_DROPPED warning says how much); see attest.ingest.nontext.",
    )
    slice_chars: int = Field(
        default=16_000,
        ge=1000,
        description="Inline pipeline: a batch runs through enrich, embed and index in slices "
        "of items of about this many characters (about 13 news articles), smallest items "
        "first, each committed before the next starts; a large item runs alone, after the "
        "small ones of its batch. A process stopped mid-way loses one slice's work; the "
        "encoder batches 16 texts at a time, so smaller slices cost little throughput.",
    )
    keyphrases: int = Field(default=20, ge=0, le=100, description="RAKE keyphrases per article.")
    summary_sentences: int = Field(
        default=3,
        ge=0,
        le=20,
        description="Sentences in an article's extractive summary; 0: none.",
    )
    max_organizations: int = Field(
        default=64,
        ge=0,
        le=256,
        description="Organizations kept per article.",
    )
    organization_model: Path | None = Field(
        default=None,
        description="A transformers token-classification directory with ORG labels; None "
        "uses the offline pattern and gazetteer recognizer alone.",
    )
    model_device: str = Field(
        default="cpu",
        description="Torch device of the organization model.",
    )
    generate_address: str | None = Field(
        default=None,
        description="host:port of the generate service: article summaries then come from "
        "its Summarize (abstractive when an LLM is configured there). None, or a failed "
        "call, keeps the extractive summary.",
    )
    generate_timeout_seconds: float = Field(
        default=120.0,
        gt=0,
        description="Deadline of each Summarize call to the generate service.",
    )


class EmbedSettings(StrictModel):
    """The embedding model of the pipeline; it must be the semantic service's model."""

    model: str = Field(
        default=PACKAGED_MINILM,
        description="A sentence-transformers directory, or the packaged all-MiniLM-L6-v2; the "
        "semantic service's model.",
    )
    device: str = Field(
        default="cpu",
        description="Torch device of the embedding model (cpu, cuda, cuda:N).",
    )
    batch_size: int = Field(
        default=DEFAULT_BATCH_SIZE,
        ge=1,
        description="Texts per embedding forward pass.",
    )
    backend: Backend = Field(
        default=DEFAULT_BACKEND,
        description="auto, torch, onnx or onnx-int8: the semantic service's embedding_backend "
        "(it refuses int8 vectors into a torch index and the other way round).",
    )
    graph_path: Path | None = Field(
        default=None, description="ESG graph YAML; None uses the one shipped with Attest."
    )


class IngestLimits(StrictModel):
    max_items_per_message: int = Field(
        default=1000,
        ge=1,
        description="Items in one Ingest request or stream message.",
    )
    max_items_per_stream: int = Field(
        default=1_000_000,
        ge=1,
        description="Items in one IngestStream call.",
    )
    max_origin_chars: int = Field(
        default=1024,
        ge=0,
        description="Characters in an item's origin (where it came from, e.g. its file path).",
    )
    max_failures_page: int = Field(
        default=10_000,
        ge=1,
        description="Failed items one GetJob response may list.",
    )
    max_delete_ids: int = Field(
        default=1000,
        ge=1,
        description="Document ids in one Delete request.",
    )


class IngestServerSettings(ServerSettings):
    # A 50 MB body must reach the service to be reported per document, so
    # requests may be larger than the other services'. (A subclass, not a
    # default instance: ATTEST_INGEST_SERVER__PORT alone must keep this limit.)
    port: int = Field(
        default=50054,
        ge=0,
        le=65535,
        description="Listen port; 0 picks a free one.",
    )
    max_message_bytes: int = Field(
        default=64 * MiB,
        ge=1024,
        description="Largest request a handler accepts: more than other services', so a large body "
        "reaches the service and is reported per document.",
    )


class IngestSettings(ServiceSettings):
    model_config = service_config("ATTEST_INGEST_")

    server: IngestServerSettings = IngestServerSettings()
    mode: Literal["inline", "celery"] = Field(
        default="inline",
        description="inline: the stages run in this process (embedded mode, no Redis); "
        "celery: they run on Celery workers (settings ATTEST_PIPELINE_*).",
    )
    state_url: SecretStr | None = Field(
        default=None,
        description="Redis URL of job state and the document registry; required in celery "
        "mode. None keeps them in this process (saved under data_dir when state_on_disk).",
    )
    state_on_disk: bool = Field(
        default=True,
        description="Keep job state and the registry in SQLite under data_dir; false keeps them in "
        "memory.",
    )
    data_dir: Path = Field(
        default=Path(".attest"),
        validation_alias=AliasChoices("ATTEST_DATA_DIR", "data_dir"),
        description="Root of embedded state (ATTEST_DATA_DIR): the registry and job state in "
        "ingest/state.sqlite3, and the in-process stores.",
    )
    lexical_address: str | None = Field(
        default=None,
        description="host:port of the lexical service; None runs its core in this process "
        "(settings ATTEST_LEXICAL_*).",
    )
    semantic_address: str | None = Field(
        default=None,
        description="host:port of the semantic service; None runs its core in this process "
        "(settings ATTEST_SEMANTIC_*).",
    )
    client: ClientSettings = ClientSettings(timeout_seconds=120)
    batch_size: int = Field(
        default=64,
        ge=1,
        le=1000,
        description="Documents per pipeline task; larger batches embed with less padding.",
    )
    enrich: EnrichSettings = EnrichSettings()
    embed: EmbedSettings = EmbedSettings()
    limits: IngestLimits = IngestLimits()
    watch_interval_seconds: float = Field(
        default=0.5,
        gt=0,
        description="How often WatchJob reads a job's state for news.",
    )
    doctor_interval_seconds: float = Field(
        default=900.0,
        ge=0,
        description="Seconds between reconciliations of the registry with the stores while "
        "the service runs (`attest doctor` without --repair, in the background; findings as "
        "the attest_ingest_doctor_* metrics); 0 turns them off. The first runs a minute after "
        "start-up (peers are up by then), or one interval after it where start-up checks "
        "already (embedded). Each lists every document of every tenant in every store (pages "
        "of 1,000): about 3 s per 10,000 documents on OpenSearch and 2 s on the embedded "
        "vector engine on two busy cores, so a quarter hour keeps that load small against "
        "ingest itself and still reports drift within the quarter hour.",
    )
