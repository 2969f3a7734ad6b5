// The CPU kernels of onp::rms_norm, onp::gated_activation and onp::rope (models/layers.py). Each runs its
// definition's arithmetic in one pass over a row instead of one pass per aten op:
// - rms_norm: x * rsqrt(mean(x^2) + eps) in fp32, then times the weight (Llama: the normalised row cast to the dtype
//   first; Gemma's offset: times offset + weight in fp32, then cast). The sum of squares runs in another order than
//   the definition's reduction, the one difference.
// - gated_activation: act(gate) * up, act being SiLU (x / (1 + exp(-x))) or GELU's tanh form; a bf16 activation is
//   rounded to bf16 before the product, as the definition's two ops round.
// - rope: x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1] for the row's halves x1, x2, each product and
//   the sum rounded to the dtype like the definition's ops.
// Rows are the last dimension; other dimensions may have any strides (q/k norms of a stacked projection's slices).

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "vec8.h"

namespace {

using namespace onp_vec;

inline v8f silu8(v8f x) {
  return x / (1.f + exp8(-x));
}

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), tanh(y) = sign(y) (1 - e) / (1 + e) with e = exp(-2|y|).
inline v8f gelu_tanh8(v8f x) {
  const v8f y = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  const v8f a = y < 0.f ? -y : y;
  const v8f e = exp8(-2.f * a);
  v8f t = (1.f - e) / (1.f + e);
  t = y < 0.f ? -t : t;
  return 0.5f * x * (1.f + t);
}

// A row of `dim` values as fp32 (into `buffer` when they are bf16), and back.
inline const float* as_float(const float* row, int64_t, float*) {
  return row;
}

inline const float* as_float(const c10::BFloat16* row, int64_t dim, float* buffer) {
  for (int64_t j = 0; j < dim; ++j) buffer[j] = static_cast<float>(row[j]);
  return buffer;
}

template <typename scalar_t>
inline float rounded(float x) {  // x through the tensor's dtype, as a definition's intermediate result is stored
  return static_cast<float>(static_cast<scalar_t>(x));
}

// Offsets of the rows (all dimensions but the last) of a tensor with any strides, row after row like an odometer.
std::vector<int64_t> row_offsets(const at::Tensor& x) {
  const int64_t dims = x.dim() - 1, rows = x.numel() / x.size(-1);
  const auto sizes = x.sizes(), strides = x.strides();
  std::vector<int64_t> offsets(rows), index(dims, 0);
  int64_t offset = 0;
  for (int64_t r = 0; r < rows; ++r) {
    offsets[r] = offset;
    for (int64_t d = dims - 1; d >= 0; --d) {  // one step in the last dimension, carried into the ones before
      offset += strides[d];
      if (++index[d] < sizes[d]) break;
      offset -= strides[d] * sizes[d];
      index[d] = 0;
    }
  }
  return offsets;
}

int64_t grain(int64_t dim) {  // rows per task: a decode step's few rows stay on one thread
  return std::max<int64_t>(1, 16384 / dim);
}

template <typename scalar_t>
void rms_norm_rows(const at::Tensor& x, const at::Tensor& weight, float eps, float offset, at::Tensor& out) {
  const int64_t dim = x.size(-1);
  const auto offsets = row_offsets(x);
  const scalar_t* xp = x.data_ptr<scalar_t>();
  scalar_t* op = out.data_ptr<scalar_t>();
  const auto w32 = weight.to(at::kFloat).contiguous();
  const float* wp = w32.data_ptr<float>();
  at::parallel_for(0, static_cast<int64_t>(offsets.size()), grain(dim), [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(dim);
    for (int64_t r = begin; r < end; ++r) {
      const float* v = as_float(xp + offsets[r], dim, buffer.data());
      v8f sums = {};
      int64_t j = 0;
      for (; j + 8 <= dim; j += 8) sums += load8(v + j) * load8(v + j);
      float sum = sum8(sums);
      for (; j < dim; ++j) sum += v[j] * v[j];
      const float inv = 1.f / std::sqrt(sum / static_cast<float>(dim) + eps);
      scalar_t* o = op + r * dim;
      for (int64_t k = 0; k < dim; ++k) {
        const float normed = v[k] * inv;
        o[k] = offset != 0.f ? static_cast<scalar_t>(normed * (offset + wp[k]))
                             : static_cast<scalar_t>(wp[k] * rounded<scalar_t>(normed));
      }
    }
  });
}

template <bool gelu>
inline v8f act8(v8f x) {
  return gelu ? gelu_tanh8(x) : silu8(x);
}

// act(gate) * up over a row: fp32 in one vector pass; bf16 with the activation rounded to bf16 before the product.
template <bool gelu>
inline void gated_row(const float* g, const float* u, int64_t dim, float* o, float*) {
  int64_t j = 0;
  for (; j + 8 <= dim; j += 8) store8(o + j, act8<gelu>(load8(g + j)) * load8(u + j));
  for (; j < dim; ++j) o[j] = act8<gelu>(v8f{} + g[j])[0] * u[j];
}

template <bool gelu>
inline void gated_row(const c10::BFloat16* gp, const c10::BFloat16* up, int64_t dim, c10::BFloat16* o,
                      float* buffer) {
  float* g = buffer;
  float* u = buffer + dim;
  float* acted = buffer + 2 * dim;
  as_float(gp, dim, g);
  as_float(up, dim, u);
  int64_t j = 0;
  for (; j + 8 <= dim; j += 8) store8(acted + j, act8<gelu>(load8(g + j)));
  for (; j < dim; ++j) acted[j] = act8<gelu>(v8f{} + g[j])[0];
  for (int64_t k = 0; k < dim; ++k) o[k] = static_cast<c10::BFloat16>(rounded<c10::BFloat16>(acted[k]) * u[k]);
}

template <typename scalar_t, bool gelu>
void gated_rows(const at::Tensor& gate, const at::Tensor& up, at::Tensor& out) {
  const int64_t dim = gate.size(-1);
  const auto gate_offsets = row_offsets(gate), up_offsets = row_offsets(up);
  const scalar_t* gp = gate.data_ptr<scalar_t>();
  const scalar_t* up_p = up.data_ptr<scalar_t>();
  scalar_t* op = out.data_ptr<scalar_t>();
  at::parallel_for(0, static_cast<int64_t>(gate_offsets.size()), grain(dim), [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(3 * dim);
    for (int64_t r = begin; r < end; ++r) {
      gated_row<gelu>(gp + gate_offsets[r], up_p + up_offsets[r], dim, op + r * dim, buffer.data());
    }
  });
}

// An fp32 row of two halves of a multiple of 8: [x1 c1 - x2 s1, x2 c2 + x1 s2], eight lanes at a time.
inline void rope_row(const float* x, const float* c, const float* s, int64_t half, float* o) {
  for (int64_t j = 0; j < half; j += 8) {
    const v8f x1 = load8(x + j), x2 = load8(x + half + j);
    const v8f first = x1 * load8(c + j), second = x2 * load8(c + half + j);
    store8(o + j, first - x2 * load8(s + j));
    store8(o + half + j, second + x1 * load8(s + half + j));
  }
}

template <typename scalar_t>
void rope_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& out) {
  const int64_t dim = x.size(-1), half = dim / 2;
  const auto x_offsets = row_offsets(x), cos_offsets = row_offsets(cos), sin_offsets = row_offsets(sin);
  const scalar_t* xp = x.data_ptr<scalar_t>();
  const scalar_t* cp = cos.data_ptr<scalar_t>();
  const scalar_t* sp = sin.data_ptr<scalar_t>();
  scalar_t* op = out.data_ptr<scalar_t>();
  at::parallel_for(0, static_cast<int64_t>(x_offsets.size()), grain(dim), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* v = xp + x_offsets[r];
      const scalar_t* c = cp + cos_offsets[r];
      const scalar_t* s = sp + sin_offsets[r];
      scalar_t* o = op + r * dim;
      if constexpr (std::is_same_v<scalar_t, float>) {
        if (half % 8 == 0) {
          rope_row(v, c, s, half, o);
          continue;
        }
      }
      for (int64_t j = 0; j < dim; ++j) {
        const float rotated = j < half ? -static_cast<float>(v[j + half]) : static_cast<float>(v[j - half]);
        const float a = rounded<scalar_t>(static_cast<float>(v[j]) * static_cast<float>(c[j]));
        const float b = rounded<scalar_t>(rotated * static_cast<float>(s[j]));
        o[j] = static_cast<scalar_t>(a + b);
      }
    }
  });
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.stride(-1) == 1 && x.size(-1) % 2 == 0, "rope: x [..., D] with contiguous rows of even D");
  TORCH_CHECK(cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type(),
              "rope: x, cos and sin share one dtype");
  const auto c = cos.expand(x.sizes()), s = sin.expand(x.sizes());  // [n, T, 1, D] over the heads
  TORCH_CHECK(c.stride(-1) == 1 && s.stride(-1) == 1, "rope: cos and sin rows are contiguous");
  auto out = at::empty(x.sizes(), x.options());
  AT_DISPATCH_SWITCH(x.scalar_type(), "rope",
                     AT_DISPATCH_CASE(at::kFloat, [&] { rope_rows<float>(x, c, s, out); })
                         AT_DISPATCH_CASE(at::kBFloat16, [&] { rope_rows<c10::BFloat16>(x, c, s, out); }));
  return out;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, double offset) {
  TORCH_CHECK(x.stride(-1) == 1 && weight.dim() == 1 && weight.size(0) == x.size(-1),
              "rms_norm: x [..., D] with contiguous rows, weight [D]");
  auto out = at::empty(x.sizes(), x.options());
  AT_DISPATCH_SWITCH(x.scalar_type(), "rms_norm",
                     AT_DISPATCH_CASE(at::kFloat, [&] { rms_norm_rows<float>(x, weight, eps, offset, out); })
                         AT_DISPATCH_CASE(at::kBFloat16, [&] {
                           rms_norm_rows<c10::BFloat16>(x, weight, eps, offset, out);
                         }));
  return out;
}

at::Tensor gated_activation(const at::Tensor& gate, const at::Tensor& up, const std::string& act) {
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(),
              "gated_activation: gate and up of one shape and dtype");
  TORCH_CHECK(gate.stride(-1) == 1 && up.stride(-1) == 1, "gated_activation: rows are contiguous");
  TORCH_CHECK(act == "silu" || act == "gelu_pytorch_tanh", "gated_activation: act is silu or gelu_pytorch_tanh");
  auto out = at::empty(gate.sizes(), gate.options());
  const bool gelu = act == "gelu_pytorch_tanh";
  AT_DISPATCH_SWITCH(gate.scalar_type(), "gated_activation",
                     AT_DISPATCH_CASE(at::kFloat, [&] {
                       gelu ? gated_rows<float, true>(gate, up, out) : gated_rows<float, false>(gate, up, out);
                     }) AT_DISPATCH_CASE(at::kBFloat16, [&] {
                       gelu ? gated_rows<c10::BFloat16, true>(gate, up, out)
                            : gated_rows<c10::BFloat16, false>(gate, up, out);
                     }));
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(onp, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("gated_activation", &gated_activation);
  m.impl("rope", &rope);
}
