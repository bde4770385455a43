// The CUDA backend: every op of backend/ops.h on one GPU, with F32 activations in device memory and weights
// uploaded in their checkpoint dtype (BF16/F16/F32, W4A16 packed int32 + scales). All work is queued on one
// stream owned by the backend; only read() and synchronize() wait for it.
#pragma once

#include <memory>

#include "backend/ops.h"

namespace qspec {

// Uses the current CUDA device; throws Error when there is none.
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options = {});

}  // namespace qspec
