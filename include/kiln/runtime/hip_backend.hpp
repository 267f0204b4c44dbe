// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The `hip` backend: AMD GPUs under ROCm. Plugs the HIP layer
// (runtime/hip_runtime.hpp: libamdhip64 through dlopen, caching allocator,
// module cache; jit/hiprtc.hpp: hipRTC with crash-proof target probing) into
// kiln through the shared GPU backend (runtime/gpu_backend.hpp), exactly as
// cuda_backend.hpp does for NVIDIA: the same plan, variants, launch shapes and
// argument blocks, the same code generator in its HIP dialect
// (codegen/gpu.hpp, GpuDialect::hip). Takes a bound plan on kiln::hip(N); gives
// its kernels run on that device's stream:
//   * the warp size is the device's wavefront size, read at run time
//     (hipDeviceGetAttribute: 64 on CDNA such as gfx90a/MI250 and gfx942/MI300,
//     32 on RDNA) and passed into the source as KILN_WARP;
//   * the program is compiled by hipRTC for the device's gcnArchName (e.g.
//     gfx90a:sramecc+:xnack-) to a code object (memory, then disk, then hipRTC),
//     loaded with hipModuleLoadData and launched with hipModuleLaunchKernel.
// Registers storage hooks for kiln::Storage on hip devices and the
// default-device probe (the first CUDA GPU, else the first HIP GPU, else the
// CPU). What is HIP's alone is the device API policy below.
#pragma once
#include <string>
#include <string_view>

#include "kiln/runtime/gpu_backend.hpp"
#include "kiln/runtime/hip_runtime.hpp"

namespace kiln::runtime {

struct HipDeviceApi : GpuDeviceApi<DeviceKind::hip, codegen::GpuDialect::hip> {
  static rocm::HipDevice& device(int ordinal) { return rocm::hip_device(ordinal); }
  static bool present() noexcept { return rocm::hip_available(); }
  static void empty_cache() { rocm::empty_cache(); }
  static void flush_cache(rocm::HipDevice& dev) { rocm::flush_l2(dev.ordinal()); }
  using Timer = rocm::EventTimer;
  using Event = rocm::HipEvent;
  static std::string arch_name(rocm::HipDevice& dev) { return dev.properties().arch; }
  // No vendor GEMM candidate for max-autotune (yet): kiln's own kernels only.
  static constexpr const char* kLibraryGemm = "";
  static bool library_gemm_applies(const ir::Graph&, const sched::Kernel&, const codegen::Layout&, const KernelArgs&) { return false; }
  static bool library_gemm(const ir::Graph&, const sched::Kernel&, const codegen::Layout&, const KernelArgs&, rocm::HipDevice&) {
    return false;
  }

  // Copies on the device's stream, so that they are ordered after the kernels
  // queued there; a copy that involves host memory waits for its end (the host
  // side may be reused or read at once).
  static void copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) {
    const rocm::HipApi& api = rocm::hip_api();
    if (sd.kind == DeviceKind::cpu || dd.kind == DeviceKind::cpu) {
      bool to_device = sd.kind == DeviceKind::cpu;
      rocm::HipDevice& dev = device(to_device ? dd.index : sd.index);
      dev.make_current();
      int direction = to_device ? rocm::kMemcpyHostToDevice : rocm::kMemcpyDeviceToHost;
      dev.check_async(api.hipMemcpyAsync(dst, src, bytes, direction, dev.stream()),
                      to_device ? "copy to " + dd.str() : "copy from " + sd.str());
      dev.synchronize();
    } else if (dd.index == sd.index) {
      rocm::HipDevice& dev = device(dd.index);
      dev.make_current();
      dev.check_async(api.hipMemcpyAsync(dst, src, bytes, rocm::kMemcpyDeviceToDevice, dev.stream()),
                      "copy on " + dd.str());
    } else {
      // The source's pending writes finish first; the copy then runs on the
      // destination's stream and is waited for, so neither block can be reused
      // under it by either device's allocator.
      rocm::HipDevice& from = device(sd.index);
      rocm::HipDevice& to = device(dd.index);
      from.synchronize();
      to.make_current();
      to.check_async(api.hipMemcpyPeerAsync(dst, to.ordinal(), src, from.ordinal(), bytes, to.stream()),
                     "copy " + sd.str() + " to " + dd.str());
      to.synchronize();
    }
  }
};

using HipBackend = GpuBackend<HipDeviceApi>;

// The wavefront size hipRTC compiles for `arch` by default, which is the size
// a device of that target reports: 32 on RDNA (gfx10, gfx11, gfx12), 64 on GCN
// and CDNA (gfx8, gfx9: gfx908, gfx90a, gfx942). For compiling ahead of time
// (precompile.hpp, tests); at run time the device's own answer is used.
inline int hip_target_warp_size(std::string_view arch) {
  std::string_view base = arch.substr(0, arch.find(':'));  // "gfx90a" of "gfx90a:xnack-"
  return base.size() == 7 && base.substr(0, 4) == "gfx1" ? 32 : 64;
}

namespace detail {
// Registers the backend once, at static-initialization time of any program that includes this header.
inline const bool hip_registered = register_gpu_backend<HipDeviceApi>();
}  // namespace detail

}  // namespace kiln::runtime
