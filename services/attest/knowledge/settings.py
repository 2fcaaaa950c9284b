"""Settings of the knowledge service (environment prefix ``ATTEST_KNOWLEDGE_``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from attest.core.settings import ServerSettings, ServiceSettings, StrictModel, service_config
from attest.knowledge.kb import LINK_THRESHOLD, RELATION_THRESHOLD, SINGLE_WORD_LINK_THRESHOLD
from attest.knowledge.plans import PlanLimits
from attest.semantic.embedding import DEFAULT_BATCH_SIZE, PACKAGED_MINILM


class KnowledgeLimits(StrictModel):
    """Bounds on one request (the proto documents the same numbers)."""

    max_mentions: int = Field(default=64, ge=1)
    max_mention_chars: int = Field(default=256, ge=1)
    max_context_chars: int = Field(default=4096, ge=0)
    max_query_chars: int = Field(default=4096, ge=1)
    max_top_k: int = Field(default=50, ge=1, description="Candidates per mention.")
    max_facts: int = Field(default=1000, ge=1)
    max_results: int = Field(default=100, ge=1, description="Facts or paths per response.")


class KnowledgeSettings(ServiceSettings):
    model_config = service_config("ATTEST_KNOWLEDGE_")

    server: ServerSettings = ServerSettings(port=50055)
    graph_path: Path | None = Field(
        default=None, description="ESG graph YAML; None uses the one shipped with Attest."
    )
    embedding_model: str = Field(
        default=PACKAGED_MINILM,
        description="A sentence-transformers directory, or the packaged all-MiniLM-L6-v2.",
    )
    embedding_device: str = "cpu"
    embedding_batch_size: int = Field(default=DEFAULT_BATCH_SIZE, ge=1)
    link_threshold: float = Field(
        default=LINK_THRESHOLD,
        ge=-1,
        le=1,
        description="Cosine similarity a mention needs to an entity's name, alias or "
        "definition for the entity to be chosen (see attest.knowledge.kb).",
    )
    single_word_link_threshold: float = Field(
        default=SINGLE_WORD_LINK_THRESHOLD,
        ge=-1,
        le=1,
        description="The same for one-word mentions.",
    )
    relation_threshold: float = Field(
        default=RELATION_THRESHOLD,
        ge=-1,
        le=1,
        description="Similarity a free-text relation needs to a graph relation; below it the "
        "answer is the definition sentence that mentions the relation.",
    )
    plans: PlanLimits = PlanLimits()
    limits: KnowledgeLimits = KnowledgeLimits()
