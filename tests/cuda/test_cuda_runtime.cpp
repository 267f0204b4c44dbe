// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Tests of runtime/cuda_runtime.hpp on a real NVIDIA GPU: the caching
// allocator, copies, module loading and launching (from several threads), launch
// errors and the event timer. Each test prints a message and returns where there
// is no CUDA GPU.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kiln/runtime/counters.hpp"
#include "kiln/runtime/cuda_runtime.hpp"

namespace {

bool skip_without_cuda() {
  if (kiln::cu::cuda_available()) return false;
  MESSAGE("no CUDA GPU: skipped");
  return true;
}

const std::string kAffineSource = R"(
extern "C" __global__ void affine(const float* __restrict__ a, float* __restrict__ out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] * 2.0f + 1.0f;
}

// Dynamic shared memory beyond the 48 KiB default: each block stages its
// elements through `bytes` of shared memory and writes them back reversed
// within the block.
extern "C" __global__ void reverse_blocks(const float* __restrict__ a, float* __restrict__ out, int n) {
  extern __shared__ float stage[];
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  stage[threadIdx.x] = i < n ? a[i] : 0.f;
  __syncthreads();
  int j = blockIdx.x * blockDim.x + (blockDim.x - 1 - threadIdx.x);
  if (j < n) out[j] = stage[threadIdx.x];
}
)";

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-100.f, 100.f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

unsigned blocks_for(int n, unsigned threads) { return (static_cast<unsigned>(n) + threads - 1) / threads; }

}  // namespace

TEST_SUITE("gpu") {

TEST_CASE("device properties are read once and are plausible") {
  if (skip_without_cuda()) return;
  const kiln::cu::DeviceProperties& p = kiln::cu::device_properties(0);
  CHECK(&p == &kiln::cu::device_properties(0));
  CHECK(p.cc_major >= 5);
  CHECK(p.sm_count > 0);
  CHECK(p.warp_size == 32);
  CHECK(p.max_threads_per_block >= 1024);
  CHECK(p.max_shared_per_block_optin >= p.max_shared_per_block);
  CHECK(p.l2_bytes > 0);
  CHECK(p.total_memory > 0);
  MESSAGE(p.name << ": sm_" << p.cc() << ", " << p.sm_count << " SMs, L2 " << p.l2_bytes / 1024 << " KiB, "
                 << p.max_shared_per_block_optin / 1024 << " KiB shared opt-in");
}

TEST_CASE("the caching allocator hands a freed block out again without cuMemAlloc") {
  if (skip_without_cuda()) return;
  kiln::cu::CachingAllocator& alloc = kiln::cu::cuda_device(0).allocator();
  kiln::cu::CUdeviceptr first = 0;
  {
    kiln::cu::DeviceBuffer b = kiln::cu::device_alloc(1000);
    first = b.ptr();
    CHECK(first != 0);
    CHECK(b.size() == 1000);
  }
  kiln::cu::AllocatorStats before = alloc.stats();
  kiln::cu::DeviceBuffer again = kiln::cu::device_alloc(1000);
  kiln::cu::AllocatorStats after = alloc.stats();
  CHECK(again.ptr() == first);
  CHECK(after.device_allocs == before.device_allocs);
  CHECK(after.reuses == before.reuses + 1);

  // Another size class is a new block; empty_cache hands cached blocks back.
  { kiln::cu::DeviceBuffer big = kiln::cu::device_alloc(3 << 20); }
  CHECK(alloc.stats().bytes_cached >= (size_t{3} << 20));
  kiln::cu::empty_cache();
  CHECK(alloc.stats().bytes_cached == 0);
  CHECK(alloc.stats().device_frees > before.device_frees);
  CHECK_THROWS_AS(alloc.release(again.ptr() + 4), kiln::Error);  // never handed out
}

TEST_CASE("host -> device -> host round trip of random data") {
  if (skip_without_cuda()) return;
  const size_t bytes = 1000003;  // odd: no vector-width luck
  std::vector<unsigned char> host(bytes);
  std::mt19937 rng(7);
  for (auto& b : host) b = static_cast<unsigned char>(rng());
  kiln::cu::DeviceBuffer d = kiln::cu::device_alloc(bytes);
  kiln::cu::fill_bytes(d, 0xAB);
  kiln::cu::copy_to_device(d, host.data(), bytes);
  kiln::cu::DeviceBuffer e = kiln::cu::device_alloc(bytes);
  kiln::cu::copy_on_device(e, d, bytes);
  std::vector<unsigned char> back(bytes, 0);
  kiln::cu::copy_to_host(back.data(), e, bytes);
  CHECK(std::memcmp(back.data(), host.data(), bytes) == 0);

  // Offsets, and a copy that would overrun is refused before the driver sees it.
  unsigned char middle[5] = {};
  kiln::cu::copy_to_host(middle, d, 5, 1000);
  CHECK(std::memcmp(middle, host.data() + 1000, 5) == 0);
  CHECK_THROWS_AS(kiln::cu::copy_to_host(back.data(), d, 10, bytes - 5), kiln::Error);
}

TEST_CASE("a module loads once and its kernel writes every element of an odd size") {
  if (skip_without_cuda()) return;
  const int n = 100003;
  std::vector<float> a = random_floats(n, 1);
  kiln::cu::DeviceBuffer da = kiln::cu::to_device(a);
  kiln::cu::DeviceBuffer dout = kiln::cu::device_alloc(n * sizeof(float));
  kiln::cu::fill_words(dout, 0xFFFFFFFFu);  // NaN: an element the kernel skips shows up

  kiln::cu::CudaModule& module = kiln::cu::load_cuda_module(kAffineSource, 0, {}, "affine_test");
  kiln::cu::CudaFunction affine = module.function("affine");
  kiln::Counters before = kiln::counters();
  kiln::cu::CUdeviceptr pa = da.ptr(), pout = dout.ptr();
  int count = n;
  void* args[] = {&pa, &pout, &count};
  affine.launch({blocks_for(n, 256)}, {256}, 0, args, "affine n=100003");
  CHECK(kiln::counters().kernels_launched == before.kernels_launched + 1);

  std::vector<float> out = kiln::cu::to_host<float>(dout);
  REQUIRE(out.size() == a.size());
  int wrong = 0;
  for (int i = 0; i < n; ++i) wrong += !(out[i] == a[i] * 2.0f + 1.0f);
  CHECK(wrong == 0);

  // The same source again is the same module, from memory.
  kiln::cu::CudaModule& again = kiln::cu::load_cuda_module(kAffineSource, 0, {}, "affine_test");
  CHECK(&again == &module);
  CHECK(kiln::counters().memory_hits == before.memory_hits + 1);
  CHECK(module.function("affine").handle() == affine.handle());
  CHECK_THROWS_AS(module.function("no_such_kernel"), kiln::Error);
}

TEST_CASE("threads loading one new source at once compile it once and can all launch") {
  if (skip_without_cuda()) return;
  // A nonce makes the source new to the disk cache too, so exactly one compile is due.
  std::string source = kAffineSource + "// nonce " +
                       std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()) + "\n";
  const int n = 1000;
  std::vector<float> a = random_floats(n, 3);
  kiln::cu::DeviceBuffer da = kiln::cu::to_device(a);
  kiln::Counters before = kiln::counters();
  std::vector<kiln::cu::CudaModule*> seen(8, nullptr);
  std::vector<std::string> errors(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      try {
        kiln::cu::CudaModule& m = kiln::cu::load_cuda_module(source, 0, {}, "threaded");
        seen[t] = &m;
        // A fresh thread has no current context: the launch must set it.
        kiln::cu::DeviceBuffer out = kiln::cu::device_alloc(n * sizeof(float));
        kiln::cu::CUdeviceptr pa = da.ptr(), pout = out.ptr();
        int count = n;
        void* args[] = {&pa, &pout, &count};
        m.function("affine").launch({blocks_for(n, 128)}, {128}, 0, args, "threaded affine");
        std::vector<float> host = kiln::cu::to_host<float>(out);
        for (int i = 0; i < n; ++i) {
          if (!(host[i] == a[i] * 2.0f + 1.0f)) throw kiln::Error("wrong element " + std::to_string(i));
        }
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) {
    CAPTURE(t);
    CHECK(errors[t] == "");
    CHECK(seen[t] == seen[0]);
  }
  kiln::Counters after = kiln::counters();
  CHECK(after.compiles == before.compiles + 1);
  CHECK(after.memory_hits == before.memory_hits + 7);
  CHECK(after.kernels_launched == before.kernels_launched + 8);
}

TEST_CASE("dynamic shared memory above 48 KiB is opted into") {
  if (skip_without_cuda()) return;
  const kiln::cu::DeviceProperties& p = kiln::cu::device_properties(0);
  const unsigned threads = 1024;
  const unsigned shared = 64 * 1024;  // more than the kernel needs: the point is the opt-in
  if (p.max_shared_per_block_optin < static_cast<int>(shared)) {
    MESSAGE("device allows only " << p.max_shared_per_block_optin << " bytes of shared memory: skipped");
    return;
  }
  const int n = 5000;
  std::vector<float> a = random_floats(n, 2);
  kiln::cu::DeviceBuffer da = kiln::cu::to_device(a);
  kiln::cu::DeviceBuffer dout = kiln::cu::device_alloc(n * sizeof(float));
  kiln::cu::fill_words(dout, 0xFFFFFFFFu);
  kiln::cu::CudaFunction f = kiln::cu::load_cuda_module(kAffineSource).function("reverse_blocks");
  kiln::cu::CUdeviceptr pa = da.ptr(), pout = dout.ptr();
  int count = n;
  void* args[] = {&pa, &pout, &count};
  f.launch({blocks_for(n, threads)}, {threads}, shared, args, "reverse_blocks n=5000");
  std::vector<float> out = kiln::cu::to_host<float>(dout);
  int wrong = 0;
  for (int i = 0; i < n; ++i) {
    int block = i / static_cast<int>(threads), t = i % static_cast<int>(threads);
    int src = block * static_cast<int>(threads) + (static_cast<int>(threads) - 1 - t);
    float expect = src < n ? a[src] : 0.f;
    wrong += !(out[i] == expect);
  }
  CHECK(wrong == 0);
}

TEST_CASE("an invalid launch throws naming the kernel and its description") {
  if (skip_without_cuda()) return;
  kiln::cu::CudaFunction affine = kiln::cu::load_cuda_module(kAffineSource, 0, {}, "affine_test").function("affine");
  kiln::cu::DeviceBuffer d = kiln::cu::device_alloc(64 * sizeof(float));
  kiln::cu::CUdeviceptr p = d.ptr();
  int count = 64;
  void* args[] = {&p, &p, &count};
  kiln::Counters before = kiln::counters();
  std::string what;
  try {
    affine.launch({1}, {4096}, 0, args, "affine n=64");  // more threads than any GPU allows in a block
  } catch (const kiln::Error& e) {
    what = e.what();
  }
  REQUIRE_FALSE(what.empty());
  CHECK(what.find("'affine'") != std::string::npos);
  CHECK(what.find("affine n=64") != std::string::npos);
  CHECK(what.find("4096") != std::string::npos);
  CHECK(kiln::counters().kernels_launched == before.kernels_launched);
  // The context is still usable: a correct launch afterwards works.
  affine.launch({1}, {64}, 0, args, "affine n=64");
  kiln::cu::cuda_device(0).synchronize();
}

TEST_CASE("the event timer measures a launch") {
  if (skip_without_cuda()) return;
  const int n = 1 << 20;
  kiln::cu::DeviceBuffer d = kiln::cu::device_alloc(n * sizeof(float));
  kiln::cu::fill_words(d, 0);
  kiln::cu::CudaFunction affine = kiln::cu::load_cuda_module(kAffineSource, 0, {}, "affine_test").function("affine");
  kiln::cu::CUdeviceptr p = d.ptr();
  int count = n;
  void* args[] = {&p, &p, &count};
  kiln::cu::flush_l2();
  kiln::cu::EventTimer timer;
  timer.start();
  affine.launch({blocks_for(n, 256)}, {256}, 0, args);
  timer.stop();
  float ms = timer.elapsed_ms();
  CHECK(ms > 0.f);
  CHECK(ms < 1000.f);
}

}  // TEST_SUITE("gpu")
