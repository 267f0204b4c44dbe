// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The sm_80+ instructions of the tensor-core GEMM (codegen/gemm.hpp): pasted
// after gpu_prelude.cuh into CUDA programs that hold such a kernel. The raw
// instructions only; tile shapes, fragment layouts and the pipeline live in the
// generator.

// Shared-memory address of a generic pointer (what cp.async and ldmatrix take).
KILN_FN uint32_t kiln_smem_addr(const void* p) {
  uint32_t a;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
  return a;
}

// 16 bytes global -> shared, asynchronously; the bytes past `src_bytes` (0..16)
// are zero-filled, so out-of-range rows, columns and K read as zeros.
KILN_FN void kiln_cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
KILN_FN void kiln_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> KILN_FN void kiln_cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// Four 8x8 b16 matrices; lane l gives the (shared) row address of matrix l/8, row l%8.
KILN_FN void kiln_ldmatrix_x4(uint32_t (&r)[4], uint32_t p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(p));
}
KILN_FN void kiln_ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(p));
}

// D = A * B + D, m16n8k16, f32 accumulators; A row-major, B column-major fragments.
KILN_FN void kiln_mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
KILN_FN void kiln_mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// TF32: D = A * B + D, m16n8k8, f32 accumulators; fragments of 32-bit elements.
KILN_FN void kiln_mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
               "{%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// One 32-bit word of shared memory.
KILN_FN uint32_t kiln_lds32(uint32_t p) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(p));
  return v;
}
// f32 bits rounded to the nearest TF32 (10 mantissa bits; the tensor cores would drop the
// rest, a bias towards zero), in place.
KILN_FN void kiln_tf32x2(uint32_t (&r)[2]) {
  for (int i = 0; i < 2; ++i) asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r[i]) : "f"(__uint_as_float(r[i])));
}
KILN_FN void kiln_tf32x4(uint32_t (&r)[4]) {
  for (int i = 0; i < 4; ++i) asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r[i]) : "f"(__uint_as_float(r[i])));
}
