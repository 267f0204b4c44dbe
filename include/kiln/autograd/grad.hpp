// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Reverse mode (AOTAutograd's job). Takes a rank-0 loss expression and the tensors
// to differentiate against; gives their gradients as expressions, evaluated with the
// forward in one plan: kiln::eval(loss, g1, g2, ...).
//
// How. The loss is a tree *type*: equal subexpressions (a C++ variable used twice,
// the same weight read twice) are copies in it, and whether two copies are the same
// value (two leaves the same tensor) is a run-time fact. So:
// - at compile time, each rule of autograd/rules.hpp is instantiated for the node
//   types of the loss: the cotangent a node of type P passes to operand K is a
//   static expression type built from P's forward operands and P's own cotangent;
// - at run time, grad() walks the loss once, groups equal subexpressions (a hash of
//   op, attributes, shape and operands; leaves by storage, offset, sizes, strides),
//   gives each group one Cotangent (a node that sums the terms it holds), and adds a
//   term to it from the first occurrence of each distinct parent. So a cotangent
//   holds only terms that exist, fan-out adds, and a shared subexpression propagates
//   once (a weight read through several paths costs one matmul, not one per path);
// - the gradient of x_i sums the cotangents of the leaves that are x_i or a Tensor
//   view of it: permuted (linear() reads W through W.transpose()), sliced (with a
//   step), expanded, or any composition of these, each cotangent summed over the
//   expanded dims, permuted back and placed into x's shape; a leaf that is none of
//   the x_i is never traced, so nothing is computed for it.
// A reshaping view (Tensor::view to another rank) is a leaf of its own: differentiate
// through kiln::reshape of the tensor instead.
#pragma once
#include <optional>
#include <unordered_map>

#include "kiln/autograd/rules.hpp"

namespace kiln::autograd {

// ---- which subexpressions carry a gradient ----
template <class T>
concept PrimNode = requires { T::op; typename std::tuple_size<decltype(T::children)>::type; };

// A float value that depends on a float tensor leaf through edges the table lets
// a gradient flow along. (Other expression kinds, gradients of gradients among
// them, are constants here.)
template <class E>
constexpr bool carries() {
  using T = std::remove_cvref_t<E>;
  if constexpr (!FloatDType<dtype_of<T>>) return false;
  else if constexpr (is_tensor<T>::value) return true;
  else if constexpr (!PrimNode<T>) return false;
  else
    return []<size_t... K>(std::index_sequence<K...>) {
      return ((flows(T::op, int(K)) && carries<operand_t<T, int(K)>>()) || ...);
    }(std::make_index_sequence<std::tuple_size_v<decltype(T::children)>>{});
}
template <class P, int K>
inline constexpr bool edge = flows(P::op, K) && carries<operand_t<P, K>>();

// The cotangent of one group of equal subexpressions (of dtype DT, rank R): the sum
// of its terms (and 1 for the loss itself), traced as that sum; zeros when empty.
// NOTE: the terms are static expression types (a rule applied to a parent) held
// behind one virtual call each. Keying the term lists by type instead (one vector
// per place the subexpression type occurs in the loss) makes the whole gradient one
// static type, but finding those places costs instantiations quadratic in the
// loss's distinct subexpression types: minutes and gigabytes of g++ for a layer_norm
// MLP. This keeps every instantiation linear.
template <DTypeTag DT, int R>
struct Cotangent {
  using is_kiln_expr = void;
  using dtype = DT;
  static constexpr int rank = R;
  struct Term {
    virtual ~Term() = default;
    virtual int trace(ir::Tracer& t) const = 0;
  };
  template <Expr E>
  struct Held final : Term {
    E e;
    explicit Held(E x) : e(std::move(x)) {}
    int trace(ir::Tracer& t) const override { return t.trace(e); }
  };
  Shape<R> shape;
  bool seed = false;
  std::vector<std::unique_ptr<const Term>> terms;

  template <Expr E>
  void add(E e) {
    static_assert(std::is_same_v<dtype_of<E>, DT> && rank_of<E> == R, "kiln: autograd: a rule gave the wrong dtype or rank");
    terms.push_back(std::make_unique<const Held<E>>(std::move(e)));
  }
  int trace_into(ir::Tracer& t) const {
    std::vector<int> ids;
    if (seed) {
      ids.push_back(trace_owned(t, expand(scalar<DT>(1.0), shape)));
      t.mark_tangent(ids.back());
    }
    for (const auto& term : terms) ids.push_back(term->trace(t));
    return trace_sum<DT, R>(t, ids, shape);
  }
};
template <class E>
using cotangent_t = Cotangent<dtype_of<E>, rank_of<E>>;

// How a leaf tensor reads x's elements when it is a Tensor view of x: leaf dim perm[k]
// reads x dim k from start[k] in steps of step[k]; a leaf dim in `spread` (stride 0)
// repeats one element of its x dim (an expand).
template <int R>
struct ViewOf {
  std::array<int, R> perm{};
  std::array<int64_t, R> start{}, step{};
  uint32_t spread = 0;
  bool identity = false;  // the leaf is x
};

// d loss / d x for one requested tensor x: the cotangents of the leaves that are x or a
// view of it, each moved back into x's shape.
template <DTypeTag DT, int R>
struct LeafGrad {
  using is_kiln_expr = void;
  using dtype = DT;
  static constexpr int rank = R;
  using Leaf = Cotangent<DT, R>;
  Shape<R> shape;
  struct Part {
    std::shared_ptr<const Leaf> g;
    ViewOf<R> view;
  };
  std::vector<Part> parts;
  const Shape<R>& sizes() const { return shape; }
  int trace_into(ir::Tracer& t) const {
    std::vector<int> ids;
    for (const Part& p : parts) ids.push_back(p.view.identity ? t.trace(*p.g) : trace_back(t, p));
    return trace_sum<DT, R>(t, ids, shape);
  }

 private:
  // The leaf's cotangent summed over its expanded dims, permuted back, each sliced dim placed.
  int trace_back(ir::Tracer& t, const Part& p) const {
    const ViewOf<R>& v = p.view;
    int id = t.trace(*p.g);
    Shape<R> s = p.g->shape;
    if (v.spread) {
      id = trace_owned(t, reduce_keep<Prim::sum>(Traced<DT, R>{id, s}, v.spread));
      for (int i = 0; i < R; ++i)
        if ((v.spread >> i) & 1u) s[size_t(i)] = 1;
    }
    bool permuted = false;
    for (int k = 0; k < R; ++k) permuted |= v.perm[size_t(k)] != k;
    if (permuted) {
      Shape<R> ps{};
      for (int k = 0; k < R; ++k) ps[size_t(k)] = s[size_t(v.perm[size_t(k)])];
      id = trace_owned(t, permute(Traced<DT, R>{id, s}, v.perm)), s = ps;
    }
    for (int k = 0; k < R; ++k) {
      if (s[size_t(k)] == shape[size_t(k)] && v.start[size_t(k)] == 0) continue;
      ViewAttrs a{};
      a.kind = ViewKind::slice, a.dim = k, a.start = v.start[size_t(k)], a.step = v.step[size_t(k)];
      Shape<R> to = s;
      to[size_t(k)] = shape[size_t(k)];
      id = trace_owned(t, ViewGrad<Traced<DT, R>, DT, R>{Traced<DT, R>{id, s}, to, a}), s = to;
    }
    return id;
  }
};

namespace detail {

// Whether `leaf` is a Tensor view of x (see ViewOf), and which: tries the ways to match
// the leaf's dims to x's by stride, then splits the offset between the matched dims.
// The result is exact (leaf[i] is x[start + i * step] for every i), or there is none.
template <class DT, int R>
std::optional<ViewOf<R>> view_of(const Tensor<DT, R>& leaf, const Tensor<DT, R>& x) {
  if (leaf.storage() != x.storage() || leaf.numel() == 0) return std::nullopt;
  const auto &nl = leaf.sizes(), &sl = leaf.strides(), &nx = x.sizes(), &sx = x.strides();
  ViewOf<R> v;
  std::array<int, R> taken{};  // x dim k is read by a leaf dim already
  auto fits = [&](int i, int k, int64_t& step) {
    step = 1;
    if (nl[size_t(i)] == 1) return true;
    if (sl[size_t(i)] == 0) return true;  // expanded: reads one element of x's dim k
    if (nx[size_t(k)] == 1 || sx[size_t(k)] <= 0 || sl[size_t(i)] % sx[size_t(k)] != 0) return false;
    step = sl[size_t(i)] / sx[size_t(k)];
    return step >= 1 && (nl[size_t(i)] - 1) * step < nx[size_t(k)];
  };
  auto starts_fit = [&] {  // leaf offset - x offset = sum_k start_k * stride_k, largest stride first
    std::array<int, R> order{};
    for (int k = 0; k < R; ++k) order[size_t(k)] = k;
    std::sort(order.begin(), order.end(), [&](int a, int b) { return sx[size_t(a)] > sx[size_t(b)]; });
    int64_t delta = leaf.offset() - x.offset();
    for (int k : order) {
      v.start[size_t(k)] = 0;
      if (nx[size_t(k)] == 1 || sx[size_t(k)] <= 0) continue;
      int i = v.perm[size_t(k)];
      int64_t len = sl[size_t(i)] == 0 ? 1 : nl[size_t(i)];
      int64_t last = nx[size_t(k)] - 1 - (len - 1) * v.step[size_t(k)];
      v.start[size_t(k)] = std::clamp<int64_t>(delta / sx[size_t(k)], 0, last);
      delta -= v.start[size_t(k)] * sx[size_t(k)];
    }
    return delta == 0;
  };
  auto match = [&](auto& self, int i) -> bool {
    if (i == R) return starts_fit();
    for (int k = 0; k < R; ++k) {
      int64_t step;
      if (taken[size_t(k)] || !fits(i, k, step)) continue;
      taken[size_t(k)] = 1, v.perm[size_t(k)] = i, v.step[size_t(k)] = step;
      if (self(self, i + 1)) return true;
      taken[size_t(k)] = 0;
    }
    return false;
  };
  if (!match(match, 0)) return std::nullopt;
  for (int i = 0; i < R; ++i)
    if (sl[size_t(i)] == 0 && nl[size_t(i)] > 1) v.spread |= 1u << i;
  v.identity = v.spread == 0 && leaf.sizes() == x.sizes();
  for (int k = 0; k < R; ++k) v.identity = v.identity && v.perm[size_t(k)] == k && v.start[size_t(k)] == 0;
  return v;
}

template <class T>
inline constexpr char kTypeTag = 0;

inline void hash_attrs(Hasher&, const NoAttrs&) {}
inline void hash_attrs(Hasher& h, const ScalarAttrs& a) { h.add(a.value); }
inline void hash_attrs(Hasher& h, const RandAttrs& a) { h.add(a.seed).add(a.offset); }
inline void hash_attrs(Hasher& h, const IotaAttrs& a) { h.add(a.dim); }
inline void hash_attrs(Hasher& h, const ReduceAttrs& a) { h.add(a.axes); }
inline void hash_attrs(Hasher& h, const ConcatAttrs& a) { h.add(a.dim); }
inline void hash_attrs(Hasher& h, const PadAttrs& a) {
  for (size_t i = 0; i < size_t(kMaxRank); ++i) h.add(a.before[i]).add(a.after[i]);
  h.add(a.value);
}
inline void hash_attrs(Hasher& h, const ViewAttrs& a) {
  h.add(a.kind).add(a.dim).add(a.start).add(a.step);
  for (size_t i = 0; i < size_t(kMaxRank); ++i) h.add(a.sizes[i]).add(a.perm[i]);
}

template <class E>
struct ChildrenOf {
  using type = std::tuple<>;
};
template <PrimNode E>
struct ChildrenOf<E> {
  using type = decltype(E::children);
};

// One walk over the loss: groups equal subexpressions and builds their cotangents.
template <class Loss>
struct Walk {
  struct Seen {
    Hash128 hash;
    void* cotangent;  // the group's cotangent_t<E>, when E carries a gradient
  };
  struct LeafGroup {
    const void* tensor, *type;
    std::shared_ptr<const void> cotangent;
  };
  std::shared_ptr<const Loss> root;
  std::unordered_map<Hash128, std::shared_ptr<void>, Hash128Hasher> groups;
  std::vector<LeafGroup> leaves;

  template <class E>
  Seen visit(const E& e) {
    Hasher h;
    h.add(reinterpret_cast<uintptr_t>(&kTypeTag<E>));
    std::array<Seen, std::tuple_size_v<typename ChildrenOf<E>::type>> kids{};
    if constexpr (is_tensor<E>::value) {
      h.add(reinterpret_cast<uintptr_t>(e.storage().get())).add(e.offset());
      for (int i = 0; i < E::rank; ++i) h.add(e.sizes()[size_t(i)]).add(e.strides()[size_t(i)]);
    } else if constexpr (PrimNode<E>) {
      for (auto s : e.shape) h.add(s);
      hash_attrs(h, e.attrs);
      std::apply([&](const auto&... c) {
        size_t i = 0;
        ((kids[i++] = visit(c)), ...);
      }, e.children);
      for (const Seen& k : kids) h.add(k.hash);
    } else {
      h.add(reinterpret_cast<uintptr_t>(&e));  // another kind of expression: only itself is equal to it
    }
    Hash128 key = h.digest();
    if constexpr (!carries<E>()) {
      return {key, nullptr};
    } else {
      auto [it, fresh] = groups.try_emplace(key);
      if (!fresh) return {key, it->second.get()};  // a copy: its parent's terms come from the first one
      auto g = std::make_shared<cotangent_t<E>>();
      g->shape = shape_of(e);
      it->second = g;
      if constexpr (is_tensor<E>::value) {
        leaves.push_back({&e, &kTypeTag<E>, g});
      } else {
        Ref<E> self(std::shared_ptr<const E>(root, &e));
        Ref<cotangent_t<E>> gref(g);
        [&]<size_t... K>(std::index_sequence<K...>) {
          ((edge<E, int(K)> ? add_term<E, int(K)>(kids[K].cotangent, self, gref) : void()), ...);
        }(std::make_index_sequence<std::tuple_size_v<decltype(E::children)>>{});
      }
      return {key, g.get()};
    }
  }

  template <class E, int K>
  static void add_term(void* operand, const Ref<E>& self, const Ref<cotangent_t<E>>& g) {
    if constexpr (edge<E, K>) static_cast<cotangent_t<operand_t<E, K>>*>(operand)->add(rule<K>(self, g));
  }
};

}  // namespace detail
}  // namespace kiln::autograd

namespace kiln::autograd {

// One backward pass over a loss: gradients of any of its leaves, on request.
template <class Loss>
class Backward {
 public:
  explicit Backward(const Loss& loss) {
    w_.root = std::make_shared<const Loss>(loss);
    auto top = w_.visit(*w_.root);
    if (top.cotangent) static_cast<cotangent_t<Loss>*>(top.cotangent)->seed = true;
  }
  // d loss / d x: the cotangents of the leaves that are x or a Tensor view of it.
  template <DTypeTag DT, int R>
  LeafGrad<DT, R> of(const Tensor<DT, R>& x) const {
    static_assert(FloatDType<DT>, "kiln::grad: only floating-point tensors have gradients");
    LeafGrad<DT, R> out;
    out.shape = x.sizes();
    for (const auto& leaf : w_.leaves) {
      if (leaf.type != &detail::kTypeTag<Tensor<DT, R>>) continue;
      if (auto v = detail::view_of(*static_cast<const Tensor<DT, R>*>(leaf.tensor), x))
        out.parts.push_back({std::static_pointer_cast<const Cotangent<DT, R>>(leaf.cotangent), *v});
    }
    return out;
  }

 private:
  detail::Walk<Loss> w_;
};

}  // namespace kiln::autograd

namespace kiln {

// Gradients of a rank-0 loss with respect to tensors xs (leaves), as expressions of
// their dtypes and shapes: auto [gw, gb] = kiln::grad(loss, w, b). Evaluate them
// with the loss as one plan (forward and backward fused): kiln::eval(loss, gw, gb).
// A tensor the loss does not read gets zeros.
template <Expr L, class... X>
auto grad(const L& loss, const X&... xs) {
  static_assert(rank_of<L> == 0, "kiln::grad: the loss must be a rank-0 expression (use sum or mean)");
  static_assert(FloatDType<dtype_of<L>>, "kiln::grad: the loss must be floating point");
  static_assert((is_tensor<X>::value && ...), "kiln::grad: differentiate with respect to tensors (leaves)");
  autograd::Backward<std::remove_cvref_t<L>> b(loss);
  return std::tuple{b.of(xs)...};
}

}  // namespace kiln
