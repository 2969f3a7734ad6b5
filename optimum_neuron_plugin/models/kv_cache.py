"""KV cache: one K and one V tensor per layer, [cache_rows, S, kv_heads, head_dim], written in place.

Row r holds sequence slot seq_id r. The layout makes the flat index `seq_id * S + position`
a plain view, so each graph writes its new K/V with one scatter (index_copy_) into the state
it was given; the cache never travels to the host.
"""

from __future__ import annotations

import torch


def empty_cache(
    num_layers: int, rows: int, sequence_length: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> list[torch.Tensor]:
    shape = (rows, sequence_length, kv_heads, head_dim)
    return [torch.zeros(shape, dtype=dtype) for _ in range(2 * num_layers)]


def write(cache: torch.Tensor, seq_ids: torch.Tensor, position_ids: torch.Tensor, values: torch.Tensor) -> None:
    """Scatter values [n, T, kv_heads, head_dim] to rows seq_ids [n] at positions position_ids [n, T]."""
    rows, length, kv_heads, head_dim = cache.shape
    flat_index = (seq_ids[:, None] * length + position_ids).reshape(-1)
    cache.view(rows * length, kv_heads, head_dim).index_copy_(0, flat_index, values.reshape(-1, kv_heads, head_dim))


def read(cache: torch.Tensor, seq_ids: torch.Tensor) -> torch.Tensor:
    """The cached rows of seq_ids: [n, S, kv_heads, head_dim]."""
    return cache.index_select(0, seq_ids)
