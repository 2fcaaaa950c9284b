"""LLM clients behind one interface: TGI's native API and OpenAI-compatible chat.

Both speak HTTP through aiohttp and share what matters in production: one
connection pool, a bound on concurrent requests, a per-request timeout capped
by the caller's deadline, retries with jittered exponential backoff for
transient failures only (overload, 5xx, connection errors), and translation
of every upstream failure into the typed errors of ``attest.core.errors`` at
this edge, so nothing above it sees HTTP.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from abc import ABC, abstractmethod
from typing import Any, Literal

import aiohttp
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


class LLMSettings(StrictModel):
    """Where the LLM runs and how it is called."""

    kind: Literal["tgi", "openai"] = Field(
        default="tgi",
        description="tgi: TGI's native /generate; openai: any OpenAI-compatible "
        "/v1/chat/completions (vLLM, SGLang, TGI's Messages API).",
    )
    url: str = Field(default="", description="Base URL, e.g. http://tgi:8080; empty: no LLM.")
    model: str = Field(default="", description="Model name sent to OpenAI-compatible servers.")
    api_key: SecretStr | None = None
    timeout_seconds: float = Field(
        default=60.0, gt=0, description="Per request, capped by the deadline."
    )
    connect_timeout_seconds: float = Field(default=3.0, gt=0)
    max_concurrency: int = Field(default=16, ge=1, description="Requests in flight per process.")
    max_attempts: int = Field(default=3, ge=1, le=10)
    backoff_seconds: float = Field(default=0.25, ge=0)
    max_backoff_seconds: float = Field(default=4.0, ge=0)
    max_new_tokens: int = Field(default=512, ge=1, le=32768)
    json_grammar: bool = Field(
        default=True,
        description="Constrain JSON answers by a grammar (TGI) or response_format json_schema.",
    )


class _Retryable(Exception):
    """A transient failure; carries the typed error raised once attempts run out."""

    def __init__(self, error: AttestError, retry_after: float | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry_after = retry_after


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

    @property
    def name(self) -> str:
        return f"{self.kind}:{self.settings.model or self.settings.url}"

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

    async def generate(
        self,
        system: str,
        user: str,
        *,
        max_tokens: int | None = None,
        schema: JsonSchema | None = None,
    ) -> str:
        """The model's text for one prompt; typed errors on failure."""
        max_tokens = max_tokens or self.settings.max_new_tokens
        use_schema = schema if self.settings.json_grammar else None
        attempt = 0
        while True:
            attempt += 1
            try:
                async with self._semaphore:
                    seconds = budget(self.settings.timeout_seconds)
                    return await self._once(system, user, max_tokens, use_schema, seconds)
            except _Retryable as exc:
                if attempt >= self.settings.max_attempts:
                    raise exc.error from None
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

    async def _once(
        self, system: str, user: str, max_tokens: int, schema: JsonSchema | None, seconds: float
    ) -> str:
        url, payload = self._request(system, user, max_tokens, schema)
        session = self._get_session()
        self.requests += 1
        try:
            async with session.post(
                url,
                json=payload,
                timeout=aiohttp.ClientTimeout(
                    total=seconds, sock_connect=min(seconds, self.settings.connect_timeout_seconds)
                ),
            ) as response:
                try:
                    body: Any = await response.json(content_type=None)
                except (json.JSONDecodeError, UnicodeDecodeError, aiohttp.ContentTypeError):
                    body = None
                if response.status >= 400:
                    error = map_http_error(response.status, body, response.headers)
                    if isinstance(error, _Retryable):
                        raise error
                    raise error
                text = self._text(body)
        except TimeoutError:
            raise DeadlineExceeded(f"the LLM did not answer within {seconds:.1f}s") from None
        except aiohttp.ClientConnectorError as exc:
            raise _Retryable(Unavailable(f"LLM server unreachable: {exc.os_error}")) from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise _Retryable(Unavailable(f"LLM connection failed: {exc}")) from None
        except aiohttp.ClientPayloadError as exc:
            raise _Retryable(Unavailable(f"LLM response cut short: {exc}")) from None
        if text is None:
            raise Internal(f"unexpected LLM response shape: {str(body)[:200]}")
        return text

    @abstractmethod
    def _request(
        self, system: str, user: str, max_tokens: int, schema: JsonSchema | None
    ) -> tuple[str, dict[str, Any]]:
        """URL and JSON payload of one request."""

    @abstractmethod
    def _text(self, body: Any) -> str | None:
        """The generated text of a response body, None when the shape is wrong."""


class TGIClient(LLMClient):
    """TGI's native ``POST /generate`` with grammar-constrained JSON."""

    kind = "tgi"

    def _request(
        self, system: str, user: str, max_tokens: int, schema: JsonSchema | None
    ) -> tuple[str, dict[str, Any]]:
        parameters: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "do_sample": False,
            "return_full_text": False,
        }
        if schema is not None:
            parameters["grammar"] = {"type": "json", "value": schema}
        inputs = f"{system}\n\n{user}\n\nResponse:\n"
        return self.settings.url.rstrip("/") + "/generate", {
            "inputs": inputs,
            "parameters": parameters,
        }

    def _text(self, body: Any) -> str | None:
        if isinstance(body, list) and body:  # some TGI versions wrap it in a list
            body = body[0]
        if isinstance(body, dict) and isinstance(body.get("generated_text"), str):
            return str(body["generated_text"])
        return None


class OpenAIClient(LLMClient):
    """Any OpenAI-compatible ``POST /v1/chat/completions`` server."""

    kind = "openai"

    def _request(
        self, system: str, user: str, max_tokens: int, schema: JsonSchema | None
    ) -> tuple[str, dict[str, Any]]:
        payload: dict[str, Any] = {
            "model": self.settings.model or "default",
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user},
            ],
            "max_tokens": max_tokens,
            "temperature": 0,
        }
        if schema is not None:
            payload["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "attest", "schema": schema, "strict": True},
            }
        base = self.settings.url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        return base + "/chat/completions", payload

    def _text(self, body: Any) -> str | None:
        try:
            content = body["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            return None
        return content if isinstance(content, str) else None


def create_client(settings: LLMSettings) -> LLMClient:
    return TGIClient(settings) if settings.kind == "tgi" else OpenAIClient(settings)
