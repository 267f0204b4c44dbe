// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Times the CPU math prelude (codegen/device/cpu_math.hpp) against libm in the loops
// the CPU backend generates: y = gelu(x) (erf form) and y = exp(x) over 2^22 floats,
// one thread (`omp simd`) and all threads (`omp parallel for simd`), beside a copy that
// marks the memory ceiling. Prints ns/element and GB/s (4 B read + 4 B written each).
// Build with the JIT's flags and run:
//   g++ -O3 -march=native -fopenmp -std=c++17 -fno-math-errno -ffp-contract=fast \
//       -Iinclude bench/cpu_math_bench.cpp -o /tmp/cpu_math_bench && /tmp/cpu_math_bench
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "kiln/codegen/device/cpu_math.hpp"

namespace {

constexpr int64_t kN = int64_t(1) << 22;
constexpr int kReps = 21;

// NOTE: noinline keeps each loop a function of its own, as in a generated kernel.
#define KILN_BENCH_LOOP(name, par, expr)                                                   \
  __attribute__((noinline)) void name(const float* __restrict in, float* __restrict out) { \
    _Pragma(par) for (int64_t i = 0; i < kN; ++i) {                                         \
      float x = in[i];                                                                       \
      out[i] = (expr);                                                                       \
    }                                                                                        \
  }
KILN_BENCH_LOOP(copy_1t, "omp simd", x)
KILN_BENCH_LOOP(gelu_std_1t, "omp simd", 0.5f * x * (1.f + std::erf(x * 0.70710678f)))
KILN_BENCH_LOOP(gelu_kiln_1t, "omp simd", 0.5f * x * (1.f + kiln_erf(x * 0.70710678f)))
KILN_BENCH_LOOP(exp_std_1t, "omp simd", std::exp(x))
KILN_BENCH_LOOP(exp_kiln_1t, "omp simd", kiln_exp(x))
KILN_BENCH_LOOP(tanh_kiln_1t, "omp simd", kiln_tanh(x))
KILN_BENCH_LOOP(log_kiln_1t, "omp simd", kiln_log(x))
KILN_BENCH_LOOP(sin_kiln_1t, "omp simd", kiln_sin(x))
KILN_BENCH_LOOP(copy_mt, "omp parallel for simd schedule(static)", x)
KILN_BENCH_LOOP(gelu_std_mt, "omp parallel for simd schedule(static)", 0.5f * x * (1.f + std::erf(x * 0.70710678f)))
KILN_BENCH_LOOP(gelu_kiln_mt, "omp parallel for simd schedule(static)", 0.5f * x * (1.f + kiln_erf(x * 0.70710678f)))
KILN_BENCH_LOOP(exp_std_mt, "omp parallel for simd schedule(static)", std::exp(x))
KILN_BENCH_LOOP(exp_kiln_mt, "omp parallel for simd schedule(static)", kiln_exp(x))
#undef KILN_BENCH_LOOP

double median_seconds(void (*f)(const float*, float*), const float* in, float* out) {
  f(in, out);  // warm-up: page faults, thread pool
  std::vector<double> t;
  for (int r = 0; r < kReps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    f(in, out);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + kReps / 2, t.end());
  return t[kReps / 2];
}

}  // namespace

int main() {
  std::vector<float> in(kN), out(kN), ref(kN);
  std::mt19937 g(1);
  std::uniform_real_distribution<float> d(-6.f, 6.f);
  for (float& v : in) v = d(g);

  struct Row {
    const char* name;
    void (*f)(const float*, float*);
    void (*ref)(const float*, float*);  // the libm loop it should agree with, if any
  } rows[] = {
      {"copy           1 thread", copy_1t, nullptr},      {"gelu std::erf  1 thread", gelu_std_1t, nullptr},
      {"gelu kiln_erf  1 thread", gelu_kiln_1t, gelu_std_1t}, {"exp  std::exp  1 thread", exp_std_1t, nullptr},
      {"exp  kiln_exp  1 thread", exp_kiln_1t, exp_std_1t},   {"tanh kiln_tanh 1 thread", tanh_kiln_1t, nullptr},
      {"log  kiln_log  1 thread", log_kiln_1t, nullptr},      {"sin  kiln_sin  1 thread", sin_kiln_1t, nullptr},
      {"copy           all threads", copy_mt, nullptr},     {"gelu std::erf  all threads", gelu_std_mt, nullptr},
      {"gelu kiln_erf  all threads", gelu_kiln_mt, gelu_std_mt}, {"exp  std::exp  all threads", exp_std_mt, nullptr},
      {"exp  kiln_exp  all threads", exp_kiln_mt, exp_std_mt},
  };
  std::printf("cpu_math bench: n = 2^22 floats, median of %d, %d OpenMP threads\n", kReps, omp_get_max_threads());
  // vs libm: the largest |difference| relative to max(|libm's value|, 1e-3)
  std::printf("%-28s %10s %10s %14s\n", "loop", "ns/elem", "GB/s", "diff vs libm");
  for (const Row& r : rows) {
    double s = median_seconds(r.f, in.data(), out.data());
    double diff = 0;
    if (r.ref) {
      r.ref(in.data(), ref.data());
      for (int64_t i = 0; i < kN; ++i)
        diff = std::max(diff, std::fabs(double(out[i]) - ref[i]) / std::max(std::fabs(double(ref[i])), 1e-3));
    }
    std::printf("%-28s %10.3f %10.2f %14.2e\n", r.name, s * 1e9 / double(kN), 8.0 * double(kN) / s * 1e-9, diff);
  }
  return 0;
}
