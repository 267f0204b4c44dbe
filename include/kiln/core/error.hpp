// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The exception types every stage throws. Takes nothing in; gives out kiln::Error
// (anything kiln refuses or fails at, with a message naming what and where) and
// kiln::CompileError (a JIT compile failed; its message carries the compiler log
// and the path of the dumped source).
#pragma once

#include <stdexcept>

namespace kiln {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct CompileError : Error {
  using Error::Error;
};

}  // namespace kiln
