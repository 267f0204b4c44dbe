// kiln example: train an MLP classifier on real data, the UCI handwritten digits
// (8x8 images, 1797 samples, 10 classes; BSD-3 licensed, shipped by Debian's
// python3-sklearn as sklearn/datasets/data/digits.csv.gz). Each training step —
// forward, backward and the AdamW update of every parameter — is ONE fused plan.
// Prints loss and held-out accuracy per epoch, and eager vs compiled time per step.
// Runs on the default device: the first GPU where one exists (KILN_DEVICE=cpu forces
// the CPU); every step's loss comes back to the host, so wall time per step is device time.
// Used by examples/train_digits.cpp (and callable from the demo).
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <kiln/kiln.hpp>
#include <kiln/nn/modules.hpp>

namespace kiln_examples {

inline const char* kDigitsPath = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz";

struct Digits {
  std::vector<double> x;  // [n, 64], pixels scaled to [0, 1]
  std::vector<double> y;  // [n] class 0..9
  int64_t n = 0;
};

// Reads the gzipped CSV (64 pixel values 0..16, then the label, per line).
// KILN_DIGITS=path overrides where the file is read from.
inline Digits load_digits(std::string path = "") {
  if (path.empty()) path = std::getenv("KILN_DIGITS") ? std::getenv("KILN_DIGITS") : kDigitsPath;
  Digits d;
  std::string cmd = "gzip -dc '" + path + "' 2>/dev/null";
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return d;
  std::string line;
  for (int c; (c = std::fgetc(f)) != EOF;) {
    if (c != '\n') {
      line.push_back(char(c));
      continue;
    }
    std::vector<double> v;
    for (size_t at = 0; at < line.size();) {
      size_t end = line.find(',', at);
      if (end == std::string::npos) end = line.size();
      v.push_back(std::stod(line.substr(at, end - at)));
      at = end + 1;
    }
    line.clear();
    if (v.size() != 65) continue;
    for (int i = 0; i < 64; ++i) d.x.push_back(v[size_t(i)] / 16.0);
    d.y.push_back(v[64]);
    ++d.n;
  }
  pclose(f);
  return d;
}

inline double median_ms(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t.empty() ? 0 : t[t.size() / 2];
}

// Returns the final held-out accuracy (0 when the data set is missing).
inline double train_digits(int epochs = 12, int batch = 64, bool timing = true) {
  using namespace kiln;
  Digits all = load_digits();
  if (all.n == 0) {
    std::printf("digits data set not found at %s (apt-get install python3-sklearn, or set KILN_DIGITS)\n",
                std::getenv("KILN_DIGITS") ? std::getenv("KILN_DIGITS") : kDigitsPath);
    return 0;
  }
  // A fixed shuffle, then 80% train / 20% held out.
  std::vector<int64_t> order(size_t(all.n));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(42));
  int64_t n_test = all.n / 5, n_train = all.n - n_test;
  auto take = [&](int64_t from, int64_t count, Shape<2>) {
    std::vector<double> x, y;
    for (int64_t i = from; i < from + count; ++i) {
      int64_t k = order[size_t(i)];
      x.insert(x.end(), all.x.begin() + k * 64, all.x.begin() + (k + 1) * 64);
      y.push_back(all.y[size_t(k)]);
    }
    return std::pair{Tensor<f32, 2>::from({count, 64}, x), Tensor<i64, 1>::from({count}, y)};
  };
  auto [x_train, y_train] = take(0, n_train, {});
  auto [x_test, y_test] = take(n_train, n_test, {});
  std::printf("digits: %lld train, %lld held out, 64 features, 10 classes, device %s\n", (long long)n_train,
              (long long)n_test, x_train.device().str().c_str());

  nn::GeluMLP model(64, 128, 10, /*seed=*/1);
  nn::AdamW opt(model.params(), /*lr=*/3e-3, /*weight_decay=*/1e-2);
  auto accuracy = [&, &x_test = x_test, &y_test = y_test] {  // NOTE: named: clang 14 captures no structured binding
    Tensor<f32, 2> logits = model(x_test);
    auto l = logits.to_vector(), y = y_test.to_vector();
    int64_t hit = 0;
    for (int64_t i = 0; i < n_test; ++i) {
      auto row = l.begin() + i * 10;
      hit += int64_t(std::max_element(row, row + 10) - row) == int64_t(y[size_t(i)]);
    }
    return double(hit) / double(n_test);
  };

  std::vector<double> step_ms;
  double acc = 0;
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    double loss_sum = 0;
    int steps = 0;
    for (int64_t at = 0; at + batch <= n_train; at += batch) {
      auto xb = x_train.slice(0, at, at + batch);
      auto yb = y_train.slice(0, at, at + batch);
      auto t0 = std::chrono::steady_clock::now();
      loss_sum += opt.step(nn::cross_entropy(model(xb), yb));  // forward + backward + AdamW: one plan
      step_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      ++steps;
    }
    acc = accuracy();
    std::printf("epoch %2d  train loss %.4f  held-out accuracy %.2f%%\n", epoch, loss_sum / steps, 100 * acc);
  }
  if (timing) {
    // The same step, eager (one kernel per primitive) beside compiled, on a fresh model.
    nn::GeluMLP m2(64, 128, 10, 1);
    nn::AdamW eager(m2.params(), 3e-3, 1e-2, 0.9, 0.999, 1e-8, Mode::eager);
    auto xb = x_train.slice(0, 0, batch);
    auto yb = y_train.slice(0, 0, batch);
    std::vector<double> eager_ms;
    for (int i = 0; i < 12; ++i) {
      auto t0 = std::chrono::steady_clock::now();
      eager.step(nn::cross_entropy(m2(xb), yb));
      if (i >= 2) eager_ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    Counters c0 = counters();
    opt.step(nn::cross_entropy(model(xb), yb));
    uint64_t fused_kernels = counters().kernels_launched - c0.kernels_launched;
    c0 = counters();
    eager.step(nn::cross_entropy(m2(xb), yb));
    uint64_t eager_kernels = counters().kernels_launched - c0.kernels_launched;
    std::vector<double> steady(step_ms.begin() + std::min<size_t>(step_ms.size(), 5), step_ms.end());
    double tc = median_ms(steady), te = median_ms(eager_ms);
    std::printf("per training step (batch %d, %s): compiled %.3f ms (%llu kernels), eager %.3f ms (%llu kernels): %.1fx\n",
                batch, xb.device().str().c_str(), tc, (unsigned long long)fused_kernels, te, (unsigned long long)eager_kernels,
                te / tc);
  }
  return acc;
}

}  // namespace kiln_examples
