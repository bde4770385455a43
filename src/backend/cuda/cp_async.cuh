// Asynchronous global -> shared copies (cp.async, sm_80+): bytes land in shared memory without passing
// through registers, so a kernel can keep several tiles in flight. A copy reads its first `source_bytes`
// bytes (0 = none) and fills the rest with zeros; both addresses are aligned to the copy's size.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

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

// Bulk copies into shared memory that complete on a shared-memory barrier (sm_90; no code for older GPUs,
// whose callers never reach them).
__device__ inline void barrier_init(uint64_t* barrier) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(shared_address(barrier)) : "memory");
#endif
}

// The initialised barriers, visible to the bulk copies (the async proxy).
__device__ inline void fence_barrier_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// The barrier's current phase completes once `bytes` more have landed (and its one arrival, this, is made).
__device__ inline void expect_bytes(uint64_t* barrier, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(barrier)),
               "r"(bytes)
               : "memory");
#endif
}

// `bytes` from global `from` to shared `to`; the barrier's phase completes when they have landed.
__device__ inline void bulk_copy(void* to, const void* from, unsigned bytes, uint64_t* barrier) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  expect_bytes(barrier, bytes);
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          shared_address(to)),
      "l"(from), "r"(bytes), "r"(shared_address(barrier))
      : "memory");
#endif
}

__device__ inline void barrier_wait(uint64_t* barrier, unsigned phase) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(shared_address(barrier)), "r"(phase)
        : "memory");
  } while (done == 0);
#endif
}

// The box of a 2D tensor map (cuTensorMapEncodeTiled) at element (x, y) to shared `to` (128-byte aligned),
// counted against the barrier's expected bytes (expect_bytes, made first: the whole box, elements past the
// tensor being zeros). `map` is the map's address as a kernel's __grid_constant__ parameter.
__device__ inline void tensor_copy_2d(void* to, const void* map, int x, int y, uint64_t* barrier) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], [%4];\n" ::"r"(shared_address(to)),
      "l"(map), "r"(x), "r"(y), "r"(shared_address(barrier))
      : "memory");
#endif
}

}  // namespace qspec::cuda
