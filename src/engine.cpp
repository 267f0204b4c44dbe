// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The program's one engine file for KILN_SEPARATE_ENGINE (runtime/front.hpp): the
// engine's entry points, the CPU backend and the GPU runtimes compiled here once; the
// program's other files include kiln with KILN_SEPARATE_ENGINE defined and see only
// the front end. The CMake target kiln::engine builds it.
#ifndef KILN_SEPARATE_ENGINE
#define KILN_SEPARATE_ENGINE
#endif
#define KILN_ENGINE_IMPLEMENTATION
#include "kiln/kiln.hpp"
