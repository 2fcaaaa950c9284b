"""Typed errors that carry their gRPC status.

Service cores raise these; one server interceptor turns them into a status
code and a message for the caller. The codes are names of ``grpc.StatusCode``
members so that cores never need to import grpc.
"""

from __future__ import annotations

from typing import ClassVar


class AttestError(Exception):
    """Base of every error a caller may see. Subclasses fix the status code."""

    code: ClassVar[str] = "INTERNAL"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        # The exception's text includes the field, so it survives being
        # rebuilt from its args (Celery results, pickling).
        super().__init__(f"{field}: {message}" if field else message)
        self.message = message
        self.field = field

    @property
    def details(self) -> str:
        """The text sent to the caller: the field first when there is one."""
        return f"{self.field}: {self.message}" if self.field else self.message


class InvalidArgument(AttestError):
    """The request is malformed; ``field`` names the offending field."""

    code = "INVALID_ARGUMENT"


class NotFound(AttestError):
    code = "NOT_FOUND"


class FailedPrecondition(AttestError):
    code = "FAILED_PRECONDITION"


class ResourceExhausted(AttestError):
    """Overload or a quota: the caller may retry later.

    ``retry_after`` (seconds), when known, reaches the caller as a
    ``retry-after`` trailer.
    """

    code = "RESOURCE_EXHAUSTED"

    def __init__(
        self, message: str, *, field: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message, field=field)
        self.retry_after = retry_after


class Unauthenticated(AttestError):
    """No credential, or one that is not valid (unknown, revoked, expired, wrong audience)."""

    code = "UNAUTHENTICATED"


class PermissionDenied(AttestError):
    """A valid credential that lacks the scope the method needs."""

    code = "PERMISSION_DENIED"


class Unavailable(AttestError):
    """A dependency (index, model server, queue) cannot be reached."""

    code = "UNAVAILABLE"


class DeadlineExceeded(AttestError):
    """The time budget of the request ran out."""

    code = "DEADLINE_EXCEEDED"


class Internal(AttestError):
    """A bug or an unexpected state; the message is for logs, not callers."""

    code = "INTERNAL"
