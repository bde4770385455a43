// The thin host launchers of the CUDA kernels, one group per .cu file. Arguments are already validated by
// CudaBackend (cuda_backend.cpp); each launcher queues its kernel(s) on `stream` through launch_kernel()
// (pdl.cuh: programmatic dependent launch on sm_90+) and returns the launch status. Row strides come from the
// Tensors, so strided views work everywhere.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/tensor.h"

namespace qspec {
struct AttentionPrologueLayer;
struct GdnCommitLayer;
struct GdnMixerWeights;
struct GdnShape;
struct GdnStateUpdate;
}  // namespace qspec

namespace qspec::cuda {

// row_copy.cu: rows by index. An id / position outside the table / cache cannot be reported without a host
// sync: embed writes NaN into that output row, kv_store skips that row.
cudaError_t launch_embed(const Tensor& out, const Tensor& table, const Tensor& ids, cudaStream_t stream);
cudaError_t launch_kv_store(const Tensor& cache, const Tensor& x, const Tensor& positions,
                            cudaStream_t stream);

// A tensor whose values are a linear's split-K partials not yet added (LinearMmaWorkspace::unsummed_splits):
// value (r, c) is the sum, in split order from zero (split_sums.cuh), of partials[s * split_stride +
// r * row_stride + c] over s < splits. An op that takes one reads the partials and also stores their sums
// into the tensor, so that it holds the values the sums kernel would have stored. splits <= 1: the tensor
// holds its values.
struct UnsummedSplits {
  const float* partials = nullptr;
  int splits = 1;
  int64_t row_stride = 0, split_stride = 0;
  // Partials laid out [splits][rows][cols], as the linears leave them.
  static UnsummedSplits packed(const float* partials, int splits, int64_t rows, int64_t cols) {
    return {partials, splits, cols, rows * cols};
  }
  bool any() const { return splits > 1; }
  // Whether four consecutive values' partials are 16-byte aligned wherever a float4-aligned row's are.
  bool float4_aligned() const {
    return !any() || (row_stride % 4 == 0 && split_stride % 4 == 0 &&
                      reinterpret_cast<uintptr_t>(partials) % (4 * sizeof(float)) == 0);
  }
  // The same partials for a view of the tensor `columns` columns in.
  UnsummedSplits cols_from(int64_t columns) const {
    return {any() ? partials + columns : nullptr, splits, row_stride, split_stride};
  }
};

// norm.cu: RMSNorm over groups of weight.cols columns; the gated form when z is non-empty.
cudaError_t launch_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& z,
                           float eps, bool unit_offset, cudaStream_t stream);
// x += delta, then out = rmsnorm(x) (x updated in place); delta's values may still be split partials.
cudaError_t launch_add_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& delta,
                               const UnsummedSplits& delta_splits, const Tensor& weight, float eps,
                               bool unit_offset, cudaStream_t stream);
// The norm whose rows a cuBLAS GEMM reads (gemm_linear.h): rmsnorm(x), after x += delta when delta is
// non-empty, into `operand` (x.rows * x.cols BF16 values, contiguous) rounded as launch_rows_to_bf16 rounds
// F32 rows, and into out as F32 when out is non-empty. Lets no kernel in early (pdl.cuh: cuBLAS comes next).
cudaError_t launch_rmsnorm_to_bf16(void* operand, const Tensor& out, const Tensor& x, const Tensor& delta,
                                   const Tensor& weight, float eps, bool unit_offset, cudaStream_t stream);
// The GDN output's gated norm (launch_rmsnorm with z, no unit offset) whose rows a cuBLAS GEMM reads: only
// into `operand` (x.rows * x.cols BF16 values, contiguous), rounded as launch_rows_to_bf16 rounds F32 rows.
// Lets no kernel in early, as launch_rmsnorm_to_bf16.
cudaError_t launch_gated_rmsnorm_to_bf16(void* operand, const Tensor& x, const Tensor& weight,
                                         const Tensor& z, float eps, cudaStream_t stream);

// linear.cu: out = x W^T, dense (BF16/F16/F32 weight [N, K]) or W4A16 (packed I32 [N, K/8] + scales).
cudaError_t launch_dense_linear(const Tensor& out, const Tensor& x, const Tensor& weight,
                                cudaStream_t stream);
cudaError_t launch_w4a16_linear(const Tensor& out, const Tensor& x, const Tensor& packed,
                                const Tensor& scales, int group_size, cudaStream_t stream);

// linear_mma.cu: out = x W^T on tensor cores for up to kLinearMmaMaxRows rows of x, W4A16 (K and group size
// multiples of 32) or BF16 weights, x exact to ~2^-16 (split into two BF16 parts). K may be split over
// blocks; the workspace then holds their partial sums.
// More rows take gemm_linear.h (BF16 products): the many-row kernel's passes of 16 rows cost more from
// about 32 rows on (prefill of 64 tokens 11.5 -> 9.7 ms, of 128 tokens 18.9 -> 10.5 ms on the H200 with the
// limit at 32 instead of 128; session 9).
inline constexpr int64_t kLinearMmaMaxRows = 32;
// unsummed_splits, where given, takes a split call's sums off the call: it is set to the splits whose
// partials are left in `partials` ([splits][rows][out_features]) for the op that reads the output
// (UnsummedSplits), or to 0 where the call left none (K whole, or added inside clusters).
struct LinearMmaWorkspace {
  float* partials = nullptr;
  int* unsummed_splits = nullptr;
};
// The kernels' knobs, for benchmarks and tests (0: the default). chunks_per_split (128 k each) sets the
// split of K, and with it the order of a row's sums; grid_blocks (default: one block per item) sets how many
// blocks of the register-held many-row kernel walk the work (and keeps W4A16 off the ring kernel; the
// one-row kernel ignores it); one_row_kernel off sends one row of x to the many-row kernel;
// row_splits_per_part sets the one-row kernel's unit, that many splits of K (the sums stay the same);
// ring_kernel off keeps W4A16 weights of several rows in the register-held many-row kernel instead of the
// shared-memory ring one (the same sums); row_cluster_sums off makes the one-row kernel store its split
// partials for the sums kernel even where it could add them inside a cluster (the same sums); ring_tma off
// keeps the ring kernel's per-lane copies where tensor copies could fill it (sm_90; the same sums).
struct LinearMmaTuning {
  int64_t chunks_per_split = 0;
  int64_t grid_blocks = 0;
  bool one_row_kernel = true;
  int64_t row_splits_per_part = 0;
  bool ring_kernel = true;
  bool row_cluster_sums = true;
  bool ring_tma = true;
};
bool linear_mma_supports(const Tensor& x, const LinearWeight& w);
// Whether the ring kernel can be fed by tensor copies here (sm_90 code and the driver's tensor-map encoder):
// LinearMmaTuning::ring_tma then takes W4A16 g32 calls of whole 128-value chunks with 16-byte aligned
// scale rows. Asked first outside any stream capture (the encoder's lookup).
bool linear_tensor_copies_supported();
// The workspace's partial sums (floats) of a call with `rows` rows of x.
size_t linear_mma_partial_floats(int64_t rows, int64_t out_features, int64_t in_features,
                                 int64_t chunks_per_split = 0);
cudaError_t launch_linear_mma(const Tensor& out, const Tensor& x, const LinearWeight& w,
                              const LinearMmaWorkspace& workspace, cudaStream_t stream,
                              const LinearMmaTuning& tuning = {});
// The gated MLP's down projection for one row: out = (silu(gate) * up) W^T for gate_up = [gate | up] (each
// w.in_features columns), the activation made by the one-row kernel while it stages x, as silu_mul makes it.
bool gated_linear_mma_supports(const Tensor& gate_up, const LinearWeight& w);
cudaError_t launch_gated_linear_mma(const Tensor& out, const Tensor& gate_up, const LinearWeight& w,
                                    const LinearMmaWorkspace& workspace, cudaStream_t stream);

// The sums of a split call's partials into out, each element's splits added in split order (linear_mma.cu's
// sum_split_partials_kernel).
cudaError_t launch_split_partial_sums(const Tensor& out, const UnsummedSplits& splits, cudaStream_t stream);

// linear_w4a16_gemm.cu: out = x W^T for many rows of x (prefill chunks) from W4A16 weights on tensor cores,
// x in BF16 [out.rows, K] (contiguous, 16-byte aligned: GemmLinear's operand) and each weight rounded to BF16
// as the BF16 copy rounds it (GemmLinear::dequantize), FP32 sums. Takes BF16 scales, K a multiple of 128 and
// group 32, 64 or a multiple of 128 (w4a16_gemm_supports). `workspace` holds w4a16_gemm_workspace_bytes(...)
// bytes (16-byte aligned): for wgmma x in the layout of its shared-memory stages, and the split partials
// where a cluster does not add them.
// The kernel's knobs, for tests (0: the default): `splits` sets the split of K (and so the order of the
// sums); cluster_sums off leaves the splits' partials to the sums kernel even where a cluster could add them
// (the path of GPUs before sm_90).
// wgmma off takes mma.sync where the code was built for sm_90a (elsewhere it always does).
struct W4a16GemmTuning {
  int64_t splits = 0;
  bool cluster_sums = true;
  bool wgmma = true;
  int block_rows = 0;  // rows of x a block takes: 64, 128 or (wgmma only) 256 (0: by the call's rows)
};
// Reads what the kernel's choices depend on (SMs, clusters, sm_90a code) and sets its attributes: once,
// before any launch can be inside a stream capture (CudaBackend's constructor).
void w4a16_gemm_init();
// Whether the products are wgmma's (code built for sm_90a on a GPU that runs it), for the tests.
bool w4a16_gemm_uses_wgmma();
bool w4a16_gemm_supports(const LinearWeight& w);
// The splits of K a call takes (for the benchmarks).
int64_t w4a16_gemm_splits(int64_t rows, const LinearWeight& w, const W4a16GemmTuning& tuning = {});
size_t w4a16_gemm_workspace_bytes(int64_t rows, const LinearWeight& w, const W4a16GemmTuning& tuning = {});
cudaError_t launch_w4a16_gemm(const Tensor& out, const void* x_bf16, const LinearWeight& w, void* workspace,
                              cudaStream_t stream, const W4a16GemmTuning& tuning = {});

// linear_gemm.cu: the BF16 operands of the many-row linear (gemm_linear.h). out holds x.rows * x.cols BF16
// values (contiguous) made from x and, for a gate, y (x.rows rows of x.cols values at x's row stride):
// x itself, silu_mul(x, y) (the gated MLP) or x * sigmoid(y) (the gated attention's output); the dequantized
// slice holds rows * in_features.
enum class RowGate { None, SiluMul, SigmoidMul };
cudaError_t launch_rows_to_bf16(void* out, const Tensor& x, const float* y, RowGate gate,
                                cudaStream_t stream);
cudaError_t launch_dequantize_w4a16(void* out, const LinearWeight& w, int64_t first_row, int64_t rows,
                                    cudaStream_t stream);

// elementwise.cu
enum class Elementwise { Add, SiluMul, SigmoidMul };
// a's and b's values may still be split partials (then stored into a and b as well).
cudaError_t launch_elementwise(Elementwise op, const Tensor& out, const Tensor& a, const Tensor& b,
                               cudaStream_t stream, const UnsummedSplits& a_splits = {},
                               const UnsummedSplits& b_splits = {});
cudaError_t launch_split_query_gate(const Tensor& query, const Tensor& gate, const Tensor& qg, int head_dim,
                                    cudaStream_t stream);

// rope.cu: inv_freq holds rotary_dim / 2 frequencies, computed on the host exactly as the CPU reference does.
inline constexpr int kMaxRotaryHalf = 256;
struct RopeFrequencies {
  float inv_freq[kMaxRotaryHalf];
};
cudaError_t launch_rope(const Tensor& x, const Tensor& positions, int head_dim, int rotary_dim,
                        const RopeFrequencies& frequencies, cudaStream_t stream);

// attention_prologue.cu: Backend::attention_prologues (attention_prologue: one layer) in one kernel, up to
// kMaxPrologueLayers layers with the same rows a launch; head_dim <= kMaxAttentionHeadDim, norm weights of
// one dtype. Head counts and dims as in AttentionPrologueShape (ops.h).
inline constexpr size_t kMaxPrologueLayers = 8;
struct PrologueShape {
  int num_heads, num_kv_heads, head_dim, rotary_dim;
  float eps;
  bool unit_offset;
};
cudaError_t launch_attention_prologues(const AttentionPrologueLayer* layers, size_t count,
                                       const Tensor& positions, const PrologueShape& shape,
                                       const RopeFrequencies& frequencies, cudaStream_t stream);

// attention.cu (+ attention_rows.cu, attention_prefill.cu): one block per (KV head, key split) serves all
// query rows of the KV head (tokens x grouped heads); FP32 or split-BF16 tensor cores (~1e-5 relative to
// FP32) up to 64 such rows (decode, verify) and for prefill chunks of up to kLinearMmaMaxRows tokens, BF16
// tensor cores (a few 1e-3 of the largest output, as the prefill's BF16 linears) for longer chunks. A
// position outside the cache gives NaN output rows. head_dim <= kMaxAttentionHeadDim. `workspace` holds
// attention_workspace_bytes(...) bytes (256-byte aligned): split partials, and for prefill the K/V cache rows
// converted to BF16 (as large as the two caches up to kLinearMmaMaxRows tokens, hi and lo parts; half
// beyond).
inline constexpr int kMaxAttentionHeadDim = 256;
size_t attention_workspace_bytes(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                                 const Tensor& v_cache, int num_heads, int num_kv_heads, int head_dim);
// Key ranges other than 0..positions[t]: row t sees first_keys[t] (I32 [T, 1]) .. positions[t], or with
// positions_are_ends first_keys[t] .. positions[t] - 1 (windowed_attention's key_begin and key_end). Only
// calls that attention_takes_first_keys (up to 64 query rows per KV head) take first keys.
struct KeyRanges {
  Tensor first_keys;
  bool positions_are_ends = false;
};
bool attention_takes_first_keys(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                                const Tensor& v_cache, int num_heads, int num_kv_heads, int head_dim);
cudaError_t launch_attention(const Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                             const Tensor& positions, int num_heads, int num_kv_heads, int head_dim,
                             float scale, void* workspace, cudaStream_t stream, const KeyRanges& ranges = {});

// windowed_attention.cu: query row t over cache rows [key_begin[t], key_end[t]); an empty range or one
// outside the cache gives a NaN output row. head_dim <= kMaxAttentionHeadDim.
cudaError_t launch_windowed_attention(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                                      const Tensor& v_cache, const Tensor& key_begin, const Tensor& key_end,
                                      int num_heads, int num_kv_heads, int head_dim, float scale,
                                      cudaStream_t stream);

// conv1d.cu: kernel sizes 1..kMaxConvKernel; the state is written back only when update_state.
inline constexpr int kMaxConvKernel = 8;
cudaError_t launch_conv1d_silu(const Tensor& out, const Tensor& x, const Tensor& state, const Tensor& weight,
                               bool update_state, cudaStream_t stream);

// gdn_gates.cu; beta may alias b and g may alias a. gdn_gates_linear's one-launch form (projections and
// gates) takes up to kGdnGatesLinearMaxRows rows of x (16-byte aligned F32 rows, K a multiple of 8) and BF16
// W_b, W_a with 16-byte aligned rows; each output's dot product is summed in an order that does not depend on
// T, so a verify row gets the gates a decode step would.
inline constexpr int64_t kGdnGatesLinearMaxRows = 16;
cudaError_t launch_gdn_gates(const Tensor& beta, const Tensor& g, const Tensor& b, const Tensor& a,
                             const Tensor& a_log, const Tensor& dt_bias, cudaStream_t stream);
bool gdn_gates_linear_supports(const Tensor& x, const LinearWeight& w_b, const LinearWeight& w_a);
cudaError_t launch_gdn_gates_linear(const Tensor& beta, const Tensor& g, const Tensor& x,
                                    const LinearWeight& w_b, const LinearWeight& w_a, const Tensor& a_log,
                                    const Tensor& dt_bias, cudaStream_t stream);

// Gated delta rule; the fp32 state is written back only when update.advance. Calls of fewer than
// kGdnChunkedMinTokens tokens (decode, verify) take the recurrence, whose per-token arithmetic does
// not depend on T; longer ones the chunked form where it fits the device.
inline constexpr int64_t kGdnChunkedMinTokens = 64;
// The chunked form keeps split-BF16 operands (~2^-17 relative) for calls of up to two chunks, where that
// costs little; longer calls round each operand to BF16 once (gated_delta_rule_chunked.cu).
inline constexpr int64_t kGdnChunkedSplitMaxTokens = 128;
// gated_delta_rule.cu: the per-token recurrence in one launch, the state in registers (gdn_recurrence.cuh for
// key_head_dim <= 128 and whole 16-byte column quads, a general kernel otherwise), which fills update.replay
// when given. key_head_dim <= kGdnRecurrentMaxKeyDim.
inline constexpr int kGdnRecurrentMaxKeyDim = 256;
cudaError_t launch_gated_delta_rule_recurrent(const Tensor& out, const Tensor& qkv, const Tensor& beta,
                                              const Tensor& g, const Tensor& state, int num_key_heads,
                                              int num_value_heads, int key_head_dim, int value_head_dim,
                                              const GdnStateUpdate& update, cudaStream_t stream);
// gdn_mixer.cu: Backend::gdn_mixer as a kernel and its finish (the gated norm, the conv states) for 1..16
// tokens (conv kernel 4, dk and dv <= 128, the state as gdn_recurrence.cuh takes it, the gates as
// gdn_gates_linear_supports takes them); core is its scratch.
struct GdnMixerOperands {
  Tensor out, conv_out, beta, g, core, qkvz, x, conv_state, state;
};
bool gdn_mixer_fits(const Tensor& qkvz, const Tensor& x, const Tensor& state, const GdnMixerWeights& w,
                    const GdnShape& shape);
cudaError_t launch_gdn_mixer(const GdnMixerOperands& operands, const GdnMixerWeights& w,
                             const GdnShape& shape, float eps, const GdnStateUpdate& update,
                             cudaStream_t stream);

// gdn_commit.cu: every layer's conv and recurrent states in one launch (per 24 layers), the recurrent ones by
// the replay of their records (T <= kGdnReplayMaxRows rows, staged in shared memory: value_head_dim <=
// kGdnCommitMaxValueDim). accepted_rows: a device I32 scalar, the count of rows accepted (clamped to [0, T]);
// null: all T. Conv kernel sizes <= kMaxConvKernel.
inline constexpr int kGdnCommitMaxValueDim = 512;
cudaError_t launch_gdn_commit(const GdnCommitLayer* layers, size_t count, const int32_t* accepted_rows,
                              int num_key_heads, int num_value_heads, int key_head_dim, int value_head_dim,
                              cudaStream_t stream);
// gated_delta_rule_chunked.cu: chunks of 64 tokens (WY form) on tensor cores (split BF16 up to
// kGdnChunkedSplitMaxTokens tokens, BF16 beyond), head dims <= 128;
// `workspace` holds gated_delta_rule_chunked_workspace_bytes(...).
bool gated_delta_rule_chunked_fits(int key_head_dim, int value_head_dim, int max_shared_bytes);
size_t gated_delta_rule_chunked_workspace_bytes(int64_t tokens, int num_value_heads, int key_head_dim,
                                                int value_head_dim);
cudaError_t launch_gated_delta_rule_chunked(const Tensor& out, const Tensor& qkv, const Tensor& beta,
                                            const Tensor& g, const Tensor& state, int num_key_heads,
                                            int num_value_heads, int key_head_dim, int value_head_dim,
                                            bool update_state, void* workspace, cudaStream_t stream);

// argmax.cu: the rule of backend/argmax.h in two stages (slices of a row, then their combination);
// `workspace` holds argmax_workspace_bytes(rows, cols) bytes (the slices' candidates).
size_t argmax_workspace_bytes(int64_t rows, int64_t cols);
cudaError_t launch_argmax(const Tensor& out_ids, const Tensor& logits, void* workspace, cudaStream_t stream);

}  // namespace qspec::cuda
