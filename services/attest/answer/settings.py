"""Settings of the answer service (environment prefix ``ATTEST_ANSWER_``).

The answer service owns no index: it calls the lexical, semantic, rerank and
generate services (and, when configured, the knowledge service), each at its
own address with its own per-stage timeout.
Every timeout is further capped by what is left of the request's budget.
"""

from __future__ import annotations

import functools
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator

from attest.core.settings import (
    ClientSettings,
    ServerSettings,
    ServiceSettings,
    StrictModel,
    service_config,
)
from attest.retrieval.fusion import FusionSettings, FusionSettingsError, load_fusion_settings


class HttpSettings(StrictModel):
    """The HTTP/JSON front door served beside the gRPC listener (attest.answer.http):
    the annotated RPCs as JSON, AskStream as server-sent events, OpenAI-compatible
    chat completions, the OpenAPI document and the evidence page."""

    enabled: bool = Field(
        default=True, description="Serve HTTP beside gRPC; false turns the gateway off."
    )
    port: int = Field(
        default=8080, ge=0, le=65535, description="HTTP port (on the gRPC host); 0 picks one."
    )
    request_timeout_seconds: float = Field(
        default=120.0,
        gt=0,
        le=600,
        description="gRPC deadline of a call the gateway forwards (Ask's time budget when the "
        "request sets none).",
    )
    labels_dir: Path | None = Field(
        default=None,
        description="Where reviewers' citation labels from the page are kept (one JSONL file "
        "per tenant); None: labels/ under ATTEST_DATA_DIR (default ./.attest).",
    )


class StageTimeouts(StrictModel):
    """Longest time one stage may take, in seconds, before it is skipped or fails."""

    retrieve: float = Field(default=5.0, gt=0, description="Each retriever call.")
    rerank: float = Field(
        default=10.0,
        gt=0,
        description="The rerank call; on timeout the fused order is kept (a degradation).",
    )
    generate: float = Field(default=60.0, gt=0, description="The whole generation stream.")
    explain: float = Field(default=5.0, gt=0, description="KG path of the sources (explain).")


class AnswerDefaults(StrictModel):
    """What an option left at 0 or unset means."""

    top_k_per_retriever: int = Field(
        default=100,
        ge=1,
        le=1000,
        description="Hits each retriever returns.",
    )
    fused_top_k: int = Field(
        default=50,
        ge=1,
        le=1000,
        description="Documents kept after fusion.",
    )
    rerank_top_k: int = Field(
        default=10,
        ge=1,
        le=100,
        description="Documents kept after reranking, the sources given to the generator.",
    )
    passages_per_document: int = Field(
        default=1,
        ge=1,
        le=8,
        description="Retrieved passages of each document given to the reranker and the generator.",
    )
    confidence_threshold: int = Field(
        default=5,
        ge=0,
        le=10,
        description="Sentences whose best citation is rated below this (0-10) are searched again.",
    )
    max_researches: int = Field(
        default=3,
        ge=0,
        le=20,
        description="Re-searches per answer.",
    )
    research_top_k: int = Field(
        default=3,
        ge=1,
        le=20,
        description="Hits each re-search brings.",
    )
    job_budget_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Time budget of a queued (Submit) job.",
    )


class DownstreamLimit(StrictModel):
    """Calls of the answer pipelines to one downstream service that run at once."""

    max_in_flight: int = Field(
        default=8,
        ge=1,
        le=4096,
        description="Calls to this service that run at once.",
    )
    max_waiting: int = Field(
        default=32,
        ge=0,
        le=4096,
        description="Calls queued for a slot, each waiting no longer than its stage's timeout; "
        "one more fails the stage at once (the answer names it in its degradations).",
    )


class DownstreamLimits(StrictModel):
    """Per-downstream concurrency of this process's answer pipelines, each with its own queue.

    One busy stage (the reranker, generation) never holds up another's calls:
    BM25 searches wait only behind BM25 searches.
    """

    lexical: DownstreamLimit = DownstreamLimit(max_in_flight=16, max_waiting=64)
    semantic: DownstreamLimit = Field(
        default=DownstreamLimit(max_in_flight=16, max_waiting=64),
        description="Dense and KG searches.",
    )
    explain: DownstreamLimit = Field(
        default=DownstreamLimit(max_in_flight=8, max_waiting=64),
        description="KG paths of the sources (best effort; kept apart from searches).",
    )
    rerank: DownstreamLimit = DownstreamLimit(max_in_flight=4, max_waiting=16)
    generate: DownstreamLimit = DownstreamLimit(max_in_flight=4, max_waiting=16)
    knowledge: DownstreamLimit = Field(
        default=DownstreamLimit(max_in_flight=8, max_waiting=32),
        description="Knowledge searches (the knowledge retriever); the lookups of their "
        "passages are lexical searches.",
    )


class AnswerLimits(StrictModel):
    max_question_chars: int = Field(
        default=4096,
        ge=1,
        description="Characters in one question.",
    )
    max_sources: int = Field(default=100, ge=1, description="Sources given to the generator.")
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
    min_budget_seconds: float = Field(
        default=0.1,
        gt=0,
        description="A time budget or gRPC deadline below this is too short to do anything: "
        "DEADLINE_EXCEEDED (options.time_budget below it: INVALID_ARGUMENT).",
    )
    max_budget_seconds: float = Field(
        default=600.0,
        gt=0,
        description="Largest time budget a request may ask for.",
    )
    max_in_flight: int = Field(
        default=4,
        ge=1,
        le=1024,
        description="Ask / AskStream pipelines this process runs at once; more wait for a slot, "
        "the wait counting against their budget. Past saturation, more at once only makes "
        "every stage slower until per-stage timeouts fire. The default suits a CPU reranker; "
        "raise it with a GPU reranker and an LLM server.",
    )
    max_waiting: int = Field(
        default=2,
        ge=0,
        le=4096,
        description="Requests queued for a slot; one more is RESOURCE_EXHAUSTED at once, with "
        "a retry-after hint. A short queue keeps the slots busy between answers; a long one "
        "only adds its wait to every answer.",
    )
    max_queue_seconds: float = Field(
        default=5.0,
        gt=0,
        le=600,
        description="Longest expected wait for a slot, and never more than half the request's "
        "budget. A request whose estimated wait (from recent answers' times) is longer is "
        "RESOURCE_EXHAUSTED at once, with a retry-after hint.",
    )
    queue_grace: float = Field(
        default=2.0,
        ge=1,
        le=10,
        description="A queued request waits up to this many times max_queue_seconds (never "
        "past half its budget) before it is RESOURCE_EXHAUSTED: it was admitted on an "
        "estimate, and turning it away when the estimate was a little short would waste "
        "the wait it already spent.",
    )
    downstream: DownstreamLimits = DownstreamLimits()


class JobSettings(StrictModel):
    """Queued jobs (Submit / Get / Watch): records in Redis, the pipeline on Celery workers."""

    state_url: SecretStr | None = Field(
        default=None,
        description="Redis URL of job records; None disables queued jobs (FAILED_PRECONDITION). "
        "The broker is ATTEST_PIPELINE_BROKER_URL; workers run `attest worker --queues answer`.",
    )
    retention_seconds: int = Field(
        default=24 * 3600, ge=60, description="How long a job and its answer are kept."
    )
    max_attempts: int = Field(
        default=3, ge=1, le=10, description="Runs of a job whose dependencies were unavailable."
    )
    retry_backoff_seconds: float = Field(
        default=2.0,
        ge=0,
        description="Wait before a job whose dependencies were unavailable runs again.",
    )
    watch_interval_seconds: float = Field(
        default=0.2,
        gt=0,
        description="How often Watch reads a job's record for news.",
    )


class AnswerSettings(ServiceSettings):
    model_config = service_config("ATTEST_ANSWER_")

    server: ServerSettings = ServerSettings(port=50050)
    lexical_address: str = Field(default="127.0.0.1:50052", description="Lexical HOST:PORT.")
    semantic_address: str = Field(default="127.0.0.1:50053", description="Semantic HOST:PORT.")
    rerank_address: str = Field(default="127.0.0.1:50056", description="Rerank HOST:PORT.")
    generate_address: str = Field(default="127.0.0.1:50057", description="Generate HOST:PORT.")
    knowledge_address: str | None = Field(
        default=None,
        description="Knowledge HOST:PORT. Set: the knowledge retriever (facts of the caller's "
        "personal knowledge base, cited as the passages they came from) is one of the default "
        "retrievers. Unset: there is no knowledge retriever, and a request naming "
        "RETRIEVER_KNOWLEDGE is INVALID_ARGUMENT.",
    )
    knowledge_top_k: int = Field(
        default=20,
        ge=1,
        le=100,
        description="Facts the knowledge retriever asks for (never more than the request's "
        "top_k_per_retriever); each distinct passage among them costs one lexical lookup.",
    )
    numeric_search: bool = Field(
        default=True,
        description="A question asking for a financial metric or line item of a company for "
        "a fiscal year (attest.generate.numeric) searches each line item it needs again with "
        "BM25 within the documents found whose title names that company, and adds those "
        "table rows to the sources.",
    )
    numeric_search_documents: int = Field(
        default=3,
        ge=1,
        le=10,
        description="Documents of the company searched for line items (the filing whose "
        "title names the year asked first).",
    )
    numeric_search_top_k: int = Field(
        default=50,
        ge=1,
        le=100,
        description="Passages each line-item search asks for (of every document: those "
        "of other documents are dropped, so the more filings a store holds, the deeper the "
        "company's own rows rank; in one store of 36 filings a statement's row ranked 21st to "
        "35th).",
    )
    numeric_search_keep: int = Field(
        default=5,
        ge=1,
        le=20,
        description="Passages of the company's documents each line-item search adds.",
    )
    client: ClientSettings = ClientSettings(max_attempts=2)
    http: HttpSettings = HttpSettings()
    timeouts: StageTimeouts = StageTimeouts()
    defaults: AnswerDefaults = AnswerDefaults()
    limits: AnswerLimits = AnswerLimits()
    jobs: JobSettings = JobSettings()
    fusion_settings: Path | None = Field(
        default=None,
        description="Fusion method and per-retriever weights (JSON, as written by `attest eval "
        "tune-fusion`); None uses the settings shipped with Attest. Used when a request leaves "
        "options.retrieval.fusion unset; WEIGHTED and DBSF take its weights, RRF is plain.",
    )

    @field_validator("knowledge_address")
    @classmethod
    def _empty_knowledge_address_is_unset(cls, value: str | None) -> str | None:
        return value.strip() or None if value is not None else None

    @field_validator("fusion_settings")
    @classmethod
    def _fusion_file_is_usable(cls, value: Path | None) -> Path | None:
        try:
            _fusion_file(value)
        except FusionSettingsError as exc:
            raise ValueError(str(exc)) from exc
        return value

    @model_validator(mode="after")
    def _admission_fits_the_server(self) -> AnswerSettings:
        # Waiting requests hold RPC slots of the server too; past its limit the
        # server itself refuses calls, the pipelines' own downstream calls
        # included when the services share it (serve all).
        admitted = self.limits.max_in_flight + self.limits.max_waiting
        if 2 * admitted > self.server.max_concurrent_rpcs:
            raise ValueError(
                f"limits.max_in_flight + limits.max_waiting ({admitted}) must be at most half "
                f"of server.max_concurrent_rpcs ({self.server.max_concurrent_rpcs}), leaving "
                "room for the calls the admitted answers make"
            )
        return self

    def fusion(self) -> FusionSettings:
        """The configured fusion, read once per file."""
        return _fusion_file(self.fusion_settings)


@functools.cache
def _fusion_file(path: Path | None) -> FusionSettings:
    return load_fusion_settings(path)
