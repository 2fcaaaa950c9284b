"""What the OpenSearch and Elasticsearch backends share.

Everything but the client calls and their error types lives here and in
``attest.lexical.query``; the two adapters implement the few primitives at the
bottom of ``EngineBackend``.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Sequence
from typing import Any

from attest.core.context import budget, remaining_seconds
from attest.core.errors import (
    AttestError,
    DeadlineExceeded,
    Internal,
    ResourceExhausted,
    Unavailable,
)
from attest.lexical import query as q
from attest.lexical.models import (
    Counts,
    DocumentIn,
    DocumentPage,
    Hit,
    IndexResult,
    Level,
    SearchQuery,
)
from attest.lexical.settings import LexicalSettings

log = logging.getLogger(__name__)


class EngineBackend(abc.ABC):
    name: str

    def __init__(self, settings: LexicalSettings, timeout_seconds: float) -> None:
        self._settings = settings
        self._names = q.index_names(settings.index_name)
        self._documents = self._names[Level.DOCUMENT]
        self._passages = self._names[Level.PASSAGE]
        self._timeout = timeout_seconds

    def _budget(self) -> float:
        return budget(self._timeout)

    def translate(self, exc: Exception, action: str) -> AttestError:
        """Map a client exception to a typed error (the client edge)."""
        if isinstance(exc, AttestError):
            return exc
        kind, status = self._classify(exc)
        where = f"{self.name} {action}"
        if kind == "timeout":
            left = remaining_seconds()
            if left is not None and left <= 0.05:
                return DeadlineExceeded(f"{where} did not finish before the deadline")
            return Unavailable(f"{where} timed out")
        if kind == "connection":
            return Unavailable(f"{where}: {self.name} is unreachable")
        if status == 429:
            return ResourceExhausted(f"{where}: {self.name} is overloaded; retry later")
        if status in (502, 503, 504):
            return Unavailable(f"{where}: {self.name} answered {status}")
        log.error("%s failed: %r", where, exc)
        return Internal(f"{where} failed with status {status}")

    # -- service operations ----------------------------------------------------

    async def warm_up(self) -> None:
        definition = q.index_definition(self._settings.number_of_shards)
        for name in self._names.values():
            try:
                if not await self._index_exists(name):
                    await self._create_index(name, definition)
                    log.info("created %s index %s", self.name, name)
                else:
                    # An index made before a keyword field was declared, or
                    # before passages kept their page, gains the field's mapping.
                    await self._put_mapping(name, q.added_mappings())
            except Exception as exc:
                if self._is_already_exists(exc):
                    continue
                raise self.translate(exc, "index creation") from exc

    async def _old_passage_counts(self, tenant: str, doc_ids: Sequence[str]) -> dict[str, int]:
        ids = [q.record_id(tenant, d) for d in doc_ids]
        response = await self._mget(self._documents, ids, ["doc_id", "passage_count"])
        counts = {}
        for doc in response["docs"]:
            if doc.get("found"):
                src = doc["_source"]
                counts[src["doc_id"]] = int(src.get("passage_count") or 0)
        return counts

    async def _run_bulk(self, actions: list[dict[str, Any]], refresh: bool) -> None:
        errors = await self._bulk(actions, refresh)
        real = [e for e in errors if not _is_missing_delete(e)]
        if real:
            log.error("%s bulk write had %d failed items, first: %s", self.name, len(real), real[0])
            statuses = {int(next(iter(e.values())).get("status", 500)) for e in real}
            if statuses & {429}:
                raise ResourceExhausted(f"{self.name} rejected {len(real)} writes; retry later")
            raise Internal(f"{self.name} rejected {len(real)} of {len(actions)} writes")

    async def index(
        self, tenant: str, documents: Sequence[DocumentIn], *, refresh: bool
    ) -> IndexResult:
        try:
            # The previous passage counts come from a real-time get, so passages a
            # document lost are deleted in the same bulk request, even if the
            # earlier version was never refreshed.
            old = await self._old_passage_counts(tenant, [d.id for d in documents])
            actions = list(q.bulk_actions(self._settings.index_name, tenant, documents, old))
            await self._run_bulk(actions, refresh)
        except Exception as exc:
            raise self.translate(exc, "index") from exc
        return IndexResult(
            documents=len(documents), passages=sum(len(d.passages) for d in documents)
        )

    async def delete(self, tenant: str, doc_ids: Sequence[str]) -> int:
        try:
            old = await self._old_passage_counts(tenant, doc_ids)
            actions: list[dict[str, Any]] = []
            for doc_id, count in old.items():
                rid = q.record_id(tenant, doc_id)
                actions.append({"_op_type": "delete", "_index": self._documents, "_id": rid})
                for rid in q.stale_passage_ids(tenant, doc_id, count, 0):
                    actions.append({"_op_type": "delete", "_index": self._passages, "_id": rid})
            if actions:
                await self._run_bulk(actions, refresh=True)
        except Exception as exc:
            raise self.translate(exc, "delete") from exc
        return len(old)

    async def search(self, tenant: str, query: SearchQuery) -> list[Hit]:
        try:
            response = await self._search(self._names[query.level], q.search_body(tenant, query))
        except Exception as exc:
            raise self.translate(exc, "search") from exc
        return q.hits_from_response(response)

    async def stats(self, tenant: str) -> Counts:
        try:
            docs = await self._count(self._documents, q.count_body(tenant))
            passages = await self._count(self._passages, q.count_body(tenant))
        except Exception as exc:
            raise self.translate(exc, "count") from exc
        return Counts(documents=docs, passages=passages)

    async def list_documents(self, tenant: str, page_token: str, page_size: int) -> DocumentPage:
        both = f"{self._documents},{self._passages}"
        try:
            if not page_token:
                # Writes show after the next refresh (about a second); without
                # this a document acknowledged a moment ago would look missing.
                await self._refresh(both)
            response = await self._search(both, q.list_body(tenant, page_token, page_size))
        except Exception as exc:
            raise self.translate(exc, "listing") from exc
        return q.documents_from_composite(response, page_size)

    # -- client primitives -----------------------------------------------------

    @abc.abstractmethod
    def _classify(self, exc: Exception) -> tuple[str, int | None]:
        """("timeout" | "connection" | "status", HTTP status or None)."""

    @abc.abstractmethod
    def _is_already_exists(self, exc: Exception) -> bool: ...

    @abc.abstractmethod
    async def _index_exists(self, index: str) -> bool: ...

    @abc.abstractmethod
    async def _create_index(self, index: str, definition: dict[str, Any]) -> None: ...

    @abc.abstractmethod
    async def _put_mapping(self, index: str, properties: dict[str, Any]) -> None: ...

    @abc.abstractmethod
    async def _mget(self, index: str, ids: list[str], fields: list[str]) -> dict[str, Any]: ...

    @abc.abstractmethod
    async def _search(self, index: str, body: dict[str, Any]) -> dict[str, Any]: ...

    @abc.abstractmethod
    async def _count(self, index: str, body: dict[str, Any]) -> int: ...

    async def _refresh(self, index: str) -> None:
        """Make earlier writes searchable (an engine that shows them at once needs nothing)."""
        return None

    @abc.abstractmethod
    async def _bulk(self, actions: list[dict[str, Any]], refresh: bool) -> list[dict[str, Any]]:
        """Run the actions; return the failed items."""

    @abc.abstractmethod
    async def close(self) -> None: ...


def _is_missing_delete(item: dict[str, Any]) -> bool:
    op, result = next(iter(item.items()))
    return op == "delete" and int(result.get("status", 0)) == 404
