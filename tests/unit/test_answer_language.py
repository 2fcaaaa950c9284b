"""The answer's sources carry the keyword fields of their documents (here the
language) from whichever retriever's hit returned them: nothing in the answer
pipeline names the field."""

from __future__ import annotations

from attest.common.v1 import common_pb2
from attest.lexical.v1 import lexical_pb2
from tests.unit.test_answer_knowledge import Backends, ask, options, settings


class GermanBackends(Backends):
    """As test_answer_knowledge's, every lexical hit of a German document."""

    async def lexical_search(
        self, request: lexical_pb2.SearchRequest, seconds: float
    ) -> lexical_pb2.SearchResponse:
        response = await super().lexical_search(request, seconds)
        for hit in response.hits:
            hit.language = "de"
        return response


async def test_the_sources_carry_the_language_of_their_documents() -> None:
    answer = await ask(
        GermanBackends(),
        settings(),
        options(common_pb2.RETRIEVER_BM25, common_pb2.RETRIEVER_KNOWLEDGE),
    )
    found = {(s.source.doc_id, s.source.language) for s in answer.sources}
    assert found >= {("news-1", "de"), ("esg-014", "de")}
