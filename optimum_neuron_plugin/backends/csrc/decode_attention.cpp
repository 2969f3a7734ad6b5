// The CPU kernel of onp::decode_attention (models/attention.py).
//
// Call row i (tokens at positions[i]) attends its cache positions [0, last_i + 1), where last_i is its largest
// position: every key past it is masked for every one of its queries, so leaving it out changes the result by the
// rounding of a shorter sum only. The caches are pools of blocks [num_blocks, block_size, KVH, D] read in place: row
// i's position p is at cache[block_tables[i, p / block_size], p % block_size]. Scores add the bias's columns for
// those positions (the causal mask between a verify row's tokens, a sliding window); the softmax runs in fp32, an
// attention sink adds exp(sink - max) to its sum.
//
// One work item per call row and group of its KV heads (all of them unless threads would lack items): a position's
// heads are adjacent in its block, so the item's pass reads them together. Its G*T queries per head read the keys and
// values in tiles that stay in the L1 cache while every query uses them, so each key and value comes from memory
// once. A tile's rows are addressed once, block by block of the table, and the next tile's are prefetched meanwhile.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "block_rows.h"
#include "vec8.h"
#include "work_queue.h"

namespace {

using namespace onp_vec;
using onp_blocks::BlockRows;
using onp_blocks::checked_tables;
using onp_blocks::prefetch;

// Keys per tile. A head's keys are kv_heads * D values apart, often a multiple of 4 KiB: rows that share their L1 set,
// so a tile stays in L1 while the head's queries reuse it only if it has few of them.
constexpr int64_t TILE = 32;

// q . k over `dim`, four keys (rows k[0..3] + offset) at once: four independent accumulators, 8 wide, then a scalar
// tail past the last multiple of 8.
template <typename scalar_t>
inline void dot4(const float* q, const scalar_t* const* k, int64_t offset, int64_t dim, float* out) {
  const scalar_t *k0 = k[0] + offset, *k1 = k[1] + offset, *k2 = k[2] + offset, *k3 = k[3] + offset;
  v8f a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t d = 0;
  for (; d + 8 <= dim; d += 8) {
    const v8f x = load8(q + d);
    a0 += x * load8(k0 + d);
    a1 += x * load8(k1 + d);
    a2 += x * load8(k2 + d);
    a3 += x * load8(k3 + d);
  }
  out[0] = sum8(a0), out[1] = sum8(a1), out[2] = sum8(a2), out[3] = sum8(a3);
  for (; d < dim; ++d) {
    for (int64_t key = 0; key < 4; ++key) out[key] += q[d] * static_cast<float>(k[key][offset + d]);
  }
}

template <typename scalar_t>
inline float dot1(const float* q, const scalar_t* k, int64_t dim) {
  v8f a = {};
  int64_t d = 0;
  for (; d + 8 <= dim; d += 8) a += load8(q + d) * load8(k + d);
  float sum = sum8(a);
  for (; d < dim; ++d) sum += q[d] * static_cast<float>(k[d]);
  return sum;
}


// Softmax of one query's scores in place, under its bias row (stride `step`) and an optional sink.
template <typename scalar_t>
void softmax(float* s, const scalar_t* bias, int64_t step, int64_t length, const float* sink) {
  float top = sink ? *sink : -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : top)
  for (int64_t j = 0; j < length; ++j) {
    s[j] += static_cast<float>(bias[j * step]);
    top = std::max(top, s[j]);
  }
  v8f sums = {};
  int64_t j = 0;
  for (; j + 8 <= length; j += 8) {
    const v8f e = exp8(load8(s + j) - top);
    std::memcpy(s + j, &e, sizeof(e));
    sums += e;
  }
  float sum = sum8(sums) + (sink ? exp1(*sink - top) : 0.f);
  for (; j < length; ++j) sum += (s[j] = exp1(s[j] - top));
  const float inv = 1.f / sum;
#pragma omp simd
  for (int64_t k = 0; k < length; ++k) s[k] *= inv;
}

struct Shapes {
  int64_t tokens, dim, groups, queries;
};

// One work item's KV heads [h0, h0 + heads) of one call row, all read in one pass over its positions: a position's
// heads are adjacent in a block, so the pass reads each block's span of them front to back.
struct Heads {
  int64_t h0, heads;
};

// Double-buffered row pointers of a pass over tiles: the current tile's, and the next one's, addressed and prefetched
// while the current one is used.
template <typename scalar_t>
struct TileRows {
  const BlockRows<scalar_t>& cache;
  int64_t length, bytes;  // bytes: the span of one position's heads read
  const scalar_t** rows;  // 2 * TILE

  const scalar_t* const* start() const {
    cache.address(0, std::min(TILE, length), rows);
    return rows;
  }
  // The rows of tile `tile` (the current one), after addressing and prefetching the next.
  const scalar_t* const* at(int64_t tile) const {
    const scalar_t** here = rows + (tile / TILE % 2) * TILE;
    if (tile + TILE < length) {
      const scalar_t** next = rows + (tile / TILE % 2 ? 0 : TILE);
      const int64_t count = std::min(TILE, length - tile - TILE);
      cache.address(tile + TILE, count, next);
      prefetch(next, count, bytes);
    }
    return here;
  }
};

// One query's output over one head's tile: acc[0, dim) += sum over the tile's keys j of p[j] v[j].
template <typename scalar_t>
inline void accumulate(const float* p, const scalar_t* const* rows, int64_t offset, int64_t len, int64_t dim,
                       float* acc) {
  for (int64_t d = 0; d < dim; d += 32) {  // four vectors of accumulators (one past a multiple of 32), in registers
    float* out = acc + d;
    if (d + 32 <= dim) {
      v8f a0 = load8(out), a1 = load8(out + 8), a2 = load8(out + 16), a3 = load8(out + 24);
      for (int64_t j = 0; j < len; ++j) {
        const scalar_t* v = rows[j] + offset + d;
        const v8f w = v8f{} + p[j];
        a0 += w * load8(v), a1 += w * load8(v + 8), a2 += w * load8(v + 16), a3 += w * load8(v + 24);
      }
      std::memcpy(out, &a0, 32), std::memcpy(out + 8, &a1, 32), std::memcpy(out + 16, &a2, 32);
      std::memcpy(out + 24, &a3, 32);
      continue;
    }
    int64_t e = d;
    for (; e + 8 <= dim; e += 8) {
      v8f a = load8(acc + e);
      for (int64_t j = 0; j < len; ++j) a += (v8f{} + p[j]) * load8(rows[j] + offset + e);
      std::memcpy(acc + e, &a, 32);
    }
    for (; e < dim; ++e) {  // past the last multiple of 8
      float a = acc[e];
      for (int64_t j = 0; j < len; ++j) a += p[j] * static_cast<float>(rows[j][offset + e]);
      acc[e] = a;
    }
  }
}

// One work item: per head of `hs`, the `queries` (G*T) queries of one call row (query, [heads][queries][dim]) against
// its first `length` cache positions (keys, values: the positions of head h0; head_stride: from one head to the
// next); bias: the row's. Scratch: scores [heads][queries][length], acc [heads][queries][dim], rows 2 * TILE.
template <typename scalar_t>
void attend_item(const Shapes& sh, const Heads& hs, const float* query, const BlockRows<scalar_t>& keys,
                 const BlockRows<scalar_t>& values, int64_t head_stride, const scalar_t* bias, const int64_t* bs,
                 int64_t length, const float* sinks, float* scores, float* acc, const scalar_t** rows) {
  const int64_t dim = sh.dim, queries = sh.queries;
  const int64_t bytes = ((hs.heads - 1) * head_stride + dim) * static_cast<int64_t>(sizeof(scalar_t));
  const TileRows<scalar_t> key_tiles{keys, length, bytes, rows};
  key_tiles.start();
  for (int64_t tile = 0; tile < length; tile += TILE) {  // scores = q . k
    const int64_t len = std::min(TILE, length - tile);
    const scalar_t* const* here = key_tiles.at(tile);
    for (int64_t x = 0; x < hs.heads * queries; ++x) {  // query x % queries of head x / queries
      const float* q = query + x * dim;
      const int64_t offset = x / queries * head_stride;
      float* s = scores + x * length + tile;
      int64_t j = 0;
      for (; j + 4 <= len; j += 4) dot4(q, here + j, offset, dim, s + j);
      for (; j < len; ++j) s[j] = dot1(q, here[j] + offset, dim);
    }
  }
  for (int64_t x = 0; x < hs.heads * queries; ++x) {
    const int64_t r = x % queries;
    const float* sink = sinks ? sinks + (x / queries) * sh.groups + r / sh.tokens : nullptr;
    softmax(scores + x * length, bias + r * bs[2], bs[3], length, sink);
  }
  std::fill(acc, acc + hs.heads * queries * dim, 0.f);
  const TileRows<scalar_t> value_tiles{values, length, bytes, rows};
  value_tiles.start();
  for (int64_t tile = 0; tile < length; tile += TILE) {  // acc += p v
    const int64_t len = std::min(TILE, length - tile);
    const scalar_t* const* here = value_tiles.at(tile);
    for (int64_t x = 0; x < hs.heads * queries; ++x) {
      accumulate(scores + x * length + tile, here, x / queries * head_stride, len, dim, acc + x * dim);
    }
  }
}

// How many of a row's KV heads one work item takes: all of them, unless that leaves threads without work; then the
// fewest that give every thread two items or more (a divisor of kv_heads).
int64_t heads_per_item(int64_t rows, int64_t kv_heads) {
  const int64_t wanted = 2 * at::get_num_threads();
  for (int64_t split = 1; split <= kv_heads; ++split) {
    if (kv_heads % split == 0 && rows * split >= wanted) return kv_heads / split;
  }
  return 1;
}

template <typename scalar_t>
void attend_rows(const at::Tensor& q, const at::Tensor& bias, const at::Tensor& k_cache, const at::Tensor& v_cache,
                 const at::Tensor& tables, const std::vector<int64_t>& lengths, float scale,
                 const std::vector<float>& sinks, at::Tensor& out) {
  const int64_t n = q.size(0), t = q.size(1), heads = q.size(2), dim = q.size(3), kv_heads = k_cache.size(2);
  const Shapes sh{t, dim, heads / kv_heads, heads / kv_heads * t};
  const scalar_t* qp = q.data_ptr<scalar_t>();
  const scalar_t* bp = bias.data_ptr<scalar_t>();
  const scalar_t* kp = k_cache.data_ptr<scalar_t>();
  const scalar_t* vp = v_cache.data_ptr<scalar_t>();
  const int64_t* table = tables.data_ptr<int64_t>();
  const int64_t width = tables.size(1), block_size = k_cache.size(1);
  scalar_t* op = out.data_ptr<scalar_t>();
  const auto qs = q.strides(), bs = bias.strides(), ks = k_cache.strides(), vs = v_cache.strides();
  TORCH_CHECK(ks[2] == vs[2], "decode_attention: the caches' heads are equally far apart");
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());
  const int64_t per_item = heads_per_item(n, kv_heads), items_per_row = kv_heads / per_item;

  struct Scratch {
    std::vector<float> query, acc, scores;
    std::vector<const scalar_t*> rows;
  };
  std::vector<int64_t> costs(n * items_per_row);
  for (int64_t item = 0; item < n * items_per_row; ++item) costs[item] = lengths[item / items_per_row];
  onp_work::costliest_first(
      costs,
      [&] {
        const int64_t columns = per_item * sh.queries;
        return Scratch{std::vector<float>(columns * dim), std::vector<float>(columns * dim),
                       std::vector<float>(columns * longest), std::vector<const scalar_t*>(2 * TILE)};
      },
      [&](Scratch& sc, int64_t item) {
        const int64_t i = item / items_per_row;
        const Heads hs{item % items_per_row * per_item, per_item};
        for (int64_t x = 0; x < hs.heads * sh.queries; ++x) {  // query r of head h: group r / t, token r % t
          const int64_t h = hs.h0 + x / sh.queries, r = x % sh.queries;
          const scalar_t* src = qp + i * qs[0] + (r % t) * qs[1] + (h * sh.groups + r / t) * qs[2];
          for (int64_t d = 0; d < dim; ++d) sc.query[x * dim + d] = static_cast<float>(src[d * qs[3]]) * scale;
        }
        const float* item_sinks = sinks.empty() ? nullptr : sinks.data() + hs.h0 * sh.groups;
        const BlockRows<scalar_t> keys(kp, ks.data(), block_size, table + i * width, hs.h0);
        const BlockRows<scalar_t> values(vp, vs.data(), block_size, table + i * width, hs.h0);
        attend_item(sh, hs, sc.query.data(), keys, values, ks[2], bp + i * bs[0], bs.data(), lengths[i],
                    item_sinks, sc.scores.data(), sc.acc.data(), sc.rows.data());
        for (int64_t x = 0; x < hs.heads * sh.queries; ++x) {  // out [n, T, H * D]
          const int64_t h = hs.h0 + x / sh.queries, r = x % sh.queries;
          scalar_t* dst = op + (i * t + r % t) * heads * dim + (h * sh.groups + r / t) * dim;
          for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<scalar_t>(sc.acc[x * dim + d]);
        }
      });
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& bias, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& positions,
                            std::optional<double> scale, const std::optional<at::Tensor>& sinks) {
  TORCH_CHECK(q.dim() == 4 && k_cache.dim() == 4 && v_cache.dim() == 4 && bias.dim() == 4,
              "decode_attention: q [n, T, H, D], caches [blocks, block_size, KVH, D], bias [n, 1, G*T, L]");
  TORCH_CHECK(bias.scalar_type() == q.scalar_type() && k_cache.scalar_type() == q.scalar_type() &&
                  v_cache.scalar_type() == q.scalar_type(),
              "decode_attention: q, bias and the caches share one dtype");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.size(3) == q.size(3),
              "decode_attention: the caches [blocks, block_size, KVH, D] share one shape, D the queries' head dim");
  TORCH_CHECK(k_cache.stride(3) == 1 && v_cache.stride(3) == 1, "decode_attention: cache rows are contiguous");
  const int64_t n = q.size(0), dim = q.size(3), bucket = bias.size(3);
  const auto pos = positions.to(at::kLong).contiguous();
  const int64_t* p = pos.data_ptr<int64_t>();
  const int64_t tokens = pos.size(1);
  std::vector<int64_t> lengths(n);
  for (int64_t i = 0; i < n; ++i) {
    lengths[i] = std::min<int64_t>(bucket, *std::max_element(p + i * tokens, p + (i + 1) * tokens) + 1);
  }
  const auto tables = checked_tables("decode_attention", block_tables, k_cache, lengths);
  std::vector<float> sink_logits;
  if (sinks.has_value()) {  // rounded like the definition's, through the bias dtype
    const auto rounded = sinks->to(bias.scalar_type()).to(at::kFloat).contiguous();
    sink_logits.assign(rounded.data_ptr<float>(), rounded.data_ptr<float>() + rounded.numel());
  }
  const float softmax_scale = scale.has_value() ? static_cast<float>(*scale) : 1.f / std::sqrt(float(dim));
  auto out = at::empty({n, q.size(1), q.size(2) * dim}, q.options());
  AT_DISPATCH_SWITCH(q.scalar_type(), "decode_attention",
                     AT_DISPATCH_CASE(at::kFloat, [&] {
                       attend_rows<float>(q, bias, k_cache, v_cache, tables, lengths, softmax_scale, sink_logits,
                                          out);
                     }) AT_DISPATCH_CASE(at::kBFloat16, [&] {
                       attend_rows<c10::BFloat16>(q, bias, k_cache, v_cache, tables, lengths, softmax_scale,
                                                  sink_logits, out);
                     }));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(onp, CPU, m) { m.impl("decode_attention", &decode_attention); }
