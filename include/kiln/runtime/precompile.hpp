// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// KILN_PRECOMPILE=sm_80,sm_90,gfx90a,... : whenever a plan variant is compiled,
// also generate its CUDA/HIP source and compile it for each named GPU target
// through NVRTC / hipRTC, into the disk cache. A build machine without a GPU
// can so warm the cache for the GPUs it targets, and CI (which has no GPU)
// proves that every kernel the tests generate compiles for sm_80, sm_90 and
// the AMD targets. Takes the CPU backend's plan and bound arguments; gives
// cached cubins / code objects, or a CompileError naming the target.
#pragma once
#include "kiln/jit/hiprtc.hpp"
#include "kiln/jit/nvrtc.hpp"
#include "kiln/runtime/gpu_backend.hpp"
#include "kiln/runtime/hip_backend.hpp"

namespace kiln::runtime::detail {

inline std::vector<std::string> precompile_targets() {
  static const std::vector<std::string> targets = [] {
    std::vector<std::string> t;
    const char* env = std::getenv("KILN_PRECOMPILE");
    std::string s = env ? env : "";
    for (size_t p = 0; p < s.size();) {
      size_t q = s.find(',', p);
      if (q == std::string::npos) q = s.size();
      if (q > p) t.push_back(s.substr(p, q - p));
      p = q + 1;
    }
    return t;
  }();
  return targets;
}

inline void precompile(const ir::Graph& g, const CompiledPlan& cp, const std::vector<KernelArgs>& args) {
  auto saved = kiln::counters();  // NOTE: warming other targets is not this call's compile work
  for (const std::string& t : precompile_targets()) {
    bool amd = t.rfind("gfx", 0) == 0;
    int warp = amd ? hip_target_warp_size(t) : 32;
    if (amd && !(jit::hiprtc_available() && jit::hiprtc_target_supported(t))) {
      log(LogTopic::jit, "precompile: skipping " + t + " (hipRTC missing or target unknown to it)");
      continue;
    }
    if (!amd && !jit::nvrtc_available()) {
      log(LogTopic::jit, "precompile: skipping " + t + " (NVRTC missing)");
      continue;
    }
    // The variant this call would pick; for rows kernels also the other strategy (a block
    // per row for short rows, a warp per row for long ones), split rows where the kernel is
    // a one-pass reduction, and for column rows the column form this call did not pick
    // (16-byte chunks or a column per thread, split or not): what another size, alignment
    // or view of the same plan would pick.
    for (int pass = 0; pass < 4; ++pass) {
      std::vector<codegen::GpuVariant> vars;
      bool changed = pass == 0;  // pass 0: the variant this call picks
      for (size_t k = 0; k < cp.plan.kernels.size(); ++k) {
        const sched::Kernel& kernel = cp.plan.kernels[k];
        // NOTE: each target gets its tensor-core (mma, mfma) GEMMs; 132 SMs (an H100/H200) for the config and split choices.
        int arch = amd ? codegen::gemm_amd_arch(t) : std::stoi(t.substr(3));
        vars.push_back(gpu_variant(g, kernel, cp.layouts[k], args[k], warp, arch, 132));
        codegen::GpuVariant& v = vars.back();
        if (kernel.kind != sched::KernelKind::rows || pass == 0) continue;
        if (pass == 1) {
          v.group = v.group ? 0 : warp, v.persist = 0, v.split = false, v.vec = v.cols ? 0 : v.vec, v.cols = false, v.threads = 256;
          changed = true;
        } else if (pass == 2 && one_pass_rows(kernel) && (!v.split || v.cols)) {
          v.group = 0, v.persist = 0, v.split = true, v.vec = v.cols ? 0 : v.vec, v.cols = false, v.threads = 256;
          changed = true;
        } else if (pass == 3 && v.cols) {
          v.vec = v.vec ? 0 : cols_vec_width(g, cp.layouts[k]), v.split = !v.split;
          v.threads = gpu_cols_threads(g, kernel, rows_extent(args[k]).second, v.vec, warp);
          changed = true;
        }
      }
      if (pass == 0 && (gemm_column_sums() || gemm_operand_sums() || gemm_totals())) {  // the GEMMs that compute a rows kernel's sums (as the backend decides)
        GpuCall c;
        c.args = args, c.vars = std::move(vars);
        assign_column_sums(g, cp, c);
        vars = std::move(c.vars);
      }
      if (!changed) continue;
      // The programs the backend builds (each GEMM alone): the other passes' GEMMs are disk hits.
      auto dialect = amd ? codegen::GpuDialect::hip : codegen::GpuDialect::cuda;
      for (const codegen::GpuProgramPart& part : codegen::gpu_programs(dialect, warp, g, cp.plan, vars)) {
        if (amd) {
          jit::hiprtc_compile(part.source, "kiln_plan", t, {});
        } else {
          int cc = std::stoi(t.substr(3));
          jit::nvrtc_compile(part.source, "kiln_plan", cc / 10, cc % 10, part.options);
        }
      }
    }
  }
  auto& c = kiln::detail::counters_state();
  c.compiles = saved.compiles, c.disk_hits = saved.disk_hits, c.memory_hits = saved.memory_hits;
}

inline const bool precompile_registered = [] {
  if (!precompile_targets().empty()) cpu_compile_hook() = precompile;
  return true;
}();

}  // namespace kiln::runtime::detail
