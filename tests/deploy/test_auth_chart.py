"""The chart's perimeter: credentials by reference, TLS, and who may reach what."""

from __future__ import annotations

from functools import cache

import pytest

from tests.deploy.chart import Rendered, RenderError, full, render

SERVICES = ["answer", "ingest", "lexical", "semantic", "rerank", "generate", "knowledge"]
INTERNAL = ["lexical", "semantic", "rerank", "generate", "knowledge"]
CALLERS = {"answer", "ingest", "generate"}  # services with peers
# off by default; enabled wherever every service is checked
KNOWLEDGE = "services.knowledge.enabled=true"
TLS = (
    "security.tls.existingSecret=attest-tls",
    "security.tls.mutual=true",
    "security.jwt.jwksUrl=https://idp.example/jwks",
    "security.jwt.issuer=https://idp.example",
    "security.jwt.audience=attest",
)


@cache
def rendered(values: str, *sets: str) -> Rendered:
    return render(values, *sets)


def _volumes(out: Rendered, deployment: str) -> dict[str, dict[str, object]]:
    spec = out.get("Deployment", deployment)["spec"]["template"]["spec"]
    return {v["name"]: v for v in spec["volumes"]}


@pytest.mark.parametrize("service", SERVICES)
def test_every_service_checks_keys_from_a_mounted_secret(service: str) -> None:
    out = rendered("default", KNOWLEDGE)
    env = out.env(full(service))
    prefix = f"ATTEST_{service.upper()}_"
    assert env[f"{prefix}SERVER__AUTH__KEYS_FILE"]["value"] == "/etc/attest/keys/keys.yaml"
    # A folder mount (no subPath): Kubernetes updates it in place, the service re-reads it.
    mounts = {m["name"]: m for m in out.container(full(service))["volumeMounts"]}
    assert mounts["api-keys"] == {
        "name": "api-keys",
        "mountPath": "/etc/attest/keys",
        "readOnly": True,
    }
    assert _volumes(out, full(service))["api-keys"]["secret"]["secretName"] == "attest-api-keys"
    token = env.get(f"{prefix}SERVER__IDENTITY__TOKEN")
    if service in CALLERS:
        assert token == {
            "name": f"{prefix}SERVER__IDENTITY__TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "attest-service-token", "key": "token"}},
        }
    else:
        assert token is None
    assert "Secret" not in out.kinds()


def test_workers_present_the_service_key() -> None:
    env = rendered("default").env(full("worker-index"))
    assert env["ATTEST_PIPELINE_CLIENT__IDENTITY__TOKEN"]["valueFrom"] == {
        "secretKeyRef": {"name": "attest-service-token", "key": "token"}
    }
    assert not any("AUTH__KEYS_FILE" in name for name in env)


def test_tls_and_mtls_from_a_secret_with_tls_probes() -> None:
    out = rendered("default", *TLS, KNOWLEDGE)
    for service in SERVICES:
        prefix = f"ATTEST_{service.upper()}_"
        env = out.env(full(service))
        assert env[f"{prefix}SERVER__TLS__CERT_FILE"]["value"] == "/etc/attest/tls/tls.crt"
        internal = service not in ("answer", "ingest")
        # Internal services require a client certificate; the public ones do not.
        assert (f"{prefix}SERVER__TLS__REQUIRE_CLIENT_CERT" in env) is internal
        # End-user JWTs only on the public services.
        assert (f"{prefix}SERVER__AUTH__JWKS_URL" in env) is (not internal)
        if service in CALLERS:
            assert (
                env[f"{prefix}SERVER__IDENTITY__TLS__CA_FILE"]["value"] == "/etc/attest/tls/ca.crt"
            )
            assert f"{prefix}SERVER__IDENTITY__TLS__CERT_FILE" in env
        assert _volumes(out, full(service))["tls"]["secret"] == {"secretName": "attest-tls"}
        probe = out.container(full(service))["readinessProbe"]
        # The kubelet's gRPC probe speaks no TLS: the image's health check does.
        command = probe["exec"]["command"]
        assert command[:2] == ["python", "/app/healthcheck.py"]
        assert command[command.index("--server-name") + 1] == full(service)
        assert "--cert" in command
    assert "Secret" not in out.kinds()


def test_plain_text_keeps_native_grpc_probes() -> None:
    probe = rendered("default").container(full("lexical"))["readinessProbe"]
    assert probe["grpc"] == {"port": 50052}


def test_jwt_needs_issuer_and_audience() -> None:
    with pytest.raises(RenderError, match=r"security\.jwt\.issuer"):
        render("default", "security.jwt.jwksUrl=https://idp.example/jwks")


def test_only_answer_and_ingest_take_calls_from_outside_the_release() -> None:
    with pytest.raises(RenderError, match="invalid propertyName 'lexical'"):
        render("default", "networkPolicy.clientsFrom.lexical[0].namespaceSelector=null")
    with pytest.raises(RenderError, match="lexical is internal"):
        render("default", "services.lexical.externalService.enabled=true")
    with pytest.raises(RenderError, match="knowledge is internal"):
        render("default", KNOWLEDGE, "services.knowledge.externalService.enabled=true")
    with pytest.raises(RenderError, match="invalid propertyName 'knowledge'"):
        render(
            "default", KNOWLEDGE, "networkPolicy.clientsFrom.knowledge[0].namespaceSelector=null"
        )
    out = rendered("default", KNOWLEDGE)
    for service in INTERNAL:
        policy = out.get("NetworkPolicy", full(service))
        grpc_rules = [
            rule
            for rule in policy["spec"]["ingress"]
            if any(p["port"] == "grpc" for p in rule["ports"])
        ]
        for rule in grpc_rules:
            # release pods only: every peer is a podSelector, never a namespace
            assert all(set(peer) == {"podSelector"} for peer in rule["from"]), service
    for service in ("answer", "ingest"):
        rule = out.get("NetworkPolicy", full(service))["spec"]["ingress"][0]
        assert {"namespaceSelector": {}} in rule["from"]
