// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The float64 reference the numeric tests compare kiln against. Takes shapes and
// values; gives:
//   Array        a dense row-major float64 array of any rank (the reference's only type)
//   ref::...     every primitive as plain nested loops over Arrays (pointwise math is
//                the primitive table's `host` column; reductions, movement, matmul and
//                Philox are written out here), and the composites as textbook formulas
//   Rng          fresh seeds from std::random_device each run (KILN_TEST_SEED=n repeats one)
//   input<DT,R>  a random kiln tensor and its Array, in a chosen memory layout:
//                contiguous, transposed, strided (slice with step 2 and an offset), or a
//                size-1 dim expanded (stride 0, outer or innermost)
//   check_close  kiln's result against the reference: shape, then every element within
//                rtol/atol; a failure names the worst element, its index and the seed
//
// Guidelines:
// - Independent of kiln's code path: nothing here calls codegen, the scheduler or the
//   runtime. Tensor values are written through host_data() and strides, and read back
//   with this file's own f16/bf16 decoders, so a conversion bug shows up too.
// - Outputs are poisoned: including this header turns on kiln's CPU allocation poison
//   (every new buffer filled with 0xFF bytes, i.e. NaN), so an element that a kernel
//   leaves unwritten fails check_close instead of passing by luck.
// - Inputs are rounded to their dtype before the reference sees them, so the reference
//   computes on exactly the values kiln reads; only kiln's arithmetic and output
//   rounding are left for the tolerance.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numbers>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kiln/kiln.hpp"

namespace kiln::test {

using Dims = std::vector<int64_t>;

// ---- shapes -------------------------------------------------------------------------
inline int64_t count(const Dims& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}
inline Dims row_major_strides(const Dims& s) {
  Dims st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) st[i] = acc, acc *= s[i];
  return st;
}
inline std::string str(const Dims& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}
template <size_t R>
Dims dims(const std::array<int64_t, R>& s) {
  return Dims(s.begin(), s.end());
}
// f(idx, linear) for every index of `shape` in row-major order.
template <class F>
void for_each_index(const Dims& shape, F&& f) {
  int64_t n = count(shape);
  Dims idx(shape.size(), 0);
  for (int64_t lin = 0; lin < n; ++lin) {
    f(static_cast<const Dims&>(idx), lin);
    for (size_t i = shape.size(); i-- > 0;) {
      if (++idx[i] < shape[i]) break;
      idx[i] = 0;
    }
  }
}
// numpy broadcasting, written again here (not kiln's broadcast_shapes).
inline Dims broadcast(const Dims& a, const Dims& b) {
  size_t r = std::max(a.size(), b.size());
  Dims out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i + a.size() >= r ? a[i + a.size() - r] : 1, db = i + b.size() >= r ? b[i + b.size() - r] : 1;
    REQUIRE_MESSAGE((da == db || da == 1 || db == 1), "reference: shapes do not broadcast");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// ---- the reference's array ----------------------------------------------------------
struct Array {
  Dims shape;
  std::vector<double> v;  // row-major

  Array() = default;
  explicit Array(Dims s, double fill = 0) : shape(std::move(s)), v(size_t(count(shape)), fill) {}
  int rank() const { return int(shape.size()); }
  int64_t numel() const { return int64_t(v.size()); }
  int64_t offset(const Dims& idx) const {
    int64_t off = 0;
    for (size_t i = 0; i < shape.size(); ++i) off = off * shape[i] + idx[i];
    return off;
  }
  double at(const Dims& idx) const { return v[size_t(offset(idx))]; }
  double& at(const Dims& idx) { return v[size_t(offset(idx))]; }
  // The element an output index of a broadcast result reads (right-aligned; size 1 stretches).
  double bcast(const Dims& out_idx) const {
    int64_t off = 0;
    size_t lead = out_idx.size() - shape.size();
    for (size_t i = 0; i < shape.size(); ++i) off = off * shape[i] + (shape[i] == 1 ? 0 : out_idx[lead + i]);
    return v[size_t(off)];
  }
};

// ---- dtypes: independent rounding and decoding ---------------------------------------
// Rounds a double to `bits` significant bits, nearest-even, with `min_exp` the exponent
// of the smallest normal (subnormals keep its quantum) and `max_finite` the overflow edge.
inline double round_significand(double x, int bits, int min_exp, double max_finite) {
  if (!std::isfinite(x) || x == 0) return x;
  int e = 0;
  std::frexp(x, &e);  // x = m 2^e, 0.5 <= |m| < 1
  int q = std::max(e, min_exp + 1) - bits;  // quantum exponent
  double r = std::nearbyint(std::ldexp(x, -q));
  double y = std::ldexp(r, q);
  double limit = max_finite + std::ldexp(1.0, std::ilogb(max_finite) - bits);  // max + half an ulp
  if (std::fabs(y) >= limit || std::fabs(y) > max_finite) return std::copysign(INFINITY, x);
  return y;
}
// The value `x` becomes when stored in dtype `d` (float→int truncates, like a C++ cast).
inline double round_to(DType d, double x) {
  switch (d) {
    case DType::f64: return x;
    case DType::f32: return double(float(x));
    case DType::bf16: return round_significand(x, 8, -126, 3.3895313892515355e38);
    case DType::f16: return round_significand(x, 11, -14, 65504.0);
    case DType::i32: return double(int32_t(std::trunc(x)));
    case DType::i64: return double(int64_t(std::trunc(x)));
    case DType::boolean: return x != 0 ? 1.0 : 0.0;
  }
  return x;
}
inline Array round_to(DType d, Array a) {
  for (double& x : a.v) x = round_to(d, x);
  return a;
}
// Storage → double, written apart from kiln's conversions.
template <class DT>
double decode(const typename DT::storage& s) {
  if constexpr (std::is_same_v<DT, f16>) {
    uint16_t h = s.bits;
    int sign = h >> 15, ex = (h >> 10) & 0x1f, man = h & 0x3ff;
    double mag = ex == 0x1f ? (man ? NAN : INFINITY) : ex == 0 ? std::ldexp(man, -24) : std::ldexp(1024 + man, ex - 25);
    return sign ? -mag : mag;
  } else if constexpr (std::is_same_v<DT, bf16>) {
    return double(std::bit_cast<float>(uint32_t(s.bits) << 16));
  } else if constexpr (std::is_same_v<DT, boolean>) {
    uint8_t byte;  // NOTE: read as a byte: a poisoned (never written) bool is 0xFF, not a valid bool
    std::memcpy(&byte, &s, 1);
    return byte == 0 ? 0.0 : byte == 1 ? 1.0 : NAN;
  } else {
    return double(s);
  }
}
template <class DT>
std::string dtype_name() {
  return std::string(info(DT::id).name);
}

// ---- reading and writing kiln tensors through their strides --------------------------
template <class DT, int R>
int64_t storage_offset(const Tensor<DT, R>& t, const Dims& idx) {
  int64_t off = 0;
  for (int i = 0; i < R; ++i) off += idx[size_t(i)] * t.strides()[size_t(i)];
  return off;
}
// The same view over a host copy of t's whole storage (t may live on a GPU).
template <class DT, int R>
Tensor<DT, R> on_host(const Tensor<DT, R>& t) {
  if (t.device() == cpu()) return t;
  auto host = std::make_shared<Storage>(t.storage()->bytes(), cpu());
  copy_bytes(host->data(), cpu(), t.storage()->data(), t.device(), t.storage()->bytes());
  return Tensor<DT, R>(host, t.offset(), t.sizes(), t.strides());
}
template <class DT, int R>
Array read(const Tensor<DT, R>& t0) {
  Array a(dims(t0.sizes()));
  if (a.numel() == 0) return a;
  Tensor<DT, R> t = on_host(t0);
  const auto* p = t.host_data();
  for_each_index(a.shape, [&](const Dims& idx, int64_t lin) { a.v[size_t(lin)] = decode<DT>(p[storage_offset(t, idx)]); });
  return a;
}

// ---- random numbers: fresh each run, reproducible on request -------------------------
inline uint64_t& current_seed() {
  static uint64_t s = 0;
  return s;
}
struct Rng {
  uint64_t seed;
  std::mt19937_64 gen;
  Rng() : seed(pick()), gen(seed) { current_seed() = seed; }
  static uint64_t pick() {
    if (const char* e = std::getenv("KILN_TEST_SEED"); e && *e) return std::strtoull(e, nullptr, 10);
    std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd();
  }
  double uniform(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(gen); }
  int64_t integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(gen); }
};
// Opens a test case: a fresh Rng whose seed every failure in the case reports.
#define KILN_TEST_RNG(name) \
  ::kiln::test::Rng name;   \
  INFO("random seed ", name.seed, " (repeat with KILN_TEST_SEED=", name.seed, ")")

// How random values are drawn: uniform in [lo, hi] (integers for integer dtypes, 0/1 for
// boolean), a `grid` fraction of them taken from {-1, 0, 0.5, 2} instead (ties for
// comparisons, exact zeros), and with `random_sign` the sign flipped at random.
struct Values {
  double lo = -3, hi = 3;
  double grid = 0;
  bool random_sign = false;
};
// Random values for dtype `d`, already rounded to it.
inline Array random_array(Rng& rng, DType d, Dims shape, Values how = {}) {
  static constexpr double kGrid[] = {-1, 0, 0.5, 2};
  Array a(std::move(shape));
  for (double& x : a.v) {
    if (d == DType::boolean) x = double(rng.integer(0, 1));
    else if (how.grid > 0 && rng.uniform(0, 1) < how.grid) x = kGrid[rng.integer(0, 3)];
    else if (!info(d).is_float) x = double(rng.integer(int64_t(std::ceil(how.lo)), int64_t(std::floor(how.hi))));
    else x = rng.uniform(how.lo, how.hi);
    if (how.random_sign && rng.integer(0, 1)) x = -x;
    x = round_to(d, x);
  }
  return a;
}

// ---- layouts of input tensors ---------------------------------------------------------
enum class Layout : uint8_t {
  contiguous,
  transposed,      // last two dims swapped in memory (rank 1: as strided)
  strided,         // innermost stride 2 and a non-zero offset: a slice with step 2
  expanded_outer,  // dim 0 is a size-1 dim expanded (stride 0)
  expanded_inner,  // the last dim is a size-1 dim expanded (stride 0 innermost)
};
inline const char* name(Layout l) {
  static const char* n[] = {"contiguous", "transposed", "strided", "expanded_outer", "expanded_inner"};
  return n[int(l)];
}

// A kiln tensor holding `values` (already representable in DT) in layout `l`. Expanded
// layouts need values that are constant along the expanded dim (see input()).
template <class DT, int R>
Tensor<DT, R> make_tensor(const Array& values, Layout l = Layout::contiguous) {
  REQUIRE(values.rank() == R);
  Shape<R> s{};
  for (int i = 0; i < R; ++i) s[size_t(i)] = values.shape[size_t(i)];
  if (R == 0) l = Layout::contiguous;
  if (R == 1 && l == Layout::transposed) l = Layout::strided;
  Tensor<DT, R> view, base;
  switch (l) {
    case Layout::contiguous: view = base = Tensor<DT, R>::empty(s, cpu()); break;
    case Layout::transposed: {
      if constexpr (R >= 2) {
        Shape<R> b = s;
        std::swap(b[R - 2], b[R - 1]);
        base = Tensor<DT, R>::empty(b, cpu());
        view = base.transpose(R - 2, R - 1);
      }
      break;
    }
    case Layout::strided: {
      if constexpr (R >= 1) {
        Shape<R> b = s;
        b[R - 1] = 2 * s[R - 1] + 1;
        base = Tensor<DT, R>::empty(b, cpu());
        view = base.slice(R - 1, 1, b[R - 1], 2);
      }
      break;
    }
    case Layout::expanded_outer:
    case Layout::expanded_inner: {
      if constexpr (R >= 1) {
        Shape<R> b = s;
        b[l == Layout::expanded_outer ? 0 : R - 1] = 1;
        base = Tensor<DT, R>::empty(b, cpu());
        view = base.expand(s);
      }
      break;
    }
  }
  REQUIRE(view.sizes() == s);
  if (values.numel() > 0) {  // NOTE: an empty tensor still moves to the default device below
    auto* p = view.host_data();
    for_each_index(values.shape, [&](const Dims& idx, int64_t lin) {
      p[storage_offset(view, idx)] = from_double<DT>(values.v[size_t(lin)]);
    });
    // kiln's from_double must store a representable value exactly: read it back independently.
    Array back = read(view);
    for (size_t i = 0; i < back.v.size(); ++i) {
      bool same = back.v[i] == values.v[i] || (std::isnan(back.v[i]) && std::isnan(values.v[i]));
      if (!same) {
        FAIL_CHECK("kiln::from_double<" << dtype_name<DT>() << "> stored " << values.v[i] << " as " << back.v[i]
                                        << " (layout " << name(l) << ")");
        break;
      }
    }
  }
  // Inputs live on the default device (KILN_DEVICE=cuda runs the whole suite on a GPU):
  // the same view, over a device copy of its storage.
  if (default_device() != cpu()) {
    auto dev = std::make_shared<Storage>(view.storage()->bytes(), default_device());
    copy_bytes(dev->data(), default_device(), view.storage()->data(), cpu(), view.storage()->bytes());
    return Tensor<DT, R>(dev, view.offset(), view.sizes(), view.strides());
  }
  return view;
}

template <class DT, int R>
struct Input {
  Tensor<DT, R> t;
  Array a;
};
// A random tensor of `shape` in layout `l` and its reference Array.
template <class DT, int R>
Input<DT, R> input(Rng& rng, Shape<R> shape, Layout l = Layout::contiguous, Values how = {}) {
  Dims s = dims(shape);
  Array a;
  if ((l == Layout::expanded_outer || l == Layout::expanded_inner) && R >= 1) {
    Dims b = s;
    b[l == Layout::expanded_outer ? 0 : R - 1] = 1;
    Array base = random_array(rng, DT::id, b, how);
    a = Array(s);
    for_each_index(s, [&](const Dims& idx, int64_t lin) { a.v[size_t(lin)] = base.bcast(idx); });
  } else {
    a = random_array(rng, DT::id, s, how);
  }
  return {make_tensor<DT, R>(a, l), a};
}

// ---- comparison -----------------------------------------------------------------------
struct Tol {
  double rtol, atol;
  Tol scaled(double k) const { return {rtol * k, atol * k}; }
};
// Per-dtype tolerance of one rounding in the output plus a few ulps of arithmetic.
inline Tol tol_for(DType d) {
  switch (d) {
    case DType::f64: return {1e-12, 1e-13};
    case DType::f32: return {1e-5, 1e-6};
    case DType::f16: return {2e-3, 1e-5};
    case DType::bf16: return {1e-2, 1e-4};
    default: return {0, 0};
  }
}
template <class DT>
Tol tol() {
  return tol_for(DT::id);
}

inline std::string fmt(double x) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", x);
  return b;
}

// Checks `got` against `want` elementwise: |got - want| <= atol + rtol * (|want| or the
// matching element of `scale`, when given: the magnitude a sum or a dot product went
// through). NaN matches NaN, an infinity only itself. Reports the worst element.
inline bool check_close(const Array& got, const Array& want, Tol t, const std::string& what, const Array* scale = nullptr,
                        const std::string& dtype = "") {
  if (got.shape != want.shape) {
    FAIL_CHECK(what << ": shape " << str(got.shape) << ", want " << str(want.shape) << " (seed " << current_seed() << ")");
    return false;
  }
  int64_t bad = 0, worst = -1;
  double worst_ratio = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    double g = got.v[size_t(i)], w = want.v[size_t(i)];
    double ratio;
    if (std::isnan(w) || std::isnan(g)) ratio = std::isnan(w) && std::isnan(g) ? 0 : INFINITY;
    else if (std::isinf(w) || std::isinf(g)) ratio = g == w ? 0 : INFINITY;
    else {
      double mag = scale ? scale->v[size_t(i)] : std::fabs(w);
      double bound = t.atol + t.rtol * mag;
      double diff = std::fabs(g - w);
      ratio = diff == 0 ? 0 : bound == 0 ? INFINITY : diff / bound;
    }
    if (ratio > 1) {
      ++bad;
      if (worst < 0 || ratio > worst_ratio) worst = i, worst_ratio = ratio;
    }
  }
  if (bad == 0) return true;
  Dims idx(want.shape.size());
  for (int64_t r = worst, i = int64_t(idx.size()) - 1; i >= 0; --i) idx[size_t(i)] = r % want.shape[size_t(i)], r /= want.shape[size_t(i)];
  double g = got.v[size_t(worst)], w = want.v[size_t(worst)];
  FAIL_CHECK(what << " [" << dtype << std::string(dtype.empty() ? "" : " ") << str(got.shape) << "]: " << bad << " of "
                  << want.numel() << " elements differ; worst at " << str(idx) << ": got " << fmt(g) << ", want " << fmt(w)
                  << " (|diff| " << fmt(std::fabs(g - w)) << ", rtol " << t.rtol << ", atol " << t.atol
                  << std::string(scale ? ", scaled" : "") << "); seed " << current_seed() << " (KILN_TEST_SEED="
                  << current_seed() << ")");
  return false;
}
template <class DT, int R>
bool check_close(const Tensor<DT, R>& got, const Array& want, Tol t, const std::string& what,
                 const Array* scale = nullptr) {
  return check_close(read(got), want, t, what, scale, dtype_name<DT>());
}
template <class DT, int R>
bool check_close(const Tensor<DT, R>& got, const Array& want, const std::string& what) {
  return check_close(got, want, tol<DT>(), what);
}

// ---- the reference evaluator -------------------------------------------------------------
namespace ref {

template <class F>
Array map(const Array& a, F&& f) {
  Array out(a.shape);
  for (size_t i = 0; i < a.v.size(); ++i) out.v[i] = f(a.v[i]);
  return out;
}
template <class F>
Array zip(const Array& a, const Array& b, F&& f) {
  Array out(broadcast(a.shape, b.shape));
  for_each_index(out.shape, [&](const Dims& idx, int64_t lin) { out.v[size_t(lin)] = f(a.bcast(idx), b.bcast(idx)); });
  return out;
}
template <class F>
Array zip3(const Array& a, const Array& b, const Array& c, F&& f) {
  Array out(broadcast(broadcast(a.shape, b.shape), c.shape));
  for_each_index(out.shape, [&](const Dims& idx, int64_t lin) {
    out.v[size_t(lin)] = f(a.bcast(idx), b.bcast(idx), c.bcast(idx));
  });
  return out;
}
inline Array scalar(double x) { return Array(Dims{}, x); }
// A pointwise primitive by its table row: the row's `host` function is the math.
inline Array prim(Prim p, const Array& a) {
  auto h = prim_info(p).host;
  return map(a, [&](double x) { return h(x, 0, 0); });
}
inline Array prim(Prim p, const Array& a, const Array& b) {
  auto h = prim_info(p).host;
  return zip(a, b, [&](double x, double y) { return h(x, y, 0); });
}
inline Array prim(Prim p, const Array& a, const Array& b, const Array& c) {
  auto h = prim_info(p).host;
  return zip3(a, b, c, [&](double x, double y, double z) { return h(x, y, z); });
}
// The dtype semantics of a result: integer division truncates, predicates are 0/1, ...
inline Array as(DType d, const Array& a) { return round_to(d, a); }

inline int norm_axis(int axis, int rank) { return axis < 0 ? axis + rank : axis; }

// Reduction of a primitive row (sum, amax, amin) over `axes`; combine = the row's host.
inline Array reduce(Prim p, const Array& a, std::vector<int> axes, bool keepdim = false) {
  int r = a.rank();
  std::vector<bool> red(size_t(r), false);
  for (int& ax : axes) red[size_t(norm_axis(ax, r))] = true;
  Dims keep = a.shape;
  for (int i = 0; i < r; ++i)
    if (red[size_t(i)]) keep[size_t(i)] = 1;
  double init = p == Prim::sum ? 0.0 : p == Prim::amax ? -INFINITY : INFINITY;
  Array out(keep, init);
  auto h = prim_info(p).host;
  for_each_index(a.shape, [&](const Dims& idx, int64_t lin) {
    Dims o = idx;
    for (int i = 0; i < r; ++i)
      if (red[size_t(i)]) o[size_t(i)] = 0;
    double& acc = out.at(o);
    acc = h(acc, a.v[size_t(lin)], 0);
  });
  if (!keepdim) {
    Dims s;
    for (int i = 0; i < r; ++i)
      if (!red[size_t(i)]) s.push_back(a.shape[size_t(i)]);
    out.shape = s;
  }
  return out;
}
inline std::vector<int> all_axes(const Array& a) {
  std::vector<int> ax;
  for (int i = 0; i < a.rank(); ++i) ax.push_back(i);
  return ax;
}
inline Array sum(const Array& a, std::vector<int> axes, bool keepdim = false) { return reduce(Prim::sum, a, std::move(axes), keepdim); }
inline Array amax(const Array& a, std::vector<int> axes, bool keepdim = false) { return reduce(Prim::amax, a, std::move(axes), keepdim); }
// sum |x| over the same axes: the magnitude a sum's rounding error scales with.
inline Array abs_sum(const Array& a, std::vector<int> axes, bool keepdim = false) {
  return sum(map(a, [](double x) { return std::fabs(x); }), std::move(axes), keepdim);
}

// ---- movement ----
inline Array permute(const Array& a, const std::vector<int>& perm) {
  Dims s(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) s[i] = a.shape[size_t(perm[i])];
  Array out(s);
  Dims src(perm.size());
  for_each_index(s, [&](const Dims& idx, int64_t lin) {
    for (size_t i = 0; i < perm.size(); ++i) src[size_t(perm[i])] = idx[i];
    out.v[size_t(lin)] = a.at(src);
  });
  return out;
}
inline Array transpose(const Array& a, int d0, int d1) {
  std::vector<int> perm;
  for (int i = 0; i < a.rank(); ++i) perm.push_back(i);
  std::swap(perm[size_t(norm_axis(d0, a.rank()))], perm[size_t(norm_axis(d1, a.rank()))]);
  return permute(a, perm);
}
// Python slicing a[start:stop:step] along dim (negative start/stop count from the end).
inline Array slice(const Array& a, int dim, int64_t start, int64_t stop, int64_t step = 1) {
  dim = norm_axis(dim, a.rank());
  int64_t n = a.shape[size_t(dim)];
  if (start < 0) start += n;
  if (stop < 0) stop += n;
  start = std::clamp<int64_t>(start, 0, n), stop = std::clamp<int64_t>(stop, start, n);
  Dims s = a.shape;
  s[size_t(dim)] = 0;
  for (int64_t i = start; i < stop; i += step) ++s[size_t(dim)];
  Array out(s);
  for_each_index(s, [&](const Dims& idx, int64_t lin) {
    Dims src = idx;
    src[size_t(dim)] = start + idx[size_t(dim)] * step;
    out.v[size_t(lin)] = a.at(src);
  });
  return out;
}
inline Array reshape(Array a, Dims s) {
  REQUIRE(count(s) == a.numel());
  a.shape = std::move(s);
  return a;
}
inline Array expand(const Array& a, const Dims& s) {
  Array out(s);
  for_each_index(s, [&](const Dims& idx, int64_t lin) { out.v[size_t(lin)] = a.bcast(idx); });
  return out;
}
inline Array concat(int dim, const std::vector<Array>& parts) {
  dim = norm_axis(dim, parts[0].rank());
  Dims s = parts[0].shape;
  s[size_t(dim)] = 0;
  for (const Array& p : parts) s[size_t(dim)] += p.shape[size_t(dim)];
  Array out(s);
  int64_t at = 0;
  for (const Array& p : parts) {
    for_each_index(p.shape, [&](const Dims& idx, int64_t lin) {
      Dims o = idx;
      o[size_t(dim)] += at;
      out.at(o) = p.v[size_t(lin)];
    });
    at += p.shape[size_t(dim)];
  }
  return out;
}
inline Array pad(const Array& a, const Dims& before, const Dims& after, double value) {
  Dims s = a.shape;
  for (size_t i = 0; i < s.size(); ++i) s[i] += before[i] + after[i];
  Array out(s, value);
  for_each_index(a.shape, [&](const Dims& idx, int64_t lin) {
    Dims o = idx;
    for (size_t i = 0; i < o.size(); ++i) o[i] += before[i];
    out.at(o) = a.v[size_t(lin)];
  });
  return out;
}

// ---- matmul: [..., M, K] @ [..., K, N], batch dims broadcast. `abs_scale`: sum |a||b| ----
inline Array matmul(const Array& a, const Array& b, Array* abs_scale = nullptr) {
  int ra = a.rank(), rb = b.rank();
  int64_t M = a.shape[size_t(ra - 2)], K = a.shape[size_t(ra - 1)], N = b.shape[size_t(rb - 1)];
  REQUIRE(b.shape[size_t(rb - 2)] == K);
  Dims ba(a.shape.begin(), a.shape.end() - 2), bb(b.shape.begin(), b.shape.end() - 2);
  Dims batch = broadcast(ba, bb);
  Dims s = batch;
  s.push_back(M), s.push_back(N);
  Array out(s);
  if (abs_scale) *abs_scale = Array(s);
  Array ab(ba), bbm(bb);  // index helpers for the batch broadcast
  for_each_index(s, [&](const Dims& idx, int64_t lin) {
    Dims bi(idx.begin(), idx.end() - 2);
    int64_t i = idx[idx.size() - 2], j = idx[idx.size() - 1];
    double acc = 0, mag = 0;
    for (int64_t k = 0; k < K; ++k) {
      Dims ia = bi, ib = bi;
      ia.erase(ia.begin(), ia.begin() + int64_t(bi.size() - ba.size()));
      ib.erase(ib.begin(), ib.begin() + int64_t(bi.size() - bb.size()));
      for (size_t d = 0; d < ia.size(); ++d)
        if (ba[d] == 1) ia[d] = 0;
      for (size_t d = 0; d < ib.size(); ++d)
        if (bb[d] == 1) ib[d] = 0;
      ia.push_back(i), ia.push_back(k);
      ib.push_back(k), ib.push_back(j);
      double x = a.at(ia), y = b.at(ib);
      acc += x * y, mag += std::fabs(x * y);
    }
    out.v[size_t(lin)] = acc;
    if (abs_scale) abs_scale->v[size_t(lin)] = mag;
  });
  return out;
}

// ---- leaves ----
inline Array iota(const Dims& s, int dim) {
  Array out(s);
  for_each_index(s, [&](const Dims& idx, int64_t lin) { out.v[size_t(lin)] = double(idx[size_t(dim)]); });
  return out;
}
// Philox4x32-10 (Salmon et al., SC'11), written from the paper's round function:
// (hi(M0*c0), lo(M0*c0), hi(M1*c2), lo(M1*c2)) with the Weyl key schedule.
inline std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = uint64_t(0xD2511F53u) * c[0], p1 = uint64_t(0xCD9E8D57u) * c[2];
    c = {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1], uint32_t(p0)};
    k[0] += 0x9E3779B9u, k[1] += 0xBB67AE85u;
  }
  return c;
}
// kiln's uniform: the top 24 bits of word 0 at counter (offset + linear index), key = seed.
inline double philox_uniform(uint64_t seed, uint64_t counter) {
  auto r = philox4x32_10({uint32_t(counter), uint32_t(counter >> 32), 0, 0}, {uint32_t(seed), uint32_t(seed >> 32)});
  return std::ldexp(double(r[0] >> 8), -24);
}
inline Array rand(const Dims& s, uint64_t seed, uint64_t offset) {
  Array out(s);
  for (int64_t i = 0; i < out.numel(); ++i) out.v[size_t(i)] = philox_uniform(seed, offset + uint64_t(i));
  return out;
}

// ---- composites, as textbook float64 formulas (not kiln's decompositions) ----
inline double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }
inline double gelu(double x) { return 0.5 * x * (1 + std::erf(x / std::numbers::sqrt2)); }
inline double gelu_grad(double x) {
  return 0.5 * (1 + std::erf(x / std::numbers::sqrt2)) + x * std::exp(-0.5 * x * x) / std::sqrt(2 * std::numbers::pi);
}
inline double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}
inline double softplus(double x) { return x > 20 ? x : std::log1p(std::exp(x)); }

// f(row) for every 1-D slice of `a` along `axis`; f writes its result row in place.
template <class F>
Array along(const Array& a, int axis, F&& f) {
  axis = norm_axis(axis, a.rank());
  Array out = a;
  Dims outer = a.shape;
  int64_t n = a.shape[size_t(axis)];
  outer[size_t(axis)] = 1;
  std::vector<double> row(static_cast<size_t>(n));
  for_each_index(outer, [&](const Dims& idx, int64_t) {
    Dims i = idx;
    for (int64_t k = 0; k < n; ++k) i[size_t(axis)] = k, row[size_t(k)] = a.at(i);
    f(row);
    for (int64_t k = 0; k < n; ++k) i[size_t(axis)] = k, out.at(i) = row[size_t(k)];
  });
  return out;
}
inline Array softmax(const Array& a, int axis) {
  return along(a, axis, [](std::vector<double>& r) {
    double m = -INFINITY, s = 0;
    for (double x : r) m = std::max(m, x);
    for (double x : r) s += std::exp(x - m);
    for (double& x : r) x = std::exp(x - m) / s;
  });
}
inline Array log_softmax(const Array& a, int axis) {
  return along(a, axis, [](std::vector<double>& r) {
    double m = -INFINITY, s = 0;
    for (double x : r) m = std::max(m, x);
    for (double x : r) s += std::exp(x - m);
    for (double& x : r) x = x - m - std::log(s);
  });
}
// Moments along one axis, keeping it as size 1: mean and variance with `correction`.
inline std::pair<Array, Array> moments(const Array& a, int axis, int correction) {
  axis = norm_axis(axis, a.rank());
  Array mean = sum(a, {axis}, true);
  int64_t n = a.shape[size_t(axis)];
  for (double& m : mean.v) m /= double(n);
  Array sq = zip(a, mean, [](double x, double m) { return (x - m) * (x - m); });
  Array var = sum(sq, {axis}, true);
  for (double& v : var.v) v /= double(std::max<int64_t>(n - correction, 0));
  return {mean, var};
}
// Over the last dim, with weight and bias of its size.
inline Array layer_norm(const Array& x, const Array& w, const Array& b, double eps) {
  auto [mean, var] = moments(x, -1, 0);
  Array y = zip3(x, mean, var, [&](double v, double m, double s) { return (v - m) / std::sqrt(s + eps); });
  return zip3(y, w, b, [](double v, double g, double c) { return v * g + c; });
}
inline Array rms_norm(const Array& x, const Array& w, double eps) {
  Array ms = sum(map(x, [](double v) { return v * v; }), {-1}, true);
  for (double& m : ms.v) m /= double(x.shape.back());
  Array y = zip(x, ms, [&](double v, double m) { return v / std::sqrt(m + eps); });
  return zip(y, w, [](double v, double g) { return v * g; });
}

}  // namespace ref

// Many expressions evaluated as one plan, each checked against its reference: what
// kiln::eval(e1, e2, ...) does, with a run-time list of outputs (a variadic eval of
// thirty expressions costs minutes of build time; this costs one trace per type).
// One plan means one JIT compile for all of them. run() may be called per mode.
class Batch {
 public:
  // `scale`: per-element magnitudes for the tolerance (see check_close), or empty.
  template <Expr E>
  void check(const E& e, Array want, Tol t, std::string what, Array scale = {}) {
    auto held = std::make_shared<E>(e);  // NOTE: a traced graph points into its expression: keep it alive
    traces_.push_back([held](ir::Tracer& tr) { return tr.trace(*held); });
    checks_.push_back([want = std::move(want), t, what = std::move(what), scale = std::move(scale)](
                          const ir::Graph& g, const runtime::Bound& b, int id, Mode mode) {
      auto out = runtime::output_tensor<dtype_of<E>, rank_of<E>>(g, b, id);
      check_close(out, want, t, what + (mode == Mode::eager ? " (eager)" : ""), scale.v.empty() ? nullptr : &scale);
      return read(out);
    });
  }
  template <Expr E>
  void check(const E& e, Array want, std::string what) {
    check(e, std::move(want), tol_for(dtype_of<E>::id), std::move(what));
  }
  size_t size() const { return traces_.size(); }
  // Evaluates, checks every output, and gives them back (as read by read()).
  std::vector<Array> run(Mode mode = Mode::fused) const {
    std::vector<Array> got;
    if (traces_.empty()) return got;
    ir::Tracer tr;
    std::vector<int32_t> outs;
    for (const auto& t : traces_) outs.push_back(t(tr));
    ir::Graph g = tr.finish(outs);
    auto cp = runtime::plan_for(g, mode);
    runtime::Bound b = runtime::bind_buffers(g, cp->plan);
    runtime::backend_for(g.device).run(g, *cp, b);
    for (size_t i = 0; i < checks_.size(); ++i) got.push_back(checks_[i](g, b, g.outputs[i], mode));
    return got;
  }

 private:
  std::vector<std::function<int(ir::Tracer&)>> traces_;
  std::vector<std::function<Array(const ir::Graph&, const runtime::Bound&, int, Mode)>> checks_;
};

// How many times `what` occurs in `text` (kernels of a kind in explain()'s plan, say).
inline size_t occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// f(std::integral_constant<Prim, P>) for every row P of kPrims, in table order.
template <class F>
void for_each_row(F&& f) {
  [&]<size_t... I>(std::index_sequence<I...>) {
    (f(std::integral_constant<Prim, Prim(I)>{}), ...);
  }(std::make_index_sequence<size_t(Prim::count_)>{});
}

// TF32 allowed (or not) for f32 matmuls in a scope; as before after it.
struct AllowTf32 {
  bool was = kiln::allow_tf32();
  explicit AllowTf32(bool on = true) { kiln::set_allow_tf32(on); }
  ~AllowTf32() { kiln::set_allow_tf32(was); }
  AllowTf32(const AllowTf32&) = delete;
  AllowTf32& operator=(const AllowTf32&) = delete;
};
// A TF32 matmul's bound against sum |a| |b| (the `scale` of ref::matmul): each input
// rounded to 10 mantissa bits, to nearest, is off by 2^-11 of itself at most, a product
// by 2^-10; f32 accumulation on top.
inline Tol tol_tf32() { return {1e-3, 1e-6}; }

// NOTE: every test that includes this header runs with kiln's allocation poison on.
inline const bool kPoisonOn = (kiln::detail::cpu_poison() = true);

}  // namespace kiln::test
