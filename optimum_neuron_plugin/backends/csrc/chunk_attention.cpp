// onp_cpu::chunk_attention: the CPU kernel of onp::chunk_attention (models/attention.py, masked_chunk_attention).
//
// Call row i (cache row seq_ids[i], its chunk starting at s, `real` real tokens) attends, in one pass over its keys,
// its prior, cache positions [low, end) read in place (end = min(s, prior bucket), low = max(0, s - window + 1), 0
// without a window), followed by its own block's keys from k/v: own query t sees own keys [0, min(t, real - 1)], a
// padded query every real own key, as the mask has it. Each query's keys are thus a prefix of [prior | own], and the
// upper triangle of the own block is never computed. In a sliding layer the scores also add the bias's columns for
// those keys (the window inside the prior and the own block). A key the bias masks for every query weighs exactly 0
// in the masked form (exp of the -1e9 fill underflows), so leaving it out changes the result by the rounding of a
// different summation order only.
//
// Flash attention, register-blocked (csrc/chunk_tiles.h): one work item per (call row, KV head, block of QB of its
// G*T queries, laid out as the bias's rows); its keys stream in tiles of KT, each packed once as fp32 (keys
// transposed, values padded to a multiple of the vector width), then S = Q K^T and O += P V by micro-kernels holding
// a block of queries x vectors in registers, with an online softmax in fp32 (running max and sum per query, the
// output rescaled when the max grows). An attention sink is one more term of the softmax's sum with no value.

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "chunk_tiles.h"

namespace {

using namespace onp_chunk;

constexpr int64_t QB = 64;  // queries per work item
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

// What every work item reads: shapes, pointers, strides (in elements).
template <typename scalar_t>
struct Inputs {
  int64_t tokens, heads, kv_heads, groups, dim, width, prior, window;
  const scalar_t *q, *k, *v, *k_cache, *v_cache, *bias;
  const int64_t *qs, *ks, *vs, *kcs, *vcs, *bs;
  const int64_t* seq_ids;
  const float* sinks;  // [H] or null
  float scale;
  scalar_t* out;  // [n, T, H * D]
};

// One thread's tiles, reused by its work items.
struct Scratch {
  std::vector<float> query, keys, values, scores, out, top, sum;
  std::vector<int64_t> limit;
  Scratch(int64_t dim, int64_t width)
      : query(QB * dim), keys(dim * KT), values(KT * width), scores(QB * KT), out(QB * width), top(QB), sum(QB),
        limit(QB) {}
};

// The keys of row i's work items: `prior` cache positions from `low`, then its own block's.
struct Keys {
  int64_t low, prior, real;
};

// Pack keys [k0, k0 + len) of `keys` as fp32: keys transposed ([D][KT]), values as rows of `width`.
template <typename scalar_t>
void pack_tile(const Inputs<scalar_t>& in, const Keys& keys, int64_t i, int64_t h, int64_t k0, int64_t len,
               Scratch& sc) {
  const int64_t slot = in.seq_ids[i], dim = in.dim;
  for (int64_t j = 0; j < len; ++j) {
    const int64_t key = k0 + j;
    const scalar_t *kp, *vp;
    if (key < keys.prior) {
      const int64_t p = keys.low + key;
      kp = in.k_cache + slot * in.kcs[0] + h * in.kcs[1] + p * in.kcs[2];
      vp = in.v_cache + slot * in.vcs[0] + h * in.vcs[1] + p * in.vcs[2];
    } else {
      const int64_t u = key - keys.prior;
      kp = in.k + i * in.ks[0] + u * in.ks[1] + h * in.ks[2];
      vp = in.v + i * in.vs[0] + u * in.vs[1] + h * in.vs[2];
    }
    float* kt = sc.keys.data() + j;
    float* vrow = sc.values.data() + j * in.width;
    for (int64_t d = 0; d < dim; ++d) kt[d * KT] = static_cast<float>(kp[d]);
    for (int64_t d = 0; d < dim; ++d) vrow[d] = static_cast<float>(vp[d]);
  }
}

// Query x of the block (row r of the head's G*T): fold the tile's scores into its running max and sum; its scores
// become its weights (0 past the key it may attend), its output is rescaled when the max grows.
template <typename scalar_t>
void softmax_row(const Inputs<scalar_t>& in, const Keys& keys, int64_t i, int64_t r, int64_t x, int64_t k0,
                 int64_t len, Scratch& sc) {
  float* s = sc.scores.data() + x * KT;
  const int64_t live = std::min(len, sc.limit[x] - k0);
  if (live <= 0) {
    std::fill(s, s + KT, 0.f);
    return;
  }
  if (in.window) {  // the bias's columns: [prior bucket | own block]
    const scalar_t* b = in.bias + i * in.bs[0] + r * in.bs[2];
    for (int64_t j = 0; j < live; ++j) {
      const int64_t key = k0 + j;
      const int64_t column = key < keys.prior ? keys.low + key : in.prior + key - keys.prior;
      s[j] += static_cast<float>(b[column * in.bs[3]]);
    }
  }
  std::fill(s + live, s + KT, NEG_INF);
  vf top = load(s);
  for (int64_t j = W; j < KT; j += W) {
    const vf y = load(s + j);
    top = y > top ? y : top;
  }
  const float old = sc.top[x], now = std::max(old, reduce_max(top));
  vf sums = {};
  for (int64_t j = 0; j < KT; j += W) {
    const vf e = vexp(load(s + j) - now);
    store(s + j, e);
    sums += e;
  }
  const float alpha = exp1(old - now);  // 0 on the first tile (old = -inf)
  sc.sum[x] = sc.sum[x] * alpha + reduce_sum(sums);
  sc.top[x] = now;
  if (alpha != 1.f) {
    float* o = sc.out.data() + x * in.width;
    for (int64_t d = 0; d < in.width; d += W) store(o + d, load(o + d) * alpha);
  }
}

// Work item: row i, KV head h, queries [r0, r0 + rows) of the head's G*T.
template <typename scalar_t>
void attend_block(const Inputs<scalar_t>& in, const Keys& keys, int64_t i, int64_t h, int64_t r0, int64_t rows,
                  Scratch& sc) {
  const int64_t t = in.tokens, dim = in.dim, width = in.width;
  int64_t total = 0;
  for (int64_t x = 0; x < rows; ++x) {  // query r = g T + u: group g, token u (the bias's row order)
    const int64_t r = r0 + x, u = r % t, g = r / t;
    const scalar_t* src = in.q + i * in.qs[0] + u * in.qs[1] + (h * in.groups + g) * in.qs[2];
    for (int64_t d = 0; d < dim; ++d) sc.query[x * dim + d] = static_cast<float>(src[d * in.qs[3]]) * in.scale;
    sc.limit[x] = keys.prior + std::min(u, keys.real - 1) + 1;
    total = std::max(total, sc.limit[x]);
    sc.top[x] = NEG_INF;
    sc.sum[x] = 0.f;
  }
  std::fill(sc.out.begin(), sc.out.begin() + rows * width, 0.f);
  for (int64_t k0 = 0; k0 < total; k0 += KT) {
    const int64_t len = std::min(KT, total - k0);
    pack_tile(in, keys, i, h, k0, len, sc);
    int64_t x = 0;
    for (; x + RQ <= rows; x += RQ) scores<RQ>(sc.query.data() + x * dim, dim, sc.keys.data(), sc.scores.data() + x * KT);
    for (; x < rows; ++x) scores<1>(sc.query.data() + x * dim, dim, sc.keys.data(), sc.scores.data() + x * KT);
    for (x = 0; x < rows; ++x) softmax_row(in, keys, i, r0 + x, x, k0, len, sc);
    for (x = 0; x + RQ <= rows; x += RQ) {
      values<RQ>(sc.scores.data() + x * KT, sc.values.data(), width, len, sc.out.data() + x * width);
    }
    for (; x < rows; ++x) values<1>(sc.scores.data() + x * KT, sc.values.data(), width, len, sc.out.data() + x * width);
  }
  for (int64_t x = 0; x < rows; ++x) {  // out [n, T, H * D]
    const int64_t r = r0 + x, u = r % t, head = h * in.groups + r / t;
    float sum = sc.sum[x];
    if (in.sinks) sum += exp1(in.sinks[head] - sc.top[x]);
    const float inv = 1.f / sum;
    scalar_t* dst = in.out + (i * t + u) * in.heads * dim + head * dim;
    for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<scalar_t>(sc.out[x * width + d] * inv);
  }
}

template <typename scalar_t>
void attend_rows(const Inputs<scalar_t>& in, const std::vector<Keys>& rows) {
  const int64_t n = rows.size(), queries = in.groups * in.tokens, blocks = (queries + QB - 1) / QB;
  const int64_t items = n * in.kv_heads * blocks;
  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    Scratch sc(in.dim, in.width);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / (in.kv_heads * blocks), h = item / blocks % in.kv_heads, j = item % blocks;
      // Blocks from both ends in turn: a thread's contiguous range of items holds causal blocks of both costs.
      const int64_t b = j % 2 ? blocks - 1 - j / 2 : j / 2;
      attend_block(in, rows[i], i, h, b * QB, std::min(QB, queries - b * QB), sc);
    }
  });
}

template <typename scalar_t>
void run(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache,
         const at::Tensor& v_cache, const at::Tensor& bias, const at::Tensor& ids, int64_t window, float scale, const float* sinks, const std::vector<Keys>& rows, at::Tensor& out) {
  const int64_t t = q.size(1), heads = q.size(2), dim = q.size(3), kv_heads = k.size(2);
  const Inputs<scalar_t> in{t,
                            heads,
                            kv_heads,
                            heads / kv_heads,
                            dim,
                            (dim + W - 1) / W * W,
                            bias.size(-1) - t,
                            window,
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
                            ids.data_ptr<int64_t>(),
                            sinks,
                            scale,
                            out.data_ptr<scalar_t>()};
  attend_rows(in, rows);
}

at::Tensor chunk_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& seq_ids, const at::Tensor& positions,
                           const at::Tensor& bias, int64_t window, std::optional<double> scale,
                           const std::optional<at::Tensor>& sinks) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && k_cache.dim() == 4 && bias.dim() == 4,
              "chunk_attention: q [n, T, H, D], k/v [n, T, KVH, D], caches [rows, KVH, S, D], bias [n, 1, G*T, P+T]");
  for (const auto* tensor : {&k, &v, &k_cache, &v_cache, &bias}) {
    TORCH_CHECK(tensor->scalar_type() == q.scalar_type(), "chunk_attention: q, k, v, the caches and the bias share "
                "one dtype (an FP8 cache takes the masked form), got ", tensor->scalar_type(), " for ", q.scalar_type());
  }
  TORCH_CHECK(k_cache.stride(3) == 1 && v_cache.stride(3) == 1, "chunk_attention: cache rows are contiguous");
  const int64_t n = q.size(0), t = q.size(1), heads = q.size(2), dim = q.size(3);
  const auto keys = k.stride(3) == 1 ? k : k.contiguous(), values = v.stride(3) == 1 ? v : v.contiguous();
  const auto ids = seq_ids.to(at::kLong).contiguous();
  const auto pos = positions.to(at::kLong).contiguous();
  const int64_t prior = bias.size(-1) - t;
  std::vector<Keys> rows(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t* p = pos.data_ptr<int64_t>() + i * t;
    const int64_t start = p[0], low = window ? std::max<int64_t>(0, start - window + 1) : 0;
    rows[i] = {low, std::max<int64_t>(0, std::min(start, prior) - low), p[t - 1] - start + 1};
  }
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
                       run<float>(q, keys, values, k_cache, v_cache, bias, ids, window, softmax_scale, sink, rows, out);
                     }) AT_DISPATCH_CASE(at::kBFloat16, [&] {
                       run<c10::BFloat16>(q, keys, values, k_cache, v_cache, bias, ids, window, softmax_scale, sink,
                                          rows, out);
                     }));
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(onp_cpu, m) {
  m.def("chunk_attention(Tensor q, Tensor k, Tensor v, Tensor k_cache, Tensor v_cache, Tensor seq_ids, "
        "Tensor positions, Tensor bias, int window, float? scale, Tensor? sinks) -> Tensor");
}

TORCH_LIBRARY_IMPL(onp_cpu, CPU, m) { m.impl("chunk_attention", &chunk_attention); }
