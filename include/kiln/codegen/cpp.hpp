// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The C++ dialect (CPU backend). Takes a Graph, a Plan and the variant (how
// each slot strides along the innermost dim); gives one translation unit with an
// `extern "C"` function per kernel, loops that the host compiler vectorises
// (`omp simd`) and OpenMP across rows or chunks. Every kernel has the signature
//   void kiln_k<i>(void* const* P, const int64_t* M, const uint64_t* A)
// P: slot pointers; A: params; M: [nd, nouter, sizes[nd], strides[nslots][nd]]
// (matmul: [nd, K, sizes[nd], strides[nslots][nd]], slots 0 and 1 its operands).
#pragma once
#include <algorithm>
#include <string>

#include "kiln/codegen/device_files.hpp"
#include "kiln/codegen/kernel.hpp"

namespace kiln::codegen {

inline std::string cpp_prelude() {
  return "#include <cstdint>\n#include <cstdlib>\n#include <cstring>\n#include <cmath>\n#include <climits>\n#include <omp.h>\n"
         "#define KILN_FN inline\n"
         "static inline double kiln_bits_to_f64(uint64_t b) { double d; memcpy(&d, &b, 8); return d; }\n" +
         detail::read_device_file("cpu_math.hpp") + detail::read_device_file("philox.h") +
         // NOTE: where() without a branch: GCC turned `c ? a : b` into a branch around a's work
         // and left the element loop scalar (dropout(gelu(x)), 8192 floats: 0.36 ms, 0.061 ms so).
         "static inline float kiln_where(bool c, float a, float b) { return kiln_detail_pick(c, a, b); }\n"
         "static inline double kiln_where(bool c, double a, double b) { return kiln_detail_pick(c, a, b); }\n"
         "template <class T> static inline T kiln_where(bool c, T a, T b) { return c ? a : b; }\n"
         "static inline int32_t kiln_abs(int32_t x) { return x < 0 ? -x : x; }\n"
         "static inline int64_t kiln_abs(int64_t x) { return x < 0 ? -x : x; }\n"
         "static inline int32_t kiln_sign(int32_t x) { return (x > 0) - (x < 0); }\n"
         "static inline int64_t kiln_sign(int64_t x) { return (x > 0) - (x < 0); }\n"
         "template <class T> static inline T kiln_max(T a, T b) { return a > b ? a : b; }\n"
         "template <class T> static inline T kiln_min(T a, T b) { return a < b ? a : b; }\n"
         "static inline bool kiln_max(bool a, bool b) { return a || b; }\n"
         "static inline bool kiln_min(bool a, bool b) { return a && b; }\n"
         "#define KILN_CHUNK 8192\n";
}

class CppKernelWriter {
 public:
  CppKernelWriter(const ir::Graph& g, const sched::Kernel& k, int index, const std::vector<Stride>& strides)
      : g_(g), k_(k), l_(layout(g, k)), strides_(strides), name_("kiln_k" + std::to_string(index)) {}

  std::string write() {
    if (k_.kind == sched::KernelKind::matmul) return matmul();
    std::string s = "extern \"C\" void " + name_ + "(void* const* P, const int64_t* M, const uint64_t* A) {\n";
    // A matmul prologue's own kernel: the CPU GEMM computes the operand itself (never launched).
    if (k_.prologue_of >= 0) return s + "  (void)P; (void)M; (void)A;\n}\n";
    s += "  const int nd = (int)M[0], no = (int)M[1];\n  const int64_t* sz = M + 2;\n  const int64_t* st = M + 2 + nd;\n";
    s += "  (void)A; (void)no;\n";
    for (size_t i = 0; i < l_.slots.size(); ++i) s += slot_decl(int(i));
    s += k_.kind == sched::KernelKind::rows ? rows() : pointwise();
    return s + "}\n";
  }

 private:
  std::string slot_ptr_type(int i) const {
    const Slot& sl = l_.slots[size_t(i)];
    std::string t = storage_type(g_.nodes[size_t(sl.node)].dtype);
    return sl.role == SlotRole::store ? t + "* __restrict" : "const " + t + "* __restrict";
  }
  std::string slot_decl(int i) const {
    const Slot& sl = l_.slots[size_t(i)];
    std::string s, si = std::to_string(i);
    if (sl.role != SlotRole::rand) s += "  " + slot_ptr_type(i) + " b" + si + " = (" + slot_ptr_type(i) + ")P[" + si + "];\n";
    Stride c = strides_[size_t(i)];
    if (c == Stride::any) s += "  const int64_t s" + si + " = nd ? st[" + si + " * nd + nd - 1] : 0;\n";
    else s += "  constexpr int64_t s" + si + " = " + std::to_string(int(c)) + ";\n";
    return s;
  }
  // Offsets of every slot for the flat index `var` over dims [d0, d1).
  std::string offsets(const std::string& var, const std::string& d0, const std::string& d1, const std::string& prefix,
                      const std::string& indent) const {
    std::string s;
    for (size_t i = 0; i < l_.slots.size(); ++i) s += indent + "int64_t " + prefix + std::to_string(i) + " = 0;\n";
    s += indent + "{ int64_t rr = " + var + "; for (int d = " + d1 + " - 1; d >= " + d0 + "; --d) { const int64_t ix = rr % sz[d]; rr /= sz[d];";
    for (size_t i = 0; i < l_.slots.size(); ++i) {
      std::string si = std::to_string(i);
      s += " " + prefix + si + " += ix * st[" + si + " * nd + d];";
    }
    return s + " } }\n";
  }
  std::string load(int slot) const {
    std::string si = std::to_string(slot);
    return to_compute(g_.nodes[size_t(l_.slots[size_t(slot)].node)].dtype, "q" + si + "[j * s" + si + "]");
  }
  std::string index(int slot) const {
    std::string si = std::to_string(slot);
    return "(q" + si + " + j * s" + si + ")";
  }
  std::string store(const sched::Store& st, int slot, const std::string& v) const {
    std::string si = std::to_string(slot);
    return "q" + si + "[j * s" + si + "] = " + to_storage(g_.nodes[size_t(st.buffer)].dtype, v) + ";\n";
  }
  // Per-slot base pointers for a chunk: q<i> = b<i> + o<i> (+ i<i>); rand slots carry a counter.
  std::string bases(const std::string& indent, bool inner) const {
    std::string s;
    for (size_t i = 0; i < l_.slots.size(); ++i) {
      std::string si = std::to_string(i), off = "o" + si + (inner ? " + i" + si : "");
      if (l_.slots[i].role == SlotRole::rand) s += indent + "const int64_t q" + si + " = " + off + ";\n";
      else s += indent + slot_ptr_type(int(i)) + " q" + si + " = b" + si + " + " + off + ";\n";
    }
    return s;
  }
  int slot_of_store(size_t s) const {
    for (size_t i = 0; i < l_.slots.size(); ++i)
      if (l_.slots[i].role == SlotRole::store && l_.slots[i].store == int(s)) return int(i);
    return -1;
  }
  template <class Pred>
  std::string stores_where(ValueEmitter& ve, const std::string& indent, Pred&& pred) {
    std::string body, tail;
    auto ld = [&](int s) { return load(s); };
    auto ix = [&](int s) { return index(s); };
    for (size_t s = 0; s < k_.stores.size(); ++s) {
      if (!pred(s)) continue;
      std::string v = ve.value(k_.stores[s].value, body, indent, ld, ix);
      tail += indent + store(k_.stores[s], slot_of_store(s), v);
    }
    return body + tail;
  }

  // The values that `roots` read which are the same at every element of a loop (scalars, a
  // row's reductions from earlier passes, arithmetic on them: ve.row_level), as statements
  // at `indent` before it, named in `ve` for the loop's body. NOTE: in a row's lambda GCC
  // did not hoist a scalar read through the captured A out of an `omp simd` reduction loop:
  // it gathered A[0] at every step (var_mean's second pass, 3x slower than Eigen per core).
  std::string loop_invariants(ValueEmitter& ve, const std::vector<int>& roots, const std::string& indent) const {
    const std::vector<uint8_t> needed = reached(ve, roots);
    std::string out;
    auto none = [](int) -> std::string { throw Error("kiln: internal error: a loop invariant reads an element"); };
    for (size_t id = 0; id < g_.nodes.size(); ++id)  // post-order: arguments first
      if (needed[id] && ve.row_level(int(id))) ve.value(int(id), out, indent, none, none);
    return out;
  }
  // Whether computing `roots` at an element of a loop evaluates a transcendental (the loop's
  // own work: not loads, earlier reductions nor loop invariants).
  bool transcendental_in(const ValueEmitter& ve, const std::vector<int>& roots) const {
    const std::vector<uint8_t> needed = reached(ve, roots);
    for (size_t id = 0; id < g_.nodes.size(); ++id)
      if (needed[id] && !ve.row_level(int(id)) && is_transcendental(g_.nodes[id].op)) return true;
    return false;
  }
  // The nodes that computing `roots` at an element reads, down to its loads and the row's
  // reductions (bound to r<id>), as a mask over the graph.
  std::vector<uint8_t> reached(const ValueEmitter& ve, std::vector<int> roots) const {
    std::vector<uint8_t> needed(g_.nodes.size(), 0);
    while (!roots.empty()) {
      int id = roots.back();
      roots.pop_back();
      if (needed[size_t(id)] || ve.slot_of(id, SlotRole::load) >= 0) continue;
      needed[size_t(id)] = 1;
      if (std::find(k_.reduces.begin(), k_.reduces.end(), id) != k_.reduces.end()) continue;  // bound to r<id>
      const ir::Node& n = g_.nodes[size_t(id)];
      for (int a = 0; a < n.nargs; ++a) roots.push_back(g_.arg(n, a));
    }
    return needed;
  }

  std::string pointwise() {
    ValueEmitter ve(g_, k_, l_);
    ve.find_row_values();
    std::string s;
    s += "  const int64_t inner = nd ? sz[nd - 1] : 1;\n  int64_t rows = 1;\n  for (int d = 0; d + 1 < nd; ++d) rows *= sz[d];\n";
    s += "  if (inner == 0 || rows == 0) return;\n";
    s += "  const int64_t cpr = (inner + KILN_CHUNK - 1) / KILN_CHUNK;\n";
    s += "  auto chunk = [&](int64_t c) {\n";
    s += "    const int64_t r = c / cpr, j0 = (c % cpr) * KILN_CHUNK, j1 = j0 + KILN_CHUNK < inner ? j0 + KILN_CHUNK : inner;\n";
    s += offsets("r", "0", "nd - 1", "o", "    ");
    s += bases("    ", false);
    std::vector<int> values;
    for (const sched::Store& st : k_.stores) values.push_back(st.value);
    s += loop_invariants(ve, values, "    ");
    s += "#pragma omp simd\n    for (int64_t j = j0; j < j1; ++j) {\n";
    s += stores_where(ve, "      ", [](size_t) { return true; });
    s += "    }\n  };\n";
    return s + serial_or_parallel("rows * cpr", "chunk", "rows * inner > 32768");
  }

  // `for (i < n) body(i)`, in parallel when `cond` holds. NOTE: not `omp parallel for if(cond)`:
  // a region its `if` turns off still makes a libgomp team of one, about 2 µs a call.
  static std::string serial_or_parallel(const std::string& n, const std::string& body, const std::string& cond) {
    std::string loop = "    for (int64_t i = 0; i < " + n + "; ++i) " + body + "(i);\n";
    return "  if (" + cond + ") {\n#pragma omp parallel for schedule(static)\n" + loop + "  } else {\n" + loop + "  }\n";
  }

  // A pass over one row: plain when the rows themselves run in parallel, else its chunks in
  // parallel. NOTE: never a parallel region nested in the row loop: even one that its `if`
  // turns off costs a libgomp team per row per pass.
  static std::string in_rows_or_parallel(const std::string& loop, const std::string& clauses) {
    return "    if (par_rows) {\n" + loop + "    } else {\n#pragma omp parallel for schedule(static)" + clauses + "\n" + loop +
           "    }\n";
  }

  std::string rows() {
    ValueEmitter ve(g_, k_, l_);
    ve.find_row_values();
    std::string s;
    int passes = 0;
    for (int lvl : k_.reduce_level) passes = std::max(passes, lvl + 1);
    s += "  int64_t outer = 1, irows = 1;\n  for (int d = 0; d < no; ++d) outer *= sz[d];\n";
    s += "  for (int d = no; d + 1 < nd; ++d) irows *= sz[d];\n";
    s += "  const int64_t inner = nd > no ? sz[nd - 1] : 1;\n  if (outer == 0) return;\n";
    s += "  const int64_t cpr = inner ? (inner + KILN_CHUNK - 1) / KILN_CHUNK : 0, nchunk = irows * cpr;\n";
    s += "  const bool par_rows = outer >= omp_get_max_threads() || outer * nchunk < 2 * omp_get_max_threads() || irows * inner < 16384;\n";
    s += "  (void)par_rows;\n";
    s += "  auto row = [&](int64_t r) {\n";
    s += offsets("r", "0", "no", "o", "    ");
    auto ld = [&](int sl) { return load(sl); };
    auto ix = [&](int sl) { return index(sl); };
    for (int p = 0; p < passes; ++p) {
      std::vector<size_t> mine;
      for (size_t i = 0; i < k_.reduces.size(); ++i)
        if (k_.reduce_level[i] == p) mine.push_back(i);
      std::vector<int> args;
      for (size_t i : mine) args.push_back(g_.arg(g_.nodes[size_t(k_.reduces[i])], 0));
      // A float pass of cheap elements keeps partials, p<id>[lanes] (128 bytes: two AVX-512
      // registers): one accumulator waits out the add's latency at every vector (var_mean
      // 1.15x slower; four registers were no faster, and spilled beside bf16 stores).
      // NOTE: not where an element computes a transcendental: its constants and the unrolled
      // body then spill (softmax's sum of exp 5-10% slower).
      bool partials = !transcendental_in(ve, args), wide = false;
      for (size_t i : mine) {
        const DType d = g_.nodes[size_t(k_.reduces[i])].dtype;
        partials &= info(d).is_float;
        wide |= d == DType::f64;
      }
      const std::string lanes = wide ? "16" : "32";
      // Per pass: the element's statements (body), its fold into the accumulators (upd) or
      // into the partials (upd_p), the partials' start (init) and their fold into the
      // accumulators (combine); OpenMP's clauses for the accumulators and the NaN counts.
      std::string acc_clauses, nan_clauses, body, upd, upd_p, init, combine;
      for (size_t i : mine) {
        const ir::Node& n = g_.nodes[size_t(k_.reduces[i])];
        const std::string sid = std::to_string(k_.reduces[i]), t = compute_type(n.dtype);
        s += "    " + t + " a" + sid + " = " + reduce_identity(n.op, n.dtype) + ";\n";
        acc_clauses += std::string(" reduction(") + (n.op == Prim::sum ? "+" : n.op == Prim::amax ? "max" : "min") + ":a" + sid + ")";
        // NOTE: OpenMP's max/min combiners drop NaN; a float amax/amin counts NaNs apart and is NaN if any.
        if (n.op != Prim::sum && info(n.dtype).is_float) {
          s += "    int64_t n" + sid + " = 0;\n";
          nan_clauses += " reduction(+:n" + sid + ")";
        }
        if (partials)
          init += "      " + t + " p" + sid + "[" + lanes + "];\n      for (int l = 0; l < " + lanes + "; ++l) p" + sid + "[l] = " +
                  reduce_identity(n.op, n.dtype) + ";\n";
      }
      s += loop_invariants(ve, args, "    ");
      auto saved = ve.save();
      for (size_t i : mine) {
        const ir::Node& n = g_.nodes[size_t(k_.reduces[i])];
        const std::string sid = std::to_string(k_.reduces[i]), part = "p" + sid + "[l]";
        const std::string v = ve.value(g_.arg(n, 0), body, "          ", ld, ix);
        auto fold = [&](const std::string& a, const std::string& x) {
          if (n.op == Prim::sum) return a + " += " + x + ";\n";
          return a + " = " + x + (n.op == Prim::amax ? " > " : " < ") + a + " ? " + x + " : " + a + ";\n";
        };
        upd += "          " + fold("a" + sid, v);
        upd_p += "          " + fold(part, v);
        combine += "        " + fold("a" + sid, part);
        if (n.op != Prim::sum && info(n.dtype).is_float) {
          const std::string count = "          n" + sid + " += " + v + " != " + v + ";\n";
          upd += count, upd_p += count;
        }
      }
      const std::string clauses = acc_clauses + nan_clauses;
      ve.restore(saved);
      std::string loop = "    for (int64_t c = 0; c < nchunk; ++c) {\n";
      loop += "      const int64_t ir = c / cpr, j0 = (c % cpr) * KILN_CHUNK, j1 = j0 + KILN_CHUNK < inner ? j0 + KILN_CHUNK : inner;\n";
      loop += offsets("ir", "no", "nd - 1", "i", "      ");
      loop += bases("      ", true);
      std::string first = "j0";
      if (partials) {
        loop += init + "      int64_t jb = j0;\n      for (; jb + " + lanes + " <= j1; jb += " + lanes + ") {\n";
        loop += "#pragma omp simd" + nan_clauses + "\n        for (int64_t l = 0; l < " + lanes + "; ++l) {\n          const int64_t j = jb + l;\n";
        loop += body + upd_p + "        }\n      }\n";
        // NOTE: `omp simd`: a plain loop would add the partials one by one, in sequence.
        loop += "#pragma omp simd" + acc_clauses + "\n      for (int l = 0; l < " + lanes + "; ++l) {\n" + combine + "      }\n";
        first = "jb";
      }
      loop += "#pragma omp simd" + clauses + "\n      for (int64_t j = " + first + "; j < j1; ++j) {\n" + body + upd + "      }\n    }\n";
      s += in_rows_or_parallel(loop, clauses);
      for (size_t i : mine) {
        int id = k_.reduces[i];
        const ir::Node& n = g_.nodes[size_t(id)];
        std::string t = compute_type(n.dtype), sid = std::to_string(id);
        if (n.op != Prim::sum && info(n.dtype).is_float)
          s += "    const " + t + " r" + sid + " = n" + sid + " ? (" + t + ")NAN : a" + sid + ";\n";
        else
          s += "    const " + t + " r" + sid + " = a" + sid + ";\n";
        ve.bind(id, std::string("r").append(std::to_string(id)));  // NOTE: not "r" + ..., GCC 12's false -Wrestrict (PR 105329)
      }
    }
    bool any_full = false;
    for (size_t i = 0; i < k_.stores.size(); ++i) any_full |= !k_.row_level_[i];
    if (any_full) {
      std::vector<int> values;
      for (size_t i = 0; i < k_.stores.size(); ++i)
        if (!k_.row_level_[i]) values.push_back(k_.stores[i].value);
      s += loop_invariants(ve, values, "    ");
      auto saved = ve.save();
      std::string loop = "    for (int64_t c = 0; c < nchunk; ++c) {\n";
      loop += "      const int64_t ir = c / cpr, j0 = (c % cpr) * KILN_CHUNK, j1 = j0 + KILN_CHUNK < inner ? j0 + KILN_CHUNK : inner;\n";
      loop += offsets("ir", "no", "nd - 1", "i", "      ");
      loop += bases("      ", true);
      loop += "#pragma omp simd\n      for (int64_t j = j0; j < j1; ++j) {\n";
      loop += stores_where(ve, "        ", [&](size_t i) { return !k_.row_level_[i]; });
      loop += "      }\n    }\n";
      s += in_rows_or_parallel(loop, "");
      ve.restore(saved);
    }
    // Row-level stores: once per row, at inner index 0 (their inputs do not vary along it).
    s += "    {\n" + bases("      ", false) + "      const int64_t j = 0;\n";
    s += stores_where(ve, "      ", [&](size_t i) { return bool(k_.row_level_[i]); });
    s += "      (void)j;\n    }\n  };\n";
    return s + serial_or_parallel("outer", "row", "par_rows && outer > 1 && outer * irows * inner > 32768");
  }

  // The blocked GEMM of codegen/device/cpu_gemm.hpp; every C element leaves through `store`, which
  // runs the epilogue (MatmulEpilogue::store): the matmul's own store if kept, and the fused consumers.
  std::string matmul() {
    MatmulEpilogue ep(g_, k_, l_);
    DType d = ep.dtype();
    std::string acc = d == DType::f64 ? "double" : info(d).is_float ? "float" : "int64_t", st = storage_type(d);
    std::string widen = d == DType::bf16 ? "KILN_GEMM_BF16" : d == DType::f16 ? "KILN_GEMM_F16" : "KILN_GEMM_PLAIN";
    auto unit_or = [&](size_t slot, const std::string& e) { return strides_.size() > slot && strides_[slot] == Stride::unit ? "1" : e; };
    std::string unit_cols;  // every slot the epilogue touches walks the columns contiguously
    for (int i : ep.store_slots()) unit_cols += (unit_cols.empty() ? "" : " && ") + std::string("est[") + std::to_string(i) + " * nd + nd - 1] == 1";
    // Each operand from its slot, read through its reader: a prologue's function of the
    // tensor it computes the operand from (always: the CPU GEMM packs through registers), else widened.
    std::string s, reader[2], type[2];
    int slot[2];
    for (int o = 0; o < 2; ++o) {
      const int sl = k_.prologue_slot[size_t(o)];
      slot[o] = sl >= 0 ? sl : o;
      type[o] = sl >= 0 ? storage_type(g_.nodes[size_t(l_.slots[size_t(sl)].node)].dtype) : st;
      reader[o] = "KilnGemmRead<" + widen + ", " + acc + ">";
      if (sl < 0) continue;
      const std::string fn = name_ + (o ? "_pb" : "_pa");
      s += matmul_prologue(g_, k_, l_, o, fn, "static inline");
      s += "struct " + fn + "_read { const uint64_t* A; " + acc + " operator()(" + type[o] + " x) const { return " + fn + "(x, A); } };\n";
      reader[o] = fn + "_read";
    }
    s += "extern \"C\" void " + name_ + "(void* const* P, const int64_t* M, const uint64_t* A) {\n";
    s += "  const int nd = (int)M[0];\n  const int64_t K = M[1];\n  const int64_t* sz = M + 2;\n";
    const std::string sa = std::to_string(slot[0]), sb = std::to_string(slot[1]);
    s += "  const int64_t* sa = sz + nd * (1 + " + sa + "); const int64_t* sb = sz + nd * (1 + " + sb + ");\n";
    s += "  int64_t batch = 1; for (int d = 0; d + 2 < nd; ++d) batch *= sz[d];\n";
    s += "  const int64_t Mr = sz[nd - 2], N = sz[nd - 1];\n  if (batch * Mr * N == 0) return;\n";
    s += "  int64_t* oa = (int64_t*)malloc(size_t(2 * batch) * sizeof(int64_t)); int64_t* ob = oa + batch;\n";
    s += "  for (int64_t b = 0; b < batch; ++b) {\n    oa[b] = ob[b] = 0;\n";
    s += "    int64_t rr = b; for (int d = nd - 3; d >= 0; --d) { const int64_t ix = rr % sz[d]; rr /= sz[d]; oa[b] += ix * sa[d]; ob[b] += ix * sb[d]; }\n  }\n";
    s += "  struct Args { void* const* P; const int64_t* M; const uint64_t* A; } args{P, M, A};\n";
    s += "  auto store = [](const void* ctx, int64_t b, int64_t i0, int64_t j, int64_t m, int64_t n, const " + acc + "* v, int64_t ldv) {\n";
    s += "    void* const* P = ((const Args*)ctx)->P; const int64_t* M = ((const Args*)ctx)->M; const uint64_t* A = ((const Args*)ctx)->A;\n";
    s += "    const int nd = (int)M[0]; const int64_t* sz = M + 2; (void)A;\n";
    s += ep.prelude("b", "__restrict", "    ");
    // Contiguous columns get contiguous addressing (vector loads and stores), the rest gathers.
    auto loop = [&](bool unit) {
      return "      for (int64_t r = 0; r < m; ++r) {\n        const int64_t i = i0 + r; const " + acc + "* row = v + r * ldv;\n" +
             "#pragma omp simd\n        for (int64_t t = 0; t < n; ++t) {\n" + ep.store("i", "j + t", "row[t]", "          ", unit) +
             "        }\n      }\n";
    };
    s += "    if (" + (unit_cols.empty() ? std::string("true") : unit_cols) + ") {\n" + loop(true) + "    } else {\n" + loop(false) + "    }\n  };\n";
    auto init = [&](int o) { return reader[o] + (k_.prologue_slot[size_t(o)] >= 0 ? "{A}" : "{}"); };
    s += "  KilnGemm<" + type[0] + ", " + type[1] + ", " + acc + ", " + reader[0] + ", " + reader[1] + "> g{batch, Mr, N, K, (const " +
         type[0] + "*)P[" + sa + "], oa, sa[nd - 2], " + unit_or(size_t(slot[0]), "sa[nd - 1]") + ", (const " + type[1] + "*)P[" + sb +
         "], ob, sb[nd - 2], " + unit_or(size_t(slot[1]), "sb[nd - 1]") + ", {store, &args}, " + init(0) + ", " + init(1) + "};\n";
    return s + "  g.run();\n  free(oa);\n}\n";
  }

  const ir::Graph& g_;
  const sched::Kernel& k_;
  Layout l_;
  const std::vector<Stride>& strides_;
  std::string name_;
};

// One translation unit for every kernel of a plan. `strides[k][slot]`.
inline std::string cpp_source(const ir::Graph& g, const sched::Plan& plan, const std::vector<std::vector<Stride>>& strides) {
  std::string src = cpp_prelude();
  for (const sched::Kernel& k : plan.kernels)
    if (k.kind == sched::KernelKind::matmul) {
      src += detail::read_device_file("cpu_gemm.hpp");
      break;
    }
  for (size_t k = 0; k < plan.kernels.size(); ++k) src.append("\n").append(CppKernelWriter(g, plan.kernels[k], int(k), strides[k]).write());
  return src;
}

}  // namespace kiln::codegen
