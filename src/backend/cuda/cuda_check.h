// Turns a CUDA status into qspec's Error, naming what was being done.
#pragma once

#include <cuda_runtime.h>

#include <string_view>

namespace qspec::cuda {

// Throws Error "CUDA: WHAT: <error name>: <error string>" unless status is cudaSuccess.
void check_cuda(cudaError_t status, std::string_view what);

}  // namespace qspec::cuda
