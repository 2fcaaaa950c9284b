"""Drive a retrieval evaluation through the gRPC APIs of the services.

Signals: ``bm25`` (lexical service), ``dense``, ``kg`` and ``kg_enhanced``
(semantic service). Fusions: ``hybrid`` (BM25 + dense) and ``hybrid_kg``
(BM25 + dense + KG enhanced), plain reciprocal rank fusion with k = 60 and
equal weights, and ``tuned``, the fusion the services use by default (the
settings file written by ``attest eval tune-fusion``). ``all`` asks every
signal once per query and scores every signal and fusion from those lists,
so a comparison indexes and embeds the corpus once.

With a cache folder the indexes, the knowledge-graph links and the per-signal
result lists are kept there, keyed by the corpus's content, and the vector
index and the lists of the semantic signals also by the embedder's
fingerprint (``embedder_key``): a second run on the same data set with the
same embedder skips linking and indexing, one with another embedding model
or backend indexes its own vectors beside the first run's. Services run in
this process on port 0 unless addresses are given.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tqdm import tqdm

from attest.common.v1 import common_pb2
from attest.core.channels import create_channel
from attest.core.server import Servicer, running
from attest.core.settings import ServerSettings
from attest.evaluation.ir import CorpusDoc, Dataset, Run, evaluate
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
from attest.retrieval.fusion import FusionSettings, Ranked, fuse_with, load_fusion_settings
from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc

if TYPE_CHECKING:
    from attest.semantic.settings import SemanticSettings

log = logging.getLogger(__name__)

LEXICAL = "attest.lexical.v1.LexicalService"
SEMANTIC = "attest.semantic.v1.SemanticService"
BackendName = Literal["tantivy", "opensearch", "elasticsearch"]
SIGNAL_NAMES = ("bm25", "dense", "kg", "kg_enhanced")
FUSION_NAMES = ("hybrid", "hybrid_kg", "tuned")
RETRIEVERS = (*SIGNAL_NAMES, *FUSION_NAMES, "all")
# Which signals each retriever needs.
SIGNALS: dict[str, tuple[str, ...]] = {
    "bm25": ("bm25",),
    "dense": ("dense",),
    "kg": ("kg",),
    "kg_enhanced": ("kg_enhanced",),
    "hybrid": ("bm25", "dense"),
    "hybrid_kg": ("bm25", "dense", "kg_enhanced"),
    "all": SIGNAL_NAMES,
}
# Per-signal result lists: query id -> signal -> [(doc id, score)], best first.
SignalLists = dict[str, dict[str, list[tuple[str, float]]]]


def plain_fusions() -> dict[str, FusionSettings]:
    """The untuned baselines: equal-weight RRF, k = 60."""
    return {
        "hybrid": FusionSettings(
            method="rrf", weights={"bm25": 1.0, "dense": 1.0}, default_weight=0.0
        ),
        "hybrid_kg": FusionSettings(
            method="rrf",
            weights={"bm25": 1.0, "dense": 1.0, "kg_enhanced": 1.0},
            default_weight=0.0,
        ),
    }


def signals_of(retriever: str, tuned: FusionSettings) -> tuple[str, ...]:
    if retriever == "tuned":
        used = tuple(s for s in SIGNAL_NAMES if tuned.weight(s) > 0)
        return used or SIGNAL_NAMES
    if retriever == "all":
        return SIGNAL_NAMES
    return SIGNALS[retriever]


def run_of(lists: SignalLists, settings: FusionSettings | None, signal: str = "") -> Run:
    """A trec_eval run from the per-signal lists: one signal, or a fusion of several."""
    run: Run = {}
    for qid, by_signal in lists.items():
        if settings is None:
            ranked: Sequence[tuple[Any, float]] = by_signal.get(signal, [])
        else:
            ranked = fuse_with([Ranked(name, items) for name, items in by_signal.items()], settings)
        # trec_eval ranks by score: keep the order with strictly decreasing pseudo-scores.
        run[qid] = {str(k): float(len(ranked) - i) for i, (k, _) in enumerate(ranked)}
    return run


@dataclass(frozen=True)
class Targets:
    lexical: str | None
    semantic: str | None


@contextlib.asynccontextmanager
async def service_targets(
    *,
    need_lexical: bool,
    need_semantic: bool,
    backend: BackendName,
    lexical_address: str | None,
    semantic_address: str | None,
    data_dir: Path,
    index_name: str,
    semantic_index_name: str | None = None,
) -> AsyncIterator[Targets]:
    """Addresses of the needed services: the given ones, or ones started here."""
    servicers: list[Servicer] = []
    if need_lexical and not lexical_address:
        from attest.lexical.servicer import LexicalServicer
        from attest.lexical.settings import LexicalSettings

        servicers.append(
            LexicalServicer(
                LexicalSettings(backend=backend, data_dir=data_dir, index_name=index_name)
            )
        )
    if need_semantic and not semantic_address:
        from attest.semantic.servicer import SemanticServicer
        from attest.semantic.settings import SemanticSettings

        servicers.append(
            SemanticServicer(
                SemanticSettings(
                    data_dir=data_dir, collection_prefix=semantic_index_name or index_name
                )
            )
        )
    if not servicers:
        yield Targets(lexical_address, semantic_address)
        return
    settings = ServerSettings(host="127.0.0.1", port=0)
    async with running(servicers, settings, ready_timeout=600) as server:
        local = f"127.0.0.1:{server.port}"
        yield Targets(
            lexical_address or (local if need_lexical else None),
            semantic_address or (local if need_semantic else None),
        )


# An index request's documents stay under half the services' default request
# limit (16 MiB), whatever --batch-size says: a batch of long documents is cut
# earlier. A document larger than this goes alone.
BATCH_BYTES = 8 << 20


def _batches(
    docs: Sequence[CorpusDoc], size: int, max_bytes: int = BATCH_BYTES
) -> list[Sequence[CorpusDoc]]:
    """``docs`` in order, at most ``size`` and about ``max_bytes`` of text a batch."""
    out: list[Sequence[CorpusDoc]] = []
    start = used = 0
    for i, doc in enumerate(docs):
        n = len(doc.id) + len(doc.title.encode()) + len(doc.text.encode()) + 64
        if i > start and (i - start == size or used + n > max_bytes):
            out.append(docs[start:i])
            start, used = i, 0
        used += n
    if start < len(docs):
        out.append(docs[start:])
    return out


def corpus_key(data: Dataset) -> str:
    """A short content hash of the corpus: what a cache entry belongs to."""
    h = hashlib.sha256()
    with data.corpus_path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def queries_key(data: Dataset) -> str:
    """A short hash of the judged queries' texts."""
    h = hashlib.sha256()
    for qid, text in sorted(data.judged_queries().items()):
        h.update(f"{qid}\t{text}\n".encode())
    return h.hexdigest()[:12]


def embedder_key(settings: SemanticSettings | None = None) -> str:
    """A short hash of what the semantic service's vectors depend on.

    That is the embedder of ``settings`` (by default the in-process service's,
    from ``ATTEST_SEMANTIC_*``): its model (the packaged name, or the resolved
    directory), the backend it runs on (``auto`` resolved), dimension and
    normalisation. The device and batch
    size are left out: they move vectors by rounding only. The dimension
    needs the model loaded; the service started next reuses it.
    """
    from attest.semantic.embedding import PACKAGED_MINILM, Embedder, resolve_model_path
    from attest.semantic.settings import SemanticSettings

    settings = settings or SemanticSettings()
    model = settings.embedding_model
    embedder = Embedder(model, device=settings.embedding_device, backend=settings.embedding_backend)
    parts = {
        "model": model if model == PACKAGED_MINILM else str(resolve_model_path(model).resolve()),
        "backend": embedder.backend_used,
        "dimension": embedder.dimension,
        # Embedder.encode returns unit vectors whatever the model's own pooling does.
        "normalized": True,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def lists_cache_name(data: Dataset, top_k: int, embedder: str | None) -> str:
    """The cache file of the result lists of ``data``'s judged queries.

    Lists belong to the queries asked as well as to the corpus, and when
    they hold semantic signals to the embedder (``embedder_key``) too.
    """
    per_embedder = f"-{embedder}" if embedder else ""
    return f"lists-{top_k}-{queries_key(data)}{per_embedder}.json.gz"


def default_cache_dir(data: Dataset, root: Path = Path(".attest") / "eval" / "cache") -> Path:
    return root / f"{data.name}-{corpus_key(data)}"


class _Cache:
    """What an earlier run on the same corpus left: indexes, links, result lists.

    ``state.json`` records which stores hold the whole corpus; it is written
    only after a store's indexing finished, so an interrupted run indexes
    again (indexing is an upsert).
    """

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self._state: dict[str, Any] = {}
        if root is not None:
            root.mkdir(parents=True, exist_ok=True)
            path = root / "state.json"
            if path.is_file():
                with contextlib.suppress(OSError, ValueError):
                    state = json.loads(path.read_text(encoding="utf-8"))
                    self._state = state if isinstance(state, dict) else {}

    def has(self, key: str) -> bool:
        return bool(self._state.get(key))

    def mark(self, key: str, value: Any = True) -> None:
        if self.root is None:
            return
        self._state[key] = value
        tmp = self.root / "state.json.tmp"
        tmp.write_text(json.dumps(self._state, indent=2) + "\n", encoding="utf-8")
        tmp.replace(self.root / "state.json")

    def load_json(self, name: str) -> Any:
        """A cached value, or None when absent or unreadable (it is then recomputed)."""
        if self.root is None or not (self.root / name).is_file():
            return None
        try:
            with gzip.open(self.root / name, "rt", encoding="utf-8") as f:
                return json.load(f)
        except (OSError, EOFError, ValueError) as exc:
            log.warning("ignoring the unreadable cache file %s: %s", self.root / name, exc)
            return None

    def save_json(self, name: str, value: Any) -> None:
        if self.root is None:
            return
        tmp = self.root / f"{name}.tmp"
        with gzip.open(tmp, "wt", encoding="utf-8") as f:
            json.dump(value, f)
        tmp.replace(self.root / name)


async def signal_lists(
    data: Dataset,
    signals: Sequence[str],
    *,
    backend: BackendName = "tantivy",
    address: str | None = None,
    semantic_address: str | None = None,
    data_dir: Path,
    cache_dir: Path | None = None,
    batch_size: int = 200,
    concurrency: int = 8,
    top_k: int = 100,
    reuse_lists: bool = False,
) -> tuple[SignalLists, dict[str, float]]:
    """Every judged query's result list from each signal, and the time each step took.

    With ``cache_dir`` the in-process indexes live there (``data_dir`` is then
    unused for them) and the lists are saved there; with ``reuse_lists`` too,
    lists saved by an earlier run for the same signals and depth are read back
    instead of asked again (the index is reused either way; the lists only when
    asked, since they depend on the scoring code and settings of that run).
    """
    cache = _Cache(cache_dir)
    timings: dict[str, float] = {}
    need_lexical = "bm25" in signals
    need_semantic = any(s != "bm25" for s in signals)
    need_links = any(s.startswith("kg") for s in signals)
    local = address is None and semantic_address is None
    # A store started here keeps its index in the cache; a remote one (or an
    # OpenSearch/Elasticsearch index) is indexed on every run.
    lexical_cached = cache.root is not None and address is None and backend == "tantivy"
    semantic_cached = cache.root is not None and semantic_address is None
    # Vectors belong to the embedder as well as to the corpus.
    embedder = embedder_key() if semantic_cached and need_semantic else None
    per_embedder = f"-{embedder}" if embedder else ""
    lists_key = lists_cache_name(data, top_k, embedder)
    cached = cache.load_json(lists_key) if reuse_lists and local else None
    if (
        cached is not None
        and set(data.judged_queries()) <= set(cached)
        and all(s in by for by in cached.values() for s in signals)
    ):
        return {
            q: {s: [(d, float(v)) for d, v in by[s]] for s in signals} for q, by in cached.items()
        }, timings
    store_dir = cache.root / "index" if cache.root is not None else data_dir
    docs = [d for d in data.corpus() if d.title.strip() or d.text.strip()]
    index_name = f"attest-eval-{data.name.lower()}"
    index_lexical = need_lexical and not (lexical_cached and cache.has("lexical"))
    index_semantic = need_semantic and not (
        semantic_cached
        and cache.has(f"semantic{per_embedder}")
        and (cache.has(f"semantic_links{per_embedder}") or not need_links)
    )

    async with service_targets(
        need_lexical=need_lexical,
        need_semantic=need_semantic,
        backend=backend,
        lexical_address=address,
        semantic_address=semantic_address,
        data_dir=store_dir if (lexical_cached or semantic_cached) else data_dir,
        index_name=index_name,
        semantic_index_name=f"{index_name}{per_embedder}",
    ) as targets:
        channels = []
        lexical = semantic = None
        if targets.lexical:
            ch = create_channel(
                targets.lexical, idempotent=[(LEXICAL, "Search"), (LEXICAL, "Index")]
            )
            channels.append(ch)
            lexical = lexical_pb2_grpc.LexicalServiceStub(ch)
        if targets.semantic:
            ch = create_channel(
                targets.semantic, idempotent=[(SEMANTIC, "Search"), (SEMANTIC, "Index")]
            )
            channels.append(ch)
            semantic = semantic_pb2_grpc.SemanticServiceStub(ch)
        try:
            links: dict[str, list[str]] = {}
            if need_links and index_semantic:
                links = cache.load_json("links.json.gz") or {}
                if not links:
                    started = time.perf_counter()
                    links = await asyncio.to_thread(_link, docs, batch_size)
                    timings["link_seconds"] = time.perf_counter() - started
                    timings["links_per_second"] = len(docs) / max(timings["link_seconds"], 1e-9)
                    cache.save_json("links.json.gz", links)
            if index_lexical or index_semantic:
                started = time.perf_counter()
                with tqdm(total=len(docs), desc="index", unit="doc") as bar:
                    for batch in _batches(docs, batch_size):
                        protos = [
                            common_pb2.Document(
                                id=d.id, title=d.title, body=d.text, entity_ids=links.get(d.id, [])
                            )
                            for d in batch
                        ]
                        if index_lexical and lexical is not None:
                            await lexical.Index(
                                lexical_pb2.IndexRequest(documents=protos, refresh=True),
                                timeout=300,
                            )
                        if index_semantic and semantic is not None:
                            await semantic.Index(
                                semantic_pb2.IndexRequest(
                                    documents=[
                                        semantic_pb2.IndexDocument(document=p) for p in protos
                                    ]
                                ),
                                timeout=600,
                            )
                        bar.update(len(batch))
                timings["index_seconds"] = time.perf_counter() - started
                if index_lexical and lexical_cached:
                    cache.mark("lexical")
                if index_semantic and semantic_cached:
                    cache.mark(f"semantic{per_embedder}")
                    cache.mark(f"semantic_links{per_embedder}", need_links)

            queries = data.judged_queries()
            out: SignalLists = {}
            gate = asyncio.Semaphore(concurrency)
            semantic_modes = {
                "dense": (semantic_pb2.SEARCH_MODE_DENSE, semantic_pb2.KG_VARIANT_UNSPECIFIED),
                "kg": (semantic_pb2.SEARCH_MODE_KG, semantic_pb2.KG_VARIANT_PLAIN),
                "kg_enhanced": (semantic_pb2.SEARCH_MODE_KG, semantic_pb2.KG_VARIANT_ENHANCED),
            }

            async def one(qid: str, text: str) -> None:
                text = text[:4096]
                by_signal: dict[str, list[tuple[str, float]]] = {}
                async with gate:
                    if "bm25" in signals and lexical is not None:
                        r = await lexical.Search(
                            lexical_pb2.SearchRequest(query=text, top_k=top_k), timeout=60
                        )
                        by_signal["bm25"] = [(h.doc_id, h.score) for h in r.hits]
                    for signal, (mode, variant) in semantic_modes.items():
                        if signal in signals and semantic is not None:
                            s = await semantic.Search(
                                semantic_pb2.SearchRequest(
                                    query=text, top_k=top_k, mode=mode, kg_variant=variant
                                ),
                                timeout=60,
                            )
                            by_signal[signal] = [(h.doc_id, h.score) for h in s.hits]
                out[qid] = by_signal

            started = time.perf_counter()
            tasks = [asyncio.create_task(one(q, t)) for q, t in queries.items()]
            for task in tqdm(asyncio.as_completed(tasks), total=len(tasks), desc="search"):
                await task
            timings["search_seconds"] = time.perf_counter() - started
        finally:
            for ch in channels:
                await ch.close()
    if local:
        merged = cache.load_json(lists_key) or {}
        for qid, by_signal in out.items():
            merged.setdefault(qid, {}).update(by_signal)
        cache.save_json(lists_key, merged)
    return out, timings


async def run_ir_eval(
    data: Dataset,
    *,
    retriever: str = "bm25",
    backend: BackendName = "tantivy",
    address: str | None = None,
    semantic_address: str | None = None,
    data_dir: Path,
    cache_dir: Path | None = None,
    tuned: FusionSettings | None = None,
    batch_size: int = 200,
    concurrency: int = 8,
    top_k: int = 100,
) -> dict[str, Any]:
    """Metrics of one retriever, or with ``retriever="all"`` of every signal and
    fusion (under ``"retrievers"``), from one indexing of the corpus."""
    tuned = tuned or load_fusion_settings()
    started = time.perf_counter()
    lists, timings = await signal_lists(
        data,
        signals_of(retriever, tuned),
        backend=backend,
        address=address,
        semantic_address=semantic_address,
        data_dir=data_dir,
        cache_dir=cache_dir,
        batch_size=batch_size,
        concurrency=concurrency,
        top_k=top_k,
    )
    fusions: dict[str, FusionSettings] = {**plain_fusions(), "tuned": tuned}
    names = [*SIGNAL_NAMES, *FUSION_NAMES] if retriever == "all" else [retriever]
    per: dict[str, dict[str, float]] = {}
    for name in names:
        run = run_of(lists, fusions.get(name), name)
        per[name] = dict(evaluate(data.qrels, run))
    skipped = data.corpus_size() - sum(
        1 for d in data.corpus() if d.title.strip() or d.text.strip()
    )
    timings["wall_seconds"] = time.perf_counter() - started
    metrics: dict[str, Any] = dict(per[names[0]]) if retriever != "all" else {}
    if retriever == "all":
        metrics["retrievers"] = per
        metrics["tuned_fusion"] = tuned.describe()
    metrics["empty_documents_skipped"] = skipped
    metrics.update({k: round(v, 3) for k, v in timings.items()})
    return metrics


def linked_documents(cache_dir: Path) -> tuple[int, int] | None:
    """(documents with at least one knowledge-graph link, documents) from the
    links a run left in ``cache_dir``; None when it left none."""
    if not (cache_dir / "links.json.gz").is_file():
        return None  # nothing to read, and no cache folder made for it
    links = _Cache(cache_dir).load_json("links.json.gz")
    if not isinstance(links, dict) or not links:
        return None
    return sum(1 for entities in links.values() if entities), len(links)


def _link(docs: Sequence[CorpusDoc], batch_size: int) -> dict[str, list[str]]:
    """Knowledge-graph links of every document, as ingestion would make them."""
    from attest.knowledge.graph import load_graph
    from attest.knowledge.linking import EntityLinker
    from attest.semantic.embedding import Embedder

    linker = EntityLinker(load_graph(), Embedder().encode)
    linker.warm_up()
    out: dict[str, list[str]] = {}
    for batch in tqdm(_batches(docs, batch_size), desc="link", unit="batch"):
        for doc, found in zip(
            batch, linker.link_many([(d.title, d.text) for d in batch]), strict=True
        ):
            out[doc.id] = [link.entity_id for link in found]
    return out


def lists_from_json(raw: Mapping[str, Any]) -> SignalLists:
    return {
        q: {s: [(d, float(v)) for d, v in items] for s, items in by.items()}
        for q, by in raw.items()
    }
