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
#include <iterator>

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

// A row a counter: its field in the snapshot and the atomic behind it. counters() and
// reset_counters() walk this table, so a new counter is a field in both structs and a row here.
struct CounterField {
  uint64_t Counters::*value;
  std::atomic<uint64_t> AtomicCounters::*tally;
};
inline constexpr CounterField kCounterFields[] = {
    {&Counters::compiles, &AtomicCounters::compiles},
    {&Counters::memory_hits, &AtomicCounters::memory_hits},
    {&Counters::disk_hits, &AtomicCounters::disk_hits},
    {&Counters::kernels_launched, &AtomicCounters::kernels_launched},
    {&Counters::tunings, &AtomicCounters::tunings},
    {&Counters::tune_db_hits, &AtomicCounters::tune_db_hits},
    {&Counters::plans_built, &AtomicCounters::plans_built},
    {&Counters::graphs_built, &AtomicCounters::graphs_built},
    {&Counters::graph_updates, &AtomicCounters::graph_updates},
    {&Counters::graph_replays, &AtomicCounters::graph_replays},
    {&Counters::kernels_overlapped, &AtomicCounters::kernels_overlapped},
    {&Counters::kernels_programmatic, &AtomicCounters::kernels_programmatic},
    {&Counters::kernels_filling, &AtomicCounters::kernels_filling},
};
static_assert(sizeof(Counters) == std::size(kCounterFields) * sizeof(uint64_t), "a field of Counters has no row in kCounterFields");
static_assert(sizeof(AtomicCounters) == std::size(kCounterFields) * sizeof(std::atomic<uint64_t>),
              "an atomic of AtomicCounters has no row in kCounterFields");

}  // namespace detail

// Relaxed loads: the fields are independent tallies, not a consistent cut.
inline Counters counters() {
  auto& s = detail::counters_state();
  Counters c;
  for (const auto& f : detail::kCounterFields) c.*f.value = (s.*f.tally).load(std::memory_order_relaxed);
  return c;
}

inline void reset_counters() {
  auto& s = detail::counters_state();
  for (const auto& f : detail::kCounterFields) (s.*f.tally).store(0, std::memory_order_relaxed);
}

}  // namespace kiln
