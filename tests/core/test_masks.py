"""The attention mask (cache positions up to each query's own, also the actual-token mask of a padded
chunk) and its additive bias: finite, and masked keys weigh exactly 0."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from optimum_neuron_plugin.models import attention
from optimum_neuron_plugin.models.masks import MASK_FILL, attention_bias, cache_mask, mask_fill


def test_a_query_attends_the_cache_positions_up_to_its_own():
    positions = torch.tensor([[5, 6, 7], [0, 1, 2]])
    mask = cache_mask(positions, 10)
    assert mask.shape == (2, 3, 10)
    for row in range(2):
        for t in range(3):
            p = int(positions[row, t])
            assert mask[row, t].tolist() == [True] * (p + 1) + [False] * (9 - p)


def test_padded_queries_attend_exactly_the_last_real_tokens_keys():
    """Padding repeats the last real token and position: the padded columns' mask rows are the last real
    token's, and no key beyond its position (where a padded key could have been) is attended."""
    positions = torch.tensor([[10, 11, 12, 12, 12, 12]])
    mask = cache_mask(positions, 16)[0]
    last_real = 2
    for padded in range(last_real + 1, 6):
        assert torch.equal(mask[padded], mask[last_real])
    assert not mask[:, 13:].any()


def test_the_bias_lays_the_mask_out_for_grouped_queries():
    positions = torch.tensor([[3, 4], [0, 0]])
    bias = attention_bias(positions, 8, groups=3, dtype=torch.float32)
    assert bias.shape == (2, 1, 6, 8)  # [n, 1, groups * T, L]: query row g * T + t
    mask = cache_mask(positions, 8)
    for g in range(3):
        assert torch.equal(bias[:, 0, g * 2 : (g + 1) * 2] == 0, mask)
    assert set(bias.unique().tolist()) == {0.0, MASK_FILL}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_fill_is_finite_and_underflows_exp_to_zero(dtype):
    """Never -inf nor the dtype minimum (NaN on Neuron); exp() of the fill is exactly 0 in fp32."""
    bias = attention_bias(torch.tensor([[2]]), 4, groups=1, dtype=dtype)
    assert bias.dtype == dtype and torch.isfinite(bias).all()
    assert torch.finfo(dtype).min < mask_fill(dtype) < -3e4
    assert torch.exp(torch.tensor(mask_fill(dtype), dtype=torch.float32)) == 0


def _fused(q, k, v, bias):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def _one_token(q, k, v, bias):
    return attention._attend_one_token(q, k, v, bias, None)


# Chunks (and bf16 decode rows) run the fused kernel; fp32 decode rows (one token per row) the two products.
FORMS = [
    pytest.param(_fused, torch.float32, 4, id="fused-fp32"),
    pytest.param(_fused, torch.bfloat16, 4, id="fused-bf16"),
    pytest.param(_one_token, torch.float32, 1, id="one-token-fp32"),
]


@pytest.mark.parametrize(("attend", "dtype", "t"), FORMS)
def test_masked_keys_weigh_exactly_zero(attend, dtype, t):
    """Attention under the bias equals softmax attention over the attended keys alone, and garbage in the
    masked keys and values (1e4) changes nothing, bit for bit."""
    generator = torch.Generator().manual_seed(0)
    n, kv_heads, groups, length, dim = 2, 2, 3, 16, 8
    positions = torch.tensor([[5, 6, 7, 7], [9, 10, 11, 12]])[:, :t]
    q = torch.randn(n, kv_heads, groups * t, dim, generator=generator).to(dtype)
    k = torch.randn(n, kv_heads, length, dim, generator=generator).to(dtype)
    v = torch.randn(n, kv_heads, length, dim, generator=generator).to(dtype)
    bias = attention_bias(positions, length, groups, dtype)
    out = attend(q, k, v, bias)
    assert torch.isfinite(out).all()
    for row in range(n):
        for query in range(groups * t):
            keep = int(positions[row, query % t]) + 1
            scores = q[row, :, query, None].float() @ k[row, :, :keep].float().transpose(-1, -2) * dim**-0.5
            expected = torch.softmax(scores, dim=-1) @ v[row, :, :keep].float()
            tolerance = 1e-5 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(out[row, :, query].float(), expected[:, 0], atol=tolerance, rtol=0)
    dirty_k, dirty_v = k.clone(), v.clone()
    dirty_k[:, :, 13:], dirty_v[:, :, 13:] = 1e4, 1e4  # past every query's position
    dirty = attend(q, dirty_k, dirty_v, bias)
    assert torch.equal(out, dirty)


def test_bf16_decoder_with_padding_and_prior_context_is_finite(zoo):
    """The whole decoder in bf16 (eager): a padded chunk after cached context stays finite and close to fp32."""
    from optimum_neuron_plugin.models.args import ModelArgs
    from optimum_neuron_plugin.models.decoder import decoder_logits, weight_names
    from optimum_neuron_plugin.models.layers import rope_inv_freq

    from .helpers import eager_pool, prompt

    hf = zoo.tiny("qwen3").hf
    args = ModelArgs.from_hf_config(hf.config.to_dict())
    state = hf.state_dict()
    results = {}
    for dtype in (torch.float32, torch.bfloat16):
        params = {name: state[name].to(dtype) for name in weight_names(args)}
        caches, table = eager_pool(args, 32, dtype)
        tokens = prompt(11, seed=5)
        with torch.no_grad():
            decoder_logits(
                args,
                params,
                caches,
                rope_inv_freq(args),
                torch.tensor([tokens[:8]]),
                torch.arange(8)[None],
                table,
                32,
            )
            chunk, positions = tokens[8:] + tokens[-1:] * 5, list(range(8, 11)) + [10] * 5  # padded like prefill()
            logits = decoder_logits(
                args, params, caches, rope_inv_freq(args), torch.tensor([chunk]), torch.tensor([positions]), table, 32
            )
        assert torch.isfinite(logits).all() and all(torch.isfinite(cache).all() for cache in caches)
        results[dtype] = logits[0]
    reference = hf(torch.tensor([prompt(11, seed=5)])).logits[0, -1].detach()
    torch.testing.assert_close(results[torch.float32], reference, atol=1e-4, rtol=0)
    cosine = torch.nn.functional.cosine_similarity(results[torch.bfloat16], reference, dim=0)
    assert cosine > 0.99
