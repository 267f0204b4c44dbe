// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Matmul prologues: an operand that is a pointwise function of one input tensor of its
// shape and of scalars (x * s, a cast, an activation), read by nothing else, is computed
// by the GEMM as it loads it: matmul(cast<bf16>(x) * s, W) is one kernel where the GEMM
// loads through registers (the CPU's, the SIMT kind), two where its tiles arrive by a
// copy engine (the prologue's own kernel stores the operand first). Asserted by counting
// kernels and launches, and by numbers against the float64 reference (the operand
// rounded to its dtype, as a stored operand would be): odd sizes, size 1, batched and
// broadcast, transposed and strided sources, both operands, with an epilogue, each
// dtype, fused and eager. Operands that must not be prologues (read twice, computed
// from two tensors or from a value the plan computes) stay correct.
#include "../support/reference.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {

// Checks the launches of a bf16 matmul whose `prologues` operands have a prologue: one
// kernel where the GEMM computes them itself (the CPU's), one more per prologue where
// tensor cores read stored operands (an NVIDIA GPU of the test fleet: sm_80 or later, on
// aligned operands); not asserted on other devices.
void check_half_launches(uint64_t launched, uint64_t prologues) {
  if (kiln::default_device().kind == DeviceKind::cpu) CHECK(launched == 1);
  if (kiln::default_device().kind == DeviceKind::cuda) CHECK(launched == 1 + prologues);
}

// Blocks the default device's caching allocator has handed out so far, fresh or from its
// cache (HIP's: not counted here).
uint64_t blocks_handed_out() {
  CachingAllocatorStats s{};
  const Device d = kiln::default_device();
  if (d.kind == DeviceKind::cpu) s = host_allocator().stats();
  if (d.kind == DeviceKind::cuda) s = cu::cuda_device(d.index).allocator().stats();
  return s.device_allocs + s.reuses;
}

// The operand a prologue gives, as the float64 reference computes it: f applied to each
// element of the source, rounded to the operand's dtype.
template <class F>
Array operand(DType d, const Array& src, F&& f) {
  return ref::as(d, ref::map(src, f));
}

}  // namespace

TEST_CASE("prologue: matmul(x * s, W) is one kernel and one launch; the operand is not stored") {
  KILN_TEST_RNG(rng);
  auto x = input<f32, 2>(rng, {37, 19}), w = input<f32, 2>(rng, {19, 45});
  auto e = kiln::matmul(x.t * 0.25, w.t);
  CHECK(kernel_count(Mode::fused, e) == 1);
  std::string plan = explain(Mode::fused, e);
  CHECK(occurrences(plan, "A computed from") == 1);
  CHECK(occurrences(plan, "prologue of kernel") == 1);  // its own kernel, for GEMMs that cannot
  Counters before = counters();
  Tensor<f32, 2> out = e;
  CHECK(counters().kernels_launched - before.kernels_launched == 1);
  Array scale;
  Array want = ref::matmul(operand(DType::f32, x.a, [](double p) { return p * 0.25; }), w.a, &scale);
  check_close(out, want, tol<f32>().scaled(2), "(x * 0.25) @ W", &scale);
  // the operand takes no memory where the GEMM computes it (the CPU's, SIMT on a GPU): the
  // call takes as many blocks as the plain GEMM's
  Tensor<f32, 2> plain = kiln::matmul(x.t, w.t);
  uint64_t before_plain = blocks_handed_out();
  plain = kiln::matmul(x.t, w.t);
  const uint64_t plain_blocks = blocks_handed_out() - before_plain;
  uint64_t before_fused = blocks_handed_out();
  out = e;
  CHECK(plain_blocks >= 1);  // its output
  CHECK(blocks_handed_out() - before_fused == plain_blocks);
  // the same float operations in the same order as eager's, which stores x * 0.25 first
  auto fused = kiln::evaluate(Mode::fused, e), eager = kiln::evaluate(Mode::eager, e);
  CHECK(fused.to_vector() == eager.to_vector());
  MESSAGE("plan of (x * 0.25) @ W:\n" << plan);
}

TEST_CASE("prologue: a cast to bf16 of f32 activations, the weight's prologue and an epilogue in one kernel") {
  KILN_TEST_RNG(rng);
  auto x = input<f32, 2>(rng, {33, 72}), w = input<f32, 2>(rng, {72, 32}, Layout::transposed);
  auto b = input<bf16, 1>(rng, {32});
  // both operands computed from f32 tensors; bias and activation after
  auto e = kiln::relu(kiln::matmul(kiln::cast<bf16>(x.t), kiln::cast<bf16>(w.t * -1.5)) + b.t);
  CHECK(kernel_count(Mode::fused, e) == 1);
  CHECK(occurrences(explain(Mode::fused, e), " computed from") == 2);
  Counters before = counters();
  Tensor<bf16, 2> out = e;
  check_half_launches(counters().kernels_launched - before.kernels_launched, 2);
  Array scale;
  Array a = operand(DType::bf16, x.a, [](double p) { return p; });
  Array bb = operand(DType::bf16, w.a, [](double p) { return p * -1.5; });
  Array pre = ref::zip(ref::matmul(a, bb, &scale), b.a, [](double p, double q) { return p + q; });
  Array bound = ref::zip(scale, b.a, [](double p, double q) { return std::fabs(p) + std::fabs(q); });
  check_close(out, ref::as(DType::bf16, ref::map(pre, [](double p) { return std::max(p, 0.0); })), tol<bf16>().scaled(2),
              "relu(cast(x) @ cast(w * -1.5) + b)", &bound);
}

TEST_CASE_TEMPLATE("prologue shapes against the float64 reference, fused and eager", DT, f32, f64, f16, bf16, i32, i64) {
  KILN_TEST_RNG(rng);
  constexpr bool kFloat = FloatDType<DT>;
  Values v = kFloat ? Values{-2, 2} : Values{-20, 20};
  const double k = kFloat ? 0.5 : 3;  // exact in every dtype
  const DType d = DT::id;
  Tol t = tol<DT>().scaled(2);
  Batch batch;
  auto scaled = [&](double p) { return p * k; };
  auto act = [&](const auto& e) {
    if constexpr (kFloat) return kiln::gelu(e);
    else return kiln::relu(e);
  };
  auto act_ref = [&](double p) { return kFloat ? ref::gelu(p) : std::max(p, 0.0); };

  // A's prologue, odd sizes; a transposed source
  auto x = input<DT, 2>(rng, {37, 19}, Layout::contiguous, v), w = input<DT, 2>(rng, {19, 300}, Layout::contiguous, v);
  auto xt = input<DT, 2>(rng, {37, 19}, Layout::transposed, v);
  Array s1, s2;
  Array m1 = ref::matmul(operand(d, x.a, scaled), w.a, &s1);
  batch.check(kiln::matmul(x.t * k, w.t), ref::as(d, m1), t, "(x * k) @ w", s1);
  Array m2 = ref::matmul(operand(d, xt.a, act_ref), w.a, &s2);
  batch.check(kiln::matmul(act(xt.t), w.t), ref::as(d, m2), t, "act(transposed x) @ w", s2);

  // B's prologue from a strided source, with an epilogue reading the same source's shape
  auto ws = input<DT, 2>(rng, {19, 23}, Layout::strided, v);
  auto r = input<DT, 2>(rng, {37, 23}, Layout::contiguous, v);
  Array s3;
  Array m3 = ref::zip(ref::matmul(x.a, operand(d, ws.a, [](double p) { return -p; }), &s3), r.a, [](double p, double q) { return p + q; });
  batch.check(kiln::matmul(x.t, -ws.t) + r.t, ref::as(d, m3), t, "x @ -(strided w) + r",
              ref::zip(s3, r.a, [](double p, double q) { return p + std::fabs(q); }));

  // batched A with a prologue against a broadcast B; size-1 dims
  auto x3 = input<DT, 3>(rng, {3, 5, 19}, Layout::contiguous, v);
  auto w1 = input<DT, 2>(rng, {19, 1}, Layout::contiguous, v);
  auto x1 = input<DT, 2>(rng, {1, 19}, Layout::contiguous, v);
  Array s4, s5;
  Array m4 = ref::matmul(operand(d, x3.a, scaled), w.a, &s4);
  batch.check(kiln::matmul(x3.t * k, w.t), ref::as(d, m4), t, "([3, 5, 19] * k) @ [19, 300]", s4);
  Array m5 = ref::matmul(operand(d, x1.a, scaled), operand(d, w1.a, scaled), &s5);
  batch.check(kiln::matmul(x1.t * k, w1.t * k), ref::as(d, m5), t, "([1, 19] * k) @ ([19, 1] * k)", s5);

  // a prologue from another dtype: the operand is a cast of a tensor of it
  using From = std::conditional_t<std::is_same_v<DT, f64>, f32, f64>;
  auto xf = input<From, 2>(rng, {37, 19}, Layout::contiguous, v);
  Array s6;
  Array m6 = ref::matmul(operand(d, xf.a, [](double p) { return p; }), w.a, &s6);
  batch.check(kiln::matmul(kiln::cast<DT>(xf.t), w.t), ref::as(d, m6), t, "cast(x) @ w", s6);

  batch.run(Mode::fused);
  if (std::is_same_v<DT, f32> || std::is_same_v<DT, bf16>) batch.run(Mode::eager);
}

TEST_CASE("prologue: operands that must not be one stay correct") {
  KILN_TEST_RNG(rng);
  auto x = input<f32, 2>(rng, {29, 13}), y = input<f32, 2>(rng, {29, 13}), w = input<f32, 2>(rng, {13, 17});
  Tol t = tol<f32>().scaled(4);
  SUBCASE("read twice: by the matmul and as an output") {
    auto a = x.t * 2.0;
    auto m = kiln::matmul(a, w.t);
    CHECK(occurrences(explain(Mode::fused, a, m), "computed from") == 0);
    auto [ao, mo] = kiln::eval(a, m);
    Array sa = ref::map(x.a, [](double p) { return p * 2; }), sc;
    check_close(ao, sa, t, "x * 2");
    check_close(mo, ref::matmul(sa, w.a, &sc), t, "(x * 2) @ w", &sc);
  }
  SUBCASE("computed from two tensors") {
    auto m = kiln::matmul(x.t + y.t, w.t);
    CHECK(occurrences(explain(Mode::fused, m), "computed from") == 0);
    CHECK(kernel_count(Mode::fused, m) == 2);
    Tensor<f32, 2> out = m;
    Array sc;
    check_close(out, ref::matmul(ref::zip(x.a, y.a, [](double p, double q) { return p + q; }), w.a, &sc), t, "(x + y) @ w", &sc);
  }
  SUBCASE("from a value the plan computes: relu(x @ w) joins the first GEMM's epilogue") {
    auto v = input<f32, 2>(rng, {17, 11});
    auto m = kiln::matmul(kiln::relu(kiln::matmul(x.t, w.t)), v.t);
    CHECK(kernel_count(Mode::fused, m) == 2);
    CHECK(occurrences(explain(Mode::fused, m), "computed from") == 0);
    Tensor<f32, 2> out = m;
    Array s1, s2;
    Array h = ref::map(ref::matmul(x.a, w.a, &s1), [](double p) { return std::max(p, 0.0); });
    check_close(out, ref::matmul(h, v.a, &s2), t, "relu(x @ w) @ v", &s2);
  }
  SUBCASE("a transposed view of the operand: the matmul reads a stored buffer") {
    auto m = kiln::matmul(kiln::transpose(y.t * 0.5, 0, 1), x.t);  // [13, 29] @ [29, 13]
    CHECK(occurrences(explain(Mode::fused, m), "computed from") == 0);
    Tensor<f32, 2> out = m;
    Array sc;
    check_close(out, ref::matmul(ref::transpose(ref::map(y.a, [](double p) { return p * 0.5; }), 0, 1), x.a, &sc), t,
                "transpose(y * 0.5) @ x", &sc);
  }
}

TEST_CASE("prologue: on a GPU the GEMM's kind decides whether the prologue kernel runs") {
  KILN_TEST_RNG(rng);
  auto x = input<f32, 2>(rng, {64, 64});
  auto w = input<bf16, 2>(rng, {64, 64});
  auto e = kiln::matmul(kiln::cast<bf16>(x.t), w.t);
  Counters before = counters();
  Tensor<bf16, 2> out = e;
  check_half_launches(counters().kernels_launched - before.kernels_launched, 1);
  Array sc;
  check_close(out, ref::as(DType::bf16, ref::matmul(operand(DType::bf16, x.a, [](double p) { return p; }), w.a, &sc)),
              tol<bf16>().scaled(2), "cast<bf16>(x) @ w", &sc);
}

TEST_CASE("prologue: 16-bit sources laid out as the operands (an MFMA GEMM computes them), and a transposed one (it does not)") {
  KILN_TEST_RNG(rng);
  auto x = input<bf16, 2>(rng, {64, 128}), xt = input<bf16, 2>(rng, {64, 128}, Layout::transposed);
  auto w = input<f16, 2>(rng, {128, 96});
  for (bool transposed : {false, true}) {
    CAPTURE(transposed);
    const auto& src = transposed ? xt : x;
    auto e = kiln::matmul(src.t * 0.5, kiln::cast<bf16>(w.t));
    CHECK(occurrences(explain(Mode::fused, e), " computed from") == 2);
    Counters before = counters();
    Tensor<bf16, 2> out = e;
    check_half_launches(counters().kernels_launched - before.kernels_launched, 2);
    Array sc;
    Array a = operand(DType::bf16, src.a, [](double p) { return p * 0.5; }), b = operand(DType::bf16, w.a, [](double p) { return p; });
    check_close(out, ref::as(DType::bf16, ref::matmul(a, b, &sc)), tol<bf16>().scaled(2), "(x * 0.5) @ cast<bf16>(w f16)", &sc);
  }
}

TEST_CASE("prologue: per operand, the GPU GEMM's kind and the source decide who computes it (variants for gfx90a, gfx1030, sm_90)") {
  // The variants those GPUs would run, chosen here from the CPU call's bound arguments.
  KILN_TEST_RNG(rng);
  auto x = input<bf16, 2>(rng, {64, 128}), xt = input<bf16, 2>(rng, {64, 128}, Layout::transposed);
  auto w = input<f16, 2>(rng, {128, 96});
  auto w32 = input<f32, 2>(rng, {128, 96});
  // (the GEMM's kind, its mask of computed operands, the mask of prologue kernels skipped)
  auto chosen = [&](const auto& e, const std::string& target) {
    ir::Graph g = ir::trace(e);
    auto cp = runtime::plan_for(g, Mode::fused);
    runtime::Bound bound = runtime::bind_buffers(g, cp->plan);
    const bool amd = target.rfind("gfx", 0) == 0;
    const int arch = amd ? codegen::gemm_amd_arch(target) : std::stoi(target.substr(3));
    runtime::GpuCall call = runtime::gpu_call(g, *cp, bound, amd ? (target == "gfx1030" ? 32 : 64) : 32, arch, 104);
    codegen::GemmKind kind{};
    int computed = -1, skipped = 0;
    for (size_t k = 0; k < cp->plan.kernels.size(); ++k) {
      const sched::Kernel& K = cp->plan.kernels[k];
      if (K.kind == sched::KernelKind::matmul) kind = call.vars[k].gemm.kind, computed = call.vars[k].prologue;
      if (K.prologue_of >= 0 && call.vars[k].skip)
        skipped |= cp->plan.kernels[size_t(K.prologue_of)].loads[1] == runtime::prologue_operand(K) ? 2 : 1;
    }
    CHECK(skipped == computed);  // a prologue kernel is skipped exactly where its GEMM computes the operand
    return std::pair{kind, computed};
  };
  using K = codegen::GemmKind;
  auto both16 = kiln::matmul(x.t * 0.5, kiln::cast<bf16>(w.t));
  auto transposed_a = kiln::matmul(xt.t * 0.5, kiln::cast<bf16>(w.t));
  auto f32_b = kiln::matmul(x.t * 0.5, kiln::cast<bf16>(w32.t));
  CHECK(chosen(both16, "gfx90a") == std::pair{K::mfma, 3});
  CHECK(chosen(transposed_a, "gfx90a") == std::pair{K::mfma, 2});  // A's source is M-contiguous: its kernel stores A
  CHECK(chosen(f32_b, "gfx90a") == std::pair{K::mfma, 1});         // B's source is f32: its kernel casts it
  CHECK(chosen(f32_b, "gfx1030").second == 3);                     // no MFMA there: SIMT computes both
  CHECK(chosen(both16, "sm_90").second == 0);                      // wgmma reads stored operands
}
