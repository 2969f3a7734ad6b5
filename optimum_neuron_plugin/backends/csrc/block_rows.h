// The rows of a KV cache held as a pool of blocks, [num_blocks, block_size, KVH, D] (vLLM's layout): a call row's
// cache position p is at block block_tables[i, p / block_size], offset p % block_size. Shared by the attention
// kernels, which address a tile's rows once, block by block, and then read them in place.

#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace onp_blocks {

// One call row's positions of one KV head in a cache.
template <typename scalar_t>
struct BlockRows {
  const scalar_t* head;  // the head's first value in block 0, offset 0
  const int64_t* table;  // the call row's block ids
  int64_t block_size, block_stride, position_stride;

  // cache: the pool's first value, strides: its four (in elements), table: the call row's block ids, h: the head.
  BlockRows(const scalar_t* cache, const int64_t* strides, int64_t block_size, const int64_t* table, int64_t h)
      : head(cache + h * strides[2]),
        table(table),
        block_size(block_size),
        block_stride(strides[0]),
        position_stride(strides[1]) {}

  // rows[j] = the row of position first + j, for j < count: a run of consecutive rows per block.
  void address(int64_t first, int64_t count, const scalar_t** rows) const {
    for (int64_t j = 0; j < count;) {
      const int64_t p = first + j, offset = p % block_size, run = std::min(block_size - offset, count - j);
      const scalar_t* row = head + table[p / block_size] * block_stride + offset * position_stride;
      for (int64_t x = 0; x < run; ++x) rows[j + x] = row + x * position_stride;
      j += run;
    }
  }
};

// Every cache line of `count` rows of `bytes` bytes, fetched ahead of their use (into L2): the rows of a head's
// positions are kv_heads * D apart, a stride the hardware prefetchers do not follow across pages.
template <typename scalar_t>
inline void prefetch(const scalar_t* const* rows, int64_t count, int64_t bytes) {
  for (int64_t j = 0; j < count; ++j) {
    const char* row = reinterpret_cast<const char*>(rows[j]);
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(row + b, 0, 2);
  }
}

// The block tables as int64 [n, W], after checking that each row's `ends[i]` positions are covered by its table and
// that the blocks they fall in are blocks of the pool.
inline at::Tensor checked_tables(const char* op, const at::Tensor& block_tables, const at::Tensor& cache,
                                 const std::vector<int64_t>& ends) {
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == static_cast<int64_t>(ends.size()), op,
              ": block_tables [n, W], one row per call row");
  const auto tables = block_tables.to(at::kLong).contiguous();
  const int64_t width = tables.size(1), block_size = cache.size(1), blocks = cache.size(0);
  const int64_t* ids = tables.data_ptr<int64_t>();
  for (int64_t i = 0; i < static_cast<int64_t>(ends.size()); ++i) {
    const int64_t used = (ends[i] + block_size - 1) / block_size;
    TORCH_CHECK(used <= width, op, ": row ", i, " reads ", ends[i], " positions, past its table of ", width,
                " blocks of ", block_size);
    for (int64_t b = 0; b < used; ++b) {
      const int64_t id = ids[i * width + b];
      TORCH_CHECK(0 <= id && id < blocks, op, ": row ", i, " names block ", id, " of a pool of ", blocks);
    }
  }
  return tables;
}

}  // namespace onp_blocks
