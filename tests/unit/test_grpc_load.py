"""The load-test report logic: ghz results, saturation, ramp end and SLO verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.grpc_load import (
    SCENARIOS,
    Level,
    LoadTestError,
    Slo,
    calls_per_level,
    check_slo,
    concurrency_levels,
    load_slo,
    parse_ghz,
    ramp_is_over,
    saturation_index,
    status_name,
)

GHZ_REPORT = {
    "count": 1000,
    "total": 2_000_000_000,
    "rps": 500.0,
    "latencyDistribution": [
        {"percentage": 10, "latency": 1_000_000},
        {"percentage": 50, "latency": 2_500_000},
        {"percentage": 95, "latency": 9_000_000},
        {"percentage": 99, "latency": 20_000_000},
    ],
    "statusCodeDistribution": {"OK": 990, "Unavailable": 6, "DeadlineExceeded": 4},
    "errorDistribution": {"rpc error: code = Unavailable desc = x": 6},
}


def level(concurrency: int, rps: float, p99: float = 10.0, errors: int = 0) -> Level:
    statuses = {"OK": 1000} | ({"UNAVAILABLE": errors} if errors else {})
    return Level(concurrency, 1000 + errors, 2.0, rps, 1.0, 5.0, p99, statuses, {})


def test_ghz_report_becomes_a_level_with_grpc_status_names() -> None:
    parsed = parse_ghz(GHZ_REPORT, concurrency=8)
    assert parsed.concurrency == 8
    assert parsed.requests == 1000
    # throughput counts successful calls only: 990 in 2 s
    assert parsed.rps == pytest.approx(495.0)
    assert (parsed.p50_ms, parsed.p95_ms, parsed.p99_ms) == (2.5, 9.0, 20.0)
    assert parsed.statuses == {"OK": 990, "UNAVAILABLE": 6, "DEADLINE_EXCEEDED": 4}
    assert parsed.error_rate == pytest.approx(0.01)


def test_status_names_follow_grpc_spelling() -> None:
    assert status_name("ResourceExhausted") == "RESOURCE_EXHAUSTED"
    assert status_name("OK") == "OK"
    assert status_name("Internal") == "INTERNAL"


def test_saturation_is_the_lowest_level_within_gain_of_the_peak() -> None:
    levels = [level(1, 100), level(2, 190), level(4, 300), level(8, 320), level(16, 310)]
    assert saturation_index(levels, gain=0.10) == 2
    growing = [level(1, 100), level(2, 200), level(4, 400)]
    assert saturation_index(growing, gain=0.10) == 2
    # a noisy dip at concurrency 2 does not hide the gain at 4
    noisy = [level(1, 550), level(2, 500), level(4, 720), level(8, 640), level(16, 510)]
    assert saturation_index(noisy, gain=0.10) == 2
    flat = [level(1, 38), level(2, 32), level(4, 30)]
    assert saturation_index(flat, gain=0.10) == 0


def test_ramp_ends_after_two_levels_without_gain() -> None:
    levels = [level(1, 100), level(2, 190), level(4, 300), level(8, 320)]
    assert not ramp_is_over(levels, gain=0.10)
    assert ramp_is_over([*levels, level(16, 305)], gain=0.10)
    assert not ramp_is_over([*levels, level(16, 400)], gain=0.10)


def test_slo_is_judged_up_to_saturation_only() -> None:
    levels = [level(1, 100, p99=20), level(2, 180, p99=40), level(4, 185, p99=900, errors=50)]
    slo = Slo(max_p99_ms=100, max_error_rate=0.001, min_rps=150)
    assert check_slo(levels, 1, slo) == []
    broken = check_slo(levels, 2, slo)
    assert any("p99 900" in b for b in broken)
    assert any("error rate" in b for b in broken)
    assert check_slo(levels, 0, slo) == ["throughput at saturation 100.0/s < 150/s"]


def test_slo_file_names_each_scenario(tmp_path: Path) -> None:
    path = tmp_path / "slo.json"
    path.write_text(json.dumps({"bm25": {"max_p99_ms": 50, "max_error_rate": 0, "min_rps": 10}}))
    assert load_slo(path, "bm25") == Slo(50.0, 0.0, 10.0)
    with pytest.raises(LoadTestError, match="no objectives for scenario 'dense'"):
        load_slo(path, "dense")


def test_shipped_slo_file_covers_every_scenario() -> None:
    path = Path(__file__).resolve().parents[2] / "loadtest" / "slo.json"
    for name in SCENARIOS:
        assert load_slo(path, name).max_error_rate < 0.05


def test_concurrency_ramp_doubles_up_to_the_maximum() -> None:
    assert concurrency_levels(64) == [1, 2, 4, 8, 16, 32, 64]
    assert concurrency_levels(48) == [1, 2, 4, 8, 16, 32, 48]
    assert concurrency_levels(1) == [1]
    assert calls_per_level(250.0, 10) == 2500


def test_scenario_requests_match_their_protos() -> None:
    from google.protobuf import json_format

    from attest.answer.v1 import answer_pb2
    from attest.lexical.v1 import lexical_pb2
    from attest.semantic.v1 import semantic_pb2

    messages = {
        "bm25": lexical_pb2.SearchRequest,
        "dense": semantic_pb2.SearchRequest,
        "ask": answer_pb2.AskRequest,
    }
    for name, message in messages.items():
        parsed = json_format.ParseDict(SCENARIOS[name].request("oil prices", 10), message())
        assert parsed.ByteSize() > 0
    dense = json_format.ParseDict(SCENARIOS["dense"].request("q", 5), semantic_pb2.SearchRequest())
    assert dense.mode == semantic_pb2.SEARCH_MODE_DENSE
    assert dense.top_k == 5
