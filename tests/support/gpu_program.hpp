// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The GPU program a backend would build for some expressions, without a GPU: the
// same plan, bound arguments, variants and generator as GpuBackend<Api>::run, over
// CPU buffers (64-byte aligned, so the 16-byte vector and tensor-core variants are
// chosen as they would be for fresh device buffers). Takes the backend, the
// device's warp size, NVIDIA compute capability (0: another vendor) and SM count;
// gives each kernel's kind, variant and launch shape, and the program's text.
#pragma once
#include <string>
#include <vector>

#include "kiln/kiln.hpp"
#include "kiln/runtime/cuda_backend.hpp"
#include "kiln/runtime/hip_backend.hpp"

namespace kiln::test {

struct GpuProgram {
  std::vector<sched::KernelKind> kinds;
  std::vector<codegen::GpuVariant> vars;
  std::vector<runtime::GpuLaunch> launches;
  std::string src;
  // The variants of the matmul kernels, in plan order.
  std::vector<codegen::GpuVariant> matmuls() const {
    std::vector<codegen::GpuVariant> m;
    for (size_t k = 0; k < vars.size(); ++k)
      if (kinds[k] == sched::KernelKind::matmul) m.push_back(vars[k]);
    return m;
  }
};

template <class Backend, class... Es>
GpuProgram gpu_program(int warp, int arch, int sm_count, const Es&... es) {
  ir::Graph g = ir::trace(es...);
  auto cp = runtime::plan_for(g, Mode::fused);
  runtime::Bound b = runtime::bind_buffers(g, cp->plan);
  runtime::GpuCall call = runtime::gpu_call(g, *cp, b, warp, arch, sm_count);
  GpuProgram p;
  for (const auto& k : cp->plan.kernels) p.kinds.push_back(k.kind);
  p.vars = call.vars;
  for (size_t k = 0; k < call.vars.size(); ++k)
    p.launches.push_back(runtime::gpu_launch_shape(cp->plan.kernels[k], call.args[k], call.vars[k], sm_count, warp));
  p.src = Backend::source(g, cp->plan, call.vars, warp);
  return p;
}

}  // namespace kiln::test
