// The workspace of the tensor-core linear for tests and benchmarks that launch it directly (the CUDA
// backend keeps its own): header-only, so that qspec_cuda_bench, which has no gtest, shares it too.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "backend/cuda/launchers.h"
#include "backend/ops.h"

namespace qspec::cuda_test {

// Partial sums for `rows` rows of x against an [n, k] weight with chunks_per_split (0: the default), as
// linear_mma_partial_floats sizes them (at least one, so an unsplit K allocates).
class LinearMmaWorkspaceBuffers {
 public:
  LinearMmaWorkspaceBuffers(Backend& gpu, int64_t rows, int64_t n, int64_t k, int64_t chunks_per_split = 0) {
    const auto floats = static_cast<int64_t>(cuda::linear_mma_partial_floats(rows, n, k, chunks_per_split));
    partials_ = gpu.alloc(DType::F32, std::max<int64_t>(1, floats), 1);
    // Direct launches go to the default stream, not to the backend's.
    gpu.synchronize();
  }

  cuda::LinearMmaWorkspace get() const { return {partials_->tensor().ptr<float>()}; }

 private:
  std::unique_ptr<Buffer> partials_;
};

}  // namespace qspec::cuda_test
