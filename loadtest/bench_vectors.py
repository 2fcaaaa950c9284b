"""Embedded vector search at 100,000 passages: qdrant-edge against qdrant-client local mode.

Issue 3, build item 5: the embedded default must stay fast at 100,000
passages. This command measures both embedded candidates through the store the
service uses (``attest.semantic.store``), each in a fresh process:

* build time: upserting every point in batches of 1,000, as ingestion does,
  then indexing what is left (qdrant-edge builds HNSW graphs in ``optimize``);
  also the longest stall of the asyncio event loop while building
  (qdrant-edge 0.9 holds the GIL while it optimizes);
* memory: the process's RSS growth from before the store opened to after the
  searches (and the peak growth), plus the store's size on disk;
* search latency p50/p99 over ``--queries`` questions with no filter (the
  tenant only), with a date window holding ~10% of the points, and with an
  organization filter (Reuters ``orgs``, a few % of the points);
* recall@10 against exact (numpy) search under the same filter; a hit whose
  exact score ties the 10th best counts (Reuters repeats some passages), and
  the strict by-id figure is in the JSON.

qdrant-client's local mode runs ``:memory:`` unless ``--local-path`` (its
on-disk mode also writes every upsert to SQLite, which makes building far
slower; search is the same brute force in Python).

Passages are Reuters-21578 bodies split on sentence boundaries into ~200-token
passages and embedded with the packaged all-MiniLM-L6-v2 (cached in
``/tmp/attest-bench-vectors-<N>.npy``; chunks in ``/tmp/attest-bench-chunks-*``
so an interrupted run resumes). The queries are the headlines of
``--queries`` random Reuters articles, embedded the same way: real questions,
held out from the index (headlines are never indexed here).

When fewer than ``--tile-to`` real vectors exist (this corpus gives ~26,500
passages of ~200 tokens, and a 2-core machine embeds ~10 per second), the run
also measures a set of ``--tile-to`` vectors made of the real ones plus copies
with Gaussian noise (sigma ``--noise`` per dimension, then re-normalised; each
copy keeps its source's payload). The report says which set is which.

    python loadtest/bench_vectors.py --limit 8192 --tile-to 100000

Writes a table to stdout and JSON to loadtest/reports/vectors.json. Exits 1
when qdrant-edge misses a target (p50 <= 20 ms with and without a filter,
recall@10 >= 0.95) at the tile-to size. A benchmark command, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from attest.semantic.store import (
    EdgeVectorStore,
    HnswParams,
    Point,
    QdrantVectorStore,
    VectorFilter,
)

HERE = Path(__file__).resolve().parent
# The public data folder lies beside the repository.
DEFAULT_CORPUS = Path(__file__).resolve().parents[2] / "shared/data/news/reuters21578.jsonl"
DEFAULT_OUTPUT = HERE / "reports" / "vectors.json"
CACHE_DIR = Path("/tmp")
# Passage sizes in tokens, coarse first: the ~200-token passages the service
# indexes, then finer splits of the same bodies until the corpus reaches N.
GRANULARITIES = (200, 100, 50, 25)
EMBED_CHUNK = 1024

Vectors = npt.NDArray[np.float32]

_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[\"'(A-Z0-9])")
_TOKEN = re.compile(r"\w+|[^\w\s]")
_SPACE = re.compile(r"\s+")
_DATE = re.compile(r"\s*(\d{1,2})-([A-Za-z]{3})-(\d{4})(?:\s+(\d+):(\d+):(\d+))?")


@dataclass(frozen=True)
class Article:
    doc_id: str
    title: str
    body: str
    published_at: datetime
    organizations: tuple[str, ...]


@dataclass(frozen=True)
class Passage:
    article: int  # index into the article list
    granularity: int
    index: int  # passage index within the article at this granularity
    text: str


def load_articles(path: Path) -> list[Article]:
    articles = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            raw = json.loads(line)
            body = _SPACE.sub(" ", raw.get("body") or "").strip()
            if not body:
                continue
            published = parse_reuters_date(raw["date"])
            articles.append(
                Article(
                    doc_id=str(raw["id"]),
                    title=_SPACE.sub(" ", raw.get("title") or "").strip(),
                    body=body,
                    published_at=published,
                    organizations=tuple(raw.get("orgs") or ()),
                )
            )
    return articles


def parse_reuters_date(text: str) -> datetime:
    """``26-FEB-1987 15:01:01.79``; a garbled time (a few records have one) reads as midnight."""
    match = _DATE.match(text)
    if match is None:
        raise ValueError(f"unreadable Reuters date {text!r}")
    day, month, year, hour, minute, second = match.groups()
    published = datetime.strptime(f"{day}-{month}-{year}", "%d-%b-%Y").replace(tzinfo=UTC)
    if hour is not None and int(hour) < 24 and int(minute) < 60 and int(second) < 60:
        published = published.replace(hour=int(hour), minute=int(minute), second=int(second))
    return published


def split_passages(body: str, max_tokens: int) -> list[str]:
    """Sentences packed greedily into passages of at most ``max_tokens`` tokens."""
    passages: list[str] = []
    current: list[str] = []
    size = 0
    for sentence in _SENTENCE.split(body):
        tokens = len(_TOKEN.findall(sentence))
        if current and size + tokens > max_tokens:
            passages.append(" ".join(current))
            current, size = [], 0
        current.append(sentence)
        size += tokens
    if current:
        passages.append(" ".join(current))
    return passages


def build_passages(
    articles: list[Article], limit: int, granularities: tuple[int, ...] = GRANULARITIES
) -> list[Passage]:
    out: list[Passage] = []
    for granularity in granularities:
        for i, article in enumerate(articles):
            for j, text in enumerate(split_passages(article.body, granularity)):
                out.append(Passage(i, granularity, j, text))
                if len(out) == limit:
                    return out
    return out


def embed_cached(texts: list[str], cache: Path, what: str) -> Vectors:
    """MiniLM vectors of ``texts``, cached in ``cache``.

    Embedding runs in chunks that are saved as they finish, so an interrupted
    run resumes; the chunk files depend only on the passage order, which does
    not depend on ``--limit``.
    """
    if cache.is_file():
        vectors = np.load(cache)
        if vectors.shape[0] == len(texts):
            print(f"{what}: {len(texts)} vectors from {cache}", file=sys.stderr)
            return np.asarray(vectors, dtype=np.float32)
    from attest.semantic.embedding import Embedder

    embedder = Embedder(batch_size=64)
    chunk_dir = cache.parent / f"{cache.name.split('-')[0]}-bench-chunks-{what}"
    chunk_dir.mkdir(exist_ok=True)
    chunks = []
    started = time.perf_counter()
    fresh = 0
    for lo in range(0, len(texts), EMBED_CHUNK):
        part = texts[lo : lo + EMBED_CHUNK]
        path = chunk_dir / f"{lo}-{len(part)}.npy"
        if path.is_file():
            chunks.append(np.load(path))
            continue
        chunks.append(embedder.encode(part))
        np.save(path, chunks[-1])
        fresh += len(part)
        rate = fresh / (time.perf_counter() - started)
        done = lo + len(part)
        print(f"{what}: embedded {done}/{len(texts)} ({rate:.0f}/s)", file=sys.stderr, flush=True)
    vectors = np.concatenate(chunks).astype(np.float32)
    np.save(cache, vectors)
    return vectors


TENANT = "bench"
TOP_K = 10
BUILD_BATCH = 1000
TARGET_P50_MS = 20.0
TARGET_RECALL = 0.95


# -- the data set --------------------------------------------------------------------


@dataclass(frozen=True)
class DataSet:
    """What one store run indexes and asks, shared with its worker process by file."""

    label: str  # "real" or "tiled"
    vectors: Path  # (n, dim) float32 .npy
    payloads: Path  # JSON list of {"doc_id", "passage_index", "published_at", "organizations"}
    queries: Path  # (q, dim) float32 .npy


def passage_payloads(articles: list[Article], passages: list[Passage]) -> list[dict[str, Any]]:
    out = []
    for p in passages:
        a = articles[p.article]
        out.append(
            {
                "doc_id": f"{a.doc_id}/{p.granularity}",
                "passage_index": p.index,
                "published_at": int(a.published_at.timestamp()),
                "organizations": list(a.organizations),
            }
        )
    return out


def tile(
    vectors: Vectors, payloads: list[dict[str, Any]], size: int, sigma: float, seed: int
) -> tuple[Vectors, list[dict[str, Any]]]:
    """``size`` vectors: the real ones, then noisy copies of them in turn."""
    rng = np.random.default_rng(seed)
    n = vectors.shape[0]
    parts = [vectors]
    tiled = list(payloads)
    copy = 1
    while sum(x.shape[0] for x in parts) < size:
        take = min(n, size - sum(x.shape[0] for x in parts))
        noisy = vectors[:take] + rng.normal(0.0, sigma, (take, vectors.shape[1]))
        noisy /= np.linalg.norm(noisy, axis=1, keepdims=True)
        parts.append(noisy.astype(np.float32))
        tiled.extend({**pl, "doc_id": f"{pl['doc_id']}#copy{copy}"} for pl in payloads[:take])
        copy += 1
    return np.concatenate(parts)[:size], tiled[:size]


# -- filters and exact search -----------------------------------------------------------


@dataclass(frozen=True)
class FilterCase:
    name: str
    flt: VectorFilter
    share: float  # fraction of the points it matches


def filter_cases(
    payloads: list[dict[str, Any]],
) -> tuple[list[FilterCase], list[npt.NDArray[np.bool_]]]:
    dates = np.array([p["published_at"] for p in payloads], dtype=np.int64)
    # A window around the median date holding ~10% of the points.
    lo, hi = np.quantile(dates, [0.45, 0.55]).astype(np.int64)
    in_window = (dates >= lo) & (dates <= hi)
    orgs = ("ec", "imf", "opec", "worldbank", "gatt")
    has_org = np.array([bool(set(p["organizations"]) & set(orgs)) for p in payloads])
    everything = np.ones(len(payloads), dtype=bool)
    cases = [
        FilterCase("none", VectorFilter(tenant=TENANT), 1.0),
        FilterCase(
            "date~10%",
            VectorFilter(
                tenant=TENANT,
                published_from=datetime.fromtimestamp(int(lo), tz=UTC),
                published_to=datetime.fromtimestamp(int(hi), tz=UTC),
            ),
            float(in_window.mean()),
        ),
        FilterCase(
            "org",
            VectorFilter(tenant=TENANT, keywords={"organizations": orgs}),
            float(has_org.mean()),
        ),
    ]
    return cases, [everything, in_window, has_org]


def exact_top(
    vectors: Vectors, mask: npt.NDArray[np.bool_], query: Vectors, k: int
) -> tuple[list[int], float]:
    """Row numbers of the exact top ``k`` among ``mask``, and the k-th best score."""
    rows = np.flatnonzero(mask)
    scores = vectors[rows] @ query
    k = min(k, rows.size)
    best = np.argpartition(-scores, k - 1)[:k]
    best = best[np.argsort(-scores[best])]
    return rows[best].tolist(), float(scores[best[-1]])


# -- one store, in its own process ---------------------------------------------------------


def rss_kib(field: str = "VmRSS") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def disk_bytes(directory: Path) -> int:
    # Allocated blocks, not file sizes: the WAL and mmap files are sparse.
    return sum(f.stat().st_blocks * 512 for f in directory.rglob("*") if f.is_file())


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


class LoopWatch:
    """The longest gap between ticks of a 10 ms heartbeat: how long the loop stalled."""

    def __init__(self) -> None:
        self.longest = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _beat(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            self.longest = max(self.longest, now - last - 0.01)
            last = now

    def __enter__(self) -> LoopWatch:
        self._task = asyncio.get_running_loop().create_task(self._beat())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()


def make_store(
    engine: str, directory: Path, dim: int, hnsw: HnswParams, points: int, local_path: bool
) -> tuple[EdgeVectorStore | QdrantVectorStore, dict[str, Any]]:
    """The store under test, and the settings that differ from its defaults."""
    if engine == "qdrant-edge":
        # The store leaves fewer than index_after points to brute force; a
        # smaller set gets a lower threshold so that its search does walk
        # HNSW graphs, which is what its recall is measured for.
        index_after = 10_000 if points >= 40_000 else max(1_000, points // 8)
        store = EdgeVectorStore(
            directory, collection_prefix="bench", dimension=dim, hnsw=hnsw, index_after=index_after
        )
        return store, {"index_after": index_after}
    if local_path:
        local = QdrantVectorStore(
            collection_prefix="bench", dimension=dim, path=directory, hnsw=hnsw
        )
        return local, {"local_mode": "path (persisted to SQLite)"}
    memory = QdrantVectorStore(
        collection_prefix="bench", dimension=dim, location=":memory:", hnsw=hnsw
    )
    return memory, {"local_mode": ":memory:"}


async def measure_store(
    engine: str,
    data: DataSet,
    hnsw: HnswParams,
    efs: list[int],
    max_queries: int,
    local_path: bool,
) -> dict[str, Any]:
    vectors = np.load(data.vectors)
    payloads = json.loads(data.payloads.read_text())
    queries = np.load(data.queries)[:max_queries]
    cases, masks = filter_cases(payloads)
    points = [
        Point(
            doc_id=pl["doc_id"],
            passage_index=pl["passage_index"],
            vector=vectors[i],
            payload={"published_at": pl["published_at"], "organizations": pl["organizations"]},
        )
        for i, pl in enumerate(payloads)
    ]
    row_of = {(pl["doc_id"], pl["passage_index"]): i for i, pl in enumerate(payloads)}
    truths = [[exact_top(vectors, m, q, TOP_K) for q in queries] for m in masks]

    directory = Path(tempfile.mkdtemp(prefix=f"bench-{engine}-"))
    rss_before = rss_kib()
    hwm_before = rss_kib("VmHWM")
    store, settings = make_store(engine, directory, vectors.shape[1], hnsw, len(points), local_path)
    result: dict[str, Any] = {
        "engine": engine,
        "set": data.label,
        "points": len(points),
        "settings": settings,
    }
    try:
        started = time.perf_counter()
        with LoopWatch() as watch:
            await store.warm_up()
            for lo in range(0, len(points), BUILD_BATCH):
                await store.upsert("passages", TENANT, points[lo : lo + BUILD_BATCH])
            upserted = time.perf_counter()
            if isinstance(store, EdgeVectorStore):
                await store.optimize()
        finished = time.perf_counter()
        result["upsert_s"] = round(upserted - started, 1)
        result["build_s"] = round(finished - started, 1)
        result["loop_stall_max_s"] = round(watch.longest, 2)
        if isinstance(store, EdgeVectorStore):
            status = await store.index_status("passages")
            result["indexed_vectors"] = status.indexed_vectors
            result["segments"] = status.segments
        assert await store.count("passages", TENANT) == len(points)

        searches = []
        for ef in efs if isinstance(store, EdgeVectorStore) else efs[:1]:
            store.hnsw = HnswParams(hnsw.m, hnsw.ef_construct, ef)
            for case, truth in zip(cases, truths, strict=True):
                warm = 5 if isinstance(store, EdgeVectorStore) else 1
                for q in queries[:warm]:  # warm the caches and the thread pool
                    await store.search("passages", q, TOP_K, case.flt)
                latencies, recall_ids, recall_ties = [], [], []
                for q, (rows, kth) in zip(queries, truth, strict=True):
                    t = time.perf_counter()
                    hits = await store.search("passages", q, TOP_K, case.flt)
                    latencies.append((time.perf_counter() - t) * 1000)
                    got = [row_of[(h.doc_id, h.passage_index)] for h in hits]
                    recall_ids.append(len(set(got) & set(rows)) / len(rows))
                    # A hit whose exact score ties the k-th best is as good as
                    # the one it displaced (Reuters repeats some passages).
                    good = sum(float(vectors[r] @ q) >= kth - 1e-6 for r in got)
                    recall_ties.append(min(good, len(rows)) / len(rows))
                searches.append(
                    {
                        "filter": case.name,
                        "share": round(case.share, 3),
                        "ef": ef if isinstance(store, EdgeVectorStore) else None,
                        "p50_ms": round(percentile(latencies, 50), 2),
                        "p99_ms": round(percentile(latencies, 99), 2),
                        "recall_at_10": round(float(np.mean(recall_ties)), 4),
                        "recall_at_10_by_id": round(float(np.mean(recall_ids)), 4),
                        "queries": len(latencies),
                    }
                )
        result["searches"] = searches
        result["rss_delta_mib"] = round((rss_kib() - rss_before) / 1024, 1)
        result["peak_rss_delta_mib"] = round((rss_kib("VmHWM") - hwm_before) / 1024, 1)
    finally:
        await store.close()
        result["disk_mib"] = round(disk_bytes(directory) / 2**20, 1)
        shutil.rmtree(directory, ignore_errors=True)
    return result


def _worker(conn: Any, engine: str, data: DataSet, *args: Any) -> None:
    try:
        conn.send(asyncio.run(measure_store(engine, data, *args)))
    except BaseException as exc:
        conn.send({"engine": engine, "set": data.label, "error": repr(exc)})
        raise


def run_isolated(engine: str, data: DataSet, *args: Any) -> dict[str, Any]:
    """``measure_store`` in a fresh process, so its memory figures are its own."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_worker, args=(child, engine, data, *args))
    proc.start()
    child.close()
    result: dict[str, Any] = parent.recv()
    proc.join()
    return result


# -- report -----------------------------------------------------------------------------


def table(results: list[dict[str, Any]]) -> str:
    head = (
        f"{'set':<6} {'engine':<13} {'points':>7} {'segs':>4} {'build s':>8} {'stall s':>8} "
        f"{'RSS MiB':>8} "
        f"{'disk MiB':>8} {'filter':<9} {'share':>6} {'ef':>4} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'recall@10':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        if "error" in r:
            lines.append(f"{r['set']:<6} {r['engine']:<13} failed: {r['error']}")
            continue
        for s in r["searches"]:
            lines.append(
                f"{r['set']:<6} {r['engine']:<13} {r['points']:>7} {r.get('segments', '-'):>4} "
                f"{r['build_s']:>8} "
                f"{r['loop_stall_max_s']:>8} {r['rss_delta_mib']:>8} {r['disk_mib']:>8} "
                f"{s['filter']:<9} {s['share']:>6} {s['ef'] or '-':>4} {s['p50_ms']:>7} "
                f"{s['p99_ms']:>7} {s['recall_at_10']:>9}"
            )
    return "\n".join(lines)


def misses(result: dict[str, Any], ef: int) -> list[str]:
    out = []
    for s in result.get("searches", []):
        if s["ef"] != ef:
            continue
        if s["p50_ms"] > TARGET_P50_MS:
            out.append(f"{result['set']} {s['filter']}: p50 {s['p50_ms']} ms > {TARGET_P50_MS}")
        if s["recall_at_10"] < TARGET_RECALL:
            out.append(
                f"{result['set']} {s['filter']}: recall {s['recall_at_10']} < {TARGET_RECALL}"
            )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--limit", type=int, default=100_000, help="real passages to embed and index"
    )
    parser.add_argument(
        "--tile-to", type=int, default=100_000, help="also measure this many tiled vectors (0: no)"
    )
    parser.add_argument("--noise", type=float, default=0.02, help="sigma per dimension for copies")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument(
        "--local-queries",
        type=int,
        default=200,
        help="queries for qdrant-client local mode (brute force in Python: slow at 100k)",
    )
    parser.add_argument("--engine", action="append", choices=["qdrant-edge", "qdrant-local"])
    parser.add_argument(
        "--local-path",
        action="store_true",
        help="qdrant-local persists to disk (SQLite; far slower to build) instead of :memory:",
    )
    parser.add_argument("--m", type=int, default=HnswParams.m)
    parser.add_argument("--ef-construct", type=int, default=HnswParams.ef_construct)
    parser.add_argument(
        "--ef", type=int, action="append", help=f"search ef to try (default {HnswParams.ef})"
    )
    parser.add_argument(
        "--passage-tokens",
        type=int,
        action="append",
        help="passage sizes in tokens, coarse first, until --limit passages "
        f"(default {' '.join(map(str, GRANULARITIES))}); 50 alone embeds ~4x faster than 200",
    )
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--seed", type=int, default=1987)
    args = parser.parse_args(argv)
    engines = args.engine or ["qdrant-edge", "qdrant-local"]
    efs = args.ef or [HnswParams.ef]
    hnsw = HnswParams(m=args.m, ef_construct=args.ef_construct, ef=efs[0])

    articles = load_articles(args.corpus)
    sizes = tuple(args.passage_tokens or GRANULARITIES)
    passages = build_passages(articles, args.limit, sizes)
    vectors = embed_cached(
        [p.text for p in passages],
        CACHE_DIR / f"attest-bench-vectors-{len(passages)}-{'-'.join(map(str, sizes))}.npy",
        f"passages-{'-'.join(map(str, sizes))}",
    )
    payloads = passage_payloads(articles, passages)
    rng = np.random.default_rng(args.seed)
    picked = rng.choice(len(articles), size=args.queries, replace=False)
    titles = [articles[i].title or articles[i].body[:120] for i in picked]
    queries = embed_cached(
        titles,
        CACHE_DIR / f"attest-bench-queries-{args.seed}-{args.queries}.npy",
        f"queries-{args.seed}",
    )

    work = Path(tempfile.mkdtemp(prefix="attest-bench-vectors-"))
    sets: list[DataSet] = []
    np.save(work / "queries.npy", queries)

    def save(label: str, v: Vectors, pl: list[dict[str, Any]]) -> None:
        np.save(work / f"{label}.npy", v)
        (work / f"{label}.json").write_text(json.dumps(pl))
        sets.append(
            DataSet(label, work / f"{label}.npy", work / f"{label}.json", work / "queries.npy")
        )

    save("real", vectors, payloads)
    if args.tile_to > len(passages):
        tiled, tiled_payloads = tile(vectors, payloads, args.tile_to, args.noise, args.seed)
        save("tiled", tiled, tiled_payloads)

    results = []
    try:
        for data in sets:
            for engine in engines:
                limit = args.local_queries if engine == "qdrant-local" else args.queries
                print(
                    f"measuring {engine} on the {data.label} set ...", file=sys.stderr, flush=True
                )
                results.append(run_isolated(engine, data, hnsw, efs, limit, args.local_path))
                print(table(results[-1:]), file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(table(results))
    largest = results[-len(engines) :]
    failed = [m for r in largest if r["engine"] == "qdrant-edge" for m in misses(r, efs[0])]
    report = {
        "benchmark": "embedded dense search (issue 3, item 5)",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "sets": {
            "real": {
                "points": len(passages),
                "vectors": "real all-MiniLM-L6-v2 embeddings of Reuters-21578 passages "
                f"(at most {'/'.join(map(str, sizes))} tokens, sentence boundaries)",
                "passages_by_size": {
                    str(g): sum(p.granularity == g for p in passages) for g in sizes
                },
            },
            **(
                {
                    "tiled": {
                        "points": args.tile_to,
                        "vectors": f"the real vectors plus copies with N(0, {args.noise}^2) "
                        "noise per dimension, re-normalised",
                    }
                }
                if args.tile_to > len(passages)
                else {}
            ),
        },
        "queries": f"{args.queries} Reuters headlines embedded with the same model (held out)",
        "hnsw": asdict(hnsw),
        "efs": efs,
        "targets": {"p50_ms": TARGET_P50_MS, "recall_at_10": TARGET_RECALL},
        "target_misses": failed,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "qdrant-client": version("qdrant-client"),
            "qdrant-edge-py": version("qdrant-edge-py"),
        },
        "results": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}", file=sys.stderr)
    if failed:
        print("qdrant-edge misses a target:\n  " + "\n  ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
