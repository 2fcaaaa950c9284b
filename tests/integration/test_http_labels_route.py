"""POST /v1/labels over HTTP: a body that is not a mark is refused with a
message saying what is wrong, and nothing is stored."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from attest.answer.http.app import page_routes
from attest.answer.http.labels import LabelStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def _tenant(request: web.Request) -> str:
    return "acme"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b'{"sentence": ', "the request body is not JSON: Expecting value"),
        (b'{"sentence": "\xff"}', "the request body is not JSON: 'utf-8' codec"),
        (
            b'{"sentence": "s", "source": "p", "label": "supports", "tenant": "other"}',
            "unknown field 'tenant'",
        ),
    ],
)
async def test_a_body_that_is_no_mark_is_refused_saying_why(
    tmp_path: Path, body: bytes, says: str
) -> None:
    app = web.Application()
    app.router.add_routes(page_routes(LabelStore(tmp_path), _tenant))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"http://127.0.0.1:{port}/v1/labels",
                data=body,
                headers={"content-type": "application/json"},
            ) as reply,
        ):
            assert reply.status == 400
            error = (await reply.json())["error"]
        assert error["status"] == "INVALID_ARGUMENT"
        assert error["message"].startswith(says), error
        assert LabelStore(tmp_path).marks("acme") == []
    finally:
        await runner.cleanup()
