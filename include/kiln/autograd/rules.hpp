// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// THE gradient table (tinygrad's gradient.py, at C++ compile time). Takes one
// primitive node of the forward expression, by reference (Ref<P>), and the
// cotangent g of its output; gives the cotangent of operand K: an ordinary kiln
// expression of that operand's dtype, rank and shape. One line per primitive;
// composites (prims/decomp.hpp) have none of their own. autograd/grad.hpp walks the
// forward expression's type and stitches these together, so the gradient of an
// expression type is an expression type.
//
// Guidelines:
// - flows(op, K) says which operands receive a gradient at all (none to a where's
//   condition, none through floor/sign/comparisons: their derivative is zero).
// - Operands that broadcast get g summed back to their shape (SumTo). A few rules
//   depend on run-time attributes (a view's kind, whether a dim broadcast): those
//   return small nodes that pick their lowering at trace time (SumTo, ViewGrad).
// - A node here that builds expressions while tracing keeps them with Tracer::own:
//   the graph points into their attributes.
#pragma once
#include <memory>

#include "kiln/ir/graph.hpp"

namespace kiln::autograd {

// ---- plumbing the rules are written with ----

// Shares an expression by pointer: traced once per trace (the tracer memoizes by
// address), copied for the price of a shared_ptr. The forward expression's
// subexpressions and the cotangents are held this way.
template <class E>
struct Ref {
  using is_kiln_expr = void;
  using dtype = dtype_of<E>;
  static constexpr int rank = rank_of<E>;
  std::shared_ptr<const E> ptr;
  Shape<rank> shape;
  explicit Ref(std::shared_ptr<const E> p) : ptr(std::move(p)), shape(shape_of(*ptr)) {}
  const Shape<rank>& sizes() const { return shape; }
  const E& get() const { return *ptr; }
  // Operand K of the referenced node, sharing ownership of the whole expression.
  template <int K>
  auto child() const {
    using C = std::tuple_element_t<K, decltype(E::children)>;
    return Ref<C>(std::shared_ptr<const C>(ptr, &std::get<K>(ptr->children)));
  }
  int trace_into(ir::Tracer& t) const { return t.trace(*ptr); }
};

// A value already in the graph being traced (node `id`).
template <DTypeTag DT, int R>
struct Traced {
  using is_kiln_expr = void;
  using dtype = DT;
  static constexpr int rank = R;
  int id;
  Shape<R> shape;
  int trace_into(ir::Tracer&) const { return id; }
};

// Traces an expression built while tracing (kept alive with the graph).
template <Expr E>
int trace_owned(ir::Tracer& t, E e) {
  return t.trace(t.own(std::move(e)));
}

// g (of a broadcast shape) summed back to `shape`: over leading dims and dims where
// the operand had size 1. Nothing is added when nothing broadcast.
template <Expr E, int R>
struct SumTo {
  using is_kiln_expr = void;
  using dtype = dtype_of<E>;
  static constexpr int rank = R;
  E inner;
  Shape<R> shape;
  int trace_into(ir::Tracer& t) const {
    constexpr int RI = rank_of<E>;
    static_assert(RI >= R, "kiln: autograd: SumTo to a higher rank");
    int id = t.trace(inner);
    auto s = shape_of(inner);
    uint32_t mask = 0;
    for (int i = 0; i < RI; ++i) {
      int j = i - (RI - R);
      if (s[size_t(i)] != 1 && (j < 0 || shape[size_t(j)] == 1)) mask |= 1u << i;
    }
    Traced<dtype, RI> x{id, s};
    if (mask == 0) {
      if constexpr (RI == R) return id;
      else return trace_owned(t, reshape(x, shape));
    }
    auto r = reduce_keep<Prim::sum>(x, mask);
    if constexpr (RI == R) return trace_owned(t, r);
    else return trace_owned(t, reshape(r, shape));
  }
};
template <int R, Expr E>
SumTo<E, R> sum_to(E e, const Shape<R>& shape) { return {std::move(e), shape}; }

// Zeros of a shape (a scalar expanded: no memory read).
template <DTypeTag DT, int R>
int trace_zeros(ir::Tracer& t, const Shape<R>& shape) {
  return trace_owned(t, expand(scalar<DT>(0.0), shape));
}
// The sum of traced values of one shape (zeros when there are none).
template <DTypeTag DT, int R>
int trace_sum(ir::Tracer& t, const std::vector<int>& ids, const Shape<R>& shape) {
  if (ids.empty()) return trace_zeros<DT, R>(t, shape);
  int acc = ids[0];
  for (size_t i = 1; i < ids.size(); ++i) acc = trace_owned(t, Traced<DT, R>{acc, shape} + Traced<DT, R>{ids[i], shape});
  return acc;
}

template <int R>
std::array<int, R> inverse_perm(const std::array<int, kMaxRank>& p) {
  std::array<int, R> inv{};
  for (int i = 0; i < R; ++i) inv[size_t(p[size_t(i)])] = i;
  return inv;
}

// The cotangent of a view's operand: reshape back, permute back, or scatter a
// slice into zeros (a pad; a strided slice interleaves zeros first).
template <Expr G, DTypeTag DT, int RC>
struct ViewGrad {
  using is_kiln_expr = void;
  using dtype = DT;
  static constexpr int rank = RC;
  G g;
  Shape<RC> shape;  // the operand's
  ViewAttrs v;
  int trace_into(ir::Tracer& t) const {
    constexpr int RG = rank_of<G>;
    int id = t.trace(g);
    Traced<DT, RG> x{id, shape_of(g)};
    if (v.kind == ViewKind::reshape) return trace_owned(t, reshape(x, shape));
    if constexpr (RG == RC) {
      if (v.kind == ViewKind::permute) return trace_owned(t, permute(x, inverse_perm<RC>(v.perm)));
      int d = v.dim;
      int64_t n = shape[size_t(d)], len = x.shape[size_t(d)], start = v.start, step = v.step;
      Shape<RC> before{}, after{};
      if (step == 1 || len <= 1) {
        before[size_t(d)] = start, after[size_t(d)] = n - start - len;
        return trace_owned(t, pad(x, before, after));
      }
      // Strided: [.., len, ..] -> [.., len, step, ..] (zeros after each) -> [.., len*step, ..],
      // then shifted by start and cut to n.
      Shape<RC + 1> wide{};
      for (int i = 0, j = 0; i <= RC; ++i) wide[size_t(i)] = i == d + 1 ? 1 : x.shape[size_t(j++)];
      Shape<RC + 1> b1{}, a1{};
      a1[size_t(d + 1)] = step - 1;
      Shape<RC> flat = x.shape;
      flat[size_t(d)] = len * step;
      auto spread = reshape(pad(reshape(x, wide), b1, a1), flat);
      int64_t end = start + len * step;
      before[size_t(d)] = start, after[size_t(d)] = std::max<int64_t>(0, n - end);
      auto placed = pad(spread, before, after);
      if (end <= n) return trace_owned(t, placed);
      return trace_owned(t, slice(placed, d, 0, n));
    } else {
      throw Error("kiln: autograd: a permute or slice view changed the rank");
    }
  }
};

// ---- which operands a primitive passes a gradient to ----
constexpr bool flows(Prim op, int k) {
  switch (prim_info(op).kind) {
    case PrimKind::leaf: return false;
    default: break;
  }
  switch (op) {
    case Prim::floor: case Prim::sign: case Prim::logical_not:  // derivative zero (or none)
    case Prim::eq: case Prim::ne: case Prim::lt: case Prim::le: case Prim::gt: case Prim::ge:
      return false;
    case Prim::where: return k != 0;  // none to the condition
    default: return true;
  }
}

// where(c, a, b): g to a where c holds, to b elsewhere.
template <int K, Expr Cond, Expr G>
auto where_branch(const Cond& c, const G& g) {
  if constexpr (K == 1) return where(c, g, 0);
  else return where(c, 0, g);
}
// pad's cotangent: g sliced back to the interior, dim by dim.
template <size_t D, Expr G, size_t R>
auto unpad(const G& g, const PadAttrs& p, const std::array<int64_t, R>& s) {
  if constexpr (D == R) return g;
  else return unpad<D + 1>(slice(g, int(D), p.before[D], p.before[D] + s[D]), p, s);
}

template <class P, int K>
using operand_t = std::tuple_element_t<K, decltype(P::children)>;

// ---- THE table: cotangent of operand K of node `out` (a Ref to the forward node), given g ----
template <int K, class P, Expr G>
auto rule(const Ref<P>& out, const G& g) {
  constexpr Prim op = P::op;
  using DT = dtype_of<P>;
  using C = operand_t<P, K>;
  auto x = [&]<int I = 0>() { return out.template child<I>(); };
  auto y = [&]<int I = 1>() { return out.template child<I>(); };
  auto cshape = shape_of(out.template child<K>());
  auto to_operand = [&](auto e) { return sum_to<rank_of<C>>(std::move(e), cshape); };  // undo broadcasting
  auto pick = [&](auto f0, auto f1) {  // rule for operand 0, rule for operand 1
    if constexpr (K == 0) return f0();
    else return f1();
  };
  constexpr double kLn2 = 0.6931471805599453, k2OverSqrtPi = 1.1283791670955126, kLog2e = 1.4426950408889634;
  // clang-format off
  if constexpr (op == Prim::neg)         return -g;
  else if constexpr (op == Prim::abs)    return g * sign(x());
  else if constexpr (op == Prim::exp)    return g * out;
  else if constexpr (op == Prim::exp2)   return g * out * kLn2;
  else if constexpr (op == Prim::log)    return g / x();
  else if constexpr (op == Prim::log2)   return g / (x() * kLn2);
  else if constexpr (op == Prim::sqrt)   return g * 0.5 / out;
  else if constexpr (op == Prim::rsqrt)  return g * -0.5 * out / x();
  else if constexpr (op == Prim::recip)  return -g * out * out;
  else if constexpr (op == Prim::sin)    return g * cos(x());
  else if constexpr (op == Prim::cos)    return -g * sin(x());
  else if constexpr (op == Prim::tanh)   return g * (1 - out * out);
  // e^(-x^2) as 2^(x^2 * -log2 e): on a GPU exp2f is one special-function instruction where
  // expf takes about eleven (W4's forward computes it for every element of gelu'(u)); the
  // added rounding of the scaled square is of the order the rounded square already carries.
  else if constexpr (op == Prim::erf)    return g * k2OverSqrtPi * exp2(x() * x() * -kLog2e);
  else if constexpr (op == Prim::expand) return to_operand(g);
  else if constexpr (op == Prim::add)    return to_operand(g);
  else if constexpr (op == Prim::sub)    return to_operand(pick([&] { return g; }, [&] { return -g; }));
  else if constexpr (op == Prim::mul)    return to_operand(pick([&] { return g * y(); }, [&] { return x() * g; }));
  else if constexpr (op == Prim::div)    return to_operand(pick([&] { return g / y(); }, [&] { return -g * out / y(); }));
  // torch: d/dx = 0 where y == 0; d/dy = 0 where x == 0 and y >= 0
  else if constexpr (op == Prim::pow)    return to_operand(pick([&] { return where(eq(y(), 0), 0, g * y() * pow(x(), y() - 1)); },
                                                                [&] { auto d = g * out * log(x()); return where(eq(x(), 0), where(y() >= 0, 0, d), d); }));
  // torch.maximum / minimum: ties give half to each operand
  else if constexpr (op == Prim::max)    return to_operand(pick([&] { return where(x() > y(), g, where(eq(x(), y()), g * 0.5, 0)); },
                                                                [&] { return where(y() > x(), g, where(eq(x(), y()), g * 0.5, 0)); }));
  else if constexpr (op == Prim::min)    return to_operand(pick([&] { return where(x() < y(), g, where(eq(x(), y()), g * 0.5, 0)); },
                                                                [&] { return where(y() < x(), g, where(eq(x(), y()), g * 0.5, 0)); }));
  else if constexpr (op == Prim::where)  return to_operand(where_branch<K>(x(), g));
  else if constexpr (op == Prim::cast)   return kiln::cast<dtype_of<C>>(g);
  else if constexpr (op == Prim::sum)    return expand(g, cshape);
  // amax / amin: g to every position equal to the extremum, divided among ties (torch.amax)
  else if constexpr (op == Prim::amax || op == Prim::amin) {
    auto hit = eq(x(), out);
    return where(hit, g / reduce_keep<Prim::sum>(kiln::cast<DT>(hit), out.get().attrs.axes), 0);
  }
  else if constexpr (op == Prim::matmul) return to_operand(pick([&] { return matmul(g, transpose(y(), -1, -2)); },
                                                                [&] { return matmul(transpose(x(), -1, -2), g); }));
  else if constexpr (op == Prim::view)   return ViewGrad<G, dtype_of<C>, rank_of<C>>{g, cshape, out.get().attrs};
  else if constexpr (op == Prim::concat) {
    int64_t at = 0;
    int d = out.get().attrs.dim;
    [&]<size_t... J>(std::index_sequence<J...>) { ((at += J < size_t(K) ? shape_of(std::get<J>(out.get().children))[size_t(d)] : 0), ...); }(
        std::make_index_sequence<std::tuple_size_v<decltype(P::children)>>{});
    return slice(g, d, at, at + cshape[size_t(d)]);
  }
  else if constexpr (op == Prim::pad)    return unpad<0>(g, out.get().attrs, cshape);  // the interior
  else static_assert(!flows(op, K), "kiln: autograd: a primitive without a gradient rule: add its line to the table");
  // clang-format on
}

}  // namespace kiln::autograd
