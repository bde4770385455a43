// Checkpoint tensors to backend weights, shared by the target (qwen35) and the drafter (dflash) loaders.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "io/checkpoint.h"

namespace qspec {

// A 1-D tensor of `length` elements as a [1, length] weight; throws Error naming the tensor otherwise.
Tensor upload_vector(Backend& backend, const TensorStore& store, const std::string& name, int64_t length);

// A Linear module found by find_linear (dense or W4A16) as a LinearWeight [out_features, in_features]; a
// W4A16 weight's BF16 copy (Backend::dequantized_copy), if the backend makes one, is appended to `storage`.
LinearWeight upload_linear(Backend& backend, const LinearTensors& found, int64_t out_features,
                           int64_t in_features, std::vector<std::unique_ptr<Buffer>>& storage);

// Linear modules that read the same input, computed as one: their weights stacked along out_features when
// they share a format (one weight read and one launch instead of several), else kept apart. Module i's
// features are columns offsets[i] .. of the output.
struct StackedLinear {
  std::vector<LinearWeight> parts;  // one per module, or one in all when stacked (then at offsets[0] = 0)
  std::vector<int64_t> offsets;
  int64_t out_features = 0;
};

// The stacked weights (and BF16 copies, as upload_linear's) live in buffers appended to `storage`.
StackedLinear upload_stacked_linear(Backend& backend, std::span<const LinearTensors> modules,
                                    std::span<const int64_t> out_features, int64_t in_features,
                                    std::vector<std::unique_ptr<Buffer>>& storage);

// The linears of `stacked` as projections into their columns of out [T, stacked.out_features].
std::vector<LinearProjection> projections(const Tensor& out, const StackedLinear& stacked);

// out [T, stacked.out_features] = x W^T for every module.
void stacked_linear(Backend& backend, const Tensor& out, const Tensor& x, const StackedLinear& stacked);

// The gated MLP, out = down(silu(gate) * up), through the scratch gate_up [T, 2I] and act [T, I]: the gate|up
// projection, then Backend::silu_gated_linear.
void gated_mlp(Backend& backend, const Tensor& out, const Tensor& gate_up, const Tensor& act, const Tensor& x,
               const StackedLinear& gate_up_weight, const LinearWeight& down);

}  // namespace qspec
