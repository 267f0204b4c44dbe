// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The GEMM kernels of the GPU dialects (codegen/gpu.hpp writes the function
// around them). Takes a GemmConfig (tile shapes, as compile-time constants), the
// operands' layouts (which dim of A and of B is contiguous) and the dtype; gives
// the body of one kernel over the matmul argument block
//   M = [nd, K, sizes[nd], strides of A, B, C (nd each)]
// with C[b, m, n] = sum_k A[b, m, k] B[b, k, n], one output tile per block,
// blockIdx.z the batch (broadcast batch dims have stride 0).
//
// Two kinds:
//   mma   bf16/f16 on sm_80+: cp.async multi-stage pipeline into padded shared
//         memory (rows padded by 16 bytes: ldmatrix and the copies meet no bank
//         conflicts), ldmatrix (.trans for M-major A and N-major B),
//         mma.sync m16n8k16 with f32 accumulators. Needs each operand contiguous
//         along one of its two matrix dims and 16-byte aligned rows (the host
//         checks; else simt). Ranges past M, N or K are zero-filled by the copies.
//   simt  any dtype, any strides, CUDA and HIP: register-tiled (TM x TN outputs
//         per thread, strided so shared-memory reads and the stores are
//         conflict-free and coalesced), accumulating in the compute type.
// Every output element leaves through one callback, store(row, col, value): the
// fused epilogue of a matmul kernel plugs in there.
//
// The config choice: gemm_candidates(dtype, arch) lists what a tuner may time;
// gemm_heuristic(problem) is the default mode's pick; gemm_chooser() is the hook
// through which a tuner (or a test) forces a config.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kiln/codegen/kernel.hpp"

namespace kiln::codegen {

enum class GemmKind : uint8_t { simt, mma };

// One GEMM variant's compile-time shape. mma: (bm/wm) x (bn/wn) warps, each
// computing a wm x wn warp tile; simt: (bm/wm) x (bn/wn) threads, each a
// wm x wn register tile. bk: K per pipeline step; stages: mma's cp.async depth.
struct GemmConfig {
  GemmKind kind = GemmKind::simt;
  int bm = 64, bn = 64, bk = 16, wm = 4, wn = 4, stages = 2;

  int threads() const { return (bm / wm) * (bn / wn) * (kind == GemmKind::mma ? 32 : 1); }
  std::string str() const {
    return std::string(kind == GemmKind::mma ? "mma" : "simt") + "_" + std::to_string(bm) + "x" + std::to_string(bn) +
           "x" + std::to_string(bk) + "_" + std::to_string(wm) + "x" + std::to_string(wn) + "_s" + std::to_string(stages);
  }
  bool operator==(const GemmConfig&) const = default;
};

// Which matrix dim of each operand is contiguous: A [M, K] K-major is row-major
// (x), M-major is a transposed view; B [K, N] K-major is a transposed view
// (W.t() of a row-major W [N, K]), N-major is row-major.
struct GemmOperands {
  bool a_k_major = true, b_k_major = false;
  bool operator==(const GemmOperands&) const = default;
};

// What the config choice sees of one matmul call. arch: the NVIDIA compute
// capability (80 for sm_80, 90 for sm_90), 0 for other GPUs. tensor_ok: the
// operands meet the mma kind's layout and alignment needs.
struct GemmProblem {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  DType dtype = DType::f32;
  GemmOperands ops;
  bool tensor_ok = false;
  int arch = 0, sm_count = 1;
};

inline bool gemm_has_mma(DType d, int arch) { return arch >= 80 && (d == DType::bf16 || d == DType::f16); }

// Every config a tuner may time for this dtype and architecture, best-known first.
inline std::vector<GemmConfig> gemm_candidates(DType d, int arch) {
  using K = GemmKind;
  if (gemm_has_mma(d, arch))
    return {{K::mma, 128, 256, 32, 64, 64, 4}, {K::mma, 256, 128, 32, 64, 64, 4}, {K::mma, 128, 128, 32, 64, 64, 4},
            {K::mma, 128, 128, 32, 64, 32, 4}, {K::mma, 128, 256, 64, 64, 64, 3}, {K::mma, 64, 128, 32, 32, 64, 4},
            {K::mma, 64, 64, 32, 32, 32, 4}};
  if (d == DType::f64 || d == DType::i64) return {{K::simt, 64, 64, 16, 4, 4, 1}, {K::simt, 32, 32, 16, 2, 2, 1}};
  return {{K::simt, 128, 128, 8, 8, 8, 1}, {K::simt, 64, 64, 16, 4, 4, 1}, {K::simt, 32, 32, 16, 2, 2, 1}};
}

// Blocks (output tiles) a config launches for this problem.
inline int64_t gemm_tiles(const GemmConfig& c, const GemmProblem& p) {
  return ((p.m + c.bm - 1) / c.bm) * ((p.n + c.bn - 1) / c.bn) * p.batch;
}

// The default mode's choice, no tuning: the largest tile that still gives every
// SM a block (larger tiles re-read A and B less), else the smallest candidate.
inline GemmConfig gemm_heuristic(const GemmProblem& p) {
  auto all = gemm_candidates(p.dtype, p.tensor_ok ? p.arch : 0);
  std::vector<GemmConfig> order;
  if (all.front().kind == GemmKind::mma) {
    GemmConfig wide = all[0], tall = all[1];  // 128x256 or 256x128: the long side along the longer dim
    order = {p.m > p.n ? tall : wide, all[2], all[5], all[6]};
  } else {
    order = all;
  }
  for (const GemmConfig& c : order)
    if (gemm_tiles(c, p) >= p.sm_count) return c;
  return order.back();
}

// The config choice: a tuner installs a chooser (its database, or a forced
// config while it times one); an empty result or no chooser means the
// heuristic. A chosen mma config the problem cannot take falls back to simt.
using GemmChooser = std::function<std::optional<GemmConfig>(const GemmProblem&)>;
inline GemmChooser& gemm_chooser() {
  static GemmChooser c;
  return c;
}
inline GemmConfig gemm_choose(const GemmProblem& p) {
  if (const GemmChooser& c = gemm_chooser()) {
    if (std::optional<GemmConfig> got = c(p)) {
      if (got->kind == GemmKind::simt || (p.tensor_ok && gemm_has_mma(p.dtype, p.arch))) return *got;
      GemmProblem q = p;
      q.tensor_ok = false;
      return gemm_heuristic(q);
    }
  }
  return gemm_heuristic(p);
}

// Dynamic shared memory of an mma kernel (0 for simt: static).
inline size_t gemm_shared_bytes(const GemmConfig& c, const GemmOperands& o) {
  if (c.kind != GemmKind::mma) return 0;
  size_t a = o.a_k_major ? size_t(c.bm) * (c.bk + 8) : size_t(c.bk) * (c.bm + 8);
  size_t b = o.b_k_major ? size_t(c.bn) * (c.bk + 8) : size_t(c.bk) * (c.bn + 8);
  return (a + b) * 2 * size_t(c.stages);
}

// Emits one output element's store: (row, col, value in the compute type) -> statements.
using GemmStore = std::function<std::string(const std::string& row, const std::string& col, const std::string& v)>;

class GemmWriter {
 public:
  GemmWriter(const GemmConfig& c, const GemmOperands& o, DType d, GemmStore store)
      : c_(c), o_(o), d_(d), store_(std::move(store)) {}

  // The kernel body: P, M are in scope; declares the operands and shapes, then the tile loop and the stores.
  std::string body() const {
    std::string st = storage(), s;
    s += "  const int nd = (int)M[0];\n  const int64_t K = M[1];\n  const int64_t* sz = M + 2;\n";
    s += "  const int64_t* sa = sz + nd; const int64_t* sb = sa + nd; const int64_t* sc = sb + nd;\n";
    s += "  const " + st + "* __restrict__ A0 = (const " + st + "*)P[0]; const " + st + "* __restrict__ B0 = (const " + st +
         "*)P[1];\n";
    s += "  const int64_t Mr = sz[nd - 2], N = sz[nd - 1];\n";
    s += "  const int64_t sam = sa[nd - 2], sak = sa[nd - 1], sbk = sb[nd - 2], sbn = sb[nd - 1];\n";
    s += "  (void)sam; (void)sak; (void)sbk; (void)sbn;\n";
    s += "  int64_t oa = 0, ob = 0, oc = 0;\n";
    s += "  { int64_t rr = blockIdx.z; for (int d = nd - 3; d >= 0; --d) { const int64_t ix = rr % sz[d]; rr /= sz[d]; "
         "oa += ix * sa[d]; ob += ix * sb[d]; oc += ix * sc[d]; } }\n";
    s += "  A0 += oa; B0 += ob;\n";
    s += "  constexpr int BM = " + std::to_string(c_.bm) + ", BN = " + std::to_string(c_.bn) + ", BK = " + std::to_string(c_.bk) +
         ", WM = " + std::to_string(c_.wm) + ", WN = " + std::to_string(c_.wn) + ", NT = " + std::to_string(c_.threads()) + ";\n";
    // Grouped raster: consecutive blocks share A row panels (8 tiles tall) so they meet in L2.
    s += "  int64_t tm, tn;\n  {\n    const int64_t gm = (Mr + BM - 1) / BM, gn = (N + BN - 1) / BN, pid = blockIdx.x;\n";
    s += "    const int64_t first = pid / (8 * gn) * 8, rows = gm - first < 8 ? gm - first : 8;\n";
    s += "    tm = first + (pid % (8 * gn)) % rows; tn = (pid % (8 * gn)) / rows;\n  }\n";
    s += "  const int64_t m0 = tm * BM, n0 = tn * BN;\n";
    return s + (c_.kind == GemmKind::mma ? mma() : simt());
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
  std::string emit_store(const std::string& ind, const std::string& row, const std::string& col, const std::string& v) const {
    return ind + "if (" + row + " < Mr && " + col + " < N) { " + store_(row, col, v) + " }\n";
  }

  // The copy of one operand tile, R rows of C contiguous elements, into stage `st` of
  // shared array `sm` (row pitch C + 8). Row r is operand dim `outer` (o0 + r, extent
  // oext, stride ostr), element e of a row dim `inner` (i0 + e, extent iext, stride 1).
  std::string copy_tile(const std::string& sm, const std::string& src, int R, int C, const std::string& o0,
                        const std::string& oext, const std::string& ostr, const std::string& i0, const std::string& iext) const {
    int chunks = R * C / 8, per = (chunks + c_.threads() - 1) / c_.threads();
    std::string s, cs = std::to_string(C / 8), ld = std::to_string(C + 8);
    s += "#pragma unroll\n      for (int i = 0; i < " + std::to_string(per) + "; ++i) {\n";
    s += "        const int c = threadIdx.x + i * NT;\n";
    if (chunks % c_.threads()) s += "        if (c < " + std::to_string(chunks) + ") {\n";
    else s += "        {\n";
    s += "          const int r = c / " + cs + ", e = (c % " + cs + ") * 8;\n";
    s += "          const int64_t o = " + o0 + " + r, in = " + i0 + " + e;\n";
    s += "          int bytes = 0; const uint16_t* g = " + src + ";\n";
    s += "          if (o < " + oext + " && in < " + iext + ") { const int64_t left = " + iext + " - in; bytes = (left < 8 ? (int)left : 8) * 2; g = " +
         src + " + o * " + ostr + " + in; }\n";
    s += "          kiln_cp_async16(" + sm + " + st * " + std::to_string(R * (C + 8)) + " + r * " + ld + " + e, g, bytes);\n";
    s += "        }\n      }\n";
    return s;
  }

  std::string mma() const {
    const GemmConfig& c = c_;
    int mt = c.wm / 16, nt = c.wn / 8;
    std::string s;
    // Operand tiles in shared memory as they lie in global memory (contiguous dim innermost).
    int ar = o_.a_k_major ? c.bm : c.bk, ac = o_.a_k_major ? c.bk : c.bm;
    int br = o_.b_k_major ? c.bn : c.bk, bc = o_.b_k_major ? c.bk : c.bn;
    std::string ast = std::to_string(ar * (ac + 8)), bst = std::to_string(br * (bc + 8));
    s += "  constexpr int STAGES = " + std::to_string(c.stages) + ";\n";
    s += "  extern __shared__ __align__(128) unsigned char kiln_smem[];\n";
    s += "  uint16_t* sA = (uint16_t*)kiln_smem; uint16_t* sB = sA + STAGES * " + ast + ";\n";
    s += "  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;\n";
    s += "  const int wm0 = (warp / (BN / WN)) * WM, wn0 = (warp % (BN / WN)) * WN;\n";
    s += "  const int64_t KT = (K + BK - 1) / BK;\n";
    s += "  float acc[" + std::to_string(mt) + "][" + std::to_string(nt) + "][4];\n";
    s += "#pragma unroll\n  for (int i = 0; i < " + std::to_string(mt) + "; ++i)\n#pragma unroll\n  for (int j = 0; j < " +
         std::to_string(nt) + "; ++j)\n#pragma unroll\n  for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.f;\n";
    s += "  const uint16_t* Ag = (const uint16_t*)A0; const uint16_t* Bg = (const uint16_t*)B0;\n";
    s += "  auto load_stage = [&](int st, int64_t k0) {\n";
    s += o_.a_k_major ? copy_tile("sA", "Ag", ar, ac, "m0", "Mr", "sam", "k0", "K") : copy_tile("sA", "Ag", ar, ac, "k0", "K", "sak", "m0", "Mr");
    s += o_.b_k_major ? copy_tile("sB", "Bg", br, bc, "n0", "N", "sbn", "k0", "K") : copy_tile("sB", "Bg", br, bc, "k0", "K", "sbk", "n0", "N");
    s += "  };\n";
    s += "#pragma unroll\n  for (int p = 0; p < STAGES - 1; ++p) { if (p < KT) load_stage(p, (int64_t)p * BK); kiln_cp_async_commit(); }\n";
    s += "  for (int64_t kt = 0; kt < KT; ++kt) {\n";
    s += "    kiln_cp_async_wait<STAGES - 2>();\n    __syncthreads();\n";
    s += "    { const int64_t nk = kt + STAGES - 1; if (nk < KT) load_stage((int)(nk % STAGES), nk * BK); kiln_cp_async_commit(); }\n";
    s += "    const uint16_t* a_s = sA + (int)(kt % STAGES) * " + ast + ";\n";
    s += "    const uint16_t* b_s = sB + (int)(kt % STAGES) * " + bst + ";\n";
    s += "#pragma unroll\n    for (int kk = 0; kk < BK; kk += 16) {\n";
    s += "      uint32_t a[" + std::to_string(mt) + "][4], b[" + std::to_string(nt) + "][2];\n";
    std::string j = "(lane / 8)", r = "(lane % 8)";
    // ldmatrix.x4 of A: matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15), (m 8-15, k 8-15) = a0..a3.
    s += "#pragma unroll\n      for (int i = 0; i < " + std::to_string(mt) + "; ++i) {\n";
    if (o_.a_k_major)
      s += "        kiln_ldmatrix_x4(a[i], a_s + (wm0 + i * 16 + (lane % 16)) * " + std::to_string(ac + 8) + " + kk + (lane / 16) * 8);\n";
    else
      s += "        kiln_ldmatrix_x4_trans(a[i], a_s + (kk + (" + j + " / 2) * 8 + " + r + ") * " + std::to_string(ac + 8) +
           " + wm0 + i * 16 + (" + j + " % 2) * 8);\n";
    s += "      }\n";
    // ldmatrix.x4 of B, two n8 tiles: (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15).
    s += "#pragma unroll\n      for (int p = 0; p < " + std::to_string(nt / 2) + "; ++p) {\n        uint32_t t[4];\n";
    if (o_.b_k_major)
      s += "        kiln_ldmatrix_x4(t, b_s + (wn0 + p * 16 + (" + j + " / 2) * 8 + " + r + ") * " + std::to_string(bc + 8) +
           " + kk + (" + j + " % 2) * 8);\n";
    else
      s += "        kiln_ldmatrix_x4_trans(t, b_s + (kk + (" + j + " % 2) * 8 + " + r + ") * " + std::to_string(bc + 8) +
           " + wn0 + p * 16 + (" + j + " / 2) * 8);\n";
    s += "        b[2 * p][0] = t[0]; b[2 * p][1] = t[1]; b[2 * p + 1][0] = t[2]; b[2 * p + 1][1] = t[3];\n      }\n";
    std::string op = d_ == DType::bf16 ? "kiln_mma_bf16" : "kiln_mma_f16";
    s += "#pragma unroll\n      for (int i = 0; i < " + std::to_string(mt) + "; ++i)\n#pragma unroll\n      for (int j = 0; j < " +
         std::to_string(nt) + "; ++j) " + op + "(acc[i][j], a[i], b[j][0], b[j][1]);\n";
    s += "    }\n  }\n  kiln_cp_async_wait<0>();\n";
    // Accumulator fragment: c0, c1 at (lane/4, 2*(lane%4) + 0/1), c2, c3 eight rows below.
    s += "#pragma unroll\n  for (int i = 0; i < " + std::to_string(mt) + "; ++i)\n#pragma unroll\n  for (int j = 0; j < " +
         std::to_string(nt) + "; ++j)\n#pragma unroll\n  for (int q = 0; q < 4; ++q) {\n";
    s += "    const int64_t row = m0 + wm0 + i * 16 + lane / 4 + (q / 2) * 8, col = n0 + wn0 + j * 8 + (lane % 4) * 2 + q % 2;\n";
    s += emit_store("    ", "row", "col", "acc[i][j][q]");
    return s + "  }\n";
  }

  std::string simt() const {
    const GemmConfig& c = c_;
    std::string acc = compute(), s;
    // Threads as a (BM/WM) x (BN/WN) grid; thread (ty, tx) owns rows ty + i * (BM/WM), cols tx + j * (BN/WN).
    s += "  constexpr int TX = BN / WN, TY = BM / WM;\n";
    s += "  __shared__ " + acc + " As[BK][BM + 1], Bs[BK][BN + 1];\n";
    s += "  const int tx = threadIdx.x % TX, ty = threadIdx.x / TX;\n";
    s += "  " + acc + " acc[WM][WN];\n";
    s += "#pragma unroll\n  for (int i = 0; i < WM; ++i)\n#pragma unroll\n  for (int j = 0; j < WN; ++j) acc[i][j] = 0;\n";
    s += "  for (int64_t k0 = 0; k0 < K; k0 += BK) {\n";
    // Walk the contiguous dim fastest across threads, so the loads coalesce.
    auto fill = [&](const std::string& sm, const std::string& src, const std::string& rows, bool k_fast,
                    const std::string& o0, const std::string& oext, const std::string& ostr, const std::string& kstr) {
      std::string t = "    for (int e = threadIdx.x; e < BK * " + rows + "; e += NT) {\n";
      t += k_fast ? "      const int x = e / BK, kk = e % BK;\n" : "      const int kk = e / " + rows + ", x = e % " + rows + ";\n";
      t += "      const int64_t o = " + o0 + " + x, k = k0 + kk;\n";
      t += "      " + sm + "[kk][x] = (o < " + oext + " && k < K) ? " + to_compute(src + "[o * " + ostr + " + k * " + kstr + "]") +
           " : (" + acc + ")0;\n    }\n";
      return t;
    };
    s += fill("As", "A0", "BM", o_.a_k_major, "m0", "Mr", "sam", "sak");
    s += fill("Bs", "B0", "BN", o_.b_k_major, "n0", "N", "sbn", "sbk");
    s += "    __syncthreads();\n";
    s += "#pragma unroll\n    for (int kk = 0; kk < BK; ++kk) {\n      " + acc + " a[WM], b[WN];\n";
    s += "#pragma unroll\n      for (int i = 0; i < WM; ++i) a[i] = As[kk][ty + i * TY];\n";
    s += "#pragma unroll\n      for (int j = 0; j < WN; ++j) b[j] = Bs[kk][tx + j * TX];\n";
    s += "#pragma unroll\n      for (int i = 0; i < WM; ++i)\n#pragma unroll\n      for (int j = 0; j < WN; ++j) acc[i][j] += a[i] * b[j];\n";
    s += "    }\n    __syncthreads();\n  }\n";
    s += "#pragma unroll\n  for (int i = 0; i < WM; ++i)\n#pragma unroll\n  for (int j = 0; j < WN; ++j) {\n";
    s += "    const int64_t row = m0 + ty + i * TY, col = n0 + tx + j * TX;\n";
    s += emit_store("    ", "row", "col", "acc[i][j]");
    return s + "  }\n";
  }

  GemmConfig c_;
  GemmOperands o_;
  DType d_;
  GemmStore store_;
};

}  // namespace kiln::codegen
