// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The reduction rows of the primitive table (sum, amax, amin) against the float64
// reference: every axis set of a rank-3 operand, keepdim and not, each numeric dtype,
// contiguous and transposed operands, rows longer than one chunk, empty axes, size-1
// dims, reductions of fused pointwise producers, NaN propagation, and the API's forms;
// rows about the CPU kernels' partial sums, and which passes keep them.
#include "../support/reference.hpp"
#include "../support/rows.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {

// Tolerance of a reduction: a sum's error scales with sum |x| (accumulated in the compute
// type); amax and amin pick an element, exactly.
template <class DT>
Tol reduce_tol(Prim p) {
  return p == Prim::sum ? tol<DT>() : Tol{0, 0};
}

// Every reduction row of `in` over `axes`, kept and dropped, into one batch.
template <class DT, int R, class A, size_t N>
void add_reduce_rows(Batch& b, const A& operand, const Array& in, const std::array<int, N>& axes, const std::string& label) {
  std::vector<int> ax(axes.begin(), axes.end());
  for_each_row([&](auto row) {
    constexpr Prim P = decltype(row)::value;
    if constexpr (prim_info(P).kind == PrimKind::reduce) {
      std::string what = std::string(prim_info(P).name) + " over " + str(Dims(axes.begin(), axes.end())) + " " + label;
      Array scale = P == Prim::sum ? ref::abs_sum(in, ax, true) : Array{};
      Array scale_drop = scale;
      if (P == Prim::sum) scale_drop.shape = ref::sum(in, ax, false).shape;
      b.check(apply_reduce_keep<P>(operand, axes), ref::reduce(P, in, ax, true), reduce_tol<DT>(P), what + ", keepdim", scale);
      b.check(apply_reduce<P>(operand, axes), ref::reduce(P, in, ax, false), reduce_tol<DT>(P), what, scale_drop);
    }
  });
}

// Every row over `axes` on a contiguous and a transposed operand of shape s.
template <class DT, size_t N>
void add_axes(Batch& b, Rng& rng, const std::array<int, N>& axes, Shape<3> s) {
  auto c = input<DT, 3>(rng, s, Layout::contiguous, {-3, 3, 0.1});
  auto t = input<DT, 3>(rng, s, Layout::transposed, {-3, 3, 0.1});
  add_reduce_rows<DT, 3>(b, c.t, c.a, axes, "contiguous " + str(dims(s)));
  add_reduce_rows<DT, 3>(b, t.t, t.a, axes, "transposed " + str(dims(s)));
}

#define KILN_TEST_NUMERIC_DTYPES f32, f64, f16, bf16, i32, i64

// The CPU source of an expression's fused plan, every slot's stride unknown.
std::string cpu_source(const ir::Graph& g) {
  auto cp = runtime::plan_for(g, Mode::fused);
  std::vector<std::vector<codegen::Stride>> strides;
  for (const sched::Kernel& k : cp->plan.kernels) strides.emplace_back(codegen::layout(g, k).slots.size(), codegen::Stride::any);
  return codegen::cpp_source(g, cp->plan, strides);
}
// The bodies of the loops over a pass's partial sums (codegen/cpp.hpp, CppKernelWriter::rows).
std::vector<std::string> partial_loops(const std::string& src) {
  std::vector<std::string> out;
  const std::string open = "const int64_t j = jb + l;\n", close = "        }\n";
  for (size_t at = src.find(open); at != std::string::npos; at = src.find(open, at + 1))
    out.push_back(src.substr(at + open.size(), src.find(close, at) - at - open.size()));
  return out;
}

}  // namespace

TEST_CASE_TEMPLATE("reduce rows over every axis set of a rank-3 operand", DT, KILN_TEST_NUMERIC_DTYPES) {
  KILN_TEST_RNG(rng);
  // Each axis set at two sizes of one plan (no size-1 dims): small, and with the reduced
  // rows longer than one chunk (8192) of the CPU kernels, or the kept dims long.
  for (bool large : {false, true}) {
    Batch b;
    add_axes<DT>(b, rng, std::array{2}, large ? Shape<3>{3, 5, 9000} : Shape<3>{5, 7, 9});
    add_axes<DT>(b, rng, std::array{0}, large ? Shape<3>{9000, 2, 3} : Shape<3>{4, 2, 3});
    add_axes<DT>(b, rng, std::array{1}, large ? Shape<3>{2, 9000, 3} : Shape<3>{5, 7, 9});
    add_axes<DT>(b, rng, std::array{0, 2}, large ? Shape<3>{30, 2, 300} : Shape<3>{5, 7, 9});
    add_axes<DT>(b, rng, std::array{0, 1, 2}, large ? Shape<3>{3, 50, 900} : Shape<3>{2, 3, 2});  // outer = 1
    b.run();
  }
}

TEST_CASE_TEMPLATE("reduce rows: in eager mode", DT, f32, i64) {
  KILN_TEST_RNG(rng);
  auto x = input<DT, 3>(rng, {5, 7, 9});
  Batch b;
  add_reduce_rows<DT, 3>(b, x.t, x.a, std::array{1}, "contiguous [5, 7, 9]");
  b.run(Mode::eager);
}

TEST_CASE_TEMPLATE("reduce rows: size-1 dims", DT, f32, i32) {
  KILN_TEST_RNG(rng);
  auto x = input<DT, 3>(rng, {5, 1, 9});
  auto y = input<DT, 3>(rng, {1, 1, 1});
  Batch b;
  add_reduce_rows<DT, 3>(b, x.t, x.a, std::array{1}, "[5, 1, 9]");  // over the size-1 dim
  add_reduce_rows<DT, 3>(b, x.t, x.a, std::array{0, 2}, "[5, 1, 9]");
  add_reduce_rows<DT, 3>(b, y.t, y.a, std::array{0, 1, 2}, "[1, 1, 1]");
  b.run();
}

TEST_CASE("reduce rows: empty operands") {
  KILN_TEST_RNG(rng);
  // sum over an empty axis is 0 (its identity); amax/amin over one is an error (test_errors.cpp).
  auto x = input<f32, 3>(rng, {4, 0, 6});
  Batch b;
  b.check(kiln::sum(x.t, 1), ref::sum(x.a, {1}), "sum over an empty axis");
  b.check(kiln::sum(x.t, std::array{0, 1}, keepdim), ref::sum(x.a, {0, 1}, true), "sum over an empty axis, keepdim");
  b.check(kiln::sum(x.t), ref::sum(x.a, {0, 1, 2}), "sum of an empty tensor");
  b.check(kiln::amax(x.t, 2), ref::amax(x.a, {2}), "amax of an empty tensor over a non-empty axis");
  b.check(kiln::amin(x.t, 0), ref::reduce(Prim::amin, x.a, {0}), "amin of an empty tensor over a non-empty axis");
  b.run();
}

TEST_CASE_TEMPLATE("reduce rows: NaN and infinities propagate", DT, f32, f64, bf16) {
  KILN_TEST_RNG(rng);
  // Rows (along the last dim) with a NaN, +inf, -inf, both infinities, or none.
  auto x = input<DT, 2>(rng, {6, 300});
  Array a = x.a;
  a.at({0, 17}) = NAN;
  a.at({1, 299}) = INFINITY;
  a.at({2, 0}) = -INFINITY;
  a.at({3, 5}) = INFINITY, a.at({3, 6}) = -INFINITY;
  a.at({4, 0}) = NAN, a.at({4, 1}) = INFINITY;
  auto t = make_tensor<DT, 2>(a);
  Batch b;
  add_reduce_rows<DT, 2>(b, t, a, std::array{1}, "rows with NaN and infinities");
  b.run();
}

TEST_CASE("reduce rows: the API's forms and negative axes") {
  KILN_TEST_RNG(rng);
  auto x = input<f64, 3>(rng, {4, 6, 10});
  Batch b;
  b.check(kiln::sum(x.t), ref::sum(x.a, {0, 1, 2}), "sum(x)");
  b.check(kiln::sum(x.t, -1), ref::sum(x.a, {2}), "sum(x, -1)");
  b.check(kiln::amax(x.t, -3, keepdim), ref::amax(x.a, {0}, true), "amax(x, -3, keepdim)");
  b.check(kiln::amin(x.t, std::array{-1, 0}), ref::reduce(Prim::amin, x.a, {0, 2}), "amin(x, {-1, 0})");
  b.check(kiln::amin(x.t), ref::reduce(Prim::amin, x.a, {0, 1, 2}), "amin(x)");
  b.check(kiln::amax(x.t), ref::amax(x.a, {0, 1, 2}), "amax(x)");
  b.run();
}

TEST_CASE_TEMPLATE("reduce rows: of fused pointwise producers, with broadcasting", DT, f32, bf16) {
  KILN_TEST_RNG(rng);
  auto x = input<DT, 2>(rng, {37, 129}, Layout::transposed);
  auto w = input<DT, 1>(rng, {129});
  auto c = input<DT, 2>(rng, {37, 1});
  Array prod = ref::zip(ref::zip(x.a, w.a, [](double p, double q) { return p * q; }), c.a,
                        [](double p, double q) { return p - q; });
  Array ex = ref::map(x.a, [](double p) { return std::exp(p); });
  Batch b;
  Tol t = tol<DT>().scaled(2);  // the producer rounds once in the compute type before the sum
  b.check(kiln::sum(x.t * w.t - c.t, 1), ref::sum(prod, {1}), t, "sum(x * w - c, 1)", [&] {
    Array s = ref::abs_sum(prod, {1});
    return s;
  }());
  b.check(kiln::amax(kiln::exp(x.t), 0, keepdim), ref::amax(ex, {0}, true), t, "amax(exp(x), 0, keepdim)");
  b.run();
}

TEST_CASE_TEMPLATE("reduce rows: lengths about the CPU kernels' partial sums, with NaN and infinities", DT, f32, f64, bf16) {
  KILN_TEST_RNG(rng);
  // Partials of 32 floats or 16 doubles, then a tail; 8225 = a chunk (8192) + 33.
  for (int64_t n : {1, 15, 16, 17, 31, 32, 33, 65, 8225}) {
    auto x = input<DT, 2>(rng, {4, n});
    Array a = x.a;
    a.at({1, n / 2}) = INFINITY;
    a.at({2, n - 1}) = -INFINITY;
    a.at({3, n > 40 ? 40 : 0}) = NAN;
    auto t = make_tensor<DT, 2>(a);
    Batch b;
    add_reduce_rows<DT, 2>(b, t, a, std::array{1}, "[4, " + std::to_string(n) + "] with NaN and infinities");
    add_reduce_rows<DT, 2>(b, x.t, x.a, std::array{1}, "[4, " + std::to_string(n) + "]");
    b.run();
  }
}

TEST_CASE("reduce rows: a CPU pass of cheap float elements keeps partial sums; one of exponentials does not") {
  KILN_TEST_RNG(rng);
  auto x = input<f32, 2>(rng, {3, 100});
  auto [v, m] = kiln::var_mean(x.t, 1);
  // Two passes (the mean, the squared deviations), each in two forms (rows in parallel, or a
  // row's chunks); the mean's partials add plain loads.
  const std::vector<std::string> var_mean = partial_loops(cpu_source(ir::trace(v, m)));
  REQUIRE(var_mean.size() == 4);
  CHECK(var_mean[0].find(" += ") != std::string::npos);
  // softmax: the max pass keeps partials, the sum of exponentials does not.
  const std::vector<std::string> softmax = partial_loops(cpu_source(ir::trace(kiln::softmax(x.t, -1))));
  CHECK(softmax.size() == 2);
  for (const std::string& body : softmax) CHECK(body.find("kiln_exp") == std::string::npos);
  // integers: one accumulator (an integer add waits one cycle)
  auto i = input<i32, 2>(rng, {3, 100});
  CHECK(partial_loops(cpu_source(ir::trace(kiln::sum(i.t, 1)))).empty());
}
