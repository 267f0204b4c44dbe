// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// hipRTC without a GPU: the kernel shapes kiln's code generator emits compile for
// CDNA (gfx908, gfx90a) and RDNA2 (gfx1030) into AMDGPU code objects for the
// right target; a second compile is a cache hit; a bad kernel throws
// CompileError with the log; targets this hipRTC does not know are reported,
// never crash the process. Skips (with a MESSAGE) where libamdhip64 is absent.
#include <doctest/doctest.h>

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "kiln/jit/hiprtc.hpp"
#include "kiln/runtime/counters.hpp"
#include "hip_test_kernels.hpp"

namespace {

using hip_test::kBlockSum;
using hip_test::kGelu;
using hip_test::kMixed16;
using hip_test::kPrelude;

bool skip_without_hiprtc() {
  if (kiln::jit::hiprtc_available()) return false;
  MESSAGE("hipRTC not found (libamdhip64 / libhiprtc): skipped. " << kiln::jit::hiprtc_version_string());
  return true;
}

int warp_size_of(const std::string& arch) { return arch.rfind("gfx10", 0) == 0 || arch.rfind("gfx11", 0) == 0 ? 32 : 64; }

// EF_AMDGPU_MACH, the low byte of e_flags, for the targets tested here.
int mach_of(const std::string& arch) {
  if (arch == "gfx908") return 0x30;
  if (arch == "gfx90a") return 0x3f;
  if (arch == "gfx1030") return 0x36;
  return 0;
}

// Sets (or unsets, with nullptr) an environment variable for a scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_old_ = old != nullptr;
    if (had_old_) old_ = old;
    if (value != nullptr) {
      ::setenv(name, value, 1);
    } else {
      ::unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (had_old_) {
      ::setenv(name_.c_str(), old_.c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_old_ = false;
};

// Removes a directory of plain files (what the cache and the dumps write).
void remove_flat_dir(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") ::unlink((dir + "/" + name).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(dir.c_str());
}

std::string make_temp_dir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/kiln-hiprtc-test-XXXXXX";
  REQUIRE(::mkdtemp(dir.data()) != nullptr);
  return dir;
}

// A private, empty cache for the duration of a test, so that "first compile,
// then hit" does not depend on what earlier runs left in the shared cache.
class ScopedCacheDir {
 public:
  ScopedCacheDir() : dir_(make_temp_dir()), env_("KILN_CACHE_DIR", dir_.c_str()) {}
  ~ScopedCacheDir() { remove_flat_dir(dir_); }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  ScopedEnv env_;
};

std::string kept_source_path(const std::string& message) {
  auto at = message.find("source: ");
  if (at == std::string::npos) return {};
  at += 8;
  return message.substr(at, message.find('\n', at) - at);
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_SUITE("hiprtc") {

TEST_CASE("hipRTC compiles kiln's kernel shapes for CDNA and RDNA2 targets") {
  if (skip_without_hiprtc()) return;
  ScopedCacheDir cache;
  MESSAGE(kiln::jit::hiprtc_version_string());
  struct Kernel {
    const char* name;
    const char* body;
  };
  const Kernel kernels[] = {{"gelu", kGelu}, {"block_sum", kBlockSum}, {"bf16_f16", kMixed16}};
  for (std::string arch : {"gfx90a", "gfx908", "gfx1030"}) {
    CAPTURE(arch);
    REQUIRE(kiln::jit::hiprtc_target_supported(arch));
    std::string warp = "-DKILN_WARP_SIZE=" + std::to_string(warp_size_of(arch));
    for (const auto& k : kernels) {
      std::string kernel = k.name;
      CAPTURE(kernel);
      auto t0 = std::chrono::steady_clock::now();
      std::string code = kiln::jit::hiprtc_compile(std::string(kPrelude) + k.body, k.name, arch, {warp});
      MESSAGE(arch << " " << kernel << ": " << code.size() << " bytes in " << seconds_since(t0) << " s");
      CHECK(kiln::jit::code_object_mach(code) == mach_of(arch));
    }
  }
}

TEST_CASE("a second hipRTC compile of the same source is a cache hit") {
  if (skip_without_hiprtc()) return;
  ScopedCacheDir cache;
  std::string source = std::string(kPrelude) + kGelu;
  std::vector<std::string> options = {"-DKILN_WARP_SIZE=64"};
  auto before = kiln::counters();
  std::string first = kiln::jit::hiprtc_compile(source, "ew", "gfx90a", options);
  auto mid = kiln::counters();
  auto t0 = std::chrono::steady_clock::now();
  std::string second = kiln::jit::hiprtc_compile(source, "ew", "gfx90a", options);
  double hit_seconds = seconds_since(t0);
  auto after = kiln::counters();
  MESSAGE("cache hit in " << hit_seconds << " s");
  CHECK(mid.compiles == before.compiles + 1);
  CHECK(after.compiles == mid.compiles);
  CHECK(after.disk_hits == mid.disk_hits + 1);
  CHECK(first == second);
  // Another option or target is another entry.
  std::string other = kiln::jit::hiprtc_compile(source, "ew", "gfx908", options);
  CHECK(kiln::counters().compiles == after.compiles + 1);
  CHECK(other != first);
}

TEST_CASE("a kernel hipRTC rejects throws CompileError with the log and the kept source") {
  if (skip_without_hiprtc()) return;
  ScopedCacheDir cache;
  ScopedEnv no_dump("KILN_DUMP", nullptr);
  // Written for wave32 but compiled for a wave64 target: the prelude's guard fires.
  std::string message;
  try {
    kiln::jit::hiprtc_compile(std::string(kPrelude) + kBlockSum, "wrong_warp", "gfx90a", {"-DKILN_WARP_SIZE=32"});
  } catch (const kiln::CompileError& e) {
    message = e.what();
  }
  REQUIRE(!message.empty());
  CHECK(message.find("wrong_warp") != std::string::npos);
  CHECK(message.find("gfx90a") != std::string::npos);
  CHECK(message.find("static assertion failed") != std::string::npos);
  CHECK(message.find("KILN_WARP_SIZE does not match") != std::string::npos);
  std::string kept = kept_source_path(message);
  CAPTURE(kept);
  REQUIRE(file_exists(kept));  // without KILN_DUMP: a private temp directory
  remove_flat_dir(kept.substr(0, kept.rfind('/')));

  // With KILN_DUMP, the source and the log are in the dump directory.
  std::string dump = make_temp_dir();
  {
    ScopedEnv with_dump("KILN_DUMP", dump.c_str());
    try {
      kiln::jit::hiprtc_compile("extern \"C\" __global__ void k(float* p) { p[0] = nope; }", "syntax", "gfx90a");
      FAIL("compiled a kernel that uses an undeclared name");
    } catch (const kiln::CompileError& e) {
      message = e.what();
    }
  }
  CHECK(message.find("undeclared identifier 'nope'") != std::string::npos);
  kept = kept_source_path(message);
  CHECK(kept.rfind(dump + "/syntax-", 0) == 0);
  CHECK(file_exists(kept));
  CHECK(file_exists(kept.substr(0, kept.size() - 4) + ".log"));
  remove_flat_dir(dump);
}

TEST_CASE("targets this hipRTC does not know are refused, not crashed on") {
  if (skip_without_hiprtc()) return;
  ScopedCacheDir cache;
  for (std::string arch : {"gfx942", "gfx1100"}) {
    CAPTURE(arch);
    auto t0 = std::chrono::steady_clock::now();
    bool supported = kiln::jit::hiprtc_target_supported(arch);
    MESSAGE(arch << std::string(supported ? " supported" : " unsupported") << " by " << kiln::jit::hiprtc_version_string()
                 << " (probe " << seconds_since(t0) << " s)");
    CHECK(kiln::jit::hiprtc_target_supported(arch) == supported);  // cached, same answer
    std::string warp = "-DKILN_WARP_SIZE=" + std::to_string(warp_size_of(arch));
    if (supported) {
      CHECK(kiln::jit::code_object_mach(
                kiln::jit::hiprtc_compile(std::string(kPrelude) + kGelu, "ew", arch, {warp})) > 0);
    } else {
      std::string message;
      try {
        kiln::jit::hiprtc_compile(std::string(kPrelude) + kGelu, "ew", arch, {warp});
      } catch (const kiln::CompileError&) {
        FAIL("an unsupported target must be a kiln::Error, not a CompileError");
      } catch (const kiln::Error& e) {
        message = e.what();
      }
      CHECK(message.find("cannot compile for " + arch) != std::string::npos);
    }
  }
  // Names that are no AMD target never reach the compiler.
  CHECK_FALSE(kiln::jit::hiprtc_target_supported("sm_80"));
  CHECK_FALSE(kiln::jit::hiprtc_target_supported("gfx90a -O0"));
  CHECK_THROWS_AS(kiln::jit::hiprtc_compile(kGelu, "ew", "sm_80", {}), kiln::Error);
}

}  // TEST_SUITE
