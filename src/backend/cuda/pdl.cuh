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
#include <cstdint>
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

// allow_next_kernel() in a kernel that makes cuBLAS's operand in some calls (`cublas_next`: the norms that
// write BF16 rows for the GEMM after them); those calls only wait, as the operand kernels of linear_gemm.cu
// (below).
__device__ __forceinline__ void allow_next_kernel_unless_cublas_next(bool cublas_next) {
  if (!cublas_next) allow_next_kernel();
}

// Whether launches carry the PDL attribute: the kernels were compiled for sm_90+ (their griddepcontrol.wait
// exists in the code the device runs) and the environment does not say QSPEC_PDL=0. Decided on the first
// call (CudaBackend's constructor makes it, outside any stream capture) and fixed for the process.
bool programmatic_launch_enabled();

// Whether kernels may be launched in thread block clusters: the code the device runs was built for sm_90+
// (the probe below; no environment setting).
bool clusters_supported();

// The largest grid (in blocks) launched with the attribute; 0: any. QSPEC_PDL_MAX_BLOCKS sets it, for
// measuring which kernels gain from an early start (one that fills the GPU for several waves only holds SM
// slots with its waiting blocks while the previous grid drains).
int64_t programmatic_launch_max_blocks();

// The kernels that make cuBLAS's operands (linear_gemm.cu) only wait: cuBLAS launches its GEMMs with the
// attribute itself, and an early allow_next_kernel() let a persistent GEMM's blocks sit on the SMs, waiting,
// while these many-wave kernels still ran (prefill 2048 went from 44 to 51 ms on the H200).
//
// Kernels whose first global reads are of weights may issue those before wait_for_previous_kernel(): no
// kernel writes a weight, so the loads overlap the previous grid's tail. Nothing else (activations, state,
// workspaces) is touched before the wait.

// Launches kernel(args...) on `stream` (the triple-chevron launch's grid, block and dynamic shared bytes)
// with the PDL attribute when it is enabled, in clusters of `cluster_blocks` consecutive blocks along x when
// that is more than 1 (sm_90+: the caller checks clusters_supported() and that the count divides grid.x);
// returns the launch status. A failed launch's error is also taken off the runtime's last-error slot (as the
// cudaGetLastError() after a chevron launch did), so no later caller (cuBLAS checks it) sees it again.
template <typename... Params, typename... Args>
cudaError_t launch_kernel_in_clusters(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                                      unsigned cluster_blocks, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attributes[2]{};
  unsigned count = 0;
  const int64_t max_blocks = programmatic_launch_max_blocks();
  const auto blocks = static_cast<int64_t>(grid.x) * grid.y * grid.z;
  if (programmatic_launch_enabled() && (max_blocks == 0 || blocks <= max_blocks)) {
    attributes[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attributes[count++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_blocks > 1) {
    attributes[count].id = cudaLaunchAttributeClusterDimension;
    attributes[count++].val.clusterDim = {cluster_blocks, 1, 1};
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = count;
  const cudaError_t status = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (status != cudaSuccess) static_cast<void>(cudaGetLastError());
  return status;
}

template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                          cudaStream_t stream, Args&&... args) {
  return launch_kernel_in_clusters(kernel, grid, block, shared_bytes, 1, stream, std::forward<Args>(args)...);
}

}  // namespace qspec::cuda
