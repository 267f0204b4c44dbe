// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Tests of runtime/cuda_driver.hpp that need no GPU: a machine without one is
// told so cleanly, every driver entry point kiln uses exists under the name it
// binds (checked against the toolkit's stub libcuda where there is one), and
// errors are named.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "kiln/core/device.hpp"
#include "kiln/core/tensor.hpp"
#include "kiln/runtime/cuda_runtime.hpp"

namespace {

// The CUDA toolkit's link stub: exports every driver symbol, implements none.
std::string stub_libcuda() {
  std::vector<std::string> dirs;
  if (const char* home = std::getenv("CUDA_HOME")) dirs.push_back(std::string(home) + "/lib64/stubs");
  dirs.push_back("/usr/local/cuda/lib64/stubs");
  for (const auto& d : dirs) {
    struct stat st {};
    if (::stat((d + "/libcuda.so").c_str(), &st) == 0) return d + "/libcuda.so";
  }
  return {};
}

}  // namespace

TEST_SUITE("cuda_driver") {

TEST_CASE("without a usable driver every entry point says why, and nothing throws on probing") {
  bool available = kiln::cu::cuda_available();  // noexcept by declaration
  static_assert(noexcept(kiln::cu::cuda_available()));
  static_assert(noexcept(kiln::cu::cuda_device_count()));
  if (available) {
    CHECK(kiln::cu::cuda_device_count() > 0);
    CHECK(kiln::cu::cuda_unavailable_reason().empty());
    return;
  }
  CHECK(kiln::cu::cuda_device_count() == 0);
  std::string why = kiln::cu::cuda_unavailable_reason();
  CHECK_FALSE(why.empty());
  MESSAGE("CUDA unavailable: " << why);
  CHECK_THROWS_AS(kiln::cu::driver(), kiln::Error);
  CHECK_THROWS_AS(kiln::cu::device_properties(0), kiln::Error);
  CHECK_THROWS_AS(kiln::cu::device_alloc(16), kiln::Error);
  CHECK_THROWS_AS(kiln::cu::load_cuda_module("extern \"C\" __global__ void k() {}"), kiln::Error);
  CHECK_THROWS_AS(kiln::Storage(16, kiln::cuda(0)), kiln::Error);
  CHECK(kiln::default_device() == kiln::cpu());
}

TEST_CASE("every driver symbol kiln binds exists in the toolkit's libcuda") {
  std::string stub = stub_libcuda();
  if (stub.empty()) {
    MESSAGE("no CUDA toolkit stub libcuda.so: skipped");
    return;
  }
  kiln::cu::DriverApi api;
  std::string why;
  REQUIRE_MESSAGE(kiln::cu::load_driver_library(stub.c_str(), api, why), why);
  CHECK(bool(api.cuLaunchKernel));
  CHECK(bool(api.cuEventElapsedTime));
  // The stub implements nothing: initialising it fails with a named error, not a crash.
  kiln::cu::CUresult r = api.cuInit(0);
  CHECK(r != kiln::cu::kSuccess);
  CHECK(kiln::cu::detail::driver_error_text(api, r).find("CUDA_ERROR") != std::string::npos);
}

TEST_CASE("a library that is not the driver is refused with the missing symbol") {
  kiln::cu::DriverApi api;
  std::string why;
  CHECK_FALSE(kiln::cu::load_driver_library("libc.so.6", api, why));
  CHECK(why.find("cuGetErrorName") != std::string::npos);
  CHECK(api.library == nullptr);
  CHECK_FALSE(kiln::cu::load_driver_library("libkiln-no-such-library.so", api, why));
  CHECK_FALSE(why.empty());
}

TEST_CASE("check names the error code and the call") {
  CHECK_NOTHROW(kiln::cu::check(kiln::cu::kSuccess, "cuInit"));
  std::string what;
  try {
    kiln::cu::check(kiln::cu::kErrorOutOfMemory, "cuMemAlloc of 12 bytes");
  } catch (const kiln::Error& e) {
    what = e.what();
  }
  CHECK(what.find("CUDA_ERROR_OUT_OF_MEMORY") != std::string::npos);
  CHECK(what.find("cuMemAlloc of 12 bytes") != std::string::npos);
  CHECK(kiln::cu::error_text(123456).find("123456") != std::string::npos);
}

}  // TEST_SUITE("cuda_driver")
