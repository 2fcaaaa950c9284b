"""JobStore.send_once: a queued answer job is handed to the queue once, and a
Submit is told the truth about whether it was."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from attest.answer.jobs import SEND_CLAIM_SECONDS, JobStore


class _Redis:
    """The three calls send_once makes, on a dict; ``fail_marker`` makes writing
    the "sent" marker fail as a Redis outage would."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.expiry: dict[str, int] = {}
        self.fail_marker = False

    def set(self, key: str, value: bytes | str, *, nx: bool = False, ex: int | None = None) -> bool:
        if nx and key in self.data:
            return False
        value = value.encode() if isinstance(value, str) else value  # as Redis returns it
        if value == b"sent" and self.fail_marker:
            raise redis.ConnectionError("connection reset")
        self.data[key] = value
        if ex is not None:
            self.expiry[key] = ex
        return True

    def get(self, key: str) -> bytes | None:
        return self.data.get(key)

    def delete(self, key: str) -> int:
        return int(self.data.pop(key, None) is not None)

    def expire(self, key: str | bytes, seconds: int) -> bool:
        name = key.decode() if isinstance(key, bytes) else key
        self.expiry[name] = seconds
        return name in self.data


def _store() -> tuple[JobStore, _Redis]:
    store = JobStore.__new__(JobStore)
    fake = _Redis()
    store._r = fake  # type: ignore[assignment]
    store._retention = 86_400
    return store, fake


def test_sent_once_then_reported_as_sent_before() -> None:
    store, fake = _store()
    sent: list[int] = []
    assert store.send_once("t", "j", lambda: sent.append(1)) == "sent"
    assert store.send_once("t", "j", lambda: sent.append(2)) == "sent before"
    assert sent == [1]
    assert fake.expiry["attest:answer:sent:t:j"] == 86_400


def test_a_send_in_progress_elsewhere_is_not_reported_as_done() -> None:
    store, fake = _store()
    fake.data["attest:answer:sent:t:j"] = b"sending"  # another Submit is publishing
    assert store.send_once("t", "j", lambda: pytest.fail("sent twice")) == "sending"


def test_a_failed_send_is_forgotten_so_the_next_submit_sends() -> None:
    store, fake = _store()

    def down() -> Any:
        raise OSError("broker down")

    with pytest.raises(OSError, match="broker down"):
        store.send_once("t", "j", down)
    assert "attest:answer:sent:t:j" not in fake.data
    sent: list[int] = []
    assert store.send_once("t", "j", lambda: sent.append(1)) == "sent"
    assert sent == [1]


def test_a_marker_that_cannot_be_written_does_not_undo_a_send() -> None:
    store, fake = _store()
    fake.fail_marker = True
    sent: list[int] = []
    assert store.send_once("t", "j", lambda: sent.append(1)) == "sent"
    # The claim stays until it expires: until then a retry is told it is in hand.
    assert fake.data["attest:answer:sent:t:j"] == b"sending"
    assert fake.expiry["attest:answer:sent:t:j"] == SEND_CLAIM_SECONDS
    assert store.send_once("t", "j", lambda: sent.append(2)) == "sending"
    assert sent == [1]


class _Jobs:
    """run_job's store: one QUEUED job in memory, leases as a set."""

    def __init__(self) -> None:
        from attest.answer.v1 import answer_pb2

        self.job = answer_pb2.Job(job_id="j", state=answer_pb2.JOB_STATE_QUEUED, question="q")
        self.job.created_at.GetCurrentTime()
        self.leases: set[str] = set()

    def __call__(self, settings: object) -> _Jobs:
        return self

    def get(self, tenant: str, job_id: str) -> Any:
        from attest.answer.v1 import answer_pb2

        copy = answer_pb2.Job()
        copy.CopyFrom(self.job)
        return copy

    def put(self, tenant: str, job: Any) -> None:
        self.job.CopyFrom(job)

    def lease(self, key: str, seconds: int) -> bool:
        if key in self.leases:
            return False
        self.leases.add(key)
        return True

    def release(self, key: str) -> None:
        self.leases.discard(key)

    def close(self) -> None:
        pass


def test_a_job_another_worker_runs_is_left_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from attest.answer import jobs
    from attest.answer.settings import AnswerSettings
    from attest.answer.v1 import answer_pb2

    store = _Jobs()
    runs: list[str] = []

    async def answered(settings: object, tenant: str, job: Any) -> Any:
        runs.append(job.job_id)
        return answer_pb2.Answer(text="done")

    monkeypatch.setattr(jobs, "JobStore", store)
    monkeypatch.setattr(jobs, "answer_job", answered)
    settings = AnswerSettings()
    store.leases.add("attest:answer:run:t:j")  # a worker is on it
    assert jobs.run_job(settings, "t", "j", last_attempt=False) is False
    assert runs == []
    assert store.job.state == answer_pb2.JOB_STATE_QUEUED
    assert store.job.attempts == 0
    store.leases.clear()  # it ended (or its lease lapsed)
    assert jobs.run_job(settings, "t", "j", last_attempt=False) is True
    assert runs == ["j"]
    assert store.job.state == answer_pb2.JOB_STATE_DONE
    assert store.leases == set(), "the lease is given back"
    # Delivered once more after it finished: left as it is.
    assert jobs.run_job(settings, "t", "j", last_attempt=False) is True
    assert runs == ["j"]


def test_an_idempotency_key_lasts_as_long_as_its_job() -> None:
    from attest.answer.v1 import answer_pb2

    store, fake = _store()
    job, created = store.create("t", "q?", answer_pb2.AskOptions(), "k1")
    assert created
    again, created = store.create("t", "q?", answer_pb2.AskOptions(), "k1")
    assert (again.job_id, created) == (job.job_id, False)
    # It finishes late: its key is kept from then on, as long as the job is.
    fake.expiry["attest:answer:idem:t:k1"] = 5  # what was left of the first retention
    job.state = answer_pb2.JOB_STATE_DONE
    store.put("t", job)
    assert fake.expiry["attest:answer:idem:t:k1"] == 86_400


def test_a_key_whose_job_is_being_recorded_is_not_taken_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from attest.answer import jobs
    from attest.answer.v1 import answer_pb2

    store, fake = _store()
    first, _ = store.create("t", "q?", answer_pb2.AskOptions(), "k2")
    record = fake.data.pop(f"attest:answer:job:t:{first.job_id}")
    # The first Submit set the key and writes its job while the second looks.
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:
            fake.data[f"attest:answer:job:t:{first.job_id}"] = record

    monkeypatch.setattr(jobs.time, "sleep", sleep)
    second, created = store.create("t", "q?", answer_pb2.AskOptions(), "k2")
    assert (second.job_id, created) == (first.job_id, False)
    assert fake.data["attest:answer:idem:t:k2"] == first.job_id.encode()
    assert slept == [0.0, 0.05, 0.1]
