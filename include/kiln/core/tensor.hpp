// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Tensor<DType, Rank>: storage + offset + sizes + strides. Takes sizes (run-time
// values) and a device; gives views (transpose, permute, slice, expand, view)
// that share storage, host element access, and copies between devices. A Tensor
// is also the leaf of every expression (expr/expr.hpp).
#pragma once
#include <algorithm>
#include <initializer_list>
#include <vector>

#include "kiln/core/device.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/shape.hpp"

namespace kiln {

namespace detail {
// Set by a GPU runtime when it finds a device; the CPU otherwise.
inline Device (*gpu_probe)() = nullptr;
// An expression evaluated in the default mode (runtime/front.hpp).
template <class E>
auto evaluate_fused(const E& e);
}  // namespace detail

// The first GPU where one exists, else the CPU. KILN_DEVICE=cpu|cuda|cuda:N|hip|hip:N overrides.
inline Device default_device() {
  static const Device d = [] {
    const char* env = std::getenv("KILN_DEVICE");
    std::string s = env ? env : "";
    if (s == "cpu") return cpu();
    if (!s.empty()) {
      size_t colon = s.find(':');
      int index = colon == std::string::npos ? 0 : std::stoi(s.substr(colon + 1));
      std::string kind = s.substr(0, colon);
      if (kind == "cuda") return cuda(index);
      if (kind == "hip") return hip(index);
      throw Error("kiln: KILN_DEVICE=" + s + " is not cpu, cuda[:N] or hip[:N]");
    }
    return detail::gpu_probe ? detail::gpu_probe() : cpu();
  }();
  return d;
}

template <DTypeTag DT, int R>
class Tensor {
  static_assert(R >= 0 && R <= kMaxRank, "kiln::Tensor: rank must be between 0 and kiln::kMaxRank (8)");

 public:
  using dtype = DT;
  using storage_type = typename DT::storage;
  static constexpr int rank = R;

  Tensor() = default;
  Tensor(std::shared_ptr<Storage> storage, int64_t offset, Shape<R> sizes, Shape<R> strides)
      : storage_(std::move(storage)), offset_(offset), sizes_(sizes), strides_(strides) {}

  // Evaluates an expression into a new tensor (runtime/front.hpp). NOTE: defined here, not
  // out of line: clang 14 matches no out-of-line definition of a constrained constructor.
  template <class E>
    requires(!std::same_as<std::remove_cvref_t<E>, Tensor> && requires { typename E::is_kiln_expr; })
  Tensor(const E& expr) {
    static_assert(std::is_same_v<typename E::dtype, DT>,
                  "kiln: assigning an expression to a Tensor of another dtype; use kiln::cast<DType>(expr)");
    static_assert(E::rank == R, "kiln: assigning an expression to a Tensor of another rank; use kiln::reshape");
    *this = detail::evaluate_fused(expr);
  }
  template <class E>
    requires(!std::same_as<std::remove_cvref_t<E>, Tensor> && requires { typename E::is_kiln_expr; })
  Tensor& operator=(const E& expr) { return *this = Tensor(expr); }

  static Tensor empty(Shape<R> sizes, Device device = default_device()) {
    for (auto s : sizes)
      if (s < 0) throw ShapeError("kiln: empty: negative size in " + format_shape(sizes));
    auto st = std::make_shared<Storage>(size_t(kiln::numel(sizes)) * sizeof(storage_type), device);
    return Tensor(std::move(st), 0, sizes, contiguous_strides(sizes));
  }
  // Values in row-major order, converted from double.
  static Tensor from(Shape<R> sizes, const std::vector<double>& values, Device device = default_device()) {
    if (int64_t(values.size()) != kiln::numel(sizes))
      throw ShapeError("kiln: from: " + std::to_string(values.size()) + " values for shape " +
                       format_shape(sizes));
    Tensor host = empty(sizes, cpu());
    for (size_t i = 0; i < values.size(); ++i) host.host_data()[i] = from_double<DT>(values[i]);
    return device == cpu() ? host : host.to(device);
  }
  static Tensor from(std::initializer_list<double> v) requires(R == 1) {
    return from({int64_t(v.size())}, std::vector<double>(v));
  }
  static Tensor from(std::initializer_list<std::initializer_list<double>> rows) requires(R == 2) {
    std::vector<double> flat;
    int64_t cols = rows.size() ? int64_t(rows.begin()->size()) : 0;
    for (auto& r : rows) {
      if (int64_t(r.size()) != cols) throw ShapeError("kiln: from: ragged rows");
      flat.insert(flat.end(), r.begin(), r.end());
    }
    return from({int64_t(rows.size()), cols}, flat);
  }

  bool defined() const { return storage_ != nullptr; }
  const Shape<R>& sizes() const { return sizes_; }
  const Shape<R>& strides() const { return strides_; }
  int64_t size(int d) const { return sizes_[normalize_axis("size", d, R)]; }
  int64_t numel() const { return kiln::numel(sizes_); }
  int64_t offset() const { return offset_; }
  Device device() const { return storage_ ? storage_->device() : cpu(); }
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  // Address of element 0 (device memory for GPU tensors).
  void* data_ptr() const { return static_cast<storage_type*>(storage_->data()) + offset_; }
  storage_type* host_data() const {
    if (device() != cpu()) throw Error("kiln: host_data: tensor is on " + device().str() + "; use .to(kiln::cpu())");
    return static_cast<storage_type*>(data_ptr());
  }
  bool is_contiguous() const {
    int64_t acc = 1;
    for (int i = R - 1; i >= 0; --i) {
      if (sizes_[i] != 1 && strides_[i] != acc) return false;
      acc *= sizes_[i];
    }
    return true;
  }

  // Host element access (CPU tensors), in the compute type.
  template <class... I>
    requires(sizeof...(I) == R && (std::integral<I> && ...))
  typename DT::compute operator()(I... idx) const {
    int64_t off = element_offset({int64_t(idx)...});
    storage_type v;
    if (device() == cpu()) v = host_data()[off];
    else copy_bytes(&v, cpu(), static_cast<storage_type*>(data_ptr()) + off, device(), sizeof v);  // NOTE: one element: slow, for tests
    return typename DT::compute(to_double<DT>(v));
  }
  template <class... I>
    requires(sizeof...(I) == R && (std::integral<I> && ...))
  void set(double v, I... idx) const {
    int64_t off = element_offset({int64_t(idx)...});
    storage_type sv = from_double<DT>(v);
    if (device() == cpu()) host_data()[off] = sv;
    else copy_bytes(static_cast<storage_type*>(data_ptr()) + off, device(), &sv, cpu(), sizeof sv);
  }
  // All elements in row-major order as double (any device; copies to host).
  std::vector<double> to_vector() const {
    Tensor h = device() == cpu() ? *this : to(cpu());
    std::vector<double> out;
    out.reserve(size_t(numel()));
    h.for_each_index([&](int64_t off) { out.push_back(to_double<DT>(h.host_data()[off])); });  // h's strides: a device view arrives contiguous
    return out;
  }

  // A contiguous copy on `device` (the same tensor if already there and contiguous).
  Tensor to(Device device) const {
    Tensor src = is_contiguous() ? *this : contiguous_host();
    if (src.device() == device) return src;
    Tensor dst = empty(sizes_, device);
    copy_bytes(dst.data_ptr(), device, src.data_ptr(), src.device(), size_t(numel()) * sizeof(storage_type));
    return dst;
  }

  // ---- views: share storage ----
  Tensor transpose(int a, int b) const {
    a = normalize_axis("transpose", a, R), b = normalize_axis("transpose", b, R);
    Tensor t = *this;
    std::swap(t.sizes_[a], t.sizes_[b]);
    std::swap(t.strides_[a], t.strides_[b]);
    return t;
  }
  Tensor permute(std::array<int, R> perm) const {
    Tensor t = *this;
    std::array<bool, R> seen{};
    for (int i = 0; i < R; ++i) {
      int p = normalize_axis("permute", perm[i], R);
      if (seen[p]) throw ShapeError("kiln: permute: axis repeated in permutation");
      seen[p] = true;
      t.sizes_[i] = sizes_[p], t.strides_[i] = strides_[p];
    }
    return t;
  }
  // Elements start, start+step, ... < stop along `dim` (negative start/stop count from the end).
  Tensor slice(int dim, int64_t start, int64_t stop, int64_t step = 1) const {
    dim = normalize_axis("slice", dim, R);
    int64_t n = sizes_[dim];
    if (step <= 0) throw ShapeError("kiln: slice: step must be positive");
    if (start < 0) start += n;
    if (stop < 0) stop += n;
    start = std::clamp<int64_t>(start, 0, n), stop = std::clamp<int64_t>(stop, start, n);
    Tensor t = *this;
    t.offset_ += start * strides_[dim];
    t.sizes_[dim] = (stop - start + step - 1) / step;
    t.strides_[dim] *= step;
    return t;
  }
  // Broadcast size-1 dims to `sizes` (stride 0); -1 keeps a dim.
  Tensor expand(Shape<R> sizes) const {
    Tensor t = *this;
    for (int i = 0; i < R; ++i) {
      if (sizes[i] == -1 || sizes[i] == sizes_[i]) continue;
      if (sizes_[i] != 1)
        throw ShapeError("kiln: expand: cannot expand " + format_shape(sizes_) + " to " + format_shape(sizes));
      t.sizes_[i] = sizes[i], t.strides_[i] = 0;
    }
    return t;
  }
  // Same elements under new sizes; needs contiguous memory (reshape() copies otherwise).
  template <int R2>
  Tensor<DT, R2> view(Shape<R2> sizes) const {
    int64_t known = 1, infer = -1;
    for (int i = 0; i < R2; ++i) {
      if (sizes[i] == -1) {
        if (infer >= 0) throw ShapeError("kiln: view: more than one -1 in " + format_shape(sizes));
        infer = i;
      } else known *= sizes[i];
    }
    if (infer >= 0) sizes[infer] = known ? numel() / known : 0;
    if (kiln::numel(sizes) != numel())
      throw ShapeError("kiln: view: cannot view " + format_shape(sizes_) + " as " + format_shape(sizes));
    if (!is_contiguous())
      throw ShapeError("kiln: view: tensor of shape " + format_shape(sizes_) + " with strides " +
                       format_shape(strides_) + " is not contiguous; use kiln::reshape");
    return Tensor<DT, R2>(storage_, offset_, sizes, contiguous_strides(sizes));
  }

 private:
  int64_t element_offset(std::array<int64_t, R> idx) const {
    int64_t off = 0;
    for (int i = 0; i < R; ++i) {
      if (idx[i] < 0 || idx[i] >= sizes_[i])
        throw ShapeError("kiln: index " + format_shape(idx) + " out of range for shape " + format_shape(sizes_));
      off += idx[i] * strides_[i];
    }
    return off;
  }
  // Calls f(offset) for every element in row-major order.
  template <class F>
  void for_each_index(F&& f) const {
    if (numel() == 0) return;
    std::array<int64_t, R> idx{};
    for (int64_t n = numel(); n > 0; --n) {
      int64_t off = 0;
      for (int i = 0; i < R; ++i) off += idx[i] * strides_[i];
      f(off);
      for (int i = R - 1; i >= 0; --i) {
        if (++idx[i] < sizes_[i]) break;
        idx[i] = 0;
      }
    }
  }
  // A contiguous host copy. A device view first comes over whole: the span of storage its
  // elements cover (a view's strides are never negative), then it is gathered on the host.
  Tensor contiguous_host() const {
    if (device() != cpu()) {
      if (numel() == 0) return empty(sizes_, cpu());
      int64_t span = 1;
      for (int i = 0; i < R; ++i) span += (sizes_[i] - 1) * strides_[i];
      auto st = std::make_shared<Storage>(size_t(span) * sizeof(storage_type), cpu());
      copy_bytes(st->data(), cpu(), data_ptr(), device(), size_t(span) * sizeof(storage_type));
      return Tensor(std::move(st), 0, sizes_, strides_).contiguous_host();
    }
    Tensor out = empty(sizes_, cpu());
    storage_type* dst = out.host_data();
    const storage_type* src = host_data();
    for_each_index([&](int64_t off) { *dst++ = src[off]; });
    return out;
  }

  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;
  Shape<R> sizes_{};
  Shape<R> strides_{};
};

}  // namespace kiln
