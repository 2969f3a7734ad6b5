"""KV cache: one K and one V tensor per layer, [cache_rows, kv_heads, S, head_dim], written in place.

Row r holds sequence slot seq_id r. A token's K/V for head h lives at flat row
`(seq_id * kv_heads + h) * S + position` of the cache viewed as [rows * kv_heads * S, head_dim],
so each graph writes all its new K/V with one scatter (index_copy_) into the state it was given;
the cache never travels to the host. Reads need no transpose: a row is already [kv_heads, S, head_dim].
An FP8 cache (NeuronConfig.kv_cache_dtype) stores K/V divided by the layer's scale (to_cache) and attention reads
them back times the scale in the model dtype (from_cache); copy_prefix copies the stored bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import fp8


def empty_cache(
    num_layers: int, rows: int, sequence_length: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> list[torch.Tensor]:
    shape = (rows, kv_heads, sequence_length, head_dim)
    return [torch.zeros(shape, dtype=dtype) for _ in range(2 * num_layers)]


@dataclass(frozen=True)
class CallRows:
    """Where one graph call's tokens go in the cache, computed once per call and shared by every layer."""

    seq_ids: torch.Tensor  # [n] int64: the cache row of each call row
    flat_index: torch.Tensor  # [n * T * kv_heads]: the flat cache row of each new K/V vector (see module doc)
    in_slot_order: bool  # one call row per cache row (token_generation): attention runs on the cache in place

    @classmethod
    def of(cls, cache: torch.Tensor, seq_ids: torch.Tensor, position_ids: torch.Tensor) -> CallRows:
        rows, kv_heads, length, _ = cache.shape
        seq_ids = seq_ids.long()  # index_copy_ takes int64 indices only (torch checks it)
        heads = torch.arange(kv_heads, device=cache.device)
        flat_index = (seq_ids[:, None, None] * kv_heads + heads) * length + position_ids[:, :, None]
        return cls(seq_ids, flat_index.reshape(-1), seq_ids.shape[0] == rows)


def write(cache: torch.Tensor, rows: CallRows, values: torch.Tensor) -> None:
    """The KV scatter: values [n, T, kv_heads, head_dim] to the rows and positions of the call."""
    # index_copy_ on a view of the cache input: TorchNeuron's Dynamo backend records it as a mutation of
    # that input (aliasing_analysis.py, INPLACE_METHODS) and aliases it to an output, so the cache is
    # updated in place on the device.
    head_dim = cache.shape[-1]
    if fp8.is_fp8(cache):  # torch has no CPU index_copy_ kernel for FP8: the same scatter as an index_put_
        cache.view(-1, head_dim).index_put_((rows.flat_index,), values.reshape(-1, head_dim))
        return
    cache.view(-1, head_dim).index_copy_(0, rows.flat_index, values.reshape(-1, head_dim))


def to_cache(values: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """K or V as an FP8 cache stores them (models/fp8.py: values / scale within +-240); unchanged without a scale."""
    return values if scale is None else fp8.quantize_kv(values, scale)


def from_cache(stored: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """What attention computes with: an FP8 cache's values times their scale, in `dtype`."""
    return stored if scale is None else fp8.dequantize_kv(stored, scale, dtype)


def copy_prefix(cache: torch.Tensor, source: torch.Tensor, destination: torch.Tensor, length: int) -> None:
    """Positions [0, length) of row source[0] written onto row destination[0] (int tensors [1]), in place: the
    rows are read first (a copy), then scattered like a call's new K/V, so source == destination changes nothing."""
    positions = torch.arange(length, dtype=torch.int32, device=cache.device)[None]
    values = read(cache, source, length).transpose(1, 2)  # [1, length, kv_heads, head_dim]
    write(cache, CallRows.of(cache, destination, positions), values)


def read(cache: torch.Tensor, seq_ids: torch.Tensor, bucket: int) -> torch.Tensor:
    """Positions [0, bucket) of the rows seq_ids: [n, kv_heads, bucket, head_dim] (a copy of n rows)."""
    return cache[:, :, :bucket].index_select(0, seq_ids)


def window_index(cache: torch.Tensor, seq_ids: torch.Tensor, starts: torch.Tensor, span: int) -> torch.Tensor:
    """The flat cache rows of positions [starts[i], starts[i] + span) of rows seq_ids[i], every head:
    [n * kv_heads * span], in the order read_window returns them."""
    _, kv_heads, length, _ = cache.shape
    # int32 (int64 is emulated on NeuronCores): index_select takes int32 indices, and the flat index stays below
    # the cache's rows x heads x positions.
    heads = torch.arange(kv_heads, dtype=torch.int32, device=cache.device)[None, :, None]
    positions = starts.to(torch.int32)[:, None, None] + torch.arange(span, dtype=torch.int32, device=cache.device)
    return ((seq_ids.to(torch.int32)[:, None, None] * kv_heads + heads) * length + positions).reshape(-1)


def read_window(cache: torch.Tensor, index: torch.Tensor, span: int) -> torch.Tensor:
    """A sliding-window layer's read (window_index): [n, kv_heads, span, head_dim], span positions per row
    whatever the context bucket."""
    _, kv_heads, _, head_dim = cache.shape
    return cache.view(-1, head_dim).index_select(0, index).view(-1, kv_heads, span, head_dim)


def all_rows(cache: torch.Tensor, bucket: int) -> torch.Tensor:
    """Positions [0, bucket) of every row, in slot order: a view, nothing is copied."""
    return cache[:, :, :bucket]
