// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The exception types every stage throws. Takes nothing in; gives out kiln::Error
// (anything kiln refuses or fails at, with a message naming what and where) and
// kiln::CompileError (a JIT compile failed; its message carries the compiler log
// and the path of the dumped source); LazyText, a message part made only when an
// error needs it.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace kiln {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct CompileError : Error {
  using Error::Error;
};

// Text for an error message, made only if the error happens: fixed text, or a function
// of a context (a launch describes its kernel's shapes without formatting them per call).
struct LazyText {
  std::string (*make)(const void*) = nullptr;
  const void* context = nullptr;
  std::string_view fixed;

  LazyText() = default;
  LazyText(std::string_view s) : fixed(s) {}
  LazyText(const char* s) : fixed(s) {}
  LazyText(const std::string& s) : fixed(s) {}
  LazyText(std::string (*m)(const void*), const void* c) : make(m), context(c) {}
  bool empty() const { return !make && fixed.empty(); }
  std::string str() const { return make ? make(context) : std::string(fixed); }
};

}  // namespace kiln
