"""Per-request context: request id, caller, tenant and deadline, in contextvars.

The server interceptor fills these for every RPC; logs, metrics and
downstream calls read them. Cores receive the tenant as an argument and never
read it from here, so they stay usable from Celery tasks.
"""

from __future__ import annotations

import time
import uuid
from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from attest.core.auth import Identity

from attest.core.errors import DeadlineExceeded

DEFAULT_TENANT = "default"

request_id_var: ContextVar[str | None] = ContextVar("attest_request_id", default=None)
tenant_var: ContextVar[str] = ContextVar("attest_tenant", default=DEFAULT_TENANT)
# The authenticated caller of the current request (None outside a request).
identity_var: ContextVar[Identity | None] = ContextVar("attest_identity", default=None)
# Absolute deadline on the time.monotonic() clock, or None for no deadline.
deadline_var: ContextVar[float | None] = ContextVar("attest_deadline", default=None)
# Seconds the caller's deadline left when the call arrived, before any work
# here: what a deadline is admitted on, so that the same deadline gets the same
# answer whichever method (and however much server work before the check).
granted_var: ContextVar[float | None] = ContextVar("attest_granted", default=None)


def new_request_id() -> str:
    return uuid.uuid4().hex


def remaining_seconds() -> float | None:
    """Seconds left before the current request's deadline, or None if unbounded."""
    deadline = deadline_var.get()
    if deadline is None:
        return None
    return deadline - time.monotonic()


def granted_seconds() -> float | None:
    """Seconds the current request's deadline left when it arrived, or None if unbounded."""
    return granted_var.get()


def budget(limit: float) -> float:
    """Timeout for a downstream call: ``limit`` capped by the request's deadline.

    Raises DeadlineExceeded when nothing is left, so that no call is started
    that could not finish in time.
    """
    left = remaining_seconds()
    if left is None:
        return limit
    if left <= 0:
        raise DeadlineExceeded("the request's deadline passed before a downstream call")
    return min(limit, left)
