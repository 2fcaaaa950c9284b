"""A tiny random-init PFiD (d_model 64) learns the generated task on CPU.

Relevance is in the text: a passage is relevant when it holds both of the
query's key words (half of the irrelevant passages hold one of them), and a
document is relevant when any passage is. Both heads must rank held-out
items well, which neither can do without reading query and passage together.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from attest.rerank.model import PFiD, tiny_config
from attest.rerank.scoring import PFiDScorer
from attest.rerank.synthetic import make_task, word_tokenizer
from attest.rerank.training import TrainConfig, ranking_metrics, score_examples, train


@pytest.fixture
def one_thread() -> Iterator[None]:
    # Tiny tensors: one thread does the work; a second only spins, and on a
    # busy host that spinning costs minutes.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.timeout(900)  # about 2 minutes of one core; generous for a busy host
@pytest.mark.usefixtures("one_thread")
def test_both_heads_learn_the_generated_task() -> None:
    train_set = make_task(400, seed=1, key_words=16)
    heldout = make_task(40, seed=2, key_words=16)
    assert not {e.doc_id for e in train_set} & {e.doc_id for e in heldout}
    tokenizer = word_tokenizer(train_set + heldout)
    torch.manual_seed(0)
    model = PFiD.from_config(tiny_config(len(tokenizer), d_model=64), tokenizer, max_length=32)
    scorer = PFiDScorer(model, tokenizer)
    before = ranking_metrics(heldout, score_examples(scorer, heldout))

    report = train(
        model,
        tokenizer,
        train_set,
        TrainConfig(epochs=10, batch_documents=64, lr=3e-3, device="cpu"),
        progress=False,
    )
    after = ranking_metrics(heldout, score_examples(scorer, heldout))

    assert report.final_loss < report.losses[0] / 2
    assert after["doc_mrr@10"] >= 0.9, after
    assert after["passage_mrr@10"] >= 0.9, after
    # And the untrained model was far from it: the figures come from learning.
    assert before["doc_mrr@10"] < 0.8
    assert before["passage_mrr@10"] < 0.7
