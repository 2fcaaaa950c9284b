"""The answer service's HTTP front door, served beside its gRPC listener.

``serve`` runs the gRPC server and, with ``HttpSettings.enabled``, an aiohttp
server on the same host that carries the annotated RPCs as JSON
(``gateway``), the OpenAI-compatible chat completions (``chat``), the OpenAPI
document (``openapi``) and the evidence page with its citation labels
(``page``). Every call the HTTP side makes goes through the gRPC listener, so
authentication, tenants, quotas and error codes are the gRPC ones.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence
from pathlib import Path

from attest.answer.settings import HttpSettings
from attest.core.server import Server, Servicer
from attest.core.settings import ServerSettings

log = logging.getLogger(__name__)


def grpc_target(host: str, port: int) -> str:
    """Where this process's gRPC listener is reached from inside the process."""
    if host in ("0.0.0.0", ""):
        return f"127.0.0.1:{port}"
    if host in ("::", "[::]"):
        return f"[::1]:{port}"
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


async def serve(
    servicers: Sequence[Servicer],
    settings: ServerSettings,
    http: HttpSettings,
    *,
    data_dir: Path,
) -> None:
    """Run the gRPC server and the HTTP gateway until SIGTERM or SIGINT."""
    from attest.answer.http.app import build_gateway

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = Server(servicers, settings)
    port = await server.start()
    gateway = None
    try:
        if http.enabled and settings.tls.enabled:
            log.warning(
                "the HTTP gateway is not started: the gRPC listener uses TLS, which the gateway "
                "does not terminate; put a TLS-terminating proxy in front of a plain-text "
                "deployment or set ATTEST_ANSWER_HTTP__ENABLED=false to silence this"
            )
        elif http.enabled:
            gateway = build_gateway(
                grpc_target(settings.host, port),
                {s.service_name for s in servicers},
                http,
                server_settings=settings,
                data_dir=data_dir,
            )
            await gateway.start(settings.host, http.port)
        await stop.wait()
    finally:
        if gateway is not None:
            await gateway.stop()
        await server.stop()
