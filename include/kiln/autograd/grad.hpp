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
// - the gradient of x_i sums the cotangents of the leaves that are x_i or a
//   permutation view of it (linear() reads W through W.transpose()); a leaf that is
//   none of the x_i is never traced, so nothing is computed for it.
// A Tensor view other than a permutation (a slice, an expand) is a leaf of its own:
// differentiate through kiln::slice / kiln::expand of the tensor instead.
#pragma once
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
    if (seed) ids.push_back(trace_owned(t, expand(scalar<DT>(1.0), shape)));
    for (const auto& term : terms) ids.push_back(term->trace(t));
    return trace_sum<DT, R>(t, ids, shape);
  }
};
template <class E>
using cotangent_t = Cotangent<dtype_of<E>, rank_of<E>>;

// d loss / d x for one requested tensor x: the cotangents of the leaves that are x,
// or a permutation view of x (moved back by the inverse permutation).
template <DTypeTag DT, int R>
struct LeafGrad {
  using is_kiln_expr = void;
  using dtype = DT;
  static constexpr int rank = R;
  using Leaf = Cotangent<DT, R>;
  Shape<R> shape;
  struct Part {
    std::shared_ptr<const Leaf> g;
    std::array<int, R> perm;  // x's dim i is the leaf's dim perm[i]
    bool identity;
  };
  std::vector<Part> parts;
  const Shape<R>& sizes() const { return shape; }
  int trace_into(ir::Tracer& t) const {
    std::vector<int> ids;
    for (const Part& p : parts) {
      int id = t.trace(*p.g);
      if (!p.identity) id = trace_owned(t, permute(Traced<DT, R>{id, p.g->shape}, p.perm));
      ids.push_back(id);
    }
    return trace_sum<DT, R>(t, ids, shape);
  }
};

namespace detail {

// When `leaf` reads exactly x's elements with x's dims permuted, fills perm (x's dim
// i is the leaf's dim perm[i]) and returns true. Size-1 dims match whatever strides.
template <class DT, int R>
bool permutation_of(const Tensor<DT, R>& leaf, const Tensor<DT, R>& x, std::type_identity_t<std::array<int, R>>& perm) {
  if (leaf.storage() != x.storage() || leaf.offset() != x.offset()) return false;
  std::array<bool, R> used{};
  for (int i = 0; i < R; ++i) {
    int found = -1;
    for (int j = 0; j < R && found < 0; ++j) {
      if (used[size_t(j)] || leaf.sizes()[size_t(j)] != x.sizes()[size_t(i)]) continue;
      if (x.sizes()[size_t(i)] == 1 || leaf.strides()[size_t(j)] == x.strides()[size_t(i)]) found = j;
    }
    if (found < 0) return false;
    used[size_t(found)] = true, perm[size_t(i)] = found;
  }
  return true;
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
  // d loss / d x: the cotangents of the leaves that are x or a permutation view of it.
  template <DTypeTag DT, int R>
  LeafGrad<DT, R> of(const Tensor<DT, R>& x) const {
    static_assert(FloatDType<DT>, "kiln::grad: only floating-point tensors have gradients");
    LeafGrad<DT, R> out;
    out.shape = x.sizes();
    for (const auto& leaf : w_.leaves) {
      if (leaf.type != &detail::kTypeTag<Tensor<DT, R>>) continue;
      std::array<int, R> perm{};
      if (!detail::permutation_of(*static_cast<const Tensor<DT, R>*>(leaf.tensor), x, perm)) continue;
      bool identity = true;
      for (int i = 0; i < R; ++i) identity = identity && perm[size_t(i)] == i;
      out.parts.push_back({std::static_pointer_cast<const Cotangent<DT, R>>(leaf.cotangent), perm, identity});
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
