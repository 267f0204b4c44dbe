// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The Hopper GEMM (GemmKind::wgmma, bf16/f16, and f32 in TF32, on sm_90, built for sm_90a): the
// body of one kernel, over the same argument block and tile order as the other
// kinds (codegen/gemm.hpp), plus two tensor maps (tma_a, tma_b: kernel
// parameters the host encodes, runtime/cuda_backend.hpp).
//
// One block computes a BM x BN tile with 1 + BM/64 warpgroups:
//   producer   one thread: for each K step, waits until the stage is free
//              (its `empty` barrier), then has the copy engine (TMA) bring A's
//              and B's boxes into it, completing on its `full` barrier. The copy
//              engine writes the swizzled layout wgmma reads (128-byte; 64-byte for
//              16-bit K-major rows in K steps of 32), and fills
//              whatever lies past M, N or K with zeros.
//   consumers  warpgroup c owns rows 64c .. 64c+63 of the tile: waits for a stage,
//              issues BK/16 wgmma m64nBNk16 (A and B both from shared memory, f32
//              accumulators in registers), keeps one step in flight and gives the
//              previous step's stage back; at the end every element leaves
//              through the store callback (the fused epilogue). Where the host found
//              every epilogue slot contiguous along the columns and aligned
//              (GpuVariant::epilogue_vec), an interior tile's accumulators pass through
//              shared memory instead, and each thread finishes 4 consecutive columns
//              at a time with one vector load or store per slot (staged_stores).
// The producer gives its registers up (setmaxnreg) so consumers hold 64 x BN
// accumulators without spilling.
// Persistent configs (GemmConfig::persistent): a block per SM (the grid is at most the SM
// count) walks tiles blockIdx.x, + gridDim.x, ... in the same grouped raster; steps are
// counted across its tiles, so the producer fills the ring with the next tile's K steps
// while the consumers still store this one, and no block start or pipeline fill is paid
// per tile.
// Dynamic tiles (GemmConfig::dynamic, persistent, no split tail): the producer takes each next
// tile from a counter of the kernel's own and passes it to the block's other warps (in a cluster,
// rank 0's to every block's) through a ring in shared memory (device/gemm_wgmma.cuh's
// kiln_tile_fetch), so that a block that starts late takes fewer tiles.
// Serpentine (GemmConfig::serpentine, persistent, no split tail): the producer loads the block's
// odd tiles' K steps from the last (the grid's odd waves), and odd raster groups take their
// columns from the right, so that each wave starts on panels the one before left in L2.
// Split tail (GemmConfig::split_tail, persistent): the block walks units of K steps (KilnWalk,
// device/gemm_walk.h): whole tiles, then pieces of the last wave's tiles cut in K. A piece that
// ends before K leaves its sums in its workspace slot (kiln_split_give); the tile's last piece
// adds them before its epilogue (kiln_split_take); the split epilogue's warps skip the pieces
// that store nothing. In a cluster every block takes the cluster's units, each with its own
// slots and counts.
// Clusters (GemmConfig::cluster, persistent): CL blocks (__cluster_dims__) take
// the CL tiles of one column of tiles, one above the other, so they share B's tile: each
// block's producer brings its 1/CL of it into every block of the cluster (TMA multicast),
// completing bytes on each block's own `full` barrier, and a stage is free (`empty`) once
// every consumer warp of the cluster has given it back. The blocks meet (barrier.cluster)
// after initialising their barriers and before they leave. A block whose tile lies wholly
// past M reads A from row 0 and stores nothing.
// B's column sums (GemmColumnSums::of_b; not split, not a split tail, B N-major): warps 1 and 2
// of the producer warpgroup, idle otherwise, follow every K step as a third party of the
// stage ring (they too give each stage back before the producer refills it); in the blocks
// of the first tile row (m0 = 0), whose tiles read all of K for their columns, they add the
// B stage's rows into f32 sums, a 16-byte chunk of a row (8 columns) and half the K step's
// rows a thread, and at the tile's end store the totals: a bias's gradient beside its
// weight's GEMM with no pass over the matrix of its own and no work for the consumers.
// Split epilogue (GemmConfig::split_epilogue, persistent): the producer warpgroup's warps
// 1-3 run the epilogue. The consumers write each tile's accumulators to a staging tile in
// shared memory (16-bit: the matmul's own value; `stg_full`), go on to the next tile's
// MMAs, and overwrite the staging only once the epilogue warps have read it (`stg_empty`),
// so an epilogue that is long per element (loads from memory, transcendentals) overlaps
// the tensor cores' work instead of following it. Its staging takes one stage's room.
//
// TF32: the same kernel over 4-byte elements, K steps of 32 (a swizzle row), wgmma m64nBNk8.
// Its TF32 form reads both operands K-major only; the host stages an M-major A or an N-major
// B first (GpuVariant::stage: a kernel of the same program copies it K-major, rounded to
// nearest TF32), and the tensor cores truncate an operand read in place to TF32.
// Shared memory per stage, each box 1024-byte aligned (the swizzle atom), BK = 64 16-bit
// elements (32 TF32 ones) a K step:
//   A K-major: [BM rows][BK k] (one box)          A M-major: BM/64 boxes of [BK k][64 m]
//   B K-major: [BN rows][BK k] (one box)          B N-major: BN/64 boxes of [BK k][64 n]
// Descriptors: K-major tiles step 32 bytes per k16 inside the 128-byte row, 8-row
// groups 1024 bytes apart (SBO); M/N-major tiles step 16 rows (2048 bytes) per k16,
// 8-k groups 1024 bytes apart (SBO), 64-element column blocks BK * 128 bytes apart (LBO).
// 16-bit K steps of 32 (GemmConfig::bk 32: twice the stages in the same room, a split
// epilogue's ring as deep as a plain config's): K-major rows are 64 bytes, swizzled in
// 64-byte patterns (SWIZZLE_64B; 8-row groups 512 bytes apart); M/N-major boxes keep their
// 128-byte rows, BK of them.
#pragma once
#include "kiln/codegen/gemm.hpp"

namespace kiln::codegen {

// Whether a wgmma config's K-major rows are 64 bytes (16-bit K steps of 32), swizzled in 64
// bytes, rather than one 128-byte swizzle row: the kernel's descriptors and the host's tensor maps.
inline bool wgmma_sw64(const GemmConfig& c, int elem_bytes) { return c.bk * elem_bytes == 64; }

// Whether a GEMM of config c over operands o in dtype d can sum its B operand's columns over K
// (GpuVariant::colsum_of_b): the wgmma kind, whose producer warpgroup has idle warps (not the
// split epilogue's), the first tile row's blocks each owning whole columns of B (not a split tail),
// B read in place N-major in 16 bits (TF32 stages B K-major), in 128-byte rows (b_column_sums).
inline bool gemm_sums_b(const GemmConfig& c, const GemmOperands& o, DType d) {
  return c.kind == GemmKind::wgmma && !c.split_epilogue && !(c.persistent && c.split_tail) && !o.b_k_major &&
         (d == DType::bf16 || d == DType::f16) && !wgmma_sw64(c, 2);
}

// GpuVariant::colsum_slot in a kernel's terms: the stored matrix (an expression of its first
// element, of its row stride), its format for kiln_colsum_read (0 bf16, 1 f16, 2 f32; -1: no
// column sums), and the statement that stores column `col`'s total `v`. of_b
// (GpuVariant::colsum_of_b): the matrix is B, summed over K from its stages (values unused).
// Else the store functions add each value of the matrix they store where their `sum` says
// (MatmulEpilogue::column_sum), and the writer passes a register of that value's column.
struct GemmColumnSums {
  int format = -1;
  bool of_b = false;
  std::string values, row_stride;
  std::function<std::string(const std::string& col, const std::string& v)> store;
  // Sums of the matrix the GEMM stores (not of B): a workspace row per tile and column counts.
  bool of_stored() const { return format >= 0 && !of_b; }
};

// GpuVariant::total_kernel in a kernel's terms: the epilogue adds each element's term into the
// register kiln_total of the thread that stores it (MatmulEpilogue::total); finish(warp,
// block_warps, ind) gives the statements with which warp `warp` of the block's `block_warps` that
// store tiles hands its sum over (kiln_total_last), the last of the grid's storing the result.
struct GemmTotal {
  std::function<std::string(const std::string& warp, const std::string& block_warps, const std::string& ind)> finish;
};
// The warps of a block that store its tiles: the consumers', or a split epilogue's three.
inline int wgmma_epilogue_warps(const GemmConfig& c) { return c.persistent && c.split_epilogue ? 3 : c.bm / c.wm * 4; }
// Whether a GEMM of config c can compute a rows kernel's total (GpuVariant::total_kernel): the
// wgmma kind, its blocks' tiles fixed (not dynamic: each warp's elements, so the sum, the same on
// every run).
inline bool gemm_sums_total(const GemmConfig& c) { return c.kind == GemmKind::wgmma && !(c.persistent && c.dynamic); }

class WgmmaWriter {
 public:
  // `group`: where given, interior tiles store through it (staged_stores); else element by element.
  WgmmaWriter(const GemmConfig& c, const GemmOperands& o, DType d, GemmStore store, GemmGroupStore group = {}, GemmColumnSums sums = {},
              GemmTotal total = {})
      : c_(c), o_(o), d_(d), w_(c, o, d, std::move(store)), group_(std::move(group)), sums_(std::move(sums)), total_(std::move(total)) {}

  std::string body(const std::string& prelude = "") const {
    auto S = [](int v) { return std::to_string(v); };
    const bool persistent = c_.persistent, split = c_.persistent && c_.split_epilogue, sk = c_.persistent && c_.split_tail;
    const bool dyn = persistent && c_.dynamic;  // dynamic tiles (gemm_fits: no split tail)
    const int cl = c_.cluster;  // blocks of a cluster, sharing B's tile (gemm_fits: persistent)
    const bool b_sums = sums_.format >= 0 && sums_.of_b;
    if (b_sums && !gemm_sums_b(c_, o_, d_)) throw Error("kiln: internal error: B's column sums in a " + c_.str() + " GEMM (gemm_sums_b)");
    // A unit's K steps: the whole tile's, or a split tail's piece of it.
    const std::string KB = sk ? "kb" : "0", KE = sk ? "ke" : "KT";
    std::string s = w_.head(prelude);
    s += "  constexpr int STAGES = " + S(c_.stages) + ", CONSUMERS = BM / WM;\n";
    // E: an element's bytes; a K step, BK of them, is a K-major row (128 bytes, or 64: sw64);
    // BOX: an M/N-major box's bytes (BK rows of 64 elements); KS: the K of one wgmma.
    const bool sw64 = wgmma_sw64(c_, int(info(d_).bytes));
    s += "  constexpr uint32_t E = " + S(int(info(d_).bytes)) + ", A_STAGE = BM * BK * E, B_STAGE = BN * BK * E, BOX = BK * 128;\n"
         "  constexpr int KS = 32 / E;\n";
    s += "  extern __shared__ __align__(128) unsigned char kiln_smem[];\n";
    s += "  const uint32_t sA = (kiln_smem_addr(kiln_smem) + 1023u) & ~1023u, sB = sA + STAGES * A_STAGE;\n";
    s += "  const uint32_t full0 = sB + STAGES * B_STAGE, empty0 = full0 + STAGES * 8;\n";
    // Dynamic tiles: the ring of tile numbers (kiln_tile_fetch) after the stages' barriers; the
    // grid's counter (and its count of blocks done fetching) is the kernel's own, zero between
    // launches (kiln_tiles_done). A batch (gridDim.z > 1) walks its tiles as a static config does.
    if (dyn)
      s += "  static unsigned kiln_next[2];\n  const bool kiln_dyn = gridDim.z == 1;\n  const uint32_t tq = full0 + STAGES * 16;\n";
    // After the barriers (and the ring): the split epilogue's staging, or the consumers' (staged_stores).
    if (split || group_) s += std::string("  const uint32_t rest = full0 + STAGES * 16") + (dyn ? " + " + S(kWgmmaTileRingBytes) : "") + ";\n";
    if (split)  // EPI: the epilogue warps' threads (the producer warpgroup's warps 1-3)
      s += "  const uint32_t stg_full = rest, stg_empty = stg_full + 8, stg = stg_full + 16;\n  constexpr int EPI = 96;\n";
    // The warpgroup's index through a shuffle, so that ptxas knows it is one value across the
    // warp (as CUTLASS's canonical_warp_group_idx): what is derived from it, the consumers'
    // wgmma descriptors, then lives in uniform registers. NOTE: from threadIdx.x alone the
    // descriptors were computed in vector registers and moved (R2UR) before every wgmma: the
    // consumers' K step 61 SASS instructions, 45 with the shuffle (W4's h @ W2, sm_90a cubin).
    s += "  const int wg = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0), lane = threadIdx.x % 32;\n";
    s += "  const int KT = (int)((K + BK - 1) / BK);\n";
    if (persistent && cl == 1) s += "  const int64_t kiln_tiles = ((Mr + BM - 1) / BM) * ((N + BN - 1) / BN);\n";
    // Clustered: the clusters' tiles (CL tiles tall) and this block's rank in its cluster.
    if (cl > 1)
      s += "  constexpr int CL = " + S(cl) + ";\n  const int64_t kiln_tiles = ((Mr + BM * CL - 1) / (BM * CL)) * ((N + BN - 1) / BN);\n" +
           "  const uint32_t kiln_crank = kiln_cluster_rank();\n";
    if (sk) s += "  float* const sk_ws = (float*)args.ws[0];\n  unsigned* const sk_counts = (unsigned*)args.ws[1];\n";
    if (sums_.of_stored()) {
      if (sk) throw Error("kiln: internal error: column sums in a split-tail GEMM");
      s += "  float* const cs_part = (float*)args.ws[0];\n  unsigned* const cs_count = (unsigned*)args.ws[1];\n";
    }
    // The batch coordinate of each operand's map (0 where its batch is broadcast: the map has one).
    s += "  const int za = nd == 3 && sa[0] != 0 ? (int)blockIdx.z : 0, zb = nd == 3 && sb[0] != 0 ? (int)blockIdx.z : 0;\n";
    s += "  if (threadIdx.x == 0) {\n";
    // Clustered: a stage is free once every consumer warp of the cluster is done with it (B's
    // shares went into every block's copy of it).
    // B's column sums: their two warps give each stage back too.
    s += std::string("    for (int s = 0; s < STAGES; ++s) { kiln_mbar_init(full0 + 8 * s, 1); kiln_mbar_init(empty0 + 8 * s, (CONSUMERS * 4") +
         (b_sums ? " + 2" : "") + ")" + (cl > 1 ? " * CL" : "") + "); }\n";
    if (split) s += "    kiln_mbar_init(stg_full, CONSUMERS * 128); kiln_mbar_init(stg_empty, EPI);\n";
    // The ring's readers: every consumer warp, the split epilogue's or B's column sums' warps, in
    // every block of a cluster, and the other blocks' producers; rank 0's empty barriers count them.
    if (dyn)
      s += "    for (int s = 0; s < KILN_TQ; ++s) { kiln_mbar_init(tq + 8 * s, 1); kiln_mbar_init(tq + 8 * KILN_TQ + 8 * s, (CONSUMERS * 4 + " +
           S(split ? 3 : b_sums ? 2 : 0) + ") * " + S(cl) + " + " + S(cl - 1) + "); }\n";
    // Clustered: no copy lands in a block before its barriers are initialised.
    s += std::string("    kiln_mbar_init_fence();\n  }\n  ") + (cl > 1 ? "kiln_cluster_sync();\n" : "__syncthreads();\n");
    // Steps are counted over the block's tiles (g): step g uses stage g % STAGES, for the
    // (g / STAGES)-th time, so each barrier's phase parity follows from g alone.
    // Persistent: the block's tiles blockIdx.x, + gridDim.x, ... (a cluster's: blockIdx.x / CL,
    // + gridDim.x / CL); a split tail: its units (KilnWalk), `whole_only` skipping the pieces
    // that end before K (they store nothing); else its one tile. (The consumers open theirs below.)
    const std::string block = cl > 1 ? "blockIdx.x / CL" : "blockIdx.x", grid = cl > 1 ? "gridDim.x / CL" : "gridDim.x";
    const std::string walk_args = "kiln_tiles, KT, " + grid + ", " + block + ", gridDim.z, true, " + S(c_.tail_parts);
    // Dynamic tiles: the j-th tile the producer fetched (kiln_tile_fetch), read from the ring by
    // the other warps (kiln_tile_read), a batch's static one (kiln_dyn false); past the tiles: done.
    auto tiles_open = [&](const std::string& ind, bool whole_only = false, bool producer = false) {
      if (!persistent) return std::string();
      if (dyn) {
        const std::string fetch = "kiln_tile_fetch(kiln_next, tq, kiln_j, " + S(cl) + ")",
                          next = !producer ? "kiln_tile_read(tq, kiln_j, " + S(cl) + ", true)"
                                 : cl > 1  ? "(kiln_crank == 0 ? " + fetch + " : kiln_tile_read(tq, kiln_j, CL, false))"
                                           : fetch;
        return ind + "for (unsigned kiln_j = 0;; ++kiln_j) {\n" + ind + "  const int64_t tile = kiln_dyn ? (int64_t)" + next + " : " + block +
               " + (int64_t)kiln_j * (" + grid + ");\n" + ind + "  if (tile >= kiln_tiles) break;\n" + ind + "  int64_t m0, n0;\n" +
               GemmWriter::tile_origin("tile", ind + "  ", c_.group, cl, c_.serpentine, c_.group_across);
      }
      std::string t = !sk ? ind + "for (int64_t tile = " + block + "; tile < kiln_tiles; tile += " + grid + ") {\n"
                          : ind + "KilnWalk walk(" + walk_args + ");\n" + ind + "int kb, ke;\n" +
                                ind + "for (int64_t tile; walk.step(tile, kb, ke);) {\n" + (whole_only ? ind + "  if (ke < KT) continue;\n" : "");
      return t + ind + "  int64_t m0, n0;\n" + GemmWriter::tile_origin("tile", ind + "  ", c_.group, cl, c_.serpentine, c_.group_across);
    };
    auto tiles_close = [&](const std::string& ind) { return persistent ? ind + "}\n" : std::string(); };
    // Registers: the producer gives its own up (setmaxnreg) for the consumers' accumulators and
    // the staged epilogue's loads. NOTE: ptxas allocates no more than the launch's 168 per
    // thread after an increase, and keeps code after a decrease within it, so a split
    // config, whose producer warpgroup also runs the epilogue, keeps 168 everywhere.
    s += std::string("  if (wg == 0) {\n") + (split ? "" : "    kiln_regs_dec<40>();\n") + "    if (threadIdx.x == 0) {\n      unsigned g = 0;\n" +
         tiles_open("      ", false, true);
    // Serpentine: the grid's odd waves (the block's odd tiles) load K from its end. Only the
    // producer knows: the consumers add the stages in the order they arrive.
    if (c_.serpentine) s += "        const bool kiln_rev = (tile / (" + grid + ")) % 2 != 0;\n";
    s += "      for (int kt = " + KB + "; kt < " + KE + "; ++kt, ++g) {\n        const int s = g % STAGES, k0 = " +
         (c_.serpentine ? "(kiln_rev ? KT - 1 - kt : kt)" : "kt") + " * BK;\n";
    s += "        if (g >= STAGES) kiln_mbar_wait(empty0 + 8 * s, (g / STAGES - 1) & 1);\n";
    s += "        const uint32_t full = full0 + 8 * s, a = sA + s * A_STAGE, b = sB + s * B_STAGE;\n";
    s += "        kiln_mbar_expect_tx(full, A_STAGE + B_STAGE);\n";
    // Clustered: a block whose tile lies wholly past M still brings its share of B to the
    // other, and reads A's rows from 0 (it stores nothing): no box lies wholly out of bounds.
    const std::string am = cl > 1 ? "(int)(m0 < Mr ? m0 : 0)" : "(int)m0";
    s += o_.a_k_major ? "        kiln_tma_load_3d(a, &tma_a, k0, " + am + ", za, full);\n"
                      : "        for (int c = 0; c < BM / 64; ++c) kiln_tma_load_3d(a + c * BOX, &tma_a, " + am + " + 64 * c, k0, za, full);\n";
    if (cl > 1)  // this block's share of B's tile (BN / CL columns), into every block of the cluster
      s += o_.b_k_major ? "        kiln_tma_load_3d_multicast(b + kiln_crank * (B_STAGE / CL), &tma_b, k0, (int)n0 + kiln_crank * (BN / CL), zb, "
                          "full, (1 << CL) - 1);\n"
                        : "        for (int j = kiln_crank * (BN / 64 / CL); j < (kiln_crank + 1) * (BN / 64 / CL); ++j)\n"
                          "          kiln_tma_load_3d_multicast(b + j * BOX, &tma_b, (int)n0 + 64 * j, k0, zb, full, (1 << CL) - 1);\n";
    else
      s += o_.b_k_major ? "        kiln_tma_load_3d(b, &tma_b, k0, (int)n0, zb, full);\n"
                        : "        for (int j = 0; j < BN / 64; ++j) kiln_tma_load_3d(b + j * BOX, &tma_b, (int)n0 + 64 * j, k0, zb, full);\n";
    s += "      }\n" + tiles_close("      ");
    if (dyn) s += std::string("      if (kiln_dyn") + (cl > 1 ? " && kiln_crank == 0" : "") + ") kiln_tiles_done(kiln_next, " + grid + ");\n";
    s += "    }\n";
    if (split) s += "    else if (threadIdx.x >= 128 - EPI) {\n" + split_epilogue(tiles_open, tiles_close) + "    }\n";
    if (b_sums) s += "    else if (threadIdx.x >= 32 && threadIdx.x < 96) {\n" + b_column_sums(tiles_open, tiles_close) + "    }\n";
    s += std::string("  } else {\n") + (split ? "" : "    kiln_regs_inc<232>();\n");
    s += "    const int c = wg - 1, w = (threadIdx.x / 32) % 4;\n";
    if (total_.finish && !split) s += "    float kiln_total = 0.f;\n";
    if (sums_.of_stored() && !split) s += "    KilnColsumCount cs_n;\n";
    // The shared-memory descriptors of stage 0, built once: a stage's and a K16 step's are these
    // plus their byte offset / 16 (the start address field, bits 0-13, never carries: shared
    // memory ends below 256 KB). NOTE: built from the address at every K16 step they made the
    // consumers' loop 86 instructions a K step (SASS, W4's h @ W2 on an H200), and the GEMM
    // execute 65% more instructions than cuBLAS's; built once, 58 and 16% more, the time about
    // the same (ncu; docs/benchmarks.md, twenty-third and twenty-fourth sessions).
    // Consumer c's 64 rows of A start 64 rows (K-major) or one box (M-major) in: 64 * BK * E bytes either way.
    auto desc = [&](bool k_major, const std::string& base) {
      return k_major ? "kiln_wgmma_desc(" + base + (sw64 ? ", 16, 512, true)" : ", 16, 1024)") : "kiln_wgmma_desc(" + base + ", BOX, 1024)";
    };
    s += "    const unsigned long long da0 = " + desc(o_.a_k_major, "sA + c * (64 * BK * E)") + ", db0 = " + desc(o_.b_k_major, "sB") + ";\n";
    s += std::string("    float d[BN / 2];\n    unsigned g = 0;\n") + (split ? "    int tiles_done = 0;\n" : "");
    // One unit of the consumers' walk: a whole tile, or (pieces) a split tail's piece of one.
    auto unit_body = [&](bool pieces) {
      const std::string from = pieces ? "kb" : "0", to = pieces ? "ke" : "KT";  // its K steps
      std::string u = "#pragma unroll\n    for (int i = 0; i < BN / 2; ++i) d[i] = 0.f;\n";
      u += "    for (int kt = " + from + "; kt < " + to + "; ++kt, ++g) {\n      const int s = g % STAGES;\n";
      u += "      kiln_mbar_wait(full0 + 8 * s, (g / STAGES) & 1);\n";
      u += "      const unsigned long long das = da0 + s * (A_STAGE / 16), dbs = db0 + s * (B_STAGE / 16);\n      kiln_wgmma_fence();\n";
      u += "#pragma unroll\n      for (int ks = 0; ks < BK / KS; ++ks) {\n";
      // A K16 step: 32 bytes on along a K-major tile's swizzled rows, 16 rows (2048 bytes) down an M/N-major one.
      u += std::string("        const unsigned long long da = das + ks * ") + (o_.a_k_major ? "2" : "128") + ", db = dbs + ks * " +
           (o_.b_k_major ? "2" : "128") + ";\n";
      u += mma_instruction("        ");
      u += "      }\n      kiln_wgmma_commit();\n      kiln_wgmma_wait<1>();\n";
      // The previous step's MMAs have finished reading their stage: back to the producer.
      u += "      " + release_if("kt > " + from, "empty0 + 8 * ((g - 1) % STAGES)") + "\n    }\n";
      // Once all MMAs are done the last step's stage goes back too: the producer is already
      // loading the next tile while this one is stored.
      // A split tail's last piece of a tile adds the other pieces' sums (the slots of its
      // tile's other units: place, + tail, ...; in a cluster, times CL plus the block's rank;
      // the tile's count at its place likewise).
      const std::string sk_args = ", threadIdx.x - 128, CONSUMERS * 128, CONSUMERS + 1);\n", rank = cl > 1 ? " * CL + kiln_crank" : "";
      const std::string done =
          "kiln_wgmma_wait<0>();\n" +
          (persistent ? "      " + release_if(to + " > " + from, "empty0 + 8 * ((g - 1) % STAGES)") + "\n" : "") +
          (pieces ? "      if (kb > 0) kiln_split_take(d, sk_ws + (place" + rank + ") * (size_t)(BM * BN), (size_t)walk.tail" +
                        (cl > 1 ? " * CL" : "") + " * (BM * BN), walk.parts, sk_counts + place" + rank + sk_args
                  : "");
      // A split tail's piece that ends before K leaves its sums to the tile's last piece.
      if (pieces)
        u += "    if (ke < KT) {\n      kiln_wgmma_wait<0>();\n      " + release_if("", "empty0 + 8 * ((g - 1) % STAGES)") +
             "\n      kiln_split_give(d, sk_ws + (unit" + rank + ") * (size_t)(BM * BN), sk_counts + place" + rank + sk_args +
             "      continue;\n    }\n";
      // Accumulators: warp w of the warpgroup holds rows 16w .. 16w+15; per 8 columns j, d[4j .. 4j+3]
      // at (lane/4, 2*(lane%4) + 0/1) and eight rows below (mma.sync's C fragment). A tile inside
      // the output stores without a test per element.
      auto stores = [&](bool checked) {
        std::string t = "#pragma unroll\n    for (int j = 0; j < BN / 8; ++j)\n#pragma unroll\n    for (int q = 0; q < 4; ++q) {\n";
        t += "      const int64_t row = m0 + c * 64 + w * 16 + lane / 4 + (q / 2) * 8, col = n0 + j * 8 + (lane % 4) * 2 + q % 2;\n";
        return t + w_.emit_store("      ", "row", "col", "d[j * 4 + q]", checked) + "    }\n";
      };
      if (split) {
        // The staging holds the previous tile until the epilogue warps have read it all.
        u += "    " + done + "    if (tiles_done > 0) kiln_mbar_wait(stg_empty, (tiles_done - 1) & 1);\n";
        u += "    {\n      uint32_t* sw = (uint32_t*)(kiln_smem + (stg - kiln_smem_addr(kiln_smem)));\n";
        u += "      const int r = c * 64 + w * 16 + lane / 4;\n#pragma unroll\n      for (int j = 0; j < BN / 8; ++j) {\n";
        u += "        sw[r * ((BN + 8) / 2) + j * 4 + lane % 4] = " + pack() + "(d[j * 4], d[j * 4 + 1]);\n";
        u += "        sw[(r + 8) * ((BN + 8) / 2) + j * 4 + lane % 4] = " + pack() + "(d[j * 4 + 2], d[j * 4 + 3]);\n";
        u += "      }\n    }\n    kiln_mbar_arrive(stg_full);\n    ++tiles_done;\n";
      } else if (!group_) {
        u += "    " + done;
        u += "    if (m0 + BM <= Mr && n0 + BN <= N) {\n" + stores(false) + "    } else {\n" + stores(true) + "    }\n";
      } else {
        u += "    const bool interior = m0 + BM <= Mr && n0 + BN <= N;\n";
        u += "    if (interior) {\n" + staged_stores(done) + "    } else {\n      " + done + stores(true) + "    }\n";
      }
      if (!split && sums_.of_stored()) u += column_sums(group_ ? "interior" : "", "(int)threadIdx.x - 128", "CONSUMERS * 128", "    ");
      return u;
    };
    // A split tail: the whole tiles in a loop of their own, as without one, then the pieces,
    // each loop counting its units. NOTE: walked one unit at a time (KilnWalk::step: whole
    // tiles, then pieces, the walk's state carried from step to step), the loop held the
    // consumers' wgmma descriptors in vector registers (16 R2UR in a K step of 59 SASS
    // instructions against 27 without; sm_90a, W4's GEMMs); and so did some kernels' whole
    // tiles' loop unless its bound came through a shuffle (KilnFromLane0: one value across the warp).
    if (sk) {
      s += "    const KilnWalk walk(" + walk_args + ");\n";
      s += "    const int64_t whole = KilnFromLane0{}(walk.whole);\n";
      s += "    for (int64_t tile = " + block + "; tile < whole; tile += " + grid + ") {\n      int64_t m0, n0;\n" +
           GemmWriter::tile_origin("tile", "      ", c_.group, cl, false, c_.group_across) + unit_body(false) + "    }\n";
      s += "    for (int64_t unit = " + block + "; unit < walk.units(); unit += " + grid + ") {\n" +
           "      const int64_t tile = walk.unit_tile(unit), place = tile - walk.whole;\n" +
           "      const int kb = walk.begin(walk.unit_piece(unit)), ke = walk.begin(walk.unit_piece(unit) + 1);\n" +
           "      int64_t m0, n0;\n" + GemmWriter::tile_origin("tile", "      ", c_.group, cl, false, c_.group_across) + unit_body(true);
    } else {
      s += tiles_open("    ") + unit_body(false);
    }
    s += tiles_close("    ");
    if (!split && sums_.of_stored()) s += column_count("(int)threadIdx.x - 128", "CONSUMERS * 128", "    ", false);
    if (total_.finish && !split)
      s += total_.finish("(threadIdx.x - 128) / 32", "CONSUMERS * 4", "    ");
    s += "  }\n";
    // Clustered: no block leaves while another may still arrive on its barriers or copy into it.
    return cl > 1 ? s + "  kiln_cluster_sync();\n" : s;
  }

 private:
  // A warp gives a stage back where `cond` holds: to its block's producer, and in a cluster to
  // every block's (each brought a share of the stage into every block), lane r to block r
  // (one arrive a lane, as CUTLASS's pipelines do: no loop, no divergent branch in the K loop).
  std::string release_if(const std::string& cond, const std::string& bar) const {
    const std::string c = cond.empty() ? "" : cond + " && ";
    if (c_.cluster == 1) return "if (" + c + "lane == 0) kiln_mbar_arrive(" + bar + ");";
    return "if (" + c + "lane < CL) kiln_mbar_arrive_cluster(" + bar + ", lane);";
  }

  // wgmma.mma_async m64n<BN>k16 (TF32: k8), f32 += A * B, both operands by descriptor;
  // imm-trans is 1 for an M-major A or an N-major B. TF32 has no imm-trans: both operands are
  // K-major (GpuVariant::stage copies one that is not), and the tensor cores read each f32
  // element's upper 19 bits (truncated to TF32).
  std::string mma_instruction(const std::string& ind) const {
    int n = c_.bn, regs = n / 2;
    const bool tf32 = d_ == DType::f32;
    if (tf32 && !(o_.a_k_major && o_.b_k_major)) throw Error("kiln: internal error: a TF32 wgmma GEMM on an operand that is not K-major");
    std::string t = tf32 ? "tf32" : d_ == DType::bf16 ? "bf16" : "f16", list;
    for (int i = 0; i < regs; ++i) list += (i ? ", %" : "%") + std::to_string(i);
    const std::string trans = tf32 ? "" : std::string(", ") + (o_.a_k_major ? "0" : "1") + ", " + (o_.b_k_major ? "0" : "1");
    std::string s = ind + "asm volatile(\"{ .reg .pred p; setp.ne.b32 p, %" + std::to_string(regs + 2) +
                    ", 0; wgmma.mma_async.sync.aligned.m64n" + std::to_string(n) + (tf32 ? "k8" : "k16") + ".f32." + t + "." + t + " {" +
                    list + "}, %" + std::to_string(regs) + ", %" + std::to_string(regs + 1) + ", p, 1, 1" + trans + "; }\\n\"\n" + ind +
                    "  : ";
    for (int i = 0; i < regs; ++i) s += (i ? ", " : "") + std::string("\"+f\"(d[") + std::to_string(i) + "])";
    return s + "\n" + ind + "  : \"l\"(da), \"l\"(db), \"r\"(1));\n";
  }

  std::string pack() const { return d_ == DType::bf16 ? "kiln_pack_bf16x2" : "kiln_pack_f16x2"; }

  // The epilogue warps of a split config (the producer warpgroup's warps 1-3): for each of
  // the block's tiles, wait for the consumers' staging, then each thread finishes 8
  // consecutive columns of one row at a time (a warp: 256 columns, one 16-byte shared read
  // and one vector access per slot), and give the staging back. Interior tiles go in batches
  // of kBatch such chunks per thread whose loads all go out first (the first batch's before
  // the wait for the staging): three warps hide a load from memory only with many in
  // flight. Edge tiles store element by element, checked.
  template <class Open, class Close>
  std::string split_epilogue(const Open& tiles_open, const Close& tiles_close) const {
    constexpr int kBatch = 8;
    auto S = [](int v) { return std::to_string(v); };
    const std::string un = d_ == DType::bf16 ? "kiln_unpack_bf16x2" : "kiln_unpack_f16x2";
    // Chunk `j` of the staging (row r<j>, columns c<j> .. c<j> + 7) into f<j>[8].
    auto unpack = [&](const std::string& j, const std::string& ind) {
      std::string f = "f" + j;
      return ind + "const uint4 q" + j + " = *(const uint4*)(sbytes + (r" + j + " * (BN + 8) + c" + j + ") * 2);\n" + ind + "float " + f +
             "[8];\n" + ind + un + "(q" + j + ".x, " + f + "); " + un + "(q" + j + ".y, " + f + " + 2); " + un + "(q" + j + ".z, " + f +
             " + 4); " + un + "(q" + j + ".w, " + f + " + 6);\n";
    };
    const std::string wait = "kiln_mbar_wait(stg_full, tiles_done & 1);\n";
    const bool sums = sums_.of_stored();  // (gemm_sums_b: never with a split epilogue)
    std::string s = "    const int t = threadIdx.x - (128 - EPI);\n";
    if (total_.finish) s += "    float kiln_total = 0.f;\n";
    if (sums) s += "    KilnColsumCount cs_n;\n";
    s += "    const unsigned char* sbytes = kiln_smem + (stg - kiln_smem_addr(kiln_smem));\n    int tiles_done = 0;\n";
    s += tiles_open("    ", true) + "    constexpr int CHUNKS = BM * BN / 8;\n";
    // Column sums: EPI is a multiple of BN / 8, so thread t's chunks are all columns (t % (BN / 8)) * 8 ..
    if (sums) s += "    static_assert(EPI % (BN / 8) == 0, \"a thread's columns fixed\");\n    float kiln_cs[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};\n";
    // Per element, checked or not: edge tiles, and epilogues with no vector form.
    auto elements = [&](bool checked) {
      std::string e = "    " + wait + "    for (int chunk = t; chunk < CHUNKS; chunk += EPI) {\n";
      e += "      const int r_ = chunk / (BN / 8), c_ = (chunk % (BN / 8)) * 8;\n" + unpack("_", "      ");
      e += "      const int64_t row = m0 + r_;\n#pragma unroll\n      for (int e = 0; e < 8; ++e) {\n";
      return e + "        const int64_t col = n0 + c_ + e;\n" + w_.emit_store("        ", "row", "col", "f_[e]", checked, sums ? "kiln_cs[e]" : "") +
             "      }\n    }\n";
    };
    std::string interior = elements(false);
    if (group_) {
      interior = "    for (int b = t; b < CHUNKS; b += EPI * " + S(kBatch) + ") {\n";
      std::vector<MatmulEpilogue::Group> lo, hi;
      for (int j = 0; j < kBatch; ++j) {
        std::string J = S(j);
        // Past the tile's chunks: the last chunk's addresses (loaded, not stored).
        interior += "      const int k" + J + " = min(b + EPI * " + S(j) + ", CHUNKS - 1), r" + J + " = k" + J + " / (BN / 8), c" + J +
                    " = (k" + J + " % (BN / 8)) * 8;\n";
        lo.push_back(group_("m0 + r" + J, "n0 + c" + J, "f" + J, "a" + J, sums ? "kiln_cs" : ""));
        hi.push_back(group_("m0 + r" + J, "n0 + c" + J + " + 4", "(f" + J + " + 4)", "b" + J, sums ? "(kiln_cs + 4)" : ""));
      }
      for (int j = 0; j < kBatch; ++j) interior += lo[size_t(j)].loads + hi[size_t(j)].loads;
      interior += "      if (b == t) " + wait;
      for (int j = 0; j < kBatch; ++j)
        interior += "      if (b + EPI * " + S(j) + " < CHUNKS) {\n" + unpack(S(j), "        ") + lo[size_t(j)].body + hi[size_t(j)].body + "      }\n";
      interior += "    }\n";
    }
    s += "    if (m0 + BM <= Mr && n0 + BN <= N) {\n" + interior + "    } else {\n" + elements(true) + "    }\n";
    // Column sums: the staging goes back to the consumers first; the threads' rows of sums
    // (EPI / (BN / 8) rows of BN) go to their own room after it (kWgmmaSplitSumBytes).
    s += "    kiln_mbar_arrive(stg_empty);\n    ++tiles_done;\n";
    if (sums) {
      s += "    if (m0 < Mr) {\n      float* const cs_rows = (float*)(kiln_smem + (stg - kiln_smem_addr(kiln_smem)) + BM * (BN + 8) * 2);\n";
      s += "#pragma unroll\n      for (int e = 0; e < 8; ++e) cs_rows[(t / (BN / 8)) * BN + (t % (BN / 8)) * 8 + e] = kiln_cs[e];\n";
      s += "      kiln_colsum_rows<BN>(cs_rows, EPI / (BN / 8), EPI / (BN / 8), 0, m0 / BM, n0, N, cs_part, t, EPI, 8);\n";
      s += column_count("t", "EPI", "      ", true) + "    }\n";
    }
    s += tiles_close("    ");
    if (sums) s += column_count("t", "EPI", "    ", false);
    if (total_.finish)
      s += total_.finish("t / 32", "EPI / 32", "    ");
    return s;
  }

  // B's column sums (b_sums in body): threads 32-95, thread t the 16-byte chunk t / 2 of B's
  // rows (columns 8 (t / 2) ..; past BN / 8 chunks: none) in rows 32 (t % 2) .. + 31 of each K
  // step's 64. A warp's loads cover whole 128-byte swizzled rows of two boxes (no bank
  // conflicts); the two halves meet by a shuffle, in one order on every run. Every block's
  // two warps take each stage in turn and give it back (released to every block of a cluster,
  // as the consumers do); only the first tile row's add.
  template <class Open, class Close>
  std::string b_column_sums(const Open& tiles_open, const Close& tiles_close) const {
    const std::string F = std::to_string(sums_.format);
    std::string s = "    const int t = threadIdx.x - 32, ch = t / 2, half = t % 2;\n    const bool mine = ch < BN / 8;\n";
    s += "    const unsigned char* const rows0 = kiln_smem + (sB - kiln_smem_addr(kiln_smem)) + (ch / 8) * 8192 + half * 32 * 128;\n";
    s += "    unsigned g = 0;\n" + tiles_open("    ");
    s += "    float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};\n    const bool adds = m0 == 0 && mine;\n";
    s += "    for (int kt = 0; kt < KT; ++kt, ++g) {\n      const int s = g % STAGES;\n      kiln_mbar_wait(full0 + 8 * s, (g / STAGES) & 1);\n";
    // Row r of a box: its 16-byte chunk j at (j ^ (r % 8)) * 16 (the 128-byte swizzle); rows 32 apart swizzle alike.
    // NOTE: unrolled by 4: by 8, ptxas spilled within the producer warpgroup's 40 registers (sm_90a).
    s += "      if (adds) {\n        const unsigned char* b = rows0 + s * B_STAGE;\n#pragma unroll 4\n";
    s += "        for (int r = 0; r < 32; ++r) kiln_colsum_add<" + F + ">(b + r * 128 + (((ch % 8) ^ (r % 8)) * 16), acc);\n      }\n";
    s += "      __syncwarp();\n      " + release_if("", "empty0 + 8 * s") + "\n    }\n";
    s += "    if (m0 == 0) {\n#pragma unroll\n      for (int e = 0; e < 8; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], 1);\n";
    s += "      if (mine && half == 0)\n#pragma unroll\n        for (int e = 0; e < 8; ++e)\n          if (n0 + ch * 8 + e < N) {\n";
    s += "            const int64_t col = n0 + ch * 8 + e;\n            " + sums_.store("col", "acc[e]") + "\n          }\n    }\n";
    return s + tiles_close("    ");
  }

  // GpuVariant::colsum_slot, the consumers' part: once a tile is stored, the `threads` threads (u)
  // that stored it put its column sums in its row of the workspace, from the rows that
  // staged_stores left in the staging where `interior` holds, else read back; then the tile
  // arrives on its column's count, and the column whose last tile arrived before is added up. A
  // clustered block whose tile lies past M stored nothing and sums nothing.
  std::string column_sums(const std::string& interior, const std::string& u, const std::string& threads, const std::string& ind) const {
    const std::string read = "kiln_colsum_read<" + std::to_string(sums_.format) + ", BM, BN>(" + sums_.values + ", " + sums_.row_stride +
                             ", m0, n0, Mr, N, cs_part, " + u + ", " + threads + ", 8);\n";
    std::string s = ind + "if (m0 < Mr) {\n";
    if (!interior.empty())
      s += ind + "  if (" + interior + ")\n" + ind + "    kiln_colsum_rows<BN>((const float*)(kiln_smem + (rest - kiln_smem_addr(kiln_smem))), CONSUMERS * 4, 4, 64 * " +
           std::to_string(kWgmmaStagePitch) + ", m0 / BM, n0, N, cs_part, " + u + ", " + threads + ", 8);\n" + ind + "  else\n  ";
    return s + ind + "  " + read + column_count(u, threads, ind + "  ", true) + ind + "}\n";
  }
  // Once a tile's row of the workspace is written (`arrive`: the tile arrives on its column's
  // count), or after the block's last tile: the answer for the tile that arrived before; if it
  // was its column's last, that column's rows added in order, stored, and its count zeroed for
  // the next launch.
  std::string column_count(const std::string& u, const std::string& threads, const std::string& ind, bool arrive) const {
    std::string s = ind + "{\n" + ind + "  const int64_t cs_done = cs_n.meet((unsigned)((Mr + BM - 1) / BM), " + u + ", " + threads + ", 8);\n";
    if (arrive) s += ind + "  cs_n.arrive(cs_count, n0, BN, " + u + ");\n";
    s += ind + "  if (cs_done >= 0) {\n" + ind + "    __threadfence();\n";
    s += ind + "    for (int j = " + u + "; j < BN && cs_done + j < N; j += " + threads + ") {\n";
    s += ind + "      const int64_t col = cs_done + j;\n" + ind + "      " +
         sums_.store("col", "kiln_colsum_total(cs_part, col, N, (Mr + BM - 1) / BM)") + "\n" + ind + "    }\n";
    return s + ind + "    if (" + u + " == 0) cs_count[cs_done / BN] = 0;\n" + ind + "  }\n" + ind + "}\n";
  }

  // An interior tile's stores, 32 columns at a time: each thread writes its fragments of
  // them to its warpgroup's staging area (shared memory), then reads back 4 consecutive
  // columns of one row per group, so that every slot of the epilogue is one vector access
  // per group and a warp's accesses cover whole rows. The epilogue's loads run `ahead`
  // chunks before their use (the first ones before the last MMAs finish): up to three
  // chunks, about 24 more registers, since a chunk's compute is short next to a load from
  // memory (W4's `dy @ W2.t() * gelu'(pre)` reads pre).
  std::string staged_stores(const std::string& done) const {
    auto S = [](int v) { return std::to_string(v); };
    const int chunks = c_.bn / kWgmmaStageCols, groups = 64 * kWgmmaStageCols / (128 * kGemmGroupWidth);
    const std::string P = S(kWgmmaStagePitch);
    const bool sums = sums_.of_stored();
    std::vector<MatmulEpilogue::Group> g;
    for (int ch = 0; ch < chunks; ++ch)
      for (int q = 0; q < groups; ++q)
        g.push_back(group_("m0 + c * 64 + " + S(q * 16) + " + t / 8", "n0 + " + S(ch * kWgmmaStageCols) + " + (t % 8) * 4", "f",
                           "c" + S(ch) + "g" + S(q), sums ? "kiln_cs + " + S(ch * 4) : ""));
    std::string s = "      const int t = threadIdx.x % 128;\n";
    // Column sums: thread t's columns of chunk ch, ch * 32 + (t % 8) * 4 .., in kiln_cs[ch * 4 ..].
    if (sums) s += "      float kiln_cs[BN / 8];\n#pragma unroll\n      for (int i = 0; i < BN / 8; ++i) kiln_cs[i] = 0.f;\n";
    s += "      float* stg = (float*)(kiln_smem + (rest - kiln_smem_addr(kiln_smem))) + c * 64 * " + P + ";\n";
    const int chunk_regs = groups * g[0].load_bytes / 4;
    const int ahead = std::clamp(chunk_regs ? 24 / chunk_regs : 3, 1, std::min(3, chunks));
    for (int ch = 0; ch < ahead; ++ch)
      for (int q = 0; q < groups; ++q) s += g[size_t(ch * groups + q)].loads;
    s += "      " + done;
    for (int ch = 0; ch < chunks; ++ch) {
      if (ch > 0 || c_.persistent) s += "      kiln_bar_sync(1 + c, 128);  // the previous chunk's reads are done\n";
      for (int jj = 0; jj < kWgmmaStageCols / 8; ++jj) {
        std::string j = S(ch * kWgmmaStageCols / 8 + jj), col = S(jj * 8) + " + (lane % 4) * 2";
        s += "      *(float2*)&stg[(w * 16 + lane / 4) * " + P + " + " + col + "] = make_float2(d[" + j + " * 4], d[" + j + " * 4 + 1]);\n";
        s += "      *(float2*)&stg[(w * 16 + lane / 4 + 8) * " + P + " + " + col + "] = make_float2(d[" + j + " * 4 + 2], d[" + j + " * 4 + 3]);\n";
      }
      s += "      kiln_bar_sync(1 + c, 128);\n";
      if (ch + ahead < chunks)
        for (int q = 0; q < groups; ++q) s += g[size_t((ch + ahead) * groups + q)].loads;
      for (int q = 0; q < groups; ++q) {
        s += "      {\n        const float4 f4 = *(const float4*)&stg[(" + S(q * 16) + " + t / 8) * " + P + " + (t % 8) * 4];\n";
        s += "        const float f[4] = {f4.x, f4.y, f4.z, f4.w};\n" + g[size_t(ch * groups + q)].body + "      }\n";
      }
    }
    // Column sums: the last chunk read, the staging takes each warp's row of sums (column_sums).
    if (sums) s += "      kiln_bar_sync(1 + c, 128);\n      kiln_colsum_warp<BN / 8>(kiln_cs, stg + w * BN, lane);\n";
    return s;
  }

  GemmConfig c_;
  GemmOperands o_;
  DType d_;
  GemmWriter w_;
  GemmGroupStore group_;
  GemmColumnSums sums_;
  GemmTotal total_;
};

}  // namespace kiln::codegen
