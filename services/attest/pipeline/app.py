"""The Celery application: delivery settings that lose nothing."""

from __future__ import annotations

from celery import Celery

from attest.pipeline.settings import PipelineSettings

QUEUE_INDEX = "index"


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
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_seconds},
        result_backend_transport_options={
            "visibility_timeout": settings.visibility_timeout_seconds
        },
        # One task at a time per worker process: late acks with a deep
        # prefetch would hold many unacknowledged tasks hostage.
        worker_prefetch_multiplier=1,
        task_default_queue=QUEUE_INDEX,
        task_routes={"attest.index_documents": {"queue": QUEUE_INDEX}},
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    app.conf["attest_settings"] = settings
    from attest.pipeline import tasks

    tasks.register(app)
    return app
