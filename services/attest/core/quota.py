"""Per-tenant quotas on the public listener: requests per second and answers in flight.

A token bucket per tenant refills at ``requests_per_second`` up to ``burst``;
a request finding it empty is RESOURCE_EXHAUSTED with the seconds until the
next token as ``retry_after``. ``Ask`` and ``AskStream`` also count against
the tenant's answers in flight until they end. Tenants come from
credentials, so the tables grow with the number of tenants, not of callers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from attest.core.errors import ResourceExhausted
from attest.core.settings import QuotaSettings

#: Methods that run an answer to its end inside the call.
ANSWER_METHODS = frozenset(
    {"/attest.answer.v1.AnswerService/Ask", "/attest.answer.v1.AnswerService/AskStream"}
)


def _nothing() -> None:
    return None


class TenantQuotas:
    def __init__(
        self, settings: QuotaSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._rate = settings.requests_per_second
        self._burst = float(
            settings.burst if settings.burst is not None else max(1, math.ceil(self._rate or 1.0))
        )
        self._max_answers = settings.max_in_flight_answers
        self._clock = clock
        # tenant -> (tokens, when they were counted)
        self._buckets: dict[str, tuple[float, float]] = {}
        self._answers: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return self._rate is not None or self._max_answers is not None

    def admit(self, tenant: str, method: str) -> Callable[[], None]:
        """Count a call of ``tenant``; returns what to call when it ends.

        Raises ResourceExhausted (with ``retry_after``) over either quota.
        """
        if self._rate is not None:
            now = self._clock()
            tokens, then = self._buckets.get(tenant, (self._burst, now))
            tokens = min(self._burst, tokens + (now - then) * self._rate)
            if tokens < 1.0:
                self._buckets[tenant] = (tokens, now)
                wait = (1.0 - tokens) / self._rate
                raise ResourceExhausted(
                    f"tenant {tenant!r} is over its quota of {self._rate:g} requests/s",
                    retry_after=wait,
                )
            self._buckets[tenant] = (tokens - 1.0, now)
        if self._max_answers is None or method not in ANSWER_METHODS:
            return _nothing
        running = self._answers.get(tenant, 0)
        if running >= self._max_answers:
            raise ResourceExhausted(
                f"tenant {tenant!r} already has {running} answers in flight "
                f"(quota {self._max_answers})",
                retry_after=1.0,
            )
        self._answers[tenant] = running + 1
        done = False

        def release() -> None:
            nonlocal done
            if done:
                return
            done = True
            left = self._answers.get(tenant, 1) - 1
            if left > 0:
                self._answers[tenant] = left
            else:
                self._answers.pop(tenant, None)

        return release
