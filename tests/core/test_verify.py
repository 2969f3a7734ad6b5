"""The verify graph (speculative decoding): logits of every position against Hugging Face's teacher-forced forward,
rejected drafts that need no rollback, and the host's acceptance rule."""

from __future__ import annotations

import pytest
import torch
from support.distributions import Params, compare
from support.references import hf_last_logits

from optimum_neuron_plugin.draft_acceptance import accept
from optimum_neuron_plugin.sampling import GREEDY, SamplingParams

from .helpers import CHUNKED_LOGITS_LIGHT, prompt

K = 3
FAILURE = 1e-6  # per comparison (a correct sampler fails it with at most this probability)


@pytest.fixture(scope="module")
def llama_verify(zoo):
    """Batch 3, chunk 8, S 64, host sampling, context buckets 16 and 64, with verify graphs of K drafts."""
    return zoo.artifact("llama", **CHUNKED_LOGITS_LIGHT, speculative_tokens=K)


def hf_all_logits(hf, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


def test_verify_logits_equal_hf_teacher_forced(llama_verify):
    """Two rows in distinct slots (one with fewer drafts, padded), the second crossing a context bucket boundary."""
    model, hf = llama_verify.model, llama_verify.hf
    first, second = prompt(10, seed=1), prompt(14, seed=2)
    model.prefill(2, first)
    model.prefill(0, second)
    rows = [[5, 17, 300, 42], [9, 11]]  # each row: its next token, then drafts
    logits = model.verify([2, 0], rows, [len(first), len(second)])
    assert logits.shape == (2, K + 1, hf.config.vocab_size)
    for row, (context, fed) in enumerate([(first, rows[0]), (second, rows[1])]):
        reference = hf_all_logits(hf, context + fed)[len(context) :]
        torch.testing.assert_close(logits[row, : len(fed)], reference, atol=1e-3, rtol=0)


def test_rejected_drafts_need_no_rollback(llama_verify):
    """Drafts all rejected write K/V past the accepted token; the next calls (verify, then decode) write over them
    before attending them: every later logit equals HF's on the true sequence."""
    model, hf = llama_verify.model, llama_verify.hf
    tokens = prompt(12, seed=3)
    model.prefill(1, tokens)
    greedy = hf_last_logits(hf, tokens).argmax().item()
    wrong = [(greedy + 1) % 512, 7, 8]
    logits = model.verify([1], [[greedy] + wrong], [len(tokens)])
    kept = accept(logits[0], wrong, GREEDY, None)
    assert len(kept) == 1  # nothing accepted: positions 13..15 keep the rejected drafts' K/V
    tokens = tokens + [greedy, kept[0]]
    # The next verify starts one position after the last accepted token, over the stale K/V.
    drafts = [hf_last_logits(hf, tokens).argmax().item(), 1]
    logits = model.verify([1], [[tokens[-1]] + drafts], [len(tokens) - 1])
    reference = hf_all_logits(hf, tokens + drafts)[len(tokens) - 1 :]
    torch.testing.assert_close(logits[0, :3], reference, atol=1e-3, rtol=0)
    accepted = accept(logits[0], drafts, GREEDY, None)
    assert accepted[0] == drafts[0]  # the argmax draft is accepted
    tokens = tokens + accepted
    result = model.decode([1], [tokens[-1]], [len(tokens) - 1])
    torch.testing.assert_close(result.logits[0], hf_last_logits(hf, tokens), atol=1e-3, rtol=0)


def test_greedy_acceptance():
    logits = torch.full((4, 6), -1.0)
    for position, best in enumerate([2, 3, 4, 5]):
        logits[position, best] = 1.0
    assert accept(logits, [2, 3, 4], GREEDY, None) == [2, 3, 4, 5]  # all accepted, plus the bonus token
    assert accept(logits, [2, 0, 4], GREEDY, None) == [2, 3]  # the first mismatch ends the run
    assert accept(logits, [1, 3, 4], GREEDY, None) == [2]
    assert accept(logits, [], GREEDY, None) == [2]


@pytest.mark.parametrize("params", [Params(temperature=0.8, top_k=8, top_p=0.9), Params(temperature=1.3)])
def test_sampled_tokens_follow_the_target_distribution(params):
    """Whatever the drafts, the first token is distributed as the sampler's distribution at position 0, and the
    second, given the first draft was accepted, as at position 1 (support/distributions.py: an independent float64
    reference and a distribution-free bound)."""
    vocab, draws = 16, 3000
    logits = torch.randn(K + 1, vocab, generator=torch.Generator().manual_seed(0)) * 1.5
    order = logits.argsort(dim=-1, descending=True)
    drafts = [int(order[0, 1]), int(order[1, 0]), int(order[2, 2])]  # likely, but not always accepted
    sampling = SamplingParams(top_k=params.top_k, top_p=params.top_p, temperature=params.temperature)
    generator = torch.Generator().manual_seed(1)
    outputs = [accept(logits, drafts, sampling, generator) for _ in range(draws)]
    first = torch.tensor([out[0] for out in outputs])
    verdict = compare(logits[:1].expand(draws, -1), first, params, None, FAILURE)
    assert verdict.l1 <= verdict.bound, verdict.explain()
    second = torch.tensor([out[1] for out in outputs if out[0] == drafts[0] and len(out) > 1])
    assert len(second) > 300
    verdict = compare(logits[1:2].expand(len(second), -1), second, params, None, FAILURE)
    assert verdict.l1 <= verdict.bound, verdict.explain()
