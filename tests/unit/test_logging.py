"""Structured logs carry the request id and tenant of the current call."""

from __future__ import annotations

import json
import logging

from attest.core.context import request_id_var, tenant_var
from attest.core.logging import configure_logging
from attest.core.settings import LoggingSettings


def test_json_log_lines_carry_request_context(capsys):
    configure_logging(LoggingSettings(level="INFO", json=True))
    t1 = request_id_var.set("abc123")
    t2 = tenant_var.set("acme")
    try:
        logging.getLogger("attest.test").info("indexed %d documents", 3)
    finally:
        request_id_var.reset(t1)
        tenant_var.reset(t2)
        logging.getLogger().handlers.clear()
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["message"] == "indexed 3 documents"
    assert line["request_id"] == "abc123"
    assert line["tenant"] == "acme"
    assert line["level"] == "INFO"
    assert line["name"] == "attest.test"
