"""Putting an ``IngestCore`` together from settings, for the servicer and the CLI.

* state: Redis when ``state_url`` is set, else SQLite under
  ``data_dir/ingest/state.sqlite3`` (in memory when not ``state_on_disk``);
* stores: the lexical and semantic services over gRPC when their addresses
  are set, else their cores in this process (tantivy and the embedded Qdrant
  engine under ``data_dir``), sharing one embedding model with the pipeline;
* stages: inline in this process, or Celery tasks (``mode = "celery"``), with
  a ``Watchdog`` that the serving process runs to send again what the broker
  lost.

Inline, the assembly applies the recovery rule of ``attest.ingest.state`` as
it starts (interrupted jobs resume) and then reconciles the registry with the
stores in the background (``attest.ingest.doctor``): it reports, it does not
block or repair.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from attest.core.errors import FailedPrecondition
from attest.core.write_barrier import WriteBarrier
from attest.ingest.jobs import Dispatcher, IngestCore, InlineDispatcher, StageRunner
from attest.ingest.settings import IngestSettings
from attest.ingest.stages import Embedding, Sinks
from attest.ingest.state import (
    JobStore,
    KeyValue,
    MemoryKeyValue,
    RedisKeyValue,
    SqliteKeyValue,
    open_embedded_state,
)
from attest.pipeline.settings import PipelineSettings

if TYPE_CHECKING:
    from attest.pipeline.ingest import Watchdog

log = logging.getLogger(__name__)


@dataclass
class Assembly:
    core: IngestCore
    inline: InlineDispatcher | None
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    startup_check: asyncio.Task[None] | None = None
    # Celery mode: sends again what the broker lost (started by the serving process).
    watchdog: Watchdog | None = None

    async def close(self) -> None:
        if self.watchdog is not None:
            await self.watchdog.close()
        if self.startup_check is not None:
            self.startup_check.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.startup_check
        if self.inline is not None:
            await self.inline.close()
        for close in reversed(self.closers):
            await close()
        kv = self.core.store.kv
        if isinstance(kv, MemoryKeyValue | RedisKeyValue | SqliteKeyValue):
            kv.close()


async def _startup_check(assembly: Assembly) -> None:
    """Reconcile once the resumed jobs are through; report only."""
    from attest.ingest import doctor

    if assembly.inline is not None:
        await assembly.inline.drain()
    try:
        findings = await doctor.check(assembly.core.store, assembly.core.sinks)
    except Exception:
        log.exception("the start-up reconciliation of the ingest registry failed")
        return
    if all(f.consistent for f in findings):
        log.info("ingest registry and stores agree: %s", doctor.summary(findings))
    else:
        log.warning(
            "ingest registry and stores disagree (run `attest doctor --repair`): %s",
            doctor.summary(findings),
        )


async def assemble(
    settings: IngestSettings,
    pipeline: PipelineSettings | None = None,
    *,
    startup_check: bool = True,
) -> Assembly:
    """A warm core: models loaded and stores open (raises while they are not ready)."""
    kv: KeyValue
    if settings.state_url is not None:
        redis_kv = RedisKeyValue(settings.state_url.get_secret_value())
        redis_kv.ping()
        kv = redis_kv
    elif settings.mode == "celery":
        raise FailedPrecondition("celery mode needs ATTEST_INGEST_STATE_URL (a Redis URL)")
    elif settings.state_on_disk:
        kv = await asyncio.to_thread(open_embedded_state, settings.data_dir / "ingest")
    else:
        kv = MemoryKeyValue()
    # The embedded state keeps each document's source, so that `attest doctor` can
    # index it again (also under `serve all --embedded`, whose ingest reaches the
    # embedded stores through the in-process services).
    embedded_state = isinstance(kv, SqliteKeyValue)
    store = JobStore(
        kv,
        keep_sources=embedded_state,
        # The embedded stores under the data directory are backed up beside a
        # running process (attest.ingest.backup): its writes honour the barrier.
        barrier=WriteBarrier(settings.data_dir) if embedded_state else None,
    )
    closers: list[Callable[[], Awaitable[None]]] = []

    from attest.ingest.sinks import LocalSinks

    sinks: Sinks
    embedding: Embedding | None = None
    if settings.lexical_address and settings.semantic_address:
        from attest.ingest.sinks import GrpcSinks

        sinks = GrpcSinks(settings.lexical_address, settings.semantic_address, settings.client)
    elif settings.lexical_address or settings.semantic_address:
        raise FailedPrecondition(
            "set both lexical_address and semantic_address, or neither (embedded stores)"
        )
    else:
        from attest.lexical.backends import create_backend
        from attest.lexical.settings import LexicalSettings
        from attest.semantic.index import SemanticIndex
        from attest.semantic.settings import SemanticSettings

        lexical_settings = LexicalSettings(data_dir=settings.data_dir)
        semantic_settings = SemanticSettings(data_dir=settings.data_dir)
        lexical = create_backend(lexical_settings)
        await lexical.warm_up()
        semantic = SemanticIndex(semantic_settings)
        await semantic.warm_up()
        sinks = LocalSinks(lexical, semantic)
        if settings.mode == "inline":
            embedding = Embedding.build(semantic.embedder, semantic.graph)

    from attest.ingest.knowledge import facts_hook

    if sinks.knowledge is None:
        sinks.knowledge = facts_hook(settings.client)
    dispatcher: Dispatcher
    inline: InlineDispatcher | None = None
    pipeline = pipeline or PipelineSettings()
    celery_app = None
    if settings.mode == "celery":
        from attest.pipeline.app import create_app
        from attest.pipeline.ingest import CeleryDispatcher

        celery_app = create_app(pipeline)
        dispatcher = CeleryDispatcher(celery_app, store)
    else:
        if embedding is None:
            from attest.knowledge.graph import load_graph
            from attest.semantic.embedding import Embedder

            e = settings.embed
            encoder = Embedder(e.model, device=e.device, batch_size=e.batch_size, backend=e.backend)
            await asyncio.to_thread(encoder.warm_up)
            graph = await asyncio.to_thread(load_graph, e.graph_path)
            embedding = Embedding.build(encoder, graph)
        chosen = embedding
        runner = StageRunner(store, settings.enrich, embedding=lambda: chosen, sinks=lambda: sinks)
        await asyncio.to_thread(chosen.warm_up)
        inline = InlineDispatcher(runner)
        dispatcher = inline
    closers.append(sinks.close)
    core = IngestCore(store, dispatcher, lambda: sinks, batch_size=settings.batch_size)
    assembly = Assembly(core=core, inline=inline, closers=closers)
    if celery_app is not None:
        from attest.pipeline.ingest import Watchdog

        assembly.watchdog = Watchdog(celery_app, core, pipeline.reconcile_interval_seconds)
    if inline is not None and settings.state_url is None:
        assembly.resumed = await asyncio.to_thread(core.recover)
        # Only stores opened here are checked at start-up. Behind services with
        # this SQLite registry (`serve all`), `attest doctor --data-dir` checks
        # them while the server is stopped; with a Redis registry, `attest doctor
        # --lexical-address/--semantic-address/--state-url` checks running services.
        if startup_check and isinstance(sinks, LocalSinks):
            assembly.startup_check = asyncio.get_running_loop().create_task(
                _startup_check(assembly)
            )
    return assembly
