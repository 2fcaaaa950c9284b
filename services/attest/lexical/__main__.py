"""Run the lexical service: ``python -m attest.lexical`` (settings from ATTEST_LEXICAL_*)."""

from __future__ import annotations

import asyncio

from attest.core.logging import configure_logging
from attest.core.server import serve
from attest.lexical.servicer import LexicalServicer
from attest.lexical.settings import LexicalSettings


def main() -> None:
    settings = LexicalSettings()
    configure_logging(settings.logging)
    asyncio.run(serve([LexicalServicer(settings)], settings.server))


if __name__ == "__main__":
    main()
