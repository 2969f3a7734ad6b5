// The CPU backend's fp32 linear for a few input rows (a decode step's; a prompt call's LM head): y = x W^T + b,
// x [..., K] with at most 4 rows, on W packed once at load (backends/cpu_linear.py).
//
// Such a product reads each weight once for at most 4 multiply-adds: it runs at memory bandwidth or not at all.
// oneDNN's inner product reaches ~24 GB/s of a 2-core AMD EPYC's ~35-50 here; this kernel streams the weight in
// the order it computes: blocks of B * W output columns, each block's weights stored k-major ([K][B * W], one
// contiguous run of the weight per block), each k broadcasting x[m, k] into B vectors of W outputs per row. No
// horizontal sum; every output is a plain sum over k in order, plus the bias.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>

namespace {

#if defined(__AVX512F__)
constexpr int64_t W = 16;  // floats per vector
#else
constexpr int64_t W = 8;
#endif
constexpr int64_t B = 2;             // vectors of outputs per block: B * rows accumulators
constexpr int64_t SPAN = W * B;      // output columns per block
constexpr int64_t MAX_ROWS = 4;      // rows_linear's largest row count
constexpr int64_t BLOCKS_PER_TASK = 8;

typedef float vf __attribute__((vector_size(W * 4)));

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// W [N, K] -> [ceil(N / SPAN), K, SPAN], the columns past N zero.
at::Tensor pack_rows_weight(const at::Tensor& weight) {
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kFloat, "pack_rows_weight: a 2-D fp32 weight");
  const int64_t n = weight.size(0), k = weight.size(1), blocks = (n + SPAN - 1) / SPAN;
  auto padded = at::zeros({blocks * SPAN, k}, weight.options());
  padded.narrow(0, 0, n).copy_(weight);
  return padded.view({blocks, SPAN, k}).transpose(1, 2).contiguous();
}

template <int64_t M>
void block_product(const float* x, const float* w, const float* bias, int64_t k_size, int64_t n_size,
                   int64_t block, float* y) {
  vf acc[M][B] = {};
  for (int64_t k = 0; k < k_size; ++k) {
    const float* row = w + k * SPAN;
    vf wv[B];
    for (int64_t j = 0; j < B; ++j) wv[j] = load(row + j * W);
    for (int64_t m = 0; m < M; ++m) {
      const float xs = x[m * k_size + k];
      for (int64_t j = 0; j < B; ++j) acc[m][j] += wv[j] * xs;
    }
  }
  const int64_t n0 = block * SPAN, live = std::min(SPAN, n_size - n0);
  for (int64_t m = 0; m < M; ++m) {
    float out[SPAN];
    std::memcpy(out, acc[m], sizeof(out));
    for (int64_t i = 0; i < live; ++i) y[m * n_size + n0 + i] = bias ? out[i] + bias[n0 + i] : out[i];
  }
}

template <int64_t M>
void run(const float* x, const float* w, const float* bias, int64_t k_size, int64_t n_size, int64_t blocks,
         float* y) {
  at::parallel_for(0, blocks, BLOCKS_PER_TASK, [&](int64_t first, int64_t last) {
    for (int64_t block = first; block < last; ++block)
      block_product<M>(x, w + block * k_size * SPAN, bias, k_size, n_size, block, y);
  });
}

at::Tensor rows_linear(const at::Tensor& x, const at::Tensor& packed, const c10::optional<at::Tensor>& bias,
                       int64_t n_size) {
  const int64_t k_size = x.size(-1);
  TORCH_CHECK(x.scalar_type() == at::kFloat && packed.scalar_type() == at::kFloat, "rows_linear: fp32 only");
  TORCH_CHECK(packed.dim() == 3 && packed.size(1) == k_size && packed.size(2) == SPAN &&
                  packed.size(0) * SPAN >= n_size,
              "rows_linear: the weight is not pack_rows_weight's of a [", n_size, ", ", k_size, "] weight");
  const auto rows = x.reshape({-1, k_size}).contiguous();
  const int64_t m = rows.size(0);
  TORCH_CHECK(m <= MAX_ROWS, "rows_linear: at most ", MAX_ROWS, " rows, got ", m);
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->contiguous();
    TORCH_CHECK(b.scalar_type() == at::kFloat && b.numel() == n_size, "rows_linear: an fp32 bias of ", n_size);
  }
  auto y = at::empty({m, n_size}, x.options());
  const float *xp = rows.data_ptr<float>(), *wp = packed.data_ptr<float>();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  const int64_t blocks = (n_size + SPAN - 1) / SPAN;
  switch (m) {
    case 0: break;
    case 1: run<1>(xp, wp, bp, k_size, n_size, blocks, yp); break;
    case 2: run<2>(xp, wp, bp, k_size, n_size, blocks, yp); break;
    case 3: run<3>(xp, wp, bp, k_size, n_size, blocks, yp); break;
    default: run<4>(xp, wp, bp, k_size, n_size, blocks, yp); break;
  }
  auto shape = x.sizes().vec();
  shape.back() = n_size;
  return y.view(shape);
}

}  // namespace

TORCH_LIBRARY(onp_cpu, m) {
  m.def("pack_rows_weight(Tensor weight) -> Tensor");
  m.def("rows_linear(Tensor x, Tensor packed, Tensor? bias, int n) -> Tensor");
}

TORCH_LIBRARY_IMPL(onp_cpu, CPU, m) {
  m.impl("pack_rows_weight", &pack_rows_weight);
  m.impl("rows_linear", &rows_linear);
}
