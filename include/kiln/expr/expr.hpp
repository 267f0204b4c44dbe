// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Capture. Takes tensors and scalars; gives expression values whose *type* is the
// graph (op, dtype, rank, children) and whose members hold only run-time facts
// (sizes, axes, scalar values). Nothing is computed here: an expression is
// evaluated when it is assigned to a Tensor (runtime/eval.hpp). Sizes are checked
// as the expression is built, so a mismatch throws naming the op and both shapes;
// dtype and rank mistakes are compile errors.
#pragma once
#include <tuple>

#include "kiln/core/tensor.hpp"
#include "kiln/prims/prims.hpp"

namespace kiln {

// ---- concepts ----
template <class T>
struct is_tensor : std::false_type {};
template <class DT, int R>
struct is_tensor<Tensor<DT, R>> : std::true_type {};

template <class E>
concept Expr = is_tensor<std::remove_cvref_t<E>>::value || requires { typename std::remove_cvref_t<E>::is_kiln_expr; };
template <class S>
concept HostScalar = std::is_arithmetic_v<S>;

template <Expr E>
using dtype_of = typename std::remove_cvref_t<E>::dtype;
template <Expr E>
inline constexpr int rank_of = std::remove_cvref_t<E>::rank;

// ---- run-time attributes of a node (what the type does not hold) ----
struct NoAttrs {};
struct ScalarAttrs { double value; };
struct RandAttrs { uint64_t seed, offset; };
struct IotaAttrs { int dim; };
struct ReduceAttrs { uint32_t axes; };  // bit i set: axis i reduced (result keeps it as size 1)
struct ConcatAttrs { int dim; };
struct PadAttrs { std::array<int64_t, kMaxRank> before, after; double value; };
enum class ViewKind : uint8_t { permute, slice, reshape };
struct ViewAttrs {
  ViewKind kind;
  std::array<int64_t, kMaxRank> sizes;  // reshape: new sizes
  std::array<int, kMaxRank> perm;       // permute
  int dim;                              // slice
  int64_t start, step;                  // slice
};

// One generic node: the primitive and the result's dtype and rank are in the type;
// children are held by value (a Tensor is a cheap shared handle).
template <Prim P, DTypeTag DT, int R, class Attrs, class... C>
struct Node {
  using is_kiln_expr = void;
  using dtype = DT;
  static constexpr int rank = R;
  static constexpr Prim op = P;
  std::tuple<C...> children;
  Shape<R> shape;
  Attrs attrs;
  const Shape<R>& sizes() const { return shape; }
};

template <Expr E>
auto shape_of(const E& e) {
  if constexpr (is_tensor<E>::value) return e.sizes();
  else return e.shape;
}

template <DTypeTag DT>
using ScalarNode = Node<Prim::scalar, DT, 0, ScalarAttrs>;
template <DTypeTag DT>
ScalarNode<DT> scalar(double v) { return {{}, {}, {v}}; }

// ---- pointwise builders ----
template <Prim P, Expr A>
auto unary(const A& a) {
  using DT = dtype_of<A>;
  static_assert(!prim_info(P).float_only || FloatDType<DT>,
                "kiln: this op needs a floating-point operand (f32, f64, f16, bf16); use kiln::cast<kiln::f32>(x)");
  using Out = std::conditional_t<prim_info(P).predicate, boolean, DT>;
  return Node<P, Out, rank_of<A>, NoAttrs, A>{{a}, shape_of(a), {}};
}

template <Prim P, Expr A, Expr B>
auto binary(const A& a, const B& b) {
  using DT = dtype_of<A>;
  static_assert(std::is_same_v<DT, dtype_of<B>>,
                "kiln: operands have different dtypes; convert one with kiln::cast<DType>(x)");
  static_assert(!prim_info(P).float_only || FloatDType<DT>,
                "kiln: this op needs floating-point operands (f32, f64, f16, bf16); use kiln::cast<kiln::f32>(x)");
  static_assert(P == Prim::eq || P == Prim::ne || !std::is_same_v<DT, boolean> || P == Prim::max || P == Prim::min,
                "kiln: arithmetic on boolean tensors; use kiln::where or kiln::cast first");
  using Out = std::conditional_t<prim_info(P).predicate, boolean, DT>;
  constexpr int R = std::max(rank_of<A>, rank_of<B>);
  return Node<P, Out, R, NoAttrs, A, B>{{a, b}, broadcast_shapes(prim_info(P).name.data(), shape_of(a), shape_of(b)), {}};
}

// A host scalar takes the dtype of the tensor expression it meets.
template <Prim P, Expr A, HostScalar S>
auto binary(const A& a, S s) { return binary<P>(a, scalar<dtype_of<A>>(double(s))); }
template <Prim P, HostScalar S, Expr B>
auto binary(S s, const B& b) { return binary<P>(scalar<dtype_of<B>>(double(s)), b); }

// clang-format off
template <Expr A> auto operator-(const A& a) { return unary<Prim::neg>(a); }
template <Expr A> auto operator!(const A& a) {
  static_assert(std::is_same_v<dtype_of<A>, boolean>, "kiln: operator! needs a boolean expression");
  return unary<Prim::logical_not>(a);
}
template <Expr A> auto abs(const A& a) { return unary<Prim::abs>(a); }
template <Expr A> auto exp(const A& a) { return unary<Prim::exp>(a); }
template <Expr A> auto exp2(const A& a) { return unary<Prim::exp2>(a); }
template <Expr A> auto log(const A& a) { return unary<Prim::log>(a); }
template <Expr A> auto log2(const A& a) { return unary<Prim::log2>(a); }
template <Expr A> auto sqrt(const A& a) { return unary<Prim::sqrt>(a); }
template <Expr A> auto rsqrt(const A& a) { return unary<Prim::rsqrt>(a); }
template <Expr A> auto reciprocal(const A& a) { return unary<Prim::recip>(a); }
template <Expr A> auto sin(const A& a) { return unary<Prim::sin>(a); }
template <Expr A> auto cos(const A& a) { return unary<Prim::cos>(a); }
template <Expr A> auto tanh(const A& a) { return unary<Prim::tanh>(a); }
template <Expr A> auto erf(const A& a) { return unary<Prim::erf>(a); }
template <Expr A> auto floor(const A& a) { return unary<Prim::floor>(a); }
template <Expr A> auto sign(const A& a) { return unary<Prim::sign>(a); }

#define KILN_BINARY_FN(fn, P)                                                                       \
  template <class A, class B> requires((Expr<A> && (Expr<B> || HostScalar<B>)) || (HostScalar<A> && Expr<B>)) \
  auto fn(const A& a, const B& b) { return binary<P>(a, b); }
KILN_BINARY_FN(operator+, Prim::add)
KILN_BINARY_FN(operator-, Prim::sub)
KILN_BINARY_FN(operator*, Prim::mul)
KILN_BINARY_FN(operator/, Prim::div)
KILN_BINARY_FN(pow, Prim::pow)
KILN_BINARY_FN(maximum, Prim::max)
KILN_BINARY_FN(minimum, Prim::min)
KILN_BINARY_FN(eq, Prim::eq)
KILN_BINARY_FN(ne, Prim::ne)
KILN_BINARY_FN(operator<, Prim::lt)
KILN_BINARY_FN(operator<=, Prim::le)
KILN_BINARY_FN(operator>, Prim::gt)
KILN_BINARY_FN(operator>=, Prim::ge)
#undef KILN_BINARY_FN
// clang-format on

// where(cond, a, b): cond is boolean; a and b share a dtype (host scalars allowed).
template <Expr C, class A, class B>
  requires((Expr<A> || HostScalar<A>) && (Expr<B> || HostScalar<B>) && (Expr<A> || Expr<B>))
auto where(const C& c, const A& a, const B& b) {
  static_assert(std::is_same_v<dtype_of<C>, boolean>, "kiln: where: the condition must be a boolean expression");
  if constexpr (!Expr<A>) {
    return where(c, scalar<dtype_of<B>>(double(a)), b);
  } else if constexpr (!Expr<B>) {
    return where(c, a, scalar<dtype_of<A>>(double(b)));
  } else {
    static_assert(std::is_same_v<dtype_of<A>, dtype_of<B>>, "kiln: where: branches have different dtypes");
    constexpr int R = std::max({rank_of<C>, rank_of<A>, rank_of<B>});
    auto s = broadcast_shapes("where", broadcast_shapes("where", shape_of(c), shape_of(a)), shape_of(b));
    return Node<Prim::where, dtype_of<A>, R, NoAttrs, C, A, B>{{c, a, b}, s, {}};
  }
}

template <DTypeTag To, Expr A>
auto cast(const A& a) {
  return Node<Prim::cast, To, rank_of<A>, NoAttrs, A>{{a}, shape_of(a), {}};
}

// Broadcast to `sizes` (new leading dims allowed); no data is copied.
template <Expr A, size_t R2>
auto expand(const A& a, const std::array<int64_t, R2>& sizes) {
  constexpr int R = rank_of<A>;
  static_assert(int(R2) >= R, "kiln: expand: target rank is lower than the operand's");
  auto s = shape_of(a);
  Shape<R2> out = sizes;
  for (int i = 0; i < int(R2); ++i) {
    int j = i - (int(R2) - R);
    int64_t have = j >= 0 ? s[j] : 1;
    if (out[i] == -1) out[i] = have;
    if (have != 1 && have != out[i])
      throw ShapeError("kiln: expand: cannot expand " + format_shape(s) + " to " + format_shape(sizes));
  }
  return Node<Prim::expand, dtype_of<A>, int(R2), NoAttrs, A>{{a}, out, {}};
}

// ---- reductions: always computed keeping reduced dims (size 1); the rank-dropping
// form is a reshape view of that result ----
struct KeepDim {};
inline constexpr KeepDim keepdim{};

template <Expr A, size_t N>
uint32_t axes_mask(const char* op, const std::array<int, N>& axes) {
  uint32_t m = 0;
  for (int ax : axes) {
    int a = normalize_axis(op, ax, rank_of<A>);
    if (m & (1u << a)) throw ShapeError(std::string("kiln: ") + op + ": axis " + std::to_string(ax) + " repeated");
    m |= 1u << a;
  }
  return m;
}

template <Prim P, Expr A>
auto reduce_keep(const A& a, uint32_t mask) {
  static_assert(!std::is_same_v<dtype_of<A>, boolean>, "kiln: reductions need a numeric dtype; cast booleans first");
  auto s = shape_of(a);
  for (int i = 0; i < rank_of<A>; ++i)
    if (mask & (1u << i)) {
      if (P != Prim::sum && s[i] == 0)
        throw ShapeError(std::string("kiln: ") + prim_info(P).name.data() + ": reducing an empty axis of shape " +
                         format_shape(shape_of(a)));
      s[i] = 1;
    }
  return Node<P, dtype_of<A>, rank_of<A>, ReduceAttrs, A>{{a}, s, {mask}};
}

template <Expr A, size_t N>
auto reshape(const A& a, std::array<int64_t, N> sizes);

// Reduce over `axes` (any set, negative counts from the end). With keepdim the
// reduced dims stay as size 1; without, they are dropped.
template <Prim P, Expr A, size_t N>
auto reduce(const A& a, const std::array<int, N>& axes) {
  constexpr int R = rank_of<A>;
  static_assert(int(N) <= R, "kiln: more reduction axes than the operand's rank");
  uint32_t mask = axes_mask<A>(prim_info(P).name.data(), axes);
  auto k = reduce_keep<P>(a, mask);
  Shape<R - int(N)> out{};
  for (int i = 0, j = 0; i < R; ++i)
    if (!(mask & (1u << i))) out[j++] = k.shape[i];
  return reshape(k, out);
}
template <Prim P, Expr A, size_t N>
auto reduce(const A& a, const std::array<int, N>& axes, KeepDim) {
  return reduce_keep<P>(a, axes_mask<A>(prim_info(P).name.data(), axes));
}
template <Expr A>
std::array<int, rank_of<A>> all_axes() {
  std::array<int, rank_of<A>> ax{};
  for (int i = 0; i < rank_of<A>; ++i) ax[i] = i;
  return ax;
}

// clang-format off
template <Expr A> auto sum(const A& a) { return reduce<Prim::sum>(a, all_axes<A>()); }
template <Expr A> auto sum(const A& a, int axis) { return reduce<Prim::sum>(a, std::array{axis}); }
template <Expr A> auto sum(const A& a, int axis, KeepDim k) { return reduce<Prim::sum>(a, std::array{axis}, k); }
template <Expr A, size_t N> auto sum(const A& a, const std::array<int, N>& ax) { return reduce<Prim::sum>(a, ax); }
template <Expr A, size_t N> auto sum(const A& a, const std::array<int, N>& ax, KeepDim k) { return reduce<Prim::sum>(a, ax, k); }
template <Expr A> auto amax(const A& a) { return reduce<Prim::amax>(a, all_axes<A>()); }
template <Expr A> auto amax(const A& a, int axis) { return reduce<Prim::amax>(a, std::array{axis}); }
template <Expr A> auto amax(const A& a, int axis, KeepDim k) { return reduce<Prim::amax>(a, std::array{axis}, k); }
template <Expr A, size_t N> auto amax(const A& a, const std::array<int, N>& ax) { return reduce<Prim::amax>(a, ax); }
template <Expr A, size_t N> auto amax(const A& a, const std::array<int, N>& ax, KeepDim k) { return reduce<Prim::amax>(a, ax, k); }
template <Expr A> auto amin(const A& a) { return reduce<Prim::amin>(a, all_axes<A>()); }
template <Expr A> auto amin(const A& a, int axis) { return reduce<Prim::amin>(a, std::array{axis}); }
template <Expr A> auto amin(const A& a, int axis, KeepDim k) { return reduce<Prim::amin>(a, std::array{axis}, k); }
template <Expr A, size_t N> auto amin(const A& a, const std::array<int, N>& ax) { return reduce<Prim::amin>(a, ax); }
template <Expr A, size_t N> auto amin(const A& a, const std::array<int, N>& ax, KeepDim k) { return reduce<Prim::amin>(a, ax, k); }
// clang-format on

// ---- movement: on a Tensor these are free views; on an expression they view the
// materialized value (the lowering folds them into a leaf's strides where it can) ----
// NOTE: a size_t rank, as std::array has: Shape<R2>'s int rank cannot be deduced from a Shape.
template <Expr A, size_t N>
auto reshape(const A& a, std::array<int64_t, N> sizes) {
  constexpr int R2 = int(N);
  auto s = shape_of(a);
  int64_t known = 1, infer = -1, n = numel(s);
  for (int i = 0; i < R2; ++i) {
    if (sizes[i] == -1) {
      if (infer >= 0) throw ShapeError("kiln: reshape: more than one -1 in " + format_shape(sizes));
      infer = i;
    } else known *= sizes[i];
  }
  if (infer >= 0) sizes[infer] = known ? n / known : 0;
  if (numel(sizes) != n)
    throw ShapeError("kiln: reshape: cannot reshape " + format_shape(s) + " to " + format_shape(sizes));
  ViewAttrs v{ViewKind::reshape, {}, {}, 0, 0, 1};
  std::copy(sizes.begin(), sizes.end(), v.sizes.begin());
  return Node<Prim::view, dtype_of<A>, R2, ViewAttrs, A>{{a}, sizes, v};
}

template <Expr A>
auto permute(const A& a, std::array<int, rank_of<A>> perm) {
  constexpr int R = rank_of<A>;
  if constexpr (is_tensor<A>::value) {
    return a.permute(perm);
  } else {
    auto s = shape_of(a);
    Shape<R> out{};
    ViewAttrs v{ViewKind::permute, {}, {}, 0, 0, 1};
    uint32_t seen = 0;
    for (int i = 0; i < R; ++i) {
      int p = normalize_axis("permute", perm[i], R);
      if (seen & (1u << p)) throw ShapeError("kiln: permute: axis repeated in permutation");
      seen |= 1u << p;
      v.perm[i] = p, out[i] = s[p];
    }
    return Node<Prim::view, dtype_of<A>, R, ViewAttrs, A>{{a}, out, v};
  }
}
template <Expr A>
auto transpose(const A& a, int d0, int d1) {
  constexpr int R = rank_of<A>;
  std::array<int, R> perm{};
  for (int i = 0; i < R; ++i) perm[i] = i;
  std::swap(perm[normalize_axis("transpose", d0, R)], perm[normalize_axis("transpose", d1, R)]);
  return permute(a, perm);
}
template <Expr A>
auto slice(const A& a, int dim, int64_t start, int64_t stop, int64_t step = 1) {
  if constexpr (is_tensor<A>::value) {
    return a.slice(dim, start, stop, step);
  } else {
    constexpr int R = rank_of<A>;
    dim = normalize_axis("slice", dim, R);
    auto s = shape_of(a);
    int64_t n = s[dim];
    if (step <= 0) throw ShapeError("kiln: slice: step must be positive");
    if (start < 0) start += n;
    if (stop < 0) stop += n;
    start = std::clamp<int64_t>(start, 0, n), stop = std::clamp<int64_t>(stop, start, n);
    s[dim] = (stop - start + step - 1) / step;
    return Node<Prim::view, dtype_of<A>, R, ViewAttrs, A>{{a}, s, ViewAttrs{ViewKind::slice, {}, {}, dim, start, step}};
  }
}
template <Expr A>
auto unsqueeze(const A& a, int dim) {
  constexpr int R = rank_of<A>;
  dim = normalize_axis("unsqueeze", dim, R + 1);
  auto s = shape_of(a);
  Shape<R + 1> out{};
  for (int i = 0, j = 0; i <= R; ++i) out[i] = i == dim ? 1 : s[j++];
  return reshape(a, out);
}

// Joins expressions of one dtype and rank along `dim`.
template <Expr A, Expr... Rest>
auto concat(int dim, const A& a, const Rest&... rest) {
  constexpr int R = rank_of<A>;
  static_assert(((std::is_same_v<dtype_of<A>, dtype_of<Rest>> && rank_of<Rest> == R) && ...),
                "kiln: concat: all operands need the same dtype and rank");
  dim = normalize_axis("concat", dim, R);
  auto s = shape_of(a);
  for (const auto& o : {Shape<R>(shape_of(rest))...}) {
    for (int i = 0; i < R; ++i)
      if (i != dim && o[i] != s[i])
        throw ShapeError("kiln: concat: shapes " + format_shape(shape_of(a)) + " and " + format_shape(o) +
                         " differ outside dim " + std::to_string(dim));
    s[dim] += o[dim];
  }
  return Node<Prim::concat, dtype_of<A>, R, ConcatAttrs, A, Rest...>{{a, rest...}, s, {dim}};
}

// Pads each dim with before[i] and after[i] elements of `value`.
template <Expr A>
auto pad(const A& a, Shape<rank_of<A>> before, Shape<rank_of<A>> after, double value = 0.0) {
  constexpr int R = rank_of<A>;
  auto s = shape_of(a);
  PadAttrs p{{}, {}, value};
  for (int i = 0; i < R; ++i) {
    if (before[i] < 0 || after[i] < 0) throw ShapeError("kiln: pad: negative padding");
    s[i] += before[i] + after[i], p.before[i] = before[i], p.after[i] = after[i];
  }
  return Node<Prim::pad, dtype_of<A>, R, PadAttrs, A>{{a}, s, p};
}

// ---- matmul: [..., M, K] @ [..., K, N] -> [..., M, N], batch dims broadcast ----
template <Expr A, Expr B>
auto matmul(const A& a, const B& b) {
  constexpr int RA = rank_of<A>, RB = rank_of<B>;
  static_assert(RA >= 2 && RB >= 2, "kiln: matmul: operands need rank >= 2 (use unsqueeze for vectors)");
  static_assert(std::is_same_v<dtype_of<A>, dtype_of<B>>, "kiln: matmul: operands have different dtypes");
  static_assert(NumericDType<dtype_of<A>>, "kiln: matmul: boolean operands");
  auto sa = shape_of(a);
  auto sb = shape_of(b);  // NOTE: apart: one `auto` may not deduce two types
  if (sa[RA - 1] != sb[RB - 2])
    throw ShapeError("kiln: matmul: shapes " + format_shape(sa) + " and " + format_shape(sb) +
                     " (inner dims " + std::to_string(sa[RA - 1]) + " and " + std::to_string(sb[RB - 2]) + " differ)");
  Shape<RA - 2> ba{};
  Shape<RB - 2> bb{};
  std::copy_n(sa.begin(), RA - 2, ba.begin());
  std::copy_n(sb.begin(), RB - 2, bb.begin());
  auto batch = broadcast_shapes("matmul", ba, bb);
  constexpr int R = std::max(RA, RB);
  Shape<R> out{};
  std::copy(batch.begin(), batch.end(), out.begin());
  out[R - 2] = sa[RA - 2], out[R - 1] = sb[RB - 1];
  return Node<Prim::matmul, dtype_of<A>, R, NoAttrs, A, B>{{a, b}, out, {}};
}

// ---- random: counter-based (Philox4x32-10), reproducible from (seed, offset) ----
template <FloatDType DT, size_t R>
auto rand(const std::array<int64_t, R>& sizes, uint64_t seed, uint64_t offset = 0) {
  return Node<Prim::rand, DT, int(R), RandAttrs>{{}, sizes, {seed, offset}};
}

// The index along `dim` at every position of `sizes` (0, 1, 2, ... along dim).
template <DTypeTag DT, size_t R>
auto iota(const std::array<int64_t, R>& sizes, int dim) {
  return Node<Prim::iota, DT, int(R), IotaAttrs>{{}, sizes, {normalize_axis("iota", dim, int(R))}};
}

}  // namespace kiln
