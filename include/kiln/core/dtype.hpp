// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// dtypes as types. Takes nothing; gives the dtype tags (f32, f64, f16, bf16, i32,
// i64, boolean), their storage and compute types, the runtime DType enum and the
// host conversions for the 16-bit floats (16-bit storage, f32 arithmetic).
#pragma once
#include <bit>
#include <concepts>
#include <cstdint>
#include <string_view>

namespace kiln {

enum class DType : uint8_t { f32, f64, f16, bf16, i32, i64, boolean };

// 16-bit float storage; arithmetic always happens in f32.
struct half { uint16_t bits; };
struct bfloat16 { uint16_t bits; };

inline float bf16_to_float(uint16_t b) { return std::bit_cast<float>(uint32_t(b) << 16); }
inline uint16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // keep NaN a NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                           // round to nearest even
  return uint16_t(u >> 16);
}
inline float f16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  if (exp == 0) {  // zero or subnormal: value = man * 2^-24
    float v = float(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (man << 13));
}
inline uint16_t float_to_f16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f), sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return uint16_t(sign | 0x7e00u);           // NaN
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);          // overflow → inf
  if (a < 0x38800000u) {                                          // subnormal or zero in f16
    float v = std::bit_cast<float>(a) * 16777216.0f;              // scale by 2^24, exact
    uint32_t m = uint32_t(v);                                     // truncate, then round half to even
    float rem = v - float(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return uint16_t(sign | m);
  }
  a += 0xfffu + ((a >> 13) & 1u) - (112u << 23);
  return uint16_t(sign | (a >> 13));
}

// A dtype tag names the storage type and the type arithmetic is done in.
template <DType Id, class Storage, class Compute>
struct DTypeBase {
  using storage = Storage;
  using compute = Compute;
  static constexpr DType id = Id;
};
struct f32 : DTypeBase<DType::f32, float, float> {};
struct f64 : DTypeBase<DType::f64, double, double> {};
struct f16 : DTypeBase<DType::f16, half, float> {};
struct bf16 : DTypeBase<DType::bf16, bfloat16, float> {};
struct i32 : DTypeBase<DType::i32, int32_t, int32_t> {};
struct i64 : DTypeBase<DType::i64, int64_t, int64_t> {};
struct boolean : DTypeBase<DType::boolean, bool, bool> {};

template <class T>
concept DTypeTag = requires {
  typename T::storage;
  typename T::compute;
  { T::id } -> std::convertible_to<DType>;
};
template <class T>
concept FloatDType = DTypeTag<T> && std::floating_point<typename T::compute>;
template <class T>
concept NumericDType = DTypeTag<T> && !std::same_as<T, boolean>;

struct DTypeInfo {
  std::string_view name, storage_src, compute_src;
  uint8_t bytes;
  bool is_float;
};
inline constexpr DTypeInfo kDTypeInfo[] = {
    {"f32", "float", "float", 4, true},          {"f64", "double", "double", 8, true},
    {"f16", "uint16_t", "float", 2, true},       {"bf16", "uint16_t", "float", 2, true},
    {"i32", "int32_t", "int32_t", 4, false},     {"i64", "int64_t", "int64_t", 8, false},
    {"boolean", "bool", "bool", 1, false},
};
constexpr const DTypeInfo& info(DType d) { return kDTypeInfo[int(d)]; }

// Host conversions between a dtype's storage and double (tests, element access).
template <DTypeTag DT>
double to_double(typename DT::storage v) {
  if constexpr (std::same_as<DT, f16>) return f16_to_float(v.bits);
  else if constexpr (std::same_as<DT, bf16>) return bf16_to_float(v.bits);
  else return double(v);
}
template <DTypeTag DT>
typename DT::storage from_double(double v) {
  if constexpr (std::same_as<DT, f16>) return half{float_to_f16(float(v))};
  else if constexpr (std::same_as<DT, bf16>) return bfloat16{float_to_bf16(float(v))};
  else return typename DT::storage(v);
}

}  // namespace kiln
