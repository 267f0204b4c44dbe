// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// Devices and storage. Takes a device and a byte count; gives owned memory on that
// device through the backend registered for its kind (cpu here, through the host's
// caching allocator; cuda and hip register themselves from runtime/), and copies
// between devices.
#pragma once
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "kiln/core/error.hpp"
#include "kiln/runtime/caching_allocator.hpp"

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
  void (*empty_cache)() = nullptr;  // cached blocks of every device of this kind back to the system
};

namespace detail {
// KILN_POISON=1 (read once; tests may also set the flag directly): every CPU
// allocation, fresh or from the cache (and GPU allocation, runtime/gpu_backend.hpp),
// is filled with 0xFF bytes, a NaN in every float dtype (-1 in the integer ones), so
// that an element a kernel forgets to write shows up in tests.
inline bool& cpu_poison() {
  static bool on = [] {
    const char* e = std::getenv("KILN_POISON");
    return e && *e && std::strcmp(e, "0") != 0;
  }();
  return on;
}

// Host memory for the caching allocator. NOTE: 64-byte alignment so that generated
// loops can use full-width vector loads (every size class is a multiple of 512).
struct HostMemory {
  using Pointer = void*;
  bool try_allocate(size_t bytes, void*& out) { return (out = std::aligned_alloc(64, bytes)) != nullptr; }
  void free(void* p) { std::free(p); }
  void wait_idle() {}
  int ordinal() const { return -1; }
  std::string memory_report() const { return {}; }
};
}  // namespace detail

// CPU tensors' memory and the CPU GEMM's scratch: a freed block is reused by the
// next allocation of its size class, so a repeated call touches no fresh pages.
// It keeps at most 1 GiB in its free lists.
using HostAllocator = CachingAllocator<detail::HostMemory>;
inline HostAllocator& host_allocator() {
  // NOTE: never destroyed: tensors with static storage duration release into it at exit.
  static HostAllocator* allocator = new HostAllocator(detail::HostMemory{}, size_t{1} << 30);
  return *allocator;
}

namespace detail {
inline void* cpu_allocate(size_t bytes, int) {
  void* p = host_allocator().allocate(bytes ? bytes : 1);
  if (cpu_poison()) std::memset(p, 0xFF, bytes);
  return p;
}
inline void cpu_release(void* p, size_t, int) { host_allocator().release(p); }
inline void cpu_copy(void* dst, Device, const void* src, Device, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}
inline MemoryHooks& memory_hooks(DeviceKind k) {
  static MemoryHooks hooks[3] = {{cpu_allocate, cpu_release, cpu_copy, [] { host_allocator().empty_cache(); }}, {}, {}};
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

// Returns the cached blocks of the host and of every GPU backend in the program to
// the system (PyTorch's empty_cache). Never needed for correctness: an allocation
// that finds no memory does it and retries.
inline void empty_cache() {
  for (DeviceKind k : {DeviceKind::cpu, DeviceKind::cuda, DeviceKind::hip})
    if (auto release_cached = detail::memory_hooks(k).empty_cache) release_cached();
}

inline void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  Device via = dst_dev.kind != DeviceKind::cpu ? dst_dev : src_dev;
  detail::hooks_for(via).copy(dst, dst_dev, src, src_dev, bytes);
}

}  // namespace kiln
