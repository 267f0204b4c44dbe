// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Matmul epilogues: the pointwise consumers of a matmul over its output shape (bias
// with broadcasting, activation, residual, scale, cast; several outputs) run in the
// matmul's kernel, per element at store time. Asserted by counting kernels and
// launches, and by numbers against the float64 reference (odd sizes, batched,
// transposed and strided operands and epilogue inputs, K = 0, every numeric dtype),
// fused and eager. Consumers that must not join (a reduction of the matmul, a
// transposed view of it, one that would make the kernel graph cyclic) stay
// separate and correct.
#include <numbers>

#include "../support/reference.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {

template <class DT>
Values mm_values() {
  return FloatDType<DT> ? Values{-2, 2} : Values{-20, 20};
}

// |x| + |y| elementwise (with broadcasting): the magnitude a sum of two terms went through.
Array abs_sum(const Array& x, const Array& y) {
  return ref::zip(x, y, [](double p, double q) { return std::fabs(p) + std::fabs(q); });
}

}  // namespace

TEST_CASE("epilogue: gelu(x @ W1 + b1) is one kernel and one launch; the matmul itself is not stored") {
  KILN_TEST_RNG(rng);
  auto x = input<f32, 2>(rng, {37, 19}), w = input<f32, 2>(rng, {19, 300}, Layout::transposed);
  auto b = input<f32, 1>(rng, {300});
  auto y = kiln::gelu(kiln::matmul(x.t, w.t) + b.t);
  CHECK(kernel_count(Mode::fused, y) == 1);
  std::string plan = explain(Mode::fused, y);
  CHECK(occurrences(plan, ":matmul") == 0);  // only gelu's output leaves the kernel
  Counters before = counters();
  Tensor<f32, 2> out = y;
  CHECK(counters().kernels_launched - before.kernels_launched == 1);
  Array scale;
  Array pre = ref::zip(ref::matmul(x.a, w.a, &scale), b.a, [](double p, double q) { return p + q; });
  Array bound = abs_sum(scale, b.a);
  check_close(out, ref::map(pre, ref::gelu), tol<f32>().scaled(2), "gelu(x @ W1 + b1)", &bound);

  // training keeps the pre-activation too: still one kernel, two stores
  auto z = kiln::matmul(x.t, w.t) + b.t;
  CHECK(kernel_count(Mode::fused, z, kiln::gelu(z)) == 1);
  auto [zo, go] = kiln::eval(z, kiln::gelu(z));
  check_close(zo, pre, tol<f32>().scaled(2), "pre-activation", &bound);
  check_close(go, ref::map(pre, ref::gelu), tol<f32>().scaled(2), "gelu(pre-activation)", &bound);
  MESSAGE("plan of gelu(x @ W1 + b1):\n" << plan);
}

TEST_CASE("epilogue fusion switched off: the consumers are kernels of their own, the same numbers; on again, one kernel") {
  KILN_TEST_RNG(rng);
  auto x = input<f32, 2>(rng, {37, 19}), w = input<f32, 2>(rng, {19, 300});
  auto b = input<f32, 1>(rng, {300});
  auto y = kiln::gelu(kiln::matmul(x.t, w.t) + b.t);
  Array scale;
  Array pre = ref::zip(ref::matmul(x.a, w.a, &scale), b.a, [](double p, double q) { return p + q; });
  Array bound = abs_sum(scale, b.a);
  struct Restore {
    ~Restore() { set_epilogue_fusion(true); }
  } restore;
  for (bool on : {true, false, true}) {
    CAPTURE(on);
    set_epilogue_fusion(on);
    CHECK(epilogue_fusion() == on);
    std::string plan = explain(Mode::fused, y);
    CHECK(kernel_count(Mode::fused, y) == (on ? 1u : 2u));
    CHECK(occurrences(plan, ":matmul") == (on ? 0 : 1));  // apart, the GEMM stores x @ W1 for gelu's kernel
    Counters before = counters();
    Tensor<f32, 2> out = y;
    CHECK(counters().kernels_launched - before.kernels_launched == (on ? 1u : 2u));
    check_close(out, ref::map(pre, ref::gelu), tol<f32>().scaled(2), "gelu(x @ W1 + b1)", &bound);
    // a training step apart: its backward's gelu' is a kernel too, and the gradients agree
    auto loss = kiln::sum(y * y);
    auto [gw] = kiln::grad(loss, w.t);
    Tensor<f32, 2> g = gw;
    Array dpre = ref::zip(ref::map(pre, ref::gelu), pre, [](double h, double p) {
      double d = 0.5 * (1 + std::erf(p / std::sqrt(2.0))) + p * std::exp(-p * p / 2) / std::sqrt(2 * std::numbers::pi);
      return 2 * h * d;
    });
    // the magnitude: |x|^T (|dpre| + pre's own error, scaled by how fast gelu' moves)
    Array mag = ref::zip3(dpre, bound, pre, [](double d, double s, double p) { return std::fabs(d) + 0.1 * s * (1 + std::fabs(p)); });
    Array xabs = ref::map(ref::transpose(x.a, 0, 1), [](double v) { return std::fabs(v); });
    Array gref = ref::matmul(ref::transpose(x.a, 0, 1), dpre), gbound = ref::matmul(xabs, mag);
    check_close(g, gref, tol<f32>().scaled(8), "d sum(gelu(x @ W1 + b1)^2) / dW1", &gbound);
  }
}

TEST_CASE_TEMPLATE("epilogue shapes against the float64 reference, fused and eager", DT, f32, f64, f16, bf16, i32, i64) {
  KILN_TEST_RNG(rng);
  constexpr bool kFloat = FloatDType<DT>;
  Values v = mm_values<DT>();
  auto act = [](const auto& e) {
    if constexpr (kFloat) return kiln::gelu(e);
    else return kiln::relu(e);
  };
  auto act_ref = [](double p) { return kFloat ? ref::gelu(p) : std::max(p, 0.0); };
  const double k = kFloat ? 0.5 : 2;  // a scale that is exact in every dtype
  Tol t = tol<DT>().scaled(2);
  Batch batch;  // one plan per mode: every case below is an output of it

  // bias over N, then the activation; the pre-activation is an output too
  auto x = input<DT, 2>(rng, {37, 19}, Layout::contiguous, v), w = input<DT, 2>(rng, {19, 300}, Layout::contiguous, v);
  auto b = input<DT, 1>(rng, {300}, Layout::contiguous, v);
  Array s1;
  Array pre = ref::as(DT::id, ref::zip(ref::matmul(x.a, w.a, &s1), b.a, [](double p, double q) { return p + q; }));
  auto z = kiln::matmul(x.t, w.t) + b.t;
  batch.check(z, pre, t, "x @ w + b", abs_sum(s1, b.a));
  batch.check(act(z), ref::as(DT::id, ref::map(pre, act_ref)), t, "act(x @ w + b)", ref::map(abs_sum(s1, b.a), [](double s) { return 1.2 * s; }));

  // transposed operands, a scale and a strided residual
  auto xt = input<DT, 2>(rng, {37, 19}, Layout::transposed, v), wt = input<DT, 2>(rng, {19, 300}, Layout::transposed, v);
  auto r = input<DT, 2>(rng, {37, 300}, Layout::strided, v);
  Array s2;
  Array mm2 = ref::matmul(xt.a, wt.a, &s2);
  batch.check(kiln::matmul(xt.t, wt.t) * k + r.t, ref::as(DT::id, ref::zip(mm2, r.a, [&](double p, double q) { return p * k + q; })), t,
              "transposed @ transposed * k + strided residual", abs_sum(ref::map(s2, [&](double s) { return s * k; }), r.a));

  // batched, the batch broadcast, a bias along M (a column), then relu
  auto x3 = input<DT, 3>(rng, {3, 37, 19}, Layout::contiguous, v);
  auto w2 = input<DT, 2>(rng, {19, 30}, Layout::transposed, v);
  auto bm = input<DT, 2>(rng, {37, 1}, Layout::contiguous, v);
  Array s3;
  Array mm3 = ref::zip(ref::matmul(x3.a, w2.a, &s3), bm.a, [](double p, double q) { return p + q; });
  batch.check(kiln::relu(kiln::matmul(x3.t, w2.t) + bm.t), ref::as(DT::id, ref::map(mm3, [](double p) { return std::max(p, 0.0); })), t,
              "relu([3, 37, 19] @ [19, 30] + bias[37, 1])", abs_sum(s3, bm.a));

  // batched on both sides with a per-batch bias [3, 1, 30]
  auto y3 = input<DT, 3>(rng, {3, 19, 30}, Layout::contiguous, v);
  auto b3 = input<DT, 3>(rng, {3, 1, 30}, Layout::contiguous, v);
  Array s4;
  Array mm4 = ref::matmul(x3.a, y3.a, &s4);
  batch.check(kiln::matmul(x3.t, y3.t) + b3.t, ref::as(DT::id, ref::zip(mm4, b3.a, [](double p, double q) { return p + q; })), t,
              "[3, 37, 19] @ [3, 19, 30] + bias[3, 1, 30]", abs_sum(s4, b3.a));

  // a cast to another dtype in the epilogue
  using To = std::conditional_t<std::is_same_v<DT, f32>, bf16, f32>;
  Tol tc{std::max(t.rtol, tol<To>().rtol * 2), std::max(t.atol, tol<To>().atol * 2)};
  batch.check(kiln::cast<To>(kiln::matmul(x.t, w.t)), ref::as(To::id, ref::matmul(x.a, w.a)), tc, "cast(x @ w)", s1);

  // K = 0: the matmul is zeros, the epilogue still runs
  auto e0 = input<DT, 2>(rng, {5, 0}, Layout::contiguous, v), e1 = input<DT, 2>(rng, {0, 7}, Layout::contiguous, v);
  auto be = input<DT, 1>(rng, {7}, Layout::contiguous, v);
  batch.check(kiln::matmul(e0.t, e1.t) + be.t, ref::as(DT::id, ref::zip(Array(Dims{5, 7}, 0.0), be.a, [](double p, double q) { return p + q; })),
              t, "[5, 0] @ [0, 7] + b (K = 0)");

  batch.run(Mode::fused);
  // eager (one kernel per primitive) as a cross-check; the other dtypes' plain matmul is in test_matmul
  if (std::is_same_v<DT, f32> || std::is_same_v<DT, bf16>) batch.run(Mode::eager);
}

TEST_CASE("epilogue: fused and eager agree bit for bit in f32; the epilogue counts as fewer kernels") {
  KILN_TEST_RNG(rng);
  auto x = input<f32, 3>(rng, {2, 33, 17}, Layout::transposed);
  auto w = input<f32, 2>(rng, {17, 45});
  auto b = input<f32, 1>(rng, {45});
  auto e = kiln::relu(kiln::matmul(x.t, w.t) + b.t);
  CHECK(kernel_count(Mode::fused, e) == 1);
  CHECK(kernel_count(Mode::eager, e) == 3);
  auto fused = kiln::evaluate(Mode::fused, e), eager = kiln::evaluate(Mode::eager, e);
  CHECK(fused.to_vector() == eager.to_vector());  // the same float operations in the same order
}

TEST_CASE("epilogue: consumers that must not join the matmul stay separate and correct") {
  KILN_TEST_RNG(rng);
  auto x = input<f32, 2>(rng, {29, 13}), w = input<f32, 2>(rng, {13, 29}), v = input<f32, 2>(rng, {29, 11});
  auto y = kiln::matmul(x.t, w.t);
  Array sc;
  Array ya = ref::matmul(x.a, w.a, &sc);
  Tol t = tol<f32>().scaled(4);

  SUBCASE("a reduction of the matmul reads its stored output; relu still joins") {
    auto r = kiln::relu(y);
    auto s = kiln::sum(y, 1);
    CHECK(kernel_count(Mode::fused, r, s) == 2);
    CHECK(occurrences(explain(Mode::fused, r, s), ":matmul") == 1);  // the matmul is stored for the sum
    auto [ro, so] = kiln::eval(r, s);
    check_close(ro, ref::map(ya, [](double p) { return std::max(p, 0.0); }), t, "relu(y)", &sc);
    Array bound = ref::sum(sc, {1});
    check_close(so, ref::sum(ya, {1}), t, "sum(y, 1)", &bound);
  }
  SUBCASE("a transposed view of the matmul: another element, not yet written") {
    auto e = y + kiln::transpose(y, 0, 1);
    CHECK(kernel_count(Mode::fused, e) == 2);
    Tensor<f32, 2> out = e;
    Array bound = ref::zip(sc, ref::transpose(sc, 0, 1), [](double p, double q) { return p + q; });
    check_close(out, ref::zip(ya, ref::transpose(ya, 0, 1), [](double p, double q) { return p + q; }), t, "y + y^T", &bound);
  }
  SUBCASE("joining would make the kernel graph cyclic: y + sum(y @ v)") {
    auto s = kiln::sum(kiln::matmul(y, v.t), 1, keepdim);  // depends on y's kernel
    auto e = y + s;
    CHECK(kernel_count(Mode::fused, e) == 4);  // y, y @ v, the sum, the add
    Tensor<f32, 2> out = e;
    Array s2;
    Array yv = ref::matmul(ya, v.a, &s2);
    Array want = ref::zip(ya, ref::sum(yv, {1}, true), [](double p, double q) { return p + q; });
    // y's own error goes through y @ v: bound it by sum |y||v| with |y| <= sc
    Array bound = ref::zip(sc, ref::sum(ref::matmul(sc, ref::map(v.a, [](double q) { return std::fabs(q); })), {1}, true),
                           [](double p, double q) { return p + q; });
    check_close(out, want, t, "y + sum(y @ v, 1)", &bound);
  }
}
