"""What `attest serve all` imports before it reports SERVING.

Each check runs in a fresh interpreter: the test process has imported most of
these libraries already.
"""

from __future__ import annotations

import subprocess
import sys


def _imported_after(code: str, modules: list[str]) -> dict[str, bool]:
    probe = f"{code}\nimport sys\nprint(','.join(str(m in sys.modules) for m in {modules!r}))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=300
    )
    return dict(zip(modules, (v == "True" for v in out.stdout.strip().split(",")), strict=True))


def test_generate_service_imports_nltk_only_when_it_stems() -> None:
    before = _imported_after("import attest.generate.servicer", ["nltk"])
    assert before == {"nltk": False}
    after = _imported_after(
        "from attest.generate.facts import stem\nassert stem('Running') == 'run'", ["nltk"]
    )
    assert after == {"nltk": True}


def test_ingest_service_imports_rake_only_when_it_extracts_keyphrases() -> None:
    before = _imported_after("import attest.ingest.servicer", ["nltk", "rake_nltk"])
    assert before == {"nltk": False, "rake_nltk": False}
    after = _imported_after(
        "from attest.knowledge.linking import KeyphraseExtractor\n"
        "phrases = KeyphraseExtractor().extract('Greenhouse gas emissions rose sharply.')\n"
        "assert 'greenhouse gas emissions' in phrases, phrases",
        ["rake_nltk"],
    )
    assert after == {"rake_nltk": True}


HEAVY = ["nltk", "rake_nltk", "torch", "transformers", "sentence_transformers", "sklearn"]


def test_serve_all_imports_no_heavy_library_before_its_services_warm_up() -> None:
    # What a service needs is imported when it warms up (the embedding model;
    # torch for KG scoring, the stemmer and RAKE by the warm-up's calls through
    # them, before SERVING), not with the code.
    code = (
        "import attest.cli\n"
        "for name in ('lexical', 'semantic', 'rerank', 'generate', 'answer', 'ingest'):\n"
        "    __import__(f'attest.{name}.servicer')"
    )
    assert _imported_after(code, HEAVY) == dict.fromkeys(HEAVY, False)
