// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The second file of the consumer built with kiln::engine: another file that includes
// kiln, evaluating through the same engine (its counters count this file's launches
// after main.cpp's).
#include <kiln/kiln.hpp>

#include <cmath>
#include <cstdio>

int second_file_mismatches(uint64_t launches_before) {
  if (launches_before == 0) {
    std::printf("second file: main.cpp's launch was not counted\n");
    return 1;
  }
  auto x = kiln::Tensor<kiln::f32, 1>::from({0.5f, -1.5f, 2.0f, 3.25f});
  kiln::Tensor<kiln::f32, 0> s = kiln::sum(x * x);  // one rows kernel
  const double want = 0.25 + 2.25 + 4.0 + 10.5625;
  int bad = 0;
  if (std::fabs(double(s()) - want) > 1e-5 * want) std::printf("second file: sum(x * x) = %.9g, want %.9g\n", double(s()), want), ++bad;
  if (kiln::counters().kernels_launched != launches_before + 1)
    std::printf("second file: %llu launches, want %llu\n", (unsigned long long)kiln::counters().kernels_launched,
                (unsigned long long)(launches_before + 1)), ++bad;
  return bad;
}
