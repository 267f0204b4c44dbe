// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Fusion, asserted by counting: W1 (gelu(x*a+b) * sigmoid(x)) is one kernel; softmax,
// log_softmax, layer_norm, rms_norm and var_mean are at most two; a subexpression used
// twice is computed once (the trace's hash-consing); outputs of one shape share a
// kernel; a compiled function called at ten sizes compiles once (kiln::counters());
// eager and fused modes give the same numbers within dtype tolerance, and both match
// the float64 reference.
#include <algorithm>

#include "../support/reference.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {

Array w1_ref(const Array& x, const Array& a, const Array& b) {
  Array z = ref::zip3(x, a, b, [](double p, double q, double r) { return p * q + r; });
  return ref::zip(z, x, [](double v, double p) { return ref::gelu(v) * ref::sigmoid(p); });
}

}  // namespace

// The nvrtc-kernels and hiprtc-kernels entries run this file with KILN_PRECOMPILE: its hook
// (runtime/precompile.hpp, registered by the engine's file) must be in place, or those
// entries would pass while compiling no GPU kernel.
TEST_CASE("with KILN_PRECOMPILE, every CPU plan compile also compiles the plan for GPU targets") {
  const char* targets = std::getenv("KILN_PRECOMPILE");
  INFO("KILN_PRECOMPILE=", targets ? targets : "(unset)");
  CHECK((runtime::cpu_compile_hook() != nullptr) == (targets && *targets));
}

TEST_CASE("W1: y = gelu(x*a+b) * sigmoid(x) is one kernel, one launch") {
  KILN_TEST_RNG(rng);
  auto x = input<f32, 1>(rng, {100003}), a = input<f32, 1>(rng, {100003}), b = input<f32, 1>(rng, {100003});
  auto y = kiln::gelu(x.t * a.t + b.t) * kiln::sigmoid(x.t);
  CHECK(kernel_count(Mode::fused, y) == 1);
  CHECK(kernel_count(Mode::eager, y) > 10);  // one per primitive
  Counters before = counters();
  Tensor<f32, 1> out = y;
  CHECK(counters().kernels_launched - before.kernels_launched == 1);
  check_close(out, w1_ref(x.a, a.a, b.a), {2e-5, 1e-6}, "W1");
}

TEST_CASE("row composites fuse: softmax, log_softmax, layer_norm, rms_norm, var_mean in at most two kernels") {
  KILN_TEST_RNG(rng);
  auto x = input<f32, 2>(rng, {37, 129});
  auto w = input<f32, 1>(rng, {129}), b = input<f32, 1>(rng, {129});
  auto [v, m] = kiln::var_mean(x.t, 1);
  CHECK(kernel_count(Mode::fused, kiln::softmax(x.t, -1)) <= 2);
  CHECK(kernel_count(Mode::fused, kiln::softmax(x.t, 0)) <= 2);
  CHECK(kernel_count(Mode::fused, kiln::log_softmax(x.t, -1)) <= 2);
  CHECK(kernel_count(Mode::fused, kiln::layer_norm(x.t, w.t, b.t)) <= 2);
  CHECK(kernel_count(Mode::fused, kiln::rms_norm(x.t, w.t)) <= 2);
  CHECK(kernel_count(Mode::fused, v, m) <= 2);
  // and gelu before a softmax fuses into it
  CHECK(kernel_count(Mode::fused, kiln::softmax(kiln::gelu(x.t * 2.0f + 1.0f), -1)) <= 2);
  // reductions of one operand over the same axes share a kernel
  CHECK(kernel_count(Mode::fused, kiln::sum(x.t, 1), kiln::amax(x.t, 1), kiln::amin(x.t, 1)) == 1);
  // pointwise outputs of one shape share a kernel
  CHECK(kernel_count(Mode::fused, x.t + 1, kiln::exp(x.t), x.t * w.t) == 1);
}

// A reduction's rank-dropping form is a reshape of its keepdim value; a pointwise op after a
// reshape of a computed value runs on that value (ir::Tracer::sink_reshape), and a reshape of a
// reshape is one reshape, none where it restores the shape (collapse_reshapes): each of these
// joins the kernel that computes the value.
TEST_CASE("a mean loss, and a pointwise op after a reduction that drops its dims (or drops and restores them) or after a reshape, are one kernel") {
  KILN_TEST_RNG(rng);
  for (Shape<2> shape : {Shape<2>{37, 129}, Shape<2>{1, 5}, Shape<2>{64, 1}, Shape<2>{1, 1}})
  for (Layout layout : {Layout::contiguous, Layout::transposed, Layout::strided}) {
    auto x = input<f32, 2>(rng, shape, layout), y = input<f32, 2>(rng, shape);
    CAPTURE(str(dims(shape)));
    CAPTURE(name(layout));
    auto loss = kiln::mean(x.t * x.t);
    auto rows = kiln::sqrt(kiln::sum(x.t * x.t, 1) * 2.0f) - kiln::mean(x.t, 1);
    auto cols = kiln::sum(x.t, 0) * kiln::amax(y.t, 0);
    auto centred = x.t - kiln::unsqueeze(kiln::mean(x.t, 1), 1);  // the dims dropped, then put back
    auto flat = kiln::reshape(x.t * 2.0f, std::array<int64_t, 1>{shape[0] * shape[1]}) + 1.0f;  // a reshape of a kernel's output
    // A reduction over every element of a reshape of a kernel's output: flattened, and turned.
    auto flat_mean = kiln::mean(kiln::reshape(x.t * 2.0f, std::array<int64_t, 1>{shape[0] * shape[1]}));
    auto turned_max = kiln::amax(kiln::reshape(x.t * y.t, std::array<int64_t, 2>{shape[1], shape[0]}));
    CHECK(kernel_count(Mode::fused, flat_mean) == 1);
    CHECK(kernel_count(Mode::fused, turned_max) == 1);
    CHECK(kernel_count(Mode::fused, loss) == 1);
    CHECK(kernel_count(Mode::fused, rows) == 1);
    CHECK(kernel_count(Mode::fused, centred) == 1);
    CHECK(kernel_count(Mode::fused, flat) == 1);
    CHECK(kernel_count(Mode::fused, cols) <= 2);  // two operands: a kernel each at most
    Counters before = counters();
    Tensor<f32, 0> l = loss;
    CHECK(counters().kernels_launched - before.kernels_launched == 1);
    Tensor<f32, 1> r = rows, c = cols;
    Tensor<f32, 2> d = centred;
    Tensor<f32, 1> f = flat;
    check_close(f, ref::map(ref::reshape(x.a, {count(dims(shape))}), [](double p) { return float(p * 2) + 1.0; }), {2e-6, 1e-6},
                "reshape(x * 2, [n]) + 1");
    const double n = double(count(dims(shape)));
    Tensor<f32, 0> fm = flat_mean, tm = turned_max;
    const Array fm_scale = ref::scalar(2 * ref::abs_sum(x.a, {0, 1}).v[0] / n);  // a sum's rounding scales with sum(|terms|)
    check_close(fm, ref::scalar(ref::sum(ref::map(x.a, [](double p) { return double(float(p * 2)); }), {0, 1}).v[0] / n),
                {2e-5, 1e-6}, "mean(reshape(x * 2, [n]))", &fm_scale);
    check_close(tm, ref::amax(ref::reshape(ref::zip(x.a, y.a, [](double p, double q) { return double(float(p * q)); }), {shape[1], shape[0]}), {0, 1}),
                {1e-6, 1e-7}, "amax(reshape(x * y, [cols, rows]))");
    check_close(l, ref::map(ref::sum(ref::zip(x.a, x.a, [](double p, double q) { return p * q; }), {0, 1}),
                            [n](double v) { return v / n; }),
                {2e-5, 1e-6}, "mean(x * x)");
    Array sq = ref::sum(ref::zip(x.a, x.a, [](double p, double q) { return p * q; }), {1});
    Array mean1 = ref::map(ref::sum(x.a, {1}), [&](double v) { return v / double(shape[1]); });
    check_close(r, ref::zip(sq, mean1, [](double s2, double m) { return std::sqrt(2 * s2) - m; }), {2e-5, 1e-5},
                "sqrt(sum(x * x, 1) * 2) - mean(x, 1)");
    check_close(d, ref::zip(x.a, ref::expand(ref::reshape(mean1, {shape[0], 1}), dims(shape)), [](double p, double m) { return p - m; }),
                {2e-5, 1e-5}, "x - unsqueeze(mean(x, 1), 1)");
    check_close(c, ref::zip(ref::sum(x.a, {0}), ref::amax(y.a, {0}), [](double p, double q) { return p * q; }), {2e-5, 1e-5},
                "sum(x, 0) * amax(y, 0)");
  }
}

// A reduction over trailing dims that a reshape of a computed value keeps reduces the value
// (ir::Tracer::reduce_under_reshape), and the pointwise ops around it run on the value too
// (sink_reshape): softmax, layer_norm and a row sum over `reshape(x * 2, [b * t, v])` (the rows
// of a flattened batch, as a loss over a sequence's logits reads them) are one kernel each.
TEST_CASE("softmax, layer_norm and a row sum over the rows of a reshape of a computed value are one kernel each") {
  KILN_TEST_RNG(rng);
  for (Shape<3> shape : {Shape<3>{3, 5, 33}, Shape<3>{1, 4, 7}, Shape<3>{2, 3, 1}, Shape<3>{1, 1, 1}})
  for (Layout layout : {Layout::contiguous, Layout::transposed, Layout::strided}) {
    auto x = input<f32, 3>(rng, shape, layout);
    auto w = input<f32, 1>(rng, Shape<1>{shape[2]}), b = input<f32, 1>(rng, Shape<1>{shape[2]});
    CAPTURE(str(dims(shape)));
    CAPTURE(name(layout));
    const std::array<int64_t, 2> rows{shape[0] * shape[1], shape[2]};
    auto y = kiln::reshape(x.t * 2.0f, rows);
    auto sm = kiln::softmax(y, -1);
    auto ln = kiln::layer_norm(y, w.t, b.t, 1e-5);
    auto s = kiln::sum(y, 1);
    CHECK(kernel_count(Mode::fused, sm) == 1);
    CHECK(kernel_count(Mode::fused, ln) == 1);
    CHECK(kernel_count(Mode::fused, s) == 1);
    Counters before = counters();
    Tensor<f32, 2> got_sm = sm, got_ln = ln;
    Tensor<f32, 1> got_s = s;
    CHECK(counters().kernels_launched - before.kernels_launched == 3);
    Array y_ref = ref::reshape(ref::map(x.a, [](double p) { return double(float(p * 2)); }), {rows[0], rows[1]});
    check_close(got_sm, ref::softmax(y_ref, 1), {1e-5, 1e-7}, "softmax(reshape(x * 2, [b * t, v]), -1)");
    check_close(got_ln, ref::layer_norm(y_ref, w.a, b.a, 1e-5), {1e-4, 1e-4}, "layer_norm(reshape(x * 2, [b * t, v]), w, b)");
    const Array s_scale = ref::abs_sum(y_ref, {1});
    check_close(got_s, ref::sum(y_ref, {1}), {2e-6, 1e-7}, "sum(reshape(x * 2, [b * t, v]), 1)", &s_scale);
  }
  // Reduced dims the reshape does not keep ([b, t * v] from [b, t, v] with t > 1) read the stored product.
  auto x = input<f32, 3>(rng, Shape<3>{3, 5, 7});
  auto merged = kiln::sum(kiln::reshape(x.t * 2.0f, std::array<int64_t, 2>{3, 35}), 1);
  CHECK(kernel_count(Mode::fused, merged) == 2);
  Tensor<f32, 1> got = merged;
  const Array y3 = ref::reshape(ref::map(x.a, [](double p) { return double(float(p * 2)); }), {3, 35});
  const Array scale3 = ref::abs_sum(y3, {1});
  check_close(got, ref::sum(y3, {1}), {2e-6, 1e-7}, "sum(reshape(x * 2, [b, t * v]), 1)", &scale3);
}

TEST_CASE("a subexpression used twice is computed once") {
  KILN_TEST_RNG(rng);
  auto x = input<f32, 2>(rng, {37, 129});
  auto t = kiln::exp(x.t);
  // The type tree holds t three times; the trace is a DAG: exp, mul, add.
  CHECK(kernel_count(Mode::eager, t * t + t) == 3);
  // Equal subtrees built apart are one node too.
  CHECK(kernel_count(Mode::eager, kiln::exp(x.t) * kiln::exp(x.t)) == 2);
  // A reduction shared by two outputs, and by two uses inside softmax, runs once.
  auto s = kiln::sum(x.t, 1, keepdim);
  std::string plan = explain(Mode::fused, x.t / s, x.t - s);
  INFO(plan);
  CHECK(occurrences(plan, "@pass") == 1);
  std::string sm = explain(Mode::fused, kiln::softmax(x.t, 1));
  INFO(sm);
  CHECK(occurrences(sm, "@pass") == 2);  // amax, then sum: each once
  // Launches equal the plan's kernels.
  Counters before = counters();
  auto [p, q] = kiln::eval(x.t / s, x.t - s);
  CHECK(counters().kernels_launched - before.kernels_launched == kernel_count(Mode::fused, x.t / s, x.t - s));
  Array sa = ref::sum(x.a, {1}, true), mag = ref::abs_sum(x.a, {1}, true);
  // The sum's rounding scales with sum(|x|); divided by a sum near zero it is amplified by
  // sum(|x|) / |sum(x)| (a row of normals can sum to 0.004: x / s near 270).
  Array quotient_scale = ref::zip3(x.a, sa, mag, [](double a, double b, double m) { return std::fabs(a / b) * (1 + m / std::fabs(b)); });
  check_close(p, ref::zip(x.a, sa, [](double a, double b) { return a / b; }), {1e-5, 1e-6}, "x / sum(x)", &quotient_scale);
  Array difference_scale = ref::zip(x.a, mag, [](double a, double m) { return std::fabs(a) + m; });
  check_close(q, ref::zip(x.a, sa, [](double a, double b) { return a - b; }), {1e-5, 1e-5}, "x - sum(x)", &difference_scale);
}

TEST_CASE("a compiled function called at ten sizes compiles once") {
  KILN_TEST_RNG(rng);
  auto f = kiln::compile([](const Tensor<f32, 2>& x, const Tensor<f32, 1>& w) {
    return kiln::softmax(kiln::gelu(x) * w, -1);  // sizes are values: one plan for all of them
  });
  // No size-1 dims: a size-1 dim is structure (it broadcasts), so it would be a new plan.
  const Shape<2> sizes[] = {{2, 3}, {5, 7}, {37, 129}, {100, 3}, {3, 100}, {64, 64}, {17, 1000}, {1000, 17}, {2, 2}, {9, 8193}};
  const bool on_cpu = kiln::default_device() == kiln::cpu();
  Counters start = counters();
  size_t launches_per_call = 0;
  for (size_t i = 0; i < std::size(sizes); ++i) {
    Shape<2> s = sizes[i];
    auto x = input<f32, 2>(rng, s);
    auto w = input<f32, 1>(rng, {s[1]});
    Counters before = counters();
    Tensor<f32, 2> y = f(x.t, w.t);
    Counters after = counters();
    uint64_t lookups = (after.compiles - before.compiles) + (after.disk_hits - before.disk_hits) +
                       (after.memory_hits - before.memory_hits);
    INFO("call ", i, " at ", str(dims(s)));
    if (i == 0) {
      CHECK(lookups <= 1);  // compiled, or found on disk / in memory: once
      launches_per_call = after.kernels_launched - before.kernels_launched;
    } else {
      CHECK(after.plans_built == before.plans_built);  // sizes are values: the plan is reused
      // The CPU module serves every size: a hit in the plan itself. A GPU picks a variant per
      // size (vector width, rows strategy), each compiled once (bounded below).
      if (on_cpu) CHECK(lookups == 0);
      CHECK(after.kernels_launched - before.kernels_launched == launches_per_call);
    }
    Array g = ref::zip(ref::map(x.a, [](double v) { return ref::gelu(v); }), w.a, [](double p, double q) { return p * q; });
    check_close(y, ref::softmax(g, 1), {1e-5, 1e-6}, "compiled softmax(gelu(x) * w) at " + str(dims(s)));
  }
  // NOTE: a GPU's variants per size (vector width, rows strategy, block size): 1-7 seen over
  // eight runs of random sizes on an H200.
  CHECK(counters().compiles - start.compiles <= (on_cpu ? 1u : 10u));
}

// ---- eager and fused agree (and both match the reference) ----
namespace {

// Eager mode stores every intermediate in the dtype, so in 16-bit floats its rounding
// compounds: a looser tolerance there.
template <class DT>
Tol eager_tol() {
  return std::is_same_v<DT, bf16> ? Tol{5e-2, 2e-2} : tol<DT>().scaled(10);
}

// Expressions checked in both modes: each against the reference, then eager against fused.
template <class DT>
struct BothModes {
  Batch fused, eager;
  std::vector<std::string> names;
  std::vector<Array> scales;
  // `scale`: per-element magnitudes for the tolerance (a matmul's sum |a||b|), or empty.
  template <class E>
  void add(const E& e, const Array& want, const std::string& what, const Array& scale = {}) {
    fused.check(e, want, tol<DT>().scaled(10), what, scale);
    eager.check(e, want, eager_tol<DT>(), what, scale);
    names.push_back(what), scales.push_back(scale);
    CHECK_MESSAGE(kernel_count(Mode::eager, e) > kernel_count(Mode::fused, e), what);
  }
  void run() {
    std::vector<Array> f = fused.run(Mode::fused), g = eager.run(Mode::eager);
    for (size_t i = 0; i < f.size(); ++i)
      check_close(g[i], f[i], eager_tol<DT>(), names[i] + ": eager against fused", scales[i].v.empty() ? nullptr : &scales[i],
                  dtype_name<DT>());
  }
};

}  // namespace

TEST_CASE_TEMPLATE("eager and fused give the same numbers", DT, f32, f64, bf16) {
  KILN_TEST_RNG(rng);
  auto x = input<DT, 2>(rng, {37, 129}, Layout::transposed), a = input<DT, 2>(rng, {37, 129});
  auto b = input<DT, 1>(rng, {129});
  auto w = input<DT, 1>(rng, {129}, Layout::contiguous, {0.5, 1.5});
  auto m = input<DT, 2>(rng, {129, 20}, Layout::contiguous, {-1, 1});
  BothModes<DT> both;
  both.add(kiln::gelu(x.t * a.t + b.t) * kiln::sigmoid(x.t), w1_ref(x.a, a.a, ref::expand(b.a, {37, 129})), "W1");
  both.add(kiln::softmax(x.t, -1), ref::softmax(x.a, 1), "softmax");
  // layer_norm ends in xhat*w + b: eager rounds xhat*w to bf16 before adding b, so the error scales
  // with |xhat*w| + |b|, not with the (possibly cancelled) result.
  Array x_hat = ref::layer_norm(x.a, ref::map(w.a, [](double) { return 1.0; }), ref::map(b.a, [](double) { return 0.0; }), 1e-5);
  both.add(kiln::layer_norm(x.t, w.t, b.t), ref::layer_norm(x.a, w.a, b.a, 1e-5), "layer_norm",
           ref::zip3(x_hat, w.a, b.a, [](double v, double g, double c) { return std::fabs(v * g) + std::fabs(c); }));
  Array scale;
  Array mm = ref::matmul(x.a, m.a, &scale);
  both.add(kiln::relu(kiln::matmul(x.t, m.t) + 0.5), ref::map(mm, [](double v) { return std::max(v + 0.5, 0.0); }),
           "relu(x @ m + 0.5)", ref::map(scale, [](double v) { return v + 0.5; }));
  Array centered = ref::zip(x.a, ref::amax(x.a, {0}, true), [](double p, double q) { return p - q; });
  both.add(kiln::sum(kiln::exp(x.t - kiln::amax(x.t, 0, keepdim)), 1),
           ref::sum(ref::map(centered, [](double v) { return std::exp(v); }), {1}), "sum(exp(x - amax(x, 0)), 1)");
  both.run();
}
