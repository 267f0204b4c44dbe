// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// What the GPU source compilers (nvrtc.hpp, hiprtc.hpp) share around the
// compiler call itself. Takes in a source, its options, a name hint and the
// cache key; gives out file names safe to create, the KILN_DUMP files (source,
// then options + log), and on failure the path of a kept copy of the source for
// the CompileError message.
// NOTE: namespace kiln::jit::rtc, so it can sit beside the copies nvrtc.hpp still
// keeps in kiln::jit::detail until that file moves onto this one.
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/log.hpp"
#include "kiln/jit/cache.hpp"

namespace kiln::jit::rtc {

inline std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

inline std::string join_options(const std::vector<std::string>& options) {
  std::string out;
  for (const auto& o : options) out += (out.empty() ? "" : " ") + o;
  return out;
}

// Letters, digits, '_' and '-' only, so a name hint is safe in a file name.
inline std::string safe_file_name(std::string_view name) {
  std::string out;
  for (char c : name.substr(0, 64)) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    out += ok ? c : '_';
  }
  return out.empty() ? "kernels" : out;
}

// Whole-file write for dumps, which are for people to read (not atomic).
inline void write_dump_file(const std::string& path, std::string_view text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f != nullptr && std::fclose(f) != 0) ok = false;
  if (!ok) throw Error("kiln: cannot write '" + path + "': " + detail::errno_text(errno));
}

inline bool is_elf(std::string_view bytes) {
  return bytes.size() >= 4 && bytes[0] == '\x7f' && bytes[1] == 'E' && bytes[2] == 'L' && bytes[3] == 'F';
}

// `<name>-<key hex>`: the stem of every file one compile writes.
inline std::string file_stem(std::string_view name_hint, const Hash128& key) {
  return safe_file_name(name_hint) + "-" + key.hex();
}

// With KILN_DUMP set, writes the source as <dump>/<stem><source_ext> before the
// compile, so it is there even if the compiler takes the process down.
inline void dump_source(const std::string& stem, std::string_view source_ext, std::string_view source) {
  if (auto dump = dump_dir()) {
    detail::make_dirs(*dump, 0755);
    write_dump_file(*dump + "/" + stem + std::string(source_ext), source);
  }
}

// With KILN_DUMP set, writes <dump>/<stem>.log: what ran, the result, the log.
inline void dump_log(const std::string& stem, std::string_view header, std::string_view log_text) {
  if (auto dump = dump_dir()) {
    detail::make_dirs(*dump, 0755);
    write_dump_file(*dump + "/" + stem + ".log", std::string(header) + "\n" + std::string(log_text) + "\n");
  }
}

// A path holding the source of a failed compile, for the CompileError message:
// the dump when KILN_DUMP is set (dump_source wrote it), else a new private temp
// directory `$TMPDIR/kiln-<tag>-XXXXXX`. Never throws: the error being reported
// matters more than the copy.
inline std::string keep_failed_source(std::string_view tag, const std::string& stem, std::string_view source_ext,
                                      std::string_view source) {
  try {
    if (auto dump = dump_dir()) return *dump + "/" + stem + std::string(source_ext);
    std::string tmp = env_or_empty("TMPDIR");
    std::string dir = (tmp.empty() ? std::string("/tmp") : tmp) + "/kiln-" + std::string(tag) + "-XXXXXX";
    if (::mkdtemp(dir.data()) == nullptr) {
      return "(not kept: cannot create a temp directory: " + detail::errno_text(errno) + ")";
    }
    std::string kept = dir + "/" + stem + std::string(source_ext);
    write_dump_file(kept, source);
    return kept;
  } catch (const std::exception& e) {
    return std::string("(not kept: ") + e.what() + ")";
  }
}

}  // namespace kiln::jit::rtc
