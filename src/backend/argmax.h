// The argmax rule of Backend::argmax, on one host row: the index of the largest value, the lowest index on
// ties, and the first NaN when the row holds one (NaN counts as larger than every number, as in
// torch.argmax). The CPU backend and the sampler's greedy choice use it; the CUDA kernel implements the same
// total order.
#pragma once

#include <cstdint>
#include <span>

namespace qspec {

// Throws Error on an empty row.
int32_t argmax(std::span<const float> values);

}  // namespace qspec
