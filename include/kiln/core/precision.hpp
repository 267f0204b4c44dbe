// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Whether float32 matmuls may trade precision for speed: on NVIDIA GPUs of sm_80
// and later, TF32 tensor cores (inputs rounded to 10 mantissa bits, to nearest;
// products summed in f32) instead of f32 arithmetic. Off by default, as PyTorch's
// torch.backends.cuda.matmul.allow_tf32; KILN_ALLOW_TF32=1 turns it on from the
// start. It decides each call's GEMM kernel (and cuBLASLt's compute type in
// max-autotune), not the plan: switching it takes effect on the next call. The CPU
// and HIP backends compute f32 matmuls in f32 either way.
#pragma once
#include <atomic>
#include <cstdlib>
#include <string_view>

namespace kiln {

namespace detail {
inline std::atomic<bool>& allow_tf32_flag() {
  static std::atomic<bool> on{[] {
    const char* v = std::getenv("KILN_ALLOW_TF32");
    return v != nullptr && *v != '\0' && std::string_view(v) != "0";
  }()};
  return on;
}
}  // namespace detail

inline bool allow_tf32() { return detail::allow_tf32_flag().load(std::memory_order_relaxed); }
inline void set_allow_tf32(bool on) { detail::allow_tf32_flag().store(on, std::memory_order_relaxed); }

}  // namespace kiln
