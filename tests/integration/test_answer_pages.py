"""Answers name the page of each source: a paged document (a PDF's text, pages
separated by form feeds) is ingested through the ingest service of an embedded
stack (every service in this process, as `attest serve all --embedded` runs
them), and Ask's sources carry the page their passage is on; a document
without pages has sources on page 0, and `attest ask` prints the page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attest.answer.commands import render_answer
from attest.answer.embedded import embedded_stack
from attest.answer.v1 import answer_pb2
from attest.client import AnswerClient, options
from attest.core.channels import create_channel
from attest.ingest.v1 import ingest_pb2, ingest_pb2_grpc

pytestmark = pytest.mark.integration

# Page 3 is empty (a full-page chart): the water page is still page 4.
PAGES = [
    "Kestrel Mining Annual Report 2024. Kestrel Mining operates copper mines in Chile and "
    "Peru and a smelter at Ridge. This report covers the year to December 2024.",
    "Kestrel Mining cut scope 1 greenhouse gas emissions by 12% in 2024. Most of the cut "
    "came from electric haul trucks at the Loma pit.",
    "",
    "Kestrel Mining cut water withdrawal at the Ridge smelter by 31% in 2024. The Ridge "
    "smelter now recycles most of its process water.",
]
REPORT = {
    "id": "kestrel-ar-2024",
    "title": "Kestrel Mining Annual Report",
    "body": "\f".join(PAGES),
}
NEWS = {
    "id": "wire-1",
    "title": "Marrowgate Bank names a chair",
    "body": "Marrowgate Bank named Rosalind Achebe-Fry as its chair in March 2024. She "
    "replaces Tomas Greve, who led the board for nine years.",
}


async def ingest(address: str, records: list[dict[str, str]]) -> None:
    channel = create_channel(address)
    try:
        stub = ingest_pb2_grpc.IngestServiceStub(channel)
        job = await stub.Ingest(
            ingest_pb2.IngestRequest(
                items=[ingest_pb2.IngestItem(raw_json=json.dumps(r).encode()) for r in records]
            ),
            timeout=120,
        )
        final = None
        async for update in stub.WatchJob(
            ingest_pb2.WatchJobRequest(job_id=job.job.job_id), timeout=600
        ):
            final = update
        assert final is not None
        assert final.state == ingest_pb2.JOB_STATE_DONE
        assert final.progress.indexed == len(records)
    finally:
        await channel.close()


def page_of(text: str) -> int:
    """The page of PAGES whose text holds ``text``."""
    (page,) = [n for n, page in enumerate(PAGES, start=1) if text and text in page]
    return page


@pytest.mark.timeout(900)
async def test_ask_sources_carry_the_page_of_their_passage(tmp_path: Path) -> None:
    async with embedded_stack(tmp_path / "data") as address:
        await ingest(address, [REPORT, NEWS])
        async with AnswerClient(address) as client:
            water = await client.ask(
                "By how much did Kestrel Mining cut water withdrawal at the Ridge smelter?",
                options(rerank_top_k=3),
                timeout=300,
            )
            chair = await client.ask(
                "Who did Marrowgate Bank name as its chair?", options(rerank_top_k=3), timeout=300
            )

    def sources(answer: answer_pb2.Answer, doc_id: str) -> list[tuple[int, int, str]]:
        return [
            (s.source.passage_index, s.source.page, s.source.text)
            for s in answer.sources
            if s.source.doc_id == doc_id
        ]

    report = sources(water, REPORT["id"])
    assert report, [s.source.doc_id for s in water.sources]
    # Every passage of the report is one page (each is under 200 tokens), and
    # every source of it names the page its text is on.
    for index, page, text in report:
        assert index >= 0
        assert page == page_of(text)
    # The answer cites the water page, page 4 (page 3 had no text).
    cited = {
        (water.sources[c.source_index].source.doc_id, water.sources[c.source_index].source.page)
        for s in water.sentences
        for c in s.citations
    }
    assert (REPORT["id"], 4) in cited
    assert "31%" in water.text
    # `attest ask` prints the source with its page.
    lines = list(render_answer(water))
    assert any(line.endswith("Kestrel Mining Annual Report p. 4") for line in lines), lines

    # The news story has no pages: its sources are on page 0, printed as before.
    news = sources(chair, NEWS["id"])
    assert news
    assert {page for _, page, _ in news} == {0}
    assert {page for _, page, _ in sources(water, NEWS["id"])} <= {0}
    assert any(line.endswith("  Marrowgate Bank names a chair") for line in render_answer(chair))
