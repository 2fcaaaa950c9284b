"""KB operations over the shipped ESG graph, with the packaged MiniLM encoder."""

from __future__ import annotations

import pytest

from attest.knowledge.graph import load_graph
from attest.knowledge.kb import (
    CANDIDATE_FLOOR,
    LINK_THRESHOLD,
    EsgKnowledgeBase,
    KnowledgeBase,
    UnknownEntity,
    content_words,
)
from attest.semantic.embedding import Embedder


@pytest.fixture(scope="module")
def kb() -> EsgKnowledgeBase:
    base = EsgKnowledgeBase(load_graph(), Embedder().encode)
    base.warm_up()
    return base


def names(facts, side: str) -> list[str]:  # type: ignore[no-untyped-def]
    out = []
    for fact in facts:
        ref = fact.triple.object_entity if side == "object" else fact.triple.subject
        out.append(ref.name)
    return out


def test_is_a_knowledge_base(kb: EsgKnowledgeBase) -> None:
    assert isinstance(kb, KnowledgeBase)
    assert kb.name == "esg_graph"


def test_measures_of_greenhouse_gas_emission(kb: EsgKnowledgeBase) -> None:
    match = kb.find_entity_or_value(["Greenhouse gas emission"], ["measures"])
    assert (match.relation, match.direction) == ("measured_as", "forward")
    assert match.score == pytest.approx(1.0, abs=1e-4)
    assert names(match.facts, "object") == ["Carbon dioxide equivalent", "Emissions intensity"]
    # A paraphrase of the relation finds the same edges.
    again = kb.find_entity_or_value(["GHG emissions"], ["how is it measured"])
    assert names(again.facts, "object") == names(match.facts, "object")


def test_topics_under_environment(kb: EsgKnowledgeBase) -> None:
    match = kb.find_entity_or_value(["Environment"], ["topics under"])
    assert (match.relation, match.direction) == ("contains", "forward")
    assert names(match.facts, "object") == [
        "Materials",
        "Energy",
        "Water and effluents",
        "Biodiversity",
        "Emissions",
        "Waste",
        "Environmental compliance",
        "Supplier environmental assessment",
        "Climate change",
        "Sustainable agriculture",
    ]


def test_inverse_relation_gives_the_parents(kb: EsgKnowledgeBase) -> None:
    match = kb.find_entity_or_value(["Greenhouse gas emission"], ["measure of"])
    assert (match.relation, match.direction) == ("measured_as", "inverse")
    assert names(match.facts, "subject") == ["Emissions", "Climate change"]


def test_relation_falls_back_to_the_definition_sentence(kb: EsgKnowledgeBase) -> None:
    # The graph holds no "electricity" relation; the definition says it.
    match = kb.find_entity_or_value(["Scope 2 emissions"], ["electricity"])
    assert match.relation is None
    assert match.score < kb.relation_threshold
    [fact] = match.facts
    assert fact.description is not None
    assert fact.description.text.startswith("Greenhouse gases released when generating")
    # Nothing in the graph or the definition: no facts.
    assert kb.find_entity_or_value(["Environment"], ["headquarters"]).facts == ()


def test_relationship_between_scope_2_and_emissions(kb: EsgKnowledgeBase) -> None:
    rel = kb.find_relationship(["Scope 2 emissions"], ["Emissions"])
    assert (rel.first.id, rel.second.id) == ("scope-2-emissions", "gri-305")
    assert [[t.text() for t in p.triples] for p in rel.paths] == [
        [
            "(Greenhouse gas emission, source, Scope 2 emissions)",
            "(Emissions, measured_as, Greenhouse gas emission)",
        ]
    ]
    # The names share "emission(s)", so their similarity is scored.
    assert rel.shared_words == ("emission",)
    assert rel.name_similarity is not None
    assert 0.6 < rel.name_similarity < 0.9
    # Within one hop they are not connected; names without shared words get no score.
    assert kb.find_relationship(["scope 2"], ["GRI 305"], max_hops=1).paths == ()
    water = kb.find_relationship(["Water and effluents"], ["Environment"])
    assert len(water.paths) == 1
    assert water.name_similarity is None


def test_get_entity_info(kb: EsgKnowledgeBase) -> None:
    info = kb.get_entity_info(["gri-305"])
    assert info.entity.name == "Emissions"
    assert info.entity.gri_id == "GRI 305"
    assert info.descriptions[0].text == info.entity.definition
    assert [t.text() for t in info.triples][:2] == [
        "(Environment, contains, Emissions)",
        "(Emissions, measured_as, Greenhouse gas emission)",
    ]
    assert len(info.triples) == 5
    assert not info.truncated
    assert kb.get_entity_info(["emissions"], max_facts=2).truncated


def test_linking_exact_then_embedding(kb: EsgKnowledgeBase) -> None:
    exact = kb.entity_linking(["carbon footprint"])
    assert exact.chosen == "greenhouse-gas-emission"
    assert [(c.match, c.score) for c in exact.candidates] == [("exact", 1.0)]

    near = kb.entity_linking(["worker injuries"], top_k=3)
    assert near.chosen == "work-related-injury"
    top = near.candidates[0]
    assert top.match == "embedding"
    assert top.matched_name == "workplace injuries"
    assert top.score >= LINK_THRESHOLD
    assert [c.entity.id for c in near.candidates] == [
        "work-related-injury",
        "industrial-accident",
        "gri-403",
    ]
    # Candidates below the threshold are listed, none chosen.
    vague = kb.entity_linking(["heat-trapping gases"])
    assert vague.chosen is None
    assert all(CANDIDATE_FLOOR <= c.score < LINK_THRESHOLD for c in vague.candidates)
    assert "greenhouse-gas-emission" in [c.entity.id for c in vague.candidates]
    assert kb.entity_linking(["late goal in the cup semi-final"]).chosen is None


def test_unknown_entity(kb: EsgKnowledgeBase) -> None:
    with pytest.raises(UnknownEntity):
        kb.get_entity_info(["quarterly football results"])


def test_content_words() -> None:
    assert content_words("Scope 2 emissions of the company") == {
        "scope",
        "2",
        "emission",
        "company",
    }
