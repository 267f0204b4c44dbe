// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Every composite of prims/decomp.hpp against a textbook float64 formula (written in
// tests/support/reference.hpp, not derived from kiln's decompositions): activations,
// softmax and log_softmax, mean / var / var_mean, layer_norm and rms_norm, the losses,
// linear, dropout and randn (against an independent Philox), in f32, f64 and the 16-bit
// floats, on rows shorter and longer than one chunk, and on non-contiguous operands.
#include "../support/reference.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {

// Pointwise composites: relu sigmoid silu gelu gelu_tanh softplus.
template <class DT, class X>
void add_activations(Batch& b, const X& x, const Array& xa, Tol t, const std::string& label) {
  auto m = [&](auto f) { return ref::map(xa, f); };
  b.check(kiln::relu(x), m([](double v) { return std::max(v, 0.0); }), t, "relu " + label);
  b.check(kiln::sigmoid(x), m([](double v) { return ref::sigmoid(v); }), t, "sigmoid " + label);
  b.check(kiln::silu(x), m([](double v) { return v * ref::sigmoid(v); }), t, "silu " + label);
  b.check(kiln::gelu(x), m([](double v) { return ref::gelu(v); }), t, "gelu " + label);
  b.check(kiln::gelu_tanh(x), m([](double v) { return ref::gelu_tanh(v); }), t, "gelu_tanh " + label);
  b.check(kiln::softplus(x), m([](double v) { return ref::softplus(v); }), t, "softplus " + label);
}

// The absolute error of a composite with cancellation (1 + erf(x) near x = -3, say) is a
// few ulps of its operands, not of its result: atol at the operands' scale.
template <class DT>
Tol composite_tol() {
  Tol t = tol<DT>();
  return {t.rtol * 2, std::max(t.atol, t.rtol * 0.1)};
}

}  // namespace

TEST_CASE_TEMPLATE("activation composites", DT, f32, f64, f16, bf16) {
  KILN_TEST_RNG(rng);
  Batch b;
  auto x = input<DT, 2>(rng, {37, 129}, Layout::transposed, {-8, 8, 0.1});
  add_activations<DT>(b, x.t, x.a, composite_tol<DT>(), "x in [-8, 8]");
  if constexpr (std::is_same_v<DT, f32> || std::is_same_v<DT, f64>) {
    // softplus switches to x above 20
    Array edge(Dims{1, 8});
    edge.v = {19.5, 19.999, 20.0, 20.001, 20.5, 30, -30, -100};
    edge = ref::as(DT::id, edge);
    auto e = make_tensor<DT, 2>(edge);
    b.check(kiln::softplus(e), ref::map(edge, [](double v) { return ref::softplus(v); }), composite_tol<DT>(),
            "softplus around its threshold");
  }
  b.run();
  if constexpr (std::is_same_v<DT, f32> || std::is_same_v<DT, f64>) b.run(Mode::eager);
}

TEST_CASE_TEMPLATE("row composites: softmax, log_softmax, mean, var, var_mean, layer_norm, rms_norm", DT, f32, f64,
                   bf16) {
  KILN_TEST_RNG(rng);
  Tol t = composite_tol<DT>();
  for (Shape<2> s : {Shape<2>{37, 129}, Shape<2>{3, 9000}}) {  // one plan: rows shorter and longer than a chunk
    Batch b;
    for (Layout l : {Layout::contiguous, Layout::transposed}) {
      std::string label = str(dims(s)) + " " + name(l);
      auto x = input<DT, 2>(rng, s, l, {-4, 4});
      auto w = input<DT, 1>(rng, {s[1]}, Layout::contiguous, {0.5, 1.5});
      auto bias = input<DT, 1>(rng, {s[1]});
      int64_t n = s[1];
      b.check(kiln::softmax(x.t, -1), ref::softmax(x.a, 1), t, "softmax(x, -1) " + label);
      b.check(kiln::softmax(x.t, 0), ref::softmax(x.a, 0), t, "softmax(x, 0) " + label);
      b.check(kiln::log_softmax(x.t, 1), ref::log_softmax(x.a, 1), t, "log_softmax(x, 1) " + label);
      auto [mean, var0] = ref::moments(x.a, 1, 0);
      auto [mean_unused, var1] = ref::moments(x.a, 1, 1);
      (void)mean_unused;
      // a mean's error scales with mean |x|
      Array mean_scale = ref::map(ref::abs_sum(x.a, {1}, true), [&](double v) { return v / double(n); });
      b.check(kiln::mean(x.t, 1, keepdim), mean, t, "mean(x, 1, keepdim) " + label, mean_scale);
      b.check(kiln::mean(x.t), ref::map(ref::sum(x.a, {0, 1}), [&](double v) { return v / double(x.a.numel()); }), t,
              "mean(x) " + label,
              ref::map(ref::abs_sum(x.a, {0, 1}), [&](double v) { return v / double(x.a.numel()); }));
      b.check(kiln::var(x.t, 1, keepdim, 0), var0, t, "var(x, 1, keepdim, correction 0) " + label);
      b.check(kiln::var(x.t, -1), ref::reshape(var1, {s[0]}), t, "var(x, -1) " + label);
      auto [v, m] = kiln::var_mean(x.t, 1);
      b.check(v, ref::reshape(var1, {s[0]}), t, "var_mean(x, 1): var " + label);
      b.check(m, ref::reshape(mean, {s[0]}), t, "var_mean(x, 1): mean " + label, ref::reshape(mean_scale, {s[0]}));
      // normalized values are O(1): atol at that scale
      Tol tn = {t.rtol * 2, t.rtol * 2};
      b.check(kiln::layer_norm(x.t, w.t, bias.t), ref::layer_norm(x.a, w.a, bias.a, 1e-5), tn, "layer_norm " + label);
      b.check(kiln::layer_norm(x.t, w.t, bias.t, 0.5), ref::layer_norm(x.a, w.a, bias.a, 0.5), tn,
              "layer_norm, eps 0.5 " + label);
      b.check(kiln::rms_norm(x.t, w.t), ref::rms_norm(x.a, w.a, 1e-6), tn, "rms_norm " + label);
    }
    b.run();
  }
}

TEST_CASE_TEMPLATE("loss composites: cross_entropy, mse_loss", DT, f32, f64) {
  KILN_TEST_RNG(rng);
  auto logits = input<DT, 2>(rng, {37, 11}, Layout::contiguous, {-5, 5});
  auto t64 = input<i64, 1>(rng, {37}, Layout::contiguous, {0, 10});
  auto t32 = input<i32, 1>(rng, {37}, Layout::strided, {0, 10});
  auto a = input<DT, 2>(rng, {37, 11}), c = input<DT, 2>(rng, {37, 11}, Layout::transposed);
  auto ce = [&](const Array& target) {
    Array ls = ref::log_softmax(logits.a, 1);
    double total = 0;
    for (int64_t i = 0; i < 37; ++i) total -= ls.at({i, int64_t(target.v[size_t(i)])});
    return Array(Dims{}, total / 37);
  };
  Array d2 = ref::zip(a.a, c.a, [](double p, double q) { return (p - q) * (p - q); });
  Batch b;
  Tol t = composite_tol<DT>();
  b.check(kiln::cross_entropy(logits.t, t64.t), ce(t64.a), t, "cross_entropy, i64 targets");
  b.check(kiln::cross_entropy(logits.t, t32.t), ce(t32.a), t, "cross_entropy, i32 targets");
  b.check(kiln::mse_loss(a.t, c.t), Array(Dims{}, ref::sum(d2, {0, 1}).v[0] / double(d2.numel())), t, "mse_loss");
  b.run();
}

TEST_CASE_TEMPLATE("linear composite: x W^T + b", DT, f32, bf16) {
  KILN_TEST_RNG(rng);
  auto x = input<DT, 3>(rng, {2, 37, 19}, Layout::contiguous, {-2, 2});
  auto w = input<DT, 2>(rng, {30, 19}, Layout::contiguous, {-2, 2});
  auto bias = input<DT, 1>(rng, {30});
  Array scale;
  Array mm = ref::matmul(x.a, ref::transpose(w.a, 0, 1), &scale);
  Batch b;
  b.check(kiln::linear(x.t, w.t), mm, tol<DT>(), "linear(x, W)", scale);
  b.check(kiln::linear(x.t, w.t, bias.t), ref::zip(mm, bias.a, [](double p, double q) { return p + q; }),
          tol<DT>().scaled(2), "linear(x, W, b)", ref::zip(scale, bias.a, [](double p, double q) { return p + std::fabs(q); }));
  b.run();
}

TEST_CASE_TEMPLATE("dropout composite: Philox mask, inverted scaling", DT, f32, bf16) {
  KILN_TEST_RNG(rng);
  uint64_t seed = rng.gen(), offset = rng.gen() >> 8;
  auto x = input<DT, 2>(rng, {37, 1290}, Layout::transposed);
  for (double p : {0.0, 0.3, 0.9}) {
    Array u = ref::rand(x.a.shape, seed, offset);
    double pf = double(float(p));
    Array want = ref::zip(u, x.a, [&](double r, double v) { return r >= pf ? v * (1 / (1 - p)) : 0.0; });
    Tensor<DT, 2> y = kiln::dropout(x.t, p, seed, offset);
    check_close(y, want, tol<DT>(), "dropout p = " + std::to_string(p));
    double kept = 0;
    for (double r : u.v) kept += r >= pf;
    CHECK(std::fabs(kept / double(u.numel()) - (1 - p)) < 0.02);
  }
}

TEST_CASE("randn composite: Box-Muller over two Philox streams") {
  KILN_TEST_RNG(rng);
  uint64_t seed = rng.gen(), offset = rng.gen() >> 8;
  Shape<2> s{300, 333};
  Tensor<f32, 2> z = kiln::randn<f32>(s, seed, offset);
  uint64_t n = uint64_t(numel(s));
  Array u1 = ref::rand(dims(s), seed, offset), u2 = ref::rand(dims(s), seed, offset + n);
  Array want = ref::zip(u1, u2, [](double a, double b) {
    return std::sqrt(-2 * std::log(1 - a)) * std::cos(2 * std::numbers::pi * b);
  });
  check_close(z, want, {1e-5, 1e-5}, "randn");
  Array got = read(z);
  double mean = std::accumulate(got.v.begin(), got.v.end(), 0.0) / double(got.numel()), var = 0;
  for (double v : got.v) var += (v - mean) * (v - mean);
  var /= double(got.numel());
  CHECK(std::fabs(mean) < 0.02);
  CHECK(std::fabs(var - 1) < 0.02);
}
