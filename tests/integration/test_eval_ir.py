"""`attest eval ir --retriever all` and `attest eval tune-fusion` on a small BEIR folder.

One indexing serves every retriever and fusion; a second run reads the
index, links and lists back from the cache instead of indexing again.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from attest.cli import main
from attest.evaluation.ir import load_dataset
from attest.evaluation.runner import FUSION_NAMES, SIGNAL_NAMES, run_ir_eval

DOCS = [
    ("d1", "Carbon dioxide emissions", "Burning coal releases carbon dioxide into the air."),
    ("d2", "Sea level", "Sea levels rise as glaciers and ice sheets melt."),
    ("d3", "Polar bears", "Polar bears hunt seals on Arctic sea ice."),
    ("d4", "Solar power", "Solar panels convert sunlight into electricity."),
    ("d5", "Water stress", "Droughts leave reservoirs low and farms without water."),
    ("d6", "Football", "The match ended two goals to one after extra time."),
    ("d7", "Coral reefs", "Warm oceans bleach coral reefs."),
    ("d8", "Wind power", "Wind turbines generate electricity offshore."),
]
QUERIES = [
    ("q1", "coal burning releases CO2", {"d1": 1}),
    ("q2", "melting ice raises the oceans", {"d2": 1}),
    ("q3", "electricity from the sun", {"d4": 1}),
    ("q4", "bears hunting on ice", {"d3": 1}),
    ("q5", "reservoirs running dry in a drought", {"d5": 1}),
    ("q6", "the score of the football game", {"d6": 1}),
    ("q7", "ocean heat bleaching reefs", {"d7": 1}),
    ("q8", "turbines making power from wind at sea", {"d8": 1}),
]


@pytest.fixture
def beir(tmp_path: Path) -> Path:
    root = tmp_path / "toy_climate"
    (root / "qrels").mkdir(parents=True)
    with (root / "corpus.jsonl").open("w") as f:
        for doc_id, title, text in DOCS:
            f.write(json.dumps({"_id": doc_id, "title": title, "text": text}) + "\n")
    with (root / "queries.jsonl").open("w") as f:
        for qid, text, _ in QUERIES:
            f.write(json.dumps({"_id": qid, "text": text}) + "\n")
    with (root / "qrels" / "test.tsv").open("w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for qid, _, rels in QUERIES:
            for doc_id, rel in rels.items():
                f.write(f"{qid}\t{doc_id}\t{rel}\n")
    return root


def test_all_retrievers_from_one_index_then_from_the_cache(beir: Path, tmp_path: Path) -> None:
    data = load_dataset(beir)
    cache = tmp_path / "cache"
    first = asyncio.run(
        run_ir_eval(data, retriever="all", data_dir=tmp_path / "d1", cache_dir=cache, batch_size=3)
    )
    per = first["retrievers"]
    assert set(per) == {*SIGNAL_NAMES, *FUSION_NAMES}
    for name, m in per.items():
        assert m["queries"] == 8, name
        assert 0.0 <= m["ndcg@10"] <= 1.0
    # The queries paraphrase their documents: dense and the fusions find them.
    assert per["dense"]["ndcg@10"] > 0.8
    assert per["hybrid"]["recall@100"] == 1.0
    assert first["index_seconds"] > 0
    assert first["links_per_second"] > 0
    assert (cache / "links.json.gz").is_file()
    (lists,) = cache.glob("lists-100-*.json.gz")  # keyed by the queries too

    second = asyncio.run(
        run_ir_eval(data, retriever="all", data_dir=tmp_path / "d2", cache_dir=cache, batch_size=3)
    )
    assert "index_seconds" not in second  # the cached index was used
    assert "link_seconds" not in second
    for name in per:
        assert second["retrievers"][name]["ndcg@10"] == pytest.approx(per[name]["ndcg@10"])

    # A corrupt cache file is recomputed, not fatal.
    lists.write_bytes(lists.read_bytes()[:40])
    (cache / "state.json").write_text("[]")
    third = asyncio.run(
        run_ir_eval(data, retriever="all", data_dir=tmp_path / "d3", cache_dir=cache, batch_size=3)
    )
    assert third["index_seconds"] > 0  # the unreadable state means index again
    for name in per:
        assert third["retrievers"][name]["ndcg@10"] == pytest.approx(per[name]["ndcg@10"])


def test_eval_ir_cli_and_tune_fusion(beir: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    out = runner.invoke(main, ["eval", "ir", "--dataset", str(beir), "--retriever", "all"])
    assert out.exit_code == 0, out.output
    for name in (*SIGNAL_NAMES, *FUSION_NAMES):
        assert f"toy_climate  {name}/" in out.output
    settings = tmp_path / "fusion.json"
    out = runner.invoke(
        main, ["eval", "tune-fusion", "--dataset", str(beir), "--output", str(settings)]
    )
    assert out.exit_code == 0, out.output
    assert "toy_climate half A (4 queries" in out.output
    written = json.loads(settings.read_text())
    assert written["method"] in ("rrf", "weighted", "dbsf")
    assert "toy_climate" in written["fitted_on"]
    assert set(written["cross_validated"]["toy_climate"]) == {"A", "B"}
    # One set: nothing to leave out, and the report says so.
    assert "leave-one-set-out: n/a with one data set" in out.output
    assert written["leave_one_set_out"] is None
    assert written["chosen_family"] == "within_sets"
    # The best fit that weighs the graph, and the paired intervals over both halves.
    assert "best with KG" in out.output
    # How much of the corpus the graph reaches, from the links eval ir cached.
    assert re.search(r"toy_climate: \d+ of \d+ documents link to a KG entity", out.output)
    assert "toy_climate both halves (8 queries)" in out.output
    assert "warning: toy_climate: 8 queries: read the intervals below as rough" in out.output
    assert re.search(r"tuned - hybrid: .*; nDCG@10 differs on \d of 8 queries\)", out.output)
    pooled = written["paired"]["toy_climate"]
    assert pooled["queries"] == 8
    for diff in pooled["differences"].values():
        low, high = diff["ci95"]
        assert low <= diff["mean"] <= high
    # The settings file is what `--fusion-settings` (and the services) read.
    out = runner.invoke(
        main,
        [
            *("eval", "ir", "--dataset", str(beir), "--retriever", "tuned"),
            "--fusion-settings",
            str(settings),
        ],
    )
    assert out.exit_code == 0, out.output
    assert "toy_climate  tuned/" in out.output
    tuned = json.loads((tmp_path / ".attest/eval/toy_climate-tuned-tantivy.json").read_text())
    assert tuned["ndcg@10"] > 0.5  # the fitted fusion ranks the paraphrased documents
    few = tmp_path / "few"
    few.mkdir()
    for name in ("corpus.jsonl", "queries.jsonl"):
        (few / name).write_text((beir / name).read_text())
    (few / "qrels").mkdir()
    (few / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    out = runner.invoke(main, ["eval", "tune-fusion", "--dataset", str(few)])
    assert out.exit_code != 0
    assert "needs at least 8" in out.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"method": "borda"}')
    out = runner.invoke(
        main,
        [
            *("eval", "ir", "--dataset", str(beir), "--retriever", "tuned"),
            "--fusion-settings",
            str(bad),
        ],
    )
    assert out.exit_code != 0
    assert "unknown fusion method" in out.output


def test_demo_as_a_beir_set_and_the_shipped_fusion_on_it(tmp_path: Path, monkeypatch) -> None:
    """The demo's ESG news: every supporting article found, and the shipped fusion
    ranks them at least as well as plain RRF of BM25, dense and KG enhanced."""
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    out = runner.invoke(main, ["eval", "convert-demo", str(tmp_path / "demo_beir")])
    assert out.exit_code == 0, out.output
    assert "48 documents and 11 judged queries" in out.output
    out = runner.invoke(
        main, ["eval", "ir", "--dataset", str(tmp_path / "demo_beir"), "--retriever", "all"]
    )
    assert out.exit_code == 0, out.output
    result = json.loads((tmp_path / ".attest/eval/demo_beir-all-tantivy.json").read_text())
    per = result["retrievers"]
    assert per["tuned"]["recall@100"] == 1.0
    assert per["tuned"]["ndcg@10"] >= per["hybrid_kg"]["ndcg@10"] - 1e-9
    assert per["tuned"]["ndcg@10"] > 0.95
