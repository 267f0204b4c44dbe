// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Device helper pasted at the top of every generated CUDA and HIP translation
// unit (compiled by NVRTC or hipRTC, so no system headers). The dialects differ
// only where this file says #ifdef KILN_HIP: shuffles without a mask, and the
// warp (wavefront) size, which the host reads from the device and passes in as
// KILN_WARP (64 on CDNA, 32 elsewhere).
#ifndef KILN_WARP
#define KILN_WARP 32
#endif
#if defined(KILN_HIP) && defined(__AMDGCN_WAVEFRONT_SIZE)
// A wrong wavefront size would silently break every shuffle reduction: make it a compile error.
static_assert(KILN_WARP == __AMDGCN_WAVEFRONT_SIZE, "kiln: KILN_WARP differs from the target's wavefront size");
#endif
typedef unsigned long long kiln_u64;
#ifndef KILN_HAVE_STDINT
typedef long long int64_t;
typedef unsigned long long uint64_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef unsigned short uint16_t;
#endif
#define KILN_FN __device__ __forceinline__
// The block size a kernel is launched with, and on CUDA the blocks per multiprocessor to
// leave room for (at least 1024 threads: at most 64 registers a thread). HIP's second
// argument means minimum waves per execution unit instead: there the block size alone.
#ifdef KILN_HIP
#define KILN_LAUNCH_BOUNDS(threads, blocks) __launch_bounds__(threads)
#else
#define KILN_LAUNCH_BOUNDS(threads, blocks) __launch_bounds__(threads, blocks)
#endif
#ifndef INFINITY
#define INFINITY (__int_as_float(0x7f800000))
#endif
#ifndef NAN
#define NAN (__int_as_float(0x7fc00000))
#endif
#define KILN_INT32_MIN (-2147483647 - 1)
#define KILN_INT32_MAX 2147483647
#define KILN_INT64_MIN (-9223372036854775807LL - 1)
#define KILN_INT64_MAX 9223372036854775807LL

// Every generated kernel's first statement. Launched as a programmatic dependent (sm_90 and
// later: kiln::programmatic_launch) a kernel may start while the kernel before it on its
// stream still runs: it waits here until that kernel has finished and its writes are
// visible, before it reads or writes memory; then it lets the kernel after it be launched
// (that one waits in turn). Launched plainly, and on other targets, both do nothing.
KILN_FN void kiln_grid_begin() {
#if !defined(KILN_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

KILN_FN double kiln_bits_to_f64(uint64_t b) { return __longlong_as_double((long long)b); }

// Math in the compute type (f32 for f32/f16/bf16, f64 for f64); IEEE functions, no fast-math.
KILN_FN float kiln_exp(float x) { return expf(x); }
KILN_FN double kiln_exp(double x) { return exp(x); }
KILN_FN float kiln_exp2(float x) { return exp2f(x); }
KILN_FN double kiln_exp2(double x) { return exp2(x); }
KILN_FN float kiln_log(float x) { return logf(x); }
KILN_FN double kiln_log(double x) { return log(x); }
KILN_FN float kiln_log2(float x) { return log2f(x); }
KILN_FN double kiln_log2(double x) { return log2(x); }
KILN_FN float kiln_sqrt(float x) { return sqrtf(x); }
KILN_FN double kiln_sqrt(double x) { return sqrt(x); }
KILN_FN float kiln_rsqrt(float x) { return rsqrtf(x); }
KILN_FN double kiln_rsqrt(double x) { return rsqrt(x); }
KILN_FN float kiln_recip(float x) { return 1.0f / x; }
KILN_FN double kiln_recip(double x) { return 1.0 / x; }
KILN_FN float kiln_sin(float x) { return sinf(x); }
KILN_FN double kiln_sin(double x) { return sin(x); }
KILN_FN float kiln_cos(float x) { return cosf(x); }
KILN_FN double kiln_cos(double x) { return cos(x); }
KILN_FN float kiln_tanh(float x) { return tanhf(x); }
KILN_FN double kiln_tanh(double x) { return tanh(x); }
KILN_FN float kiln_erf(float x) { return erff(x); }
KILN_FN double kiln_erf(double x) { return erf(x); }
KILN_FN float kiln_floor(float x) { return floorf(x); }
KILN_FN double kiln_floor(double x) { return floor(x); }
KILN_FN float kiln_pow(float x, float y) { return powf(x, y); }
KILN_FN double kiln_pow(double x, double y) { return pow(x, y); }
KILN_FN float kiln_abs(float x) { return fabsf(x); }
KILN_FN double kiln_abs(double x) { return fabs(x); }
KILN_FN int32_t kiln_abs(int32_t x) { return x < 0 ? -x : x; }
KILN_FN int64_t kiln_abs(int64_t x) { return x < 0 ? -x : x; }
template <class T> KILN_FN T kiln_sign(T x) { return (T)((x > (T)0) - (x < (T)0)) + (x != x ? x : (T)0); }
// where(c, a, b) (the C++ dialect's is branch-free; here a select either way).
template <class T> KILN_FN T kiln_where(bool c, T a, T b) { return c ? a : b; }
// NaN-propagating, as torch.maximum / torch.minimum.
template <class T> KILN_FN T kiln_max(T a, T b) { return (a > b || a != a) ? a : b; }
template <class T> KILN_FN T kiln_min(T a, T b) { return (a < b || a != a) ? a : b; }
// sm_80 and later have the NaN-propagating float max/min as one instruction (the
// comparisons above take four).
#if !defined(KILN_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define KILN_SM80 1
KILN_FN float kiln_max(float a, float b) { float r; asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
KILN_FN float kiln_min(float a, float b) { float r; asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b)); return r; }
#endif
KILN_FN bool kiln_max(bool a, bool b) { return a || b; }
KILN_FN bool kiln_min(bool a, bool b) { return a && b; }

// 16-bit floats: stored as uint16_t, computed in f32 (bit conversions, round to nearest even;
// on sm_80 and later the conversion instructions, whose NaN is the canonical one).
KILN_FN float kiln_bf16_to_f32(uint16_t b) { return __uint_as_float(((uint32_t)b) << 16); }
// Element u (a constant once unrolled) of a 4-byte-aligned bf16 array, from its 32-bit word:
// one shift or one mask. NOTE: the upper element alone took two instructions on sm_90
// (a byte permute down, a shift back up).
KILN_FN float kiln_bf16_at(const uint16_t* a, int u) {
  const uint32_t w = ((const uint32_t*)a)[u >> 1];
  return __uint_as_float((u & 1) ? (w & 0xffff0000u) : (w << 16));
}
KILN_FN uint16_t kiln_f32_to_bf16(float f) {
#ifdef KILN_SM80  // one conversion instruction (the bit arithmetic below takes about seven)
  uint16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
#endif
}
KILN_FN float kiln_f16_to_f32(uint16_t h) {
#ifdef KILN_SM80
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
#else
  uint32_t sign = ((uint32_t)(h & 0x8000u)) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return __uint_as_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) { float v = (float)m * 5.9604644775390625e-8f; return sign ? -v : v; }
  return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
#endif
}
KILN_FN uint16_t kiln_f32_to_f16(float f) {
#ifdef KILN_SM80
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  uint32_t u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
  if (a < 0x38800000u) {
    float v = __uint_as_float(a) * 16777216.0f;
    uint32_t m = (uint32_t)v;
    float rem = v - (float)m;
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return (uint16_t)(sign | m);
  }
  a += 0xfffu + ((a >> 13) & 1u) - (112u << 23);
  return (uint16_t)(sign | (a >> 13));
#endif
}

// Two floats as one 32-bit word of 16-bit floats, `lo` in the low half (the lower address),
// rounded to nearest even: one instruction on sm_80 and later.
KILN_FN uint32_t kiln_pack_bf16x2(float lo, float hi) {
#ifdef KILN_SM80
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (uint32_t)kiln_f32_to_bf16(lo) | ((uint32_t)kiln_f32_to_bf16(hi) << 16);
#endif
}
KILN_FN uint32_t kiln_pack_f16x2(float lo, float hi) {
#ifdef KILN_SM80
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return (uint32_t)kiln_f32_to_f16(lo) | ((uint32_t)kiln_f32_to_f16(hi) << 16);
#endif
}

// One 16-byte store. NOTE: CUDA through __stwb: NVVM split a plain uint4 store from a local
// array of 16-bit elements into four 4-byte stores (two of W3's four chunks a thread).
KILN_FN void kiln_store16(uint4* p, uint4 v) {
#ifdef KILN_HIP
  *p = v;
#else
  __stwb(p, v);
#endif
}

// W consecutive elements as one aligned access (8 bf16 or 4 f32: 16 bytes; 4 bf16: 8):
// a GEMM epilogue's vector loads and stores (the host checked the alignment).
template <class T, int W> struct alignas(sizeof(T) * W) kiln_vec { T v[W]; };
// NOTE: through integer vector types, so that every such access is one instruction (a
// plain struct copy was split into element accesses where the compiler lost the alignment).
template <class T, int W> KILN_FN kiln_vec<T, W> kiln_vec_load(const T* p) {
  kiln_vec<T, W> r;
  constexpr int bytes = (int)sizeof(r);
  static_assert(bytes == 4 || bytes == 8 || bytes % 16 == 0, "a 4-, 8- or 16n-byte vector");
  if constexpr (bytes == 4) *(unsigned*)&r = *(const unsigned*)p;
  else if constexpr (bytes == 8) *(uint2*)&r = *(const uint2*)p;
  else
#pragma unroll
    for (int k = 0; k < bytes / 16; ++k) ((uint4*)&r)[k] = ((const uint4*)p)[k];
  return r;
}
// NOTE: marked evict-first in L2 (st.global.cs), so that W4's large outputs leave the GEMMs'
// operand panels in the L2, these stores ran W4's step no faster on an H100 (back to back
// 0.996-1.001x, as torch_anchor.py times 0.990-0.995x; branch gemm-evict-first;
// docs/benchmarks.md, fifty-first session).
template <class T, int W> KILN_FN void kiln_vec_store(T* p, const kiln_vec<T, W>& r) {
  constexpr int bytes = (int)sizeof(r);
  if constexpr (bytes == 4) *(unsigned*)p = *(const unsigned*)&r;
  else if constexpr (bytes == 8) *(uint2*)p = *(const uint2*)&r;
  else
#pragma unroll
    for (int k = 0; k < bytes / 16; ++k) kiln_store16((uint4*)p + k, ((const uint4*)&r)[k]);
}

// Loads and stores of V consecutive elements as 16-byte transactions (the caller
// guarantees alignment: the host picks this variant only for aligned pointers).
template <int V, class T> KILN_FN void kiln_load_vec(T* dst, const T* src) {
  static_assert((V * sizeof(T)) % 16 == 0, "whole 16-byte words");
#pragma unroll
  for (int k = 0; k < (int)(V * sizeof(T) / 16); ++k) ((uint4*)dst)[k] = __ldg(((const uint4*)src) + k);
}
// The same loads marked L2 evict_last (an L2 cache policy; sm_80 and later, else plain loads):
// for the rows a block keeps in registers (GpuVariant::keep). NOTE: on an H200, with the L2
// full of dirty lines (the benchmarks' flush), W2's softmax went from 94.5 to 98.2% of the copy
// ceiling and W3's layer_norm from 88.1 to 91.9% (W8 unchanged); what the lines leave in the L2
// cost a GEMM after the layer_norm nothing and a 24 MiB sum after it 0.5 us. Giving each line
// its normal priority back once read (applypriority, one request a line) lost most of that and
// cost W8 12 points (docs/benchmarks.md, thirty-second session).
KILN_FN uint4 kiln_ld16_keep(const uint4* p) {
#if !defined(KILN_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  uint4 r;
  asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(policy));
  return r;
#else
  return __ldg(p);
#endif
}
template <int V, class T> KILN_FN void kiln_load_vec_keep(T* dst, const T* src) {
  static_assert((V * sizeof(T)) % 16 == 0, "whole 16-byte words");
#pragma unroll
  for (int k = 0; k < (int)(V * sizeof(T) / 16); ++k) ((uint4*)dst)[k] = kiln_ld16_keep(((const uint4*)src) + k);
}
template <int V, class T> KILN_FN void kiln_store_vec(T* dst, const T* src) {
#pragma unroll
  for (int k = 0; k < (int)(V * sizeof(T) / 16); ++k) kiln_store16((uint4*)dst + k, ((const uint4*)src)[k]);
}

// The same, marked streaming (evict first: ld/st.global.cs), so that what a rows kernel
// writes, or reads once, does not push out of L2 the rows it reads again. HIP: plain accesses.
template <int V, class T> KILN_FN void kiln_load_vec_stream(T* dst, const T* src) {
#pragma unroll
  for (int k = 0; k < (int)(V * sizeof(T) / 16); ++k)
#ifdef KILN_HIP
    ((uint4*)dst)[k] = ((const uint4*)src)[k];
#else
    ((uint4*)dst)[k] = __ldcs(((const uint4*)src) + k);
#endif
}
template <int V, class T> KILN_FN void kiln_store_vec_stream(T* dst, const T* src) {
#pragma unroll
  for (int k = 0; k < (int)(V * sizeof(T) / 16); ++k)
#ifdef KILN_HIP
    kiln_store16((uint4*)dst + k, ((const uint4*)src)[k]);
#else
    __stcs((uint4*)dst + k, ((const uint4*)src)[k]);
#endif
}

// V floats stored as V bf16 (or f16) in 16-byte words, two converted per instruction on
// sm_80 and later: a rows or pointwise kernel's 16-bit outputs (one conversion each and the
// packing took about three times the instructions).
template <int V, bool Bf16, bool Stream> KILN_FN void kiln_store_vec_from_f32(uint16_t* dst, const float* f) {
  alignas(16) uint32_t w[V / 2];
#pragma unroll
  for (int k = 0; k < V / 2; ++k) w[k] = Bf16 ? kiln_pack_bf16x2(f[2 * k], f[2 * k + 1]) : kiln_pack_f16x2(f[2 * k], f[2 * k + 1]);
  if constexpr (Stream) kiln_store_vec_stream<V>(dst, (const uint16_t*)w);
  else kiln_store_vec<V>(dst, (const uint16_t*)w);
}

// A load past the multiprocessor's non-coherent L1: what other blocks wrote (and fenced)
// during this launch.
template <class T> KILN_FN T kiln_load_coherent(const T* p) {
#ifdef KILN_HIP
  return *(const volatile T*)p;
#else
  return __ldcg(p);
#endif
}

// Reductions across a warp, then across a block through shared memory.
struct KilnSum { template <class T> KILN_FN T operator()(T a, T b) const { return a + b; } };
// Online softmax: a row's max and sum(exp(x - max)) in one pass. s is the sum so far
// relative to the running max m; a value above m rescales it. Both -inf (nothing finite
// yet) adds exp(0) relative to -inf, which the first finite max scales to 0; NaN and
// +inf give NaN as the two-pass sum does.
template <class T> KILN_FN T kiln_online_sum(T s, T m, T v) {
  if (v > m) s *= kiln_exp(m - v), m = v;
  return s + kiln_exp(v == m && m == (T)(-INFINITY) ? (T)0 : v - m);
}
// A lane's online sum relative to the row's max `total` (all -inf: left as it is).
template <class T> KILN_FN T kiln_online_rescale(T s, T m, T total) {
  return total == (T)(-INFINITY) ? s : s * kiln_exp(m - total);
}
struct KilnMax { template <class T> KILN_FN T operator()(T a, T b) const { return kiln_max(a, b); } };
struct KilnMin { template <class T> KILN_FN T operator()(T a, T b) const { return kiln_min(a, b); } };
template <class T> KILN_FN T kiln_shfl_xor(T v, int o) {
#ifdef KILN_HIP
  return __shfl_xor(v, o, KILN_WARP);
#else
  return __shfl_xor_sync(0xffffffffu, v, o, KILN_WARP);
#endif
}
// Across each aligned group of G lanes (G a power of two up to the warp): several short rows per warp.
template <int G, class T, class Op> KILN_FN T kiln_group_reduce(T v, Op op) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v = op(v, kiln_shfl_xor(v, o));
  return v;
}
template <class T, class Op> KILN_FN T kiln_warp_reduce(T v, Op op) { return kiln_group_reduce<KILN_WARP>(v, op); }
// Column reduction (the `cols` rows variant): a block of KILN_WARP column lanes (threadIdx.x %
// KILN_WARP), each with V columns, by G row groups (threadIdx.x / KILN_WARP); each column's
// row-group partials combined in a fixed order, the result in place in row group 0 (the
// threads that store). One 8 KB buffer for every call (the host keeps the block's values
// within it); the last barrier frees it for the next call.
KILN_FN void* kiln_cols_buffer() {
  __shared__ kiln_u64 buffer[1024];
  return buffer;
}
template <int V, int G, class T, class Op> KILN_FN void kiln_cols_reduce(T (&v)[V], Op op) {
  static_assert(V * G * KILN_WARP * sizeof(T) <= 8192, "kiln: the column combine's values exceed its buffer");
  if (G == 1) return;
  T* s = (T*)kiln_cols_buffer();
#pragma unroll
  for (int u = 0; u < V; ++u) s[u * G * KILN_WARP + threadIdx.x] = v[u];
  __syncthreads();
  if (threadIdx.x < KILN_WARP)
#pragma unroll
    for (int u = 0; u < V; ++u)
      for (int g = 1; g < G; ++g) v[u] = op(v[u], s[u * G * KILN_WARP + g * KILN_WARP + threadIdx.x]);
  __syncthreads();
}

// Across the block: each warp's partial to shared memory, one barrier, then every warp
// reduces the partials in the same order (the same value in every thread). Each call site
// of a kernel passes its own Site, so that its shared array is its own and no second
// barrier has to guard it against the next reduction's writes.
template <int Site, class T, class Op> KILN_FN T kiln_block_reduce(T v, Op op, T identity) {
  __shared__ kiln_u64 smem[1024 / KILN_WARP];
  T* s = (T*)smem;
  const int lane = threadIdx.x % KILN_WARP, warp = threadIdx.x / KILN_WARP, nwarps = (blockDim.x + KILN_WARP - 1) / KILN_WARP;
  v = kiln_warp_reduce(v, op);
  if (lane == 0) s[warp] = v;
  __syncthreads();
  return kiln_warp_reduce(lane < nwarps ? s[lane] : identity, op);
}
