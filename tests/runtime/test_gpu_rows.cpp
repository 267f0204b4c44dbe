// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The GPU rows strategies (runtime/gpu_backend.hpp, codegen/gpu.hpp): several short
// rows per warp, a warp per row, a block per row (kept in registers), and split rows (few long rows of a one-pass
// reduction: several blocks per row, the last one combines the partials).
//   * anywhere (the cpu suite, and gpu-foundation on the default GPU): the shapes
//     that pick each strategy against float64 references, twice (a split kernel
//     resets its counters for the next launch), one kernel each;
//   * nvrtc / hiprtc (no GPU): which strategy each shape gets, and the programs
//     compile for sm_80, sm_90, gfx90a (wave64) and gfx1030 (wave32);
//   * gpu: the same numbers on kiln::cuda(0).
#include "../support/gpu_program.hpp"
#include "../support/reference.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {

template <class DT, int R>
Tensor<DT, R> on(Device d, const Tensor<DT, R>& t) {
  return t.device() == d ? t : t.to(d);
}

// sum, amax and mean over the last dim of a random [rows, n] operand in layout `l`, on
// device `d`, twice: the same numbers both times, within the float64 reference's bounds.
void check_row_reductions(Device d, int64_t rows, int64_t n, Layout l) {
  KILN_TEST_RNG(rng);
  auto in = input<f32, 2>(rng, Shape<2>{rows, n}, l);
  auto x = on(d, in.t);
  std::string what = "[" + std::to_string(rows) + ", " + std::to_string(n) + "] " + name(l) + " on " + d.str();
  CAPTURE(what);
  Array s = ref::sum(in.a, {1}), scale = ref::abs_sum(in.a, {1}), m = ref::amax(in.a, {1});
  Array mean = ref::map(s, [&](double v) { return v / double(n); });
  Array mean_scale = ref::map(scale, [&](double v) { return v / double(n); });
  auto c0 = counters();
  auto [s1, m1] = eval(sum(x, -1), amax(x, -1));
  auto c1 = counters();
  CHECK(c1.kernels_launched - c0.kernels_launched == 1);  // both reductions in one kernel
  auto [s2, m2] = eval(sum(x, -1), amax(x, -1));
  auto c2 = counters();
  CHECK(c2.compiles == c1.compiles);
  Tensor<f32, 1> a1 = kiln::mean(x, -1), a2 = kiln::mean(x, -1);
  check_close(s1, s, tol<f32>(), "sum " + what, &scale);
  check_close(m1, m, Tol{0, 0}, "amax " + what);
  check_close(a1, mean, tol<f32>(), "mean " + what, &mean_scale);
  CHECK(read(s2).v == read(s1).v);
  CHECK(read(m2).v == read(m1).v);
  CHECK(read(a2).v == read(a1).v);
}

// sum, amax and mean over the first dim of a random [rows, n] operand (columns: the
// kept dim contiguous, the reduced one strided), on device `d`, in one kernel.
void check_col_reductions(Device d, int64_t rows, int64_t n) {
  KILN_TEST_RNG(rng);
  auto in = input<f32, 2>(rng, Shape<2>{rows, n});
  auto x = on(d, in.t);
  std::string what = "columns of [" + std::to_string(rows) + ", " + std::to_string(n) + "] on " + d.str();
  CAPTURE(what);
  Array s = ref::sum(in.a, {0}), scale = ref::abs_sum(in.a, {0}), m = ref::amax(in.a, {0});
  Array mean = ref::map(s, [&](double v) { return v / double(rows); });
  Array mean_scale = ref::map(scale, [&](double v) { return v / double(rows); });
  auto c0 = counters();
  auto [s1, m1] = eval(sum(x, 0), amax(x, 0));
  CHECK(counters().kernels_launched - c0.kernels_launched == 1);
  Tensor<f32, 1> a1 = kiln::mean(x, 0);
  check_close(s1, s, tol<f32>(), "sum " + what, &scale);
  check_close(m1, m, Tol{0, 0}, "amax " + what);
  check_close(a1, mean, tol<f32>(), "mean " + what, &mean_scale);
}

// softmax over rows of n (two passes and a store pass; kept in registers where it fits).
void check_softmax(Device d, int64_t rows, int64_t n) {
  KILN_TEST_RNG(rng);
  auto in = input<f32, 2>(rng, Shape<2>{rows, n});
  Tensor<f32, 2> y = softmax(on(d, in.t), -1);
  Array e = in.a, want = in.a;
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, in.a.v[size_t(r * n + j)]);
    for (int64_t j = 0; j < n; ++j) s += e.v[size_t(r * n + j)] = std::exp(in.a.v[size_t(r * n + j)] - mx);
    for (int64_t j = 0; j < n; ++j) want.v[size_t(r * n + j)] = e.v[size_t(r * n + j)] / s;
  }
  check_close(y, want, Tol{1e-5, 1e-9}, "softmax [" + std::to_string(rows) + ", " + std::to_string(n) + "] on " + d.str());
}

void check_strategies(Device d) {
  // Split rows: few long rows, contiguous (16-byte steps), odd (scalar steps), transposed.
  check_row_reductions(d, 4, int64_t(1) << 20, Layout::contiguous);
  check_row_reductions(d, 3, 300007, Layout::contiguous);
  check_row_reductions(d, 2, 100003, Layout::transposed);
  // A block per row, many rows; several rows per warp; a warp per row.
  check_row_reductions(d, 300, 5000, Layout::contiguous);
  check_row_reductions(d, 1000, 3, Layout::contiguous);
  check_row_reductions(d, 333, 17, Layout::strided);
  check_row_reductions(d, 65, 100, Layout::contiguous);
  check_row_reductions(d, 9, 700, Layout::contiguous);
  // 40000: a block per row too long to keep (batches of 16-byte loads, a store pass).
  for (int64_t n : {7, 100, 1000, 8192, 12000, 40000}) check_softmax(d, 5, n);
  // Columns (a thread per column): odd widths, few rows, many rows.
  check_col_reductions(d, 1000, 777);
  check_col_reductions(d, 3, 1025);
  check_col_reductions(d, 3001, 520);
}

// Plans of every strategy, with the variant each must get on a wave32 device.
template <class Backend>
std::vector<std::string> strategy_programs(int warp) {
  auto program = [&](const auto&... es) {
    GpuProgram p = gpu_program<Backend>(warp, 0, 132, es...);  // 132 multiprocessors, as an H200
    return std::pair{p.src, p.vars};
  };
  auto x = [](int64_t r, int64_t n) { return Tensor<f32, 2>::empty(Shape<2>{r, n}, cpu()); };
  std::vector<std::string> out;
  {
    auto [src, v] = program(sum(x(4, int64_t(1) << 20), -1));  // few long rows: split
    CHECK(v[0].split);
    CHECK(src.find("atomicAdd(kiln_count") != std::string::npos);
    CHECK(src.find("j0 += 4 * step") != std::string::npos);  // batches of four 16-byte loads per thread
    out.push_back(src);
  }
  {
    auto t = Tensor<f32, 2>::empty(Shape<2>{100003, 2}, cpu()).transpose(0, 1);  // strided split rows
    auto [src, v] = program(amax(t, -1), kiln::mean(t, -1));
    CHECK(v[0].split);
    out.push_back(src);
  }
  {
    auto [src, v] = program(sum(x(8192, 600), 0), amax(x(5000, 700), 0));  // column reductions: a thread per column
    REQUIRE(v.size() == 2);
    for (const auto& k : v) CHECK(k.cols);
    CHECK(src.find("kiln_cols_reduce<") != std::string::npos);
    out.push_back(src);
  }
  {
    auto [src, v] = program(sum(x(1000, 3), -1), sum(x(64, 100), -1), amax(x(9, 700), -1));
    CHECK(v.size() == 3);
    for (const auto& k : v) CHECK(k.group > 0);
    CHECK(v[0].group == 1);       // 3 elements: a lane per row
    CHECK(v[1].group == 8);       // 25 16-byte chunks: 8 lanes, 4 rows per warp
    CHECK(v[2].group == warp);    // 700: a warp per row
    out.push_back(src);
  }
  {
    auto [src, v] = program(softmax(x(64, 8192), -1));  // a block per row, in registers
    CHECK(!v[0].split);
    CHECK(v[0].persist > 0);
    CHECK(src.find("KILN_LAUNCH_BOUNDS(" + std::to_string(v[0].threads) + ", ") != std::string::npos);
    CHECK(src.find("* kiln_recip(r") != std::string::npos);  // by the row's sum: one reciprocal, a product per element
    out.push_back(src);
  }
  {
    auto xb = Tensor<bf16, 2>::empty(Shape<2>{64, 4096}, cpu());
    auto w = Tensor<bf16, 1>::empty(Shape<1>{4096}, cpu()), b = Tensor<bf16, 1>::empty(Shape<1>{4096}, cpu());
    auto [src, v] = program(layer_norm(xb, w, b, 1e-5));  // in registers, with weight and bias
    CHECK(v[0].persist > 0);
    // x loaded once into registers, weight and bias only where the store pass reads them
    size_t loads = 0;
    for (size_t p = src.find("kiln_load_vec<"); p != std::string::npos; p = src.find("kiln_load_vec<", p + 1)) ++loads;
    CHECK(loads == 3);
    out.push_back(src);
  }
  {
    auto [src, v] = program(softmax(x(4, int64_t(1) << 20), -1));  // two passes: never split
    CHECK(!v[0].split);
    CHECK(v[0].group == 0);
    out.push_back(src);
  }
  return out;
}

}  // namespace

TEST_CASE("rows strategies: split rows, rows per lane group, per warp, per block, against float64") {
  check_strategies(default_device());
}

TEST_SUITE("nvrtc") {

TEST_CASE("rows strategies: each shape's variant, and the programs compile for sm_80 and sm_90") {
  if (!jit::nvrtc_available()) {
    MESSAGE("NVRTC not found: skipped");
    return;
  }
  for (const std::string& src : strategy_programs<runtime::CudaBackend>(32)) {
    for (int cc : {80, 90}) CHECK(jit::cubin_sm(jit::nvrtc_compile(src, "kiln_plan", cc / 10, cc % 10)) == cc);
  }
}

}  // TEST_SUITE("nvrtc")

TEST_SUITE("hiprtc") {

TEST_CASE("rows strategies: the programs compile for gfx90a (wave64) and gfx1030 (wave32)") {
  if (!jit::hiprtc_available()) {
    MESSAGE("hipRTC not found: skipped");
    return;
  }
  for (std::string arch : {"gfx90a", "gfx1030"}) {
    CAPTURE(arch);
    REQUIRE(jit::hiprtc_target_supported(arch));
    for (const std::string& src : strategy_programs<runtime::HipBackend>(runtime::hip_target_warp_size(arch)))
      CHECK(jit::detail::is_amdgpu_code_object(jit::hiprtc_compile(src, "kiln_plan", arch, {})));
  }
}

}  // TEST_SUITE("hiprtc")

TEST_SUITE("gpu") {

TEST_CASE("rows strategies on kiln::cuda(0) against float64") {
  if (!runtime::CudaDeviceApi::present()) {
    MESSAGE("no CUDA GPU: skipped");
    return;
  }
  check_strategies(kiln::cuda(0));
}

}  // TEST_SUITE("gpu")
