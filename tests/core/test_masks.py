"""Masks and the masked manual softmax of the attention."""

from __future__ import annotations

import pytest
import torch

from optimum_neuron_plugin.models.attention import masked_softmax
from optimum_neuron_plugin.models.masks import MASK_FILL, active_mask, actual_token_mask, prior_mask


def test_actual_token_mask_marks_the_repeated_padding():
    positions = torch.tensor(
        [
            [5, 6, 7, 7, 7],  # 3 real tokens, then 2 copies of the last one (a padded partial chunk)
            [0, 1, 2, 3, 4],  # a full chunk
            [9, 9, 9, 9, 9],  # one real token (a chunk of size 1 padded, or decode-like)
        ]
    )
    expected = torch.tensor(
        [
            [True, True, True, False, False],
            [True, True, True, True, True],
            [True, False, False, False, False],
        ]
    )
    assert torch.equal(actual_token_mask(positions), expected)
    assert torch.equal(actual_token_mask(torch.tensor([[3]])), torch.tensor([[True]]))


def test_padded_queries_attend_exactly_the_last_real_tokens_keys():
    positions = torch.tensor([[10, 11, 12, 12, 12, 12]])
    mask = active_mask(positions)[0]
    last_real = 2
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    assert torch.equal(mask[: last_real + 1], causal[: last_real + 1])  # real queries: plain causal
    for padded in range(last_real + 1, 6):
        assert torch.equal(mask[padded], mask[last_real])
    assert not mask[:, last_real + 1 :].any()  # no query attends a padded key


def test_prior_mask_covers_positions_before_the_chunk():
    positions = torch.tensor([[4, 5, 6], [0, 1, 1]])
    mask = prior_mask(positions, 8)
    assert mask.shape == (2, 1, 8)
    assert mask[0, 0].tolist() == [True] * 4 + [False] * 4
    assert not mask[1].any()  # the first chunk of a sequence reads nothing from the cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_masked_softmax_equals_softmax_when_nothing_is_masked(dtype):
    scores = (torch.randn(4, 3, 16, 40, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    weights = masked_softmax(scores, torch.ones(4, 3, 16, 40, dtype=torch.bool))
    assert weights.dtype == torch.float32
    torch.testing.assert_close(weights, torch.softmax(scores.float(), dim=-1), atol=1e-6, rtol=1e-5)


def test_masked_softmax_is_softmax_over_the_unmasked_keys():
    generator = torch.Generator().manual_seed(1)
    scores = torch.randn(64, 32, generator=generator) * 3
    mask = torch.rand(64, 32, generator=generator) < 0.6
    mask[:, 0] = True
    weights = masked_softmax(scores, mask)
    assert torch.equal(weights[~mask], torch.zeros_like(weights[~mask]))  # masked keys weigh exactly 0
    for row in range(64):
        keep = mask[row]
        torch.testing.assert_close(weights[row, keep], torch.softmax(scores[row, keep], dim=-1), atol=1e-6, rtol=1e-5)
    # Rows with nothing masked equal torch.softmax of the whole row.
    full = torch.ones_like(mask)
    torch.testing.assert_close(masked_softmax(scores, full), torch.softmax(scores, dim=-1), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_masked_softmax_is_finite_near_the_dtype_minimum(dtype):
    low = torch.finfo(dtype).min
    scores = torch.tensor(
        [
            [low, low, 1.0, low],  # real scores at the minimum next to a normal one
            [low, low, low, low],  # every score at the minimum, nothing masked
            [low, 2.0, low, 0.5],  # masked minimum scores
            [0.0, 1.0, 2.0, 3.0],  # fully masked row
        ],
        dtype=dtype,
    )
    mask = torch.tensor(
        [[True, True, True, True], [True, True, True, True], [False, True, False, True], [False, False, False, False]]
    )
    weights = masked_softmax(scores, mask)
    assert torch.isfinite(weights).all()
    torch.testing.assert_close(weights.sum(-1), torch.tensor([1.0, 1.0, 1.0, 0.0]))  # nothing to attend: zeros
    assert weights[0].argmax() == 2 and weights[0, 2] == pytest.approx(1.0)
    torch.testing.assert_close(weights[1], torch.full((4,), 0.25))
    torch.testing.assert_close(
        weights[2], torch.softmax(torch.tensor([0.0, 2.0, 0.0, 0.5]).masked_fill(~mask[2], -1e30), -1)
    )
    # Rows of the unmasked part agree with torch.softmax in fp32 (which is also finite there).
    torch.testing.assert_close(weights[:2], torch.softmax(scores[:2].float(), dim=-1))


def test_mask_fill_is_not_the_dtype_minimum():
    """Masked scores are filled with a large finite value that still underflows exp() to exactly 0 in fp32."""
    assert torch.finfo(torch.bfloat16).min < MASK_FILL
    assert torch.exp(torch.tensor(MASK_FILL, dtype=torch.float32)) == 0


def test_bf16_decoder_with_padding_and_prior_context_is_finite(zoo):
    """The whole decoder in bf16 (eager): a padded chunk after cached context stays finite and close to fp32."""
    from optimum_neuron_plugin.models.args import ModelArgs
    from optimum_neuron_plugin.models.kv_cache import empty_cache
    from optimum_neuron_plugin.models.layers import rope_inv_freq
    from optimum_neuron_plugin.models.llama import decoder_logits, weight_names

    from .helpers import prompt

    hf = zoo.tiny("qwen3").hf
    args = ModelArgs.from_hf_config(hf.config.to_dict())
    state = hf.state_dict()
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        params = {name: state[name].to(dtype) for name in weight_names(args)}
        caches = empty_cache(args.num_hidden_layers, 2, 32, args.num_key_value_heads, args.head_dim, dtype)
        tokens = prompt(11, seed=5)
        seq_ids = torch.tensor([1])
        with torch.no_grad():
            decoder_logits(
                args,
                params,
                caches,
                rope_inv_freq(args),
                torch.tensor([tokens[:8]]),
                torch.arange(8)[None],
                seq_ids,
                32,
            )
            chunk, positions = tokens[8:] + tokens[-1:] * 5, list(range(8, 11)) + [10] * 5  # padded like prefill()
            logits = decoder_logits(
                args, params, caches, rope_inv_freq(args), torch.tensor([chunk]), torch.tensor([positions]), seq_ids, 32
            )
        assert torch.isfinite(logits).all() and all(torch.isfinite(cache).all() for cache in caches)
        results[dtype] = logits[0]
    reference = hf(torch.tensor([prompt(11, seed=5)])).logits[0, -1].detach()
    torch.testing.assert_close(results[torch.float32], reference, atol=1e-4, rtol=0)
    cosine = torch.nn.functional.cosine_similarity(results[torch.bfloat16], reference, dim=0)
    assert cosine > 0.99
