// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The hip backend's compiler. Takes in HIP source (one hipRTC program may hold
// every `extern "C" __global__` kernel of a plan) and a target (`gfx90a`,
// `gfx1030`, or a full gcnArchName such as `gfx90a:sramecc+:xnack-`); gives out
// a code object: an AMDGPU ELF that hipModuleLoadData takes. Mirrors nvrtc.hpp.
// hipRTC is dlopened at run time: libhiprtc.so in ROCm 6+, libamdhip64.so in
// ROCm 5 (a library counts only if it exports hiprtcCompileProgram); nothing is
// linked, no GPU is needed, and a program without hipRTC is told so by
// hiprtc_available() (never throws) or a kiln::Error.
//
// Lookup: disk cache (jit/cache.hpp, extension "hsaco") -> hipRTC. Key =
// hash("kiln-hiprtc", source, options (the target among them), hipRTC, HIP and
// comgr versions, "hsaco"). The memory layer (key -> loaded module per device)
// is the runtime's (runtime/hip_runtime.hpp).
//
// Options of every compile, then the caller's extra options:
//   --offload-arch=<target>  what HIP 5.2 takes (--gpu-architecture= works too,
//                            -arch= does not; with none it fails, log empty)
//   -std=c++17               hipRTC's default is older
//   -O3                      hipRTC's default, stated so the key says it
//   -ffp-contract=fast       fused multiply-add, as NVRTC's --fmad=true.
//                            NOTE: no -ffast-math, as on CUDA.
//
// What HIP 5.2 (Debian's libamdhip64 5.2.3, comgr 2.4 over LLVM 15) does that
// the code generator must know:
//   * no standard headers: <cstdint>, <stdint.h>, <hip/hip_fp16.h> fail to
//     compile under hipRTC, and uint16_t & co. are not predeclared. Generated
//     source declares its own fixed-width types and 16-bit float helpers.
//   * the wavefront size is the target's: __AMDGCN_WAVEFRONT_SIZE is 64 on gfx9
//     (CDNA) and 32 on gfx10+ (RDNA; -mwavefrontsize64 makes it 64).
//   * hiprtcVersion() answers 9.0 whatever the release ("TODO add actual
//     version" in hipamd), so the key also takes hipRuntimeGetVersion() and the
//     comgr version.
//   * a target it does not know (gfx942, gfx1100) kills the process inside
//     hiprtcCompileProgram (SIGSEGV or SIGABRT). hiprtc_target_supported() finds
//     out in a forked child, once per process and target; hiprtc_compile
//     refuses such a target with a kiln::Error.
//
// KILN_DUMP=dir writes every source compiled (<name>-<hex>.hip) and its options
// and log (<name>-<hex>.log). A failed compile throws kiln::CompileError with the
// log and the path of the kept source. KILN_LOG=jit prints each compile, its
// time, and each target probe.
#pragma once

#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/log.hpp"
#include "kiln/jit/cache.hpp"
#include "kiln/jit/rtc_common.hpp"

struct _hiprtcProgram;  // hiprtc.h's own tag, so handles interoperate

namespace kiln::jit {

using hiprtcResult = int;  // hiprtc.h: enum hiprtcResult
using hiprtcProgram = ::_hiprtcProgram*;

inline constexpr hiprtcResult kHiprtcSuccess = 0;

// The entry points kiln calls (hiprtc.h, ROCm 5 and 6).
struct HiprtcApi {
  void* library = nullptr;  // never closed: code objects may still be in use
  std::string path;
  int major = 0, minor = 0;                 // hiprtcVersion(): 9.0 in ROCm 5
  int runtime_version = 0;                  // hipRuntimeGetVersion() of the same library; 0 if absent
  size_t comgr_major = 0, comgr_minor = 0;  // amd_comgr_get_version(); 0.0 if comgr is not found

  const char* (*hiprtcGetErrorString)(hiprtcResult) = nullptr;
  hiprtcResult (*hiprtcVersion)(int*, int*) = nullptr;
  hiprtcResult (*hiprtcCreateProgram)(hiprtcProgram*, const char*, const char*, int, const char**,
                                      const char**) = nullptr;
  hiprtcResult (*hiprtcDestroyProgram)(hiprtcProgram*) = nullptr;
  hiprtcResult (*hiprtcCompileProgram)(hiprtcProgram, int, const char**) = nullptr;
  hiprtcResult (*hiprtcGetCodeSize)(hiprtcProgram, size_t*) = nullptr;
  hiprtcResult (*hiprtcGetCode)(hiprtcProgram, char*) = nullptr;
  hiprtcResult (*hiprtcGetProgramLogSize)(hiprtcProgram, size_t*) = nullptr;
  hiprtcResult (*hiprtcGetProgramLog)(hiprtcProgram, char*) = nullptr;
};

namespace detail {

// Where to look, in order: the loader's search path first (so LD_LIBRARY_PATH
// and ldconfig win), libhiprtc before libamdhip64, then /opt/rocm.
inline std::vector<std::string> hiprtc_candidates() {
  std::vector<std::string> out = {"libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6", "libamdhip64.so.5",
                                  "libamdhip64.so"};
  std::vector<std::string> dirs;
  if (std::string rocm = rtc::env_or_empty("ROCM_PATH"); !rocm.empty()) dirs.push_back(rocm + "/lib");
  dirs.push_back("/opt/rocm/lib");
  for (const auto& dir : dirs) {
    for (const char* file : {"/libhiprtc.so", "/libamdhip64.so"}) out.push_back(dir + file);
  }
  return out;
}

template <class Fn>
bool bind_hiprtc(void* library, Fn& slot, const char* name) {
  slot = reinterpret_cast<Fn>(::dlsym(library, name));
  return slot != nullptr;
}

struct HiprtcState {
  HiprtcApi api;
  bool loaded = false;
  std::string why;
};

inline HiprtcState probe_hiprtc() noexcept {
  HiprtcState s;
  try {
    std::string tried;
    for (const std::string& candidate : hiprtc_candidates()) {
      void* lib = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) {
        const char* err = ::dlerror();
        tried += (tried.empty() ? "" : "; ") + (err ? std::string(err) : candidate);
        continue;
      }
      HiprtcApi& a = s.api;
      a = HiprtcApi{};
      const char* missing = nullptr;
      auto need = [&](auto& slot, const char* name) {
        if (missing == nullptr && !bind_hiprtc(lib, slot, name)) missing = name;
      };
      // NOTE: first, because a ROCm 6 libamdhip64 loads fine and has no hipRTC.
      need(a.hiprtcCompileProgram, "hiprtcCompileProgram");
      need(a.hiprtcGetErrorString, "hiprtcGetErrorString");
      need(a.hiprtcVersion, "hiprtcVersion");
      need(a.hiprtcCreateProgram, "hiprtcCreateProgram");
      need(a.hiprtcDestroyProgram, "hiprtcDestroyProgram");
      need(a.hiprtcGetCodeSize, "hiprtcGetCodeSize");
      need(a.hiprtcGetCode, "hiprtcGetCode");
      need(a.hiprtcGetProgramLogSize, "hiprtcGetProgramLogSize");
      need(a.hiprtcGetProgramLog, "hiprtcGetProgramLog");
      if (missing != nullptr || a.hiprtcVersion(&a.major, &a.minor) != kHiprtcSuccess) {
        tried += (tried.empty() ? "" : "; ") + candidate + ": " +
                 (missing ? std::string("does not export ") + missing : std::string("hiprtcVersion failed"));
        a = HiprtcApi{};
        // NOTE: not dlclosed: it may be the HIP runtime another part of kiln uses.
        continue;
      }
      int (*runtime_version)(int*) = nullptr;
      if (bind_hiprtc(lib, runtime_version, "hipRuntimeGetVersion")) runtime_version(&a.runtime_version);
      // comgr holds the LLVM that generates the code; hipRTC loads it lazily, so
      // ask the sonames it would load.
      for (const char* name : {"libamd_comgr.so.3", "libamd_comgr.so.2", "libamd_comgr.so"}) {
        void* comgr = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (comgr == nullptr) continue;
        void (*comgr_version)(size_t*, size_t*) = nullptr;
        if (bind_hiprtc(comgr, comgr_version, "amd_comgr_get_version")) comgr_version(&a.comgr_major, &a.comgr_minor);
        break;
      }
      ::dlerror();  // clear what the failed candidates left
      a.library = lib;
      a.path = candidate;
      s.loaded = true;
      return s;
    }
    s.why = "hipRTC was not found (" + tried + "); install ROCm's HIP runtime or set ROCM_PATH";
  } catch (...) {
    s.loaded = false;
    s.why = "probing hipRTC failed";
  }
  return s;
}

inline const HiprtcState& hiprtc_state() noexcept {
  static const HiprtcState state = probe_hiprtc();
  return state;
}

}  // namespace detail

// True when hipRTC could be loaded. Never throws; needs no GPU.
inline bool hiprtc_available() noexcept { return detail::hiprtc_state().loaded; }

// The loaded hipRTC. Throws kiln::Error saying what was tried when there is none.
inline const HiprtcApi& hiprtc() {
  const auto& s = detail::hiprtc_state();
  if (!s.loaded) throw Error("kiln: " + s.why);
  return s.api;
}

// "hipRTC 9.0, HIP 50221153, comgr 2.4 (libamdhip64.so.5)", or why there is none.
inline std::string hiprtc_version_string() {
  const auto& s = detail::hiprtc_state();
  if (!s.loaded) return "no hipRTC: " + s.why;
  const HiprtcApi& a = s.api;
  return "hipRTC " + std::to_string(a.major) + "." + std::to_string(a.minor) + ", HIP " +
         std::to_string(a.runtime_version) + ", comgr " + std::to_string(a.comgr_major) + "." +
         std::to_string(a.comgr_minor) + " (" + a.path + ")";
}

namespace detail {

inline std::string hiprtc_error_text(hiprtcResult r) {
  const char* text = nullptr;
  if (hiprtc_available()) text = hiprtc().hiprtcGetErrorString(r);
  return text ? std::string(text) : "hipRTC error " + std::to_string(r);
}

// `gfx90a`, `gfx90a:sramecc+:xnack-`, `gfx1030`. Anything else is refused before
// it reaches the compiler, where it would be an option of the caller's making.
inline bool valid_hip_arch(std::string_view arch) {
  if (arch.size() < 4 || arch.size() > 64 || arch.substr(0, 3) != "gfx") return false;
  for (char c : arch) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == ':' || c == '+' || c == '-' || c == '_';
    if (!ok) return false;
  }
  return true;
}

inline constexpr unsigned kEmAmdgpu = 224;  // e_machine of an AMDGPU code object

// The HIP source's output as hipModuleLoadData wants it: a 64-bit
// little-endian ELF for AMDGPU.
inline bool is_amdgpu_code_object(std::string_view bytes) {
  if (bytes.size() < 64 || !rtc::is_elf(bytes) || bytes[4] != 2 || bytes[5] != 1) return false;
  unsigned machine = static_cast<unsigned char>(bytes[18]) | (static_cast<unsigned char>(bytes[19]) << 8);
  return machine == kEmAmdgpu;
}

// Destroys the program however the compile ends.
struct HiprtcProgramGuard {
  const HiprtcApi& api;
  hiprtcProgram program = nullptr;
  ~HiprtcProgramGuard() {
    if (program != nullptr) api.hiprtcDestroyProgram(&program);
  }
};

struct HiprtcOutput {
  hiprtcResult created = kHiprtcSuccess;   // hiprtcCreateProgram
  hiprtcResult compiled = kHiprtcSuccess;  // hiprtcCompileProgram
  std::string code;
  std::string log;
};

// One hipRTC run, no cache and no judgement: the common core of a compile and
// of the target probe's child.
inline HiprtcOutput hiprtc_run(const HiprtcApi& api, const std::string& source, const std::string& program_name,
                               const std::vector<std::string>& options) {
  HiprtcOutput out;
  HiprtcProgramGuard guard{api};
  out.created = api.hiprtcCreateProgram(&guard.program, source.c_str(), program_name.c_str(), 0, nullptr, nullptr);
  if (out.created != kHiprtcSuccess) return out;
  std::vector<const char*> argv;
  argv.reserve(options.size());
  for (const auto& o : options) argv.push_back(o.c_str());
  out.compiled = api.hiprtcCompileProgram(guard.program, static_cast<int>(argv.size()), argv.data());
  size_t log_size = 0;
  if (api.hiprtcGetProgramLogSize(guard.program, &log_size) == kHiprtcSuccess && log_size > 1) {
    out.log.resize(log_size);
    if (api.hiprtcGetProgramLog(guard.program, out.log.data()) != kHiprtcSuccess) out.log.clear();
    while (!out.log.empty() && (out.log.back() == '\0' || out.log.back() == '\n')) out.log.pop_back();
  }
  size_t code_size = 0;
  if (out.compiled == kHiprtcSuccess && api.hiprtcGetCodeSize(guard.program, &code_size) == kHiprtcSuccess &&
      code_size > 0) {
    out.code.resize(code_size);
    if (api.hiprtcGetCode(guard.program, out.code.data()) != kHiprtcSuccess) out.code.clear();
  }
  return out;
}

// Compiles take it shared (hipRTC compiles concurrently without trouble); the
// target probe takes it exclusively, so no hipRTC call of kiln's holds a hipRTC
// lock at the moment of fork (the child would wait on it forever).
inline std::shared_mutex& hiprtc_fork_mutex() {
  static std::shared_mutex m;
  return m;
}

inline constexpr const char* kProbeSource =
    "extern \"C\" __global__ void kiln_probe(float* p) { p[threadIdx.x] = 1.0f; }\n";
inline constexpr int kProbeTimeoutMs = 30000;

enum class ProbeOutcome { supported, failed, crashed, timed_out, no_fork };

struct ProbeResult {
  ProbeOutcome outcome = ProbeOutcome::failed;
  std::string detail;  // for the log: the signal, the exit status, errno
};

// Compiles a trivial kernel for `arch` in a forked child. The child reports
// success by writing one byte on a pipe before _exit(0); the parent reads until
// EOF, which comes however the child ends (exit, abort, segfault), then reaps it.
// NOTE: the pipe, not waitpid's status, decides: a program that set SIGCHLD to
// SIG_IGN has its children reaped for it, and the status is lost.
inline ProbeResult probe_in_child(const HiprtcApi& api, const std::string& arch, int timeout_ms) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return {ProbeOutcome::no_fork, std::string("pipe: ") + std::strerror(errno)};
  std::fflush(nullptr);  // the child must not flush our buffered output a second time
  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return {ProbeOutcome::no_fork, std::string("fork: ") + std::strerror(err)};
  }
  if (pid == 0) {
    ::close(fds[0]);
    // A crash inside hipRTC prints glibc's complaint; the parent logs the signal.
    int null_fd = ::open("/dev/null", O_WRONLY);
    if (null_fd >= 0) {
      ::dup2(null_fd, 1);
      ::dup2(null_fd, 2);
    }
    HiprtcOutput out = hiprtc_run(api, kProbeSource, "kiln_probe.hip", {"--offload-arch=" + arch});
    bool ok = out.created == kHiprtcSuccess && out.compiled == kHiprtcSuccess && is_amdgpu_code_object(out.code);
    if (ok) {
      char byte = 1;
      while (::write(fds[1], &byte, 1) < 0 && errno == EINTR) {
      }
    }
    ::_exit(ok ? 0 : 1);  // NOTE: _exit: no atexit handlers, no destructors of the parent's statics
  }
  ::close(fds[1]);
  bool got_byte = false, eof = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!eof) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fds[0], POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    char byte = 0;
    ssize_t r = ::read(fds[0], &byte, 1);
    if (r < 0 && errno == EINTR) continue;
    if (r == 1 && byte == 1) got_byte = true;
    if (r <= 0) eof = true;
  }
  ::close(fds[0]);
  if (!eof) ::kill(pid, SIGKILL);  // hung: a lock another thread held at fork time
  int status = 0;
  pid_t w;
  do {
    w = ::waitpid(pid, &status, 0);
  } while (w < 0 && errno == EINTR);
  if (!eof) return {ProbeOutcome::timed_out, "no answer in " + std::to_string(timeout_ms) + " ms; killed"};
  if (got_byte) return {ProbeOutcome::supported, "compiled"};
  if (w == pid && WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return {ProbeOutcome::crashed, "hipRTC died of signal " + std::to_string(sig) + " (" + (name ? name : "?") + ")"};
  }
  if (w == pid && WIFEXITED(status)) {
    return {ProbeOutcome::failed, "hipRTC refused it (child exit " + std::to_string(WEXITSTATUS(status)) + ")"};
  }
  return {ProbeOutcome::failed, "hipRTC did not compile it"};
}

struct TargetProbes {
  std::mutex mutex;
  std::map<std::string, bool, std::less<>> known;
};

inline TargetProbes& target_probes() {
  static TargetProbes probes;
  return probes;
}

}  // namespace detail

// Records that this hipRTC knows `arch` without probing it. The HIP runtime
// calls it for each device it sets up: HIP enumerated the device, so its release
// knows the target, and forking a process that holds a GPU to find out is what
// must be avoided (HSA state does not survive fork).
inline void hiprtc_mark_target_supported(const std::string& arch) {
  if (!detail::valid_hip_arch(arch)) return;
  auto& probes = detail::target_probes();
  std::lock_guard lock(probes.mutex);
  probes.known[arch] = true;
}

// Whether this hipRTC compiles for `arch`, found out once per process per arch
// by compiling a trivial kernel in a forked child, because HIP 5.2 kills the
// process on a target it does not know. Never throws; false without hipRTC, for
// a malformed name, or when the child crashes, fails or hangs (a hang or a
// failed fork is not remembered, so a later call tries again).
inline bool hiprtc_target_supported(const std::string& arch) noexcept {
  try {
    if (!detail::valid_hip_arch(arch) || !hiprtc_available()) return false;
    auto& probes = detail::target_probes();
    std::lock_guard lock(probes.mutex);
    if (auto it = probes.known.find(arch); it != probes.known.end()) return it->second;
    auto start = std::chrono::steady_clock::now();
    detail::ProbeResult r;
    {
      std::unique_lock fork_lock(detail::hiprtc_fork_mutex());
      r = detail::probe_in_child(hiprtc(), arch, detail::kProbeTimeoutMs);
    }
    bool ok = r.outcome == detail::ProbeOutcome::supported;
    if (r.outcome != detail::ProbeOutcome::timed_out && r.outcome != detail::ProbeOutcome::no_fork) {
      probes.known.emplace(arch, ok);
    }
    if (log_enabled(LogTopic::jit)) {
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.0f ms", ms);
      log(LogTopic::jit, "hiprtc target " + arch + (ok ? " supported" : " unsupported") + " (" + r.detail +
                             "; probe in a child process, " + buf + ")");
    }
    return ok;
  } catch (...) {
    return false;
  }
}

// The full option list of a compile for `arch`: kiln's defaults (see the top of
// this file) with the caller's extra options after them. Throws kiln::Error for
// a name that is no AMD GPU target, or an extra option that names another one.
inline std::vector<std::string> hiprtc_options(const std::string& arch,
                                               const std::vector<std::string>& extra_options = {}) {
  if (!detail::valid_hip_arch(arch)) {
    throw Error("kiln: '" + arch + "' is not an AMD GPU target (expected e.g. gfx90a, gfx1030, gfx90a:xnack-)");
  }
  for (const auto& o : extra_options) {
    for (std::string_view prefix : {"--offload-arch=", "--gpu-architecture=", "-arch="}) {
      if (std::string_view(o).substr(0, prefix.size()) == prefix) {
        throw Error("kiln: hipRTC option '" + o + "': the target is hiprtc_compile's `arch` argument (" + arch + ")");
      }
    }
  }
  std::vector<std::string> options = {"--offload-arch=" + arch, "-std=c++17", "-O3", "-ffp-contract=fast"};
  options.insert(options.end(), extra_options.begin(), extra_options.end());
  return options;
}

// EF_AMDGPU_MACH of a code object (0x3f for gfx90a, 0x30 gfx908, 0x36 gfx1030),
// read from its ELF header; -1 if the bytes are not an AMDGPU code object.
inline int code_object_mach(std::string_view code) {
  if (!detail::is_amdgpu_code_object(code)) return -1;
  return static_cast<unsigned char>(code[48]);  // e_flags, low byte
}

// The disk-cache key of one compile.
inline Hash128 hiprtc_cache_key(std::string_view source, const std::vector<std::string>& options) {
  Hasher h;
  h.add(std::string_view("kiln-hiprtc")).add(source).add(static_cast<uint64_t>(options.size()));
  for (const auto& o : options) h.add(std::string_view(o));
  const HiprtcApi& api = hiprtc();
  h.add(api.major).add(api.minor).add(api.runtime_version);
  h.add(static_cast<uint64_t>(api.comgr_major)).add(static_cast<uint64_t>(api.comgr_minor));
  return h.add(std::string_view("hsaco")).digest();
}

namespace detail {

// One hipRTC run: source -> code object. Throws kiln::CompileError with the log
// and the path of the kept source when hipRTC rejects the program.
inline std::string hiprtc_build(const HiprtcApi& api, const std::string& source, const std::string& name,
                                const std::string& arch, const std::vector<std::string>& options,
                                const Hash128& key) {
  // Probed only when a compile is due: a cache hit needs no compiler.
  if (!hiprtc_target_supported(arch)) {
    throw Error("kiln: this hipRTC (" + hiprtc_version_string() + ") cannot compile for " + arch +
                ": a test compile in a child process failed or crashed (KILN_LOG=jit says how). Compile for a "
                "target it knows, or use a newer ROCm.");
  }
  auto start = std::chrono::steady_clock::now();
  std::string program_name = name + ".hip";
  HiprtcOutput out;
  {
    std::shared_lock fork_lock(hiprtc_fork_mutex());
    out = hiprtc_run(api, source, program_name, options);
  }
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (out.created != kHiprtcSuccess) {
    throw Error("kiln: hiprtcCreateProgram(" + program_name + ") failed: " + hiprtc_error_text(out.created));
  }
  std::string stem = rtc::file_stem(name, key);
  std::string options_line = hiprtc_version_string() + " " + rtc::join_options(options);
  rtc::dump_log(stem, options_line + "\n" + hiprtc_error_text(out.compiled), out.log);
  if (out.compiled != kHiprtcSuccess) {
    std::string kept = rtc::keep_failed_source("hiprtc", stem, ".hip", source);
    // NOTE: hipRTC names the source "CompileSource" in its log whatever the
    // program is called; the kept path is the file to open.
    throw CompileError("kiln: hipRTC compile of '" + program_name + "' for " + arch + " failed (" +
                       hiprtc_error_text(out.compiled) + ")\n  source: " + kept + "\n  options: " + options_line +
                       "\n--- hipRTC log ---\n" + (out.log.empty() ? std::string("(empty)") : out.log));
  }
  if (!is_amdgpu_code_object(out.code)) {
    throw Error("kiln: hipRTC returned " + std::to_string(out.code.size()) + " bytes for '" + program_name +
                "' that are not an AMDGPU code object (" + options_line + ")");
  }
  if (log_enabled(LogTopic::jit)) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.0f ms, %zu bytes", ms, out.code.size());
    log(LogTopic::jit, "hiprtc " + stem + " (" + rtc::join_options(options) + ") in " + buf +
                           (out.log.empty() ? "" : "\n" + out.log));
  }
  return std::move(out.code);
}

}  // namespace detail

// source -> code object for `arch` (e.g. "gfx90a", or a device's full
// gcnArchName). Disk cache first (counts disk_hits; for a full target ID its own
// entry, else the processor's: what KILN_PRECOMPILE wrote), else hipRTC (counts
// compiles). Throws kiln::Error when hipRTC is missing or does not know `arch`
// (it would crash), kiln::CompileError with the hipRTC log and the kept source's
// path when the source does not compile.
inline std::string hiprtc_compile(const std::string& source, const std::string& name_hint, const std::string& arch,
                                  const std::vector<std::string>& extra_options = {}) {
  const HiprtcApi& api = hiprtc();
  std::vector<std::string> options = hiprtc_options(arch, extra_options);
  Hash128 key = hiprtc_cache_key(source, options);
  // A device compiles for its full target ID (gfx90a:sramecc+:xnack-); a build machine
  // (KILN_PRECOMPILE=gfx90a) names the processor alone, whose code object is "any" in
  // each feature and so loads on every such device: use that entry when the device has
  // none of its own.
  std::string code;
  if (size_t colon = arch.find(':'); colon != std::string::npos) {
    if ((load_if_cached(key, "hsaco", code) ||
         load_if_cached(hiprtc_cache_key(source, hiprtc_options(arch.substr(0, colon), extra_options)), "hsaco", code)) &&
        detail::is_amdgpu_code_object(code))
      return code;
  }
  std::string name = rtc::safe_file_name(name_hint);
  rtc::dump_source(rtc::file_stem(name, key), ".hip", source);
  CacheResult entry = load_or_build(
      key, "hsaco", [&] { return detail::hiprtc_build(api, source, name, arch, options, key); },
      /*want_payload=*/true);
  if (!detail::is_amdgpu_code_object(entry.payload)) {
    // The cache verified the bytes it wrote; not a code object means another writer's bug.
    throw Error("kiln: cached code object " + entry.path + " is not an AMDGPU ELF; delete it");
  }
  code = std::move(entry.payload);
  return code;
}

}  // namespace kiln::jit
