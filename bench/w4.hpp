// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// W4 of ../shared/bench/WORKLOADS.md, shared by gpu_bench (full size) and cpu_bench
// (reduced width): the MLP training step h = gelu(x@W1 + b1), y = h@W2 + b2,
// loss = mean(y^2) taken in f32 (torch_anchor.py: (y.float()**2).mean()); forward and
// backward in one plan, giving the gradients of x, W1, b1, W2, b2. Also its float64
// reference on the host (plain loops, row by row) and the error measures.
#pragma once
#include <cmath>
#include <numbers>
#include <string>
#include <type_traits>
#include <vector>

#include <kiln/kiln.hpp>

namespace w4 {

struct Sizes {
  int64_t M, K, H;  // x [M, K], W1 [K, H], W2 [H, K]
  // 3x the forward's 2*M*N*K per GEMM (as torch_anchor.py counts it)
  double flops() const { return 3.0 * 2 * (2.0 * double(M) * double(K) * double(H)); }
};

template <class DT>
struct Params {
  kiln::Tensor<DT, 2> x, W1, W2;
  kiln::Tensor<DT, 1> b1, b2;
};

// Random inputs with torch_anchor.py's scales: x ~ N(0,1), W1 ~ N(0,1/K), W2 ~ N(0,1/H), b ~ N(0, 0.02^2).
template <class DT>
Params<DT> random_params(Sizes s, uint64_t seed, kiln::Device device) {
  using namespace kiln;
  auto r = [&](auto shape, double scale, uint64_t k) {
    using T = Tensor<DT, int(std::tuple_size_v<decltype(shape)>)>;
    return T(cast<DT>(randn<f32>(shape, seed + k) * float(scale))).to(device);
  };
  return {r(Shape<2>{s.M, s.K}, 1.0, 0), r(Shape<2>{s.K, s.H}, 1 / std::sqrt(double(s.K)), 1),
          r(Shape<2>{s.H, s.K}, 1 / std::sqrt(double(s.H)), 3), r(Shape<1>{s.H}, 0.02, 2), r(Shape<1>{s.K}, 0.02, 4)};
}
// The same values in another dtype (the float64 reference reads exactly what the bf16 step reads).
template <class To, class From>
Params<To> convert(const Params<From>& p) {
  using namespace kiln;
  return {Tensor<To, 2>(cast<To>(p.x)), Tensor<To, 2>(cast<To>(p.W1)), Tensor<To, 2>(cast<To>(p.W2)),
          Tensor<To, 1>(cast<To>(p.b1)), Tensor<To, 1>(cast<To>(p.b2))};
}

// The step's expressions: (loss, dx, dW1, db1, dW2, db2). The loss is f32 (f64 for an f64 step).
template <class DT>
auto step(const Params<DT>& p) {
  using namespace kiln;
  using Acc = std::conditional_t<std::is_same_v<DT, f64>, f64, f32>;
  auto y = matmul(gelu(matmul(p.x, p.W1) + p.b1), p.W2) + p.b2;
  auto yf = cast<Acc>(y);
  auto loss = mean(yf * yf);
  auto [gx, gW1, gb1, gW2, gb2] = kiln::grad(loss, p.x, p.W1, p.b1, p.W2, p.b2);
  return std::tuple{loss, gx, gW1, gb1, gW2, gb2};
}

// ---- the float64 reference on the host ----
struct Host {
  Sizes s;
  std::vector<double> x, W1, b1, W2, b2;  // row-major
};
template <class DT>
Host to_host(Sizes s, const Params<DT>& p) {
  return {s, p.x.to_vector(), p.W1.to_vector(), p.b1.to_vector(), p.W2.to_vector(), p.b2.to_vector()};
}
struct Ref {
  double loss = 0;  // the rows' share of the loss
  std::vector<double> dx;  // [rows.size(), K]
  std::vector<double> dW1, db1, dW2, db2;  // the rows' share of the batch sums (when asked for)
};
// Forward and backward of the given rows of x in float64; with batch_sums, the rows'
// terms of dW1, db1, dW2, db2 too (all rows: the whole step).
inline Ref reference(const Host& h, const std::vector<int64_t>& rows, bool batch_sums) {
  const int64_t M = h.s.M, K = h.s.K, H = h.s.H;
  const double inv = 1.0 / (double(M) * double(K));
  Ref r;
  r.dx.assign(size_t(int64_t(rows.size()) * K), 0);
  if (batch_sums) r.dW1.assign(size_t(K * H), 0), r.db1.assign(size_t(H), 0), r.dW2.assign(size_t(H * K), 0), r.db2.assign(size_t(K), 0);
  const size_t nh = static_cast<size_t>(H), nk = static_cast<size_t>(K);
  std::vector<double> pre(nh), act(nh), y(nk), dy(nk), dpre(nh);
  for (size_t ri = 0; ri < rows.size(); ++ri) {
    const double* xr = h.x.data() + rows[ri] * K;
    for (int64_t j = 0; j < H; ++j) pre[size_t(j)] = h.b1[size_t(j)];
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < H; ++j) pre[size_t(j)] += xr[k] * h.W1[size_t(k * H + j)];
    for (int64_t j = 0; j < H; ++j) act[size_t(j)] = 0.5 * pre[size_t(j)] * (1 + std::erf(pre[size_t(j)] / std::numbers::sqrt2));
    for (int64_t c = 0; c < K; ++c) y[size_t(c)] = h.b2[size_t(c)];
    for (int64_t j = 0; j < H; ++j)
      for (int64_t c = 0; c < K; ++c) y[size_t(c)] += act[size_t(j)] * h.W2[size_t(j * K + c)];
    for (int64_t c = 0; c < K; ++c) r.loss += y[size_t(c)] * y[size_t(c)] * inv, dy[size_t(c)] = 2 * y[size_t(c)] * inv;
    for (int64_t j = 0; j < H; ++j) {
      double dh = 0, p = pre[size_t(j)];
      for (int64_t c = 0; c < K; ++c) dh += dy[size_t(c)] * h.W2[size_t(j * K + c)];
      double dgelu = 0.5 * (1 + std::erf(p / std::numbers::sqrt2)) + p * std::exp(-p * p / 2) / std::sqrt(2 * std::numbers::pi);
      dpre[size_t(j)] = dh * dgelu;
    }
    for (int64_t k = 0; k < K; ++k) {
      double s = 0;
      for (int64_t j = 0; j < H; ++j) s += dpre[size_t(j)] * h.W1[size_t(k * H + j)];
      r.dx[ri * size_t(K) + size_t(k)] = s;
    }
    if (!batch_sums) continue;
    for (int64_t c = 0; c < K; ++c) r.db2[size_t(c)] += dy[size_t(c)];
    for (int64_t j = 0; j < H; ++j) {
      r.db1[size_t(j)] += dpre[size_t(j)];
      for (int64_t c = 0; c < K; ++c) r.dW2[size_t(j * K + c)] += act[size_t(j)] * dy[size_t(c)];
    }
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < H; ++j) r.dW1[size_t(k * H + j)] += xr[k] * dpre[size_t(j)];
  }
  return r;
}

// |a - ref| / |ref| in the Frobenius norm (torch_anchor.py's relerr).
inline double rel_err(const std::vector<double>& a, const std::vector<double>& ref) {
  if (a.size() != ref.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - ref[i]) * (a[i] - ref[i]), den += ref[i] * ref[i];
  return std::isfinite(num) ? std::sqrt(num) / (den > 0 ? std::sqrt(den) : 1) : INFINITY;
}
// The same on the device, for tensors too large to copy: a against an f64 reference.
template <class DT, int R>
double rel_err(const kiln::Tensor<DT, R>& a, const kiln::Tensor<kiln::f64, R>& ref) {
  using namespace kiln;
  auto d = cast<f64>(a) - ref;
  auto [num, den] = eval(sum(d * d), sum(ref * ref));
  double n = num(), r = den();
  return std::isfinite(n) ? std::sqrt(n) / (r > 0 ? std::sqrt(r) : 1) : INFINITY;
}

}  // namespace w4
