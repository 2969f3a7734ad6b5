"""The chunk attention op's CPU kernel (backends/cpu_attention.py) computes its masked definition (each row's prior
bucket read through its block table, then the chunk's masked attention over [prior | own]) within fp32 rounding, on
block pools of every block size (one position, a few, the whole sequence) whose tables name blocks scattered and out
of order, share prefixes between rows and pad with the null block: for rows with their own starts (a first chunk, a
start inside the prior bucket, at its end), padded chunks, grouped and ungrouped heads, sliding windows shorter and
longer than the prior, attention sinks, a cache of stale values past each start, priors and chunks over several key
tiles and query blocks (ending inside one), head dims off the vector width, bf16, successive chunks of one request in
one call, and padded tokens repeating the last real query (computed once, its output copied). It reads no cache
position outside a row's attended prior: other values there change no bit. An FP8 cache takes the masked form. The
exported programs call the op and replay it (every HF parity test of the core suite runs through it)."""

from __future__ import annotations

import pytest
import torch

from optimum_neuron_plugin.backends import cpu_serde
from optimum_neuron_plugin.backends.cpu_attention import chunk_attention_cpu
from optimum_neuron_plugin.graphs import PREFILL_CHUNKS
from optimum_neuron_plugin.models import fp8, kv_cache, masks
from optimum_neuron_plugin.models.attention import attend_chunk, attend_rows, masked_chunk_attention

from .kernel_blocks import block_tables, read, unread, write

SEQUENCE = 48
DIM = 16
BLOCK_SIZES = [1, 4, 16, None]  # None: the whole sequence


def _positions(starts: list[int], real: list[int], t: int) -> torch.Tensor:
    """Each row's positions, padded like runtime.prefill: the last real position repeated."""
    rows = [[s + min(u, r - 1) for u in range(t)] for s, r in zip(starts, real, strict=True)]
    return torch.tensor(rows, dtype=torch.int32)


def _case(
    starts,
    real,
    t,
    prior,
    heads,
    kv_heads,
    block_size=4,
    window=0,
    sinks=False,
    dtype=torch.float32,
    dim=DIM,
    sequence=SEQUENCE,
    shared=None,
    one_request=False,
    repeat_padding=False,
):
    """chunk_attention's inputs: each row's blocks cover its prior and its chunk (`shared`: block_tables'; with
    `one_request`, the rows are one prompt's successive chunks, on one table), its chunk's K/V written to them."""
    generator = torch.Generator().manual_seed(0)
    n, block_size = len(starts), block_size or sequence

    def rand(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)

    q, k, v = rand(n, t, heads, dim), rand(n, t, kv_heads, dim), rand(n, t, kv_heads, dim)
    if repeat_padding:  # as the chunk loop pads: the last real token again, so its query, key and value again
        for i, r in enumerate(real):
            q[i, r:], k[i, r:], v[i, r:] = q[i, r - 1], k[i, r - 1], v[i, r - 1]
    own = [list(range(s, s + r)) for s, r in zip(starts, real, strict=True)]  # the real tokens' positions
    ends = [s + r for s, r in zip(starts, real, strict=True)]
    if one_request:
        ends, shared = [max(ends)] * n, {i: (0, sequence) for i in range(1, n)}
    tables, blocks = block_tables(ends, block_size, sequence // block_size, generator, shared or {})
    caches = [rand(blocks, block_size, kv_heads, dim) * 3 for _ in range(2)]  # stale values everywhere, block 0 too
    write(caches[0], tables, own, k)
    write(caches[1], tables, own, v)
    positions = _positions(starts, real, t)
    bias = masks.chunk_bias(positions, prior, heads // kv_heads, dtype, window or None)
    sink = rand(heads) if sinks else None
    return (q, k, v, *caches, tables, positions, bias, window, 0.3, sink)


def _definition(q, k, v, k_cache, v_cache, tables, positions, bias, window, scale, sinks) -> torch.Tensor:
    """Attention over [each row's prior bucket, read through its table | its own k/v] under the bias."""
    prior = bias.shape[-1] - q.shape[1]
    keys, values = k.transpose(1, 2), v.transpose(1, 2)  # [n, KVH, T, D]
    keys = torch.cat((read(k_cache, tables, prior), keys), dim=2)
    values = torch.cat((read(v_cache, tables, prior), values), dim=2)
    return attend_rows(q, bias, keys, values, scale, sinks)


def _spans(inputs) -> list[tuple[int, int]]:
    """The cache positions each row attends: [low, min(start, prior)) (low: 0 without a window)."""
    q, positions, bias, window = inputs[0], inputs[6], inputs[7], inputs[8]
    prior = bias.shape[-1] - q.shape[1]
    lows = [max(0, row[0] - window + 1) if window else 0 for row in positions.tolist()]
    return [(low, max(low, min(row[0], prior))) for low, row in zip(lows, positions.tolist(), strict=True)]


CASES = {
    "first chunks": dict(starts=[0, 0], real=[8, 5], t=8, prior=0, heads=4, kv_heads=2),
    "first chunk, masked prior": dict(starts=[0], real=[8], t=8, prior=16, heads=4, kv_heads=2),
    "starts inside and at the bucket's end": dict(
        starts=[3, 16, 9], real=[8, 2, 7], t=8, prior=16, heads=4, kv_heads=2
    ),
    # A prompt's successive chunks in one call: each row's prior holds the rows before it, written by this call.
    "successive chunks of one request": dict(
        starts=[0, 8, 16], real=[8, 8, 5], t=8, prior=16, heads=4, kv_heads=2, one_request=True
    ),
    "a prefix shared between rows": dict(
        starts=[16, 24, 20], real=[8, 8, 3], t=8, prior=24, heads=4, kv_heads=2, shared={1: (0, 16), 2: (1, 20)}
    ),
    "one head per kv head": dict(starts=[5, 24], real=[4, 6], t=6, prior=24, heads=2, kv_heads=2),
    "one token": dict(starts=[11], real=[1], t=1, prior=16, heads=6, kv_heads=2),
    "window shorter than the prior": dict(starts=[20, 2], real=[8, 8], t=8, prior=24, heads=4, kv_heads=2, window=6),
    "window longer than the chunk and prior": dict(
        starts=[10], real=[5], t=8, prior=16, heads=4, kv_heads=1, window=40
    ),
    "sinks": dict(starts=[0, 13], real=[8, 3], t=8, prior=16, heads=4, kv_heads=2, sinks=True),
    "window and sinks": dict(starts=[17, 0], real=[6, 8], t=8, prior=24, heads=4, kv_heads=2, window=5, sinks=True),
    # The kernel's tiles: 64 keys, 64 queries (of a KV head's G*T), vectors of 8 or 16 floats.
    "several key tiles and query blocks": dict(
        starts=[150, 70, 0], real=[80, 33, 1], t=80, prior=160, heads=6, kv_heads=2, dim=64, sequence=256
    ),
    "several tiles, window and sinks": dict(
        starts=[150, 9],
        real=[70, 80],
        t=80,
        prior=160,
        heads=3,
        kv_heads=1,
        window=100,
        sinks=True,
        dim=64,
        sequence=256,
    ),
    # The kernel computes a padded query that repeats the last real one once and copies its output.
    "padding repeating the last query, over query blocks": dict(
        starts=[150, 9, 0],
        real=[70, 33, 80],
        t=80,
        prior=160,
        heads=6,
        kv_heads=2,
        dim=64,
        sequence=256,
        repeat_padding=True,
    ),
    "head dim off the vector width": dict(starts=[37, 0], real=[5, 8], t=8, prior=48, heads=4, kv_heads=2, dim=20),
    "head dim past the vector width": dict(starts=[29], real=[7], t=9, prior=32, heads=2, kv_heads=1, dim=72),
}


def _exact(inputs):
    """The definition in fp64."""
    return _definition(*(x.double() if torch.is_tensor(x) and x.is_floating_point() else x for x in inputs))


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("case", list(CASES))
def test_the_kernel_computes_the_masked_definition(case, block_size):
    """Within fp32 rounding: no further from the definition in fp64 than twice the masked form in fp32 is, or than 8
    ulps of the output's magnitude where the masked form happens to land closer (a short sum, e.g. one key)."""
    inputs = _case(**CASES[case], block_size=block_size)
    exact = _exact(inputs)
    rounding = (_definition(*inputs).double() - exact).abs().max().item()
    assert 0 < rounding < 1e-4
    ulps = 8 * torch.finfo(torch.float32).eps * exact.abs().max().item()
    out = chunk_attention_cpu(*inputs)
    assert (out.double() - exact).abs().max().item() <= max(2 * rounding, ulps)
    if CASES[case].get("repeat_padding"):  # a repeated query's output is the last real one's, bit for bit
        for i, r in enumerate(CASES[case]["real"]):
            assert torch.equal(out[i, r:], out[i, r - 1 : r].expand_as(out[i, r:]))


@pytest.mark.parametrize("block_size", [1, 16, None])
@pytest.mark.parametrize(
    "case",
    [
        "starts inside and at the bucket's end",
        "successive chunks of one request",
        "a prefix shared between rows",
        "window shorter than the prior",
        "several tiles, window and sinks",
    ],
)
def test_the_kernel_reads_each_rows_attended_prior_only(case, block_size):
    """Other values at every cache position no row attends (past each start, before its window, in block 0, in
    blocks no table names) change no bit of the kernel's result, NaN included."""
    inputs = _case(**CASES[case], block_size=block_size)
    expected = chunk_attention_cpu(*inputs)
    k_cache, v_cache, tables = inputs[3:6]
    stale = unread(k_cache, tables, _spans(inputs))
    assert stale[0].all()
    generator = torch.Generator().manual_seed(7)
    for fill in (lambda: torch.randn(int(stale.sum()), *k_cache.shape[2:], generator=generator), lambda: float("nan")):
        k_cache[stale], v_cache[stale] = fill(), fill()
        assert torch.equal(chunk_attention_cpu(*inputs), expected)


@pytest.mark.parametrize(
    "case", ["starts inside and at the bucket's end", "window and sinks", "several tiles, window and sinks"]
)
def test_bf16_matches_the_masked_definition_within_bf16_rounding(case):
    inputs = _case(**CASES[case], block_size=16, dtype=torch.bfloat16)
    out = chunk_attention_cpu(*inputs)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    torch.testing.assert_close(out, _definition(*inputs), atol=2e-2, rtol=2e-2)


def test_a_table_that_does_not_cover_the_prior_or_names_no_block_of_the_pool_is_refused():
    q, k, v, k_cache, v_cache, tables, *rest = _case(**CASES["starts inside and at the bucket's end"])
    with pytest.raises(RuntimeError, match="row 1 reads 16 positions, past its table of 3 blocks of 4"):
        chunk_attention_cpu(q, k, v, k_cache, v_cache, tables[:, :3], *rest)
    tables[2, 1] = -1
    with pytest.raises(RuntimeError, match="row 2 names block -1 of a pool of"):
        chunk_attention_cpu(q, k, v, k_cache, v_cache, tables, *rest)


def test_the_reference_is_the_ops_masked_definition():
    for case in ("a prefix shared between rows", "several tiles, window and sinks"):
        inputs = _case(**CASES[case], block_size=16)
        assert torch.equal(_definition(*inputs), masked_chunk_attention(*inputs))


def test_attend_chunk_writes_the_cache_then_attends_through_the_op():
    q, k, v, k_cache, v_cache, tables, positions, bias, window, scale, sinks = _case(
        **CASES["sinks"], repeat_padding=True
    )
    rows = kv_cache.CallRows.of(k_cache, tables, positions)
    caches = (k_cache.clone(), v_cache.clone())
    out = attend_chunk(q, k, v, *caches, rows, bias, positions, window, scale, sinks, op=True)
    assert torch.equal(caches[0], k_cache) and torch.equal(caches[1], v_cache)  # the case wrote the same K/V
    torch.testing.assert_close(
        out, masked_chunk_attention(q, k, v, k_cache, v_cache, tables, positions, bias, 0, scale, sinks)
    )


def test_an_fp8_cache_takes_the_masked_form_and_the_kernel_refuses_it():
    q, k, v, k_cache, v_cache, tables, positions, bias, window, scale, sinks = _case(**CASES["sinks"])
    kv_scales = (torch.tensor(0.05), torch.tensor(0.04))
    rows = kv_cache.CallRows.of(k_cache, tables, positions)
    caches = [torch.zeros(k_cache.shape, dtype=fp8.FP8_DTYPE) for _ in range(2)]
    out = attend_chunk(q, k, v, *caches, rows, bias, positions, window, scale, sinks, kv_scales, op=True)
    fresh = [torch.zeros(k_cache.shape, dtype=fp8.FP8_DTYPE) for _ in range(2)]
    expected = attend_chunk(q, k, v, *fresh, rows, bias, positions, window, scale, sinks, kv_scales, op=False)
    assert torch.equal(out, expected)
    with pytest.raises(RuntimeError, match="an FP8 cache takes the masked form"):
        chunk_attention_cpu(q, k, v, *caches, tables, positions, bias, window, scale, sinks)


def test_the_chunk_graphs_call_the_op_and_load_from_their_record(llama_logits):
    """Every graph with prompt chunks calls the op once per layer, in the program rebuilt from its record; the
    others keep their attention as it was. (Logits through it: every chunked test against HF.)"""
    model = llama_logits.model
    op = torch.ops.onp.chunk_attention.default
    calls = {
        spec: len(program.graph.find_nodes(op="call_function", target=op))
        for spec, program in model.graphs.programs.items()
    }
    chunked = {spec for spec in calls if spec.name in PREFILL_CHUNKS or spec.chunk}
    assert chunked and all(calls[spec] == 2 for spec in chunked)  # 2 layers
    assert all(calls[spec] == 0 for spec in calls if spec not in chunked)
    for spec in chunked:
        path = model.backend.graph_path(model.graphs_dir, spec)
        assert cpu_serde._record_text(path) is not None
