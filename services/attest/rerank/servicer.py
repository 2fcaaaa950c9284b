"""gRPC servicer of the rerank service: validate, call the reranker, rank."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import grpc
import numpy as np

from attest.core.errors import InvalidArgument
from attest.rerank.rerankers import Reranker, Vector, create_reranker
from attest.rerank.scoring import DocInput
from attest.rerank.settings import RerankLimits, RerankSettings
from attest.rerank.v1 import rerank_pb2, rerank_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]

log = logging.getLogger(__name__)

KIND_TO_PROTO = {
    "pfid": rerank_pb2.RERANKER_PFID,
    "embedding": rerank_pb2.RERANKER_EMBEDDING_FALLBACK,
}


def _vector(message: rerank_pb2.Vector, dimension: int, field: str) -> Vector | None:
    """A given embedding, or None for an empty one; wrong ones are INVALID_ARGUMENT."""
    if not message.values:
        return None
    vector = np.asarray(message.values, dtype=np.float32)
    if vector.shape != (dimension,):
        raise InvalidArgument(
            f"has {vector.shape[0]} dimensions; the reranker's model has {dimension}", field=field
        )
    if not np.all(np.isfinite(vector)) or not np.any(vector):
        raise InvalidArgument("must be finite and non-zero", field=field)
    return vector


def read_vectors(
    request: rerank_pb2.RerankRequest, space: tuple[str, int] | None
) -> tuple[Vector | None, list[tuple[Vector | None, ...]]]:
    """The request's query and passage vectors, when they are in the reranker's
    vector space (same model); (None, []) otherwise."""
    given = request.document_vectors
    if given and len(given) != len(request.documents):
        raise InvalidArgument(
            f"has {len(given)} entries for {len(request.documents)} documents",
            field="document_vectors",
        )
    for i, (doc, entry) in enumerate(zip(request.documents, given, strict=False)):
        if entry.passages and len(entry.passages) != len(doc.passages):
            raise InvalidArgument(
                f"has {len(entry.passages)} vectors for {len(doc.passages)} passages",
                field=f"document_vectors[{i}].passages",
            )
    if space is None or not (request.HasField("query_vector") or given):
        return None, []
    model, dimension = space
    if request.embedding_model != model:
        _warn_model_once(request.embedding_model, model)
        return None, []
    query = (
        _vector(request.query_vector, dimension, "query_vector")
        if request.HasField("query_vector")
        else None
    )
    passages = [
        tuple(
            _vector(v, dimension, f"document_vectors[{i}].passages[{j}]")
            for j, v in enumerate(entry.passages)
        )
        for i, entry in enumerate(given)
    ]
    return query, passages


_warned_models: set[str] = set()


def _warn_model_once(given: str, own: str) -> None:
    if given not in _warned_models:
        _warned_models.add(given)
        log.warning(
            "vectors from embedding model %r ignored: the reranker embeds with %r; "
            "configure both services with the same model to skip embedding at query time",
            given,
            own,
        )


def validate(request: rerank_pb2.RerankRequest, limits: RerankLimits) -> list[DocInput]:
    query = request.query.strip()
    if not query:
        raise InvalidArgument("the query is empty", field="query")
    if len(request.query) > limits.max_query_chars:
        raise InvalidArgument(
            f"the query has {len(request.query)} characters; at most {limits.max_query_chars}",
            field="query",
        )
    n = len(request.documents)
    if n == 0:
        raise InvalidArgument("no documents to rerank", field="documents")
    if n > limits.max_documents:
        raise InvalidArgument(
            f"{n} documents; at most {limits.max_documents} per request", field="documents"
        )
    for name, value in (("top_k", request.top_k), ("passages_top_k", request.passages_top_k)):
        if not 0 <= value <= limits.max_top_k:
            raise InvalidArgument(f"must be 0-{limits.max_top_k}, got {value}", field=name)
    seen: set[str] = set()
    docs: list[DocInput] = []
    for i, doc in enumerate(request.documents):
        where = f"documents[{i}]"
        if not doc.id or len(doc.id) > limits.max_id_chars:
            raise InvalidArgument(
                f"needs an id of 1-{limits.max_id_chars} characters", field=f"{where}.id"
            )
        if doc.id in seen:
            raise InvalidArgument(f"duplicate document id {doc.id!r}", field=f"{where}.id")
        seen.add(doc.id)
        if not doc.passages:
            raise InvalidArgument("the document has no passages", field=f"{where}.passages")
        if len(doc.passages) > limits.max_passages:
            raise InvalidArgument(
                f"{len(doc.passages)} passages; at most {limits.max_passages} per document",
                field=f"{where}.passages",
            )
        texts: list[str] = []
        for j, p in enumerate(doc.passages):
            if not p.text.strip():
                raise InvalidArgument("empty passage text", field=f"{where}.passages[{j}].text")
            if len(p.text) > limits.max_passage_chars:
                raise InvalidArgument(
                    f"{len(p.text)} characters; at most {limits.max_passage_chars} per passage",
                    field=f"{where}.passages[{j}].text",
                )
            texts.append(p.text)
        docs.append(DocInput(doc.title, tuple(texts)))
    return docs


class RerankServicer(rerank_pb2_grpc.RerankServiceServicer):
    service_name = rerank_pb2.DESCRIPTOR.services_by_name["RerankService"].full_name

    def __init__(self, settings: RerankSettings, reranker: Reranker | None = None) -> None:
        self._limits = settings.limits
        self.reranker = reranker if reranker is not None else create_reranker(settings)

    def register(self, server: grpc.aio.Server) -> None:
        rerank_pb2_grpc.add_RerankServiceServicer_to_server(self, server)

    async def warm_up(self) -> None:
        await self.reranker.warm_up()

    async def close(self) -> None:
        await self.reranker.close()

    async def Rerank(
        self, request: rerank_pb2.RerankRequest, context: Context
    ) -> rerank_pb2.RerankResponse:
        docs = validate(request, self._limits)
        query_vector, passage_vectors = read_vectors(
            request,
            self.reranker.vector_space()
            if request.HasField("query_vector") or request.document_vectors
            else None,
        )
        if passage_vectors:
            docs = [
                dataclasses.replace(d, vectors=v) if v else d
                for d, v in zip(docs, passage_vectors, strict=True)
            ]
        scores = await self.reranker.rerank(request.query, docs, query_vector)
        order = sorted(range(len(docs)), key=lambda i: (-scores[i].score, i))
        if request.top_k:
            order = order[: request.top_k]
        ranked: list[rerank_pb2.RankedDocument] = []
        for i in order:
            s = scores[i]
            pb_doc = request.documents[i]
            porder = sorted(range(len(s.passage_scores)), key=lambda j: (-s.passage_scores[j], j))
            if request.passages_top_k:
                porder = porder[: request.passages_top_k]
            ranked.append(
                rerank_pb2.RankedDocument(
                    doc_id=pb_doc.id,
                    input_index=i,
                    score=s.score,
                    passages=[
                        rerank_pb2.RankedPassage(
                            passage_index=pb_doc.passages[j].index,
                            score=s.passage_scores[j],
                            truncated=s.truncated[j],
                        )
                        for j in porder
                    ],
                )
            )
        return rerank_pb2.RerankResponse(
            documents=ranked,
            reranker=KIND_TO_PROTO[self.reranker.kind],
            model=self.reranker.model_name,
            device=self.reranker.device,
            truncated_passages=sum(sum(s.truncated) for s in scores),
        )
