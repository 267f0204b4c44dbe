// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The CUDA and HIP dialects: one generator, one kernel text for both; the
// prelude (device/gpu_prelude.cuh) holds the few differences. Takes a Graph, a
// Plan and a variant per kernel; gives one translation unit (one NVRTC/hipRTC
// program) with a `extern "C" __global__` function per kernel, each taking its
// arguments as one struct by value:
//   struct { void* p[slots]; int64_t m[meta]; uint64_t a[words]; }
// with the same meaning as the C++ dialect's P, M, A (codegen/cpp.hpp).
//
// Variants (chosen per call by the host, each its own compiled program):
//   strides  how each slot walks the innermost dim (0, 1, or a run-time value);
//   vec      V > 0: every slot is contiguous or broadcast along a single
//            innermost dim and 16-byte aligned: V elements per 16-byte access
//            (rows: each pass loads only the slots it reads, and a loop over a
//            row issues a batch of loads before it uses any); vec_rows: several
//            such dims, V-chunks within rows of the innermost one;
//   group    rows kernels: lanes per row, a power of two up to the warp (short
//            rows: a warp per row, or several rows per warp); 0: a block per row;
//   persist  block rows whose row fits: each thread loads its P chunks once,
//            every pass then reads registers (one read of the input per row);
//            exact: the row is exactly threads x V x P elements, so no chunk is
//            checked against the row's end and the block size is a constant;
//   stream   block rows: the 16-byte stores (and kept rows' loads) marked streaming
//            (evict first), which keeps in L2 the rows read again;
//   split    block rows of a one-pass reduction over few long rows: several blocks
//            per row (gridDim.x / rows of them), each reduces its span, and the
//            last block of a row to finish combines the partials (a second pass
//            over a workspace of 8-byte partials and one counter per row).
//   cols     one-pass rows reduced along a strided dim with the kept dim contiguous
//            (column sums, a bias gradient): a lane per V consecutive kept indices
//            (vec V > 0: one 16-byte load per row; else a column per lane), so a warp
//            reads consecutive addresses; blocks of warp-many lanes by row groups, each
//            with several rows' loads in flight, combined through shared memory in a
//            fixed order; with split, gridDim.y parts of the rows per column block,
//            the last block of a column block to finish combining the parts.
//   gemm     matmul kernels: the GEMM config and operand layouts (codegen/gemm.hpp).
#pragma once
#include <algorithm>
#include <functional>
#include <string>

#include "kiln/codegen/device_files.hpp"
#include "kiln/codegen/gemm_mfma.hpp"
#include "kiln/codegen/gemm_sm90.hpp"
#include "kiln/codegen/kernel.hpp"

namespace kiln::codegen {

enum class GpuDialect : uint8_t { cuda, hip };

struct GpuVariant {
  std::vector<Stride> strides;
  int vec = 0;
  int group = 0;      // rows: lanes per row (1 .. warp); 0: a block per row
  int persist = 0;    // block rows: V-chunks per thread kept in registers across passes (the row is read once)
  bool exact = false; // persist: the row is exactly threads x V x persist elements (no check per chunk)
  bool split = false; // block rows: several blocks per row, partials combined by the last one
  bool cols = false;  // one-pass rows reduced along a strided dim: a lane per V kept indices (columns)
  bool stream = false; // block rows: every 16-byte chunk stored (and a kept row loaded) marked streaming (evict first)
  bool keep = false;   // block rows kept in registers: the row loaded L2 evict_last (kiln_load_vec_keep)
  bool preload = false; // block rows kept in registers: the slots only the stores read loaded with the row, before the reductions
  int threads = 256;  // block size; the kernel's launch bounds
  int resident = 1024; // not matmul: threads an SM keeps resident (launch bounds: resident / threads blocks)
  GemmConfig gemm;       // matmul: tile shapes and kind
  GemmOperands gemm_ops; // matmul: which dim of A and B is contiguous
  // matmul (wgmma): interior tiles store 4 consecutive columns per access, each epilogue
  // slot one vector load or store; `strides` then holds each epilogue slot's column stride
  // (zero: broadcast along the row, or unit).
  bool epilogue_vec = false;
  // vec over several dims (pointwise; rows: the reduced ones): V-chunks within rows of the
  // innermost dim (its size a multiple of V); pointwise: each chunk's row offsets by division
  // as in the scalar loop; rows: by a cursor moved without one (chunked_rows_loop)
  bool vec_rows = false;
  // pointwise vec_rows: bit i set where slot i is contiguous over every dim (x in x * w + b),
  // so its chunk is at the flat index and its load need not wait for the row's division
  uint32_t whole = 0;
  // Pointwise over several dims, rows reduced over several: the domain's rank and its outer
  // (kept) dims as constants (rank 0: both read at run time), so each element's offsets
  // unroll instead of looping over a run-time rank. NOTE: bf16 x * w + b went from 50 to 34
  // registers, the sum over 2 dims of the W4 loss from 64 with spills to 48 (ptxas, sm_90).
  int rank = 0, outer_rank = 0;
  // matmul with a prologue (sched::Kernel::prologue_slot): bit o set where the GEMM computes
  // operand o as it loads it (runtime's gemm_computed_prologues: the SIMT kind, mfma on 16-bit
  // sources); else it reads the operand's buffer, which the prologue's own kernel stores first.
  uint8_t prologue = 0;
  // A prologue's own kernel whose GEMM computes the operand itself, or a rows kernel whose sums
  // a GEMM computes (colsum_slot): not launched.
  bool skip = false;
  // matmul (wgmma in TF32): bit o set where operand o is not K-major, which TF32's wgmma cannot
  // read: a staging kernel (kiln_k<i>_stage) first copies it K-major, rounded to nearest TF32,
  // into a buffer the host gives in the argument struct's `st` words, and the GEMM's tensor
  // map reads that copy (gemm_ops then says K-major).
  uint8_t stage = 0;
  // matmul (wgmma): the slot of a matrix this GEMM stores whose column sums (over its rows) it
  // also writes, as a rows kernel would (a bias's gradient, sum(dy, 0)): each tile sums its
  // columns after storing them and leaves them in the workspace; a column of tiles' last tile
  // adds them up and stores them, as `colsum_dtype`, where the argument struct's `cs` word
  // points (runtime's assign_column_sums; that rows kernel is then skipped). -1: none.
  int colsum_slot = -1;
  DType colsum_dtype = DType::f32;
  int colsum_kernel = -1;  // the host's: the rows kernel whose output that is
  // With colsum_slot: the matrix summed is the GEMM's B operand (slot 1), not one it stores, and
  // its sum is over B's rows, the GEMM's K: the tiles of the first tile row sum B's columns from
  // the stages already in shared memory (gemm_sm90.hpp; runtime's assign_column_sums). No workspace.
  bool colsum_of_b = false;
  // matmul (wgmma, not dynamic tiles): the rows kernel (plan index) whose one value, a sum over
  // every element of a pointwise function of a matrix this GEMM stores (a loss: mean(y * y)),
  // this GEMM computes: the threads that store its tiles add the function of each element into
  // a register; at the kernel's end each warp leaves its sum in the workspace and the last warp
  // to arrive adds them all, in order, and stores the rows kernel's output (runtime's
  // assign_totals; that kernel is then skipped). Its words (`tt`, after the column sums'):
  // the destination, then the rows kernel's params (`total_words` of them); its workspace's
  // (`tw`) end the argument struct. -1: none.
  int total_kernel = -1;
  int total_words = 0;
  // The argument struct ends with workspace words: split rows' partials and counters, or a
  // split-tail GEMM's slots and counts (a tile of floats per piece handed over, a count per
  // tail tile; per block of a cluster), or a split-K GEMM's (a tile of sums per block, a
  // counter per tile), or a GEMM's column sums (a row of sums per tile row, a counter per
  // column of tiles).
  bool workspace() const {
    return split || (gemm.persistent && gemm.split_tail) || (gemm.kind == GemmKind::simt && gemm.split_k > 1) ||
           (colsum_slot >= 0 && !colsum_of_b);
  }
};

// Whether a GEMM of config c can sum a matrix's columns as it stores it (GpuVariant::colsum_slot):
// the wgmma kind, not a split tail (whose workspace is the pieces' hand-over).
inline bool gemm_sums_columns(const GemmConfig& c) { return c.kind == GemmKind::wgmma && !(c.persistent && c.split_tail); }

// The workspace words an argument struct ends with (GpuVariant::workspace): partials, counters.
inline constexpr int kGpuSplitWords = 2;
// The staged operands' buffers (GpuVariant::stage), A's and B's, after the workspace words.
inline constexpr int kGpuStageWords = 2;
// The column sums' destination (GpuVariant::colsum_slot), after the params' words (before the
// workspace's: the words the host sets per call come first).
inline constexpr int kGpuColumnSumWords = 1;
// A GEMM's total (GpuVariant::total_kernel): its destination, then its rows kernel's params (`tt`,
// after the column sums' words); its workspace, partials and counter (`tw`), end the struct.
inline constexpr int kGpuTotalWords = 1;

// A staged operand (GpuVariant::stage) of a matmul over meta M = [nd, K, sizes, strides per
// slot]: its rows (M of A, N of B), batches (one where its batch is broadcast) and row pitch
// (K rounded up to 4 elements: 16-byte rows, as the copy engine steps them), and the 32 x 32
// tiles the staging kernel copies; the host sizes the buffer and the grid from it, the kernel
// finds its tile by it.
struct GemmStaged {
  int64_t rows = 0, batches = 1, pitch = 0;
  int64_t tiles() const { return batches * ((rows + 31) / 32) * ((pitch + 31) / 32); }
  int64_t elements() const { return batches * rows * pitch; }
  static GemmStaged of(const int64_t* meta, int operand) {
    const int nd = int(meta[0]);
    const int64_t* sz = meta + 2;
    const int64_t* st = sz + nd * (1 + operand);
    return {sz[operand ? nd - 1 : nd - 2], nd == 3 && st[0] != 0 ? sz[0] : 1, (meta[1] + 3) / 4 * 4};
  }
};

inline constexpr int kGpuMaxMeta = 2 + kMaxRank + 16 * kMaxRank;

inline std::string gpu_prelude(GpuDialect d, int warp_size) {
  std::string s = d == GpuDialect::hip ? "#define KILN_HIP 1\n" : "";
  s += "#define KILN_WARP " + std::to_string(warp_size) + "\n";
  return s + detail::read_device_file("gpu_prelude.cuh") + detail::read_device_file("philox.h");
}

class GpuKernelWriter {
 public:
  // `total`: the rows kernel whose total a GEMM computes (GpuVariant::total_kernel).
  GpuKernelWriter(const ir::Graph& g, const sched::Kernel& k, int index, const GpuVariant& v, const sched::Kernel* total = nullptr)
      : g_(g), k_(k), l_(layout(g, k)), v_(v), name_("kiln_k" + std::to_string(index)), total_(total) {}

  // Words of the argument struct's m: [nd, no or K, sizes, strides per slot].
  static size_t meta_words(const Layout& l) { return 2 + kMaxRank + l.slots.size() * kMaxRank; }

  std::string write() {
    size_t ns = std::max<size_t>(l_.slots.size(), 1), nm = meta_words(l_), nw = std::max(l_.words, 1);
    std::string s = "struct " + name_ + "_args { void* p[" + std::to_string(ns) + "]; int64_t m[" + std::to_string(nm) +
                    "]; uint64_t a[" + std::to_string(nw) + "];" +
                    (v_.colsum_slot >= 0 ? " kiln_u64 cs[" + std::to_string(kGpuColumnSumWords) + "];" : "") +
                    (v_.total_kernel >= 0 ? " kiln_u64 tt[" + std::to_string(kGpuTotalWords + v_.total_words) + "];" : "") +
                    (v_.workspace() ? " kiln_u64 ws[" + std::to_string(kGpuSplitWords) + "];" : "") +
                    (v_.stage ? " kiln_u64 st[" + std::to_string(kGpuStageWords) + "];" : "") +
                    (v_.total_kernel >= 0 ? " kiln_u64 tw[" + std::to_string(kGpuSplitWords) + "];" : "") + " };\n";
    // NOTE: the bounds are the block size the host launches with (it is part of the variant). On
    // AMD that lifts the default bound of 1024 work-items, which caps each lane's registers as if
    // 16 wavefronts shared a CU; on NVIDIA the blocks-per-SM hint keeps `resident` threads
    // resident (gpu_variant's choice: 1024, 2048 for pointwise kernels, more for some block
    // rows; GEMM tiles ask for none: their registers are the tile).
    bool mm = k_.kind == sched::KernelKind::matmul;
    if (mm)
      for (int o = 0; o < 2; ++o)
        if (v_.prologue >> o & 1u) s = matmul_prologue(g_, k_, l_, o, prologue_name(o), "static KILN_FN") + s;
    int threads = mm ? v_.gemm.threads() : v_.threads;
    // A GEMM in clusters of blocks names its cluster here: a plain launch then makes them.
    const bool clustered = mm && v_.gemm.kind == GemmKind::wgmma && v_.gemm.cluster > 1;
    s += "extern \"C\" __global__ void " + (clustered ? "__cluster_dims__(" + std::to_string(v_.gemm.cluster) + ", 1, 1) " : std::string()) +
         "KILN_LAUNCH_BOUNDS(" + std::to_string(threads) + ", " +
         std::to_string(mm ? 1 : std::max(1, v_.resident / threads)) + ") " + name_ + "(const " + name_ + "_args args" +
         (mm && v_.gemm.kind == GemmKind::wgmma
              ? ", const __grid_constant__ KilnTensorMap tma_a, const __grid_constant__ KilnTensorMap tma_b"
              : "") +
         ") {\n";
    s += "  kiln_grid_begin();\n";  // before any memory (kiln::programmatic_launch)
    s += "  void* const* P = args.p; const int64_t* M = args.m; const uint64_t* A = args.a; (void)P; (void)A;\n";
    if (k_.kind == sched::KernelKind::matmul) return s + matmul() + "}\n" + (v_.stage ? stage_kernel() : "");
    s += v_.rank ? "  constexpr int nd = " + std::to_string(v_.rank) + ", no = " + std::to_string(v_.outer_rank) + "; (void)no;\n"
                 : "  const int nd = (int)M[0], no = (int)M[1]; (void)no;\n";
    s += "  const int64_t* sz = M + 2;\n  const int64_t* st = M + 2 + nd;\n";
    for (size_t i = 0; i < l_.slots.size(); ++i) s += slot_decl(int(i));
    s += k_.kind == sched::KernelKind::rows ? rows() : pointwise();
    return s + "}\n";
  }

  // 32-bit registers a thread of block rows kept in registers holds across the passes: its
  // kept 16-byte chunks and the carried values (the host picks the residency from it).
  int row_registers() {
    if (k_.kind != sched::KernelKind::rows || !v_.persist) return 0;
    find_kept();
    find_online_sums();
    ValueEmitter ve(g_, k_, l_);
    ve.find_row_values();
    int passes = 0, n = 0;
    for (int lvl : level_) passes = std::max(passes, lvl + 1);
    for (size_t i = 0; i < l_.slots.size(); ++i) n += kept(int(i)) ? v_.persist * 4 : 0;
    for (const std::vector<int>& pass : carried_values(ve, passes))
      for (int id : pass) n += v_.persist * std::max(v_.vec, 1) * int(info(g_.nodes[size_t(id)].dtype).bytes > 4 ? 2 : 1);
    return n;
  }

 private:
  std::string stype(int i) const { return storage_type(g_.nodes[size_t(l_.slots[size_t(i)].node)].dtype); }
  std::string slot_decl(int i) const {
    const Slot& sl = l_.slots[size_t(i)];
    std::string s, si = std::to_string(i), t = stype(i);
    if (sl.role == SlotRole::store) s += "  " + t + "* __restrict__ b" + si + " = (" + t + "*)P[" + si + "];\n";
    else if (sl.role == SlotRole::load) s += "  const " + t + "* __restrict__ b" + si + " = (const " + t + "*)P[" + si + "];\n";
    Stride c = v_.strides[size_t(i)];
    if (c == Stride::any) s += "  const int64_t s" + si + " = nd ? st[" + si + " * nd + nd - 1] : 0;\n";
    else s += "  constexpr int64_t s" + si + " = " + std::to_string(int(c)) + ";\n";
    return s;
  }
  std::string offsets(const std::string& var, const std::string& d0, const std::string& d1, const std::string& prefix,
                      const std::string& ind) const {
    std::string s;
    for (size_t i = 0; i < l_.slots.size(); ++i) s += ind + "int64_t " + prefix + std::to_string(i) + " = 0;\n";
    // NOTE: var < the product of the sizes, so the outermost dim's index is what is left: no
    // 64-bit division there (none at all for one outer dim, the common rows case).
    s += ind + "{ int64_t rr = " + var + "; for (int d = " + d1 + " - 1; d >= " + d0 + "; --d) { const int64_t rq = d > " + d0 +
         " ? rr / sz[d] : 0, ix = rr - rq * sz[d]; rr = rq;";
    for (size_t i = 0; i < l_.slots.size(); ++i) s += " " + prefix + std::to_string(i) + " += ix * st[" + std::to_string(i) + " * nd + d];";
    return s + " } }\n";
  }
  std::string bases(const std::string& ind, const std::string& off) const {
    std::string s;
    for (size_t i = 0; i < l_.slots.size(); ++i) {
      std::string si = std::to_string(i), o = off;
      for (size_t p = 0; p < o.size(); ++p)
        if (o[p] == '#') o.replace(p, 1, si);
      if (l_.slots[i].role == SlotRole::rand) s += ind + "const int64_t q" + si + " = " + o + ";\n";
      else if (l_.slots[i].role == SlotRole::store) s += ind + stype(int(i)) + "* __restrict__ q" + si + " = b" + si + " + " + o + ";\n";
      else s += ind + "const " + stype(int(i)) + "* __restrict__ q" + si + " = b" + si + " + " + o + ";\n";
    }
    return s;
  }
  DType slot_dtype(int i) const { return g_.nodes[size_t(l_.slots[size_t(i)].node)].dtype; }
  int slot_of_store(size_t s) const {
    for (size_t i = 0; i < l_.slots.size(); ++i)
      if (l_.slots[i].role == SlotRole::store && l_.slots[i].store == int(s)) return int(i);
    return -1;
  }
  // Scalar access: element j of slot i from its base q<i>.
  std::string load(int i) const {
    std::string si = std::to_string(i);
    return to_compute(slot_dtype(i), "q" + si + "[j * s" + si + "]");
  }
  std::string index(int i) const {
    std::string si = std::to_string(i);
    return "(q" + si + " + j * s" + si + ")";
  }
  // Vector access: element u of the V-wide chunk (unit slots from a register array, broadcast ones as scalars).
  std::string vload(int i) {
    std::string si = std::to_string(i);
    if (v_.strides[size_t(i)] == Stride::zero) return to_compute(slot_dtype(i), "q" + si + "[0]");
    used_[size_t(i)] = 1;
    return vec_element(slot_dtype(i), "L" + si + (kept(i) || batched_ ? "[k]" : ""), "u");
  }
  // The 16-byte loads of the V-chunk at j for the slots the statements just generated read
  // (none where the chunk is already in registers: kept rows, batched chunks).
  std::string chunk_loads(const std::string& ind) const {
    std::string s, V = std::to_string(v_.vec);
    for (size_t i = 0; i < l_.slots.size(); ++i)
      if (used_[i] && !kept(int(i)) && !batched_ && !whole(i))
        s += ind + "alignas(16) " + stype(int(i)) + " L" + std::to_string(i) + "[" + V + "];\n" + ind + "kiln_load_vec<" + V + ">(L" +
             std::to_string(i) + ", q" + std::to_string(i) + " + j);\n";
    return s;
  }
  std::string vindex(int i) const {
    std::string si = std::to_string(i);
    return "(q" + si + " + (j + u) * s" + si + ")";
  }
  template <class Pred, class Ld, class Ix, class St>
  std::string stores_where(ValueEmitter& ve, const std::string& ind, Pred&& pred, Ld&& ld, Ix&& ix, St&& st) {
    std::string body, tail;
    for (size_t s = 0; s < k_.stores.size(); ++s) {
      if (!pred(s)) continue;
      std::string v = ve.value(k_.stores[s].value, body, ind, ld, ix);
      tail += ind + st(slot_of_store(s), to_storage(g_.nodes[size_t(k_.stores[s].buffer)].dtype, v), v) + ";\n";
    }
    return body + tail;
  }
  // Statements for one element (scalar) or one V-chunk (vector) of the domain at inner index j.
  template <class Pred>
  std::string element(ValueEmitter& ve, const std::string& ind, Pred&& pred, bool vec) {
    if (!vec) {
      auto saved = ve.save();
      std::string s = stores_where(ve, ind, pred, [&](int i) { return load(i); }, [&](int i) { return index(i); },
                                   [&](int i, const std::string& v, const std::string&) { std::string si = std::to_string(i); return "q" + si + "[j * s" + si + "] = " + v; });
      ve.restore(saved);
      return s;
    }
    // 16-bit float outputs are kept as floats (F<i>) and converted two at a time as they are stored.
    std::string V = std::to_string(v_.vec), s;
    auto half = [&](int i) { return slot_dtype(i) == DType::bf16 || slot_dtype(i) == DType::f16; };
    for (size_t i = 0; i < l_.slots.size(); ++i)
      if (l_.slots[i].role == SlotRole::store && pred(size_t(l_.slots[i].store)))
        s += ind + (half(int(i)) ? "float F" : "alignas(16) " + stype(int(i)) + " O") + std::to_string(i) + "[" + V + "];\n";
    auto saved = ve.save();
    used_.assign(l_.slots.size(), 0);
    std::string body = stores_where(ve, ind + "  ", pred, [&](int i) { return vload(i); }, [&](int i) { return vindex(i); },
                                    [&](int i, const std::string& v, const std::string& raw) {
                                      return (half(i) ? "F" : "O") + std::to_string(i) + "[u] = " + (half(i) ? raw : v);
                                    });
    s = chunk_loads(ind) + s + ind + "#pragma unroll\n" + ind + "for (int u = 0; u < " + V + "; ++u) {\n" + body + ind + "}\n";
    ve.restore(saved);
    const std::string stream = v_.stream ? "true" : "false";
    for (size_t i = 0; i < l_.slots.size(); ++i) {
      if (l_.slots[i].role != SlotRole::store || !pred(size_t(l_.slots[i].store))) continue;
      std::string si = std::to_string(i);
      if (half(int(i)))
        s += ind + "kiln_store_vec_from_f32<" + V + ", " + (slot_dtype(int(i)) == DType::bf16 ? "true" : "false") + ", " + stream + ">(q" + si +
             " + j, F" + si + ");\n";
      else
        s += ind + (v_.stream ? "kiln_store_vec_stream<" : "kiln_store_vec<") + V + ">(q" + si + " + j, O" + si + ");\n";
    }
    return s;
  }

  std::string pointwise() {
    ValueEmitter ve(g_, k_, l_);
    auto all = [](size_t) { return true; };
    std::string s = "  int64_t n = 1; for (int d = 0; d < nd; ++d) n *= sz[d];\n";
    s += "  const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nthreads = (int64_t)gridDim.x * blockDim.x;\n";
    if (v_.vec && v_.vec_rows) {  // every slot contiguous or broadcast along the innermost dim, rows aligned
      std::string V = std::to_string(v_.vec);
      s += "  const int64_t inner = sz[nd - 1];\n";
      s += "  for (int64_t i = tid * " + V + "; i < n; i += nthreads * " + V + ") {\n";
      // Slots contiguous over every dim: their chunks at the flat index, loaded before the
      // division that finds the row (so those loads do not wait for it; NVVM divides in 32
      // bits where both operands fit, about 20 instructions).
      for (size_t k = 0; k < l_.slots.size(); ++k)
        if (whole(k) && l_.slots[k].role == SlotRole::load) {
          std::string sk = std::to_string(k);
          s += "    alignas(16) " + stype(int(k)) + " L" + sk + "[" + V + "];\n    kiln_load_vec<" + V + ">(L" + sk + ", b" + sk + " + i);\n";
        }
      s += "    const int64_t r = i / inner, j = i - r * inner;\n";
      s += offsets("r", "0", "nd - 1", "o", "    ");
      for (size_t k = 0; k < l_.slots.size(); ++k)  // at the flat index: q + j is b + i
        if (whole(k)) s += "    o" + std::to_string(k) + " = i - j;\n";
      s += bases("    ", "o#");
      return s + element(ve, "    ", all, true) + "  }\n";
    }
    if (v_.vec) {  // one innermost dim (or none), every slot contiguous or broadcast, aligned
      std::string V = std::to_string(v_.vec);
      s += bases("  ", "0");
      s += "  for (int64_t j = tid * " + V + "; j < n; j += nthreads * " + V + ") {\n";
      s += "    if (j + " + V + " <= n) {\n" + element(ve, "      ", all, true) + "    } else {\n";
      s += "      for (int64_t jj = j; jj < n; ++jj) {\n        const int64_t j = jj;\n" + element(ve, "        ", all, false) + "      }\n    }\n  }\n";
      return s;
    }
    s += "  const int64_t inner = nd ? sz[nd - 1] : 1;\n";
    s += "  for (int64_t i = tid; i < n; i += nthreads) {\n";
    s += "    const int64_t r = nd > 1 ? i / inner : 0, j = i - r * inner;\n";
    s += offsets("r", "0", "nd - 1", "o", "    ");
    s += bases("    ", "o#");
    s += element(ve, "    ", all, false);
    return s + "  }\n";
  }

  // Pointwise over rows: slot i contiguous over every dim (GpuVariant::whole), its chunk
  // loaded at the flat index ahead of the statements.
  bool whole(size_t i) const { return i < 32 && (v_.whole >> i & 1u); }
  // Persistent rows keep in registers the slots the reductions read; the rest
  // (weights read only by the final pass, say) are loaded where they are used, or with the
  // row (GpuVariant::preload), so that their loads are in flight during the reductions.
  bool kept(int i) const { return v_.persist && i < int(kept_.size()) && kept_[size_t(i)]; }
  void find_kept() {
    kept_.assign(l_.slots.size(), 0);
    std::vector<int> stack;
    for (int r : k_.reduces) stack.push_back(g_.arg(g_.nodes[size_t(r)], 0));
    std::vector<uint8_t> seen(g_.nodes.size(), 0);
    ValueEmitter probe(g_, k_, l_);
    while (!stack.empty()) {
      int id = stack.back();
      stack.pop_back();
      if (seen[size_t(id)]) continue;
      seen[size_t(id)] = 1;
      if (int sl = probe.slot_of(id, SlotRole::load); sl >= 0) {
        kept_[size_t(sl)] = v_.strides[size_t(sl)] == Stride::unit;
        continue;
      }
      if (std::find(k_.reduces.begin(), k_.reduces.end(), id) != k_.reduces.end()) continue;
      const ir::Node& n = g_.nodes[size_t(id)];
      for (int a = 0; a < n.nargs; ++a) stack.push_back(g_.arg(n, a));
    }
    if (v_.preload)  // 2: kept, though only the stores read it (loaded after the reductions' slots)
      for (size_t i = 0; i < l_.slots.size(); ++i)
        if (!kept_[i] && l_.slots[i].role == SlotRole::load && v_.strides[i] == Stride::unit) kept_[i] = 2;
  }

  // The nodes a pass computes element by element from `roots`: not loads, scalars,
  // reductions or values the same for the whole row.
  std::vector<uint8_t> element_nodes(const ValueEmitter& ve, std::vector<int> roots) const {
    std::vector<uint8_t> seen(g_.nodes.size(), 0);
    while (!roots.empty()) {
      int id = roots.back();
      roots.pop_back();
      if (seen[size_t(id)] || ve.slot_of(id, SlotRole::load) >= 0 || ve.param_of(id) >= 0 || ve.row_level(id)) continue;
      seen[size_t(id)] = 1;
      const ir::Node& n = g_.nodes[size_t(id)];
      for (int a = 0; a < n.nargs; ++a) roots.push_back(g_.arg(n, a));
    }
    return seen;
  }
  // One-pass online softmax for rows read from memory each pass: a sum of exp(e - M), with M
  // the row max of the same e one pass before, moves into M's pass (a running sum rescaled
  // when the running max grows), so the row is read twice (max and sum, then the stores),
  // not three times. Sets level_ (the pass of each reduction), online_ (per reduction: the
  // index of the max its online sum goes with, or -1) and folded_ (per reduction: the value
  // each element folds in; an online sum's is its max's argument e). Rows kept in registers and split
  // rows keep the two passes (nothing to save; the split combine is of plain partials).
  void find_online_sums() {
    level_ = k_.reduce_level;
    online_.assign(k_.reduces.size(), -1);
    folded_.clear();
    for (int r : k_.reduces) folded_.push_back(g_.arg(g_.nodes[size_t(r)], 0));
    if (v_.persist || v_.split) return;
    auto index = [&](int id) { return int(std::find(k_.reduces.begin(), k_.reduces.end(), id) - k_.reduces.begin()); };
    auto through_expand = [&](int id) {
      while (g_.nodes[size_t(id)].op == Prim::expand) id = g_.arg(g_.nodes[size_t(id)], 0);
      return id;
    };
    for (size_t i = 0; i < k_.reduces.size(); ++i) {
      const ir::Node& sum = g_.nodes[size_t(k_.reduces[i])];
      if (sum.op != Prim::sum || !info(sum.dtype).is_float) continue;
      const ir::Node& e = g_.nodes[size_t(g_.arg(sum, 0))];
      if (e.op != Prim::exp || e.dtype != sum.dtype) continue;
      const ir::Node& d = g_.nodes[size_t(g_.arg(e, 0))];
      if (d.op != Prim::sub) continue;
      int j = index(through_expand(g_.arg(d, 1)));
      if (j == int(k_.reduces.size())) continue;
      const ir::Node& max = g_.nodes[size_t(k_.reduces[size_t(j)])];
      if (max.op != Prim::amax || max.dtype != sum.dtype || g_.arg(max, 0) != g_.arg(d, 0) || level_[size_t(j)] + 1 != level_[i]) continue;
      online_[i] = j, folded_[i] = g_.arg(d, 0);
    }
    for (size_t i = 0; i < k_.reduces.size(); ++i) {
      if (online_[i] < 0) continue;
      int from = level_[i];
      level_[i] = level_[size_t(online_[i])];
      if (std::find(level_.begin(), level_.end(), from) == level_.end())  // its pass is empty now
        for (int& l : level_) l -= l > from;
    }
  }
  // Rows in registers: per pass, the transcendental values (exp, log, erf, ...) it computes
  // that a later pass needs again, kept a register each (C<id>[k][u]) instead of computed
  // twice (softmax's exp(x - max): its sum's pass, then the store pass).
  std::vector<std::vector<int>> carried_values(const ValueEmitter& ve, int passes) const {
    std::vector<std::vector<int>> out(static_cast<size_t>(passes));
    if (!v_.persist) return out;
    std::vector<std::vector<uint8_t>> at;  // per pass, then the store pass
    for (int p = 0; p <= passes; ++p) {
      std::vector<int> roots;
      for (size_t i = 0; i < k_.reduces.size(); ++i)
        if (level_[i] == p) roots.push_back(g_.arg(g_.nodes[size_t(k_.reduces[i])], 0));
      if (p == passes)
        for (size_t i = 0; i < k_.stores.size(); ++i)
          if (!k_.row_level_[i]) roots.push_back(k_.stores[i].value);
      at.push_back(element_nodes(ve, roots));
    }
    std::vector<uint8_t> taken(g_.nodes.size(), 0);
    for (int p = 0; p < passes; ++p)
      for (size_t id = 0; id < g_.nodes.size(); ++id) {
        if (!is_transcendental(g_.nodes[id].op) || taken[id] || !at[size_t(p)][id]) continue;
        for (int q = p + 1; q <= passes && !taken[id]; ++q) taken[id] = at[size_t(q)][id];
        if (taken[id]) out[size_t(p)].push_back(int(id));
      }
    return out;
  }

  // Rows whose reduced extent is several dims (vec_rows): the V-chunks c = lo + lane * V,
  // c + step, ... of the flattened extent, each within one row of the innermost dim (whose
  // size is whole chunks; lo and hi are chunk bounds), so no scalar tail. A cursor (ir, jc):
  // the chunk's row of the outer reduced dims and its start within that row, moved by step
  // without a division; each chunk's offsets over the outer reduced dims (no division for
  // one such dim). Batches of U chunks, every 16-byte load of a batch issued before any is
  // used, as in the single-dim loop; the rest one chunk at a time.
  std::string chunked_rows_loop(const std::function<std::string()>& vec_body) {
    const std::string V = std::to_string(v_.vec);
    std::string t = "    const int64_t step = (int64_t)gsize * " + V + ", dq = inner ? step / inner : 0, dr = step - dq * inner;\n";
    t += "    int64_t c0 = lo + (int64_t)lane * " + V + ", ir = inner ? c0 / inner : 0, jc = c0 - ir * inner;\n";
    const std::string advance = "jc += dr, ir += dq; if (jc >= inner) jc -= inner, ++ir;\n";
    batched_ = true;
    std::string batch = vec_body();
    batched_ = false;
    int nread = int(std::count(used_.begin(), used_.end(), uint8_t(1))), U = nread ? std::max(1, 4 / nread) : 1;
    if (U > 1) {
      const std::string Us = std::to_string(U);
      t += "    for (; c0 + " + std::to_string(U - 1) + " * step < hi; c0 += " + Us + " * step) {\n";
      t += "      int64_t kj[" + Us + "];\n";
      for (size_t i = 0; i < l_.slots.size(); ++i) t += "      int64_t kf" + std::to_string(i) + "[" + Us + "];\n";
      t += "#pragma unroll\n      for (int k = 0; k < " + Us + "; ++k) {\n";
      t += offsets("ir", "no", "nd - 1", "i", "        ") + "        kj[k] = jc;\n";
      for (size_t i = 0; i < l_.slots.size(); ++i) {
        std::string si = std::to_string(i);
        t += "        kf" + si + "[k] = o" + si + " + i" + si + ";\n";
      }
      t += "        " + advance + "      }\n";
      for (size_t i = 0; i < l_.slots.size(); ++i) {
        if (!used_[i]) continue;
        std::string si = std::to_string(i);
        t += "      alignas(16) " + stype(int(i)) + " L" + si + "[" + Us + "][" + V + "];\n";
        t += "#pragma unroll\n      for (int k = 0; k < " + Us + "; ++k) kiln_load_vec<" + V + ">(L" + si + "[k], b" + si + " + kf" + si +
             "[k] + kj[k]);\n";
      }
      t += "#pragma unroll\n      for (int k = 0; k < " + Us + "; ++k) {\n        const int64_t j = kj[k];\n" + bases("        ", "kf#[k]") + batch +
           "      }\n    }\n";
    }
    t += "    for (; c0 < hi; c0 += step) {\n      const int64_t j = jc;\n" + offsets("ir", "no", "nd - 1", "i", "      ");
    t += bases("      ", "o# + i#") + vec_body() + "      " + advance + "    }\n";
    return t;
  }

  std::string rows() {
    if (v_.cols) return cols();
    find_kept();
    find_online_sums();
    ValueEmitter ve(g_, k_, l_);
    ve.reciprocal_of_row_values();
    int passes = 0;
    for (int lvl : level_) passes = std::max(passes, lvl + 1);
    std::string s;
    std::string V = std::to_string(v_.vec ? v_.vec : 1), G = std::to_string(v_.group);
    s += "  int64_t outer = 1, irows = 1;\n  for (int d = 0; d < no; ++d) outer *= sz[d];\n  for (int d = no; d + 1 < nd; ++d) irows *= sz[d];\n";
    if (v_.group) {  // G lanes per row; lanes of a row past the last keep to the shuffles, reading nothing
      s += "  const int64_t r0 = (int64_t)blockIdx.x * (blockDim.x / " + G + ") + threadIdx.x / " + G + ";\n";
      s += "  const bool live = r0 < outer;\n  const int64_t r = live ? r0 : outer - 1;\n";
      s += "  const int lane = threadIdx.x % " + G + ", gsize = " + G + ";\n";
      s += "  if (outer == 0 || (" + G + " == KILN_WARP && !live)) return;\n";
    } else if (v_.split) {  // gridDim.x / outer blocks per row, each over one span of it
      s += "  const bool live = true;\n  const int64_t split = (int64_t)gridDim.x / outer, r = blockIdx.x / split, part = blockIdx.x % split;\n";
      s += "  const int lane = threadIdx.x, gsize = blockDim.x;\n";
    } else {
      s += "  const bool live = true;\n  const int64_t r = blockIdx.x;\n";
      s += v_.exact ? "  const int lane = threadIdx.x;\n  constexpr int gsize = " + std::to_string(v_.threads) + ";\n"
                    : "  const int lane = threadIdx.x, gsize = blockDim.x;\n";
      s += "  if (r >= outer) return;\n";
    }
    s += "  const int64_t inner = !live ? 0 : nd > no ? sz[nd - 1] : 1;\n";
    if (v_.split)  // spans of whole V-chunks, so that each starts aligned
      s += "  const int64_t span = ((irows * inner + split - 1) / split + " + V + " - 1) / " + V + " * " + V +
           ", lo = part * span, hi = lo + span < irows * inner ? lo + span : irows * inner;\n";
    else
      s += "  const int64_t lo = 0, hi = irows * inner;\n";
    const std::string P = std::to_string(v_.persist);
    s += offsets("r", "0", "no", "o", "  ");
    if (v_.persist) {  // load the row once: the slots the reductions read first, then the others kept
      s += bases("  ", "o#");
      for (int round : {1, 2}) {
        for (size_t i = 0; i < l_.slots.size(); ++i) {
          if (kept_[i] != round) continue;
          std::string si = std::to_string(i);
          s += "  alignas(16) " + stype(int(i)) + " L" + si + "[" + P + "][" + V + "];\n";
          s += "#pragma unroll\n  for (int k = 0; k < " + P + "; ++k) {\n    const int64_t j = ((int64_t)lane + (int64_t)k * gsize) * " + V +
               ";\n    " + (v_.exact ? "" : "if (j < inner) ") +
               (v_.stream ? "kiln_load_vec_stream<" : v_.keep ? "kiln_load_vec_keep<" : "kiln_load_vec<") + V + ">(L" + si + "[k], q" + si +
               " + j);\n  }\n";
        }
      }
    }
    // The loop over one row's elements; the body sees q<i> and j. vec_body() gives the
    // statements for the V-chunk at j (batched_: for chunk k of a batch already loaded).
    auto row_loop = [&](const std::string& body_scalar, const std::function<std::string()>& vec_body) {
      std::string t;
      if (v_.persist) {  // the row's chunks are in registers: L<i>[k]
        t += "#pragma unroll\n    for (int k = 0; k < " + std::to_string(v_.persist) + "; ++k) {\n";
        t += "      const int64_t j = ((int64_t)lane + (int64_t)k * gsize) * " + V + ";\n";
        t += (v_.exact ? "      (void)j;\n      {\n" : "      if (j < inner) {\n") + vec_body() + "      }\n    }\n";
      } else if (v_.vec && v_.vec_rows) {
        t += chunked_rows_loop(vec_body);
      } else if (v_.vec) {  // single inner dim (hi == inner), contiguous, aligned: V-wide steps, scalar tail
        t += bases("    ", "o#");
        t += "    const int64_t step = (int64_t)gsize * " + V + ";\n    int64_t j0 = lo + (int64_t)lane * " + V + ";\n";
        // Batches of U chunks per lane, every load of a batch issued before any is used (a
        // load per iteration leaves one 16-byte load in flight per thread); U chunks of all the
        // slots read stay under four, to keep registers for occupancy.
        batched_ = true;
        std::string batch = vec_body();
        batched_ = false;
        int nread = int(std::count(used_.begin(), used_.end(), uint8_t(1))), U = nread ? std::max(1, 4 / nread) : 1;
        if (U > 1) {
          std::string Us = std::to_string(U);
          t += "    for (; j0 + " + std::to_string(U - 1) + " * step + " + V + " <= hi; j0 += " + Us + " * step) {\n";
          for (size_t i = 0; i < l_.slots.size(); ++i) {
            if (!used_[i]) continue;
            std::string si = std::to_string(i);
            t += "      alignas(16) " + stype(int(i)) + " L" + si + "[" + Us + "][" + V + "];\n";
            t += "#pragma unroll\n      for (int k = 0; k < " + Us + "; ++k) kiln_load_vec<" + V + ">(L" + si + "[k], q" + si + " + j0 + k * step);\n";
          }
          t += "#pragma unroll\n      for (int k = 0; k < " + Us + "; ++k) {\n        const int64_t j = j0 + k * step;\n" + batch + "      }\n    }\n";
        }
        t += std::string(U > 1 ? "" : "#pragma unroll 4\n") + "    for (int64_t j = j0; j < hi; j += step) {\n";
        t += "      if (j + " + V + " <= hi) {\n" + vec_body() + "      } else {\n";
        t += "        for (int64_t jj = j; jj < hi; ++jj) {\n          const int64_t j = jj;\n" + body_scalar + "        }\n      }\n    }\n";
      } else {
        t += "    for (int64_t c = lo + lane; c < hi; c += gsize) {\n";
        t += "      const int64_t ir = irows > 1 ? c / inner : 0, j = c - ir * inner;\n";
        t += offsets("ir", "no", "nd - 1", "i", "      ");
        t += bases("      ", "o# + i#");
        t += body_scalar + "    }\n";
      }
      return t;
    };
    const std::vector<std::vector<int>> carried = carried_values(ve, passes);
    for (int p = 0; p < passes; ++p) {
      std::vector<size_t> mine;
      for (size_t i = 0; i < k_.reduces.size(); ++i)
        if (level_[i] == p) mine.push_back(i);
      auto upd = [&](const std::string& ind, bool vec) {
        std::string body, tail, online;
        auto saved = ve.save();
        auto vl = [&](int x) { return vload(x); };
        auto vi = [&](int x) { return vindex(x); };
        for (size_t i : mine) {
          int id = k_.reduces[i];
          const ir::Node& n = g_.nodes[size_t(id)];
          // An online sum's update goes before its max's own (it reads the running max before it grows).
          std::string v = vec ? ve.value(folded_[i], body, ind, vl, vi)
                              : ve.value(folded_[i], body, ind, [&](int x) { return load(x); }, [&](int x) { return index(x); });
          std::string a = "a" + std::to_string(id);
          if (online_[i] >= 0)
            online += ind + a + " = kiln_online_sum(" + a + ", a" + std::to_string(k_.reduces[size_t(online_[i])]) + ", " + v + ");\n";
          else
            tail += ind + a + " = " + op_name(n.op) + "()(" + a + ", " + v + ");\n";
        }
        tail = online + tail;
        if (vec)
          for (int id : carried[size_t(p)]) tail += ind + "C" + std::to_string(id) + "[k][u] = " + ve.value(id, body, ind, vl, vi) + ";\n";
        ve.restore(saved);
        return body + tail;
      };
      for (size_t i : mine) {
        int id = k_.reduces[i];
        const ir::Node& n = g_.nodes[size_t(id)];
        s += "  " + compute_type(n.dtype) + " a" + std::to_string(id) + " = " + ident(n) + ";\n";
      }
      for (int id : carried[size_t(p)])
        s += "  " + compute_type(g_.nodes[size_t(id)].dtype) + " C" + std::to_string(id) + "[" + P + "][" + V + "];\n";
      auto vec_body = [&] {
        used_.assign(l_.slots.size(), 0);
        std::string u = "#pragma unroll\n        for (int u = 0; u < " + V + "; ++u) {\n" + upd("          ", true) + "        }\n";
        return chunk_loads("        ") + u;
      };
      s += "  {\n" + row_loop(upd(v_.vec ? "          " : "      ", false), vec_body) + "  }\n";
      for (size_t i : mine) {
        int id = k_.reduces[i];
        const ir::Node& n = g_.nodes[size_t(id)];
        std::string a = "a" + std::to_string(id);
        if (online_[i] >= 0)  // the lane's sum relative to the row's max (reduced first: reductions are in post-order)
          a = "kiln_online_rescale(" + a + ", a" + std::to_string(k_.reduces[size_t(online_[i])]) + ", r" +
              std::to_string(k_.reduces[size_t(online_[i])]) + ")";
        s += "  " + std::string(v_.split ? "" : "const ") + compute_type(n.dtype) + " r" + std::to_string(id) + " = " +
             (v_.group ? "kiln_group_reduce<" + G + ">(" + a + ", " + op_name(n.op) + "())"
                        : "kiln_block_reduce<" + std::to_string(sites_++) + ">(" + a + ", " + op_name(n.op) + "(), " + ident(n) + ")") + ";\n";
        ve.bind(id, "r" + std::to_string(id));
      }
      for (int id : carried[size_t(p)]) ve.bind(id, "C" + std::to_string(id) + "[k][u]");
      if (v_.split) s += combine_split(mine);
    }
    bool any_full = false;
    for (size_t i = 0; i < k_.stores.size(); ++i) any_full |= !k_.row_level_[i];
    auto full = [&](size_t i) { return !k_.row_level_[i]; };
    if (any_full)
      s += "  {\n" + row_loop(element(ve, v_.vec ? "          " : "      ", full, false), [&] { return element(ve, "        ", full, true); }) + "  }\n";
    s += "  if (lane == 0 && live) {\n" + bases("    ", "o#") + "    const int64_t j = 0; (void)j;\n";
    s += element(ve, "    ", [&](size_t i) { return bool(k_.row_level_[i]); }, false);
    return s + "  }\n";
  }
  // Column rows: the one reduced dim nd - 1 strided, the kept dims 0 .. no - 1 with the last
  // contiguous. A thread holds V consecutive columns (with V > 1 one 16-byte load per row and
  // slot) and walks the rows of its row group, the loads of U rows issued before any is used;
  // a block is KILN_WARP column lanes by `kiln_groups` row groups, combined through shared
  // memory in a fixed order. Split: blockIdx.y is one of gridDim.y equal parts of the rows;
  // each block leaves its partials in the workspace and the last block of a column block to
  // finish combines them, parts in a fixed order (the same sums on every run).
  std::string cols() {
    ValueEmitter ve(g_, k_, l_);
    ve.reciprocal_of_row_values();
    const int V = std::max(v_.vec, 1);
    const std::string Vs = std::to_string(V);
    std::string s = "  constexpr int kiln_groups = " + std::to_string(v_.threads) + " / KILN_WARP;\n";
    s += "  int64_t outer = 1;\n  for (int d = 0; d < no; ++d) outer *= sz[d];\n";
    s += "  const int64_t rows = sz[nd - 1], parts = gridDim.y, part = blockIdx.y;\n";
    s += "  const int lane = threadIdx.x % KILN_WARP, grp = threadIdx.x / KILN_WARP;\n";
    s += "  const int64_t r0 = ((int64_t)blockIdx.x * KILN_WARP + lane) * " + Vs + ";\n";
    s += "  const bool live = r0 < outer;\n  const int64_t r = live ? r0 : 0;\n";
    s += "  const int64_t span = (rows + parts - 1) / parts, lo = part * span;\n";
    s += "  const int64_t hi = !live ? lo : lo + span < rows ? lo + span : rows;\n";
    s += offsets("r", "0", "no", "o", "  ");
    s += bases("  ", "o#");
    if (V > 1)  // each slot's step along the kept dim (1 for the loads: the host checks it)
      for (size_t i = 0; i < l_.slots.size(); ++i) {
        std::string si = std::to_string(i);
        s += "  const int64_t c" + si + " = st[" + si + " * nd + no - 1]; (void)c" + si + ";\n";
      }
    std::string col = V > 1 ? " + u * c" : "";
    for (int id : k_.reduces) {
      const ir::Node& n = g_.nodes[size_t(id)];
      std::string a = "a" + std::to_string(id);
      s += "  " + compute_type(n.dtype) + " " + a + "[" + Vs + "];\n#pragma unroll\n  for (int u = 0; u < " + Vs + "; ++u) " + a +
           "[u] = " + ident(n) + ";\n";
    }
    // Row j + k * kiln_groups, column u: the value of each reduction's argument, folded in.
    std::vector<uint8_t> used(l_.slots.size(), 0);
    std::string body, tail;
    {
      auto saved = ve.save();
      const std::string ind = "          ";
      auto ld = [&](int i) {
        used[size_t(i)] = 1;
        std::string li = "L" + std::to_string(i) + "[k]";
        return V > 1 ? vec_element(slot_dtype(i), li, "u") : to_compute(slot_dtype(i), li + "[u]");
      };
      auto ix = [&](int i) {
        std::string si = std::to_string(i);
        return "(q" + si + " + (j + k * kiln_groups) * s" + si + (V > 1 ? " + u * c" + si : "") + ")";
      };
      for (int id : k_.reduces) {
        const ir::Node& n = g_.nodes[size_t(id)];
        std::string v = ve.value(g_.arg(n, 0), body, ind, ld, ix), a = "a" + std::to_string(id) + "[u]";
        tail += ind + a + " = " + op_name(n.op) + "()(" + a + ", " + v + ");\n";
      }
      ve.restore(saved);
      body += tail;
    }
    // U rows per batch: about 64 bytes of loads in flight per thread (16-byte chunks) or
    // eight scalars, shared by the slots read.
    int nread = int(std::count(used.begin(), used.end(), uint8_t(1)));
    int U = std::max(1, (V > 1 ? 4 : 8) / std::max(nread, 1));
    // Rows j + k * kiln_groups, k < U: every load issued, then folded in row order (`guard`:
    // only the rows before hi).
    const std::string Us = std::to_string(U);
    auto batch = [&](bool guard, const std::string& ind) {
      std::string t, when = guard ? "if (j + k * kiln_groups < hi) " : "";
      for (size_t i = 0; i < l_.slots.size(); ++i) {
        if (!used[i]) continue;
        std::string si = std::to_string(i), row = "(j + k * kiln_groups) * s" + si;
        t += ind + "alignas(16) " + stype(int(i)) + " L" + si + "[" + Us + "][" + Vs + "];\n";
        t += "#pragma unroll\n" + ind + "for (int k = 0; k < " + Us + "; ++k) " + when +
             (V > 1 ? "kiln_load_vec<" + Vs + ">(L" + si + "[k], q" + si + " + " + row + ");\n" : "L" + si + "[k][0] = q" + si + "[" + row + "];\n");
      }
      t += "#pragma unroll\n" + ind + "for (int k = 0; k < " + Us + "; ++k) " + when + "{\n#pragma unroll\n" + ind + "  for (int u = 0; u < " + Vs +
           "; ++u) {\n" + body + ind + "  }\n" + ind + "}\n";
      return t;
    };
    s += "  {\n    int64_t j = lo + grp;\n";
    s += "    for (; j + " + std::to_string(U - 1) + " * kiln_groups < hi; j += " + Us + " * kiln_groups) {\n" + batch(false, "      ") + "    }\n";
    if (U > 1)  // fewer than U rows left: one batch still, its loads guarded
      s += "    if (j < hi) {\n" + batch(true, "      ") + "    }\n";
    s += "  }\n";
    for (int id : k_.reduces)
      s += "  kiln_cols_reduce<" + Vs + ", kiln_groups>(a" + std::to_string(id) + ", " + op_name(g_.nodes[size_t(id)].op) + "());\n";
    if (v_.split) s += combine_cols(V);
    s += "  if (grp == 0 && live) {\n#pragma unroll\n    for (int u = 0; u < " + Vs + "; ++u) {\n";
    s += bases("      ", V > 1 ? "o# + u * c#" : "o#") + "      const int64_t j = 0; (void)j;\n";
    for (int id : k_.reduces) ve.bind(id, "a" + std::to_string(id) + "[u]");
    s += element(ve, "      ", [](size_t) { return true; }, false);
    return s + "    }\n  }\n";
  }
  // Split column rows, after each block's own combine: row group 0's V columns per lane to
  // the workspace (reduction q's values of column block x, part p at region q, entry
  // x * parts + p, KILN_WARP * V wide); the last block of the column block to arrive reads
  // the parts back, row group g parts g, g + kiln_groups, ..., and combines them as the rows
  // were; it resets the column block's counter for the next launch.
  std::string combine_cols(int V) {
    std::string Vs = std::to_string(V);
    std::string s = "  kiln_u64* const kiln_part = (kiln_u64*)args.ws[0];\n  unsigned* const kiln_count = (unsigned*)args.ws[1];\n";
    s += "  const int64_t kiln_width = (int64_t)KILN_WARP * " + Vs + ", kiln_region = (int64_t)gridDim.x * parts * kiln_width;\n";
    auto at = [&](size_t q, const std::string& t, const std::string& p) {
      return "(" + t + "*)(kiln_part + " + std::to_string(q) + " * kiln_region) + ((int64_t)blockIdx.x * parts + " + p +
             ") * kiln_width + lane * " + Vs;
    };
    s += "  if (grp == 0 && live) {\n";
    for (size_t q = 0; q < k_.reduces.size(); ++q) {
      int id = k_.reduces[q];
      std::string t = compute_type(g_.nodes[size_t(id)].dtype), qs = std::to_string(q);
      s += "    " + t + "* const w" + qs + " = " + at(q, t, "part") + ";\n";
      s += "#pragma unroll\n    for (int u = 0; u < " + Vs + "; ++u) w" + qs + "[u] = a" + std::to_string(id) + "[u];\n";
    }
    s += "  }\n  __threadfence();\n  __syncthreads();\n  __shared__ int kiln_last;\n";
    s += "  if (threadIdx.x == 0) kiln_last = atomicAdd(kiln_count + blockIdx.x, 1u) == (unsigned)(parts - 1);\n";
    s += "  __syncthreads();\n  if (!kiln_last) return;\n  __threadfence();\n";
    for (size_t q = 0; q < k_.reduces.size(); ++q) {
      int id = k_.reduces[q];
      const ir::Node& n = g_.nodes[size_t(id)];
      std::string t = compute_type(n.dtype), a = "a" + std::to_string(id);
      s += "#pragma unroll\n  for (int u = 0; u < " + Vs + "; ++u) " + a + "[u] = " + ident(n) + ";\n";
      s += "#pragma unroll 4\n  for (int64_t b = grp; live && b < parts; b += kiln_groups) {\n";
      s += "    const " + t + "* const w = " + at(q, "const " + t, "b") + ";\n";
      s += "#pragma unroll\n    for (int u = 0; u < " + Vs + "; ++u) " + a + "[u] = " + op_name(n.op) + "()(" + a + "[u], kiln_load_coherent(w + u));\n  }\n";
      s += "  kiln_cols_reduce<" + Vs + ", kiln_groups>(" + a + ", " + op_name(n.op) + "());\n";
    }
    return s + "  if (threadIdx.x == 0) kiln_count[blockIdx.x] = 0;\n";
  }
  // Split rows, after the block's own reduction: its partials to the workspace; the last
  // block of the row to arrive combines all of them, in a fixed order (the same sums on
  // every run), and resets the row's counter for the next launch; the others are done.
  std::string combine_split(const std::vector<size_t>& mine) {
    std::string nr = std::to_string(mine.size());
    std::string s = "  kiln_u64* const kiln_part = (kiln_u64*)args.ws[0];\n  unsigned* const kiln_count = (unsigned*)args.ws[1];\n";
    s += "  __shared__ int kiln_last;\n  if (threadIdx.x == 0) {\n";
    for (size_t q = 0; q < mine.size(); ++q) {
      int id = k_.reduces[mine[q]];
      s += "    *(" + compute_type(g_.nodes[size_t(id)].dtype) + "*)&kiln_part[(r * split + part) * " + nr + " + " + std::to_string(q) +
           "] = r" + std::to_string(id) + ";\n";
    }
    s += "    __threadfence();\n    kiln_last = atomicAdd(kiln_count + r, 1u) == (unsigned)(split - 1);\n  }\n";
    s += "  __syncthreads();\n  if (!kiln_last) return;\n  __threadfence();\n";
    for (size_t q = 0; q < mine.size(); ++q) {
      int id = k_.reduces[mine[q]];
      const ir::Node& n = g_.nodes[size_t(id)];
      std::string t = compute_type(n.dtype), a = "c" + std::to_string(id);
      s += "  {\n    " + t + " " + a + " = " + ident(n) + ";\n";
      s += "    for (int64_t b = threadIdx.x; b < split; b += blockDim.x) " + a + " = " + op_name(n.op) + "()(" + a +
           ", *(volatile " + t + "*)&kiln_part[(r * split + b) * " + nr + " + " + std::to_string(q) + "]);\n";
      s += "    r" + std::to_string(id) + " = kiln_block_reduce<" + std::to_string(sites_++) + ">(" + a + ", " + op_name(n.op) + "(), " + ident(n) + ");\n  }\n";
    }
    return s + "  if (threadIdx.x == 0) kiln_count[r] = 0;\n";
  }
  static std::string op_name(Prim p) { return p == Prim::sum ? "KilnSum" : p == Prim::amax ? "KilnMax" : "KilnMin"; }
  static std::string ident(const ir::Node& n) {
    std::string s = reduce_identity(n.op, n.dtype);
    for (const char* m : {"INT32_MIN", "INT32_MAX", "INT64_MIN", "INT64_MAX"})
      if (auto p = s.find(m); p != std::string::npos) s.replace(p, std::string(m).size(), std::string("KILN_") + m);
    return s;
  }

  // The GEMM (codegen/gemm.hpp); every output element leaves through the epilogue (MatmulEpilogue::store).
  std::string matmul() {
    MatmulEpilogue ep(g_, k_, l_);
    GemmStore store = [&](const std::string& row, const std::string& col, const std::string& v, const std::string& sum) {
      return ep.store(row, col, v, "", false, sum);
    };
    std::string prelude = ep.prelude("blockIdx.z", "__restrict__", "  ");
    if (v_.gemm.kind == GemmKind::wgmma) {
      GemmGroupStore group;
      if (v_.epilogue_vec)
        group = [&](const std::string& row, const std::string& col, const std::string& vals, const std::string& tag, const std::string& sum) {
          return ep.store_group(row, col, vals, kGemmGroupWidth, v_.strides, tag, "        ", sum);
        };
      GemmColumnSums sums;
      sums.of_b = v_.colsum_of_b;
      if (const int c = v_.colsum_slot; c >= 0) {
        const DType d = g_.nodes[size_t(l_.slots[size_t(c)].node)].dtype;
        sums.format = d == DType::bf16 ? 0 : d == DType::f16 ? 1 : d == DType::f32 ? 2 : -1;
        if (sums.format < 0) throw Error("kiln: internal error: column sums of a " + std::string(info(d).name) + " matrix in a GEMM");
        const std::string C = std::to_string(c), out = storage_type(v_.colsum_dtype);
        sums.values = "p" + C + " + e" + C, sums.row_stride = "est[" + C + " * nd + nd - 2]";
        sums.store = [out, d = v_.colsum_dtype](const std::string& col, const std::string& v) {
          return "((" + out + "*)args.cs[0])[" + col + "] = " + to_storage(d, v) + ";";
        };
        if (!sums.of_b) ep.column_sum(c);
      }
      GemmTotal total;
      Layout rows;  // the total's rows kernel's (ep and the finish read it)
      if (v_.total_kernel >= 0) {
        if (!total_ || total_->reduces.size() != 1 || total_->stores.size() != 1 || !gemm_sums_total(v_.gemm))
          throw Error("kiln: internal error: a total in a " + v_.gemm.str() + " GEMM");
        rows = layout(g_, *total_);
        const ir::Node& red = g_.nodes[size_t(total_->reduces[0])];
        if (compute_type(red.dtype) != "float") throw Error("kiln: internal error: a GEMM's total in " + std::string(info(red.dtype).name));
        ep.total(g_.arg(red, 0), *total_, rows, "kiln_total");
        prelude += "  const uint64_t* const TA = (const uint64_t*)args.tt + " + std::to_string(kGpuTotalWords) + "; (void)TA;\n";
        total.finish = [&](const std::string& warp, const std::string& block_warps, const std::string& ind) {
          return total_finish(rows, warp, block_warps, ind);
        };
      }
      return WgmmaWriter(v_.gemm, v_.gemm_ops, ep.dtype(), store, group, sums, total).body(prelude);
    }
    GemmPrologue pro;
    pro.words = l_.words;
    if (v_.prologue) {
      if (v_.gemm.kind != GemmKind::simt && v_.gemm.kind != GemmKind::mfma)
        throw Error("kiln: internal error: a matmul prologue in a " + v_.gemm.str() + " GEMM");
      for (int o = 0; o < 2; ++o)
        if (int slot = k_.prologue_slot[size_t(o)]; slot >= 0 && (v_.prologue >> o & 1u))
          pro.slot[o] = slot, pro.storage[o] = stype(slot), pro.function[o] = prologue_name(o);
    }
    if (v_.gemm.kind == GemmKind::mfma) return MfmaWriter(v_.gemm, v_.gemm_ops, ep.dtype(), store, pro).body(prelude);
    return GemmWriter(v_.gemm, v_.gemm_ops, ep.dtype(), store, pro).body(prelude);
  }
  std::string prologue_name(int operand) const { return name_ + (operand ? "_pb" : "_pa"); }
  // GpuVariant::total_kernel: the warp hands its sum over; the last warp's lane 0 computes the rows
  // kernel's output from the total (its own arithmetic and params, read from TA) and stores it.
  std::string total_finish(const Layout& rows, const std::string& warp, const std::string& block_warps, const std::string& ind) const {
    ValueEmitter ve(g_, *total_, rows);
    ve.params_from("TA");
    ve.bind(total_->reduces[0], "kiln_t");
    auto none = [](int) -> std::string { throw Error("kiln: internal error: a GEMM's total reads a tensor after its sum"); };
    std::string body;
    const sched::Store& st = total_->stores[0];
    const std::string v = ve.value(st.value, body, ind + "    ", none, none);
    const DType d = g_.nodes[size_t(st.buffer)].dtype;
    return ind + "{\n" + ind + "  float kiln_t;\n" + ind + "  if (kiln_total_last(kiln_total, args.tw, " + warp + ", " + block_warps +
           ", kiln_t) && lane == 0) {\n" + body + ind + "    *(" + storage_type(d) + "*)args.tt[0] = " + to_storage(d, v) + ";\n" + ind +
           "  }\n" + ind + "}\n";
  }

  // GpuVariant::stage's kernel: 256 threads a block, a block per 32 x 32 tile of the staged
  // operands (A's tiles first), each copied K-major into its `st` buffer (kiln_stage_tile).
  // The operand's strides are the matmul meta's (slot 0: A [M, K], slot 1: B [K, N]).
  std::string stage_kernel() const {
    std::string s = "extern \"C\" __global__ void __launch_bounds__(256) " + name_ + "_stage(const " + name_ + "_args args) {\n";
    s += "  kiln_grid_begin();\n";
    s += "  const int64_t* M = args.m;\n  const int nd = (int)M[0];\n  const int64_t K = M[1], KP = (K + 3) / 4 * 4;\n";
    s += "  int64_t t = blockIdx.x;\n";
    for (int o = 0; o < 2; ++o) {
      if (!(v_.stage >> o & 1u)) continue;
      const std::string O = std::to_string(o);
      // rows: M of A (stride sa[nd-2]), N of B (sb[nd-1]); K: A's sa[nd-1], B's sb[nd-2]
      s += "  {\n    const int64_t* sz = M + 2;\n    const int64_t* so = sz + nd * " + std::to_string(1 + o) + ";\n";
      s += "    const int64_t R = sz[nd - " + std::string(o ? "1" : "2") + "], sr = so[nd - " + (o ? "1" : "2") + "], sk = so[nd - " +
           (o ? "2" : "1") + "];\n";
      s += "    const int64_t tr = (R + 31) / 32, tk = (KP + 31) / 32, nb = nd == 3 && so[0] != 0 ? sz[0] : 1;\n";
      s += "    if (t < nb * tr * tk) {\n      const int64_t b = t / (tr * tk), q = t % (tr * tk);\n";
      s += "      kiln_stage_tile((const float*)args.p[" + O + "] + (nb > 1 ? b * so[0] : 0), sr, sk, R, K, (float*)args.st[" + O +
           "] + b * R * KP, KP, q / tk * 32, q % tk * 32);\n      return;\n    }\n    t -= nb * tr * tk;\n  }\n";
    }
    return s + "}\n";
  }

  const ir::Graph& g_;
  const sched::Kernel& k_;
  Layout l_;
  const GpuVariant& v_;
  std::string name_;
  std::vector<uint8_t> kept_;  // per slot: 1 kept in registers (the reductions read it), 2 preloaded (GpuVariant::preload)
  std::vector<int> level_;   // rows: the pass of each reduction (find_online_sums)
  std::vector<int> online_;  // rows: per reduction, the index of the max of its online sum, or -1
  std::vector<int> folded_;  // rows: per reduction, the node whose value each element folds in
  std::vector<uint8_t> used_;  // slots read by the statements generated last (vload)
  bool batched_ = false;       // vector statements for chunk k of a loaded batch: L<i>[k][u]
  int sites_ = 0;              // block reductions so far (each its own shared array)
  const sched::Kernel* total_ = nullptr;  // matmul: the rows kernel whose total it computes
};

// The program of a plan's kernels `only` (all where empty), kernel k named kiln_k<k>.
inline std::string gpu_source(GpuDialect dialect, int warp_size, const ir::Graph& g, const sched::Plan& plan,
                              const std::vector<GpuVariant>& variants, const std::vector<size_t>& only = {}) {
  std::vector<size_t> ks = only;
  if (ks.empty())
    for (size_t k = 0; k < plan.kernels.size(); ++k) ks.push_back(k);
  std::string src = gpu_prelude(dialect, warp_size);
  auto any = [&](GemmKind kind) {
    return std::any_of(ks.begin(), ks.end(), [&](size_t k) {
      return plan.kernels[k].kind == sched::KernelKind::matmul && variants[k].gemm.kind == kind;
    });
  };
  if (any(GemmKind::mma) || any(GemmKind::wgmma)) src += detail::read_device_file("gemm_mma.cuh");
  if (any(GemmKind::wgmma)) src += detail::read_device_file("gemm_wgmma.cuh") + detail::read_device_file("gemm_walk.h");
  if (any(GemmKind::mfma)) src += detail::read_device_file("gemm_mfma.cuh");
  for (size_t k : ks) {
    const int t = variants[k].total_kernel;
    src += "\n" + GpuKernelWriter(g, plan.kernels[k], int(k), variants[k], t >= 0 ? &plan.kernels[size_t(t)] : nullptr).write();
  }
  return src;
}

// The compiler options a program of these variants needs beyond the device's own
// target: wgmma and setmaxnreg exist only in sm_90a code.
inline std::vector<std::string> gpu_compile_options(const std::vector<GpuVariant>& variants) {
  for (const GpuVariant& v : variants)
    if (v.gemm.kind == GemmKind::wgmma) return {"--gpu-architecture=sm_90a"};
  return {};
}

// The programs a plan variant set is built as, each compiled and cached on its own (and
// side by side where the API can): every matmul kernel alone, as the one kernel kiln_k0 of
// a plan of its own (the very program max-autotune times for its config: a tuned plan
// compiles no GEMM again), and the other kernels in one program (kiln_k<index>).
struct GpuProgramPart {
  std::string source;
  std::vector<std::string> options;
  std::vector<size_t> kernels;  // the plan's kernels it holds
};
inline sched::Plan gpu_single_kernel_plan(const sched::Plan& plan, size_t k) {
  sched::Plan one;
  one.kernels = {plan.kernels[k]};
  one.kernels[0].deps.clear();
  return one;
}
// Matmul kernel k alone with variant v: the one kernel kiln_k0 of a plan of its own.
// A GEMM that computes a rows kernel's total (GpuVariant::total_kernel) takes that kernel along,
// as kernel 1 of its plan, not written: the GEMM does its arithmetic.
inline GpuProgramPart gpu_gemm_program(GpuDialect dialect, int warp_size, const ir::Graph& g, const sched::Plan& plan, size_t k,
                                       const GpuVariant& v) {
  sched::Plan one = gpu_single_kernel_plan(plan, k);
  std::vector<GpuVariant> vars{v};
  if (v.total_kernel >= 0) {
    one.kernels.push_back(plan.kernels[size_t(v.total_kernel)]);
    vars[0].total_kernel = 1;
    vars.emplace_back();
  }
  return {gpu_source(dialect, warp_size, g, one, vars, {0}), gpu_compile_options({v}), {k}};
}
inline std::vector<GpuProgramPart> gpu_programs(GpuDialect dialect, int warp_size, const ir::Graph& g, const sched::Plan& plan,
                                                const std::vector<GpuVariant>& variants) {
  std::vector<GpuProgramPart> out;
  std::vector<size_t> rest;
  for (size_t k = 0; k < plan.kernels.size(); ++k) {
    if (plan.kernels[k].kind != sched::KernelKind::matmul) {
      rest.push_back(k);
      continue;
    }
    out.push_back(gpu_gemm_program(dialect, warp_size, g, plan, k, variants[k]));
  }
  if (!rest.empty()) out.push_back({gpu_source(dialect, warp_size, g, plan, variants, rest), {}, rest});
  return out;
}

}  // namespace kiln::codegen
