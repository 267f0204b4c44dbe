// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// kiln::grad against central finite differences in float64: every row of the gradient
// table and every composite, on random values, with broadcasting and non-contiguous
// inputs (transposed, strided); tie rules (maximum, amax) and zero-gradient rows
// against their exact values; a 2-layer MLP against a float64 derivation by hand.
//
// Each check evaluates (loss, grads...) as one plan; the finite differences rerun that
// same plan with perturbed inputs, so every check costs one JIT compile.
#include "../support/reference.hpp"

#include "kiln/autograd/grad.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {

constexpr double kEps = 1e-6, kRtol = 1e-6, kAtol = 1e-7;

template <class... G>
auto eval_all(const auto& loss, const std::tuple<G...>& gs) {
  return std::apply([&](const auto&... g) { return kiln::eval(loss, g...); }, gs);
}

// d loss / d x (kiln) against (L(x + eps) - L(x - eps)) / 2 eps for every element of x.
template <int R>
void compare_fd(const std::string& what, int which, const Tensor<f64, R>& x, const Tensor<f64, R>& g,
                const std::function<double()>& loss_now, double scale) {
  Array got = read(g);
  REQUIRE(got.shape == dims(x.sizes()));
  // x's values are perturbed in a host copy (x itself on the CPU), then sent to x's device.
  Tensor<f64, R> host = on_host(x);
  double* p = host.host_data();
  auto send = [&] {
    if (x.device() != cpu()) copy_bytes(x.storage()->data(), x.device(), host.storage()->data(), cpu(), x.storage()->bytes());
  };
  int bad = 0;
  for_each_index(dims(x.sizes()), [&](const Dims& idx, int64_t lin) {
    double& v = p[storage_offset(x, idx)];
    double keep = v;
    v = keep + kEps;
    send();
    double up = loss_now();
    v = keep - kEps;
    send();
    double down = loss_now();
    v = keep;
    send();
    double fd = (up - down) / (2 * kEps), an = got.v[size_t(lin)];
    if (!(std::fabs(fd - an) <= kAtol * scale + kRtol * std::fabs(fd)) && bad++ < 3)
      FAIL_CHECK(what << ": d/d input " << which << str(idx) << ": kiln " << fmt(an) << ", finite difference " << fmt(fd)
                      << " (seed " << current_seed() << ")");
  });
}

// Checks the gradient of make(xs...) with respect to every x against finite differences.
template <class F, int... R>
void check_grad(const std::string& what, F make, const Tensor<f64, R>&... xs) {
  auto loss = make(xs...);
  auto gs = kiln::grad(loss, xs...);
  auto out = eval_all(loss, gs);
  auto loss_now = [&] { return std::get<0>(eval_all(loss, gs))(); };
  double scale = std::max(1.0, std::fabs(std::get<0>(out)()));
  int which = 0;
  std::apply([&](const auto&, const auto&... g) { (compare_fd(what, which++, xs, g, loss_now, scale), ...); }, out);
}

// Random f64 tensors; positive ones for log, sqrt and friends.
template <int R>
Tensor<f64, R> rnd(Rng& rng, Shape<R> s, Layout l = Layout::contiguous, double lo = -2, double hi = 2) {
  return input<f64, R>(rng, s, l, Values{lo, hi}).t;
}
template <int R>
Tensor<f64, R> pos(Rng& rng, Shape<R> s, Layout l = Layout::contiguous) {
  return rnd<R>(rng, s, l, 0.5, 2.5);
}

}  // namespace

TEST_CASE("grad: unary rows against finite differences") {
  KILN_TEST_RNG(rng);
  auto a = rnd<2>(rng, {3, 4}, Layout::transposed);
  auto w = rnd<2>(rng, {3, 4});
  auto p = pos<2>(rng, {3, 4}, Layout::strided);
  check_grad("unary", [](const auto& a, const auto& p, const auto& w) {
    return sum((exp(a) + exp2(a) + -a + abs(a) + sin(a) + cos(a) + tanh(a) + erf(a)) * w) +
           sum((log(p) + log2(p) + sqrt(p) + rsqrt(p) + reciprocal(p)) * w) + sum(a * floor(p) + sign(a) * p);
  }, a, p, w);
}

// erf's rule computes e^(-x^2) as exp2(x^2 * -log2 e) (autograd/rules.hpp): in f32 the scaled
// square is rounded once more than -(x^2) is, which costs about x^2 2^-23 of the result
// relatively; the bound below is twice that plus a few ulps, far tails included (x to 6:
// e^-36, still a normal f32), against the float64 derivative of the same f32 inputs.
TEST_CASE("grad: erf's derivative in f32 against float64 out to its tails") {
  KILN_TEST_RNG(rng);
  for (Layout l : {Layout::contiguous, Layout::transposed}) {
    auto x = input<f32, 2>(rng, {7, 33}, l, Values{-6, 6});
    auto w = input<f32, 2>(rng, {7, 33}, Layout::contiguous, Values{0.5, 2});
    auto [gx] = kiln::grad(sum(erf(x.t) * w.t), x.t);
    Array got = read(Tensor<f32, 2>(kiln::eval(gx)));
    int bad = 0;
    for (int64_t i = 0; i < x.a.numel(); ++i) {
      double v = x.a.v[size_t(i)], want = 2 / std::sqrt(std::numbers::pi) * std::exp(-v * v) * w.a.v[size_t(i)];
      double bound = (v * v * 2.4e-7 + 6e-7) * want;
      if (!(std::fabs(got.v[size_t(i)] - want) <= bound) && bad++ < 3)
        FAIL_CHECK(std::string(kiln::test::name(l)) << ": d erf(x) / dx at x = " << fmt(v) << ": kiln " << fmt(got.v[size_t(i)] / w.a.v[size_t(i)])
                           << ", float64 " << fmt(want / w.a.v[size_t(i)]) << " (seed " << current_seed() << ")");
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("grad: binary rows with broadcasting and host scalars") {
  KILN_TEST_RNG(rng);
  auto a = rnd<2>(rng, {3, 4}, Layout::strided);
  auto b = rnd<1>(rng, {4});
  auto c = rnd<2>(rng, {3, 1});
  auto p = pos<2>(rng, {3, 4}, Layout::transposed);
  auto q = pos<1>(rng, {4});
  check_grad("binary", [](const auto& a, const auto& b, const auto& c, const auto& p, const auto& q) {
    return sum((a + b) * (a - c) + a * b * c + a / q + b / p - 2.0 * c / p + (3.0 - a) * 0.5) +
           sum(pow(p, b) + pow(q, 1.5) + pow(2.0, a) + pow(p, a * q)) + sum(maximum(a, b) * c + minimum(c, a) * b) +
           sum(maximum(a, 0.25) + minimum(0.5, p));
  }, a, b, c, p, q);
}

TEST_CASE("grad: where, comparisons, reductions") {
  KILN_TEST_RNG(rng);
  auto a = rnd<3>(rng, {2, 3, 4});
  auto b = rnd<2>(rng, {3, 4}, Layout::transposed);
  auto w = rnd<3>(rng, {2, 3, 4});
  check_grad("where/reduce", [](const auto& a, const auto& b, const auto& w) {
    auto r = sum(a, std::array{0, 2}, keepdim) * amax(a, 1, keepdim) + amin(a * w, std::array{1, 2}, keepdim) +
             sum(amax(b, 0)) * mean(a, 2, keepdim);
    return sum(where(a > b, a * w, b * b) + where(b < 0, 1.0, a)) + sum(r * r) + amax(a) + amin(b);
  }, a, b, w);
}

TEST_CASE("grad: movement (reshape, permute, slice, expand, concat, pad) and matmul") {
  KILN_TEST_RNG(rng);
  auto a = rnd<3>(rng, {2, 3, 4}, Layout::strided);
  auto b = rnd<2>(rng, {4, 5}, Layout::transposed);
  auto c = rnd<3>(rng, {1, 4, 5});
  auto d = rnd<2>(rng, {3, 1});
  auto w = rnd<2>(rng, {6, 4});
  check_grad("movement/matmul", [](const auto& a, const auto& b, const auto& c, const auto& d, const auto& w) {
    auto e = a * 1.0;                                  // an expression: views of it are view nodes
    auto r = reshape(e, Shape<2>{6, 4}) * w;           // reshape
    auto t = permute(e, {2, 0, 1});                    // permute [4, 2, 3]
    auto s1 = slice(e, 2, 1, 4), s2 = slice(e, 2, 0, 4, 3), s3 = slice(e, 1, 1, 3, 2);  // slices, strided
    auto x = expand(d * 1.0, Shape<3>{2, 3, 5});       // expand
    auto cat = concat(1, e, e * 2.0, slice(e, 1, 0, 1));  // concat [2, 7, 4]
    auto pd = pad(e * e, Shape<3>{0, 1, 2}, Shape<3>{1, 0, 1}, 0.5);
    auto mm = matmul(e, b) + matmul(e, c) * x;        // [2, 3, 5], batch broadcast in c
    auto m2 = matmul(transpose(b, 0, 1), transpose(reshape(e, Shape<2>{6, 4}), 0, 1));  // [5, 6]
    return sum(r * r) + sum(t * t * t) + sum(s1 * s1) + sum(s2 * 3.0) + sum(s3 * s3) + sum(cat * cat * cat) +
           sum(pd * pd) + sum(mm * mm) + sum(tanh(m2)) + sum(unsqueeze(d, 0) * x);
  }, a, b, c, d, w);
}

TEST_CASE("grad: composites (nn functions) against finite differences") {
  KILN_TEST_RNG(rng);
  auto x = rnd<2>(rng, {4, 6}, Layout::transposed);
  auto w = rnd<1>(rng, {6});
  auto b = rnd<1>(rng, {6});
  auto W = rnd<2>(rng, {5, 6});
  auto c = rnd<1>(rng, {5});
  auto y = rnd<2>(rng, {4, 5}, Layout::strided);
  auto target = Tensor<i64, 1>::from({1, 0, 4, 2});
  check_grad("composites", [&](const auto& x, const auto& w, const auto& b, const auto& W, const auto& c, const auto& y) {
    auto h = linear(x, W, c) + linear(x, W);  // W read through W.transpose(): a permutation view
    return sum(gelu(x) * w) + sum(gelu_tanh(x) * b) + sum(softmax(x, 1) * x) + sum(log_softmax(h, 1) * y) +
           sum(layer_norm(x, w, b) * x) + sum(rms_norm(x, w) * x) + cross_entropy(h, target) + mse_loss(h, y) +
           sum(silu(x) * sigmoid(x)) + sum(softplus(x * 12.0)) + sum(var(x, 1) * var(x, 1)) + sum(var(x, 0, 0) * w) +
           mean(relu(x) * x) + sum(std::get<0>(var_mean(h, 0)) * c);
  }, x, w, b, W, c, y);
}

// Losses over the rows of a flattened batch, `reshape(h, [b * t, v])` of a computed h: the
// reductions run on h itself (ir::Tracer::reduce_under_reshape), and so does the backward.
TEST_CASE("grad: losses over the rows of a reshape of a computed value (a flattened batch)") {
  KILN_TEST_RNG(rng);
  auto x = rnd<3>(rng, {2, 3, 5}, Layout::transposed);
  auto w = rnd<1>(rng, {5});
  auto b = rnd<1>(rng, {5});
  auto target = Tensor<i64, 1>::from({4, 0, 2, 1, 3, 0});
  check_grad("cross_entropy, layer_norm and softmax over reshape(x * w + b, [6, 5])", [&](const auto& x, const auto& w, const auto& b) {
    auto rows = reshape(x * w + b, std::array<int64_t, 2>{6, 5});
    return cross_entropy(rows, target) + sum(layer_norm(rows, w, b) * rows) + sum(softmax(rows, 1) * rows) + sum(sum(rows, 1) * sum(rows, 1));
  }, x, w, b);
}

TEST_CASE("grad: ties and zero-gradient rows match PyTorch exactly") {
  auto a = Tensor<f64, 2>::from({{1, 3, 3}, {2, 2, 2}});
  auto b = Tensor<f64, 2>::from({{1, 0, 3}, {5, 2, 0}});
  auto loss = sum(maximum(a, b) * 2.0) + sum(amax(a, 1) * 6.0) + sum(minimum(a, b)) + sum(floor(a) + sign(b));
  auto [ga, gb] = kiln::grad(loss, a, b);
  auto [l, GA, GB] = kiln::eval(loss, ga, gb);
  // maximum: ties half to each (x2 weight); amax: divided among ties (x6); minimum: ties half
  std::vector<double> want_a = {1 + 0 + 0.5, 2 + 3 + 0, 1 + 3 + 0.5, 0 + 2 + 1, 1 + 2 + 0.5, 2 + 2 + 0};
  std::vector<double> want_b = {1 + 0.5, 0 + 1, 1 + 0.5, 2 + 0, 1 + 0.5, 0 + 1};
  CHECK(GA.to_vector() == want_a);
  CHECK(GB.to_vector() == want_b);
  CHECK(l() == doctest::Approx(2 * (1 + 3 + 3 + 5 + 2 + 2) + 6 * (3 + 2) + (1 + 0 + 3 + 2 + 2 + 0) + (7 + 6) + (1 + 0 + 1 + 1 + 1 + 0)));
}

TEST_CASE("grad: cast rows, unused tensors, leaves seen through views") {
  auto x = Tensor<f64, 2>::from({{1, 2}, {3, 4}});
  auto unused = Tensor<f64, 1>::from({1, 2, 3});
  auto w = Tensor<f32, 2>::from({{0.5, 0.25}, {2, 4}});
  // cast back; x read directly, transposed (a permutation view of the same tensor) and through an expression
  auto loss = sum(cast<f64>(cast<f32>(x) * w)) + sum(x.transpose(0, 1) * x) + sum(transpose(x * 1.0, 0, 1) * 3.0);
  auto [gx, gu, gw] = kiln::grad(loss, x, unused, w);
  auto [l, GX, GU, GW] = kiln::eval(loss, gx, gu, gw);
  // d/dx sum(x^T * x) = x^T + x^T... element (i,j) appears as x_ij * x_ji twice: 2 x_ji
  CHECK(GX.to_vector() == std::vector<double>{0.5 + 2 + 3, 0.25 + 6 + 3, 2 + 4 + 3, 4 + 8 + 3});
  CHECK(GU.to_vector() == std::vector<double>{0, 0, 0});
  CHECK(GW.to_vector() == std::vector<double>{1, 2, 3, 4});
  CHECK(l() == doctest::Approx(0.5 + 0.5 + 6 + 16 + (1 + 6 + 6 + 16) + 30));
}

TEST_CASE("grad: Tensor views of a parameter (slice, strided slice, expand, compositions) give it their gradient") {
  KILN_TEST_RNG(rng);
  auto x = rnd<2>(rng, {5, 6});
  auto v = rnd<3>(rng, {3, 1, 4}, Layout::transposed);  // non-contiguous parameter
  auto w = rnd<2>(rng, {3, 6});
  check_grad("views", [&](const auto& x, const auto& v) {
    auto rows = x.slice(0, 1, 4);                                   // [3, 6], offset
    auto cols = x.slice(1, 1, 6, 2).transpose(0, 1);                // [3, 5], strided then permuted
    auto row2 = x.slice(0, 2, 3).expand(Shape<2>{4, 6});            // [4, 6]: a row repeated
    auto corner = x.slice(0, 3, 5).slice(1, 0, 6, 5);               // [2, 2], two dims sliced
    auto vv = v.expand(Shape<3>{3, 2, 4}).slice(2, 1, 4).permute({1, 2, 0});  // [2, 3, 3]
    return sum(tanh(rows) * w) + sum(cols * cols) + sum(exp(row2 * 0.5)) + sum(corner * 3.0) + sum(x * x) +
           sum(vv * vv * vv) + sum(v.slice(0, 2, 3) * x.slice(0, 0, 1).slice(1, 0, 4));
  }, x, v);
}

TEST_CASE("grad: a tensor not asked for gets no backward work") {
  KILN_TEST_RNG(rng);
  auto x = rnd<2>(rng, {8, 16});
  auto w = rnd<2>(rng, {16, 4});
  auto loss = sum(tanh(matmul(x, w)));
  auto [gw] = kiln::grad(loss, w);
  std::string plan = explain(Mode::fused, loss, gw);
  size_t matmuls = 0;
  for (size_t at = plan.find("matmul"); at != std::string::npos; at = plan.find("matmul", at + 1)) ++matmuls;
  auto [gx2, gw2] = kiln::grad(loss, x, w);
  std::string both = explain(Mode::fused, loss, gx2, gw2);
  size_t matmuls_both = 0;
  for (size_t at = both.find("matmul"); at != std::string::npos; at = both.find("matmul", at + 1)) ++matmuls_both;
  CHECK(matmuls < matmuls_both);  // x^T g only, not g w^T too
  MESSAGE("plan of loss + dW:\n" << plan);
}

// ---- a 2-layer MLP against a float64 derivation by hand ----
namespace {
struct MlpRef {
  double loss = 0;
  std::vector<double> dW1, db1, dW2, db2;
};
// logits = gelu(x W1^T + b1) W2^T + b2; loss = mean cross-entropy. Plain loops.
MlpRef mlp_by_hand(const std::vector<double>& x, const std::vector<double>& W1, const std::vector<double>& b1,
                   const std::vector<double>& W2, const std::vector<double>& b2, const std::vector<int64_t>& y, int N,
                   int D, int H, int C) {
  MlpRef r;
  r.dW1.assign(size_t(H * D), 0), r.db1.assign(size_t(H), 0), r.dW2.assign(size_t(C * H), 0), r.db2.assign(size_t(C), 0);
  for (int n = 0; n < N; ++n) {
    std::vector<double> h(static_cast<size_t>(H)), a(static_cast<size_t>(H)), z(static_cast<size_t>(C)),
        dz(static_cast<size_t>(C)), da(static_cast<size_t>(H), 0.0);
    for (int j = 0; j < H; ++j) {
      h[size_t(j)] = b1[size_t(j)];
      for (int k = 0; k < D; ++k) h[size_t(j)] += x[size_t(n * D + k)] * W1[size_t(j * D + k)];
      a[size_t(j)] = 0.5 * h[size_t(j)] * (1 + std::erf(h[size_t(j)] / std::sqrt(2.0)));
    }
    double m = -INFINITY, s = 0;
    for (int c = 0; c < C; ++c) {
      z[size_t(c)] = b2[size_t(c)];
      for (int j = 0; j < H; ++j) z[size_t(c)] += a[size_t(j)] * W2[size_t(c * H + j)];
      m = std::max(m, z[size_t(c)]);
    }
    for (int c = 0; c < C; ++c) s += std::exp(z[size_t(c)] - m);
    r.loss += (m + std::log(s) - z[size_t(y[size_t(n)])]) / N;
    for (int c = 0; c < C; ++c) dz[size_t(c)] = (std::exp(z[size_t(c)] - m) / s - (c == y[size_t(n)])) / N;
    for (int c = 0; c < C; ++c) {
      r.db2[size_t(c)] += dz[size_t(c)];
      for (int j = 0; j < H; ++j) {
        r.dW2[size_t(c * H + j)] += dz[size_t(c)] * a[size_t(j)];
        da[size_t(j)] += dz[size_t(c)] * W2[size_t(c * H + j)];
      }
    }
    for (int j = 0; j < H; ++j) {
      double dh = da[size_t(j)] * ref::gelu_grad(h[size_t(j)]);
      r.db1[size_t(j)] += dh;
      for (int k = 0; k < D; ++k) r.dW1[size_t(j * D + k)] += dh * x[size_t(n * D + k)];
    }
  }
  return r;
}
void close_all(const std::string& what, const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  size_t wrong = 0;
  std::string first;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= 1e-12 + 1e-10 * std::fabs(want[i])) && ++wrong <= 4)
      first += " [" + std::to_string(i) + "] kiln " + fmt(got[i]) + ", by hand " + fmt(want[i]) + ";";
  if (wrong) FAIL_CHECK(what << ": " << wrong << " of " << got.size() << " wrong:" << first << " (seed " << current_seed() << ")");
}
}  // namespace

TEST_CASE("grad: 2-layer MLP against a float64 hand derivation, one fused plan") {
  KILN_TEST_RNG(rng);
  const int N = 16, D = 12, H = 20, C = 5;
  auto x = input<f64, 2>(rng, {N, D}, Layout::contiguous, Values{-1, 1});
  auto W1 = input<f64, 2>(rng, {H, D}, Layout::contiguous, Values{-0.5, 0.5});
  auto b1 = input<f64, 1>(rng, {H}, Layout::contiguous, Values{-0.1, 0.1});
  auto W2 = input<f64, 2>(rng, {C, H}, Layout::transposed, Values{-0.5, 0.5});  // non-contiguous parameter
  auto b2 = input<f64, 1>(rng, {C}, Layout::contiguous, Values{-0.1, 0.1});
  std::vector<int64_t> y(N);
  for (auto& v : y) v = rng.integer(0, C - 1);
  std::vector<double> yd(y.begin(), y.end());
  auto target = Tensor<i64, 1>::from({N}, yd);

  auto loss = cross_entropy(linear(gelu(linear(x.t, W1.t, b1.t)), W2.t, b2.t), target);
  auto [gW1, gb1, gW2, gb2] = kiln::grad(loss, W1.t, b1.t, W2.t, b2.t);
  auto [l, dW1, db1, dW2, db2] = kiln::eval(loss, gW1, gb1, gW2, gb2);
  MlpRef r = mlp_by_hand(x.a.v, W1.a.v, b1.a.v, W2.a.v, b2.a.v, y, N, D, H, C);
  CHECK(l() == doctest::Approx(r.loss).epsilon(1e-12));
  close_all("dW1", dW1.to_vector(), r.dW1);
  close_all("db1", db1.to_vector(), r.db1);
  close_all("dW2", dW2.to_vector(), r.dW2);
  close_all("db2", db2.to_vector(), r.db2);
  // Saved for the backward: gelu's output (the second matmul's operand, in memory anyway),
  // gelu's derivative at u = x W1^T + b1 (one value: the tracer factors the cotangent out of
  // the rule's two terms), which the first GEMM's epilogue stores beside gelu's output where it
  // computes erf anyway, and the logits, not the matmul outputs: a matmul output that only its
  // epilogue reads costs a write to save, as any other value; the backward computes no erf.
  auto mem = explain_memory(loss, gW1, gb1, gW2, gb2);
  auto count = [](const std::vector<sched::MemoryReport::Value>& vs, const std::string& op, std::vector<int64_t> shape) {
    return std::count_if(vs.begin(), vs.end(), [&](const auto& v) { return v.op == op && v.shape == shape; });
  };
  CHECK(count(mem.saved, "matmul", {N, H}) == 0);
  CHECK(count(mem.saved, "matmul", {N, C}) == 0);
  CHECK(count(mem.saved, "mul", {N, H}) == 1);  // gelu(u)
  CHECK(count(mem.saved, "add", {N, H}) == 1);  // gelu'(u)
  CHECK(count(mem.saved, "add", {N, C}) == 1);  // the logits
  CHECK(count(mem.saved, "erf", {N, H}) == 0);
  CHECK(count(mem.recomputed, "erf", {N, H}) == 0);
  MESSAGE(mem.str());
  size_t kernels = kernel_count(Mode::fused, loss, gW1, gb1, gW2, gb2);
  const std::string plan = explain(Mode::fused, loss, gW1, gb1, gW2, gb2);
  MESSAGE("MLP forward + backward: " << kernels << " kernels in one plan\n" << plan);
  CHECK(kernels <= 14);
  const std::string first = plan.substr(0, plan.find('\n'));  // the first kernel: x W1^T and its epilogue
  CHECK(first.find("(matmul %") != std::string::npos);
  for (const auto& v : mem.saved)  // gelu(u) and gelu'(u), both stored there
    if (v.shape == std::vector<int64_t>{N, H}) CHECK(first.find("%" + std::to_string(v.node) + ":" + v.op) != std::string::npos);
}

TEST_CASE("grad: the tracer factors the cotangent out of a rule's products, so the backward reads one forward value") {
  KILN_TEST_RNG(rng);
  const int64_t M = 9, N = 7;
  auto x = input<f64, 2>(rng, {M, N}, Layout::contiguous, Values{-1, 1});
  auto w = input<f64, 2>(rng, {M, N}, Layout::transposed, Values{-1, 1});
  // d/dx sum(x exp(x) w) = g w exp(x) + g x exp(x) w, g the cotangent: two products of g,
  // read as g (w exp(x) + x exp(x) w); the finite differences check the rewritten sum.
  auto f = [](const auto& x, const auto& w) { return sum(x * kiln::exp(x) * w); };
  check_grad("sum(x * exp(x) * w)", f, x.t, w.t);
  auto loss = f(x.t, w.t);
  auto [gx] = kiln::grad(loss, x.t);
  auto mem = explain_memory(loss, gx);
  MESSAGE(mem.str());
  // What the rule reads from the forward: that one sum, not exp(x), x and w apart.
  CHECK(mem.naive_bytes == M * N * 8);
  // Saving it (a write and a read) moves the bytes that reading x and w again would; it is
  // saved, so that the backward computes no exp.
  REQUIRE(mem.saved.size() == 1);
  CHECK(mem.saved[0].op == "add");
  CHECK(mem.recomputed.empty());
  auto [l, G] = kiln::eval(loss, gx);
  Array got = read(G);
  for (size_t i = 0; i < got.v.size(); ++i)
    CHECK(got.v[i] == doctest::Approx(w.a.v[i] * std::exp(x.a.v[i]) * (1 + x.a.v[i])).epsilon(1e-13));
}

TEST_CASE("grad: a full reduction's gradient reaches its operand by value; a mean loss's gradient joins the GEMM it reads") {
  KILN_TEST_RNG(rng);
  const int64_t M = 9, K = 6, H = 11;
  auto x = rnd<2>(rng, {M, K}), W1 = rnd<2>(rng, {K, H}, Layout::transposed), W2 = rnd<2>(rng, {H, K});
  auto b1 = rnd<1>(rng, {H}), b2 = rnd<1>(rng, {K});
  // W4's step (bench/w4.hpp): y = gelu(x @ W1 + b1) @ W2 + b2, loss = mean(y^2).
  auto mlp = [](const auto& x, const auto& W1, const auto& b1, const auto& W2, const auto& b2) {
    auto y = matmul(gelu(matmul(x, W1) + b1), W2) + b2;
    return mean(y * y);
  };
  check_grad("mean((gelu(x @ W1 + b1) @ W2 + b2)^2)", mlp, x, W1, b1, W2, b2);
  check_grad("sum over every dim, then a scalar op", [](const auto& a) { return exp(sum(a * a) * 0.01); }, x);
  // The loss's gradient 2 y / numel is a scalar broadcast into y's shape: computed where it is
  // read (no kernel stores it for another to load through a view), so dy joins y's GEMM as a
  // second output of its epilogue. The loss's scale 1 / numel runs on the sum before the reshape
  // that drops its dims (ir::Tracer::sink_reshape), in the sum's kernel. Nine kernels: six GEMMs,
  // the loss (one rows kernel), the two bias gradients' column sums; no pointwise kernel, no
  // separate dy.
  auto loss = mlp(x, W1, b1, W2, b2);
  auto [gx, gW1, gb1, gW2, gb2] = kiln::grad(loss, x, W1, b1, W2, b2);
  std::string plan = explain(Mode::fused, loss, gx, gW1, gb1, gW2, gb2);
  CAPTURE(plan);
  CHECK(kernel_count(Mode::fused, loss, gx, gW1, gb1, gW2, gb2) == 9);
  CHECK(occurrences(plan, "(matmul") == 6);
  CHECK(occurrences(plan, "(pointwise)") == 0);
  CHECK(occurrences(plan, "(rows)") == 3);
  // A classifier's step: cross_entropy is a mean over the batch of per-row sums, so its
  // gradient goes back through two reshapes (of a scalar, then of a broadcast of it). No
  // kernel stores a broadcast scalar: ten kernels (six GEMMs, log_softmax forward and
  // backward in one rows kernel, the batch mean (its sum and scale in one rows kernel), the bias
  // gradients); thirteen when the reshapes were views, eleven when the scale was a kernel of its own.
  std::vector<double> labels(static_cast<size_t>(M));
  for (int64_t i = 0; i < M; ++i) labels[size_t(i)] = double(rng.integer(0, K - 1));
  auto target = Tensor<i64, 1>::from({M}, labels);
  auto classify = [&](const auto& x, const auto& W1, const auto& b1, const auto& W2, const auto& b2) {
    return cross_entropy(matmul(relu(matmul(x, W1) + b1), W2) + b2, target);
  };
  check_grad("cross_entropy(relu(x @ W1 + b1) @ W2 + b2, target)", classify, x, W1, b1, W2, b2);
  auto ce = classify(x, W1, b1, W2, b2);
  auto [cx, cW1, cb1, cW2, cb2] = kiln::grad(ce, x, W1, b1, W2, b2);
  std::string ce_plan = explain(Mode::fused, ce, cx, cW1, cb1, cW2, cb2);
  CAPTURE(ce_plan);
  for (size_t at = ce_plan.find("kernel "); at != std::string::npos; at = ce_plan.find("kernel ", at + 1)) {
    std::string line = ce_plan.substr(at, ce_plan.find('\n', at) - at);
    CHECK(line.find(":expand") == std::string::npos);
  }
  CHECK(kernel_count(Mode::fused, ce, cx, cW1, cb1, cW2, cb2) == 10);
}

// ---- save or recompute: the plan's backward loads the cheapest set of forward values ----
TEST_CASE("grad: a pointwise value is saved when recomputing it reads more bytes") {
  KILN_TEST_RNG(rng);
  const int64_t M = 9, N = 7;
  auto a = rnd<2>(rng, {M, N}), b = rnd<2>(rng, {M, N}), c = rnd<2>(rng, {M, N}), d = rnd<2>(rng, {M, N});
  auto w = rnd<2>(rng, {M, N});
  auto value = [](const Tensor<f64, 2>& t, int64_t i) { return double(t(i / t.size(1), i % t.size(1))); };  // any device
  auto by_op = [](const sched::MemoryReport& m, const std::string& op) {
    return std::count_if(m.saved.begin(), m.saved.end(), [&](const auto& v) { return v.op == op; });
  };
  {  // d/dw sum((a*b + c*d) * w) reads a*b + c*d: saving it moves 2 MN values, recomputing it 4 MN
    auto loss = sum((a * b + c * d) * w);
    auto [gw] = kiln::grad(loss, w);
    auto mem = explain_memory(loss, gw);
    CHECK(by_op(mem, "add") == 1);
    CHECK(by_op(mem, "input") == 0);
    CHECK(mem.saved_bytes == M * N * 8);
    std::string plan = explain(Mode::fused, loss, gw);
    CHECK(plan.find("%" + std::to_string(mem.saved[0].node) + ":add") != std::string::npos);  // a kernel stores it
    auto [l, GW] = kiln::eval(loss, gw);
    auto got = GW.to_vector();
    for (int64_t i = 0; i < M * N; ++i)
      CHECK(got[size_t(i)] == doctest::Approx(value(a, i) * value(b, i) + value(c, i) * value(d, i)).epsilon(1e-14));
  }
  {  // d/dw sum(a*b * w) reads a*b: recomputing it from a and b moves no more than saving it
    auto loss = sum(a * b * w);
    auto [gw] = kiln::grad(loss, w);
    auto mem = explain_memory(loss, gw);
    CHECK(by_op(mem, "input") == 2);
    CHECK(by_op(mem, "mul") == 0);
    CHECK(mem.recomputed.size() == 1);
    auto [l, GW] = kiln::eval(loss, gw);
    auto got = GW.to_vector();
    for (int64_t i = 0; i < M * N; ++i) CHECK(got[size_t(i)] == doctest::Approx(value(a, i) * value(b, i)).epsilon(1e-14));
  }
  // finite differences through a plan that saves a pointwise value (exp's operand or exp itself)
  check_grad("saved pointwise", [&](const auto& w) { return sum(exp(a * b + c * d) * w) + sum(w * w * w); }, w);
  CHECK(explain_memory(sum(exp(a * b + c * d) * w), std::get<0>(kiln::grad(sum(exp(a * b + c * d) * w), w))).saved_bytes ==
        M * N * 8);
}
