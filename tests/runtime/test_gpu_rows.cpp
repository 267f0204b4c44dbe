// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The GPU rows strategies (runtime/gpu_backend.hpp, codegen/gpu.hpp): several short
// rows per warp, a warp per row, a block per row (kept in registers), split rows (few long rows of a one-pass
// reduction: several blocks per row, the last one combines the partials), and column
// rows (reduced along a strided dim: 16-byte chunks of columns or a column per lane,
// split or not).
//   * anywhere (the cpu suite, and gpu-foundation on the default GPU): the shapes
//     that pick each strategy against float64 references, twice (a split kernel
//     resets its counters for the next launch), one kernel each;
//   * host side (no GPU): the column form, block and grid each shape, dtype and view gets;
//   * nvrtc / hiprtc (no GPU): which strategy each shape gets, and the programs
//     compile for sm_80, sm_90, gfx90a (wave64) and gfx1030 (wave32);
//   * gpu: the same numbers on kiln::cuda(0); block rows under the residency, streaming,
//     exact and keep overrides too.
#include <bit>

#include "../support/gpu_program.hpp"
#include "../support/reference.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {

template <class DT, int R>
Tensor<DT, R> on(Device d, const Tensor<DT, R>& t) {
  return t.device() == d ? t : t.to(d);
}

// sum, amax and mean over the last dim of a random [rows, n] operand in layout `l`, on
// device `d`, twice: the same numbers both times, within the float64 reference's bounds.
void check_row_reductions(Device d, int64_t rows, int64_t n, Layout l) {
  KILN_TEST_RNG(rng);
  auto in = input<f32, 2>(rng, Shape<2>{rows, n}, l);
  auto x = on(d, in.t);
  std::string what = "[" + std::to_string(rows) + ", " + std::to_string(n) + "] " + name(l) + " on " + d.str();
  CAPTURE(what);
  Array s = ref::sum(in.a, {1}), scale = ref::abs_sum(in.a, {1}), m = ref::amax(in.a, {1});
  Array mean = ref::map(s, [&](double v) { return v / double(n); });
  Array mean_scale = ref::map(scale, [&](double v) { return v / double(n); });
  auto c0 = counters();
  auto [s1, m1] = eval(sum(x, -1), amax(x, -1));
  auto c1 = counters();
  CHECK(c1.kernels_launched - c0.kernels_launched == 1);  // both reductions in one kernel
  auto [s2, m2] = eval(sum(x, -1), amax(x, -1));
  auto c2 = counters();
  CHECK(c2.compiles == c1.compiles);
  Tensor<f32, 1> a1 = kiln::mean(x, -1), a2 = kiln::mean(x, -1);
  check_close(s1, s, tol<f32>(), "sum " + what, &scale);
  check_close(m1, m, Tol{0, 0}, "amax " + what);
  check_close(a1, mean, tol<f32>(), "mean " + what, &mean_scale);
  CHECK(read(s2).v == read(s1).v);
  CHECK(read(m2).v == read(m1).v);
  CHECK(read(a2).v == read(a1).v);
}

// Column reductions over dim R - 2 of x (on its device, any view; `a` its values), the last
// dim kept and contiguous, against float64: sum and amax in one kernel, twice, bit for bit
// the same (split column rows combine their parts in a fixed order); the mean; fused
// producers x * w, w broadcast along the reduced dim (16-byte loads of both where x has
// them), and x * c, c broadcast along the kept ones (a column per lane).
template <class DT, int R>
void check_columns(Rng& rng, const Tensor<DT, R>& x, const Array& a, const std::string& what) {
  constexpr int dim = R - 2;
  CAPTURE(what);
  const Tol t = tol<DT>();
  Array s = ref::sum(a, {dim}), scale = ref::abs_sum(a, {dim}), m = ref::amax(a, {dim});
  auto c0 = counters();
  auto [s1, m1] = eval(sum(x, dim), amax(x, dim));
  CHECK(counters().kernels_launched - c0.kernels_launched == 1);  // both reductions in one kernel
  auto [s2, m2] = eval(sum(x, dim), amax(x, dim));
  check_close(s1, s, t, "sum " + what, &scale);
  check_close(m1, m, Tol{0, 0}, "amax " + what);
  CHECK(read(s2).v == read(s1).v);
  CHECK(read(m2).v == read(m1).v);
  if constexpr (FloatDType<DT>) {
    double rows = double(a.shape[size_t(dim)]);
    Tensor<DT, R - 1> mean = kiln::mean(x, dim);
    Array want = ref::map(s, [&](double v) { return v / rows; }), want_scale = ref::map(scale, [&](double v) { return v / rows; });
    check_close(mean, want, t, "mean " + what, &want_scale);
  }
  auto w = input<DT, 1>(rng, Shape<1>{a.shape.back()});
  auto c = input<DT, 2>(rng, Shape<2>{a.shape[size_t(dim)], 1});
  Array xw = ref::prim(Prim::mul, a, w.a), xc = ref::prim(Prim::mul, a, c.a);
  Array xw_scale = ref::abs_sum(xw, {dim}), xc_scale = ref::abs_sum(xc, {dim});
  Tensor<DT, R - 1> sw = sum(x * on(x.device(), w.t), dim), sc = sum(x * on(x.device(), c.t), dim);
  check_close(sw, ref::sum(xw, {dim}), t.scaled(2), "sum(x * w) " + what, &xw_scale);
  check_close(sc, ref::sum(xc, {dim}), t.scaled(2), "sum(x * c) " + what, &xc_scale);
}

// The column views of a random [rows, n] (or [batch, rows, n]) operand of dtype DT, on
// device d: contiguous, and `unaligned` (columns 1 .. n of a [rows, n + 1] operand: a
// start and rows off 16 bytes).
template <class DT>
void check_columns(Device d, int64_t rows, int64_t n, bool unaligned = false, int64_t batch = 0) {
  KILN_TEST_RNG(rng);
  std::string what = std::string(unaligned ? "unaligned " : "") + dtype_name<DT>() + " columns of [" +
                     (batch ? std::to_string(batch) + ", " : "") + std::to_string(rows) + ", " + std::to_string(n) + "] on " + d.str();
  int64_t width = n + (unaligned ? 1 : 0);
  if (batch) {
    auto in = input<DT, 3>(rng, Shape<3>{batch, rows, width});
    check_columns<DT, 3>(rng, on(d, in.t).slice(2, width - n, width), ref::slice(in.a, 2, width - n, width), what);
  } else {
    auto in = input<DT, 2>(rng, Shape<2>{rows, width});
    check_columns<DT, 2>(rng, on(d, in.t).slice(1, width - n, width), ref::slice(in.a, 1, width - n, width), what);
  }
}

// Every column form (runtime/gpu_backend.hpp's choice for a 132-SM device; the test
// "column rows: ..." below asserts it) in each dtype's chunk width.
template <class DT>
void check_column_forms(Device d) {
  check_columns<DT>(d, 600, 512);                   // 16-byte chunks, rows split in 4 parts
  check_columns<DT>(d, 2048, 256);                  // few columns: one column block, 16 parts
  check_columns<DT>(d, 40, 8192);                   // many columns: not split
  check_columns<DT>(d, 600, 777);                   // odd width: a column per lane, split
  check_columns<DT>(d, 600, 512, true);             // unaligned: a column per lane, split
  check_columns<DT>(d, 3, 1025);                    // few rows: one row group
  check_columns<DT>(d, 2, 4096);                    // two rows: one row group, 16-byte chunks
  check_columns<DT>(d, 300, 64, false, 7);          // two kept dims, 16-byte chunks, split
  check_columns<DT>(d, 301, 66, false, 5);          // two kept dims, a column per lane
}

// softmax over rows of n (two passes and a store pass; kept in registers where it fits).
void check_softmax(Device d, int64_t rows, int64_t n) {
  KILN_TEST_RNG(rng);
  auto in = input<f32, 2>(rng, Shape<2>{rows, n});
  Tensor<f32, 2> y = softmax(on(d, in.t), -1);
  Array e = in.a, want = in.a;
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, in.a.v[size_t(r * n + j)]);
    for (int64_t j = 0; j < n; ++j) s += e.v[size_t(r * n + j)] = std::exp(in.a.v[size_t(r * n + j)] - mx);
    for (int64_t j = 0; j < n; ++j) want.v[size_t(r * n + j)] = e.v[size_t(r * n + j)] / s;
  }
  check_close(y, want, Tol{1e-5, 1e-9}, "softmax [" + std::to_string(rows) + ", " + std::to_string(n) + "] on " + d.str());
}

// softmax and log_softmax over rows of n whose values a one-pass (online) sum must rescale
// for, against float64: a max that grows at every element, one that falls, -inf entries
// (a mask), a row all -inf (NaN, as two passes give), magnitudes whose exp overflows f32
// without the max, the max at the row's end; the rest random.
void check_softmax_special(Device d, int64_t n) {
  KILN_TEST_RNG(rng);
  const int64_t rows = 7;
  Array a = random_array(rng, DType::f32, Dims{rows, n});
  auto at = [&](int64_t r, int64_t j) -> double& { return a.v[size_t(r * n + j)]; };
  for (int64_t j = 0; j < n; ++j) {
    at(0, j) = round_to(DType::f32, double(j) * 0.01);
    at(1, j) = round_to(DType::f32, -double(j) * 0.01);
    if (j % 3 == 1) at(2, j) = -INFINITY;
    at(3, j) = -INFINITY;
    at(4, j) = round_to(DType::f32, at(4, j) * 100 + 5000);
  }
  at(5, n - 1) = 50;
  Array soft = a, logsoft = a, log_scale = a;
  for (int64_t r = 0; r < rows; ++r) {
    double mx = -INFINITY, s = 0;
    for (int64_t j = 0; j < n; ++j) mx = std::max(mx, at(r, j));
    for (int64_t j = 0; j < n; ++j) s += std::exp(at(r, j) - mx);
    for (int64_t j = 0; j < n; ++j) {
      size_t i = size_t(r * n + j);
      soft.v[i] = std::exp(at(r, j) - mx) / s;
      logsoft.v[i] = (at(r, j) - mx) - std::log(s);
      // a difference of two rounded terms; the sum, about 1 or more, rounded to an ulp of it
      log_scale.v[i] = std::fabs(at(r, j) - mx) + std::fabs(std::log(s)) + 1;
    }
  }
  auto x = on(d, make_tensor<f32, 2>(a));
  std::string what = "[" + std::to_string(rows) + ", " + std::to_string(n) + "] on " + d.str();
  check_close(Tensor<f32, 2>(softmax(x, -1)), soft, Tol{1e-5, 1e-9}, "softmax, special rows " + what);
  check_close(Tensor<f32, 2>(log_softmax(x, -1)), logsoft, Tol{1e-5, 1e-9}, "log_softmax, special rows " + what, &log_scale);
}

// bf16 layer_norm over rows of n with weight and bias: one rounding of the output, relative
// to |xhat * w| + |b| (the sum may cancel).
void check_layer_norm(Device d, int64_t rows, int64_t n) {
  KILN_TEST_RNG(rng);
  auto x = input<bf16, 2>(rng, Shape<2>{rows, n});
  auto w = input<bf16, 1>(rng, Shape<1>{n}, Layout::contiguous, {0.5, 1.5}), b = input<bf16, 1>(rng, Shape<1>{n});
  Tensor<bf16, 2> y = layer_norm(on(d, x.t), on(d, w.t), on(d, b.t), 1e-5);
  Array x_hat = ref::layer_norm(x.a, ref::map(w.a, [](double) { return 1.0; }), ref::map(b.a, [](double) { return 0.0; }), 1e-5);
  Array scale = ref::zip3(x_hat, ref::expand(w.a, {rows, n}), ref::expand(b.a, {rows, n}),
                          [](double v, double g, double c) { return std::fabs(v * g) + std::fabs(c); });
  check_close(y, ref::layer_norm(x.a, w.a, b.a, 1e-5), tol<bf16>().scaled(2),
              "layer_norm [" + std::to_string(rows) + ", " + std::to_string(n) + "] on " + d.str(), &scale);
}

// Block rows kept in registers with `resident` threads an SM promised by their launch
// bounds (gpu_block_rows_resident; fewer registers a thread, spilled where they do not fit),
// against float64: two passes and a store pass (softmax, layer_norm), a one-pass reduction.
void check_block_rows_resident(Device d, int resident) {
  CAPTURE(resident);
  runtime::gpu_block_rows_resident() = resident;
  check_softmax(d, 301, 8192);
  check_layer_norm(d, 1001, 4096);
  check_layer_norm(d, 77, 1000);
  check_row_reductions(d, 300, 5000, Layout::contiguous);
  runtime::gpu_block_rows_resident() = 0;
}

// A pointwise kernel over two dims that a bias keeps apart, (x + b) * s with b [n] along the
// rows and s [rows, 1] along the columns, against float64: on a GPU 16-byte chunks within
// each row where n is whole chunks and the rows start aligned, scalar otherwise.
template <class DT>
void check_bias_pointwise(Device d, int64_t rows, int64_t n, Layout l) {
  KILN_TEST_RNG(rng);
  auto xi = input<DT, 2>(rng, Shape<2>{rows, n}, l);
  auto bi = input<DT, 1>(rng, Shape<1>{n});
  auto si = input<DT, 2>(rng, Shape<2>{rows, 1});
  auto x = on(d, xi.t);
  auto b = on(d, bi.t);
  auto s = on(d, si.t);
  CAPTURE(std::string("[") + std::to_string(rows) + ", " + std::to_string(n) + "] " + name(l) + " on " + d.str());
  Array want = ref::zip(ref::zip(xi.a, bi.a, [](double p, double q) { return p + q; }), si.a, [](double p, double q) { return p * q; });
  auto c0 = counters();
  Tensor<DT, 2> got = (x + b) * s;
  CHECK(counters().kernels_launched - c0.kernels_launched == 1);
  check_close(got, want, tol<DT>().scaled(2), "(x + b) * s");
}

// x * w + b, w and b [n] along the rows, x [rows, n] the first n columns of [rows, n + pad]:
// without padding x is contiguous over both dims (its chunks loaded at the flat index, before
// the row's division), with it only along each row.
template <class DT>
void check_weight_bias_pointwise(Device d, int64_t rows, int64_t n, int64_t pad) {
  KILN_TEST_RNG(rng);
  auto xi = input<DT, 2>(rng, Shape<2>{rows, n + pad});
  auto wi = input<DT, 1>(rng, Shape<1>{n});
  auto bi = input<DT, 1>(rng, Shape<1>{n});
  auto x = on(d, xi.t).slice(1, 0, n);
  auto w = on(d, wi.t);
  auto b = on(d, bi.t);
  CAPTURE(std::string("[") + std::to_string(rows) + ", " + std::to_string(n) + "] pad " + std::to_string(pad) + " on " + d.str());
  Array want = ref::zip(ref::zip(ref::slice(xi.a, 1, 0, n), wi.a, [](double p, double q) { return p * q; }), bi.a,
                        [](double p, double q) { return p + q; });
  auto c0 = counters();
  Tensor<DT, 2> got = x * w + b;
  CHECK(counters().kernels_launched - c0.kernels_launched == 1);
  check_close(got, want, tol<DT>().scaled(2), "x * w + b");
}

// ---- rows over several dims that a bias keeps apart: (x + b)^2, b [n] along the innermost dim ----
// x in one of these views of a base tensor: the base itself; its last two dims swapped (x
// walks its rows with a stride); columns 1 .. n of a base of n + 1 (the start off 16 bytes);
// columns 0 .. n of a base of n + 1 (the start aligned, the rows off 16 bytes); all but the
// last index of dim R - 2 (aligned, but dims R - 3 and R - 2 no longer merge into one).
enum class BiasView : uint8_t { contiguous, transposed, unaligned, padded, gapped };
inline const char* name(BiasView v) {
  static const char* n[] = {"contiguous", "transposed", "unaligned", "padded", "gapped"};
  return n[int(v)];
}
template <int R>
Shape<R> bias_base_shape(Shape<R> s, BiasView v) {
  if (v == BiasView::transposed) std::swap(s[R - 2], s[R - 1]);
  if (v == BiasView::unaligned || v == BiasView::padded) s[R - 1] += 1;
  if (v == BiasView::gapped) s[R - 2] += 1;
  return s;
}
template <class DT, int R>
Tensor<DT, R> bias_view(const Tensor<DT, R>& base, BiasView v) {
  int64_t w = base.sizes()[R - 1];
  if (v == BiasView::transposed) return base.transpose(R - 2, R - 1);
  if (v == BiasView::unaligned) return base.slice(R - 1, 1, w);
  if (v == BiasView::padded) return base.slice(R - 1, 0, w - 1);
  if (v == BiasView::gapped) return base.slice(R - 2, 0, base.sizes()[R - 2] - 1);
  return base;
}
inline Array bias_view(const Array& base, BiasView v) {
  int r = base.rank();
  int64_t w = base.shape.back();
  if (v == BiasView::transposed) return ref::transpose(base, r - 2, r - 1);
  if (v == BiasView::unaligned) return ref::slice(base, r - 1, 1, w);
  if (v == BiasView::padded) return ref::slice(base, r - 1, 0, w - 1);
  if (v == BiasView::gapped) return ref::slice(base, r - 2, 0, base.shape[size_t(r - 2)] - 1);
  return base;
}
// Dims F .. R - 1 (F = 0: all of them).
template <int R, int F>
std::array<int, R - F> trailing_axes() {
  std::array<int, R - F> a{};
  for (int i = 0; i < R - F; ++i) a[size_t(i)] = F + i;
  return a;
}
// The two rows kernels of x and b: the sum of e = (x + b) * (x + b) over dims F .. R - 1 (a
// one-pass reduction: split where the rows are few and long), and e / (mean(e) + 1) over
// them (a reduction pass and a pass storing a full-size output).
template <int F, class X, class B>
auto bias_rows_sum(const X& x, const B& b) {
  constexpr int R = kiln::rank_of<X>;
  return sum((x + b) * (x + b), trailing_axes<R, F>());
}
template <int F, class X, class B>
auto bias_rows_normalized(const X& x, const B& b) {
  constexpr int R = kiln::rank_of<X>;
  auto e = (x + b) * (x + b);
  return e / (kiln::mean(e, trailing_axes<R, F>(), keepdim) + 1.0f);
}
// Every shape and view of the checks below, with the chunk width V it gets on an H200
// (warp 32, 132 multiprocessors; 0: the scalar loop) in a dtype of V = `vec` per 16 bytes.
template <class F>
void for_each_bias_rows_case(int vec, F&& f) {
  using Zero = std::integral_constant<int, 0>;
  using One = std::integral_constant<int, 1>;
  f(Zero{}, Shape<2>{333, 4096 + 8}, BiasView::contiguous, vec);  // both dims, one long row: split
  f(Zero{}, Shape<2>{7, 8}, BiasView::contiguous, vec);           // one chunk per row: a lane group
  f(One{}, Shape<3>{3, 17, 4096 + 8}, BiasView::contiguous, vec); // trailing dims, odd outer size: split
  f(One{}, Shape<3>{101, 5, 8}, BiasView::contiguous, vec);       // short rows: lane groups
  f(One{}, Shape<3>{600, 3, 1024}, BiasView::contiguous, vec);    // many long rows: a block per row
  f(One{}, Shape<4>{3, 4, 5, 64}, BiasView::gapped, vec);         // three reduced dims (a chunk's offsets by division)
  f(One{}, Shape<3>{5, 7, 62}, BiasView::contiguous, 0);          // 62: no whole number of chunks
  f(Zero{}, Shape<2>{33, 64}, BiasView::transposed, 0);           // x strided along the innermost dim
  f(Zero{}, Shape<2>{9, 64}, BiasView::unaligned, 0);             // x's start off 16 bytes
  f(One{}, Shape<3>{4, 9, 64}, BiasView::padded, 0);              // x's rows off 16 bytes
}

// Against float64 on device d: both kernels of each case, one kernel each, the sum twice
// (bit for bit the same: split rows combine in a fixed order).
template <class DT>
void check_bias_rows(Device d) {
  for_each_bias_rows_case(int(16 / sizeof(typename DT::storage)), [&](auto first, auto shape, BiasView view, int) {
    constexpr int F = decltype(first)::value, R = int(std::tuple_size_v<decltype(shape)>);
    KILN_TEST_RNG(rng);
    auto in = input<DT, R>(rng, bias_base_shape<R>(shape, view));
    auto bi = input<DT, 1>(rng, Shape<1>{shape[R - 1]});
    Tensor<DT, R> x = bias_view(on(d, in.t), view);
    Tensor<DT, 1> b = on(d, bi.t);
    std::string what = std::string(dtype_name<DT>()) + " " + str(dims(shape)) + " " + name(view) + " over dims " +
                       std::to_string(F) + ".. on " + d.str();
    CAPTURE(what);
    Array e = ref::zip(bias_view(in.a, view), bi.a, [](double p, double q) { return (p + q) * (p + q); });
    std::vector<int> axes;
    for (int i = F; i < R; ++i) axes.push_back(i);
    Array s = ref::sum(e, axes), scale = ref::abs_sum(e, axes), m = ref::sum(e, axes, true);
    double per_row = double(e.numel()) / double(m.numel());
    Array z = ref::zip(e, m, [&](double p, double q) { return p / (q / per_row + 1); });
    auto c0 = counters();
    Tensor<DT, F> s1 = bias_rows_sum<F>(x, b);
    auto c1 = counters();
    Tensor<DT, R> z1 = bias_rows_normalized<F>(x, b);
    auto c2 = counters();
    Tensor<DT, F> s2 = bias_rows_sum<F>(x, b);
    CHECK(c1.kernels_launched - c0.kernels_launched == 1);
    CHECK(c2.kernels_launched - c1.kernels_launched == 1);
    check_close(s1, s, tol<DT>().scaled(2), "sum((x + b)^2) " + what, &scale);
    check_close(z1, z, tol<DT>().scaled(4), "(x + b)^2 / (mean + 1) " + what);
    CHECK(read(s2).v == read(s1).v);
  });
}

// The programs of each case on a device of `warp` lanes and 132 multiprocessors, their
// variants checked where the warp is 32: 16-byte chunks within rows (vec_rows) where
// expected, never kept in registers (a row is not one innermost dim), else the scalar loop.
// Gives the programs with chunks within rows.
template <class Backend, class DT>
std::vector<std::string> bias_rows_programs(int warp) {
  std::vector<std::string> out;
  for_each_bias_rows_case(int(16 / sizeof(typename DT::storage)), [&](auto first, auto shape, BiasView view, int vec) {
    constexpr int F = decltype(first)::value, R = int(std::tuple_size_v<decltype(shape)>);
    CAPTURE(std::string(dtype_name<DT>()) + " " + str(dims(shape)) + " " + name(view));
    Tensor<DT, R> x = bias_view(Tensor<DT, R>::empty(bias_base_shape<R>(shape, view), cpu()), view);
    auto b = Tensor<DT, 1>::empty(Shape<1>{shape[R - 1]}, cpu());
    for (bool normalized : {false, true}) {
      GpuProgram p = normalized ? gpu_program<Backend>(warp, 90, 132, bias_rows_normalized<F>(x, b))
                                : gpu_program<Backend>(warp, 90, 132, bias_rows_sum<F>(x, b));
      REQUIRE(p.vars.size() == 1);
      CHECK(p.kinds[0] == sched::KernelKind::rows);
      const codegen::GpuVariant& v = p.vars[0];
      CHECK(!v.cols);
      CHECK(v.persist == 0);
      if (warp == 32) {
        CHECK(v.vec == vec);
        CHECK(v.vec_rows == (vec > 0));
      }
      if (!v.vec_rows) continue;  // the scalar loop: compiled by the other cases
      // reduced over several dims: the rank and the outer dims constants of the program
      CHECK(v.rank - v.outer_rank > 1);
      CHECK(p.src.find("constexpr int nd = " + std::to_string(v.rank) + ", no = " + std::to_string(v.outer_rank) + ";") != std::string::npos);
      CHECK(p.src.find("dq = inner ? step / inner : 0") != std::string::npos);
      out.push_back(p.src);
    }
  });
  return out;
}

void check_strategies(Device d) {
  check_bias_pointwise<bf16>(d, 33, 64, Layout::contiguous);  // chunks of 8 within rows
  check_bias_pointwise<f32>(d, 7, 60, Layout::contiguous);    // chunks of 4
  check_bias_pointwise<f32>(d, 5, 62, Layout::contiguous);    // 62: scalar
  check_bias_pointwise<f32>(d, 6, 64, Layout::transposed);    // x strided: scalar
  check_weight_bias_pointwise<bf16>(d, 33, 64, 0);   // x whole: its chunks at the flat index
  check_weight_bias_pointwise<bf16>(d, 33, 64, 8);   // rows of 72: chunks within rows, x not whole
  check_weight_bias_pointwise<f32>(d, 7, 60, 0);
  check_weight_bias_pointwise<f32>(d, 1, 4, 0);      // one row of one chunk
  check_weight_bias_pointwise<f16>(d, 301, 1000, 0);

  // Split rows: few long rows, contiguous (16-byte steps), odd (scalar steps), transposed.
  check_row_reductions(d, 4, int64_t(1) << 20, Layout::contiguous);
  check_row_reductions(d, 3, 300007, Layout::contiguous);
  check_row_reductions(d, 2, 100003, Layout::transposed);
  // A block per row, many rows; several rows per warp; a warp per row.
  check_row_reductions(d, 300, 5000, Layout::contiguous);
  check_row_reductions(d, 1000, 3, Layout::contiguous);
  check_row_reductions(d, 333, 17, Layout::strided);
  check_row_reductions(d, 65, 100, Layout::contiguous);
  check_row_reductions(d, 9, 700, Layout::contiguous);
  // 40000: a block per row too long to keep (batches of 16-byte loads, a store pass).
  for (int64_t n : {7, 100, 1000, 8192, 12000, 40000}) check_softmax(d, 5, n);
  // Online sums (rows read from memory each pass: several rows per warp, a warp per row, a
  // block per row too long to keep) and rows in registers (8192).
  for (int64_t n : {1, 100, 700, 8192, 40000}) check_softmax_special(d, n);
  // Column rows: each form in each float dtype; f64 (2-wide chunks) and i32 (exact) in two.
  // NOTE: the other dtypes only on a GPU: on the CPU they test no column kernel, and their
  // plans' compiles would cost CI tens of seconds.
  check_column_forms<f32>(d);
  if (d.kind == DeviceKind::cpu) return;
  // NOTE: only on a GPU: on the CPU they test no 16-byte chunks within rows.
  check_bias_rows<f32>(d);
  check_bias_rows<bf16>(d);
  check_column_forms<bf16>(d);
  check_column_forms<f16>(d);
  check_columns<f64>(d, 600, 512);
  check_columns<f64>(d, 600, 777);
  check_columns<i32>(d, 2048, 256);
  check_columns<i32>(d, 600, 777, true);
}

// Plans of every strategy, with the variant each must get on a wave32 device.
template <class Backend>
std::vector<std::string> strategy_programs(int warp) {
  auto program = [&](const auto&... es) {
    GpuProgram p = gpu_program<Backend>(warp, 0, 132, es...);  // 132 multiprocessors, as an H200
    return std::pair{p.src, p.vars};
  };
  auto x = [](int64_t r, int64_t n) { return Tensor<f32, 2>::empty(Shape<2>{r, n}, cpu()); };
  std::vector<std::string> out;
  {  // a bias keeps two dims apart: 16-byte chunks within rows where every slot allows them
    auto xb = Tensor<bf16, 2>::empty(Shape<2>{33, 64}, cpu());
    auto b = Tensor<bf16, 1>::empty(Shape<1>{64}, cpu());
    auto s = Tensor<bf16, 2>::empty(Shape<2>{33, 1}, cpu());
    auto [src, v] = program((xb + b) * s, x(5, 62) + Tensor<f32, 1>::empty(Shape<1>{62}, cpu()),
                            Tensor<f32, 2>::empty(Shape<2>{64, 6}, cpu()).transpose(0, 1) + Tensor<f32, 1>::empty(Shape<1>{64}, cpu()));
    REQUIRE(v.size() == 3);
    CHECK(v[0].vec == 8);  // the narrowest contiguous slot: bf16
    CHECK(v[0].vec_rows);
    CHECK(v[1].vec == 0);  // 62 is no whole number of 4-chunks
    CHECK(v[2].vec == 0);  // x walks its rows with a stride
    CHECK(src.find("const int64_t r = i / inner, j = i - r * inner;") != std::string::npos);
    out.push_back(src);
  }
  {  // x * w + b: x and the output contiguous over both dims, w and b along the rows
    auto xb = Tensor<bf16, 2>::empty(Shape<2>{33, 64}, cpu());
    auto w = Tensor<bf16, 1>::empty(Shape<1>{64}, cpu()), b = Tensor<bf16, 1>::empty(Shape<1>{64}, cpu());
    auto padded = Tensor<bf16, 2>::empty(Shape<2>{33, 72}, cpu()).slice(1, 0, 64);
    auto [src, v] = program(xb * w + b, padded * w + b);
    REQUIRE(v.size() == 2);
    CHECK(v[0].vec_rows);
    CHECK(std::popcount(v[0].whole) == 2);  // x and the output
    CHECK(v[1].vec_rows);
    CHECK(std::popcount(v[1].whole) == 1);  // the output only: x's rows are 72 apart
    CHECK(v[0].rank == 2);  // the rank a constant: the offsets unrolled
    CHECK(src.find("constexpr int nd = 2, no = ") != std::string::npos);
    CHECK(v[0].resident == 2048);  // 32 registers a thread
    CHECK(src.find("KILN_LAUNCH_BOUNDS(256, 8)") != std::string::npos);
    // x's chunk loaded at the flat index before the division that finds the row
    size_t pre = src.find("kiln_load_vec<8>(L"), div = src.find("= i / inner");
    CHECK(pre != std::string::npos);
    CHECK(pre < div);
    CHECK(src.find(" + i);\n    const int64_t r = i / inner") != std::string::npos);
    // Other sizes, the same program: the rank is the expression's, not the sizes'.
    auto xb2 = Tensor<bf16, 2>::empty(Shape<2>{7, 1024}, cpu());
    auto w2 = Tensor<bf16, 1>::empty(Shape<1>{1024}, cpu()), b2 = Tensor<bf16, 1>::empty(Shape<1>{1024}, cpu());
    auto padded2 = Tensor<bf16, 2>::empty(Shape<2>{5, 1040}, cpu()).slice(1, 0, 1024);
    CHECK(program(xb2 * w2 + b2, padded2 * w2 + b2).first == src);
    out.push_back(src);
  }
  {  // random numbers drawn: the Philox streams need more than 32 registers
    auto xb = Tensor<f32, 2>::empty(Shape<2>{33, 64}, cpu());
    auto [src, v] = program(randn<f32>(Shape<2>{33, 64}, 3) * xb + Tensor<f32, 1>::empty(Shape<1>{64}, cpu()));
    REQUIRE(v.size() == 1);
    CHECK(v[0].vec_rows);
    CHECK(v[0].resident == 1024);
    CHECK(src.find("KILN_LAUNCH_BOUNDS(256, 4)") != std::string::npos);
    out.push_back(src);
  }
  {
    auto [src, v] = program(sum(x(4, int64_t(1) << 20), -1));  // few long rows: split
    CHECK(v[0].split);
    CHECK(src.find("atomicAdd(kiln_count") != std::string::npos);
    CHECK(src.find("j0 += 4 * step") != std::string::npos);  // batches of four 16-byte loads per thread
    out.push_back(src);
  }
  {
    auto t = Tensor<f32, 2>::empty(Shape<2>{100003, 2}, cpu()).transpose(0, 1);  // strided split rows
    auto [src, v] = program(amax(t, -1), kiln::mean(t, -1));
    CHECK(v[0].split);
    out.push_back(src);
  }
  {
    auto [src, v] = program(sum(x(1000, 3), -1), sum(x(64, 100), -1), amax(x(9, 700), -1));
    CHECK(v.size() == 3);
    for (const auto& k : v) CHECK(k.group > 0);
    CHECK(v[0].group == 1);       // 3 elements: a lane per row
    CHECK(v[1].group == 8);       // 25 16-byte chunks: 8 lanes, 4 rows per warp
    CHECK(v[2].group == warp);    // 700: a warp per row
    out.push_back(src);
  }
  {
    auto [src, v] = program(softmax(x(64, 8192), -1));  // a block per row, in registers
    CHECK(!v[0].split);
    // W2's rows: 512 threads of 4 16-byte chunks, 16 registers of row and 16 of exponentials
    // a thread, 1536 resident (3 blocks per SM; 256 threads of 8 chunks kept 4 blocks of 256)
    CHECK(v[0].threads == 512);
    CHECK(v[0].persist == 4);
    CHECK(!v[0].stream);
    CHECK(v[0].resident == 1536);
    CHECK(v[0].exact);  // 8192 = 512 threads x 4 floats x 4 chunks: no chunk checked against the row's end
    CHECK(src.find("if (j < inner)") == std::string::npos);
    CHECK(src.find("constexpr int gsize = 512;") != std::string::npos);
    CHECK(src.find("KILN_LAUNCH_BOUNDS(512, 3)") != std::string::npos);
    CHECK(src.find("* kiln_recip(r") != std::string::npos);  // by the row's sum: one reciprocal, a product per element
    // exp(x - max) computed once, in the sum's pass, and kept for the store pass
    size_t exps = 0;
    for (size_t p = src.find("= kiln_exp(v"); p != std::string::npos; p = src.find("= kiln_exp(v", p + 1)) ++exps;
    CHECK(exps == 1);
    CHECK(src.find("[k][u] = v") != std::string::npos);
    out.push_back(src);
  }
  {  // bf16 rows of 16384: at 512 threads 16 registers of row and 32 of exponentials, so 256 of 8 chunks stay
    auto [src, v] = program(softmax(Tensor<bf16, 2>::empty(Shape<2>{64, 16384}, cpu()), -1));
    CHECK(v[0].threads == 256);
    CHECK(v[0].persist == 8);
    CHECK(v[0].resident == 1024);
    CHECK(src.find("KILN_LAUNCH_BOUNDS(256, 4)") != std::string::npos);
    out.push_back(src);
  }
  {  // the block-size override keeps W2's rows at 256 threads of 8 chunks
    runtime::gpu_block_rows_threads() = 256;
    auto [src, v] = program(softmax(x(64, 8192), -1));
    runtime::gpu_block_rows_threads() = 0;
    CHECK(v[0].threads == 256);
    CHECK(v[0].persist == 8);
    CHECK(v[0].resident == 1024);
    out.push_back(src);
  }
  {
    auto xb = Tensor<bf16, 2>::empty(Shape<2>{64, 4096}, cpu());
    auto w = Tensor<bf16, 1>::empty(Shape<1>{4096}, cpu()), b = Tensor<bf16, 1>::empty(Shape<1>{4096}, cpu());
    auto [src, v] = program(layer_norm(xb, w, b, 1e-5));  // in registers, with weight and bias
    CHECK(v[0].persist > 0);
    CHECK(v[0].threads == 128);  // W3's rows: 512 16-byte chunks, four per thread
    CHECK(v[0].exact);
    CHECK(src.find("kiln_bf16_at(L") != std::string::npos);  // bf16 from 32-bit words: a shift or a mask each
    // x loaded once into registers (L2 evict_last), weight and bias only where the store pass reads them
    CHECK(occurrences(src, "kiln_load_vec_keep<") == 1);
    CHECK(occurrences(src, "kiln_load_vec<") == 2);
    CHECK(!v[0].stream);
    // the outputs kept as floats and converted to bf16 two at a time as they are stored
    CHECK(src.find("kiln_store_vec_from_f32<8, true, false>(q") != std::string::npos);
    CHECK(src.find("[u] = kiln_f32_to_bf16(") == std::string::npos);
    // exact: the unchecked loads of weight and bias all go out before the stores, so 1024
    // threads an SM (at 1280, 48 registers a thread, the kernel spilled)
    CHECK(v[0].resident == 1024);
    CHECK(src.find("KILN_LAUNCH_BOUNDS(128, 8)") != std::string::npos);
    CHECK(!v[0].preload);
    out.push_back(src);
  }
  for (int64_t n : {4096, 4000}) {  // preloaded: weight and bias loaded with the row, after it, before the first reduction
    CAPTURE(n);
    auto xb = Tensor<bf16, 2>::empty(Shape<2>{64, n}, cpu());
    auto w = Tensor<bf16, 1>::empty(Shape<1>{n}, cpu()), b = Tensor<bf16, 1>::empty(Shape<1>{n}, cpu());
    runtime::gpu_rows_preload() = 1;
    auto [src, v] = program(layer_norm(xb, w, b, 1e-5));
    runtime::gpu_rows_preload() = 0;
    REQUIRE(v[0].persist == 4);
    CHECK(v[0].preload);
    CHECK(v[0].exact == (n == 4096));
    CHECK(occurrences(src, "kiln_load_vec_keep<") == 3);
    CHECK(occurrences(src, "kiln_load_vec<") == 0);
    const size_t row = src.find("kiln_load_vec_keep<8>(L2[k], q2 + j)"), weight = src.find("kiln_load_vec_keep<8>(L1[k], q1 + j)"),
                 bias = src.find("kiln_load_vec_keep<8>(L0[k], q0 + j)"), reduce = src.find("kiln_block_reduce<");
    CHECK(row < bias);
    CHECK(bias < weight);
    CHECK(weight < reduce);
    CHECK(reduce != std::string::npos);
    out.push_back(src);
  }
  {  // a row short of the threads' chunks (4000 = 500 chunks over 128 threads x 4): each chunk checked
    auto xb = Tensor<bf16, 2>::empty(Shape<2>{64, 4000}, cpu());
    auto w = Tensor<bf16, 1>::empty(Shape<1>{4000}, cpu()), b = Tensor<bf16, 1>::empty(Shape<1>{4000}, cpu());
    auto [src, v] = program(layer_norm(xb, w, b, 1e-5));
    CHECK(v[0].persist == 4);
    CHECK(!v[0].exact);
    CHECK(src.find("if (j < inner)") != std::string::npos);
    // 16 registers of row a thread: 1280 threads an SM (10 blocks of 128)
    CHECK(v[0].resident == 1280);
    CHECK(src.find("KILN_LAUNCH_BOUNDS(128, 10)") != std::string::npos);
    out.push_back(src);
  }
  {  // exact rows off (the override): W3's rows checked per chunk, 1280 threads an SM
    auto xb = Tensor<bf16, 2>::empty(Shape<2>{64, 4096}, cpu());
    auto w = Tensor<bf16, 1>::empty(Shape<1>{4096}, cpu()), b = Tensor<bf16, 1>::empty(Shape<1>{4096}, cpu());
    runtime::gpu_rows_exact() = -1;
    auto [src, v] = program(layer_norm(xb, w, b, 1e-5));
    runtime::gpu_rows_exact() = 0;
    CHECK(!v[0].exact);
    CHECK(v[0].resident == 1280);
    out.push_back(src);
  }
  {  // the residency override: the launch bounds promise 1536 threads an SM
    auto xb = Tensor<bf16, 2>::empty(Shape<2>{64, 4096}, cpu());
    auto w = Tensor<bf16, 1>::empty(Shape<1>{4096}, cpu()), b = Tensor<bf16, 1>::empty(Shape<1>{4096}, cpu());
    runtime::gpu_block_rows_resident() = 1536;
    auto [src, v] = program(layer_norm(xb, w, b, 1e-5));
    runtime::gpu_block_rows_resident() = 0;
    CHECK(v[0].resident == 1536);
    CHECK(src.find("KILN_LAUNCH_BOUNDS(128, 12)") != std::string::npos);
    out.push_back(src);
  }
  for (int streaming : {0, -1, 1}) {  // streaming stores for rows read twice (kiln's choice), none, or everywhere
    CAPTURE(streaming);
    runtime::gpu_rows_streaming() = streaming;
    auto [src, v] = program(softmax(x(64, 8192), -1), softmax(x(5, 40000), -1));
    runtime::gpu_rows_streaming() = 0;
    REQUIRE(v.size() == 2);
    CHECK(v[0].persist > 0);
    CHECK(v[0].stream == (streaming > 0));
    CHECK(v[1].persist == 0);
    CHECK(v[1].stream == (streaming >= 0));
    CHECK((src.find("kiln_load_vec_stream<4>(L") != std::string::npos) == (streaming > 0));  // kernel 0's kept row
    CHECK((src.find("kiln_store_vec_stream<4>(q") != std::string::npos) == (streaming >= 0));
    // a kept row not loaded streaming is loaded L2 evict_last
    CHECK(v[0].keep == (streaming <= 0));
    CHECK(!v[1].keep);
    CHECK((src.find("kiln_load_vec_keep<4>(L0[k], q0 + j)") != std::string::npos) == (streaming <= 0));
    out.push_back(src);
  }
  {  // the keep override off: plain loads
    runtime::gpu_loads_keep() = -1;
    auto [src, v] = program(softmax(x(64, 8192), -1));
    runtime::gpu_loads_keep() = 0;
    CHECK(v[0].persist > 0);
    CHECK(!v[0].keep);
    CHECK(src.find("kiln_load_vec_keep<") == std::string::npos);
    out.push_back(src);
  }
  {
    auto [src, v] = program(softmax(x(4, int64_t(1) << 20), -1));  // two passes: never split
    CHECK(!v[0].split);
    CHECK(v[0].group == 0);
    CHECK(v[0].persist == 0);
    // one-pass online softmax: the max and the sum in one pass over the row, then the stores
    CHECK(src.find("= kiln_online_sum(a") != std::string::npos);
    CHECK(src.find("kiln_online_rescale(a") != std::string::npos);
    size_t passes = 0;
    for (size_t p = src.find("for (; j0 + 3 * step"); p != std::string::npos; p = src.find("for (; j0 + 3 * step", p + 1)) ++passes;
    CHECK(passes == 2);
    out.push_back(src);
  }
  {
    auto [src, v] = program(log_softmax(x(9, 700), -1), softmax(x(65, 100), -1));  // a warp per row; 8 lanes per row
    REQUIRE(v.size() == 2);
    CHECK(v[0].group == warp);
    size_t online = 0;
    for (size_t p = src.find("= kiln_online_sum(a"); p != std::string::npos; p = src.find("= kiln_online_sum(a", p + 1)) ++online;
    CHECK(online >= 2);
    out.push_back(src);
  }
  return out;
}

// Column-rows plans of every form, with the variant and grid each gets on a device of
// `warp` lanes and 132 multiprocessors (an H200), checked where the warp is 32.
template <class Backend>
std::vector<std::string> column_programs(int warp) {
  std::vector<std::string> out;
  auto program = [&](const auto&... es) {
    GpuProgram p = gpu_program<Backend>(warp, 90, 132, es...);
    out.push_back(p.src);
    return p;
  };
  auto f = [](int64_t r, int64_t n) { return Tensor<f32, 2>::empty(Shape<2>{r, n}, cpu()); };
  auto b = [](int64_t r, int64_t n) { return Tensor<bf16, 2>::empty(Shape<2>{r, n}, cpu()); };
  const bool w32 = warp == 32;
  // One kernel's form: 16-byte chunks of `vec`, `threads`, the grid (column blocks, parts).
  auto form = [&](const GpuProgram& p, size_t k, int vec, int threads, unsigned blocks, unsigned parts) {
    REQUIRE(p.vars.size() > k);
    const codegen::GpuVariant& v = p.vars[k];
    if (!w32) return;  // a wave64 device takes 512 columns and more (column_rows): not all of these
    CHECK(v.cols);
    CHECK(v.vec == vec);
    CHECK(v.threads == threads);
    CHECK(v.split == (parts > 1));
    CHECK(p.launches[k].grid.x == blocks);
    CHECK(p.launches[k].grid.y == parts);
  };
  // The bias gradients of W4 (bench/gpu_bench.cpp): 8 bf16 columns a lane, split so that the
  // column blocks times the parts about fill 132 multiprocessors at 1024 threads each.
  form(program(sum(b(8192, 4096), 0)), 0, 8, 256, 16, 33);
  form(program(sum(b(8192, 16384), 0)), 0, 8, 256, 64, 8);
  {
    auto x = f(600, 512);
    GpuProgram p = program(sum(x, 0), amax(x, 0));  // one kernel, two reductions
    REQUIRE(p.vars.size() == 1);
    form(p, 0, 4, 256, 4, 4);
    CHECK(p.src.find("kiln_cols_reduce<4, kiln_groups>") != std::string::npos);
    CHECK(p.src.find("kiln_load_vec<4>") != std::string::npos);
    CHECK(p.src.find("atomicAdd(kiln_count + blockIdx.x") != std::string::npos);
  }
  form(program(sum(f(2048, 256), 0)), 0, 4, 256, 2, 16);
  form(program(sum(b(2048, 256), 0)), 0, 8, 256, 1, 16);
  form(program(sum(f(40, 8192), 0)), 0, 4, 128, 64, 1);  // many columns, few rows: 4 row groups, not split
  {
    GpuProgram p = program(sum(f(600, 777), 0));           // odd width: a column per lane, split
    form(p, 0, 0, 256, 25, 4);
    CHECK(p.src.find("kiln_load_vec<") == std::string::npos);
  }
  form(program(sum(f(600, 513).slice(1, 1, 513), 0)), 0, 0, 256, 16, 4);  // unaligned view
  form(program(sum(f(3, 1025), 0)), 0, 0, 32, 33, 1);                     // three rows: one row group
  form(program(sum(f(2, 4096), 0)), 0, 4, 32, 32, 1);                     // two rows, 16-byte chunks
  {
    auto x3 = Tensor<f32, 3>::empty(Shape<3>{7, 300, 64}, cpu());  // two kept dims [7, 64]
    form(program(sum(x3, 1)), 0, 4, 256, 4, 2);
    form(program(sum(Tensor<f32, 3>::empty(Shape<3>{5, 301, 66}, cpu()), 1)), 0, 0, 256, 11, 2);
  }
  {
    auto x = f(600, 512);
    auto w = Tensor<f32, 1>::empty(Shape<1>{512}, cpu());
    auto c = Tensor<f32, 2>::empty(Shape<2>{600, 1}, cpu());
    GpuProgram pw = program(sum(x * w, 0));  // w broadcast along the rows: 16-byte chunks, two loads of 2 rows a batch
    form(pw, 0, 4, 256, 4, 4);
    CHECK(pw.src.find("for (int k = 0; k < 2; ++k) kiln_load_vec<4>") != std::string::npos);
    form(program(sum(x * c, 0)), 0, 0, 256, 16, 4);  // c broadcast along the columns: a column per lane
  }
  // 8-byte accumulators: f64 in 2-wide chunks; bool loads in 16-wide ones summed in i64,
  // so 64 threads keep the combine's shared buffer at 8 KB.
  form(program(sum(Tensor<f64, 2>::empty(Shape<2>{600, 512}, cpu()), 0)), 0, 2, 256, 8, 4);
  form(program(sum(cast<i64>(Tensor<boolean, 2>::empty(Shape<2>{600, 512}, cpu())), 0)), 0, 16, 64, 1, 18);
  return out;
}

}  // namespace

TEST_CASE("column rows: the form each shape, dtype and view gets (host side, no GPU)") {
  column_programs<runtime::CudaBackend>(32);
}

TEST_CASE("rows over several dims a bias keeps apart: 16-byte chunks within rows where every slot allows (host side, no GPU)") {
  bias_rows_programs<runtime::CudaBackend, bf16>(32);
  bias_rows_programs<runtime::CudaBackend, f32>(32);
  // The W4 loss (bench/w4.hpp): mean((y + b)^2) in f32 of bf16 y [8192, 4096], b [4096]; its
  // rows kernel (then the scale by 1 / n, a pointwise kernel of one element).
  auto y = Tensor<bf16, 2>::empty(Shape<2>{8192, 4096}, cpu());
  auto b = Tensor<bf16, 1>::empty(Shape<1>{4096}, cpu());
  auto e = cast<f32>(y + b);
  GpuProgram p = gpu_program<runtime::CudaBackend>(32, 90, 132, kiln::mean(e * e));
  REQUIRE(!p.vars.empty());
  CHECK(p.kinds[0] == sched::KernelKind::rows);
  CHECK(p.vars[0].split);
  CHECK(p.vars[0].vec == 8);
  CHECK(p.vars[0].vec_rows);
  CHECK(p.vars[0].rank == 2);  // both dims reduced, none kept: constants of the program
  CHECK(p.vars[0].outer_rank == 0);
  CHECK(p.src.find("constexpr int nd = 2, no = 0;") != std::string::npos);
}

TEST_CASE("rows strategies: split rows, rows per lane group, per warp, per block, against float64") {
  check_strategies(default_device());
}

TEST_SUITE("nvrtc") {

TEST_CASE("rows strategies and column rows: each shape's variant, and the programs compile for sm_80 and sm_90") {
  if (!jit::nvrtc_available()) {
    MESSAGE("NVRTC not found: skipped");
    return;
  }
  std::vector<std::string> programs = strategy_programs<runtime::CudaBackend>(32), columns = column_programs<runtime::CudaBackend>(32),
                           bias = bias_rows_programs<runtime::CudaBackend, bf16>(32);
  programs.insert(programs.end(), columns.begin(), columns.end());
  programs.insert(programs.end(), bias.begin(), bias.end());
  for (const std::string& src : programs) {
    for (int cc : {80, 90}) CHECK(jit::cubin_sm(jit::nvrtc_compile(src, "kiln_plan", cc / 10, cc % 10)) == cc);
  }
}

}  // TEST_SUITE("nvrtc")

TEST_SUITE("hiprtc") {

TEST_CASE("rows strategies: the programs compile for gfx90a (wave64) and gfx1030 (wave32)") {
  if (!jit::hiprtc_available()) {
    MESSAGE("hipRTC not found: skipped");
    return;
  }
  for (std::string arch : {"gfx90a", "gfx1030"}) {
    CAPTURE(arch);
    REQUIRE(jit::hiprtc_target_supported(arch));
    int warp = runtime::hip_target_warp_size(arch);
    std::vector<std::string> programs = strategy_programs<runtime::HipBackend>(warp), columns = column_programs<runtime::HipBackend>(warp),
                             bias = bias_rows_programs<runtime::HipBackend, bf16>(warp);
    programs.insert(programs.end(), columns.begin(), columns.end());
    programs.insert(programs.end(), bias.begin(), bias.end());
    for (const std::string& src : programs) CHECK(jit::detail::is_amdgpu_code_object(jit::hiprtc_compile(src, "kiln_plan", arch, {})));
  }
}

}  // TEST_SUITE("hiprtc")

TEST_SUITE("gpu") {

TEST_CASE("rows strategies on kiln::cuda(0) against float64") {
  if (!runtime::CudaDeviceApi::present()) {
    MESSAGE("no CUDA GPU: skipped");
    return;
  }
  check_strategies(kiln::cuda(0));
}

TEST_CASE("a weight and bias along rows past 2^31 elements on kiln::cuda(0): indices past int32") {
  if (!runtime::CudaDeviceApi::present()) {
    MESSAGE("no CUDA GPU: skipped");
    return;
  }
  // bf16 [2^19 + 513, 4096]: 2^31 + 2101248 elements (4.3 GB each way), so that an index
  // held in 32 signed bits anywhere would wrap.
  const int64_t C = 4096, R = (int64_t(1) << 31) / C + 513;
  const Device d = kiln::cuda(0);
  KILN_TEST_RNG(rng);
  auto wi = input<bf16, 1>(rng, Shape<1>{C});
  auto bi = input<bf16, 1>(rng, Shape<1>{C});
  Tensor<bf16, 1> w = on(d, wi.t), b = on(d, bi.t);
  if (default_device() != d) {
    MESSAGE("the default device is not cuda:0 (x is drawn there): skipped");
    return;
  }
  Tensor<bf16, 2> x = cast<bf16>(randn<f32>(Shape<2>{R, C}, 31));
  auto c0 = counters();
  Tensor<bf16, 2> y = x * w + b;
  CHECK(counters().kernels_launched - c0.kernels_launched == 1);
  const std::vector<double> wv = w.to_vector(), bv = b.to_vector();
  for (int64_t r0 : {int64_t(0), int64_t(1) << 19, R - 8}) {  // the first rows, those around 2^31, the last
    CAPTURE(r0);
    const std::vector<double> xs = x.slice(0, r0, r0 + 8).to_vector(), got = y.slice(0, r0, r0 + 8).to_vector();
    double worst = 0;
    for (size_t e = 0; e < got.size(); ++e) {
      const size_t c = e % size_t(C);
      const double want = xs[e] * wv[c] + bv[c];
      worst = std::max(worst, std::fabs(got[e] - want) / (std::fabs(xs[e] * wv[c]) + std::fabs(bv[c]) + 1e-6));
    }
    CHECK(worst <= 1.0 / 128);  // bf16's rounding of the output
  }
}

TEST_CASE("block rows under the residency, streaming, exact, keep and preload overrides on kiln::cuda(0) against float64") {
  if (!runtime::CudaDeviceApi::present()) {
    MESSAGE("no CUDA GPU: skipped");
    return;
  }
  for (int resident : {1280, 2048}) check_block_rows_resident(kiln::cuda(0), resident);
  // streaming accesses off, and on wherever the variant allows (rows read more than once too)
  for (int streaming : {-1, 1}) {
    CAPTURE(streaming);
    runtime::gpu_rows_streaming() = streaming;
    check_block_rows_resident(kiln::cuda(0), 0);
    check_softmax(kiln::cuda(0), 5, 40000);
    runtime::gpu_rows_streaming() = 0;
  }
  // exact rows off: the rows of 8192 and 4096 checked per chunk
  runtime::gpu_rows_exact() = -1;
  check_block_rows_resident(kiln::cuda(0), 0);
  runtime::gpu_rows_exact() = 0;
  // kept rows' loads with the L2 policy off (kiln's choice, on, runs in every test above)
  runtime::gpu_loads_keep() = -1;
  check_block_rows_resident(kiln::cuda(0), 0);
  runtime::gpu_loads_keep() = 0;
  // the slots only the stores read (layer_norm's weight and bias) loaded with the row
  runtime::gpu_rows_preload() = 1;
  check_block_rows_resident(kiln::cuda(0), 0);
  runtime::gpu_rows_preload() = 0;
}

}  // TEST_SUITE("gpu")
