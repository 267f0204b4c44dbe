// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The matmul row against the float64 reference: odd sizes, sizes around the CPU GEMM's
// blocks (codegen/device/cpu_gemm.hpp), size-1 M, N and K, K = 0 (a sum of nothing:
// zeros), transposed and strided operands, batched and broadcast batch dims (each of the
// GEMM's parallel paths), expression operands and consumers, every numeric dtype.
// Tolerances scale with sum |a||b| of each output element.
#include "../support/reference.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {

template <class DT, class A, class B, int RA, int RB>
void add_matmul(Batch& b, const A& ka, const B& kb, const Array& ra, const Array& rb, const std::string& what) {
  Array scale;
  Array want = ref::matmul(ra, rb, &scale);
  b.check(kiln::matmul(ka, kb), want, tol<DT>(), what, scale);
}
template <class DT, int RA, int RB>
void add_matmul(Batch& b, const Input<DT, RA>& x, const Input<DT, RB>& y, const std::string& what) {
  add_matmul<DT, Tensor<DT, RA>, Tensor<DT, RB>, RA, RB>(b, x.t, y.t, x.a, y.a, what);
}

// Integer operands stay small enough that every product and sum is exact in double.
template <class DT>
Values mm_values() {
  return FloatDType<DT> ? Values{-2, 2} : Values{-20, 20};
}

#define KILN_TEST_NUMERIC_DTYPES f32, f64, f16, bf16, i32, i64

}  // namespace

TEST_CASE_TEMPLATE("matmul row: odd sizes, size-1 M, N and K, K = 0, transposed operands", DT, KILN_TEST_NUMERIC_DTYPES) {
  KILN_TEST_RNG(rng);
  Values v = mm_values<DT>();
  auto a = input<DT, 2>(rng, {37, 19}, Layout::contiguous, v), at = input<DT, 2>(rng, {37, 19}, Layout::transposed, v);
  auto b = input<DT, 2>(rng, {19, 300}, Layout::contiguous, v), bt = input<DT, 2>(rng, {19, 300}, Layout::transposed, v);
  auto bs = input<DT, 2>(rng, {19, 300}, Layout::strided, v);
  auto e0 = input<DT, 2>(rng, {5, 0}, Layout::contiguous, v), e1 = input<DT, 2>(rng, {0, 7}, Layout::contiguous, v);
  Batch batch;
  add_matmul(batch, a, b, "[37, 19] @ [19, 300]");
  add_matmul(batch, at, b, "transposed [37, 19] @ [19, 300]");
  add_matmul(batch, a, bt, "[37, 19] @ transposed [19, 300]");
  add_matmul(batch, at, bs, "transposed @ strided");
  add_matmul(batch, e0, e1, "[5, 0] @ [0, 7] (K = 0: zeros)");
  // size-1 M, N and K (in the same plan: one compile)
  add_matmul(batch, input<DT, 2>(rng, {1, 19}, Layout::contiguous, v), input<DT, 2>(rng, {19, 300}, Layout::contiguous, v),
             "[1, 19] @ [19, 300]");
  add_matmul(batch, input<DT, 2>(rng, {37, 1}, Layout::contiguous, v), input<DT, 2>(rng, {1, 300}, Layout::contiguous, v),
             "[37, 1] @ [1, 300] (K = 1)");
  add_matmul(batch, input<DT, 2>(rng, {37, 19}, Layout::contiguous, v), input<DT, 2>(rng, {19, 1}, Layout::contiguous, v),
             "[37, 19] @ [19, 1]");
  batch.run();
}

TEST_CASE_TEMPLATE("matmul row: batched, broadcast batch dims, expression operands", DT, f32, bf16, i64) {
  KILN_TEST_RNG(rng);
  Values v = mm_values<DT>();
  auto a3 = input<DT, 3>(rng, {3, 37, 19}, Layout::contiguous, v), b3 = input<DT, 3>(rng, {3, 19, 30}, Layout::transposed, v);
  auto a1 = input<DT, 3>(rng, {1, 37, 19}, Layout::contiguous, v), b4 = input<DT, 3>(rng, {4, 19, 30}, Layout::contiguous, v);
  auto b2 = input<DT, 2>(rng, {19, 30}, Layout::contiguous, v);
  auto bias = input<DT, 1>(rng, {30}, Layout::contiguous, v);
  Batch batch;
  add_matmul(batch, a3, b3, "[3, 37, 19] @ [3, 19, 30]");
  add_matmul(batch, a3, b2, "[3, 37, 19] @ [19, 30] (batch broadcast)");
  add_matmul(batch, input<DT, 3>(rng, {3, 37, 19}, Layout::expanded_outer, v), b3, "stride-0 batch dim @ [3, 19, 30]");
  add_matmul(batch, a1, b4, "[1, 37, 19] @ [4, 19, 30] (size-1 batch broadcast)");
  // an expression operand (materialized first) and a fused consumer
  auto r = input<DT, 1>(rng, {19}, Layout::contiguous, v);
  auto m = kiln::matmul(kiln::maximum(a3.t, r.t), b2.t) + bias.t;
  Array scale;
  Array mm = ref::matmul(ref::prim(Prim::max, a3.a, r.a), b2.a, &scale);
  batch.check(m, ref::zip(mm, bias.a, [](double p, double q) { return p + q; }), tol<DT>().scaled(2),
              "matmul(maximum(a, r), b) + bias", ref::zip(scale, bias.a, [](double s, double q) { return s + std::fabs(q); }));
  batch.run();
}

// The CPU GEMM's blocks: register tile MR x NR (AVX-512 f32: 12 x 32, f64 and int64 12 x 16;
// AVX2: 6 x 16), K blocks of KC = 256, row blocks of about 144 (rounded to even shares
// among the threads), column panels of up to 1024. Each size sits on or beside one edge.
TEST_CASE_TEMPLATE("matmul row: sizes around the CPU GEMM's blocks, its parallel paths", DT, KILN_TEST_NUMERIC_DTYPES) {
  KILN_TEST_RNG(rng);
  Values v = mm_values<DT>();
  using L = Layout;
  struct Case {
    int64_t m, k, n;
    L la, lb;
  };
  Batch batch;  // one plan, one compile
  for (auto [m, k, n, la, lb] : {Case{143, 255, 33, L::contiguous, L::contiguous}, Case{144, 256, 32, L::transposed, L::contiguous},
                                 Case{145, 257, 31, L::contiguous, L::transposed}, Case{13, 513, 65, L::strided, L::contiguous},
                                 Case{11, 300, 1100, L::contiguous, L::strided}, Case{289, 129, 7, L::transposed, L::transposed},
                                 Case{12, 7, 17, L::contiguous, L::contiguous}, Case{7, 1, 129, L::contiguous, L::contiguous},
                                 Case{1, 1, 1, L::contiguous, L::contiguous}})
    add_matmul(batch, input<DT, 2>(rng, {m, k}, la, v), input<DT, 2>(rng, {k, n}, lb, v),
               "[" + std::to_string(m) + ", " + std::to_string(k) + "] " + name(la) + " @ [" + std::to_string(k) + ", " +
                   std::to_string(n) + "] " + name(lb));
  // Batched: each product shared by the threads; B broadcast (packed once for the batch);
  // A broadcast; many small products (one per thread).
  add_matmul(batch, input<DT, 3>(rng, {2, 150, 300}, L::contiguous, v), input<DT, 3>(rng, {2, 300, 70}, L::transposed, v),
             "[2, 150, 300] @ [2, 300, 70]");
  add_matmul(batch, input<DT, 3>(rng, {3, 150, 300}, L::contiguous, v), input<DT, 2>(rng, {300, 70}, L::contiguous, v),
             "[3, 150, 300] @ [300, 70] (B broadcast)");
  add_matmul(batch, input<DT, 3>(rng, {3, 150, 300}, L::expanded_outer, v), input<DT, 3>(rng, {3, 300, 70}, L::contiguous, v),
             "stride-0 batch [3, 150, 300] @ [3, 300, 70] (A broadcast)");
  add_matmul(batch, input<DT, 3>(rng, {9, 37, 19}, L::transposed, v), input<DT, 3>(rng, {9, 19, 300}, L::contiguous, v),
             "[9, 37, 19] @ [9, 19, 300] (small products)");
  batch.run();
}
