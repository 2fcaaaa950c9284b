"""The aio gRPC server bootstrap shared by every service.

Start-up order: bind, start, report NOT_SERVING, warm every service up
(retrying until its backends answer), then report SERVING. On SIGTERM or
SIGINT: report NOT_SERVING, stop accepting calls, let in-flight calls finish
within the grace period, then close the services.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Sequence
from typing import Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from attest.core.interceptors import ServerInterceptor
from attest.core.metrics import serve_metrics
from attest.core.settings import ServerSettings

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Servicer(Protocol):
    """What a service hands to the server: its name, its handlers, its lifecycle."""

    #: Fully qualified gRPC service name, e.g. ``attest.lexical.v1.LexicalService``.
    service_name: str

    def register(self, server: grpc.aio.Server) -> None:
        """Add the generated servicer to ``server``."""

    async def warm_up(self) -> None:
        """Connect to backends and load models; raise if not ready yet."""

    async def close(self) -> None:
        """Release backends; called after the server stopped."""


class Server:
    """One aio gRPC server hosting one or more servicers."""

    def __init__(self, servicers: Sequence[Servicer], settings: ServerSettings) -> None:
        self._servicers = list(servicers)
        self._settings = settings
        transport_limit = settings.max_message_bytes * 2
        self._server = grpc.aio.server(
            interceptors=[ServerInterceptor(max_message_bytes=settings.max_message_bytes)],
            maximum_concurrent_rpcs=settings.max_concurrent_rpcs,
            options=[
                ("grpc.max_receive_message_length", transport_limit),
                ("grpc.max_send_message_length", transport_limit),
                ("grpc.so_reuseport", 0),
                # Accept client keepalive pings down to every 10 s.
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1),
            ],
        )
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        for servicer in self._servicers:
            servicer.register(self._server)
        if settings.reflection:
            names = [s.service_name for s in self._servicers]
            names += [health.SERVICE_NAME, reflection.SERVICE_NAME]
            reflection.enable_server_reflection(names, self._server)
        self.port = 0
        self._ready = asyncio.Event()
        self._stopping = asyncio.Event()
        self._warm_up_task: asyncio.Task[None] | None = None

    @property
    def ready(self) -> asyncio.Event:
        """Set once every servicer is warm and reported SERVING."""
        return self._ready

    async def _set_all(self, status: int) -> None:
        await self.health.set("", status)
        for servicer in self._servicers:
            await self.health.set(servicer.service_name, status)

    async def start(self) -> int:
        """Bind and start serving; warm-up continues in the background."""
        address = f"{self._settings.host}:{self._settings.port}"
        self.port = self._server.add_insecure_port(address)
        if self.port == 0:
            raise OSError(f"could not bind {address}")
        await self._set_all(NOT_SERVING)
        await self._server.start()
        if self._settings.metrics_port is not None:
            serve_metrics(self._settings.metrics_port)
        log.info("listening on %s:%d", self._settings.host, self.port)
        self._warm_up_task = asyncio.create_task(self._warm_up())
        return self.port

    async def _warm_up(self) -> None:
        for servicer in self._servicers:
            while not self._stopping.is_set():
                try:
                    await servicer.warm_up()
                    break
                except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
                    log.warning(
                        "%s not ready: %s; retrying in %.1fs",
                        servicer.service_name,
                        exc,
                        self._settings.warm_up_retry_seconds,
                    )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self._stopping.wait(), self._settings.warm_up_retry_seconds
                        )
        if self._stopping.is_set():
            return
        await self._set_all(SERVING)
        self._ready.set()
        log.info("serving %s", ", ".join(s.service_name for s in self._servicers))

    async def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, drain in-flight calls for ``grace`` seconds, close."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        await self.health.enter_graceful_shutdown()
        grace = self._settings.grace_seconds if grace is None else grace
        log.info("shutting down; in-flight calls have %.1fs", grace)
        await self._server.stop(grace)
        if self._warm_up_task is not None:
            await self._warm_up_task
        for servicer in self._servicers:
            try:
                await servicer.close()
            except Exception:
                log.exception("closing %s failed", servicer.service_name)

    async def wait(self) -> None:
        await self._server.wait_for_termination()

    async def run_until_signal(self) -> None:
        """Serve until SIGTERM or SIGINT, then shut down gracefully."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        await stop.wait()
        await self.stop()


@contextlib.asynccontextmanager
async def running(
    servicers: Sequence[Servicer], settings: ServerSettings, *, ready_timeout: float = 60.0
) -> AsyncIterator[Server]:
    """Serve ``servicers`` in this process until the block exits (CLI, tests, demo).

    Waits until every servicer is warm; raises TimeoutError if that takes
    longer than ``ready_timeout`` seconds.
    """
    server = Server(servicers, settings)
    await server.start()
    try:
        await asyncio.wait_for(server.ready.wait(), ready_timeout)
        yield server
    finally:
        await server.stop()


async def serve(servicers: Sequence[Servicer], settings: ServerSettings) -> None:
    """Run a server until SIGTERM/SIGINT (the entry point of every service process)."""
    # The aio server binds to the running loop, so it is built inside it.
    await Server(servicers, settings).run_until_signal()
