// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// nn blocks. Takes sizes and a seed; gives modules that hold their parameters as
// tensors (initialised as PyTorch's defaults, drawn with Philox so a seed
// reproduces them on any device) and whose call builds an expression: nothing runs
// until the caller evaluates (or an optimiser's step does). Every module has
// params(), a ParamList of tensor handles; nn::collect(a, b, ...) joins them.
#pragma once
#include <cmath>

#include "kiln/nn/optim.hpp"
#include "kiln/prims/decomp.hpp"

namespace kiln::nn {

// U(-bound, bound), Philox at (seed, 0).
template <size_t R>
Tensor<f32, int(R)> uniform(const std::array<int64_t, R>& sizes, double bound, uint64_t seed) {
  return Tensor<f32, int(R)>(rand<f32>(sizes, seed) * float(2 * bound) - float(bound));
}
template <size_t R>
Tensor<f32, int(R)> filled(const std::array<int64_t, R>& sizes, double value) {
  return Tensor<f32, int(R)>::from(sizes, std::vector<double>(size_t(numel(sizes)), value));
}

// y = x W^T + b. PyTorch's init: kaiming_uniform(a=sqrt 5) for W, which is
// U(-1/sqrt(in), 1/sqrt(in)), and the same bound for b.
struct Linear {
  Tensor<f32, 2> weight;  // [out, in]
  Tensor<f32, 1> bias;    // [out]
  Linear(int64_t in, int64_t out, uint64_t seed)
      : weight(uniform(Shape<2>{out, in}, 1 / std::sqrt(double(in)), seed)),
        bias(uniform(Shape<1>{out}, 1 / std::sqrt(double(in)), seed ^ 0x9e3779b97f4a7c15ull)) {}
  template <Expr X>
  auto operator()(const X& x) const { return linear(x, weight, bias); }
  ParamList params() const { return {weight, bias}; }
};

// Over the last dim; weight 1, bias 0.
struct LayerNorm {
  Tensor<f32, 1> weight, bias;
  double eps;
  explicit LayerNorm(int64_t dim, double eps = 1e-5) : weight(filled(Shape<1>{dim}, 1)), bias(filled(Shape<1>{dim}, 0)), eps(eps) {}
  template <Expr X>
  auto operator()(const X& x) const { return layer_norm(x, weight, bias, eps); }
  ParamList params() const { return {weight, bias}; }
};

struct RMSNorm {
  Tensor<f32, 1> weight;
  double eps;
  explicit RMSNorm(int64_t dim, double eps = 1e-6) : weight(filled(Shape<1>{dim}, 1)), eps(eps) {}
  template <Expr X>
  auto operator()(const X& x) const { return rms_norm(x, weight, eps); }
  ParamList params() const { return {weight}; }
};

// Rows of a table by index; weight N(0, 1) as PyTorch. The lookup is a one-hot
// matmul (its gradient is then a matmul too: no scatter primitive needed).
struct Embedding {
  Tensor<f32, 2> weight;  // [num, dim]
  Embedding(int64_t num, int64_t dim, uint64_t seed) : weight(randn<f32>(Shape<2>{num, dim}, seed)) {}
  template <Expr I>
  auto operator()(const I& idx) const {
    static_assert(rank_of<I> == 1, "kiln::nn::Embedding: indices of rank 1 (reshape others)");
    auto hot = eq(iota<dtype_of<I>>(Shape<2>{shape_of(idx)[0], weight.size(0)}, 1), unsqueeze(idx, 1));
    return matmul(kiln::cast<f32>(hot), weight);
  }
  ParamList params() const { return {weight}; }
};

// Inverted dropout, reproducible: call k draws its mask from Philox at (seed, k-th
// offset). In eval mode (train = false) it keeps everything (p = 0).
struct Dropout {
  double p;
  uint64_t seed;
  bool train = true;
  mutable uint64_t offset = 0;
  Dropout(double p, uint64_t seed) : p(p), seed(seed) {}
  template <Expr X>
  auto operator()(const X& x) const {
    uint64_t at = offset;
    offset += uint64_t(numel(shape_of(x)));
    return dropout(x, train ? p : 0.0, seed, at);
  }
  ParamList params() const { return {}; }
};

// Linear -> GELU -> (dropout) -> Linear.
struct GeluMLP {
  Linear fc1, fc2;
  Dropout drop;
  GeluMLP(int64_t in, int64_t hidden, int64_t out, uint64_t seed, double p = 0.0)
      : fc1(in, hidden, seed), fc2(hidden, out, seed + 1), drop(p, seed + 2) {}
  template <Expr X>
  auto operator()(const X& x) const { return fc2(drop(gelu(fc1(x)))); }
  ParamList params() const { return collect(fc1, fc2); }
};

// Mean cross-entropy of logits [N, C] against class indices [N] (kiln::cross_entropy).
template <Expr L, Expr T>
auto cross_entropy(const L& logits, const T& target) { return kiln::cross_entropy(logits, target); }

}  // namespace kiln::nn
