// out = x W^T on tensor cores for few rows of x (decode, the 16-row verify): W4A16 (K and group_size
// multiples of 32) and BF16 weights. The weights are read once per 16 rows of x.
//
// Arithmetic (unchanged from the register version). mma.sync m16n8k16 (BF16 in, FP32 accumulate, sm_80+):
// A = 16 output features x 16 k, B = 16 k x 8 rows of x. Lane (g = lane / 4, q = lane % 4) holds features g
// and g + 8 and rows g (+ 8). Per 32-k block of a W4A16 row, lane q takes packed word q (k = 8q .. 8q + 7);
// the mma takes nibble pairs (i, i + 4) — one shift + mask + or makes two BF16 values 128 + n, one
// subtraction gives n - 8 exactly — and x in the same pairs. The group scale multiplies each block's FP32
// sum (exact weights). BF16 weights are paired the same way with byte permutes. x stays accurate to ~2^-16:
// hi = bf16(x), lo = bf16(x - hi), every block is multiplied by both.
//
// Order of the sums, fixed whatever the number of rows: K is cut into stages of 512 k; warp w of the block
// takes the 32-k blocks 4w .. 4w + 3 of every stage and accumulates them in k order; the 4 warps' sums are
// added in warp order; when K is split over blocks (a function of N and K only), the last block of a tile
// adds the splits in split order. So a row's result does not depend on the other rows of the call.
//
// Memory pipeline (this version). Each warp owns a ring of `slots` stage slots in shared memory and fills
// them with cp.async (16-byte cp.async.cg for weights, with an L2 evict-first policy; cp.async.ca for x and
// scales): its 4 blocks of weights for the block's 16T features (T = 1..4 feature tiles per warp), the raw
// scale words of those blocks, and the raw FP32 x of its 128 k for the pass's rows. One commit group per
// stage; a block's whole K range (at most kMaxSlots stages: K is split to fit) is requested up front when
// shared memory allows, so the whole matrix is in flight at once for the Qwen3.5-4B shapes. A warp waits for
// its oldest stage (cp.async.wait_group slots - 1), splits that stage's x into hi/lo pairs in place and its
// scales into floats, multiplies, and refills the slot with the stage `slots` ahead. Warps never wait for
// each other until the final cross-warp sum. The 16T features of a block share x (loaded and split once per
// block); T is picked per call to balance the multiprocessors (T = 1 for 1-2 rows, larger for more rows
// where x traffic and splitting would otherwise dominate).
//
// Prediction (H200, 4.16 TB/s, 132 SMs; ptxas: 64 registers at 1 row and 1 tile, <= 199 elsewhere, no
// spills). W4A16 g32 [9216, 2560] (13.3 MB), M = 1: 576 blocks of 4 warps, 5 per SM (38 KB of shared memory
// each), every stage in flight from the start (~87 KB of weights per SM, ~2x what Little's law needs);
// ~45 warp-instructions per warp and 32-k block = ~2.2 us of issue per scheduler, hidden under the 3.2 us
// transfer: ~4.3 us (~75%). M = 16: T = 3, 192 blocks of 2 x 50 KB slots, 2 per SM (35 KB of weights in
// flight per SM), bound by the 2-block SMs' tensor and issue work (8 mma per 32 k and tile): ~5.5-6 us.
// [2560, 9216] g32 (13.3 MB): 3 splits of 6 stages, T = 2, 240 blocks, all in flight, plus one reduction
// round trip: ~4.8 us at M = 1, ~7 us at M = 16 (2 slots, x fills the shared memory). g128 [9728, 2560]
// (12.8 MB): ~4.2 us at M = 1, ~5.5 us at M = 16. Weak spot: 16 rows on N <= 4096 (T = 1-2, x takes most
// of the slot, few weight bytes in flight).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"

namespace qspec::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kTileFeatures = 16;
constexpr int kBlockK = 32;  // one W4A16 group slice, two mma k-steps
constexpr int kBlocksPerWarp = 4;
constexpr int kStageBlocks = kWarps * kBlocksPerWarp;  // 16
constexpr int kStageK = kStageBlocks * kBlockK;        // 512
constexpr int kWarpK = kBlocksPerWarp * kBlockK;       // 128
constexpr int kXRowWords = kWarpK + 4;                 // + 16 bytes: rows g and g + 1 use other banks
constexpr int kMaxSlots = 6;
constexpr int kMaxTiles = 4;
constexpr int kMaxResidentBlocks = 6;          // aimed at per multiprocessor for a single wave
constexpr int kReservedSharedPerBlock = 1024;  // the runtime's own share of every block (sm_80+)

// ---- cp.async ----

__device__ inline uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ inline uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// Weights: read once, keep them out of L1 and first out of L2.
__device__ inline void copy_streamed_16(void* dst, const void* src, uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)),
               "l"(src), "l"(policy)
               : "memory");
}
// x and scales: shared by the blocks of a multiprocessor, so through L1.
__device__ inline void copy_cached_16(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(dst)), "l"(src) : "memory");
}
__device__ inline void copy_cached_4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(shared_address(dst)), "l"(src) : "memory");
}
__device__ inline void commit_stage() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ inline void wait_stages() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// Waits until at most `pending` (< kMaxSlots) of this thread's newest commit groups are in flight.
__device__ inline void wait_oldest_stage(int pending) {
  switch (pending) {
    case 0:
      wait_stages<0>();
      break;
    case 1:
      wait_stages<1>();
      break;
    case 2:
      wait_stages<2>();
      break;
    case 3:
      wait_stages<3>();
      break;
    case 4:
      wait_stages<4>();
      break;
    default:
      wait_stages<5>();
      break;
  }
}

// ---- fragments ----

__device__ inline void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

__device__ inline uint32_t bf16_pair(float low, float high) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
  return *reinterpret_cast<const uint32_t*>(&pair);
}

__device__ inline float bf16_low(uint32_t pair) {
  return __uint_as_float(pair << 16);
}
__device__ inline float bf16_high(uint32_t pair) {
  return __uint_as_float(pair & 0xFFFF0000u);
}

// Nibbles i and i + 4 of a packed word as the BF16 pair (n_i - 8, n_{i+4} - 8), exact.
template <int kPair>
__device__ inline uint32_t nibble_pair(uint32_t word) {
  const uint32_t biased = ((word >> (4 * kPair)) & 0x000F000Fu) | 0x43004300u;  // 128 + n
  const __nv_bfloat162 value =
      __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&biased), __floats2bfloat162_rn(136.0f, 136.0f));
  return *reinterpret_cast<const uint32_t*>(&value);
}

// The A fragments of one 32-k block for features g (low) and g + 8 (high): pair i = k values (i, i + 4) of
// the lane's 8. mma 0 takes pairs 0 and 1, mma 1 pairs 2 and 3.
struct BlockFragments {
  uint32_t low[4], high[4];
};

// One block's fragments times the rows of x (halves of 8): the hi and lo parts of x, both mmas.
template <int kHalves>
__device__ inline void multiply_block(float (&sum)[kHalves][4], const BlockFragments& a,
                                      const uint4 (&x_hi)[kHalves], const uint4 (&x_lo)[kHalves]) {
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    mma_bf16(sum[h], a.low[0], a.high[0], a.low[1], a.high[1], x_hi[h].x, x_hi[h].y);
    mma_bf16(sum[h], a.low[2], a.high[2], a.low[3], a.high[3], x_hi[h].z, x_hi[h].w);
    mma_bf16(sum[h], a.low[0], a.high[0], a.low[1], a.high[1], x_lo[h].x, x_lo[h].y);
    mma_bf16(sum[h], a.low[2], a.high[2], a.low[3], a.high[3], x_lo[h].z, x_lo[h].w);
  }
}

// ---- one warp's stage slot in shared memory ----
//
// [weights: block u (4) x feature f (16T) x granule][raw scale words: feature x words][float scales: block u
// x feature][x: rows x kXRowWords]. A W4A16 granule is a block's 4 packed words: lane (g, q) reads word 4 (u
// 16T + f) + q, 32 lanes on 32 banks. A BF16 granule is 64 bytes, lane q reading its 16. x row r holds the
// warp's 128 k at word 132 r; after the split, 8 values (i, i + 4) become 4 hi pairs then 4 lo pairs.
struct SlotLayout {
  int raw_scales, scales, x, bytes;
};

__host__ __device__ constexpr SlotLayout slot_layout(int features, int granule_bytes, int raw_scale_words,
                                                     int rows) {
  SlotLayout layout{};
  layout.raw_scales = features * kBlocksPerWarp * granule_bytes;
  layout.scales = layout.raw_scales + features * raw_scale_words * 4;
  layout.x = layout.scales + (raw_scale_words > 0 ? features * kBlocksPerWarp * 4 : 0);
  layout.bytes = layout.x + rows * kXRowWords * 4;
  return layout;
}

// W4A16 (compressed-tensors pack-quantized): 4 packed words per 32-k block and feature, the group scales
// S (BF16/F16/F32) of the warp's blocks copied as whole 4-byte words.
template <typename S>
struct PackedInt4Weights {
  static constexpr int kGranuleBytes = kBlockK / 2;
  static constexpr int kScalesPerWord = 4 / static_cast<int>(sizeof(S));
  // The 4 blocks of a warp lie in at most 4 groups (group 32, whose first is a multiple of 4) or 2.
  static constexpr int kRawScaleWords = kBlocksPerWarp / kScalesPerWord;

  const char* packed;
  int64_t row_bytes;
  const S* scales;
  int64_t scales_stride;
  int group_size;

  template <int kFeatures>
  __device__ void issue(char* slot, int64_t first_feature, int64_t out_features, int64_t block0, int valid,
                        int lane, uint64_t policy) const {
    constexpr SlotLayout layout = slot_layout(kFeatures, kGranuleBytes, kRawScaleWords, 0);
#pragma unroll
    for (int n = 0; n < kFeatures * kBlocksPerWarp / kWarpSize; ++n) {
      const int i = n * kWarpSize + lane, f = i / kBlocksPerWarp, u = i % kBlocksPerWarp;
      // Features past the end read the last one; their sums are not written.
      const int64_t feature = min64(first_feature + f, out_features - 1);
      if (u < valid)
        copy_streamed_16(slot + (u * kFeatures + f) * kGranuleBytes,
                         packed + feature * row_bytes + (block0 + u) * kGranuleBytes, policy);
    }
    const int64_t first_word = block0 * kBlockK / group_size / kScalesPerWord;
    const int64_t words = (block0 + valid - 1) * kBlockK / group_size / kScalesPerWord - first_word + 1;
#pragma unroll
    for (int n = 0; n < kFeatures * kRawScaleWords / kWarpSize; ++n) {
      const int i = n * kWarpSize + lane, f = i / kRawScaleWords, j = i % kRawScaleWords;
      const int64_t feature = min64(first_feature + f, out_features - 1);
      if (j < words)
        copy_cached_4(slot + layout.raw_scales + 4 * i,
                      scales + feature * scales_stride + (first_word + j) * kScalesPerWord);
    }
  }

  // The scales of the stage's blocks as floats, [u][f].
  template <int kFeatures>
  __device__ void prepare(char* slot, int64_t block0, int valid, int lane) const {
    constexpr SlotLayout layout = slot_layout(kFeatures, kGranuleBytes, kRawScaleWords, 0);
    const int64_t first_element = block0 * kBlockK / group_size / kScalesPerWord * kScalesPerWord;
    const S* raw = reinterpret_cast<const S*>(slot + layout.raw_scales);
    float* scale = reinterpret_cast<float*>(slot + layout.scales);
#pragma unroll
    for (int n = 0; n < kFeatures * kBlocksPerWarp / kWarpSize; ++n) {
      const int i = n * kWarpSize + lane, u = i / kFeatures, f = i % kFeatures;
      if (u < valid) {
        const int64_t group = (block0 + u) * kBlockK / group_size;
        scale[i] =
            to_float(raw[f * kRawScaleWords * kScalesPerWord + static_cast<int>(group - first_element)]);
      }
    }
  }

  template <int kFeatures, int kHalves>
  __device__ void accumulate(float (&acc)[kHalves][4], const char* slot, int u, int feature_low, int q,
                             const uint4 (&x_hi)[kHalves], const uint4 (&x_lo)[kHalves]) const {
    constexpr SlotLayout layout = slot_layout(kFeatures, kGranuleBytes, kRawScaleWords, 0);
    const uint32_t* words = reinterpret_cast<const uint32_t*>(slot);
    const uint32_t low = words[(u * kFeatures + feature_low) * 4 + q];
    const uint32_t high = words[(u * kFeatures + feature_low + 8) * 4 + q];
    const float* scale = reinterpret_cast<const float*>(slot + layout.scales) + u * kFeatures + feature_low;
    const float scale_low = scale[0], scale_high = scale[8];
    const BlockFragments a{
        {nibble_pair<0>(low), nibble_pair<1>(low), nibble_pair<2>(low), nibble_pair<3>(low)},
        {nibble_pair<0>(high), nibble_pair<1>(high), nibble_pair<2>(high), nibble_pair<3>(high)}};
    float sum[kHalves][4] = {};
    multiply_block<kHalves>(sum, a, x_hi, x_lo);
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      acc[h][0] = fmaf(scale_low, sum[h][0], acc[h][0]);
      acc[h][1] = fmaf(scale_low, sum[h][1], acc[h][1]);
      acc[h][2] = fmaf(scale_high, sum[h][2], acc[h][2]);
      acc[h][3] = fmaf(scale_high, sum[h][3], acc[h][3]);
    }
  }
};

// BF16 weights: 64 bytes per 32-k block and feature, lane q reading values 8q .. 8q + 7.
struct Bf16Weights {
  static constexpr int kGranuleBytes = kBlockK * 2;
  static constexpr int kRawScaleWords = 0;
  static constexpr int kCopies = kGranuleBytes / 16;

  const char* weight;
  int64_t row_bytes;

  template <int kFeatures>
  __device__ void issue(char* slot, int64_t first_feature, int64_t out_features, int64_t block0, int valid,
                        int lane, uint64_t policy) const {
#pragma unroll
    for (int n = 0; n < kFeatures * kBlocksPerWarp * kCopies / kWarpSize; ++n) {
      const int i = n * kWarpSize + lane, c = i % kCopies, u = i / kCopies % kBlocksPerWarp,
                f = i / (kCopies * kBlocksPerWarp);
      const int64_t feature = min64(first_feature + f, out_features - 1);
      if (u < valid)
        copy_streamed_16(slot + (u * kFeatures + f) * kGranuleBytes + 16 * c,
                         weight + feature * row_bytes + (block0 + u) * kGranuleBytes + 16 * c, policy);
    }
  }

  template <int kFeatures>
  __device__ void prepare(char*, int64_t, int, int) const {}

  // (v0 v1)(v2 v3)(v4 v5)(v6 v7) -> pairs (v0 v4)(v1 v5)(v2 v6)(v3 v7)
  __device__ static void pairs(const uint4& v, uint32_t (&out)[4]) {
    out[0] = __byte_perm(v.x, v.z, 0x5410);
    out[1] = __byte_perm(v.x, v.z, 0x7632);
    out[2] = __byte_perm(v.y, v.w, 0x5410);
    out[3] = __byte_perm(v.y, v.w, 0x7632);
  }

  template <int kFeatures, int kHalves>
  __device__ void accumulate(float (&acc)[kHalves][4], const char* slot, int u, int feature_low, int q,
                             const uint4 (&x_hi)[kHalves], const uint4 (&x_lo)[kHalves]) const {
    const uint4* vectors = reinterpret_cast<const uint4*>(slot);
    BlockFragments a;
    pairs(vectors[(u * kFeatures + feature_low) * kCopies + q], a.low);
    pairs(vectors[(u * kFeatures + feature_low + 8) * kCopies + q], a.high);
    multiply_block<kHalves>(acc, a, x_hi, x_lo);
  }
};

struct MmaArgs {
  float* out;
  int64_t out_stride;
  const float* x;
  int64_t x_stride;
  int64_t rows, out_features, in_features;
  int stages_per_split;
  int slots;      // stage slots per warp
  int slot_rows;  // rows of x a slot holds: min(rows, rows per pass)
  bool aligned_x;
  float* partials;     // [splits][rows][out_features] when split
  unsigned* counters;  // one per (feature group, pass of rows), zero between calls
};

// The raw x of the warp's valid blocks for the pass's rows.
__device__ inline void issue_x(uint32_t* x_slot, const MmaArgs& a, int64_t first_row, int rows_here,
                               int64_t block0, int valid, int lane) {
  if (lane >= valid * (kBlockK / 4)) return;  // one 16-byte granule of a row per lane
  for (int r = 0; r < rows_here; ++r) {
    const float* src = a.x + (first_row + r) * a.x_stride + block0 * kBlockK + 4 * lane;
    uint32_t* dst = x_slot + r * kXRowWords + 4 * lane;
    if (a.aligned_x) {
      copy_cached_16(dst, src);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) copy_cached_4(dst + j, src + j);
    }
  }
}

// In place: 8 values (32 bytes) -> 4 hi pairs (i, i + 4) then 4 lo pairs.
__device__ inline void split_x(uint32_t* x_slot, int rows_here, int valid, int lane) {
  constexpr int kChunksPerRow = kWarpK / 8;
  for (int i = lane; i < rows_here * kChunksPerRow; i += kWarpSize) {
    const int r = i / kChunksPerRow, c = i % kChunksPerRow;
    if (c >= valid * (kBlockK / 8)) continue;
    uint4* chunk = reinterpret_cast<uint4*>(x_slot + r * kXRowWords + 8 * c);
    const uint4 v0 = chunk[0], v1 = chunk[1];
    const float v[8] = {__uint_as_float(v0.x), __uint_as_float(v0.y), __uint_as_float(v0.z),
                        __uint_as_float(v0.w), __uint_as_float(v1.x), __uint_as_float(v1.y),
                        __uint_as_float(v1.z), __uint_as_float(v1.w)};
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      hi[p] = bf16_pair(v[p], v[p + 4]);
      lo[p] = bf16_pair(v[p] - bf16_low(hi[p]), v[p + 4] - bf16_high(hi[p]));
    }
    chunk[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    chunk[1] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  }
}

__host__ __device__ constexpr int min_resident_blocks(int halves, int tiles) {
  return halves * tiles == 1 ? 5 : halves * tiles <= 2 ? 3 : 2;
}

template <typename Weights, int kHalves, int kTiles>
__global__ void __launch_bounds__(kThreads, min_resident_blocks(kHalves, kTiles))
    linear_mma_kernel(MmaArgs a, Weights weights) {
  extern __shared__ uint4 shared_storage[];
  __shared__ bool last_block;
  constexpr int kFeatures = kTiles * kTileFeatures;
  const SlotLayout layout =
      slot_layout(kFeatures, Weights::kGranuleBytes, Weights::kRawScaleWords, a.slot_rows);
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int g = lane / 4, q = lane % 4;
  char* warp_slots = reinterpret_cast<char*>(shared_storage) + warp * a.slots * layout.bytes;
  const int64_t first_feature = static_cast<int64_t>(blockIdx.x) * kFeatures;
  const int64_t first_row = static_cast<int64_t>(blockIdx.y) * kHalves * 8;
  const int rows_here = static_cast<int>(min64(a.rows - first_row, kHalves * 8));
  const int64_t blocks = a.in_features / kBlockK;
  const int64_t first_stage = static_cast<int64_t>(blockIdx.z) * a.stages_per_split;
  const int stages =
      static_cast<int>(min64(a.stages_per_split, (blocks + kStageBlocks - 1) / kStageBlocks - first_stage));
  const int64_t end_block = min64(blocks, (first_stage + stages) * kStageBlocks);
  const uint64_t policy = evict_first_policy();

  auto stage_block0 = [&](int s) { return (first_stage + s) * kStageBlocks + warp * kBlocksPerWarp; };
  auto stage_valid = [&](int s) {
    return static_cast<int>(min64(kBlocksPerWarp, end_block - stage_block0(s)));  // <= 0: none
  };
  auto issue = [&](int s) {
    const int valid = stage_valid(s);
    if (valid <= 0) return;
    char* slot = warp_slots + (s % a.slots) * layout.bytes;
    weights.template issue<kFeatures>(slot, first_feature, a.out_features, stage_block0(s), valid, lane,
                                      policy);
    issue_x(reinterpret_cast<uint32_t*>(slot + layout.x), a, first_row, rows_here, stage_block0(s), valid,
            lane);
  };

  float acc[kTiles][kHalves][4] = {};
  for (int s = 0; s < a.slots; ++s) {
    if (s < stages) issue(s);
    commit_stage();
  }
  for (int s = 0; s < stages; ++s) {
    wait_oldest_stage(a.slots - 1);
    __syncwarp();  // the lanes' copies are visible to the whole warp
    const int valid = stage_valid(s);
    char* slot = warp_slots + (s % a.slots) * layout.bytes;
    if (valid > 0) {
      uint32_t* x_slot = reinterpret_cast<uint32_t*>(slot + layout.x);
      split_x(x_slot, rows_here, valid, lane);
      weights.template prepare<kFeatures>(slot, stage_block0(s), valid, lane);
      __syncwarp();
#pragma unroll
      for (int u = 0; u < kBlocksPerWarp; ++u) {
        if (u < valid) {
          uint4 x_hi[kHalves], x_lo[kHalves];
#pragma unroll
          for (int h = 0; h < kHalves; ++h) {
            const int r = h * 8 + g;
            if (r < rows_here) {
              const uint4* chunk =
                  reinterpret_cast<const uint4*>(x_slot + r * kXRowWords + u * kBlockK + 8 * q);
              x_hi[h] = chunk[0];
              x_lo[h] = chunk[1];
            } else {
              x_hi[h] = x_lo[h] = make_uint4(0, 0, 0, 0);
            }
          }
#pragma unroll
          for (int t = 0; t < kTiles; ++t)
            weights.template accumulate<kFeatures, kHalves>(acc[t], slot, u, t * kTileFeatures + g, q, x_hi,
                                                            x_lo);
        }
      }
    }
    __syncwarp();  // every lane is done with the slot
    if (s + a.slots < stages) issue(s + a.slots);
    commit_stage();
  }

  // Sum the warps' partial tiles in a fixed order (the slots are free now). acc[t][h][i]: feature
  // 16t + g + 8 (i / 2), row 8h + 2q + i % 2.
  wait_stages<0>();
  __syncthreads();
  float* reduce = reinterpret_cast<float*>(shared_storage);  // [warp][t][h][i][lane]
  constexpr int kWarpValues = kTiles * kHalves * 4 * kWarpSize;
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int h = 0; h < kHalves; ++h)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        reduce[warp * kWarpValues + ((t * kHalves + h) * 4 + i) * kWarpSize + lane] = acc[t][h][i];
  __syncthreads();
  const bool split = gridDim.z > 1;
  float* target = split ? a.partials + static_cast<int64_t>(blockIdx.z) * a.rows * a.out_features : a.out;
  const int64_t target_stride = split ? a.out_features : a.out_stride;
  for (int e = static_cast<int>(threadIdx.x); e < kWarpValues; e += kThreads) {
    const int l = e % kWarpSize, i = e / kWarpSize % 4, h = e / (4 * kWarpSize) % kHalves;
    const int t = e / (4 * kWarpSize * kHalves);
    const int64_t feature = first_feature + t * kTileFeatures + l / 4 + 8 * (i / 2);
    const int r = 8 * h + 2 * (l % 4) + i % 2;
    if (feature < a.out_features && r < rows_here) {
      float total = 0.0f;
      for (int w = 0; w < kWarps; ++w) total += reduce[w * kWarpValues + e];
      target[(first_row + r) * target_stride + feature] = total;
    }
  }
  if (!split) return;

  // Split K: the last block of this tile to finish adds the splits' partials in split order.
  __threadfence();  // this block's partials are visible to the block that sums them
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned* counter = a.counters + blockIdx.y * gridDim.x + blockIdx.x;
    last_block = atomicAdd(counter, 1u) == gridDim.z - 1;
    if (last_block) *counter = 0;  // ready for the next call (and the next replay of a step graph)
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  for (int e = static_cast<int>(threadIdx.x); e < kFeatures * rows_here; e += kThreads) {
    const int64_t feature = first_feature + e % kFeatures;
    const int64_t row = first_row + e / kFeatures;
    if (feature < a.out_features) {
      float total = 0.0f;
      for (unsigned s = 0; s < gridDim.z; ++s)
        total += __ldcg(a.partials + (static_cast<int64_t>(s) * a.rows + row) * a.out_features + feature);
      a.out[row * a.out_stride + feature] = total;
    }
  }
}

// ---- planning (host) ----

struct DeviceLimits {
  int multiprocessors = 1;
  int shared_per_multiprocessor = 0;
  int shared_per_block = 0;
};

DeviceLimits device_limits() {
  DeviceLimits limits;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return limits;
  cudaDeviceGetAttribute(&limits.multiprocessors, cudaDevAttrMultiProcessorCount, device);
  cudaDeviceGetAttribute(&limits.shared_per_multiprocessor, cudaDevAttrMaxSharedMemoryPerMultiprocessor,
                         device);
  cudaDeviceGetAttribute(&limits.shared_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  limits.multiprocessors = std::max(limits.multiprocessors, 1);
  return limits;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// How K is cut, from N and K only (never from the rows, so that a row's sums keep their order): stages of
// 512 k, split over blocks until a block's range fits the slots and the 16-feature tiles fill the GPU.
struct KSplit {
  int64_t stages, splits, stages_per_split;
};

KSplit k_split(int64_t out_features, int64_t in_features, int multiprocessors) {
  KSplit k{};
  k.stages = ceil_div(in_features, kStageK);
  const int64_t tiles = ceil_div(out_features, kTileFeatures);
  int64_t splits = 1;
  k.stages_per_split = k.stages;
  while (k.stages_per_split > 1 && (k.stages_per_split > kMaxSlots || tiles * splits < multiprocessors))
    k.stages_per_split = ceil_div(k.stages, ++splits);
  k.splits = ceil_div(k.stages, k.stages_per_split);
  return k;
}

struct MmaPlan {
  KSplit k;
  int halves = 1, tiles = 1, slots = 1, slot_rows = 1;
  int64_t feature_groups = 0, row_passes = 0;
  size_t shared_bytes = 0;
};

// Rows per pass, feature tiles per warp (balancing the busiest multiprocessor's work: its blocks times
// (T tiles + the x work, ~rows / 16 of a tile)) and slots (as many stages as fit the shared memory of the
// blocks each multiprocessor must hold for one wave).
MmaPlan mma_plan(int64_t rows, int64_t out_features, int64_t in_features, int granule_bytes,
                 int raw_scale_words, int max_tiles) {
  const DeviceLimits device = device_limits();
  MmaPlan plan;
  plan.k = k_split(out_features, in_features, device.multiprocessors);
  plan.halves = rows <= 8 ? 1 : 2;
  plan.row_passes = ceil_div(rows, 8 * plan.halves);
  plan.slot_rows = static_cast<int>(std::min<int64_t>(rows, 8 * plan.halves));
  const int64_t tiles16 = ceil_div(out_features, kTileFeatures);
  int64_t best_load = -1;
  for (int tiles = 1; tiles <= max_tiles; ++tiles) {
    const int64_t blocks = ceil_div(tiles16, tiles) * plan.row_passes * plan.k.splits;
    if (tiles > 1 && blocks < device.multiprocessors) break;  // never fewer blocks than multiprocessors
    const int64_t load = ceil_div(blocks, device.multiprocessors) * (kTileFeatures * tiles + plan.slot_rows);
    if (best_load < 0 || load < best_load) {
      best_load = load;
      plan.tiles = tiles;
    }
  }
  plan.feature_groups = ceil_div(out_features, kTileFeatures * plan.tiles);
  const int64_t blocks = plan.feature_groups * plan.row_passes * plan.k.splits;
  // One wave where up to 6 blocks per multiprocessor make it; beyond that, 3 blocks of deeper rings.
  const int64_t waves = ceil_div(blocks, device.multiprocessors);
  const int64_t per_multiprocessor = waves > kMaxResidentBlocks ? 3 : std::max<int64_t>(waves, 1);
  const int64_t budget =
      std::min<int64_t>(device.shared_per_block,
                        device.shared_per_multiprocessor / per_multiprocessor - kReservedSharedPerBlock);
  const int64_t stage_bytes =
      kWarps * slot_layout(kTileFeatures * plan.tiles, granule_bytes, raw_scale_words, plan.slot_rows).bytes;
  plan.slots = static_cast<int>(
      std::clamp<int64_t>(budget / stage_bytes, 1, std::min<int64_t>(plan.k.stages_per_split, kMaxSlots)));
  const size_t reduce_bytes = sizeof(float) * kWarps * plan.tiles * plan.halves * 4 * kWarpSize;
  plan.shared_bytes = std::max(static_cast<size_t>(plan.slots * stage_bytes), reduce_bytes);
  return plan;
}

template <typename Weights>
MmaPlan mma_plan(int64_t rows, int64_t out_features, int64_t in_features) {
  return mma_plan(rows, out_features, in_features, Weights::kGranuleBytes, Weights::kRawScaleWords,
                  Weights::kRawScaleWords > 0 ? kMaxTiles
                  : rows <= 8                 ? 1
                                              : 2);
}

template <typename Weights, int kHalves, int kTiles>
cudaError_t launch_kernel(const MmaPlan& plan, const MmaArgs& args, const Weights& weights,
                          cudaStream_t stream) {
  const auto kernel = linear_mma_kernel<Weights, kHalves, kTiles>;
  // Raised once per kernel to the largest size asked for so far.
  static std::atomic<size_t> allowed_shared{48 * 1024};
  if (plan.shared_bytes > allowed_shared.load()) {
    const cudaError_t status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    static_cast<int>(plan.shared_bytes));
    if (status != cudaSuccess) return status;
    allowed_shared.store(plan.shared_bytes);
  }
  const dim3 grid(static_cast<unsigned>(plan.feature_groups), static_cast<unsigned>(plan.row_passes),
                  static_cast<unsigned>(plan.k.splits));
  kernel<<<grid, kThreads, plan.shared_bytes, stream>>>(args, weights);
  return cudaGetLastError();
}

template <typename Weights, int kHalves>
cudaError_t launch_tiles(const MmaPlan& plan, const MmaArgs& args, const Weights& weights,
                         cudaStream_t stream) {
  if constexpr (Weights::kRawScaleWords > 0) {  // W4A16: 1..4 tiles
    if (plan.tiles == 3) return launch_kernel<Weights, kHalves, 3>(plan, args, weights, stream);
    if (plan.tiles == 4) return launch_kernel<Weights, kHalves, 4>(plan, args, weights, stream);
  }
  if (plan.tiles == 2) return launch_kernel<Weights, kHalves, 2>(plan, args, weights, stream);
  return launch_kernel<Weights, kHalves, 1>(plan, args, weights, stream);
}

template <typename Weights>
cudaError_t launch_mma(const Tensor& out, const Tensor& x, int64_t out_features, int64_t in_features,
                       const Weights& weights, const LinearMmaWorkspace& workspace, cudaStream_t stream) {
  const MmaPlan plan = mma_plan<Weights>(x.rows, out_features, in_features);
  const MmaArgs args{out.ptr<float>(),
                     out.stride,
                     x.ptr<const float>(),
                     x.stride,
                     x.rows,
                     out_features,
                     in_features,
                     static_cast<int>(plan.k.stages_per_split),
                     plan.slots,
                     plan.slot_rows,
                     reinterpret_cast<uintptr_t>(x.data) % 16 == 0 && (x.rows <= 1 || x.stride % 4 == 0),
                     workspace.partials,
                     workspace.counters};
  if (plan.halves == 1) return launch_tiles<Weights, 1>(plan, args, weights, stream);
  return launch_tiles<Weights, 2>(plan, args, weights, stream);
}

bool aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

}  // namespace

LinearMmaWorkspaceSize linear_mma_workspace_size(int64_t rows, int64_t out_features, int64_t in_features) {
  const KSplit k = k_split(out_features, in_features, device_limits().multiprocessors);
  if (k.splits == 1) return {};
  // Counters for the finest feature grouping (one tile per warp), whatever the plan picks.
  return {static_cast<size_t>(k.splits * rows * out_features),
          static_cast<size_t>(ceil_div(out_features, kTileFeatures) * ceil_div(rows, 8))};
}

bool linear_mma_supports(const Tensor& x, const LinearWeight& w) {
  if (x.rows == 0 || x.rows > kLinearMmaMaxRows) return false;
  if (w.quantized()) {
    // 16-byte copies of packed words; the scales copied as 4-byte words, whole words inside each row.
    const int64_t k = w.packed.cols * 8;
    const int64_t scale_bytes = static_cast<int64_t>(dtype_size(w.scales.dtype));
    return k % kBlockK == 0 && w.group_size % kBlockK == 0 && aligned(w.packed.data, 16) &&
           (w.packed.rows <= 1 || w.packed.stride % 4 == 0) && aligned(w.scales.data, 4) &&
           (w.scales.cols * scale_bytes) % 4 == 0 &&
           (w.scales.rows <= 1 || (w.scales.stride * scale_bytes) % 4 == 0);
  }
  const int64_t k = w.weight.cols;
  return w.weight.dtype == DType::BF16 && k % kBlockK == 0 && aligned(w.weight.data, 16) &&
         (w.weight.rows <= 1 || w.weight.stride % 8 == 0);
}

cudaError_t launch_linear_mma(const Tensor& out, const Tensor& x, const LinearWeight& w,
                              const LinearMmaWorkspace& workspace, cudaStream_t stream) {
  if (w.quantized()) {
    return with_weight_type(w.scales.dtype, [&](auto type) {
      using S = decltype(type);
      const PackedInt4Weights<S> weights{reinterpret_cast<const char*>(w.packed.data), w.packed.stride * 4,
                                         w.scales.ptr<const S>(), w.scales.stride, w.group_size};
      return launch_mma(out, x, w.out_features, w.in_features, weights, workspace, stream);
    });
  }
  const Bf16Weights weights{reinterpret_cast<const char*>(w.weight.data), w.weight.stride * 2};
  return launch_mma(out, x, w.out_features, w.in_features, weights, workspace, stream);
}

}  // namespace qspec::cuda
