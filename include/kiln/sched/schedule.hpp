// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Lowering, step 2: fusion. Takes a Graph (ir/graph.hpp); gives a Plan: kernels in
// execution order, each with the nodes it computes inline, the buffers it loads,
// the scalars it takes and what it stores. Works on structure only (the plan is
// reused for every call with the same signature), using symbolic shapes: each
// dim is a class in a union-find, where broadcasting two dims that are not 1
// proves them equal.
//
// Rules (Inductor's, in short):
// - pointwise nodes are inlined into every kernel that needs them;
// - a reduction pulls in its pointwise producers; reductions over the same
//   domain and axes share one "rows" kernel (one pass per dependency level);
// - a pointwise output whose shape is that domain, or the domain with the
//   reduced dims at 1, joins the rows kernel (softmax, layer_norm: one kernel);
// - pointwise outputs of one shape share a kernel (several outputs, one launch);
// - a pointwise output whose shape is a matmul's output shape and that reads the
//   matmul joins its kernel as the epilogue, computed per output element at store
//   time (bias, activation, residual, scale, cast: gelu(x@W + b) is one kernel);
//   the matmul itself is stored only if another kernel or the caller reads it
//   (kiln::set_epilogue_fusion(false): never; such outputs get kernels of their own).
//   NOTE: on an H200, W4's gelu(u) and gelu'(u) in a pointwise kernel of their own, the GEMM
//   storing u = x@W1 + b1, made the step 0.3% slower: their erf and exp take about 0.3 ms of
//   issue slots in either kernel (branch transcendentals-apart; docs/benchmarks.md);
// - a matmul operand that is a pointwise function of one tensor of its shape and of
//   scalars (x * s, a cast), read by nothing else, is the matmul's prologue: the GEMM
//   may compute it per element as it loads it, from that tensor. Its own kernel stays in
//   the plan (Kernel::prologue_of) for the GEMMs that cannot (tiles that arrive by a copy
//   engine): the backend launches it only for those;
// - a sum over the rows of a matrix a GEMM stores (a bias's gradient) stays a rows kernel;
//   a GEMM that can sum its tiles' columns as it stores them (wgmma) does, and the backend
//   then skips that kernel (runtime's assign_column_sums);
// - matmul, concat and pad otherwise are kernels of their own; views read
//   materialized values (so a view of a matmul never joins its epilogue); every
//   merge is refused if it would make the kernel graph cyclic.
#pragma once
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "kiln/sched/remat.hpp"

namespace kiln::sched {

enum class KernelKind : uint8_t { pointwise, rows, matmul };
enum class StoreInto : uint8_t { whole, concat_part, pad_interior };

struct Store {
  int value;    // node computed (or loaded) by the kernel
  int buffer;   // node whose buffer receives it
  StoreInto into = StoreInto::whole;
  int part = 0; // concat: which operand
};

struct Kernel {
  KernelKind kind = KernelKind::pointwise;
  int domain = -1;         // node whose shape is the iteration domain (rows: the reduced input; matmul: the matmul)
  uint32_t axes = 0;       // rows: reduced axes of the domain
  std::vector<int> reduces;        // rows: reductions computed here, in dependency order
  std::vector<int> reduce_level;   // rows: pass of each reduction (0-based)
  std::vector<Store> stores;  // matmul: the matmul (if kept) and its epilogue's outputs
  std::vector<int> loads;   // nodes read from memory (matmul: its two operands first)
  std::vector<int> params;  // nodes passed by value (scalars, pad values, rand seeds)
  std::vector<int> deps;    // kernels that must run before
  // matmul: per operand (A, B), the slot of the tensor its prologue reads, or -1 (none).
  std::array<int, 2> prologue_slot{-1, -1};
  // pointwise: the matmul kernel whose operand this kernel alone stores (a prologue); a
  // backend launches it only where that GEMM reads the operand's buffer.
  int prologue_of = -1;
  bool has_prologue() const { return prologue_slot[0] >= 0 || prologue_slot[1] >= 0; }
  bool row_store(const Store& s) const { return row_level_.size() && row_level_[size_t(&s - stores.data())]; }
  std::vector<uint8_t> row_level_;  // rows: per store, stored once per row
};

struct Plan {
  std::vector<Kernel> kernels;        // execution order
  std::vector<uint8_t> materialize;   // per node: the plan allocates a buffer for it
  // per node: a matmul prologue's operand, materialized but bound without a buffer (a backend
  // allocates it for a call that runs the prologue's own kernel: runtime/bind.hpp)
  std::vector<uint8_t> prologue_operand;
  Remat remat;                        // a training step: what the backward loads and recomputes
  std::string describe(const ir::Graph& g) const;
};

namespace detail {

// x's index in v, appended first if absent (a kernel's loads and params: each once).
inline int index_of_added(std::vector<int>& v, int x) {
  auto it = std::find(v.begin(), v.end(), x);
  if (it == v.end()) it = v.insert(v.end(), x);
  return int(it - v.begin());
}

struct SymShapes {
  std::vector<int> parent{0};
  std::vector<std::array<int, kMaxRank>> of;
  int fresh() {
    parent.push_back(int(parent.size()));
    return int(parent.size()) - 1;
  }
  int find(int c) {
    while (parent[size_t(c)] != c) c = parent[size_t(c)] = parent[size_t(parent[size_t(c)])];
    return c;
  }
  void unite(int a, int b) {
    a = find(a), b = find(b);
    if (a != b) parent[size_t(std::max(a, b))] = std::min(a, b);  // NOTE: class 0 ("one") stays a root
  }
  // Dim i of node n seen from a domain of rank r (right-aligned; missing dims are 1).
  int aligned(const ir::Node& n, int idx, int i, int r) {
    int j = i - (r - n.rank);
    return j >= 0 ? find(of[size_t(idx)][size_t(j)]) : 0;
  }
};

inline SymShapes symbolic_shapes(const ir::Graph& g) {
  SymShapes s;
  s.of.resize(g.nodes.size());
  auto fresh_or_one = [&](const ir::Node& n, int i) { return (n.ones >> i) & 1u ? 0 : s.fresh(); };
  for (size_t id = 0; id < g.nodes.size(); ++id) {
    const ir::Node& n = g.nodes[id];
    auto& out = s.of[id];
    PrimKind k = prim_info(n.op).kind;
    if (n.op == Prim::expand) {
      for (int i = 0; i < n.rank; ++i) {
        int c = s.aligned(g.child(n, 0), g.arg(n, 0), i, n.rank);
        out[size_t(i)] = (n.ones >> i) & 1u ? 0 : c ? c : s.fresh();
      }
    } else if (k == PrimKind::unary || k == PrimKind::binary || k == PrimKind::ternary || k == PrimKind::cast) {
      for (int i = 0; i < n.rank; ++i) {
        int cls = 0;
        for (int a = 0; a < n.nargs; ++a) {
          int c = s.aligned(g.child(n, a), g.arg(n, a), i, n.rank);
          if (c == 0) continue;
          if (cls) s.unite(cls, c);
          cls = s.find(c);
        }
        out[size_t(i)] = cls;
      }
    } else if (k == PrimKind::reduce) {
      for (int i = 0; i < n.rank; ++i)
        out[size_t(i)] = (n.axes >> i) & 1u ? 0 : s.find(s.of[size_t(g.arg(n, 0))][size_t(i)]);
    } else if (n.op == Prim::matmul) {
      const ir::Node &a = g.child(n, 0), &b = g.child(n, 1);
      int ia = g.arg(n, 0), ib = g.arg(n, 1);
      for (int i = 0; i < n.rank - 2; ++i) {
        int ca = i - (n.rank - a.rank) >= 0 ? s.find(s.of[size_t(ia)][size_t(i - (n.rank - a.rank))]) : 0;
        int cb = i - (n.rank - b.rank) >= 0 ? s.find(s.of[size_t(ib)][size_t(i - (n.rank - b.rank))]) : 0;
        if (ca && cb) s.unite(ca, cb);
        out[size_t(i)] = ca ? s.find(ca) : cb;
      }
      int ka = s.of[size_t(ia)][size_t(a.rank - 1)], kb = s.of[size_t(ib)][size_t(b.rank - 2)];
      if (ka && kb) s.unite(ka, kb);
      out[size_t(n.rank - 2)] = s.of[size_t(ia)][size_t(a.rank - 2)];
      out[size_t(n.rank - 1)] = s.of[size_t(ib)][size_t(b.rank - 1)];
    } else if (n.op == Prim::concat) {
      for (int i = 0; i < n.rank; ++i) {
        if (i == n.dim) {
          out[size_t(i)] = fresh_or_one(n, i);
          continue;
        }
        int cls = 0;
        for (int a = 0; a < n.nargs; ++a) {
          int c = s.find(s.of[size_t(g.arg(n, a))][size_t(i)]);
          if (cls && c) s.unite(cls, c);
          cls = c ? s.find(c) : cls;
        }
        out[size_t(i)] = cls;
      }
    } else {  // leaves, views, pad: sizes known only at run time
      for (int i = 0; i < n.rank; ++i) out[size_t(i)] = fresh_or_one(n, i);
    }
  }
  return s;
}

class Scheduler {
 public:
  Scheduler(const ir::Graph& g, bool fuse, bool epilogues) : g_(g), fuse_(fuse), epilogues_(epilogues), sym_(symbolic_shapes(g)) {
    size_t n = g.nodes.size();
    plan_.materialize.assign(n, 0);
    plan_.prologue_operand.assign(n, 0);
    producers_.resize(n);
    kernel_of_.assign(n, -1);
    is_output_.assign(n, 0);
    for (int o : g.outputs) is_output_[size_t(o)] = 1;
    operand_.assign(n, 0), uses_.assign(n, 0);
    // Nodes no output is computed from (the tracer's rewrites leave some: ir::Tracer::factor_tangent)
    // are neither computed nor counted as readers.
    live_ = live_nodes(g);
    for (size_t id = 0; id < n; ++id) {
      if (!live_[id]) continue;
      const ir::Node& m = g.nodes[id];
      for (int a = 0; a < m.nargs; ++a) ++uses_[size_t(g.arg(m, a))];
      if (m.op == Prim::matmul) operand_[size_t(g.arg(m, 0))] = operand_[size_t(g.arg(m, 1))] = 1;
    }
  }

  Plan run() {
    mark_materialized();
    for (size_t id = 0; id < g_.nodes.size(); ++id) place(int(id));
    for (int o : g_.outputs) place_output(o);
    for (auto& k : plan_.kernels) finish(k);
    find_prologues();
    drop_unread_stores();
    order();
    return std::move(plan_);
  }

 private:
  const ir::Node& node(int id) const { return g_.nodes[size_t(id)]; }
  bool is_leaf(int id) const {
    Prim p = node(id).op;
    return p == Prim::input || p == Prim::scalar || p == Prim::rand || p == Prim::iota;
  }
  // A value other kernels read from memory: a leaf tensor, a view, or a buffer.
  bool is_load(int id) const { return node(id).op == Prim::input || node(id).op == Prim::view || plan_.materialize[size_t(id)]; }

  void mark_materialized() {
    auto& m = plan_.materialize;
    for (size_t id = 0; id < g_.nodes.size(); ++id) {
      if (!live_[id]) continue;
      const ir::Node& n = g_.nodes[id];
      PrimKind k = prim_info(n.op).kind;
      if (k == PrimKind::reduce || n.op == Prim::matmul || n.op == Prim::concat || n.op == Prim::pad) m[id] = 1;
      if (!fuse_ && k != PrimKind::leaf && n.op != Prim::view) m[id] = 1;  // eager: every op its own kernel
      // matmul reads buffers; a view reads a materialized value
      if (n.op == Prim::matmul || n.op == Prim::view)
        for (int a = 0; a < n.nargs; ++a) {
          int c = g_.arg(n, a);
          if (!is_leaf(c) || node(c).op != Prim::input) m[size_t(c)] = node(c).op != Prim::view;
        }
    }
    for (int o : g_.outputs)
      if (node(o).op != Prim::view) m[size_t(o)] = 1;
    // A training step: the forward stores the values the backward loads (sched/remat.hpp);
    // the pointwise values it recomputes stay unmaterialized, inlined into each reader.
    if (fuse_ && !g_.tangents.empty()) {
      plan_.remat = partition(g_, m);
      for (int id : plan_.remat.saved)
        if (is_pointwise(node(id).op)) m[size_t(id)] = 1;
    }
  }

  // Sym-shape equality of two nodes, or of a node and a domain with `axes` set to 1.
  bool same_shape(int a, int b, uint32_t ones_at = 0) {
    const ir::Node &na = node(a), &nb = node(b);
    if (na.rank != nb.rank) return false;
    for (int i = 0; i < na.rank; ++i) {
      int cb = (ones_at >> i) & 1u ? 0 : sym_.find(sym_.of[size_t(b)][size_t(i)]);
      if (sym_.find(sym_.of[size_t(a)][size_t(i)]) != cb) return false;
    }
    return true;
  }

  // The pointwise cone of `root` as computed inside kernel `k`: walks through
  // inline nodes, stops at loads, params and this kernel's reductions.
  template <class F>
  void walk_cone(int root, int k, F&& on_boundary) {
    std::vector<uint8_t> seen(g_.nodes.size(), 0);
    std::vector<int> stack{root};
    bool first = true;
    while (!stack.empty()) {
      int id = stack.back();
      stack.pop_back();
      if (seen[size_t(id)]) continue;
      seen[size_t(id)] = 1;
      if (!first && (is_load(id) || is_leaf(id))) {
        if (!(k >= 0 && kernel_of_[size_t(id)] == k && !is_leaf(id) && node(id).op != Prim::view)) {
          on_boundary(id);
          continue;
        }
      }
      first = false;
      const ir::Node& n = node(id);
      if (prim_info(n.op).kind == PrimKind::reduce && id != root) continue;  // a member reduction: a register
      if (n.op == Prim::concat || n.op == Prim::pad || n.op == Prim::matmul) continue;
      for (int a = 0; a < n.nargs; ++a) stack.push_back(g_.arg(n, a));
    }
  }
  // Whether the cone of `id` reads a value kernel k computes.
  bool uses_kernel(int id, int k) {
    bool uses = false;
    walk_cone(id, -1, [&](int b) { uses |= kernel_of_[size_t(b)] == k; });
    return uses;
  }
  // Kernels whose buffers the cone of `root` (inside kernel k) reads.
  std::vector<int> cone_deps(int root, int k) {
    std::vector<int> deps;
    walk_cone(root, k, [&](int b) {
      for (int p : producers_of(b))
        if (p != k) deps.push_back(p);
    });
    return deps;
  }
  // Whether the cone of `root` (inside kernel k) reads, through a view, a buffer that
  // kernel k stores: another element of it, which this kernel may not have written yet.
  bool reads_own_view(int root, int k) {
    bool hit = false;
    walk_cone(root, k, [&](int b) {
      if (node(b).op != Prim::view) return;
      for (int p : producers_of(b)) hit |= p == k;
    });
    return hit;
  }
  std::vector<int> producers_of(int id) {
    while (node(id).op == Prim::view && !plan_.materialize[size_t(id)]) id = g_.arg(node(id), 0);
    return producers_[size_t(id)];
  }
  bool depends_on(int from, int target, std::vector<uint8_t>& seen) {
    if (from == target) return true;
    if (seen[size_t(from)]) return false;
    seen[size_t(from)] = 1;
    for (int d : plan_.kernels[size_t(from)].deps)
      if (depends_on(d, target, seen)) return true;
    return false;
  }
  bool would_cycle(const std::vector<int>& new_deps, int k) {
    std::vector<uint8_t> seen(plan_.kernels.size(), 0);
    for (int d : new_deps)
      if (d != k && depends_on(d, k, seen)) return true;
    return false;
  }
  void add_deps(int k, const std::vector<int>& deps) {
    auto& kd = plan_.kernels[size_t(k)].deps;
    for (int d : deps)
      if (d != k && std::find(kd.begin(), kd.end(), d) == kd.end()) kd.push_back(d);
  }
  int new_kernel(KernelKind kind, int domain, uint32_t axes = 0) {
    Kernel k;
    k.kind = kind, k.domain = domain, k.axes = axes;
    plan_.kernels.push_back(std::move(k));
    return int(plan_.kernels.size()) - 1;
  }
  void assign(int id, int k) {
    kernel_of_[size_t(id)] = k;
    producers_[size_t(id)].push_back(k);
  }

  void place(int id) {
    const ir::Node& n = node(id);
    if (!plan_.materialize[size_t(id)] || n.op == Prim::input || n.op == Prim::view) return;
    PrimKind kind = prim_info(n.op).kind;
    if (kind == PrimKind::reduce) return place_reduce(id);
    if (n.op == Prim::matmul) {
      int k = new_kernel(KernelKind::matmul, id);
      add_deps(k, producers_of(g_.arg(n, 0)));
      add_deps(k, producers_of(g_.arg(n, 1)));
      plan_.kernels[size_t(k)].stores.push_back({id, id});
      return assign(id, k);
    }
    if (n.op == Prim::concat) {
      for (int a = 0; a < n.nargs; ++a) {
        int c = g_.arg(n, a);
        int k = new_kernel(KernelKind::pointwise, c);
        plan_.kernels[size_t(k)].stores.push_back({c, id, StoreInto::concat_part, a});
        add_deps(k, cone_deps(c, -1));
        assign(id, k);
      }
      return;
    }
    if (n.op == Prim::pad) {
      int fill = new_kernel(KernelKind::pointwise, id);
      plan_.kernels[size_t(fill)].stores.push_back({id, id});  // value: the pad's fill scalar
      int c = g_.arg(n, 0);
      int inner = new_kernel(KernelKind::pointwise, c);
      plan_.kernels[size_t(inner)].stores.push_back({c, id, StoreInto::pad_interior});
      add_deps(inner, cone_deps(c, -1));
      add_deps(inner, {fill});
      assign(id, fill), assign(id, inner);
      return;
    }
    place_pointwise(id);
  }

  void place_reduce(int id) {
    const ir::Node& n = node(id);
    int in = g_.arg(n, 0);
    if (fuse_) {
      for (int k = int(plan_.kernels.size()) - 1; k >= 0; --k) {
        Kernel& K = plan_.kernels[size_t(k)];
        if (K.kind != KernelKind::rows || K.axes != n.axes || !same_shape(in, K.domain)) continue;
        kernel_of_[size_t(id)] = k;  // provisional: lets the cone see sibling reductions as registers
        auto deps = cone_deps(id, k);
        if (would_cycle(deps, k) || reads_own_view(id, k)) {
          kernel_of_[size_t(id)] = -1;
          continue;
        }
        K.reduces.push_back(id);
        add_deps(k, deps);
        producers_[size_t(id)].push_back(k);
        return;
      }
    }
    int k = new_kernel(KernelKind::rows, in, n.axes);
    plan_.kernels[size_t(k)].reduces.push_back(id);
    kernel_of_[size_t(id)] = k;
    add_deps(k, cone_deps(id, k));
    producers_[size_t(id)].push_back(k);
  }

  void place_pointwise(int id) {
    // A matmul operand computed from one tensor: a kernel of its own, so that a GEMM that
    // computes it itself can leave that kernel out (find_prologues decides).
    const bool prologue = prologue_candidate(id);
    if (fuse_ && !prologue) {
      for (int k = int(plan_.kernels.size()) - 1; k >= 0; --k) {
        Kernel& K = plan_.kernels[size_t(k)];
        if (K.prologue_of != -1) continue;
        bool fits = false;
        if (K.kind == KernelKind::rows) {
          // it must actually use one of this kernel's reductions
          fits = (same_shape(id, K.domain) || same_shape(id, K.domain, K.axes)) && uses_kernel(id, k);
        } else if (K.kind == KernelKind::matmul) {
          fits = epilogues_ && same_shape(id, K.domain) && uses_kernel(id, k);  // an epilogue of the matmul
        } else if (K.kind == KernelKind::pointwise && K.stores[0].into == StoreInto::whole &&
                   node(K.stores[0].buffer).op != Prim::pad) {
          fits = same_shape(id, K.domain);
        }
        if (!fits) continue;
        kernel_of_[size_t(id)] = k;
        auto deps = cone_deps(id, k);
        if (would_cycle(deps, k) || reads_own_view(id, k)) {
          kernel_of_[size_t(id)] = -1;
          continue;
        }
        K.stores.push_back({id, id});
        add_deps(k, deps);
        producers_[size_t(id)].push_back(k);
        return;
      }
    }
    int k = new_kernel(KernelKind::pointwise, id);
    plan_.kernels[size_t(k)].stores.push_back({id, id});
    if (prologue) plan_.kernels[size_t(k)].prologue_of = kCandidate;
    assign(id, k);
    add_deps(k, cone_deps(id, k));
  }

  // Each matmul operand placed as a prologue candidate becomes its prologue where its
  // kernel computes it from one tensor of its shape and scalars (no random numbers, no
  // other tensor) and no other kernel reads it (a view of it reads its buffer): the matmul
  // kernel then loads that tensor too, and takes the scalars as params.
  static constexpr int kCandidate = -2;
  // Read once, by a matmul, and computed from one input tensor (or a view of one) of its
  // shape and scalars. NOTE: not from a value the plan computes: that value's kernel takes
  // it as a store instead (relu(x @ W1) in GEMM 1's epilogue, not GEMM 2's prologue).
  bool prologue_candidate(int id) {
    if (!fuse_ || !operand_[size_t(id)] || is_output_[size_t(id)] || uses_[size_t(id)] != 1) return false;
    int tensors = 0;
    bool ok = true;
    walk_cone(id, -1, [&](int b) {
      if (node(b).op == Prim::scalar) return;
      const bool tensor = node(b).op == Prim::input || node(b).op == Prim::view;
      ok = ok && tensor && producers_of(b).empty() && node(b).rank == node(id).rank && same_shape(b, id);
      ++tensors;
    });
    return ok && tensors == 1;
  }
  void find_prologues() {
    std::vector<int> reads(g_.nodes.size(), 0);  // kernel slots that read each buffer
    for (const Kernel& K : plan_.kernels)
      for (int l : K.loads) {
        int id = l;
        while (node(id).op == Prim::view && !plan_.materialize[size_t(id)]) id = g_.arg(node(id), 0);
        ++reads[size_t(id)];
      }
    for (size_t k = 0; k < plan_.kernels.size(); ++k) {
      Kernel& K = plan_.kernels[k];
      if (K.kind != KernelKind::matmul) continue;
      for (int s = 0; s < 2; ++s) {
        const int c = K.loads[size_t(s)];
        const auto& from = producers_[size_t(c)];
        if (from.size() != 1 || plan_.kernels[size_t(from[0])].prologue_of != kCandidate || reads[size_t(c)] != 1) continue;
        int src = -1;
        std::vector<int> scalars;
        walk_cone(c, from[0], [&](int b) { (node(b).op == Prim::scalar ? scalars.push_back(b) : void(src = b)); });
        K.prologue_slot[size_t(s)] = index_of_added(K.loads, src);
        for (int p : scalars) index_of_added(K.params, p);
        plan_.kernels[size_t(from[0])].prologue_of = int(k);
        plan_.prologue_operand[size_t(c)] = 1;
      }
    }
    for (Kernel& K : plan_.kernels)
      if (K.prologue_of == kCandidate) K.prologue_of = -1;
  }

  // An output that no kernel produces (a leaf returned as is) gets a copy kernel.
  void place_output(int o) {
    if (!producers_of(o).empty() || node(o).op == Prim::view) return;
    int k = new_kernel(KernelKind::pointwise, o);
    plan_.kernels[size_t(k)].stores.push_back({o, o});
    producers_[size_t(o)].push_back(k);
    kernel_of_[size_t(o)] = k;
  }

  // Loads, params and the pass of each reduction.
  void finish(Kernel& K) {
    int k = int(&K - plan_.kernels.data());
    auto boundary = [&](int b) {
      bool in_memory = node(b).op == Prim::input || node(b).op == Prim::view ||
                       (plan_.materialize[size_t(b)] && kernel_of_[size_t(b)] != k);
      index_of_added(in_memory ? K.loads : K.params, b);  // scalars and rand seeds travel by value
    };
    if (K.kind == KernelKind::matmul) {
      const ir::Node& n = node(K.domain);
      K.loads = {g_.arg(n, 0), g_.arg(n, 1)};  // NOTE: always slots 0 and 1, even if an epilogue reads them too
    }
    for (const Store& s : K.stores) {
      if (s.value == K.domain && K.kind == KernelKind::matmul) continue;
      if (node(s.value).op == Prim::pad && s.value == s.buffer) {
        index_of_added(K.params, s.value);  // the fill kernel stores the pad value
        continue;
      }
      if (is_leaf(s.value) || (is_load(s.value) && kernel_of_[size_t(s.value)] != k)) boundary(s.value);
      else walk_cone(s.value, k, boundary);
    }
    for (int r : K.reduces) walk_cone(r, k, boundary);
    if (K.kind == KernelKind::rows) {
      K.reduce_level.assign(K.reduces.size(), 0);
      for (size_t i = 0; i < K.reduces.size(); ++i) {  // reduces are in post-order: deps come first
        int lvl = 0;
        walk_cone_members(K.reduces[i], k, [&](int r2) {
          auto it = std::find(K.reduces.begin(), K.reduces.end(), r2);
          if (it != K.reduces.end() && *it != K.reduces[i]) lvl = std::max(lvl, K.reduce_level[size_t(it - K.reduces.begin())] + 1);
        });
        K.reduce_level[i] = lvl;
      }
      for (const Store& s : K.stores)
        K.row_level_.push_back(std::find(K.reduces.begin(), K.reduces.end(), s.value) != K.reduces.end() ||
                               (!same_shape(s.value, K.domain) && same_shape(s.value, K.domain, K.axes)));
    }
  }
  template <class F>
  void walk_cone_members(int root, int k, F&& on_member) {
    std::vector<uint8_t> seen(g_.nodes.size(), 0);
    std::vector<int> stack;
    for (int a = 0; a < node(root).nargs; ++a) stack.push_back(g_.arg(node(root), a));
    while (!stack.empty()) {
      int id = stack.back();
      stack.pop_back();
      if (seen[size_t(id)]) continue;
      seen[size_t(id)] = 1;
      if (kernel_of_[size_t(id)] == k && prim_info(node(id).op).kind == PrimKind::reduce) {
        on_member(id);
        continue;
      }
      if (is_leaf(id) || (is_load(id) && kernel_of_[size_t(id)] != k)) continue;
      const ir::Node& n = node(id);
      for (int a = 0; a < n.nargs; ++a) stack.push_back(g_.arg(n, a));
    }
  }

  // A reduction read by no other kernel and not an output lives in a register; so
  // does a matmul whose every reader is its epilogue.
  void drop_unread_stores() {
    std::vector<uint8_t> loaded(g_.nodes.size(), 0);
    for (auto& K : plan_.kernels)
      for (int l : K.loads) {
        int id = l;
        while (node(id).op == Prim::view && !plan_.materialize[size_t(id)]) loaded[size_t(id)] = 1, id = g_.arg(node(id), 0);
        loaded[size_t(id)] = 1;
      }
    auto needed = [&](int r) {
      bool stored_as_output = is_output_[size_t(r)];
      for (size_t v = 0; v < g_.nodes.size(); ++v) {  // an output view of it needs the buffer too
        if (!is_output_[v]) continue;
        int id = int(v);
        while (node(id).op == Prim::view) id = g_.arg(node(id), 0);
        stored_as_output |= id == r;
      }
      return loaded[size_t(r)] || stored_as_output;
    };
    for (auto& K : plan_.kernels) {
      for (int r : K.reduces) {
        if (needed(r)) {
          K.stores.push_back({r, r});
          K.row_level_.push_back(1);
        } else {
          plan_.materialize[size_t(r)] = 0;
        }
      }
      if (K.kind == KernelKind::matmul && K.stores.size() > 1 && !needed(K.domain)) {
        K.stores.erase(K.stores.begin());  // the matmul's own store comes first
        plan_.materialize[size_t(K.domain)] = 0;
      }
    }
  }

  // Kernels in dependency order (stable: creation order where free).
  // NOTE: running each reduction right after the kernels that write its input (while the L2
  // holds part of it) made no difference to W4's step on an H200 (branch sched-locality;
  // docs/benchmarks.md, twenty-sixth session).
  void order() {
    size_t n = plan_.kernels.size();
    std::vector<int> state(n, 0), out;
    std::vector<int> remap(n, -1);
    auto visit = [&](auto& self, int k) -> void {
      if (state[size_t(k)] == 2) return;
      if (state[size_t(k)] == 1) throw Error("kiln: internal error: cyclic kernel graph");
      state[size_t(k)] = 1;
      for (int d : plan_.kernels[size_t(k)].deps) self(self, d);
      state[size_t(k)] = 2;
      remap[size_t(k)] = int(out.size());
      out.push_back(k);
    };
    for (size_t k = 0; k < n; ++k) visit(visit, int(k));
    std::vector<Kernel> sorted;
    for (int k : out) sorted.push_back(std::move(plan_.kernels[size_t(k)]));
    for (auto& K : sorted) {
      for (int& d : K.deps) d = remap[size_t(d)];
      if (K.prologue_of >= 0) K.prologue_of = remap[size_t(K.prologue_of)];
    }
    plan_.kernels = std::move(sorted);
  }

  const ir::Graph& g_;
  bool fuse_, epilogues_;
  detail::SymShapes sym_;
  Plan plan_;
  std::vector<std::vector<int>> producers_;
  std::vector<int> kernel_of_;
  std::vector<uint8_t> is_output_;
  std::vector<uint8_t> live_;     // per node: an output is computed from it
  std::vector<uint8_t> operand_;  // per node: an operand of a matmul
  std::vector<int> uses_;         // per node: arguments of other nodes that name it
};

}  // namespace detail

// fuse=false is eager mode: one kernel per primitive, through the same JIT and cache.
// fuse: false for eager mode (a kernel per op); epilogues: kiln::epilogue_fusion().
inline Plan schedule(const ir::Graph& g, bool fuse, bool epilogues = true) { return detail::Scheduler(g, fuse, epilogues).run(); }

inline std::string Plan::describe(const ir::Graph& g) const {
  std::string s;
  static const char* kinds[] = {"pointwise", "rows", "matmul"};
  for (size_t i = 0; i < kernels.size(); ++i) {
    const Kernel& k = kernels[i];
    s += "kernel " + std::to_string(i) + " (" + kinds[int(k.kind)] +
         (k.kind == KernelKind::matmul ? " %" + std::to_string(k.domain) : "") +
         (k.prologue_of >= 0 ? ", prologue of kernel " + std::to_string(k.prologue_of) : "") + "): stores";
    for (const Store& st : k.stores) s += " %" + std::to_string(st.value) + ":" + std::string(prim_info(g.nodes[size_t(st.value)].op).name);
    if (!k.reduces.empty()) {
      s += "; reduces";
      for (size_t r = 0; r < k.reduces.size(); ++r)
        s += " %" + std::to_string(k.reduces[r]) + "@pass" + std::to_string(k.reduce_level[r]);
    }
    s += "; loads";
    for (int l : k.loads) s += " %" + std::to_string(l);
    for (int a = 0; a < 2; ++a)
      if (k.prologue_slot[size_t(a)] >= 0) s += std::string(a ? "; B" : "; A") + " computed from %" + std::to_string(k.loads[size_t(k.prologue_slot[size_t(a)])]);
    s += "\n";
  }
  if (!g.tangents.empty()) s += memory_report(g, remat).str();
  return s;
}

}  // namespace kiln::sched
