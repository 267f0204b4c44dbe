// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The sm_90a instructions of the Hopper GEMM (codegen/gemm_sm90.hpp): pasted
// after gemm_mma.cuh into programs that hold such a kernel, which NVRTC then
// builds for sm_90a. The raw instructions only: the bulk tensor copy (TMA) with
// its tensor map, mbarriers, warpgroup MMA fences and shared-memory descriptors;
// the wgmma instructions themselves (one per tile width) are written by the
// generator.

// A CUtensorMap (cuda.h's 128-byte opaque type), passed by value as a
// __grid_constant__ kernel parameter: the copy engine reads it from there.
struct __align__(64) KilnTensorMap {
  unsigned long long w[16];
};

KILN_FN void kiln_mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the barriers' initialisation visible to the copy engine (the async proxy).
KILN_FN void kiln_mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// One arrival that also expects `bytes` from copies completing on this barrier.
KILN_FN void kiln_mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
KILN_FN void kiln_mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the barrier's phase of parity `parity` has completed.
KILN_FN void kiln_mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  }
}

// A box of a 3-d tensor (coordinates innermost first) into shared memory; completes
// its bytes on `bar`. Elements past the tensor's bounds arrive as zeros.
KILN_FN void kiln_tma_load_3d(uint32_t dst, const KilnTensorMap* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          dst),
      "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// The same box into the shared memory of every block of the cluster in `mask`, at the same
// offset, completing its bytes on each block's barrier at `bar`'s offset.
KILN_FN void kiln_tma_load_3d_multicast(uint32_t dst, const KilnTensorMap* map, int c0, int c1, int c2, uint32_t bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, %3, "
      "%4}], [%5], %6;\n" ::"r"(dst),
      "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "h"(mask)
      : "memory");
}

// Clusters of blocks: this block's rank in its cluster; every thread of the cluster meeting;
// an arrival on the barrier at offset `bar` of block `cta`'s shared memory. NOTE: the arrival
// keeps the default (.release.cta) semantics: .release.cluster fences every arrival, and on an
// H200 that stalled the consumers on it and made the clustered GEMM 1.9x slower (ncu).
KILN_FN uint32_t kiln_cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
KILN_FN void kiln_cluster_sync() { asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory"); }
KILN_FN void kiln_mbar_arrive_cluster(uint32_t bar, uint32_t cta) {
  asm volatile("{ .reg .b32 r; mapa.shared::cluster.u32 r, %0, %1; mbarrier.arrive.shared::cluster.b64 _, [r]; }\n" ::"r"(bar),
               "r"(cta)
               : "memory");
}

// Dynamic tiles (GemmConfig::dynamic): a persistent GEMM's blocks (clusters) take their tiles
// from one counter of the grid, so a block that starts late (its SM still busy with another
// kernel) takes fewer. The block's producer fetches each tile and passes it to the block's other
// warps through a ring of KILN_TQ slots in shared memory at `tq`: KILN_TQ full barriers, KILN_TQ
// empty ones, then the tile numbers. In a cluster rank 0's producer fetches for every block:
// each block's slot is written by st.async, completing on that block's full barrier, and every
// reader of the cluster gives the slot back to rank 0's empty barrier.
#define KILN_TQ 4
KILN_FN unsigned kiln_tile_fetch(unsigned* next, uint32_t tq, unsigned j, int cl) {
  const uint32_t s = j % KILN_TQ, full = tq + 8 * s, slot = tq + 16 * KILN_TQ + 4 * s;
  if (j >= KILN_TQ) kiln_mbar_wait(tq + 8 * KILN_TQ + 8 * s, (j / KILN_TQ - 1) & 1);
  const unsigned t = atomicAdd(next, 1u);
  if (cl == 1) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(slot), "r"(t) : "memory");
    kiln_mbar_arrive(full);
  } else {
    for (int r = 0; r < cl; ++r)
      asm volatile(
          "{ .reg .b32 rb, rs; mapa.shared::cluster.u32 rb, %0, %2; mapa.shared::cluster.u32 rs, %1, %2;\n"
          "mbarrier.arrive.expect_tx.shared::cluster.b64 _, [rb], 4;\n"
          "st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [rs], %3, [rb]; }\n" ::"r"(full),
          "r"(slot), "r"(r), "r"(t)
          : "memory");
  }
  return t;
}
// A reader's j-th tile: a warp's (lane 0 waits, reads and gives the slot back; every lane gets
// the number, one value across the warp), or one thread's (`warp` false: the producer of a
// cluster's other blocks).
KILN_FN unsigned kiln_tile_read(uint32_t tq, unsigned j, int cl, bool warp) {
  const uint32_t s = j % KILN_TQ, empty = tq + 8 * KILN_TQ + 8 * s;
  unsigned t = 0;
  if (!warp || threadIdx.x % 32 == 0) {
    kiln_mbar_wait(tq + 8 * s, (j / KILN_TQ) & 1);
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(t) : "r"(tq + 16 * KILN_TQ + 4 * s) : "memory");
  }
  if (warp) t = __shfl_sync(0xffffffffu, t, 0);
  if (!warp || threadIdx.x % 32 == 0) {
    if (cl == 1) kiln_mbar_arrive(empty);
    else kiln_mbar_arrive_cluster(empty, 0);
  }
  return t;
}
// After the producer's last fetch: the last block (cluster) of the grid to finish fetching zeroes
// the counter (and the count of finished ones), so that the next launch finds it as this one did.
KILN_FN void kiln_tiles_done(unsigned* next, unsigned fetchers) {
  __threadfence();
  if (atomicAdd(next + 1, 1u) == fetchers - 1) {
    atomicExch(next, 0u);
    atomicExch(next + 1, 0u);
  }
}

KILN_FN void kiln_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
KILN_FN void kiln_wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> KILN_FN void kiln_wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

// Shared-memory matrix descriptor of a swizzled tile (the layout the copy engine writes with
// CU_TENSOR_MAP_SWIZZLE_128B, or _64B where `sw64`): start address, leading and stride byte
// offsets, all in 16-byte units; the layout type in bits 62-63 (1: 128-byte swizzle, 2: 64-byte).
KILN_FN unsigned long long kiln_wgmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo, bool sw64 = false) {
  return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(lbo >> 4) << 16) |
         ((unsigned long long)(sbo >> 4) << 32) | ((sw64 ? 2ull : 1ull) << 62);
}

// The register budgets of a producer/consumer kernel (launch-bounded to one block per SM).
template <int R> KILN_FN void kiln_regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R> KILN_FN void kiln_regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }

// A barrier of `threads` threads (a warpgroup's own: ids 1 and up; 0 is __syncthreads).
KILN_FN void kiln_bar_sync(int id, int threads) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory"); }

// A barrier of `threads` threads that also ORs `v` over them (bar.red.or): every thread gets it.
KILN_FN bool kiln_bar_or(int id, int threads, bool v) {
  uint32_t r;
  asm volatile("{ .reg .pred p, q; setp.ne.u32 p, %1, 0; bar.red.or.pred q, %2, %3, p; selp.u32 %0, 1, 0, q; }\n"
               : "=r"(r) : "r"((uint32_t)v), "r"(id), "r"(threads) : "memory");
  return r != 0;
}

// A 32-bit word of two 16-bit floats back to floats (kiln_pack_bf16x2 in the prelude packs).
KILN_FN void kiln_unpack_bf16x2(uint32_t w, float* f) {
  f[0] = __uint_as_float(w << 16);
  f[1] = __uint_as_float(w & 0xffff0000u);
}
KILN_FN void kiln_unpack_f16x2(uint32_t w, float* f) {
  f[0] = kiln_f16_to_f32((uint16_t)(w & 0xffffu));
  f[1] = kiln_f16_to_f32((uint16_t)(w >> 16));
}

// A value as lane 0 of the warp holds it, through a shuffle: ptxas then knows it one value
// across the warp and may keep what is derived from it in uniform registers.
struct KilnFromLane0 {
  template <class T>
  KILN_FN T operator()(T v) const { return __shfl_sync(0xffffffffu, v, 0); }
};

// A split tail's hand-over (device/gemm_walk.h) through the workspace: a piece's slot of BM x BN
// floats, each consumer thread `u` of `threads` its accumulators at float4 i * threads + u
// (coalesced), and a count per tail tile of the pieces handed in. Named barrier `bar` spans the
// consumers. The last piece waits for the other `parts - 1`, adds them in piece order (slot
// `first`, + `stride`, ...: the same sums on every run) and zeroes the count again, so the next
// launch finds the workspace as this one did.
template <int N>
KILN_FN void kiln_split_give(const float (&d)[N], float* slot, unsigned* count, int u, int threads, int bar) {
  float4* p = (float4*)slot;
#pragma unroll
  for (int i = 0; i < N / 4; ++i) __stcg(p + i * threads + u, make_float4(d[4 * i], d[4 * i + 1], d[4 * i + 2], d[4 * i + 3]));
  __threadfence();
  kiln_bar_sync(bar, threads);
  if (u == 0) asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(count), "r"(1u) : "memory");
}
template <int N>
KILN_FN void kiln_split_take(float (&d)[N], const float* first, size_t stride, int parts, unsigned* count, int u, int threads,
                             int bar) {
  if (u == 0) {
    for (unsigned f = 0;;) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(f) : "l"(count) : "memory");
      if (f == (unsigned)(parts - 1)) break;
      __nanosleep(64);
    }
  }
  kiln_bar_sync(bar, threads);
  __threadfence();
  for (int piece = 0; piece + 1 < parts; ++piece) {
    const float4* p = (const float4*)(first + piece * stride);
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const float4 q = __ldcg(p + i * threads + u);
      d[4 * i] += q.x, d[4 * i + 1] += q.y, d[4 * i + 2] += q.z, d[4 * i + 3] += q.w;
    }
  }
  if (u == 0) *(volatile unsigned*)count = 0;
}

// TF32 staging (GpuVariant::stage): one 32 x 32 tile of an operand whose rows r (its M or N)
// are its contiguous dim, element (r, k) at src[r * sr + k * sk] for r < R, k < K, copied
// K-major to dst[r * KP + k] through shared memory (both sides 128-byte runs), rounded to
// nearest TF32; columns K .. KP - 1 of a row get zeros. 256 threads: 8 rows of 32.
KILN_FN void kiln_stage_tile(const float* __restrict__ src, int64_t sr, int64_t sk, int64_t R, int64_t K, float* __restrict__ dst,
                             int64_t KP, int64_t r0, int64_t k0) {
  __shared__ float t[32][33];
  const int x = threadIdx.x % 32, y = threadIdx.x / 32;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t k = k0 + y + 8 * i, r = r0 + x;
    t[y + 8 * i][x] = k < K && r < R ? src[r * sr + k * sk] : 0.f;
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = r0 + y + 8 * i, k = k0 + x;
    uint32_t u;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(u) : "f"(t[x][y + 8 * i]));
    if (r < R && k < KP) dst[r * KP + k] = __uint_as_float(u);
  }
}

// Column sums of an output tile (GpuVariant::colsum_slot): the tile's sums go to row m0 / BM of
// `part` ([tiles down M][N] floats), then the tile arrives on its column of tiles' count
// (KilnColsumCount), and the block whose tile is the last of its column to arrive adds the
// column's rows (kiln_colsum_total). The sums reach `part` by one of two routes:
// - From registers (kiln_colsum_warp, kiln_colsum_rows): each thread that stored the tile added
//   every value it stored into a register of its column; the threads of a column meet by shuffles
//   and their rows of partial sums in shared memory, which are added in row order.
// - Read back (kiln_colsum_read), where the threads' columns are not fixed (the consumers' own
//   stores of an edge tile): the `threads` threads (u = 0 ..) that have just stored the tile read
//   it back (the block's own stores: L1 or L2). F, the stored format: 0 bf16, 1 f16, 2 f32 (16
//   bytes: VE = 8 or 4 elements). Lane l of a warp takes chunk l / 8 of the warp's four 16-byte
//   column chunks and rows l % 8, + 8, ... of the tile; the 8 row groups meet by shuffles.
// Every addition has a fixed place, so the sums come out the same on every run.
template <int F>
KILN_FN void kiln_colsum_add(const unsigned char* p, float* s) {
  const uint4 q = *(const uint4*)p;  // NOTE: a plain load: the block's own stores, ordered by bar.sync
  if constexpr (F == 2) {
    s[0] += __uint_as_float(q.x), s[1] += __uint_as_float(q.y), s[2] += __uint_as_float(q.z), s[3] += __uint_as_float(q.w);
  } else {
    float f[8];
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (F == 0) kiln_unpack_bf16x2(w[i], f + 2 * i);
      else kiln_unpack_f16x2(w[i], f + 2 * i);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i] += f[i];
  }
}
template <int F, int BM, int BN>
KILN_FN void kiln_colsum_read(const void* values, int64_t ld, int64_t m0, int64_t n0, int64_t Mr, int64_t N, float* part, int u,
                              int threads, int bar) {
  constexpr int VE = F == 2 ? 4 : 8, EB = F == 2 ? 4 : 2, GROUPS = BN / VE / 4;
  static_assert(BN % (VE * 4) == 0, "a tile's columns are whole groups of four 16-byte chunks");
  kiln_bar_sync(bar, threads);  // the tile's stores are done; bar.sync orders them before the reads (one block)
  const unsigned char* e = (const unsigned char*)values;
  const int lane = u % 32, rg = lane % 8;
  for (int cg = u / 32; cg < GROUPS; cg += threads / 32) {
    const int64_t col = n0 + (cg * 4 + lane / 8) * VE;
    float s[VE];
#pragma unroll
    for (int i = 0; i < VE; ++i) s[i] = 0.f;
    if (col < N) {
#pragma unroll
      for (int i = 0; i < BM / 8; ++i) {
        const int64_t row = m0 + rg + 8 * i;
        if (row < Mr) kiln_colsum_add<F>(e + (row * ld + col) * EB, s);
      }
    }
#pragma unroll
    for (int i = 0; i < VE; ++i) {  // a + b == b + a: every lane of the 8 gets the same sums
      s[i] += __shfl_xor_sync(0xffffffffu, s[i], 1);
      s[i] += __shfl_xor_sync(0xffffffffu, s[i], 2);
      s[i] += __shfl_xor_sync(0xffffffffu, s[i], 4);
    }
    if (rg == 0 && col < N) {
      float4* out = (float4*)(part + (m0 / BM) * N + col);
#pragma unroll
      for (int i = 0; i < VE / 4; ++i) __stcg(out + i, make_float4(s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]));
    }
  }
}
// A consumer warp's sums of the columns of an interior tile it stored through the staging
// (WgmmaWriter::staged_stores): lane l added column (i / 4) * 32 + (l % 8) * 4 + i % 4 of its
// rows into a[i]; lanes l, l ^ 8, l ^ 16 and l ^ 24 hold the same columns. Two butterfly steps
// (each lane keeps half of what it holds and adds its partner's sums of that half) leave lane l
// the warp's sums of a quarter of them, a[(l / 8) * V / 4 ..], stored to the warp's row `row`.
template <int V>
KILN_FN void kiln_colsum_warp(const float (&a)[V], float* row, int lane) {
  static_assert(V % 4 == 0, "whole 32-column chunks");
  const bool hi = (lane & 16) != 0, right = (lane & 8) != 0;
  float b[V / 2];
#pragma unroll
  for (int i = 0; i < V / 2; ++i) b[i] = (hi ? a[i + V / 2] : a[i]) + __shfl_xor_sync(0xffffffffu, hi ? a[i] : a[i + V / 2], 16);
#pragma unroll
  for (int i = 0; i < V / 4; ++i) {
    const float s = (right ? b[i + V / 4] : b[i]) + __shfl_xor_sync(0xffffffffu, right ? b[i] : b[i + V / 4], 8);
    const int k = (lane / 8) * (V / 4) + i;
    row[(k / 4) * 32 + (lane % 8) * 4 + k % 4] = s;
  }
}
// The tile's `rows` rows of partial column sums in shared memory (row r at sm + (r / per) * stride
// + (r % per) * BN), added in row order into row `tile_row` of `part` by the `threads` threads.
template <int BN>
KILN_FN void kiln_colsum_rows(const float* sm, int rows, int per, int stride, int64_t tile_row, int64_t n0, int64_t N, float* part,
                              int u, int threads, int bar) {
  kiln_bar_sync(bar, threads);  // every row is in
  for (int j = u; j < BN; j += threads) {
    float s = 0.f;
    for (int r = 0; r < rows; ++r) s += sm[(r / per) * stride + (r % per) * BN + j];
    if (n0 + j < N) __stcg(part + tile_row * N + n0 + j, s);
  }
}
// A column of tiles' count, its answer read a tile later, so that no thread waits for the
// atomic. meet() is a barrier of the threads that wrote the tile's row of `part` (after it), and
// answers whether the tile that arrived before (arrive()) was the last of its column: then it
// returns that column's n0, whose rows the block adds (kiln_colsum_total) and whose count it
// zeroes for the next launch; else -1. The block's last tile is answered by one more meet().
struct KilnColsumCount {
  unsigned before = 0u;  // thread u == 0: the count its arrival found
  int64_t n0 = -1;       // every thread: the column of tiles that arrived last (-1: none)
  KILN_FN int64_t meet(unsigned tiles, int u, int threads, int bar) {
    const bool last = kiln_bar_or(bar, threads, u == 0 && n0 >= 0 && before == tiles - 1);
    const int64_t col = last ? n0 : -1;
    n0 = -1;
    return col;
  }
  // After meet(): the barrier ordered every thread's row of `part` before this release.
  KILN_FN void arrive(unsigned* count, int64_t col, int bn, int u) {
    if (u == 0) asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(before) : "l"(count + col / bn) : "memory");
    n0 = col;
  }
};
// Column `col`'s total over the `tiles` rows of `part`: eight loads in flight, added in a fixed order.
KILN_FN float kiln_colsum_total(const float* part, int64_t col, int64_t N, int64_t tiles) {
  float a[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t t = 0;
  for (; t + 8 <= tiles; t += 8)
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] += __ldcg(part + (t + j) * N + col);
  for (int j = 0; t < tiles; ++t, ++j) a[j] += __ldcg(part + t * N + col);
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}
// A GEMM's total (GpuVariant::total_kernel): warp `warp` of the block's `block_warps` that store
// tiles leaves its lanes' sums, met by shuffles, in its slot of the partials tw[0] (one a warp of
// the grid); the last warp to arrive (the counter tw[1]) adds every slot in a fixed order, so the
// total is the same on every run, zeroes the counter for the next launch and returns true with it
// in `total` (every lane).
KILN_FN bool kiln_total_last(float v, const kiln_u64* tw, unsigned warp, unsigned block_warps, float& total) {
  const unsigned slot = (blockIdx.z * gridDim.x + blockIdx.x) * block_warps + warp, warps = gridDim.x * gridDim.z * block_warps;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  float* const part = (float*)tw[0];
  unsigned* const count = (unsigned*)tw[1];
  unsigned last = 0;
  if (threadIdx.x % 32 == 0) {
    part[slot] = v;
    __threadfence();
    last = atomicAdd(count, 1u) == warps - 1;
  }
  if (!__shfl_sync(0xffffffffu, last, 0)) return false;
  __threadfence();
  float a[4] = {0.f, 0.f, 0.f, 0.f};  // four loads in flight (indexed by constants: registers)
  unsigned i = threadIdx.x % 32;
  for (; i + 96 < warps; i += 128)
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] += __ldcg(part + i + 32 * j);
#pragma unroll
  for (int j = 0; j < 3; ++j)
    if (i + 32 * j < warps) a[j] += __ldcg(part + i + 32 * j);
  float s = (a[0] + a[1]) + (a[2] + a[3]);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) *count = 0;
  total = s;
  return true;
}
