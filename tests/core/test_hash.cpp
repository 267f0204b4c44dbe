// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Tests of the stable hash: golden digests (the hash names files on disk, so a
// change here silently orphans every cache), framing, streaming == one-shot.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <unordered_map>

#include "kiln/core/hash.hpp"

namespace {

std::string le64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return s;
}

std::string framed(std::string_view piece) { return le64(piece.size()) + std::string(piece); }

}  // namespace

TEST_CASE("hash_bytes is MurmurHash3 x64_128 (reference vectors)") {
  // Vectors from Guava's Murmur3_128HashFunctionTest (seed 0), h1 = lo, h2 = hi.
  CHECK(kiln::hash_bytes("") == kiln::Hash128{0, 0});
  CHECK(kiln::hash_bytes("hell") == kiln::Hash128{0x629942693e10f867ull, 0x92db0b82baeb5347ull});
  CHECK(kiln::hash_bytes("The quick brown fox jumps over the lazy dog") ==
        kiln::Hash128{0xe34bbc7bbc071b6cull, 0x7a433ca9c49a9347ull});
  CHECK(kiln::hash_bytes("The quick brown fox jumps over the lazy cog") ==
        kiln::Hash128{0x658ca970ff85269aull, 0x43fee3eaa68e5c3eull});
  // Seeded vectors exercise every tail length 5..9 through the same stream.
  struct Seeded {
    uint64_t seed;
    const char* text;
    kiln::Hash128 expected;
  };
  const Seeded seeded[] = {
      {1, "hello", {0xa78ddff5adae8d10ull, 0x128900ef20900135ull}},
      {2, "hello ", {0x8a486b23f422e826ull, 0xf962a2c58947765full}},
      {3, "hello w", {0x2ea59f466f6bed8cull, 0xc610990acc428a17ull}},
      {4, "hello wo", {0x79f6305a386c572cull, 0x46305aed3483b94eull}},
      {5, "hello wor", {0xc2219d213ec1f1b5ull, 0xa1d8e2e0a52785bdull}},
  };
  for (const auto& s : seeded) {
    kiln::detail::Murmur3Stream m(s.seed);
    m.update(s.text, std::char_traits<char>::length(s.text));
    CHECK(m.digest() == s.expected);
  }
}

TEST_CASE("golden digests of kiln's own framing") {
  // Computed once with this implementation; they must never change.
  CHECK(kiln::hash_bytes("hello").hex() == "cbd8a7b341bd9b025b1e906a48ae1d19");
  CHECK(kiln::hash_bytes("kiln").hex() == "f4a71a693c6e520e1bdcd9685f1d195e");
  CHECK(kiln::Hasher().add("ab").add("c").digest().hex() == "3cfd3fbd8bea0a2b668be2efb3287d4d");
  CHECK(kiln::Hasher().add(uint32_t{7}).add(3.5).digest().hex() == "4e9e63e715572a14a2a3a7486acbac31");
}

TEST_CASE("hex is 32 lowercase digits, lo first") {
  kiln::Hash128 h{0x0123456789abcdefull, 0xfedcba9876543210ull};
  CHECK(h.hex() == "0123456789abcdeffedcba9876543210");
  CHECK(kiln::Hash128{}.hex() == std::string(32, '0'));
}

TEST_CASE("streaming Hasher == one-shot hash of the framed pieces") {
  CHECK(kiln::Hasher().digest() == kiln::hash_bytes(""));
  CHECK(kiln::Hasher().add("").digest() == kiln::hash_bytes(framed("")));
  CHECK(kiln::Hasher().add("ab").add("c").digest() == kiln::hash_bytes(framed("ab") + framed("c")));
  std::string big(1000, 'x');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31 + 7);
  CHECK(kiln::Hasher().add(big).add("tail").add(uint64_t{42}).digest() ==
        kiln::hash_bytes(framed(big) + framed("tail") + framed(le64(42))));
}

TEST_CASE("the stream's digest does not depend on how the bytes were split") {
  std::string data(300, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 131 + 17);
  const kiln::Hash128 whole = kiln::hash_bytes(data);
  for (size_t step : {1u, 3u, 7u, 15u, 16u, 17u, 33u, 299u}) {
    kiln::detail::Murmur3Stream m;
    for (size_t i = 0; i < data.size(); i += step) m.update(data.data() + i, std::min(step, data.size() - i));
    CHECK_MESSAGE(m.digest() == whole, "step " << step);
  }
  // Every prefix length: the tail switch covers 0..15 leftover bytes.
  for (size_t n = 0; n <= 40; ++n) {
    kiln::detail::Murmur3Stream m;
    m.update(data.data(), n / 2);
    m.update(data.data() + n / 2, n - n / 2);
    CHECK(m.digest() == kiln::hash_bytes(std::string_view(data).substr(0, n)));
  }
}

TEST_CASE("different inputs differ") {
  CHECK(kiln::Hasher().add("ab").add("c").digest() != kiln::Hasher().add("a").add("bc").digest());
  CHECK(kiln::Hasher().add("abc").digest() != kiln::Hasher().add("ab").add("c").digest());
  CHECK(kiln::Hasher().add(uint32_t{1}).digest() != kiln::Hasher().add(uint64_t{1}).digest());
  CHECK(kiln::Hasher().add(1.0f).digest() != kiln::Hasher().add(1.0).digest());
  CHECK(kiln::hash_bytes("a") != kiln::hash_bytes("b"));
  CHECK(kiln::hash_bytes(std::string_view("\0", 1)) != kiln::hash_bytes(""));

  enum class Color : uint8_t { red, green };
  CHECK(kiln::Hasher().add(Color::red).digest() != kiln::Hasher().add(Color::green).digest());
  CHECK(kiln::Hasher().add(Color::green).digest() == kiln::Hasher().add(uint8_t{1}).digest());

  // No collisions among many short, similar inputs (a smoke test of mixing).
  std::unordered_map<kiln::Hash128, int, kiln::Hash128Hasher> seen;
  for (int i = 0; i < 5000; ++i) {
    auto result = seen.emplace(kiln::Hasher().add(i).digest(), i);
    if (!result.second) FAIL(i << " collides with " << result.first->second);
  }
}

TEST_CASE("a digest can be mixed into another") {
  kiln::Hash128 inner = kiln::hash_bytes("inner");
  CHECK(kiln::Hasher().add(inner).digest() ==
        kiln::hash_bytes(framed(le64(inner.lo) + le64(inner.hi))));
}
