// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Tests of jit/nvrtc.hpp: CUDA source -> cubin through the disk cache. Needs
// libnvrtc, not a GPU: every test compiles for sm_80 and sm_90 and inspects the
// machine code's ELF header. Skips with a message where NVRTC is absent.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "kiln/jit/nvrtc.hpp"
#include "kiln/runtime/counters.hpp"

namespace {

bool skip_without_nvrtc() {
  if (kiln::jit::nvrtc_available()) return false;
  MESSAGE("libnvrtc not found: skipped");
  return true;
}

// Two kernels in one program, as a plan's kernels are: a vectorised float4
// elementwise kernel and a warp-shuffle + shared-memory block reduction.
const std::string kPlanSource = R"(
extern "C" __global__ void scale_add_f4(const float4* __restrict__ x, const float4* __restrict__ y,
                                        float4* __restrict__ out, float alpha, long long n4) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
       i += (long long)gridDim.x * blockDim.x) {
    float4 a = x[i], b = y[i];
    out[i] = make_float4(alpha * a.x + b.x, alpha * a.y + b.y, alpha * a.z + b.z, alpha * a.w + b.w);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

extern "C" __global__ void row_sum(const float* __restrict__ x, float* __restrict__ out, int cols) {
  __shared__ float partial[32];
  const float* row = x + (long long)blockIdx.x * cols;
  float acc = 0.f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) acc += row[c];
  acc = warp_sum(acc);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    acc = lane < (int)((blockDim.x + 31) / 32) ? partial[lane] : 0.f;
    acc = warp_sum(acc);
    if (lane == 0) out[blockIdx.x] = acc;
  }
}
)";

// bf16 without any header: the bits in a ushort, widened by a shift and
// narrowed with round-to-nearest-even by the sm_80+ cvt instruction.
const std::string kBf16Source = R"(
struct kiln_bf16 { unsigned short bits; };
__device__ __forceinline__ float bf16_to_float(kiln_bf16 h) { return __uint_as_float((unsigned)h.bits << 16); }
__device__ __forceinline__ kiln_bf16 float_to_bf16(float f) {
  kiln_bf16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}
extern "C" __global__ void gelu_bf16(const kiln_bf16* __restrict__ x, kiln_bf16* __restrict__ out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float v = bf16_to_float(x[i]);
    out[i] = float_to_bf16(0.5f * v * (1.f + erff(v * 0.70710678118654752f)));
  }
}
)";

std::string unique_comment() {
  return "// nonce " + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "\n";
}

// The path after "source: " in a CompileError's message.
std::string kept_source(const std::string& what) {
  size_t at = what.find("source: ");
  if (at == std::string::npos) return {};
  return what.substr(at + 8, what.find('\n', at) - at - 8);
}

// Removes a source a failed compile kept in its own temp directory (not one in
// a KILN_DUMP directory the person running the tests asked for).
void remove_kept(const std::string& path) {
  if (path.find("/kiln-nvrtc-") == std::string::npos) return;
  ::unlink(path.c_str());
  ::rmdir(path.substr(0, path.rfind('/')).c_str());
}

bool is_elf(const std::string& b) { return b.size() > 52 && b.compare(0, 4, "\x7f" "ELF") == 0; }

}  // namespace

TEST_SUITE("nvrtc") {

TEST_CASE("NVRTC loads and reports its version") {
  if (skip_without_nvrtc()) return;
  int v = kiln::jit::nvrtc_version();
  CHECK(v >= 11020);
  MESSAGE("NVRTC " << v / 1000 << "." << (v % 1000) / 10 << " from " << kiln::jit::nvrtc().path);
}

TEST_CASE("representative kernels compile to sm_80 and sm_90 cubins") {
  if (skip_without_nvrtc()) return;
  for (int cc : {80, 90}) {
    CAPTURE(cc);
    std::string plan = kiln::jit::nvrtc_compile(kPlanSource, "plan", cc / 10, cc % 10);
    CHECK(is_elf(plan));
    CHECK(kiln::jit::cubin_sm(plan) == cc);
    // NOTE: kernel names are in the ELF symbol table; both kernels of the plan are there.
    CHECK(plan.find("scale_add_f4") != std::string::npos);
    CHECK(plan.find("row_sum") != std::string::npos);

    std::string bf16 = kiln::jit::nvrtc_compile(kBf16Source, "bf16", cc / 10, cc % 10);
    CHECK(is_elf(bf16));
    CHECK(kiln::jit::cubin_sm(bf16) == cc);
  }
}

TEST_CASE("an arch-specific target is accepted, a PTX target is refused") {
  if (skip_without_nvrtc()) return;
  std::string a = kiln::jit::nvrtc_compile(kPlanSource, "plan", 9, 0, {"--gpu-architecture=sm_90a"});
  CHECK(is_elf(a));
  CHECK(kiln::jit::cubin_sm(a) == 90);
  CHECK_THROWS_AS(kiln::jit::nvrtc_compile(kPlanSource, "plan", 9, 0, {"--gpu-architecture=compute_90"}),
                  kiln::Error);
  CHECK_THROWS_AS(kiln::jit::nvrtc_compile(kPlanSource, "plan", 1, 0), kiln::Error);  // sm_10: no NVRTC has it
}

TEST_CASE("a GPU newer than NVRTC within its major version gets the newest older target") {
  if (skip_without_nvrtc()) return;
  CHECK(kiln::jit::nvrtc_machine_target(80) == 80);
  CHECK(kiln::jit::nvrtc_machine_target(90) == 90);
  if (!kiln::jit::nvrtc().archs.empty()) {
    CHECK(kiln::jit::nvrtc_machine_target(95) == 90);  // no sm_95 exists; sm_90 code runs on 9.x
    CHECK_THROWS_AS(kiln::jit::nvrtc_machine_target(990), kiln::Error);
  }
}

TEST_CASE("a second compile of the same source is a disk-cache hit") {
  if (skip_without_nvrtc()) return;
  std::string source = unique_comment() + kPlanSource;
  kiln::Counters before = kiln::counters();
  std::string first = kiln::jit::nvrtc_compile(source, "plan", 9, 0);
  kiln::Counters middle = kiln::counters();
  CHECK(middle.compiles == before.compiles + 1);
  std::string second = kiln::jit::nvrtc_compile(source, "plan", 9, 0);
  kiln::Counters after = kiln::counters();
  CHECK(after.compiles == middle.compiles);
  CHECK(after.disk_hits == middle.disk_hits + 1);
  CHECK(first == second);
  // Another target or option is another entry.
  kiln::jit::nvrtc_compile(source, "plan", 8, 0);
  CHECK(kiln::counters().compiles == after.compiles + 1);
}

TEST_CASE("a kernel that does not compile throws CompileError with the log and the kept source") {
  if (skip_without_nvrtc()) return;
  std::string source = unique_comment() +
                       "extern \"C\" __global__ void broken(float* o) { o[0] = not_declared_anywhere; }\n";
  std::string what;
  try {
    kiln::jit::nvrtc_compile(source, "broken", 9, 0);
  } catch (const kiln::CompileError& e) {
    what = e.what();
  }
  REQUIRE_FALSE(what.empty());
  CHECK(what.find("not_declared_anywhere") != std::string::npos);  // the NVRTC log
  CHECK(what.find("--gpu-architecture=sm_90") != std::string::npos);
  std::string path = kept_source(what);
  struct stat st {};
  CHECK(::stat(path.c_str(), &st) == 0);
  remove_kept(path);
}

TEST_CASE("KILN_DUMP receives the source and the NVRTC log") {
  if (skip_without_nvrtc()) return;
  std::string dir = "/tmp/kiln-nvrtc-dump-" + std::to_string(::getpid());
  ::setenv("KILN_DUMP", dir.c_str(), 1);
  std::string source = unique_comment() + kBf16Source;
  std::vector<std::string> options = kiln::jit::nvrtc_options(8, 0);
  std::string hex = kiln::jit::nvrtc_cache_key(source, options).hex();
  kiln::jit::nvrtc_compile(source, "dumped", 8, 0);
  ::unsetenv("KILN_DUMP");
  for (const char* ext : {".cu", ".log"}) {
    std::string path = dir + "/dumped-" + hex + ext;
    struct stat st {};
    CHECK(::stat(path.c_str(), &st) == 0);
    ::unlink(path.c_str());
  }
  ::rmdir(dir.c_str());
}

TEST_CASE("cuda_bf16.h: built into NVRTC or found in the toolkit") {
  if (skip_without_nvrtc()) return;
  const std::string source = "#include <cuda_bf16.h>\n"
                             "extern \"C\" __global__ void twice(__nv_bfloat16* x) {\n"
                             "  x[threadIdx.x] = __float2bfloat16(2.f * __bfloat162float(x[threadIdx.x]));\n}\n";
  bool builtin = true;
  try {
    kiln::jit::nvrtc_compile(source, "bf16_header", 9, 0);
  } catch (const kiln::CompileError& e) {
    builtin = false;
    remove_kept(kept_source(e.what()));
  }
  std::string verdict = builtin ? "built in" : "not built in";
  MESSAGE("cuda_bf16.h without -I: " << verdict);
  if (auto include = kiln::jit::cuda_toolkit_include_dir()) {
    std::string cubin = kiln::jit::nvrtc_compile(source, "bf16_header", 9, 0, {"-I" + *include});
    CHECK(kiln::jit::cubin_sm(cubin) == 90);
  }
}

}  // TEST_SUITE("nvrtc")
