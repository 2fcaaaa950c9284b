"""Structured JSON logs with the request id, tenant and RPC of the current call."""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter

from attest.core.context import request_id_var, tenant_var
from attest.core.settings import LoggingSettings


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        record.tenant = tenant_var.get()
        return True


def configure_logging(settings: LoggingSettings) -> None:
    """Route every logger to stderr, as JSON lines unless told otherwise."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ContextFilter())
    if settings.json_format:
        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s %(tenant)s",
                rename_fields={"levelname": "level", "asctime": "time"},
            )
        )
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.level)
    # HTTP clients of the backends log every request at INFO.
    for noisy in ("opensearch", "elastic_transport", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
