"""`attest backup` / `attest restore` of a data directory that `serve all --embedded` is
writing to.

The demo corpus is ingested into a running `serve all --embedded` in batches of
four. Part-way through the job the test pauses its writes with the data
directory's write barrier (what `attest backup` does), asks the twelve demo
questions while they are paused (the source's answers at the moment of the
backup), and backs the directory up inside the same pause. `attest backup`
from the command line runs too while the job goes on. The first backup is
restored into a fresh directory with `attest restore --open-jobs cancel`,
`attest doctor` finds it consistent, and a `serve all --embedded` on it gives
the same answers, sentence for sentence and citation for citation.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import grpc
import pytest

from attest.answer.v1 import answer_pb2, answer_pb2_grpc
from attest.core.write_barrier import WriteBarrier
from attest.demo.run import sample_documents, sample_questions
from attest.generate.v1 import generate_pb2
from attest.ingest.backup import backup, verify
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from tests.integration.ingest_stack import answer_serving, free_port, wait_until

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "attest.cli"]
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "OMP_NUM_THREADS": "1",
    # Twelve batches: the backup lands between two of them.
    "ATTEST_INGEST_BATCH_SIZE": "4",
}


@contextmanager
def serve_all(data_dir: Path, log: Path) -> Iterator[str]:
    port = free_port()
    address = f"127.0.0.1:{port}"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [*CLI, "serve", "all", "--embedded", "--port", str(port), "--data-dir", str(data_dir)],
            env=ENV,
            stdout=out,
            stderr=out,
        )
        try:
            wait_until(
                lambda: answer_serving(address) or server.poll() is not None, 600, "serve all"
            )
            assert server.poll() is None, log.read_text()[-3000:]
            yield address
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                code = server.wait(timeout=60)
            finally:
                if server.poll() is None:
                    server.kill()
    assert code == 0, log.read_text()[-3000:]


def ask_all(address: str) -> list[dict[str, Any]]:
    """Every demo question's answer: its text, each sentence with its citations, and
    the sources (extractive generation: deterministic)."""
    out = []
    with grpc.insecure_channel(address) as channel:
        stub = answer_pb2_grpc.AnswerServiceStub(channel)
        for q in sample_questions():
            options = answer_pb2.AskOptions(
                rerank_top_k=5, generation_mode=generate_pb2.GENERATION_MODE_EXTRACTIVE
            )
            answer = stub.Ask(
                answer_pb2.AskRequest(question=q["question"], options=options), timeout=300
            ).answer
            out.append(
                {
                    "id": q["id"],
                    "text": answer.text,
                    "insufficient": answer.insufficient_information,
                    "sentences": [
                        [
                            s.text,
                            s.confidence,
                            [
                                (c.doc_id, c.passage_index, c.confidence, c.quote)
                                for c in s.citations
                            ],
                        ]
                        for s in answer.sentences
                    ],
                    "sources": [s.source.doc_id for s in answer.sources],
                }
            )
    return out


def cli(*args: str, status: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*CLI, *args], env=ENV, capture_output=True, text=True, timeout=900, check=False
    )
    assert done.returncode == status, done.stdout + done.stderr
    return done


def progress(stub: ingest_pb2_grpc.IngestServiceStub, job_id: str) -> ingest_pb2.Job:
    return stub.GetJob(ingest_pb2.GetJobRequest(job_id=job_id), timeout=30).job


@pytest.mark.timeout(1800)
def test_backup_while_ingesting_restores_the_answers_of_its_moment(tmp_path: Path) -> None:
    source, restored = tmp_path / "source", tmp_path / "restored"
    paused_backup, cli_backup = tmp_path / "backup-paused", tmp_path / "backup-cli"
    docs = sample_documents()
    with serve_all(source, tmp_path / "source.log") as address:
        with grpc.insecure_channel(address) as channel:
            stub = ingest_pb2_grpc.IngestServiceStub(channel)
            items = [ingest_pb2.IngestItem(document=d) for d in docs]
            job_id = stub.Ingest(ingest_pb2.IngestRequest(items=items), timeout=60).job.job_id
            wait_until(lambda: progress(stub, job_id).progress.indexed >= 8, 600, "two batches")

            with WriteBarrier(source).paused(wait_seconds=120):
                # No batch commits while the barrier is held: what is asked now
                # is what the backup holds.
                before = progress(stub, job_id)
                assert before.state == ingest_pb2.JOB_STATE_RUNNING, before
                at_backup = ask_all(address)
                report = backup(source, paused_backup, paused=nullcontext(0.0))
                after = progress(stub, job_id)
            assert after.progress.indexed == before.progress.indexed

            # The command line, while the job goes on: it waits for the batch in
            # flight, pauses the next, and the job still finishes.
            made = cli("backup", str(cli_backup), "--data-dir", str(source))
            assert f"backed up {source} to {cli_backup}" in made.stdout, made.stdout
            final = list(stub.WatchJob(ingest_pb2.WatchJobRequest(job_id=job_id), timeout=900))[-1]
            assert final.state == ingest_pb2.JOB_STATE_DONE, final
            assert (final.progress.created, final.progress.failed) == (len(docs), 0)
        at_end = ask_all(address)

    manifest = report.manifest
    held = manifest["tenants"]["default"]["documents"]
    assert held == before.progress.indexed, manifest["tenants"]
    assert 8 <= held < len(docs)
    assert manifest["consistent"], manifest["problems"]
    assert [j["job_id"] for j in manifest["open_jobs"]] == [job_id]
    assert manifest["open_jobs"][0]["unfinished"] == len(docs) - held
    stores = manifest["stores"]
    assert stores["lexical/attest-lexical-documents"]["by_tenant"] == {"default": held}
    assert stores["vectors/attest-articles"]["by_tenant"] == {"default": held}
    assert verify(paused_backup) == manifest  # every file as the manifest lists it
    # The second backup is whole and consistent too, whenever it landed.
    cli_manifest = verify(cli_backup)
    assert cli_manifest["consistent"], cli_manifest["problems"]
    assert held <= cli_manifest["tenants"]["default"]["documents"] <= len(docs)
    assert not list(tmp_path.glob(".*partial*")), "a staging folder was left behind"

    # A partial corpus answers differently from the whole one: the comparison
    # below tells the backup's moment from the end of the job.
    assert at_backup != at_end

    put = cli("restore", str(paused_backup), "--data-dir", str(restored), "--open-jobs", "cancel")
    assert f"into {restored}" in put.stdout
    assert "1 jobs running at the backup closed as failed" in put.stdout
    # A second restore into it is refused, saying how to replace it.
    again = cli("restore", str(paused_backup), "--data-dir", str(restored), status=1)
    assert "is not empty" in again.stderr
    assert "--overwrite" in again.stderr

    checked = cli("doctor", "--data-dir", str(restored), "--json")
    doctor = json.loads(checked.stdout.strip().splitlines()[-1])
    assert doctor["consistent"] is True, doctor
    assert doctor["resumed"] == []
    (tenant,) = doctor["before"]
    assert tenant["documents"] == held
    for store in ("lexical", "vectors", "kg_links"):
        assert tenant["stores"][store]["missing"] == 0
        assert tenant["stores"][store]["orphans"] == 0

    with serve_all(restored, tmp_path / "restored.log") as address:
        assert ask_all(address) == at_backup
