// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The `cuda` backend: plugs the CUDA layer (runtime/cuda_runtime.hpp: driver
// and NVRTC through dlopen, caching allocator, module cache) into kiln through
// the shared GPU backend (runtime/gpu_backend.hpp: variants, launch shapes,
// argument blocks, the run loop). Takes a bound plan; compiles the plan's
// variant as one NVRTC program to a cubin for the device's own architecture
// (memory, then disk, then NVRTC); launches the kernels on the device's stream.
// Registers storage hooks and the default-device probe, so that a program
// built once picks the GPU where one exists. What is CUDA's alone is the device
// API policy below.
#pragma once
#include <atomic>
#include <thread>

#include "kiln/runtime/cublaslt.hpp"
#include "kiln/runtime/cuda_runtime.hpp"
#include "kiln/runtime/gpu_backend.hpp"

namespace kiln::runtime {

struct CudaDeviceApi : GpuDeviceApi<DeviceKind::cuda, codegen::GpuDialect::cuda> {
  static cu::CudaDevice& device(int ordinal) { return cu::cuda_device(ordinal); }
  static bool present() noexcept { return cu::cuda_available() && cu::cuda_device_count() > 0; }
  static void empty_cache() { cu::empty_cache(); }
  static void flush_cache(cu::CudaDevice& dev) { cu::flush_l2(dev.ordinal()); }
  using Timer = cu::EventTimer;
  using Event = cu::CudaEvent;
  using Graph = cu::CudaGraph;
  static bool graphs() { return cu::CudaGraph::supported(); }
  static std::string arch_name(cu::CudaDevice& dev) {
    return "sm_" + std::to_string(dev.properties().cc_major * 10 + dev.properties().cc_minor);
  }

  // The tensor maps of a wgmma GEMM (codegen/gemm_sm90.hpp): each operand as a 3-d
  // tensor {contiguous dim, other matrix dim, batch}, boxes of one 128-byte swizzle row (64
  // 16-bit or 32 f32 elements; a K-major operand in K steps of 32 16-bit elements: one 64-byte
  // row, swizzled in 64 bytes) by the rows the kernel copies at once; a broadcast batch is a
  // batch of one (the kernel reads its coordinate 0). A staged operand (GpuVariant::stage) is
  // its K-major copy at staged[o]: rows of codegen::GemmStaged's pitch, batches one after another.
  static void tensor_maps(const KernelArgs& a, const codegen::GpuVariant& v, const uint64_t* staged, TensorMaps& out) {
    const cu::DriverApi& api = cu::driver();
    if (api.cuTensorMapEncodeTiled == nullptr)
      throw Error("kiln: the CUDA driver (" + api.path + ") has no cuTensorMapEncodeTiled: the wgmma GEMM needs a CUDA 12+ driver");
    int nd = int(a.meta[0]);
    const uint64_t es = uint64_t(v.gemm_ops.elem_bytes);
    auto size = [&](int d) { return uint64_t(a.size(d)); };
    auto stride = [&](int slot, int d) { return uint64_t(a.stride(size_t(slot), d)) * es; };  // bytes
    uint64_t k = uint64_t(a.meta[1]), m = size(nd - 2), n = size(nd - 1);
    auto encode = [&](TensorMaps::Map& map, int slot, bool k_major, uint64_t mn, unsigned k_major_rows) {
      // slot 0 is A [M, K], slot 1 is B [K, N]: which meta dim is K and which is M or N.
      int kd = slot == 0 ? nd - 1 : nd - 2, mnd = slot == 0 ? nd - 2 : nd - 1;
      void* base = const_cast<void*>(a.ptrs[size_t(slot)]);
      uint64_t inner = k_major ? k : mn, outer = k_major ? mn : k, outer_stride = stride(slot, k_major ? mnd : kd);
      bool batched = nd == 3 && stride(slot, 0) != 0 && size(0) > 1;
      uint64_t dims[3] = {inner, outer, batched ? size(0) : 1};
      uint64_t strides[2] = {outer_stride, batched ? stride(slot, 0) : outer_stride * outer};
      if (v.stage >> slot & 1u) {
        const codegen::GemmStaged s = codegen::GemmStaged::of(a.meta.data(), slot);
        base = reinterpret_cast<void*>(staged[slot]);
        strides[0] = uint64_t(s.pitch) * es, strides[1] = uint64_t(s.rows * s.pitch) * es;
      }
      const bool sw64 = k_major && codegen::wgmma_sw64(v.gemm, int(es));
      unsigned box[3] = {k_major ? unsigned(v.gemm.bk) : unsigned(128 / es), k_major ? k_major_rows : unsigned(v.gemm.bk), 1}, unit[3] = {1, 1, 1};
      // NOTE: an L2 promotion of 256 B (DeepGEMM's) instead of 128 B made no difference to W4's
      // GEMMs or step on an H200 (docs/benchmarks.md, twenty-sixth session).
      int r = api.cuTensorMapEncodeTiled(&map, es == 4 ? cu::kTensorMapFloat32 : cu::kTensorMapUint16, 3, base, dims, strides, box,
                                         unit, 0, sw64 ? cu::kTensorMapSwizzle64B : cu::kTensorMapSwizzle128B, cu::kTensorMapL2Promotion128B, 0);
      if (r != cu::kSuccess)
        throw Error("kiln: cuTensorMapEncodeTiled of the " + std::string(slot ? "B" : "A") + " operand of a matmul (" +
                    std::to_string(dims[0]) + " x " + std::to_string(dims[1]) + " x " + std::to_string(dims[2]) + ", strides " +
                    std::to_string(strides[0]) + ", " + std::to_string(strides[1]) + " bytes) failed: " +
                    cu::detail::driver_error_text(api, r));
    };
    encode(out.a, 0, v.gemm_ops.a_k_major, m, unsigned(v.gemm.bm));
    // A cluster's blocks each bring their share of B's tile (codegen/gemm_sm90.hpp).
    encode(out.b, 1, v.gemm_ops.b_k_major, n, unsigned(v.gemm.bn / v.gemm.cluster));
  }

  // NVRTC side by side, a thread per core (the tuner's candidates: codegen is serial, ptxas is not).
  static void compile_ahead(const std::vector<std::pair<std::string, std::vector<std::string>>>& programs, cu::CudaDevice& dev) {
    int cc = jit::nvrtc_machine_target(dev.properties().cc());
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next++) < programs.size();) {
        try {
          jit::nvrtc_compile(programs[i].first, "kiln_gemm", cc / 10, cc % 10, programs[i].second);
        } catch (const std::exception&) {  // NOTE: the load reports it, with the candidate's name
        }
      }
    };
    size_t n = std::min<size_t>(programs.size(), std::max(1u, std::thread::hardware_concurrency()));
    std::vector<std::thread> threads;
    for (size_t t = 1; t < n; ++t) threads.emplace_back(work);
    work();
    for (auto& t : threads) t.join();
  }

  // cuBLASLt, one more max-autotune candidate where it computes a matmul kernel exactly.
  static constexpr const char* kLibraryGemm = "cublaslt";
  static bool library_gemm_applies(const ir::Graph& g, const sched::Kernel& k, const codegen::Layout& l, const KernelArgs& a) {
    return cublaslt::available() && cublaslt::gemm_for(g, k, l, a).has_value();
  }
  static bool library_gemm(const ir::Graph& g, const sched::Kernel& k, const codegen::Layout& l, const KernelArgs& a,
                           cu::CudaDevice& dev) {
    auto r = cublaslt::gemm_for(g, k, l, a);
    return r && cublaslt::run(*r, dev, dev.stream());
  }

  // The driver's synchronous copies (cuMemcpy*); a failure names the last kernel launched.
  static void copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) {
    const cu::DriverApi& api = cu::driver();
    cu::CudaDevice& dev = device(dd.kind == DeviceKind::cuda ? dd.index : sd.index);
    dev.make_current();
    if (sd.kind == DeviceKind::cpu)
      dev.check_async(api.cuMemcpyHtoD(reinterpret_cast<cu::CUdeviceptr>(dst), src, bytes), "copy to " + dd.str());
    else if (dd.kind == DeviceKind::cpu)
      dev.check_async(api.cuMemcpyDtoH(dst, reinterpret_cast<cu::CUdeviceptr>(src), bytes), "copy from " + sd.str());
    else
      dev.check_async(
          api.cuMemcpyDtoD(reinterpret_cast<cu::CUdeviceptr>(dst), reinterpret_cast<cu::CUdeviceptr>(src), bytes),
          "copy " + sd.str() + " to " + dd.str());
  }
};

using CudaBackend = GpuBackend<CudaDeviceApi>;

namespace detail {
// Registers the backend once, at static-initialization time of any program that includes this header.
inline const bool cuda_registered = register_gpu_backend<CudaDeviceApi>();
}  // namespace detail

}  // namespace kiln::runtime
