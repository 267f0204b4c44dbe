// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// A fresh private cache directory (kernels, tuning database) for one test.
#pragma once
#include <stdlib.h>

#include <cstdlib>
#include <string>

#include <doctest/doctest.h>

#include "kiln/tune/db.hpp"

namespace kiln::test {

// A fresh private cache directory for one test, KILN_CACHE_DIR restored after.
struct ScratchCache {
  std::string dir, saved;
  bool had = false;
  ScratchCache() {
    char tmpl[] = "/tmp/kiln-tune-XXXXXX";
    dir = ::mkdtemp(tmpl);
    if (const char* e = std::getenv("KILN_CACHE_DIR")) had = true, saved = e;
    ::setenv("KILN_CACHE_DIR", dir.c_str(), 1);
    tune::db().clear_memory();
  }
  ~ScratchCache() {
    if (had) ::setenv("KILN_CACHE_DIR", saved.c_str(), 1);
    else ::unsetenv("KILN_CACHE_DIR");
    tune::db().clear_memory();
    std::string cmd = "rm -rf '" + dir + "'";
    if (std::system(cmd.c_str()) != 0) MESSAGE("could not remove " << dir);
  }
};

}  // namespace kiln::test
