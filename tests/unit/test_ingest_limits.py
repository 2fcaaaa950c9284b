"""Cost bounds per item: non-text runs dropped before chunking, passages capped
per document, each with a warning in the job's report, and a batch run smallest
items first so that a large item does not hold the small ones. No sockets, no
models."""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Sequence

from attest.ingest.commands import Report
from attest.ingest.documents import Article, article_from_raw_json
from attest.ingest.jobs import IngestCore, InlineDispatcher, Item, StageRunner
from attest.ingest.nontext import drop_non_text
from attest.ingest.settings import EnrichSettings
from attest.ingest.stages import Enricher
from attest.ingest.state import JobStore, MemoryKeyValue

PROSE = "Crude oil output rose 3.5 pct in March, the ministry said. " * 3


def _payload(n: int) -> str:
    return base64.b64encode(random.Random(n).randbytes(n)).decode("ascii")


def test_non_text_runs_are_dropped_and_measured():
    image = _payload(30_000)  # 40,000 characters
    mime = "\n".join(image[i : i + 76] for i in range(0, 7600, 76))  # 100 lines of 76
    dump = "\n".join(f"{i:08x}  4f 3a 00 ff 1a 2b 3c 4d  5e 6f 70 81 92 a3 b4 c5" for i in range(4))
    text = (
        f'{PROSE}<img src="data:image/png;base64,{image}">\n{PROSE}\n{mime}\n{PROSE}\n'
        f"{dump}\n{PROSE}"
    )
    cleaned, dropped = drop_non_text(text)
    assert cleaned.count(PROSE) == 4
    assert "base64" not in cleaned
    assert "4f 3a" not in cleaned
    assert dropped.chars == {
        "data: URIs": len("data:image/png;base64,") + 40_000,
        "base64/hex runs": 7600,
        "hex dumps": sum(len(line) for line in dump.splitlines()),
    }
    assert dropped.runs == 1 + 100 + 4


def test_text_that_looks_dense_is_kept():
    kept = [
        # A table of figures flattened into a line: numbers, no hex letters.
        "Year 2016 2017 2018 2019 2020 2021 2022 2023 2024 2025 2026 2027 2028 2029 2030 2031",
        "Scope 1 12 34 56 78 90 12 34 56 78 90 12 34 56 78 90 12 34 56 78 90 12 34 56",
        # Scripts written without spaces.
        "中国石油天然气集团公司今天宣布" * 60,
        "บริษัทน้ำมันแห่งประเทศไทยประกาศผลประกอบการ" * 20,
        # A long word and a long URL.
        "Rindfleischetikettierungsueberwachungsaufgabenuebertragungsgesetz was repealed.",
        "See https://example.com/reports/2023/annual-report-sustainability-appendix?page=12.",
    ]
    for text in kept:
        assert drop_non_text(text) == (text, drop_non_text("")[1])


def _article(body: str, doc_id: str = "d") -> Article:
    return article_from_raw_json(json.dumps({"id": doc_id, "title": "T", "body": body}).encode())


def test_passages_are_capped_with_a_warning_saying_how_much_is_left_out():
    sentence = "The board approved the dividend of 12 cents a share for the year. "
    body = sentence * 400  # about 13 tokens a sentence, 200 tokens a passage
    enricher = Enricher(EnrichSettings(max_passages=5, keyphrases=0))
    record = enricher.enrich(0, "created", "h", _article(body))
    assert len(record["passages"]) == 5
    (warning,) = record["warnings"]
    assert warning[0] == "PASSAGES_TRUNCATED"
    kept = record["passages"][-1][3]
    assert f"the last {len(body.rstrip()) - kept:,} characters" in warning[1]
    # Spans point into the stored body.
    stored = record["article"]["body"]
    assert all(stored[p[2] : p[3]] == p[1] for p in record["passages"])
    # Under the cap nothing is cut and nothing is said.
    small = enricher.enrich(1, "created", "h", _article(sentence * 20))
    assert small["warnings"] == []


def test_an_inline_image_is_not_indexed_and_the_report_says_so():
    image = _payload(300_000)  # 400,000 characters: 167 passages if kept
    body = f"{PROSE}\n![chart](data:image/png;base64,{image})\n{PROSE}"
    record = Enricher(EnrichSettings(keyphrases=0)).enrich(0, "created", "h", _article(body))
    assert len(record["passages"]) == 1
    assert "base64" not in record["article"]["body"]
    ((code, message),) = record["warnings"]
    assert code == "NON_TEXT_DROPPED"
    assert message.startswith("dropped 400,022 characters in 1 run (data: URIs 400,022)")


class _Embedding:
    def warm_up(self) -> None:
        pass

    def unknown_entities(self, record: dict) -> list[str]:
        return []

    def embed(self, records: list[dict]) -> list[dict]:
        return [{**r, "entity_ids": []} for r in records]


class _Sinks:
    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    async def index(self, tenant: str, records: Sequence[dict]) -> None:
        self.batches.append([r["article"]["id"] for r in records])

    async def delete(self, tenant: str, doc_ids: Sequence[str]) -> None:
        pass

    async def close(self) -> None:
        pass


async def test_a_large_item_runs_after_the_small_items_of_its_batch_are_committed():
    store = JobStore(MemoryKeyValue())
    sinks = _Sinks()
    settings = EnrichSettings(slice_chars=2000, keyphrases=0, max_passages=3)
    runner = StageRunner(store, settings, embedding=_Embedding, sinks=lambda: sinks)
    inline = InlineDispatcher(runner)
    core = IngestCore(store, inline, lambda: sinks, batch_size=8)  # type: ignore[arg-type]
    big = "The quarterly report covers every segment in detail. " * 2000
    items = [
        Item("f:1", _article(big, "big")),
        *(Item(f"f:{i}", _article(PROSE, f"s{i}")) for i in range(6)),
        Item(
            "f:9", _article(f"{PROSE} data:application/octet-stream;base64,{_payload(300)}", "img")
        ),
    ]
    job_id = core.ingest("t", items).job_id
    await inline.drain()
    await inline.close()
    # One batch of 8: the small items in slices of about 2,000 characters, in
    # size order, each written and committed before the large item starts.
    assert sinks.batches == [["s0", "s1", "s2", "s3", "s4"], ["s5", "img"], ["big"]]
    snap = store.snapshot(job_id)
    assert snap is not None
    assert (snap.state, snap.progress.indexed, snap.progress.warned) == ("DONE", 8, 2)
    assert snap.progress.passages_indexed == 6 + 1 + 3
    assert [(w.doc_id, w.code) for w in snap.warnings] == [
        ("big", "PASSAGES_TRUNCATED"),
        ("img", "NON_TEXT_DROPPED"),
    ]
    report = Report(
        job_id=job_id,
        state="DONE",
        warned=snap.progress.warned,
        warnings=[(w.origin, w.doc_id, w.code, w.message) for w in snap.warnings],
    )
    lines = report.lines(1)
    assert "  2 documents ingested with warnings" in lines
    assert lines[-2].startswith("  warning f:1 (big): PASSAGES_TRUNCATED over the limit of 3")
    assert lines[-1] == "  ... and 1 more"
