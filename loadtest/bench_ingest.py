"""Ingestion end to end against the bare embedding throughput of the same passages.

Issue 4's benchmark: ``--docs`` Reuters-21578 articles (those with a body)
go through the whole pipeline and the figures are set next to what the
embedding model alone does with the same passages on the same machine in the
same run, which bounds the pipeline on a CPU:

* celery: the ingest service in celery mode, Celery workers (enrich+index,
  embed) on Redis, the lexical service on OpenSearch and the semantic service
  on the embedded vector engine, each its own process (the integration tests'
  stack); timed from the first IngestStream message to DONE as WatchJob reports it;
* inline: the embedded mode, every stage in one process on tantivy and the
  embedded vector engine, no Redis.

The bare figure embeds the passages ("title\\npassage", as the pipeline does)
with the packaged all-MiniLM-L6-v2 in this process, after the pipeline runs,
with nothing else running. The method embeds more than the passages: each
article's title with its summary (the article record), every distinct RAKE
keyphrase (the KG links) and each headline (a KG scoring attribute). Those
are timed the same way right after, so the report also gives the pipeline's
share of all the model work the method needs ("of model"), which separates
the cost of the method from the cost of the pipeline around the model.

    python loadtest/bench_ingest.py --docs 5000 --redis-url redis://127.0.0.1:6379 \\
        --opensearch-url http://127.0.0.1:9200

``--backends torch,auto`` instead compares embedding backends, on the inline
mode unless ``--modes`` names celery too (alternating, ``--rounds`` each, a
fresh data dir and, for celery, fresh workers and services per run), and
prints each run's docs/s and the ratios per round.

Writes a table to stdout and JSON to loadtest/reports/ingest.json. Exits 1
when the celery mode reaches less than ``--target`` (0.8) of the bare
passage throughput. A benchmark command, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.ingest_stack import (  # noqa: E402
    Stack,
    reuters_lines,
    stream_items,
)

REPORT = ROOT / "loadtest/reports/ingest.json"


def run_celery(lines: list[bytes], redis_url: str, opensearch: str, tmp: Path) -> dict[str, Any]:
    from attest.ingest.v1 import ingest_pb2

    stack = Stack(tmp, redis_url, opensearch)
    stack.configure(threads=None)
    try:
        stack.start()
        stub = stack.ingest
        cpu_before = {name: _tree_cpu_seconds(p.pid) for name, p in stack.procs.items()}
        machine_before = _machine_cpu_seconds()
        started = time.perf_counter()
        response = stub.IngestStream(stream_items(lines, "reuters.jsonl"), timeout=600)
        last = None
        for update in stub.WatchJob(
            ingest_pb2.WatchJobRequest(job_id=response.job.job_id), timeout=7200
        ):
            last = update
        elapsed = time.perf_counter() - started
        assert last is not None
        # Where the two cores went: each process of the stack with its children
        # (the Celery pool), and the rest of the machine (OpenSearch, Redis,
        # this process).
        cpu = {
            name: round(_tree_cpu_seconds(p.pid) - cpu_before[name], 1)
            for name, p in stack.procs.items()
        }
        cpu["rest of the machine"] = round(
            _machine_cpu_seconds() - machine_before - sum(cpu.values()), 1
        )
        return {
            "mode": "celery",
            "seconds": elapsed,
            "state": ingest_pb2.JobState.Name(last.state),
            **_progress(last.progress),
            "cpu_seconds": cpu,
        }
    finally:
        stack.stop()


def _tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` and its living descendants, with the children
    each has waited for (Linux /proc)."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    tree, grew = {pid}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in tree} - tree
        tree |= more
        grew = bool(more)
    total = 0.0
    for p in tree:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # Its own time and that of its children that exited (a Celery pool's).
        total += sum(int(f) for f in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def _machine_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot (user, nice, system, irq)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(f) for f in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def run_inline(lines: list[bytes], tmp: Path) -> dict[str, Any]:
    from attest.ingest.assembly import assemble
    from attest.ingest.documents import ItemError, article_from_raw_json
    from attest.ingest.jobs import Item
    from attest.ingest.settings import IngestSettings

    async def go() -> dict[str, Any]:
        assembly = await assemble(IngestSettings(data_dir=tmp))
        try:
            items = []
            started = time.perf_counter()
            for number, line in enumerate(lines, 1):
                try:
                    items.append(Item(f"reuters:{number}", article_from_raw_json(line)))
                except ItemError as err:
                    items.append(Item(f"reuters:{number}", error=err))
            job = assembly.core.ingest("default", items)
            assert assembly.inline is not None
            await assembly.inline.drain()
            elapsed = time.perf_counter() - started
            snap = assembly.core.job("default", job.job_id)
            return {"mode": "inline", "seconds": elapsed, "state": snap.state} | {
                k: getattr(snap.progress, k)
                for k in ("received", "indexed", "failed", "passages_indexed")
            }
        finally:
            await assembly.close()

    return asyncio.run(go())


def _progress(p: Any) -> dict[str, int]:
    return {k: getattr(p, k) for k in ("received", "indexed", "failed", "passages_indexed")}


def bare_embedding(lines: list[bytes]) -> dict[str, Any]:
    """The model alone on the same articles: the passages (the limit the target
    is set against), then each other kind of text the method embeds."""
    from attest.ingest.documents import article_from_raw_json
    from attest.ingest.settings import EnrichSettings
    from attest.ingest.stages import Enricher, article_text, passage_text
    from attest.semantic.embedding import Embedder

    enricher = Enricher(EnrichSettings())
    records = []
    for line in lines:
        article = article_from_raw_json(line)
        records.append(enricher.enrich(0, "created", "", article))
    texts = [passage_text(r["article"]["title"], p[1]) for r in records for p in r["passages"]]
    others = {
        # The article record: title with the extractive summary.
        "articles": [
            article_text(r["article"]["title"], r["summary"], r["article"]["body"]) for r in records
        ],
        # The KG links: every distinct RAKE keyphrase.
        "keyphrases": list(dict.fromkeys(k for r in records for k in r["keyphrases"])),
        # The headline, a KG scoring attribute.
        "headlines": [r["article"]["title"] or "-" for r in records],
    }
    embedder = Embedder()
    embedder.warm_up()
    embedder.encode(texts[:64])  # warm
    started = time.perf_counter()
    embedder.encode(texts)
    elapsed = time.perf_counter() - started
    method = {}
    for kind, batch in others.items():
        t0 = time.perf_counter()
        embedder.encode(batch)
        method[kind] = {"texts": len(batch), "seconds": time.perf_counter() - t0}
    total = elapsed + sum(m["seconds"] for m in method.values())
    return {
        "passages": len(texts),
        "unique_keyphrases": len(others["keyphrases"]),
        "seconds": elapsed,
        "passages_per_s": len(texts) / elapsed,
        "other_texts": method,
        "method_seconds": total,
        "method_passages_per_s": len(texts) / total,
    }


def compare_backends(
    lines: list[bytes],
    backends: list[str],
    rounds: int,
    output: Path,
    modes: list[str],
    redis_url: str | None = None,
    opensearch_url: str | None = None,
) -> int:
    """Ingest with each embedding backend (ingest and semantic alike), in each
    mode, alternating, so that a slower moment of a shared machine hits both."""
    runs: list[dict[str, Any]] = []
    for round_ in range(1, rounds + 1):
        for mode in modes:
            for backend in backends:
                # Read by this process (inline) and inherited by the Celery
                # workers (the pipeline's settings) and services the celery
                # mode starts.
                os.environ["ATTEST_INGEST_EMBED__BACKEND"] = backend
                os.environ["ATTEST_PIPELINE_EMBED__BACKEND"] = backend
                os.environ["ATTEST_SEMANTIC_EMBEDDING_BACKEND"] = backend
                with tempfile.TemporaryDirectory(prefix="attest-bench-ingest-") as tmp:
                    if mode == "celery":
                        assert redis_url
                        assert opensearch_url
                        run = run_celery(lines, redis_url, opensearch_url, Path(tmp))
                    else:
                        run = run_inline(lines, Path(tmp))
                speed = run["indexed"] / run["seconds"]
                run |= {"backend": backend, "round": round_, "docs_per_s": speed}
                print(
                    f"round {round_} {mode:<7}{backend:<10}{run['seconds']:>8.1f} s"
                    f"{speed:>8.2f} docs/s  ({run['state']}, {run['indexed']} indexed, "
                    f"{run['failed']} failed)",
                    flush=True,
                )
                if "cpu_seconds" in run:
                    print(
                        "  CPU s: " + ", ".join(f"{k} {v}" for k, v in run["cpu_seconds"].items())
                    )
                runs.append(run)
    report: dict[str, Any] = {"docs": len(lines), "cpus": os.cpu_count(), "modes": modes}
    report["runs"] = runs
    report["best_docs_per_s"] = {}
    base = backends[0]
    for mode in modes:
        of_mode = [r for r in runs if r["mode"] == mode]
        report["best_docs_per_s"][mode] = {
            b: max(r["docs_per_s"] for r in of_mode if r["backend"] == b) for b in backends
        }
        for b in backends[1:]:
            ratios = [
                n["docs_per_s"] / o["docs_per_s"]
                for o, n in zip(
                    (r for r in of_mode if r["backend"] == base),
                    (r for r in of_mode if r["backend"] == b),
                    strict=True,
                )
            ]
            per_round = ", ".join(f"{x:.2f}x" for x in ratios)
            print(f"{mode} {b} / {base}: {per_round} (per round)")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {output}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument(
        "--modes",
        default=None,
        help="celery, inline or both (default: both; inline alone with --backends)",
    )
    parser.add_argument("--redis-url", default=os.environ.get("ATTEST_TEST_REDIS_URL"))
    parser.add_argument("--opensearch-url", default=os.environ.get("ATTEST_TEST_OPENSEARCH_URL"))
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--output", type=Path, default=REPORT)
    parser.add_argument(
        "--backends",
        default="",
        help="embedding backends compared side by side (e.g. torch,auto) in each of --modes, "
        "each run in a fresh data dir, alternating for --rounds; no bare figures",
    )
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    lines = reuters_lines(args.docs)
    default_modes = "inline" if args.backends else "celery,inline"
    modes = [m.strip() for m in (args.modes or default_modes).split(",") if m.strip()]
    for mode in modes:
        if mode not in ("celery", "inline"):
            parser.error(f"unknown mode {mode!r}")
        if mode == "celery" and not (args.redis_url and args.opensearch_url):
            parser.error("celery mode needs --redis-url and --opensearch-url")
    if args.backends:
        return compare_backends(
            lines,
            args.backends.split(","),
            args.rounds,
            args.output,
            modes,
            args.redis_url,
            args.opensearch_url,
        )
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="attest-bench-ingest-") as tmp:
        for mode in modes:
            path = Path(tmp) / mode
            path.mkdir()
            if mode == "celery":
                assert args.redis_url
                assert args.opensearch_url
                runs.append(run_celery(lines, args.redis_url, args.opensearch_url, path))
            else:
                runs.append(run_inline(lines, path))
    bare = bare_embedding(lines)
    for run in runs:
        run["docs_per_s"] = run["indexed"] / run["seconds"]
        run["passages_per_s"] = run["passages_indexed"] / run["seconds"]
        run["share_of_bare"] = run["passages_per_s"] / bare["passages_per_s"]
        run["share_of_method"] = run["passages_per_s"] / bare["method_passages_per_s"]
    report = {"docs": len(lines), "cpus": os.cpu_count(), "bare_embedding": bare, "runs": runs}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(
        f"{len(lines)} articles, {bare['passages']} passages, "
        f"{bare['unique_keyphrases']} distinct keyphrases, {os.cpu_count()} CPUs"
    )
    header = f"{'run':<22}{'seconds':>9}{'docs/s':>9}{'passages/s':>12}{'of bare':>9}"
    print(header + f"{'of model':>10}")
    print(
        f"{'bare: passages':<22}{bare['seconds']:>9.1f}{'':>9}{bare['passages_per_s']:>12.1f}"
        f"{'100%':>9}"
    )
    for kind, m in bare["other_texts"].items():
        print(f"{'bare: ' + kind:<22}{m['seconds']:>9.1f}  ({m['texts']} texts)")
    print(
        f"{'bare: all model work':<22}{bare['method_seconds']:>9.1f}{'':>9}"
        f"{bare['method_passages_per_s']:>12.1f}"
        f"{bare['method_passages_per_s'] / bare['passages_per_s']:>9.0%}{'100%':>10}"
    )
    for run in runs:
        print(
            f"{run['mode']:<22}{run['seconds']:>9.1f}{run['docs_per_s']:>9.1f}"
            f"{run['passages_per_s']:>12.1f}{run['share_of_bare']:>9.0%}"
            f"{run['share_of_method']:>10.0%}"
            f"  ({run['state']}, {run['indexed']} indexed, {run['failed']} failed)"
        )
    print(f"wrote {args.output}")
    celery = [r for r in runs if r["mode"] == "celery"]
    return 1 if celery and celery[0]["share_of_bare"] < args.target else 0


if __name__ == "__main__":
    sys.exit(main())
