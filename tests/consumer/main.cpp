// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Built against an installed kiln (find_package): one fused expression, evaluated on
// assignment, checked element by element against a plain loop. Exit 0 iff all match.
// Built twice: header-only (kiln::kiln), and with the engine compiled once (kiln::engine)
// together with second.cpp, another file of the same program that includes kiln.
#include <kiln/kiln.hpp>

#include <cmath>
#include <cstdio>

#ifdef KILN_CONSUMER_TWO_FILES
int second_file_mismatches(uint64_t launches_before);
#endif

int main() {
  using T = kiln::Tensor<kiln::f32, 2>;
  const float in[2][3] = {{1, 2, 3}, {-4, 0.5f, -0.25f}};
  T x = T::from({{1, 2, 3}, {-4, 0.5f, -0.25f}});
  T y = kiln::exp(x) * 2.0f + x;  // one kernel: exp, mul, add fused

  int bad = 0;
  for (int i = 0; i < 2; ++i) {
    for (int j = 0; j < 3; ++j) {
      double want = 2.0 * std::exp(static_cast<double>(in[i][j])) + in[i][j];
      double got = y(i, j);
      if (std::fabs(got - want) > 1e-5 * (1.0 + std::fabs(want))) {
        std::printf("y(%d, %d) = %.9g, want %.9g\n", i, j, got, want);
        ++bad;
      }
    }
  }
#ifdef KILN_CONSUMER_TWO_FILES
  bad += second_file_mismatches(kiln::counters().kernels_launched);
#endif
  std::printf("kiln consumer: %s\n", bad == 0 ? "ok" : "MISMATCH");
  return bad == 0 ? 0 : 1;
}
