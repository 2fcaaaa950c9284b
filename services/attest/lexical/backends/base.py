"""The interface every lexical backend implements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from attest.lexical.models import (
    Counts,
    DocumentIn,
    DocumentPage,
    Hit,
    IndexResult,
    SearchQuery,
)


class LexicalBackend(Protocol):
    #: Short name reported to callers ("tantivy", "opensearch", "elasticsearch").
    name: str

    async def warm_up(self) -> None:
        """Connect and create the index if needed; raise if the backend is not ready."""

    async def index(
        self, tenant: str, documents: Sequence[DocumentIn], *, refresh: bool
    ) -> IndexResult:
        """Insert or replace documents and all their passages (idempotent)."""

    async def search(self, tenant: str, query: SearchQuery) -> list[Hit]:
        """Top hits of ``tenant``'s records for ``query``, best first."""

    async def delete(self, tenant: str, doc_ids: Sequence[str]) -> int:
        """Remove documents and their passages; returns how many existed."""

    async def stats(self, tenant: str) -> Counts:
        """Document and passage counts of ``tenant``."""

    async def list_documents(self, tenant: str, page_token: str, page_size: int) -> DocumentPage:
        """``tenant``'s document ids in id order after ``page_token`` (the last id of
        the previous page; "" for the first), each with its passage record count.
        The first page first makes every earlier write visible."""

    async def close(self) -> None:
        """Release connections and files."""
