"""Which KV cache blocks each slot owns: the block tables every graph row takes (models/kv_cache.py).

The host loops name a sequence by its slot, a row of the batch (0..batch_size-1); a graph call's rows carry their
slots' tables. Two owners fill them:
- this allocator (the Python API: prefill, decode, generate, ...): a slot gets blocks from the free list as its
  positions grow and gives them all back when a prefill restarts it at position 0;
- vLLM's KV cache manager (`vllm serve`): the runner writes each request's block ids into its slot (`assign`), and
  the allocator stays off.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..config import NeuronConfig
from ..errors import InputError
from ..graph_inputs import INDEX_DTYPE
from ..models.kv_cache import NULL_BLOCK, table_width


class BlockTables:
    def __init__(self, neuron_config: NeuronConfig) -> None:
        nc = neuron_config
        self.block_size, self.num_blocks = nc.block_size, nc.num_blocks
        self.table = torch.full((nc.batch_size, nc.blocks_per_sequence), NULL_BLOCK, dtype=INDEX_DTYPE)
        self.owned = [0] * nc.batch_size  # blocks each slot holds, from the allocator
        self.free = list(range(nc.num_blocks - 1, NULL_BLOCK, -1))  # popped from the end: 1, 2, ...
        self.allocating = True

    def rows(self, seq_ids: Sequence[int]) -> torch.Tensor:
        """The block tables of slots seq_ids: [n, blocks_per_sequence] int32, a copy."""
        return self.table[list(seq_ids)]

    def reserve(self, seq_id: int, end: int, restart: bool = False) -> None:
        """Slot seq_id will hold positions up to `end`: blocks for them (restart: a new sequence, its old blocks
        freed first). Nothing to do when vLLM owns the blocks."""
        if not self.allocating:
            return
        if restart:
            self.release(seq_id)
        needed = table_width(end, self.block_size) - self.owned[seq_id]
        if needed > len(self.free):  # refused before any block is taken: a refused call holds nothing more
            raise InputError(
                f"the KV cache pool is full: its {self.num_blocks - 1} blocks of {self.block_size} positions are "
                "held by other slots; restart a slot (prefill at position 0) or export with a larger --num-blocks"
            )
        for _ in range(needed):
            self.table[seq_id, self.owned[seq_id]] = self.free.pop()
            self.owned[seq_id] += 1

    def release(self, seq_id: int) -> None:
        """Slot seq_id's blocks back to the free list."""
        held = self.table[seq_id, : self.owned[seq_id]].tolist()
        self.free.extend(reversed(held))
        self.table[seq_id] = NULL_BLOCK
        self.owned[seq_id] = 0

    def assign(self, seq_id: int, block_ids: Sequence[int]) -> None:
        """Slot seq_id's blocks as vLLM allocated them (the allocator is off from the first call on)."""
        self.allocating = False
        if len(block_ids) > self.table.shape[1]:
            raise InputError(
                f"{len(block_ids)} blocks for one sequence: at most {self.table.shape[1]} fit sequence_length"
            )
        self.table[seq_id] = NULL_BLOCK
        self.table[seq_id, : len(block_ids)] = torch.tensor(block_ids, dtype=INDEX_DTYPE)
