// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Tests of runtime/hip_runtime.hpp that need no GPU, mirroring
// tests/cuda/test_cuda_driver.cpp: a machine without an AMD GPU is told so
// cleanly, every HIP entry point kiln uses exists under the name it binds
// (checked against the installed libamdhip64 where there is one, which loads and
// binds without a GPU), and errors are named.
#include <doctest/doctest.h>

#include <string>

#include "kiln/runtime/hip_runtime.hpp"

TEST_SUITE("hip_api") {

TEST_CASE("without a usable AMD GPU every entry point says why, and nothing throws on probing") {
  bool available = kiln::rocm::hip_available();  // noexcept by declaration
  static_assert(noexcept(kiln::rocm::hip_available()));
  static_assert(noexcept(kiln::rocm::hip_device_count()));
  if (available) {
    CHECK(kiln::rocm::hip_device_count() > 0);
    CHECK(kiln::rocm::hip_unavailable_reason().empty());
    return;
  }
  CHECK(kiln::rocm::hip_device_count() == 0);
  std::string why = kiln::rocm::hip_unavailable_reason();
  CHECK_FALSE(why.empty());
  MESSAGE("HIP unavailable: " << why);
  CHECK_THROWS_AS(kiln::rocm::hip_api(), kiln::Error);
  CHECK_THROWS_AS(kiln::rocm::device_properties(0), kiln::Error);
  CHECK_THROWS_AS(kiln::rocm::hip_device(0), kiln::Error);
  CHECK_THROWS_AS(kiln::rocm::device_alloc(16), kiln::Error);
  CHECK_THROWS_AS(kiln::rocm::load_hip_module("extern \"C\" __global__ void k() {}"), kiln::Error);
}

TEST_CASE("every HIP symbol kiln binds exists in the installed libamdhip64") {
  kiln::rocm::HipApi api;
  std::string why, tried;
  bool loaded = false;
  for (const char* lib : {"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"}) {
    if ((loaded = kiln::rocm::load_hip_library(lib, api, why))) break;
    tried += std::string(" ") + lib + ": " + why + ";";
  }
  if (!loaded) {
    MESSAGE("no libamdhip64 here:" << tried << " skipped");
    return;
  }
  CHECK(bool(api.hipModuleLaunchKernel));
  CHECK(bool(api.hipGetDeviceProperties));
  // Needs no GPU: the version, and a named answer from hipInit either way.
  int version = 0;
  CHECK(api.hipRuntimeGetVersion(&version) == kiln::rocm::kSuccess);
  CHECK(version > 50000000);
  kiln::rocm::hipError_t r = api.hipInit(0);
  std::string text = kiln::rocm::detail::hip_error_text(api, r);
  CHECK(text.rfind("hip", 0) == 0);
  MESSAGE(api.path << ": HIP " << version << ", hipInit: " << text);
}

TEST_CASE("a library that is not HIP is refused with the missing symbol") {
  kiln::rocm::HipApi api;
  std::string why;
  CHECK_FALSE(kiln::rocm::load_hip_library("libc.so.6", api, why));
  CHECK(why.find("hipGetErrorName") != std::string::npos);
  CHECK(api.library == nullptr);
  CHECK_FALSE(kiln::rocm::load_hip_library("libkiln-no-such-library.so", api, why));
  CHECK_FALSE(why.empty());
}

TEST_CASE("check names the HIP error code and the call") {
  CHECK_NOTHROW(kiln::rocm::check(kiln::rocm::kSuccess, "hipInit"));
  std::string what;
  try {
    kiln::rocm::check(kiln::rocm::kErrorOutOfMemory, "hipMalloc of 12 bytes");
  } catch (const kiln::Error& e) {
    what = e.what();
  }
  CHECK(what.find("hipErrorOutOfMemory") != std::string::npos);
  CHECK(what.find("hipMalloc of 12 bytes") != std::string::npos);
  CHECK(kiln::rocm::error_text(123456).find("123456") != std::string::npos);
}

}  // TEST_SUITE("hip_api")
