"""A service's own call downstream, made while serving a request, acts for that
request's tenant without naming it (generate's re-search is such a call); a
client cannot choose the tenant, and outside a request nothing is implied.

A public service and an internal one on a real server with API keys; the
public one calls the internal one under the service identity, naming no
tenant, and reports the tenant the internal one saw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from attest.answer.v1 import answer_pb2
from attest.core.auth import TENANT_KEY, hash_key, new_api_key
from attest.core.channels import create_channel
from attest.core.context import tenant_var
from attest.core.server import running
from attest.core.settings import AuthSettings, ClientIdentity, ServerSettings
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
from tests.integration.perimeter import TenantAnswer, TenantLexical, write_keys
from tests.integration.test_auth import get

pytestmark = pytest.mark.integration


class UnnamedTenantAnswer(TenantAnswer):
    """Get calls the internal service without naming a tenant."""

    async def Get(self, request: answer_pb2.GetRequest, context: Any) -> answer_pb2.GetResponse:
        assert self.internal_address is not None
        if self._channel is None:
            self._channel = create_channel(self.internal_address, identity=self._identity)
        stats = await lexical_pb2_grpc.LexicalServiceStub(self._channel).Stats(
            lexical_pb2.StatsRequest(), timeout=5
        )
        return answer_pb2.GetResponse(
            job=answer_pb2.Job(job_id=f"{tenant_var.get()}|{stats.backend}")
        )


async def test_calls_made_while_serving_carry_the_request_tenant(tmp_path: Path) -> None:
    keys = {t: new_api_key() for t in ("acme", "globex")}
    service_key = new_api_key()
    keys_file = tmp_path / "keys.json"
    write_keys(
        keys_file, [{"id": t, "key": k, "tenant": t, "scopes": ["ask"]} for t, k in keys.items()]
    )
    settings = ServerSettings(
        host="127.0.0.1",
        port=0,
        auth=AuthSettings(keys_file=keys_file, service_key_sha256=(hash_key(service_key),)),
    )
    identity = ClientIdentity(token=service_key)
    answer = UnnamedTenantAnswer(identity)
    async with running([answer, TenantLexical()], settings) as server:
        assert server.internal_port is not None
        answer.internal_address = f"127.0.0.1:{server.internal_port}"
        public = f"127.0.0.1:{server.port}"
        for tenant, key in keys.items():
            bearer = ("authorization", f"Bearer {key}")
            assert await get(public, bearer) == (grpc.StatusCode.OK, f"{tenant}|{tenant}")
            # A client naming another tenant changes nothing, here or downstream.
            other = "globex" if tenant == "acme" else "acme"
            assert await get(public, bearer, (TENANT_KEY, other)) == (
                grpc.StatusCode.OK,
                f"{tenant}|{tenant}",
            )
        # Outside any request (a worker, a command) a service call names no tenant.
        channel = create_channel(answer.internal_address, identity=identity)
        try:
            stats = await lexical_pb2_grpc.LexicalServiceStub(channel).Stats(
                lexical_pb2.StatsRequest(), timeout=5
            )
        finally:
            await channel.close()
        assert stats.backend == "default"
