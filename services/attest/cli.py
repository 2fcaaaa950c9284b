"""The ``attest`` command line."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from attest.core.logging import configure_logging
from attest.core.server import Servicer
from attest.core.server import serve as serve_forever
from attest.core.settings import LoggingSettings, ServerSettings

if TYPE_CHECKING:
    from attest.core.process_lock import DataDirLock

# Services `serve` can run, each built from its own settings (read from the
# environment when the command runs, never at import time).
SERVICES: dict[str, Callable[[], tuple[Servicer, ServerSettings, LoggingSettings]]] = {}


def _lexical() -> tuple[Servicer, ServerSettings, LoggingSettings]:
    from attest.lexical.servicer import LexicalServicer
    from attest.lexical.settings import LexicalSettings

    settings = LexicalSettings()
    return LexicalServicer(settings), settings.server, settings.logging


def _semantic() -> tuple[Servicer, ServerSettings, LoggingSettings]:
    from attest.semantic.servicer import SemanticServicer
    from attest.semantic.settings import SemanticSettings

    settings = SemanticSettings()
    return SemanticServicer(settings), settings.server, settings.logging


def _rerank() -> tuple[Servicer, ServerSettings, LoggingSettings]:
    from attest.rerank.servicer import RerankServicer
    from attest.rerank.settings import RerankSettings

    settings = RerankSettings()
    return RerankServicer(settings), settings.server, settings.logging


SERVICES["lexical"] = _lexical
SERVICES["semantic"] = _semantic
SERVICES["rerank"] = _rerank


def _generate() -> tuple[Servicer, ServerSettings, LoggingSettings]:
    from attest.generate.servicer import GenerateServicer
    from attest.generate.settings import GenerateSettings

    settings = GenerateSettings()
    return GenerateServicer(settings), settings.server, settings.logging


SERVICES["generate"] = _generate


def _ingest() -> tuple[Servicer, ServerSettings, LoggingSettings]:
    from attest.ingest.servicer import IngestServicer
    from attest.ingest.settings import IngestSettings
    from attest.pipeline.settings import PipelineSettings

    settings = IngestSettings()
    pipeline = PipelineSettings() if settings.mode == "celery" else None
    return IngestServicer(settings, pipeline), settings.server, settings.logging


SERVICES["ingest"] = _ingest


def _answer() -> tuple[Servicer, ServerSettings, LoggingSettings]:
    from attest.answer.servicer import AnswerServicer
    from attest.answer.settings import AnswerSettings

    settings = AnswerSettings()
    celery = None
    if settings.jobs.state_url is not None:
        from attest.pipeline.app import create_app
        from attest.pipeline.settings import PipelineSettings

        celery = create_app(PipelineSettings())
    return AnswerServicer(settings, celery=celery), settings.server, settings.logging


SERVICES["answer"] = _answer


def _knowledge() -> tuple[Servicer, ServerSettings, LoggingSettings]:
    from attest.knowledge.servicer import service

    return service()


SERVICES["knowledge"] = _knowledge
# Served by `serve all` only with --knowledge: the knowledge service loads its
# own encoder and graph, and with it ingestion extracts facts and answers gain
# a retriever, so `all` runs it only when asked.
STANDALONE = frozenset({"knowledge"})


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _one_process(
    port: int | None, embedded: bool, secured: bool, knowledge: bool = False
) -> tuple[int, dict[str, Any]]:
    """Point every service of ``serve all`` at this process; returns the port to listen
    on and the server settings that go with it.

    Each service then reaches the others through this process (ingest writes
    through the in-process lexical and semantic services instead of opening
    the stores a second time), and with ``embedded`` every store is embedded.
    With ``knowledge`` ingestion sends facts to the knowledge service here and
    answers use it as a retriever. With authentication (``secured``) they meet
    on a second, internal listener on loopback, under a service key made for
    this process only.
    """
    from attest.answer.settings import AnswerSettings

    front = AnswerSettings().server
    if port is None:
        port = front.port
    if port == 0:
        port = _free_port()
    overrides: dict[str, Any] = {}
    here = f"127.0.0.1:{port}"
    if secured:
        import secrets

        from pydantic import SecretStr

        from attest.core.auth import hash_key
        from attest.core.settings import ClientIdentity

        internal = front.internal_port or _free_port()
        key = secrets.token_urlsafe(32)
        overrides["identity"] = ClientIdentity(token=SecretStr(key))
        overrides["internal_host"] = "127.0.0.1"
        overrides["internal_port"] = internal
        overrides["auth"] = front.auth.model_copy(
            update={"service_key_sha256": (*front.auth.service_key_sha256, hash_key(key))}
        )
        here = f"127.0.0.1:{internal}"
    for name in (
        "ATTEST_ANSWER_LEXICAL_ADDRESS",
        "ATTEST_ANSWER_SEMANTIC_ADDRESS",
        "ATTEST_ANSWER_RERANK_ADDRESS",
        "ATTEST_ANSWER_GENERATE_ADDRESS",
        "ATTEST_GENERATE_RESEARCH__LEXICAL_ADDRESS",
        "ATTEST_GENERATE_RESEARCH__SEMANTIC_ADDRESS",
        "ATTEST_INGEST_LEXICAL_ADDRESS",
        "ATTEST_INGEST_SEMANTIC_ADDRESS",
    ):
        os.environ[name] = here
    if knowledge:
        os.environ["ATTEST_ANSWER_KNOWLEDGE_ADDRESS"] = here
        os.environ["ATTEST_INGEST_KNOWLEDGE_ADDRESS"] = here
    if embedded:
        os.environ["ATTEST_LEXICAL_BACKEND"] = "tantivy"
        os.environ["ATTEST_SEMANTIC_STORE"] = "edge"
        os.environ["ATTEST_INGEST_MODE"] = "inline"
    return port, overrides


@click.group()
@click.version_option(package_name="attest")
def main() -> None:
    """Attest: answers with citations over your documents."""


@main.command()
@click.argument("service", type=click.Choice([*SERVICES, "all", "llm"]))
@click.option("--host", default=None, help="Listen address (default from settings).")
@click.option("--port", type=int, default=None, help="Listen port; 0 picks a free one.")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Embedded state.",
)
@click.option(
    "--embedded",
    is_flag=True,
    help="With `all`: embedded backends (tantivy, Qdrant engine, inline ingestion).",
)
@click.option(
    "--knowledge",
    "with_knowledge",
    is_flag=True,
    help="With `all`: run the knowledge service too; ingestion extracts facts into the "
    "personal knowledge base and answers retrieve them (RETRIEVER_KNOWLEDGE).",
)
@click.option(
    "--insecure-dev",
    is_flag=True,
    help="No authentication (every caller is tenant `default` with every scope); binds "
    "127.0.0.1 unless --host names another loopback address. Without authentication any "
    "other address is refused. `all` implies it unless authentication is configured.",
)
@click.option(
    "--http-port",
    type=int,
    default=None,
    help="With `all` or `answer`: the HTTP/JSON gateway's port (default "
    "ATTEST_ANSWER_HTTP__PORT, 8080); 0 picks a free one. ATTEST_ANSWER_HTTP__ENABLED=false "
    "turns it off.",
)
@click.option(
    "--model",
    default="gemma",
    show_default=True,
    help="With `llm`: gemma (the packaged Gemma 3 270M, CI's), qwen "
    "(Qwen2.5-Coder-1.5B-Instruct, 1.1 GB, assembled from its PyPI packages on first use) "
    "or a GGUF file's path.",
)
def serve(
    service: str,
    host: str | None,
    port: int | None,
    data_dir: Path | None,
    embedded: bool,
    with_knowledge: bool,
    insecure_dev: bool,
    http_port: int | None,
    model: str,
) -> None:
    """Run one service, or every service in one process (``all``), or the local LLM.

    Settings come from ATTEST_<SERVICE>_* variables (for example
    ATTEST_LEXICAL_BACKEND=opensearch); embedded state lives under
    ATTEST_DATA_DIR (default ./.attest). ``all`` listens on the answer
    service's port (50050) and every service calls the others there.
    ``llm`` runs llama.cpp's OpenAI-compatible server in the foreground on
    port 8080, building it on first use (minutes; cached afterwards).
    """
    if service == "llm":
        _serve_llm(host or "127.0.0.1", port, model)
        return
    if data_dir is not None:
        os.environ["ATTEST_DATA_DIR"] = str(data_dir)
    if embedded and service != "all":
        raise click.UsageError("--embedded applies to `serve all`")
    if with_knowledge and service != "all":
        raise click.UsageError("--knowledge applies to `serve all`")
    if http_port is not None and service not in ("all", "answer"):
        raise click.UsageError("--http-port applies to `serve all` and `serve answer`")
    from attest.core import tracing

    # Before the servicers exist: a Celery app they create is traced too.
    tracing.configure(service)
    from pydantic import ValidationError

    from attest.core.server import StartupRefused, authenticated

    overrides: dict[str, Any] = {}
    try:
        if service == "all":
            from attest.answer.settings import AnswerSettings

            # One process is the laptop and test path: without authentication it is
            # dev mode on loopback; a deployment runs each service on its own.
            secured = authenticated(AnswerSettings().server)
            insecure_dev = insecure_dev or not secured
            port, overrides = _one_process(
                port, embedded, secured and not insecure_dev, with_knowledge
            )
        standalone = STANDALONE - {"knowledge"} if with_knowledge else STANDALONE
        names = (
            [name for name in SERVICES if name not in standalone] if service == "all" else [service]
        )
        built = [SERVICES[name]() for name in names]
    except ValidationError as exc:
        raise click.ClickException(f"invalid settings: {exc}") from exc
    servicers = [b[0] for b in built]
    # `all` listens where the front door would.
    front = names.index("answer") if service == "all" else 0
    server_settings, log_settings = built[front][1], built[front][2]
    if insecure_dev:
        overrides["insecure_dev"] = True
        if host is None:
            host = "127.0.0.1"
    if host is not None:
        overrides["host"] = host
    if port is not None:
        overrides["port"] = port
    if server_settings.audit.path is None and (
        service == "all" or (service == "ingest" and os.environ.get("ATTEST_DATA_DIR"))
    ):
        # Where writes are accepted and a data directory is known (always for
        # `serve all`), their audit log is kept there by default.
        overrides["audit"] = server_settings.audit.model_copy(update={"path": _audit_path(None)})
    if overrides:
        server_settings = server_settings.model_copy(update=overrides)
    configure_logging(log_settings)
    from attest.core.process_lock import LockHeld

    # `serve all` on embedded stores (tantivy, Qdrant's engine: the defaults,
    # with or without --embedded) opens them under the data directory: one
    # process at a time (a second is refused here, not left waiting for stores).
    lock = _embedded_lock() if service == "all" else None
    try:
        if lock is not None:
            lock.acquire()
        if "answer" in names:
            asyncio.run(_serve_front_door(servicers, server_settings, http_port))
        else:
            asyncio.run(serve_forever(servicers, server_settings))
    except (StartupRefused, LockHeld) as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        if lock is not None:
            lock.release()


async def _serve_front_door(
    servicers: list[Servicer], server_settings: ServerSettings, http_port: int | None
) -> None:
    """gRPC with the HTTP gateway beside it (attest.answer.http)."""
    from attest.answer.http import serve as serve_http
    from attest.answer.http.labels import default_labels_dir
    from attest.answer.settings import AnswerSettings

    http = AnswerSettings().http
    if http_port is not None:
        http = http.model_copy(update={"port": http_port})
    await serve_http(servicers, server_settings, http, data_dir=default_labels_dir())


def _embedded_lock() -> DataDirLock | None:
    """The data directory's lock when `serve all` keeps a store embedded under it
    (tantivy, Qdrant's engine, or the ingest registry in SQLite)."""
    from attest.core.process_lock import DataDirLock
    from attest.ingest.settings import IngestSettings
    from attest.lexical.settings import LexicalSettings
    from attest.semantic.settings import SemanticSettings

    lexical, semantic, ingest = LexicalSettings(), SemanticSettings(), IngestSettings()
    if lexical.backend == "tantivy":
        return DataDirLock(lexical.data_dir)
    if semantic.store == "edge":
        return DataDirLock(semantic.data_dir)
    if ingest.state_url is None and ingest.mode == "inline" and ingest.state_on_disk:
        return DataDirLock(ingest.data_dir)
    return None


def _serve_llm(host: str, port: int | None, model: str) -> None:
    """Exec llama-cpp-python's server, built by the scripts CI uses, so the laptop
    runs exactly the build CI tests."""
    from attest.generate import local

    try:
        prepared = local.prepare(model)
    except local.LocalLLMError as exc:
        if model not in local.NAMED and not Path(model).is_file():
            raise click.BadParameter(str(exc), param_hint="--model") from exc
        raise click.ClickException(str(exc)) from exc
    if port is None:
        port = 8080
    elif port == 0:
        port = local.free_port(host)
    args = local.command(prepared, host, port)
    url = f"http://{host}:{port}"
    settings = " ".join(f"{k}={v}" for k, v in prepared.env(url).items())
    click.echo(f"LLM server on {url} (OpenAI-compatible). Generate with it:", err=True)
    click.echo(f"  {settings}", err=True)
    os.execv(args[0], args)  # noqa: S606


def _register_groups() -> None:
    from attest.knowledge.commands import kg
    from attest.knowledge.kb_commands import kb

    main.add_command(kg)
    main.add_command(kb)


_register_groups()


@main.command()
@click.option(
    "--queues",
    default="enrich,embed,index",
    show_default=True,
    help="Comma-separated queues: enrich (CPU), embed (the model), index (store writes), "
    "answer (queued answer jobs).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Worker processes (Celery's pool size).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve Prometheus metrics on this port: the pool processes' values summed, and "
    "attest_pipeline_queue_depth of every queue.",
)
def worker(queues: str, concurrency: int, metrics_port: int | None) -> None:
    """Run a Celery worker for pipeline queues (settings from ATTEST_PIPELINE_*)."""
    from attest.pipeline import metrics

    if metrics_port is not None and not os.environ.get(metrics.MULTIPROC_DIR):
        # prometheus_client picks its multiprocess mode when first imported
        # (already done here): start again with the directory set.
        import tempfile

        folder = tempfile.mkdtemp(prefix="attest-worker-metrics-")
        os.environ[metrics.MULTIPROC_DIR] = os.environ[metrics.OWNED_DIR] = folder
        os.execv(sys.executable, [sys.executable, "-m", "attest.cli", *sys.argv[1:]])  # noqa: S606
    from celery import signals

    from attest.answer.jobs import QUEUE as ANSWER_QUEUE
    from attest.core import tracing
    from attest.pipeline.app import QUEUES, create_app
    from attest.pipeline.settings import PipelineSettings

    settings = PipelineSettings()
    configure_logging(settings.logging)
    tracing.configure("worker")
    app = create_app(settings)
    if metrics_port is not None:
        metrics.remove_owned_dir_at_exit()
        metrics.serve(metrics_port, settings.broker_url.get_secret_value(), [*QUEUES, ANSWER_QUEUE])
        signals.worker_process_shutdown.connect(
            lambda pid=None, **_: metrics.mark_process_dead(pid or os.getpid()), weak=False
        )
    app.worker_main(
        ["worker", "--queues", queues, "--concurrency", str(concurrency), "--loglevel", "INFO"]
    )


@main.group(name="eval")
def eval_group() -> None:
    """Measure retrieval and answers on public data sets."""


@eval_group.command(name="ir")
@click.option(
    "--dataset",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    required=True,
    help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/test.tsv.",
)
@click.option(
    "--retriever",
    type=click.Choice(
        ["bm25", "dense", "kg", "kg_enhanced", "hybrid", "hybrid_kg", "tuned", "all"]
    ),
    default="bm25",
    show_default=True,
    help="hybrid: RRF of BM25 and dense; hybrid_kg: RRF of BM25, dense and KG enhanced; "
    "tuned: the services' default fusion (--fusion-settings); all: every one of them "
    "from one indexing.",
)
@click.option(
    "--backend",
    type=click.Choice(["tantivy", "opensearch", "elasticsearch"]),
    default="tantivy",
    show_default=True,
    help="Backend of the in-process lexical service (ignored with --address).",
)
@click.option("--address", default=None, help="Use a running lexical service at HOST:PORT.")
@click.option(
    "--semantic-address", default=None, help="Use a running semantic service at HOST:PORT."
)
@click.option(
    "--fusion-settings",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Fusion settings JSON for 'tuned' (default: the one the services ship with).",
)
@click.option(
    "--cache/--no-cache",
    default=True,
    show_default=True,
    help="Keep indexes, KG links and result lists under .attest/eval/cache/<dataset>-<hash> "
    "and reuse them on the next run over the same corpus.",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Metrics JSON file (default .attest/eval/<dataset>-<retriever>-<backend>.json).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 1000),
    default=200,
    show_default=True,
    help="Documents sent to the services per Index request.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, 64),
    default=8,
    show_default=True,
    help="Queries asked at once.",
)
def eval_ir(
    dataset: Path,
    retriever: str,
    backend: str,
    address: str | None,
    semantic_address: str | None,
    fusion_settings: Path | None,
    cache: bool,
    output: Path | None,
    batch_size: int,
    concurrency: int,
) -> None:
    """Index a BEIR data set through the service API; print nDCG@10, MRR@10, Recall@100."""
    from attest.evaluation.commands import check_output, warn_unasked, write_whole
    from attest.evaluation.ir import DatasetError, load_dataset
    from attest.evaluation.runner import BackendName, default_cache_dir, run_ir_eval
    from attest.retrieval.fusion import FusionSettingsError, load_fusion_settings

    configure_logging(LoggingSettings(level="WARNING", json=False))
    try:
        data = load_dataset(dataset)
        tuned = load_fusion_settings(fusion_settings)
    except (DatasetError, FusionSettingsError) as exc:
        raise click.ClickException(str(exc)) from exc
    warn_unasked(data, "every figure")
    label = "remote" if address else backend
    if retriever in ("dense", "kg", "kg_enhanced"):
        label = "remote" if semantic_address else "qdrant-edge"
    output = output or Path(".attest") / "eval" / f"{data.name}-{retriever}-{label}.json"
    check_output(output)
    cache_dir = default_cache_dir(data) if cache else None
    with tempfile.TemporaryDirectory(prefix="attest-eval-") as tmp:
        try:
            result = asyncio.run(
                run_ir_eval(
                    data,
                    retriever=retriever,
                    backend=cast(BackendName, backend),
                    address=address,
                    semantic_address=semantic_address,
                    data_dir=Path(tmp),
                    cache_dir=cache_dir,
                    tuned=tuned,
                    batch_size=batch_size,
                    concurrency=concurrency,
                )
            )
        except DatasetError as exc:
            raise click.ClickException(str(exc)) from exc
    result.update({"dataset": data.name, "retriever": retriever, "backend": label})
    write_whole(output, json.dumps(result, indent=2) + "\n")
    rows = result["retrievers"] if retriever == "all" else {retriever: result}
    for name, m in rows.items():
        click.echo(
            f"{data.name}  {name}/{label}  queries={int(m['queries'])}  "
            f"nDCG@10={m['ndcg@10']:.4f}  MRR@10={m['mrr@10']:.4f}  "
            f"Recall@100={m['recall@100']:.4f}"
        )
    click.echo(f"wall {result['wall_seconds']:.1f} s; wrote {output}")


@main.command()
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Embedded state.",
)
@click.option(
    "--top-k", type=click.IntRange(1, 20), default=3, show_default=True, help="Sources per answer."
)
@click.option(
    "--llm",
    type=click.Choice(["none", "local"]),
    default="none",
    show_default=True,
    help="local: answer with a local LLM: the server at ATTEST_GENERATE_LLM__URL when one "
    "answers there, else one started for the demo (llama.cpp, built on first use).",
)
@click.option(
    "--llm-model",
    default="gemma",
    show_default=True,
    help="With --llm local, the model a started server loads: gemma, qwen or a GGUF path.",
)
def demo(data_dir: Path | None, top_k: int, llm: str, llm_model: str) -> None:
    """Index the bundled ESG news sample and answer its questions (embedded backends)."""
    from attest.demo.run import run_demo

    configure_logging(LoggingSettings(level="WARNING", json=False))
    root = data_dir or Path(os.environ.get("ATTEST_DATA_DIR", ".attest"))
    if root.exists() and not root.is_dir():
        raise click.ClickException(f"the data directory {root} is a file")
    from attest.core.process_lock import DataDirLock, LockHeld

    # Before any model loads: a data directory another process serves is theirs.
    held_by = DataDirLock(root).holder() if root.is_dir() else None
    if held_by is not None:
        raise click.ClickException(DataDirLock(root).refusal(held_by).message)
    if llm == "none":
        try:
            asyncio.run(run_demo(root, top_k=top_k, echo=click.echo))
        except LockHeld as exc:
            raise click.ClickException(exc.message) from exc
        return
    from attest.generate import local

    try:
        with local.found_or_started(llm_model, log_path=root / "llm.log", echo=click.echo) as (
            url,
            started,
        ):
            if started is not None:
                os.environ.update(started.env(url))
            asyncio.run(run_demo(root, top_k=top_k, echo=click.echo, llm=True))
    except (local.LocalLLMError, LockHeld) as exc:
        raise click.ClickException(str(exc)) from exc


def _register_pfid() -> None:
    from attest.rerank.commands import pfid

    main.add_command(pfid)


_register_pfid()


def _register_generate() -> None:
    from attest.evaluation.commands import (
        convert_demo_command,
        convert_qa_command,
        convert_rgb_command,
        eval_demo,
        eval_qa,
        fit_judge_command,
        tune_fusion_command,
    )

    eval_group.add_command(eval_qa)
    eval_group.add_command(eval_demo)
    eval_group.add_command(convert_rgb_command)
    eval_group.add_command(convert_demo_command)
    eval_group.add_command(convert_qa_command)
    eval_group.add_command(fit_judge_command)
    eval_group.add_command(tune_fusion_command)

    from attest.evaluation.filings_commands import eval_filings

    eval_group.add_command(eval_filings)


_register_generate()


def _register_reader() -> None:
    from attest.evaluation.reader_commands import eval_judge, train_group

    main.add_command(train_group)
    eval_group.add_command(eval_judge)


_register_reader()


def _audit_path(data_dir: Path | None) -> Path:
    root = data_dir or Path(os.environ.get("ATTEST_DATA_DIR", ".attest"))
    return root / "audit.sqlite3"


@main.command()
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The data directory whose audit.sqlite3 `serve all` / `serve ingest` kept "
    "(default ATTEST_DATA_DIR, else ./.attest).",
)
@click.option(
    "--path",
    "path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="An audit file elsewhere (ATTEST_<SERVICE>_SERVER__AUDIT__PATH).",
)
@click.option("--tenant", "tenants", multiple=True, help="Only these tenants (repeatable).")
@click.option(
    "--since-hours",
    type=click.FloatRange(min=0),
    default=None,
    help="Only records of the last this many hours (default: all the file keeps).",
)
@click.option(
    "--limit",
    type=click.IntRange(1),
    default=100,
    show_default=True,
    help="At most this many records, newest first.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per record.")
def audit(
    data_dir: Path | None,
    path: Path | None,
    tenants: tuple[str, ...],
    since_hours: float | None,
    limit: int,
    as_json: bool,
) -> None:
    """Print the audit log, newest first: every ingest, delete and knowledge store,
    with the tenant, the caller, the ids and the outcome. Attempts refused (no
    credential, no scope, or naming a tenant the call did not act for) say so. For
    an administrator: it reads the file directly."""
    import json
    import time

    from attest.core import audit as audit_log

    file = path or _audit_path(data_dir)
    if not file.is_file():
        raise click.ClickException(f"no audit log at {file}")
    since = time.time() - since_hours * 3600 if since_hours is not None else None
    records = audit_log.read(file, tenants=tenants, since=since, limit=limit)
    for r in records:
        if as_json:
            click.echo(json.dumps(r))
            continue
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(r["at"]))
        ids = ",".join(r["ids"][:5]) + (f" (+{r['id_count'] - 5})" if r["id_count"] > 5 else "")
        refused = (
            f"  REFUSED for tenant {r['named_tenant']} (acted for {r['tenant'] or '-'})"
            if r["named_tenant"]
            else ("  REFUSED" if r["refused"] else "")
        )
        click.echo(
            f"{when}  {r['tenant'] or '-':<12} {r['identity'] or 'unauthenticated':<20} "
            f"{r['action']:<15} {r['outcome']:<18} {ids}{refused}"
            + (f"  {r['detail']}" if r["detail"] else "")
        )


def _register_ingest() -> None:
    from attest.ingest.commands import doctor_command, ingest

    main.add_command(ingest)
    main.add_command(doctor_command)

    from attest.ingest.backup_commands import backup_command, restore_command

    main.add_command(backup_command)
    main.add_command(restore_command)


_register_ingest()


def _register_answer() -> None:
    from attest.answer.commands import ask
    from attest.answer.http.labels import export_labels

    main.add_command(ask)
    eval_group.add_command(export_labels)


_register_answer()


if __name__ == "__main__":
    sys.exit(main())
