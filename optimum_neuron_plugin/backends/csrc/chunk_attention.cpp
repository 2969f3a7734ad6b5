// onp_cpu::chunk_attention: the CPU kernel of onp::chunk_attention (models/attention.py, masked_chunk_attention).
//
// Row i (cache row seq_ids[i], positions[i] from its start s) attends two pieces, each through PyTorch's CPU flash
// kernel, which returns the piece's log-sum-exp:
// - its own block, causally over its real keys (the kernel's causal form skips the upper triangle; padded queries,
//   past the last real key, see every real key as the mask has it), or under the bias's own columns in a sliding
//   layer;
// - its prior, cache positions [max(0, s - window + 1), s) read in place (a view of the cache row), without a mask
//   unless the layer slides (then under the bias's columns for those positions).
// The two partial softmaxes merge by their log-sum-exp: o = o_own + (o_prior - o_own) * sigmoid(lse_prior - lse_own).
// A key the bias masks for every query weighs exactly 0 in the masked form (exp of the -1e9 fill underflows), so
// leaving it out changes the result by the rounding of a different summation order only. An attention sink is one
// more term of the softmax's sum with no value: it scales the output by sigmoid(lse - sink).

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <optional>
#include <tuple>
#include <vector>

namespace {

std::tuple<at::Tensor, at::Tensor> flash(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                                         const std::optional<at::Tensor>& mask, std::optional<double> scale) {
  return at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, mask, scale);
}

// One row's own block without a window: queries [1, KVH, G*T, D] against its first `real` keys [1, KVH, T, D],
// causally, as heads [1, H, T, D] (a view) against K/V repeated per group (a chunk's own keys: small).
std::tuple<at::Tensor, at::Tensor> own_causal(const at::Tensor& queries, const at::Tensor& keys,
                                              const at::Tensor& values, int64_t real, std::optional<double> scale) {
  const int64_t kv_heads = queries.size(1), rows = queries.size(2), dim = queries.size(3);
  const int64_t groups = rows / keys.size(2);
  const auto heads = queries.view({1, kv_heads * groups, rows / groups, dim});
  const auto k = keys.slice(2, 0, real).repeat_interleave(groups, 1);
  const auto v = values.slice(2, 0, real).repeat_interleave(groups, 1);
  auto [out, lse] = flash(heads, k, v, true, std::nullopt, scale);
  return {out.view({1, kv_heads, rows, dim}), lse.reshape({1, kv_heads, rows})};
}

at::Tensor chunk_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& seq_ids, const at::Tensor& positions,
                           const at::Tensor& bias, int64_t window, std::optional<double> scale,
                           const std::optional<at::Tensor>& sinks) {
  const int64_t n = q.size(0), t = q.size(1), heads = q.size(2), dim = q.size(3), kv_heads = k.size(2);
  const int64_t groups = heads / kv_heads, prior = bias.size(-1) - t;
  // GQA without repeating K/V: queries as [n, KVH, G*T, D], as the masked form lays them out.
  const auto queries =
      q.view({n, t, kv_heads, groups, dim}).permute({0, 2, 3, 1, 4}).reshape({n, kv_heads, groups * t, dim});
  const auto own_keys = k.transpose(1, 2).contiguous(), own_values = v.transpose(1, 2).contiguous();
  std::optional<at::Tensor> sink_logits;  // [KVH, G*T]: head h's sink for each of its queries, rounded like the bias
  if (sinks.has_value()) {
    const auto rounded = sinks->to(bias.scalar_type()).to(at::kFloat);
    sink_logits = rounded.view({kv_heads, groups, 1}).expand({-1, -1, t}).reshape({-1, groups * t});
  }
  const auto ids = seq_ids.to(at::kLong).contiguous();
  const auto pos = positions.to(at::kLong).contiguous();
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t* p = pos.data_ptr<int64_t>();
  std::vector<at::Tensor> outs;
  outs.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = id[i], start = p[i * t], last = p[i * t + t - 1];
    const auto qi = queries.slice(0, i, i + 1);
    at::Tensor out, lse;
    if (window) {
      const auto own = bias.slice(0, i, i + 1).slice(-1, prior, prior + t);
      std::tie(out, lse) = flash(qi, own_keys.slice(0, i, i + 1), own_values.slice(0, i, i + 1), false, own, scale);
    } else {
      const int64_t real = last - start + 1;
      std::tie(out, lse) = own_causal(qi, own_keys.slice(0, i, i + 1), own_values.slice(0, i, i + 1), real, scale);
    }
    const int64_t end = std::min(start, prior), low = window ? std::max<int64_t>(0, start - window + 1) : 0;
    if (end > low) {
      std::optional<at::Tensor> mask;
      if (window) mask = bias.slice(0, i, i + 1).slice(-1, low, end);
      const auto keys = k_cache.slice(0, row, row + 1).slice(2, low, end);
      const auto values = v_cache.slice(0, row, row + 1).slice(2, low, end);
      auto [out_prior, lse_prior] = flash(qi, keys, values, false, mask, scale);
      const auto weight = at::sigmoid(lse_prior - lse).unsqueeze(-1);
      out = at::lerp(out.to(at::kFloat), out_prior.to(at::kFloat), weight).to(q.scalar_type());
      lse = at::logaddexp(lse, lse_prior);
    }
    if (sink_logits.has_value()) {
      out = (out.to(at::kFloat) * at::sigmoid(lse - *sink_logits).unsqueeze(-1)).to(q.scalar_type());
    }
    outs.push_back(out);
  }
  const auto out = n > 1 ? at::cat(outs) : outs[0];  // [n, KVH, G*T, D]
  return out.view({n, kv_heads, groups, t, dim}).permute({0, 3, 1, 2, 4}).reshape({n, t, heads * dim});
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(onp_cpu, m) {
  m.def("chunk_attention(Tensor q, Tensor k, Tensor v, Tensor k_cache, Tensor v_cache, Tensor seq_ids, "
        "Tensor positions, Tensor bias, int window, float? scale, Tensor? sinks) -> Tensor");
}

TORCH_LIBRARY_IMPL(onp_cpu, CPU, m) { m.impl("chunk_attention", &chunk_attention); }
