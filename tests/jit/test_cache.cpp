// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Tests of the JIT cache and the host compiler: memory hit, disk hit from
// another process, corrupt entries rebuilt, concurrent processes, an unsafe
// directory refused, compile errors that carry the log and the source path.
// Every test case gets its own fresh KILN_CACHE_DIR.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/jit/cache.hpp"
#include "kiln/jit/host_compiler.hpp"
#include "kiln/runtime/counters.hpp"

namespace fs = std::filesystem;

namespace {

std::string make_temp_dir(const char* tag) {
  std::string t = std::string("/tmp/kiln-test-") + tag + "-XXXXXX";
  REQUIRE(::mkdtemp(t.data()) != nullptr);
  return t;
}

// A fresh, empty, private cache directory for one test case; the memory map
// and counters start empty too.
struct FreshCache {
  std::string dir = make_temp_dir("cache");
  FreshCache() {
    ::setenv("KILN_CACHE_DIR", dir.c_str(), 1);
    ::unsetenv("KILN_DUMP");
    kiln::jit::detail::clear_memory_cache();
    kiln::reset_counters();
  }
  ~FreshCache() {
    kiln::jit::detail::clear_memory_cache();
    ::unsetenv("KILN_CACHE_DIR");
    std::error_code ec;
    fs::permissions(dir, fs::perms::owner_all, ec);
    fs::remove_all(dir, ec);
  }
};

std::string source_f(int add) {
  return "extern \"C\" int f(int x) { return x * 2 + " + std::to_string(add) + "; }\n";
}

int call_f(const kiln::jit::HostModule& m, int x) {
  auto fn = reinterpret_cast<int (*)(int)>(m.symbol("f"));
  return fn(x);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Runs fn in a forked child; returns its exit code (fn's result, 98 on an
// exception, 128+signal if it died). _exit: the child must not run doctest's
// or the parent's exit-time work.
int run_in_child(const std::function<int()>& fn) {
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int code = 98;
    try {
      code = fn();
    } catch (...) {
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

bool has_temp_files(const std::string& dir) {
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().find(".tmp.") != std::string::npos) return true;
  }
  return false;
}

std::string host_entry_path(const std::string& source) {
  return kiln::jit::cache_path(kiln::jit::host_module_key(kiln::jit::host_toolchain(), source), "so");
}

}  // namespace

TEST_CASE("cache: build once, then a verified disk hit with the same payload") {
  FreshCache fresh;
  const kiln::Hash128 key = kiln::hash_bytes("cache-roundtrip");
  int builds = 0;
  auto build = [&] {
    ++builds;
    return std::string("payload\0bytes", 13);
  };

  auto first = kiln::jit::load_or_build(key, "bin", build, true);
  CHECK_FALSE(first.from_disk);
  CHECK(first.payload == std::string("payload\0bytes", 13));
  CHECK(first.path == kiln::jit::cache_path(key, "bin"));
  CHECK(first.path.rfind(fresh.dir + "/", 0) == 0);
  CHECK(fs::file_size(first.path) == 13 + kiln::jit::detail::kTrailerSize);
  CHECK(kiln::counters().compiles == 1);

  auto second = kiln::jit::load_or_build(key, "bin", build, true);
  CHECK(second.from_disk);
  CHECK(second.path == first.path);
  CHECK(second.payload == first.payload);
  CHECK(builds == 1);
  CHECK(kiln::counters().disk_hits == 1);

  auto third = kiln::jit::load_or_build(key, "bin", build, false);
  CHECK(third.from_disk);
  CHECK(third.payload.empty());  // not asked for
  CHECK_FALSE(has_temp_files(fresh.dir));

  // Another extension or key is another entry.
  CHECK(kiln::jit::cache_path(key, "cubin") != first.path);
  CHECK(kiln::jit::cache_path(kiln::hash_bytes("other"), "bin") != first.path);
}

TEST_CASE("cache: a truncated or corrupt entry is rebuilt, never returned") {
  FreshCache fresh;
  const kiln::Hash128 key = kiln::hash_bytes("cache-corrupt");
  const std::string good(1000, 'k');
  auto build = [&] { return good; };
  const std::string path = kiln::jit::load_or_build(key, "bin", build).path;
  const std::string whole = read_file(path);

  struct Damage {
    const char* name;
    std::function<std::string(std::string)> apply;
  };
  const Damage damages[] = {
      {"empty", [](std::string) { return std::string(); }},
      {"truncated by one", [](std::string s) { return s.substr(0, s.size() - 1); }},
      {"truncated to half", [](std::string s) { return s.substr(0, s.size() / 2); }},
      {"payload byte flipped", [](std::string s) { s[500] ^= 0x20; return s; }},
      {"magic byte flipped", [](std::string s) { s[s.size() - kiln::jit::detail::kTrailerSize] ^= 1; return s; }},
      {"other format version", [](std::string s) { s[s.size() - kiln::jit::detail::kTrailerSize + 8] += 1; return s; }},
      {"byte appended", [](std::string s) { return s + 'x'; }},
  };
  uint64_t compiles = kiln::counters().compiles;
  for (const auto& d : damages) {
    CAPTURE(d.name);
    write_file(path, d.apply(whole));
    auto r = kiln::jit::load_or_build(key, "bin", build, true);
    CHECK_FALSE(r.from_disk);
    CHECK(r.payload == good);
    CHECK(kiln::counters().compiles == ++compiles);
    CHECK(read_file(path) == whole);  // the rebuilt entry is whole again
    CHECK(kiln::jit::load_or_build(key, "bin", build).from_disk);
  }
}

TEST_CASE("cache: a failing build writes nothing and propagates") {
  FreshCache fresh;
  const kiln::Hash128 key = kiln::hash_bytes("cache-throws");
  auto build = []() -> std::string { throw kiln::CompileError("no luck"); };
  CHECK_THROWS_AS(kiln::jit::load_or_build(key, "bin", build), kiln::CompileError);
  CHECK(kiln::counters().compiles == 0);
  CHECK(fs::is_empty(fresh.dir));
}

TEST_CASE("cache: directory resolution and creation") {
  FreshCache fresh;
  const std::string base = make_temp_dir("resolve");
  const char* home = std::getenv("HOME");
  const std::string saved_home = home ? home : "";

  ::setenv("KILN_CACHE_DIR", (base + "/a/b/").c_str(), 1);
  CHECK(kiln::jit::cache_dir() == base + "/a/b");
  struct stat st {};
  REQUIRE(::stat((base + "/a/b").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);

  ::unsetenv("KILN_CACHE_DIR");
  ::setenv("XDG_CACHE_HOME", (base + "/xdg").c_str(), 1);
  CHECK(kiln::jit::cache_dir() == base + "/xdg/kiln");

  ::unsetenv("XDG_CACHE_HOME");
  ::setenv("HOME", (base + "/home").c_str(), 1);
  CHECK(kiln::jit::cache_dir() == base + "/home/.cache/kiln");
  CHECK(fs::is_directory(base + "/home/.cache/kiln"));

  if (home) ::setenv("HOME", saved_home.c_str(), 1);
  ::setenv("KILN_CACHE_DIR", fresh.dir.c_str(), 1);
  CHECK(kiln::jit::cache_dir() == fresh.dir);
  fs::remove_all(base);
}

TEST_CASE("cache: a directory others can write, or another user owns, is refused") {
  FreshCache fresh;
  for (mode_t mode : {0777, 0770, 0722}) {
    const std::string dir = make_temp_dir("unsafe");
    REQUIRE(::chmod(dir.c_str(), mode) == 0);
    ::setenv("KILN_CACHE_DIR", dir.c_str(), 1);
    try {
      kiln::jit::cache_dir();
      FAIL("an unsafe directory was accepted, mode " << mode);
    } catch (const kiln::Error& e) {
      const std::string what = e.what();
      CAPTURE(what);
      CHECK(what.find(dir) != std::string::npos);
      CHECK(what.find(kiln::jit::detail::mode_text(mode)) != std::string::npos);
    }
    // Every entry point refuses it, and nothing is compiled or written.
    CHECK_THROWS_AS(kiln::jit::load_host_module(source_f(0)), kiln::Error);
    CHECK(kiln::counters().compiles == 0);
    CHECK(fs::is_empty(dir));
    fs::remove_all(dir);
  }
  if (::geteuid() == 0) {  // only root can give a directory away
    const std::string dir = make_temp_dir("owner");
    REQUIRE(::chown(dir.c_str(), 65534, 65534) == 0);
    ::setenv("KILN_CACHE_DIR", dir.c_str(), 1);
    CHECK_THROWS_WITH_AS(kiln::jit::cache_dir(), doctest::Contains(dir.c_str()), kiln::Error);
    fs::remove_all(dir);
  }
  ::setenv("KILN_CACHE_DIR", fresh.dir.c_str(), 1);
}

TEST_CASE("host: compile, call, then a memory hit") {
  FreshCache fresh;
  auto m = kiln::jit::load_host_module(source_f(1));
  CHECK(call_f(*m, 20) == 41);
  CHECK(kiln::counters().compiles == 1);
  CHECK(kiln::counters().memory_hits == 0);
  CHECK(m->path() == host_entry_path(source_f(1)));

  auto again = kiln::jit::load_host_module(source_f(1));
  CHECK(again == m);
  CHECK(kiln::counters().compiles == 1);
  CHECK(kiln::counters().memory_hits == 1);

  CHECK_THROWS_WITH_AS(m->symbol("no_such_symbol"), doctest::Contains("no_such_symbol"), kiln::Error);
}

TEST_CASE("host: another process loads the entry from disk without compiling") {
  FreshCache fresh;
  auto m = kiln::jit::load_host_module(source_f(2));
  REQUIRE(call_f(*m, 1) == 4);
  int code = run_in_child([] {
    kiln::jit::detail::clear_memory_cache();
    kiln::reset_counters();
    auto child = kiln::jit::load_host_module(source_f(2));
    if (call_f(*child, 1) != 4) return 1;
    kiln::Counters c = kiln::counters();
    if (c.compiles != 0) return 2;
    if (c.disk_hits != 1) return 3;
    if (c.memory_hits != 0) return 4;
    return 0;
  });
  CHECK(code == 0);
}

TEST_CASE("host: a corrupt cached shared object is rebuilt, and the result is right") {
  FreshCache fresh;
  const std::string src = source_f(3);
  // Built in a child so that this process has not mapped the file it truncates.
  REQUIRE(run_in_child([&] { return call_f(*kiln::jit::load_host_module(src), 1) == 5 ? 0 : 1; }) == 0);
  const std::string path = host_entry_path(src);
  REQUIRE(fs::exists(path));
  const uintmax_t size = fs::file_size(path);

  fs::resize_file(path, size / 2);
  auto m = kiln::jit::load_host_module(src);
  CHECK(call_f(*m, 1) == 5);
  CHECK(kiln::counters().compiles == 1);
  CHECK(kiln::counters().disk_hits == 0);
  CHECK(fs::file_size(path) == size);

  // Flip one byte in the middle of the shared object. Replace by rename: the
  // old file is mapped into this process and must not change under it.
  std::string bytes = read_file(path);
  bytes[bytes.size() / 2] ^= 0x5A;
  write_file(path + ".damaged", bytes);
  fs::rename(path + ".damaged", path);
  m.reset();
  kiln::jit::detail::clear_memory_cache();
  m = kiln::jit::load_host_module(src);
  CHECK(call_f(*m, 1) == 5);
  CHECK(kiln::counters().compiles == 2);
  CHECK(kiln::counters().disk_hits == 0);
}

TEST_CASE("host: four processes compiling the same new source at once all succeed") {
  FreshCache fresh;
  const std::string src = source_f(4);
  kiln::jit::host_toolchain();  // probe once here, not in every child

  int gate[2];
  REQUIRE(::pipe(gate) == 0);
  std::vector<pid_t> kids;
  for (int i = 0; i < 4; ++i) {
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(gate[1]);
      char c;
      while (::read(gate[0], &c, 1) > 0) {
      }  // EOF when the parent opens the gate: all start together
      int code = 98;
      try {
        code = call_f(*kiln::jit::load_host_module(src), 10) == 24 ? 0 : 1;
      } catch (...) {
      }
      ::_exit(code);
    }
    kids.push_back(pid);
  }
  ::close(gate[0]);
  ::close(gate[1]);
  for (pid_t pid : kids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  CHECK_FALSE(has_temp_files(fresh.dir));
  auto m = kiln::jit::load_host_module(src);
  CHECK(call_f(*m, 10) == 24);
  CHECK(kiln::counters().compiles == 0);
  CHECK(kiln::counters().disk_hits == 1);
}

TEST_CASE("host: threads asking for the same source at once compile it once") {
  FreshCache fresh;
  const std::string src = source_f(5);
  std::vector<std::shared_ptr<const kiln::jit::HostModule>> got(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) threads.emplace_back([&, i] { got[i] = kiln::jit::load_host_module(src); });
  for (auto& t : threads) t.join();
  for (const auto& m : got) {
    REQUIRE(m != nullptr);
    CHECK(m == got[0]);
  }
  CHECK(call_f(*got[0], 0) == 5);
  CHECK(kiln::counters().compiles == 1);
  CHECK(kiln::counters().memory_hits == 3);
}

TEST_CASE("host: a compile error carries the compiler log and the kept source") {
  FreshCache fresh;
  const std::string bad = "extern \"C\" int f(int x) { return x + kiln_undeclared_name; }\n";
  // The failure is not remembered: the second call tries again (and fails again).
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::string what;
    try {
      kiln::jit::load_host_module(bad);
      FAIL("bad source compiled");
    } catch (const kiln::CompileError& e) {
      what = e.what();
    }
    CAPTURE(what);
    CHECK(what.find("kiln_undeclared_name") != std::string::npos);  // the compiler's diagnostic
    CHECK(what.find("error") != std::string::npos);
    const std::string marker = "source: ";
    const size_t at = what.find(marker);
    REQUIRE(at != std::string::npos);
    const std::string kept = what.substr(at + marker.size(), what.find('\n', at) - at - marker.size());
    CHECK(fs::exists(kept));
    CHECK(read_file(kept) == bad);
    fs::remove_all(fs::path(kept).parent_path());
  }
  CHECK(kiln::counters().compiles == 0);

  // A KILN_DUMP that cannot be written is reported, and does not hide the error.
  ::setenv("KILN_DUMP", "/proc/kiln-cannot-dump-here", 1);
  const auto& tc = kiln::jit::host_toolchain();
  try {
    kiln::jit::compile_host_source(bad, tc, kiln::jit::host_module_key(tc, bad));
    FAIL("bad source compiled");
  } catch (const kiln::CompileError& e) {
    const std::string what = e.what();
    CAPTURE(what);
    CHECK(what.find("kiln_undeclared_name") != std::string::npos);
    CHECK(what.find("/proc/kiln-cannot-dump-here") != std::string::npos);
    const size_t at = what.find("source: ") + 8;
    const std::string kept = what.substr(at, what.find('\n', at) - at);
    CHECK(read_file(kept) == bad);
    fs::remove_all(fs::path(kept).parent_path());
  }
  ::unsetenv("KILN_DUMP");
}

TEST_CASE("host: KILN_DUMP keeps every source and compile log") {
  FreshCache fresh;
  const std::string dump = make_temp_dir("dump") + "/nested";
  ::setenv("KILN_DUMP", dump.c_str(), 1);

  const std::string src = source_f(6);
  auto m = kiln::jit::load_host_module(src);
  const std::string hex = kiln::jit::host_module_key(kiln::jit::host_toolchain(), src).hex();
  CHECK(read_file(dump + "/" + hex + ".cpp") == src);
  CHECK(read_file(dump + "/" + hex + ".log").find("exit status 0") != std::string::npos);

  const std::string bad = "this is not C++\n";
  try {
    kiln::jit::load_host_module(bad);
    FAIL("bad source compiled");
  } catch (const kiln::CompileError& e) {
    const std::string bad_hex = kiln::jit::host_module_key(kiln::jit::host_toolchain(), bad).hex();
    CHECK(std::string(e.what()).find(dump + "/" + bad_hex + ".cpp") != std::string::npos);
    CHECK(read_file(dump + "/" + bad_hex + ".cpp") == bad);
    CHECK(fs::exists(dump + "/" + bad_hex + ".log"));
  }
  ::unsetenv("KILN_DUMP");
  fs::remove_all(fs::path(dump).parent_path());
}

TEST_CASE("host: KILN_CXXFLAGS and CXX are part of the key") {
  FreshCache fresh;
  const std::string src = "extern \"C\" int f(int) { return KILN_TEST_VALUE; }\n";
  ::setenv("KILN_CXXFLAGS", "-DKILN_TEST_VALUE=7", 1);
  CHECK(call_f(*kiln::jit::load_host_module(src), 0) == 7);
  ::setenv("KILN_CXXFLAGS", "-DKILN_TEST_VALUE=8", 1);
  CHECK(call_f(*kiln::jit::load_host_module(src), 0) == 8);  // not a stale hit
  CHECK(kiln::counters().compiles == 2);
  CHECK(kiln::counters().memory_hits == 0);
  ::unsetenv("KILN_CXXFLAGS");

  const char* cxx = std::getenv("CXX");
  const std::string saved = cxx ? cxx : "";
  ::setenv("CXX", "/nonexistent/kiln-cxx", 1);
  CHECK_THROWS_WITH_AS(kiln::jit::load_host_module(source_f(7)), doctest::Contains("/nonexistent/kiln-cxx"),
                       kiln::Error);
  if (cxx) ::setenv("CXX", saved.c_str(), 1); else ::unsetenv("CXX");
}
