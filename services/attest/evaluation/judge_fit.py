"""Fitting the support judge's two models on labelled question sets.

For every question the extractive generator ranks its candidate answer
sentences from the question's passages, as it does when answering; the best
``sentences_per_question`` of them are judged against every passage. Each
(sentence, passage) pair is an example for the support model, labelled by
whether the passage is gold; each sentence is an example for the answer
model, labelled by whether it contains a gold answer. Both are logistic
regressions (scikit-learn, L2, balanced classes); the answer model reads the
support model's probabilities, so it is fitted second, on the same questions.

A question that several gold passages answer on their own teaches the
answer model that a fact many sources state is an answer; a real Ask often
has one source that states it among others that do not. So each such
question is also fitted as it would read with one of them
(``single_source_variants``): the same question and passages, one of its
stating gold passages, drawn with a fixed seed, kept and its other gold
passages left out (``--single-source``; measured and not used for the
shipped weights, docs/results/answer-quality.md). The sources a pooled Ask
was given (``attest eval qa --pooled --sources-out``) are a set like any
other.

So that a reader can see what generalizes, the questions are split into
halves (``half_of``: even and odd ids): both models are fitted on one half
and scored on the other, both ways, then fitted on everything for the
weights that ship.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from attest.evaluation.qa import QAItem, half_of
from attest.generate.extractive import ExtractiveEngine, ExtractiveSettings
from attest.generate.judge import (
    SENTENCE_FEATURES,
    SUPPORT_FEATURES,
    JudgeModel,
    JudgeModels,
    SupportJudge,
    sentence_features,
    support_features,
)
from attest.generate.models import Source
from attest.generate.text import contains_answer

Matrix = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Judged:
    """One question's judged candidates."""

    question_id: str
    half: str
    x: Matrix  # (sentences, passages, FEATURES)
    gold: npt.NDArray[np.bool_]  # per passage
    right: npt.NDArray[np.bool_]  # per sentence: contains a gold answer


def collect(
    items: Sequence[QAItem],
    engine: ExtractiveEngine,
    sentences_per_question: int = 8,
    progress: bool = True,
) -> list[Judged]:
    out: list[Judged] = []
    for item in tqdm(items, desc="judging", unit="q", disable=not progress):
        sources = [Source(doc_id=p.id, text=p.text, title=p.title) for p in item.passages]
        picked = engine.candidates(item.question, sources, sentences_per_question)
        if not picked:
            continue
        texts = [c.text for c, _ in picked]
        assert isinstance(engine.judge, SupportJudge)
        x = engine.judge.features(item.question, texts, [s.text for s in sources])
        gold = np.array([p.gold for p in item.passages], dtype=bool)
        right = np.array([any(contains_answer(t, a) for a in item.answers) for t in texts])
        out.append(Judged(item.id, half_of(item.id), x, gold, right))
    return out


# The seed of the draw of the one stating passage a variant keeps.
VARIANT_SEED = 13


def single_source_variants(items: Sequence[QAItem], seed: int = VARIANT_SEED) -> list[QAItem]:
    """Each question two or more of whose gold passages state a gold answer
    (``contains_answer``), with one of those kept (a seeded draw, in the
    questions' order) and every other gold passage left out; its other
    passages as they are. A question a single passage answers, or one whose
    gold passages only answer together (multi-hop), has none."""
    rng = random.Random(seed)
    out: list[QAItem] = []
    for item in items:
        stating = [
            p
            for p in item.passages
            if p.gold and any(contains_answer(p.text, a) for a in item.answers)
        ]
        if len(stating) < 2:
            continue
        keep = rng.choice(stating)
        passages = tuple(p for p in item.passages if not p.gold or p is keep)
        out.append(replace(item, passages=passages))
    return out


def auroc(scores: Sequence[float], labels: Sequence[int]) -> float | None:
    """Area under the ROC curve (ties count half); None with one class only."""
    from sklearn.metrics import roc_auc_score

    if len(set(labels)) < 2:
        return None
    return float(roc_auc_score(list(labels), list(scores)))


def _logistic(x: Matrix, y: npt.NDArray[np.int64], names: tuple[str, ...], c: float) -> JudgeModel:
    from sklearn.linear_model import LogisticRegression

    if len(set(y.tolist())) < 2:
        raise ValueError("the data sets need both supporting and non-supporting examples")
    model = LogisticRegression(C=c, class_weight="balanced", max_iter=2000)
    model.fit(x, y)
    return JudgeModel(tuple(float(w) for w in model.coef_[0]), float(model.intercept_[0]), names)


def _pairs(judged: Sequence[Judged]) -> tuple[Matrix, npt.NDArray[np.int64]]:
    """The pairs of the sentences that contain a gold answer: whether a source
    states a sentence is learnt where the sentence is right, so that a
    source that states a wrong sentence word for word does not teach it that
    stating the sentence's words counts against support."""
    x = np.vstack(
        [support_features(j.x[j.right]).reshape(-1, len(SUPPORT_FEATURES)) for j in judged]
    )
    y = np.concatenate([np.tile(j.gold, int(j.right.sum())) for j in judged]).astype(np.int64)
    return x, y


def fit(judged: Sequence[Judged], c: float = 1.0) -> JudgeModels:
    if not judged:
        raise ValueError("no question has a candidate sentence to fit on")
    x, y = _pairs(judged)
    support = _logistic(x, y, SUPPORT_FEATURES, c)
    s = np.vstack([sentence_features(j.x, support.score(support_features(j.x))) for j in judged])
    r = np.concatenate([j.right for j in judged]).astype(np.int64)
    return JudgeModels(support, _logistic(s, r, SENTENCE_FEATURES, c))


_UNSCORED: dict[str, float | None] = {
    "pairs_auroc": None,
    "sentences_auroc": None,
    "confidence_auroc": None,
}


def score(models: JudgeModels, judged: Sequence[Judged]) -> dict[str, float | None]:
    """AUROC of the support model over the pairs of right sentences (gold
    passage or not), of the answer model over sentences (contains a gold
    answer or not), and of the confidence over every pair (a right sentence
    and a gold passage, or not)."""
    if not judged:
        return dict(_UNSCORED)
    _, y = _pairs(judged)
    pair_scores: list[float] = []
    sent_scores: list[float] = []
    confidence: list[float] = []
    labels: list[int] = []
    for j in judged:
        support = models.support.score(support_features(j.x))
        answer = models.answer.score(sentence_features(j.x, support))
        pair_scores.extend(support[j.right].ravel().tolist())
        sent_scores.extend(answer.tolist())
        confidence.extend((support * answer[:, None]).ravel().tolist())
        labels.extend(np.outer(j.right, j.gold).ravel().astype(int).tolist())
    rights = np.concatenate([j.right for j in judged]).astype(int).tolist()
    return {
        "pairs_auroc": auroc(pair_scores, y.tolist()),
        "sentences_auroc": auroc(sent_scores, rights),
        "confidence_auroc": auroc(confidence, labels),
    }


def cross_fit(
    sets: Mapping[str, Sequence[Judged]], c: float = 1.0
) -> dict[str, dict[str, dict[str, float | None]]]:
    """Each data set's half scored by models fitted on the other half of every
    set; a half is not scored (its figures None) when no set has a question
    in the other half (a set of one half: ``attest eval qa --split odd
    --sources-out``)."""
    out: dict[str, dict[str, dict[str, float | None]]] = {name: {} for name in sets}
    for held in ("even", "odd"):
        train = [j for judged in sets.values() for j in judged if j.half != held]
        models = fit(train, c) if train else None
        for name, judged in sets.items():
            scored = [j for j in judged if j.half == held]
            out[name][held] = score(models, scored) if models is not None else dict(_UNSCORED)
    return out


def fit_judge(
    datasets: Sequence[Path],
    output: Path,
    c: float = 1.0,
    progress: bool = True,
    single_source: bool = False,
    split: str | None = None,
) -> dict[str, object]:
    """Collect examples from every data set (and, with ``single_source``, from
    its ``single_source_variants``, a set of their own named "<set> (one
    stating source)"), report each set's AUROC with the shipped weights and on
    each half with weights fitted on the other half of every set, then fit on
    everything and write the weights to ``output``. With ``split`` ("even" or
    "odd"), only that half of every set's questions is read, and the
    held-out-half figures are left out."""
    from attest.evaluation.qa import dataset_name, load_qa
    from attest.semantic.embedding import Embedder

    # The report names each set: two of one name would be one, the first lost.
    named: dict[str, Path] = {}
    for path in datasets:
        name = dataset_name(path)
        for taken in (name, f"{name} (one stating source)") if single_source else (name,):
            if taken in named:
                raise ValueError(
                    f"two data sets are called {taken!r}: {named[taken]} and {path}; "
                    "give each set a name of its own"
                )
            named[taken] = path
    # The hand-built features and their logistic models are what this fits.
    engine = ExtractiveEngine(Embedder(), ExtractiveSettings(judge="features"))
    assert isinstance(engine.judge, SupportJudge)
    sets: dict[str, list[Judged]] = {}
    for path in datasets:
        items = [i for i in load_qa(path) if split is None or half_of(i.id) == split]
        if not items:
            raise ValueError(f"{path}: no questions in the {split} half")
        name = dataset_name(path)
        sets[name] = collect(items, engine, progress=progress)
        variants = single_source_variants(items) if single_source else []
        if variants:
            sets[f"{name} (one stating source)"] = collect(variants, engine, progress=progress)
    everything = [j for judged in sets.values() for j in judged]
    models = fit(everything, c)
    report: dict[str, object] = {
        "regularization_c": c,
        "single_source_variants": single_source,
        "questions": {name: len(judged) for name, judged in sets.items()},
        "shipped_weights": {
            name: score(engine.judge.models, judged) for name, judged in sets.items()
        },
        # With one half read, there is no other half to score.
        "held_out_half": cross_fit(sets, c) if split is None else None,
        "weights": models.to_json(),
    }
    output.write_text(json.dumps(models.to_json(), indent=2) + "\n", encoding="utf-8")
    return report
