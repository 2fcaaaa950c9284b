"""KG path scoring: the vectorised scorer against a direct reading of the method."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from attest.knowledge.graph import load_graph
from attest.semantic.kg_scoring import Article, KgFilter, KgScorer

DIM = 32


class ToyEncoder:
    """A fixed random unit vector per distinct text: enough to test the arithmetic."""

    def __init__(self, seed: int = 7) -> None:
        self._rng = np.random.default_rng(seed)
        self._cache: dict[str, np.ndarray] = {}

    def __call__(self, texts):
        out = []
        for t in texts:
            if t not in self._cache:
                v = self._rng.normal(size=DIM).astype(np.float32)
                self._cache[t] = v / np.linalg.norm(v)
            out.append(self._cache[t])
        return np.vstack(out) if out else np.zeros((0, DIM), np.float32)


def unit(rng, n=None):
    v = rng.normal(size=(n or 1, DIM)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v if n else v[0]


def sub_graph(graph, article):
    nodes = set()
    for entity in article.entity_ids:
        for path in graph.paths_to_root(entity):
            nodes.update(path)
    return nodes


def reference_score(scorer, encode, article, query, variant, top_n, corpus=None):
    """The method as written: every node on every path to the root, scored by its best
    attribute; with ``corpus``, each node's score weighted by its IDF among those articles."""
    graph = scorer.graph
    nodes = list(sub_graph(graph, article))
    weight = dict.fromkeys(nodes, 1.0)
    if corpus is not None:
        reach = [sub_graph(graph, a) for a in corpus]
        n = len(corpus)
        for node in nodes:
            df = sum(node in r for r in reach)
            weight[node] = float(np.log1p(n / (1 + df)) / np.log1p(n))
    scores = [float(np.max(encode(graph.attributes(n)) @ query)) for n in nodes]
    if corpus is not None:
        scores = [max(0.0, sc) * weight[n] for sc, n in zip(scores, nodes, strict=True)]
    attrs = [article.headline]
    if variant == "kg_enhanced":
        if article.summary is not None:
            attrs.append(article.summary)
        if article.organization_vectors is not None:
            attrs.extend(article.organization_vectors)
    scores.append(max(float(a @ query) for a in attrs))
    scores.sort(reverse=True)
    rest = scores[1 : top_n + 1]
    return scores[0] + (sum(rest) / len(rest) if rest else 0.0)


@pytest.fixture(scope="module")
def graph():
    return load_graph()


@pytest.fixture
def setup(graph, request):
    encode = ToyEncoder()
    scorer = KgScorer(graph, encode, top_n=3, node_weighting=getattr(request, "param", "idf"))
    rng = np.random.default_rng(3)
    entity_pool = [
        e
        for e in graph.entities
        if graph.entity(e).level.name in ("BASIC", "INTERMEDIATE", "LOWER")
    ]
    articles = []
    for i in range(300):
        k = int(rng.integers(0, 4))
        entities = tuple(rng.choice(entity_pool, size=k, replace=False)) if k else ()
        orgs = ("Org A",) if i % 3 == 0 else ()
        articles.append(
            Article(
                doc_id=f"a{i}",
                entity_ids=entities,
                headline=unit(rng),
                summary=unit(rng) if i % 2 else None,
                organizations=orgs,
                organization_vectors=encode(list(orgs)) if orgs else None,
                published_at=datetime(2025, 1 + i % 12, 1, tzinfo=UTC),
            )
        )
    scorer.upsert("default", articles)
    return scorer, encode, articles, rng


@pytest.mark.parametrize("setup", ["idf", "none"], indirect=True)
@pytest.mark.parametrize("variant", ["kg", "kg_enhanced"])
@pytest.mark.parametrize("top_n", [0, 1, 3, 8])
def test_vectorised_scores_equal_the_reference(setup, variant, top_n):
    scorer, encode, articles, rng = setup
    query = unit(rng)
    ranked = scorer.score("default", query, variant=variant, top_k=len(articles), top_n=top_n)
    assert len(ranked) == len(articles)
    got = {s.doc_id: s.score for s in ranked}
    corpus = articles if scorer.node_weighting == "idf" else None
    for article in articles:
        assert got[article.doc_id] == pytest.approx(
            reference_score(scorer, encode, article, query, variant, top_n, corpus), abs=2e-3
        ), "article vectors are held at half precision"
    scores = [s.score for s in ranked]
    assert scores == sorted(scores, reverse=True)


def test_updates_deletes_and_tenants(setup):
    scorer, _, _, rng = setup
    query = unit(rng)
    before = scorer.score("default", query, top_k=5)
    assert scorer.count("default")[0] == 300
    scorer.delete("default", [before[0].doc_id])
    after = scorer.score("default", query, top_k=5)
    assert before[0].doc_id not in {s.doc_id for s in after}
    assert scorer.count("default")[0] == 299
    assert scorer.score("other", query) == []
    # Re-upserting an article with the query as its headline puts it on top.
    scorer.upsert("default", [Article(doc_id="a1", entity_ids=(), headline=query)])
    assert scorer.score("default", query, top_k=1)[0].doc_id == "a1"
    assert scorer.score("default", query, top_k=1)[0].best_node == "article"


def test_filters(setup):
    scorer, _, articles, rng = setup
    query = unit(rng)
    only_org = scorer.score(
        "default", query, top_k=500, flt=KgFilter(keywords={"organizations": ("org a",)})
    )
    assert {s.doc_id for s in only_org} == {a.doc_id for a in articles if a.organizations}
    march = KgFilter(
        published_from=datetime(2025, 3, 1, tzinfo=UTC),
        published_to=datetime(2025, 3, 31, tzinfo=UTC),
    )
    got = {s.doc_id for s in scorer.score("default", query, top_k=500, flt=march)}
    assert got == {a.doc_id for a in articles if a.published_at.month == 3}
    entity = next(e for a in articles for e in a.entity_ids)
    linked = {
        s.doc_id
        for s in scorer.score(
            "default", query, top_k=500, flt=KgFilter(keywords={"entity_ids": (entity,)})
        )
    }
    assert linked == {a.doc_id for a in articles if entity in a.entity_ids}
    named = [articles[3].doc_id, articles[40].doc_id, "never-upserted"]
    only = scorer.score("default", query, top_k=500, flt=KgFilter(doc_ids=tuple(named)))
    assert {s.doc_id for s in only} == set(named[:2])
    both = KgFilter(keywords={"organizations": ("org a",)}, doc_ids=tuple(named))
    got = {s.doc_id for s in scorer.score("default", query, top_k=500, flt=both)}
    assert got == {a.doc_id for a in (articles[3], articles[40]) if a.organizations}


def test_warm_up_builds_what_the_first_query_would(setup):
    scorer, _, articles, rng = setup
    assert not scorer.warm
    scorer.warm_up()
    assert scorer.warm
    query = unit(rng)
    warm = scorer.score("default", query, top_k=len(articles))
    # A write rebuilds its tenant's tensors at the next query, as before.
    scorer.upsert("default", [articles[0]])
    assert not scorer.warm
    assert scorer.score("default", query, top_k=len(articles)) == warm
    assert scorer.warm


def test_unknown_entities_are_rejected(graph):
    scorer = KgScorer(graph, ToyEncoder())
    with pytest.raises(KeyError, match="no-such-entity"):
        scorer.upsert(
            "default",
            [
                Article(
                    doc_id="x", entity_ids=("no-such-entity",), headline=np.ones(DIM, np.float32)
                )
            ],
        )


def test_explain_returns_paths_with_node_scores(graph):
    encode = ToyEncoder()
    scorer = KgScorer(graph, encode, top_n=3, node_weighting="none")
    query = encode([graph.entity("carbon-dioxide-emission").name])[0]
    headline = encode(["Miner cuts CO2"])[0]
    scorer.upsert(
        "default",
        [Article(doc_id="n1", entity_ids=("carbon-dioxide-emission",), headline=headline)],
    )
    score, nodes, paths = scorer.explain("default", "n1", query)
    ranked = scorer.score("default", query, top_k=1)[0]
    assert score.score == pytest.approx(ranked.score, abs=1e-6)
    assert nodes[0].node_id == "carbon-dioxide-emission"
    assert nodes[0].score == pytest.approx(1.0, abs=1e-5)
    ids = [[n.node_id for n in p] for p in paths]
    assert [
        "article",
        "carbon-dioxide-emission",
        "greenhouse-gas-emission",
        "gri-305",
        "environment",
        "sustainability",
    ] in ids
    assert scorer.explain("default", "missing", query) is None


def test_a_node_most_articles_reach_weighs_less(graph):
    """IDF weighting: the root every path reaches scores ~0; a topic one article of
    ten reaches keeps most of its similarity; the article's own score is unweighted."""
    encode = ToyEncoder()
    scorer = KgScorer(graph, encode, top_n=3)
    rng = np.random.default_rng(5)
    rare, common = "carbon-dioxide-emission", "water-stress"
    articles = [Article(doc_id="rare", entity_ids=(rare,), headline=unit(rng))]
    articles += [
        Article(doc_id=f"c{i}", entity_ids=(common,), headline=unit(rng)) for i in range(9)
    ]
    scorer.upsert("default", articles)
    root = "sustainability"
    for node, query_text in ((rare, graph.entity(rare).name), (root, graph.entity(root).name)):
        query = encode([query_text])[0]
        _, nodes, _ = scorer.explain("default", "rare", query)
        by_id = {n.node_id: n.score for n in nodes}
        if node == rare:
            assert by_id[rare] == pytest.approx(np.log1p(10 / 2) / np.log1p(10), abs=1e-4)
        else:
            assert by_id.get(root, 0.0) == pytest.approx(np.log1p(10 / 11) / np.log1p(10), abs=1e-4)
    # An article whose own headline is the question still scores 1 for itself.
    query = unit(rng)
    scorer.upsert("default", [Article(doc_id="own", entity_ids=(common,), headline=query)])
    top = scorer.score("default", query, top_k=1)[0]
    assert top.doc_id == "own"
    assert top.best_score == pytest.approx(1.0, abs=2e-3)


def test_ties_are_ordered_by_document_id_whatever_the_load_order(graph):
    encode = ToyEncoder()
    rng = np.random.default_rng(9)
    query = unit(rng)
    shared = unit(rng)
    articles = [
        Article(doc_id=f"t{i:02d}", entity_ids=("water-stress",), headline=shared)
        for i in range(12)
    ]
    orders = []
    for arrangement in (articles, articles[::-1]):
        scorer = KgScorer(graph, encode, top_n=3)
        scorer.upsert("default", arrangement)
        orders.append([s.doc_id for s in scorer.score("default", query, top_k=5)])
    assert orders[0] == orders[1] == [f"t{i:02d}" for i in range(5)]
