// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Run-time sizes and strides. Takes shapes; gives broadcasting, contiguous
// strides, formatting for error messages, and ShapeError (names the op and shapes).
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "kiln/core/error.hpp"

namespace kiln {

inline constexpr int kMaxRank = 8;

template <int R>
using Shape = std::array<int64_t, R>;

struct ShapeError : Error {
  using Error::Error;
};

inline std::string format_shape(std::span<const int64_t> s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

template <size_t R>
int64_t numel(const std::array<int64_t, R>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

template <size_t R>
std::array<int64_t, R> contiguous_strides(const std::array<int64_t, R>& s) {
  std::array<int64_t, R> st{};
  int64_t acc = 1;
  for (int i = int(R) - 1; i >= 0; --i) st[i] = acc, acc *= s[i];
  return st;
}

// numpy broadcasting: shapes aligned on the right; a size-1 dim stretches.
template <size_t RA, size_t RB>
std::array<int64_t, (RA > RB ? RA : RB)> broadcast_shapes(const char* op, const std::array<int64_t, RA>& a,
                                                           const std::array<int64_t, RB>& b) {
  constexpr int R = RA > RB ? RA : RB;
  std::array<int64_t, R> out{};
  for (int i = 0; i < R; ++i) {
    int ia = i - (R - int(RA)), ib = i - (R - int(RB));
    int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1)
      throw ShapeError(std::string("kiln: ") + op + ": shapes " + format_shape(a) + " and " +
                       format_shape(b) + " do not broadcast (dim " + std::to_string(i) + ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// Normalises a possibly negative axis; throws naming the op when out of range.
inline int normalize_axis(const char* op, int axis, int rank) {
  int a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= (rank == 0 ? 1 : rank))
    throw ShapeError(std::string("kiln: ") + op + ": axis " + std::to_string(axis) +
                     " out of range for rank " + std::to_string(rank));
  return a;
}

}  // namespace kiln
