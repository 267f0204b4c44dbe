// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Switches a program may flip at run time, each also read from the environment at the
// first use (Inductor's config.*, PyTorch's torch.backends flags).
//   allow_tf32       f32 matmuls may trade precision for speed: on NVIDIA GPUs of sm_80
//                    and later, TF32 tensor cores (inputs rounded to 10 mantissa bits, to
//                    nearest; products summed in f32) instead of f32 arithmetic. Off by
//                    default, as PyTorch's torch.backends.cuda.matmul.allow_tf32;
//                    KILN_ALLOW_TF32=1. It decides each call's GEMM kernel (and cuBLASLt's
//                    compute type in max-autotune), not the plan: a flip takes effect on the
//                    next call. The CPU and HIP backends compute f32 matmuls in f32 either way.
//   epilogue_fusion  a matmul's pointwise consumers of its shape join its GEMM as the
//                    epilogue (on by default; KILN_EPILOGUE_FUSION=0). Off, they are kernels
//                    of their own: a diagnostic, and the baseline fused epilogues are
//                    measured against. Part of each plan's key (plan_options): a call after a
//                    flip gets the plan of the new setting, built once and cached beside the other.
//   kernel_overlap   on a GPU, a call's large kernels that do not read what the kernel
//                    before them writes run beside it (a second stream; a graph's edges),
//                    so that one starts on the SMs the other's last wave leaves idle (on by
//                    default; KILN_KERNEL_OVERLAP=0: each call's kernels one after another).
//                    Decides each call's launches, not the plan.
//   gemm_column_sums on a GPU, a sum over the rows of a matrix that a GEMM stores (a bias's
//                    gradient, sum(dy, 0)) is computed by that GEMM as it stores the tiles,
//                    where its kernel can (wgmma), instead of by a rows kernel reading the
//                    matrix again (off by default; KILN_GEMM_COLUMN_SUMS=1). Decides each
//                    call's kernels, not the plan. NOTE: off because on an H200 it made W4's
//                    step 1.5-2% slower when every tile was read back (two kernels fewer, 0.1
//                    ms, against a pause of every tile's storing threads: docs/benchmarks.md,
//                    thirty-first session); from the registers that store the tile (fifty-
//                    eighth session), 0.3% slower back to back on an H100 (fifty-ninth): the
//                    rows kernels it saves run beside another GEMM on the second stream.
//   gemm_operand_sums on a GPU, a sum over the rows of a matrix that a GEMM reads as its B
//                    operand along K (a bias's gradient beside its weight's: dW = x.t() @ dy,
//                    db = sum(dy, 0)) is computed by that GEMM from the B tiles already in its
//                    shared memory (cuBLASLt's BGRADB epilogue), where its kernel can (wgmma
//                    without a split epilogue), instead of by a rows kernel reading the matrix
//                    again (off by default; KILN_GEMM_OPERAND_SUMS=1). Decides each call's
//                    kernels, not the plan. NOTE: off because on an H200 it made W4's step
//                    0.36-0.46 ms longer back to back (7 kernels against 9, three rounds;
//                    docs/benchmarks.md, thirty-seventh session).
//   gemm_totals      on a GPU, a rows kernel that sums a pointwise function of every element of a
//                    matrix that a GEMM stores, to one value (a loss: mean(y * y) over y = h @ W2
//                    + b2), is computed by that GEMM: each thread that stores its tiles adds
//                    the function of each element it stores into a register, and the grid's
//                    warps meet once at the kernel's end (wgmma), instead of a rows kernel
//                    reading the matrix again after the GEMM (on by default; KILN_GEMM_TOTALS=0).
//                    The sum is of the matrix's values as computed, before their rounding to its
//                    dtype, as a fused kernel's values are. Decides each call's kernels, not the plan.
//                    NOTE: on H100s W4's step ran 0.69% faster back to back with it and 1.23% as
//                    torch_anchor.py times (medians of 33 rounds alternated), the loss 4.8e-5 from
//                    float64 against 5.1e-5 (docs/benchmarks.md, fifty-sixth and fifty-seventh
//                    sessions); not yet timed on an H200.
//   programmatic_launch on an NVIDIA GPU of sm_90 or later, in a call of fewer than two large
//                    kernels, each generated kernel is launched so that it may start before
//                    the kernel before it on its stream has finished (programmatic dependent
//                    launch): its blocks take the SMs that kernel's last wave leaves, and wait
//                    (griddepcontrol.wait, the kernel's first statement) until that kernel's
//                    memory is visible; so the gap between two kernels is not a launch (on by
//                    default; KILN_PROGRAMMATIC_LAUNCH=0). Decides each call's launches, not its
//                    kernels (every generated kernel waits; without the launch attribute the
//                    wait returns at once). NOTE: on an H200 W7's fused call went from 19.4-20.6
//                    to 18.0-18.2 us; calls of large kernels launch plainly, since W4's step ran
//                    0.5-0.7% longer back to back with it (docs/benchmarks.md, thirty-seventh session).
//   idle_fill        on a GPU, in a call whose kernels overlap (kernel_overlap), its leaf kernels
//                    (memory-bound ones whose outputs no later kernel of the call reads: a loss,
//                    a bias's gradient) run on a third stream that waits only for what they read,
//                    and the call's other kernels launch one step above that stream's priority:
//                    a GEMM's blocks take the SMs first and the leaves run on those its last
//                    round leaves idle, instead of each leaf holding every SM for its own time
//                    between two GEMMs (off by default; KILN_IDLE_FILL=1). Decides each call's
//                    launches, not its kernels. NOTE: on an H100 W4's step ran no faster with
//                    it, three rounds (gpu_bench's KILN_BENCH_FILL_AB=1; docs/benchmarks.md,
//                    thirty-ninth session): the loss's sum still ran before the GEMM beside
//                    it, and dx's GEMM got the SMs after dW1's, delaying dW2's behind it.
//   gemm_dynamic_tiles on a Hopper GPU, a persistent wgmma GEMM's blocks take their tiles from
//                    one counter of the grid instead of each a fixed list, so that a block that
//                    starts late (its SM busy with the kernel beside it) takes fewer (off by
//                    default; KILN_GEMM_DYNAMIC_TILES=1). Decides the GEMMs' configs (and the
//                    tuning database's key). NOTE: on an H200 W4's step ran the same with it
//                    (gpu_bench's KILN_BENCH_DYN_AB=1; docs/benchmarks.md, forty-second session).
//   gemm_serpentine  on a Hopper GPU, a persistent wgmma GEMM walks K backwards on the grid's odd
//                    waves and its odd raster groups' columns from the right, so that each
//                    wave begins on the A or B panels the wave before left in L2 (on by
//                    default; KILN_GEMM_SERPENTINE=0). Decides the GEMMs' configs (and the tuning
//                    database's key). NOTE: on an H100 W4's six GEMMs read 7-19% fewer bytes
//                    from DRAM (ncu) and ran 0.4% faster back to back, the step 0.5%; on
//                    the H200 the step 0.5-0.7% (docs/benchmarks.md, forty-third session).
//   gemm_group_across on a Hopper GPU, a persistent wgmma GEMM's raster groups lie side by side,
//                    8 tiles wide, walked along their rows, so that clusters next to each other in
//                    launch order share A's panel, the operand each block loads itself, and the L2's
//                    request coalescer can merge their reads (off by default; KILN_GEMM_GROUP_ACROSS=1).
//                    Decides the GEMMs' configs (and the tuning database's key). NOTE: off because
//                    it got fewer such merges (3-6 M sectors a W4 GEMM against 7-14 M; cuBLAS's
//                    50-56 M) and W4's step ran no faster (docs/benchmarks.md, forty-eighth session).
#pragma once
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string_view>

namespace kiln {

namespace detail {
// A switch's initial value: the variable's, where it is set and not empty ("0" is off).
inline bool env_switch(const char* name, bool otherwise) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' ? otherwise : std::string_view(v) != "0";
}
inline std::atomic<bool>& allow_tf32_flag() {
  static std::atomic<bool> on{env_switch("KILN_ALLOW_TF32", false)};
  return on;
}
inline std::atomic<bool>& epilogue_fusion_flag() {
  static std::atomic<bool> on{env_switch("KILN_EPILOGUE_FUSION", true)};
  return on;
}
inline std::atomic<bool>& kernel_overlap_flag() {
  static std::atomic<bool> on{env_switch("KILN_KERNEL_OVERLAP", true)};
  return on;
}
inline std::atomic<bool>& gemm_column_sums_flag() {
  static std::atomic<bool> on{env_switch("KILN_GEMM_COLUMN_SUMS", false)};
  return on;
}
inline std::atomic<bool>& gemm_operand_sums_flag() {
  static std::atomic<bool> on{env_switch("KILN_GEMM_OPERAND_SUMS", false)};
  return on;
}
inline std::atomic<bool>& gemm_totals_flag() {
  static std::atomic<bool> on{env_switch("KILN_GEMM_TOTALS", true)};
  return on;
}
inline std::atomic<bool>& programmatic_launch_flag() {
  static std::atomic<bool> on{env_switch("KILN_PROGRAMMATIC_LAUNCH", true)};
  return on;
}
inline std::atomic<bool>& gemm_split_tail_flag() {
  static std::atomic<bool> on{env_switch("KILN_GEMM_SPLIT_TAIL", false)};
  return on;
}
inline std::atomic<bool>& gemm_dynamic_tiles_flag() {
  static std::atomic<bool> on{env_switch("KILN_GEMM_DYNAMIC_TILES", false)};
  return on;
}
inline std::atomic<bool>& gemm_serpentine_flag() {
  static std::atomic<bool> on{env_switch("KILN_GEMM_SERPENTINE", true)};
  return on;
}
inline std::atomic<bool>& gemm_group_across_flag() {
  static std::atomic<bool> on{env_switch("KILN_GEMM_GROUP_ACROSS", false)};
  return on;
}
inline std::atomic<bool>& idle_fill_flag() {
  static std::atomic<bool> on{env_switch("KILN_IDLE_FILL", false)};
  return on;
}
}  // namespace detail

inline bool allow_tf32() { return detail::allow_tf32_flag().load(std::memory_order_relaxed); }
inline void set_allow_tf32(bool on) { detail::allow_tf32_flag().store(on, std::memory_order_relaxed); }

inline bool epilogue_fusion() { return detail::epilogue_fusion_flag().load(std::memory_order_relaxed); }
inline void set_epilogue_fusion(bool on) { detail::epilogue_fusion_flag().store(on, std::memory_order_relaxed); }

inline bool kernel_overlap() { return detail::kernel_overlap_flag().load(std::memory_order_relaxed); }
inline void set_kernel_overlap(bool on) { detail::kernel_overlap_flag().store(on, std::memory_order_relaxed); }

inline bool gemm_column_sums() { return detail::gemm_column_sums_flag().load(std::memory_order_relaxed); }
inline void set_gemm_column_sums(bool on) { detail::gemm_column_sums_flag().store(on, std::memory_order_relaxed); }

inline bool gemm_operand_sums() { return detail::gemm_operand_sums_flag().load(std::memory_order_relaxed); }
inline void set_gemm_operand_sums(bool on) { detail::gemm_operand_sums_flag().store(on, std::memory_order_relaxed); }

inline bool gemm_totals() { return detail::gemm_totals_flag().load(std::memory_order_relaxed); }
inline void set_gemm_totals(bool on) { detail::gemm_totals_flag().store(on, std::memory_order_relaxed); }

inline bool gemm_split_tail() { return detail::gemm_split_tail_flag().load(std::memory_order_relaxed); }
inline void set_gemm_split_tail(bool on) { detail::gemm_split_tail_flag().store(on, std::memory_order_relaxed); }

inline bool gemm_dynamic_tiles() { return detail::gemm_dynamic_tiles_flag().load(std::memory_order_relaxed); }
inline void set_gemm_dynamic_tiles(bool on) { detail::gemm_dynamic_tiles_flag().store(on, std::memory_order_relaxed); }

inline bool gemm_serpentine() { return detail::gemm_serpentine_flag().load(std::memory_order_relaxed); }
inline void set_gemm_serpentine(bool on) { detail::gemm_serpentine_flag().store(on, std::memory_order_relaxed); }

inline bool gemm_group_across() { return detail::gemm_group_across_flag().load(std::memory_order_relaxed); }
inline void set_gemm_group_across(bool on) { detail::gemm_group_across_flag().store(on, std::memory_order_relaxed); }

inline bool programmatic_launch() { return detail::programmatic_launch_flag().load(std::memory_order_relaxed); }
inline void set_programmatic_launch(bool on) { detail::programmatic_launch_flag().store(on, std::memory_order_relaxed); }

inline bool idle_fill() { return detail::idle_fill_flag().load(std::memory_order_relaxed); }
inline void set_idle_fill(bool on) { detail::idle_fill_flag().store(on, std::memory_order_relaxed); }

// The switches that decide a plan, as one word of bits for plans' keys.
inline constexpr uint8_t kPlanEpiloguesApart = 1;  // epilogue_fusion() is off
inline uint8_t plan_options() { return epilogue_fusion() ? 0 : kPlanEpiloguesApart; }

}  // namespace kiln
