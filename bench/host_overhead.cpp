// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Host cost of a compiled call on a cache hit, on the CPU backend: `x + 1` on one
// element through kiln::compile, back to back, against a direct call of the same
// compiled kernel (the CPU's "bare launch"). The difference is kiln's own work per
// call: trace, plan slot, bind, variant lookup, output allocation. Also the stages
// one by one, so a regression shows where it came from. Then the GPU backend's share
// of a call without a GPU: GpuBackend::run over a device API whose launch records
// nothing (tests/support/fake_gpu.hpp: warp 32, sm_90, 132 SMs): the variant choice,
// program lookup, launch shape and argument block the H200's figure includes.
//   build/bench/host_overhead [calls]
#include <kiln/kiln.hpp>
#include <kiln/runtime/eval.hpp>

#include "../tests/support/fake_gpu.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

using namespace kiln;
using Clock = std::chrono::steady_clock;

// Median over 7 rounds of the wall time per call (ns) of n back-to-back calls.
template <class F>
static double ns_per_call(F&& fn, int n) {
  for (int i = 0; i < n / 10 + 10; ++i) fn();
  std::vector<double> per;
  for (int r = 0; r < 7; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) fn();
    per.push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / n);
  }
  std::sort(per.begin(), per.end());
  return per[per.size() / 2];
}

int main(int argc, char** argv) {
  int n = argc > 1 ? std::atoi(argv[1]) : 200000;
  Tensor<f32, 1> x = Tensor<f32, 1>::from(Shape<1>{1}, std::vector<double>{0.5}, cpu());
  auto f = compile([](const Tensor<f32, 1>& a) { return a + 1.0f; });
  Tensor<f32, 1> y = f(x);  // compiles (or a disk hit)
  if (y.to_vector()[0] != 1.5) {
    std::printf("host_overhead: wrong result %g\n", y.to_vector()[0]);
    return 1;
  }

  // The compiled kernel itself, called with the arguments kiln bound for it.
  ir::Graph g = ir::trace(x + 1.0f);
  auto cp = runtime::plan_for(g, Mode::fused);
  runtime::Bound b = runtime::bind_buffers(g, cp->plan);
  std::vector<runtime::KernelArgs> args{runtime::bind_kernel(g, cp->plan.kernels[0], cp->layouts[0], b)};
  runtime::CpuKernelFn fn = cp->variants.begin()->second->fns[0];
  auto& a = args[0];
  double bare = ns_per_call([&] { fn(a.ptrs.data(), a.meta.data(), a.words.data()); }, n);

  auto c0 = counters();
  double call = ns_per_call([&] { Tensor<f32, 1> o = f(x); }, n);
  auto c1 = counters();
  double trace = ns_per_call([&] { ir::Graph t = ir::trace(x + 1.0f); }, n);
  double plan = ns_per_call([&] { auto p = runtime::plan_for(g, Mode::fused); }, n);
  double bind = ns_per_call([&] { runtime::Bound bb = runtime::bind_buffers(g, cp->plan); }, n);
  double kargs = ns_per_call([&] { auto k = runtime::bind_kernel(g, cp->plan.kernels[0], cp->layouts[0], b); }, n);

  std::printf("CPU host overhead, x + 1 on one f32 element, compiled, cache hit (median of 7 x %d calls):\n", n);
  std::printf("  compiled call          %8.0f ns\n", call);
  std::printf("  bare kernel call       %8.0f ns\n", bare);
  std::printf("  kiln's own work        %8.0f ns per call\n", call - bare);
  std::printf("  of which (alone): trace %.0f ns, plan lookup %.0f ns, bind buffers %.0f ns, bind kernel %.0f ns\n", trace,
              plan, bind, kargs);
  std::printf("  per call: compiles %.3f, kernels launched %.3f\n", double(c1.compiles - c0.compiles) / (8.0 * n),
              double(c1.kernels_launched - c0.kernels_launched) / (7.0 * n + n / 10 + 10));

  // The GPU path of the same call: evaluate's steps with GpuBackend<FakeGpuApi>::run.
  test::FakeGpuBackend gpu;
  runtime::PlanSlot slot;
  Mode gpu_mode = Mode::fused;
  auto gpu_compiled = [&] {
    ir::Graph t = ir::trace(x + 1.0f);
    runtime::CompiledPlan& p = slot.get(t, gpu_mode);
    runtime::Bound bb = runtime::bind_buffers(t, p.plan);
    gpu.run(t, p, bb);
    Tensor<f32, 1> o = runtime::output_tensor<f32, 1>(t, bb, t.outputs[0]);
  };
  gpu_compiled();  // the program's one load
  double gpu_call_ns = ns_per_call(gpu_compiled, n);
  gpu_mode = Mode::reduce_overhead;  // the fake graph: built once, then a replay that records nothing
  gpu_compiled();
  double gpu_graph_ns = ns_per_call(gpu_compiled, n);
  double gpu_run = ns_per_call([&] { gpu.run(g, *cp, b); }, n);
  runtime::GpuCall gc = runtime::gpu_call(g, *cp, b, 32, 90, 132);
  double variants = ns_per_call([&] { auto c = runtime::gpu_call(g, *cp, b, 32, 90, 132); }, n);
  double key = ns_per_call([&] { auto k = runtime::variant_key(gc.vars); }, n);
  std::vector<uint64_t> block;
  double arg_block = ns_per_call(
      [&] { runtime::gpu_arg_block(cp->layouts[0], gc.args[0], gc.vars[0], nullptr, nullptr, block); }, n);
  std::printf("GPU path without a device (fake API: launches record nothing):\n");
  std::printf("  compiled call, GPU backend  %8.0f ns (trace, plan slot, bind buffers, run, output)\n", gpu_call_ns);
  std::printf("  the same, reduce-overhead   %8.0f ns (the launch a graph replay: arguments compared with the graph's)\n", gpu_graph_ns);
  std::printf("  GpuBackend::run alone       %8.0f ns\n", gpu_run);
  std::printf("  of which (alone): bind kernel + variant (gpu_call) %.0f ns, variant key %.0f ns, argument block %.0f ns\n",
              variants, key, arg_block);
}
