// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Every pointwise row of the primitive table (unary, binary, ternary, cast) and every
// leaf (input, scalar, rand, iota) against the float64 reference, in each dtype the row
// accepts: odd sizes, size 1, empty, broadcasting, host scalars, non-contiguous inputs,
// special values (NaN, infinities, signed zeros).
//
// The rows are iterated from kPrims at compile time: apply_unary / apply_binary map a
// row to kiln's public function for it and refuse to compile for a row they do not
// know, so a new primitive cannot be left untested. All the rows of one dtype and
// one shape pattern are evaluated as one plan with one output each (kiln::eval of
// many expressions): one JIT compile covers them all.
#include "../support/reference.hpp"
#include "../support/rows.hpp"

using namespace kiln;
using namespace kiln::test;

namespace {

// Whether row P takes operands of dtype DT (what the expression layer accepts).
template <Prim P, class DT>
constexpr bool accepts() {
  constexpr PrimInfo r = prim_info(P);
  if (r.float_only && !FloatDType<DT>) return false;
  if (P == Prim::logical_not) return std::is_same_v<DT, boolean>;
  if (std::is_same_v<DT, boolean>)
    return r.kind == PrimKind::ternary || P == Prim::eq || P == Prim::ne || P == Prim::max || P == Prim::min ||
           P == Prim::expand;
  return true;
}

// Operand roles: which input a row reads, so each row sees its own domain.
enum class Role { x, y, pos, nonzero };
constexpr Role role_unary(Prim p) {
  switch (p) {
    case Prim::log: case Prim::log2: case Prim::sqrt: case Prim::rsqrt: return Role::pos;
    case Prim::recip: return Role::nonzero;
    default: return Role::x;
  }
}
constexpr std::pair<Role, Role> role_binary(Prim p) {
  if (p == Prim::div) return {Role::x, Role::nonzero};
  if (p == Prim::pow) return {Role::pos, Role::y};
  return {Role::x, Role::y};
}
template <class DT>
Values values_for(Role r) {
  bool f = FloatDType<DT>;
  switch (r) {
    case Role::x: return {f ? -3.0 : -50.0, f ? 3.0 : 50.0, 0.25};
    case Role::y: return {f ? -3.0 : -50.0, f ? 3.0 : 50.0, 0.25};
    case Role::pos: return {0.05, 6.0};
    case Role::nonzero: return {f ? 0.25 : 1.0, f ? 4.0 : 9.0, 0, true};
  }
  return {};
}

// Four inputs of one dtype, one per role; shapes and layouts per role.
template <class DT, int R>
struct Operands {
  Input<DT, R> x, y, pos, nonzero;
  const Input<DT, R>& operator[](Role r) const { return r == Role::x ? x : r == Role::y ? y : r == Role::pos ? pos : nonzero; }
};
template <class DT, int R>
Operands<DT, R> operands(Rng& rng, Shape<R> sx, Shape<R> sy, std::array<Layout, 4> l = {}) {
  auto mk = [&](Role r, Shape<R> s, Layout lay) { return input<DT, R>(rng, s, lay, values_for<DT>(r)); };
  return {mk(Role::x, sx, l[0]), mk(Role::y, sy, l[1]), mk(Role::pos, sx, l[2]), mk(Role::nonzero, sy, l[3])};
}

template <class DT, int R>
void add_unary(Batch& batch, const Operands<DT, R>& in, const std::string& label) {
  for_each_row([&](auto row) {
    constexpr Prim P = decltype(row)::value;
    if constexpr (prim_info(P).kind == PrimKind::unary && accepts<P, DT>()) {
      const auto& a = in[role_unary(P)];
      auto e = apply_unary<P>(a.t);
      batch.check(e, ref::as(dtype_of<decltype(e)>::id, ref::prim(P, a.a)), std::string(prim_info(P).name) + " " + label);
    }
  });
}

// Every binary and ternary row on operands picked by role: pick_a(role) / pick_b(role)
// give kiln operands (tensors or host scalars), ref_a / ref_b their Arrays.
template <class DT, class A, class B, class AR, class BR>
void add_binary_of(Batch& batch, const A& pick_a, const B& pick_b, const AR& ref_a, const BR& ref_b,
                   const std::string& label) {
  for_each_row([&](auto row) {
    constexpr Prim P = decltype(row)::value;
    std::string what = std::string(prim_info(P).name) + " " + label;
    if constexpr (prim_info(P).kind == PrimKind::binary && accepts<P, DT>()) {
      auto [ra, rb] = role_binary(P);
      auto e = apply_binary<P>(pick_a(ra), pick_b(rb));
      batch.check(e, ref::as(dtype_of<decltype(e)>::id, ref::prim(P, ref_a(ra), ref_b(rb))), what);
    } else if constexpr (prim_info(P).kind == PrimKind::ternary && accepts<P, DT>()) {
      auto c = kiln::ne(pick_a(Role::x), pick_b(Role::y));
      auto e = apply_ternary<P>(c, pick_a(Role::x), pick_b(Role::y));
      Array rc = ref::prim(Prim::ne, ref_a(Role::x), ref_b(Role::y));
      batch.check(e, ref::as(DT::id, ref::prim(P, rc, ref_a(Role::x), ref_b(Role::y))), what);
    }
  });
}
// Tensor ⊕ tensor for every binary and ternary row.
template <class DT, int RA, int RB>
void add_binary(Batch& batch, const Operands<DT, RA>& a, const Operands<DT, RB>& b, const std::string& label) {
  add_binary_of<DT>(batch, [&](Role r) { return a[r].t; }, [&](Role r) { return b[r].t; },
                    [&](Role r) { return a[r].a; }, [&](Role r) { return b[r].a; }, label);
}
// Tensor ⊕ host scalar and host scalar ⊕ tensor (the scalar takes the tensor's dtype).
template <bool Left, class DT, int R>
void add_scalar(Batch& batch, const Operands<DT, R>& in, double s, const std::string& label) {
  bool f = FloatDType<DT>;
  double pos = f ? 1.5 : 3, nz = f ? -2.5 : -3;  // exact in every dtype
  auto sval = [&](Role r) { return r == Role::pos ? pos : r == Role::nonzero ? nz : s; };
  auto sref = [&](Role r) { return ref::scalar(round_to(DT::id, sval(r))); };  // the scalar in the tensor's dtype
  add_binary_of<DT>(batch, [&](Role r) { return in[r].t; }, [&](Role r) { return sval(r); },
                    [&](Role r) { return in[r].a; }, sref, label + ", scalar right");
  if constexpr (Left)
    add_binary_of<DT>(batch, [&](Role r) { return sval(r); }, [&](Role r) { return in[r].t; },
                      sref, [&](Role r) { return in[r].a; }, label + ", scalar left");
}

// The dtypes of the table, each one test run.
#define KILN_TEST_NUMERIC_DTYPES f32, f64, f16, bf16, i32, i64

// Every unary, binary and ternary row of one dtype in every shape pattern, as one batch:
// contiguous; non-contiguous (transposed, strided, expanded along either dim); [M, 1]
// with [1, N]; host scalars; and, for f32 and i32, rank broadcasting [N] with [M, N].
// One plan: sizes are run-time values, so any `s` without a size-1 dim reuses it.
// NOTE: each group reads operands of its own, so that it is a kernel of its own: one
// kernel of all ~150 outputs compiles several times slower than ten kernels of 15. And
// every kernel costs a JIT compile of about a second: a row's math does not depend on
// the layout or the broadcast pattern of its operands (loads and stores do, and the
// binary rows cover them), so the patterns beyond the first are spread over the dtypes
// whose code differs rather than repeated in each.
template <class DT>
void add_patterns(Batch& b, Rng& rng, Shape<2> s) {
  std::string sz = " " + str(dims(s));
  auto fresh = [&](std::array<Layout, 4> l = {}) { return operands<DT, 2>(rng, s, s, l); };
  const std::array<Layout, 4> l1{Layout::transposed, Layout::contiguous, Layout::strided, Layout::expanded_inner};
  const std::array<Layout, 4> l2{Layout::expanded_outer, Layout::strided, Layout::transposed, Layout::strided};
  add_unary(b, fresh(), "contiguous" + sz);
  add_binary(b, fresh(), fresh(), "contiguous" + sz);
  add_binary(b, fresh(l1), fresh(l2), "non-contiguous" + sz);
  // f16 and bf16 differ from f32 only in loads and stores, covered above.
  if constexpr (!std::is_same_v<DT, f16> && !std::is_same_v<DT, bf16>) {
    add_unary(b, fresh(l1), "transposed / strided / expanded inner" + sz);
    add_binary(b, operands<DT, 2>(rng, {s[0], 1}, {s[0], 1}), operands<DT, 2>(rng, {1, s[1]}, {1, s[1]}),
               "[M, 1] with [1, N]" + sz);
    // 1.25 is exact in every float dtype; 2.5 becomes 2 in an integer one, as a C++ cast
    constexpr bool left = std::is_same_v<DT, f32> || std::is_same_v<DT, i64>;  // one float, one integer dtype
    add_scalar<left>(b, fresh(), FloatDType<DT> ? 1.25 : 2.5, "host scalar" + sz);
  }
  if constexpr (std::is_same_v<DT, f64> || std::is_same_v<DT, i32>) {
    add_binary(b, operands<DT, 2>(rng, {1, s[1]}, {1, s[1]}), operands<DT, 2>(rng, {s[0], 1}, {s[0], 1}),
               "[1, N] with [M, 1]" + sz);
  }
  if constexpr (std::is_same_v<DT, f32> || std::is_same_v<DT, i32>) {
    add_binary(b, operands<DT, 1>(rng, {s[1]}, {s[1]}), fresh(l2), "[N] with [M, N]" + sz);
  }
}

}  // namespace

TEST_CASE_TEMPLATE("pointwise rows: every shape pattern, odd, large and empty sizes", DT, KILN_TEST_NUMERIC_DTYPES) {
  KILN_TEST_RNG(rng);
  // One compile: [3, 8200] spans more than one chunk (8192) of a CPU kernel's row.
  for (Shape<2> s : {Shape<2>{37, 129}, Shape<2>{3, 8200}, Shape<2>{0, 129}, Shape<2>{6, 0}}) {
    Batch b;
    add_patterns<DT>(b, rng, s);
    b.run();
  }
}

TEST_CASE_TEMPLATE("pointwise rows: size-1 dims", DT, KILN_TEST_NUMERIC_DTYPES) {
  KILN_TEST_RNG(rng);
  // Size-1 dims are part of the signature (they broadcast): their own plan.
  Batch b;
  auto one = operands<DT, 2>(rng, {1, 1}, {1, 1}), row = operands<DT, 2>(rng, {1, 57}, {1, 57});
  add_binary(b, row, one, "[1, 57] with [1, 1]");
  if constexpr (!std::is_same_v<DT, f16> && !std::is_same_v<DT, bf16>) {  // as in add_patterns
    add_unary(b, one, "[1, 1]");
    add_binary(b, one, one, "[1, 1] with [1, 1]");
  }
  b.run();
}

TEST_CASE_TEMPLATE("pointwise rows in eager mode", DT, f32, i64) {
  KILN_TEST_RNG(rng);
  Batch b;
  auto x = operands<DT, 2>(rng, {37, 129}, {37, 129}), y = operands<DT, 2>(rng, {37, 1}, {37, 1});
  add_unary(b, x, "[37, 129]");
  add_binary(b, x, y, "[37, 129] with [37, 1]");
  b.run(Mode::eager);
}

TEST_CASE("boolean rows: logical_not, eq, ne, maximum, minimum, where") {
  KILN_TEST_RNG(rng);
  Batch bt;
  for (Layout l : {Layout::contiguous, Layout::transposed}) {
    auto a = input<boolean, 2>(rng, {37, 129}, l), b = input<boolean, 2>(rng, {37, 129});
    auto u = input<f32, 2>(rng, {37, 129}), v = input<f32, 2>(rng, {1, 129});
    std::string lay = std::string(" ") + name(l);
    bt.check(!a.t, ref::prim(Prim::logical_not, a.a), "logical_not" + lay);
    bt.check(kiln::eq(a.t, b.t), ref::prim(Prim::eq, a.a, b.a), "eq" + lay);
    bt.check(kiln::ne(a.t, b.t), ref::prim(Prim::ne, a.a, b.a), "ne" + lay);
    bt.check(kiln::maximum(a.t, b.t), ref::prim(Prim::max, a.a, b.a), "maximum" + lay);
    bt.check(kiln::minimum(a.t, b.t), ref::prim(Prim::min, a.a, b.a), "minimum" + lay);
    bt.check(kiln::where(a.t, u.t, v.t), ref::prim(Prim::where, a.a, u.a, v.a), "where" + lay);
  }
  bt.run();
}

TEST_CASE("rank 0: scalars in and out") {
  KILN_TEST_RNG(rng);
  auto a = input<f32, 0>(rng, {}), b = input<f32, 0>(rng, {});
  auto m = input<f32, 2>(rng, {5, 7});
  Batch bt;
  bt.check(a.t + b.t, ref::zip(a.a, b.a, [](double x, double y) { return x + y; }), "add rank 0");
  bt.check(kiln::exp(a.t) * 2, ref::map(a.a, [](double x) { return 2 * std::exp(x); }), "exp(x) * 2 rank 0");
  // a rank-0 tensor broadcasts like a scalar
  bt.check(m.t * a.t, ref::zip(m.a, a.a, [](double x, double z) { return x * z; }), "[5, 7] * rank 0");
  bt.run();
}

// Special values: every float row on NaN, infinities, signed zeros, tiny values and
// overflow/underflow edges (unary), and on every pair of them (binary: an outer product
// through broadcasting).
// NOTE: magnitudes stay below 1e5 for the unary rows: kiln's sin/cos do no Payne-Hanek
// reduction and are documented (codegen/device/cpu_math.hpp) as meaningless beyond that.
TEST_CASE_TEMPLATE("special values: NaN, infinities, signed zeros", DT, f32, f64) {
  const std::vector<double> specials = {NAN, INFINITY, -INFINITY, 0.0, -0.0, 1.0,   -1.0,  0.5,   -0.5, 2.0,   -2.0,
                                        3.0, -3.0,     2.5,       1e-30, -1e-30, 100., -100., 1e-5, 0.1, 88.5,
                                        -104., 710.0,  -745.0,    1e4, -1e4};
  std::vector<double> pairs = specials;
  pairs.insert(pairs.end(), {1e30, -1e30, 3e38, 1e300});
  auto operands_of = [](const std::vector<double>& vals, bool column) {
    Dims s = column ? Dims{int64_t(vals.size()), 1} : Dims{1, int64_t(vals.size())};
    Array a(s);
    for (size_t i = 0; i < vals.size(); ++i) a.v[i] = round_to(DT::id, vals[i]);
    auto t = make_tensor<DT, 2>(a);
    return Operands<DT, 2>{{t, a}, {t, a}, {t, a}, {t, a}};
  };
  Batch b;
  add_unary(b, operands_of(specials, true), "special values");
  add_binary(b, operands_of(pairs, true), operands_of(pairs, false), "special values, every pair");
  // where: a branch's NaN and infinities stay out where the other is chosen (the C++ dialect
  // selects by bit masks, with both branches computed), fused and eager.
  const int64_t rows = int64_t(specials.size()), cols = int64_t(pairs.size());
  Array c(Dims{rows, cols}), want(Dims{rows, cols});
  auto x = operands_of(specials, true), y = operands_of(pairs, false);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const bool pick = (i * 7 + j * 3) % 5 < 2;
      c.v[size_t(i * cols + j)] = pick;
      want.v[size_t(i * cols + j)] = pick ? x.x.a.v[size_t(i)] : y.x.a.v[size_t(j)];
    }
  auto ct = make_tensor<boolean, 2>(c);
  b.check(where(ct, x.x.t, y.x.t), want, "where over special values in both branches");
  b.run();
  b.run(Mode::eager);
}

// ---- cast: every dtype to every dtype ----
namespace {
// Casts of one source to every dtype. A conversion is one rounding of the exact source
// value (f64 → 16-bit goes through f32: within tolerance); float → int truncates.
template <class From>
void add_casts(Batch& b, Rng& rng) {
  // In range for every target (f16 overflows past 65504: that edge is its own case below).
  Values v = FloatDType<From> ? Values{-1000, 1000, 0.2} : Values{-60000, 60000, 0.2};
  auto in = input<From, 2>(rng, {37, 129}, Layout::transposed, v);
  std::string from = "cast " + dtype_name<From>() + " -> ";
  auto one = [&]<class To>(To) { b.check(cast<To>(in.t), ref::as(To::id, in.a), from + dtype_name<To>()); };
  one(f32{}), one(f64{}), one(f16{}), one(bf16{}), one(i32{}), one(i64{}), one(boolean{});
}
}  // namespace

TEST_CASE("cast rows: every dtype to every dtype") {
  KILN_TEST_RNG(rng);
  Batch b;  // one plan for all 49
  add_casts<f32>(b, rng), add_casts<f64>(b, rng), add_casts<f16>(b, rng), add_casts<bf16>(b, rng);
  add_casts<i32>(b, rng), add_casts<i64>(b, rng), add_casts<boolean>(b, rng);
  b.run();
}

TEST_CASE("cast edges: f16 overflow, float to int truncation, NaN and infinities") {
  Array a(Dims{1, 12});
  a.v = {65504, 65519.99, 65520, -70000, 1e-8, 6e-8, -2.7, 2.7, -0.5, 1e-45, INFINITY, -INFINITY};
  a = ref::as(DType::f32, a);
  auto t = make_tensor<f32, 2>(a);
  Array n(Dims{1, 3}, NAN);
  auto tn = make_tensor<f32, 2>(n);
  Array f(Dims{1, 6});
  f.v = {-2.75, 2.75, -0.5, 0.5, 1e9, -1e9};
  auto tf = make_tensor<f64, 2>(f);
  Batch b;
  b.check(cast<f16>(t), ref::as(DType::f16, a), tol<f16>().scaled(0), "cast f32 -> f16 edges (exact)");
  b.check(cast<bf16>(t), ref::as(DType::bf16, a), tol<bf16>().scaled(0), "cast f32 -> bf16 edges (exact)");
  b.check(cast<f16>(tn), n, "cast f32 NaN -> f16");
  b.check(cast<bf16>(tn), n, "cast f32 NaN -> bf16");
  b.check(cast<i32>(tf), ref::as(DType::i32, f), "cast f64 -> i32 truncates toward zero");
  b.run();
}

// ---- leaves ----
TEST_CASE("leaf rows: input (a tensor evaluated as is), scalar, iota") {
  KILN_TEST_RNG(rng);
  auto x = input<f16, 3>(rng, {4, 5, 33}, Layout::transposed);
  Tensor<f16, 3> copy = kiln::eval(x.t);  // an output that is a leaf: a copy, not an alias
  CHECK(copy.is_contiguous());
  CHECK(copy.storage() != x.t.storage());
  check_close(copy, x.a, tol<f16>().scaled(0), "input leaf copied");
  auto z = input<i64, 2>(rng, {6, 7});
  Batch b;
  b.check(z.t * 0 + 7, Array(Dims{6, 7}, 7), "scalar leaf");
  const std::array<int64_t, 3> s{4, 1, 150};
  auto iotas = [&]<class DT>(DT) {
    std::string n = " (" + dtype_name<DT>() + ")";
    b.check(iota<DT>(s, 0), ref::as(DT::id, ref::iota({4, 1, 150}, 0)), "iota dim 0" + n);
    b.check(iota<DT>(s, 2), ref::as(DT::id, ref::iota({4, 1, 150}, 2)), "iota dim 2" + n);
    b.check(iota<DT>(s, -2), ref::as(DT::id, ref::iota({4, 1, 150}, 1)), "iota dim -2" + n);
  };
  iotas(i32{}), iotas(i64{}), iotas(f32{}), iotas(bf16{});
  b.run();
}

TEST_CASE("Philox4x32-10 reference matches the published known-answer vectors") {
  // Random123 kat_vectors: philox4x32_10.
  CHECK(ref::philox4x32_10({0, 0, 0, 0}, {0, 0}) == std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(ref::philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
        std::array<uint32_t, 4>{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(ref::philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE_TEMPLATE("leaf rows: rand is Philox at (seed, offset + index)", DT, f32, f64, bf16) {
  KILN_TEST_RNG(rng);
  uint64_t seed = rng.gen(), offset = rng.gen() >> 1;
  for (Shape<2> s : {Shape<2>{37, 129}, Shape<2>{3, 9001}}) {
    Tensor<DT, 2> r = rand<DT>(s, seed, offset);
    Array want = ref::as(DT::id, ref::rand(dims(s), seed, offset));
    check_close(r, want, std::string("rand ") + str(dims(s)));
    Array got = read(r);
    double lo = *std::min_element(got.v.begin(), got.v.end()), hi = *std::max_element(got.v.begin(), got.v.end());
    double mean = std::accumulate(got.v.begin(), got.v.end(), 0.0) / double(got.numel());
    CHECK(lo >= 0);
    CHECK(hi <= 1);  // [0, 1) before rounding to a 16-bit float, which may reach 1
    CHECK(std::fabs(mean - 0.5) < 0.02);
  }
  // The same (seed, offset) gives the same numbers; another offset gives others.
  Tensor<DT, 2> a = rand<DT>(Shape<2>{8, 8}, seed, offset), b = rand<DT>(Shape<2>{8, 8}, seed, offset),
                c = rand<DT>(Shape<2>{8, 8}, seed, offset + 64);
  CHECK(read(a).v == read(b).v);
  CHECK(read(a).v != read(c).v);
}

// Every row of the table is exercised by some test; a row added to kPrims without
// one fails here (and the switch warns under -Wswitch).
namespace {
constexpr const char* tested_in(Prim p) {
  switch (p) {
    case Prim::input: case Prim::scalar: case Prim::rand: case Prim::iota: return "prims/test_pointwise.cpp (leaves)";
    case Prim::neg: case Prim::abs: case Prim::exp: case Prim::exp2: case Prim::log: case Prim::log2:
    case Prim::sqrt: case Prim::rsqrt: case Prim::recip: case Prim::sin: case Prim::cos: case Prim::tanh:
    case Prim::erf: case Prim::floor: case Prim::sign: case Prim::logical_not: case Prim::expand:
      return "prims/test_pointwise.cpp (unary rows), prims/test_movement.cpp (expand)";
    case Prim::add: case Prim::sub: case Prim::mul: case Prim::div: case Prim::pow: case Prim::max:
    case Prim::min: case Prim::eq: case Prim::ne: case Prim::lt: case Prim::le: case Prim::gt: case Prim::ge:
    case Prim::where: case Prim::cast:
      return "prims/test_pointwise.cpp (binary, ternary and cast rows)";
    case Prim::sum: case Prim::amax: case Prim::amin: return "prims/test_reduce.cpp";
    case Prim::matmul: return "prims/test_matmul.cpp";
    case Prim::view: case Prim::concat: case Prim::pad: return "prims/test_movement.cpp";
    case Prim::count_: break;
  }
  return nullptr;
}
}  // namespace

TEST_CASE("every row of kPrims has a test") {
  for (const PrimInfo& r : kPrims) {
    INFO("row ", r.name);
    CHECK(tested_in(r.op) != nullptr);
    // pointwise rows are tested through their `host` reference
    bool has_host = r.host != nullptr;
    if (is_pointwise(r.op)) CHECK(has_host);
  }
}
