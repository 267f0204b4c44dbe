// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// A stable 128-bit hash. Takes in bytes (one-shot, or as a stream of framed
// pieces); gives out a Hash128 that is the same for the same input on every run,
// platform and standard library, so it can name files in the disk cache.
//
// The algorithm is MurmurHash3 x64_128 (Austin Appleby, public domain), seed 0:
//   hash_bytes(s)  == MurmurHash3_x64_128(s, 0)   (lo = h1, hi = h2)
//   Hasher().add(a).add(b).digest()
//                  == hash_bytes(le64(|a|) + a + le64(|b|) + b)
// i.e. the streaming Hasher prefixes every piece with its length as a
// little-endian u64, so ("ab","c") and ("a","bc") differ. Arithmetic and enum
// values are added as their little-endian object bytes (a piece of sizeof(T)).
//
// NOTE: not cryptographic. It only has to separate honest inputs; the cache's
// defence against tampering is the directory permission check, not the hash.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace kiln {

struct Hash128 {
  uint64_t lo = 0, hi = 0;

  friend bool operator==(const Hash128&, const Hash128&) = default;

  // 32 lowercase hex digits: lo then hi, each most significant digit first.
  std::string hex() const {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string out(32, '0');
    for (int i = 0; i < 16; ++i) {
      out[15 - i] = kDigits[(lo >> (4 * i)) & 0xF];
      out[31 - i] = kDigits[(hi >> (4 * i)) & 0xF];
    }
    return out;
  }
};

// For std::unordered_map<Hash128, ...>; the bits are already well mixed.
struct Hash128Hasher {
  size_t operator()(const Hash128& h) const noexcept {
    return static_cast<size_t>(h.lo ^ (h.hi * 0x9E3779B97F4A7C15ull));
  }
};

namespace detail {

inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

inline uint64_t fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

// NOTE: the hash is defined on little-endian words; swap on big-endian hosts so
// the digest of the same bytes is the same everywhere.
inline uint64_t to_le64(uint64_t v) {
  if constexpr (std::endian::native == std::endian::big) {
    uint64_t r = 0;
    for (int i = 0; i < 8; ++i) r = (r << 8) | ((v >> (8 * i)) & 0xFF);
    return r;
  }
  return v;
}

inline uint64_t load_le64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return to_le64(v);
}

// MurmurHash3 x64_128 over a byte stream fed in arbitrary chunks; the digest
// does not depend on how the stream was split. No allocation: a 16-byte carry.
class Murmur3Stream {
 public:
  explicit Murmur3Stream(uint64_t seed = 0) : h1_(seed), h2_(seed) {}

  void update(const void* data, size_t n) {
    auto* p = static_cast<const unsigned char*>(data);
    total_ += n;
    if (carry_len_ != 0) {
      size_t take = n < 16 - carry_len_ ? n : 16 - carry_len_;
      std::memcpy(carry_ + carry_len_, p, take);
      carry_len_ += take;
      p += take;
      n -= take;
      if (carry_len_ < 16) return;
      block(carry_);
      carry_len_ = 0;
    }
    for (; n >= 16; p += 16, n -= 16) block(p);
    if (n != 0) std::memcpy(carry_, p, n);
    carry_len_ = n;
  }

  Hash128 digest() const {
    uint64_t h1 = h1_, h2 = h2_, k1 = 0, k2 = 0;
    const unsigned char* tail = carry_;
    switch (carry_len_) {  // NOTE: every case falls through, as in the reference
      case 15: k2 ^= uint64_t(tail[14]) << 48; [[fallthrough]];
      case 14: k2 ^= uint64_t(tail[13]) << 40; [[fallthrough]];
      case 13: k2 ^= uint64_t(tail[12]) << 32; [[fallthrough]];
      case 12: k2 ^= uint64_t(tail[11]) << 24; [[fallthrough]];
      case 11: k2 ^= uint64_t(tail[10]) << 16; [[fallthrough]];
      case 10: k2 ^= uint64_t(tail[9]) << 8; [[fallthrough]];
      case 9:
        k2 ^= uint64_t(tail[8]);
        k2 *= kC2; k2 = rotl64(k2, 33); k2 *= kC1; h2 ^= k2;
        [[fallthrough]];
      case 8: k1 ^= uint64_t(tail[7]) << 56; [[fallthrough]];
      case 7: k1 ^= uint64_t(tail[6]) << 48; [[fallthrough]];
      case 6: k1 ^= uint64_t(tail[5]) << 40; [[fallthrough]];
      case 5: k1 ^= uint64_t(tail[4]) << 32; [[fallthrough]];
      case 4: k1 ^= uint64_t(tail[3]) << 24; [[fallthrough]];
      case 3: k1 ^= uint64_t(tail[2]) << 16; [[fallthrough]];
      case 2: k1 ^= uint64_t(tail[1]) << 8; [[fallthrough]];
      case 1:
        k1 ^= uint64_t(tail[0]);
        k1 *= kC1; k1 = rotl64(k1, 31); k1 *= kC2; h1 ^= k1;
        break;
      default: break;
    }
    h1 ^= total_;
    h2 ^= total_;
    h1 += h2;
    h2 += h1;
    h1 = fmix64(h1);
    h2 = fmix64(h2);
    h1 += h2;
    h2 += h1;
    return Hash128{h1, h2};
  }

 private:
  static constexpr uint64_t kC1 = 0x87c37b91114253d5ull;
  static constexpr uint64_t kC2 = 0x4cf5ad432745937full;

  void block(const unsigned char* p) {
    uint64_t k1 = load_le64(p), k2 = load_le64(p + 8);
    k1 *= kC1; k1 = rotl64(k1, 31); k1 *= kC2; h1_ ^= k1;
    h1_ = rotl64(h1_, 27); h1_ += h2_; h1_ = h1_ * 5 + 0x52dce729;
    k2 *= kC2; k2 = rotl64(k2, 33); k2 *= kC1; h2_ ^= k2;
    h2_ = rotl64(h2_, 31); h2_ += h1_; h2_ = h2_ * 5 + 0x38495ab5;
  }

  uint64_t h1_, h2_;
  uint64_t total_ = 0;
  unsigned char carry_[16] = {};
  size_t carry_len_ = 0;
};

}  // namespace detail

// Streaming hasher over length-prefixed pieces. Cheap enough for the hot path
// (hashing a small graph signature per call): fixed-size state, no allocation.
class Hasher {
 public:
  Hasher& add(const void* data, size_t n) {
    uint64_t len = detail::to_le64(static_cast<uint64_t>(n));
    stream_.update(&len, sizeof len);
    stream_.update(data, n);
    return *this;
  }

  Hasher& add(std::string_view s) { return add(s.data(), s.size()); }

  template <class T>
    requires std::is_arithmetic_v<T> || std::is_enum_v<T>
  Hasher& add(T v) {
    // NOTE: long double's object bytes include padding of unspecified value.
    static_assert(!std::is_same_v<std::remove_cv_t<T>, long double>, "hash a long double as double");
    unsigned char bytes[sizeof(T)];
    std::memcpy(bytes, &v, sizeof(T));
    if constexpr (std::endian::native == std::endian::big) {
      for (size_t i = 0; i < sizeof(T) / 2; ++i) std::swap(bytes[i], bytes[sizeof(T) - 1 - i]);
    }
    return add(bytes, sizeof(T));
  }

  // A digest as one piece of 16 bytes (lo then hi, little-endian), so keys can
  // be built from keys.
  Hasher& add(const Hash128& h) {
    unsigned char bytes[16];
    uint64_t lo = detail::to_le64(h.lo), hi = detail::to_le64(h.hi);
    std::memcpy(bytes, &lo, 8);
    std::memcpy(bytes + 8, &hi, 8);
    return add(bytes, sizeof bytes);
  }

  Hash128 digest() const { return stream_.digest(); }

 private:
  detail::Murmur3Stream stream_;
};

// MurmurHash3 x64_128 of the bytes of s, seed 0 (no length prefix).
inline Hash128 hash_bytes(std::string_view s) {
  detail::Murmur3Stream stream;
  stream.update(s.data(), s.size());
  return stream.digest();
}

}  // namespace kiln
