"""PFiD: shapes, masks, permutation behaviour, checkpoints and input features."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import ByT5Tokenizer

from attest.rerank.features import PassageEncoder, bucket, group_by_bucket
from attest.rerank.model import CheckpointError, PFiD, tiny_config
from attest.rerank.scoring import DocInput, PFiDScorer

TOKENIZER = ByT5Tokenizer()


@pytest.fixture(scope="module")
def model() -> PFiD:
    torch.manual_seed(3)
    m = PFiD.from_config(tiny_config(len(TOKENIZER)), TOKENIZER, max_length=48)
    return m.eval()


def test_marker_and_end_token_frame_every_passage(model: PFiD) -> None:
    enc = PassageEncoder(TOKENIZER, model.meta.marker_id, 64)
    doc = enc.encode("solar", "Plant", ["short one", "x" * 500])
    assert [p[0] for p in doc.passages] == [model.meta.marker_id] * 2
    assert [p[-1] for p in doc.passages] == [TOKENIZER.eos_token_id] * 2
    assert doc.truncated == (False, True)
    assert len(doc.passages[1]) == 64
    assert model.meta.true_id != model.meta.false_id


def test_buckets_are_powers_of_two_and_bound_forward_size() -> None:
    assert [bucket(n) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, 16]
    groups = group_by_bucket([1, 3, 8, 2, 4, 7, 1], max_passages=16)
    # Same bucket within a group, at most 16 passage slots per group.
    for g in groups:
        sizes = {bucket([1, 3, 8, 2, 4, 7, 1][i]) for i in g}
        assert len(sizes) == 1
        assert len(g) * sizes.pop() <= 16
    assert sorted(i for g in groups for i in g) == list(range(7))


def test_forward_shapes_and_loss_count_only_real_passages(model: PFiD) -> None:
    enc = PassageEncoder(TOKENIZER, model.meta.marker_id, 48)
    docs = [enc.encode("q", "", ["a", "b", "c"]), enc.encode("q", "", ["d"])]
    batch = enc.collate(docs)
    assert batch.input_ids.shape[:2] == (2, 4)
    assert batch.passage_mask.tolist() == [[True, True, True, False], [True, False, False, False]]
    labels = torch.tensor([1, 0])
    plabels = torch.tensor([[0, 1, 0, 1], [0, 1, 1, 1]])  # labels on padding must be ignored
    out = model(
        batch.input_ids,
        batch.attention_mask,
        batch.passage_mask,
        doc_labels=labels,
        passage_labels=plabels,
    )
    assert out.doc_logits.shape == (2, 2)
    assert out.passage_logits.shape == (2, 4, 2)
    ce = torch.nn.functional.cross_entropy
    real = batch.passage_mask
    expected = ce(out.doc_logits, labels) + 0.5 * ce(out.passage_logits[real], plabels[real])
    assert out.loss is not None
    assert torch.allclose(out.loss, expected)


def test_padding_slots_do_not_change_scores(model: PFiD) -> None:
    enc = PassageEncoder(TOKENIZER, model.meta.marker_id, 48)
    doc = enc.encode("wind farm", "T", ["turbines", "birds and bats", "grid"])
    with torch.inference_mode():
        small = enc.collate([doc], slots=4)
        large = enc.collate([doc], slots=8)
        a = model(small.input_ids, small.attention_mask, small.passage_mask)
        b = model(large.input_ids, large.attention_mask, large.passage_mask)
    assert torch.allclose(a.doc_logits, b.doc_logits, atol=1e-5)
    assert torch.allclose(a.passage_logits[0, :3], b.passage_logits[0, :3], atol=1e-5)


def test_reordering_passages_permutes_scores_the_same_way(model: PFiD) -> None:
    """No position leaks into either head: a permutation of the passages
    permutes the passage scores by the same permutation and leaves the
    document score unchanged."""
    scorer = PFiDScorer(model, TOKENIZER)
    texts = ("water intake fell", "board diversity", "scope 3 emissions", "audit")
    perm = (2, 0, 3, 1)
    base, shuffled = scorer(
        [
            ("emissions", DocInput("Report", texts)),
            ("emissions", DocInput("Report", tuple(texts[i] for i in perm))),
        ]
    )
    assert len(set(base.passage_scores)) == 4  # scores differ, so the check means something
    assert shuffled.passage_scores == pytest.approx(
        [base.passage_scores[i] for i in perm], abs=1e-5
    )
    assert shuffled.score == pytest.approx(base.score, abs=1e-5)


def test_checkpoint_round_trip(model: PFiD, tmp_path: Path) -> None:
    model.save(tmp_path / "ckpt", TOKENIZER)
    loaded = PFiDScorer.from_checkpoint(tmp_path / "ckpt")
    items = [("solar", DocInput("", ("panels on roofs", "coal mine")))]
    assert loaded(items)[0].passage_scores == pytest.approx(
        PFiDScorer(model, TOKENIZER)(items)[0].passage_scores, abs=1e-6
    )


def test_missing_checkpoint_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=str(tmp_path / "nope")):
        PFiD.load(tmp_path / "nope")
