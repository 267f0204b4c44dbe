// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// CPU tensors through the host caching allocator (core/device.hpp): a repeated call
// reuses the blocks its previous call freed (outputs, intermediates and the CPU GEMM's
// scratch), live tensors never share a block, a reused block is poisoned again, and
// kiln::empty_cache hands the cache back.
#include <set>

#include "../support/reference.hpp"

using namespace kiln;
using namespace kiln::test;

TEST_CASE("host allocator: a repeated compiled call takes every block from the cache") {
  KILN_TEST_RNG(rng);
  auto x = input<f32, 2>(rng, {67, 45}), w = input<f32, 2>(rng, {45, 131});
  auto b = input<f32, 1>(rng, {131});
  // CPU tensors whatever the default device (the foundation suite also runs on a GPU).
  auto xc = x.t.to(cpu()), wc = w.t.to(cpu());
  auto bc = b.t.to(cpu());
  // A GEMM with a fused epilogue, a rows kernel and an intermediate between them.
  auto model = compile([](const auto& x, const auto& w, const auto& b) { return softmax(gelu(matmul(x, w) + b), -1); });
  Array scale;
  Array want = ref::softmax(ref::map(ref::zip(ref::matmul(x.a, w.a, &scale), b.a, std::plus<>()), ref::gelu), -1);
  // The f32 GEMM's rounding (K terms, each up to |x||w|) passes through gelu (slope < 1.13) into
  // softmax, whose outputs move relatively by at most twice the largest change of their row.
  double worst = *std::max_element(scale.v.begin(), scale.v.end());
  const Tol t{tol<f32>().rtol + 2 * 1.13 * 45 * 0x1p-24 * worst, tol<f32>().atol};
  check_close(Tensor<f32, 2>(model(xc, wc, bc)), want, t, "first call");
  for (int call = 0; call < 3; ++call) {
    const CachingAllocatorStats before = host_allocator().stats();
    Tensor<f32, 2> y = model(xc, wc, bc);
    const CachingAllocatorStats after = host_allocator().stats();
    CHECK(after.device_allocs == before.device_allocs);
    // The output, the intermediate and at least three GEMM scratch blocks (packed B, packed A, workspace).
    CHECK(after.reuses - before.reuses >= 5);
    check_close(y, want, t, "call " + std::to_string(call));
  }
}

TEST_CASE("host allocator: live tensors never share a block, and views keep theirs") {
  KILN_TEST_RNG(rng);
  auto x = input<f32, 2>(rng, {33, 17});
  std::vector<Tensor<f32, 2>> kept;
  Tensor<f32, 1> view;
  for (int i = 0; i < 6; ++i) {
    kept.push_back(x.t * float(i + 1));  // same size class each time
    Tensor<f32, 2> temporary = exp(x.t) + float(i);
    if (i == 2) view = temporary.slice(0, 5, 6).template view<1>(Shape<1>{17});  // outlives `temporary`
  }
  std::set<const void*> blocks;
  for (int i = 0; i < 6; ++i) {
    blocks.insert(kept[size_t(i)].storage()->data());
    check_close(kept[size_t(i)], ref::map(x.a, [&](double v) { return v * (i + 1); }), tol<f32>(), "kept " + std::to_string(i));
  }
  CHECK(blocks.size() == 6);
  check_close(view, ref::map(ref::reshape(ref::slice(x.a, 0, 5, 6), {17}), [](double v) { return std::exp(v) + 2; }), tol<f32>(),
              "view of a dropped temporary");
}

TEST_CASE("host allocator: a reused block is poisoned again; empty_cache hands the cache back") {
  REQUIRE(detail::cpu_poison());  // reference.hpp turns it on for every test
  const void* first = nullptr;
  {
    auto t = Tensor<i32, 1>::from({300}, std::vector<double>(300, 7.0), cpu());
    first = t.storage()->data();
  }
  const CachingAllocatorStats before = host_allocator().stats();
  auto again = Tensor<i32, 1>::empty({299}, cpu());  // the same 512-byte-step class
  auto floats = Tensor<f32, 1>::empty({300}, cpu());
  CHECK(host_allocator().stats().reuses >= before.reuses + 1);
  CHECK(again.storage()->data() == first);
  for (int64_t i = 0; i < 299; ++i) CHECK_MESSAGE(again(i) == -1, "element ", i, " kept the freed tensor's value");
  for (int64_t i = 0; i < 300; ++i) CHECK(std::isnan(floats(i)));

  CHECK(host_allocator().stats().bytes_cached + host_allocator().stats().bytes_in_use > 0);
  empty_cache();
  CHECK(host_allocator().stats().bytes_cached == 0);
  const uint64_t allocs = host_allocator().stats().device_allocs;
  { auto fresh = Tensor<f32, 1>::empty({300}, cpu()); }
  CHECK(host_allocator().stats().device_allocs == allocs + 1);  // nothing cached to reuse
}
