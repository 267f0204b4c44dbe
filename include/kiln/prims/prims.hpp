// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// THE primitive table. Every primitive kiln computes is one row here: its name,
// kind, arity, its math as source text (the same text for the C++, CUDA and HIP
// dialects: each dialect's prelude defines the kiln_* functions), and a float64
// host reference used by tests. Composites (prims/decomp.hpp) are written over
// these rows and need no codegen of their own. Gradient rules live in one table
// in autograd/, indexed by the same enum.
#pragma once
#include <cmath>
#include <cstdint>
#include <string_view>

namespace kiln {

enum class Prim : uint8_t {
  // leaves
  input, scalar, rand, iota,
  // unary pointwise
  neg, abs, exp, exp2, log, log2, sqrt, rsqrt, recip, sin, cos, tanh, erf, floor, sign, logical_not,
  // broadcast to a larger shape: the identity on values (leaves read it with stride 0)
  expand,
  // binary pointwise
  add, sub, mul, div, pow, max, min, eq, ne, lt, le, gt, ge,
  // ternary pointwise
  where,
  // dtype conversion (pointwise)
  cast,
  // reductions over a set of axes
  sum, amax, amin,
  // first-class compute
  matmul,
  // movement: a strided view of a materialized value; concat and pad write into a new buffer
  view, concat, pad,
  count_
};

enum class PrimKind : uint8_t { leaf, unary, binary, ternary, cast, reduce, matmul, movement };

struct PrimInfo {
  Prim op;
  std::string_view name;
  PrimKind kind;
  // Math in source form; {0} {1} {2} are the operands (already in the compute type).
  std::string_view src;
  // float64 reference (tests and the host reference evaluator).
  double (*host)(double, double, double);
  bool float_only;      // a static_assert refuses integer and bool operands
  bool predicate;       // result dtype is boolean
};

namespace detail {
using H = double (*)(double, double, double);
inline double h_sign(double a, double, double) { return a > 0 ? 1.0 : a < 0 ? -1.0 : a; }
inline double h_max(double a, double b, double) { return std::isnan(a) || std::isnan(b) ? NAN : std::max(a, b); }
inline double h_min(double a, double b, double) { return std::isnan(a) || std::isnan(b) ? NAN : std::min(a, b); }
}  // namespace detail

// clang-format off
inline constexpr PrimInfo kPrims[] = {
  {Prim::input,  "input",  PrimKind::leaf,  "", nullptr, false, false},
  {Prim::scalar, "scalar", PrimKind::leaf,  "", nullptr, false, false},
  {Prim::rand,   "rand",   PrimKind::leaf,  "", nullptr, true,  false},  // Philox uniform [0,1)
  {Prim::iota,   "iota",   PrimKind::leaf,  "", nullptr, false, false},  // the index along one dim
  {Prim::neg,    "neg",    PrimKind::unary, "(-{0})",           [](double a, double, double) { return -a; }, false, false},
  {Prim::abs,    "abs",    PrimKind::unary, "kiln_abs({0})",    [](double a, double, double) { return std::fabs(a); }, false, false},
  {Prim::exp,    "exp",    PrimKind::unary, "kiln_exp({0})",    [](double a, double, double) { return std::exp(a); }, true, false},
  {Prim::exp2,   "exp2",   PrimKind::unary, "kiln_exp2({0})",   [](double a, double, double) { return std::exp2(a); }, true, false},
  {Prim::log,    "log",    PrimKind::unary, "kiln_log({0})",    [](double a, double, double) { return std::log(a); }, true, false},
  {Prim::log2,   "log2",   PrimKind::unary, "kiln_log2({0})",   [](double a, double, double) { return std::log2(a); }, true, false},
  {Prim::sqrt,   "sqrt",   PrimKind::unary, "kiln_sqrt({0})",   [](double a, double, double) { return std::sqrt(a); }, true, false},
  {Prim::rsqrt,  "rsqrt",  PrimKind::unary, "kiln_rsqrt({0})",  [](double a, double, double) { return 1.0 / std::sqrt(a); }, true, false},
  {Prim::recip,  "reciprocal", PrimKind::unary, "kiln_recip({0})", [](double a, double, double) { return 1.0 / a; }, true, false},
  {Prim::sin,    "sin",    PrimKind::unary, "kiln_sin({0})",    [](double a, double, double) { return std::sin(a); }, true, false},
  {Prim::cos,    "cos",    PrimKind::unary, "kiln_cos({0})",    [](double a, double, double) { return std::cos(a); }, true, false},
  {Prim::tanh,   "tanh",   PrimKind::unary, "kiln_tanh({0})",   [](double a, double, double) { return std::tanh(a); }, true, false},
  {Prim::erf,    "erf",    PrimKind::unary, "kiln_erf({0})",    [](double a, double, double) { return std::erf(a); }, true, false},
  {Prim::floor,  "floor",  PrimKind::unary, "kiln_floor({0})",  [](double a, double, double) { return std::floor(a); }, true, false},
  {Prim::sign,   "sign",   PrimKind::unary, "kiln_sign({0})",   detail::h_sign, false, false},
  {Prim::logical_not, "logical_not", PrimKind::unary, "(!{0})", [](double a, double, double) { return a == 0 ? 1.0 : 0.0; }, false, true},
  {Prim::expand, "expand", PrimKind::unary, "{0}",           [](double a, double, double) { return a; }, false, false},
  {Prim::add,    "add",    PrimKind::binary, "({0} + {1})",     [](double a, double b, double) { return a + b; }, false, false},
  {Prim::sub,    "sub",    PrimKind::binary, "({0} - {1})",     [](double a, double b, double) { return a - b; }, false, false},
  {Prim::mul,    "mul",    PrimKind::binary, "({0} * {1})",     [](double a, double b, double) { return a * b; }, false, false},
  {Prim::div,    "div",    PrimKind::binary, "({0} / {1})",     [](double a, double b, double) { return a / b; }, false, false},
  {Prim::pow,    "pow",    PrimKind::binary, "kiln_pow({0}, {1})", [](double a, double b, double) { return std::pow(a, b); }, true, false},
  {Prim::max,    "maximum", PrimKind::binary, "kiln_max({0}, {1})", detail::h_max, false, false},
  {Prim::min,    "minimum", PrimKind::binary, "kiln_min({0}, {1})", detail::h_min, false, false},
  {Prim::eq,     "eq",     PrimKind::binary, "({0} == {1})",    [](double a, double b, double) { return double(a == b); }, false, true},
  {Prim::ne,     "ne",     PrimKind::binary, "({0} != {1})",    [](double a, double b, double) { return double(a != b); }, false, true},
  {Prim::lt,     "lt",     PrimKind::binary, "({0} < {1})",     [](double a, double b, double) { return double(a < b); }, false, true},
  {Prim::le,     "le",     PrimKind::binary, "({0} <= {1})",    [](double a, double b, double) { return double(a <= b); }, false, true},
  {Prim::gt,     "gt",     PrimKind::binary, "({0} > {1})",     [](double a, double b, double) { return double(a > b); }, false, true},
  {Prim::ge,     "ge",     PrimKind::binary, "({0} >= {1})",    [](double a, double b, double) { return double(a >= b); }, false, true},
  {Prim::where,  "where",  PrimKind::ternary, "kiln_where({0}, {1}, {2})", [](double c, double a, double b) { return c != 0 ? a : b; }, false, false},
  {Prim::cast,   "cast",   PrimKind::cast,  "",                 [](double a, double, double) { return a; }, false, false},
  {Prim::sum,    "sum",    PrimKind::reduce, "({0} + {1})",     [](double a, double b, double) { return a + b; }, false, false},
  {Prim::amax,   "amax",   PrimKind::reduce, "kiln_max({0}, {1})", detail::h_max, false, false},
  {Prim::amin,   "amin",   PrimKind::reduce, "kiln_min({0}, {1})", detail::h_min, false, false},
  {Prim::matmul, "matmul", PrimKind::matmul, "", nullptr, false, false},
  {Prim::view,   "view",   PrimKind::movement, "", nullptr, false, false},
  {Prim::concat, "concat", PrimKind::movement, "", nullptr, false, false},
  {Prim::pad,    "pad",    PrimKind::movement, "", nullptr, false, false},
};
// clang-format on
static_assert(std::size(kPrims) == size_t(Prim::count_), "kiln: one row per primitive in kPrims");

constexpr const PrimInfo& prim_info(Prim p) { return kPrims[int(p)]; }
constexpr bool is_pointwise(Prim p) {
  auto k = prim_info(p).kind;
  return k == PrimKind::unary || k == PrimKind::binary || k == PrimKind::ternary || k == PrimKind::cast;
}
// Transcendental: tens of instructions an element where an add is one (a GPU's special-function
// unit and a polynomial): what a rows kernel keeps in a register rather than computes twice
// (codegen/gpu.hpp), and what the backward recomputes only where it saves bytes (sched/remat.hpp).
constexpr bool is_transcendental(Prim p) {
  return p == Prim::exp || p == Prim::exp2 || p == Prim::log || p == Prim::log2 || p == Prim::sin || p == Prim::cos ||
         p == Prim::tanh || p == Prim::erf || p == Prim::pow;
}

}  // namespace kiln
