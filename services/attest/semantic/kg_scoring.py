"""Knowledge-graph path scoring of articles (ESG KG-RAG), vectorised.

A node's score for a question is the best cosine similarity between the
question and any of the node's attributes (its name and aliases; for an
article, its headline, and with the enhanced variant also its summary and
organizations). An article's traversed sub-graph is the article node plus
every node on every path from its linked entities up to the root; its score is
the best node score on that sub-graph plus the mean of the next ``top_n``.

Scoring one question is a handful of array operations, whatever the number of
articles:

1. node scores: one product of the question with every graph attribute,
   reduced to a max per node;
2. sub-graphs are interned: articles linked to the same entity set share one
   row of a padded node-index matrix, whose top ``top_n + 1`` scores are taken
   once per distinct sub-graph;
3. article scores: one product with every article attribute, reduced to a
   max per article, then merged with the row of its sub-graph.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import numpy as np
import numpy.typing as npt

from attest.knowledge.graph import KnowledgeGraph

Variant = Literal["kg", "kg_enhanced"]
Encode = Callable[[Sequence[str]], npt.NDArray[np.float32]]
Floats = npt.NDArray[np.float32]
Ints = npt.NDArray[np.int64]

_NEG = np.float32(-np.inf)


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
    organizations: tuple[str, ...] = ()
    entity_ids: tuple[str, ...] = ()
    published_from: datetime | None = None
    published_to: datetime | None = None


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
    organizations: list[tuple[str, ...]] = field(default_factory=list)
    published: list[float] = field(default_factory=list)
    # Inverted indexes for filters: lower-cased organization / entity id -> rows.
    org_rows: dict[str, set[int]] = field(default_factory=dict)
    entity_rows: dict[str, set[int]] = field(default_factory=dict)
    cache: tuple[Floats, Floats, Ints, Ints, Ints] | None = None

    def unindex(self, row: int) -> None:
        for org in self.organizations[row]:
            self.org_rows.get(org.casefold(), set()).discard(row)
        for entity in self.entity_ids[row]:
            self.entity_rows.get(entity, set()).discard(row)

    def reindex(self, row: int) -> None:
        for org in self.organizations[row]:
            self.org_rows.setdefault(org.casefold(), set()).add(row)
        for entity in self.entity_ids[row]:
            self.entity_rows.setdefault(entity, set()).add(row)

    def mask(self, flt: KgFilter) -> npt.NDArray[np.bool_]:
        n = len(self.doc_ids)
        keep = np.asarray(self.alive, dtype=bool)
        for values, index in (
            ({o.casefold() for o in flt.organizations}, self.org_rows),
            (set(flt.entity_ids), self.entity_rows),
        ):
            if values:
                hit = np.zeros(n, dtype=bool)
                rows = set().union(*(index.get(v, set()) for v in values))
                hit[list(rows)] = True
                keep &= hit
        if flt.published_from or flt.published_to:
            published = np.asarray(self.published, dtype=np.float64)
            with np.errstate(invalid="ignore"):
                if flt.published_from:
                    keep &= published >= flt.published_from.timestamp()
                if flt.published_to:
                    keep &= published <= flt.published_to.timestamp()
        return keep

    def arrays(self) -> tuple[Floats, Floats, Ints, Ints, Ints]:
        """(headlines, extra vectors, extra owners, signatures, alive rows), rebuilt lazily."""
        if self.cache is None:
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
            sig = np.asarray(self.signature, dtype=np.int64)
            alive = np.flatnonzero(np.asarray(self.alive, dtype=bool)).astype(np.int64)
            self.cache = (headlines, extra, owners, sig, alive)
        return self.cache


class KgScorer:
    def __init__(self, graph: KnowledgeGraph, encode: Encode, *, top_n: int = 3) -> None:
        self.graph = graph
        self.top_n = top_n
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
        self._attr_vectors = encode(attrs)
        self.dim = int(self._attr_vectors.shape[1])
        # Sub-graph interning: sorted tuple of node indices -> signature id.
        self._signatures: dict[tuple[int, ...], int] = {(): 0}
        self._signature_nodes: list[tuple[int, ...]] = [()]
        self._padded: Ints | None = None
        self._sizes: Ints | None = None
        self._tables: dict[str, _Table] = {}
        self._lock = threading.RLock()
        self._ancestors = {n: graph.ancestors(n) for n in self.node_ids}

    # -- graph side -------------------------------------------------------------

    def known(self, entity_id: str) -> bool:
        return entity_id in self._node_index

    def node_scores(self, query: Floats) -> tuple[Floats, Ints]:
        """(best cosine per node, index of the attribute that gave it)."""
        sims = self._attr_vectors @ query
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
            self._padded = None
        return sig

    def _signature_sizes(self) -> Ints:
        if self._sizes is None or len(self._sizes) != len(self._signature_nodes):
            self._sizes = np.fromiter((len(s) for s in self._signature_nodes), dtype=np.int64)
        return self._sizes

    def _padded_signatures(self) -> Ints:
        if self._padded is None:
            width = max(1, max(len(s) for s in self._signature_nodes))
            pad = np.full((len(self._signature_nodes), width), len(self.node_ids), np.int64)
            for i, nodes in enumerate(self._signature_nodes):
                pad[i, : len(nodes)] = nodes
            self._padded = pad
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
                values = (sig, a.headline.astype(np.float32), a.entity_ids, a.organizations)
                if row is None:
                    row = len(table.doc_ids)
                    table.row_of[a.doc_id] = row
                    table.doc_ids.append(a.doc_id)
                    table.alive.append(True)
                    table.signature.append(values[0])
                    table.headline.append(values[1])
                    table.entity_ids.append(values[2])
                    table.organizations.append(values[3])
                    table.published.append(published)
                else:
                    table.unindex(row)
                    table.alive[row] = True
                    table.signature[row] = values[0]
                    table.headline[row] = values[1]
                    table.entity_ids[row] = values[2]
                    table.organizations[row] = values[3]
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
            fresh.organizations.append(table.organizations[row])
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
            headlines, extra, owners, sig, alive = table.arrays()
            node_scores, _ = self.node_scores(query)
            padded = self._padded_signatures()
            ext = np.append(node_scores, _NEG)
            k = n_next + 1
            sig_scores = ext[padded]  # (signatures, width)
            if sig_scores.shape[1] < k:
                fill = np.full((sig_scores.shape[0], k - sig_scores.shape[1]), _NEG, np.float32)
                sig_scores = np.hstack([sig_scores, fill])
            # The k best node scores of each distinct sub-graph, best first.
            top_sig = -np.partition(-sig_scores, k - 1, axis=1)[:, :k]
            top_sig = -np.sort(-top_sig, axis=1)
            sig_sizes = np.minimum(self._signature_sizes(), k)

            article = headlines @ query
            if variant == "kg_enhanced" and len(extra):
                # Extras are grouped by owner row: one max per group.
                starts = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]])
                group_max = np.maximum.reduceat(extra @ query, starts)
                group_rows = owners[starts]
                article[group_rows] = np.maximum(article[group_rows], group_max)
            rows = alive if flt is None else np.flatnonzero(table.mask(flt)).astype(np.int64)
            if not len(rows):
                return []
            # Each article's k best scores are its sub-graph's k best with the
            # article's own score inserted: no per-article sort is needed.
            own = article[rows]
            top = top_sig[sig[rows]]  # (rows, k), best first, -inf padded
            sizes = sig_sizes[sig[rows]]  # real nodes among those k
            finite_top = np.where(np.isfinite(top), top, 0).astype(np.float32)
            sum_k = finite_top.sum(axis=1)
            # The k-th best node falls out when the article enters the top k.
            kth = finite_top[:, k - 1]
            full = sizes >= k
            sum_with_own = np.where(full, sum_k - kth, sum_k) + own
            enters = ~full | (own > top[:, k - 1])
            sum_top = np.where(enters, sum_with_own, sum_k)
            count = np.minimum(sizes + 1, k)
            best = np.maximum(own, top[:, 0])
            rest = count - 1
            next_mean = np.divide(sum_top - best, rest, out=np.zeros_like(sum_top), where=rest > 0)
            total = best + next_mean
            take = min(top_k, len(rows))
            order = np.argpartition(-total, take - 1)[:take]
            order = order[np.argsort(-total[order], kind="stable")]
            out = []
            for i in order:
                r = int(rows[i])
                a_score = float(article[r])
                nodes = self._signature_nodes[int(sig[r])]
                best_node = "article"
                if nodes:
                    top_node = max(nodes, key=lambda j: node_scores[j])
                    if node_scores[top_node] > a_score:
                        best_node = self.node_ids[top_node]
                out.append(
                    ArticleScore(
                        doc_id=table.doc_ids[r],
                        score=float(total[i]),
                        best_node=best_node,
                        best_score=float(best[i]),
                        next_mean=float(next_mean[i]),
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
            node_scores, best_attr = self.node_scores(query)
            candidates = [(float(table.headline[row] @ query), "article", "headline")]
            if variant == "kg_enhanced" and row in table.extras:
                extra = table.extras[row] @ query
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
