"""Credentials, scopes, tenants, quotas and the exposure rule, without sockets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attest.core.auth import (
    Authenticator,
    Identity,
    authorize,
    hash_key,
    new_api_key,
    parse_keys_file,
    required_scope,
    tenant_for,
)
from attest.core.errors import InvalidArgument, PermissionDenied, ResourceExhausted, Unauthenticated
from attest.core.quota import TenantQuotas
from attest.core.server import StartupRefused, check_exposure, is_loopback
from attest.core.settings import (
    AuthSettings,
    QuotaSettings,
    ServerSettings,
    ServerTLSSettings,
)


def _keys(path: Path, *entries: dict[str, object]) -> Path:
    path.write_text(json.dumps({"keys": list(entries)}), encoding="utf-8")
    return path


def test_required_scopes() -> None:
    assert required_scope("/attest.answer.v1.AnswerService/Ask") == "ask"
    assert required_scope("/attest.ingest.v1.IngestService/Delete") == "ingest"
    assert required_scope("/grpc.health.v1.Health/Check") is None
    assert required_scope("/attest.lexical.v1.LexicalService/Delete") == "internal"
    assert required_scope("/attest.semantic.v1.SemanticService/Index") == "internal"
    assert (
        required_scope("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo") == "admin"
    )


def test_authorize_and_tenant_rules() -> None:
    user = Identity("key:a", "acme", frozenset({"ask"}), "api-key")
    authorize(user, "/attest.answer.v1.AnswerService/Ask")
    with pytest.raises(PermissionDenied, match="`ingest` scope"):
        authorize(user, "/attest.ingest.v1.IngestService/Ingest")
    with pytest.raises(PermissionDenied):
        authorize(user, "/attest.lexical.v1.LexicalService/Delete")
    admin = Identity("key:o", "ops", frozenset({"admin"}), "api-key")
    authorize(admin, "/attest.lexical.v1.LexicalService/Delete")
    # Only a service identity (or admin) may name the tenant it acts for.
    header = {"x-attest-tenant": "globex"}
    assert tenant_for(user, header) == "acme"
    service = Identity("service", "default", frozenset({"internal"}), "service")
    assert tenant_for(service, header) == "globex"
    assert tenant_for(service, {}) == "default"
    # A tenant it names that is no tenant id is refused, never taken as its own.
    for bad in ("bad tenant\n", "*", "x" * 200, ""):
        with pytest.raises(InvalidArgument, match=r"x-attest-tenant .* is not a tenant id"):
            tenant_for(service, {"x-attest-tenant": bad})
    # A caller that may not name a tenant is not refused for a header it may not use.
    assert tenant_for(user, {"x-attest-tenant": "*"}) == "acme"


def test_keys_file_is_checked_entry_by_entry(tmp_path: Path) -> None:
    good = {"id": "a", "sha256": hash_key("k"), "tenant": "acme", "scopes": ["ask"]}
    assert parse_keys_file(json.dumps({"keys": [good]}).encode())[hash_key("k")].tenant == "acme"
    for bad, reason in (
        ({**good, "sha256": "abc"}, "64 hex"),
        ({**good, "tenant": "a b"}, "tenant"),
        ({**good, "scopes": ["root"]}, "scopes"),
    ):
        with pytest.raises(ValueError, match=reason):
            parse_keys_file(json.dumps({"keys": [bad]}).encode())
    with pytest.raises(ValueError, match="keys"):
        parse_keys_file(b"[1, 2]")


async def test_api_keys_hashed_revoked_and_reloaded(tmp_path: Path) -> None:
    key, other = new_api_key(), new_api_key()
    path = _keys(
        tmp_path / "keys.json",
        {"id": "a", "sha256": hash_key(key), "tenant": "acme", "scopes": ["ask", "ingest"]},
    )
    assert key not in path.read_text()
    auth = Authenticator(AuthSettings(keys_file=path, reload_check_seconds=0))
    who = await auth.identify({"authorization": f"Bearer {key}"})
    assert (who.tenant, who.scopes, who.subject) == (
        "acme",
        frozenset({"ask", "ingest"}),
        "key:a",
    )
    with pytest.raises(Unauthenticated, match="unknown API key"):
        await auth.identify({"x-api-key": other})
    _keys(
        path,
        {"id": "a", "sha256": hash_key(key), "tenant": "acme", "scopes": ["ask"], "revoked": True},
        {"id": "b", "sha256": hash_key(other), "tenant": "globex", "scopes": ["ask"]},
    )
    with pytest.raises(Unauthenticated, match="revoked API key"):
        await auth.identify({"authorization": f"Bearer {key}"})
    assert (await auth.identify({"x-api-key": other})).tenant == "globex"
    with pytest.raises(Unauthenticated, match="no credential"):
        await auth.identify({})
    # A verified client certificate, with no credential, is a service identity.
    cert = await auth.identify({}, ["attest-ingest"])
    assert (cert.kind, cert.scopes) == ("service", frozenset({"internal"}))


def test_missing_keys_file_fails_at_start_up(tmp_path: Path) -> None:
    auth = Authenticator(AuthSettings(keys_file=tmp_path / "absent.yaml"))
    with pytest.raises(ValueError, match="cannot be loaded"):
        auth.check()


def test_settings_refuse_weak_or_half_configurations(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"issuer and auth\.audience"):
        AuthSettings(jwks_file=tmp_path / "jwks.json")
    with pytest.raises(ValueError, match="asymmetric"):
        AuthSettings(jwks_file=tmp_path / "j", issuer="i", audience="a", algorithms=("HS256",))
    with pytest.raises(ValueError, match="go together"):
        ServerTLSSettings(cert_file=tmp_path / "c.pem")
    with pytest.raises(ValueError, match="client_ca_file"):
        ServerTLSSettings(
            cert_file=tmp_path / "c", key_file=tmp_path / "k", require_client_cert=True
        )


def test_exposure_rule(tmp_path: Path) -> None:
    assert [is_loopback(h) for h in ("127.0.0.1", "::1", "[::1]", "localhost")] == [True] * 4
    assert [is_loopback(h) for h in ("0.0.0.0", "10.0.0.5", "example.com")] == [False] * 3
    check_exposure(ServerSettings(host="127.0.0.1"))
    check_exposure(ServerSettings(host="127.0.0.1", insecure_dev=True))
    with pytest.raises(StartupRefused, match="without authentication"):
        check_exposure(ServerSettings(host="0.0.0.0"))
    with pytest.raises(StartupRefused, match="loopback"):
        check_exposure(ServerSettings(host="0.0.0.0", insecure_dev=True))
    keyed = AuthSettings(keys_file=tmp_path / "keys.yaml")
    check_exposure(ServerSettings(host="0.0.0.0", auth=keyed))
    with pytest.raises(StartupRefused, match="drop one"):
        check_exposure(ServerSettings(host="127.0.0.1", auth=keyed, insecure_dev=True))


def test_quota_token_bucket_and_in_flight() -> None:
    now = [100.0]
    quotas = TenantQuotas(
        QuotaSettings(requests_per_second=2, burst=2, max_in_flight_answers=1),
        clock=lambda: now[0],
    )
    get = "/attest.answer.v1.AnswerService/Get"
    ask = "/attest.answer.v1.AnswerService/Ask"
    quotas.admit("acme", get)()
    quotas.admit("acme", get)()
    with pytest.raises(ResourceExhausted) as caught:
        quotas.admit("acme", get)
    assert caught.value.retry_after == pytest.approx(0.5)
    quotas.admit("globex", get)()  # its own bucket
    now[0] += 0.25
    with pytest.raises(ResourceExhausted) as caught:
        quotas.admit("acme", get)
    assert caught.value.retry_after == pytest.approx(0.25)
    now[0] += 0.25
    release = quotas.admit("acme", ask)
    now[0] += 10
    with pytest.raises(ResourceExhausted, match="1 answers in flight"):
        quotas.admit("acme", ask)
    release()
    release()  # idempotent
    quotas.admit("acme", ask)()


def test_watch_caps_per_tenant_for_callers_without_a_credential_and_in_all() -> None:
    from attest.core.quota import UNAUTHENTICATED

    watch = "/attest.answer.v1.AnswerService/Watch"
    quotas = TenantQuotas(QuotaSettings(max_watches=3, watch_share=0.29), max_concurrent_rpcs=100)
    assert quotas._all_watches == 29  # 100 × 0.29, not 28 by float error
    held = [quotas.admit("acme", watch) for _ in range(3)]
    with pytest.raises(ResourceExhausted, match=r"'acme' already has 3 .*\(quota 3\)"):
        quotas.admit("acme", watch)
    held[0]()
    held[0] = quotas.admit("acme", watch)
    # Without a credential: a quarter of the server's 29 at most, under max_watches.
    small = TenantQuotas(QuotaSettings(max_watches=16), max_concurrent_rpcs=40)  # 10 in all
    anonymous = [small.watch(UNAUTHENTICATED) for _ in range(2)]
    with pytest.raises(ResourceExhausted, match=r"\(quota 2\)"):
        small.watch(UNAUTHENTICATED)
    assert len(anonymous) == 2
    for release in held:
        release()
