// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The MFMA kind of the GPU GEMM (codegen/gemm.hpp): bf16/f16 with f32
// accumulators on AMD CDNA GPUs (gfx908, gfx90a, gfx94x), in the HIP dialect.
// Takes the block and wavefront tile (GemmConfig), the operands' layouts and
// the dtype; gives the kernel body: GemmWriter's head (operands, shapes, m0/n0
// of this block's tile), the tile loop, and every output through its store.
//
//   * (BM/WM) x (BN/WN) wavefronts of 64 lanes; each computes a WM x WN warp
//     tile as (WM/16) x (WN/16) blocks of 16x16x16 MFMA (device/gemm_mfma.cuh
//     has the instructions and their operand layout).
//   * A and B pass through LDS, both K-contiguous there (rows of BK + 4
//     elements: a lane's four K values are one 8-byte read, and the 16 rows one
//     MFMA reads fall in distinct bank pairs). Global reads are 16 bytes (eight
//     elements) along whichever dim is contiguous; an M-major A or N-major B is
//     transposed on its way into LDS. Past M, N or K the reads give zeros.
//   * Two LDS buffers: the next K tile's global reads are in flight (in
//     registers) while the MFMAs work on this one; one barrier per K tile.
//   * A prologue operand (GemmPrologue: read from a 16-bit source tensor laid out
//     as the operand would be) is computed element by element on the way from the
//     registers into LDS; elements past M, N or K stay zero (f(0) need not be).
// Needs what the mma kind needs (GemmProblem::tensor_ok): each operand
// contiguous along one matrix dim, rows and bases 16-byte aligned.
#pragma once
#include "kiln/codegen/gemm.hpp"

namespace kiln::codegen {

// LDS bytes of an MFMA kernel with this block tile (both buffers of A and B).
inline size_t gemm_mfma_lds_bytes(int bm, int bn, int bk) { return size_t(2) * size_t(bm + bn) * size_t(bk + 4) * 2; }
inline constexpr size_t kGemmMfmaMaxLds = 64 * 1024;  // per workgroup, every CDNA target

class MfmaWriter {
 public:
  MfmaWriter(const GemmConfig& c, const GemmOperands& o, DType d, GemmStore store, GemmPrologue pro = {})
      : c_(c), o_(o), d_(d), w_(c, o, d, std::move(store), std::move(pro)) {}

  std::string body(const std::string& prelude = "") const { return w_.head(prelude) + loop(); }

 private:
  // The tile loop and the stores, after the head.
  std::string loop() const {
    const int bm = c_.bm, bn = c_.bn, bk = c_.bk, wm = c_.wm, wn = c_.wn;
    const bool a_k_major = o_.a_k_major, b_k_major = o_.b_k_major;
    if (d_ != DType::bf16 && d_ != DType::f16) throw Error("kiln: internal error: the MFMA GEMM takes bf16 or f16 operands");
    if (bm % wm || bn % wn || wm % 16 || wn % 16 || bk % 16 || gemm_mfma_lds_bytes(bm, bn, bk) > kGemmMfmaMaxLds)
      throw Error("kiln: internal error: MFMA GEMM tile " + std::to_string(bm) + "x" + std::to_string(bn) + "x" +
                  std::to_string(bk) + " of " + std::to_string(wm) + "x" + std::to_string(wn) + " wavefronts is not one it can build");
    auto S = [](int v) { return std::to_string(v); };
    const int threads = (bm / wm) * (bn / wn) * 64, mt = wm / 16, nt = wn / 16;
    // One operand's K tile: `rows` M (N) rows of BK; k_inner: global rows run along K too.
    struct Operand {
      std::string x, rows, mn0, mn_ext, str;  // str: the stride of the global rows
      bool k_inner;
      int chunks, per_thread;
    };
    auto operand = [&](const std::string& x, int rows, bool k_inner, const std::string& mn0, const std::string& mn_ext,
                       const std::string& mn_str, const std::string& k_str) {
      int chunks = rows * bk / 8;
      return Operand{x, S(rows), mn0, mn_ext, k_inner ? mn_str : k_str, k_inner, chunks, (chunks + threads - 1) / threads};
    };
    Operand a = operand("a", bm, a_k_major, "m0", "Mr", "sam", "sak");
    Operand b = operand("b", bn, b_k_major, "n0", "N", "sbn", "sbk");
    // Chunk c of this thread's i-th: its global row r and first element e within the row.
    auto chunk = [&](const Operand& o) {
      std::string per_row = o.k_inner ? "(BK / 8)" : "(" + o.rows + " / 8)";
      return "      const int c = threadIdx.x + i * NT, r = c / " + per_row + ", e = (c % " + per_row + ") * 8;\n";
    };
    auto guard = [&](const Operand& o) { return o.chunks % threads ? "      if (c < " + S(o.chunks) + ")\n" : std::string(); };
    // Global -> registers (r<x>), K tile kt; in range: k_inner, row mn0 + r and K from k0 + e; else row k0 + r, mn from mn0 + e.
    const GemmPrologue& pro = w_.prologue();
    auto computes = [&](const Operand& o) { return pro.computes(o.x == "a" ? 0 : 1); };
    auto load = [&](const Operand& o) {
      std::string s = "#pragma unroll\n    for (int i = 0; i < " + S(o.per_thread) + "; ++i) {\n" + chunk(o) + guard(o) + "      {\n";
      if (o.k_inner)
        s += "        const int64_t row = " + o.mn0 + " + r, left = K - (k0 + e);\n"
             "        const int n = row < " + o.mn_ext + " ? (left >= 8 ? 8 : left > 0 ? (int)left : 0) : 0;\n"
             "        r" + o.x + "[i] = kiln_load8_zfill(n ? " + o.x + "g + row * " + o.str + " + k0 + e : " + o.x + "g, n);\n";
      else
        s += "        const int64_t left = " + o.mn_ext + " - (" + o.mn0 + " + e);\n"
             "        const int n = k0 + r < K ? (left >= 8 ? 8 : left > 0 ? (int)left : 0) : 0;\n"
             "        r" + o.x + "[i] = kiln_load8_zfill(n ? " + o.x + "g + (k0 + r) * " + o.str + " + " + o.mn0 + " + e : " + o.x +
             "g, n);\n";
      if (computes(o)) s += "        n" + o.x + "[i] = n;\n";  // the chunk's elements in range: the rest stay 0
      return s + "      }\n    }\n";
    };
    // A prologue operand's chunk: f of each source element in range, rounded to the operand's bits.
    auto computed = [&](const Operand& o) {
      const int side = o.x == "a" ? 0 : 1;
      const std::string bits = d_ == DType::bf16 ? "kiln_f32_to_bf16" : "kiln_f32_to_f16";
      return "#pragma unroll\n        for (int j = 0; j < 8; ++j) v[j] = j < n" + o.x + "[i] ? (short)" + bits + "(" + pro.function[side] +
             "((uint16_t)v[j], A)) : (short)0;\n";
    };
    // Registers -> LDS buffer `buf`, K-contiguous rows of LD: two 8-byte stores, or eight 2-byte ones (transposing).
    auto store_lds = [&](const Operand& o) {
      std::string s = "#pragma unroll\n    for (int i = 0; i < " + S(o.per_thread) + "; ++i) {\n" + chunk(o) + guard(o) + "      {\n";
      s += "        short* d = kiln_s" + o.x + " + buf * (" + o.rows + " * LD);\n        " + (computes(o) ? "" : "const ") + "kiln_i16x8 v = r" +
           o.x + "[i];\n" + (computes(o) ? computed(o) : "");
      if (o.k_inner)
        s += "        *(kiln_i16x4*)(d + r * LD + e) = kiln_i16x4{v[0], v[1], v[2], v[3]};\n"
             "        *(kiln_i16x4*)(d + r * LD + e + 4) = kiln_i16x4{v[4], v[5], v[6], v[7]};\n";
      else
        s += "#pragma unroll\n        for (int j = 0; j < 8; ++j) d[(e + j) * LD + r] = v[j];\n";
      return s + "      }\n    }\n";
    };
    std::string s;
    s += "  constexpr int LD = BK + 4, MT = " + S(mt) + ", NTL = " + S(nt) + ";\n";
    s += "  __shared__ __attribute__((aligned(16))) short kiln_sa[2 * BM * LD], kiln_sb[2 * BN * LD];\n";
    s += "  const int lane = threadIdx.x % 64, wave = threadIdx.x / 64;\n";
    s += "  const int wm0 = (wave / (BN / WN)) * WM, wn0 = (wave % (BN / WN)) * WN;\n";
    s += "  const int KT = (int)((K + BK - 1) / BK);\n";
    s += "  const short* ag = (const short*)A0; const short* bg = (const short*)B0;\n";
    s += "  kiln_f32x4 acc[MT][NTL];\n";
    s += "#pragma unroll\n  for (int i = 0; i < MT; ++i)\n#pragma unroll\n  for (int j = 0; j < NTL; ++j) acc[i][j] = kiln_f32x4{0.f, 0.f, 0.f, 0.f};\n";
    s += "  kiln_i16x8 ra[" + S(a.per_thread) + "], rb[" + S(b.per_thread) + "];\n";
    for (const Operand* o : {&a, &b})
      if (computes(*o)) s += "  int n" + o->x + "[" + S(o->per_thread) + "];\n";
    s += "  auto load_tile = [&](int kt) {\n    const int64_t k0 = (int64_t)kt * BK;\n" + load(a) + load(b) + "  };\n";
    s += "  auto store_tile = [&](int buf) {\n" + store_lds(a) + store_lds(b) + "  };\n";
    s += "  load_tile(0);\n  store_tile(0);\n  __syncthreads();\n";
    s += "  for (int kt = 0; kt < KT; ++kt) {\n";
    s += "    const int buf = kt & 1;\n";
    s += "    if (kt + 1 < KT) load_tile(kt + 1);\n";
    s += "    const short* as = kiln_sa + buf * (BM * LD) + (wm0 + lane % 16) * LD + (lane / 16) * 4;\n";
    s += "    const short* bs = kiln_sb + buf * (BN * LD) + (wn0 + lane % 16) * LD + (lane / 16) * 4;\n";
    s += "#pragma unroll\n    for (int ks = 0; ks < BK; ks += 16) {\n";
    s += "      kiln_i16x4 af[MT], bf[NTL];\n";
    s += "#pragma unroll\n      for (int i = 0; i < MT; ++i) af[i] = *(const kiln_i16x4*)(as + i * 16 * LD + ks);\n";
    s += "#pragma unroll\n      for (int j = 0; j < NTL; ++j) bf[j] = *(const kiln_i16x4*)(bs + j * 16 * LD + ks);\n";
    s += "#pragma unroll\n      for (int i = 0; i < MT; ++i)\n#pragma unroll\n      for (int j = 0; j < NTL; ++j) acc[i][j] = " +
         std::string(d_ == DType::bf16 ? "kiln_mfma_bf16" : "kiln_mfma_f16") + "(af[i], bf[j], acc[i][j]);\n";
    s += "    }\n";
    // The other buffer was last read in iteration kt - 1, which every wavefront has left (the barrier).
    s += "    if (kt + 1 < KT) store_tile(buf ^ 1);\n    __syncthreads();\n  }\n";
    // Lane l holds D[4 * (l / 16) + q][l % 16] of each block: consecutive lanes store consecutive columns.
    s += "#pragma unroll\n  for (int i = 0; i < MT; ++i)\n#pragma unroll\n  for (int j = 0; j < NTL; ++j)\n#pragma unroll\n"
         "  for (int q = 0; q < 4; ++q) {\n";
    s += "    const int64_t row = m0 + wm0 + i * 16 + (lane / 16) * 4 + q, col = n0 + wn0 + j * 16 + lane % 16;\n";
    s += w_.emit_store("    ", "row", "col", "acc[i][j][q]");
    return s + "  }\n";
  }

  GemmConfig c_;
  GemmOperands o_;
  DType d_;
  GemmWriter w_;
};

}  // namespace kiln::codegen
