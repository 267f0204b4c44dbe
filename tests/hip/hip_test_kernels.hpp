// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// HIP kernel sources shared by the hip tests, written as kiln's code generator
// writes HIP: a prelude declaring what hipRTC does not (fixed-width types) and
// checking the wavefront size the source was written for (KILN_WARP_SIZE, given
// as an option) against the target's; grid-stride loops with 64-bit indices;
// 16-bit floats as uint16 storage with explicit bit conversions.
#pragma once

namespace hip_test {

// What generated HIP source starts with: hipRTC 5.2 predeclares no fixed-width
// integer types and cannot include <cstdint>.
inline constexpr const char* kPrelude = R"(
typedef unsigned short kiln_u16;
typedef unsigned int kiln_u32;
typedef long long kiln_i64;
#ifndef KILN_WARP_SIZE
#error "KILN_WARP_SIZE must be defined by the compile options"
#endif
// The warp size the source was written for must be the target's.
static_assert(KILN_WARP_SIZE == __AMDGCN_WAVEFRONT_SIZE, "KILN_WARP_SIZE does not match the target's wavefront");
)";

// y = gelu(x) over n (odd) elements, grid-stride, 64-bit indices.
inline constexpr const char* kGelu = R"(
extern "C" __global__ void gelu(const float* __restrict__ x, float* __restrict__ y, kiln_i64 n) {
  for (kiln_i64 i = (kiln_i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (kiln_i64)gridDim.x * blockDim.x) {
    float v = x[i];
    y[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
  }
}
)";

// One partial sum per block: shuffles within a wavefront, then one wavefront
// over the wavefront sums. Launch with at most 1024 threads.
inline constexpr const char* kBlockSum = R"(
extern "C" __global__ void block_sum(const float* __restrict__ x, float* __restrict__ partial, kiln_i64 n) {
  __shared__ float warp_sums[1024 / KILN_WARP_SIZE];
  float s = 0.0f;
  for (kiln_i64 i = (kiln_i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (kiln_i64)gridDim.x * blockDim.x)
    s += x[i];
  for (int offset = KILN_WARP_SIZE / 2; offset > 0; offset >>= 1) s += __shfl_down(s, offset, KILN_WARP_SIZE);
  const int lane = threadIdx.x % KILN_WARP_SIZE, warp = threadIdx.x / KILN_WARP_SIZE;
  if (lane == 0) warp_sums[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = lane < (int)(blockDim.x / KILN_WARP_SIZE) ? warp_sums[lane] : 0.0f;
    for (int offset = KILN_WARP_SIZE / 2; offset > 0; offset >>= 1) s += __shfl_xor(s, offset, KILN_WARP_SIZE);
    if (lane == 0) partial[blockIdx.x] = s;
  }
}
)";

// bf16 in, half out, both as 16-bit storage with explicit bit conversions.
inline constexpr const char* kMixed16 = R"(
__device__ inline float kiln_bf16_to_f32(kiln_u16 b) { return __uint_as_float(((kiln_u32)b) << 16); }
__device__ inline kiln_u16 kiln_f32_to_bf16(float f) {  // round to nearest even; NaN stays NaN
  kiln_u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (kiln_u16)((u >> 16) | 0x40u);
  return (kiln_u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__device__ inline float kiln_f16_to_f32(kiln_u16 h) { return (float)__builtin_bit_cast(_Float16, h); }
__device__ inline kiln_u16 kiln_f32_to_f16(float f) { return __builtin_bit_cast(kiln_u16, (_Float16)f); }
extern "C" __global__ void kiln_mixed(const kiln_u16* __restrict__ a, const kiln_u16* __restrict__ b,
                                      kiln_u16* __restrict__ out_bf16, kiln_u16* __restrict__ out_f16, kiln_i64 n) {
  for (kiln_i64 i = (kiln_i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (kiln_i64)gridDim.x * blockDim.x) {
    float v = kiln_bf16_to_f32(a[i]) * kiln_f16_to_f32(b[i]);
    out_bf16[i] = kiln_f32_to_bf16(v);
    out_f16[i] = kiln_f32_to_f16(v);
  }
}
)";

}  // namespace hip_test
