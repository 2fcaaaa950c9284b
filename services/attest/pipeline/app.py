"""The Celery application: delivery settings that lose nothing."""

from __future__ import annotations

from celery import Celery

from attest.core import tracing
from attest.pipeline.queues import QUEUE_EMBED, QUEUE_ENRICH, QUEUE_INDEX, QUEUES
from attest.pipeline.settings import PipelineSettings

__all__ = ["QUEUES", "QUEUE_EMBED", "QUEUE_ENRICH", "QUEUE_INDEX", "create_app"]


def create_app(settings: PipelineSettings) -> Celery:
    app = Celery("attest")
    app.conf.update(
        broker_url=settings.broker_url.get_secret_value(),
        result_backend=settings.result_backend_url.get_secret_value(),
        result_expires=settings.result_expires_seconds,
        # Acknowledge after the task ran, and give the task back to the queue
        # when its worker dies, so an acknowledged task has always finished.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout_seconds,
            # Sweep for tasks whose worker vanished (their visibility timeout
            # passed) a few times per timeout, not every 100 s (kombu's default).
            "unacked_restore_interval": max(1, min(10, settings.visibility_timeout_seconds // 4)),
            "unacked_restore_throttle": 1,
        },
        result_backend_transport_options={
            "visibility_timeout": settings.visibility_timeout_seconds
        },
        # One task at a time per worker process: late acks with a deep
        # prefetch would hold many unacknowledged tasks hostage (and an
        # embedding batch occupies every core anyway).
        worker_prefetch_multiplier=1,
        task_default_queue=QUEUE_INDEX,
        task_routes={
            "attest.index_documents": {"queue": QUEUE_INDEX},
            "attest.ingest.enrich": {"queue": QUEUE_ENRICH},
            "attest.ingest.embed": {"queue": QUEUE_EMBED},
            "attest.ingest.index": {"queue": QUEUE_INDEX},
        },
        # Sending a task (from the ingest service or from the previous stage)
        # waits for the broker through a restart instead of failing the batch.
        task_publish_retry=True,
        task_publish_retry_policy={
            "max_retries": max(1, int(settings.publish_retry_seconds / 2)),
            "interval_start": 0.2,
            "interval_step": 0.5,
            "interval_max": 2.0,
        },
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    app.conf["attest_settings"] = settings
    # Trace context and the request id travel in each task's headers.
    tracing.instrument_celery()
    from attest.pipeline import answer, ingest, tasks

    tasks.register(app)
    ingest.register(app)
    answer.register(app)
    return app
