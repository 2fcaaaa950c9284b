"""Run the knowledge service: ``python -m attest.knowledge`` (settings from ATTEST_KNOWLEDGE_*)."""

from __future__ import annotations

import asyncio

from attest.core.logging import configure_logging
from attest.core.server import serve
from attest.knowledge.servicer import service


def main() -> None:
    servicer, server, logging = service()
    configure_logging(logging)
    asyncio.run(serve([servicer], server))


if __name__ == "__main__":
    main()
