// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The one doctest main of `kiln_tests`; every tests/<stage>/*.cpp is linked into it.
//
// Tests that need something a plain Debian machine may lack live in doctest suites:
//   TEST_SUITE("nvrtc")   needs NVRTC (libnvrtc); compiles, needs no GPU
//   TEST_SUITE("hiprtc")  needs hipRTC (libhiprtc, or libamdhip64 in ROCm 5); no GPU
//   TEST_SUITE("gpu")     needs a GPU: a CUDA or HIP device
// A test that compiles and also launches when a device is there checks for the device
// itself. Everything else is the `cpu` ctest entry and must pass on any machine.
// A file under tests/gpu/ opens with `TEST_SUITE_BEGIN("gpu");`.
//
// When ctest runs one such suite (`--test-suite=nvrtc`) on a machine without what it
// needs, this main exits 77, which ctest reports as "Skipped" instead of a vacuous
// pass. KILN_TEST_NO_SKIP=1 turns that skip into a failure (on a GPU runner, say).
// NOTE: the probes dlopen the vendor libraries themselves rather than asking kiln, so
// the harness stands apart from the code under test. They err on the side of "present":
// a wrong "present" fails loudly in the suite, a wrong "absent" would hide it.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>

namespace {

constexpr int kSkipExitCode = 77;  // matches SKIP_RETURN_CODE in tests/CMakeLists.txt

// The first of `libraries` that loads and exports `symbol`, or nullptr.
// NOTE: handles stay open; unloading a GPU runtime mid-process is unsafe.
void* load_with(std::initializer_list<std::string> libraries, const char* symbol) {
  for (const std::string& lib : libraries) {
    if (void* handle = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL); handle && dlsym(handle, symbol)) return handle;
  }
  return nullptr;
}

std::string cuda_home() {
  for (const char* name : {"CUDA_HOME", "CUDA_PATH"}) {
    if (const char* v = std::getenv(name); v && *v) return v;
  }
  return "/usr/local/cuda";
}

bool nvrtc_present() {
  const std::string home = cuda_home();
  return load_with({"libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", home + "/lib64/libnvrtc.so",
                    home + "/lib/libnvrtc.so"},
                   "nvrtcCreateProgram") != nullptr;
}

const std::initializer_list<std::string> kHipLibraries = {
    "libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6", "libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5",
    "/opt/rocm/lib/libhiprtc.so", "/opt/rocm/lib/libamdhip64.so"};

bool hiprtc_present() { return load_with(kHipLibraries, "hiprtcCreateProgram") != nullptr; }

int cuda_devices() {
  void* h = load_with({"libcuda.so.1", "libcuda.so"}, "cuDeviceGetCount");
  if (h == nullptr) return 0;
  auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(h, "cuInit"));
  auto count = reinterpret_cast<int (*)(int*)>(dlsym(h, "cuDeviceGetCount"));
  int n = 0;
  return init && init(0) == 0 && count(&n) == 0 ? n : 0;
}

int hip_devices() {
  void* h = load_with(kHipLibraries, "hipGetDeviceCount");
  if (h == nullptr) return 0;
  auto count = reinterpret_cast<int (*)(int*)>(dlsym(h, "hipGetDeviceCount"));
  int n = 0;
  return count(&n) == 0 ? n : 0;  // hipErrorNoDevice (100) on a machine without one
}

// What the suite needs, in words, when this machine lacks it; empty when it has it.
std::string_view missing_for(std::string_view suite) {
  if (suite == "nvrtc") return nvrtc_present() ? "" : "NVRTC (libnvrtc)";
  if (suite == "hiprtc") return hiprtc_present() ? "" : "hipRTC (libhiprtc / libamdhip64)";
  return cuda_devices() > 0 || hip_devices() > 0 ? "" : "a CUDA or HIP device";  // "gpu"
}

bool is_guarded_suite(std::string_view suite) { return suite == "gpu" || suite == "nvrtc" || suite == "hiprtc"; }

// The suite named by a lone `--test-suite=X` / `-ts=X` when X is a guarded suite, else "".
std::string_view requested_guarded_suite(int argc, char** argv) {
  std::string_view found;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    for (std::string_view prefix : {"--test-suite=", "-ts="}) {
      if (arg.substr(0, prefix.size()) != prefix) continue;
      std::string_view value = arg.substr(prefix.size());
      if (!is_guarded_suite(value) || !found.empty()) return {};
      found = value;
    }
  }
  return found;
}

}  // namespace

int main(int argc, char** argv) {
  // The foundation suite re-run on a GPU (ctest entries gpu-foundation, hip-foundation) needs a device too.
  const char* device = std::getenv("KILN_DEVICE");
  if (device && std::string_view(device).substr(0, 4) == "cuda" && cuda_devices() == 0) {
    std::printf("[kiln] KILN_DEVICE=%s but this machine has no CUDA device: skipped\n", device);
    return kSkipExitCode;
  }
  if (device && std::string_view(device).substr(0, 3) == "hip" && hip_devices() == 0) {
    std::printf("[kiln] KILN_DEVICE=%s but this machine has no HIP device: skipped\n", device);
    return kSkipExitCode;
  }
  if (std::string_view suite = requested_guarded_suite(argc, argv); !suite.empty()) {
    if (std::string_view missing = missing_for(suite); !missing.empty()) {
      const char* require = std::getenv("KILN_TEST_NO_SKIP");
      bool required = require != nullptr && std::strcmp(require, "") != 0 && std::strcmp(require, "0") != 0;
      std::printf("[kiln] test suite '%.*s' needs %.*s, which this machine lacks: %s\n", static_cast<int>(suite.size()),
                  suite.data(), static_cast<int>(missing.size()), missing.data(),
                  required ? "FAILED (KILN_TEST_NO_SKIP is set)" : "skipped");
      return required ? EXIT_FAILURE : kSkipExitCode;
    }
  }
  doctest::Context context(argc, argv);
  return context.run();
}
