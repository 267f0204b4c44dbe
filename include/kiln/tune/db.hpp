// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The tuning database. Takes a Key (op, shape class, dtype, operand layout,
// fused epilogue, architecture, kiln version) and gives the choice a tuning run stored for it;
// autotune() looks the key up and, only on a miss, benchmarks every candidate
// once, stores the fastest and says so (KILN_LOG=tune: progress and tuning time).
//
// Persistent under the kiln cache directory (jit/cache.hpp), one file per key:
//   <cache>/tune/<hex>.tune, hex = hash of the key text
// written like a cache entry (unique temp file, fsync, rename, checksummed
// trailer), so processes share it without locks: a reader sees a whole entry or
// none, and two processes tuning one key at once both write a valid entry (the
// last rename wins). The payload is text:
//   kiln-tune <kTuneFormat>\nkey <key text>\nchoice <candidate>\nus <microseconds>\n
// An entry that is corrupt, of another format, or for another key text (a hash
// collision) is ignored with a warning on stderr; the next tuning overwrites it.
// NOTE: the kiln version is part of every key: a new kiln never trusts an old
// kiln's timings (its kernels may differ), without a format change. Likewise a
// key's fields: entries written before a matmul key named its fused epilogue
// (ep-<hash>) have other key texts, so other files; they are never read.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/core/dtype.hpp"
#include "kiln/jit/cache.hpp"

namespace kiln::tune {

inline constexpr int kTuneFormat = 1;
inline constexpr const char* kKilnVersion = "0.1.0";  // NOTE: keep in step with CMakeLists.txt's project(VERSION)

struct Key {
  std::string op;      // "matmul"
  std::string shape;   // a shape class (gemm_shape_class), not the exact sizes
  DType dtype = DType::f32;
  std::string layout;  // operand layout and epilogue, as the op defines it ("nt+bias")
  std::string arch;    // "sm_90", "gfx90a", "cpu"
  std::string epilogue;  // what the kernel computes around the op (MatmulEpilogue::identity); "" for nothing
  std::string text() const {
    return op + " " + shape + " " + std::string(info(dtype).name) + " " + layout + (epilogue.empty() ? "" : " ep-" + epilogue) + " " +
           arch + " kiln-" + kKilnVersion;
  }
};

// Sizes to classes: exact up to 16, then the next power of two, so one tuning
// serves every size up to 2x apart (tile choices change at powers of two).
inline int64_t size_class(int64_t n) {
  if (n <= 16) return n;
  int64_t c = 32;
  while (c < n) c *= 2;
  return c;
}
inline std::string gemm_shape_class(int64_t batch, int64_t m, int64_t n, int64_t k) {
  return "b" + std::to_string(size_class(batch)) + "m" + std::to_string(size_class(m)) + "n" + std::to_string(size_class(n)) +
         "k" + std::to_string(size_class(k));
}

struct Entry {
  std::string choice;
  double us = 0;  // the choice's measured time when it was tuned
};

class Db {
 public:
  // The stored entry for `key` (memory, then disk), counting tune_db_hits; nullopt on a miss.
  std::optional<Entry> find(const Key& key) {
    std::string text = key.text(), path = path_of(text);
    {
      std::lock_guard lock(mu_);
      if (auto it = memory_.find(path); it != memory_.end()) return hit(it->second);
    }
    std::string file;
    struct stat st {};
    if (int err = jit::detail::read_file(path, file, st); err != 0) {
      if (err != ENOENT) warn(path, "cannot read it (" + jit::detail::errno_text(err) + ")");
      return std::nullopt;
    }
    std::string_view payload;
    std::string why;
    if (!jit::detail::decode_entry(file, payload, why)) {
      warn(path, "corrupt (" + why + ")");
      return std::nullopt;
    }
    std::optional<Entry> e = parse(payload, text, why);
    if (!e) {
      warn(path, why);
      return std::nullopt;
    }
    std::lock_guard lock(mu_);
    memory_[path] = *e;
    return hit(*e);
  }

  // Writes the entry for `key` (atomically; replaces whatever was there).
  void store(const Key& key, const Entry& e) {
    std::string text = key.text(), path = path_of(text);
    char us[64];
    std::snprintf(us, sizeof us, "%.17g", e.us);
    std::string payload = "kiln-tune " + std::to_string(kTuneFormat) + "\nkey " + text + "\nchoice " + e.choice + "\nus " + us + "\n";
    int err = jit::detail::write_entry_atomic(path, payload);
    if (err == ENOENT) {  // the tune directory is gone (a cleaned cache): make it again, once
      jit::detail::forget_checked_dir(dir());
      err = jit::detail::write_entry_atomic(path_of(text), payload);
    }
    if (err != 0) throw Error("kiln: cannot write tuning entry '" + path + "': " + jit::detail::errno_text(err));
    std::lock_guard lock(mu_);
    memory_[path] = e;
    generation_.fetch_add(1, std::memory_order_relaxed);
  }

  // Forgets what this process read (tests: the next find() reads the disk).
  void clear_memory() {
    std::lock_guard lock(mu_);
    memory_.clear();
    generation_.fetch_add(1, std::memory_order_relaxed);
  }

  // Moves on every store and clear in this process: a caller that kept what find() gave
  // (max-autotune's repeat calls, runtime/gpu_backend.hpp) looks again when it has moved.
  uint64_t generation() const { return generation_.load(std::memory_order_relaxed); }

  // `<cache>/tune`, created 0700 and checked like the cache directory.
  static std::string dir() {
    std::string d = jit::cache_dir() + "/tune";
    auto& s = jit::detail::checked_dirs();
    std::lock_guard lock(s.mutex);
    if (s.dirs.count(d) == 0) {
      jit::detail::make_dirs(d, 0700);
      jit::detail::check_cache_dir_safe(d);
      s.dirs.insert(d);
    }
    return d;
  }
  static std::string path_of(const std::string& key_text) {
    return dir() + "/" + Hasher().add(std::string_view("kiln-tune")).add(std::string_view(key_text)).digest().hex() + ".tune";
  }

 private:
  static Entry hit(const Entry& e) {
    ::kiln::detail::counters_state().tune_db_hits.fetch_add(1, std::memory_order_relaxed);
    return e;
  }
  static void warn(const std::string& path, const std::string& why) {
    std::string line = "[kiln:tune] warning: ignoring tuning entry " + path + ": " + why + "; it will be retuned\n";
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
  // The payload's lines, checked against the format and the key.
  static std::optional<Entry> parse(std::string_view p, const std::string& key_text, std::string& why) {
    auto line = [&](std::string_view tag) -> std::optional<std::string> {
      std::string prefix = std::string(tag) + " ";
      if (p.substr(0, prefix.size()) != prefix) return std::nullopt;
      size_t end = p.find('\n');
      if (end == std::string_view::npos) return std::nullopt;
      std::string v(p.substr(prefix.size(), end - prefix.size()));
      p.remove_prefix(end + 1);
      return v;
    };
    auto format = line("kiln-tune");
    if (!format || *format != std::to_string(kTuneFormat)) {
      why = "format " + (format ? *format : std::string("unknown")) + ", this kiln reads " + std::to_string(kTuneFormat);
      return std::nullopt;
    }
    auto key = line("key");
    if (!key || *key != key_text) {
      why = "written for another key";
      return std::nullopt;
    }
    auto choice = line("choice");
    auto us = line("us");
    if (!choice || choice->empty() || !us) {
      why = "malformed";
      return std::nullopt;
    }
    return Entry{*choice, std::strtod(us->c_str(), nullptr)};
  }

  std::mutex mu_;
  std::unordered_map<std::string, Entry> memory_;  // by path (the cache directory may change)
  std::atomic<uint64_t> generation_{0};
};

inline Db& db() {
  static Db d;
  return d;
}

// The fastest of `candidates` for `key`: the stored choice on a hit (nothing is
// run), else bench(candidate) for each (microseconds; +inf or a throw: it cannot
// run), the fastest stored. Counts tunings. A stored choice that is no longer a
// candidate is retuned. Every candidate is timed twice, in order and then in reverse
// order, and scored by the mean: a device whose clocks are still rising (or falling)
// while the candidates run favours none of them (the drift cancels).
inline std::string autotune(const Key& key, const std::vector<std::string>& candidates,
                            const std::function<double(const std::string&)>& bench) {
  if (candidates.empty()) throw Error("kiln: autotune " + key.text() + ": no candidates");
  if (auto e = db().find(key); e && std::find(candidates.begin(), candidates.end(), e->choice) != candidates.end()) {
    log(LogTopic::tune, "hit " + key.text() + ": " + e->choice);
    return e->choice;
  }
  auto t0 = std::chrono::steady_clock::now();
  ::kiln::detail::counters_state().tunings.fetch_add(1, std::memory_order_relaxed);
  const size_t n = candidates.size();
  std::vector<double> total(n, 0);
  for (size_t step = 0; step < 2 * n; ++step) {
    size_t i = step < n ? step : 2 * n - 1 - step;
    if (!std::isfinite(total[i])) continue;  // could not run the first time
    double us = INFINITY;
    try {
      us = bench(candidates[i]);
    } catch (const std::exception& ex) {
      log(LogTopic::tune, "  " + candidates[i] + ": cannot run (" + ex.what() + ")");
    }
    if (log_enabled(LogTopic::tune)) {
      char b[160];
      std::snprintf(b, sizeof b, "tuning %s: [%zu/%zu] %s %.2f us", key.text().c_str(), step + 1, 2 * n, candidates[i].c_str(), us);
      log(LogTopic::tune, b);
    }
    total[i] += us;
  }
  Entry best{"", INFINITY};
  for (size_t i = 0; i < n; ++i)
    if (total[i] / 2 < best.us) best = {candidates[i], total[i] / 2};
  if (best.choice.empty()) throw Error("kiln: autotune " + key.text() + ": no candidate could run");
  db().store(key, best);
  if (log_enabled(LogTopic::tune)) {
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    char b[160];
    std::snprintf(b, sizeof b, "tuned %s: %s (%.2f us) in %.1f ms", key.text().c_str(), best.choice.c_str(), best.us, ms);
    log(LogTopic::tune, b);
  }
  return best.choice;
}

}  // namespace kiln::tune
