// Checkpoint tensors to backend weights, shared by the target (qwen35) and the drafter (dflash) loaders.
#pragma once

#include <cstdint>
#include <string>

#include "backend/ops.h"
#include "io/checkpoint.h"

namespace qspec {

// A 1-D tensor of `length` elements as a [1, length] weight; throws Error naming the tensor otherwise.
Tensor upload_vector(Backend& backend, const TensorStore& store, const std::string& name, int64_t length);

// A Linear module found by find_linear (dense or W4A16) as a LinearWeight [out_features, in_features].
LinearWeight upload_linear(Backend& backend, const LinearTensors& found, int64_t out_features,
                           int64_t in_features);

}  // namespace qspec
