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
#include "kiln/runtime/cublaslt.hpp"
#include "kiln/runtime/cuda_runtime.hpp"
#include "kiln/runtime/gpu_backend.hpp"

namespace kiln::runtime {

struct CudaDeviceApi : GpuDeviceApi<DeviceKind::cuda, codegen::GpuDialect::cuda> {
  static cu::CudaDevice& device(int ordinal) { return cu::cuda_device(ordinal); }
  static bool present() noexcept { return cu::cuda_available() && cu::cuda_device_count() > 0; }
  static void empty_cache() { cu::empty_cache(); }
  using Timer = cu::EventTimer;
  static std::string arch_name(cu::CudaDevice& dev) {
    return "sm_" + std::to_string(dev.properties().cc_major * 10 + dev.properties().cc_minor);
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
