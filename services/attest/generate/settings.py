"""Settings of the generate service (environment prefix ``ATTEST_GENERATE_``).

With no ``llm.url`` the service runs in extractive mode; set for example
``ATTEST_GENERATE_LLM__URL=http://tgi:8080`` (and ``ATTEST_GENERATE_LLM__KIND=openai``
for vLLM, SGLang or TGI's Messages API) to generate with an LLM.
"""

from __future__ import annotations

import functools
from pathlib import Path

from pydantic import Field, field_validator

from attest.core.settings import ServerSettings, ServiceSettings, StrictModel, service_config
from attest.generate.extractive import ExtractiveEngine, ExtractiveSettings
from attest.generate.llm import LLMSettings, create_client
from attest.generate.pipeline import Generator, PipelineSettings
from attest.retrieval.fusion import FusionSettings, FusionSettingsError, load_fusion_settings
from attest.semantic.embedding import DEFAULT_BACKEND, PACKAGED_MINILM, Backend, Embedder


class GenerateLimits(StrictModel):
    max_sources: int = Field(
        default=100,
        ge=1,
        description="Sources in one request.",
    )
    max_source_chars: int = Field(
        default=100_000,
        ge=1,
        description="Characters in one source.",
    )
    max_question_chars: int = Field(
        default=4096,
        ge=1,
        description="Characters in one question.",
    )
    max_sentences: int = Field(
        default=200,
        ge=1,
        description="Sentences in one request.",
    )
    max_sentence_chars: int = Field(
        default=4096,
        ge=1,
        description="Characters in one sentence.",
    )
    max_pairs: int = Field(
        default=1000,
        ge=1,
        description="Sentence and source pairs in one Judge request.",
    )


class ResearchSettings(StrictModel):
    """Where weak sentences are searched again; both empty disables re-search."""

    lexical_address: str = Field(default="", description="Lexical service HOST:PORT.")
    semantic_address: str = Field(default="", description="Semantic service HOST:PORT.")
    timeout_seconds: float = Field(
        default=5.0,
        gt=0,
        description="Deadline of each re-search call.",
    )
    fusion_settings: Path | None = Field(
        default=None,
        description="Fusion settings for a re-search whose fusion method is unset (JSON, as "
        "the answer service's ATTEST_ANSWER_FUSION_SETTINGS; give both the same file); None "
        "uses the settings shipped with Attest.",
    )

    @field_validator("fusion_settings")
    @classmethod
    def _fusion_file_is_usable(cls, value: Path | None) -> Path | None:
        try:
            _fusion_file(value)
        except FusionSettingsError as exc:
            raise ValueError(str(exc)) from exc
        return value

    def fusion(self) -> FusionSettings:
        """The configured fusion, read once per file."""
        return _fusion_file(self.fusion_settings)


@functools.lru_cache(maxsize=8)
def _fusion_file(path: Path | None) -> FusionSettings:
    return load_fusion_settings(path)


class GenerateSettings(ServiceSettings):
    model_config = service_config("ATTEST_GENERATE_")

    server: ServerSettings = ServerSettings(port=50057)
    llm: LLMSettings = LLMSettings()
    pipeline: PipelineSettings = PipelineSettings()
    extractive: ExtractiveSettings = ExtractiveSettings()
    embedding_model: str = Field(
        default=PACKAGED_MINILM,
        description="Sentence-transformers directory for extractive mode, or the packaged MiniLM.",
    )
    embedding_device: str = Field(
        default="cpu",
        description="Torch device of the embedding model (cpu, cuda, cuda:N).",
    )
    embedding_backend: Backend = Field(
        default=DEFAULT_BACKEND,
        description="Extractive mode's forward pass: auto, torch, onnx or onnx-int8, as the "
        "semantic service's embedding_backend.",
    )
    research: ResearchSettings = ResearchSettings()
    limits: GenerateLimits = GenerateLimits()


def build_generator(
    settings: GenerateSettings, *, with_llm: bool = True, embedder: Embedder | None = None
) -> Generator:
    """A Generator from settings; the LLM client only when a URL is configured."""
    embedder = embedder or Embedder(
        settings.embedding_model,
        device=settings.embedding_device,
        backend=settings.embedding_backend,
    )
    llm = create_client(settings.llm) if with_llm and settings.llm.url else None
    return Generator(ExtractiveEngine(embedder, settings.extractive), llm, settings.pipeline)
