// The CPU kernel of onp::decode_attention (models/attention.py, attend_cache).
//
// Call row i (cache row seq_ids[i], tokens at positions[i]) attends cache positions [0, last_i + 1) of its row, where
// last_i is its largest position: every key past it is masked for every one of its queries, so leaving it out
// changes the result by the rounding of a shorter sum only. Scores add the bias's columns for those positions (the
// causal mask between a verify row's tokens, a sliding window); the softmax runs in fp32, an attention sink adds
// exp(sink - max) to its sum. One work item per (call row, KV head): its G*T queries read its keys and values in
// tiles that stay in the L1 cache while every query uses them, so each key and value comes from memory once.

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

#include "vec8.h"
#include "work_queue.h"

namespace {

using namespace onp_vec;

constexpr int64_t TILE = 64;  // keys per tile: 64 keys x 64 dims x 4 bytes = 16 KiB

// q . k over `dim`, four keys at once: four independent accumulators, 8 wide, then a scalar tail past the last
// multiple of 8.
template <typename scalar_t>
inline void dot4(const float* q, const scalar_t* k, int64_t stride, int64_t dim, float* out) {
  v8f a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t d = 0;
  for (; d + 8 <= dim; d += 8) {
    const v8f x = load8(q + d);
    a0 += x * load8(k + d);
    a1 += x * load8(k + stride + d);
    a2 += x * load8(k + 2 * stride + d);
    a3 += x * load8(k + 3 * stride + d);
  }
  out[0] = sum8(a0), out[1] = sum8(a1), out[2] = sum8(a2), out[3] = sum8(a3);
  for (; d < dim; ++d) {
    for (int64_t key = 0; key < 4; ++key) out[key] += q[d] * static_cast<float>(k[key * stride + d]);
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

// One work item: the `queries` (G*T) queries of call row i on KV head h, against `length` keys of cache row `slot`.
template <typename scalar_t>
void attend_item(const Shapes& sh, const float* query, const scalar_t* keys, const scalar_t* values, int64_t ks,
                 int64_t vs, const scalar_t* bias, const int64_t* bs, int64_t length, const float* sinks,
                 float* scores, float* acc) {
  const int64_t dim = sh.dim, queries = sh.queries;
  for (int64_t tile = 0; tile < length; tile += TILE) {  // scores = q . k
    const int64_t end = std::min(length, tile + TILE);
    for (int64_t r = 0; r < queries; ++r) {
      const float* q = query + r * dim;
      float* s = scores + r * length;
      int64_t j = tile;
      for (; j + 4 <= end; j += 4) dot4(q, keys + j * ks, ks, dim, s + j);
      for (; j < end; ++j) s[j] = dot1(q, keys + j * ks, dim);
    }
  }
  for (int64_t r = 0; r < queries; ++r) {
    const float* sink = sinks ? sinks + (r / sh.tokens) : nullptr;
    softmax(scores + r * length, bias + r * bs[2], bs[3], length, sink);
  }
  std::fill(acc, acc + queries * dim, 0.f);
  for (int64_t tile = 0; tile < length; tile += TILE) {  // acc += p v
    const int64_t end = std::min(length, tile + TILE);
    for (int64_t r = 0; r < queries; ++r) {
      const float* p = scores + r * length;
      for (int64_t d = 0; d < dim; d += 32) {  // four vectors of accumulators (one past a multiple of 32), in registers
        float* out = acc + r * dim + d;
        if (d + 32 <= dim) {
          v8f a0 = load8(out), a1 = load8(out + 8), a2 = load8(out + 16), a3 = load8(out + 24);
          for (int64_t j = tile; j < end; ++j) {
            const scalar_t* v = values + j * vs + d;
            const v8f w = v8f{} + p[j];
            a0 += w * load8(v), a1 += w * load8(v + 8), a2 += w * load8(v + 16), a3 += w * load8(v + 24);
          }
          std::memcpy(out, &a0, 32), std::memcpy(out + 8, &a1, 32), std::memcpy(out + 16, &a2, 32);
          std::memcpy(out + 24, &a3, 32);
          continue;
        }
        int64_t e = d;
        for (; e + 8 <= dim; e += 8) {
          v8f a = load8(acc + r * dim + e);
          for (int64_t j = tile; j < end; ++j) a += (v8f{} + p[j]) * load8(values + j * vs + e);
          std::memcpy(acc + r * dim + e, &a, 32);
        }
        for (; e < dim; ++e) {  // past the last multiple of 8
          float a = acc[r * dim + e];
          for (int64_t j = tile; j < end; ++j) a += p[j] * static_cast<float>(values[j * vs + e]);
          acc[r * dim + e] = a;
        }
      }
    }
  }
}

template <typename scalar_t>
void attend_rows(const at::Tensor& q, const at::Tensor& bias, const at::Tensor& k_cache, const at::Tensor& v_cache,
                 const int64_t* seq_ids, const std::vector<int64_t>& lengths, float scale,
                 const std::vector<float>& sinks, at::Tensor& out) {
  const int64_t n = q.size(0), t = q.size(1), heads = q.size(2), dim = q.size(3), kv_heads = k_cache.size(1);
  const Shapes sh{t, dim, heads / kv_heads, heads / kv_heads * t};
  const bool in_slot_order = n == k_cache.size(0);  // the bias is in slot order (attend_cache)
  const scalar_t* qp = q.data_ptr<scalar_t>();
  const scalar_t* bp = bias.data_ptr<scalar_t>();
  const scalar_t* kp = k_cache.data_ptr<scalar_t>();
  const scalar_t* vp = v_cache.data_ptr<scalar_t>();
  scalar_t* op = out.data_ptr<scalar_t>();
  const auto qs = q.strides(), bs = bias.strides(), ks = k_cache.strides(), vs = v_cache.strides();
  const int64_t longest = *std::max_element(lengths.begin(), lengths.end());

  struct Scratch {
    std::vector<float> query, acc, scores;
  };
  std::vector<int64_t> costs(n * kv_heads);
  for (int64_t item = 0; item < n * kv_heads; ++item) costs[item] = lengths[item / kv_heads];
  onp_work::costliest_first(
      costs,
      [&] { return Scratch{std::vector<float>(sh.queries * dim), std::vector<float>(sh.queries * dim),
                           std::vector<float>(sh.queries * longest)}; },
      [&](Scratch& sc, int64_t item) {
        const int64_t i = item / kv_heads, h = item % kv_heads, slot = seq_ids[i];
        for (int64_t r = 0; r < sh.queries; ++r) {  // query r: group r / t, token r % t (the bias's row order)
          const scalar_t* src = qp + i * qs[0] + (r % t) * qs[1] + (h * sh.groups + r / t) * qs[2];
          for (int64_t d = 0; d < dim; ++d) sc.query[r * dim + d] = static_cast<float>(src[d * qs[3]]) * scale;
        }
        const scalar_t* bias_rows = bp + (in_slot_order ? slot : i) * bs[0];
        const float* item_sinks = sinks.empty() ? nullptr : sinks.data() + h * sh.groups;
        attend_item(sh, sc.query.data(), kp + slot * ks[0] + h * ks[1], vp + slot * vs[0] + h * vs[1], ks[2], vs[2],
                    bias_rows, bs.data(), lengths[i], item_sinks, sc.scores.data(), sc.acc.data());
        for (int64_t r = 0; r < sh.queries; ++r) {  // out [n, T, H * D]
          scalar_t* dst = op + (i * t + r % t) * heads * dim + (h * sh.groups + r / t) * dim;
          for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<scalar_t>(sc.acc[r * dim + d]);
        }
      });
}

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& bias, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& seq_ids, const at::Tensor& positions,
                            std::optional<double> scale, const std::optional<at::Tensor>& sinks) {
  TORCH_CHECK(q.dim() == 4 && k_cache.dim() == 4 && bias.dim() == 4,
              "decode_attention: q [n, T, H, D], caches [rows, KVH, S, D], bias [n, 1, G*T, L]");
  TORCH_CHECK(bias.scalar_type() == q.scalar_type() && k_cache.scalar_type() == q.scalar_type() &&
                  v_cache.scalar_type() == q.scalar_type(),
              "decode_attention: q, bias and the caches share one dtype");
  TORCH_CHECK(k_cache.stride(3) == 1 && v_cache.stride(3) == 1, "decode_attention: cache rows are contiguous");
  const int64_t n = q.size(0), dim = q.size(3), bucket = bias.size(3);
  const auto ids = seq_ids.to(at::kLong).contiguous();
  const auto pos = positions.to(at::kLong).contiguous();
  const int64_t* p = pos.data_ptr<int64_t>();
  const int64_t tokens = pos.size(1);
  std::vector<int64_t> lengths(n);
  for (int64_t i = 0; i < n; ++i) {
    lengths[i] = std::min<int64_t>(bucket, *std::max_element(p + i * tokens, p + (i + 1) * tokens) + 1);
  }
  std::vector<float> sink_logits;
  if (sinks.has_value()) {  // rounded like the definition's, through the bias dtype
    const auto rounded = sinks->to(bias.scalar_type()).to(at::kFloat).contiguous();
    sink_logits.assign(rounded.data_ptr<float>(), rounded.data_ptr<float>() + rounded.numel());
  }
  const float softmax_scale = scale.has_value() ? static_cast<float>(*scale) : 1.f / std::sqrt(float(dim));
  auto out = at::empty({n, q.size(1), q.size(2) * dim}, q.options());
  AT_DISPATCH_SWITCH(q.scalar_type(), "decode_attention",
                     AT_DISPATCH_CASE(at::kFloat, [&] {
                       attend_rows<float>(q, bias, k_cache, v_cache, ids.data_ptr<int64_t>(), lengths, softmax_scale,
                                          sink_logits, out);
                     }) AT_DISPATCH_CASE(at::kBFloat16, [&] {
                       attend_rows<c10::BFloat16>(q, bias, k_cache, v_cache, ids.data_ptr<int64_t>(), lengths,
                                                  softmax_scale, sink_logits, out);
                     }));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(onp, CPU, m) { m.impl("decode_attention", &decode_attention); }
