// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Device helpers (codegen/device/*) are real source files, kept beside the
// headers and installed with them; generated sources paste them in as text, so
// the cache key covers their content. Takes a file name; gives its text.
#pragma once
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>

#include "kiln/core/error.hpp"

namespace kiln::codegen::detail {

inline std::string read_device_file(const char* name) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::string> cache;
  std::lock_guard lock(mu);
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  std::string here = __FILE__;
  std::string path = here.substr(0, here.find_last_of('/') + 1) + "device/" + name;
  std::ifstream in(path);
  if (!in) throw Error("kiln: cannot read device helper " + path + " (is kiln's include/ tree installed whole?)");
  std::stringstream ss;
  ss << in.rdbuf();
  return cache[name] = "// ---- " + std::string(name) + " ----\n" + ss.str() + "\n";
}

}  // namespace kiln::codegen::detail
