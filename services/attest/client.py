"""A small typed client of the answer service, the public front door.

    async with AnswerClient("127.0.0.1:50050") as client:
        answer = await client.ask("What did Norvale Copper emit in 2024?")
        async for event in client.ask_stream("..."):
            ...

gRPC failures come back as the typed Attest errors (InvalidArgument,
DeadlineExceeded, Unavailable, ...) with the server's message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from types import TracebackType

import grpc

from attest.answer.v1 import answer_pb2, answer_pb2_grpc
from attest.common.v1 import common_pb2
from attest.core import errors
from attest.core.channels import create_channel
from attest.core.rpc_errors import from_rpc
from attest.core.settings import ClientSettings


def error_from_rpc(err: grpc.RpcError) -> errors.AttestError:
    """The typed error of a failed call, carrying the server's message
    (the table of ``attest.core.rpc_errors``; ``retry_after`` from the
    ``retry-after`` trailer of RESOURCE_EXHAUSTED)."""
    return from_rpc(err)


def options(
    *,
    rerank_top_k: int = 0,
    skip_rerank: bool = False,
    confidence_threshold: int | None = None,
    max_researches: int | None = None,
    time_budget_seconds: float | None = None,
    explain: bool = False,
    documents: Sequence[str] | str = (),
) -> answer_pb2.AskOptions:
    """AskOptions from keyword arguments; 0 and None keep the server's defaults.
    ``documents``: answer from these documents only (their ids; one id may be
    given as a string)."""
    out = answer_pb2.AskOptions(rerank_top_k=rerank_top_k, skip_rerank=skip_rerank, explain=explain)
    if isinstance(documents, str):
        # A str is a Sequence[str] too: its characters are not the ids meant.
        documents = (documents,)
    if documents:
        # The literal of ``attest.core.common.DOC_FILTER``: the client package
        # ships without that module (tests/unit/test_client_distribution.py).
        out.retrieval.filters.append(common_pb2.Filter(field="doc_id", any_of=list(documents)))
    if confidence_threshold is not None:
        out.confidence_threshold = confidence_threshold
    if max_researches is not None:
        out.max_researches = max_researches
    if time_budget_seconds is not None:
        out.time_budget.FromNanoseconds(int(time_budget_seconds * 1e9))
    return out


class AnswerClient:
    """Ask questions of an answer service at ``address`` (``host:port``)."""

    def __init__(self, address: str, settings: ClientSettings | None = None) -> None:
        self.address = address
        self._settings = settings or ClientSettings(timeout_seconds=120)
        self._channel: grpc.aio.Channel | None = None
        self._stub: answer_pb2_grpc.AnswerServiceAsyncStub | None = None

    def _service(self) -> answer_pb2_grpc.AnswerServiceAsyncStub:
        if self._stub is None:
            self._channel = create_channel(self.address, self._settings)
            self._stub = answer_pb2_grpc.AnswerServiceStub(self._channel)
        return self._stub

    async def ask(
        self,
        question: str,
        ask_options: answer_pb2.AskOptions | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, passed through
    ) -> answer_pb2.Answer:
        """The complete answer to ``question``: a coroutine (``await
        client.ask(question)``); a failed call raises a subclass of
        ``attest.core.errors.AttestError``."""
        request = answer_pb2.AskRequest(question=question, options=ask_options)
        try:
            response = await self._service().Ask(
                request, timeout=timeout or self._settings.timeout_seconds
            )
        except grpc.aio.AioRpcError as err:
            raise error_from_rpc(err) from None
        return response.answer

    async def ask_stream(
        self,
        question: str,
        ask_options: answer_pb2.AskOptions | None = None,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, passed through
    ) -> AsyncIterator[answer_pb2.AskStreamResponse]:
        """The answer's events as an async iterator (``async for event in
        client.ask_stream(question)``): retrieval, sentences, revisions, final."""
        request = answer_pb2.AskStreamRequest(question=question, options=ask_options)
        call = self._service().AskStream(request, timeout=timeout or self._settings.timeout_seconds)
        try:
            async for event in call:
                yield event
        except grpc.aio.AioRpcError as err:
            raise error_from_rpc(err) from None

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel, self._stub = None, None

    async def __aenter__(self) -> AnswerClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
