"""``attest demo``: index the bundled sample news and find the sources of answers.

Everything runs in this process on embedded backends (tantivy under the data
directory); the calls go through the same gRPC API a deployment serves.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from attest.answer.fusion import Ranked, reciprocal_rank_fusion
from attest.common.v1 import common_pb2
from attest.core.channels import create_channel
from attest.core.server import Servicer, running
from attest.core.settings import ServerSettings
from attest.lexical.servicer import LexicalServicer
from attest.lexical.settings import LexicalSettings
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc
from attest.semantic.servicer import SemanticServicer
from attest.semantic.settings import SemanticSettings
from attest.semantic.v1 import semantic_pb2, semantic_pb2_grpc


def _read_jsonl(name: str) -> list[dict[str, Any]]:
    text = resources.files("attest.demo").joinpath(name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def sample_documents() -> list[common_pb2.Document]:
    docs = []
    for raw in _read_jsonl("sample_corpus.jsonl"):
        published = Timestamp()
        published.FromDatetime(datetime.fromisoformat(raw["published_at"]).replace(tzinfo=UTC))
        docs.append(
            common_pb2.Document(
                id=raw["id"],
                title=raw["title"],
                body=raw["body"],
                published_at=published,
                source_url=raw["source_url"],
                organizations=raw["organizations"],
            )
        )
    return docs


def sample_questions() -> list[dict[str, Any]]:
    return _read_jsonl("questions.jsonl")


def _plain(fragment: str) -> str:
    """Show <em> highlights as *bold* in a terminal."""
    return re.sub(r"</?em>", "*", " ".join(fragment.split()))


def _best_path(explained: semantic_pb2.ExplainResponse) -> str:
    """The highest-scoring path of an explanation, as ``name (score) → …``."""
    if not explained.paths:
        return "not linked to the knowledge graph"
    best = max(explained.paths, key=lambda p: sum(n.score for n in p.nodes) / len(p.nodes))
    return " → ".join(f"{n.name} ({n.score:.2f})" for n in best.nodes)


async def run_demo(data_dir: Path, *, top_k: int, echo: Callable[[str], None]) -> None:
    """Index the sample into BM25 and the semantic index, then answer with sources.

    Every question is searched with BM25 and with dense + knowledge-graph
    scores; the lists are fused by reciprocal rank, and the knowledge-graph
    path of the top source is shown.
    """
    lexical_settings = LexicalSettings(data_dir=data_dir, index_name="attest-demo")
    semantic_settings = SemanticSettings(data_dir=data_dir, collection_prefix="attest-demo")
    servicers: list[Servicer] = [
        LexicalServicer(lexical_settings),
        SemanticServicer(semantic_settings),
    ]
    server_settings = ServerSettings(host="127.0.0.1", port=0)
    echo("Loading the embedding model and the ESG knowledge graph …")
    async with running(servicers, server_settings, ready_timeout=600) as server:
        channel = create_channel(f"127.0.0.1:{server.port}")
        lexical = lexical_pb2_grpc.LexicalServiceStub(channel)
        semantic = semantic_pb2_grpc.SemanticServiceStub(channel)
        try:
            docs = sample_documents()
            await asyncio.to_thread(link_documents, docs)
            indexed = await lexical.Index(
                lexical_pb2.IndexRequest(documents=docs, refresh=True), timeout=120
            )
            linked = await semantic.Index(
                semantic_pb2.IndexRequest(
                    documents=[semantic_pb2.IndexDocument(document=d) for d in docs]
                ),
                timeout=600,
            )
            echo(
                f"Indexed {indexed.documents} sample ESG news articles under {data_dir}: "
                f"BM25 (tantivy), vectors (Qdrant engine) and {linked.kg_links} links to "
                "the knowledge graph and organizations."
            )
            for q in sample_questions():
                text = q["question"]
                bm25, fused = await asyncio.gather(
                    lexical.Search(lexical_pb2.SearchRequest(query=text, top_k=10, highlight=True)),
                    semantic.Search(
                        semantic_pb2.SearchRequest(
                            query=text, top_k=10, mode=semantic_pb2.SEARCH_MODE_FUSED
                        )
                    ),
                )
                ranked = reciprocal_rank_fusion(
                    [
                        Ranked("bm25", [(h.doc_id, h.score) for h in bm25.hits]),
                        Ranked("semantic", [(h.doc_id, h.score) for h in fused.hits]),
                    ],
                    top_k=top_k,
                )
                titles = {h.doc_id: h.title for h in fused.hits} | {
                    h.doc_id: h.title for h in bm25.hits
                }
                highlights = {h.doc_id: list(h.highlights) for h in bm25.hits}
                echo("")
                echo(f"Q: {text}")
                if not ranked:
                    echo("   no matching source")
                    continue
                for rank, (doc_id, _) in enumerate(ranked, 1):
                    echo(f"  [{rank}] {doc_id}  {titles[str(doc_id)]}")
                    for fragment in highlights.get(str(doc_id), [])[1:2]:
                        echo(f"      … {_plain(fragment)} …")
                explained = await semantic.Explain(
                    semantic_pb2.ExplainRequest(query=text, doc_id=str(ranked[0][0]))
                )
                echo(f"      knowledge graph: {_best_path(explained)}")
        finally:
            await channel.close()


def link_documents(docs: list[common_pb2.Document]) -> None:
    """Attach knowledge-graph entity ids to the documents, as ingestion does."""
    from attest.knowledge.graph import load_graph
    from attest.knowledge.linking import EntityLinker
    from attest.semantic.embedding import Embedder

    linker = EntityLinker(load_graph(), Embedder().encode)
    for doc, links in zip(docs, linker.link_many([(d.title, d.body) for d in docs]), strict=True):
        doc.entity_ids[:] = [link.entity_id for link in links]
