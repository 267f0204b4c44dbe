// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The tuning database (tune/db.hpp), on the CPU: autotune() benchmarks once and
// never again on a hit (this process, after the memory layer is dropped, and a
// second process that must tune nothing); a corrupt, truncated, foreign-format or
// foreign-key entry is ignored and rewritten; processes tuning one key at once
// leave one valid entry; shape classes; the counters (tunings, tune_db_hits); a
// matmul's key names its fused epilogue.
// Mode::max_autotune on the CPU uses the heuristic and matches fused mode.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>

#include "kiln/runtime/cuda_backend.hpp"

#include "../support/reference.hpp"
#include "../support/scratch_cache.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {

tune::Key test_key(const std::string& tag) {
  return {"matmul", tune::gemm_shape_class(1, 1000, 1024, 513), DType::bf16, "ak-bn+" + tag, "sm_90", "0123456789ab"};
}

// A benchmark with fixed times per candidate that counts its calls.
struct FakeBench {
  std::map<std::string, double> us;
  int calls = 0;
  double operator()(const std::string& c) {
    ++calls;
    return us.at(c);
  }
};

const std::vector<std::string> kCandidates = {"mma_128x256", "mma_128x128", "simt_64x64"};

// Runs f in a child process; gives its exit status (0: passed).
template <class F>
int in_child(F&& f) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) ::_exit(f());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

}  // namespace

TEST_CASE("tune db: tuned once, then a hit in memory, on disk and in a second process") {
  ScratchCache cache;
  tune::Key key = test_key("once");
  FakeBench bench{{{"mma_128x256", 30}, {"mma_128x128", 20}, {"simt_64x64", 90}}};
  Counters c0 = counters();
  CHECK(tune::autotune(key, kCandidates, std::ref(bench)) == "mma_128x128");
  CHECK(bench.calls == 6);  // each candidate twice: in order, then in reverse
  CHECK(counters().tunings - c0.tunings == 1);

  CHECK(tune::autotune(key, kCandidates, std::ref(bench)) == "mma_128x128");  // memory
  tune::db().clear_memory();
  CHECK(tune::autotune(key, kCandidates, std::ref(bench)) == "mma_128x128");  // disk
  CHECK(bench.calls == 6);
  CHECK(counters().tunings - c0.tunings == 1);
  CHECK(counters().tune_db_hits - c0.tune_db_hits == 2);
  auto e = tune::db().find(key);
  REQUIRE(e);
  CHECK(e->us == 20);

  // another process with an empty memory layer: a disk hit, no benchmark
  int status = in_child([&] {
    tune::db().clear_memory();
    Counters before = counters();
    std::string got = tune::autotune(key, kCandidates, [](const std::string&) -> double { ::_exit(3); });
    if (got != "mma_128x128") return 4;
    if (counters().tunings != before.tunings || counters().tune_db_hits != before.tune_db_hits + 1) return 5;
    return 0;
  });
  CHECK(status == 0);

  // a stored choice that is no longer a candidate is retuned
  CHECK(tune::autotune(key, {"mma_128x256", "simt_64x64"}, std::ref(bench)) == "mma_128x256");
  CHECK(counters().tunings - c0.tunings == 2);
}

TEST_CASE("tune db: a device whose timings drift while tuning (clocks rising) does not decide the choice") {
  ScratchCache cache;
  // Every call runs 4 us faster than the one before; the true times are 97, 100, 100: timed once
  // each in order, the last would look fastest (97, 96, 92).
  std::map<std::string, double> truth = {{"mma_128x256", 97}, {"mma_128x128", 100}, {"simt_64x64", 100}};
  int calls = 0;
  std::vector<std::string> order;
  auto drifting = [&](const std::string& c) {
    order.push_back(c);
    return truth.at(c) - 4.0 * calls++;
  };
  CHECK(tune::autotune(test_key("drift"), kCandidates, drifting) == "mma_128x256");
  CHECK(order == std::vector<std::string>{"mma_128x256", "mma_128x128", "simt_64x64", "simt_64x64", "mma_128x128", "mma_128x256"});
  // a candidate that cannot run is not timed again
  calls = 0, order.clear();
  auto failing = [&](const std::string& c) -> double {
    order.push_back(c);
    if (c == "mma_128x128") throw Error("no");
    return truth.at(c);
  };
  CHECK(tune::autotune(test_key("drift-fail"), kCandidates, failing) == "mma_128x256");
  CHECK(std::count(order.begin(), order.end(), "mma_128x128") == 1);
}

TEST_CASE("tune db: corrupt, truncated, foreign-format and foreign-key entries are ignored and rewritten") {
  ScratchCache cache;
  tune::Key key = test_key("bad");
  std::string path = tune::Db::path_of(key.text());
  FakeBench bench{{{"mma_128x256", 5}, {"mma_128x128", 20}, {"simt_64x64", 90}}};
  auto retunes = [&](const std::string& what) {
    tune::db().clear_memory();
    uint64_t t0 = counters().tunings;
    int calls = bench.calls;
    CHECK_MESSAGE(tune::autotune(key, kCandidates, std::ref(bench)) == "mma_128x256", what);
    CHECK_MESSAGE(counters().tunings == t0 + 1, what);
    CHECK_MESSAGE(bench.calls == calls + 6, what);
    tune::db().clear_memory();  // and the rewritten entry is a hit
    CHECK_MESSAGE(tune::autotune(key, kCandidates, std::ref(bench)) == "mma_128x256", what);
    CHECK_MESSAGE(bench.calls == calls + 6, what);
  };
  tune::autotune(key, kCandidates, std::ref(bench));
  std::string good;
  {
    std::ifstream f(path, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(f), {});
  }
  REQUIRE(good.size() > 40);

  std::ofstream(path, std::ios::binary | std::ios::trunc) << "garbage, not an entry";
  retunes("garbage");
  std::ofstream(path, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() - 7);
  retunes("truncated");
  std::string flipped = good;
  flipped[flipped.find("choice ") + 8] ^= 1;  // payload changed, trailer's hash not
  std::ofstream(path, std::ios::binary | std::ios::trunc) << flipped;
  retunes("a flipped byte");
  REQUIRE(jit::detail::write_entry_atomic(path, "kiln-tune 999\nkey " + key.text() + "\nchoice simt_64x64\nus 1\n") == 0);
  retunes("format 999");
  REQUIRE(jit::detail::write_entry_atomic(path, "kiln-tune " + std::to_string(tune::kTuneFormat) +
                                                    "\nkey another key\nchoice simt_64x64\nus 1\n") == 0);
  retunes("another key's entry");
}

TEST_CASE("tune db: processes tuning one key at once leave one valid entry") {
  ScratchCache cache;
  tune::Key key = test_key("race");
  std::vector<pid_t> kids;
  std::fflush(nullptr);
  for (int i = 0; i < 4; ++i) {
    pid_t pid = ::fork();
    if (pid == 0) {
      std::string mine = kCandidates[size_t(i) % kCandidates.size()];
      std::string got = tune::autotune(key, kCandidates, [&](const std::string& c) { return c == mine ? 1.0 : 2.0; });
      ::_exit(std::find(kCandidates.begin(), kCandidates.end(), got) != kCandidates.end() ? 0 : 1);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
  tune::db().clear_memory();
  auto e = tune::db().find(key);
  REQUIRE(e);
  CHECK(std::find(kCandidates.begin(), kCandidates.end(), e->choice) != kCandidates.end());
  CHECK(e->us == 1.0);
}

TEST_CASE("tune db: shape classes; keys name op, dtype, layout, architecture and kiln version") {
  CHECK(tune::gemm_shape_class(1, 1000, 1024, 513) == tune::gemm_shape_class(1, 1024, 600, 1000));
  CHECK(tune::gemm_shape_class(1, 1024, 1024, 1024) != tune::gemm_shape_class(1, 1025, 1024, 1024));
  CHECK(tune::gemm_shape_class(1, 7, 8, 9) != tune::gemm_shape_class(1, 8, 8, 9));  // small sizes are exact
  tune::Key a = test_key("x"), b = a;
  b.arch = "sm_80";
  CHECK(a.text() != b.text());
  CHECK(a.text().find(std::string("kiln-") + tune::kKilnVersion) != std::string::npos);
  CHECK(tune::Db::path_of(a.text()) != tune::Db::path_of(b.text()));
}

namespace {
// The tuning key of the one matmul kernel of `e` for an sm_90 GPU (bound on CPU buffers: no GPU needed).
template <class E>
tune::Key matmul_key(const E& e) {
  ir::Graph g = ir::trace(e);
  auto cp = runtime::plan_for(g, Mode::fused);
  const auto& ks = cp->plan.kernels;
  auto is_matmul = [](const sched::Kernel& k) { return k.kind == sched::KernelKind::matmul; };
  REQUIRE(std::count_if(ks.begin(), ks.end(), is_matmul) == 1);
  size_t k = size_t(std::find_if(ks.begin(), ks.end(), is_matmul) - ks.begin());
  runtime::Bound bound = runtime::bind_buffers(g, cp->plan);
  runtime::KernelArgs args = runtime::bind_kernel(g, ks[k], cp->layouts[k], bound);
  return runtime::matmul_tune_key(g, ks[k], cp->layouts[k], runtime::gemm_problem(g, ks[k], args, 90, 132), "", "sm_90");
}
}  // namespace

TEST_CASE("tune db: a matmul's key names its fused epilogue; one epilogue has one key wherever it sits") {
  ScratchCache cache;
  KILN_TEST_RNG(rng);
  auto x = input<f32, 2>(rng, {37, 19}), w = input<f32, 2>(rng, {19, 45}), r = input<f32, 2>(rng, {37, 45});
  auto b = input<f32, 1>(rng, {45});
  auto mm = kiln::matmul(x.t, w.t);
  std::vector<tune::Key> keys = {matmul_key(mm), matmul_key(mm + b.t), matmul_key(kiln::gelu(mm + b.t)), matmul_key(kiln::relu(mm + b.t)),
                                 matmul_key(mm * 2.0f), matmul_key(mm + r.t), matmul_key(kiln::cast<bf16>(mm))};
  for (size_t i = 0; i < keys.size(); ++i) {
    INFO("key ", i, ": ", keys[i].text());
    CHECK(keys[i].epilogue.size() == 12);
    CHECK(keys[i].text().find(" ep-" + keys[i].epilogue + " ") != std::string::npos);
    // same shape class, dtype, layout and architecture: only the epilogue tells them apart
    CHECK((keys[i].shape == keys[0].shape && keys[i].dtype == keys[0].dtype && keys[i].layout == keys[0].layout));
    for (size_t j = 0; j < i; ++j) CHECK_MESSAGE(keys[i].text() != keys[j].text(), "the same key as key ", j, ": ", keys[j].text());
  }
  // The same epilogue after a softmax kernel (the matmul elsewhere in its graph), and on other values.
  auto x2 = input<f32, 2>(rng, {37, 19});
  CHECK(matmul_key(kiln::gelu(kiln::matmul(kiln::softmax(x2.t, -1), w.t) + b.t)).text() == keys[2].text());
  CHECK(matmul_key(kiln::gelu(kiln::matmul(x2.t, w.t) + b.t)).text() == keys[2].text());

  // An entry stored under the key without its epilogue (before keys named it) is never read for it.
  tune::Key old = keys[2];
  old.epilogue.clear();
  tune::db().store(old, {"mma_128x128", 5.0});
  tune::db().clear_memory();
  CHECK(tune::db().find(old));
  CHECK(!tune::db().find(keys[2]));
}

TEST_CASE("max-autotune on the CPU: the heuristic, the fused plan, the same numbers") {
  KILN_TEST_RNG(rng);
  auto x = input<f32, 2>(rng, {37, 19}), w = input<f32, 2>(rng, {19, 45});
  auto b = input<f32, 1>(rng, {45});
  // CPU tensors also where the default device is a GPU (gpu-foundation): this is the CPU's case
  auto xc = x.t.to(kiln::cpu()), wc = w.t.to(kiln::cpu());
  auto bc = b.t.to(kiln::cpu());
  auto e = kiln::gelu(kiln::matmul(xc, wc) + bc);
  CHECK(kernel_count(Mode::max_autotune, e) == 1);
  Counters c0 = counters();
  auto tuned = kiln::evaluate(Mode::max_autotune, e);
  CHECK(counters().tunings == c0.tunings);  // the CPU GEMM has one configuration
  auto fused = kiln::evaluate(Mode::fused, e);
  CHECK(tuned.to_vector() == fused.to_vector());
}

namespace {
// The cuBLASLt call kiln would make for the one matmul kernel of `e` (bound on CPU buffers: no GPU needed).
template <class E>
std::optional<runtime::cublaslt::Gemm> cublaslt_call(const E& e) {
  ir::Graph g = ir::trace(e);
  auto cp = runtime::plan_for(g, Mode::fused);
  REQUIRE(cp->plan.kernels.size() == 1);
  runtime::Bound bound = runtime::bind_buffers(g, cp->plan);
  return runtime::cublaslt::gemm_for(g, cp->plan.kernels[0], cp->layouts[0], runtime::bind_kernel(g, cp->plan.kernels[0], cp->layouts[0], bound));
}
}  // namespace

TEST_CASE("cuBLASLt's column-major call for a kernel, and the kernels it must not take") {
  KILN_TEST_RNG(rng);
  auto x = input<f32, 2>(rng, {37, 19}), w = input<f32, 2>(rng, {19, 45}), wt = input<f32, 2>(rng, {19, 45}, Layout::transposed);
  auto xt = input<f32, 2>(rng, {37, 19}, Layout::transposed);
  auto b = input<f32, 1>(rng, {45});
  auto r = cublaslt_call(kiln::matmul(x.t, w.t) + b.t);  // C^T = W^T x^T: cuBLASLt's A is W
  REQUIRE(r);
  CHECK((r->m == 45 && r->n == 37 && r->k == 19 && !r->trans_a && !r->trans_b && r->lda == 45 && r->ldb == 19 && r->ldd == 45));
  CHECK(r->bias != nullptr);
  CHECK(!r->tf32);
  {
    AllowTf32 on;  // f32 as TF32 (CUBLAS_COMPUTE_32F_FAST_TF32) only while allowed
    CHECK(cublaslt_call(kiln::matmul(x.t, w.t))->tf32);
  }
  r = cublaslt_call(kiln::matmul(xt.t, wt.t));
  REQUIRE(r);
  CHECK((r->trans_a && r->trans_b && r->lda == 19 && r->ldb == 37 && r->bias == nullptr));
  CHECK(!cublaslt_call(kiln::gelu(kiln::matmul(x.t, w.t) + b.t)));  // cuBLASLt's GELU is tanh's
  CHECK(!cublaslt_call(kiln::relu(kiln::matmul(x.t, w.t))));
  CHECK(!cublaslt_call(kiln::matmul(x.t, w.t) * 2.0f));
  auto m1 = input<f32, 2>(rng, {37, 1});
  CHECK(!cublaslt_call(kiln::matmul(x.t, w.t) + m1.t));  // a bias along M is not CUBLASLT_EPILOGUE_BIAS
  auto x64 = input<f64, 2>(rng, {37, 19}), w64 = input<f64, 2>(rng, {19, 45});
  CHECK(!cublaslt_call(kiln::matmul(x64.t, w64.t)));
  auto s = input<f32, 2>(rng, {37, 19}, Layout::strided);
  CHECK(!cublaslt_call(kiln::matmul(s.t, w.t)));  // no unit stride in either matrix dim
}

TEST_SUITE("gpu") {

namespace {
bool on_cuda() { return runtime::CudaDeviceApi::present() && kiln::default_device().kind == DeviceKind::cuda; }

// Runs the one matmul kernel of `e` through cuBLASLt on the GPU and checks its output against `want`.
template <class E>
void check_through_cublaslt(const E& e, const Array& want, const Array& scale, Tol t, const std::string& what) {
  ir::Graph g = ir::trace(e);
  auto cp = runtime::plan_for(g, Mode::fused);
  REQUIRE(cp->plan.kernels.size() == 1);
  runtime::Bound bound = runtime::bind_buffers(g, cp->plan);
  runtime::KernelArgs a = runtime::bind_kernel(g, cp->plan.kernels[0], cp->layouts[0], bound);
  auto r = runtime::cublaslt::gemm_for(g, cp->plan.kernels[0], cp->layouts[0], a);
  REQUIRE_MESSAGE(r, what);
  cu::CudaDevice& dev = cu::cuda_device(0);
  REQUIRE_MESSAGE(runtime::cublaslt::run(*r, dev, dev.stream()), what);
  check_close(runtime::output_tensor<dtype_of<E>, rank_of<E>>(g, bound, g.outputs[0]), want, t, what, &scale);
}

// x [512, 1024] @ w [1024, 768] (a transposed view) + b [768], and its float64 value and scale.
template <class DT>
struct LinearCase {
  Input<DT, 2> x, w;
  Input<DT, 1> b;
  Array want, scale;
  explicit LinearCase(Rng& rng)
      : x(input<DT, 2>(rng, {512, 1024}, Layout::contiguous, Values{-2, 2})),
        w(input<DT, 2>(rng, {1024, 768}, Layout::transposed, Values{-2, 2})),
        b(input<DT, 1>(rng, {768}, Layout::contiguous, Values{-2, 2})) {
    Array s;
    want = ref::zip(ref::matmul(x.a, w.a, &s), b.a, [](double p, double q) { return p + q; });
    scale = ref::zip(s, b.a, [](double p, double q) { return p + std::fabs(q); });
  }
  auto expr() const { return kiln::matmul(x.t, w.t) + b.t; }
};
}  // namespace

TEST_CASE_TEMPLATE("cuBLASLt: x @ W, x @ W.t() + bias, batched, against float64; gelu is not its epilogue", DT, bf16, f16, f32) {
  if (!on_cuda()) return;
  if (!runtime::cublaslt::available()) {
    MESSAGE("cuBLASLt not found (libcublasLt.so.13/.12/.so): skipped");
    return;
  }
  KILN_TEST_RNG(rng);
  Values v{-2, 2};
  auto x = input<DT, 2>(rng, {257, 300}, Layout::contiguous, v), w = input<DT, 2>(rng, {300, 129}, Layout::contiguous, v);
  auto wt = input<DT, 2>(rng, {300, 129}, Layout::transposed, v);
  auto b = input<DT, 1>(rng, {129}, Layout::contiguous, v);
  auto x3 = input<DT, 3>(rng, {3, 65, 64}, Layout::contiguous, v), w3 = input<DT, 3>(rng, {3, 64, 40}, Layout::transposed, v);
  Tol t = tol<DT>().scaled(4);
  auto through_cublaslt = [&](const auto& e, const Array& want, const Array& scale, const std::string& what) {
    check_through_cublaslt(e, want, scale, t, what);
  };
  Array s1, s2, s3;
  Array m1 = ref::matmul(x.a, w.a, &s1), m2 = ref::matmul(x.a, wt.a, &s2), m3 = ref::matmul(x3.a, w3.a, &s3);
  through_cublaslt(kiln::matmul(x.t, w.t), m1, s1, "x @ w");
  Array bias_scale = ref::zip(s2, b.a, [](double p, double q) { return p + std::fabs(q); });
  through_cublaslt(kiln::matmul(x.t, wt.t) + b.t, ref::zip(m2, b.a, [](double p, double q) { return p + q; }), bias_scale,
                   "x @ transposed w + bias (CUBLASLT_EPILOGUE_BIAS)");
  through_cublaslt(kiln::matmul(x3.t, w3.t), m3, s3, "[3, 65, 64] @ transposed [3, 64, 40]");

  ir::Graph g = ir::trace(kiln::gelu(kiln::matmul(x.t, w.t) + b.t));
  auto cp = runtime::plan_for(g, Mode::fused);
  runtime::Bound bound = runtime::bind_buffers(g, cp->plan);
  runtime::KernelArgs a = runtime::bind_kernel(g, cp->plan.kernels[0], cp->layouts[0], bound);
  CHECK(!runtime::cublaslt::gemm_for(g, cp->plan.kernels[0], cp->layouts[0], a));  // its GELU is tanh's, kiln's is erf
}

TEST_CASE("max-autotune on the GPU: each matmul tuned once, then a database hit; numbers against float64") {
  if (!on_cuda()) return;
  ScratchCache cache;
  KILN_TEST_RNG(rng);
  LinearCase<bf16> lin(rng);
  const Array &want = lin.want, &scale = lin.scale;
  Counters c0 = counters();
  auto t0 = std::chrono::steady_clock::now();
  auto first = kiln::evaluate(Mode::max_autotune, lin.expr());
  double tuning_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(counters().tunings - c0.tunings == 1);
  check_close(first, want, tol<bf16>().scaled(4), "max-autotune x @ w + b", &scale);
  Counters c1 = counters();
  auto again = kiln::evaluate(Mode::max_autotune, lin.expr());
  CHECK(counters().tunings == c1.tunings);
  CHECK(counters().tune_db_hits > c1.tune_db_hits);
  check_close(again, want, tol<bf16>().scaled(4), "max-autotune again", &scale);
  auto gelu_tuned = kiln::evaluate(Mode::max_autotune, kiln::gelu(lin.expr()));  // its own key: no cuBLASLt
  check_close(gelu_tuned, ref::map(want, ref::gelu), tol<bf16>().scaled(4), "max-autotune gelu(x @ w + b)", &scale);
  MESSAGE("first max-autotune call (tuning, compiles included): " << tuning_s << " s");
}

TEST_CASE("max-autotune on the GPU in TF32: an entry of its own; its pick and cuBLASLt's TF32 against float64") {
  if (!on_cuda()) return;
  ScratchCache cache;
  KILN_TEST_RNG(rng);
  LinearCase<f32> lin(rng);
  Counters c0 = counters();
  {
    AllowTf32 on;
    auto tuned = kiln::evaluate(Mode::max_autotune, lin.expr());
    CHECK(counters().tunings - c0.tunings == 1);
    check_close(tuned, lin.want, tol_tf32().scaled(4), "max-autotune x @ w + b in TF32", &lin.scale);
    auto r = cublaslt_call(lin.expr());
    REQUIRE(r);
    CHECK(r->tf32);
    if (runtime::cublaslt::available()) check_through_cublaslt(lin.expr(), lin.want, lin.scale, tol_tf32().scaled(4), "cuBLASLt in TF32");
  }
  Counters c1 = counters();
  auto exact = kiln::evaluate(Mode::max_autotune, lin.expr());  // f32 arithmetic: another entry
  CHECK(counters().tunings - c1.tunings == 1);
  check_close(exact, lin.want, tol<f32>().scaled(4), "max-autotune x @ w + b in f32", &lin.scale);
}

}  // TEST_SUITE("gpu")
