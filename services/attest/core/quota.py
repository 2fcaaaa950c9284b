"""Per-tenant quotas on the public listener: requests per second, answers in
flight and open watches.

A token bucket per tenant refills at ``requests_per_second`` up to ``burst``;
a request finding it empty is RESOURCE_EXHAUSTED with the seconds until the
next token as ``retry_after``. ``Ask`` and ``AskStream`` also count against
the tenant's answers in flight until they end. ``Watch`` and ``WatchJob``
stay open until their job ends (a queued job no worker takes: a day), each
holding one of the listener's concurrent calls: they count against the
tenant's open watches (``max_watches``), and all tenants' watches together
against a share (``watch_share``, a quarter) of the listener's calls, so that
watching never leaves Ask or the health check without a call. The health
service's own Watch needs no credential: its streams count as one caller's,
``UNAUTHENTICATED``, which may hold a quarter of that share. Tenants come from
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


#: Methods that stay open until a job ends.
WATCH_METHODS = frozenset(
    {
        "/attest.answer.v1.AnswerService/Watch",
        "/attest.ingest.v1.IngestService/WatchJob",
        # Needs no credential: its streams count as one caller's, UNAUTHENTICATED.
        "/grpc.health.v1.Health/Watch",
    }
)
#: Whom the watches of callers without a credential (health) count against.
UNAUTHENTICATED = "(unauthenticated)"


def _nothing() -> None:
    return None


class _Counts:
    """Calls running per tenant, released once each."""

    def __init__(self) -> None:
        self.by_tenant: dict[str, int] = {}
        self.total = 0

    def take(self, tenant: str) -> Callable[[], None]:
        self.by_tenant[tenant] = self.by_tenant.get(tenant, 0) + 1
        self.total += 1
        done = False

        def release() -> None:
            nonlocal done
            if done:
                return
            done = True
            self.total -= 1
            left = self.by_tenant.get(tenant, 1) - 1
            if left > 0:
                self.by_tenant[tenant] = left
            else:
                self.by_tenant.pop(tenant, None)

        return release


class TenantQuotas:
    def __init__(
        self,
        settings: QuotaSettings,
        clock: Callable[[], float] = time.monotonic,
        *,
        max_concurrent_rpcs: int | None = None,
    ) -> None:
        self._rate = settings.requests_per_second
        self._burst = float(
            settings.burst if settings.burst is not None else max(1, math.ceil(self._rate or 1.0))
        )
        self._max_answers = settings.max_in_flight_answers
        self._max_watches = settings.max_watches
        self._max_calls = max_concurrent_rpcs
        self._watch_share = settings.watch_share
        self._all_watches = (
            None
            if max_concurrent_rpcs is None
            # round(…, 6): 100 × 0.29 is 28.999999999999996, and means 29.
            else max(1, int(round(max_concurrent_rpcs * settings.watch_share, 6)))
        )
        self._clock = clock
        # tenant -> (tokens, when they were counted)
        self._buckets: dict[str, tuple[float, float]] = {}
        self._answers = _Counts()
        self._watches = _Counts()

    @property
    def enabled(self) -> bool:
        return (
            self._rate is not None
            or self._max_answers is not None
            or self._max_watches is not None
            or self._all_watches is not None
        )

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
        if method in WATCH_METHODS:
            return self.watch(tenant)
        if self._max_answers is None or method not in ANSWER_METHODS:
            return _nothing
        running = self._answers.by_tenant.get(tenant, 0)
        if running >= self._max_answers:
            raise ResourceExhausted(
                f"tenant {tenant!r} already has {running} answers in flight "
                f"(quota {self._max_answers})",
                retry_after=1.0,
            )
        return self._answers.take(tenant)

    def watch(self, tenant: str) -> Callable[[], None]:
        """Count an open watch of ``tenant``; returns its release (ResourceExhausted
        over the tenant's or the server's cap)."""
        open_ = self._watches.by_tenant.get(tenant, 0)
        cap = self._max_watches
        if tenant == UNAUTHENTICATED and self._all_watches is not None:
            # Callers without a credential share a quarter of the server's
            # watches at most: they can never take every tenant's.
            cap = min(cap or self._all_watches, max(1, self._all_watches // 4))
        if cap is not None and open_ >= cap:
            raise ResourceExhausted(
                f"tenant {tenant!r} already has {open_} Watch/WatchJob streams open "
                f"(quota {cap}): watch fewer jobs at once, or poll with Get/GetJob",
                retry_after=5.0,
            )
        if self._all_watches is not None and self._watches.total >= self._all_watches:
            raise ResourceExhausted(
                f"this server already has {self._watches.total} Watch/WatchJob streams open, "
                f"its limit ({self._watch_share:g} of its {self._max_calls} concurrent calls): "
                "poll with Get/GetJob, or watch again later",
                retry_after=5.0,
            )
        return self._watches.take(tenant)
