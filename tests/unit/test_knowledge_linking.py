"""Linking articles to the ESG graph: offline RAKE keyphrases, embedding matches, organizations."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import nltk
import numpy as np
import numpy.typing as npt
import pytest

from attest.knowledge.graph import KnowledgeGraph, Level, load_graph
from attest.knowledge.linking import (
    DEFAULT_SINGLE_WORD_THRESHOLD,
    DEFAULT_THRESHOLD,
    ENGLISH_STOPWORDS,
    EntityLink,
    EntityLinker,
    KeyphraseExtractor,
    organization_links,
    split_sentences,
    tokenize_words,
)

SAMPLE_CORPUS = Path(__file__).resolve().parents[2] / "services/attest/demo/sample_corpus.jsonl"

EMISSIONS_NEWS = (
    "Steelmaker raises climate goal",
    "Harbor Steel said on Tuesday that its carbon dioxide emissions fell 8% last year "
    "as it replaced a coal-fired blast furnace with an electric arc furnace. The company "
    "also reported lower methane leaks at its coke plant and said its scope 3 emissions, "
    "mostly from iron ore shipping, would be measured for the first time in 2026.",
)
CHILD_LABOUR_NEWS = (
    "Inspectors find child workers at cocoa supplier",
    "Labour inspectors found children as young as 12 working on farms that supply "
    "cocoa beans to the chocolate maker, carrying heavy loads and using machetes. The "
    "company said it would suspend purchases until the underage workers were enrolled in school.",
)
UNRELATED_TEXT = (
    "Late goal sends City into the cup semi-final",
    "A header in the 89th minute from the substitute striker gave City a 2-1 win at the "
    "stadium on Saturday. The visitors had led at half-time after a fine free kick, "
    "but the home side pressed hard after the break and the goalkeeper was booked.",
)


# ------------------------------------------------------------ tokenizers


def test_sentence_splitter() -> None:
    text = "Emissions fell 6%. Did water use rise? Yes!\n\nA new paragraph without a stop"
    assert split_sentences(text) == [
        "Emissions fell 6%.",
        "Did water use rise?",
        "Yes!",
        "A new paragraph without a stop",
    ]
    assert split_sentences("   ") == []


def test_word_tokenizer_keeps_compounds_and_breaks_at_punctuation() -> None:
    tokens = tokenize_words("It emits 1,820,000 t of CO2 — the company's greenhouse-gas (PM2.5).")
    assert tokens == [
        "It",
        "emits",
        "1,820,000",
        "t",
        "of",
        "CO2",
        ",",
        "the",
        "company's",
        "greenhouse-gas",
        ",",
        "PM2.5",
        ",",
        ",",
    ]


def test_percentages_break_phrases() -> None:
    assert tokenize_words("Emissions fell 8% to 1.2 mln t, a 3.5 % cut.") == [
        "Emissions",
        "fell",
        ",",
        "to",
        "1.2",
        "mln",
        "t",
        ",",
        "a",
        ",",
        "cut",
        ",",
    ]


def test_stopwords_cut_phrases_but_keep_topic_words() -> None:
    assert {"the", "said", "and", "mln", "would"} <= ENGLISH_STOPWORDS
    assert not {"emissions", "water", "labour", "child", "carbon", "waste"} & ENGLISH_STOPWORDS


# ------------------------------------------------------------ keyphrases


@pytest.fixture
def no_nltk_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any use of NLTK's downloadable data fail, as it does on a machine without it."""

    def refuse(*args: object, **kwargs: object) -> list[str]:
        raise LookupError("NLTK data is not available offline")

    # nltk.corpus.stopwords is a lazy loader that would look for the data on
    # attribute access, so the whole corpus object is replaced.
    monkeypatch.setattr(nltk.corpus, "stopwords", SimpleNamespace(words=refuse))
    monkeypatch.setattr(nltk.tokenize, "sent_tokenize", refuse)
    monkeypatch.setattr(nltk.tokenize, "wordpunct_tokenize", refuse)


@pytest.mark.usefixtures("no_nltk_data")
def test_keyphrases_offline() -> None:
    text = (
        "Norvale Copper said its scope 3 emissions rose to 9.4 million tonnes. "
        "Labour inspectors found child workers at a Dunmarch supplier, and 63 workers "
        "were interviewed."
    )
    phrases = KeyphraseExtractor().extract(text, max_phrases=20)
    # Phrases break at stopwords ("said", "rose", "million", "at", "and") and at
    # punctuation; a leading count is dropped ("63 workers" -> "workers") and a
    # number-only phrase ("9.4") disappears, while inner numbers stay.
    assert phrases == [
        "labour inspectors found child workers",
        "scope 3 emissions",
        "workers",
        "norvale copper",
        "dunmarch supplier",
        "tonnes",
        "interviewed",
    ]


def test_keyphrases_are_ranked_and_bounded() -> None:
    text = (
        "Greenhouse gas emissions from cement kilns rose. Water use fell. "
        "Greenhouse gas emissions from trucks rose too."
    )
    phrases = KeyphraseExtractor().extract(text, max_phrases=3)
    # Degree / frequency favours long phrases; the repeated "greenhouse gas
    # emissions" is listed once.
    assert phrases == ["greenhouse gas emissions", "water use", "cement kilns"]
    assert KeyphraseExtractor().extract(text) == [*phrases, "trucks"]
    assert KeyphraseExtractor().extract(text, max_phrases=0) == []
    assert KeyphraseExtractor().extract("  \n ", max_phrases=5) == []


def test_phrases_longer_than_max_words_are_dropped() -> None:
    text = (
        "Quarterly sustainability disclosure committee meeting minutes published. Water use fell."
    )
    assert KeyphraseExtractor(max_words=5).extract(text) == ["water use"]
    assert KeyphraseExtractor(max_words=7).extract(text)[0] == (
        "quarterly sustainability disclosure committee meeting minutes published"
    )


# --------------------------------------------------------- organizations


def test_organization_links_normalise_names() -> None:
    assert organization_links(
        ["  Norvale   Copper ", "Halvorsen\tTextiles", "", "   ", "norvale copper", "Loomlight"]
    ) == ["Norvale Copper", "Halvorsen Textiles", "Loomlight"]
    assert organization_links([]) == []


# ------------------------------------------- matching logic (fake encoder)

SMALL_GRAPH = {
    "version": "0.0.1",
    "entities": [
        {"id": "root", "level": "root", "name": "Root", "definition": "Root."},
        {
            "id": "env",
            "level": "pillar",
            "name": "Environment",
            "definition": "Pillar.",
            "parents": {"root": "contains"},
        },
        {
            "id": "gri-305",
            "level": "basic",
            "gri": "305",
            "name": "Emissions",
            "definition": "Topic.",
            "parents": {"env": "contains"},
        },
        {
            "id": "ghg",
            "level": "intermediate",
            "name": "greenhouse gas emission",
            "aliases": ["GHG emissions"],
            "definition": "Indicator.",
            "parents": {"gri-305": "measured_as"},
        },
        {
            "id": "co2",
            "level": "lower",
            "name": "carbon dioxide emission",
            "aliases": ["CO2 emissions", "carbon emissions"],
            "definition": "Gas.",
            "parents": {"ghg": "type"},
        },
    ],
}


def bag_of_words(texts: Sequence[str]) -> npt.NDArray[np.float32]:
    """A deterministic stand-in for a sentence encoder: unit-length word-count vectors."""
    vocab: dict[str, int] = {}
    rows = [re.findall(r"[a-z0-9]+", t.lower()) for t in texts]
    for words in rows:
        for w in words:
            vocab.setdefault(w, len(vocab))
    # Hash into a fixed width so that separate calls share coordinates.
    out = np.zeros((len(texts), 512), dtype=np.float32)
    for i, words in enumerate(rows):
        for w in words:
            out[i, sum(map(ord, w)) * 31 % 512] += 1.0
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.where(norms == 0, 1.0, norms)


class CountingEncoder:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls.append(len(texts))
        return bag_of_words(texts)


@pytest.fixture
def small_graph() -> KnowledgeGraph:
    return KnowledgeGraph.from_mapping(SMALL_GRAPH)


def test_linker_embeds_attributes_once_and_only_linkable_levels(
    small_graph: KnowledgeGraph,
) -> None:
    encoder = CountingEncoder()
    linker = EntityLinker(small_graph, encoder)
    assert encoder.calls == []  # cheap constructor
    linker.warm_up()
    linker.warm_up()
    # Emissions (1) + ghg (2) + co2 (3); root and pillar are not linkable.
    assert encoder.calls == [6]
    assert linker.attribute_count == 6
    linker.link("t", "carbon emissions rose.")
    linker.link("t", "carbon emissions rose.")
    assert encoder.calls[0] == 6
    assert all(n < 6 for n in encoder.calls[1:])


def test_each_keyphrase_goes_to_its_best_entity_and_entities_keep_their_best_phrase(
    small_graph: KnowledgeGraph,
) -> None:
    linker = EntityLinker(small_graph, bag_of_words, threshold=0.5)
    links = linker.link_phrases(
        ["carbon emissions", "carbon emissions rose sharply", "ghg emissions"]
    )
    assert links == [
        EntityLink("co2", "carbon emissions", pytest.approx(1.0)),
        EntityLink("ghg", "ghg emissions", pytest.approx(1.0)),
    ]


def test_threshold_filters_weak_matches(small_graph: KnowledgeGraph) -> None:
    strict = EntityLinker(small_graph, bag_of_words, threshold=0.95)
    # cos("carbon emissions rose", "carbon emissions") = 2 / sqrt(3 * 2) = 0.816
    assert strict.link_phrases(["carbon emissions rose"]) == []
    loose = EntityLinker(small_graph, bag_of_words, threshold=0.8)
    [link] = loose.link_phrases(["carbon emissions rose"])
    assert link.entity_id == "co2"
    assert link.score == pytest.approx(2 / np.sqrt(6), abs=1e-5)


def test_one_word_keyphrases_need_a_near_exact_match(small_graph: KnowledgeGraph) -> None:
    linker = EntityLinker(small_graph, bag_of_words, threshold=0.5)
    # cos("carbon", "carbon emissions") = 0.707: enough for a phrase, not for a lone word.
    assert linker.link_phrases(["carbon"]) == []
    [link] = linker.link_phrases(["emissions"])
    assert (link.entity_id, link.score) == ("gri-305", pytest.approx(1.0))


def test_link_many_encodes_all_keyphrases_in_one_call(small_graph: KnowledgeGraph) -> None:
    encoder = CountingEncoder()
    linker = EntityLinker(small_graph, encoder, threshold=0.9)
    linker.warm_up()
    results = linker.link_many(
        [
            ("CO2 emissions", "Our CO2 emissions fell."),
            ("Football", "The match ended in a draw."),
            ("", ""),
        ]
    )
    assert len(encoder.calls) == 2  # attributes, then every keyphrase at once
    assert [link.entity_id for link in results[0]] == ["co2"]
    assert results[1] == []
    assert results[2] == []


def test_linker_rejects_bad_thresholds_and_encoders(small_graph: KnowledgeGraph) -> None:
    with pytest.raises(ValueError, match="threshold"):
        EntityLinker(small_graph, bag_of_words, threshold=1.5)
    with pytest.raises(ValueError, match="single_word_threshold"):
        EntityLinker(small_graph, bag_of_words, single_word_threshold=-2)

    def wrong_rows(texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return np.zeros((1, 4), dtype=np.float32)

    with pytest.raises(ValueError, match="one row per text"):
        EntityLinker(small_graph, wrong_rows).warm_up()


def test_defaults() -> None:
    assert DEFAULT_THRESHOLD == 0.65
    assert DEFAULT_SINGLE_WORD_THRESHOLD == 0.9


# --------------------------------------------- the real model (MiniLM)


@pytest.fixture(scope="module")
def linker() -> EntityLinker:
    from attest.semantic.embedding import Embedder

    linker = EntityLinker(load_graph(), Embedder().encode)
    linker.warm_up()
    return linker


def _ids(links: list[EntityLink]) -> list[str]:
    return [link.entity_id for link in links]


@pytest.mark.slow
def test_emissions_news_links_to_emission_entities(linker: EntityLinker) -> None:
    links = linker.link(*EMISSIONS_NEWS)
    by_id = {link.entity_id: link for link in links}
    # "fell" and "8%" break the phrase, so it is the bare noun phrase that matches.
    assert by_id["carbon-dioxide-emission"].keyphrase == "carbon dioxide emissions"
    assert by_id["carbon-dioxide-emission"].score > 0.9
    assert by_id["methane-emission"].keyphrase == "lower methane leaks"
    assert by_id["scope-3-emissions"].score == pytest.approx(1.0, abs=1e-3)
    assert "methane-emission" in by_id
    assert all(DEFAULT_THRESHOLD <= link.score <= 1.0 for link in links)
    assert links == sorted(links, key=lambda link: -link.score)
    # Every emission link climbs to GRI 305.
    for entity_id in ("carbon-dioxide-emission", "methane-emission", "scope-3-emissions"):
        assert "gri-305" in linker.graph.ancestors(entity_id)


@pytest.mark.slow
def test_child_workers_link_to_child_labour(linker: EntityLinker) -> None:
    links = linker.link(*CHILD_LABOUR_NEWS)
    child = [link for link in links if "gri-408" in linker.graph.ancestors(link.entity_id)]
    assert child, links
    assert {"underage-workers", "child-labour-cocoa"} & set(_ids(child))
    assert max(link.score for link in child) > 0.75


@pytest.mark.slow
def test_unrelated_text_stays_unlinked(linker: EntityLinker) -> None:
    assert linker.link(*UNRELATED_TEXT) == []
    assert linker.link("", "") == []


@pytest.mark.slow
def test_sample_corpus_articles_link_to_their_topics(linker: EntityLinker) -> None:
    articles = {
        doc["id"]: doc
        for doc in map(json.loads, SAMPLE_CORPUS.read_text().splitlines())
        if doc["id"] in {"esg-001", "esg-005", "esg-020", "esg-045"}
    }
    ids = ["esg-001", "esg-005", "esg-020", "esg-045"]
    results = dict(
        zip(
            ids,
            linker.link_many([(articles[i]["title"], articles[i]["body"]) for i in ids]),
            strict=True,
        )
    )
    emissions = {link.entity_id: link for link in results["esg-001"]}
    assert emissions["scope-3-emissions"].score == pytest.approx(1.0, abs=1e-3)
    assert emissions["carbon-dioxide-equivalent"].keyphrase == "carbon dioxide equivalent"
    assert "underage-workers" in _ids(results["esg-005"])
    assert "gri-409" in _ids(results["esg-005"])  # "forced labour" in the same report
    assert "bribery" in _ids(results["esg-020"])
    assert results["esg-045"][0].entity_id == "data-breach"
    for links in results.values():
        basic = {a for link in links for a in linker.graph.ancestors(link.entity_id)}
        assert basic & {e.id for e in linker.graph.at_level(Level.BASIC)}
    assert linker.organization_links(articles["esg-005"]["organizations"]) == [
        "Halvorsen Textiles",
        "Loomlight Labour Watch",
    ]
