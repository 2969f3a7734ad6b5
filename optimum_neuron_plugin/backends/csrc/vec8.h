// Eight fp32 lanes as GCC vector extensions, shared by the CPU kernels: loads (fp32, and bf16 widened), a store, the
// lanes' sum, and exp.
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>

namespace onp_vec {

typedef float v8f __attribute__((vector_size(32)));
typedef uint16_t v8u16 __attribute__((vector_size(16)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline v8f load8(const c10::BFloat16* p) {  // bf16 is fp32's upper half
  v8u16 half;
  std::memcpy(&half, p, sizeof(half));
  const v8u32 bits = __builtin_convertvector(half, v8u32) << 16;
  v8f v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

inline void store8(float* p, v8f v) {
  std::memcpy(p, &v, sizeof(v));
}

inline float sum8(v8f v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// exp(x) in fp32 within 2 ulp, eight at a time (std::exp is a scalar call): x = n ln2 + r with |r| <= ln2 / 2,
// exp(r) by its degree-6 polynomial, times 2^n built in the exponent bits. Below -87 (a masked key's -1e9 fill, or a
// weight under fp32's smallest normal) it is exactly 0, as the definition's exp underflows.
inline v8f exp8(v8f x) {
  const v8f low = v8f{} - 87.f, high = v8f{} + 88.f;
  v8f c = x < low ? low : x;
  c = c > high ? high : c;
  const v8f y = c * 1.44269504088896341f + 0.5f;
  v8i n = __builtin_convertvector(y, v8i);  // floor(y): truncation, minus one where it rounded up
  n += __builtin_convertvector(n, v8f) > y;
  const v8f nf = __builtin_convertvector(n, v8f);
  const v8f r = c - nf * 0.693359375f + nf * 2.12194440e-4f;
  v8f p = v8f{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const v8i bits = (n + 127) << 23;
  v8f two_n;
  std::memcpy(&two_n, &bits, sizeof(two_n));
  const v8f e = (p * r * r + r + 1.f) * two_n;
  return x < low ? v8f{} : e;
}

inline float exp1(float x) {
  return exp8(v8f{} + x)[0];
}

}  // namespace onp_vec
