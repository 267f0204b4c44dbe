// kiln demo (scripts/demo): a small model written as expressions, the C++ kernel kiln
// generates for it, the JIT cache at work, and eager mode against compiled.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <kiln/kiln.hpp>
using namespace kiln;
namespace fs = std::filesystem;

// A 2-layer MLP forward: linear -> layer_norm -> gelu -> linear -> softmax.
auto mlp = [](const auto& x, const auto& w1, const auto& b1, const auto& g, const auto& beta, const auto& w2, const auto& b2) {
  return softmax(linear(gelu(layer_norm(linear(x, w1, b1), g, beta)), w2, b2), -1);
};
double ms(auto&& f) {  // one call
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
// Medians of `runs` calls of f and of g, the calls alternating so that a busy machine's
// load falls on both alike; three untimed calls of each first (kernel loading, first
// touch of memory).
std::pair<double, double> median_ms(auto&& f, auto&& g, int runs = 15) {
  for (int i = 0; i < 3; ++i) f(), g();
  std::vector<double> tf, tg;
  for (int i = 0; i < runs; ++i) tf.push_back(ms(f)), tg.push_back(ms(g));
  std::sort(tf.begin(), tf.end());
  std::sort(tg.begin(), tg.end());
  return {tf[size_t(runs / 2)], tg[size_t(runs / 2)]};
}
void show(const char* what, Counters a, Counters b) {
  std::printf("%-26s compiles: %lu, disk hits: %lu, memory hits: %lu\n", what, (unsigned long)(b.compiles - a.compiles),
              (unsigned long)(b.disk_hits - a.disk_hits), (unsigned long)(b.memory_hits - a.memory_hits));
}

int main() {
  fs::path dump = fs::temp_directory_path() / ("kiln-demo-" + std::to_string(getpid()));
  setenv("KILN_DUMP", dump.c_str(), 1);  // from now on kiln writes every kernel source it loads there
  Tensor<f32, 2> x = randn<f32>(Shape<2>{256, 256}, 1), w1 = randn<f32>(Shape<2>{512, 256}, 2) * 0.06f,
                 w2 = randn<f32>(Shape<2>{10, 512}, 3) * 0.04f;
  Tensor<f32, 1> b1 = randn<f32>(Shape<1>{512}, 4) * 0.1f, b2 = randn<f32>(Shape<1>{10}, 5) * 0.1f,
                 g = Tensor<f32, 1>::from(Shape<1>{512}, std::vector<double>(512, 1.0)), beta = g * 0.0f;
  fs::remove_all(dump);  // keep only the model's source
  auto model = compile(mlp), eager = compile(mlp, Mode::eager);

  Counters c0 = counters();
  double first = ms([&] { model(x, w1, b1, g, beta, w2, b2); });
  Counters c1 = counters();
  Tensor<f32, 2> p = model(x, w1, b1, g, beta, w2, b2).to(cpu());  // host copy (if on a GPU) to print
  show("first call (JIT):", c0, c1);
  show("second call (cached):", c1, counters());
  auto y = mlp(x, w1, b1, g, beta, w2, b2);
  std::string plan = explain(Mode::fused, y);
  std::printf("\nThe plan: %zu kernels (eager mode runs %zu, one per primitive)\n%s", kernel_count(Mode::fused, y),
              kernel_count(Mode::eager, y), plan.c_str());

  // The source of the fused bias + layer_norm + gelu kernel (the plan's first "rows"
  // kernel): C++ on the CPU, CUDA (.cu) on an NVIDIA GPU.
  std::string fn = " kiln_k" + std::to_string(std::stoi(plan.substr(plan.rfind("kernel ", plan.find(" (rows)")) + 7))) + "(";
  for (const auto& f : fs::directory_iterator(dump)) {
    std::string src = (std::stringstream() << std::ifstream(f.path()).rdbuf()).str();
    size_t at = src.find(fn), from = src.rfind("\nextern", at) + 1, end = src.find("\nextern", at);
    if (f.path().extension() != ".log" && at != std::string::npos)
      std::printf("\nGenerated source (%s):\n%s\n", f.path().c_str(), src.substr(from, end - from).c_str());
  }

  auto [t_fused, t_eager] =
      median_ms([&] { model(x, w1, b1, g, beta, w2, b2); }, [&] { eager(x, w1, b1, g, beta, w2, b2); });
  std::printf("compiled %.2f ms, eager %.2f ms (medians of 15 alternating calls): eager / compiled = %.1fx; the first call took %.0f ms\n",
              t_fused, t_eager, t_eager / t_fused, first);
  std::printf("p[0, :3] = %.4f %.4f %.4f, row sum %.4f\n", p(0, 0), p(0, 1), p(0, 2), Tensor<f32, 1>(sum(p, 1))(0));
  show("\nthis run, every kernel:", Counters{}, counters());
  std::puts(counters().compiles ? "run the demo again: every kernel then comes from the disk cache (compiles: 0)"
                                : "every kernel came from the disk cache (KILN_CACHE_DIR, default ~/.cache/kiln)");
  fs::remove_all(dump);
}
