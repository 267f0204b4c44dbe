// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The `cuda` backend: plugs the CUDA layer (runtime/cuda_runtime.hpp: driver
// and NVRTC through dlopen, caching allocator, module cache) into kiln. Takes a
// bound plan; picks each kernel's variant from this call's strides, alignment
// and sizes; compiles the plan's variant as one NVRTC program to a cubin for the
// device's own architecture (memory, then disk, then NVRTC); launches the
// kernels on the device's stream. Registers storage hooks and the default-device
// probe, so that a program built once picks the GPU where one exists.
#pragma once
#include "kiln/codegen/gpu.hpp"
#include "kiln/runtime/cuda_runtime.hpp"
#include "kiln/runtime/eval.hpp"

namespace kiln::runtime {

struct GpuLaunch {
  cu::Dim3 grid, block;
};

// Variant and launch shape of one kernel for this call (shared with the HIP backend).
inline codegen::GpuVariant gpu_variant(const ir::Graph& g, const sched::Kernel& k, const codegen::Layout& l,
                                       const KernelArgs& a, int warp) {
  codegen::GpuVariant v;
  v.strides = a.strides;
  if (k.kind == sched::KernelKind::matmul) return v;
  int nd = int(a.meta[0]), no = int(a.meta[1]);
  int inner_dims = k.kind == sched::KernelKind::rows ? nd - no : nd;
  bool flat = inner_dims <= 1, any_unit = false;
  size_t min_bytes = 16;
  for (size_t i = 0; i < l.slots.size() && flat; ++i) {
    if (a.strides[i] == codegen::Stride::any) flat = false;
    if (l.slots[i].role == codegen::SlotRole::rand || a.strides[i] != codegen::Stride::unit) continue;
    size_t es = info(g.nodes[size_t(l.slots[i].node)].dtype).bytes;
    any_unit = true;
    min_bytes = std::min(min_bytes, es);
    if (reinterpret_cast<uintptr_t>(a.ptrs[i]) % 16) flat = false;
    if (k.kind == sched::KernelKind::rows)  // every row must start aligned too
      for (int d = 0; d < no; ++d)
        if ((a.meta[size_t(2 + nd) + i * size_t(nd) + size_t(d)] * int64_t(es)) % 16) flat = false;
  }
  if (flat && any_unit) v.vec = int(16 / min_bytes);
  if (k.kind == sched::KernelKind::rows) {
    int64_t per_row = 1;
    for (int d = no; d < nd; ++d) per_row *= a.meta[size_t(2 + d)];
    v.warp_rows = per_row <= int64_t(warp) * 32;
    // Block rows: about four V-chunks per thread; a row that fits stays in registers.
    int64_t chunks = (per_row + std::max(v.vec, 1) - 1) / std::max(v.vec, 1);
    int t = 64;
    while (t < 1024 && int64_t(t) * 4 < chunks) t *= 2;
    v.threads = t;
    int64_t p = (chunks + t - 1) / t;
    if (!v.warp_rows && v.vec && per_row % v.vec == 0 && p <= 8) v.persist = int(p);
  }
  return v;
}

inline GpuLaunch gpu_launch_shape(const sched::Kernel& k, const KernelArgs& a, const codegen::GpuVariant& v, int sm_count,
                                  int warp) {
  GpuLaunch L;
  if (k.kind == sched::KernelKind::matmul) {
    int nd = int(a.meta[0]);
    int64_t batch = 1;
    for (int d = 0; d + 2 < nd; ++d) batch *= a.meta[size_t(2 + d)];
    int64_t m = a.meta[size_t(2 + nd - 2)], n = a.meta[size_t(2 + nd - 1)];
    L.block = {256, 1, 1};
    L.grid = {unsigned((n + 15) / 16), unsigned((m + 15) / 16), unsigned(batch)};
    return L;
  }
  int nd = int(a.meta[0]), no = int(a.meta[1]);
  if (k.kind == sched::KernelKind::rows) {
    int64_t outer = 1, per_row = 1;
    for (int d = 0; d < no; ++d) outer *= a.meta[size_t(2 + d)];
    for (int d = no; d < nd; ++d) per_row *= a.meta[size_t(2 + d)];
    if (v.warp_rows) {
      L.block = {256, 1, 1};
      L.grid = {unsigned((outer + 256 / warp - 1) / (256 / warp)), 1, 1};
    } else {
      L.block = {unsigned(v.threads), 1, 1};
      L.grid = {unsigned(outer), 1, 1};
    }
    return L;
  }
  int64_t n = 1;
  for (int d = 0; d < nd; ++d) n *= a.meta[size_t(2 + d)];
  int64_t per_thread = std::max(v.vec, 1);
  int64_t blocks = (n + 256 * per_thread - 1) / (256 * per_thread);
  L.block = {256, 1, 1};
  L.grid = {unsigned(std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t(sm_count) * 16))), 1, 1};
  return L;
}

// The kernel's argument struct, byte for byte: p[slots], m[meta], a[words].
inline std::vector<uint64_t> gpu_arg_block(const ir::Graph& g, const sched::Kernel& k, const codegen::Layout& l,
                                           const KernelArgs& a) {
  size_t ns = std::max<size_t>(l.slots.size(), 1), nm = codegen::GpuKernelWriter::meta_words(g, k),
         nw = size_t(std::max(l.words, 1));
  std::vector<uint64_t> block(ns + nm + nw, 0);
  for (size_t i = 0; i < a.ptrs.size(); ++i) block[i] = reinterpret_cast<uint64_t>(a.ptrs[i]);
  if (a.meta.size() > nm) throw Error("kiln: internal error: kernel metadata exceeds its argument block");
  for (size_t i = 0; i < a.meta.size(); ++i) block[ns + i] = uint64_t(a.meta[i]);
  for (size_t i = 0; i < a.words.size(); ++i) block[ns + nm + i] = a.words[i];
  return block;
}

inline std::string describe_kernel(const ir::Graph& g, const sched::Kernel& k) {
  const ir::Node& d = g.nodes[size_t(k.domain)];
  static const char* kinds[] = {"pointwise", "rows", "matmul"};
  return std::string(kinds[int(k.kind)]) + " over " + format_shape(std::span(d.shape.data(), size_t(d.rank)));
}

class CudaBackend final : public Backend {
 public:
  void run(const ir::Graph& g, CompiledPlan& cp, const Bound& b) override {
    cu::CudaDevice& dev = cu::cuda_device(g.device.index);
    dev.make_current();
    const auto& props = dev.properties();
    const auto& kernels = cp.plan.kernels;
    std::vector<KernelArgs> args;
    std::vector<codegen::GpuVariant> vars;
    Hasher vh;
    for (size_t k = 0; k < kernels.size(); ++k) {
      args.push_back(bind_kernel(g, kernels[k], cp.layouts[k], b));
      vars.push_back(gpu_variant(g, kernels[k], cp.layouts[k], args.back(), props.warp_size));
      for (auto s : vars.back().strides) vh.add(s);
      vh.add(vars.back().vec).add(vars.back().warp_rows).add(vars.back().persist);
    }
    auto fns = functions(g, cp, vh.digest(), vars, dev);
    for (size_t k = 0; k < kernels.size(); ++k) {
      if (args[k].work == 0) continue;
      auto block = gpu_arg_block(g, kernels[k], cp.layouts[k], args[k]);
      void* params[] = {block.data()};
      GpuLaunch L = gpu_launch_shape(kernels[k], args[k], vars[k], props.sm_count, props.warp_size);
      fns[k].launch(L.grid, L.block, 0, params, describe_kernel(g, kernels[k]), dev.stream());
    }
  }

  static std::string source(const ir::Graph& g, const sched::Plan& p, const std::vector<codegen::GpuVariant>& vars,
                            int warp) {
    return codegen::gpu_source(codegen::GpuDialect::cuda, warp, g, p, vars);
  }

 private:
  std::vector<cu::CudaFunction> functions(const ir::Graph& g, CompiledPlan& cp, const Hash128& key,
                                          const std::vector<codegen::GpuVariant>& vars, cu::CudaDevice& dev) {
    std::lock_guard lock(mu_);
    Hash128 full = Hasher().add(key).add(reinterpret_cast<uintptr_t>(&cp)).add(dev.ordinal()).digest();
    if (auto it = cache_.find(full); it != cache_.end()) return it->second;
    cu::CudaModule& m = dev.load_module(source(g, cp.plan, vars, dev.properties().warp_size), {}, "kiln_plan");
    std::vector<cu::CudaFunction> fns;
    for (size_t k = 0; k < cp.plan.kernels.size(); ++k) fns.push_back(m.function("kiln_k" + std::to_string(k)));
    cache_.emplace(full, fns);
    return fns;
  }
  std::mutex mu_;
  std::unordered_map<Hash128, std::vector<cu::CudaFunction>, Hash128Hasher> cache_;
};

namespace detail {
inline void* cuda_allocate(size_t bytes, int index) {
  cu::CudaDevice& dev = cu::cuda_device(index);
  dev.make_current();
  return reinterpret_cast<void*>(dev.allocator().allocate(bytes ? bytes : 1));
}
inline void cuda_release(void* p, size_t, int index) noexcept {
  try {  // NOTE: called from ~Storage: an exception here would end the process
    cu::cuda_device(index).allocator().release(reinterpret_cast<cu::CUdeviceptr>(p));
  } catch (const std::exception& e) {
    log(LogTopic::jit, std::string("cuda: releasing device memory failed: ") + e.what());
  }
}
inline void cuda_copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) {
  if (!bytes) return;
  const cu::DriverApi& api = cu::driver();
  cu::CudaDevice& dev = cu::cuda_device(dd.kind == DeviceKind::cuda ? dd.index : sd.index);
  dev.make_current();
  if (sd.kind == DeviceKind::cpu)
    dev.check_async(api.cuMemcpyHtoD(reinterpret_cast<cu::CUdeviceptr>(dst), src, bytes), "copy to " + dd.str());
  else if (dd.kind == DeviceKind::cpu)
    dev.check_async(api.cuMemcpyDtoH(dst, reinterpret_cast<cu::CUdeviceptr>(src), bytes), "copy from " + sd.str());
  else
    dev.check_async(api.cuMemcpyDtoD(reinterpret_cast<cu::CUdeviceptr>(dst), reinterpret_cast<cu::CUdeviceptr>(src), bytes),
                    "copy " + sd.str() + " to " + dd.str());
}
// Registers the backend once, at static-initialization time of any program that includes this header.
inline const bool cuda_registered = [] {
  kiln::detail::memory_hooks(DeviceKind::cuda) = {cuda_allocate, cuda_release, cuda_copy};
  backend_slot(DeviceKind::cuda) = std::make_unique<CudaBackend>();
  kiln::detail::gpu_probe = [] { return cu::cuda_available() && cu::cuda_device_count() > 0 ? kiln::cuda(0) : kiln::cpu(); };
  return true;
}();
}  // namespace detail

}  // namespace kiln::runtime
