"""The standalone Celery tasks' retry budget."""

from attest.pipeline.tasks import retries_for_window


def test_the_index_task_retries_for_the_whole_retry_window() -> None:
    # 600 s with waits capped at 60 s (30 s on average with jitter): 6 doubling
    # steps (31.5 s) and then 19 more of 30 s.
    assert retries_for_window(600, 60, 5) == 25
    assert retries_for_window(0, 60, 5) == 5
    assert retries_for_window(10, 60, 0) == 5  # 0.5 + 1 + 2 + 4 + 8 = 15.5 s
