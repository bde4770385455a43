// Step graphs on CUDA: the ops a step issues on a stream, captured once and replayed with one launch.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>

#include "backend/ops.h"

namespace qspec::cuda {

// Captures what `record` enqueues on `stream` (thread-local capture mode: other threads' CUDA calls are not
// affected) and instantiates it. If `record` throws, the capture is ended and discarded before rethrowing.
std::unique_ptr<StepGraph> capture_graph(cudaStream_t stream, const std::function<void()>& record);

}  // namespace qspec::cuda
