"""Reconcile the ingest registry with the stores, and repair what drifted.

For each tenant the registry (what ingest acknowledged) is compared with
the lexical store (BM25 documents and passages), the vector store (article
and passage points) and the KG links the vector store keeps for each
article: counts, and a checksum of ``doc id:passages`` lines, so that two
stores with equal counts but different documents still differ.

* **missing**: a registry document a store lacks, or holds with another
  number of passages or other KG links; repair indexes it again, in every
  store, from the source the registry keeps;
* **orphan**: a document a store holds that is neither in the registry nor
  being written by an open job (a pending note, see ``attest.ingest.state``);
  repair deletes it from every store;
* **stale pending**: a pending note of a job that is no longer open; repair
  puts the registry's version back (or deletes the document when the
  registry has none) and drops the note.

The stores are read through the embedded backends (tantivy, the embedded
vector engine); a deployment whose stores are services has no listing RPC
to read them with yet, so there the check reports nothing. Findings are
exported as Prometheus gauges (``attest_ingest_doctor_*``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge

from attest.core.context import DEFAULT_TENANT
from attest.ingest.jobs import StageRunner, registry_entries
from attest.ingest.sinks import LocalSinks
from attest.ingest.stages import Sinks
from attest.ingest.state import JobStore, RegistryEntry

log = logging.getLogger(__name__)

STORES = ("lexical", "vectors", "kg_links")

DOCUMENTS = Gauge(
    "attest_ingest_doctor_documents",
    "Documents found by the last reconciliation, by tenant and store (registry included).",
    ["tenant", "store"],
)
MISSING = Gauge(
    "attest_ingest_doctor_missing",
    "Registry documents a store lacks (or holds in another shape), last reconciliation.",
    ["tenant", "store"],
)
ORPHANS = Gauge(
    "attest_ingest_doctor_orphans",
    "Documents a store holds that the registry does not know, last reconciliation.",
    ["tenant", "store"],
)
STALE = Gauge(
    "attest_ingest_doctor_stale_pending",
    "Pending writes of jobs that are no longer open, last reconciliation.",
    ["tenant"],
)
REPAIRED = Counter(
    "attest_ingest_doctor_repaired_total",
    "Documents repaired, by tenant and action (reindexed, deleted).",
    ["tenant", "action"],
)


def checksum(shape: Mapping[str, Any]) -> str:
    """SHA-256 (16 hex digits) of the sorted ``doc id:value`` lines of a store."""
    h = hashlib.sha256()
    for doc_id in sorted(shape):
        h.update(f"{doc_id}:{shape[doc_id]}\n".encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:16]


@dataclass
class StoreFindings:
    store: str
    documents: int
    units: int  # passages, or KG links
    checksum: str
    missing: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)


@dataclass
class TenantFindings:
    tenant: str
    documents: int
    passages: int
    kg_links: int
    checksum: str
    stores: list[StoreFindings]
    in_flight: list[str] = field(default_factory=list)
    stale_pending: list[str] = field(default_factory=list)
    without_source: list[str] = field(default_factory=list)

    @property
    def consistent(self) -> bool:
        return not self.stale_pending and not any(s.missing or s.orphans for s in self.stores)

    def lines(self, show: int = 10) -> list[str]:
        out = [
            f"tenant {self.tenant}: registry {self.documents:,} documents, "
            f"{self.passages:,} passages, {self.kg_links:,} KG links (checksum {self.checksum})"
        ]
        unit = {"lexical": "passages", "vectors": "passages", "kg_links": "links"}
        for s in self.stores:
            out.append(
                f"  {s.store:<8} {s.documents:>7,} documents {s.units:>8,} {unit[s.store]:<8} "
                f"checksum {s.checksum}  missing {len(s.missing):,}  orphans {len(s.orphans):,}"
            )
            for kind, ids in (("missing", s.missing), ("orphan", s.orphans)):
                for doc_id in ids[:show]:
                    out.append(f"    {kind} {doc_id}")
                if len(ids) > show:
                    out.append(f"    ... and {len(ids) - show:,} more")
        out.append(
            f"  in flight {len(self.in_flight):,}  stale pending {len(self.stale_pending):,}"
            f"  without stored source {len(self.without_source):,}"
        )
        out.append("  consistent" if self.consistent else "  NOT consistent")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "documents": self.documents,
            "passages": self.passages,
            "kg_links": self.kg_links,
            "checksum": self.checksum,
            "consistent": self.consistent,
            "in_flight": len(self.in_flight),
            "stale_pending": len(self.stale_pending),
            "without_source": len(self.without_source),
            "stores": {
                s.store: {
                    "documents": s.documents,
                    "units": s.units,
                    "checksum": s.checksum,
                    "missing": len(s.missing),
                    "orphans": len(s.orphans),
                }
                for s in self.stores
            },
        }


async def _store_shapes(sinks: LocalSinks, tenant: str) -> dict[str, dict[str, Any]]:
    """doc id -> passages (lexical, vectors) and doc id -> sorted KG links, per store."""
    from attest.semantic.index import ARTICLES, PASSAGES

    lister = getattr(sinks.lexical, "document_ids", None)
    if lister is None:
        raise NotImplementedError(f"the {sinks.lexical.name} backend cannot list its documents")
    lexical: dict[str, int] = await lister(tenant)
    vectors: dict[str, int] = {}
    links: dict[str, str] = {}
    store = sinks.semantic.store
    async for point in store.scroll(ARTICLES, tenant):
        vectors.setdefault(point.doc_id, 0)
        links[point.doc_id] = ",".join(sorted(point.payload.get("entity_ids") or ()))
    async for point in store.scroll(PASSAGES, tenant):
        vectors[point.doc_id] = vectors.get(point.doc_id, 0) + 1
    return {"lexical": lexical, "vectors": vectors, "kg_links": links}


def _registry_shapes(registry: Mapping[str, RegistryEntry]) -> dict[str, dict[str, Any]]:
    passages = {d: e.passages for d, e in registry.items()}
    links = {d: ",".join(sorted(e.entity_ids)) for d, e in registry.items()}
    return {"lexical": passages, "vectors": passages, "kg_links": links}


def _running_jobs(store: JobStore) -> list[str]:
    """Open jobs that are not finished (a snapshot also closes a finished one)."""
    out = []
    for job_id in store.open_jobs():
        snapshot = store.snapshot(job_id, failures_limit=0)
        if snapshot is not None and snapshot.state not in ("DONE", "FAILED"):
            out.append(job_id)
    return out


async def check(
    store: JobStore, sinks: Sinks, tenants: Iterable[str] | None = None
) -> list[TenantFindings]:
    """Findings per tenant (every tenant that ever ran a job when ``tenants`` is None,
    and tenant ``default`` while its stores hold anything)."""
    if not isinstance(sinks, LocalSinks):
        return []
    out: list[TenantFindings] = []
    if tenants is not None:
        wanted = list(tenants)
    else:
        wanted = await asyncio.to_thread(store.tenants)
        # Writers named no tenant before tenants reached the stores, so an older
        # authenticated `serve all --embedded` left every tenant's documents under
        # `default`: orphans there, missing from their own tenant, until repaired.
        if DEFAULT_TENANT not in wanted and any(
            (await _store_shapes(sinks, DEFAULT_TENANT)).values()
        ):
            wanted.append(DEFAULT_TENANT)
    open_jobs = set(await asyncio.to_thread(_running_jobs, store))
    for tenant in wanted:
        registry = await asyncio.to_thread(store.registry_all, tenant)
        pending = await asyncio.to_thread(store.pending, tenant)
        in_flight = sorted(d for d, job in pending.items() if job in open_jobs)
        stale = sorted(d for d, job in pending.items() if job not in open_jobs)
        sources = await asyncio.to_thread(store.sources, tenant, sorted(registry))
        expected = _registry_shapes(registry)
        found = await _store_shapes(sinks, tenant)
        excused = set(pending)  # documents being written, or settled by repair
        stores = []
        for name in STORES:
            want, have = expected[name], found[name]
            units = (
                sum(have.values())
                if name != "kg_links"
                else sum(len(v.split(",")) for v in have.values() if v)
            )
            stores.append(
                StoreFindings(
                    store=name,
                    documents=len(have),
                    units=units,
                    checksum=checksum(have),
                    missing=sorted(
                        d for d, v in want.items() if have.get(d) != v and d not in excused
                    ),
                    orphans=sorted(d for d in have if d not in want and d not in excused),
                )
            )
        findings = TenantFindings(
            tenant=tenant,
            documents=len(registry),
            passages=sum(e.passages for e in registry.values()),
            kg_links=sum(len(e.entity_ids) for e in registry.values()),
            checksum=checksum(expected["lexical"]),
            stores=stores,
            in_flight=in_flight,
            stale_pending=stale,
            without_source=sorted(set(registry) - set(sources)) if store.keep_sources else [],
        )
        _export(findings)
        out.append(findings)
    return out


def _export(f: TenantFindings) -> None:
    DOCUMENTS.labels(f.tenant, "registry").set(f.documents)
    for s in f.stores:
        DOCUMENTS.labels(f.tenant, s.store).set(s.documents)
        MISSING.labels(f.tenant, s.store).set(len(s.missing))
        ORPHANS.labels(f.tenant, s.store).set(len(s.orphans))
    STALE.labels(f.tenant).set(len(f.stale_pending))


@dataclass(frozen=True)
class Repairs:
    tenant: str
    reindexed: int
    deleted: int
    unrepairable: tuple[str, ...]


async def repair(
    store: JobStore, sinks: Sinks, runner: StageRunner, findings: TenantFindings
) -> Repairs:
    """Delete orphans, index missing documents again from their stored sources,
    settle stale pending notes. Idempotent: a repair cut short is run again."""
    tenant = findings.tenant
    registry_ids = set(await asyncio.to_thread(store.registry_ids, tenant))
    orphans = sorted({d for s in findings.stores for d in s.orphans})
    stale_gone = [d for d in findings.stale_pending if d not in registry_ids]
    stale_kept = [d for d in findings.stale_pending if d in registry_ids]
    to_delete = sorted({*orphans, *stale_gone})
    if to_delete:
        await sinks.delete(tenant, to_delete)
        REPAIRED.labels(tenant, "deleted").inc(len(to_delete))
    missing = sorted({d for s in findings.stores for d in s.missing} | set(stale_kept))
    sources = await asyncio.to_thread(store.sources, tenant, missing)
    unrepairable = [d for d in missing if d not in sources]
    reindexed = 0
    for start in range(0, len(missing), 64):
        chunk = {d: sources[d] for d in missing[start : start + 64] if d in sources}
        if not chunk:
            continue
        records = await asyncio.to_thread(runner.rebuild, tenant, chunk)
        unrepairable += sorted(set(chunk) - {r["article"]["id"] for r in records})
        if records:
            await sinks.index(tenant, records)
            entries = registry_entries(records)
            await asyncio.to_thread(store.registry_put, tenant, entries)
            reindexed += len(records)
    if reindexed:
        REPAIRED.labels(tenant, "reindexed").inc(reindexed)
    await asyncio.to_thread(store.settle_pending, tenant, findings.stale_pending)
    return Repairs(tenant, reindexed, len(to_delete), tuple(sorted(set(unrepairable))))


def summary(findings: list[TenantFindings]) -> str:
    """One log line of a check."""
    if not findings:
        return "no tenants"
    return "; ".join(
        f"{f.tenant}: {f.documents} registered, "
        + ", ".join(
            f"{s.store} {s.documents} (missing {len(s.missing)}, orphans {len(s.orphans)})"
            for s in f.stores
        )
        + f", stale pending {len(f.stale_pending)}"
        for f in findings
    )


def findings_json(findings: list[TenantFindings]) -> str:
    return json.dumps([f.to_json() for f in findings], indent=2)
