// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// GPU rows of ../shared/bench/WORKLOADS.md (W1, W2, W3, W4, W7, W8, and W4's GEMMs) on the
// first CUDA device: kiln compiled (fused) and eager, timed with CUDA events after an L2
// flush, median of many calls, outputs checked against a float64 reference first;
// the device-to-device copy ceiling and the launch floor measured in the same run.
// Prints a table; with a path, writes JSON lines there (bench/compare_torch.py sets
// them beside torch_anchor.py's results); --sweep also times the rows workloads at
// each block size of block-per-row kernels.
// KILN_BENCH_ONLY=gemm, w4 or rows runs that part alone (rows: the copy ceiling, W1, W2,
// W3, x*w+b, W8, split rows, the W4 loss's rows over 2 dims, the sweeps, then the host
// overhead and W7);
// KILN_BENCH_ROW=W2 (W1, W3, x*w+b, W8, split, "2 dims") one row.
// KILN_BENCH_GEMM_SWEEP=1 also times bf16 8192^3 and the W4 step with each GEMM config forced;
// KILN_BENCH_ONLY=small (or prologue, tf32) those rows alone, KILN_BENCH_GEMM_SMALL_SWEEP=1 each SIMT config forced.
// KILN_BENCH_ONLY=energy: W4's GEMMs and step back to back, energy per call from NVML (torch_w4_gemms.py --energy).
//   KILN_BENCH_ENERGY_SERP=1: each GEMM as the heuristic picks and with straight walks (no serpentine); KILN_BENCH_ENERGY_ONCE=1:
//   each GEMM in each variant called twice, for a profiler; KILN_BENCH_ENERGY_GROUPS=1,4,32: the variants are the
//   heuristic's config and it in raster groups of these heights (e.g. for ncu's L2 request coalescer counters);
//   KILN_BENCH_ENERGY_ACROSS=8,4: also (or, with GROUPS, besides those) in raster groups of these widths
//   (GemmConfig::group_across); KILN_BENCH_ENERGY_SWAP=1: each GEMM a @ b as its transpose b.t() @ a.t(), so
//   that a cluster shares a's panel (cuBLAS's 256x128 tiles in clusters of 1x2 in the GEMM's own terms).
// KILN_BENCH_GEMM_ACROSS=8 (with KILN_BENCH_ONLY=w4): the W4 step with its GEMMs in raster groups 8 tall and 8 wide, alternated.
// KILN_BENCH_ONLY=w4-flush: the W4 step's kernels' times after torch_anchor.py's flush, after a pause alone and after another step.
// KILN_BENCH_FLUSH=memset: torch_anchor.py's flush as cuMemsetD32Async, not a kernel of stores as PyTorch's zero_() (anchor_flush).
// KILN_BENCH_ONLY=epilogue: x @ W1 alone, with a bias, two outputs, gelu, gelu and gelu', back to back.
// KILN_BENCH_SPLIT_AB=1 (with KILN_BENCH_ONLY=w4): the W4 step with the split epilogue forced on its GEMMs with long epilogues.
// KILN_BENCH_HEAVY_AB=1 (with KILN_BENCH_ONLY=w4): the W4 step with its two heavy-epilogue GEMMs in K steps of 32
// (6 stages, split epilogue), in the consumers' 4-stage epilogue, and every GEMM in K steps of 32, beside the heuristic's.
// KILN_BENCH_OVERLAP_AB=1 (with KILN_BENCH_ONLY=w4): the W4 step with kernel overlap off and on, alternated.
// KILN_BENCH_KEEP_AB=1: the rows with kept rows loaded L2 evict_last off and on (gpu_loads_keep), alternated.
// KILN_BENCH_PRELOAD_AB=1: the rows kept in registers with their weights loaded with the row off
// and on (gpu_rows_preload), alternated; outputs compared bit for bit.
// KILN_BENCH_COLSUM_AB=1 (with KILN_BENCH_ONLY=w4): the W4 step with db1 and db2 summed by rows
// kernels and by the GEMMs that store dh and dy (kiln::gemm_column_sums, off by default), alternated.
// KILN_BENCH_OPSUM_AB=1 (with KILN_BENCH_ONLY=w4): the W4 step with db1 and db2 summed by rows kernels
// and by the dW GEMMs from their B operands (kiln::gemm_operand_sums, off by default), alternated.
// KILN_BENCH_PDL_AB=1: (with KILN_BENCH_ONLY=w4) the W4 step, (rows) W7, with each kernel launched plainly and as a
// programmatic dependent of the one before it (kiln::programmatic_launch: calls of small kernels), alternated.
// KILN_BENCH_TAIL_AB=1 (with KILN_BENCH_ONLY=w4): the W4 step with its GEMMs' last waves as whole tiles and cut in
// K (kiln::gemm_split_tail, off by default), alternated, each with its errors against float64.
// KILN_BENCH_GEMM_TAIL=1 (with the GEMM rows): W4's GEMMs each in whole tiles and with its tail split, alternated.
// KILN_BENCH_TAIL_PARTS=3,5,8 (with KILN_BENCH_ONLY=w4): the W4 step with its GEMMs' last waves whole and cut into
// each count of pieces (GemmConfig::tail_parts), alternated: what kiln_tail_parts's estimate is to be checked against.
// KILN_BENCH_DYN_AB=1 (with KILN_BENCH_ONLY=w4): the W4 step with its GEMMs' tiles in fixed lists per block and
// from the grid's counter (kiln::gemm_dynamic_tiles, off by default), alternated, each with its errors against
// float64; then one step of each as a timeline. KILN_BENCH_GEMM_DYN=1 (with the GEMM rows): W4's GEMMs each alone so.
// KILN_BENCH_SERP_AB=1 (with KILN_BENCH_ONLY=w4): the same with the GEMMs' odd waves walking K backwards and odd
// raster groups their columns from the right (kiln::gemm_serpentine, on by default), off and on. KILN_BENCH_GEMM_SERP=1
// (with the GEMM rows): W4's GEMMs each alone, as the heuristic picks and with straight walks.
// KILN_BENCH_TOTALS_AB=1 (with KILN_BENCH_ONLY=w4): the W4 step with the loss's sum by a rows kernel reading y and by
// y's GEMM as it stores y (kiln::gemm_totals, off by default), alternated, each with its errors against float64; then
// one step of each as a timeline.
// KILN_BENCH_FILL_AB=1 (with KILN_BENCH_ONLY=w4): the W4 step with its leaves (the loss's sum, db1, db2) on a
// third stream below the GEMMs' priority (kiln::idle_fill, off by default) and as before, alternated; then
// one step of each as a timeline (kiln::timeline: when each kernel's stream reached it, when it ended).
#include <kiln/kiln.hpp>
#include <kiln/runtime/cuda_backend.hpp>

#include "w4.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include <dlfcn.h>
#include <unistd.h>

using namespace kiln;
using Clock = std::chrono::steady_clock;

// The positive integers of an environment variable's list, e.g. "8,16,32" (KILN_BENCH_GEMM_GROUPS).
static std::vector<int> env_ints(const char* name) {
  std::vector<int> out;
  const char* c = std::getenv(name);
  for (; c && *c;) {
    char* end = nullptr;
    long v = std::strtol(c, &end, 10);
    if (end == c) break;
    if (v > 0) out.push_back(int(v));
    c = *end ? end + 1 : end;
  }
  return out;
}

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Python's statistics.median (an even count's two middle values averaged), for figures set beside
// torch_anchor.py's.
static double statistics_median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

// Median device time (ms) of fn, L2 flushed before each call.
static double time_ms(const std::function<void()>& fn, int reps = 30) {
  for (int i = 0; i < 3; ++i) fn();
  cu::EventTimer t;
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    cu::flush_l2();
    t.start();
    fn();
    t.stop();
    ms.push_back(t.elapsed_ms());
  }
  return median(ms);
}
// Device time per call (ms) of n back-to-back calls, no L2 flush (training-loop style, as
// torch_anchor.py's loop_ms): the smaller of two rounds.
static double loop_ms(const std::function<void()>& fn, int n) {
  for (int i = 0; i < 3; ++i) fn();
  cu::EventTimer t;
  double best = INFINITY;
  for (int r = 0; r < 2; ++r) {
    t.start();
    for (int i = 0; i < n; ++i) fn();
    t.stop();
    best = std::min(best, double(t.elapsed_ms()) / n);
  }
  return best;
}
// torch_anchor.py's L2 flush: 256 MiB of zeros (cu::flush_l2 writes twice the L2, 120 MiB on an
// H200), so that the device idles between timed calls as long as torch_anchor.py's. Written as
// torch_anchor.py's `flush.zero_()` writes them, by a kernel of 16-byte stores (PyTorch's fill is
// an elementwise kernel, not a memset), so that the step starts after the same kind of kernel;
// KILN_BENCH_FLUSH=memset: cuMemsetD32Async instead (the bench before the forty-ninth session).
// The flush's buffer and its kernel, each made (allocated; compiled, loaded) on its first call.
static const cu::DeviceBuffer& anchor_flush_buffer() {
  static const cu::DeviceBuffer flush_buffer(size_t(256) << 20, 0);
  return flush_buffer;
}
static const cu::CudaFunction& anchor_flush_kernel() {
  static const cu::CudaFunction fill = cu::load_cuda_module(
                                           "struct alignas(16) Words { unsigned w[4]; };\n"
                                           "extern \"C\" __global__ void zero_words(Words* p, unsigned long long n) {\n"
                                           "  unsigned long long i = blockIdx.x * 256ull + threadIdx.x;\n"
                                           "  if (i < n) p[i] = Words{{0u, 0u, 0u, 0u}};\n"
                                           "}\n")
                                           .function("zero_words");
  return fill;
}
// Both made: call before any timing (or a clock sampled beside one) so that no compile falls inside it.
static void make_anchor_flush() { anchor_flush_buffer(), anchor_flush_kernel(); }
static void anchor_flush() {
  static const bool by_memset = [] {
    const char* v = std::getenv("KILN_BENCH_FLUSH");
    return v && std::string(v) == "memset";
  }();
  const cu::DeviceBuffer& buffer = anchor_flush_buffer();
  if (by_memset) return cu::fill_words(buffer, 0);
  auto p = buffer.ptr();  // CUdeviceptr
  unsigned long long n = buffer.size() / 16;
  void* params[] = {&p, &n};
  anchor_flush_kernel().launch({unsigned((n + 255) / 256), 1, 1}, {256, 1, 1}, 0, params, "anchor flush", cu::cuda_device().stream());
}
// torch_anchor.py's own protocol (its bench()), for a ratio that compares like with like: twice,
// about 40 ms of warm-up calls, then about 200 ms of calls queued back to back on the device's
// stream, each after an L2 flush (anchor_flush) between its own events, the host never waiting
// between them; the smaller of the two medians.
static double anchor_ms(const std::function<void()>& fn) {
  auto stream = cu::cuda_device().stream();
  make_anchor_flush();
  double best = INFINITY;
  for (int round = 0; round < 2; ++round) {
    fn();
    cu::EventTimer probe;
    probe.start(stream);
    for (int i = 0; i < 3; ++i) anchor_flush(), fn();
    probe.stop(stream);
    double per = std::max(double(probe.elapsed_ms()) / 3, 1e-3);
    int warm = std::clamp(int(40 / per), 1, 200), reps = std::clamp(int(200 / per), 10, 400);
    for (int i = 0; i < warm; ++i) fn();
    std::vector<std::unique_ptr<cu::EventTimer>> t;
    for (int i = 0; i < reps; ++i) t.push_back(std::make_unique<cu::EventTimer>());
    for (auto& e : t) {
      anchor_flush();
      e->start(stream);
      fn();
      e->stop(stream);
    }
    std::vector<double> ms;
    for (auto& e : t) ms.push_back(e->elapsed_ms());
    best = std::min(best, statistics_median(ms));
  }
  return best;
}
// NVML (libnvidia-ml, loaded at run time, as the driver's own libraries are): the board's energy
// counter and SM clock. Under the 700 W limit a GEMM run back to back is bound by the energy it
// takes per call, which flushed single calls do not show. NOTE: on the lent H200 the counter
// moved in steps (0 mJ over some 0.8 s loops, 1,100-1,600 W over the next): the energy of one
// loop is only roughly right; the time per call back to back, at the clock the limit holds, is
// the measure (docs/benchmarks.md, twenty-third session).
struct Nvml {
  using Dev = void*;
  int (*energy_mj)(Dev, unsigned long long*) = nullptr;
  int (*clock_mhz)(Dev, int, unsigned*) = nullptr;
  int (*temperature_c)(Dev, int, unsigned*) = nullptr;
  Dev dev = nullptr;
  Nvml() {
    void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    auto init = reinterpret_cast<int (*)()>(dlsym(h, "nvmlInit_v2"));
    auto get = reinterpret_cast<int (*)(unsigned, Dev*)>(dlsym(h, "nvmlDeviceGetHandleByIndex_v2"));
    energy_mj = reinterpret_cast<int (*)(Dev, unsigned long long*)>(dlsym(h, "nvmlDeviceGetTotalEnergyConsumption"));
    clock_mhz = reinterpret_cast<int (*)(Dev, int, unsigned*)>(dlsym(h, "nvmlDeviceGetClockInfo"));
    temperature_c = reinterpret_cast<int (*)(Dev, int, unsigned*)>(dlsym(h, "nvmlDeviceGetTemperature"));
    if (!init || !get || !energy_mj || !clock_mhz || init() != 0 || get(0, &dev) != 0) dev = nullptr;
  }
  bool ok() const { return dev != nullptr; }
  double joules() const {
    unsigned long long mj = 0;
    return energy_mj(dev, &mj) == 0 ? double(mj) / 1000.0 : NAN;
  }
  unsigned sm_mhz() const {
    unsigned m = 0;
    return clock_mhz(dev, 1, &m) == 0 ? m : 0;  // NVML_CLOCK_SM
  }
  unsigned gpu_celsius() const {
    unsigned t = 0;
    return temperature_c && temperature_c(dev, 0, &t) == 0 ? t : 0;  // NVML_TEMPERATURE_GPU; 0: unknown
  }
};
// The SM clock while the device runs work queued from this thread: NVML read every 2 ms from a
// thread of its own, from construction to median_mhz(). To tell, where W4's step times apart as
// torch_anchor.py times it and back to back, whether the clock the power limit holds differs (on
// the H200 kiln's flushed step ran 1% longer than back to back, on H100s 1% shorter:
// docs/benchmarks.md, forty-ninth session). 0 where NVML is missing.
class ClockSampler {
 public:
  explicit ClockSampler(const Nvml& nv) : nv_(nv) {
    if (nv_.ok())
      thread_ = std::thread([this] {
        while (!stop_.load(std::memory_order_relaxed)) {
          if (unsigned m = nv_.sm_mhz()) mhz_.push_back(double(m));
          std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
      });
  }
  ~ClockSampler() { finish(); }
  // The median of the samples so far; stops sampling.
  double median_mhz() {
    finish();
    return mhz_.empty() ? 0 : median(mhz_);
  }

 private:
  void finish() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  const Nvml& nv_;
  std::atomic<bool> stop_{false};
  std::vector<double> mhz_;
  std::thread thread_;
};

// fn back to back: about `warm` seconds to let the clock settle where the power limit holds it,
// then about `secs` seconds between two events with the energy counter read on either side.
struct EnergyRun {
  double ms = 0, mj = 0, watts = 0;
  unsigned mhz = 0;
};
static EnergyRun energy_loop(const Nvml& nv, const std::function<void()>& fn, double warm = 0.5, double secs = 1.0) {
  auto& dev = cu::cuda_device();
  auto t0 = Clock::now();
  int calls = 0;
  while (std::chrono::duration<double>(Clock::now() - t0).count() < warm) {
    for (int i = 0; i < 10; ++i) fn();
    dev.synchronize();
    calls += 10;
  }
  const double per_s = std::chrono::duration<double>(Clock::now() - t0).count() / calls;
  const int n = std::max(20, int(secs / per_s));
  cu::EventTimer t;
  dev.synchronize();
  const double j0 = nv.joules();
  t.start();
  for (int i = 0; i < n; ++i) fn();
  t.stop();
  const unsigned mhz = nv.sm_mhz();  // read while the loop still runs
  dev.synchronize();
  const double j1 = nv.joules(), ms = double(t.elapsed_ms());
  return {ms / n, (j1 - j0) * 1000.0 / n, (j1 - j0) / (ms / 1000.0), mhz};
}

// Wall time per call (µs) of back-to-back calls.
static double wall_us(const std::function<void()>& fn, int n = 2000) {
  for (int i = 0; i < 50; ++i) fn();
  cu::cuda_device().synchronize();
  std::vector<double> us;
  for (int r = 0; r < 5; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) fn();
    cu::cuda_device().synchronize();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / n);
  }
  return median(us);
}

static double max_rel(const std::vector<double>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) num = std::max(num, std::fabs(got[i] - ref[i])), den = std::max(den, std::fabs(ref[i]));
  return std::isnan(num) ? INFINITY : num / (den ? den : 1);
}

struct Row {
  std::string name;
  double fused_ms, eager_ms, bytes, err;
  size_t kernels;
};
static std::vector<Row> rows;
static double copy_gbs = 0;

// ---- GEMM: bf16 8192^3 and the W4 GEMMs (../shared/bench/WORKLOADS.md), TFLOP/s --------
struct GemmRow {
  std::string name, config;
  double ms, tflops, err;
};
static std::vector<GemmRow> gemm_rows;
static void write_gemm_rows(std::ostream& out) {
  for (const GemmRow& r : gemm_rows)
    out << "{\"type\":\"gemm\",\"name\":\"" << r.name << "\",\"config\":\"" << r.config << "\",\"ms\":" << r.ms
        << ",\"tflops\":" << r.tflops << ",\"rel_err\":" << r.err << "}\n";
}

// The same view (offset, sizes, strides) over a host copy of its storage.
template <class DT, int R>
static Tensor<DT, R> host_view(const Tensor<DT, R>& t) {
  auto h = std::make_shared<Storage>(t.storage()->bytes(), cpu());
  copy_bytes(h->data(), cpu(), t.storage()->data(), t.device(), t.storage()->bytes());
  return Tensor<DT, R>(h, t.offset(), t.sizes(), t.strides());
}

// A GEMM's result c (M x N) at 64 sampled elements against float64 dot products over K of
// a(i, k) * b(k, j): max |c - ref| / max |ref| (bf16 output: ~4e-3 expected).
template <class DT, class A, class B>
static double sampled_error(const Tensor<DT, 2>& c, int64_t K, A&& a, B&& b) {
  const int64_t M = c.sizes()[0], N = c.sizes()[1];
  std::vector<double> got, ref;
  uint64_t s = 12345;
  for (int t = 0; t < 64; ++t) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    int64_t i = int64_t((s >> 20) % uint64_t(M)), j = int64_t((s >> 40) % uint64_t(N));
    double r = 0;
    for (int64_t k = 0; k < K; ++k) r += a(i, k) * b(k, j);
    ref.push_back(r), got.push_back(double(c(i, j)));
  }
  return max_rel(got, ref);
}

// Times C = a @ b (views read in place), after checking sampled elements (sampled_error).
template <class DT>
static void bench_gemm(const std::string& name, const Tensor<DT, 2>& a, const Tensor<DT, 2>& b, const std::string& config = "") {
  int64_t M = a.sizes()[0], K = a.sizes()[1], N = b.sizes()[1];
  Tensor<DT, 2> c = matmul(a, b);
  auto ha = host_view(a), hb = host_view(b);
  const double err = sampled_error(c, K, [&](int64_t i, int64_t k) { return double(ha(i, k)); },
                                   [&](int64_t k, int64_t j) { return double(hb(k, j)); });
  double ms = time_ms([&] { Tensor<DT, 2> o = matmul(a, b); }, 20);
  double tflops = 2.0 * double(M) * double(N) * double(K) / ms / 1e9;
  gemm_rows.push_back({name, config, ms, tflops, err});
  std::printf("GEMM %-34s %-26s %8.3f ms  %6.1f TFLOP/s  rel.err %.1e\n", name.c_str(), config.c_str(), ms, tflops,
              gemm_rows.back().err);
  std::fflush(stdout);
}

// The config the default mode picks for a matmul of these operands (what the heuristic saw).
template <class DT>
static std::string picked_config(const Tensor<DT, 2>& a, const Tensor<DT, 2>& b) {
  std::string picked;
  codegen::gemm_chooser() = [&](const codegen::GemmProblem& p) {
    picked = codegen::gemm_heuristic(p).str();
    return std::optional<codegen::GemmConfig>();
  };
  Tensor<DT, 2> c = matmul(a, b);
  codegen::gemm_chooser() = nullptr;
  return picked;
}

// Every candidate's program for a @ b into the disk cache, compiled side by side (the
// backend compiles one program at a time): what a tuner would do before timing.
template <class DT>
static void precompile_candidates(const Tensor<DT, 2>& a, const Tensor<DT, 2>& b, int arch, int sm_count) {
  ir::Graph g = ir::trace(matmul(a, b));
  auto cp = runtime::plan_for(g, Mode::fused);
  runtime::Bound bound = runtime::bind_buffers(g, cp->plan);
  std::vector<std::pair<std::string, std::vector<std::string>>> programs;  // source, options
  for (const codegen::GemmConfig& cfg : codegen::gemm_candidates(DT::id, arch, allow_tf32())) {
    codegen::gemm_chooser() = [cfg](const codegen::GemmProblem&) { return std::optional(cfg); };
    runtime::GpuCall call = runtime::gpu_call(g, *cp, bound, 32, arch, sm_count);
    programs.push_back({runtime::CudaBackend::source(g, cp->plan, call.vars, 32), codegen::gpu_compile_options(call.vars)});
  }
  codegen::gemm_chooser() = nullptr;
  std::vector<std::thread> threads;
  for (const auto& p : programs)
    threads.emplace_back([&p, arch] { jit::nvrtc_compile(p.first, "kiln_plan", arch / 10, arch % 10, p.second); });
  for (auto& t : threads) t.join();
}

// a @ b with each candidate of its dtype (TF32 where allowed) forced in turn, all compiled first;
// then each of `probes` (configs that are not candidates).
template <class DT>
static void bench_candidates(const std::string& name, const Tensor<DT, 2>& a, const Tensor<DT, 2>& b,
                             const std::vector<codegen::GemmConfig>& probes = {}) {
  const auto& props = cu::cuda_device().properties();
  const int arch = props.cc_major * 10 + props.cc_minor;
  precompile_candidates(a, b, arch, props.sm_count);
  std::vector<codegen::GemmConfig> configs = codegen::gemm_candidates(DT::id, arch, allow_tf32());
  configs.insert(configs.end(), probes.begin(), probes.end());
  for (const codegen::GemmConfig& cfg : configs) {
    codegen::gemm_chooser() = [cfg](const codegen::GemmProblem&) { return std::optional(cfg); };
    bench_gemm(name + " (forced)", a, b, cfg.str());
  }
  codegen::gemm_chooser() = nullptr;
}

// Times matmul(f(x), b) whose operand f(x) is the matmul's prologue (sched/schedule.hpp), fused
// and eager (f's own kernel, then the GEMM), after checking sampled elements of each against
// float64 dot products over f_ref(x) rounded to the operand's dtype. `expr(x, b)` is the
// expression; `name` says what f is. Prints the kernels each call launched.
template <class DT, class XT, class E, class F>
static void bench_prologue(const std::string& name, const Tensor<XT, 2>& x, const Tensor<DT, 2>& b, E&& expr, F&& f_ref) {
  const int64_t M = x.sizes()[0], K = x.sizes()[1], N = b.sizes()[1];
  auto hx = host_view(x), hb = host_view(b);
  for (Mode mode : {Mode::fused, Mode::eager}) {
    const double err = sampled_error(Tensor<DT, 2>(kiln::evaluate(mode, expr(x, b))), K,
                                     [&](int64_t i, int64_t k) { return to_double<DT>(from_double<DT>(f_ref(double(hx(i, k))))); },
                                     [&](int64_t k, int64_t j) { return double(hb(k, j)); });
    Counters before = counters();
    { Tensor<DT, 2> o = kiln::evaluate(mode, expr(x, b)); }
    const uint64_t launched = counters().kernels_launched - before.kernels_launched;
    double ms = time_ms([&] { Tensor<DT, 2> o = kiln::evaluate(mode, expr(x, b)); }, 20);
    double tflops = 2.0 * double(M) * double(N) * double(K) / ms / 1e9;
    const std::string row = name + (mode == Mode::eager ? " (eager)" : "");
    gemm_rows.push_back({row, std::to_string(launched) + " kernels", ms, tflops, err});
    std::printf("GEMM %-34s %-26s %8.3f ms  %6.1f TFLOP/s  rel.err %.1e\n", row.c_str(), gemm_rows.back().config.c_str(), ms, tflops,
                gemm_rows.back().err);
    std::fflush(stdout);
  }
}

// The heuristic's config for q with `tweak` applied, where the result fits q (else as it was).
static codegen::GemmConfig tweaked_heuristic(const codegen::GemmProblem& q, const std::function<void(codegen::GemmConfig&)>& tweak) {
  codegen::GemmConfig c = codegen::gemm_heuristic(q), t = c;
  tweak(t);
  return codegen::gemm_fits(t, q) ? t : c;
}

// Matmul prologues: on tensor cores the operand's own kernel stores it first; SIMT computes it as it loads.
static void prologue_benches() {
  Tensor<f32, 2> x = randn<f32>(Shape<2>{8192, 4096}, 33);
  Tensor<bf16, 2> w = cast<bf16>(randn<f32>(Shape<2>{4096, 4096}, 34));
  bench_prologue("prologue cast<bf16>(x f32) @ W bf16", x, w, [](const auto& p, const auto& q) { return matmul(cast<bf16>(p), q); },
                 [](double v) { return v; });
  Tensor<f32, 2> a = randn<f32>(Shape<2>{4096, 4096}, 35), b = randn<f32>(Shape<2>{4096, 4096}, 36);
  bench_prologue("prologue (x * 0.5) @ W f32 4096^3", a, b, [](const auto& p, const auto& q) { return matmul(p * 0.5, q); },
                 [](double v) { return v * 0.5; });
  // small: the launch the fused prologue saves weighs most
  Tensor<f32, 2> sa = randn<f32>(Shape<2>{256, 512}, 37), sb = randn<f32>(Shape<2>{512, 512}, 38);
  bench_prologue("prologue (x * 0.5) @ W f32 [256,512]x[512,512]", sa, sb, [](const auto& p, const auto& q) { return matmul(p * 0.5, q); },
                 [](double v) { return v * 0.5; });
  if (std::getenv("KILN_BENCH_PROLOGUE_MORE")) {  // probes: no scalar; the plain GEMM between
    bench_gemm("f32 4096^3", a, b, picked_config(a, b));
    bench_prologue("prologue (-x) @ W f32 4096^3", a, b, [](const auto& p, const auto& q) { return matmul(-p, q); },
                   [](double v) { return -v; });
    bench_prologue("prologue (x * 0.5) @ W f32 4096^3 again", a, b, [](const auto& p, const auto& q) { return matmul(p * 0.5, q); },
                   [](double v) { return v * 0.5; });
  }
}

// Each of `tiles` with its K in 2, 4, 8 and 16 ranges of blocks (split-K probes).
static std::vector<codegen::GemmConfig> split_probes(std::initializer_list<codegen::GemmConfig> tiles) {
  std::vector<codegen::GemmConfig> probes;
  for (const codegen::GemmConfig& c : tiles)
    for (int sk : {2, 4, 8, 16}) probes.push_back(codegen::gemm_sliced(c, c.k_slices, sk));
  return probes;
}

// f32 GEMMs of fewer tiles than SMs (W7's layers among them): the heuristic's pick, then
// with KILN_BENCH_GEMM_SMALL_SWEEP=1 every SIMT candidate and a few probes forced.
static void small_gemm_benches() {
  using K = codegen::GemmKind;
  struct Shape3 {
    int64_t m, n, k;
  };
  uint64_t seed = 40;
  for (Shape3 s : {Shape3{32, 256, 256}, Shape3{256, 512, 512}, Shape3{512, 512, 2048}, Shape3{128, 1024, 4096}, Shape3{1024, 1024, 1024}}) {
    Tensor<f32, 2> a = randn<f32>(Shape<2>{s.m, s.k}, seed++), b = randn<f32>(Shape<2>{s.k, s.n}, seed++);
    const std::string name = "f32 small [" + std::to_string(s.m) + "," + std::to_string(s.k) + "]x[" + std::to_string(s.k) + "," +
                             std::to_string(s.n) + "]";
    bench_gemm(name, a, b, picked_config(a, b));
    if (std::getenv("KILN_BENCH_GEMM_SMALL_SWEEP"))
      bench_candidates(name, a, b,
                       split_probes({codegen::gemm_sliced({K::simt, 32, 32, 32, 4, 4, 1}, 4), {K::simt, 64, 64, 16, 4, 4, 1},
                                     {K::simt, 128, 128, 8, 8, 8, 1}}));
  }
}

// TF32 allowed (torch.backends.cuda.matmul.allow_tf32 = True beside it): the heuristic's
// config, the operands row-major and B read transposed, then every TF32 candidate.
static void tf32_gemm_benches() {
  Tensor<f32, 2> a = randn<f32>(Shape<2>{4096, 4096}, 28), b = randn<f32>(Shape<2>{4096, 4096}, 29);
  set_allow_tf32(true);
  bench_gemm("f32 4096^3 TF32", a, b, picked_config(a, b));
  Tensor<f32, 2> bt = randn<f32>(Shape<2>{4096, 4096}, 30);
  bench_gemm("f32 4096^3 TF32 a@b.t()", a, bt.transpose(0, 1), picked_config(a, bt.transpose(0, 1)));
  Tensor<f32, 2> a8 = randn<f32>(Shape<2>{8192, 8192}, 31), b8 = randn<f32>(Shape<2>{8192, 8192}, 32);
  bench_gemm("f32 8192^3 TF32", a8, b8, picked_config(a8, b8));
  bench_candidates("f32 4096^3 TF32", a, b);
  set_allow_tf32(false);
}

// f32 GEMMs: the SIMT path (PyTorch's default fp32 matmul is not TF32), then TF32.
static void f32_gemm_benches() {
  {
    Tensor<f32, 2> a = randn<f32>(Shape<2>{4096, 4096}, 28), b = randn<f32>(Shape<2>{4096, 4096}, 29);
    bench_gemm("f32 4096^3", a, b, picked_config(a, b));
    using K = codegen::GemmKind;  // probes: a longer K step; 128 threads a block (three blocks an SM)
    bench_candidates("f32 4096^3", a, b, {{K::simt, 128, 128, 16, 8, 8, 1}, {K::simt, 128, 64, 8, 8, 8, 1}, {K::simt, 64, 128, 8, 8, 8, 1},
                                          {K::simt, 128, 64, 16, 8, 8, 1}});
  }
  tf32_gemm_benches();
}

// KILN_BENCH_ONLY=epilogue: W4's forward GEMM x @ W1 with its epilogue taken apart, each form
// 100 calls back to back (where the power limit holds the clock, as in the step), three rounds
// alternated: the plain GEMM, the bias, a second output (bytes, no math), gelu, gelu and gelu'.
// First each with the heuristic's config, then all with the split epilogue.
static void epilogue_cost_bench() {
  const auto params = w4::random_params<bf16>(w4::Sizes{8192, 4096, 16384}, 40, cuda(0));  // W4's own: u ~ N(0, 1)
  const Tensor<bf16, 2>&x = params.x, &W1 = params.W1;
  auto u = [&] { return matmul(x, W1) + params.b1; };
  // gelu'(u) as W4's backward has it: erf's argument the node gelu's decomposition made (its
  // constant the same double), so the two share one erf, as in the step
  auto gelu_d = [](const auto& p) {
    auto v = p * (1 / std::numbers::sqrt2);
    return 0.5 * (1 + erf(v)) + p * exp2(v * v * -std::numbers::log2e) * (std::numbers::inv_sqrtpi / std::numbers::sqrt2);
  };
  std::vector<std::pair<std::string, std::function<void()>>> forms = {
      {"x@W1", [&] { Tensor<bf16, 2> o = matmul(x, W1); }},
      {"x@W1 + b1", [&] { Tensor<bf16, 2> o = u(); }},
      {"x@W1 + b1 and twice it (two outputs)", [&] { auto o = kiln::eval(u(), u() * 2.0f); }},
      {"gelu(x@W1 + b1)", [&] { Tensor<bf16, 2> o = gelu(u()); }},
      {"gelu and gelu' (W4's forward)", [&] { auto o = kiln::eval(gelu(u()), gelu_d(u())); }}};
  const auto& props = cu::cuda_device().properties();
  for (bool split : {false, true}) {
    for (const codegen::GemmConfig& c : codegen::gemm_candidates(DType::bf16, props.cc_major * 10 + props.cc_minor))
      if (split && c.split_epilogue && c.bn == 256) {
        codegen::gemm_chooser() = [c](const codegen::GemmProblem& q) { return std::optional(codegen::gemm_clustered(c, q)); };
        break;
      }
    std::vector<std::vector<double>> ms(forms.size());
    for (int r = 0; r < 3; ++r)
      for (size_t i = 0; i < forms.size(); ++i) ms[i].push_back(loop_ms(forms[i].second, 100));
    for (size_t i = 0; i < forms.size(); ++i)
      std::printf("W4 epilogue cost, %-9s %-40s back to back %8.3f ms (rounds %.3f %.3f %.3f)  %+.3f ms over x@W1\n",
                  split ? "split" : "heuristic", forms[i].first.c_str(), median(ms[i]), ms[i][0], ms[i][1], ms[i][2],
                  median(ms[i]) - median(ms[0]));
    std::fflush(stdout);
    codegen::gemm_chooser() = nullptr;
  }
}

static void gemm_benches() {
  auto rnd = [](int64_t r, int64_t c, uint64_t seed) { return Tensor<bf16, 2>(cast<bf16>(randn<f32>(Shape<2>{r, c}, seed))); };
  {
    Tensor<bf16, 2> a = rnd(8192, 8192, 21), b = rnd(8192, 8192, 22);
    bench_gemm("bf16 8192^3", a, b, picked_config(a, b));
    if (std::getenv("KILN_BENCH_GEMM_SWEEP")) bench_candidates("bf16 8192^3", a, b);
  }
  {  // W4: h = x @ W1, y = h @ W2; backward dh = dy @ W2.t(), dW2 = h.t() @ dy, dx = dh @ W1.t(), dW1 = x.t() @ dh
    Tensor<bf16, 2> x = rnd(8192, 4096, 23), W1 = rnd(4096, 16384, 24), h = rnd(8192, 16384, 25), W2 = rnd(16384, 4096, 26);
    Tensor<bf16, 2> dy = rnd(8192, 4096, 27);
    auto run = [&](const std::string& n, const Tensor<bf16, 2>& p, const Tensor<bf16, 2>& q) { bench_gemm(n, p, q, picked_config(p, q)); };
    run("W4 x@W1 [8192,4096]x[4096,16384]", x, W1);
    run("W4 h@W2 [8192,16384]x[16384,4096]", h, W2);
    run("W4 dy@W2.t()", dy, W2.transpose(0, 1));
    run("W4 h.t()@dy", h.transpose(0, 1), dy);
    run("W4 dh@W1.t()", h, W1.transpose(0, 1));
    run("W4 x.t()@dh", x.transpose(0, 1), h);
    // Each W4 GEMM with the heuristic's config and with `tweak` applied (where the result fits
    // the problem), two rounds alternated.
    auto ab = [&](const std::string& off, const std::string& on, const std::function<void(codegen::GemmConfig&)>& tweak) {
      auto forced = [&](const std::string& n, const Tensor<bf16, 2>& p, const Tensor<bf16, 2>& q, bool tweaked) {
        std::string config;
        codegen::gemm_chooser() = [&config, &tweak, tweaked](const codegen::GemmProblem& pr) {
          codegen::GemmConfig c = tweaked ? tweaked_heuristic(pr, tweak) : codegen::gemm_heuristic(pr);
          config = c.str();
          return std::optional(c);
        };
        Tensor<bf16, 2> warm = matmul(p, q);  // through the chooser: fills `config` for the row's label
        bench_gemm(n + " (" + (tweaked ? on : off) + ")", p, q, config);
        codegen::gemm_chooser() = nullptr;
      };
      for (int r = 0; r < 2; ++r)
        for (bool t : {false, true}) {
          forced("W4 x@W1", x, W1, t), forced("W4 h@W2", h, W2, t), forced("W4 dy@W2.t()", dy, W2.transpose(0, 1), t);
          forced("W4 h.t()@dy", h.transpose(0, 1), dy, t), forced("W4 dh@W1.t()", h, W1.transpose(0, 1), t);
          forced("W4 x.t()@dh", x.transpose(0, 1), h, t);
        }
    };
    if (std::getenv("KILN_BENCH_GEMM_TAIL")) ab("whole tiles", "split tail", [](codegen::GemmConfig& c) { c.split_tail = c.persistent; });
    if (std::getenv("KILN_BENCH_GEMM_DYN"))
      ab("fixed tiles", "dynamic tiles", [](codegen::GemmConfig& c) { c.dynamic = codegen::gemm_walks_whole_tiles(c); });
    if (std::getenv("KILN_BENCH_GEMM_SERP"))
      ab("as the heuristic", "straight walks", [](codegen::GemmConfig& c) { c.serpentine = false; });
    if (std::getenv("KILN_BENCH_GEMM_CLUSTER")) ab("as the heuristic", "one block each", [](codegen::GemmConfig& c) { c.cluster = 1; });
    // Where the W4 step spends beyond its plain GEMMs: the forward's fused gelu epilogue, dh's
    // fused gelu' epilogue (it reads the saved pre-activation), the bias gradients' column sums.
    // An epilogue is timed in alternation with its plain GEMM, three rounds: the clock drifts as
    // the GPU warms, so figures taken a minute apart do not compare.
    Tensor<bf16, 1> b1 = cast<bf16>(randn<f32>(Shape<1>{16384}, 30) * 0.02f);
    auto part = [](const std::string& name, const std::function<void()>& fused, const std::function<void()>& plain) {
      std::vector<double> f, p, ratio;
      for (int r = 0; r < 3; ++r) p.push_back(time_ms(plain, 20)), f.push_back(time_ms(fused, 20)), ratio.push_back(f.back() / p.back());
      std::printf("W4 part %-42s %8.3f ms  (its plain GEMM %.3f ms, alternated: epilogue %+.1f%%; rounds %+.1f %+.1f %+.1f%%)\n",
                  name.c_str(), median(f), median(p), 100 * (median(ratio) - 1), 100 * (ratio[0] - 1), 100 * (ratio[1] - 1),
                  100 * (ratio[2] - 1));
      std::fflush(stdout);
    };
    auto gelu_grad = [](const auto& p) { return 0.5f * (1.0f + erf(p * 0.70710678f)) + p * exp(-0.5f * p * p) * 0.39894228f; };
    auto fwd = [&] { Tensor<bf16, 2> o = gelu(matmul(x, W1) + b1); };
    auto fwd_plain = [&] { Tensor<bf16, 2> o = matmul(x, W1); };
    auto bwd = [&] { Tensor<bf16, 2> o = matmul(dy, W2.transpose(0, 1)) * gelu_grad(h); };
    auto bwd_plain = [&] { Tensor<bf16, 2> o = matmul(dy, W2.transpose(0, 1)); };
    part("gelu(x@W1 + b1)", fwd, fwd_plain);
    part("dy@W2.t() * gelu'(pre)", bwd, bwd_plain);
    {  // the same two with the epilogue in the consumers (the heuristic's config for plain GEMMs)
      const auto& props = cu::cuda_device().properties();
      codegen::GemmConfig plain = codegen::gemm_candidates(DType::bf16, props.cc_major * 10 + props.cc_minor).front();
      codegen::gemm_chooser() = [plain](const codegen::GemmProblem& q) { return std::optional(codegen::gemm_clustered(plain, q)); };
      part("gelu(x@W1 + b1), consumers' epilogue", fwd, fwd_plain);
      part("dy@W2.t() * gelu'(pre), consumers' epilogue", bwd, bwd_plain);
      codegen::gemm_chooser() = nullptr;
    }
    auto reduction = [](const char* name, double ms, double bytes) {
      std::printf("W4 part %-42s %8.3f ms  %6.0f GB/s\n", name, ms, bytes / ms / 1e6);
      std::fflush(stdout);
    };
    reduction("sum(dh, 0) [8192,16384] (db1)", time_ms([&] { Tensor<bf16, 1> o = sum(h, 0); }, 20), 8192.0 * 16384 * 2);
    reduction("sum(dy, 0) [8192,4096] (db2)", time_ms([&] { Tensor<bf16, 1> o = sum(dy, 0); }, 20), 8192.0 * 4096 * 2);
  }
  f32_gemm_benches();
  small_gemm_benches();
  prologue_benches();
}

// W4's six GEMMs, plain, each a call (its output dropped): the forward's two, then the backward's
// (dh @ W1.t() and x.t() @ dh with h standing in for dh, as bench/torch_w4_gemms.py has them).
using NamedCall = std::pair<std::string, std::function<void()>>;
static std::vector<NamedCall> w4_gemms(const Tensor<bf16, 2>& x, const Tensor<bf16, 2>& W1, const Tensor<bf16, 2>& W2,
                                       const Tensor<bf16, 2>& h, const Tensor<bf16, 2>& dy) {
  return {{"x @ W1", [=] { Tensor<bf16, 2> o = matmul(x, W1); }},
          {"h @ W2", [=] { Tensor<bf16, 2> o = matmul(h, W2); }},
          {"dy @ W2.t()", [=] { Tensor<bf16, 2> o = matmul(dy, W2.transpose(0, 1)); }},
          {"h.t() @ dy", [=] { Tensor<bf16, 2> o = matmul(h.transpose(0, 1), dy); }},
          {"h @ W1.t()", [=] { Tensor<bf16, 2> o = matmul(h, W1.transpose(0, 1)); }},
          {"x.t() @ h", [=] { Tensor<bf16, 2> o = matmul(x.transpose(0, 1), h); }}};
}

// The same six, each a @ b computed as its transpose b.t() @ a.t(): the same products and bytes, the
// operands' roles (which one a cluster multicasts, which way a raster group runs) swapped.
static std::vector<NamedCall> w4_gemms_swapped(const Tensor<bf16, 2>& x, const Tensor<bf16, 2>& W1, const Tensor<bf16, 2>& W2,
                                               const Tensor<bf16, 2>& h, const Tensor<bf16, 2>& dy) {
  auto t = [](const Tensor<bf16, 2>& a) { return a.transpose(0, 1); };
  return {{"(x @ W1)^T", [=] { Tensor<bf16, 2> o = matmul(t(W1), t(x)); }},
          {"(h @ W2)^T", [=] { Tensor<bf16, 2> o = matmul(t(W2), t(h)); }},
          {"(dy @ W2.t())^T", [=] { Tensor<bf16, 2> o = matmul(W2, t(dy)); }},
          {"(h.t() @ dy)^T", [=] { Tensor<bf16, 2> o = matmul(t(dy), h); }},
          {"(h @ W1.t())^T", [=] { Tensor<bf16, 2> o = matmul(W1, t(h)); }},
          {"(x.t() @ h)^T", [=] { Tensor<bf16, 2> o = matmul(t(h), x); }}};
}

// The step's expressions (w4::step's tuple) evaluated as one plan in mode m.
template <class Exprs>
static auto evaluate_step(Mode m, const Exprs& exprs) {
  return std::apply([&](const auto&... e) { return evaluate(m, e...); }, exprs);
}

// KILN_BENCH_ONLY=energy: each of W4's six GEMMs (bf16, plain) back to back under the power limit,
// as the heuristic picks its config and with one thing changed at a time: time, energy and mean
// power per call, and the SM clock the limit holds (bench/torch_w4_gemms.py --energy: cuBLAS's).
static void gemm_energy_bench() {
  Nvml nv;
  if (!nv.ok()) {
    std::printf("energy: NVML (libnvidia-ml.so.1) not available\n");
    return;
  }
  auto r = [](int64_t m, int64_t n, uint64_t seed) { return cast<bf16>(randn<f32>(Shape<2>{m, n}, seed)); };
  Tensor<bf16, 2> x = r(8192, 4096, 50), W1 = r(4096, 16384, 51), W2 = r(16384, 4096, 52), h = r(8192, 16384, 53),
                  dy = r(8192, 4096, 54);
  const auto gemms = std::getenv("KILN_BENCH_ENERGY_SWAP") ? w4_gemms_swapped(x, W1, W2, h, dy) : w4_gemms(x, W1, W2, h, dy);
  using Tweak = std::function<void(codegen::GemmConfig&)>;
  // NOTE: the twenty-third session's runs also timed raster groups of 4, 128x192 tiles, 128x128
  // tiles in 6 stages, the split epilogue in 3 stages, a block a tile, and 256x128 tiles (each
  // consumer warpgroup two 64-row blocks, cuBLAS's tile for the K = 16384 GEMMs; branch
  // gemm-256x128): none took less time than the heuristic's config on any of the six
  // (docs/benchmarks.md).
  // KILN_BENCH_ENERGY_SERP=1: the heuristic's config beside it with straight walks (no GemmConfig::serpentine).
  std::vector<std::pair<std::string, Tweak>> variants =
      std::getenv("KILN_BENCH_ENERGY_SERP")
          ? std::vector<std::pair<std::string, Tweak>>{{"as the heuristic", [](codegen::GemmConfig&) {}},
                                                       {"straight walks", [](codegen::GemmConfig& c) { c.serpentine = false; }}}
          : std::vector<std::pair<std::string, Tweak>>{{"as the heuristic", [](codegen::GemmConfig&) {}},
                                                       {"one block each", [](codegen::GemmConfig& c) { c.cluster = 1; }},
                                                       {"raster groups of 16", [](codegen::GemmConfig& c) { c.group = 16; }}};
  // KILN_BENCH_ENERGY_GROUPS=1,4,32: the heuristic's config and it in raster groups of these heights.
  if (std::vector<int> gs = env_ints("KILN_BENCH_ENERGY_GROUPS"); !gs.empty()) {
    variants.resize(1);
    for (int g : gs) variants.emplace_back("raster groups of " + std::to_string(g), [g](codegen::GemmConfig& c) { c.group = g; });
  }
  // KILN_BENCH_ENERGY_ACROSS=8,4: raster groups of these widths, walked along their rows.
  for (int g : env_ints("KILN_BENCH_ENERGY_ACROSS"))
    variants.emplace_back("raster groups " + std::to_string(g) + " wide", [g](codegen::GemmConfig& c) { c.group = g, c.group_across = true; });
  const double flops = 2.0 * 8192 * 4096 * 16384;
  std::string picked;  // the config the chooser last gave
  auto choose = [&](const Tweak& tweak) {
    codegen::gemm_chooser() = [&picked, tweak](const codegen::GemmProblem& q) {
      codegen::GemmConfig c = tweaked_heuristic(q, tweak);
      picked = c.str();
      return std::optional(c);
    };
  };
  // KILN_BENCH_ENERGY_ONCE=1: each GEMM in each variant twice (the first compiles), no loops, and
  // return: the launches a profiler (ncu) reads, 384-thread blocks in the order printed.
  if (std::getenv("KILN_BENCH_ENERGY_ONCE")) {
    for (const auto& [name, fn] : gemms)
      for (const auto& [label, tweak] : variants) {
        choose(tweak), fn(), fn();
        std::printf("once: %-12s %-26s %s\n", name.c_str(), label.c_str(), picked.c_str());
      }
    codegen::gemm_chooser() = nullptr;
    return;
  }
  // KILN_BENCH_ENERGY_QUICK=1: the six in a row and the step alone (a short device lease).
  for (int round = 0; round < (std::getenv("KILN_BENCH_ENERGY_QUICK") ? 0 : 2); ++round)
    for (const auto& [name, fn] : gemms)
      for (const auto& [label, tweak] : variants) {
        choose(tweak);
        EnergyRun e = energy_loop(nv, fn, 0.3, 0.8);
        std::printf("energy, round %d, %-12s %-26s %-34s %7.3f ms %7.1f mJ %5.0f W %4u MHz %5.0f TFLOP/s %5.2f pJ/flop\n", round,
                    name.c_str(), label.c_str(), picked.c_str(), e.ms, e.mj, e.watts, e.mhz, flops / e.ms / 1e9, e.mj * 1e9 / flops);
        std::fflush(stdout);
      }
  codegen::gemm_chooser() = nullptr;
  // The six together and the W4 step itself (as gpu_bench's W4 row runs it), fused.
  auto p = w4::random_params<bf16>(w4::Sizes{8192, 4096, 16384}, 40, cuda(0));
  auto st = w4::step(p);
  for (int round = 0; round < 3; ++round) {  // the six and the step, each as the heuristic picks
    EnergyRun e = energy_loop(nv, [&] {
      for (const auto& g : gemms) g.second();
    });
    EnergyRun w = energy_loop(nv, [&] { auto o = evaluate_step(Mode::fused, st); });
    std::printf("energy, round %d: the six back to back %7.3f ms %4u MHz; W4 step, fused %7.3f ms %4u MHz\n", round, e.ms, e.mhz, w.ms,
                w.mhz);
    std::fflush(stdout);
  }
}

// KILN_BENCH_ONLY=w4-flush: where a W4 step after torch_anchor.py's 256 MiB flush spends its time
// against one right after another step: each kernel's time (kiln::timeline: from its stream
// reaching it to its end) in three settings, alternated ten times, medians:
//   flushed       the flush, queued once the timeline's wait for the step before has returned;
//   idle          nothing between that wait and the step (the flush's pause without the flush);
//   after a step  a step queued just before it, as back to back.
static void w4_flush_timeline_bench() {
  auto p = w4::random_params<bf16>(w4::Sizes{8192, 4096, 16384}, 40, cuda(0));
  auto st = w4::step(p);
  make_anchor_flush();
  for (int i = 0; i < 3; ++i) auto o = evaluate_step(Mode::fused, st);  // compiles, warms
  enum { kFlushed, kIdle, kAfterStep, kSettings };
  const int rounds = 10;
  std::vector<std::string> names;  // stream and kernel
  std::vector<std::vector<double>> ms[kSettings];  // [setting][kernel][round]
  std::vector<double> total[kSettings];
  for (int r = 0; r < rounds; ++r)
    for (int setting : {kFlushed, kIdle, kAfterStep}) {
      if (setting == kFlushed) anchor_flush();
      if (setting == kAfterStep) auto o = evaluate_step(Mode::fused, st);
      set_timeline(true);
      auto o = evaluate_step(Mode::fused, st);
      set_timeline(false);
      const auto& t = timeline();
      if (names.empty())
        for (const TimelineEntry& e : t) names.push_back("stream " + std::to_string(e.stream) + "  " + e.kernel);
      if (t.size() != names.size()) throw std::runtime_error("w4-flush: the step's kernels changed between calls");
      ms[setting].resize(t.size());
      double end = 0;
      for (size_t k = 0; k < t.size(); ++k) ms[setting][k].push_back(t[k].end_ms - t[k].ready_ms), end = std::max(end, t[k].end_ms);
      total[setting].push_back(end);
    }
  auto m = [&](int setting, size_t k) { return median(ms[setting][k]); };
  for (size_t k = 0; k < names.size(); ++k)
    std::printf("W4 flush timeline  flushed %7.3f  idle %7.3f  after a step %7.3f ms  flushed - after %+6.3f  %s\n", m(kFlushed, k),
                m(kIdle, k), m(kAfterStep, k), m(kFlushed, k) - m(kAfterStep, k), names[k].c_str());
  std::printf("W4 flush timeline  the step: flushed %7.3f, idle %7.3f, after a step %7.3f ms (medians of %d)\n", median(total[kFlushed]),
              median(total[kIdle]), median(total[kAfterStep]), rounds);
  std::fflush(stdout);
}

// ---- W4: the MLP training step (forward + backward), bf16; gives its JSON line ----
static std::string w4_step_bench() {
  // x [8192,4096], W1 [4096,16384], W2 [16384,4096]
  w4::Sizes s{8192, 4096, 16384};
  auto p = w4::random_params<bf16>(s, 40, cuda(0));
  auto st = w4::step(p);
  auto fused_step = [&] { auto o = evaluate_step(Mode::fused, st); };  // one timed run of the step
  auto out = evaluate_step(Mode::fused, st);
  // float64 reference: the same step in f64 on the device, from the same (bf16-rounded) values;
  // itself checked on a few rows of dx against plain float64 loops on the host.
  auto p64 = w4::convert<f64>(p);
  auto ref = evaluate_step(Mode::fused, w4::step(p64));
  double e_loss = std::fabs(double(std::get<0>(out)()) - std::get<0>(ref)()) / std::fabs(std::get<0>(ref)());
  double e[5] = {w4::rel_err(std::get<1>(out), std::get<1>(ref)), w4::rel_err(std::get<2>(out), std::get<2>(ref)),
                 w4::rel_err(std::get<3>(out), std::get<3>(ref)), w4::rel_err(std::get<4>(out), std::get<4>(ref)),
                 w4::rel_err(std::get<5>(out), std::get<5>(ref))};
  std::vector<int64_t> sample = {0, 1, s.M / 2 + 1, s.M - 1};
  w4::Ref host = w4::reference(w4::to_host(s, p), sample, false);
  std::vector<double> dx64, dxbf;
  for (int64_t r : sample) {
    auto a = std::get<1>(ref).slice(0, r, r + 1).to_vector(), b = std::get<1>(out).slice(0, r, r + 1).to_vector();
    dx64.insert(dx64.end(), a.begin(), a.end()), dxbf.insert(dxbf.end(), b.begin(), b.end());
  }
  double e_host64 = w4::rel_err(dx64, host.dx), e_hostbf = w4::rel_err(dxbf, host.dx);
  // First, as torch_anchor.py times the step and then back to back: like its bench() and loop_ms,
  // the process's first timings after the compile, so that the two processes time boards in like
  // states. NOTE: the step slows as the board warms under the power limit: on an H100 (forty-first
  // session) fused mode's first flushed round ran 9.10-9.62 ms, its later ones 9.50-12.02, and this
  // figure, timed last then, 9.42-9.92, against torch.compile's first 9.28-9.78.
  const Nvml nv;
  const unsigned anchor_celsius = nv.ok() ? nv.gpu_celsius() : 0;
  make_anchor_flush();  // before the clock is sampled
  ClockSampler anchor_clock(nv);
  const double fused_anchor = anchor_ms(fused_step);
  const double anchor_mhz = anchor_clock.median_mhz();
  ClockSampler loop_clock(nv);
  const double fused_loop = loop_ms(fused_step, 15);
  const double loop_mhz = loop_clock.median_mhz();
  double fused = time_ms(fused_step, 10);
  double eager = time_ms([&] { auto o = evaluate_step(Mode::eager, st); }, 5);
  // The kernels a step launches: the plan's, less those another kernel computes (on sm_90 y's GEMM sums the loss).
  const Counters before_step = counters();
  fused_step();
  const size_t kernels = counters().kernels_launched - before_step.kernels_launched;
  if (std::getenv("KILN_BENCH_GEMM_SWEEP")) {  // the step with every GEMM forced to each wgmma config
    const auto& props = cu::cuda_device().properties();
    std::printf("W4 fused, the heuristic's GEMM configs         %8.3f ms\n", time_ms(fused_step, 10));
    for (const codegen::GemmConfig& cfg : codegen::gemm_candidates(DType::bf16, props.cc_major * 10 + props.cc_minor)) {
      if (cfg.kind != codegen::GemmKind::wgmma) continue;
      codegen::gemm_chooser() = [cfg](const codegen::GemmProblem& q) { return codegen::gemm_fits(cfg, q) ? std::optional(cfg) : std::nullopt; };
      double ms = time_ms(fused_step, 10);
      std::printf("W4 fused, GEMMs forced to %-28s %8.3f ms\n", cfg.str().c_str(), ms);
      std::fflush(stdout);
    }
    codegen::gemm_chooser() = nullptr;
  }
  // The step with every GEMM's config changed from the heuristic's by `tweak`, for each of
  // `labels`, three rounds alternated: 100 steps back to back (the clock then settles where
  // the power limit holds it), and the flushed median.
  auto compare = [&](const std::vector<std::string>& labels, const std::function<void(codegen::GemmConfig&, const codegen::GemmProblem&, size_t)>& tweak) {
    for (int r = 0; r < 3; ++r)
      for (size_t i = 0; i < labels.size(); ++i) {
        codegen::gemm_chooser() = [&tweak, i](const codegen::GemmProblem& q) {
          return std::optional(tweaked_heuristic(q, [&](codegen::GemmConfig& c) { tweak(c, q, i); }));
        };
        double loop = loop_ms(fused_step, 100), flushed = time_ms(fused_step, 10);
        std::printf("W4 fused, round %d, GEMMs %-28s back to back %8.3f ms, flushed %8.3f ms\n", r, labels[i].c_str(), loop, flushed);
        std::fflush(stdout);
      }
    codegen::gemm_chooser() = nullptr;
  };
  if (std::vector<int> gs = env_ints("KILN_BENCH_GEMM_GROUPS"); !gs.empty()) {  // raster groups of these heights, e.g. "8,16,32"
    std::vector<std::string> labels;
    for (int g : gs) labels.push_back("in raster groups of " + std::to_string(g));
    compare(labels, [gs](codegen::GemmConfig& c, const codegen::GemmProblem&, size_t i) { c.group = gs[i]; });
  }
  if (std::vector<int> gs = env_ints("KILN_BENCH_GEMM_ACROSS"); !gs.empty()) {  // raster groups this tall, then this wide
    const int g = gs.front();
    compare({"in raster groups " + std::to_string(g) + " tall", "in raster groups " + std::to_string(g) + " wide"},
            [g](codegen::GemmConfig& c, const codegen::GemmProblem&, size_t i) { c.group = g, c.group_across = i == 1; });
  }
  if (std::getenv("KILN_BENCH_TAIL_PARTS")) {  // the GEMMs' last waves whole, and cut into these many pieces, e.g. "3,5,8"
    std::vector<int> ps = {0};
    std::vector<std::string> labels = {"in whole tiles"};
    for (int n : env_ints("KILN_BENCH_TAIL_PARTS"))
      if (n > 1) ps.push_back(n), labels.push_back("tail in " + std::to_string(n) + " pieces");
    compare(labels, [&ps](codegen::GemmConfig& c, const codegen::GemmProblem&, size_t i) {
      c.split_tail = i > 0 && c.persistent, c.tail_parts = c.split_tail ? ps[i] : 0;
    });
  }
  if (std::getenv("KILN_BENCH_GEMM_CLUSTER"))  // the persistent GEMMs alone, and in clusters of two sharing B's loads
    compare({"one block each", "in clusters of 2"},
            [](codegen::GemmConfig& c, const codegen::GemmProblem&, size_t i) { c.cluster = i == 1 && c.persistent ? 2 : 1; });
  if (std::getenv("KILN_BENCH_SPLIT_AB")) {  // the split epilogue (the producer's idle warps) on the GEMMs whose epilogue is long
    // x @ W1 (+ b1, gelu, gelu') has an N-major B, dy @ W2.t() (* gelu'(u)) a K-major one; both [8192, 16384], K = 4096.
    compare({"as the heuristic", "split epilogue on x @ W1", "split epilogue on both"},
            [](codegen::GemmConfig& c, const codegen::GemmProblem& q, size_t i) {
              if (i == 0 || !c.persistent || c.split_epilogue || q.n != 16384 || q.k != 4096 || (i == 1 && q.ops.b_k_major)) return;
              for (const codegen::GemmConfig& e : codegen::gemm_candidates(q.dtype, q.arch))
                if (e.split_epilogue && e.bm == c.bm && e.bn == c.bn) {
                  const int cl = c.cluster;
                  c = e, c.cluster = cl;
                  return;
                }
            });
  }
  if (std::getenv("KILN_BENCH_HEAVY_AB")) {
    // The two GEMMs with heavy epilogues (x @ W1 with gelu and gelu', dy @ W2.t() * gelu'(u)):
    // the heuristic's split epilogue (128x256, 3 stages of K 64), the same in 6 stages of K 32
    // (gemm_k32_configs), or the consumers' epilogue in 4 stages; and every GEMM in K steps of
    // 32 (the four plain ones in 8 stages: 6 loading while the consumers hold 2, against 2 of 4).
    compare({"as the heuristic", "heavy GEMMs as 128x256x32 s6_pe_c2", "heavy GEMMs as 128x256 s4_p_c2",
             "all in K steps of 32 (s6_pe_c2, s8_p_c2)"},
            [](codegen::GemmConfig& c, const codegen::GemmProblem& q, size_t i) {
              if (i == 0 || (i < 3 && !q.heavy_epilogue)) return;
              if (i != 2) {
                c = codegen::gemm_clustered(codegen::gemm_k32_configs()[q.heavy_epilogue ? 0 : 1], q);
                return;
              }
              for (const codegen::GemmConfig& e : codegen::gemm_candidates(q.dtype, q.arch))
                if (e.persistent && e.stages == 4 && e.bm == 128 && e.bn == 256 && !e.split_epilogue) {
                  c = codegen::gemm_clustered(e, q);
                  return;
                }
            });
  }
  if (std::getenv("KILN_BENCH_EPILOGUE_AB")) {  // the step with its GEMMs' epilogues fused, and as kernels of their own
    for (int r = 0; r < 3; ++r)
      for (bool on : {true, false}) {
        set_epilogue_fusion(on);
        auto o = evaluate_step(Mode::fused, st);
        double err = w4::rel_err(std::get<2>(o), std::get<2>(ref));  // dW1: every kernel of the step is upstream of it
        double loop = loop_ms(fused_step, 100), flushed = time_ms(fused_step, 10);
        double anchor = anchor_ms(fused_step);
        size_t k = std::apply([](const auto&... x) { return kernel_count(Mode::fused, x...); }, st);
        std::printf("W4 fused, round %d, epilogues %-8s (%2zu kernels) back to back %8.3f ms, flushed %8.3f ms, as torch_anchor.py times %8.3f ms; dW1 rel. err %.1e\n",
                    r, on ? "fused" : "apart", k, loop, flushed, anchor, err);
        std::fflush(stdout);
      }
    set_epilogue_fusion(true);
    // The step's six GEMMs alone, plain, back to back (bench/torch_w4_gemms.py: cuBLAS's the same way):
    // what the GEMMs take at the clock the power limit holds, without the step's epilogues and sums.
    Tensor<bf16, 2> h = cast<bf16>(randn<f32>(Shape<2>{s.M, s.H}, 41)), dy = cast<bf16>(randn<f32>(Shape<2>{s.M, s.K}, 42));
    auto six = [gemms = w4_gemms(p.x, p.W1, p.W2, h, dy)] {
      for (const auto& g : gemms) g.second();
    };
    for (int r = 0; r < 3; ++r) std::printf("W4's six GEMMs, plain, round %d: back to back %8.3f ms\n", r, loop_ms(six, 100));
  }
  // A switch that decides a call's launches, not its kernels, off and on alternated, three
  // rounds: the launches it counts, the step's times (and as a graph), and whether the loss and
  // the five gradients stay bit for bit; then `after`.
  auto launch_ab = [&](const char* what, void (*set)(bool), bool after, uint64_t Counters::*counted) {
    for (int r = 0; r < 3; ++r)
      for (bool on : {false, true}) {
        set(on);
        Counters c = counters();
        auto o = evaluate_step(Mode::fused, st);
        const uint64_t n = counters().*counted - c.*counted;
        const bool same = std::apply([&](const auto&... a) {
          return std::apply([&](const auto&... b) { return ((a.to_vector() == b.to_vector()) && ...); }, out);
        }, o);
        double loop = loop_ms(fused_step, 100), flushed = time_ms(fused_step, 10);
        double anchor = anchor_ms(fused_step);
        double graph = loop_ms([&] { auto o = evaluate_step(Mode::reduce_overhead, st); }, 100);
        std::printf("W4 fused, round %d, %s %-3s (%llu kernels) back to back %8.3f ms, flushed %8.3f ms, as torch_anchor.py times "
                    "%8.3f ms; reduce-overhead back to back %8.3f ms; loss and gradients %s\n",
                    r, what, on ? "on" : "off", (unsigned long long)n, loop, flushed, anchor, graph, same ? "bit for bit" : "DIFFERS");
        std::fflush(stdout);
      }
    set(after);
  };
  if (std::getenv("KILN_BENCH_OVERLAP_AB"))  // the step's kernels one after another, and overlapped
    launch_ab("kernel overlap", set_kernel_overlap, true, &Counters::kernels_overlapped);
  if (std::getenv("KILN_BENCH_PDL_AB"))  // each kernel started as the one before it ends
    launch_ab("programmatic launch", set_programmatic_launch, true, &Counters::kernels_programmatic);
  // A switch off and on, one step of each on the device's clock (kiln::timeline: when each
  // kernel's stream reached it, when it ended), after a step that compiles; the switch off after.
  auto timelines = [&](const char* what, void (*set)(bool)) {
    for (bool on : {false, true}) {
      set(on);
      auto warm = evaluate_step(Mode::fused, st);
      set_timeline(true);
      for (int i = 0; i < 2; ++i) auto o = evaluate_step(Mode::fused, st);
      set(false), set_timeline(false);
      for (const TimelineEntry& e : timeline())
        std::printf("W4 timeline, %s %-3s stream %d  ready %7.3f  end %7.3f ms  %s\n", what, on ? "on" : "off", e.stream, e.ready_ms, e.end_ms,
                    e.kernel.c_str());
    }
    std::fflush(stdout);
  };
  if (std::getenv("KILN_BENCH_FILL_AB")) {  // the leaves on SMs the GEMMs leave idle
    launch_ab("idle fill", set_idle_fill, false, &Counters::kernels_filling);
    timelines("idle fill", set_idle_fill);
  }
  // A switch that decides the step's kernels, off and on alternated, three rounds: the kernels
  // launched, the step's times and what `check` says of db1 and db2; then `after`.
  auto sums_ab = [&](const char* what, void (*set)(bool), bool after, const auto& check) {
    for (int r = 0; r < 3; ++r)
      for (bool on : {false, true}) {
        set(on);
        Counters c = counters();
        auto o = evaluate_step(Mode::fused, st);
        const uint64_t launched = counters().kernels_launched - c.kernels_launched;
        double loop = loop_ms(fused_step, 100), flushed = time_ms(fused_step, 10);
        double anchor = anchor_ms(fused_step);
        std::printf("W4 fused, round %d, %s %-3s (%llu kernels) back to back %8.3f ms, flushed %8.3f ms, as torch_anchor.py times "
                    "%8.3f ms; %s\n",
                    r, what, on ? "on" : "off", (unsigned long long)launched, loop, flushed, anchor, check(o).c_str());
        std::fflush(stdout);
      }
    set(after);
  };
  auto errors = [&](const auto& o) {  // the loss's and the gradients' against float64
    char b[128];
    std::snprintf(b, sizeof b, "rel. err loss %.1e, dx %.1e, dW1 %.1e, db1 %.1e, dW2 %.1e, db2 %.1e", w4::rel_err(std::get<0>(o), std::get<0>(ref)),
                  w4::rel_err(std::get<1>(o), std::get<1>(ref)), w4::rel_err(std::get<2>(o), std::get<2>(ref)),
                  w4::rel_err(std::get<3>(o), std::get<3>(ref)), w4::rel_err(std::get<4>(o), std::get<4>(ref)),
                  w4::rel_err(std::get<5>(o), std::get<5>(ref)));
    return std::string(b);
  };
  if (std::getenv("KILN_BENCH_COLSUM_AB"))  // db1 and db2 by rows kernels, and by the GEMMs that store dy and dh
    sums_ab("column sums in the GEMMs", set_gemm_column_sums, gemm_column_sums(), errors);
  if (std::getenv("KILN_BENCH_OPSUM_AB"))  // db1 and db2 by rows kernels, and by the dW GEMMs from their B operands
    sums_ab("B's column sums in the dW GEMMs", set_gemm_operand_sums, gemm_operand_sums(), [&](const auto& o) {
      char b[64];
      std::snprintf(b, sizeof b, "db1 rel. err %.1e, db2 %.1e", w4::rel_err(std::get<3>(o), std::get<3>(ref)),
                    w4::rel_err(std::get<5>(o), std::get<5>(ref)));
      return std::string(b);
    });
  if (std::getenv("KILN_BENCH_TAIL_AB"))  // the GEMMs' last waves as whole tiles, and cut in K (kiln::gemm_split_tail)
    sums_ab("split tail", set_gemm_split_tail, gemm_split_tail(), errors);
  if (std::getenv("KILN_BENCH_DYN_AB")) {  // the GEMMs' tiles in fixed lists, and from the grid's counter
    sums_ab("dynamic tiles", set_gemm_dynamic_tiles, gemm_dynamic_tiles(), errors);
    timelines("dynamic tiles", set_gemm_dynamic_tiles);
  }
  if (std::getenv("KILN_BENCH_SERP_AB")) {  // the GEMMs' waves all forward, and serpentine
    sums_ab("serpentine", set_gemm_serpentine, gemm_serpentine(), errors);
    timelines("serpentine", set_gemm_serpentine);
  }
  if (std::getenv("KILN_BENCH_TOTALS_AB")) {  // the loss's sum by a rows kernel, and by y's GEMM
    sums_ab("totals in the GEMMs", set_gemm_totals, gemm_totals(), errors);
    timelines("totals in the GEMMs", set_gemm_totals);
  }
  double worst = std::max({e_loss, e[0], e[1], e[2], e[3], e[4]});
  // max-autotune from cold: a fresh cache directory (no tuning database, no compiled candidate
  // on disk); the first call tunes every matmul and compiles; then the tuned step's time.
  const char* saved_dir = std::getenv("KILN_CACHE_DIR");
  std::string saved = saved_dir ? saved_dir : "", fresh = jit::cache_dir() + "/w4-cold-" + std::to_string(::getpid());
  ::setenv("KILN_CACHE_DIR", fresh.c_str(), 1);
  Counters c0 = counters();
  auto t0 = Clock::now();
  double tuned_loss = double(std::get<0>(evaluate_step(Mode::max_autotune, st))());
  double tune_s = std::chrono::duration<double>(Clock::now() - t0).count();
  Counters c1 = counters();
  // NOTE: the two modes' runs interleaved, three rounds each, medians: timed one after the
  // other, the later one ran every kernel about 13% slower on an H200 (docs/benchmarks.md).
  // NOTE: fused mode's first round runs before the tuning heats the board (on an H200 it was
  // 1-12% faster than the later ones, twenty-ninth session), so max-autotune is set beside fused
  // mode's interleaved rounds alone (`beside`); fused mode's figure stays the median of its first
  // three rounds, as before.
  std::vector<double> fused_r{fused}, tuned_r, beside;
  for (int r = 0; r < 3; ++r) {
    tuned_r.push_back(time_ms([&] { auto o = evaluate_step(Mode::max_autotune, st); }, 5));
    beside.push_back(time_ms(fused_step, 5));
    if (r < 2) fused_r.push_back(beside.back());
  }
  double tuned = median(tuned_r);
  const double fused_interleaved = median(beside);
  // NOTE: kiln's own figure is the median of its three rounds, the smallest beside it; the
  // like-for-like one against torch_anchor.py (the smaller of two medians) is fused_anchor, timed first.
  double fused_min = *std::min_element(fused_r.begin(), fused_r.end());
  fused = median(fused_r);
  if (saved_dir) ::setenv("KILN_CACHE_DIR", saved.c_str(), 1);
  else ::unsetenv("KILN_CACHE_DIR");
  std::printf("W4 max-autotune            %8.3f ms  %6.1f TFLOP/s (fused's rounds beside it %.3f ms: %.3fx); cold first call %.1f s "
              "(%llu matmuls tuned, %llu programs compiled); loss rel. diff vs fused %.1e\n",
              tuned, s.flops() / tuned / 1e9, fused_interleaved, fused_interleaved / tuned, tune_s, (unsigned long long)(c1.tunings - c0.tunings),
              (unsigned long long)(c1.compiles - c0.compiles), std::fabs(tuned_loss - double(std::get<0>(out)())) / std::fabs(double(std::get<0>(out)())));
  std::printf("W4 MLP step bf16           fused %8.3f ms  eager %8.3f ms  %6.1f TFLOP/s (eager %.1f)  eager/fused %5.2fx  kernels %zu"
              "  (rounds' medians:", fused, eager, s.flops() / fused / 1e9, s.flops() / eager / 1e9, eager / fused, kernels);
  for (double r : fused_r) std::printf(" %.3f", r);
  std::printf(" ms; back to back %.3f ms (SM clock %.0f MHz); as torch_anchor.py times, %.3f ms (%.0f MHz), first, the GPU at %u C)\n",
              fused_loop, loop_mhz, fused_anchor, anchor_mhz, anchor_celsius);
  std::printf("  vs float64 (rel. Frobenius error): loss %.1e  dx %.1e  dW1 %.1e  db1 %.1e  dW2 %.1e  db2 %.1e; "
              "f64 reference vs host loops on %zu rows of dx: %.1e (bf16 step: %.1e)\n",
              e_loss, e[0], e[1], e[2], e[3], e[4], sample.size(), e_host64, e_hostbf);
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "{\"type\":\"kiln\",\"name\":\"W4 MLP step bf16\",\"fused_ms\":%.6g,\"eager_ms\":%.6g,\"flops\":%.6g,"
                "\"rel_err\":%.3g,\"rel_err_loss\":%.3g,\"rel_err_grads\":{\"x\":%.3g,\"W1\":%.3g,\"b1\":%.3g,\"W2\":%.3g,"
                "\"b2\":%.3g},\"ref64_vs_host_rows\":%.3g,\"kernels\":%zu,\"max_autotune_ms\":%.6g,\"max_autotune_cold_s\":%.4g,"
                "\"fused_min_ms\":%.6g,\"fused_loop_ms\":%.6g,\"fused_anchor_ms\":%.6g,\"fused_beside_max_autotune_ms\":%.6g,"
                "\"anchor_celsius\":%u,\"anchor_mhz\":%.0f,\"loop_mhz\":%.0f}\n",
                fused, eager, s.flops(), worst, e_loss, e[0], e[1], e[2], e[3], e[4], e_host64, kernels, tuned, tune_s, fused_min, fused_loop,
                fused_anchor, fused_interleaved, anchor_celsius, anchor_mhz, loop_mhz);
  std::fflush(stdout);
  return buf;
}

// Host figures of a full run (not a rows-only one): microseconds per call, back to back.
struct HostRows {
  double floor_us = 0, plus_one_us = 0, plus_one_ro_us = 0, w7_us = 0, w7_eager_us = 0, w7_ro_us = 0;
  uint64_t w7_ro_calls = 0, w7_ro_built = 0, w7_ro_updates = 0;
};

static void write_rows(const char* path, const HostRows& h, const std::string& w4_json) {
  std::ofstream out(path);
  out << "{\"type\":\"ceiling\",\"copy_gbs\":" << copy_gbs;
  if (h.floor_us > 0)
    out << ",\"launch_floor_us\":" << h.floor_us << ",\"compiled_plus_one_us\":" << h.plus_one_us
        << ",\"reduce_overhead_plus_one_us\":" << h.plus_one_ro_us;
  out << "}\n";
  for (const Row& r : rows)
    out << "{\"type\":\"kiln\",\"name\":\"" << r.name << "\",\"fused_ms\":" << r.fused_ms << ",\"eager_ms\":" << r.eager_ms
        << ",\"bytes\":" << r.bytes << ",\"rel_err\":" << r.err << ",\"kernels\":" << r.kernels << "}\n";
  if (h.w7_us > 0)
    out << "{\"type\":\"kiln\",\"name\":\"W7 small MLP f32\",\"fused_us\":" << h.w7_us << ",\"eager_us\":" << h.w7_eager_us
        << ",\"reduce_overhead_us\":" << h.w7_ro_us << ",\"reduce_overhead_calls\":" << h.w7_ro_calls
        << ",\"graphs_built\":" << h.w7_ro_built << ",\"graph_updates\":" << h.w7_ro_updates << "}\n";
  write_gemm_rows(out);
  out << w4_json;
}

// The error of y = softmax(x, -1) on its first `rows` rows against float64 (max_rel).
static double softmax_error(const Tensor<f32, 2>& x, const Tensor<f32, 2>& y, int64_t rows) {
  const int64_t C = x.size(1);
  auto xs = x.slice(0, 0, rows).to_vector(), ys = y.slice(0, 0, rows).to_vector();
  std::vector<double> ref(xs.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, xs[size_t(r * C + c)]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(xs[size_t(r * C + c)] - m);
    for (int64_t c = 0; c < C; ++c) ref[size_t(r * C + c)] = std::exp(xs[size_t(r * C + c)] - m) / s;
  }
  return max_rel(ys, ref);
}

// KILN_BENCH_ROW=text: only the rows whose name holds it (a profiler run of one kernel).
static bool wanted(const char* name) {
  const char* only = std::getenv("KILN_BENCH_ROW");
  return !only || std::string(name).find(only) != std::string::npos;
}

// GB/s of a device copy that moves `bytes` in all (half read, half written), timed as the
// rows are. NOTE: on an H200 a copy of W3's bytes (128 MiB each way) reached 93% of the 2 GiB
// ceiling, 98% with a clean L2: the flush leaves dirty lines that a short kernel pays for.
// Measured once per size (W8's three rows move the same bytes).
static double copy_of(double bytes) {
  static std::map<size_t, double> measured;
  size_t half = size_t(bytes / 2) / 16 * 16;
  if (half == 0) return copy_gbs;
  if (auto it = measured.find(half); it != measured.end()) return it->second;
  auto a = cu::device_alloc(half), b = cu::device_alloc(half);
  return measured[half] = 2.0 * double(half) / time_ms([&] { cu::copy_on_device(b, a, half); }, 10) / 1e6;
}

static void report(const Row& r) {
  rows.push_back(r);
  double gbs = r.bytes / r.fused_ms / 1e6;
  std::printf("%-26s fused %8.4f ms  eager %8.4f ms  %7.0f GB/s  %5.1f%% of copy (%5.1f%% of a copy of its bytes)  eager/fused "
              "%5.2fx  kernels %zu  rel.err %.1e\n",
              r.name.c_str(), r.fused_ms, r.eager_ms, gbs, 100 * gbs / copy_gbs, 100 * gbs / copy_of(r.bytes), r.eager_ms / r.fused_ms,
              r.kernels, r.err);
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  bool sweep = false;
  const char* jsonl = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--sweep") sweep = true;
    else jsonl = argv[i];
  }
  if (!cu::cuda_available() || cu::cuda_device_count() == 0) {
    std::printf("gpu_bench: no CUDA GPU on this machine; nothing measured\n");
    return 0;
  }
  const auto& props = cu::cuda_device().properties();
  std::printf("device: %s, %d SMs, sm_%d%d\n", props.name.c_str(), props.sm_count, props.cc_major, props.cc_minor);

  // KILN_BENCH_ONLY=gemm: the GEMM rows alone (a short device lease).
  const char* only = std::getenv("KILN_BENCH_ONLY");
  bool all = !only || !*only;
  if (all || std::string(only) == "gemm") gemm_benches();
  if (!all && std::string(only) == "prologue") prologue_benches();  // KILN_BENCH_ONLY=prologue: those rows alone
  if (!all && std::string(only) == "small") small_gemm_benches();    // KILN_BENCH_ONLY=small: f32 GEMMs of few tiles
  if (!all && std::string(only) == "tf32") tf32_gemm_benches();     // KILN_BENCH_ONLY=tf32: the TF32 rows alone
  if (!all && std::string(only) == "energy") gemm_energy_bench();   // KILN_BENCH_ONLY=energy: W4's GEMMs, energy per call
  if (!all && std::string(only) == "epilogue") epilogue_cost_bench();  // KILN_BENCH_ONLY=epilogue: x @ W1's epilogue taken apart
  if (!all && std::string(only) == "w4-flush") w4_flush_timeline_bench();  // KILN_BENCH_ONLY=w4-flush: the step's kernels after a flush
  // KILN_BENCH_ONLY=w4: the W4 training step alone.
  std::string w4_only = !all && std::string(only) == "w4" ? w4_step_bench() : "";
  // KILN_BENCH_ONLY=rows: the copy ceiling and the memory-bound rows (W1, W2, W3, W8, split rows, the W4
  // loss's rows over 2 dims; --sweep too).
  bool rows_only = !all && std::string(only) == "rows";
  if (!all && !rows_only) {
    if (jsonl) {
      std::ofstream out(jsonl);
      write_gemm_rows(out);
      out << w4_only;
    }
    return 0;
  }

  {  // ceiling: device-to-device copy of 2 GiB, read + write counted
    size_t bytes = size_t(2) << 30;
    auto a = cu::device_alloc(bytes), b = cu::device_alloc(bytes);
    double ms = time_ms([&] { cu::copy_on_device(b, a, bytes); }, 10);
    copy_gbs = 2.0 * double(bytes) / ms / 1e6;
    std::printf("ceiling: device copy %.0f GB/s\n", copy_gbs);
  }

  if (wanted("W1")) {  // W1: y = gelu(x*a+b) * sigmoid(x), f32, 2^26
    int64_t n = int64_t(1) << 26;
    Tensor<f32, 1> x = randn<f32>(Shape<1>{n}, 1), a = randn<f32>(Shape<1>{n}, 2), b = randn<f32>(Shape<1>{n}, 3);
    auto f = [&] { return gelu(x * a + b) * sigmoid(x); };
    Tensor<f32, 1> y = f();
    auto xv = x.to_vector(), av = a.to_vector(), bv = b.to_vector(), yv = y.to_vector();
    std::vector<double> ref(static_cast<size_t>(n));
    for (size_t i = 0; i < ref.size(); ++i) {
      double t = xv[i] * av[i] + bv[i];
      ref[i] = 0.5 * t * (1 + std::erf(t / std::sqrt(2.0))) / (1 + std::exp(-xv[i]));
    }
    report({"W1 gelu chain f32", time_ms([&] { Tensor<f32, 1> o = f(); }), time_ms([&] { auto o = eval_eager(f()); }),
            4.0 * n * 4, max_rel(yv, ref), kernel_count(Mode::fused, f())});
  }
  auto check_rows = [](const std::vector<double>& got, const std::vector<double>& ref) { return max_rel(got, ref); };
  if (wanted("W2")) {  // W2: softmax over the last dim, f32 [8192, 8192]
    int64_t R = 8192, C = 8192;
    Tensor<f32, 2> x = randn<f32>(Shape<2>{R, C}, 4);
    Tensor<f32, 2> y = softmax(x, -1);
    report({"W2 softmax f32", time_ms([&] { Tensor<f32, 2> o = softmax(x, -1); }),
            time_ms([&] { auto o = eval_eager(softmax(x, -1)); }), 2.0 * R * C * 4, softmax_error(x, y, 64),
            kernel_count(Mode::fused, softmax(x, -1))});
  }
  if (const char* name = "softmax f32 [2048,65536] long rows"; wanted(name)) {
    // Rows too long to keep in registers: the one-pass online softmax reads each row twice
    // (max and sum together, then the stores); the bytes counted are one read and one write.
    int64_t R = 2048, C = 65536;
    Tensor<f32, 2> x = randn<f32>(Shape<2>{R, C}, 20);
    Tensor<f32, 2> y = softmax(x, -1);
    report({name, time_ms([&] { Tensor<f32, 2> o = softmax(x, -1); }), time_ms([&] { auto o = eval_eager(softmax(x, -1)); }),
            2.0 * R * C * 4, softmax_error(x, y, 8), kernel_count(Mode::fused, softmax(x, -1))});
  }
  if (wanted("W3")) {  // W3: layer norm with weight and bias, bf16 [16384, 4096], eps 1e-5
    int64_t R = 16384, C = 4096;
    Tensor<bf16, 2> x = cast<bf16>(randn<f32>(Shape<2>{R, C}, 5));
    Tensor<bf16, 1> w = cast<bf16>(randn<f32>(Shape<1>{C}, 6)), b = cast<bf16>(randn<f32>(Shape<1>{C}, 7));
    Tensor<bf16, 2> y = layer_norm(x, w, b, 1e-5);
    auto xs = x.slice(0, 0, 64).to_vector(), ys = y.slice(0, 0, 64).to_vector(), wv = w.to_vector(), bv = b.to_vector();
    std::vector<double> ref(xs.size());
    for (int64_t r = 0; r < 64; ++r) {
      double m = 0, v = 0;
      for (int64_t c = 0; c < C; ++c) m += xs[size_t(r * C + c)];
      m /= double(C);
      for (int64_t c = 0; c < C; ++c) v += (xs[size_t(r * C + c)] - m) * (xs[size_t(r * C + c)] - m);
      v /= double(C);
      for (int64_t c = 0; c < C; ++c) ref[size_t(r * C + c)] = (xs[size_t(r * C + c)] - m) / std::sqrt(v + 1e-5) * wv[size_t(c)] + bv[size_t(c)];
    }
    report({"W3 layer_norm bf16", time_ms([&] { Tensor<bf16, 2> o = layer_norm(x, w, b, 1e-5); }),
            time_ms([&] { auto o = eval_eager(layer_norm(x, w, b, 1e-5)); }), 2.0 * R * C * 2 + 2.0 * C * 2,
            check_rows(ys, ref), kernel_count(Mode::fused, layer_norm(x, w, b, 1e-5))});
  }
  if (const char* name = "x*w+b bf16 [16384,4096]"; wanted(name)) {
    // A weight and bias along the rows, pointwise (W3's shape): the two dims do not merge,
    // so each 16-byte chunk finds its row and column by a division.
    int64_t R = 16384, C = 4096;
    Tensor<bf16, 2> x = cast<bf16>(randn<f32>(Shape<2>{R, C}, 5));
    Tensor<bf16, 1> w = cast<bf16>(randn<f32>(Shape<1>{C}, 6)), b = cast<bf16>(randn<f32>(Shape<1>{C}, 7));
    Tensor<bf16, 2> y = x * w + b;
    // the last 64 rows (their row indices need the division's whole range)
    auto xs = x.slice(0, R - 64, R).to_vector(), ys = y.slice(0, R - 64, R).to_vector(), wv = w.to_vector(), bv = b.to_vector();
    std::vector<double> ref(xs.size());
    for (size_t e = 0; e < ref.size(); ++e) ref[e] = xs[e] * wv[e % size_t(C)] + bv[e % size_t(C)];
    report({name, time_ms([&] { Tensor<bf16, 2> o = x * w + b; }), time_ms([&] { auto o = eval_eager(x * w + b); }),
            2.0 * R * C * 2 + 2.0 * C * 2, check_rows(ys, ref), kernel_count(Mode::fused, x * w + b)});
  }
  if (wanted("W8")) {  // W8: sum, var_mean, and both in one function over the last dim, f32 [32768, 4096]
    int64_t R = 32768, C = 4096;
    Tensor<f32, 2> x = randn<f32>(Shape<2>{R, C}, 8);
    auto [v, m] = eval(var_mean(x, -1));
    Tensor<f32, 1> s = sum(x, -1);
    auto xs = x.slice(0, 0, 64).to_vector(), vs = v.slice(0, 0, 64).to_vector(), ms = m.slice(0, 0, 64).to_vector(),
         ss = s.slice(0, 0, 64).to_vector();
    std::vector<double> rv(64), rm(64), rs(64);
    for (size_t r = 0; r < 64; ++r) {
      for (int64_t c = 0; c < C; ++c) rs[r] += xs[r * size_t(C) + size_t(c)];
      rm[r] = rs[r] / double(C);
      for (int64_t c = 0; c < C; ++c) rv[r] += std::pow(xs[r * size_t(C) + size_t(c)] - rm[r], 2);
      rv[r] /= double(C - 1);
    }
    double bytes = double(R) * C * 4;
    report({"W8 sum f32", time_ms([&] { Tensor<f32, 1> o = sum(x, -1); }), time_ms([&] { auto o = eval_eager(sum(x, -1)); }),
            bytes + R * 4.0, max_rel(ss, rs), kernel_count(Mode::fused, sum(x, -1))});
    report({"W8 var_mean f32", time_ms([&] { auto o = eval(var_mean(x, -1)); }),
            time_ms([&] { auto o = eval_eager(var_mean(x, -1)); }), bytes + R * 8.0,
            std::max(max_rel(vs, rv), max_rel(ms, rm)), kernel_count(Mode::fused, std::get<0>(var_mean(x, -1)), std::get<1>(var_mean(x, -1)))});
    auto both = [&] { auto [vv, mm] = var_mean(x, -1); return std::tuple{sum(x, -1), vv, mm}; };
    auto [s3, v3, m3] = eval(both());
    double err3 = std::max({max_rel(s3.slice(0, 0, 64).to_vector(), rs), max_rel(v3.slice(0, 0, 64).to_vector(), rv),
                            max_rel(m3.slice(0, 0, 64).to_vector(), rm)});
    auto [b0, b1, b2] = both();
    report({"W8 sum+var_mean f32", time_ms([&] { auto o = eval(both()); }), time_ms([&] { auto o = eval_eager(both()); }),
            bytes + R * 12.0, err3, kernel_count(Mode::fused, b0, b1, b2)});
  }
  if (wanted("split")) {  // few long rows: sum over [4, 2^24] f32, split rows (several blocks per row, partials combined)
    int64_t R = 4, C = int64_t(1) << 24;
    Tensor<f32, 2> x = randn<f32>(Shape<2>{R, C}, 17);
    Tensor<f32, 1> s = sum(x, -1);
    auto xs = x.to_vector(), ss = s.to_vector();
    std::vector<double> rs(static_cast<size_t>(R), 0.0);
    for (size_t i = 0; i < xs.size(); ++i) rs[i / size_t(C)] += xs[i];
    report({"sum f32 [4, 2^24] split", time_ms([&] { Tensor<f32, 1> o = sum(x, -1); }),
            time_ms([&] { auto o = eval_eager(sum(x, -1)); }), double(R) * C * 4 + R * 4.0, max_rel(ss, rs),
            kernel_count(Mode::fused, sum(x, -1))});
  }
  // W4's bias gradients: column sums of dh (db1) and of dy (db2), bf16 in and out, f32 sums.
  // NOTE: in the W4 step on an H200 they took 76-81 and 36-46 us (KILN_PROFILE; docs/benchmarks.md,
  // twenty-fourth session), about twice a copy of their bytes: these rows time them alone, beside
  // torch's x.sum(0) (bench/torch_rows.py).
  for (int64_t C : {int64_t(16384), int64_t(4096)}) {
    const std::string name = "sum(x, 0) bf16 [8192," + std::to_string(C) + "]";
    if (!wanted(name.c_str())) continue;
    const int64_t R = 8192;
    Tensor<bf16, 2> x = cast<bf16>(randn<f32>(Shape<2>{R, C}, 21));
    Tensor<bf16, 1> s = sum(x, 0);
    // Checked on the first 64 columns (every row of them): the whole input is 256 MB.
    auto xv = x.slice(1, 0, 64).to_vector();
    std::vector<double> ref(64, 0.0);
    for (size_t i = 0; i < xv.size(); ++i) ref[i % 64] += xv[i];
    report({name, time_ms([&] { Tensor<bf16, 1> o = sum(x, 0); }), time_ms([&] { auto o = eval_eager(sum(x, 0)); }),
            double(R) * C * 2 + C * 2.0, max_rel(s.slice(0, 0, 64).to_vector(), ref), kernel_count(Mode::fused, sum(x, 0))});
  }
  if (const char* name = "sum((y+b)^2) bf16 [8192,4096] (2 dims)"; wanted(name)) {
    // The W4 loss's kernel: a sum over two dims that the bias b, broadcast over the rows, keeps
    // apart (16-byte chunks within rows, split across blocks).
    int64_t R = 8192, C = 4096;
    Tensor<bf16, 2> y = cast<bf16>(randn<f32>(Shape<2>{R, C}, 18));
    Tensor<bf16, 1> b = cast<bf16>(randn<f32>(Shape<1>{C}, 19));
    auto f = [&] {
      auto e = cast<f32>(y + b);
      return sum(e * e);
    };
    Tensor<f32, 0> s = f();
    auto yv = y.to_vector(), bv = b.to_vector();
    double ref = 0;
    for (size_t i = 0; i < yv.size(); ++i) ref += (yv[i] + bv[i % size_t(C)]) * (yv[i] + bv[i % size_t(C)]);
    report({name, time_ms([&] { Tensor<f32, 0> o = f(); }), time_ms([&] { auto o = eval_eager(f()); }), double(R) * C * 2 + C * 2.0 + 4,
            max_rel(s.to_vector(), {ref}), kernel_count(Mode::fused, f())});
  }
  if (std::getenv("KILN_BENCH_PRELOAD_AB")) {  // weights loaded with the kept row (before the reductions), off and on alternated
    Tensor<f32, 2> x2 = randn<f32>(Shape<2>{8192, 8192}, 4), x8 = randn<f32>(Shape<2>{32768, 4096}, 8);
    Tensor<bf16, 2> x3 = cast<bf16>(randn<f32>(Shape<2>{16384, 4096}, 5));
    Tensor<f32, 2> x3f = randn<f32>(Shape<2>{8192, 4096}, 9);
    Tensor<bf16, 1> w = cast<bf16>(randn<f32>(Shape<1>{4096}, 6)), b = cast<bf16>(randn<f32>(Shape<1>{4096}, 7));
    Tensor<f32, 1> wf = randn<f32>(Shape<1>{4096}, 10), bf = randn<f32>(Shape<1>{4096}, 11);
    auto pct = [&](double bytes, double ms) { return 100.0 * bytes / ms / 1e6 / copy_gbs; };
    std::vector<double> w3_off, rms_off;  // bf16 values, exact in double
    std::printf("preload A/B: %% of copy with the weights of rows kept in registers loaded where used (-1) and with the row (1)\n"
                "%-6s %-8s %8s %8s %8s %8s %10s %12s %s\n", "round", "preload", "W2", "W3", "W8 sum", "W8 vm", "rms_norm", "W3 f32 8192", "W3 and rms_norm bits as off");
    for (int r = 0; r < 3; ++r)
      for (int pre : {-1, 1}) {
        runtime::gpu_rows_preload() = pre;
        double w2 = pct(2.0 * 8192 * 8192 * 4, time_ms([&] { Tensor<f32, 2> o = softmax(x2, -1); }));
        double w3 = pct(2.0 * 16384 * 4096 * 2, time_ms([&] { Tensor<bf16, 2> o = layer_norm(x3, w, b, 1e-5); }));
        double w8 = pct(32768.0 * 4096 * 4, time_ms([&] { Tensor<f32, 1> o = sum(x8, -1); }));
        double vm = pct(32768.0 * 4096 * 4, time_ms([&] { auto o = eval(var_mean(x8, -1)); }));
        double rms = pct(2.0 * 16384 * 4096 * 2, time_ms([&] { Tensor<bf16, 2> o = rms_norm(x3, w, 1e-6); }));
        double lnf = pct(2.0 * 8192 * 4096 * 4, time_ms([&] { Tensor<f32, 2> o = layer_norm(x3f, wf, bf, 1e-5); }));
        Tensor<bf16, 2> o3 = layer_norm(x3, w, b, 1e-5), orms = rms_norm(x3, w, 1e-6);
        const std::vector<double> v3 = o3.to_vector(), vr = orms.to_vector();
        if (pre < 0) w3_off = v3, rms_off = vr;
        std::printf("%-6d %-8d %7.1f%% %7.1f%% %7.1f%% %7.1f%% %9.1f%% %11.1f%% %s\n", r, pre, w2, w3, w8, vm, rms, lnf,
                    v3 == w3_off && vr == rms_off ? "yes" : "NO");
        std::fflush(stdout);
      }
    runtime::gpu_rows_preload() = 0;
  }
  if (std::getenv("KILN_BENCH_KEEP_AB")) {  // the rows kept in registers loaded L2 evict_last, off and on alternated
    Tensor<f32, 2> x2 = randn<f32>(Shape<2>{8192, 8192}, 4), x8 = randn<f32>(Shape<2>{32768, 4096}, 8);
    Tensor<f32, 2> xl = randn<f32>(Shape<2>{2048, 65536}, 20);
    Tensor<bf16, 2> x3 = cast<bf16>(randn<f32>(Shape<2>{16384, 4096}, 5)), s1 = cast<bf16>(randn<f32>(Shape<2>{8192, 16384}, 21)),
                    s2 = cast<bf16>(randn<f32>(Shape<2>{8192, 4096}, 22));
    Tensor<bf16, 1> w = cast<bf16>(randn<f32>(Shape<1>{4096}, 6)), b = cast<bf16>(randn<f32>(Shape<1>{4096}, 7));
    int64_t n = int64_t(1) << 26;
    Tensor<f32, 1> x = randn<f32>(Shape<1>{n}, 1), a = randn<f32>(Shape<1>{n}, 2), bb = randn<f32>(Shape<1>{n}, 3);
    Tensor<f32, 1> r24 = randn<f32>(Shape<1>{6 << 20}, 23);
    Tensor<bf16, 2> ga = cast<bf16>(randn<f32>(Shape<2>{4096, 2048}, 24)), gb = cast<bf16>(randn<f32>(Shape<2>{2048, 4096}, 25));
    auto pct = [&](double bytes, double ms) { return 100.0 * bytes / ms / 1e6 / copy_gbs; };
    std::printf("keep A/B: %% of copy with the rows kept in registers loaded L2 evict_last off (-1) and on (1)\n%-6s %-5s %8s %8s %8s %8s %8s %8s %8s %8s %8s %s %s\n", "round",
                "keep", "W1", "W2", "W3", "W8 sum", "W8 vm", "long sm", "x*w+b", "db1 sum0", "db2 sum0", "us sum(24M) after W3", "us GEMM after W3");
    for (int r = 0; r < 3; ++r)
      for (int keep : {-1, 1}) {
        runtime::gpu_loads_keep() = keep;
        double w1 = pct(4.0 * n * 4, time_ms([&] { Tensor<f32, 1> o = gelu(x * a + bb) * sigmoid(x); }));
        double w2 = pct(2.0 * 8192 * 8192 * 4, time_ms([&] { Tensor<f32, 2> o = softmax(x2, -1); }));
        double w3 = pct(2.0 * 16384 * 4096 * 2, time_ms([&] { Tensor<bf16, 2> o = layer_norm(x3, w, b, 1e-5); }));
        double w8 = pct(32768.0 * 4096 * 4, time_ms([&] { Tensor<f32, 1> o = sum(x8, -1); }));
        double vm = pct(32768.0 * 4096 * 4, time_ms([&] { auto o = eval(var_mean(x8, -1)); }));
        double ls = pct(2.0 * 2048 * 65536 * 4, time_ms([&] { Tensor<f32, 2> o = softmax(xl, -1); }));
        double xwb = pct(2.0 * 16384 * 4096 * 2, time_ms([&] { Tensor<bf16, 2> o = x3 * w + b; }));
        double c1 = pct(8192.0 * 16384 * 2, time_ms([&] { Tensor<bf16, 1> o = sum(s1, 0); }));
        double c2 = pct(8192.0 * 4096 * 2, time_ms([&] { Tensor<bf16, 1> o = sum(s2, 0); }));
        // what W3's rows leave in the L2 for the next kernel: a sum over 24 MiB after each layer_norm, back to back
        double ln = loop_ms([&] { Tensor<bf16, 2> o = layer_norm(x3, w, b, 1e-5); }, 50);
        double after = loop_ms([&] { Tensor<bf16, 2> o = layer_norm(x3, w, b, 1e-5); Tensor<f32, 0> t = sum(r24); }, 50) - ln;
        // and a GEMM of [4096, 2048] x [2048, 4096] bf16 (32 MiB of operands) after each layer_norm
        double gemm = loop_ms([&] { Tensor<bf16, 2> o = layer_norm(x3, w, b, 1e-5); Tensor<bf16, 2> m = matmul(ga, gb); }, 50) - ln;
        std::printf("%-6d %-5d %7.1f%% %7.1f%% %7.1f%% %7.1f%% %7.1f%% %7.1f%% %7.1f%% %7.1f%% %7.1f%% %8.1f %8.1f\n", r, keep, w1, w2, w3, w8, vm, ls, xwb, c1, c2,
                    after * 1000, gemm * 1000);
        std::fflush(stdout);
      }
    runtime::gpu_loads_keep() = 0;
  }
  if (sweep) {  // block rows: kiln's choice against each fixed block size, residency and streaming mode
    int64_t C2 = 8192, C3 = 4096;
    Tensor<f32, 2> x2 = randn<f32>(Shape<2>{8192, C2}, 4), x8 = randn<f32>(Shape<2>{32768, 4096}, 8);
    Tensor<f32, 2> xl = randn<f32>(Shape<2>{2048, 65536}, 20);
    Tensor<bf16, 2> x3 = cast<bf16>(randn<f32>(Shape<2>{16384, C3}, 5));
    Tensor<bf16, 1> w = cast<bf16>(randn<f32>(Shape<1>{C3}, 6)), b = cast<bf16>(randn<f32>(Shape<1>{C3}, 7));
    std::printf("sweep: %% of copy by exact rows (0: kiln's choice, where the row is the threads' chunks; -1 off), the "
                "streaming mode of rows (0: kiln's choice, on where kept; -1 off; 1 on), the threads an SM keeps resident "
                "(launch bounds) and the block size of block rows (0: kiln's choice)\n"
                "%-6s %-6s %-8s %-8s %8s %8s %8s %8s %8s\n", "exact", "stream", "resident", "threads", "W2", "W3", "W8 sum", "W8 vm",
                "long sm");
    for (int exact : {0, -1})
    for (int streaming : {0, 1})
    for (int resident : {0, 1024, 1280, 1536})
    for (int t : {0, 128, 256, 512}) {
      if (streaming == 1 && (exact != 0 || resident != 0 || t != 0)) continue;
      if (exact == -1 && t != 0) continue;
      runtime::gpu_rows_exact() = exact;
      runtime::gpu_rows_streaming() = streaming;
      runtime::gpu_block_rows_resident() = resident;
      runtime::gpu_block_rows_threads() = t;
      auto pct = [&](double bytes, double ms) { return 100.0 * bytes / ms / 1e6 / copy_gbs; };
      double w2 = pct(2.0 * 8192 * C2 * 4, time_ms([&] { Tensor<f32, 2> o = softmax(x2, -1); }));
      double w3 = pct(2.0 * 16384 * C3 * 2, time_ms([&] { Tensor<bf16, 2> o = layer_norm(x3, w, b, 1e-5); }));
      double w8 = pct(32768.0 * 4096 * 4, time_ms([&] { Tensor<f32, 1> o = sum(x8, -1); }));
      double vm = pct(32768.0 * 4096 * 4, time_ms([&] { auto o = eval(var_mean(x8, -1)); }));
      double ls = t ? 0 : pct(2.0 * 2048 * 65536 * 4, time_ms([&] { Tensor<f32, 2> o = softmax(xl, -1); }));
      std::printf("%-6d %-6d %-8d %-8d %7.1f%% %7.1f%% %7.1f%% %7.1f%% %7.1f%%\n", exact, streaming, resident, t, w2, w3, w8, vm, ls);
      std::fflush(stdout);
    }
    runtime::gpu_rows_exact() = 0;
    runtime::gpu_rows_streaming() = 0;
    runtime::gpu_block_rows_resident() = 0;
    runtime::gpu_block_rows_threads() = 0;
    int64_t n = int64_t(1) << 26;
    Tensor<f32, 1> x = randn<f32>(Shape<1>{n}, 1), a = randn<f32>(Shape<1>{n}, 2), bb = randn<f32>(Shape<1>{n}, 3);
    std::printf("sweep: W1 %% of copy by the cap on blocks per SM of pointwise kernels (0: kiln's choice, no cap)\n");
    for (int per_sm : {0, 4, 8, 16, 32}) {
      runtime::gpu_pointwise_blocks_per_sm() = per_sm;
      double ms = time_ms([&] { Tensor<f32, 1> o = gelu(x * a + bb) * sigmoid(x); });
      std::printf("%-8d %7.1f%%\n", per_sm, 100.0 * 4.0 * n * 4 / ms / 1e6 / copy_gbs);
      std::fflush(stdout);
    }
    runtime::gpu_pointwise_blocks_per_sm() = 0;
  }
  std::string w4_json = rows_only ? "" : w4_step_bench();
  HostRows h;
  {  // launch floor and a compiled x+1 on one element, back to back
    // The floor: the same work (read one float, write one) launched straight through the driver,
    // so that the difference is kiln's host work alone, not the kernels' own time on the GPU.
    // Also an empty launch (the floor of earlier runs).
    auto& mod = cu::load_cuda_module(
        "extern \"C\" __global__ void k(const float* a, float* o) { if (o) o[threadIdx.x] = a[threadIdx.x] + 1.0f; }");
    auto fn = mod.function("k");
    Tensor<f32, 1> t = randn<f32>(Shape<1>{1}, 9), o = randn<f32>(Shape<1>{1}, 10);
    const void* in = t.data_ptr();
    void* out = o.data_ptr();
    void* params[] = {&in, &out};
    void* none = nullptr;
    void* empty_params[] = {&in, &none};
    double empty_us = wall_us([&] { fn.launch({1, 1, 1}, {32, 1, 1}, 0, empty_params, "floor", cu::cuda_device().stream()); });
    auto f = compile([](const Tensor<f32, 1>& a) { return a + 1.0f; });
    // The floor and the compiled call alternated, 7 rounds: the host's speed drifts between
    // figures taken apart (the overhead read 1.1 to 2.2 us in single pairs on H200 hosts).
    std::vector<double> floors, calls, over;
    for (int r = 0; r < 7; ++r) {
      floors.push_back(wall_us([&] { fn.launch({1, 1, 1}, {1, 1, 1}, 0, params, "floor", cu::cuda_device().stream()); }));
      calls.push_back(wall_us([&] { auto o = f(t); }));
      over.push_back(calls.back() - floors.back());
    }
    h.floor_us = median(floors), h.plus_one_us = h.floor_us + median(over);
    std::printf("host: launch floor %.2f us/call (the same x+1 through the driver; an empty kernel %.2f), compiled x+1 %.2f us/call "
                "(overhead %.2f us: the median of 7 alternated rounds, %.2f to %.2f)\n",
                h.floor_us, empty_us, median(calls), median(over), *std::min_element(over.begin(), over.end()),
                *std::max_element(over.begin(), over.end()));
    auto ro = compile([](const Tensor<f32, 1>& a) { return a + 1.0f; }, Mode::reduce_overhead);
    h.plus_one_ro_us = wall_us([&] { auto o = ro(t); });
    std::printf("host: compiled x+1 in reduce-overhead (a graph of one kernel, replayed) %.2f us/call\n", h.plus_one_ro_us);
  }
  {  // W7: MLP 256 -> 256 -> 256 -> 10 with ReLU, batch 32, f32; microseconds per call
    auto W = [](int64_t o, int64_t i, uint64_t seed) { return Tensor<f32, 2>(randn<f32>(Shape<2>{o, i}, seed) * (1.0 / std::sqrt(double(i)))); };
    Tensor<f32, 2> x = randn<f32>(Shape<2>{32, 256}, 10), W1 = W(256, 256, 11), W2 = W(256, 256, 12), W3 = W(10, 256, 13);
    Tensor<f32, 1> b1 = randn<f32>(Shape<1>{256}, 14), b2 = randn<f32>(Shape<1>{256}, 15), b3 = randn<f32>(Shape<1>{10}, 16);
    auto mlp = [&] { return linear(relu(linear(relu(linear(x, W1, b1)), W2, b2)), W3, b3); };
    h.w7_us = wall_us([&] { Tensor<f32, 2> o = mlp(); }, 500);
    h.w7_eager_us = wall_us([&] { auto o = eval_eager(mlp()); }, 500);
    Tensor<f32, 2> want = mlp(), got = evaluate(Mode::reduce_overhead, mlp());
    double err = max_rel(got.to_vector(), want.to_vector());
    auto c0 = counters();
    h.w7_ro_us = wall_us([&] { Tensor<f32, 2> o = evaluate(Mode::reduce_overhead, mlp()); }, 500);
    auto c1 = counters();
    h.w7_ro_calls = c1.graph_replays - c0.graph_replays, h.w7_ro_built = c1.graphs_built - c0.graphs_built;
    h.w7_ro_updates = c1.graph_updates - c0.graph_updates;
    std::printf("W7 small MLP f32            fused %.1f us/call  eager %.1f us/call  reduce-overhead %.1f us/call  kernels %zu "
                "(reduce-overhead: %llu replays, %llu graphs built, %llu node updates; max rel. diff from fused %.1e)\n",
                h.w7_us, h.w7_eager_us, h.w7_ro_us, kernel_count(Mode::fused, mlp()), (unsigned long long)h.w7_ro_calls,
                (unsigned long long)h.w7_ro_built, (unsigned long long)h.w7_ro_updates, err);
    if (std::getenv("KILN_BENCH_PDL_AB")) {  // W7's kernels started as the one before ends (kiln::programmatic_launch), off and on
      for (int r = 0; r < 3; ++r)
        for (bool on : {false, true}) {
          set_programmatic_launch(on);
          Counters c = counters();
          Tensor<f32, 2> o = mlp();
          const uint64_t early = counters().kernels_programmatic - c.kernels_programmatic;
          const bool same = o.to_vector() == want.to_vector();
          double fused = wall_us([&] { Tensor<f32, 2> q = mlp(); }, 500), eager = wall_us([&] { auto q = eval_eager(mlp()); }, 500);
          double graph = wall_us([&] { Tensor<f32, 2> q = evaluate(Mode::reduce_overhead, mlp()); }, 500);
          std::printf("W7 round %d, programmatic launch %-3s (%llu of a call's kernels early) fused %.1f us/call, eager %.1f us/call, "
                      "reduce-overhead %.1f us/call; %s\n",
                      r, on ? "on" : "off", (unsigned long long)early, fused, eager, graph, same ? "bit for bit" : "DIFFERS");
          std::fflush(stdout);
        }
      set_programmatic_launch(true);  // kiln's default
    }
    if (std::getenv("KILN_BENCH_W7_SWEEP")) {  // W7 in reduce-overhead with each SIMT config forced on its three GEMMs
      using K = codegen::GemmKind;
      std::vector<codegen::GemmConfig> configs = codegen::gemm_candidates(DType::f32, 0);  // arch 0: the SIMT ones
      for (const codegen::GemmConfig& c : split_probes({codegen::gemm_sliced({K::simt, 32, 32, 32, 4, 4, 1}, 4),
                                                        {K::simt, 32, 32, 16, 2, 2, 1}, {K::simt, 64, 64, 16, 4, 4, 1}}))
        configs.push_back(c);
      for (const codegen::GemmConfig& c : configs) {
        codegen::gemm_chooser() = [c](const codegen::GemmProblem&) { return std::optional<codegen::GemmConfig>(c); };
        Tensor<f32, 2> o = evaluate(Mode::reduce_overhead, mlp());
        double e = max_rel(o.to_vector(), want.to_vector());
        double us = wall_us([&] { Tensor<f32, 2> r = evaluate(Mode::reduce_overhead, mlp()); }, 300);
        std::printf("W7 forced %-36s reduce-overhead %.1f us/call (max rel. diff %.1e)\n", c.str().c_str(), us, e);
        std::fflush(stdout);
      }
      codegen::gemm_chooser() = {};
    }
  }
  if (jsonl) write_rows(jsonl, h, w4_json);
  auto c = counters();
  std::printf("counters: compiles %llu, memory hits %llu, disk hits %llu, kernels launched %llu\n",
              (unsigned long long)c.compiles, (unsigned long long)c.memory_hits, (unsigned long long)c.disk_hits,
              (unsigned long long)c.kernels_launched);
}
