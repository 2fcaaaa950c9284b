"""The gRPC metadata keys Attest's clients and servers exchange.

Kept apart from the server side (``auth``, ``interceptors``) so that a client
(``attest.client`` and the channels of ``attest.core.channels``) imports no
server code: the ``attest-client`` distribution ships this module, not those.
"""

from __future__ import annotations

from typing import Final

#: A bearer token (API key or JWT): ``authorization: Bearer <token>``.
AUTHORIZATION_KEY: Final = "authorization"
#: An API key sent on its own.
API_KEY_KEY: Final = "x-api-key"
#: The tenant a service identity acts for.
TENANT_KEY: Final = "x-attest-tenant"
#: The request id, sent by the caller and echoed in the trailers.
REQUEST_ID_KEY: Final = "x-request-id"
#: Seconds to wait before retrying, a trailer of RESOURCE_EXHAUSTED.
RETRY_AFTER_KEY: Final = "retry-after"


def retry_after_trailer(seconds: float) -> tuple[str, str]:
    """The ``retry-after`` trailer for a wait of ``seconds``: to the millisecond,
    and never 0, which a client could read as "retry at once"."""
    return (RETRY_AFTER_KEY, f"{max(seconds, 0.001):.3f}")
