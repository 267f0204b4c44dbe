// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Run-time binding, shared by every backend. Takes a Graph (this call's sizes,
// strides, pointers, scalar values) and its Plan; allocates the buffers the plan
// materializes (a matmul prologue's operand only where its own kernel runs: the
// backend calls allocate_buffer) and gives, per kernel, the slot pointers, the domain (dims
// permuted for reductions, then coalesced), the strides of every slot over it,
// the params, and the variant (how each slot strides along the innermost dim).
#pragma once
#include <array>
#include <cstring>
#include <vector>

#include "kiln/codegen/kernel.hpp"
#include "kiln/runtime/bound.hpp"

namespace kiln::runtime {

struct KernelArgs {
  std::vector<void*> ptrs;
  std::vector<int64_t> meta;
  std::vector<uint64_t> words;
  std::vector<codegen::Stride> strides;
  int64_t work = 0;  // elements in the domain (0: nothing to launch)
  void* column_sums = nullptr;  // matmul: where its GEMM stores a rows kernel's sums (GpuVariant::colsum_slot)
  void* total = nullptr;        // matmul: where its GEMM stores a rows kernel's total (GpuVariant::total_kernel)
  std::vector<uint64_t> total_words;  // and that rows kernel's params
  // meta is [nd, no (matmul: K), sizes[nd], strides[slot][nd]]: dim d's size, slot's stride there.
  int64_t size(int d) const { return meta[size_t(2 + d)]; }
  int64_t stride(size_t slot, int d) const { return meta[size_t(2 + meta[0]) + slot * size_t(meta[0]) + size_t(d)]; }
};

inline View apply_view(const View& in, const ir::Node& n, DType dt) {
  View v = in;
  v.rank = n.rank, v.shape = n.shape;
  const ViewAttrs& a = *n.view;
  size_t es = info(dt).bytes;
  switch (a.kind) {
    case ViewKind::permute:
      for (int i = 0; i < n.rank; ++i) v.strides[i] = in.strides[size_t(a.perm[i])];
      break;
    case ViewKind::slice:
      v.ptr += a.start * in.strides[size_t(a.dim)] * int64_t(es);
      v.strides[size_t(a.dim)] *= a.step;
      break;
    case ViewKind::reshape: {  // the input is a fresh contiguous buffer
      int64_t acc = 1;
      for (int i = n.rank - 1; i >= 0; --i) v.strides[size_t(i)] = acc, acc *= n.shape[size_t(i)];
      break;
    }
  }
  return v;
}

// The buffer a matmul prologue's own kernel stores (the operand), or -1: a kernel that is
// not a prologue.
inline int prologue_operand(const sched::Kernel& k) { return k.prologue_of >= 0 ? k.stores[0].buffer : -1; }

// Gives node id (its view contiguous already) a buffer of the device's memory.
inline void allocate_buffer(const ir::Graph& g, int id, Bound& b) {
  const ir::Node& n = g.nodes[size_t(id)];
  b.storage[size_t(id)] = std::make_shared<Storage>(size_t(n.numel()) * info(n.dtype).bytes, g.device);
  b.views[size_t(id)].ptr = static_cast<char*>(b.storage[size_t(id)]->data());
}

// Every materialized node's buffer but the prologues' operands: those get their strides
// and a null pointer, for the GEMMs that compute them as they load their sources never
// read them (the CPU's always; a GPU's SIMT kind, and mfma on 16-bit sources).
inline Bound bind_buffers(const ir::Graph& g, const sched::Plan& p) {
  Bound b;
  b.storage.resize(g.nodes.size());
  b.views.resize(g.nodes.size());
  for (size_t id = 0; id < g.nodes.size(); ++id) {
    const ir::Node& n = g.nodes[id];
    View& v = b.views[id];
    v.rank = n.rank, v.shape = n.shape;
    size_t es = info(n.dtype).bytes;
    if (n.op == Prim::input) {
      v.ptr = static_cast<char*>(n.storage->data()) + n.elem_offset * int64_t(es);
      v.strides = n.strides;
    } else if (p.materialize[id]) {
      int64_t acc = 1;
      for (int i = n.rank - 1; i >= 0; --i) v.strides[size_t(i)] = acc, acc *= n.shape[size_t(i)];
      if (!p.prologue_operand[id]) allocate_buffer(g, int(id), b);
    } else if (n.op == Prim::view) {
      int c = g.arg(n, 0);
      v = apply_view(b.views[size_t(c)], n, n.dtype);
      b.storage[id] = b.storage[size_t(c)];
    }
  }
  return b;
}

// The region a store writes: the whole buffer, a concat operand's slice, or a pad's interior.
inline View store_view(const ir::Graph& g, const sched::Store& s, const Bound& b) {
  View v = b.views[size_t(s.buffer)];
  const ir::Node& buf = g.nodes[size_t(s.buffer)];
  size_t es = info(buf.dtype).bytes;
  if (s.into == sched::StoreInto::concat_part) {
    int64_t start = 0;
    for (int a = 0; a < s.part; ++a) start += g.child(buf, a).shape[size_t(buf.dim)];
    v.ptr += start * v.strides[size_t(buf.dim)] * int64_t(es);
    v.shape = g.child(buf, s.part).shape;
  } else if (s.into == sched::StoreInto::pad_interior) {
    for (int i = 0; i < buf.rank; ++i) v.ptr += buf.pad->before[size_t(i)] * v.strides[size_t(i)] * int64_t(es);
    v.shape = g.child(buf, 0).shape;
  }
  return v;
}

namespace detail {
// Strides of view v over a domain of rank r (right-aligned; broadcast dims are 0).
inline ir::Dims aligned_strides(const View& v, const ir::Dims& dom, int r) {
  ir::Dims s{};
  for (int i = 0; i < r; ++i) {
    int j = i - (r - v.rank);
    s[size_t(i)] = j >= 0 && v.shape[size_t(j)] != 1 ? v.strides[size_t(j)] : 0;
    if (j >= 0 && v.shape[size_t(j)] != dom[size_t(i)] && v.shape[size_t(j)] != 1)
      throw Error("kiln: internal error: a slot's shape does not broadcast to its kernel's domain");
  }
  return s;
}
inline ir::Dims contiguous(const ir::Node& n) {
  ir::Dims s{};
  int64_t acc = 1;
  for (int i = n.rank - 1; i >= 0; --i) s[size_t(i)] = acc, acc *= n.shape[size_t(i)];
  return s;
}
}  // namespace detail

// Binds kernel k into `a`, reusing its vectors' memory: a backend that keeps its
// KernelArgs from call to call allocates nothing here once they have grown.
inline void bind_kernel(const ir::Graph& g, const sched::Kernel& k, const codegen::Layout& l, const Bound& b, KernelArgs& a) {
  size_t ns = l.slots.size();
  // NOTE: this thread's scratch, grown once: no allocation per call.
  thread_local std::vector<View> sv;
  thread_local std::vector<ir::Dims> st, strides;
  sv.assign(ns, View{});
  a.ptrs.clear(), a.meta.clear(), a.words.clear(), a.strides.clear();
  a.ptrs.reserve(ns);
  a.strides.reserve(ns);
  a.meta.reserve(2 + (ns + 1) * kMaxRank);
  for (size_t i = 0; i < ns; ++i) {
    const codegen::Slot& s = l.slots[i];
    if (s.role == codegen::SlotRole::store) sv[i] = store_view(g, k.stores[size_t(s.store)], b);
    else if (s.role == codegen::SlotRole::load) sv[i] = b.views[size_t(s.node)];
    else {
      const ir::Node& n = g.nodes[size_t(s.node)];
      sv[i].rank = n.rank, sv[i].shape = n.shape, sv[i].strides = detail::contiguous(n);
      if (n.op == Prim::iota) sv[i].strides = {}, sv[i].strides[size_t(n.dim)] = 1;
    }
    a.ptrs.push_back(sv[i].ptr);
  }
  for (int p : k.params) {
    const ir::Node& n = g.nodes[size_t(p)];
    if (n.op == Prim::rand) {
      a.words.push_back(n.seed), a.words.push_back(n.offset);
    } else if (n.op != Prim::iota) {
      uint64_t w;
      std::memcpy(&w, &n.value, 8);
      a.words.push_back(w);
    }
  }
  const ir::Node& dn = g.nodes[size_t(k.domain)];

  if (k.kind == sched::KernelKind::matmul) {  // meta: [nd, K, sizes[nd], strides[slot][nd]]
    const ir::Node& A = g.child(dn, 0);
    int nd = dn.rank;
    int64_t K = A.shape[size_t(A.rank - 1)];
    a.meta = {nd, K};
    for (int i = 0; i < nd; ++i) a.meta.push_back(dn.shape[size_t(i)]);
    for (size_t s = 0; s < ns; ++s)  // every slot right-aligned to the output's rank, broadcast dims 0
      for (int i = 0; i < nd; ++i) {
        int j = i - (nd - sv[s].rank);
        a.meta.push_back(j >= 0 && sv[s].shape[size_t(j)] != 1 ? sv[s].strides[size_t(j)] : 0);
      }
    auto cls = [](int64_t s) { return s == 1 ? codegen::Stride::unit : codegen::Stride::any; };
    a.strides.assign(ns, codegen::Stride::any);
    a.strides[0] = cls(sv[0].strides[size_t(sv[0].rank - 1)]);
    a.strides[1] = cls(sv[1].strides[size_t(sv[1].rank - 1)]);
    a.work = dn.numel() * std::max<int64_t>(K, 1);  // K = 0 still writes zeros
    return;
  }

  // Domain dims: for rows, outer (kept) dims first, then reduced ones.
  int r = dn.rank;
  std::array<int, kMaxRank> order{};
  int nouter = 0;
  for (int i = 0; i < r; ++i)
    if (!((k.axes >> i) & 1u)) order[size_t(nouter++)] = i;
  for (int i = 0, n = nouter; i < r; ++i)
    if ((k.axes >> i) & 1u) order[size_t(n++)] = i;
  ir::Dims dom = dn.shape;
  if (k.kind == sched::KernelKind::pointwise && k.stores[0].into != sched::StoreInto::whole)
    dom = g.nodes[size_t(k.stores[0].value)].shape;

  // Drop size-1 dims, merge neighbours that every slot walks contiguously. strides[i]:
  // slot i's strides over the merged dims, first the slot's own over the domain.
  st.assign(ns, ir::Dims{}), strides.assign(ns, ir::Dims{});
  for (size_t i = 0; i < ns; ++i) st[i] = detail::aligned_strides(sv[i], dom, r);
  std::array<int64_t, kMaxRank> sizes{};
  std::array<int, kMaxRank> group{};
  int nd = 0;
  for (int idx = 0; idx < r; ++idx) {
    int d = order[size_t(idx)], grp = idx < nouter ? 0 : 1;
    if (dom[size_t(d)] == 1) continue;
    bool merge = nd > 0 && group[size_t(nd - 1)] == grp;
    for (size_t i = 0; merge && i < ns; ++i) merge = strides[i][size_t(nd - 1)] == st[i][size_t(d)] * dom[size_t(d)];
    if (merge) {
      sizes[size_t(nd - 1)] *= dom[size_t(d)];
      for (size_t i = 0; i < ns; ++i) strides[i][size_t(nd - 1)] = st[i][size_t(d)];
    } else {
      sizes[size_t(nd)] = dom[size_t(d)];
      group[size_t(nd)] = grp;
      for (size_t i = 0; i < ns; ++i) strides[i][size_t(nd)] = st[i][size_t(d)];
      ++nd;
    }
  }
  int no = 0;
  for (int i = 0; i < nd; ++i) no += group[size_t(i)] == 0;
  a.meta.push_back(nd), a.meta.push_back(no);
  a.meta.insert(a.meta.end(), sizes.begin(), sizes.begin() + nd);
  for (size_t i = 0; i < ns; ++i) a.meta.insert(a.meta.end(), strides[i].begin(), strides[i].begin() + nd);
  bool has_inner = k.kind == sched::KernelKind::rows ? nd > no : nd > 0;
  for (size_t i = 0; i < ns; ++i) {
    int64_t s = has_inner ? strides[i][size_t(nd - 1)] : 0;
    a.strides.push_back(s == 0 ? codegen::Stride::zero : s == 1 ? codegen::Stride::unit : codegen::Stride::any);
  }
  a.work = 1;
  for (int i = 0; i < r; ++i) a.work *= dom[size_t(i)];
  if (k.kind == sched::KernelKind::rows) {
    int64_t outer = 1;
    for (int i = 0; i < r; ++i)
      if (!((k.axes >> i) & 1u)) outer *= dom[size_t(i)];
    a.work = std::max(a.work, outer);  // an empty reduction still writes its identity
  }
}
inline KernelArgs bind_kernel(const ir::Graph& g, const sched::Kernel& k, const codegen::Layout& l, const Bound& b) {
  KernelArgs a;
  bind_kernel(g, k, l, b, a);
  return a;
}

}  // namespace kiln::runtime
