"""TLS on the server and on ``create_channel``, and mTLS as a service identity.

Certificates come from a throwaway CA made for each test (``cryptography``).
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from attest.answer.v1 import answer_pb2, answer_pb2_grpc
from attest.core.auth import new_api_key
from attest.core.channels import create_channel
from attest.core.server import running
from attest.core.settings import (
    AuthSettings,
    ClientIdentity,
    ClientTLSSettings,
    ServerSettings,
    ServerTLSSettings,
)
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
from tests.integration.perimeter import Pki, TenantAnswer, TenantLexical, make_pki, write_keys

pytestmark = pytest.mark.integration


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
async def tls_answer(tmp_path: Path, pki: Pki) -> AsyncIterator[tuple[str, str]]:
    """A public service over TLS with an API key; yields (address, key)."""
    key = new_api_key()
    keys = tmp_path / "keys.json"
    write_keys(keys, [{"id": "a", "key": key, "tenant": "acme", "scopes": ["ask"]}])
    settings = ServerSettings(
        host="127.0.0.1",
        port=0,
        tls=ServerTLSSettings(cert_file=pki.server_cert, key_file=pki.server_key),
        auth=AuthSettings(keys_file=keys),
    )
    async with running([TenantAnswer()], settings) as server:
        yield f"localhost:{server.port}", key


async def _get(channel: grpc.aio.Channel) -> tuple[grpc.StatusCode, str]:
    try:
        reply = await answer_pb2_grpc.AnswerServiceStub(channel).Get(
            answer_pb2.GetRequest(job_id="j"), timeout=5
        )
    except grpc.aio.AioRpcError as err:
        return err.code(), err.details() or ""
    return grpc.StatusCode.OK, reply.job.job_id


async def test_tls_server_and_client_channel(tls_answer: tuple[str, str], pki: Pki) -> None:
    address, key = tls_answer
    security = ClientIdentity(tls=ClientTLSSettings(ca_file=pki.ca), token=key)
    channel = create_channel(address, identity=security)
    try:
        assert await _get(channel) == (grpc.StatusCode.OK, "acme|")
    finally:
        await channel.close()
    # A plain-text client cannot talk to the TLS listener at all.
    async with grpc.aio.insecure_channel(address) as plain:
        code, _ = await _get(plain)
    assert code == grpc.StatusCode.UNAVAILABLE
    # Nor can one that does not trust the server's CA (system roots only).
    untrusting = create_channel(
        address, identity=ClientIdentity(tls=ClientTLSSettings(enabled=True), token=key)
    )
    try:
        code, _ = await _get(untrusting)
    finally:
        await untrusting.close()
    assert code == grpc.StatusCode.UNAVAILABLE
    # TLS without a credential is still UNAUTHENTICATED.
    anonymous = create_channel(
        address, identity=ClientIdentity(tls=ClientTLSSettings(ca_file=pki.ca))
    )
    try:
        code, _ = await _get(anonymous)
    finally:
        await anonymous.close()
    assert code == grpc.StatusCode.UNAUTHENTICATED


async def test_mtls_client_certificate_is_a_service_identity(pki: Pki) -> None:
    """An internal service requiring client certificates: a verified certificate is
    a service identity (it may name the tenant); no certificate, no connection."""
    settings = ServerSettings(
        host="127.0.0.1",
        port=0,
        tls=ServerTLSSettings(
            cert_file=pki.server_cert,
            key_file=pki.server_key,
            client_ca_file=pki.ca,
            require_client_cert=True,
        ),
    )
    async with running([TenantLexical()], settings) as server:
        address = f"localhost:{server.port}"
        mutual = ClientIdentity(
            tls=ClientTLSSettings(
                ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key
            )
        )
        channel = create_channel(address, identity=mutual)
        try:
            reply = await lexical_pb2_grpc.LexicalServiceStub(channel).Stats(
                lexical_pb2.StatsRequest(), metadata=(("x-attest-tenant", "acme"),), timeout=5
            )
        finally:
            await channel.close()
        assert reply.backend == "acme"
        one_way = create_channel(
            address, identity=ClientIdentity(tls=ClientTLSSettings(ca_file=pki.ca))
        )
        try:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await lexical_pb2_grpc.LexicalServiceStub(one_way).Stats(
                    lexical_pb2.StatsRequest(), timeout=5
                )
        finally:
            await one_way.close()
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_certificates_reload_without_restart(tmp_path: Path) -> None:
    """Replaced certificate files serve new connections at once (cert-manager
    renewals, a new CA); the server is never restarted."""
    old, new = make_pki(tmp_path / "old"), make_pki(tmp_path / "new")
    live = tmp_path / "live"
    live.mkdir()
    cert, key = live / "tls.crt", live / "tls.key"
    shutil.copyfile(old.server_cert, cert)
    shutil.copyfile(old.server_key, key)
    keys = tmp_path / "keys.json"
    api_key = new_api_key()
    write_keys(keys, [{"id": "a", "key": api_key, "tenant": "acme", "scopes": ["ask"]}])
    settings = ServerSettings(
        host="127.0.0.1",
        port=0,
        tls=ServerTLSSettings(cert_file=cert, key_file=key),
        auth=AuthSettings(keys_file=keys),
    )

    async def call(ca: Path) -> grpc.StatusCode:
        identity = ClientIdentity(tls=ClientTLSSettings(ca_file=ca), token=api_key)
        channel = create_channel(address, identity=identity)
        try:
            code, _ = await _get(channel)
        finally:
            await channel.close()
        return code

    async with running([TenantAnswer()], settings) as server:
        address = f"localhost:{server.port}"
        assert await call(old.ca) == grpc.StatusCode.OK
        assert await call(new.ca) == grpc.StatusCode.UNAVAILABLE
        for source, target in ((new.server_key, key), (new.server_cert, cert)):
            tmp = target.with_suffix(".tmp")
            shutil.copyfile(source, tmp)
            tmp.replace(target)
        await asyncio.sleep(1.2)  # the files are looked at once a second at most
        assert await call(new.ca) == grpc.StatusCode.OK
        assert await call(old.ca) == grpc.StatusCode.UNAVAILABLE
