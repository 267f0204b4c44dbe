// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Diagnostics switched on from the environment. Takes in KILN_LOG (a comma list
// of topics: jit, cache, sched, tune, or `all`) and KILN_DUMP (a directory);
// gives out log_enabled(topic), log(topic, msg) printing `[kiln:<topic>] msg`
// to stderr, and dump_dir().
#pragma once

#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>

namespace kiln {

enum class LogTopic : unsigned { jit, cache, sched, tune };

namespace detail {

inline constexpr std::string_view kLogTopicNames[] = {"jit", "cache", "sched", "tune"};

inline unsigned log_bit(LogTopic t) { return 1u << static_cast<unsigned>(t); }

// "jit, cache" -> bits of jit|cache; "all" -> every bit. Unknown names are
// reported once on stderr rather than ignored, so a typo does not look like
// "nothing happened".
inline unsigned parse_log_topics(std::string_view spec) {
  unsigned mask = 0;
  while (!spec.empty()) {
    size_t comma = spec.find(',');
    std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (item.empty()) continue;
    if (item == "all") {
      mask |= (1u << std::size(kLogTopicNames)) - 1;
      continue;
    }
    bool known = false;
    for (unsigned i = 0; i < std::size(kLogTopicNames); ++i) {
      if (item == kLogTopicNames[i]) {
        mask |= 1u << i;
        known = true;
      }
    }
    if (!known) {
      std::string msg = "[kiln] KILN_LOG: unknown topic '" + std::string(item) +
                        "' (known: jit, cache, sched, tune, all)\n";
      std::fwrite(msg.data(), 1, msg.size(), stderr);
    }
  }
  return mask;
}

// NOTE: read once; the first call fixes the topics for the process (a check on
// the hot path must stay a load and a test).
inline unsigned log_mask() {
  static const unsigned mask = [] {
    const char* env = std::getenv("KILN_LOG");
    return env ? parse_log_topics(env) : 0u;
  }();
  return mask;
}

}  // namespace detail

inline bool log_enabled(LogTopic t) { return (detail::log_mask() & detail::log_bit(t)) != 0; }

// Prints only when the topic is enabled.
// NOTE: inside namespace kiln this name hides ::log from <cmath>; kernel host
// references should spell the math function std::log. Guard with log_enabled() when building
// the message costs something.
inline void log(LogTopic t, std::string_view msg) {
  if (!log_enabled(t)) return;
  std::string line = "[kiln:";
  line += detail::kLogTopicNames[static_cast<unsigned>(t)];
  line += "] ";
  line += msg;
  line += '\n';
  // One write per line so lines from several threads or processes do not interleave.
  std::fwrite(line.data(), 1, line.size(), stderr);
}

// $KILN_DUMP if set and non-empty. Read on each call (it is asked once per
// compile, not per launch), so a program or test may switch it on for a while.
inline std::optional<std::string> dump_dir() {
  const char* env = std::getenv("KILN_DUMP");
  if (env == nullptr || *env == '\0') return std::nullopt;
  return std::string(env);
}

}  // namespace kiln
