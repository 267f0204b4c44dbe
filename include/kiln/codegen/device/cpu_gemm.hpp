// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The CPU GEMM. Pasted as text into a generated translation unit that has a matmul
// (codegen/cpp.hpp), after the CPU math prelude (its bf16/f16 converters); gives out
// KilnGemm<TA, TB, Acc, RA, RB>, which computes, for every batch element b, C[b] = A[b] @ B[b] and
// hands each finished row piece of C to the caller's store (the one place where an
// output element is written, so a fused epilogue runs once per element, after the
// whole K sum). It needs C++17, <cstdint>, <cstring>, <cstdlib> and GCC/clang vector
// extensions; OpenMP when compiled with -fopenmp.
//
// The Goto/BLIS structure:
//   jc: N in panels of NC columns. B[:, jc] is packed once, all of K, into column
//       micro-panels of NR (k-major, zero-padded): the micro-kernel streams them.
//   items: the panel's rows in blocks of MC (x column groups when there are fewer
//       blocks than threads), shared out to the threads (dynamic: the machine is shared)
//   pc: K in blocks of KC; A[ic, pc] packed into row micro-panels of MR (in L2)
//   jr, ir: the MR x NR register tile: kc rank-1 updates by vector FMAs. A tile's
//       partial sums between K blocks stay in the thread's workspace W (MC x NC, L2),
//       so C is written once, after the last K block, through `store`.
// Packing reads A and B through any strides (transposed, broadcast, sliced) and
// converts to the accumulator type (bf16/f16 -> f32), so the kernel sees one layout.
// Register tile from the target's vector width (the JIT's -march=native shows it):
//   AVX-512 (32 registers): 12 x 2 vectors (f32 12x32, f64 12x16)
//   AVX/AVX2 (16 registers): 6 x 2 vectors (f32 6x16); other targets: 16-byte vectors.
#ifndef KILN_CODEGEN_DEVICE_CPU_GEMM_HPP
#define KILN_CODEGEN_DEVICE_CPU_GEMM_HPP

#include <cstdint>
#include <cstdlib>
#include <cstring>
#if defined(_OPENMP)
#include <omp.h>
#endif

#if defined(__AVX512F__)
#define KILN_GEMM_VECTOR_BYTES 64
#define KILN_GEMM_REGISTERS 32
#elif defined(__AVX__)
#define KILN_GEMM_VECTOR_BYTES 32
#define KILN_GEMM_REGISTERS 16
#elif defined(__aarch64__)
#define KILN_GEMM_VECTOR_BYTES 16
#define KILN_GEMM_REGISTERS 32
#else
#define KILN_GEMM_VECTOR_BYTES 16
#define KILN_GEMM_REGISTERS 16
#endif

// Block sizes (elements). KC: a B micro-panel (KC x NR) stays in L1; MC: an A block
// (MC x KC) and the workspace (MC x NC) in L2; the packed B panel (K x NC) in L3.
#ifndef KILN_GEMM_KC
#define KILN_GEMM_KC 256
#endif
#ifndef KILN_GEMM_MC
#define KILN_GEMM_MC 144
#endif
#ifndef KILN_GEMM_NC
#define KILN_GEMM_NC 512
#endif
#ifndef KILN_GEMM_B_BYTES  // the packed B panel's budget: NC shrinks for a long K
#define KILN_GEMM_B_BYTES (8 << 20)
#endif

template <class Acc>
struct KilnGemmTile {
  typedef Acc V __attribute__((vector_size(KILN_GEMM_VECTOR_BYTES)));
  static constexpr int lanes = KILN_GEMM_VECTOR_BYTES / int(sizeof(Acc));
  static constexpr int nv = 2;  // vectors across a tile row
  static constexpr int nr = nv * lanes;
  static constexpr int mr = KILN_GEMM_REGISTERS >= 32 ? 12 : 6;  // mr*nv accumulators + nv of B fit the registers
};

// The register tile: c = (cin ? cin : 0) + a_panel @ b_panel over kc, written to cout
// (row-major MR x NR). a: kc x MR (k-major), b: kc x NR (k-major), all 64-byte aligned.
template <class Acc>
static inline void kiln_gemm_tile(int64_t kc, const Acc* __restrict a, const Acc* __restrict b, const Acc* __restrict cin,
                                  Acc* __restrict cout) {
  typedef KilnGemmTile<Acc> S;
  typedef typename S::V V;
  constexpr int MR = S::mr, NV = S::nv, L = S::lanes, NR = S::nr;
  V c[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      if (cin) __builtin_memcpy(&c[i][v], cin + i * NR + v * L, sizeof(V));
      else c[i][v] = V{} ;
    }
  for (int64_t k = 0; k < kc; ++k) {
    V bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) __builtin_memcpy(&bv[v], b + k * NR + v * L, sizeof(V));
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      const Acc ai = a[k * MR + i];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) c[i][v] += ai * bv[v];
    }
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) __builtin_memcpy(cout + i * NR + v * L, &c[i][v], sizeof(V));
}

// Scratch (packed panels, workspaces): kiln hands a module its host caching allocator
// when it loads it (runtime/eval.hpp), so that a repeated call reuses pages already
// touched instead of faulting in fresh ones on every call; posix_memalign until then.
static void* kiln_gemm_memalign(size_t bytes) {
  void* p = nullptr;
  return posix_memalign(&p, 64, bytes ? bytes : 64) == 0 ? p : nullptr;
}
static void* (*kiln_gemm_alloc)(size_t) = kiln_gemm_memalign;
static void (*kiln_gemm_free)(void*) = free;
extern "C" void kiln_gemm_use_allocator(void* (*allocate)(size_t), void (*release)(void*)) {
  kiln_gemm_alloc = allocate, kiln_gemm_free = release;
}

// An element of storage type T in the accumulator's type; W: how T's bits read
// (KILN_GEMM_BF16 / KILN_GEMM_F16: 16-bit floats through the prelude's converters).
enum { KILN_GEMM_PLAIN = 0, KILN_GEMM_BF16 = 1, KILN_GEMM_F16 = 2 };
template <int W, class Acc, class T>
static inline Acc kiln_gemm_widen(T x) {
  if constexpr (W == KILN_GEMM_BF16) return kiln_bf16_to_f32(x);
  else if constexpr (W == KILN_GEMM_F16) return kiln_f16_to_f32(x);
  else return Acc(x);
}

// How an operand's elements read: widened from storage (W as kiln_gemm_widen), or a
// matmul prologue's function of the element and the kernel's params (codegen/cpp.hpp).
template <int W, class Acc>
struct KilnGemmRead {
  template <class T>
  Acc operator()(T x) const { return kiln_gemm_widen<W, Acc>(x); }
};

// The caller's store: fn(ctx, b, i, j, m, n, v, ldv) writes C[b][i .. i+m)[j .. j+n) from
// the rows v + r * ldv (a whole register tile a call: the epilogue's setup and its math's
// constants are paid per tile, not per row piece).
// NOTE: a function pointer, not a template parameter, so that every kernel of a
// translation unit shares one instantiation per dtype (compile time).
template <class Acc>
struct KilnGemmStore {
  void (*fn)(const void* ctx, int64_t b, int64_t i, int64_t j, int64_t m, int64_t n, const Acc* v, int64_t ldv);
  const void* ctx;
};

// C[b] = A[b] @ B[b] for b < batch: A[b] at A + oa[b] (M x K, strides sam, sak), B[b]
// at B + ob[b] (K x N, strides sbk, sbn), their elements read through ra and rb; each
// element of C leaves once, through store.
template <class TA, class TB, class Acc, class RA, class RB>
struct KilnGemm {
  typedef KilnGemmTile<Acc> S;
  static constexpr int MR = S::mr, NR = S::nr;
  int64_t batch, M, N, K;
  const TA* A;
  const int64_t* oa;
  int64_t sam, sak;
  const TB* B;
  const int64_t* ob;
  int64_t sbk, sbn;
  KilnGemmStore<Acc> store;
  RA ra;
  RB rb;
  int64_t KC = KILN_GEMM_KC, MC = 0, NC = 0, mblocks = 0;

  // Packs B[b][:, j0 .. j0+NR) (all of K) into the micro-panel dst[k][NR], zero-padded.
  __attribute__((noinline)) void pack_b(int64_t b, int64_t j0, Acc* __restrict dst) const {
    const TB* src = B + ob[b];
    const int64_t nr = N - j0 < NR ? N - j0 : NR;
    if (nr == NR && sbn == 1) {
      for (int64_t k = 0; k < K; ++k) {
        const TB* row = src + k * sbk + j0;
#pragma omp simd
        for (int j = 0; j < NR; ++j) dst[k * NR + j] = rb(row[j]);
      }
    } else if (nr == NR) {  // B read through a transposed view: vector gathers, no per-element test
      for (int64_t k = 0; k < K; ++k) {
        const TB* col = src + k * sbk + j0 * sbn;
#pragma omp simd
        for (int j = 0; j < NR; ++j) dst[k * NR + j] = rb(col[j * sbn]);
      }
    } else {
      for (int64_t k = 0; k < K; ++k)
        for (int j = 0; j < NR; ++j) dst[k * NR + j] = j < nr ? rb(src[k * sbk + (j0 + j) * sbn]) : Acc(0);
    }
  }

  // Packs A[b][i0 .. i0+mc, k0 .. k0+kc) into MR-row micro-panels dst[p][k][MR], zero-padded.
  void pack_a(int64_t b, int64_t i0, int64_t mc, int64_t k0, int64_t kc, Acc* __restrict dst) const {
    for (int64_t p = 0; p * MR < mc; ++p, dst += kc * MR) {
      const int64_t mr = mc - p * MR < MR ? mc - p * MR : MR;
      const TA* src = A + oa[b] + (i0 + p * MR) * sam + k0 * sak;
      if (mr == MR && sak == 1) {
        for (int i = 0; i < MR; ++i)
          for (int64_t k = 0; k < kc; ++k) dst[k * MR + i] = ra(src[i * sam + k]);
      } else if (mr == MR && sam == 1) {
        for (int64_t k = 0; k < kc; ++k)
#pragma omp simd
          for (int i = 0; i < MR; ++i) dst[k * MR + i] = ra(src[k * sak + i]);
      } else {
        for (int64_t k = 0; k < kc; ++k)
          for (int i = 0; i < MR; ++i) dst[k * MR + i] = i < mr ? ra(src[i * sam + k * sak]) : Acc(0);
      }
    }
  }

  // One work item of column panel jc (packed in bp): row block `it / groups`, column
  // group `it % groups` of `panels` micro-panels. ap: an A block, w: the K-block workspace.
  __attribute__((noinline)) void item(int64_t b, int64_t jc, int64_t panels, int64_t groups, int64_t it, const Acc* bp, Acc* ap,
                                      Acc* w) const {
    alignas(64) Acc tile[MR * NR];
    const int64_t ic = it / groups * MC, g = it % groups;
    const int64_t mc = M - ic < MC ? M - ic : MC;
    const int64_t p0 = panels * g / groups, p1 = panels * (g + 1) / groups, np = p1 - p0;
    for (int64_t pc = 0; pc < K; pc += KC) {
      const int64_t kc = K - pc < KC ? K - pc : KC;
      const bool first = pc == 0, last = pc + kc == K;
      pack_a(b, ic, mc, pc, kc, ap);
      for (int64_t p = p0; p < p1; ++p) {
        const Acc* bk = bp + p * K * NR + pc * NR;
        const int64_t j0 = jc + p * NR, nr = N - j0 < NR ? N - j0 : NR;
        for (int64_t ir = 0; ir * MR < mc; ++ir) {
          Acc* wt = w + (ir * np + (p - p0)) * (MR * NR);
          kiln_gemm_tile<Acc>(kc, ap + ir * kc * MR, bk, first ? nullptr : wt, last ? tile : wt);
          if (last) {
            const int64_t i0 = ic + ir * MR, mr = M - i0 < MR ? M - i0 : MR;
            store.fn(store.ctx, b, i0, j0, mr, nr, tile, NR);
          }
        }
      }
    }
  }

  void run() {
    if (batch <= 0 || M <= 0 || N <= 0) return;
    if (K <= 0) {  // a sum of nothing
      alignas(64) Acc zeros[NR] = {};
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; j += NR) store.fn(store.ctx, b, i, j, 1, N - j < NR ? N - j : NR, zeros, 0);
      return;
    }
#if defined(_OPENMP)
    const int threads = omp_get_max_threads();
#else
    const int threads = 1;
#endif
    const bool parallel = threads > 1 && double(batch) * double(M) * double(N) * double(K) > 262144.0;
    // Small products, many of them: a whole product per thread; else the threads share each one.
    const bool by_batch = parallel && batch >= threads && double(M) * double(N) * double(K) < 2097152.0;
    const int team = parallel ? threads : 1, share = by_batch ? 1 : team;
    // NC: the packed panel (K x NC) within its budget; row blocks of about MC rows, as
    // many as a multiple of the team (even shares).
    int64_t nc = KILN_GEMM_B_BYTES / (K * int64_t(sizeof(Acc)));
    nc = nc < KILN_GEMM_NC ? nc : KILN_GEMM_NC;
    nc = nc / NR * NR < 4 * NR ? 4 * NR : nc / NR * NR;
    NC = N < nc ? (N + NR - 1) / NR * NR : nc;
    mblocks = (M + KILN_GEMM_MC - 1) / KILN_GEMM_MC;
    if (mblocks % share) mblocks += share - mblocks % share;
    MC = ((M + mblocks - 1) / mblocks + MR - 1) / MR * MR;
    mblocks = (M + MC - 1) / MC;
    const int64_t bp_size = (NC / NR) * K * NR, ap_size = MC * (K < KC ? K : KC), w_size = MC * NC;
    // Column groups: enough work items for the team when the row blocks alone are too few.
    const int64_t groups = mblocks < share ? (share + mblocks - 1) / mblocks : 1;

    Acc* shared_bp = by_batch ? nullptr : (Acc*)kiln_gemm_alloc(size_t(bp_size) * sizeof(Acc));
#pragma omp parallel num_threads(team) if (parallel)
    {
      Acc* bp = by_batch ? (Acc*)kiln_gemm_alloc(size_t(bp_size) * sizeof(Acc)) : shared_bp;
      Acc* ap = (Acc*)kiln_gemm_alloc(size_t(ap_size) * sizeof(Acc));
      Acc* w = (Acc*)kiln_gemm_alloc(size_t(w_size) * sizeof(Acc));
      if (by_batch) {
#pragma omp for schedule(dynamic)
        for (int64_t b = 0; b < batch; ++b)
          for (int64_t jc = 0; jc < N; jc += NC) {
            const int64_t panels = ((N - jc < NC ? N - jc : NC) + NR - 1) / NR;
            for (int64_t p = 0; p < panels; ++p) pack_b(b, jc + p * NR, bp + p * K * NR);
            for (int64_t it = 0; it < mblocks; ++it) item(b, jc, panels, 1, it, bp, ap, w);
          }
      } else {
        for (int64_t b = 0; b < batch; ++b)
          for (int64_t jc = 0; jc < N; jc += NC) {
            const int64_t panels = ((N - jc < NC ? N - jc : NC) + NR - 1) / NR, g = groups < panels ? groups : panels;
            // A B broadcast over the batch, in one column panel, is packed once.
            if (!(b > 0 && N <= NC && ob[b] == ob[b - 1])) {
#pragma omp for schedule(static)
              for (int64_t p = 0; p < panels; ++p) pack_b(b, jc + p * NR, bp + p * K * NR);
            }
#pragma omp for schedule(dynamic)
            for (int64_t it = 0; it < mblocks * g; ++it) item(b, jc, panels, g, it, bp, ap, w);
          }
      }
      if (by_batch) kiln_gemm_free(bp);
      kiln_gemm_free(ap);
      kiln_gemm_free(w);
    }
    kiln_gemm_free(shared_bp);
  }
};

#endif  // KILN_CODEGEN_DEVICE_CPU_GEMM_HPP
