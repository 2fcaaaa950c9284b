"""The offline fact extractor: role patterns, definitions, aspect facts and their offsets."""

from __future__ import annotations

from attest.ingest.passages import split_passages
from attest.knowledge.extract import Extractor, document_text, normalise_role, short_names
from attest.knowledge.kb import AspectFact, Description, Triple

BODY = (
    "SELBURY, July 8, 2025 — Shareholders of Orlen Vask Bank voted to split the roles. "
    "Orlen Vask, the region's oldest savings lender, said the vote was binding. "
    "Mira Tallow, a former deputy governor of the central bank, was named independent chair. "
    "Chief executive Piet Annerl said the bank would publish its climate plan. "
    "Dovecote Mills' chief financial officer, Anja Brel, declined to comment. "
    "Tom Ferris is the president of Dovecote Mills. "
    "Water withdrawal at Dovecote Mills fell 8% in 2024."
)


def extract(
    body: str = BODY, organizations: tuple[str, ...] = ("Orlen Vask Bank", "Dovecote Mills")
):  # type: ignore[no-untyped-def]
    passages = split_passages(body, 40)
    spans = [[p.index, p.text, p.start_char, p.end_char] for p in passages]
    return Extractor().extract(
        document_text("d1", body, spans, organizations, ["Water withdrawal"])
    ), passages


def test_role_patterns_become_triples_with_their_offsets() -> None:
    facts, passages = extract()
    triples = [f for f in facts if isinstance(f, Triple)]
    assert [t.text() for t in triples] == [
        "(Mira Tallow, chair of, Orlen Vask Bank)",
        "(Piet Annerl, chief executive of, Orlen Vask Bank)",
        "(Anja Brel, chief financial officer of, Dovecote Mills)",
        "(Tom Ferris, president of, Dovecote Mills)",
    ]
    for t in triples:
        p = t.provenance
        stated = BODY[p.start_char : p.end_char]
        assert t.subject.name in stated
        assert t.source_doc_id == "d1"
        passage = passages[p.passage_index]
        assert passage.start_char <= p.start_char < p.end_char <= passage.end_char
    assert BODY[triples[3].provenance.start_char : triples[3].provenance.end_char] == (
        "Tom Ferris is the president of Dovecote Mills"
    )


def test_first_defining_sentence_describes_the_organization() -> None:
    facts, _ = extract()
    descriptions = [f for f in facts if isinstance(f, Description)]
    assert [(d.entity.name, d.text) for d in descriptions] == [
        ("Orlen Vask Bank", "the region's oldest savings lender")
    ]


def test_sentences_mentioning_organizations_or_graph_entities_become_aspect_facts() -> None:
    facts, _ = extract()
    aspects = [f for f in facts if isinstance(f, AspectFact)]
    by_entity: dict[str, int] = {}
    for a in aspects:
        by_entity[a.entity.name] = by_entity.get(a.entity.name, 0) + 1
        assert BODY[a.provenance.start_char : a.provenance.end_char] == a.value
    assert by_entity == {"Orlen Vask Bank": 2, "Dovecote Mills": 3, "Water withdrawal": 1}
    water = next(a for a in aspects if a.entity.name == "Water withdrawal")
    assert water.value == "Water withdrawal at Dovecote Mills fell 8% in 2024."
    assert "water" not in water.aspect.casefold()


def test_role_and_name_helpers() -> None:
    assert normalise_role("independent Chairwoman") == "chair of"
    assert normalise_role("former deputy governor") == "former deputy governor of"
    assert normalise_role("CEO") == "chief executive of"
    assert short_names("Orlen Vask Bank") == ["Orlen Vask"]
    assert short_names("Dovecote Mills") == []


def test_no_organization_no_triple() -> None:
    facts, _ = extract("Chief executive Piet Annerl said so.", ())
    assert facts == []


def test_a_name_holding_another_organization_counts_as_that_one() -> None:
    # A recognizer may return "Shareholders of Orlen Vask Bank" as an organization.
    facts, _ = extract(
        organizations=("Shareholders of Orlen Vask Bank", "Orlen Vask Bank", "Dovecote Mills")
    )
    entities = {f.entity.name for f in facts if isinstance(f, AspectFact)}
    assert entities == {"Orlen Vask Bank", "Dovecote Mills", "Water withdrawal"}
    for a in facts:
        if isinstance(a, AspectFact):
            assert not set(a.aspect.casefold().split()) & set(a.entity.name.casefold().split())
