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
#include <cstring>
#include <memory>
#include <span>
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

// An index from 64-bit fingerprints to small ints, for the tracer's per-call lookups:
// the first few entries in place (a tiny expression allocates nothing here), then an
// open-addressing table (a per-node hash map made tracing a tiny expression cost more
// than launching its kernel). Fingerprints may collide: the caller confirms a
// candidate with `same(value)`.
class FingerprintIndex {
 public:
  template <class Same>
  int find(uint64_t key, Same&& same) const {
    if (table_.empty()) {
      for (size_t i = 0; i < count_; ++i)
        if (few_[i].key == key && same(few_[i].value)) return few_[i].value;
      return -1;
    }
    for (size_t i = key & mask(); table_[i].value >= 0; i = (i + 1) & mask())
      if (table_[i].key == key && same(table_[i].value)) return table_[i].value;
    return -1;
  }
  void insert(uint64_t key, int value) {
    if (table_.empty() && count_ < kFew) {
      few_[count_++] = {key, value};
      return;
    }
    if (2 * (count_ + 1) > table_.size()) grow();
    put(key, value);
    ++count_;
  }
  // A well-mixed fingerprint of a few words.
  static uint64_t mix(uint64_t h, uint64_t v) { return (h ^ detail::fmix64(v + 0x9E3779B97F4A7C15ull)) * 0xff51afd7ed558ccdull; }

 private:
  struct Entry {
    uint64_t key = 0;
    int value = -1;
  };
  static constexpr size_t kFew = 8;
  size_t mask() const { return table_.size() - 1; }
  void put(uint64_t key, int value) {
    size_t i = key & mask();
    while (table_[i].value >= 0) i = (i + 1) & mask();
    table_[i] = {key, value};
  }
  void grow() {
    std::vector<Entry> old = table_.empty() ? std::vector<Entry>(few_, few_ + count_) : std::move(table_);
    table_.assign(std::max<size_t>(32, old.size() * 2), Entry{});
    for (const Entry& e : old)
      if (e.value >= 0) put(e.key, e.value);
  }
  Entry few_[kFew];
  std::vector<Entry> table_;
  size_t count_ = 0;
};

// Builds a Graph from expressions. Dedup: a node equal in op, attributes and
// arguments to an earlier one *is* that node.
class Tracer {
 public:
  Tracer() {  // room for a small expression: one allocation per array
    g_.nodes.reserve(8);
    backward_.reserve(8);
    g_.args.reserve(8);
    memo_.reserve(8);
  }
  // An expression kind may trace itself with a member `int trace_into(Tracer&)`
  // (autograd's nodes do: they decide at trace time which terms exist).
  // NOTE: memoized by address and type, so an expression shared by pointer is
  // traced once; every expression traced must therefore outlive the trace: the
  // caller's live through the call, and one built while tracing is kept by own().
  template <Expr E>
  int trace(const E& e) {
    using T = std::remove_cvref_t<E>;
    MemoKey key{&e, &kTypeTag<T>};
    uint64_t fp = FingerprintIndex::mix(reinterpret_cast<uintptr_t>(key.addr), reinterpret_cast<uintptr_t>(key.type));
    if (int m = memo_index_.find(fp, [&](int i) { return memo_[size_t(i)].key == key; }); m >= 0) return memo_[size_t(m)].id;
    int id;
    if constexpr (requires(Tracer& t) { { e.trace_into(t) } -> std::same_as<int>; }) id = e.trace_into(*this);
    else id = trace_node(e);
    memo_index_.insert(fp, int(memo_.size()));
    memo_.push_back({key, id});
    return id;
  }
  // Marks node `id` as a gradient seed (the scheduler tells forward from backward by it).
  void mark_tangent(int id) {
    g_.tangents.push_back(id);
    backward_[size_t(id)] = 1;
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
  struct MemoEntry {
    MemoKey key;
    int id;
  };
  std::vector<MemoEntry> memo_;
  FingerprintIndex memo_index_;

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
      if constexpr (T::op == Prim::mul || T::op == Prim::add) {
        if (int f = factor_tangent(n, ids[0], ids[1]); f >= 0) return f;
      }
      if (int sunk = sink_reshape(n, std::span<const int32_t>(ids)); sunk >= 0) return sunk;
      if (int whole = reduce_under_reshape(n, std::span<const int32_t>(ids)); whole >= 0) return whole;
      if constexpr (T::op == Prim::view) {
        if (int same = collapse_reshapes(n, ids[0]); same >= 0) return same;
        if (int folded = fold_view(n, ids[0]); folded >= 0) return folded;
        if (int repeat = fold_repeat(n, ids[0]); repeat >= 0) return repeat;
        // A reshape that strides cannot express (of a non-contiguous leaf, or of a permuted or
        // sliced view) reads a contiguous copy.
        if (n.view->kind == ViewKind::reshape && !contiguous_value(ids[0])) ids[0] = copy_of(ids[0]);
      }
      return add(std::move(n), std::span<const int32_t>(ids));
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

  // A reshape of a value that repeats one element (a value of one element, or expands of
  // one) is that element broadcast to the new shape: a pointwise node, computed where it is
  // read, where a view would read a stored buffer. So a full reduction's gradient (a mean
  // loss's 1 / numel, back through the reshapes that dropped the reduced dims) needs no
  // kernel that stores it for the per-element backward to load. NOTE: size-1 dims are part
  // of the signature (Node::ones), so the fold holds at every size the plan is reused for.
  int fold_repeat(const Node& n, int child) {
    if (n.view->kind != ViewKind::reshape) return -1;
    int one = -1;
    for (int at = child;; at = g_.arg(g_.nodes[size_t(at)], 0)) {
      const Node& c = g_.nodes[size_t(at)];
      if (c.rank <= n.rank && c.ones == (1u << c.rank) - 1) {  // every dim 1: broadcasts to any shape of this rank or more
        one = at;
        break;
      }
      if (c.op != Prim::expand) break;
    }
    if (one < 0) return -1;
    Node e{};
    e.op = Prim::expand, e.dtype = n.dtype, e.rank = n.rank, e.ones = n.ones, e.shape = n.shape;
    return add(std::move(e), {one});
  }

  static bool same_shape(const Node& a, const Node& b) {
    return a.rank == b.rank && std::equal(a.shape.begin(), a.shape.begin() + a.rank, b.shape.begin());
  }

  // A reshape of a reshape of a computed value (a buffer in row-major order) is one reshape
  // of that value, and no view at all where it gives the value's own shape back:
  // `unsqueeze(mean(x, 1), 1)` is `mean(x, 1, keepdim)`, which a pointwise consumer reads in its
  // own kernel rather than through a view of a stored buffer.
  int collapse_reshapes(const Node& n, int child) {
    const Node& v = g_.nodes[size_t(child)];
    if (n.view->kind != ViewKind::reshape || v.op != Prim::view || v.view->kind != ViewKind::reshape) return -1;
    const int under = g_.arg(v, 0);
    const Node u = g_.nodes[size_t(under)];  // a copy: add() may move the nodes
    if (u.op == Prim::input || u.op == Prim::view) return -1;
    if (same_shape(u, n)) return under;
    Node direct = n;
    return add(std::move(direct), {under});
  }

  // How many trailing dims a reshape from `from` to `to` keeps (equal sizes, so the reshape only
  // merges or splits the dims before them, and an element keeps its index in them).
  static int kept_suffix(const Node& from, const Node& to) {
    int k = 0;
    while (k < from.rank && k < to.rank && from.shape[size_t(from.rank - 1 - k)] == to.shape[size_t(to.rank - 1 - k)]) ++k;
    return k;
  }

  // A pointwise op on a reshape of a computed value (a buffer in row-major order: a reduction's
  // rank-dropping form `sum(x, 1)`, `mean(x)`, or any reshape of a kernel's output) runs on the
  // value as computed and the reshape follows it: `mean(x)` is `reshape(sum(x, keepdim) * (1 / n))`,
  // so the scale joins the reduction's kernel as a row-level store, where the reshape's view would
  // have read a stored buffer in a kernel of its own. The other operands: a reshape of the same
  // kind (from the value's leading dims to the view's, its own trailing dims those the reshape
  // keeps or 1: the row max of softmax over `reshape(y, [b * t, v])`), a value that broadcasts
  // along the kept trailing dims alone (a weight over the rows), or one element. Exact: the same
  // elements in the same order.
  int sink_reshape(const Node& n, std::span<const int32_t> ids) {
    const PrimKind k = prim_info(n.op).kind;
    if (ids.empty() || !(k == PrimKind::unary || k == PrimKind::binary || k == PrimKind::ternary || k == PrimKind::cast)) return -1;
    auto reshaped = [&](int id) -> int {  // the computed value `id` is a reshape of, else -1
      const Node& v = g_.nodes[size_t(id)];
      if (v.op != Prim::view || v.view->kind != ViewKind::reshape) return -1;
      const int c = g_.arg(v, 0);
      const Prim op = g_.nodes[size_t(c)].op;
      return op == Prim::input || op == Prim::view ? -1 : c;
    };
    int view = -1, kept = -1;  // an operand of the result's shape that is such a reshape
    for (int id : ids)
      if (int c = reshaped(id); c >= 0 && same_shape(n, g_.nodes[size_t(id)])) view = id, kept = c;
    if (view < 0) return -1;
    const Node v = g_.nodes[size_t(view)], c = g_.nodes[size_t(kept)];  // copies: add() may move the nodes
    const int suffix = kept_suffix(c, v), lead_v = v.rank - suffix, lead_c = c.rank - suffix;
    // `a` a reshape of `d` as v is of c, but for kept trailing dims of 1 in both
    auto alike = [&](const Node& a, const Node& d) {
      if (a.rank != v.rank || d.rank != c.rank) return false;
      if (!std::equal(a.shape.begin(), a.shape.begin() + lead_v, v.shape.begin()) ||
          !std::equal(d.shape.begin(), d.shape.begin() + lead_c, c.shape.begin()))
        return false;
      for (int i = 0; i < suffix; ++i) {
        const int64_t sa = a.shape[size_t(lead_v + i)], sd = d.shape[size_t(lead_c + i)];
        if (sa != sd || (sa != 1 && sa != v.shape[size_t(lead_v + i)])) return false;
      }
      return true;
    };
    std::array<int32_t, 3> args{};
    for (size_t i = 0; i < ids.size(); ++i) {
      const Node& a = g_.nodes[size_t(ids[i])];
      const int under = reshaped(ids[i]);
      bool trailing = a.rank <= suffix;  // broadcasts along the kept trailing dims alone
      for (int d = 0; d < a.rank && trailing; ++d) {
        const int64_t sa = a.shape[size_t(d)];
        trailing = sa == 1 || sa == v.shape[size_t(v.rank - a.rank + d)];
      }
      if (under >= 0 && alike(a, g_.nodes[size_t(under)]))
        args[i] = under;
      else if ((a.rank <= c.rank && a.ones == (1u << a.rank) - 1) || trailing)  // one element, or along the rows
        args[i] = ids[i];
      else
        return -1;
    }
    Node op = n;
    op.rank = c.rank, op.shape = c.shape, op.ones = c.ones;
    const int kept_op = add(std::move(op), std::span<const int32_t>(args.data(), ids.size()));
    Node reshape = v;
    reshape.dtype = n.dtype;
    return add(std::move(reshape), {kept_op});
  }

  // A reduction over a reshape of a computed value reduces the value itself, its result reshaped
  // after, where it reduces every element or trailing dims the reshape keeps: `mean(reshape(x * 2,
  // [n]))` and `softmax(reshape(y, [b * t, v]), -1)` are one kernel each, where the reshape's view
  // had the value stored first and read back. Exact: the same elements (the whole reduction in
  // another order). Not for other axes, which would depend on how the reshape groups the dims.
  // NOTE: the reshape after it reuses the view's attributes (a reshape's target is its node's
  // shape; the attributes' sizes only tell nodes apart).
  int reduce_under_reshape(const Node& n, std::span<const int32_t> ids) {
    if (prim_info(n.op).kind != PrimKind::reduce || ids.size() != 1) return -1;
    const Node v = g_.nodes[size_t(ids[0])];  // copies: add() may move the nodes
    if (v.op != Prim::view || v.view->kind != ViewKind::reshape) return -1;
    const int under = g_.arg(v, 0);
    const Node u = g_.nodes[size_t(under)];
    if (u.op == Prim::input || u.op == Prim::view) return -1;
    const uint32_t all = (1u << n.rank) - 1;
    int reduced_dims = 0;  // the reduced axes as trailing dims of the view: how many
    while (reduced_dims < n.rank && (n.axes >> (n.rank - 1 - reduced_dims) & 1u)) ++reduced_dims;
    if (n.axes != all && (n.axes != (all & ~((1u << (n.rank - reduced_dims)) - 1)) || reduced_dims > kept_suffix(u, v))) return -1;
    Node part = n;
    part.rank = u.rank, part.shape = u.shape;
    const int from = n.axes == all ? 0 : u.rank - reduced_dims;
    part.axes = ((1u << u.rank) - 1) & ~((1u << from) - 1);
    part.ones = u.ones | part.axes;
    for (int d = from; d < u.rank; ++d) part.shape[size_t(d)] = 1;
    const int reduced = add(std::move(part), {under});
    if (same_shape(g_.nodes[size_t(reduced)], n)) return reduced;
    Node back = v;
    back.dtype = n.dtype, back.rank = n.rank, back.shape = n.shape, back.ones = n.ones;
    return add(std::move(back), {reduced});
  }

  // A gradient's products with the cotangent factored out (autograd's terms come in as chains
  // of products, the cotangent anywhere in them): a product of a backward value (one that
  // depends on a gradient seed) and a forward one becomes cotangent x (forward product), and a
  // sum of two such products of the same cotangent becomes cotangent x (sum of the forward
  // factors). So the backward reads one forward value per cotangent where it read several:
  // gelu's derivative u -> 0.5 (1 + erf(u k)) + u k' exp(-(u k)^2) is one value, which the
  // forward can store where it computes erf(u k) anyway (sched/remat.hpp decides).
  // Exact algebra; the float products associate differently.
  int factor_tangent(const Node& n, int a, int b) {
    if (g_.tangents.empty()) return -1;  // no gradient traced yet: nothing depends on a seed
    const bool ba = backward_[size_t(a)], bb = backward_[size_t(b)];
    auto node_of = [&](int id) -> const Node& { return g_.nodes[size_t(id)]; };
    // Canonical product: mul(cotangent factor, forward factor), as this function leaves them.
    auto split = [&](int id, int& t, int& f) {
      const Node& x = node_of(id);
      if (x.op != Prim::mul || x.dtype != n.dtype) return false;
      t = g_.arg(x, 0), f = g_.arg(x, 1);
      return backward_[size_t(t)] && !backward_[size_t(f)];
    };
    auto binary = [&](Prim op, int p, int q) {
      const Node &np = node_of(p), &nq = node_of(q);
      Node m{};
      m.op = op, m.dtype = n.dtype, m.rank = std::max(np.rank, nq.rank);
      for (int i = 0; i < m.rank; ++i) {  // right-aligned broadcast, as expr.hpp's broadcast_shapes
        const int ip = i - (m.rank - np.rank), iq = i - (m.rank - nq.rank);
        const int64_t sp = ip >= 0 ? np.shape[size_t(ip)] : 1, sq = iq >= 0 ? nq.shape[size_t(iq)] : 1;
        m.shape[size_t(i)] = sp == 1 ? sq : sp;
        if (m.shape[size_t(i)] == 1) m.ones |= 1u << i;
      }
      return add(std::move(m), {p, q});
    };
    int t, f, t2, f2;
    if (n.op == Prim::mul && ba != bb) {
      const int tb = ba ? a : b, fw = ba ? b : a;
      if (node_of(fw).dtype != n.dtype) return -1;
      if (split(tb, t, f)) return binary(Prim::mul, t, binary(Prim::mul, f, fw));
      return ba ? -1 : binary(Prim::mul, tb, fw);  // the cotangent first
    }
    if (n.op == Prim::add && ba && bb && split(a, t, f) && split(b, t2, f2) && t == t2)
      return binary(Prim::mul, t, binary(Prim::add, f, f2));
    return -1;
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

  int add(Node&& n, std::initializer_list<int32_t> ids) { return add(std::move(n), std::span(ids.begin(), ids.size())); }
  int add(Node&& n, std::span<const int32_t> ids) {
    // Dedup: a node equal to an earlier one in everything that makes a value is that node.
    uint64_t fp = dedup_fingerprint(n, ids);
    if (int same = seen_.find(fp, [&](int id) { return same_value(g_.nodes[size_t(id)], n, ids); }); same >= 0) return same;

    // Signature: the structure only (no sizes, strides, pointers or values), one piece per node.
    uint32_t w[8] = {uint32_t(n.op), uint32_t(n.dtype), n.rank, n.ones, n.axes, uint32_t(n.dim), uint32_t(ids.size()),
                     n.op == Prim::input && n.storage ? uint32_t(leaf_class(n)) : ~0u};
    sig_.add(w, sizeof w);
    if (!ids.empty()) sig_.add(ids.data(), ids.size() * sizeof(int32_t));

    n.arg0 = int32_t(g_.args.size()), n.nargs = uint8_t(ids.size());
    g_.args.insert(g_.args.end(), ids.begin(), ids.end());
    int id = int(g_.nodes.size());
    uint8_t backward = 0;
    for (int a : ids) backward |= backward_[size_t(a)];
    backward_.push_back(backward);
    g_.nodes.push_back(std::move(n));
    seen_.insert(fp, id);
    return id;
  }
  static uint64_t bits(double v) {
    uint64_t b;
    std::memcpy(&b, &v, 8);
    return b;
  }
  static uint64_t dedup_fingerprint(const Node& n, std::span<const int32_t> ids) {
    using F = FingerprintIndex;
    uint64_t h = F::mix(uint64_t(n.op) | uint64_t(n.dtype) << 8 | uint64_t(n.rank) << 16 | uint64_t(n.axes) << 32, bits(n.value));
    h = F::mix(h, uint64_t(uint32_t(n.dim)) ^ n.seed * 31 ^ n.offset * 131);
    for (int i = 0; i < n.rank; ++i) h = F::mix(h, uint64_t(n.shape[size_t(i)]));
    for (int id : ids) h = F::mix(h, uint64_t(uint32_t(id)));
    if (n.op == Prim::input) h = F::mix(h, reinterpret_cast<uintptr_t>(n.storage.get()) ^ uint64_t(n.elem_offset) * 8191);
    return h;
  }
  // Everything that makes two nodes the same value: op, attributes, shape, arguments; for
  // leaves the memory they read.
  bool same_value(const Node& a, const Node& b, std::span<const int32_t> ids) const {
    if (a.op != b.op || a.dtype != b.dtype || a.rank != b.rank || a.axes != b.axes || a.dim != b.dim ||
        bits(a.value) != bits(b.value) || a.seed != b.seed || a.offset != b.offset || a.nargs != ids.size())
      return false;
    for (int i = 0; i < a.rank; ++i)
      if (a.shape[size_t(i)] != b.shape[size_t(i)]) return false;
    for (size_t i = 0; i < ids.size(); ++i)
      if (g_.args[size_t(a.arg0) + i] != ids[i]) return false;
    if (a.op == Prim::input) {
      if (a.storage != b.storage || a.elem_offset != b.elem_offset) return false;
      for (int i = 0; i < a.rank; ++i)
        if (a.strides[size_t(i)] != b.strides[size_t(i)]) return false;
    }
    if (bool(a.view) != bool(b.view) || bool(a.pad) != bool(b.pad)) return false;
    if (a.view) {
      const ViewAttrs &u = *a.view, &v = *b.view;
      if (u.kind != v.kind || u.dim != v.dim || u.start != v.start || u.step != v.step) return false;
      for (int i = 0; i < a.rank; ++i)
        if (u.sizes[size_t(i)] != v.sizes[size_t(i)] || u.perm[size_t(i)] != v.perm[size_t(i)]) return false;
    }
    if (a.pad)
      for (int i = 0; i < a.rank; ++i)
        if (a.pad->before[size_t(i)] != b.pad->before[size_t(i)] || a.pad->after[size_t(i)] != b.pad->after[size_t(i)]) return false;
    return true;
  }
  // Leaves on the same storage are told apart in the signature only by order of
  // first appearance, so that two calls with fresh tensors share a plan.
  size_t leaf_class(const Node& n) {
    // NOTE: mix(0, p) is a bijection of p: equal fingerprints are equal pointers.
    uint64_t fp = FingerprintIndex::mix(0, reinterpret_cast<uintptr_t>(n.storage.get()));
    if (int c = storage_index_.find(fp, [](int) { return true; }); c >= 0) return size_t(c);
    storage_index_.insert(fp, storages_);
    return size_t(storages_++);
  }

  Graph g_;
  std::vector<uint8_t> backward_;  // per node: depends on a gradient seed (factor_tangent)
  Hasher sig_;
  FingerprintIndex seen_;
  int storages_ = 0;
  FingerprintIndex storage_index_;
};

// Traces one or several expressions (several outputs are one plan).
template <Expr... Es>
Graph trace(const Es&... es) {
  Tracer t;
  std::vector<int32_t> outs{t.trace(es)...};
  return t.finish(std::move(outs));
}

}  // namespace kiln::ir
