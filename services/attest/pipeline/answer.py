"""The Celery task of queued answer jobs (queue ``answer``), a thin shell over answer.jobs."""

from __future__ import annotations

from celery import Celery, Task

from attest.answer.jobs import QUEUE, TASK, backoff, run_job
from attest.answer.settings import AnswerSettings


def register(app: Celery) -> None:
    app.conf.task_routes = {**(app.conf.task_routes or {}), TASK: {"queue": QUEUE}}

    @app.task(name=TASK, bind=True, max_retries=None)  # type: ignore[untyped-decorator]
    def run_answer_job(self: Task, tenant: str, job_id: str) -> None:
        """Run one job's pipeline; a dependency outage is retried with backoff.

        Retried only on Unavailable, and the job record counts the attempts, so a
        redelivered or retried task never runs a finished job again.
        """
        settings = AnswerSettings()
        retries = self.request.retries or 0
        last = retries + 1 >= settings.jobs.max_attempts
        if not run_job(settings, tenant, job_id, last_attempt=last):
            raise self.retry(countdown=backoff(settings, retries))
