"""``attest demo``: index the bundled sample news and search it through gRPC.

Everything runs in this process on embedded backends (tantivy under the data
directory); the calls go through the same gRPC API a deployment serves.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from attest.common.v1 import common_pb2
from attest.core.channels import create_channel
from attest.core.server import running
from attest.core.settings import ServerSettings
from attest.lexical.servicer import LexicalServicer
from attest.lexical.settings import LexicalSettings
from attest.lexical.v1 import lexical_pb2, lexical_pb2_grpc


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


async def run_demo(data_dir: Path, *, top_k: int, echo: Callable[[str], None]) -> None:
    settings = LexicalSettings(
        data_dir=data_dir,
        index_name="attest-demo",
        server=ServerSettings(host="127.0.0.1", port=0),
    )
    async with running([LexicalServicer(settings)], settings.server) as server:
        channel = create_channel(f"127.0.0.1:{server.port}")
        stub = lexical_pb2_grpc.LexicalServiceStub(channel)
        try:
            docs = sample_documents()
            indexed = await stub.Index(lexical_pb2.IndexRequest(documents=docs, refresh=True))
            stats = await stub.Stats(lexical_pb2.StatsRequest())
            echo(
                f"Indexed {indexed.documents} sample ESG news articles into {stats.backend} "
                f"under {data_dir} ({stats.documents} documents in the index)."
            )
            for q in sample_questions():
                response = await stub.Search(
                    lexical_pb2.SearchRequest(query=q["question"], top_k=top_k, highlight=True)
                )
                echo("")
                echo(f"Q: {q['question']}")
                if not response.hits:
                    echo("   no matching source")
                for rank, hit in enumerate(response.hits, 1):
                    echo(f"  [{rank}] {hit.doc_id}  {hit.title}  (BM25 {hit.score:.2f})")
                    for fragment in hit.highlights[:2]:
                        echo(f"      … {_plain(fragment)} …")
        finally:
            await channel.close()
