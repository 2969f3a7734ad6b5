"""Attention of the active tokens against the KV cache, with GQA. Both forms write the new K/V into the cache first.

- attend (decode rows, context_encoding): the rows attend cache positions [0, L), themselves included.
- attend_chunk (prompt chunks): a chunk attends the prior context, cache positions [0, P) under a key-length mask,
  and its own causal block from its new K/V (not read back from the cache). Both pieces go through one fused
  softmax over the keys [prior | own]: the kernel's running max and sum merge the two partial softmaxes by their
  log-sum-exp, block by block, without materialising the scores (an explicit merge of two materialised
  softmaxes measured 2.5-4.8x slower on CPU, docs/attention-split.md).

A chunk's attention is one op, `onp::chunk_attention`, and so is the attention of decode rows on the cache in
place (token_generation), `onp::decode_attention`. Each op's definition below is the masked form: the form every
backend can compile (TorchNeuron captures it whole). A backend may register a kernel that computes the same function
reading only the keys the mask leaves: the CPU backend's (backends/cpu_attention.py) reads each chunk row's prior up
to its start, without a mask, then its own block causally, in one flash pass; and reads a decode call's
cache positions up to its last token's, not the whole bucket.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import kv_cache


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rows: kv_cache.CallRows,
    bias: torch.Tensor,
    window: torch.Tensor | None = None,
    scale: float | None = None,
    sinks: torch.Tensor | None = None,
    kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    positions: torch.Tensor | None = None,
    op: bool = False,
) -> torch.Tensor:
    """q [n, T, H, D], k/v [n, T, KVH, D] -> [n, T, H*D]. `sinks` [H]: attention sinks (attend_rows).
    `kv_scales`: the layer's K and V scales of an FP8 cache (kv_cache.to_cache / from_cache).
    op: the rows attend through the op `onp::decode_attention`, which a backend's kernel may run, given `positions`
    [n, T] (the rows' positions); not in a sliding window's span or on an FP8 cache, which take the plain form.

    Writes k/v into the cache at the call's slots, then attends cache positions [0, L) of those rows through
    their block tables under `bias` [n, 1, G*T, L] (masks.attention_bias; L: the graph's context bucket), or,
    given a `window` index (kv_cache.window_index), only the L positions it names.
    """
    k_scale, v_scale = kv_scales or (None, None)
    kv_cache.write(k_cache, rows, kv_cache.to_cache(k, k_scale))
    kv_cache.write(v_cache, rows, kv_cache.to_cache(v, v_scale))
    if window is None and kv_scales is None:  # the kernel reads the cache as it is: an FP8 cache takes the plain form
        if op:
            return decode_attention(q, bias, k_cache, v_cache, rows.tables, positions, scale, sinks)
        return attend_cache(q, bias, k_cache, v_cache, rows.tables, scale, sinks)
    length = bias.shape[-1]
    if window is not None:
        keys, values = kv_cache.read_window(k_cache, window, length), kv_cache.read_window(v_cache, window, length)
    else:
        keys, values = kv_cache.read(k_cache, rows.tables, length), kv_cache.read(v_cache, rows.tables, length)
    keys, values = kv_cache.from_cache(keys, k_scale, q.dtype), kv_cache.from_cache(values, v_scale, q.dtype)
    return attend_rows(q, bias, keys, values, scale, sinks)


def attend_cache(
    q: torch.Tensor,
    bias: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    scale: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """Rows whose block tables are `tables` [n, W] (q [n, T, H, D]) attend their cache positions [0, L) under
    `bias` [n, 1, G*T, L]: [n, T, H*D]."""
    length = bias.shape[-1]
    keys, values = kv_cache.read(k_cache, tables, length), kv_cache.read(v_cache, tables, length)
    return attend_rows(q, bias, keys, values, scale, sinks)


def attend_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    rows: kv_cache.CallRows,
    bias: torch.Tensor,
    positions: torch.Tensor,
    window: int = 0,
    scale: float | None = None,
    sinks: torch.Tensor | None = None,
    kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    op: bool = False,
) -> torch.Tensor:
    """q [n, T, H, D], k/v [n, T, KVH, D] -> [n, T, H*D], for n prompt chunks (successive chunks of one prompt may
    share a cache row: every row's K/V is written before any row attends, so a chunk sees those before it).
    With an FP8 cache (`kv_scales`) the chunk attends its own K/V as stored, like any later call reads them.

    Writes k/v into the cache, then attends [cache positions 0..P-1 of the rows | the chunk's own k/v] under
    `bias` [n, 1, G*T, P + T] (masks.chunk_bias; P: the graph's prior bucket, 0 for a graph of first chunks).
    `positions` [n, T]: each row's positions (a padded row repeats its last); `window`: the layer's sliding window (0:
    none), the one in `bias`. With an FP8 cache (`kv_scales`) the chunk attends its own K/V as stored, like any
    later call reads them.
    op: as the op `onp::chunk_attention`, which a backend's kernel may run (masked_chunk_attention otherwise)."""
    k_scale, v_scale = kv_scales or (None, None)
    k, v = kv_cache.to_cache(k, k_scale), kv_cache.to_cache(v, v_scale)
    kv_cache.write(k_cache, rows, k)
    kv_cache.write(v_cache, rows, v)
    k, v = kv_cache.from_cache(k, k_scale, q.dtype), kv_cache.from_cache(v, v_scale, q.dtype)
    if op and kv_scales is None:  # the kernel reads the cache as it is: an FP8 cache takes the masked form
        return chunk_attention(q, k, v, k_cache, v_cache, rows.tables, positions, bias, window, scale, sinks)
    return masked_chunk_attention(
        q, k, v, k_cache, v_cache, rows.tables, positions, bias, window, scale, sinks, kv_scales
    )  # fmt: skip


def masked_chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    positions: torch.Tensor,
    bias: torch.Tensor,
    window: int = 0,
    scale: float | None = None,
    sinks: torch.Tensor | None = None,
    kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The chunk attention's definition: [cache positions 0..P-1 of the rows' blocks (`tables` [n, W]) | the chunk's own
    k/v] under `bias`.

    `positions` [n, T] (each row's positions, padding repeating the last real one) and `window` (the layer's sliding
    window, 0 for none) only say which keys `bias` leaves to a query: for row i starting at s, cache positions
    [max(0, s - window + 1), s) (every one of them without a window) and, without a window, the own keys causally up
    to the last real one. This form reads the whole prior bucket and ignores them."""
    prior = bias.shape[-1] - q.shape[1]
    keys, values = k.transpose(1, 2), v.transpose(1, 2)  # [n, KVH, T, D]
    if prior:
        k_scale, v_scale = kv_scales or (None, None)
        prior_keys = kv_cache.from_cache(kv_cache.read(k_cache, tables, prior), k_scale, q.dtype)
        prior_values = kv_cache.from_cache(kv_cache.read(v_cache, tables, prior), v_scale, q.dtype)
        keys, values = torch.cat((prior_keys, keys), dim=2), torch.cat((prior_values, values), dim=2)
    else:  # the CPU kernel runs ~25% slower on the transposed views
        keys, values = keys.contiguous(), values.contiguous()
    return attend_rows(q, bias, keys, values, scale, sinks)


@torch.library.custom_op("onp::chunk_attention", mutates_args=())
def chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    positions: torch.Tensor,
    bias: torch.Tensor,
    window: int,
    scale: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """masked_chunk_attention as one op of the exported program: a backend's kernel replaces this form."""
    return masked_chunk_attention(q, k, v, k_cache, v_cache, tables, positions, bias, window, scale, sinks)


@chunk_attention.register_fake
def _chunk_attention_shape(q, k, v, k_cache, v_cache, tables, positions, bias, window, scale, sinks) -> torch.Tensor:
    n, t, heads, dim = q.shape
    return q.new_empty(n, t, heads * dim)


@torch.library.custom_op("onp::decode_attention", mutates_args=())
def decode_attention(
    q: torch.Tensor,
    bias: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    positions: torch.Tensor,
    scale: float | None,
    sinks: torch.Tensor | None,
) -> torch.Tensor:
    """attend_cache as one op of the exported program: a backend's kernel replaces this form. `positions` [n, T] (the
    rows' positions) only say which keys `bias` leaves: none past the call's last position."""
    return attend_cache(q, bias, k_cache, v_cache, tables, scale, sinks)


@decode_attention.register_fake
def _decode_attention_shape(q, bias, k_cache, v_cache, tables, positions, scale, sinks) -> torch.Tensor:
    n, t, heads, dim = q.shape
    return q.new_empty(n, t, heads * dim)


def _with_sinks(keys, values, bias, sinks: torch.Tensor, tokens: int):
    """Attention sinks as one more key: a zero key and value, its logit the head's sink through the bias. It joins
    every query's softmax (its exp adds to the sum) and adds nothing to the output; no fill value is involved."""
    n, kv_heads, _, dim = keys.shape
    zero = keys.new_zeros(n, kv_heads, 1, dim)
    column = sinks.to(bias.dtype).view(1, kv_heads, -1, 1).repeat_interleave(tokens, dim=2).expand(n, -1, -1, -1)
    bias = torch.cat((bias.expand(n, kv_heads, -1, -1), column), dim=-1)
    return torch.cat((keys, zero), dim=2), torch.cat((values, zero), dim=2), bias


def attend_rows(
    q: torch.Tensor,
    bias: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scale: float | None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    n, t, heads, dim = q.shape
    kv_heads = keys.shape[1]
    groups = heads // kv_heads
    # GQA without repeating K/V: queries as [n, KVH, G*T, D] against keys [n, KVH, L, D].
    qg = q.view(n, t, kv_heads, groups, dim).permute(0, 2, 3, 1, 4).reshape(n, kv_heads, groups * t, dim)
    if sinks is not None:
        keys, values, bias = _with_sinks(keys, values, bias, sinks, t)
    if t == 1 and q.dtype == torch.float32:
        out = _attend_one_token(qg, keys, values, bias, scale)
    else:
        out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=bias, scale=scale)  # [n, KVH, G*T, D]
    return out.view(n, kv_heads, groups, t, dim).permute(0, 3, 1, 2, 4).reshape(n, t, heads * dim)


def _attend_one_token(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float | None
) -> torch.Tensor:
    """A decode row's G queries per KV head as two products and a softmax, each streaming the bucket's keys or values
    once: on CPU faster than the fused kernel for these few queries (docs/DESIGN.md, KV cache and context buckets)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q * scale, keys.transpose(-1, -2)) + bias
    return torch.matmul(torch.softmax(scores, dim=-1), values)
