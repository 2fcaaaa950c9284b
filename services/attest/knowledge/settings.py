"""Settings of the knowledge service (environment prefix ``ATTEST_KNOWLEDGE_``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, model_validator

from attest.core.settings import ServerSettings, ServiceSettings, StrictModel, service_config
from attest.generate.llm import LLMSettings
from attest.knowledge.kb import LINK_THRESHOLD, RELATION_THRESHOLD, SINGLE_WORD_LINK_THRESHOLD
from attest.knowledge.personal import PERSONAL_LINK_THRESHOLD, PERSONAL_RELATION_THRESHOLD
from attest.knowledge.plans import PlanLimits
from attest.lexical.settings import OpenSearchSettings
from attest.semantic.embedding import DEFAULT_BATCH_SIZE, PACKAGED_MINILM


class KnowledgeLimits(StrictModel):
    """Bounds on one request (the proto documents the same numbers)."""

    max_mentions: int = Field(
        default=64,
        ge=1,
        description="Mentions in one LinkEntities request.",
    )
    max_mention_chars: int = Field(
        default=256,
        ge=1,
        description="Characters in one mention.",
    )
    max_context_chars: int = Field(
        default=4096,
        ge=0,
        description="Characters of context given with mentions.",
    )
    max_query_chars: int = Field(
        default=4096,
        ge=1,
        description="Characters in one query.",
    )
    max_top_k: int = Field(default=50, ge=1, description="Candidates per mention.")
    max_facts: int = Field(
        default=1000,
        ge=1,
        description="Facts in one Store request.",
    )
    max_results: int = Field(default=100, ge=1, description="Facts or paths per response.")


class PersonalSettings(StrictModel):
    """Where the personal knowledge base lives: the project's lexical backend and vector
    store, under names of their own (see attest.knowledge.personal)."""

    enabled: bool = Field(
        default=True, description="Serve the personal base (Store, and facts in every lookup)."
    )
    lexical_backend: Literal["tantivy", "opensearch"] = Field(
        default="tantivy",
        description="Where the personal base's facts are searched by BM25: tantivy under data_dir, "
        "or OpenSearch.",
    )
    index_name: str = Field(
        default="attest-knowledge",
        pattern=r"^[a-z0-9][a-z0-9_.-]{0,200}$",
        description="OpenSearch index prefix, or tantivy directory under <data_dir>/lexical.",
    )
    opensearch: OpenSearchSettings = OpenSearchSettings()
    vector_store: Literal["edge", "qdrant"] = Field(
        default="edge",
        description="edge: Qdrant's embedded engine under data_dir; qdrant: a Qdrant server.",
    )
    collection_prefix: str = Field(
        default="attest-knowledge",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,100}$",
        description="Prefix of the personal base's vector collections.",
    )
    qdrant_url: str | None = Field(
        default=None,
        description="Qdrant server URL, with vector_store qdrant.",
    )
    qdrant_api_key: SecretStr | None = Field(
        default=None,
        description="API key of the Qdrant server.",
    )
    timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Deadline of each call to the personal base's stores.",
    )
    link_threshold: float = Field(
        default=PERSONAL_LINK_THRESHOLD,
        ge=-1,
        le=1,
        description="Similarity of a mention to a personal entity's name for it to be chosen.",
    )
    relation_threshold: float = Field(
        default=PERSONAL_RELATION_THRESHOLD,
        ge=-1,
        le=1,
        description="Similarity of a free-text relation to a stored triple's relation; below "
        "it the entity's aspect facts that mention the relation answer.",
    )
    max_facts_per_document: int = Field(
        default=10_000,
        ge=1,
        le=10_000,
        description="Facts kept per document.",
    )


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
    embedding_device: str = Field(
        default="cpu",
        description="Torch device of the embedding model (cpu, cuda, cuda:N).",
    )
    embedding_batch_size: int = Field(
        default=DEFAULT_BATCH_SIZE,
        ge=1,
        description="Texts per embedding forward pass.",
    )
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
    data_dir: Path = Field(
        default=Path(".attest"),
        validation_alias=AliasChoices("ATTEST_DATA_DIR", "data_dir"),
        description="Root of embedded state (the personal base's tantivy index and vectors).",
    )
    personal: PersonalSettings = PersonalSettings()
    plans: PlanLimits = PlanLimits()
    planner: Literal["heuristic", "llm", "hybrid"] = Field(
        default="heuristic",
        description="Who plans Search programs: heuristic (no model); llm (the LLM's plan when "
        "it validates, else the heuristic planner's); hybrid (the LLM's plan only when it "
        "also names no entity the linker did not find). See attest.knowledge.llm_planner.",
    )
    llm: LLMSettings = Field(
        default=LLMSettings(),
        description="The planner's LLM, set as the generator's (ATTEST_KNOWLEDGE_LLM__URL, "
        "__KIND, __RESPONSE_FORMAT, ...); used when planner is llm or hybrid.",
    )
    limits: KnowledgeLimits = KnowledgeLimits()

    @model_validator(mode="after")
    def _planner_needs_an_llm(self) -> KnowledgeSettings:
        if self.planner != "heuristic" and not self.llm.url:
            raise ValueError(f"planner={self.planner} needs llm.url (ATTEST_KNOWLEDGE_LLM__URL)")
        return self
