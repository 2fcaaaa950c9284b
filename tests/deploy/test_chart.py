"""Chart unit tests: what `helm template` renders for each values set."""

from __future__ import annotations

import json
from functools import cache

import pytest

from tests.deploy.chart import RELEASE, Rendered, RenderError, full, render

SERVICES = ["answer", "ingest", "lexical", "semantic", "rerank", "generate", "knowledge"]
PORTS = {
    "answer": 50051,
    "lexical": 50052,
    "semantic": 50053,
    "ingest": 50054,
    "knowledge": 50055,
    "rerank": 50056,
    "generate": 50057,
}
# Off by default; the per-service checks enable it.
KNOWLEDGE = "services.knowledge.enabled=true"


@cache
def rendered(values: str, *sets: str) -> Rendered:
    return render(values, *sets)


def every_service(values: str) -> Rendered:
    return rendered(values, KNOWLEDGE)


@pytest.mark.parametrize("values", ["default", "gpu-production"])
@pytest.mark.parametrize("service", SERVICES)
def test_each_service_has_native_grpc_probes_on_its_port(values: str, service: str) -> None:
    out = every_service(values)
    container = out.container(full(service))
    port = PORTS[service]
    assert container["args"] == ["serve", service]
    assert {"name": "grpc", "containerPort": port, "protocol": "TCP"} in container["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["grpc"] == {"port": port}, probe
    # the startup probe leaves time to load models before liveness applies
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert out.env(full(service))[f"ATTEST_{service.upper()}_SERVER__PORT"]["value"] == str(port)


@pytest.mark.parametrize("values", ["default", "minimal"])
def test_knowledge_service_is_off_by_default(values: str) -> None:
    # nothing of it is rendered, nobody is wired to it
    out = rendered(values)
    named = {d["metadata"]["name"] for d in out.docs}
    assert not {n for n in named if "knowledge" in n}
    for deployment in out.names("Deployment"):
        assert not [n for n in out.env(deployment) if "KNOWLEDGE" in n], deployment
    for policy in out.names("NetworkPolicy"):
        egress = out.get("NetworkPolicy", policy)["spec"].get("egress", [])
        assert 50055 not in {port["port"] for rule in egress for port in rule["ports"]}, policy


def _egress_ports(out: Rendered, component: str) -> set[int | str]:
    policy = out.get("NetworkPolicy", full(component))["spec"]
    return {port["port"] for rule in policy["egress"] for port in rule["ports"]}


def test_enabled_knowledge_service_is_one_internal_replica_with_a_volume() -> None:
    out = every_service("default")
    name = full("knowledge")
    assert {name} == out.names("Deployment") - rendered("default").names("Deployment")
    spec = out.get("Deployment", name)["spec"]
    # one replica serves the personal knowledge base: no HPA, no PDB to block drains
    assert spec["replicas"] == 1
    assert name not in out.names("HorizontalPodAutoscaler")
    assert name not in out.names("PodDisruptionBudget")
    # its embedded text index lives on a volume that the old and new pod never share
    assert spec["strategy"] == {"type": "Recreate"}
    assert f"{name}-data" in out.names("PersistentVolumeClaim")
    assert out.get("Service", name)["spec"]["clusterIP"] == "None"
    assert f"{name}-public" not in out.names("Service")
    container = out.container(name)
    assert container["resources"] == {
        "requests": {"cpu": "250m", "memory": "1Gi"},
        "limits": {"memory": "2Gi"},
    }
    assert {"name": "data", "mountPath": "/var/lib/attest"} in container["volumeMounts"]
    env = {k: v.get("value") for k, v in out.env(name).items()}
    # the defaults use Elasticsearch, which the personal base has no client for:
    # its text goes to embedded tantivy, its vectors to the release's Qdrant
    assert env["ATTEST_DATA_DIR"] == "/var/lib/attest"
    assert env["ATTEST_KNOWLEDGE_PERSONAL__LEXICAL_BACKEND"] == "tantivy"
    assert env["ATTEST_KNOWLEDGE_PERSONAL__VECTOR_STORE"] == "qdrant"
    assert env["ATTEST_KNOWLEDGE_PERSONAL__QDRANT_URL"] == "http://qdrant:6333"
    # it calls no peer
    assert not [n for n in env if n.endswith("_ADDRESS") or "IDENTITY" in n]
    assert "ATTEST_KNOWLEDGE_EMBEDDING_DEVICE" not in env
    # DNS and Qdrant, by the same rule as the semantic service
    assert _egress_ports(out, "knowledge") == _egress_ports(out, "semantic")
    assert 6333 in _egress_ports(out, "knowledge")


def test_enabled_knowledge_service_is_wired_into_answers_and_ingest() -> None:
    out = every_service("default")
    address = f"dns:///{full('knowledge')}:50055"
    assert out.env(full("answer"))["ATTEST_ANSWER_KNOWLEDGE_ADDRESS"]["value"] == address
    assert out.env(full("ingest"))["ATTEST_INGEST_KNOWLEDGE_ADDRESS"]["value"] == address
    # the index task's facts hook reads the ingest service's name, not a pipeline one
    worker = out.env(full("worker-index"))
    assert worker["ATTEST_INGEST_KNOWLEDGE_ADDRESS"]["value"] == address
    assert "ATTEST_PIPELINE_KNOWLEDGE_ADDRESS" not in worker
    policy = out.get("NetworkPolicy", full("knowledge"))
    assert _ingress_callers(policy) == {"answer", "ingest", "worker-index"}
    for caller in ("answer", "ingest", "worker-index"):
        assert 50055 in _egress_ports(out, caller), caller
    for other in out.names("NetworkPolicy") - {
        full(c) for c in ("answer", "ingest", "worker-index", "knowledge")
    }:
        egress = out.get("NetworkPolicy", other)["spec"].get("egress", [])
        assert 50055 not in {port["port"] for rule in egress for port in rule["ports"]}, other
    # the other peers stay where they were
    assert _egress_ports(out, "answer") == {53, 50052, 50053, 50055, 50056, 50057}


def test_production_values_run_the_knowledge_service_wired_in() -> None:
    out = rendered("gpu-production")
    name = full("knowledge")
    assert out.get("Deployment", name)["spec"]["replicas"] == 1
    claim = out.get("PersistentVolumeClaim", f"{name}-data")
    assert claim["spec"]["resources"]["requests"]["storage"] == "20Gi"
    env = out.env(name)
    assert env["ATTEST_KNOWLEDGE_PERSONAL__LEXICAL_BACKEND"]["value"] == "tantivy"
    assert (
        env["ATTEST_KNOWLEDGE_PERSONAL__QDRANT_URL"]["value"] == "https://qdrant.vectors.svc:6333"
    )
    assert env["ATTEST_KNOWLEDGE_PERSONAL__QDRANT_API_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "attest-qdrant", "key": "api-key"}
    }
    address = f"dns:///{name}:50055"
    assert out.env(full("answer"))["ATTEST_ANSWER_KNOWLEDGE_ADDRESS"]["value"] == address
    assert out.env(full("ingest"))["ATTEST_INGEST_KNOWLEDGE_ADDRESS"]["value"] == address
    assert out.env(full("worker-index"))["ATTEST_INGEST_KNOWLEDGE_ADDRESS"]["value"] == address
    policy = out.get("NetworkPolicy", name)
    assert _ingress_callers(policy) == {"answer", "ingest", "worker-index"}


def test_knowledge_personal_base_uses_opensearch_and_qdrant_with_their_secrets() -> None:
    out = rendered(
        "gpu-production",
        KNOWLEDGE,
        "endpoints.lexical.backend=opensearch",
        "endpoints.lexical.usernameKey=username",
        "endpoints.lexical.passwordKey=password",
        "services.knowledge.persistence.enabled=false",
    )
    name = full("knowledge")
    env = out.env(name)
    assert env["ATTEST_KNOWLEDGE_PERSONAL__LEXICAL_BACKEND"]["value"] == "opensearch"
    assert json.loads(env["ATTEST_KNOWLEDGE_PERSONAL__OPENSEARCH__HOSTS"]["value"]) == [
        "https://es-0.search.svc:9200",
        "https://es-1.search.svc:9200",
        "https://es-2.search.svc:9200",
    ]
    assert env["ATTEST_KNOWLEDGE_PERSONAL__OPENSEARCH__VERIFY_CERTS"]["value"] == "true"
    for var, key in [
        ("ATTEST_KNOWLEDGE_PERSONAL__OPENSEARCH__USERNAME", "username"),
        ("ATTEST_KNOWLEDGE_PERSONAL__OPENSEARCH__PASSWORD", "password"),
    ]:
        assert env[var]["valueFrom"] == {
            "secretKeyRef": {"name": "attest-elasticsearch", "key": key}
        }
    assert env["ATTEST_KNOWLEDGE_PERSONAL__VECTOR_STORE"]["value"] == "qdrant"
    assert env["ATTEST_KNOWLEDGE_PERSONAL__QDRANT_API_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "attest-qdrant", "key": "api-key"}
    }
    # nothing embedded: no volume and no data directory are needed
    assert "ATTEST_DATA_DIR" not in env
    assert f"{name}-data" not in out.names("PersistentVolumeClaim")
    # and the pod reaches both stores, through the same rules lexical and semantic use
    knowledge = _egress_ports(out, "knowledge")
    assert _egress_ports(out, "lexical") - {53} <= knowledge
    assert _egress_ports(out, "semantic") - {53} <= knowledge


def test_knowledge_service_refuses_more_than_one_replica_with_the_personal_base() -> None:
    one = "one replica serves the personal knowledge base"
    with pytest.raises(RenderError, match=one):
        render("default", KNOWLEDGE, "services.knowledge.replicas=2")
    with pytest.raises(RenderError, match=one):
        render("default", KNOWLEDGE, "services.knowledge.autoscaling.enabled=true")
    # the shared stores do not lift it: each process keeps its own view of the facts
    with pytest.raises(RenderError, match=one):
        render(
            "default",
            KNOWLEDGE,
            "endpoints.lexical.backend=opensearch",
            "services.knowledge.persistence.enabled=false",
            "services.knowledge.replicas=3",
        )


def test_knowledge_embedded_personal_stores_need_a_volume() -> None:
    with pytest.raises(RenderError, match="keeps its tantivy and edge store"):
        render("minimal", KNOWLEDGE, "services.knowledge.persistence.enabled=false")
    with pytest.raises(RenderError, match="keeps its tantivy store"):
        render("default", KNOWLEDGE, "services.knowledge.persistence.enabled=false")
    out = rendered("minimal", KNOWLEDGE)
    env = out.env(full("knowledge"))
    assert env["ATTEST_KNOWLEDGE_PERSONAL__VECTOR_STORE"]["value"] == "edge"
    assert env["ATTEST_DATA_DIR"]["value"] == "/var/lib/attest"


def test_knowledge_without_the_personal_base_scales_and_takes_no_facts() -> None:
    off = "services.knowledge.settings.personal.enabled=false"
    with pytest.raises(RenderError, match=r"services\.ingest must not call knowledge"):
        render("default", KNOWLEDGE, off)
    with pytest.raises(RenderError, match=r"workers\.index must not call knowledge"):
        render("default", KNOWLEDGE, off, "services.ingest.optionalPeers=null")
    out = rendered(
        "default",
        KNOWLEDGE,
        off,
        "services.knowledge.autoscaling.enabled=true",
        "services.knowledge.autoscaling.minReplicas=2",
        "services.ingest.optionalPeers=null",
        "workers.index.optionalPeers=null",
        "services.knowledge.persistence.enabled=false",
    )
    name = full("knowledge")
    assert out.get("HorizontalPodAutoscaler", name)["spec"]["minReplicas"] == 2
    env = out.env(name)
    assert env["ATTEST_KNOWLEDGE_PERSONAL__ENABLED"]["value"] == "false"
    assert not [n for n in env if "PERSONAL__" in n and not n.endswith("__ENABLED")]
    assert _egress_ports(out, "knowledge") == {53}
    assert _ingress_callers(out.get("NetworkPolicy", name)) == {"answer"}
    assert "ATTEST_ANSWER_KNOWLEDGE_ADDRESS" in out.env(full("answer"))
    assert "ATTEST_INGEST_KNOWLEDGE_ADDRESS" not in out.env(full("ingest"))


def test_knowledge_embeddings_on_a_gpu() -> None:
    out = rendered("default", KNOWLEDGE, "services.knowledge.gpu.enabled=true")
    name = full("knowledge")
    assert out.env(name)["ATTEST_KNOWLEDGE_EMBEDDING_DEVICE"]["value"] == "cuda"
    container = out.container(name)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["image"] == "ghcr.io/attest-project/attest-gpu:0.1.0"


def test_rerank_startup_probe_allows_the_longest_model_load() -> None:
    out = every_service("gpu-production")
    probes = {s: out.container(full(s))["startupProbe"]["failureThreshold"] for s in SERVICES}
    assert probes["rerank"] == max(probes.values())


@pytest.mark.parametrize("service", SERVICES)
def test_services_are_headless_so_clients_balance_per_call(service: str) -> None:
    svc = every_service("default").get("Service", full(service))
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["ports"] == [
        {
            "name": "grpc",
            "port": PORTS[service],
            "targetPort": "grpc",
            "protocol": "TCP",
            "appProtocol": "grpc",
        }
    ] + ([HTTP_PORT] if service == "answer" else [])


HTTP_PORT = {
    "name": "http",
    "port": 8080,
    "targetPort": "http",
    "protocol": "TCP",
    "appProtocol": "http",
}


def test_answer_serves_http_beside_grpc_unless_turned_off() -> None:
    out = rendered("default")
    name = full("answer")
    assert out.env(name)["ATTEST_ANSWER_HTTP__PORT"]["value"] == "8080"
    ports = {p["name"]: p["containerPort"] for p in out.container(name)["ports"]}
    assert ports["http"] == 8080
    public = out.get("Service", f"{name}-public")
    assert HTTP_PORT in public["spec"]["ports"]
    policy = out.get("NetworkPolicy", name)
    assert {"port": "http", "protocol": "TCP"} in policy["spec"]["ingress"][0]["ports"]

    off = rendered("default", "services.answer.http.enabled=false")
    assert off.env(name)["ATTEST_ANSWER_HTTP__ENABLED"]["value"] == "false"
    assert "ATTEST_ANSWER_HTTP__PORT" not in off.env(name)
    assert [p["name"] for p in off.container(name)["ports"]] == ["grpc", "metrics"]
    assert [p["name"] for p in off.get("Service", name)["spec"]["ports"]] == ["grpc"]


def test_peers_are_addressed_through_dns_of_the_headless_services() -> None:
    env = rendered("default").env(full("answer"))
    for peer in ("lexical", "semantic", "rerank", "generate"):
        address = env[f"ATTEST_ANSWER_{peer.upper()}_ADDRESS"]["value"]
        assert address == f"dns:///{full(peer)}:{PORTS[peer]}"
    worker = rendered("default").env(full("worker-index"))
    assert worker["ATTEST_PIPELINE_LEXICAL_ADDRESS"]["value"] == f"dns:///{full('lexical')}:50052"
    # generate reads its peers from its research section
    generate = rendered("default").env(full("generate"))
    assert generate["ATTEST_GENERATE_RESEARCH__SEMANTIC_ADDRESS"]["value"] == (
        f"dns:///{full('semantic')}:50053"
    )


def test_gpu_reranker_is_scheduled_on_a_gpu_with_shared_memory() -> None:
    out = rendered("gpu-production")
    deployment = out.get("Deployment", full("rerank"))
    pod = deployment["spec"]["template"]["spec"]
    container = out.container(full("rerank"))
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["resources"]["limits"]["memory"] == "24Gi"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "4Gi"}
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert container["image"].startswith("registry.example.com/attest/attest-gpu@sha256:")
    env = out.env(full("rerank"))
    assert env["ATTEST_RERANK_DEVICE"]["value"] == "cuda"
    assert env["ATTEST_RERANK_CHECKPOINT"]["value"] == "/models/pfid/t5-base-miracl"
    assert env["ATTEST_RERANK_DTYPE"]["value"] == "bfloat16"
    assert env["ATTEST_RERANK_BATCHING__MAX_DOCUMENTS"]["value"] == "256"
    checkpoint = next(v for v in pod["volumes"] if v["name"] == "checkpoint")
    assert checkpoint["persistentVolumeClaim"] == {"claimName": "attest-pfid", "readOnly": True}


@pytest.mark.parametrize("values", ["default", "gpu-production"])
def test_only_the_reranker_and_tgi_ask_for_gpus(values: str) -> None:
    out = every_service(values)
    with_gpu = {
        d["metadata"]["name"]
        for d in out.docs
        if d["kind"] == "Deployment"
        and "nvidia.com/gpu"
        in d["spec"]["template"]["spec"]["containers"][0]["resources"].get("limits", {})
    }
    expected = {full("rerank"), full("tgi")} if values == "gpu-production" else set()
    assert with_gpu == expected


def test_cpu_default_reranker_runs_its_fallback_on_cpu() -> None:
    out = rendered("default")
    container = out.container(full("rerank"))
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert out.env(full("rerank"))["ATTEST_RERANK_DEVICE"]["value"] == "cpu"
    assert "ATTEST_RERANK_CHECKPOINT" not in out.env(full("rerank"))
    assert container["image"] == "ghcr.io/attest-project/attest:0.1.0"


SECRET_VARIABLES = {
    full("lexical"): {"ATTEST_LEXICAL_ELASTICSEARCH__API_KEY": ("attest-elasticsearch", "api-key")},
    full("semantic"): {"ATTEST_SEMANTIC_QDRANT__API_KEY": ("attest-qdrant", "api-key")},
    full("ingest"): {
        "ATTEST_INGEST_STATE_URL": ("attest-redis", "state-url"),
        "ATTEST_PIPELINE_BROKER_URL": ("attest-redis", "broker-url"),
        "ATTEST_PIPELINE_RESULT_BACKEND_URL": ("attest-redis", "result-backend-url"),
        "ATTEST_PIPELINE_STATE_URL": ("attest-redis", "state-url"),
    },
    full("worker-index"): {
        "ATTEST_PIPELINE_BROKER_URL": ("attest-redis", "broker-url"),
        "ATTEST_PIPELINE_RESULT_BACKEND_URL": ("attest-redis", "result-backend-url"),
        "ATTEST_PIPELINE_STATE_URL": ("attest-redis", "state-url"),
    },
}


def test_secrets_come_only_from_existing_secrets() -> None:
    out = rendered("gpu-production")
    assert "Secret" not in out.kinds()
    for deployment, expected in SECRET_VARIABLES.items():
        env = out.env(deployment)
        for name, (secret, key) in expected.items():
            assert "value" not in env[name], name
            assert env[name]["valueFrom"] == {"secretKeyRef": {"name": secret, "key": key}}
    auth = out.get("TriggerAuthentication", full("keda-redis"))
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "password", "name": "attest-redis", "key": "password"}
    ]


@pytest.mark.parametrize("values", ["default", "gpu-production", "minimal"])
def test_no_rendered_variable_carries_a_credential_in_clear(values: str) -> None:
    out = every_service(values)
    assert "Secret" not in out.kinds()
    for deployment in out.names("Deployment"):
        for name, var in out.env(deployment).items():
            if any(word in name for word in ("PASSWORD", "API_KEY", "TOKEN")):
                assert "valueFrom" in var, f"{deployment}: {name} is set in clear"
            if "value" in var:
                assert "@" not in var["value"], (
                    f"{deployment}: {name} looks like a URL with credentials"
                )


def test_values_schema_refuses_a_redis_url_with_a_password() -> None:
    with pytest.raises(RenderError, match="brokerUrl"):
        render("default", "endpoints.redis.brokerUrl=redis://:hunter2@redis:6379/0")


def test_values_schema_refuses_unknown_keys() -> None:
    with pytest.raises(RenderError, match="replicaz"):
        render("default", "services.lexical.replicaz=3")


def test_embedded_lexical_index_refuses_more_than_one_replica() -> None:
    with pytest.raises(RenderError, match="tantivy keeps one index per pod"):
        render("minimal", "services.lexical.replicas=2")


def test_a_peer_that_is_not_enabled_is_an_error() -> None:
    with pytest.raises(RenderError, match=r"services.answer.peers names \"rerank\""):
        render("default", "services.rerank.enabled=false")


def test_minimal_install_keeps_embedded_state_on_volumes() -> None:
    out = rendered("minimal")
    assert out.names("Deployment") == {full("lexical"), full("semantic")}
    assert out.names("PersistentVolumeClaim") == {
        f"{full('lexical')}-data",
        f"{full('semantic')}-data",
    }
    for service in ("lexical", "semantic"):
        deployment = out.get("Deployment", full(service))
        assert deployment["spec"]["replicas"] == 1
        assert deployment["spec"]["strategy"] == {"type": "Recreate"}
        assert out.env(full(service))["ATTEST_DATA_DIR"]["value"] == "/var/lib/attest"
    assert out.env(full("lexical"))["ATTEST_LEXICAL_BACKEND"]["value"] == "tantivy"
    assert out.env(full("semantic"))["ATTEST_SEMANTIC_STORE"]["value"] == "edge"
    assert not out.kinds() & {"NetworkPolicy", "HorizontalPodAutoscaler", "PodDisruptionBudget"}


def test_backend_endpoints_come_from_values() -> None:
    out = rendered("gpu-production")
    lexical = out.env(full("lexical"))
    assert lexical["ATTEST_LEXICAL_BACKEND"]["value"] == "elasticsearch"
    assert json.loads(lexical["ATTEST_LEXICAL_ELASTICSEARCH__HOSTS"]["value"]) == [
        "https://es-0.search.svc:9200",
        "https://es-1.search.svc:9200",
        "https://es-2.search.svc:9200",
    ]
    semantic = out.env(full("semantic"))
    assert semantic["ATTEST_SEMANTIC_STORE"]["value"] == "qdrant"
    assert semantic["ATTEST_SEMANTIC_QDRANT__URL"]["value"] == "https://qdrant.vectors.svc:6333"
    generate = out.env(full("generate"))
    assert generate["ATTEST_GENERATE_LLM__URL"]["value"] == f"http://{full('tgi')}:8080"


def test_semantic_replicas_over_qdrant_keep_kg_scores_in_step() -> None:
    # Several replicas over one Qdrant: each applies the others' article writes.
    semantic = rendered("gpu-production").env(full("semantic"))
    assert semantic["ATTEST_SEMANTIC_KG_SYNC_SECONDS"]["value"] == "5"
    # One replica on its own embedded store has nobody to keep in step with.
    minimal = rendered("minimal").env(full("semantic"))
    assert "ATTEST_SEMANTIC_KG_SYNC_SECONDS" not in minimal
    # The setting can be chosen; then it is the only one rendered.
    chosen = rendered("gpu-production", "services.semantic.settings.kg_sync_seconds=2")
    env = chosen.container(full("semantic"))["env"]
    assert [e["value"] for e in env if e["name"] == "ATTEST_SEMANTIC_KG_SYNC_SECONDS"] == ["2"]


def test_cpu_services_autoscale_and_leave_replicas_to_the_hpa() -> None:
    out = rendered("default")
    scaled = {"answer", "ingest", "lexical", "semantic", "generate"}
    assert out.names("HorizontalPodAutoscaler") == {full(s) for s in scaled}
    for service in scaled:
        assert "replicas" not in out.get("Deployment", full(service))["spec"]
        hpa = out.get("HorizontalPodAutoscaler", full(service))
        assert hpa["spec"]["scaleTargetRef"]["name"] == full(service)
        assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert out.get("Deployment", full("rerank"))["spec"]["replicas"] == 1


def test_keda_scales_workers_on_celery_queue_length() -> None:
    out = rendered("gpu-production")
    scaled = out.get("ScaledObject", full("worker-index"))
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    assert scaled["spec"]["scaleTargetRef"] == {"name": full("worker-index")}
    assert scaled["spec"]["maxReplicaCount"] == 20
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "redis"
    assert trigger["metadata"]["listName"] == "index"
    assert trigger["metadata"]["listLength"] == "10"
    assert trigger["authenticationRef"] == {"name": f"{RELEASE}-attest-keda-redis"}
    assert "replicas" not in out.get("Deployment", full("worker-index"))["spec"]
    assert "ScaledObject" not in rendered("default").kinds()


def test_pod_disruption_budgets_follow_values() -> None:
    assert rendered("default").names("PodDisruptionBudget") == {
        full(s) for s in ("answer", "ingest", "lexical", "semantic", "generate")
    }
    prod = rendered("gpu-production").names("PodDisruptionBudget")
    assert {full("rerank"), full("worker-index")} <= prod


def _ingress_callers(policy: dict) -> set[str]:
    callers = set()
    for rule in policy["spec"]["ingress"]:
        for peer in rule.get("from", []):
            labels = peer.get("podSelector", {}).get("matchLabels", {})
            if "app.kubernetes.io/component" in labels:
                callers.add(labels["app.kubernetes.io/component"])
    return callers


def test_network_policy_denies_by_default_and_opens_only_peer_paths() -> None:
    out = rendered("default")
    deny = out.get("NetworkPolicy", f"{RELEASE}-attest-default-deny")
    assert deny["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in deny["spec"]
    assert "egress" not in deny["spec"]
    assert _ingress_callers(out.get("NetworkPolicy", full("lexical"))) == {
        "answer",
        "generate",
        "ingest",
        "worker-index",
    }
    assert _ingress_callers(out.get("NetworkPolicy", full("rerank"))) == {"answer"}
    # the public APIs are also open to the configured clients
    answer = out.get("NetworkPolicy", full("answer"))
    assert {"namespaceSelector": {}} in answer["spec"]["ingress"][0]["from"]
    prod_ingest = rendered("gpu-production").get("NetworkPolicy", full("ingest"))
    assert prod_ingest["spec"]["ingress"][0]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingestion"}}}
    ]
    egress_ports = {port["port"] for rule in answer["spec"]["egress"] for port in rule["ports"]}
    assert egress_ports == {53, 50052, 50053, 50056, 50057}


def test_in_chart_tgi_is_reachable_only_from_generate() -> None:
    out = rendered("gpu-production")
    policy = out.get("NetworkPolicy", full("tgi"))
    assert _ingress_callers(policy) == {"generate"}
    generate = out.get("NetworkPolicy", full("generate"))
    tgi_rules = [
        r
        for r in generate["spec"]["egress"]
        if r.get("to")
        and any(
            p.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component")
            == "tgi"
            for p in r["to"]
        )
    ]
    assert [r["ports"] for r in tgi_rules] == [[{"port": 8080, "protocol": "TCP"}]]
    tgi = out.container(full("tgi"))
    assert "--model-id=/models/Qwen2.5-7B-Instruct" in tgi["args"]
    assert tgi["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}


def test_tgi_needs_a_volume_with_weights() -> None:
    with pytest.raises(RenderError, match=r"tgi\.modelsClaim"):
        render("default", "tgi.enabled=true")


@pytest.mark.parametrize("values", ["default", "gpu-production", "minimal"])
def test_pods_run_as_non_root_with_a_read_only_root(values: str) -> None:
    out = every_service(values)
    for deployment in out.names("Deployment") - {full("tgi")}:
        pod = out.get("Deployment", deployment)["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        container = out.container(deployment)
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def test_tracing_is_off_by_default_and_reaches_every_process_when_configured() -> None:
    off = rendered("default")
    deployments = sorted(off.names("Deployment"))
    for name in deployments:
        assert not [k for k in off.env(name) if k.startswith("OTEL_")], name
    endpoint = "http://otel-collector.observability:4317"
    on = rendered("default", f"tracing.otlpEndpoint={endpoint}")
    for name in deployments:
        env = on.env(name)
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == {
            "name": "OTEL_EXPORTER_OTLP_ENDPOINT",
            "value": endpoint,
        }
        assert env["OTEL_TRACES_SAMPLER"]["value"] == "parentbased_traceidratio"
        assert env["OTEL_TRACES_SAMPLER_ARG"]["value"] == "0.1"
    # Every process that exports may reach the collector's port, and only then.
    for policy in on.names("NetworkPolicy") - {f"{RELEASE}-attest-default-deny"}:
        ports = {
            p["port"] for r in on.get("NetworkPolicy", policy)["spec"]["egress"] for p in r["ports"]
        }
        before = {
            p["port"]
            for r in off.get("NetworkPolicy", policy)["spec"]["egress"]
            for p in r["ports"]
        }
        assert ports == before | {4317}, policy
    with pytest.raises(RenderError, match="otlpEndpoint"):
        render("default", "tracing.otlpEndpoint=collector:4317")


def test_workers_serve_metrics_where_the_scrapers_may_reach_them() -> None:
    out = rendered("default")
    workers = [n for n in out.names("Deployment") if "-worker-" in n]
    assert workers
    for name in workers:
        container = out.container(name)
        assert container["args"][-2:] == ["--metrics-port", "9090"]
        assert container["ports"] == [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
        pod = out.get("Deployment", name)["spec"]["template"]["metadata"]
        assert pod["annotations"]["prometheus.io/port"] == "9090"
        policy = out.get("NetworkPolicy", name)["spec"]
        assert policy["ingress"] == [
            {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": [{"namespaceSelector": {}}]}
        ]
    off = rendered("default", "metrics.enabled=false")
    for name in workers:
        assert "--metrics-port" not in off.container(name)["args"]
        assert off.get("NetworkPolicy", name)["spec"]["ingress"] == []


def _threads(r: Rendered, deployment: str) -> str | None:
    entry = r.env(deployment).get("OMP_NUM_THREADS")
    return None if entry is None else str(entry["value"])


def _cpus(r: Rendered, deployment: str) -> str | None:
    entry = r.env(deployment).get("PYTHON_CPU_COUNT")
    return None if entry is None else str(entry["value"])


@pytest.mark.parametrize("values", ["default", "gpu-production", "minimal"])
def test_every_container_sizes_its_thread_pools_by_its_cpus(values: str) -> None:
    """Without OMP_NUM_THREADS, ONNX Runtime and torch size their pools by the
    node's cores; every service and worker gets a count from its CPU request
    or limit instead."""
    r = every_service(values)
    deployments = [d for d in r.docs if d["kind"] == "Deployment"]
    assert deployments
    for d in deployments:
        name = d["metadata"]["name"]
        if name.endswith("-tgi"):
            continue  # the LLM server image sizes its own pools
        threads = _threads(r, name)
        assert threads is not None, name
        assert int(threads) >= 1, name
        # A process that sees every node core (a request, no limit) still counts
        # only its share of the CPU as its own.
        assert _cpus(r, name) is not None, name
        assert int(_cpus(r, name) or 0) >= int(threads), name


def test_threads_follow_the_cpu_limit_then_the_request_then_the_override() -> None:
    sem, worker = full("semantic"), full("worker-index")
    r = render(
        "default",
        "services.semantic.resources.requests.cpu=500m",
        "services.semantic.resources.limits.cpu=2500m",
        "workers.index.resources.requests.cpu=3",
        "workers.index.concurrency=2",
    )
    assert _threads(r, sem) == "3"  # the limit, 2.5 cores, rounded up
    assert _threads(r, worker) == "2"  # 3 cores over 2 processes
    assert (_cpus(r, sem), _cpus(r, worker)) == ("3", "2")
    r = render("default", "services.semantic.resources.requests.cpu=1.5")
    assert _threads(r, sem) == "2"
    r = render("default", "services.semantic.threads=6", "workers.index.threads=1")
    assert (_threads(r, sem), _threads(r, worker)) == ("6", "1")
    # Fewer threads than CPUs: the process still counts its whole share.
    r = render(
        "default",
        "services.semantic.threads=1",
        "services.semantic.resources.limits.cpu=2500m",
        "workers.index.threads=1",
        "workers.index.resources.requests.cpu=3",
        "workers.index.concurrency=2",
    )
    assert (_cpus(r, sem), _cpus(r, worker)) == ("3", "2")
    r = render("default", "services.semantic.resources=null")
    assert _threads(r, sem) is None  # nothing to size by: the runtime's default
    assert _cpus(r, sem) is None
    r = render("default", "services.semantic.resources=null", "services.semantic.threads=2")
    assert (_threads(r, sem), _cpus(r, sem)) == ("2", None)
    with pytest.raises(RenderError):
        render("default", "services.semantic.threads=-1")
    # A quantity in another unit is refused, not silently left to the node's cores.
    with pytest.raises(RenderError, match="millicores"):
        render("default", "services.semantic.resources.limits.cpu=1k")
    r = render(
        "default", "services.semantic.resources.limits.cpu=1k", "services.semantic.threads=2"
    )
    assert _threads(r, sem) == "2"
    assert _cpus(r, sem) is None  # a CPU it cannot read sizes nothing


def test_backups_are_off_by_default() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in rendered("default").docs}
    assert ("ConfigMap", full("redis-persistence")) not in kinds
    assert ("CronJob", full("opensearch-snapshot")) not in kinds


def test_redis_persistence_renders_aof_and_rdb_settings() -> None:
    chart = rendered("default", "backup.redis.enabled=true", "backup.redis.appendfsync=always")
    conf = chart.get("ConfigMap", full("redis-persistence"))["data"]["redis.conf"]
    assert conf.splitlines() == [
        "appendonly yes",
        "appendfsync always",
        'save "900 1 300 10 60 10000"',
    ]


def test_opensearch_snapshots_go_to_an_fs_or_s3_repository_on_a_schedule() -> None:
    chart = rendered(
        "default",
        "endpoints.lexical.backend=opensearch",
        "endpoints.lexical.hosts={https://opensearch:9200}",
        "endpoints.lexical.existingSecret=os-creds",
        "endpoints.lexical.usernameKey=username",
        "endpoints.lexical.passwordKey=password",
        "backup.opensearch.enabled=true",
    )
    job = chart.get("CronJob", full("opensearch-snapshot"))
    assert job["spec"]["schedule"] == "0 3 * * *"
    pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["OPENSEARCH_URL"]["value"] == "https://opensearch:9200"
    assert json.loads(env["REPOSITORY_BODY"]["value"]) == {
        "type": "fs",
        "settings": {"location": "/mnt/snapshots/attest"},
    }
    assert json.loads(env["SNAPSHOT_BODY"]["value"]) == {
        "indices": "attest-lexical-*",
        "include_global_state": False,
    }
    assert env["OPENSEARCH_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": "os-creds",
        "key": "password",
    }
    script = container["args"][0]
    assert '"$OPENSEARCH_URL/_snapshot/$REPOSITORY"' in script
    assert "wait_for_completion=true" in script

    s3 = rendered(
        "default",
        "endpoints.lexical.backend=opensearch",
        "backup.opensearch.enabled=true",
        "backup.opensearch.type=s3",
        "backup.opensearch.s3.bucket=attest-snapshots",
    )
    pod = s3.get("CronJob", full("opensearch-snapshot"))["spec"]["jobTemplate"]["spec"]
    env = {e["name"]: e for e in pod["template"]["spec"]["containers"][0]["env"]}
    assert json.loads(env["REPOSITORY_BODY"]["value"]) == {
        "type": "s3",
        "settings": {"bucket": "attest-snapshots", "base_path": "attest", "client": "default"},
    }
    with pytest.raises(RenderError, match=r"needs backup\.opensearch\.s3\.bucket"):
        render(
            "default",
            "endpoints.lexical.backend=opensearch",
            "backup.opensearch.enabled=true",
            "backup.opensearch.type=s3",
        )
    with pytest.raises(RenderError, match=r"needs endpoints\.lexical\.backend opensearch"):
        render(
            "default",
            "endpoints.lexical.backend=tantivy",
            "services.lexical.replicas=1",
            "services.lexical.autoscaling.enabled=false",
            "backup.opensearch.enabled=true",
        )


def _ingest_request_limit(out: Rendered, monkeypatch: pytest.MonkeyPatch) -> int:
    """The request-size limit the ingest pod's settings give, read as the service does."""
    from attest.ingest.settings import IngestSettings

    container = out.container(full("ingest"))
    assert container["args"] == ["serve", "ingest"]
    for name, var in out.env(full("ingest")).items():
        if "value" in var and name.startswith("ATTEST_INGEST_SERVER__"):
            monkeypatch.setenv(name, var["value"])
    return IngestSettings().server.max_message_bytes


def test_ingest_pods_take_the_documented_64_mib_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    for values in ("default", "gpu-production"):
        assert _ingest_request_limit(rendered(values), monkeypatch) == 64 * 1024 * 1024
    raised = rendered("default", "services.ingest.settings.server.max_message_bytes=134217728")
    assert _ingest_request_limit(raised, monkeypatch) == 128 * 1024 * 1024
