"""The personal knowledge base over Reuters: fact extraction during ingest, and linking.

Issue 18's benchmark. Every service runs in this process on embedded backends
with the knowledge service (as ``attest serve all --embedded --knowledge``
does); the first ``--docs`` Reuters-21578 articles with a body go through
``IngestService.IngestStream``, and the ingest service sends every indexed
document's facts to the knowledge service (extracted offline, no LLM). The
data dir grows step by step: a run with ``--docs 2000`` on a data dir that
holds 1,000 articles from an earlier run ingests the next 1,000, so

    uv run python loadtest/bench_knowledge.py --data-dir D --docs 1000
    uv run python loadtest/bench_knowledge.py --data-dir D --docs 2000
    uv run python loadtest/bench_knowledge.py --data-dir D --docs 5000

measures 1,000, 2,000 and 5,000 articles; each step is kept in
``D/.bench-knowledge.json`` and the report lists them all. In each step:

* ingest: the step's articles, timed from the first IngestStream message
  to DONE; inside it, timers around the ingest side's facts hook
  (``attest.ingest.knowledge.FactsHook``): the offline extraction and the
  ``KnowledgeService.Store`` call (the facts' embeddings and both stores'
  writes). Extraction throughput (documents/s, facts/s) and the hook's share
  of the ingest time come from the same run; the rest is everything else
  the ingest does (parse, enrich, embed, index);
* with ``--compare N`` (first step only, default 300): the first N articles
  ingested into two fresh data dirs, without and with the knowledge service,
  one after the other, so the facts' cost is also seen end to end;
* linking: ``--calls`` LinkEntities calls of ``--mentions`` mentions each over
  the personal base alone, through the public gRPC API and in process (what
  the servicer runs, without gRPC), p50/p95, and in process the embedding of
  the mentions alone (the model's share). Mentions are names
  of entities the base holds, drawn with a fixed seed: half as stored (exact
  matches), half cut to their first word or lower-cased with a word dropped,
  which the exact match misses and embedding similarity decides. The first
  call after a write rebuilds the name matrix and is timed on its own.

Writes JSON to loadtest/reports/knowledge.json. Exits 1 when the linking p50
through gRPC is over ``--target-ms`` (20) at the largest size measured.
A benchmark command, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REPORT = ROOT / "loadtest" / "reports" / "knowledge.json"
STATE = ".bench-knowledge.json"


@dataclass
class HookTimes:
    """Seconds spent in the ingest side's facts hook, and what it produced."""

    documents: int = 0
    facts: int = 0
    extract_s: float = 0.0
    store_s: float = 0.0
    stores: int = 0


def instrument(times: HookTimes) -> None:
    """Time FactsHook's extraction and Store calls (this process's ingest)."""
    from attest.ingest.knowledge import FactsHook

    facts, store = FactsHook.facts, FactsHook._store
    if getattr(facts, "_timed", False):
        return

    def timed_facts(self: FactsHook, record: Any) -> Any:
        started = time.perf_counter()
        out = facts(self, record)
        times.extract_s += time.perf_counter() - started
        times.documents += 1
        times.facts += len(out)
        return out

    async def timed_store(self: FactsHook, tenant: str, request: Any) -> None:
        started = time.perf_counter()
        await store(self, tenant, request)
        times.store_s += time.perf_counter() - started
        times.stores += 1

    timed_facts._timed = True  # type: ignore[attr-defined]
    FactsHook.facts = timed_facts  # type: ignore[method-assign]
    FactsHook._store = timed_store  # type: ignore[method-assign]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def summary_ms(values: Sequence[float]) -> dict[str, float]:
    return {
        "calls": len(values),
        "p50_ms": round(1000 * percentile(values, 50), 2),
        "p95_ms": round(1000 * percentile(values, 95), 2),
        "mean_ms": round(1000 * sum(values) / len(values), 2),
    }


def mention_sets(names: Sequence[str], calls: int, per_call: int, seed: int) -> list[list[str]]:
    """``calls`` lists of ``per_call`` mentions: half names as stored, half altered."""
    rng = random.Random(seed)
    pool = sorted(set(names))
    out = []
    for _ in range(calls):
        mentions = []
        for k in range(per_call):
            name = rng.choice(pool)
            if k % 2:
                words = name.split()
                if len(words) > 1 and rng.random() < 0.5:
                    name = words[0]
                elif len(words) > 1:
                    drop = rng.randrange(len(words))
                    name = " ".join(w for i, w in enumerate(words) if i != drop).lower()
                else:
                    name = name.lower() + " group"
            mentions.append(name[:256])
        out.append(mentions)
    return out


def ingest_lines(address: str, lines: list[bytes]) -> dict[str, Any]:
    """Ingest through IngestStream and wait for the job (blocking client, its own thread)."""
    from loadtest.bench_ask import ingest

    return ingest(address, lines)


async def link_grpc(address: str, sets: Sequence[Sequence[str]]) -> list[float]:
    from attest.core.channels import create_channel
    from attest.knowledge.v1 import knowledge_pb2, knowledge_pb2_grpc

    channel = create_channel(address)
    try:
        stub = knowledge_pb2_grpc.KnowledgeServiceStub(channel)
        out = []
        for mentions in sets:
            started = time.perf_counter()
            await stub.LinkEntities(
                knowledge_pb2.LinkEntitiesRequest(
                    mentions=list(mentions),
                    knowledge_bases=[knowledge_pb2.KNOWLEDGE_BASE_PERSONAL],
                ),
                timeout=120,
            )
            out.append(time.perf_counter() - started)
        return out
    finally:
        await channel.close()


def link_in_process(
    kb: Any, sets: Sequence[Sequence[str]]
) -> tuple[list[float], list[float], int, int]:
    """What the servicer runs for a call, without gRPC, and the embedding of the call's
    mentions that no name matches exactly on its own; (latencies, encode latencies,
    mentions chosen, mentions embedded)."""
    out, encode = [], []
    chosen = embedded = 0
    for mentions in sets:
        started = time.perf_counter()
        links = kb.link_mentions([[m] for m in mentions], "", top_k=5)
        out.append(time.perf_counter() - started)
        chosen += sum(link.chosen is not None for link in links)
        pending = [m for m in mentions if not kb.exact(m)]
        embedded += len(pending)
        started = time.perf_counter()
        kb.encode(pending)
        encode.append(time.perf_counter() - started)
    return out, encode, chosen, embedded


async def step(
    data_dir: Path, lines: list[bytes], have: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Grow the data dir from ``have`` to ``len(lines)`` articles, then measure linking."""
    from attest.answer.embedded import FACTS_ADDRESS_VARIABLE, _environment, embedded_servicers
    from attest.core.context import tenant_var
    from attest.core.server import running
    from attest.core.settings import ServerSettings
    from attest.knowledge.personal import FORMS, form_of, iter_facts
    from loadtest.grpc_load import free_port

    times = HookTimes()
    instrument(times)
    port = free_port()
    address = f"127.0.0.1:{port}"
    result: dict[str, Any] = {"docs": len(lines)}
    began = time.perf_counter()
    servicers = embedded_servicers(data_dir, address, knowledge=True)
    knowledge = next(s for s in servicers if type(s).__name__ == "KnowledgeServicer")
    with _environment(FACTS_ADDRESS_VARIABLE, address):
        async with running(
            servicers, ServerSettings(host="127.0.0.1", port=port), ready_timeout=1800
        ):
            result["start_s"] = round(time.perf_counter() - began, 2)
            if len(lines) > have:
                loaded = await asyncio.to_thread(ingest_lines, address, lines[have:])
            if len(lines) > have and loaded["indexed"]:  # none: the data dir held them
                hook = times.extract_s + times.store_s
                result["ingest"] = {
                    "articles": len(lines) - have,
                    "from": have,
                    "seconds": round(loaded["seconds"], 1),
                    "indexed": loaded["indexed"],
                    "failed": loaded["failed"],
                    "passages": loaded["passages"],
                    "docs_per_s": round(loaded["indexed"] / loaded["seconds"], 2),
                    "facts_hook": asdict(times)
                    | {
                        "extract_docs_per_s": round(times.documents / times.extract_s, 1)
                        if times.extract_s
                        else None,
                        "extract_facts_per_s": round(times.facts / times.extract_s, 1)
                        if times.extract_s
                        else None,
                        "store_facts_per_s": round(times.facts / times.store_s, 1)
                        if times.store_s
                        else None,
                        "hook_docs_per_s": round(times.documents / hook, 2) if hook else None,
                        "extract_share": round(times.extract_s / loaded["seconds"], 4),
                        "store_share": round(times.store_s / loaded["seconds"], 4),
                        "hook_share": round(hook / loaded["seconds"], 4),
                    },
                }
                print(f"ingest: {json.dumps(result['ingest'])}", file=sys.stderr, flush=True)
            tenant = tenant_var.get()
            view = await knowledge.personal_store().view(tenant)
            counts = dict.fromkeys(FORMS, 0)
            for fact in iter_facts(view):
                counts[form_of(fact)] += 1
            names = list(view.names.values())
            result["base"] = {
                "documents": len(view.documents),
                "facts": counts,
                "entities": len(names),
            }
            print(f"base: {result['base']}", file=sys.stderr, flush=True)
            sets = mention_sets(names, args.calls + 1, args.mentions, args.seed)
            # The first call after the writes builds the name matrix (every name embedded
            # once per process, then stacked): timed on its own.
            first = await link_grpc(address, sets[:1])
            result["linking_first_call_ms"] = round(1000 * first[0], 1)
            kb = await knowledge.personal_kb(tenant)
            rounds: dict[str, list[float]] = {"grpc": [], "in_process": [], "encode": []}
            chosen = embedded = 0
            # Alternate the two paths in blocks so drift on the shared machine hits both.
            block = max(1, args.calls // 5)
            for start in range(1, args.calls + 1, block):
                part = sets[start : start + block]
                rounds["grpc"] += await link_grpc(address, part)
                latencies, encode, picked, pending = await asyncio.to_thread(
                    link_in_process, kb, part
                )
                rounds["in_process"] += latencies
                rounds["encode"] += encode
                chosen += picked
                embedded += pending
            result["linking"] = {
                "mentions_per_call": args.mentions,
                "grpc": summary_ms(rounds["grpc"]),
                "in_process": summary_ms(rounds["in_process"]),
                # The model's share: embedding the mentions no name matches exactly.
                "encode_only": summary_ms(rounds["encode"]),
                "mentions_embedded": f"{embedded}/{args.calls * args.mentions}",
                "mentions_linked": f"{chosen}/{args.calls * args.mentions}",
                "example_call": sets[1],
            }
            print(f"linking: {result['linking']}", file=sys.stderr, flush=True)
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    result["when"] = datetime.now(UTC).isoformat(timespec="seconds")
    return result


async def compare(lines: list[bytes]) -> dict[str, Any]:
    """The same articles into two fresh data dirs: without, then with the knowledge service."""
    from attest.answer.embedded import embedded_stack

    out: dict[str, Any] = {"articles": len(lines)}
    for knowledge in (False, True):
        with tempfile.TemporaryDirectory(prefix="attest-bench-knowledge-") as tmp:
            async with embedded_stack(Path(tmp), knowledge=knowledge, ready_timeout=1800) as a:
                loaded = await asyncio.to_thread(ingest_lines, a, lines)
        name = "with_knowledge" if knowledge else "without_knowledge"
        out[name] = {
            "seconds": round(loaded["seconds"], 1),
            "docs_per_s": round(loaded["indexed"] / loaded["seconds"], 2),
        }
        print(f"compare {name}: {out[name]}", file=sys.stderr, flush=True)
    out["with_over_without"] = round(
        out["with_knowledge"]["seconds"] / out["without_knowledge"]["seconds"], 3
    )
    return out


def show(report: dict[str, Any]) -> None:
    print(f"{report['cpus']} CPUs; offline extraction (no LLM); steps:")
    for s in report["steps"]:
        base = s["base"]
        print(
            f"  {s['docs']} articles: {base['documents']} documents with facts, "
            f"{sum(base['facts'].values())} facts {base['facts']}, {base['entities']} entities"
        )
        if "ingest" in s:
            i, h = s["ingest"], s["ingest"]["facts_hook"]
            print(
                f"    ingest {i['articles']} articles in {i['seconds']:.0f} s "
                f"({i['docs_per_s']:.2f} docs/s): extraction {h['extract_s']:.1f} s "
                f"({h['extract_docs_per_s']} docs/s, {h['extract_facts_per_s']} facts/s, "
                f"{h['extract_share']:.1%} of ingest), Store {h['store_s']:.1f} s "
                f"({h['store_share']:.1%}); facts hook {h['hook_share']:.1%} of ingest"
            )
        link = s["linking"]
        print(
            f"    linking {link['mentions_per_call']} mentions: gRPC p50 "
            f"{link['grpc']['p50_ms']:.1f} ms p95 {link['grpc']['p95_ms']:.1f} ms; in process "
            f"p50 {link['in_process']['p50_ms']:.1f} ms p95 {link['in_process']['p95_ms']:.1f} "
            f"ms; first call after the writes {s['linking_first_call_ms']:.0f} ms"
        )
        if "encode_only" in link:
            print(
                f"    of which embedding the {link['mentions_embedded']} mentions without an "
                f"exact match: p50 {link['encode_only']['p50_ms']:.1f} ms"
            )
    if "compare" in report:
        c = report["compare"]
        print(
            f"  {c['articles']} articles into fresh data dirs: without knowledge "
            f"{c['without_knowledge']['seconds']:.0f} s, with {c['with_knowledge']['seconds']:.0f}"
            f" s ({c['with_over_without']:.2f}x)"
        )


def commit() -> str:
    """The checkout's commit (what was measured)."""
    import subprocess

    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return out.stdout.strip()


def main() -> int:
    from tests.integration.ingest_stack import reuters_lines

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True, help="grows run by run")
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--calls", type=int, default=200, help="LinkEntities calls per path")
    parser.add_argument("--mentions", type=int, default=10)
    parser.add_argument("--compare", type=int, default=300, help="0 skips the side-by-side")
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--target-ms", type=float, default=20.0)
    parser.add_argument("--output", type=Path, default=REPORT)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args.data_dir.mkdir(parents=True, exist_ok=True)
    state_path = args.data_dir / STATE
    state: dict[str, Any] = (
        json.loads(state_path.read_text()) if state_path.exists() else {"steps": []}
    )
    have = max((s["docs"] for s in state["steps"]), default=0)
    if args.docs < have:
        parser.error(f"{args.data_dir} holds {have} articles already")
    lines = reuters_lines(args.docs)
    if args.compare and "compare" not in state:
        state["compare"] = asyncio.run(compare(lines[: args.compare]))
        state_path.write_text(json.dumps(state, indent=2) + "\n")
    result = asyncio.run(step(args.data_dir, lines, have, args))
    result["commit"] = commit()
    earlier = next((s for s in state["steps"] if s["docs"] == result["docs"]), None)
    if earlier is not None:
        # Linking measured again on the same articles (another commit): the ingest
        # figures stay, the earlier linking is kept beside the new one.
        keep = ("linking", "linking_first_call_ms", "commit", "when", "load_average")
        result = (
            earlier
            | {
                "linking_earlier": [
                    *earlier.get("linking_earlier", []),
                    {k: earlier[k] for k in keep if k in earlier},
                ]
            }
            | {k: result[k] for k in keep}
        )
    state["steps"] = [s for s in state["steps"] if s["docs"] != result["docs"]] + [result]
    state_path.write_text(json.dumps(state, indent=2) + "\n")
    report = {
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "command": "uv run python loadtest/bench_knowledge.py --data-dir D --docs N, "
        "N = each size in turn on the same D",
        "extraction": "offline (no LLM configured)",
        **state,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    show(report)
    print(f"wrote {args.output}")
    largest = max(report["steps"], key=lambda s: s["docs"])
    return 0 if largest["linking"]["grpc"]["p50_ms"] <= args.target_ms else 1


if __name__ == "__main__":
    sys.exit(main())
