// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Tests of runtime/hip_runtime.hpp on a real AMD GPU, mirroring
// tests/cuda/test_cuda_runtime.cpp: the caching allocator, copies, module
// loading and launching over odd sizes into poisoned output, a warp-shuffle
// reduction at the device's own wavefront size, one compile for many threads,
// launch errors and the event timer. Each test prints a message and returns
// where there is no AMD GPU (tests/hip/test_hip_api.cpp covers that case).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <string>
#include <vector>

#include "kiln/runtime/counters.hpp"
#include "kiln/runtime/hip_runtime.hpp"
#include "hip_test_kernels.hpp"

namespace {

bool skip_without_hip() {
  if (kiln::rocm::hip_available()) return false;
  MESSAGE("no AMD GPU: skipped (" << kiln::rocm::hip_unavailable_reason() << ")");
  return true;
}

// The prelude and block_sum are hip_test_kernels.hpp's; affine and
// reverse_blocks check exact results.
const std::string kSource = std::string(hip_test::kPrelude) + hip_test::kBlockSum + R"(
extern "C" __global__ void affine(const float* __restrict__ a, float* __restrict__ out, kiln_i64 n) {
  for (kiln_i64 i = (kiln_i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (kiln_i64)gridDim.x * blockDim.x)
    out[i] = a[i] * 2.0f + 1.0f;
}

// Each block stages its elements through dynamic LDS and writes them back
// reversed within the block.
extern "C" __global__ void reverse_blocks(const float* __restrict__ a, float* __restrict__ out, int n) {
  extern __shared__ float stage[];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  stage[threadIdx.x] = i < n ? a[i] : 0.f;
  __syncthreads();
  int j = blockIdx.x * blockDim.x + (blockDim.x - 1 - threadIdx.x);
  if (j < n) out[j] = stage[threadIdx.x];
}
)";

std::vector<std::string> warp_option() {
  return {"-DKILN_WARP_SIZE=" + std::to_string(kiln::rocm::device_properties(0).warp_size)};
}

kiln::rocm::HipModule& test_module() { return kiln::rocm::load_hip_module(kSource, 0, warp_option(), "hip_test"); }

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-100.f, 100.f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

unsigned blocks_for(int64_t n, unsigned threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

TEST_SUITE("gpu") {

TEST_CASE("HIP device properties are read once and are plausible") {
  if (skip_without_hip()) return;
  const kiln::rocm::DeviceProperties& p = kiln::rocm::device_properties(0);
  CHECK(&p == &kiln::rocm::device_properties(0));
  CHECK(p.arch.rfind("gfx", 0) == 0);
  CHECK(kiln::jit::hiprtc_target_supported(p.arch));
  // Wavefronts: 64 on gfx9 (CDNA, Vega), 32 on gfx10 and later (RDNA).
  CHECK(p.warp_size == (p.arch.rfind("gfx9", 0) == 0 ? 64 : 32));
  CHECK(p.sm_count > 0);
  CHECK(p.max_threads_per_block >= 256);
  CHECK(p.max_shared_per_block >= 32 * 1024);
  CHECK(p.total_memory > 0);
  MESSAGE(p.name << ": " << p.arch << ", wave" << p.warp_size << ", " << p.sm_count << " CUs, L2 " << p.l2_bytes / 1024
                 << " KiB, " << p.max_shared_per_block / 1024 << " KiB LDS per block, HIP "
                 << kiln::rocm::hip_state().runtime_version);
}

TEST_CASE("the HIP caching allocator hands a freed block out again without hipMalloc") {
  if (skip_without_hip()) return;
  kiln::rocm::CachingAllocator& alloc = kiln::rocm::hip_device(0).allocator();
  void* first = nullptr;
  {
    kiln::rocm::DeviceBuffer b = kiln::rocm::device_alloc(1000);
    first = b.ptr();
    CHECK(first != nullptr);
    CHECK(b.size() == 1000);
  }
  kiln::rocm::AllocatorStats before = alloc.stats();
  kiln::rocm::DeviceBuffer again = kiln::rocm::device_alloc(900);  // same 1024-byte class
  kiln::rocm::AllocatorStats after = alloc.stats();
  CHECK(again.ptr() == first);
  CHECK(after.device_allocs == before.device_allocs);
  CHECK(after.reuses == before.reuses + 1);

  // Another size class is a new block; empty_cache hands cached blocks back.
  { kiln::rocm::DeviceBuffer big = kiln::rocm::device_alloc(3 << 20); }
  CHECK(alloc.stats().bytes_cached >= (size_t{3} << 20));
  kiln::rocm::empty_cache();
  CHECK(alloc.stats().bytes_cached == 0);
  CHECK(alloc.stats().device_frees > before.device_frees);
  CHECK_THROWS_AS(alloc.release(static_cast<char*>(again.ptr()) + 4), kiln::Error);  // never handed out
}

TEST_CASE("HIP host -> device -> host round trip of random data") {
  if (skip_without_hip()) return;
  const size_t bytes = 1000003;  // odd: no vector-width luck
  std::vector<unsigned char> host(bytes);
  std::mt19937 rng(7);
  for (auto& b : host) b = static_cast<unsigned char>(rng());
  kiln::rocm::DeviceBuffer d = kiln::rocm::device_alloc(bytes);
  kiln::rocm::fill_bytes(d, 0xAB);
  kiln::rocm::copy_to_device(d, host.data(), bytes);
  kiln::rocm::DeviceBuffer e = kiln::rocm::device_alloc(bytes);
  kiln::rocm::copy_on_device(e, d, bytes);
  std::vector<unsigned char> back(bytes, 0);
  kiln::rocm::copy_to_host(back.data(), e, bytes);
  CHECK(std::memcmp(back.data(), host.data(), bytes) == 0);

  // Offsets, and a copy that would overrun is refused before HIP sees it.
  unsigned char middle[5] = {};
  kiln::rocm::copy_to_host(middle, d, 5, 1000);
  CHECK(std::memcmp(middle, host.data() + 1000, 5) == 0);
  CHECK_THROWS_AS(kiln::rocm::copy_to_host(back.data(), d, 10, bytes - 5), kiln::Error);

  // A fill reaches every byte, the odd tail included.
  kiln::rocm::fill_bytes(e, 0x5A);
  kiln::rocm::copy_to_host(back.data(), e, bytes);
  size_t wrong = 0;
  for (unsigned char b : back) wrong += b != 0x5A;
  CHECK(wrong == 0);
}

TEST_CASE("a HIP module loads once and its kernel writes every element of an odd size") {
  if (skip_without_hip()) return;
  const int64_t n = 100003;
  std::vector<float> a = random_floats(static_cast<size_t>(n), 1);
  kiln::rocm::DeviceBuffer da = kiln::rocm::to_device(a);
  kiln::rocm::DeviceBuffer dout = kiln::rocm::device_alloc(static_cast<size_t>(n) * sizeof(float));
  kiln::rocm::fill_words(dout, 0xFFFFFFFFu);  // NaN: an element the kernel skips shows up

  kiln::rocm::HipModule& module = test_module();
  kiln::rocm::HipFunction affine = module.function("affine");
  kiln::Counters before = kiln::counters();
  void* pa = da.ptr();
  void* pout = dout.ptr();
  int64_t count = n;
  void* args[] = {&pa, &pout, &count};
  // Fewer blocks than elements need: the grid-stride loop covers the rest.
  affine.launch({blocks_for(n, 256) / 3}, {256}, 0, args, "affine n=100003");
  CHECK(kiln::counters().kernels_launched == before.kernels_launched + 1);

  std::vector<float> out = kiln::rocm::to_host<float>(dout);
  REQUIRE(out.size() == a.size());
  int wrong = 0;
  for (size_t i = 0; i < out.size(); ++i) wrong += !(out[i] == a[i] * 2.0f + 1.0f);
  CHECK(wrong == 0);

  // The same source again is the same module, from memory.
  kiln::rocm::HipModule& again = test_module();
  CHECK(&again == &module);
  CHECK(kiln::counters().memory_hits == before.memory_hits + 1);
  CHECK(module.function("affine").handle() == affine.handle());
  CHECK_THROWS_AS(module.function("no_such_kernel"), kiln::Error);
}

TEST_CASE("threads loading one new HIP source at once compile it once and can all launch") {
  if (skip_without_hip()) return;
  // A nonce makes the source new to the disk cache too, so exactly one compile is due.
  std::string source = kSource + "// nonce " +
                       std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "\n";
  const int64_t n = 1000;
  std::vector<float> a = random_floats(static_cast<size_t>(n), 3);
  kiln::rocm::DeviceBuffer da = kiln::rocm::to_device(a);
  kiln::Counters before = kiln::counters();
  std::vector<kiln::rocm::HipModule*> seen(8, nullptr);
  std::vector<std::string> errors(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      try {
        kiln::rocm::HipModule& m = kiln::rocm::load_hip_module(source, 0, warp_option(), "threaded");
        seen[t] = &m;
        // A fresh thread starts on device 0 by HIP's default: the launch sets it anyway.
        kiln::rocm::DeviceBuffer out = kiln::rocm::device_alloc(static_cast<size_t>(n) * sizeof(float));
        void* pa = da.ptr();
        void* pout = out.ptr();
        int64_t count = n;
        void* args[] = {&pa, &pout, &count};
        m.function("affine").launch({blocks_for(n, 128)}, {128}, 0, args, "threaded affine");
        std::vector<float> host = kiln::rocm::to_host<float>(out);
        for (size_t i = 0; i < host.size(); ++i) {
          if (!(host[i] == a[i] * 2.0f + 1.0f)) throw kiln::Error("wrong element " + std::to_string(i));
        }
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(t)] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) {
    CAPTURE(t);
    CHECK(errors[static_cast<size_t>(t)] == "");
    CHECK(seen[static_cast<size_t>(t)] == seen[0]);
  }
  kiln::Counters after = kiln::counters();
  CHECK(after.compiles == before.compiles + 1);
  CHECK(after.memory_hits == before.memory_hits + 7);
  CHECK(after.kernels_launched == before.kernels_launched + 8);
}

TEST_CASE("a block reduction with shuffles at the device's wavefront size sums exactly") {
  if (skip_without_hip()) return;
  const int64_t n = 1000003;
  std::vector<float> x(static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<int>(i % 7) - 3);  // integer sums: exact
  double expect = 0;
  for (float v : x) expect += v;
  const unsigned threads = 1024, blocks = 61;
  kiln::rocm::DeviceBuffer dx = kiln::rocm::to_device(x);
  kiln::rocm::DeviceBuffer dpartial = kiln::rocm::device_alloc(blocks * sizeof(float));
  kiln::rocm::fill_words(dpartial, 0xFFFFFFFFu);
  kiln::rocm::HipFunction sum = test_module().function("block_sum");
  REQUIRE(sum.max_threads_per_block() >= static_cast<int>(threads));
  void* px = dx.ptr();
  void* pp = dpartial.ptr();
  int64_t count = n;
  void* args[] = {&px, &pp, &count};
  sum.launch({blocks}, {threads}, 0, args, "block_sum n=1000003");
  std::vector<float> partial = kiln::rocm::to_host<float>(dpartial);
  double total = 0;
  for (float p : partial) total += p;
  CHECK(total == expect);
}

TEST_CASE("dynamic LDS up to the device's limit works, beyond it is refused") {
  if (skip_without_hip()) return;
  const kiln::rocm::DeviceProperties& p = kiln::rocm::device_properties(0);
  const unsigned threads = 1024;
  const unsigned shared = 32 * 1024;  // more than the kernel needs
  const int n = 5000;
  std::vector<float> a = random_floats(n, 2);
  kiln::rocm::DeviceBuffer da = kiln::rocm::to_device(a);
  kiln::rocm::DeviceBuffer dout = kiln::rocm::device_alloc(n * sizeof(float));
  kiln::rocm::fill_words(dout, 0xFFFFFFFFu);
  kiln::rocm::HipFunction f = test_module().function("reverse_blocks");
  void* pa = da.ptr();
  void* pout = dout.ptr();
  int count = n;
  void* args[] = {&pa, &pout, &count};
  f.launch({blocks_for(n, threads)}, {threads}, shared, args, "reverse_blocks n=5000");
  std::vector<float> out = kiln::rocm::to_host<float>(dout);
  int wrong = 0;
  for (int i = 0; i < n; ++i) {
    int block = i / static_cast<int>(threads), t = i % static_cast<int>(threads);
    int src = block * static_cast<int>(threads) + (static_cast<int>(threads) - 1 - t);
    float expect = src < n ? a[static_cast<size_t>(src)] : 0.f;
    wrong += !(out[static_cast<size_t>(i)] == expect);
  }
  CHECK(wrong == 0);
  CHECK_THROWS_AS(f.launch({1}, {threads}, static_cast<unsigned>(p.max_shared_per_block) + 4096, args), kiln::Error);
}

TEST_CASE("an invalid HIP launch throws naming the kernel and its description") {
  if (skip_without_hip()) return;
  kiln::rocm::HipFunction affine = test_module().function("affine");
  kiln::rocm::DeviceBuffer d = kiln::rocm::device_alloc(64 * sizeof(float));
  void* p = d.ptr();
  int64_t count = 64;
  void* args[] = {&p, &p, &count};
  kiln::Counters before = kiln::counters();
  std::string what;
  try {
    affine.launch({1}, {4096}, 0, args, "affine n=64");  // more threads than any AMD GPU allows in a block
  } catch (const kiln::Error& e) {
    what = e.what();
  }
  REQUIRE_FALSE(what.empty());
  CHECK(what.find("'affine'") != std::string::npos);
  CHECK(what.find("affine n=64") != std::string::npos);
  CHECK(what.find("4096") != std::string::npos);
  CHECK(kiln::counters().kernels_launched == before.kernels_launched);
  // The device is still usable: a correct launch afterwards works.
  affine.launch({1}, {64}, 0, args, "affine n=64");
  kiln::rocm::hip_device(0).synchronize();
}

TEST_CASE("the HIP event timer measures a launch") {
  if (skip_without_hip()) return;
  const int64_t n = 1 << 20;
  kiln::rocm::DeviceBuffer d = kiln::rocm::device_alloc(static_cast<size_t>(n) * sizeof(float));
  kiln::rocm::fill_words(d, 0);
  kiln::rocm::HipFunction affine = test_module().function("affine");
  void* p = d.ptr();
  int64_t count = n;
  void* args[] = {&p, &p, &count};
  kiln::rocm::flush_l2();
  kiln::rocm::EventTimer timer;
  timer.start();
  affine.launch({blocks_for(n, 256)}, {256}, 0, args);
  timer.stop();
  float ms = timer.elapsed_ms();
  CHECK(ms > 0.f);
  CHECK(ms < 1000.f);
}

}  // TEST_SUITE("gpu")
