// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Tests of KILN_LOG parsing, KILN_DUMP and the public counters.
#include <doctest/doctest.h>

#include <cstdlib>

#include "kiln/core/log.hpp"
#include "kiln/runtime/counters.hpp"

namespace {
unsigned bit(kiln::LogTopic t) { return kiln::detail::log_bit(t); }
}  // namespace

TEST_CASE("KILN_LOG topics parse as a comma list") {
  using kiln::LogTopic;
  using kiln::detail::parse_log_topics;
  CHECK(parse_log_topics("") == 0);
  CHECK(parse_log_topics("cache") == bit(LogTopic::cache));
  CHECK(parse_log_topics("jit,tune") == (bit(LogTopic::jit) | bit(LogTopic::tune)));
  CHECK(parse_log_topics(" sched , cache ,") == (bit(LogTopic::sched) | bit(LogTopic::cache)));
  const unsigned all = bit(LogTopic::jit) | bit(LogTopic::cache) | bit(LogTopic::sched) | bit(LogTopic::tune);
  CHECK(parse_log_topics("all") == all);
  CHECK(parse_log_topics("bogus,jit") == bit(LogTopic::jit));  // the unknown one is reported on stderr
}

TEST_CASE("dump_dir follows KILN_DUMP") {
  ::unsetenv("KILN_DUMP");
  CHECK_FALSE(kiln::dump_dir().has_value());
  ::setenv("KILN_DUMP", "", 1);
  CHECK_FALSE(kiln::dump_dir().has_value());
  ::setenv("KILN_DUMP", "/tmp/kiln-dump-test", 1);
  CHECK(kiln::dump_dir() == "/tmp/kiln-dump-test");
  ::unsetenv("KILN_DUMP");
}

TEST_CASE("counters snapshot and reset") {
  kiln::reset_counters();
  auto& s = kiln::detail::counters_state();
  s.compiles += 2;
  s.memory_hits += 3;
  s.disk_hits += 4;
  s.kernels_launched += 5;
  s.kernels_filling += 6;
  kiln::Counters c = kiln::counters();
  CHECK(c.compiles == 2);
  CHECK(c.memory_hits == 3);
  CHECK(c.disk_hits == 4);
  CHECK(c.kernels_launched == 5);
  CHECK(c.kernels_filling == 6);

  // Every row of the table reads its own atomic into its own field: distinct values in, the
  // same values out. A row that shared an atomic or a field with another would read the other's
  // value; with counters.hpp's static_asserts on the sizes, the table covers every counter once.
  uint64_t v = 100;
  for (const auto& f : kiln::detail::kCounterFields) (s.*f.tally).store(v++);
  c = kiln::counters();
  v = 100;
  for (const auto& f : kiln::detail::kCounterFields) CHECK(c.*f.value == v++);

  kiln::reset_counters();
  c = kiln::counters();
  for (const auto& f : kiln::detail::kCounterFields) CHECK(c.*f.value == 0);
}
