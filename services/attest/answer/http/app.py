"""Assembles the HTTP side of `serve all` / `serve answer`: the transcoded RPCs,
the OpenAPI document, the OpenAI-compatible endpoints and the evidence page."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path

import grpc
from aiohttp import web

from attest.answer.http import chat, openapi
from attest.answer.http.gateway import FORWARDED_HEADERS, Gateway, error_response
from attest.answer.http.labels import LabelError, LabelStore, parse_mark
from attest.answer.settings import HttpSettings
from attest.core.auth import Authenticator
from attest.core.context import DEFAULT_TENANT
from attest.core.errors import AttestError, PermissionDenied
from attest.core.server import authenticated
from attest.core.settings import ServerSettings

#: Finds the tenant of an HTTP request the gateway answers itself (the labels).
Identify = Callable[[web.Request], Awaitable[str]]


def identifier(settings: ServerSettings) -> Identify:
    """The tenant of a request from its credential, checked as the gRPC listener
    checks it (the same keys file or JWKS); without authentication (development
    on loopback) every caller is tenant ``default``, as over gRPC."""
    if not authenticated(settings):

        async def development(request: web.Request) -> str:
            return DEFAULT_TENANT

        return development
    authenticator = Authenticator(settings.auth)

    async def identify(request: web.Request) -> str:
        metadata = {k: v for k in FORWARDED_HEADERS if (v := request.headers.get(k))}
        identity = await authenticator.identify(metadata)
        if not identity.allows("ask"):
            raise PermissionDenied(
                f"{identity.subject} lacks the ask scope, which marking citations needs"
            )
        return identity.tenant

    return identify


def page_routes(store: LabelStore, identify: Identify) -> list[web.RouteDef]:
    page = resources.files("attest.answer.http").joinpath("page.html").read_text("utf-8")

    async def index(request: web.Request) -> web.Response:
        return web.Response(
            text=page,
            content_type="text/html",
            headers={
                # Everything is inline; nothing may be fetched from elsewhere.
                "Content-Security-Policy": "default-src 'self'; style-src 'unsafe-inline'; "
                "script-src 'unsafe-inline'; img-src data:",
                "Cache-Control": "no-cache",
            },
        )

    async def label(request: web.Request) -> web.Response:
        try:
            tenant = await identify(request)
        except AttestError as exc:
            return error_response(grpc.StatusCode[exc.code], str(exc))
        try:
            body = json.loads(await request.read())
        except ValueError as exc:
            return error_response(
                grpc.StatusCode.INVALID_ARGUMENT, f"the request body is not JSON: {exc}"
            )
        try:
            record = parse_mark(body)
        except LabelError as exc:
            return error_response(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            await asyncio.to_thread(store.add, tenant, record)
        except LabelError as exc:
            return error_response(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return web.json_response({"id": record["id"], "label": record["label"]})

    return [web.get("/", index), web.post("/v1/labels", label)]


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
        store = LabelStore(data_dir)
        gateway.extra_routes.extend(page_routes(store, identifier(server_settings)))
    return gateway
