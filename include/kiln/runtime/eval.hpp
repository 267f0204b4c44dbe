// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The front door. Takes expressions; traces them to a Graph, finds or builds
// the Plan for the graph's signature (memory map; a plan is built once per
// signature and mode), compiles or fetches the kernels of the variant this call
// needs (jit cache: memory, disk, compile), binds the buffers and runs the
// kernels in order. Gives Tensors. kiln::compile(fn) wraps a callable.
// evaluate_many takes run-time lists of expressions too (one plan for N parameters);
// copy_into / assign write results into existing tensors (optimiser steps).
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <unordered_map>

#include "kiln/codegen/cpp.hpp"
#include "kiln/core/log.hpp"
#include "kiln/jit/host_compiler.hpp"
#include "kiln/runtime/bind.hpp"
#include "kiln/runtime/counters.hpp"
#include "kiln/runtime/profile.hpp"

namespace kiln {

// eager: one kernel per primitive (the baseline, and an explicit fallback);
// fused: kiln's fusion (the default), each GEMM's configuration by a heuristic;
// max_autotune: the fused plan, each matmul kernel's GEMM (its tile configs, and
// cuBLASLt where it computes the kernel exactly) timed on the GPU once per shape
// class, dtype, layout and architecture, the fastest kept in the tuning database
// (tune/db.hpp) and never retuned. On the CPU it is fused mode: the CPU GEMM's
// blocking is fixed per target, so there is nothing to time.
enum class Mode : uint8_t { eager, fused, max_autotune };

namespace runtime {

using CpuKernelFn = void (*)(void* const*, const int64_t*, const uint64_t*);

struct CompiledVariant {
  std::shared_ptr<const jit::HostModule> module;
  std::vector<CpuKernelFn> fns;
};

struct CompiledPlan {
  sched::Plan plan;
  Mode mode = Mode::fused;
  std::vector<codegen::Layout> layouts;
  std::mutex mu;
  std::unordered_map<Hash128, std::shared_ptr<CompiledVariant>, Hash128Hasher> variants;
};

inline std::string describe_kernel(const ir::Graph& g, const sched::Kernel& k) {
  const ir::Node& d = g.nodes[size_t(k.domain)];
  static const char* kinds[] = {"pointwise", "rows", "matmul"};
  return std::string(kinds[int(k.kind)]) + " over " + format_shape(std::span(d.shape.data(), size_t(d.rank)));
}
// Kernel `index` of a plan as the profiler names it: the plan (its graph's signature) and mode, the
// index, what it computes.
inline std::string profile_label(const ir::Graph& g, Mode mode, size_t index, const sched::Kernel& k) {
  static const char* modes[] = {"eager", "fused", "max-autotune"};
  return "[plan " + g.signature.hex().substr(0, 6) + " " + modes[int(mode)] + " k" + std::to_string(index) + "] " + describe_kernel(g, k);
}

// Called whenever the CPU backend compiles a new plan variant (runtime/precompile.hpp).
inline void (*&cpu_compile_hook())(const ir::Graph&, const CompiledPlan&, const std::vector<KernelArgs>&) {
  static void (*hook)(const ir::Graph&, const CompiledPlan&, const std::vector<KernelArgs>&) = nullptr;
  return hook;
}

// A backend runs a bound plan on its device.
struct Backend {
  virtual ~Backend() = default;
  virtual void run(const ir::Graph& g, CompiledPlan& cp, const Bound& b) = 0;
};

// The CPU GEMM's scratch from the host caching allocator. NOTE: noexcept, as they are
// called from generated code inside OpenMP regions; a null pointer is the failure.
inline void* gemm_scratch_allocate(size_t bytes) noexcept {
  try {
    return host_allocator().allocate(bytes ? bytes : 1);
  } catch (const std::exception& e) {
    log(LogTopic::jit, std::string("CPU GEMM scratch: ") + e.what());
    return nullptr;
  }
}
inline void gemm_scratch_release(void* p) noexcept {
  try {
    host_allocator().release(p);
  } catch (const std::exception& e) {
    log(LogTopic::jit, std::string("CPU GEMM scratch: ") + e.what());
  }
}

class CpuBackend final : public Backend {
 public:
  void run(const ir::Graph& g, CompiledPlan& cp, const Bound& b) override {
    const auto& kernels = cp.plan.kernels;
    thread_local std::vector<KernelArgs> args;  // NOTE: this thread's, reused: no allocation per call once grown
    args.resize(kernels.size());
    Hasher vh;
    for (size_t k = 0; k < kernels.size(); ++k) {
      bind_kernel(g, kernels[k], cp.layouts[k], b, args[k]);
      static_assert(sizeof(codegen::Stride) == 1);  // NOTE: hashed as bytes, one piece per kernel
      vh.add(args[k].strides.data(), args[k].strides.size());
    }
    const CompiledVariant* v = variant(g, cp, vh.digest(), args);
    const bool profile = profiling();
    for (size_t k = 0; k < kernels.size(); ++k) {
      if (args[k].work == 0) continue;
      auto start = profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      v->fns[k](args[k].ptrs.data(), args[k].meta.data(), args[k].words.data());
      kiln::detail::counters_state().kernels_launched.fetch_add(1, std::memory_order_relaxed);
      if (profile)
        detail::profile_record(profile_label(g, cp.mode, k, kernels[k]),
                               std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
    }
  }

  static std::string source(const ir::Graph& g, const sched::Plan& p, const std::vector<KernelArgs>& args) {
    std::vector<std::vector<codegen::Stride>> strides;
    for (auto& a : args) strides.push_back(a.strides);
    return codegen::cpp_source(g, p, strides);
  }

 private:
  // NOTE: a plain pointer: variants stay in their plan for the process (no reference count per call).
  const CompiledVariant* variant(const ir::Graph& g, CompiledPlan& cp, const Hash128& key,
                                 const std::vector<KernelArgs>& args) {
    std::lock_guard lock(cp.mu);
    if (auto it = cp.variants.find(key); it != cp.variants.end()) return it->second.get();
    auto v = std::make_shared<CompiledVariant>();
    v->module = jit::load_host_module(source(g, cp.plan, args));
    for (size_t k = 0; k < cp.plan.kernels.size(); ++k)
      v->fns.push_back(reinterpret_cast<CpuKernelFn>(v->module->symbol(("kiln_k" + std::to_string(k)).c_str())));
    if (std::any_of(cp.plan.kernels.begin(), cp.plan.kernels.end(), [](auto& k) { return k.kind == sched::KernelKind::matmul; })) {
      using UseAllocator = void (*)(void* (*)(size_t), void (*)(void*));
      reinterpret_cast<UseAllocator>(v->module->symbol("kiln_gemm_use_allocator"))(gemm_scratch_allocate, gemm_scratch_release);
    }
    cp.variants.emplace(key, v);
    if (auto hook = cpu_compile_hook()) hook(g, cp, args);
    return v.get();
  }
};

// Backends by device kind; GPU runtimes register theirs.
inline std::unique_ptr<Backend>& backend_slot(DeviceKind k) {
  static std::unique_ptr<Backend> slots[3] = {std::make_unique<CpuBackend>(), nullptr, nullptr};
  return slots[int(k)];
}
inline Backend& backend_for(Device d) {
  auto& b = backend_slot(d.kind);
  if (!b) throw Error("kiln: no backend for device " + d.str() + " in this build");
  return *b;
}

inline std::shared_ptr<CompiledPlan> plan_for(const ir::Graph& g, Mode mode) {
  static std::mutex mu;
  static std::unordered_map<Hash128, std::shared_ptr<CompiledPlan>, Hash128Hasher> plans;
  Hash128 key = Hasher().add(g.signature).add(mode).digest();
  std::lock_guard lock(mu);
  if (auto it = plans.find(key); it != plans.end()) return it->second;
  auto cp = std::make_shared<CompiledPlan>();
  cp->plan = sched::schedule(g, mode != Mode::eager);
  cp->mode = mode;
  kiln::detail::counters_state().plans_built.fetch_add(1, std::memory_order_relaxed);
  for (auto& k : cp->plan.kernels) cp->layouts.push_back(codegen::layout(g, k));
  if (log_enabled(LogTopic::sched))
    log(LogTopic::sched, "plan " + key.hex() + " (" + std::to_string(cp->plan.kernels.size()) + " kernels)\n" +
                             cp->plan.describe(g));
  plans.emplace(key, cp);
  return cp;
}

// The plans one expression type has run: a static slot per type, so a call whose
// signature the type has seen before finds its plan without the process-wide map and
// its lock (ARCHITECTURE.md, decision 1). The signature still decides: the same type
// traces to another graph when its tensors alias differently, a dim becomes 1 or the
// device kind changes, and that graph gets its own entry (up to kWays; then plan_for).
class PlanSlot {
 public:
  CompiledPlan& get(const ir::Graph& g, Mode mode) {
    size_t n = used_.load(std::memory_order_acquire);
    for (size_t i = 0; i < n; ++i)
      if (entries_[i].signature == g.signature && entries_[i].mode == mode) return *entries_[i].plan;
    std::shared_ptr<CompiledPlan> cp = plan_for(g, mode);
    std::lock_guard lock(mu_);
    n = used_.load(std::memory_order_relaxed);
    if (n < kWays) {
      entries_[n] = {g.signature, mode, cp};
      used_.store(n + 1, std::memory_order_release);
    }
    return *cp;  // NOTE: plan_for's map keeps every plan alive for the process
  }

 private:
  static constexpr size_t kWays = 4;
  struct Entry {
    Hash128 signature;
    Mode mode = Mode::fused;
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
  runtime::Bound b = runtime::bind_buffers(g, cp.plan);
  runtime::backend_for(g.device).run(g, cp, b);
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
  runtime::Bound b = runtime::bind_buffers(g, cp->plan);
  runtime::backend_for(g.device).run(g, *cp, b);
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

template <DTypeTag DT, int R>
template <class E>
  requires(!std::same_as<std::remove_cvref_t<E>, Tensor<DT, R>> && requires { typename E::is_kiln_expr; })
Tensor<DT, R>::Tensor(const E& expr) {
  static_assert(std::is_same_v<typename E::dtype, DT>,
                "kiln: assigning an expression to a Tensor of another dtype; use kiln::cast<DType>(expr)");
  static_assert(E::rank == R, "kiln: assigning an expression to a Tensor of another rank; use kiln::reshape");
  *this = evaluate(Mode::fused, expr);
}

// The plan an expression lowers to (kernels, what they compute and read).
template <Expr... Es>
std::string explain(Mode mode, const Es&... es) {
  ir::Graph g = ir::trace(es...);
  return runtime::plan_for(g, mode)->plan.describe(g);
}
// What the fused plan of a training step (a loss and its kiln::grad gradients) saves
// for the backward, in bytes, and what the backward recomputes (sched/remat.hpp).
template <Expr... Es>
sched::MemoryReport explain_memory(const Es&... es) {
  ir::Graph g = ir::trace(es...);
  return sched::memory_report(g, runtime::plan_for(g, Mode::fused)->plan.remat);
}
// Number of kernels an expression lowers to.
template <Expr... Es>
size_t kernel_count(Mode mode, const Es&... es) {
  ir::Graph g = ir::trace(es...);
  return runtime::plan_for(g, mode)->plan.kernels.size();
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
