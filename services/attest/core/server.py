"""The aio gRPC server bootstrap shared by every service.

Start-up order: bind, start, report NOT_SERVING, warm every service up, all
at once (each retrying until its backends answer), then report SERVING once
every one of them is warm. On SIGTERM or
SIGINT: report NOT_SERVING, stop accepting calls, let in-flight calls finish
within the grace period, then close the services.

Exposure: a server with authentication configured (API keys, JWKS, service
keys, or client certificates required) checks every call's credential. One
without serves every caller as tenant ``default`` and so refuses to bind
anything but a loopback address (the ``--insecure-dev`` laptop path). A
server hosting public services (answer, ingest) and internal ones (lexical,
semantic, rerank, generate, knowledge) together, with authentication, serves
them on two listeners: the public one at ``host:port``, the internal one at
``internal_host:internal_port`` for service identities only; an internal
method asked of the public listener is UNIMPLEMENTED there.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from attest.core.audit import AuditLog
from attest.core.auth import Authenticator, Surface, surface_of
from attest.core.channels import use_identity
from attest.core.interceptors import Guard, ServerInterceptor, Shedder
from attest.core.metrics import serve_metrics
from attest.core.quota import TenantQuotas
from attest.core.settings import ServerSettings, ServerTLSSettings

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Servicer(Protocol):
    """What a service hands to the server: its name, its handlers, its lifecycle.

    A servicer with admission control may also define ``shedders()``: a map
    from full method names to a check that returns the refusal a call of that
    method gets now, or None (see ``ServerInterceptor``). One whose requests
    may be larger than the server's ``max_message_bytes`` (ingest, whose 50 MB
    body is reported per item) defines ``max_message_bytes`` from its own
    settings: the limit of its methods wherever it is hosted, ``serve all``
    included.
    """

    #: Fully qualified gRPC service name, e.g. ``attest.lexical.v1.LexicalService``.
    service_name: str

    def register(self, server: grpc.aio.Server) -> None:
        """Add the generated servicer to ``server``."""

    async def warm_up(self) -> None:
        """Connect to backends and load models; raise if not ready yet."""

    async def close(self) -> None:
        """Release backends; called after the server stopped."""


class StartupRefused(RuntimeError):
    """The settings would expose the server; the message says what to change."""


def is_loopback(host: str) -> bool:
    name = host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def authenticated(settings: ServerSettings) -> bool:
    return settings.auth.enabled or settings.tls.require_client_cert


def check_exposure(settings: ServerSettings) -> None:
    """Refuse settings that would let anyone who reaches the port in."""
    address = f"{settings.host}:{settings.port}"
    if settings.insecure_dev:
        if authenticated(settings):
            raise StartupRefused(
                "--insecure-dev turns authentication off, but authentication is configured "
                "(auth.* or tls.require_client_cert); drop one of them"
            )
        if not is_loopback(settings.host):
            raise StartupRefused(
                f"refusing to serve {address} in development mode (--insecure-dev, no "
                "authentication): only a loopback address (127.0.0.1, ::1, localhost) may be "
                "bound; configure server.auth (API keys or a JWKS) to serve another address"
            )
        return
    if not authenticated(settings) and not is_loopback(settings.host):
        raise StartupRefused(
            f"refusing to serve {address} without authentication: anyone who reaches it could "
            "read and delete every tenant's documents. Configure server.auth.keys_file, "
            "server.auth.jwks_file or server.auth.jwks_url (for example "
            "ATTEST_ANSWER_SERVER__AUTH__KEYS_FILE=/etc/attest/keys/keys.yaml), or "
            "tls.require_client_cert for an internal service; or bind a loopback address "
            "with --insecure-dev for development"
        )


class _CertificateFiles:
    """The listener's PEM files, re-read when cert-manager (or anyone) replaces them.

    gRPC asks ``fetch`` before each new TLS handshake; it answers None (keep
    the current certificates) unless a file changed, at most once a second.
    Connections already open keep the certificates they were made with.
    """

    def __init__(self, tls: ServerTLSSettings) -> None:
        assert tls.cert_file is not None
        assert tls.key_file is not None
        self._paths = [tls.cert_file, tls.key_file]
        if tls.client_ca_file is not None:
            self._paths.append(tls.client_ca_file)
        self._tls = tls
        self._stamp = self._stat()
        self._checked = time.monotonic()

    def _stat(self) -> tuple[tuple[int, int], ...]:
        return tuple((st.st_mtime_ns, st.st_size) for st in (p.stat() for p in self._paths))

    def configuration(self) -> Any:
        tls = self._tls
        assert tls.cert_file is not None
        assert tls.key_file is not None
        return grpc.ssl_server_certificate_configuration(
            [(tls.key_file.read_bytes(), tls.cert_file.read_bytes())],
            root_certificates=(
                tls.client_ca_file.read_bytes() if tls.client_ca_file is not None else None
            ),
        )

    def fetch(self) -> Any:
        now = time.monotonic()
        if now - self._checked < 1.0:
            return None
        self._checked = now
        try:
            stamp = self._stat()
            if stamp == self._stamp:
                return None
            configuration = self.configuration()
        except OSError as exc:
            # Mid-rotation (a file replaced before its partner): try again later.
            log.warning("TLS files not readable, keeping the current ones: %s", exc)
            return None
        self._stamp = stamp
        log.info("TLS certificates reloaded from %s", self._paths[0])
        return configuration


def server_credentials(tls: ServerTLSSettings) -> grpc.ServerCredentials:
    """TLS credentials from the mounted PEM files, reloaded when they change;
    client certificates required for mTLS."""
    files = _CertificateFiles(tls)
    return grpc.dynamic_ssl_server_credentials(
        files.configuration(),
        files.fetch,
        require_client_authentication=tls.require_client_cert,
    )


class _Listener:
    """One grpc.aio server: a surface, its servicers, where it binds."""

    def __init__(
        self,
        surface: Surface,
        servicers: Sequence[Servicer],
        settings: ServerSettings,
        host: str,
        port: int,
        *,
        tls: bool,
        guard: Guard,
        health_servicer: health.aio.HealthServicer,
        audit: AuditLog | None = None,
    ) -> None:
        self.surface = surface
        self.host = host
        self.requested_port = port
        self.tls = tls
        self.port = 0
        # Each service keeps its own request-size limit in a shared process;
        # the transport admits twice the largest, so that a request over a
        # limit reaches the handler check and is refused naming its field.
        limits: dict[str, int] = {}
        for servicer in servicers:
            own = getattr(servicer, "max_message_bytes", None)
            if isinstance(own, int):
                limits[servicer.service_name] = own
        self.message_limits = limits
        transport_limit = max([settings.max_message_bytes, *limits.values()]) * 2
        shedders: dict[str, Shedder] = {}
        for servicer in servicers:
            # Optional: a servicer with admission control names the methods a
            # burst is shed from, and the check (see ServerInterceptor).
            provided = getattr(servicer, "shedders", None)
            if provided is not None:
                checks = provided()
                if both := sorted(shedders.keys() & checks.keys()):
                    raise ValueError(f"two servicers shed {both}")
                shedders.update(checks)
        self.server = grpc.aio.server(
            interceptors=[
                ServerInterceptor(
                    max_message_bytes=settings.max_message_bytes,
                    guard=guard,
                    shedders=shedders,
                    service_message_bytes=limits,
                    audit=audit,
                )
            ],
            maximum_concurrent_rpcs=settings.max_concurrent_rpcs,
            options=[
                ("grpc.max_receive_message_length", transport_limit),
                ("grpc.max_send_message_length", transport_limit),
                ("grpc.so_reuseport", 0),
                # Accept client keepalive pings down to every 10 s.
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1),
                # Ping each client after a minute without traffic and drop it after
                # 20 s without an answer: a Watch on a job that does not change
                # sends nothing, and without pings a vanished client (a node
                # lost, a partition) would hold its call, and its tenant's watch
                # slot, for the 2 hours of TCP's own keepalive.
                ("grpc.keepalive_time_ms", 60_000),
                ("grpc.keepalive_timeout_ms", 20_000),
                ("grpc.http2.max_pings_without_data", 0),
            ],
        )
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, self.server)
        for servicer in servicers:
            servicer.register(self.server)
        if settings.reflection:
            names = [s.service_name for s in servicers]
            names += [health.SERVICE_NAME, reflection.SERVICE_NAME]
            reflection.enable_server_reflection(names, self.server)

    def bind(self, settings: ServerSettings) -> int:
        address = f"{self.host}:{self.requested_port}"
        if self.tls:
            self.port = self.server.add_secure_port(address, server_credentials(settings.tls))
        else:
            self.port = self.server.add_insecure_port(address)
        if self.port == 0:
            raise OSError(f"could not bind {address}")
        return self.port


class Server:
    """One or two aio gRPC servers (public and internal) hosting the servicers."""

    def __init__(self, servicers: Sequence[Servicer], settings: ServerSettings) -> None:
        check_exposure(settings)
        if settings.identity.configured:
            use_identity(settings.identity)
        self._servicers = list(servicers)
        self._settings = settings
        self.health = health.aio.HealthServicer()
        self.audit = AuditLog(settings.audit.path, settings.audit.retention_days)
        self._listeners = self._plan()
        self.port = 0
        self.internal_port: int | None = None
        self._ready = asyncio.Event()
        self._stopping = asyncio.Event()
        self._warm_up_task: asyncio.Task[None] | None = None

    def _plan(self) -> list[_Listener]:
        settings = self._settings
        tls = settings.tls.enabled
        quotas = TenantQuotas(settings.quota, max_concurrent_rpcs=settings.max_concurrent_rpcs)
        if not authenticated(settings):
            # Development on loopback: one listener, every caller trusted.
            if not settings.insecure_dev:
                log.info(
                    "no authentication configured: serving %s as tenant `default` with every "
                    "scope (loopback only)",
                    settings.host,
                )
            guard = Guard(surface="public", authenticator=None, quotas=quotas)
            return [
                _Listener(
                    "public",
                    self._servicers,
                    settings,
                    settings.host,
                    settings.port,
                    tls=tls,
                    guard=guard,
                    health_servicer=self.health,
                    audit=self.audit,
                )
            ]
        authenticator = Authenticator(settings.auth)
        try:
            authenticator.check()
        except ValueError as exc:
            raise StartupRefused(str(exc)) from exc
        if not tls and not is_loopback(settings.host):
            log.warning(
                "serving %s without TLS: credentials cross the network in clear text unless "
                "something in front terminates TLS",
                settings.host,
            )
        by_surface: dict[Surface, list[Servicer]] = {"public": [], "internal": []}
        for servicer in self._servicers:
            by_surface[surface_of(servicer.service_name)].append(servicer)
        listeners: list[_Listener] = []
        for surface, hosted in by_surface.items():
            if not hosted:
                continue
            split = bool(by_surface["public"]) and surface == "internal"
            host = settings.internal_host if split else settings.host
            port = settings.internal_port if split else settings.port
            guard = Guard(
                surface=surface,
                authenticator=authenticator,
                quotas=quotas,
                verified_peers=settings.tls.require_client_cert,
            )
            listeners.append(
                _Listener(
                    surface,
                    hosted,
                    settings,
                    host,
                    port,
                    # The internal listener of `serve all` stays on loopback in plain text.
                    tls=tls and not (split and is_loopback(host)),
                    guard=guard,
                    health_servicer=self.health,
                    audit=self.audit,
                )
            )
        if not listeners:
            listeners.append(
                _Listener(
                    "public",
                    [],
                    settings,
                    settings.host,
                    settings.port,
                    tls=tls,
                    guard=Guard(surface="public", authenticator=authenticator, quotas=quotas),
                    health_servicer=self.health,
                    audit=self.audit,
                )
            )
        return listeners

    @property
    def ready(self) -> asyncio.Event:
        """Set once every servicer is warm and reported SERVING."""
        return self._ready

    async def _set_all(self, status: int) -> None:
        await self.health.set("", status)
        for servicer in self._servicers:
            await self.health.set(servicer.service_name, status)

    async def start(self) -> int:
        """Bind and start serving; warm-up continues in the background.

        Returns the port of the first listener (the public one when there
        are two); ``internal_port`` is the other one's.
        """
        for n, listener in enumerate(self._listeners):
            port = listener.bind(self._settings)
            if n == 0:
                self.port = port
            else:
                self.internal_port = port
        await self._set_all(NOT_SERVING)
        for listener in self._listeners:
            await listener.server.start()
            log.info(
                "listening on %s:%d (%s%s)",
                listener.host,
                listener.port,
                listener.surface,
                ", TLS" if listener.tls else "",
            )
        if self._settings.metrics_port is not None:
            serve_metrics(self._settings.metrics_port)
        self._warm_up_task = asyncio.create_task(self._warm_up())
        return self.port

    async def _warm_up(self) -> None:
        # Every servicer warms up at once: one waits on disk or a backend while
        # another loads a model (models loaded in this process are shared, so
        # the services of `serve all` load each model once, one after another).
        started = time.monotonic()
        await asyncio.gather(*(self._warm_up_one(servicer) for servicer in self._servicers))
        if self._stopping.is_set():
            return
        await self._set_all(SERVING)
        self._ready.set()
        log.info(
            "serving %s (warm-up %.1fs)",
            ", ".join(s.service_name for s in self._servicers),
            time.monotonic() - started,
        )

    async def _warm_up_one(self, servicer: Servicer) -> None:
        started = time.monotonic()
        while not self._stopping.is_set():
            try:
                await servicer.warm_up()
                log.info("%s warm in %.1fs", servicer.service_name, time.monotonic() - started)
                return
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

    async def stop(self, grace: float | None = None) -> None:
        """Report NOT_SERVING, drain in-flight calls for ``grace`` seconds, close."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        await self.health.enter_graceful_shutdown()
        grace = self._settings.grace_seconds if grace is None else grace
        log.info("shutting down; in-flight calls have %.1fs", grace)
        await asyncio.gather(*(listener.server.stop(grace) for listener in self._listeners))
        if self._warm_up_task is not None:
            await self._warm_up_task
        for servicer in self._servicers:
            try:
                await servicer.close()
            except Exception:
                log.exception("closing %s failed", servicer.service_name)
        self.audit.close()

    async def wait(self) -> None:
        await asyncio.gather(*(lis.server.wait_for_termination() for lis in self._listeners))

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
