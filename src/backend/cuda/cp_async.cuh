// Asynchronous global -> shared copies (cp.async, sm_80+): bytes land in shared memory without passing
// through registers, so a kernel can keep several tiles in flight. A copy reads its first `source_bytes`
// bytes (0 = none) and fills the rest with zeros; both addresses are aligned to the copy's size.
#pragma once

#include <cuda_runtime.h>

namespace qspec::cuda {

__device__ inline unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// 16 bytes, L1 bypassed (data read once).
__device__ inline void cp_async_16(void* shared, const void* global, int source_bytes = 16) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(source_bytes)
               : "memory");
}

__device__ inline void cp_async_8(void* shared, const void* global) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(shared_address(shared)), "l"(global)
               : "memory");
}

__device__ inline void cp_async_4(void* shared, const void* global, int source_bytes = 4) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(source_bytes)
               : "memory");
}

// Closes the group of copies issued since the last commit.
__device__ inline void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of this thread's groups are in flight.
template <int kPending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ inline void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

}  // namespace qspec::cuda
