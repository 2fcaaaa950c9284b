"""Validation of answer requests into plans: defaults, ranges, contradictions, budgets."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration

from attest.answer.options import DEFAULT_RETRIEVERS, validate
from attest.answer.settings import AnswerSettings
from attest.answer.v1 import answer_pb2
from attest.common.v1 import common_pb2
from attest.core.errors import DeadlineExceeded, InvalidArgument
from attest.generate.v1 import generate_pb2

SETTINGS = AnswerSettings()


def plan(question: str = "What did Norvale emit?", deadline: float | None = None, **options: Any):
    return validate(question, answer_pb2.AskOptions(**options), SETTINGS, deadline_seconds=deadline)


def test_an_empty_options_message_means_every_default() -> None:
    p = plan()
    assert p.retrievers == DEFAULT_RETRIEVERS
    assert p.fusion == SETTINGS.fusion()  # the configured (shipped) fusion
    assert (p.top_k_per_retriever, p.fused_top_k, p.rerank_top_k) == (100, 50, 10)
    assert (p.passages_per_document, p.confidence_threshold, p.max_researches) == (1, 5, 3)
    assert p.research_top_k == 3
    assert p.budget_seconds == 60.0
    assert not p.skip_rerank


def test_explicit_zero_threshold_and_researches_are_kept() -> None:
    p = plan(confidence_threshold=0, max_researches=0)
    assert (p.confidence_threshold, p.max_researches) == (0, 0)


def test_the_shorter_of_budget_and_deadline_applies() -> None:
    assert plan(deadline=3.0, time_budget=Duration(seconds=10)).budget_seconds == 3.0
    assert plan(deadline=30.0, time_budget=Duration(seconds=10)).budget_seconds == 10.0


@pytest.mark.parametrize(
    ("question", "options", "field"),
    [
        ("", {}, "question"),
        ("q" * 4097, {}, "question"),
        ("q", {"fused_top_k": 1001}, "options.fused_top_k"),
        ("q", {"rerank_top_k": -1}, "options.rerank_top_k"),
        ("q", {"fused_top_k": 5, "rerank_top_k": 6}, "options.rerank_top_k"),
        ("q", {"passages_per_document": 9}, "options.passages_per_document"),
        ("q", {"rerank_top_k": 20, "passages_per_document": 6}, "options.passages_per_document"),
        ("q", {"max_researches": 21}, "options.max_researches"),
        ("q", {"time_budget": Duration(seconds=601)}, "options.time_budget"),
        ("q", {"time_budget": Duration(seconds=1, nanos=-5)}, "options.time_budget"),
        ("q", {"time_budget": Duration(seconds=0, nanos=2_000_000_000)}, "options.time_budget"),
        (
            "q",
            {
                "retrieval": common_pb2.RetrievalOptions(
                    retrievers=[common_pb2.RETRIEVER_BM25], top_k_per_retriever=10
                ),
                "fused_top_k": 20,
                "rerank_top_k": 5,
            },
            "options.fused_top_k",
        ),
        (
            "q",
            {
                "retrieval": common_pb2.RetrievalOptions(
                    retrievers=[common_pb2.RETRIEVER_UNSPECIFIED]
                )
            },
            "options.retrieval.retrievers[0]",
        ),
        (
            "q",
            {
                "retrieval": common_pb2.RetrievalOptions(
                    filters=[common_pb2.Filter(field="published_at", gte="yesterday")]
                )
            },
            "options.retrieval.filters[0].gte",
        ),
        ("q", {"generation_mode": 7}, "options.generation_mode"),
    ],
)
def test_bad_options_name_their_field(question: str, options: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        plan(question, **options)
    assert err.value.field == field


@pytest.mark.parametrize(
    "question",
    ["\x00", "\x00" * 50, "\u200b\u200c\u200d", "\ufeff\u2060 \u00ad", "\x00 \u200b\t\n"],
)
def test_a_question_of_invisible_characters_is_refused_like_white_space(question: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        plan(question)
    assert err.value.field == "question"
    assert "no visible characters" in err.value.details


@pytest.mark.parametrize("question", ["a\x00", "\u200bwater use", "\u0301", "\u4e2d"])
def test_a_question_with_one_visible_character_is_admitted(question: str) -> None:
    assert plan(question).budget_seconds > 0


def test_a_deadline_below_the_minimum_is_deadline_exceeded() -> None:
    with pytest.raises(DeadlineExceeded, match="leaves 50 ms, too short"):
        plan(deadline=0.05)


def test_the_generation_mode_goes_to_the_plan() -> None:
    assert plan("q").generation_mode == generate_pb2.GENERATION_MODE_UNSPECIFIED
    chosen = plan("q", generation_mode=generate_pb2.GENERATION_MODE_LLM)
    assert chosen.generation_mode == generate_pb2.GENERATION_MODE_LLM


def test_fusion_methods_map_to_settings() -> None:
    from attest.common.v1 import common_pb2

    configured = SETTINGS.fusion()

    def fusion(method: int) -> Any:
        return plan(retrieval=common_pb2.RetrievalOptions(fusion=method)).fusion

    plain = fusion(common_pb2.FUSION_METHOD_RRF)
    assert plain.method == "rrf"
    assert plain.weight("bm25") == plain.weight("kg_enhanced") == 1.0
    assert plain.rescore == ()
    for method, name in (
        (common_pb2.FUSION_METHOD_WEIGHTED, "weighted"),
        (common_pb2.FUSION_METHOD_DBSF, "dbsf"),
    ):
        got = fusion(method)
        assert got.method == name
        if configured.method == "linear":
            # equal weights over the retrievers the model uses (the knowledge
            # retriever, never fitted, among them: see FusionSettings.features_of)
            used = {
                r
                for r in ("bm25", "dense", "kg", "kg_enhanced", "knowledge")
                if configured.weight(r)
            }
            assert "knowledge" in used
            assert dict(got.weights) == dict.fromkeys(used, 1.0)
            assert got.weight("kg") == (1.0 if "kg" in used else 0.0)
        else:
            assert dict(got.weights) == dict(configured.weights)
    assert fusion(common_pb2.FUSION_METHOD_UNSPECIFIED) == configured
