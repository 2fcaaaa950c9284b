"""Lexical backends: tantivy (embedded), OpenSearch and Elasticsearch."""

from __future__ import annotations

from attest.lexical.backends.base import LexicalBackend
from attest.lexical.settings import LexicalSettings


def create_backend(settings: LexicalSettings) -> LexicalBackend:
    """The backend the settings name. Cheap: nothing connects before ``warm_up``."""
    if settings.backend == "tantivy":
        from attest.lexical.backends.tantivy import TantivyBackend

        return TantivyBackend(settings)
    if settings.backend == "opensearch":
        from attest.lexical.backends.opensearch import OpenSearchBackend

        return OpenSearchBackend(settings)
    from attest.lexical.backends.elasticsearch import ElasticsearchBackend

    return ElasticsearchBackend(settings)


__all__ = ["LexicalBackend", "create_backend"]
