// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The GPU backend's cache-hit path (runtime/gpu_backend.hpp: a thread's last call of a
// plan keeps its variants and program) on a fake device API (support/fake_gpu.hpp), so
// it runs without a GPU: every call's launches — program, kernel, grid, block, shared
// memory and argument block — are what the uncached path (gpu_call, gpu_launch_shape,
// gpu_arg_block, the generator) gives for that call's own buffers, while a changed
// alignment, stride, shape, device, block-size override or GEMM chooser picks its own
// variant, and a repeat call loads nothing. In reduce-overhead mode the same launches come
// from a graph (the fake's keeps each node's arguments as a driver does): built once,
// replayed, a node updated where its arguments changed, rebuilt where a launch shape did.
#include <map>
#include <set>
#include <thread>

#include "../support/fake_gpu.hpp"
#include "../support/scratch_cache.hpp"
#include "../support/reference.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {

// A random f32 (or bf16) tensor on the CPU whatever the default device: the fake device reads CPU buffers.
template <class DT = f32, class S>
auto host(Rng& rng, S s) {
  return Tensor<DT, int(std::tuple_size_v<S>)>::from(s, random_array(rng, DT::id, dims(s)).v, cpu());
}

struct Dispatch {
  size_t loads = 0;  // programs the call loaded
  std::vector<codegen::GpuVariant> vars;
  const runtime::CompiledPlan* plan = nullptr;
  std::vector<std::pair<size_t, bool>> launches;  // each launch's kernel, and whether it is that GEMM's staging kernel
};

// Runs the expressions' fused plan through `backend` on fake device `ordinal` and checks
// each launch against the uncached path for the same bound buffers.
template <class... Es>
Dispatch dispatch_in(Mode mode, FakeGpuBackend& backend, int ordinal, const Es&... es) {
  ir::Graph g = ir::trace(es...);
  g.device.index = ordinal;
  auto cp = runtime::plan_for(g, mode);
  runtime::Bound b = runtime::bind_buffers(g, cp->plan);
  FakeGpuDevice& dev = FakeGpuApi::device(ordinal);
  const auto& p = dev.props;
  int warp = p.warp_size;
  runtime::GpuCall want = runtime::gpu_call(g, *cp, b, warp, p.cc_major * 10 + p.cc_minor, p.sm_count);
  std::vector<codegen::GpuProgramPart> parts = codegen::gpu_programs(codegen::GpuDialect::cuda, warp, g, cp->plan, want.vars);
  auto part_of = [&](size_t k) {
    return *std::find_if(parts.begin(), parts.end(), [&](const auto& part) {
      return std::find(part.kernels.begin(), part.kernels.end(), k) != part.kernels.end();
    });
  };
  // Each launch: its kernel, and whether it is that GEMM's staging kernel (GpuVariant::stage), which runs first.
  std::vector<std::pair<size_t, bool>> kernels;
  std::vector<std::vector<uint64_t>> blocks;
  dev.record_words.clear();
  // In launch order (kiln::idle_fill moves leaves; no vendor GEMM here).
  const runtime::StreamSchedule schedule = runtime::schedule_streams(cp->plan, want, std::vector<uint8_t>(cp->plan.kernels.size(), 0));
  for (size_t i = 0; i < cp->plan.kernels.size(); ++i) {
    const size_t k = schedule.at(i);
    if (!want.launches(k)) continue;  // empty, or computed by another kernel (a prologue, column sums)
    uint64_t ws[codegen::kGpuSplitWords] = {}, st[codegen::kGpuStageWords] = {};
    std::vector<uint64_t> block;
    runtime::gpu_arg_block(cp->layouts[k], want.args[k], want.vars[k], ws, st, block);
    // the backend's workspace and staging buffers: the argument block's last words
    block.resize(block.size() - (want.vars[k].workspace() ? codegen::kGpuSplitWords : 0) - (want.vars[k].stage ? codegen::kGpuStageWords : 0) -
                 (want.vars[k].total_kernel >= 0 ? codegen::kGpuSplitWords : 0));
    for (bool staging : {true, false}) {
      if (staging && !want.vars[k].stage) continue;
      kernels.push_back({k, staging});
      blocks.push_back(block);
      dev.record_words.push_back(block.size());
    }
  }
  size_t loads = dev.modules.size();
  auto c0 = counters();
  dev.clear_launched();
  dev.record = true;
  backend.run(g, *cp, b);
  dev.record = false;
  CHECK(counters().kernels_launched - c0.kernels_launched == kernels.size());
  REQUIRE(dev.launched.size() == kernels.size());
  for (size_t i = 0; i < kernels.size(); ++i) {
    const FakeGpuDevice::Launch& l = dev.launched[i];
    const auto [ki, staging] = kernels[i];
    const sched::Kernel& k = cp->plan.kernels[ki];
    runtime::GpuLaunch L = staging ? runtime::gpu_stage_launch(want.args[ki], want.vars[ki])
                                   : runtime::gpu_launch_shape(k, want.args[ki], want.vars[ki], p.sm_count, warp);
    CAPTURE(i);
    const bool gemm = k.kind == sched::KernelKind::matmul;  // its own program, the one kernel kiln_k0
    CHECK(l.module->source == part_of(ki).source);
    CHECK(l.name == (staging ? std::string("kiln_k0_stage") : gemm ? std::string("kiln_k0") : "kiln_k" + std::to_string(ki)));
    CHECK(std::tuple(l.grid.x, l.grid.y, l.grid.z) == std::tuple(L.grid.x, L.grid.y, L.grid.z));
    CHECK(std::tuple(l.block.x, l.block.y, l.block.z) == std::tuple(L.block.x, L.block.y, L.block.z));
    CHECK(l.shared_bytes == L.shared_bytes);
    CHECK(l.words == blocks[i]);  // this call's pointers, meta and scalars
  }
  return {dev.modules.size() - loads, want.vars, cp.get(), kernels};
}
// For a max-autotune test: device 0 as an sm_80 (a short list of candidates, all mma.sync), and
// no vendor GEMM offered, until the test ends.
struct Sm80 {
  FakeGpuDevice& d;
  explicit Sm80(FakeGpuDevice& dev) : d(dev) { d.props.cc_major = 8; }
  ~Sm80() { d.props.cc_major = 9, FakeGpuApi::library = false; }
};

template <class... Es>
Dispatch dispatch(FakeGpuBackend& backend, int ordinal, const Es&... es) {
  return dispatch_in(Mode::fused, backend, ordinal, es...);
}

}  // namespace

TEST_CASE("GPU dispatch: a repeat call loads nothing; a changed alignment, stride or shape picks its own variant") {
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  auto x = host(rng, Shape<1>{4099}), base = host(rng, Shape<1>{4100});
  Tensor<f32, 1> off = base.slice(0, 1, 4100);  // 4 bytes past an aligned start: no 16-byte vectors
  auto plus_one = [](const Tensor<f32, 1>& t) { return t + 1.0f; };

  Dispatch first = dispatch(backend, 0, plus_one(x));
  CHECK(first.loads == 1);
  CHECK(first.vars[0].vec == 4);
  Dispatch again = dispatch(backend, 0, plus_one(x));  // new output buffer, same variant
  CHECK(again.loads == 0);
  CHECK(again.plan == first.plan);
  Dispatch misaligned = dispatch(backend, 0, plus_one(off));
  CHECK(misaligned.plan == first.plan);  // the same plan: the variant alone changes
  CHECK(misaligned.loads == 1);
  CHECK(misaligned.vars[0].vec == 0);
  for (int round = 0; round < 2; ++round) {  // back and forth: each call its own variant, no new program
    CAPTURE(round);
    CHECK(dispatch(backend, 0, plus_one(x)).vars[0].vec == 4);
    CHECK(dispatch(backend, 0, plus_one(off)).vars[0].vec == 0);
  }
  CHECK(FakeGpuApi::device(0).modules.size() >= 2);

  // Strides: a transposed operand walks its innermost dim with a stride.
  auto a = host(rng, Shape<2>{33, 64}), at = host(rng, Shape<2>{64, 33}).transpose(0, 1);
  auto twice = [](const Tensor<f32, 2>& t) { return t * 2.0f; };
  Dispatch unit = dispatch(backend, 0, twice(a));
  Dispatch strided = dispatch(backend, 0, twice(at));
  CHECK(strided.plan == unit.plan);
  CHECK(unit.vars[0].strides[0] == codegen::Stride::unit);
  CHECK(strided.vars[0].strides[0] == codegen::Stride::any);
  CHECK(strided.loads == 1);
  CHECK(dispatch(backend, 0, twice(a)).loads == 0);
  CHECK(dispatch(backend, 0, twice(a)).vars[0].strides[0] == codegen::Stride::unit);

  // Shapes: short rows share a warp, long rows take a block each.
  auto short_rows = host(rng, Shape<2>{8, 64}), long_rows = host(rng, Shape<2>{8, 8192});
  auto row_sum = [](const Tensor<f32, 2>& t) { return sum(t, -1); };
  Dispatch s1 = dispatch(backend, 0, row_sum(short_rows));
  Dispatch l1 = dispatch(backend, 0, row_sum(long_rows));
  CHECK(l1.plan == s1.plan);
  CHECK(s1.vars[0].group > 0);
  CHECK(l1.vars[0].group == 0);
  CHECK(dispatch(backend, 0, row_sum(short_rows)).vars[0].group == s1.vars[0].group);
  CHECK(dispatch(backend, 0, row_sum(long_rows)).loads == 0);
}

TEST_CASE("GPU dispatch: column sums, aligned (16-byte chunks, rows split) and an unaligned view (a column per lane)") {
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  auto x = host(rng, Shape<2>{2048, 1024}), base = host(rng, Shape<2>{2048, 1025});
  Tensor<f32, 2> off = base.slice(1, 1, 1025);  // every row 4 bytes past a 16-byte boundary
  auto col_sum = [](const Tensor<f32, 2>& t) { return sum(t, 0); };
  Dispatch aligned = dispatch(backend, 0, col_sum(x));  // the split's workspace too
  CHECK(aligned.vars[0].cols);
  CHECK(aligned.vars[0].vec == 4);
  CHECK(aligned.vars[0].split);
  Dispatch unaligned = dispatch(backend, 0, col_sum(off));
  CHECK(unaligned.plan == aligned.plan);
  CHECK(unaligned.loads == 1);
  CHECK(unaligned.vars[0].cols);
  CHECK(unaligned.vars[0].vec == 0);
  CHECK(dispatch(backend, 0, col_sum(x)).loads == 0);
}

TEST_CASE("GPU dispatch: the block-size and keep overrides, a GEMM chooser, TF32 and another device are seen by a repeat call") {
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  auto rows = host(rng, Shape<2>{600, 2048});  // many rows: a block each, not split
  auto row_max = [](const Tensor<f32, 2>& t) { return amax(t, -1); };
  Dispatch chosen = dispatch(backend, 0, row_max(rows));
  REQUIRE(chosen.vars[0].group == 0);  // a block per row: the override applies
  REQUIRE(!chosen.vars[0].split);
  runtime::gpu_block_rows_threads() = chosen.vars[0].threads == 128 ? 512 : 128;
  Dispatch forced = dispatch(backend, 0, row_max(rows));
  CHECK(forced.vars[0].threads == runtime::gpu_block_rows_threads().load());
  CHECK(forced.loads == 1);
  runtime::gpu_block_rows_threads() = 0;
  CHECK(dispatch(backend, 0, row_max(rows)).vars[0].threads == chosen.vars[0].threads);

  // So is the L2 policy of rows kept in registers (GpuVariant::keep): each setting its own program.
  auto soft = [](const Tensor<f32, 2>& t) { return softmax(t, -1); };
  Dispatch kept = dispatch(backend, 0, soft(rows));
  REQUIRE(kept.vars[0].persist > 0);
  CHECK(kept.vars[0].keep);
  CHECK(FakeGpuApi::device(0).modules.back().source.find("kiln_load_vec_keep<4>(L0[k]") != std::string::npos);
  runtime::gpu_loads_keep() = -1;
  Dispatch plain_loads = dispatch(backend, 0, soft(rows));
  runtime::gpu_loads_keep() = 0;
  CHECK(!plain_loads.vars[0].keep);
  CHECK(plain_loads.loads == 1);
  CHECK(FakeGpuApi::device(0).modules.back().source.find("kiln_load_vec_keep<") == std::string::npos);
  Dispatch again = dispatch(backend, 0, soft(rows));
  CHECK(again.vars[0].keep);
  CHECK(again.loads == 0);
  // And loading the slots only the stores read with the row (GpuVariant::preload).
  runtime::gpu_rows_preload() = 1;
  Dispatch preloaded = dispatch(backend, 0, soft(rows));
  runtime::gpu_rows_preload() = 0;
  CHECK(preloaded.vars[0].preload);
  CHECK(preloaded.loads == 1);
  CHECK(!dispatch(backend, 0, soft(rows)).vars[0].preload);

  // A GEMM chooser hook decides what the inputs do not show.
  auto a = host<bf16>(rng, Shape<2>{128, 64}), b = host<bf16>(rng, Shape<2>{64, 128});
  auto mm = [](const Tensor<bf16, 2>& p, const Tensor<bf16, 2>& q) { return matmul(p, q); };
  Dispatch heuristic = dispatch(backend, 0, mm(a, b));
  REQUIRE(heuristic.vars.size() == 1);
  REQUIRE(heuristic.vars[0].gemm.kind != codegen::GemmKind::simt);  // tensor cores on sm_90
  codegen::gemm_chooser() = [](const codegen::GemmProblem&) { return std::optional(codegen::GemmConfig{}); };
  Dispatch simt = dispatch(backend, 0, mm(a, b));
  codegen::gemm_chooser() = nullptr;
  CHECK(simt.vars[0].gemm.kind == codegen::GemmKind::simt);
  CHECK(dispatch(backend, 0, mm(a, b)).vars[0].gemm.kind == heuristic.vars[0].gemm.kind);

  // So does TF32: an f32 matmul takes the tensor cores while it is allowed, f32 arithmetic after.
  auto fa = host(rng, Shape<2>{128, 64}), fb = host(rng, Shape<2>{64, 128});
  auto fmm = [](const Tensor<f32, 2>& p, const Tensor<f32, 2>& q) { return matmul(p, q); };
  Dispatch plain = dispatch(backend, 0, fmm(fa, fb));
  CHECK(plain.vars[0].gemm.kind == codegen::GemmKind::simt);
  {
    AllowTf32 on;
    Dispatch tf32 = dispatch(backend, 0, fmm(fa, fb));
    CHECK(tf32.plan == plain.plan);
    CHECK(tf32.loads == 1);
    CHECK(tf32.vars[0].gemm.kind == codegen::GemmKind::mma);
    CHECK(FakeGpuApi::device(0).modules.back().source.find("kiln_mma_tf32(") != std::string::npos);
    CHECK(dispatch(backend, 0, fmm(fa, fb)).loads == 0);
  }
  CHECK(dispatch(backend, 0, fmm(fa, fb)).vars[0].gemm.kind == codegen::GemmKind::simt);

  // Device 1: a 64-lane warp (as an AMD wavefront) gets its own program of the same plan.
  FakeGpuApi::device(1).props.warp_size = 64;
  auto x = host(rng, Shape<2>{8, 64});
  auto row_sum = [](const Tensor<f32, 2>& t) { return sum(t, -1); };
  Dispatch on0 = dispatch(backend, 0, row_sum(x));
  Dispatch on1 = dispatch(backend, 1, row_sum(x));
  CHECK(on1.plan == on0.plan);
  CHECK(on1.loads == 1);
  CHECK(FakeGpuApi::device(1).modules.back().source.find("#define KILN_WARP 64") != std::string::npos);
  CHECK(dispatch(backend, 0, row_sum(x)).loads == 0);
  CHECK(dispatch(backend, 1, row_sum(x)).loads == 0);
}

TEST_CASE("GPU dispatch: TF32 on sm_90 stages each operand wgmma cannot read (a kernel of its own, launched first), fused and in a graph") {
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  AllowTf32 on;
  // Tiles enough for the sm_90 heuristic's wgmma (128x256 over 132 SMs).
  auto x = host(rng, Shape<2>{2048, 512}), w = host(rng, Shape<2>{512, 2048});
  auto wt = host(rng, Shape<2>{2048, 512}), xt = host(rng, Shape<2>{512, 2048});
  auto mm = [](const Tensor<f32, 2>& p, const Tensor<f32, 2>& q) { return matmul(p, q); };
  struct Case {
    Tensor<f32, 2> a, b;
    uint8_t stage;
    int64_t tiles;  // the staging kernel's blocks: 32 x 32 tiles of each staged copy
  };
  for (const Case& c : {Case{x, w, 2, 64 * 16},                                    // B N-major (row-major W)
                        Case{x, wt.transpose(0, 1), 0, 0},                         // W [N, K] read as W.t(): K-major
                        Case{xt.transpose(0, 1), w, 3, 64 * 16 * 2},               // A M-major too
                        Case{xt.transpose(0, 1), wt.transpose(0, 1), 1, 64 * 16}}) {  // A alone
    CAPTURE(int(c.stage));
    Dispatch d = dispatch(backend, 0, mm(c.a, c.b));  // checks both launches: staging, then the GEMM
    REQUIRE(d.vars.size() == 1);
    const codegen::GpuVariant& v = d.vars[0];
    CHECK((v.gemm.kind == codegen::GemmKind::wgmma && v.gemm.bk == 32));
    CHECK(v.stage == c.stage);
    CHECK((v.gemm_ops.a_k_major && v.gemm_ops.b_k_major));  // what the GEMM reads: the copies
    const auto& launched = FakeGpuApi::device(0).launched;
    REQUIRE(launched.size() == (c.stage ? 2u : 1u));
    if (c.stage) CHECK(launched[0].grid.x == c.tiles);
    CHECK(dispatch(backend, 0, mm(c.a, c.b)).loads == 0);
  }
  // In a graph: the staging kernel is a node before its GEMM's; a repeat call updates neither.
  auto c0 = counters();
  for (int i = 0; i < 3; ++i) dispatch_in(Mode::reduce_overhead, backend, 0, mm(x, w));
  auto c1 = counters();
  CHECK(c1.graphs_built - c0.graphs_built == 1);
  CHECK(c1.graph_replays - c0.graph_replays == 3);
  CHECK(c1.graph_updates == c0.graph_updates);
  CHECK(c1.kernels_launched - c0.kernels_launched == 6);
  // Not allowed: f32 arithmetic, nothing staged.
  AllowTf32 off(false);
  Dispatch plain = dispatch(backend, 0, mm(x, w));
  CHECK((plain.vars[0].gemm.kind == codegen::GemmKind::simt && plain.vars[0].stage == 0));
}

TEST_CASE("GPU dispatch: many plans, other threads and a new backend each get their own programs") {
  KILN_TEST_RNG(rng);
  auto x = host(rng, Shape<1>{1000});
  {
    FakeGpuBackend backend;
    // More plans than a thread's table of recent calls has slots: colliding plans keep their own.
    auto run_all = [&] {
      size_t loads = 0;
      loads += dispatch(backend, 0, x + 1.0f).loads;
      loads += dispatch(backend, 0, x * 2.0f).loads;
      loads += dispatch(backend, 0, exp(x)).loads;
      loads += dispatch(backend, 0, log(x * x + 1.0f)).loads;
      loads += dispatch(backend, 0, sqrt(x * x)).loads;
      loads += dispatch(backend, 0, x - 3.0f).loads;
      loads += dispatch(backend, 0, sin(x)).loads;
      loads += dispatch(backend, 0, cos(x)).loads;
      loads += dispatch(backend, 0, tanh(x)).loads;
      loads += dispatch(backend, 0, sigmoid(x)).loads;
      loads += dispatch(backend, 0, abs(x)).loads;
      return loads;
    };
    CHECK(run_all() == 11);
    CHECK(run_all() == 0);
    std::thread([&] { CHECK(dispatch(backend, 0, x + 1.0f).loads == 0); }).join();  // a fresh thread's first call
  }
  // A backend made after another was destroyed (perhaps at its address) loads its own program.
  FakeGpuBackend second;
  CHECK(dispatch(second, 0, x + 1.0f).loads == 1);
  CHECK(dispatch(second, 0, x + 1.0f).loads == 0);
}

TEST_CASE("GPU dispatch: each GEMM of a plan is a program of its own (max-autotune's), the other kernels one") {
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  auto a = host<bf16>(rng, Shape<2>{256, 64}), w1 = host<bf16>(rng, Shape<2>{64, 128}), w2 = host<bf16>(rng, Shape<2>{128, 64});
  auto model = [](const Tensor<bf16, 2>& x, const Tensor<bf16, 2>& p, const Tensor<bf16, 2>& q) {
    return softmax(matmul(gelu(matmul(x, p)), q), -1);  // two GEMMs (gelu fused into the first), a rows kernel
  };
  Dispatch first = dispatch(backend, 0, model(a, w1, w2));
  CHECK(first.loads == 3);  // each GEMM alone, the rows kernel
  CHECK(dispatch(backend, 0, model(a, w1, w2)).loads == 0);
  // A GEMM's program is the plan of that one kernel, as max-autotune builds each candidate.
  ir::Graph g = ir::trace(model(a, w1, w2));
  auto cp = runtime::plan_for(g, Mode::fused);
  std::vector<codegen::GpuProgramPart> parts = codegen::gpu_programs(codegen::GpuDialect::cuda, 32, g, cp->plan, first.vars);
  REQUIRE(parts.size() == 3);
  for (const auto& part : parts) {
    if (cp->plan.kernels[part.kernels[0]].kind != sched::KernelKind::matmul) continue;
    size_t k = part.kernels[0];
    CHECK(part.source == FakeGpuBackend::source(g, codegen::gpu_single_kernel_plan(cp->plan, k), {first.vars[k]}, 32));
    CHECK(part.source.find("kiln_k0(") != std::string::npos);
  }
}

TEST_CASE("GPU dispatch: max-autotune times each GEMM candidate twice, each run alone after a cache flush") {
  ScratchCache cache;  // an empty tuning database: this call tunes
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  auto a = host<bf16>(rng, Shape<2>{256, 64}), w = host<bf16>(rng, Shape<2>{64, 128});
  ir::Graph g = ir::trace(matmul(a, w));
  auto cp = runtime::plan_for(g, Mode::max_autotune);
  runtime::Bound b = runtime::bind_buffers(g, cp->plan);
  FakeGpuDevice& dev = FakeGpuApi::device(0);
  Sm80 sm80(dev);
  const auto& p = dev.props;
  runtime::GpuCall call = runtime::gpu_call(g, *cp, b, p.warp_size, p.cc_major * 10 + p.cc_minor, p.sm_count);
  codegen::GemmProblem problem = runtime::gemm_problem(g, cp->plan.kernels[0], call.args[0], p.cc_major * 10 + p.cc_minor, p.sm_count);
  std::vector<codegen::GemmConfig> runnable = codegen::gemm_tuning_candidates(problem);
  size_t candidates = runnable.size();
  REQUIRE(candidates > 1);
  int f0 = FakeGpuApi::flushes, t0 = FakeGpuApi::timed;
  size_t l0 = dev.launches;
  Counters c0 = counters();
  FakeGpuApi::compiled_ahead.clear();
  backend.run(g, *cp, b);
  CHECK(counters().tunings - c0.tunings == 1);
  // Every candidate's program compiled first, side by side, once: the plan's own (the
  // heuristic's config) is one of them.
  CHECK(FakeGpuApi::compiled_ahead.size() == candidates);
  CHECK(std::set<std::string>(FakeGpuApi::compiled_ahead.begin(), FakeGpuApi::compiled_ahead.end()).size() == candidates);
  // Per candidate: twice (in order, in reverse), a warm-up then seven runs, each flushed and timed alone.
  // Every candidate took 1 ms: the first of them (the best-known) won, which is not the
  // heuristic's choice here, so the whole plan then ran both ways, five times each (timed, not flushed).
  const std::string heuristic = call.vars[0].gemm.str();
  REQUIRE(heuristic != runnable.front().str());
  CHECK(FakeGpuApi::flushes - f0 == int(2 * 7 * candidates));
  CHECK(FakeGpuApi::timed - t0 == int(2 * 7 * candidates) + 10);
  // Besides those, the plan ran as the heuristic chose (so that the candidates are timed on
  // the values the call computes), both ways to validate, then as tuned.
  CHECK(dev.launches - l0 == 2 * 8 * candidates + 1 + 10 + 1);
  // The plan was no faster with the tuned choice (1 ms either way): the heuristic's is stored.
  auto stored = tune::db().find(runtime::matmul_tune_key(g, cp->plan.kernels[0], cp->layouts[0], problem, "", "sm_80"));
  REQUIRE(stored);
  CHECK(stored->choice == heuristic);
  // The tuned plan ran as a graph (as torch.compile's max-autotune runs): built once.
  CHECK(counters().graphs_built - c0.graphs_built == 1);
  int t1 = FakeGpuApi::timed;
  FakeGpuApi::compiled_ahead.clear();
  Counters c1 = counters();
  backend.run(g, *cp, b);  // a database hit: nothing timed or compiled ahead; the graph replayed
  CHECK(FakeGpuApi::timed == t1);
  CHECK(FakeGpuApi::compiled_ahead.empty());
  CHECK(counters().graphs_built == c1.graphs_built);
  CHECK(counters().graph_replays - c1.graph_replays == 1);

  // A plan with a kernel besides the matmul: that kernel's program compiles with the candidates.
  auto w2 = host<bf16>(rng, Shape<2>{64, 512});  // another shape class: tuned afresh
  ir::Graph g2 = ir::trace(sum(matmul(a, w2), -1));
  auto cp2 = runtime::plan_for(g2, Mode::max_autotune);
  REQUIRE(cp2->plan.kernels.size() == 2);
  runtime::Bound b2 = runtime::bind_buffers(g2, cp2->plan);
  runtime::GpuCall call2 = runtime::gpu_call(g2, *cp2, b2, p.warp_size, p.cc_major * 10 + p.cc_minor, p.sm_count);
  size_t mm = cp2->plan.kernels[0].kind == sched::KernelKind::matmul ? 0 : 1;
  codegen::GemmProblem problem2 = runtime::gemm_problem(g2, cp2->plan.kernels[mm], call2.args[mm], p.cc_major * 10 + p.cc_minor, p.sm_count);
  FakeGpuApi::compiled_ahead.clear();
  backend.run(g2, *cp2, b2);
  const auto& ahead = FakeGpuApi::compiled_ahead;
  CHECK(ahead.size() == codegen::gemm_tuning_candidates(problem2).size() + 1);
  CHECK(std::set<std::string>(ahead.begin(), ahead.end()).size() == ahead.size());
  for (const auto& part : codegen::gpu_programs(codegen::GpuDialect::cuda, 32, g2, cp2->plan, call2.vars))
    if (cp2->plan.kernels[part.kernels[0]].kind != sched::KernelKind::matmul)
      CHECK(std::find(ahead.begin(), ahead.end(), part.source) != ahead.end());
}

TEST_CASE("GPU dispatch: max-autotune's tuned calls replay a graph, but where a GEMM went to the vendor library") {
  ScratchCache cache;  // an empty tuning database: the first call of each plan tunes
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  auto a = host<bf16>(rng, Shape<2>{256, 64}), w = host<bf16>(rng, Shape<2>{64, 128});
  FakeGpuDevice& dev = FakeGpuApi::device(0);
  Sm80 sm80(dev);
  auto calls = [&](const auto& e) {
    ir::Graph g = ir::trace(e);
    auto cp = runtime::plan_for(g, Mode::max_autotune);
    runtime::Bound b = runtime::bind_buffers(g, cp->plan);
    Counters c0 = counters();
    for (int i = 0; i < 3; ++i) backend.run(g, *cp, b);
    Counters c1 = counters();
    return std::array<uint64_t, 4>{c1.tunings - c0.tunings, c1.graphs_built - c0.graphs_built, c1.graph_replays - c0.graph_replays,
                                   c1.kernels_launched - c0.kernels_launched};
  };
  // kiln's kernels: tuned once, then the tuned plan built into a graph and replayed.
  auto [tunings, built, replays, launched] = calls(matmul(a, w));
  CHECK(tunings == 1);
  CHECK(built == 1);
  CHECK(replays == 3);
  // The vendor library offered, and faster: its GEMM is no kernel node, so each call launches
  // kernel by kernel (the library's call among them), no graph.
  FakeGpuApi::library = true;
  auto w2 = host<bf16>(rng, Shape<2>{64, 512});  // another shape class: tuned afresh
  auto [lib_tunings, lib_built, lib_replays, lib_launched] = calls(matmul(a, w2));
  CHECK(lib_tunings == 1);
  CHECK(lib_built == 0);
  CHECK(lib_replays == 0);
  CHECK(lib_launched >= 3);  // each call's library GEMM (and the tuning's plan run)
  (void)launched;
  // The library's GEMM fast alone (0.5 ms after a flush) but slow in the plan (2 ms, as cuBLASLt's
  // was in the W4 step on an H200): tuning picks it, the plan's validation puts the heuristic's
  // config back and stores that, and the calls replay a graph of kiln's kernels.
  FakeGpuApi::library_in_plan_ms = 2.0f;
  auto w3 = host<bf16>(rng, Shape<2>{64, 2048});  // another shape class again
  auto [slow_tunings, slow_built, slow_replays, slow_launched] = calls(matmul(a, w3));
  FakeGpuApi::library_in_plan_ms = 0.5f;
  FakeGpuApi::library = false;
  CHECK(slow_tunings == 1);
  CHECK(slow_built == 1);
  CHECK(slow_replays == 3);
  (void)slow_launched;
}

TEST_CASE("GPU dispatch: max-autotune's repeat calls keep their choices until the tuning database moves") {
  ScratchCache cache;  // an empty tuning database: the first call tunes
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  auto a = host<bf16>(rng, Shape<2>{256, 64}), w = host<bf16>(rng, Shape<2>{64, 128}), v = host<bf16>(rng, Shape<2>{128, 96});
  FakeGpuDevice& dev = FakeGpuApi::device(0);
  Sm80 sm80(dev);
  ir::Graph g = ir::trace(matmul(relu(matmul(a, w)), v));  // two GEMMs, two keys
  auto cp = runtime::plan_for(g, Mode::max_autotune);
  runtime::Bound b = runtime::bind_buffers(g, cp->plan);
  auto call = [&] {
    Counters c0 = counters();
    dev.clear_launched();
    dev.record = true;
    backend.run(g, *cp, b);
    dev.record = false;
    Counters c1 = counters();
    std::vector<std::string> names;
    for (const auto& l : dev.launched) names.push_back(l.module->source);
    return std::tuple{c1.tunings - c0.tunings, c1.tune_db_hits - c0.tune_db_hits, names};
  };
  auto [tuned, hits, first] = call();
  CHECK(tuned == 2);
  // The tunings stored entries, so the next call looks its keys up again.
  auto [tuned2, hits2, second] = call();
  CHECK(tuned2 == 0);
  CHECK(hits2 >= 2);
  // Nothing moved since: the third call keeps the second's choices and programs, looks nothing up.
  auto [tuned3, hits3, third] = call();
  CHECK(tuned3 == 0);
  CHECK(hits3 == 0);
  CHECK(third == second);
  // The database cleared (as another process's entries might have come in): looked up again.
  tune::db().clear_memory();
  auto [tuned4, hits4, fourth] = call();
  CHECK(tuned4 == 0);
  CHECK(hits4 == hits2);
  CHECK(fourth == second);
  CHECK(first.size() > second.size());  // the tuning's runs of each candidate
}

TEST_CASE("GPU dispatch: max-autotune's check on the plan puts back only the choices this call tuned, never a database hit's") {
  ScratchCache cache;
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  FakeGpuDevice& dev = FakeGpuApi::device(0);
  Sm80 sm80(dev);
  const auto& p = dev.props;
  const int arch = p.cc_major * 10 + p.cc_minor;
  FakeGpuApi::library = true;
  auto a = host<bf16>(rng, Shape<2>{256, 64}), w1 = host<bf16>(rng, Shape<2>{64, 128}), w2 = host<bf16>(rng, Shape<2>{64, 1024});
  // The key of each matmul kernel of a plan, and the heuristic's config for it.
  auto keys = [&](const ir::Graph& g, const runtime::CompiledPlan& cp, const runtime::Bound& b) {
    runtime::GpuCall call = runtime::gpu_call(g, cp, b, p.warp_size, arch, p.sm_count);
    std::vector<std::pair<tune::Key, std::string>> out;
    for (size_t k = 0; k < cp.plan.kernels.size(); ++k) {
      if (cp.plan.kernels[k].kind != sched::KernelKind::matmul) continue;
      codegen::GemmProblem q = runtime::gemm_problem(g, cp.plan.kernels[k], call.args[k], arch, p.sm_count);
      out.push_back({runtime::matmul_tune_key(g, cp.plan.kernels[k], cp.layouts[k], q, FakeGpuApi::kLibraryGemm, "sm_80"),
                     call.vars[k].gemm.str()});
    }
    return out;
  };
  // a @ w1 alone, the library as fast in the plan as alone: tuned to it, and kept.
  ir::Graph g1 = ir::trace(matmul(a, w1));
  auto cp1 = runtime::plan_for(g1, Mode::max_autotune);
  runtime::Bound b1 = runtime::bind_buffers(g1, cp1->plan);
  backend.run(g1, *cp1, b1);
  auto k1 = keys(g1, *cp1, b1);
  REQUIRE(k1.size() == 1);
  REQUIRE(tune::db().find(k1[0].first));
  CHECK(tune::db().find(k1[0].first)->choice == FakeGpuApi::kLibraryGemm);
  // Then a plan of a @ w2 (a new key) and a @ w1 (a hit), the library slow in a plan: the new
  // key's tuned choice (the library) goes back to the heuristic's; the hit keeps its entry.
  FakeGpuApi::library_in_plan_ms = 2.0f;
  ir::Graph g2 = ir::trace(matmul(a, w2), matmul(a, w1));
  auto cp2 = runtime::plan_for(g2, Mode::max_autotune);
  runtime::Bound b2 = runtime::bind_buffers(g2, cp2->plan);
  auto k2 = keys(g2, *cp2, b2);
  REQUIRE(k2.size() == 2);
  Counters c0 = counters();
  backend.run(g2, *cp2, b2);
  FakeGpuApi::library_in_plan_ms = 0.5f;
  FakeGpuApi::library = false;
  CHECK(counters().tunings - c0.tunings == 1);
  for (const auto& [key, heuristic] : k2) {
    auto e = tune::db().find(key);
    REQUIRE(e);
    if (key.text() == k1[0].first.text()) CHECK(e->choice == FakeGpuApi::kLibraryGemm);
    else CHECK(e->choice == heuristic);
  }
}

TEST_CASE("GPU dispatch, reduce-overhead: one graph, replayed; nodes updated for new buffers; rebuilt for new launch shapes") {
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  // Three kernels: a GEMM with its epilogue, the rows of a softmax, a pointwise with a sum.
  auto layer = [](const Tensor<f32, 2>& x, const Tensor<f32, 2>& w, const Tensor<f32, 1>& b) {
    return std::tuple(softmax(relu(matmul(x, w) + b), -1), sum(x * 2.0f, 0));
  };
  auto w = host(rng, Shape<2>{96, 72}), x = host(rng, Shape<2>{40, 96}), x2 = host(rng, Shape<2>{40, 96});
  auto b = host(rng, Shape<1>{72});
  auto run = [&](const Tensor<f32, 2>& in) {
    auto [y, s] = layer(in, w, b);
    return dispatch_in(Mode::reduce_overhead, backend, 0, y, s);
  };
  auto c0 = counters();
  Dispatch first = run(x);
  auto c1 = counters();
  REQUIRE(FakeGpuApi::device(0).launched.size() >= 2);
  CHECK(c1.graphs_built - c0.graphs_built == 1);
  CHECK(c1.graph_replays - c0.graph_replays == 1);
  CHECK(c1.graph_updates == c0.graph_updates);
  for (int i = 0; i < 3; ++i) CHECK(run(x).loads == 0);  // dispatch() checks each replay's launches
  auto c2 = counters();
  CHECK(c2.graphs_built == c1.graphs_built);
  CHECK(c2.graph_replays - c1.graph_replays == 3);
  // The plan's buffers come back in the same order: a repeat call changes no argument.
  CHECK(c2.graph_updates == c1.graph_updates);
  // Another input: the nodes that read it are updated, nothing rebuilt.
  run(x2);
  auto c3 = counters();
  CHECK(c3.graphs_built == c2.graphs_built);
  CHECK(c3.graph_updates > c2.graph_updates);
  CHECK(c3.graph_updates - c2.graph_updates < FakeGpuApi::device(0).launched.size() + 1);
  // Other sizes: other grids, a new graph; then back again (the graph holds one set of shapes).
  auto big = host(rng, Shape<2>{1000, 96});
  run(big);
  CHECK(counters().graphs_built == c3.graphs_built + 1);
  run(x);
  CHECK(counters().graphs_built == c3.graphs_built + 2);
  // Fused mode of the same expressions launches kernel by kernel: no graph.
  auto c4 = counters();
  auto [y, s] = layer(x, w, b);
  dispatch(backend, 0, y, s);
  CHECK(counters().graph_replays == c4.graph_replays);
  CHECK(first.plan != nullptr);
}

TEST_CASE("GPU dispatch, reduce-overhead: many plans called in turn each keep their graph, replayed; none rebuilt") {
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  auto x = host(rng, Shape<1>{1000});
  // Sixteen plans, twice the recent-calls table of a thread: slots collide, entries must not.
  auto run_all = [&] {
    auto run = [&](const auto& e) { dispatch_in(Mode::reduce_overhead, backend, 0, e); };
    run(x + 1.0f), run(x * 2.0f), run(exp(x)), run(log(x * x + 1.0f)), run(sqrt(x * x)), run(x - 3.0f), run(sin(x)), run(cos(x));
    run(tanh(x)), run(sigmoid(x)), run(abs(x)), run(relu(x)), run(x * x), run(exp(x) + 1.0f), run(sin(x) * 2.0f), run(-x);
  };
  auto c0 = counters();
  run_all();
  auto c1 = counters();
  CHECK(c1.graphs_built - c0.graphs_built == 16);
  for (int i = 0; i < 3; ++i) run_all();  // dispatch_in checks every replay's launches
  auto c2 = counters();
  CHECK(c2.graphs_built == c1.graphs_built);
  CHECK(c2.graph_replays - c1.graph_replays == 3 * 16);
  CHECK(c2.graph_updates == c1.graph_updates);
}

TEST_CASE("GPU dispatch, reduce-overhead: a graph the driver fails to build is an error; the next call builds it and runs right") {
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  auto x = host(rng, Shape<2>{40, 96}), w = host(rng, Shape<2>{96, 72});
  auto e = softmax(matmul(x, w), -1);
  dispatch_in(Mode::reduce_overhead, backend, 0, e);  // built and replayed
  auto big = host(rng, Shape<2>{700, 96});            // new grids: a build, which fails
  auto e2 = softmax(matmul(big, w), -1);
  ir::Graph g = ir::trace(e2);
  auto cp = runtime::plan_for(g, Mode::reduce_overhead);
  runtime::Bound b = runtime::bind_buffers(g, cp->plan);
  FakeGpuApi::Graph::fail_builds = 1;
  auto c0 = counters();
  CHECK_THROWS_WITH_AS(backend.run(g, *cp, b), doctest::Contains("cuGraphInstantiate failed"), kiln::Error);
  CHECK(counters().graphs_built == c0.graphs_built);
  CHECK(counters().graph_replays == c0.graph_replays);
  // Nothing half-built is kept: the next calls build the graph and replay this call's launches.
  dispatch_in(Mode::reduce_overhead, backend, 0, e2);
  dispatch_in(Mode::reduce_overhead, backend, 0, e2);
  CHECK(counters().graphs_built == c0.graphs_built + 1);
  CHECK(counters().graph_replays == c0.graph_replays + 2);
  // A node update that fails: the graph is dropped, so the next call does not replay a node
  // whose record took the failed call's arguments but whose graph did not.
  auto other = host(rng, Shape<2>{700, 96});  // a new input: an update
  auto e3 = softmax(matmul(other, w), -1);
  auto c1 = counters();
  {  // its buffers go back first, so the next call gets the same ones
    ir::Graph g3 = ir::trace(e3);
    runtime::Bound b3 = runtime::bind_buffers(g3, cp->plan);
    FakeGpuApi::Graph::fail_updates = 1;
    CHECK_THROWS_WITH_AS(backend.run(g3, *cp, b3), doctest::Contains("SetParams failed"), kiln::Error);
  }
  dispatch_in(Mode::reduce_overhead, backend, 0, e3);  // checks every launch's words against this call's
  CHECK(counters().graphs_built == c1.graphs_built + 1);
}

namespace {
// Every launch of `d` (the last call on `dev`) starts after every launch of each kernel its
// kernel reads, as the fake driver orders them (streams, events, graph edges).
void check_ordered(const Dispatch& d, const FakeGpuDevice& dev) {
  const auto& kernels = d.plan->plan.kernels;
  REQUIRE(dev.launched.size() == d.launches.size());
  std::vector<std::vector<size_t>> launches_of(kernels.size());
  for (size_t i = 0; i < d.launches.size(); ++i) launches_of[d.launches[i].first].push_back(i);
  for (size_t i = 0; i < d.launches.size(); ++i) {
    const auto& after = dev.launched[i].after;
    auto ran_before = [&](size_t j) { return std::find(after.begin(), after.end(), j) != after.end(); };
    const auto [k, staging] = d.launches[i];
    CAPTURE(i);
    CAPTURE(k);
    // Its dependencies' launches; through a kernel not launched (a prologue or a rows kernel
    // that a GEMM computes), that kernel's own, and the GEMM's that computes it.
    std::vector<int> deps = kernels[k].deps;
    while (!deps.empty()) {
      const int dep = deps.back();
      deps.pop_back();
      if (launches_of[size_t(dep)].empty()) deps.insert(deps.end(), kernels[size_t(dep)].deps.begin(), kernels[size_t(dep)].deps.end());
      for (size_t g = 0; g < d.vars.size(); ++g)
        if (d.vars[g].colsum_kernel == dep || d.vars[g].total_kernel == dep)
          for (size_t j : launches_of[g]) CHECK(ran_before(j));
      for (size_t j : launches_of[size_t(dep)]) CHECK(ran_before(j));
    }
    if (!staging && d.vars[k].stage) CHECK(ran_before(i - 1));  // the GEMM after its staging kernel
  }
}
// Runs `step` in fused mode on fake device 0, recording, with its launch `fail` (counted from 0)
// failing as a driver's may: the error reaches the caller.
template <class Step>
void run_failing(FakeGpuBackend& backend, const Step& step, size_t fail) {
  FakeGpuDevice& dev = FakeGpuApi::device(0);
  dev.clear_launched();
  dev.record = true;
  dev.fail_launch = dev.launches + fail;
  ir::Graph g = std::apply([](const auto&... o) { return ir::trace(o...); }, step);
  auto cp = runtime::plan_for(g, Mode::fused);
  runtime::Bound b = runtime::bind_buffers(g, cp->plan);
  CHECK_THROWS_WITH_AS(backend.run(g, *cp, b), doctest::Contains("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"), Error);
  dev.fail_launch = size_t(-1);
  dev.record = false;
}
struct OverlapOff {
  OverlapOff() { set_kernel_overlap(false); }
  ~OverlapOff() { set_kernel_overlap(true); }
};
// kiln::gemm_operand_sums on for the scope (off by default).
struct OperandSumsOn {
  OperandSumsOn() { set_gemm_operand_sums(true); }
  ~OperandSumsOn() { set_gemm_operand_sums(false); }
};
// kiln::gemm_totals off for the scope (on by default): W4's loss a rows kernel of its own.
struct TotalsOff {
  const bool was = gemm_totals();
  TotalsOff() { set_gemm_totals(false); }
  ~TotalsOff() { set_gemm_totals(was); }
};
// W4's step (bench/w4.hpp) on random host tensors: (loss, dx, dW1, db1, dW2, db2).
auto w4_step(Rng& rng, int64_t M, int64_t K, int64_t H) {
  auto x = host<bf16>(rng, Shape<2>{M, K}), W1 = host<bf16>(rng, Shape<2>{K, H}), W2 = host<bf16>(rng, Shape<2>{H, K});
  auto b1 = host<bf16>(rng, Shape<1>{H}), b2 = host<bf16>(rng, Shape<1>{K});
  auto yf = cast<f32>(matmul(gelu(matmul(x, W1) + b1), W2) + b2);
  auto loss = mean(yf * yf);
  auto [gx, gW1, gb1, gW2, gb2] = kiln::grad(loss, x, W1, b1, W2, b2);
  return std::tuple{loss, gx, gW1, gb1, gW2, gb2};
}
// A step's outputs in fused mode through the fake device 0 (an sm_90), its launches checked in order.
template <class Step>
Dispatch w4_dispatch(FakeGpuBackend& backend, const Step& st) {
  Dispatch d = std::apply([&](const auto&... o) { return dispatch(backend, 0, o...); }, st);
  check_ordered(d, FakeGpuApi::device(0));
  return d;
}
}  // namespace

TEST_CASE("GPU dispatch: with column sums in the GEMMs (kiln::gemm_column_sums) W4's step launches two kernels fewer, in order") {
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  FakeGpuDevice& dev = FakeGpuApi::device(0);  // an sm_90: wgmma GEMMs
  TotalsOff rows_loss;  // the sums alone
  const auto st = w4_step(rng, 2048, 2048, 4096);
  Dispatch off = w4_dispatch(backend, st);
  set_gemm_column_sums(true);
  Dispatch on = w4_dispatch(backend, st);  // a repeat call: the switch is among its inputs
  set_gemm_column_sums(false);
  CHECK(on.launches.size() + 2 == off.launches.size());
  int sums = 0, skipped = 0;
  const auto& kernels = on.plan->plan.kernels;
  for (size_t k = 0; k < kernels.size(); ++k) {
    if (const int r = on.vars[k].colsum_kernel; r >= 0) {
      ++sums;
      CHECK(kernels[k].kind == sched::KernelKind::matmul);
      CHECK(on.vars[size_t(r)].skip);
      CHECK(kernels[size_t(r)].kind == sched::KernelKind::rows);
      CHECK(on.vars[k].gemm.kind == codegen::GemmKind::wgmma);
    }
    skipped += on.vars[k].skip;
  }
  CHECK(sums == 2);  // db1 and db2: the GEMMs storing dh and dy sum them
  CHECK(skipped == 2);
  // Their workspace is the kernel's own: a GEMM that sums still runs beside other kernels.
  CHECK(std::count_if(dev.launched.begin(), dev.launched.end(), [](const auto& l) { return l.stream == 1; }) >= 2);
}

TEST_CASE("GPU dispatch: with totals in the GEMMs (kiln::gemm_totals) W4's step launches one kernel fewer: the loss in y's GEMM") {
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  const auto st = w4_step(rng, 2048, 2048, 4096);
  REQUIRE(gemm_totals());  // on by default
  set_gemm_totals(false);
  Dispatch off = w4_dispatch(backend, st);
  set_gemm_totals(true);
  Dispatch on = w4_dispatch(backend, st);  // a repeat call: the switch is among its inputs
  CHECK(on.launches.size() + 1 == off.launches.size());
  const auto& kernels = on.plan->plan.kernels;
  int totals = 0;
  for (size_t k = 0; k < kernels.size(); ++k) {
    const int r = on.vars[k].total_kernel;
    if (r < 0) continue;
    ++totals;
    CHECK(kernels[k].kind == sched::KernelKind::matmul);
    CHECK(on.vars[k].gemm.kind == codegen::GemmKind::wgmma);
    CHECK(on.vars[size_t(r)].skip);
    CHECK(on.vars[k].total_words == 1);  // the mean's scale
    // The loss's kernel reads exactly the matrix this GEMM stores.
    REQUIRE(kernels[size_t(r)].loads.size() == 1);
    const int y = kernels[size_t(r)].loads[0];
    CHECK(std::any_of(kernels[k].stores.begin(), kernels[k].stores.end(), [&](const sched::Store& s) { return s.buffer == y; }));
  }
  CHECK(totals == 1);
  // Only the loss's kernel is skipped.
  CHECK(std::count_if(on.vars.begin(), on.vars.end(), [](const codegen::GpuVariant& v) { return v.skip; }) == 1);
  // With kiln::idle_fill too, the leaves left (db1, db2) still follow the GEMMs that make what they read.
  set_idle_fill(true);
  Dispatch fill = w4_dispatch(backend, st);
  set_idle_fill(false);
  const FakeGpuDevice& dev = FakeGpuApi::device(0);
  CHECK(std::count_if(dev.launched.begin(), dev.launched.end(), [](const auto& l) { return l.stream == 2; }) == 2);
}

TEST_CASE("GPU dispatch: with B's column sums in the GEMMs (kiln::gemm_operand_sums) W4's step launches two kernels fewer; "
          "what reads such a sum runs after that GEMM") {
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  FakeGpuDevice& dev = FakeGpuApi::device(0);  // an sm_90: wgmma GEMMs
  const auto st = w4_step(rng, 2048, 2048, 4096);
  Dispatch off = w4_dispatch(backend, st);
  OperandSumsOn sums_on;
  Dispatch on = w4_dispatch(backend, st);  // a repeat call: the switch is among its inputs
  CHECK(on.launches.size() + 2 == off.launches.size());
  const auto& kernels = on.plan->plan.kernels;
  int sums = 0;
  for (size_t k = 0; k < kernels.size(); ++k)
    if (const int r = on.vars[k].colsum_kernel; r >= 0) {
      ++sums;
      CHECK(on.vars[k].colsum_of_b);
      CHECK(on.vars[k].colsum_slot == 1);
      CHECK(!on.vars[k].workspace());
      CHECK(on.vars[size_t(r)].skip);
      CHECK(size_t(r) > k);  // the sum after its GEMM in the plan
    }
  CHECK(sums == 2);  // db1 and db2, by the GEMMs of dW1 = x.t() @ dh and dW2 = h.t() @ dy

  // A large kernel that reads such a sum (z = q * db, [3000, N]: not the sum's own domain, so
  // a kernel of its own) reads nothing the rows kernel depended on (dy is an input): with the
  // rows kernel not launched it still waits for the GEMM that computes the sum.
  auto xa = host<bf16>(rng, Shape<2>{2048, 1024}), dy = host<bf16>(rng, Shape<2>{2048, 4096}), q = host<bf16>(rng, Shape<2>{3000, 4096});
  auto db = kiln::sum(dy, 0);
  Dispatch d = dispatch(backend, 0, matmul(xa.transpose(0, 1), dy), q * db);
  check_ordered(d, dev);
  REQUIRE(d.launches.size() == 2);
  CHECK(d.vars[d.launches[0].first].colsum_of_b);
  CHECK(dev.launched[1].after.size() == 1);

  // max-autotune times each candidate with the sums where its config takes them (the
  // destination linked), and the tuned plan computes them still.
  ScratchCache cache;  // an empty tuning database: the first call tunes
  ir::Graph g = ir::trace(matmul(xa.transpose(0, 1), dy), db);
  auto cp = runtime::plan_for(g, Mode::max_autotune);
  runtime::Bound b = runtime::bind_buffers(g, cp->plan);
  Counters c0 = counters();
  backend.run(g, *cp, b);
  CHECK(counters().tunings - c0.tunings == 1);
  c0 = counters();
  backend.run(g, *cp, b);  // a database hit
  CHECK(counters().tunings == c0.tunings);
  CHECK(counters().kernels_launched - c0.kernels_launched == 1);  // the GEMM alone: the heuristic's config sums
}

TEST_CASE("GPU dispatch: with a split tail (kiln::gemm_split_tail) the GEMMs whose last wave is partial cut it in K; each stream's "
          "GEMMs use that stream's workspace") {
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  FakeGpuDevice& dev = FakeGpuApi::device(0);  // an sm_90 of 132 SMs: persistent wgmma GEMMs
  // x [2048, 2048], W1 [2048, 4352]: x @ W1, dy @ W2.t(), dW1 and dW2 are 272 tiles of 128 x 256
  // in clusters of two (136 cluster tiles on 66 clusters: 4 past two waves, 32 K steps), cut;
  // h @ W2 and dx are 128 tiles (one partial wave, nothing after it), not.
  const auto st = w4_step(rng, 2048, 2048, 4352);
  REQUIRE(!gemm_split_tail());  // off by default
  Dispatch off = w4_dispatch(backend, st);
  struct SplitTail {
    SplitTail() { set_gemm_split_tail(true); }
    ~SplitTail() { set_gemm_split_tail(false); }
  };
  SplitTail on_scope;
  Dispatch on = w4_dispatch(backend, st);  // the launches checked, the workspaces grown
  CHECK(on.launches.size() == off.launches.size());
  // The same call again, each argument block recorded with its workspace's two words.
  ir::Graph g = std::apply([](const auto&... o) { return ir::trace(o...); }, st);
  auto cp = runtime::plan_for(g, Mode::fused);
  runtime::Bound b = runtime::bind_buffers(g, cp->plan);
  for (size_t i = 0; i < on.launches.size(); ++i)
    if (on.vars[on.launches[i].first].workspace()) dev.record_words[i] += codegen::kGpuSplitWords;
  dev.clear_launched();
  dev.record = true;
  backend.run(g, *cp, b);
  dev.record = false;
  REQUIRE(dev.launched.size() == on.launches.size());
  const auto& kernels = on.plan->plan.kernels;
  int split = 0;
  std::map<int, std::set<uint64_t>> ws_by_stream;  // each stream's workspace (its partials' address), as its kernels have it
  for (size_t i = 0; i < on.launches.size(); ++i) {
    const size_t k = on.launches[i].first;
    const codegen::GpuVariant& v = on.vars[k];
    const auto& L = dev.launched[i];
    if (v.workspace()) ws_by_stream[L.stream].insert(L.words[L.words.size() - codegen::kGpuSplitWords]);
    if (kernels[k].kind != sched::KernelKind::matmul) continue;
    CAPTURE(k);
    CHECK(!off.vars[k].gemm.split_tail);
    REQUIRE(v.gemm.persistent);
    // The heuristic's split where the walk finds a cut that pays; the kernel then has a workspace.
    CHECK(v.workspace() == v.gemm.split_tail);
    if (!v.gemm.split_tail) {
      CHECK(v.gemm == off.vars[k].gemm);
      continue;
    }
    ++split;
    CHECK(v.gemm.cluster == 2);
    CHECK(L.grid.x == 132);
    codegen::GemmConfig whole = v.gemm;
    whole.split_tail = false;
    // A split tail walks its units in its own order: no serpentine (the whole tiles' default).
    CHECK(!whole.serpentine);
    CHECK(off.vars[k].gemm.serpentine);
    whole.serpentine = true;
    CHECK(whole == off.vars[k].gemm);
  }
  CHECK(split == 4);
  // Each stream's kernels share its workspace; no two streams share one.
  std::set<uint64_t> all;
  for (const auto& [stream, ws] : ws_by_stream) {
    CAPTURE(stream);
    CHECK(ws.size() == 1);
    all.insert(ws.begin(), ws.end());
  }
  CHECK(all.size() == ws_by_stream.size());
  CHECK(ws_by_stream.size() == 2);  // split GEMMs on the side stream too (kiln::kernel_overlap)
  // The workspace a split GEMM asks for: a tile of floats for each piece that hands its sums
  // over, per block of a cluster (KilnWalk::slots).
  codegen::GemmConfig c = on.vars[on.launches[0].first].gemm;
  REQUIRE(c.split_tail);
  const auto walk = codegen::gemm_walk(c, 2048, 4352, 2048, 1, 132);
  CHECK(walk.tail == 4);
  CHECK(walk.parts == 4);
  CHECK(walk.slots() == 12);
  // max-autotune keeps what it tuned with split tails allowed apart from what it tuned without
  // (the switch adds candidates of its own).
  const size_t k = on.launches[0].first;
  codegen::GemmProblem q;
  const std::string plain = runtime::matmul_tune_key(g, kernels[k], cp->layouts[k], q, "", "sm_90").text();
  q.split_tail = true;
  const std::string tail = runtime::matmul_tune_key(g, kernels[k], cp->layouts[k], q, "", "sm_90").text();
  CHECK(tail != plain);
  // So with dynamic tiles asked for (kiln::gemm_dynamic_tiles: its candidates take them).
  q.split_tail = false, q.dynamic_tiles = true;
  const std::string dynamic = runtime::matmul_tune_key(g, kernels[k], cp->layouts[k], q, "", "sm_90").text();
  CHECK(dynamic != plain);
  CHECK(dynamic != tail);
  // And with serpentine walks (kiln::gemm_serpentine).
  q.dynamic_tiles = false, q.serpentine = true;
  const std::string serpentine = runtime::matmul_tune_key(g, kernels[k], cp->layouts[k], q, "", "sm_90").text();
  for (const std::string& other : {plain, tail, dynamic}) CHECK(serpentine != other);
}

TEST_CASE("GPU dispatch: a training step's large independent kernels overlap on two streams and in a graph, each after all it reads") {
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  FakeGpuDevice& dev = FakeGpuApi::device(0);
  auto run = [&](Mode mode, const auto& outs) {
    return std::apply([&](const auto&... o) { return dispatch_in(mode, backend, 0, o...); }, outs);
  };
  auto on_side = [&] { return std::count_if(dev.launched.begin(), dev.launched.end(), [](const auto& l) { return l.stream == 1; }); };
  // Launches that may run at once: pairs neither of which runs after the other.
  auto unordered = [&] {
    int pairs = 0;
    for (size_t j = 0; j < dev.launched.size(); ++j)
      for (size_t i = 0; i < j; ++i) {
        const auto& a = dev.launched[j].after;
        pairs += std::find(a.begin(), a.end(), i) == a.end();
      }
    return pairs;
  };
  // W4's step at a size where every GEMM and the [M, H] kernels are large
  // (StreamSchedule::kOverlapGemmWork, kOverlapWork), and at a small one.
  const auto large = w4_step(rng, 2048, 2048, 4096), small = w4_step(rng, 64, 96, 128);

  size_t waits = dev.waits;
  auto c0 = counters();
  Dispatch d = run(Mode::fused, large);
  check_ordered(d, dev);
  const auto side = on_side();
  CHECK(counters().kernels_overlapped - c0.kernels_overlapped == uint64_t(side));
  CHECK(side >= 2);  // of the backward's five independent kernels
  CHECK(dev.waits > waits);
  const int overlaps = unordered();
  CHECK(overlaps >= side);
  for (size_t i = 0; i < d.launches.size(); ++i)  // the shared workspace's users, in plan order
    if (d.vars[d.launches[i].first].workspace() && d.vars[d.launches[i].first].colsum_slot < 0) CHECK(dev.launched[i].stream == 0);
  // The join: what the main stream runs next comes after every launch of the call.
  CHECK(dev.done_before[0].size() == dev.launched.size());

  c0 = counters();
  d = run(Mode::reduce_overhead, large);  // a graph: the same order, by edges
  check_ordered(d, dev);
  CHECK(unordered() == overlaps);  // the same schedule
  CHECK(counters().kernels_overlapped - c0.kernels_overlapped == uint64_t(side));
  {
    OverlapOff off;
    waits = dev.waits;
    check_ordered(run(Mode::fused, large), dev);
    CHECK(on_side() == 0);
    CHECK(dev.waits == waits);
    CHECK(unordered() == 0);
    check_ordered(run(Mode::reduce_overhead, large), dev);  // rebuilt as a chain
    CHECK(unordered() == 0);
    CHECK(counters().kernels_overlapped == c0.kernels_overlapped + uint64_t(side));
  }
  // A launch that fails halfway: the error reaches the caller, and what the side stream had
  // queued still comes before anything the main stream runs next (the allocator's reuse).
  for (size_t fail : {size_t(5), d.launches.size() - 1}) {
    CAPTURE(fail);
    run_failing(backend, large, fail);
    CHECK(dev.launched.size() == fail);
    CHECK(std::count_if(dev.launched.begin(), dev.launched.end(), [](const auto& l) { return l.stream == 1; }) > 0);
    CHECK(dev.done_before[0].size() == dev.launched.size());
  }
  check_ordered(run(Mode::fused, large), dev);  // and the next call runs as before
  CHECK(on_side() == side);
  // A large forward alone is a chain (each GEMM reads the one before): one stream, no event.
  waits = dev.waits;
  run(Mode::fused, std::tuple{std::get<0>(large)});
  CHECK(on_side() == 0);
  CHECK(dev.waits == waits);
  // A small step keeps one stream: no event is worth its microsecond there.
  waits = dev.waits;
  check_ordered(run(Mode::fused, small), dev);
  CHECK(on_side() == 0);
  CHECK(dev.waits == waits);
  check_ordered(run(Mode::reduce_overhead, small), dev);
  CHECK(unordered() == 0);
}

TEST_CASE("GPU dispatch: kiln::programmatic_launch starts each kernel of a call of small kernels early on sm_90 and later, and in "
          "a graph; calls of large kernels launch plainly; every generated kernel waits for the one before it first") {
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  FakeGpuDevice& dev = FakeGpuApi::device(0);  // an sm_90
  // W4's step at a size of large kernels (they overlap on two streams), and at a small one.
  const auto large = w4_step(rng, 2048, 2048, 4096), small = w4_step(rng, 64, 96, 128);
  auto early = [&] { return size_t(std::count_if(dev.launched.begin(), dev.launched.end(), [](const auto& l) { return l.programmatic; })); };
  REQUIRE(programmatic_launch());  // on by default
  Counters c0 = counters();
  w4_dispatch(backend, large);
  CHECK(early() == 0);
  CHECK(counters().kernels_programmatic == c0.kernels_programmatic);
  c0 = counters();
  w4_dispatch(backend, small);  // one stream, in order (check_ordered)
  CHECK(dev.launched.size() >= 5);
  CHECK(early() == dev.launched.size());
  CHECK(counters().kernels_programmatic - c0.kernels_programmatic == dev.launched.size());
  struct On {
    ~On() { set_programmatic_launch(true); }
  } restore;
  set_programmatic_launch(false);
  c0 = counters();
  Dispatch d = w4_dispatch(backend, small);
  CHECK(d.loads == 0);  // the same programs: the switch decides launches, not kernels
  CHECK(early() == 0);
  CHECK(counters().kernels_programmatic == c0.kernels_programmatic);
  set_programmatic_launch(true);
  {
    Sm80 sm80(dev);  // griddepcontrol is sm_90's: plain launches before it
    FakeGpuBackend backend80;  // (a backend reads a device's facts once)
    c0 = counters();
    w4_dispatch(backend80, small);
    CHECK(early() == 0);
    CHECK(counters().kernels_programmatic == c0.kernels_programmatic);
  }
  // In a graph (reduce-overhead) each node's edge from the one before is programmatic.
  auto graph = [&] { return std::apply([&](const auto&... o) { return dispatch_in(Mode::reduce_overhead, backend, 0, o...); }, small); };
  c0 = counters();
  check_ordered(graph(), dev);
  CHECK(early() == dev.launched.size() - 1);
  CHECK(counters().kernels_programmatic - c0.kernels_programmatic == dev.launched.size() - 1);
  set_programmatic_launch(false);
  c0 = counters();
  check_ordered(graph(), dev);  // rebuilt with plain edges
  CHECK(early() == 0);
  CHECK(counters().kernels_programmatic == c0.kernels_programmatic);
  // Every kernel of every program loaded (GEMMs, staging, rows, pointwise; sm_80's and sm_90's)
  // waits before it touches memory.
  size_t kernels = 0;
  for (const auto& m : dev.modules)
    for (size_t at = m.source.find("__global__"); at != std::string::npos; at = m.source.find("__global__", at + 1), ++kernels) {
      const size_t body = m.source.find(") {\n", at);
      REQUIRE(body != std::string::npos);
      CHECK(m.source.compare(body + 4, 21, "  kiln_grid_begin();\n") == 0);
    }
  CHECK(kernels >= 9);
}
TEST_CASE("GPU dispatch: kiln::idle_fill runs a training step's leaves (the loss, the bias gradients) on a third stream below the "
          "other kernels' priority, each launched right after the latest kernel it reads; in a graph by edges and node priorities") {
  KILN_TEST_RNG(rng);
  FakeGpuBackend backend;
  FakeGpuDevice& dev = FakeGpuApi::device(0);  // priorities 0 (its streams') to -5: raised -1
  auto run = [&](Mode mode, const auto& outs) {
    return std::apply([&](const auto&... o) { return dispatch_in(mode, backend, 0, o...); }, outs);
  };
  struct Fill {
    Fill() { set_idle_fill(true); }
    ~Fill() { set_idle_fill(false); }
  };
  TotalsOff rows_loss;  // three leaves: the loss's sum a rows kernel of its own
  const auto large = w4_step(rng, 2048, 2048, 4096), small = w4_step(rng, 64, 96, 128);
  auto filling = [&] { return std::count_if(dev.launched.begin(), dev.launched.end(), [](const auto& l) { return l.stream == 2; }); };
  REQUIRE(!idle_fill());  // off by default
  Dispatch off = run(Mode::fused, large);
  CHECK(filling() == 0);
  for (const auto& l : dev.launched) CHECK(l.priority == 0);

  // W4's three rows kernels (the loss's sum, db1, db2) are its leaves: no kernel reads them.
  auto check_fill = [&](const Dispatch& d, bool graph) {
    check_ordered(d, dev);
    const auto& kernels = d.plan->plan.kernels;
    std::vector<uint8_t> leaf_launch(d.launches.size(), 0);
    for (size_t i = 0; i < d.launches.size(); ++i) {
      CAPTURE(i);
      const size_t k = d.launches[i].first;
      const bool leaf = kernels[k].kind != sched::KernelKind::matmul;
      leaf_launch[i] = leaf;
      CHECK(dev.launched[i].priority == (leaf ? 0 : -1));
      if (!graph) CHECK((dev.launched[i].stream == 2) == leaf);
      if (!leaf) continue;
      // Right after the latest launch it reads (or another leaf that is).
      size_t latest = 0;
      for (int dep : kernels[k].deps)
        for (size_t j = 0; j < d.launches.size(); ++j)
          if (d.launches[j].first == size_t(dep)) latest = std::max(latest, j);
      for (size_t j = latest + 1; j < i; ++j) CHECK(leaf_launch[j]);
    }
    CHECK(std::count(leaf_launch.begin(), leaf_launch.end(), 1) == 3);
    // Nothing but the call's end waits for a leaf.
    for (size_t i = 0; i < d.launches.size(); ++i)
      if (!leaf_launch[i])
        for (size_t j : dev.launched[i].after) CHECK(!leaf_launch[j]);
  };
  {
    Fill fill;
    auto c0 = counters();
    Dispatch d = run(Mode::fused, large);
    CHECK(d.loads == 0);  // the same programs: the switch decides launches, not kernels
    check_fill(d, false);
    CHECK(filling() == 3);
    CHECK(counters().kernels_filling - c0.kernels_filling == 3);
    CHECK(dev.done_before[0].size() == dev.launched.size());  // the join: the main stream after every launch
    // kiln::timeline: each launch's stream and its times from the call's start (the fake's timers: 1 ms).
    set_timeline(true);
    run(Mode::fused, large);
    set_timeline(false);
    const std::vector<TimelineEntry> times = timeline();
    REQUIRE(times.size() == dev.launched.size());
    for (size_t i = 0; i < times.size(); ++i) {
      CHECK(times[i].stream == dev.launched[i].stream);
      CHECK(times[i].end_ms >= times[i].ready_ms);
      CHECK(times[i].kernel.find(d.plan->plan.kernels[d.launches[i].first].kind == sched::KernelKind::matmul ? "wgmma" : "rows") !=
            std::string::npos);
    }
    // A split-rows leaf has a workspace of its own (the main stream's users keep theirs).
    for (size_t i = 0; i < d.launches.size(); ++i)
      if (dev.launched[i].stream == 2) CHECK(d.vars[d.launches[i].first].workspace());
    c0 = counters();
    d = run(Mode::reduce_overhead, large);  // a graph: the leaves by their edges, every node's priority
    check_fill(d, true);
    CHECK(counters().kernels_filling - c0.kernels_filling == 3);
    CHECK(counters().graphs_built - c0.graphs_built == 1);
    run(Mode::reduce_overhead, large);  // replayed as built
    CHECK(counters().graphs_built - c0.graphs_built == 1);
    // A device with one priority: the leaves keep their stream, no launch has a priority of its own.
    dev.raised = 0;
    run(Mode::fused, large);
    CHECK(filling() == 3);
    for (const auto& l : dev.launched) CHECK(l.priority == 0);
    dev.raised = -1;
    // A launch that fails halfway: what the fill stream had queued still comes before what follows.
    run_failing(backend, large, d.launches.size() - 1);
    CHECK(filling() == 3);
    CHECK(dev.done_before[0].size() == dev.launched.size());
    // A small step keeps one stream (no overlap): nothing fills.
    c0 = counters();
    check_ordered(run(Mode::fused, small), dev);
    CHECK(filling() == 0);
    CHECK(counters().kernels_filling == c0.kernels_filling);
  }
  run(Mode::fused, large);  // off again: as before
  CHECK(filling() == 0);
  CHECK(dev.launched.size() == off.launches.size());
}
