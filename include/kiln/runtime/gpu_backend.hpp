// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// What the `cuda` and `hip` backends share: everything above the vendor API.
// Takes a bound plan and a device API policy (below); picks each kernel's
// variant from this call's strides, alignment and sizes and the device's warp
// size; generates the plan's variant as one CUDA or HIP program
// (codegen/gpu.hpp, the policy's dialect); compiles and loads it once per device
// through the policy's runtime (memory, then disk, then NVRTC / hipRTC); launches
// each kernel with its argument block on the device's stream, or beside the kernel before
// it on a second stream (schedule_streams). Also the storage
// hooks over the policy's allocator, and the default-device probe: the first
// CUDA GPU, else the first HIP GPU, else the CPU, whichever backends the program
// includes and in whatever order they register.
//
// The device API policy (CudaDeviceApi in cuda_backend.hpp, HipDeviceApi in
// hip_backend.hpp) is the thin layer, and the only one that names a vendor:
//   GpuDeviceApi<kind, dialect> as its base    DeviceKind::cuda / hip, GpuDialect::cuda / hip
//   static Device& device(int ordinal);        set up on first use, lives for the process
//   static bool present() noexcept;            a usable device 0 exists (never throws)
//   static void copy(void* dst, Device dd, const void* src, Device sd, size_t bytes);
//                                              host<->device and device<->device of this kind
//   static void empty_cache();                 every device's cached blocks back (kiln::empty_cache)
//   Event                                      record(device, stream); device.wait(stream, event)
// where Device has make_current(), ordinal(), properties() (warp_size,
// sm_count), stream(), side_stream(), fill_stream(), raised_priority(), wait(stream, event),
// allocator() (runtime/caching_allocator.hpp) and load_module(source, options, name) -> Module&
// with function(name) -> Function, and Function has launch({x, y, z}, {x, y, z}, shared_bytes,
// args, describe, stream, programmatic, priority). The two runtimes (cuda_runtime.hpp, hip_runtime.hpp)
// mirror each other name for name so that this holds without adapters.
#pragma once
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <unordered_map>
#include <vector>

#include "kiln/codegen/gpu.hpp"
#include "kiln/core/log.hpp"
#include "kiln/core/options.hpp"
#include "kiln/runtime/eval.hpp"
#include "kiln/tune/db.hpp"

namespace kiln::runtime {

struct GpuDim {
  unsigned x = 1, y = 1, z = 1;
  bool operator==(const GpuDim&) const = default;
};

struct GpuLaunch {
  GpuDim grid, block;
  unsigned shared_bytes = 0;  // dynamic shared memory
  bool operator==(const GpuLaunch&) const = default;
};

// A device API without graphs of launches (Mode::reduce_overhead launches kernel by kernel).
struct NoGraph {};

// The tuning database's key of one matmul kernel: shape class, dtype, operand layout (and
// whether the tensor cores and the copy engine can read it; whether TF32 and split tails are
// allowed: each has candidates of its own), whether `library` (the vendor GEMM) is a
// candidate, the fused epilogue, the device's `arch`.
inline tune::Key matmul_tune_key(const ir::Graph& g, const sched::Kernel& k, const codegen::Layout& l, const codegen::GemmProblem& p,
                                 const std::string& library, const std::string& arch) {
  std::string layout = std::string(p.ops.a_k_major ? "ak" : "am") + (p.ops.b_k_major ? "bk" : "bn") +
                       (p.tensor_ok ? "" : "-unaligned") + (p.tma_ok || !p.tensor_ok ? "" : "-notma") + (p.tf32 ? "-tf32" : "") +
                       (p.split_tail ? "-tail" : "") + (p.dynamic_tiles ? "-dyn" : "") + (p.serpentine ? "-serp" : "") + (p.group_across ? "-wide" : "") + (library.empty() ? "" : "+" + library);
  return {"matmul", tune::gemm_shape_class(p.batch, p.m, p.n, p.k), p.dtype, layout, arch, codegen::MatmulEpilogue(g, k, l).identity()};
}

// Whether the tensor cores can read operand o (0: A [M, K], 1: B [K, N]) from slot `slot` of
// a matmul call (bind.hpp's matmul meta), elements of `es` bytes: contiguous along its K
// (k_major) or M (N) dim, 16-byte aligned at every row and batch start and at its base (a dim
// of size 1 has no rows to align).
inline bool tensor_cores_read(const KernelArgs& a, size_t slot, int o, bool k_major, int64_t es) {
  const int nd = int(a.meta[0]);
  const int64_t K = a.meta[1], mn = o ? a.size(nd - 1) : a.size(nd - 2);
  const int k_dim = o ? nd - 2 : nd - 1, mn_dim = o ? nd - 1 : nd - 2;
  const int inner = k_major ? k_dim : mn_dim, outer = k_major ? mn_dim : k_dim;
  const int64_t inner_extent = k_major ? K : mn, outer_extent = k_major ? mn : K;
  bool ok = (inner_extent == 1 || a.stride(slot, inner) == 1) && (outer_extent == 1 || (a.stride(slot, outer) * es) % 16 == 0) &&
            reinterpret_cast<uintptr_t>(a.ptrs[slot]) % 16 == 0;
  for (int d = 0; d + 2 < nd; ++d) ok = ok && (a.stride(slot, d) * es) % 16 == 0;
  return ok;
}

// What the GEMM config choice sees of one matmul call (bind.hpp's matmul meta).
// Tensor cores need each operand as tensor_cores_read says.
inline codegen::GemmProblem gemm_problem(const ir::Graph& g, const sched::Kernel& k, const KernelArgs& a, int arch,
                                         int sm_count) {
  codegen::GemmProblem p;
  int nd = int(a.meta[0]);
  p.k = a.meta[1], p.m = a.size(nd - 2), p.n = a.size(nd - 1);
  for (int d = 0; d + 2 < nd; ++d) p.batch *= a.size(d);
  p.dtype = g.nodes[size_t(k.domain)].dtype;
  p.tf32 = p.dtype == DType::f32 && allow_tf32();
  p.split_tail = gemm_split_tail();
  p.dynamic_tiles = gemm_dynamic_tiles();
  p.serpentine = gemm_serpentine();
  p.group_across = gemm_group_across();
  p.arch = arch, p.sm_count = std::max(sm_count, 1);
  // A [M, K]: K-major when K is contiguous (or M is 1); B [K, N]: K-major when K is contiguous and N is not.
  p.ops.a_k_major = a.stride(0, nd - 1) == 1 || p.k == 1 || (p.m != 1 && a.stride(0, nd - 2) != 1);
  p.ops.b_k_major = a.stride(1, nd - 2) == 1 && p.k != 1 && !(a.stride(1, nd - 1) == 1 && p.n != 1);
  int64_t es = int64_t(info(p.dtype).bytes);
  p.ops.elem_bytes = int(es);
  p.tensor_ok = tensor_cores_read(a, 0, 0, p.ops.a_k_major, es) && tensor_cores_read(a, 1, 1, p.ops.b_k_major, es);
  // The copy engine (wgmma) steps every row and batch stride in 16-byte units, even
  // of a dim of size 1, over at most one batch dim, with 32-bit coordinates.
  auto steps = [&](int slot, int d) { return a.stride(slot, d) > 0 && (a.stride(slot, d) * es) % 16 == 0; };
  auto coord = [](int64_t v) { return v >= 1 && v < (int64_t(1) << 31); };
  p.tma_ok = p.tensor_ok && nd <= 3 && coord(p.m) && coord(p.n) && coord(p.k) && (nd < 3 || coord(a.size(0))) &&
             steps(0, p.ops.a_k_major ? nd - 2 : nd - 1) && steps(1, p.ops.b_k_major ? nd - 1 : nd - 2);
  return p;
}

// Tuning override: the block size of block-per-row kernels (0: kiln's choice). A
// benchmark sweeps it; each size is its own compiled variant.
inline std::atomic<int>& gpu_block_rows_threads() {
  static std::atomic<int> threads{0};
  return threads;
}

// Tuning override: the threads an SM keeps resident for block-per-row kernels, which their
// launch bounds promise (0: kiln's choice, 1280 for kept rows of at most 16 registers a
// thread, else 1024; 1024: at most 64 registers a thread; more threads, fewer registers).
// A benchmark sweeps it; each value is its own compiled variant.
inline std::atomic<int>& gpu_block_rows_resident() {
  static std::atomic<int> threads{0};
  return threads;
}

// Tuning override: block rows' streaming accesses (GpuVariant::stream; 0: kiln's choice,
// the stores of rows read from memory more than once; 1: also rows kept in registers, their
// loads and stores; -1: off). A benchmark sweeps it; each value is its own compiled variant.
inline std::atomic<int>& gpu_rows_streaming() {
  static std::atomic<int> mode{0};
  return mode;
}

// An override's first value from the environment (an A/B between processes); 0 where unset.
inline int env_override(const char* name) {
  const char* e = std::getenv(name);
  return e && *e ? std::atoi(e) : 0;
}

// Tuning override: L2 evict_last on the loads of block rows kept in registers (GpuVariant::keep;
// 0: kiln's choice, on; 1: on; -1: off). Its first value is KILN_LOADS_KEEP's. A benchmark
// sweeps it; each value is its own compiled variant.
inline std::atomic<int>& gpu_loads_keep() {
  static std::atomic<int> mode{env_override("KILN_LOADS_KEEP")};
  return mode;
}

// Tuning override: block rows kept in registers load the slots only their stores read (a
// layer_norm's weight and bias) with the row, before the reductions (GpuVariant::preload; 0:
// kiln's choice, off; 1: on; -1: off). Its first value is KILN_ROWS_PRELOAD's. A benchmark
// sweeps it; each value is its own compiled variant.
inline std::atomic<int>& gpu_rows_preload() {
  static std::atomic<int> mode{env_override("KILN_ROWS_PRELOAD")};
  return mode;
}

// Tuning override: exact block rows (GpuVariant::exact; 0: kiln's choice, wherever the
// row is exactly the threads' chunks; -1: off). A benchmark sweeps it.
inline std::atomic<int>& gpu_rows_exact() {
  static std::atomic<int> mode{0};
  return mode;
}

// Tuning override: at most this many blocks per multiprocessor in pointwise kernels'
// grid-stride loop (0: kiln's choice, no cap: a thread per V-chunk, the loop runs once;
// on an H200 that reached 100.5% of copy on W1 where 16 blocks per SM reached 94.2%).
// Benchmarks sweep it.
inline std::atomic<int>& gpu_pointwise_blocks_per_sm() {
  static std::atomic<int> blocks{0};
  return blocks;
}

// Rows kernels: how many rows, and how many elements each reduces.
inline std::pair<int64_t, int64_t> rows_extent(const KernelArgs& a) {
  int nd = int(a.meta[0]), no = int(a.meta[1]);
  int64_t outer = 1, per_row = 1;
  for (int d = 0; d < no; ++d) outer *= a.size(d);
  for (int d = no; d < nd; ++d) per_row *= a.size(d);
  return {outer, per_row};
}

// Blocks per row of a split-rows kernel: enough blocks for about four per multiprocessor,
// none with less than about four V-chunks per thread. 1: not worth splitting.
inline int64_t gpu_split_count(int64_t outer, int64_t per_row, int threads, int vec, int sm_count) {
  if (outer == 0) return 1;
  int64_t want = (int64_t(4) * sm_count + outer - 1) / outer;
  int64_t most = per_row / (int64_t(threads) * std::max(vec, 1) * 4);
  return std::max<int64_t>(1, std::min(want, most));
}

// A rows kernel that reduces in one pass and stores only per-row values (sum, amax,
// mean): its rows can be split across blocks and the partials combined.
inline bool one_pass_rows(const sched::Kernel& k) {
  bool one = k.kind == sched::KernelKind::rows;
  for (int lvl : k.reduce_level) one &= lvl == 0;
  for (size_t i = 0; i < k.stores.size(); ++i) one &= bool(k.row_level_[i]);
  return one;
}

// A one-pass rows kernel over many rows (8 warps' worth at least) reducing one dim that
// some input walks with a stride, while every input walks the kept innermost dim
// contiguously (or not at all): column sums such as a bias gradient, sum(x, 0).
inline bool column_rows(const sched::Kernel& k, const codegen::Layout& l, const KernelArgs& a, int warp) {
  int nd = int(a.meta[0]), no = int(a.meta[1]);
  if (!one_pass_rows(k) || no < 1 || nd - no != 1 || rows_extent(a).first < 8 * int64_t(warp)) return false;
  bool strided = false;
  for (size_t i = 0; i < l.slots.size(); ++i) {
    if (l.slots[i].role != codegen::SlotRole::load) continue;
    if (a.stride(i, no - 1) > 1) return false;
    strided |= a.stride(i, nd - 1) > 1;
  }
  return strided;
}

// Column rows: columns per thread, V of them read as one 16-byte chunk per row: 16 bytes of
// the narrowest load (0 where nothing is loaded).
inline int cols_vec_width(const ir::Graph& g, const codegen::Layout& l) {
  size_t narrowest = 0;
  for (const codegen::Slot& s : l.slots)
    if (s.role == codegen::SlotRole::load) {
      size_t es = info(g.nodes[size_t(s.node)].dtype).bytes;
      narrowest = narrowest ? std::min(narrowest, es) : es;
    }
  return narrowest ? int(16 / narrowest) : 0;
}

// This call's column width: cols_vec_width where every load walks the kept dim contiguously
// from a 16-byte aligned start and steps every other dim (the reduced one too) in 16-byte
// units, and the kept dim is whole chunks (so that each chunk starts aligned); else 0, a
// column per thread.
inline int cols_vec(const ir::Graph& g, const codegen::Layout& l, const KernelArgs& a) {
  int nd = int(a.meta[0]), no = int(a.meta[1]), V = cols_vec_width(g, l);
  if (V < 2 || a.size(no - 1) % V) return 0;
  for (size_t i = 0; i < l.slots.size(); ++i) {
    if (l.slots[i].role != codegen::SlotRole::load) continue;
    int64_t es = int64_t(info(g.nodes[size_t(l.slots[i].node)].dtype).bytes);
    if (a.stride(i, no - 1) != 1 || reinterpret_cast<uintptr_t>(a.ptrs[i]) % 16) return 0;
    for (int d = 0; d < nd; ++d)
      if (d != no - 1 && a.size(d) > 1 && (a.stride(i, d) * es) % 16) return 0;
  }
  return V;
}

// Column rows' block size: warp-many column lanes by up to 256 / warp row groups, no more
// groups than the rows give eight rows each, and the shared buffer that combines the
// groups (a thread's V accumulators each) within 8 KB.
inline int gpu_cols_threads(const ir::Graph& g, const sched::Kernel& k, int64_t rows, int vec, int warp) {
  int64_t acc = 1;
  for (int id : k.reduces) {
    DType d = g.nodes[size_t(id)].dtype;
    acc = std::max<int64_t>(acc, d == DType::f16 || d == DType::bf16 ? 4 : info(d).bytes);
  }
  int groups = std::max(1, 256 / warp);
  while (groups > 1 && (int64_t(groups) * warp * std::max(vec, 1) * acc > 8192 || int64_t(groups) * 8 > rows)) groups /= 2;
  return groups * warp;
}

// Parts of the rows of a column-rows kernel (gridDim.y): blocks for the 1024 threads per
// multiprocessor that the launch bounds leave room for (with 64 bytes of loads in flight
// per thread, 64 KB per multiprocessor), where the columns alone give fewer; no part with
// less than 16 rows per row group. 1: not split.
inline int64_t gpu_cols_split(int64_t outer, int64_t rows, int vec, int threads, int warp, int sm_count) {
  int64_t per_thread = std::max(vec, 1), blocks = ((outer + per_thread - 1) / per_thread + warp - 1) / warp;
  if (blocks == 0) return 1;
  int64_t want = int64_t(std::max(sm_count, 1)) * std::max(1, 1024 / threads) / blocks;
  int64_t most = rows / (int64_t(threads / warp) * 16);
  return std::clamp<int64_t>(std::min(want, most), 1, 65535);
}

// Whether a matmul's epilogue can finish 4 consecutive output columns per access (the
// wgmma kernel's staged stores): every slot it reads or writes walks the columns
// contiguously (a load may also be broadcast along them: stride 0), and each contiguous
// slot's groups are aligned (its address and its other strides multiples of 4 elements).
// Sets those slots' column classes in `cls`.
inline bool vector_epilogue(const ir::Graph& g, const codegen::Layout& l, const KernelArgs& a, std::vector<codegen::Stride>& cls) {
  constexpr int64_t W = codegen::kGemmGroupWidth;
  int nd = int(a.meta[0]);
  for (int i : l.epilogue_slots) {
    const codegen::Slot& s = l.slots[size_t(i)];
    int64_t col = a.stride(i, nd - 1);
    if (s.role == codegen::SlotRole::rand || (col != 1 && !(col == 0 && s.role == codegen::SlotRole::load))) return false;
    if (col == 0) continue;
    if (reinterpret_cast<uintptr_t>(a.ptrs[size_t(i)]) % uintptr_t(W * int64_t(info(g.nodes[size_t(s.node)].dtype).bytes))) return false;
    for (int d = 0; d + 1 < nd; ++d)
      if (a.stride(i, d) % W) return false;
  }
  for (int i : l.epilogue_slots) cls[size_t(i)] = a.stride(i, nd - 1) == 1 ? codegen::Stride::unit : codegen::Stride::zero;
  return true;
}

// A pointwise kernel over several dims, or a rows kernel reducing several (a bias broadcast
// over rows keeps them apart): V-chunks along the innermost dim, V elements of the
// narrowest contiguous slot in 16 bytes, where every slot walks that dim contiguously or
// not at all, its size is a multiple of V and each contiguous slot's rows start 16-byte
// aligned. 0: it cannot.
inline int pointwise_rows_vec(const ir::Graph& g, const codegen::Layout& l, const KernelArgs& a) {
  int nd = int(a.meta[0]);
  if (nd < 2) return 0;
  size_t min_bytes = 16;
  for (size_t i = 0; i < l.slots.size(); ++i) {
    if (a.strides[i] == codegen::Stride::any) return 0;
    if (l.slots[i].role != codegen::SlotRole::rand && a.strides[i] == codegen::Stride::unit)
      min_bytes = std::min(min_bytes, size_t(info(g.nodes[size_t(l.slots[i].node)].dtype).bytes));
  }
  if (min_bytes == 16) return 0;  // nothing contiguous
  int64_t V = int64_t(16 / min_bytes);
  if (a.size(nd - 1) % V) return 0;
  for (size_t i = 0; i < l.slots.size(); ++i) {
    if (l.slots[i].role == codegen::SlotRole::rand || a.strides[i] != codegen::Stride::unit) continue;
    int64_t es = int64_t(info(g.nodes[size_t(l.slots[i].node)].dtype).bytes);
    if (reinterpret_cast<uintptr_t>(a.ptrs[i]) % 16) return 0;
    for (int d = 0; d + 1 < nd; ++d)
      if ((a.stride(i, d) * es) % 16) return 0;
  }
  return int(V);
}

// The slots (bit i: slot i) contiguous over every dim of a pointwise kernel's domain, each
// dim's stride the product of the sizes inside it (any stride where the size is 1): their
// offset is the flat index. NOTE: on an H200 bf16 x * w + b over [16384, 4096] went from
// 72.5 to 76.7% of copy once x's loads no longer waited for the row's division (torch.compile,
// whose sizes are constants, 92.6%).
inline uint32_t whole_slots(const codegen::Layout& l, const KernelArgs& a) {
  int nd = int(a.meta[0]);
  uint32_t mask = 0;
  for (size_t i = 0; i < l.slots.size() && i < 32; ++i) {
    if (l.slots[i].role == codegen::SlotRole::rand || a.strides[i] != codegen::Stride::unit) continue;
    bool whole = true;
    int64_t want = 1;
    for (int d = nd - 1; d >= 0 && whole; --d) {
      whole = a.size(d) == 1 || a.stride(i, d) == want;
      want *= a.size(d);
    }
    if (whole) mask |= 1u << i;
  }
  return mask;
}

// Which prologue operands a matmul kernel's GEMM computes itself (bit o: operand o): the kinds
// whose loads pass through registers. SIMT reads any source; mfma reads 16-byte chunks, so a
// source must be 16-bit and laid out as the tensor cores read the operand (tensor_cores_read).
// The mma and wgmma kinds' tiles arrive by cp.async or the copy engine, untouched, so they
// read the operands' buffers, stored first by the prologues' own kernels: one pass over the
// operand, as a GEMM on cuBLAS behind a cast kernel would.
inline uint8_t gemm_computed_prologues(const ir::Graph& g, const sched::Kernel& k, const codegen::Layout& l, const KernelArgs& a,
                                       const codegen::GpuVariant& v) {
  uint8_t mask = 0;
  for (int o = 0; o < 2; ++o) {
    const int slot = k.prologue_slot[size_t(o)];
    if (slot < 0) continue;
    const bool k_major = o ? v.gemm_ops.b_k_major : v.gemm_ops.a_k_major;
    const bool ok = v.gemm.kind == codegen::GemmKind::simt ||
                    (v.gemm.kind == codegen::GemmKind::mfma && info(g.nodes[size_t(l.slots[size_t(slot)].node)].dtype).bytes == 2 &&
                     tensor_cores_read(a, size_t(slot), o, k_major, 2));
    if (ok) mask |= uint8_t(1u << o);
  }
  return mask;
}
// Marks the prologue kernels whose GEMM computes the operand itself: not launched.
inline void skip_computed_prologues(const sched::Plan& plan, std::vector<codegen::GpuVariant>& vars) {
  for (size_t k = 0; k < plan.kernels.size(); ++k)
    if (int m = plan.kernels[k].prologue_of; m >= 0) {
      const sched::Kernel& mm = plan.kernels[size_t(m)];
      const int o = mm.loads[1] == prologue_operand(plan.kernels[k]) ? 1 : 0;  // the operand it stores
      vars[k].skip = vars[size_t(m)].prologue >> o & 1u;
    }
}

// A matmul variant's GEMM config and the operand layouts its kernel reads: TF32's wgmma reads
// only K-major operands, so it stages the others (GpuVariant::stage) and reads their copies.
inline void set_gemm(codegen::GpuVariant& v, const codegen::GemmConfig& c, const codegen::GemmProblem& p) {
  v.gemm = c, v.gemm_ops = p.ops, v.stage = 0;
  if (v.colsum_of_b ? !codegen::gemm_sums_b(c, p.ops, p.dtype) : !codegen::gemm_sums_columns(c))
    v.colsum_slot = v.colsum_kernel = -1, v.colsum_of_b = false;
  if (!codegen::gemm_sums_total(c)) v.total_kernel = -1, v.total_words = 0;
  if (c.kind == codegen::GemmKind::wgmma && p.dtype == DType::f32) {
    v.stage = uint8_t((p.ops.a_k_major ? 0 : 1) | (p.ops.b_k_major ? 0 : 2));
    v.gemm_ops.a_k_major = v.gemm_ops.b_k_major = true;
  }
}

// Variant of one kernel for this call, for a device of `warp` lanes per warp
// (wavefront), of architecture `arch` (GemmProblem::arch: the NVIDIA compute
// capability, or codegen::gemm_amd_arch of an AMD target) with `sm_count`
// multiprocessors (compute units).
inline codegen::GpuVariant gpu_variant(const ir::Graph& g, const sched::Kernel& k, const codegen::Layout& l,
                                       const KernelArgs& a, int warp, int arch = 0, int sm_count = 1) {
  codegen::GpuVariant v;
  v.strides = a.strides;
  if (k.kind == sched::KernelKind::matmul) {
    codegen::GemmProblem p = gemm_problem(g, k, a, arch, sm_count);
    p.heavy_epilogue = l.epilogue_heavy;
    set_gemm(v, codegen::gemm_choose(p), p);
    v.epilogue_vec = vector_epilogue(g, l, a, v.strides);
    v.prologue = k.has_prologue() ? gemm_computed_prologues(g, k, l, a, v) : 0;
    return v;
  }
  int nd = int(a.meta[0]), no = int(a.meta[1]);
  int inner_dims = k.kind == sched::KernelKind::rows ? nd - no : nd;
  bool flat = inner_dims <= 1, any_unit = false;
  size_t min_bytes = 16;
  for (size_t i = 0; i < l.slots.size() && flat; ++i) {
    if (a.strides[i] == codegen::Stride::any) flat = false;
    if (l.slots[i].role == codegen::SlotRole::rand || a.strides[i] != codegen::Stride::unit) continue;
    size_t es = info(g.nodes[size_t(l.slots[i].node)].dtype).bytes;
    any_unit = true;
    min_bytes = std::min(min_bytes, es);
    if (reinterpret_cast<uintptr_t>(a.ptrs[i]) % 16) flat = false;
    if (k.kind == sched::KernelKind::rows)  // every row must start aligned too
      for (int d = 0; d < no; ++d)
        if ((a.stride(i, d) * int64_t(es)) % 16) flat = false;
  }
  if (flat && any_unit) v.vec = int(16 / min_bytes);
  // Several dims that do not merge (a bias broadcast over rows keeps them apart): 16-byte
  // chunks within rows of the innermost dim where every slot allows them; pointwise kernels
  // over all dims, rows kernels over the reduced ones (more than one).
  if (!flat && (k.kind == sched::KernelKind::pointwise || (k.kind == sched::KernelKind::rows && inner_dims > 1)))
    v.vec = pointwise_rows_vec(g, l, a), v.vec_rows = v.vec > 0;
  if (v.vec_rows && k.kind == sched::KernelKind::pointwise) v.whole = whole_slots(l, a);
  if (inner_dims > 1) v.rank = nd, v.outer_rank = no;  // several dims per element (pointwise: nd of them)
  // Pointwise: 2048 threads resident, so launch bounds cap a thread at 32 registers. NOTE: on
  // an H200 bf16 x * w + b over [16384, 4096] went from 85.7 to 93.0% of copy when its 34
  // registers (1792 resident) became 29. Not where random numbers are drawn: randn's two Philox
  // streams spill there (ptxas, sm_90); gelu, tanh, erf, pow and trigonometric chains fit.
  auto random = [](const codegen::Slot& s) { return s.role == codegen::SlotRole::rand; };
  if (k.kind == sched::KernelKind::pointwise && std::none_of(l.slots.begin(), l.slots.end(), random)) v.resident = 2048;
  if (k.kind == sched::KernelKind::rows) {
    auto [outer, per_row] = rows_extent(a);
    if (column_rows(k, l, a, warp)) {
      // Reduced along a strided dim, the kept one contiguous: a lane per V columns (16-byte
      // loads where aligned, else a column), so a warp reads consecutive addresses; the row
      // groups of a block combine through shared memory; few columns split their rows
      // across blocks as well.
      v.cols = true, v.vec = cols_vec(g, l, a);
      v.threads = gpu_cols_threads(g, k, per_row, v.vec, warp);
      v.split = gpu_cols_split(outer, per_row, v.vec, v.threads, warp, sm_count) > 1;
      return v;
    }
    int64_t chunks = (per_row + std::max(v.vec, 1) - 1) / std::max(v.vec, 1);
    if (per_row <= int64_t(warp) * 32) {
      // Short rows: lanes for about four V-chunks each, a warp at most (several rows per warp).
      int g_lanes = 1;
      while (g_lanes < warp && int64_t(g_lanes) * 4 < chunks) g_lanes *= 2;
      v.group = g_lanes;
      v.threads = 256;
      return v;
    }
    // Long rows, a block each: about four V-chunks per thread, eight past 256 threads; a row
    // that fits stays in registers. NOTE: rows in flight per SM set the bandwidth: on an H200
    // W2's 8192-float rows with 512 threads of 46 registers left 2 blocks per SM (79.8% of
    // copy); 256 threads holding 8 chunks each left 4 (92.2%).
    int t = 64;
    while (t < 1024 && int64_t(t) * 4 < chunks && !(t >= 256 && int64_t(t) * 8 >= chunks)) t *= 2;
    const int forced_threads = gpu_block_rows_threads().load(std::memory_order_relaxed);
    if (forced_threads > 0) t = forced_threads;
    v.threads = t;
    const int resident_override = gpu_block_rows_resident().load(std::memory_order_relaxed);
    if (resident_override > 0) v.resident = resident_override;
    int64_t p = (chunks + t - 1) / t;
    if (v.vec && !v.vec_rows && per_row % v.vec == 0 && p <= 8) v.persist = int(p);  // registers of one innermost dim
    // A kept row of eight chunks a thread at 256 threads (W2's 8192 floats: 32 registers of row
    // and 32 of exponentials, 63 in all, so 1024 resident) goes over 512 threads of four, 40
    // registers each, 1536 resident: more warps through each row's reductions and
    // exponentials. On an H200 W2 went from 94.0 to 94.9% of copy (its own kernel timed both
    // ways in one run); only where the 512-thread row stays within 32 registers.
    if (v.persist == 8 && t == 256 && forced_threads <= 0 && resident_override == 0) {
      codegen::GpuVariant wide = v;
      wide.threads = 512, wide.persist = 4;
      if (codegen::GpuKernelWriter(g, k, 0, wide).row_registers() <= 32) v.threads = 512, v.persist = 4, v.resident = 1536;
    }
    // Few long rows of a one-pass reduction: several blocks per row.
    if (one_pass_rows(k) && gpu_split_count(outer, per_row, 256, v.vec, sm_count) > 1) {
      v.split = true, v.persist = 0, v.threads = 256, v.resident = 1024;
    }
    // A row of one dim that the threads' chunks cover exactly: no check per chunk, and the
    // block size a constant of the kernel (its offsets fold into the loads' addresses). On an
    // H200 W3 went from 87.4 to 88.2% of copy (W2, W8 within noise).
    v.exact = v.persist && a.meta[0] - a.meta[1] == 1 && per_row == int64_t(v.threads) * v.vec * v.persist &&
              gpu_rows_exact().load(std::memory_order_relaxed) >= 0;
    // Streaming stores where the row is read from memory again (not kept): on an H200 the
    // online softmax over [2048, 65536] went from 67.7 to 69.8% of copy. Not for kept rows:
    // with the L2 flushed before each call (as the benchmarks time) they lost 3 to 6 points
    // there (W2 93.5 -> 87.2%, W3 85.8 -> 83.2%).
    int streaming = gpu_rows_streaming().load(std::memory_order_relaxed);
    v.stream = v.vec && !v.split && (streaming > 0 || (streaming == 0 && !v.persist));
    // A kept row loaded L2 evict_last (GpuVariant::keep). NOTE: on an H200 W2 went from 94.5 to
    // 98.2% of copy, W3 from 88.1 to 91.9%, W8 unchanged (docs/benchmarks.md, thirty-second session).
    v.keep = v.persist && !v.stream && gpu_loads_keep().load(std::memory_order_relaxed) >= 0;
    v.preload = v.persist && gpu_rows_preload().load(std::memory_order_relaxed) > 0;
    // A kept row of at most 16 registers a thread (W3's bf16 row, W8's) leaves room for 1280
    // resident threads (48 registers each) without spilling: on an H200 W3 went from 85.8 to
    // 87.4% of copy (W8 within noise); W2's row (32 registers and its exponentials) spills there.
    // NOTE: an exact row's kernel spilled there (its unchecked loads of weight and bias all go
    // out before the stores: 48 registers are too few), so it keeps 1024.
    if (resident_override == 0 && v.persist && !v.exact && !v.split && codegen::GpuKernelWriter(g, k, 0, v).row_registers() <= 16)
      v.resident = 1280;
  }
  return v;
}

// Grid and block of one kernel for this call and variant.
inline GpuLaunch gpu_launch_shape(const sched::Kernel& k, const KernelArgs& a, const codegen::GpuVariant& v, int sm_count,
                                  int warp) {
  GpuLaunch L;
  if (k.kind == sched::KernelKind::matmul) {
    int nd = int(a.meta[0]);
    int64_t batch = 1;
    for (int d = 0; d + 2 < nd; ++d) batch *= a.size(d);
    int64_t m = a.size(nd - 2), n = a.size(nd - 1);
    const codegen::GemmConfig& c = v.gemm;
    L.block = {unsigned(c.threads()), 1, 1};
    // Clusters (persistent): whole clusters, each on a tile `cluster` tiles tall.
    const int64_t tiles = codegen::gemm_cluster_tiles(c, m, n);
    L.grid = {unsigned(c.persistent ? c.cluster * codegen::gemm_persistent_clusters(c, tiles, sm_count) : tiles),
              unsigned(c.kind == codegen::GemmKind::simt ? c.split_k : 1), unsigned(batch)};
    L.shared_bytes = unsigned(codegen::gemm_shared_bytes(c, v.gemm_ops));
    return L;
  }
  int nd = int(a.meta[0]);
  if (k.kind == sched::KernelKind::rows) {
    auto [outer, per_row] = rows_extent(a);
    L.block = {unsigned(v.threads), 1, 1};
    if (v.group) L.grid = {unsigned((outer + v.threads / v.group - 1) / (v.threads / v.group)), 1, 1};
    else if (v.cols) {
      int64_t per_thread = std::max(v.vec, 1), parts = v.split ? gpu_cols_split(outer, per_row, v.vec, v.threads, warp, sm_count) : 1;
      L.grid = {unsigned(((outer + per_thread - 1) / per_thread + warp - 1) / warp), unsigned(parts), 1};
    }
    else if (v.split) L.grid = {unsigned(outer * gpu_split_count(outer, per_row, v.threads, v.vec, sm_count)), 1, 1};
    else L.grid = {unsigned(outer), 1, 1};
    return L;
  }
  int64_t n = 1;
  for (int d = 0; d < nd; ++d) n *= a.size(d);
  int64_t per_thread = std::max(v.vec, 1);
  int64_t blocks = (n + 256 * per_thread - 1) / (256 * per_thread);
  int per_sm = gpu_pointwise_blocks_per_sm().load(std::memory_order_relaxed);
  int64_t most = per_sm > 0 ? int64_t(sm_count) * per_sm : int64_t(INT32_MAX);
  L.block = {256, 1, 1};
  L.grid = {unsigned(std::max<int64_t>(1, std::min<int64_t>(blocks, most))), 1, 1};
  return L;
}

// The 8-byte words of partials a kernel leaves in the workspace: one per reduction and block
// (split rows), or per reduction, block and column (split column rows); a split-tail GEMM's
// tile of f32 sums per piece it hands over (its walk's slots, per block of a cluster); a
// split-K GEMM's tile of sums per block (a word each: the widest accumulator).
inline size_t gpu_workspace_words(const sched::Kernel& k, const codegen::GpuVariant& v, const KernelArgs& a, const GpuLaunch& L,
                                  int warp, int sm_count) {
  const codegen::GemmConfig& c = v.gemm;
  if (k.kind == sched::KernelKind::matmul && c.kind == codegen::GemmKind::simt)
    return size_t(L.grid.x) * L.grid.y * L.grid.z * size_t(c.bm) * size_t(c.bn);
  if (k.kind == sched::KernelKind::matmul) {
    const int nd = int(a.meta[0]);
    const int64_t slots = codegen::gemm_walk(c, a.size(nd - 2), a.size(nd - 1), a.meta[1], L.grid.z, sm_count).slots() * c.cluster;
    return size_t(std::max<int64_t>(slots, 1)) * size_t(c.bm) * size_t(c.bn) / 2;  // at least a slot: no empty allocation
  }
  size_t per_block = v.cols ? size_t(warp) * size_t(std::max(v.vec, 1)) : 1;
  return size_t(L.grid.x) * L.grid.y * per_block * std::max<size_t>(k.reduces.size(), 1);
}

// The kernel's argument struct, byte for byte: p[slots], m[meta], a[words], for split rows
// and split-tail GEMMs the workspace (partials, counters), and for a GEMM that stages operands
// their buffers (GpuVariant::stage), into `block`.
inline void gpu_arg_block(const codegen::Layout& l, const KernelArgs& a, const codegen::GpuVariant& v, const uint64_t* workspace,
                          const uint64_t* staged, std::vector<uint64_t>& block, const uint64_t* total_workspace = nullptr) {
  size_t ns = std::max<size_t>(l.slots.size(), 1), nm = codegen::GpuKernelWriter::meta_words(l), nw = size_t(std::max(l.words, 1)),
         ncs = v.colsum_slot >= 0 ? codegen::kGpuColumnSumWords : 0, nws = v.workspace() ? codegen::kGpuSplitWords : 0,
         ntt = v.total_kernel >= 0 ? size_t(codegen::kGpuTotalWords + v.total_words) : 0, nst = v.stage ? codegen::kGpuStageWords : 0;
  block.assign(ns + nm + nw + ncs + ntt + nws + nst + (ntt ? codegen::kGpuSplitWords : 0), 0);
  if (ncs) {
    if (!a.column_sums) throw Error("kiln: internal error: a GEMM that computes column sums has nowhere to store them");
    block[ns + nm + nw] = reinterpret_cast<uint64_t>(a.column_sums);
  }
  if (ntt) {  // its destination and the rows kernel's params; its workspace last
    if (!a.total || a.total_words.size() != size_t(v.total_words))
      throw Error("kiln: internal error: a GEMM that computes a total has nowhere to store it");
    block[ns + nm + nw + ncs] = reinterpret_cast<uint64_t>(a.total);
    std::copy(a.total_words.begin(), a.total_words.end(), block.begin() + ptrdiff_t(ns + nm + nw + ncs + codegen::kGpuTotalWords));
    if (total_workspace) std::copy(total_workspace, total_workspace + codegen::kGpuSplitWords, block.end() - codegen::kGpuSplitWords);
  }
  nw += ncs + ntt;  // the workspace's words and the staged operands' follow
  for (size_t i = 0; i < a.ptrs.size(); ++i) block[i] = reinterpret_cast<uint64_t>(a.ptrs[i]);
  if (a.meta.size() > nm) throw Error("kiln: internal error: kernel metadata exceeds its argument block");
  for (size_t i = 0; i < a.meta.size(); ++i) block[ns + i] = uint64_t(a.meta[i]);
  for (size_t i = 0; i < a.words.size(); ++i) block[ns + nm + i] = a.words[i];
  if (v.workspace()) std::copy(workspace, workspace + codegen::kGpuSplitWords, block.begin() + ptrdiff_t(ns + nm + nw));
  if (v.stage) std::copy(staged, staged + codegen::kGpuStageWords, block.begin() + ptrdiff_t(ns + nm + nw + nws));
}

// The staging kernel's launch (GpuVariant::stage): a block of 256 threads per 32 x 32 tile of
// the staged operands.
inline GpuLaunch gpu_stage_launch(const KernelArgs& a, const codegen::GpuVariant& v) {
  int64_t tiles = 0;
  for (int o = 0; o < 2; ++o)
    if (v.stage >> o & 1u) tiles += codegen::GemmStaged::of(a.meta.data(), o).tiles();
  GpuLaunch L;
  L.block = {256, 1, 1};
  L.grid = {unsigned(tiles), 1, 1};
  return L;
}

// The same, made only when an error message needs it (not on every launch).
struct KernelDescription {
  const ir::Graph* g;
  const sched::Kernel* k;
  static std::string text(const void* self) {
    auto* d = static_cast<const KernelDescription*>(self);
    return describe_kernel(*d->g, *d->k);
  }
};

// A wgmma GEMM's two tensor maps (CUtensorMap: 128 bytes, 64-byte aligned), passed by value.
struct TensorMaps {
  struct alignas(64) Map {
    uint64_t words[16];
  } a, b;
};

// A variant in words (the profiler's report).
inline std::string variant_text(const sched::Kernel& k, const codegen::GpuVariant& v) {
  if (k.kind == sched::KernelKind::matmul)
    return v.gemm.str() + (v.epilogue_vec ? " vector epilogue" : "") +
           (v.stage ? std::string(" staging ") + (v.stage == 3 ? "A, B" : v.stage == 1 ? "A" : "B") : "");
  std::string s = v.cols ? "cols" : v.split ? "split" : v.group ? "group " + std::to_string(v.group) : "";
  if (v.persist)
    s += " persist " + std::to_string(v.persist) + (v.exact ? " exact" : "") + (v.keep ? " kept" : "") + (v.preload ? " preloaded" : "");
  if (v.vec) s += " vec " + std::to_string(v.vec) + (v.vec_rows ? " in rows" : "");
  if (v.whole) s += " whole slots " + std::to_string(v.whole);
  if (v.rank) s += " rank " + std::to_string(v.rank) + " (" + std::to_string(v.outer_rank) + " outer)";
  if (v.stream) s += " streaming";
  return s + " threads " + std::to_string(v.threads) + (v.resident != 1024 ? " resident " + std::to_string(v.resident) : "");
}

// One call of a plan on a GPU: each kernel's bound arguments and variant, and
// the key of the variant set (which program of the plan this call needs).
struct GpuCall {
  std::vector<KernelArgs> args;
  std::vector<codegen::GpuVariant> vars;
  Hash128 key;
  // Whether kernel k is launched: it has work, and is no prologue its GEMM computes itself.
  bool launches(size_t k) const { return args[k].work != 0 && !vars[k].skip; }
};

// The key of a variant set: which program of the plan a call needs.
inline Hash128 variant_key(const std::vector<codegen::GpuVariant>& vars) {
  Hasher vh;
  for (const codegen::GpuVariant& v : vars) {
    if (!v.strides.empty()) vh.add(v.strides.data(), v.strides.size());
    const codegen::GemmConfig& gc = v.gemm;
    int32_t w[44] = {v.vec, v.group, v.persist, v.split, v.threads, int(gc.kind), gc.bm, gc.bn, gc.bk, gc.wm, gc.wn, gc.stages,
                     gc.persistent, gc.split_epilogue, v.gemm_ops.a_k_major, v.gemm_ops.b_k_major, v.cols, v.epilogue_vec, v.vec_rows,
                     v.resident, v.stream, v.exact, int32_t(v.whole), v.rank, v.outer_rank, gc.group, gc.split_tail, gc.cluster,
                     v.prologue, v.skip, gc.k_slices, gc.split_k, v.stage, v.colsum_slot, int32_t(v.colsum_dtype), int32_t(v.keep),
                     v.colsum_of_b, gc.tail_parts, v.preload, gc.dynamic, gc.serpentine, gc.group_across, v.total_kernel, v.total_words};
    vh.add(w, sizeof w);
  }
  return vh.digest();
}

// Which rows kernels' sums their GEMM computes (GpuVariant::colsum_slot): a rows kernel that only
// sums a matrix over its rows, sum(e, 0) with e [K, N] (a bias's gradient), in bf16, f16 or f32,
// where a GEMM of one batch (not a vendor GEMM: `by_library`)
//  - reads e as its B operand in place, N-major in 16 bits (the weight's gradient x.t() @ e),
//    and comes in the plan before every kernel that reads the sum (kiln::gemm_operand_sums, off
//    by default): its first tile row sums B's columns from shared memory
//    (GpuVariant::colsum_of_b; wgmma without a split epilogue, not a split tail: gemm_sums_b);
//  - or else stores e, contiguous along its rows with 16-byte aligned rows and N a multiple of 16
//    bytes' elements (kiln::gemm_column_sums, off by default): it sums each tile's columns once
//    it has stored the tile (wgmma, not a split tail).
// The rows kernel is then not launched. One such sum per GEMM. The other kinds, and the CPU,
// launch the rows kernel.
// Whether node id is a pointwise function of node e and of kernel R's scalar params alone.
inline bool pointwise_of(const ir::Graph& g, const sched::Kernel& R, int id, int e) {
  if (id == e) return true;
  const ir::Node& n = g.nodes[size_t(id)];
  if (std::find(R.params.begin(), R.params.end(), id) != R.params.end()) return n.op != Prim::rand && n.op != Prim::iota;
  if (!(is_pointwise(n.op) || n.op == Prim::cast) || n.nargs == 0) return false;
  for (int a = 0; a < n.nargs; ++a)
    if (!pointwise_of(g, R, g.arg(n, a), e)) return false;
  return true;
}
// Which rows kernels' totals their GEMM computes (GpuVariant::total_kernel; kiln::gemm_totals, off
// by default): a rows kernel whose one reduction sums f(e) over every element of a matrix e, f
// pointwise over e and the kernel's scalar params (a loss: mean(y * y), its scale a param), in
// f32, and stores one value computed from that sum and its params, where a wgmma GEMM of fixed
// tiles (gemm_sums_total; not a vendor GEMM: `by_library`) stores e whole. That rows kernel is
// then not launched.
inline void assign_totals(const ir::Graph& g, const CompiledPlan& cp, GpuCall& c, const std::vector<uint8_t>* by_library) {
  const auto& kernels = cp.plan.kernels;
  for (size_t r = 0; r < kernels.size(); ++r) {
    const sched::Kernel& R = kernels[r];
    if (R.kind != sched::KernelKind::rows || R.reduces.size() != 1 || R.loads.size() != 1 || R.stores.size() != 1 || c.args[r].work == 0)
      continue;
    const int e = R.loads[0];
    const ir::Node& red = g.nodes[size_t(R.reduces[0])];
    const int f = g.arg(red, 0);
    const ir::Node& fn = g.nodes[size_t(f)];
    if (red.op != Prim::sum || red.dtype != DType::f32 || red.axes != (1u << fn.rank) - 1 || fn.numel() != g.nodes[size_t(e)].numel() ||
        g.nodes[size_t(R.stores[0].buffer)].numel() != 1 || R.stores[0].into != sched::StoreInto::whole || !pointwise_of(g, R, f, e) ||
        !pointwise_of(g, R, R.stores[0].value, R.reduces[0]))
      continue;
    for (size_t k = 0; k < kernels.size(); ++k) {
      const sched::Kernel& K = kernels[k];
      codegen::GpuVariant& v = c.vars[k];
      if (K.kind != sched::KernelKind::matmul || c.args[k].work == 0 || v.total_kernel >= 0 || (by_library && (*by_library)[k]) ||
          !codegen::gemm_sums_total(v.gemm) || g.nodes[size_t(K.domain)].numel() != g.nodes[size_t(e)].numel())
        continue;
      const bool stores_e = std::any_of(K.stores.begin(), K.stores.end(), [&](const sched::Store& s) {
        return s.buffer == e && s.value == e && s.into == sched::StoreInto::whole;
      });
      if (!stores_e) continue;
      v.total_kernel = int(r), v.total_words = cp.layouts[r].words;
      c.vars[r].skip = true;
      break;
    }
  }
}

inline void assign_column_sums(const ir::Graph& g, const CompiledPlan& cp, GpuCall& c, const std::vector<uint8_t>* by_library = nullptr) {
  const auto& kernels = cp.plan.kernels;
  for (size_t k = 0; k < kernels.size(); ++k) {
    codegen::GpuVariant& v = c.vars[k];
    if (kernels[k].kind == sched::KernelKind::matmul) v.colsum_slot = v.colsum_kernel = v.total_kernel = -1, v.colsum_of_b = false, v.total_words = 0;
    if (kernels[k].kind == sched::KernelKind::rows) v.skip = false;
  }
  if (gemm_totals()) assign_totals(g, cp, c, by_library);
  if (!gemm_column_sums() && !gemm_operand_sums()) return;
  for (size_t r = 0; r < kernels.size(); ++r) {
    const sched::Kernel& R = kernels[r];
    if (R.kind != sched::KernelKind::rows || R.reduces.size() != 1 || R.loads.size() != 1 || R.stores.size() != 1 || !R.params.empty() ||
        c.args[r].work == 0)
      continue;
    const int e = R.loads[0], sum = R.reduces[0];
    const ir::Node& red = g.nodes[size_t(sum)];
    const DType d = g.nodes[size_t(e)].dtype;
    if (red.op != Prim::sum || g.arg(red, 0) != e || red.rank != 2 || red.axes != 1u || g.nodes[size_t(e)].rank != 2 ||
        R.stores[0].value != sum || R.stores[0].buffer != sum || R.stores[0].into != sched::StoreInto::whole ||
        !(d == DType::bf16 || d == DType::f16 || d == DType::f32))
      continue;
    auto eligible = [&](size_t k) {
      const KernelArgs& a = c.args[k];
      return kernels[k].kind == sched::KernelKind::matmul && a.work != 0 && a.meta[0] == 2 && c.vars[k].colsum_slot < 0 &&
             !(by_library && (*by_library)[k]);
    };
    auto assign = [&](size_t k, int slot, bool of_b) {
      codegen::GpuVariant& v = c.vars[k];
      v.colsum_slot = slot, v.colsum_of_b = of_b, v.colsum_dtype = red.dtype, v.colsum_kernel = int(r);
      c.vars[r].skip = true;
    };
    bool done = false;
    // B read in place (slot 1 is B: GemmWriter's argument block), the GEMM launched before
    // every kernel that reads the sum (launches follow the plan's order; streams: schedule_streams).
    auto before_readers = [&](size_t k) {
      for (size_t j = 0; j <= k; ++j)
        if (std::find(kernels[j].deps.begin(), kernels[j].deps.end(), int(r)) != kernels[j].deps.end()) return false;
      return true;
    };
    for (size_t k = 0; gemm_operand_sums() && k < kernels.size() && !done; ++k) {
      const codegen::GpuVariant& v = c.vars[k];
      const auto& slots = cp.layouts[k].slots;
      if (eligible(k) && slots.size() > 1 && slots[1].node == e && slots[1].role == codegen::SlotRole::load && !(v.prologue & 2u) &&
          !v.stage && codegen::gemm_sums_b(v.gemm, v.gemm_ops, d) && before_readers(k))
        assign(k, 1, true), done = true;
    }
    for (size_t k = 0; gemm_column_sums() && k < kernels.size() && !done; ++k) {
      const sched::Kernel& K = kernels[k];
      const KernelArgs& a = c.args[k];
      if (!eligible(k) || !codegen::gemm_sums_columns(c.vars[k].gemm)) continue;
      const auto& slots = cp.layouts[k].slots;
      int slot = -1;
      for (size_t i = 0; i < slots.size(); ++i)
        if (slots[i].role == codegen::SlotRole::store && slots[i].node == e && K.stores[size_t(slots[i].store)].into == sched::StoreInto::whole)
          slot = int(i);
      if (slot < 0) continue;
      const int64_t per16 = 16 / int64_t(info(d).bytes), n = a.size(1);
      if (a.stride(size_t(slot), 1) != 1 || a.stride(size_t(slot), 0) % per16 != 0 || n % per16 != 0 ||
          reinterpret_cast<uintptr_t>(a.ptrs[size_t(slot)]) % 16 != 0)
        break;
      assign(k, slot, false), done = true;
    }
  }
}
// Points each GEMM that computes a rows kernel's sums or total at that kernel's output (a total's
// GEMM takes its params too), for this call.
inline void link_column_sums(const CompiledPlan& cp, GpuCall& c) {
  auto output = [&](int r) -> void* {
    const auto& slots = cp.layouts[size_t(r)].slots;
    for (size_t i = 0; i < slots.size(); ++i)
      if (slots[i].role == codegen::SlotRole::store) return c.args[size_t(r)].ptrs[i];
    return nullptr;
  };
  for (size_t k = 0; k < c.vars.size(); ++k) {
    KernelArgs& a = c.args[k];
    a.column_sums = a.total = nullptr, a.total_words.clear();
    if (const int r = c.vars[k].colsum_kernel; r >= 0) a.column_sums = output(r);
    if (const int r = c.vars[k].total_kernel; r >= 0) a.total = output(r), a.total_words = c.args[size_t(r)].words;
  }
}

// Each kernel's variant for the call's bound arguments `c.args`, and their key.
inline void choose_variants(const ir::Graph& g, const CompiledPlan& cp, GpuCall& c, int warp, int arch, int sm_count) {
  const auto& kernels = cp.plan.kernels;
  c.vars.resize(kernels.size());
  for (size_t k = 0; k < kernels.size(); ++k) c.vars[k] = gpu_variant(g, kernels[k], cp.layouts[k], c.args[k], warp, arch, sm_count);
  skip_computed_prologues(cp.plan, c.vars);
  assign_column_sums(g, cp, c);
  link_column_sums(cp, c);
  c.key = variant_key(c.vars);
}

inline GpuCall gpu_call(const ir::Graph& g, const CompiledPlan& cp, const Bound& b, int warp, int arch = 0, int sm_count = 1) {
  const auto& kernels = cp.plan.kernels;
  GpuCall c;
  c.args.resize(kernels.size());
  for (size_t k = 0; k < kernels.size(); ++k) bind_kernel(g, kernels[k], cp.layouts[k], b, c.args[k]);
  choose_variants(g, cp, c, warp, arch, sm_count);
  return c;
}

// Which stream each kernel of a call runs on (kiln::kernel_overlap). A large kernel that
// reads nothing the kernel launched before it writes goes to the other of two streams, so that
// it starts on the SMs that kernel's last wave leaves idle instead of after it (a persistent
// GEMM of 4096 tiles on 132 SMs keeps 4 of them busy for its last tile). Kernels that share the
// device's staging buffer or the main stream's workspace (split rows), and vendor GEMMs (their
// own workspace, the device's stream), stay on the main stream, in plan order. A kernel waits
// for the latest kernel of each other stream it reads (an event; in a graph, an edge); the other streams wait for the main
// one at the call's start and the main one for them at the end (fork, join), so what follows
// the call (the allocator's reuse of its buffers among it) sees it whole. A call with fewer
// than two large kernels keeps one stream: an event costs about a microsecond of host time,
// nothing beside kernels of kOverlapGemmWork or kOverlapWork.
// kiln::idle_fill: the leaves (memory-bound kernels no later kernel of the call reads: a loss,
// a bias's gradient) go to a third stream, with a workspace of their own, and the call's other
// kernels launch at a priority above it; so the large kernel that follows a leaf's inputs gets
// the SMs first and the leaf takes those its last round leaves idle. Each leaf is launched
// right after the latest kernel it reads (`order`), so that on the fill stream no leaf ready
// early waits behind one ready late.
// NOTE: on an H200 W4's step (three kernels beside others) took 1.2% less time as
// torch_anchor.py times it, 0.7% flushed, 0.4% as a graph back to back, and the same in 100-step
// loops, where the power limit holds the clock (docs/benchmarks.md, twenty-ninth session).
struct StreamSchedule {
  static constexpr int64_t kOverlapGemmWork = int64_t(1) << 33;  // multiply-adds (~25 us on an H200)
  static constexpr int64_t kOverlapWork = int64_t(1) << 23;      // elements of a memory-bound kernel
  static constexpr uint8_t kMain = 0, kSide = 1, kFill = 2;      // the streams
  std::vector<uint8_t> runs_on;             // per kernel: its stream (empty: one stream)
  std::vector<std::array<int, 2>> wait;     // per kernel: first waits for the events after these kernels (-1: none)
  std::vector<uint8_t> record;              // per kernel: an event is recorded after it
  bool fill = false;                        // some kernels on kFill: the others at the raised priority
  std::vector<size_t> order;                // the kernels in launch order (empty: plan order)
  // Fewer than two large kernels: each kernel may start before the one before it ends
  // (kiln::programmatic_launch). NOTE: on an H200 that took W7's fused call from 19.4-20.6 to
  // 18.0-18.2 us and its graph from 15.5 to 14.7 us, but W4's step (overlapped, large kernels)
  // 0.5-0.7% longer back to back, three rounds of three: docs/benchmarks.md, thirty-seventh session.
  bool early = false;
  bool used() const { return !runs_on.empty(); }
  // The i-th kernel to launch.
  size_t at(size_t i) const { return order.empty() ? i : order[i]; }
  // Whether kernel k launches above the fill stream's priority.
  bool raised(size_t k) const { return fill && runs_on[k] != kFill; }
  // Kernel k's stream.
  uint8_t stream_of(size_t k) const { return used() ? runs_on[k] : kMain; }
};

inline StreamSchedule schedule_streams(const sched::Plan& p, const GpuCall& call, const std::vector<uint8_t>& by_library) {
  StreamSchedule s;
  const auto& kernels = p.kernels;
  const size_t n = kernels.size();
  auto large = [&](size_t k) {
    return call.args[k].work >= (kernels[k].kind == sched::KernelKind::matmul ? s.kOverlapGemmWork : s.kOverlapWork);
  };
  int count = 0;
  for (size_t k = 0; k < n && count < 2; ++k) count += call.launches(k) && large(k);
  s.early = count < 2 && programmatic_launch() && !profiling();
  if (count < 2 || !kernel_overlap() || profiling()) return s;
  // Each kernel's dependencies among the launched kernels (through any that are not launched:
  // an empty kernel, a prologue its GEMM computes, a rows kernel whose sums a GEMM computes,
  // which then stands for it: a GEMM that sums its B operand need not be one that the rows
  // kernel depended on).
  std::vector<std::vector<int>> reads(n);
  std::vector<int> summed_by(n, -1);
  for (size_t k = 0; k < n; ++k) {
    if (call.vars[k].colsum_kernel >= 0) summed_by[size_t(call.vars[k].colsum_kernel)] = int(k);
    if (call.vars[k].total_kernel >= 0) summed_by[size_t(call.vars[k].total_kernel)] = int(k);
  }
  std::vector<uint8_t> read_later(n, 0);
  for (size_t k = 0; k < n; ++k) {
    for (int d : kernels[k].deps) {
      if (call.launches(size_t(d))) reads[k].push_back(d);
      else reads[k].insert(reads[k].end(), reads[size_t(d)].begin(), reads[size_t(d)].end());
      if (summed_by[size_t(d)] >= 0 && call.launches(size_t(summed_by[size_t(d)]))) reads[k].push_back(summed_by[size_t(d)]);
    }
    if (call.launches(k))
      for (int d : reads[k]) read_later[size_t(d)] = 1;
  }
  s.runs_on.assign(n, s.kMain), s.wait.assign(n, {-1, -1}), s.record.assign(n, 0);
  int prev = -1;
  bool any = false;
  for (size_t k = 0; k < n; ++k) {
    if (!call.launches(k)) continue;
    const codegen::GpuVariant& v = call.vars[k];
    const bool pinned = v.stage || by_library[k];  // the device's staging buffer, the vendor's stream
    // NOTE: column sums have a workspace of their own kernel's; the fill stream's leaves, the
    // side stream's split-tail GEMMs one their stream shares (GpuBackend::column_sum_workspace,
    // split_workspace). Split rows stay on the main stream, as before each stream had its own.
    const bool leaf = idle_fill() && !pinned && kernels[k].kind != sched::KernelKind::matmul && !read_later[k];
    const bool split_tail = v.gemm.persistent && v.gemm.split_tail && kernels[k].kind == sched::KernelKind::matmul;
    const bool main_only = pinned || (v.workspace() && v.colsum_slot < 0 && !leaf && !split_tail);
    uint8_t on = s.kMain;
    if (leaf) {
      on = s.kFill, s.fill = true;  // prev stays: a leaf is no kernel the next one can follow
    } else {
      bool after_prev = prev >= 0 && std::find(reads[k].begin(), reads[k].end(), prev) != reads[k].end();
      on = prev < 0 || main_only ? s.kMain : s.runs_on[size_t(prev)];
      if (!main_only && prev >= 0 && large(k) && !after_prev) on = uint8_t(1 - s.runs_on[size_t(prev)]);
      prev = int(k);
    }
    s.runs_on[k] = on, any |= on != s.kMain;
  }
  if (!any) return StreamSchedule{};
  if (s.fill) {
    std::vector<std::vector<size_t>> leaves_after(n + 1);  // [n]: leaves that read no launched kernel
    for (size_t k = 0; k < n; ++k)
      if (call.launches(k) && s.runs_on[k] == s.kFill)
        leaves_after[reads[k].empty() ? n : size_t(*std::max_element(reads[k].begin(), reads[k].end()))].push_back(k);
    s.order = leaves_after[n];
    for (size_t k = 0; k < n; ++k)
      if (!call.launches(k) || s.runs_on[k] != s.kFill) {
        s.order.push_back(k);
        s.order.insert(s.order.end(), leaves_after[k].begin(), leaves_after[k].end());
      }
  }
  // Each kernel waits for the latest kernel it reads on each other stream (no kernel reads a
  // leaf), unless a kernel launched before it on its stream already did. NOTE: in launch order,
  // not the plan's: a leaf launched early (W4's db2, right after dy's GEMM) must not count on
  // the wait of one that follows it on the fill stream (db1's, for a later GEMM).
  int waited[3][2] = {{-1, -1}, {-1, -1}, {-1, -1}};  // per stream, the latest kernel of kMain / kSide waited for
  for (size_t i = 0; i < n; ++i) {
    const size_t k = s.at(i);
    if (!call.launches(k)) continue;
    const uint8_t on = s.runs_on[k];
    for (uint8_t from : {s.kMain, s.kSide}) {
      if (from == on) continue;
      int need = -1;
      for (int d : reads[k])
        if (s.runs_on[size_t(d)] == from) need = std::max(need, d);
      if (need > waited[on][from]) s.wait[k][from] = need, s.record[size_t(need)] = 1, waited[on][from] = need;
    }
  }
  return s;
}

// Everything of a call that gpu_variant reads besides the plan and the device: each
// kernel's meta (sizes, strides), stride classes and pointer alignments, and the
// rows overrides. Two calls with equal inputs get the same variants.
inline void variant_inputs(const std::vector<KernelArgs>& args, std::vector<int64_t>& out) {
  out.clear();
  for (const KernelArgs& a : args) {
    out.push_back(int64_t(a.meta.size()));
    out.insert(out.end(), a.meta.begin(), a.meta.end());
    for (codegen::Stride s : a.strides) out.push_back(int64_t(s));
    for (void* p : a.ptrs) out.push_back(int64_t(reinterpret_cast<uintptr_t>(p) % 32));  // 32: an f64 epilogue group (vector_epilogue)
  }
  out.push_back(gpu_block_rows_threads().load(std::memory_order_relaxed));
  out.push_back(gpu_block_rows_resident().load(std::memory_order_relaxed));
  out.push_back(gpu_rows_streaming().load(std::memory_order_relaxed));
  out.push_back(gpu_rows_exact().load(std::memory_order_relaxed));
  out.push_back(gpu_loads_keep().load(std::memory_order_relaxed));
  out.push_back(gpu_rows_preload().load(std::memory_order_relaxed));
  out.push_back(allow_tf32());
  out.push_back(gemm_column_sums());
  out.push_back(gemm_totals());
  out.push_back(gemm_operand_sums());
  out.push_back(gemm_split_tail());
  out.push_back(gemm_dynamic_tiles());
  out.push_back(gemm_serpentine());
  out.push_back(gemm_group_across());
}

// What a device API policy derives from: the device kind it serves and the
// dialect its compiler takes.
template <DeviceKind K, codegen::GpuDialect D>
struct GpuDeviceApi {
  static constexpr DeviceKind kind = K;
  static constexpr codegen::GpuDialect dialect = D;
  // The copy engine's tensor maps of a wgmma GEMM's operands (the kernel's two extra
  // parameters); only a CUDA device has them.
  static void tensor_maps(const KernelArgs&, const codegen::GpuVariant&, const uint64_t*, TensorMaps&) {
    throw Error("kiln: internal error: a wgmma GEMM on a device without the copy engine");
  }
  // Evicts the device's cache (queued on its stream) before a timed run; none where it cannot.
  template <class Dev>
  static void flush_cache(Dev&) {}
  // Compiles programs (source, options) into the disk cache ahead of their load, side by
  // side where the API can; a failure is left for the load to report.
  template <class Dev>
  static void compile_ahead(const std::vector<std::pair<std::string, std::vector<std::string>>>&, Dev&) {}
  // Mode::reduce_overhead's graph of a call's launches (cu::CudaGraph), and whether this
  // process's driver has graphs; NoGraph: none.
  using Graph = NoGraph;
  static bool graphs() { return false; }
};

// The backend of one GPU API: runs a bound plan on a device of Api::kind.
template <class Api>
class GpuBackend final : public Backend {
 public:
  using Device = std::remove_reference_t<decltype(Api::device(0))>;
  using Function = decltype(std::declval<Device&>()
                                .load_module(std::string(), std::vector<std::string>(), std::string())
                                .function(std::string_view()));

  void run(const ir::Graph& g, CompiledPlan& cp, Bound& b) override {
    Device& dev = Api::device(g.device.index);
    dev.make_current();
    const auto& props = dev.properties();
    const auto& kernels = cp.plan.kernels;
    LastCall& last = last_call(cp, dev.ordinal());
    GpuCall& call = last.call;
    call.args.resize(kernels.size());
    for (size_t k = 0; k < kernels.size(); ++k) bind_kernel(g, kernels[k], cp.layouts[k], b, call.args[k]);
    // A call with the inputs of this thread's last call of the plan on this device has its
    // variants and program: no variant choice, hashing or lock. In max-autotune, also the
    // tuning database as it was (its generation: a store or clear makes the next call look
    // again). Not where a GEMM chooser hook decides, which the inputs do not show.
    // NOTE: max-autotune's lookups (each GEMM's candidates and key) took 163 us of host time a
    // call of W4's step (the fake device, 2-core machine), 2.2 us reused: time the GPU waits
    // for after each cache flush of a flushed timing.
    variant_inputs(call.args, last.inputs_now);
    if (cp.mode == Mode::max_autotune) last.inputs_now.push_back(int64_t(tune::db().generation()));
    bool reusable = !codegen::gemm_chooser();
    if (!(reusable && last.reusable && last.inputs_now == last.inputs)) {
      last.reusable = false;
      int arch = 0;
      if constexpr (Api::dialect == codegen::GpuDialect::cuda) arch = props.cc_major * 10 + props.cc_minor;
      else arch = codegen::gemm_amd_arch(Api::arch_name(dev));
      choose_variants(g, cp, call, props.warp_size, arch, props.sm_count);
      last.by_library.assign(kernels.size(), 0);
      if (cp.mode == Mode::max_autotune) tune_matmuls(g, cp, call, last.by_library, dev, arch);
      last.fns = &functions(g, cp, call.key, call.vars, dev);
      last.inputs.swap(last.inputs_now);
      last.reusable = reusable;
    }
    // A prologue's operand gets its buffer only where the prologue's own kernel runs
    // (bind_buffers left it out): then that kernel and its GEMM are bound to it.
    for (size_t k = 0; k < kernels.size(); ++k)
      if (int id = prologue_operand(kernels[k]); id >= 0 && !call.vars[k].skip && !b.storage[size_t(id)]) {
        allocate_buffer(g, id, b);
        const size_t m = size_t(kernels[k].prologue_of);
        bind_kernel(g, kernels[k], cp.layouts[k], b, call.args[k]);
        bind_kernel(g, kernels[m], cp.layouts[m], b, call.args[m]);
      }
    link_column_sums(cp, call);
    if constexpr (!std::is_same_v<typename Api::Graph, NoGraph>)
      if (graphs_in(cp.mode) && !profiling() && Api::graphs() && std::none_of(last.by_library.begin(), last.by_library.end(), [](uint8_t l) { return l; }))
        return launch_graph(cp, call, *last.fns, last, dev);
    launch_kernels(g, cp, call, *last.fns, last.by_library, last.block, dev, last.events);
  }

  // The program of a plan variant for a device of `warp` lanes per warp: what
  // run() compiles (the kernels are kiln_k0, kiln_k1, ...).
  static std::string source(const ir::Graph& g, const sched::Plan& p, const std::vector<codegen::GpuVariant>& vars,
                            int warp) {
    return codegen::gpu_source(Api::dialect, warp, g, p, vars);
  }

 private:
  // A plan variant's loaded kernels: each plan kernel's, and the staging kernel of a GEMM that
  // stages operands (GpuVariant::stage).
  struct Loaded {
    std::vector<Function> main;
    std::vector<std::optional<Function>> stage;
  };

  // Launches the plan's kernels in order: each GEMM kernel the tuner gave to the vendor
  // library through it, the others as `fns` (the call's variants; a GEMM that stages operands
  // runs its staging kernel first), on the device's stream, and where the call's kernels
  // overlap (schedule_streams) some on its side and fill streams, with `events` (grown as
  // needed) between.
  using Events = std::vector<typename Api::Event>;
  void launch_kernels(const ir::Graph& g, const CompiledPlan& cp, const GpuCall& call, const Loaded& fns,
                      const std::vector<uint8_t>& by_library, std::vector<uint64_t>& block, Device& dev, Events& events) {
    const auto& kernels = cp.plan.kernels;
    const size_t n = kernels.size();
    const bool profile = profiling();
    const StreamSchedule streams = schedule_streams(cp.plan, call, by_library);
    const bool programmatic = streams.early;  // each kernel may start before the one before it ends
    const int raised = streams.fill ? dev.raised_priority() : 0;
    auto stream_of = [&](uint8_t s) { return s == streams.kMain ? dev.stream() : s == streams.kSide ? dev.side_stream() : dev.fill_stream(); };
    // kiln::timeline_on: per launch, two timers from the call's start, one stopped where its
    // stream reaches the kernel and one after it.
    struct Timed {
      size_t k;
      int stream;
      std::unique_ptr<typename Api::Timer> ready, end;
      bool vendor = false;  // the vendor library ran it
    };
    // A kernel as the profiler and the timeline name it.
    auto label = [&](size_t k, bool vendor) {
      return profile_label(g, cp, k, kernels[k]) + (vendor ? " vendor GEMM" : " " + variant_text(kernels[k], call.vars[k]));
    };
    std::vector<Timed> timed;
    size_t next_timed = 0;
    const bool timeline = timeline_on() && !profile;
    if (timeline)
      for (size_t i = 0; i < n; ++i)
        if (const size_t k = streams.at(i); call.launches(k)) {
          Timed& t = timed.emplace_back(Timed{k, streams.used() ? int(streams.runs_on[k]) : 0, std::make_unique<typename Api::Timer>(dev.ordinal()),
                                              std::make_unique<typename Api::Timer>(dev.ordinal())});
          t.ready->start(dev.stream()), t.end->start(dev.stream());  // the call's start: before its first kernel
        }
    bool forked = false;
    auto join = [&] {  // events n + 1, n + 2: the side and fill streams' ends
      if (!forked) return;
      forked = false;
      for (uint8_t s : {streams.kSide, streams.kFill})
        if (s != streams.kFill || streams.fill) events[n + s].record(dev, stream_of(s)), dev.wait(dev.stream(), events[n + s]);
    };
    try {
      if (streams.used()) {  // the fork: the other streams after all the main one has queued
        if (events.size() < n + 3) events.resize(n + 3);  // one a kernel, the fork, the joins
        events[n].record(dev, dev.stream()), forked = true;
        dev.wait(dev.side_stream(), events[n]);
        if (streams.fill) dev.wait(dev.fill_stream(), events[n]);
      }
      for (size_t i = 0; i < n; ++i) {
        const size_t k = streams.at(i);
        if (!call.launches(k)) continue;
        auto stream = dev.stream();
        int priority = 0;
        if (streams.used()) {
          stream = stream_of(streams.runs_on[k]), priority = streams.raised(k) ? raised : 0;
          auto& counters = kiln::detail::counters_state();
          if (streams.runs_on[k] == streams.kSide) counters.kernels_overlapped.fetch_add(1, std::memory_order_relaxed);
          if (streams.runs_on[k] == streams.kFill) counters.kernels_filling.fetch_add(1, std::memory_order_relaxed);
          for (int w : streams.wait[k])
            if (w >= 0) dev.wait(stream, events[size_t(w)]);
        }
        std::optional<typename Api::Timer> timer;  // KILN_PROFILE (one stream): the launch between two events
        if (profile) timer.emplace(dev.ordinal()), timer->start(stream);
        Timed* t = timeline ? &timed[next_timed++] : nullptr;
        if (t) t->ready->stop(stream);
        if (by_library[k] && Api::library_gemm(g, kernels[k], cp.layouts[k], call.args[k], dev)) {
          kiln::detail::counters_state().kernels_launched.fetch_add(1, std::memory_order_relaxed);
          if (timer) timer->stop(stream), detail::profile_record(label(k, true), timer->elapsed_ms());
          if (t) t->end->stop(stream), t->vendor = true;
          continue;
        }
        const codegen::GpuVariant& v = call.vars[k];
        TensorMaps maps;
        GpuLaunch staging;
        GpuLaunch L = prepare_launch(dev, kernels[k], cp.layouts[k], call.args[k], v, block, maps, staging, streams.stream_of(k));
        KernelDescription describe{&g, &kernels[k]};
        if (v.stage) launch_one(*fns.stage[k], staging, block, maps, describe, stream, programmatic, priority);
        launch_one(fns.main[k], L, block, maps, describe, stream, programmatic, priority);
        if (streams.used() && streams.record[k]) events[k].record(dev, stream);
        if (timer) timer->stop(stream), detail::profile_record(label(k, false), timer->elapsed_ms());
        if (t) t->end->stop(stream);
      }
    } catch (...) {
      // What the other streams have queued still comes before anything the caller queues next
      // (the allocator's reuse of this call's buffers).
      try {
        join();
      } catch (...) {
      }
      throw;
    }
    join();
    if (timeline) {
      std::vector<TimelineEntry> entries;
      for (const Timed& t : timed)
        entries.push_back({label(t.k, t.vendor), t.stream, t.ready->elapsed_ms(), t.end->elapsed_ms()});
      auto& state = kiln::detail::timeline_state();
      std::lock_guard lock(state.mu);
      state.last = std::move(entries);
    }
  }
  template <class Stream>
  static void launch_one(const Function& f, const GpuLaunch& L, std::vector<uint64_t>& block, TensorMaps& maps,
                         KernelDescription& describe, Stream stream, bool programmatic, int priority) {
    void* params[] = {block.data(), &maps.a, &maps.b};
    f.launch({L.grid.x, L.grid.y, L.grid.z}, {L.block.x, L.block.y, L.block.z}, L.shared_bytes, params,
             LazyText{&KernelDescription::text, &describe}, stream, programmatic, priority);
  }

  struct LastCall;
  struct GraphState;
  // The modes whose calls replay a graph of their launches: reduce-overhead, and max-autotune
  // (as torch.compile's does) but where it gave a GEMM to the vendor library, which is no
  // kernel of kiln's to make a node of.
  static bool graphs_in(Mode m) { return m == Mode::reduce_overhead || m == Mode::max_autotune; }
  // Mode::reduce_overhead: the call's launches as one graph (Api::Graph). A call whose
  // launches are the graph's (the same kernels, launch shapes and shared memory) replays
  // it, once the nodes whose arguments changed are updated; otherwise the graph is built
  // again. Arguments are compared whole (pointers, sizes, workspaces, tensor maps), so a
  // replay always runs on this call's buffers: outputs stay the caller's, never
  // overwritten by a later call.
  void launch_graph(const CompiledPlan& cp, const GpuCall& call, const Loaded& fns, LastCall& last, Device& dev) {
    if (!last.graph) last.graph = std::make_unique<GraphState>();
    GraphState& st = *last.graph;
    // NOTE: the nodes' records take this call's arguments before the graph does; a failure
    // in between (an argument block, a tensor map, a driver call) would leave the graph
    // behind its records, so any failure drops the graph and the next call builds it anew.
    try {
      update_graph(cp, call, fns, last.by_library, st, dev);
    } catch (...) {
      st.graph.reset();
      throw;
    }
  }
  void update_graph(const CompiledPlan& cp, const GpuCall& call, const Loaded& fns, const std::vector<uint8_t>& by_library,
                    GraphState& st, Device& dev) {
    const auto& kernels = cp.plan.kernels;
    bool same = st.graph.built();
    size_t n = 0;
    // Where the call's kernels overlap, each node follows the node before it on its stream and
    // the node it waits for (schedule_streams); otherwise each follows the one before (`after` empty).
    const StreamSchedule streams = schedule_streams(cp.plan, call, by_library);
    std::vector<std::vector<size_t>> after;
    std::vector<size_t> node_of;
    std::vector<int> priorities;  // per node, where the call fills idle SMs (StreamSchedule::fill)
    int last_on[3] = {-1, -1, -1};
    size_t side_nodes = 0, fill_nodes = 0;
    const int raised = streams.fill ? dev.raised_priority() : 0;
    // The next node: launch L of `fn` with the argument block and maps as this call gives them.
    auto add = [&](const Function* fn, const GpuLaunch& L, const TensorMaps& maps) {
      if (n == st.nodes.size()) st.nodes.emplace_back(), same = false;
      GraphNode& node = st.nodes[n++];
      same = same && node.fn == fn && node.launch == L;
      node.changed = node.block != st.block || std::memcmp(&node.maps, &maps, sizeof maps) != 0;
      if (node.changed) node.block = st.block, node.maps = maps;
      node.fn = fn, node.launch = L;
    };
    auto follow = [&](size_t k) {
      if (!streams.used()) return;
      std::vector<size_t>& a = after.emplace_back();
      const int s = streams.runs_on[k];
      side_nodes += s == streams.kSide, fill_nodes += s == streams.kFill;
      if (streams.fill) priorities.push_back(streams.raised(k) ? raised : 0);
      if (last_on[s] >= 0) a.push_back(size_t(last_on[s]));
      for (int w : streams.wait[k])
        if (w >= 0) a.push_back(node_of[size_t(w)]);
      last_on[s] = int(after.size()) - 1;
    };
    if (streams.used()) node_of.assign(kernels.size(), 0);
    for (size_t i = 0; i < kernels.size(); ++i) {
      const size_t k = streams.at(i);
      if (!call.launches(k)) continue;
      st.maps = TensorMaps{};  // compared whole: no stale bytes where a kernel has no maps
      GpuLaunch staging;
      GpuLaunch L = prepare_launch(dev, kernels[k], cp.layouts[k], call.args[k], call.vars[k], st.block, st.maps, staging, streams.stream_of(k));
      if (call.vars[k].stage) add(&*fns.stage[k], staging, TensorMaps{}), follow(k);
      add(&fns.main[k], L, st.maps), follow(k);
      if (streams.used()) node_of[k] = n - 1;
    }
    if (n != st.nodes.size()) st.nodes.resize(n), same = false;
    if (after != st.after) st.after = std::move(after), same = false;
    if (streams.early != st.early) st.early = streams.early, same = false;
    if (priorities != st.priorities) st.priorities = std::move(priorities), same = false;
    if (n == 0) return;  // every kernel empty: nothing to launch
    auto launch_of = [](GraphNode& node) {
      node.params = {node.block.data(), &node.maps.a, &node.maps.b};
      const GpuLaunch& L = node.launch;
      return typename Api::Graph::Launch{*node.fn, {L.grid.x, L.grid.y, L.grid.z}, {L.block.x, L.block.y, L.block.z}, L.shared_bytes,
                                         node.params.data()};
    };
    auto& counters = kiln::detail::counters_state();
    if (!same) {
      std::vector<typename Api::Graph::Launch> launches;
      for (GraphNode& node : st.nodes) launches.push_back(launch_of(node));
      st.graph.build(dev, launches, st.after, st.early, st.priorities);  // early: a call of small kernels, a chain
      counters.graphs_built.fetch_add(1, std::memory_order_relaxed);
    } else {
      for (size_t i = 0; i < st.nodes.size(); ++i)
        if (st.nodes[i].changed) st.graph.set_params(i, launch_of(st.nodes[i])), counters.graph_updates.fetch_add(1, std::memory_order_relaxed);
    }
    st.graph.launch();
    counters.graph_replays.fetch_add(1, std::memory_order_relaxed);
    counters.kernels_overlapped.fetch_add(side_nodes, std::memory_order_relaxed);
    counters.kernels_filling.fetch_add(fill_nodes, std::memory_order_relaxed);
    counters.kernels_programmatic.fetch_add(st.graph.early_edges(), std::memory_order_relaxed);
    counters.kernels_launched.fetch_add(n, std::memory_order_relaxed);
  }

  // One launch of a kernel as variant v: its shape, its argument block (with the workspace of
  // split rows and split-tail GEMMs, and the buffers of staged operands) into `block`, a wgmma
  // GEMM's tensor maps into `maps`, and where it stages operands the staging kernel's shape
  // into `staging`. `stream`: the call's stream it runs on (StreamSchedule), whose kernels
  // share a workspace of their own.
  GpuLaunch prepare_launch(Device& dev, const sched::Kernel& kernel, const codegen::Layout& layout, const KernelArgs& args,
                           const codegen::GpuVariant& v, std::vector<uint64_t>& block, TensorMaps& maps, GpuLaunch& staging,
                           uint8_t stream = StreamSchedule::kMain) {
    const auto& props = dev.properties();
    GpuLaunch L = gpu_launch_shape(kernel, args, v, props.sm_count, props.warp_size);
    uint64_t ws[codegen::kGpuSplitWords] = {}, st[codegen::kGpuStageWords] = {}, tw[codegen::kGpuSplitWords] = {};
    if (v.total_kernel >= 0) total_workspace(dev, kernel, v, L, tw);
    if (v.colsum_slot >= 0 && !v.colsum_of_b) {
      column_sum_workspace(dev, kernel, args, v, ws);
    } else if (v.workspace()) {
      split_workspace(dev, gpu_workspace_words(kernel, v, args, L, props.warp_size, props.sm_count), L.grid.x * L.grid.z, ws, stream);
    }
    if (v.stage) stage_buffers(dev, args, v, st), staging = gpu_stage_launch(args, v);
    gpu_arg_block(layout, args, v, ws, st, block, tw);
    if (v.gemm.kind == codegen::GemmKind::wgmma) Api::tensor_maps(args, v, st, maps);
    return L;
  }

  // A graph's mode (graphs_in): each node of a graph as last built or updated (its argument
  // block and tensor maps, which the next call's are compared with), and the graph.
  struct GraphNode {
    const Function* fn = nullptr;  // into cache_ (never erased)
    GpuLaunch launch;
    std::vector<uint64_t> block;
    TensorMaps maps{};
    std::array<void*, 3> params{};
    bool changed = false;
  };
  struct GraphState {
    typename Api::Graph graph;
    std::vector<GraphNode> nodes;
    std::vector<std::vector<size_t>> after;  // per node, the nodes it follows (empty: each the one before)
    bool early = false;                      // each node's first edge programmatic (StreamSchedule::early)
    std::vector<int> priorities;             // per node, its launch priority (empty: its stream's)
    std::vector<uint64_t> block;  // this call's, before it is compared
    TensorMaps maps{};
  };
  // What a thread keeps of its last call of a plan on a device: the bound arguments (their
  // memory reused by the next call), what the variant choice read of them, the variants,
  // their key and loaded kernels, and the argument block's memory. NOTE: per thread, so
  // the hit path takes no lock; `backend` is a serial number, not `this`, so that a
  // backend made where a destroyed one was never finds the old one's kernels.
  struct LastCall {
    uint64_t backend = 0;
    const CompiledPlan* plan = nullptr;
    int ordinal = -1;
    GpuCall call;
    std::vector<int64_t> inputs, inputs_now;
    std::vector<uint8_t> by_library;
    const Loaded* fns = nullptr;  // into cache_ (never erased)
    bool reusable = false;  // a next call with the same inputs may take vars and fns as they are
    std::vector<uint64_t> block;
    Events events;  // between the call's streams (schedule_streams)
    std::unique_ptr<GraphState> graph;  // the graph of a mode that replays one (graphs_in)
  };
  // This thread's entry for (this backend, plan, device). Never evicted (plans live as long as
  // the process), so any number of plans keep their variants and graphs; a direct-mapped table
  // of the recent entries in front of the map makes a hit two compares.
  LastCall& last_call(const CompiledPlan& cp, int ordinal) {
    struct Key {
      uint64_t backend;
      const CompiledPlan* plan;
      int ordinal;
      bool operator==(const Key&) const = default;
    };
    struct KeyHash {
      size_t operator()(const Key& k) const { return size_t(mix(k.backend, k.plan, k.ordinal)); }
    };
    thread_local std::unordered_map<Key, LastCall, KeyHash> calls;  // NOTE: nodes never move
    thread_local std::array<LastCall*, 8> recent{};
    LastCall*& slot = recent[size_t(mix(serial_, &cp, ordinal) >> 61)];
    if (slot && slot->backend == serial_ && slot->plan == &cp && slot->ordinal == ordinal) return *slot;
    LastCall& c = calls[Key{serial_, &cp, ordinal}];
    c.backend = serial_, c.plan = &cp, c.ordinal = ordinal;
    return *(slot = &c);
  }
  static uint64_t mix(uint64_t backend, const CompiledPlan* cp, int ordinal) {  // Fibonacci hashing
    return (uint64_t(reinterpret_cast<uintptr_t>(cp)) + uint64_t(ordinal) + (backend << 40)) * 0x9E3779B97F4A7C15ull;
  }
  static uint64_t next_serial() {
    static std::atomic<uint64_t> n{0};
    return ++n;
  }

  // The loaded kernels of this plan variant on this device (Loaded). NOTE: a reference into the
  // map (its nodes never move, entries are never erased): a hit copies nothing.
  const Loaded& functions(const ir::Graph& g, CompiledPlan& cp, const Hash128& key,
                                         const std::vector<codegen::GpuVariant>& vars, Device& dev) {
    std::lock_guard lock(mu_);
    Hash128 full = Hasher().add(key).add(reinterpret_cast<uintptr_t>(&cp)).add(dev.ordinal()).digest();
    if (auto it = cache_.find(full); it != cache_.end()) return it->second;
    // Each GEMM its own program (codegen::gpu_programs), loaded (compiled) side by side with
    // the rest: load_module is thread-safe and compiles different sources in parallel.
    std::vector<codegen::GpuProgramPart> parts = codegen::gpu_programs(Api::dialect, dev.properties().warp_size, g, cp.plan, vars);
    std::vector<std::optional<Function>> slots(cp.plan.kernels.size()), staging(cp.plan.kernels.size());
    std::vector<std::exception_ptr> errors(parts.size());
    std::atomic<size_t> next{0};
    auto load = [&] {
      for (size_t i; (i = next++) < parts.size();) {
        try {
          const codegen::GpuProgramPart& part = parts[i];
          bool gemm = cp.plan.kernels[part.kernels[0]].kind == sched::KernelKind::matmul;
          auto& m = dev.load_module(part.source, part.options, gemm ? "kiln_gemm" : "kiln_plan");
          for (size_t k : part.kernels) slots[k] = m.function(gemm ? "kiln_k0" : "kiln_k" + std::to_string(k));
          if (gemm && vars[part.kernels[0]].stage) staging[part.kernels[0]] = m.function("kiln_k0_stage");
        } catch (...) {
          errors[i] = std::current_exception();
        }
      }
    };
    std::vector<std::thread> threads;
    size_t helpers = std::min<size_t>(parts.size(), std::max(1u, std::thread::hardware_concurrency())) - 1;
    for (size_t t = 0; t < helpers; ++t) threads.emplace_back(load);
    load();
    for (auto& t : threads) t.join();
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
    Loaded fns;
    for (auto& f : slots) fns.main.push_back(std::move(*f));
    fns.stage = std::move(staging);
    return cache_.emplace(full, std::move(fns)).first->second;
  }
  // max-autotune: each matmul kernel's GEMM config, or the vendor library
  // (Api::library_gemm), from the tuning database; on a miss every candidate is
  // timed once on this call's buffers (tune/db.hpp). Overrides call's variants.
  void tune_matmuls(const ir::Graph& g, CompiledPlan& cp, GpuCall& call, std::vector<uint8_t>& by_library, Device& dev, int arch) {
    const auto& props = dev.properties();
    const auto& kernels = cp.plan.kernels;
    // Each matmul kernel's candidates (their variants and programs: the program the plan
    // builds for that config, codegen::gpu_programs) and tuning key, once.
    struct Tuned {
      size_t k;
      std::vector<codegen::GemmConfig> configs;
      bool library;
      codegen::GemmProblem p;
      tune::Key key;
      std::vector<codegen::GpuVariant> vars;
      std::vector<codegen::GpuProgramPart> programs;
      bool miss = false;  // the database lacks the key: this call tunes it
    };
    std::vector<Tuned> tuned;
    for (size_t k = 0; k < kernels.size(); ++k) {
      // NOTE: a matmul with a prologue keeps the heuristic's GEMM: a candidate's time would
      // leave out the prologue's own kernel, which the tensor-core kinds need and SIMT does not.
      if (kernels[k].kind != sched::KernelKind::matmul || call.args[k].work == 0 || kernels[k].has_prologue()) continue;
      codegen::GemmProblem p = gemm_problem(g, kernels[k], call.args[k], arch, props.sm_count);
      p.heavy_epilogue = cp.layouts[k].epilogue_heavy;
      bool library = Api::library_gemm_applies(g, kernels[k], cp.layouts[k], call.args[k]);
      tuned.push_back({k, codegen::gemm_tuning_candidates(p), library, p,
                       matmul_tune_key(g, kernels[k], cp.layouts[k], p, library ? Api::kLibraryGemm : "", Api::arch_name(dev)), {}, {}});
    }
    // NOTE: compiling the candidates is most of a tuning's time: every program of every
    // key the database lacks is compiled first, side by side (Api::compile_ahead).
    // Built only where a key is tuned (never on a database hit: max-autotune runs this per call).
    auto build_programs = [&](Tuned& t) {
      if (!t.programs.empty()) return;
      for (const codegen::GemmConfig& c : t.configs) {
        set_gemm(t.vars.emplace_back(call.vars[t.k]), c, t.p);
        const codegen::GpuVariant& v = t.vars.back();
        t.programs.push_back(codegen::gpu_gemm_program(Api::dialect, props.warp_size, g, cp.plan, t.k, v));
      }
    };
    std::vector<std::pair<std::string, std::vector<std::string>>> ahead;
    for (Tuned& t : tuned) {
      if (tune::db().find(t.key)) continue;
      t.miss = true;
      build_programs(t);
      for (const codegen::GpuProgramPart& part : t.programs) ahead.push_back({part.source, part.options});
    }
    // The plan's own programs (as the heuristic chose: its run below) compile alongside, but
    // for those that are a candidate's too (the heuristic's config).
    if (!ahead.empty())
      for (codegen::GpuProgramPart& part : codegen::gpu_programs(Api::dialect, props.warp_size, g, cp.plan, call.vars))
        if (std::none_of(ahead.begin(), ahead.end(), [&](const auto& a) { return a.first == part.source && a.second == part.options; }))
          ahead.push_back({std::move(part.source), std::move(part.options)});
    if (ahead.size() > 1) {
      const auto t0 = std::chrono::steady_clock::now();
      Api::compile_ahead(ahead, dev);
      log(LogTopic::tune, std::to_string(ahead.size()) + " programs (candidates and the plan's) compiled side by side in " +
                              std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()) + " s");
    }
    // Before timing, the plan runs once as the heuristic chose (a plan writes only fresh
    // outputs), so that each GEMM is timed on the values this call gives it. NOTE: operands
    // not yet written (zeros) draw less power: on an H200, cuBLASLt timed 1351 us on them
    // against 1555 us in the W4 step, and max-autotune chose it over a faster kernel.
    if (!ahead.empty()) {
      std::vector<uint64_t> block;
      Events events;
      launch_kernels(g, cp, call, functions(g, cp, call.key, call.vars, dev), std::vector<uint8_t>(kernels.size(), 0), block, dev, events);
    }
    // The plan as the heuristic chose, kept only where this call tunes a key (validate_choices):
    // max-autotune runs this on every call.
    std::optional<GpuCall> heuristic;
    if (std::any_of(tuned.begin(), tuned.end(), [](const Tuned& t) { return t.miss; })) heuristic.emplace(call);
    for (Tuned& t : tuned) {
      const size_t k = t.k;
      const std::vector<codegen::GemmConfig>& configs = t.configs;
      std::vector<std::string> names;
      for (const auto& c : configs) names.push_back(c.str());
      if (t.library) names.push_back(Api::kLibraryGemm);
      std::string choice = tune::autotune(t.key, names, [&](const std::string& name) {
        if (name == Api::kLibraryGemm)
          return time_us(dev, [&] {
            if (!Api::library_gemm(g, kernels[k], cp.layouts[k], call.args[k], dev)) throw Error("no algorithm for it");
          });
        build_programs(t);  // a stored choice that is no longer a candidate is retuned
        const size_t i = size_t(std::find(names.begin(), names.end(), name) - names.begin());
        const codegen::GpuVariant& v = t.vars[i];
        auto& m = dev.load_module(t.programs[i].source, t.programs[i].options, "kiln_gemm");
        Function f = m.function("kiln_k0");
        std::optional<Function> stage;
        if (v.stage) stage = m.function("kiln_k0_stage");
        std::vector<uint64_t> block;
        TensorMaps maps;
        GpuLaunch staging;
        GpuLaunch L = prepare_launch(dev, kernels[k], cp.layouts[k], call.args[k], v, block, maps, staging);
        KernelDescription describe{&g, &kernels[k]};
        return time_us(dev, [&] {  // a staging kernel is part of its config's time
          if (stage) launch_one(*stage, staging, block, maps, describe, dev.stream(), false, 0);
          launch_one(f, L, block, maps, describe, dev.stream(), false, 0);
        });
      });
      if (choice == Api::kLibraryGemm) by_library[k] = 1;
      for (const auto& c : configs)
        if (c.str() == choice) set_gemm(call.vars[k], c, t.p);
    }
    skip_computed_prologues(cp.plan, call.vars);
    assign_column_sums(g, cp, call, &by_library);
    link_column_sums(cp, call);
    call.key = variant_key(call.vars);
    if (heuristic) validate_choices(g, cp, call, *heuristic, by_library, tuned, dev);
  }
  // The candidates were timed alone, each run after a cache flush; a plan runs its kernels back
  // to back, where a GPU under its power limit holds a lower clock and a kernel's time follows
  // the energy it takes. So where this call tuned a key to other than the heuristic's choice,
  // the whole plan runs both ways, alternated (kValidateRounds each, medians), and the tuned
  // choices stay only if the plan ran faster with them; else every key this call tuned stores
  // the heuristic's choice. NOTE: on an H200, W4's dx GEMM timed 1.34-1.40 ms alone in
  // cuBLASLt against 1.60 in kiln's config, and took 1.68-1.72 in the step against kiln's 1.60
  // (twenty-eighth session): max-autotune chose cuBLASLt and ran the step 1-4% slower.
  template <class TunedList>
  void validate_choices(const ir::Graph& g, CompiledPlan& cp, GpuCall& call, const GpuCall& heuristic, std::vector<uint8_t>& by_library,
                        const TunedList& tuned, Device& dev) {
    // Only where the heuristic's choice is a candidate of every key tuned (so that it can be stored).
    bool changed = false;
    for (const auto& t : tuned) {
      if (!t.miss) continue;
      const std::string mine = heuristic.vars[t.k].gemm.str();
      if (std::none_of(t.configs.begin(), t.configs.end(), [&](const codegen::GemmConfig& c) { return c.str() == mine; })) return;
      changed |= by_library[t.k] || call.vars[t.k].gemm.str() != mine;
    }
    if (!changed) return;
    const auto& kernels = cp.plan.kernels;
    const std::vector<uint8_t> none(kernels.size(), 0);
    const Loaded& tuned_fns = functions(g, cp, call.key, call.vars, dev);
    const Loaded& heuristic_fns = functions(g, cp, heuristic.key, heuristic.vars, dev);
    std::vector<uint64_t> block;
    Events events;
    auto plan_ms = [&](bool with_tuned) {
      typename Api::Timer t(dev.ordinal());
      t.start(dev.stream());
      if (with_tuned) launch_kernels(g, cp, call, tuned_fns, by_library, block, dev, events);
      else launch_kernels(g, cp, heuristic, heuristic_fns, none, block, dev, events);
      t.stop(dev.stream());
      return double(t.elapsed_ms());
    };
    constexpr int kValidateRounds = 5;
    std::vector<double> with(kValidateRounds), without(kValidateRounds);
    for (int r = 0; r < kValidateRounds; ++r) {  // alternated, and which goes first too
      if (r % 2 == 0) with[size_t(r)] = plan_ms(true), without[size_t(r)] = plan_ms(false);
      else without[size_t(r)] = plan_ms(false), with[size_t(r)] = plan_ms(true);
    }
    std::sort(with.begin(), with.end());
    std::sort(without.begin(), without.end());
    const double tuned_ms = with[kValidateRounds / 2], heuristic_ms = without[kValidateRounds / 2];
    const bool keep = tuned_ms < heuristic_ms;
    if (log_enabled(LogTopic::tune)) {
      char b[200];
      std::snprintf(b, sizeof b, "the plan with the tuned choices %.3f ms, as the heuristic chose %.3f ms: %s", tuned_ms, heuristic_ms,
                    keep ? "tuned choices kept" : "the heuristic's choices stored");
      log(LogTopic::tune, b);
    }
    if (keep) return;
    for (const auto& t : tuned) {
      if (!t.miss) continue;
      tune::db().store(t.key, {heuristic.vars[t.k].gemm.str(), heuristic_ms * 1000.0});  // NOTE: the plan's time, not the GEMM's
      call.vars[t.k] = heuristic.vars[t.k];
      by_library[t.k] = 0;
    }
    skip_computed_prologues(cp.plan, call.vars);
    assign_column_sums(g, cp, call, &by_library);
    link_column_sums(cp, call);
    call.key = variant_key(call.vars);
  }
  // Median microseconds of `launch` over a few runs after a warm-up, each run alone between
  // the device's events with the cache flushed before it: in a step a GEMM reads its operands
  // from memory, while back to back the same launch finds part of them in L2 (on an H200 that
  // made cuBLASLt and 3-stage configs look faster than in the W4 step, where they were slower).
  template <class F>
  static double time_us(Device& dev, F&& launch) {
    launch();
    typename Api::Timer t(dev.ordinal());
    constexpr int kRuns = 7;
    std::array<double, kRuns> us{};
    for (double& u : us) {
      Api::flush_cache(dev);
      t.start(dev.stream());
      launch();
      t.stop(dev.stream());
      u = double(t.elapsed_ms()) * 1000.0;
    }
    std::sort(us.begin(), us.end());
    return us[kRuns / 2];
  }

  struct Workspace {
    std::unique_ptr<Storage> partials, counters, staged;
  };
  // Split rows and split-tail GEMMs: room for `words` 8-byte partials and `counters` zeroed
  // counters (one per row, per column block, or per GEMM block), on the device; grown (never shrunk) as calls need. The
  // kernels leave the counters at zero again. A stream of a call (StreamSchedule) has its own,
  // and the kernels that use one run in that stream's order (schedule_streams: the main
  // stream's, the side stream's split-tail GEMMs, the fill stream's leaves), so calls share
  // it; a grown one is zeroed in that stream's order too.
  void split_workspace(Device& dev, size_t words, unsigned counters, uint64_t* ws, uint8_t stream) {
    std::lock_guard lock(mu_);
    grow_workspace(workspaces_[stream][dev.ordinal()], kiln::Device{Api::kind, dev.ordinal()}, words * 8, size_t(counters) * 4, ws);
  }
  // Grows w's partials to `part` bytes and its counters to `count` bytes (a grown one zeroed);
  // their addresses into ws[0], ws[1].
  static void grow_workspace(Workspace& w, kiln::Device where, size_t part, size_t count, uint64_t* ws) {
    if (!w.partials || w.partials->bytes() < part) w.partials = std::make_unique<Storage>(part, where);
    if (!w.counters || w.counters->bytes() < count) {
      w.counters = std::make_unique<Storage>(count, where);
      std::vector<char> zeros(count, 0);
      copy_bytes(w.counters->data(), where, zeros.data(), kiln::cpu(), count);
    }
    ws[0] = reinterpret_cast<uint64_t>(w.partials->data());
    ws[1] = reinterpret_cast<uint64_t>(w.counters->data());
  }
  // The buffers of a GEMM's staged operands (GpuVariant::stage), A's then B's, each 256-byte
  // aligned, in one buffer of the device that grows to the largest call's: the GEMMs that stage
  // run one after another on the main stream (schedule_streams), each staging right before it reads.
  void stage_buffers(Device& dev, const KernelArgs& args, const codegen::GpuVariant& v, uint64_t* st) {
    size_t offset[2] = {}, bytes = 0;
    for (int o = 0; o < 2; ++o)
      if (v.stage >> o & 1u) {
        offset[o] = bytes;
        bytes += (size_t(codegen::GemmStaged::of(args.meta.data(), o).elements()) * 4 + 255) / 256 * 256;
      }
    std::lock_guard lock(mu_);
    Workspace& w = workspaces_[StreamSchedule::kMain][dev.ordinal()];
    if (!w.staged || w.staged->bytes() < bytes) w.staged = std::make_unique<Storage>(bytes, kiln::Device{Api::kind, dev.ordinal()});
    for (int o = 0; o < 2; ++o)
      if (v.stage >> o & 1u) st[o] = reinterpret_cast<uint64_t>(static_cast<char*>(w.staged->data()) + offset[o]);
  }
  // A GEMM's column sums (GpuVariant::colsum_slot): a row of f32 sums per tile row of the output
  // and a zeroed counter per column of tiles, in device memory of that kernel's own, so that it
  // may run beside other kernels (schedule_streams); grown as calls need, never shrunk. The
  // kernel leaves the counters at zero again. NOTE: a plan's calls on a device run in its
  // streams' order (each call joins its streams), so calls share it.
  void column_sum_workspace(Device& dev, const sched::Kernel& kernel, const KernelArgs& args, const codegen::GpuVariant& v, uint64_t* ws) {
    const int64_t tiles_m = (args.size(0) + v.gemm.bm - 1) / v.gemm.bm, tiles_n = (args.size(1) + v.gemm.bn - 1) / v.gemm.bn;
    std::lock_guard lock(mu_);
    grow_workspace(column_sums_[{dev.ordinal(), &kernel}], kiln::Device{Api::kind, dev.ordinal()},
                   size_t(tiles_m * args.size(1)) * 4, size_t(tiles_n) * 4, ws);
  }

  // A GEMM's total (GpuVariant::total_kernel): a float for each warp of the grid that stores
  // tiles and one counter, the kernel's own (zero between launches).
  void total_workspace(Device& dev, const sched::Kernel& kernel, const codegen::GpuVariant& v, const GpuLaunch& L, uint64_t* ws) {
    const size_t warps = size_t(L.grid.x) * L.grid.z * size_t(codegen::wgmma_epilogue_warps(v.gemm));
    std::lock_guard lock(mu_);
    grow_workspace(totals_[{dev.ordinal(), &kernel}], kiln::Device{Api::kind, dev.ordinal()}, warps * 4, 4, ws);
  }

  const uint64_t serial_ = next_serial();
  std::mutex mu_;
  std::unordered_map<Hash128, Loaded, Hash128Hasher> cache_;
  std::unordered_map<int, Workspace> workspaces_[3];  // per stream of a call (StreamSchedule), per device
  std::map<std::pair<int, const sched::Kernel*>, Workspace> column_sums_, totals_;
};

namespace detail {

// kiln::Storage on a device of Api::kind allocates, releases and copies through these.
template <class Api>
void* gpu_allocate(size_t bytes, int index) {
  auto& dev = Api::device(index);
  dev.make_current();
  void* p = reinterpret_cast<void*>(dev.allocator().allocate(bytes ? bytes : 1));
  if (kiln::detail::cpu_poison() && bytes) {  // tests: a device element a kernel forgets to write reads as NaN
    std::vector<unsigned char> ff(bytes, 0xFF);
    Api::copy(p, Device{Api::kind, index}, ff.data(), kiln::cpu(), bytes);
  }
  return p;
}

template <class Api>
void gpu_release(void* p, size_t, int index) noexcept {
  try {  // NOTE: called from ~Storage: an exception here would end the process
    auto& allocator = Api::device(index).allocator();
    allocator.release(reinterpret_cast<typename std::remove_reference_t<decltype(allocator)>::Pointer>(p));
  } catch (const std::exception& e) {
    log(LogTopic::jit, Device{Api::kind, index}.str() + ": releasing device memory failed: " + e.what());
  }
}

template <class Api>
void gpu_copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) {
  for (Device d : {dd, sd}) {
    if (d.kind != DeviceKind::cpu && d.kind != Api::kind) {
      throw Error("kiln: no direct copy from " + sd.str() + " to " + dd.str() + "; copy through the CPU (.to(kiln::cpu()))");
    }
  }
  if (bytes) Api::copy(dst, dd, src, sd, bytes);
}

// Per DeviceKind, whether such a GPU is usable: filled in by each backend the
// program includes, asked (cuda first, then hip) only when the default device is
// first needed.
inline bool (*gpu_present[3])() noexcept = {nullptr, nullptr, nullptr};

inline Device first_gpu() {
  for (DeviceKind k : {DeviceKind::cuda, DeviceKind::hip}) {
    if (auto present = gpu_present[int(k)]; present != nullptr && present()) return Device{k, 0};
  }
  return kiln::cpu();
}

// Storage hooks, backend slot and default-device probe of one GPU API. Stores
// function pointers only: nothing is loaded or initialised before kiln needs a
// device.
template <class Api>
bool register_gpu_backend() {
  kiln::detail::memory_hooks(Api::kind) = {gpu_allocate<Api>, gpu_release<Api>, gpu_copy<Api>, Api::empty_cache};
  backend_slot(Api::kind) = std::make_unique<GpuBackend<Api>>();
  gpu_present[int(Api::kind)] = Api::present;
  kiln::detail::gpu_probe = first_gpu;
  return true;
}

}  // namespace detail

}  // namespace kiln::runtime
