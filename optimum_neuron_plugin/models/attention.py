"""Attention of the active tokens against the KV cache, with GQA: write the new K/V, then attend the bucket."""

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
) -> torch.Tensor:
    """q [n, T, H, D], k/v [n, T, KVH, D] -> [n, T, H*D].

    Writes k/v into the cache at the call's rows and positions, then attends cache positions [0, L) of
    those rows under `bias` [n, 1, G*T, L] (masks.attention_bias; L: the graph's context bucket), or, given
    a `window` index (kv_cache.window_index), only the L positions it names.
    A call with one row per cache row (token_generation) attends every cache row, in slot order: its bias
    (and window) must already be in slot order (to_slots); other calls read copies of their rows.
    """
    kv_cache.write(k_cache, rows, k)
    kv_cache.write(v_cache, rows, v)
    length = bias.shape[-1]
    if window is not None:
        keys, values = kv_cache.read_window(k_cache, window, length), kv_cache.read_window(v_cache, window, length)
    elif rows.in_slot_order:
        keys, values = kv_cache.all_rows(k_cache, length), kv_cache.all_rows(v_cache, length)
    else:
        keys, values = kv_cache.read(k_cache, rows.seq_ids, length), kv_cache.read(v_cache, rows.seq_ids, length)
    if rows.in_slot_order:
        return _attend_rows(to_slots(q, rows.seq_ids), bias, keys, values, scale).index_select(0, rows.seq_ids)
    return _attend_rows(q, bias, keys, values, scale)


def to_slots(x: torch.Tensor, seq_ids: torch.Tensor) -> torch.Tensor:
    """Row i of x moved to row seq_ids[i] (int64). Padding rows repeat row 0 (same slot, same values);
    slots without a row get zeros (their queries attend every position equally: finite, and discarded)."""
    return torch.zeros_like(x).index_copy(0, seq_ids, x)


def _attend_rows(
    q: torch.Tensor, bias: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float | None
) -> torch.Tensor:
    n, t, heads, dim = q.shape
    kv_heads = keys.shape[1]
    groups = heads // kv_heads
    # GQA without repeating K/V: queries as [n, KVH, G*T, D] against keys [n, KVH, L, D].
    qg = q.view(n, t, kv_heads, groups, dim).permute(0, 2, 3, 1, 4).reshape(n, kv_heads, groups * t, dim)
    out = F.scaled_dot_product_attention(qg, keys, values, attn_mask=bias, scale=scale)  # [n, KVH, G*T, D]
    return out.view(n, kv_heads, groups, t, dim).permute(0, 3, 1, 2, 4).reshape(n, t, heads * dim)
