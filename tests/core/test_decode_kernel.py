"""The decode attention op's CPU kernel (backends/cpu_attention.py) computes its definition (each row's positions
[0, L) read through its block table, then attention under the mask) within fp32 rounding, on block pools of every
block size (one position, a few, the whole bucket) whose tables name blocks scattered and out of order, share
prefixes between rows and pad with the null block: a batch padded by repeating its first row, one and several tokens
per row (verify), grouped and ungrouped heads, a sliding window held in the bias, attention sinks, a cache of stale
values past every position, a last position at the bucket's end, a row's KV heads split between work items
(as when threads outnumber rows), head dims that are not multiples of 8 (the
kernel's scalar tail), and bf16. It reads no position past a row's last: other values there change no bit. The
exported decode programs call the op (every decode test of the core suite runs through it)."""

from __future__ import annotations

import pytest
import torch

from optimum_neuron_plugin.backends.cpu_attention import decode_attention_cpu
from optimum_neuron_plugin.graphs import PREFILL_CHUNKS, TOKEN_GENERATION
from optimum_neuron_plugin.models import kv_cache, masks
from optimum_neuron_plugin.models.attention import attend, attend_cache, attend_rows

from .kernel_blocks import block_tables, read, unread

BUCKET = 32
DIM = 16
BLOCK_SIZES = [1, 4, 16, BUCKET]


def _case(
    lasts,
    block_size,
    t=1,
    heads=4,
    kv_heads=2,
    window=0,
    sinks=False,
    dtype=torch.float32,
    seed=0,
    padding=0,
    shared=None,
    dim=DIM,
):
    """decode_attention's inputs: rows whose last token is at lasts[i] (t tokens each, ending there), each with its
    blocks (`shared`: block_tables'), then `padding` rows repeating the first one, as a padded batch does."""
    generator = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)

    tables, blocks = block_tables(
        [last + 1 for last in lasts], block_size, BUCKET // block_size, generator, shared or {}
    )
    q = rand(len(lasts), t, heads, dim)
    if padding:
        q = torch.cat((q, q[:1].expand(padding, -1, -1, -1)))
        tables, lasts = torch.cat((tables, tables[:1].expand(padding, -1))), lasts + lasts[:1] * padding
    positions = torch.tensor([[last - t + 1 + u for u in range(t)] for last in lasts], dtype=torch.int32)
    caches = [rand(blocks, block_size, kv_heads, dim) * 3 for _ in range(2)]  # stale values everywhere, block 0 too
    bias = masks.attention_bias(positions, BUCKET, heads // kv_heads, dtype, window or None)
    sink = rand(heads) if sinks else None
    return (q, bias, *caches, tables, positions, 0.3, sink)


def _definition(q, bias, k_cache, v_cache, block_tables, positions, scale, sinks) -> torch.Tensor:
    length = bias.shape[-1]
    keys, values = read(k_cache, block_tables, length), read(v_cache, block_tables, length)
    return attend_rows(q, bias, keys, values, scale, sinks)


CASES = {
    "a batch padded by repeating its first row": dict(lasts=[9, 2, 20], padding=2),
    "one row, no other": dict(lasts=[0]),
    "last position at the bucket's end": dict(lasts=[BUCKET - 1, 5]),
    "a prefix shared between rows": dict(lasts=[BUCKET - 1, 27, 11], shared={1: (0, 20), 2: (0, 8)}),
    "several tokens per row (verify)": dict(lasts=[12, 7], t=4),
    "one head per kv head": dict(lasts=[6, 17], heads=2, kv_heads=2),
    "one row, its kv heads split between work items": dict(lasts=[20], heads=8, kv_heads=4, sinks=True),
    "window in the bias": dict(lasts=[19, 4], t=2, window=6),
    "sinks": dict(lasts=[13, 3], sinks=True),
    "rows of verify sharing a prefix": dict(lasts=[10, 25], t=3, shared={1: (0, 8)}),
    "head dim 64": dict(lasts=[30, 11], dim=64),
    "head dim 80 (blocks of 32 and of 8)": dict(lasts=[21, 6], t=2, dim=80),
    "head dim 44 (blocks of 32, of 8, then single values)": dict(lasts=[17, 2], t=2, dim=44),
    "head dim 6 (single values only)": dict(lasts=[8, 29], dim=6),
}


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("case", list(CASES))
def test_the_kernel_computes_the_masked_definition(case, block_size):
    inputs = _case(**CASES[case], block_size=block_size)
    torch.testing.assert_close(decode_attention_cpu(*inputs), _definition(*inputs), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("block_size", [1, 4, BUCKET])
@pytest.mark.parametrize("case", ["a batch padded by repeating its first row", "rows of verify sharing a prefix"])
def test_the_kernel_reads_each_row_up_to_its_last_position_only(case, block_size):
    """Other values at every cache position no row reads (past each row's last, in block 0, in blocks no table
    names) change no bit of the kernel's result, NaN included; the definition's turns NaN."""
    q, bias, k_cache, v_cache, tables, positions, scale, sinks = _case(**CASES[case], block_size=block_size)
    expected = decode_attention_cpu(q, bias, k_cache, v_cache, tables, positions, scale, sinks)
    stale = unread(k_cache, tables, [(0, max(row) + 1) for row in positions.tolist()])
    assert stale[0].all() and stale.sum() > block_size
    generator = torch.Generator().manual_seed(7)
    for fill in (lambda: torch.randn(int(stale.sum()), *k_cache.shape[2:], generator=generator), lambda: float("nan")):
        k_cache[stale], v_cache[stale] = fill(), fill()
        assert torch.equal(decode_attention_cpu(q, bias, k_cache, v_cache, tables, positions, scale, sinks), expected)
    assert torch.isnan(_definition(q, bias, k_cache, v_cache, tables, positions, scale, sinks)).any()


@pytest.mark.parametrize("dim", [DIM, 44])
def test_bf16_matches_the_masked_definition_within_bf16_rounding(dim):
    inputs = _case(**CASES["sinks"], block_size=4, dtype=torch.bfloat16, dim=dim)
    out = decode_attention_cpu(*inputs)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    torch.testing.assert_close(out, _definition(*inputs), atol=2e-2, rtol=2e-2)


def test_a_table_that_does_not_cover_the_positions_or_names_no_block_of_the_pool_is_refused():
    q, bias, k_cache, v_cache, tables, positions, scale, sinks = _case(lasts=[13, 3], block_size=4)
    with pytest.raises(RuntimeError, match="reads 14 positions, past its table of 3 blocks of 4"):
        decode_attention_cpu(q, bias, k_cache, v_cache, tables[:, :3], positions, scale, sinks)
    tables[1, 0] = k_cache.shape[0]
    with pytest.raises(RuntimeError, match=f"row 1 names block {k_cache.shape[0]} of a pool of {k_cache.shape[0]}"):
        decode_attention_cpu(q, bias, k_cache, v_cache, tables, positions, scale, sinks)


def test_the_reference_is_the_ops_definition():
    for case in ("a prefix shared between rows", "rows of verify sharing a prefix"):
        q, bias, k_cache, v_cache, tables, positions, scale, sinks = inputs = _case(**CASES[case], block_size=4)
        assert torch.equal(_definition(*inputs), attend_cache(q, bias, k_cache, v_cache, tables, scale, sinks))


def test_attend_writes_the_cache_then_attends_through_the_op():
    q, bias, k_cache, v_cache, tables, positions, scale, sinks = _case(**CASES["sinks"], block_size=4)
    generator = torch.Generator().manual_seed(1)
    k, v = (torch.randn(2, 1, 2, DIM, generator=generator) for _ in range(2))
    rows = kv_cache.CallRows.of(k_cache, tables, positions)
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
