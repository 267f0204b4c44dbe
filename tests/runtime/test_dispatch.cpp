// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The cache-hit path of a compiled call (runtime/eval.hpp's per-type plan slot, the
// tracer's dedup): a second call builds no plan and compiles nothing; new sizes reuse
// the plan and stay correct; the same expression type traced to another graph (its
// tensors alias, a dim becomes 1) gets its own plan and the right numbers, and the first
// graph still works after it. On the default device (gpu-foundation: the GPU).
#include "../support/reference.hpp"

using namespace kiln;
using namespace kiln::test;

TEST_CASE("a compiled call's second run builds no plan and compiles nothing; new sizes reuse the plan") {
  KILN_TEST_RNG(rng);
  auto f = compile([](const Tensor<f32, 2>& a, const Tensor<f32, 2>& b) { return exp(a) * 2.0f + b; });
  auto want = [](const Array& a, const Array& b) { return ref::zip(a, b, [](double x, double y) { return std::exp(x) * 2 + y; }); };
  auto x = input<f32, 2>(rng, Shape<2>{37, 129}), y = input<f32, 2>(rng, Shape<2>{37, 129});
  check_close(f(x.t, y.t), want(x.a, y.a), "first call");
  auto c0 = counters();
  Tensor<f32, 2> again = f(x.t, y.t);
  auto c1 = counters();
  CHECK(c1.plans_built == c0.plans_built);
  CHECK(c1.compiles == c0.compiles);
  CHECK(c1.disk_hits == c0.disk_hits);
  CHECK(c1.kernels_launched == c0.kernels_launched + 1);
  check_close(again, want(x.a, y.a), "second call");
  for (Shape<2> s : {Shape<2>{3, 5}, Shape<2>{1000, 7}, Shape<2>{2, 4099}}) {
    auto u = input<f32, 2>(rng, s), v = input<f32, 2>(rng, s);
    check_close(f(u.t, v.t), want(u.a, v.a), "new size " + str(dims(s)));
  }
  CHECK(counters().plans_built == c0.plans_built);
}

TEST_CASE("one expression type, several graphs: aliasing and size-1 dims get their own plans") {
  KILN_TEST_RNG(rng);
  auto f = compile([](const Tensor<f32, 2>& a, const Tensor<f32, 2>& b) { return a * 3.0f - b + sum(a * b, 1, keepdim); });
  auto want = [](const Array& a, const Array& b) {
    Array s = ref::sum(ref::zip(a, b, [](double x, double y) { return x * y; }), {1}, true);
    Array out = a;
    for_each_index(a.shape, [&](const Dims& i, int64_t lin) { out.v[size_t(lin)] = a.at(i) * 3 - b.at(i) + s.bcast(i); });
    return out;
  };
  // The magnitudes the result went through (|3a| + |b| + the row's sum of |a*b|): the sum's
  // rounding is relative to them, not to the (cancelling) result.
  auto scale = [](const Array& a, const Array& b) {
    Array s = ref::sum(ref::zip(a, b, [](double x, double y) { return std::fabs(x * y); }), {1}, true);
    Array out = a;
    for_each_index(a.shape, [&](const Dims& i, int64_t lin) {
      out.v[size_t(lin)] = std::fabs(a.at(i) * 3) + std::fabs(b.at(i)) + s.bcast(i);
    });
    return out;
  };
  auto x = input<f32, 2>(rng, Shape<2>{9, 33}), y = input<f32, 2>(rng, Shape<2>{9, 33});
  auto one = input<f32, 2>(rng, Shape<2>{1, 33}), one_b = input<f32, 2>(rng, Shape<2>{1, 33});
  auto check = [&](const Input<f32, 2>& a, const Input<f32, 2>& b, const std::string& what) {
    Array sc = scale(a.a, b.a);
    check_close(f(a.t, b.t), want(a.a, b.a), tol<f32>(), what, &sc);
  };
  for (int round = 0; round < 2; ++round) {
    CAPTURE(round);
    check(x, y, "two tensors");
    check(x, x, "one tensor twice");
    check(one, one_b, "a size-1 dim");
  }
}

TEST_CASE("the profiler times every kernel launched while it is on, by plan, kernel and variant") {
  KILN_TEST_RNG(rng);
  auto x = input<f32, 2>(rng, {33, 40}), w = input<f32, 2>(rng, {40, 17});
  auto y = kiln::softmax(kiln::matmul(x.t, w.t), -1);  // a matmul kernel, then a rows kernel
  Tensor<f32, 2> warm = y;                             // compiled outside the profile
  bool was = profiling();
  set_profiling(true);
  profile_reset();
  size_t kernels = kernel_count(Mode::fused, y);
  Counters before = counters();
  for (int i = 0; i < 3; ++i) Tensor<f32, 2> out = y;
  set_profiling(false);
  Tensor<f32, 2> unprofiled = y;  // not counted
  set_profiling(was);
  std::vector<KernelProfile> got = profile();
  REQUIRE(got.size() == kernels);
  int64_t calls = 0;
  for (const KernelProfile& p : got) {
    CAPTURE(p.kernel);
    CHECK(p.calls == 3);
    CHECK(p.total_ms > 0);
    CHECK(p.kernel.find("[plan ") == 0);
    calls += p.calls;
  }
  CHECK(uint64_t(calls) == counters().kernels_launched - before.kernels_launched - kernels);
  CHECK(std::any_of(got.begin(), got.end(), [](const KernelProfile& p) { return p.kernel.find("matmul over [33, 17]") != std::string::npos; }));
  CHECK(std::is_sorted(got.begin(), got.end(), [](const KernelProfile& a, const KernelProfile& b) { return a.total_ms > b.total_ms; }));
  std::string report = profile_report();
  CHECK(report.find("matmul over [33, 17]") != std::string::npos);
  MESSAGE(report);
  profile_reset();
  CHECK(profile().empty());
}
