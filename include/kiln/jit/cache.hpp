// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The content-addressed disk cache, generic over artifact kinds (host shared
// objects now; cubins and HIP code objects later). Takes in a key (a Hash128 the
// backend computed from source, options, compiler identity and target), a file
// extension and a build function; gives out the path of a verified entry on
// disk (and its payload bytes on request), building and writing it if needed.
// The memory layer (key -> loaded module) belongs to each backend.
//
// Directory: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln;
// created 0700, and refused if another user owns it or group/others can write
// it: a cached shared object is code that this process will run.
//
// Entry file `<dir>/<hex>.<ext>`, hex = entry_key(key) (the key with
// kCacheFormatVersion mixed in):
//   payload bytes | "KILNCACH" | u32 format | u32 trailer size | u64 payload size
//                 | u64 payload hash lo | u64 payload hash hi      (little-endian)
// NOTE: the trailer goes *after* the payload because an ELF shared object with
// bytes appended still loads, so a host entry is dlopen'ed in place once
// verified. A missing, truncated or corrupt entry is never loaded: it is logged
// (KILN_LOG=cache), deleted and rebuilt. Writes go to a unique temp file in the
// same directory, are fsync'ed and renamed over the entry, so a reader sees a
// whole entry or none, and processes building the same key at once all succeed.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_set>

#include "kiln/core/error.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/log.hpp"
#include "kiln/runtime/counters.hpp"

namespace kiln::jit {

// Bump when the entry layout or anything that decides an entry's bytes changes
// in a way keys do not capture; old entries then simply stop being found.
inline constexpr uint32_t kCacheFormatVersion = 1;

namespace detail {

inline constexpr char kEntryMagic[8] = {'K', 'I', 'L', 'N', 'C', 'A', 'C', 'H'};
inline constexpr size_t kTrailerSize = 8 + 4 + 4 + 8 + 8 + 8;

inline std::string errno_text(int err) { return std::string(std::strerror(err)); }

inline std::string mode_text(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

inline void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

inline uint64_t get_le(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

inline std::string encode_trailer(std::string_view payload) {
  Hash128 h = hash_bytes(payload);
  std::string t(kEntryMagic, sizeof kEntryMagic);
  put_le(t, kCacheFormatVersion, 4);
  put_le(t, kTrailerSize, 4);
  put_le(t, payload.size(), 8);
  put_le(t, h.lo, 8);
  put_le(t, h.hi, 8);
  return t;
}

// Splits a whole entry file into its payload. Returns false, with the reason in
// `why`, when the bytes are not a valid entry of the current format.
inline bool decode_entry(std::string_view file, std::string_view& payload, std::string& why) {
  if (file.size() < kTrailerSize) {
    why = "file of " + std::to_string(file.size()) + " bytes is shorter than the trailer";
    return false;
  }
  const char* t = file.data() + file.size() - kTrailerSize;
  if (std::memcmp(t, kEntryMagic, sizeof kEntryMagic) != 0) {
    why = "no KILNCACH trailer (truncated or not a kiln entry)";
    return false;
  }
  uint64_t version = get_le(t + 8, 4), trailer = get_le(t + 12, 4), size = get_le(t + 16, 8);
  if (version != kCacheFormatVersion || trailer != kTrailerSize) {
    why = "format version " + std::to_string(version) + " with a " + std::to_string(trailer) +
          "-byte trailer, expected version " + std::to_string(kCacheFormatVersion);
    return false;
  }
  if (size != file.size() - kTrailerSize) {
    why = "payload size " + std::to_string(file.size() - kTrailerSize) + " does not match the recorded " +
          std::to_string(size);
    return false;
  }
  payload = file.substr(0, size);
  Hash128 recorded{get_le(t + 24, 8), get_le(t + 32, 8)};
  if (hash_bytes(payload) != recorded) {
    why = "payload hash does not match the trailer";
    return false;
  }
  return true;
}

// Where the cache lives according to the environment; no checks, no mkdir.
inline std::string resolve_cache_dir() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? std::string(v) : std::string();
  };
  std::string dir = env("KILN_CACHE_DIR");
  if (dir.empty()) {
    std::string xdg = env("XDG_CACHE_HOME");
    // The XDG spec says a relative XDG_CACHE_HOME is invalid and must be ignored.
    if (!xdg.empty() && xdg.front() == '/') {
      dir = xdg + "/kiln";
    } else if (std::string home = env("HOME"); !home.empty()) {
      dir = home + "/.cache/kiln";
    } else {
      throw Error("kiln: no cache directory: none of KILN_CACHE_DIR, XDG_CACHE_HOME, HOME is set");
    }
  }
  if (dir.front() != '/') {  // a later chdir must not move the cache
    char cwd[4096];
    if (::getcwd(cwd, sizeof cwd) == nullptr) throw Error("kiln: getcwd failed: " + errno_text(errno));
    dir = std::string(cwd) + "/" + dir;
  }
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return dir;
}

// mkdir -p with `mode` for every directory it creates.
inline void make_dirs(const std::string& path, mode_t mode) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), mode) != 0 && errno != EEXIST) {
      throw Error("kiln: cannot create directory '" + prefix + "': " + errno_text(errno));
    }
  }
}

inline void check_cache_dir_safe(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    throw Error("kiln: cannot use cache directory '" + dir + "': " + errno_text(errno));
  }
  if (!S_ISDIR(st.st_mode)) throw Error("kiln: cache directory '" + dir + "' is not a directory");
  if (st.st_uid != ::geteuid()) {
    throw Error("kiln: refusing cache directory '" + dir + "' (mode " + mode_text(st.st_mode) + "): owned by uid " +
                std::to_string(st.st_uid) + ", not by this user (uid " + std::to_string(::geteuid()) +
                "); cached shared objects are code that will run. Set KILN_CACHE_DIR to a directory you own.");
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    throw Error("kiln: refusing cache directory '" + dir + "' (mode " + mode_text(st.st_mode) +
                "): writable by group or others, and cached shared objects are code that will run. "
                "Run `chmod 700 '" + dir + "'` or set KILN_CACHE_DIR to a private directory.");
  }
}

// Directories already created and checked in this process.
struct CheckedDirs {
  std::mutex mutex;
  std::unordered_set<std::string> dirs;
};

inline CheckedDirs& checked_dirs() {
  static CheckedDirs state;
  return state;
}

inline void forget_checked_dir(const std::string& dir) {
  auto& s = checked_dirs();
  std::lock_guard lock(s.mutex);
  s.dirs.erase(dir);
}

// Reads a whole file. Returns errno (0 on success); `st` is the opened file's stat.
inline int read_file(const std::string& path, std::string& out, struct stat& st) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  int err = 0;
  if (::fstat(fd, &st) != 0) {
    err = errno;
  } else if (!S_ISREG(st.st_mode)) {
    err = EINVAL;
  } else {
    out.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < out.size()) {
      ssize_t n = ::read(fd, out.data() + done, out.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        err = errno;
        break;
      }
      if (n == 0) break;  // shrank under us: the size check will reject it
      done += static_cast<size_t>(n);
    }
    out.resize(done);
  }
  ::close(fd);
  return err;
}

inline bool write_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Distinct per call in this process and (through the pid and the clock) across
// processes; O_EXCL catches whatever is left.
inline std::string temp_suffix() {
  static std::atomic<uint64_t> counter{0};
  Hash128 h = Hasher()
                  .add(static_cast<int64_t>(::getpid()))
                  .add(static_cast<int64_t>(std::chrono::steady_clock::now().time_since_epoch().count()))
                  .add(counter.fetch_add(1, std::memory_order_relaxed))
                  .digest();
  return ".tmp." + std::to_string(::getpid()) + "." + h.hex().substr(0, 12);
}

// Writes payload + trailer to `path` atomically. Returns errno (0 on success).
inline int write_entry_atomic(const std::string& path, std::string_view payload) {
  std::string trailer = encode_trailer(payload);
  for (int attempt = 0;; ++attempt) {
    std::string tmp = path + temp_suffix();
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      if (errno == EEXIST && attempt < 8) continue;
      return errno;
    }
    bool ok = write_all(fd, payload) && write_all(fd, trailer) && ::fsync(fd) == 0;
    int err = ok ? 0 : errno;
    if (::close(fd) != 0 && ok) {
      ok = false;
      err = errno;
    }
    if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
      ok = false;
      err = errno;
    }
    if (!ok) ::unlink(tmp.c_str());
    return err;
  }
}

}  // namespace detail

// The cache directory, created if missing and checked once per process per
// directory. Throws kiln::Error if it is unsafe or cannot be created.
// NOTE: the environment is re-read on every call (three getenv, then a set
// lookup) because the directory may change under a running process (tests do).
inline std::string cache_dir() {
  std::string dir = detail::resolve_cache_dir();
  auto& s = detail::checked_dirs();
  std::lock_guard lock(s.mutex);
  if (s.dirs.count(dir) != 0) return dir;
  detail::make_dirs(dir, 0700);
  detail::check_cache_dir_safe(dir);
  s.dirs.insert(dir);
  if (log_enabled(LogTopic::cache)) log(LogTopic::cache, "using cache directory " + dir);
  return dir;
}

// The name an entry is stored under: the caller's key with the format version
// mixed in, so a format change never reads an old layout.
inline Hash128 entry_key(const Hash128& key) {
  return Hasher().add(std::string_view("kiln-cache")).add(kCacheFormatVersion).add(key).digest();
}

namespace detail {
inline std::string entry_path(const std::string& dir, const Hash128& key, std::string_view ext) {
  return dir + '/' + entry_key(key).hex() + '.' + std::string(ext);
}
}  // namespace detail

// `<dir>/<hex>.<ext>`. Flat: a kernel cache holds thousands of entries, not
// millions, so a directory level per hash prefix would only cost extra checks.
inline std::string cache_path(const Hash128& key, std::string_view ext) {
  return detail::entry_path(cache_dir(), key, ext);
}

struct CacheResult {
  std::string path;     // verified entry on disk (payload followed by the trailer)
  std::string payload;  // the payload bytes, only if asked for
  bool from_disk = false;
};

// A verified entry's payload if there is one (counts disk_hits); nothing is built.
inline bool load_if_cached(const Hash128& key, std::string_view ext, std::string& payload) {
  std::string file;
  struct stat st {};
  std::string_view bytes;
  std::string why;
  if (detail::read_file(cache_path(key, ext), file, st) != 0 || !detail::decode_entry(file, bytes, why)) return false;
  ::kiln::detail::counters_state().disk_hits.fetch_add(1, std::memory_order_relaxed);
  payload.assign(bytes);
  return true;
}

// Disk hit (verified; counts disk_hits) or build() -> write -> counts compiles.
// build() may throw (e.g. kiln::CompileError); nothing is written then.
inline CacheResult load_or_build(const Hash128& key, std::string_view ext, const std::function<std::string()>& build,
                                 bool want_payload = false) {
  std::string dir = cache_dir();
  std::string path = detail::entry_path(dir, key, ext);

  std::string file;
  struct stat st {};
  if (int err = detail::read_file(path, file, st); err == 0) {
    std::string_view payload;
    std::string why;
    if (detail::decode_entry(file, payload, why)) {
      ::kiln::detail::counters_state().disk_hits.fetch_add(1, std::memory_order_relaxed);
      if (log_enabled(LogTopic::cache)) log(LogTopic::cache, "disk hit " + path);
      CacheResult result{path, {}, true};
      if (want_payload) result.payload.assign(payload);
      return result;
    }
    // Never load it. Unlink only the file we judged: another process may have
    // renamed a fresh entry over it meanwhile.
    if (log_enabled(LogTopic::cache)) log(LogTopic::cache, "corrupt entry " + path + ": " + why + "; rebuilding");
    struct stat now {};
    if (::stat(path.c_str(), &now) == 0 && now.st_ino == st.st_ino && now.st_dev == st.st_dev) {
      ::unlink(path.c_str());
    }
  } else if (err != ENOENT && log_enabled(LogTopic::cache)) {
    log(LogTopic::cache, "cannot read " + path + ": " + detail::errno_text(err) + "; rebuilding");
  }

  std::string payload = build();
  ::kiln::detail::counters_state().compiles.fetch_add(1, std::memory_order_relaxed);

  int err = detail::write_entry_atomic(path, payload);
  if (err == ENOENT) {
    // The directory vanished since it was checked (someone cleaned the cache):
    // create and check it again, once.
    detail::forget_checked_dir(dir);
    cache_dir();
    err = detail::write_entry_atomic(path, payload);
  }
  if (err != 0) throw Error("kiln: cannot write cache entry '" + path + "': " + detail::errno_text(err));
  if (log_enabled(LogTopic::cache)) {
    log(LogTopic::cache, "wrote " + path + " (" + std::to_string(payload.size()) + " bytes)");
  }
  CacheResult result{path, {}, false};
  if (want_payload) result.payload = std::move(payload);
  return result;
}

}  // namespace kiln::jit
