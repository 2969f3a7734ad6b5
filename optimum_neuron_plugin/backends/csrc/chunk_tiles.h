// The chunk attention kernel's vector micro-kernels (csrc/chunk_attention.cpp): GCC vector extensions, W floats
// wide, W chosen by the compiler's target (AVX-512: 16, else 8), so the kernel builds on any host.

#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace onp_chunk {

#if defined(__AVX512F__)
constexpr int64_t W = 16;  // floats per vector
constexpr int ACC = 16;    // accumulators a micro-kernel holds in registers (of 32)
#else
constexpr int64_t W = 8;
constexpr int ACC = 8;  // (of 16)
#endif
constexpr int64_t KT = 64;   // keys per tile
constexpr int64_t QB = 128;  // queries per work item (a multiple of W)
constexpr int RQ = 4;        // keys or queries per micro-kernel call
constexpr int NV = ACC / RQ;

typedef float vf __attribute__((vector_size(W * 4)));

// n rounded up to whole vectors.
inline int64_t whole_vectors(int64_t n) { return (n + W - 1) / W * W; }
typedef int32_t vi __attribute__((vector_size(W * 4)));

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }

// x in every lane. x - 0 is x for every x, -0 too, so the compiler emits the broadcast alone (an FMA's broadcast
// operand); 0 + x turns -0 into +0, so it costs a scalar add before each broadcast.
inline vf splat(float x) { return x - vf{}; }

// Horizontal max and sum, halving the vector each step.
inline float reduce_max(vf v) {
  float lanes[W];
  store(lanes, v);
  for (int64_t half = W / 2; half > 0; half /= 2) {
    for (int64_t j = 0; j < half; ++j) lanes[j] = lanes[j + half] > lanes[j] ? lanes[j + half] : lanes[j];
  }
  return lanes[0];
}

inline float reduce_sum(vf v) {
  float lanes[W];
  store(lanes, v);
  for (int64_t half = W / 2; half > 0; half /= 2) {
    for (int64_t j = 0; j < half; ++j) lanes[j] += lanes[j + half];
  }
  return lanes[0];
}

// exp(c) / 2^n for n the nearest integer to c / ln2: r = c - n ln2 (ln2 in two parts, Cody-Waite), |r| <= ln2 / 2,
// and exp(r) by its degree-6 polynomial.
inline vf exp_reduced(vf c, vf n) {
  const vf r = c - n * 0.693359375f + n * 2.12194440e-4f;
  vf p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.f;
}

// exp(x) in fp32 within 2 ulp (Cephes' expf, W wide): x = n ln2 + r with n the nearest integer to x / ln2 and
// |r| <= ln2 / 2, exp(r) by its degree-6 polynomial, times 2^n. Below -87 (-inf, a masked key's -1e9 fill) it is
// exactly 0, as the definition's exp underflows. With AVX-512, n is rounded by one roundscale and the product by 2^n
// is one scalef that also zeroes the lanes below -87 (NaN stays NaN); else n is added to 1.5 * 2^23, which leaves it
// in the low mantissa bits, and 2^n is built in the exponent bits.
#if defined(__AVX512F__)
inline vf vexp(vf x) {
  const __mmask16 live = _mm512_cmp_ps_mask(__m512(x), __m512(splat(-87.f)), _CMP_NLT_UQ);
  const vf c = x > 88.f ? splat(88.f) : x;
  const __m512 scaled = __m512(c * 1.44269504088896341f);
  const vf n = vf(_mm512_roundscale_ps(scaled, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  return vf(_mm512_maskz_scalef_ps(live, __m512(exp_reduced(c, n)), __m512(n)));
}
#else
inline vf vexp(vf x) {
  const vf low = splat(-87.f);
  vf c = x < low ? low : x;
  c = c > 88.f ? splat(88.f) : c;
  const vf shifted = c * 1.44269504088896341f + 12582912.f;  // 1.5 * 2^23 + n
  vi bits;
  std::memcpy(&bits, &shifted, sizeof(bits));
  bits = (bits - 0x4B400000 + 127) << 23;  // 0x4B400000: the bits of 1.5 * 2^23
  vf two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  const vf e = exp_reduced(c, shifted - 12582912.f) * two_n;
  return x < low ? vf{} : e;
}
#endif

inline float exp1(float x) { return vexp(splat(x))[0]; }

// s[j][c..c + N W) = key_j . qt[:, c..c + N W) for R keys (rows key[0..R)) against N W queries (transposed and
// scaled, qt: [dim][QB]); s rows of QB. R x N accumulators stay in registers; each step broadcasts one key value.
template <int R, int N, typename scalar_t>
inline void score_block(const scalar_t* const* key, int64_t dim, const float* qt, float* s) {
  const scalar_t* k[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) k[r] = key[r];
  vf acc[R][N] = {};
  for (int64_t d = 0; d < dim; ++d) {
    vf q[N];
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) q[n] = load(qt + d * QB + n * W);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const vf x = splat(static_cast<float>(k[r][d]));
#pragma GCC unroll 8
      for (int n = 0; n < N; ++n) acc[r][n] += x * q[n];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) store(s + r * QB + n * W, acc[r][n]);
  }
}

// o[r][c..c + N W) += sum over j < keys of p[j][r] v[j][c..c + N W), for R queries (p rows of QB, v rows of
// `stride`, o rows of `width`): R x N accumulators in registers, each step broadcasts one weight per query.
template <int R, int N>
inline void value_block(const float* p, const float* v, int64_t stride, int64_t width, int64_t keys, float* o) {
  vf acc[R][N];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) acc[r][n] = load(o + r * width + n * W);
  }
  for (int64_t j = 0; j < keys; ++j) {
    vf x[N];
#pragma GCC unroll 8
    for (int n = 0; n < N; ++n) x[n] = load(v + j * stride + n * W);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const vf w = splat(p[j * QB + r]);
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

// R keys' scores (rows key[0..R)) against the first `queries` (a multiple of W) of qt.
template <int R, typename scalar_t>
inline void scores(const scalar_t* const* key, int64_t dim, const float* qt, int64_t queries, float* s) {
  int64_t c = 0;
  for (; c + NV * W <= queries; c += NV * W) score_block<R, NV>(key, dim, qt + c, s + c);
  for (; c < queries; c += W) score_block<R, 1>(key, dim, qt + c, s + c);
}

// R queries' outputs (rows of `width`, a multiple of W) plus the tile's first `keys` weighted values (rows of
// `stride`, each `width` wide).
template <int R>
inline void values(const float* p, const float* v, int64_t stride, int64_t width, int64_t keys, float* o) {
  int64_t c = 0;
  for (; c + NV * W <= width; c += NV * W) value_block<R, NV>(p, v + c, stride, width, keys, o + c);
  for (; c < width; c += W) value_block<R, 1>(p, v + c, stride, width, keys, o + c);
}

}  // namespace onp_chunk
