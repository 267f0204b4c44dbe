// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The CPU math prelude. Pasted as text at the top of every generated C++ translation
// unit (codegen/cpp.hpp); gives out kiln_exp, kiln_erf, ... as float and double
// overloads that a `#pragma omp simd` loop vectorises, since a scalar libm call in the
// loop costs ~12x (bench/ANCHORS.md, CPU). It needs C++17, <cstdint>, <cmath> and
// __builtin_bit_cast (GCC 11, clang 9).
//
// Guidelines:
// - Every function is one straight line of arithmetic and bitwise selects
//   (kiln_detail_pick, see the NOTE there): no branches, no tables, no libm call but
//   sqrt, one instruction under -fno-math-errno. Special values come out of the
//   arithmetic or a final select.
// - Integer lanes are as wide as the float lanes (uint32 with float, uint64 with
//   double). AVX2 has no int64 arithmetic shift and no int64<->double conversion, so
//   the double paths use offsets, logical shifts and the 2^52 magic instead.
// - round(v) = (v + 1.5*2^23) - 1.5*2^23: the sum also carries the integer in its
//   low mantissa bits, so no float->int conversion is needed (nor defined for NaN).
// - Cody-Waite splits are exact without FMA for the stated ranges; under
//   -ffp-contract=fast the compiler fuses them, which only makes them better.
// - Polynomials: Chebyshev interpolants (near-minimax) fitted with mpmath over the
//   reduced ranges; the script is scripts/cpu_math_fit.py.
// Accuracy: tests/codegen/test_cpu_math.cpp measures it against long double on random
// and edge inputs, scalar and vectorised; the worst seen, in ulps:
//            exp  exp2 log  log2 sqrt rsqrt recip sin/cos tanh erf  pow
//   float    1.0  1.0  0.9  1.8  0.5  1.5   0.5   1.6     2.3  2.5  0.5
//   double   1.0  1.1  1.3  1.8  0.5  1.5   0.5   1.6     2.5  1.8  1.3
// sin/cos ulps are for |x| <= pi; up to |x| = 1e5 the error is <= 1.2e-7 (float) and
// 2.1e-16 (double) absolute, and so it stays to |x| = 6e6 (float with FMA; double
// always); past 2^22 pi/2 a float result is bounded in [-1, 1] but meaningless (no
// Payne-Hanek reduction). bench/cpu_math_bench.cpp times them.
#ifndef KILN_CODEGEN_DEVICE_CPU_MATH_HPP
#define KILN_CODEGEN_DEVICE_CPU_MATH_HPP

#include <cmath>
#include <cstdint>

// Lets an OpenMP simd loop call a function that was not inlined through its vector
// clone. Defined away without OpenMP (-fopenmp) so that no build warns.
#ifndef KILN_DECLARE_SIMD
#if defined(_OPENMP)
#define KILN_DECLARE_SIMD _Pragma("omp declare simd notinbranch")
#else
#define KILN_DECLARE_SIMD
#endif
#endif

// ---- bits ------------------------------------------------------------------------
KILN_DECLARE_SIMD static inline uint32_t kiln_detail_u32(float x) { return __builtin_bit_cast(uint32_t, x); }
KILN_DECLARE_SIMD static inline uint64_t kiln_detail_u64(double x) { return __builtin_bit_cast(uint64_t, x); }
KILN_DECLARE_SIMD static inline float kiln_detail_f32(uint32_t u) { return __builtin_bit_cast(float, u); }
KILN_DECLARE_SIMD static inline double kiln_detail_f64(uint64_t u) { return __builtin_bit_cast(double, u); }
// c ? a : b on the bits.
// NOTE: a plain ?: lets GCC sink an arm used nowhere else into a branch, where under the
// default -ftrapping-math if-conversion will not speculate its float ops (a division,
// say): the loop then stays scalar. Use this wherever an arm is a computed value.
KILN_DECLARE_SIMD static inline uint32_t kiln_detail_pick(bool c, uint32_t a, uint32_t b) {
  uint32_t m = 0u - uint32_t(c);
  return (a & m) | (b & ~m);
}
KILN_DECLARE_SIMD static inline float kiln_detail_pick(bool c, float a, float b) {
  uint32_t m = 0u - uint32_t(c);
  return kiln_detail_f32((kiln_detail_u32(a) & m) | (kiln_detail_u32(b) & ~m));
}
KILN_DECLARE_SIMD static inline double kiln_detail_pick(bool c, double a, double b) {
  uint64_t m = uint64_t(0) - uint64_t(c);
  return kiln_detail_f64((kiln_detail_u64(a) & m) | (kiln_detail_u64(b) & ~m));
}

// x limited to [lo, hi]; NaN stays NaN
KILN_DECLARE_SIMD static inline float kiln_detail_clamp(float x, float lo, float hi) {
  return kiln_detail_pick(x < lo, lo, kiln_detail_pick(hi < x, hi, x));
}
KILN_DECLARE_SIMD static inline double kiln_detail_clamp(double x, double lo, double hi) {
  return kiln_detail_pick(x < lo, lo, kiln_detail_pick(hi < x, hi, x));
}

// |a| with the sign of s
KILN_DECLARE_SIMD static inline float kiln_detail_copysign(float a, float s) {
  return kiln_detail_f32((kiln_detail_u32(a) & 0x7fffffffu) | (kiln_detail_u32(s) & 0x80000000u));
}
KILN_DECLARE_SIMD static inline double kiln_detail_copysign(double a, double s) {
  return kiln_detail_f64((kiln_detail_u64(a) & 0x7fffffffffffffffull) | (kiln_detail_u64(s) & 0x8000000000000000ull));
}

// a*b - fl(a*b), exactly; and c - a*b rounded once (exact for a division's remainder).
// NOTE: Dekker's split is exact only when nothing is fused into it; without FMA
// hardware the compiler has nothing to fuse with, so the fallback is safe.
#if defined(__FMA__) || defined(__FP_FAST_FMA) || defined(__aarch64__)
KILN_DECLARE_SIMD static inline double kiln_detail_mul_err(double a, double b, double p) { return __builtin_fma(a, b, -p); }
KILN_DECLARE_SIMD static inline double kiln_detail_fnma(double a, double b, double c) { return __builtin_fma(-a, b, c); }
#else
KILN_DECLARE_SIMD static inline double kiln_detail_mul_err(double a, double b, double p) {
  double ca = a * 134217729.0, ah = ca - (ca - a), al = a - ah;
  double cb = b * 134217729.0, bh = cb - (cb - b), bl = b - bh;
  return ((ah * bh - p) + ah * bl + al * bh) + al * bl;
}
KILN_DECLARE_SIMD static inline double kiln_detail_fnma(double a, double b, double c) {
  double p = a * b;
  return (c - p) - kiln_detail_mul_err(a, b, p);
}
#endif

// ---- exp family ------------------------------------------------------------------
// expm1(r) for |r| <= ln2/2 (+2%): r + r^2 P(r)
KILN_DECLARE_SIMD static inline float kiln_detail_expm1_poly(float r) {
  return r + r * r * (0.5f + r * (0.166666672f + r * (0.0416664481f + r * (0.00833330862f + r * (0.00139354588f + r * 0.000198929993f)))));
}
KILN_DECLARE_SIMD static inline double kiln_detail_expm1_poly(double r) {
  return r + r * r * (0.5 + r * (0.16666666666666671 + r * (0.041666666666666671 + r * (0.0083333333333249007 + r * (0.0013888888888882868 + r * (0.00019841269879050321 + r * (2.4801587328568198e-05 + r * (2.7557250141961856e-06 + r * (2.7557269888171584e-07 + r * (2.5107362196010009e-08 + r * 2.0916218856461214e-09))))))))));
}
// e^r * 2^k, with kb = k + 256 (float, k in [-152, 130]) or k + 2048 (double, k in
// [-1078, 1026]). 2^k is applied as two halves so that 2^128 does not overflow the
// exponent field and a subnormal result is rounded once.
KILN_DECLARE_SIMD static inline float kiln_detail_exp_scale(float r, uint32_t kb) {
  uint32_t k1 = kb >> 1, k2 = kb - k1;  // floor(k/2) + 128, ceil(k/2) + 128
  return (1.f + kiln_detail_expm1_poly(r)) * kiln_detail_f32((k1 - 1u) << 23) * kiln_detail_f32((k2 - 1u) << 23);
}
KILN_DECLARE_SIMD static inline double kiln_detail_exp_scale(double r, uint64_t kb) {
  uint64_t k1 = kb >> 1, k2 = kb - k1;  // floor(k/2) + 1024, ceil(k/2) + 1024
  return (1.0 + kiln_detail_expm1_poly(r)) * kiln_detail_f64((k1 - 1u) << 52) * kiln_detail_f64((k2 - 1u) << 52);
}

// e^w for |w| < 87 (float) / 708 (double): no clamp, 2^k in one piece; erf's inner exp
KILN_DECLARE_SIMD static inline float kiln_detail_exp_mid(float w) {
  float t = w * 1.44269502f + 12582912.f;
  float k = t - 12582912.f;
  float r = w - k * 0.693145752f - k * 1.42860677e-06f;
  return (1.f + kiln_detail_expm1_poly(r)) * kiln_detail_f32((kiln_detail_u32(t) - 0x4b400000u + 127u) << 23);
}
KILN_DECLARE_SIMD static inline double kiln_detail_exp_mid(double w) {
  double t = w * 1.4426950408889634 + 6755399441055744.0;
  double k = t - 6755399441055744.0;
  double r = w - k * 0.69314718060195446 + k * 4.2009150726810846e-11;
  return (1.0 + kiln_detail_expm1_poly(r)) * kiln_detail_f64((kiln_detail_u64(t) - 0x4338000000000000ull + 1023u) << 52);
}

// e^x = 2^k e^r, k = round(x / ln2), r = x - k ln2 (ln2 in two parts; k ln2_hi exact)
KILN_DECLARE_SIMD static inline float kiln_exp(float x) {
  float xc = kiln_detail_clamp(x, -104.f, 88.8f);  // e^-104 rounds to 0, e^88.8 to inf
  float t = xc * 1.44269502f + 12582912.f;
  float k = t - 12582912.f;
  float r = xc - k * 0.693145752f - k * 1.42860677e-06f;
  return kiln_detail_exp_scale(r, kiln_detail_u32(t) - 0x4b400000u + 256u);
}
KILN_DECLARE_SIMD static inline double kiln_exp(double x) {
  double xc = kiln_detail_clamp(x, -746.0, 709.8);
  double t = xc * 1.4426950408889634 + 6755399441055744.0;
  double k = t - 6755399441055744.0;
  double r = xc - k * 0.69314718060195446 + k * 4.2009150726810846e-11;
  return kiln_detail_exp_scale(r, kiln_detail_u64(t) - 0x4338000000000000ull + 2048u);
}

// 2^x = 2^k e^(r ln2), k = round(x), r = x - k exact
KILN_DECLARE_SIMD static inline float kiln_exp2(float x) {
  float xc = kiln_detail_clamp(x, -151.f, 129.f);
  float t = xc + 12582912.f;
  float r = (xc - (t - 12582912.f)) * 0.693147182f;
  return kiln_detail_exp_scale(r, kiln_detail_u32(t) - 0x4b400000u + 256u);
}
KILN_DECLARE_SIMD static inline double kiln_exp2(double x) {
  double xc = kiln_detail_clamp(x, -1076.0, 1025.0);
  double t = xc + 6755399441055744.0;
  double r = (xc - (t - 6755399441055744.0)) * 0.69314718055994529;
  return kiln_detail_exp_scale(r, kiln_detail_u64(t) - 0x4338000000000000ull + 2048u);
}

// ---- log family ------------------------------------------------------------------
// x = 2^e m, m in [sqrt(1/2), sqrt 2), f = m - 1, s = f / (2 + f):
// log m = 2 atanh s = f - (f^2/2 - s (f^2/2 + R)), R = s^2 T(s^2) (fdlibm's arrangement)
// NOTE: subnormal x is scaled by 2^24 (2^54) through masks, not ?: (see kiln_detail_pick).
KILN_DECLARE_SIMD static inline uint32_t kiln_detail_log_ix(float x, uint32_t sub) {
  return kiln_detail_u32(x * kiln_detail_f32(0x3f800000u + (sub & (24u << 23)))) + (0x3f800000u - 0x3f3504f3u);
}
KILN_DECLARE_SIMD static inline float kiln_detail_log_e(float x) {  // e, as a float
  uint32_t sub = 0u - uint32_t(x < 1.17549435e-38f);
  return float(int32_t(kiln_detail_log_ix(x, sub) >> 23) - 127 - int32_t(sub & 24u));
}
KILN_DECLARE_SIMD static inline float kiln_detail_log_m(float x) {  // log m
  uint32_t ix = kiln_detail_log_ix(x, 0u - uint32_t(x < 1.17549435e-38f));
  float f = kiln_detail_f32((ix & 0x007fffffu) + 0x3f3504f3u) - 1.f;
  float s = f / (2.f + f), z = s * s, hfsq = 0.5f * f * f;
  float R = z * (0.666666865f + z * (0.399885476f + z * 0.29590416f));
  return f - (hfsq - s * (hfsq + R));
}
KILN_DECLARE_SIMD static inline uint64_t kiln_detail_log_ix(double x, uint64_t sub) {
  return kiln_detail_u64(x * kiln_detail_f64(0x3ff0000000000000ull + (sub & (uint64_t(54) << 52)))) + (0x3ff0000000000000ull - 0x3fe6a09e667f3bcdull);
}
KILN_DECLARE_SIMD static inline double kiln_detail_log_e(double x) {
  uint64_t sub = uint64_t(0) - uint64_t(x < 2.2250738585072014e-308);
  // NOTE: uint64 -> double by the 2^52 magic: AVX2 has no such conversion
  double e = kiln_detail_f64(0x4330000000000000ull | (kiln_detail_log_ix(x, sub) >> 52)) - 4503599627370496.0;
  return e - 1023.0 - kiln_detail_f64(sub & 0x404b000000000000ull);  // - 54 for a subnormal
}
KILN_DECLARE_SIMD static inline double kiln_detail_log_f(double x) {  // f = m - 1
  uint64_t ix = kiln_detail_log_ix(x, uint64_t(0) - uint64_t(x < 2.2250738585072014e-308));
  return kiln_detail_f64((ix & 0x000fffffffffffffull) + 0x3fe6a09e667f3bcdull) - 1.0;
}
// T(z) = 2/3 + z T1(z), z = s^2 <= 0.0295
KILN_DECLARE_SIMD static inline double kiln_detail_log_t1(double z) {
  return 0.4000000000000094 + z * (0.28571428570764074 + z * (0.22222222400632796 + z * (0.18181794691901071 + z * (0.1538629101914345 + z * (0.13267405750522118 + z * 0.13100854389788408)))));
}
KILN_DECLARE_SIMD static inline double kiln_detail_log_m(double x) {
  double f = kiln_detail_log_f(x);
  double s = f / (2.0 + f), z = s * s, hfsq = 0.5 * f * f;
  return f - (hfsq - s * (hfsq + z * (0.66666666666666663 + z * kiln_detail_log_t1(z))));
}
// log(+inf) = inf, log(0) = -inf, log(<0) = NaN, NaN in -> NaN out. y is finite for
// every x, so adding the special value (else 0) replaces it.
KILN_DECLARE_SIMD static inline float kiln_detail_log_special(float x, float y) {
  float c = kiln_detail_pick(x < 0.f, __builtin_nanf(""), 0.f);
  c = kiln_detail_pick(x == 0.f, -__builtin_inff(), c);
  return y + kiln_detail_pick((x == __builtin_inff()) | (x != x), x, c);
}
KILN_DECLARE_SIMD static inline double kiln_detail_log_special(double x, double y) {
  double c = kiln_detail_pick(x < 0.0, __builtin_nan(""), 0.0);
  c = kiln_detail_pick(x == 0.0, -__builtin_inf(), c);
  return y + kiln_detail_pick((x == __builtin_inf()) | (x != x), x, c);
}

KILN_DECLARE_SIMD static inline float kiln_log(float x) {
  float e = kiln_detail_log_e(x);
  return kiln_detail_log_special(x, e * 0.693145752f + (e * 1.42860677e-06f + kiln_detail_log_m(x)));
}
KILN_DECLARE_SIMD static inline double kiln_log(double x) {
  double e = kiln_detail_log_e(x);
  return kiln_detail_log_special(x, e * 0.69314718060195446 + (kiln_detail_log_m(x) - e * 4.2009150726810846e-11));
}
// log2 e in two parts: with FMA the product is rounded once
KILN_DECLARE_SIMD static inline float kiln_log2(float x) {
  float l = kiln_detail_log_m(x);
  return kiln_detail_log_special(x, kiln_detail_log_e(x) + (l * 1.44269502f + l * 1.92596303e-08f));
}
KILN_DECLARE_SIMD static inline double kiln_log2(double x) {
  double l = kiln_detail_log_m(x);
  return kiln_detail_log_special(x, kiln_detail_log_e(x) + (l * 1.4426950408889634 + l * 2.0355273740931033e-17));
}

// ---- roots, reciprocals, rounding, sign --------------------------------------------
// NOTE: single instructions (sqrtps, divps) under -fno-math-errno.
KILN_DECLARE_SIMD static inline float kiln_sqrt(float x) { return std::sqrt(x); }
KILN_DECLARE_SIMD static inline double kiln_sqrt(double x) { return std::sqrt(x); }
KILN_DECLARE_SIMD static inline float kiln_rsqrt(float x) { return 1.f / std::sqrt(x); }
KILN_DECLARE_SIMD static inline double kiln_rsqrt(double x) { return 1.0 / std::sqrt(x); }
KILN_DECLARE_SIMD static inline float kiln_recip(float x) { return 1.f / x; }
KILN_DECLARE_SIMD static inline double kiln_recip(double x) { return 1.0 / x; }
// floor: round to nearest by the 2^23 (2^52) magic, step down if that went up; the
// result keeps the sign of x (floor(-0) = -0). |x| >= 2^23 (inf, NaN) is already integral.
// NOTE: not std::floor: GCC 12 vectorises it (roundps) only under -fno-trapping-math.
KILN_DECLARE_SIMD static inline float kiln_floor(float x) {
  float c = kiln_detail_copysign(8388608.f, x);
  float r = (x + c) - c;
  r = kiln_detail_copysign(r - kiln_detail_pick(x < r, 1.f, 0.f), x);
  return kiln_detail_pick(std::fabs(x) < 8388608.f, r, x);
}
KILN_DECLARE_SIMD static inline double kiln_floor(double x) {
  double c = kiln_detail_copysign(4503599627370496.0, x);
  double r = (x + c) - c;
  r = kiln_detail_copysign(r - kiln_detail_pick(x < r, 1.0, 0.0), x);
  return kiln_detail_pick(std::fabs(x) < 4503599627370496.0, r, x);
}
KILN_DECLARE_SIMD static inline float kiln_abs(float x) { return std::fabs(x); }
KILN_DECLARE_SIMD static inline double kiln_abs(double x) { return std::fabs(x); }
// sign(±0) = ±0, sign(NaN) = NaN
KILN_DECLARE_SIMD static inline float kiln_sign(float x) { return x > 0.f ? 1.f : (x < 0.f ? -1.f : x); }
KILN_DECLARE_SIMD static inline double kiln_sign(double x) { return x > 0.0 ? 1.0 : (x < 0.0 ? -1.0 : x); }
// NaN if either is NaN, like torch.maximum / torch.minimum
KILN_DECLARE_SIMD static inline float kiln_max(float a, float b) { return (a > b || a != a) ? a : b; }
KILN_DECLARE_SIMD static inline double kiln_max(double a, double b) { return (a > b || a != a) ? a : b; }
KILN_DECLARE_SIMD static inline float kiln_min(float a, float b) { return (a < b || a != a) ? a : b; }
KILN_DECLARE_SIMD static inline double kiln_min(double a, double b) { return (a < b || a != a) ? a : b; }

// ---- sin, cos --------------------------------------------------------------------
// x = k pi/2 + r, |r| <= pi/4 (pi/2 in four parts of 8, 8, 8, 24 bits: k P_i exact for
// |k| < 2^16, and with FMA for |k| < 2^22); quadrant q = k + quarter (1 for cos): q&1
// picks cos r, q&2 flips the sign.
// NOTE: sin r takes the sign of r, so that sin(-0) = -0 (r + r z S(z) would give +0).
// NOTE: the clamp of r only matters when |x| >= 2^22 pi/2, where round() fails; it keeps
// the polynomials (and so the result) bounded there.
KILN_DECLARE_SIMD static inline float kiln_detail_sincos(float x, uint32_t quarter) {
  float t = x * 0.636619747f + 12582912.f;
  float k = t - 12582912.f;
  float r = x - k * 1.5703125f - k * 0.000482559204f - k * 1.2665987e-06f - k * 9.92093518e-10f;
  r = kiln_detail_clamp(r, -1.5f, 1.5f);
  float z = r * r;
  float ps = kiln_detail_copysign(r + r * z * (-0.166666672f + z * (0.00833333191f + z * (-0.00019840039f + z * 2.72438115e-06f))), r);
  float pc = 1.f - 0.5f * z + z * z * (0.0416666679f + z * (-0.00138888881f + z * (2.48005599e-05f + z * -2.72958573e-07f)));
  uint32_t q = kiln_detail_u32(t) + quarter;
  return kiln_detail_f32(kiln_detail_u32(kiln_detail_pick((q & 1u) != 0u, pc, ps)) ^ ((q & 2u) << 30));
}
// pi/2 in parts of 30, 30, 53 bits: k P_i exact for |k| < 2^23
KILN_DECLARE_SIMD static inline double kiln_detail_sincos(double x, uint64_t quarter) {
  double t = x * 0.63661977236758138 + 6755399441055744.0;
  double k = t - 6755399441055744.0;
  double r = x - k * 1.570796325802803 - k * 9.9209357916352214e-10 - k * 5.1701829817941051e-19;
  r = kiln_detail_clamp(r, -1.5, 1.5);
  double z = r * r;
  double ps = kiln_detail_copysign(r + r * z * (-0.16666666666666666 + z * (0.0083333333333333315 + z * (-0.00019841269841264569 + z * (2.7557319218956732e-06 + z * (-2.5052106100926675e-08 + z * (1.6058510979535349e-10 + z * -7.5854925078212401e-13)))))), r);
  double pc = 1.0 - 0.5 * z + z * z * (0.041666666666666664 + z * (-0.0013888888888887241 + z * (2.4801587298533456e-05 + z * (-2.7557317152467041e-07 + z * (2.0876121658871161e-09 + z * -1.1380876948169717e-11)))));
  uint64_t q = kiln_detail_u64(t) + quarter;
  return kiln_detail_f64(kiln_detail_u64(kiln_detail_pick((q & 1u) != 0u, pc, ps)) ^ ((q & 2u) << 62));
}
KILN_DECLARE_SIMD static inline float kiln_sin(float x) { return kiln_detail_sincos(x, 0u); }
KILN_DECLARE_SIMD static inline double kiln_sin(double x) { return kiln_detail_sincos(x, uint64_t(0)); }
KILN_DECLARE_SIMD static inline float kiln_cos(float x) { return kiln_detail_sincos(x, 1u); }
KILN_DECLARE_SIMD static inline double kiln_cos(double x) { return kiln_detail_sincos(x, uint64_t(1)); }

// ---- tanh, erf -------------------------------------------------------------------
// tanh|x| = e / (e + 2), e = expm1(2|x|) = 2^k expm1(r) + (2^k - 1); the clamp (where
// tanh already rounds to 1) keeps e finite
KILN_DECLARE_SIMD static inline float kiln_tanh(float x) {
  float a = kiln_detail_pick(10.f < std::fabs(x), 10.f, std::fabs(x));
  float y = a + a;
  float t = y * 1.44269502f + 12582912.f;
  float k = t - 12582912.f;
  float r = y - k * 0.693145752f - k * 1.42860677e-06f;
  float s = kiln_detail_f32((kiln_detail_u32(t) - 0x4b400000u + 127u) << 23);
  float e = s * kiln_detail_expm1_poly(r) + (s - 1.f);
  return kiln_detail_copysign(e / (e + 2.f), x);
}
KILN_DECLARE_SIMD static inline double kiln_tanh(double x) {
  double a = kiln_detail_pick(20.0 < std::fabs(x), 20.0, std::fabs(x));
  double y = a + a;
  double t = y * 1.4426950408889634 + 6755399441055744.0;
  double k = t - 6755399441055744.0;
  double r = y - k * 0.69314718060195446 + k * 4.2009150726810846e-11;
  double s = kiln_detail_f64((kiln_detail_u64(t) - 0x4338000000000000ull + 1023u) << 52);
  double e = s * kiln_detail_expm1_poly(r) + (s - 1.0);
  return kiln_detail_copysign(e / (e + 2.0), x);
}

// |x| < 1: erf x = x A(x^2). Float, 1 <= |x| < 3.92: erf = 1 - e^(H(|x|) - x^2),
// H = log erfc + x^2 in u = |x| - 2.46 (no division); beyond, erf rounds to 1.
KILN_DECLARE_SIMD static inline float kiln_erf(float x) {
  float a = std::fabs(x), z = x * x;
  float small = x * (1.12837911f + z * (-0.37612626f + z * (0.112835944f + z * (-0.0268542115f + z * (0.00518908724f + z * (-0.00080168643f + z * 7.87587487e-05f))))));
  float ac = kiln_detail_pick(3.92f < a, 3.92f, a);
  float u = ac - 2.46f;
  float h = -1.54261756f + u * (-0.357221872f + u * (0.0574303232f + u * (-0.0112117305f + u * (0.00225136476f + u * (-0.000439211668f + u * (8.09642734e-05f + u * (-1.38136793e-05f + u * 1.67043277e-06f)))))));
  float big = 1.f - kiln_detail_exp_mid(h - ac * ac);  // h - x^2 in [-17.4, 0.5]
  return kiln_detail_pick(a < 1.f, small, kiln_detail_copysign(big, x));
}
// Double, 1 <= |x| < 6: erf = 1 - e^(-x^2) F, F = erfc e^(x^2) in v = 1/(1+|x|) - 9/28
KILN_DECLARE_SIMD static inline double kiln_erf(double x) {
  double a = std::fabs(x), z = x * x;
  double small = x * (1.1283791670955126 + z * (-0.37612638903183543 + z * (0.11283791670945006 + z * (-0.02686617064323777 + z * (0.0052239776071164225 + z * (-0.00085483259753896918 + z * (0.00012055294904839707 + z * (-1.4924736907419661e-05 + z * (1.6447424703317362e-06 + z * (-1.6208483801871705e-07 + z * (1.3720064546777686e-08 + z * -7.7958988270021425e-10)))))))))));
  double ac = kiln_detail_pick(6.0 < a, 6.0, a);
  double v = 1.0 / (1.0 + ac) - 0.32142857142857145;
  double F = 0.24402507744132423 + v * (0.94903744292730396 + v * (0.51638011981972931 + v * (-0.38115313112728649 + v * (-0.30458646243676657 + v * (0.59350168280978244 + v * (-0.080916262079947066 + v * (-0.84264292663437379 + v * (1.1692567685260908 + v * (0.006361609864009056 + v * (-2.4367205361736444 + v * (4.0114226965356696 + v * (-1.4097287646378989 + v * (-7.2846930253214994 + v * (18.842529349897337 + v * (-17.516158300601816 + v * (-28.991780381984608 + v * 81.140946230831389))))))))))))))));
  double big = 1.0 - kiln_detail_exp_mid(-(ac * ac)) * F;
  return kiln_detail_pick(a < 1.0, small, kiln_detail_copysign(big, x));
}

// ---- pow -------------------------------------------------------------------------
// std::pow's special cases as selects on top of e^(y log|x|): y = 0 or x = 1 -> 1;
// |x| = 1, y = ±inf -> 1; x < 0 finite, y not an integer -> NaN; x < 0 (or -0), y odd
// -> the sign flips. ±0, ±inf and NaN otherwise come out of log and exp themselves.
KILN_DECLARE_SIMD static inline float kiln_detail_pow_special(float x, float y, float r) {
  bool yint = kiln_floor(y) == y, yodd = yint & (kiln_floor(0.5f * y) != 0.5f * y);
  r += kiln_detail_pick((x < 0.f) & (x != -__builtin_inff()) & !yint, __builtin_nanf(""), 0.f);
  r = kiln_detail_f32(kiln_detail_u32(r) ^ (kiln_detail_u32(x) & (uint32_t(yodd) << 31)));
  bool ax1 = std::fabs(x) == 1.f, yinf = std::fabs(y) == __builtin_inff(), one = ax1 & yinf;
  return kiln_detail_pick((y == 0.f) | (x == 1.f) | one, 1.f, r);
}
KILN_DECLARE_SIMD static inline double kiln_detail_pow_special(double x, double y, double r) {
  bool yint = kiln_floor(y) == y, yodd = yint & (kiln_floor(0.5 * y) != 0.5 * y);
  r += kiln_detail_pick((x < 0.0) & (x != -__builtin_inf()) & !yint, __builtin_nan(""), 0.0);
  r = kiln_detail_f64(kiln_detail_u64(r) ^ (kiln_detail_u64(x) & (uint64_t(yodd) << 63)));
  bool ax1 = std::fabs(x) == 1.0, yinf = std::fabs(y) == __builtin_inf(), one = ax1 & yinf;
  return kiln_detail_pick((y == 0.0) | (x == 1.0) | one, 1.0, r);
}
// Float: y log|x| in double is exact enough (|y log x| <= 104 for a finite result).
KILN_DECLARE_SIMD static inline float kiln_pow(float x, float y) {
  return kiln_detail_pow_special(x, y, float(kiln_exp(double(y) * kiln_log(double(std::fabs(x))))));
}
// Double: |y log x| reaches 745, so log|x| is kept as h + l (about 2^-66 relative) and
// e^(y h + y l) takes the low part into its reduced argument.
KILN_DECLARE_SIMD static inline double kiln_pow(double x, double y) {
  double ax = std::fabs(x);
  double e = kiln_detail_log_e(ax), f = kiln_detail_log_f(ax);
  double d = 2.0 + f, dl = f - (d - 2.0);  // 2 + f = d + dl exactly
  double s = f / d;
  double sl = (kiln_detail_fnma(s, d, f) - s * dl) / d;  // s + sl = f / (2 + f)
  // 2 atanh(s + sl) = 2s + 2sl + (2/3) s^3 + 2 s^2 sl + s^3 z T1(z); (2/3) s^3 = c + cl
  // in double-double
  double z = s * s, zl = kiln_detail_mul_err(s, s, z);
  double s3 = z * s, s3l = kiln_detail_mul_err(z, s, s3) + zl * s;
  double c = s3 * 0.66666666666666663;
  double cl = kiln_detail_mul_err(s3, 0.66666666666666663, c) + (s3l * 0.66666666666666663 + s3 * 3.7007434154171883e-17);
  // log|x| = (e ln2_hi + 2s + c) + (e ln2_lo + 2sl + cl + ...): the first sum exact (TwoSums)
  double a1 = e * 0.69314718060195446, b1 = s + s;
  double h = a1 + b1, bb = h - a1, err = (a1 - (h - bb)) + (b1 - bb);
  double h2 = h + c;
  bb = h2 - h;
  err += (h - (h2 - bb)) + (c - bb);
  double l = err + ((cl + (sl + sl)) + ((z + z) * sl + s3 * z * kiln_detail_log_t1(z)) - e * 4.2009150726810846e-11);
  h = h2 + l;  // renormalise (|l| < |h|), so that y l stays below an ulp of y h
  l -= h - h2;
  h += kiln_detail_pick(ax == 0.0, -__builtin_inf(), kiln_detail_pick((ax == __builtin_inf()) | (ax != ax), ax, 0.0));  // h is finite
  // NOTE: z, s3, c and p must stay rounded products for mul_err: each has a use that is
  // not an add, so -ffp-contract=fast does not fuse it into one. p + pl = y h + y l.
  double p = y * h;
  double pl = kiln_detail_mul_err(y, h, p) + y * l;
  // far out the result is 0 or inf; and for h = 0 (|x| = 1), a huge y would overflow Dekker's split
  pl = kiln_detail_pick((std::fabs(p) < 1000.0) & (h != 0.0), pl, 0.0);
  double pc = kiln_detail_clamp(p, -746.0, 709.8);
  double t = pc * 1.4426950408889634 + 6755399441055744.0;
  double k = t - 6755399441055744.0;
  double r = (pc - k * 0.69314718060195446 + k * 4.2009150726810846e-11) + pl;
  return kiln_detail_pow_special(x, y, kiln_detail_exp_scale(r, kiln_detail_u64(t) - 0x4338000000000000ull + 2048u));
}

// ---- bfloat16 and half ------------------------------------------------------------
// Storage is the raw uint16_t. f32 -> 16 bit rounds to nearest even; a NaN keeps its
// sign and top payload bits (the quiet bit is set only when those are all zero, so
// every 16-bit pattern survives 16 -> 32 -> 16 unchanged).
KILN_DECLARE_SIMD static inline float kiln_bf16_to_f32(uint16_t h) { return kiln_detail_f32(uint32_t(h) << 16); }
KILN_DECLARE_SIMD static inline uint16_t kiln_f32_to_bf16(float x) {
  uint32_t u = kiln_detail_u32(x), hi = u >> 16;
  uint32_t rounded = (u + 0x7fffu + (hi & 1u)) >> 16;  // a carry rolls into the exponent, up to inf
  uint32_t nan = hi | ((hi & 0x7fu) == 0u ? 0x40u : 0u);
  return uint16_t(kiln_detail_pick((u & 0x7fffffffu) > 0x7f800000u, nan, rounded));
}
KILN_DECLARE_SIMD static inline float kiln_f16_to_f32(uint16_t h) {
  uint32_t em = uint32_t(h) & 0x7fffu, m13 = em << 13;
  // subnormal: m 2^-24 = (1 + m/1024) 2^-14 - 2^-14, exactly
  uint32_t sub = kiln_detail_u32(kiln_detail_f32(m13 + 0x38800000u) - 6.10351562e-05f);
  uint32_t o = kiln_detail_pick(em < 0x0400u, sub, m13 + 0x38000000u);
  o = kiln_detail_pick(em >= 0x7c00u, m13 | 0x7f800000u, o);
  return kiln_detail_f32(o | ((uint32_t(h) & 0x8000u) << 16));
}
KILN_DECLARE_SIMD static inline uint16_t kiln_f32_to_f16(float x) {
  uint32_t u = kiln_detail_u32(x), a = u & 0x7fffffffu;
  // normal: rebias 127 -> 15 and round the 13 dropped bits to even; [65520, 65536) carries to inf
  uint32_t normal = (a - 0x38000000u + 0x0fffu + ((a >> 13) & 1u)) >> 13;
  // |x| < 2^-14: adding 0.5 (ulp 2^-24) makes the FPU round to the f16 subnormal grid
  uint32_t sub = kiln_detail_u32(kiln_detail_f32(a) + 0.5f) - 0x3f000000u;
  uint32_t pay = (a >> 13) & 0x3ffu;
  uint32_t big = kiln_detail_pick(a > 0x7f800000u, 0x7c00u | pay | (pay == 0u ? 0x200u : 0u), 0x7c00u);
  uint32_t o = kiln_detail_pick(a >= 0x47800000u, big, kiln_detail_pick(a < 0x38800000u, sub, normal));
  return uint16_t(o | ((u >> 16) & 0x8000u));
}

#endif  // KILN_CODEGEN_DEVICE_CPU_MATH_HPP
