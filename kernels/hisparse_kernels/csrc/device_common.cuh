// Device helpers shared by the hot-buffer kernels (hot_buffer.cuh) and the vLLM-schema resolve
// (vllm_resolve.cuh): inline functions only, so any number of translation units may include it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace hisparse {

constexpr int kEmptyKey = -1;

// ---------------------------------------------------------------------------------------------
// 16-byte copies. Host-pool reads bypass L1 (read once, streamed over PCIe).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint4 load_nc_16(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}

__device__ __forceinline__ void store_16(void* ptr, uint4 v) {
  *reinterpret_cast<uint4*>(ptr) = v;
}

// ---------------------------------------------------------------------------------------------
// Shared-memory open-addressing table keyed by non-negative int32 (global slot or block id).
// ---------------------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t hash_slot(int32_t key, int bits) {
  return (static_cast<uint32_t>(key) * 2654435761u) >> (32 - bits);
}

// Inserts key (or finds it) and returns its index. The table never fills: size >= 2 * keys.
__device__ __forceinline__ int table_insert(int32_t* keys, int bits, int32_t key) {
  const uint32_t mask = (1u << bits) - 1u;
  uint32_t idx = hash_slot(key, bits);
  while (true) {
    int32_t old = atomicCAS(&keys[idx], kEmptyKey, key);
    if (old == kEmptyKey || old == key) return static_cast<int>(idx);
    idx = (idx + 1u) & mask;
  }
}

__device__ __forceinline__ int table_find(const int32_t* keys, int bits, int32_t key) {
  const uint32_t mask = (1u << bits) - 1u;
  uint32_t idx = hash_slot(key, bits);
  while (true) {
    int32_t k = keys[idx];
    if (k == key) return static_cast<int>(idx);
    if (k == kEmptyKey) return -1;
    idx = (idx + 1u) & mask;
  }
}

// ---------------------------------------------------------------------------------------------
// Block-wide exclusive sum of one count per thread (thread order). Every thread must call it.
__device__ __forceinline__ int block_exclusive_sum(int value, int* warp_counts, int* warp_offsets, int* total) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
  int inclusive = value;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int up = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += up;
  }
  if (lane == 31) warp_counts[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int v = lane < num_warps ? warp_counts[lane] : 0;
    int acc = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int up = __shfl_up_sync(0xffffffffu, acc, d);
      if (lane >= d) acc += up;
    }
    warp_offsets[lane] = acc - v;
    if (lane == 31) *total = acc;
  }
  __syncthreads();
  return warp_offsets[warp] + inclusive - value;
}

}  // namespace hisparse
