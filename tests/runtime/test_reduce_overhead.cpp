// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Mode::reduce_overhead on the default device (gpu-foundation: the GPU, where the call's
// kernels run as one CUDA graph; on the CPU the mode is fused mode and makes no graph):
// fused mode's numbers against float64, over shapes and layouts; a graph built once per
// set of launch shapes and replayed by every later call; new inputs update the graph's
// nodes rather than rebuild it; an earlier call's outputs are never overwritten by a
// later call; a training step in the mode follows the fused one step for step.
#include "../support/reference.hpp"
#include "kiln/nn/modules.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {

// Whether this process launches reduce-overhead calls as graphs: a CUDA device whose driver has them.
bool graphs_here() { return default_device().kind == DeviceKind::cuda && cu::CudaGraph::supported(); }

// y = softmax(relu(x @ w + b)) over rows, and s = the column sums of x * 2: a GEMM with
// its epilogue, a rows kernel, a column-sum kernel.
auto layer(const Tensor<f32, 2>& x, const Tensor<f32, 2>& w, const Tensor<f32, 1>& b) {
  return std::tuple(softmax(relu(matmul(x, w) + b), -1), sum(x * 2.0f, 0));
}

struct Want {
  Array y, s, y_scale, s_scale;
};
Want reference(const Array& x, const Array& w, const Array& b) {
  Array scale;
  Array pre = ref::zip(ref::matmul(x, w, &scale), b, [](double p, double q) { return p + q; });
  Array y = ref::softmax(ref::map(pre, [](double v) { return v > 0 ? v : 0.0; }), 1);
  // softmax's output moves with its logits' rounding (relative to the dot products' magnitude).
  Array y_scale = ref::zip(y, ref::zip(scale, b, [](double p, double q) { return p + std::fabs(q); }),
                           [](double p, double q) { return p * (1 + 4 * q); });
  Array s = ref::sum(ref::map(x, [](double v) { return 2 * v; }), {0});
  // A column's sum cancels: its rounding is relative to the sum of magnitudes.
  Array s_scale = ref::sum(ref::map(x, [](double v) { return 2 * std::fabs(v); }), {0});
  return {y, s, y_scale, s_scale};
}

// W4's step (bench/w4.hpp) on x [M, K], W1 [K, H], W2 [H, K]. run(mode): the loss and the
// five gradients' values.
struct W4Step {
  Input<bf16, 2> x, W1, W2;
  Input<bf16, 1> b1, b2;
  W4Step(Rng& rng, int64_t M, int64_t K, int64_t H)
      : x(input<bf16, 2>(rng, Shape<2>{M, K})), W1(input<bf16, 2>(rng, Shape<2>{K, H})), W2(input<bf16, 2>(rng, Shape<2>{H, K})),
        b1(input<bf16, 1>(rng, Shape<1>{H})), b2(input<bf16, 1>(rng, Shape<1>{K})) {}
  std::vector<std::vector<double>> run(Mode mode) const {
    auto yf = cast<f32>(matmul(gelu(matmul(x.t, W1.t) + b1.t), W2.t) + b2.t);
    auto loss = mean(yf * yf);
    auto [gx, gW1, gb1, gW2, gb2] = kiln::grad(loss, x.t, W1.t, b1.t, W2.t, b2.t);
    auto out = evaluate(mode, loss, gx, gW1, gb1, gW2, gb2);
    std::vector<std::vector<double>> values;
    std::apply([&](const auto&... t) { (values.push_back(t.to_vector()), ...); }, out);
    return values;
  }
};

}  // namespace

TEST_CASE("reduce-overhead: fused mode's numbers; one graph, replayed, updated for new inputs, rebuilt for new sizes") {
  KILN_TEST_RNG(rng);
  const bool graphs = graphs_here();
  auto w = input<f32, 2>(rng, Shape<2>{300, 129}, Layout::transposed);
  auto b = input<f32, 1>(rng, Shape<1>{129});
  auto run = [&](const Tensor<f32, 2>& x) {
    auto [y, s] = layer(x, w.t, b.t);
    return evaluate(Mode::reduce_overhead, y, s);
  };
  auto check = [&](const auto& got, const Input<f32, 2>& x, const std::string& what) {
    Want want = reference(x.a, w.a, b.a);
    check_close(std::get<0>(got), want.y, tol<f32>(), what + ": softmax(relu(x @ w + b))", &want.y_scale);
    check_close(std::get<1>(got), want.s, tol<f32>().scaled(4), what + ": sum(x * 2, 0)", &want.s_scale);
  };
  auto x1 = input<f32, 2>(rng, Shape<2>{61, 300});
  auto c0 = counters();
  auto first = run(x1.t);
  auto c1 = counters();
  check(first, x1, "first call");
  const uint64_t kernels = c1.kernels_launched - c0.kernels_launched;
  CHECK(kernels >= 2);
  CHECK(c1.graphs_built - c0.graphs_built == (graphs ? 1u : 0u));
  CHECK(c1.graph_replays - c0.graph_replays == (graphs ? 1u : 0u));

  // Repeat calls: the graph replays (the same kernels counted), nothing compiled or rebuilt.
  for (int i = 0; i < 3; ++i) check(run(x1.t), x1, "repeat call " + std::to_string(i));
  auto c2 = counters();
  CHECK(c2.compiles == c1.compiles);
  CHECK(c2.plans_built == c1.plans_built);
  CHECK(c2.graphs_built == c1.graphs_built);
  CHECK(c2.graph_replays - c1.graph_replays == (graphs ? 3u : 0u));
  CHECK(c2.kernels_launched - c1.kernels_launched == 3 * kernels);

  // Another input of the same shape: its nodes are updated, the graph is not rebuilt; the
  // first call's outputs still hold the first input's values.
  auto x2 = input<f32, 2>(rng, Shape<2>{61, 300});
  auto second = run(x2.t);
  auto c3 = counters();
  check(second, x2, "another input");
  CHECK(c3.graphs_built == c2.graphs_built);
  if (graphs) CHECK(c3.graph_updates > c2.graph_updates);
  check(first, x1, "the first call's outputs after later calls");

  // Other sizes and layouts (a size-1 dim, odd sizes, a transposed view of x): each the
  // right numbers; a changed launch shape builds the graph again.
  for (auto [rows, layout] : {std::pair{1, Layout::contiguous}, std::pair{7, Layout::transposed}, std::pair{517, Layout::contiguous}}) {
    auto x = input<f32, 2>(rng, Shape<2>{rows, 300}, layout);
    auto before = counters();
    check(run(x.t), x, std::to_string(rows) + " rows, " + name(layout));
    if (graphs) CHECK(counters().graph_replays == before.graph_replays + 1);
  }
  if (graphs) CHECK(counters().graphs_built > c3.graphs_built);
  check(run(x1.t), x1, "back to the first shape");
}

TEST_CASE("reduce-overhead: a training step (loss, gradients, AdamW) follows fused mode's step for step") {
  auto make = [] { return nn::GeluMLP(12, 33, 5, 11); };
  nn::GeluMLP fused = make(), graphed = make();
  auto x = Tensor<f32, 2>(randn<f32>(Shape<2>{17, 12}, 7));
  auto y = Tensor<i64, 1>::from({17}, {0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1});
  nn::AdamW of(fused.params(), 1e-2), og(graphed.params(), 1e-2, 1e-2, 0.9, 0.999, 1e-8, Mode::reduce_overhead);
  auto c0 = counters();
  double first = 0, last = 0;
  for (int s = 0; s < 12; ++s) {
    CAPTURE(s);
    double lf = of.step(nn::cross_entropy(fused(x), y));
    double lg = og.step(nn::cross_entropy(graphed(x), y));
    CHECK(lg == doctest::Approx(lf).epsilon(1e-6));
    if (s == 0) first = lg;
    last = lg;
  }
  CHECK(last < first);
  // The step's graph is built once: the step count (Adam's bias correction) and the new
  // outputs change node arguments, not launch shapes.
  if (graphs_here()) {
    CHECK(counters().graphs_built - c0.graphs_built == 1);
    CHECK(counters().graph_replays - c0.graph_replays == 12);
  }
  auto a = graphed.fc1.weight.to_vector(), b = fused.fc1.weight.to_vector();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-6));
}

TEST_CASE("reduce-overhead: a bf16 GEMM big enough for the copy-engine kernel (wgmma, clusters on an H200) equals fused mode bit for bit") {
  KILN_TEST_RNG(rng);
  // 4096 x 4096 over K = 128: 512 tiles of 128 x 256, the clustered persistent wgmma config on
  // sm_90; its tensor maps are kernel parameters the graph's node copies.
  auto x = input<bf16, 2>(rng, Shape<2>{4096, 128}), w = input<bf16, 2>(rng, Shape<2>{128, 4096});
  auto b = input<bf16, 1>(rng, Shape<1>{4096});
  auto e = [&] { return gelu(matmul(x.t, w.t) + b.t); };
  Tensor<bf16, 2> fused = evaluate(Mode::fused, e());
  auto c0 = counters();
  Tensor<bf16, 2> graphed = evaluate(Mode::reduce_overhead, e()), again = evaluate(Mode::reduce_overhead, e());
  if (graphs_here()) {
    CHECK(counters().graphs_built - c0.graphs_built == 1);
    CHECK(counters().graph_replays - c0.graph_replays == 2);
  }
  auto f = fused.to_vector(), g = graphed.to_vector(), a = again.to_vector();
  CHECK(g == f);
  CHECK(a == f);
  // And against float64 at sampled elements (the whole product is 2 G multiply-adds).
  for (int i = 0; i < 64; ++i) {
    const int64_t r = rng.integer(0, 4095), c = rng.integer(0, 4095);
    double dot = 0, mag = 0;
    for (int64_t k = 0; k < 128; ++k) {
      double p = x.a.at({r, k}) * w.a.at({k, c});
      dot += p, mag += std::fabs(p);
    }
    const double pre = dot + b.a.at({c}), want = ref::gelu(pre);
    CAPTURE(r);
    CAPTURE(c);
    // f32 sums and epilogue (gelu's slope is at most 1.13), then one rounding to bf16 (2^-9).
    CHECK(std::fabs(double(f[size_t(r * 4096 + c)]) - want) <= 2e-5 * (mag + std::fabs(b.a.at({c}))) + 4e-3 * std::fabs(want) + 1e-6);
  }
}

TEST_CASE("kernel overlap: a large training step's kernels on two streams (and a graph's branches), and its leaves on a third "
          "(kiln::idle_fill), give one stream's numbers bit for bit") {
  if (default_device().kind != DeviceKind::cuda) {
    MESSAGE("not a CUDA device: kernel overlap is the GPU backends' (a CPU plan runs its kernels in turn): skipped");
    return;
  }
  KILN_TEST_RNG(rng);
  // Each GEMM and the [M, H] kernels large enough to overlap (runtime::StreamSchedule): the
  // backward's five kernels after dh read nothing of each other.
  const W4Step step(rng, 2048, 2048, 4096);
  auto run = [&](Mode mode, bool overlap, bool fill = false) {
    set_kernel_overlap(overlap), set_idle_fill(fill);
    auto c0 = counters();
    std::vector<std::vector<double>> values;
    for (int call = 0; call < 2; ++call) {  // back to back: the leaves' workspace reused by the next call
      auto v = step.run(mode);
      values.insert(values.end(), v.begin(), v.end());
    }
    const uint64_t overlapped = counters().kernels_overlapped - c0.kernels_overlapped;
    const uint64_t filling = counters().kernels_filling - c0.kernels_filling;
    set_kernel_overlap(true), set_idle_fill(false);
    return std::tuple{values, overlapped, filling};
  };
  // The step's leaves: db1, db2 and the loss's sum, which on sm_90 y's wgmma GEMM computes instead
  // (kiln::gemm_totals, on by default): each of them once a call, twice in all.
  const bool loss_in_gemm = gemm_totals() && cu::cuda_device(default_device().index).properties().cc_major >= 9;
  const uint64_t leaves = loss_in_gemm ? 2 : 3;
  const auto [alone, none, none_filling] = run(Mode::fused, false);
  CHECK(none == 0);
  CHECK(none_filling == 0);
  CHECK(std::isfinite(alone[0][0]));
  CHECK(alone[0][0] > 0);
  for (Mode mode : {Mode::fused, Mode::reduce_overhead})
    for (bool fill : {false, true}) {
      CAPTURE(int(mode));
      CAPTURE(fill);
      const auto [beside, overlapped, filling] = run(mode, true, fill);
      CHECK(overlapped >= 2);
      CHECK(filling == (fill ? 2 * leaves : 0u));
      REQUIRE(beside.size() == alone.size());
      for (size_t i = 0; i < alone.size(); ++i) {
        CAPTURE(i);
        CHECK(beside[i] == alone[i]);
      }
    }
}

TEST_CASE("programmatic launch: kernels that start before the kernel before them ends give plain launches' numbers bit for bit") {
  if (default_device().kind != DeviceKind::cuda) {
    MESSAGE("not a CUDA device: programmatic launch is CUDA's (sm_90 and later): skipped");
    return;
  }
  const bool sm90 = cu::cuda_device(default_device().index).properties().cc_major >= 9;
  if (!sm90) MESSAGE("an older GPU than sm_90: every launch stays plain (checked)");
  KILN_TEST_RNG(rng);
  // W4's step at a size of small kernels (a call of large ones launches plainly: runtime::
  // StreamSchedule::early), still a few waves of blocks each: in eager mode a chain of dozens
  // of kernels, each reading the one before (rows kernels with split rows and their counters
  // among them), in fused mode 9, in reduce-overhead those 9 as a graph with programmatic edges.
  const W4Step step(rng, 1024, 1024, 1024);
  struct On {
    ~On() { set_programmatic_launch(true); }  // kiln's default
  } restore;
  auto run = [&](Mode mode, bool early) {
    set_programmatic_launch(early);
    auto c0 = counters();
    std::vector<std::vector<double>> values;
    for (int call = 0; call < 3; ++call) {  // back to back: each call's first kernel after the last one's
      auto v = step.run(mode);
      values.insert(values.end(), v.begin(), v.end());
    }
    const uint64_t started_early = counters().kernels_programmatic - c0.kernels_programmatic;
    const uint64_t launched = counters().kernels_launched - c0.kernels_launched;
    return std::tuple{values, started_early, launched};
  };
  for (Mode mode : {Mode::eager, Mode::fused, Mode::reduce_overhead}) {
    CAPTURE(int(mode));
    const auto [plain, none, n0] = run(mode, false);
    CHECK(none == 0);
    const auto [early, started_early, n1] = run(mode, true);
    CHECK(n1 == n0);
    if (mode != Mode::reduce_overhead) CHECK(started_early == (sm90 ? n1 : 0));
    // a graph: every node but the first, where the driver has programmatic edges
    else if (sm90 && cu::driver().cuGraphAddDependencies && cu::CudaGraph::supported()) CHECK(started_early == n1 - 3);
    else CHECK(started_early == 0);
    REQUIRE(early.size() == plain.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      CAPTURE(i);
      CHECK(std::isfinite(plain[i][0]));
      CHECK(early[i] == plain[i]);
    }
  }
}
