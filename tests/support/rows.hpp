// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Rows of the primitive table through kiln's public API: apply_unary<P>(a),
// apply_binary<P>(a, b), apply_ternary<P>(c, a, b), apply_reduce<P>(a, axes) and
// apply_reduce_keep<P>(a, axes) build row P the way a user would (operator+, kiln::exp,
// kiln::sum, ...). A row they do not know is a compile error, so a primitive added to
// kPrims cannot be skipped by the tests that iterate the table (for_each_row).
#pragma once
#include "kiln/kiln.hpp"

namespace kiln::test {

template <Prim P>
inline constexpr bool kUnknownRow = false;

// Row P through kiln's public API.
template <Prim P, class A>
auto apply_unary(const A& a) {
  if constexpr (P == Prim::neg) return -a;
  else if constexpr (P == Prim::abs) return kiln::abs(a);
  else if constexpr (P == Prim::exp) return kiln::exp(a);
  else if constexpr (P == Prim::exp2) return kiln::exp2(a);
  else if constexpr (P == Prim::log) return kiln::log(a);
  else if constexpr (P == Prim::log2) return kiln::log2(a);
  else if constexpr (P == Prim::sqrt) return kiln::sqrt(a);
  else if constexpr (P == Prim::rsqrt) return kiln::rsqrt(a);
  else if constexpr (P == Prim::recip) return kiln::reciprocal(a);
  else if constexpr (P == Prim::sin) return kiln::sin(a);
  else if constexpr (P == Prim::cos) return kiln::cos(a);
  else if constexpr (P == Prim::tanh) return kiln::tanh(a);
  else if constexpr (P == Prim::erf) return kiln::erf(a);
  else if constexpr (P == Prim::floor) return kiln::floor(a);
  else if constexpr (P == Prim::sign) return kiln::sign(a);
  else if constexpr (P == Prim::logical_not) return !a;
  else if constexpr (P == Prim::expand) return kiln::expand(a, shape_of(a));  // same shape: the identity
  else static_assert(kUnknownRow<P>, "a new unary primitive: map it to its kiln function here");
}
template <Prim P, class A, class B>
auto apply_binary(const A& a, const B& b) {
  if constexpr (P == Prim::add) return a + b;
  else if constexpr (P == Prim::sub) return a - b;
  else if constexpr (P == Prim::mul) return a * b;
  else if constexpr (P == Prim::div) return a / b;
  else if constexpr (P == Prim::pow) return kiln::pow(a, b);
  else if constexpr (P == Prim::max) return kiln::maximum(a, b);
  else if constexpr (P == Prim::min) return kiln::minimum(a, b);
  else if constexpr (P == Prim::eq) return kiln::eq(a, b);
  else if constexpr (P == Prim::ne) return kiln::ne(a, b);
  else if constexpr (P == Prim::lt) return a < b;
  else if constexpr (P == Prim::le) return a <= b;
  else if constexpr (P == Prim::gt) return a > b;
  else if constexpr (P == Prim::ge) return a >= b;
  else static_assert(kUnknownRow<P>, "a new binary primitive: map it to its kiln function here");
}
template <Prim P, class C, class A, class B>
auto apply_ternary(const C& c, const A& a, const B& b) {
  if constexpr (P == Prim::where) return kiln::where(c, a, b);
  else static_assert(kUnknownRow<P>, "a new ternary primitive: map it to its kiln function here");
}

// Row P through kiln's public API, over `axes`, with and without keepdim.
template <Prim P, class A, size_t N>
auto apply_reduce(const A& a, const std::array<int, N>& axes) {
  if constexpr (P == Prim::sum) return kiln::sum(a, axes);
  else if constexpr (P == Prim::amax) return kiln::amax(a, axes);
  else if constexpr (P == Prim::amin) return kiln::amin(a, axes);
  else static_assert(kUnknownRow<P>, "a new reduction primitive: map it to its kiln function here");
}
template <Prim P, class A, size_t N>
auto apply_reduce_keep(const A& a, const std::array<int, N>& axes) {
  if constexpr (P == Prim::sum) return kiln::sum(a, axes, keepdim);
  else if constexpr (P == Prim::amax) return kiln::amax(a, axes, keepdim);
  else if constexpr (P == Prim::amin) return kiln::amin(a, axes, keepdim);
  else static_assert(kUnknownRow<P>, "a new reduction primitive: map it to its kiln function here");
}

}  // namespace kiln::test
