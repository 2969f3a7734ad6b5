"""The decode attention op's CPU kernel (backends/cpu_attention.py) computes its definition (models/attention.py,
attend_cache over the whole bucket under the mask) within fp32 rounding: a token_generation batch in slot order with
empty slots, a narrow graph's rows (read as copies), one and several tokens per row (verify), grouped and ungrouped
heads, a sliding window held in the bias, attention sinks, a cache of stale values past every position, a last
position at the bucket's end, head dims that are not multiples of 8 (the kernel's scalar tail), and bf16. The
exported decode programs call the op (every decode test of the core suite runs through it)."""

from __future__ import annotations

import pytest
import torch

from optimum_neuron_plugin.backends.cpu_attention import decode_attention_cpu
from optimum_neuron_plugin.graphs import PREFILL_CHUNKS, TOKEN_GENERATION
from optimum_neuron_plugin.models import kv_cache, masks
from optimum_neuron_plugin.models.attention import attend, attend_cache, to_slots

SLOTS = 5
BUCKET = 32
DIM = 16


def _case(
    seq_ids, lasts, t=1, heads=4, kv_heads=2, window=0, sinks=False, dtype=torch.float32, seed=0, pad=True, dim=DIM
):
    """decode_attention's inputs: rows seq_ids whose last token is at lasts[i] (t tokens each, ending there); with
    `pad`, padded to one row per cache row as a token_generation batch is (padding rows repeat row 0)."""
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)

    q = rand(len(seq_ids), t, heads, dim)
    if pad:
        extra = SLOTS - len(seq_ids)
        seq_ids, lasts = seq_ids + seq_ids[:1] * extra, lasts + lasts[:1] * extra
        q = torch.cat((q, q[:1].expand(extra, -1, -1, -1)))
    positions = torch.tensor([[last - t + 1 + u for u in range(t)] for last in lasts], dtype=torch.int32)
    ids = torch.tensor(seq_ids)
    caches = [rand(SLOTS, kv_heads, BUCKET, dim) * 3 for _ in range(2)]  # stale values everywhere
    bias = masks.attention_bias(positions, BUCKET, heads // kv_heads, dtype, window or None)
    if len(seq_ids) == SLOTS:
        bias = to_slots(bias, ids)
    sink = rand(heads) if sinks else None
    return (q, bias, *caches, ids, positions, 0.3, sink)


def _definition(q, bias, k_cache, v_cache, seq_ids, positions, scale, sinks) -> torch.Tensor:
    return attend_cache(q, bias, k_cache, v_cache, seq_ids, scale, sinks)


CASES = {
    "a token_generation batch, empty slots": dict(seq_ids=[3, 0, 1], lasts=[9, 2, 20]),
    "one row, no other": dict(seq_ids=[2], lasts=[0]),
    "last position at the bucket's end": dict(seq_ids=[4, 1], lasts=[BUCKET - 1, 5]),
    "several tokens per row (verify)": dict(seq_ids=[1, 4], lasts=[12, 7], t=4),
    "one head per kv head": dict(seq_ids=[0, 2], lasts=[6, 17], heads=2, kv_heads=2),
    "window in the bias": dict(seq_ids=[0, 3], lasts=[19, 4], t=2, window=6),
    "sinks": dict(seq_ids=[2, 0], lasts=[13, 3], sinks=True),
    "a narrow graph's one row": dict(seq_ids=[3], lasts=[14], pad=False),
    "a narrow graph's rows, verify": dict(seq_ids=[4, 0], lasts=[10, 25], t=3, pad=False),
    "head dim 64": dict(seq_ids=[1, 3], lasts=[30, 11], dim=64),
    "head dim 80 (blocks of 32 and of 8)": dict(seq_ids=[2, 0], lasts=[21, 6], t=2, dim=80),
    "head dim 44 (blocks of 32, of 8, then single values)": dict(seq_ids=[3, 1], lasts=[17, 2], t=2, dim=44),
    "head dim 6 (single values only)": dict(seq_ids=[0, 4], lasts=[8, 29], dim=6),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_kernel_computes_the_masked_definition(case):
    inputs = _case(**CASES[case])
    torch.testing.assert_close(decode_attention_cpu(*inputs), _definition(*inputs), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", ["a token_generation batch, empty slots", "a narrow graph's rows, verify"])
def test_the_kernel_reads_each_row_up_to_its_last_position_only(case):
    """NaN in every cache row past the last position of the call row reading it (all of a row no call row reads)
    leaves the kernel's result unchanged; the definition's turns NaN."""
    q, bias, k_cache, v_cache, ids, positions, scale, sinks = _case(**CASES[case])
    expected = decode_attention_cpu(q, bias, k_cache, v_cache, ids, positions, scale, sinks)
    lasts = {slot: max(row) for slot, row in zip(ids.tolist(), positions.tolist(), strict=True)}
    for slot in range(SLOTS):
        past = lasts.get(slot, -1) + 1
        k_cache[slot, :, past:], v_cache[slot, :, past:] = float("nan"), float("nan")
    assert torch.equal(decode_attention_cpu(q, bias, k_cache, v_cache, ids, positions, scale, sinks), expected)
    assert torch.isnan(_definition(q, bias, k_cache, v_cache, ids, positions, scale, sinks)).any()


@pytest.mark.parametrize("dim", [DIM, 44])
def test_bf16_matches_the_masked_definition_within_bf16_rounding(dim):
    inputs = _case(**CASES["sinks"], dtype=torch.bfloat16, dim=dim)
    out = decode_attention_cpu(*inputs)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    torch.testing.assert_close(out, _definition(*inputs), atol=2e-2, rtol=2e-2)


def test_attend_writes_the_cache_then_attends_through_the_op():
    q, bias, k_cache, v_cache, seq_ids, positions, scale, sinks = _case(**CASES["sinks"])
    generator = torch.Generator().manual_seed(1)
    k, v = (torch.randn(SLOTS, 1, 2, DIM, generator=generator) for _ in range(2))
    rows = kv_cache.CallRows.of(k_cache, seq_ids, positions)
    plain = (k_cache.clone(), v_cache.clone())
    expected = attend(q, k, v, *plain, rows, bias, scale=scale, sinks=sinks)
    out = attend(q, k, v, k_cache, v_cache, rows, bias, scale=scale, sinks=sinks, positions=positions, op=True)
    assert torch.equal(k_cache, plain[0]) and torch.equal(v_cache, plain[1])  # the same K/V written
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5)


def test_the_decode_graphs_call_the_op(llama_logits):
    """Every token_generation graph, and the decode rows of every chunk_and_decode graph, attend through the op once
    per layer; graphs of prompt chunks alone do not."""
    op = torch.ops.onp.decode_attention.default
    calls = {
        spec: len(program.graph.find_nodes(op="call_function", target=op))
        for spec, program in llama_logits.model.graphs.programs.items()
    }
    decodes = {spec for spec in calls if spec.name == TOKEN_GENERATION or spec.chunk}
    assert decodes and all(calls[spec] == 2 for spec in decodes)  # 2 layers
    assert all(calls[spec] == 0 for spec in calls if spec.name in PREFILL_CHUNKS)
