"""BM25 on OpenSearch 2/3 through ``opensearch-py``'s asyncio client."""

from __future__ import annotations

from typing import Any

import opensearchpy
from opensearchpy import AsyncOpenSearch
from opensearchpy.helpers import async_bulk

from attest.lexical.backends.engine import EngineBackend
from attest.lexical.settings import LexicalSettings


class OpenSearchBackend(EngineBackend):
    name = "opensearch"

    def __init__(self, settings: LexicalSettings) -> None:
        super().__init__(settings, settings.opensearch.timeout_seconds)
        cfg = settings.opensearch
        auth = None
        if cfg.username and cfg.password:
            auth = (cfg.username, cfg.password.get_secret_value())
        # Retries are the caller's business (gRPC retry policy); here one
        # attempt keeps failures inside the request's deadline.
        self._client = AsyncOpenSearch(
            hosts=list(cfg.hosts),
            http_auth=auth,
            verify_certs=cfg.verify_certs,
            max_retries=0,
            retry_on_timeout=False,
            timeout=cfg.timeout_seconds,
            pool_maxsize=cfg.pool_size,
        )

    def _classify(self, exc: Exception) -> tuple[str, int | None]:
        if isinstance(exc, opensearchpy.ConnectionTimeout):
            return "timeout", None
        if isinstance(exc, opensearchpy.ConnectionError):
            return "connection", None
        if isinstance(exc, opensearchpy.TransportError) and isinstance(exc.status_code, int):
            return "status", exc.status_code
        if isinstance(exc, TimeoutError):
            return "timeout", None
        return "status", None

    def _is_already_exists(self, exc: Exception) -> bool:
        return isinstance(exc, opensearchpy.RequestError) and "already_exists" in str(exc.error)

    async def _index_exists(self, index: str) -> bool:
        return bool(await self._client.indices.exists(index=index, request_timeout=self._budget()))

    async def _create_index(self, index: str, definition: dict[str, Any]) -> None:
        await self._client.indices.create(
            index=index, body=definition, request_timeout=self._budget()
        )

    async def _put_mapping(self, index: str, properties: dict[str, Any]) -> None:
        await self._client.indices.put_mapping(
            index=index, body={"properties": properties}, request_timeout=self._budget()
        )

    async def _mget(self, index: str, ids: list[str], fields: list[str]) -> dict[str, Any]:
        result: dict[str, Any] = await self._client.mget(
            index=index,
            body={"ids": ids},
            _source_includes=fields,
            request_timeout=self._budget(),
        )
        return result

    async def _search(self, index: str, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._client.search(
            index=index, body=body, request_timeout=self._budget()
        )
        return result

    async def _count(self, index: str, body: dict[str, Any]) -> int:
        result = await self._client.count(index=index, body=body, request_timeout=self._budget())
        return int(result["count"])

    async def _refresh(self, index: str) -> None:
        await self._client.indices.refresh(index=index, request_timeout=self._budget())

    async def _bulk(self, actions: list[dict[str, Any]], refresh: bool) -> list[dict[str, Any]]:
        _, errors = await async_bulk(
            self._client,
            actions,
            raise_on_error=False,
            raise_on_exception=True,
            refresh="wait_for" if refresh else "false",
            request_timeout=self._budget(),
        )
        return list(errors) if isinstance(errors, list) else []

    async def close(self) -> None:
        await self._client.close()
