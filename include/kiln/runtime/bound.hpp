// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The memory of one call: what binding (runtime/bind.hpp) gives and the front door
// (runtime/front.hpp) reads its outputs from.
#pragma once
#include <memory>
#include <vector>

#include "kiln/ir/graph.hpp"

namespace kiln::runtime {

// A node's memory: element 0 and the strides over its shape.
struct View {
  char* ptr = nullptr;  // element 0
  int rank = 0;
  ir::Dims shape{}, strides{};
};

// Buffers and views of one call.
struct Bound {
  std::vector<std::shared_ptr<Storage>> storage;  // per node (materialized ones)
  std::vector<View> views;                        // per node with memory

  Bound() = default;
  Bound(Bound&&) = default;
  Bound& operator=(Bound&&) = default;
  // Buffers go back last allocated first: the caching allocator hands a size class's
  // blocks out last in, first out, so the plan's next call gets the same addresses (a
  // reduce-overhead graph then replays with no node to update).
  ~Bound() {
    while (!storage.empty()) storage.pop_back();
  }
};

}  // namespace kiln::runtime
