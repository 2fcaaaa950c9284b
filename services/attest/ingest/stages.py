"""The stages of ingestion as plain functions over JSON-ready records.

``enrich`` (text only, CPU): passages, RAKE keyphrases, organizations, an
extractive summary; a record's passages are ``[index, text, start, end,
page]`` (read them with ``record_passages``). ``embed`` (the model): passage,
article and keyphrase embeddings in one batched call, and the knowledge-graph
links those keyphrases make. ``index`` writes to the lexical and semantic
stores through a ``Sinks``. The same functions run inline (embedded mode) and
inside the Celery tasks; records are dicts of JSON types so that they travel
as task arguments unchanged.
"""

from __future__ import annotations

import base64
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from attest.core.document import KEYWORD_FIELDS, keywords_from_stored
from attest.ingest.documents import Article
from attest.ingest.nontext import drop_non_text
from attest.ingest.organizations import (
    CombinedRecognizer,
    Gazetteer,
    ModelRecognizer,
    PatternRecognizer,
    Recognizer,
    merge_organizations,
)
from attest.ingest.passages import CHARS_PER_TOKEN, PassageSpan, split_passages
from attest.ingest.settings import EnrichSettings
from attest.ingest.summary import extractive_summary
from attest.knowledge.linking import EntityLinker, KeyphraseExtractor
from attest.semantic.models import passage_text

Vector = npt.NDArray[np.float32]
Record = dict[str, Any]


def record_keywords(record: Record) -> dict[str, tuple[str, ...]]:
    """The keyword fields a record stores: the article's, each replaced by the
    record's own entry of the same name where a stage set one (the organizations
    enrichment found, the entity ids linking added)."""
    out = keywords_from_stored(record["article"])
    for f in KEYWORD_FIELDS:
        if f.name in record:
            out[f.name] = tuple(record[f.name])
    return {name: values for name, values in out.items() if values}


def passage_rows(passages: Sequence[PassageSpan]) -> list[list[Any]]:
    """Passages as a record holds them: ``[index, text, start, end, page]``."""
    return [[p.index, p.text, p.start_char, p.end_char, p.page] for p in passages]


def record_passages(record: Record) -> list[PassageSpan]:
    """The passages of an enriched record. A record enriched before passages
    kept their page (four fields, as in a task queued by an earlier release)
    has its passages on page 0, unknown."""
    return [
        PassageSpan(int(p[0]), str(p[1]), int(p[2]), int(p[3]), int(p[4]) if len(p) > 4 else 0)
        for p in record["passages"]
    ]


# The semantic service embeds an article as its title with its summary (or,
# without one, the start of its body); the ingest pipeline does the same.
ARTICLE_FALLBACK_CHARS = 1200


def encode_vector(vector: Vector) -> str:
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def decode_vector(text: str) -> Vector:
    return np.frombuffer(base64.b64decode(text), dtype="<f4").astype(np.float32)


def article_text(title: str, summary: str, body: str) -> str:
    return f"{title}\n{summary or body[:ARTICLE_FALLBACK_CHARS]}".strip()


# -- enrich ------------------------------------------------------------------------


class Enricher:
    """Enrichment of articles; cheap to build, the model recognizer loads on first use."""

    def __init__(self, settings: EnrichSettings, gazetteer: Gazetteer | None = None) -> None:
        self.settings = settings
        self.patterns = PatternRecognizer(gazetteer)
        self.recognizer: Recognizer = self.patterns
        if settings.organization_model is not None:
            model = ModelRecognizer(settings.organization_model, device=settings.model_device)
            self.recognizer = CombinedRecognizer(model, self.patterns)
        self.keyphrases = KeyphraseExtractor()

    def enrich(
        self, item: int, kind: str, content: str, article: Article, known: Gazetteer | None = None
    ) -> Record:
        """The article's record; its ``organizations`` (the given ones and those
        found in the text) replace the article's (see ``record_keywords``).

        Names are looked up in a gazetteer of the document's own (its given
        organizations and the names its text shows by their shape, with their
        stems) over ``known`` when given, so that the record depends on the
        document (and ``known``) alone, never on what was enriched before."""
        s = self.settings
        warnings: list[list[str]] = []
        body = article.body
        if s.drop_non_text:
            body, dropped = drop_non_text(body)
            if dropped.total:
                warnings.append(
                    [
                        "NON_TEXT_DROPPED",
                        f"dropped {dropped.describe()} of non-text before splitting into "
                        f"passages ({100 * dropped.total / len(article.body):.1f} % of the body)",
                    ]
                )
        passages, kept = self._passages(body)
        if kept < len(body):
            warnings.append(
                [
                    "PASSAGES_TRUNCATED",
                    f"over the limit of {s.max_passages:,} passages: the first {s.max_passages:,} "
                    f"are indexed, the last {len(body) - kept:,} characters of the body "
                    f"({100 * (len(body) - kept) / len(body):.1f} %) are not",
                ]
            )
        # Organizations, keyphrases and the summary come from the indexed text only:
        # their cost grows with the text, and the cap bounds it.
        text = body[:kept]
        own = Gazetteer(article.organizations, base=known)
        found = self.recognizer.recognize(article.title, text, own)
        organizations = merge_organizations(article.organizations, found)[: s.max_organizations]
        phrases = self.keyphrases.extract(
            f"{article.title.strip()}\n\n{text.strip()}", s.keyphrases
        )
        stored = article.to_json()
        # The stores keep the body the passages were cut from, so that every
        # passage's span points into it.
        stored["body"] = body
        return {
            "item": item,
            "kind": kind,
            "hash": content,
            "article": stored,
            "passages": passage_rows(passages),
            "keyphrases": phrases,
            "organizations": organizations,
            "summary": extractive_summary(text, s.summary_sentences),
            "warnings": warnings,
        }

    def _passages(self, body: str) -> tuple[list[PassageSpan], int]:
        """The body's first ``max_passages`` passages and how many of its characters
        they cover (``len(body)`` when nothing is cut off). Only a prefix long enough
        for the cap is split: a passage holds at most ``CHARS_PER_TOKEN`` characters
        a token, so a huge body costs no more than one at the cap."""
        s = self.settings
        limit = s.max_passages
        prefix = (limit + 1) * CHARS_PER_TOKEN * s.passage_tokens
        if len(body) > prefix:
            passages = split_passages(body[:prefix], s.passage_tokens)
            # The last passage of the prefix may be cut short; it is not kept.
            if len(passages) <= limit:
                # Mostly white space: split the whole body after all.
                passages = split_passages(body, s.passage_tokens)
        else:
            passages = split_passages(body, s.passage_tokens)
        if len(passages) <= limit:
            return passages, len(body)
        kept = passages[:limit]
        return kept, kept[-1].end_char


def abstractive_summaries(records: Sequence[Record], address: str, timeout: float) -> int:
    """Replace the extractive summaries of ``records`` by the generate service's
    (query-independent) ones; returns how many were replaced. A failed call
    raises the Attest error of a failed dependency (``attest.core.rpc_errors``).

    The call goes through the process's channel factory
    (``attest.core.channels.create_channel``): its TLS, service token, retry
    policy and deadline cap, like every other call to another service. Ingest
    runs this from worker threads and Celery tasks, where no event loop runs,
    so the call gets a loop of its own."""
    import asyncio

    from attest.common.v1 import common_pb2
    from attest.generate.v1 import generate_pb2

    if not records:
        return 0
    request = generate_pb2.SummarizeRequest(
        sources=[
            common_pb2.Source(
                doc_id=r["article"]["id"],
                passage_index=-1,
                title=r["article"]["title"],
                text=r["article"]["body"][:100_000],
            )
            for r in records
        ],
        max_sentences=3,
    )
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        response = asyncio.run(_summarize(address, request, timeout))
    else:  # called on an event loop's thread: run the call beside it
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as pool:
            response = pool.submit(asyncio.run, _summarize(address, request, timeout)).result()
    replaced = 0
    for summary in response.summaries:
        if 0 <= summary.source_index < len(records) and summary.summary.strip():
            records[summary.source_index]["summary"] = summary.summary.strip()
            replaced += 1
    return replaced


async def _summarize(address: str, request: Any, seconds: float) -> Any:
    import grpc

    from attest.core.channels import create_channel
    from attest.core.rpc_errors import from_rpc
    from attest.generate.v1 import generate_pb2_grpc

    channel = create_channel(address)
    try:
        stub = generate_pb2_grpc.GenerateServiceStub(channel)
        return await stub.Summarize(request, timeout=seconds)
    except grpc.RpcError as err:
        raise from_rpc(err, service="generate", dependency=True) from err
    finally:
        await channel.close()


# -- embed -------------------------------------------------------------------------


class Encoder(Protocol):
    @property
    def name(self) -> str: ...

    def encode(self, texts: Sequence[str]) -> Vector | npt.NDArray[Any]: ...


class _CachedEncode:
    """Keyphrase vectors for the linker, kept across batches (least recently used out).

    News repeats its phrases ("crude oil", "interest rates"): of 88,125
    keyphrases in the first 5,000 Reuters-21578 articles, 54,474 are distinct,
    so a phrase embedded once is not embedded again for the next batch.
    """

    def __init__(self, encoder: Encoder, capacity: int = 50_000) -> None:
        self._encoder = encoder
        self.capacity = capacity
        self.cache: OrderedDict[str, Vector] = OrderedDict()

    def missing(self, texts: Sequence[str]) -> list[str]:
        """Distinct ``texts`` without a cached vector, in order."""
        return [t for t in dict.fromkeys(texts) if t not in self.cache]

    def put(self, texts: Sequence[str], vectors: Vector) -> None:
        for text, vector in zip(texts, vectors, strict=True):
            self.cache[text] = vector
            self.cache.move_to_end(text)
        while len(self.cache) > self.capacity:
            self.cache.popitem(last=False)

    def __call__(self, texts: Sequence[str]) -> Vector:
        missing = self.missing(texts)
        if missing:
            self.put(missing, np.asarray(self._encoder.encode(missing), dtype=np.float32))
        rows = []
        for t in texts:
            self.cache.move_to_end(t)
            rows.append(self.cache[t])
        return np.vstack(rows).astype(np.float32)


@dataclass
class Embedding:
    """The model side of the pipeline: an encoder and the KG linker on top of it."""

    encoder: Encoder
    linker: EntityLinker | None
    _cached: _CachedEncode | None = None

    @classmethod
    def build(cls, encoder: Encoder, graph: Any | None, phrase_cache: int = 50_000) -> Embedding:
        cached = _CachedEncode(encoder, phrase_cache)
        linker = EntityLinker(graph, cached) if graph is not None else None
        return cls(encoder=encoder, linker=linker, _cached=cached)

    def warm_up(self) -> None:
        if self.linker is not None:
            self.linker.warm_up()

    def unknown_entities(self, record: Record) -> list[str]:
        """Given entity ids of ``record`` that the graph does not have."""
        if self.linker is None:
            return []
        entities = self.linker.graph.entities
        return [e for e in record["article"]["entity_ids"] if e not in entities]

    def embed(self, records: Sequence[Record]) -> list[Record]:
        """Embedded records; check ``unknown_entities`` first (the semantic store
        rejects a batch naming an entity it does not know)."""
        texts: list[str] = []
        for r in records:
            a = r["article"]
            texts.append(article_text(a["title"], r["summary"], a["body"]))
            texts.extend(passage_text(a["title"], p[1]) for p in r["passages"])
        phrases: list[str] = []
        if self.linker is not None and self._cached is not None:
            # Keyphrases embedded for an earlier batch come from the cache.
            phrases = self._cached.missing(
                [p for r in records for p in r["keyphrases"] if p.strip()]
            )
        # Each distinct text is embedded once, in one call: a short article's
        # "title + summary" is often exactly its only passage.
        unique = list(dict.fromkeys([*texts, *phrases]))
        encoded = np.asarray(self.encoder.encode(unique), dtype=np.float32)
        row_of = {text: i for i, text in enumerate(unique)}
        text_vectors = encoded[[row_of[t] for t in texts]]
        if phrases and self._cached is not None:
            self._cached.put(phrases, encoded[[row_of[p] for p in phrases]])
        out: list[Record] = []
        row = 0
        for r in records:
            links: list[str] = []
            if self.linker is not None and r["keyphrases"]:
                links = [link.entity_id for link in self.linker.link_phrases(r["keyphrases"])]
            given = list(r["article"]["entity_ids"])
            n = len(r["passages"])
            out.append(
                {
                    **r,
                    "entity_ids": list(dict.fromkeys([*given, *links])),
                    "article_vector": encode_vector(text_vectors[row]),
                    "passage_vectors": [
                        encode_vector(v) for v in text_vectors[row + 1 : row + 1 + n]
                    ],
                    "embedding_model": self.encoder.name,
                }
            )
            row += 1 + n
        return out


# -- index -------------------------------------------------------------------------


class Sinks(Protocol):
    """Where indexed documents go: the lexical and the semantic store."""

    async def index(self, tenant: str, records: Sequence[Record]) -> None:
        """Insert or replace the documents of ``records`` (embedded records) everywhere."""

    async def delete(self, tenant: str, doc_ids: Sequence[str]) -> None:
        """Remove documents from every store; unknown ids are ignored."""

    async def close(self) -> None: ...
