// The steps between the q|k|v projection and attention in one kernel (Backend::attention_prologue): one warp
// per (token, head slot), up to 8 slots to a block (no block barrier: a slot's sum of squares is a warp sum,
// its rotation reads the partner values from the warp's slice of shared memory). Query slots split the query
// from its gate, normalise it per head and rotate it; key slots normalise, rotate and store into the cache
// row of the token's position; value slots store. The arithmetic is that of the rmsnorm and rope kernels
// (norm.cu, rope.cu); the kernel replaces 7 launches per attention layer. A position outside the cache skips
// the stores, as kv_store does. A block per slot (128 threads, two block barriers) took 102 us per layer for
// 2,048 tokens on the H200, 47% of its bytes' time (session 9's ncu). Without a gate (the DFlash drafter's
// layers) the queries are contiguous and may be normalised in place: a warp loads its head whole before it
// writes any of it.
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"
#include "backend/ops.h"

namespace qspec::cuda {

namespace {

constexpr int kMaxWarps = 8;  // head slots per block (prefill)

struct PrologueArgs {
  float* query;
  int64_t query_stride;
  float* gate;  // null: qkv has no gate columns
  int64_t gate_stride;
  const float* qkv;
  int64_t qkv_stride;
  float* k_cache;
  int64_t k_stride;
  float* v_cache;
  int64_t v_stride;
  int64_t cache_rows;
  const int32_t* positions;
  int64_t positions_stride;
  int num_heads, num_kv_heads, head_dim, half_rotary;
  float eps, weight_offset;
  const void *q_norm, *k_norm;  // of the kernel's weight type W
};

// The layers of one launch (attention_prologues): blockIdx.z picks one. Keeps the parameters (with the RoPE
// frequencies) under 4 KiB.
struct PrologueBatch {
  PrologueArgs layers[kMaxPrologueLayers];
};

constexpr int kPerLane = kMaxAttentionHeadDim / kWarpSize;  // a head's values per lane, at most

// Values lane, lane + 32, ... of a head of hd values, all loads issued together (a step of decode waits on
// them): one round trip instead of one per value.
__device__ inline void load_head(float (&v)[kPerLane], const float* src, int hd, int lane) {
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + kWarpSize * j;
    v[j] = i < hd ? src[i] : 0.0f;
  }
}

// head (this warp's slice of shared memory) = rmsnorm(src) * (offset + weight), then dst = rope(head).
template <typename W>
__device__ void norm_and_rotate(float* dst, const float* src, const W* weight, float* head, int lane,
                                const PrologueArgs& a, float position, const RopeFrequencies& frequencies) {
  const int hd = a.head_dim;
  float v[kPerLane];
  load_head(v, src, hd, lane);
  float sum_of_squares = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) sum_of_squares += v[j] * v[j];
  sum_of_squares = warp_sum(sum_of_squares);
  const float inverse_rms = 1.0f / sqrtf(sum_of_squares / static_cast<float>(hd) + a.eps);
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + kWarpSize * j;
    if (i < hd) head[i] = v[j] * inverse_rms * (a.weight_offset + to_float(weight[i]));
  }
  __syncwarp();
  const int half = a.half_rotary;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int i = lane + kWarpSize * j;
    if (i >= hd) continue;
    if (i < 2 * half) {
      const int pair = i < half ? i : i - half;
      const float angle = position * frequencies.inv_freq[pair];
      const float cos_angle = cosf(angle), sin_angle = sinf(angle);
      const float x1 = head[pair], x2 = head[pair + half];
      dst[i] = i < half ? x1 * cos_angle - x2 * sin_angle : x2 * cos_angle + x1 * sin_angle;
    } else {
      dst[i] = head[i];
    }
  }
}

// dst = src, a head of hd values.
__device__ inline void copy_head(float* dst, const float* src, int hd, int lane) {
  float v[kPerLane];
  load_head(v, src, hd, lane);
#pragma unroll
  for (int j = 0; j < kPerLane; ++j)
    if (lane + kWarpSize * j < hd) dst[lane + kWarpSize * j] = v[j];
}

// Grid (tokens, ceil(slots / warps), layers) of blocks of `warps` warps; warp w of block (t, y, l) takes slot
// warps * y + w of token t in layer l.
template <typename W>
__global__ void __launch_bounds__(kMaxWarps* kWarpSize)
    attention_prologue_kernel(PrologueBatch batch, RopeFrequencies frequencies) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const PrologueArgs& a = batch.layers[blockIdx.z];
  const auto* q_norm = static_cast<const W*>(a.q_norm);
  const auto* k_norm = static_cast<const W*>(a.k_norm);
  __shared__ float heads[kMaxWarps][kMaxAttentionHeadDim];
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize,
            lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t t = blockIdx.x;
  const int slot = static_cast<int>(blockIdx.y * blockDim.x) / kWarpSize + warp;
  const int hd = a.head_dim;
  const int32_t position = a.positions[t * a.positions_stride];
  const bool stored = position >= 0 && position < a.cache_rows;
  const float* row = a.qkv + t * a.qkv_stride;
  // A head's query (and its gate after it) every query_span values; the keys after all of them.
  const int query_span = a.gate != nullptr ? 2 : 1;
  const int64_t q_cols = int64_t(a.num_heads) * hd, kv_cols = int64_t(a.num_kv_heads) * hd;
  const float* const keys = row + query_span * q_cols;
  if (slot < a.num_heads) {
    const float* query = row + int64_t(slot) * query_span * hd;
    if (a.gate != nullptr) copy_head(a.gate + t * a.gate_stride + int64_t(slot) * hd, query + hd, hd, lane);
    norm_and_rotate(a.query + t * a.query_stride + int64_t(slot) * hd, query, q_norm, heads[warp], lane, a,
                    static_cast<float>(position), frequencies);
  } else if (slot < a.num_heads + a.num_kv_heads) {
    const int kv_head = slot - a.num_heads;
    if (!stored) return;  // the whole warp leaves
    norm_and_rotate(a.k_cache + position * a.k_stride + int64_t(kv_head) * hd, keys + int64_t(kv_head) * hd,
                    k_norm, heads[warp], lane, a, static_cast<float>(position), frequencies);
  } else if (slot < a.num_heads + 2 * a.num_kv_heads) {
    const int kv_head = slot - a.num_heads - a.num_kv_heads;
    if (!stored) return;
    const float* v = keys + kv_cols + int64_t(kv_head) * hd;
    float* dst = a.v_cache + position * a.v_stride + int64_t(kv_head) * hd;
    copy_head(dst, v, hd, lane);
  }
}

}  // namespace

cudaError_t launch_attention_prologues(const AttentionPrologueLayer* layers, size_t count,
                                       const Tensor& positions, const PrologueShape& shape,
                                       const RopeFrequencies& frequencies, cudaStream_t stream) {
  if (count == 0 || layers[0].qkv.rows == 0) return cudaSuccess;
  if (count > kMaxPrologueLayers) return cudaErrorInvalidValue;
  PrologueBatch batch{};
  for (size_t i = 0; i < count; ++i) {
    const AttentionPrologueLayer& l = layers[i];
    if (l.k_norm.dtype != layers[0].k_norm.dtype) return cudaErrorInvalidValue;  // one weight type a launch
    batch.layers[i] = {l.query.ptr<float>(),
                       l.query.stride,
                       l.gate.empty() ? nullptr : l.gate.ptr<float>(),
                       l.gate.stride,
                       l.qkv.ptr<const float>(),
                       l.qkv.stride,
                       l.k_cache.ptr<float>(),
                       l.k_cache.stride,
                       l.v_cache.ptr<float>(),
                       l.v_cache.stride,
                       l.k_cache.rows,
                       positions.ptr<const int32_t>(),
                       positions.stride,
                       shape.num_heads,
                       shape.num_kv_heads,
                       shape.head_dim,
                       shape.rotary_dim / 2,
                       shape.eps,
                       shape.unit_offset ? 1.0f : 0.0f,
                       l.q_norm.data,  // empty without query heads
                       l.k_norm.data};
  }
  // Decode and verify rows: a warp a block, the slots spread over as many multiprocessors; prefill: 8 warps
  // a block.
  const int64_t rows = layers[0].qkv.rows;
  const int warps = rows > kLinearMmaMaxRows ? kMaxWarps : 1;
  const int slots = shape.num_heads + 2 * shape.num_kv_heads;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((slots + warps - 1) / warps),
                  static_cast<unsigned>(count));
  return with_weight_type(layers[0].k_norm.dtype, [&](auto type) {
    using W = decltype(type);
    return launch_kernel(attention_prologue_kernel<W>, grid, warps * kWarpSize, 0, stream, batch,
                         frequencies);
  });
}

}  // namespace qspec::cuda
