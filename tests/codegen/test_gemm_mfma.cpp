// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The MFMA GEMM (codegen/gemm_mfma.hpp), and the SIMT one every GPU falls back to,
// run on the CPU. No AMD GPU runs the MFMA kernel here
// (CI has none), so the kernel text MfmaWriter emits, with device/gemm_mfma.cuh,
// is compiled by the host compiler against a model of one workgroup (a thread per
// lane, a barrier for __syncthreads, LDS as statics the threads share) and of the
// matrix instructions as the CDNA ISA lays out their operands over a wavefront:
// lane l = x + 16 y holds A[x][KL y + i] and B[KL y + i][x] (KL = 4 K values per
// lane, 2 for gfx908's bf16 16x16x8) and D[4 y + q][x]. The result must equal a
// plain matmul exactly (small integers: every product and sum is exact in f32),
// over odd M, N and K, K = 0, row pitches with NaN past K (the zero-fill),
// transposed operands, each bf16/f16 instruction path and several tile configs;
// and with both operands computed by prologues from 16-bit sources as the chunks
// move into LDS (zeros, not f(0), past M, N and K).
// What it cannot show: that the hardware agrees with the model, and speed. The SIMT
// kernel (GemmWriter) runs on the same workgroup model, f32 and f64, every layout, its
// K in slices of a block's threads and in ranges of blocks (split-K: the blocks of a tile
// run last range first, so the first adds the sums; every counter must end at zero).
#include <cmath>
#include <cstring>

#include "../support/reference.hpp"

using namespace kiln;
using codegen::GemmConfig;
using codegen::GemmKind;

namespace {

// The workgroup and instruction model the kernels compile against (C++17, GCC or Clang).
constexpr const char* kModel = R"(
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>
#define KILN_FN inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __restrict__
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct KilnDim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local KilnDim3 threadIdx, blockIdx, gridDim;
// Split-K's workspace (sums, a counter per tile), its fences and its atomics.
typedef uint64_t kiln_u64;
static struct { kiln_u64 ws[2]; } args;
#define __threadfence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
static unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
template <class T> T kiln_load_coherent(const T* p) { return *(const volatile T*)p; }
struct KilnBarrier {  // reusable, for n threads
  std::mutex mu;
  std::condition_variable cv;
  int n = 0, waiting = 0;
  unsigned long generation = 0;
  void wait() {
    std::unique_lock<std::mutex> lock(mu);
    unsigned long g = generation;
    if (++waiting == n) { waiting = 0; ++generation; cv.notify_all(); }
    else cv.wait(lock, [&] { return generation != g; });
  }
};
static KilnBarrier kiln_block_barrier, kiln_wave_barrier[16];
#define __syncthreads() kiln_block_barrier.wait()
typedef float kiln_f32x4 __attribute__((vector_size(16)));
typedef short kiln_i16x4 __attribute__((vector_size(8)));
typedef short kiln_i16x2 __attribute__((vector_size(4)));
typedef _Float16 kiln_f16x4 __attribute__((vector_size(8)));
static float kiln_wave_a[16][64][4], kiln_wave_b[16][64][4];
// D = A B + C of one 16 x 16 x (4 KL) block, the operands as the lanes of this thread's wavefront hold them.
template <int KL> kiln_f32x4 kiln_model_mfma(const float* a, const float* b, kiln_f32x4 c) {
  const int wave = threadIdx.x / 64, lane = threadIdx.x % 64, x = lane % 16, y = lane / 16;
  for (int i = 0; i < KL; ++i) kiln_wave_a[wave][lane][i] = a[i], kiln_wave_b[wave][lane][i] = b[i];
  kiln_wave_barrier[wave].wait();
  kiln_f32x4 d = c;
  for (int q = 0; q < 4; ++q)
    for (int k = 0; k < 4 * KL; ++k)  // A[4y + q][k] * B[k][x]
      d[q] += kiln_wave_a[wave][4 * y + q + 16 * (k / KL)][k % KL] * kiln_wave_b[wave][x + 16 * (k / KL)][k % KL];
  kiln_wave_barrier[wave].wait();
  return d;
}
static float kiln_model_bf16(short s) { uint32_t u = uint32_t(uint16_t(s)) << 16; float f; std::memcpy(&f, &u, 4); return f; }
template <int KL, class V> kiln_f32x4 kiln_model_bf16_mfma(V a, V b, kiln_f32x4 c, int, int, int) {
  float fa[KL], fb[KL];
  for (int i = 0; i < KL; ++i) fa[i] = kiln_model_bf16(a[i]), fb[i] = kiln_model_bf16(b[i]);
  return kiln_model_mfma<KL>(fa, fb, c);
}
static kiln_f32x4 kiln_model_f16_mfma(kiln_f16x4 a, kiln_f16x4 b, kiln_f32x4 c, int, int, int) {
  float fa[4], fb[4];
  for (int i = 0; i < 4; ++i) fa[i] = (float)a[i], fb[i] = (float)b[i];
  return kiln_model_mfma<4>(fa, fb, c);
}
// The prelude's 16-bit conversions (round to nearest even), for prologues.
inline float kiln_bf16_to_f32(uint16_t b) { return kiln_model_bf16(short(b)); }
inline uint16_t kiln_f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float kiln_f16_to_f32(uint16_t b) { _Float16 h; std::memcpy(&h, &b, 2); return (float)h; }
inline uint16_t kiln_f32_to_f16(float f) { _Float16 h = (_Float16)f; uint16_t b; std::memcpy(&b, &h, 2); return b; }
#define __builtin_amdgcn_mfma_f32_16x16x16f16 kiln_model_f16_mfma
#define __builtin_amdgcn_mfma_f32_16x16x16bf16_1k kiln_model_bf16_mfma<4, kiln_i16x4>
#define __builtin_amdgcn_mfma_f32_16x16x8bf16 kiln_model_bf16_mfma<2, kiln_i16x2>
// Runs a kernel over `blocks` x `splits` workgroups of `threads` lanes, one workgroup at a
// time, the splits of a tile in turn from the last (a split-K tile's sums added by the first).
static void kiln_launch(void (*kernel)(void* const*, const int64_t*), void* const* P, const int64_t* M, unsigned blocks,
                        unsigned threads, unsigned splits = 1) {
  kiln_block_barrier.n = int(threads);
  for (auto& b : kiln_wave_barrier) b.n = 64;
  std::vector<kiln_u64> sums(size_t(blocks) * splits * 64 * 64);
  std::vector<unsigned> counts(blocks, 0);
  args.ws[0] = (kiln_u64)sums.data(), args.ws[1] = (kiln_u64)counts.data();
  std::vector<std::thread> lanes;
  for (unsigned t = 0; t < threads; ++t)
    lanes.emplace_back([=] {
      threadIdx.x = t;
      gridDim.x = blocks, gridDim.y = splits, gridDim.z = 1;
      for (unsigned b = 0; b < blocks; ++b)
        for (unsigned y = splits; y-- > 0;) {
          blockIdx.x = b, blockIdx.y = y;
          kernel(P, M);
          kiln_block_barrier.wait();
        }
    });
  for (auto& l : lanes) l.join();
  for (unsigned c : counts)
    if (c != 0) std::abort();  // the last block of each tile leaves its counter at zero
}
)";

// One kernel of the emulated program: its config, operand layouts and instruction path.
struct Variant {
  GemmConfig config;
  bool a_k_major, b_k_major;
  DType dtype;
  bool gfx908;  // bf16 as two 16x16x8 (else 16x16x16bf16_1k)
  // Both operands computed by prologues from 16-bit sources at P[3] and P[4] (their strides
  // in M's slots 3 and 4): A = -2 a + 1 (f(0) = 1: elements past M or K must stay 0), B = b / 2 - 1.
  bool prologue = false;
};

std::string model_program(const std::vector<Variant>& vs) {
  std::string helper = codegen::detail::read_device_file("gemm_mfma.cuh"), s = kModel;
  s += "#pragma GCC optimize(\"O1\")\n";  // NOTE: compile time (CI has two cores); the runs are tiny
  for (size_t i = 0; i < vs.size(); ++i) {
    const Variant& v = vs[i];
    std::string target = v.gfx908 ? "__gfx908__" : "__gfx90a__", n = std::to_string(i);
    codegen::GemmPrologue pro;
    std::string functions;
    if (v.prologue) {
      const std::string t = v.dtype == DType::bf16 ? "bf16" : "f16", in = "kiln_" + t + "_to_f32", out = "kiln_f32_to_" + t;
      for (int o = 0; o < 2; ++o) {
        pro.slot[o] = 3 + o, pro.storage[o] = "uint16_t", pro.function[o] = o ? "kiln_pb" : "kiln_pa";
        functions += "static float " + pro.function[o] + "(const uint16_t x, const uint64_t* A) { (void)A; return " + in + "(" + out + "(" +
                     (o ? in + "(x) * 0.5f - 1.0f" : "-2.0f * " + in + "(x) + 1.0f") + ")); }\n";
      }
    }
    codegen::MfmaWriter w(v.config, {v.a_k_major, v.b_k_major}, v.dtype,
                          [](const std::string& row, const std::string& col, const std::string& x, const std::string&) {
                            return "((float*)P[2])[" + row + " * N + " + col + "] = " + x + ";";
                          }, pro);
    s += "namespace k" + n + " {\n#define " + target + " 1\n" + helper + "#undef " + target + "\n" + functions;
    s += "static void kernel(void* const* P, const int64_t* M) {\n  const uint64_t* A = nullptr; (void)A;\n" + w.body() + "}\n}\n";
    s += "extern \"C\" void kiln_run_" + n + "(void* const* P, const int64_t* M, unsigned blocks) { kiln_launch(k" + n +
         "::kernel, P, M, blocks, " + std::to_string(v.config.threads()) + "); }\n";
  }
  return s;
}

// The SIMT kernels of `configs` for every operand layout, f32 and f64: kiln_run_<i> runs
// simt_variants()[i] (config, A K-major, B K-major, dtype).
std::vector<Variant> simt_variants() {
  std::vector<Variant> vs;
  for (DType d : {DType::f32, DType::f64}) {
    std::vector<GemmConfig> configs = codegen::gemm_candidates(d, 0);
    // and one whose 64 threads do not cover M-major A's 128 rows in whole turns: the loads'
    // general path (each element's own index), not the candidates' pointer and step
    configs.push_back({GemmKind::simt, 128, 32, 8, 8, 8, 1});
    // K in slices with scalar shared-memory reads (2x2 thread tiles), and f64's in slices
    configs.push_back(codegen::gemm_sliced({GemmKind::simt, 32, 32, 16, 2, 2, 1}, 2));
    if (d == DType::f64) configs.push_back(codegen::gemm_sliced({GemmKind::simt, 32, 64, 16, 4, 4, 1}, 4));
    // K in ranges of blocks (split-K): alone, with slices, more ranges than K has steps
    for (auto [ks, sk] : {std::pair{1, 2}, {4, 3}, {1, 8}}) configs.push_back(codegen::gemm_sliced({GemmKind::simt, 32, 32, 16, 4, 4, 1}, ks, sk));
    // raster groups 2 and 3 tiles wide, walked along their rows (GemmConfig::group_across),
    // partial groups among them: every tile once
    for (int g : {2, 3}) {
      GemmConfig c{GemmKind::simt, 32, 32, 16, 4, 4, 1};
      c.group = g, c.group_across = true;
      configs.push_back(c);
    }
    for (const GemmConfig& c : configs)
      for (int layout = 0; layout < 4; ++layout) vs.push_back({c, layout % 2 == 0, layout / 2 == 1, d, false});
  }
  return vs;
}
std::string simt_program(const std::vector<Variant>& vs) {
  std::string s = kModel;
  s += "#pragma GCC optimize(\"O1\")\n";
  for (size_t i = 0; i < vs.size(); ++i) {
    const Variant& v = vs[i];
    std::string t = v.dtype == DType::f64 ? "double" : "float", n = std::to_string(i);
    codegen::GemmWriter w(v.config, {v.a_k_major, v.b_k_major}, v.dtype, [&](const std::string& row, const std::string& col, const std::string& x, const std::string&) {
      return "((" + t + "*)P[2])[" + row + " * N + " + col + "] = " + x + ";";
    });
    s += "namespace k" + n + " {\nstatic void kernel(void* const* P, const int64_t* M) {\n" + w.body() + "}\n}\n";
    s += "extern \"C\" void kiln_run_" + n + "(void* const* P, const int64_t* M, unsigned blocks) { kiln_launch(k" + n +
         "::kernel, P, M, blocks, " + std::to_string(v.config.threads()) + ", " + std::to_string(v.config.split_k) + "); }\n";
  }
  return s;
}

uint16_t to_bits(double v, DType d) { return d == DType::bf16 ? float_to_bf16(float(v)) : float_to_f16(float(v)); }

struct Size {
  int64_t m, n, k;
};
std::string describe(const Variant& v, Size sz) {
  return v.config.str() + (v.a_k_major ? " A K-major" : " A M-major") + (v.b_k_major ? " B K-major " : " B N-major ") +
         std::string(info(v.dtype).name) + (v.gfx908 ? " gfx908" : "") + " m " + std::to_string(sz.m) + " n " + std::to_string(sz.n) +
         " k " + std::to_string(sz.k);
}
// Runs kernel kiln_run_<i> of `module` (config g) over the blocks of a [m, n] output.
template <class Module>
void run_kernel(const Module& module, size_t i, const GemmConfig& g, void* const* P, const int64_t* M, Size sz) {
  unsigned blocks = unsigned(((sz.m + g.bm - 1) / g.bm) * ((sz.n + g.bn - 1) / g.bn));
  auto run = reinterpret_cast<void (*)(void* const*, const int64_t*, unsigned)>(module->symbol(("kiln_run_" + std::to_string(i)).c_str()));
  run(P, M, blocks);
}
// C (got(r, c)) against the product of A's and B's values (row-major [m, k], [k, n]): exactly.
template <class Got>
void check_product(const std::vector<double>& a, const std::vector<double>& b, Size sz, Got got) {
  int64_t wrong = 0;
  for (int64_t r = 0; r < sz.m; ++r)
    for (int64_t col = 0; col < sz.n; ++col) {
      double want = 0;
      for (int64_t k = 0; k < sz.k; ++k) want += a[size_t(r * sz.k + k)] * b[size_t(k * sz.n + col)];
      if (!(got(r, col) == want) && wrong++ == 0) FAIL_CHECK("C[" << r << ", " << col << "] = " << got(r, col) << ", want " << want);
    }
  CHECK(wrong == 0);
}

// A [rows, cols] operand with small integer values; `col_major`: stored transposed. Each stored row
// holds `pad` more elements (NaN: a kernel that reads past the matrix poisons its result).
struct Operand {
  std::vector<double> value;  // [rows, cols], row-major
  std::vector<uint16_t> bits;
  int64_t row_stride, col_stride;
};
Operand operand(test::Rng& rng, int64_t rows, int64_t cols, bool col_major, int64_t pad, DType d) {
  Operand o;
  for (int64_t i = 0; i < rows * cols; ++i) o.value.push_back(double(rng.integer(-3, 3)));
  int64_t outer = col_major ? cols : rows, inner = col_major ? rows : cols, pitch = inner + pad;
  o.bits.assign(size_t(std::max<int64_t>(outer * pitch, 1)), to_bits(NAN, d));
  o.row_stride = col_major ? 1 : pitch, o.col_stride = col_major ? pitch : 1;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) o.bits[size_t(r * o.row_stride + c * o.col_stride)] = to_bits(o.value[size_t(r * cols + c)], d);
  return o;
}

// Runs model_program's kernel i (variant v) on fresh operands of size sz and checks C exactly.
// The operands' row pitches are rounded up to 16 bytes, plus 8: the last chunk of a row runs
// past the matrix into NaN. With prologues the operands come from sources at P[3], P[4]
// (the operands' own buffers are never read) and are -2 a + 1 and b / 2 - 1 (exact).
template <class Module>
void check_model_kernel(const Module& module, size_t i, const Variant& v, Size sz, test::Rng& rng) {
  CAPTURE(describe(v, sz));
  auto pitch_pad = [](int64_t inner) { return (8 - inner % 8) % 8 + 8; };
  Operand a = operand(rng, sz.m, sz.k, !v.a_k_major, pitch_pad(v.a_k_major ? sz.k : sz.m), v.dtype);
  Operand b = operand(rng, sz.k, sz.n, v.b_k_major, pitch_pad(v.b_k_major ? sz.k : sz.n), v.dtype);
  std::vector<double> fa = a.value, fb = b.value;
  std::vector<float> c(size_t(sz.m * sz.n), NAN);
  void* P[5] = {a.bits.data(), b.bits.data(), c.data(), nullptr, nullptr};
  int64_t M[14] = {2, sz.k, sz.m, sz.n, a.row_stride, a.col_stride, b.row_stride, b.col_stride, 0, 0, 0, 0, 0, 0};
  if (v.prologue) {
    for (double& x : fa) x = -2 * x + 1;
    for (double& x : fb) x = x * 0.5 - 1;
    P[3] = P[0], P[4] = P[1], P[0] = P[1] = nullptr;
    for (int j = 0; j < 4; ++j) M[10 + j] = M[4 + j], M[4 + j] = 0;
  }
  run_kernel(module, i, v.config, P, M, sz);
  check_product(fa, fb, sz, [&](int64_t r, int64_t col) { return double(c[size_t(r * sz.n + col)]); });
}

}  // namespace

TEST_CASE("MFMA GEMM kernel on a CPU model of CDNA wavefronts: equals a plain matmul (odd sizes, zero-fill, layouts, paths)") {
  using K = GemmKind;
  // Tiles: two waves along N with more lanes than B chunks; the heuristic's 128x128; one wave, BK 16.
  std::vector<GemmConfig> configs = {{K::mfma, 64, 32, 32, 32, 16, 2}, codegen::gemm_candidates(DType::bf16, -0x90a).front(),
                                     {K::mfma, 32, 64, 16, 32, 64, 2}};
  REQUIRE(configs[1].kind == K::mfma);
  // Every operand layout with every instruction path: (A K-major?, B K-major?, dtype, gfx908).
  struct Path {
    bool ak, bk;
    DType d;
    bool gfx908;
  };
  std::vector<Path> paths = {{true, false, DType::bf16, false}, {false, true, DType::bf16, true},
                             {true, true, DType::f16, false},   {false, false, DType::f16, true}};
  std::vector<Variant> vs;
  for (const GemmConfig& c : configs)
    for (const Path& p : paths) vs.push_back({c, p.ak, p.bk, p.d, p.gfx908});
  auto module = jit::load_host_module(model_program(vs));

  KILN_TEST_RNG(rng);
  for (Size sz : {Size{37, 45, 70}, Size{1, 20, 9}, Size{5, 7, 0}})
    for (size_t i = 0; i < vs.size(); ++i) check_model_kernel(module, i, vs[i], sz, rng);
}

TEST_CASE("MFMA GEMM kernel with both operands' prologues on the CPU model: computed from 16-bit sources, zeros past M, N and K") {
  const GemmConfig config = codegen::gemm_candidates(DType::bf16, -0x90a).front();
  REQUIRE(config.kind == GemmKind::mfma);
  std::vector<Variant> vs = {{config, true, false, DType::bf16, false, true}, {config, false, true, DType::bf16, true, true},
                             {config, true, true, DType::f16, false, true}, {{GemmKind::mfma, 32, 64, 16, 32, 64, 2}, false, false, DType::f16, true, true}};
  auto module = jit::load_host_module(model_program(vs));
  KILN_TEST_RNG(rng);
  for (Size sz : {Size{37, 45, 70}, Size{1, 20, 9}, Size{5, 7, 0}})
    for (size_t i = 0; i < vs.size(); ++i) check_model_kernel(module, i, vs[i], sz, rng);
}

TEST_CASE("SIMT GEMM kernel on a CPU model of a thread block: equals a plain matmul (odd sizes, K tiles, K = 0, layouts, f32, f64)") {
  std::vector<Variant> vs = simt_variants();
  auto module = jit::load_host_module(simt_program(vs));
  KILN_TEST_RNG(rng);
  for (Size sz : {Size{37, 45, 70}, Size{130, 3, 17}, Size{1, 20, 9}, Size{5, 7, 0}}) {
    for (size_t i = 0; i < vs.size(); ++i) {
      const Variant& v = vs[i];
      CAPTURE(describe(v, sz));
      // Operands of small integers (exact products and sums), rows padded by 3 NaN elements
      // and followed by a NaN row (a K-major operand's read past K meets the padding, an
      // M-major one's that row).
      auto operand = [&](int64_t rows, int64_t cols, bool col_major, std::vector<double>& value, int64_t& rs, int64_t& cs) {
        int64_t outer = col_major ? cols : rows, pitch = (col_major ? rows : cols) + 3;
        std::vector<double> stored(size_t((outer + 1) * pitch), NAN);
        rs = col_major ? 1 : pitch, cs = col_major ? pitch : 1;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) {
            value.push_back(double(rng.integer(-3, 3)));
            stored[size_t(r * rs + c * cs)] = value.back();
          }
        return stored;
      };
      std::vector<double> av, bv;
      int64_t ars, acs, brs, bcs;
      std::vector<double> a = operand(sz.m, sz.k, !v.a_k_major, av, ars, acs), b = operand(sz.k, sz.n, v.b_k_major, bv, brs, bcs);
      std::vector<float> af(a.begin(), a.end()), bf(b.begin(), b.end());
      std::vector<double> c(size_t(sz.m * sz.n), NAN);
      std::vector<float> cf(c.size(), NAN);
      const bool f64 = v.dtype == DType::f64;
      void* P[3] = {f64 ? (void*)a.data() : (void*)af.data(), f64 ? (void*)b.data() : (void*)bf.data(), f64 ? (void*)c.data() : (void*)cf.data()};
      int64_t M[8] = {2, sz.k, sz.m, sz.n, ars, acs, brs, bcs};
      run_kernel(module, i, v.config, P, M, sz);
      check_product(av, bv, sz, [&](int64_t r, int64_t col) { return f64 ? c[size_t(r * sz.n + col)] : double(cf[size_t(r * sz.n + col)]); });
    }
  }
}
