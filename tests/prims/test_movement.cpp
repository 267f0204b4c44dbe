// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The movement rows of the primitive table (view: permute, slice, reshape; concat; pad)
// and expand, against the float64 reference: views of materialized expressions and of
// tensors (folded into the leaf's strides), views of views, negative and clamped slice
// bounds, empty results, reshape of non-contiguous memory, in element sizes 1, 2, 4, 8.
#include "../support/reference.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {

// A value that every dtype, boolean included, can compute: so views read a materialized buffer.
template <class A, class B>
auto combine(const A& a, const B& b) {
  return kiln::maximum(a, b);
}
inline Array combine_ref(const Array& a, const Array& b) { return ref::prim(Prim::max, a, b); }

// View rows: permute, transpose, slice, reshape, unsqueeze of an expression and of tensors.
template <class DT>
void add_views(Batch& b, Rng& rng) {
  auto x = input<DT, 3>(rng, {4, 5, 6}), y = input<DT, 3>(rng, {4, 5, 6}, Layout::transposed);
  auto e = combine(x.t, y.t);
  Array ea = combine_ref(x.a, y.a);
  auto z = input<DT, 3>(rng, {6, 4, 5});
  // views as outputs (non-contiguous results)
  b.check(kiln::permute(e, {2, 0, 1}), ref::permute(ea, {2, 0, 1}), "permute(e, {2, 0, 1})");
  b.check(kiln::transpose(e, 0, -1), ref::transpose(ea, 0, 2), "transpose(e, 0, -1)");
  b.check(kiln::slice(e, 1, 1, 5, 2), ref::slice(ea, 1, 1, 5, 2), "slice(e, 1, 1, 5, 2)");
  b.check(kiln::slice(e, -1, -4, -1), ref::slice(ea, 2, -4, -1), "slice(e, -1, -4, -1)");
  b.check(kiln::slice(e, 0, 2, 100), ref::slice(ea, 0, 2, 100), "slice(e, 0, 2, 100) clamps");
  b.check(kiln::slice(e, 2, 4, 4), ref::slice(ea, 2, 4, 4), "slice(e, 2, 4, 4) is empty");
  b.check(kiln::reshape(e, Shape<2>{20, 6}), ref::reshape(ea, {20, 6}), "reshape(e, {20, 6})");
  b.check(kiln::reshape(e, Shape<2>{-1, 3}), ref::reshape(ea, {40, 3}), "reshape(e, {-1, 3})");
  b.check(kiln::unsqueeze(e, 1), ref::reshape(ea, {4, 1, 5, 6}), "unsqueeze(e, 1)");
  b.check(kiln::slice(kiln::transpose(e, 0, 2), 0, 1, 6, 2), ref::slice(ref::transpose(ea, 0, 2), 0, 1, 6, 2),
          "slice(transpose(e)) (a view of a view)");
  // views read by another kernel
  b.check(combine(kiln::permute(e, {2, 0, 1}), z.t), combine_ref(ref::permute(ea, {2, 0, 1}), z.a),
          "maximum(permute(e), z)");
  b.check(combine(kiln::reshape(kiln::slice(e, 2, 0, 6, 3), Shape<2>{20, 2}), kiln::slice(kiln::reshape(z.t, Shape<2>{20, 6}), 1, 0, 2)),
          combine_ref(ref::reshape(ref::slice(ea, 2, 0, 6, 3), {20, 2}), ref::slice(ref::reshape(z.a, {20, 6}), 1, 0, 2)),
          "maximum(reshape(slice(e)), slice of a tensor view)");
  // views of tensors fold into the leaf; a reshape of non-contiguous memory reads a copy
  b.check(combine(kiln::reshape(y.t, Shape<2>{20, 6}), kiln::reshape(x.t, Shape<2>{20, 6})),
          combine_ref(ref::reshape(y.a, {20, 6}), ref::reshape(x.a, {20, 6})), "reshape of a transposed tensor");
  b.check(kiln::reshape(y.t, Shape<1>{120}), ref::reshape(y.a, {120}), "reshape of a transposed tensor, as an output");
  b.check(kiln::permute(kiln::slice(x.t, 2, 1, 6, 2), {1, 2, 0}),
          ref::permute(ref::slice(x.a, 2, 1, 6, 2), {1, 2, 0}), "permute(slice(tensor)), as an output");
}

// Concat and pad rows: tensors and expressions, empty operands, an operand twice.
template <class DT>
void add_concat_pad(Batch& bt, Rng& rng) {
  auto a = input<DT, 2>(rng, {3, 7}), b = input<DT, 2>(rng, {5, 7}, Layout::transposed);
  auto c = input<DT, 2>(rng, {3, 4}, Layout::strided), d = input<DT, 2>(rng, {3, 0});
  auto e = combine(a.t, c.t.slice(1, 0, 1));  // an expression operand: [3, 7]
  Array ea = combine_ref(a.a, ref::slice(c.a, 1, 0, 1));
  bt.check(kiln::concat(0, a.t, b.t), ref::concat(0, {a.a, b.a}), "concat(0, a, b)");
  bt.check(kiln::concat(-1, e, c.t, d.t, a.t), ref::concat(1, {ea, c.a, d.a, a.a}), "concat(-1, e, c, empty, a)");
  bt.check(kiln::concat(0, e, b.t, e), ref::concat(0, {ea, b.a, ea}), "concat(0, e, b, e) (an operand twice)");
  bt.check(kiln::concat(1, d.t, d.t), ref::concat(1, {d.a, d.a}), "concat of empty operands");
  double fill = std::is_same_v<DT, boolean> ? 1 : FloatDType<DT> ? 7.5 : -4;
  bt.check(kiln::pad(a.t, {1, 0}, {2, 3}, fill), ref::pad(a.a, {1, 0}, {2, 3}, fill), "pad(a, {1, 0}, {2, 3}, value)");
  bt.check(kiln::pad(e, {0, 2}, {0, 0}), ref::pad(ea, {0, 2}, {0, 0}, 0), "pad(e, {0, 2}, {0, 0})");
  bt.check(kiln::pad(b.t, {0, 0}, {0, 0}), b.a, "pad by nothing");
  bt.check(kiln::pad(d.t, {1, 1}, {1, 2}, fill), ref::pad(d.a, {1, 1}, {1, 2}, fill), "pad of an empty tensor");
  bt.check(combine(kiln::pad(e, {1, 0}, {0, 0}, fill), kiln::slice(kiln::concat(0, c.t.slice(1, 0, 1).expand({3, 7}), a.t), 0, 0, 4)),
           combine_ref(ref::pad(ea, {1, 0}, {0, 0}, fill),
                       ref::slice(ref::concat(0, {ref::expand(ref::slice(c.a, 1, 0, 1), {3, 7}), a.a}), 0, 0, 4)),
           "pad and concat read by another kernel");
}

}  // namespace

TEST_CASE_TEMPLATE("movement rows: view (permute, slice, reshape), concat, pad", DT, f32, f16, i64, boolean) {
  KILN_TEST_RNG(rng);
  Batch b;  // one plan
  add_views<DT>(b, rng);
  add_concat_pad<DT>(b, rng);
  b.run();
}

TEST_CASE("expand row: size-1 dims and new leading dims, of tensors and expressions") {
  KILN_TEST_RNG(rng);
  auto x = input<f32, 3>(rng, {4, 5, 6});
  auto r = input<f32, 2>(rng, {1, 6});
  auto s = kiln::sum(x.t, 1, keepdim);  // [4, 1, 6]
  Array sa = ref::sum(x.a, {1}, true);
  Batch b;
  b.check(kiln::expand(s, std::array<int64_t, 3>{4, 5, 6}), ref::expand(sa, {4, 5, 6}), tol<f32>(), "expand(sum(x, 1, keepdim))",
          ref::expand(ref::abs_sum(x.a, {1}, true), {4, 5, 6}));
  b.check(kiln::expand(r.t, std::array<int64_t, 3>{3, 5, -1}), ref::expand(r.a, {3, 5, 6}), "expand(tensor [1, 6] to [3, 5, 6])");
  b.check(kiln::expand(kiln::exp(r.t), std::array<int64_t, 2>{7, 6}) * 2,
          ref::map(ref::expand(r.a, {7, 6}), [](double v) { return 2 * std::exp(v); }), "expand(exp(r)) * 2");
  b.check(kiln::expand(r.t, std::array<int64_t, 2>{0, 6}), Array(Dims{0, 6}), "expand to an empty dim");
  b.run();
}

TEST_CASE_TEMPLATE("to_vector and to(cpu) give a view's elements in row-major order on its device", DT, f32, f64, bf16) {
  KILN_TEST_RNG(rng);
  // Inputs live on the default device (a GPU under KILN_DEVICE=cuda): a device view comes over
  // contiguous, and its elements must then be read with the copy's strides, not the view's.
  auto a = input<DT, 3>(rng, {3, 5, 7}, Layout::contiguous, Values{-4, 4});
  std::vector<std::pair<std::string, Tensor<DT, 3>>> views = {
      {"transpose(0, 2)", a.t.transpose(0, 2)}, {"permute(1, 2, 0)", a.t.permute({1, 2, 0})}, {"slice(1, 1, 5, 2)", a.t.slice(1, 1, 5, 2)}};
  for (const auto& [name, v] : views) {
    const std::string& what = name;  // NOTE: CAPTURE's lambda; clang 14 captures no structured binding
    CAPTURE(what);
    Array want = read(v);  // gathered element by element through the view's own strides
    std::vector<double> got = v.to_vector();
    REQUIRE(got.size() == want.v.size());
    size_t wrong = 0;
    for (size_t i = 0; i < got.size(); ++i) wrong += got[i] != want.v[i];
    CHECK(wrong == 0);
    Tensor<DT, 3> host = v.to(cpu());
    CHECK(host.is_contiguous());
    CHECK(read(host).v == want.v);
  }
}
