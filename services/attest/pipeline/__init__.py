"""Celery over Redis: the queued stages of Attest (thin, idempotent tasks)."""
