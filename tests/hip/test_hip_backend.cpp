// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Tests of runtime/hip_backend.hpp (and the GPU backend it shares with cuda,
// runtime/gpu_backend.hpp):
//   * no GPU needed: the backend is registered; one generator writes both
//     dialects (the HIP program of a plan is the CUDA one plus `KILN_HIP`);
//     without an AMD GPU, hip(0) says why; copies between a cuda and a hip
//     device are refused by name; the wavefront size of each target;
//   * hiprtc (no GPU): representative plans (pointwise, softmax rows of three
//     lengths, bf16 layer_norm, var_mean, matmul, concat/pad, rand) generated
//     as HipBackend::run would generate them and compiled by hipRTC for gfx90a,
//     gfx908 (wave64) and gfx1030 (wave32) into code objects for that target;
//     the wavefront size changes the text and a source for the wrong one does
//     not compile;
//   * gpu: the same kinds of expressions evaluated on kiln::hip(0) against
//     float64 references, and Storage copies; skipped, with a MESSAGE, where
//     there is no AMD GPU. The same checks run on kiln::cuda(0) where there is
//     an NVIDIA GPU (the shared GPU backend), and in the cpu suite on
//     kiln::cpu(), so the expressions and references are tested everywhere.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"
#include "../support/gpu_program.hpp"

namespace {

using namespace kiln;

// Deterministic values in [-2, 2).
std::vector<double> values(size_t n, uint64_t seed) {
  std::vector<double> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = double(s >> 11) * (4.0 / 9007199254740992.0) - 2.0;
  }
  return v;
}

template <class DT, int R>
Tensor<DT, R> tensor(Shape<R> sizes, uint64_t seed, Device d) {
  return Tensor<DT, R>::from(sizes, values(size_t(numel(sizes)), seed), d);
}

// The HIP program that HipBackend::run builds for these expressions on a device
// with `warp` lanes per wavefront (tests/support/gpu_program.hpp).
template <class... Es>
std::string hip_program(int warp, const Es&... es) {
  return test::gpu_program<runtime::HipBackend>(warp, 0, 1, es...).src;
}

// A representative plan: its name and its HIP program for a wavefront size.
struct Plan {
  std::string name;
  std::string (*program)(int warp);
};

std::vector<Plan> representative_plans() {
  return {
      {"pointwise", [](int w) {
         auto x = tensor<f32, 2>({257, 129}, 1, cpu());
         auto t = tensor<f32, 2>({129, 257}, 2, cpu()).transpose(0, 1);  // strided: the scalar variant
         return hip_program(w, gelu(x * 2.0f + 1.0f), x + t);
       }},
      {"pointwise_f16_broadcast", [](int w) {
         auto x = tensor<f16, 2>({64, 100}, 3, cpu());
         auto row = tensor<f16, 1>({100}, 4, cpu());
         return hip_program(w, tanh(x) * row);
       }},
      {"softmax_rows", [](int w) {
         // 100: a warp per row; 1536: a warp per row on wave64, a block on wave32;
         // 6000: a block per row, kept in registers; 40000: a block, streamed.
         return hip_program(w, softmax(tensor<f32, 2>({8, 100}, 5, cpu()), -1),
                            softmax(tensor<f32, 2>({8, 1536}, 6, cpu()), -1),
                            softmax(tensor<f32, 2>({4, 6000}, 7, cpu()), -1),
                            log_softmax(tensor<f32, 2>({2, 40000}, 8, cpu()), -1));
       }},
      {"layer_norm_bf16", [](int w) {
         auto x = tensor<bf16, 2>({32, 768}, 9, cpu());
         return hip_program(w, layer_norm(x, tensor<bf16, 1>({768}, 10, cpu()), tensor<bf16, 1>({768}, 11, cpu())));
       }},
      {"var_mean", [](int w) {
         auto x = tensor<f32, 2>({16, 3000}, 12, cpu());
         auto [v, m] = var_mean(x, 1);
         auto [v0, m0] = var_mean(x, 0);  // across rows: a strided reduction
         return hip_program(w, v, m, v0, m0);
       }},
      {"matmul", [](int w) {
         auto a = tensor<f32, 2>({33, 47}, 13, cpu()), b = tensor<f32, 2>({47, 65}, 14, cpu());
         auto a16 = tensor<bf16, 3>({2, 17, 40}, 15, cpu()), b16 = tensor<bf16, 3>({2, 40, 9}, 16, cpu());
         return hip_program(w, matmul(a, b) + 1.0f, matmul(a16, b16));
       }},
      {"concat_pad", [](int w) {
         auto a = tensor<f32, 2>({5, 7}, 17, cpu()), b = tensor<f32, 2>({3, 7}, 18, cpu());
         return hip_program(w, concat(0, a, b * 2.0f), pad(a, {1, 2}, {0, 3}, -1.0));
       }},
      {"rand", [](int w) {
         auto x = tensor<f32, 2>({100, 33}, 19, cpu());
         return hip_program(w, dropout(x, 0.25, 42), randn<f32>(Shape<1>{1001}, 7));
       }},
  };
}

// Every element of `got` within rtol * |ref| + atol of `ref`; a failure names
// the worst element.
void check_close(const std::vector<double>& got, const std::vector<double>& ref, double rtol, double atol,
                 const std::string& what) {
  CAPTURE(what);
  REQUIRE(got.size() == ref.size());
  size_t bad = 0, worst = 0;
  double worst_excess = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::fabs(got[i] - ref[i]), allowed = rtol * std::fabs(ref[i]) + atol;
    if (!(err <= allowed)) {
      ++bad;
      double excess = std::isnan(err) ? INFINITY : err - allowed;
      if (bad == 1 || excess > worst_excess) worst = i, worst_excess = excess;
    }
  }
  if (bad) {
    FAIL_CHECK(bad << " of " << got.size() << " elements differ; worst at " << worst << ": " << got[worst]
                   << " against " << ref[worst]);
  }
}

double gelu_ref(double v) { return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))); }

// Row-wise softmax of a row-major [rows, n] array.
std::vector<double> softmax_ref(const std::vector<double>& x, size_t n) {
  std::vector<double> out(x.size());
  for (size_t r = 0; r < x.size() / n; ++r) {
    double m = -INFINITY, s = 0;
    for (size_t j = 0; j < n; ++j) m = std::max(m, x[r * n + j]);
    for (size_t j = 0; j < n; ++j) s += std::exp(x[r * n + j] - m);
    for (size_t j = 0; j < n; ++j) out[r * n + j] = std::exp(x[r * n + j] - m) / s;
  }
  return out;
}

// The expressions of the gpu test, on device `d`, against float64 references
// computed from the values the inputs hold (bf16 inputs already rounded).
void check_expressions(Device d) {
  CAPTURE(d.str());
  {  // pointwise: contiguous (vector variant) and transposed (scalar variant), odd sizes
    auto x = tensor<f32, 2>({1000, 37}, 1, d), u = tensor<f32, 2>({37, 1000}, 2, d);
    auto [y, z] = eval(gelu(x * 2.0f + 1.0f), x + u.transpose(0, 1));
    CHECK(y.device() == d);
    std::vector<double> xv = x.to_vector(), uv = u.to_vector(), ry(xv.size()), rz(xv.size());
    for (size_t i = 0; i < 1000; ++i) {
      for (size_t j = 0; j < 37; ++j) {
        ry[i * 37 + j] = gelu_ref(xv[i * 37 + j] * 2 + 1), rz[i * 37 + j] = xv[i * 37 + j] + uv[j * 1000 + i];
      }
    }
    check_close(y.to_vector(), ry, 1e-5, 1e-6, "gelu(x * 2 + 1)");
    check_close(z.to_vector(), rz, 1e-6, 1e-6, "x + transposed");
  }
  // softmax: rows for a warp, for a warp on wave64 but a block on wave32, kept in registers, streamed
  for (int64_t n : {100, 1536, 6000, 40000}) {
    auto x = tensor<f32, 2>({5, n}, uint64_t(n), d);
    Tensor<f32, 2> y = softmax(x * 3.0f, -1);
    std::vector<double> xv = x.to_vector();
    for (auto& v : xv) v *= 3;
    check_close(y.to_vector(), softmax_ref(xv, size_t(n)), 1e-4, 1e-8, "softmax over " + std::to_string(n));
  }
  {  // layer_norm in bf16, computed in f32
    const size_t rows = 16, n = 768;
    auto x = tensor<bf16, 2>({int64_t(rows), int64_t(n)}, 3, d);
    auto w = tensor<bf16, 1>({int64_t(n)}, 4, d), b = tensor<bf16, 1>({int64_t(n)}, 5, d);
    Tensor<bf16, 2> y = layer_norm(x, w, b);
    std::vector<double> xv = x.to_vector(), wv = w.to_vector(), bv = b.to_vector(), ref(xv.size());
    for (size_t r = 0; r < rows; ++r) {
      double m = 0, v = 0;
      for (size_t j = 0; j < n; ++j) m += xv[r * n + j];
      m /= double(n);
      for (size_t j = 0; j < n; ++j) v += (xv[r * n + j] - m) * (xv[r * n + j] - m);
      v /= double(n);
      for (size_t j = 0; j < n; ++j) ref[r * n + j] = (xv[r * n + j] - m) / std::sqrt(v + 1e-5) * wv[j] + bv[j];
    }
    check_close(y.to_vector(), ref, 1.0 / 128, 2e-2, "layer_norm bf16");
  }
  {  // var_mean along the rows and across them
    const size_t rows = 33, n = 3000;
    auto x = tensor<f32, 2>({int64_t(rows), int64_t(n)}, 6, d);
    auto [v, m] = eval(var_mean(x, 1));
    auto [v0, m0] = eval(var_mean(x, 0));
    std::vector<double> xv = x.to_vector(), rv(rows), rm(rows), rv0(n), rm0(n);
    for (size_t r = 0; r < rows; ++r) {
      for (size_t j = 0; j < n; ++j) rm[r] += xv[r * n + j] / double(n), rm0[j] += xv[r * n + j] / double(rows);
    }
    for (size_t r = 0; r < rows; ++r) {
      for (size_t j = 0; j < n; ++j) {
        rv[r] += (xv[r * n + j] - rm[r]) * (xv[r * n + j] - rm[r]) / double(n - 1);
        rv0[j] += (xv[r * n + j] - rm0[j]) * (xv[r * n + j] - rm0[j]) / double(rows - 1);
      }
    }
    check_close(v.to_vector(), rv, 1e-4, 1e-6, "var over rows");
    check_close(m.to_vector(), rm, 1e-4, 1e-5, "mean over rows");
    check_close(v0.to_vector(), rv0, 1e-4, 1e-6, "var across rows");
    check_close(m0.to_vector(), rm0, 1e-4, 1e-5, "mean across rows");
  }
  {  // matmul
    const size_t M = 65, K = 70, N = 33;
    auto a = tensor<f32, 2>({int64_t(M), int64_t(K)}, 7, d), b = tensor<f32, 2>({int64_t(K), int64_t(N)}, 8, d);
    Tensor<f32, 2> c = matmul(a, b) + 1.0f;
    std::vector<double> av = a.to_vector(), bv = b.to_vector(), ref(M * N, 1.0);
    for (size_t i = 0; i < M; ++i)
      for (size_t k = 0; k < K; ++k)
        for (size_t j = 0; j < N; ++j) ref[i * N + j] += av[i * K + k] * bv[k * N + j];
    check_close(c.to_vector(), ref, 1e-5, 1e-4, "matmul + 1");
  }
  {  // concat and pad: exact
    auto a = tensor<f32, 2>({5, 7}, 9, d), b = tensor<f32, 2>({3, 7}, 10, d);
    auto [c, p] = eval(concat(0, a, b * 2.0f), pad(a, {1, 2}, {0, 3}, -1.0));
    std::vector<double> av = a.to_vector(), bv = b.to_vector(), rc = av, rp(6 * 12, -1.0);
    for (double v : bv) rc.push_back(v * 2);
    for (size_t i = 0; i < 5; ++i)
      for (size_t j = 0; j < 7; ++j) rp[(i + 1) * 12 + j + 2] = av[i * 7 + j];
    check_close(c.to_vector(), rc, 0, 0, "concat");
    check_close(p.to_vector(), rp, 0, 0, "pad");
  }
  {  // rand: Philox on the device draws what it draws on the CPU
    auto x = tensor<f32, 2>({100, 33}, 11, d);
    Tensor<f32, 2> y = dropout(x, 0.25, 42);
    Tensor<f32, 2> ref = dropout(x.to(cpu()), 0.25, 42);
    std::vector<double> yv = y.to_vector();
    check_close(yv, ref.to_vector(), 1e-6, 0, "dropout against the CPU's");
    size_t kept = 0;
    for (double v : yv) kept += v != 0;
    CHECK(double(kept) / double(yv.size()) == doctest::Approx(0.75).epsilon(0.05));
  }
}

// kiln::Storage on `d`: host -> device -> device -> host round trip.
void check_storage(Device d) {
  std::vector<int32_t> host(777);
  for (size_t i = 0; i < host.size(); ++i) host[i] = int32_t(i * 31) - 5;
  kiln::Storage s(host.size() * sizeof(int32_t), d);
  kiln::copy_bytes(s.data(), d, host.data(), kiln::cpu(), s.bytes());
  kiln::Storage t(s.bytes(), d);
  kiln::copy_bytes(t.data(), d, s.data(), d, s.bytes());
  std::vector<int32_t> back(host.size(), 0);
  kiln::copy_bytes(back.data(), kiln::cpu(), t.data(), d, t.bytes());
  CHECK(back == host);
}

// EF_AMDGPU_MACH of each target tested.
int mach_of(const std::string& arch) { return arch == "gfx90a" ? 0x3f : arch == "gfx908" ? 0x30 : 0x36; }

}  // namespace

TEST_CASE("the hip backend is registered beside cuda and cpu, and one generator writes both dialects") {
  CHECK(bool(kiln::detail::memory_hooks(DeviceKind::hip).allocate));
  CHECK(runtime::backend_slot(DeviceKind::hip) != nullptr);
  CHECK(runtime::backend_slot(DeviceKind::cuda) != nullptr);
  // The default device: the first CUDA GPU, else the first HIP GPU, else the CPU.
  Device first = runtime::detail::first_gpu();
  if (runtime::CudaDeviceApi::present()) CHECK(first == kiln::cuda(0));
  else if (runtime::HipDeviceApi::present()) CHECK(first == kiln::hip(0));
  else CHECK(first == kiln::cpu());
  MESSAGE("first GPU: " << first.str());

  CHECK(runtime::hip_target_warp_size("gfx90a") == 64);
  CHECK(runtime::hip_target_warp_size("gfx90a:sramecc+:xnack-") == 64);
  CHECK(runtime::hip_target_warp_size("gfx908") == 64);
  CHECK(runtime::hip_target_warp_size("gfx942") == 64);
  CHECK(runtime::hip_target_warp_size("gfx1030") == 32);
  CHECK(runtime::hip_target_warp_size("gfx1100") == 32);

  // The same plan and variants in both dialects: the HIP text is the CUDA text
  // with KILN_HIP defined (the prelude's #ifdefs are the whole difference).
  auto x = tensor<f32, 2>({8, 1536}, 1, cpu());
  ir::Graph g = ir::trace(softmax(x, -1));
  auto cp = runtime::plan_for(g, Mode::fused);
  runtime::Bound b = runtime::bind_buffers(g, cp->plan);
  for (int warp : {32, 64}) {
    runtime::GpuCall call = runtime::gpu_call(g, *cp, b, warp);
    std::string cuda = runtime::CudaBackend::source(g, cp->plan, call.vars, warp);
    std::string hip = runtime::HipBackend::source(g, cp->plan, call.vars, warp);
    CHECK(hip == "#define KILN_HIP 1\n" + cuda);
  }
}

TEST_CASE("without an AMD GPU, hip(0) says why; a copy between cuda and hip is refused") {
  if (!runtime::HipDeviceApi::present()) {
    std::string what;
    try {
      Tensor<f32, 1>::empty({4}, kiln::hip(0));
    } catch (const kiln::Error& e) {
      what = e.what();
    }
    CHECK(what.find("HIP") != std::string::npos);
    MESSAGE("hip(0) here: " << what);
  }
  float a = 1, b = 2;
  // Refused before any device is touched, whichever runtimes exist.
  CHECK_THROWS_WITH_AS(kiln::copy_bytes(&a, kiln::hip(0), &b, kiln::cuda(0), sizeof a),
                       doctest::Contains("no direct copy from cuda:0 to hip:0"), kiln::Error);
  CHECK_THROWS_WITH_AS(kiln::copy_bytes(&a, kiln::cuda(0), &b, kiln::hip(0), sizeof a),
                       doctest::Contains("no direct copy from hip:0 to cuda:0"), kiln::Error);
}

TEST_CASE("the expressions of the hip gpu test match their float64 references on the CPU") {
  check_expressions(kiln::cpu());
  check_storage(kiln::cpu());
}

TEST_SUITE("hiprtc") {

TEST_CASE("the hip backend's programs of representative plans compile for gfx90a, gfx908 and gfx1030") {
  if (!jit::hiprtc_available()) {
    MESSAGE("hipRTC not found: skipped. " << jit::hiprtc_version_string());
    return;
  }
  MESSAGE(jit::hiprtc_version_string());
  const std::vector<Plan> plans = representative_plans();
  for (std::string arch : {"gfx90a", "gfx908", "gfx1030"}) {
    CAPTURE(arch);
    REQUIRE(jit::hiprtc_target_supported(arch));
    const int warp = runtime::hip_target_warp_size(arch);
    for (const Plan& p : plans) {
      CAPTURE(p.name);
      std::string src = p.program(warp);
      CHECK(src.rfind("#define KILN_HIP 1\n#define KILN_WARP " + std::to_string(warp) + "\n", 0) == 0);
      // What HipDevice::load_module compiles: the device's target, no extra options.
      std::string code = jit::hiprtc_compile(src, "kiln_plan", arch, {});
      CHECK(jit::detail::is_amdgpu_code_object(code));
      CHECK(jit::code_object_mach(code) == mach_of(arch));
    }
  }
}

TEST_CASE("the wavefront size is in the HIP text, and a program for the wrong one does not compile") {
  if (!jit::hiprtc_available()) {
    MESSAGE("hipRTC not found: skipped");
    return;
  }
  auto x = tensor<f32, 2>({8, 1536}, 1, cpu());
  std::string wave64 = hip_program(64, softmax(x, -1)), wave32 = hip_program(32, softmax(x, -1));
  CHECK(wave64.find("#define KILN_WARP 64\n") != std::string::npos);
  CHECK(wave32.find("#define KILN_WARP 32\n") != std::string::npos);
  // Rows of 1536: a wavefront per row where 64 lanes cover it in 32 steps, a block per row on wave32.
  CHECK(wave64.find("= kiln_group_reduce<64>(") != std::string::npos);
  CHECK(wave32.find("= kiln_group_reduce<") == std::string::npos);
  CHECK(wave32.find("kiln_block_reduce<") != std::string::npos);
  std::string what;
  try {
    jit::hiprtc_compile(wave64, "kiln_plan_wrong_wave", "gfx1030", {});
  } catch (const kiln::CompileError& e) {
    what = e.what();
  }
  CHECK(what.find("KILN_WARP differs from the target's wavefront size") != std::string::npos);
  what.clear();
  try {
    jit::hiprtc_compile(wave32, "kiln_plan_wrong_wave", "gfx90a", {});
  } catch (const kiln::CompileError& e) {
    what = e.what();
  }
  CHECK(what.find("KILN_WARP differs from the target's wavefront size") != std::string::npos);
}

TEST_CASE("a device's full target ID loads the code object precompiled for its processor") {
  if (!jit::hiprtc_available()) {
    MESSAGE("hipRTC not found: skipped");
    return;
  }
  // A source no earlier run cached: the first compile is a real one.
  auto x = tensor<f32, 2>({8, 1536}, 1, cpu());
  std::string src = hip_program(64, softmax(x, -1)) + "\n// " +
                    std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "\n";
  auto c0 = kiln::counters();
  std::string generic = jit::hiprtc_compile(src, "kiln_plan", "gfx90a", {});  // what KILN_PRECOMPILE=gfx90a writes
  auto c1 = kiln::counters();
  CHECK(c1.compiles == c0.compiles + 1);
  // What an MI250's HipDevice asks for: no compile, the processor's entry.
  std::string device = jit::hiprtc_compile(src, "kiln_plan", "gfx90a:sramecc+:xnack-", {});
  auto c2 = kiln::counters();
  CHECK(c2.compiles == c1.compiles);
  CHECK(c2.disk_hits == c1.disk_hits + 1);
  CHECK(device == generic);
}

}  // TEST_SUITE("hiprtc")

TEST_SUITE("gpu") {

TEST_CASE("expressions evaluated on kiln::hip(0) match float64 references") {
  if (!runtime::HipDeviceApi::present()) {
    MESSAGE("no AMD GPU (" << rocm::hip_unavailable_reason() << "): skipped");
    return;
  }
  const rocm::DeviceProperties& p = rocm::device_properties(0);
  MESSAGE("hip(0): " << p.name << ", " << p.arch << ", wavefront " << p.warp_size << ", " << p.sm_count << " CUs");
  check_storage(kiln::hip(0));
  auto before = kiln::counters();
  check_expressions(kiln::hip(0));
  CHECK(kiln::counters().kernels_launched > before.kernels_launched);
}

TEST_CASE("the same expressions on kiln::cuda(0): the GPU backend the hip one shares") {
  if (!runtime::CudaDeviceApi::present()) {
    MESSAGE("no CUDA GPU: skipped");
    return;
  }
  check_storage(kiln::cuda(0));
  check_expressions(kiln::cuda(0));
}

}  // TEST_SUITE("gpu")
