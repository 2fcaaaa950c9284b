"""The overload benchmark's verdicts, from calls made up for the purpose."""

from __future__ import annotations

from loadtest.bench_overload import Call, summarize_burst


def verdicts(calls: list[Call], after: list[Call]) -> dict[str, bool]:
    summary = summarize_burst(64, calls, after, 20.0, single_p50=2.0, four_p50=5.0)
    return {name: t["met"] for name, t in summary["targets"].items()}


def test_a_burst_shed_at_the_door_meets_every_target() -> None:
    calls = [Call(n, 0.0, 5.0 + n, "OK") for n in range(4)]
    calls += [Call(n, 0.0, 0.02, "RESOURCE_EXHAUSTED", retry_after_s=1.0) for n in range(60)]
    after = [Call(0, 0.0, 2.1, "OK"), Call(0, 2.1, 1.9, "OK"), Call(0, 4.0, 2.0, "OK")]
    assert all(verdicts(calls, after).values())


def test_each_target_is_missed_on_its_own_evidence() -> None:
    calls = [Call(0, 0.0, 11.0, "OK"), Call(1, 0.0, 12.0, "OK", degraded=["RETRIEVE_BM25"])]
    calls += [Call(2, 0.0, 0.3, "RESOURCE_EXHAUSTED"), Call(3, 0.0, 5.0, "DEADLINE_EXCEEDED")]
    after = [Call(0, 0.0, 6.0, "OK"), Call(0, 6.0, 6.0, "OK")]
    assert verdicts(calls, after) == {
        "starved_unavailable": False,
        "refused_within_100ms_resource_exhausted": False,
        "accepted_p50_over_4_client_p50": False,
        "recovery_p50_over_single_p50": False,
    }
    summary = summarize_burst(64, calls, after, 20.0, single_p50=2.0, four_p50=5.0)
    assert summary["codes"] == {"OK": 2, "RESOURCE_EXHAUSTED": 1, "DEADLINE_EXCEEDED": 1}
    assert summary["first_normal_answer_s"] is None
