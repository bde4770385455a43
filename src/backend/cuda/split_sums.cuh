// The one order in which a linear's split-K partials are added (sum_in_split_order): split by split from
// zero. The linears' sums kernel, the one-row kernel's cluster sums and the ops that read a linear's output
// straight from its partials (UnsummedSplits, launchers.h) all add them so, which makes a row's result
// independent of the call and of which of them added it.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/launchers.h"

namespace qspec::cuda {

// Splits whose loads are issued together: each round is one round trip (to L2 for the sums kernel, to shared
// memory for the one-row kernel's cluster sums) on the call's tail.
inline constexpr int kSplitsInFlight = 8;

// A sum of split partials in split order from zero: split s's partial is load(s).
template <typename Load>
__device__ inline float sum_in_split_order(int splits, Load load) {
  float sum = 0.0f;
  for (int first = 0; first < splits; first += kSplitsInFlight) {
    float part[kSplitsInFlight];
#pragma unroll
    for (int j = 0; j < kSplitsInFlight; ++j) part[j] = first + j < splits ? load(first + j) : 0.0f;
#pragma unroll
    for (int j = 0; j < kSplitsInFlight; ++j)
      if (first + j < splits) sum += part[j];
  }
  return sum;
}

// Four consecutive values of an unsummed tensor (row `row`, columns column .. column + 3, 16-byte aligned
// partials): each one sum_in_split_order's sum, element by element.
__device__ inline float4 sum4_in_split_order(const UnsummedSplits& u, int64_t row, int64_t column) {
  const float* first_partial = u.partials + row * u.row_stride + column;
  float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int first = 0; first < u.splits; first += kSplitsInFlight) {
    float4 part[kSplitsInFlight];
#pragma unroll
    for (int j = 0; j < kSplitsInFlight; ++j)
      if (first + j < u.splits)
        part[j] = __ldcg(reinterpret_cast<const float4*>(first_partial + (first + j) * u.split_stride));
#pragma unroll
    for (int j = 0; j < kSplitsInFlight; ++j)
      if (first + j < u.splits) {
        sum.x += part[j].x;
        sum.y += part[j].y;
        sum.z += part[j].z;
        sum.w += part[j].w;
      }
  }
  return sum;
}

}  // namespace qspec::cuda
