// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// A device API policy (runtime/gpu_backend.hpp) with no device behind it, so that
// GpuBackend<FakeGpuApi>::run — bind, variant choice, program lookup, launch shape,
// argument block — runs on a CPU-only machine over CPU buffers. Its "device" has a
// chosen warp size, compute capability and SM count; loading a module compiles
// nothing (it keeps the source and options) and a launch only records what it was
// given. Used by tests (which program and launch a call gets) and by
// bench/host_overhead (the GPU dispatch's own host work per call).
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/kiln.hpp"
#include "kiln/runtime/gpu_backend.hpp"

namespace kiln::test {

struct FakeGpuDevice {
  struct Properties {
    int warp_size = 32, sm_count = 132, cc_major = 9, cc_minor = 0;
  };
  struct Dim3 {
    unsigned x = 1, y = 1, z = 1;
  };
  struct Module {
    std::string source;
    std::vector<std::string> options;
  };
  // What one launch was given; `words`: the first record_words[i] words of launch i's argument
  // block; `stream`: 0 the device's, 1 its side stream, 2 its fill stream (a graph's nodes: 0);
  // `after`: the earlier launches the streams, events and graph edges make sure have finished
  // before it starts (as the driver would order them); `priority`: the launch's own (0: its stream's).
  struct Launch {
    const Module* module = nullptr;
    std::string name;
    Dim3 grid, block;
    unsigned shared_bytes = 0;
    std::vector<uint64_t> words;
    int stream = 0;
    std::vector<size_t> after;
    bool programmatic = false;  // may start before the launch before it on its stream ends (sm_90 and later)
    int priority = 0;
  };
  // Per stream, the launches finished before its next one starts (the streams' order and the
  // events it waited for); kept while `record` is on.
  std::vector<size_t> done_before[3];
  size_t waits = 0;  // events waited for, recording or not
  struct Function {
    FakeGpuDevice* device = nullptr;
    const Module* module = nullptr;
    std::string name;
    void launch(Dim3 grid, Dim3 block, unsigned shared_bytes, void** params, const LazyText&, void* stream,
                bool programmatic = false, int priority = 0) const {
      if (device->fail_launch == device->launches)
        throw Error("kiln: cuLaunchKernel of '" + name + "' failed: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (fake driver)");
      kiln::detail::counters_state().kernels_launched.fetch_add(1, std::memory_order_relaxed);
      programmatic = programmatic && device->props.cc_major >= 9;  // as the CUDA runtime decides
      if (programmatic) kiln::detail::counters_state().kernels_programmatic.fetch_add(1, std::memory_order_relaxed);
      ++device->launches;
      if (!device->record) return;
      size_t i = device->launched.size();
      const int s = stream_index(stream);
      Launch& l = device->launched.emplace_back(
          Launch{module, name, grid, block, shared_bytes, {}, s, device->done_before[s], programmatic, priority});
      device->done_before[s].push_back(i);
      const auto* block_words = static_cast<const uint64_t*>(params[0]);
      if (i < device->record_words.size()) l.words.assign(block_words, block_words + device->record_words[i]);
    }
  };
  struct ModuleRef {
    FakeGpuDevice* device;
    const Module* module;
    Function function(std::string_view name) const { return Function{device, module, std::string(name)}; }
  };

  explicit FakeGpuDevice(int ordinal) : index(ordinal) {}
  Properties props;
  int index;
  std::deque<Module> modules;  // every load, in order
  std::deque<ModuleRef> refs;
  size_t launches = 0;
  size_t fail_launch = size_t(-1);   // the launch with this count (`launches` before it) throws, as a driver's may
  bool record = false;               // keep each launch in `launched`
  std::vector<size_t> record_words;  // per launch: how many argument-block words to keep (its size at most)
  std::vector<Launch> launched;

  void make_current() const {}
  const Properties& properties() const { return props; }
  int ordinal() const { return index; }
  static inline void* const side = reinterpret_cast<void*>(uintptr_t(1));
  static inline void* const fill = reinterpret_cast<void*>(uintptr_t(2));
  static int stream_index(void* stream) { return stream == side ? 1 : stream == fill ? 2 : 0; }
  void* stream() const { return nullptr; }
  void* side_stream() const { return side; }
  void* fill_stream() const { return fill; }
  // As a CUDA device with priorities 0 (the streams') down to -5 gives (CudaDevice::raised_priority).
  int raised = -1;
  int raised_priority() const { return raised; }
  // An event holds what its stream had finished-before when recorded.
  struct Event {
    std::vector<size_t> done;
    void record(FakeGpuDevice& dev, void* stream) {
      done = dev.done_before[stream_index(stream)];
    }
  };
  void wait(void* stream, const Event& e) {
    ++waits;
    auto& d = done_before[stream_index(stream)];
    for (size_t i : e.done)
      if (std::find(d.begin(), d.end(), i) == d.end()) d.push_back(i);
  }
  // Forgets what was launched (a test's fresh start).
  void clear_launched() {
    launched.clear();
    for (auto& d : done_before) d.clear();
  }
  std::mutex load_mutex;  // a backend loads a plan's programs from several threads at once
  ModuleRef& load_module(const std::string& source, const std::vector<std::string>& options, const std::string&) {
    std::lock_guard lock(load_mutex);
    modules.push_back({source, options});
    return refs.emplace_back(ModuleRef{this, &modules.back()});
  }
};

struct FakeGpuApi : runtime::GpuDeviceApi<DeviceKind::cpu, codegen::GpuDialect::cuda> {
  using Event = FakeGpuDevice::Event;
  // Two devices, as a test sets them up (a device's properties are fixed once it has run a plan).
  static FakeGpuDevice& device(int ordinal) {
    static FakeGpuDevice devices[2] = {FakeGpuDevice(0), FakeGpuDevice(1)};
    return devices[ordinal];
  }
  static std::string arch_name(FakeGpuDevice& dev) {
    return "sm_" + std::to_string(dev.props.cc_major * 10 + dev.props.cc_minor);
  }
  // The vendor GEMM: none, unless a test offers it (`library`); then it computes every matmul
  // kernel, and max-autotune times it at half a kiln kernel's time (Timer), so it is chosen.
  static constexpr const char* kLibraryGemm = "fake-library";
  static inline bool library = false, library_last = false;
  static bool library_gemm_applies(const ir::Graph&, const sched::Kernel&, const codegen::Layout&, const runtime::KernelArgs&) {
    return library;
  }
  static bool library_gemm(const ir::Graph&, const sched::Kernel&, const codegen::Layout&, const runtime::KernelArgs&,
                           FakeGpuDevice& dev) {
    if (library) ++dev.launches, library_last = true;
    return library;
  }
  // A wgmma GEMM's tensor maps: none (no copy engine behind it); a launch records the argument block.
  static void tensor_maps(const runtime::KernelArgs&, const codegen::GpuVariant&, const uint64_t*, runtime::TensorMaps&) {}
  // max-autotune's compiles ahead of the timing: every program it was given, in order.
  static inline std::vector<std::string> compiled_ahead;
  static void compile_ahead(const std::vector<std::pair<std::string, std::vector<std::string>>>& programs, FakeGpuDevice&) {
    for (const auto& p : programs) compiled_ahead.push_back(p.first);
  }
  // max-autotune's timing: every cache flush and every timed run (each takes 1 ms; the vendor
  // GEMM's 0.5 after a flush, as the tuner times a candidate, and library_in_plan_ms without:
  // in a plan's run, which max-autotune times to check its choices).
  static inline std::atomic<int> flushes{0}, timed{0};
  static inline float library_in_plan_ms = 0.5f;
  static inline int flushes_seen = 0;
  static void flush_cache(FakeGpuDevice&) { ++flushes; }
  struct Timer {
    explicit Timer(int) {}
    void start(void*) { ++timed, library_last = false, flushed = flushes != flushes_seen, flushes_seen = flushes; }
    void stop(void*) {}
    float elapsed_ms() const { return library_last ? (flushed ? 0.5f : library_in_plan_ms) : 1.0f; }
    bool flushed = false;
  };
  // Mode::reduce_overhead's graph, as the driver keeps one: build and set_params copy each
  // node's argument words (record_words[i] of them) then and there; a launch records every
  // node's launch from those copies, so a node the backend forgot to update replays stale
  // arguments.
  static bool graphs() { return true; }
  struct Graph {
    struct Launch {
      FakeGpuDevice::Function fn;
      FakeGpuDevice::Dim3 grid, block;
      unsigned shared_bytes = 0;
      void** params = nullptr;
    };
    bool built() const { return device != nullptr; }
    static inline int fail_builds = 0;  // the next this many builds fail, as a driver's may (out of memory)
    void build(FakeGpuDevice& dev, const std::vector<Launch>& launches, const std::vector<std::vector<size_t>>& after_nodes = {},
               bool early_edges = false, const std::vector<int>& node_priorities = {}) {
      device = nullptr;
      after = after_nodes;
      priorities = node_priorities;
      early = early_edges && dev.props.cc_major >= 9;  // as CudaGraph::build decides
      if (fail_builds > 0) {
        --fail_builds;
        throw Error("kiln: building the CUDA graph of " + std::to_string(launches.size()) +
                    " kernels on device 0: cuGraphInstantiate failed: CUDA_ERROR_OUT_OF_MEMORY (fake driver)");
      }
      device = &dev;
      nodes.clear();
      for (size_t i = 0; i < launches.size(); ++i) nodes.push_back(node(i, launches[i]));
    }
    // Nodes whose first edge is programmatic (they may start before the node they follow ends).
    size_t early_edges() const {
      size_t e = 0;
      for (size_t i = 0; i < nodes.size(); ++i) e += nodes[i].programmatic;
      return e;
    }
    void set_params(size_t i, const Launch& l) {
      if (fail_updates > 0) {
        --fail_updates;
        throw Error("kiln: cuGraphExecKernelNodeSetParams failed (fake driver)");
      }
      nodes.at(i) = node(i, l);
    }
    static inline int fail_updates = 0;  // the next this many node updates fail
    void reset() noexcept { device = nullptr, nodes.clear(), after.clear(), priorities.clear(), early = false; }
    // On the device's stream: each node after what the stream finished before the graph and
    // after the nodes its edges name (each after the one before where the graph has no edges).
    void launch() const {
      device->launches += nodes.size();
      if (!device->record) return;
      const size_t base = device->launched.size();
      auto& d = device->done_before[0];
      const std::vector<size_t> before = d;
      for (size_t i = 0; i < nodes.size(); ++i) {
        FakeGpuDevice::Launch l = nodes[i];
        l.after = before;
        std::vector<size_t> edges = after.empty() ? (i ? std::vector<size_t>{i - 1} : std::vector<size_t>{}) : after[i];
        for (size_t e : edges) {
          const auto& up = device->launched[base + e];
          l.after.push_back(base + e);
          l.after.insert(l.after.end(), up.after.begin(), up.after.end());
        }
        device->launched.push_back(std::move(l));
        d.push_back(base + i);
      }
    }
    FakeGpuDevice* device = nullptr;
    std::vector<FakeGpuDevice::Launch> nodes;
    std::vector<std::vector<size_t>> after;
    std::vector<int> priorities;  // per node (empty: each its stream's)
    bool early = false;

   private:
    FakeGpuDevice::Launch node(size_t i, const Launch& l) const {
      FakeGpuDevice::Launch n{l.fn.module, l.fn.name, l.grid, l.block, l.shared_bytes, {}, 0, {},
                              early && (after.empty() ? i > 0 : !after[i].empty()), priorities.empty() ? 0 : priorities.at(i)};
      const auto* words = static_cast<const uint64_t*>(l.params[0]);
      if (i < device->record_words.size()) n.words.assign(words, words + device->record_words[i]);
      return n;
    }
  };
};

using FakeGpuBackend = runtime::GpuBackend<FakeGpuApi>;

}  // namespace kiln::test
