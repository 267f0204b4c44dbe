// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Codegen, the part every dialect shares. Takes a Graph, a Plan and one kernel;
// gives the kernel's argument layout (slots and params) and the statements that
// compute its values, written once from the primitive table. Dialects
// (codegen/cpp.hpp, codegen/gpu.hpp) wrap these statements in their loops.
#pragma once
#include <cctype>
#include <functional>
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
  std::vector<int> epilogue_slots;  // matmul: the slots its epilogue reads or writes
  bool epilogue_heavy = false;      // matmul: its epilogue computes two transcendentals, or one and reads a matrix (MatmulEpilogue::heavy)
};

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
      const std::string& A = params_;
      if (n.op == Prim::iota)
        rhs = "(" + type + ")(" + index(slot_of(id, SlotRole::rand)) + ")";
      else if (n.op == Prim::rand)
        rhs = "(" + type + ")kiln_philox_uniform(" + A + "[" + std::to_string(w) + "], " + A + "[" + std::to_string(w + 1) +
              "] + (uint64_t)(" + index(slot_of(id, SlotRole::rand)) + "))";
      else
        rhs = "(" + type + ")kiln_bits_to_f64(" + A + "[" + std::to_string(w) + "])";
    } else if (int q = other_param_of(id); q >= 0 && n.op != Prim::rand && n.op != Prim::iota) {
      rhs = "(" + type + ")kiln_bits_to_f64(" + other_.array + "[" + std::to_string(other_.layout->param_words[size_t(q)]) + "])";
    } else if (n.op == Prim::cast) {
      rhs = "(" + type + ")(" + value(g_.arg(n, 0), out, indent, load, index) + ")";
    } else if (is_pointwise(n.op)) {
      std::string args[3];
      for (int a = 0; a < n.nargs; ++a) args[a] = value(g_.arg(n, a), out, indent, load, index);
      rhs = n.op == Prim::div && by_reciprocal(n) ? "(" + args[0] + " * kiln_recip(" + args[1] + "))"
                                                  : substitute(prim_info(n.op).src, args);
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
  // Where this kernel's params are read: its argument struct's words (A), or another array.
  void params_from(std::string array) { params_ = std::move(array); }
  // The scalar params of another kernel, whose arithmetic this one also does (a GEMM that computes
  // a rows kernel's total: GpuVariant::total_kernel), read from `array`, that kernel's words.
  void other_params(const sched::Kernel& k, const Layout& l, std::string array) { other_ = {&k, &l, std::move(array)}; }
  // Floating divisions by a value that is the same for the whole row (a reduction, or
  // arithmetic on reductions and scalars) become products with its reciprocal: one
  // division per row (the compiler hoists it) instead of one per element. The result may
  // differ from the quotient by an ulp (and a divisor below about 3e-38 in f32 makes the
  // reciprocal infinite). The GPU rows kernels ask for it.
  void reciprocal_of_row_values() {
    find_row_values();
    by_reciprocal_ = true;
  }
  // Marks the values the same for the whole row (reductions, scalars, arithmetic on them):
  // row_level() then answers.
  void find_row_values() {
    row_value_.assign(g_.nodes.size(), 0);
    for (int r : k_.reduces) row_value_[size_t(r)] = 1;
    for (size_t id = 0; id < g_.nodes.size(); ++id) {  // post-order: arguments first
      const ir::Node& n = g_.nodes[id];
      if (row_value_[id] || slot_of(int(id), SlotRole::load) >= 0) continue;
      if (param_of(int(id)) >= 0) {
        row_value_[id] = n.op != Prim::rand && n.op != Prim::iota;
        continue;
      }
      bool all = (is_pointwise(n.op) || n.op == Prim::cast) && n.nargs > 0;
      for (int a = 0; a < n.nargs && all; ++a) all = row_value_[size_t(g_.arg(n, a))];
      row_value_[id] = all;
    }
  }
  // After find_row_values: whether node id is the same for the whole row.
  bool row_level(int id) const { return !row_value_.empty() && row_value_[size_t(id)]; }
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
  int other_param_of(int id) const {
    for (size_t p = 0; other_.kernel && p < other_.kernel->params.size(); ++p)
      if (other_.kernel->params[p] == id) return int(p);
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
  std::string params_ = "A";
  struct {
    const sched::Kernel* kernel = nullptr;
    const Layout* layout = nullptr;
    std::string array;
  } other_;
  std::vector<uint8_t> row_value_;  // find_row_values: per node, the same for the whole row
  bool by_reciprocal_ = false;      // reciprocal_of_row_values

  bool by_reciprocal(const ir::Node& n) const {
    DType d = n.dtype;
    bool floating = d == DType::f32 || d == DType::f64 || d == DType::f16 || d == DType::bf16;
    // NOTE: a row's own value divided (a variance by its count, say) stays a quotient: it is computed once anyway.
    return floating && by_reciprocal_ && row_value_[size_t(g_.arg(n, 1))] && !row_value_[size_t(g_.arg(n, 0))];
  }
};

// A stored element to compute type and back (both dialects' device code has these helpers).
inline std::string to_compute(DType d, const std::string& e) {
  if (d == DType::bf16) return "kiln_bf16_to_f32(" + e + ")";
  if (d == DType::f16) return "kiln_f16_to_f32(" + e + ")";
  return e;
}
// Element u of a register array of 16-byte loads, in the compute type (bf16 through its
// 32-bit word: kiln_bf16_at).
inline std::string vec_element(DType d, const std::string& array, const std::string& u) {
  if (d == DType::bf16) return "kiln_bf16_at(" + array + ", " + u + ")";
  return to_compute(d, array + "[" + u + "]");
}
inline std::string to_storage(DType d, const std::string& v) {
  if (d == DType::bf16) return "kiln_f32_to_bf16(" + v + ")";
  if (d == DType::f16) return "kiln_f32_to_f16(" + v + ")";
  return "(" + storage_type(d) + ")(" + v + ")";
}

// The seam between a GEMM loop and the rest of its kernel: every GEMM a dialect
// emits (codegen/cpp.hpp's, codegen/gemm.hpp's) finishes output element
// (row, col) with store(row, col, v), which writes the matmul's own store if the
// plan keeps it and every epilogue output (bias, activation, residual, cast:
// sched/schedule.hpp). The kernel's meta is [nd, K, sizes[nd], strides[slot][nd]]
// (slots 0 and 1: the operands). prelude() declares, once per batch entry:
//   est       the slot strides (slot i, dim d: est[i * nd + d])
//   p<i>      each slot's typed pointer
//   e<i>      each slot's offset for this batch entry
// and needs nd, sz (M + 2), P and A in scope; store() needs the prelude's names.
class MatmulEpilogue {
 public:
  MatmulEpilogue(const ir::Graph& g, const sched::Kernel& k, const Layout& l) : g_(g), k_(k), l_(l) {}

  DType dtype() const { return g_.nodes[size_t(k_.domain)].dtype; }
  // GpuVariant::total_kernel: every element stored also adds `node`, a pointwise value over the
  // epilogue's (the rows kernel `rows`'s arithmetic, its params read from TA, its words), into
  // the register `acc`.
  void total(int node, const sched::Kernel& rows, const Layout& rows_layout, std::string acc) {
    total_ = {node, &rows, &rows_layout, std::move(acc)};
  }
  // GpuVariant::colsum_slot: the value each element stores to `slot` (compute type, before its
  // rounding to the slot's dtype) is also added where store()'s or store_group()'s `sum` says.
  void column_sum(int slot) { colsum_slot_ = slot; }
  // `batch`: a flat index over the dims before the last two; `restrict_kw`: the dialect's spelling.
  std::string prelude(const std::string& batch, const std::string& restrict_kw, const std::string& ind) const {
    std::string s = ind + "const int64_t* est = sz + nd;\n", acc;
    for (size_t i = 0; i < l_.slots.size(); ++i) {
      std::string si = std::to_string(i);
      if (l_.slots[i].role != SlotRole::rand) {
        std::string t = storage_type(g_.nodes[size_t(l_.slots[i].node)].dtype);
        std::string ptr = (l_.slots[i].role == SlotRole::store ? "" : "const ") + t + "*";
        s += ind + ptr + " " + restrict_kw + " p" + si + " = (" + ptr + ")P[" + si + "]; (void)p" + si + ";\n";
      }
      s += ind + "int64_t e" + si + " = 0;\n";
      acc += " e" + si + " += ix * est[" + si + " * nd + d];";
    }
    return s + ind + "{ int64_t rr = " + batch + "; for (int d = nd - 3; d >= 0; --d) { const int64_t ix = rr % sz[d]; rr /= sz[d];" +
           acc + " } }\n";
  }
  // Statements that store output element (row, col) given the accumulator `v`.
  // `unit_cols`: every slot of store_slots() has column stride 1 (a dialect that
  // tested it gets contiguous addressing).
  // `sum`: with column_sum(), the variable that the summed slot's value is added to ("": none).
  std::string store(const std::string& row, const std::string& col, const std::string& v, const std::string& ind,
                    bool unit_cols = false, const std::string& sum = "") const {
    std::vector<uint8_t> used;
    return emit_store(row, col, v, ind, unit_cols, used, sum);
  }
  // The statements of `width` consecutive output elements (row, col .. col + width - 1),
  // accumulators vals[0 .. width - 1], where every slot store_slots() names walks the
  // columns with stride cls[slot]: unit (one vector access of width elements: the host
  // checked the alignment, kiln_vec) or zero (broadcast along the row: one element).
  // `loads` declares offsets and issues the loads (named after `tag`), so a writer can
  // put them out early; `body` computes and stores. rand slots are not supported here. `sum`:
  // with column_sum(), an array whose element u takes the summed slot's value of element u.
  struct Group {
    std::string loads, body;
    int load_bytes = 0;  // of the vector loads (what a writer keeps in flight per group)
  };
  Group store_group(const std::string& row, const std::string& col, const std::string& vals, int width,
                    const std::vector<Stride>& cls, const std::string& tag, const std::string& ind, const std::string& sum = "") const {
    Group out;
    std::string W = std::to_string(width);
    auto name = [&](const char* what, int i) { return std::string(what) + tag + "_" + std::to_string(i); };
    auto vec = [&](int i) { return "kiln_vec<" + storage_type(dtype_of_slot(i)) + ", " + W + ">"; };
    for (int i : l_.epilogue_slots) {
      std::string si = std::to_string(i), x = name("x", i);
      bool unit = cls[size_t(i)] == Stride::unit;
      out.loads += ind + "const int64_t " + x + " = e" + si + " + (" + row + ") * est[" + si + " * nd + nd - 2]" +
                   (unit ? " + (" + col + ")" : "") + ";\n";
      if (l_.slots[size_t(i)].role == SlotRole::load && unit) out.load_bytes += width * int(info(dtype_of_slot(i)).bytes);
      if (l_.slots[size_t(i)].role == SlotRole::load)
        out.loads += ind + "const " + (unit ? vec(i) : storage_type(dtype_of_slot(i))) + " " + name("L", i) + " = " +
                     (unit ? "kiln_vec_load<" + storage_type(dtype_of_slot(i)) + ", " + W + ">(p" + si + " + " + x + ")" : "p" + si + "[" + x + "]") +
                     ";\n";
      else if (l_.slots[size_t(i)].role == SlotRole::store)
        out.body += ind + vec(i) + " " + name("S", i) + ";\n";
    }
    Access a;
    a.load = [&](int i) {
      return cls[size_t(i)] == Stride::unit ? vec_element(dtype_of_slot(i), name("L", i) + ".v", "u")
                                            : to_compute(dtype_of_slot(i), name("L", i));
    };
    a.index = [&](int) -> std::string { throw Error("kiln: internal error: a random or iota value in a grouped GEMM epilogue"); };
    a.store = [&](int i, const std::string& v) { return name("S", i) + ".v[u] = " + v; };
    out.body += ind + "#pragma unroll\n" + ind + "for (int u = 0; u < " + W + "; ++u) {\n";
    out.body += emit(vals + "[u]", ind + "  ", a, sum.empty() ? "" : "(" + sum + ")[u]") + ind + "}\n";
    for (int i : l_.epilogue_slots)
      if (l_.slots[size_t(i)].role == SlotRole::store)
        out.body += ind + "kiln_vec_store(p" + std::to_string(i) + " + " + name("x", i) + ", " + name("S", i) + ");\n";
    return out;
  }
  // What the epilogue computes per output element, as a short hex hash of its
  // statements with the values renamed in order of first use (v3, v17 -> v0, v1) and
  // the rank and size-1 dims of each tensor it reads or writes (a bias vector against a
  // residual matrix): the same for one epilogue wherever its kernel sits in a graph,
  // different when the ops, dtypes or operands differ. The tuning database keys a
  // matmul on it (its cost depends on the epilogue).
  std::string identity() const {
    const std::string code = store("i", "j", "acc", "");
    std::string canonical;
    for (int i : store_slots()) {
      const ir::Node& n = g_.nodes[size_t(l_.slots[size_t(i)].node)];
      canonical += "slot " + std::to_string(i) + " rank " + std::to_string(n.rank) + " ones " + std::to_string(n.ones) + "\n";
    }
    std::unordered_map<std::string, std::string> renamed;
    auto word = [&](size_t i) { return std::isalnum(static_cast<unsigned char>(code[i])) || code[i] == '_'; };
    for (size_t i = 0; i < code.size();) {
      size_t end = i + 1;
      while (code[i] == 'v' && (i == 0 || !word(i - 1)) && end < code.size() && std::isdigit(static_cast<unsigned char>(code[end]))) ++end;
      if (end > i + 1 && (end == code.size() || !word(end))) {
        std::string fresh = "v" + std::to_string(renamed.size());
        canonical += renamed.emplace(code.substr(i, end - i), fresh).first->second;
      } else {
        canonical.append(code, i, end - i);
      }
      i = end;
    }
    return Hasher().add(std::string_view(canonical)).digest().hex().substr(0, 12);
  }
  // Whether the epilogue is long enough for warps of its own (GemmConfig::split_epilogue): two
  // transcendental function calls an element (erf, exp, tanh, ...: tens of instructions each),
  // or one behind a load of a whole matrix (no size-1 dim: not a bias or a per-row scale), which
  // a GEMM's own warps pay with the tensor cores idle. NOTE: on an H200 a split epilogue paid for
  // W4's dh = dy @ W2.t() * gelu'(pre) (1.59 against 1.66 ms) and for its forward GEMM storing
  // gelu(u) and gelu'(u) (erf and exp; the step 0.4-0.8% faster back to back, three rounds); not
  // for gelu(x @ W1 + b1) alone (1.50 against 1.48 ms), nor for dy @ W2.t() * gelu'(u) read from
  // memory (no transcendental): docs/benchmarks.md, sixth and twenty-seventh sessions.
  // Reads the layout's epilogue_slots (layout() sets them first).
  bool heavy() const {
    bool matrix = false;
    for (int i : l_.epilogue_slots) {
      const ir::Node& n = g_.nodes[size_t(l_.slots[size_t(i)].node)];
      matrix = matrix || (l_.slots[size_t(i)].role == SlotRole::load && n.rank >= 2 && n.ones == 0);
    }
    const std::string code = store("0", "0", "0", "");
    int calls = 0;
    for (const char* f : {"kiln_exp", "kiln_log", "kiln_sin(", "kiln_cos(", "kiln_tanh(", "kiln_erf(", "kiln_pow("})
      for (size_t at = code.find(f); at != std::string::npos; at = code.find(f, at + 1)) ++calls;
    return calls >= 2 || (matrix && calls >= 1);
  }
  // The slots that store() reads or writes.
  std::vector<int> store_slots() const {
    std::vector<uint8_t> used;
    emit_store("0", "0", "0", "", false, used);
    std::vector<int> out;
    for (size_t i = 0; i < used.size(); ++i)
      if (used[i]) out.push_back(int(i));
    return out;
  }

 private:
  // How the statements of one element reach memory: a loaded slot's value (compute type),
  // a rand/iota slot's linear index, a stored slot's assignment.
  struct Access {
    std::function<std::string(int)> load, index;
    std::function<std::string(int, const std::string&)> store;
  };
  DType dtype_of_slot(int i) const { return g_.nodes[size_t(l_.slots[size_t(i)].node)].dtype; }
  // The matmul's value `v`, the epilogue's values over it, its stores (and `sum` += the summed slot's).
  std::string emit(const std::string& v, const std::string& ind, const Access& a, const std::string& sum = "") const {
    ValueEmitter ve(g_, k_, l_);
    const ir::Node& mm = g_.nodes[size_t(k_.domain)];
    std::string body = ind + "const " + compute_type(mm.dtype) + " v" + std::to_string(k_.domain) + " = (" + compute_type(mm.dtype) + ")(" + v + ");\n";
    ve.bind(k_.domain, "v" + std::to_string(k_.domain));
    std::string tail;
    for (size_t s = 0; s < k_.stores.size(); ++s) {
      std::string val = ve.value(k_.stores[s].value, body, ind, a.load, a.index);
      tail += ind + a.store(slot_of_store(int(s)), to_storage(g_.nodes[size_t(k_.stores[s].buffer)].dtype, val)) + ";\n";
      if (!sum.empty() && slot_of_store(int(s)) == colsum_slot_) tail += ind + sum + " += " + val + ";\n";
    }
    if (total_.node >= 0) {
      ve.other_params(*total_.rows, *total_.layout, "TA");
      tail += ind + total_.acc + " += " + ve.value(total_.node, body, ind, a.load, a.index) + ";\n";
    }
    return body + tail;
  }
  std::string emit_store(const std::string& row, const std::string& col, const std::string& v, const std::string& ind, bool unit_cols,
                         std::vector<uint8_t>& used, const std::string& sum = "") const {
    used.assign(l_.slots.size(), 0);
    auto at = [&](int i) {
      used[size_t(i)] = 1;
      return "x" + std::to_string(i);
    };
    Access a;
    a.load = [&](int i) { return to_compute(dtype_of_slot(i), "p" + std::to_string(i) + "[" + at(i) + "]"); };
    a.index = at;
    a.store = [&](int i, const std::string& val) { return "p" + std::to_string(i) + "[" + at(i) + "] = " + val; };
    std::string body = emit(v, ind, a, sum), offs;
    for (size_t i = 0; i < used.size(); ++i) {
      if (!used[i]) continue;
      std::string si = std::to_string(i);
      offs += ind + "const int64_t x" + si + " = e" + si + " + (" + row + ") * est[" + si + " * nd + nd - 2] + (" + col + ")" +
              (unit_cols ? "" : " * est[" + si + " * nd + nd - 1]") + ";\n";
    }
    return offs + body;
  }

  int slot_of_store(int s) const {
    for (size_t i = 0; i < l_.slots.size(); ++i)
      if (l_.slots[i].role == SlotRole::store && l_.slots[i].store == s) return int(i);
    return -1;
  }
  const ir::Graph& g_;
  const sched::Kernel& k_;
  const Layout& l_;
  struct {
    int node = -1;
    const sched::Kernel* rows = nullptr;
    const Layout* layout = nullptr;
    std::string acc;
  } total_;
  int colsum_slot_ = -1;
};

// A matmul operand's prologue (Kernel::prologue_slot) as a function of one element x of
// the tensor it reads (that tensor's storage type) and the params A: the operand's value
// in the compute type, rounded to its dtype first, as a store of it would (so the GEMM
// multiplies what the operand's own kernel would have stored). `qualifiers` open the
// definition (a dialect's `static __device__ inline`).
inline std::string matmul_prologue(const ir::Graph& g, const sched::Kernel& k, const Layout& l, int operand, const std::string& name,
                                   const std::string& qualifiers) {
  const int slot = k.prologue_slot[size_t(operand)];
  const ir::Node& mm = g.nodes[size_t(k.domain)];
  const int c = g.arg(mm, operand);
  const DType d = g.nodes[size_t(c)].dtype, src = g.nodes[size_t(l.slots[size_t(slot)].node)].dtype;
  Layout inner = l;  // the operand is computed here, not loaded
  inner.slots[0].node = inner.slots[1].node = -1;
  ValueEmitter ve(g, k, inner);
  std::string body;
  auto load = [&](int s) -> std::string {
    if (s != slot) throw Error("kiln: internal error: a matmul prologue reads a second tensor");
    return to_compute(src, "x");
  };
  auto index = [](int) -> std::string { throw Error("kiln: internal error: a random or iota value in a matmul prologue"); };
  const std::string v = ve.value(c, body, "  ", load, index);
  return qualifiers + " " + compute_type(d) + " " + name + "(const " + storage_type(src) + " x, const uint64_t* A) {\n  (void)A;\n" + body +
         "  return " + (d == DType::bf16 || d == DType::f16 ? to_compute(d, to_storage(d, v)) : "(" + compute_type(d) + ")(" + to_storage(d, v) + ")") +
         ";\n}\n";
}

// Each slot's place in a kernel's argument struct, per param its first word.
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
  // NOTE: which slots a matmul's epilogue touches, found once per plan (it generates the code).
  if (k.kind == sched::KernelKind::matmul) {
    MatmulEpilogue ep(g, k, l);
    l.epilogue_slots = ep.store_slots();
    l.epilogue_heavy = ep.heavy();
  }
  return l;
}

// Reduction combine and identity, in the accumulator's type.
inline std::string reduce_identity(Prim op, DType d) {
  std::string t = compute_type(d);
  if (op == Prim::sum) return "(" + t + ")0";
  bool is_float = info(d).is_float;
  if (op == Prim::amax) return is_float ? "(" + t + ")(-INFINITY)" : "(" + t + ")(" + (d == DType::i32 ? "INT32_MIN" : "INT64_MIN") + ")";
  return is_float ? "(" + t + ")(INFINITY)" : "(" + t + ")(" + (d == DType::i32 ? "INT32_MAX" : "INT64_MAX") + ")";
}

}  // namespace kiln::codegen
