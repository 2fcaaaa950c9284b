"""The answer pipeline's own overhead per answer, with a zero-latency LLM or a real one.

    python loadtest/bench_generate.py --answers 200 --concurrency 16
    python loadtest/bench_generate.py --protocol openai --url http://127.0.0.1:8080 \
        --answers 3 --no-system-role          # a real server (`attest serve llm`)

With ``--url`` the answers go to that server, one at a time, and the report
gives seconds per answer by step, the model's own time (inside its HTTP
requests, as the client measures it), tokens per second, and the pipeline's
overhead over the model's time: everything else the answer took (prompt
building, the support judge's embeddings, citation checks, re-search
bookkeeping), as a share of the model's time. Its sources are short news
sentences about one company, one answer re-searched at most once.

Without ``--url``:

A protocol-level fake TGI (or OpenAI-compatible) server runs in a separate
process and answers every request at once, so what is measured is everything
but model time: prompt building, HTTP round trips over loopback, JSON
parsing, validation of citations, re-search bookkeeping and event assembly.
Each answer uses 10 sources of about 600 characters, a 6-sentence answer
whose last sentence comes back weak (confidence 2), so it is re-searched
(3 sources found, 2 of them new). Reports p50/p99 latency per answer
sequentially, throughput with concurrent answers, and LLM calls per answer
against the bound N + 1 + ceil(S / batch) + R * (K + 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attest.generate.extractive import ExtractiveEngine
from attest.generate.llm import LLMSettings, create_client
from attest.generate.models import FinalEvent, Source
from attest.generate.pipeline import AnswerOptions, Generator, PipelineSettings
from attest.semantic.embedding import Embedder

SOURCES = 10
SENTENCES = 6
TOP_K = 3
ANSWER = " ".join(
    f"Finding {i} says Norvale Copper cut its emissions by {10 * i} percent." for i in range(1, 7)
)


def respond(prompt: str) -> str:
    """Deterministic replies per step; the last sentence of a full answer is weak."""
    if "Summarize the source" in prompt:
        return "A summary of the source in one sentence."
    if "Question:" in prompt:
        return ANSWER
    sentences = len(re.findall(r"^\d+\. ", prompt, re.M))
    sources = prompt.count("<source id=")
    citations = [
        {
            "sentence": k,
            "source": (k - 1) % sources + 1,
            "confidence": 2 if sentences > 1 and k == sentences else 8,
            "quote": "cut its emissions",
        }
        for k in range(1, sentences + 1)
    ]
    return json.dumps({"citations": citations})


def serve(flavor: str, ports: mp.Queue) -> None:  # type: ignore[type-arg]
    from tests.integration.fake_llm import FakeLLM

    async def main() -> None:
        server = await FakeLLM(flavor, respond).start()  # type: ignore[arg-type]
        ports.put(server.url)
        await asyncio.Event().wait()

    asyncio.run(main())


def sources() -> list[Source]:
    text = "Norvale Copper reported lower emissions at its smelter this year. " * 9
    return [Source(f"doc-{i}", text, 0) for i in range(SOURCES)]


async def search(query: str, top_k: int) -> list[Source]:
    known = sources()[0]
    return [known] + [
        Source(f"found-{i}", "Norvale Copper emissions fell again, filings show.", 0)
        for i in range(top_k - 1)
    ]


async def answer(generator: Generator) -> FinalEvent:
    final = None
    async for event in generator.answer(
        "How did Norvale Copper change its emissions?",
        sources(),
        AnswerOptions(research_top_k=TOP_K),
        search,
    ):
        final = event
    assert isinstance(final, FinalEvent)
    return final


async def run(url: str, flavor: str, answers: int, concurrency: int) -> dict[str, object]:
    settings = PipelineSettings(fallback_to_extractive=False)
    client = create_client(LLMSettings(kind=flavor, url=url, max_concurrency=64))  # type: ignore[arg-type]
    generator = Generator(ExtractiveEngine(Embedder()), client, settings)
    for _ in range(5):  # warm the connection pool
        await answer(generator)
    times = []
    finals = []
    for _ in range(answers):
        started = time.perf_counter()
        finals.append(await answer(generator))
        times.append((time.perf_counter() - started) * 1000)
    semaphore = asyncio.Semaphore(concurrency)

    async def bounded() -> None:
        async with semaphore:
            await answer(generator)

    started = time.perf_counter()
    await asyncio.gather(*(bounded() for _ in range(answers)))
    throughput = answers / (time.perf_counter() - started)
    await generator.close()
    times.sort()
    calls = [f.llm_calls for f in finals]
    bound = (
        SOURCES
        + 1
        + math.ceil(SENTENCES / settings.cite_batch_size)
        + AnswerOptions().max_researches * (TOP_K + 1)
    )
    return {
        "protocol": flavor,
        "answers": answers,
        "sources_per_answer": SOURCES,
        "sentences_per_answer": SENTENCES,
        "researches_per_answer": statistics.fmean(f.researches for f in finals),
        "overhead_ms_p50": round(statistics.median(times), 2),
        "overhead_ms_p99": round(times[min(len(times) - 1, int(len(times) * 0.99))], 2),
        "concurrency": concurrency,
        "answers_per_second": round(throughput, 1),
        "llm_calls_per_answer": statistics.fmean(calls),
        "llm_calls_max": max(calls),
        "llm_calls_bound": bound,
    }


REAL_SOURCES = [
    Source(
        "norvale-1",
        "Norvale Copper cut its carbon emissions by 30% in 2025. The cut came from "
        "electric haul trucks and a solar farm at its Atacama mine. The company "
        "said diesel use fell by a third. Its 2026 target is a further 15% cut.",
        0,
    ),
    Source(
        "norvale-2",
        "Norvale Copper runs two copper mines in northern Chile. It employs about "
        "4,000 people. Output rose 5% in 2025 to 310,000 tonnes. The company is "
        "listed in Toronto.",
        0,
    ),
    Source(
        "fennick-1",
        "Fennick Retail Group opened 40 stores in 2025. Its sales rose 8%. The "
        "group plans to publish its first emissions report in 2026. It sells "
        "clothing and home goods.",
        0,
    ),
]


async def real_search(query: str, top_k: int) -> list[Source]:
    found = Source("norvale-9", "Norvale Copper reported lower emissions at both of its mines.", 0)
    return [REAL_SOURCES[0], found][:top_k]


async def run_real(
    url: str, flavor: str, answers: int, system_role: bool, max_tokens: int
) -> dict[str, object]:
    from attest.generate.models import Step

    client = create_client(
        LLMSettings(
            kind=flavor,  # type: ignore[arg-type]
            url=url,
            response_format="json_object",
            system_role=system_role,
            max_new_tokens=max_tokens,
            max_concurrency=1,
            timeout_seconds=600,
            first_token_seconds=120,
            seconds_per_token=2.0,
        )
    )
    generator = Generator(ExtractiveEngine(Embedder()), client, PipelineSettings())
    generator.extractive.warm_up()
    seconds: list[float] = []
    model: list[float] = []
    tokens = 0
    calls: list[int] = []
    steps: dict[str, list[float]] = {step.value: [] for step in Step}
    modes: set[str] = set()
    degraded: set[str] = set()
    for _ in range(answers):
        model_before, tokens_before = client.model_seconds, client.completion_tokens
        started = time.perf_counter()
        final = None
        async for event in generator.answer(
            "How did Norvale Copper's emissions change in 2025?",
            REAL_SOURCES,
            AnswerOptions(max_researches=1, research_top_k=2, max_sentences=3),
            real_search,
        ):
            final = event
        assert isinstance(final, FinalEvent)
        seconds.append(time.perf_counter() - started)
        model.append(client.model_seconds - model_before)
        tokens += client.completion_tokens - tokens_before
        calls.append(final.llm_calls)
        took = {t.step.value: t.seconds for t in final.timings}
        for name, values in steps.items():
            values.append(took.get(name, 0.0))
        modes.add(final.mode.value)
        if final.degraded_reason:
            degraded.add(final.degraded_reason)
    await generator.close()
    overhead = sum(seconds) - sum(model)
    return {
        "protocol": flavor,
        "url": url,
        "answers": answers,
        "max_new_tokens": max_tokens,
        "seconds_per_answer": round(statistics.fmean(seconds), 2),
        "seconds_per_answer_by_step": {k: round(statistics.fmean(v), 2) for k, v in steps.items()},
        "model_seconds_per_answer": round(statistics.fmean(model), 2),
        "completion_tokens_per_second": round(tokens / sum(model), 2) if sum(model) else None,
        "llm_calls_per_answer": statistics.fmean(calls),
        "pipeline_overhead_seconds_per_answer": round(overhead / answers, 3),
        "pipeline_overhead_share_of_model_time": round(overhead / sum(model), 4)
        if sum(model)
        else None,
        "modes": sorted(modes),
        "degraded": sorted(degraded),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answers", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--protocol", choices=["tgi", "openai"], default="tgi")
    parser.add_argument("--target-ms", type=float, default=50.0, help="p50 overhead target.")
    parser.add_argument(
        "--output", type=Path, default=None, help="Report JSON (default under loadtest/reports/)."
    )
    parser.add_argument("--url", default="", help="A real LLM server instead of the fake one.")
    parser.add_argument(
        "--no-system-role",
        dest="system_role",
        action="store_false",
        help="--url: the model's chat template has no system role (Gemma).",
    )
    parser.add_argument("--max-tokens", type=int, default=96, help="--url: tokens per reply.")
    parser.add_argument(
        "--target-share", type=float, default=0.05, help="--url: overhead target, share."
    )
    args = parser.parse_args()
    if args.url:
        report = asyncio.run(
            run_real(args.url, args.protocol, args.answers, args.system_role, args.max_tokens)
        )
        report["target_share"] = args.target_share
        output = args.output or Path("loadtest/reports/generate-real.json")
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report, indent=2))
        if report["modes"] != ["llm"]:
            print("some answers did not run on the model", file=sys.stderr)
            return 1
        share = report["pipeline_overhead_share_of_model_time"]
        if not isinstance(share, float) or share > args.target_share:
            print(f"pipeline overhead above {args.target_share:.0%} of model time", file=sys.stderr)
            return 1
        return 0
    args.output = args.output or Path("loadtest/reports/generate-overhead.json")
    ports: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    server = mp.Process(target=serve, args=(args.protocol, ports), daemon=True)
    server.start()
    try:
        url = ports.get(timeout=30)
        report = asyncio.run(run(url, args.protocol, args.answers, args.concurrency))
    finally:
        server.terminate()
        server.join()
    report["target_ms"] = args.target_ms
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    if report["llm_calls_max"] > report["llm_calls_bound"]:  # type: ignore[operator]
        print("LLM calls exceed the bound", file=sys.stderr)
        return 1
    if report["overhead_ms_p50"] > args.target_ms:
        print(f"p50 overhead above the {args.target_ms} ms target", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
