// The workspace of the tensor-core linear for tests and benchmarks that launch it directly (the CUDA
// backend keeps its own): header-only, so that qspec_cuda_bench, which has no gtest, shares it too.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "backend/cuda/launchers.h"
#include "backend/ops.h"

namespace qspec::cuda_test {

// Partial sums and zeroed counters for `rows` rows of x against an [n, k] weight with chunks_per_split (0:
// the default), as linear_mma_workspace_size sizes them (at least one of each, so an unsplit K allocates).
class LinearMmaWorkspaceBuffers {
 public:
  LinearMmaWorkspaceBuffers(Backend& gpu, int64_t rows, int64_t n, int64_t k, int64_t chunks_per_split = 0) {
    const cuda::LinearMmaWorkspaceSize size = cuda::linear_mma_workspace_size(rows, n, k, chunks_per_split);
    partials_ = gpu.alloc(DType::F32, std::max<int64_t>(1, static_cast<int64_t>(size.partial_floats)), 1);
    counters_ = gpu.alloc(DType::I32, std::max<int64_t>(1, static_cast<int64_t>(size.counters)), 1);
    gpu.fill_zero(counters_->tensor());
    // Direct launches go to the default stream, not to the backend's.
    gpu.synchronize();
  }

  cuda::LinearMmaWorkspace get() const {
    return {partials_->tensor().ptr<float>(), static_cast<unsigned*>(counters_->tensor().data)};
  }

 private:
  std::unique_ptr<Buffer> partials_, counters_;
};

}  // namespace qspec::cuda_test
