"""KV cache: a pool of blocks, one K and one V tensor per layer, [num_blocks, block_size, kv_heads, head_dim],
written in place.

A block holds block_size consecutive positions of one sequence; which blocks a sequence owns is its block table, a
row of block ids that every graph takes as an input ([n, max_blocks] int32, graph_inputs.TokenRows). Position p of
row i lives in block tables[i, p // block_size] at offset p % block_size: its slot is block * block_size + offset,
and the K/V vector of head h is flat row `slot * kv_heads + h` of the cache viewed as [slots * kv_heads, head_dim]
(vLLM's own block layout: a block is one contiguous region, a write needs no division). Each graph writes all its
new K/V with one scatter (index_copy_) into the state it was given; the cache never travels to the host.
Block 0 is the null block (vLLM's BlockPool reserves id 0): table entries past a sequence's blocks point at it and
attention masks what is read there. Contiguous rows are the case of one block per row (block_size = sequence_length).
An FP8 cache (NeuronConfig.kv_cache_dtype) stores K/V divided by the layer's scale (to_cache) and attention reads
them back times the scale in the model dtype (from_cache); copy_blocks copies the stored bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import fp8

NULL_BLOCK = 0


def empty_pools(
    num_layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> list[torch.Tensor]:
    """Per layer one tensor [2, num_blocks, block_size, kv_heads, head_dim]: its K pool then its V pool (what KV
    connectors register, vllm/runner/kv_transfer.py); the graphs take the two halves (split_pools)."""
    return [torch.zeros((2, num_blocks, block_size, kv_heads, head_dim), dtype=dtype) for _ in range(num_layers)]


def split_pools(pools: list[torch.Tensor]) -> list[torch.Tensor]:
    """The graphs' cache list: K then V of each layer, contiguous views of the layer's pool."""
    return [half for pool in pools for half in pool.unbind(0)]


def empty_cache(
    num_layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> list[torch.Tensor]:
    """The graphs' cache list as separate tensors (what export traces with: no input aliases another)."""
    shape = (num_blocks, block_size, kv_heads, head_dim)
    return [torch.zeros(shape, dtype=dtype) for _ in range(2 * num_layers)]


def table_width(length: int, block_size: int) -> int:
    """Block table entries that cover positions [0, length)."""
    return -(-length // block_size)


def slots(tables: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """[n, T] int32: the cache slot of each position [n, T] of rows whose block tables are `tables` [n, W]."""
    n, width = tables.shape
    # index_select into the flat tables takes int32 indices (gather only int64, which NeuronCores emulate)
    entries = torch.arange(n, dtype=torch.int32, device=tables.device)[:, None] * width + positions // block_size
    blocks = tables.reshape(-1).index_select(0, entries.reshape(-1)).view(positions.shape)
    return blocks * block_size + positions % block_size


@dataclass(frozen=True)
class CallRows:
    """Where one graph call's tokens go in the cache and which blocks its rows read, computed once per call and
    shared by every layer."""

    tables: torch.Tensor  # [n, W] int32: each call row's block table
    flat_index: torch.Tensor  # [n * T * kv_heads] int64: the flat cache row of each new K/V vector (see module doc)

    @classmethod
    def of(cls, cache: torch.Tensor, tables: torch.Tensor, position_ids: torch.Tensor) -> CallRows:
        _, block_size, kv_heads, _ = cache.shape
        heads = torch.arange(kv_heads, device=cache.device)
        write_slots = slots(tables, position_ids, block_size).long()  # index_copy_ takes int64 indices only
        flat_index = write_slots[:, :, None] * kv_heads + heads
        return cls(tables, flat_index.reshape(-1))


def write(cache: torch.Tensor, rows: CallRows, values: torch.Tensor) -> None:
    """The KV scatter: values [n, T, kv_heads, head_dim] to the slots of the call's positions."""
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


def copy_blocks(cache: torch.Tensor, source: torch.Tensor, destination: torch.Tensor) -> None:
    """Blocks source[j] written onto blocks destination[j] (int tensors [W]), in place: the blocks are read first (a
    copy), so a block copied onto itself is unchanged."""
    blocks = cache.index_select(0, source)
    write_blocks = destination.long()  # index_copy_ takes int64 indices only
    if fp8.is_fp8(cache):  # as in write: torch has no CPU index_copy_ kernel for FP8
        cache.index_put_((write_blocks,), blocks)
        return
    cache.index_copy_(0, write_blocks, blocks)


def read(cache: torch.Tensor, tables: torch.Tensor, length: int) -> torch.Tensor:
    """Positions [0, length) of the rows whose block tables are `tables` [n, W]: [n, kv_heads, length, head_dim]
    (a gather copy; positions past a row's blocks read the null block)."""
    n = tables.shape[0]
    _, block_size, kv_heads, head_dim = cache.shape
    blocks = cache.index_select(0, tables[:, : table_width(length, block_size)].reshape(-1))
    return blocks.view(n, -1, kv_heads, head_dim)[:, :length].transpose(1, 2)


def window_index(cache: torch.Tensor, tables: torch.Tensor, starts: torch.Tensor, span: int) -> torch.Tensor:
    """The flat cache rows of positions [starts[i], starts[i] + span) of rows i, every head: [n * span * kv_heads],
    in the order read_window takes them."""
    _, block_size, kv_heads, _ = cache.shape
    positions = starts.to(torch.int32)[:, None] + torch.arange(span, dtype=torch.int32, device=cache.device)
    heads = torch.arange(kv_heads, dtype=torch.int32, device=cache.device)
    # int32 (int64 is emulated on NeuronCores): index_select takes int32 indices, and the flat index stays below
    # the cache's slots x heads.
    return (slots(tables, positions, block_size)[:, :, None] * kv_heads + heads).reshape(-1)


def read_window(cache: torch.Tensor, index: torch.Tensor, span: int) -> torch.Tensor:
    """A sliding-window layer's read (window_index): [n, kv_heads, span, head_dim], span positions per row
    whatever the context bucket."""
    _, _, kv_heads, head_dim = cache.shape
    return cache.view(-1, head_dim).index_select(0, index).view(-1, span, kv_heads, head_dim).transpose(1, 2)
