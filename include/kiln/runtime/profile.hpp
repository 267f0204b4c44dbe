// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The kernel profiler (public API): with profiling on (KILN_PROFILE=1, or
// kiln::set_profiling(true)) every kernel a backend launches is timed on its
// device's clock (GPU: events around the launch, which then waits for it; CPU: the
// call) and tallied by kernel: which plan, which kernel of it, what it computes and
// the variant that ran. profile() gives the tallies, most time first;
// profile_report() a table of them; with KILN_PROFILE=1 that table goes to stderr
// when the process exits. Profiling serialises the launches, so a profiled run is
// slower than an unprofiled one: the per-kernel times are what it is for.
//
// The launch timeline (public API, a GPU diagnostic): with it on (KILN_TIMELINE=1, or
// kiln::set_timeline(true)) a GPU call launched kernel by kernel keeps its streams and its
// order (profiling does not), and records for each kernel, in ms on the device's clock from
// the call's start, when its stream reached it (the kernels before it on that stream and the
// events it waits for done: the earliest it could start) and when it ended; the call then
// waits for its kernels. timeline() gives the last such call's entries, in launch order. So
// one sees which kernels ran beside which (kiln::kernel_overlap, kiln::idle_fill). A call
// that replays a graph records none.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace kiln {

struct KernelProfile {
  std::string kernel;  // "[plan 1a2b3c fused k5] matmul over [8192, 16384] wgmma_128x256x64_64x256_s4"
  int64_t calls = 0;
  double total_ms = 0;
};

struct TimelineEntry {
  std::string kernel;  // as in KernelProfile
  int stream = 0;      // 0 the device's stream, 1 its side stream, 2 its fill stream (kiln::idle_fill)
  double ready_ms = 0, end_ms = 0;
};

namespace detail {

struct TimelineState {
  std::atomic<bool> on{false};
  std::mutex mu;
  std::vector<TimelineEntry> last;
};
inline TimelineState& timeline_state() {
  static TimelineState s{[] {
    const char* v = std::getenv("KILN_TIMELINE");  // on from the start where set and not "0"
    return v != nullptr && *v != '\0' && std::string(v) != "0";
  }(), {}, {}};
  return s;
}

struct ProfileState {
  std::atomic<bool> on{false};
  std::mutex mu;
  std::map<std::string, KernelProfile> kernels;
};
inline ProfileState& profile_state() {
  static ProfileState s;
  return s;
}

}  // namespace detail

inline bool timeline_on() { return detail::timeline_state().on.load(std::memory_order_relaxed); }
inline void set_timeline(bool on) { detail::timeline_state().on.store(on, std::memory_order_relaxed); }
// The last timed call's kernels, in launch order.
inline std::vector<TimelineEntry> timeline() {
  auto& s = detail::timeline_state();
  std::lock_guard lock(s.mu);
  return s.last;
}

inline bool profiling() { return detail::profile_state().on.load(std::memory_order_relaxed); }
inline void set_profiling(bool on) { detail::profile_state().on.store(on, std::memory_order_relaxed); }

inline void profile_reset() {
  auto& s = detail::profile_state();
  std::lock_guard lock(s.mu);
  s.kernels.clear();
}

// The tallies, most total time first.
inline std::vector<KernelProfile> profile() {
  auto& s = detail::profile_state();
  std::vector<KernelProfile> out;
  {
    std::lock_guard lock(s.mu);
    for (const auto& [name, p] : s.kernels) out.push_back(p);
  }
  std::stable_sort(out.begin(), out.end(), [](const KernelProfile& a, const KernelProfile& b) { return a.total_ms > b.total_ms; });
  return out;
}

inline std::string profile_report() {
  std::vector<KernelProfile> ps = profile();
  double total = 0;
  for (const auto& p : ps) total += p.total_ms;
  std::string s = "kiln profile: " + std::to_string(ps.size()) + " kernels\n       total ms    calls    ms/call   share  kernel\n";
  for (const auto& p : ps) {
    char line[96];
    std::snprintf(line, sizeof line, "  %13.3f %8lld %10.4f %6.1f%%  ", p.total_ms, static_cast<long long>(p.calls),
                  p.total_ms / double(std::max<int64_t>(p.calls, 1)), total > 0 ? 100 * p.total_ms / total : 0.0);
    s += line + p.kernel + "\n";
  }
  return s;
}

namespace runtime::detail {

inline void profile_record(const std::string& kernel, double ms) {
  auto& s = kiln::detail::profile_state();
  std::lock_guard lock(s.mu);
  KernelProfile& p = s.kernels[kernel];
  p.kernel = kernel, p.calls += 1, p.total_ms += ms;
}

// KILN_PROFILE=1: profiling from the start, the report at exit.
inline const bool profile_from_env = [] {
  const char* v = std::getenv("KILN_PROFILE");
  if (v == nullptr || *v == '\0' || std::string(v) == "0") return false;
  set_profiling(true);
  std::atexit([] { std::fputs(profile_report().c_str(), stderr); });
  return true;
}();

}  // namespace runtime::detail
}  // namespace kiln
