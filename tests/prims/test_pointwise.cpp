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

template <class DT, int R>
void run_unary(const Operands<DT, R>& in, const std::string& label) {
  Batch b;
  add_unary(b, in, label);
  b.run();
}
template <class DT, int RA, int RB>
void run_binary(const Operands<DT, RA>& a, const Operands<DT, RB>& b, const std::string& label) {
  Batch batch;
  add_binary(batch, a, b, label);
  batch.run();
}

// The dtypes of the table, each one test run.
#define KILN_TEST_NUMERIC_DTYPES f32, f64, f16, bf16, i32, i64

}  // namespace

TEST_CASE_TEMPLATE("unary rows: odd, large, empty and size-1 shapes, contiguous", DT, KILN_TEST_NUMERIC_DTYPES) {
  KILN_TEST_RNG(rng);
  // One plan: sizes are run-time values, so these shapes share one compiled kernel.
  for (Shape<2> s : {Shape<2>{37, 129}, Shape<2>{3, 8200}, Shape<2>{0, 129}, Shape<2>{6, 0}}) {
    auto in = operands<DT, 2>(rng, s, s);
    run_unary(in, "contiguous " + str(dims(s)));
  }
  // Size-1 dims are part of the signature: their own plans.
  for (Shape<2> s : {Shape<2>{1, 1}, Shape<2>{1, 57}}) {
    auto in = operands<DT, 2>(rng, s, s);
    run_unary(in, "contiguous " + str(dims(s)));
  }
}

TEST_CASE_TEMPLATE("unary rows: non-contiguous inputs", DT, KILN_TEST_NUMERIC_DTYPES) {
  KILN_TEST_RNG(rng);
  // x transposed, pos strided (step 2, offset 1), nonzero expanded along the innermost dim.
  auto in = operands<DT, 2>(rng, {37, 129}, {37, 129},
                            {Layout::transposed, Layout::contiguous, Layout::strided, Layout::expanded_inner});
  run_unary(in, "non-contiguous [37, 129]");
  // x expanded along dim 0, pos transposed, nonzero strided.
  auto in2 = operands<DT, 2>(rng, {5, 33}, {5, 33},
                             {Layout::expanded_outer, Layout::contiguous, Layout::transposed, Layout::strided});
  run_unary(in2, "non-contiguous [5, 33]");
}

TEST_CASE_TEMPLATE("binary and ternary rows: same shapes", DT, KILN_TEST_NUMERIC_DTYPES) {
  KILN_TEST_RNG(rng);
  for (Shape<2> s : {Shape<2>{37, 129}, Shape<2>{2, 9000}, Shape<2>{0, 7}}) {
    auto a = operands<DT, 2>(rng, s, s), b = operands<DT, 2>(rng, s, s);
    run_binary(a, b, "contiguous " + str(dims(s)));
  }
  auto a = operands<DT, 2>(rng, {37, 129}, {37, 129},
                           {Layout::transposed, Layout::strided, Layout::expanded_outer, Layout::contiguous});
  auto b = operands<DT, 2>(rng, {37, 129}, {37, 129},
                           {Layout::strided, Layout::expanded_inner, Layout::contiguous, Layout::transposed});
  run_binary(a, b, "non-contiguous [37, 129]");
}

TEST_CASE_TEMPLATE("binary and ternary rows: broadcasting [M, 1] with [1, N]", DT, KILN_TEST_NUMERIC_DTYPES) {
  KILN_TEST_RNG(rng);
  auto a = operands<DT, 2>(rng, {37, 1}, {37, 1}), b = operands<DT, 2>(rng, {1, 129}, {1, 129});
  run_binary(a, b, "[37, 1] with [1, 129]");
  run_binary(b, a, "[1, 129] with [37, 1]");
}

TEST_CASE_TEMPLATE("binary and ternary rows: tensor with a host scalar", DT, KILN_TEST_NUMERIC_DTYPES) {
  KILN_TEST_RNG(rng);
  for (Shape<2> s : {Shape<2>{37, 129}, Shape<2>{0, 3}}) {
    auto in = operands<DT, 2>(rng, s, s);
    Batch batch;
    // 1.25 is exact in every float dtype; 2.5 becomes 2 in an integer one, as a C++ cast
    constexpr bool left = std::is_same_v<DT, f32> || std::is_same_v<DT, i64>;  // one float, one integer dtype
    add_scalar<left>(batch, in, FloatDType<DT> ? 1.25 : 2.5, "host scalar " + str(dims(s)));
    batch.run();
  }
}

// Rank broadcasting ([N] with [M, N]) and host scalars on the left: the same code paths
// in every dtype, so two dtypes suffice (each new operand type costs build time).
TEST_CASE_TEMPLATE("binary and ternary rows: rank broadcasting [N] with [M, N]", DT, f32, i32) {
  KILN_TEST_RNG(rng);
  auto a = operands<DT, 1>(rng, {129}, {129}), b = operands<DT, 2>(rng, {37, 129}, {37, 129});
  run_binary(a, b, "[129] with [37, 129]");
  run_binary(b, a, "[37, 129] with [129]");
}

TEST_CASE_TEMPLATE("pointwise rows in eager mode", DT, f32, bf16, i64) {
  KILN_TEST_RNG(rng);
  auto in = operands<DT, 2>(rng, {37, 129}, {37, 129});
  auto b = operands<DT, 2>(rng, {37, 129}, {37, 129});
  Batch batch;
  add_unary(batch, in, "contiguous [37, 129]");
  add_binary(batch, in, b, "contiguous [37, 129]");
  batch.run(Mode::eager);
}

TEST_CASE("boolean rows: logical_not, eq, ne, maximum, minimum, where") {
  KILN_TEST_RNG(rng);
  for (Layout l : {Layout::contiguous, Layout::transposed}) {
    auto a = input<boolean, 2>(rng, {37, 129}, l), b = input<boolean, 2>(rng, {37, 129});
    auto u = input<f32, 2>(rng, {37, 129}), v = input<f32, 2>(rng, {1, 129});
    auto [n, e, ne_, mx, mn, w] = kiln::eval(!a.t, kiln::eq(a.t, b.t), kiln::ne(a.t, b.t), kiln::maximum(a.t, b.t),
                                             kiln::minimum(a.t, b.t), kiln::where(a.t, u.t, v.t));
    std::string lay = name(l);
    check_close(n, ref::prim(Prim::logical_not, a.a), "logical_not " + lay);
    check_close(e, ref::prim(Prim::eq, a.a, b.a), "eq " + lay);
    check_close(ne_, ref::prim(Prim::ne, a.a, b.a), "ne " + lay);
    check_close(mx, ref::prim(Prim::max, a.a, b.a), "maximum " + lay);
    check_close(mn, ref::prim(Prim::min, a.a, b.a), "minimum " + lay);
    check_close(w, ref::prim(Prim::where, a.a, u.a, v.a), "where " + lay);
  }
}

TEST_CASE("rank 0: scalars in and out") {
  KILN_TEST_RNG(rng);
  auto a = input<f32, 0>(rng, {}), b = input<f32, 0>(rng, {});
  auto [s, p] = kiln::eval(a.t + b.t, kiln::exp(a.t) * 2);
  check_close(s, ref::zip(a.a, b.a, [](double x, double y) { return x + y; }), "add rank 0");
  check_close(p, ref::map(a.a, [](double x) { return double(float(std::exp(x))) * 2; }), "exp*2 rank 0");
  auto m = input<f32, 2>(rng, {5, 7});
  Tensor<f32, 2> y = m.t * a.t;  // a rank-0 tensor broadcasts like a scalar
  check_close(y, ref::zip(m.a, a.a, [](double x, double z) { return x * z; }), "[5, 7] * rank 0");
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
  run_unary(operands_of(specials, true), "special values");
  run_binary(operands_of(pairs, true), operands_of(pairs, false), "special values, every pair");
}

// ---- cast: every dtype to every dtype ----
namespace {
template <class From, class To>
void check_cast(const Input<From, 2>& in, const Tensor<To, 2>& got) {
  // A conversion is one rounding of the exact source value (f64 → 16-bit goes through f32: within tolerance).
  check_close(got, ref::as(To::id, in.a), std::string("cast ") + dtype_name<From>() + " -> " + dtype_name<To>());
}
}  // namespace

TEST_CASE_TEMPLATE("cast rows: every dtype to every dtype", From, f32, f64, f16, bf16, i32, i64, boolean) {
  KILN_TEST_RNG(rng);
  // In range for every target (f16 overflows past 65504: that edge is its own case below).
  Values v = FloatDType<From> ? Values{-1000, 1000, 0.2} : Values{-60000, 60000, 0.2};
  auto in = input<From, 2>(rng, {37, 129}, Layout::transposed, v);
  auto outs = kiln::eval(cast<f32>(in.t), cast<f64>(in.t), cast<f16>(in.t), cast<bf16>(in.t), cast<i32>(in.t),
                         cast<i64>(in.t), cast<boolean>(in.t));
  std::apply([&](const auto&... t) { (check_cast(in, t), ...); }, outs);
}

TEST_CASE("cast edges: f16 overflow, float to int truncation, NaN and infinities") {
  Array a(Dims{1, 12});
  a.v = {65504, 65519.99, 65520, -70000, 1e-8, 6e-8, -2.7, 2.7, -0.5, 1e-45, INFINITY, -INFINITY};
  a = ref::as(DType::f32, a);
  auto t = make_tensor<f32, 2>(a);
  auto [h, b] = kiln::eval(cast<f16>(t), cast<bf16>(t));
  check_close(h, ref::as(DType::f16, a), tol<f16>().scaled(0), "cast f32 -> f16 edges (exact)");
  check_close(b, ref::as(DType::bf16, a), tol<bf16>().scaled(0), "cast f32 -> bf16 edges (exact)");
  Array n(Dims{1, 3});
  n.v = {NAN, NAN, NAN};
  auto tn = make_tensor<f32, 2>(n);
  auto [hn, bn] = kiln::eval(cast<f16>(tn), cast<bf16>(tn));
  check_close(hn, n, "cast f32 NaN -> f16");
  check_close(bn, n, "cast f32 NaN -> bf16");
  Array f(Dims{1, 6});
  f.v = {-2.75, 2.75, -0.5, 0.5, 1e9, -1e9};
  auto tf = make_tensor<f64, 2>(f);
  Tensor<i32, 2> i = cast<i32>(tf);
  check_close(i, ref::as(DType::i32, f), "cast f64 -> i32 truncates toward zero");
}

// ---- leaves ----
TEST_CASE("leaf rows: input (a tensor evaluated as is) and scalar") {
  KILN_TEST_RNG(rng);
  auto x = input<f16, 3>(rng, {4, 5, 33}, Layout::transposed);
  Tensor<f16, 3> copy = kiln::eval(x.t);  // an output that is a leaf: a copy kernel
  CHECK(copy.is_contiguous());
  check_close(copy, x.a, tol<f16>().scaled(0), "input leaf copied");
  auto z = input<i64, 2>(rng, {6, 7});
  Tensor<i64, 2> s = z.t * 0 + 7;  // scalar leaves
  check_close(s, Array(Dims{6, 7}, 7), "scalar leaf");
}

TEST_CASE_TEMPLATE("leaf rows: iota along each dim", DT, i32, i64, f32, bf16) {
  auto [a, b, c] = kiln::eval(iota<DT>(std::array<int64_t, 3>{4, 1, 150}, 0), iota<DT>(std::array<int64_t, 3>{4, 1, 150}, 2),
                              iota<DT>(std::array<int64_t, 3>{4, 1, 150}, -2));
  check_close(a, ref::as(DT::id, ref::iota({4, 1, 150}, 0)), "iota dim 0");
  check_close(b, ref::as(DT::id, ref::iota({4, 1, 150}, 2)), "iota dim 2");
  check_close(c, ref::as(DT::id, ref::iota({4, 1, 150}, 1)), "iota dim -2");
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
