"""The Celery queues of the pipeline (a module of its own, so that what sends to
them need not import the tasks)."""

from __future__ import annotations

QUEUE_INDEX = "index"
QUEUE_ENRICH = "enrich"
QUEUE_EMBED = "embed"
QUEUES = (QUEUE_ENRICH, QUEUE_EMBED, QUEUE_INDEX)
