// The chunk attention kernel's vector micro-kernels (csrc/chunk_attention.cpp): GCC vector extensions, W floats
// wide, W chosen by the compiler's target (AVX-512: 16, else 8), so the kernel builds on any host.

#pragma once

#include <cstdint>
#include <cstring>

namespace onp_chunk {

#if defined(__AVX512F__)
constexpr int64_t W = 16;  // floats per vector
constexpr int ACC = 16;    // accumulators a micro-kernel holds in registers (of 32)
#else
constexpr int64_t W = 8;
constexpr int ACC = 8;  // (of 16)
#endif
constexpr int64_t KT = 64;  // keys per tile (a multiple of ACC / RQ * W)
constexpr int RQ = 4;       // queries per micro-kernel call
constexpr int NV = ACC / RQ;

typedef float vf __attribute__((vector_size(W * 4)));
typedef int32_t vi __attribute__((vector_size(W * 4)));

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }

inline vf splat(float x) { return vf{} + x; }

inline float reduce_max(vf v) {
  float top = v[0];
  for (int64_t j = 1; j < W; ++j) top = v[j] > top ? v[j] : top;
  return top;
}

inline float reduce_sum(vf v) {
  float sum = 0.f;
  for (int64_t j = 0; j < W; ++j) sum += v[j];
  return sum;
}

// exp(x) in fp32 within 2 ulp (csrc/decode_attention.cpp's exp8, W wide): x = n ln2 + r with |r| <= ln2 / 2, exp(r)
// by its degree-6 polynomial, times 2^n built in the exponent bits. Below -87 (-inf, a masked key's -1e9 fill) it is
// exactly 0, as the definition's exp underflows.
inline vf vexp(vf x) {
  const vf low = splat(-87.f), high = splat(88.f);
  vf c = x < low ? low : x;
  c = c > high ? high : c;
  const vf y = c * 1.44269504088896341f + 0.5f;
  vi n = __builtin_convertvector(y, vi);  // floor(y): truncation, minus one where it rounded up
  n += __builtin_convertvector(n, vf) > y;
  const vf nf = __builtin_convertvector(n, vf);
  const vf r = c - nf * 0.693359375f + nf * 2.12194440e-4f;
  vf p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const vi bits = (n + 127) << 23;
  vf two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  const vf e = (p * r * r + r + 1.f) * two_n;
  return x < low ? vf{} : e;
}

inline float exp1(float x) { return vexp(splat(x))[0]; }

// s[r][c..c + N W) = q[r] . kt[:, c..c + N W) for R queries (q: rows of `dim`, scaled), keys packed transposed (kt:
// [dim][KT]); s rows of KT. R x N accumulators stay in registers; each step broadcasts one query value.
template <int R, int N>
inline void score_block(const float* q, int64_t dim, const float* kt, float* s) {
  vf acc[R][N] = {};
  for (int64_t d = 0; d < dim; ++d) {
    vf k[N];
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) k[n] = load(kt + d * KT + n * W);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const vf x = splat(q[r * dim + d]);
#pragma GCC unroll 8
      for (int n = 0; n < N; ++n) acc[r][n] += x * k[n];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) store(s + r * KT + n * W, acc[r][n]);
  }
}

// o[r][c..c + N W) += sum over j < keys of p[r][j] v[j][c..c + N W), for R queries (p rows of KT, o and v rows of
// `width`): R x N accumulators in registers, each step broadcasts one weight per query.
template <int R, int N>
inline void value_block(const float* p, const float* v, int64_t width, int64_t keys, float* o) {
  vf acc[R][N];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) acc[r][n] = load(o + r * width + n * W);
  }
  for (int64_t j = 0; j < keys; ++j) {
    vf x[N];
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) x[n] = load(v + j * width + n * W);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const vf w = splat(p[r * KT + j]);
#pragma GCC unroll 8
      for (int n = 0; n < N; ++n) acc[r][n] += w * x[n];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) store(o + r * width + n * W, acc[r][n]);
  }
}

// R queries' scores against a whole tile of KT keys.
template <int R>
inline void scores(const float* q, int64_t dim, const float* kt, float* s) {
  for (int64_t c = 0; c < KT; c += NV * W) score_block<R, NV>(q, dim, kt + c, s + c);
}

// R queries' outputs (rows of `width`, a multiple of W) plus the tile's first `keys` weighted values.
template <int R>
inline void values(const float* p, const float* v, int64_t width, int64_t keys, float* o) {
  int64_t c = 0;
  for (; c + NV * W <= width; c += NV * W) value_block<R, NV>(p, v + c, width, keys, o + c);
  for (; c < width; c += W) value_block<R, 1>(p, v + c, width, keys, o + c);
}

}  // namespace onp_chunk
