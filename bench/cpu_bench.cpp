// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The CPU rows of shared/bench/WORKLOADS.md at 1/16 of the element count (W1, W2,
// W3, W8; W4 at reduced width), measured side by side in one run: kiln compiled (fused) and eager, a
// plain fused loop (std::erf/std::exp, OpenMP), Eigen 3.4 arrays, and the machine's
// copy bandwidth; then the JIT's latencies (cold compile, memory hit, disk hit as a
// new process sees it) and how long g++ takes on an example that includes kiln; then
// GEMM rows (square, and W4's products at a quarter of each width): kiln compiled and
// eager beside OpenBLAS, in GFLOP/s.
//   build/bench/cpu_bench [--reps N] [--warm] [--no-latency] [--no-gemm | --only-gemm]
// Method: every output is checked against a float64 reference before timing;
// warm-up calls keep the JIT out of the numbers; the implementations of a workload
// are timed round-robin, so a noisy neighbour hits them alike; before every timed
// call the caches are flushed (--warm: not), since a 1/16 workload fits this
// machine's L3 where the full-size one does not; the median of the runs is reported,
// and the best run beside it (on a busy machine the better estimate of the code).
// `--latency-child` is the bench itself as the new process the JIT latencies need.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <kiln/kiln.hpp>
#include <kiln/codegen/device_files.hpp>
#include <kiln/jit/host_compiler.hpp>

#include "w4.hpp"
#if KILN_BENCH_HAVE_OPENMP
#include <omp.h>
#endif
#if KILN_BENCH_HAVE_BLAS
#include <cblas.h>
#endif
#if KILN_BENCH_HAVE_EIGEN
#include <Eigen/Dense>
#include <unsupported/Eigen/SpecialFunctions>
#endif

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
// CPU seconds (user + system) of the waited-for child processes so far: a compile's
// cost that a busy machine does not inflate the way it inflates wall time.
double children_cpu_s() {
  rusage u{};
  getrusage(RUSAGE_CHILDREN, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}
#if KILN_BENCH_HAVE_OPENMP
int threads() { return omp_get_max_threads(); }
int team_size() { return omp_get_num_threads(); }
int thread_id() { return omp_get_thread_num(); }
#else
int threads() { return 1; }
int team_size() { return 1; }
int thread_id() { return 0; }
#endif
// [lo, hi) of thread t's share of n, in 64-byte-aligned pieces.
std::pair<int64_t, int64_t> share(int64_t n, int t, int nt) {
  int64_t per = (n / nt + 15) / 16 * 16;
  return {std::min(n, per * t), t == nt - 1 ? n : std::min(n, per * (t + 1))};
}
constexpr double kMiB = 1024.0 * 1024.0;

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}
// Which CPU math prelude the kernels were built with (another engineer's file, changing):
// its size and hash, and whether it is the vectorised one or a scalar-libm shim.
std::string prelude_identity() {
  std::string text = kiln::codegen::detail::read_device_file("cpu_math.hpp");
  bool simd = text.find("declare simd") != std::string::npos;
  return "codegen/device/cpu_math.hpp, " + std::to_string(std::count(text.begin(), text.end(), '\n')) + " lines, hash " +
         kiln::hash_bytes(text).hex().substr(0, 12) + (simd ? ", vectorised (omp declare simd)" : ", scalar libm shim");
}

// ---- the kernels of each workload, as kiln expressions (shared by the timed rows
// and the latency child) ----
auto w1 = [](const auto& x, const auto& a, const auto& b) { return kiln::gelu(x * a + b) * kiln::sigmoid(x); };
auto w2 = [](const auto& x) { return kiln::softmax(x, -1); };
auto w3 = [](const auto& x, const auto& w, const auto& b) { return kiln::layer_norm(x, w, b, 1e-5); };
auto w8 = [](const auto& x) { return kiln::var_mean(x, -1); };

// ---- cache flush: streams a buffer twice the L3 through every core ----
struct Flusher {
  std::vector<uint64_t> buf;
  volatile uint64_t sink = 0;
  Flusher() {
    long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    size_t bytes = std::clamp<size_t>(l3 > 0 ? size_t(l3) * 2 : 0, 64u << 20, 1u << 30);
    buf.assign(bytes / 8, 1);
  }
  void operator()() {
    uint64_t s = 0;
    const int64_t n = int64_t(buf.size());
#pragma omp parallel for reduction(+ : s) schedule(static)
    for (int64_t i = 0; i < n; i += 8) s += buf[size_t(i)];
    sink = sink + s;
  }
};

// ---- random inputs and the checks ----
std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}
// The value a bf16 tensor holds for x (inputs are rounded once, the reference reads the rounded value).
float bf16_round(float x) { return kiln::bf16_to_float(kiln::float_to_bf16(x)); }

template <class DT, int R>
kiln::Tensor<DT, R> tensor(kiln::Shape<R> shape, const std::vector<float>& v) {
  auto t = kiln::Tensor<DT, R>::empty(shape, kiln::cpu());
  auto* p = t.host_data();
  for (size_t i = 0; i < v.size(); ++i) p[i] = kiln::from_double<DT>(v[i]);
  return t;
}

struct Tol {
  double atol, rtol;
};
// max |y - ref| / (atol + rtol |ref|): <= 1 passes.
double scaled_error(const std::vector<double>& y, const std::vector<double>& ref, Tol tol) {
  if (y.size() != ref.size()) return INFINITY;
  double e = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    double d = std::fabs(y[i] - ref[i]) / (tol.atol + tol.rtol * std::fabs(ref[i]));
    e = std::isnan(d) ? INFINITY : std::max(e, d);
  }
  return e;
}
// The float64 reference's (mean, sum of squared deviations) of one row.
std::pair<double, double> mean_m2(const float* x, int64_t n) {
  double s = 0, ss = 0;
  for (int64_t j = 0; j < n; ++j) s += x[j];
  const double m = s / double(n);
  for (int64_t j = 0; j < n; ++j) ss += (x[j] - m) * (x[j] - m);
  return {m, ss};
}
std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }
std::vector<double> widen_bf16(const std::vector<uint16_t>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = kiln::bf16_to_float(v[i]);
  return out;
}

// ---- one implementation of one workload ----
using Outs = std::vector<std::vector<double>>;  // its outputs, as double
struct Impl {
  std::string name;
  double bytes;                                          // each input read once, each output written once
  std::function<void()> run;                             // writes its outputs
  std::function<Outs()> out;                             // the outputs after run(), as double
  std::vector<double> ms, cpu_ms;  // wall and process CPU time (every thread's) per call
  double tol_scale = 1;  // > 1 where the implementation rounds more often by design (see its name)
  double faults = 0, error = NAN;
  bool ok = false;
  double ms_median() const { return median(ms); }
  double ms_best() const { return ms.empty() ? NAN : *std::min_element(ms.begin(), ms.end()); }
  double ms_of(bool best) const { return best ? ms_best() : ms_median(); }
  double cpu_best() const { return cpu_ms.empty() ? NAN : *std::min_element(cpu_ms.begin(), cpu_ms.end()); }
  double gbs(bool best = false) const { return bytes / (ms_of(best) * 1e-3) / 1e9; }
};

struct Options {
  int reps = 21;
  bool flush = true, latency = true, gemm = true, only_gemm = false;
};

// Checks every implementation, then times them round-robin.
void measure(std::vector<Impl>& impls, const Outs& ref, Tol tol, const Options& o,
             Flusher& flush) {
  for (auto& im : impls) {
    im.run();  // first call: JIT compile (or cache hit), first touch of the outputs
    auto out = im.out();
    im.error = 0;
    Tol t{tol.atol * im.tol_scale, tol.rtol * im.tol_scale};
    for (size_t k = 0; k < ref.size(); ++k) im.error = std::max(im.error, k < out.size() ? scaled_error(out[k], ref[k], t) : INFINITY);
    im.ok = im.error <= 1.0;
    im.run();
  }
  for (int r = 0; r < o.reps; ++r)
    for (auto& im : impls) {
      if (o.flush) flush();
      rusage u0{}, u1{};
      getrusage(RUSAGE_SELF, &u0);
      auto t0 = Clock::now();
      im.run();
      im.ms.push_back(ms_since(t0));
      getrusage(RUSAGE_SELF, &u1);
      auto cpu = [](const rusage& u) { return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-3; };
      im.cpu_ms.push_back(cpu(u1) - cpu(u0));
      im.faults += double(u1.ru_minflt - u0.ru_minflt) / o.reps;
    }
}

void print_impls(const char* title, const std::vector<Impl>& impls, Tol tol, double copy_gbs) {
  std::printf("\n%s  (check: |y - ref64| <= %.0e + %.0e |ref|)\n", title, tol.atol, tol.rtol);
  std::printf("  %-30s %9s %9s %10s %8s %7s %10s %9s\n", "implementation", "median ms", "min ms", "min CPU ms", "GB/s", "% copy",
              "err/tol", "faults");
  // min CPU ms: the process's CPU time in its cheapest call (every thread, spinning included; with
  // OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1, the single-thread cost that a busy machine's
  // preemptions do not inflate). err/tol: the worst element's error over its tolerance (<= 1
  // passes); faults: minor page faults per call
  for (const auto& im : impls) {
    std::printf("  %-30s %9.3f %9.3f %10.3f %8.2f %6.0f%% %10.3g %9.0f%s\n", im.name.c_str(), im.ms_median(),
                im.ms_best(), im.cpu_best(), im.gbs(), 100 * im.gbs() / copy_gbs, im.error,
                im.faults, im.ok ? "" : "  FAILED CHECK");
  }
}

// ---- the copy ceiling ----
struct Copy {
  double gbs, best_gbs;  // median, and best of the runs
};
Copy copy_bandwidth(const Options& o, Flusher& flush) {
  const size_t n = size_t(256 * kMiB);
  std::vector<char> src(n, 1), dst(n, 2);
  std::vector<double> ms;
  for (int r = -2; r < o.reps; ++r) {
    if (o.flush) flush();
    auto t0 = Clock::now();
#pragma omp parallel
    {
      auto [lo, hi] = share(int64_t(n), thread_id(), team_size());
      std::memcpy(dst.data() + lo, src.data() + lo, size_t(hi - lo));
    }
    if (r >= 0) ms.push_back(ms_since(t0));
  }
  double gbs = 2.0 * double(n) / (median(ms) * 1e-3) / 1e9;
  double best = 2.0 * double(n) / (*std::min_element(ms.begin(), ms.end()) * 1e-3) / 1e9;
  std::printf("copy: memcpy of 256 MiB on %d threads, read + write counted: median %.2f ms, %.2f GB/s (best %.2f GB/s)\n",
              threads(), median(ms), gbs, best);
  return {gbs, best};
}

// Eigen runs on every thread too: each one evaluates its share with Eigen arrays.
#define KILN_BENCH_EACH_THREAD _Pragma("omp parallel")

// ---- W1: y = gelu(x*a + b) * sigmoid(x), exact erf gelu, fp32, 2^22 elements ----
std::vector<Impl> bench_w1(const Options& o, Flusher& flush, Tol tol) {
  const int64_t n = int64_t(1) << 22;
  auto hx = randn(size_t(n), 1), ha = randn(size_t(n), 2), hb = randn(size_t(n), 3);
  std::vector<double> ref(static_cast<size_t>(n));
  for (size_t i = 0; i < ref.size(); ++i) {
    double x = hx[i], z = x * double(ha[i]) + double(hb[i]);
    ref[i] = 0.5 * z * (1 + std::erf(z / std::sqrt(2.0))) / (1 + std::exp(-x));
  }
  using T = kiln::Tensor<kiln::f32, 1>;
  auto x = tensor<kiln::f32, 1>({n}, hx), a = tensor<kiln::f32, 1>({n}, ha), b = tensor<kiln::f32, 1>({n}, hb);
  const double bytes = 4.0 * double(n) * 4;
  auto fused = kiln::compile(w1), eager = kiln::compile(w1, kiln::Mode::eager);
  auto ky = std::make_shared<T>(), ey = std::make_shared<T>();
  auto py = std::make_shared<std::vector<float>>(size_t(n));
  std::vector<Impl> v;
  v.push_back({"kiln compiled (fused)", bytes, [=] { *ky = fused(x, a, b); }, [=] { return Outs{ky->to_vector()}; }});
  v.push_back({"kiln eager", bytes, [=] { *ey = eager(x, a, b); }, [=] { return Outs{ey->to_vector()}; }});
  v.push_back({"plain loop (std::erf, std::exp)", bytes,
               [=, px = hx.data(), pa = ha.data(), pb = hb.data()] {
                 float* y = py->data();
#pragma omp parallel for schedule(static)
                 for (int64_t i = 0; i < n; ++i) {
                   float z = px[i] * pa[i] + pb[i];
                   y[i] = 0.5f * z * (1.0f + std::erf(z * 0.707106781f)) * (1.0f / (1.0f + std::exp(-px[i])));
                 }
               },
               [=] { return Outs{widen(*py)}; }});
#if KILN_BENCH_HAVE_EIGEN
  auto gy = std::make_shared<std::vector<float>>(size_t(n));
  v.push_back({"Eigen 3.4 arrays", bytes,
               [=, px = hx.data(), pa = ha.data(), pb = hb.data()] {
                 KILN_BENCH_EACH_THREAD {
                   auto [lo, hi] = share(n, thread_id(), team_size());
                   using A = Eigen::Map<const Eigen::ArrayXf>;
                   A X(px + lo, hi - lo), Xa(pa + lo, hi - lo), Xb(pb + lo, hi - lo);
                   Eigen::Map<Eigen::ArrayXf> Y(gy->data() + lo, hi - lo);
                   auto z = X * Xa + Xb;
                   Y = 0.5f * z * (1.0f + (z * 0.707106781f).erf()) / (1.0f + (-X).exp());
                 }
               },
               [=] { return Outs{widen(*gy)}; }});
#endif
  measure(v, Outs{ref}, tol, o, flush);
  return v;
}

// ---- W2: row softmax over the last dim, fp32 [512, 8192] ----
std::vector<Impl> bench_w2(const Options& o, Flusher& flush, Tol tol) {
  const int64_t R = 512, C = 8192;
  auto hx = randn(size_t(R * C), 4);
  std::vector<double> ref(static_cast<size_t>(R * C));
  for (int64_t i = 0; i < R; ++i) {
    const float* x = hx.data() + i * C;
    double m = *std::max_element(x, x + C), s = 0;
    for (int64_t j = 0; j < C; ++j) s += std::exp(double(x[j]) - m);
    for (int64_t j = 0; j < C; ++j) ref[size_t(i * C + j)] = std::exp(double(x[j]) - m) / s;
  }
  using T = kiln::Tensor<kiln::f32, 2>;
  auto x = tensor<kiln::f32, 2>({R, C}, hx);
  const double bytes = 2.0 * double(R * C) * 4;
  auto fused = kiln::compile(w2), eager = kiln::compile(w2, kiln::Mode::eager);
  auto ky = std::make_shared<T>(), ey = std::make_shared<T>();
  auto py = std::make_shared<std::vector<float>>(size_t(R * C));
  std::vector<Impl> v;
  v.push_back({"kiln compiled (fused)", bytes, [=] { *ky = fused(x); }, [=] { return Outs{ky->to_vector()}; }});
  v.push_back({"kiln eager", bytes, [=] { *ey = eager(x); }, [=] { return Outs{ey->to_vector()}; }});
  v.push_back({"plain loop (3 passes, std::exp)", bytes,
               [=, px = hx.data()] {
#pragma omp parallel for schedule(static)
                 for (int64_t i = 0; i < R; ++i) {
                   const float* xr = px + i * C;
                   float* yr = py->data() + i * C;
                   float m = -INFINITY, s = 0;
                   for (int64_t j = 0; j < C; ++j) m = std::max(m, xr[j]);
                   for (int64_t j = 0; j < C; ++j) s += (yr[j] = std::exp(xr[j] - m));
                   const float inv = 1.0f / s;
                   for (int64_t j = 0; j < C; ++j) yr[j] *= inv;
                 }
               },
               [=] { return Outs{widen(*py)}; }});
#if KILN_BENCH_HAVE_EIGEN
  auto gy = std::make_shared<std::vector<float>>(size_t(R * C));
  v.push_back({"Eigen 3.4 arrays (per row)", bytes,
               [=, px = hx.data()] {
                 using RowMajor = Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
                 Eigen::Map<const RowMajor> X(px, R, C);
                 Eigen::Map<RowMajor> Y(gy->data(), R, C);
#pragma omp parallel for schedule(static)
                 for (int64_t i = 0; i < R; ++i) {
                   Y.row(i) = (X.row(i) - X.row(i).maxCoeff()).exp();
                   Y.row(i) /= Y.row(i).sum();
                 }
               },
               [=] { return Outs{widen(*gy)}; }});
#endif
  measure(v, Outs{ref}, tol, o, flush);
  return v;
}

// ---- W3: layer norm with weight and bias over the last dim, eps 1e-5, [1024, 4096] ----
// The workload is bf16: kiln runs it in bf16 (16-bit storage, f32 math) and in f32;
// the plain loop in both; Eigen (no fast bf16 arrays) in f32 only.
template <class Load, class Store>
void plain_layer_norm(const auto* x, const auto* w, const auto* b, auto* y, int64_t R, int64_t C, Load ld, Store st) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < R; ++i) {
    const auto* xr = x + i * C;
    auto* yr = y + i * C;
    float s = 0, ss = 0;
    for (int64_t j = 0; j < C; ++j) s += ld(xr[j]);
    const float mean = s / float(C);
    for (int64_t j = 0; j < C; ++j) ss += (ld(xr[j]) - mean) * (ld(xr[j]) - mean);
    const float rstd = 1.0f / std::sqrt(ss / float(C) + 1e-5f);
    for (int64_t j = 0; j < C; ++j) yr[j] = st((ld(xr[j]) - mean) * rstd * ld(w[j]) + ld(b[j]));
  }
}

std::vector<Impl> bench_w3(const Options& o, Flusher& flush, bool bf16, Tol tol) {
  const int64_t R = 1024, C = 4096;
  auto hx = randn(size_t(R * C), 5), hw = randn(size_t(C), 6), hb = randn(size_t(C), 7);
  if (bf16)
    for (auto* v : {&hx, &hw, &hb})
      for (auto& e : *v) e = bf16_round(e);
  std::vector<double> ref(static_cast<size_t>(R * C));
  for (int64_t i = 0; i < R; ++i) {
    const float* x = hx.data() + i * C;
    auto [m, ss] = mean_m2(x, C);
    double rstd = 1 / std::sqrt(ss / double(C) + 1e-5);
    for (int64_t j = 0; j < C; ++j) ref[size_t(i * C + j)] = (x[j] - m) * rstd * hw[size_t(j)] + hb[size_t(j)];
  }
  const double es = bf16 ? 2 : 4, bytes = es * double(2 * R * C + 2 * C);
  std::vector<Impl> v;
  auto fused = kiln::compile(w3), eager = kiln::compile(w3, kiln::Mode::eager);
  auto add_kiln = [&]<class DT>(DT) {
    using T = kiln::Tensor<DT, 2>;
    auto x = tensor<DT, 2>({R, C}, hx);
    auto w = tensor<DT, 1>({C}, hw), b = tensor<DT, 1>({C}, hb);
    auto ky = std::make_shared<T>(), ey = std::make_shared<T>();
    v.push_back({"kiln compiled (fused)", bytes, [=] { *ky = fused(x, w, b); }, [=] { return Outs{ky->to_vector()}; }});
    v.push_back({"kiln eager", bytes, [=] { *ey = eager(x, w, b); }, [=] { return Outs{ey->to_vector()}; }});
    // NOTE: eager stores every intermediate (mean, x - mean, ...) in the tensor's dtype,
    // so in bf16 it rounds ~8 times where fused mode rounds once: its check is 4x looser.
    if (std::is_same_v<DT, kiln::bf16>) v.back().name += " (bf16 temporaries)", v.back().tol_scale = 4;
  };
  if (bf16) {
    add_kiln(kiln::bf16{});
    auto to16 = [](const std::vector<float>& f) {
      std::vector<uint16_t> u(f.size());
      for (size_t i = 0; i < f.size(); ++i) u[i] = kiln::float_to_bf16(f[i]);
      return u;
    };
    auto px = std::make_shared<std::vector<uint16_t>>(to16(hx)), pw = std::make_shared<std::vector<uint16_t>>(to16(hw)),
         pb = std::make_shared<std::vector<uint16_t>>(to16(hb)), py = std::make_shared<std::vector<uint16_t>>(size_t(R * C));
    v.push_back({"plain loop (bf16 in and out)", bytes,
                 [=] {
                   plain_layer_norm(px->data(), pw->data(), pb->data(), py->data(), R, C,
                                    [](uint16_t u) { return kiln::bf16_to_float(u); },
                                    [](float f) { return kiln::float_to_bf16(f); });
                 },
                 [=] { return Outs{widen_bf16(*py)}; }});
  } else {
    add_kiln(kiln::f32{});
    auto py = std::make_shared<std::vector<float>>(size_t(R * C));
    auto id = [](float f) { return f; };
    v.push_back({"plain loop", bytes,
                 [=, px = hx.data(), pw = hw.data(), pb = hb.data()] { plain_layer_norm(px, pw, pb, py->data(), R, C, id, id); },
                 [=] { return Outs{widen(*py)}; }});
#if KILN_BENCH_HAVE_EIGEN
    auto gy = std::make_shared<std::vector<float>>(size_t(R * C));
    v.push_back({"Eigen 3.4 arrays (per row)", bytes,
                 [=, px = hx.data(), pw = hw.data(), pb = hb.data()] {
                   using RowMajor = Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
                   Eigen::Map<const RowMajor> X(px, R, C);
                   Eigen::Map<RowMajor> Y(gy->data(), R, C);
                   Eigen::Map<const Eigen::Array<float, 1, Eigen::Dynamic>> W(pw, C), B(pb, C);
#pragma omp parallel for schedule(static)
                   for (int64_t i = 0; i < R; ++i) {
                     const float mean = X.row(i).mean();
                     const float var = (X.row(i) - mean).square().mean();
                     Y.row(i) = (X.row(i) - mean) * (1.0f / std::sqrt(var + 1e-5f)) * W + B;
                   }
                 },
                 [=] { return Outs{widen(*gy)}; }});
#endif
  }
  measure(v, Outs{ref}, tol, o, flush);
  return v;
}

// ---- W8: (var, mean) over the last dim (unbiased var, like torch.var_mean), fp32 [2048, 4096] ----
std::vector<Impl> bench_w8(const Options& o, Flusher& flush, Tol tol) {
  const int64_t R = 2048, C = 4096;
  auto hx = randn(size_t(R * C), 8);
  std::vector<double> rv(static_cast<size_t>(R)), rm(static_cast<size_t>(R));
  for (int64_t i = 0; i < R; ++i) {
    auto [m, ss] = mean_m2(hx.data() + i * C, C);
    rv[size_t(i)] = ss / double(C - 1), rm[size_t(i)] = m;
  }
  using T = kiln::Tensor<kiln::f32, 1>;
  auto x = tensor<kiln::f32, 2>({R, C}, hx);
  const double bytes = 4.0 * double(R * C + 2 * R);
  auto fused = kiln::compile(w8), eager = kiln::compile(w8, kiln::Mode::eager);
  auto kv = std::make_shared<std::pair<T, T>>(), ev = std::make_shared<std::pair<T, T>>();
  auto pv = std::make_shared<std::vector<float>>(size_t(2 * R));
  std::vector<Impl> v;
  v.push_back({"kiln compiled (fused)", bytes, [=] { std::tie(kv->first, kv->second) = fused(x); },
               [=] { return Outs{kv->first.to_vector(), kv->second.to_vector()}; }});
  v.push_back({"kiln eager", bytes, [=] { std::tie(ev->first, ev->second) = eager(x); },
               [=] { return Outs{ev->first.to_vector(), ev->second.to_vector()}; }});
  auto halves = [](const std::vector<float>& p) {
    size_t h = p.size() / 2;
    return Outs{std::vector<double>(p.begin(), p.begin() + long(h)), std::vector<double>(p.begin() + long(h), p.end())};
  };
  v.push_back({"plain loop (2 passes)", bytes,
               [=, px = hx.data()] {
                 float* var = pv->data();
                 float* mean = var + R;
#pragma omp parallel for schedule(static)
                 for (int64_t i = 0; i < R; ++i) {
                   const float* xr = px + i * C;
                   float s = 0, ss = 0;
                   for (int64_t j = 0; j < C; ++j) s += xr[j];
                   const float m = s / float(C);
                   for (int64_t j = 0; j < C; ++j) ss += (xr[j] - m) * (xr[j] - m);
                   var[i] = ss / float(C - 1), mean[i] = m;
                 }
               },
               [=] { return halves(*pv); }});
#if KILN_BENCH_HAVE_EIGEN
  auto gv = std::make_shared<std::vector<float>>(size_t(2 * R));
  v.push_back({"Eigen 3.4 arrays (per row)", bytes,
               [=, px = hx.data()] {
                 using RowMajor = Eigen::Array<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
                 Eigen::Map<const RowMajor> X(px, R, C);
                 float* var = gv->data();
                 float* mean = var + R;
#pragma omp parallel for schedule(static)
                 for (int64_t i = 0; i < R; ++i) {
                   mean[i] = X.row(i).mean();
                   var[i] = (X.row(i) - mean[i]).square().sum() / float(C - 1);
                 }
               },
               [=] { return halves(*gv); }});
#endif
  measure(v, Outs{rv, rm}, tol, o, flush);
  return v;
}

// ---- GEMM: kiln's blocked CPU GEMM beside OpenBLAS (cblas_sgemm / cblas_dgemm) ----
// Square sizes, and the four products of W4 (the MLP) at a quarter of each width:
// x [2048, 1024], W1 [1024, 4096], W2 [4096, 1024], h and dh [2048, 4096], dy [2048, 1024].
// Compute-bound, so the caches are not flushed; the output is checked on 4096 sampled
// elements against a float64 dot product of the (dtype-rounded) inputs.
struct GemmCase {
  std::string name;
  int64_t m, k, n;
  bool ta, tb;  // operand stored transposed (read through a transposed view / CblasTrans)
  int dtype;    // 0: f32, 1: f64, 2: bf16 (OpenBLAS: sgemm on the same values in f32)
  bool epilogue = false;  // gelu(A @ B + bias), the W4 forward layer
  bool prologue = false;  // (A * 0.5) @ B: A's prologue (OpenBLAS: alpha = 0.5)
};

struct GemmRow {
  GemmCase c;
  std::vector<Impl> impls;
  Tol tol;
};

template <class DT>
GemmRow bench_gemm(const GemmCase& c, const Options& o, Flusher& flush) {
  using S = typename DT::storage;
  const int64_t M = c.m, K = c.k, N = c.n;
  // Stored shapes: A is [M, K], or [K, M] when transposed; likewise B.
  auto round = [&](std::vector<float> v) {
    if (c.dtype == 2)
      for (auto& e : v) e = bf16_round(e);
    return v;
  };
  auto ha = round(randn(size_t(M * K), 11)), hb = round(randn(size_t(K * N), 12)), hbias = round(randn(size_t(N), 13));
  auto a_at = [&](int64_t i, int64_t k) { return double(ha[size_t(c.ta ? k * M + i : i * K + k)]); };
  auto b_at = [&](int64_t k, int64_t j) { return double(hb[size_t(c.tb ? j * K + k : k * N + j)]); };
  std::mt19937 g(14);
  std::vector<int64_t> si(4096), sj(4096);
  std::vector<double> ref(4096);
  for (size_t s = 0; s < si.size(); ++s) {
    si[s] = int64_t(g() % uint64_t(M)), sj[s] = int64_t(g() % uint64_t(N));
    double acc = 0;
    for (int64_t k = 0; k < K; ++k) acc += a_at(si[s], k) * b_at(k, sj[s]);
    if (c.epilogue) acc += hbias[size_t(sj[s])], acc = 0.5 * acc * (1 + std::erf(acc / std::sqrt(2.0)));
    if (c.prologue) acc *= 0.5;  // exact: every 0.5 * a is
    ref[s] = acc;
  }
  auto sample = [si, sj, N](const auto* p, auto conv) {
    std::vector<double> out(si.size());
    for (size_t s = 0; s < si.size(); ++s) out[s] = conv(p[si[s] * N + sj[s]]);
    return Outs{out};
  };
  auto a = tensor<DT, 2>(c.ta ? kiln::Shape<2>{K, M} : kiln::Shape<2>{M, K}, ha);
  auto b = tensor<DT, 2>(c.tb ? kiln::Shape<2>{N, K} : kiln::Shape<2>{K, N}, hb);
  auto bias = tensor<DT, 1>({N}, hbias);
  const bool ta = c.ta, tb = c.tb;
  auto mm = [ta, tb](const auto& x, const auto& y) {
    auto xv = [&] { return ta ? kiln::transpose(x, 0, 1) : kiln::transpose(kiln::transpose(x, 0, 1), 0, 1); };
    auto yv = [&] { return tb ? kiln::transpose(y, 0, 1) : kiln::transpose(kiln::transpose(y, 0, 1), 0, 1); };
    return kiln::matmul(xv(), yv());
  };
  using T = kiln::Tensor<DT, 2>;
  auto ky = std::make_shared<T>(), ey = std::make_shared<T>();
  auto conv = [](S v) { return kiln::to_double<DT>(v); };
  std::vector<Impl> v;
  const double flops = 2.0 * double(M) * double(N) * double(K);
  if (c.epilogue) {
    auto fn = [mm](const auto& x, const auto& y, const auto& bb) { return kiln::gelu(mm(x, y) + bb); };
    auto fused = kiln::compile(fn), eager = kiln::compile(fn, kiln::Mode::eager);
    v.push_back({"kiln compiled (fused)", flops, [=] { *ky = fused(a, b, bias); }, [=] { return sample(ky->host_data(), conv); }});
    v.push_back({"kiln eager", flops, [=] { *ey = eager(a, b, bias); }, [=] { return sample(ey->host_data(), conv); }});
  } else if (c.prologue) {
    auto fn = [](const auto& x, const auto& y) { return kiln::matmul(x * 0.5, y); };  // row-major operands (ta, tb unset)
    auto fused = kiln::compile(fn), eager = kiln::compile(fn, kiln::Mode::eager);
    v.push_back({"kiln compiled (fused)", flops, [=] { *ky = fused(a, b); }, [=] { return sample(ky->host_data(), conv); }});
    v.push_back({"kiln eager", flops, [=] { *ey = eager(a, b); }, [=] { return sample(ey->host_data(), conv); }});
  } else {
    auto fused = kiln::compile(mm), eager = kiln::compile(mm, kiln::Mode::eager);
    v.push_back({"kiln compiled (fused)", flops, [=] { *ky = fused(a, b); }, [=] { return sample(ky->host_data(), conv); }});
    v.push_back({"kiln eager", flops, [=] { *ey = eager(a, b); }, [=] { return sample(ey->host_data(), conv); }});
  }
#if KILN_BENCH_HAVE_BLAS
  const auto opa = c.ta ? CblasTrans : CblasNoTrans, opb = c.tb ? CblasTrans : CblasNoTrans;
  const int lda = int(c.ta ? M : K), ldb = int(c.tb ? K : N);
  const bool epi = c.epilogue;
  // Twice: into one C for all calls, and into a new C per call (the previous one freed
  // after): what a caller that allocates its output without a cache pays (page faults).
  auto add_blas = [&]<class E>(E, std::string name, auto gemm) {
    for (bool fresh : {false, true}) {
      auto kept = std::make_shared<std::vector<E>>(size_t(M * N));
      auto cur = std::make_shared<E*>(kept->data());
      v.push_back({name + (fresh ? ", new C per call" : ""), flops,
                   [=] {
                     E* y = fresh ? (E*)std::aligned_alloc(64, size_t(M * N) * sizeof(E)) : kept->data();
                     gemm(y);
                     if (fresh && *cur != kept->data()) std::free(*cur);
                     *cur = y;
                   },
                   [=] { return sample(*cur, [](E x) { return double(x); }); }});
    }
  };
  if (c.dtype == 1) {
    auto da = std::make_shared<std::vector<double>>(widen(ha)), db = std::make_shared<std::vector<double>>(widen(hb));
    add_blas(double{}, "OpenBLAS cblas_dgemm", [=](double* y) {
      cblas_dgemm(CblasRowMajor, opa, opb, int(M), int(N), int(K), 1.0, da->data(), lda, db->data(), ldb, 0.0, y, int(N));
    });
  } else {
    const float alpha = c.prologue ? 0.5f : 1.0f;
    add_blas(float{}, c.dtype == 2 ? "OpenBLAS cblas_sgemm (f32)" : epi ? "OpenBLAS cblas_sgemm + loop" : "OpenBLAS cblas_sgemm",
             [=, pa = ha.data(), pb = hb.data(), pbias = hbias.data()](float* y) {
               cblas_sgemm(CblasRowMajor, opa, opb, int(M), int(N), int(K), alpha, pa, lda, pb, ldb, 0.0f, y, int(N));
               if (epi) {
#pragma omp parallel for schedule(static)
                 for (int64_t i = 0; i < M; ++i)
                   for (int64_t j = 0; j < N; ++j) {
                     float z = y[i * N + j] + pbias[j];
                     y[i * N + j] = 0.5f * z * (1.0f + std::erf(z * 0.707106781f));
                   }
               }
             });
  }
#endif
  // f32 and f64: the error of a K-long sum of products of normal values grows like K eps;
  // bf16: the output's own rounding.
  const Tol tol = c.dtype == 2 ? Tol{1e-2, 8e-3} : c.dtype == 1 ? Tol{1e-13 * double(K), 1e-12} : Tol{1e-6 * double(K), 1e-5};
  Options go = o;
  go.flush = false;
  go.reps = std::max(5, o.reps / 3);
  measure(v, Outs{ref}, tol, go, flush);
  return {c, std::move(v), tol};
}

// ---- W4: MLP training step (forward + backward), bf16, at reduced width ----
// x [512, 256], W1 [256, 1024], W2 [1024, 256]: the full-size step's shape ratios at
// 1/16 of the width (1/256 of its flops). Checked against float64 loops over every row.
struct W4Result {
  double fused_ms = NAN, eager_ms = NAN, gflops = NAN, worst = INFINITY;
  bool ok = true;  // (not run)
};
W4Result bench_w4(const Options& o, Flusher& flush) {
  w4::Sizes s{512, 256, 1024};
  auto p = w4::random_params<kiln::bf16>(s, 40, kiln::cpu());
  auto st = w4::step(p);
  auto run = [&](kiln::Mode m) { return std::apply([&](const auto&... e) { return kiln::evaluate(m, e...); }, st); };
  auto out = run(kiln::Mode::fused);
  std::vector<int64_t> all(static_cast<size_t>(s.M));
  for (int64_t i = 0; i < s.M; ++i) all[size_t(i)] = i;
  w4::Ref ref = w4::reference(w4::to_host(s, p), all, true);
  double e[6] = {std::fabs(double(std::get<0>(out)()) - ref.loss) / ref.loss, w4::rel_err(std::get<1>(out).to_vector(), ref.dx),
                 w4::rel_err(std::get<2>(out).to_vector(), ref.dW1), w4::rel_err(std::get<3>(out).to_vector(), ref.db1),
                 w4::rel_err(std::get<4>(out).to_vector(), ref.dW2), w4::rel_err(std::get<5>(out).to_vector(), ref.db2)};
  // The float64 reference gpu_bench uses (the same step in f64, from the same values) against the loops.
  auto ref64 = std::apply([](const auto&... x) { return kiln::eval(x...); }, w4::step(w4::convert<kiln::f64>(p)));
  double e64 = std::max({std::fabs(std::get<0>(ref64)() - ref.loss) / ref.loss, w4::rel_err(std::get<1>(ref64).to_vector(), ref.dx),
                         w4::rel_err(std::get<2>(ref64).to_vector(), ref.dW1), w4::rel_err(std::get<5>(ref64).to_vector(), ref.db2)});
  double e_dev = w4::rel_err(std::get<2>(out), std::get<2>(ref64));  // gpu_bench's on-device measure, beside the host one
  W4Result r;
  r.worst = *std::max_element(e, e + 6);
  r.ok = r.worst <= 2e-2;  // bf16 inputs and outputs: 8 bits of mantissa
  std::vector<double> fused, eager;
  run(kiln::Mode::eager);
  for (int i = 0; i < std::max(3, o.reps / 3); ++i) {
    if (o.flush) flush();
    auto t0 = Clock::now();
    run(kiln::Mode::fused);
    fused.push_back(ms_since(t0));
    if (o.flush) flush();
    t0 = Clock::now();
    run(kiln::Mode::eager);
    eager.push_back(ms_since(t0));
  }
  r.fused_ms = median(fused), r.eager_ms = median(eager), r.gflops = s.flops() / r.fused_ms / 1e6;
  size_t kernels = std::apply([](const auto&... x) { return kiln::kernel_count(kiln::Mode::fused, x...); }, st);
  std::printf("\nW4 MLP training step, bf16, x [512, 256], W1 [256, 1024], W2 [1024, 256] (forward + backward, grads of x, W1, b1, W2, b2)\n");
  std::printf("  kiln compiled %8.2f ms (%.1f GFLOP/s, %zu kernels)   kiln eager %8.2f ms (%.1f GFLOP/s)   eager/compiled %.2fx\n",
              r.fused_ms, r.gflops, kernels, r.eager_ms, s.flops() / r.eager_ms / 1e6, r.eager_ms / r.fused_ms);
  std::printf("  vs float64 loops (rel. Frobenius error): loss %.1e  dx %.1e  dW1 %.1e  db1 %.1e  dW2 %.1e  db2 %.1e%s\n", e[0],
              e[1], e[2], e[3], e[4], e[5], r.ok ? "" : "  FAILED CHECK (> 2e-2)");
  std::printf("  kiln's float64 step (gpu_bench's reference) vs the loops: %.1e; dW1 error measured on the device: %.1e\n", e64, e_dev);
  r.ok = r.ok && e64 <= 1e-10;
  std::printf("  %s", kiln::explain_memory(std::get<0>(st), std::get<1>(st), std::get<2>(st), std::get<3>(st), std::get<4>(st),
                                           std::get<5>(st)).str().c_str());
  return r;
}

// ---- JIT latency, in a child process (the bench itself with --latency-child) ----
// Prints "key value" lines: the first call of each workload (on small shapes, so the
// time is the JIT's), the second call, per-call time on a 16-element tensor, counters.
int latency_child() {
  auto t0 = Clock::now();
  kiln::jit::host_toolchain();  // once per process: `c++ --version` and `c++ -dM -E`
  std::printf("probe_ms %.3f\n", ms_since(t0));
  auto f1 = kiln::compile(w1);
  auto f2 = kiln::compile(w2);
  auto f3 = kiln::compile(w3);
  auto f8 = kiln::compile(w8);
  auto x1 = tensor<kiln::f32, 1>({64}, randn(64, 1)), a1 = tensor<kiln::f32, 1>({64}, randn(64, 2));
  auto x2 = tensor<kiln::f32, 2>({4, 64}, randn(256, 3));
  auto x3 = tensor<kiln::bf16, 2>({4, 64}, randn(256, 4));
  auto w3t = tensor<kiln::bf16, 1>({64}, randn(64, 5)), b3t = tensor<kiln::bf16, 1>({64}, randn(64, 6));
  std::vector<std::pair<const char*, std::function<void()>>> calls = {
      {"W1", [&] { f1(x1, a1, a1); }},
      {"W2", [&] { f2(x2); }},
      {"W3", [&] { f3(x3, w3t, b3t); }},
      {"W8", [&] { f8(x2); }}};
  for (auto& [name, call] : calls) {
    kiln::Counters c0 = kiln::counters();
    double cpu0 = children_cpu_s();
    t0 = Clock::now();
    call();
    double first = ms_since(t0), compiler_cpu_ms = (children_cpu_s() - cpu0) * 1e3;
    kiln::Counters c1 = kiln::counters();
    t0 = Clock::now();
    call();
    double second = ms_since(t0);
    kiln::Counters c2 = kiln::counters();
    std::printf("%s %.3f %.3f %lu %lu %lu %lu %.1f\n", name, first, second * 1e3, (unsigned long)(c1.compiles - c0.compiles),
                (unsigned long)(c1.disk_hits - c0.disk_hits), (unsigned long)(c2.compiles - c1.compiles + c2.disk_hits - c1.disk_hits),
                (unsigned long)(c2.memory_hits - c1.memory_hits), compiler_cpu_ms);
  }
  // Per-call time on a tiny tensor: the dispatch overhead of a compiled call.
  auto x = tensor<kiln::f32, 1>({16}, randn(16, 7));
  auto eager1 = kiln::compile(w1, kiln::Mode::eager);
  eager1(x, x, x);
  for (auto& [name, fn] : std::vector<std::pair<const char*, std::function<void()>>>{
           {"tiny_fused_us", [&] { f1(x, x, x); }}, {"tiny_eager_us", [&] { eager1(x, x, x); }}}) {
    std::vector<double> per;
    for (int b = 0; b < 31; ++b) {
      t0 = Clock::now();
      for (int i = 0; i < 100; ++i) fn();
      per.push_back(ms_since(t0) * 10);  // µs per call
    }
    std::printf("%s %.2f\n", name, median(per));
  }
  kiln::Counters c = kiln::counters();
  std::printf("counters %lu %lu %lu\n", (unsigned long)c.compiles, (unsigned long)c.disk_hits,
              (unsigned long)c.memory_hits);
  return 0;
}

struct ChildRun {
  double wall_ms = NAN, probe_ms = NAN, tiny_fused_us = NAN, tiny_eager_us = NAN;
  std::vector<std::string> names;
  std::vector<double> first_ms, second_us, compiles, disk_hits, compiler_cpu_ms;
  unsigned long compiles_total = 0, disk_total = 0;
};

ChildRun run_child(const std::string& cache_dir) {
  ChildRun r;
  std::string cmd = "KILN_CACHE_DIR='" + cache_dir + "' /proc/" + std::to_string(getpid()) + "/exe --latency-child";
  auto t0 = Clock::now();
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char line[512];
  while (std::fgets(line, sizeof line, p)) {
    char key[64];
    double a = 0, b = 0, c = 0, d = 0, e = 0, f = 0, g = 0;
    int n = std::sscanf(line, "%63s %lf %lf %lf %lf %lf %lf %lf", key, &a, &b, &c, &d, &e, &f, &g);
    std::string k = key;
    if (k == "probe_ms") r.probe_ms = a;
    else if (k == "tiny_fused_us") r.tiny_fused_us = a;
    else if (k == "tiny_eager_us") r.tiny_eager_us = a;
    else if (k == "counters" && n >= 3) r.compiles_total = (unsigned long)a, r.disk_total = (unsigned long)b;
    else if (n == 8) {
      r.names.push_back(k), r.first_ms.push_back(a), r.second_us.push_back(b), r.compiles.push_back(c), r.disk_hits.push_back(d);
      r.compiler_cpu_ms.push_back(g);
      if (e != 0) std::printf("  NOTE: the second call of %s reached the JIT cache (%g lookups)\n", key, e);
    } else std::fputs(line, stdout);
  }
  int status = pclose(p);
  r.wall_ms = ms_since(t0);
  if (status != 0) std::printf("  latency child exited with status %d\n", status);
  return r;
}

// The repository root: two levels above this file.
std::string source_root() {
  std::string f = __FILE__;
  auto s = f.find_last_of('/');
  if (s == std::string::npos) return ".";
  std::string bench = f.substr(0, s);
  auto s2 = bench.find_last_of('/');
  return s2 == std::string::npos ? "." : bench.substr(0, s2);
}

struct Latency {
  ChildRun cold, disk;
  double gxx_s = NAN, gxx_cpu_s = NAN;  // examples/demo.cpp, header-only
  double gxx_front_s = NAN, gxx_front_cpu_s = NAN;  // the same with KILN_SEPARATE_ENGINE
  double gxx_engine_s = NAN, gxx_engine_cpu_s = NAN;  // src/engine.cpp (once per program then)
};

Latency measure_latency() {
  Latency L;
  char tmpl[] = "/tmp/kiln-bench-cache-XXXXXX";
  if (!mkdtemp(tmpl)) return L;
  std::printf("\nJIT latency: the bench itself run as a new process (--latency-child), KILN_CACHE_DIR=%s (fresh)\n", tmpl);
  L.cold = run_child(tmpl);  // compiles everything into the fresh directory
  L.disk = run_child(tmpl);  // a new process: every kernel is a disk hit
  std::printf("  %-6s %10s %14s %14s %14s %16s\n", "", "cold ms", "(compiler CPU)", "disk-hit ms", "2nd call µs",
              "compiles/disk");
  for (size_t i = 0; i < L.cold.names.size() && i < L.disk.names.size(); ++i)
    std::printf("  %-6s %10.1f %11.0f ms %14.2f %14.1f %8.0f / %-6.0f\n", L.cold.names[i].c_str(), L.cold.first_ms[i],
                L.cold.compiler_cpu_ms[i], L.disk.first_ms[i], L.disk.second_us[i], L.disk.compiles[i], L.disk.disk_hits[i]);
  std::printf("  toolchain probe (once per process, before the first kernel): %.1f ms cold run, %.1f ms second run\n",
              L.cold.probe_ms, L.disk.probe_ms);
  std::printf("  whole child process: %.0f ms cold, %.0f ms with the disk cache (compiles %lu, disk hits %lu)\n",
              L.cold.wall_ms, L.disk.wall_ms, L.disk.compiles_total, L.disk.disk_total);
  std::printf("  per call, 16 elements, memory hit: fused %.1f µs, eager %.1f µs (W1's chain)\n", L.disk.tiny_fused_us,
              L.disk.tiny_eager_us);
  std::string rm = std::string("rm -rf '") + tmpl + "'";
  if (std::system(rm.c_str()) != 0) std::printf("  (could not remove %s)\n", tmpl);

  // How long the compiler takes on a model that includes <kiln/kiln.hpp>: header-only (the
  // engine compiled in the file), with KILN_SEPARATE_ENGINE (the front end only), and the
  // engine's own file, compiled once per program in that mode (CMake's kiln::engine).
  std::string root = source_root();
  const std::string obj = "/tmp/kiln-bench-demo-" + std::to_string(getpid()) + ".o";
  auto gxx = [&](const std::string& args, double& wall, double& cpu_s) {
    std::string cmd = "cd '" + root + "' && g++ -std=c++20 -O2 -Iinclude " + args + " -o " + obj;
    std::vector<double> s, cpu;
    for (int i = 0; i < 3; ++i) {
      double cpu0 = children_cpu_s();
      auto t0 = Clock::now();
      if (std::system(cmd.c_str()) != 0) {
        std::printf("  g++ failed: %s\n", cmd.c_str());
        return;
      }
      s.push_back(ms_since(t0) / 1e3), cpu.push_back(children_cpu_s() - cpu0);
    }
    wall = median(s), cpu_s = median(cpu);
    std::printf("  `g++ -std=c++20 -O2 -Iinclude %s`: %.2f s wall, %.2f s CPU (median of 3)\n", args.c_str(), wall, cpu_s);
  };
  gxx("-c examples/demo.cpp", L.gxx_s, L.gxx_cpu_s);
  gxx("-DKILN_SEPARATE_ENGINE -c examples/demo.cpp", L.gxx_front_s, L.gxx_front_cpu_s);
  gxx("-c src/engine.cpp", L.gxx_engine_s, L.gxx_engine_cpu_s);
  std::remove(obj.c_str());
  return L;
}

std::string ratio(const Impl* kiln, const Impl* other, bool best) {
  if (!kiln || !other) return "–";
  char b[32];
  std::snprintf(b, sizeof b, "%.2fx", other->ms_of(best) / kiln->ms_of(best));
  return b;
}
std::string ms_cell(const Impl* im, bool best) {
  if (!im) return "–";
  char b[32];
  std::snprintf(b, sizeof b, "%.2f", im->ms_of(best));
  return b;
}

void print_gemm(const std::vector<GemmRow>& rows, bool best) {
  std::printf("\nGEMM, %s (GFLOP/s = 2MNK / time; kiln/BLAS: kiln compiled's GFLOP/s over OpenBLAS's into one C buffer;\n"
              "vs new-C BLAS: over OpenBLAS's into a new C per call (kiln's output comes from its caching allocator);\n"
              "CPU kiln/BLAS: the same ratio by each one's cheapest call in CPU time)\n",
              best ? "BEST of the runs" : "MEDIAN of the runs");
  std::printf("| %-40s | %8s | %7s | %8s | %7s | %8s | %7s | %9s | %12s | %13s |\n", "row (M x K x N)", "kiln ms", "GFLOP/s", "eager ms",
              "GFLOP/s", "BLAS ms", "GFLOP/s", "kiln/BLAS", "vs new-C BLAS", "CPU kiln/BLAS");
  std::printf("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
  for (const auto& r : rows) {
    auto at = [&](size_t i) { return r.impls.size() > i ? &r.impls[i] : nullptr; };
    const Impl *k = at(0), *e = at(1), *blas = at(2), *fresh = at(3);
    auto gf = [&](const Impl* im) { return im ? im->bytes / (im->ms_of(best) * 1e-3) / 1e9 : NAN; };
    const double cpu_ratio = k && blas ? blas->cpu_best() / k->cpu_best() : NAN;
    std::printf("| %-40s | %8s | %7.1f | %8s | %7.1f | %8s | %7.1f | %8.2fx | %11.2fx | %12.2fx |\n", r.c.name.c_str(),
                ms_cell(k, best).c_str(), gf(k), ms_cell(e, best).c_str(), gf(e), ms_cell(blas, best).c_str(), gf(blas),
                gf(k) / gf(blas), gf(k) / gf(fresh), cpu_ratio);
  }
}

struct Row {  // one line of the summary table
  std::string name;
  const Impl *kiln = nullptr, *eager = nullptr, *plain = nullptr, *eigen = nullptr;
};

// The summary as a Markdown table: by the median of the runs, or by the best run (a
// busy machine's estimate of what the code does when nothing else runs).
void print_summary(const std::vector<Row>& rows, Copy copy, bool best) {
  const double c = best ? copy.best_gbs : copy.gbs;
  std::printf("\nSummary, %s (GB/s and %% of copy: kiln compiled; ratios: the other's time / kiln's, > 1: kiln faster)\n",
              best ? "BEST of the runs" : "MEDIAN of the runs");
  std::printf("| %-28s | %8s | %6s | %6s | %8s | %8s | %8s | %8s | %8s | %8s |\n", "row", "kiln ms", "GB/s", "% copy",
              "eager ms", "plain ms", "Eigen ms", "vs eager", "vs plain", "vs Eigen");
  std::printf("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
  std::printf("| %-28s | %8s | %6.1f | %5.0f%% | %8s | %8s | %8s | %8s | %8s | %8s |\n", "copy 256 MiB (memcpy)", "–", c,
              100.0, "–", "–", "–", "–", "–", "–");
  for (const auto& r : rows)
    std::printf("| %-28s | %8s | %6.1f | %5.0f%% | %8s | %8s | %8s | %8s | %8s | %8s |\n", r.name.c_str(),
                ms_cell(r.kiln, best).c_str(), r.kiln ? r.kiln->gbs(best) : NAN, r.kiln ? 100 * r.kiln->gbs(best) / c : NAN,
                ms_cell(r.eager, best).c_str(), ms_cell(r.plain, best).c_str(), ms_cell(r.eigen, best).c_str(),
                ratio(r.kiln, r.eager, best).c_str(), ratio(r.kiln, r.plain, best).c_str(), ratio(r.kiln, r.eigen, best).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--latency-child") return latency_child();
    if (a == "--reps" && i + 1 < argc) o.reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--warm") o.flush = false;
    else if (a == "--no-latency") o.latency = false;
    else if (a == "--no-gemm") o.gemm = false;
    else if (a == "--only-gemm") o.gemm = true, o.only_gemm = true, o.latency = false;
    else {
      std::printf("usage: %s [--reps N] [--warm] [--no-latency] [--no-gemm | --only-gemm]\n", argv[0]);
      return a == "--help" ? 0 : 2;
    }
  }
  std::printf("kiln cpu_bench: 1/16-size CPU rows of WORKLOADS.md; %d threads; median of %d runs; caches %s\n",
              threads(), o.reps, o.flush ? "flushed before every timed call" : "warm (--warm)");
#if !KILN_BENCH_HAVE_OPENMP
  std::printf("NOTE: built without OpenMP: the plain loops and Eigen run on one thread\n");
#endif
#if !KILN_BENCH_HAVE_EIGEN
  std::printf("NOTE: built without Eigen 3.4: no Eigen column\n");
#endif
  std::printf("machine: %ld cores online, load average %s (1, 5, 15 min)\n", sysconf(_SC_NPROCESSORS_ONLN),
              load_average().c_str());
  std::printf("JIT: %s; CPU math prelude: %s\n", kiln::jit::host_toolchain().identity.c_str(), prelude_identity().c_str());
  Flusher flush;
  std::printf("flush buffer: %.0f MiB (2x L3 %.0f MiB, clamped to [64 MiB, 1 GiB])\n",
              double(flush.buf.size() * 8) / kMiB, double(sysconf(_SC_LEVEL3_CACHE_SIZE)) / kMiB);
  const Copy copy = copy_bandwidth(o, flush);

  const Tol f32_tol{1e-6, 1e-5}, soft_tol{1e-9, 1e-5}, ln_tol{1e-5, 1e-4}, bf16_tol{1e-2, 8e-3};
  std::vector<Impl> r1, r2, r3b, r3f, r8;
  if (!o.only_gemm) {
    r1 = bench_w1(o, flush, f32_tol);
    print_impls("W1 y = gelu(x*a+b) * sigmoid(x), f32, 2^22 elements", r1, f32_tol, copy.gbs);
    r2 = bench_w2(o, flush, soft_tol);
    print_impls("W2 softmax(x, -1), f32 [512, 8192]", r2, soft_tol, copy.gbs);
    r3b = bench_w3(o, flush, true, bf16_tol);
    print_impls("W3 layer_norm(x, w, b), bf16 [1024, 4096]", r3b, bf16_tol, copy.gbs);
    r3f = bench_w3(o, flush, false, ln_tol);
    print_impls("W3 layer_norm(x, w, b), f32 [1024, 4096]", r3f, ln_tol, copy.gbs);
    r8 = bench_w8(o, flush, f32_tol);
    print_impls("W8 var_mean(x, -1), f32 [2048, 4096]", r8, f32_tol, copy.gbs);
  }
  std::vector<GemmRow> gemm;
  if (o.gemm) {
    const std::vector<GemmCase> cases = {
        {"f32 512^3", 512, 512, 512, false, false, 0},
        {"f32 1024^3", 1024, 1024, 1024, false, false, 0},
        {"f32 2048^3", 2048, 2048, 2048, false, false, 0},
        {"W4/4 x@W1 f32 2048x1024x4096", 2048, 1024, 4096, false, false, 0},
        {"W4/4 gelu(x@W1+b1) f32", 2048, 1024, 4096, false, false, 0, true},
        {"W4/4 h@W2 f32 2048x4096x1024", 2048, 4096, 1024, false, false, 0},
        {"W4/4 dh@W1^T f32 2048x4096x1024 (B^T)", 2048, 4096, 1024, false, true, 0},
        {"W4/4 h^T@dy f32 4096x2048x1024 (A^T)", 4096, 2048, 1024, true, false, 0},
        {"W4/4 x@W1 bf16 2048x1024x4096", 2048, 1024, 4096, false, false, 2},
        {"f64 1024^3", 1024, 1024, 1024, false, false, 1},
        {"f32 (x * 0.5) @ W 2048x1024x4096 (prologue)", 2048, 1024, 4096, false, false, 0, false, true},
        {"f32 (x * 0.5) @ W 32x256x256 (prologue)", 32, 256, 256, false, false, 0, false, true},
    };
    for (const auto& c : cases) {
      gemm.push_back(c.dtype == 1 ? bench_gemm<kiln::f64>(c, o, flush)
                                  : c.dtype == 2 ? bench_gemm<kiln::bf16>(c, o, flush) : bench_gemm<kiln::f32>(c, o, flush));
      print_impls(("GEMM " + c.name + " (GB/s column: GFLOP/s)").c_str(), gemm.back().impls, gemm.back().tol, INFINITY);
    }
  }

  W4Result r4;
  if (!o.only_gemm) r4 = bench_w4(o, flush);

  Latency L;
  if (o.latency) L = measure_latency();

  auto find = [](const std::vector<Impl>& v, const char* prefix) -> const Impl* {
    for (const auto& im : v)
      if (im.name.rfind(prefix, 0) == 0) return &im;
    return nullptr;
  };
  std::vector<Row> rows = {
      {"W1 gelu*sigmoid f32 2^22", find(r1, "kiln c"), find(r1, "kiln e"), find(r1, "plain"), find(r1, "Eigen")},
      {"W2 softmax f32 512x8192", find(r2, "kiln c"), find(r2, "kiln e"), find(r2, "plain"), find(r2, "Eigen")},
      {"W3 layer_norm bf16 1024x4096", find(r3b, "kiln c"), find(r3b, "kiln e"), find(r3b, "plain"), nullptr},
      {"W3 layer_norm f32 1024x4096", find(r3f, "kiln c"), find(r3f, "kiln e"), find(r3f, "plain"), find(r3f, "Eigen")},
      {"W8 var_mean f32 2048x4096", find(r8, "kiln c"), find(r8, "kiln e"), find(r8, "plain"), find(r8, "Eigen")},
  };
  bool all_ok = true;
  for (const auto& r : rows)
    for (const Impl* im : {r.kiln, r.eager, r.plain, r.eigen}) all_ok &= !im || im->ok;
  all_ok &= r4.ok;
  for (const auto& r : gemm)
    for (const Impl& im : r.impls) all_ok &= im.ok;
  if (!o.only_gemm) {
    print_summary(rows, copy, false);
    print_summary(rows, copy, true);
  }
  if (!gemm.empty()) {
    print_gemm(gemm, false);
    print_gemm(gemm, true);
  }
  if (o.latency && !L.cold.names.empty()) {
    std::printf("\n| JIT (new process, fresh KILN_CACHE_DIR) | W1 | W2 | W3 bf16 | W8 |\n|---|---|---|---|---|\n");
    auto line = [](const char* what, const std::vector<double>& v, double scale, const char* fmt) {
      std::printf("| %s |", what);
      for (double x : v) std::printf(fmt, x * scale);
      std::printf("\n");
    };
    line("cold compile, first call (s)", L.cold.first_ms, 1e-3, " %.2f |");
    line("  of which compiler CPU (s)", L.cold.compiler_cpu_ms, 1e-3, " %.2f |");
    line("disk hit, first call in a new process (ms)", L.disk.first_ms, 1, " %.1f |");
    line("second call (µs)", L.disk.second_us, 1, " %.0f |");
    std::printf("\nonce per process before the first kernel: toolchain probe %.0f ms; "
                "memory hit, per call on 16 elements (W1): fused %.1f µs, eager %.1f µs;\n"
                "g++ -std=c++20 -O2 -Iinclude -c examples/demo.cpp: %.1f s wall, %.1f s CPU header-only; "
                "%.1f s wall, %.1f s CPU with -DKILN_SEPARATE_ENGINE\n  (+ src/engine.cpp once per program: %.1f s wall, %.1f s CPU)\n",
                L.disk.probe_ms, L.disk.tiny_fused_us, L.disk.tiny_eager_us, L.gxx_s, L.gxx_cpu_s, L.gxx_front_s,
                L.gxx_front_cpu_s, L.gxx_engine_s, L.gxx_engine_cpu_s);
  }
  std::printf("load average at the end: %s\n", load_average().c_str());
  if (!all_ok) std::printf("\nSOME OUTPUTS FAILED THEIR CHECK (see the err/tol column)\n");
  return all_ok ? 0 : 1;
}
