"""Run the lexical service: ``python -m attest.lexical`` (settings from ATTEST_LEXICAL_*)."""

from __future__ import annotations

import asyncio

from attest.core.logging import configure_logging
from attest.core.server import Server
from attest.lexical.servicer import LexicalServicer
from attest.lexical.settings import LexicalSettings


def main() -> None:
    settings = LexicalSettings()
    configure_logging(settings.logging)
    server = Server([LexicalServicer(settings)], settings.server)
    asyncio.run(server.run_until_signal())


if __name__ == "__main__":
    main()
