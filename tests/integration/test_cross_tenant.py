"""Two tenants, the same document ids, different texts: nothing crosses between them.

`attest serve all` with API keys runs every service in one process on real
backends (BM25 on OpenSearch, the embedded vector engine, ingestion and
answer jobs on Celery over Redis), with two workers beside it: one for the
ingest queues, one for answer jobs. Tenants ``acme`` and ``globex`` ingest
the same four document ids with texts of their own, and each a document the
other lacks. Every text carries its tenant's secret word, which no query
ever contains: a response that holds the other tenant's secret word is a
leak, whatever RPC it came from.

Then, in a seeded random order, each tenant's caller tries to reach the
other's data through every read (Ask, AskStream, Submit/Get/Watch, lexical
and semantic Search and Explain as the service acting for it, GetJob and
WatchJob) and write (Ingest, Delete): with the other's org names and job
ids, with the tenant header a client may not set, and directly on the
internal listener. Each attempt must come back without the other's data
(NOT_FOUND for another's job id), and the other tenant's documents must
still read as before after every write.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from google.protobuf.message import Message

from attest.answer.v1 import answer_pb2, answer_pb2_grpc
from attest.common.v1 import common_pb2
from attest.core.auth import TENANT_KEY, hash_key, new_api_key
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc
from tests.conftest import require_server
from tests.integration.ingest_stack import answer_serving, free_port, wait_until

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "attest.cli"]
TENANTS = ("acme", "globex")
OTHER = {"acme": "globex", "globex": "acme"}
# Each tenant's organisation (asked about, to fish for the other's documents)
# and its secret word (in every text of that tenant, in no query).
ORG = {"acme": "Zarquon Utilities", "globex": "Vellichor Mining"}
SECRET = {"acme": "kestrelwood", "globex": "marrowfen"}
TOPICS = {
    "n1": ("cuts water withdrawal", "reduced its water withdrawal by {n}% at the river plant"),
    "n2": ("raises emissions target", "raised its 2030 emissions target to {n}% below 2019"),
    "n3": ("audit finds child workers", "auditors found {n} child workers at a supplier"),
    "n4": ("fined over data breach", "was fined {n} million dollars over a customer data breach"),
}
ONLY = {"acme": "a-only", "globex": "g-only"}
QUESTIONS = [
    "How much did {org} cut its water withdrawal?",
    "What emissions target did {org} set?",
    "How many child workers did the auditors find at the supplier of {org}?",
    "How large was the data breach fine of {org}?",
]
SEARCHES = ["water withdrawal", "emissions target", "child workers audit", "data breach fine"]


def document(tenant: str, doc_id: str, version: int = 1) -> common_pb2.Document:
    k = 1 if tenant == "acme" else 2
    if doc_id in TOPICS:
        title, sentence = TOPICS[doc_id]
        n = 10 * k + int(doc_id[1:]) + 100 * (version - 1)
    else:
        title, sentence = "reports on water stewardship", "published {n} water stewardship goals"
        n = 7 * k
    org = ORG[tenant]
    return common_pb2.Document(
        id=doc_id,
        title=f"{org} {title}",
        body=(
            f"{org} {sentence.format(n=n)}. The filing was reviewed under reference "
            f"{SECRET[tenant]} version {version}."
        ),
        organizations=[org],
    )


def corpus(tenant: str) -> list[common_pb2.Document]:
    return [document(tenant, d) for d in (*TOPICS, ONLY[tenant])]


def leaked(reply: Message | list[Message] | None, tenant: str) -> bool:
    """Whether a response (or a stream of them) shown to ``tenant`` holds the other
    tenant's secret word."""
    messages = reply if isinstance(reply, list) else [] if reply is None else [reply]
    return any(SECRET[OTHER[tenant]].encode() in m.SerializeToString() for m in messages)


def code_of(call: Callable[[], Any]) -> tuple[grpc.StatusCode, Any]:
    """The status of ``call`` and its reply (None unless OK)."""
    try:
        return grpc.StatusCode.OK, call()
    except grpc.RpcError as err:
        code: grpc.StatusCode = err.code()  # a grpc.Call as well
        return code, None


@dataclass
class Tenants:
    tmp: Path
    public: grpc.Channel
    internal: grpc.Channel
    keys: dict[str, str]
    service_key: str
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    ingest_jobs: dict[str, list[str]] = field(default_factory=lambda: {t: [] for t in TENANTS})
    answer_jobs: dict[str, list[str]] = field(default_factory=lambda: {t: [] for t in TENANTS})

    # -- callers ---------------------------------------------------------------
    def md(self, tenant: str, *extra: tuple[str, str]) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.keys[tenant]}"), *extra)

    def as_service(self, tenant: str) -> tuple[tuple[str, str], ...]:
        """The metadata of a service acting for ``tenant`` on the internal listener."""
        return (("authorization", f"Bearer {self.service_key}"), (TENANT_KEY, tenant))

    @property
    def answer(self) -> answer_pb2_grpc.AnswerServiceStub:
        return answer_pb2_grpc.AnswerServiceStub(self.public)

    @property
    def ingest(self) -> ingest_pb2_grpc.IngestServiceStub:
        return ingest_pb2_grpc.IngestServiceStub(self.public)

    @property
    def lexical(self) -> lexical_pb2_grpc.LexicalServiceStub:
        return lexical_pb2_grpc.LexicalServiceStub(self.internal)

    @property
    def semantic(self) -> semantic_pb2_grpc.SemanticServiceStub:
        return semantic_pb2_grpc.SemanticServiceStub(self.internal)

    def ingest_and_wait(self, tenant: str, docs: list[common_pb2.Document]) -> Any:
        request = ingest_pb2.IngestRequest(items=[ingest_pb2.IngestItem(document=d) for d in docs])
        job = self.ingest.Ingest(request, metadata=self.md(tenant), timeout=60).job
        self.ingest_jobs[tenant].append(job.job_id)
        *_, last = self.ingest.WatchJob(
            ingest_pb2.WatchJobRequest(job_id=job.job_id), metadata=self.md(tenant), timeout=300
        )
        assert last.state == ingest_pb2.JOB_STATE_DONE, last
        return last

    def bodies(self, tenant: str, query: str) -> dict[str, str]:
        """Document id → text of ``tenant``'s BM25 hits for ``query``."""
        response = self.lexical.Search(
            lexical_pb2.SearchRequest(query=query, top_k=20),
            metadata=self.as_service(tenant),
            timeout=30,
        )
        return {h.doc_id: h.text for h in response.hits}

    def settled(self, tenant: str, query: str, check: Callable[[dict[str, str]], bool]) -> None:
        """Wait for OpenSearch's refresh (about a second) until ``check`` holds."""
        wait_until(lambda: check(self.bodies(tenant, query)), 30, f"{tenant}: {query}", 0.2)


@pytest.fixture(scope="module")
def tenants(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenants]:
    tmp = tmp_path_factory.mktemp("tenants")
    base = require_server("ATTEST_TEST_REDIS_URL").rstrip("/")
    opensearch = require_server("ATTEST_TEST_OPENSEARCH_URL")
    broker, results, state = f"{base}/13", f"{base}/14", f"{base}/15"
    for url in (broker, results, state):
        redis.Redis.from_url(url).flushdb()
    keys = {t: new_api_key() for t in TENANTS}
    service_key = new_api_key()
    entries = [
        {"id": t, "sha256": hash_key(k), "tenant": t, "scopes": ["ask", "ingest"]}
        for t, k in keys.items()
    ]
    entries.append(
        {
            "id": "workers",
            "sha256": hash_key(service_key),
            "tenant": "default",
            "scopes": ["internal"],
        }
    )
    keys_file = tmp / "keys.json"
    keys_file.write_text(json.dumps({"keys": entries}), encoding="utf-8")
    port, internal_port = free_port(), free_port()
    public, internal = f"127.0.0.1:{port}", f"127.0.0.1:{internal_port}"
    index_name = f"test-tenants-{uuid.uuid4().hex[:10]}"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "ATTEST_DATA_DIR": str(tmp / "data"),
        "ATTEST_ANSWER_SERVER__AUTH__KEYS_FILE": str(keys_file),
        "ATTEST_ANSWER_SERVER__INTERNAL_PORT": str(internal_port),
        "ATTEST_LEXICAL_BACKEND": "opensearch",
        "ATTEST_LEXICAL_OPENSEARCH__HOSTS": json.dumps([opensearch]),
        "ATTEST_LEXICAL_INDEX_NAME": index_name,
        "ATTEST_SEMANTIC_STORE": "edge",
        "ATTEST_INGEST_MODE": "celery",
        "ATTEST_INGEST_STATE_URL": state,
        "ATTEST_ANSWER_JOBS__STATE_URL": state,
        "ATTEST_ANSWER_JOBS__WATCH_INTERVAL_SECONDS": "0.1",
        "ATTEST_PIPELINE_BROKER_URL": broker,
        "ATTEST_PIPELINE_RESULT_BACKEND_URL": results,
        "ATTEST_PIPELINE_STATE_URL": state,
        "ATTEST_PIPELINE_RETRY_BACKOFF_MAX_SECONDS": "2",
    }
    env.pop("ATTEST_CLIENT_TOKEN", None)
    # The workers reach the services on the internal listener with a service key.
    worker_env = {
        **env,
        "ATTEST_CLIENT_TOKEN": service_key,
        "ATTEST_PIPELINE_LEXICAL_ADDRESS": internal,
        "ATTEST_PIPELINE_SEMANTIC_ADDRESS": internal,
        **{
            f"ATTEST_ANSWER_{s}_ADDRESS": internal
            for s in ("LEXICAL", "SEMANTIC", "RERANK", "GENERATE")
        },
    }
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(name: str, args: list[str], proc_env: dict[str, str]) -> None:
        log = (tmp / f"{name}.log").open("wb")
        procs[name] = subprocess.Popen([*CLI, *args], env=proc_env, stdout=log, stderr=log)

    def log_tail(name: str) -> str:
        return (tmp / f"{name}.log").read_text(errors="replace")[-3000:]

    stack: Tenants | None = None
    try:
        spawn("serve", ["serve", "all", "--host", "127.0.0.1", "--port", str(port)], env)
        spawn("worker-ingest", ["worker", "--queues", "enrich,embed,index"], worker_env)
        spawn("worker-answer", ["worker", "--queues", "answer"], worker_env)
        serve = procs["serve"]
        wait_until(lambda: answer_serving(public) or serve.poll() is not None, 300, "serve all")
        assert serve.poll() is None, log_tail("serve")
        stack = Tenants(
            tmp=tmp,
            public=grpc.insecure_channel(public),
            internal=grpc.insecure_channel(internal),
            keys=keys,
            service_key=service_key,
            procs=procs,
        )
        for tenant in TENANTS:
            last = stack.ingest_and_wait(tenant, corpus(tenant))
            assert (last.progress.created, last.progress.failed) == (5, 0), last
        for tenant in TENANTS:
            stack.settled(tenant, "water", lambda hits: len(hits) == 2)
        yield stack
    finally:
        if stack is not None:
            stack.public.close()
            stack.internal.close()
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        from opensearchpy import OpenSearch

        client = OpenSearch(hosts=[opensearch])
        try:
            client.indices.delete(index=f"{index_name}-*", ignore_unavailable=True)
        finally:
            client.close()


@pytest.mark.timeout(600)  # the first test pays for the stack's start-up
def test_the_same_ids_hold_each_tenants_own_text(tenants: Tenants) -> None:
    for tenant in TENANTS:
        mine = tenants.bodies(tenant, "water withdrawal emissions child workers data breach fine")
        assert set(mine) == {*TOPICS, ONLY[tenant]}
        assert all(SECRET[tenant] in text for text in mine.values()), mine

        # OpenSearch refreshes each index on its own (about a second): the
        # passages index may lag the documents index that ``bodies`` saw.
        def lexical_counts(tenant: str = tenant) -> tuple[int, int]:
            stats = tenants.lexical.Stats(
                lexical_pb2.StatsRequest(), metadata=tenants.as_service(tenant), timeout=30
            )
            return stats.documents, stats.passages

        wait_until(lambda: lexical_counts() == (5, 5), 30, f"{tenant}: lexical counts", 0.2)
        assert lexical_counts() == (5, 5)
        vectors = tenants.semantic.Stats(
            semantic_pb2.StatsRequest(), metadata=tenants.as_service(tenant), timeout=30
        )
        assert (vectors.documents, vectors.passages) == (5, 5)
        question = QUESTIONS[0].format(org=ORG[tenant])
        answer = tenants.answer.Ask(
            answer_pb2.AskRequest(question=question), metadata=tenants.md(tenant), timeout=120
        ).answer
        assert answer.sources
        assert not leaked(answer, tenant)
        assert SECRET[tenant] in answer.sources[0].source.text


class Attempts:
    """Randomized cross-tenant attempts; each records whether it leaked."""

    def __init__(self, tenants: Tenants, rng: random.Random) -> None:
        self.t = tenants
        self.rng = rng
        self.counts: Counter[str] = Counter()
        self.leaks: list[str] = []
        self.submitted = 0
        self.writes = 0

    def record(self, kind: str, tenant: str, ok: bool, what: object = "") -> None:
        self.counts[kind] += 1
        if not ok:
            self.leaks.append(f"{kind} as {tenant}: {what}")

    # -- reads -------------------------------------------------------------------
    def _question(self, tenant: str) -> str:
        org = ORG[self.rng.choice([tenant, OTHER[tenant]])]
        return self.rng.choice(QUESTIONS).format(org=org)

    def _client_md(self, tenant: str) -> tuple[tuple[str, str], ...]:
        # Half the time the caller also names the other tenant, which a client may not.
        if self.rng.random() < 0.5:
            return self.t.md(tenant, (TENANT_KEY, OTHER[tenant]))
        return self.t.md(tenant)

    def ask(self, tenant: str) -> None:
        options = answer_pb2.AskOptions(rerank_top_k=self.rng.choice([2, 3]), explain=True)
        request = answer_pb2.AskRequest(question=self._question(tenant), options=options)
        code, reply = code_of(
            lambda: self.t.answer.Ask(request, metadata=self._client_md(tenant), timeout=120)
        )
        self.record("Ask", tenant, code == grpc.StatusCode.OK and not leaked(reply, tenant), code)

    def ask_stream(self, tenant: str) -> None:
        request = answer_pb2.AskStreamRequest(question=self._question(tenant))
        code, events = code_of(
            lambda: list(
                self.t.answer.AskStream(request, metadata=self._client_md(tenant), timeout=120)
            )
        )
        ok = code == grpc.StatusCode.OK and not leaked(events, tenant)
        self.record("AskStream", tenant, ok, code)

    def submit(self, tenant: str) -> None:
        request = answer_pb2.SubmitRequest(question=self._question(tenant))
        code, reply = code_of(
            lambda: self.t.answer.Submit(request, metadata=self._client_md(tenant), timeout=30)
        )
        if reply is not None:
            self.t.answer_jobs[tenant].append(reply.job.job_id)
        self.submitted += 1
        self.record("Submit", tenant, code == grpc.StatusCode.OK and not leaked(reply, tenant))

    def _job_ids(self, jobs: dict[str, list[str]], tenant: str) -> tuple[str, str] | None:
        """(whose, job id): another tenant's job two times in three, else one's own."""
        whose = OTHER[tenant] if self.rng.random() < 2 / 3 else tenant
        return (whose, self.rng.choice(jobs[whose])) if jobs[whose] else None

    def _job_read(self, kind: str, tenant: str, jobs: dict[str, list[str]], read: Any) -> None:
        picked = self._job_ids(jobs, tenant)
        if picked is None:
            return
        whose, job_id = picked
        code, reply = code_of(lambda: read(job_id, self._client_md(tenant)))
        if whose == tenant:
            ok = code == grpc.StatusCode.OK and not leaked(reply, tenant)
        else:
            ok = code == grpc.StatusCode.NOT_FOUND
        self.record(kind, tenant, ok, f"{whose}'s job: {code}")

    def get(self, tenant: str) -> None:
        self._job_read(
            "Get",
            tenant,
            self.t.answer_jobs,
            lambda job_id, md: self.t.answer.Get(
                answer_pb2.GetRequest(job_id=job_id), metadata=md, timeout=30
            ),
        )

    def watch(self, tenant: str) -> None:
        def first(job_id: str, md: Any) -> Any:
            stream = self.t.answer.Watch(
                answer_pb2.WatchRequest(job_id=job_id), metadata=md, timeout=30
            )
            try:
                return next(stream)
            finally:
                stream.cancel()

        self._job_read("Watch", tenant, self.t.answer_jobs, first)

    def get_job(self, tenant: str) -> None:
        self._job_read(
            "GetJob",
            tenant,
            self.t.ingest_jobs,
            lambda job_id, md: self.t.ingest.GetJob(
                ingest_pb2.GetJobRequest(job_id=job_id), metadata=md, timeout=30
            ),
        )

    def watch_job(self, tenant: str) -> None:
        self._job_read(
            "WatchJob",
            tenant,
            self.t.ingest_jobs,
            lambda job_id, md: list(
                self.t.ingest.WatchJob(
                    ingest_pb2.WatchJobRequest(job_id=job_id), metadata=md, timeout=60
                )
            ),
        )

    def _query(self, tenant: str) -> str:
        words = self.rng.choice(SEARCHES)
        return f"{ORG[OTHER[tenant]]} {words}" if self.rng.random() < 0.5 else words

    def lexical_search(self, tenant: str) -> None:
        request = lexical_pb2.SearchRequest(
            query=self._query(tenant),
            top_k=20,
            level=self.rng.choice(
                [lexical_pb2.SEARCH_LEVEL_DOCUMENT, lexical_pb2.SEARCH_LEVEL_PASSAGE]
            ),
            highlight=self.rng.random() < 0.5,
        )
        code, reply = code_of(
            lambda: self.t.lexical.Search(request, metadata=self.t.as_service(tenant), timeout=30)
        )
        ok = code == grpc.StatusCode.OK and bool(reply.hits) and not leaked(reply, tenant)
        self.record("lexical.Search", tenant, ok, code)

    def semantic_search(self, tenant: str) -> None:
        mode = self.rng.choice(
            [
                semantic_pb2.SEARCH_MODE_DENSE,
                semantic_pb2.SEARCH_MODE_KG,
                semantic_pb2.SEARCH_MODE_FUSED,
            ]
        )
        # KG scores rank articles; passages are ranked densely only.
        levels = [semantic_pb2.SEARCH_LEVEL_DOCUMENT]
        if mode == semantic_pb2.SEARCH_MODE_DENSE:
            levels.append(semantic_pb2.SEARCH_LEVEL_PASSAGE)
        request = semantic_pb2.SearchRequest(
            query=self._query(tenant), top_k=20, level=self.rng.choice(levels), mode=mode
        )
        code, reply = code_of(
            lambda: self.t.semantic.Search(request, metadata=self.t.as_service(tenant), timeout=30)
        )
        ok = code == grpc.StatusCode.OK and bool(reply.hits) and not leaked(reply, tenant)
        self.record("semantic.Search", tenant, ok, code)

    def explain(self, tenant: str) -> None:
        doc_id = self.rng.choice([*TOPICS, ONLY["acme"], ONLY["globex"]])
        request = semantic_pb2.ExplainRequest(query=self._query(tenant), doc_id=doc_id)
        code, reply = code_of(
            lambda: self.t.semantic.Explain(request, metadata=self.t.as_service(tenant), timeout=30)
        )
        if doc_id == ONLY[OTHER[tenant]]:
            ok = code == grpc.StatusCode.NOT_FOUND
        else:
            ok = code == grpc.StatusCode.OK and not leaked(reply, tenant)
        self.record("Explain", tenant, ok, f"{doc_id}: {code}")

    def internal_with_a_client_key(self, tenant: str) -> None:
        # A tenant's own key on the internal listener, naming the other tenant.
        request = lexical_pb2.SearchRequest(query=self.rng.choice(SEARCHES), top_k=5)
        code, reply = code_of(
            lambda: self.t.lexical.Search(
                request, metadata=self.t.md(tenant, (TENANT_KEY, OTHER[tenant])), timeout=30
            )
        )
        ok = code == grpc.StatusCode.PERMISSION_DENIED and reply is None
        self.record("internal listener, client key", tenant, ok, code)

    # -- writes --------------------------------------------------------------------
    def delete(self, tenant: str) -> None:
        """Delete the other tenant's only document by id, or by its organization."""
        other = OTHER[tenant]
        if self.rng.random() < 0.5:
            request = ingest_pb2.DeleteRequest(doc_ids=[ONLY[other]])
        else:
            request = ingest_pb2.DeleteRequest(
                filters=[common_pb2.Filter(field="organization", any_of=[ORG[other]])]
            )
        code, reply = code_of(
            lambda: self.t.ingest.Delete(request, metadata=self._client_md(tenant), timeout=60)
        )
        intact = set(self.t.bodies(other, "water")) == {"n1", ONLY[other]}
        ok = code == grpc.StatusCode.OK and reply.deleted == 0 and intact
        self.record("Delete", tenant, ok, f"{code} {reply} intact={intact}")
        self.writes += 1

    def delete_shared_id(self, tenant: str) -> None:
        """Delete one's own copy of a shared id: the other tenant's copy stays."""
        other = OTHER[tenant]
        code, reply = code_of(
            lambda: self.t.ingest.Delete(
                ingest_pb2.DeleteRequest(doc_ids=["n3"]), metadata=self.t.md(tenant), timeout=60
            )
        )
        self.t.settled(tenant, "child workers", lambda hits: "n3" not in hits)
        theirs = self.t.bodies(other, "child workers")
        ok = code == grpc.StatusCode.OK and reply.deleted == 1 and SECRET[other] in theirs["n3"]
        self.record("Delete", tenant, ok, f"{code} {reply} {theirs}")
        # Put it back, so the other attempts keep finding it.
        self.t.ingest_and_wait(tenant, [document(tenant, "n3")])
        self.t.settled(tenant, "child workers", lambda hits: "n3" in hits)
        self.writes += 1

    def ingest(self, tenant: str) -> None:
        """A new version of a shared id replaces one's own copy, never the other's."""
        other = OTHER[tenant]
        version = self.writes + 2
        before = self.t.bodies(other, "emissions target")["n2"]
        last = self.t.ingest_and_wait(tenant, [document(tenant, "n2", version)])
        self.t.settled(
            tenant, "emissions target", lambda hits: f"version {version}." in hits.get("n2", "")
        )
        after = self.t.bodies(other, "emissions target")["n2"]
        ok = last.progress.updated == 1 and after == before and SECRET[other] in after
        self.record("Ingest", tenant, ok, f"{before!r} -> {after!r}")
        self.writes += 1


READS = {
    "ask": 6,
    "ask_stream": 4,
    "get": 10,
    "watch": 8,
    "get_job": 10,
    "watch_job": 6,
    "lexical_search": 18,
    "semantic_search": 16,
    "explain": 12,
    "internal_with_a_client_key": 4,
}
WRITES = ("delete", "delete_shared_id", "ingest")


@pytest.mark.timeout(600)
def test_randomized_cross_tenant_attempts_leak_nothing(tenants: Tenants) -> None:
    rng = random.Random(16)
    attempts = Attempts(tenants, rng)
    # Queued answer jobs first (a worker runs them while the reads go on).
    for tenant in TENANTS:
        for _ in range(2):
            attempts.submit(tenant)
    plan: list[str] = [*WRITES, *WRITES]
    plan += rng.choices(list(READS), weights=list(READS.values()), k=230)
    rng.shuffle(plan)
    for kind in plan:
        tenant = rng.choice(TENANTS)
        try:
            getattr(attempts, kind)(tenant)
        except Exception as exc:  # a check that cannot complete counts against the stores
            attempts.record(kind, tenant, False, repr(exc))
    # Every submitted job finishes with its own tenant's answer only.
    for tenant in TENANTS:
        for job_id in tenants.answer_jobs[tenant]:
            *_, last = tenants.answer.Watch(
                answer_pb2.WatchRequest(job_id=job_id), metadata=tenants.md(tenant), timeout=300
            )
            done = last.job.state == answer_pb2.JOB_STATE_DONE
            attempts.record("Watch (to the end)", tenant, done and not leaked(last, tenant))
    total = sum(attempts.counts.values())
    print(f"\ncross-tenant attempts: {total}, leaks: {len(attempts.leaks)}")
    for kind, n in sorted(attempts.counts.items()):
        print(f"  {kind:32} {n:4}")
    assert attempts.leaks == [], "\n".join(attempts.leaks)
    assert total >= 200
    assert attempts.writes == 2 * len(WRITES)
