// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Codegen, the part every dialect shares. Takes a Graph, a Plan and one kernel;
// gives the kernel's argument layout (slots and params) and the statements that
// compute its values, written once from the primitive table. Dialects
// (codegen/cpp.hpp, codegen/gpu.hpp) wrap these statements in their loops.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/sched/schedule.hpp"

namespace kiln::codegen {

inline std::string compute_type(DType d) { return std::string(info(d).compute_src); }
inline std::string storage_type(DType d) { return std::string(info(d).storage_src); }

// Where each run-time fact of a kernel travels.
// Slots are strided memory (and rand counters) over the kernel's domain; params
// are 64-bit words (a scalar as double bits, a rand seed and offset).
enum class SlotRole : uint8_t { load, store, rand };  // rand: a counter slot (rand, iota)
struct Slot {
  int node;
  SlotRole role;
  int store = -1;  // index into kernel.stores for stores
};
struct Layout {
  std::vector<Slot> slots;
  std::vector<int> param_words;  // per params entry: first word
  int words = 0;
};

inline Layout layout(const ir::Graph& g, const sched::Kernel& k) {
  Layout l;
  for (int n : k.loads) l.slots.push_back({n, SlotRole::load});
  for (size_t s = 0; s < k.stores.size(); ++s) l.slots.push_back({k.stores[s].buffer, SlotRole::store, int(s)});
  for (int p : k.params) {
    l.param_words.push_back(l.words);
    Prim op = g.nodes[size_t(p)].op;
    l.words += op == Prim::rand ? 2 : op == Prim::iota ? 0 : 1;
    if (op == Prim::rand || op == Prim::iota) l.slots.push_back({p, SlotRole::rand});
  }
  return l;
}

// How a slot is indexed along the innermost dim: fixed in the source as a
// constant (0: broadcast, 1: contiguous) or read at run time. Each combination
// is its own compiled variant.
enum class Stride : uint8_t { zero = 0, unit = 1, any = 2 };

// Emits the statements for values of one kernel, one scope at a time (a pass
// of a rows kernel is a scope). `load(slot)` and `index(slot)` come from the
// dialect: an expression that reads slot's element, and its linear position.
class ValueEmitter {
 public:
  ValueEmitter(const ir::Graph& g, const sched::Kernel& k, const Layout& l) : g_(g), k_(k), l_(l) {}

  template <class LoadFn, class IndexFn>
  std::string value(int id, std::string& out, const std::string& indent, LoadFn&& load, IndexFn&& index) {
    if (auto it = names_.find(id); it != names_.end()) return it->second;
    const ir::Node& n = g_.nodes[size_t(id)];
    std::string name = "v" + std::to_string(id), type = compute_type(n.dtype), rhs;
    if (int s = slot_of(id, SlotRole::load); s >= 0) {
      rhs = load(s);
    } else if (int p = param_of(id); p >= 0) {
      int w = l_.param_words[size_t(p)];
      if (n.op == Prim::iota)
        rhs = "(" + type + ")(" + index(slot_of(id, SlotRole::rand)) + ")";
      else if (n.op == Prim::rand)
        rhs = "(" + type + ")kiln_philox_uniform(A[" + std::to_string(w) + "], A[" + std::to_string(w + 1) +
              "] + (uint64_t)(" + index(slot_of(id, SlotRole::rand)) + "))";
      else
        rhs = "(" + type + ")kiln_bits_to_f64(A[" + std::to_string(w) + "])";
    } else if (n.op == Prim::cast) {
      rhs = "(" + type + ")(" + value(g_.arg(n, 0), out, indent, load, index) + ")";
    } else if (is_pointwise(n.op)) {
      std::string args[3];
      for (int a = 0; a < n.nargs; ++a) args[a] = value(g_.arg(n, a), out, indent, load, index);
      rhs = substitute(prim_info(n.op).src, args);
    } else {
      throw Error("kiln: internal error: node %" + std::to_string(id) + " (" +
                  std::string(prim_info(n.op).name) + ") has no value in this kernel");
    }
    out += indent + "const " + type + " " + name + " = " + rhs + ";\n";
    names_[id] = name;
    return name;
  }
  // Names a value computed elsewhere (a reduction's register).
  void bind(int id, std::string name) { names_[id] = std::move(name); }
  // Scopes nest: values of an outer scope stay visible in inner ones.
  std::unordered_map<int, std::string> save() const { return names_; }
  void restore(std::unordered_map<int, std::string> names) { names_ = std::move(names); }

  int slot_of(int id, SlotRole role) const {
    for (size_t s = 0; s < l_.slots.size(); ++s)
      if (l_.slots[s].node == id && l_.slots[s].role == role) return int(s);
    return -1;
  }
  int param_of(int id) const {
    for (size_t p = 0; p < k_.params.size(); ++p)
      if (k_.params[p] == id) return int(p);
    return -1;
  }

  static std::string substitute(std::string_view src, const std::string* args) {
    std::string out;
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '{' && i + 2 < src.size() && src[i + 2] == '}') {
        out += args[src[i + 1] - '0'];
        i += 2;
      } else {
        out += src[i];
      }
    }
    return out;
  }

 private:
  const ir::Graph& g_;
  const sched::Kernel& k_;
  const Layout& l_;
  std::unordered_map<int, std::string> names_;
};

// Reduction combine and identity, in the accumulator's type.
inline std::string reduce_identity(Prim op, DType d) {
  std::string t = compute_type(d);
  if (op == Prim::sum) return "(" + t + ")0";
  bool is_float = info(d).is_float;
  if (op == Prim::amax) return is_float ? "(" + t + ")(-INFINITY)" : "(" + t + ")(" + (d == DType::i32 ? "INT32_MIN" : "INT64_MIN") + ")";
  return is_float ? "(" + t + ")(INFINITY)" : "(" + t + ")(" + (d == DType::i32 ? "INT32_MAX" : "INT64_MAX") + ")";
}

}  // namespace kiln::codegen
