// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The front door. Takes expressions; traces them to a Graph; has the engine
// (runtime/eval.hpp) find or build the Plan for the graph's signature and run it;
// gives Tensors. kiln::compile(fn) wraps a callable. evaluate_many takes run-time
// lists of expressions too (one plan for N parameters); copy_into / assign write
// results into existing tensors (optimiser steps).
//
// The engine is reached only through the few functions declared KILN_ENGINE_API
// below. By default they are inline and this header brings the engine along: one
// include, nothing to build or link. With KILN_SEPARATE_ENGINE defined in every file
// of a program, a model's files see only the declarations, and the program's one
// engine file (src/engine.cpp, which the CMake target kiln::engine compiles) defines
// them: the engine (scheduler, code generators, JIT, GPU runtimes) is compiled once
// per program instead of once per file that includes kiln.
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/core/options.hpp"
#include "kiln/ir/graph.hpp"
#include "kiln/runtime/bound.hpp"
#include "kiln/runtime/counters.hpp"
#include "kiln/runtime/profile.hpp"
#include "kiln/sched/remat.hpp"

#ifdef KILN_SEPARATE_ENGINE
#define KILN_ENGINE_API
#else
#define KILN_ENGINE_API inline
#endif

namespace kiln {

// eager: one kernel per primitive (the baseline, and an explicit fallback);
// fused: kiln's fusion (the default), each GEMM's configuration by a heuristic;
// max_autotune: the fused plan, each matmul kernel's GEMM (its tile configs, and
// cuBLASLt where it computes the kernel exactly) timed on the GPU once per shape
// class, dtype, layout and architecture, the fastest kept in the tuning database
// (tune/db.hpp) and never retuned; where the whole plan then runs no faster with the
// tuned choices than with the heuristic's, the heuristic's are kept instead. Its
// launches replay as a graph, as reduce_overhead's (but for a call with a GEMM in
// cuBLASLt: kernel by kernel). On the CPU it is fused mode:
// the CPU GEMM's blocking is fixed per target, so there is nothing to time.
// reduce_overhead: the fused plan, its kernels launched on a GPU as one CUDA graph
// (runtime/gpu_backend.hpp): one replay a call instead of a launch per kernel. Every
// call binds fresh buffers as in fused mode and the graph takes the call's arguments
// (a node whose arguments changed is updated, a changed set of kernels or launch
// shapes rebuilds it), so outputs are never overwritten by a later call. Where the
// device has no graphs (the CPU; HIP for now) it is fused mode.
enum class Mode : uint8_t { eager, fused, max_autotune, reduce_overhead };

namespace runtime {

struct CompiledPlan;  // a graph's plan and the kernels built for it (runtime/eval.hpp)

// ---- the engine's entry points (defined in runtime/eval.hpp) ----
// The plan of a graph's signature in a mode: built on the first call, then the same one.
KILN_ENGINE_API std::shared_ptr<CompiledPlan> plan_for(const ir::Graph& g, Mode mode);
// Binds this call's buffers and runs the plan on the graph's device; gives the buffers.
KILN_ENGINE_API Bound run_plan(const ir::Graph& g, CompiledPlan& cp);
// The plan's kernels, what they compute and read (kiln::explain).
KILN_ENGINE_API std::string describe_plan(const ir::Graph& g, Mode mode);
// Its kernels, not counting matmul prologues' own (launched only for a GEMM that cannot compute them).
KILN_ENGINE_API size_t plan_kernel_count(const ir::Graph& g, Mode mode);
// What the fused plan saves for the backward and what it recomputes (kiln::explain_memory).
KILN_ENGINE_API sched::MemoryReport plan_memory_report(const ir::Graph& g);
// Nothing; its reference from every file of the front end links the engine's file, and
// with it the GPU runtimes' registrations, even into a program that only moves tensors.
KILN_ENGINE_API void link_engine();
#if defined(KILN_SEPARATE_ENGINE) && !defined(KILN_ENGINE_IMPLEMENTATION)
[[gnu::used]] static void (*const link_engine_here)() = &link_engine;
#endif

// The plans one expression type has run: a static slot per type, so a call whose
// signature the type has seen before finds its plan without the process-wide map and
// its lock (ARCHITECTURE.md, decision 1). The signature still decides: the same type
// traces to another graph when its tensors alias differently, a dim becomes 1 or the
// device kind changes, and that graph gets its own entry (up to kWays; then plan_for).
class PlanSlot {
 public:
  CompiledPlan& get(const ir::Graph& g, Mode mode) {
    const uint8_t options = plan_options();
    size_t n = used_.load(std::memory_order_acquire);
    for (size_t i = 0; i < n; ++i)
      if (entries_[i].signature == g.signature && entries_[i].mode == mode && entries_[i].options == options) return *entries_[i].plan;
    std::shared_ptr<CompiledPlan> cp = plan_for(g, mode);
    std::lock_guard lock(mu_);
    n = used_.load(std::memory_order_relaxed);
    if (n < kWays) {
      entries_[n] = {g.signature, mode, options, cp};
      used_.store(n + 1, std::memory_order_release);
    }
    return *cp;  // NOTE: plan_for's map keeps every plan alive for the process
  }

 private:
  static constexpr size_t kWays = 4;
  struct Entry {
    Hash128 signature;
    Mode mode = Mode::fused;
    uint8_t options = 0;  // kiln::plan_options() when the plan was built
    std::shared_ptr<CompiledPlan> plan;
  };
  Entry entries_[kWays];
  std::atomic<size_t> used_{0};
  std::mutex mu_;
};

template <class DT, int R>
Tensor<DT, R> output_tensor(const ir::Graph& g, const Bound& b, int id) {
  const View& v = b.views[size_t(id)];
  auto st = b.storage[size_t(id)];
  Shape<R> sizes{}, strides{};
  for (int i = 0; i < R; ++i) sizes[size_t(i)] = v.shape[size_t(i)], strides[size_t(i)] = v.strides[size_t(i)];
  int64_t off = (v.ptr - static_cast<char*>(st->data())) / int64_t(sizeof(typename DT::storage));
  (void)g;
  return Tensor<DT, R>(std::move(st), off, sizes, strides);
}

template <Expr E>
using result_of = Tensor<dtype_of<E>, rank_of<E>>;

}  // namespace runtime

// Evaluates one or several expressions as one plan; one Tensor, or a tuple of them.
template <Expr... Es>
auto evaluate(Mode mode, const Es&... es) {
  ir::Graph g = ir::trace(es...);
  static runtime::PlanSlot slot;  // one per expression type
  runtime::CompiledPlan& cp = slot.get(g, mode);
  runtime::Bound b = runtime::run_plan(g, cp);
  auto outs = [&]<size_t... I>(std::index_sequence<I...>) {
    return std::tuple<runtime::result_of<Es>...>{runtime::output_tensor<dtype_of<Es>, rank_of<Es>>(g, b, g.outputs[I])...};
  }(std::index_sequence_for<Es...>{});
  if constexpr (sizeof...(Es) == 1) return std::get<0>(outs);
  else return outs;
}
template <Expr... Es>
auto eval(const Es&... es) { return evaluate(Mode::fused, es...); }
template <Expr... Es>
auto eval_eager(const Es&... es) { return evaluate(Mode::eager, es...); }
// A tuple of expressions (var_mean, a function with several outputs) is one plan too.
template <Expr... Es>
auto evaluate(Mode mode, const std::tuple<Es...>& t) {
  return std::apply([&](const auto&... e) { return evaluate(mode, e...); }, t);
}
template <Expr... Es>
auto eval(const std::tuple<Es...>& t) { return evaluate(Mode::fused, t); }
template <Expr... Es>
auto eval_eager(const std::tuple<Es...>& t) { return evaluate(Mode::eager, t); }

// ---- run-time lists of outputs, and writing results into existing tensors ----
namespace runtime {
template <class T>
struct is_expr_list : std::false_type {};
template <Expr E>
struct is_expr_list<std::vector<E>> : std::true_type {};
template <class A>
concept ExprOrList = Expr<A> || is_expr_list<A>::value;

template <class A>
auto result_slot() {
  if constexpr (Expr<A>) return result_of<A>{};
  else return std::vector<result_of<typename A::value_type>>{};
}
}  // namespace runtime

// Evaluates expressions and run-time lists of expressions (std::vector<E>) as ONE
// plan: gives a tuple with a Tensor per expression and a vector of Tensors per list.
// What a multi-tensor optimizer step needs: N parameters, one plan, one launch list.
template <runtime::ExprOrList... As>
auto evaluate_many(Mode mode, const As&... as) {
  ir::Tracer t;
  std::vector<int32_t> outs;
  auto trace_one = [&](const auto& a) {
    if constexpr (Expr<std::remove_cvref_t<decltype(a)>>) outs.push_back(t.trace(a));
    else
      for (const auto& e : a) outs.push_back(t.trace(e));
  };
  (trace_one(as), ...);
  ir::Graph g = t.finish(std::move(outs));
  auto cp = runtime::plan_for(g, mode);
  runtime::Bound b = runtime::run_plan(g, *cp);
  size_t i = 0;
  auto take = [&]<class A>(const A& a) {
    if constexpr (Expr<A>) {
      return runtime::output_tensor<dtype_of<A>, rank_of<A>>(g, b, g.outputs[i++]);
    } else {
      using E = typename A::value_type;
      std::vector<runtime::result_of<E>> r;
      for (size_t k = 0; k < a.size(); ++k) r.push_back(runtime::output_tensor<dtype_of<E>, rank_of<E>>(g, b, g.outputs[i++]));
      return r;
    }
  };
  return std::tuple<decltype(runtime::result_slot<As>())...>{take(as)...};
}

// Copies src's values into dst's memory (dst's storage, offset and strides kept, so
// every handle and view of dst sees them). Same dtype and shape.
template <DTypeTag DT, int R>
void copy_into(const Tensor<DT, R>& dst, const Tensor<DT, R>& src) {
  if (dst.sizes() != src.sizes())
    throw ShapeError("kiln: copy_into: shapes " + format_shape(dst.sizes()) + " and " + format_shape(src.sizes()));
  if (dst.storage() == src.storage() && dst.offset() == src.offset() && dst.strides() == src.strides()) return;
  using S = typename DT::storage;
  if (dst.is_contiguous() && src.is_contiguous()) {
    copy_bytes(dst.data_ptr(), dst.device(), src.data_ptr(), src.device(), size_t(dst.numel()) * sizeof(S));
    return;
  }
  if (dst.numel() == 0) return;
  if (dst.device() != cpu()) {
    // A strided device view: the storage span it covers comes over, takes the values, goes back
    // (the span's other elements travel unchanged). Slow, but only strided device destinations pay.
    int64_t span = 1;
    for (int i = 0; i < R; ++i) span += (dst.sizes()[size_t(i)] - 1) * dst.strides()[size_t(i)];
    const size_t bytes = size_t(span) * sizeof(S);
    Tensor<DT, R> host(std::make_shared<Storage>(bytes, cpu()), 0, dst.sizes(), dst.strides());
    copy_bytes(host.data_ptr(), cpu(), dst.data_ptr(), dst.device(), bytes);
    copy_into(host, src);
    copy_bytes(dst.data_ptr(), dst.device(), host.data_ptr(), cpu(), bytes);
    return;
  }
  Tensor<DT, R> s = src.device() == cpu() ? src : src.to(cpu());
  std::array<int64_t, size_t(R)> idx{};
  S* d = static_cast<S*>(dst.data_ptr());
  const S* p = static_cast<const S*>(s.data_ptr());
  for (int64_t n = dst.numel(); n > 0; --n) {
    int64_t od = 0, os = 0;
    for (int i = 0; i < R; ++i) od += idx[size_t(i)] * dst.strides()[size_t(i)], os += idx[size_t(i)] * s.strides()[size_t(i)];
    d[od] = p[os];
    for (int i = R - 1; i >= 0; --i) {
      if (++idx[size_t(i)] < dst.sizes()[size_t(i)]) break;
      idx[size_t(i)] = 0;
    }
  }
}

// In-place assignment: evaluates the expressions as one plan, then writes result i
// into dsts[i]. Reads finish before any write, so an update may read what it
// overwrites (p = p - lr * g). dsts: a std::vector<Tensor> per list argument.
template <class... Ds, runtime::ExprOrList... As>
  requires(sizeof...(Ds) == sizeof...(As))
void assign(Mode mode, const std::tuple<Ds&...>& dsts, const As&... as) {
  auto results = evaluate_many(mode, as...);
  [&]<size_t... I>(std::index_sequence<I...>) {
    auto one = [](auto& dst, const auto& res) {
      if constexpr (requires { dst.size(); res.size(); dst[0]; }) {
        if (dst.size() != res.size()) throw Error("kiln: assign: list lengths differ");
        for (size_t k = 0; k < dst.size(); ++k) copy_into(dst[k], res[k]);
      } else {
        copy_into(dst, res);
      }
    };
    (one(std::get<I>(dsts), std::get<I>(results)), ...);
  }(std::index_sequence_for<As...>{});
}

template <class E>
auto detail::evaluate_fused(const E& e) {
  return evaluate(Mode::fused, e);
}

// The plan an expression lowers to (kernels, what they compute and read).
template <Expr... Es>
std::string explain(Mode mode, const Es&... es) {
  ir::Graph g = ir::trace(es...);
  return runtime::describe_plan(g, mode);
}
// What the fused plan of a training step (a loss and its kiln::grad gradients) saves
// for the backward, in bytes, and what the backward recomputes (sched/remat.hpp).
template <Expr... Es>
sched::MemoryReport explain_memory(const Es&... es) {
  ir::Graph g = ir::trace(es...);
  return runtime::plan_memory_report(g);
}
// Number of kernels an expression lowers to.
template <Expr... Es>
size_t kernel_count(Mode mode, const Es&... es) {
  ir::Graph g = ir::trace(es...);
  return runtime::plan_kernel_count(g, mode);
}

// torch.compile for kiln: wraps a callable over tensors that returns one
// expression (or a tuple of them); each call runs the fused plan, compiled on the
// first call of each signature and a cache hit after that.
template <class F>
class Compiled {
 public:
  explicit Compiled(F fn, Mode mode = Mode::fused) : fn_(std::move(fn)), mode_(mode) {}
  template <class... Args>
  auto operator()(const Args&... args) const {
    auto r = fn_(args...);
    if constexpr (Expr<decltype(r)>) return evaluate(mode_, r);
    else return std::apply([&](const auto&... e) { return evaluate(mode_, e...); }, r);
  }

 private:
  F fn_;
  Mode mode_;
};
template <class F>
Compiled<F> compile(F fn, Mode mode = Mode::fused) { return Compiled<F>(std::move(fn), mode); }

}  // namespace kiln

#ifndef KILN_SEPARATE_ENGINE
#include "kiln/runtime/eval.hpp"
#endif
