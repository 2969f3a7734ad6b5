"""Chunk attention = prior context + own causal block (models/masks.py, models/attention.py).

The decoder runs eagerly on a tiny model (no export: fast): a prompt fed chunk by chunk, each chunk attending the
cache before its start in a prior bucket and its own block, gives HF eager's logits at every chunk's last token,
for chunk sizes that do and do not divide the prompt, for chunks that start at a bucket's edge and inside one, and
for a prior bucket wholly masked (first chunks): finite, no NaN."""

from __future__ import annotations

import copy

import pytest
import torch
from support.tiny_models import ARCHITECTURES

from optimum_neuron_plugin.models.args import ModelArgs
from optimum_neuron_plugin.models.checkpoint import decoder_weights
from optimum_neuron_plugin.models.decoder import decoder_logits, weight_names
from optimum_neuron_plugin.models.layers import rope_inv_freq
from optimum_neuron_plugin.models.masks import chunk_mask

from .helpers import eager_pool, prompt

LENGTH = 24
SEQUENCE_LENGTH = 40


def test_a_chunk_attends_its_prior_context_and_itself_causally():
    """Chunk at 5..8 (4 real tokens, no padding), prior bucket 8: cache positions 0..4 for every query (5..7 are
    masked: the key-length mask), then its own block, lower triangular."""
    mask = chunk_mask(torch.arange(5, 9)[None], prior=8)[0]
    assert mask.shape == (4, 12)
    assert mask[:, :5].all() and not mask[:, 5:8].any()
    assert torch.equal(mask[:, 8:], torch.ones(4, 4, dtype=torch.bool).tril())


def test_padded_own_keys_are_masked_and_padded_queries_see_the_last_real_tokens_keys():
    """A partial chunk of 2 real tokens at 3..4, padded to 5 columns by repeating the last position."""
    mask = chunk_mask(torch.tensor([[3, 4, 4, 4, 4]]), prior=4)[0]
    own = mask[:, 4:]
    assert not own[:, 2:].any()  # the duplicates are never attended
    assert all(torch.equal(mask[t], mask[1]) for t in range(2, 5))  # padded queries: the last real one's keys
    assert mask[:, :3].all() and not mask[:, 3].any()


def test_rows_of_a_batched_chunk_have_their_own_starts():
    mask = chunk_mask(torch.tensor([[0, 1, 2], [6, 7, 7]]), prior=8)
    assert not mask[0, :, :8].any()  # a first chunk: the whole prior bucket masked
    assert mask[1, :, :6].all() and not mask[1, :, 6:8].any()
    assert torch.equal(mask[1, :, 8:], torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 0]], dtype=torch.bool))


def chunked_logits(hf, tokens: list[int], chunk: int, prior_for) -> tuple[list[torch.Tensor], list[int]]:
    """The eager decoder fed `tokens` chunk by chunk (padded like runtime.prefill) into the blocks of slot 1 of a
    2-slot pool: each chunk's last-token logits and its prior bucket prior_for(start)."""
    args = ModelArgs.from_hf_config(hf.config.to_dict())
    state = decoder_weights(hf.state_dict(), args)
    params = {name: state[name] for name in weight_names(args)}
    dtype = params["model.norm.weight"].dtype
    caches, table = eager_pool(args, SEQUENCE_LENGTH, dtype)
    for cache in caches:
        cache.fill_(3.0)  # stale values where nothing was written: masked, never attended
    logits, priors = [], []
    for start in range(0, len(tokens), chunk):
        real = tokens[start : start + chunk]
        pad = chunk - len(real)
        ids = torch.tensor([real + real[-1:] * pad])
        positions = torch.tensor([list(range(start, start + len(real))) + [start + len(real) - 1] * pad])
        prior = prior_for(start)
        with torch.no_grad():
            out = decoder_logits(args, params, caches, rope_inv_freq(args), ids, positions, table, prior, chunk=True)
        assert torch.isfinite(out).all()
        logits.append(out[0])
        priors.append(prior)
    return logits, priors


def hf_logits_at_chunk_ends(hf, tokens: list[int], chunk: int) -> list[torch.Tensor]:
    with torch.no_grad():
        every = hf(torch.tensor([tokens])).logits[0]
    return [every[min(start + chunk, len(tokens)) - 1] for start in range(0, len(tokens), chunk)]


# Chunk sizes: dividing the 24-token prompt (4, 8) or not (5, 7: a padded last chunk).
@pytest.mark.parametrize("chunk", [4, 5, 7, 8])
@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_chunked_logits_equal_hf_eager_for_chunks_that_do_and_do_not_divide_the_prompt(zoo, name, chunk):
    hf = zoo.tiny(name).hf
    tokens = prompt(LENGTH, seed=300 + chunk)
    buckets = (0, 8, 16, 32, SEQUENCE_LENGTH)  # chunk starts land on edges (8, 16) and inside buckets
    logits, priors = chunked_logits(hf, tokens, chunk, lambda s: next(b for b in buckets if b >= s))
    assert priors[0] == 0
    for ours, theirs in zip(logits, hf_logits_at_chunk_ends(hf, tokens, chunk), strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("prior", [8, SEQUENCE_LENGTH])
def test_a_wholly_masked_prior_bucket_is_finite_and_changes_nothing(zoo, prior):
    """Every chunk attends a prior bucket larger than its start, the first one a bucket of stale values alone
    masked: the logits are HF's all the same."""
    hf = zoo.tiny("llama").hf
    tokens = prompt(LENGTH, seed=7)
    logits, _ = chunked_logits(hf, tokens, 8, lambda s: max(prior, s))
    for ours, theirs in zip(logits, hf_logits_at_chunk_ends(hf, tokens, 8), strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)


def test_bf16_chunks_with_a_masked_prior_are_finite(zoo):
    hf = copy.deepcopy(zoo.tiny("qwen3").hf).to(torch.bfloat16)  # a copy: the session's fp32 model stays exact
    logits, _ = chunked_logits(hf, prompt(LENGTH, seed=8), 7, lambda s: SEQUENCE_LENGTH)
    assert all(torch.isfinite(x).all() for x in logits)
