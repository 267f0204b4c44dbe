// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The AMD CDNA matrix instructions of the MFMA GEMM (codegen/gemm_mfma.hpp):
// pasted after gpu_prelude.cuh into HIP programs that hold such a kernel. One
// operation, a 16x16x16 block product with f32 accumulators, per dtype; which
// instruction does it depends on the target hipRTC compiles for:
//   f16   v_mfma_f32_16x16x16f16 (gfx908, gfx90a, gfx94x)
//   bf16  v_mfma_f32_16x16x16bf16_1k (gfx90a, gfx94x); gfx908 has only the
//         two-per-lane v_mfma_f32_16x16x8bf16, issued twice.
// Operands, as the CDNA ISA lays them out over the 64 lanes of a wavefront
// (lane l, x = l % 16, y = l / 16): lane l holds A[x][4y .. 4y+3] and
// B[4y .. 4y+3][x]; the result D[4y + q][x] is its element q. The K order inside
// one block is immaterial (A and B share it), which is what lets gfx908 split the
// four K values of a lane over two 16x16x8 instructions.
// GNU vector types (not ext_vector_type): the host emulation in the tests
// compiles this file with GCC.

typedef float kiln_f32x4 __attribute__((vector_size(16)));
typedef short kiln_i16x8 __attribute__((vector_size(16)));
typedef short kiln_i16x4 __attribute__((vector_size(8)));
typedef short kiln_i16x2 __attribute__((vector_size(4)));
typedef _Float16 kiln_f16x4 __attribute__((vector_size(8)));

#if !defined(__gfx908__) && !defined(__gfx90a__) && !defined(__gfx940__) && !defined(__gfx941__) && !defined(__gfx942__)
#error "kiln: the MFMA GEMM needs a CDNA target (gfx908, gfx90a, gfx940-gfx942); the host should have chosen the SIMT GEMM"
#endif

KILN_FN kiln_f32x4 kiln_mfma_f16(kiln_i16x4 a, kiln_i16x4 b, kiln_f32x4 c) {
  return __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(kiln_f16x4, a), __builtin_bit_cast(kiln_f16x4, b), c, 0, 0, 0);
}
KILN_FN kiln_f32x4 kiln_mfma_bf16(kiln_i16x4 a, kiln_i16x4 b, kiln_f32x4 c) {
#if defined(__gfx908__)
  c = __builtin_amdgcn_mfma_f32_16x16x8bf16(kiln_i16x2{a[0], a[1]}, kiln_i16x2{b[0], b[1]}, c, 0, 0, 0);
  return __builtin_amdgcn_mfma_f32_16x16x8bf16(kiln_i16x2{a[2], a[3]}, kiln_i16x2{b[2], b[3]}, c, 0, 0, 0);
#else
  return __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, 0, 0, 0);
#endif
}

// Eight 16-bit elements from global memory, `n` (0..8) of them in range, the rest zero:
// one 16-byte load when all are (the host checked the alignment).
KILN_FN kiln_i16x8 kiln_load8_zfill(const short* p, int n) {
  if (n >= 8) return *(const kiln_i16x8*)p;
  kiln_i16x8 v = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int i = 0; i < n; ++i) v[i] = p[i];
  return v;
}
