// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The CPU backend's compiler. Takes in generated C++ source; gives out a loaded
// shared object (HostModule) whose symbols the runtime calls. Lookup order:
// memory map (per process) -> disk cache (jit/cache.hpp) -> the system compiler
// ($CXX, else c++) run with posix_spawn, its output read back as the payload.
//
// Key = hash(source, compiler argv, flags, `<cxx> --version` first line, target),
// where target is a hash of the macros the compiler predefines under those flags
// (-march=native shows up there as __AVX2__, __AVX512F__, ...), so a cache
// directory shared between machines never hands one CPU another's code.
//
// KILN_DUMP=dir writes every source loaded (<hex>.cpp) and every compile log
// (<hex>.log) there. A failed compile throws kiln::CompileError with the log and
// the path of the kept source. KILN_LOG=jit prints each compile and its time.
#pragma once

#include <dlfcn.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/log.hpp"
#include "kiln/jit/cache.hpp"
#include "kiln/runtime/counters.hpp"

extern char** environ;  // NOLINT: POSIX; glibc declares it only under _GNU_SOURCE

namespace kiln::jit {

// Flags of every host compile; KILN_CXXFLAGS (whitespace-separated) is appended,
// so a later -O or -march there wins.
//   -O3 -march=native      kernels run on the machine (keyed by target) that built them
//   -fPIC -shared          a dlopen-able shared object
//   -fopenmp               generated loops are parallelised with OpenMP pragmas
//   -std=c++17             generated source needs no more; older compilers accept it
//   -fno-math-errno        lets sqrt/exp vectorise (no errno side effect)
//   -ffp-contract=fast     fused multiply-add where the hardware has it
//   -mprefer-vector-width=512 (x86-64) full-width AVX-512 where the machine has it: GCC
//                          otherwise keeps to 256 bits (on this 2-core AVX-512 EPYC, one
//                          thread: W3 f32 3.99 -> 3.38 ms, W8 3.67 -> 3.05, W2 5.15 -> 4.22)
// NOTE: no -ffast-math: kernels must keep NaN/Inf semantics to match eager mode.
inline constexpr std::string_view kHostCxxFlags =
#if defined(__x86_64__)
    "-O3 -march=native -mprefer-vector-width=512 -fPIC -shared -fopenmp -std=c++17 -fno-math-errno -ffp-contract=fast";
#else
    "-O3 -march=native -fPIC -shared -fopenmp -std=c++17 -fno-math-errno -ffp-contract=fast";
#endif

// A loaded shared object. dlclose on destruction.
// NOTE: dlopen of a path already loaded returns the same handle (refcounted), so
// two HostModules of one cache file share code; that is fine.
class HostModule {
 public:
    // NOTE: RTLD_NODELETE: a kernel module may be what brought libgomp in; unloading it at exit
    // while OpenMP worker threads idle crashes the process.
  explicit HostModule(std::string path) : path_(std::move(path)) {
    handle_ = ::dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (handle_ == nullptr) {
      const char* why = ::dlerror();
      throw Error("kiln: cannot load host module '" + path_ + "': " + (why ? why : "unknown dlopen error"));
    }
  }
  HostModule(const HostModule&) = delete;
  HostModule& operator=(const HostModule&) = delete;
  ~HostModule() { ::dlclose(handle_); }

  // Throws kiln::Error naming the symbol and the module if it is missing.
  void* symbol(const char* name) const {
    ::dlerror();
    void* sym = ::dlsym(handle_, name);
    if (sym == nullptr) {
      const char* why = ::dlerror();
      throw Error("kiln: symbol '" + std::string(name) + "' not found in host module '" + path_ + "'" +
                  (why ? std::string(": ") + why : std::string()));
    }
    return sym;
  }

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* handle_ = nullptr;
};

// The compiler and flags that a compile would use now, probed once per process
// per ($CXX, $KILN_CXXFLAGS).
struct HostToolchain {
  std::vector<std::string> cxx;    // argv prefix: $CXX split on spaces ("ccache g++" works)
  std::vector<std::string> flags;  // kHostCxxFlags + $KILN_CXXFLAGS
  std::string identity;            // first line of `<cxx> --version`
  Hash128 target;                  // hash of the predefined macros under `flags`
  Hash128 key;                     // all of the above; part of every module key
};

namespace detail {

inline std::vector<std::string> split_words(std::string_view s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')) ++i;
    size_t j = i;
    while (j < s.size() && s[j] != ' ' && s[j] != '\t' && s[j] != '\n') ++j;
    if (j > i) out.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

inline std::string join_words(const std::vector<std::string>& words) {
  std::string out;
  for (const auto& w : words) {
    if (!out.empty()) out += ' ';
    out += w;
  }
  return out;
}

struct ProcessResult {
  int exit_code = -1;  // -1 when killed by a signal
  std::string status;  // "exit status 1", "killed by signal 9"
  std::string output;  // stdout and stderr interleaved
};

// Runs argv (PATH lookup) with stdin from /dev/null and stdout+stderr captured
// through a pipe. No shell: sources paths and flags need no quoting.
// Throws kiln::Error if the program cannot be started.
inline ProcessResult run_process(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  int fds[2];
  // NOTE: O_CLOEXEC so a compiler spawned concurrently by another thread does
  // not inherit our write end and keep our read from seeing EOF.
  if (::pipe2(fds, O_CLOEXEC) != 0) throw Error("kiln: pipe failed: " + errno_text(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  pid_t pid = 0;
  int rc = ::posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  if (rc != 0) {
    ::close(fds[0]);
    throw Error("kiln: cannot run '" + join_words(argv) + "': " + errno_text(rc));
  }

  ProcessResult result;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    result.output.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(wstatus)) {
    result.exit_code = WEXITSTATUS(wstatus);
    result.status = "exit status " + std::to_string(result.exit_code);
  } else {
    result.status = "killed by signal " + std::to_string(WTERMSIG(wstatus));
  }
  return result;
}

// Writes a file whole (not atomically: dumps are for people to read).
inline void write_file_or_throw(const std::string& path, std::string_view text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("kiln: cannot write '" + path + "': " + errno_text(errno));
  bool ok = write_all(fd, text);
  int err = errno;
  ::close(fd);
  if (!ok) throw Error("kiln: cannot write '" + path + "': " + errno_text(err));
}

inline std::string read_whole_file(const std::string& path) {
  std::string out;
  struct stat st {};
  if (int err = read_file(path, out, st); err != 0) {
    throw Error("kiln: cannot read '" + path + "': " + errno_text(err));
  }
  return out;
}

inline HostToolchain probe_toolchain(const std::string& cxx_env, const std::string& extra_flags) {
  HostToolchain tc;
  tc.cxx = split_words(cxx_env.empty() ? std::string_view("c++") : std::string_view(cxx_env));
  if (tc.cxx.empty()) tc.cxx.push_back("c++");
  tc.flags = split_words(kHostCxxFlags);
  for (auto& f : split_words(extra_flags)) tc.flags.push_back(std::move(f));

  std::vector<std::string> argv = tc.cxx;
  argv.push_back("--version");
  ProcessResult version = run_process(argv);
  if (version.exit_code != 0) {
    throw Error("kiln: host compiler '" + join_words(argv) + "' failed (" + version.status + "):\n" +
                version.output);
  }
  tc.identity = version.output.substr(0, version.output.find('\n'));

  // The macros -march=native (and the rest of the flags) turn on say which ISA
  // the code targets; a bad KILN_CXXFLAGS is reported here, before any compile.
  argv = tc.cxx;
  argv.insert(argv.end(), tc.flags.begin(), tc.flags.end());
  for (const char* a : {"-dM", "-E", "-x", "c++", "/dev/null"}) argv.emplace_back(a);
  ProcessResult macros = run_process(argv);
  if (macros.exit_code != 0) {
    throw Error("kiln: host compiler rejects the flags (" + macros.status + "): " + join_words(argv) + "\n" +
                macros.output);
  }
  tc.target = hash_bytes(macros.output);

  Hasher h;
  h.add(std::string_view("kiln-host"));
  h.add(tc.cxx.size());
  for (const auto& w : tc.cxx) h.add(w);
  h.add(tc.flags.size());
  for (const auto& w : tc.flags) h.add(w);
  h.add(tc.identity).add(tc.target);
  tc.key = h.digest();
  if (log_enabled(LogTopic::jit)) {
    log(LogTopic::jit, "host compiler: " + tc.identity + " | " + join_words(tc.cxx) + " " + join_words(tc.flags));
  }
  return tc;
}

}  // namespace detail

// The toolchain for the current $CXX and $KILN_CXXFLAGS. The reference stays
// valid for the life of the process. Throws kiln::Error if the compiler cannot
// be run or rejects the flags.
inline const HostToolchain& host_toolchain() {
  static std::mutex mutex;
  static std::map<std::string, HostToolchain> probed;  // node-based: references stay valid
  const char* cxx = std::getenv("CXX");
  const char* extra = std::getenv("KILN_CXXFLAGS");
  std::string cxx_s = cxx ? cxx : "", extra_s = extra ? extra : "";
  std::string id = cxx_s + '\0' + extra_s;
  std::lock_guard lock(mutex);  // NOTE: held while probing: threads asking at once probe once
  auto it = probed.find(id);
  if (it == probed.end()) it = probed.emplace(id, detail::probe_toolchain(cxx_s, extra_s)).first;
  return it->second;
}

inline Hash128 host_module_key(const HostToolchain& tc, std::string_view source) {
  return Hasher().add(tc.key).add(source).digest();
}

namespace detail {

inline void dump_source(const std::string& dir, const Hash128& key, std::string_view source) {
  make_dirs(dir, 0755);
  write_file_or_throw(dir + "/" + key.hex() + ".cpp", source);
}

// Removes the compile's temp files unless told to keep the source.
struct TempCompileDir {
  std::string dir, source, object;
  bool keep_source = false;
  ~TempCompileDir() {
    if (dir.empty()) return;
    ::unlink(object.c_str());
    if (!keep_source) {
      ::unlink(source.c_str());
      ::rmdir(dir.c_str());
    }
  }
};

}  // namespace detail

// source -> shared object bytes. Throws kiln::CompileError (compiler log + path
// of the kept source) if the compiler fails. Does not touch the cache.
inline std::string compile_host_source(std::string_view source, const HostToolchain& tc, const Hash128& key) {
  const char* tmp_env = std::getenv("TMPDIR");
  std::string tmpl = std::string(tmp_env && *tmp_env ? tmp_env : "/tmp") + "/kiln-XXXXXX";
  detail::TempCompileDir tmp;
  if (::mkdtemp(tmpl.data()) == nullptr) {
    throw Error("kiln: cannot create a temp directory '" + tmpl + "': " + detail::errno_text(errno));
  }
  tmp.dir = tmpl;
  tmp.source = tmp.dir + "/" + key.hex() + ".cpp";
  tmp.object = tmp.dir + "/" + key.hex() + ".so";
  detail::write_file_or_throw(tmp.source, source);

  std::vector<std::string> argv = tc.cxx;
  argv.insert(argv.end(), tc.flags.begin(), tc.flags.end());
  argv.push_back(tmp.source);
  argv.push_back("-o");
  argv.push_back(tmp.object);
  std::string command = detail::join_words(argv);

  auto start = std::chrono::steady_clock::now();
  detail::ProcessResult run = detail::run_process(argv);
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

  std::optional<std::string> dump = dump_dir();
  const std::string log_text = command + "\n" + run.status + "\n" + run.output;
  if (run.exit_code != 0) {
    // NOTE: a dump that cannot be written must not hide the compile error: the
    // source is then kept in the temp directory instead.
    std::string kept, dump_note;
    if (dump) {
      try {
        detail::dump_source(*dump, key, source);
        detail::write_file_or_throw(*dump + "/" + key.hex() + ".log", log_text);
        kept = *dump + "/" + key.hex() + ".cpp";
      } catch (const Error& e) {
        dump_note = std::string("\n  (KILN_DUMP: ") + e.what() + ")";
      }
    }
    if (kept.empty()) {
      tmp.keep_source = true;
      kept = tmp.source;
    }
    throw CompileError("kiln: host compile failed (" + run.status + ")\n  source: " + kept + "\n  command: " +
                       command + dump_note + "\n--- compiler log ---\n" + run.output);
  }
  if (dump) {
    detail::make_dirs(*dump, 0755);
    detail::write_file_or_throw(*dump + "/" + key.hex() + ".log", log_text);
  }
  if (log_enabled(LogTopic::jit)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.0f ms", ms);
    log(LogTopic::jit, "compiled " + key.hex() + " in " + buf + (run.output.empty() ? "" : "\n" + run.output));
  }
  std::string object = detail::read_whole_file(tmp.object);
  if (object.empty()) throw CompileError("kiln: host compiler produced an empty object: " + command);
  return object;
}

namespace detail {

using HostModulePtr = std::shared_ptr<const HostModule>;

// One slot per key; a thread that finds a slot being built waits on its future
// instead of compiling the same source again.
struct HostSlot {
  std::promise<HostModulePtr> promise;
  std::shared_future<HostModulePtr> future = promise.get_future().share();
};

struct HostMemoryCache {
  std::mutex mutex;
  std::unordered_map<Hash128, std::shared_ptr<HostSlot>, Hash128Hasher> slots;
};

inline HostMemoryCache& host_memory_cache() {
  static HostMemoryCache state;
  return state;
}

// For tests: forget every loaded module (they unload when their last user drops them).
inline void clear_memory_cache() {
  auto& mc = host_memory_cache();
  std::lock_guard lock(mc.mutex);
  mc.slots.clear();
}

}  // namespace detail

// memory map -> disk cache -> compile. Thread-safe; different sources compile
// in parallel, the same source once. Counts memory_hits here, disk_hits and
// compiles in load_or_build.
inline std::shared_ptr<const HostModule> load_host_module(const std::string& source) {
  const HostToolchain& tc = host_toolchain();
  Hash128 key = host_module_key(tc, source);

  auto& mc = detail::host_memory_cache();
  std::shared_ptr<detail::HostSlot> slot;
  bool owner = false;
  {
    std::lock_guard lock(mc.mutex);
    auto [it, inserted] = mc.slots.try_emplace(key);
    if (inserted) it->second = std::make_shared<detail::HostSlot>();
    slot = it->second;
    owner = inserted;
  }
  if (!owner) {
    ::kiln::detail::counters_state().memory_hits.fetch_add(1, std::memory_order_relaxed);
    return slot->future.get();  // rethrows the owner's error if its build failed
  }

  try {
    if (auto dump = dump_dir()) detail::dump_source(*dump, key, source);
    CacheResult entry = load_or_build(key, "so", [&] { return compile_host_source(source, tc, key); });
    auto module = std::make_shared<const HostModule>(entry.path);
    slot->promise.set_value(module);
    return module;
  } catch (...) {
    {
      // A failed build is not remembered: the next call tries again.
      std::lock_guard lock(mc.mutex);
      auto it = mc.slots.find(key);
      if (it != mc.slots.end() && it->second == slot) mc.slots.erase(it);
    }
    slot->promise.set_exception(std::current_exception());
    throw;
  }
}

}  // namespace kiln::jit
