// The gated delta rule over a long sequence (prefill) in chunks of C = 64 tokens: HF's and FLA's WY form, the
// algorithm of the CPU reference (cpu/gated_delta_rule.cpp, chunked_head), with the chunk matrix products on
// tensor cores. Per value head and chunk, with G the cumulative log-decay inside the chunk:
//   A   = strict_lower(beta_i k_i.k_j e^(G_i - G_j)),  Aqk = lower(q_i.k_j e^(G_i - G_j)),  T = (I + A)^-1
//   W   = T (k beta e^G),  U = T (v beta)                                   (depend only on the chunk)
//   Q'  = q e^G - Aqk W,   U' = Aqk U                                       (ditto)
//   out = U' + Q' S,       S <- e^(G_last) S + (k e^(G_last - G))^T (U - W S)
// which is HF's  out = (q e^G) S + Aqk (U - W S)  with the chunk-local products folded into Q' and U'.
//
// Two kernels per segment of up to kChunksPerSegment chunks:
//  - prepare (grid chunks x value heads, fully parallel): L2-normalises q and k, builds A, Aqk, T (16 x 16
//    diagonal blocks by substitution, then the blocks below), W, U, Q', U' and writes them to a workspace:
//    W;Q' and (k e^(G_last-G))^T in mma fragment order (one coalesced 16-byte load per lane and tile later),
//    U;U' row-major, and G_last.
//  - state pass (grid value heads x slabs of 32 state columns, sequential over the chunks): keeps its
//    [dk, 32] slab of S in mma accumulators, per chunk X = [W; Q'] S (128 x 32 x dk), out = U' + X_Q',
//    v_new = U - X_W, S = e^(G_last) S + K~^T v_new (dk x 32 x 64); the next chunk's W;Q' and U;U' are
//    copied into shared memory (cp.async) during the state update.
// Every product that feeds the state or the output runs on m16n8k16 with fp32 accumulation, its operands in
// kParts BF16 parts, chosen per call (launchers.h):
//  - up to kGdnChunkedSplitMaxTokens tokens (two chunks, where it costs little): split BF16, a_hi b_hi +
//    a_hi b_lo + a_lo b_hi with hi = bf16(x), lo = bf16(x - hi): ~2^-17 relative per operand (half the mma
//    instructions of the 3xTF32 m16n8k8 form this file used before);
//  - longer calls, whose linears are cuBLAS BF16 products: each operand rounded to BF16 once (FLA's and
//    vLLM's precision, ~2^-9 relative per operand), a third of the mma instructions, no splitting, half the
//    reads of the pre-split fragments (W;Q' and K~^T; U;U' stay fp32): prefill of 8,192 tokens 168 -> 156 ms
//    on the H200 (session 9).
// The state itself, the decays, T = (I + A)^-1 and every sum stay fp32. The state pass's A operands W;Q'
// and K~^T are split (or rounded) once, by the prepare kernel. Head dims are
// padded with zeros to D = 32, 64 or 128 (a template parameter); rows past the sequence are zeros, as in HF.
//
// History (H200, Qwen3.5-4B layer: 32 value heads, dk = dv = 128). 3xTF32: 0.44 ms a layer at T = 2048 (ncu:
// prepare 364 us, latency-bound at ~1.1 IPC with the tensor pipe ~11% busy; state pass 215 us, tensor pipe
// ~40%), 1.77 ms at 8192. Split BF16 (session 8's profile): prepare 234 us and state 113 us a layer at 2048;
// ncu: prepare 298 us, 86K instructions per (chunk, head) at 1.7 IPC, the tensor pipe 8% busy (the splitting
// of fp32 operands at every use), state pass 138 us at 32%. BF16 beyond two chunks (session 9): 24 layers at
// 8,192 tokens prepare 22.3 -> 18.7 ms, state 10.7 -> 8.0 ms.
#include <cmath>
#include <cstdint>

#include <cuda_bf16.h>

#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/launchers.h"
#include "backend/cuda/pdl.cuh"

namespace qspec::cuda {

namespace {

constexpr int kChunk = 64;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarpSize;
constexpr int kSlab = 32;              // state columns per block of the state pass
constexpr int kSlabTiles = kSlab / 8;  // its n8 tiles
constexpr int kChunksPerSegment = 32;  // 2,048 tokens of workspace at a time
constexpr int kBlock = 16;             // T = (I + A)^-1 is built in blocks of 16 x 16
constexpr int kSquareLd = kChunk + 8;  // row stride of [C, C] tiles: float2 rows g..g + 3 on other banks
constexpr int kSplitLd = kSlab + 8;  // row stride of k-major split operands: rows t and t + 1 on other banks
constexpr float kL2NormEps = 1e-6f;

// ---- split-BF16 mma.sync m16n8k16 (sm_80+): x = hi + lo, hi = bf16(x), lo = bf16(x - hi) (x - hi - lo ~
// 2^-17 x); a product is hi*hi + hi*lo + lo*hi in fp32 (half the mma instructions of 3xTF32 on m16n8k8).
// Lane = (g = lane / 4, t = lane % 4). In the standard k order (the prepare kernel's products):
// A (16 x 16): reg0 = A[g][2t, 2t+1], reg1 = A[g+8][2t, 2t+1], reg2 = A[g][2t+8, 2t+9], reg3 = A[g+8][2t+8,
// 2t+9]; B (16 x 8): b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]; C: c0, c1 = C[g][2t, 2t+1], c2, c3 =
// C[g+8][2t, 2t+1]. The state pass permutes the k order inside each 16-wide k tile: a register pair holds k
// = p and p + 8 (p = t for A registers 0, 1 and b0; p = t + 4 for A registers 2, 3 and b1), so that an
// accumulator lane's rows g and g + 8 form one B pair and S and v_new go to shared memory packed, without
// shuffles. Its A matrices are stored pre-split by the prepare kernel: tile (m16, k16) = mt * (K / 16) + kt
// holds the 32 lanes' hi registers (one uint4 each), then their lo registers.

__device__ inline void mma_bf16(float (&d)[4], const uint4& a, uint32_t b0, uint32_t b1) {
  const uint32_t registers[4] = {a.x, a.y, a.z, a.w};
  cuda::mma_bf16(d, registers, b0, b1);  // device_math.cuh's (this name hides it here)
}

struct SplitA {
  uint4 hi, lo;
};
struct SplitB {
  uint32_t hi0, hi1, lo0, lo1;
};

// d += a b, small terms first (one part: the hi product alone).
template <int kParts>
__device__ inline void mma_split_bf16(float (&d)[4], const SplitA& a, const SplitB& b) {
  if constexpr (kParts == 2) {
    mma_bf16(d, a.lo, b.hi0, b.hi1);
    mma_bf16(d, a.hi, b.lo0, b.lo1);
  }
  mma_bf16(d, a.hi, b.hi0, b.hi1);
}

// A fragment (rows m0.., columns k0.., standard k order) of a row-major fp32 tile in shared memory.
template <int kParts>
__device__ inline SplitA load_split_a(const float* tile, int ld, int m0, int k0, int g, int t) {
  const float* p = tile + (m0 + g) * ld + k0 + 2 * t;
  const float2 r0 = *reinterpret_cast<const float2*>(p), r1 = *reinterpret_cast<const float2*>(p + 8 * ld);
  const float2 r2 = *reinterpret_cast<const float2*>(p + 8),
               r3 = *reinterpret_cast<const float2*>(p + 8 * ld + 8);
  SplitA a;
  split_bf16_pair<kParts>(r0.x, r0.y, a.hi.x, a.lo.x);
  split_bf16_pair<kParts>(r1.x, r1.y, a.hi.y, a.lo.y);
  split_bf16_pair<kParts>(r2.x, r2.y, a.hi.z, a.lo.z);
  split_bf16_pair<kParts>(r3.x, r3.y, a.hi.w, a.lo.w);
  return a;
}

// A fragment (rows m0.., columns k0.., the permuted k order) of a row-major fp32 tile in shared memory.
template <int kParts>
__device__ inline SplitA load_split_a_permuted(const float* tile, int ld, int m0, int k0, int g, int t) {
  const float* p = tile + (m0 + g) * ld + k0 + t;
  SplitA a;
  split_bf16_pair<kParts>(p[0], p[8], a.hi.x, a.lo.x);
  split_bf16_pair<kParts>(p[8 * ld], p[8 * ld + 8], a.hi.y, a.lo.y);
  split_bf16_pair<kParts>(p[4], p[12], a.hi.z, a.lo.z);
  split_bf16_pair<kParts>(p[8 * ld + 4], p[8 * ld + 12], a.hi.w, a.lo.w);
  return a;
}

// B fragment from its four values B[2t][g], B[2t+1][g], B[2t+8][g], B[2t+9][g].
template <int kParts>
__device__ inline SplitB split_b(float k0, float k1, float k8, float k9) {
  SplitB b;
  split_bf16_pair<kParts>(k0, k1, b.hi0, b.lo0);
  split_bf16_pair<kParts>(k8, k9, b.hi1, b.lo1);
  return b;
}

// d += a b with the hi * hi products in `main` and the two corrections in `correction` (shorter chains;
// one part: the hi product alone).
template <int kParts>
__device__ inline void mma_split_bf16(float (&main)[4], float (&correction)[4], const uint4& a_hi,
                                      const uint4& a_lo, uint32_t b_hi0, uint32_t b_hi1, uint32_t b_lo0,
                                      uint32_t b_lo1) {
  if constexpr (kParts == 2) {
    mma_bf16(correction, a_lo, b_hi0, b_hi1);
    mma_bf16(correction, a_hi, b_lo0, b_lo1);
  }
  mma_bf16(main, a_hi, b_hi0, b_hi1);
}

// The totals over the warp of N values per lane (N a power of two up to 32), bit for bit warp_sum's (the same
// butterfly over lane offsets 16, 8, .., 1) with one shuffle per value left instead of one per value and
// offset: at each offset the two lanes of a pair split the values left between them. Returns the total this
// lane ends with: value k's in lanes k * 32 / N up to (k + 1) * 32 / N.
template <int N, int kOffset = kWarpSize / 2>
__device__ inline float split_warp_sums(const float (&values)[N], int lane) {
  static_assert(N >= 1 && N <= 2 * kOffset && (N & (N - 1)) == 0);
  if constexpr (N == 1) {
    const float sum = values[0] + __shfl_xor_sync(0xffffffffu, values[0], kOffset);
    if constexpr (kOffset == 1)
      return sum;
    else
      return split_warp_sums<1, kOffset / 2>({sum}, lane);
  } else {
    const bool upper = (lane & kOffset) != 0;  // these lanes keep the upper half
    float kept[N / 2];
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
      const float keep = upper ? values[k + N / 2] : values[k], send = upper ? values[k] : values[k + N / 2];
      kept[k] = keep + __shfl_xor_sync(0xffffffffu, send, kOffset);
    }
    if constexpr (kOffset == 1)
      return kept[0];
    else
      return split_warp_sums<N / 2, kOffset / 2>(kept, lane);
  }
}

// One 8-byte store to global memory (a float2 assignment of two accumulator elements compiled to two stores).
// Nothing in the kernel reads what it writes: no memory clobber (volatile: a store has no outputs to keep
// it).
__device__ inline void store_global_pair(float* address, float x, float y) {
  asm volatile("st.global.v2.f32 [%0], {%1, %2};" ::"l"(address), "f"(x), "f"(y));
}

// The lower block triangle of a [C, C] matrix (T, Aqk) as A fragments (standard k order) in shared memory,
// made once rather than by every warp that reads it: tile (mt, kt <= mt) is number mt (mt + 1) / 2 + kt, its
// kParts register sets of 32 lanes (hi, then lo) one after the other.
constexpr int kTriangleTiles = kChunk / 16 * (kChunk / 16 + 1) / 2;

__device__ inline int triangle_tile(int mt, int kt) {
  return mt * (mt + 1) / 2 + kt;
}

template <int kParts>
__device__ inline void store_triangle_fragment(uint4* fragments, int tile, int lane, const SplitA& a) {
  fragments[tile * kParts * kWarpSize + lane] = a.hi;
  if constexpr (kParts == 2) fragments[(tile * kParts + 1) * kWarpSize + lane] = a.lo;
}

template <int kParts>
__device__ inline SplitA load_triangle_fragment(const uint4* fragments, int mt, int kt, int lane) {
  const uint4* tile = fragments + triangle_tile(mt, kt) * kParts * kWarpSize + lane;
  SplitA a;
  a.hi = tile[0];
  if constexpr (kParts == 2) a.lo = tile[kWarpSize];
  return a;
}

// Stores the [M, K] matrix element(m, k) as pre-split A fragments (layout above; one part: the hi registers
// only, the lo slots left unwritten).
template <int M, int K, int kParts, class Element>
__device__ inline void store_split_fragments(uint4* destination, const Element& element, int tid,
                                             int threads) {
  for (int index = tid; index < (M / 16) * (K / 16) * kWarpSize; index += threads) {
    const int tile = index / kWarpSize, l = index % kWarpSize;
    const int m = (tile / (K / 16)) * 16 + l / 4, k = (tile % (K / 16)) * 16 + l % 4;
    uint4 hi, lo;
    split_bf16_pair<kParts>(element(m, k), element(m, k + 8), hi.x, lo.x);
    split_bf16_pair<kParts>(element(m + 8, k), element(m + 8, k + 8), hi.y, lo.y);
    split_bf16_pair<kParts>(element(m, k + 4), element(m, k + 12), hi.z, lo.z);
    split_bf16_pair<kParts>(element(m + 8, k + 4), element(m + 8, k + 12), hi.w, lo.w);
    destination[2 * tile * kWarpSize + l] = hi;
    if constexpr (kParts == 2) destination[(2 * tile + 1) * kWarpSize + l] = lo;
  }
}

// The workspace of one segment. Record r = head * chunks + chunk holds:
//   wq     [2C, D] as pre-split BF16 A fragments (store_split_fragments): rows 0..C-1 = W, rows C..2C-1 = Q'
//   k_t    [D, C]  as pre-split BF16 A fragments: (k e^(G_last - G))^T
//   uu     [2C, D] row-major fp32: rows 0..C-1 = U, rows C..2C-1 = U'
//   g_last [1]
// A split fragment tile takes as many 32-bit words as the fp32 tile.
struct ChunkWorkspace {
  float* wq;
  float* k_t;
  float* uu;
  float* g_last;
};

template <int D>
constexpr size_t record_floats() {
  return 2 * kChunk * D + D * kChunk + 2 * kChunk * D + 1;
}

ChunkWorkspace chunk_workspace(float* base, int records, int head_dim) {
  const size_t n = static_cast<size_t>(records) * kChunk * static_cast<size_t>(head_dim);
  return {base, base + 2 * n, base + 3 * n, base + 5 * n};
}

template <int D>
struct PrepareLayout {
  static constexpr int kRowLd = D + 4;  // q, k, v rows: rows g and g + 1 on other banks
  static constexpr int kQuery = 0;
  static constexpr int kKey = kQuery + kChunk * kRowLd;
  static constexpr int kValue = kKey + kChunk * kRowLd;
  static constexpr int kA = kValue + kChunk * kRowLd;   // then T's A fragments (store_triangle_fragment)
  static constexpr int kAqk = kA + kChunk * kSquareLd;  // A fragments (store_triangle_fragment), 2 parts
  static constexpr int kInverse = kAqk + kTriangleTiles * 2 * kWarpSize * 4;
  static constexpr int kCumulativeG = kInverse + kChunk * kSquareLd;
  static constexpr int kBeta = kCumulativeG + kChunk;
  static constexpr int kGrowth = kBeta + kChunk;         // e^G
  static constexpr int kKeyDecay = kGrowth + kChunk;     // e^(G_last - G)
  static constexpr int kBlockSums = kKeyDecay + kChunk;  // sum_k A_ik T_kj of up to 3 blocks of T
  static constexpr int kFloats = kBlockSums + 3 * kBlock * kBlock;
};

// Warps of the prepare kernel: 16 where the n tiles of stages 4 and 5 (2D / 8) go round them, else 8.
template <int D>
__host__ __device__ constexpr int prepare_warps() {
  return D >= 64 ? 16 : 8;
}

// One (chunk, value head) of a segment: everything of the chunk that does not depend on the state.
template <int D, int kParts>
__global__ void __launch_bounds__(prepare_warps<D>() * kWarpSize, 1)
    gdn_chunk_prepare_kernel(const float* qkv, int64_t qkv_stride, const float* beta, int64_t beta_stride,
                             const float* g, int64_t g_stride, int64_t tokens, int num_key_heads,
                             int num_value_heads, int dk, int dv, float query_scale, ChunkWorkspace ws) {
  wait_for_previous_kernel();
  allow_next_kernel();
  using L = PrepareLayout<D>;
  constexpr int ld = L::kRowLd;
  constexpr int kPrepareWarps = prepare_warps<D>(), kPrepareThreads = kPrepareWarps * kWarpSize;
  extern __shared__ float shared[];
  float* query = shared + L::kQuery;
  float* key = shared + L::kKey;
  float* value = shared + L::kValue;
  float* a = shared + L::kA;
  auto* aqk_fragments = reinterpret_cast<uint4*>(shared + L::kAqk);
  auto* inverse_fragments = reinterpret_cast<uint4*>(a);  // T's, over A once T is complete
  float* inverse = shared + L::kInverse;
  float* cumulative_g = shared + L::kCumulativeG;
  float* row_beta = shared + L::kBeta;
  float* growth = shared + L::kGrowth;
  float* key_decay = shared + L::kKeyDecay;
  float* block_sums = shared + L::kBlockSums;

  const int chunk = static_cast<int>(blockIdx.x), head = static_cast<int>(blockIdx.y);
  const int chunks = static_cast<int>(gridDim.x);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int gq = lane / 4, tq = lane % 4;
  const int64_t first = static_cast<int64_t>(chunk) * kChunk;
  const int len = static_cast<int>(tokens - first < kChunk ? tokens - first : kChunk);
  const int key_head = head / (num_value_heads / num_key_heads);
  const int64_t q_offset = static_cast<int64_t>(key_head) * dk;
  const int64_t k_offset = static_cast<int64_t>(num_key_heads) * dk + q_offset;
  const int64_t v_offset = 2 * static_cast<int64_t>(num_key_heads) * dk + static_cast<int64_t>(head) * dv;

  // 1. q, k (L2-normalised, q scaled), v; beta and the cumulative log-decay. Rows past the end are zeros. A
  // warp takes rows warp + 8 rr; all its loads are issued before the first row's sums.
  constexpr int kRowsPerWarp = kChunk / kPrepareWarps, kPerLane = D / kWarpSize;
  {
    float qv[kRowsPerWarp][kPerLane], kv[kRowsPerWarp][kPerLane], vv[kRowsPerWarp][kPerLane];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp + kPrepareWarps * rr;
      // One 64-bit address per row and operand; the lane's elements at constant offsets from it.
      const float* row = qkv + (first + r) * qkv_stride + lane;
      const float *query_row = row + q_offset, *key_row = row + k_offset, *value_row = row + v_offset;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int i = lane + kWarpSize * e;
        qv[rr][e] = r < len && i < dk ? query_row[kWarpSize * e] : 0.0f;
        kv[rr][e] = r < len && i < dk ? key_row[kWarpSize * e] : 0.0f;
        vv[rr][e] = r < len && i < dv ? value_row[kWarpSize * e] : 0.0f;
      }
    }
    if (tid < kChunk) {
      row_beta[tid] = tid < len ? beta[(first + tid) * beta_stride + head] : 0.0f;
      cumulative_g[tid] = tid < len ? g[(first + tid) * g_stride + head] : 0.0f;
    }
    // The sums of squares of q and k of each row (value 2 rr + 0, 1), all summed over the warp at once; each
    // lane takes the norm of the total it holds and the rows' factors are read from the lanes holding them.
    constexpr int kSums = 2 * kRowsPerWarp;
    float squares[kSums] = {};
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr)
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        squares[2 * rr] += qv[rr][e] * qv[rr][e];
        squares[2 * rr + 1] += kv[rr][e] * kv[rr][e];
      }
    const float factor = 1.0f / sqrtf(split_warp_sums(squares, lane) + kL2NormEps);
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = warp + kPrepareWarps * rr;
      const float query_factor = __shfl_sync(0xffffffffu, factor, 2 * rr * (kWarpSize / kSums));
      const float key_factor = __shfl_sync(0xffffffffu, factor, (2 * rr + 1) * (kWarpSize / kSums));
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int i = lane + kWarpSize * e;
        query[r * ld + i] = qv[rr][e] * query_factor * query_scale;
        key[r * ld + i] = kv[rr][e] * key_factor;
        value[r * ld + i] = vv[rr][e];
      }
    }
  }
  __syncthreads();
  if (tid == 0) {
    float running = 0.0f;  // the CPU's order: a running fp32 sum
    for (int r = 0; r < kChunk; ++r) {
      running += cumulative_g[r];
      cumulative_g[r] = running;
    }
  }
  __syncthreads();

  // 2. K K^T and Q K^T (64 x 64 x D), lower triangle only; A and Aqk with beta and the decay. Tiles above the
  // diagonal 16 x 16 blocks are never read: neither computed nor stored (whole warps skip).
  {
    if (tid < kChunk) {
      growth[tid] = expf(cumulative_g[tid]);
      key_decay[tid] = expf(cumulative_g[kChunk - 1] - cumulative_g[tid]);
    }
    constexpr int kTiles = kChunk / 8 / (kPrepareWarps / 4);  // n tiles per warp
    static_assert(kTiles % 2 == 0, "the Aqk fragments pair n tiles");
    const int mt = warp % 4, n_base = (warp / 4) * kTiles * 8;
    const auto below_diagonal_block = [&](int n0) { return n0 <= 16 * mt + 15; };
    if (below_diagonal_block(n_base)) {
      float kk[kTiles][4] = {}, qk[kTiles][4] = {};
#pragma unroll 2
      for (int k0 = 0; k0 < D; k0 += 16) {
        const SplitA ak = load_split_a_permuted<kParts>(key, ld, 16 * mt, k0, gq, tq);
        const SplitA aq = load_split_a_permuted<kParts>(query, ld, 16 * mt, k0, gq, tq);
#pragma unroll
        for (int nt = 0; nt < kTiles; ++nt) {
          const int n0 = n_base + 8 * nt;
          if (!below_diagonal_block(n0)) continue;
          const float* p = key + (n0 + gq) * ld + k0 + tq;  // B[k][n] = K[n][k], permuted k order
          const SplitB b = split_b<kParts>(p[0], p[8], p[4], p[12]);
          mma_split_bf16<kParts>(kk[nt], ak, b);
          mma_split_bf16<kParts>(qk[nt], aq, b);
        }
      }
      // Rows i = 16 mt + gq + 8 h, columns j = n0 + 2 tq + c. The decay is taken for every pair, without a
      // branch: where j > i (e^(G_i - G_j) >= 1, perhaps infinite) it is not used. Aqk goes straight to its A
      // fragments: the accumulators of n tiles 2b and 2b + 1 are the fragment of 16-column block b.
      const int i0 = 16 * mt + gq;
      const float row_g[2] = {cumulative_g[i0], cumulative_g[i0 + 8]};
      const float beta_i[2] = {row_beta[i0], row_beta[i0 + 8]};
      float aqk_values[kTiles][4];
#pragma unroll
      for (int nt = 0; nt < kTiles; ++nt) {
        const int n0 = n_base + 8 * nt, j0 = n0 + 2 * tq;
        if (!below_diagonal_block(n0)) continue;
        const float2 column_g = *reinterpret_cast<const float2*>(cumulative_g + j0);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int i = i0 + 8 * h;
          const float decay0 = expf(row_g[h] - column_g.x), decay1 = expf(row_g[h] - column_g.y);
          const float* kk_pair = kk[nt] + 2 * h;
          const float* qk_pair = qk[nt] + 2 * h;
          *reinterpret_cast<float2*>(a + i * kSquareLd + j0) =
              make_float2(j0 < i ? kk_pair[0] * beta_i[h] * decay0 : 0.0f,
                          j0 + 1 < i ? kk_pair[1] * beta_i[h] * decay1 : 0.0f);
          aqk_values[nt][2 * h] = j0 <= i ? qk_pair[0] * decay0 : 0.0f;
          aqk_values[nt][2 * h + 1] = j0 + 1 <= i ? qk_pair[1] * decay1 : 0.0f;
        }
      }
#pragma unroll
      for (int nt = 0; nt < kTiles; nt += 2) {
        const int n0 = n_base + 8 * nt;
        if (!below_diagonal_block(n0)) continue;
        const float(&left)[4] = aqk_values[nt];
        const float(&right)[4] = aqk_values[nt + 1];
        SplitA fragment;
        split_bf16_pair<kParts>(left[0], left[1], fragment.hi.x, fragment.lo.x);
        split_bf16_pair<kParts>(left[2], left[3], fragment.hi.y, fragment.lo.y);
        split_bf16_pair<kParts>(right[0], right[1], fragment.hi.z, fragment.lo.z);
        split_bf16_pair<kParts>(right[2], right[3], fragment.hi.w, fragment.lo.w);
        store_triangle_fragment<kParts>(aqk_fragments, triangle_tile(mt, n0 / 16), lane, fragment);
      }
    }
  }
  __syncthreads();

  const int record = head * chunks + chunk;

  // 3. (k e^(G_last - G))^T to the workspace in fragment order, and T = (I + A)^-1 in blocks of 16 (L = I +
  // A): the diagonal blocks T_ii = L_ii^-1 by substitution (row r of T_ii is e_r - sum_{p<r} A[r][p] T[p]), a
  // thread per column of T holding it in registers; then the blocks below by their distance d from the
  // diagonal: T_ij = -T_ii sum_{j<=k<i} A_ik T_kj, a thread per 4 columns of a row (a float4 of T per k, so
  // one load of A or T serves 4 products). Every sum runs in the order of the scalar form this replaced (a
  // thread per element; the substitution's p sum split over 4 lanes), so T is bit for bit the same. Blocks
  // above the diagonal are never read.
  {
    store_split_fragments<D, kChunk, kParts>(
        reinterpret_cast<uint4*>(ws.k_t + static_cast<size_t>(record) * D * kChunk),
        [&](int i, int t) { return key[t * ld + i] * key_decay[t]; }, tid, kPrepareThreads);
    if (tid < kChunk) {  // whole warps
      const int column = tid % kBlock, block_first = tid - column;
      float t[kBlock];  // column `column` of the diagonal block: zeros above the 1
#pragma unroll
      for (int p = 0; p < kBlock; ++p) t[p] = p == column ? 1.0f : 0.0f;
#pragma unroll
      for (int i = 1; i < kBlock; ++i) {
        const float* a_row = a + (block_first + i) * kSquareLd + block_first;
        // The p sum in four parts by p mod 4, ascending (rows p < column add zeros, leaving a part +0).
        float parts[4] = {};
#pragma unroll
        for (int p4 = 0; p4 < i; p4 += 4) {
          const float4 a4 = *reinterpret_cast<const float4*>(a_row + p4);
          const float a_values[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
          for (int e = 0; e < 4 && p4 + e < i; ++e) parts[e] += a_values[e] * t[p4 + e];
        }
        // The parts added as the 4 lanes starting at p = column + lane did: (lanes 0 + 1) + (lanes 2 + 3).
        const float sum = column % 2 == 0 ? (parts[0] + parts[1]) + (parts[2] + parts[3])
                                          : (parts[1] + parts[2]) + (parts[3] + parts[0]);
        if (column < i) t[i] = -sum;
      }
#pragma unroll
      for (int p = 0; p < kBlock; ++p) inverse[(block_first + p) * kSquareLd + tid] = t[p];
    }
    __syncthreads();
    constexpr int kBlocks = kChunk / kBlock, kBlockSize = kBlock * kBlock, kQuads = kBlock / 4;
    static_assert((kBlocks - 1) * kBlock * kQuads <= kPrepareThreads,
                  "a thread per item of the first diagonal");
    for (int d = 1; d < kBlocks; ++d) {
      // Item tid = (j, r, quad): row r of block (j + d, j), its columns 4 quad..4 quad + 3.
      const bool has_item = tid < (kBlocks - d) * kBlock * kQuads;
      const int j = tid / (kBlock * kQuads), r = tid / kQuads % kBlock, quad = tid % kQuads, i = j + d;
      const int row = kBlock * i + r, column = kBlock * j + 4 * quad;
      float4* block_sum = reinterpret_cast<float4*>(block_sums) + tid;  // [j][r][quad]
      if (has_item) {
        float4 sum = {};
        for (int q = kBlock * j; q < kBlock * i; q += 4) {
          const float4 a4 = *reinterpret_cast<const float4*>(a + row * kSquareLd + q);
          const float a_values[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float4 t4 = *reinterpret_cast<const float4*>(inverse + (q + e) * kSquareLd + column);
            sum.x += a_values[e] * t4.x;
            sum.y += a_values[e] * t4.y;
            sum.z += a_values[e] * t4.z;
            sum.w += a_values[e] * t4.w;
          }
        }
        *block_sum = sum;
      }
      __syncthreads();
      if (has_item) {
        // All 16 m of T_ii's row: past m = r its zeros add nothing.
        const float4* sums_of_block = reinterpret_cast<const float4*>(block_sums) + j * kBlockSize / 4 + quad;
        float4 sum = {};
#pragma unroll
        for (int m4 = 0; m4 < kBlock; m4 += 4) {
          const float4 t4 = *reinterpret_cast<const float4*>(inverse + row * kSquareLd + kBlock * i + m4);
          const float t_values[4] = {t4.x, t4.y, t4.z, t4.w};
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float4 s4 = sums_of_block[(m4 + e) * kQuads];
            sum.x += t_values[e] * s4.x;
            sum.y += t_values[e] * s4.y;
            sum.z += t_values[e] * s4.z;
            sum.w += t_values[e] * s4.w;
          }
        }
        *reinterpret_cast<float4*>(inverse + row * kSquareLd + column) =
            make_float4(-sum.x, -sum.y, -sum.z, -sum.w);
      }
      __syncthreads();
    }
    // T's lower block triangle as the A fragments of stage 4, over A (read no more).
    for (int index = tid; index < kTriangleTiles * kWarpSize; index += kPrepareThreads) {
      const int tile = index / kWarpSize, l = index % kWarpSize;
      int mt = 0;
      while (triangle_tile(mt + 1, 0) <= tile) ++mt;
      const int kt = tile - triangle_tile(mt, 0);
      store_triangle_fragment<kParts>(
          inverse_fragments, tile, l,
          load_split_a<kParts>(inverse, kSquareLd, 16 * mt, 16 * kt, l / 4, l % 4));
    }
    __syncthreads();
  }

  // Stages 4 and 5: C = L [X | Y] (64 x 2D x 64, L lower triangular: a k step of 8 meets m tile mt only when
  // k < 16 mt + 16). A warp takes all 4 m tiles of kTilesPerWarp n tiles, all in one half (X or Y), so every
  // warp does the same work; acc[mt][nt] is its tile (mt, warp * kTilesPerWarp + nt).
  constexpr int kTilesPerWarp = 2 * D / 8 / kPrepareWarps;
  const int half = warp / (kPrepareWarps / 2), n_first = (warp % (kPrepareWarps / 2)) * kTilesPerWarp * 8;
  // This lane's first element of U (row gq, columns n_first + 2 tq, +1): its tiles at constant offsets.
  float* uu_lane = ws.uu + static_cast<size_t>(record) * 2 * kChunk * D + gq * D + n_first + 2 * tq;
  // Accumulator tiles (4 m tiles, kTilesPerWarp n tiles) to rows of U or U' (D floats apart), a pair a store.
  const auto store_tile_pairs = [](float* lane_first, const float(&tiles)[4][kTilesPerWarp][4]) {
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < kTilesPerWarp; ++nt) {
        float* pair = lane_first + 16 * mt * D + 8 * nt;
        store_global_pair(pair, tiles[mt][nt][0], tiles[mt][nt][1]);
        store_global_pair(pair + 8 * D, tiles[mt][nt][2], tiles[mt][nt][3]);
      }
  };

  // 4. [W | U] = T [k beta e^G | v beta].
  {
    float acc[4][kTilesPerWarp][4] = {};
#pragma unroll
    for (int k0 = 0; k0 < kChunk; k0 += 16) {
      const int p = k0 + 2 * tq;  // rows p, p + 1, p + 8, p + 9 of the B operand
      float scale[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = p + e % 2 + 8 * (e / 2);
        scale[e] = half == 0 ? row_beta[row] * growth[row] : row_beta[row];
      }
      const float* source = half == 0 ? key : value;
      SplitB b[kTilesPerWarp];
#pragma unroll
      for (int nt = 0; nt < kTilesPerWarp; ++nt) {
        const float* column = source + p * ld + n_first + 8 * nt + gq;
        b[nt] = split_b<kParts>(column[0] * scale[0], column[ld] * scale[1], column[8 * ld] * scale[2],
                                column[9 * ld] * scale[3]);
      }
#pragma unroll
      for (int mt = k0 / 16; mt < 4; ++mt) {
        const SplitA at = load_triangle_fragment<kParts>(inverse_fragments, mt, k0 / 16, lane);
#pragma unroll
        for (int nt = 0; nt < kTilesPerWarp; ++nt) mma_split_bf16<kParts>(acc[mt][nt], at, b[nt]);
      }
    }
    __syncthreads();
    float* target = half == 0 ? key : value;
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < kTilesPerWarp; ++nt) {
        const int i = 16 * mt + gq, j = n_first + 8 * nt + 2 * tq;
        const float* c = acc[mt][nt];
        *reinterpret_cast<float2*>(target + i * ld + j) = make_float2(c[0], c[1]);
        *reinterpret_cast<float2*>(target + (i + 8) * ld + j) = make_float2(c[2], c[3]);
      }
    if (half == 1) store_tile_pairs(uu_lane, acc);
  }
  __syncthreads();

  // 5. Aqk [W | U]: Q' = q e^G - Aqk W (into `query`), U' = Aqk U (to the workspace).
  {
    float acc[4][kTilesPerWarp][4] = {};
    const float* source = half == 0 ? key : value;
#pragma unroll
    for (int k0 = 0; k0 < kChunk; k0 += 16) {
      SplitB b[kTilesPerWarp];
#pragma unroll
      for (int nt = 0; nt < kTilesPerWarp; ++nt) {
        const float* column = source + (k0 + 2 * tq) * ld + n_first + 8 * nt + gq;
        b[nt] = split_b<kParts>(column[0], column[ld], column[8 * ld], column[9 * ld]);
      }
#pragma unroll
      for (int mt = k0 / 16; mt < 4; ++mt) {
        const SplitA aa = load_triangle_fragment<kParts>(aqk_fragments, mt, k0 / 16, lane);
#pragma unroll
        for (int nt = 0; nt < kTilesPerWarp; ++nt) mma_split_bf16<kParts>(acc[mt][nt], aa, b[nt]);
      }
    }
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < kTilesPerWarp; ++nt) {
        const int i = 16 * mt + gq, j = n_first + 8 * nt + 2 * tq;
        const float* c = acc[mt][nt];
        if (half == 0) {
          query[i * ld + j] = query[i * ld + j] * growth[i] - c[0];
          query[i * ld + j + 1] = query[i * ld + j + 1] * growth[i] - c[1];
          query[(i + 8) * ld + j] = query[(i + 8) * ld + j] * growth[i + 8] - c[2];
          query[(i + 8) * ld + j + 1] = query[(i + 8) * ld + j + 1] * growth[i + 8] - c[3];
        }
      }
    if (half == 1) store_tile_pairs(uu_lane + kChunk * D, acc);
  }
  __syncthreads();

  // 6. [W; Q'] to the workspace in fragment order; G_last.
  {
    store_split_fragments<2 * kChunk, D, kParts>(
        reinterpret_cast<uint4*>(ws.wq + static_cast<size_t>(record) * 2 * kChunk * D),
        [&](int r, int c) { return r < kChunk ? key[r * ld + c] : query[(r - kChunk) * ld + c]; }, tid,
        kPrepareThreads);
    if (tid == 0) ws.g_last[record] = cumulative_g[kChunk - 1];
  }
}

// The state pass's shared memory: S and v_new split into BF16 pairs for the mma B operand (row pair p of a
// 16-row tile holds rows p and p + 8), and the chunk's [W; Q'] fragments and U;U' slab, copied in (cp.async)
// while the previous chunk's state update runs.
template <int D>
struct StateLayout {
  static constexpr int kStateHi = 0;  // [D / 2, kSplitLd]
  static constexpr int kStateLo = kStateHi + D / 2 * kSplitLd;
  static constexpr int kNewValueHi = kStateLo + D / 2 * kSplitLd;  // [C / 2, kSplitLd]
  static constexpr int kNewValueLo = kNewValueHi + kChunk / 2 * kSplitLd;
  static constexpr int kWq = kNewValueLo + kChunk / 2 * kSplitLd;  // [2C, D] as split fragments
  static constexpr int kUu = kWq + 2 * kChunk * D;  // [2C, kSplitLd]: the slab's columns of U;U'
  static constexpr int kWords = kUu + 2 * kChunk * kSplitLd;
};

// One (value head, slab of 32 state columns): the slab of S through all chunks of a segment.
template <int D, int kParts>
__global__ void __launch_bounds__(kThreads, 1)
    gdn_chunk_state_kernel(float* out, int64_t out_stride, const float* state_in, int64_t state_in_stride,
                           float* state_out, int64_t state_out_stride, int64_t tokens, int dk, int dv,
                           ChunkWorkspace ws) {
  wait_for_previous_kernel();
  allow_next_kernel();
  using L = StateLayout<D>;
  constexpr int kKeyTiles = D / 16;           // k16 steps of X = [W; Q'] S
  constexpr int kTokenTiles = kChunk / 16;    // k16 steps of the state update
  constexpr int kStateWarps = D / 16;         // warps owning 16 rows of S
  extern __shared__ uint32_t state_shared[];  // StateLayout<D>::kWords
  uint32_t* state_hi = state_shared + L::kStateHi;
  uint32_t* state_lo = state_shared + L::kStateLo;
  uint32_t* new_value_hi = state_shared + L::kNewValueHi;
  uint32_t* new_value_lo = state_shared + L::kNewValueLo;
  auto* wq_staged = reinterpret_cast<float*>(state_shared + L::kWq);
  auto* uu_staged = reinterpret_cast<float*>(state_shared + L::kUu);

  const int head = static_cast<int>(blockIdx.x), slab = static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x), warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int gq = lane / 4, tq = lane % 4;
  const int column0 = slab * kSlab;
  const int chunks = static_cast<int>((tokens + kChunk - 1) / kChunk);
  const bool owns_state = warp < kStateWarps;

  // S rows 16 warp + gq (+8), columns 8 nt + 2 tq (+1) of the slab.
  float s[kSlabTiles][4];
#pragma unroll
  for (int nt = 0; nt < kSlabTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 16 * warp + gq + 8 * (e / 2), c = column0 + 8 * nt + 2 * tq + e % 2;
      s[nt][e] = owns_state && i < dk && c < dv
                     ? state_in[(static_cast<int64_t>(head) * dk + i) * state_in_stride + c]
                     : 0.0f;
    }

  const auto stage_chunk = [&](int chunk) {
    const size_t record = static_cast<size_t>(head) * chunks + chunk;
    const float* wq = ws.wq + record * 2 * kChunk * D;
    // The fragment tiles' hi registers (and lo with two parts): 16 bytes a lane, 32 lanes a register set.
    for (int index = tid; index < kChunk * D / 4 * kParts; index += kThreads) {
      const int word = (index / (kParts * kWarpSize) * 2 * kWarpSize + index % (kParts * kWarpSize)) * 4;
      cp_async_16(wq_staged + word, wq + word);
    }
    const float* uu = ws.uu + record * 2 * kChunk * D + column0;
    for (int index = tid; index < 2 * kChunk * kSlab / 4; index += kThreads) {
      const int row = index / (kSlab / 4), quad = index % (kSlab / 4);
      cp_async_16(uu_staged + row * kSplitLd + 4 * quad, uu + row * D + 4 * quad);
    }
    cp_async_commit();
  };
  stage_chunk(0);

  for (int chunk = 0; chunk < chunks; ++chunk) {
    const size_t record = static_cast<size_t>(head) * chunks + chunk;
    // S as B pairs: this lane's rows gq and gq + 8 of columns 8 nt + 2 tq (+1).
    if (owns_state) {
#pragma unroll
      for (int nt = 0; nt < kSlabTiles; ++nt) {
        uint2 hi, lo;
        split_bf16_pair<kParts>(s[nt][0], s[nt][2], hi.x, lo.x);
        split_bf16_pair<kParts>(s[nt][1], s[nt][3], hi.y, lo.y);
        const int word = (8 * warp + gq) * kSplitLd + 8 * nt + 2 * tq;
        *reinterpret_cast<uint2*>(state_hi + word) = hi;
        if constexpr (kParts == 2) *reinterpret_cast<uint2*>(state_lo + word) = lo;
      }
    }
    cp_async_wait_all();
    __syncthreads();

    // The state update's operands, loaded while X is computed.
    uint4 kt_hi[kTokenTiles], kt_lo[kTokenTiles] = {};
    float g_last = 0.0f;
    if (owns_state) {
      const uint4* k_t = reinterpret_cast<const uint4*>(ws.k_t + record * D * kChunk);
#pragma unroll
      for (int kt = 0; kt < kTokenTiles; ++kt) {
        const int tile = warp * kTokenTiles + kt;
        kt_hi[kt] = __ldg(k_t + 2 * tile * kWarpSize + lane);
        if constexpr (kParts == 2) kt_lo[kt] = __ldg(k_t + (2 * tile + 1) * kWarpSize + lane);
      }
      g_last = __ldg(ws.g_last + record);
    }

    // X = [W; Q'] S for rows 16 warp.. (128 x 32 x D).
    float x[kSlabTiles][4] = {}, x_correction[kSlabTiles][4] = {};
    const uint4* wq_fragments = reinterpret_cast<const uint4*>(wq_staged) + 2 * warp * kKeyTiles * kWarpSize;
#pragma unroll
    for (int kt = 0; kt < kKeyTiles; ++kt) {
      const uint4 a_hi = wq_fragments[2 * kt * kWarpSize + lane];
      const uint4 a_lo = kParts == 2 ? wq_fragments[(2 * kt + 1) * kWarpSize + lane] : uint4{};
#pragma unroll
      for (int nt = 0; nt < kSlabTiles; ++nt) {
        const int b0 = (8 * kt + tq) * kSplitLd + 8 * nt + gq, b1 = b0 + 4 * kSplitLd;
        mma_split_bf16<kParts>(x[nt], x_correction[nt], a_hi, a_lo, state_hi[b0], state_hi[b1],
                               kParts == 2 ? state_lo[b0] : 0u, kParts == 2 ? state_lo[b1] : 0u);
      }
    }

    // v_new = U - X_W (rows < C: warps 0..3) to shared memory as B pairs; out = U' + X_Q' (rows >= C).
    const int64_t chunk_first = static_cast<int64_t>(chunk) * kChunk;
    const int r0 = 16 * warp + gq, r1 = r0 + 8;
#pragma unroll
    for (int nt = 0; nt < kSlabTiles; ++nt) {
      const int c = 8 * nt + 2 * tq;
      const float2 u0 = *reinterpret_cast<const float2*>(uu_staged + r0 * kSplitLd + c);
      const float2 u1 = *reinterpret_cast<const float2*>(uu_staged + r1 * kSplitLd + c);
      const float x00 = x[nt][0] + x_correction[nt][0], x01 = x[nt][1] + x_correction[nt][1];
      const float x10 = x[nt][2] + x_correction[nt][2], x11 = x[nt][3] + x_correction[nt][3];
      if (r0 < kChunk) {
        uint2 hi, lo;
        split_bf16_pair<kParts>(u0.x - x00, u1.x - x10, hi.x, lo.x);
        split_bf16_pair<kParts>(u0.y - x01, u1.y - x11, hi.y, lo.y);
        const int word = (8 * warp + gq) * kSplitLd + c;
        *reinterpret_cast<uint2*>(new_value_hi + word) = hi;
        if constexpr (kParts == 2) *reinterpret_cast<uint2*>(new_value_lo + word) = lo;
      } else {
        const int64_t token0 = chunk_first + r0 - kChunk, token1 = token0 + 8;
        const int64_t column = static_cast<int64_t>(head) * dv + column0 + c;
        const bool first_in = column0 + c < dv, second_in = column0 + c + 1 < dv;
        if (token0 < tokens) {
          float* o = out + token0 * out_stride + column;
          if (first_in) o[0] = u0.x + x00;
          if (second_in) o[1] = u0.y + x01;
        }
        if (token1 < tokens) {
          float* o = out + token1 * out_stride + column;
          if (first_in) o[0] = u1.x + x10;
          if (second_in) o[1] = u1.y + x11;
        }
      }
    }
    __syncthreads();

    if (chunk + 1 < chunks) stage_chunk(chunk + 1);

    // S = e^(G_last) S + K~^T v_new  (D x 32 x 64).
    if (owns_state) {
      const float chunk_decay = expf(g_last);
      float correction[kSlabTiles][4] = {};
#pragma unroll
      for (int nt = 0; nt < kSlabTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] *= chunk_decay;
#pragma unroll
      for (int kt = 0; kt < kTokenTiles; ++kt) {
#pragma unroll
        for (int nt = 0; nt < kSlabTiles; ++nt) {
          const int b0 = (8 * kt + tq) * kSplitLd + 8 * nt + gq, b1 = b0 + 4 * kSplitLd;
          mma_split_bf16<kParts>(s[nt], correction[nt], kt_hi[kt], kt_lo[kt], new_value_hi[b0],
                                 new_value_hi[b1], kParts == 2 ? new_value_lo[b0] : 0u,
                                 kParts == 2 ? new_value_lo[b1] : 0u);
        }
      }
#pragma unroll
      for (int nt = 0; nt < kSlabTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] += correction[nt][e];
    }
  }

  if (state_out == nullptr || !owns_state) return;
#pragma unroll
  for (int nt = 0; nt < kSlabTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 16 * warp + gq + 8 * (e / 2), c = column0 + 8 * nt + 2 * tq + e % 2;
      if (i < dk && c < dv)
        state_out[(static_cast<int64_t>(head) * dk + i) * state_out_stride + c] = s[nt][e];
    }
}

int padded_head_dim(int dk, int dv) {
  const int d = dk > dv ? dk : dv;
  return d <= 32 ? 32 : d <= 64 ? 64 : d <= 128 ? 128 : 0;
}

template <int D>
size_t prepare_shared_bytes() {
  return sizeof(float) * PrepareLayout<D>::kFloats;
}

template <int D>
size_t state_shared_bytes() {
  return sizeof(uint32_t) * StateLayout<D>::kWords;
}

template <int D, int kParts>
cudaError_t launch_chunked(const Tensor& out, const Tensor& qkv, const Tensor& beta, const Tensor& g,
                           const Tensor& state, int num_key_heads, int num_value_heads, int dk, int dv,
                           bool update_state, float* workspace, cudaStream_t stream) {
  static const cudaError_t attribute_status = [] {
    const cudaError_t status =
        cudaFuncSetAttribute(gdn_chunk_prepare_kernel<D, kParts>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(prepare_shared_bytes<D>()));
    return status != cudaSuccess ? status
                                 : cudaFuncSetAttribute(gdn_chunk_state_kernel<D, kParts>,
                                                        cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                        static_cast<int>(state_shared_bytes<D>()));
  }();
  if (attribute_status != cudaSuccess) return attribute_status;
  const auto query_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(dk)));
  const int64_t tokens = qkv.rows;
  constexpr int64_t kSegmentTokens = int64_t{kChunksPerSegment} * kChunk;
  const int segments = static_cast<int>((tokens + kSegmentTokens - 1) / kSegmentTokens);
  // With more than one segment and update_state false, the state between segments lives in the workspace.
  float* carried_state =
      workspace + static_cast<size_t>(num_value_heads) * kChunksPerSegment * record_floats<D>();
  const int64_t carried_stride = dv;
  for (int segment = 0; segment < segments; ++segment) {
    const int64_t first = segment * kSegmentTokens;
    const int64_t segment_tokens = tokens - first < kSegmentTokens ? tokens - first : kSegmentTokens;
    const int chunks = static_cast<int>((segment_tokens + kChunk - 1) / kChunk);
    const ChunkWorkspace ws = chunk_workspace(workspace, num_value_heads * chunks, D);
    const cudaError_t prepare_status = launch_kernel(
        gdn_chunk_prepare_kernel<D, kParts>,
        dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(num_value_heads)),
        prepare_warps<D>() * kWarpSize, prepare_shared_bytes<D>(), stream,
        qkv.ptr<const float>() + first * qkv.stride, qkv.stride,
        beta.ptr<const float>() + first * beta.stride, beta.stride, g.ptr<const float>() + first * g.stride,
        g.stride, segment_tokens, num_key_heads, num_value_heads, dk, dv, query_scale, ws);
    if (prepare_status != cudaSuccess) return prepare_status;
    const bool carried_in = segment > 0 && !update_state, last = segment + 1 == segments;
    const float* state_in = carried_in ? carried_state : state.ptr<const float>();
    const int64_t state_in_stride = carried_in ? carried_stride : state.stride;
    float* state_out = update_state ? state.ptr<float>() : (last ? nullptr : carried_state);
    const int64_t state_out_stride = update_state ? state.stride : carried_stride;
    const cudaError_t state_status = launch_kernel(
        gdn_chunk_state_kernel<D, kParts>,
        dim3(static_cast<unsigned>(num_value_heads), static_cast<unsigned>((dv + kSlab - 1) / kSlab)),
        kThreads, state_shared_bytes<D>(), stream, out.ptr<float>() + first * out.stride, out.stride,
        state_in, state_in_stride, state_out, state_out_stride, segment_tokens, dk, dv, ws);
    if (state_status != cudaSuccess) return state_status;
  }
  return cudaSuccess;
}

template <int kParts>
cudaError_t launch_with_parts(const Tensor& out, const Tensor& qkv, const Tensor& beta, const Tensor& g,
                              const Tensor& state, int num_key_heads, int num_value_heads, int key_head_dim,
                              int value_head_dim, bool update_state, float* workspace, cudaStream_t stream) {
  switch (padded_head_dim(key_head_dim, value_head_dim)) {
    case 32:
      return launch_chunked<32, kParts>(out, qkv, beta, g, state, num_key_heads, num_value_heads,
                                        key_head_dim, value_head_dim, update_state, workspace, stream);
    case 64:
      return launch_chunked<64, kParts>(out, qkv, beta, g, state, num_key_heads, num_value_heads,
                                        key_head_dim, value_head_dim, update_state, workspace, stream);
    case 128:
      return launch_chunked<128, kParts>(out, qkv, beta, g, state, num_key_heads, num_value_heads,
                                         key_head_dim, value_head_dim, update_state, workspace, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

bool gated_delta_rule_chunked_fits(int key_head_dim, int value_head_dim, int max_shared_bytes) {
  const auto fits = [max_shared_bytes](size_t prepare, size_t state) {
    return prepare <= static_cast<size_t>(max_shared_bytes) && state <= static_cast<size_t>(max_shared_bytes);
  };
  switch (padded_head_dim(key_head_dim, value_head_dim)) {
    case 32:
      return fits(prepare_shared_bytes<32>(), state_shared_bytes<32>());
    case 64:
      return fits(prepare_shared_bytes<64>(), state_shared_bytes<64>());
    case 128:
      return fits(prepare_shared_bytes<128>(), state_shared_bytes<128>());
    default:
      return false;
  }
}

size_t gated_delta_rule_chunked_workspace_bytes(int64_t tokens, int num_value_heads, int key_head_dim,
                                                int value_head_dim) {
  const int d = padded_head_dim(key_head_dim, value_head_dim);
  const int64_t chunks = (tokens + kChunk - 1) / kChunk;
  const int64_t segment_chunks = chunks < kChunksPerSegment ? chunks : kChunksPerSegment;
  const size_t record = 5 * static_cast<size_t>(kChunk) * d + 1;
  const size_t carried = tokens > int64_t{kChunksPerSegment} * kChunk
                             ? static_cast<size_t>(num_value_heads) * key_head_dim * value_head_dim
                             : 0;
  return sizeof(float) * (static_cast<size_t>(num_value_heads) * segment_chunks * record + carried);
}

cudaError_t launch_gated_delta_rule_chunked(const Tensor& out, const Tensor& qkv, const Tensor& beta,
                                            const Tensor& g, const Tensor& state, int num_key_heads,
                                            int num_value_heads, int key_head_dim, int value_head_dim,
                                            bool update_state, void* workspace, cudaStream_t stream) {
  if (qkv.rows == 0) return cudaSuccess;
  if (qkv.rows <= kGdnChunkedSplitMaxTokens)
    return launch_with_parts<2>(out, qkv, beta, g, state, num_key_heads, num_value_heads, key_head_dim,
                                value_head_dim, update_state, static_cast<float*>(workspace), stream);
  return launch_with_parts<1>(out, qkv, beta, g, state, num_key_heads, num_value_heads, key_head_dim,
                              value_head_dim, update_state, static_cast<float*>(workspace), stream);
}

}  // namespace qspec::cuda
