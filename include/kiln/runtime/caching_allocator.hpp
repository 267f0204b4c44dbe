// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The device caching allocator, written once for every GPU backend. Takes in a
// backend (how to allocate, free and wait on one device: the thin vendor layer);
// gives out allocate/release that reuse freed blocks of the same size class
// without a driver call, return the cache to the driver and retry once when the
// device runs out, and stats that tests assert on.
//
// A backend B is a small object the allocator holds by value:
//   using Pointer = ...;                        // CUdeviceptr, void*, ...
//   bool try_allocate(size_t bytes, Pointer&)   // false: out of memory; throws on anything else
//   void free(Pointer)                          // throws on failure
//   void wait_idle()                            // all queued work on the device finished
//   int ordinal() const                         // for messages; -1: host memory
//   std::string memory_report() const           // "; X of Y bytes free", or ""
//
// Streams: a block released here may still be read by a kernel queued before the
// release; reusing it is safe only for work queued after, in the same stream.
// Each backend uses one stream per device for exactly that reason (see
// cuda_runtime.hpp / hip_runtime.hpp). Returning blocks to the driver waits for
// the device first.
//
// The host uses it too (core/device.hpp): CPU tensors and the CPU GEMM's scratch
// reuse blocks instead of paying a page fault per fresh page on every call. A
// cache limit bounds what it keeps: a block released above it goes straight back.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"

namespace kiln {

// Sizes are rounded up to a class and a freed block is only reused for its own
// class: up to 64 KiB in 512-byte steps, above that in eighths of a power of two
// (at most 12.5% waste), so a model's repeated shapes hit the same classes.
inline size_t allocation_size_class(size_t bytes) {
  constexpr size_t kSmallStep = 512, kSmallLimit = 64 * 1024;
  if (bytes <= kSmallLimit) return std::max<size_t>(kSmallStep, (bytes + kSmallStep - 1) / kSmallStep * kSmallStep);
  size_t power = size_t{1} << (63 - __builtin_clzll(bytes));  // largest power of two <= bytes
  size_t step = power / 8;
  return (bytes + step - 1) / step * step;
}

struct CachingAllocatorStats {
  uint64_t device_allocs = 0;  // driver allocations that succeeded (the host: aligned_alloc)
  uint64_t device_frees = 0;   // driver frees (empty_cache, on running out, above the cache limit)
  uint64_t reuses = 0;         // allocations served from the cache
  size_t bytes_in_use = 0;     // by class size, handed out and not yet released
  size_t bytes_cached = 0;     // held in free lists
};

template <class Backend>
class CachingAllocator {
 public:
  using Pointer = typename Backend::Pointer;

  // cache_limit: the most bytes kept in free lists; a release beyond it frees the block.
  explicit CachingAllocator(Backend backend, size_t cache_limit = SIZE_MAX)
      : backend_(std::move(backend)), cache_limit_(cache_limit) {}
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (0 gives a null pointer). Out of memory: the
  // cache goes back to the driver and the allocation is tried once more; then
  // kiln::Error names the size, the device's free memory and what kiln holds.
  Pointer allocate(size_t bytes) {
    if (bytes == 0) return Pointer{};
    size_t cls = allocation_size_class(bytes);
    std::lock_guard lock(mutex_);
    if (auto it = free_.find(cls); it != free_.end() && !it->second.empty()) {
      Pointer p = it->second.back();
      it->second.pop_back();
      track_locked(p, cls);
      ++stats_.reuses;
      stats_.bytes_cached -= cls;
      stats_.bytes_in_use += cls;
      return p;
    }
    Pointer p{};
    bool ok = backend_.try_allocate(cls, p);
    if (!ok && stats_.bytes_cached > 0) {
      free_cached_locked();
      ok = backend_.try_allocate(cls, p);
    }
    if (!ok) {
      throw Error("kiln: out of memory allocating " + std::to_string(bytes) + " bytes (class " + std::to_string(cls) +
                  ") on " + where() + backend_.memory_report() + "; kiln holds " +
                  std::to_string(stats_.bytes_in_use) + " bytes in use and " + std::to_string(stats_.bytes_cached) +
                  " cached");
    }
    track_locked(p, cls);
    ++stats_.device_allocs;
    stats_.bytes_in_use += cls;
    return p;
  }

  // Back to its class's free list; no driver call. Throws kiln::Error for a
  // pointer this allocator did not hand out (or handed out and got back already).
  void release(Pointer ptr) {
    if (ptr == Pointer{}) return;
    std::lock_guard lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) {
      throw Error("kiln: release of pointer " + pointer_text(ptr) + " that kiln's allocator on " + where() +
                  " did not hand out, or that was released already");
    }
    size_t cls = it->second;
    if (spare_.size() < kSpareNodes) spare_.push_back(live_.extract(it));
    else live_.erase(it);
    stats_.bytes_in_use -= cls;
    if (stats_.bytes_cached + cls > cache_limit_) {
      backend_.wait_idle();
      backend_.free(ptr);
      ++stats_.device_frees;
      return;
    }
    free_[cls].push_back(ptr);
    stats_.bytes_cached += cls;
  }

  // Returns every cached block to the driver (after the device is idle).
  void empty_cache() {
    std::lock_guard lock(mutex_);
    free_cached_locked();
  }

  CachingAllocatorStats stats() const {
    std::lock_guard lock(mutex_);
    return stats_;
  }

  Backend& backend() { return backend_; }

 private:
  std::string where() const {
    return backend_.ordinal() < 0 ? std::string("the host") : "device " + std::to_string(backend_.ordinal());
  }

  static std::string pointer_text(Pointer p) {
    uintptr_t v;
    if constexpr (std::is_pointer_v<Pointer>) {
      v = reinterpret_cast<uintptr_t>(p);
    } else {
      v = static_cast<uintptr_t>(p);
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
    return buf;
  }

  // Records a handed-out block, in a map node a release left (no heap allocation per call).
  void track_locked(Pointer p, size_t cls) {
    if (spare_.empty()) {
      live_.emplace(p, cls);
      return;
    }
    auto node = std::move(spare_.back());
    spare_.pop_back();
    node.key() = p, node.mapped() = cls;
    live_.insert(std::move(node));
  }

  void free_cached_locked() {
    if (stats_.bytes_cached == 0) return;
    // Blocks were released in stream order, so kernels queued before their
    // release may still use them: the device must be idle before they go back.
    backend_.wait_idle();
    for (auto& [cls, blocks] : free_) {
      while (!blocks.empty()) {
        backend_.free(blocks.back());
        blocks.pop_back();
        ++stats_.device_frees;
        stats_.bytes_cached -= cls;
      }
    }
    free_.clear();
  }

  Backend backend_;
  size_t cache_limit_;
  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<Pointer>> free_;  // class -> blocks
  std::unordered_map<Pointer, size_t> live_;               // block -> class
  static constexpr size_t kSpareNodes = 64;
  std::vector<typename std::unordered_map<Pointer, size_t>::node_type> spare_;  // live_'s released nodes, for reuse
  CachingAllocatorStats stats_;
};

}  // namespace kiln
