"""The perimeter on a real server: credentials, scopes, tenants, listeners, rotation.

One server hosts a public service (answer) and an internal one (lexical) with
authentication on, so it serves them on two listeners. Each case sends a real
call and checks the status code a client gets; the public service calls the
internal one under the service identity, and both report the tenant they
served, so the tests see where the tenant came from.
"""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from attest.answer.v1 import answer_pb2, answer_pb2_grpc
from attest.core.auth import hash_key, new_api_key
from attest.core.channels import create_channel
from attest.core.server import Server, running
from attest.core.settings import AuthSettings, ClientIdentity, ServerSettings
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
from tests.integration.perimeter import (
    AUDIENCE,
    ISSUER,
    Issuer,
    TenantAnswer,
    TenantLexical,
    write_keys,
)

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "attest.cli"]


@dataclass
class Stack:
    server: Server
    public: str
    internal: str
    keys_file: Path
    issuer: Issuer
    ask_key: str
    ingest_key: str
    admin_key: str
    revoked_key: str
    service_key: str

    def entries(self) -> list[dict[str, object]]:
        return [
            {"id": "ask", "key": self.ask_key, "tenant": "acme", "scopes": ["ask"]},
            {"id": "ingest", "key": self.ingest_key, "tenant": "acme", "scopes": ["ingest"]},
            {"id": "admin", "key": self.admin_key, "tenant": "ops", "scopes": ["admin"]},
            {
                "id": "old",
                "key": self.revoked_key,
                "tenant": "acme",
                "scopes": ["ask"],
                "revoked": True,
            },
        ]


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    issuer = Issuer(tmp_path)
    keys_file = tmp_path / "keys.json"
    service_key = new_api_key()
    s = Stack(
        server=None,  # type: ignore[arg-type]
        public="",
        internal="",
        keys_file=keys_file,
        issuer=issuer,
        ask_key=new_api_key(),
        ingest_key=new_api_key(),
        admin_key=new_api_key(),
        revoked_key=new_api_key(),
        service_key=service_key,
    )
    write_keys(keys_file, s.entries())
    settings = ServerSettings(
        host="127.0.0.1",
        port=0,
        auth=AuthSettings(
            keys_file=keys_file,
            jwks_file=issuer.jwks,
            issuer=ISSUER,
            audience=AUDIENCE,
            leeway_seconds=30,
            reload_check_seconds=0,
            service_key_sha256=(hash_key(service_key),),
        ),
    )
    answer = TenantAnswer(ClientIdentity(token=service_key))
    async with running([answer, TenantLexical()], settings) as server:
        assert server.internal_port is not None
        answer.internal_address = f"127.0.0.1:{server.internal_port}"
        s.server = server
        s.public = f"127.0.0.1:{server.port}"
        s.internal = answer.internal_address
        yield s


async def get(address: str, *metadata: tuple[str, str]) -> tuple[grpc.StatusCode, str]:
    """Answer.Get with ``metadata``: (code, job id or error details)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = answer_pb2_grpc.AnswerServiceStub(channel)
        try:
            reply = await stub.Get(answer_pb2.GetRequest(job_id="j"), metadata=metadata, timeout=10)
        except grpc.aio.AioRpcError as err:
            return err.code(), err.details() or ""
        return grpc.StatusCode.OK, reply.job.job_id


async def stats(address: str, *metadata: tuple[str, str]) -> tuple[grpc.StatusCode, str]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = lexical_pb2_grpc.LexicalServiceStub(channel)
        try:
            reply = await stub.Stats(lexical_pb2.StatsRequest(), metadata=metadata, timeout=10)
        except grpc.aio.AioRpcError as err:
            return err.code(), err.details() or ""
        return grpc.StatusCode.OK, reply.backend


def bearer(credential: str) -> tuple[str, str]:
    return ("authorization", f"Bearer {credential}")


async def test_missing_credential_is_unauthenticated(stack: Stack) -> None:
    code, details = await get(stack.public)
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert "no credential" in details
    code, _ = await get(stack.public, ("authorization", "Basic dXNlcjpwYXNz"))
    assert code == grpc.StatusCode.UNAUTHENTICATED


async def test_valid_jwt_sets_tenant_here_and_downstream(stack: Stack) -> None:
    token = stack.issuer.token(tenant="acme", scope="ask")
    # A client-set tenant header is ignored: the tenant is the token's, and the
    # internal service sees the same one through the service identity.
    assert await get(stack.public, bearer(token), ("x-attest-tenant", "other")) == (
        grpc.StatusCode.OK,
        "acme|acme",
    )
    token = stack.issuer.token(tenant="globex", scope="ask ingest")
    assert await get(stack.public, bearer(token)) == (grpc.StatusCode.OK, "globex|globex")


async def test_expired_token_is_unauthenticated_beyond_the_skew(stack: Stack) -> None:
    expired = stack.issuer.token(expires_in=-120)
    assert await get(stack.public, bearer(expired)) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "token expired",
    )
    # Expired 5 s ago, within the 30 s clock-skew leeway: accepted.
    skewed = stack.issuer.token(expires_in=-5)
    assert (await get(stack.public, bearer(skewed)))[0] == grpc.StatusCode.OK


async def test_wrong_audience_issuer_or_key_is_unauthenticated(
    stack: Stack, tmp_path: Path
) -> None:
    wrong_aud = stack.issuer.token(audience="someone-else")
    assert await get(stack.public, bearer(wrong_aud)) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "token is for another audience",
    )
    wrong_iss = stack.issuer.token(issuer="https://evil.test")
    assert (await get(stack.public, bearer(wrong_iss)))[0] == grpc.StatusCode.UNAUTHENTICATED
    (tmp_path / "other").mkdir()
    forged = Issuer(tmp_path / "other")
    forged_token = forged.token()  # same kid, another key
    assert await get(stack.public, bearer(forged_token)) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "invalid token",
    )
    no_tenant = stack.issuer.token(tenant=None)
    assert (await get(stack.public, bearer(no_tenant)))[0] == grpc.StatusCode.UNAUTHENTICATED


async def test_api_keys_revoked_unknown_and_scoped(stack: Stack) -> None:
    assert await get(stack.public, bearer(stack.ask_key)) == (grpc.StatusCode.OK, "acme|acme")
    assert await get(stack.public, ("x-api-key", stack.ask_key)) == (
        grpc.StatusCode.OK,
        "acme|acme",
    )
    assert await get(stack.public, bearer(stack.revoked_key)) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "revoked API key",
    )
    assert await get(stack.public, bearer(new_api_key())) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "unknown API key",
    )
    # Known, but without the scope: PERMISSION_DENIED (key and token alike).
    code, details = await get(stack.public, bearer(stack.ingest_key))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert "`ask` scope" in details
    ingest_token = stack.issuer.token(scope="ingest")
    assert (await get(stack.public, bearer(ingest_token)))[0] == grpc.StatusCode.PERMISSION_DENIED
    # admin holds every scope.
    assert await get(stack.public, bearer(stack.admin_key)) == (grpc.StatusCode.OK, "ops|ops")


async def test_more_than_one_credential_header_is_unauthenticated(stack: Stack) -> None:
    # Each alone is accepted (above); together, whichever came last used to win.
    pairs = [
        (bearer(stack.revoked_key), bearer(stack.admin_key)),
        (bearer(stack.admin_key), bearer(stack.admin_key)),
        (bearer(stack.ask_key), ("x-api-key", stack.admin_key)),
        (("x-api-key", stack.admin_key), bearer(stack.ask_key)),
        (("x-api-key", stack.ask_key), ("x-api-key", stack.ask_key)),
    ]
    for first, second in pairs:
        code, details = await get(stack.public, first, second)
        assert code == grpc.StatusCode.UNAUTHENTICATED, (first[0], second[0])
        assert details.startswith(f"more than one credential header ({first[0]}, {second[0]})")
        assert "send exactly one" in details
    # The internal listener follows the same rule.
    code, details = await stats(
        stack.internal, bearer(stack.service_key), bearer(stack.service_key)
    )
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert "more than one credential header" in details


async def test_internal_rpcs_are_not_on_the_public_listener(stack: Stack) -> None:
    # Whatever the credential, the public listener does not serve LexicalService.
    for metadata in ((), (bearer(stack.admin_key),), (bearer(stack.service_key),)):
        code, _ = await stats(stack.public, *metadata)
        assert code == grpc.StatusCode.UNIMPLEMENTED
    # The internal listener wants a service identity.
    assert (await stats(stack.internal))[0] == grpc.StatusCode.UNAUTHENTICATED
    code, details = await stats(stack.internal, bearer(stack.ask_key))
    assert (code, "`internal` scope" in details) == (grpc.StatusCode.PERMISSION_DENIED, True)
    user_token = stack.issuer.token(scope="ask ingest")
    assert (await stats(stack.internal, bearer(user_token)))[0] == (
        grpc.StatusCode.PERMISSION_DENIED
    )
    # A service names the tenant it acts for; anyone else cannot.
    assert await stats(stack.internal, bearer(stack.service_key), ("x-attest-tenant", "acme")) == (
        grpc.StatusCode.OK,
        "acme",
    )
    # And the public services are not on the internal listener.
    assert (await get(stack.internal, bearer(stack.ask_key)))[0] == (grpc.StatusCode.UNIMPLEMENTED)


async def test_health_needs_no_credential(stack: Stack) -> None:
    async with grpc.aio.insecure_channel(stack.public) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="attest.answer.v1.AnswerService"), timeout=5
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_key_rotation_without_restart(stack: Stack) -> None:
    port = stack.server.port
    old = stack.ask_key
    assert (await get(stack.public, bearer(old)))[0] == grpc.StatusCode.OK
    new = new_api_key()
    # Rotate: the new key goes in next to the old one, then the old one goes.
    entries = stack.entries()
    entries.append({"id": "ask-2", "key": new, "tenant": "acme", "scopes": ["ask"]})
    write_keys(stack.keys_file, entries)
    assert await get(stack.public, bearer(new)) == (grpc.StatusCode.OK, "acme|acme")
    assert (await get(stack.public, bearer(old)))[0] == grpc.StatusCode.OK
    entries = [e for e in entries if e["id"] != "ask"]
    write_keys(stack.keys_file, entries)
    assert await get(stack.public, bearer(old)) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "unknown API key",
    )
    assert (await get(stack.public, bearer(new)))[0] == grpc.StatusCode.OK
    # A broken write keeps the last good keys instead of locking everyone out.
    stack.keys_file.write_text("{not yaml: [", encoding="utf-8")
    assert (await get(stack.public, bearer(new)))[0] == grpc.StatusCode.OK
    assert stack.server.port == port  # the same server all along


def _serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "serve", *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_non_loopback_without_auth_refuses_to_start() -> None:
    began = time.monotonic()
    plain = _serve("lexical", "--port", "0")
    assert plain.returncode != 0
    assert "refusing to serve 0.0.0.0:0 without authentication" in plain.stderr
    dev = _serve("lexical", "--port", "0", "--insecure-dev", "--host", "0.0.0.0")
    assert dev.returncode != 0
    assert "only a loopback address" in dev.stderr
    both = _serve(
        "all",
        "--embedded",
        "--port",
        "0",
        "--host",
        "0.0.0.0",
        env={"ATTEST_DATA_DIR": "/nonexistent-attest-data"},
    )
    assert both.returncode != 0
    assert "only a loopback address" in both.stderr
    # `serve all` without --embedded is development mode too without authentication.
    plain_all = _serve("all", "--port", "0", "--host", "0.0.0.0")
    assert plain_all.returncode != 0
    assert "refusing to serve 0.0.0.0" in plain_all.stderr
    assert time.monotonic() - began < 120


async def test_client_channels_send_the_token_on_every_kind_of_call(stack: Stack) -> None:
    """create_channel's token reaches unary and streaming calls alike (AskStream is not
    implemented by the stand-in servicer: UNIMPLEMENTED means the perimeter let it in)."""
    request = answer_pb2.AskStreamRequest(question="q")
    for identity, expected in (
        (ClientIdentity(token=stack.ask_key), grpc.StatusCode.UNIMPLEMENTED),
        (ClientIdentity(), grpc.StatusCode.UNAUTHENTICATED),
    ):
        channel = create_channel(stack.public, identity=identity)
        try:
            stub = answer_pb2_grpc.AnswerServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                async for _ in stub.AskStream(request, timeout=10):
                    pass
            assert caught.value.code() == expected
            if expected == grpc.StatusCode.UNIMPLEMENTED:
                reply = await stub.Get(answer_pb2.GetRequest(job_id="j"), timeout=10)
                assert reply.job.job_id == "acme|acme"
        finally:
            await channel.close()


async def test_jwks_from_a_url(tmp_path: Path) -> None:
    """The JWKS fetched over HTTP (off the event loop) and cached: tokens of the
    issuer pass, a token of an unknown key does not."""
    issuer = Issuer(tmp_path)
    body = issuer.jwks.read_bytes()
    fetched: list[str] = []

    class Jwks(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            fetched.append(self.path)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Jwks)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        settings = ServerSettings(
            host="127.0.0.1",
            port=0,
            auth=AuthSettings(
                jwks_url=f"http://127.0.0.1:{httpd.server_address[1]}/jwks.json",
                issuer=ISSUER,
                audience=AUDIENCE,
            ),
        )
        async with running([TenantAnswer()], settings) as server:
            address = f"127.0.0.1:{server.port}"
            for tenant in ("acme", "globex", "acme"):
                token = issuer.token(tenant=tenant)
                assert await get(address, bearer(token)) == (grpc.StatusCode.OK, f"{tenant}|")
            (tmp_path / "other").mkdir()
            stranger = Issuer(tmp_path / "other", kid="k9").token()
            assert (await get(address, bearer(stranger)))[0] == grpc.StatusCode.UNAUTHENTICATED
            # No keys file here: an API key is unknown.
            assert (await get(address, bearer(new_api_key())))[0] == (
                grpc.StatusCode.UNAUTHENTICATED
            )
        # One fetch served the three tokens; the unknown key id may add one more.
        assert 1 <= len(fetched) <= 2, fetched
    finally:
        httpd.shutdown()
        httpd.server_close()
