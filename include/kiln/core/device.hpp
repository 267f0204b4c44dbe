// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Devices and storage. Takes a device and a byte count; gives owned memory on that
// device through the backend registered for its kind (cpu here; cuda and hip
// register themselves from runtime/), and copies between devices.
#pragma once
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "kiln/core/error.hpp"

namespace kiln {

enum class DeviceKind : uint8_t { cpu, cuda, hip };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  friend bool operator==(const Device&, const Device&) = default;
  std::string str() const {
    static const char* names[] = {"cpu", "cuda", "hip"};
    return kind == DeviceKind::cpu ? "cpu" : std::string(names[int(kind)]) + ":" + std::to_string(index);
  }
};
inline Device cpu() { return {DeviceKind::cpu, 0}; }
inline Device cuda(int index = 0) { return {DeviceKind::cuda, index}; }
inline Device hip(int index = 0) { return {DeviceKind::hip, index}; }

// What a device backend provides to storage. GPU backends fill theirs in when
// their runtime header is included; the CPU one is always there.
struct MemoryHooks {
  void* (*allocate)(size_t bytes, int index) = nullptr;
  void (*release)(void* p, size_t bytes, int index) = nullptr;
  // dst and src on (possibly different) devices; one side is this device, the other cpu or this.
  void (*copy)(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) = nullptr;
};

namespace detail {
// KILN_POISON=1 (read once; tests may also set the flag directly): every new CPU
// allocation (and GPU allocation, runtime/gpu_backend.hpp) is filled with 0xFF bytes, a NaN in every float dtype (-1 in the
// integer ones), so that an element a kernel forgets to write shows up in tests.
inline bool& cpu_poison() {
  static bool on = [] {
    const char* e = std::getenv("KILN_POISON");
    return e && *e && std::strcmp(e, "0") != 0;
  }();
  return on;
}
inline void* cpu_allocate(size_t bytes, int) {
  // NOTE: 64-byte alignment so that generated loops can use full-width vector loads.
  size_t n = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, n ? n : 64);
  if (!p) throw Error("kiln: out of host memory allocating " + std::to_string(bytes) + " bytes");
  if (cpu_poison()) std::memset(p, 0xFF, n ? n : 64);
  return p;
}
inline void cpu_release(void* p, size_t, int) { std::free(p); }
inline void cpu_copy(void* dst, Device, const void* src, Device, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
inline MemoryHooks& memory_hooks(DeviceKind k) {
  static MemoryHooks hooks[3] = {{cpu_allocate, cpu_release, cpu_copy}, {}, {}};
  return hooks[int(k)];
}
inline const MemoryHooks& hooks_for(Device d) {
  const MemoryHooks& h = memory_hooks(d.kind);
  if (!h.allocate)
    throw Error("kiln: device " + d.str() + " is not available in this build or on this machine");
  return h;
}
}  // namespace detail

// A block of memory on one device; views share it.
class Storage {
 public:
  Storage(size_t bytes, Device device) : bytes_(bytes), device_(device) {
    data_ = detail::hooks_for(device).allocate(bytes, device.index);
  }
  ~Storage() { detail::hooks_for(device_).release(data_, bytes_, device_.index); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  size_t bytes_;
  Device device_;
};

inline void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  Device via = dst_dev.kind != DeviceKind::cpu ? dst_dev : src_dev;
  detail::hooks_for(via).copy(dst, dst_dev, src, src_dev, bytes);
}

}  // namespace kiln
