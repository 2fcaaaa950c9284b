"""Assembles the HTTP side of `serve all` / `serve answer`: the transcoded RPCs,
the OpenAPI document, the OpenAI-compatible endpoints and the evidence page."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from attest.answer.http import chat, openapi
from attest.answer.http.gateway import Gateway
from attest.answer.settings import HttpSettings
from attest.core.settings import ServerSettings


def build_gateway(
    target: str,
    services: set[str],
    http: HttpSettings,
    *,
    server_settings: ServerSettings,
    data_dir: Path,
) -> Gateway:
    gateway = Gateway(
        target,
        services,
        timeout_seconds=http.request_timeout_seconds,
        max_body_bytes=server_settings.max_message_bytes,
    )
    document = openapi.render()

    async def openapi_json(request: web.Request) -> web.Response:
        return web.Response(text=document, content_type="application/json")

    gateway.extra_routes.append(web.get("/openapi.json", openapi_json))
    if "attest.answer.v1.AnswerService" in services:
        gateway.extra_routes.extend(chat.routes(gateway))
    return gateway
