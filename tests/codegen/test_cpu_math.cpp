// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Tests of the CPU math prelude (codegen/device/cpu_math.hpp): every function
// against a long double reference over random and edge-case inputs (max ulp and
// relative error), pow's special cases against std::pow, the 16-bit conversions over
// all 65536 patterns; then the same sweeps through loops compiled with the JIT's own
// flags, checking that GCC vectorised every one. KILN_MATH_REPORT=1 prints the table.
#include <doctest/doctest.h>

#include <dlfcn.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/codegen/device/cpu_math.hpp"

namespace {

using LD = long double;
constexpr int64_t kN = 1 << 19;  // random inputs per domain

bool report() {
  static const bool on = std::getenv("KILN_MATH_REPORT") != nullptr;
  return on;
}

template <class T>
using Unary = std::function<void(const T*, T*, int64_t)>;
template <class T>
using Binary = std::function<void(const T*, const T*, T*, int64_t)>;

// ---- error measure ---------------------------------------------------------------
// One ulp of T at |ref| (subnormal spacing below the normal range). Infinities count
// as 2^max_exponent, so overflowing one ulp early or late costs about one ulp.
template <class T>
LD ulp_at(LD ref) {
  constexpr int digits = std::numeric_limits<T>::digits, emax = std::numeric_limits<T>::max_exponent;
  ref = std::fabs(ref);
  if (ref < LD(std::numeric_limits<T>::min())) return std::ldexp(LD(1), std::numeric_limits<T>::min_exponent - digits);
  int e = 0;
  std::frexp(ref, &e);
  return std::ldexp(LD(1), std::min(e, emax) - digits);
}
template <class T>
LD widen(LD v) {
  const LD top = std::ldexp(LD(1), std::numeric_limits<T>::max_exponent);
  return std::isinf(v) || std::fabs(v) > top ? std::copysign(top, v) : v;
}

template <class T>
struct Stats {
  LD max_ulp = 0, max_rel = 0, max_abs = 0;
  T worst{}, bad_x{};
  int64_t n = 0, bad = 0;  // bad: NaN where the reference is not, or the other way
  void add(T x, T got, LD ref) {
    ++n;
    if (std::isnan(ref) || std::isnan(got)) {
      if (std::isnan(ref) != std::isnan(got)) ++bad, bad_x = x;
      return;
    }
    LD g = widen<T>(got), r = widen<T>(ref), d = std::fabs(g - r);
    LD u = d / ulp_at<T>(r);
    if (u > max_ulp) max_ulp = u, worst = x;
    if (std::fabs(r) >= LD(std::numeric_limits<T>::min()) && std::fabs(r) < std::ldexp(LD(1), std::numeric_limits<T>::max_exponent))
      max_rel = std::max(max_rel, d / std::fabs(r));  // normal results only
    max_abs = std::max(max_abs, d);
  }
};

// ---- inputs ----------------------------------------------------------------------
std::mt19937_64& rng() {
  static std::mt19937_64 g(0x6b696c6eull);
  return g;
}
template <class T>
std::vector<T> uniform(T lo, T hi, int64_t n = kN) {
  std::uniform_real_distribution<T> d(lo, hi);
  std::vector<T> v(static_cast<size_t>(n));
  for (T& x : v) x = d(rng());
  return v;
}
// Random bit patterns with |x| in [lo, hi]: log-uniform over the binades, every mantissa.
template <class T>
std::vector<T> bits(T lo, T hi, bool both_signs, int64_t n = kN) {
  using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
  U a, b;
  std::memcpy(&a, &lo, sizeof a);
  std::memcpy(&b, &hi, sizeof b);
  std::uniform_int_distribution<U> d(a, b);
  std::vector<T> v(static_cast<size_t>(n));
  for (T& x : v) {
    U u = d(rng());
    if (both_signs && (rng()() & 1)) u |= U(1) << (8 * sizeof(T) - 1);
    std::memcpy(&x, &u, sizeof x);
  }
  return v;
}
template <class T>
std::vector<T> edges() {
  using L = std::numeric_limits<T>;
  std::vector<T> v = {T(0), L::denorm_min(), L::min(), L::max(), L::infinity(), L::quiet_NaN(), T(1), T(0.5), T(2),
                      T(3), T(0.75), std::nextafter(T(1), T(0)), std::nextafter(T(1), T(2)), L::epsilon(), T(1e-30),
                      T(10), T(100), T(1000), T(1e5), T(1e10), T(1e30), std::nextafter(L::min(), T(0))};
  for (size_t i = 0, n = v.size(); i < n; ++i) v.push_back(-v[i]);
  return v;
}
template <class T>
std::vector<T> cat(std::vector<T> a, const std::vector<T>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// ---- one check -------------------------------------------------------------------
template <class T>
Stats<T> sweep(const Unary<T>& f, LD (*ref)(LD), const std::vector<T>& xs) {
  std::vector<T> out(xs.size());
  f(xs.data(), out.data(), int64_t(xs.size()));
  Stats<T> s;
  for (size_t i = 0; i < xs.size(); ++i) s.add(xs[i], out[i], ref(LD(xs[i])));
  return s;
}
template <class T>
void expect(const char* what, const Stats<T>& s, LD max_ulp, LD max_rel = 1) {
  if (report())
    std::printf("  %-34s %-6s max %9.3Lf ulp  rel %9.3Le  abs %9.3Le  (n=%lld, worst x=%.9g)\n", what,
                sizeof(T) == 4 ? "float" : "double", s.max_ulp, s.max_rel, s.max_abs, (long long)s.n, double(s.worst));
  INFO(what << (sizeof(T) == 4 ? " float" : " double") << ": max ulp " << double(s.max_ulp) << " at x = "
            << double(s.worst) << ", max rel " << double(s.max_rel) << ", NaN mismatches " << s.bad << " (x = "
            << double(s.bad_x) << ")");
  CHECK(s.bad == 0);
  CHECK(s.max_ulp <= max_ulp);
  CHECK(s.max_rel <= max_rel);
}

// The prelude's functions as batch loops; the JIT test swaps in compiled ones.
template <class T>
struct Fns {
  Unary<T> exp, exp2, log, log2, sqrt, rsqrt, recip, sin, cos, tanh, erf, floor, sign, abs;
  Binary<T> pow, max, min;
};
#define KILN_TEST_U(name) [](const T* a, T* o, int64_t n) { for (int64_t i = 0; i < n; ++i) o[i] = kiln_##name(a[i]); }
#define KILN_TEST_B(name) \
  [](const T* a, const T* b, T* o, int64_t n) { for (int64_t i = 0; i < n; ++i) o[i] = kiln_##name(a[i], b[i]); }
template <class T>
Fns<T> scalar_fns() {
  return {KILN_TEST_U(exp),   KILN_TEST_U(exp2),  KILN_TEST_U(log), KILN_TEST_U(log2), KILN_TEST_U(sqrt),
          KILN_TEST_U(rsqrt), KILN_TEST_U(recip), KILN_TEST_U(sin), KILN_TEST_U(cos),  KILN_TEST_U(tanh),
          KILN_TEST_U(erf),   KILN_TEST_U(floor), KILN_TEST_U(sign), KILN_TEST_U(abs), KILN_TEST_B(pow),
          KILN_TEST_B(max),   KILN_TEST_B(min)};
}
#undef KILN_TEST_U
#undef KILN_TEST_B

// exact functions: the result must be the reference, bit for bit (NaN: any NaN)
template <class T>
void expect_exact(const char* what, const Unary<T>& f, T (*ref)(T), const std::vector<T>& xs) {
  std::vector<T> out(xs.size());
  f(xs.data(), out.data(), int64_t(xs.size()));
  int64_t bad = 0;
  T bad_x{};
  for (size_t i = 0; i < xs.size(); ++i) {
    T r = ref(xs[i]);
    bool same = std::isnan(r) ? std::isnan(out[i]) : std::memcmp(&r, &out[i], sizeof r) == 0;
    if (!same) ++bad, bad_x = xs[i];
  }
  INFO(what << ": " << bad << " differ, e.g. x = " << double(bad_x));
  CHECK(bad == 0);
}

// Accuracy bounds, float and double; measured values are in the report. `fused`: the
// code was compiled with FMA, which extends float sin/cos's exact reduction past 1e5.
template <class T>
void check_all(const Fns<T>& F, bool fused) {
  constexpr bool f32 = sizeof(T) == 4;
  using L = std::numeric_limits<T>;
  const LD dbl_rel = 2e-15L;  // the double target; float's are in ulps
  const LD rel = f32 ? 1 : dbl_rel;
  auto all = [&](bool signs) { return cat(bits<T>(T(0), L::max(), signs), edges<T>()); };

  // exp family: the whole range, tails included (overflow to inf, subnormal results, 0)
  const T ex = f32 ? T(105) : T(750), ex2 = f32 ? T(152) : T(1080);
  expect("exp  [-ovf, ovf] uniform", sweep<T>(F.exp, [](LD x) { return std::exp(x); }, cat(uniform(-ex, ex), edges<T>())), f32 ? 1.5 : 2, rel);
  expect("exp  all floats", sweep<T>(F.exp, [](LD x) { return std::exp(x); }, all(true)), f32 ? 1.5 : 2, rel);
  expect("exp  |x| < 1", sweep<T>(F.exp, [](LD x) { return std::exp(x); }, uniform(T(-1), T(1))), f32 ? 1.5 : 2, rel);
  expect("exp2 [-ovf, ovf] uniform", sweep<T>(F.exp2, [](LD x) { return std::exp2(x); }, cat(uniform(-ex2, ex2), edges<T>())), f32 ? 1.5 : 2, rel);
  expect("exp2 all floats", sweep<T>(F.exp2, [](LD x) { return std::exp2(x); }, all(true)), f32 ? 1.5 : 2, rel);

  // log family: every positive float incl. subnormals, near 1, and negatives / specials
  expect("log  all floats", sweep<T>(F.log, [](LD x) { return std::log(x); }, all(true)), f32 ? 1.5 : 2, rel);
  expect("log  [0.5, 2]", sweep<T>(F.log, [](LD x) { return std::log(x); }, uniform(T(0.5), T(2))), f32 ? 1.5 : 2, rel);
  expect("log2 all floats", sweep<T>(F.log2, [](LD x) { return std::log2(x); }, all(true)), 2, rel);
  expect("log2 [0.5, 2]", sweep<T>(F.log2, [](LD x) { return std::log2(x); }, uniform(T(0.5), T(2))), 2, rel);

  // roots and reciprocals: correctly rounded or one extra rounding
  expect("sqrt all floats", sweep<T>(F.sqrt, [](LD x) { return std::sqrt(x); }, all(true)), 0.5, rel);
  expect("rsqrt all floats", sweep<T>(F.rsqrt, [](LD x) { return 1 / std::sqrt(x); }, all(true)), 1.5, rel);
  expect("recip all floats", sweep<T>(F.recip, [](LD x) { return 1 / x; }, all(true)), 0.5, rel);

  // sin / cos: ulps up to pi; beyond, the absolute error (a value near a zero of sin
  // has few correct bits after any reduction of a rounded x)
  for (auto* fn : {&F.sin, &F.cos}) {
    auto ref = fn == &F.sin ? +[](LD x) { return std::sin(x); } : +[](LD x) { return std::cos(x); };
    std::string nm = fn == &F.sin ? "sin" : "cos";
    expect((nm + "  [-pi, pi]").c_str(), sweep<T>(*fn, ref, uniform(T(-3.1416), T(3.1416))), f32 ? 2 : 2, rel);
    expect((nm + "  tiny..pi bits").c_str(), sweep<T>(*fn, ref, bits(T(0), T(3.1416), true)), f32 ? 2 : 2, rel);
    Stats<T> far = sweep<T>(*fn, ref, uniform(T(-1e5), T(1e5)));
    expect((nm + "  [-1e5, 1e5]").c_str(), far, 1e9);
    CHECK(far.max_abs <= (f32 ? 1.5e-7L : 2.5e-16L));
    Stats<T> farther = sweep<T>(*fn, ref, uniform(T(1e5), T(6e6)));
    if (report()) std::printf("  %-34s %-6s abs %9.3Le%s\n", (nm + "  [1e5, 6e6]").c_str(), f32 ? "float" : "double", farther.max_abs, fused ? "" : " (no FMA: not checked)");
    CHECK(farther.bad == 0);
    if (fused || !f32) CHECK(farther.max_abs <= (f32 ? 1.5e-7L : 2.5e-16L));
    // beyond 2^22 pi/2 (float) nothing is promised but a bounded value; NaN for inf and NaN
    std::vector<T> huge = cat(bits(T(1e7), L::max(), true), std::vector<T>{L::max(), -L::max()}), out(huge.size());
    (*fn)(huge.data(), out.data(), int64_t(huge.size()));
    int64_t unbounded = 0;
    for (T y : out) unbounded += !(std::fabs(y) <= T(1));
    CHECK(unbounded == 0);
    T sp[3] = {L::infinity(), -L::infinity(), L::quiet_NaN()}, so[3];
    (*fn)(sp, so, 3);
    CHECK((std::isnan(so[0]) && std::isnan(so[1]) && std::isnan(so[2])));
  }

  expect("tanh all floats", sweep<T>(F.tanh, [](LD x) { return std::tanh(x); }, all(true)), f32 ? 2.5 : 3, f32 ? 1e-6L : dbl_rel);
  expect("tanh [-10, 10]", sweep<T>(F.tanh, [](LD x) { return std::tanh(x); }, uniform(T(-10), T(10))), f32 ? 2.5 : 3, f32 ? 1e-6L : dbl_rel);
  expect("erf  all floats", sweep<T>(F.erf, [](LD x) { return std::erf(x); }, all(true)), f32 ? 2.5 : 3, f32 ? 1e-6L : dbl_rel);
  expect("erf  [-6, 6]", sweep<T>(F.erf, [](LD x) { return std::erf(x); }, uniform(T(-6), T(6))), f32 ? 2.5 : 3, f32 ? 1e-6L : dbl_rel);

  // exact ones
  auto floor_ref = +[](T x) { return std::floor(x); };
  expect_exact<T>("floor", F.floor, floor_ref, cat(cat(all(true), uniform(T(-1e3), T(1e3))), uniform(T(-1e7), T(1e7))));
  expect_exact<T>("abs", F.abs, +[](T x) { return std::fabs(x); }, all(true));
  expect_exact<T>("sign", F.sign, +[](T x) { return x > 0 ? T(1) : x < 0 ? T(-1) : x; }, all(true));

  // max / min: NaN if either is NaN
  {
    std::vector<T> a = cat(bits(T(0), L::max(), true), edges<T>()), b = cat(bits(T(0), L::max(), true), edges<T>());
    std::vector<T> e = edges<T>();
    for (T x : e)
      for (T y : e) a.push_back(x), b.push_back(y);
    std::vector<T> mx(a.size()), mn(a.size());
    F.max(a.data(), b.data(), mx.data(), int64_t(a.size()));
    F.min(a.data(), b.data(), mn.data(), int64_t(a.size()));
    int64_t bad = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      bool nan = std::isnan(a[i]) || std::isnan(b[i]);
      T rmax = a[i] > b[i] ? a[i] : b[i], rmin = a[i] < b[i] ? a[i] : b[i];
      if (nan) bad += !std::isnan(mx[i]) || !std::isnan(mn[i]);
      else bad += mx[i] != rmax || mn[i] != rmin;
    }
    CHECK(bad == 0);
  }

  // pow: positive bases over wide exponents, negative bases with integer exponents
  {
    const T ylim = f32 ? T(40) : T(300);
    std::vector<T> x = bits(T(1e-6), T(1e6), false), y = uniform(-ylim, ylim);
    std::vector<T> x2 = uniform(T(0.5), T(2)), y2 = uniform(f32 ? T(-120) : T(-1000), f32 ? T(120) : T(1000));
    std::vector<T> x3 = uniform(T(-20), T(20)), y3(static_cast<size_t>(kN));
    for (T& v : y3) v = T(int64_t(rng()() % (f32 ? 41 : 301)) - (f32 ? 20 : 150));
    for (auto [xs, ys, nm] : {std::tuple{&x, &y, "pow  x in [1e-6,1e6], y uniform"}, std::tuple{&x2, &y2, "pow  x in [.5,2], |y| large"},
                              std::tuple{&x3, &y3, "pow  x in [-20,20], y integer"}}) {
      std::vector<T> out(xs->size());
      F.pow(xs->data(), ys->data(), out.data(), int64_t(xs->size()));
      Stats<T> s;
      for (size_t i = 0; i < xs->size(); ++i) s.add((*xs)[i], out[i], std::pow(LD((*xs)[i]), LD((*ys)[i])));
      expect(nm, s, f32 ? 1 : 2, rel);
    }
  }
}

template <class T>
void check_pow_special(const Fns<T>& F) {
  using L = std::numeric_limits<T>;
  const T inf = L::infinity(), nan = L::quiet_NaN();
  std::vector<T> v = {T(0), T(0.5), T(1), T(2), T(3), T(-0.0), T(-0.5), T(-1), T(-2), T(-3), inf, -inf, nan,
                      L::denorm_min(), -L::denorm_min(), L::max(), -L::max(), T(0.25), T(-0.25), T(1.5), T(-1.5),
                      T(1e20), T(-1e20), T(16777217.0), T(-16777217.0), T(4), T(-4), T(0.3), T(1) + L::epsilon()};
  std::vector<T> a, b;
  for (T x : v)
    for (T y : v) a.push_back(x), b.push_back(y);
  std::vector<T> out(a.size());
  F.pow(a.data(), b.data(), out.data(), int64_t(a.size()));
  for (size_t i = 0; i < a.size(); ++i) {
    T r = std::pow(a[i], b[i]);
    bool ok = std::isnan(r) ? std::isnan(out[i])
                            : (r == 0 || std::isinf(r) || r == 1) ? std::memcmp(&r, &out[i], sizeof r) == 0
                                                                  : std::fabs(LD(out[i]) - r) <= 2 * ulp_at<T>(r);
    INFO("pow(" << double(a[i]) << ", " << double(b[i]) << ") = " << double(out[i]) << ", std::pow says " << double(r));
    CHECK(ok);
  }
}

// signed zeros and exact special values, where the sign matters
template <class T>
void check_zero_signs(const Fns<T>& F) {
  using L = std::numeric_limits<T>;
  T z[2] = {T(0), T(-0.0)}, o[2];
  auto same = [](T a, T b) { return std::memcmp(&a, &b, sizeof a) == 0; };
  for (const auto& item : {std::pair{&F.sin, "sin"}, std::pair{&F.tanh, "tanh"}, std::pair{&F.erf, "erf"},
                            std::pair{&F.floor, "floor"}, std::pair{&F.sign, "sign"}, std::pair{&F.sqrt, "sqrt"}}) {
    (*item.first)(z, o, 2);
    INFO(item.second);
    CHECK(same(o[0], T(0)));
    CHECK(same(o[1], T(-0.0)));
  }
  T s[6] = {L::infinity(), -L::infinity(), T(0), T(-0.0), T(-1), L::quiet_NaN()}, r[6];
  F.log(s, r, 6);
  CHECK(r[0] == L::infinity());
  CHECK(std::isnan(r[1]));
  CHECK(r[2] == -L::infinity());
  CHECK(r[3] == -L::infinity());
  CHECK(std::isnan(r[4]));
  CHECK(std::isnan(r[5]));
  F.exp(s, r, 6);
  CHECK(r[0] == L::infinity());
  CHECK(same(r[1], T(0)));
  CHECK(r[2] == 1);
  CHECK(std::isnan(r[5]));
  F.erf(s, r, 6);
  CHECK(r[0] == 1);
  CHECK(r[1] == -1);
  F.tanh(s, r, 6);
  CHECK(r[0] == 1);
  CHECK(r[1] == -1);
  F.sqrt(s, r, 6);
  CHECK(std::isnan(r[4]));
  F.sin(s, r, 6);
  CHECK(std::isnan(r[0]));
  CHECK(std::isnan(r[5]));
  F.rsqrt(s, r, 6);
  CHECK(same(r[0], T(0)));
  CHECK(r[2] == L::infinity());
}

// round to nearest even at `keep` mantissa bits, via long double: the reference rounding
LD round_to(LD v, int keep, int emin) {
  if (v == 0 || std::isinf(v) || std::isnan(v)) return v;
  int e = 0;
  std::frexp(v, &e);
  int q = std::max(e - keep, emin - keep);  // subnormals share the smallest normal's spacing
  return std::ldexp(std::nearbyint(std::ldexp(v, -q)), q);
}

}  // namespace

#if defined(__FMA__) || defined(__aarch64__)
constexpr bool kFused = true;
#else
constexpr bool kFused = false;
#endif
TEST_CASE("cpu_math: float functions meet their bounds") { check_all<float>(scalar_fns<float>(), kFused); }
TEST_CASE("cpu_math: double functions meet their bounds") { check_all<double>(scalar_fns<double>(), kFused); }

TEST_CASE("cpu_math: pow's special cases are std::pow's") {
  check_pow_special<float>(scalar_fns<float>());
  check_pow_special<double>(scalar_fns<double>());
}

TEST_CASE("cpu_math: signed zeros and infinities") {
  check_zero_signs<float>(scalar_fns<float>());
  check_zero_signs<double>(scalar_fns<double>());
}

namespace {
// f32 -> 16 bit -> f32 against rounding to nearest even at `keep` bits (subnormals below
// 2^emin / 2, inf from inf_at up); NaN must stay NaN. Returns the number of misses.
int64_t rounding_misses(uint16_t (*to16)(float), float (*to32)(uint16_t), int keep, int emin, LD inf_at,
                        const std::vector<float>& xs) {
  int64_t bad = 0;
  for (float x : xs) {
    float back = to32(to16(x));
    if (std::isnan(x)) {
      bad += !std::isnan(back);
      continue;
    }
    LD r = round_to(LD(x), keep, emin);
    if (std::fabs(r) >= inf_at) r = std::copysign(LD(INFINITY), r);
    bad += !(LD(back) == r && std::signbit(back) == std::signbit(x));
  }
  return bad;
}
std::vector<float> with_negatives(std::vector<float> v, std::initializer_list<float> more) {
  for (float x : more) v.push_back(x), v.push_back(-x);
  return v;
}
}  // namespace

TEST_CASE("cpu_math: bf16 <-> f32, all 65536 patterns and random floats") {
  int64_t bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = kiln_bf16_to_f32(uint16_t(h));
    uint32_t u;
    std::memcpy(&u, &f, 4);
    bad += u != h << 16;                        // widening is exact
    bad += kiln_f32_to_bf16(f) != uint16_t(h);  // and comes back unchanged, NaN payloads too
  }
  CHECK(bad == 0);
  std::vector<float> xs = with_negatives(cat(bits(0.f, std::numeric_limits<float>::max(), true, 1 << 20), edges<float>()),
                                         {3.3961514e38f, 3.3961516e38f, 3.4028235e38f, 1.00390625f, 1.01171875f, 1.0078125f});
  CHECK(rounding_misses(kiln_f32_to_bf16, kiln_bf16_to_f32, 8, -125, std::ldexp(LD(1), 128), xs) == 0);
}

TEST_CASE("cpu_math: f16 <-> f32, all 65536 patterns and random floats") {
  int64_t bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = kiln_f16_to_f32(uint16_t(h));
    // the value: sign, 5-bit exponent (bias 15), 10-bit mantissa
    uint32_t e = (h >> 10) & 31, m = h & 1023;
    LD v = e == 0 ? std::ldexp(LD(m), -24) : e == 31 ? (m ? LD(NAN) : LD(INFINITY)) : std::ldexp(LD(1024 + m), int(e) - 25);
    if (h & 0x8000) v = -v;
    bad += std::isnan(v) ? !std::isnan(f) : !(LD(f) == v && std::signbit(f) == bool(h & 0x8000));
    bad += kiln_f32_to_f16(f) != uint16_t(h);  // round trip exact, NaN payloads too
  }
  CHECK(bad == 0);
  std::vector<float> xs = with_negatives(cat(bits(0.f, 1e5f, true, 1 << 20), edges<float>()),
                                         {65504.f, 65519.99f, 65520.f, 65536.f, 6.1035156e-05f, 6.0975552e-05f, 5.9604645e-08f,
                                          2.9802322e-08f, 2.9802326e-08f, 8.9406967e-08f, 1.0009766f, 1.0004883f, 1.0014648f});
  CHECK(rounding_misses(kiln_f32_to_f16, kiln_f16_to_f32, 11, -13, 65536, xs) == 0);
}

// ---- the JIT's configuration ------------------------------------------------------
namespace {

std::string sh(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return *rc = -1, out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  *rc = pclose(p);
  return out;
}

const char* const kUnary[] = {"exp", "exp2", "log", "log2", "sqrt", "rsqrt", "recip", "sin", "cos", "tanh", "erf", "floor", "sign", "abs"};
const char* const kBinary[] = {"pow", "max", "min"};

// One loop per line, so that -fopt-info's line numbers name them.
std::string jit_source(std::vector<std::string>& line_names) {
  std::string s = "#include \"kiln/codegen/device/cpu_math.hpp\"\n";
  line_names = {"", "(the include)"};  // indexed by line number
  auto add = [&](const std::string& name, const std::string& text) { s += text + "\n", line_names.push_back(name); };
  for (const char* T : {"float", "double"}) {
    for (const char* f : kUnary)
      add(std::string(f) + "_" + T, "extern \"C\" void k_" + std::string(f) + "_" + T + "(const " + T + "* __restrict a, " + T +
                                         "* __restrict o, int64_t n) { _Pragma(\"omp simd\") for (int64_t i = 0; i < n; ++i) o[i] = kiln_" + f + "(a[i]); }");
    for (const char* f : kBinary)
      add(std::string(f) + "_" + T, "extern \"C\" void k_" + std::string(f) + "_" + T + "(const " + T + "* __restrict a, const " + T +
                                         "* __restrict b, " + T + "* __restrict o, int64_t n) { _Pragma(\"omp simd\") for (int64_t i = 0; i < n; ++i) o[i] = kiln_" + f + "(a[i], b[i]); }");
  }
  add("bf16_to_f32", "extern \"C\" void k_bf16_to_f32(const uint16_t* __restrict a, float* __restrict o, int64_t n) { _Pragma(\"omp simd\") for (int64_t i = 0; i < n; ++i) o[i] = kiln_bf16_to_f32(a[i]); }");
  add("f32_to_bf16", "extern \"C\" void k_f32_to_bf16(const float* __restrict a, uint16_t* __restrict o, int64_t n) { _Pragma(\"omp simd\") for (int64_t i = 0; i < n; ++i) o[i] = kiln_f32_to_bf16(a[i]); }");
  add("f16_to_f32", "extern \"C\" void k_f16_to_f32(const uint16_t* __restrict a, float* __restrict o, int64_t n) { _Pragma(\"omp simd\") for (int64_t i = 0; i < n; ++i) o[i] = kiln_f16_to_f32(a[i]); }");
  add("f32_to_f16", "extern \"C\" void k_f32_to_f16(const float* __restrict a, uint16_t* __restrict o, int64_t n) { _Pragma(\"omp simd\") for (int64_t i = 0; i < n; ++i) o[i] = kiln_f32_to_f16(a[i]); }");
  // fused, as the codegen writes them
  add("gelu_float", "extern \"C\" void k_gelu_float(const float* __restrict in0, float* __restrict out0, int64_t n) { _Pragma(\"omp simd\") for (int64_t i = 0; i < n; ++i) { float x = in0[i]; float t0 = kiln_erf(x * 0.70710678f); out0[i] = 0.5f * x * (1.f + t0); } }");
  add("gelu_double", "extern \"C\" void k_gelu_double(const double* __restrict in0, double* __restrict out0, int64_t n) { _Pragma(\"omp simd\") for (int64_t i = 0; i < n; ++i) { double x = in0[i]; out0[i] = 0.5 * x * (1.0 + kiln_erf(x * 0.7071067811865476)); } }");
  add("mix_float", "extern \"C\" void k_mix_float(const float* __restrict a, const uint16_t* __restrict b, uint16_t* __restrict o, int64_t n) { _Pragma(\"omp simd\") for (int64_t i = 0; i < n; ++i) { float x = a[i], y = kiln_bf16_to_f32(b[i]); o[i] = kiln_f32_to_bf16(kiln_max(kiln_tanh(x) * kiln_log(kiln_abs(y) + 1.f), kiln_pow(kiln_sin(x), 2.f)) + kiln_exp(-x * x)); } }");
  add("sum_exp_float", "extern \"C\" float k_sum_exp_float(const float* __restrict a, int64_t n) { float s = 0; _Pragma(\"omp simd reduction(+:s)\") for (int64_t i = 0; i < n; ++i) s += kiln_exp(a[i] - 1.f); return s; }");
  return s;
}

template <class T>
Fns<T> jit_fns(void* so) {
  const char* t = sizeof(T) == 4 ? "float" : "double";
  auto u = [&](const char* f) -> Unary<T> {
    auto* p = reinterpret_cast<void (*)(const T*, T*, int64_t)>(dlsym(so, (std::string("k_") + f + "_" + t).c_str()));
    REQUIRE((p != nullptr));
    return p;
  };
  auto b = [&](const char* f) -> Binary<T> {
    auto* p = reinterpret_cast<void (*)(const T*, const T*, T*, int64_t)>(dlsym(so, (std::string("k_") + f + "_" + t).c_str()));
    REQUIRE((p != nullptr));
    return p;
  };
  return {u("exp"), u("exp2"), u("log"), u("log2"), u("sqrt"), u("rsqrt"), u("recip"), u("sin"), u("cos"), u("tanh"),
          u("erf"), u("floor"), u("sign"), u("abs"), b("pow"), b("max"), b("min")};
}

}  // namespace

TEST_CASE("cpu_math: under the JIT's flags every loop vectorises and stays accurate") {
  int rc = 0;
  sh("g++ --version > /dev/null 2>&1", &rc);
  if (rc != 0) {
    MESSAGE("skipped: no g++ on PATH");
    return;
  }
  std::string here = __FILE__;
  std::string include = here.substr(0, here.rfind("tests/codegen/")) + "include";
  if (char* abs = realpath(include.c_str(), nullptr)) include = abs, std::free(abs);
  if (!std::ifstream(include + "/kiln/codegen/device/cpu_math.hpp")) {
    MESSAGE("skipped: kiln's include/ is not beside " << here);
    return;
  }
  char dir_tmpl[] = "/tmp/kiln_cpu_math_XXXXXX";
  REQUIRE(mkdtemp(dir_tmpl) != nullptr);
  std::string dir = dir_tmpl;
  std::vector<std::string> names;
  std::ofstream(dir + "/k.cpp") << jit_source(names);
  // NOTE: the flags of jit/host_compiler.hpp (kHostCxxFlags), spelled out so that this
  // test stands apart from the JIT; -Werror keeps the prelude free of warnings.
  std::string cmd = "cd " + dir + " && g++ -O3 -march=native -fPIC -shared -fopenmp -std=c++17 -fno-math-errno "
                    "-ffp-contract=fast -Wall -Wextra -Werror -I" + include + " k.cpp -o k.so -fopt-info-vec-optimized 2>&1";
  std::string log = sh(cmd, &rc);
  INFO(log);
  REQUIRE(rc == 0);
  for (size_t line = 2; line < names.size(); ++line) {
    INFO(names[line] << " (k.cpp line " << line << ") did not vectorise");
    CHECK(log.find("k.cpp:" + std::to_string(line) + ":", 0) != std::string::npos);
  }
  void* so = dlopen((dir + "/k.so").c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE(so != nullptr);
  if (report()) std::printf("cpu_math under the JIT's flags (vectorised):\n");
  const bool fused = __builtin_cpu_supports("fma");
  check_all<float>(jit_fns<float>(so), fused);
  check_all<double>(jit_fns<double>(so), fused);
  check_pow_special<float>(jit_fns<float>(so));
  check_pow_special<double>(jit_fns<double>(so));
  check_zero_signs<float>(jit_fns<float>(so));
  check_zero_signs<double>(jit_fns<double>(so));
  // the 16-bit conversions, vectorised, against the scalar ones (checked above)
  {
    auto* to32 = reinterpret_cast<void (*)(const uint16_t*, float*, int64_t)>(dlsym(so, "k_f16_to_f32"));
    auto* to16 = reinterpret_cast<void (*)(const float*, uint16_t*, int64_t)>(dlsym(so, "k_f32_to_f16"));
    auto* bto32 = reinterpret_cast<void (*)(const uint16_t*, float*, int64_t)>(dlsym(so, "k_bf16_to_f32"));
    auto* bto16 = reinterpret_cast<void (*)(const float*, uint16_t*, int64_t)>(dlsym(so, "k_f32_to_bf16"));
    REQUIRE((to32 && to16 && bto32 && bto16));
    std::vector<uint16_t> h(65536), h2(65536), hb(65536);
    for (size_t i = 0; i < h.size(); ++i) h[i] = uint16_t(i);
    std::vector<float> f(65536), fb(65536);
    to32(h.data(), f.data(), 65536);
    to16(f.data(), h2.data(), 65536);
    bto32(h.data(), fb.data(), 65536);
    bto16(fb.data(), hb.data(), 65536);
    CHECK(h2 == h);
    CHECK(hb == h);
    std::vector<float> xs = bits(0.f, std::numeric_limits<float>::max(), true, 1 << 20);
    std::vector<uint16_t> a(xs.size()), b(xs.size());
    to16(xs.data(), a.data(), int64_t(xs.size()));
    bto16(xs.data(), b.data(), int64_t(xs.size()));
    int64_t bad = 0;
    for (size_t i = 0; i < xs.size(); ++i) bad += a[i] != kiln_f32_to_f16(xs[i]) || b[i] != kiln_f32_to_bf16(xs[i]);
    CHECK(bad == 0);
  }
  dlclose(so);
  std::remove((dir + "/k.cpp").c_str());
  std::remove((dir + "/k.so").c_str());
  std::remove(dir.c_str());
}
