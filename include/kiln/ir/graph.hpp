// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Lowering, step 1. Takes expression values (expr/expr.hpp); gives a flat DAG
// (Graph) in post-order where a subexpression that appears twice in the type tree
// is one node (hash-consing), views of leaf tensors are folded into the leaf's
// strides, and a 128-bit *signature* covers everything that decides the kernels:
// ops, dtypes, ranks, which dims are size 1, reduction axes, how nodes connect,
// the device kind. Sizes, strides, pointers and scalar values are run-time data
// of the graph, not of the signature, so a new size reuses the same plan.
#pragma once
#include <memory>
#include <unordered_map>
#include <vector>

#include "kiln/core/hash.hpp"
#include "kiln/expr/expr.hpp"

namespace kiln::ir {

using Dims = std::array<int64_t, kMaxRank>;

struct Node {
  Prim op;
  DType dtype;
  uint8_t rank = 0;
  uint8_t nargs = 0;
  int32_t arg0 = 0;  // first argument's index in Graph::args
  uint32_t ones = 0; // bit i: shape[i] == 1 (part of the signature)
  Dims shape{};
  // attributes (which ones are used depends on op)
  uint32_t axes = 0;          // reduce
  int dim = 0;                // concat
  double value = 0;           // scalar; pad fill value
  uint64_t seed = 0, offset = 0;  // rand
  const ViewAttrs* view = nullptr;  // view (points into the expression, alive while the graph is)
  const PadAttrs* pad = nullptr;
  // leaf tensors
  std::shared_ptr<Storage> storage;
  int64_t elem_offset = 0;
  Dims strides{};
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
};

struct Graph {
  std::vector<Node> nodes;
  std::vector<int32_t> args;
  std::vector<int32_t> outputs;
  Device device = cpu();
  bool device_set = false;
  Hash128 signature{};
  // Gradient seeds (kiln::grad's cotangent of the loss): what the backward starts from.
  std::vector<int32_t> tangents;
  // Expressions built while tracing (autograd's): nodes' view/pad attrs point into them.
  std::vector<std::shared_ptr<const void>> owned;

  int arg(const Node& n, int i) const { return args[size_t(n.arg0 + i)]; }
  const Node& child(const Node& n, int i) const { return nodes[size_t(arg(n, i))]; }
};

// Builds a Graph from expressions. Dedup: a node equal in op, attributes and
// arguments to an earlier one *is* that node.
class Tracer {
 public:
  // An expression kind may trace itself with a member `int trace_into(Tracer&)`
  // (autograd's nodes do: they decide at trace time which terms exist).
  // NOTE: memoized by address and type, so an expression shared by pointer is
  // traced once; every expression traced must therefore outlive the trace: the
  // caller's live through the call, and one built while tracing is kept by own().
  template <Expr E>
  int trace(const E& e) {
    using T = std::remove_cvref_t<E>;
    MemoKey key{&e, &kTypeTag<T>};
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    int id;
    if constexpr (requires(Tracer& t) { { e.trace_into(t) } -> std::same_as<int>; }) id = e.trace_into(*this);
    else id = trace_node(e);
    memo_.emplace(key, id);
    return id;
  }
  // Marks node `id` as a gradient seed (the scheduler tells forward from backward by it).
  void mark_tangent(int id) {
    g_.tangents.push_back(id);
    sig_.add(uint32_t(0x7a6e)).add(id);
  }
  // Keeps an expression built during tracing alive as long as the graph.
  template <class E>
  const E& own(E e) {
    auto p = std::make_shared<const E>(std::move(e));
    g_.owned.push_back(p);
    return *p;
  }

 private:
  template <class T>
  static constexpr char kTypeTag = 0;
  struct MemoKey {
    const void *addr, *type;
    bool operator==(const MemoKey&) const = default;
  };
  struct MemoHash {
    size_t operator()(const MemoKey& k) const {
      return std::hash<const void*>()(k.addr) * 31 + std::hash<const void*>()(k.type);
    }
  };
  std::unordered_map<MemoKey, int, MemoHash> memo_;

  template <Expr E>
  int trace_node(const E& e) {
    using T = std::remove_cvref_t<E>;
    if constexpr (is_tensor<T>::value) {
      Node n = base<T>(Prim::input, e.sizes());
      if (!e.defined()) throw Error("kiln: an expression reads an undefined (default-constructed) tensor");
      use_device(e.device());
      n.storage = e.storage(), n.elem_offset = e.offset();
      std::copy(e.strides().begin(), e.strides().end(), n.strides.begin());
      return add(std::move(n), {});
    } else {
      std::array<int32_t, std::tuple_size_v<decltype(e.children)>> ids{};
      std::apply([&](const auto&... c) {
        size_t i = 0;
        ((ids[i++] = trace(c)), ...);
      }, e.children);
      Node n = base<T>(T::op, e.shape);
      set_attrs(n, e.attrs);
      if constexpr (T::op == Prim::view) {
        if (int folded = fold_view(n, ids[0]); folded >= 0) return folded;
        // A reshape that strides cannot express (of a non-contiguous leaf, or of a permuted or
        // sliced view) reads a contiguous copy.
        if (n.view->kind == ViewKind::reshape && !contiguous_value(ids[0])) ids[0] = copy_of(ids[0]);
      }
      return add(std::move(n), {ids.begin(), ids.end()});
    }
  }

 public:
  Graph finish(std::vector<int32_t> outputs) {
    if (!g_.device_set) g_.device = default_device();  // an expression of no tensors (rand, iota)
    // An output that is an input tensor (or a view folded into one) is a fresh copy, not an alias.
    for (int32_t& o : outputs)
      if (g_.nodes[size_t(o)].op == Prim::input) o = copy_of(o);
    g_.outputs = std::move(outputs);
    sig_.add(uint32_t(g_.outputs.size()));
    for (int o : g_.outputs) sig_.add(o);
    sig_.add(g_.device.kind);
    g_.signature = sig_.digest();
    return std::move(g_);
  }

 private:
  template <class T, size_t R>
  Node base(Prim op, const std::array<int64_t, R>& shape) {
    Node n{};
    n.op = op, n.dtype = T::dtype::id, n.rank = uint8_t(R);
    for (size_t i = 0; i < R; ++i) {
      n.shape[i] = shape[i];
      if (shape[i] == 1) n.ones |= 1u << i;
    }
    return n;
  }
  static void set_attrs(Node&, const NoAttrs&) {}
  static void set_attrs(Node& n, const ScalarAttrs& a) { n.value = a.value; }
  static void set_attrs(Node& n, const RandAttrs& a) { n.seed = a.seed, n.offset = a.offset; }
  static void set_attrs(Node& n, const ReduceAttrs& a) { n.axes = a.axes; }
  static void set_attrs(Node& n, const ConcatAttrs& a) { n.dim = a.dim; }
  static void set_attrs(Node& n, const IotaAttrs& a) { n.dim = a.dim; }
  static void set_attrs(Node& n, const PadAttrs& a) { n.pad = &a, n.value = a.value; }
  static void set_attrs(Node& n, const ViewAttrs& a) { n.view = &a; }

  void use_device(Device d) {
    if (g_.device_set && !(g_.device == d))
      throw Error("kiln: one expression mixes tensors on " + g_.device.str() + " and " + d.str() +
                  "; move one with .to(device)");
    g_.device = d, g_.device_set = true;
  }

  // A view of a leaf tensor becomes a leaf with new sizes and strides, when the
  // strides can express it (a reshape of non-contiguous memory cannot: that one
  // stays a view of a materialized copy).
  int fold_view(Node& n, int child) {
    const Node& c = g_.nodes[size_t(child)];
    if (c.op != Prim::input) return -1;
    Node leaf = c;
    leaf.rank = n.rank, leaf.shape = n.shape, leaf.ones = n.ones, leaf.dtype = c.dtype;
    const ViewAttrs& v = *n.view;
    switch (v.kind) {
      case ViewKind::permute:
        for (int i = 0; i < n.rank; ++i) leaf.strides[i] = c.strides[v.perm[i]];
        break;
      case ViewKind::slice:
        leaf.strides = c.strides;
        leaf.elem_offset += v.start * c.strides[v.dim];
        leaf.strides[v.dim] *= v.step;
        break;
      case ViewKind::reshape: {
        // NOTE: only contiguous leaves fold; a general stride-compatible reshape is rarer than it is subtle.
        int64_t acc = 1;
        for (int i = c.rank - 1; i >= 0; --i) {
          if (c.shape[i] != 1 && c.strides[i] != acc) return -1;
          acc *= c.shape[i];
        }
        acc = 1;
        for (int i = n.rank - 1; i >= 0; --i) leaf.strides[i] = acc, acc *= n.shape[i];
        break;
      }
    }
    return add(std::move(leaf), {});
  }

  // Whether a node's value lies in row-major order: a buffer a kernel writes, or a reshape
  // of one (this rule holds for every reshape's operand). A leaf here failed to fold: not.
  bool contiguous_value(int id) const {
    const Node& c = g_.nodes[size_t(id)];
    if (c.op == Prim::input) return false;
    return c.op != Prim::view || c.view->kind == ViewKind::reshape;
  }

  // The identity (an expand to the same shape) of a leaf or a view: a pointwise node, so a
  // kernel writes it into a contiguous buffer of its own.
  int copy_of(int leaf) {
    const Node& c = g_.nodes[size_t(leaf)];
    Node n{};
    n.op = Prim::expand, n.dtype = c.dtype, n.rank = c.rank, n.ones = c.ones, n.shape = c.shape;
    return add(std::move(n), {leaf});
  }

  int add(Node&& n, std::initializer_list<int32_t> ids) { return add(std::move(n), std::vector<int32_t>(ids)); }
  int add(Node&& n, const std::vector<int32_t>& ids) {
    // Dedup key: everything that makes two nodes the same value.
    Hasher k;
    k.add(n.op).add(n.dtype).add(n.rank).add(n.axes).add(n.dim).add(n.value).add(n.seed).add(n.offset);
    for (int i = 0; i < n.rank; ++i) k.add(n.shape[i]);
    for (int id : ids) k.add(id);
    if (n.op == Prim::input) {
      k.add(reinterpret_cast<uintptr_t>(n.storage.get())).add(n.elem_offset);
      for (int i = 0; i < n.rank; ++i) k.add(n.strides[i]);
    }
    if (n.view) hash_view(k, *n.view, n.rank);
    if (n.pad)
      for (int i = 0; i < n.rank; ++i) k.add(n.pad->before[i]).add(n.pad->after[i]);
    Hash128 key = k.digest();
    if (auto it = seen_.find(key); it != seen_.end()) return it->second;

    // Signature: the structure only (no sizes, strides, pointers or values).
    sig_.add(n.op).add(n.dtype).add(n.rank).add(n.ones).add(n.axes).add(n.dim).add(uint32_t(ids.size()));
    for (int id : ids) sig_.add(id);
    if (n.op == Prim::input && n.storage) sig_.add(int32_t(leaf_class(n)));

    n.arg0 = int32_t(g_.args.size()), n.nargs = uint8_t(ids.size());
    g_.args.insert(g_.args.end(), ids.begin(), ids.end());
    int id = int(g_.nodes.size());
    g_.nodes.push_back(std::move(n));
    seen_.emplace(key, id);
    return id;
  }
  static void hash_view(Hasher& k, const ViewAttrs& v, int rank) {
    k.add(v.kind).add(v.dim).add(v.start).add(v.step);
    for (int i = 0; i < rank; ++i) k.add(v.sizes[i]).add(v.perm[i]);
  }
  // Leaves on the same storage are told apart in the signature only by order of
  // first appearance, so that two calls with fresh tensors share a plan.
  size_t leaf_class(const Node& n) {
    auto [it, fresh] = storages_.emplace(n.storage.get(), storages_.size());
    return it->second;
  }

  Graph g_;
  Hasher sig_;
  std::unordered_map<Hash128, int, Hash128Hasher> seen_;
  std::unordered_map<const void*, size_t> storages_;
};

// Traces one or several expressions (several outputs are one plan).
template <Expr... Es>
Graph trace(const Es&... es) {
  Tracer t;
  std::vector<int32_t> outs{t.trace(es)...};
  return t.finish(std::move(outs));
}

}  // namespace kiln::ir
