"""The CPU kernels of the attention ops (models/attention.py): the same functions as their masked definitions,
computed over the keys the mask leaves and nothing else. Both are C++ (csrc/), built and registered as the ops' CPU
kernels by cpu_kernels.py, so that a replayed program calls each as one op without returning to Python.

Both read the KV cache in place through the call rows' block tables: a pool of blocks [num_blocks, block_size, KVH,
D] per layer, row i's cache position p at block block_tables[i, p // block_size], offset p % block_size. A tile of
keys is addressed block by block of the table (csrc/block_rows.h), never gathered into a copy of the row.

- `onp::chunk_attention` (prompt chunks; csrc/chunk_attention.cpp): the masked form runs PyTorch's CPU flash kernel
  over [the whole prior bucket | the own block] under the chunk's bias, where a masked key costs what a live one does
  (docs/attention-split.md). The kernel is one register-blocked flash pass per row over its prior, read through its
  table up to its start, then its own block causally; sliding layers add the bias's columns for those keys.
- `onp::decode_attention` (decode rows; csrc/decode_attention.cpp): the definition attends the whole context bucket;
  the kernel reads each call row's cache positions up to its last one, all of a position's KV heads in one pass.

A key the bias masks for every query weighs exactly 0 in the masked forms (exp of the -1e9 fill underflows), so
leaving it out changes the result by the rounding of another summation order only (tests/core/test_chunk_kernel.py,
tests/core/test_decode_kernel.py). Positions a row does not attend (past its last, block 0's padding) are never read.
"""

from __future__ import annotations

import torch

from . import cpu_kernels

cpu_kernels.load()
# On CPU tensors the ops run their C++ kernels.
chunk_attention_cpu = torch.ops.onp.chunk_attention.default
decode_attention_cpu = torch.ops.onp.decode_attention.default
