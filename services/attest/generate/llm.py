"""LLM clients behind one interface: TGI's Messages API and OpenAI-compatible chat.

Both send chat messages to ``POST /v1/chat/completions``, so the server applies
the model's own chat template (no prompt is concatenated here), and both share
what matters in production: one connection pool, a bound on concurrent
requests per upstream, a per-request deadline proportional to the tokens
requested and capped by the caller's deadline, retries with jittered
exponential backoff for transient failures only (overload, 5xx, connection
errors; ``Retry-After`` is honoured), and translation of every upstream failure
into the typed errors of ``attest.core.errors`` at this edge, so nothing above
it sees HTTP. They differ in how a JSON schema is asked for and in the error
bodies they read.

Every call is deterministic where the server allows it: temperature 0 and a
fixed seed.

JSON outputs. When a step asks for JSON, the schema goes to the server as a
grammar constraint (``response_format`` in the server's own form) and the reply
is checked here against the same schema. A reply nothing can be read from
(cut off at the token limit, not JSON, or not of the schema's outer shape) is
asked for once more, with twice the token allowance when it was cut off and a
note saying what was wrong; a second such reply is returned as it is, and
the pipeline's parser then discards it (the sentence is left unsupported, a
judgement is rejected) — it never raises and never becomes a citation. Wrong
items inside a readable reply (an unknown source, a confidence of 11) are
not asked for again: the pipeline drops them one by one and keeps the rest. So a
JSON step costs at most two requests, and an answer at most
N + 1 + 2·⌈S / batch⌉ + R·(K + 2) requests for N sources, S sentences and
R re-searches of K sources each (twice the JSON calls of the pipeline's bound).

Why not the ``openai`` SDK: it would bring retries with ``Retry-After`` and
typed errors, which this client already has in a few dozen lines, and it
knows neither TGI's error bodies (``{"error", "error_type"}``) nor the
``response_format`` forms of TGI and llama.cpp, which would go through
``extra_body`` untyped; its retry loop would have to be switched off so that
ours stays the one that respects the caller's deadline; and it is one more
dependency (with httpx and its own pydantic models) for the same wire
protocol. The schema check is a small validator of the JSON Schema subset the
prompts use (object, array, integer, string, required, minimum, maximum),
for the same reason: the server enforces the schema by grammar, and this
check only has to catch truncation and servers that ignore the grammar.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
from prometheus_client import Counter, Histogram
from pydantic import Field, SecretStr

from attest.core.context import budget
from attest.core.errors import (
    AttestError,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    ResourceExhausted,
    Unavailable,
)
from attest.core.settings import StrictModel

log = logging.getLogger(__name__)

JsonSchema = dict[str, Any]

# Every request to the model, as this process sees it (``kind`` is "tgi" or
# "openai"; ``call`` is "complete" or "stream").
LLM_REQUESTS = Counter(
    "attest_llm_requests_total",
    "HTTP requests sent to the LLM, retries included, by kind, call and outcome "
    "(ok, or the error the request ended with: unavailable, deadline_exceeded, "
    "resource_exhausted, invalid_argument, internal, ...).",
    ["kind", "call", "outcome"],
)
LLM_SECONDS = Histogram(
    "attest_llm_request_seconds",
    "Time inside one HTTP request to the LLM (waits for a concurrency slot excluded), "
    "by kind and call; a stream's time includes the caller's work between pieces.",
    ["kind", "call"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120),
)
LLM_FIRST_TOKEN_SECONDS = Histogram(
    "attest_llm_first_token_seconds",
    "Time from sending a streamed request to the LLM's first text piece, by kind.",
    ["kind"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30),
)
LLM_TOKENS = Counter(
    "attest_llm_tokens_total",
    "Tokens the LLM read (prompt) and wrote (completion), by kind.",
    ["kind", "direction"],
)
LLM_INVALID_OUTPUTS = Counter(
    "attest_llm_invalid_outputs_total",
    "LLM replies that failed the JSON check of the step that asked for JSON, by kind.",
    ["kind"],
)


def _outcome(error: BaseException) -> str:
    """The outcome label of a request that ended with ``error``."""
    if isinstance(error, (GeneratorExit, asyncio.CancelledError)):
        return "cancelled"  # the caller left (an early close of a stream, a cancelled task)
    if isinstance(error, _Retryable):
        error = error.error
    if isinstance(error, AttestError):
        return error.code.lower()
    return "internal"


class LLMSettings(StrictModel):
    """Where the LLM runs and how it is called."""

    kind: Literal["tgi", "openai"] = Field(
        default="tgi",
        description="tgi: TGI's Messages API (its grammar form and error bodies); openai: any "
        "OpenAI-compatible /v1/chat/completions (vLLM, SGLang, llama.cpp).",
    )
    url: str = Field(default="", description="Base URL, e.g. http://tgi:8080; empty: no LLM.")
    model: str = Field(default="", description="Model name sent to the server.")
    api_key: SecretStr | None = Field(
        default=None,
        description="Bearer token of the LLM server.",
    )
    response_format: Literal["json_schema", "json_object"] = Field(
        default="json_schema",
        description="How an OpenAI-compatible server is asked for JSON: json_schema "
        '(OpenAI, vLLM, SGLang) or json_object with a "schema" (llama.cpp\'s servers).',
    )
    system_role: bool = Field(
        default=True,
        description="Send the system prompt as a system message; off for chat templates "
        "without a system role (Gemma), where it opens the user message instead.",
    )
    seed: int | None = Field(default=0, description="Sampling seed; None leaves it to the server.")
    timeout_seconds: float = Field(
        default=60.0, gt=0, description="Most one request may take, capped by the deadline."
    )
    first_token_seconds: float = Field(
        default=10.0, gt=0, description="Allowance for queueing and reading the prompt."
    )
    seconds_per_token: float = Field(
        default=0.1,
        ge=0,
        description="Allowance per token requested: a request's deadline is "
        "first_token_seconds + seconds_per_token × max tokens, at most timeout_seconds.",
    )
    connect_timeout_seconds: float = Field(
        default=3.0,
        gt=0,
        description="Most a connection to the server may take.",
    )
    max_concurrency: int = Field(default=16, ge=1, description="Requests in flight per process.")
    max_attempts: int = Field(
        default=3,
        ge=1,
        le=10,
        description="Attempts of one request on a transient failure (overload, 5xx, connection "
        "error).",
    )
    backoff_seconds: float = Field(
        default=0.25,
        ge=0,
        description="First wait before a retry; doubled each time (with jitter; Retry-After "
        "honoured).",
    )
    max_backoff_seconds: float = Field(
        default=4.0,
        ge=0,
        description="Longest wait between retries.",
    )
    max_new_tokens: int = Field(
        default=512,
        ge=1,
        le=32768,
        description="Most tokens the model may write in one reply.",
    )
    json_grammar: bool = Field(
        default=True,
        description="Constrain JSON answers by the schema (response_format); they are "
        "checked against it either way.",
    )


class _Retryable(Exception):
    """A transient failure; carries the typed error raised once attempts run out."""

    def __init__(self, error: AttestError, retry_after: float | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Completion:
    """One reply: its text, whether the token limit cut it, and the tokens counted."""

    text: str
    truncated: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0


def _error_text(body: Any) -> tuple[str, str]:
    """(message, error type) from a TGI or OpenAI-style error body."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):  # OpenAI: {"error": {"message", "type"}}
            return str(err.get("message", ""))[:300], str(err.get("type", ""))
        if isinstance(err, str):  # TGI: {"error", "error_type"}
            return err[:300], str(body.get("error_type", ""))
        if "message" in body:  # vLLM: {"object": "error", "message", "type"}
            return str(body["message"])[:300], str(body.get("type", ""))
        if "detail" in body:  # FastAPI-based servers (llama-cpp-python): {"detail": ...}
            return str(body["detail"])[:300], ""
    return (str(body)[:300] if body else ""), ""


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def map_http_error(status: int, body: Any, headers: Any = None) -> AttestError | _Retryable:
    """The typed error for an upstream HTTP failure; transient ones are wrapped."""
    message, kind = _error_text(body)
    detail = f"LLM server answered {status}" + (f": {message}" if message else "")
    kind = kind.lower()
    if kind == "overloaded" or status == 429:
        return _Retryable(ResourceExhausted(detail), _retry_after(headers))
    if kind == "validation" or status in (400, 413, 422):
        return InvalidArgument(detail)
    if status in (401, 403, 404):
        return FailedPrecondition(f"{detail} (check the LLM url, model and api key)")
    if status in (408, 504):
        return _Retryable(DeadlineExceeded(detail))
    if status in (500, 502, 503):
        return _Retryable(Unavailable(detail), _retry_after(headers))
    return Internal(detail)


_TYPES: dict[str, Any] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "integer": int,
    "number": (int, float),
}


def schema_error(value: Any, schema: JsonSchema, path: str = "$", *, depth: int = 32) -> str | None:
    """Why ``value`` does not match ``schema`` (the subset the prompts use), None if it does.

    ``depth`` 1 checks the value and its properties' types without entering them.
    """
    kind = schema.get("type")
    if isinstance(kind, str):
        expected = _TYPES.get(kind)
        if expected is not None and (
            not isinstance(value, expected) or (isinstance(value, bool) and kind != "boolean")
        ):
            return f"{path} is not of type {kind}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path} is not one of {schema['enum']}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{path} is below {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{path} is above {schema['maximum']}"
    if isinstance(value, dict):
        for name in schema.get("required", ()):
            if name not in value:
                return f"{path} has no {name!r}"
        for name, sub in schema.get("properties", {}).items() if depth > 0 else ():
            if name in value and (
                error := schema_error(value[name], sub, f"{path}.{name}", depth=depth - 1)
            ):
                return error
    if depth > 0 and isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            if error := schema_error(item, schema["items"], f"{path}[{i}]", depth=depth - 1):
                return error
    return None


def json_problem(completion: Completion, schema: JsonSchema) -> str | None:
    """Why a reply that should be JSON of ``schema`` is unusable, None if it is usable.

    Unusable: cut off, not JSON, or not of the schema's outer shape. A wrong
    item inside a usable reply (a confidence of 11) is not a reason to ask
    again: the pipeline discards that item and keeps the valid ones.
    """
    text = completion.text.strip()
    if text.startswith("```"):  # a fenced block is tolerated, as the parser tolerates it
        text = text.strip("`").removeprefix("json").strip()
    try:
        value = json.loads(text)
    except ValueError:
        if completion.truncated:
            return "it was cut off at the token limit"
        return "it was not valid JSON"
    return schema_error(value, schema, depth=1)


class LLMClient(ABC):
    """One LLM endpoint. Cheap to build; the HTTP session opens on first use."""

    kind: str = ""

    def __init__(self, settings: LLMSettings) -> None:
        if not settings.url:
            raise FailedPrecondition("no LLM url configured", field="llm.url")
        self.settings = settings
        self._semaphore = asyncio.Semaphore(settings.max_concurrency)
        self._session: aiohttp.ClientSession | None = None
        self.requests = 0  # HTTP requests sent, retries included
        self.invalid_outputs = 0  # JSON replies that failed the schema check
        self.prompt_tokens = 0
        self.completion_tokens = 0
        # Seconds spent inside HTTP requests to the model (waits for a
        # concurrency slot excluded): the model's own time as this client sees it.
        self.model_seconds = 0.0

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.settings.model or self.settings.url}"

    def _count_tokens(self, prompt: int, completion: int) -> None:
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        LLM_TOKENS.labels(self.kind, "prompt").inc(prompt)
        LLM_TOKENS.labels(self.kind, "completion").inc(completion)

    def _count_invalid(self) -> None:
        self.invalid_outputs += 1
        LLM_INVALID_OUTPUTS.labels(self.kind).inc()

    def _headers(self) -> dict[str, str]:
        key = self.settings.api_key
        return {"Authorization": f"Bearer {key.get_secret_value()}"} if key else {}

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers(),
                connector=aiohttp.TCPConnector(limit=self.settings.max_concurrency),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def deadline_for(self, max_tokens: int) -> float:
        """Seconds one request for ``max_tokens`` tokens may take, before the caller's cap."""
        s = self.settings
        return min(s.timeout_seconds, s.first_token_seconds + s.seconds_per_token * max_tokens)

    async def generate(
        self,
        system: str,
        user: str,
        *,
        max_tokens: int | None = None,
        schema: JsonSchema | None = None,
    ) -> str:
        """The model's text for one prompt; typed errors on failure.

        With a ``schema`` the reply is checked against it and asked for once
        more when it fails (see the module docstring); the second reply is
        returned whatever it is.
        """
        max_tokens = max_tokens or self.settings.max_new_tokens
        completion = await self._complete(system, user, max_tokens, schema)
        if schema is None:
            return completion.text
        problem = json_problem(completion, schema)
        if problem is None:
            return completion.text
        self._count_invalid()
        log.warning("LLM reply failed the JSON check (%s); asking once more", problem)
        if completion.truncated:
            max_tokens *= 2
        note = (
            f"\n\nA previous reply to this could not be used: {problem}. "
            "Reply again with JSON only, in the format asked for, and keep it short."
        )
        completion = await self._complete(system, user + note, max_tokens, schema)
        problem = json_problem(completion, schema)
        if problem is not None:
            self._count_invalid()
            log.warning("LLM reply failed the JSON check again (%s); it is discarded", problem)
        return completion.text

    async def _complete(
        self, system: str, user: str, max_tokens: int, schema: JsonSchema | None
    ) -> Completion:
        use_schema = schema if self.settings.json_grammar else None
        attempt = 0
        while True:
            attempt += 1
            try:
                async with self._semaphore:
                    seconds = budget(self.deadline_for(max_tokens))
                    began = time.perf_counter()
                    outcome = "ok"
                    try:
                        completion = await self._once(system, user, max_tokens, use_schema, seconds)
                    except BaseException as exc:
                        outcome = _outcome(exc)
                        raise
                    finally:
                        elapsed = time.perf_counter() - began
                        self.model_seconds += elapsed
                        LLM_SECONDS.labels(self.kind, "complete").observe(elapsed)
                        LLM_REQUESTS.labels(self.kind, "complete", outcome).inc()
                self._count_tokens(completion.prompt_tokens, completion.completion_tokens)
                return completion
            except _Retryable as exc:
                if attempt >= self.settings.max_attempts:
                    raise exc.error from None
                await self._back_off(exc, attempt)

    async def _back_off(self, exc: _Retryable, attempt: int) -> None:
        delay = min(
            self.settings.max_backoff_seconds,
            self.settings.backoff_seconds * 2 ** (attempt - 1),
        )
        delay = random.uniform(0, delay)  # full jitter spreads retries of many callers
        if exc.retry_after is not None:
            delay = max(delay, min(exc.retry_after, self.settings.max_backoff_seconds))
        log.warning(
            "LLM request failed (%s); retry %d/%d in %.2fs",
            exc.error.message,
            attempt,
            self.settings.max_attempts - 1,
            delay,
        )
        await asyncio.sleep(delay)

    async def stream(
        self, system: str, user: str, *, max_tokens: int | None = None
    ) -> AsyncGenerator[str, None]:
        """The model's reply to one prompt as it is written, in text pieces.

        The same request as ``generate`` with ``stream: true`` (server-sent
        events); a server that answers with one JSON body instead yields it
        whole. Failures before the first piece are retried like ``generate``;
        after it, the stream is cut and the typed error raised, since the
        caller has already used the text. The whole stream shares one deadline,
        proportional to ``max_tokens``. Completion tokens are counted from the
        server's usage when it sends one, else one per piece (llama.cpp and TGI
        send a token per event); prompt tokens only from a usage.

        Close the iterator (``contextlib.aclosing``) when leaving it early:
        it holds one of the upstream's concurrency slots until it ends.
        """
        max_tokens = max_tokens or self.settings.max_new_tokens
        attempt = 0
        while True:
            attempt += 1
            started = False
            try:
                async with self._semaphore:
                    seconds = budget(self.deadline_for(max_tokens))
                    sent = began = time.perf_counter()
                    outcome = "ok"
                    try:
                        async for piece in self._stream_once(system, user, max_tokens, seconds):
                            if not started:
                                LLM_FIRST_TOKEN_SECONDS.labels(self.kind).observe(
                                    time.perf_counter() - sent
                                )
                            started = True
                            # The caller's work on a piece is not the model's time.
                            self.model_seconds += time.perf_counter() - began
                            yield piece
                            began = time.perf_counter()
                    except BaseException as exc:
                        outcome = _outcome(exc)
                        raise
                    finally:
                        self.model_seconds += time.perf_counter() - began
                        LLM_SECONDS.labels(self.kind, "stream").observe(time.perf_counter() - sent)
                        LLM_REQUESTS.labels(self.kind, "stream", outcome).inc()
                return
            except _Retryable as exc:
                if started or attempt >= self.settings.max_attempts:
                    raise exc.error from None
                await self._back_off(exc, attempt)

    async def _stream_once(
        self, system: str, user: str, max_tokens: int, seconds: float
    ) -> AsyncIterator[str]:
        url, payload = self._request(system, user, max_tokens, None)
        payload["stream"] = True
        session = self._get_session()
        self.requests += 1
        with _transport_errors(seconds):
            async with session.post(url, json=payload, timeout=self._timeout(seconds)) as response:
                if response.status >= 400:
                    try:
                        body: Any = await response.json(content_type=None)
                    except (json.JSONDecodeError, UnicodeDecodeError, aiohttp.ContentTypeError):
                        body = None
                    raise map_http_error(response.status, body, response.headers)
                if "event-stream" not in response.headers.get("Content-Type", ""):
                    try:
                        body = await response.json(content_type=None)
                    except (json.JSONDecodeError, UnicodeDecodeError):
                        body = None
                    completion = self._completion(body)
                    if completion is None:
                        # Something answers there, but not as an LLM does.
                        raise Unavailable(
                            "the LLM server's reply to a streamed request is unreadable"
                        )
                    self._count_tokens(completion.prompt_tokens, completion.completion_tokens)
                    if completion.text:
                        yield completion.text
                    return
                pieces = 0
                finished = False
                usage: dict[str, Any] = {}
                async for raw in response.content:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:"):
                        continue  # blank separators, comments, "event:" lines
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                    except json.JSONDecodeError:
                        raise Internal(f"unreadable LLM stream event: {data[:200]}") from None
                    if not isinstance(chunk, dict):
                        raise Internal(f"unexpected LLM stream event: {data[:200]}")
                    if "error" in chunk:
                        raise Unavailable(f"LLM stream failed: {str(chunk['error'])[:200]}")
                    if isinstance(chunk.get("usage"), dict):
                        usage = chunk["usage"]
                    piece = _delta(chunk)
                    if piece:
                        pieces += 1
                        yield piece
                    finished = finished or _finish_reason(chunk) is not None
                if not finished:
                    # A server that drops a reply (llama-cpp-python's server cuts a
                    # stream when another request arrives) still ends the stream
                    # cleanly, only without a finish reason.
                    raise _Retryable(Unavailable("the LLM's stream ended without a finish reason"))
                counted = usage.get("completion_tokens")
                prompt = usage.get("prompt_tokens")
                self._count_tokens(
                    prompt if isinstance(prompt, int) else 0,
                    counted if isinstance(counted, int) else pieces,
                )

    async def _once(
        self, system: str, user: str, max_tokens: int, schema: JsonSchema | None, seconds: float
    ) -> Completion:
        url, payload = self._request(system, user, max_tokens, schema)
        session = self._get_session()
        self.requests += 1
        with _transport_errors(seconds):
            async with session.post(url, json=payload, timeout=self._timeout(seconds)) as response:
                try:
                    body: Any = await response.json(content_type=None)
                except (json.JSONDecodeError, UnicodeDecodeError, aiohttp.ContentTypeError):
                    body = None
                if response.status >= 400:
                    raise map_http_error(response.status, body, response.headers)
                completion = self._completion(body)
        if completion is None:
            raise Internal(f"unexpected LLM response shape: {str(body)[:200]}")
        return completion

    def _timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(
            total=seconds, sock_connect=min(seconds, self.settings.connect_timeout_seconds)
        )

    def _messages(self, system: str, user: str) -> list[dict[str, str]]:
        if not system:
            return [{"role": "user", "content": user}]
        if not self.settings.system_role:
            return [{"role": "user", "content": f"{system}\n\n{user}"}]
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def _request(
        self, system: str, user: str, max_tokens: int, schema: JsonSchema | None
    ) -> tuple[str, dict[str, Any]]:
        """URL and JSON payload of one chat completion request."""
        payload: dict[str, Any] = {
            "model": self.settings.model or "default",
            "messages": self._messages(system, user),
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        if self.settings.seed is not None:
            payload["seed"] = self.settings.seed
        if schema is not None:
            payload["response_format"] = self._response_format(schema)
        base = self.settings.url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        return base + "/chat/completions", payload

    @abstractmethod
    def _response_format(self, schema: JsonSchema) -> dict[str, Any]:
        """How this server is asked for JSON of ``schema``."""

    @staticmethod
    def _completion(body: Any) -> Completion | None:
        """The reply of a chat completion body, None when the shape is wrong."""
        try:
            choice = body["choices"][0]
            content = choice["message"]["content"]
        except (KeyError, IndexError, TypeError):
            return None
        if not isinstance(content, str):
            return None
        usage = body.get("usage") if isinstance(body, dict) else None
        usage = usage if isinstance(usage, dict) else {}

        def count(name: str) -> int:
            value = usage.get(name)
            return value if isinstance(value, int) and value >= 0 else 0

        return Completion(
            text=content,
            truncated=choice.get("finish_reason") == "length",
            prompt_tokens=count("prompt_tokens"),
            completion_tokens=count("completion_tokens"),
        )


@contextlib.contextmanager
def _transport_errors(seconds: float) -> Iterator[None]:
    """HTTP failures of one request as typed errors: a timeout is final, the
    connection failures are retried by the caller."""
    try:
        yield
    except TimeoutError:
        raise DeadlineExceeded(f"the LLM did not answer within {seconds:.1f}s") from None
    except aiohttp.ClientConnectorError as exc:
        raise _Retryable(Unavailable(f"LLM server unreachable: {exc.os_error}")) from None
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
        raise _Retryable(Unavailable(f"LLM connection failed: {exc}")) from None
    except aiohttp.ClientPayloadError as exc:
        raise _Retryable(Unavailable(f"LLM response cut short: {exc}")) from None


def _delta(chunk: dict[str, Any]) -> str:
    """The text of one streamed chat completion event ("" when it carries none)."""
    try:
        content = chunk["choices"][0]["delta"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError):
        return ""
    return content if isinstance(content, str) else ""


def _finish_reason(chunk: dict[str, Any]) -> str | None:
    try:
        reason = chunk["choices"][0].get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        return None
    return reason if isinstance(reason, str) and reason else None


class TGIClient(LLMClient):
    """TGI's Messages API, so the model's chat template applies; its own grammar form."""

    kind = "tgi"

    def _response_format(self, schema: JsonSchema) -> dict[str, Any]:
        return {"type": "json", "value": schema}


class OpenAIClient(LLMClient):
    """Any OpenAI-compatible ``POST /v1/chat/completions`` server."""

    kind = "openai"

    def _response_format(self, schema: JsonSchema) -> dict[str, Any]:
        if self.settings.response_format == "json_object":
            return {"type": "json_object", "schema": schema}
        return {
            "type": "json_schema",
            "json_schema": {"name": "attest", "schema": schema, "strict": True},
        }


def create_client(settings: LLMSettings) -> LLMClient:
    return TGIClient(settings) if settings.kind == "tgi" else OpenAIClient(settings)
