// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The engine behind the front door (runtime/front.hpp). Takes a traced Graph;
// finds or builds the Plan for its signature (memory map; a plan is built once per
// signature and mode), binds the buffers, and has the device's backend compile or
// fetch the kernels of the variant this call needs (jit cache: memory, disk,
// compile) and run them in order. The CPU backend is here; the GPU runtimes
// register theirs (runtime/cuda_backend.hpp, runtime/hip_backend.hpp).
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
#include "kiln/runtime/front.hpp"
#include "kiln/runtime/profile.hpp"

namespace kiln {
namespace runtime {

using CpuKernelFn = void (*)(void* const*, const int64_t*, const uint64_t*);

struct CompiledVariant {
  std::shared_ptr<const jit::HostModule> module;
  std::vector<CpuKernelFn> fns;
};

struct CompiledPlan {
  sched::Plan plan;
  Mode mode = Mode::fused;
  uint8_t options = 0;  // kiln::plan_options() it was built under
  std::vector<codegen::Layout> layouts;
  std::mutex mu;
  std::unordered_map<Hash128, std::shared_ptr<CompiledVariant>, Hash128Hasher> variants;
};

inline std::string describe_kernel(const ir::Graph& g, const sched::Kernel& k) {
  const ir::Node& d = g.nodes[size_t(k.domain)];
  static const char* kinds[] = {"pointwise", "rows", "matmul"};
  return std::string(kinds[int(k.kind)]) + " over " + format_shape(std::span(d.shape.data(), size_t(d.rank)));
}
// Kernel `index` of a plan as the profiler names it: the plan (its graph's signature), mode and
// switches, the index, what it computes.
inline std::string profile_label(const ir::Graph& g, const CompiledPlan& cp, size_t index, const sched::Kernel& k) {
  static const char* modes[] = {"eager", "fused", "max-autotune", "reduce-overhead"};
  return "[plan " + g.signature.hex().substr(0, 6) + " " + modes[int(cp.mode)] + (cp.options & kPlanEpiloguesApart ? " epilogues apart" : "") + " k" +
         std::to_string(index) + "] " + describe_kernel(g, k);
}

// Called whenever the CPU backend compiles a new plan variant (runtime/precompile.hpp).
inline void (*&cpu_compile_hook())(const ir::Graph&, const CompiledPlan&, const std::vector<KernelArgs>&) {
  static void (*hook)(const ir::Graph&, const CompiledPlan&, const std::vector<KernelArgs>&) = nullptr;
  return hook;
}

// A backend runs a bound plan on its device.
struct Backend {
  virtual ~Backend() = default;
  virtual void run(const ir::Graph& g, CompiledPlan& cp, Bound& b) = 0;
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
  void run(const ir::Graph& g, CompiledPlan& cp, Bound& b) override {
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
      if (args[k].work == 0 || kernels[k].prologue_of >= 0) continue;  // the CPU GEMM computes its prologues
      auto start = profile ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      v->fns[k](args[k].ptrs.data(), args[k].meta.data(), args[k].words.data());
      kiln::detail::counters_state().kernels_launched.fetch_add(1, std::memory_order_relaxed);
      if (profile)
        detail::profile_record(profile_label(g, cp, k, kernels[k]),
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

// ---- front.hpp's entry points: inline by default; with KILN_SEPARATE_ENGINE, only
// in the file that defines KILN_ENGINE_IMPLEMENTATION (src/engine.cpp) ----
#if !defined(KILN_SEPARATE_ENGINE) || defined(KILN_ENGINE_IMPLEMENTATION)
KILN_ENGINE_API std::shared_ptr<CompiledPlan> plan_for(const ir::Graph& g, Mode mode) {
  static std::mutex mu;
  static std::unordered_map<Hash128, std::shared_ptr<CompiledPlan>, Hash128Hasher> plans;
  const uint8_t options = plan_options();
  Hash128 key = Hasher().add(g.signature).add(mode).add(options).digest();
  std::lock_guard lock(mu);
  if (auto it = plans.find(key); it != plans.end()) return it->second;
  auto cp = std::make_shared<CompiledPlan>();
  cp->plan = sched::schedule(g, mode != Mode::eager, !(options & kPlanEpiloguesApart));
  cp->mode = mode;
  cp->options = options;
  kiln::detail::counters_state().plans_built.fetch_add(1, std::memory_order_relaxed);
  for (auto& k : cp->plan.kernels) cp->layouts.push_back(codegen::layout(g, k));
  if (log_enabled(LogTopic::sched))
    log(LogTopic::sched, "plan " + key.hex() + " (" + std::to_string(cp->plan.kernels.size()) + " kernels)\n" +
                             cp->plan.describe(g));
  plans.emplace(key, cp);
  return cp;
}
KILN_ENGINE_API Bound run_plan(const ir::Graph& g, CompiledPlan& cp) {
  Bound b = bind_buffers(g, cp.plan);
  backend_for(g.device).run(g, cp, b);
  return b;
}
KILN_ENGINE_API std::string describe_plan(const ir::Graph& g, Mode mode) { return plan_for(g, mode)->plan.describe(g); }
KILN_ENGINE_API size_t plan_kernel_count(const ir::Graph& g, Mode mode) {
  const auto& kernels = plan_for(g, mode)->plan.kernels;
  return size_t(std::count_if(kernels.begin(), kernels.end(), [](const sched::Kernel& k) { return k.prologue_of < 0; }));
}
KILN_ENGINE_API sched::MemoryReport plan_memory_report(const ir::Graph& g) {
  return sched::memory_report(g, plan_for(g, Mode::fused)->plan.remat);
}
KILN_ENGINE_API void link_engine() {}
#endif

}  // namespace runtime
}  // namespace kiln
