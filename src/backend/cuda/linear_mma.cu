// out = x W^T on tensor cores for few rows of x (decode, the 16-row verify, short prefill chunks): W4A16 (K
// and group_size multiples of 32) and BF16 weights. The weights are read once per call, so a step of 16 rows
// costs about what a step of one does.
//
// mma.sync m16n8k16 (FP16 or BF16 in, FP32 accumulate, sm_80+): A = 16 output features x 16 k, B = 16 k x 8
// rows of x. A warp owns 16 features (a tile); lane (g = lane / 4, q = lane % 4) holds features g and g + 8.
// K is walked in chunks of 128 (four 32-k blocks, one W4A16 g32 group each). Per block lane q needs packed
// word q (k = 8q .. 8q + 7): the order of k inside one mma is free as long as A and B agree, so the mma takes
// nibble pairs (i, i + 4) — a mask and an or make two FP16 values 1024 + n (or 1024 + 16n), one subtraction
// (or fma) gives n - 8 exactly — and x in the same pairs. Both mmas of a block lie in one quantization group:
// the group scale multiplies the block's FP32 sum (exact weights, no rounding of n * scale).
//
// Loads: the four lanes of a quad read a feature's 64 bytes of a chunk with one 16-byte load each; the
// backend keeps the packed words in an order (packed_int4_order.h) where those 16 bytes are word q of every
// block of the chunk, lane q's A words. BF16 weights are loaded 16 bytes per lane and block and paired with
// byte permutes.
//
// The form of x (XForm) follows the weights. W4A16: x * 2^e in FP16, e per row and 128-k chunk putting the
// chunk's largest |x| in [2^14, 2^15): 11 significant bits for every value within 2^28 of its chunk's largest
// (the FP16 engines' precision, 8x BF16's), for chunk maxima from 2^-112 to FLT_MAX; one mma chain per block;
// the chunk's group-scaled sums are multiplied by 2^-e (exact) into the split's sums. BF16 weights need BF16
// x: each value is split into hi = bf16(x) and lo = bf16(x - hi) (~2^-9 of x; ~2^-17 left out), both
// multiplied in one chain. In the register-held many-row kernel a block of 4 warps owns 4 tiles (one per
// warp) and stages x for all of them in shared memory, already converted and paired, a stage of chunks at a
// time; the next stage's weights are loaded into registers while this one is computed. No instruction may
// read a loaded register before its chunk is computed (a copy or a repacking there waits for the load, and
// the loads in flight go from several to one). When the tiles alone leave the GPU short of warps (2560 output
// features at K 9216), K is split over blocks in a way that depends on N and K only, and the splits' partials
// are added in split order by a kernel of their own (sum_split_partials_kernel; the one-row kernel on sm_90+
// adds them inside a thread block cluster in the same order), so results depend neither on timing nor on how
// many rows share the call (a row's arithmetic is the same at M = 1 and 16).
#include <cooperative_groups.h>
#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/packed_int4_order.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/split_sums.cuh"

namespace qspec::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kTileFeatures = 16;
constexpr int kTileRows = 16;  // rows of x per pass (two n8 halves)
constexpr int kBlockK = 32;    // k per block: one W4A16 group slice
constexpr int kChunkBlocks = 4;
constexpr int kChunkK = kChunkBlocks * kBlockK;  // 128: a warp's step along K
constexpr int kChunkGroups = kChunkK / 8;        // 8-value groups of x per chunk
constexpr int64_t kTargetItems = 8 * 132;  // split K until there are about 8 one-tile-per-warp items per SM
// The many-row kernel: a block's features (a tile per warp), its resident blocks per SM (launch bounds) and
// the chunks of x it stages at a time. Two tiles per warp sharing the x fragments left 3 blocks per SM at 16
// rows: verify 4.57 -> 4.36 ms and draft 1.15 -> 1.12 with these; stages of 2 chunks lost (verify 4.36 ->
// 4.96-5.09 ms; A/Bs of session 8, bench/results/cuda-ops-notes.md).
constexpr int kGroupFeatures = kWarps * kTileFeatures;
constexpr int kMmaBlocksPerMultiprocessor = 4;
constexpr int kStageChunks = 1;
// Blocks per wave in mma_split's rule (it sets the split of K, so the sums, at every row count): 3 per SM.
// 4, the resident count, lost: verify 4.36 -> 4.51 ms, decode 2.10 -> 2.17 in the same A/B.
constexpr int64_t kSplitWaveBlocks = 3 * 132;

// How x enters the mma (the file's comment): FP16 with a power-of-two scale per row and chunk (W4A16), or
// BF16 hi and lo parts (BF16 weights).
enum class XForm { Fp16Scaled, Bf16HiLo };

template <XForm kForm>
constexpr int kXParts = kForm == XForm::Bf16HiLo ? 2 : 1;  // uint4 words of B per lane and block
template <XForm kForm>
constexpr int kXWords = 4 * kXParts<kForm>;  // staged 32-bit words per 8 values of x

template <XForm kForm>
__device__ inline void mma(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                           uint32_t b1) {
  if constexpr (kForm == XForm::Fp16Scaled)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  else
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Streamed once per call: no L1 allocation; L2 keeps them for the other row passes of the same call.
__device__ inline uint4 load_streaming(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Asks L2 for the 128-byte line at p (no register waits for it).
__device__ inline void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" : : "l"(p));
}

// The 128-byte lines holding bytes [begin, end) into L2, lane q of a quad taking lines q, q + 4, ... from the
// line of the first byte (a range that starts inside a line still gets its last line).
__device__ inline void prefetch_lines(const void* begin, const void* end, int q) {
  constexpr uintptr_t kLine = 128;
  const auto last = reinterpret_cast<uintptr_t>(end);
  for (uintptr_t line = (reinterpret_cast<uintptr_t>(begin) & ~(kLine - 1)) + kLine * q; line < last;
       line += 4 * kLine)
    prefetch_l2(reinterpret_cast<const void*>(line));
}

__device__ inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

__device__ inline float bf16_low(uint32_t pair) {
  return __uint_as_float(pair << 16);
}
__device__ inline float bf16_high(uint32_t pair) {
  return __uint_as_float(pair & 0xFFFF0000u);
}

__device__ inline uint32_t half2_bits(__half2 v) {
  return *reinterpret_cast<const uint32_t*>(&v);
}

// A packed word's nibbles as the FP16 pairs (n_i - 8, n_{i+4} - 8), i = 0..3, exact: masked into the
// mantissa of 1024, the even pairs read 1024 + n (one subtraction leaves n - 8) and the odd ones, masked in
// place, 1024 + 16n (one fma by 1/16 leaves n - 8), so one shift serves the four pairs (9 instructions).
__device__ inline void nibble_pairs(uint32_t word, uint32_t (&pair)[4]) {
  constexpr uint32_t kLow = 0x000F000Fu, kHigh = 0x00F000F0u, kOne024 = 0x64006400u;
  const uint32_t upper = word >> 8;
  const __half2 even_bias = __floats2half2_rn(1032.0f, 1032.0f);
  const __half2 sixteenth = __floats2half2_rn(0.0625f, 0.0625f), odd_bias = __floats2half2_rn(-72.0f, -72.0f);
  auto even = [&](uint32_t biased) {
    return half2_bits(__hsub2(*reinterpret_cast<const __half2*>(&biased), even_bias));
  };
  auto odd = [&](uint32_t biased) {
    return half2_bits(__hfma2(*reinterpret_cast<const __half2*>(&biased), sixteenth, odd_bias));
  };
  pair[0] = even(and_or<kLow, kOne024>(word));
  pair[1] = odd(and_or<kHigh, kOne024>(word));
  pair[2] = even(and_or<kLow, kOne024>(upper));
  pair[3] = odd(and_or<kHigh, kOne024>(upper));
}

// The A fragments of one 32-k block for features g (low) and g + 8 (high): pair i = k values (i, i + 4) of
// the lane's 8. mma 0 takes pairs 0 and 1, mma 1 pairs 2 and 3.
struct BlockFragments {
  uint32_t low[4], high[4];
};

// One block's fragments times 8 columns of B (both mmas of the block, into `sum`).
template <XForm kForm>
__device__ inline void multiply_columns(float (&sum)[4], const BlockFragments& a, const uint4& x) {
  mma<kForm>(sum, a.low[0], a.high[0], a.low[1], a.high[1], x.x, x.y);
  mma<kForm>(sum, a.low[2], a.high[2], a.low[3], a.high[3], x.z, x.w);
}

// The host's promise for load_whole: K is a multiple of the chunk.
bool whole_chunk_loads(int64_t in_features) {
  return in_features % kChunkK == 0;
}

// How a chunk's group scales are loaded, chosen on the host. Each mode is its own kernel: nothing may read a
// loaded register before the chunk is computed, and a predicated-off instruction of another mode that reads
// one still waits for the load (ncu: that wait serialised the ring of chunks in flight).
enum class ScaleLoad {
  Vector,    // group 32, 8-byte aligned scale rows, K whole chunks: a chunk's 4 scales in one load
  PerChunk,  // group 128: the chunk is one group (blocks past K multiply zeros)
  PerBlock,  // any other group size: one load per block
};

// W4A16 (compressed-tensors pack-quantized): a chunk's four words of features g and g + 8 and their group
// scales (raw 16-bit values, unpacked by scale_of when the chunk is computed).
template <typename S, ScaleLoad kScales>
struct PackedInt4Weights {
  const uint32_t* packed;
  int64_t packed_stride;
  const S* scales;
  int64_t scales_stride;
  uint32_t blocks_per_group;  // group_size / 32
  int64_t blocks;             // in_features / 32

  static constexpr int kRowRingDepth =
      4;  // chunks in flight per warp in the one-row kernel (10-16 registers each, by scale mode)
  // Passes of the one-row kernel's staging whose loads are issued together: two, unless the ring's registers
  // (per-block scales) leave no room for them.
  static constexpr int kRowStagePasses = kScales == ScaleLoad::PerBlock ? 1 : 2;
  static constexpr int kScaleWords = kScales == ScaleLoad::Vector     ? 2
                                     : kScales == ScaleLoad::PerChunk ? 1
                                                                      : 4;

  struct Loaded {
    uint4 low, high;
    uint32_t scale_low[kScaleWords], scale_high[kScaleWords];
  };

  // Where features g and g + 8 start: offsets in words of `packed` and in values of `scales`, 32 bits
  // (linear_mma_supports bounds the weight), so that a chunk's addresses are one add from the parameters'
  // bases (the ring kernel's loop recomputed four 64-bit row pointers a chunk from the features: 17% of its
  // instructions).
  struct Rows {
    uint32_t packed_low, packed_high, scales_low, scales_high;
  };

  __device__ Rows rows(int64_t feature_low, int64_t feature_high) const {
    return {static_cast<uint32_t>(feature_low * packed_stride),
            static_cast<uint32_t>(feature_high * packed_stride),
            static_cast<uint32_t>(feature_low * scales_stride),
            static_cast<uint32_t>(feature_high * scales_stride)};
  }

  template <bool kWhole>
  __device__ void load_scales(const S* row, int64_t chunk, uint32_t (&into)[kScaleWords]) const {
    const int64_t block0 = chunk * kChunkBlocks;
    if constexpr (kScales == ScaleLoad::Vector) {
      const uint2 v = __ldg(reinterpret_cast<const uint2*>(row + block0));
      into[0] = v.x, into[1] = v.y;
    } else if constexpr (kScales == ScaleLoad::PerChunk) {
      into[0] = __ldg(reinterpret_cast<const unsigned short*>(row + chunk));
    } else {
      const auto first = static_cast<uint32_t>(block0);  // blocks < 2^31: K < 2^36
      uint32_t group = first / blocks_per_group, offset = first - group * blocks_per_group;
#pragma unroll
      for (int u = 0; u < kChunkBlocks; ++u) {
        if (u > 0 && ++offset == blocks_per_group) offset = 0, ++group;
        into[u] =
            kWhole || block0 + u < blocks ? __ldg(reinterpret_cast<const unsigned short*>(row + group)) : 0;
      }
    }
  }

  // Vector scales are chosen only when K is a multiple of the chunk: every chunk loads whole.
  static constexpr bool kAlwaysWhole = kScales == ScaleLoad::Vector;

  // Chunks [begin, end) of the rows into L2, lanes q = 0..3 taking every fourth 128-byte line: requested
  // before the one-row kernel's PDL wait, they stream while the kernels before it run.
  __device__ void prefetch_chunks(const Rows& r, int begin, int end, int q) const {
    const auto first_block = static_cast<uint32_t>(begin * kChunkBlocks);
    const auto end_block = static_cast<uint32_t>(min64(int64_t{end} * kChunkBlocks, blocks));
    constexpr uint32_t kBlockWords = kBlockK / 8;
    for (const uint32_t row : {r.packed_low, r.packed_high})
      prefetch_lines(packed + (row + first_block * kBlockWords), packed + (row + end_block * kBlockWords), q);
    const uint32_t first_group = first_block / blocks_per_group;
    const uint32_t end_group = (end_block + blocks_per_group - 1) / blocks_per_group;
    for (const uint32_t row : {r.scales_low, r.scales_high})
      prefetch_lines(scales + (row + first_group), scales + (row + end_group), q);
  }

  // load() for a chunk inside K, without the bounds checks. In the backend's word order (packed_int4_order.h)
  // the 16 bytes at word 4q of a whole chunk are word q of each of its four blocks: this lane's A words.
  __device__ Loaded load_whole(const Rows& r, int chunk, int q) const {
    Loaded w;
    const auto offset = static_cast<uint32_t>(chunk * kPackedChunkWords + 4 * q);
    w.low = load_streaming(reinterpret_cast<const uint4*>(packed + (r.packed_low + offset)));
    w.high = load_streaming(reinterpret_cast<const uint4*>(packed + (r.packed_high + offset)));
    load_scales<true>(scales + r.scales_low, chunk, w.scale_low);
    load_scales<true>(scales + r.scales_high, chunk, w.scale_high);
    return w;
  }

  // The one-row kernel's whole-chunk loads through a cursor: a lane's pointers at chunk `chunk` of rows r,
  // from which the chunk `step` later is one load a stream, at an immediate offset (load_whole makes each
  // address from the rows' 32-bit offsets). Per-block scales have none.
  static constexpr bool kCursorLoads = kScales != ScaleLoad::PerBlock;
  struct Cursor {
    const uint4 *low, *high;
    const S *scales_low, *scales_high;
  };

  __device__ Cursor cursor(const Rows& r, int chunk, int q) const {
    const auto offset = static_cast<uint32_t>(chunk * kPackedChunkWords + 4 * q);
    const auto scale = static_cast<uint32_t>(kScales == ScaleLoad::Vector ? chunk * kChunkBlocks : chunk);
    return {reinterpret_cast<const uint4*>(packed + (r.packed_low + offset)),
            reinterpret_cast<const uint4*>(packed + (r.packed_high + offset)),
            scales + (r.scales_low + scale), scales + (r.scales_high + scale)};
  }

  // The cursor's scale pointers are rows whose chunk 0 is the cursor's chunk, as load_scales reads them.
  __device__ Loaded load_at(const Cursor& c, int step) const {
    Loaded w;
    w.low = load_streaming(c.low + step * (kPackedChunkWords / 4));
    w.high = load_streaming(c.high + step * (kPackedChunkWords / 4));
    load_scales<true>(c.scales_low, step, w.scale_low);
    load_scales<true>(c.scales_high, step, w.scale_high);
    return w;
  }

  // The ring kernel (linear_ring_kernel) copies a whole chunk's words and scales to this lane's slots in
  // shared memory (cp.async: nothing is held in registers while in flight) and reads them back as load_whole
  // would have loaded them. Group 128 copies the aligned scale pair holding the chunk's scale (ring_aligned
  // checks that the pair is aligned and inside the row).
  static constexpr bool kRingCopies = kScales != ScaleLoad::PerBlock;

  // Group 128's 4-byte scale copies need 4-byte aligned scale rows of an even number of groups (the last
  // pair inside the row); vector scales are 8-byte aligned.
  bool ring_aligned() const {
    return kScales == ScaleLoad::Vector ||
           (reinterpret_cast<uintptr_t>(scales) % 4 == 0 && scales_stride % 2 == 0 && blocks % 8 == 0);
  }

  __device__ void copy_whole_async(const Rows& r, int chunk, int q, uint4* low, uint4* high,
                                   uint4* scale_slot) const {
    const auto offset = static_cast<uint32_t>(chunk * kPackedChunkWords + 4 * q);
    cp_async_16(low, packed + (r.packed_low + offset));
    cp_async_16(high, packed + (r.packed_high + offset));
    auto* scale_words = reinterpret_cast<uint32_t*>(scale_slot);
    const auto scale =
        static_cast<uint32_t>(kScales == ScaleLoad::Vector ? chunk * kChunkBlocks : chunk & ~1);
    if constexpr (kScales == ScaleLoad::Vector) {
      cp_async_8(scale_words, scales + (r.scales_low + scale));
      cp_async_8(scale_words + 2, scales + (r.scales_high + scale));
    } else {
      cp_async_4(scale_words, scales + (r.scales_low + scale));
      cp_async_4(scale_words + 2, scales + (r.scales_high + scale));
    }
  }

  __device__ static Loaded read_copied(const uint4& low, const uint4& high, const uint4& scales, int chunk) {
    Loaded w;
    w.low = low;
    w.high = high;
    if constexpr (kScales == ScaleLoad::Vector) {
      w.scale_low[0] = scales.x, w.scale_low[1] = scales.y;
      w.scale_high[0] = scales.z, w.scale_high[1] = scales.w;
    } else {
      w.scale_low[0] = chunk & 1 ? scales.x >> 16 : scales.x & 0xFFFFu;
      w.scale_high[0] = chunk & 1 ? scales.z >> 16 : scales.z & 0xFFFFu;
    }
    return w;
  }

  // The TMA ring kernel's read of a chunk: the words of features g and g + 8 from the chunk's stage, their
  // scales from the item's scale rows in shared memory at the chunk's first (vector scales: 4, 8-byte
  // aligned; group 128: 1), as load_whole would have loaded them.
  __device__ static Loaded read_staged(const uint4& low, const uint4& high, const unsigned short* scales_low,
                                       const unsigned short* scales_high) {
    Loaded w;
    w.low = low;
    w.high = high;
    if constexpr (kScales == ScaleLoad::Vector) {
      const uint2 l = *reinterpret_cast<const uint2*>(scales_low),
                  h = *reinterpret_cast<const uint2*>(scales_high);
      w.scale_low[0] = l.x, w.scale_low[1] = l.y;
      w.scale_high[0] = h.x, w.scale_high[1] = h.y;
    } else {
      w.scale_low[0] = *scales_low;
      w.scale_high[0] = *scales_high;
    }
    return w;
  }

  // A partial chunk at the end of K keeps the checkpoint order: word q of each block is loaded alone.
  __device__ Loaded load(const Rows& r, int64_t chunk, int q) const {
    Loaded w{};
    const int64_t first_block = chunk * kChunkBlocks;
    if (first_block + kChunkBlocks <= blocks) {
      const auto offset = static_cast<uint32_t>(chunk * kPackedChunkWords + 4 * q);
      w.low = load_streaming(reinterpret_cast<const uint4*>(packed + (r.packed_low + offset)));
      w.high = load_streaming(reinterpret_cast<const uint4*>(packed + (r.packed_high + offset)));
    } else {
      uint32_t low[kChunkBlocks] = {}, high[kChunkBlocks] = {};
#pragma unroll
      for (int u = 0; u < kChunkBlocks; ++u)
        if (first_block + u < blocks) {
          const auto offset = static_cast<uint32_t>((first_block + u) * (kBlockK / 8) + q);
          low[u] = __ldg(packed + (r.packed_low + offset));
          high[u] = __ldg(packed + (r.packed_high + offset));
        }
      w.low = make_uint4(low[0], low[1], low[2], low[3]);
      w.high = make_uint4(high[0], high[1], high[2], high[3]);
    }
    load_scales<false>(scales + r.scales_low, chunk, w.scale_low);
    load_scales<false>(scales + r.scales_high, chunk, w.scale_high);
    return w;
  }

  __device__ static float scale_of(const uint32_t (&raw)[kScaleWords], int u) {
    uint32_t bits;
    if constexpr (kScales == ScaleLoad::Vector)
      bits = (raw[u / 2] >> (16 * (u % 2))) & 0xFFFFu;
    else if constexpr (kScales == ScaleLoad::PerChunk)
      bits = raw[0];
    else
      bits = raw[u];
    if constexpr (std::is_same_v<S, __half>)
      return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
    else
      return __uint_as_float(bits << 16);
  }

  static constexpr XForm kX = XForm::Fp16Scaled;

  // A block's sum of a row (its two mmas, from zero) times the group scale joins the chunk's sums, which
  // fold_chunk scales back into the split's.
  template <int kHalves>
  __device__ static void accumulate(float (&chunk)[kHalves][4], const Loaded& w, int u,
                                    const uint4 (&x)[1][kHalves]) {
    BlockFragments a;
    nibble_pairs(word_of(w.low, u), a.low);
    nibble_pairs(word_of(w.high, u), a.high);
    const float scale_low = scale_of(w.scale_low, u), scale_high = scale_of(w.scale_high, u);
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      float sum[4] = {};
      multiply_columns<kX>(sum, a, x[0][h]);
      chunk[h][0] = fmaf(scale_low, sum[0], chunk[h][0]);
      chunk[h][1] = fmaf(scale_low, sum[1], chunk[h][1]);
      chunk[h][2] = fmaf(scale_high, sum[2], chunk[h][2]);
      chunk[h][3] = fmaf(scale_high, sum[3], chunk[h][3]);
    }
  }
};

// BF16 weights: 8 values (16 bytes) of each 32-k block per lane and feature.
struct Bf16Weights {
  const uint4* weight;  // rows of in_features / 8 vectors
  int64_t vector_stride;
  int64_t blocks;

  static constexpr int kRowRingDepth = 2;  // 32 registers each
  static constexpr int kRowStagePasses = 1;
  static constexpr bool kRingCopies = false;

  struct Loaded {
    uint4 low[kChunkBlocks], high[kChunkBlocks];
  };

  struct Rows {
    const uint4 *low, *high;
  };

  __device__ Rows rows(int64_t feature_low, int64_t feature_high) const {
    return {weight + feature_low * vector_stride, weight + feature_high * vector_stride};
  }

  __device__ Loaded load(const Rows& r, int64_t chunk, int q) const {
    Loaded w{};
#pragma unroll
    for (int u = 0; u < kChunkBlocks; ++u) {
      const int64_t block = chunk * kChunkBlocks + u;
      if (block < blocks) {
        const int64_t vector = block * (kBlockK / 8) + q;
        w.low[u] = load_streaming(r.low + vector);
        w.high[u] = load_streaming(r.high + vector);
      }
    }
    return w;
  }

  static constexpr bool kAlwaysWhole = false;
  static constexpr bool kCursorLoads = false;  // the one-row kernel loads through load_whole / load

  // None for BF16 weights: the head alone (1.3 GB) would flush L2.
  __device__ void prefetch_chunks(const Rows&, int, int, int) const {}

  __device__ Loaded load_whole(const Rows& r, int chunk, int q) const {
    Loaded w;
#pragma unroll
    for (int u = 0; u < kChunkBlocks; ++u) {
      const int vector = (chunk * kChunkBlocks + u) * (kBlockK / 8) + q;
      w.low[u] = load_streaming(r.low + vector);
      w.high[u] = load_streaming(r.high + vector);
    }
    return w;
  }

  // (v0 v1)(v2 v3)(v4 v5)(v6 v7) -> pairs (v0 v4)(v1 v5)(v2 v6)(v3 v7)
  __device__ static void pairs(const uint4& v, uint32_t (&out)[4]) {
    out[0] = __byte_perm(v.x, v.z, 0x5410);
    out[1] = __byte_perm(v.x, v.z, 0x7632);
    out[2] = __byte_perm(v.y, v.w, 0x5410);
    out[3] = __byte_perm(v.y, v.w, 0x7632);
  }

  static constexpr XForm kX = XForm::Bf16HiLo;

  // Rows of x (halves of 8) times one block: the hi and lo parts of x, both mmas, into one chain.
  template <int kHalves>
  __device__ static void accumulate(float (&acc)[kHalves][4], const Loaded& w, int u,
                                    const uint4 (&x)[2][kHalves]) {
    BlockFragments a;
    pairs(w.low[u], a.low);
    pairs(w.high[u], a.high);
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      multiply_columns<kX>(acc[h], a, x[0][h]);
      multiply_columns<kX>(acc[h], a, x[1][h]);
    }
  }
};

struct MmaArgs {
  float* out;
  int64_t out_stride;
  const float* x;
  int64_t x_stride;
  int64_t rows, out_features, in_features;
  int passes, splits;  // rows / 16 (rounded up); parts of K
  int64_t chunks, chunks_per_split;
  int64_t items;    // tile groups x splits x passes
  float* partials;  // [splits][rows][out_features] when split
};

// One block's unit of work: a tile group, one split of K, one pass of 16 rows. Passes vary fastest, so the
// blocks that read the same weights run together and share them through L2.
struct MmaItem {
  int pass, split;
  int64_t group, first_chunk, end_chunk;
};

__device__ inline MmaItem mma_item(const MmaArgs& a, int64_t item) {
  MmaItem i;
  i.pass = static_cast<int>(item % a.passes);
  i.split = static_cast<int>(item / a.passes % a.splits);
  i.group = item / a.passes / a.splits;
  i.first_chunk = i.split * a.chunks_per_split;
  i.end_chunk = min64(a.chunks, i.first_chunk + a.chunks_per_split);
  return i;
}

template <bool kAligned>
__device__ inline void load8(float (&v)[8], const float* p) {
  if constexpr (kAligned) {
    const float4 v0 = reinterpret_cast<const float4*>(p)[0], v1 = reinterpret_cast<const float4*>(p)[1];
    v[0] = v0.x, v[1] = v0.y, v[2] = v0.z, v[3] = v0.w, v[4] = v1.x, v[5] = v1.y, v[6] = v1.z, v[7] = v1.w;
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = p[j];
  }
}

// The power of two taking a chunk's largest |x| into [2^14, 2^15), and its inverse; the exponent is clamped
// so that both stay normal floats (an infinite x stays infinite).
struct ChunkScale {
  float scale, inverse;
};

__device__ inline ChunkScale chunk_scale(float largest) {
  const int exponent = min(max(__float_as_int(largest) >> 23, 15), 254);
  return {__int_as_float((268 - exponent) << 23), __int_as_float((exponent - 14) << 23)};
}

// The one-row kernel stages `chunks` chunks of x's values in this many words; the chunk scales follow them.
template <XForm kForm>
__host__ __device__ constexpr int64_t row_stage_words(int64_t chunks) {
  return chunks * kChunkGroups * kXWords<kForm>;
}

// The one-row kernel's shared memory for `chunks` chunks of x in the form kForm: their values, for FP16 x one
// spare chunk of values that a pair's second chunk past a unit's end reads (its sums are dropped), then
// FP16's chunk scales.
template <XForm kForm>
__host__ __device__ constexpr int64_t row_stage_spare_chunks() {
  return kForm == XForm::Fp16Scaled ? 1 : 0;
}

template <XForm kForm>
__host__ __device__ constexpr int64_t row_stage_bytes(int64_t chunks) {
  const int64_t scale_bytes = kForm == XForm::Fp16Scaled ? sizeof(float) : 0;
  return row_stage_words<kForm>(chunks + row_stage_spare_chunks<kForm>()) *
             static_cast<int64_t>(sizeof(uint32_t)) +
         chunks * scale_bytes;
}

// Where x is staged: row r's words from r * row_words, kXWords per 8 values in pairs (i, i + 4), and for
// FP16 x the inverse scale of row r's chunk c at scales[r * chunks + c].
struct XStage {
  uint32_t* values;
  float* scales;
  int row_words, chunks;
};

// The largest of `largest` and the |values| of 8 values.
__device__ inline float group_largest(const float (&v)[8], float largest) {
#pragma unroll
  for (int j = 0; j < 8; ++j) largest = fmaxf(largest, fabsf(v[j]));
  return largest;
}

// The largest `largest` of the lanes whose index differs only in bits below kLanes (the lanes of a chunk).
template <int kLanes>
__device__ inline float lanes_largest(float largest) {
#pragma unroll
  for (int lanes = 1; lanes < kLanes; lanes *= 2)
    largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, lanes));
  return largest;
}

// 8 values of x times their chunk's scale, stored as FP16 pairs (i, i + 4) at `words` (16 bytes).
__device__ inline void store_fp16_group(uint32_t* words, const float (&v)[8], float scale) {
  uint32_t pairs[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) pairs[p] = half2_bits(__floats2half2_rn(v[p] * scale, v[p + 4] * scale));
  reinterpret_cast<uint4*>(words)[0] = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
}

// Writes group c (8 values) of staged row r in the form kForm; `valid` false: the lane only takes part in the
// chunk's shuffles. FP16 x: the 16 lanes of a chunk find its largest |value| together, and the group
// starting the chunk stores the chunk's inverse scale.
template <XForm kForm>
__device__ inline void store_group(const XStage& to, const float (&v)[8], int r, int c, bool valid) {
  uint32_t* words = to.values + r * to.row_words + c * kXWords<kForm>;
  if constexpr (kForm == XForm::Fp16Scaled) {
    const ChunkScale s = chunk_scale(lanes_largest<kChunkGroups>(group_largest(v, 0.0f)));
    if (valid) {
      store_fp16_group(words, v, s.scale);
      if (c % kChunkGroups == 0) to.scales[r * to.chunks + c / kChunkGroups] = s.inverse;
    }
  } else if (valid) {
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int p = 0; p < 4; ++p) {
      hi[p] = bf16_pair(v[p], v[p + 4]);
      lo[p] = bf16_pair(v[p] - bf16_low(hi[p]), v[p + 4] - bf16_high(hi[p]));
    }
    reinterpret_cast<uint4*>(words)[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    reinterpret_cast<uint4*>(words)[1] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  }
}

// Stages `chunks` chunks of x rows [0, rows) from k0, in the form kForm: rows from rows_with_data on, and
// values past in_features, are zeros. With `up` (rows at x's stride), x is the gated MLP's activation
// silu(x) * up, made here as the silu_mul op makes it. The loads of kPasses passes of kThreads groups of 8
// values are issued together: a pass at a time waited one L2 round trip per pass (10 in a row for 16 rows of
// 640 values). kOneRow: rows is 1 (the one-row kernel), so a thread's group needs no division by the row's.
template <XForm kForm, bool kAlignedX, int kPasses, bool kOneRow = false>
__device__ void stage_x(const XStage& to, const float* x, const float* up, int64_t x_stride,
                        int64_t in_features, int rows, int rows_with_data, int64_t k0) {
  const int groups = to.chunks * kChunkGroups, count = rows * groups;
  // Every thread takes every pass: the 16 lanes of a chunk (aligned, as groups and kThreads are multiples
  // of 16) find its largest value by shuffles.
  for (int base = 0; base < count; base += kPasses * kThreads) {
    float v[kPasses][8], u[kPasses][8];
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int i = base + p * kThreads + static_cast<int>(threadIdx.x);
      const int r = kOneRow ? 0 : i / groups, c = kOneRow ? i : i % groups;
      const int64_t k = k0 + 8 * c;
      const bool has_data = i < count && r < rows_with_data && k < in_features;
#pragma unroll
      for (int j = 0; j < 8; ++j) v[p][j] = u[p][j] = 0.0f;
      if (has_data) load8<kAlignedX>(v[p], x + r * x_stride + k);
      if (has_data && up != nullptr) load8<kAlignedX>(u[p], up + r * x_stride + k);
    }
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int i = base + p * kThreads + static_cast<int>(threadIdx.x);
      const int r = kOneRow ? 0 : i / groups, c = kOneRow ? i : i % groups;
      if (up != nullptr && i < count && r < rows_with_data && k0 + 8 * c < in_features) {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[p][j] = silu_mul(v[p][j], u[p][j]);
      }
      store_group<kForm>(to, v[p], r, c, i < count);
    }
  }
}

// The ring kernel's staging of kRows rows of whole chunks (K a multiple of the chunk) in FP16: the values
// and scales stage_x makes (a chunk's largest |value| does not depend on who finds it), without stage_x's
// divisions by the row length and per-pass branches. Thread t takes row t / kLanes and, of every chunk,
// groups t % kLanes + kLanes i (i < 16 / kLanes), so the kLanes lanes of a row hold a chunk together. The
// loads of kBatchChunks chunks are issued together. 16 rows of 5 chunks: 373 instructions a warp instead
// of stage_x's 943, the verify step's ring linears 2670 -> 2565 us on the H200 (session 15).
template <int kRows, bool kAlignedX, int kBatchChunks>
__device__ void stage_ring_x(const XStage& to, const float* x, int64_t x_stride, int rows_with_data,
                             int64_t k0) {
  constexpr int kLanes = kThreads / kRows;               // lanes per row: 8 (16 rows) or 16 (8 rows)
  constexpr int kGroupsPerLane = kChunkGroups / kLanes;  // of a chunk
  static_assert(kLanes * kRows == kThreads && kGroupsPerLane * kLanes == kChunkGroups);
  const int r = static_cast<int>(threadIdx.x) / kLanes, lane = static_cast<int>(threadIdx.x) % kLanes;
  const float* row = x + r * x_stride + k0 + 8 * lane;
  uint32_t* words = to.values + r * to.row_words + lane * kXWords<XForm::Fp16Scaled>;
  for (int first = 0; first < to.chunks; first += kBatchChunks) {
    float v[kBatchChunks][kGroupsPerLane][8];
#pragma unroll
    for (int c = 0; c < kBatchChunks; ++c)
#pragma unroll
      for (int i = 0; i < kGroupsPerLane; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[c][i][j] = 0.0f;
        if (first + c < to.chunks && r < rows_with_data)
          load8<kAlignedX>(v[c][i], row + (first + c) * kChunkK + 8 * kLanes * i);
      }
#pragma unroll
    for (int c = 0; c < kBatchChunks; ++c) {
      if (first + c >= to.chunks) break;  // uniform: every lane takes part in the shuffles
      float largest = 0.0f;
#pragma unroll
      for (int i = 0; i < kGroupsPerLane; ++i) largest = group_largest(v[c][i], largest);
      const ChunkScale s = chunk_scale(lanes_largest<kLanes>(largest));
      const int chunk = first + c;
#pragma unroll
      for (int i = 0; i < kGroupsPerLane; ++i)
        store_fp16_group(words + (chunk * kChunkGroups + kLanes * i) * kXWords<XForm::Fp16Scaled>, v[c][i],
                         s.scale);
      if (lane == 0) to.scales[r * to.chunks + chunk] = s.inverse;
    }
  }
}

// FP16 x: a chunk's sums, times each row's inverse chunk scale (a power of two: exact), join the split's
// sums. `inverse[h]` holds the scales of rows 8h + 2q and 8h + 2q + 1.
template <int kHalves>
__device__ inline void fold_chunk(float (&acc)[kHalves][4], const float (&chunk)[kHalves][4],
                                  const float (&inverse)[kHalves][2]) {
#pragma unroll
  for (int h = 0; h < kHalves; ++h)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[h][i] = fmaf(inverse[h][i % 2], chunk[h][i], acc[h][i]);
}

// Writes a tile's sums of an item (acc[h][i]: feature first_feature + g + 8 (i / 2), row 8h + 2q + i % 2):
// the output, or with K split the item's split partials.
template <int kHalves>
__device__ void store_item_sums(const MmaArgs& a, const MmaItem& item, const float (&acc)[kHalves][4],
                                int64_t first_feature, int g, int q) {
  const int64_t first_row = static_cast<int64_t>(item.pass) * kTileRows;
  const int rows_here = static_cast<int>(min64(a.rows - first_row, kHalves * 8));
  const bool split_k = a.splits > 1;
  float* target = split_k ? a.partials + static_cast<int64_t>(item.split) * a.rows * a.out_features : a.out;
  const int64_t target_stride = split_k ? a.out_features : a.out_stride;
#pragma unroll
  for (int h = 0; h < kHalves; ++h)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t feature = first_feature + g + 8 * (i / 2);
      const int r = 8 * h + 2 * q + i % 2;
      if (feature < a.out_features && r < rows_here)
        target[(first_row + r) * target_stride + feature] = acc[h][i];
    }
}

// The linears leave a split call's sums to a kernel of their own: their blocks store their partials and
// leave. Sums by the last block to finish (found by a ticket) would put the stores' release, the ticket's
// round trip and the sums' loads on every block's path: 37% of the ring linears' time in a verify step on the
// H200 (with this kernel verify 3.94 -> 3.53 ms, decode 2.12 -> 2.09).
// A split call's partials and where their sums go: [rows][features] of out.
struct SplitPartials {
  float* out;
  int64_t out_stride;
  UnsummedSplits source;
  int64_t rows, features;
};

// Element (row, feature) of the output is its splits' partials added in split order from zero. A thread an
// element.
constexpr int kSplitSumThreads = 256;

__global__ void __launch_bounds__(kSplitSumThreads) sum_split_partials_kernel(SplitPartials p) {
  wait_for_previous_kernel();
  allow_next_kernel();
  const int64_t element = blockIdx.x * int64_t{kSplitSumThreads} + threadIdx.x;
  if (element >= p.rows * p.features) return;
  const int64_t row = element / p.features, feature = element % p.features;
  const float* first = p.source.partials + row * p.source.row_stride + feature;
  const float sum = sum_in_split_order(
      p.source.splits, [&](int split) { return __ldcg(first + split * p.source.split_stride); });
  p.out[row * p.out_stride + feature] = sum;
}

cudaError_t launch_split_sums(const SplitPartials& p, cudaStream_t stream) {
  const int64_t elements = p.rows * p.features;
  return launch_kernel(sum_split_partials_kernel,
                       static_cast<unsigned>((elements + kSplitSumThreads - 1) / kSplitSumThreads),
                       kSplitSumThreads, 0, stream, p);
}

}  // namespace

cudaError_t launch_split_partial_sums(const Tensor& out, const UnsummedSplits& splits, cudaStream_t stream) {
  return launch_split_sums(
      {out.ptr<float>(), out.rows <= 1 ? out.cols : out.stride, splits, out.rows, out.cols}, stream);
}

namespace {

// After a linear's launch (`status`) that left split partials: their sums, by the sums kernel or, where the
// workspace asks, by the op that reads the output (LinearMmaWorkspace::unsummed_splits).
cudaError_t sum_split_partials(cudaError_t status, const SplitPartials& p,
                               const LinearMmaWorkspace& workspace, cudaStream_t stream) {
  if (status != cudaSuccess || !p.source.any()) return status;
  if (workspace.unsummed_splits != nullptr) {
    *workspace.unsummed_splits = p.source.splits;
    return status;
  }
  return launch_split_sums(p, stream);
}

// One staged chunk of x times kTiles tiles' weights of that chunk, into the tiles' sums: the arithmetic of
// both many-row kernels (and so of the one-row kernel's splits). FP16 x: each block's group-scaled sums join
// the chunk's, which the rows' inverse chunk scales fold into acc; BF16 x: the products go straight into acc.
template <typename Weights, int kHalves, int kTiles>
__device__ inline void multiply_chunk(float (&acc)[kTiles][kHalves][4],
                                      const typename Weights::Loaded (&w)[kTiles], const XStage& x_stage,
                                      int chunk, int g, int q) {
  constexpr XForm kForm = Weights::kX;
  constexpr bool kScaled = kForm == XForm::Fp16Scaled;
  float chunk_sums[kTiles][kHalves][4] = {};  // FP16 x: the chunk's sums, before its scale
#pragma unroll
  for (int u = 0; u < kChunkBlocks; ++u) {
    uint4 x[kXParts<kForm>][kHalves];
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      const uint4* words =
          reinterpret_cast<const uint4*>(x_stage.values + (h * 8 + g) * x_stage.row_words +
                                         ((chunk * kChunkBlocks + u) * 4 + q) * kXWords<kForm>);
#pragma unroll
      for (int part = 0; part < kXParts<kForm>; ++part) x[part][h] = words[part];
    }
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile)
      Weights::template accumulate<kHalves>(kScaled ? chunk_sums[tile] : acc[tile], w[tile], u, x);
  }
  if constexpr (kScaled) {
    float inverse[kHalves][2];
#pragma unroll
    for (int h = 0; h < kHalves; ++h)
#pragma unroll
      for (int i = 0; i < 2; ++i)
        inverse[h][i] = x_stage.scales[(h * 8 + 2 * q + i) * x_stage.chunks + chunk];
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile) fold_chunk<kHalves>(acc[tile], chunk_sums[tile], inverse);
  }
}

// A block takes items blockIdx.x, blockIdx.x + gridDim.x, ... (one, unless the tuning's grid is smaller) as
// one stream of stages: the next stage's weights (of this item or the next) are loaded while this one is
// computed.
// kWholeChunks: every chunk lies inside K and loads without bounds checks (whole_chunk_loads).
template <typename Weights, int kHalves, bool kAlignedX, bool kWholeChunks>
__global__ void __launch_bounds__(kThreads, kMmaBlocksPerMultiprocessor)
    linear_mma_kernel(MmaArgs a, Weights weights) {
  constexpr int kStageK = kStageChunks * kChunkK;
  constexpr XForm kForm = Weights::kX;
  constexpr bool kScaled = kForm == XForm::Fp16Scaled;
  constexpr int kRows = kHalves * 8;
  constexpr int kStagePasses = kRows * kStageChunks * kChunkGroups / kThreads;  // a stage's loads in one go
  static_assert(kStagePasses * kThreads == kRows * kStageChunks * kChunkGroups);
  // + 16 bytes (BF16 hi/lo: 8 words per 8 values) or 64 (FP16: 4 words): the 16-byte loads of rows g and
  // g + 1 fall on other banks.
  constexpr int kRowWords = kStageK * kXWords<kForm> / 8 + (kScaled ? 16 : 4);
  __shared__ uint4 x_stage_storage[kRows * kRowWords / 4];
  __shared__ float x_scales[kScaled ? kRows * kStageChunks : 1];
  const XStage x_stage{reinterpret_cast<uint32_t*>(x_stage_storage), x_scales, kRowWords, kStageChunks};
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int g = lane / 4, q = lane % 4;

  using Loaded = typename Weights::Loaded;
  using Rows = typename Weights::Rows;
  // Features past the end read the last one; their sums are not written.
  auto first_feature_of = [&](int64_t group) { return (group * kWarps + warp) * kTileFeatures; };
  auto load_stage = [&](int64_t group, int64_t stage, int64_t end_chunk, Loaded(&into)[kStageChunks][1]) {
    const int64_t first = first_feature_of(group);
    const Rows rows =
        weights.rows(min64(first + g, a.out_features - 1), min64(first + g + 8, a.out_features - 1));
#pragma unroll
    for (int c = 0; c < kStageChunks; ++c)
      if (stage + c < end_chunk) {
        if constexpr (kWholeChunks)
          into[c][0] = weights.load_whole(rows, static_cast<int>(stage + c), q);
        else
          into[c][0] = weights.load(rows, stage + c, q);
      }
  };

  int64_t item_index = blockIdx.x;
  MmaItem item = mma_item(a, item_index);
  int64_t stage = item.first_chunk;
  // Two stages of weights in turn (ping-pong, no copies: a register copy of a stage would wait for its
  // loads).
  Loaded even[kStageChunks][1] = {}, odd[kStageChunks][1] = {};
  load_stage(item.group, stage, item.end_chunk, even);  // weights only: before the wait (pdl.cuh)
  wait_for_previous_kernel();
  allow_next_kernel();
  float acc[1][kHalves][4] = {};
  // Loads the next stage into `next`, computes `current`; false when this block has no next stage.
  auto step = [&](Loaded(&current)[kStageChunks][1], Loaded(&next)[kStageChunks][1]) {
    int64_t next_index = item_index, next_stage = stage + kStageChunks;
    MmaItem next_item = item;
    if (next_stage >= item.end_chunk) {
      next_index += gridDim.x;
      if (next_index < a.items) {
        next_item = mma_item(a, next_index);
        next_stage = next_item.first_chunk;
      }
    }
    const bool has_next = next_index < a.items;
    if (has_next) load_stage(next_item.group, next_stage, next_item.end_chunk, next);

    const int64_t first_row = static_cast<int64_t>(item.pass) * kTileRows;
    const int rows_here = static_cast<int>(min64(a.rows - first_row, kHalves * 8));
    __syncthreads();  // the previous stage's x is consumed
    stage_x<kForm, kAlignedX, kStagePasses>(x_stage, a.x + first_row * a.x_stride, nullptr, a.x_stride,
                                            a.in_features, kRows, rows_here, stage * kChunkK);
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kStageChunks; ++c) {
      if (stage + c >= item.end_chunk) break;
      multiply_chunk<Weights, kHalves, 1>(acc, current[c], x_stage, c, g, q);
    }

    if (next_index != item_index) {
      store_item_sums<kHalves>(a, item, acc[0], first_feature_of(item.group), g, q);
#pragma unroll
      for (int h = 0; h < kHalves; ++h)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[0][h][i] = 0.0f;
    }
    item_index = next_index;
    item = next_item;
    stage = next_stage;
    return has_next;
  };
  while (step(even, odd) && step(odd, even)) {
  }
}

// The many-row kernel for W4A16 weights whose chunks copy to shared memory (PackedInt4Weights::
// kRingCopies), K whole chunks: the splits and per-tile arithmetic of linear_mma_kernel (so the same sums),
// but a warp owns kRingTiles tiles that share its x fragments, so a block's item is 128 features (x, staged
// as FP32 from L2, was twice the weights' bytes with 64), and each lane keeps kRingDepth chunks of its
// weights in flight through cp.async into its own shared-memory slots (no registers held, no barrier: a lane
// reads only what it copied). An item's x is staged once, every chunk of it. With K split,
// sum_split_partials_kernel adds the blocks' partials.
constexpr int kRingTiles = 2;
constexpr int kRingDepth = 4;
constexpr int kRingBlocksPerMultiprocessor = 3;
constexpr int kRingGroupFeatures = kWarps * kRingTiles * kTileFeatures;
constexpr int kRingStageChunks = 5;  // an item's x (up to 5 chunks) in one round trip

struct RingLayout {
  // low, high and scale slots of every tile and stage
  static constexpr int kSlotVectors = 3 * kRingTiles * kRingDepth * kThreads;

  // Staged x: FP16 words of a row of `chunks` chunks (+ 16: rows g and g + 1 on other banks).
  __host__ __device__ static int row_words(int64_t chunks) {
    return static_cast<int>(chunks) * kChunkGroups * kXWords<XForm::Fp16Scaled> + 16;
  }
  __host__ __device__ static int64_t bytes(int rows, int64_t chunks) {
    return int64_t{kSlotVectors} * 16 + int64_t{rows} * row_words(chunks) * 4 + rows * chunks * 4;
  }
};

// A ring kernel's x: the item's chunks of its pass of rows staged at x_values (stage_ring_x), for every
// thread of the block.
template <int kRows, bool kAlignedX>
__device__ XStage stage_item_x(const MmaArgs& a, const MmaItem& item, uint32_t* x_values, int chunks) {
  const int row_words = RingLayout::row_words(chunks);
  const XStage x_stage{x_values, reinterpret_cast<float*>(x_values + kRows * row_words), row_words, chunks};
  const int64_t first_row = static_cast<int64_t>(item.pass) * kTileRows;
  const int rows_here = static_cast<int>(min64(a.rows - first_row, kRows));
  stage_ring_x<kRows, kAlignedX, kRingStageChunks>(x_stage, a.x + first_row * a.x_stride, a.x_stride,
                                                   rows_here, item.first_chunk * kChunkK);
  __syncthreads();
  return x_stage;
}

template <typename Weights, int kHalves, bool kAlignedX>
__global__ void __launch_bounds__(kThreads, kRingBlocksPerMultiprocessor)
    linear_ring_kernel(MmaArgs a, Weights weights) {
  constexpr int kRows = kHalves * 8;
  constexpr int kSlotStride = kRingDepth * kThreads;  // between the slot arrays of one kind
  extern __shared__ uint4 ring_storage[];
  const int t = static_cast<int>(threadIdx.x);
  const int warp = t / kWarpSize, lane = t % kWarpSize;
  const int g = lane / 4, q = lane % 4;
  // [kRingTiles][kRingDepth][kThreads] each
  uint4* const low_slots = ring_storage;
  uint4* const high_slots = low_slots + kRingTiles * kSlotStride;
  uint4* const scale_slots = high_slots + kRingTiles * kSlotStride;
  auto* const x_values = reinterpret_cast<uint32_t*>(ring_storage + RingLayout::kSlotVectors);

  const MmaItem item = mma_item(a, blockIdx.x);
  const int chunks = static_cast<int>(item.end_chunk - item.first_chunk);
  const int64_t first_feature = item.group * kRingGroupFeatures + warp * kRingTiles * kTileFeatures;
  typename Weights::Rows rows[kRingTiles];
#pragma unroll
  for (int tile = 0; tile < kRingTiles; ++tile) {
    const int64_t first = first_feature + tile * kTileFeatures;
    rows[tile] = weights.rows(min64(first + g, a.out_features - 1), min64(first + g + 8, a.out_features - 1));
  }
  // Chunk c of the item (if there is one) into stage c % kRingDepth; a group is committed either way, so
  // that waiting for all but kRingDepth - 1 groups always means chunk c has landed.
  auto copy_chunk = [&](int c) {
    if (c < chunks) {
#pragma unroll
      for (int tile = 0; tile < kRingTiles; ++tile) {
        const int slot = tile * kSlotStride + (c % kRingDepth) * kThreads + t;
        weights.copy_whole_async(rows[tile], static_cast<int>(item.first_chunk) + c, q, low_slots + slot,
                                 high_slots + slot, scale_slots + slot);
      }
    }
    cp_async_commit();
  };
#pragma unroll
  for (int c = 0; c < kRingDepth; ++c) copy_chunk(c);  // weights only: before the wait (pdl.cuh)
  wait_for_previous_kernel();
  allow_next_kernel();

  const XStage x_stage = stage_item_x<kRows, kAlignedX>(a, item, x_values, chunks);

  float acc[kRingTiles][kHalves][4] = {};
  for (int c = 0; c < chunks; ++c) {
    cp_async_wait<kRingDepth - 1>();
    typename Weights::Loaded w[kRingTiles];
#pragma unroll
    for (int tile = 0; tile < kRingTiles; ++tile) {
      const int slot = tile * kSlotStride + (c % kRingDepth) * kThreads + t;
      w[tile] = Weights::read_copied(low_slots[slot], high_slots[slot], scale_slots[slot],
                                     static_cast<int>(item.first_chunk) + c);
    }
    multiply_chunk<Weights, kHalves, kRingTiles>(acc, w, x_stage, c, g, q);
    copy_chunk(c + kRingDepth);  // into the stage just read
  }
#pragma unroll
  for (int tile = 0; tile < kRingTiles; ++tile)
    store_item_sums<kHalves>(a, item, acc[tile], first_feature + tile * kTileFeatures, g, q);
}

// The ring kernel's form with the copies made by the tensor memory accelerator (sm_90): W4A16 weights of
// group 32 (vector scales) or 128 (a scale a chunk), items of at most kTmaStages chunks. One thread requests
// every chunk of the item at the kernel's start, each a [128 features x 16 words] box of the packed weights
// into a stage of its own, and g32's scales as one [128 features x kTmaScaleBox] box, each completing on a
// barrier (g128's scale rows, 2-byte aligned, fit no tensor map: each thread loads its feature's before the
// PDL wait and stores them after it). The warps wait on a chunk's barrier and read their words and scales
// back as they read the ring kernel's slots (no per-lane copies, no refills). The arithmetic, x staging and
// sums are the ring kernel's: the same bits.
constexpr int kTmaStages = kRingStageChunks;
// A box's first column must start 16 bytes aligned (at 8 bytes, one-chunk items of odd splits stopped on an
// illegal instruction), so an item's scales box starts at its first scale rounded down to 8: up to 4 before.
constexpr int kTmaScaleAlign = 8;
constexpr int kTmaScaleBox = 24;  // scales a row per item copy: 4 + kTmaStages chunks of 4, 48 bytes
static_assert(kTmaScaleBox >= kTmaScaleAlign - kChunkBlocks + kTmaStages * kChunkBlocks);

struct TmaRingLayout {
  static constexpr int kStageBytes = kRingGroupFeatures * static_cast<int>(kPackedChunkWords) * 4;  // 8 KB
  static constexpr int kScaleBytes = kRingGroupFeatures * kTmaScaleBox * 2;
  static constexpr int kScaleOffset = kTmaStages * kStageBytes;
  static constexpr int kBarrierOffset = kScaleOffset + kScaleBytes;
  static constexpr int kXOffset = kBarrierOffset + 64;  // up to 8 barriers
  static_assert(kScaleOffset % 128 == 0 && kStageBytes % 128 == 0 && kTmaStages <= 8);
  __host__ __device__ static int64_t bytes(int rows, int64_t chunks) {
    return kXOffset + int64_t{rows} * RingLayout::row_words(chunks) * 4 + rows * chunks * 4;
  }
};

// scales_map: vector scales only.
template <typename Weights, int kHalves, bool kAlignedX>
__global__ void __launch_bounds__(kThreads, kRingBlocksPerMultiprocessor)
    linear_ring_tma_kernel(MmaArgs a, Weights weights, const __grid_constant__ CUtensorMap packed_map,
                           const __grid_constant__ CUtensorMap scales_map) {
  constexpr bool kVectorScales = Weights::kScaleWords == 2;
  constexpr int kRows = kHalves * 8;
  extern __shared__ __align__(128) uint4 tma_storage[];
  auto* const base = reinterpret_cast<char*>(tma_storage);
  auto* const scales = reinterpret_cast<unsigned short*>(base + TmaRingLayout::kScaleOffset);
  auto* const barriers = reinterpret_cast<uint64_t*>(base + TmaRingLayout::kBarrierOffset);
  auto* const x_values = reinterpret_cast<uint32_t*>(base + TmaRingLayout::kXOffset);
  const int t = static_cast<int>(threadIdx.x);
  const int warp = t / kWarpSize, lane = t % kWarpSize;
  const int g = lane / 4, q = lane % 4;

  const MmaItem item = mma_item(a, blockIdx.x);
  const int chunks = static_cast<int>(item.end_chunk - item.first_chunk);
  const auto first_row = static_cast<int>(item.group * kRingGroupFeatures);
  const auto first_scale = static_cast<int>(item.first_chunk) * (kVectorScales ? kChunkBlocks : 1);
  const int scale_column = kVectorScales ? first_scale / kTmaScaleAlign * kTmaScaleAlign : first_scale,
            scale_shift = first_scale - scale_column;
  if (t == 0) {  // weights only: before the wait (pdl.cuh)
    for (int c = 0; c < chunks; ++c) barrier_init(&barriers[c]);
    fence_barrier_init();
    for (int c = 0; c < chunks; ++c) {
      expect_bytes(&barriers[c],
                   TmaRingLayout::kStageBytes + (kVectorScales && c == 0 ? TmaRingLayout::kScaleBytes : 0));
      if (kVectorScales && c == 0)
        tensor_copy_2d(base + TmaRingLayout::kScaleOffset, &scales_map, scale_column, first_row,
                       &barriers[0]);
      tensor_copy_2d(base + c * TmaRingLayout::kStageBytes, &packed_map,
                     static_cast<int>((item.first_chunk + c) * kPackedChunkWords), first_row, &barriers[c]);
    }
  }
  // g128: this thread's feature's scales of the item (0 past the weight's rows), weights only: before the
  // wait.
  unsigned short own_scales[kVectorScales ? 1 : kTmaStages] = {};
  if constexpr (!kVectorScales) {
    if (first_row + t < a.out_features) {
      const auto* row = reinterpret_cast<const unsigned short*>(weights.scales) +
                        static_cast<int64_t>(first_row + t) * weights.scales_stride + first_scale;
#pragma unroll
      for (int c = 0; c < kTmaStages; ++c)
        if (c < chunks) own_scales[c] = __ldg(row + c);
    }
  }
  __syncthreads();  // the barriers are initialised before anyone waits on them
  wait_for_previous_kernel();
  allow_next_kernel();

  if constexpr (!kVectorScales) {
#pragma unroll
    for (int c = 0; c < kTmaStages; ++c) scales[t * kTmaScaleBox + c] = own_scales[c];
  }
  const XStage x_stage = stage_item_x<kRows, kAlignedX>(a, item, x_values, chunks);  // a barrier at its end

  float acc[kRingTiles][kHalves][4] = {};
  for (int c = 0; c < chunks; ++c) {
    barrier_wait(&barriers[c], 0);
    __syncwarp();  // the lanes leave the wait one by one; the mmas are .aligned
    const auto* stage = reinterpret_cast<const uint4*>(base + c * TmaRingLayout::kStageBytes);
    typename Weights::Loaded w[kRingTiles];
#pragma unroll
    for (int tile = 0; tile < kRingTiles; ++tile) {
      const int low = warp * kRingTiles * kTileFeatures + tile * kTileFeatures + g, high = low + 8;
      const int scale = scale_shift + c * (kVectorScales ? kChunkBlocks : 1);
      w[tile] =
          Weights::read_staged(stage[low * 4 + q], stage[high * 4 + q], scales + low * kTmaScaleBox + scale,
                               scales + high * kTmaScaleBox + scale);
    }
    multiply_chunk<Weights, kHalves, kRingTiles>(acc, w, x_stage, c, g, q);
  }
  const int64_t first_feature = item.group * kRingGroupFeatures + warp * kRingTiles * kTileFeatures;
#pragma unroll
  for (int tile = 0; tile < kRingTiles; ++tile)
    store_item_sums<kHalves>(a, item, acc[tile], first_feature + tile * kTileFeatures, g, q);
}

// One row of x (a decode step) is a stream of weights against a vector that fits in shared memory. Units
// (16-feature tile, part of K: a whole number of splits) are numbered part-major and each warp computes one,
// keeping kRowRingDepth chunks of weights in flight; a block stages only the slice of x that its warps' parts
// read (a 9216-value x was staged whole by each of ~528 blocks: more bytes through L2 than the weights), with
// one barrier after the staging and none after that; for the gated MLP's down projection the staging makes
// silu(gate) * up. The split of K is the many-row kernel's (mma_split) and each split's sums are made the
// same way, so a row's result equals that of a many-row call bit for bit, whatever the parts: a unit spanning
// K adds its splits' sums in split order itself; otherwise each split's sums go to the cluster's owner block
// of their features (cluster sums, sm_90+) or to one partial per split for sum_split_partials_kernel, which
// add them in split order.
struct RowArgs {
  float* out;
  const float* x;
  const float* up;  // the gated MLP's up half (x the gate half): x is silu(x) * up; else null
  int64_t out_features, in_features;
  int chunks, chunks_per_split, splits;  // the split of K (mma_split): it sets the order of a row's sums
  int chunks_per_part, parts;            // a unit's part of K: a whole number of splits (launch_row's choice)
  int splits_per_part;                   // chunks_per_part / chunks_per_split
  int tiles, units;                      // units: tiles x parts, part-major (without cluster sums)
  float* partials;                       // [splits][out_features] when parts > 1 and not cluster_sums
  bool x_aligned;                        // float4 loads of x
  // The parts of a block's tiles run as one cluster (sm_90+) and add their splits' sums there: no partials
  // in global memory, no sums kernel.
  bool cluster_sums;
};

// A block's units: its warps' tiles, their part of K, and the chunks of x they read.
struct RowBlock {
  int first_tile, tiles;  // cluster sums: the block's tiles, all of one part
  bool has_unit;          // this warp's
  int tile, part;         // this warp's unit (the block's last when it has none); with cluster sums, the
                          // part of every warp of the block
  int first_chunk, end_chunk;
};

// Units are numbered part-major, four a block; with cluster sums a block is (group of four tiles, part),
// part fastest, so that the blocks of a cluster hold every part of the same tiles.
__device__ inline RowBlock row_block(const RowArgs& a, int warp) {
  RowBlock b{};
  if (a.cluster_sums) {
    b.part = static_cast<int>(blockIdx.x) % a.parts;
    b.first_tile = static_cast<int>(blockIdx.x) / a.parts * kWarps;
    b.tiles = min(kWarps, a.tiles - b.first_tile);
    b.has_unit = warp < b.tiles;
    b.tile = b.first_tile + min(warp, b.tiles - 1);
    b.first_chunk = b.part * a.chunks_per_part;
    b.end_chunk = min(a.chunks, b.first_chunk + a.chunks_per_part);
    return b;
  }
  const int first_unit = static_cast<int>(blockIdx.x) * kWarps;
  const int end_unit = min(a.units, first_unit + kWarps);
  b.has_unit = first_unit + warp < end_unit;
  const int unit = min(first_unit + warp, end_unit - 1);
  b.part = unit / a.tiles;
  b.tile = unit - b.part * a.tiles;
  const int first_part = first_unit / a.tiles, last_part = (end_unit - 1) / a.tiles;
  b.first_chunk = first_part * a.chunks_per_part;
  b.end_chunk = min(a.chunks, (last_part + 1) * a.chunks_per_part);
  return b;
}

// With cluster sums, block rank r of a cluster owns features r, r + parts, ... of the cluster's tiles
// (feature f of the tiles at index f / parts): every block stores each split's sums of a feature into its
// owner's shared memory ([index][split]), and after one cluster barrier each owner adds its features' splits
// in split order from zero (sum_split_partials_kernel's order) from its own shared memory.
__host__ __device__ constexpr int row_cluster_sums_floats(int parts, int splits) {
  return (kWarps * kTileFeatures + parts - 1) / parts * splits;
}

// Where the splits of feature f (of the cluster's tiles) go: the owner's shared memory, at the same offset as
// `sums` in this block; split s at + s.
__device__ inline float* row_cluster_sum_slots(const RowArgs& a, float* sums, int f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(sums, f % a.parts) + f / a.parts * a.splits;
#else
  return sums + f / a.parts * a.splits;  // never used: clusters_supported() is false
#endif
}

// Distributed shared memory may be accessed only once every block of the cluster has started: each thread
// arrives at the kernel's start and waits before its block's first store into another block (the first phase
// of the cluster barrier; add_cluster_split_sums' sync is the second).
__device__ inline void cluster_arrive_started() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}

__device__ inline void cluster_wait_started() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
#endif
}

// Every thread of every block of a cluster calls this once its split sums are stored: the barrier makes them
// visible to their owners (and every block stays until then), then each owner writes its features' sums.
__device__ void add_cluster_split_sums(const RowArgs& a, const RowBlock& b, const float* sums) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
  const int f = b.part + static_cast<int>(threadIdx.x) * a.parts;
  if (f >= b.tiles * kTileFeatures) return;
  const int64_t feature = int64_t{b.first_tile} * kTileFeatures + f;
  const float* split_sums = sums + f / a.parts * a.splits;
  const float sum = sum_in_split_order(a.splits, [&](int split) { return split_sums[split]; });
  if (feature < a.out_features) a.out[feature] = sum;
#endif
}

// One chunk of weights times the staged row of x (staged chunk `staged`), into `sums`. Row 0 of x is column
// 0 of B; every lane loads it (lanes of one q read one address: a broadcast), so the other columns repeat it
// and are never stored.
template <typename Weights>
__device__ inline void multiply_row_chunk(float (&sums)[1][4], const typename Weights::Loaded& w,
                                          const XStage& x_stage, int staged, int q) {
  constexpr XForm kForm = Weights::kX;
#pragma unroll
  for (int u = 0; u < kChunkBlocks; ++u) {
    const uint4* words = reinterpret_cast<const uint4*>(
        x_stage.values + ((staged * kChunkBlocks + u) * 4 + q) * kXWords<kForm>);
    uint4 x[kXParts<kForm>][1];
#pragma unroll
    for (int part = 0; part < kXParts<kForm>; ++part) x[part][0] = words[part];
    Weights::template accumulate<1>(sums, w, u, x);
  }
}

constexpr int kRowBlocksPerMultiprocessor = 4;  // resident blocks of linear_row_kernel (its launch bounds)
constexpr unsigned kPortableClusterBlocks = 8;  // larger clusters need an attribute (sm_90: up to 16)
constexpr int64_t kMaxClusterBlocks = 16;

// kWholeChunks: every chunk lies inside K and loads without bounds checks (whole_chunk_loads).
template <typename Weights, bool kWholeChunks>
__global__ void __launch_bounds__(kThreads, kRowBlocksPerMultiprocessor)
    linear_row_kernel(RowArgs a, Weights weights) {
  constexpr int kDepth = Weights::kRowRingDepth;
  constexpr XForm kForm = Weights::kX;
  constexpr bool kScaled = kForm == XForm::Fp16Scaled;
  // Chunks computed together. FP16 x's chunk sums start from zero, so two chunks' mma chains interleave (a
  // chunk at a time left the warps waiting on each chain); BF16 x adds each chunk into the split's sums (the
  // many-row kernel's order), one at a time.
  constexpr int kStep = kScaled ? 2 : 1;
  static_assert(kDepth % kStep == 0);
  extern __shared__ uint4 x_row_storage[];
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int g = lane / 4, q = lane % 4;
  // A warp past the last unit stages its share of x (and with cluster sums adds its share of the sums).
  const RowBlock block = row_block(a, warp);
  const bool has_unit = block.has_unit;
  const int part = block.part;
  const int begin = part * a.chunks_per_part, end = min(a.chunks, begin + a.chunks_per_part);
  const int64_t n = a.out_features;
  const int64_t feature = static_cast<int64_t>(block.tile) * kTileFeatures + g;
  const typename Weights::Rows rows = weights.rows(min64(feature, n - 1), min64(feature + 8, n - 1));
  // Chunk base + step (step a compile-time constant in the loops below: through a cursor at base, one
  // instruction a load).
  auto load = [&](int base, int step) {
    if constexpr (kWholeChunks && Weights::kCursorLoads)
      return weights.load_at(weights.cursor(rows, base, q), step);
    else if constexpr (kWholeChunks)
      return weights.load_whole(rows, base + step, q);
    else
      return weights.load(rows, base + step, q);
  };

  // The first chunks' weights are requested before x is staged: their latency covers the staging.
  typename Weights::Loaded ring[kDepth] = {};
#pragma unroll
  for (int j = 0; j < kDepth; ++j)
    if (has_unit && begin + j < end) ring[j] = load(begin, j);  // weights only: before the wait (pdl.cuh)
  if (has_unit && begin + kDepth < end) weights.prefetch_chunks(rows, begin + kDepth, end, q);
  if (a.cluster_sums) {
    __syncwarp();              // the arrive is .aligned: every lane, after the lane-dependent loops above
    cluster_arrive_started();  // no global access: before the wait is fine (pdl.cuh)
  }
  wait_for_previous_kernel();
  allow_next_kernel();
  // Only the chunks of x that this block's units read (its parts' slice of K).
  const int staged_chunks = block.end_chunk - block.first_chunk;
  const XStage x_stage{reinterpret_cast<uint32_t*>(x_row_storage),
                       reinterpret_cast<float*>(x_row_storage) +
                           row_stage_words<kForm>(staged_chunks + row_stage_spare_chunks<kForm>()),
                       0, staged_chunks};
  // The cluster's split sums follow the largest staged x, at one offset in every block of the cluster.
  float* const cluster_sums = reinterpret_cast<float*>(x_row_storage) +
                              row_stage_bytes<kForm>(min(a.chunks, a.chunks_per_part)) / sizeof(float);
  const int64_t k0 = int64_t{block.first_chunk} * kChunkK;
  if (a.x_aligned)
    stage_x<kForm, true, Weights::kRowStagePasses, true>(x_stage, a.x, a.up, 0, a.in_features, 1, 1, k0);
  else
    stage_x<kForm, false, Weights::kRowStagePasses, true>(x_stage, a.x, a.up, 0, a.in_features, 1, 1, k0);
  __syncthreads();
  if (a.cluster_sums) cluster_wait_started();  // before any store into another block's shared memory
  if (!has_unit) {
    if (a.cluster_sums) add_cluster_split_sums(a, block, cluster_sums);
    return;
  }

  // Row 0 of a split's sums is held by the lanes with q == 0: features g (acc[0][0]) and g + 8 (acc[0][2]).
  // A row's result is its splits' sums added in split order, from zero: here when the unit spans K, else
  // by the cluster's owner block (add_cluster_split_sums) or by sum_split_partials_kernel, from the
  // partials.
  float acc[1][4] = {};
  float total[2] = {};
  int split = part * a.splits_per_part, split_end = min(end, begin + a.chunks_per_split);
  // The owners' slots of features g and g + 8, found once: the owner's rank and index are divisions by the
  // parts (~70 instructions at every split's end in the loop).
  float* const cluster_slot_low =
      a.cluster_sums ? row_cluster_sum_slots(a, cluster_sums, warp * kTileFeatures + g) : nullptr;
  float* const cluster_slot_high =
      a.cluster_sums ? row_cluster_sum_slots(a, cluster_sums, warp * kTileFeatures + g + 8) : nullptr;
  // After chunk `chunk`'s sums joined acc: at the end of its split, the split's sums leave acc.
  auto end_split_after = [&](int chunk) {
    if (chunk + 1 != split_end) return;
    if (a.cluster_sums) {
      if (q == 0) {
        cluster_slot_low[split] = acc[0][0];
        cluster_slot_high[split] = acc[0][2];
      }
    } else if (a.parts > 1) {
      float* partial = a.partials + split * n;
      if (q == 0 && feature < n) partial[feature] = acc[0][0];
      if (q == 0 && feature + 8 < n) partial[feature + 8] = acc[0][2];
    } else if (a.splits > 1) {
      total[0] += acc[0][0], total[1] += acc[0][2];
    } else {
      total[0] = acc[0][0], total[1] = acc[0][2];
    }
    ++split, split_end = min(end, split_end + a.chunks_per_split);
    acc[0][0] = acc[0][1] = acc[0][2] = acc[0][3] = 0.0f;
  };
  for (int c = begin; c < end; c += kDepth) {
#pragma unroll
    for (int s = 0; s < kDepth; s += kStep) {
      const int chunk = c + s;
      if (chunk >= end) break;
      // A pair's second chunk past the end multiplies its stale (or never loaded) slot by the staging's spare
      // chunk (row_stage_bytes), and is dropped.
      float sums[kStep][1][4] = {};
#pragma unroll
      for (int i = 0; i < kStep; ++i)
        multiply_row_chunk<Weights>(kScaled ? sums[i] : acc, ring[s + i], x_stage,
                                    chunk + i - block.first_chunk, q);
#pragma unroll
      for (int i = 0; i < kStep; ++i)
        if (chunk + i + kDepth < end) ring[s + i] = load(c, s + i + kDepth);
#pragma unroll
      for (int i = 0; i < kStep; ++i) {
        if (chunk + i >= end) break;
        if constexpr (kScaled) {
          const float inverse = x_stage.scales[chunk + i - block.first_chunk];
          fold_chunk<1>(acc, sums[i], {{inverse, inverse}});
        }
        end_split_after(chunk + i);
      }
    }
  }
  if (a.cluster_sums) {
    add_cluster_split_sums(a, block, cluster_sums);
  } else if (a.parts == 1) {
    if (q == 0 && feature < n) a.out[feature] = total[0];
    if (q == 0 && feature + 8 < n) a.out[feature + 8] = total[1];
  }
}

// The split of K depends on N and K only (not on the rows, the weight type or the tuning of the grid), so a
// row's sums are added in the same order at any batch.
struct MmaSplit {
  int64_t chunks, chunks_per_split, splits;
};

MmaSplit mma_split(int64_t out_features, int64_t in_features, int64_t chunks_per_split) {
  MmaSplit split;
  split.chunks = (in_features + kChunkK - 1) / kChunkK;
  if (chunks_per_split <= 0) {
    const int64_t groups = (out_features + kGroupFeatures - 1) / kGroupFeatures;
    const int64_t wanted = (kTargetItems + groups - 1) / groups;
    chunks_per_split = (split.chunks + wanted - 1) / wanted;
    // One chunk more per split when that saves a whole wave of the 16-row kernel (verify and draft steps):
    // qkv|z [12288, 2560] at 16 rows 34.5 -> 24.6 us, at one row 12.5 -> 13.7 us (20261130T0555Z sweep).
    auto waves = [&](int64_t per_split) {
      const int64_t items = groups * ((split.chunks + per_split - 1) / per_split);
      return (items + kSplitWaveBlocks - 1) / kSplitWaveBlocks;
    };
    if (chunks_per_split < split.chunks && waves(chunks_per_split + 1) < waves(chunks_per_split))
      ++chunks_per_split;
  }
  split.chunks_per_split = chunks_per_split < split.chunks ? chunks_per_split : split.chunks;
  split.splits = (split.chunks + split.chunks_per_split - 1) / split.chunks_per_split;
  return split;
}

int64_t row_passes(int64_t rows) {
  return (rows + kTileRows - 1) / kTileRows;
}

template <typename Weights, int kHalves, bool kAlignedX, bool kWholeChunks>
cudaError_t launch_mma_kernel(const MmaArgs& args, const Weights& weights, const LinearMmaTuning& tuning,
                              cudaStream_t stream) {
  // One block per item unless the tuning asks for fewer blocks walking several: on the H200 that was no
  // faster at any W4A16 shape of the 4B and up to 25% slower at 16 rows (bench/results/cuda-ops-notes.md).
  const int64_t blocks =
      tuning.grid_blocks > 0 && tuning.grid_blocks < args.items ? tuning.grid_blocks : args.items;
  return launch_kernel(linear_mma_kernel<Weights, kHalves, kAlignedX, kWholeChunks>,
                       static_cast<unsigned>(blocks), kThreads, 0, stream, args, weights);
}

// The ring kernel's shared memory is at most this (3 blocks of it fit an H200 SM's 227 KB).
constexpr int64_t kRingMaxBytes = 74 * 1024;

// A ring kernel's launch (linear_ring_kernel or its TMA form, kKernel): a block an item with `bytes` of
// shared memory (up to kRingMaxBytes, allowed once per kernel), without the split sums.
template <auto kKernel, typename... Params>
cudaError_t launch_ring_form(const MmaArgs& args, int64_t bytes, cudaStream_t stream,
                             const Params&... params) {
  static const cudaError_t attribute = cudaFuncSetAttribute(
      kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kRingMaxBytes));
  if (attribute != cudaSuccess) return attribute;
  return launch_kernel(kKernel, static_cast<unsigned>(args.items), kThreads, static_cast<size_t>(bytes),
                       stream, args, params...);
}

bool aligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// cuTensorMapEncodeTiled from the driver (the runtime links no driver symbols), or null.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                 CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                 CUtensorMapFloatOOBfill);
EncodeTiled tensor_map_encoder() {
  static const EncodeTiled encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      static_cast<void>(cudaGetLastError());  // no later caller (cuBLAS checks it) may see it
      return EncodeTiled{nullptr};
    }
    return reinterpret_cast<EncodeTiled>(function);
  }();
  return encode;
}

// A 2D map of `rows` rows of `cols` elements (`element_bytes` each, rows `stride` elements apart) read in
// boxes of box_rows x box_cols; false where TMA cannot take it (alignment, strides) or the driver has no
// encoder.
bool encode_rows_map(CUtensorMap& map, const void* base, CUtensorMapDataType type, int64_t element_bytes,
                     int64_t rows, int64_t cols, int64_t stride, uint32_t box_rows, uint32_t box_cols) {
  const EncodeTiled encode = tensor_map_encoder();
  if (encode == nullptr || !aligned(base, 16) || (stride * element_bytes) % 16 != 0 ||
      (box_cols * element_bytes) % 16 != 0)
    return false;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(stride * element_bytes)};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  return encode(&map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The ring kernel through tensor copies where it can take the call (linear_ring_tma_kernel): true with the
// launch's status in `status`.
template <int kHalves, typename Weights>
bool launch_ring_tma(const MmaArgs& args, const Weights& weights, bool aligned_x,
                     const LinearMmaTuning& tuning, cudaStream_t stream, cudaError_t& status) {
  const int64_t bytes = TmaRingLayout::bytes(kHalves * 8, args.chunks_per_split);
  if (!tuning.ring_tma || !clusters_supported() || args.chunks_per_split > kTmaStages ||
      bytes > kRingMaxBytes)
    return false;
  CUtensorMap packed_map, scales_map{};
  const int64_t words = weights.blocks * (kBlockK / 8);
  if (!encode_rows_map(packed_map, weights.packed, CU_TENSOR_MAP_DATA_TYPE_UINT32, 4, args.out_features,
                       words, weights.packed_stride, kRingGroupFeatures,
                       static_cast<uint32_t>(kPackedChunkWords)))
    return false;
  if (Weights::kScaleWords == 2 &&
      !encode_rows_map(scales_map, weights.scales, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, args.out_features,
                       weights.blocks, weights.scales_stride, kRingGroupFeatures, kTmaScaleBox))
    return false;
  status = aligned_x ? launch_ring_form<linear_ring_tma_kernel<Weights, kHalves, true>>(
                           args, bytes, stream, weights, packed_map, scales_map)
                     : launch_ring_form<linear_ring_tma_kernel<Weights, kHalves, false>>(
                           args, bytes, stream, weights, packed_map, scales_map);
  return true;
}

// The many-row kernel that takes the call (args: linear_mma_kernel's items), without the split sums.
template <typename Weights, int kHalves>
cudaError_t launch_mma_kernels(const MmaArgs& args, bool aligned_x, const Weights& weights,
                               const LinearMmaTuning& tuning, cudaStream_t stream) {
  const int64_t in_features = args.in_features;
  if constexpr (Weights::kRingCopies) {
    const int64_t bytes = RingLayout::bytes(kHalves * 8, args.chunks_per_split);
    if (tuning.ring_kernel && tuning.grid_blocks == 0 && whole_chunk_loads(in_features) &&
        weights.ring_aligned() && bytes <= kRingMaxBytes) {
      MmaArgs ring_args = args;
      ring_args.items =
          (args.out_features + kRingGroupFeatures - 1) / kRingGroupFeatures * args.splits * args.passes;
      cudaError_t status = cudaSuccess;
      if (launch_ring_tma<kHalves>(ring_args, weights, aligned_x, tuning, stream, status)) return status;
      if (aligned_x)
        return launch_ring_form<linear_ring_kernel<Weights, kHalves, true>>(ring_args, bytes, stream,
                                                                            weights);
      return launch_ring_form<linear_ring_kernel<Weights, kHalves, false>>(ring_args, bytes, stream, weights);
    }
  }
  // Vector scales come with whole chunks only: their kernels without whole chunks are never built.
  const bool whole = Weights::kAlwaysWhole || whole_chunk_loads(in_features);
  if constexpr (!Weights::kAlwaysWhole) {
    if (!whole && aligned_x)
      return launch_mma_kernel<Weights, kHalves, true, false>(args, weights, tuning, stream);
    if (!whole) return launch_mma_kernel<Weights, kHalves, false, false>(args, weights, tuning, stream);
  }
  if (aligned_x) return launch_mma_kernel<Weights, kHalves, true, true>(args, weights, tuning, stream);
  return launch_mma_kernel<Weights, kHalves, false, true>(args, weights, tuning, stream);
}

template <typename Weights, int kHalves>
cudaError_t launch_mma(const Tensor& out, const Tensor& x, int64_t out_features, int64_t in_features,
                       const Weights& weights, const LinearMmaWorkspace& workspace,
                       const LinearMmaTuning& tuning, cudaStream_t stream) {
  const MmaSplit split = mma_split(out_features, in_features, tuning.chunks_per_split);
  const int64_t groups = (out_features + kGroupFeatures - 1) / kGroupFeatures;
  const int64_t passes = row_passes(x.rows);
  const MmaArgs args{out.ptr<float>(),
                     out.stride,
                     x.ptr<const float>(),
                     x.stride,
                     x.rows,
                     out_features,
                     in_features,
                     static_cast<int>(passes),
                     static_cast<int>(split.splits),
                     split.chunks,
                     split.chunks_per_split,
                     groups * split.splits * passes,
                     workspace.partials};
  const SplitPartials partials{args.out, args.out_stride,
                               UnsummedSplits::packed(args.partials, args.splits, args.rows, out_features),
                               args.rows, out_features};
  return sum_split_partials(
      launch_mma_kernels<Weights, kHalves>(args, rows_aligned_to_float4(x), weights, tuning, stream),
      partials, workspace, stream);
}

constexpr int64_t kRowMaxStageBytes = 48 * 1024;  // no shared-memory opt-in

// The most a block stages (the whole of x, in the larger form): K <= 12288. A block stages its parts' slice
// (launch_row sizes that), never more.
int64_t whole_x_stage_bytes(int64_t in_features) {
  return std::max(row_stage_bytes<XForm::Bf16HiLo>((in_features + kChunkK - 1) / kChunkK),
                  row_stage_bytes<XForm::Fp16Scaled>((in_features + kChunkK - 1) / kChunkK));
}

// Whether the one-row kernel takes a call of `rows` rows of x (else the many-row kernel does).
bool one_row_kernel_takes(int64_t rows, int64_t in_features, const LinearMmaTuning& tuning) {
  return rows == 1 && tuning.one_row_kernel && whole_x_stage_bytes(in_features) <= kRowMaxStageBytes;
}

// The largest cluster of linear_row_kernel blocks of `shared` bytes the GPU can schedule: 8 portably, up to
// 16 with the non-portable attribute where the GPU allows it (the H200 does).
template <typename Weights, bool kWholeChunks>
cudaError_t max_row_cluster_blocks(size_t shared, int& blocks) {
  auto* const kernel = linear_row_kernel<Weights, kWholeChunks>;
  static const cudaError_t allowed =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  if (allowed != cudaSuccess) return allowed;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(kMaxClusterBlocks);
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = shared;
  return cudaOccupancyMaxPotentialClusterSize(&blocks, kernel, &config);
}

template <typename Weights>
cudaError_t launch_row(const Tensor& out, const Tensor& x, const float* up, int64_t out_features,
                       int64_t in_features, const Weights& weights, const LinearMmaWorkspace& workspace,
                       const LinearMmaTuning& tuning, cudaStream_t stream) {
  const MmaSplit split = mma_split(out_features, in_features, tuning.chunks_per_split);
  const int64_t tiles = (out_features + kTileFeatures - 1) / kTileFeatures;
  int device = 0, multiprocessors = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status == cudaSuccess)
    status = cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device);
  if (status != cudaSuccess) return status;
  // A unit's part of K: whole splits (the sums do not depend on it). The fewest splits a part, from two (the
  // most warps, each with its own chain of chunks), that keep the units in one wave of resident blocks; whole
  // K (no partials, no sums kernel) when no part does. One split a part everywhere was no faster in the step
  // (session 16).
  const int64_t resident_units = int64_t{kRowBlocksPerMultiprocessor} * multiprocessors * kWarps;
  int64_t splits_per_part = tuning.row_splits_per_part;
  if (splits_per_part <= 0) {
    splits_per_part = 2;
    while (splits_per_part < split.splits &&
           tiles * ((split.splits + splits_per_part - 1) / splits_per_part) > resident_units)
      ++splits_per_part;
  }
  const int64_t chunks_per_part = std::min(split.splits, splits_per_part) * split.chunks_per_split;
  const int64_t parts = (split.chunks + chunks_per_part - 1) / chunks_per_part;
  const int64_t units = tiles * parts;
  const int64_t splits_in_part = chunks_per_part / split.chunks_per_split;
  // A block's units span at most this many parts (whatever its first unit), so many chunks of x; one with
  // cluster sums.
  const int64_t spanned = std::min(parts, (kWarps - 1) / tiles + 2);
  const int64_t cluster_shared =
      row_stage_bytes<Weights::kX>(std::min(split.chunks, chunks_per_part)) +
      int64_t{row_cluster_sums_floats(static_cast<int>(parts), static_cast<int>(split.splits))} *
          static_cast<int64_t>(sizeof(float));
  // The kernel without bounds checks when every chunk lies inside K (never instantiated otherwise for weights
  // that always load whole chunks).
  const auto with_kernel = [&](auto call) {
    if constexpr (!Weights::kAlwaysWhole)
      if (!whole_chunk_loads(in_features)) return call(std::false_type{});
    return call(std::true_type{});
  };
  bool cluster_sums = tuning.row_cluster_sums && parts > 1 && parts <= kMaxClusterBlocks &&
                      cluster_shared <= kRowMaxStageBytes && clusters_supported();
  if (cluster_sums && parts > kPortableClusterBlocks) {
    int fits = 0;
    status = with_kernel([&](auto whole) {
      return max_row_cluster_blocks<Weights, decltype(whole)::value>(static_cast<size_t>(cluster_shared),
                                                                     fits);
    });
    if (status != cudaSuccess) return status;
    cluster_sums = parts <= fits;
  }
  const RowArgs args{out.ptr<float>(),
                     x.ptr<const float>(),
                     up,
                     out_features,
                     in_features,
                     static_cast<int>(split.chunks),
                     static_cast<int>(split.chunks_per_split),
                     static_cast<int>(split.splits),
                     static_cast<int>(chunks_per_part),
                     static_cast<int>(parts),
                     static_cast<int>(splits_in_part),
                     static_cast<int>(tiles),
                     static_cast<int>(units),
                     workspace.partials,
                     rows_aligned_to_float4(x),
                     cluster_sums};
  const dim3 grid(static_cast<unsigned>(cluster_sums ? (tiles + kWarps - 1) / kWarps * parts
                                                     : (units + kWarps - 1) / kWarps));
  const auto shared = static_cast<size_t>(
      cluster_sums ? cluster_shared
                   : row_stage_bytes<Weights::kX>(std::min(split.chunks, spanned * chunks_per_part)));
  const auto cluster = static_cast<unsigned>(cluster_sums ? parts : 1);
  status = with_kernel([&](auto whole) {
    return launch_kernel_in_clusters(linear_row_kernel<Weights, decltype(whole)::value>, grid, kThreads,
                                     shared, cluster, stream, args, weights);
  });
  if (parts == 1 || cluster_sums) return status;
  return sum_split_partials(
      status,
      {args.out, 0, UnsummedSplits::packed(args.partials, args.splits, 1, out_features), 1, out_features},
      workspace, stream);
}

template <typename Weights>
cudaError_t launch_for_rows(const Tensor& out, const Tensor& x, const float* up, int64_t out_features,
                            int64_t in_features, const Weights& weights, const LinearMmaWorkspace& workspace,
                            const LinearMmaTuning& tuning, cudaStream_t stream) {
  if (one_row_kernel_takes(x.rows, in_features, tuning))
    return launch_row(out, x, up, out_features, in_features, weights, workspace, tuning, stream);
  if (up != nullptr) return cudaErrorInvalidValue;  // the gated x: one row only (gated_linear_mma_supports)
  if (x.rows <= 8)
    return launch_mma<Weights, 1>(out, x, out_features, in_features, weights, workspace, tuning, stream);
  return launch_mma<Weights, 2>(out, x, out_features, in_features, weights, workspace, tuning, stream);
}

}  // namespace

bool linear_tensor_copies_supported() {
  return clusters_supported() && tensor_map_encoder() != nullptr;
}

size_t linear_mma_partial_floats(int64_t rows, int64_t out_features, int64_t in_features,
                                 int64_t chunks_per_split) {
  const MmaSplit split = mma_split(out_features, in_features, chunks_per_split);
  return split.splits == 1 ? 0 : static_cast<size_t>(split.splits * rows * out_features);
}

bool linear_mma_supports(const Tensor& x, const LinearWeight& w) {
  if (x.rows == 0 || x.rows > kLinearMmaMaxRows || w.in_features % kBlockK != 0) return false;
  // W4A16: 32-bit offsets into the packed words and the scales (PackedInt4Weights::Rows).
  const auto offsets_fit = [](const Tensor& t) {
    return t.rows * std::max(t.stride, t.cols) < (int64_t{1} << 32);
  };
  if (w.quantized())
    return w.group_size % kBlockK == 0 && (w.scales.dtype == DType::BF16 || w.scales.dtype == DType::F16) &&
           aligned(w.packed.data, 16) && (w.packed.rows <= 1 || w.packed.stride % 4 == 0) &&
           offsets_fit(w.packed) && offsets_fit(w.scales);
  return w.weight.dtype == DType::BF16 && aligned(w.weight.data, 16) &&
         (w.weight.rows <= 1 || w.weight.stride % 8 == 0);
}

namespace {

template <typename S, ScaleLoad kScales>
cudaError_t launch_packed_int4(const Tensor& out, const Tensor& x, const float* up, const LinearWeight& w,
                               const LinearMmaWorkspace& workspace, const LinearMmaTuning& tuning,
                               cudaStream_t stream) {
  const PackedInt4Weights<S, kScales> weights{w.packed.ptr<const uint32_t>(),
                                              w.packed.stride,
                                              w.scales.ptr<const S>(),
                                              w.scales.stride,
                                              static_cast<uint32_t>(w.group_size / kBlockK),
                                              w.in_features / kBlockK};
  return launch_for_rows(out, x, up, w.out_features, w.in_features, weights, workspace, tuning, stream);
}

template <typename S>
cudaError_t launch_packed_int4(const Tensor& out, const Tensor& x, const float* up, const LinearWeight& w,
                               const LinearMmaWorkspace& workspace, const LinearMmaTuning& tuning,
                               cudaStream_t stream) {
  const bool vector = w.group_size == kBlockK && w.in_features % kChunkK == 0 && aligned(w.scales.data, 8) &&
                      (w.scales.rows <= 1 || w.scales.stride % 4 == 0);
  if (vector) return launch_packed_int4<S, ScaleLoad::Vector>(out, x, up, w, workspace, tuning, stream);
  if (w.group_size == kChunkK)
    return launch_packed_int4<S, ScaleLoad::PerChunk>(out, x, up, w, workspace, tuning, stream);
  return launch_packed_int4<S, ScaleLoad::PerBlock>(out, x, up, w, workspace, tuning, stream);
}

cudaError_t launch_linear_mma(const Tensor& out, const Tensor& x, const float* up, const LinearWeight& w,
                              const LinearMmaWorkspace& workspace, cudaStream_t stream,
                              const LinearMmaTuning& tuning) {
  if (workspace.unsummed_splits != nullptr) *workspace.unsummed_splits = 0;  // until a call leaves some
  if (w.quantized()) {
    if (w.scales.dtype == DType::BF16)
      return launch_packed_int4<__nv_bfloat16>(out, x, up, w, workspace, tuning, stream);
    return launch_packed_int4<__half>(out, x, up, w, workspace, tuning, stream);
  }
  const Bf16Weights weights{w.weight.ptr<const uint4>(), w.weight.stride / 8, w.in_features / kBlockK};
  return launch_for_rows(out, x, up, w.out_features, w.in_features, weights, workspace, tuning, stream);
}

}  // namespace

cudaError_t launch_linear_mma(const Tensor& out, const Tensor& x, const LinearWeight& w,
                              const LinearMmaWorkspace& workspace, cudaStream_t stream,
                              const LinearMmaTuning& tuning) {
  return launch_linear_mma(out, x, nullptr, w, workspace, stream, tuning);
}

bool gated_linear_mma_supports(const Tensor& gate_up, const LinearWeight& w) {
  return gate_up.cols == 2 * w.in_features && one_row_kernel_takes(gate_up.rows, w.in_features, {}) &&
         linear_mma_supports(gate_up.cols_view(0, w.in_features), w);
}

cudaError_t launch_gated_linear_mma(const Tensor& out, const Tensor& gate_up, const LinearWeight& w,
                                    const LinearMmaWorkspace& workspace, cudaStream_t stream) {
  // The up half shares the gate half's row stride and, in_features being a multiple of 32, its alignment.
  const Tensor gate = gate_up.cols_view(0, w.in_features),
               up = gate_up.cols_view(w.in_features, w.in_features);
  return launch_linear_mma(out, gate, up.ptr<const float>(), w, workspace, stream, {});
}

}  // namespace qspec::cuda
