"""Knowledge-graph path scoring of articles (ESG KG-RAG), vectorised.

A node's score for a question is the best cosine similarity between the
question and any of the node's attributes (its name and aliases; for an
article, its headline, and with the enhanced variant also its summary and
organizations). An article's traversed sub-graph is the article node plus
every node on every path from its linked entities up to the root; its score is
the best node score on that sub-graph plus the mean of the next ``top_n``.

Node specificity (``node_weighting="idf"``, the default): a graph node's
score (a negative cosine counted as 0) is multiplied by how specific it is
among the tenant's articles,
``log(1 + N / (1 + df)) / log(1 + N)`` for N articles of which df have the
node in their sub-graph, as IDF weighs a term. A topic that a third of the
corpus links to ("climate change", and the root every path reaches) says
little about which of those articles answers a question, yet its name is
similar to every question on the subject; unweighted, it lifts all of them
alike and buries the article's own evidence. The article's own attributes
are not weighted. ``node_weighting="none"`` is the method as published.

Scoring one question is a handful of tensor operations, whatever the number of
articles (article vectors are held at half precision: scores are for ranking,
agree with full precision to about 1e-3, and one pass over half the bytes is
what a question costs):

1. node scores: one product of the question with every graph attribute,
   reduced to a max per node;
2. sub-graphs are interned: articles linked to the same entity set share one
   row of a padded node-index matrix, whose best score, ``top_n + 1``-th best
   score and sum of the ``top_n + 1`` best are taken once per distinct
   sub-graph;
3. article scores: one product with every article attribute, reduced to a
   max per article, then merged with the row of its sub-graph.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from attest.core.document import BY_NAME, Keywords
from attest.knowledge.graph import KnowledgeGraph

if TYPE_CHECKING:
    import torch

Variant = Literal["kg", "kg_enhanced"]
Encode = Callable[[Sequence[str]], npt.NDArray[np.float32]]
Floats = npt.NDArray[np.float32]
Ints = npt.NDArray[np.int64]

_NEG = np.float32(-np.inf)


def _torch() -> Any:
    """torch, imported when the scorer warms up (``KgScorer.warm_up``, before the
    semantic service reports SERVING) rather than with this module: code that
    imports this module without scoring (the CLI, the other services) does not
    pay its 2-6 s of imports."""
    import torch

    return torch


@dataclass(frozen=True)
class Article:
    """What the scorer needs of an article (vectors are unit length)."""

    doc_id: str
    entity_ids: tuple[str, ...]
    headline: Floats
    summary: Floats | None = None
    organizations: tuple[str, ...] = ()
    organization_vectors: Floats | None = None  # (len(organizations), d)
    published_at: datetime | None = None
    # The document's keyword fields (attest.core.document) the filters restrict;
    # the organizations and entity ids above count among them when not given here.
    keywords: Keywords = field(default_factory=dict)

    def filter_keywords(self) -> Keywords:
        return {"organizations": self.organizations, "entity_ids": self.entity_ids, **self.keywords}


@dataclass(frozen=True)
class ArticleScore:
    doc_id: str
    score: float
    best_node: str  # entity id, or "article" when the article itself scored best
    best_score: float
    next_mean: float


@dataclass(frozen=True)
class NodeScore:
    node_id: str
    score: float
    best_attribute: str


@dataclass(frozen=True)
class KgFilter:
    # Keyword field name -> values, any of which an article must have.
    keywords: Keywords = field(default_factory=dict)
    published_from: datetime | None = None
    published_to: datetime | None = None
    # When not empty, the articles to score (by id); the others are left out.
    doc_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Arrays:
    """A table's attribute vectors at half precision (scores only rank, and half
    the bytes is half the memory traffic of the one pass over them per
    question), the owner row of each extra vector, each row's sub-graph id,
    and the rows not deleted."""

    vectors: torch.Tensor  # (rows + extras, d) float16: headlines, then extras by owner row
    extra_owner: torch.Tensor  # (extras,) int64
    signature: Ints  # (rows,)
    alive: Ints  # (alive rows,)
    specificity: Floats  # (nodes + 1,): weight of each graph node's score, 1 for the pad


@dataclass
class _Table:
    """Per-tenant article rows; rows are tombstoned on delete and reused on update."""

    dim: int
    doc_ids: list[str] = field(default_factory=list)
    row_of: dict[str, int] = field(default_factory=dict)
    alive: list[bool] = field(default_factory=list)
    signature: list[int] = field(default_factory=list)
    headline: list[Floats] = field(default_factory=list)
    # Extra attributes of the enhanced variant: (row, vector), summaries and organizations.
    extras: dict[int, Floats] = field(default_factory=dict)
    entity_ids: list[tuple[str, ...]] = field(default_factory=list)
    keywords: list[Keywords] = field(default_factory=list)
    published: list[float] = field(default_factory=list)
    # Inverted indexes for filters: keyword field -> value (folded for a
    # folded field) -> rows.
    rows: dict[str, dict[str, set[int]]] = field(default_factory=dict)
    cache: _Arrays | None = None

    def unindex(self, row: int) -> None:
        for name, values in self.keywords[row].items():
            index = self.rows.get(name, {})
            for value in values:
                index.get(BY_NAME[name].key(value), set()).discard(row)

    def reindex(self, row: int) -> None:
        for name, values in self.keywords[row].items():
            index = self.rows.setdefault(name, {})
            for value in values:
                index.setdefault(BY_NAME[name].key(value), set()).add(row)

    def mask(self, flt: KgFilter) -> npt.NDArray[np.bool_]:
        n = len(self.doc_ids)
        keep = np.asarray(self.alive, dtype=bool)
        for name, wanted in flt.keywords.items():
            if wanted:
                index = self.rows.get(name, {})
                hit = np.zeros(n, dtype=bool)
                rows = set().union(*(index.get(BY_NAME[name].key(v), set()) for v in wanted))
                hit[list(rows)] = True
                keep &= hit
        if flt.doc_ids:
            named = np.zeros(n, dtype=bool)
            named[[self.row_of[d] for d in flt.doc_ids if d in self.row_of]] = True
            keep &= named
        if flt.published_from or flt.published_to:
            published = np.asarray(self.published, dtype=np.float64)
            with np.errstate(invalid="ignore"):
                if flt.published_from:
                    keep &= published >= flt.published_from.timestamp()
                if flt.published_to:
                    keep &= published <= flt.published_to.timestamp()
        return keep

    def arrays(self, signature_nodes: Sequence[tuple[int, ...]], n_nodes: int) -> _Arrays:
        """The table as tensors for scoring, rebuilt lazily after a change."""
        if self.cache is None:
            torch = _torch()
            n = len(self.doc_ids)
            headlines = np.vstack(self.headline) if n else np.zeros((0, self.dim), np.float32)
            rows = sorted(self.extras)
            extra = (
                np.vstack([self.extras[r] for r in rows])
                if rows
                else np.zeros((0, self.dim), np.float32)
            )
            owners = (
                np.concatenate([np.full(len(self.extras[r]), r, dtype=np.int64) for r in rows])
                if rows
                else np.zeros(0, np.int64)
            )
            signature = np.asarray(self.signature, dtype=np.int64)
            alive = np.flatnonzero(np.asarray(self.alive, dtype=bool))
            self.cache = _Arrays(
                vectors=torch.from_numpy(np.vstack([headlines, extra])).to(torch.float16),
                extra_owner=torch.from_numpy(owners),
                signature=signature,
                alive=alive,
                specificity=_specificity(signature[alive], signature_nodes, n_nodes),
            )
        return self.cache


def _specificity(
    signatures: Ints, signature_nodes: Sequence[tuple[int, ...]], n_nodes: int
) -> Floats:
    """``log(1 + N / (1 + df)) / log(1 + N)`` per node (see the module docstring)."""
    n = len(signatures)
    df = np.zeros(n_nodes + 1, dtype=np.float64)
    if n:
        per_signature = np.bincount(signatures, minlength=len(signature_nodes))
        for sig in np.flatnonzero(per_signature):
            nodes = signature_nodes[int(sig)]
            if nodes:
                df[list(nodes)] += per_signature[sig]
    spec = np.log1p(n / (1.0 + df)) / np.log1p(max(n, 1))
    spec[n_nodes] = 1.0
    out: Floats = np.minimum(spec, 1.0).astype(np.float32)
    return out


NodeWeighting = Literal["idf", "none"]


class KgScorer:
    def __init__(
        self,
        graph: KnowledgeGraph,
        encode: Encode,
        *,
        top_n: int = 3,
        node_weighting: NodeWeighting = "idf",
    ) -> None:
        self.graph = graph
        self.top_n = top_n
        self.node_weighting = node_weighting
        self._encode = encode
        self.node_ids = sorted(graph.entities)
        self._node_index = {n: i for i, n in enumerate(self.node_ids)}
        attrs: list[str] = []
        owners: list[int] = []
        for i, node in enumerate(self.node_ids):
            for text in dict.fromkeys(graph.attributes(node)):
                attrs.append(text)
                owners.append(i)
        self._attr_texts = attrs
        self._attr_owner = np.asarray(owners, dtype=np.int64)
        # Shared with the entity linker and kept on disk when the model can be told apart.
        self._attr_vectors = graph.attribute_vectors(attrs, encode)
        # A torch view of the vectors, made at the first node_scores.
        self._attr_tensor: torch.Tensor | None = None
        self.dim = int(self._attr_vectors.shape[1])
        # Sub-graph interning: sorted tuple of node indices -> signature id.
        self._signatures: dict[tuple[int, ...], int] = {(): 0}
        self._signature_nodes: list[tuple[int, ...]] = [()]
        # The linked entities that generated each sub-graph (the best score of
        # a sub-graph is the best over those entities of their ancestors' best).
        self._signature_heads: list[tuple[int, ...]] = [()]
        self._padded: tuple[Ints, Ints, Ints] | None = None
        self._tables: dict[str, _Table] = {}
        self._lock = threading.RLock()
        self._ancestors = {n: graph.ancestors(n) for n in self.node_ids}
        width = max(len(a) for a in self._ancestors.values())
        self._padded_ancestors = np.full((len(self.node_ids), width), len(self.node_ids), np.int64)
        for n, ancestors in self._ancestors.items():
            self._padded_ancestors[self._node_index[n], : len(ancestors)] = [
                self._node_index[a] for a in ancestors
            ]

    def warm_up(self) -> None:
        """Everything the first query would otherwise build: torch (2-6 s of
        imports), the graph's attribute tensor, the padded sub-graphs, and each
        tenant's article tensors, with one scoring per tenant so that torch's
        first products are paid here too. A service calls this before it
        reports SERVING; a write afterwards rebuilds only its tenant's tensors."""
        _torch()
        query = np.ascontiguousarray(self._attr_vectors[0], dtype=np.float32)
        self.node_scores(query)
        with self._lock:
            self._padded_signatures()
            tenants = [t for t, table in self._tables.items() if table.row_of]
        for tenant in tenants:
            self.score(tenant, query, top_k=1)

    @property
    def warm(self) -> bool:
        """Whether the graph's tensors and every tenant's article tensors are built."""
        with self._lock:
            return (
                self._attr_tensor is not None
                and self._padded is not None
                and all(t.cache is not None for t in self._tables.values() if t.row_of)
            )

    # -- graph side -------------------------------------------------------------

    def known(self, entity_id: str) -> bool:
        return entity_id in self._node_index

    def node_scores(self, query: Floats) -> tuple[Floats, Ints]:
        """(best cosine per node, index of the attribute that gave it)."""
        torch = _torch()
        if self._attr_tensor is None:
            self._attr_tensor = torch.from_numpy(
                np.ascontiguousarray(self._attr_vectors, dtype=np.float32)
            )
        sims = (
            self._attr_tensor @ torch.from_numpy(np.ascontiguousarray(query, dtype=np.float32))
        ).numpy()
        order = np.lexsort((-sims, self._attr_owner))
        owners = self._attr_owner[order]
        first = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])
        best_attr = order[first]
        return sims[best_attr].astype(np.float32), best_attr.astype(np.int64)

    def _signature(self, entity_ids: Sequence[str]) -> int:
        nodes: set[int] = set()
        for e in entity_ids:
            nodes.update(self._node_index[a] for a in self._ancestors[e])
        key = tuple(sorted(nodes))
        sig = self._signatures.get(key)
        if sig is None:
            sig = len(self._signature_nodes)
            self._signatures[key] = sig
            self._signature_nodes.append(key)
            self._signature_heads.append(tuple({self._node_index[e]: None for e in entity_ids}))
            self._padded = None
        return sig

    def _padded_signatures(self) -> tuple[Ints, Ints, Ints]:
        """(node indices of each sub-graph, number of its nodes, the entities
        that generated it, transposed), index lists padded with an index past
        the last node."""
        if self._padded is None:
            pad_id = len(self.node_ids)

            def padded(lists: list[tuple[int, ...]]) -> Ints:
                width = max(1, max(len(x) for x in lists))
                out = np.full((len(lists), width), pad_id, np.int64)
                for i, items in enumerate(lists):
                    out[i, : len(items)] = items
                return out

            sizes = np.fromiter((len(n) for n in self._signature_nodes), dtype=np.int64)
            # Heads transposed: a max over the first axis is one vector
            # operation per column instead of one small reduction per row.
            self._padded = (
                padded(self._signature_nodes),
                sizes,
                np.ascontiguousarray(padded(self._signature_heads).T),
            )
        return self._padded

    # -- articles ---------------------------------------------------------------

    def upsert(self, tenant: str, articles: Sequence[Article]) -> None:
        with self._lock:
            table = self._tables.setdefault(tenant, _Table(dim=self.dim))
            for a in articles:
                unknown = [e for e in a.entity_ids if e not in self._node_index]
                if unknown:
                    raise KeyError(f"unknown entity ids {unknown[:3]}")
                row = table.row_of.get(a.doc_id)
                sig = self._signature(a.entity_ids)
                extra = [v for v in (a.summary,) if v is not None]
                if a.organization_vectors is not None and len(a.organization_vectors):
                    extra.extend(list(a.organization_vectors))
                published = a.published_at.timestamp() if a.published_at else float("nan")
                values = (sig, a.headline.astype(np.float32), a.entity_ids, a.filter_keywords())
                if row is None:
                    row = len(table.doc_ids)
                    table.row_of[a.doc_id] = row
                    table.doc_ids.append(a.doc_id)
                    table.alive.append(True)
                    table.signature.append(values[0])
                    table.headline.append(values[1])
                    table.entity_ids.append(values[2])
                    table.keywords.append(values[3])
                    table.published.append(published)
                else:
                    table.unindex(row)
                    table.alive[row] = True
                    table.signature[row] = values[0]
                    table.headline[row] = values[1]
                    table.entity_ids[row] = values[2]
                    table.keywords[row] = values[3]
                    table.published[row] = published
                table.reindex(row)
                if extra:
                    table.extras[row] = np.vstack(extra).astype(np.float32)
                else:
                    table.extras.pop(row, None)
            table.cache = None

    def delete(self, tenant: str, doc_ids: Sequence[str]) -> None:
        with self._lock:
            table = self._tables.get(tenant)
            if table is None:
                return
            for doc_id in doc_ids:
                row = table.row_of.pop(doc_id, None)
                if row is not None:
                    table.unindex(row)
                    table.alive[row] = False
                    table.extras.pop(row, None)
            table.cache = None
            dead = len(table.alive) - sum(table.alive)
            if dead > 1024 and dead * 4 > len(table.alive):
                self._compact(tenant, table)

    def _compact(self, tenant: str, table: _Table) -> None:
        fresh = _Table(dim=self.dim)
        for row, doc_id in enumerate(table.doc_ids):
            if not table.alive[row]:
                continue
            new = len(fresh.doc_ids)
            fresh.row_of[doc_id] = new
            fresh.doc_ids.append(doc_id)
            fresh.alive.append(True)
            fresh.signature.append(table.signature[row])
            fresh.headline.append(table.headline[row])
            fresh.entity_ids.append(table.entity_ids[row])
            fresh.keywords.append(table.keywords[row])
            fresh.published.append(table.published[row])
            if row in table.extras:
                fresh.extras[new] = table.extras[row]
            fresh.reindex(new)
        self._tables[tenant] = fresh

    def count(self, tenant: str) -> tuple[int, int]:
        """(articles, links to graph entities) of ``tenant``."""
        with self._lock:
            table = self._tables.get(tenant)
            if table is None:
                return 0, 0
            rows = [r for r in table.row_of.values()]
            return len(rows), sum(len(table.entity_ids[r]) for r in rows)

    # -- scoring ----------------------------------------------------------------

    def _arrays(self, table: _Table) -> _Arrays:
        return table.arrays(self._signature_nodes, len(self.node_ids))

    def _weighted(self, node_scores: Floats, arrays: _Arrays) -> Floats:
        if self.node_weighting == "none":
            return node_scores
        # A dissimilar node (negative cosine) scores 0, so weighting never lifts it.
        weighted: Floats = (np.maximum(node_scores, 0) * arrays.specificity[:-1]).astype(np.float32)
        return weighted

    @staticmethod
    def _exact(
        ext: Floats, padded: Ints, sizes_all: Ints, sigs: Ints, own: Floats, k: int
    ) -> tuple[Floats, Floats, Floats]:
        """(total, best, mean of the next k - 1) for articles with sub-graphs
        ``sigs`` and own scores ``own``: each article's k best scores are its
        sub-graph's k best with its own score inserted, so no per-article sort
        is needed, only the sub-graph's best, k-th best and sum of the k best."""
        sig_scores = ext[padded[sigs]]  # (articles, width), -inf padded
        width = sig_scores.shape[1]
        top = (
            np.partition(sig_scores, width - k, axis=1)[:, width - k :] if width > k else sig_scores
        )
        sig_best = top.max(axis=1)
        kth = top.min(axis=1) if width >= k else np.full(len(top), _NEG, np.float32)
        sum_k = np.where(np.isfinite(top), top, 0).sum(axis=1, dtype=np.float32)
        sizes = np.minimum(sizes_all[sigs], k)  # real nodes among the sub-graph's k best
        full = sizes >= k
        # The k-th best node falls out when the article enters the top k.
        sum_with_own = np.where(full, sum_k - np.where(full, kth, 0), sum_k) + own
        enters = ~full | (own > kth)
        sum_top = np.where(enters, sum_with_own, sum_k)
        best = np.maximum(own, sig_best)
        rest = np.minimum(sizes + 1, k) - 1
        next_mean = np.divide(sum_top - best, rest, out=np.zeros_like(sum_top), where=rest > 0)
        return best + next_mean, best, next_mean

    def score(
        self,
        tenant: str,
        query: Floats,
        *,
        variant: Variant = "kg_enhanced",
        top_k: int = 10,
        top_n: int | None = None,
        flt: KgFilter | None = None,
    ) -> list[ArticleScore]:
        """The ``top_k`` articles of ``tenant`` by KG score, best first."""
        n_next = self.top_n if top_n is None else top_n
        with self._lock:
            table = self._tables.get(tenant)
            if table is None or not table.row_of:
                return []
            arrays = self._arrays(table)
            node_scores = self._weighted(self.node_scores(query)[0], arrays)
            padded, sizes_all, heads = self._padded_signatures()
            ext = np.append(node_scores, _NEG)
            # Best score per sub-graph, through its generating entities.
            ancestors_best = np.append(ext[self._padded_ancestors].max(axis=1), _NEG)
            sig_best = ancestors_best[heads].max(axis=0)
            torch = _torch()
            q16 = torch.from_numpy(np.ascontiguousarray(query, dtype=np.float32)).to(torch.float16)
            n_rows = len(table.doc_ids)
            if variant == "kg_enhanced" and len(arrays.vectors) > n_rows:
                every = (arrays.vectors @ q16).float()
                scores = every[:n_rows].clone()
                scores.scatter_reduce_(0, arrays.extra_owner, every[n_rows:], reduce="amax")
            else:
                scores = (arrays.vectors[:n_rows] @ q16).float()
            article = scores.numpy()
            rows = arrays.alive if flt is None else np.flatnonzero(table.mask(flt))
            if not len(rows):
                return []
            take = min(top_k, len(rows))
            sig_rows = arrays.signature[rows]
            own = article[rows]
            # A bound first: the next-best scores are at most the best, so an
            # article scores at most best + max(best, 0). Exact scores are
            # computed for the articles with the highest bounds, then for any
            # other whose bound reaches the take-th exact score: the result is
            # exact, and on a large corpus few articles get past the bound.
            best = np.maximum(own, sig_best[sig_rows])
            bound = best + np.maximum(best, 0)
            first = min(len(rows), max(4 * take, 512))
            picked = np.argpartition(-bound, first - 1)[:first]
            total, best_p, next_p = self._exact(
                ext, padded, sizes_all, sig_rows[picked], own[picked], n_next + 1
            )
            cut = np.partition(total, len(total) - take)[len(total) - take]
            reach = bound >= cut
            reach[picked] = False
            more = np.flatnonzero(reach)
            if len(more):
                t2, b2, n2 = self._exact(
                    ext, padded, sizes_all, sig_rows[more], own[more], n_next + 1
                )
                picked = np.concatenate([picked, more])
                total = np.concatenate([total, t2])
                best_p = np.concatenate([best_p, b2])
                next_p = np.concatenate([next_p, n2])
            # Ties are broken by document id, so the order does not depend on the
            # order rows were loaded in (a fresh index and a reloaded one agree).
            kth = np.partition(total, len(total) - take)[len(total) - take]
            tied = np.flatnonzero(total >= kth)
            names = [table.doc_ids[int(rows[picked[i]])] for i in tied]
            keep = sorted(range(len(tied)), key=lambda i: (-float(total[tied[i]]), names[i]))
            top = tied[keep[:take]]
            out = []
            for pos in top.tolist():
                r = int(rows[picked[pos]])
                a_score = float(article[r])
                nodes = self._signature_nodes[int(arrays.signature[r])]
                best_node = "article"
                if nodes:
                    top_node = max(nodes, key=lambda j: node_scores[j])
                    if node_scores[top_node] > a_score:
                        best_node = self.node_ids[top_node]
                out.append(
                    ArticleScore(
                        doc_id=table.doc_ids[r],
                        score=float(total[pos]),
                        best_node=best_node,
                        best_score=float(best_p[pos]),
                        next_mean=float(next_p[pos]),
                    )
                )
            return out

    def explain(
        self,
        tenant: str,
        doc_id: str,
        query: Floats,
        *,
        variant: Variant = "kg_enhanced",
        top_n: int | None = None,
    ) -> tuple[ArticleScore, list[NodeScore], list[list[NodeScore]]] | None:
        """The score of one article, the nodes that made it, and its paths to the root."""
        n_next = self.top_n if top_n is None else top_n
        with self._lock:
            table = self._tables.get(tenant)
            row = None if table is None else table.row_of.get(doc_id)
            if table is None or row is None:
                return None
            arrays = self._arrays(table)
            raw_scores, best_attr = self.node_scores(query)
            node_scores = self._weighted(raw_scores, arrays)
            # The same half-precision vectors as ``score``, so the two agree.
            torch = _torch()
            q16 = torch.from_numpy(np.ascontiguousarray(query, dtype=np.float32)).to(torch.float16)
            own = float((arrays.vectors[row : row + 1] @ q16).float()[0])
            candidates = [(own, "article", "headline")]
            if variant == "kg_enhanced" and row in table.extras:
                extra = (
                    (torch.from_numpy(table.extras[row]).to(torch.float16) @ q16).float().numpy()
                )
                j = int(np.argmax(extra))
                candidates.append((float(extra[j]), "article", "summary/organization"))
            article_best = max(candidates)
            nodes = self._signature_nodes[table.signature[row]]
            scored = [
                NodeScore(
                    self.node_ids[j], float(node_scores[j]), self._attr_texts[int(best_attr[j])]
                )
                for j in nodes
            ]
            scored.append(NodeScore("article", article_best[0], article_best[2]))
            scored.sort(key=lambda s: -s.score)
            top = scored[: n_next + 1]
            rest = top[1:]
            next_mean = sum(s.score for s in rest) / len(rest) if rest else 0.0
            result = ArticleScore(
                doc_id=doc_id,
                score=top[0].score + next_mean,
                best_node=top[0].node_id,
                best_score=top[0].score,
                next_mean=next_mean,
            )
            by_id = {s.node_id: s for s in scored}
            paths = []
            for entity in table.entity_ids[row]:
                for path in self.graph.paths_to_root(entity):
                    paths.append([by_id["article"], *(by_id[n] for n in path)])
            return result, top, paths
