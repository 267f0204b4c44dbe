// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Composites, written over the primitives (PrimTorch's decompositions, done at
// C++ compile time: each is an ordinary function returning a primitive
// expression). None has codegen or a gradient of its own; fusion makes them
// fast (softmax, layer_norm, var_mean: one kernel where the rows fit).
#pragma once
#include <numbers>

#include "kiln/expr/expr.hpp"

namespace kiln {

// clang-format off
template <Expr A> auto relu(const A& x) { return maximum(x, 0); }
template <Expr A> auto sigmoid(const A& x) { return 1 / (1 + exp(-x)); }
template <Expr A> auto silu(const A& x) { return x * sigmoid(x); }
// Exact GELU: x/2 (1 + erf(x/sqrt 2)).
// NOTE: as x Phi(x), Phi a primitive computed from the Gaussian e^(-x^2/2) that gelu's derivative
// reads too (one exponential for both, no 1 + erf cancellation below 0), W4's forward GEMM ran
// 4% slower on an H200 (1.890 -> 1.968 ms a call) and the step about 1%: CUDA's erff is one
// polynomial of degree 6 (coefficients picked by |x|) and an ex2 past |x| = 1, Phi's form a
// reciprocal and a polynomial of degree 9 (branch gelu-ndtr-shared; docs/benchmarks.md,
// thirty-fourth session). With rcp.approx and ex2.approx instead, and Phi's exponential shared
// with gelu' (22 SASS instructions an element of that epilogue against erf's 39), the forward
// GEMM ran 0.01-0.04 ms slower on an H100 and the step no faster (branch gelu-ndtr, fifty-fourth).
template <Expr A> auto gelu(const A& x) { return 0.5 * x * (1 + erf(x * (1 / std::numbers::sqrt2))); }
// GELU, tanh approximation (PyTorch approximate="tanh").
template <Expr A> auto gelu_tanh(const A& x) {
  constexpr double k = 0.7978845608028654;  // sqrt(2/pi)
  return 0.5 * x * (1 + tanh(k * (x + 0.044715 * x * x * x)));
}
// log(1 + e^x), linear above 20 as PyTorch's threshold.
template <Expr A> auto softplus(const A& x) { return where(x > 20, x, log(1 + exp(x))); }
// clang-format on

template <Expr A, size_t N>
int64_t count_over(const A& x, const std::array<int, N>& axes) {
  int64_t n = 1;
  auto s = shape_of(x);
  for (int a : axes) n *= s[size_t(normalize_axis("mean", a, rank_of<A>))];
  return n;
}

// mean: sum over axes times 1/n (n is a run-time value, passed as a scalar).
template <Expr A, size_t N>
auto mean(const A& x, const std::array<int, N>& axes, KeepDim k) {
  int64_t n = count_over(x, axes);
  return sum(x, axes, k) * (1.0 / double(n ? n : 1) * (n ? 1.0 : NAN));
}
template <Expr A, size_t N>
auto mean(const A& x, const std::array<int, N>& axes) {
  int64_t n = count_over(x, axes);
  return sum(x, axes) * (1.0 / double(n ? n : 1) * (n ? 1.0 : NAN));
}
template <Expr A> auto mean(const A& x) { return mean(x, all_axes<A>()); }
template <Expr A> auto mean(const A& x, int axis) { return mean(x, std::array{axis}); }
template <Expr A> auto mean(const A& x, int axis, KeepDim k) { return mean(x, std::array{axis}, k); }

// var with Bessel's correction by default (PyTorch's correction=1), keeping dims.
template <Expr A>
auto var(const A& x, int axis, KeepDim k, int correction = 1) {
  int64_t n = shape_of(x)[size_t(normalize_axis("var", axis, rank_of<A>))];
  auto d = x - mean(x, axis, k);
  return sum(d * d, axis, k) * (1.0 / double(std::max<int64_t>(n - correction, 0)));
}
template <Expr A>
auto var(const A& x, int axis, int correction = 1) {
  auto v = var(x, axis, keepdim, correction);
  Shape<rank_of<A> - 1> out{};
  auto s = shape_of(v);
  int ax = normalize_axis("var", axis, rank_of<A>);
  for (int i = 0, j = 0; i < rank_of<A>; ++i)
    if (i != ax) out[size_t(j++)] = s[size_t(i)];
  return reshape(v, out);
}
// (var, mean) over one axis, as one plan: evaluate both with kiln::eval(v, m).
template <Expr A>
auto var_mean(const A& x, int axis, int correction = 1) {
  auto m = mean(x, axis, keepdim);
  auto d = x - m;
  int64_t n = shape_of(x)[size_t(normalize_axis("var_mean", axis, rank_of<A>))];
  auto v = sum(d * d, axis, keepdim) * (1.0 / double(std::max<int64_t>(n - correction, 0)));
  Shape<rank_of<A> - 1> out{};
  auto s = shape_of(m);
  int ax = normalize_axis("var_mean", axis, rank_of<A>);
  for (int i = 0, j = 0; i < rank_of<A>; ++i)
    if (i != ax) out[size_t(j++)] = s[size_t(i)];
  return std::tuple{reshape(v, out), reshape(m, out)};
}

template <Expr A>
auto softmax(const A& x, int axis) {
  auto e = exp(x - amax(x, axis, keepdim));
  return e / sum(e, axis, keepdim);
}
template <Expr A>
auto log_softmax(const A& x, int axis) {
  auto z = x - amax(x, axis, keepdim);
  return z - log(sum(exp(z), axis, keepdim));
}

// Normalizes over the last dim; weight and bias of that dim's size.
template <Expr X, Expr W, Expr B>
auto layer_norm(const X& x, const W& w, const B& b, double eps = 1e-5) {
  auto d = x - mean(x, -1, keepdim);
  return d * rsqrt(mean(d * d, -1, keepdim) + eps) * w + b;
}
template <Expr X, Expr W>
auto rms_norm(const X& x, const W& w, double eps = 1e-6) {
  return x * rsqrt(mean(x * x, -1, keepdim) + eps) * w;
}

// Mean cross-entropy of logits [N, C] against class indices [N] (i32 or i64).
template <Expr L, Expr T>
auto cross_entropy(const L& logits, const T& target) {
  static_assert(rank_of<L> == 2 && rank_of<T> == 1, "kiln: cross_entropy: logits [N, C] and target [N]");
  using TI = dtype_of<T>;
  static_assert(std::is_same_v<TI, i64> || std::is_same_v<TI, i32>, "kiln: cross_entropy: integer class targets");
  auto hit = eq(iota<TI>(shape_of(logits), 1), unsqueeze(target, 1));
  return -mean(sum(where(hit, log_softmax(logits, 1), 0), 1));
}
template <Expr A, Expr B>
auto mse_loss(const A& a, const B& b) {
  auto d = a - b;
  return mean(d * d);
}

// Inverted dropout: keeps each element with probability 1-p, scaled by 1/(1-p).
// Reproducible: the mask is Philox at (seed, offset + element index).
template <Expr A>
auto dropout(const A& x, double p, uint64_t seed, uint64_t offset = 0) {
  if (p < 0 || p >= 1) throw Error("kiln: dropout: p must be in [0, 1)");
  return where(rand<f32>(shape_of(x), seed, offset) >= float(p), x * (1.0 / (1.0 - p)), 0);
}

// y = x W^T + b, W as [out, in] (PyTorch's layout).
template <Expr X, Expr W, Expr B>
auto linear(const X& x, const W& w, const B& b) { return matmul(x, transpose(w, 0, 1)) + b; }
template <Expr X, Expr W>
auto linear(const X& x, const W& w) { return matmul(x, transpose(w, 0, 1)); }

// Standard normal samples (Box–Muller over two Philox streams).
template <FloatDType DT, size_t R>
auto randn(const std::array<int64_t, R>& sizes, uint64_t seed, uint64_t offset = 0) {
  uint64_t n = uint64_t(numel(sizes));
  auto u1 = rand<DT>(sizes, seed, offset), u2 = rand<DT>(sizes, seed, offset + n);
  return sqrt(-2 * log(1 - u1)) * cos((2 * std::numbers::pi) * u2);
}

}  // namespace kiln
