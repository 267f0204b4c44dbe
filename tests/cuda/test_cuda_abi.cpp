// kiln — header-only C++20 tensor compiler.
// SPDX-License-Identifier: Apache-2.0
//
// kiln loads libcuda with dlopen and includes no CUDA header, so it declares the few
// driver API structs and values it passes itself (runtime/cuda_driver.hpp). Where the
// build finds the toolkit's cuda.h (tests/CMakeLists.txt: KILN_CUDA_INCLUDE_DIR), this
// file checks them against it at compile time: a wrong offset would reach the driver as
// garbage, not as an error.
#include "kiln/runtime/cuda_driver.hpp"

#include <doctest/doctest.h>

#if __has_include(<cuda.h>)
#include <cuda.h>

#include <cstddef>

namespace cu = kiln::cu;

// cuLaunchKernelEx's config and attribute (programmatic launch).
static_assert(sizeof(cu::LaunchConfig) == sizeof(CUlaunchConfig));
static_assert(offsetof(cu::LaunchConfig, grid_x) == offsetof(CUlaunchConfig, gridDimX));
static_assert(offsetof(cu::LaunchConfig, block_z) == offsetof(CUlaunchConfig, blockDimZ));
static_assert(offsetof(cu::LaunchConfig, shared_bytes) == offsetof(CUlaunchConfig, sharedMemBytes));
static_assert(offsetof(cu::LaunchConfig, stream) == offsetof(CUlaunchConfig, hStream));
static_assert(offsetof(cu::LaunchConfig, attrs) == offsetof(CUlaunchConfig, attrs));
static_assert(offsetof(cu::LaunchConfig, attr_count) == offsetof(CUlaunchConfig, numAttrs));
static_assert(sizeof(cu::LaunchAttribute) == sizeof(CUlaunchAttribute));
static_assert(offsetof(cu::LaunchAttribute, value) == offsetof(CUlaunchAttribute, value));
static_assert(cu::kLaunchAttributeProgrammaticStreamSerialization == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
// A launch's (and a graph kernel node's) own priority (kiln::idle_fill), an int in the value union.
static_assert(cu::kLaunchAttributePriority == CU_LAUNCH_ATTRIBUTE_PRIORITY && cu::kLaunchAttributePriority == CU_KERNEL_NODE_ATTRIBUTE_PRIORITY);
static_assert(offsetof(CUlaunchAttributeValue, priority) == offsetof(cu::LaunchAttribute::Value, i));
static_assert(sizeof(cu::LaunchAttribute::Value) == sizeof(CUkernelNodeAttrValue));
// A graph's programmatic edge.
static_assert(sizeof(cu::GraphEdgeData) == sizeof(CUgraphEdgeData));
static_assert(offsetof(cu::GraphEdgeData, type) == offsetof(CUgraphEdgeData, type));
static_assert(cu::kProgrammaticEdge.from_port == CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC);
static_assert(cu::kProgrammaticEdge.type == CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC);
// A graph's kernel node (cuGraphAddKernelNode_v2, cuGraphExecKernelNodeSetParams_v2).
static_assert(sizeof(cu::KernelNodeParams) == sizeof(CUDA_KERNEL_NODE_PARAMS_v2));
static_assert(offsetof(cu::KernelNodeParams, shared_bytes) == offsetof(CUDA_KERNEL_NODE_PARAMS_v2, sharedMemBytes));
static_assert(offsetof(cu::KernelNodeParams, params) == offsetof(CUDA_KERNEL_NODE_PARAMS_v2, kernelParams));
static_assert(offsetof(cu::KernelNodeParams, ctx) == offsetof(CUDA_KERNEL_NODE_PARAMS_v2, ctx));
// The copy engine's tensor maps.
static_assert(cu::kTensorMapUint16 == CU_TENSOR_MAP_DATA_TYPE_UINT16 && cu::kTensorMapFloat32 == CU_TENSOR_MAP_DATA_TYPE_FLOAT32);
static_assert(cu::kTensorMapSwizzle64B == CU_TENSOR_MAP_SWIZZLE_64B && cu::kTensorMapSwizzle128B == CU_TENSOR_MAP_SWIZZLE_128B);
static_assert(cu::kTensorMapL2Promotion128B == CU_TENSOR_MAP_L2_PROMOTION_L2_128B);
// Device and function attributes, flags, results.
static_assert(cu::kAttrMultiprocessorCount == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
static_assert(cu::kAttrComputeCapabilityMajor == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
static_assert(cu::kAttrMaxSharedMemoryPerBlockOptin == CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
static_assert(cu::kAttrL2CacheSize == CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
static_assert(cu::kFuncAttrMaxDynamicSharedSizeBytes == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
static_assert(cu::kFuncAttrNumRegs == CU_FUNC_ATTRIBUTE_NUM_REGS);
static_assert(cu::kStreamNonBlocking == CU_STREAM_NON_BLOCKING && cu::kEventDisableTiming == CU_EVENT_DISABLE_TIMING);
static_assert(cu::kErrorNotReady == CUDA_ERROR_NOT_READY && cu::kErrorStubLibrary == CUDA_ERROR_STUB_LIBRARY);

TEST_CASE("CUDA driver ABI: kiln's own declarations of the driver's structs and values match cuda.h") {
  MESSAGE("checked at compile time against cuda.h " << CUDA_VERSION);
}
#else
TEST_CASE("CUDA driver ABI: kiln's own declarations of the driver's structs and values match cuda.h") {
  MESSAGE("cuda.h was not found when the tests were built: not checked (tests/CMakeLists.txt, KILN_CUDA_INCLUDE_DIR)");
}
#endif
