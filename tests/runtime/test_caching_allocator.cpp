// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The shared device caching allocator (runtime/caching_allocator.hpp) over a
// fake backend, so its policy is tested on any machine: size classes, reuse
// without a driver call, giving the cache back and retrying when the device is
// full, waiting for the device before freeing, refusing foreign pointers.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kiln/runtime/caching_allocator.hpp"

namespace {

// Hands out fake addresses from a budget; records what the allocator asked.
struct FakeDevice {
  explicit FakeDevice(size_t bytes) : capacity(bytes) {}
  size_t capacity, used = 0;
  uint64_t next = 0x1000;
  std::map<uint64_t, size_t> live;  // address -> size
  std::vector<std::string> calls;
};

struct FakeBackend {
  using Pointer = uint64_t;
  FakeDevice* device;

  bool try_allocate(size_t bytes, uint64_t& out) {
    device->calls.push_back("alloc " + std::to_string(bytes));
    if (device->used + bytes > device->capacity) return false;
    device->used += bytes;
    out = device->next;
    device->next += bytes;
    device->live.emplace(out, bytes);
    return true;
  }
  void free(uint64_t p) {
    device->calls.push_back("free");
    auto it = device->live.find(p);
    REQUIRE(it != device->live.end());
    device->used -= it->second;
    device->live.erase(it);
  }
  void wait_idle() { device->calls.push_back("wait"); }
  int ordinal() const { return 3; }
  std::string memory_report() const { return "; fake device full"; }
};

}  // namespace

TEST_CASE("allocation size classes: 512-byte steps to 64 KiB, then eighths of a power of two") {
  CHECK(kiln::allocation_size_class(1) == 512);
  CHECK(kiln::allocation_size_class(512) == 512);
  CHECK(kiln::allocation_size_class(513) == 1024);
  CHECK(kiln::allocation_size_class(64 * 1024) == 64 * 1024);
  CHECK(kiln::allocation_size_class(64 * 1024 + 1) == 72 * 1024);
  CHECK(kiln::allocation_size_class(1000000) == 1048576);  // 2^19 < n: steps of 64 KiB
  for (size_t n : {size_t{1}, size_t{777}, size_t{70000}, size_t{3} << 20, (size_t{5} << 30) + 3}) {
    size_t c = kiln::allocation_size_class(n);
    CHECK(c >= n);
    CHECK(c - n <= n / 8 + 512);  // at most 12.5% waste above the small range
  }
}

TEST_CASE("a released block is reused for its own class without a driver call") {
  FakeDevice dev{1 << 20};
  kiln::CachingAllocator<FakeBackend> alloc(FakeBackend{&dev});
  CHECK(alloc.allocate(0) == 0);
  uint64_t a = alloc.allocate(1000);
  alloc.release(a);
  CHECK(alloc.stats().bytes_cached == 1024);
  size_t calls = dev.calls.size();
  CHECK(alloc.allocate(900) == a);  // same 1024-byte class
  CHECK(dev.calls.size() == calls);
  CHECK(alloc.stats().reuses == 1);
  CHECK(alloc.stats().device_allocs == 1);
  uint64_t b = alloc.allocate(2000);  // another class: a new block
  CHECK(b != a);
  CHECK(alloc.stats().bytes_in_use == 1024 + 2048);
  alloc.release(b);
  alloc.release(a);
  CHECK_THROWS_AS(alloc.release(a), kiln::Error);  // released twice
  CHECK_THROWS_AS(alloc.release(0xdead), kiln::Error);
}

TEST_CASE("out of memory gives the cache back after the device is idle, then retries once") {
  FakeDevice dev{4096};
  kiln::CachingAllocator<FakeBackend> alloc(FakeBackend{&dev});
  uint64_t a = alloc.allocate(2048);
  alloc.release(a);  // cached, still held from the device
  dev.calls.clear();
  uint64_t b = alloc.allocate(4096);  // fits only once the cached block is freed
  CHECK(b != 0);
  CHECK(dev.calls == std::vector<std::string>{"alloc 4096", "wait", "free", "alloc 4096"});
  CHECK(alloc.stats().bytes_cached == 0);
  CHECK(alloc.stats().device_frees == 1);

  std::string what;
  try {
    alloc.allocate(512);
  } catch (const kiln::Error& e) {
    what = e.what();
  }
  CHECK(what.find("out of memory allocating 512 bytes") != std::string::npos);
  CHECK(what.find("device 3; fake device full") != std::string::npos);
  CHECK(what.find("4096 bytes in use") != std::string::npos);
  alloc.release(b);
  alloc.empty_cache();
  CHECK(dev.live.empty());
}

TEST_CASE("a release beyond the cache limit frees the block (the host allocator's bound)") {
  FakeDevice dev{1 << 20};
  kiln::CachingAllocator<FakeBackend> alloc(FakeBackend{&dev}, 3000);
  uint64_t a = alloc.allocate(2048), b = alloc.allocate(1024), c = alloc.allocate(1024);
  alloc.release(a);  // 2048 cached
  alloc.release(b);  // 3072 would pass the limit: freed
  CHECK(alloc.stats().bytes_cached == 2048);
  CHECK(alloc.stats().device_frees == 1);
  CHECK(dev.live.count(b) == 0);
  alloc.release(c);  // the same: freed, never cached
  CHECK(alloc.stats().device_frees == 2);
  CHECK(alloc.allocate(2000) == a);  // the cached one is still reused
  CHECK(alloc.stats().reuses == 1);
}
