// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Lowering, step 2a: what a training step's backward reads from its forward, and what
// it computes again (AOTAutograd's min-cut rematerialisation). Takes a Graph whose
// gradient seeds are marked (Graph::tangents; kiln::grad marks them) and the values the
// plan keeps in memory anyway; gives the forward values the backward reads (saved) and
// the forward pointwise values it recomputes.
//
// The rule. The backward reads some forward values; it may load each one, or recompute
// it from values further up. Pointwise arithmetic is free next to memory traffic, so a
// choice costs the bytes it moves: a value in memory anyway (a leaf tensor, a matmul or
// reduction output, a matmul operand, an output) costs one read; any other pointwise
// value, and a matmul output that only its epilogue reads, costs its write in the forward
// plus its read in the backward. Matmuls, reductions, concat and pad are never recomputed;
// among choices of the same bytes, the one that recomputes the fewest transcendental ops.
// The cheapest set of values that cuts every path from what the forward has in memory to
// what the backward reads is a minimum cut of the DAG with node capacities (each node
// split in -> out), found by max-flow; it is exact for this cost model, whatever the graph.
// NOTE: bytes are this graph's sizes. A plan is built once per signature, so other sizes
// reuse the choice, as torch.compile's partitioner decides on its size hints.
#pragma once
#include <limits>
#include <string>
#include <vector>

#include "kiln/ir/graph.hpp"

namespace kiln::sched {

struct Remat {
  std::vector<int> saved;       // forward values the backward loads
  std::vector<int> recomputed;  // forward pointwise values the backward computes again
};

namespace detail {

// Dinic's max-flow; after run(), reachable(s) is the source side of a minimum cut.
class MaxFlow {
 public:
  static constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;
  explicit MaxFlow(int n) : head_(size_t(n), -1) {}
  void edge(int a, int b, int64_t cap) {
    e_.push_back({b, head_[size_t(a)], cap}), head_[size_t(a)] = int(e_.size()) - 1;
    e_.push_back({a, head_[size_t(b)], 0}), head_[size_t(b)] = int(e_.size()) - 1;
  }
  void run(int s, int t) {
    while (bfs(s)[size_t(t)] >= 0) {
      it_ = head_;
      while (push(s, t, kInf) > 0) {}
    }
  }
  std::vector<uint8_t> reachable(int s) {
    std::vector<uint8_t> r;
    for (int l : bfs(s)) r.push_back(l >= 0);
    return r;
  }

 private:
  struct Edge {
    int to, next;
    int64_t cap;
  };
  const std::vector<int>& bfs(int s) {
    level_.assign(head_.size(), -1);
    std::vector<int> q{s};
    level_[size_t(s)] = 0;
    for (size_t i = 0; i < q.size(); ++i)
      for (int j = head_[size_t(q[i])]; j >= 0; j = e_[size_t(j)].next)
        if (e_[size_t(j)].cap > 0 && level_[size_t(e_[size_t(j)].to)] < 0)
          level_[size_t(e_[size_t(j)].to)] = level_[size_t(q[i])] + 1, q.push_back(e_[size_t(j)].to);
    return level_;
  }
  int64_t push(int v, int t, int64_t f) {
    if (v == t) return f;
    for (int& j = it_[size_t(v)]; j >= 0; j = e_[size_t(j)].next) {
      Edge& e = e_[size_t(j)];
      if (e.cap <= 0 || level_[size_t(e.to)] != level_[size_t(v)] + 1) continue;
      if (int64_t d = push(e.to, t, std::min(f, e.cap)); d > 0) {
        e.cap -= d, e_[size_t(j ^ 1)].cap += d;
        return d;
      }
    }
    return 0;
  }
  std::vector<Edge> e_;
  std::vector<int> head_, it_, level_;
};

}  // namespace detail

inline int64_t value_bytes(const ir::Node& n) { return n.numel() * int64_t(info(n.dtype).bytes); }

// Per node: 1 where the node is on the backward side (a gradient seed or computed from one).
inline std::vector<uint8_t> backward_nodes(const ir::Graph& g) {
  std::vector<uint8_t> bwd(g.nodes.size(), 0);
  for (int t : g.tangents) bwd[size_t(t)] = 1;
  for (size_t id = 0; id < g.nodes.size(); ++id)  // post-order: operands come first
    for (int a = 0; a < g.nodes[id].nargs; ++a) bwd[id] |= bwd[size_t(g.arg(g.nodes[id], a))];
  return bwd;
}
// Per node: 1 where an output is computed from it (the tracer's rewrites leave nodes that none is).
inline std::vector<uint8_t> live_nodes(const ir::Graph& g) {
  std::vector<uint8_t> live(g.nodes.size(), 0);
  for (int o : g.outputs) live[size_t(o)] = 1;
  for (size_t id = g.nodes.size(); id-- > 0;)
    if (live[id])
      for (int a = 0; a < g.nodes[id].nargs; ++a) live[size_t(g.arg(g.nodes[id], a))] = 1;
  return live;
}
// Per node: 1 where a forward value is an operand of a live backward node (what a gradient
// rule reads: everything PyTorch's eager autograd would save).
inline std::vector<uint8_t> backward_reads(const ir::Graph& g, const std::vector<uint8_t>& bwd, const std::vector<uint8_t>& live) {
  std::vector<uint8_t> reads(g.nodes.size(), 0);
  for (size_t id = 0; id < g.nodes.size(); ++id)
    if (bwd[id] && live[id])
      for (int a = 0; a < g.nodes[id].nargs; ++a)
        if (int c = g.arg(g.nodes[id], a); !bwd[size_t(c)]) reads[size_t(c)] = 1;
  return reads;
}

// A matmul output that only pointwise nodes read and that is no output of the graph: its
// kernel's epilogue computes them from it without storing it, so saving it costs a write too.
inline std::vector<uint8_t> epilogue_only_matmuls(const ir::Graph& g, const std::vector<uint8_t>& live) {
  std::vector<uint8_t> only(g.nodes.size(), 0);
  for (size_t id = 0; id < g.nodes.size(); ++id) only[id] = g.nodes[id].op == Prim::matmul;
  for (size_t id = 0; id < g.nodes.size(); ++id)
    for (int a = 0; live[id] && a < g.nodes[id].nargs; ++a)
      if (!is_pointwise(g.nodes[id].op)) only[size_t(g.arg(g.nodes[id], a))] = 0;
  for (int o : g.outputs) only[size_t(o)] = 0;
  return only;
}

// The minimum cut described at the top. Bytes decide; among cuts of the same bytes, the one
// that recomputes the fewest transcendental ops (each recomputed one costs a unit below a
// byte's worth): W4's backward saves gelu'(u), which the forward computes beside erf(u k)
// anyway, not x @ W1 to compute erf and exp from again. in_memory: per node, the plan stores it anyway.
inline Remat partition(const ir::Graph& g, const std::vector<uint8_t>& in_memory) {
  const size_t n = g.nodes.size();
  auto bwd = backward_nodes(g);
  auto live = live_nodes(g);
  auto epilogue_only = epilogue_only_matmuls(g, live);
  auto reads = backward_reads(g, bwd, live);
  std::vector<uint8_t> needed(reads);  // forward values the backward's reads are computed from
  for (size_t id = n; id-- > 0;)
    if (needed[id])
      for (int a = 0; a < g.nodes[id].nargs; ++a) needed[size_t(g.arg(g.nodes[id], a))] = 1;

  using detail::MaxFlow;
  constexpr int64_t kByte = 1024;  // capacity units per byte; a recomputed transcendental op costs 1
  const int source = int(2 * n), sink = source + 1;
  auto in = [](size_t id) { return int(2 * id); };
  auto out = [](size_t id) { return int(2 * id + 1); };
  MaxFlow f(sink + 1);
  for (size_t id = 0; id < n; ++id) {
    if (!needed[id]) continue;
    const ir::Node& nd = g.nodes[id];
    bool constant = nd.op == Prim::scalar || nd.op == Prim::iota || nd.op == Prim::rand;
    if (epilogue_only[id] || nd.op == Prim::input || in_memory[id]) {
      // One read; a matmul output its epilogue alone reads is computed in the forward, and
      // saving it is a write and a read.
      f.edge(in(id), out(id), (epilogue_only[id] ? 2 : 1) * kByte * value_bytes(nd));
      f.edge(source, in(id), MaxFlow::kInf);
    } else if (constant || nd.op == Prim::view) {
      f.edge(in(id), out(id), MaxFlow::kInf);  // costs nothing to recompute / not a value of its own
    } else {
      f.edge(in(id), out(id), 2 * kByte * value_bytes(nd));  // written in the forward, read in the backward
      if (is_transcendental(nd.op)) f.edge(source, in(id), 1);  // paid where the backward computes it again
    }
    for (int a = 0; a < nd.nargs; ++a) f.edge(out(size_t(g.arg(nd, a))), in(id), MaxFlow::kInf);
    if (reads[id]) f.edge(out(id), sink, MaxFlow::kInf);
  }
  f.run(source, sink);
  auto side = f.reachable(source);
  Remat r;
  for (size_t id = 0; id < n; ++id) {
    if (!needed[id]) continue;
    if (side[size_t(in(id))] && !side[size_t(out(id))]) r.saved.push_back(int(id));
    else if (!side[size_t(in(id))] && is_pointwise(g.nodes[id].op)) r.recomputed.push_back(int(id));
  }
  return r;
}

// What a plan's backward reads from its forward, in bytes of this graph's sizes.
struct MemoryReport {
  struct Value {
    int node;
    std::string op;
    std::vector<int64_t> shape;
    int64_t bytes;
  };
  std::vector<Value> saved, recomputed;
  int64_t saved_bytes = 0;  // the values the backward loads
  int64_t naive_bytes = 0;  // every forward value a gradient rule reads (eager autograd's saved tensors)
  std::string str() const {
    auto list = [](const std::vector<Value>& vs, bool bytes) {
      std::string s;
      for (const Value& v : vs) {
        s += " %" + std::to_string(v.node) + ":" + v.op + "[";
        for (size_t i = 0; i < v.shape.size(); ++i) s.append(i ? "," : "").append(std::to_string(v.shape[i]));
        s += "]";
        if (bytes) s += " " + std::to_string(v.bytes) + " B";
      }
      return s;
    };
    return "saved for the backward (" + std::to_string(saved_bytes) + " B; saving every value a rule reads: " +
           std::to_string(naive_bytes) + " B):" + list(saved, true) + "\nrecomputed in the backward:" +
           list(recomputed, false) + "\n";
  }
};

inline MemoryReport memory_report(const ir::Graph& g, const Remat& r) {
  MemoryReport m;
  auto value = [&](int id) {
    const ir::Node& nd = g.nodes[size_t(id)];
    return MemoryReport::Value{id, std::string(prim_info(nd.op).name),
                               std::vector<int64_t>(nd.shape.begin(), nd.shape.begin() + nd.rank), value_bytes(nd)};
  };
  for (int id : r.saved) m.saved.push_back(value(id)), m.saved_bytes += m.saved.back().bytes;
  for (int id : r.recomputed) m.recomputed.push_back(value(id));
  auto bwd = backward_nodes(g);
  auto reads = backward_reads(g, bwd, live_nodes(g));
  for (size_t id = 0; id < g.nodes.size(); ++id) {
    Prim op = g.nodes[id].op;
    if (reads[id] && op != Prim::scalar && op != Prim::iota && op != Prim::rand) m.naive_bytes += value_bytes(g.nodes[id]);
  }
  return m;
}

}  // namespace kiln::sched
