// The CPU kernel of onp::chunk_attention (models/attention.py).
//
// The caches are pools of blocks [num_blocks, block_size, KVH, D] read in place: row i's cache position p is at
// cache[block_tables[i, p / block_size], p % block_size]. Call row i (its chunk starting at s, `real` real tokens)
// attends, in one pass over its keys, its prior, cache positions [low, end) (end = min(s, prior bucket),
// low = max(0, s - window + 1), 0 without a window), followed by its own block's keys from k/v: own query t sees own
// keys [0, min(t, real - 1)], a padded query every real own key, as the mask has it. Each query's keys are thus a
// prefix of [prior | own], and of the own block's upper triangle only what shares a vector of queries with attended
// pairs is computed (then masked). In a sliding layer the scores also add the bias's columns for those keys (the
// window inside the prior and the own block). A key the bias masks for every query weighs exactly 0 in the masked
// form (exp of the -1e9 fill underflows), so leaving it out changes the result by the rounding of a different
// summation order only. A padded query that repeats the last real one bit for bit (the chunk loop pads with the last
// token and position) attends the same keys under the same mask: it is computed once and its output copied (outside
// sliding layers, whose bias rows are not compared).
//
// Flash attention, register-blocked (csrc/chunk_tiles.h): one work item per (call row, KV head, block of QB of its
// G*T queries, laid out as the bias's rows), its queries packed once, scaled and transposed ([D][QB], fp32). Its keys
// stream in tiles of KT (a tile ends where the prior does), the tile's key and value rows addressed once, block by
// block of the table: the scores S [KT][QB] by a micro-kernel that broadcasts key values read in place against
// vectors of queries, R keys x N vectors of accumulators in registers; the online softmax in fp32, vectors across
// queries (each query's running max and sum; its output rescaled when the max grows); the tile's values converted to
// adjacent fp32 rows of whole vectors, then O += P V by a micro-kernel that broadcasts weights against vectors of the
// head dim. The tile's values are prefetched while its scores are computed, the next tile's keys while its values are
// weighed. An attention sink is one more term of the sum, with no value.

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
#include "chunk_tiles.h"
#include "work_queue.h"

namespace {

using namespace onp_chunk;
using onp_blocks::BlockRows;
using onp_blocks::prefetch;

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// What every work item reads: shapes, pointers, strides (in elements).
template <typename scalar_t>
struct Inputs {
  int64_t tokens, heads, kv_heads, groups, dim, width, prior, window, block_size, table_width;
  const scalar_t *q, *k, *v, *k_cache, *v_cache, *bias;
  const int64_t *qs, *ks, *vs, *kcs, *vcs, *bs;
  const int64_t* tables;  // [n, table_width]
  const float* sinks;  // [H] or null
  float scale;
  scalar_t* out;  // [n, T, H * D]
};

// One thread's tiles, reused by its work items. Per query (a column of QB): its running max and sum, and how many
// of the item's keys it attends.
struct Scratch {
  std::vector<float> queries, values, scores, out, top, sum, limit, alpha;
  std::vector<int64_t> columns;  // the query (of the head's G*T) of each column
  Scratch(int64_t dim, int64_t width)
      : queries(dim * QB), values(KT * width), scores(KT * QB), out(QB * width), top(QB), sum(QB), limit(QB),
        alpha(QB) {
    columns.reserve(QB);
  }
};

// The keys of row i's work items: `prior` cache positions from `low`, then its own block's. Its queries: own tokens
// [0, computed); a padded token past them has the last real token's query, keys and mask, so its output is copied.
struct Keys {
  int64_t low, prior, real, computed;
};

// How many keys of [prior | own] own token u's query attends: its prior and own keys [0, min(u, real - 1)].
inline int64_t attended_keys(const Keys& keys, int64_t u) {
  return keys.prior + std::min(u, keys.real - 1) + 1;
}

// Where the tile starting at key k0 may end at the latest: tiles end where the prior does.
inline int64_t tile_end(const Keys& keys, int64_t total, int64_t k0) { return k0 < keys.prior ? keys.prior : total; }

// The rows of keys [k0, k0 + len) (all in the prior or all in the own block) into rows[0..len): the prior's through
// the row's block table, the own block's from k or v.
template <typename scalar_t>
void key_rows(const Inputs<scalar_t>& in, const Keys& keys, const scalar_t* cache, const int64_t* cs,
              const scalar_t* own, const int64_t* os, int64_t i, int64_t h, int64_t k0, int64_t len,
              const scalar_t** rows) {
  if (k0 < keys.prior) {
    BlockRows<scalar_t>(cache, cs, in.block_size, in.tables + i * in.table_width, h).address(keys.low + k0, len, rows);
    return;
  }
  const scalar_t* row = own + i * os[0] + (k0 - keys.prior) * os[1] + h * os[2];
  for (int64_t j = 0; j < len; ++j) rows[j] = row + j * os[1];
}

// max(top, the column's first `len` scores (rows of QB)), in four independent chains of max ops: one would wait on
// each op's latency.
inline vf column_max(const float* s, int64_t len, vf top) {
  vf part[4] = {top, top, top, top};
  int64_t j = 0;
  for (; j + 4 <= len; j += 4) {
    for (int u = 0; u < 4; ++u) {
      const vf y = load(s + (j + u) * QB);
      part[u] = y > part[u] ? y : part[u];
    }
  }
  for (; j < len; ++j) {
    const vf y = load(s + j * QB);
    part[0] = y > part[0] ? y : part[0];
  }
  for (int u = 1; u < 4; ++u) part[0] = part[u] > part[0] ? part[u] : part[0];
  return part[0];
}

// The tile's scores (its rows: keys, columns: queries) become weights: masked past each query's last key (and under
// the bias in a sliding layer), folded into each query's running max and sum; alpha: each output's rescale.
template <typename scalar_t>
void softmax_tile(const Inputs<scalar_t>& in, const Keys& keys, int64_t i, int64_t from, int64_t rows, int64_t k0,
                  int64_t len, Scratch& sc) {
  float* s = sc.scores.data();
  const int64_t columns = whole_vectors(rows);
  if (in.window) {  // the bias's columns: [prior bucket | own block]
    for (int64_t j = 0; j < len; ++j) {
      const int64_t key = k0 + j;
      const int64_t column = key < keys.prior ? keys.low + key : in.prior + key - keys.prior;
      const scalar_t* b = in.bias + i * in.bs[0] + column * in.bs[3];
      for (int64_t x = from; x < rows; ++x) s[j * QB + x] += static_cast<float>(b[sc.columns[x] * in.bs[2]]);
    }
  }
  const bool every_key = k0 + len <= *std::min_element(sc.limit.begin() + from, sc.limit.begin() + rows);
  for (int64_t c = from; c < columns; c += W) {
    const vf limit = load(sc.limit.data() + c), old = load(sc.top.data() + c);
    vf top = old;
    if (every_key && c + W <= rows) {
      top = column_max(s + c, len, top);
    } else {  // keys past some query's last, or the block's padding lanes
      for (int64_t j = 0; j < len; ++j) {
        float* row = s + j * QB + c;
        const vf y = limit > splat(float(k0 + j)) ? load(row) : splat(NEG_INF);
        store(row, y);
        top = y > top ? y : top;
      }
    }
    const vf shift = top == splat(NEG_INF) ? vf{} : top;  // a query without a key yet: weights and rescale 0
    vf sum = {};
    for (int64_t j = 0; j < len; ++j) {
      float* row = s + j * QB + c;
      const vf e = vexp(load(row) - shift);
      store(row, e);
      sum += e;
    }
    const vf alpha = vexp(old - shift);
    store(sc.alpha.data() + c, alpha);
    store(sc.sum.data() + c, load(sc.sum.data() + c) * alpha + sum);
    store(sc.top.data() + c, top);
  }
  for (int64_t x = from; x < rows; ++x) {
    const float alpha = sc.alpha[x];
    if (alpha == 1.f) continue;
    float* o = sc.out.data() + x * in.width;
    for (int64_t d = 0; d < in.width; d += W) store(o + d, load(o + d) * alpha);
  }
}

// A tile's `len` value rows (rows value[0..len)) as adjacent fp32 rows of `width` (a multiple of W) in the scratch:
// read in place, a head's values are kv_heads * D apart, rows that often share their L1 set, and every block of
// queries reads them again.
template <typename scalar_t>
const float* value_rows(const scalar_t* const* value, int64_t len, int64_t dim, int64_t width, Scratch& sc) {
  for (int64_t j = 0; j < len; ++j) {
    float* dst = sc.values.data() + j * width;
    for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<float>(value[j][d]);
  }
  return sc.values.data();
}

// The first of the item's columns whose query attends key k0: the columns before it skip the tile (every one of its
// keys is masked for them; their max, sum and output stay as they are).
inline int64_t first_attending(const Scratch& sc, int64_t rows, int64_t k0) {
  int64_t x = 0;
  while (x < rows && sc.limit[x] <= static_cast<float>(k0)) ++x;
  return x;
}

// The tile's scores: key rows [k0, k0 + len) against the queries that attend them, in whole vectors from the first
// that does; on a diagonal tile that first query moves right group of keys by group of keys. The entries left out
// are past their query's last key: the softmax masks them. Returns the first column scored (for key k0, the
// leftmost).
template <typename scalar_t>
int64_t score_tile(const scalar_t* const* key, int64_t dim, int64_t rows, int64_t k0, int64_t len, bool diagonal,
                   Scratch& sc) {
  const int64_t columns = whole_vectors(rows);
  int64_t first = 0;
  for (int64_t j = 0; j < len;) {
    const int64_t from = diagonal ? first_attending(sc, rows, k0 + j) / W * W : 0;
    if (j == 0) first = from;
    const float* queries = sc.queries.data() + from;
    float* s = sc.scores.data() + j * QB + from;
    if (j + RQ <= len) {
      scores<RQ>(key + j, dim, queries, columns - from, s);
      j += RQ;
    } else {
      scores<1>(key + j, dim, queries, columns - from, s);
      j += 1;
    }
  }
  return first;
}

// Queries [x, x + R) add the tile's weighted values: on a diagonal tile only up to the last key one of them attends
// (the weights past it are 0).
template <int R>
void value_tile(const float* v, int64_t width, int64_t x, int64_t k0, int64_t len, bool diagonal, Scratch& sc) {
  int64_t keys = len;
  if (diagonal) {
    const float last = *std::max_element(sc.limit.begin() + x, sc.limit.begin() + x + R);
    keys = std::clamp(static_cast<int64_t>(last) - k0, int64_t{0}, len);
  }
  if (keys > 0) values<R>(&sc.scores[x], v, width, width, keys, &sc.out[x * width]);
}

// Work item: row i, KV head h, the computed queries among [r0, r0 + queries) of the head's G*T.
template <typename scalar_t>
void attend_block(const Inputs<scalar_t>& in, const Keys& keys, int64_t i, int64_t h, int64_t r0, int64_t queries,
                  Scratch& sc) {
  const int64_t t = in.tokens, dim = in.dim, width = in.width;
  sc.columns.clear();
  for (int64_t r = r0; r < r0 + queries; ++r) {
    if (r % t < keys.computed) sc.columns.push_back(r);
  }
  const int64_t rows = static_cast<int64_t>(sc.columns.size());
  if (rows == 0) return;
  std::fill(sc.queries.begin(), sc.queries.end(), 0.f);
  std::fill(sc.limit.begin(), sc.limit.end(), 0.f);
  int64_t total = 0;
  for (int64_t x = 0; x < rows; ++x) {  // query r = g T + u: group g, token u (the bias's row order)
    const int64_t r = sc.columns[x], u = r % t, g = r / t;
    const scalar_t* src = in.q + i * in.qs[0] + u * in.qs[1] + (h * in.groups + g) * in.qs[2];
    for (int64_t d = 0; d < dim; ++d) sc.queries[d * QB + x] = static_cast<float>(src[d * in.qs[3]]) * in.scale;
    const int64_t limit = attended_keys(keys, u);
    sc.limit[x] = static_cast<float>(limit);
    total = std::max(total, limit);
  }
  std::fill(sc.top.begin(), sc.top.end(), NEG_INF);
  std::fill(sc.sum.begin(), sc.sum.end(), 0.f);
  std::fill(sc.out.begin(), sc.out.begin() + rows * width, 0.f);
  const int64_t whole = static_cast<int64_t>(*std::min_element(sc.limit.begin(), sc.limit.begin() + rows));
  const scalar_t *key[KT], *value[KT];
  const int64_t bytes = dim * static_cast<int64_t>(sizeof(scalar_t));
  key_rows(in, keys, in.k_cache, in.kcs, in.k, in.ks, i, h, 0, std::min(KT, tile_end(keys, total, 0)), key);
  for (int64_t k0 = 0; k0 < total;) {
    const int64_t len = std::min(KT, tile_end(keys, total, k0) - k0);
    const bool diagonal = k0 + len > whole;  // some query's last key is inside the tile
    key_rows(in, keys, in.v_cache, in.vcs, in.v, in.vs, i, h, k0, len, value);
    prefetch(value, len, bytes);  // fetched while the scores are computed
    const int64_t from = score_tile(key, dim, rows, k0, len, diagonal, sc);
    softmax_tile(in, keys, i, from, rows, k0, len, sc);
    const float* v = value_rows(value, len, dim, width, sc);
    if (k0 + len < total) {  // the next tile's keys, fetched while the values are weighed
      const int64_t next = std::min(KT, tile_end(keys, total, k0 + len) - k0 - len);
      key_rows(in, keys, in.k_cache, in.kcs, in.k, in.ks, i, h, k0 + len, next, key);
      prefetch(key, next, bytes);
    }
    int64_t x = from;
    for (; x + RQ <= rows; x += RQ) value_tile<RQ>(v, width, x, k0, len, diagonal, sc);
    for (; x < rows; ++x) value_tile<1>(v, width, x, k0, len, diagonal, sc);
    k0 += len;
  }
  for (int64_t x = 0; x < rows; ++x) {  // out [n, T, H * D]
    const int64_t r = sc.columns[x], u = r % t, head = h * in.groups + r / t;
    float sum = sc.sum[x];
    if (in.sinks) sum += exp1(in.sinks[head] - sc.top[x]);
    const float inv = 1.f / sum;
    scalar_t* dst = in.out + (i * t + u) * in.heads * dim + head * dim;
    for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<scalar_t>(sc.out[x * width + d] * inv);
  }
}

// The keys a work item's queries attend, summed: its cost.
int64_t item_cost(const Keys& keys, int64_t tokens, int64_t r0, int64_t rows) {
  int64_t cost = 0;
  for (int64_t r = r0; r < r0 + rows; ++r) {
    if (r % tokens < keys.computed) cost += attended_keys(keys, r % tokens);
  }
  return cost;
}

template <typename scalar_t>
void attend_rows(const Inputs<scalar_t>& in, const std::vector<Keys>& rows) {
  const int64_t n = rows.size(), queries = in.groups * in.tokens, blocks = (queries + QB - 1) / QB;
  std::vector<int64_t> costs(n * in.kv_heads * blocks);
  for (int64_t item = 0; item < static_cast<int64_t>(costs.size()); ++item) {
    const int64_t b = item % blocks;
    costs[item] = item_cost(rows[item / (in.kv_heads * blocks)], in.tokens, b * QB, std::min(QB, queries - b * QB));
  }
  onp_work::costliest_first(
      costs, [&] { return Scratch(in.dim, in.width); },
      [&](Scratch& sc, int64_t item) {
        const int64_t i = item / (in.kv_heads * blocks), h = item / blocks % in.kv_heads, b = item % blocks;
        attend_block(in, rows[i], i, h, b * QB, std::min(QB, queries - b * QB), sc);
      });
}

// Whether row i's padded tokens [real, T) all have the last real token's query, bit for bit: they repeat its token
// and position (runtime/chunk_loop.py), so they do wherever the layers before computed rows alike.
template <typename scalar_t>
bool padding_repeats_last_query(const Inputs<scalar_t>& in, int64_t i, int64_t real) {
  const scalar_t* q = in.q + i * in.qs[0];
  for (int64_t u = real; u < in.tokens; ++u) {
    for (int64_t head = 0; head < in.heads; ++head) {
      for (int64_t d = 0; d < in.dim; ++d) {
        const scalar_t* last = q + (real - 1) * in.qs[1] + head * in.qs[2] + d * in.qs[3];
        if (std::memcmp(last, last + (u - real + 1) * in.qs[1], sizeof(scalar_t)) != 0) return false;
      }
    }
  }
  return true;
}

// A padded token whose query was not computed gets the last real token's output: the same query over the same keys.
template <typename scalar_t>
void copy_padded_outputs(const Inputs<scalar_t>& in, const std::vector<Keys>& rows) {
  const int64_t span = in.heads * in.dim;
  for (int64_t i = 0; i < static_cast<int64_t>(rows.size()); ++i) {
    const scalar_t* last = in.out + (i * in.tokens + rows[i].real - 1) * span;
    for (int64_t u = rows[i].computed; u < in.tokens; ++u) {
      std::copy(last, last + span, in.out + (i * in.tokens + u) * span);
    }
  }
}

template <typename scalar_t>
void run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache,
         const at::Tensor& v_cache, const at::Tensor& bias, const at::Tensor& tables, int64_t window, float scale,
         const float* sinks, std::vector<Keys> rows, at::Tensor& out) {
  const int64_t t = q.size(1), heads = q.size(2), dim = q.size(3), kv_heads = k.size(2);
  const Inputs<scalar_t> in{t,
                            heads,
                            kv_heads,
                            heads / kv_heads,
                            dim,
                            whole_vectors(dim),
                            bias.size(-1) - t,
                            window,
                            k_cache.size(1),
                            tables.size(1),
                            q.data_ptr<scalar_t>(),
                            k.data_ptr<scalar_t>(),
                            v.data_ptr<scalar_t>(),
                            k_cache.data_ptr<scalar_t>(),
                            v_cache.data_ptr<scalar_t>(),
                            bias.data_ptr<scalar_t>(),
                            q.strides().data(),
                            k.strides().data(),
                            v.strides().data(),
                            k_cache.strides().data(),
                            v_cache.strides().data(),
                            bias.strides().data(),
                            tables.data_ptr<int64_t>(),
                            sinks,
                            scale,
                            out.data_ptr<scalar_t>()};
  for (int64_t i = 0; i < static_cast<int64_t>(rows.size()); ++i) {  // a sliding layer's bias rows are not compared
    if (!window && padding_repeats_last_query(in, i, rows[i].real)) rows[i].computed = rows[i].real;
  }
  attend_rows(in, rows);
  copy_padded_outputs(in, rows);
}

at::Tensor chunk_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& block_tables, const at::Tensor& positions,
                           const at::Tensor& bias, int64_t window, std::optional<double> scale,
                           const std::optional<at::Tensor>& sinks) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && k_cache.dim() == 4 && bias.dim() == 4,
              "chunk_attention: q [n, T, H, D], k/v [n, T, KVH, D], caches [blocks, block_size, KVH, D], "
              "bias [n, 1, G*T, P+T]");
  for (const auto* tensor : {&k, &v, &k_cache, &v_cache, &bias}) {
    TORCH_CHECK(tensor->scalar_type() == q.scalar_type(),
                "chunk_attention: q, k, v, the caches and the bias share one dtype (an FP8 cache takes the masked "
                "form), got ", tensor->scalar_type(), " for ", q.scalar_type());
  }
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.size(2) == k.size(2) && k_cache.size(3) == q.size(3),
              "chunk_attention: the caches [blocks, block_size, KVH, D] share one shape, KVH and D those of k");
  TORCH_CHECK(k_cache.stride(3) == 1 && v_cache.stride(3) == 1, "chunk_attention: cache rows are contiguous");
  const int64_t n = q.size(0), t = q.size(1), heads = q.size(2), dim = q.size(3);
  const auto keys = k.stride(3) == 1 ? k : k.contiguous(), values = v.stride(3) == 1 ? v : v.contiguous();
  const auto pos = positions.to(at::kLong).contiguous();
  const int64_t prior = bias.size(-1) - t;
  std::vector<Keys> rows(n);
  std::vector<int64_t> ends(n);  // the cache positions each row reads: [low, low + prior)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t* p = pos.data_ptr<int64_t>() + i * t;
    const int64_t start = p[0], low = window ? std::max<int64_t>(0, start - window + 1) : 0;
    rows[i] = {low, std::max<int64_t>(0, std::min(start, prior) - low), p[t - 1] - start + 1, t};
    ends[i] = rows[i].prior ? low + rows[i].prior : 0;
  }
  const auto tables = onp_blocks::checked_tables("chunk_attention", block_tables, k_cache, ends);
  std::vector<float> sink_logits;
  if (sinks.has_value()) {  // rounded like the definition's, through the bias dtype
    const auto rounded = sinks->to(bias.scalar_type()).to(at::kFloat).contiguous();
    sink_logits.assign(rounded.data_ptr<float>(), rounded.data_ptr<float>() + rounded.numel());
  }
  auto out = at::empty({n, t, heads * dim}, q.options());
  const float softmax_scale = scale.has_value() ? static_cast<float>(*scale) : 1.f / std::sqrt(float(dim));
  const float* sink = sink_logits.empty() ? nullptr : sink_logits.data();
  AT_DISPATCH_SWITCH(q.scalar_type(), "chunk_attention",
                     AT_DISPATCH_CASE(at::kFloat, [&] {
                       run<float>(q, keys, values, k_cache, v_cache, bias, tables, window, softmax_scale, sink, rows, out);
                     }) AT_DISPATCH_CASE(at::kBFloat16, [&] {
                       run<c10::BFloat16>(q, keys, values, k_cache, v_cache, bias, tables, window, softmax_scale, sink,
                                          rows, out);
                     }));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(onp, CPU, m) { m.impl("chunk_attention", &chunk_attention); }
