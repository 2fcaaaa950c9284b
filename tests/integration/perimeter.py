"""Throwaway credentials and small servicers for the perimeter tests and benchmark.

A CA with server and client certificates (``cryptography``), an RSA signing
key with its JWKS and tokens (PyJWT), a keys file, and two servicers standing
in for the public and internal services: they report the tenant their call
was served as, and the public one calls the internal one through a client
channel, so a test sees what the perimeter decided without any backend.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import jwt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from attest.answer.v1 import answer_pb2, answer_pb2_grpc
from attest.core.auth import hash_key, tenant_metadata
from attest.core.channels import create_channel
from attest.core.context import tenant_var
from attest.core.settings import ClientIdentity
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc

ISSUER = "https://issuer.test"
AUDIENCE = "attest"


# -- TLS -------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def make_pki(folder: Path) -> Pki:
    """A CA, a server certificate for localhost/127.0.0.1, a client certificate ``ingest``."""
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("attest test CA"))
        .issuer_name(_name("attest test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(common_name: str, usage: x509.ObjectIdentifier) -> tuple[Any, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName(common_name),
                        x509.DNSName("localhost"),
                        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    ]
                ),
                critical=False,
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return key, cert

    server_key, server_cert = leaf("attest-answer", ExtendedKeyUsageOID.SERVER_AUTH)
    client_key, client_cert = leaf("attest-ingest", ExtendedKeyUsageOID.CLIENT_AUTH)
    pki = Pki(
        ca=folder / "ca.pem",
        server_cert=folder / "server.pem",
        server_key=folder / "server.key",
        client_cert=folder / "client.pem",
        client_key=folder / "client.key",
    )
    pki.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    pki.client_cert.write_bytes(client_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(server_key, pki.server_key)
    _write_key(client_key, pki.client_key)
    return pki


# -- JWT ---------------------------------------------------------------------------


class Issuer:
    """An RSA key, its JWKS file, and tokens signed with it."""

    def __init__(self, folder: Path, kid: str = "k1") -> None:
        self.kid = kid
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.key.public_key()))
        public.update({"kid": kid, "use": "sig", "alg": "RS256"})
        self.jwks = folder / "jwks.json"
        self.jwks.write_text(json.dumps({"keys": [public]}), encoding="utf-8")

    def token(
        self,
        *,
        tenant: str | None = "acme",
        scope: str = "ask",
        audience: str = AUDIENCE,
        issuer: str = ISSUER,
        expires_in: float = 300,
        key: rsa.RSAPrivateKey | None = None,
    ) -> str:
        now = int(time.time())
        claims: dict[str, Any] = {
            "iss": issuer,
            "aud": audience,
            "sub": "user-1",
            "iat": now,
            "exp": now + int(expires_in),
            "scope": scope,
        }
        if tenant is not None:
            claims["tenant"] = tenant
        return jwt.encode(claims, key or self.key, algorithm="RS256", headers={"kid": self.kid})


# -- API keys ----------------------------------------------------------------------


def write_keys(path: Path, entries: list[dict[str, Any]]) -> None:
    """Write a keys file; each entry's ``key`` is stored only as its SHA-256."""
    stored = []
    for entry in entries:
        entry = dict(entry)
        entry["sha256"] = hash_key(entry.pop("key"))
        stored.append(entry)
    # Write then rename, as a mounted secret is updated: never a half file.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"keys": stored}), encoding="utf-8")
    tmp.replace(path)


# -- servicers ---------------------------------------------------------------------


class TenantLexical(lexical_pb2_grpc.LexicalServiceServicer):
    """An internal service whose Stats names the tenant it served."""

    service_name = "attest.lexical.v1.LexicalService"

    def register(self, server: grpc.aio.Server) -> None:
        lexical_pb2_grpc.add_LexicalServiceServicer_to_server(self, server)

    async def warm_up(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def Stats(
        self, request: lexical_pb2.StatsRequest, context: Any
    ) -> lexical_pb2.StatsResponse:
        return lexical_pb2.StatsResponse(documents=0, backend=tenant_var.get())


class TenantAnswer(answer_pb2_grpc.AnswerServiceServicer):
    """A public service: Get names its tenant and the one the internal service saw
    when called under the service identity for that tenant;
    Ask holds the call for ``hold`` seconds (in-flight quotas)."""

    service_name = "attest.answer.v1.AnswerService"

    def __init__(self, identity: ClientIdentity | None = None) -> None:
        self.internal_address: str | None = None
        self.hold = 0.0
        self._identity = identity
        self._channel: grpc.aio.Channel | None = None

    def register(self, server: grpc.aio.Server) -> None:
        answer_pb2_grpc.add_AnswerServiceServicer_to_server(self, server)

    async def warm_up(self) -> None:
        return None

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    async def Get(self, request: answer_pb2.GetRequest, context: Any) -> answer_pb2.GetResponse:
        seen = ""
        if self.internal_address is not None:
            if self._channel is None:
                self._channel = create_channel(self.internal_address, identity=self._identity)
            stats = await lexical_pb2_grpc.LexicalServiceStub(self._channel).Stats(
                lexical_pb2.StatsRequest(), metadata=tenant_metadata(tenant_var.get()), timeout=5
            )
            seen = stats.backend
        return answer_pb2.GetResponse(job=answer_pb2.Job(job_id=f"{tenant_var.get()}|{seen}"))

    async def Ask(self, request: answer_pb2.AskRequest, context: Any) -> answer_pb2.AskResponse:
        await asyncio.sleep(self.hold)
        return answer_pb2.AskResponse()

    async def Watch(self, request: answer_pb2.WatchRequest, context: Any) -> AsyncIterator[Any]:
        """A job no worker takes: one QUEUED state, then open until the caller leaves."""
        job = answer_pb2.Job(job_id=f"{tenant_var.get()}|", state=answer_pb2.JOB_STATE_QUEUED)
        yield answer_pb2.WatchResponse(job=job)
        await asyncio.Event().wait()
