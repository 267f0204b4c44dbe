// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Per-process counters (public API). Takes in increments from the JIT cache and
// the launch path; gives out a snapshot that tests and users assert on:
// compiles (a compiler actually ran), memory_hits (a loaded module was reused),
// disk_hits (a verified disk entry was loaded), kernels_launched, tunings
// (max-autotune benchmarked a key's candidates), tune_db_hits (a tuning database
// lookup found the key: tune/db.hpp), plans_built (the scheduler ran: a
// signature seen for the first time), and for Mode::reduce_overhead graphs_built (a
// CUDA graph made: the call's kernels or launch shapes changed), graph_updates (kernel
// nodes whose arguments a call changed: a new input, output or size) and
// graph_replays (calls launched as one graph); kernels_overlapped (launches, or a replayed
// graph's nodes, placed on a call's second stream to run beside the kernels before them:
// kiln::kernel_overlap); kernels_programmatic (launches that may start before the kernel
// before them on their stream has finished: kiln::programmatic_launch); kernels_filling (launches,
// or a replayed graph's nodes, of a call's leaf kernels placed on a third stream below the
// priority of the call's other kernels: kiln::idle_fill).
#pragma once

#include <atomic>
#include <cstdint>

namespace kiln {

struct Counters {
  uint64_t compiles = 0, memory_hits = 0, disk_hits = 0, kernels_launched = 0, tunings = 0, tune_db_hits = 0, plans_built = 0;
  uint64_t graphs_built = 0, graph_updates = 0, graph_replays = 0, kernels_overlapped = 0, kernels_programmatic = 0;
  uint64_t kernels_filling = 0;
};

namespace detail {

struct AtomicCounters {
  std::atomic<uint64_t> compiles{0}, memory_hits{0}, disk_hits{0}, kernels_launched{0}, tunings{0}, tune_db_hits{0},
      plans_built{0}, graphs_built{0}, graph_updates{0}, graph_replays{0}, kernels_overlapped{0}, kernels_programmatic{0},
      kernels_filling{0};
};

// NOTE: a function-local static in an inline function is one object per
// process however many translation units include this header.
inline AtomicCounters& counters_state() {
  static AtomicCounters state;
  return state;
}

}  // namespace detail

// Relaxed loads: the fields are independent tallies, not a consistent cut.
inline Counters counters() {
  auto& s = detail::counters_state();
  return Counters{s.compiles.load(std::memory_order_relaxed), s.memory_hits.load(std::memory_order_relaxed),
                  s.disk_hits.load(std::memory_order_relaxed), s.kernels_launched.load(std::memory_order_relaxed),
                  s.tunings.load(std::memory_order_relaxed), s.tune_db_hits.load(std::memory_order_relaxed),
                  s.plans_built.load(std::memory_order_relaxed), s.graphs_built.load(std::memory_order_relaxed),
                  s.graph_updates.load(std::memory_order_relaxed), s.graph_replays.load(std::memory_order_relaxed),
                  s.kernels_overlapped.load(std::memory_order_relaxed), s.kernels_programmatic.load(std::memory_order_relaxed),
                  s.kernels_filling.load(std::memory_order_relaxed)};
}

inline void reset_counters() {
  auto& s = detail::counters_state();
  s.compiles.store(0, std::memory_order_relaxed);
  s.memory_hits.store(0, std::memory_order_relaxed);
  s.disk_hits.store(0, std::memory_order_relaxed);
  s.kernels_launched.store(0, std::memory_order_relaxed);
  s.tunings.store(0, std::memory_order_relaxed);
  s.tune_db_hits.store(0, std::memory_order_relaxed);
  s.plans_built.store(0, std::memory_order_relaxed);
  s.graphs_built.store(0, std::memory_order_relaxed);
  s.graph_updates.store(0, std::memory_order_relaxed);
  s.graph_replays.store(0, std::memory_order_relaxed);
  s.kernels_overlapped.store(0, std::memory_order_relaxed);
  s.kernels_programmatic.store(0, std::memory_order_relaxed);
  s.kernels_filling.store(0, std::memory_order_relaxed);
}

}  // namespace kiln
