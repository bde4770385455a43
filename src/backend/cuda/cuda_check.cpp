#include "backend/cuda/cuda_check.h"

#include "core/error.h"

namespace qspec::cuda {

void check_cuda(cudaError_t status, std::string_view what) {
  if (status != cudaSuccess)
    fail("CUDA: {}: {}: {}", what, cudaGetErrorName(status), cudaGetErrorString(status));
}

}  // namespace qspec::cuda
