"""Every service in one process on embedded backends (the demo, laptops, tests).

The services reach each other through the one server at ``address``, exactly
as separate deployments would: ingest writes through the lexical and semantic
services (one tantivy writer, one vector store), generate re-searches through
them, and the answer service calls all four.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import AsyncIterator, Iterator
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


def embedded_servicers(data_dir: Path, address: str, *, knowledge: bool = False) -> list[Servicer]:
    """All services, wired to each other at ``address``, with state under ``data_dir``.

    With ``knowledge`` the knowledge service runs too (its personal base under
    ``data_dir``) and answers use it as a retriever; ingestion sends it facts
    only where ATTEST_INGEST_KNOWLEDGE_ADDRESS names it (``embedded_stack``
    sets it).
    """
    servicers: list[Servicer] = [
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
                knowledge_address=address if knowledge else None,
            )
        ),
    ]
    if knowledge:
        from attest.knowledge.servicer import KnowledgeServicer
        from attest.knowledge.settings import KnowledgeSettings

        servicers.append(KnowledgeServicer(KnowledgeSettings(data_dir=data_dir)))
    return servicers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def embedded_stack(
    data_dir: Path, *, ready_timeout: float = 600, knowledge: bool = False
) -> AsyncIterator[str]:
    """Every service on one local server on a free port; yields its address.

    With ``knowledge`` the knowledge service runs too, ingestion extracts facts
    into its personal base and answers retrieve them (see ``embedded_servicers``).
    """
    from attest.core.process_lock import data_dir_lock
    from attest.core.server import running
    from attest.core.settings import ServerSettings

    port = free_port()
    address = f"127.0.0.1:{port}"
    settings = ServerSettings(host="127.0.0.1", port=port)
    with contextlib.ExitStack() as env:
        # Refused at once (LockHeld) while another process has the directory's stores.
        env.enter_context(data_dir_lock(data_dir))
        if knowledge:
            env.enter_context(_environment(FACTS_ADDRESS_VARIABLE, address))
        async with running(
            embedded_servicers(data_dir, address, knowledge=knowledge),
            settings,
            ready_timeout=ready_timeout,
        ):
            yield address


# Where ingestion sends the facts it extracts (attest.ingest.knowledge).
FACTS_ADDRESS_VARIABLE = "ATTEST_INGEST_KNOWLEDGE_ADDRESS"


@contextlib.contextmanager
def _environment(name: str, value: str) -> Iterator[None]:
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
