// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The CUDA backend's compiler. Takes in CUDA C++ source (one NVRTC program may
// hold every `extern "C" __global__` kernel of a plan, so one compile serves the
// plan) and a target compute capability; gives out a cubin: machine code for
// sm_XY, never PTX, so loading it costs ~0.1 ms instead of a driver JIT.
// NVRTC is dlopened at run time (libnvrtc.so.13, .so.12, .so, then
// $CUDA_HOME/lib64 and /usr/local/cuda/lib64); nothing is linked, and a program
// without NVRTC is told so by nvrtc_available() (never throws) or a kiln::Error.
//
// Lookup: disk cache (jit/cache.hpp, extension "cubin") -> NVRTC. Key =
// hash("kiln-nvrtc", source, options, arch, NVRTC version, "cubin"). The memory
// layer (key -> loaded CUmodule per device) is the runtime's
// (runtime/cuda_runtime.hpp).
//
// Options of every compile, then the caller's extra options (which may override):
//   --gpu-architecture=sm_XY  machine code for the device; a caller may pass its
//                             own sm_ target instead, e.g. sm_90a for wgmma/TMA
//   -std=c++17                generated source needs no more
//   -default-device           unannotated functions are device functions
//   --fmad=true               fused multiply-add (NVRTC's default, stated so the
//                             key says it). NOTE: no --use_fast_math: kernels keep
//                             IEEE division, sqrt, denormals and NaN/Inf, to match
//                             eager mode and the CPU backend.
//
// NOTE: NVRTC 13.0 has no built-in cuda_fp16.h / cuda_bf16.h: `#include
// <cuda_bf16.h>` fails unless `-I<toolkit>/include` is passed, and a machine may
// have libnvrtc without the toolkit headers. Generated code therefore defines its
// own 16-bit helpers; cuda_toolkit_include_dir() finds the headers where present.
//
// KILN_DUMP=dir writes every source compiled (<name>-<hex>.cu) and its options and
// NVRTC log (<name>-<hex>.log). A failed compile throws kiln::CompileError with
// the log and the path of the kept source. KILN_LOG=jit prints each compile and
// its time.
#pragma once

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/log.hpp"
#include "kiln/jit/cache.hpp"
#include "kiln/jit/rtc_common.hpp"

struct _nvrtcProgram;  // nvrtc.h's own tag, so handles interoperate

namespace kiln::jit {

using nvrtcResult = int;  // nvrtc.h: enum nvrtcResult
using nvrtcProgram = ::_nvrtcProgram*;

inline constexpr nvrtcResult kNvrtcSuccess = 0;

// The entry points kiln calls (nvrtc.h, CUDA 11.2 and later).
struct NvrtcApi {
  void* library = nullptr;  // never closed: cubins may still be in flight
  std::string path;
  int major = 0, minor = 0;
  std::vector<int> archs;  // e.g. {75, 80, 86, 87, 89, 90, 100, ...}; empty if NVRTC cannot say

  const char* (*nvrtcGetErrorString)(nvrtcResult) = nullptr;
  nvrtcResult (*nvrtcVersion)(int*, int*) = nullptr;
  nvrtcResult (*nvrtcGetNumSupportedArchs)(int*) = nullptr;  // optional
  nvrtcResult (*nvrtcGetSupportedArchs)(int*) = nullptr;     // optional
  nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                                    const char* const*) = nullptr;
  nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram*) = nullptr;
  nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram, int, const char* const*) = nullptr;
  nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram, char*) = nullptr;
  nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram, size_t*) = nullptr;
  nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram, char*) = nullptr;
};

namespace nvrtc_detail {

// Where to look for a CUDA toolkit library (`lib`: "libnvrtc", "libcublasLt"), in
// order: the loader's search path first (so LD_LIBRARY_PATH and ldconfig win), newest
// ABI first, then the toolkit directories.
inline std::vector<std::string> toolkit_library_candidates(const std::string& lib) {
  std::vector<std::string> files = {lib + ".so.13", lib + ".so.12", lib + ".so"}, out = files;
  std::vector<std::string> dirs;
  if (std::string home = rtc::env_or_empty("CUDA_HOME"); !home.empty()) dirs.push_back(home + "/lib64");
  if (std::string home = rtc::env_or_empty("CUDA_PATH"); !home.empty()) dirs.push_back(home + "/lib64");
  dirs.push_back("/usr/local/cuda/lib64");
  for (const auto& dir : dirs)
    for (const auto& file : files) out.push_back(dir + "/" + file);
  return out;
}
inline std::vector<std::string> nvrtc_candidates() { return toolkit_library_candidates("libnvrtc"); }

template <class Fn>
bool bind_nvrtc(void* library, Fn& slot, const char* name) {
  slot = reinterpret_cast<Fn>(::dlsym(library, name));
  return slot != nullptr;
}

struct NvrtcState {
  NvrtcApi api;
  bool loaded = false;
  std::string why;
};

inline NvrtcState probe_nvrtc() noexcept {
  NvrtcState s;
  try {
    std::string tried;
    for (const std::string& candidate : nvrtc_candidates()) {
      void* lib = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) {
        const char* err = ::dlerror();
        tried += (tried.empty() ? "" : "; ") + (err ? std::string(err) : candidate);
        continue;
      }
      NvrtcApi& a = s.api;
      a = NvrtcApi{};
      const char* missing = nullptr;
      auto need = [&](auto& slot, const char* name) {
        if (missing == nullptr && !bind_nvrtc(lib, slot, name)) missing = name;
      };
      need(a.nvrtcGetErrorString, "nvrtcGetErrorString");
      need(a.nvrtcVersion, "nvrtcVersion");
      need(a.nvrtcCreateProgram, "nvrtcCreateProgram");
      need(a.nvrtcDestroyProgram, "nvrtcDestroyProgram");
      need(a.nvrtcCompileProgram, "nvrtcCompileProgram");
      need(a.nvrtcGetCUBINSize, "nvrtcGetCUBINSize");
      need(a.nvrtcGetCUBIN, "nvrtcGetCUBIN");
      need(a.nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize");
      need(a.nvrtcGetProgramLog, "nvrtcGetProgramLog");
      if (missing != nullptr || a.nvrtcVersion(&a.major, &a.minor) != kNvrtcSuccess) {
        tried += (tried.empty() ? "" : "; ") + candidate + ": " +
                 (missing ? std::string("does not export ") + missing : std::string("nvrtcVersion failed"));
        a = NvrtcApi{};
        ::dlclose(lib);
        continue;
      }
      bind_nvrtc(lib, a.nvrtcGetNumSupportedArchs, "nvrtcGetNumSupportedArchs");
      bind_nvrtc(lib, a.nvrtcGetSupportedArchs, "nvrtcGetSupportedArchs");
      int n = 0;
      if (a.nvrtcGetNumSupportedArchs && a.nvrtcGetSupportedArchs && a.nvrtcGetNumSupportedArchs(&n) == 0 &&
          n > 0) {
        a.archs.resize(static_cast<size_t>(n));
        if (a.nvrtcGetSupportedArchs(a.archs.data()) != kNvrtcSuccess) a.archs.clear();
      }
      a.library = lib;
      a.path = candidate;
      s.loaded = true;
      return s;
    }
    s.why = "NVRTC was not found (" + tried + "); install the CUDA toolkit's NVRTC or set CUDA_HOME";
  } catch (...) {
    s.loaded = false;
    s.why = "probing NVRTC failed";
  }
  return s;
}

inline const NvrtcState& nvrtc_state() noexcept {
  static const NvrtcState state = probe_nvrtc();
  return state;
}

}  // namespace nvrtc_detail

// True when NVRTC could be loaded. Never throws.
inline bool nvrtc_available() noexcept { return nvrtc_detail::nvrtc_state().loaded; }

// The loaded NVRTC. Throws kiln::Error saying what was tried when there is none.
inline const NvrtcApi& nvrtc() {
  const auto& s = nvrtc_detail::nvrtc_state();
  if (!s.loaded) throw Error("kiln: " + s.why);
  return s.api;
}

// major * 1000 + minor * 10, as CUDA_VERSION counts: 13000 for NVRTC 13.0.
inline int nvrtc_version() {
  const NvrtcApi& api = nvrtc();
  return api.major * 1000 + api.minor * 10;
}

// The toolkit's include directory (holding cuda_fp16.h and cuda_bf16.h), if this
// machine has one: $CUDA_HOME/include, $CUDA_PATH/include, /usr/local/cuda/include,
// or beside the loaded libnvrtc. Pass it as "-I" + dir to use those headers.
inline std::optional<std::string> cuda_toolkit_include_dir() {
  std::vector<std::string> dirs;
  if (std::string home = rtc::env_or_empty("CUDA_HOME"); !home.empty()) dirs.push_back(home + "/include");
  if (std::string home = rtc::env_or_empty("CUDA_PATH"); !home.empty()) dirs.push_back(home + "/include");
  dirs.push_back("/usr/local/cuda/include");
  if (nvrtc_available()) {
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(nvrtc().nvrtcVersion), &info) != 0 && info.dli_fname != nullptr) {
      std::string lib = info.dli_fname;
      std::string dir = lib.substr(0, lib.rfind('/'));  // .../lib64 or .../lib
      std::string root = dir.substr(0, dir.rfind('/'));
      dirs.push_back(root + "/include");
      dirs.push_back(root + "/../include");  // targets/x86_64-linux/lib -> targets/x86_64-linux/include
    }
  }
  for (const auto& dir : dirs) {
    struct stat st {};
    if (::stat((dir + "/cuda_fp16.h").c_str(), &st) == 0) return dir;
  }
  return std::nullopt;
}

namespace nvrtc_detail {

inline std::string nvrtc_error_text(nvrtcResult r) {
  const char* text = nullptr;
  if (nvrtc_available()) text = nvrtc().nvrtcGetErrorString(r);
  return text ? std::string(text) : "NVRTC error " + std::to_string(r);
}

// The architecture an option names ("sm_90a" for "--gpu-architecture=sm_90a"),
// or "" when the option is not an architecture option. Only the `=` forms are
// recognised: pass the target as one option.
inline std::string_view arch_of_option(std::string_view opt) {
  for (std::string_view prefix : {"--gpu-architecture=", "-arch="}) {
    if (opt.substr(0, prefix.size()) == prefix) return opt.substr(prefix.size());
  }
  return {};
}

// "sm_90a" -> 90. -1 if not an sm_ target.
inline int sm_number(std::string_view arch) {
  if (arch.substr(0, 3) != "sm_") return -1;
  int n = 0, digits = 0;
  for (size_t i = 3; i < arch.size() && arch[i] >= '0' && arch[i] <= '9'; ++i, ++digits) n = n * 10 + (arch[i] - '0');
  return digits == 0 ? -1 : n;
}

// Destroys the program however the compile ends.
struct NvrtcProgramGuard {
  const NvrtcApi& api;
  nvrtcProgram program = nullptr;
  ~NvrtcProgramGuard() {
    if (program != nullptr) api.nvrtcDestroyProgram(&program);
  }
};

// One NVRTC run: source -> cubin bytes. Throws kiln::CompileError with the log
// and the path of the kept source when NVRTC rejects the program.
inline std::string nvrtc_build(const NvrtcApi& api, const std::string& source, const std::string& name,
                               const std::vector<std::string>& options, const Hash128& key) {
  auto start = std::chrono::steady_clock::now();
  NvrtcProgramGuard guard{api};
  std::string program_name = name + ".cu";
  if (nvrtcResult r = api.nvrtcCreateProgram(&guard.program, source.c_str(), program_name.c_str(), 0, nullptr,
                                             nullptr);
      r != kNvrtcSuccess) {
    throw Error("kiln: nvrtcCreateProgram(" + program_name + ") failed: " + nvrtc_error_text(r));
  }
  std::vector<const char*> argv;
  argv.reserve(options.size());
  for (const auto& o : options) argv.push_back(o.c_str());
  nvrtcResult compiled = api.nvrtcCompileProgram(guard.program, static_cast<int>(argv.size()), argv.data());

  std::string log_text;
  size_t log_size = 0;
  if (api.nvrtcGetProgramLogSize(guard.program, &log_size) == kNvrtcSuccess && log_size > 1) {
    log_text.resize(log_size);
    if (api.nvrtcGetProgramLog(guard.program, log_text.data()) != kNvrtcSuccess) log_text.clear();
    while (!log_text.empty() && (log_text.back() == '\0' || log_text.back() == '\n')) log_text.pop_back();
  }
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

  std::string stem = rtc::file_stem(name, key);
  std::string options_line = "nvrtc " + std::to_string(api.major) + "." + std::to_string(api.minor) + " (" +
                             api.path + ") " + rtc::join_options(options);
  rtc::dump_log(stem, options_line + "\n" + nvrtc_error_text(compiled), log_text);
  if (compiled != kNvrtcSuccess) {
    std::string kept = rtc::keep_failed_source("nvrtc", stem, ".cu", source);
    throw CompileError("kiln: NVRTC compile of '" + program_name + "' failed (" + nvrtc_error_text(compiled) +
                       ")\n  source: " + kept + "\n  options: " + options_line + "\n--- NVRTC log ---\n" + log_text);
  }

  size_t size = 0;
  if (nvrtcResult r = api.nvrtcGetCUBINSize(guard.program, &size); r != kNvrtcSuccess) {
    throw Error("kiln: nvrtcGetCUBINSize(" + program_name + ") failed: " + nvrtc_error_text(r));
  }
  if (size == 0) throw Error("kiln: NVRTC produced no cubin for '" + program_name + "' (" + options_line + ")");
  std::string cubin(size, '\0');
  if (nvrtcResult r = api.nvrtcGetCUBIN(guard.program, cubin.data()); r != kNvrtcSuccess) {
    throw Error("kiln: nvrtcGetCUBIN(" + program_name + ") failed: " + nvrtc_error_text(r));
  }
  if (!rtc::is_elf(cubin)) throw Error("kiln: NVRTC returned a cubin for '" + program_name + "' that is not ELF");
  if (log_enabled(LogTopic::jit)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.0f ms, %zu bytes", ms, cubin.size());
    log(LogTopic::jit, "nvrtc " + stem + " (" + rtc::join_options(options) + ") in " + buf +
                           (log_text.empty() ? "" : "\n" + log_text));
  }
  return cubin;
}

}  // namespace nvrtc_detail

// The full option list of a compile for compute capability cc_major.cc_minor:
// kiln's defaults (see the top of this file) with the caller's extra options
// after them. Throws kiln::Error if an extra option names a non-sm_ target (kiln
// loads machine code only) or NVRTC cannot generate code for the target.
inline std::vector<std::string> nvrtc_options(int cc_major, int cc_minor,
                                              const std::vector<std::string>& extra_options = {}) {
  std::string arch;
  for (const auto& o : extra_options) {
    std::string_view a = nvrtc_detail::arch_of_option(o);
    if (a.empty()) continue;
    if (nvrtc_detail::sm_number(a) < 0) {
      throw Error("kiln: NVRTC option '" + o + "' does not name machine code (sm_XY): kiln loads cubins, never PTX");
    }
    arch = std::string(a);
  }
  std::vector<std::string> options;
  if (arch.empty()) {
    if (cc_major <= 0 || cc_minor < 0) {
      throw Error("kiln: invalid compute capability " + std::to_string(cc_major) + "." + std::to_string(cc_minor));
    }
    arch = "sm_" + std::to_string(cc_major) + std::to_string(cc_minor);
    options.push_back("--gpu-architecture=" + arch);
  }
  const NvrtcApi& api = nvrtc();
  int sm = nvrtc_detail::sm_number(arch);
  if (!api.archs.empty() && std::find(api.archs.begin(), api.archs.end(), sm) == api.archs.end()) {
    std::string known;
    for (int a : api.archs) known += (known.empty() ? "sm_" : ", sm_") + std::to_string(a);
    throw Error("kiln: NVRTC " + std::to_string(api.major) + "." + std::to_string(api.minor) +
                " cannot generate machine code for " + arch + " (it supports " + known + ")");
  }
  options.insert(options.end(), {"-std=c++17", "-default-device", "--fmad=true"});
  options.insert(options.end(), extra_options.begin(), extra_options.end());
  return options;
}

// The compute capability to generate machine code for on a device of `cc`
// (e.g. 90): cc itself when this NVRTC supports it, else the newest supported
// one of the same major version and no higher minor (a cubin runs on devices of
// its major version with an equal or higher minor). Throws kiln::Error when there
// is none: the GPU is newer than this NVRTC.
inline int nvrtc_machine_target(int cc) {
  const NvrtcApi& api = nvrtc();
  if (api.archs.empty() || std::find(api.archs.begin(), api.archs.end(), cc) != api.archs.end()) return cc;
  int best = -1;
  for (int a : api.archs) {
    if (a / 10 == cc / 10 && a <= cc && a > best) best = a;
  }
  if (best < 0) {
    throw Error("kiln: NVRTC " + std::to_string(api.major) + "." + std::to_string(api.minor) +
                " cannot generate machine code for sm_" + std::to_string(cc) + " (" + api.path +
                "); a newer CUDA toolkit is needed");
  }
  return best;
}

// The SM version a cubin was built for (90 for sm_90 and sm_90a), read from its
// ELF header; -1 if the bytes are not a CUDA ELF. The field moved from bits 0-7
// to bits 8-15 of e_flags in ELF ABI version 8 (CUDA 12.8).
inline int cubin_sm(std::string_view cubin) {
  if (!rtc::is_elf(cubin) || cubin.size() < 52 || cubin[4] != 2) return -1;  // ELFCLASS64
  auto byte = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(cubin[i])); };
  uint32_t machine = byte(18) | (byte(19) << 8);
  if (machine != 190) return -1;  // EM_CUDA
  uint32_t flags = byte(48) | (byte(49) << 8) | (byte(50) << 16) | (byte(51) << 24);
  return byte(8) >= 8 ? static_cast<int>((flags >> 8) & 0xFF) : static_cast<int>(flags & 0xFF);
}

// The disk-cache key of one compile.
inline Hash128 nvrtc_cache_key(std::string_view source, const std::vector<std::string>& options) {
  Hasher h;
  h.add(std::string_view("kiln-nvrtc")).add(source).add(static_cast<uint64_t>(options.size()));
  for (const auto& o : options) h.add(std::string_view(o));
  const NvrtcApi& api = nvrtc();
  return h.add(api.major).add(api.minor).add(std::string_view("cubin")).digest();
}

// source -> cubin for sm_<cc_major><cc_minor> (or the sm_ target an extra option
// names). Disk cache first (counts disk_hits), else NVRTC (counts compiles).
// Throws kiln::CompileError with the NVRTC log and the kept source's path when
// the source does not compile; kiln::Error when NVRTC is missing.
inline std::string nvrtc_compile(const std::string& source, const std::string& name_hint, int cc_major,
                                 int cc_minor, const std::vector<std::string>& extra_options = {}) {
  const NvrtcApi& api = nvrtc();
  std::vector<std::string> options = nvrtc_options(cc_major, cc_minor, extra_options);
  Hash128 key = nvrtc_cache_key(source, options);
  std::string name = rtc::safe_file_name(name_hint);
  // NOTE: written before the compile, so it is there even if NVRTC takes the process down.
  rtc::dump_source(rtc::file_stem(name, key), ".cu", source);
  CacheResult entry = load_or_build(
      key, "cubin", [&] { return nvrtc_detail::nvrtc_build(api, source, name, options, key); }, /*want_payload=*/true);
  if (!rtc::is_elf(entry.payload)) {
    // The cache verified the bytes it wrote; not ELF means another writer's bug.
    throw Error("kiln: cached cubin " + entry.path + " is not ELF; delete it");
  }
  return std::move(entry.payload);
}

}  // namespace kiln::jit
