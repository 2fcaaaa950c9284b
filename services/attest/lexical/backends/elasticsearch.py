"""BM25 on Elasticsearch 8/9 through the ``elasticsearch`` asyncio client.

A thin adapter: the mapping, records and queries are the ones the OpenSearch
backend uses (``attest.lexical.query``), which CI tests against a real node.
"""

from __future__ import annotations

from typing import Any

import elastic_transport
import elasticsearch
from elasticsearch import AsyncElasticsearch
from elasticsearch.helpers import async_bulk

from attest.lexical.backends.engine import EngineBackend
from attest.lexical.settings import LexicalSettings


class ElasticsearchBackend(EngineBackend):
    name = "elasticsearch"

    def __init__(self, settings: LexicalSettings) -> None:
        super().__init__(settings, settings.elasticsearch.timeout_seconds)
        cfg = settings.elasticsearch
        basic_auth = None
        if cfg.username and cfg.password:
            basic_auth = (cfg.username, cfg.password.get_secret_value())
        self._client = AsyncElasticsearch(
            hosts=list(cfg.hosts),
            api_key=cfg.api_key.get_secret_value() if cfg.api_key else None,
            basic_auth=basic_auth,
            verify_certs=cfg.verify_certs,
            max_retries=0,
            retry_on_timeout=False,
            request_timeout=cfg.timeout_seconds,
        )

    def _timed(self) -> AsyncElasticsearch:
        return self._client.options(request_timeout=self._budget())

    def _classify(self, exc: Exception) -> tuple[str, int | None]:
        if isinstance(exc, elastic_transport.ConnectionTimeout):
            return "timeout", None
        if isinstance(exc, elastic_transport.ConnectionError | elastic_transport.TransportError):
            return "connection", None
        if isinstance(exc, elasticsearch.ApiError):
            return "status", int(exc.meta.status)
        if isinstance(exc, TimeoutError):
            return "timeout", None
        return "status", None

    def _is_already_exists(self, exc: Exception) -> bool:
        return isinstance(exc, elasticsearch.BadRequestError) and "already_exists" in str(exc)

    async def _index_exists(self, index: str) -> bool:
        return bool(await self._timed().indices.exists(index=index))

    async def _create_index(self, index: str, definition: dict[str, Any]) -> None:
        await self._timed().indices.create(
            index=index, settings=definition["settings"], mappings=definition["mappings"]
        )

    async def _put_mapping(self, index: str, properties: dict[str, Any]) -> None:
        await self._timed().indices.put_mapping(index=index, properties=properties)

    async def _mget(self, index: str, ids: list[str], fields: list[str]) -> dict[str, Any]:
        response = await self._timed().mget(index=index, ids=ids, source_includes=fields)
        return dict(response.body)

    async def _search(self, index: str, body: dict[str, Any]) -> dict[str, Any]:
        response = await self._timed().search(index=index, body=body)
        return dict(response.body)

    async def _count(self, index: str, body: dict[str, Any]) -> int:
        response = await self._timed().count(index=index, body=body)
        return int(response["count"])

    async def _refresh(self, index: str) -> None:
        await self._timed().indices.refresh(index=index)

    async def _bulk(self, actions: list[dict[str, Any]], refresh: bool) -> list[dict[str, Any]]:
        _, errors = await async_bulk(
            self._timed(),
            actions,
            raise_on_error=False,
            raise_on_exception=True,
            refresh="wait_for" if refresh else False,
        )
        return list(errors) if isinstance(errors, list) else []

    async def close(self) -> None:
        await self._client.close()
