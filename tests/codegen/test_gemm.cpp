// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The GPU GEMM (codegen/gemm.hpp): the config choice and the layout/alignment facts
// on the CPU; every candidate config compiling through NVRTC (sm_80, sm_90) and
// hipRTC (gfx90a, gfx908, gfx94x where it knows them: MFMA; gfx1030: SIMT); and on a GPU, the tensor-core and SIMT kernels
// against the float64 reference over odd sizes, K not a multiple of the tile,
// partial 16-byte chunks (K-sliced views), transposed operands read in place,
// broadcast batches, every float dtype, each candidate config forced in turn; and a
// fused epilogue (gelu(x @ W1 + b1)) inside the tensor-core kernel.
#include <atomic>
#include <thread>

#include "../support/gpu_program.hpp"
#include "../support/reference.hpp"

using namespace kiln;
using namespace kiln::test;
using codegen::GemmConfig;
using codegen::GemmKind;
using codegen::GemmProblem;

namespace {

// Installs a chooser for the scope: forces `forced` (if any) and records what it saw.
struct GemmHook {
  std::vector<GemmProblem> seen;  // NOTE: gemm_choose() through the hook adds to it: iterate over a copy
  explicit GemmHook(std::optional<GemmConfig> forced = std::nullopt) {
    codegen::gemm_chooser() = [this, forced](const GemmProblem& p) {
      seen.push_back(p);
      return forced;
    };
  }
  ~GemmHook() { codegen::gemm_chooser() = nullptr; }
  GemmHook(const GemmHook&) = delete;
  GemmHook& operator=(const GemmHook&) = delete;
};

// kiln::gemm_column_sums on for the scope (off by default).
struct ColumnSumsOn {
  ColumnSumsOn() { set_gemm_column_sums(true); }
  ~ColumnSumsOn() { set_gemm_column_sums(false); }
};
// kiln::gemm_operand_sums on for the scope (off by default).
struct OperandSumsOn {
  OperandSumsOn() { set_gemm_operand_sums(true); }
  ~OperandSumsOn() { set_gemm_operand_sums(false); }
};
// kiln::gemm_totals on for the scope (kiln's default; KILN_GEMM_TOTALS=0 turns it off).
struct TotalsOn {
  const bool was = gemm_totals();
  TotalsOn() { set_gemm_totals(true); }
  ~TotalsOn() { set_gemm_totals(was); }
};

template <class DT, int R>
Tensor<DT, R> det(Shape<R> s, uint64_t seed) {  // deterministic CPU tensor (for programs only)
  return Tensor<DT, R>::from(s, std::vector<double>(size_t(numel(s)), 0.5 + double(seed)), cpu());
}

// What CudaBackend::run builds on an sm_<arch> device of 132 SMs (an H100/H200).
template <class... Es>
GpuProgram cuda_program(int arch, const Es&... es) {
  return gpu_program<runtime::CudaBackend>(32, arch, 132, es...);
}

// What HipBackend::run builds on a device of this AMD target (132 compute units).
template <class... Es>
GpuProgram hip_program(const std::string& target, const Es&... es) {
  return gpu_program<runtime::HipBackend>(runtime::hip_target_warp_size(target), codegen::gemm_amd_arch(target), 132, es...);
}

// gelu'(u), written out: what W4's forward GEMM stores beside gelu(u) (erf and exp: two
// transcendentals an element; ref::gelu_grad).
template <Expr E>
auto gelu_grad(const E& u) {
  return 0.5 * (1 + kiln::erf(u * (1 / std::numbers::sqrt2))) + u * kiln::exp(-0.5 * u * u) * (std::numbers::inv_sqrtpi / std::numbers::sqrt2);
}

GemmProblem problem(int64_t m, int64_t n, int64_t k, DType d, bool ok, int arch, bool tma = false) {
  GemmProblem p;
  p.m = m, p.n = n, p.k = k, p.dtype = d, p.tensor_ok = ok, p.tma_ok = ok && tma, p.arch = arch, p.sm_count = 132;
  return p;
}

// Whether a persistent config's tile splits over a cluster of two blocks (each brings half of
// B's columns, 64 at a time): the configs the tests also run in clusters.
bool splits_in_two(const GemmConfig& c) { return c.bn % 128 == 0; }

}  // namespace

TEST_CASE("gemm config choice: tensor cores only where dtype, architecture and layout allow; forced configs obey") {
  GemmConfig big = codegen::gemm_heuristic(problem(8192, 8192, 8192, DType::bf16, true, 90));
  CHECK(big.kind == GemmKind::mma);  // no copy engine layout: mma
  CHECK(big.bm * big.bn >= 128 * 128);
  GemmConfig hopper = codegen::gemm_heuristic(problem(8192, 8192, 8192, DType::bf16, true, 90, true));
  CHECK(hopper.kind == GemmKind::wgmma);
  CHECK(hopper.bm * hopper.bn == 128 * 256);
  CHECK(hopper.cluster == 2);  // 2048 tiles on 132 SMs: in clusters of two
  GemmConfig one_wave = codegen::gemm_heuristic(problem(2048, 1024, 4096, DType::f16, true, 90, true));
  CHECK(one_wave.bn == 128);  // 128 tiles of 128x128
  CHECK(one_wave.cluster == 1);  // one wave: no clusters
  CHECK(codegen::gemm_heuristic(problem(8192, 4096, 4096, DType::bf16, true, 90, true)).cluster == 2);  // 1024 tiles (W4's h @ W2)
  CHECK(codegen::gemm_heuristic(problem(2048, 4096, 4096, DType::bf16, true, 90, true)).cluster == 1);  // 256 tiles: under two waves
  CHECK(codegen::gemm_heuristic(problem(512, 131072, 4096, DType::bf16, true, 90, true)).cluster == 1);  // 4 tile rows
  GemmProblem batched = problem(1024, 4096, 4096, DType::bf16, true, 90, true);
  batched.batch = 8;  // 8 x 128 tiles, but clusters only within one matrix
  CHECK(codegen::gemm_heuristic(batched).persistent);
  CHECK(codegen::gemm_heuristic(batched).cluster == 1);
  CHECK(codegen::gemm_heuristic(problem(8192, 8192, 32, DType::bf16, true, 90, true)).kind == GemmKind::mma);  // K < 64
  CHECK(codegen::gemm_heuristic(problem(8192, 8192, 8192, DType::bf16, true, 80, true)).kind == GemmKind::mma);
  CHECK(codegen::gemm_heuristic(problem(8192, 8192, 8192, DType::bf16, true, 100, true)).kind == GemmKind::mma);
  CHECK(codegen::gemm_heuristic(problem(64, 64, 64, DType::f16, true, 80)).bm == 64);  // few tiles: the smallest
  CHECK(codegen::gemm_heuristic(problem(8192, 8192, 8192, DType::bf16, false, 90)).kind == GemmKind::simt);
  CHECK(codegen::gemm_heuristic(problem(8192, 8192, 8192, DType::bf16, true, 75)).kind == GemmKind::simt);
  CHECK(codegen::gemm_heuristic(problem(8192, 8192, 8192, DType::bf16, true, 0)).kind == GemmKind::simt);
  CHECK(codegen::gemm_heuristic(problem(8192, 8192, 8192, DType::f32, true, 90)).kind == GemmKind::simt);
  // SIMT: the largest tile that fills the SMs with K in up to 16 ranges of at least 128 (split-K;
  // 32x32 in slices of K where K holds two of its steps); else the plain 32x32, K in ranges down
  // to one K step
  auto simt = [](int64_t m, int64_t n, int64_t k, DType d = DType::f32) {
    GemmConfig c = codegen::gemm_heuristic(problem(m, n, k, d, false, 90));
    CHECK(codegen::gemm_fits(c, problem(m, n, k, d, false, 90)));
    CHECK(c.kind == GemmKind::simt);
    return std::tuple{c.bm, c.k_slices, c.split_k};
  };
  CHECK(simt(4096, 4096, 4096) == std::tuple{128, 1, 1});
  CHECK(simt(1024, 1024, 1024) == std::tuple{128, 1, 2});   // 64 tiles in 2 ranges
  CHECK(simt(128, 1024, 4096) == std::tuple{128, 1, 16});   // 8 tiles in 16 ranges of 256
  CHECK(simt(256, 512, 512) == std::tuple{64, 1, 4});       // 128x128: 8 tiles in 4 ranges of 128 do not fill the SMs
  CHECK(simt(1024, 512, 64) == std::tuple{64, 1, 1});       // K too short to split
  CHECK(simt(256, 512, 64) == std::tuple{32, 4, 1});        // 128 tiles of 32x32
  CHECK(simt(256, 512, 63) == std::tuple{32, 1, 1});        // one K step: no slices
  CHECK(simt(32, 256, 256) == std::tuple{32, 1, 16});       // few tiles at every size: the smallest plain tile, a K step a range
  CHECK(simt(32, 10, 256) == std::tuple{32, 1, 16});        // one tile
  CHECK(simt(32, 10, 40) == std::tuple{32, 1, 2});          // three K steps: two ranges (K in 2 x 16 and 8)
  CHECK(simt(8, 2048, 256) == std::tuple{32, 4, 2});        // 64 tiles in 2 ranges fill the SMs: not the small case
  CHECK(simt(256, 512, 512, DType::f64) == std::tuple{64, 1, 4});
  GemmProblem batched_simt = problem(64, 64, 4096, DType::f32, false, 90);
  batched_simt.batch = 200;  // 200 tiles of 128x128: no split
  CHECK(codegen::gemm_heuristic(batched_simt).split_k == 1);
  for (GemmProblem q : {problem(128, 1024, 4096, DType::f32, false, 90), problem(32, 256, 256, DType::f32, false, 90)}) {
    auto tuned = codegen::gemm_tuning_candidates(q);  // the heuristic's split among what max-autotune times
    CHECK(std::find(tuned.begin(), tuned.end(), codegen::gemm_heuristic(q)) != tuned.end());
  }
  for (DType d : {DType::bf16, DType::f16, DType::f32, DType::f64, DType::i32, DType::i64})
    for (int arch : {0, 80, 90})
      for (const GemmConfig& c : codegen::gemm_candidates(d, arch)) {
        CAPTURE(c.str());
        CHECK(c.bm % c.wm == 0);
        CHECK(c.bn % c.wn == 0);
        CHECK(c.threads() <= 1024);
        if (c.kind == GemmKind::simt) CHECK(codegen::gemm_simt_shared_bytes(c, d) <= 48u * 1024);  // static
        if (c.kind == GemmKind::mma) {
          CHECK(c.wm % 16 == 0);
          CHECK(c.wn % 16 == 0);
          CHECK(c.bk % 16 == 0);
          CHECK(c.stages >= 2);
          for (bool ak : {false, true})
            for (bool bk : {false, true}) CHECK(codegen::gemm_shared_bytes(c, {ak, bk}) <= 227u * 1024);
        }
        if (c.kind == GemmKind::wgmma) {  // 64-row consumers, 64-element swizzle rows, n <= 256 per instruction
          CHECK(arch == 90);
          CHECK(c.wm == 64);
          CHECK(c.bk == 64);
          CHECK(c.wn == c.bn);
          CHECK((c.bn % 64 == 0 && c.bn <= 256));
          CHECK(c.stages >= 2);
          CHECK(codegen::gemm_shared_bytes(c, {}) <= 227u * 1024);
        }
      }
  // 16-bit wgmma in K steps of 32 (64-byte rows): not candidates yet; they fit a 16-bit Hopper
  // problem the copy engine reads, in twice the stages of their K-64 twins in the same room.
  GemmProblem hop = problem(8192, 4096, 4096, DType::bf16, true, 90, true);
  for (const GemmConfig& c : codegen::gemm_k32_configs()) {
    CAPTURE(c.str());
    CHECK((c.kind == GemmKind::wgmma && c.wm == 64 && c.bk == 32 && c.wn == c.bn && c.persistent));
    CHECK(codegen::gemm_shared_bytes(c, {}) <= 227u * 1024);
    CHECK(codegen::gemm_fits(c, hop));
    CHECK(codegen::gemm_clustered(c, hop).cluster == 2);
    GemmProblem f32 = hop, no_tma = hop;
    f32.dtype = DType::f32, f32.tf32 = true, no_tma.tma_ok = false;
    CHECK(!codegen::gemm_fits(c, f32));
    CHECK(!codegen::gemm_fits(c, no_tma));
    for (const GemmConfig& k : codegen::gemm_tuning_candidates(hop)) CHECK(k.bk == 64);
  }
  // AMD: MFMA on CDNA (gfx908, gfx90a, gfx94x) for bf16/f16, never on RDNA or for other dtypes.
  CHECK(codegen::gemm_amd_arch("gfx90a:sramecc+:xnack-") == -0x90a);
  CHECK(codegen::gemm_amd_arch("gfx1030") == -0x1030);
  CHECK(codegen::gemm_amd_arch("sm_90") == 0);
  CHECK(codegen::gemm_amd_arch("gfx9-generic") == 0);
  for (const char* t : {"gfx908", "gfx90a", "gfx940", "gfx942", "gfx1030", "gfx1100", "gfx906"}) {
    CAPTURE(t);
    int arch = codegen::gemm_amd_arch(t);
    bool cdna = std::string(t) == "gfx908" || std::string(t) == "gfx90a" || std::string(t).rfind("gfx94", 0) == 0;
    CHECK(arch < 0);
    CHECK(!codegen::gemm_has_mma(DType::bf16, arch));
    for (DType d : {DType::bf16, DType::f16})
      CHECK(codegen::gemm_heuristic(problem(4096, 4096, 4096, d, true, arch)).kind == (cdna ? GemmKind::mfma : GemmKind::simt));
    CHECK(codegen::gemm_heuristic(problem(4096, 4096, 4096, DType::bf16, false, arch)).kind == GemmKind::simt);
    CHECK(codegen::gemm_heuristic(problem(4096, 4096, 4096, DType::f32, true, arch)).kind == GemmKind::simt);
    CHECK(codegen::gemm_tuning_candidates(problem(4096, 4096, 4096, DType::bf16, true, arch)).size() ==
          (cdna ? 7u : codegen::gemm_candidates(DType::bf16, 0).size()));
    for (const GemmConfig& c : codegen::gemm_candidates(DType::bf16, arch)) {
      CAPTURE(c.str());
      CHECK(c.kind == (cdna ? GemmKind::mfma : GemmKind::simt));
      CHECK(c.threads() <= 1024);
      if (c.kind != GemmKind::mfma) continue;
      CHECK(c.bm % c.wm == 0);
      CHECK(c.bn % c.wn == 0);
      CHECK(c.wm % 16 == 0);
      CHECK(c.wn % 16 == 0);
      CHECK(c.bk % 16 == 0);
      CHECK(codegen::gemm_mfma_lds_bytes(c.bm, c.bn, c.bk) <= codegen::kGemmMfmaMaxLds);
      CHECK(codegen::gemm_shared_bytes(c, {}) == 0);  // static LDS
    }
  }
  {  // a forced MFMA config: taken on CDNA, SIMT where it cannot run
    GemmConfig mfma = codegen::gemm_candidates(DType::f16, -0x90a).front();
    REQUIRE(mfma.kind == GemmKind::mfma);
    GemmHook force(mfma);
    CHECK(codegen::gemm_choose(problem(100, 100, 100, DType::f16, true, -0x908)) == mfma);
    CHECK(codegen::gemm_choose(problem(100, 100, 100, DType::f16, true, -0x1030)).kind == GemmKind::simt);
    CHECK(codegen::gemm_choose(problem(100, 100, 100, DType::f16, true, 90)).kind == GemmKind::simt);
    CHECK(codegen::gemm_choose(problem(100, 100, 100, DType::f16, false, -0x90a)).kind == GemmKind::simt);
  }
  // What max-autotune times: where wgmma fits, every wgmma config; else every mma config.
  auto tuned = codegen::gemm_tuning_candidates(problem(8192, 8192, 8192, DType::bf16, true, 90, true));
  auto count = [](const std::vector<GemmConfig>& cs, GemmKind k) { return std::count_if(cs.begin(), cs.end(), [&](const GemmConfig& c) { return c.kind == k; }); };
  CHECK(count(tuned, GemmKind::wgmma) == 6);
  CHECK(count(tuned, GemmKind::mma) == 0);
  // ... the persistent ones in clusters, as the heuristic would run them (2048 or more tiles).
  auto clustered = [](const std::vector<GemmConfig>& cs) { return std::count_if(cs.begin(), cs.end(), [](const GemmConfig& c) { return c.cluster == 2; }); };
  CHECK(clustered(tuned) == 2);
  for (const GemmConfig& c : tuned) CHECK((c.cluster == 2) == c.persistent);
  CHECK(clustered(codegen::gemm_tuning_candidates(problem(1024, 1024, 1024, DType::bf16, true, 90, true))) == 0);
  // A transcendental epilogue: the split-epilogue configs too, and the heuristic's tile with one.
  GemmProblem heavy = problem(8192, 8192, 8192, DType::bf16, true, 90, true);
  heavy.heavy_epilogue = true;
  auto tuned_heavy = codegen::gemm_tuning_candidates(heavy);
  CHECK(count(tuned_heavy, GemmKind::wgmma) == 8);
  CHECK(std::count_if(tuned_heavy.begin(), tuned_heavy.end(), [](const GemmConfig& c) { return c.split_epilogue; }) == 2);
  CHECK(!hopper.split_epilogue);
  GemmConfig split = codegen::gemm_heuristic(heavy);
  CHECK((split.kind == GemmKind::wgmma && split.bm == 128 && split.bn == 256 && split.persistent && split.split_epilogue));
  CHECK(split.str().substr(split.str().find("_p")) == "_pe_c2");
  CHECK(clustered(tuned_heavy) == 3);  // not the 128 x 192 split config: 192 columns do not split into two 64-column shares
  heavy.m = heavy.n = 1024;  // 64 tiles of 128 x 128: no split config of that tile
  CHECK(!codegen::gemm_heuristic(heavy).split_epilogue);
  auto no_tma = codegen::gemm_tuning_candidates(problem(8192, 8192, 8192, DType::bf16, true, 90));
  CHECK(count(no_tma, GemmKind::wgmma) == 0);
  CHECK(count(no_tma, GemmKind::mma) == 12);
  {  // f32 without TF32: the SIMT candidates, and the heuristic's own choice (32x32 in 4 ranges of K) at the end
    auto small = codegen::gemm_tuning_candidates(problem(64, 64, 64, DType::f32, true, 90));
    CHECK(small.size() == codegen::gemm_candidates(DType::f32, 0).size() + 1);
    CHECK(small.back().str() == codegen::gemm_heuristic(problem(64, 64, 64, DType::f32, true, 90)).str());
    CHECK(small.back().split_k == 4);
  }
  // A forced tensor-core config on operands that cannot take it falls back to SIMT; a forced
  // wgmma on operands the copy engine cannot read, to mma.
  GemmConfig mma = codegen::gemm_candidates(DType::bf16, 80).front(), wgmma = codegen::gemm_candidates(DType::bf16, 90).front();
  REQUIRE(wgmma.kind == GemmKind::wgmma);
  {
    GemmHook force(wgmma);
    CHECK(codegen::gemm_choose(problem(100, 100, 100, DType::bf16, true, 90, true)) == wgmma);
    CHECK(codegen::gemm_choose(problem(100, 100, 100, DType::bf16, true, 90)).kind == GemmKind::mma);
    CHECK(codegen::gemm_choose(problem(100, 100, 100, DType::bf16, true, 80, true)).kind == GemmKind::mma);
    CHECK(codegen::gemm_choose(problem(100, 100, 100, DType::bf16, false, 90)).kind == GemmKind::simt);
  }
  {
    GemmHook force(mma);
    CHECK(codegen::gemm_choose(problem(100, 100, 100, DType::bf16, true, 90)) == mma);
    CHECK(codegen::gemm_choose(problem(100, 100, 100, DType::bf16, false, 90)).kind == GemmKind::simt);
    CHECK(codegen::gemm_choose(problem(100, 100, 100, DType::f32, true, 90)).kind == GemmKind::simt);
  }
  {  // a SIMT config whose tiles of 8-byte accumulators pass 48 KB: the dtype's own choice instead
    GemmConfig wide{GemmKind::simt, 128, 128, 16, 8, 8, 1};
    GemmHook force(wide);
    CHECK(codegen::gemm_choose(problem(100, 100, 100, DType::f32, false, 90)) == wide);
    for (DType d : {DType::f64, DType::i32, DType::i64}) {
      CHECK(codegen::gemm_simt_shared_bytes(wide, d) > 48u * 1024);
      CHECK(codegen::gemm_choose(problem(100, 100, 100, d, false, 90)) == codegen::gemm_heuristic(problem(100, 100, 100, d, false, 90)));
    }
  }
  CHECK(!codegen::gemm_chooser());
}

TEST_CASE("TF32: f32 takes the tensor cores where allowed, on sm_80+, aligned operands (wgmma where the copy engine reads them)") {
  GemmProblem tf = problem(8192, 8192, 8192, DType::f32, true, 90, true);
  CHECK(codegen::gemm_heuristic(tf).kind == GemmKind::simt);  // not allowed: f32 arithmetic
  tf.tf32 = true;
  GemmConfig t = codegen::gemm_heuristic(tf);
  CHECK(t == codegen::gemm_clustered(codegen::gemm_candidates(DType::f32, 90, true).front(), tf));
  CHECK((t.kind == GemmKind::wgmma && t.bm == 128 && t.bn == 256 && t.bk == 32 && t.persistent && !t.split_epilogue && t.cluster == 2));
  {  // without the copy engine's layout (tma_ok): mma.sync
    GemmProblem q = tf;
    q.tma_ok = false;
    GemmConfig m = codegen::gemm_heuristic(q);
    CHECK((m.kind == GemmKind::mma && m.bm == 128 && m.bn == 128 && m.bk == 32));
    for (const GemmConfig& c : codegen::gemm_tuning_candidates(q)) CHECK(c.kind == GemmKind::mma);
  }
  // A 16-bit wgmma config (K steps of 64) and a split epilogue (a 16-bit staging) do not fit TF32.
  CHECK(!codegen::gemm_fits(codegen::gemm_candidates(DType::bf16, 90).front(), tf));
  for (const GemmConfig& c : codegen::gemm_candidates(DType::bf16, 90))
    if (c.kind == GemmKind::wgmma) {
      GemmConfig f = c;
      f.bk = 32;
      CHECK(codegen::gemm_fits(f, tf) == !c.split_epilogue);
    }
  CHECK(codegen::gemm_heuristic(problem(64, 64, 64, DType::f32, true, 80)).kind == GemmKind::simt);
  for (auto [arch, ok, want] : {std::tuple{80, true, GemmKind::mma}, {86, true, GemmKind::mma}, {75, true, GemmKind::simt},
                                {90, false, GemmKind::simt}, {-0x90a, true, GemmKind::simt}, {0, true, GemmKind::simt}}) {
    CAPTURE(arch);
    GemmProblem q = problem(2048, 2048, 2048, DType::f32, ok, arch);
    q.tf32 = true;
    CHECK(codegen::gemm_heuristic(q).kind == want);
    for (const GemmConfig& c : codegen::gemm_tuning_candidates(q)) CHECK(c.kind == want);
  }
  {  // sm_90 with the copy engine: wgmma where the tiles fill the SMs, mma.sync below that
    GemmProblem q = problem(2048, 2048, 2048, DType::f32, true, 90, true);
    q.tf32 = true;
    CHECK(codegen::gemm_heuristic(q).kind == GemmKind::wgmma);
    for (const GemmConfig& c : codegen::gemm_tuning_candidates(q)) CHECK(c.kind == GemmKind::wgmma);
    GemmProblem small = problem(256, 256, 256, DType::f32, true, 90, true);
    small.tf32 = true;
    CHECK(codegen::gemm_heuristic(small).kind == GemmKind::mma);
  }
  CHECK(codegen::gemm_tuning_candidates(tf).size() == 6);  // the wgmma configs (mma.sync's run at half their speed or less)
  CHECK(codegen::gemm_candidates(DType::f32, 90) == codegen::gemm_candidates(DType::f32, 0));  // SIMT unless allowed
  CHECK(codegen::gemm_candidates(DType::bf16, 90, true) == codegen::gemm_candidates(DType::bf16, 90));
  for (const GemmConfig& c : codegen::gemm_candidates(DType::f32, 80, true)) {
    CAPTURE(c.str());
    CHECK(c.kind == GemmKind::mma);
    CHECK((c.wm % 16 == 0 && c.wn % 16 == 0 && c.bk % 8 == 0 && c.stages >= 2));
    CHECK(c.threads() <= 1024);
    for (bool ak : {false, true})
      for (bool bk : {false, true}) {
        CHECK(codegen::gemm_shared_bytes(c, {ak, bk, 4}) <= codegen::gemm_max_shared(80));  // an A100's too
        CHECK(codegen::gemm_shared_bytes(c, {ak, bk, 4}) > codegen::gemm_shared_bytes(c, {ak, bk, 2}));
      }
  }
  // A 16-bit config forced on f32 takes twice the room: where that is more than the device
  // has, the heuristic's TF32 config instead.
  GemmConfig wide{GemmKind::mma, 128, 256, 64, 64, 64, 3};
  CHECK(codegen::gemm_shared_bytes(wide, {true, false, 4}) > codegen::gemm_max_shared(90));
  GemmHook force(wide);
  CHECK(codegen::gemm_choose(tf) == t);
  CHECK(codegen::gemm_choose(problem(8192, 8192, 8192, DType::bf16, true, 90)) == wide);
  // The same room decides 16-bit configs on a GPU of 99 KB (sm_86): the big tiles drop out.
  auto sm86 = codegen::gemm_tuning_candidates(problem(8192, 8192, 8192, DType::bf16, true, 86));
  CHECK(!sm86.empty());
  CHECK(sm86.size() < codegen::gemm_tuning_candidates(problem(8192, 8192, 8192, DType::bf16, true, 80)).size());
  for (const GemmConfig& c : sm86) CHECK(codegen::gemm_shared_bytes(c, {}) <= 99u * 1024);
}

TEST_CASE("the persistent GEMM's schedule: every K step of every tile once; a split tail cuts the last wave's tiles in K, piece by piece") {
  struct Unit {
    int64_t tile;
    int kb, ke, piece;
    int64_t slot;
  };
  for (int64_t grid : {1, 2, 3, 7, 66, 132})
    for (int64_t tiles : {int64_t(1), grid - 1, grid, grid + 1, 2 * grid - 1, 2 * grid + 3, 3 * grid, 4 * grid + 1, int64_t(4096), int64_t(2048),
                          int64_t(1024), int64_t(512)})
      for (int kt : {0, 1, 2, 3, 5, 64, 128, 256})
        for (int split : {0, 1, 2, 3, 8})  // 0: whole tiles; 1: kiln_tail_parts's cut; 2, 3, 8: that many pieces (a bench's knob)
          for (int64_t batches : {1, 2}) {
            if (tiles < 1) continue;
            CAPTURE(grid);
            CAPTURE(tiles);
            CAPTURE(kt);
            CAPTURE(split);
            CAPTURE(batches);
            std::vector<std::vector<Unit>> by_block(static_cast<size_t>(grid));
            std::vector<int> steps(size_t(tiles * std::max(kt, 1)), 0);
            const int wanted = split > 1 ? split : 0;
            const codegen::walk::KilnWalk first(tiles, kt, grid, 0, batches, split > 0, wanted);
            for (int64_t b = 0; b < grid; ++b) {
              codegen::walk::KilnWalk w(tiles, kt, grid, b, batches, split > 0, wanted);
              CHECK((w.tail == first.tail && w.parts == first.parts));  // every block sees the same cut
              Unit u{};
              while (w.step(u.tile, u.kb, u.ke)) {
                REQUIRE((u.tile >= 0 && u.tile < tiles && u.kb >= 0 && u.kb <= u.ke && u.ke <= kt));
                // A piece: the block's units are b, + grid, ... after its whole tiles; its slot is its unit.
                const int64_t unit = b + (int64_t(by_block[size_t(b)].size()) - (w.whole - b + grid - 1) / grid) * grid;
                u.piece = u.tile < w.whole ? -1 : w.unit_piece(unit), u.slot = u.tile < w.whole ? -1 : unit;
                if (u.piece >= 0) CHECK((w.unit_tile(unit) == u.tile && u.kb == w.begin(u.piece) && u.ke == w.begin(u.piece + 1)));
                by_block[size_t(b)].push_back(u);
                for (int k = u.kb; k < u.ke; ++k) ++steps[size_t(u.tile * kt + k)];
              }
            }
            // Every K step of every tile exactly once; every tile visited (K = 0: its zeros stored).
            CHECK(std::count(steps.begin(), steps.begin() + tiles * kt, 1) == tiles * kt);
            // Where the tail is split (one batch, the tiles leaving a partial last wave, a cut
            // that pays, or the pieces asked for): 2 .. 8 pieces, at most one a K step.
            const int64_t tail = first.tail, parts = first.parts, whole = tiles - tail, waves = whole / grid;
            const bool partial = split > 0 && batches == 1 && tiles > grid && tiles % grid != 0;
            const bool applies = partial && parts > 1;
            CHECK((tail > 0) == applies);
            if (!applies) CHECK(parts == 1);
            if (applies) {
              CHECK((tail == tiles % grid && parts >= 2 && parts <= 8 && parts <= kt));
              CHECK(first.slots() == tail * (parts - 1));
            }
            if (partial && wanted > 0) CHECK(parts == std::max(1, std::min(wanted, kt)));
            std::vector<int64_t> load;
            std::vector<std::vector<Unit>> pieces(static_cast<size_t>(tail));
            for (int64_t b = 0; b < grid; ++b) {
              const auto& us = by_block[size_t(b)];
              int64_t n = 0;
              for (size_t i = 0; i < us.size(); ++i) {
                const Unit& u = us[i];
                n += u.ke - u.kb;
                if (u.piece < 0) {  // whole tiles first, round the blocks: b, b + grid, ...
                  CHECK((u.kb == 0 && u.ke == kt && u.tile == b + int64_t(i) * grid));
                  continue;
                }
                // The pieces after the whole tiles: piece p of tail tile t is unit p * tail + t,
                // round the blocks likewise, so the blocks of one round read the same K range.
                CHECK(int64_t(i) >= waves);
                const int64_t unit = u.piece * tail + (u.tile - whole);
                CHECK(unit % grid == b);
                CHECK(unit / grid == int64_t(i) - waves);
                CHECK(u.ke - u.kb >= kt / parts);  // K steps shared out evenly, in order (below)
                CHECK(u.ke - u.kb <= kt / parts + 1);
                pieces[size_t(u.tile - whole)].push_back(u);
              }
              load.push_back(n);
            }
            // Each tail tile: its pieces in order cover K; each but the last has a slot of its
            // own (distinct, below slots()); the last comes in a round no earlier than the
            // others' (it waits for them: no block waits on a later round).
            std::vector<int> slot_used(size_t(std::max<int64_t>(first.slots(), 0)), 0);
            for (int64_t t = 0; t < tail; ++t) {
              auto& ps = pieces[size_t(t)];
              REQUIRE(int64_t(ps.size()) == parts);
              std::sort(ps.begin(), ps.end(), [](const Unit& a, const Unit& b) { return a.piece < b.piece; });
              for (int64_t p = 0; p < parts; ++p) {
                CHECK(ps[size_t(p)].piece == p);
                CHECK(ps[size_t(p)].kb == (p == 0 ? 0 : ps[size_t(p - 1)].ke));
                if (p + 1 < parts) {
                  REQUIRE((ps[size_t(p)].slot >= 0 && ps[size_t(p)].slot < first.slots()));
                  ++slot_used[size_t(ps[size_t(p)].slot)];
                }
              }
              CHECK(ps.back().ke == kt);
            }
            CHECK(std::count(slot_used.begin(), slot_used.end(), 1) == int64_t(slot_used.size()));
            // A split tail finishes before a whole last wave would: no block does more K steps
            // than one in a whole-tile schedule's last wave.
            const int64_t most = *std::max_element(load.begin(), load.end());
            if (applies && wanted == 0) CHECK(most < (waves + 1) * kt);
            if (!applies) CHECK(most == (tiles + grid - 1) / grid * kt);
          }
  // W4's GEMMs in clusters of two on 132 SMs (66 clusters): x @ W1 and dy @ W2.t() (2048
  // cluster tiles, 64 K steps), dW1 and dW2 (1024, 128), h @ W2 and dx (512, 256).
  for (auto [tiles, kt] : {std::pair<int64_t, int>{2048, 64}, {1024, 128}, {512, 256}}) {
    const codegen::walk::KilnWalk w(tiles, kt, 66, 0, 1, true);
    CAPTURE(tiles);
    CHECK(w.tail == tiles % 66);
    CHECK(w.parts == 5);
  }
}

TEST_CASE("gemm layout facts: K-major or M/N-major operands, 16-byte rows, else no tensor cores") {
  auto a = det<bf16, 2>({64, 40}, 1), b = det<bf16, 2>({40, 24}, 2);
  auto at = det<bf16, 2>({40, 64}, 3).transpose(0, 1), bt = det<bf16, 2>({24, 40}, 4).transpose(0, 1);
  auto odd = det<bf16, 2>({64, 39}, 5), odd_b = det<bf16, 2>({39, 24}, 6);
  auto sliced = det<bf16, 2>({64, 48}, 7).slice(1, 0, 39);  // K = 39 over rows of 48: aligned rows, a partial chunk
  GpuProgram p = cuda_program(90, matmul(a, b), matmul(at, b), matmul(a, bt), matmul(at, bt), matmul(odd, odd_b),
                           matmul(sliced, odd_b), matmul(cast<f32>(a), cast<f32>(b)));
  std::vector<codegen::GpuVariant> mm = p.matmuls();
  REQUIRE(mm.size() == 7);
  auto ops = [](const codegen::GpuVariant& v) { return std::pair{v.gemm_ops.a_k_major, v.gemm_ops.b_k_major}; };
  CHECK(ops(mm[0]) == std::pair{true, false});
  CHECK(ops(mm[1]) == std::pair{false, false});
  CHECK(ops(mm[2]) == std::pair{true, true});
  CHECK(ops(mm[3]) == std::pair{false, true});
  for (int i = 0; i < 4; ++i) CHECK(mm[size_t(i)].gemm.kind == GemmKind::mma);
  CHECK(mm[4].gemm.kind == GemmKind::simt);  // rows of 39 bf16: not 16-byte aligned
  CHECK(mm[5].gemm.kind == GemmKind::mma);   // K = 39 of rows of 48: aligned rows, the copies zero-fill past K
  CHECK(mm[6].gemm.kind == GemmKind::simt);  // f32: SIMT (PyTorch's default fp32 matmul is not TF32)
  CHECK(p.src.find("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") != std::string::npos);
  CHECK(p.src.find("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16") != std::string::npos);
  GpuProgram older = cuda_program(75, matmul(a, b));
  CHECK(older.src.find("mma.sync") == std::string::npos);
}

TEST_CASE("a split epilogue where it computes two transcendentals (W4's gelu and gelu'), or reads a matrix and computes one, else the consumers' epilogue") {
  auto e = [](int64_t r, int64_t c) { return Tensor<bf16, 2>::empty(Shape<2>{r, c}, cpu()); };
  auto x = e(2048, 1024), w = e(1024, 4096), pre = e(2048, 4096);  // 16 x 16 tiles of 128 x 256
  auto b = Tensor<bf16, 1>::empty(Shape<1>{4096}, cpu());
  auto config = [](const GpuProgram& p) {
    REQUIRE(p.matmuls().size() == 1);
    return p.matmuls()[0].gemm;
  };
  GemmConfig split = config(cuda_program(90, matmul(x, w) * kiln::exp(pre)));
  CAPTURE(split.str());
  CHECK((split.kind == GemmKind::wgmma && split.persistent && split.split_epilogue));
  // One transcendental and no matrix read, a matrix read and no transcendental, no epilogue.
  for (const GemmConfig& c : {config(cuda_program(90, kiln::gelu(matmul(x, w) + b))), config(cuda_program(90, matmul(x, w) + pre)),
                              config(cuda_program(90, matmul(x, w) * kiln::exp(b))), config(cuda_program(90, matmul(x, w)))}) {
    CAPTURE(c.str());
    CHECK((c.kind == GemmKind::wgmma && c.persistent && !c.split_epilogue));
  }
  // W4's forward GEMM, gelu(u) and gelu'(u) from u = x @ w + b (erf and exp): one kernel with
  // two stores, in the split-epilogue config, which compiles (the gpu suite checks its values).
  GpuProgram both = cuda_program(90, kiln::gelu(matmul(x, w) + b), gelu_grad(matmul(x, w) + b));  // the same matmul, traced once
  CHECK(config(both).split_epilogue);
  if (jit::nvrtc_available())
    CHECK(jit::cubin_sm(jit::nvrtc_compile(both.src, "kiln_gemm_split_two_stores", 9, 0, codegen::gpu_compile_options(both.vars))) == 90);
}

TEST_SUITE("nvrtc") {

TEST_CASE("every GEMM candidate config compiles for sm_80 and sm_90 (all four operand layouts, both mma dtypes, TF32)") {
  if (!jit::nvrtc_available()) {
    MESSAGE("NVRTC not found: skipped");
    return;
  }
  // Two kernels cover every ldmatrix form: (A K-major, B N-major) bf16 and (A M-major, B K-major) f16.
  auto a = det<bf16, 2>({64, 32}, 1), b = det<bf16, 2>({32, 64}, 2);
  auto ht = det<f16, 2>({32, 64}, 3).transpose(0, 1), hbt = det<f16, 2>({64, 32}, 4).transpose(0, 1);
  auto f = det<f32, 2>({33, 17}, 7), fb = det<f32, 2>({17, 9}, 8);
  auto d = det<f64, 2>({33, 17}, 9), db = det<f64, 2>({9, 17}, 10).transpose(0, 1);
  auto i = det<i32, 2>({33, 17}, 11), ib = det<i32, 2>({17, 9}, 12);
  auto ta = det<f32, 2>({64, 32}, 13), tb = det<f32, 2>({32, 64}, 14);
  auto tat = det<f32, 2>({32, 64}, 15).transpose(0, 1), tbt = det<f32, 2>({64, 32}, 16).transpose(0, 1);
  struct Job {
    int arch;
    GemmConfig config;
    std::string src;
    std::vector<std::string> options;  // sm_90a for wgmma
  };
  std::vector<Job> jobs;
  for (int arch : {80, 90}) {
    for (const GemmConfig& c : codegen::gemm_candidates(DType::bf16, arch)) {
      GemmHook force(c);
      GpuProgram p = cuda_program(arch, matmul(a, b), matmul(ht, hbt));
      CAPTURE(c.str());
      for (const auto& v : p.matmuls()) CHECK(v.gemm == c);
      jobs.push_back({arch, c, p.src, codegen::gpu_compile_options(p.vars)});
    }
    for (const GemmConfig& c : codegen::gemm_candidates(DType::f32, arch)) {  // SIMT: every dtype it serves
      GemmHook force(c);
      jobs.push_back({arch, c, cuda_program(arch, matmul(f, fb), matmul(d, db), matmul(i, ib)).src, {}});
    }
    // 16-bit wgmma in K steps of 32 (not candidates yet), alone and in clusters: K-major
    // operands' rows of 64 bytes in the 64-byte swizzle, M/N-major boxes of 32 rows.
    for (GemmConfig c : codegen::gemm_k32_configs())
      for (int cl : {1, 2}) {
        if (arch != 90) break;
        c.cluster = cl;
        GemmHook force(c);
        GpuProgram p = cuda_program(arch, matmul(a, b), matmul(ht, hbt));
        CAPTURE(c.str());
        for (const auto& v : p.matmuls()) CHECK(v.gemm == c);
        CHECK(p.src.find(", 16, 512, true)") != std::string::npos);  // a K-major operand's descriptor
        CHECK(p.src.find("kiln_wgmma_desc(sB, BOX, 1024)") != std::string::npos);  // N-major B
        jobs.push_back({arch, c, p.src, codegen::gpu_compile_options(p.vars)});
      }
    // TF32: (A K-major, B N-major) and (A M-major, B K-major) cover every fragment load of
    // mma.sync, and wgmma's staging of B and of A (a copy made K-major: GpuVariant::stage).
    AllowTf32 tf32;
    for (const GemmConfig& c : codegen::gemm_candidates(DType::f32, arch, true)) {
      GemmHook force(c);
      GpuProgram p = cuda_program(arch, matmul(ta, tb), matmul(tat, tbt));
      CAPTURE(c.str());
      for (const auto& v : p.matmuls()) CHECK(v.gemm == c);
      if (c.kind == GemmKind::wgmma) {
        CHECK(p.src.find("k8.f32.tf32.tf32") != std::string::npos);
        CHECK(p.matmuls()[0].stage == 2);  // B N-major
        CHECK(p.matmuls()[1].stage == 1);  // A M-major
        CHECK(p.src.find("kiln_k0_stage(") != std::string::npos);
        CHECK(p.src.find("kiln_k1_stage(") != std::string::npos);
      } else {
        CHECK(p.src.find("kiln_mma_tf32(") != std::string::npos);
      }
      jobs.push_back({arch, c, p.src, codegen::gpu_compile_options(p.vars)});
    }
  }
  // NOTE: one program per config and architecture, two compiles at a time (CI has two cores).
  std::vector<int> sm(jobs.size(), -1);
  std::vector<std::string> errors(jobs.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t q; (q = next++) < jobs.size();) {
      try {
        sm[q] = jit::cubin_sm(
            jit::nvrtc_compile(jobs[q].src, "kiln_gemm", jobs[q].arch / 10, jobs[q].arch % 10, jobs[q].options));
      } catch (const std::exception& e) {
        errors[q] = e.what();
      }
    }
  };
  std::thread helper(worker);
  worker();
  helper.join();
  for (size_t q = 0; q < jobs.size(); ++q) {
    CAPTURE(jobs[q].config.str());
    CAPTURE(errors[q]);
    CHECK(sm[q] == jobs[q].arch);
  }
}

TEST_CASE("gelu(x @ W1 + b1) is one tensor-core kernel on sm_80 and sm_90, and it compiles") {
  if (!jit::nvrtc_available()) {
    MESSAGE("NVRTC not found: skipped");
    return;
  }
  auto x = det<bf16, 2>({64, 32}, 1), w = det<bf16, 2>({48, 32}, 2).transpose(0, 1);
  auto b = det<bf16, 1>({48}, 3);
  for (int arch : {80, 90}) {
    CAPTURE(arch);
    GpuProgram p = cuda_program(arch, kiln::gelu(matmul(x, w) + b));
    REQUIRE(p.kinds.size() == 1);
    CHECK(p.kinds[0] == sched::KernelKind::matmul);
    CHECK(p.vars[0].gemm.kind == GemmKind::mma);
    CHECK(p.src.find("kiln_erf(") != std::string::npos);  // gelu evaluated at store time
    CHECK(jit::cubin_sm(jit::nvrtc_compile(p.src, "kiln_gemm_epilogue", arch / 10, arch % 10)) == arch);
  }
  // The same epilogue in the Hopper kernel (sm_90a).
  GemmHook force(codegen::gemm_candidates(DType::bf16, 90).front());
  GpuProgram p = cuda_program(90, kiln::gelu(matmul(x, w) + b));
  REQUIRE(p.vars.size() == 1);
  CHECK(p.vars[0].gemm.kind == GemmKind::wgmma);
  CHECK(p.src.find("kiln_erf(") != std::string::npos);
  CHECK(p.src.find("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16") != std::string::npos);
  CHECK(jit::cubin_sm(jit::nvrtc_compile(p.src, "kiln_gemm_epilogue", 9, 0, codegen::gpu_compile_options(p.vars))) == 90);
}

TEST_CASE("the Hopper kernel's epilogue: 4 columns per access where every slot is contiguous and aligned, else per element") {
  if (!jit::nvrtc_available()) {
    MESSAGE("NVRTC not found: skipped");
    return;
  }
  auto x = det<bf16, 2>({64, 32}, 1), w1 = det<bf16, 2>({32, 48}, 2), w2 = det<bf16, 2>({32, 48}, 3), w3 = det<bf16, 2>({32, 48}, 4);
  auto b = det<bf16, 1>({48}, 5);
  auto s = det<bf16, 2>({64, 1}, 6), r = det<bf16, 2>({64, 48}, 7);
  auto rt = det<bf16, 2>({48, 64}, 8).transpose(0, 1);
  auto shifted = det<bf16, 2>({64, 52}, 9).slice(1, 1, 49);  // rows of 52 (aligned), starting one element in
  GemmHook force(codegen::gemm_candidates(DType::bf16, 90).front());
  GpuProgram p = cuda_program(90, kiln::gelu(matmul(x, w1) + b) * s + r, matmul(x, w2) + rt, matmul(x, w3) * shifted);
  std::vector<codegen::GpuVariant> mm = p.matmuls();
  REQUIRE(mm.size() == 3);
  for (const auto& v : mm) CHECK(v.gemm.kind == GemmKind::wgmma);
  CHECK(mm[0].epilogue_vec);   // bias (rows broadcast), per-row scale (columns broadcast), residual
  CHECK(!mm[1].epilogue_vec);  // a transposed residual: per element
  CHECK(!mm[2].epilogue_vec);  // a residual 2 bytes off an 8-byte boundary: per element
  CHECK(std::count(mm[0].strides.begin(), mm[0].strides.end(), codegen::Stride::zero) == 1);  // s
  CHECK(p.src.find("kiln_bar_sync(1 + c, 128)") != std::string::npos);
  CHECK(p.src.find("kiln_vec_load<uint16_t, 4>(") != std::string::npos);
  CHECK(jit::cubin_sm(jit::nvrtc_compile(p.src, "kiln_gemm_epilogue", 9, 0, codegen::gpu_compile_options(p.vars))) == 90);
}

TEST_CASE("the persistent Hopper kernel: a block per SM walks the tiles; it compiles with the staged epilogue") {
  if (!jit::nvrtc_available()) {
    MESSAGE("NVRTC not found: skipped");
    return;
  }
  auto e = [](int64_t r, int64_t c) { return Tensor<bf16, 2>::empty(Shape<2>{r, c}, cpu()); };
  auto b = Tensor<bf16, 1>::empty(Shape<1>{4096}, cpu());
  std::vector<GemmConfig> persistent;
  for (const GemmConfig& c : codegen::gemm_candidates(DType::bf16, 90))
    if (c.persistent) persistent.push_back(c);
  REQUIRE(persistent.size() == 4);  // two with a split epilogue
  for (GemmConfig c : std::vector(persistent)) {  // each also with a split tail, and in clusters of two blocks (B's
    CHECK(!c.split_tail);                         // tile in two shares of whole 64-column boxes), also split; each
    CHECK(!c.dynamic);                            // also taking its tiles from the grid's counter, alone and in clusters
    CHECK(!c.serpentine);
    CHECK(c.cluster == 1);
    c.split_tail = true;
    persistent.push_back(c);
    c.split_tail = false, c.dynamic = true;
    persistent.push_back(c);
    c.dynamic = false, c.cluster = 2;
    if (splits_in_two(c)) persistent.push_back(c), c.split_tail = true, persistent.push_back(c);
    c.split_tail = false, c.dynamic = true;
    if (splits_in_two(c)) persistent.push_back(c);
    c.serpentine = true;  // serpentine walks: with dynamic tiles in clusters, and plain alone and in clusters
    if (splits_in_two(c)) persistent.push_back(c);
    c.dynamic = false;
    if (splits_in_two(c)) persistent.push_back(c);
    c.cluster = 1;
    persistent.push_back(c);
  }
  for (const GemmConfig& c : persistent) {
    CAPTURE(c.str());
    const std::string suffix = std::string(c.split_epilogue ? "_pe" : "_p") + (c.split_tail ? "t" : "") + (c.dynamic ? "d" : "") +
                               (c.serpentine ? "z" : "") + (c.cluster > 1 ? "_c2" : "");
    CHECK(c.str().substr(c.str().find("_p")) == suffix);
    CHECK(c.group == 8);
    GemmHook force(c);
    // 2048 x 4096: 16 x 16 tiles of 128 x 256 (16 x 32 of 128 x 128) on 132 SMs; 64 x 48: one tile
    GpuProgram p = cuda_program(90, kiln::gelu(matmul(e(2048, 1024), e(1024, 4096)) + b), matmul(e(64, 32), e(32, 48)));
    std::vector<codegen::GpuVariant> mm = p.matmuls();
    REQUIRE(mm.size() == 2);
    std::vector<unsigned> blocks;
    for (size_t k = 0; k < p.kinds.size(); ++k)
      if (p.kinds[k] == sched::KernelKind::matmul) blocks.push_back(p.launches[k].grid.x);
    std::sort(blocks.begin(), blocks.end());
    // Clusters: whole clusters of two, each on two tiles one above the other (one tile: one cluster).
    CHECK(blocks == std::vector<unsigned>{c.cluster > 1 ? 2u : 1u, 132u});
    for (const auto& v : mm) CHECK(v.gemm == c);
    // In clusters: B's shares multicast into both blocks, stages given back to both.
    CHECK((p.src.find("__cluster_dims__(2, 1, 1)") != std::string::npos) == (c.cluster > 1));
    CHECK((p.src.find("kiln_tma_load_3d_multicast(b") != std::string::npos) == (c.cluster > 1));
    CHECK((p.src.find("lane < CL) kiln_mbar_arrive_cluster(") != std::string::npos) == (c.cluster > 1));  // lane r to block r
    CHECK((p.src.find(c.dynamic ? "(int64_t)kiln_j * (gridDim.x / CL)" : "tile += gridDim.x / CL") != std::string::npos) == (c.cluster > 1));
    // Dynamic tiles: the producer (a cluster's rank 0) fetches each tile from the kernel's counter and
    // passes it on through the ring; the other warps (and blocks) read it there; the last block zeroes the counter.
    CHECK((p.src.find("static unsigned kiln_next[2];") != std::string::npos) == c.dynamic);
    CHECK((p.src.find(c.cluster > 1 ? "(kiln_crank == 0 ? kiln_tile_fetch(kiln_next, tq, kiln_j, 2) : kiln_tile_read(tq, kiln_j, CL, false))"
                                    : "kiln_dyn ? (int64_t)kiln_tile_fetch(kiln_next, tq, kiln_j, 1) :") != std::string::npos) == c.dynamic);
    CHECK((p.src.find("kiln_tile_read(tq, kiln_j, " + std::to_string(c.cluster) + ", true)") != std::string::npos) == c.dynamic);
    CHECK((p.src.find("kiln_tiles_done(kiln_next, ") != std::string::npos) == c.dynamic);
    // Serpentine: the producer loads the block's odd tiles' K steps from the last; odd raster groups
    // take their columns from the right (every warp places its tiles so).
    CHECK((p.src.find("k0 = (kiln_rev ? KT - 1 - kt : kt) * BK") != std::string::npos) == c.serpentine);
    CHECK((p.src.find(std::string("kiln_rev = (tile / (") + (c.cluster > 1 ? "gridDim.x / CL" : "gridDim.x") + ")) % 2 != 0") !=
           std::string::npos) == c.serpentine);
    CHECK((p.src.find("% 2 ? gn - 1 - col : col) * BN") != std::string::npos) == c.serpentine);
    CHECK((mm[0].epilogue_vec || mm[1].epilogue_vec));
    // A split tail: units from KilnWalk (a cluster's, in clusters; the consumers' whole tiles
    // in a loop of their own, then the pieces), sums handed over through the workspace (the
    // argument struct's last words; slots and counts per block of a cluster); else the plain
    // round of whole tiles.
    CHECK((p.src.find("walk.step(tile, kb, ke)") != std::string::npos) == c.split_tail);
    CHECK((p.src.find(c.cluster > 1 ? "KilnWalk walk(kiln_tiles, KT, gridDim.x / CL, blockIdx.x / CL, gridDim.z, true, 0)"
                                    : "KilnWalk walk(kiln_tiles, KT, gridDim.x, blockIdx.x, gridDim.z, true, 0)") != std::string::npos) ==
          c.split_tail);
    const std::string rank = c.cluster > 1 ? " * CL + kiln_crank" : "";
    CHECK((p.src.find("tile < whole; tile += gridDim.x") != std::string::npos) == c.split_tail);
    CHECK((p.src.find("unit < walk.units(); unit += gridDim.x") != std::string::npos) == c.split_tail);
    CHECK((p.src.find("kiln_split_give(d, sk_ws + (unit" + rank + ")") != std::string::npos) == c.split_tail);
    CHECK((p.src.find("kiln_split_take(d, sk_ws + (place" + rank + ")") != std::string::npos) == c.split_tail);
    CHECK((p.src.find("tile < kiln_tiles; tile += gridDim.x") != std::string::npos) == (!c.split_tail && !c.dynamic));
    CHECK((p.src.find("kiln_u64 ws[2]") != std::string::npos) == c.split_tail);
    for (const auto& v : mm) CHECK(v.workspace() == c.split_tail);
    CHECK((p.src.find("kiln_mbar_wait(stg_full") != std::string::npos) == c.split_epilogue);
    CHECK(jit::cubin_sm(jit::nvrtc_compile(p.src, "kiln_gemm_persistent", 9, 0, codegen::gpu_compile_options(p.vars))) == 90);
    // The GPU test's operands (M, N, K multiples of 8; x and w also transposed) take the forced config.
    auto b2 = Tensor<bf16, 1>::empty(Shape<1>{3896}, cpu());
    GpuProgram q = cuda_program(90, kiln::gelu(matmul(e(1096, 136), e(136, 3896)) + b2),
                                matmul(e(136, 1096).transpose(0, 1), e(3896, 136).transpose(0, 1)) + e(1096, 3896));
    REQUIRE(q.matmuls().size() == 2);
    for (const auto& v : q.matmuls()) CHECK(v.gemm == c);
  }
  // Another raster group height: its own program (the variant's key), named in the config.
  GemmConfig g16 = persistent.front();
  g16.group = 16;
  CHECK(g16.str() == persistent.front().str() + "_g16");
  GemmHook force(g16);
  GpuProgram p = cuda_program(90, matmul(e(2048, 1024), e(1024, 4096)));
  REQUIRE(p.matmuls().size() == 1);
  CHECK(p.matmuls()[0].gemm.group == 16);
  CHECK(p.src.find("pid / (16 * gn) * 16") != std::string::npos);
  std::vector<codegen::GpuVariant> v8 = p.vars;
  for (auto& v : v8) v.gemm.group = 8;
  CHECK(runtime::variant_key(p.vars) != runtime::variant_key(v8));
  // A split tail: its own program too.
  std::vector<codegen::GpuVariant> sk = p.vars;
  for (auto& v : sk) v.gemm.split_tail = true;
  CHECK(runtime::variant_key(p.vars) != runtime::variant_key(sk));
  // In a given count of pieces (GemmConfig::tail_parts, a bench's knob): its own program, named so.
  std::vector<codegen::GpuVariant> sk5 = sk;
  for (auto& v : sk5) v.gemm.tail_parts = 5;
  CHECK(runtime::variant_key(sk) != runtime::variant_key(sk5));
  GemmConfig t5 = persistent.front();
  t5.split_tail = true, t5.tail_parts = 5;
  CHECK(t5.str() == persistent.front().str() + "t5");
  // Clusters: their own program; also with a split tail; not for a tile whose columns do not
  // split into 64-column shares, not for a block that is not persistent.
  std::vector<codegen::GpuVariant> cl = p.vars;
  for (auto& v : cl) v.gemm.cluster = 2;
  CHECK(runtime::variant_key(p.vars) != runtime::variant_key(cl));
  REQUIRE(!force.seen.empty());
  const GemmProblem prob = force.seen.front();  // the 2048 x 1024 x 4096 matmul, on sm_90
  GemmConfig c2 = persistent.front();
  c2.cluster = 2;
  CHECK(codegen::gemm_fits(c2, prob));
  c2.split_tail = true;
  CHECK(codegen::gemm_fits(c2, prob));
  c2.split_tail = false, c2.persistent = false;
  CHECK(!codegen::gemm_fits(c2, prob));
  c2.persistent = true, c2.bn = 192;
  CHECK(!codegen::gemm_fits(c2, prob));
  // A flag of the persistent walk (dynamic tiles, serpentine): its own program, named by `letter`;
  // persistent only, never with a split tail.
  auto walk_flag = [&](bool GemmConfig::*flag, const std::string& letter) {
    std::vector<codegen::GpuVariant> with = p.vars;
    for (auto& v : with) v.gemm.*flag = true;
    CHECK(runtime::variant_key(p.vars) != runtime::variant_key(with));
    GemmConfig f = persistent.front();
    f.*flag = true;
    CHECK(f.str() == persistent.front().str() + letter);
    CHECK(codegen::gemm_fits(f, prob));
    f.split_tail = true;
    CHECK(!codegen::gemm_fits(f, prob));
    f.split_tail = false, f.persistent = false;
    CHECK(!codegen::gemm_fits(f, prob));
  };
  // Dynamic tiles: the heuristic's and the tuner's configs take them where
  // kiln::gemm_dynamic_tiles() asks.
  walk_flag(&GemmConfig::dynamic, "d");
  CHECK(!codegen::gemm_heuristic(prob).dynamic);
  GemmProblem asked = prob;
  asked.dynamic_tiles = true;
  CHECK(codegen::gemm_heuristic(asked) == codegen::gemm_dynamic(codegen::gemm_heuristic(prob), asked));
  CHECK(codegen::gemm_heuristic(asked).dynamic);
  for (const GemmConfig& t : codegen::gemm_tuning_candidates(asked)) CHECK(t.dynamic == (t.persistent && !t.split_tail));
  asked.split_tail = true;  // a split tail where one pays, whole tiles from the counter beside it
  for (const GemmConfig& t : codegen::gemm_tuning_candidates(asked)) CHECK(t.dynamic == (t.persistent && !t.split_tail));
  // A switch set `on` for one 2048 x 1024 x 4096 matmul (then back): the problem the runtime saw, and its program.
  auto switched = [&](void (*set)(bool), bool on) {
    set(on);
    GemmHook seen(std::nullopt);
    GpuProgram q = cuda_program(90, matmul(e(2048, 1024), e(1024, 4096)));
    set(!on);
    REQUIRE(seen.seen.size() == 1);
    return std::pair{seen.seen[0], q};
  };
  {  // the switch: the problem the runtime sees
    auto [seen, q] = switched(set_gemm_dynamic_tiles, true);
    CHECK(seen.dynamic_tiles);
    CHECK(q.matmuls()[0].gemm.dynamic);
    CHECK(jit::cubin_sm(jit::nvrtc_compile(q.src, "kiln_gemm_dynamic", 9, 0, codegen::gpu_compile_options(q.vars))) == 90);
  }
  // Serpentine walks: taken where kiln::gemm_serpentine() asks (by default: the runtime's problem
  // asks), with dynamic tiles too.
  walk_flag(&GemmConfig::serpentine, "z");
  CHECK(prob.serpentine);
  GemmProblem straight = prob;
  straight.serpentine = false;
  CHECK(!codegen::gemm_heuristic(straight).serpentine);
  CHECK(codegen::gemm_heuristic(prob) == codegen::gemm_serpentine(codegen::gemm_heuristic(straight), prob));
  CHECK(codegen::gemm_heuristic(prob).serpentine);
  GemmProblem serp = prob;
  serp.dynamic_tiles = true;
  CHECK(codegen::gemm_heuristic(serp).serpentine);
  CHECK(codegen::gemm_heuristic(serp).dynamic);
  serp.split_tail = true;
  for (const GemmConfig& t : codegen::gemm_tuning_candidates(serp)) CHECK(t.serpentine == (t.persistent && !t.split_tail));
  for (const GemmConfig& t : codegen::gemm_tuning_candidates(straight)) CHECK(!t.serpentine);
  {  // the switch off: the problem the runtime sees, and its program
    auto [seen, q] = switched(set_gemm_serpentine, false);
    CHECK(!seen.serpentine);
    CHECK(!q.matmuls()[0].gemm.serpentine);
    CHECK(q.src.find("kiln_rev") == std::string::npos);
  }
  {  // Raster groups side by side (GemmConfig::group_across): named, its own program, and in
     // clusters with serpentine walks each block's rows from its group's row (odd groups from the bottom).
    GemmConfig wide = persistent.front();
    wide.group_across = true, wide.cluster = 2, wide.serpentine = true;
    CHECK(wide.str() == persistent.front().str() + "z_g8w_c2");
    CHECK(codegen::gemm_fits(wide, prob));
    GemmHook forced(wide);
    GpuProgram q = cuda_program(90, matmul(e(2048, 1024), e(1024, 4096)));
    REQUIRE(q.matmuls().size() == 1);
    CHECK(q.matmuls()[0].gemm == wide);
    CHECK(q.src.find("pid / (8 * gm) * 8, cols = gn - first < 8 ? gn - first : 8") != std::string::npos);
    CHECK(q.src.find("m0 = ((pid / (8 * gm)) % 2 ? gm - 1 - row : row) * (BM * 2) + kiln_crank * BM") != std::string::npos);
    std::vector<codegen::GpuVariant> tall = q.vars;
    for (auto& v : tall) v.gemm.group_across = false;
    CHECK(runtime::variant_key(q.vars) != runtime::variant_key(tall));
    CHECK(jit::cubin_sm(jit::nvrtc_compile(q.src, "kiln_gemm_across", 9, 0, codegen::gpu_compile_options(q.vars))) == 90);
    // The other walks place their tiles so too: a split tail's whole tiles and pieces (in
    // clusters), dynamic tiles.
    GemmConfig split = persistent.front(), dyn = persistent.front();
    split.group_across = true, split.cluster = 2, split.split_tail = true;
    dyn.group_across = true, dyn.dynamic = true;
    for (const GemmConfig& c : {split, dyn}) {
      CAPTURE(c.str());
      GemmHook other(c);
      GpuProgram r = cuda_program(90, matmul(e(2048, 1024), e(1024, 4096)));
      REQUIRE(r.matmuls().size() == 1);
      CHECK(r.matmuls()[0].gemm == c);
      CHECK(r.src.find("cols = gn - first < 8 ? gn - first : 8") != std::string::npos);
      CHECK(r.src.find("pid / (8 * gn) * 8") == std::string::npos);  // no walk left tall
      CHECK(jit::cubin_sm(jit::nvrtc_compile(r.src, "kiln_gemm_across", 9, 0, codegen::gpu_compile_options(r.vars))) == 90);
    }
  }
  {  // kiln::gemm_group_across() (off by default): the problem the runtime sees, and the
     // heuristic's and the tuner's persistent configs
    CHECK(!prob.group_across);
    CHECK(!codegen::gemm_heuristic(prob).group_across);
    auto [seen, q] = switched(set_gemm_group_across, true);
    CHECK(seen.group_across);
    CHECK(q.matmuls()[0].gemm.group_across);
    CHECK(q.matmuls()[0].gemm.persistent);
    for (const GemmConfig& t : codegen::gemm_tuning_candidates(seen)) CHECK(t.group_across == t.persistent);
  }
}

// Whether the program's rows kernel is skipped (its sums computed by a GEMM).
bool rows_skipped(const GpuProgram& p) {
  for (size_t k = 0; k < p.kinds.size(); ++k)
    if (p.kinds[k] == sched::KernelKind::rows) return p.vars[k].skip;
  FAIL("no rows kernel");
  return false;
}
// Every bf16 wgmma candidate, and each persistent one whose tile splits into 64-column shares
// also in clusters of two, with a split tail and both, and in clusters taking its tiles from the grid's counter
// (dynamic); the configs in K steps of 32, alone and in clusters.
std::vector<GemmConfig> wgmma_configs_forced() {
  std::vector<GemmConfig> configs;
  for (const GemmConfig& c : codegen::gemm_candidates(DType::bf16, 90))
    if (c.kind == GemmKind::wgmma) configs.push_back(c);
  for (const GemmConfig& c : std::vector(configs))
    if (c.persistent && splits_in_two(c)) {
      configs.push_back(c), configs.back().cluster = 2;
      configs.push_back(c), configs.back().split_tail = true;
      configs.push_back(configs.back()), configs.back().cluster = 2;
      configs.push_back(c), configs.back().cluster = 2, configs.back().dynamic = true;  // tiles from the grid's counter
      configs.push_back(c), configs.back().cluster = 2, configs.back().serpentine = true;  // serpentine walks
    }
  for (const GemmConfig& c : codegen::gemm_k32_configs()) configs.push_back(c), configs.push_back(c), configs.back().cluster = 2;
  return configs;
}

TEST_CASE("a sum over the rows of a matrix a Hopper GEMM stores (a bias's gradient) is computed by that GEMM; it compiles") {
  if (!jit::nvrtc_available()) {
    MESSAGE("NVRTC not found: skipped");
    return;
  }
  ColumnSumsOn on;
  auto e = [](int64_t r, int64_t c) { return Tensor<bf16, 2>::empty(Shape<2>{r, c}, cpu()); };
  auto x = e(2048, 1024), w = e(1024, 4096);
  auto b = Tensor<bf16, 1>::empty(Shape<1>{4096}, cpu());
  auto dy = kiln::gelu(matmul(x, w) + b);
  {  // the heuristic's wgmma config: the epilogue's output summed, its rows kernel not launched
    GpuProgram p = cuda_program(90, dy, kiln::sum(dy, 0));
    REQUIRE(p.kinds.size() == 2);
    REQUIRE(p.matmuls().size() == 1);
    const codegen::GpuVariant v = p.matmuls()[0];
    CHECK(v.gemm.kind == GemmKind::wgmma);
    CHECK(v.colsum_slot >= 0);
    CHECK(v.colsum_dtype == DType::bf16);
    CHECK(v.workspace());
    CHECK(rows_skipped(p));
    CHECK(p.src.find("KilnColsumCount cs_n;") != std::string::npos);
    CHECK(p.src.find("kiln_u64 cs[1]") != std::string::npos);
    // The tiles' sums from the registers that stored them: the consumers' staged stores of an
    // interior tile, or the split epilogue's every tile; else read back (the consumers' edge tiles).
    if (v.gemm.split_epilogue) {
      CHECK(p.src.find("kiln_colsum_rows<BN>(cs_rows") != std::string::npos);
      CHECK(p.src.find("kiln_colsum_read<") == std::string::npos);
    } else {
      CHECK(p.src.find("kiln_colsum_warp<BN / 8>(kiln_cs, stg + w * BN, lane)") != std::string::npos);
      CHECK(p.src.find("kiln_colsum_read<0, BM, BN>(") != std::string::npos);
    }
  }
  // Each wgmma config forced (the consumers' epilogue, the split one, persistent, in clusters),
  // the matmul's own value summed too; the sums compile for sm_90a. Not a split tail: its
  // workspace is the pieces' hand-over (the rows kernel runs).
  const std::vector<GemmConfig> configs = wgmma_configs_forced();
  for (const GemmConfig& c : configs) {
    CAPTURE(c.str());
    GemmHook force(c);
    auto mm = matmul(x, w);
    GpuProgram p = cuda_program(90, mm, kiln::sum(mm, 0));
    REQUIRE(p.matmuls().size() == 1);
    CHECK(p.matmuls()[0].gemm == c);
    CHECK((p.matmuls()[0].colsum_slot >= 0) == !c.split_tail);
    CHECK(rows_skipped(p) == !c.split_tail);
    CHECK((p.src.find("KilnColsumCount cs_n;") != std::string::npos) == !c.split_tail);
    if (!c.split_tail && !c.split_epilogue) CHECK(p.src.find("kiln_colsum_read<0, BM, BN>(") != std::string::npos);
    if (!c.split_tail) CHECK(jit::cubin_sm(jit::nvrtc_compile(p.src, "kiln_gemm_colsum", 9, 0, codegen::gpu_compile_options(p.vars))) == 90);
  }
  {  // f16 and f32 (TF32) matrices: formats 1 and 2
    auto xh = Tensor<f16, 2>::empty(Shape<2>{2048, 1024}, cpu()), wh = Tensor<f16, 2>::empty(Shape<2>{1024, 4096}, cpu());
    GpuProgram p = cuda_program(90, kiln::sum(matmul(xh, wh), 0));
    CHECK(p.src.find("KilnColsumCount cs_n;") != std::string::npos);
    CHECK(jit::cubin_sm(jit::nvrtc_compile(p.src, "kiln_gemm_colsum", 9, 0, codegen::gpu_compile_options(p.vars))) == 90);
    set_allow_tf32(true);
    auto xf = Tensor<f32, 2>::empty(Shape<2>{2048, 1024}, cpu()), wf = Tensor<f32, 2>::empty(Shape<2>{1024, 4096}, cpu());
    GpuProgram q = cuda_program(90, kiln::sum(matmul(xf, wf), 0));
    set_allow_tf32(false);
    CHECK(q.src.find("KilnColsumCount cs_n;") != std::string::npos);
    CHECK(jit::cubin_sm(jit::nvrtc_compile(q.src, "kiln_gemm_colsum", 9, 0, codegen::gpu_compile_options(q.vars))) == 90);
  }
  {  // a two-layer MLP's backward (W4's step, smaller): db1 and db2 in the GEMMs that store dh and
     // dy, the loss in y's GEMM beside db2 (kiln::gemm_totals, on by default); every kernel compiles
    auto w2 = e(4096, 1024);
    auto b1 = Tensor<bf16, 1>::empty(Shape<1>{4096}, cpu()), b2 = Tensor<bf16, 1>::empty(Shape<1>{1024}, cpu());
    auto h = kiln::gelu(matmul(x, w) + b1);
    auto y = kiln::cast<f32>(matmul(h, w2) + b2);
    auto loss = kiln::mean(y * y);
    auto [gx, gw1, gb1, gw2, gb2] = kiln::grad(loss, x, w, b1, w2, b2);
    GpuProgram p = cuda_program(90, loss, gx, gw1, gb1, gw2, gb2);
    int sums = 0, both = 0, skipped = 0;
    for (const auto& v : p.vars) sums += v.colsum_slot >= 0, both += v.colsum_slot >= 0 && v.total_kernel >= 0, skipped += v.skip;
    CHECK(sums == 2);
    CHECK(both == 1);
    CHECK(skipped == 3);
    CHECK(jit::cubin_sm(jit::nvrtc_compile(p.src, "kiln_mlp_colsum", 9, 0, codegen::gpu_compile_options(p.vars))) == 90);
  }
  // Not where the GEMM is no wgmma (sm_80), for sums along the other dim, for a matrix in a
  // dtype the kernel does not read back (f64), nor with the switch off: the rows kernel runs.
  CHECK(!rows_skipped(cuda_program(80, dy, kiln::sum(dy, 0))));
  CHECK(!rows_skipped(cuda_program(90, dy, kiln::sum(dy, 1))));
  CHECK(!rows_skipped(cuda_program(90, kiln::sum(kiln::cast<f64>(matmul(x, w)), 0))));
  set_gemm_column_sums(false);  // (kiln's default)
  GpuProgram off = cuda_program(90, dy, kiln::sum(dy, 0));
  set_gemm_column_sums(true);
  CHECK(!rows_skipped(off));
  CHECK(off.matmuls()[0].colsum_slot == -1);
}

TEST_CASE("a sum of a function of every element of a matrix a Hopper GEMM stores (a loss) is computed by that GEMM; it compiles") {
  if (!jit::nvrtc_available()) {
    MESSAGE("NVRTC not found: skipped");
    return;
  }
  TotalsOn on;
  auto e = [](int64_t r, int64_t c) { return Tensor<bf16, 2>::empty(Shape<2>{r, c}, cpu()); };
  auto x = e(2048, 1024), w = e(1024, 4096), t = e(2048, 4096);
  auto b = Tensor<bf16, 1>::empty(Shape<1>{4096}, cpu());
  // W4's: y stored (the backward reads it; here an output), the loss read from it, the mean's scale
  // a param. (Where y is stored for the loss alone, the plan adds the bias in the loss's kernel.)
  auto y = matmul(x, w) + b;
  auto yf = kiln::cast<f32>(y);
  auto loss = kiln::mean(yf * yf);
  auto total = [](const GpuProgram& p) { return p.matmuls().at(0).total_kernel; };
  {  // the heuristic's config: the loss's rows kernel not launched, its scale among the GEMM's words
    GpuProgram p = cuda_program(90, y, loss);
    REQUIRE(p.kinds.size() == 2);
    CHECK(p.matmuls()[0].gemm.kind == GemmKind::wgmma);
    CHECK(total(p) == 1);
    CHECK(p.matmuls()[0].total_words == 1);
    CHECK(rows_skipped(p));
    CHECK(p.src.find("kiln_total += ") != std::string::npos);
    CHECK(p.src.find("kiln_total_last(kiln_total, args.tw, ") != std::string::npos);
    CHECK(p.src.find("kiln_u64 tt[2]") != std::string::npos);
    CHECK(jit::cubin_sm(jit::nvrtc_compile(p.src, "kiln_gemm_total", 9, 0, codegen::gpu_compile_options(p.vars))) == 90);
  }
  // A function with constants of its own (params the GEMM reads from the rows kernel's words), in
  // each kind of wgmma config forced: a tile a block, persistent, the split epilogue, clusters, a
  // split tail; not dynamic tiles (a warp's elements would differ from run to run, so the sum).
  auto f = kiln::sum(yf * yf * 0.5f + yf);
  std::vector<GemmConfig> configs;
  for (const GemmConfig& c : wgmma_configs_forced())
    if (c.bk == 64 && (c.bn == 256 || c.split_epilogue || !c.persistent)) configs.push_back(c);
  REQUIRE(configs.size() >= 6);
  for (const GemmConfig& c : configs) {
    CAPTURE(c.str());
    GemmHook force(c);
    GpuProgram p = cuda_program(90, y, f);
    REQUIRE(p.matmuls().size() == 1);
    CHECK(p.matmuls()[0].gemm == c);
    const bool fixed = !(c.persistent && c.dynamic);
    CHECK((total(p) >= 0) == fixed);
    CHECK(rows_skipped(p) == fixed);
    if (fixed) {
      CHECK(p.matmuls()[0].total_words == 1);  // 0.5 (the sum itself is the output)
      CHECK(p.src.find("kiln_bits_to_f64(TA[0])") != std::string::npos);
      CHECK(jit::cubin_sm(jit::nvrtc_compile(p.src, "kiln_gemm_total", 9, 0, codegen::gpu_compile_options(p.vars))) == 90);
    }
  }
  // Not where the GEMM is no wgmma (sm_80), for a sum along one dim, for a function that reads a
  // second tensor, for a sum in f64, nor with the switch off: the rows kernel runs.
  CHECK(!rows_skipped(cuda_program(80, y, loss)));
  CHECK(!rows_skipped(cuda_program(90, y, kiln::sum(yf * yf, 1))));
  CHECK(!rows_skipped(cuda_program(90, y, kiln::sum((yf - kiln::cast<f32>(t)) * yf))));
  CHECK(!rows_skipped(cuda_program(90, y, kiln::sum(kiln::cast<f64>(yf)))));
  set_gemm_totals(false);  // KILN_GEMM_TOTALS=0
  GpuProgram off = cuda_program(90, y, loss);
  set_gemm_totals(true);
  CHECK(!rows_skipped(off));
  CHECK(total(off) == -1);
}

TEST_CASE("a sum over the rows of a Hopper GEMM's B operand (a bias's gradient beside its weight's) is computed by that GEMM; it compiles") {
  if (!jit::nvrtc_available()) {
    MESSAGE("NVRTC not found: skipped");
    return;
  }
  auto e = [](int64_t r, int64_t c) { return Tensor<bf16, 2>::empty(Shape<2>{r, c}, cpu()); };
  OperandSumsOn on;
  auto x = e(2048, 1024), dy = e(2048, 4096);
  {  // the heuristic's config: dW = x.t() @ dy sums dy's columns, db's rows kernel not launched
    GpuProgram p = cuda_program(90, matmul(x.transpose(0, 1), dy), kiln::sum(dy, 0));
    REQUIRE(p.kinds.size() == 2);
    REQUIRE(p.matmuls().size() == 1);
    const codegen::GpuVariant v = p.matmuls()[0];
    CHECK(v.gemm.kind == GemmKind::wgmma);
    CHECK(v.colsum_slot == 1);
    CHECK(v.colsum_of_b);
    CHECK(v.colsum_dtype == DType::bf16);
    CHECK(!v.workspace());  // the sums need none: the first tile row's blocks hold whole columns
    CHECK(rows_skipped(p));
    CHECK(p.src.find("kiln_colsum_add<0>(b + r * 128") != std::string::npos);
    CHECK(p.src.find("KilnColsumCount cs_n;") == std::string::npos);
    // The sum first in the plan: the same.
    GpuProgram q = cuda_program(90, kiln::sum(dy, 0), matmul(x.transpose(0, 1), dy));
    CHECK(rows_skipped(q));
    CHECK(q.matmuls()[0].colsum_of_b);
  }
  {  // a linear layer's backward (weight [out, in], x @ weight.t()): x.t() @ dy sums dy too
    auto w = e(4096, 1024);
    auto b = Tensor<bf16, 1>::empty(Shape<1>{4096}, cpu());
    auto y = kiln::cast<f32>(kiln::linear(x, w, b));
    auto loss = kiln::mean(y * y);
    auto [gx, gw, gb] = kiln::grad(loss, x, w, b);
    GpuProgram p = cuda_program(90, loss, gx, gw, gb);
    int of_b = 0, skipped = 0, totals = 0;
    for (const auto& v : p.vars) of_b += v.colsum_of_b, skipped += v.skip, totals += v.total_kernel >= 0;
    CHECK(of_b == 1);
    CHECK(totals == 1);  // the loss in y's GEMM (kiln::gemm_totals, on by default)
    CHECK(skipped == 2);  // db's rows kernel and the loss's
  }
  // Each wgmma config forced: a tile a block, persistent, in clusters of two; not the split
  // epilogue (its warps are the epilogue's), not a split tail (a tile's K in several blocks).
  const std::vector<GemmConfig> configs = wgmma_configs_forced();
  for (const GemmConfig& c : configs) {
    CAPTURE(c.str());
    GemmHook force(c);
    GpuProgram p = cuda_program(90, matmul(x.transpose(0, 1), dy), kiln::sum(dy, 0));
    REQUIRE(p.matmuls().size() == 1);
    CHECK(p.matmuls()[0].gemm == c);
    const bool sums = !c.split_epilogue && !c.split_tail && c.bk == 64;  // B's stages in 128-byte rows
    CHECK(p.matmuls()[0].colsum_of_b == sums);
    CHECK(rows_skipped(p) == sums);
    if (sums) CHECK(jit::cubin_sm(jit::nvrtc_compile(p.src, "kiln_gemm_bsum", 9, 0, codegen::gpu_compile_options(p.vars))) == 90);
  }
  {  // f16: format 1
    auto xh = Tensor<f16, 2>::empty(Shape<2>{2048, 1024}, cpu()), dyh = Tensor<f16, 2>::empty(Shape<2>{2048, 4096}, cpu());
    GpuProgram p = cuda_program(90, matmul(xh.transpose(0, 1), dyh), kiln::sum(dyh, 0));
    CHECK(rows_skipped(p));
    CHECK(p.src.find("kiln_colsum_add<1>(b + r * 128") != std::string::npos);
    CHECK(jit::cubin_sm(jit::nvrtc_compile(p.src, "kiln_gemm_bsum", 9, 0, codegen::gpu_compile_options(p.vars))) == 90);
  }
  // Not for B read K-major (a transposed dy), nor for sums along the other dim, nor in TF32
  // (B staged K-major), nor on sm_80 (no wgmma), nor with the switch off: the rows kernel runs.
  auto dyt = e(4096, 2048).transpose(0, 1);
  CHECK(!rows_skipped(cuda_program(90, matmul(x.transpose(0, 1), dyt), kiln::sum(dyt, 0))));
  CHECK(!rows_skipped(cuda_program(90, matmul(x.transpose(0, 1), dy), kiln::sum(dy, 1))));
  CHECK(!rows_skipped(cuda_program(80, matmul(x.transpose(0, 1), dy), kiln::sum(dy, 0))));
  {
    auto xf = Tensor<f32, 2>::empty(Shape<2>{2048, 1024}, cpu()), dyf = Tensor<f32, 2>::empty(Shape<2>{2048, 4096}, cpu());
    set_allow_tf32(true);
    GpuProgram q = cuda_program(90, matmul(xf.transpose(0, 1), dyf), kiln::sum(dyf, 0));
    set_allow_tf32(false);
    CHECK(q.matmuls()[0].gemm.kind == GemmKind::wgmma);
    CHECK(!rows_skipped(q));
  }
  set_gemm_operand_sums(false);  // (kiln's default)
  GpuProgram off = cuda_program(90, matmul(x.transpose(0, 1), dy), kiln::sum(dy, 0));
  set_gemm_operand_sums(true);
  CHECK(!rows_skipped(off));
  CHECK(off.matmuls()[0].colsum_slot == -1);
}

}  // TEST_SUITE("nvrtc")

TEST_SUITE("hiprtc") {

// The targets of the hipRTC GEMM tests: this hipRTC must know the first three; the CDNA3 ones
// (ROCm 5.2, Debian's, does not) are compiled where it does.
bool hip_target_ready(const std::string& t) {
  bool required = t == "gfx90a" || t == "gfx908" || t == "gfx1030";
  if (jit::hiprtc_target_supported(t)) return true;
  if (required) FAIL("hipRTC cannot compile for " << t);
  MESSAGE(jit::hiprtc_version_string() << " does not know " << t << ": its GEMMs not compiled");
  return false;
}

TEST_CASE("every GEMM candidate compiles through hipRTC: MFMA on gfx908, gfx90a, gfx94x; SIMT there and on gfx1030") {
  if (!jit::hiprtc_available()) {
    MESSAGE("hipRTC not found: skipped");
    return;
  }
  // Two kernels cover each operand's two load paths: (A K-major, B N-major) bf16 and (A M-major, B K-major) f16.
  auto a = det<bf16, 2>({64, 32}, 1), b = det<bf16, 2>({32, 64}, 2);
  auto ht = det<f16, 2>({32, 64}, 3).transpose(0, 1), hbt = det<f16, 2>({64, 32}, 4).transpose(0, 1);
  auto f = det<f32, 2>({33, 17}, 5), fb = det<f32, 2>({9, 17}, 6).transpose(0, 1);
  auto d = det<f64, 2>({33, 17}, 7), db = det<f64, 2>({17, 9}, 8);
  for (std::string target : {"gfx90a", "gfx908", "gfx940", "gfx942", "gfx1030"}) {
    CAPTURE(target);
    if (!hip_target_ready(target)) continue;
    int arch = codegen::gemm_amd_arch(target);
    bool cdna = target != "gfx1030";
    // NOTE: every MFMA config on gfx90a; elsewhere (the same text but for the instruction the device
    // helper picks) the heuristic's and the smallest. CI has two cores: few compiles.
    std::vector<GemmConfig> mfma = codegen::gemm_candidates(DType::bf16, arch);
    if (target != "gfx90a" && mfma.size() > 2) mfma = {mfma.front(), mfma.back()};
    for (const GemmConfig& c : cdna ? mfma : std::vector<GemmConfig>{}) {
      CAPTURE(c.str());
      CHECK(c.kind == GemmKind::mfma);
      GemmHook force(c);
      GpuProgram p = hip_program(target, matmul(a, b), matmul(ht, hbt));
      for (const auto& v : p.matmuls()) CHECK(v.gemm == c);
      CHECK(p.src.find("kiln_mfma_bf16(af[i], bf[j]") != std::string::npos);
      CHECK(p.src.find("kiln_mfma_f16(af[i], bf[j]") != std::string::npos);
      CHECK(jit::detail::is_amdgpu_code_object(jit::hiprtc_compile(p.src, "kiln_gemm", target, {})));
    }
    for (const GemmConfig& c : codegen::gemm_candidates(DType::f32, arch)) {  // SIMT: every dtype it serves
      CAPTURE(c.str());
      GemmHook force(c);
      GpuProgram p = hip_program(target, matmul(a, b), matmul(ht, hbt), matmul(f, fb), matmul(d, db));
      const DType dtypes[] = {DType::bf16, DType::f16, DType::f32, DType::f64};
      REQUIRE(p.matmuls().size() == 4);
      for (size_t k = 0; k < 4; ++k)  // each that fits the static shared memory with its accumulators
        CHECK((p.matmuls()[k].gemm == c) == (codegen::gemm_simt_shared_bytes(c, dtypes[k]) <= 48u * 1024));
      CHECK(p.src.find("kiln_mfma") == std::string::npos);
      CHECK(p.src.find("mma.sync") == std::string::npos);
      CHECK(jit::detail::is_amdgpu_code_object(jit::hiprtc_compile(p.src, "kiln_gemm", target, {})));
    }
    if (!cdna) CHECK(codegen::gemm_candidates(DType::bf16, arch) == codegen::gemm_candidates(DType::f32, arch));
  }
}

TEST_CASE("gelu(x @ W1 + b1) is one MFMA kernel on CDNA targets (the SIMT one on gfx1030), and it compiles") {
  if (!jit::hiprtc_available()) {
    MESSAGE("hipRTC not found: skipped");
    return;
  }
  auto x = det<bf16, 2>({64, 32}, 1), w = det<bf16, 2>({48, 32}, 2).transpose(0, 1);
  auto b = det<bf16, 1>({48}, 3);
  for (std::string target : {"gfx90a", "gfx908", "gfx942", "gfx1030"}) {
    CAPTURE(target);
    if (!hip_target_ready(target)) continue;
    GpuProgram p = hip_program(target, kiln::gelu(matmul(x, w) + b));
    REQUIRE(p.kinds.size() == 1);
    CHECK(p.kinds[0] == sched::KernelKind::matmul);
    CHECK(p.vars[0].gemm.kind == (target == "gfx1030" ? GemmKind::simt : GemmKind::mfma));
    CHECK(p.src.find("kiln_erf(") != std::string::npos);  // gelu evaluated at store time
    CHECK(jit::detail::is_amdgpu_code_object(jit::hiprtc_compile(p.src, "kiln_gemm_epilogue", target, {})));
  }
  // An MFMA program compiled for RDNA says so (instead of hipRTC's own failure, or a crash on a builtin).
  std::string message;
  try {
    jit::hiprtc_compile(hip_program("gfx90a", matmul(x, w)).src, "kiln_gemm_rdna", "gfx1030", {});
  } catch (const CompileError& e) {
    message = e.what();
  }
  CHECK(message.find("the MFMA GEMM needs a CDNA target") != std::string::npos);
}

}  // TEST_SUITE("hiprtc")

TEST_SUITE("gpu") {

namespace {

// A [M, K] operand whose rows hold `pad` more elements than K (a K-sliced view: rows
// 16-byte aligned, the last 16-byte chunk of a row partly past K).
template <class DT>
Input<DT, 2> k_sliced(Rng& rng, int64_t rows, int64_t k, int64_t pad) {
  auto base = input<DT, 2>(rng, {rows, k + pad}, Layout::contiguous, Values{-2, 2});
  return {base.t.slice(1, 0, k), ref::slice(base.a, 1, 0, k)};
}

// The matmul cases every dtype runs, and whether each may take tensor cores (bf16/f16 on
// sm_80+). `few`: the three that reach every edge of the tile loop (forced-config runs).
template <class DT>
void add_cases(Batch& batch, Rng& rng, std::vector<bool>& want_tc, bool few) {
  Values v{-2, 2};
  const Tol t = DT::id == DType::f32 && allow_tf32() ? tol_tf32() : tol<DT>();
  auto add = [&](const auto& x, const auto& y, const Array& xa, const Array& ya, const std::string& what, bool tc) {
    Array scale;
    Array want = ref::matmul(xa, ya, &scale);
    int64_t k = xa.shape.back();
    batch.check(kiln::matmul(x, y), want, t.scaled(std::max(1.0, double(k) / 256)), what, scale);
    want_tc.push_back(tc);
  };
  {  // several tiles each way, K over several turns of every pipeline's stages
    auto x = input<DT, 2>(rng, {300, 520}, Layout::contiguous, v), y = input<DT, 2>(rng, {520, 600}, Layout::contiguous, v);
    add(x.t, y.t, x.a, y.a, "[300, 520] @ [520, 600]", true);
  }
  {  // x @ W.t(): W [N, K] row-major read in place (B K-major), odd M and N, K % 32 != 0
    auto x = input<DT, 2>(rng, {65, 1000}, Layout::contiguous, v), w = input<DT, 2>(rng, {129, 1000}, Layout::contiguous, v);
    add(x.t, w.t.transpose(0, 1), x.a, ref::transpose(w.a, 0, 1), "[65, 1000] @ W[129, 1000].t()", true);
  }
  {  // K-sliced views: partial 16-byte chunks at the end of every row, K = 1001
    auto x = k_sliced<DT>(rng, 65, 1001, 23), w = k_sliced<DT>(rng, 33, 1001, 7);
    add(x.t, w.t.transpose(0, 1), x.a, ref::transpose(w.a, 0, 1), "[65, 1001 of 1024] @ W[33, 1001 of 1008].t()", true);
  }
  {  // A M-major (a transposed view) and odd K along both operands' outer dims
    auto at = input<DT, 2>(rng, {72, 129}, Layout::transposed, v), y = input<DT, 2>(rng, {129, 40}, Layout::contiguous, v);
    add(at.t, y.t, at.a, y.a, "transposed [72, 129] @ [129, 40]", true);
    if (few) return;
    auto yt = input<DT, 2>(rng, {129, 24}, Layout::transposed, v);
    add(at.t, yt.t, at.a, yt.a, "transposed [72, 129] @ transposed [129, 24]", false);  // B [24,129] rows: 129 elements
  }
  {  // row-major both, N a multiple of 8, M = 1 and 7
    auto x = input<DT, 2>(rng, {1, 200}, Layout::contiguous, v), y = input<DT, 2>(rng, {200, 1000}, Layout::contiguous, v);
    add(x.t, y.t, x.a, y.a, "[1, 200] @ [200, 1000]", true);
    auto x7 = input<DT, 2>(rng, {7, 200}, Layout::contiguous, v);
    add(x7.t, y.t, x7.a, y.a, "[7, 200] @ [200, 1000]", true);
  }
  {  // batched, broadcast batch dims (stride 0), K = 64
    auto a3 = input<DT, 3>(rng, {3, 65, 64}, Layout::contiguous, v);
    auto b2 = input<DT, 2>(rng, {64, 40}, Layout::contiguous, v);
    add(a3.t, b2.t, a3.a, b2.a, "[3, 65, 64] @ [64, 40]", true);
    auto a1 = input<DT, 3>(rng, {1, 33, 64}, Layout::contiguous, v), b4 = input<DT, 3>(rng, {4, 64, 24}, Layout::transposed, v);
    add(a1.t, b4.t, a1.a, b4.a, "[1, 33, 64] @ transposed [4, 64, 24]", true);
  }
  {  // no tensor cores: misaligned rows, a strided operand
    auto x = input<DT, 2>(rng, {7, 13}, Layout::contiguous, v), y = input<DT, 2>(rng, {13, 5}, Layout::contiguous, v);
    add(x.t, y.t, x.a, y.a, "[7, 13] @ [13, 5]", false);
    auto s = input<DT, 2>(rng, {40, 24}, Layout::strided, v), y2 = input<DT, 2>(rng, {24, 33}, Layout::transposed, v);
    add(s.t, y2.t, s.a, y2.a, "strided [40, 24] @ transposed [24, 33]", false);
  }
}

// The default device's NVIDIA compute capability (90 for sm_90), 0 where it is not a CUDA GPU.
int cuda_arch() {
  if (!runtime::CudaDeviceApi::present() || kiln::default_device().kind != DeviceKind::cuda) return 0;
  const auto& p = cu::cuda_device().properties();
  return p.cc_major * 10 + p.cc_minor;
}
bool cuda_sm80() { return cuda_arch() >= 80; }

// Runs the cases (with `forced` as the config, where they can take it); returns how many ran it.
template <class DT>
int run_cases(std::optional<GemmConfig> forced) {
  KILN_TEST_RNG(rng);
  Batch batch;
  std::vector<bool> want_tc;
  add_cases<DT>(batch, rng, want_tc, forced.has_value());
  GemmHook hook(forced);
  batch.run();
  bool mma_dtype = DT::id == DType::bf16 || DT::id == DType::f16 || (DT::id == DType::f32 && allow_tf32());
  REQUIRE(hook.seen.size() == want_tc.size());
  int took = 0;
  if (cuda_sm80()) {
    for (size_t i = 0; i < want_tc.size(); ++i) {
      CAPTURE(i);
      CHECK(hook.seen[i].tensor_ok == want_tc[i]);
      GemmConfig chosen = codegen::gemm_choose(hook.seen[i]);
      CHECK((chosen.kind != GemmKind::simt) == (want_tc[i] && mma_dtype));
      took += forced && chosen == *forced;
    }
  }
  return took;
}

}  // namespace

TEST_CASE_TEMPLATE("GPU GEMM against float64: odd sizes, partial K chunks, transposed views, broadcast batches", DT, bf16, f16,
                   f32, f64) {
  if (kiln::default_device() == kiln::cpu()) return;
  run_cases<DT>(std::nullopt);
}

TEST_CASE_TEMPLATE("GPU GEMM: every candidate config, forced, against float64", DT, bf16, f32) {
  if (kiln::default_device() == kiln::cpu()) return;
  // NOTE: of the mma configs only the best-known of each block tile (what max-autotune times on
  // an sm_90): every config is a compile of every case's kernel, seconds each.
  GemmProblem any;
  any.dtype = DT::id, any.arch = cuda_arch(), any.tensor_ok = any.tma_ok = any.heavy_epilogue = true;
  std::vector<GemmConfig> configs = codegen::gemm_tuning_candidates(any);
  if (DT::id == DType::bf16 && any.arch == 90)  // 16-bit K steps of 32: not candidates yet
    for (const GemmConfig& c : codegen::gemm_k32_configs()) configs.push_back(c);
  for (const GemmConfig& c : configs) {
    CAPTURE(c.str());
    int took = run_cases<DT>(c);
    if (c.kind == GemmKind::wgmma) CHECK(took >= 3);  // the cases the copy engine can read
  }
}

namespace {

// Each TF32 candidate forced over every case: mma.sync's (`tma` false), or on an sm_90 wgmma's,
// which stage operands (`tma` true). Two test cases, so that the gpu suite's pool runs them side by side.
void check_tf32_candidates(bool tma) {
  AllowTf32 tf32;
  GemmProblem any;
  any.dtype = DType::f32, any.arch = cuda_arch(), any.tensor_ok = any.tf32 = true, any.tma_ok = tma;
  for (const GemmConfig& c : codegen::gemm_tuning_candidates(any)) {
    CAPTURE(c.str());
    CHECK(run_cases<f32>(c) >= (cuda_sm80() ? 3 : 0));
  }
}

}  // namespace

TEST_CASE("GPU GEMM in TF32 against float64: every case, the heuristic's config and each mma.sync candidate forced") {
  if (kiln::default_device() == kiln::cpu()) return;
  AllowTf32 tf32;
  run_cases<f32>(std::nullopt);
  check_tf32_candidates(false);
}

TEST_CASE("GPU GEMM in TF32 against float64: every case, each candidate forced where operands may be staged (wgmma on an sm_90)") {
  if (kiln::default_device() == kiln::cpu()) return;
  check_tf32_candidates(true);
}

TEST_CASE("GPU GEMM in TF32 on an sm_90 (wgmma): staged and in-place operands, batches, epilogues, each tile shape, against float64") {
  if (kiln::default_device() == kiln::cpu() || cuda_arch() != 90) return;
  KILN_TEST_RNG(rng);
  AllowTf32 tf32;
  Values v{-2, 2};
  const Tol t = tol_tf32().scaled(2);
  auto x = input<f32, 2>(rng, {300, 136}, Layout::contiguous, v), xt = input<f32, 2>(rng, {300, 129}, Layout::transposed, v);
  auto w = input<f32, 2>(rng, {136, 520}, Layout::contiguous, v), wt = input<f32, 2>(rng, {136, 520}, Layout::transposed, v);
  auto w129 = input<f32, 2>(rng, {129, 200}, Layout::contiguous, v);
  auto b = input<f32, 1>(rng, {520}, Layout::contiguous, v);
  auto a3 = input<f32, 3>(rng, {4, 130, 96}, Layout::contiguous, v), b3 = input<f32, 3>(rng, {4, 96, 72}, Layout::contiguous, v);
  auto at3 = input<f32, 3>(rng, {3, 64, 80}, Layout::transposed, v), one = input<f32, 3>(rng, {1, 80, 136}, Layout::contiguous, v);
  Array scale;
  Array pre = ref::zip(ref::matmul(x.a, w.a, &scale), b.a, [](double p, double q) { return p + q; });
  Array bound = ref::zip(scale, b.a, [](double p, double q) { return std::fabs(p) + std::fabs(q); });
  Array want_gelu = ref::map(pre, ref::gelu);
  std::vector<GemmConfig> tiles;  // each TF32 wgmma tile shape once, persistent or not
  for (const GemmConfig& c : codegen::gemm_candidates(DType::f32, 90, true))
    if (c.kind == GemmKind::wgmma && std::none_of(tiles.begin(), tiles.end(), [&](const GemmConfig& u) {
          return u.bn == c.bn && u.persistent == c.persistent;
        }))
      tiles.push_back(c);
  REQUIRE(tiles.size() >= 4);
  for (const GemmConfig& c : tiles) {
    CAPTURE(c.str());
    Batch batch;
    auto add = [&](const auto& e, const Array& xa, const Array& ya, const std::string& what) {
      Array sc;
      Array want = ref::matmul(xa, ya, &sc);
      batch.check(e, want, t, what, sc);
    };
    batch.check(kiln::gelu(kiln::matmul(x.t, w.t) + b.t), want_gelu, t, "gelu(x @ w + b), B staged", bound);
    add(kiln::matmul(x.t, wt.t), x.a, wt.a, "x @ transposed w: nothing staged");
    add(kiln::matmul(xt.t, w129.t), xt.a, w129.a, "transposed x @ w, K = 129: both staged, rows padded to 132");
    add(kiln::matmul(a3.t, b3.t), a3.a, b3.a, "[4, 130, 96] @ [4, 96, 72]: B's 4 batches staged");
    add(kiln::matmul(at3.t, one.t), at3.a, one.a, "transposed [3, 64, 80] @ [1, 80, 136]: A's batches and B's one staged");
    GemmHook hook(c);
    batch.run();
    REQUIRE(hook.seen.size() == 5);
    for (const GemmProblem& p : std::vector(hook.seen)) CHECK(codegen::gemm_choose(p) == c);
  }
  // One launch for the GEMM, one more where an operand is staged (a wgmma config forced: for
  // these few tiles the heuristic takes mma.sync).
  GemmHook hook(tiles.front());
  Counters c0 = counters();
  Tensor<f32, 2> y = kiln::matmul(x.t, w.t);
  CHECK(counters().kernels_launched - c0.kernels_launched == 2);
  Counters c1 = counters();
  Tensor<f32, 2> y2 = kiln::matmul(x.t, wt.t);
  CHECK(counters().kernels_launched - c1.kernels_launched == 1);
  check_close(y, ref::matmul(x.a, w.a), t, "x @ w, counted", &scale);
  Array scale2;
  Array want2 = ref::matmul(x.a, wt.a, &scale2);
  check_close(y2, want2, t, "x @ transposed w, counted", &scale2);
}

TEST_CASE("GPU GEMM in TF32 on an sm_90 (wgmma): a staged copy is rounded to nearest TF32, an operand read in place truncated") {
  if (kiln::default_device() == kiln::cpu() || cuda_arch() != 90) return;
  // 1 + 3 * 2^-12 is 1 + 2^-10 in TF32 rounded to nearest, 1 truncated; 64 products of it with 1.
  const double x = 1 + 3.0 / 4096, rounded = 1 + 1.0 / 1024;
  auto full = [](int64_t r, int64_t c, double value) { return Tensor<f32, 2>::from(Shape<2>{r, c}, std::vector<double>(size_t(r * c), value)); };
  auto expect = [](const Tensor<f32, 2>& got, double want, const char* what) {
    Array out = read(got);
    int64_t bad = std::count_if(out.v.begin(), out.v.end(), [&](double e) { return e != want; });
    CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << out.numel() << " elements differ from " << fmt(want));
  };
  AllowTf32 tf32;
  GemmHook hook(codegen::gemm_candidates(DType::f32, 90, true).front());
  expect(Tensor<f32, 2>(matmul(full(256, 64, 1.0), full(64, 256, x))), 64 * rounded, "B N-major, staged");
  expect(Tensor<f32, 2>(matmul(full(256, 64, x), full(64, 256, 1.0))), 64.0, "A K-major, read in place");
  REQUIRE(hook.seen.size() == 2);
  for (const GemmProblem& p : std::vector(hook.seen)) CHECK(codegen::gemm_choose(p).kind == GemmKind::wgmma);
}

TEST_CASE("GPU GEMM in TF32: inputs rounded to nearest TF32 (not truncated), f32 arithmetic when not allowed") {
  if (kiln::default_device() == kiln::cpu()) return;
  // 1 + 3 * 2^-12 is 1 + 2^-10 in TF32 rounded to nearest, 1 truncated; 8 products of it with 1.
  const double x = 1 + 3.0 / 4096, rounded = 1 + 1.0 / 1024;
  auto a = Tensor<f32, 2>::from(Shape<2>{33, 8}, std::vector<double>(33 * 8, x));
  auto na = Tensor<f32, 2>::from(Shape<2>{33, 8}, std::vector<double>(33 * 8, -x));
  auto b = Tensor<f32, 2>::from(Shape<2>{8, 40}, std::vector<double>(8 * 40, 1.0));
  auto expect = [](const Tensor<f32, 2>& got, double want, const char* what) {
    Array out = read(got);
    int64_t bad = std::count_if(out.v.begin(), out.v.end(), [&](double v) { return v != want; });
    CHECK_MESSAGE(bad == 0, what << ": " << bad << " of " << out.numel() << " elements differ from " << fmt(want));
  };
  {
    AllowTf32 tf32;
    GemmHook hook;
    expect(Tensor<f32, 2>(matmul(a, b)), 8 * rounded, "TF32");
    expect(Tensor<f32, 2>(matmul(na, b)), -8 * rounded, "TF32, negative");
    REQUIRE(hook.seen.size() == 2);
    if (cuda_sm80())
      for (const GemmProblem& p : std::vector(hook.seen)) CHECK(codegen::gemm_choose(p).kind == GemmKind::mma);
  }
  AllowTf32 off(false);
  expect(Tensor<f32, 2>(matmul(a, b)), 8 * x, "f32");
}

TEST_CASE("GPU GEMM: the Hopper kernel over batches (both batched, one broadcast) and transposed batched operands") {
  if (kiln::default_device() == kiln::cpu() || cuda_arch() != 90) return;
  KILN_TEST_RNG(rng);
  Values v{-2, 2};
  auto a = input<bf16, 3>(rng, {4, 130, 96}, Layout::contiguous, v), b = input<bf16, 3>(rng, {4, 96, 72}, Layout::transposed, v);
  auto w = input<bf16, 2>(rng, {96, 200}, Layout::contiguous, v);
  auto at = input<bf16, 3>(rng, {3, 64, 80}, Layout::transposed, v), one = input<bf16, 3>(rng, {1, 80, 136}, Layout::contiguous, v);
  // The first candidate (persistent), and the same taking its tiles from the grid's counter: a
  // batch walks its tiles as the static config does (one counter serves one matrix).
  // And serpentine walks (odd waves' K backwards).
  GemmConfig dynamic = codegen::gemm_candidates(DType::bf16, 90).front(), serpentine = dynamic;
  dynamic.dynamic = true, serpentine.serpentine = true;
  for (const GemmConfig& c : {codegen::gemm_candidates(DType::bf16, 90).front(), dynamic, serpentine}) {
    CAPTURE(c.str());
    Batch batch;
    auto add = [&](const auto& x, const auto& y, const Array& xa, const Array& ya, const std::string& what) {
      Array scale;
      Array want = ref::matmul(xa, ya, &scale);
      batch.check(kiln::matmul(x, y), want, tol<bf16>().scaled(2), what, scale);
    };
    add(a.t, b.t, a.a, b.a, "[4, 130, 96] @ transposed [4, 96, 72]");
    add(a.t, w.t, a.a, w.a, "[4, 130, 96] @ [96, 200] (B broadcast)");
    add(at.t, one.t, at.a, one.a, "transposed [3, 64, 80] @ [1, 80, 136] (B's batch of one broadcast)");
    GemmHook hook(c);
    batch.run();
    REQUIRE(hook.seen.size() == 3);
    for (const GemmProblem& p : std::vector(hook.seen)) CHECK(codegen::gemm_choose(p).kind == GemmKind::wgmma);
  }
}

TEST_CASE_TEMPLATE("GPU GEMM epilogue: gelu(x @ W1 + b1) in the tensor-core kernel, one launch", DT, bf16, f16) {
  if (kiln::default_device() == kiln::cpu()) return;
  KILN_TEST_RNG(rng);
  // x @ W1.t() with odd M and N, K % 32 != 0: the tile edges meet the epilogue.
  auto x = input<DT, 2>(rng, {65, 1000}, Layout::contiguous, Values{-2, 2});
  auto w = input<DT, 2>(rng, {129, 1000}, Layout::contiguous, Values{-2, 2});
  auto b = input<DT, 1>(rng, {129}, Layout::contiguous, Values{-2, 2});
  auto y = kiln::gelu(kiln::matmul(x.t, w.t.transpose(0, 1)) + b.t);
  CHECK(kernel_count(Mode::fused, y) == 1);
  Array scale;
  Array pre = ref::zip(ref::matmul(x.a, ref::transpose(w.a, 0, 1), &scale), b.a, [](double p, double q) { return p + q; });
  Array bound = ref::zip(scale, b.a, [](double p, double q) { return std::fabs(p) + std::fabs(q); });
  // The heuristic's kernel (tensor cores), then on an H100/H200 each wgmma config forced.
  std::vector<std::optional<GemmConfig>> configs = {std::nullopt};
  for (const GemmConfig& c : codegen::gemm_candidates(DT::id, cuda_arch()))
    if (c.kind == GemmKind::wgmma) configs.push_back(c);
  for (const auto& forced : configs) {
    CAPTURE(forced ? forced->str() : "heuristic");
    GemmHook hook(forced);
    Counters before = counters();
    Tensor<DT, 2> out = y;
    CHECK(counters().kernels_launched - before.kernels_launched == 1);
    REQUIRE(hook.seen.size() == 1);
    if (cuda_sm80()) {
      GemmConfig chosen = codegen::gemm_choose(hook.seen[0]);
      CAPTURE(chosen.str());
      if (forced) CHECK(chosen == *forced);
      else CHECK(chosen.kind != GemmKind::simt);  // a tensor-core kernel
    }
    check_close(out, ref::map(pre, ref::gelu), tol<DT>().scaled(2), "gelu(x @ W1.t() + b1)", &bound);
  }
}

TEST_CASE_TEMPLATE("GPU GEMM epilogue in the Hopper kernel: interior tiles 4 columns per access, edge tiles per element", DT, bf16,
                   f16) {
  if (kiln::default_device() == kiln::cpu() || cuda_arch() != 90) return;
  KILN_TEST_RNG(rng);
  const int64_t M = 300, N = 520, K = 136;  // interior and edge tiles for every wgmma tile shape
  Values v{-2, 2};
  auto x = input<DT, 2>(rng, {M, K}, Layout::contiguous, v), w = input<DT, 2>(rng, {K, N}, Layout::contiguous, v);
  auto w2 = input<DT, 2>(rng, {K, N}, Layout::transposed, v);
  auto b = input<DT, 1>(rng, {N}, Layout::contiguous, v);
  auto s = input<DT, 2>(rng, {M, 1}, Layout::contiguous, v);
  auto r = input<DT, 2>(rng, {M, N}, Layout::contiguous, v), rt = input<DT, 2>(rng, {M, N}, Layout::transposed, v);
  Array scale, scale2;
  Array pre = ref::zip(ref::matmul(x.a, w.a, &scale), b.a, [](double p, double q) { return p + q; });
  Array want1 = ref::zip3(ref::map(pre, ref::gelu), s.a, r.a, [](double g, double t, double q) { return g * t + q; });
  Array bound1 = ref::zip3(ref::zip(scale, b.a, [](double p, double q) { return std::fabs(p) + std::fabs(q); }), s.a, r.a,
                           [](double g, double t, double q) { return g * std::fabs(t) + std::fabs(q); });
  Array want2 = ref::zip(ref::matmul(x.a, w2.a, &scale2), rt.a, [](double p, double q) { return p + q; });
  Array bound2 = ref::zip(scale2, rt.a, [](double p, double q) { return p + std::fabs(q); });
  std::vector<GemmConfig> tiles;  // each wgmma tile shape and epilogue form once (the staging walks BN in 32-column chunks)
  for (const GemmConfig& c : codegen::gemm_candidates(DT::id, 90))
    if (c.kind == GemmKind::wgmma && std::none_of(tiles.begin(), tiles.end(), [&](const GemmConfig& t) {
          return t.bn == c.bn && t.persistent == c.persistent && t.split_epilogue == c.split_epilogue;
        }))
      tiles.push_back(c);
  for (const GemmConfig& c : tiles) {
    CAPTURE(c.str());
    Batch batch;
    batch.check(kiln::gelu(kiln::matmul(x.t, w.t) + b.t) * s.t + r.t, want1, tol<DT>().scaled(2), "gelu(x @ w + b) * s + r", bound1);
    batch.check(kiln::matmul(x.t, w2.t) + rt.t, want2, tol<DT>().scaled(2), "x @ w2 + transposed r", bound2);
    GemmHook hook(c);
    batch.run();
    REQUIRE(hook.seen.size() == 2);
    for (const GemmProblem& p : std::vector(hook.seen)) CHECK(codegen::gemm_choose(p) == c);
  }
}

namespace {
// The persistent configs the five test cases below force, in five sets, so that scripts/gpu-check's
// pool runs their NVRTC compiles side by side (as one case, it alone outlasted a 230 s device
// call in the forty-sixth session; the walks and clusters as one, 189 s, bounded the pool).
enum class PersistentSet { walks, clusters, dynamic, serpentine, k32 };

std::vector<GemmConfig> persistent_configs(PersistentSet set) {
  std::vector<GemmConfig> base, configs;
  for (const GemmConfig& c : codegen::gemm_candidates(DType::bf16, 90))
    if (c.persistent) base.push_back(c);
  CHECK(base.size() == 4);  // two with a split epilogue
  auto with = [&](GemmConfig c, auto&& tweak) { tweak(c), configs.push_back(c); };
  switch (set) {
  case PersistentSet::walks:
    // Each alone and with a split tail.
    configs = base;
    for (const GemmConfig& c : base) with(c, [](GemmConfig& t) { t.split_tail = true; });
    break;
  case PersistentSet::clusters:
    // In clusters of two blocks where the tile splits, also with a split tail; and raster
    // groups of other heights: 3 (9 tile rows in three groups), 16 (one group, partial).
    for (const GemmConfig& c : base)
      if (splits_in_two(c)) {
        with(c, [](GemmConfig& t) { t.cluster = 2; });
        with(c, [](GemmConfig& t) { t.cluster = 2, t.split_tail = true; });
      }
    for (int g : {3, 16}) with(base.front(), [g](GemmConfig& t) { t.group = g; });
    // and groups 3 tiles wide (GemmConfig::group_across), alone and in clusters
    with(base.front(), [](GemmConfig& t) { t.group = 3, t.group_across = true; });
    with(base.front(), [](GemmConfig& t) { t.group = 3, t.group_across = true, t.cluster = 2; });
    break;
  case PersistentSet::dynamic:
    // Dynamic tiles (from the grid's counter; run twice below: the last block leaves it at
    // zero), each alone, and in clusters where the tile splits.
    for (const GemmConfig& c : base) {
      with(c, [](GemmConfig& t) { t.dynamic = true; });
      if (splits_in_two(c)) with(c, [](GemmConfig& t) { t.dynamic = true, t.cluster = 2; });
    }
    break;
  case PersistentSet::serpentine:
    // Serpentine walks (the blocks' second tiles load K from its end; odd raster groups'
    // columns from the right), each alone and in clusters where the tile splits; in clusters
    // also with groups of 3 cluster rows (5 cluster rows: an odd group) and with dynamic tiles.
    for (const GemmConfig& c : base) {
      with(c, [](GemmConfig& t) { t.serpentine = true; });
      if (splits_in_two(c)) with(c, [](GemmConfig& t) { t.serpentine = true, t.cluster = 2; });
    }
    with(base.front(), [](GemmConfig& t) { t.serpentine = true, t.cluster = 2, t.group = 3; });
    with(configs.back(), [](GemmConfig& t) { t.dynamic = true; });
    // groups 3 tiles wide in clusters (odd groups take their rows from the bottom)
    with(base.front(), [](GemmConfig& t) { t.serpentine = true, t.cluster = 2, t.group = 3, t.group_across = true; });
    break;
  case PersistentSet::k32:
    // K steps of 32 (64-byte swizzled K-major rows; not candidates yet), alone and in clusters.
    for (const GemmConfig& c : codegen::gemm_k32_configs()) {
      configs.push_back(c);
      with(c, [](GemmConfig& t) { t.cluster = 2; });
    }
    break;
  }
  return configs;
}

// Runs a set's configs, forced, over two shapes of more tiles than SMs, against float64.
void check_persistent(PersistentSet set) {
  if (kiln::default_device() == kiln::cpu() || cuda_arch() != 90) return;
  KILN_TEST_RNG(rng);
  const std::vector<GemmConfig> configs = persistent_configs(set);
  // On 132 SMs, 128 x 256 tiles: M = 1096, N = 3896 gives 9 x 16 = 144 tiles; with a split
  // tail the 12 past the first wave are cut into 3 pieces each (K = 1032: 17 K steps, the last
  // partial; pieces of 5 or 6), in clusters of two (80 cluster tiles on 66 clusters) the 14 past
  // the first wave likewise (128 x 128 tiles in clusters: 23 in 2 pieces). M = 2056 gives 17 x 16 = 272 tiles, K = 264 five steps: too few
  // for a cut to pay (kiln_tail_parts), so a split config walks whole tiles. 128 x 128 tiles:
  // 279 and 527 tiles. Blocks take a second or third tile while their producer is already
  // loading it; M and N no multiples of the tile. In clusters of two, 9 and 17 tile rows
  // leave the last cluster's lower tile wholly past M (it still hands its pieces over).
  // gelu(x @ w + b) and gelu'(x @ w + b) are one GEMM with two stores (W4's forward GEMM), in
  // every config forced, the split epilogue's among them.
  // NOTE: every row 16-byte aligned (M, N and K multiples of 8), as the copy engine needs.
  for (auto [M, K] : {std::pair<int64_t, int64_t>{1096, 1032}, {2056, 264}}) {
    const int64_t N = 3896;
    CAPTURE(M);
    CAPTURE(K);
    Values v{-2, 2};
    auto x = input<bf16, 2>(rng, {M, K}, Layout::contiguous, v), xt = input<bf16, 2>(rng, {M, K}, Layout::transposed, v);
    auto w = input<bf16, 2>(rng, {K, N}, Layout::contiguous, v), wt = input<bf16, 2>(rng, {K, N}, Layout::transposed, v);
    auto b = input<bf16, 1>(rng, {N}, Layout::contiguous, v);
    auto r = input<bf16, 2>(rng, {M, N}, Layout::contiguous, v);
    // float64 products p @ q and sums of |terms| (ref::matmul is too slow at this size), row-major.
    auto product = [&](const Array& p, const Array& q, Array& scale) {
      Array out(Dims{M, N});
      scale = Array(Dims{M, N});
      for (int64_t i = 0; i < M; ++i)
        for (int64_t k = 0; k < K; ++k) {
          const double a = p.v[size_t(i * K + k)];
          for (int64_t j = 0; j < N; ++j) {
            const double t = a * q.v[size_t(k * N + j)];
            out.v[size_t(i * N + j)] += t, scale.v[size_t(i * N + j)] += std::fabs(t);
          }
        }
      return out;
    };
    Array scale, scale2;
    Array pre = ref::zip(product(x.a, w.a, scale), b.a, [](double p, double q) { return p + q; });
    Array bound = ref::zip(scale, b.a, [](double p, double q) { return std::fabs(p) + std::fabs(q); });
    Array want2 = ref::zip(product(xt.a, wt.a, scale2), r.a, [](double p, double q) { return p + q; });
    Array bound2 = ref::zip(scale2, r.a, [](double p, double q) { return p + std::fabs(q); });
    for (const GemmConfig& c : configs) {
      CAPTURE(c.str());
      // Twice: a run leaves the split tail's counts as it found them (else the second reads stale
      // sums), and dynamic tiles' counter (else the second skips tiles: unwritten outputs).
      for (int round = 0; round < 2; ++round) {
        CAPTURE(round);
        Batch batch;
        batch.check(kiln::gelu(kiln::matmul(x.t, w.t) + b.t), ref::map(pre, ref::gelu), tol<bf16>().scaled(2), "gelu(x @ w + b)", bound);
        // gelu' of the same GEMM: a second store of its epilogue (|gelu''| < 1: the bound holds)
        batch.check(gelu_grad(kiln::matmul(x.t, w.t) + b.t), ref::map(pre, ref::gelu_grad), tol<bf16>().scaled(2), "gelu'(x @ w + b)", bound);
        batch.check(kiln::matmul(xt.t, wt.t) + r.t, want2, tol<bf16>().scaled(2), "transposed x @ transposed w + r", bound2);
        GemmHook hook(c);
        Counters before = counters();
        batch.run();
        CHECK(counters().kernels_launched - before.kernels_launched == 2);  // one kernel each, split or not
        REQUIRE(hook.seen.size() == 2);
        for (const GemmProblem& p : std::vector(hook.seen)) {
          CHECK(codegen::gemm_choose(p) == c);
          CHECK(codegen::gemm_tiles(c, p) > 132);
          // The first shape's tail is cut (in 2 or 3 pieces), the second's not.
          CHECK((codegen::gemm_walk(c, p.m, p.n, p.k, p.batch, p.sm_count).parts > 1) == (c.split_tail && K == 1032));
        }
      }
    }
  }
}
}  // namespace

TEST_CASE("GPU GEMM: the persistent Hopper kernel over more tiles than SMs, each block several tiles, a split tail") {
  check_persistent(PersistentSet::walks);
}

TEST_CASE("GPU GEMM: the persistent Hopper kernel over more tiles than SMs, clusters, raster groups") {
  check_persistent(PersistentSet::clusters);
}

TEST_CASE("GPU GEMM: the persistent Hopper kernel over more tiles than SMs, dynamic tiles") {
  check_persistent(PersistentSet::dynamic);
}

TEST_CASE("GPU GEMM: the persistent Hopper kernel over more tiles than SMs, serpentine walks") {
  check_persistent(PersistentSet::serpentine);
}

TEST_CASE("GPU GEMM: the persistent Hopper kernel over more tiles than SMs, K steps of 32") {
  check_persistent(PersistentSet::k32);
}

// The wgmma configs of the epilogue's kinds: a tile a block (128 x 128), the split epilogue (128 x
// 192: six groups of column chunks for its three warps), persistent (128 x 256), and last that in
// clusters of two (W4's).
std::vector<GemmConfig> epilogue_configs(DType d) {
  std::vector<GemmConfig> configs;
  for (const GemmConfig& c : codegen::gemm_candidates(d, 90))
    if (c.kind == GemmKind::wgmma && ((c.bn == 128 && !c.persistent) || (c.bn == 192 && c.split_epilogue)))
      configs.push_back(c);
  for (const GemmConfig& c : codegen::gemm_candidates(d, 90))
    if (c.kind == GemmKind::wgmma && c.bn == 256 && c.persistent && !c.split_epilogue) configs.push_back(c);
  REQUIRE(configs.size() == 3);
  configs.push_back(configs.back()), configs.back().cluster = 2;
  return configs;
}

TEST_CASE_TEMPLATE("GPU GEMM: a sum over the rows of the matrix it stores (a bias's gradient) in the Hopper kernel, each config, against float64",
                   DT, bf16, f16) {
  if (kiln::default_device() == kiln::cpu() || cuda_arch() != 90) return;
  KILN_TEST_RNG(rng);
  ColumnSumsOn on;
  const std::vector<GemmConfig> configs = epilogue_configs(DT::id);
  // Odd M (a partial last tile row; in clusters of two, a lower tile wholly past M), N no
  // multiple of the tile, one tile, a transposed x (M a multiple of 8: the copy engine reads it M-major).
  struct Case {
    int64_t M, N, K;
    Layout xl;
  };
  // M and N of more tiles than an H200 or H100 has SMs: a persistent block's later tiles, whose
  // column counts are answered a tile late (KilnColsumCount) inside the loop, not after it.
  for (const Case& cs : {Case{1093, 1160, 136, Layout::contiguous}, Case{7, 40, 64, Layout::contiguous}, Case{264, 520, 72, Layout::transposed},
                         Case{4100, 2056, 40, Layout::contiguous}}) {
    const int64_t M = cs.M, N = cs.N, K = cs.K;
    CAPTURE(M);
    CAPTURE(N);
    Values v{-2, 2};
    auto x = input<DT, 2>(rng, {M, K}, cs.xl, v), w = input<DT, 2>(rng, {K, N}, Layout::contiguous, v);
    auto b = input<DT, 1>(rng, {N}, Layout::contiguous, v);
    Array scale;
    Array pre = ref::zip(ref::matmul(x.a, w.a, &scale), b.a, [](double p, double q) { return p + q; });
    Array bound = ref::zip(scale, b.a, [](double p, double q) { return std::fabs(p) + std::fabs(q); });
    Array want_e = ref::map(pre, ref::gelu), want_m = ref::matmul(x.a, w.a);
    // A column's sum goes through every element's rounding and error: its bound sums theirs.
    Array want_s = ref::sum(want_e, {0}), bound_s = ref::sum(ref::zip(want_e, bound, [](double e, double q) { return std::fabs(e) + q; }), {0});
    Array want_ms = ref::sum(want_m, {0}), bound_ms = ref::sum(scale, {0});
    for (const GemmConfig& c : configs) {
      CAPTURE(c.str());
      GemmHook hook(c);
      auto e = kiln::gelu(kiln::matmul(x.t, w.t) + b.t);
      auto mm = kiln::matmul(x.t, w.t);
      Counters before = counters();
      auto [got_e, got_s] = kiln::eval(e, kiln::sum(e, 0));  // the epilogue's output summed
      const GemmProblem seen = hook.seen.at(0);  // NOTE: a copy: gemm_choose adds to hook.seen
      const bool took = codegen::gemm_choose(seen) == c;
      if (took) CHECK(counters().kernels_launched - before.kernels_launched == 1);
      check_close(got_e, want_e, tol<DT>().scaled(2), "gelu(x @ w + b)", &bound);
      check_close(got_s, want_s, tol<DT>().scaled(2), "sum(gelu(x @ w + b), 0)", &bound_s);
      before = counters();
      Tensor<DT, 1> got_ms = kiln::sum(mm, 0);  // the matmul's own value, stored only for its sums
      if (took) CHECK(counters().kernels_launched - before.kernels_launched == 1);
      check_close(got_ms, want_ms, tol<DT>().scaled(2), "sum(x @ w, 0)", &bound_ms);
      // The same sums bit for bit on every run (the tiles' partial sums are added in one order).
      Tensor<DT, 1> again = kiln::sum(mm, 0);
      CHECK(read(again).v == read(got_ms).v);
    }
  }
}

TEST_CASE_TEMPLATE("GPU GEMM: a sum of a function of every element it stores (a loss) in the Hopper kernel, each config, against float64",
                   DT, bf16, f16) {
  if (kiln::default_device() == kiln::cpu() || cuda_arch() != 90) return;
  KILN_TEST_RNG(rng);
  TotalsOn on;
  std::vector<GemmConfig> configs = epilogue_configs(DT::id);  // and with a split tail
  configs.push_back(configs.back()), configs.back().cluster = 1, configs.back().split_tail = true;
  // Odd M (in clusters of two, a lower tile wholly past M), N no multiple of the tile, one tile,
  // a transposed x; a batch of two (the grid's z) with B broadcast.
  struct Case {
    int64_t B, M, N, K;
    Layout xl;
  };
  for (const Case& cs : {Case{1, 1093, 1160, 136, Layout::contiguous}, Case{1, 7, 40, 64, Layout::contiguous},
                         Case{1, 264, 520, 72, Layout::transposed}, Case{2, 200, 264, 64, Layout::contiguous}}) {
    const int64_t M = cs.M, N = cs.N, K = cs.K;
    CAPTURE(M);
    CAPTURE(N);
    CAPTURE(cs.B);
    Values v{-2, 2};
    auto x = input<DT, 3>(rng, {cs.B, M, K}, cs.xl, v);
    auto w = input<DT, 2>(rng, {K, N}, Layout::contiguous, v);
    auto b = input<DT, 1>(rng, {N}, Layout::contiguous, v);
    // y = x @ w + b in float64, and each element's error bound: the f32 sums' (K + 1 roundings
    // of at most sum |x w| + |b|), and in a split epilogue the accumulator's rounding to DT
    // first (its staging: the matmul's own value), before the bias. The total sums y as computed,
    // before its rounding to DT.
    Array pre(Dims{cs.B, M, N}), mag(Dims{cs.B, M, N}), err_split(Dims{cs.B, M, N}), err_plain(Dims{cs.B, M, N});
    const double u = tol<DT>().rtol / 4;  // about DT's unit roundoff (bf16 2^-8, f16 2^-10: Tol's is a few of them)
    for (int64_t z = 0; z < cs.B; ++z)
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double acc = 0, m = 0;
          for (int64_t k = 0; k < K; ++k) acc += x.a.at({z, i, k}) * w.a.at({k, j}), m += std::fabs(x.a.at({z, i, k}) * w.a.at({k, j}));
          const double bj = b.a.v[size_t(j)];
          pre.at({z, i, j}) = acc + bj, mag.at({z, i, j}) = m + std::fabs(bj);
          err_plain.at({z, i, j}) = double(K + 1) * 0x1p-24 * mag.at({z, i, j});
          err_split.at({z, i, j}) = err_plain.at({z, i, j}) + u * std::fabs(acc);
        }
    // The totals' bounds from the elements': |d(y^2)| <= 2 |y| e + e^2, |d(y^2 / 2 + y)| <= (|y| + 1) e + e^2 / 2;
    // and the f32 additions (a few thousand a thread, then the warps'): 1e-5 of the magnitude.
    auto bounds = [&](const Array& e) {
      double loss = 0, f = 0, sq = 0, fm = 0;
      for (size_t i = 0; i < pre.v.size(); ++i) {
        const double y = std::fabs(pre.v[i]), ei = e.v[i];
        loss += 2 * y * ei + ei * ei, f += (y + 1) * ei + ei * ei / 2, sq += y * y, fm += y * y / 2 + y;
      }
      return std::pair{(loss + 1e-5 * sq) / double(pre.v.size()), f + 1e-5 * fm};
    };
    double want_loss = 0, want_f = 0;
    for (double y : pre.v) want_loss += y * y, want_f += y * y * 0.5 + y;
    want_loss /= double(pre.v.size());
    for (const GemmConfig& c : configs) {
      CAPTURE(c.str());
      GemmHook hook(c);
      auto y = kiln::matmul(x.t, w.t) + b.t;
      auto yf = kiln::cast<f32>(y);
      Counters before = counters();
      auto [got_y, loss] = kiln::eval(y, kiln::mean(yf * yf));  // W4's: y stored (for the backward), the loss read from it
      const GemmProblem seen = hook.seen.at(0);  // NOTE: a copy: gemm_choose adds to hook.seen
      const bool took = codegen::gemm_choose(seen) == c;
      const bool fused = counters().kernels_launched - before.kernels_launched == 1;
      if (took) CHECK(fused);
      check_close(got_y, pre, tol<DT>().scaled(2), "x @ w + b", &mag);
      // Where the config forced is not taken and the GEMM another kind, the rows kernel sums y
      // rounded to DT: within DT's tolerance.
      const auto [b_loss, b_f] = bounds(took && c.persistent && c.split_epilogue ? err_split : err_plain);
      const Array s_loss = ref::scalar(b_loss), s_f = ref::scalar(b_f);
      const Tol t = fused ? Tol{1, 0} : tol<DT>().scaled(2);  // fused: |got - want| <= the bound
      check_close(read(loss), ref::scalar(want_loss), t, "mean(y * y)", fused ? &s_loss : nullptr);
      auto [y2, f] = kiln::eval(y, kiln::sum(yf * yf * 0.5f + yf));  // a constant of the sum's own
      const Array s_f_loose = ref::scalar(std::fabs(want_f) + b_f);
      check_close(read(f), ref::scalar(want_f), t, "sum(y * y * 0.5 + y)", fused ? &s_f : &s_f_loose);
      // The same total bit for bit on every run (the warps' sums are added in one order).
      auto [y3, again] = kiln::eval(y, kiln::mean(yf * yf));
      CHECK(read(again).v == read(loss).v);
    }
  }
}

TEST_CASE_TEMPLATE("GPU GEMM: a sum over the rows of its B operand (a bias's gradient beside its weight's) in the Hopper kernel, each config, "
                   "against float64", DT, bf16, f16) {
  if (kiln::default_device() == kiln::cpu() || cuda_arch() != 90) return;
  KILN_TEST_RNG(rng);
  OperandSumsOn on;
  // A tile a block (128 x 128), persistent 128 x 256 in 4 stages, the same in 3 (not a
  // candidate: forced), and in clusters of two (W4's).
  std::vector<GemmConfig> configs;
  for (const GemmConfig& c : codegen::gemm_candidates(DT::id, 90))
    if (c.kind == GemmKind::wgmma && !c.split_epilogue && ((c.bn == 128 && !c.persistent) || (c.bn == 256 && c.persistent)))
      configs.push_back(c);
  REQUIRE(configs.size() == 2);
  const GemmConfig persistent = configs[0].persistent ? configs[0] : configs[1];
  REQUIRE(persistent.stages == 4);
  configs.push_back(persistent), configs.back().stages = 3;
  configs.push_back(persistent), configs.back().cluster = 2;
  // dW = a @ dy with a = x.t() (M-major, as a weight's gradient reads x) and db = sum(dy, 0):
  // odd M (in clusters of two, a lower tile wholly past M), N no multiple of the tile, K of a
  // partial last step and long enough to wrap the ring of stages, one tile.
  struct Case {
    int64_t M, N, K;
  };
  for (const Case& cs : {Case{1096, 1160, 136}, Case{264, 520, 1000}, Case{40, 40, 64}}) {
    const int64_t M = cs.M, N = cs.N, K = cs.K;
    CAPTURE(M);
    CAPTURE(N);
    CAPTURE(K);
    Values v{-2, 2};
    auto a = input<DT, 2>(rng, {M, K}, Layout::transposed, v), dy = input<DT, 2>(rng, {K, N}, Layout::contiguous, v);
    Array scale;
    Array want_w = ref::matmul(a.a, dy.a, &scale);
    Array want_b = ref::sum(dy.a, {0}), bound_b = ref::sum(ref::map(dy.a, [](double t) { return std::fabs(t); }), {0});
    for (const GemmConfig& c : configs) {
      CAPTURE(c.str());
      GemmHook hook(c);
      Counters before = counters();
      auto [got_w, got_b] = kiln::eval(kiln::matmul(a.t, dy.t), kiln::sum(dy.t, 0));
      REQUIRE(!hook.seen.empty());
      const GemmProblem seen = hook.seen.at(0);  // NOTE: a copy: gemm_choose adds to hook.seen
      if (codegen::gemm_choose(seen) == c) CHECK(counters().kernels_launched - before.kernels_launched == 1);
      check_close(got_w, want_w, tol<DT>().scaled(2), "x.t() @ dy", &scale);
      check_close(got_b, want_b, tol<DT>().scaled(2), "sum(dy, 0)", &bound_b);
      // The same sums bit for bit on every run; the sum asked for first, the same (its rows
      // kernel first in the plan, still computed by the GEMM).
      before = counters();
      auto [again_b, again_w] = kiln::eval(kiln::sum(dy.t, 0), kiln::matmul(a.t, dy.t));
      if (codegen::gemm_choose(seen) == c) CHECK(counters().kernels_launched - before.kernels_launched == 1);
      CHECK(read(again_b).v == read(got_b).v);
      CHECK(read(again_w).v == read(got_w).v);
    }
  }
}

}  // TEST_SUITE("gpu")
