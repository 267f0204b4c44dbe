// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The public API. The pipeline, in order:
//   expr/      capture: expressions are types, sizes are values
//   prims/     the primitive table; composites decomposed over it
//   autograd/  kiln::grad: reverse traversal with the gradient-rule table
//   ir/        flatten the expression to a DAG with a structural signature
//   sched/     group nodes into kernels (fusion)
//   codegen/   kernel source: C++ (CPU), CUDA and HIP
//   jit/       host compiler / NVRTC / hipRTC, content-addressed cache
//   runtime/   bind buffers, launch, eager and compiled modes (front.hpp: the front door)
#pragma once
// nn blocks and optimisers: #include <kiln/nn/modules.hpp> (not included here).
#include "kiln/autograd/grad.hpp"
#include "kiln/expr/expr.hpp"
#include "kiln/prims/decomp.hpp"
#include "kiln/runtime/front.hpp"
// The engine, unless it is compiled once elsewhere (KILN_SEPARATE_ENGINE: runtime/front.hpp).
// The GPU runtimes register their backends when included.
#if !defined(KILN_SEPARATE_ENGINE) || defined(KILN_ENGINE_IMPLEMENTATION)
#include "kiln/runtime/cuda_backend.hpp"
#include "kiln/runtime/eval.hpp"
#include "kiln/runtime/hip_backend.hpp"
#include "kiln/runtime/precompile.hpp"
#include "kiln/tune/db.hpp"
#endif
