"""Block pools for the attention kernels' tests (test_decode_kernel.py, test_chunk_kernel.py): tables whose blocks
are scattered and out of order, prefixes shared between rows, padded entries on the null block 0, and the reference
read of a row's positions through its table (the masked forms' gather)."""

from __future__ import annotations

import torch


def block_tables(
    lengths: list[int], block_size: int, width: int, generator: torch.Generator, shared: dict[int, tuple[int, int]]
) -> tuple[torch.Tensor, int]:
    """int32 [n, width]: row i owns the blocks covering positions [0, lengths[i]), drawn from a shuffled pool, and
    its entries past them name block 0; shared {i: (j, p)}: row i's blocks wholly inside positions [0, p) are row
    j's. Returns the tables and the pool's size: block 0, every row's blocks, and two blocks no row names."""
    used = [-(-length // block_size) for length in lengths]
    blocks = 1 + sum(used) + 2
    pool = (torch.randperm(blocks - 1, generator=generator) + 1).tolist()
    tables = torch.zeros(len(lengths), width, dtype=torch.int32)
    for i, count in enumerate(used):
        tables[i, :count] = torch.tensor(pool[:count], dtype=torch.int32)
        pool = pool[count:]
    for i, (j, prefix) in shared.items():
        tables[i, : prefix // block_size] = tables[j, : prefix // block_size]
    return tables, blocks


def read(cache: torch.Tensor, tables: torch.Tensor, length: int) -> torch.Tensor:
    """Positions [0, length) of each row through its table: [n, KVH, length, D]."""
    blocks = cache[tables.long()]  # [n, W, block_size, KVH, D]
    n, width, block_size, kv_heads, dim = blocks.shape
    return blocks.reshape(n, width * block_size, kv_heads, dim)[:, :length].transpose(1, 2)


def write(cache: torch.Tensor, tables: torch.Tensor, positions: list[list[int]], values: torch.Tensor) -> None:
    """values[i, u] (of [n, T, KVH, D]) to row i's position positions[i][u] through its table."""
    block_size = cache.shape[1]
    for i, row in enumerate(positions):
        for u, p in enumerate(row):
            cache[tables[i, p // block_size], p % block_size] = values[i, u]


def unread(cache: torch.Tensor, tables: torch.Tensor, spans: list[tuple[int, int]]) -> torch.Tensor:
    """bool [blocks, block_size]: the cache positions that no row i reads in its span [low, end) of positions."""
    block_size = cache.shape[1]
    mask = torch.ones(cache.shape[:2], dtype=torch.bool)
    for i, (low, end) in enumerate(spans):
        for p in range(low, end):
            mask[tables[i, p // block_size], p % block_size] = False
    return mask
