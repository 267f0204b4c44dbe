// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The GEMM kernels of the GPU dialects (codegen/gpu.hpp writes the function
// around them). Takes a GemmConfig (tile shapes, as compile-time constants), the
// operands' layouts (which dim of A and of B is contiguous) and the dtype; gives
// the body of one kernel over the matmul argument block
//   M = [nd, K, sizes[nd], strides[slot][nd]] (slots 0 and 1: A and B)
// with C[b, m, n] = sum_k A[b, m, k] B[b, k, n], one output tile per block,
// blockIdx.z the batch (broadcast batch dims have stride 0).
//
// Four kinds:
//   wgmma bf16/f16 on sm_90 (built for sm_90a), and f32 where TF32 is allowed (an operand
//         that is not K-major copied K-major first): codegen/gemm_sm90.hpp.
//   mma   bf16/f16 on sm_80+: cp.async multi-stage pipeline into padded shared
//         memory (rows padded by 16 bytes: ldmatrix and the copies meet no bank
//         conflicts), ldmatrix (.trans for M-major A and N-major B),
//         mma.sync m16n8k16 with f32 accumulators. Needs each operand contiguous
//         along one of its two matrix dims and 16-byte aligned rows (the host
//         checks; else simt). Ranges past M, N or K are zero-filled by the copies.
//         f32 where TF32 is allowed (core/options.hpp): the same pipeline,
//         mma.sync m16n8k8 tf32, each fragment element rounded to TF32 (cvt.rna);
//         K-major tiles read by ldmatrix (a 32-bit element is two b16 columns),
//         M- and N-major ones by 32-bit loads from rows padded by 32 bytes.
//   mfma  bf16/f16 on AMD CDNA (gfx908, gfx90a, gfx94x), HIP: codegen/gemm_mfma.hpp.
//   simt  any dtype, any strides, CUDA and HIP: register-tiled (WM x WN outputs
//         per thread, in runs of 16 bytes: one shared-memory read each), K tiles
//         double-buffered through registers (the next tile's loads in flight while
//         this one is multiplied), accumulating in the compute type. Where the tiles
//         are fewer than the SMs, K in slices of a block's threads (k_slices) and in
//         ranges of blocks whose sums the tile's last block adds (split_k).
// Every output element leaves through one callback, store(row, col, value): the
// fused epilogue of a matmul kernel plugs in there.
//
// The config choice: gemm_candidates(dtype, arch) lists what a tuner may time;
// gemm_heuristic(problem) is the default mode's pick; gemm_chooser() is the hook
// through which a tuner (or a test) forces a config.
#pragma once
#include <algorithm>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/codegen/kernel.hpp"

namespace kiln::codegen {

enum class GemmKind : uint8_t { simt, mma, wgmma, mfma };

// One GEMM variant's compile-time shape. mma: (bm/wm) x (bn/wn) warps, each
// computing a wm x wn warp tile; simt: (bm/wm) x (bn/wn) threads, each a
// wm x wn register tile; wgmma: a producer warpgroup and bm/wm consumer
// warpgroups, each a wm x bn (= wn) slice of the tile; mfma: as mma, in
// wavefronts of 64. bk: K per pipeline step; stages: the depth of the copy
// pipeline (cp.async or the copy engine; mfma: 2, its LDS buffers).
struct GemmConfig {
  GemmKind kind = GemmKind::simt;
  int bm = 64, bn = 64, bk = 16, wm = 4, wn = 4, stages = 2;
  // wgmma only: one block per SM walks the tiles (gemm_sm90.hpp), its producer loading the
  // next tile while the consumers store this one.
  bool persistent = false;
  // wgmma, persistent only: the producer warpgroup's three idle warps run the epilogue. The
  // consumers leave each tile's accumulators in shared memory (in the output's 16-bit dtype:
  // the matmul's own value) and go on to the next tile's MMAs while it is stored (gemm_sm90.hpp).
  bool split_epilogue = false;
  // wgmma, persistent only: where the tiles leave the grid's last wave partial, those tiles are
  // cut in K into pieces that go round the blocks after the whole tiles, all blocks on the same
  // K range at once, and each tile's last piece adds the others' sums (a split tail;
  // device/gemm_walk.h), so most SMs no longer idle through the last wave.
  bool split_tail = false;
  // With split_tail: the pieces a tail tile is cut into (0: the walk's choice, kiln_tail_parts);
  // a benchmark's knob (KILN_BENCH_TAIL_PARTS), its own program.
  int tail_parts = 0;
  // Tiles of a raster group, one above the other: consecutive tiles walk down a group before
  // the next column, so a wave of blocks shares A's row panels and B's column panels in L2.
  // NOTE: on an H200 W4's step took the same time at 16 as at 8, longer at 32 and 64
  // (KILN_BENCH_GEMM_GROUPS; docs/benchmarks.md, twelfth session).
  int group = 8;
  // The raster groups side by side instead: `group` tiles wide, consecutive tiles walking along
  // a row of the group before the next row, so that neighbours in launch order share A's row
  // panel (in clusters, the operand each block loads itself) rather than B's. NOTE: the L2
  // request coalescer merges two SMs' reads of one sector that arrive together; kiln's clusters
  // get 6-18 M sectors a W4 GEMM merged, cuBLAS's 50-56 M. Side by side gave fewer (3-6 M) and no
  // speed. Merges need two SMs' loads of one box within about 32 ns of each other (one TPC or
  // not); kiln's clusters come that close for a ninth of A's sectors, one block a tile for most
  // of B's (docs/benchmarks.md, forty-seventh, forty-eighth and fifty-fifth sessions). Where
  // kiln::gemm_group_across() asks (off by default; gemm_across).
  bool group_across = false;
  // wgmma, persistent: blocks work in clusters of this many (1 or 2) on tiles
  // one above the other, which share B's tile: each block's copy engine brings its half of
  // B's box into both blocks' shared memory (TMA multicast), so a 128x256 block reads 3/4 of
  // the bytes from L2 that it would alone (cuBLAS's kernels for W4 run in clusters of two).
  // NOTE: not four: an H200 keeps 30 clusters of four blocks of one SM each resident, 120 of
  // its 132 SMs (cudaOccupancyMaxActiveClusters; docs/benchmarks.md, thirty-fifth session).
  // Built on branch gemm-cluster4 (four tiles one above the other, a quarter of B's box each)
  // and timed on an H100 (fifty-second session): each of W4's GEMMs took 3-9% longer, at a
  // higher clock (the idle SMs' power) but more energy a flop, and the step 5% longer.
  int cluster = 1;
  // simt only: the block's threads in this many groups, each multiplying its own slice of
  // every K tile into a whole output tile of its own, summed through shared memory at the
  // end (sliced K): more threads at work on a tile where the tiles are fewer than the SMs.
  int k_slices = 1;
  // simt only: each tile's K cut into this many ranges, one block each (blockIdx.y); each leaves
  // its sums in the workspace and the tile's last block to finish adds them all, in order, and
  // stores (split-K): blocks for the SMs where the tiles are few and K is long.
  int split_k = 1;
  // wgmma, persistent, no split tail: the blocks (clusters) take their tiles from one counter of
  // the grid, in raster order, instead of each a fixed list (tile blockIdx.x, + gridDim.x, ...), so
  // that one that starts late, its SM still busy with another kernel, takes fewer
  // (kiln::gemm_dynamic_tiles; device/gemm_wgmma.cuh's kiln_tile_fetch).
  bool dynamic = false;
  // wgmma, persistent, no split tail: each block's odd-numbered tiles (its tile blockIdx.x +
  // i * gridDim.x for odd i: the grid's odd waves) walk K from its end, and odd raster groups
  // walk their columns from the right, so that a wave starts on the A or B panels, and at the
  // K offsets, that the wave before it left in L2 (kiln::gemm_serpentine).
  bool serpentine = false;

  int threads() const {
    if (kind == GemmKind::wgmma) return (bm / wm + 1) * 128;
    return (bm / wm) * (bn / wn) * (kind == GemmKind::mma ? 32 : kind == GemmKind::mfma ? 64 : k_slices);
  }
  std::string str() const {
    static const char* names[] = {"simt", "mma", "wgmma", "mfma"};
    return std::string(names[int(kind)]) + "_" + std::to_string(bm) + "x" + std::to_string(bn) +
           "x" + std::to_string(bk) + "_" + std::to_string(wm) + "x" + std::to_string(wn) + "_s" + std::to_string(stages) +
           (persistent ? "_p" : "") + (split_epilogue ? "e" : "") + (split_tail ? "t" + (tail_parts ? std::to_string(tail_parts) : "") : "") +
           (dynamic ? "d" : "") + (serpentine ? "z" : "") + (group != 8 || group_across ? "_g" + std::to_string(group) + (group_across ? "w" : "") : "") +
           (cluster > 1 ? "_c" + std::to_string(cluster) : "") + (k_slices > 1 ? "_ks" + std::to_string(k_slices) : "") +
           (split_k > 1 ? "_sk" + std::to_string(split_k) : "");
  }
  bool operator==(const GemmConfig&) const = default;
};

// Which matrix dim of each operand is contiguous: A [M, K] K-major is row-major
// (x), M-major is a transposed view; B [K, N] K-major is a transposed view
// (W.t() of a row-major W [N, K]), N-major is row-major.
struct GemmOperands {
  bool a_k_major = true, b_k_major = false;
  int elem_bytes = 2;  // of A's and B's elements (the mma kind's shared-memory tiles: 2, or 4 for TF32)
  bool operator==(const GemmOperands&) const = default;
};

// What the config choice sees of one matmul call. arch: the NVIDIA compute
// capability (80 for sm_80, 90 for sm_90); an AMD target as gemm_amd_arch gives
// it (negative); 0 for others. tensor_ok: the operands meet the mma and mfma
// kinds' layout and alignment needs; tma_ok: also the copy
// engine's (every row and batch stride a multiple of 16 bytes, at most one batch dim).
struct GemmProblem {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  DType dtype = DType::f32;
  GemmOperands ops;
  bool tensor_ok = false, tma_ok = false;
  int arch = 0, sm_count = 1;
  // The fused epilogue computes two transcendentals an element, or one and reads a matrix
  // (Layout::epilogue_heavy): worth warps of its own.
  bool heavy_epilogue = false;
  // f32 on TF32 tensor cores is allowed (kiln::allow_tf32()).
  bool tf32 = false;
  // A persistent config splits its last wave's tiles in K where that pays (kiln::gemm_split_tail()).
  bool split_tail = false;
  // A persistent config takes its tiles from the grid's counter (kiln::gemm_dynamic_tiles()).
  bool dynamic_tiles = false;
  // A persistent config walks its odd waves' K and its odd groups' columns backwards (kiln::gemm_serpentine()).
  bool serpentine = false;
  // A persistent config's raster groups lie side by side (kiln::gemm_group_across()).
  bool group_across = false;
};

inline bool gemm_has_mma(DType d, int arch, bool tf32 = false) {
  return arch >= 80 && (d == DType::bf16 || d == DType::f16 || (tf32 && d == DType::f32));
}
// wgmma exists on sm_90 alone (sm_90a code does not run on later GPUs); f32 where TF32 is allowed.
inline bool gemm_has_wgmma(DType d, int arch, bool tf32 = false) {
  return arch == 90 && (d == DType::bf16 || d == DType::f16 || (tf32 && d == DType::f32));
}

// An AMD target in GemmProblem::arch: its gfx number read as hex, negated (gfx90a -> -0x90a,
// gfx1030 -> -0x1030; the features after a ':' ignored), so that no NVIDIA test (arch >= 80)
// holds for it. 0 for a name that is no gfx target.
inline int gemm_amd_arch(std::string_view target) {
  std::string_view t = target.substr(0, target.find(':'));
  if (t.size() < 6 || t.size() > 8 || t.substr(0, 3) != "gfx") return 0;
  int v = 0;
  for (char ch : t.substr(3)) {
    int digit = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
    if (digit < 0) return 0;
    v = v * 16 + digit;
  }
  return -v;
}
// CDNA's matrix cores (gfx908, gfx90a, gfx940-gfx942) for bf16/f16; RDNA has none of them.
inline bool gemm_has_mfma(DType d, int arch) {
  return (arch == -0x908 || arch == -0x90a || (arch <= -0x940 && arch >= -0x942)) && (d == DType::bf16 || d == DType::f16);
}

inline size_t gemm_shared_bytes(const GemmConfig& c, const GemmOperands& o);

// The most dynamic shared memory a block of an NVIDIA GPU of this compute capability may
// opt into: 227 KB on sm_90 and sm_100, 163 KB on sm_80 and sm_87, 99 KB on the others.
inline size_t gemm_max_shared(int arch) {
  if (arch == 90 || arch == 100) return 227u * 1024;
  return arch == 80 || arch == 87 ? 163u * 1024 : 99u * 1024;
}

// The SIMT kind's accumulator bytes (the compute type: f32 for 16-bit dtypes, int64_t for
// integers), its run G (the elements a thread owns side by side: 16 bytes where its rows and
// columns hold whole runs, else 1) and its static shared memory: two buffers of A's and B's
// K tiles, rows padded by G elements (with K slices, the same room then holds all but the
// first slice's sums, where they take more).
inline int gemm_simt_acc_bytes(DType d) { return d == DType::f64 || d == DType::i32 || d == DType::i64 ? 8 : 4; }
inline int gemm_simt_run(const GemmConfig& c, DType d) {
  const int g = 16 / gemm_simt_acc_bytes(d);
  return c.wm % g == 0 && c.wn % g == 0 ? g : 1;
}
inline size_t gemm_simt_shared_bytes(const GemmConfig& c, DType d) {
  const int g = gemm_simt_run(c, d);
  const size_t tiles = size_t(2) * size_t(c.bk) * size_t(c.bm + g + c.bn + g), sums = size_t(c.k_slices - 1) * size_t(c.bm) * size_t(c.bn);
  return std::max(tiles, sums) * size_t(gemm_simt_acc_bytes(d));
}

// A persistent wgmma config whose blocks walk whole tiles (no split tail): the walks that dynamic
// tiles and serpentine walks reorder (GemmConfig::dynamic, GemmConfig::serpentine).
inline bool gemm_walks_whole_tiles(const GemmConfig& c) { return c.kind == GemmKind::wgmma && c.persistent && !c.split_tail; }

// Whether a config can compute this problem.
inline bool gemm_fits(const GemmConfig& c, const GemmProblem& p) {
  if ((c.k_slices > 1 || c.split_k > 1) && c.kind != GemmKind::simt) return false;
  GemmOperands o = p.ops;
  o.elem_bytes = int(info(p.dtype).bytes);  // a 16-bit config's tiles take twice the room in f32
  // wgmma: a K step is one 128-byte swizzle row (64 16-bit elements, 32 TF32 ones), or in 16
  // bits a 64-byte one (32 elements: gemm_sm90.hpp); the split epilogue's staging holds the
  // output in 16 bits; the stages in the device's shared memory (a 16-bit config's K steps of
  // 32 read as TF32 would take twice its room).
  if (c.kind == GemmKind::wgmma)
    return p.tma_ok && p.tensor_ok && gemm_has_wgmma(p.dtype, p.arch, p.tf32) &&
           (c.bk * o.elem_bytes == 128 || (c.bk == 32 && o.elem_bytes == 2)) && !(c.split_epilogue && p.dtype == DType::f32) &&
           (c.cluster == 1 || (c.persistent && c.bn % (64 * c.cluster) == 0)) && (!(c.dynamic || c.serpentine) || gemm_walks_whole_tiles(c)) &&
           gemm_shared_bytes(c, o) <= gemm_max_shared(p.arch);
  if (c.kind == GemmKind::mma)
    return p.tensor_ok && gemm_has_mma(p.dtype, p.arch, p.tf32) && gemm_shared_bytes(c, o) <= gemm_max_shared(p.arch);
  if (c.kind == GemmKind::mfma) return p.tensor_ok && gemm_has_mfma(p.dtype, p.arch);
  return gemm_simt_shared_bytes(c, p.dtype) <= 48u * 1024;  // static shared memory
}

// A SIMT config with its K in slices of the block's threads and in ranges of blocks (split-K).
inline GemmConfig gemm_sliced(GemmConfig c, int k_slices, int split_k = 1) {
  c.k_slices = k_slices, c.split_k = split_k;
  return c;
}

// Every config a tuner may time for this dtype and architecture; of configs with the
// same block tile, the best-known first (the heuristic takes that one).
inline std::vector<GemmConfig> gemm_candidates(DType d, int arch, bool tf32 = false) {
  using K = GemmKind;
  // TF32: K steps of 16 or 32 (as many bytes as bf16's 32 or 64), stages that fit an A100's
  // 163 KB and leave a Hopper room for two blocks. NOTE: on an H200 (f32 4096^3, each forced;
  // docs/benchmarks.md, sixteenth session) 128x128x32 s3 ran at 156 TFLOP/s, 128x128x16 s4 at
  // 145, 128x256x32 s3 at 141, the rest 107-122; 128x128x32 s4 (143 KB: one block an SM) at 60.
  // TF32 on sm_90: wgmma first, as bf16's below with K steps of 32 (the same 128 bytes; an
  // operand that is not K-major is copied K-major before the GEMM: GpuVariant::stage). NOTE:
  // on an H200 (f32 4096^3, B staged, each forced; docs/benchmarks.md, twenty-first session)
  // 128x256 s4 persistent ran at 364 TFLOP/s, s4 362, s3 349, 128x192 322, 128x128 s6
  // persistent 320, s6 308; mma.sync's best 156. cuBLAS: 381-391.
  std::vector<GemmConfig> tf32_hopper;
  if (d == DType::f32 && gemm_has_wgmma(d, arch, tf32))
    tf32_hopper = {{K::wgmma, 128, 256, 32, 64, 256, 4, true}, {K::wgmma, 128, 128, 32, 64, 128, 6},
                   {K::wgmma, 128, 192, 32, 64, 192, 4},       {K::wgmma, 128, 256, 32, 64, 256, 4},
                   {K::wgmma, 128, 256, 32, 64, 256, 3},       {K::wgmma, 128, 128, 32, 64, 128, 6, true}};
  if (d == DType::f32 && gemm_has_mma(d, arch, tf32)) {
    std::vector<GemmConfig> ampere = {{K::mma, 128, 128, 32, 64, 64, 3}, {K::mma, 128, 128, 16, 64, 64, 4}, {K::mma, 128, 128, 16, 64, 64, 6},
            {K::mma, 128, 256, 16, 64, 64, 4}, {K::mma, 128, 256, 32, 64, 64, 3}, {K::mma, 256, 128, 16, 64, 64, 4},
            {K::mma, 128, 128, 32, 64, 32, 3}, {K::mma, 64, 128, 32, 32, 64, 4},  {K::mma, 64, 64, 32, 32, 32, 4}};
    tf32_hopper.insert(tf32_hopper.end(), ampere.begin(), ampere.end());
    return tf32_hopper;
  }
  // NOTE: measured on an H200 (bench/gpu_bench.cpp, KILN_BENCH_GEMM_SWEEP, bf16 8192^3):
  // 128x128 blocks of four 64x64 warps, two blocks per SM, beat one 8-warp 128x256 block
  // (333 against 276 TFLOP/s; docs/benchmarks.md has the sweep).
  // wgmma: 128-row tiles of two consumer warpgroups, K steps of 64 (one 128-byte swizzle row).
  std::vector<GemmConfig> hopper;
  if (gemm_has_wgmma(d, arch))
    // NOTE: with every GEMM forced to each config in one process on an H200, the W4 step took
    // 10.21 ms with the persistent 128x256 kernel, 10.80 ms with the 4-stage one
    // (KILN_BENCH_GEMM_SWEEP=1 gpu_bench); across machines the step varied as much.
    // NOTE: ping-pong consumers (each warpgroup whole 128x128 or 64x256 tiles in turn, one's
    // epilogue beside the other's MMAs) made W4's step slower on an H200: 10.72-11.02 against
    // 10.27-10.55 ms on its two GEMMs with gelu, 11.58-11.86 on all six (branch gemm-pingpong;
    // docs/benchmarks.md, twenty-fifth session).
    // NOTE: split_tail is left to the heuristic (gemm_split): no candidate of its own.
    hopper = {{K::wgmma, 128, 256, 64, 64, 256, 4, true}, {K::wgmma, 128, 128, 64, 64, 128, 6},
              {K::wgmma, 128, 192, 64, 64, 192, 4}, {K::wgmma, 128, 256, 64, 64, 256, 4},
              {K::wgmma, 128, 256, 64, 64, 256, 3}, {K::wgmma, 128, 128, 64, 64, 128, 6, true},
              // Split epilogue (the producer warpgroup's idle warps): its staging takes one stage's room.
              // NOTE: an overlapped epilogue (the consumers run a tile's epilogue a slice per K step of
              // their next tile, between issuing the MMAs and waiting for them) made W4's step slower
              // on an H200: 10.84-10.95 against 10.60-10.69 ms, dy @ W2.t() * gelu'(pre) 2.09 against
              // 1.85 ms (branch gemm-overlap-epilogue; docs/benchmarks.md, twenty-fourth session).
              {K::wgmma, 128, 256, 64, 64, 256, 3, true, true}, {K::wgmma, 128, 192, 64, 64, 192, 4, true, true}};
  if (gemm_has_mma(d, arch)) {
    std::vector<GemmConfig> ampere = {{K::mma, 128, 128, 32, 64, 64, 4}, {K::mma, 128, 128, 32, 64, 64, 3}, {K::mma, 128, 128, 32, 64, 64, 5},
            {K::mma, 128, 128, 64, 64, 64, 3}, {K::mma, 128, 128, 64, 64, 64, 2}, {K::mma, 128, 128, 32, 64, 32, 4},
            {K::mma, 128, 256, 64, 64, 64, 3}, {K::mma, 128, 256, 32, 64, 64, 4}, {K::mma, 256, 128, 64, 64, 64, 3},
            {K::mma, 256, 128, 32, 64, 64, 4}, {K::mma, 64, 128, 32, 32, 64, 4}, {K::mma, 64, 64, 32, 32, 32, 4}};
    hopper.insert(hopper.end(), ampere.begin(), ampere.end());
    return hopper;
  }
  // NOTE: not yet measured on an AMD GPU. 64x64 wavefront tiles, as the mma kind's warp tiles;
  // LDS at most 64 KiB (gemm_mfma.hpp).
  if (gemm_has_mfma(d, arch))
    return {{K::mfma, 128, 128, 32, 64, 64, 2}, {K::mfma, 128, 128, 32, 32, 64, 2}, {K::mfma, 128, 128, 16, 64, 64, 2},
            {K::mfma, 128, 64, 64, 64, 32, 2},  {K::mfma, 64, 128, 32, 32, 64, 2},  {K::mfma, 64, 64, 64, 32, 32, 2},
            {K::mfma, 64, 64, 32, 32, 32, 2}};
  if (d == DType::f64 || d == DType::i64) return {{K::simt, 64, 64, 16, 4, 4, 1}, {K::simt, 32, 32, 16, 2, 2, 1}};
  // NOTE: on an H200 (f32 4096^3, each forced; docs/benchmarks.md, sixteenth and eighteenth
  // sessions) 128x128x8 ran at 35.9 TFLOP/s, 128x128x16 at 29.0 (the loads as now); with the
  // 32-bit K check, 64x64x16 24.9, 32x32x16 9.3, 128x64x8 and 64x128x8 (128 threads) 25.1–25.4.
  // Sliced K, for problems of fewer tiles than SMs: a 32x32 tile in 4 slices (256 threads), a 64x64 one in 2;
  // K in 4 ranges of blocks (split-K) of the 32x32 and 64x64 tiles.
  return {{K::simt, 128, 128, 8, 8, 8, 1}, {K::simt, 64, 64, 16, 4, 4, 1}, {K::simt, 32, 32, 16, 2, 2, 1},
          gemm_sliced({K::simt, 32, 32, 32, 4, 4, 1}, 4), gemm_sliced({K::simt, 64, 64, 16, 4, 4, 1}, 2),
          gemm_sliced({K::simt, 32, 32, 32, 4, 4, 1}, 4, 4), gemm_sliced({K::simt, 64, 64, 16, 4, 4, 1}, 1, 4)};
}

// 16-bit wgmma configs in K steps of 32 (64-byte K-major rows, swizzled in 64 bytes: twice
// the stages in the same room), so that the split epilogue's ring, whose staging takes one
// 64-wide stage's room, reaches as far ahead as a plain 128x256 config's four stages (4 of 6
// stages of 24 KB loading while the consumers hold 2, against 1 of 3 of 48 KB); and the plain
// 128x256 in 8 such stages. NOTE: not among the candidates: correct on an H200 (the gpu suite
// forces them, test_gemm.cpp) but slower there, W4's step 0.05-0.11 ms longer back to back with
// its two heavy GEMMs in the first, 0.14-0.20 ms with all six in K steps of 32, three rounds
// (KILN_BENCH_HEAVY_AB; docs/benchmarks.md, thirty-seventh session).
inline std::vector<GemmConfig> gemm_k32_configs() {
  using K = GemmKind;
  return {{K::wgmma, 128, 256, 32, 64, 256, 6, true, true}, {K::wgmma, 128, 256, 32, 64, 256, 8, true}};
}

// Blocks (output tiles) a config launches for this problem.
inline int64_t gemm_tiles(const GemmConfig& c, const GemmProblem& p) {
  return ((p.m + c.bm - 1) / c.bm) * ((p.n + c.bn - 1) / c.bn) * p.batch;
}

// The persistent kernel's walk (device/gemm_walk.h), compiled for the host too.
namespace walk {
#define KILN_FN inline
#include "kiln/codegen/device/gemm_walk.h"
#undef KILN_FN
}  // namespace walk

// The output tiles of an [m, n] matrix for config c, in clusters `c.cluster` tiles tall (one
// tile each without), and a persistent config's grid in clusters: one an SM's worth, up to the
// tiles (runtime's gpu_launch_shape launches that many times the cluster's blocks).
inline int64_t gemm_cluster_tiles(const GemmConfig& c, int64_t m, int64_t n) {
  return ((m + int64_t(c.bm) * c.cluster - 1) / (int64_t(c.bm) * c.cluster)) * ((n + c.bn - 1) / c.bn);
}
inline int64_t gemm_persistent_clusters(const GemmConfig& c, int64_t tiles, int sm_count) {
  return std::min<int64_t>(tiles, std::max<int64_t>(sm_count / c.cluster, 1));
}

// A persistent config's walk over an [m, k] x [k, n] problem (batch of them) on `sm_count`
// SMs, as its first block (or cluster) begins it: where it splits its tail, how.
inline walk::KilnWalk gemm_walk(const GemmConfig& c, int64_t m, int64_t n, int64_t k, int64_t batch, int sm_count) {
  const int64_t tiles = gemm_cluster_tiles(c, m, n);
  return walk::KilnWalk(tiles, int((k + c.bk - 1) / c.bk), gemm_persistent_clusters(c, tiles, sm_count), 0, batch,
                        c.persistent && c.split_tail, c.tail_parts);
}

// A persistent config whose last wave of tiles is split in K (GemmConfig::split_tail), where
// kiln::gemm_split_tail() asks for it and the walk finds a cut that pays (kiln_tail_parts). Off
// by default. NOTE: on an H100 (docs/benchmarks.md, thirty-ninth session) W4's x @ W1 and
// dy @ W2.t() (a tail of 2 cluster tiles of 66) ran 0.01-0.03 ms faster alone, its four other
// GEMMs (tails of 34 and 50, 3-4 rounds of pieces) no faster, and the step 0.12-0.21 ms slower
// back to back (KILN_BENCH_TAIL_AB), slower the more pieces (KILN_BENCH_TAIL_PARTS): kernel
// overlap already runs the next GEMM on those SMs. (Its predecessor, stream-K, cut the last
// wave and a full one into a run of K steps a block: on an H200 W4's GEMMs with K = 16384 ran
// 27% slower, h @ W2 1.39 -> 1.76 ms, the rest 0-5%, the step 10.74 -> 11.55 ms, blocks at
// different K offsets reading A's and B's panels alone; docs/benchmarks.md, fourteenth session.)
inline GemmConfig gemm_split(const GemmConfig& c, const GemmProblem& p) {
  GemmConfig t = c;
  t.split_tail = true, t.dynamic = false, t.serpentine = false;
  return p.split_tail && c.persistent && gemm_walk(t, p.m, p.n, p.k, p.batch, p.sm_count).parts > 1 ? t : c;
}

// A persistent config (no split tail) taking its tiles from the grid's counter, where
// kiln::gemm_dynamic_tiles() asks for it. Off by default. NOTE: on an H200 (docs/benchmarks.md,
// forty-second session) W4's step ran the same with it, three rounds alternated, and so did its
// six GEMMs back to back, the same bits (why no block gained from it is not taken apart).
inline GemmConfig gemm_dynamic(const GemmConfig& c, const GemmProblem& p) {
  GemmConfig t = c;
  t.dynamic = true;
  return p.dynamic_tiles && gemm_walks_whole_tiles(c) ? t : c;
}

// A persistent config (no split tail) walking its odd waves' K steps and its odd raster groups'
// columns backwards, where kiln::gemm_serpentine() asks for it (GemmConfig::serpentine; on by
// default). NOTE: a wave of W4's GEMMs streams 34-136 MB of A's and B's panels through a 50 MB
// L2; the wave after it shares half of them (A's rows in a group, B's columns across groups) and
// now starts where the L2 still holds them. On an H100 (docs/benchmarks.md, forty-third session)
// the six read 7-19% fewer bytes from DRAM (ncu: x @ W1 1156 -> 943 MB) and ran 0.2-0.7% faster
// back to back at the power limit (20 of 24 pairs), W4's step 0.5% (9.964 -> 9.914 ms, three rounds);
// on the H200 the step 0.5-0.7% (10.133-10.147 -> 10.074-10.082 ms).
inline GemmConfig gemm_serpentine(const GemmConfig& c, const GemmProblem& p) {
  GemmConfig t = c;
  t.serpentine = true;
  return p.serpentine && gemm_walks_whole_tiles(c) ? t : c;
}

// A persistent config's raster groups side by side (GemmConfig::group_across), where
// kiln::gemm_group_across() asks for it (off by default: no faster on W4, forty-eighth session).
inline GemmConfig gemm_across(const GemmConfig& c, const GemmProblem& p) {
  GemmConfig t = c;
  t.group_across = true;
  return p.group_across && c.persistent ? t : c;
}

// A persistent config in clusters of two blocks, where one matrix (no batch) holds two full
// waves of tiles or more in 8 tile rows or more: a cluster takes two tiles one above the
// other, so an odd last tile row leaves a block idle (at most 1 in rows + 1). NOTE: on an
// H200 W4's six GEMMs took 1.7% and 1.1% less time so in two rounds (11 of 12 faster or the
// same), the step 0.9% less back to back and 0.2% flushed (KILN_BENCH_GEMM_CLUSTER;
// docs/benchmarks.md, fourteenth session): the blocks read a quarter fewer bytes from L2, and
// the step is bound by the power limit.
inline GemmConfig gemm_clustered(const GemmConfig& c, const GemmProblem& p) {
  GemmConfig t = c;
  t.cluster = 2;
  const bool pays = p.batch == 1 && p.sm_count > 0 && gemm_tiles(c, p) >= 2 * p.sm_count && (p.m + c.bm - 1) / c.bm >= 8;
  return c.persistent && c.cluster == 1 && pays && gemm_fits(t, p) ? t : c;
}

// What max-autotune times for this problem: the candidates that fit it; a split epilogue
// only where the epilogue is heavy; where wgmma fits, no mma config (on an H200 every mma
// config ran at half wgmma's speed or less: docs/benchmarks.md; compiling them was a
// third of W4's tuning time); persistent ones in clusters where the heuristic would cluster,
// and where kiln::gemm_split_tail() is on each also with its tail split; and the heuristic's own choice (a SIMT tile's split-K depends on the problem).
inline GemmConfig gemm_heuristic(const GemmProblem& p);
inline std::vector<GemmConfig> gemm_tuning_candidates(const GemmProblem& p) {
  std::vector<GemmConfig> all = gemm_candidates(p.dtype, p.tensor_ok ? p.arch : 0, p.tf32), out;
  bool hopper = std::any_of(all.begin(), all.end(), [&](const GemmConfig& c) { return c.kind == GemmKind::wgmma && gemm_fits(c, p); });
  for (const GemmConfig& c : all)
    if (gemm_fits(c, p) && !(hopper && c.kind == GemmKind::mma) && (p.heavy_epilogue || !c.split_epilogue))
      for (const GemmConfig& whole = gemm_across(gemm_serpentine(gemm_dynamic(gemm_clustered(c, p), p), p), p);
           const GemmConfig& t : {whole, gemm_split(whole, p)})  // split: beside the whole tiles'
        if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  if (GemmConfig h = gemm_heuristic(p); std::find(out.begin(), out.end(), h) == out.end()) out.push_back(h);
  return out;
}

// SIMT's choice: the largest tile (128x128, 64x64, then 32x32, in slices of K where K holds
// two of its steps) whose tiles fill the SMs with K cut into up to 16 ranges of blocks
// (split-K), each at least kGemmMinRange long and the blocks within a tenth of one wave; else
// the smallest tile, split finer (below). NOTE: on an H200 (f32, KILN_BENCH_ONLY=small
// KILN_BENCH_GEMM_SMALL_SWEEP=1 gpu_bench; docs/benchmarks.md, nineteenth session) this took
// [1024,1024]x[1024,1024] from 0.097 to 0.076 ms (128x128, 2 ranges), [128,4096]x[4096,1024]
// from 0.234 to 0.052 (128x128, 16), [256,512]x[512,512] from 0.032 to 0.014 (64x64, 4); each
// within 10% of the best forced config but [32,256]x[256,256] (0.010 against 0.009).
// Where no tile fills the SMs the problem is small and its time is latency (W7's layers):
// the smallest plain tile (each thread owns its outputs: no slices to add up) with K in as
// many ranges as keep the blocks within a tenth of one wave, down to one K step each: a
// block's K steps run one after the other. NOTE: on an H200 (W7 in reduce-overhead mode,
// KILN_BENCH_W7_SWEEP=1 gpu_bench; docs/benchmarks.md, twentieth session) its three GEMMs
// took 21.8 us a call as 32x32 in 4 slices and 2 ranges, 15.5-15.7 us as 32x32 in 8 or 16
// ranges (this rule's 16: 15.3 us), 23.8 us or more as 64x64 in any number of ranges.
inline constexpr int64_t kGemmMinRange = 128;
inline GemmConfig gemm_simt_heuristic(const std::vector<GemmConfig>& all, const GemmProblem& p) {
  std::vector<GemmConfig> ladder;
  for (const GemmConfig& c : all)
    if (c.kind == GemmKind::simt && c.split_k == 1 && c.k_slices == 1) ladder.push_back(c);
  const GemmConfig smallest = ladder.back();
  for (const GemmConfig& c : all)
    if (c.kind == GemmKind::simt && c.split_k == 1 && c.k_slices > 1 && c.bm == 32 && ladder.back().bm == 32 && p.k >= 2 * c.bk)
      ladder.back() = c;
  auto split = [&](GemmConfig c, int64_t min_range) {
    const int64_t tiles = gemm_tiles(c, p);
    while (c.split_k < 16 && tiles * c.split_k * 2 * 10 <= p.sm_count * 11 && p.k >= 2 * c.split_k * min_range) c.split_k *= 2;
    return c;
  };
  for (const GemmConfig& c : ladder) {
    GemmConfig t = split(c, kGemmMinRange);
    if (gemm_tiles(t, p) * t.split_k * 10 >= p.sm_count * 9) return t;
  }
  return split(smallest, smallest.bk);
}

// The default mode's choice, no tuning: the largest block tile (wgmma's 128x256,
// 128x128, then mma's or mfma's 128x128, 64x128, 64x64) that still gives every SM a block
// (larger tiles re-read A and B less), in clusters where that pays (gemm_clustered); else
// the smallest.
inline GemmConfig gemm_heuristic(const GemmProblem& p) {
  auto all = gemm_candidates(p.dtype, p.tensor_ok ? p.arch : 0, p.tf32);
  auto tile = [&](GemmKind kind, int bm, int bn) {
    for (const GemmConfig& c : all)
      if (c.kind == kind && c.bm == bm && c.bn == bn) return c;
    return all.back();
  };
  if (all.front().kind == GemmKind::simt) return gemm_simt_heuristic(all, p);
  GemmKind tc = all.front().kind == GemmKind::mfma ? GemmKind::mfma : GemmKind::mma;  // the tiles below: mma's or mfma's
  std::vector<GemmConfig> ladder = {tile(tc, 128, 128), tile(tc, 64, 128), tile(tc, 64, 64)};
  // NOTE: K of at least one pipeline step; below that the copy engine moves mostly zeros.
  if (all.front().kind == GemmKind::wgmma && gemm_fits(all.front(), p) && p.k >= 64)
    ladder.insert(ladder.begin(), {tile(GemmKind::wgmma, 128, 256), tile(GemmKind::wgmma, 128, 128)});
  // NOTE: "every SM" with a tenth of slack: 128 tiles on 132 SMs is one nearly full wave.
  auto with_epilogue_wg = [&](const GemmConfig& c) {
    if (c.kind == GemmKind::wgmma && p.heavy_epilogue)
      for (const GemmConfig& e : all)
        if (e.split_epilogue && e.bm == c.bm && e.bn == c.bn) return e;
    return c;
  };
  for (const GemmConfig& c : ladder)
    if (gemm_tiles(c, p) * 10 >= p.sm_count * 9)
      return gemm_across(gemm_serpentine(gemm_dynamic(gemm_split(gemm_clustered(with_epilogue_wg(c), p), p), p), p), p);
  return ladder.back();
}

// The config choice: a tuner installs a chooser (its database, or a forced
// config while it times one); an empty result or no chooser means the
// heuristic. A chosen config the problem cannot take falls back to the heuristic
// (a tensor-core config on operands that cannot take tensor cores: simt; an mma config
// too big for the device's shared memory: the heuristic's).
using GemmChooser = std::function<std::optional<GemmConfig>(const GemmProblem&)>;
inline GemmChooser& gemm_chooser() {
  static GemmChooser c;
  return c;
}
inline GemmConfig gemm_choose(const GemmProblem& p) {
  if (const GemmChooser& c = gemm_chooser()) {
    if (std::optional<GemmConfig> got = c(p)) {
      if (gemm_fits(*got, p)) return *got;
      // Operands the tensor cores can take, a config the device cannot (the copy engine, shared memory): the heuristic's.
      if ((got->kind == GemmKind::wgmma || got->kind == GemmKind::mma) && gemm_fits(GemmConfig{GemmKind::mma}, p))
        return gemm_heuristic(p);
      GemmProblem q = p;
      q.tensor_ok = q.tma_ok = false;
      return gemm_heuristic(q);
    }
  }
  return gemm_heuristic(p);
}

// Dynamic tiles' ring in a wgmma kernel's shared memory (device/gemm_wgmma.cuh, KILN_TQ = 4 slots):
// a full and an empty barrier and a 4-byte tile number per slot.
inline constexpr int kWgmmaTileRingBytes = 4 * (8 + 8 + 4);

// wgmma's staged epilogue: per consumer warpgroup, 64 rows x 32 columns of f32
// accumulators, rows 40 floats apart (the fragment writes and the row reads meet no bank conflicts).
inline constexpr int kWgmmaStageCols = 32, kWgmmaStagePitch = 40;
// The split epilogue's staging: the whole tile in 16 bits, rows BN + 8 elements apart (the
// same: 16 bytes of padding per row).
inline size_t gemm_split_staging_bytes(const GemmConfig& c) { return size_t(c.bm) * size_t(c.bn + 8) * 2; }
// After it, the split epilogue's column sums: a row of BN floats per BN / 8 of its 96 threads
// (WgmmaWriter::split_epilogue), 3 KB at any BN, kept whether the kernel sums or not.
inline constexpr size_t kWgmmaSplitSumBytes = 96 * 8 * 4;

// The mma kind's row padding of a shared-memory tile, in elements: 16 bytes where ldmatrix
// reads the rows (16-bit elements; K-major 32-bit ones), which then meet no bank conflicts;
// 32 bytes where lanes read 32-bit elements of four rows at once (TF32 M- and N-major
// tiles: a pitch of 8 banks modulo 32 puts the four rows' eight columns on 32 banks).
inline int gemm_mma_pad(const GemmOperands& o, bool k_inner) { return o.elem_bytes == 4 && !k_inner ? 8 : 16 / o.elem_bytes; }

// Dynamic shared memory of an mma or wgmma kernel (0 for simt: static). wgmma: the
// stages, their full and empty barriers, dynamic tiles' ring, the epilogue's staging
// (split: two more barriers, the tile and the column sums' rows), and 1 KB to align the base to
// the swizzle atom.
inline size_t gemm_shared_bytes(const GemmConfig& c, const GemmOperands& o) {
  if (c.kind == GemmKind::wgmma)
    return size_t(c.stages) * (size_t(c.bm + c.bn) * size_t(c.bk) * size_t(o.elem_bytes) + 16) + (c.dynamic ? kWgmmaTileRingBytes : 0) +
           (c.split_epilogue ? 16 + gemm_split_staging_bytes(c) + kWgmmaSplitSumBytes : size_t(c.bm / c.wm) * 64 * kWgmmaStagePitch * 4) +
           1024;
  if (c.kind != GemmKind::mma) return 0;
  size_t a = o.a_k_major ? size_t(c.bm) * (c.bk + gemm_mma_pad(o, true)) : size_t(c.bk) * (c.bm + gemm_mma_pad(o, false));
  size_t b = o.b_k_major ? size_t(c.bn) * (c.bk + gemm_mma_pad(o, true)) : size_t(c.bk) * (c.bn + gemm_mma_pad(o, false));
  return (a + b) * size_t(o.elem_bytes) * size_t(c.stages);
}

// Emits one output element's store: (row, col, value in the compute type, where the column sums'
// value goes: MatmulEpilogue::store's `sum`) -> statements.
using GemmStore = std::function<std::string(const std::string& row, const std::string& col, const std::string& v, const std::string& sum)>;
// Emits the stores of 4 consecutive output elements (row, col .. col + 3), values vals[0..3],
// each slot one vector access; `tag` names its variables; `sum` the column sums' array ("": none):
// MatmulEpilogue::store_group.
inline constexpr int kGemmGroupWidth = 4;
using GemmGroupStore = std::function<MatmulEpilogue::Group(const std::string& row, const std::string& col, const std::string& vals,
                                                           const std::string& tag, const std::string& sum)>;

// The operands a SIMT GEMM computes as it loads them (a matmul's prologue:
// codegen/kernel.hpp's matmul_prologue): per operand (A, B), the slot of the tensor it
// reads, that tensor's storage type and the function of one element that gives the
// operand's value.
struct GemmPrologue {
  int slot[2] = {-1, -1};
  std::string storage[2], function[2];
  int words = 0;  // the kernel's param words (the functions' scalars among them)
  bool computes(int operand) const { return slot[operand] >= 0; }
  bool any() const { return computes(0) || computes(1); }
};

class GemmWriter {
 public:
  GemmWriter(const GemmConfig& c, const GemmOperands& o, DType d, GemmStore store, GemmPrologue pro = {})
      : c_(c), o_(o), d_(d), store_(std::move(store)), pro_(std::move(pro)) {}

  // The kernel body: P, M are in scope; declares the operands and shapes, then `prelude` (the
  // epilogue's names: MatmulEpilogue::prelude), then the tile loop and the stores.
  std::string body(const std::string& prelude = "") const { return head(prelude) + (c_.kind == GemmKind::mma ? mma() : simt()); }
  const GemmPrologue& prologue() const { return pro_; }

  // What every kind begins with: the operands (A0, B0 at this batch), shapes (Mr, N, K),
  // strides, the prelude, the tile constants and this block's tile (m0, n0).
  std::string head(const std::string& prelude) const {
    std::string s;
    s += "  const int nd = (int)M[0];\n  const int64_t K = M[1];\n  const int64_t* sz = M + 2;\n";
    // Each operand from its slot (a prologue's: the tensor it computes the operand from).
    for (int o = 0; o < 2; ++o) {
      const std::string slot = std::to_string(pro_.computes(o) ? pro_.slot[o] : o), t = pro_.computes(o) ? pro_.storage[o] : storage();
      const std::string X = o ? "B0" : "A0";
      s += "  const int64_t* " + std::string(o ? "sb" : "sa") + " = sz + nd * (1 + " + slot + ");\n";
      s += "  const " + t + "* __restrict__ " + X + " = (const " + t + "*)P[" + slot + "];\n";
    }
    s += "  const int64_t Mr = sz[nd - 2], N = sz[nd - 1];\n";
    s += "  const int64_t sam = sa[nd - 2], sak = sa[nd - 1], sbk = sb[nd - 2], sbn = sb[nd - 1];\n";
    s += "  (void)sam; (void)sak; (void)sbk; (void)sbn;\n";
    s += "  int64_t oa = 0, ob = 0;\n";
    s += "  { int64_t rr = blockIdx.z; for (int d = nd - 3; d >= 0; --d) { const int64_t ix = rr % sz[d]; rr /= sz[d]; "
         "oa += ix * sa[d]; ob += ix * sb[d]; } }\n";
    s += "  A0 += oa; B0 += ob;\n" + prelude;
    s += "  constexpr int BM = " + std::to_string(c_.bm) + ", BN = " + std::to_string(c_.bn) + ", BK = " + std::to_string(c_.bk) +
         ", WM = " + std::to_string(c_.wm) + ", WN = " + std::to_string(c_.wn) + ", NT = " + std::to_string(c_.threads()) + ";\n";
    if (c_.persistent) return s;  // its tile loop places each tile (tile_origin)
    return s + "  int64_t m0, n0;\n" + tile_origin("blockIdx.x", "  ", c_.group, 1, false, c_.group_across);
  }
  // Sets m0, n0 to the origin of tile number `pid`, in a grouped raster: consecutive tiles
  // share A row panels (`group` tiles tall) so that they meet in L2. In clusters of blocks
  // (`cluster` > 1) `pid` numbers the cluster's tiles, `cluster` tiles tall; block kiln_crank
  // of the cluster takes the kiln_crank-th of them.
  // `serpentine`: odd groups take their columns from the right (GemmConfig::serpentine).
  // `across` (GemmConfig::group_across): the groups are `group` tiles wide, walked along their
  // rows; odd groups (serpentine) take their rows from the bottom. One walk serves both: a group
  // spans `group` tiles of one dim (rows; across, columns) and walks the other.
  static std::string tile_origin(const std::string& pid, const std::string& ind, int group, int cluster = 1, bool serpentine = false,
                                 bool across = false) {
    const std::string G = std::to_string(group), TM = cluster > 1 ? "(BM * " + std::to_string(cluster) + ")" : "BM";
    // The spanned dim's tile count and the group's width in it; the walked dim's tile count and index.
    const std::string span = across ? "gn" : "gm", width = across ? "cols" : "rows", walk = across ? "gm" : "gn", at = across ? "row" : "col";
    const std::string per_group = "(" + G + " * " + walk + ")";
    std::string s = ind + "{\n" + ind + "  const int64_t gm = (Mr + " + TM + " - 1) / " + TM + ", gn = (N + BN - 1) / BN, pid = " + pid + ";\n";
    s += ind + "  const int64_t first = pid / " + per_group + " * " + G + ", " + width + " = " + span + " - first < " + G + " ? " + span +
         " - first : " + G + ";\n";
    s += ind + "  const int64_t " + at + " = (pid % " + per_group + ") / " + width + ";\n";
    const std::string within = "(first + (pid % " + per_group + ") % " + width + ")",
                      along = serpentine ? "((pid / " + per_group + ") % 2 ? " + walk + " - 1 - " + at + " : " + at + ")" : at;
    s += ind + "  m0 = " + (across ? along : within) + " * " + TM + (cluster > 1 ? " + kiln_crank * BM" : "") + "; n0 = " +
         (across ? within : along) + " * BN;\n";
    return s + ind + "}\n";
  }
  // One output element's store, skipped past M and N (`checked`), or unconditional (a
  // tile inside the output).
  std::string emit_store(const std::string& ind, const std::string& row, const std::string& col, const std::string& v,
                         bool checked = true, const std::string& sum = "") const {
    if (!checked) return ind + "{ " + store_(row, col, v, sum) + " }\n";
    return ind + "if (" + row + " < Mr && " + col + " < N) { " + store_(row, col, v, sum) + " }\n";
  }

 private:
  std::string storage() const { return storage_type(d_); }
  std::string compute() const {
    return d_ == DType::f64 ? "double" : d_ == DType::i32 || d_ == DType::i64 ? "int64_t" : "float";
  }
  std::string to_compute(const std::string& e) const {
    if (d_ == DType::bf16) return "kiln_bf16_to_f32(" + e + ")";
    if (d_ == DType::f16) return "kiln_f16_to_f32(" + e + ")";
    return "(" + compute() + ")" + e;
  }

  // The mma kind's operands: TF32 (f32 elements, 4 bytes) or 16-bit ones.
  bool tf32() const { return d_ == DType::f32; }
  int elem_bytes() const { return tf32() ? 4 : 2; }

  // One operand tile in shared memory as it lies in global memory: R rows of C
  // contiguous elements, row pitch C + gemm_mma_pad. k_inner: rows are the M (N) dim,
  // from mn0, extent mn_ext, stride `str`, and run along K; else rows are K (stride
  // `str`) and run along M (N) from mn0. Copied in 16-byte chunks of `per` elements.
  struct Tile {
    std::string x;  // "A" or "B"
    int R, C;
    bool k_inner;
    std::string mn0, mn_ext, str;
    int per, pitch;
    int chunks() const { return R * C / per; }
    int stage() const { return R * pitch; }  // elements
  };
  Tile tile(const std::string& x, int r, int c, bool k_inner, const std::string& mn0, const std::string& ext,
            const std::string& str) const {
    GemmOperands o = o_;
    o.elem_bytes = elem_bytes();
    return {x, r, c, k_inner, mn0, ext, str, 16 / elem_bytes(), c + gemm_mma_pad(o, k_inner)};
  }
  std::string elem_type() const { return tf32() ? "float" : "uint16_t"; }
  // The bytes (0..16) of a 16-byte chunk before the end of a row, `left` elements from it.
  std::string chunk_bytes(const std::string& left) const {
    const std::string per = std::to_string(16 / elem_bytes());
    return "(" + left + " >= " + per + " ? 16 : " + left + " > 0 ? (int)" + left + " * " + std::to_string(elem_bytes()) + " : 0)";
  }
  // A tile is copied in turns of NT chunks, thread x taking chunk x of each: with whole rows
  // per turn (NT a multiple of the chunks per row), every chunk of a thread is at the same
  // element e of rows RS = NT / (C / per) apart, so a thread keeps one pointer per operand
  // (not one per chunk: registers that the TF32 tiles, twice the chunks, could not spare).
  int turns(const Tile& t) const { return t.chunks() / c_.threads(); }
  int turn_rows(const Tile& t) const { return c_.threads() / (t.C / t.per); }
  // Per thread, once: its row r0 and element e; k_inner: the pointer to (mn0 + r0, 0) and the
  // rows from there to the end of M (N); else the pointer to (0, mn0 + e) and the bytes
  // (0..16) of its chunks before the end of the row.
  std::string copy_setup(const Tile& t) const {
    if (t.chunks() % c_.threads() || c_.threads() % (t.C / t.per))
      throw Error("kiln: GEMM config " + c_.str() + ": " + t.x + "'s tile is not copied in whole rows per turn of its threads");
    const std::string x = t.x, cpr = std::to_string(t.C / t.per);
    std::string s = "  const int r" + x + " = threadIdx.x / " + cpr + ", e" + x + " = threadIdx.x % " + cpr + " * " + std::to_string(t.per) + ";\n";
    if (t.k_inner)
      return s + "  const int64_t n" + x + " = " + t.mn_ext + " - (" + t.mn0 + " + r" + x + ");\n  const " + elem_type() + "* g" + x + " = " +
             x + "g + (n" + x + " > 0 ? (" + t.mn0 + " + r" + x + ") * " + t.str + " + e" + x + " : 0);\n";
    return s + "  const int64_t left" + x + " = " + t.mn_ext + " - (" + t.mn0 + " + e" + x + ");\n  const int v" + x + " = " +
           chunk_bytes("left" + x) + ";\n  const " + elem_type() + "* g" + x + " = " + x + "g + (int64_t)r" + x + " * " + t.str + " + (v" + x +
           " ? " + t.mn0 + " + e" + x + " : 0);\n";
  }
  // The cp.async of K-tile kt into stage st; past K (and past M/N) zero-filled.
  std::string copy_issue(const Tile& t) const {
    const std::string x = t.x, RS = std::to_string(turn_rows(t)), eb = std::to_string(elem_bytes());
    std::string s = "#pragma unroll\n    for (int i = 0; i < " + std::to_string(turns(t)) + "; ++i) {\n";
    if (t.k_inner)
      s += "      const int64_t left = K - (k0 + e" + x + "); const int bytes = i * " + RS + " < n" + x + " ? " + chunk_bytes("left") + " : 0;\n"
           "      const " + elem_type() + "* g = bytes ? g" + x + " + i * " + RS + " * " + t.str + " + k0 : " + x + "g;\n";
    else
      s += "      const int bytes = k0 + r" + x + " + i * " + RS + " < K ? v" + x + " : 0;\n      const " + elem_type() + "* g = bytes ? g" + x +
           " + (k0 + i * " + RS + ") * " + t.str + " : " + x + "g;\n";
    s += "      kiln_cp_async16(s" + x + " + (uint32_t)((st * " + std::to_string(t.stage()) + " + (r" + x + " + i * " + RS + ") * " +
         std::to_string(t.pitch) + " + e" + x + ") * " + eb + "), g, bytes);\n    }\n";
    return s;
  }

  // Fragments of k-step ks into buffer F (compile-time indices: the register arrays stay
  // registers). `as`, `bs`: the stage's shared addresses; a_ld, b_ld: this lane's offsets.
  // 16-bit (m16n8k16): A's ldmatrix x4 gives (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15),
  // (m 8-15, k 8-15) = a0..a3; B's x4, two n8 tiles: (n 0-7, k 0-7), (n 0-7, k 8-15),
  // (n 8-15, k 0-7), (n 8-15, k 8-15).
  std::string frags16(const Tile& a, const Tile& b, int f, int ks) const {
    auto S = [](int v) { return std::to_string(v); };
    const int mt = c_.wm / 16, nt = c_.wn / 8;
    std::string t, F = S(f);
    for (int i = 0; i < mt; ++i) {
      int off = o_.a_k_major ? (i * 16 * a.pitch + ks * 16) * 2 : (ks * 16 * a.pitch + i * 16) * 2;
      t += std::string("      ") + (o_.a_k_major ? "kiln_ldmatrix_x4" : "kiln_ldmatrix_x4_trans") + "(af[" + F + "][" + S(i) +
           "], as + a_ld + " + S(off) + ");\n";
    }
    for (int p = 0; p < nt / 2; ++p) {
      int off = o_.b_k_major ? (p * 16 * b.pitch + ks * 16) * 2 : (ks * 16 * b.pitch + p * 16) * 2;
      t += std::string("      { uint32_t t[4]; ") + (o_.b_k_major ? "kiln_ldmatrix_x4" : "kiln_ldmatrix_x4_trans") + "(t, bs + b_ld + " +
           S(off) + "); bf[" + F + "][" + S(2 * p) + "][0] = t[0]; bf[" + F + "][" + S(2 * p) + "][1] = t[1]; bf[" + F + "][" +
           S(2 * p + 1) + "][0] = t[2]; bf[" + F + "][" + S(2 * p + 1) + "][1] = t[3]; }\n";
    }
    return t;
  }
  // TF32 (m16n8k8; g = lane / 4, t = lane % 4): a0..a3 = A(g, t), A(g + 8, t), A(g, t + 4),
  // A(g + 8, t + 4); b0, b1 = B(t, g), B(t + 4, g). K-major: an ldmatrix x4 of 8x8 b16
  // matrices is four 8-row x 4-column f32 ones, lane l getting (row l / 4, column l % 4) of
  // each: A's (m 0-7, k 0-3), (m 8-15, k 0-3), (m 0-7, k 4-7), (m 8-15, k 4-7); B's
  // (n 0-7, k 0-3), (n 0-7, k 4-7), (n 8-15, k 0-3), (n 8-15, k 4-7). M- and N-major: each
  // element one 32-bit load. Every element is rounded to TF32 once loaded.
  std::string frags32(const Tile& a, const Tile& b, int f, int ks) const {
    auto S = [](int v) { return std::to_string(v); };
    const int mt = c_.wm / 16, nt = c_.wn / 8;
    std::string t, F = S(f);
    for (int i = 0; i < mt; ++i) {
      std::string r = "af[" + F + "][" + S(i) + "]";
      if (o_.a_k_major) t += "      kiln_ldmatrix_x4(" + r + ", as + a_ld + " + S((i * 16 * a.pitch + ks * 8) * 4) + ");\n";
      else
        for (int q = 0; q < 4; ++q)  // a_q: m + 8 for q odd, k + 4 for q >= 2
          t += "      " + r + "[" + S(q) + "] = kiln_lds32(as + a_ld + " + S(((ks * 8 + q / 2 * 4) * a.pitch + i * 16 + q % 2 * 8) * 4) + ");\n";
      t += "      kiln_tf32x4(" + r + ");\n";
    }
    for (int p = 0; p < nt / 2; ++p) {
      std::string lo = "bf[" + F + "][" + S(2 * p) + "]", hi = "bf[" + F + "][" + S(2 * p + 1) + "]";  // n tiles 2p, 2p + 1
      if (o_.b_k_major)
        t += "      { uint32_t t[4]; kiln_ldmatrix_x4(t, bs + b_ld + " + S((p * 16 * b.pitch + ks * 8) * 4) + "); " + lo + "[0] = t[0]; " + lo +
             "[1] = t[1]; " + hi + "[0] = t[2]; " + hi + "[1] = t[3]; }\n";
      else
        for (int j = 0; j < 2; ++j)
          for (int h = 0; h < 2; ++h)  // n tile 2p + j, k + 4h
            t += "      bf[" + F + "][" + S(2 * p + j) + "][" + S(h) + "] = kiln_lds32(bs + b_ld + " +
                 S(((ks * 8 + h * 4) * b.pitch + p * 16 + j * 8) * 4) + ");\n";
      t += "      kiln_tf32x2(" + lo + "); kiln_tf32x2(" + hi + ");\n";
    }
    return t;
  }

  std::string mma() const {
    const GemmConfig& c = c_;
    const int mt = c.wm / 16, nt = c.wn / 8, kstep = tf32() ? 8 : 16, ksteps = c.bk / kstep, eb = elem_bytes();
    auto S = [](int v) { return std::to_string(v); };
    Tile a = o_.a_k_major ? tile("A", c.bm, c.bk, true, "m0", "Mr", "sam") : tile("A", c.bk, c.bm, false, "m0", "Mr", "sak");
    Tile b = o_.b_k_major ? tile("B", c.bn, c.bk, true, "n0", "N", "sbn") : tile("B", c.bk, c.bn, false, "n0", "N", "sbk");
    std::string s;
    s += "  constexpr int STAGES = " + S(c.stages) + ";\n";
    s += "  extern __shared__ __align__(128) unsigned char kiln_smem[];\n";
    s += "  const uint32_t sA = kiln_smem_addr(kiln_smem), sB = sA + STAGES * " + S(a.stage() * eb) + ";\n";
    s += "  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;\n";
    s += "  const int wm0 = (warp / (BN / WN)) * WM, wn0 = (warp % (BN / WN)) * WN;\n";
    s += "  const int KT = (int)((K + BK - 1) / BK);\n";
    s += "  float acc[" + S(mt) + "][" + S(nt) + "][4];\n";
    s += "#pragma unroll\n  for (int i = 0; i < " + S(mt) + "; ++i)\n#pragma unroll\n  for (int j = 0; j < " + S(nt) +
         "; ++j)\n#pragma unroll\n  for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;\n";
    s += "  const " + elem_type() + "* Ag = (const " + elem_type() + "*)A0; const " + elem_type() + "* Bg = (const " + elem_type() + "*)B0;\n";
    s += copy_setup(a) + copy_setup(b);
    s += "  auto load_stage = [&](int st, int kt) {\n    const int64_t k0 = (int64_t)kt * BK;\n" + copy_issue(a) + copy_issue(b) + "  };\n";
    // Each lane's row address within a stage (bytes). ldmatrix: matrix q = lane / 8 takes row lane % 8.
    std::string q = "(lane / 8)", r = "(lane % 8)", ap = S(a.pitch), bp = S(b.pitch);
    if (!tf32()) {
      if (o_.a_k_major) s += "  const uint32_t a_ld = ((wm0 + lane % 16) * " + ap + " + (lane / 16) * 8) * 2;\n";
      else s += "  const uint32_t a_ld = ((" + q + " / 2 * 8 + " + r + ") * " + ap + " + wm0 + " + q + " % 2 * 8) * 2;\n";
      if (o_.b_k_major) s += "  const uint32_t b_ld = ((wn0 + " + q + " / 2 * 8 + " + r + ") * " + bp + " + " + q + " % 2 * 8) * 2;\n";
      else s += "  const uint32_t b_ld = ((" + q + " % 2 * 8 + " + r + ") * " + bp + " + wn0 + " + q + " / 2 * 8) * 2;\n";
    } else {
      if (o_.a_k_major) s += "  const uint32_t a_ld = ((wm0 + lane % 16) * " + ap + " + (lane / 16) * 4) * 4;\n";
      else s += "  const uint32_t a_ld = ((lane % 4) * " + ap + " + wm0 + lane / 4) * 4;\n";
      if (o_.b_k_major) s += "  const uint32_t b_ld = ((wn0 + " + q + " / 2 * 8 + " + r + ") * " + bp + " + " + q + " % 2 * 4) * 4;\n";
      else s += "  const uint32_t b_ld = ((lane % 4) * " + bp + " + wn0 + lane / 4) * 4;\n";
    }
    auto frags = [&](int f, int ks) { return tf32() ? frags32(a, b, f, ks) : frags16(a, b, f, ks); };
    std::string op = tf32() ? "kiln_mma_tf32" : d_ == DType::bf16 ? "kiln_mma_bf16" : "kiln_mma_f16";
    s += "#pragma unroll\n  for (int p = 0; p < STAGES - 1; ++p) { if (p < KT) load_stage(p, p); kiln_cp_async_commit(); }\n";
    s += "  uint32_t af[2][" + S(mt) + "][4], bf[2][" + S(nt) + "][2];\n";
    s += "  int rs = 0, ws = STAGES - 1;\n";
    s += "  for (int kt = 0; kt < KT; ++kt) {\n";
    s += "    kiln_cp_async_wait<STAGES - 2>();\n    __syncthreads();\n";
    // The stage refilled now was read in iteration kt - 1, which every warp has left (the barrier).
    s += "    if (kt + STAGES - 1 < KT) load_stage(ws, kt + STAGES - 1);\n    kiln_cp_async_commit();\n";
    s += "    ws = ws + 1 == STAGES ? 0 : ws + 1;\n";
    s += "    const uint32_t as = sA + rs * " + S(a.stage() * eb) + ", bs = sB + rs * " + S(b.stage() * eb) + ";\n";
    s += "    rs = rs + 1 == STAGES ? 0 : rs + 1;\n";
    s += frags(0, 0);
    // Fragments double-buffered: the next k-step's loads go out before this one's mma.
    for (int ks = 0; ks < ksteps; ++ks) {
      if (ks + 1 < ksteps) s += frags((ks + 1) % 2, ks + 1);
      s += "#pragma unroll\n    for (int i = 0; i < " + S(mt) + "; ++i)\n#pragma unroll\n    for (int j = 0; j < " + S(nt) + "; ++j) " +
           op + "(acc[i][j], af[" + S(ks % 2) + "][i], bf[" + S(ks % 2) + "][j][0], bf[" + S(ks % 2) + "][j][1]);\n";
    }
    s += "  }\n  kiln_cp_async_wait<0>();\n";
    // Accumulator fragment (both shapes): c0, c1 at (lane/4, 2*(lane%4) + 0/1), c2, c3 eight rows below.
    s += "#pragma unroll\n  for (int i = 0; i < " + S(mt) + "; ++i)\n#pragma unroll\n  for (int j = 0; j < " + S(nt) +
         "; ++j)\n#pragma unroll\n  for (int q = 0; q < 4; ++q) {\n";
    s += "    const int64_t row = m0 + wm0 + i * 16 + lane / 4 + (q / 2) * 8, col = n0 + wn0 + j * 8 + (lane % 4) * 2 + q % 2;\n";
    s += emit_store("    ", "row", "col", "acc[i][j][q]");
    return s + "  }\n";
  }

  // Threads as a (BM/WM) x (BN/WN) grid. Each K tile of A and B goes global -> registers ->
  // shared memory (two buffers: the next tile's loads are in flight while this one is
  // multiplied; one barrier a tile). A thread owns runs of G rows (and G columns), G
  // elements being 16 bytes where its tile holds whole runs: thread (ty, tx) has rows
  // (i / G) * TY * G + ty * G + i % G, so each run is one 16-byte shared-memory read (rows
  // padded by G elements); else G = 1, rows ty + i * TY (rows padded by one element: the
  // scalar reads and the fills meet no bank conflicts).
  std::string simt() const {
    std::string acc = compute(), s;
    const int G = gemm_simt_run(c_, d_), KS = c_.k_slices, SK = c_.split_k;
    const std::string kend = SK > 1 ? "k_hi" : "K";  // where this block's K ends
    const std::string pad = std::to_string(G);
    if (KS < 1 || c_.bk % KS)
      throw Error("kiln: GEMM config " + c_.str() + ": K slices must divide the K step (" + std::to_string(c_.bk) + ")");
    s += "  constexpr int TX = BN / WN, TY = BM / WM, G = " + pad + ", KS = " + std::to_string(KS) + ";\n";
    if (KS == 1) {
      s += "  __shared__ __align__(16) " + acc + " As[2][BK][BM + G], Bs[2][BK][BN + G];\n";
      s += "  const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;\n";
    } else {
      // Thread (ks, ty, tx): slice ks multiplies rows [ks * BK / KS, (ks + 1) * BK / KS) of
      // each K tile. Once the tiles are done with, their room holds slices 1.. sums (a
      // thread's WM x WN, each of them TX * TY apart: the writes and reads meet no bank conflicts).
      s += "  __shared__ __align__(16) union { struct { " + acc + " a[2][BK][BM + G], b[2][BK][BN + G]; } t; " + acc +
           " sums[KS - 1][WM * WN][TX * TY]; } kiln_sm;\n";
      s += "  auto& As = kiln_sm.t.a; auto& Bs = kiln_sm.t.b;\n";
      s += "  const int tt = threadIdx.x % (TX * TY), ks = threadIdx.x / (TX * TY), tx = tt % TX, ty = tt / TX;\n";
    }
    s += "  " + acc + " acc[WM][WN];\n";
    s += "#pragma unroll\n  for (int i = 0; i < WM; ++i)\n#pragma unroll\n  for (int j = 0; j < WN; ++j) acc[i][j] = 0;\n";
    // Walk the contiguous dim fastest across threads, so the loads coalesce.
    auto where = [&](const std::string& rows, bool k_fast) {
      return k_fast ? "const int x = e / BK, kk = e % BK;" : "const int kk = e / " + rows + ", x = e % " + rows + ";";
    };
    // The next tile's elements wait in registers as loaded (the operand's storage type; a
    // prologue's: its source's), converted or computed only as they are stored to shared
    // memory: a use at the load would stall each warp on it before this tile's FMAs (on an
    // H200 (x * 0.5) @ W, f32 4096^3, ran at 20.6 TFLOP/s so, against 31.4 for the plain GEMM).
    // Elements past M, N or K load zeros; a prologue, whose f(0) need not be 0, keeps which
    // were loaded in a mask (bit l).
    // Per operand (0: A, 1: B): its registers r<a|b>, its tile and its rows.
    auto raw_type = [&](int operand) { return pro_.computes(operand) ? pro_.storage[operand] : storage(); };
    const std::string params = pro_.words ? "Aw" : "A";
    // Thread t loads elements e = t + l * NT of each tile. Where NT is a multiple of the
    // tile's fast dim (`uniform`: every config of gemm_candidates), its elements keep one
    // row (k fast: one k) and lie a fixed step apart: a pointer per operand, the step, and
    // which elements lie inside M (N) are worked out once, and a tile checks only K
    // (not two 64-bit products and three compares an element). NOTE: on an H200, f32
    // 4096^3, 128x128x8: 35.9 TFLOP/s so, 32.8 with an index per element, 24.8 with K
    // checked against a 32-bit count of K left in the tile (ptxas then issued the loads
    // after the tile's FMAs, right before their stores: docs/benchmarks.md, eighteenth session).
    auto uniform = [&](int operand) {
      const int rows = operand ? c_.bn : c_.bm;
      return (operand ? o_.b_k_major : o_.a_k_major) ? c_.threads() % c_.bk == 0 : c_.threads() % rows == 0;
    };
    auto load_setup = [&](int operand) {
      if (!uniform(operand)) return std::string();
      const std::string x = operand ? "b" : "a", rows = operand ? "BN" : "BM", o0 = operand ? "n0" : "m0";
      const std::string so = operand ? "sbn" : "sam", sk = operand ? "sbk" : "sak";
      const bool k_fast = operand ? o_.b_k_major : o_.a_k_major;
      std::string t = k_fast ? "  const int x" + x + " = threadIdx.x / BK, k" + x + " = threadIdx.x % BK;\n"
                             : "  const int x" + x + " = threadIdx.x % " + rows + ", k" + x + " = threadIdx.x / " + rows + ";\n";
      t += "  const " + raw_type(operand) + "* __restrict__ p" + x + " = " + (operand ? "B0" : "A0") + " + (" + o0 + " + x" + x +
           ") * " + so + " + k" + x + " * " + sk + ";\n";
      t += "  const int64_t d" + x + " = " + (k_fast ? "(NT / BK) * " + so : "(NT / " + rows + ") * " + sk) + ";\n";
      t += "  uint32_t in" + x + " = 0;\n#pragma unroll\n  for (int l = 0; l < (BK * " + rows + " + NT - 1) / NT; ++l)\n";
      t += "    in" + x + " |= (uint32_t)(threadIdx.x + l * NT < BK * " + rows + " && " + o0 + " + x" + x +
           (k_fast ? " + l * (NT / BK)" : "") + " < " + (operand ? "N" : "Mr") + ") << l;\n";
      return t;
    };
    auto load = [&](int operand) {
      const std::string r = operand ? "rb" : "ra", rows = operand ? "BN" : "BM";
      const bool k_fast = operand ? o_.b_k_major : o_.a_k_major, mask = pro_.computes(operand);
      std::string t = mask ? "    v" + r + " = 0;\n" : "";
      const std::string x = operand ? "b" : "a";
      if (uniform(operand))  // this tile's first element; q steps to the next
        t += "    const " + raw_type(operand) + "* q" + x + " = p" + x + " + k0 * " + (operand ? "sbk" : "sak") + ";\n";
      t += "#pragma unroll\n    for (int l = 0; l < (BK * " + rows + " + NT - 1) / NT; ++l) {\n";
      if (uniform(operand)) {
        t += "      const bool in = (in" + x + " >> l & 1u) && k0 + k" + x + (k_fast ? "" : " + l * (NT / " + rows + ")") + " < " + kend + ";\n";
        t += "      " + r + "[l] = in ? *q" + x + " : (" + raw_type(operand) + ")0;\n      q" + x + " += d" + x + ";\n";
      } else {
        t += "      const int e = threadIdx.x + l * NT; " + where(rows, k_fast) + "\n";
        t += std::string("      const int64_t o = ") + (operand ? "n0" : "m0") + " + x, k = k0 + kk;\n";
        t += "      const bool in = e < BK * " + rows + " && o < " + (operand ? "N" : "Mr") + " && k < " + kend + ";\n";
        t += "      " + r + "[l] = in ? " + (operand ? "B0[o * sbn + k * sbk]" : "A0[o * sam + k * sak]") + " : (" + raw_type(operand) + ")0;\n";
      }
      if (mask) t += "      v" + r + " |= (uint32_t)in << l;\n";
      return t + "    }\n";
    };
    auto store = [&](int operand) {
      const std::string r = operand ? "rb" : "ra", rows = operand ? "BN" : "BM";
      const std::string v = pro_.computes(operand) ? "(v" + r + " >> l & 1u) ? " + pro_.function[operand] + "(" + r + "[l], " + params +
                                                         ") : (" + acc + ")0"
                                                   : to_compute(r + "[l]");
      std::string t = "#pragma unroll\n    for (int l = 0; l < (BK * " + rows + " + NT - 1) / NT; ++l) {\n";
      t += "      const int e = threadIdx.x + l * NT; " + where(rows, operand ? o_.b_k_major : o_.a_k_major) + "\n";
      return t + "      if (e < BK * " + rows + ") " + (operand ? "Bs" : "As") + "[b][kk][x] = " + v + ";\n    }\n";
    };
    // The prologues' scalars in registers: read through A in the loop, they were loaded (and
    // converted from double) at every element, as A might alias the shared tiles (on an H200
    // (x * 0.5) @ W, f32 4096^3, took 7.39 ms so, 6.68 ms with the copy).
    if (pro_.any() && pro_.words)
      s += "  uint64_t Aw[" + std::to_string(pro_.words) + "];\n#pragma unroll\n  for (int i = 0; i < " + std::to_string(pro_.words) +
           "; ++i) Aw[i] = A[i];\n";
    if ((c_.bk * std::max(c_.bm, c_.bn) + c_.threads() - 1) / c_.threads() > 32)
      throw Error("kiln: GEMM config " + c_.str() + ": more than 32 elements a thread per tile (the masks' bits)");
    if (SK > 1)  // this block's whole K steps [k_lo, k_hi)
      s += "  constexpr int SK = " + std::to_string(SK) + ";\n  const int64_t k_run = (K + SK * BK - 1) / (SK * BK) * BK, k_lo = "
           "blockIdx.y * k_run, k_hi = k_lo + k_run < K ? k_lo + k_run : K;\n";
    s += load_setup(0) + load_setup(1);
    s += "  " + raw_type(0) + " ra[(BK * BM + NT - 1) / NT];\n  " + raw_type(1) + " rb[(BK * BN + NT - 1) / NT];\n";
    s += "  uint32_t vra = 0, vrb = 0; (void)vra; (void)vrb;\n";
    s += "  auto load = [&](int64_t k0) {\n" + load(0) + load(1) + "  };\n";
    s += "  auto store = [&](int b) {\n" + store(0) + store(1) + "  };\n";
    const std::string k_lo = SK > 1 ? "k_lo" : "0";
    s += "  load(" + k_lo + ");\n  store(0);\n  __syncthreads();\n  int cur = 0;\n";
    s += "  for (int64_t k0 = " + k_lo + "; k0 < " + kend + "; k0 += BK) {\n";
    s += "    const bool more = k0 + BK < " + kend + ";\n    if (more) load(k0 + BK);\n";
    s += "#pragma unroll\n    for (int kq = 0; kq < BK / KS; ++kq) {\n      const int kk = " + std::string(KS == 1 ? "kq" : "ks * (BK / KS) + kq") + ";\n      " + acc + " a[WM], b[WN];\n";
    if (G > 1) {
      auto run = [&](const std::string& v, const std::string& sm, const std::string& n, const std::string& T, const std::string& t) {
        return "#pragma unroll\n      for (int i = 0; i < " + n + " / G; ++i) {\n        const uint4 q = *(const uint4*)&" + sm + "[cur][kk][i * " + T +
               " * G + " + t + " * G];\n#pragma unroll\n        for (int g = 0; g < G; ++g) " + v + "[i * G + g] = ((const " + acc +
               "*)&q)[g];\n      }\n";
      };
      s += run("a", "As", "WM", "TY", "ty") + run("b", "Bs", "WN", "TX", "tx");
    } else {
      s += "#pragma unroll\n      for (int i = 0; i < WM; ++i) a[i] = As[cur][kk][ty + i * TY];\n";
      s += "#pragma unroll\n      for (int j = 0; j < WN; ++j) b[j] = Bs[cur][kk][tx + j * TX];\n";
    }
    s += "#pragma unroll\n      for (int i = 0; i < WM; ++i)\n#pragma unroll\n      for (int j = 0; j < WN; ++j) acc[i][j] += a[i] * b[j];\n";
    // The other buffer was last read before the previous barrier: free to fill.
    s += "    }\n    if (more) store(cur ^ 1);\n    __syncthreads();\n    cur ^= 1;\n  }\n";
    // Who stores: slice 0 of the block (K slices), of the tile's last block (split-K).
    std::string stores = KS > 1 ? "ks == 0" : "";
    if (KS > 1) {  // the loop's last barrier is behind every read of the tiles
      s += "  if (ks > 0)\n#pragma unroll\n    for (int i = 0; i < WM * WN; ++i) kiln_sm.sums[ks - 1][i][tt] = acc[i / WN][i % WN];\n";
      s += "  __syncthreads();\n  if (ks == 0)\n";  // slice 0 adds the others' sums in order
      s += "    for (int q = 0; q < KS - 1; ++q)\n#pragma unroll\n      for (int i = 0; i < WM * WN; ++i) acc[i / WN][i % WN] += kiln_sm.sums[q][i][tt];\n";
    }
    if (SK > 1) {
      // Each block's sums to its slot of the workspace (tile t, range y: slot t * SK + y, a
      // thread's WM x WN each TX * TY apart); the tile's last block to arrive adds the SK
      // slots in order (the same sums on every run), resets the tile's counter for the next
      // launch and stores.
      const std::string mine = KS > 1 ? "ks == 0" : "true", lane = KS > 1 ? "tt" : "threadIdx.x";  // lane: within the tile's threads
      s += "  " + acc + "* const kiln_part = (" + acc + "*)args.ws[0];\n  unsigned* const kiln_count = (unsigned*)args.ws[1];\n";
      s += "  const int64_t kiln_tile = (int64_t)blockIdx.z * gridDim.x + blockIdx.x;\n";
      s += "  if (" + mine + ") {\n    " + acc + "* const w = kiln_part + (kiln_tile * SK + blockIdx.y) * (int64_t)(BM * BN);\n";
      s += "#pragma unroll\n    for (int i = 0; i < WM * WN; ++i) w[i * (TX * TY) + " + lane + "] = acc[i / WN][i % WN];\n  }\n";
      s += "  __threadfence();\n  __syncthreads();\n  __shared__ int kiln_last;\n";
      s += "  if (threadIdx.x == 0) kiln_last = atomicAdd(kiln_count + kiln_tile, 1u) == (unsigned)(SK - 1);\n";
      s += "  __syncthreads();\n  if (kiln_last) __threadfence();\n";
      s += "  if (kiln_last && " + mine + ") {\n#pragma unroll\n    for (int i = 0; i < WM * WN; ++i) acc[i / WN][i % WN] = 0;\n";
      s += "    for (int y = 0; y < SK; ++y) {\n      const " + acc + "* const w = kiln_part + (kiln_tile * SK + y) * (int64_t)(BM * BN);\n";
      s += "#pragma unroll\n      for (int i = 0; i < WM * WN; ++i) acc[i / WN][i % WN] += kiln_load_coherent(w + i * (TX * TY) + " + lane +
           ");\n    }\n  }\n";
      s += "  if (kiln_last && threadIdx.x == 0) kiln_count[kiln_tile] = 0;\n";
      stores = stores.empty() ? "kiln_last" : "kiln_last && " + stores;
    }
    if (!stores.empty()) s += "  if (" + stores + ") {\n";
    s += "#pragma unroll\n  for (int i = 0; i < WM; ++i)\n#pragma unroll\n  for (int j = 0; j < WN; ++j) {\n";
    s += "    const int64_t row = m0 + (i / G) * TY * G + ty * G + i % G, col = n0 + (j / G) * TX * G + tx * G + j % G;\n";
    s += emit_store("    ", "row", "col", "acc[i][j]");
    return s + (stores.empty() ? "  }\n" : "  }\n  }\n");
  }

  GemmConfig c_;
  GemmOperands o_;
  DType d_;
  GemmStore store_;
  GemmPrologue pro_;
};

}  // namespace kiln::codegen
