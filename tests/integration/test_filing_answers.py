"""A filing asked through the whole stack: two companies' PDFs are read by
ingest's PDF reader and ingested into one embedded stack; a metric question
about one of them is answered with its arithmetic, each operand cited to the
row and page of that company's filing, never the other's; and attest eval
filings scores the set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from attest.answer.commands import render_answer
from attest.answer.embedded import embedded_stack
from attest.client import AnswerClient, options
from attest.common.v1 import common_pb2
from attest.evaluation.filings_commands import eval_filings
from attest.evaluation.pooled import ingest_documents
from attest.generate.numeric import operand_queries
from attest.ingest.readers import read_document_file
from tests.pdf_samples import PROSE, text_pdf

pytestmark = pytest.mark.integration


def _statements(company: str, sales: tuple[str, str], ppe: tuple[str, str]) -> list[list[str]]:
    return [
        PROSE,
        [
            f"{company.upper()}, INC.",
            "CONSOLIDATED STATEMENTS OF OPERATIONS",
            "(in millions, except per share data)",
            "2019 2018",
            f"Net sales $ {sales[0]} $ {sales[1]}",
            "Cost of sales 2,000 2,300",
            "Net income $ 1,503 $ 1,813",
        ],
        [
            f"{company.upper()}, INC.",
            "CONSOLIDATED BALANCE SHEETS",
            "(in millions)",
            "At December 31, 2019 At December 31, 2018",
            "ASSETS",
            f"Property and equipment, net {ppe[0]} {ppe[1]}",
            "Total assets $ 19,845 $ 17,890",
        ],
    ]


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "filings"
    (folder / "pdfs").mkdir(parents=True)
    (folder / "pdfs" / "ACME_2019_10K.pdf").write_bytes(
        text_pdf(_statements("Acme", ("6,489", "7,500"), ("253", "282")))
    )
    (folder / "pdfs" / "GLOBEX_2019_10K.pdf").write_bytes(
        text_pdf(_statements("Globex", ("9,100", "8,700"), ("1,200", "1,100")))
    )
    questions = [
        {
            "id": "acme-fat",
            "question": "What is the FY2019 fixed asset turnover ratio for Acme? Fixed asset "
            "turnover ratio is defined as: FY2019 revenue / (average PP&E between FY2018 and "
            "FY2019). Round your answer to two decimal places.",
            "answers": ["24.26"],
            "doc_name": "ACME_2019_10K",
            "question_reasoning": "Numerical reasoning",
            "evidence": [
                {"doc_name": "ACME_2019_10K", "page": 1, "text": "..."},
                {"doc_name": "ACME_2019_10K", "page": 2, "text": "..."},
            ],
        },
        {
            "id": "globex-sales",
            "question": "What is the FY2018 total amount of net sales for Globex? Answer in USD "
            "millions.",
            "answers": ["$8700.00"],
            "doc_name": "GLOBEX_2019_10K",
            "question_reasoning": "Information extraction",
            "evidence": [{"doc_name": "GLOBEX_2019_10K", "page": 1, "text": "..."}],
        },
    ]
    (folder / "qa.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    return folder


@pytest.mark.timeout(900)
async def test_a_metric_is_computed_from_the_named_company_rows_and_pages(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    docs = []
    for path in sorted((folder / "pdfs").glob("*.pdf")):
        record = json.loads(read_document_file(path, path.parent).raw_json)
        docs.append(
            common_pb2.Document(
                id=path.stem, title=path.stem, body=record["body"], metadata=record["metadata"]
            )
        )
    question = json.loads((folder / "qa.jsonl").read_text().splitlines()[0])["question"]
    assert operand_queries(question) == [
        "statements of operations income earnings total net revenues total net sales "
        "total revenues 2019",
        "balance sheets financial position property and equipment, net property, plant and "
        "equipment, net net property, plant and equipment 2019 2018",
    ]
    async with embedded_stack(tmp_path / "data") as address:
        await ingest_documents(address, docs, progress=False)
        async with AnswerClient(address) as client:
            answer = await client.ask(question, timeout=300)
            # Asked of the other filing alone: nothing of Acme's is a source.
            elsewhere = await client.ask(
                question, options(documents=["GLOBEX_2019_10K"]), timeout=300
            )
    assert elsewhere.sources
    assert {s.source.doc_id for s in elsewhere.sources} == {"GLOBEX_2019_10K"}
    assert "24.26" not in " ".join(s.text for s in elsewhere.sentences)
    assert not answer.insufficient_information
    (sentence,) = answer.sentences
    assert sentence.text == "Fixed asset turnover ratio, FY2019: 6,489 / ((282 + 253) / 2) = 24.26."
    cited = {
        (answer.sources[c.source_index].source.doc_id, answer.sources[c.source_index].source.page)
        for c in sentence.citations
    }
    # Net sales on page 2 and property and equipment on page 3 of Acme's filing.
    assert cited == {("ACME_2019_10K", 2), ("ACME_2019_10K", 3)}
    assert all(c.confidence == 8 for c in sentence.citations)
    # attest ask names each cited page and the row the citation rests on.
    lines = list(render_answer(answer))
    assert any(line.endswith("ACME_2019_10K p. 3") for line in lines), lines
    assert any(
        "cites: CONSOLIDATED BALANCE SHEETS (in millions): ASSETS: Property and equipment, net"
        in line
        for line in lines
    ), lines


@pytest.mark.timeout(900)
def test_eval_filings_scores_the_set(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    output = tmp_path / "out" / "filings.json"
    result = CliRunner().invoke(
        eval_filings,
        ["--dataset", str(folder), "--output", str(output), "--data-dir", str(tmp_path / "d")],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(output.read_text())["summary"]
    assert summary["all"]["questions"] == 2
    assert summary["all"]["right"] == 2
    assert summary["all"]["right_with_evidence_page"] == 2
    assert summary["all"]["other_filing_cited"] == 0
    answers = [json.loads(line) for line in output.with_suffix(".answers.jsonl").open()]
    assert [a["verdict"] for a in answers] == ["right", "right"]
    assert answers[1]["answer"] == "Net sales, FY2018: $8,700 million."
