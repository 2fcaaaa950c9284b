"""The shipped reader file: it loads offline and reads labelled pairs it never saw."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from attest.evaluation.judge_eval import ranking_metrics
from attest.evaluation.reader_data import load_pairs, split
from attest.generate.reader import MODEL_FILE, Reader, ReaderJudge, ReaderUnavailable

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
CARD = MODEL_FILE.with_name("reader.md")


@pytest.fixture(scope="module")
def reader() -> Reader:
    return Reader(MODEL_FILE, threads=2)


def test_the_shipped_file_is_small_and_matches_its_card():
    size = MODEL_FILE.stat().st_size
    assert size <= 25 * 1024 * 1024
    digest = hashlib.sha256(MODEL_FILE.read_bytes()).hexdigest()
    card = CARD.read_text(encoding="utf-8")
    assert digest in card, "the model card's sha256 is not the shipped file's"
    assert re.search(r"attest train judge", card)


def test_a_missing_file_says_how_to_get_one(tmp_path):
    with pytest.raises(ReaderUnavailable, match="attest train judge"):
        Reader(tmp_path / "none.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(ReaderUnavailable, match="not a loadable reader model"):
        Reader(bad)


@pytest.fixture(scope="module")
def held_out() -> list:
    _, held = split(load_pairs(SHARED / "train", None))
    return held


@pytest.mark.parametrize(
    ("dataset", "task", "least_auroc"),
    [
        ("qnli", "answer", 0.85),
        ("selqa", "answer", 0.85),
        ("snli", "support", 0.85),
    ],
)
def test_held_out_pairs_are_read_well(reader, held_out, dataset, task, least_auroc):
    pairs = [p for p in held_out if p.dataset == dataset and p.task == task][:400]
    scores = reader.score_pairs([(p.task, p.first, p.sentence) for p in pairs])
    m = ranking_metrics([p.label for p in pairs], list(scores), [p.group for p in pairs])
    assert m["auroc"] >= least_auroc, m


def test_states_needs_the_source_to_say_it(reader):
    source = (
        "Marrowgate Bank named Rosalind Achebe-Fry, a former deputy governor of the central "
        "bank, as its independent chair on Tuesday. She replaces the chief executive, who had "
        "held both roles since 2019."
    )
    states = reader.states(
        [
            (source, "Rosalind Achebe-Fry is the new chair of Marrowgate Bank."),
            (source, "Marrowgate Bank cut its scope 1 emissions by 30 % in 2024."),
            (
                "Fennick Retail Group cut food waste by 18 % in 2024.",
                "Rosalind Achebe-Fry is the new chair of Marrowgate Bank.",
            ),
        ]
    )
    assert states[0] > 0.6
    assert states[1] < 0.3
    assert states[2] < 0.1


def test_answers_prefers_the_sentence_that_says_what_is_asked(reader):
    question = "Who is the new chair of Marrowgate Bank?"
    p = reader.answers(
        question,
        [
            "Marrowgate Bank named Rosalind Achebe-Fry as its independent chair on Tuesday.",
            "Marrowgate Bank said it would separate the roles of chair and chief executive.",
            "Fennick Retail Group cut food waste by 18 % in 2024.",
        ],
    )
    assert p[0] > p[1] > p[2]
    assert p[0] > 0.5 > p[2]


def test_the_combined_judge_rates_the_answer_above_a_look_alike(reader):
    from attest.generate.judge import SupportJudge
    from attest.semantic.embedding import Embedder

    judge = ReaderJudge(reader, features=SupportJudge(Embedder()))
    question = "What were Fennick Retail Group's scope 1 emissions in 2024?"
    look_alike = "Fennick Retail Group cut food waste by 18 % in 2024."
    answer = "Fennick Retail Group's scope 1 emissions were 41,000 tonnes of CO2e in 2024."
    sources = [look_alike + " It also published its gender pay gap.", answer]
    rated = judge.judge(question, [look_alike, answer], sources)
    assert rated[1, 1] > rated[0, 0]
    # A source that does not state a sentence is no citation for it.
    assert rated[1, 0] < 0.3


def test_the_reader_holds_a_source_without_the_sentences_figures_below_a_citation(reader):
    from attest.generate.judge import PARTIAL_SUPPORT

    judge = ReaderJudge(reader)
    question = "Which organization fined Norvale Copper, and for what?"
    sentence = "The Estuary Basin Water Authority fined Norvale Copper $2.4 million in 2025."
    # The same claim without the amount: said only in part.
    sources = [sentence, "The Estuary Basin Water Authority fined Norvale Copper."]
    rated = judge.judge(question, [sentence], sources)
    assert rated[0, 1] <= PARTIAL_SUPPORT
    assert rated[0, 0] > rated[0, 1]


def test_a_pair_scores_the_same_alone_and_among_others(reader):
    pair = ("answer", "Who wrote Hamlet?", "Hamlet was written by William Shakespeare around 1600.")
    long_source = " ".join(f"Sentence {i} is about the weather in the north." for i in range(30))
    alone = reader.score_pairs([pair])[0]
    mixed = reader.score_pairs([("support", long_source, "It rained.")] * 3 + [pair])[3]
    assert alone == mixed


def test_an_onnx_file_that_is_not_a_reader_is_refused(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    path = tmp_path / "other.onnx"
    onnx.save(
        helper.make_model(graph, ir_version=8, opset_imports=[helper.make_opsetid("", 17)]),
        str(path),
    )
    with pytest.raises(ReaderUnavailable, match="not a reader model"):
        Reader(path)


def test_eval_judge_prints_metrics_and_writes_scores(tmp_path):
    import json

    from click.testing import CliRunner

    from attest.cli import main

    rows = [
        {
            "id": "a1",
            "task": "answer",
            "question": "Who wrote Hamlet?",
            "group": "q",
            "sentence": "Hamlet was written by William Shakespeare.",
            "label": 1,
        },
        {
            "id": "a2",
            "task": "answer",
            "question": "Who wrote Hamlet?",
            "group": "q",
            "sentence": "The weather in Denmark is often grey.",
            "label": 0,
        },
        {
            "id": "s1",
            "task": "support",
            "source": "Paris is the capital of France.",
            "sentence": "France's capital is Paris.",
            "label": 1,
        },
        {
            "id": "s2",
            "task": "support",
            "source": "Paris is the capital of France.",
            "sentence": "Lyon is the capital of France.",
            "label": 0,
        },
    ]
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    out = tmp_path / "scores" / "s.jsonl"
    result = CliRunner().invoke(
        main,
        ["eval", "judge", "--dataset", str(data), "--scorer", "reader", "--scores-out", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert "reader  answer   pairs=2 AUROC=1.000 groups=1 MAP=1.000" in result.output
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [
        "a1",
        "a2",
        "s1",
        "s2",
    ]
    same = CliRunner().invoke(
        main, ["eval", "judge", "--dataset", str(data), "--scores-out", str(data)]
    )
    assert same.exit_code != 0
    assert "is the --dataset file" in same.output
    (tmp_path / "latin1.jsonl").write_bytes(b'{"id": "1", "sentence": "caf\xe9"}\n')
    bad = CliRunner().invoke(main, ["eval", "judge", "--dataset", str(tmp_path / "latin1.jsonl")])
    assert bad.exit_code != 0
    assert "latin1.jsonl:1: not UTF-8" in bad.output
