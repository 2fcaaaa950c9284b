"""Every service in one process on embedded backends (the demo, laptops, tests).

The services reach each other through the one server at ``address``, exactly
as separate deployments would: ingest writes through the lexical and semantic
services (one tantivy writer, one vector store), generate re-searches through
them, and the answer service calls all four.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

from attest.answer.servicer import AnswerServicer
from attest.answer.settings import AnswerSettings
from attest.core.server import Servicer
from attest.generate.servicer import GenerateServicer
from attest.generate.settings import GenerateSettings, ResearchSettings
from attest.ingest.servicer import IngestServicer
from attest.ingest.settings import IngestSettings
from attest.lexical.servicer import LexicalServicer
from attest.lexical.settings import LexicalSettings
from attest.rerank.servicer import RerankServicer
from attest.rerank.settings import RerankSettings
from attest.semantic.servicer import SemanticServicer
from attest.semantic.settings import SemanticSettings


def embedded_servicers(data_dir: Path, address: str) -> list[Servicer]:
    """All services, wired to each other at ``address``, with state under ``data_dir``."""
    return [
        LexicalServicer(LexicalSettings(data_dir=data_dir, backend="tantivy")),
        SemanticServicer(SemanticSettings(data_dir=data_dir, store="edge")),
        RerankServicer(RerankSettings(device="cpu")),
        GenerateServicer(
            GenerateSettings(
                research=ResearchSettings(lexical_address=address, semantic_address=address)
            )
        ),
        IngestServicer(
            IngestSettings(
                data_dir=data_dir,
                mode="inline",
                lexical_address=address,
                semantic_address=address,
            )
        ),
        AnswerServicer(
            AnswerSettings(
                lexical_address=address,
                semantic_address=address,
                rerank_address=address,
                generate_address=address,
            )
        ),
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def embedded_stack(data_dir: Path, *, ready_timeout: float = 600) -> AsyncIterator[str]:
    """Every service on one local server on a free port; yields its address."""
    from attest.core.server import running
    from attest.core.settings import ServerSettings

    port = free_port()
    address = f"127.0.0.1:{port}"
    settings = ServerSettings(host="127.0.0.1", port=port)
    async with running(
        embedded_servicers(data_dir, address), settings, ready_timeout=ready_timeout
    ):
        yield address
