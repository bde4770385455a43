// Programmatic dependent launch (PDL, sm_90+): every kernel of the backend is launched with
// cudaLaunchAttributeProgrammaticStreamSerialization, so the GPU may start it while the kernel before it on
// the stream (or in the captured step graph) is still running; its launch latency and prologue then overlap
// the previous kernel's tail. The price is a rule every kernel obeys:
//
//   wait_for_previous_kernel() is the first statement of every kernel, executed by every thread before any
//   global memory access and before any early return.
//
// griddepcontrol.wait blocks until the previous grid has completed and its writes are visible, so after it
// the kernel may read what the previous kernel wrote and overwrite what it read. Executing it in every thread
// (never skipping it through an early return) also keeps the chain transitive: a grid cannot complete before
// the grid it waits for, so when kernel N+1 has waited for kernel N, kernel N-1 has completed too, and a
// memcpy, cuBLAS call or host sync after any kernel sees every earlier kernel's results.
//
// allow_next_kernel() follows the wait in every kernel. The next kernel is let in only once every block of
// this one has executed it (or exited), i.e. when this grid's last blocks are resident, so the dependent
// blocks that then take free SM slots never delay a block of this grid; they run their own prologue and stop
// at their wait. Calling it after the wait (not before) keeps at most one grid waiting behind a running one.
//
// Both are no-ops when the kernel was not launched with the attribute (PDL off, cuBLAS before or after) and
// compile to nothing below sm_90. The host decides once per process (programmatic_launch_enabled()).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

namespace qspec::cuda {

__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether launches carry the PDL attribute: the kernels were compiled for sm_90+ (their griddepcontrol.wait
// exists in the code the device runs) and the environment does not say QSPEC_PDL=0. Decided on the first
// call (CudaBackend's constructor makes it, outside any stream capture) and fixed for the process.
bool programmatic_launch_enabled();

// Launches kernel(args...) on `stream` (the triple-chevron launch's grid, block and dynamic shared bytes)
// with the PDL attribute when it is enabled; returns the launch status. A failed launch's error is also
// taken off the runtime's last-error slot (as the cudaGetLastError() after a chevron launch did), so no later
// caller (cuBLAS checks it) sees it again.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                          cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = programmatic_launch_enabled() ? 1 : 0;
  const cudaError_t status = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (status != cudaSuccess) static_cast<void>(cudaGetLastError());
  return status;
}

}  // namespace qspec::cuda
