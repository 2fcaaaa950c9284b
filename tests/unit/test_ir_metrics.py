"""IR metrics against values computed by hand."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from attest.evaluation.ir import DatasetError, evaluate, load_dataset


def test_metrics_match_hand_computed_values():
    qrels = {"q1": {"a": 2, "b": 1}, "q2": {"c": 1}, "q3": {"z": 0}}
    run = {
        "q1": {"x": 3.0, "a": 2.0, "b": 1.0},  # relevant at ranks 2 and 3
        "q2": {"y": 1.0},  # nothing relevant retrieved
    }
    m = evaluate(qrels, run)
    assert m["queries"] == 2  # q3 has no positive judgment
    # trec_eval (and so BEIR) uses the judgment itself as the gain.
    dcg = 2 / math.log2(3) + 1 / math.log2(4)
    idcg = 2 / math.log2(2) + 1 / math.log2(3)
    assert m["ndcg@10"] == pytest.approx((dcg / idcg + 0.0) / 2)
    assert m["mrr@10"] == pytest.approx((1 / 2 + 0) / 2)
    assert m["recall@100"] == pytest.approx((1.0 + 0.0) / 2)


def test_mrr_is_cut_at_ten():
    run = {"q": {f"d{i}": 100.0 - i for i in range(10)} | {"rel": 1.0}}
    m = evaluate({"q": {"rel": 1}}, run)
    assert m["mrr@10"] == 0.0
    assert m["recall@100"] == 1.0


def test_dataset_loading_reports_bad_files(tmp_path: Path):
    with pytest.raises(DatasetError, match=r"corpus\.jsonl is missing"):
        load_dataset(tmp_path)
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text('{"_id": "1", "title": "t", "text": "x"}\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "x"}\nnot json\n')
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\t1\t1\n")
    with pytest.raises(DatasetError, match=r"queries\.jsonl:2"):
        load_dataset(tmp_path)
    (tmp_path / "queries.jsonl").write_text('{"_id": "q1", "text": "x"}\n')
    data = load_dataset(tmp_path)
    assert data.judged_queries() == {"q1": "x"}
    assert [d.id for d in data.corpus()] == ["1"]


def _folder(tmp_path: Path, corpus: bytes, queries: bytes, qrels: bytes) -> Path:
    (tmp_path / "qrels").mkdir(exist_ok=True)
    (tmp_path / "corpus.jsonl").write_bytes(corpus)
    (tmp_path / "queries.jsonl").write_bytes(queries)
    (tmp_path / "qrels" / "test.tsv").write_bytes(qrels)
    return tmp_path


GOOD_CORPUS = b'{"_id": "d1", "title": "t", "text": "x"}\n{"_id": "d2", "text": "y"}\n'
GOOD_QUERIES = b'{"_id": "q1", "text": "x"}\n{"_id": "q2", "text": "y"}\n'
GOOD_QRELS = b"query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\n"


@pytest.mark.parametrize(
    ("corpus", "queries", "qrels", "error"),
    [
        (
            b'{"_id": "d1"}\n{"_id": "d1", "text": "again"}\n',
            GOOD_QUERIES,
            GOOD_QRELS,
            r"corpus\.jsonl:2: document id 'd1' is also on line 1",
        ),
        (
            GOOD_CORPUS,
            b'{"_id": "q1", "text": "x"}\n\n{"_id": "q1", "text": "z"}\n',
            GOOD_QRELS,
            r"queries\.jsonl:3: query id 'q1' is also on line 1",
        ),
        (
            b'{"_id": "d1"}\n{"title": "no id"}\n',
            GOOD_QUERIES,
            GOOD_QRELS,
            r"corpus\.jsonl:2: no '_id'",
        ),
        (GOOD_CORPUS, b'{"_id": "q1"}\n', GOOD_QRELS, r"queries\.jsonl:1: no 'text'"),
        (
            b'{"_id": "d1", "text": "caf\xe9"}\n',
            GOOD_QUERIES,
            GOOD_QRELS,
            r"corpus\.jsonl:1: not UTF-8 \(byte 27 of the line\)",
        ),
        (
            GOOD_CORPUS,
            b'{"_id": "q1", "text": "x"}\n\xff\n',
            GOOD_QRELS,
            r"queries\.jsonl:2: not UTF-8",
        ),
        (GOOD_CORPUS, b'["q1", "x"]\n', GOOD_QRELS, r"queries\.jsonl:1: expected a JSON object"),
        (
            GOOD_CORPUS,
            GOOD_QUERIES,
            b"query-id\tcorpus-id\tscore\nq1\td1\t\xff\n",
            r"test\.tsv:2: not UTF-8",
        ),
        (b"\n\n", GOOD_QUERIES, GOOD_QRELS, r"corpus\.jsonl holds no documents"),
    ],
)
def test_a_bad_beir_folder_is_refused_with_the_line_at_fault(
    tmp_path: Path, corpus: bytes, queries: bytes, qrels: bytes, error: str
) -> None:
    with pytest.raises(DatasetError, match=error):
        load_dataset(_folder(tmp_path, corpus, queries, qrels))


def test_blank_lines_a_byte_order_mark_and_crlf_are_read(tmp_path: Path) -> None:
    data = load_dataset(
        _folder(
            tmp_path,
            b"\xef\xbb\xbf" + GOOD_CORPUS.replace(b"\n", b"\r\n") + b"\n",
            b"\xef\xbb\xbf" + GOOD_QUERIES + b"\n  \n",
            b"\xef\xbb\xbf" + GOOD_QRELS.replace(b"\n", b"\r\n") + b"\r\n\n",
        )
    )
    assert [d.id for d in data.corpus()] == ["d1", "d2"]
    assert data.queries == {"q1": "x", "q2": "y"}
    assert data.qrels == {"q1": {"d1": 1}, "q2": {"d2": 1}}


def test_numbers_are_read_as_text_where_text_is_expected(tmp_path: Path) -> None:
    data = load_dataset(
        _folder(
            tmp_path,
            b'{"_id": 0, "title": null, "text": 12}\n',
            b'{"_id": 1, "text": 42}\n',
            b"query-id\tcorpus-id\tscore\n1\t0\t1\n",
        )
    )
    assert data.queries == {"1": "42"}
    assert [(d.id, d.title, d.text) for d in data.corpus()] == [("0", "", "12")]
    with pytest.raises(DatasetError, match=r"queries\.jsonl:1: no 'text'"):
        load_dataset(_folder(tmp_path, GOOD_CORPUS, b'{"_id": "q", "text": null}\n', GOOD_QRELS))


def test_judged_queries_that_cannot_be_asked_are_kept_out_of_the_figures(tmp_path: Path) -> None:
    data = load_dataset(
        _folder(tmp_path, GOOD_CORPUS, GOOD_QUERIES, GOOD_QRELS + b"qZZ\td1\t1\nqY\td2\t0\n")
    )
    assert data.unasked == ("qZZ",)  # qY has no positive judgment: nothing to report
    assert set(data.qrels) == {"q1", "q2"}
    perfect = {"q1": {"d1": 1.0}, "q2": {"d2": 1.0}}
    assert evaluate(data.qrels, perfect)["ndcg@10"] == 1.0


def test_judged_documents_the_corpus_lacks_are_counted_and_named(tmp_path: Path) -> None:
    data = load_dataset(
        _folder(
            tmp_path,
            GOOD_CORPUS,
            GOOD_QUERIES,
            GOOD_QRELS + b"q1\tgone\t1\nq2\tgone\t2\nq2\tlost\t1\nq1\tnever\t0\n",
        )
    )
    # "never" is judged not relevant: nothing a retriever should have found.
    assert data.missing_documents == ("gone", "lost")
    assert data.judgments_of_missing == 3
    # They stay in the judgments: a perfect run still misses them.
    assert data.qrels["q2"]["lost"] == 1
