// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Optimisers and nn blocks: SGD (momentum, weight decay), Adam and AdamW updates,
// eager and compiled, against the update formulas in float64 over several steps;
// a whole training step (loss, gradients, updates) as one plan; module initialisation
// bounds and parameter collection; dropout's reproducibility.
#include "../support/reference.hpp"

#include "kiln/nn/modules.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {

// The float64 reference of one optimiser on one parameter: p, g per step -> p.
struct RefOpt {
  enum Kind { sgd, adam, adamw } kind;
  double lr, momentum, wd, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  std::vector<double> p, s0, s1;
  int t = 0;
  RefOpt(Kind k, double lr, double momentum, double wd) : kind(k), lr(lr), momentum(momentum), wd(wd) {}
  void step(const std::vector<double>& g) {
    ++t;
    if (s0.empty()) s0.assign(p.size(), 0), s1.assign(p.size(), 0);
    for (size_t i = 0; i < p.size(); ++i) {
      if (kind == sgd) {
        double d = g[i] + wd * p[i];
        s0[i] = t == 1 ? d : momentum * s0[i] + d;  // torch.optim.SGD, dampening 0
        p[i] -= lr * s0[i];
      } else {
        double d = kind == adam ? g[i] + wd * p[i] : g[i];
        if (kind == adamw) p[i] *= 1 - lr * wd;
        s0[i] = b1 * s0[i] + (1 - b1) * d;
        s1[i] = b2 * s1[i] + (1 - b2) * d * d;
        double mh = s0[i] / (1 - std::pow(b1, t)), vh = s1[i] / (1 - std::pow(b2, t));
        p[i] -= lr * mh / (std::sqrt(vh) + eps);
      }
    }
  }
};

template <class Opt>
void run_optimizer(const char* what, RefOpt::Kind kind, double lr, double momentum, double wd, auto make) {
  KILN_TEST_RNG(rng);
  for (Mode mode : {Mode::fused, Mode::eager}) {
    CAPTURE(what);
    CAPTURE(int(mode));
    auto w = input<f32, 2>(rng, {3, 5}, Layout::transposed, Values{-1, 1});  // a non-contiguous parameter
    auto b = input<f32, 1>(rng, {5}, Layout::contiguous, Values{-1, 1});
    Tensor<f32, 2> w_alias = w.t;  // another handle: sees the in-place update
    Opt opt = make(nn::collect(w.t, b.t), mode);
    RefOpt rw{kind, lr, momentum, wd}, rb{kind, lr, momentum, wd};
    rw.p = w.a.v, rb.p = b.a.v;
    for (int step = 0; step < 3; ++step) {
      auto gw = input<f32, 2>(rng, {3, 5}, Layout::contiguous, Values{-1, 1});
      auto gb = input<f32, 1>(rng, {5}, Layout::strided, Values{-1, 1});
      opt.step(nn::ParamList{gw.t, gb.t});
      rw.step(gw.a.v), rb.step(gb.a.v);
    }
    Array aw({3, 5});
    aw.v = rw.p;
    check_close(w_alias, aw, Tol{2e-5, 2e-6}, what);
    Array bb({5});
    bb.v = rb.p;
    check_close(b.t, bb, Tol{2e-5, 2e-6}, what);
  }
}

}  // namespace

TEST_CASE("optim: SGD, Adam, AdamW against float64 formulas, eager and compiled") {
  run_optimizer<nn::SGD>("sgd", RefOpt::sgd, 0.1, 0.9, 0.01, [](const nn::ParamList& p, Mode m) { return nn::SGD(p, 0.1, 0.9, 0.01, m); });
  run_optimizer<nn::Adam>("adam", RefOpt::adam, 0.01, 0, 0.05, [](const nn::ParamList& p, Mode m) {
    return nn::Adam(p, 0.01, 0.9, 0.999, 1e-8, 0.05, m);
  });
  run_optimizer<nn::AdamW>("adamw", RefOpt::adamw, 0.01, 0, 0.1, [](const nn::ParamList& p, Mode m) {
    return nn::AdamW(p, 0.01, 0.1, 0.9, 0.999, 1e-8, m);
  });
}

TEST_CASE("optim: a training step (loss, gradients, updates) is one plan; eager equals compiled") {
  auto make = [] { return nn::GeluMLP(6, 8, 3, 7); };
  nn::GeluMLP fused = make(), eager = make();
  auto x = Tensor<f32, 2>(randn<f32>(Shape<2>{10, 6}, 3));
  auto y = Tensor<i64, 1>::from({10}, {0, 1, 2, 0, 1, 2, 0, 1, 2, 0});
  nn::AdamW of(fused.params(), 1e-2), oe(eager.params(), 1e-2, 1e-2, 0.9, 0.999, 1e-8, Mode::eager);
  double first = 0, last = 0;
  for (int s = 0; s < 20; ++s) {
    double lf = of.step(nn::cross_entropy(fused(x), y));
    double le = oe.step(nn::cross_entropy(eager(x), y));
    CHECK(lf == doctest::Approx(le).epsilon(1e-4));
    if (s == 0) first = lf;
    last = lf;
  }
  CHECK(last < first * 0.7);
  auto a = fused.fc1.weight.to_vector(), b = eager.fc1.weight.to_vector();
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-4));
}

TEST_CASE("nn: PyTorch default initialisation, parameter collection, dropout reproducible") {
  nn::Linear l(50, 20, 1);
  double bound = 1 / std::sqrt(50.0);
  for (double v : l.weight.to_vector()) CHECK(std::fabs(v) <= bound);
  for (double v : l.bias.to_vector()) CHECK(std::fabs(v) <= bound);
  nn::LayerNorm ln(20);
  nn::RMSNorm rn(20);
  nn::Embedding emb(7, 4, 2);
  CHECK(nn::collect(l, ln, rn, emb).size() == 6);
  auto idx = Tensor<i64, 1>::from({3, 0, 6});
  Tensor<f32, 2> e = emb(idx);
  CHECK(e(0, 1) == emb.weight(3, 1));
  CHECK(e(2, 3) == emb.weight(6, 3));
  auto x = Tensor<f32, 2>(randn<f32>(Shape<2>{64, 64}, 5));
  nn::Dropout d1(0.25, 9), d2(0.25, 9);
  Tensor<f32, 2> a = d1(x), b = d2(x), c = d1(x);
  CHECK(a.to_vector() == b.to_vector());   // same seed, same call: same mask
  CHECK(a.to_vector() != c.to_vector());   // the next call draws a new mask
  double kept = 0;
  for (double v : a.to_vector()) kept += v != 0;
  CHECK(kept / 4096 == doctest::Approx(0.75).epsilon(0.05));
}
