// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// cuBLASLt as one more GEMM candidate for max-autotune (runtime/autotune.hpp).
// Loaded with dlopen (libcublasLt.so.13, .so.12, .so, on the loader's path, then
// in the toolkit's lib64 as NVRTC is), nothing linked: without
// it available() is false and kiln runs its own kernels. Takes a matmul kernel
// of a plan with its bound arguments; gives a runnable Gemm when cuBLASLt can
// compute exactly that kernel: bf16, f16 or f32 (f32 accumulation; TF32 where
// kiln::allow_tf32(), as kiln's own f32 kernels then), at
// most one batch dim, each operand contiguous along one of its matrix dims, a
// fresh row-major output, and an epilogue that is nothing or exactly a bias add
// over N (CUBLASLT_EPILOGUE_BIAS).
// NOTE: cuBLASLt's GELU epilogues are the tanh approximation; kiln's gelu is the
// exact erf form, so a gelu epilogue never goes to cuBLASLt.
// NOTE: cuBLASLt is column-major: kiln's row-major C = A B is computed as
// C^T = B^T A^T, so cuBLASLt's "A" is kiln's B and its bias runs along C^T's rows (N).
#pragma once
#include <dlfcn.h>

#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "kiln/core/options.hpp"
#include "kiln/jit/nvrtc.hpp"
#include "kiln/runtime/bind.hpp"
#include "kiln/runtime/cuda_runtime.hpp"

namespace kiln::runtime::cublaslt {

// The values of cublasLt.h / cublas_api.h / library_types.h that kiln uses.
namespace abi {
using Status = int;
using Handle = void*;
using Desc = void*;
using Layout = void*;
using Pref = void*;
struct Algo {
  uint64_t data[8];
};
struct HeuristicResult {
  Algo algo;
  size_t workspace_size;
  Status state;
  float waves_count;
  int reserved[4];
};
inline constexpr int kR32F = 0, kR16F = 2, kR16BF = 14;  // cudaDataType
inline constexpr int kCompute32F = 68;                   // CUBLAS_COMPUTE_32F (no TF32)
inline constexpr int kCompute32FFastTF32 = 77;           // CUBLAS_COMPUTE_32F_FAST_TF32
inline constexpr int kOpN = 0, kOpT = 1;
inline constexpr int kDescTransA = 3, kDescTransB = 4, kDescEpilogue = 7, kDescBiasPointer = 8;
inline constexpr uint32_t kEpilogueDefault = 1, kEpilogueBias = 4;
inline constexpr int kLayoutBatchCount = 5, kLayoutStridedBatchOffset = 6;
inline constexpr int kPrefMaxWorkspaceBytes = 1;
}  // namespace abi

struct Api {
  abi::Status (*create)(abi::Handle*) = nullptr;
  abi::Status (*desc_create)(abi::Desc*, int compute, int scale) = nullptr;
  abi::Status (*desc_destroy)(abi::Desc) = nullptr;
  abi::Status (*desc_set)(abi::Desc, int attr, const void*, size_t) = nullptr;
  abi::Status (*layout_create)(abi::Layout*, int type, uint64_t rows, uint64_t cols, int64_t ld) = nullptr;
  abi::Status (*layout_destroy)(abi::Layout) = nullptr;
  abi::Status (*layout_set)(abi::Layout, int attr, const void*, size_t) = nullptr;
  abi::Status (*pref_create)(abi::Pref*) = nullptr;
  abi::Status (*pref_destroy)(abi::Pref) = nullptr;
  abi::Status (*pref_set)(abi::Pref, int attr, const void*, size_t) = nullptr;
  abi::Status (*heuristic)(abi::Handle, abi::Desc, abi::Layout, abi::Layout, abi::Layout, abi::Layout, abi::Pref, int,
                           abi::HeuristicResult*, int*) = nullptr;
  abi::Status (*matmul)(abi::Handle, abi::Desc, const void*, const void*, abi::Layout, const void*, abi::Layout, const void*,
                        const void*, abi::Layout, void*, abi::Layout, const abi::Algo*, void*, size_t, cu::CUstream) = nullptr;
  abi::Handle handle = nullptr;
  std::string path;
};

// The loaded library, or nullptr (and why, once, under KILN_LOG=tune, which also says how long
// the load took: 0.27 s in the first process on a fresh H200 machine, 0.06 s in later ones).
inline const Api* api() {
  static const Api* loaded = []() -> const Api* {
    static Api a;
    const auto t0 = std::chrono::steady_clock::now();
    void* lib = nullptr;
    for (const std::string& name : jit::nvrtc_detail::toolkit_library_candidates("libcublasLt"))
      if ((lib = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) != nullptr) {
        a.path = name;
        break;
      }
    if (lib == nullptr) {
      log(LogTopic::tune, "cuBLASLt not found (libcublasLt.so.13/.12/.so, $CUDA_HOME/lib64, /usr/local/cuda/lib64): not a candidate");
      return nullptr;
    }
    std::string missing;
    using cu::detail::bind_symbol;
    bool ok = bind_symbol(lib, a.create, {"cublasLtCreate"}, missing) &&
              bind_symbol(lib, a.desc_create, {"cublasLtMatmulDescCreate"}, missing) &&
              bind_symbol(lib, a.desc_destroy, {"cublasLtMatmulDescDestroy"}, missing) &&
              bind_symbol(lib, a.desc_set, {"cublasLtMatmulDescSetAttribute"}, missing) &&
              bind_symbol(lib, a.layout_create, {"cublasLtMatrixLayoutCreate"}, missing) &&
              bind_symbol(lib, a.layout_destroy, {"cublasLtMatrixLayoutDestroy"}, missing) &&
              bind_symbol(lib, a.layout_set, {"cublasLtMatrixLayoutSetAttribute"}, missing) &&
              bind_symbol(lib, a.pref_create, {"cublasLtMatmulPreferenceCreate"}, missing) &&
              bind_symbol(lib, a.pref_destroy, {"cublasLtMatmulPreferenceDestroy"}, missing) &&
              bind_symbol(lib, a.pref_set, {"cublasLtMatmulPreferenceSetAttribute"}, missing) &&
              bind_symbol(lib, a.heuristic, {"cublasLtMatmulAlgoGetHeuristic"}, missing) &&
              bind_symbol(lib, a.matmul, {"cublasLtMatmul"}, missing);
    if (!ok) {
      log(LogTopic::tune, "cuBLASLt (" + a.path + ") unusable: " + missing);
      return nullptr;
    }
    log(LogTopic::tune, "cuBLASLt (" + a.path + ") loaded in " +
                            std::to_string(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()) + " s");
    return &a;
  }();
  return loaded;
}
inline bool available() { return api() != nullptr; }

// One matmul kernel as a cuBLASLt call, column-major (see the NOTE above).
struct Gemm {
  int type = abi::kR32F;
  bool tf32 = false;  // f32 on TF32 tensor cores (kiln::allow_tf32())
  bool trans_a = false, trans_b = false;  // cuBLASLt's A (kiln's B) and B (kiln's A)
  int64_t m = 0, n = 0, k = 0, batch = 1;  // cuBLASLt's: m = kiln's N, n = kiln's M
  int64_t lda = 0, ldb = 0, ldd = 0, stride_a = 0, stride_b = 0, stride_d = 0;
  const void *a = nullptr, *b = nullptr, *bias = nullptr;
  void* d = nullptr;
};

// The Gemm for matmul kernel `k` with its bound arguments, if cuBLASLt can compute it exactly.
inline std::optional<Gemm> gemm_for(const ir::Graph& g, const sched::Kernel& k, const codegen::Layout& l, const KernelArgs& a) {
  if (k.kind != sched::KernelKind::matmul || k.stores.size() != 1) return std::nullopt;
  const ir::Node& mm = g.nodes[size_t(k.domain)];
  Gemm r;
  if (mm.dtype == DType::bf16) r.type = abi::kR16BF;
  else if (mm.dtype == DType::f16) r.type = abi::kR16F;
  else if (mm.dtype != DType::f32) return std::nullopt;
  r.tf32 = mm.dtype == DType::f32 && allow_tf32();
  int nd = int(a.meta[0]);
  if (nd > 3) return std::nullopt;
  auto size = [&](int d) { return a.meta[size_t(2 + d)]; };
  auto stride = [&](int slot, int d) { return a.meta[size_t(2 + nd + slot * nd + d)]; };
  int64_t M = size(nd - 2), N = size(nd - 1), K = a.meta[1];
  if (M < 1 || N < 1 || K < 1) return std::nullopt;
  // The epilogue: nothing, or add(matmul, bias) with bias a contiguous [N] of the same dtype.
  const sched::Store& st = k.stores[0];
  int bias_slot = -1;
  if (st.value != k.domain) {
    const ir::Node& add = g.nodes[size_t(st.value)];
    if (add.op != Prim::add || add.dtype != mm.dtype) return std::nullopt;
    int other = g.arg(add, 0) == k.domain ? g.arg(add, 1) : g.arg(add, 1) == k.domain ? g.arg(add, 0) : -1;
    for (size_t i = 2; other >= 0 && i < l.slots.size(); ++i)
      if (l.slots[i].node == other && l.slots[i].role == codegen::SlotRole::load) bias_slot = int(i);
    if (bias_slot < 0 || g.nodes[size_t(other)].dtype != mm.dtype) return std::nullopt;
    for (int d = 0; d + 1 < nd; ++d)
      if (stride(bias_slot, d) != 0) return std::nullopt;
    if (N > 1 && stride(bias_slot, nd - 1) != 1) return std::nullopt;
    r.bias = a.ptrs[size_t(bias_slot)];
  }
  int out = -1;
  for (size_t i = 0; i < l.slots.size(); ++i)
    if (l.slots[i].role == codegen::SlotRole::store) out = int(i);
  if (out < 0 || stride(out, nd - 1) != 1 || (M > 1 && stride(out, nd - 2) != N)) return std::nullopt;
  // An operand [R, C] contiguous along C (row-major: no transpose in cuBLASLt's terms) or along R.
  auto operand = [&](int slot, int64_t rows, int64_t cols, bool& trans, int64_t& ld) {
    int64_t sr = stride(slot, nd - 2), sc = stride(slot, nd - 1);
    if (cols == 1 || sc == 1) {
      trans = false, ld = rows == 1 ? cols : sr;
      return ld >= cols;
    }
    if (rows == 1 || sr == 1) {
      trans = true, ld = sc;
      return ld >= rows;
    }
    return false;
  };
  // kiln's B [K, N] row-major is cuBLASLt's A = B^T (N x K, column-major, op N).
  if (!operand(1, K, N, r.trans_a, r.lda) || !operand(0, M, K, r.trans_b, r.ldb)) return std::nullopt;
  r.m = N, r.n = M, r.k = K, r.ldd = N;
  if (nd == 3) {
    r.batch = size(0), r.stride_a = stride(1, 0), r.stride_b = stride(0, 0), r.stride_d = stride(out, 0);
    if (r.batch > 1 && (r.stride_d != M * N || r.bias)) return std::nullopt;  // one bias for every batch: not asked of cuBLASLt
  }
  r.a = a.ptrs[1], r.b = a.ptrs[0], r.d = a.ptrs[size_t(out)];
  return r;
}

// Runs `r` on `stream` (a workspace of the device's). Returns false where cuBLASLt has no algorithm for it.
inline bool run(const Gemm& r, cu::CudaDevice& dev, cu::CUstream stream) {
  const Api* lt = api();
  if (lt == nullptr) return false;
  static std::mutex mu;
  std::lock_guard lock(mu);
  auto& A = const_cast<Api&>(*lt);
  if (A.handle == nullptr && A.create(&A.handle) != 0) throw Error("kiln: cublasLtCreate failed");
  constexpr size_t kWorkspace = size_t(32) << 20;
  static std::unordered_map<int, cu::DeviceBuffer> workspaces;
  cu::DeviceBuffer& ws = workspaces[dev.ordinal()];
  if (ws.size() < kWorkspace) ws = cu::DeviceBuffer(kWorkspace, dev.ordinal());

  abi::Desc desc = nullptr;
  abi::Layout la = nullptr, lb = nullptr, ld = nullptr;
  abi::Pref pref = nullptr;
  auto check = [&](abi::Status s, const char* what) {
    if (s != 0) throw Error(std::string("kiln: cuBLASLt ") + what + " failed (status " + std::to_string(s) + ")");
  };
  bool ran = false;
  try {
    check(A.desc_create(&desc, r.tf32 ? abi::kCompute32FFastTF32 : abi::kCompute32F, abi::kR32F), "cublasLtMatmulDescCreate");
    int32_t ta = r.trans_a ? abi::kOpT : abi::kOpN, tb = r.trans_b ? abi::kOpT : abi::kOpN;
    check(A.desc_set(desc, abi::kDescTransA, &ta, sizeof ta), "TRANSA");
    check(A.desc_set(desc, abi::kDescTransB, &tb, sizeof tb), "TRANSB");
    uint32_t epi = r.bias ? abi::kEpilogueBias : abi::kEpilogueDefault;
    check(A.desc_set(desc, abi::kDescEpilogue, &epi, sizeof epi), "EPILOGUE");
    if (r.bias) check(A.desc_set(desc, abi::kDescBiasPointer, &r.bias, sizeof r.bias), "BIAS_POINTER");
    // Stored shapes: op(A) is m x k, op(B) is k x n.
    check(A.layout_create(&la, r.type, uint64_t(r.trans_a ? r.k : r.m), uint64_t(r.trans_a ? r.m : r.k), r.lda), "layout A");
    check(A.layout_create(&lb, r.type, uint64_t(r.trans_b ? r.n : r.k), uint64_t(r.trans_b ? r.k : r.n), r.ldb), "layout B");
    check(A.layout_create(&ld, r.type, uint64_t(r.m), uint64_t(r.n), r.ldd), "layout D");
    if (r.batch > 1) {
      int32_t count = int32_t(r.batch);
      for (auto [lay, stride] : {std::pair{la, r.stride_a}, std::pair{lb, r.stride_b}, std::pair{ld, r.stride_d}}) {
        check(A.layout_set(lay, abi::kLayoutBatchCount, &count, sizeof count), "BATCH_COUNT");
        check(A.layout_set(lay, abi::kLayoutStridedBatchOffset, &stride, sizeof stride), "STRIDED_BATCH_OFFSET");
      }
    }
    check(A.pref_create(&pref), "cublasLtMatmulPreferenceCreate");
    uint64_t wsb = kWorkspace;
    check(A.pref_set(pref, abi::kPrefMaxWorkspaceBytes, &wsb, sizeof wsb), "MAX_WORKSPACE_BYTES");
    abi::HeuristicResult h{};
    int found = 0;
    if (A.heuristic(A.handle, desc, la, lb, ld, ld, pref, 1, &h, &found) == 0 && found > 0) {
      float one = 1, zero = 0;
      check(A.matmul(A.handle, desc, &one, r.a, la, r.b, lb, &zero, r.d, ld, r.d, ld, &h.algo, reinterpret_cast<void*>(ws.ptr()),
                     kWorkspace, stream),
            "cublasLtMatmul");
      ran = true;
    }
  } catch (...) {
    if (pref) A.pref_destroy(pref);
    for (abi::Layout x : {la, lb, ld})
      if (x) A.layout_destroy(x);
    if (desc) A.desc_destroy(desc);
    throw;
  }
  A.pref_destroy(pref);
  for (abi::Layout x : {la, lb, ld}) A.layout_destroy(x);
  A.desc_destroy(desc);
  return ran;
}

}  // namespace kiln::runtime::cublaslt
