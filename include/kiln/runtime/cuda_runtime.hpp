// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// The CUDA backend's runtime, below code generation. Takes in kernel source and
// host data; gives out, per device: the primary context and one stream, a
// caching allocator with DeviceBuffer handles, host<->device copies, modules
// compiled and loaded once (memory map -> jit/nvrtc.hpp's disk cache -> NVRTC),
// CudaFunction::launch with every call checked, and an event timer for benches.
//
// Streams. Every device has one stream that kiln uses for launches, copies and
// fills, so work is ordered without extra synchronisation. Buffers freed back to
// the cache are reused in that stream's order, which is what makes reuse safe
// without waiting; work on another stream must be synchronised before its
// buffers are released.
// NOTE: the stream is created blocking (synchronises with the legacy NULL
// stream), so code that calls the driver's synchronous cuMemcpy* on kiln's
// buffers still sees kiln's kernels finished.
//
// Errors. A launch error throws kiln::Error naming the kernel, the caller's
// description (shapes), grid, block and shared memory. A kernel that faults is
// reported at the next synchronisation; KILN_CUDA_SYNC=1 (or set_sync_mode)
// synchronises after every launch so the fault names its kernel.
//
// kiln::Storage on a cuda device reaches this layer through the hooks that
// runtime/cuda_backend.hpp registers; the allocator's policy is shared with HIP
// (runtime/caching_allocator.hpp).
//
// Lifetime. Devices, their allocators and modules live until the process exits
// and are deliberately never destroyed: buffers held by static objects may be
// released after any destructor kiln could register, and the driver may already
// be shutting down by then.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/core/error.hpp"
#include "kiln/core/hash.hpp"
#include "kiln/core/log.hpp"
#include "kiln/jit/nvrtc.hpp"
#include "kiln/runtime/caching_allocator.hpp"
#include "kiln/runtime/counters.hpp"
#include "kiln/runtime/cuda_driver.hpp"

namespace kiln::cu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// ---- sync mode ------------------------------------------------------------------

namespace detail {
inline std::atomic<bool>& sync_mode_flag() {
  static std::atomic<bool> flag = [] {
    const char* env = std::getenv("KILN_CUDA_SYNC");
    return env != nullptr && *env != '\0' && std::strcmp(env, "0") != 0;
  }();
  return flag;
}
}  // namespace detail

// Synchronise after every launch and check (KILN_CUDA_SYNC=1 at start-up). Slow;
// for finding which kernel faults.
inline bool sync_mode() { return detail::sync_mode_flag().load(std::memory_order_relaxed); }
inline void set_sync_mode(bool on) { detail::sync_mode_flag().store(on, std::memory_order_relaxed); }

// ---- caching allocator ---------------------------------------------------------

class CudaDevice;
class CudaEvent;

namespace detail {

// The thin part of the caching allocator (runtime/caching_allocator.hpp).
struct CudaAllocatorBackend {
  using Pointer = CUdeviceptr;
  CudaDevice* device = nullptr;

  inline bool try_allocate(size_t bytes, CUdeviceptr& out);
  inline void free(CUdeviceptr p);
  inline void wait_idle();
  inline int ordinal() const;
  inline std::string memory_report() const;
};

}  // namespace detail

using CachingAllocator = ::kiln::CachingAllocator<detail::CudaAllocatorBackend>;
using AllocatorStats = CachingAllocatorStats;

// ---- kernels and modules ------------------------------------------------------

namespace detail {

// One kernel of a loaded module; its address is stable for the process.
struct KernelState {
  CUfunction function = nullptr;
  std::string name;
  CudaDevice* device = nullptr;
  int max_threads_per_block = 0;
  int static_shared_bytes = 0;
  std::atomic<int> dynamic_shared_limit{48 * 1024};  // what a launch may ask for without opting in
};

}  // namespace detail

// A kernel ready to launch: a cheap handle, copy it freely.
class CudaFunction {
 public:
  CudaFunction() = default;
  explicit CudaFunction(detail::KernelState* state) : state_(state) {}

  // Launches on `stream` (nullptr: the device's stream). `args` points at each
  // kernel argument, as cuLaunchKernel takes them. `describe` (shapes, sizes) is
  // put into any error. Dynamic shared memory above 48 KiB is opted into once per
  // kernel. Counts kernels_launched. In sync mode, waits and checks. `programmatic`: on
  // sm_90 and later (and a driver with cuLaunchKernelEx) the kernel may start before the
  // kernel before it on `stream` has finished; it must wait for it (griddepcontrol.wait)
  // before it touches memory, as every generated kernel does (kiln_grid_begin). Counts
  // kernels_programmatic. `priority` (not 0): the launch's priority instead of its stream's
  // (CudaDevice::raised_priority). Where the driver refuses either and a plain launch
  // succeeds, the process launches plainly from then on (logged: KILN_LOG=jit).
  inline void launch(Dim3 grid, Dim3 block, unsigned shared_bytes, void** args, const LazyText& describe = {},
                     CUstream stream = nullptr, bool programmatic = false, int priority = 0) const;

  // Lets launches ask for up to `bytes` of dynamic shared memory (up to the
  // device's opt-in limit minus the kernel's static shared memory).
  inline void set_max_dynamic_shared_memory(int bytes) const;
  // cuFuncGetAttribute, e.g. kFuncAttrNumRegs.
  inline int attribute(int which) const;
  // Resident blocks per SM for this block size and dynamic shared memory.
  inline int max_active_blocks_per_sm(int block_threads, size_t dynamic_shared_bytes) const;

  const std::string& name() const { return state().name; }
  CUfunction handle() const { return state().function; }
  int max_threads_per_block() const { return state().max_threads_per_block; }
  explicit operator bool() const { return state_ != nullptr; }

 private:
  const detail::KernelState& state() const {
    if (state_ == nullptr) throw Error("kiln: use of an empty CudaFunction");
    return *state_;
  }
  detail::KernelState* state_ = nullptr;
};

// A loaded CUmodule (all kernels of one NVRTC program). Lives for the process.
class CudaModule {
 public:
  CudaModule(CudaDevice& device, CUmodule module, std::string name) : device_(device), module_(module),
                                                                       name_(std::move(name)) {}
  CudaModule(const CudaModule&) = delete;
  CudaModule& operator=(const CudaModule&) = delete;

  // The kernel `name` (an extern "C" __global__ function of the source). Throws
  // kiln::Error naming the kernel and the module when there is no such kernel.
  inline CudaFunction function(std::string_view name);

  CUmodule handle() const { return module_; }
  const std::string& name() const { return name_; }

 private:
  CudaDevice& device_;
  CUmodule module_;
  std::string name_;
  std::mutex mutex_;
  std::unordered_map<std::string, std::unique_ptr<detail::KernelState>> kernels_;
};

// ---- devices ------------------------------------------------------------------

class CudaDevice {
 public:
  // Retains the primary context and creates the device's stream.
  explicit CudaDevice(int ordinal)
      : ordinal_(ordinal), properties_(device_properties(ordinal)), allocator_(detail::CudaAllocatorBackend{this}) {
    const DriverApi& api = driver();
    std::string where = " (device " + std::to_string(ordinal) + ")";
    CUdevice dev = 0;
    check(api.cuDeviceGet(&dev, ordinal), "cuDeviceGet" + where);
    check(api.cuDevicePrimaryCtxRetain(&context_, dev), "cuDevicePrimaryCtxRetain" + where);
    check(api.cuCtxSetCurrent(context_), "cuCtxSetCurrent" + where);
    check(api.cuStreamCreate(&stream_, kStreamDefault), "cuStreamCreate" + where);
    // Streams are made at the least priority (cuda.h's default); one step above it, where the
    // device has steps, is what kiln::idle_fill raises a call's other kernels to.
    int least = 0, greatest = 0;
    if (api.cuCtxGetStreamPriorityRange && api.cuCtxGetStreamPriorityRange(&least, &greatest) == kSuccess && greatest < least)
      raised_priority_ = least - 1;
  }
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int ordinal() const { return ordinal_; }
  const DeviceProperties& properties() const { return properties_; }
  CUcontext context() const { return context_; }
  CUstream stream() const { return stream_; }
  // The second stream of a call whose kernels overlap (runtime::StreamSchedule), made on first use.
  CUstream side_stream() {
    std::call_once(side_once_, [&] {
      make_current();
      check(driver().cuStreamCreate(&side_stream_, kStreamDefault), "cuStreamCreate (device " + std::to_string(ordinal_) + ")");
    });
    return side_stream_;
  }
  // The third stream of such a call: its leaf kernels, below the others' priority (kiln::idle_fill).
  CUstream fill_stream() {
    std::call_once(fill_once_, [&] {
      make_current();
      check(driver().cuStreamCreate(&fill_stream_, kStreamDefault), "cuStreamCreate (device " + std::to_string(ordinal_) + ")");
    });
    return fill_stream_;
  }
  // A launch priority above the streams' own (lower numbers run first), or 0 where the device
  // has only one.
  int raised_priority() const { return raised_priority_; }
  // Work queued on `stream` after this waits for what `event` last recorded.
  inline void wait(CUstream stream, const CudaEvent& event) const;
  CachingAllocator& allocator() { return allocator_; }

  // Makes this device's context current on the calling thread. Asks the driver
  // rather than trusting a thread_local, because other code (the CUDA runtime, a
  // library) may switch contexts behind kiln's back.
  void make_current() const {
    const DriverApi& api = driver();
    CUcontext current = nullptr;
    if (api.cuCtxGetCurrent(&current) == kSuccess && current == context_) return;
    check(api.cuCtxSetCurrent(context_), "cuCtxSetCurrent (device " + std::to_string(ordinal_) + ")");
  }

  // Waits for the device's stream. A fault of an earlier kernel surfaces here;
  // the error then names the last kernel launched on this device.
  void synchronize() const {
    make_current();
    check_async(driver().cuStreamSynchronize(stream_), "cuStreamSynchronize");
  }

  // check() for calls that report earlier asynchronous failures: adds the last
  // kernel launched here and how to find the culprit.
  void check_async(CUresult r, std::string_view what) const {
    if (r == kSuccess) [[likely]]
      return;
    std::string msg = std::string(what) + " (device " + std::to_string(ordinal_) + ")";
    if (const std::string* last = last_kernel_.load(std::memory_order_relaxed)) {
      msg += "; the last kernel launched on this device was '" + *last + "'";
      if (!sync_mode()) msg += "; set KILN_CUDA_SYNC=1 to check each launch";
    }
    check(r, msg);
  }

  void note_launch(const std::string* kernel_name) { last_kernel_.store(kernel_name, std::memory_order_relaxed); }

  // memory map -> disk cache -> NVRTC, then cuModuleLoadData. See load_cuda_module.
  inline CudaModule& load_module(const std::string& source, const std::vector<std::string>& extra_options,
                                 const std::string& name_hint);

 private:
  struct ModuleSlot {
    std::promise<CudaModule*> promise;
    std::shared_future<CudaModule*> future = promise.get_future().share();
    std::unique_ptr<CudaModule> module;
  };

  int ordinal_;
  const DeviceProperties& properties_;
  CUcontext context_ = nullptr;
  CUstream stream_ = nullptr;
  CUstream side_stream_ = nullptr, fill_stream_ = nullptr;
  std::once_flag side_once_, fill_once_;
  int raised_priority_ = 0;
  CachingAllocator allocator_;
  std::atomic<const std::string*> last_kernel_{nullptr};
  std::mutex modules_mutex_;
  std::unordered_map<Hash128, std::shared_ptr<ModuleSlot>, Hash128Hasher> modules_;
};

// The device `ordinal`, set up on first use (thread-safe). Throws kiln::Error
// when CUDA is unavailable or there is no such device.
inline CudaDevice& cuda_device(int ordinal = 0) {
  struct Table {
    std::mutex mutex;
    std::vector<std::atomic<CudaDevice*>> devices;  // NOTE: atomic, so a set-up device is found without the lock
  };
  // NOTE: the table and its devices are never deleted (see the top of this file);
  // a buffer released during static destruction still finds its device here.
  static Table* table = new Table{{}, std::vector<std::atomic<CudaDevice*>>(static_cast<size_t>(cuda_device_count()))};
  if (ordinal < 0 || static_cast<size_t>(ordinal) >= table->devices.size()) {
    device_properties(ordinal);  // throws saying why: no CUDA, or no such device
  }
  std::atomic<CudaDevice*>& slot = table->devices[static_cast<size_t>(ordinal)];
  if (CudaDevice* dev = slot.load(std::memory_order_acquire)) return *dev;
  std::lock_guard lock(table->mutex);
  CudaDevice* dev = slot.load(std::memory_order_relaxed);
  if (dev == nullptr) slot.store(dev = new CudaDevice(ordinal), std::memory_order_release);
  return *dev;
}

// ---- allocator backend ---------------------------------------------------------

namespace detail {

inline bool CudaAllocatorBackend::try_allocate(size_t bytes, CUdeviceptr& out) {
  device->make_current();
  CUresult r = driver().cuMemAlloc(&out, bytes);
  if (r == kErrorOutOfMemory) return false;
  check(r, "cuMemAlloc of " + std::to_string(bytes) + " bytes on device " + std::to_string(device->ordinal()) +
               memory_report());
  return true;
}

inline void CudaAllocatorBackend::free(CUdeviceptr p) {
  device->make_current();
  check(driver().cuMemFree(p), "cuMemFree (device " + std::to_string(device->ordinal()) + ")");
}

inline void CudaAllocatorBackend::wait_idle() {
  device->make_current();
  device->check_async(driver().cuCtxSynchronize(), "cuCtxSynchronize before returning cached memory");
}

inline int CudaAllocatorBackend::ordinal() const { return device->ordinal(); }

inline std::string CudaAllocatorBackend::memory_report() const {
  size_t free_bytes = 0, total_bytes = 0;
  if (driver().cuMemGetInfo(&free_bytes, &total_bytes) != kSuccess) return {};
  return "; " + std::to_string(free_bytes) + " of " + std::to_string(total_bytes) + " bytes free";
}

}  // namespace detail

// Returns every device's cached blocks to the driver (devices not yet used are
// skipped). Never needed for correctness: allocation does it on running out.
inline void empty_cache() {
  for (int i = 0; i < cuda_device_count(); ++i) cuda_device(i).allocator().empty_cache();
}

// ---- buffers ------------------------------------------------------------------

// Device memory from the caching allocator; copies share the block, which goes
// back to the cache when the last copy is destroyed.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, int device) {
    CudaDevice& dev = cuda_device(device);
    block_ = std::make_shared<Block>();
    block_->device = &dev;
    block_->size = bytes;
    block_->ptr = dev.allocator().allocate(bytes);
  }

  CUdeviceptr ptr() const { return block_ ? block_->ptr : 0; }
  void* data() const { return reinterpret_cast<void*>(static_cast<uintptr_t>(ptr())); }
  size_t size() const { return block_ ? block_->size : 0; }
  int device() const { return block_ ? block_->device->ordinal() : -1; }
  CudaDevice& device_ref() const {
    if (!block_) throw Error("kiln: use of an empty DeviceBuffer");
    return *block_->device;
  }
  explicit operator bool() const { return block_ != nullptr; }

 private:
  struct Block {
    CudaDevice* device = nullptr;
    CUdeviceptr ptr = 0;
    size_t size = 0;
    ~Block() {
      if (ptr == 0) return;
      try {
        device->allocator().release(ptr);
      } catch (...) {  // a destructor must not throw; release only fails on a kiln bug
      }
    }
  };
  std::shared_ptr<Block> block_;
};

inline DeviceBuffer device_alloc(size_t bytes, int device = 0) { return DeviceBuffer(bytes, device); }

namespace detail {
inline void check_range(const DeviceBuffer& b, size_t offset, size_t bytes, const char* what) {
  if (!b && bytes != 0) throw Error(std::string("kiln: ") + what + " on an empty DeviceBuffer");
  if (offset > b.size() || bytes > b.size() - offset) {
    throw Error(std::string("kiln: ") + what + " of " + std::to_string(bytes) + " bytes at offset " +
                std::to_string(offset) + " overruns a device buffer of " + std::to_string(b.size()) + " bytes");
  }
}
}  // namespace detail

// Host -> device at dst + offset. Returns when the copy is done (the host
// memory may be reused at once).
inline void copy_to_device(const DeviceBuffer& dst, const void* src, size_t bytes, size_t dst_offset = 0) {
  detail::check_range(dst, dst_offset, bytes, "copy to device");
  if (bytes == 0) return;
  CudaDevice& dev = dst.device_ref();
  dev.make_current();
  dev.check_async(driver().cuMemcpyHtoDAsync(dst.ptr() + dst_offset, src, bytes, dev.stream()),
                  "cuMemcpyHtoDAsync of " + std::to_string(bytes) + " bytes");
  dev.synchronize();
}

// Device -> host after the device's queued work. Returns when the data is there.
inline void copy_to_host(void* dst, const DeviceBuffer& src, size_t bytes, size_t src_offset = 0) {
  detail::check_range(src, src_offset, bytes, "copy to host");
  if (bytes == 0) return;
  CudaDevice& dev = src.device_ref();
  dev.make_current();
  dev.check_async(driver().cuMemcpyDtoHAsync(dst, src.ptr() + src_offset, bytes, dev.stream()),
                  "cuMemcpyDtoHAsync of " + std::to_string(bytes) + " bytes");
  dev.synchronize();
}

// Device -> device on one device, queued in stream order (does not wait).
inline void copy_on_device(const DeviceBuffer& dst, const DeviceBuffer& src, size_t bytes, size_t dst_offset = 0,
                           size_t src_offset = 0) {
  detail::check_range(dst, dst_offset, bytes, "device copy (destination)");
  detail::check_range(src, src_offset, bytes, "device copy (source)");
  if (bytes == 0) return;
  if (dst.device() != src.device()) {
    throw Error("kiln: copy_on_device between devices " + std::to_string(src.device()) + " and " +
                std::to_string(dst.device()) + "; use copy_bytes with both devices");
  }
  CudaDevice& dev = dst.device_ref();
  dev.make_current();
  dev.check_async(driver().cuMemcpyDtoDAsync(dst.ptr() + dst_offset, src.ptr() + src_offset, bytes, dev.stream()),
                  "cuMemcpyDtoDAsync of " + std::to_string(bytes) + " bytes");
}

// Sets every byte (queued, does not wait).
inline void fill_bytes(const DeviceBuffer& dst, unsigned char value) {
  if (dst.size() == 0) return;
  CudaDevice& dev = dst.device_ref();
  dev.make_current();
  dev.check_async(driver().cuMemsetD8Async(dst.ptr(), value, dst.size(), dev.stream()), "cuMemsetD8Async");
}

// Sets every 32-bit word (queued, does not wait); e.g. 0xFFFFFFFF poisons float
// output with NaN so a kernel that skips an element is caught. The size must be
// a multiple of 4.
inline void fill_words(const DeviceBuffer& dst, uint32_t value) {
  if (dst.size() % 4 != 0) {
    throw Error("kiln: fill_words on a buffer of " + std::to_string(dst.size()) + " bytes (not a multiple of 4)");
  }
  if (dst.size() == 0) return;
  CudaDevice& dev = dst.device_ref();
  dev.make_current();
  dev.check_async(driver().cuMemsetD32Async(dst.ptr(), value, dst.size() / 4, dev.stream()), "cuMemsetD32Async");
}

template <class T>
DeviceBuffer to_device(const std::vector<T>& host, int device = 0) {
  static_assert(std::is_trivially_copyable_v<T>);
  DeviceBuffer b(host.size() * sizeof(T), device);
  copy_to_device(b, host.data(), host.size() * sizeof(T));
  return b;
}

template <class T>
std::vector<T> to_host(const DeviceBuffer& b) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::vector<T> out(b.size() / sizeof(T));
  copy_to_host(out.data(), b, out.size() * sizeof(T));
  return out;
}

// ---- kernel and module bodies --------------------------------------------------

namespace detail {

inline std::string dim_text(Dim3 d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

inline std::string launch_text(const KernelState& k, Dim3 grid, Dim3 block, unsigned shared_bytes,
                               const LazyText& describe) {
  std::string out = "kernel '" + k.name + "'";
  if (!describe.empty()) out += " [" + describe.str() + "]";
  out += " grid " + dim_text(grid) + " block " + dim_text(block) + " dynamic shared " + std::to_string(shared_bytes) +
         " bytes on device " + std::to_string(k.device->ordinal());
  uint64_t threads = uint64_t{block.x} * block.y * block.z;
  if (k.max_threads_per_block > 0 && threads > static_cast<uint64_t>(k.max_threads_per_block)) {
    out += " (block has " + std::to_string(threads) + " threads; this kernel allows at most " +
           std::to_string(k.max_threads_per_block) + ")";
  }
  return out;
}

}  // namespace detail

inline void CudaFunction::set_max_dynamic_shared_memory(int bytes) const {
  state();  // throws if empty
  detail::KernelState& k = *state_;
  if (bytes <= k.dynamic_shared_limit.load(std::memory_order_relaxed)) return;
  const DeviceProperties& p = k.device->properties();
  int allowed = p.max_shared_per_block_optin - k.static_shared_bytes;
  if (bytes > allowed) {
    throw Error("kiln: kernel '" + k.name + "' asks for " + std::to_string(bytes) +
                " bytes of dynamic shared memory; " + p.name + " allows " + std::to_string(allowed) +
                " (opt-in limit " + std::to_string(p.max_shared_per_block_optin) + " minus " +
                std::to_string(k.static_shared_bytes) + " static)");
  }
  k.device->make_current();
  check(driver().cuFuncSetAttribute(k.function, kFuncAttrMaxDynamicSharedSizeBytes, bytes),
        "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, " + std::to_string(bytes) + ") of kernel '" + k.name + "'");
  k.dynamic_shared_limit.store(bytes, std::memory_order_relaxed);
}

inline void CudaFunction::launch(Dim3 grid, Dim3 block, unsigned shared_bytes, void** args,
                                 const LazyText& describe, CUstream stream, bool programmatic, int priority) const {
  const detail::KernelState& k = state();
  if (static_cast<int>(shared_bytes) > k.dynamic_shared_limit.load(std::memory_order_relaxed)) {
    set_max_dynamic_shared_memory(static_cast<int>(shared_bytes));
  }
  CudaDevice& dev = *k.device;
  dev.make_current();
  CUstream s = stream != nullptr ? stream : dev.stream();
  const DriverApi& api = driver();
  // A driver that refuses the attribute where a plain launch of the same kernel succeeds (not
  // every configuration allows it) gets plain launches from then on; any other error the plain
  // launch reports.
  static std::atomic<bool> refused{false};
  programmatic = programmatic && dev.properties().cc_major >= 9;
  const bool tried = (programmatic || priority != 0) && api.cuLaunchKernelEx && !refused.load(std::memory_order_relaxed);
  CUresult r = kSuccess;
  if (tried) {
    LaunchAttribute attrs[2];
    unsigned n = 0;
    if (programmatic) attrs[n].id = kLaunchAttributeProgrammaticStreamSerialization, attrs[n++].value.i = 1;
    if (priority != 0) attrs[n].id = kLaunchAttributePriority, attrs[n++].value.i = priority;
    LaunchConfig c{grid.x, grid.y, grid.z, block.x, block.y, block.z, shared_bytes, s, attrs, n};
    r = api.cuLaunchKernelEx(&c, k.function, args, nullptr);
    if (r == kSuccess && programmatic) ::kiln::detail::counters_state().kernels_programmatic.fetch_add(1, std::memory_order_relaxed);
  }
  if (!tried || r != kSuccess) {
    r = api.cuLaunchKernel(k.function, grid.x, grid.y, grid.z, block.x, block.y, block.z, shared_bytes, s, args, nullptr);
    if (r != kSuccess) check(r, "cuLaunchKernel of " + detail::launch_text(k, grid, block, shared_bytes, describe));
    if (tried && !refused.exchange(true))
      log(LogTopic::jit, std::string("cuLaunchKernelEx refused a ") + (programmatic ? "programmatic " : "") +
                             (priority != 0 ? "prioritised " : "") + "launch of kernel '" + k.name +
                             "', which launched plainly: plain launches from now on");
  }
  ::kiln::detail::counters_state().kernels_launched.fetch_add(1, std::memory_order_relaxed);
  dev.note_launch(&k.name);
  if (sync_mode()) {
    r = api.cuStreamSynchronize(s);
    if (r != kSuccess) {
      check(r, "execution of " + detail::launch_text(k, grid, block, shared_bytes, describe) + " (KILN_CUDA_SYNC)");
    }
  }
}

inline int CudaFunction::attribute(int which) const {
  const detail::KernelState& k = state();
  int value = 0;
  check(driver().cuFuncGetAttribute(&value, which, k.function),
        "cuFuncGetAttribute(" + std::to_string(which) + ") of kernel '" + k.name + "'");
  return value;
}

inline int CudaFunction::max_active_blocks_per_sm(int block_threads, size_t dynamic_shared_bytes) const {
  const detail::KernelState& k = state();
  k.device->make_current();
  int blocks = 0;
  check(driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, k.function, block_threads,
                                                             dynamic_shared_bytes),
        "cuOccupancyMaxActiveBlocksPerMultiprocessor of kernel '" + k.name + "'");
  return blocks;
}

inline CudaFunction CudaModule::function(std::string_view name) {
  std::lock_guard lock(mutex_);
  auto it = kernels_.find(std::string(name));
  if (it != kernels_.end()) return CudaFunction(it->second.get());
  const DriverApi& api = driver();
  device_.make_current();
  auto k = std::make_unique<detail::KernelState>();
  k->name = std::string(name);
  k->device = &device_;
  CUresult r = api.cuModuleGetFunction(&k->function, module_, k->name.c_str());
  if (r != kSuccess) {
    check(r, "cuModuleGetFunction: no kernel '" + k->name + "' in module '" + name_ +
                 "' (is it declared extern \"C\" __global__?)");
  }
  check(api.cuFuncGetAttribute(&k->max_threads_per_block, kFuncAttrMaxThreadsPerBlock, k->function),
        "cuFuncGetAttribute(MAX_THREADS_PER_BLOCK) of kernel '" + k->name + "'");
  check(api.cuFuncGetAttribute(&k->static_shared_bytes, kFuncAttrSharedSizeBytes, k->function),
        "cuFuncGetAttribute(SHARED_SIZE_BYTES) of kernel '" + k->name + "'");
  // NOTE: the default dynamic limit is 48 KiB minus the static shared memory.
  k->dynamic_shared_limit.store(std::max(0, 48 * 1024 - k->static_shared_bytes), std::memory_order_relaxed);
  detail::KernelState* raw = k.get();
  kernels_.emplace(k->name, std::move(k));
  return CudaFunction(raw);
}

inline CudaModule& CudaDevice::load_module(const std::string& source, const std::vector<std::string>& extra_options,
                                           const std::string& name_hint) {
  Hasher h;
  h.add(std::string_view("kiln-cuda-module")).add(std::string_view(source)).add(uint64_t{extra_options.size()});
  for (const auto& o : extra_options) h.add(std::string_view(o));
  Hash128 key = h.digest();

  std::shared_ptr<ModuleSlot> slot;
  bool owner = false;
  {
    std::lock_guard lock(modules_mutex_);
    auto [it, inserted] = modules_.try_emplace(key);
    if (inserted) it->second = std::make_shared<ModuleSlot>();
    slot = it->second;
    owner = inserted;
  }
  if (!owner) {
    ::kiln::detail::counters_state().memory_hits.fetch_add(1, std::memory_order_relaxed);
    return *slot->future.get();  // rethrows the owner's error if its build failed
  }
  try {
    int cc = jit::nvrtc_machine_target(properties_.cc());
    std::string cubin = jit::nvrtc_compile(source, name_hint, cc / 10, cc % 10, extra_options);
    make_current();
    CUmodule module = nullptr;
    CUresult r = driver().cuModuleLoadData(&module, cubin.data());
    if (r != kSuccess) {
      check(r, "cuModuleLoadData of module '" + name_hint + "' (cubin for sm_" +
                   std::to_string(jit::cubin_sm(cubin)) + ") on device " + std::to_string(ordinal_) + " (" +
                   properties_.name + ", sm_" + std::to_string(properties_.cc()) + ")");
    }
    slot->module = std::make_unique<CudaModule>(*this, module, name_hint);
    slot->promise.set_value(slot->module.get());
    return *slot->module;
  } catch (...) {
    {
      // A failed build is not remembered: the next call tries again.
      std::lock_guard lock(modules_mutex_);
      auto it = modules_.find(key);
      if (it != modules_.end() && it->second == slot) modules_.erase(it);
    }
    slot->promise.set_exception(std::current_exception());
    throw;
  }
}

// The module compiled from `source` on `device`, loaded once per process and
// device: memory map (counts memory_hits) -> disk cache -> NVRTC. The source may
// hold many kernels; fetch each with CudaModule::function. Thread-safe: different
// sources compile in parallel, one source once. Throws kiln::CompileError when
// the source does not compile, kiln::Error when CUDA or NVRTC is missing.
inline CudaModule& load_cuda_module(const std::string& source, int device = 0,
                                    const std::vector<std::string>& extra_options = {},
                                    const std::string& name_hint = "kernels") {
  return cuda_device(device).load_module(source, extra_options, name_hint);
}

// ---- graphs --------------------------------------------------------------------

// A chain of kernel launches on one device, instantiated once as a CUDA graph and
// then launched with one call (Mode::reduce_overhead: one replay instead of a launch
// per kernel). A node's arguments can be changed between launches (set_params: the
// same kernel and launch shape); anything else needs build() again. Not thread-safe:
// one owner (a thread's last call of a plan).
class CudaGraph {
 public:
  struct Launch {
    CudaFunction fn;
    Dim3 grid, block;
    unsigned shared_bytes = 0;
    void** params = nullptr;  // as cuLaunchKernel takes them; the driver copies the values
  };
  // Whether the driver has graphs (CUDA 12+: the entry points are optional).
  static bool supported() { return cuda_available() && driver().has_graphs(); }

  CudaGraph() = default;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  ~CudaGraph() { reset(); }

  bool built() const { return exec_ != nullptr; }
  // The programmatic edges build() made (nodes that may start before the node they follow ends).
  size_t early_edges() const { return early_edges_; }

  // Replaces the graph by `launches` on `dev`: launch i after the earlier launches after[i]
  // names, or, where `after` is empty, each after the one before. With `early`, each launch's
  // first such edge is programmatic (sm_90 and later, a CUDA 12.3+ driver: the launch may start
  // before that kernel ends, and waits for it first, as every generated kernel does;
  // kiln::programmatic_launch). `priorities` (where given): each node's launch priority, 0 for
  // its stream's (kiln::idle_fill; a driver without the node attribute, or that refuses it,
  // keeps the stream's).
  // On failure nothing is left built (the next call builds again) and the error names the kernel.
  void build(CudaDevice& dev, const std::vector<Launch>& launches, const std::vector<std::vector<size_t>>& after = {},
             bool early = false, const std::vector<int>& priorities = {}) {
    reset();
    const DriverApi& api = driver();
    dev.make_current();
    // Dynamic shared memory above the default is an attribute of the kernel, as for a launch.
    for (const Launch& l : launches) l.fn.set_max_dynamic_shared_memory(int(l.shared_bytes));
    auto fail = [&](CUresult r, const std::string& what) {
      reset();
      check(r, "building the CUDA graph of " + std::to_string(launches.size()) + " kernels on device " +
                   std::to_string(dev.ordinal()) + ": " + what);
    };
    if (CUresult r = api.cuGraphCreate(&graph_, 0); r != kSuccess) fail(r, "cuGraphCreate");
    early = early && api.cuGraphAddDependencies && dev.properties().cc_major >= 9;
    std::vector<CUgraphNode> deps;
    for (const Launch& l : launches) {
      KernelNodeParams p = params(l);
      const size_t i = nodes_.size();
      deps.clear();
      if (after.empty() && !nodes_.empty()) deps.push_back(nodes_.back());
      if (!after.empty())
        for (size_t d : after[i]) deps.push_back(nodes_.at(d));
      const bool e = early && !deps.empty();
      CUgraphNode node = nullptr;
      if (CUresult r = api.cuGraphAddKernelNode(&node, graph_, deps.data() + e, deps.size() - e, &p); r != kSuccess)
        fail(r, "cuGraphAddKernelNode of " + describe(l));
      nodes_.push_back(node);
      if (!priorities.empty() && priorities[i] != 0 && api.cuGraphKernelNodeSetAttribute) {
        // A hint: a driver that refuses it leaves the node at its stream's priority (logged once).
        LaunchAttribute::Value v{};
        v.i = priorities[i];
        static std::atomic<bool> refused{false};
        if (api.cuGraphKernelNodeSetAttribute(node, kLaunchAttributePriority, &v) != kSuccess && !refused.exchange(true))
          log(LogTopic::jit, "cuGraphKernelNodeSetAttribute refused a priority for " + describe(l) + ": graph nodes keep their stream's");
      }
      if (e) {
        if (CUresult r = api.cuGraphAddDependencies(graph_, &deps[0], &node, &kProgrammaticEdge, 1); r != kSuccess)
          fail(r, "cuGraphAddDependencies (programmatic) to " + describe(l));
        ++early_edges_;
      }
    }
    if (CUresult r = api.cuGraphInstantiate(&exec_, graph_, 0); r != kSuccess) {
      exec_ = nullptr;
      fail(r, "cuGraphInstantiate");
    }
    device_ = &dev;
    last_ = launches.empty() ? nullptr : &launches.back().fn.name();
  }

  // Node i's new arguments (grid, block and shared memory as built).
  void set_params(size_t i, const Launch& l) {
    KernelNodeParams p = params(l);
    check(driver().cuGraphExecKernelNodeSetParams(exec_, nodes_.at(i), &p), "cuGraphExecKernelNodeSetParams of " + describe(l));
  }

  // Launches the graph on the device's stream. In sync mode, waits and checks.
  void launch() {
    if (!built()) throw Error("kiln: internal error: launch of a CUDA graph that was not built");
    CudaDevice& dev = *device_;
    dev.make_current();
    check(driver().cuGraphLaunch(exec_, dev.stream()), "cuGraphLaunch of a graph of " + std::to_string(nodes_.size()) + " kernels");
    if (last_) dev.note_launch(last_);
    if (sync_mode()) dev.check_async(driver().cuStreamSynchronize(dev.stream()), "execution of a CUDA graph (KILN_CUDA_SYNC)");
  }

  // Destroys the graph (never throws: also run at thread exit).
  void reset() noexcept {
    if (exec_) driver().cuGraphExecDestroy(exec_);  // NOTE: driver() is loaded wherever a graph was made
    if (graph_) driver().cuGraphDestroy(graph_);
    exec_ = nullptr, graph_ = nullptr, device_ = nullptr, last_ = nullptr;
    nodes_.clear();
    early_edges_ = 0;
  }

 private:
  static KernelNodeParams params(const Launch& l) {
    KernelNodeParams p;
    p.func = l.fn.handle();
    p.grid_x = l.grid.x, p.grid_y = l.grid.y, p.grid_z = l.grid.z;
    p.block_x = l.block.x, p.block_y = l.block.y, p.block_z = l.block.z;
    p.shared_bytes = l.shared_bytes;
    p.params = l.params;
    return p;
  }
  static std::string describe(const Launch& l) {
    return "kernel '" + l.fn.name() + "' (grid " + std::to_string(l.grid.x) + "x" + std::to_string(l.grid.y) + "x" +
           std::to_string(l.grid.z) + ", block " + std::to_string(l.block.x) + "x" + std::to_string(l.block.y) + "x" +
           std::to_string(l.block.z) + ", " + std::to_string(l.shared_bytes) + " bytes of shared memory)";
  }

  CUgraph graph_ = nullptr;
  CUgraphExec exec_ = nullptr;
  std::vector<CUgraphNode> nodes_;
  size_t early_edges_ = 0;
  CudaDevice* device_ = nullptr;
  const std::string* last_ = nullptr;  // the last kernel's name (errors name it), stable for the process
};

// ---- events ---------------------------------------------------------------------

// A point in a stream that another stream waits for (no timing: cheaper to record). Made on
// its first record; movable, so that a call keeps a vector of them.
class CudaEvent {
 public:
  CudaEvent() = default;
  CudaEvent(CudaEvent&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  CudaEvent& operator=(CudaEvent&& o) noexcept {
    std::swap(event_, o.event_);
    return *this;
  }
  ~CudaEvent() {
    if (event_) driver().cuEventDestroy(event_);  // NOTE: result ignored: a destructor cannot report it
  }
  void record(CudaDevice& dev, CUstream stream) {
    dev.make_current();
    if (!event_) check(driver().cuEventCreate(&event_, kEventDisableTiming), "cuEventCreate");
    dev.check_async(driver().cuEventRecord(event_, stream), "cuEventRecord");
  }
  CUevent handle() const { return event_; }

 private:
  CUevent event_ = nullptr;
};

inline void CudaDevice::wait(CUstream stream, const CudaEvent& event) const {
  check_async(driver().cuStreamWaitEvent(stream, event.handle(), 0), "cuStreamWaitEvent");
}

// ---- timing -------------------------------------------------------------------

// CUDA events around work on a stream: the GPU's own clock, free of host
// launch overhead. start(); ...launches...; stop(); elapsed_ms().
class EventTimer {
 public:
  explicit EventTimer(int device = 0) : device_(&cuda_device(device)) {
    device_->make_current();
    check(driver().cuEventCreate(&start_, kEventDefault), "cuEventCreate");
    CUresult r = driver().cuEventCreate(&stop_, kEventDefault);
    if (r != kSuccess) {
      driver().cuEventDestroy(start_);
      check(r, "cuEventCreate");
    }
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  ~EventTimer() {
    driver().cuEventDestroy(start_);  // NOTE: results ignored: a destructor cannot report them
    driver().cuEventDestroy(stop_);
  }

  void start(CUstream stream = nullptr) { record(start_, stream); }
  void stop(CUstream stream = nullptr) { record(stop_, stream); }

  // Milliseconds between start() and stop(); waits for stop().
  float elapsed_ms() const {
    device_->make_current();
    device_->check_async(driver().cuEventSynchronize(stop_), "cuEventSynchronize");
    float ms = 0;
    check(driver().cuEventElapsedTime(&ms, start_, stop_), "cuEventElapsedTime");
    return ms;
  }

 private:
  void record(CUevent e, CUstream stream) {
    device_->make_current();
    check(driver().cuEventRecord(e, stream != nullptr ? stream : device_->stream()), "cuEventRecord");
  }

  CudaDevice* device_;
  CUevent start_ = nullptr, stop_ = nullptr;
};

// Evicts the L2 cache by writing twice its size on the device's stream (queued),
// so a timed kernel reads from HBM as it would in a real model.
inline void flush_l2(int device = 0) {
  CudaDevice& dev = cuda_device(device);
  static std::mutex mutex;
  static std::unordered_map<int, DeviceBuffer> scratch;
  std::lock_guard lock(mutex);
  DeviceBuffer& b = scratch[device];
  size_t bytes = std::max<size_t>(size_t(2) * static_cast<size_t>(dev.properties().l2_bytes), 1 << 20);
  if (b.size() < bytes) b = DeviceBuffer(bytes, device);
  fill_words(b, 0);
}

}  // namespace kiln::cu
