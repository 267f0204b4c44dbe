// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Optimisers: SGD (momentum, weight decay), Adam, AdamW, with PyTorch's update
// formulas. Takes the parameters (a ParamList: tensor handles, so the module sees
// the new values) and, per step, a loss expression or explicit gradients; gives the
// updated parameters and state, written in place.
//
// Multi-tensor: a step builds the update expressions of every parameter (and, with
// step(loss), the loss and all its gradients) and evaluates them as ONE plan
// (kiln::evaluate_many), then writes the results into the parameter and state
// tensors (kiln::copy_into). State lives in tensors of the parameters' shapes.
// Hyper-parameters and the step count enter as scalars, which are run-time values,
// so changing the learning rate never recompiles.
#pragma once
#include <cmath>
#include <variant>

#include "kiln/autograd/grad.hpp"
#include "kiln/runtime/front.hpp"

namespace kiln::nn {

// A trainable parameter: a float32 tensor handle (shares the module's storage).
using Param = std::variant<Tensor<f32, 1>, Tensor<f32, 2>, Tensor<f32, 3>, Tensor<f32, 4>>;
using ParamList = std::vector<Param>;

// The parameters of several modules (anything with params()) or tensors, in order.
template <class... M>
ParamList collect(const M&... ms) {
  ParamList out;
  auto add = [&](const auto& m) {
    if constexpr (requires { m.params(); }) {
      ParamList p = m.params();
      out.insert(out.end(), p.begin(), p.end());
    } else {
      out.push_back(Param(m));
    }
  };
  (add(ms), ...);
  return out;
}

template <int R>
Tensor<f32, R> zeros_like(const Tensor<f32, R>& p) {
  return Tensor<f32, R>::from(p.sizes(), std::vector<double>(size_t(p.numel()), 0.0), p.device());
}

// The update of one parameter, per optimiser: (p, g, state) -> (p', state'...).
struct SgdRule {
  static constexpr int kState = 1;  // momentum buffer
  double lr = 1e-2, momentum = 0, weight_decay = 0;
  template <class P, class G, class S>
  auto operator()(const P& p, const G& g, const S& s, int64_t) const {
    auto d = g + weight_decay * p;
    auto buf = momentum * s[0] + d;  // torch: buf = d on the first step; with buf = 0 the same
    return std::tuple{p - lr * buf, buf};
  }
};
struct AdamRule {
  static constexpr int kState = 2;  // first and second moments
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled = false;  // AdamW: decay the weights, not the gradient
  template <class P, class G, class S>
  auto operator()(const P& p, const G& g, const S& s, int64_t t) const {
    double bc1 = 1 - std::pow(beta1, double(t)), bc2 = 1 - std::pow(beta2, double(t));
    double l2 = decoupled ? 0.0 : weight_decay, decay = decoupled ? 1 - lr * weight_decay : 1.0;
    auto d = g + l2 * p;
    auto m = beta1 * s[0] + (1 - beta1) * d;
    auto v = beta2 * s[1] + (1 - beta2) * d * d;
    return std::tuple{p * decay - (lr / bc1) * m / (sqrt(v) * (1 / std::sqrt(bc2)) + eps), m, v};
  }
};

template <class Rule>
class Optimizer {
  static constexpr int S = Rule::kState;
  template <int R>
  struct Slot {
    std::vector<Tensor<f32, R>> p;
    std::array<std::vector<Tensor<f32, R>>, S> state;
  };

 public:
  Optimizer(const ParamList& params, Rule rule, Mode mode = Mode::fused) : rule(rule), mode(mode) {
    for (const Param& p : params)
      std::visit([&]<int R>(const Tensor<f32, R>& t) {
        auto& sl = std::get<Slot<R>>(slots_);
        sl.p.push_back(t);
        for (auto& s : sl.state) s.push_back(zeros_like(t));
      }, p);
  }

  // One training step as ONE plan: the loss, its gradient for every parameter, and
  // every update. Returns the loss (its value before the update).
  template <Expr L>
  double step(const L& loss) {
    autograd::Backward<L> b(loss);
    ++t_;
    return double(run([&](const auto& p, size_t) { return b.of(p); }, loss)());
  }
  // An update with given gradients: one tensor per parameter, in the parameters' order.
  void step(const ParamList& grads) {
    std::tuple<std::vector<Tensor<f32, 1>>, std::vector<Tensor<f32, 2>>, std::vector<Tensor<f32, 3>>,
               std::vector<Tensor<f32, 4>>> by_rank;  // the k-th gradient of rank R belongs to the k-th parameter of rank R
    for (const Param& g : grads)
      std::visit([&]<int R>(const Tensor<f32, R>& t) { std::get<size_t(R - 1)>(by_rank).push_back(t); }, g);
    ++t_;
    run([&]<int R>(const Tensor<f32, R>&, size_t k) { return std::get<size_t(R - 1)>(by_rank).at(k); }, NoLoss{});
  }

  Rule rule;
  Mode mode;
  int64_t steps() const { return t_; }
  // The state tensors of parameter k of rank R (for tests and checkpoints).
  template <int R>
  const Tensor<f32, R>& state(int which, size_t k) const { return std::get<Slot<R>>(slots_).state[size_t(which)].at(k); }

 private:
  template <int R, class GradOf>
  auto build(GradOf&& grad_of) const {
    const Slot<R>& sl = std::get<Slot<R>>(slots_);
    using G = decltype(grad_of(std::declval<const Tensor<f32, R>&>(), size_t()));
    using U = decltype(rule(std::declval<const Tensor<f32, R>&>(), std::declval<const G&>(),
                            std::declval<const std::array<Tensor<f32, R>, S>&>(), int64_t()));
    return [&]<size_t... K>(std::index_sequence<K...>) {
      std::tuple<std::vector<std::tuple_element_t<K, U>>...> out;
      for (size_t i = 0; i < sl.p.size(); ++i) {
        std::array<Tensor<f32, R>, S> st;
        for (int k = 0; k < S; ++k) st[size_t(k)] = sl.state[size_t(k)][i];
        U u = rule(sl.p[i], grad_of(sl.p[i], i), st, t_);
        (std::get<K>(out).push_back(std::get<K>(u)), ...);
      }
      return out;
    }(std::make_index_sequence<S + 1>{});
  }
  template <int R>
  auto dests() {
    Slot<R>& sl = std::get<Slot<R>>(slots_);
    return [&]<size_t... K>(std::index_sequence<K...>) {
      return std::tuple<std::vector<Tensor<f32, R>>&, decltype((sl.state[K]))...>{sl.p, sl.state[K]...};
    }(std::make_index_sequence<S>{});
  }
  // Evaluates [loss,] every update as one plan, then writes them back. Gives the loss.
  struct NoLoss {};
  template <class GradOf, class L>
  auto run(GradOf&& grad_of, const L& loss) {
    auto ex = std::tuple_cat(build<1>(grad_of), build<2>(grad_of), build<3>(grad_of), build<4>(grad_of));
    auto dst = std::tuple_cat(dests<1>(), dests<2>(), dests<3>(), dests<4>());
    constexpr size_t N = std::tuple_size_v<decltype(ex)>;
    if constexpr (!std::is_same_v<L, NoLoss>) {
      auto res = std::apply([&](const auto&... e) { return evaluate_many(mode, loss, e...); }, ex);
      write_back<1>(dst, res, std::make_index_sequence<N>{});
      return std::get<0>(res);
    } else {
      auto res = std::apply([&](const auto&... e) { return evaluate_many(mode, e...); }, ex);
      write_back<0>(dst, res, std::make_index_sequence<N>{});
      return Tensor<f32, 0>::from({}, std::vector<double>{0.0});
    }
  }
  template <size_t Skip, class D, class Res, size_t... I>
  static void write_back(D& dst, const Res& res, std::index_sequence<I...>) {
    auto one = [](auto& to, const auto& from) {
      for (size_t k = 0; k < to.size(); ++k) copy_into(to[k], from[k]);
    };
    (one(std::get<I>(dst), std::get<I + Skip>(res)), ...);
  }

  std::tuple<Slot<1>, Slot<2>, Slot<3>, Slot<4>> slots_;
  int64_t t_ = 0;
};

// PyTorch's defaults: SGD(lr, momentum=0, weight_decay=0); Adam(lr=1e-3, betas=(0.9,
// 0.999), eps=1e-8, weight_decay=0); AdamW the same with weight_decay=1e-2.
struct SGD : Optimizer<SgdRule> {
  SGD(const ParamList& p, double lr, double momentum = 0, double weight_decay = 0, Mode mode = Mode::fused)
      : Optimizer<SgdRule>(p, SgdRule{lr, momentum, weight_decay}, mode) {}
};
struct Adam : Optimizer<AdamRule> {
  Adam(const ParamList& p, double lr = 1e-3, double beta1 = 0.9, double beta2 = 0.999, double eps = 1e-8,
       double weight_decay = 0, Mode mode = Mode::fused)
      : Optimizer<AdamRule>(p, AdamRule{lr, beta1, beta2, eps, weight_decay, false}, mode) {}
};
struct AdamW : Optimizer<AdamRule> {
  AdamW(const ParamList& p, double lr = 1e-3, double weight_decay = 1e-2, double beta1 = 0.9, double beta2 = 0.999,
        double eps = 1e-8, Mode mode = Mode::fused)
      : Optimizer<AdamRule>(p, AdamRule{lr, beta1, beta2, eps, weight_decay, true}, mode) {}
};

}  // namespace kiln::nn
