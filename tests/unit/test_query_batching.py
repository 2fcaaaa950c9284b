"""Concurrent query encodes: forward passes side by side on the cores, and the
texts that wait for a free pass leave together in one batch."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from attest.semantic import embedding
from attest.semantic.embedding import Embedder, QueryBatcher

QUERIES = [
    "What similarity laws must be obeyed when constructing aeroelastic models?",
    "greenhouse gas emissions",
    "How do the supply chain's emissions compare with the company's own?",
    "x",
    "quarterly dividend declared by the board in 2023",
    "heat transfer at hypersonic speeds in a boundary layer",
]


class Gate:
    """An encode that records each call's texts and holds the first call until
    released, so the others queue behind it."""

    def __init__(self, *, fail_on: str | None = None) -> None:
        self.calls: list[list[str]] = []
        self.release = threading.Event()
        self.entered = threading.Event()
        self.fail_on = fail_on
        self._lock = threading.Lock()

    def __call__(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            self.calls.append(list(texts))
            first = len(self.calls) == 1
        if first:
            self.entered.set()
            assert self.release.wait(10)
        if self.fail_on is not None and self.fail_on in texts:
            raise ValueError(f"cannot encode {self.fail_on!r}")
        # A text's vector says which text it was: its length, and its first letter.
        return np.array([[len(t), ord(t[0]) if t else 0] for t in texts], dtype=np.float32)


async def held(gate: Gate, batcher: QueryBatcher, texts: list[str]) -> list[object]:
    """Encode ``texts`` at once while the gate holds the first call."""
    first = asyncio.create_task(batcher.encode("first"))
    await asyncio.to_thread(gate.entered.wait, 10)
    rest = [asyncio.create_task(batcher.encode(t)) for t in texts]
    await asyncio.sleep(0.05)  # every one of them queued behind the first
    gate.release.set()
    return await asyncio.gather(first, *rest, return_exceptions=True)


def test_texts_that_arrive_while_the_encoder_is_busy_leave_in_one_batch() -> None:
    gate = Gate()

    async def main() -> list[object]:
        batcher = QueryBatcher(gate, asyncio.get_running_loop(), slots=1, max_batch=16)
        out = await held(gate, batcher, ["alpha", "be", "gamma ray"])
        assert (batcher.batches, batcher.texts) == (2, 4)
        return out

    out = asyncio.run(main())
    assert gate.calls == [["first"], ["alpha", "be", "gamma ray"]]
    # Each caller gets its own text's vector back.
    assert [list(v) for v in out] == [  # type: ignore[call-overload]
        [5, ord("f")],
        [5, ord("a")],
        [2, ord("b")],
        [9, ord("g")],
    ]


def test_a_batch_holds_at_most_max_batch_texts() -> None:
    gate = Gate()

    async def main() -> None:
        batcher = QueryBatcher(gate, asyncio.get_running_loop(), slots=1, max_batch=2)
        await held(gate, batcher, ["a", "b", "c", "d", "e"])

    asyncio.run(main())
    assert [len(c) for c in gate.calls] == [1, 2, 2, 1]


def run_four(min_fill: int) -> tuple[list[list[str]], int]:
    """Four texts at once over two slots. Returns the passes (the first two in
    the order they were handed out, which two threads may swap) and the most
    that ran at the same time."""
    calls: list[list[str]] = []
    running = 0
    most = 0
    lock = threading.Lock()
    both = threading.Event()

    def slow(texts: list[str]) -> np.ndarray:
        nonlocal running, most
        with lock:
            calls.append(texts)
            running += 1
            most = max(most, running)
            if running == 2:
                both.set()
        # The first two passes wait for each other, so they overlap however
        # busy the machine is.
        both.wait(10)
        time.sleep(0.05)
        with lock:
            running -= 1
        return np.zeros((len(texts), 2), dtype=np.float32)

    async def main() -> None:
        batcher = QueryBatcher(
            slow, asyncio.get_running_loop(), slots=2, max_batch=16, min_fill=min_fill
        )
        await asyncio.gather(*(batcher.encode(t) for t in ["a", "b", "c", "d"]))

    asyncio.run(main())
    return calls, most


def test_a_second_pass_starts_for_two_waiting_texts_and_a_lone_one_waits() -> None:
    calls, most = run_four(min_fill=2)
    # "a" starts alone; "b" waits for company, and leaves with "c" on the
    # second slot; "d", alone again, waits for a pass to end.
    assert sorted(calls[:2]) == [["a"], ["b", "c"]]
    assert calls[2:] == [["d"]]
    assert most == 2


def test_with_min_fill_1_every_free_slot_starts_at_once() -> None:
    calls, most = run_four(min_fill=1)
    assert sorted(calls[:2]) == [["a"], ["b"]]
    assert calls[2:] == [["c", "d"]]
    assert most == 2


def test_one_text_that_cannot_be_encoded_fails_only_its_caller() -> None:
    gate = Gate(fail_on="bad")

    async def main() -> list[object]:
        batcher = QueryBatcher(gate, asyncio.get_running_loop(), slots=1, max_batch=16)
        return await held(gate, batcher, ["good", "bad", "fine"])

    first, good, bad, fine = asyncio.run(main())
    assert isinstance(bad, ValueError)
    assert "bad" in str(bad)
    assert [list(v) for v in (first, good, fine)] == [  # type: ignore[call-overload]
        [5, ord("f")],
        [4, ord("g")],
        [4, ord("f")],
    ]
    # The failed batch was retried one text at a time.
    assert gate.calls[1] == ["good", "bad", "fine"]
    assert gate.calls[2:] == [["good"], ["bad"], ["fine"]]


def test_a_caller_cancelled_while_waiting_leaves_its_batch() -> None:
    gate = Gate()

    async def main() -> None:
        batcher = QueryBatcher(gate, asyncio.get_running_loop(), slots=1, max_batch=16)
        first = asyncio.create_task(batcher.encode("first"))
        await asyncio.to_thread(gate.entered.wait, 10)
        gone = asyncio.create_task(batcher.encode("gone"))
        kept = asyncio.create_task(batcher.encode("kept"))
        await asyncio.sleep(0.05)
        gone.cancel()
        gate.release.set()
        await first
        assert list(await kept) == [4, ord("k")]
        with pytest.raises(asyncio.CancelledError):
            await gone

    asyncio.run(main())
    assert gate.calls == [["first"], ["kept"]]


def test_a_batcher_refuses_zero_slots_batch_or_fill() -> None:
    loop = asyncio.new_event_loop()
    try:
        for slots, batch, fill in ((0, 4, 2), (1, 0, 2), (1, 4, 0)):
            with pytest.raises(ValueError, match="at least 1"):
                QueryBatcher(Gate(), loop, slots=slots, max_batch=batch, min_fill=fill)
    finally:
        loop.close()


def test_onnx_runs_as_many_passes_at_once_as_fit_the_cores(
    model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loaded = Embedder(backend="onnx")._model()
    assert loaded.onnx is not None
    file = loaded.onnx.path
    monkeypatch.setattr(embedding, "available_cpus", lambda: 4)
    tokenize = embedding._fast_tokenizer(embedding.resolve_model_path(embedding.PACKAGED_MINILM))
    assert tokenize is not None

    def encoder(threads: int) -> embedding.OnnxEncoder:
        return embedding.OnnxEncoder(None, file, threads=threads, tokenize=tokenize, dimension=384)

    assert encoder(1).slots == 4
    assert encoder(2).slots == 2
    assert encoder(8).slots == 1


@pytest.mark.parametrize("tokenizer", ["sentence-transformers", "tokenizer.json"])
def test_concurrent_onnx_encodes_give_each_text_its_own_vector(
    model_cache: Path, tokenizer: str
) -> None:
    loaded = Embedder(backend="onnx")._model()
    assert loaded.onnx is not None
    if tokenizer == "sentence-transformers":
        # The model itself (a process may have loaded the export without it).
        model = Embedder(backend="torch")._model().model
        encoder = embedding.OnnxEncoder(model, loaded.onnx.path)
    else:
        tokenize = embedding._fast_tokenizer(
            embedding.resolve_model_path(embedding.PACKAGED_MINILM)
        )
        encoder = embedding.OnnxEncoder(None, loaded.onnx.path, tokenize=tokenize, dimension=384)
    alone = np.stack([encoder.encode([q], 2)[0] for q in QUERIES])
    results: dict[int, np.ndarray] = {}

    def run(i: int) -> None:
        for _ in range(5):
            results[i] = encoder.encode(QUERIES[i:] + QUERIES[:i], 2)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, vectors in results.items():
        expected = np.roll(alone, -i, axis=0)
        assert np.abs(vectors - expected).max() < 1e-5


def test_aencode_one_batches_concurrent_queries_with_the_same_vectors(model_cache: Path) -> None:
    embedder = Embedder(backend="onnx", query_batch_size=16)
    single = Embedder(backend="onnx", query_batch_size=1)
    alone = embedder.encode(QUERIES)

    async def main() -> tuple[list[np.ndarray], list[np.ndarray]]:
        many = await asyncio.gather(*(embedder.aencode_one(q) for q in QUERIES * 4))
        one = [await single.aencode_one(q) for q in QUERIES]
        return list(many), one

    many, one = asyncio.run(main())
    assert np.abs(np.stack(many) - np.tile(alone, (4, 1))).max() < 1e-5
    assert np.abs(np.stack(one) - alone).max() < 1e-5
    assert single._batcher is None
    batcher = embedder._batcher
    assert batcher is not None
    assert batcher.texts == 24
    # 24 queries at once over the encoder's slots: fewer passes than queries.
    assert batcher.batches < 24


def test_a_pass_that_cannot_start_fails_its_callers_instead_of_hanging() -> None:
    gate = Gate()
    gate.release.set()

    async def main() -> None:
        batcher = QueryBatcher(gate, asyncio.get_running_loop(), slots=1, max_batch=4)
        assert list(await batcher.encode("ok")) == [2, ord("o")]
        batcher.close()  # its threads are gone: no pass can start
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(batcher.encode("late"), 5)
        # Nothing counts as running, so it does not wedge the next caller either.
        with pytest.raises(RuntimeError):
            await asyncio.wait_for(batcher.encode("later"), 5)

    asyncio.run(main())


@pytest.mark.parametrize(
    ("cpu_max", "expected"),
    [("max 100000\n", 4), ("200000 100000\n", 2), ("150000 100000\n", 2), ("50000 100000", 1)],
)
def test_available_cpus_honours_the_cgroup_quota(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cpu_max: str, expected: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.delenv("PYTHON_CPU_COUNT", raising=False)
    quota = tmp_path / "cpu.max"
    quota.write_text(cpu_max)
    assert embedding.available_cpus(quota, tmp_path / "no-v1") == expected
    assert embedding.available_cpus(tmp_path / "missing", tmp_path / "no-v1") == 4


@pytest.mark.parametrize(
    ("cfs_quota", "cfs_period", "expected"),
    [("-1", "100000", 4), ("200000", "100000", 2), ("150000", "100000", 2), ("junk", "1", 4)],
)
def test_available_cpus_reads_a_cgroup_v1_quota_without_cpu_max(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cfs_quota: str, cfs_period: str, expected: int
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.delenv("PYTHON_CPU_COUNT", raising=False)
    cfs = tmp_path / "cpu"
    cfs.mkdir()
    (cfs / "cpu.cfs_quota_us").write_text(cfs_quota + "\n")
    (cfs / "cpu.cfs_period_us").write_text(cfs_period + "\n")
    assert embedding.available_cpus(tmp_path / "no-cpu.max", cfs) == expected


@pytest.mark.parametrize(
    ("hint", "cpu_max", "expected"),
    [
        ("2", "max 100000", 2),  # a pod with a request and no limit: its share, not the node's
        ("8", "max 100000", 8),
        ("8", "200000 100000", 2),  # still capped by a quota
        ("128", "max 100000", 64),  # and by the affinity
        ("default", "max 100000", 64),
        ("0", "max 100000", 64),
        ("two", "max 100000", 64),
        ("\u00b2", "max 100000", 64),  # str.isdigit() says yes; int() says no
        ("\u0663", "max 100000", 64),  # an Arabic-Indic 3
        ("2.0", "max 100000", 64),
        (" 3 ", "max 100000", 3),
    ],
)
def test_available_cpus_takes_python_cpu_count_before_the_affinity(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    hint: str,
    cpu_max: str,
    expected: int,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setenv("PYTHON_CPU_COUNT", hint)
    quota = tmp_path / "cpu.max"
    quota.write_text(cpu_max)
    with caplog.at_level("WARNING", logger=embedding.__name__):
        assert embedding.available_cpus(quota, tmp_path / "no-v1") == expected
    ignored = hint.strip() not in ("2", "8", "128", "default", "3")
    assert ("PYTHON_CPU_COUNT" in caplog.text) == ignored


def test_the_machine_size_is_not_python_cpu_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """From CPython 3.13, os.cpu_count() returns PYTHON_CPU_COUNT: a process held
    to 2 CPUs by it would then look like the whole machine, and ONNX Runtime
    would take its default pool of every core."""
    monkeypatch.setattr(os, "sysconf", lambda name: 64)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # as 3.13 with PYTHON_CPU_COUNT=2
    assert embedding._machine_cpus() == 64
    monkeypatch.setattr(embedding, "available_cpus", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)  # type: ignore[arg-type]
    assert embedding._default_threads() == 2


class _Torch:
    def __init__(self, threads: int) -> None:
        self.threads = threads

    def get_num_threads(self) -> int:
        return self.threads


@pytest.mark.parametrize(
    ("omp", "torch_threads", "cpus", "machine", "expected"),
    [
        (None, None, 2, 64, 2),  # a container limited to 2 CPUs: its quota, not the node's cores
        (None, None, 64, 64, 0),  # the whole machine: ONNX Runtime's own default
        (None, None, 2, None, 0),  # the machine's size unknown: Runtime's default
        ("1", None, 2, 64, 1),  # OMP_NUM_THREADS, when set, decides
        ("0", None, 2, 64, 0),  # ... 0 included: Runtime's default
        ("junk", None, 2, 64, 2),
        (None, 32, 2, 64, 2),  # torch's count is the node's too: capped by the quota
        (None, 1, 2, 64, 1),
        (None, 8, 64, 64, 8),  # torch's count on the whole machine
    ],
)
def test_onnx_threads_default_to_the_cpus_the_process_may_use(
    monkeypatch: pytest.MonkeyPatch,
    omp: str | None,
    torch_threads: int | None,
    cpus: int,
    machine: int | None,
    expected: int,
) -> None:
    # None in sys.modules: any import of torch here fails instead of loading it twice.
    torch = _Torch(torch_threads) if torch_threads is not None else None
    monkeypatch.setitem(sys.modules, "torch", torch)  # type: ignore[arg-type]
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    monkeypatch.setattr(embedding, "available_cpus", lambda: cpus)
    monkeypatch.setattr(embedding, "_machine_cpus", lambda: machine)
    assert embedding._default_threads() == expected
