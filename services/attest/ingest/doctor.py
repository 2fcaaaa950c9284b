"""Reconcile the ingest registry with the stores, and repair what drifted.

For each tenant the registry (what ingest acknowledged) is compared with
the lexical store (BM25 documents and passages), the vector store (article
and passage points) and the KG links the vector store keeps for each
article: counts, and a checksum of ``doc id:passages`` lines, so that two
stores with equal counts but different documents still differ. Content too,
where the store reads its texts while listing (tantivy, both vector stores;
not Elasticsearch or OpenSearch): each document's passages digest
(``attest.core.document.passages_digest`` of its passages' indexes and
texts) against the one the registry kept when the document was indexed; a
document whose passages differ is **changed** and is missing from that store
as far as repair goes.

* **missing**: a registry document a store lacks, or holds with another
  number of passages or other KG links; repair indexes it again, in every
  store, from the source the registry keeps;
* **orphan**: a document a store holds that is neither in the registry nor
  being written by an open job (a pending note, see ``attest.ingest.state``);
  repair deletes it from every store;
* **stale pending**: a pending note of a job that is no longer open; repair
  puts the registry's version back (or deletes the document when the
  registry has none) and drops the note.

The stores are read through a ``StoreListing`` (``attest.ingest.listing``):
the backends opened in this process (embedded mode), or the lexical and
semantic services' ``ListDocuments`` RPCs (OpenSearch, Elasticsearch,
Qdrant). Repairs go through the same ``Sinks`` ingest writes with (the
services' Index and Delete RPCs, or the local backends).

The registry is read before the stores, so a document a job commits while
the stores are being listed could look like an orphan; candidates are
looked up again afterwards, and one that is now registered or pending is not
reported. Findings are exported as Prometheus gauges
(``attest_ingest_doctor_*``); ``PeriodicCheck`` runs the check on a timer in
a serving process.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import Counter, Gauge

from attest.core.context import DEFAULT_TENANT
from attest.core.write_barrier import awriting
from attest.ingest.jobs import StageRunner, registry_entries
from attest.ingest.listing import EmbeddedListing, StoreListing, StoreShapes, StoreUnreachable
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
CHECKS = Counter(
    "attest_ingest_doctor_checks_total",
    "Reconciliations run, by outcome (ok, or the store that could not be read: registry, "
    "lexical, vectors).",
    ["outcome"],
)
LAST_CHECK = Gauge(
    "attest_ingest_doctor_last_success_timestamp_seconds",
    "Unix time at which the last reconciliation that read every store finished.",
)
REPAIRED = Counter(
    "attest_ingest_doctor_repaired_total",
    "Documents repaired, by tenant and action (reindexed, deleted, facts_deleted).",
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
    # Of ``missing``: held with the right number of passages but other texts.
    changed: list[str] = field(default_factory=list)
    # Documents whose content was compared (both sides have a digest).
    compared: int = 0


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
                + (
                    f"  content compared {s.compared:,}, changed {len(s.changed):,}"
                    if s.store != "kg_links"
                    else ""
                )
            )
            changed = set(s.changed)
            for kind, ids in (
                ("changed", s.changed),
                ("missing", [d for d in s.missing if d not in changed]),
                ("orphan", s.orphans),
            ):
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
                    "changed": len(s.changed),
                    "content_compared": s.compared,
                }
                for s in self.stores
            },
        }


def listing_of(stores: Sinks | StoreListing) -> StoreListing | None:
    """The listing of a deployment's stores: given, or the embedded stores' own."""
    if isinstance(stores, StoreListing):
        return stores
    if isinstance(stores, LocalSinks):
        return EmbeddedListing(stores)
    return None


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
    store: JobStore, stores: Sinks | StoreListing, tenants: Iterable[str] | None = None
) -> list[TenantFindings]:
    """Findings per tenant (every tenant that ever ran a job when ``tenants`` is None,
    and tenant ``default`` while its stores hold anything).

    ``stores``: a ``StoreListing``, or the sinks of an embedded deployment. Sinks
    that cannot be listed (gRPC sinks without a listing) give no findings.
    Raises ``StoreUnreachable`` when a store cannot be read.
    """
    listing = listing_of(stores)
    if listing is None:
        return []
    out: list[TenantFindings] = []
    default_shapes: StoreShapes | None = None
    try:
        if tenants is not None:
            wanted = list(tenants)
        else:
            wanted = await asyncio.to_thread(store.tenants)
            # Writers named no tenant before tenants reached the stores, so an older
            # authenticated `serve all --embedded` left every tenant's documents under
            # `default`: orphans there, missing from their own tenant, until repaired.
            if DEFAULT_TENANT not in wanted:
                default_shapes = await listing.shapes(DEFAULT_TENANT)
                if not default_shapes.empty():
                    wanted.append(DEFAULT_TENANT)
        open_jobs = set(await asyncio.to_thread(_running_jobs, store))
    except StoreUnreachable:
        raise
    except Exception as err:
        raise StoreUnreachable("registry", f"{type(err).__name__}: {err}") from err
    for tenant in wanted:
        try:
            registry = await asyncio.to_thread(store.registry_all, tenant)
            pending = await asyncio.to_thread(store.pending, tenant)
            # Ids only: the texts are read when a repair needs them.
            sources = await asyncio.to_thread(store.source_ids, tenant)
        except Exception as err:
            raise StoreUnreachable("registry", f"{type(err).__name__}: {err}") from err
        if tenant == DEFAULT_TENANT and default_shapes is not None:
            found = default_shapes
        else:
            found = await listing.shapes(tenant)
        findings = compare(tenant, registry, pending, open_jobs, found)
        if store.keep_sources:
            findings.without_source = sorted(set(registry) - set(sources))
        if any(s.missing or s.orphans for s in findings.stores):
            try:
                await asyncio.to_thread(_look_again, store, findings)
            except Exception as err:
                raise StoreUnreachable("registry", f"{type(err).__name__}: {err}") from err
        _export(findings)
        out.append(findings)
    return out


def compare(
    tenant: str,
    registry: Mapping[str, RegistryEntry],
    pending: Mapping[str, str],
    open_jobs: set[str],
    found: StoreShapes,
) -> TenantFindings:
    """The findings of one tenant from what the registry and the stores hold."""
    in_flight = sorted(d for d, job in pending.items() if job in open_jobs)
    stale = sorted(d for d, job in pending.items() if job not in open_jobs)
    expected = _registry_shapes(registry)
    excused = set(pending)  # documents being written, or settled by repair
    stores = []
    for name, have in found.by_store().items():
        want = expected[name]
        partial = found.partial[name]
        held = found.digests.get(name, {}) if name != "kg_links" else {}
        digests = {d: e.passages_sha256 for d, e in registry.items() if e.passages_sha256}
        comparable = [d for d in want if d in held and d in digests and d not in excused]
        changed = sorted(d for d in comparable if held[d] != digests[d])
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
                    {
                        d
                        for d, v in want.items()
                        if (have.get(d) != v or d in partial) and d not in excused
                    }
                    | set(changed)
                ),
                orphans=sorted(d for d in have if d not in want and d not in excused),
                changed=changed,
                compared=len(comparable),
            )
        )
    return TenantFindings(
        tenant=tenant,
        documents=len(registry),
        passages=sum(e.passages for e in registry.values()),
        kg_links=sum(len(e.entity_ids) for e in registry.values()),
        checksum=checksum(expected["lexical"]),
        stores=stores,
        in_flight=in_flight,
        stale_pending=stale,
    )


def _look_again(store: JobStore, findings: TenantFindings) -> None:
    """Drop the orphans that a job registered or began writing while the stores
    were listed, and the missing documents deleted meanwhile."""
    orphans = sorted({d for s in findings.stores for d in s.orphans})
    missing = sorted({d for s in findings.stores for d in s.missing})
    pending = store.pending(findings.tenant)
    registered = set(store.registry_get(findings.tenant, orphans)) if orphans else set()
    still = set(store.registry_get(findings.tenant, missing)) if missing else set()
    for s in findings.stores:
        s.orphans = [d for d in s.orphans if d not in registered and d not in pending]
        s.missing = [d for d in s.missing if d in still and d not in pending]
        s.changed = [d for d in s.changed if d in still and d not in pending]


def _export(f: TenantFindings) -> None:
    DOCUMENTS.labels(f.tenant, "registry").set(f.documents)
    for s in f.stores:
        DOCUMENTS.labels(f.tenant, s.store).set(s.documents)
        MISSING.labels(f.tenant, s.store).set(len(s.missing))
        ORPHANS.labels(f.tenant, s.store).set(len(s.orphans))
    STALE.labels(f.tenant).set(len(f.stale_pending))


# -- the personal knowledge base's facts -------------------------------------------


class FactLister(Protocol):
    """The knowledge service, as ``attest.ingest.knowledge.FactsHook`` reaches it."""

    async def documents(self, tenant: str) -> dict[str, int]: ...

    async def delete(self, tenant: str, doc_ids: Sequence[str]) -> None: ...


@dataclass
class FactFindings:
    """One tenant's facts against the registry: facts are extracted from indexed
    documents and deleted with them, so facts whose document the registry does
    not hold (and no open job is writing) are orphans."""

    tenant: str
    documents: int  # documents the personal base holds facts from
    facts: int
    orphans: list[str] = field(default_factory=list)

    @property
    def consistent(self) -> bool:
        return not self.orphans

    def lines(self, show: int = 10) -> list[str]:
        out = [
            f"tenant {self.tenant}: knowledge {self.documents:,} documents with "
            f"{self.facts:,} facts  orphans {len(self.orphans):,} (facts whose document is gone)"
        ]
        out += [f"    orphan facts of {d}" for d in self.orphans[:show]]
        if len(self.orphans) > show:
            out.append(f"    ... and {len(self.orphans) - show:,} more")
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "tenant": self.tenant,
            "documents": self.documents,
            "facts": self.facts,
            "orphans": len(self.orphans),
            "consistent": self.consistent,
        }


async def check_facts(
    store: JobStore, facts: FactLister, tenants: Iterable[str] | None = None
) -> list[FactFindings]:
    """Each tenant's fact documents against its registry (and pending writes)."""
    wanted = list(tenants) if tenants is not None else await asyncio.to_thread(store.tenants)
    out = []
    for tenant in wanted:
        held = await facts.documents(tenant)
        try:
            known = (
                set(await asyncio.to_thread(store.registry_get, tenant, sorted(held)))
                if held
                else set()
            )
            pending = await asyncio.to_thread(store.pending, tenant)
        except Exception as err:
            raise StoreUnreachable("registry", f"{type(err).__name__}: {err}") from err
        orphans = sorted(d for d in held if d not in known and d not in pending)
        out.append(FactFindings(tenant, len(held), sum(held.values()), orphans))
    return out


async def repair_facts(facts: FactLister, findings: FactFindings) -> int:
    """Delete the orphan facts (a Store without facts); returns how many documents."""
    if findings.orphans:
        await facts.delete(findings.tenant, findings.orphans)
        REPAIRED.labels(findings.tenant, "facts_deleted").inc(len(findings.orphans))
    return len(findings.orphans)


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
        async with awriting(store.barrier):
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
            async with awriting(store.barrier):
                await sinks.index(tenant, records)
                entries = registry_entries(records)
                await asyncio.to_thread(store.registry_put, tenant, entries)
            reindexed += len(records)
    if reindexed:
        REPAIRED.labels(tenant, "reindexed").inc(reindexed)
    async with awriting(store.barrier):
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


class PeriodicCheck:
    """The check on a timer, in the background of a serving process: it reports
    (log lines and the gauges), it never repairs, and nothing it meets stops
    it. A store that cannot be read is logged and counted
    (``attest_ingest_doctor_checks_total{outcome=STORE}``), and the gauges keep
    the last complete findings."""

    def __init__(
        self,
        store: JobStore,
        listing: StoreListing,
        interval_seconds: float,
        *,
        first_delay_seconds: float | None = None,
        owns_listing: bool = True,
    ) -> None:
        self.store = store
        self.listing = listing
        self.interval = interval_seconds
        self.first_delay = interval_seconds if first_delay_seconds is None else first_delay_seconds
        self.owns_listing = owns_listing
        self.last: list[TenantFindings] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="doctor")

    async def _loop(self) -> None:
        await asyncio.sleep(self.first_delay)
        while True:
            await self.run_once()
            await asyncio.sleep(self.interval)

    async def run_once(self) -> list[TenantFindings] | None:
        """One check; its findings, or None when a store could not be read."""
        started = time.monotonic()
        try:
            findings = await check(self.store, self.listing)
        except StoreUnreachable as err:
            CHECKS.labels(err.store).inc()
            log.warning("the periodic reconciliation could not read the %s: %s", err.store, err)
            return None
        except Exception:
            CHECKS.labels("error").inc()
            log.exception("the periodic reconciliation failed")
            return None
        CHECKS.labels("ok").inc()
        LAST_CHECK.set(time.time())
        self.last = findings
        seconds = time.monotonic() - started
        if all(f.consistent for f in findings):
            log.info("ingest registry and stores agree (%.1f s): %s", seconds, summary(findings))
        else:
            log.warning(
                "ingest registry and stores disagree (run `attest doctor --repair`; %.1f s): %s",
                seconds,
                summary(findings),
            )
        return findings

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.owns_listing:
            await self.listing.close()
